/* The C API example (examples/c_api_example.c) as a user runs it: two example processes join a job
 * with an explicit module tree (a Linear "fc") through a real coordinator, compute forward and
 * backward themselves, hand in gradients, and step; the job must succeed, the coordinator must
 * have received every step's report from both ranks with the collectives' dtype audit OK, and
 * each process must see its loss go down and its runtime memory within the plan's estimate (it
 * exits non-zero otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pcs/kernels.h"
#include "pcs/rpc.h"
#include "pcs/worker.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define K_JOB                                                                                      \
    "name: c-api\n"                                                                                \
    "model:\n"                                                                                     \
    "  explicit:\n"                                                                                \
    "    modules:\n"                                                                               \
    "      - {path: '', class: Regressor}\n"                                                       \
    "      - {path: fc, class: Linear, params: [{name: weight, shape: [4, 8]},\n"                  \
    "                                           {name: bias, shape: [4]}]}\n"                      \
    "wrap: {explicit: [fc]}\n"                                                                     \
    "precision: {%s}\n"                                                                            \
    "strategy: full_shard\n"                                                                       \
    "mesh: [{dim: dp_shard, size: 2}]\n"                                                           \
    "training:\n"                                                                                  \
    "  steps: 30\n"                                                                                \
    "  micro_batch_size: 16\n"                                                                     \
    "  micro_batches: 2\n"                                                                         \
    "  optimizer: {adamw: {lr: 2.0e-2}}\n"                                                         \
    "  clip_grad_norm: 5.0\n"

static e2e_cluster_t g_c;
static e2e_job_t g_job;

static int setup(void **state)
{
    (void)state;
    return e2e_start(&g_c, "capi");
}

static int teardown(void **state)
{
    (void)state;
    e2e_job_free(&g_job);
    e2e_stop(&g_c);
    return 0;
}

static void run_example(const char *precision)
{
    char job[2048];
    snprintf(job, sizeof job, K_JOB, precision);
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        char log[1100], ident[64];
        snprintf(log, sizeof log, "%s/example%d.log", g_c.dir, i);
        snprintf(ident, sizeof ident, "capi-%d-%d", (int)getpid(), i);
        const char *argv[] = {pcs_test_bin("pcs-c-api-example"),
                              "--coordinator",
                              g_c.addr,
                              "--identity",
                              ident,
                              NULL};
        pids[i] = pcs_test_spawn((char *const *)argv, log);
        assert_true(pids[i] > 0);
        g_c.workers[g_c.n_workers++] = pids[i];
    }
    assert_int_equal(e2e_submit(&g_c, job, "capi", &g_job), 0);
    /* the examples exit on their own after the job: their exit code is their verdict */
    int codes[2];
    for (int i = 0; i < 2; i++) {
        int ws = pcs_test_wait(pids[i], 60000);
        assert_true(ws != -1);
        g_c.workers[i] = -1;
        codes[i] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128;
        char log[1100];
        snprintf(log, sizeof log, "%s/example%d.log", g_c.dir, i);
        char *txt = pcs_test_read_file(log, NULL);
        fprintf(stderr, "--- example %d (exit %d)\n%s", i, codes[i], txt ? txt : "");
        free(txt);
    }
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(e2e_wait_job(&g_c, &g_job, 20000), 0);
    assert_int_equal(g_job.state, PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);

    /* what the ranks reported: 30 steps each, every collective in the dtype the plan gives */
    pcs_rpc_client_t *cl = NULL;
    assert_int_equal(pcs_rpc_client_create(g_c.addr, &cl), PCS_OK);
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = g_job.job_id;
    ProtobufCMessage *resp = NULL;
    assert_int_equal(pcs_rpc_call(cl, PCS_M_GET_JOB, &req.base,
                                  &pcs__v1__get_job_response__descriptor, 5000, &resp, NULL),
                     PCS_OK);
    const Pcs__V1__GetJobResponse *r = (const Pcs__V1__GetJobResponse *)resp;
    assert_non_null(r->job);
    assert_non_null(r->job->progress);
    assert_int_equal(r->job->progress->step, 30);
    assert_int_equal(r->job->progress->reports, 2 * 30);
    assert_true(r->job->progress->audit_ok);
    assert_true(r->job->progress->loss > 0);
    protobuf_c_message_free_unpacked(resp, NULL);
    pcs_rpc_client_destroy(cl);
}

static void test_c_api_example_trains_an_explicit_model(void **state)
{
    (void)state;
    run_example("param_dtype: fp32");
}

/* bf16 unsharded parameters and gradient buffers (the program converts), fp32 reduce. */
static void test_c_api_example_trains_with_bf16_params(void **state)
{
    (void)state;
    run_example("param_dtype: bf16, reduce_dtype: fp32");
}

/* A program that offers a GPU it does not have (or an unknown backend) learns it from
 * pcs_worker_join at once, before registering, with the reason. */
