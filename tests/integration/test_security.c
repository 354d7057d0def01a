/* A worker credential acts for one worker only (issue 12, DESIGN.md §10), on a real
 * pcs-coordinator with bearer tokens and two real pcs-worker processes training a job on
 * 127.0.0.1. The attacker holds what any worker pod holds — the `worker` bearer token — and even
 * a registration (and so a secret) of its own. Every impersonation attempt the issue measured must
 * be refused, and the job must end as its real workers make it end:
 *  - ReportStep for the job's rank 0 naming its worker (a forged SUCCEEDED at step 100000, a
 *    forged failure), with the attacker's secret, without any, and with a made-up one;
 *  - Register of a live worker's identity (taking it over), Deregister, Heartbeat and
 *    WatchAssignment naming that worker;
 *  - KvSet/KvGet on the job's rendezvous by a worker that is not its rank.
 * Then the role x method matrix: every RPC with no token and with each role's token reaches the
 * handler exactly when the role allows it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define VIEW  "view-0123456789abcdef"
#define SUB   "sub-0123456789abcdef"
#define WRK   "wrk-0123456789abcdef"
#define ADMIN "adm-0123456789abcdef"
#define ALICE  "alice-0123456789abcdef"
#define ALICE2 "alice-rotated-0123456789"
#define BOB    "bob-0123456789abcdef"
#define STEPS 400

#define C_OK              0
#define C_INVALID         3
#define C_NOT_FOUND       5
#define C_PERMISSION      7
#define C_PRECONDITION    9
#define C_UNAUTHENTICATED 16

static const char k_job[] = "name: guarded\n"
                            "model:\n"
                            "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                            "mesh:\n"
                            "  - {dim: dp_shard, size: 2}\n"
                            "training: {steps: 400, micro_batch_size: 4,"
                            " optimizer: {sgd: {lr: 0.01}}}\n"
                            "data: {synthetic: {seed: 3}}\n";

static e2e_cluster_t g_cl;
static int g_port;
static char g_token_file[1100];

static int teardown(void **state)
{
    (void)state;
    e2e_stop(&g_cl);
    unsetenv("PCS_TOKEN");
    return 0;
}

/* Start a coordinator that needs bearer tokens; the e2e helpers act as admin. */
static void start_with_tokens(const char *tag)
{
    memset(&g_cl, 0, sizeof g_cl);
    g_cl.dir = pcs_test_tmpdir(tag);
    char path[1100];
    snprintf(path, sizeof path, "%s/tokens.conf", g_cl.dir);
    FILE *t = fopen(path, "w");
    assert_non_null(t);
    fprintf(t, "viewer %s\nsubmitter %s\nworker %s\nadmin %s\n", VIEW, SUB, WRK, ADMIN);
    /* named submitters: two tokens of one principal (a rotation), and another */
    fprintf(t, "submitter %s alice\nsubmitter %s alice\nsubmitter %s bob\n", ALICE, ALICE2, BOB);
    fclose(t);
    setenv("PCS_TOKEN", ADMIN, 1);
    g_port = e2e_free_port();
    assert_true(g_port > 0);
    snprintf(g_token_file, sizeof g_token_file, "%s", path);
    const char *const args[] = {"--token-file", g_token_file, NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, g_port, args), 0);
}

/* A client with a role's bearer token (NULL: none). */
static pcs_rpc_client_t *client(const char *token)
{
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(g_cl.addr, &c), PCS_OK);
    assert_int_equal(pcs_rpc_client_set_token(c, token), PCS_OK);
    return c;
}

static int call(pcs_rpc_client_t *c, const char *secret, const char *method,
                const ProtobufCMessage *req, const ProtobufCMessageDescriptor *d,
                ProtobufCMessage **resp)
{
    int code = -1;
    ProtobufCMessage *r = NULL;
    pcs_status_t st = pcs_rpc_call_as(c, secret, method, req, d, 5000, &r, &code);
    if (st == PCS_OK)
        code = 0;
    if (resp)
        *resp = r;
    else if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    return code;
}

static void expect(int got, int want, const char *what)
{
    if (got != want)
        fail_msg("%s: gRPC code %d, want %d (%s)", what, got, want, pcs_last_error());
}

