/* End-to-end test helpers (see test_e2e_util.h): real processes on loopback, jobs over gRPC,
 * per-rank report files, export from the sharded checkpoint, parity against the reference. */
#include "test_e2e_util.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <execinfo.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/agent.h"
#include "coll/kv.h"
#include "worker/train.h"
#include "io/checkpoint.h"
#include "io/report.h"
#include "pcs/clock.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "planner/plan.h"
#include "model/reference.h"
#include "io/safetensors.h"
#include "test_util.h"

int e2e_start(e2e_cluster_t *c, const char *tag)
{
    memset(c, 0, sizeof *c);
    c->dir = pcs_test_tmpdir(tag);
    const char *args[] = {"--db", ":memory:", "--lease-ms", "5000", NULL};
    c->coord = pcs_test_start_coordinator(c->dir, args, c->addr, sizeof c->addr);
    if (c->coord < 0) {
        fprintf(stderr, "e2e: cannot start pcs-coordinator (log in %s/coord.log)\n", c->dir);
        return -1;
    }
    return 0;
}

int e2e_spawn_workers(e2e_cluster_t *c, int n, const char *const *extra)
{
    for (int i = 0; i < n && c->n_workers < E2E_MAX_RANKS; i++) {
        char ident[64], log[1100];
        snprintf(ident, sizeof ident, "e2e-%d-%d", (int)getpid(), c->n_workers);
        snprintf(log, sizeof log, "%s/worker%d.log", c->dir, c->n_workers);
        const char *argv[40];
        int k = 0;
        argv[k++] = pcs_test_bin("pcs-worker");
        argv[k++] = "--coordinator";
        argv[k++] = c->addr;
        argv[k++] = "--identity";
        argv[k++] = ident;
        argv[k++] = "--max-jobs";
        argv[k++] = "1";
        argv[k++] = "--report-dir";
        argv[k++] = c->dir;
        argv[k++] = "--coll-timeout-ms";
        argv[k++] = "8000";
        argv[k++] = "--heartbeat-interval-ms";
        argv[k++] = "300";
        argv[k++] = "--root"; /* the test's files (data, init.from, checkpoints) are all here */
        argv[k++] = c->dir;
        for (int j = 0; extra && extra[j] && k < 38; j++)
            argv[k++] = extra[j];
        argv[k] = NULL;
        pid_t pid = pcs_test_spawn((char *const *)argv, log);
        if (pid < 0)
            return -1;
        c->workers[c->n_workers++] = pid;
    }
    return 0;
}

int e2e_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int e2e_start_coord_at(e2e_cluster_t *c, int port, const char *const *extra)
{
    char listen[64], db[1100], log[1100];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(db, sizeof db, "%s/coordinator.db", c->dir);
    snprintf(log, sizeof log, "%s/coord-%d.log", c->dir, port);
    const char *argv[40] = {pcs_test_bin("pcs-coordinator"), "--listen", listen, "--db", db};
    int k = 5;
    for (int j = 0; extra && extra[j] && k < 39; j++)
        argv[k++] = extra[j];
    argv[k] = NULL;
    c->coord = pcs_test_spawn((char *const *)argv, log);
    if (c->coord < 0)
        return -1;
    snprintf(c->addr, sizeof c->addr, "%s", listen);
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK)
        return -1;
    int rc = -1;
    for (uint64_t t0 = pcs_now_ms(); rc != 0 && pcs_now_ms() - t0 < 15000;) {
        Pcs__V1__GetStatusRequest req = PCS__V1__GET_STATUS_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        if (pcs_rpc_call(cl, PCS_M_GET_STATUS, &req.base, &pcs__v1__get_status_response__descriptor,
                         1000, &resp, NULL) == PCS_OK) {
            protobuf_c_message_free_unpacked(resp, NULL);
            rc = 0;
        } else {
            pcs_test_sleep_ms(50);
        }
    }
    pcs_rpc_client_destroy(cl);
    if (rc != 0)
        fprintf(stderr, "e2e: coordinator on %s does not answer (log %s)\n", listen, log);
    return rc;
}

