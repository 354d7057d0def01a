/* Bounded coordinator memory (issue 11, item 5), on a real pcs-coordinator with a SQLite state
 * file:
 * - a spec above max-spec-bytes is RESOURCE_EXHAUSTED naming its size and the limit;
 * - a long submit/cancel churn of large specs leaves the coordinator's RSS flat: a finished job's
 *   spec leaves RAM once committed (GetJob and GetPlan read it back from the store, unchanged),
 *   and the history keeps only the newest max-finished-jobs finished jobs: an older one is NOT_FOUND
 *   "finished and forgotten", its row is gone after a restart too, and its id is never reused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "test_util.h"

#define CALL_MS 10000

/* ASan keeps freed memory in quarantine and never hands it back: RSS says nothing there. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#else
#define RSS_MEANINGFUL 1
#endif

static const char k_spec[] = "name: big\n"
                             "model:\n"
                             "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                             "mesh:\n"
                             "  - {dim: dp_shard, size: 2}\n"
                             "training: {steps: 2, micro_batch_size: 2,"
                             " optimizer: {sgd: {lr: 0.1}}}\n"
                             "data: {synthetic: {seed: 1}}\n";

/* The base spec with a wrap policy listing `n` module classes of 40 characters: about 42 n bytes
 * packed (the classes need not exist in the model). */
static Pcs__V1__JobSpec *big_spec(size_t n)
{
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_pb_from_yaml(k_spec, strlen(k_spec), &pcs__v1__job_spec__descriptor, &m),
                     PCS_OK);
    Pcs__V1__JobSpec *spec = (Pcs__V1__JobSpec *)m;
    Pcs__V1__WrapSpec *w = malloc(sizeof *w);
    Pcs__V1__ModuleClassWrap *mc = malloc(sizeof *mc);
    pcs__v1__wrap_spec__init(w);
    pcs__v1__module_class_wrap__init(mc);
    mc->n_classes = n;
    mc->classes = calloc(n, sizeof *mc->classes);
    for (size_t i = 0; i < n; i++) {
        mc->classes[i] = malloc(48); /* 40 characters: 26 + 14 digits (i < 10^14) */
        snprintf(mc->classes[i], 48, "GeneratedModuleClassNumber%014zu", i % 100000000000000u);
    }
    w->policy_case = PCS__V1__WRAP_SPEC__POLICY_MODULE_CLASS;
    w->module_class = mc;
    if (spec->wrap)
        pcs__v1__wrap_spec__free_unpacked(spec->wrap, NULL);
    spec->wrap = w;
    return spec;
}

static int call(pcs_rpc_client_t *c, const char *method, const void *req,
                const ProtobufCMessageDescriptor *d, void *resp)
{
    int code = -1;
    pcs_status_t st = pcs_rpc_call(c, method, req, d, CALL_MS, (ProtobufCMessage **)resp, &code);
    return st == PCS_OK ? 0 : (code > 0 ? code : 14);
}