static int report(pcs_rpc_client_t *c, const char *secret, const char *worker_id,
                  const char *job_id, uint32_t rank, uint64_t step, bool done, const char *error)
{
    Pcs__V1__ReportStepRequest req = PCS__V1__REPORT_STEP_REQUEST__INIT;
    Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
    rep.step = step;
    rep.done = done;
    rep.audit_ok = true;
    rep.error = (char *)(error ? error : "");
    req.worker_id = (char *)worker_id;
    req.job_id = (char *)job_id;
    req.generation = 1;
    req.rank = rank;
    req.report = &rep;
    return call(c, secret, PCS_M_REPORT_STEP, &req.base,
                &pcs__v1__report_step_response__descriptor, NULL);
}

/* GetJob with `token`'s client: the response (the caller frees it). */
static Pcs__V1__GetJobResponse *get_job(const char *token, const char *job_id)
{
    pcs_rpc_client_t *c = client(token);
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    ProtobufCMessage *m = NULL;
    expect(call(c, NULL, PCS_M_GET_JOB, &req.base, &pcs__v1__get_job_response__descriptor, &m),
           C_OK, "GetJob");
    pcs_rpc_client_destroy(c);
    return (Pcs__V1__GetJobResponse *)m;
}

/* The worker id holding `rank` of the job (GetJob). */
static void holder(const char *job_id, uint32_t rank, char *out, size_t n)
{
    Pcs__V1__GetJobResponse *m = get_job(ADMIN, job_id);
    assert_true(rank < m->job->n_workers);
    snprintf(out, n, "%s", m->job->workers[rank]);
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void test_no_impersonation_attempt_succeeds(void **state)
{
    (void)state;
    start_with_tokens("security");
    const char *const wargs[] = {"--heartbeat-interval-ms", "200", "--step-pause-ms", "20", NULL};
    setenv("PCS_TOKEN", WRK, 1);
    assert_int_equal(e2e_spawn_workers(&g_cl, 2, wargs), 0);
    setenv("PCS_TOKEN", ADMIN, 1);
    e2e_job_t job;
    memset(&job, 0, sizeof job);
    int submitted = -1;
    for (int i = 0; i < 100 && submitted != 0; i++) { /* the workers register first */
        submitted = e2e_submit(&g_cl, k_job, "guarded", &job);
        if (submitted != 0)
            pcs_test_sleep_ms(100);
    }
    assert_int_equal(submitted, 0);
    for (int i = 0; i < 200 && e2e_job_state(&g_cl, job.job_id, NULL, 0) !=
                                   PCS__V1__JOB_STATE__JOB_STATE_RUNNING;
         i++)
        pcs_test_sleep_ms(50);
    char victim[32], other[32];
    holder(job.job_id, 0, victim, sizeof victim);
    holder(job.job_id, 1, other, sizeof other);

    /* the attacker: the worker token, and a registration of its own */
    pcs_rpc_client_t *evil = client(WRK);
    Pcs__V1__RegisterRequest rr = PCS__V1__REGISTER_REQUEST__INIT;
    rr.identity = "evil-pod";
    rr.host = "evil";
    ProtobufCMessage *m = NULL;
    expect(call(evil, "", PCS_M_REGISTER, &rr.base, &pcs__v1__register_response__descriptor, &m),
           C_OK, "the attacker's own Register");
    char mine[160], my_id[32];
    snprintf(mine, sizeof mine, "%s", ((Pcs__V1__RegisterResponse *)m)->worker_secret);
    snprintf(my_id, sizeof my_id, "%s", ((Pcs__V1__RegisterResponse *)m)->worker_id);
    protobuf_c_message_free_unpacked(m, NULL);
    assert_true(strlen(mine) > 64);

    /* 1. a forged SUCCEEDED at step 100000 for rank 0, naming its worker: with the attacker's
     * secret, without one, with a made-up one of the victim's form */
    expect(report(evil, mine, victim, job.job_id, 0, 100000, true, NULL), C_PERMISSION,
           "ReportStep naming the victim, attacker's secret");
    assert_non_null(strstr(pcs_last_error(), "a worker acts only for itself"));
    expect(report(evil, "", victim, job.job_id, 0, 100000, true, NULL), C_UNAUTHENTICATED,
           "ReportStep without a secret");
    char forged[160];
    snprintf(forged, sizeof forged, "%s.%s", victim,
             "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    expect(report(evil, forged, victim, job.job_id, 0, 100000, true, NULL), C_UNAUTHENTICATED,
           "ReportStep with a made-up secret");
    expect(report(evil, mine, victim, job.job_id, 0, 5, false, "forged failure"), C_PERMISSION,
           "a forged failure of rank 0");
    /* in its own name it is no rank of the job: told to stop, nothing recorded */
    expect(report(evil, mine, my_id, job.job_id, 0, STEPS, true, NULL), C_OK,
           "ReportStep in its own name");
    /* 2. take over the victim's identity: its registration is held by the live process */
    char victim_identity[64];
    {
        pcs_rpc_client_t *a = client(ADMIN);
        Pcs__V1__ListWorkersRequest lw = PCS__V1__LIST_WORKERS_REQUEST__INIT;
        expect(call(a, NULL, PCS_M_LIST_WORKERS, &lw.base,
                    &pcs__v1__list_workers_response__descriptor, &m),
               C_OK, "ListWorkers");
        Pcs__V1__ListWorkersResponse *r = (Pcs__V1__ListWorkersResponse *)m;
        victim_identity[0] = 0;
        for (size_t i = 0; i < r->n_workers; i++)
            if (strcmp(r->workers[i]->worker_id, victim) == 0)
                snprintf(victim_identity, sizeof victim_identity, "%s", r->workers[i]->identity);
        protobuf_c_message_free_unpacked(m, NULL);
        pcs_rpc_client_destroy(a);
    }
    assert_true(victim_identity[0]);
    rr.identity = victim_identity;
    rr.incarnation = 12345;
    expect(call(evil, mine, PCS_M_REGISTER, &rr.base, &pcs__v1__register_response__descriptor,
                NULL),
           C_PRECONDITION, "Register of the victim's identity");
    assert_non_null(strstr(pcs_last_error(), "is held by worker"));
    /* 3. Deregister, Heartbeat and WatchAssignment naming the victim */
    Pcs__V1__DeregisterRequest dr = PCS__V1__DEREGISTER_REQUEST__INIT;
    dr.worker_id = victim;
    dr.reason = "forged";
    expect(call(evil, mine, PCS_M_DEREGISTER, &dr.base, &pcs__v1__deregister_response__descriptor,
                NULL),
           C_PERMISSION, "Deregister of the victim");
    Pcs__V1__HeartbeatRequest hb = PCS__V1__HEARTBEAT_REQUEST__INIT;
    hb.worker_id = victim;
    expect(call(evil, mine, PCS_M_HEARTBEAT, &hb.base, &pcs__v1__heartbeat_response__descriptor,
                NULL),
           C_PERMISSION, "Heartbeat as the victim");
    Pcs__V1__WatchAssignmentRequest wr = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    wr.worker_id = victim;
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open_as(evil, mine, PCS_M_WATCH_ASSIGNMENT, &wr.base, &s),
                     PCS_OK);
    ProtobufCMessage *ev = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000, &ev),
                     PCS_ERR_PERMISSION);
    assert_null(ev);
    pcs_rpc_stream_close(s);
    /* 4. the job's rendezvous: not the attacker's to read or write */
    Pcs__V1__KvSetRequest ks = PCS__V1__KV_SET_REQUEST__INIT;
    ks.job_id = job.job_id;
    ks.generation = 1;
    ks.key = "gloo/world/rank0";
    ks.value.data = (uint8_t *)"10.6.6.6:1";
    ks.value.len = 10;
    expect(call(evil, mine, PCS_M_KV_SET, &ks.base, &pcs__v1__kv_set_response__descriptor, NULL),
           C_PERMISSION, "KvSet on another job");
    Pcs__V1__KvGetRequest kg = PCS__V1__KV_GET_REQUEST__INIT;
    kg.job_id = job.job_id;
    kg.generation = 1;
    kg.key = "gloo/world/rank0";
    expect(call(evil, mine, PCS_M_KV_GET, &kg.base, &pcs__v1__kv_get_response__descriptor, NULL),
           C_PERMISSION, "KvGet on another job");
    expect(call(evil, "", PCS_M_KV_GET, &kg.base, &pcs__v1__kv_get_response__descriptor, NULL),
           C_UNAUTHENTICATED, "KvGet without a secret");
    pcs_rpc_client_destroy(evil);

    /* none of it touched the job: it runs on and ends as its workers make it end */
    char reason[512] = "";
    assert_int_equal(e2e_job_state(&g_cl, job.job_id, reason, sizeof reason),
                     PCS__V1__JOB_STATE__JOB_STATE_RUNNING);
    assert_int_equal(e2e_wait_job(&g_cl, &job, 120000), 0);
    if (job.state != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("job %s ended in state %d: %s", job.job_id, job.state, job.reason);
    char want[64];
    snprintf(want, sizeof want, "all 2 ranks finished at step %d", STEPS);
    assert_string_equal(job.reason, want);
    for (int r = 0; r < 2; r++) {
        size_t n = job.n_reports[r];
        assert_true(n > 0);
        assert_int_equal(job.reports[r][n - 1]->step, STEPS);
    }
    e2e_job_free(&job);
}