Pcs__V1__JobSpec *e2e_parse_spec(const char *yaml)
{
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &m) != PCS_OK) {
        fprintf(stderr, "e2e: job spec does not parse: %s\n", pcs_last_error());
        return NULL;
    }
    return (Pcs__V1__JobSpec *)m;
}

static void set_ckpt_dir(Pcs__V1__JobSpec *spec, const char *dir)
{
    if (!spec->checkpoint) {
        spec->checkpoint = malloc(sizeof *spec->checkpoint);
        pcs__v1__checkpoint_spec__init(spec->checkpoint);
    } else if (spec->checkpoint->dir && spec->checkpoint->dir != protobuf_c_empty_string) {
        free(spec->checkpoint->dir);
    }
    spec->checkpoint->dir = strdup(dir);
}

int e2e_submit(e2e_cluster_t *c, const char *yaml, const char *tag, e2e_job_t *job)
{
    memset(job, 0, sizeof *job);
    Pcs__V1__JobSpec *spec = e2e_parse_spec(yaml);
    if (!spec)
        return -1;
    char ckpt[1100];
    if (spec->checkpoint && spec->checkpoint->dir && spec->checkpoint->dir[0]) {
        /* the job names its own (relative: beneath the workers' root, the cluster dir) */
        if (spec->checkpoint->dir[0] == '/')
            snprintf(ckpt, sizeof ckpt, "%s", spec->checkpoint->dir);
        else
            snprintf(ckpt, sizeof ckpt, "%s/%s", c->dir, spec->checkpoint->dir);
    } else {
        snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", c->dir, tag);
        set_ckpt_dir(spec, ckpt);
    }
    job->world = 1;
    for (size_t i = 0; i < spec->n_mesh; i++)
        job->world *= (int)spec->mesh[i]->size;
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK) {
        protobuf_c_message_free_unpacked(&spec->base, NULL);
        return -1;
    }
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    char rid[64];
    snprintf(rid, sizeof rid, "e2e-%s-%d", tag, (int)getpid());
    req.request_id = rid;
    req.spec = spec;
    ProtobufCMessage *resp = NULL;
    pcs_status_t st = pcs_rpc_call(cl, PCS_M_SUBMIT_JOB, &req.base,
                                   &pcs__v1__submit_job_response__descriptor, 10000, &resp, NULL);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    if (st != PCS_OK) {
        fprintf(stderr, "e2e: SubmitJob failed: %s\n", pcs_last_error());
        pcs_rpc_client_destroy(cl);
        return -1;
    }
    Pcs__V1__SubmitJobResponse *r = (Pcs__V1__SubmitJobResponse *)resp;
    snprintf(job->job_id, sizeof job->job_id, "%s", r->job && r->job->job_id ? r->job->job_id : "");
    protobuf_c_message_free_unpacked(resp, NULL);
    pcs_rpc_client_destroy(cl);
    snprintf(job->export_path, sizeof job->export_path, "%.1000s", ckpt);
    return job->job_id[0] ? 0 : -1;
}

int e2e_load_reports(e2e_cluster_t *c, e2e_job_t *job)
{
    for (int r = 0; r < job->world && r < E2E_MAX_RANKS; r++) {
        for (size_t i = 0; i < job->n_reports[r]; i++)
            pcs__v1__step_report__free_unpacked(job->reports[r][i], NULL);
        job->n_reports[r] = 0;
        char path[1100];
        pcs_report_file_path(c->dir, job->job_id, (uint32_t)r, path, sizeof path);
        long off = 0;
        Pcs__V1__StepReport *rep = NULL;
        while (pcs_report_file_next(path, &off, &rep)) {
            if (job->n_reports[r] == E2E_MAX_STEPS + 2) {
                /* keep the latest reports (a long job's last one carries done/error) */
                pcs__v1__step_report__free_unpacked(job->reports[r][0], NULL);
                memmove(&job->reports[r][0], &job->reports[r][1],
                        (E2E_MAX_STEPS + 1) * sizeof job->reports[r][0]);
                job->n_reports[r]--;
            }
            job->reports[r][job->n_reports[r]++] = rep;
        }
    }
    return 0;
}

