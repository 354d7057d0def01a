/* Integration tests of the real pcs-coordinator process on 127.0.0.1:0, driven by the C RPC
 * client (common/rpc.h): 100 workers register, gang start with watch streams, invalid specs, KV
 * rendezvous with waits and limits, health, bad input, lease expiry, cancel, a client that
 * disconnects mid-stream, and SIGTERM -> exit 0. Each group starts its own coordinator. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/utf8.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "test_util.h"

#define T_MS 5000

#define MAX_W 256

typedef struct coord_proc {
    char *dir;
    pid_t pid;
    char addr[64];
    pcs_rpc_client_t *cli;
    /* each registered worker's secret, by worker number: a worker call carries the secret of the
     * worker its request names (KvSet/KvGet name none: they act as kv_as) */
    char secret[MAX_W][160];
    char identity[MAX_W][64]; /* the identity each worker number registered */
    const char *kv_as;
} coord_proc_t;

/* The worker id an identity registered as here, or NULL. */
static const char *id_of_identity(coord_proc_t *p, const char *identity, char *buf, size_t n)
{
    for (unsigned i = 1; i < MAX_W; i++)
        if (strcmp(p->identity[i], identity) == 0) {
            snprintf(buf, n, "w-%u", i);
            return buf;
        }
    return NULL;
}

static void remember_secret(coord_proc_t *p, const char *worker_id, const char *secret)
{
    unsigned n = 0;
    if (sscanf(worker_id, "w-%u", &n) == 1 && n < MAX_W)
        snprintf(p->secret[n], sizeof p->secret[n], "%s", secret ? secret : "");
}

static const char *secret_of(coord_proc_t *p, const char *worker_id)
{
    unsigned n = 0;
    if (!worker_id || sscanf(worker_id, "w-%u", &n) != 1 || n >= MAX_W || !p->secret[n][0])
        return NULL;
    return p->secret[n];
}

/* A WorkerService call acts for the worker its request names (its secret goes along). */
static void act_as(coord_proc_t *p, const char *method, const ProtobufCMessage *req)
{
    if (strncmp(method, "/pcs.v1.WorkerService/", 22) != 0 || strcmp(method, PCS_M_REGISTER) == 0)
        return; /* reg() presents what the registering process holds */
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "worker_id");
    const char *id = f ? *(char *const *)((const char *)req + f->offset) : p->kv_as;
    assert_int_equal(pcs_rpc_client_set_worker_secret(p->cli, secret_of(p, id)), PCS_OK);
}

static const char *const spec_yaml = "name: it-job\n"
                                     "model:\n"
                                     "  mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}\n"
                                     "mesh:\n"
                                     "  - {dim: dp_shard, size: 4}\n"
                                     "training:\n"
                                     "  steps: 2\n"
                                     "  micro_batch_size: 2\n"
                                     "  optimizer:\n"
                                     "    sgd: {lr: 0.1}\n"
                                     "data:\n"
                                     "  synthetic: {seed: 1}\n";

static coord_proc_t *start(const char *tag, const char *const *args)
{
    coord_proc_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->dir = pcs_test_tmpdir(tag);
    p->pid = pcs_test_start_coordinator(p->dir, args, p->addr, sizeof p->addr);
    assert_true(p->pid > 0);
    assert_int_equal(pcs_rpc_client_create(p->addr, &p->cli), PCS_OK);
    return p;
}

/* The same workers' processes outlive a coordinator: restart keeps what they hold (their secrets)
 * for the next coordinator on the same database. */
static coord_proc_t *restart(coord_proc_t *p, const char *tag, const char *const *args);

static void stop(coord_proc_t *p)
{
    pcs_rpc_client_destroy(p->cli);
    int status = pcs_test_stop(p->pid, 5000);
    /* a coordinator that crashed or leaked under ASan would not exit 0 on SIGTERM */
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    pcs_test_rmtree(p->dir);
    free(p->dir);
    free(p);
}

static coord_proc_t *restart(coord_proc_t *p, const char *tag, const char *const *args)
{
    coord_proc_t *keep = malloc(sizeof *keep);
    assert_non_null(keep);
    memcpy(keep, p, sizeof *keep);
    stop(p);
    coord_proc_t *q = start(tag, args);
    memcpy(q->secret, keep->secret, sizeof q->secret);
    memcpy(q->identity, keep->identity, sizeof q->identity);
    free(keep);
    return q;
}

/* One unary call; returns the gRPC code, *resp set on OK (caller frees). */
static int call(coord_proc_t *p, const char *method, const void *req,
                const ProtobufCMessageDescriptor *d, void *resp)
{
    ProtobufCMessage **out = resp;
    int code = -1;
    act_as(p, method, req);
    pcs_status_t st = pcs_rpc_call(p->cli, method, req, d, T_MS, out, &code);
    if (st == PCS_OK)
        assert_int_equal(code, 0);
    return code;
}

static char *reg(coord_proc_t *p, const char *identity, int *rereg)
{
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    Pcs__V1__Device dev = PCS__V1__DEVICE__INIT;
    Pcs__V1__Device *devs[1] = {&dev};
    char *backends[1] = {"gloo"};
    dev.kind = "cpu";
    dev.name = "cpu0";
    dev.memory_bytes = 1u << 30;
    req.identity = (char *)identity;
    req.host = "127.0.0.1";
    req.pid = (uint32_t)getpid();
    req.n_devices = 1;
    req.devices = devs;
    req.n_backends = 1;
    req.backends = backends;
    Pcs__V1__RegisterResponse *resp = NULL;
    /* the same process registering again presents the secret it holds */
    char known[32];
    assert_int_equal(pcs_rpc_client_set_worker_secret(
                         p->cli, secret_of(p, id_of_identity(p, identity, known, sizeof known))),
                     PCS_OK);
    assert_int_equal(call(p, PCS_M_REGISTER, &req, &pcs__v1__register_response__descriptor, &resp),
                     0);
    char *id = strdup(resp->worker_id);
    remember_secret(p, id, resp->worker_secret);
    unsigned num = 0;
    if (sscanf(id, "w-%u", &num) == 1 && num < MAX_W)
        snprintf(p->identity[num], sizeof p->identity[num], "%s", identity);
    if (rereg)
        *rereg = resp->reregistered;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return id;
}

static int heartbeat(coord_proc_t *p, const char *worker_id)
{
    Pcs__V1__HeartbeatRequest req = PCS__V1__HEARTBEAT_REQUEST__INIT;
    req.worker_id = (char *)worker_id;
    Pcs__V1__HeartbeatResponse *resp = NULL;
    int code = call(p, PCS_M_HEARTBEAT, &req, &pcs__v1__heartbeat_response__descriptor, &resp);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return code;
}

static Pcs__V1__JobSpec *spec_new(void)
{
    ProtobufCMessage *m = NULL;
    assert_int_equal(
        pcs_pb_from_yaml(spec_yaml, strlen(spec_yaml), &pcs__v1__job_spec__descriptor, &m), PCS_OK);
    return (Pcs__V1__JobSpec *)m;
}

/* Submit; returns the gRPC code and the job (caller frees) on OK. */
static int submit(coord_proc_t *p, Pcs__V1__JobSpec *spec, const char *request_id,
                  Pcs__V1__SubmitJobResponse **out)
{
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.spec = spec;
    req.request_id = (char *)(request_id ? request_id : "");
    *out = NULL;
    return call(p, PCS_M_SUBMIT_JOB, &req, &pcs__v1__submit_job_response__descriptor, out);
}

static Pcs__V1__Job *get_job(coord_proc_t *p, const char *job_id, Pcs__V1__GetJobResponse **keep)
{
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    assert_int_equal(call(p, PCS_M_GET_JOB, &req, &pcs__v1__get_job_response__descriptor, keep), 0);
    return (*keep)->job;
}

static pcs_rpc_stream_t *watch(coord_proc_t *p, const char *worker_id)
{
    Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    req.worker_id = (char *)worker_id;
    pcs_rpc_stream_t *s = NULL;
    act_as(p, PCS_M_WATCH_ASSIGNMENT, &req.base);
    assert_int_equal(pcs_rpc_stream_open(p->cli, PCS_M_WATCH_ASSIGNMENT, &req.base, &s), PCS_OK);
    return s;
}

static Pcs__V1__AssignmentEvent *next_event(pcs_rpc_stream_t *s)
{
    ProtobufCMessage *m = NULL;
    pcs_status_t st = pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, T_MS, &m);
    if (st != PCS_OK)
        fail_msg("stream next: %s", pcs_last_error());
    assert_non_null(m);
    return (Pcs__V1__AssignmentEvent *)m;
}