/* Every method with no token and with each role's token: the role gate passes exactly the
 * methods DESIGN.md §10 gives the role (the handler then answers: OK, or an error that is not an
 * authentication one); a WorkerService call past the gate still needs a worker's secret. */
static void test_role_by_method_matrix(void **state)
{
    (void)state;
    start_with_tokens("security-matrix");
    static const struct {
        const char *name, *token;
        unsigned roles; /* bit 0 viewer, 1 submitter, 2 worker */
    } who[] = {{"none", NULL, 0},
               {"viewer", VIEW, 1},
               {"submitter", SUB, 1 | 2},
               {"worker", WRK, 1 | 4},
               {"admin", ADMIN, 1 | 2 | 4}};
    size_t n_methods = 0;
    const pcs_rpc_method_info_t *methods = pcs_rpc_known_methods(&n_methods);
    assert_true(n_methods >= 17);
    for (size_t w = 0; w < sizeof who / sizeof who[0]; w++) {
        pcs_rpc_client_t *c = client(who[w].token);
        for (size_t i = 0; i < n_methods; i++) {
            const char *path = methods[i].path;
            unsigned need = strncmp(path, "/grpc.health.v1.", 16) == 0 ? 0
                            : strncmp(path, "/pcs.v1.WorkerService/", 22) == 0
                                ? 4
                            : strcmp(path, PCS_M_SUBMIT_JOB) == 0 ||
                                    strcmp(path, PCS_M_CANCEL_JOB) == 0
                                ? 2
                                : 1;
            bool allowed = need == 0 || (who[w].roles & need);
            /* an empty request of the method's type */
            ProtobufCMessage *req = calloc(1, methods[i].req_desc->sizeof_message);
            assert_non_null(req);
            methods[i].req_desc->message_init(req);
            int code = -1;
            if (methods[i].server_streaming) {
                pcs_rpc_stream_t *s = NULL;
                assert_int_equal(pcs_rpc_stream_open(c, path, req, &s), PCS_OK);
                ProtobufCMessage *msg = NULL;
                pcs_status_t st = pcs_rpc_stream_next(s, methods[i].resp_desc, 3000, &msg);
                code = st == PCS_OK ? 0 : pcs_rpc_stream_code(s);
                if (msg)
                    protobuf_c_message_free_unpacked(msg, NULL);
                pcs_rpc_stream_close(s);
            } else {
                code = call(c, NULL, path, req, methods[i].resp_desc, NULL);
            }
            free(req);
            const char *err = pcs_last_error();
            bool role_refused = (code == C_UNAUTHENTICATED && strstr(err, "bearer token")) ||
                                (code == C_PERMISSION && strstr(err, "may not call"));
            if (allowed == role_refused)
                fail_msg("%s calling %s: code %d (%s); the role gate should %s it", who[w].name,
                         path, code, err, allowed ? "pass" : "refuse");
            /* past the gate, a worker call without a worker's secret is still refused */
            if (allowed && need == 4 && strcmp(path, PCS_M_REGISTER) != 0 &&
                (code != C_UNAUTHENTICATED || !strstr(err, "worker's secret")))
                fail_msg("%s calling %s without a secret: code %d (%s)", who[w].name, path, code,
                         err);
        }
        pcs_rpc_client_destroy(c);
    }
}