int e2e_wait_job(e2e_cluster_t *c, e2e_job_t *job, int timeout_ms)
{
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK)
        return -1;
    uint64_t t0 = pcs_now_ms();
    int rc = -1;
    while (pcs_now_ms() - t0 < (uint64_t)timeout_ms) {
        Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
        req.job_id = job->job_id;
        ProtobufCMessage *resp = NULL;
        if (pcs_rpc_call(cl, PCS_M_GET_JOB, &req.base, &pcs__v1__get_job_response__descriptor, 5000,
                         &resp, NULL) == PCS_OK) {
            Pcs__V1__GetJobResponse *r = (Pcs__V1__GetJobResponse *)resp;
            int state = r->job ? (int)r->job->state : 0;
            if (state == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
                state == PCS__V1__JOB_STATE__JOB_STATE_FAILED ||
                state == PCS__V1__JOB_STATE__JOB_STATE_CANCELLED) {
                job->state = state;
                snprintf(job->reason, sizeof job->reason, "%s",
                         r->job->reason ? r->job->reason : "");
                rc = 0;
            }
            protobuf_c_message_free_unpacked(resp, NULL);
            if (rc == 0)
                break;
        }
        pcs_test_sleep_ms(100);
    }
    pcs_rpc_client_destroy(cl);
    job->wall_s = (double)(pcs_now_ms() - t0) / 1000.0;
    if (rc != 0) {
        fprintf(stderr, "e2e: job %s did not finish within %d ms (logs in %s)\n", job->job_id,
                timeout_ms, c->dir);
        return -1;
    }
    /* Workers exit after their one job (--max-jobs 1): wait for them so report files are
     * complete. */
    for (int i = 0; i < c->n_workers; i++) {
        if (c->workers[i] > 0 && pcs_test_wait(c->workers[i], 10000) != -1)
            c->workers[i] = -1;
    }
    e2e_load_reports(c, job);
    if (job->state == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED) {
        char ckpt[1200]; /* the job's own directory in its checkpoint.dir */
        snprintf(ckpt, sizeof ckpt, "%.1000s/%.100s", job->export_path, job->job_id);
        snprintf(job->export_path, sizeof job->export_path, "%.1100s/final.safetensors", ckpt);
        if (pcs_ckpt_export(ckpt, 0, job->export_path, NULL) != PCS_OK) {
            fprintf(stderr, "e2e: export failed: %s\n", pcs_last_error());
            job->export_path[0] = 0;
        }
    }
    return 0;
}

int e2e_run_job(e2e_cluster_t *c, const char *yaml, const char *tag, int timeout_ms, e2e_job_t *job)
{
    if (e2e_submit(c, yaml, tag, job) != 0)
        return -1;
    return e2e_wait_job(c, job, timeout_ms);
}

int e2e_job_state(e2e_cluster_t *c, const char *job_id, char *reason, size_t n)
{
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK)
        return 0;
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    ProtobufCMessage *resp = NULL;
    int state = 0;
    if (pcs_rpc_call(cl, PCS_M_GET_JOB, &req.base, &pcs__v1__get_job_response__descriptor, 5000,
                     &resp, NULL) == PCS_OK) {
        Pcs__V1__GetJobResponse *r = (Pcs__V1__GetJobResponse *)resp;
        state = r->job ? (int)r->job->state : 0;
        if (reason)
            snprintf(reason, n, "%s", r->job && r->job->reason ? r->job->reason : "");
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    pcs_rpc_client_destroy(cl);
    return state;
}