static void test_join_offering_a_missing_backend_fails_with_the_reason(void **state)
{
    (void)state;
    pcs_worker_options_t o;
    memset(&o, 0, sizeof o);
    o.coordinator = "127.0.0.1:1";
    o.join_timeout_ms = 2000;
    o.backend = "tpu";
    pcs_worker_t *w = NULL;
    assert_int_equal(pcs_worker_join(&o, &w), PCS_ERR_NOT_FOUND);
    assert_null(w);
    assert_non_null(strstr(pcs_last_error(), "unknown kernel backend 'tpu'"));
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get("cuda", &be) == PCS_OK)
        return; /* a machine with a GPU: offering cuda is valid */
    o.backend = "cuda";
    assert_int_equal(pcs_worker_join(&o, &w), PCS_ERR_UNSUPPORTED);
    assert_null(w);
    assert_non_null(strstr(pcs_last_error(), "cuda"));
}

/* A program that ends its job with an error holding bytes that are not UTF-8 (a path or a
 * strerror in another locale): the agent sends the report with those bytes as '?' (the
 * coordinator refuses strings that are not UTF-8) and the job fails with that reason (without
 * the sanitizing the report is refused and no reason arrives). */
static void test_an_error_that_is_not_utf8_fails_the_job_with_the_text_sanitized(void **state)
{
    (void)state;
    const char *yaml = "name: c-api-bad-text\n"
                       "model:\n"
                       "  explicit:\n"
                       "    modules:\n"
                       "      - {path: '', class: Regressor}\n"
                       "      - {path: fc, class: Linear, params: [{name: weight, shape: [4, 8]}]}\n"
                       "wrap: {explicit: [fc]}\n"
                       "mesh: [{dim: dp_shard, size: 1}]\n"
                       "training:\n"
                       "  steps: 3\n"
                       "  micro_batch_size: 4\n"
                       "  optimizer: {sgd: {lr: 0.1}}\n";
    assert_int_equal(e2e_submit(&g_c, yaml, "capi-bad-text", &g_job), 0);
    pcs_worker_options_t o;
    memset(&o, 0, sizeof o);
    o.coordinator = g_c.addr;
    o.join_timeout_ms = 20000;
    pcs_worker_t *w = NULL;
    assert_int_equal(pcs_worker_join(&o, &w), PCS_OK);
    (void)pcs_worker_finish(w, "cannot open /data/caf\xe9.bin");
    pcs_worker_destroy(w);
    assert_int_equal(e2e_wait_job(&g_c, &g_job, 20000), 0);
    assert_int_equal(g_job.state, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    if (!strstr(g_job.reason, "cannot open /data/caf?.bin"))
        fail_msg("reason: %s", g_job.reason);
}

/* A C API program is refused a model.mlp job with no-sync micro-batches, whose plan promises no
 * gradient block for them (pcs-worker writes those gradients into the accumulator; grad_buffer
 * would take one): pcs_worker_join says so and the job fails with that reason. */
static void test_an_mlp_job_with_micro_batches_is_refused_to_a_c_api_program(void **state)
{
    (void)state;
    const char *yaml = "name: c-api-mlp\n"
                       "model: {mlp: {input_dim: 8, hidden_dims: [8], output_dim: 4}}\n"
                       "mesh: [{dim: dp_shard, size: 1}]\n"
                       "training:\n"
                       "  steps: 2\n"
                       "  micro_batch_size: 4\n"
                       "  micro_batches: 2\n"
                       "  optimizer: {sgd: {lr: 0.1}}\n";
    assert_int_equal(e2e_submit(&g_c, yaml, "capi-mlp", &g_job), 0);
    pcs_worker_options_t o;
    memset(&o, 0, sizeof o);
    o.coordinator = g_c.addr;
    o.join_timeout_ms = 20000;
    pcs_worker_t *w = NULL;
    assert_int_equal(pcs_worker_join(&o, &w), PCS_ERR_UNSUPPORTED);
    assert_null(w);
    assert_non_null(strstr(pcs_last_error(), "model.explicit"));
    assert_int_equal(e2e_wait_job(&g_c, &g_job, 20000), 0);
    assert_int_equal(g_job.state, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    if (!strstr(g_job.reason, "pcs-worker's built-in model"))
        fail_msg("reason: %s", g_job.reason);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_offering_a_missing_backend_fails_with_the_reason),
        cmocka_unit_test_setup_teardown(test_c_api_example_trains_an_explicit_model, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_c_api_example_trains_with_bf16_params, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_an_error_that_is_not_utf8_fails_the_job_with_the_text_sanitized, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_an_mlp_job_with_micro_batches_is_refused_to_a_c_api_program, setup, teardown),
    };
    return cmocka_run_group_tests_name("e2e_capi", tests, NULL, NULL);
}