static const char k_pending_job[] = "name: owned\n"
                                    "model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                                    "mesh: [{dim: dp_shard, size: 64}]\n"
                                    "training: {steps: 5, micro_batch_size: 4,"
                                    " optimizer: {sgd: {lr: 0.01}}}\n"
                                    "data: {synthetic: {seed: 3}}\n";

/* SubmitJob as `token` with `request_id`: the gRPC code; the job (id, owner) when it is OK. */
static int submit_as(const char *token, const char *request_id, char *job_id, char *owner,
                     bool *duplicate)
{
    Pcs__V1__JobSpec *spec = e2e_parse_spec(k_pending_job);
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.request_id = (char *)request_id;
    req.spec = spec;
    pcs_rpc_client_t *c = client(token);
    ProtobufCMessage *m = NULL;
    int code = call(c, NULL, PCS_M_SUBMIT_JOB, &req.base,
                    &pcs__v1__submit_job_response__descriptor, &m);
    if (code == C_OK) {
        Pcs__V1__SubmitJobResponse *r = (Pcs__V1__SubmitJobResponse *)m;
        snprintf(job_id, 32, "%s", r->job->job_id);
        snprintf(owner, 80, "%s", r->job->owner);
        *duplicate = r->duplicate;
    }
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    pcs_rpc_client_destroy(c);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return code;
}