static int cancel_job(coord_proc_t *p, const char *job_id)
{
    Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    req.reason = "test";
    Pcs__V1__CancelJobResponse *resp = NULL;
    int code = call(p, PCS_M_CANCEL_JOB, &req, &pcs__v1__cancel_job_response__descriptor, &resp);
    if (resp) {
        assert_int_equal(resp->job->state, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return code;
}

// ---------------------------------------------------------------------------------------------
// group A: one long-lived coordinator with 100 workers

static coord_proc_t *A;

static int group_a_setup(void **state)
{
    (void)state;
    static const char *const args[] = {
        "--lease-ms", "600000", "--max-message-bytes", "65536", "--kv-max-key-bytes", "64", NULL};
    A = start("coord-a", args);
    return 0;
}

static int group_a_teardown(void **state)
{
    (void)state;
    stop(A);
    return 0;
}

static void test_100_workers_register_and_reregister_keeps_the_id(void **state)
{
    (void)state;
    char ident[64];
    for (int i = 1; i <= 100; i++) {
        snprintf(ident, sizeof ident, "node-%03d", i);
        int rr = 1;
        char *id = reg(A, ident, &rr);
        char want[16];
        snprintf(want, sizeof want, "w-%d", i);
        assert_string_equal(id, want);
        assert_false(rr);
        free(id);
    }
    int rr = 0;
    char *again = reg(A, "node-007", &rr);
    assert_string_equal(again, "w-7");
    assert_true(rr);
    free(again);
    Pcs__V1__ListWorkersRequest lr = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    lr.state = PCS__V1__WORKER_STATE__WORKER_STATE_IDLE;
    Pcs__V1__ListWorkersResponse *resp = NULL;
    assert_int_equal(
        call(A, PCS_M_LIST_WORKERS, &lr, &pcs__v1__list_workers_response__descriptor, &resp), 0);
    assert_int_equal(resp->n_workers, 100);
    assert_string_equal(resp->workers[6]->identity, "node-007");
    assert_int_equal(resp->workers[6]->n_devices, 1);
    assert_int_equal(resp->workers[6]->devices[0]->memory_bytes, 1u << 30);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void test_bad_worker_requests_get_precise_codes(void **state)
{
    (void)state;
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    Pcs__V1__RegisterResponse *resp = NULL;
    assert_int_equal(call(A, PCS_M_REGISTER, &req, &pcs__v1__register_response__descriptor, &resp),
                     3 /* INVALID_ARGUMENT */);
    assert_non_null(strstr(pcs_last_error(), "identity: required"));
    /* without a worker's secret nothing but Register is answered */
    assert_int_equal(heartbeat(A, ""), 16 /* UNAUTHENTICATED */);
    assert_non_null(strstr(pcs_last_error(), "needs the worker's secret"));
    assert_int_equal(heartbeat(A, "w-4242"), 16);
    /* with one, a call acts for that worker only */
    A->kv_as = "w-1";
    Pcs__V1__HeartbeatRequest hb = PCS__V1__HEARTBEAT_REQUEST__INIT;
    hb.worker_id = "";
    Pcs__V1__HeartbeatResponse *hresp = NULL;
    assert_int_equal(pcs_rpc_client_set_worker_secret(A->cli, secret_of(A, "w-1")), PCS_OK);
    assert_int_equal(pcs_rpc_call(A->cli, PCS_M_HEARTBEAT, &hb.base,
                                  &pcs__v1__heartbeat_response__descriptor, T_MS,
                                  (ProtobufCMessage **)&hresp, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "worker_id: required"));
    hb.worker_id = "w-4242";
    assert_int_equal(pcs_rpc_call(A->cli, PCS_M_HEARTBEAT, &hb.base,
                                  &pcs__v1__heartbeat_response__descriptor, T_MS,
                                  (ProtobufCMessage **)&hresp, NULL),
                     PCS_ERR_PERMISSION);
    assert_non_null(strstr(pcs_last_error(), "worker_id: w-4242, but the call's credential is "
                                             "worker w-1's"));
    assert_int_equal(heartbeat(A, "w-1"), 0);
    /* a watch without a secret fails on the stream */
    pcs_rpc_stream_t *s = watch(A, "w-999");
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, T_MS, &m),
                     PCS_ERR_UNAUTHENTICATED);
    assert_null(m);
    pcs_rpc_stream_close(s);
    A->kv_as = NULL;
}

static size_t count_jobs(coord_proc_t *p)
{
    Pcs__V1__ListJobsRequest lr = PCS__V1__LIST_JOBS_REQUEST__INIT;
    Pcs__V1__ListJobsResponse *jobs = NULL;
    assert_int_equal(call(p, PCS_M_LIST_JOBS, &lr, &pcs__v1__list_jobs_response__descriptor, &jobs),
                     0);
    size_t n = jobs->n_jobs;
    protobuf_c_message_free_unpacked(&jobs->base, NULL);
    return n;
}

static void test_invalid_specs_are_invalid_argument_naming_the_field(void **state)
{
    (void)state;
    size_t before = count_jobs(A);
    Pcs__V1__SubmitJobResponse *resp;
    assert_int_equal(submit(A, NULL, NULL, &resp), 3);
    assert_non_null(strstr(pcs_last_error(), "spec: required"));
    Pcs__V1__JobSpec *spec = spec_new();
    spec->mesh[0]->size = 0;
    assert_int_equal(submit(A, spec, NULL, &resp), 3);
    assert_non_null(strstr(pcs_last_error(), "mesh[0].size"));
    spec->mesh[0]->size = 4;
    Pcs__V1__ModelSpec *model = spec->model;
    spec->model = NULL;
    assert_int_equal(submit(A, spec, NULL, &resp), 3);
    assert_non_null(strstr(pcs_last_error(), "model"));
    spec->model = model;
    spec->training->micro_batch_size = 0;
    assert_int_equal(submit(A, spec, NULL, &resp), 3);
    assert_non_null(strstr(pcs_last_error(), "training.micro_batch_size"));
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    assert_int_equal(count_jobs(A), before); /* nothing was accepted */
}

/* spec_yaml with its mesh line replaced and `extra` appended */
static Pcs__V1__JobSpec *spec_variant(const char *mesh, const char *extra)
{
    const char *line = "  - {dim: dp_shard, size: 4}\n";
    const char *at = strstr(spec_yaml, line);
    assert_non_null(at);
    char y[2048];
    snprintf(y, sizeof y, "%.*s%s%s%s", (int)(at - spec_yaml), spec_yaml, mesh,
             at + strlen(line), extra);
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m), PCS_OK);
    return (Pcs__V1__JobSpec *)m;
}

/* A job the planner plans but the workers of this release do not run (fp64 for pcs-worker, fp64
 * reductions of fp32 masters; pipeline stages of a C API program's explicit model) is refused at SubmitJob with UNIMPLEMENTED naming the field,
 * instead of being accepted and failing every rank at step 1; DryRunPlan still shows its plan.
 * Pipeline stages of the built-in model are accepted (issue 14). */