static int submit(pcs_rpc_client_t *c, Pcs__V1__JobSpec *spec, const char *rid, char *job_id)
{
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.spec = spec;
    req.request_id = (char *)rid;
    Pcs__V1__SubmitJobResponse *resp = NULL;
    int code = call(c, PCS_M_SUBMIT_JOB, &req, &pcs__v1__submit_job_response__descriptor, &resp);
    if (code == 0) {
        snprintf(job_id, 24, "%s", resp->job->job_id);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return code;
}

static void cancel(pcs_rpc_client_t *c, const char *job_id)
{
    Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    Pcs__V1__CancelJobResponse *resp = NULL;
    assert_int_equal(call(c, PCS_M_CANCEL_JOB, &req, &pcs__v1__cancel_job_response__descriptor,
                          &resp),
                     0);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* GetJob: 0 with *out (caller frees), or the gRPC code. */
static int get_job(pcs_rpc_client_t *c, const char *job_id, Pcs__V1__GetJobResponse **out)
{
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    return call(c, PCS_M_GET_JOB, &req, &pcs__v1__get_job_response__descriptor, out);
}

static long rss_kib(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    char *s = pcs_test_read_file(path, NULL);
    assert_non_null(s);
    const char *p = strstr(s, "VmRSS:");
    long kib = p ? strtol(p + 6, NULL, 10) : -1;
    free(s);
    return kib;
}

typedef struct coord {
    char *dir, db[1100], addr[64];
    pid_t pid;
    pcs_rpc_client_t *cli;
} coord_t;

static void start(coord_t *k)
{
    const char *args[] = {"--db", k->db, "--max-finished-jobs", "40", NULL};
    k->pid = pcs_test_start_coordinator(k->dir, args, k->addr, sizeof k->addr);
    assert_true(k->pid > 0);
    assert_int_equal(pcs_rpc_client_create(k->addr, &k->cli), PCS_OK);
}

static void stop(coord_t *k)
{
    pcs_rpc_client_destroy(k->cli);
    k->cli = NULL;
    int status = pcs_test_stop(k->pid, 5000);
    assert_true(WIFEXITED(status)); /* SIGTERM: a clean exit 0 (under ASan: no leak either) */
    assert_int_equal(WEXITSTATUS(status), 0);
    k->pid = -1;
}

static void test_a_spec_over_the_limit_is_resource_exhausted(void **state)
{
    (void)state;
    coord_t k = {.dir = pcs_test_tmpdir("memory")};
    snprintf(k.db, sizeof k.db, "%s/state.db", k.dir);
    start(&k);
    Pcs__V1__JobSpec *spec = big_spec(30000); /* ~1.2 MiB: over the 1 MiB default */
    size_t bytes = pcs__v1__job_spec__get_packed_size(spec);
    assert_true(bytes > (1u << 20));
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.spec = spec;
    ProtobufCMessage *resp = NULL;
    int code = 0;
    assert_int_equal(pcs_rpc_call(k.cli, PCS_M_SUBMIT_JOB, &req.base,
                                  &pcs__v1__submit_job_response__descriptor, CALL_MS, &resp, &code),
                     PCS_ERR_LIMIT);
    assert_int_equal(code, 8); /* RESOURCE_EXHAUSTED */
    char want[128];
    snprintf(want, sizeof want, "spec: %zu bytes exceeds max-spec-bytes (1048576)", bytes);
    assert_non_null(strstr(pcs_last_error(), want));
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    stop(&k);
    pcs_test_rmtree(k.dir);
    free(k.dir);
}

static void test_submit_cancel_churn_keeps_rss_flat_and_history_bounded(void **state)
{
    (void)state;
    coord_t k = {.dir = pcs_test_tmpdir("memory")};
    snprintf(k.db, sizeof k.db, "%s/state.db", k.dir);
    start(&k);
    Pcs__V1__JobSpec *spec = big_spec(12000); /* ~500 KiB packed, several times that unpacked */
    const int rounds = 300;
    long rss_warm = 0;
    char first[24] = "", id[24] = "";
    for (int i = 0; i < rounds; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "churn-%d", i);
        assert_int_equal(submit(k.cli, spec, rid, id), 0);
        if (i == 0)
            snprintf(first, sizeof first, "%s", id);
        cancel(k.cli, id);
        if (i == 0)
            rss_warm = rss_kib(k.pid);
    }
    long rss_end = rss_kib(k.pid);
    fprintf(stderr, "coordinator RSS: %ld KiB after one job, %ld KiB after %d (%zu-byte specs)\n",
            rss_warm, rss_end, rounds, pcs__v1__job_spec__get_packed_size(spec));
    /* the history keeps 40 finished jobs: with their ~0.5 MiB specs (several times that
     * unpacked) in RAM, that alone would add > 30 MiB; all 300 would add > 200 MiB */
    if (RSS_MEANINGFUL)
        assert_true(rss_end - rss_warm < 16 * 1024);

    /* the newest finished job: its spec comes back from the store, unchanged */
    Pcs__V1__GetJobResponse *g = NULL;
    assert_int_equal(get_job(k.cli, id, &g), 0);
    assert_int_equal(g->job->state, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
    assert_non_null(g->job->spec);
    assert_non_null(g->job->spec->wrap);
    assert_int_equal(g->job->spec->wrap->module_class->n_classes, 12000);
    assert_string_equal(g->job->spec->wrap->module_class->classes[11999],
                        spec->wrap->module_class->classes[11999]);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    Pcs__V1__GetPlanRequest pr = PCS__V1__GET_PLAN_REQUEST__INIT;
    pr.job_id = id;
    Pcs__V1__GetPlanResponse *plan = NULL;
    assert_int_equal(call(k.cli, PCS_M_GET_PLAN, &pr, &pcs__v1__get_plan_response__descriptor,
                          &plan),
                     0);
    assert_int_equal(plan->plan->world_size, 2);
    protobuf_c_message_free_unpacked(&plan->base, NULL);

    /* the oldest is forgotten: NOT_FOUND saying so; its request id makes a new job */
    assert_int_equal(get_job(k.cli, first, &g), 5);
    assert_non_null(strstr(pcs_last_error(), "finished and forgotten"));
    char again[24];
    assert_int_equal(submit(k.cli, spec, "churn-0", again), 0);
    char want[24];
    snprintf(want, sizeof want, "job-%d", rounds + 1); /* ids are never reused */
    assert_string_equal(again, want);

    /* after a restart: the same bounded history, the forgotten rows are gone from the file */
    stop(&k);
    start(&k);
    Pcs__V1__ListJobsRequest lr = PCS__V1__LIST_JOBS_REQUEST__INIT;
    Pcs__V1__ListJobsResponse *list = NULL;
    assert_int_equal(call(k.cli, PCS_M_LIST_JOBS, &lr, &pcs__v1__list_jobs_response__descriptor,
                          &list),
                     0);
    assert_int_equal(list->n_jobs, 41); /* 40 finished + the pending resubmit */
    protobuf_c_message_free_unpacked(&list->base, NULL);
    assert_int_equal(get_job(k.cli, first, &g), 5);
    assert_int_equal(get_job(k.cli, id, &g), 0);
    assert_int_equal(g->job->spec->wrap->module_class->n_classes, 12000);
    protobuf_c_message_free_unpacked(&g->base, NULL);
    fprintf(stderr, "coordinator RSS after a restart on that history: %ld KiB\n", rss_kib(k.pid));
    if (RSS_MEANINGFUL)
        assert_true(rss_kib(k.pid) < rss_warm + 16 * 1024);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    stop(&k);
    pcs_test_rmtree(k.dir);
    free(k.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_spec_over_the_limit_is_resource_exhausted),
        cmocka_unit_test(test_submit_cancel_churn_keeps_rss_flat_and_history_bounded),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}