/* ListWorkers: count those in `state` (> 0), or the state of the one with `pid` (state 0). */
static int list_workers(e2e_cluster_t *c, int state, pid_t pid)
{
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK)
        return -1;
    Pcs__V1__ListWorkersRequest req = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int n = -1;
    if (pcs_rpc_call(cl, PCS_M_LIST_WORKERS, &req.base, &pcs__v1__list_workers_response__descriptor,
                     5000, &resp, NULL) == PCS_OK) {
        Pcs__V1__ListWorkersResponse *r = (Pcs__V1__ListWorkersResponse *)resp;
        n = 0;
        for (size_t i = 0; i < r->n_workers; i++) {
            if (state > 0)
                n += (int)r->workers[i]->state == state;
            else if ((pid_t)r->workers[i]->pid == pid)
                n = (int)r->workers[i]->state;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    pcs_rpc_client_destroy(cl);
    return n;
}

int e2e_workers_in(e2e_cluster_t *c, int state)
{
    return list_workers(c, state, 0);
}

int e2e_worker_state_of_pid(e2e_cluster_t *c, pid_t pid)
{
    return list_workers(c, 0, pid);
}

pid_t e2e_worker_pid(e2e_cluster_t *c, const char *job_id, uint32_t rank)
{
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(c->addr, &cl) != PCS_OK)
        return -1;
    Pcs__V1__ListWorkersRequest req = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    pid_t pid = -1;
    if (pcs_rpc_call(cl, PCS_M_LIST_WORKERS, &req.base, &pcs__v1__list_workers_response__descriptor,
                     5000, &resp, NULL) == PCS_OK) {
        Pcs__V1__ListWorkersResponse *r = (Pcs__V1__ListWorkersResponse *)resp;
        for (size_t i = 0; i < r->n_workers; i++)
            if (r->workers[i]->job_id && strcmp(r->workers[i]->job_id, job_id) == 0 &&
                r->workers[i]->rank == rank)
                pid = (pid_t)r->workers[i]->pid;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    pcs_rpc_client_destroy(cl);
    return pid;
}

void e2e_job_free(e2e_job_t *job)
{
    for (int r = 0; r < E2E_MAX_RANKS; r++)
        for (size_t i = 0; i < job->n_reports[r]; i++)
            pcs__v1__step_report__free_unpacked(job->reports[r][i], NULL);
    memset(job->n_reports, 0, sizeof job->n_reports);
}

void e2e_stop(e2e_cluster_t *c)
{
    for (int i = 0; i < c->n_workers; i++)
        if (c->workers[i] > 0)
            pcs_test_stop(c->workers[i], 5000);
    if (c->coord > 0)
        pcs_test_stop(c->coord, 5000);
    if (c->dir && !getenv("PCS_TEST_KEEP"))
        pcs_test_rmtree(c->dir);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

int e2e_check_parity(const e2e_job_t *job, const char *yaml, double atol, double rtol,
                     double loss_rtol, double *max_abs)
{
    int fails = 0;
    *max_abs = 0;
    Pcs__V1__JobSpec *spec = e2e_parse_spec(yaml);
    if (!spec)
        return 1;
    Pcs__V1__Plan *plan = NULL;
    pcs_reference_t *ref = NULL;
    pcs_st_file_t *f = NULL;
    float *buf = NULL;
    if (pcs_plan_build(spec, (uint32_t)job->world, &plan) != PCS_OK) {
        fprintf(stderr, "parity: plan: %s\n", pcs_last_error());
        fails++;
        goto out;
    }
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    if (pcs_ref_create(spec, plan, &o, &ref) != PCS_OK || pcs_ref_run(ref) != PCS_OK) {
        fprintf(stderr, "parity: reference: %s\n", pcs_last_error());
        fails++;
        goto out;
    }
    if (pcs_st_open(job->export_path, &f) != PCS_OK) {
        fprintf(stderr, "parity: %s\n", pcs_last_error());
        fails++;
        goto out;
    }
    const pcs_mlp_t *m = pcs_ref_model(ref);
    double worst_rel = 0;
    const char *worst = "";
    for (uint32_t i = 0; i < pcs_mlp_num_params(m); i++) {
        const pcs_named_tensor_t *p = pcs_mlp_param(m, i);
        const pcs_st_tensor_t *t = pcs_st_find(f, p->fqn);
        const float *r = pcs_ref_param(ref, p->fqn);
        if (!t || !r || t->numel != p->numel) {
            fprintf(stderr, "parity: %s missing or wrong size in the export\n", p->fqn);
            fails++;
            continue;
        }
        free(buf);
        buf = malloc(p->numel * sizeof(float));
        if (!buf || pcs_st_read_f32(f, t, 0, p->numel, buf) != PCS_OK) {
            fails++;
            continue;
        }
        for (uint64_t e = 0; e < p->numel; e++) {
            double d = fabs((double)buf[e] - (double)r[e]);
            double lim = atol + rtol * fabs((double)r[e]);
            if (d > *max_abs) {
                *max_abs = d;
                worst = p->fqn;
            }
            if (d / lim > worst_rel)
                worst_rel = d / lim;
            if (!(d <= lim)) {
                if (fails < 5)
                    fprintf(stderr, "parity: %s[%llu] = %.9g, reference %.9g (|d| %.3g > %.3g)\n",
                            p->fqn, (unsigned long long)e, buf[e], r[e], d, lim);
                fails++;
            }
        }
    }
    fprintf(stderr, "parity: max |sharded - reference| = %.3g (%s), worst d/limit %.3f\n", *max_abs,
            worst, worst_rel);
    size_t nl = 0;
    const double *ls = pcs_ref_losses(ref, &nl);
    for (size_t i = 0; i < job->n_reports[0]; i++) {
        const Pcs__V1__StepReport *rep = job->reports[0][i];
        if (!rep->step || rep->step > nl || (rep->error && rep->error[0]))
            continue;
        double rl = ls[rep->step - 1];
        if (!(fabs(rep->loss - rl) <= 1e-5 + loss_rtol * fabs(rl))) {
            fprintf(stderr, "parity: step %llu loss %.9g, reference %.9g\n",
                    (unsigned long long)rep->step, rep->loss, rl);
            fails++;
        }
    }
    /* eval losses (rank 0's report of the step after which the eval ran) */
    {
        const uint64_t *after = NULL;
        size_t ne = 0;
        const double *ev = pcs_ref_eval_losses(ref, &after, &ne);
        size_t seen = 0;
        for (size_t i = 0; i < job->n_reports[0]; i++) {
            const Pcs__V1__StepReport *rep = job->reports[0][i];
            for (size_t k = 0; k < ne; k++) {
                if (after[k] != rep->step)
                    continue;
                seen++;
                if (!(fabs(rep->eval_loss - ev[k]) <= 1e-5 + loss_rtol * fabs(ev[k]))) {
                    fprintf(stderr, "parity: eval after step %llu: %.9g, reference %.9g\n",
                            (unsigned long long)rep->step, rep->eval_loss, ev[k]);
                    fails++;
                }
            }
        }
        if (seen != ne) {
            fprintf(stderr, "parity: %zu evals reported, reference ran %zu\n", seen, ne);
            fails++;
        }
    }
out:
    free(buf);
    pcs_st_close(f);
    pcs_ref_destroy(ref);
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return fails;
}

// ---- local (coordinator-less) runs ----

typedef struct local_ctx {
    FILE *f;
} local_ctx_t;

static void local_report(void *ctx, const Pcs__V1__StepReport *rep)
{
    local_ctx_t *lc = ctx;
    (void)pcs_report_file_append(lc->f, rep);
}

static int local_rank_main(const char *yaml, const char *dir, const char *ckpt, int world, int rank,
                           uint64_t inj_step, uint32_t inj_rank)
{
    Pcs__V1__JobSpec *spec = e2e_parse_spec(yaml);
    if (!spec)
        return 2;
    set_ckpt_dir(spec, ckpt);
    Pcs__V1__Plan *plan = NULL;
    if (pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK) {
        fprintf(stderr, "rank %d: plan: %s\n", rank, pcs_last_error());
        return 2;
    }
    Pcs__V1__MeshCoords coords = PCS__V1__MESH_COORDS__INIT;
    pcs_plan_rank_coords(plan, (uint32_t)rank, &coords);
    Pcs__V1__Assignment as = PCS__V1__ASSIGNMENT__INIT;
    as.job_id = (char *)"local";
    as.generation = 1;
    as.rank = (uint32_t)rank;
    as.world_size = (uint32_t)world;
    as.local_rank = (uint32_t)rank; /* every rank on this host */
    as.local_world_size = (uint32_t)world;
    as.coords = &coords;
    as.spec = spec;
    as.plan = plan;
    as.plan_hash = pcs_plan_hash(plan);
    char kvdir[1100], path[1100];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    pcs_report_file_path(dir, "local", (uint32_t)rank, path, sizeof path);
    local_ctx_t lc = {fopen(path, "wb")};
    if (!lc.f)
        return 2;
    pcs_train_config_t tc;
    memset(&tc, 0, sizeof tc);
    tc.assignment = &as;
    tc.kv = kv;
    tc.coll_timeout_ms = 8000;
    tc.report = local_report;
    tc.report_ctx = &lc;
    tc.inject_inf_step = inj_step;
    tc.inject_inf_rank = inj_rank;
    tc.prefetch = -1;
    /* switches the parent sets for its forked ranks (test_e2e_procs' bit-parity variants) */
    const char *stage = getenv("PCS_RUNTIME_STAGE_HOST");
    tc.stage_host = stage && strcmp(stage, "1") == 0;
    if (pcs_backend_simulate_cuda(pcs_test_simulated_cuda_devices()) != PCS_OK)
        return 2;
    /* this process is the job's worker: it offers the backend the job asks for (a cuda job runs
     * on the simulated device when PCS_SIMULATE_CUDA=1 is inherited) */
    if (spec->backend && spec->backend[0])
        tc.backend = spec->backend;
    pcs_train_t *t = NULL;
    pcs_train_result_t res;
    pcs_status_t st = pcs_train_create(&tc, &t);
    if (st == PCS_OK)
        st = pcs_train_run(t, &res);
    if (st != PCS_OK) {
        Pcs__V1__StepReport er = PCS__V1__STEP_REPORT__INIT;
        char msg[1024];
        snprintf(msg, sizeof msg, "rank %d: %s", rank, pcs_last_error());
        er.error = msg;
        local_report(&lc, &er);
        fprintf(stderr, "%s\n", msg);
    }
    pcs_train_destroy(t);
    pcs_kv_destroy(kv);
    fclose(lc.f);
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return st == PCS_OK ? 0 : 1;
}

/* A forked rank's fault: the stack into its log (module+offset; addr2line -e <binary> resolves
 * it: a host access to simulated device memory shows where), then die by the signal. */
static void rank_fault(int sig)
{
    void *bt[48];
    int n = backtrace(bt, 48);
    static const char head[] = "rank fault, stack:\n";
    ssize_t w = write(2, head, sizeof head - 1);
    (void)w;
    backtrace_symbols_fd(bt, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

int e2e_run_local(const char *yaml, const char *tag, int world, uint64_t inject_inf_step,
                  uint32_t inject_inf_rank, e2e_job_t *job, char **dir_out)
{
    memset(job, 0, sizeof *job);
    char *dir = pcs_test_tmpdir(tag);
    *dir_out = dir;
    char ckpt[1200];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(job->job_id, sizeof job->job_id, "local");
    job->world = world;
    pid_t pids[E2E_MAX_RANKS];
    uint64_t t0 = pcs_now_ms();
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            /* a rank that faults dies like a worker process would: not through the test
             * runner's (cmocka's) fault handlers, which would run the rest of the suite here */
            void *warm[1];
            (void)backtrace(warm, 1); /* loads the unwinder now, not inside the handler */
            signal(SIGSEGV, rank_fault);
            signal(SIGBUS, rank_fault);
            signal(SIGILL, rank_fault);
            signal(SIGFPE, rank_fault);
            char log[1100];
            snprintf(log, sizeof log, "%s/rank%d.log", dir, r);
            FILE *lf = freopen(log, "w", stderr);
            (void)lf;
            _exit(local_rank_main(yaml, dir, ckpt, world, r, inject_inf_step, inject_inf_rank));
        }
    }
    int ok = 1;
    char died[256] = "";
    for (int r = 0; r < world; r++) {
        int ws = pcs_test_wait(pids[r], 120000);
        if (ws == -1) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
            ok = 0;
        } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            ok = 0;
            if (WIFSIGNALED(ws) && !died[0])
                snprintf(died, sizeof died, "rank %d killed by signal %d (%s)", r, WTERMSIG(ws),
                         strsignal(WTERMSIG(ws)));
            else if (WIFEXITED(ws) && !died[0]) /* e.g. a sanitizer's exit: see its log */
                snprintf(died, sizeof died, "rank %d exited with status %d", r, WEXITSTATUS(ws));
        }
    }
    job->wall_s = (double)(pcs_now_ms() - t0) / 1000.0;
    e2e_cluster_t c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    e2e_load_reports(&c, job);
    job->state =
        ok ? PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED : PCS__V1__JOB_STATE__JOB_STATE_FAILED;
    for (int r = 0; r < world && !job->reason[0]; r++)
        for (size_t i = 0; i < job->n_reports[r]; i++)
            if (job->reports[r][i]->error && job->reports[r][i]->error[0]) {
                snprintf(job->reason, sizeof job->reason, "%s", job->reports[r][i]->error);
                break;
            }
    if (!job->reason[0] && died[0])
        snprintf(job->reason, sizeof job->reason, "%s", died);
    if (ok) {
        strncat(ckpt, "/local", sizeof ckpt - strlen(ckpt) - 1); /* the job's own directory */
        snprintf(job->export_path, sizeof job->export_path, "%.1100s/final.safetensors", ckpt);
        if (pcs_ckpt_export(ckpt, 0, job->export_path, NULL) != PCS_OK) {
            fprintf(stderr, "e2e: export failed: %s\n", pcs_last_error());
            job->export_path[0] = 0;
        }
    }
    return 0;
}