static void test_specs_the_workers_cannot_run_are_unimplemented_at_submit(void **state)
{
    (void)state;
    size_t before = count_jobs(A);
    const struct {
        const char *mesh, *extra, *needle;
    } c[] = {
        {"  - {dim: dp_shard, size: 2}\n  - {dim: pp, size: 2}\n", "explicit",
         "spec.mesh: pipeline stages (pp = 2) run the built-in mlp model only"},
        {"  - {dim: dp_shard, size: 4}\n", "precision: {master_dtype: fp64, param_dtype: fp32}\n",
         "spec.precision: fp64 masters run in programs that do their own math"},
        {"  - {dim: dp_shard, size: 4}\n", "precision: {reduce_dtype: fp64}\n",
         "spec.precision: unit 0 (root) has reduce dtype fp64 with master dtype fp32"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        Pcs__V1__JobSpec *spec = NULL;
        if (strcmp(c[i].extra, "explicit") == 0) {
            static const char y[] =
                "name: it-job\n"
                "model:\n"
                "  explicit:\n"
                "    - {path: layers, class: ModuleList}\n"
                "    - {path: layers.0, class: Linear, params: [{name: weight, shape: [4, 4]}]}\n"
                "    - {path: layers.1, class: Linear, params: [{name: weight, shape: [4, 4]}]}\n"
                "mesh: [{dim: dp_shard, size: 2}, {dim: pp, size: 2}]\n"
                "training: {steps: 2, micro_batch_size: 2, optimizer: {sgd: {lr: 0.1}}}\n"
                "data: {synthetic: {seed: 1}}\n";
            ProtobufCMessage *m = NULL;
            assert_int_equal(
                pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m), PCS_OK);
            spec = (Pcs__V1__JobSpec *)m;
        } else {
            spec = spec_variant(c[i].mesh, c[i].extra);
        }
        Pcs__V1__SubmitJobResponse *resp = NULL;
        assert_int_equal(submit(A, spec, NULL, &resp), 12); /* UNIMPLEMENTED */
        assert_null(resp);
        if (!strstr(pcs_last_error(), c[i].needle))
            fail_msg("case %zu: '%s' does not contain '%s'", i, pcs_last_error(), c[i].needle);
        /* the plan itself is fine: DryRunPlan returns it */
        Pcs__V1__DryRunPlanRequest dr = PCS__V1__DRY_RUN_PLAN_REQUEST__INIT;
        dr.spec = spec;
        Pcs__V1__DryRunPlanResponse *plan = NULL;
        assert_int_equal(
            call(A, PCS_M_DRY_RUN_PLAN, &dr, &pcs__v1__dry_run_plan_response__descriptor, &plan),
            0);
        assert_non_null(plan->plan);
        assert_int_equal(plan->plan->pp_size, i == 0 ? 2 : 1);
        protobuf_c_message_free_unpacked(&plan->base, NULL);
        protobuf_c_message_free_unpacked(&spec->base, NULL);
    }
    assert_int_equal(count_jobs(A), before); /* nothing was accepted */
}