static int cancel_as(const char *token, const char *job_id)
{
    Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    req.reason = (char *)"test";
    pcs_rpc_client_t *c = client(token);
    int code =
        call(c, NULL, PCS_M_CANCEL_JOB, &req.base, &pcs__v1__cancel_job_response__descriptor, NULL);
    pcs_rpc_client_destroy(c);
    return code;
}

/* GetJob as a viewer: the job's owner and state. */
static void job_owner(const char *job_id, char *owner, int *state)
{
    Pcs__V1__GetJobResponse *m = get_job(VIEW, job_id);
    snprintf(owner, 80, "%s", m->job->owner);
    *state = (int)m->job->state;
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

/* A submitter owns its jobs: the token file's name (or the token's hash) is the job's owner,
 * shown by GetJob and kept across a coordinator restart; another submitter may neither cancel
 * the job nor take its idempotency key; another token of the same principal may do both; an
 * admin cancels any job. */
static void test_submitters_own_their_jobs(void **state)
{
    (void)state;
    start_with_tokens("security-owner");
    char a_job[32], b_job[32], owner[80];
    bool dup = false;
    expect(submit_as(ALICE, "req-1", a_job, owner, &dup), C_OK, "alice submits");
    assert_string_equal(owner, "alice");
    assert_false(dup);
    expect(submit_as(BOB, "req-1", b_job, owner, &dup), 6 /* ALREADY_EXISTS */,
           "bob reuses alice's request_id");
    assert_non_null(strstr(pcs_last_error(), "another submitter's job"));
    char again[32];
    expect(submit_as(ALICE2, "req-1", again, owner, &dup), C_OK, "alice's other token retries");
    assert_true(dup);
    assert_string_equal(again, a_job);
    expect(submit_as(SUB, "req-2", b_job, owner, &dup), C_OK, "an unnamed token submits");
    assert_int_equal(strlen(owner), strlen("token:") + 12);
    assert_memory_equal(owner, "token:", 6);
    expect(cancel_as(BOB, a_job), C_PERMISSION, "bob cancels alice's job");
    assert_non_null(strstr(pcs_last_error(), "was submitted by 'alice'"));
    expect(cancel_as(ALICE, b_job), C_PERMISSION, "alice cancels the unnamed token's job");
    int st = 0;
    job_owner(a_job, owner, &st);
    assert_int_equal(st, PCS__V1__JOB_STATE__JOB_STATE_PENDING);
    /* a restart keeps the owners (the state DB) */
    pcs_test_stop(g_cl.coord, 5000);
    const char *const args[] = {"--token-file", g_token_file, NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, g_port, args), 0);
    job_owner(a_job, owner, &st);
    assert_string_equal(owner, "alice");
    expect(cancel_as(BOB, a_job), C_PERMISSION, "bob cancels alice's job after a restart");
    expect(cancel_as(ALICE2, a_job), C_OK, "alice's other token cancels her job");
    job_owner(a_job, owner, &st);
    assert_int_equal(st, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
    expect(cancel_as(ADMIN, b_job), C_OK, "an admin cancels any job");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_no_impersonation_attempt_succeeds, teardown),
        cmocka_unit_test_teardown(test_role_by_method_matrix, teardown),
        cmocka_unit_test_teardown(test_submitters_own_their_jobs, teardown),
    };
    return cmocka_run_group_tests_name("security", tests, NULL, NULL);
}