void e2e_assert_same_bits(const char *a_path, const char *b_path, const char *what)
{
    pcs_st_file_t *a = NULL, *b = NULL;
    assert_int_equal(pcs_st_open(a_path, &a), PCS_OK);
    assert_int_equal(pcs_st_open(b_path, &b), PCS_OK);
    assert_int_equal(pcs_st_count(a), pcs_st_count(b));
    for (size_t i = 0; i < pcs_st_count(a); i++) {
        const pcs_st_tensor_t *ta = pcs_st_tensor(a, i), *tb = pcs_st_find(b, ta->name);
        assert_non_null(tb);
        uint64_t n = ta->end - ta->begin;
        assert_int_equal(n, tb->end - tb->begin);
        uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
        assert_int_equal(pcs_st_read_raw(a, ta, 0, n, x), PCS_OK);
        assert_int_equal(pcs_st_read_raw(b, tb, 0, n, y), PCS_OK);
        if (memcmp(x, y, n) != 0)
            fail_msg("%s: %s differs from the reference run's", what, ta->name);
        free(x);
        free(y);
    }
    pcs_st_close(a);
    pcs_st_close(b);
}

int e2e_check_memory_promise(const e2e_job_t *job, const char *yaml, double floor)
{
    Pcs__V1__JobSpec *spec = e2e_parse_spec(yaml);
    Pcs__V1__Plan *plan = NULL;
    assert_int_equal(pcs_plan_build(spec, (uint32_t)job->world, &plan), PCS_OK);
    int bad = 0;
    for (int r = 0; r < job->world; r++) {
        Pcs__V1__RankEstimate e;
        assert_int_equal(pcs_plan_rank_estimate(plan, (uint32_t)r, &e), PCS_OK);
        uint64_t promise = e.total_bytes - e.buffer_bytes, most = 0;
        for (size_t i = 0; i < job->n_reports[r]; i++) {
            uint64_t m = job->reports[r][i]->runtime_memory_peak_bytes;
            most = m > most ? m : most;
            if (m > promise) {
                fprintf(stderr, "rank %d step %llu: runtime memory %llu B > the plan's %llu B\n",
                        r, (unsigned long long)job->reports[r][i]->step, (unsigned long long)m,
                        (unsigned long long)promise);
                bad++;
            }
        }
        fprintf(stderr, "rank %d: runtime memory peak %llu B = %.3f x the plan's estimate\n", r,
                (unsigned long long)most, promise ? (double)most / (double)promise : 0.0);
        if ((double)most < floor * (double)promise) {
            fprintf(stderr, "rank %d: peak %llu B is below %.2f x the estimate %llu B\n", r,
                    (unsigned long long)most, floor, (unsigned long long)promise);
            bad++;
        }
    }
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return bad;
}