/* Submit a valid job; fill ids[4] with the worker ids in rank order. */
static char *submit_running(const char *request_id, char ids[4][16])
{
    Pcs__V1__JobSpec *spec = spec_new();
    Pcs__V1__SubmitJobResponse *resp;
    assert_int_equal(submit(A, spec, request_id, &resp), 0);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    assert_false(resp->duplicate);
    assert_int_equal(resp->job->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    assert_int_equal(resp->job->world_size, 4);
    assert_int_equal(resp->job->generation, 1);
    assert_int_equal(resp->job->n_workers, 4);
    for (int r = 0; r < 4; r++)
        snprintf(ids[r], 16, "%s", resp->job->workers[r]);
    char *job_id = strdup(resp->job->job_id);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return job_id;
}

static void test_submit_gang_starts_and_watchers_get_ranks_plan_then_stop_on_cancel(void **state)
{
    (void)state;
    char ids[4][16];
    char *job_id = submit_running("req-watch", ids);
    Pcs__V1__GetJobResponse *gj;
    Pcs__V1__Job *job = get_job(A, job_id, &gj);
    uint64_t plan_hash = job->plan_hash;
    assert_non_null(job->spec);
    assert_string_equal(job->spec->name, "it-job");
    protobuf_c_message_free_unpacked(&gj->base, NULL);
    pcs_rpc_stream_t *s[4];
    for (int r = 0; r < 4; r++) {
        s[r] = watch(A, ids[r]);
        Pcs__V1__AssignmentEvent *e = next_event(s[r]);
        assert_int_equal(e->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT);
        Pcs__V1__Assignment *a = e->assignment;
        assert_string_equal(a->job_id, job_id);
        assert_int_equal(a->rank, r);
        assert_int_equal(a->world_size, 4);
        assert_int_equal(a->local_rank, r); /* all four registered from 127.0.0.1 */
        assert_int_equal(a->local_world_size, 4);
        assert_int_equal(a->generation, 1);
        assert_non_null(a->coords);
        assert_int_equal(a->coords->dp_shard, r);
        assert_non_null(a->spec);
        assert_int_equal(a->spec->mesh[0]->size, 4);
        assert_non_null(a->plan);
        assert_int_equal(a->plan->world_size, 4);
        assert_true(a->plan_hash == plan_hash);
        protobuf_c_message_free_unpacked(&e->base, NULL);
    }
    /* the same request id returns the same job */
    Pcs__V1__JobSpec *spec = spec_new();
    Pcs__V1__SubmitJobResponse *dup;
    assert_int_equal(submit(A, spec, "req-watch", &dup), 0);
    assert_true(dup->duplicate);
    assert_string_equal(dup->job->job_id, job_id);
    protobuf_c_message_free_unpacked(&dup->base, NULL);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    /* cancel: every watcher gets STOP, the job says CANCELLED with a reason */
    assert_int_equal(cancel_job(A, job_id), 0);
    for (int r = 0; r < 4; r++) {
        Pcs__V1__AssignmentEvent *e = next_event(s[r]);
        assert_int_equal(e->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE);
        assert_int_equal(e->directive->kind, PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_STOP);
        assert_string_equal(e->directive->job_id, job_id);
        protobuf_c_message_free_unpacked(&e->base, NULL);
        pcs_rpc_stream_close(s[r]);
    }
    job = get_job(A, job_id, &gj);
    assert_int_equal(job->state, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
    assert_non_null(strstr(job->reason, "cancelled"));
    assert_true(job->finished_ms >= job->started_ms && job->started_ms >= job->created_ms);
    protobuf_c_message_free_unpacked(&gj->base, NULL);
    /* a second cancel is idempotent (a client retrying after UNAVAILABLE sees its own result);
     * cancelling a job that succeeded or failed is FAILED_PRECONDITION (test_coord) */
    assert_int_equal(cancel_job(A, job_id), 0);
    /* a finished job's plan is rebuilt from its spec on demand: the same plan, the same hash */
    Pcs__V1__GetPlanRequest pr = PCS__V1__GET_PLAN_REQUEST__INIT;
    pr.job_id = job_id;
    Pcs__V1__GetPlanResponse *plan = NULL;
    assert_int_equal(call(A, PCS_M_GET_PLAN, &pr, &pcs__v1__get_plan_response__descriptor, &plan),
                     0);
    assert_non_null(plan->plan);
    assert_int_equal(plan->plan->world_size, 4);
    assert_true(plan->plan->hash == plan_hash);
    protobuf_c_message_free_unpacked(&plan->base, NULL);
    free(job_id);
}

static int kv_set(coord_proc_t *p, const char *job, uint64_t gen, const char *key, const void *val,
                  size_t len)
{
    Pcs__V1__KvSetRequest req = PCS__V1__KV_SET_REQUEST__INIT;
    req.job_id = (char *)job;
    req.generation = gen;
    req.key = (char *)key;
    req.value.data = (uint8_t *)val;
    req.value.len = len;
    Pcs__V1__KvSetResponse *resp = NULL;
    int code = call(p, PCS_M_KV_SET, &req, &pcs__v1__kv_set_response__descriptor, &resp);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return code;
}

static int kv_get(coord_proc_t *p, const char *job, uint64_t gen, const char *key, uint32_t wait_ms,
                  Pcs__V1__KvGetResponse **resp)
{
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    req.job_id = (char *)job;
    req.generation = gen;
    req.key = (char *)key;
    req.wait_ms = wait_ms;
    *resp = NULL;
    return call(p, PCS_M_KV_GET, &req, &pcs__v1__kv_get_response__descriptor, resp);
}

typedef struct delayed_set {
    const char *job;
    const char *secret; /* of the rank that sets */
    int code;
} delayed_set_t;

static void *set_later(void *arg)
{
    delayed_set_t *d = arg;
    pcs_test_sleep_ms(300);
    pcs_rpc_client_t *c;
    if (pcs_rpc_client_create(A->addr, &c) != PCS_OK)
        return NULL;
    (void)pcs_rpc_client_set_worker_secret(c, d->secret);
    Pcs__V1__KvSetRequest req = PCS__V1__KV_SET_REQUEST__INIT;
    req.job_id = (char *)d->job;
    req.generation = 1;
    req.key = "gloo/0/rank1";
    req.value.data = (uint8_t *)"10.0.0.2:555";
    req.value.len = 12;
    ProtobufCMessage *resp = NULL;
    pcs_rpc_call(c, PCS_M_KV_SET, &req.base, &pcs__v1__kv_set_response__descriptor, T_MS, &resp,
                 &d->code);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    pcs_rpc_client_destroy(c);
    return NULL;
}

static void test_kv_rendezvous_waits_limits_and_generations(void **state)
{
    (void)state;
    char ids[4][16];
    char *job = submit_running(NULL, ids);
    Pcs__V1__KvGetResponse *g;
    A->kv_as = ids[0]; /* rank 0 */
    assert_int_equal(kv_set(A, job, 1, "gloo/0/rank0", "10.0.0.1:444", 12), 0);
    assert_int_equal(kv_get(A, job, 1, "gloo/0/rank0", 0, &g), 0);
    assert_true(g->found);
    assert_int_equal(g->value.len, 12);
    assert_memory_equal(g->value.data, "10.0.0.1:444", 12);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    /* a parked get is answered by a set from another client */
    delayed_set_t d = {job, secret_of(A, ids[1]), -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, set_later, &d), 0);
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(kv_get(A, job, 1, "gloo/0/rank1", 4000, &g), 0);
    uint64_t waited = pcs_now_ms() - t0;
    pthread_join(th, NULL);
    assert_int_equal(d.code, 0);
    assert_true(g->found);
    assert_memory_equal(g->value.data, "10.0.0.2:555", 12);
    assert_true(waited >= 250 && waited < 3500);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    /* a parked get that nobody answers returns found=false after wait_ms */
    t0 = pcs_now_ms();
    assert_int_equal(kv_get(A, job, 1, "never", 300, &g), 0);
    waited = pcs_now_ms() - t0;
    assert_false(g->found);
    assert_true(waited >= 250 && waited < 3000);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    /* limits and scope */
    char key[100];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = 0;
    assert_int_equal(kv_set(A, job, 1, key, "v", 1), 8 /* RESOURCE_EXHAUSTED */);
    assert_non_null(strstr(pcs_last_error(), "key: 99 bytes exceeds the limit of 64"));
    assert_int_equal(kv_set(A, job, 2, "k", "v", 1), 9);
    assert_non_null(strstr(pcs_last_error(), "generation 2"));
    assert_int_equal(kv_set(A, "job-9999", 1, "k", "v", 1), 7 /* PERMISSION_DENIED */);
    assert_non_null(strstr(pcs_last_error(), "is not a rank of job job-9999"));
    assert_int_equal(kv_set(A, job, 1, "", "v", 1), 3);
    /* the key set before is still there: nothing accepted was lost */
    assert_int_equal(kv_get(A, job, 1, "gloo/0/rank0", 0, &g), 0);
    assert_true(g->found);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    assert_int_equal(cancel_job(A, job), 0);
    /* the job's ranks are no longer its ranks: its rendezvous is closed to them */
    assert_int_equal(kv_get(A, job, 1, "gloo/0/rank0", 0, &g), 7);
    A->kv_as = NULL;
    free(job);
}

static void test_report_step_done_from_all_ranks_succeeds_the_job(void **state)
{
    (void)state;
    char ids[4][16];
    char *job = submit_running(NULL, ids);
    for (uint32_t r = 0; r < 4; r++) {
        Pcs__V1__ReportStepRequest req = PCS__V1__REPORT_STEP_REQUEST__INIT;
        Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
        rep.step = 2;
        rep.loss = 0.25 + r;
        rep.done = true;
        rep.audit_ok = true;
        req.worker_id = ids[r];
        req.job_id = job;
        req.generation = 1;
        req.rank = r;
        req.report = &rep;
        Pcs__V1__ReportStepResponse *resp = NULL;
        assert_int_equal(
            call(A, PCS_M_REPORT_STEP, &req, &pcs__v1__report_step_response__descriptor, &resp), 0);
        assert_null(resp->directive);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    Pcs__V1__GetJobResponse *gj;
    Pcs__V1__Job *j = get_job(A, job, &gj);
    assert_int_equal(j->state, PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
    assert_int_equal(j->progress->step, 2);
    assert_true(j->progress->loss == 0.25);
    assert_int_equal(j->progress->reports, 4);
    protobuf_c_message_free_unpacked(&gj->base, NULL);
    free(job);
}

static void test_client_disconnect_mid_stream_then_rewatch_gets_the_assignment(void **state)
{
    (void)state;
    char ids[4][16];
    char *job = submit_running(NULL, ids);
    pcs_rpc_stream_t *s = watch(A, ids[2]);
    Pcs__V1__AssignmentEvent *e = next_event(s);
    assert_int_equal(e->assignment->rank, 2);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    pcs_rpc_stream_close(s); /* the client goes away mid-stream */
    pcs_test_sleep_ms(100);
    assert_int_equal(heartbeat(A, ids[2]), 0);
    s = watch(A, ids[2]);
    e = next_event(s);
    assert_int_equal(e->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT);
    assert_string_equal(e->assignment->job_id, job);
    assert_int_equal(e->assignment->rank, 2);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    /* a second watch of the same worker supersedes the first */
    pcs_rpc_stream_t *s2 = watch(A, ids[2]);
    ProtobufCMessage *m = NULL;
    pcs_status_t st = pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, T_MS, &m);
    assert_int_equal(st, PCS_ERR_CANCELLED);
    assert_non_null(strstr(pcs_last_error(), "superseded"));
    pcs_rpc_stream_close(s);
    e = next_event(s2);
    assert_int_equal(e->assignment->rank, 2);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    pcs_rpc_stream_close(s2);
    assert_int_equal(cancel_job(A, job), 0);
    free(job);
}

static int health_check(coord_proc_t *p, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    int code = call(p, PCS_M_HEALTH_CHECK, &req,
                    &grpc__health__v1__health_check_response__descriptor, &resp);
    if (resp) {
        code = code * 100 + (int)resp->status; /* OK + SERVING = 1 */
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return code;
}

static int health_watch_first(coord_proc_t *p, const char *service, pcs_rpc_stream_t **keep)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    pcs_rpc_stream_t *s;
    assert_int_equal(pcs_rpc_stream_open(p->cli, PCS_M_HEALTH_WATCH, &req.base, &s), PCS_OK);
    ProtobufCMessage *m = NULL;
    assert_int_equal(
        pcs_rpc_stream_next(s, &grpc__health__v1__health_check_response__descriptor, T_MS, &m),
        PCS_OK);
    int status = (int)((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
    if (keep)
        *keep = s;
    else
        pcs_rpc_stream_close(s);
    return status;
}

static void test_health_check_and_watch_serving_and_unknown_service(void **state)
{
    (void)state;
    assert_int_equal(health_check(A, ""), 1);
    assert_int_equal(health_check(A, "pcs.v1.WorkerService"), 1);
    assert_int_equal(health_check(A, "pcs.v1.JobService"), 1);
    assert_int_equal(health_check(A, "pcs.v1.ClusterService"), 1);
    assert_int_equal(health_check(A, "no.such.Service"), 5 /* NOT_FOUND */);
    assert_int_equal(health_watch_first(A, "", NULL), 1);
    assert_int_equal(health_watch_first(A, "no.such.Service", NULL), 3 /* SERVICE_UNKNOWN */);
}

static void test_unknown_method_malformed_and_oversized_requests_are_rejected(void **state)
{
    (void)state;
    Pcs__V1__GetStatusRequest empty = PCS__V1__GET_STATUS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    assert_int_not_equal(pcs_rpc_call(A->cli, "/pcs.v1.WorkerService/NoSuchMethod", &empty.base,
                                      &pcs__v1__get_status_response__descriptor, T_MS, &resp,
                                      &code),
                         PCS_OK);
    assert_int_equal(code, 12 /* UNIMPLEMENTED */);
    /* field 3 of RegisterRequest is a varint (pid); Device.name sends it length-delimited */
    Pcs__V1__Device wrong = PCS__V1__DEVICE__INIT;
    wrong.name = "not-a-pid";
    assert_int_not_equal(pcs_rpc_call(A->cli, PCS_M_REGISTER, &wrong.base,
                                      &pcs__v1__register_response__descriptor, T_MS, &resp, &code),
                         PCS_OK);
    assert_int_equal(code, 3 /* INVALID_ARGUMENT */);
    /* --max-message-bytes 65536 */
    size_t big = 100000;
    char *val = calloc(1, big);
    assert_int_equal(kv_set(A, "job-1", 1, "k", val, big), 8 /* RESOURCE_EXHAUSTED */);
    free(val);
    /* still serving, and the 100 registrations are intact */
    assert_int_equal(health_check(A, ""), 1);
    assert_int_equal(heartbeat(A, "w-100"), 0);
}

/* protobuf-c does not check proto3 strings: without the server's check these requests would
 * succeed and a stored identity or job name would make every later ListWorkers/GetJob reply
 * undecodable for Python/Go/C++ clients. */
static void test_invalid_utf8_in_any_string_field_is_invalid_argument_naming_it(void **state)
{
    (void)state;
    Pcs__V1__RegisterRequest rr = PCS__V1__REGISTER_REQUEST__INIT;
    Pcs__V1__RegisterResponse *rresp = NULL;
    rr.identity = "pod-\xff";
    rr.pid = 1;
    assert_int_equal(call(A, PCS_M_REGISTER, &rr, &pcs__v1__register_response__descriptor, &rresp),
                     3 /* INVALID_ARGUMENT */);
    assert_non_null(strstr(pcs_last_error(), "identity: not valid UTF-8 at byte 4"));
    Pcs__V1__Device dev = PCS__V1__DEVICE__INIT;
    Pcs__V1__Device *devs[1] = {&dev};
    dev.kind = "cpu";
    dev.name = "cpu\xed\xa0\x80"; /* a surrogate */
    rr.identity = "pod-utf8";
    rr.devices = devs;
    rr.n_devices = 1;
    assert_int_equal(call(A, PCS_M_REGISTER, &rr, &pcs__v1__register_response__descriptor, &rresp),
                     3);
    assert_non_null(strstr(pcs_last_error(), "devices[0].name: not valid UTF-8 at byte 3"));

    Pcs__V1__JobSpec *spec = spec_new();
    size_t jobs_before = count_jobs(A);
    free(spec->name);
    spec->name = strdup("caf\xc3\xa9-\xc0\xaf"); /* valid é, then an overlong '/' */
    Pcs__V1__SubmitJobResponse *sr = NULL;
    assert_int_equal(submit(A, spec, NULL, &sr), 3);
    assert_non_null(strstr(pcs_last_error(), "spec.name: not valid UTF-8 at byte 6"));
    assert_int_equal(count_jobs(A), jobs_before);
    protobuf_c_message_free_unpacked(&spec->base, NULL);

    Pcs__V1__KvSetRequest kv = PCS__V1__KV_SET_REQUEST__INIT;
    kv.job_id = "job-1";
    kv.key = "rank/\xf4\x90\x80\x80"; /* above U+10FFFF */
    Pcs__V1__KvSetResponse *kr = NULL;
    assert_int_equal(call(A, PCS_M_KV_SET, &kv, &pcs__v1__kv_set_response__descriptor, &kr), 3);
    assert_non_null(strstr(pcs_last_error(), "key: not valid UTF-8 at byte 5"));
    Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hc.service = "pcs\xe2\x82"; /* cut short */
    Grpc__Health__V1__HealthCheckResponse *hr = NULL;
    assert_int_equal(
        call(A, PCS_M_HEALTH_CHECK, &hc, &grpc__health__v1__health_check_response__descriptor, &hr),
        3);
    assert_non_null(strstr(pcs_last_error(), "service: not valid UTF-8 at byte 3"));

    /* a valid multi-byte identity is fine, and nothing invalid reached the worker list */
    rr.identity = "pod-\xe6\x97\xa5\xe6\x9c\xac";
    dev.name = "cpu0";
    assert_int_equal(call(A, PCS_M_REGISTER, &rr, &pcs__v1__register_response__descriptor, &rresp),
                     0);
    protobuf_c_message_free_unpacked(&rresp->base, NULL);
    Pcs__V1__ListWorkersRequest lw = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    Pcs__V1__ListWorkersResponse *ws = NULL;
    assert_int_equal(
        call(A, PCS_M_LIST_WORKERS, &lw, &pcs__v1__list_workers_response__descriptor, &ws), 0);
    int seen = 0;
    for (size_t i = 0; i < ws->n_workers; i++) {
        const char *id = ws->workers[i]->identity;
        assert_true(pcs_utf8_valid(id, strlen(id)));
        assert_null(strstr(id, "pod-\xff"));
        seen += strcmp(id, rr.identity) == 0;
    }
    assert_int_equal(seen, 1);
    protobuf_c_message_free_unpacked(&ws->base, NULL);
}

static void test_get_status_text_has_all_sections(void **state)
{
    (void)state;
    Pcs__V1__GetStatusRequest req = PCS__V1__GET_STATUS_REQUEST__INIT;
    Pcs__V1__GetStatusResponse *resp = NULL;
    assert_int_equal(
        call(A, PCS_M_GET_STATUS, &req, &pcs__v1__get_status_response__descriptor, &resp), 0);
    assert_int_equal(resp->workers_idle + resp->workers_assigned + resp->workers_stopping, 100);
    assert_non_null(strstr(resp->text, "# Coordinator\n"));
    assert_non_null(strstr(resp->text, "# Workers\n"));
    assert_non_null(strstr(resp->text, "# Jobs\n"));
    assert_non_null(strstr(resp->text, "# Config\n"));
    assert_non_null(strstr(resp->text, "lease_ms:600000"));
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

// ---------------------------------------------------------------------------------------------
// group B: a short lease

static void test_lease_expiry_marks_worker_lost_and_fails_its_job(void **state)
{
    (void)state;
    /* long enough that a loaded CI box (ASan) heartbeats in time, short enough for a quick test */
    static const char *const args[] = {"--lease-ms", "1000", "--heartbeat-interval-ms", "100",
                                       NULL};
    coord_proc_t *p = start("coord-b", args);
    char *ids[4];
    for (int i = 0; i < 4; i++) {
        char ident[32];
        snprintf(ident, sizeof ident, "lease-%d", i);
        ids[i] = reg(p, ident, NULL);
    }
    Pcs__V1__JobSpec *spec = spec_new();
    Pcs__V1__SubmitJobResponse *sr;
    assert_int_equal(submit(p, spec, NULL, &sr), 0);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    assert_int_equal(sr->job->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    char *job = strdup(sr->job->job_id);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    pcs_rpc_stream_t *s = watch(p, ids[0]);
    Pcs__V1__AssignmentEvent *e = next_event(s);
    assert_int_equal(e->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    /* ranks 0..2 heartbeat; rank 3 (ids[3]) stays silent */
    uint64_t t0 = pcs_now_ms();
    while (pcs_now_ms() - t0 < 2500) {
        for (int i = 0; i < 3; i++)
            assert_int_equal(heartbeat(p, ids[i]), 0);
        pcs_test_sleep_ms(80);
    }
    e = next_event(s);
    assert_int_equal(e->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE);
    assert_int_equal(e->directive->kind, PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_STOP);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    pcs_rpc_stream_close(s);
    Pcs__V1__GetJobRequest gr = PCS__V1__GET_JOB_REQUEST__INIT;
    gr.job_id = job;
    Pcs__V1__GetJobResponse *gj = NULL;
    assert_int_equal(call(p, PCS_M_GET_JOB, &gr, &pcs__v1__get_job_response__descriptor, &gj), 0);
    assert_int_equal(gj->job->state, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    char want[64];
    snprintf(want, sizeof want, "worker %s (rank 3) lost", ids[3]);
    assert_non_null(strstr(gj->job->reason, want));
    protobuf_c_message_free_unpacked(&gj->base, NULL);
    /* the LOST worker is told to re-register, and doing so revives it with the same id */
    assert_int_equal(heartbeat(p, ids[3]), 9);
    snprintf(want, sizeof want, "worker %s is LOST: re-register", ids[3]);
    assert_non_null(strstr(pcs_last_error(), want));
    int rr = 0;
    char *again = reg(p, "lease-3", &rr);
    assert_true(rr);
    assert_string_equal(again, ids[3]);
    free(again);
    assert_int_equal(heartbeat(p, ids[3]), 0);
    for (int i = 0; i < 4; i++)
        free(ids[i]);
    free(job);
    stop(p);
}

// ---------------------------------------------------------------------------------------------
// group C: persistence, metrics, shutdown

static void test_restart_with_same_db_keeps_worker_ids_and_job_history(void **state)
{
    (void)state;
    char *dbdir = pcs_test_tmpdir("coord-db");
    char db[1024];
    snprintf(db, sizeof db, "%s/state.db", dbdir);
    const char *args[] = {"--db", db, NULL};
    coord_proc_t *p = start("coord-d1", args);
    char *w1 = reg(p, "persist-a", NULL), *w2 = reg(p, "persist-b", NULL);
    Pcs__V1__JobSpec *spec = spec_new();
    spec->mesh[0]->size = 2;
    spec->training->steps = 10;
    Pcs__V1__SubmitJobResponse *sr;
    assert_int_equal(submit(p, spec, "persist-req", &sr), 0);
    char *job = strdup(sr->job->job_id);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    { /* rank 0 reports step 7 before the cancel: the operator's view must survive a restart */
        Pcs__V1__ReportStepRequest req = PCS__V1__REPORT_STEP_REQUEST__INIT;
        Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
        rep.step = 7;
        rep.loss = 0.375;
        rep.step_ms = 12.5;
        rep.audit_ok = true;
        req.worker_id = w1;
        req.job_id = job;
        req.generation = 1;
        req.rank = 0;
        req.report = &rep;
        Pcs__V1__ReportStepResponse *resp = NULL;
        assert_int_equal(
            call(p, PCS_M_REPORT_STEP, &req, &pcs__v1__report_step_response__descriptor, &resp), 0);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    assert_int_equal(cancel_job(p, job), 0);
    pcs_test_sleep_ms(100); /* the store commits from the loop's tick */
    p = restart(p, "coord-d2", args);
    int rr = 0;
    char *again = reg(p, "persist-b", &rr);
    assert_true(rr);
    assert_string_equal(again, w2);
    char *w3 = reg(p, "persist-c", &rr);
    assert_false(rr);
    assert_string_equal(w3, "w-3");
    Pcs__V1__GetJobRequest gr = PCS__V1__GET_JOB_REQUEST__INIT;
    gr.job_id = job;
    Pcs__V1__GetJobResponse *gj = NULL;
    assert_int_equal(call(p, PCS_M_GET_JOB, &gr, &pcs__v1__get_job_response__descriptor, &gj), 0);
    assert_int_equal(gj->job->state, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
    assert_string_equal(gj->job->request_id, "persist-req");
    assert_non_null(gj->job->spec);
    assert_string_equal(gj->job->spec->name, "it-job");
    assert_int_equal(gj->job->progress->step, 7);
    assert_true(gj->job->progress->loss == 0.375);
    assert_true(gj->job->progress->step_ms == 12.5);
    assert_int_equal(gj->job->progress->reports, 1);
    assert_true(gj->job->progress->audit_ok);
    protobuf_c_message_free_unpacked(&gj->base, NULL);
    /* idempotency survives the restart; new jobs continue the numbering */
    assert_int_equal(submit(p, spec, "persist-req", &sr), 0);
    assert_true(sr->duplicate);
    assert_string_equal(sr->job->job_id, job);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    assert_int_equal(submit(p, spec, "persist-req-2", &sr), 0);
    assert_string_equal(sr->job->job_id, "job-2");
    assert_int_equal(sr->job->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    stop(p);
    free(w1), free(w2), free(w3), free(again), free(job);
    pcs_test_rmtree(dbdir);
    free(dbdir);
}

/* A coordinator restarts while job-1 runs on two workers and job-2 (world 1) waits for one. The
 * worker that re-registers first must get its rank in job-1 back (the store kept rank -> worker)
 * rather than be handed to job-2 while its process still trains job-1. */
static void
test_restart_gives_a_reregistered_worker_its_rank_back_before_a_pending_job(void **state)
{
    (void)state;
    char *dbdir = pcs_test_tmpdir("coord-rk");
    char db[1024];
    snprintf(db, sizeof db, "%s/state.db", dbdir);
    const char *args[] = {"--db", db, "--lease-ms", "60000", NULL};
    coord_proc_t *p = start("coord-rk1", args);
    char *wa = reg(p, "rank-a", NULL), *wb = reg(p, "rank-b", NULL);
    Pcs__V1__JobSpec *spec = spec_new();
    spec->mesh[0]->size = 2;
    Pcs__V1__SubmitJobResponse *sr;
    assert_int_equal(submit(p, spec, NULL, &sr), 0);
    assert_int_equal(sr->job->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    char *running = strdup(sr->job->job_id);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    spec->mesh[0]->size = 1;
    assert_int_equal(submit(p, spec, NULL, &sr), 0);
    assert_int_equal(sr->job->state, PCS__V1__JOB_STATE__JOB_STATE_PENDING);
    char *pending = strdup(sr->job->job_id);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    /* which rank wb holds (gang start is FIFO by registration, but ask rather than assume) */
    pcs_rpc_stream_t *ws = watch(p, wb);
    Pcs__V1__AssignmentEvent *ev = next_event(ws);
    assert_int_equal(ev->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT);
    uint32_t rank_b = ev->assignment->rank;
    uint64_t gen = ev->assignment->generation;
    protobuf_c_message_free_unpacked(&ev->base, NULL);
    pcs_rpc_stream_close(ws);
    pcs_test_sleep_ms(150); /* the store commits from the loop's tick */
    p = restart(p, "coord-rk2", args);
    int rr = 0;
    char *again = reg(p, "rank-b", &rr); /* same identity and pid: the same process */
    assert_true(rr);
    assert_string_equal(again, wb);
    Pcs__V1__GetJobResponse *keep = NULL;
    Pcs__V1__Job *j2 = get_job(p, pending, &keep);
    assert_int_equal(j2->state, PCS__V1__JOB_STATE__JOB_STATE_PENDING); /* did not take rank-b */
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    Pcs__V1__Job *j1 = get_job(p, running, &keep);
    assert_int_equal(j1->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    assert_int_equal(j1->n_workers, 2);
    assert_string_equal(j1->workers[rank_b], wb);
    assert_string_equal(j1->workers[1 - rank_b], ""); /* rank-a not back yet */
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    /* its watch gives the assignment back: same job, rank and generation */
    ws = watch(p, wb);
    ev = next_event(ws);
    assert_int_equal(ev->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT);
    assert_string_equal(ev->assignment->job_id, running);
    assert_int_equal(ev->assignment->rank, rank_b);
    assert_int_equal(ev->assignment->generation, gen);
    protobuf_c_message_free_unpacked(&ev->base, NULL);
    pcs_rpc_stream_close(ws);
    /* a worker without a reservation goes to the pending job */
    char *wc = reg(p, "rank-c", NULL);
    j2 = get_job(p, pending, &keep);
    assert_int_equal(j2->state, PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    assert_string_equal(j2->workers[0], wc);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    /* rank-a comes back too: job-1 is whole again */
    char *a2 = reg(p, "rank-a", NULL);
    assert_string_equal(a2, wa);
    j1 = get_job(p, running, &keep);
    assert_string_equal(j1->workers[1 - rank_b], wa);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    stop(p);
    free(wa), free(wb), free(wc), free(a2), free(again), free(running), free(pending);
    pcs_test_rmtree(dbdir);
    free(dbdir);
}

/* Pending jobs whose stored spec cannot be planned again (unreadable, or without a mesh) are
 * restored FAILED with the cause, instead of gang-starting with no plan for their workers. */
static void test_restart_fails_pending_jobs_whose_spec_cannot_be_planned(void **state)
{
    (void)state;
    char *dbdir = pcs_test_tmpdir("coord-db-bad");
    char db[1024], cmd[2048];
    snprintf(db, sizeof db, "%s/state.db", dbdir);
    const char *args[] = {"--db", db, NULL};
    coord_proc_t *p = start("coord-db-bad1", args); /* creates the schema */
    stop(p);
    /* job-1: a spec blob that does not decode; job-2: a spec with a name only (no mesh) */
    snprintf(cmd, sizeof cmd,
             "sqlite3 %s \"INSERT INTO jobs(number, name, state, created_ms, spec) VALUES"
             " (1, 'garbage', 1, 1, X'ff'), (2, 'nomesh', 1, 1, X'0a03616263')\" 2>&1",
             db);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    if (status != 0) { /* no sqlite3 shell on this machine */
        free(out);
        pcs_test_rmtree(dbdir);
        free(dbdir);
        skip();
    }
    free(out);
    p = start("coord-db-bad2", args);
    char *w = reg(p, "restore-bad-spec", NULL); /* an idle worker a 1-rank job could take */
    for (int k = 0; k < 2; k++) {
        Pcs__V1__GetJobResponse *gj = NULL;
        Pcs__V1__Job *j = get_job(p, k == 0 ? "job-1" : "job-2", &gj);
        assert_int_equal(j->state, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
        assert_non_null(strstr(j->reason, "not started after a coordinator restart"));
        assert_non_null(strstr(j->reason, k == 0 ? "stored spec unreadable" : "mesh"));
        protobuf_c_message_free_unpacked(&gj->base, NULL);
    }
    assert_int_equal(heartbeat(p, w), 0);
    stop(p);
    free(w);
    pcs_test_rmtree(dbdir);
    free(dbdir);
}

/* Minimal HTTP/1.0 GET over a socket; returns the whole response (caller frees). */
static char *http_get(int port, const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET %s HTTP/1.0\r\n\r\n' >&3 && "
             "cat <&3",
             port, path);
    char full[600];
    snprintf(full, sizeof full, "bash -c \"%s\"", cmd);
    int status = -1;
    char *out = pcs_test_run(full, &status);
    assert_int_equal(status, 0);
    return out;
}


/* Every metric name (pcs_* / process_*) the file at `rel` (the shipped dashboard or alert rules)
 * queries is a family in the exposition `m`: a renamed metric breaks its panels and alerts. */
static void assert_queries_exported(const char *m, const char *rel)
{
    char path[1024];
    char *text = pcs_test_read_file(pcs_test_src(rel, path, sizeof path), NULL);
    assert_non_null(text);
    int names = 0;
    for (const char *q = text; *q; q++) {
        if ((strncmp(q, "pcs_", 4) != 0 && strncmp(q, "process_", 8) != 0) ||
            (q > text && (isalnum((unsigned char)q[-1]) || q[-1] == '_')))
            continue;
        char name[128];
        size_t n = 0;
        while ((isalnum((unsigned char)q[n]) || q[n] == '_') && n + 1 < sizeof name)
            n++;
        snprintf(name, sizeof name, "%.*s", (int)n, q);
        q += n - 1;
        static const char *const suffix[] = {"_bucket", "_sum", "_count"};
        for (size_t k = 0; k < 3; k++) { /* a histogram's series are named after its family */
            size_t l = strlen(name), sl = strlen(suffix[k]);
            if (l > sl && strcmp(name + l - sl, suffix[k]) == 0)
                name[l - sl] = '\0';
        }
        char type[160];
        snprintf(type, sizeof type, "# TYPE %s ", name);
        if (!strstr(m, type))
            fail_msg("%s queries %s, which the coordinator does not export", rel, name);
        names++;
    }
    assert_true(names >= 5);
    free(text);
}

static void test_metrics_endpoint_reports_workers_jobs_and_rpcs(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("coord-m");
    char mport_file[1024];
    char db[1024];
    snprintf(mport_file, sizeof mport_file, "%s/metrics.port", dir);
    snprintf(db, sizeof db, "%s/state.db", dir); /* durable: the pcs_store_* families too */
    const char *args[] = {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", mport_file,
                          "--db", db, NULL};
    coord_proc_t *p = start("coord-m", args);
    char *mp = pcs_test_wait_file(mport_file, 5000);
    assert_non_null(mp);
    int port = atoi(mp);
    free(mp);
    assert_true(port > 0);
    char *ids[5];
    for (int i = 0; i < 5; i++) {
        char ident[32];
        snprintf(ident, sizeof ident, "metrics-%d", i);
        ids[i] = reg(p, ident, NULL);
    }
    assert_int_equal(heartbeat(p, "w-77"), 16); /* no secret for it: UNAUTHENTICATED */
    Pcs__V1__JobSpec *spec = spec_new();
    spec->training->steps = 5;
    Pcs__V1__SubmitJobResponse *sr;
    assert_int_equal(submit(p, spec, NULL, &sr), 0);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    for (uint32_t r = 0; r < 2; r++) { /* two ranks report step 3 */
        Pcs__V1__ReportStepRequest req = PCS__V1__REPORT_STEP_REQUEST__INIT;
        Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
        rep.step = 3;
        rep.loss = r == 0 ? 0.5 : 7.0;
        rep.audit_ok = true;
        rep.all_gather_bytes = 1000;
        rep.reduce_scatter_bytes = 24;
        if (r == 1) { /* as a pipelined rank reports: a quarter of its action list idle */
            rep.pipeline_ms = 40;
            rep.compute_ms = 30;
        }
        req.worker_id = ids[r];
        req.job_id = "job-1";
        req.generation = 1;
        req.rank = r;
        req.report = &rep;
        Pcs__V1__ReportStepResponse *resp = NULL;
        assert_int_equal(
            call(p, PCS_M_REPORT_STEP, &req, &pcs__v1__report_step_response__descriptor, &resp), 0);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    pcs_test_sleep_ms(700); /* the snapshot is refreshed every 500 ms */
    char *m = http_get(port, "/metrics");
    assert_non_null(strstr(m, "200 OK"));
    assert_non_null(strstr(m, "pcs_workers{state=\"IDLE\"} 1"));
    assert_non_null(strstr(m, "pcs_workers{state=\"ASSIGNED\"} 4"));
    assert_non_null(strstr(m, "pcs_jobs{state=\"RUNNING\"} 1"));
    assert_non_null(strstr(m, "pcs_job_step{job_id=\"job-1\"} 3"));
    assert_non_null(strstr(m, "pcs_job_loss{job_id=\"job-1\"} 0.5\n"));
    assert_non_null(strstr(m, "pcs_job_reports_total{job_id=\"job-1\"} 2"));
    assert_non_null(
        strstr(m, "pcs_job_collective_bytes_total{job_id=\"job-1\",kind=\"all_gather\"} 2000"));
    assert_non_null(
        strstr(m, "pcs_job_collective_bytes_total{job_id=\"job-1\",kind=\"reduce_scatter\"} 48"));
    assert_non_null(strstr(m, "# TYPE pcs_job_reports_total counter"));
    assert_non_null(strstr(m, "pcs_rpc_calls_total{method=\"/pcs.v1.WorkerService/Register\","
                              "code=\"OK\"} 5"));
    assert_non_null(strstr(m, "pcs_rpc_calls_total{method=\"/pcs.v1.WorkerService/Heartbeat\","
                              "code=\"UNAUTHENTICATED\"} 1"));
    assert_non_null(strstr(m, "pcs_rpc_latency_seconds_bucket{method=\"/pcs.v1.WorkerService/"
                              "Register\",le=\"+Inf\"} 5"));
    assert_non_null(strstr(m, "le=\"600\"}")); /* buckets reach a parked KvGet's minutes */
    /* per rank, with the straggler view: ranks 0 and 1 reported 0.5 and 7.0 */
    assert_non_null(strstr(m, "pcs_rank_loss{job_id=\"job-1\",rank=\"1\"} 7\n"));
    assert_non_null(strstr(m, "pcs_job_slowest_rank{job_id=\"job-1\"}"));
    /* the pipeline bubble of the rank that has one, none for the other */
    assert_non_null(strstr(m, "pcs_rank_pipeline_bubble{job_id=\"job-1\",rank=\"1\"} 0.25\n"));
    assert_null(strstr(m, "pcs_rank_pipeline_bubble{job_id=\"job-1\",rank=\"0\"}"));
    assert_non_null(strstr(m, "pcs_build_info{version=\""));
    assert_non_null(strstr(m, "# TYPE process_resident_memory_bytes gauge"));
    assert_non_null(strstr(m, "process_open_fds "));
    assert_null(strstr(m, "job=\"")); /* Prometheus's own target label is `job` */
    assert_queries_exported(m, "deploy/grafana/pcs-dashboard.json");
    assert_queries_exported(m, "deploy/prometheus/alerts.yaml");
    /* the exposition, during a job, is what Prometheus's own linter accepts */
    char *body = strstr(m, "\r\n\r\n");
    assert_non_null(body);
    char mfile[1200];
    snprintf(mfile, sizeof mfile, "%s/metrics.txt", dir);
    FILE *mf = fopen(mfile, "w");
    assert_non_null(mf);
    fputs(body + 4, mf);
    fclose(mf);
    char why[1200];
    if (!pcs_test_exposition_grouped(body + 4, why, sizeof why))
        fail_msg("/metrics does not group its families: %s", why);
    char *lint = NULL;
    if (pcs_test_promtool_check(mfile, &lint) == 1)
        fail_msg("promtool check metrics:\n%s", lint);
    free(lint);
    free(m);
    m = http_get(port, "/readyz");
    assert_non_null(strstr(m, "200 OK"));
    free(m);
    m = http_get(port, "/healthz");
    assert_non_null(strstr(m, "200 OK"));
    free(m);
    m = http_get(port, "/nope");
    assert_non_null(strstr(m, "404"));
    free(m);
    /* A second coordinator on the same metrics port exits 1 naming the flag, not a stale error. */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "timeout 20 %s --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:%d 2>&1",
             pcs_test_bin("pcs-coordinator"), port);
    int status = -1;
    m = pcs_test_run(cmd, &status);
    assert_int_equal(status, 1);
    assert_non_null(m);
    assert_non_null(strstr(m, "pcs-coordinator: metrics-listen '127.0.0.1:"));
    free(m);
    /* an unwritable port file is named by its flag */
    snprintf(cmd, sizeof cmd,
             "timeout 20 %s --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "
             "--metrics-port-file %s/no/such/dir/m.port 2>&1",
             pcs_test_bin("pcs-coordinator"), dir);
    m = pcs_test_run(cmd, &status);
    assert_int_equal(status, 1);
    assert_non_null(m);
    assert_non_null(strstr(m, "pcs-coordinator: metrics-port-file: cannot write"));
    free(m);
    for (int i = 0; i < 5; i++)
        free(ids[i]);
    stop(p);
    pcs_test_rmtree(dir);
    free(dir);
}

/* Health/Watch streams are capped (--max-watch-streams): the one above the cap is refused with
 * RESOURCE_EXHAUSTED, a client closing its stream frees the slot, /metrics shows the count. */
static void test_health_watch_streams_above_the_cap_are_resource_exhausted(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("coord-hw");
    char mport_file[1024];
    snprintf(mport_file, sizeof mport_file, "%s/metrics.port", dir);
    const char *args[] = {"--max-watch-streams",
                          "3",
                          "--metrics-listen",
                          "127.0.0.1:0",
                          "--metrics-port-file",
                          mport_file,
                          NULL};
    coord_proc_t *p = start("coord-hw", args);
    char *mp = pcs_test_wait_file(mport_file, 5000);
    assert_non_null(mp);
    int port = atoi(mp);
    free(mp);
    pcs_rpc_stream_t *open_streams[3];
    for (int i = 0; i < 3; i++) /* unknown services count too: each stream holds a slot */
        assert_int_equal(health_watch_first(p, i == 2 ? "no.such.Service" : "", &open_streams[i]),
                         i == 2 ? 3 /* SERVICE_UNKNOWN */ : 1 /* SERVING */);

    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "";
    pcs_rpc_stream_t *extra = NULL;
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_rpc_stream_open(p->cli, PCS_M_HEALTH_WATCH, &req.base, &extra), PCS_OK);
    assert_int_equal(
        pcs_rpc_stream_next(extra, &grpc__health__v1__health_check_response__descriptor, T_MS, &m),
        PCS_ERR_LIMIT);
    assert_null(m);
    assert_int_equal(pcs_rpc_stream_code(extra), 8 /* RESOURCE_EXHAUSTED */);
    assert_non_null(strstr(pcs_last_error(), "max-watch-streams 3"));
    pcs_rpc_stream_close(extra);
    /* unary health checks are not streams: never refused by the cap */
    assert_int_equal(health_check(p, ""), 1);

    pcs_test_sleep_ms(700); /* the metrics snapshot is refreshed every 500 ms */
    char *text = http_get(port, "/metrics");
    assert_non_null(strstr(text, "pcs_health_watch_streams 3\n"));
    assert_non_null(strstr(text, "pcs_health_watch_streams_max 3\n"));
    assert_non_null(strstr(text, "pcs_health_watch_refused_total 1\n"));
    free(text);

    /* closing one (the client cancels) frees its slot: a new watch is served again */
    pcs_rpc_stream_close(open_streams[1]);
    int got = -1;
    for (int tries = 0; tries < 50 && got != 1; tries++) {
        pcs_rpc_stream_t *again = NULL;
        assert_int_equal(pcs_rpc_stream_open(p->cli, PCS_M_HEALTH_WATCH, &req.base, &again),
                         PCS_OK);
        m = NULL;
        pcs_status_t st = pcs_rpc_stream_next(
            again, &grpc__health__v1__health_check_response__descriptor, T_MS, &m);
        if (st == PCS_OK) {
            got = (int)((Grpc__Health__V1__HealthCheckResponse *)m)->status;
            protobuf_c_message_free_unpacked(m, NULL);
            open_streams[1] = again;
        } else {
            assert_int_equal(st, PCS_ERR_LIMIT); /* the cancel has not reached the server yet */
            pcs_rpc_stream_close(again);
            pcs_test_sleep_ms(20);
        }
    }
    assert_int_equal(got, 1);
    /* and the cap holds again with the replacement open */
    assert_int_equal(pcs_rpc_stream_open(p->cli, PCS_M_HEALTH_WATCH, &req.base, &extra), PCS_OK);
    m = NULL;
    assert_int_equal(
        pcs_rpc_stream_next(extra, &grpc__health__v1__health_check_response__descriptor, T_MS, &m),
        PCS_ERR_LIMIT);
    pcs_rpc_stream_close(extra);
    for (int i = 0; i < 3; i++)
        pcs_rpc_stream_close(open_streams[i]);
    stop(p);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_sigterm_ends_open_streams_with_unavailable_and_exits_zero(void **state)
{
    (void)state;
    coord_proc_t *p = start("coord-c", NULL);
    char *id = reg(p, "solo", NULL);
    pcs_rpc_stream_t *ws = watch(p, id);
    pcs_rpc_stream_t *hs = NULL;
    assert_int_equal(health_watch_first(p, "", &hs), 1);
    pcs_test_sleep_ms(100); /* let the watch reach the handler */
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(kill(p->pid, SIGTERM), 0);
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_rpc_stream_next(ws, &pcs__v1__assignment_event__descriptor, T_MS, &m),
                     PCS_ERR_REMOTE);
    assert_non_null(strstr(pcs_last_error(), "shutting down"));
    /* health watchers see NOT_SERVING before the stream ends */
    assert_int_equal(
        pcs_rpc_stream_next(hs, &grpc__health__v1__health_check_response__descriptor, T_MS, &m),
        PCS_OK);
    assert_non_null(m);
    assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)m)->status, 2);
    protobuf_c_message_free_unpacked(m, NULL);
    pcs_rpc_stream_close(ws);
    pcs_rpc_stream_close(hs);
    int status = pcs_test_wait(p->pid, 3000);
    assert_int_not_equal(status, -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(pcs_now_ms() - t0 < 3000);
    free(id);
    pcs_rpc_client_destroy(p->cli);
    pcs_test_rmtree(p->dir);
    free(p->dir);
    free(p);
}

int main(void)
{
    const struct CMUnitTest group_a[] = {
        cmocka_unit_test(test_100_workers_register_and_reregister_keeps_the_id),
        cmocka_unit_test(test_bad_worker_requests_get_precise_codes),
        cmocka_unit_test(test_invalid_specs_are_invalid_argument_naming_the_field),
        cmocka_unit_test(test_specs_the_workers_cannot_run_are_unimplemented_at_submit),
        cmocka_unit_test(test_submit_gang_starts_and_watchers_get_ranks_plan_then_stop_on_cancel),
        cmocka_unit_test(test_kv_rendezvous_waits_limits_and_generations),
        cmocka_unit_test(test_report_step_done_from_all_ranks_succeeds_the_job),
        cmocka_unit_test(test_client_disconnect_mid_stream_then_rewatch_gets_the_assignment),
        cmocka_unit_test(test_health_check_and_watch_serving_and_unknown_service),
        cmocka_unit_test(test_unknown_method_malformed_and_oversized_requests_are_rejected),
        cmocka_unit_test(test_get_status_text_has_all_sections),
        cmocka_unit_test(test_invalid_utf8_in_any_string_field_is_invalid_argument_naming_it),
    };
    const struct CMUnitTest others[] = {
        cmocka_unit_test(test_lease_expiry_marks_worker_lost_and_fails_its_job),
        cmocka_unit_test(test_restart_with_same_db_keeps_worker_ids_and_job_history),
        cmocka_unit_test(test_restart_fails_pending_jobs_whose_spec_cannot_be_planned),
        cmocka_unit_test(
            test_restart_gives_a_reregistered_worker_its_rank_back_before_a_pending_job),
        cmocka_unit_test(test_metrics_endpoint_reports_workers_jobs_and_rpcs),
        cmocka_unit_test(test_sigterm_ends_open_streams_with_unavailable_and_exits_zero),
        cmocka_unit_test(test_health_watch_streams_above_the_cap_are_resource_exhausted),
    };
    int fails =
        cmocka_run_group_tests_name("coordinator", group_a, group_a_setup, group_a_teardown);
    fails += cmocka_run_group_tests_name("coordinator_lifecycle", others, NULL, NULL);
    return fails;
}
