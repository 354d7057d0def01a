/* Elastic training (issue 13, DESIGN.md §8) with a real pcs-coordinator and real pcs-worker
 * processes on 127.0.0.1: a lost worker costs a restart from the last committed checkpoint, not
 * the job.
 *  - SIGKILL one of 4 ranks mid-run with a spare worker: the job restarts (generation 2) on the
 *    spare from its last checkpoint and SUCCEEDS; its final parameters are bit-identical to an
 *    uninterrupted run of the same job, and the restart is in GetJob's log (cause, step, worlds).
 *    (Checkpoints every 10 steps; ranks are killed just after step 12: every restart resumes from
 *    step 10.)
 *  - The same without a spare and min_workers 2: after the elastic wait it continues at W = 3 from
 *    the resharded checkpoint, bit-identical to a run that switches world size at the same step
 *    (4 ranks to the checkpoint, then a resume on 3).
 *  - A worker SIGSTOPped: its peers name it silent, the job restarts without it.
 *  - max_restarts exhausted: two kills, a budget of one: FAILED, the reason lists the restart.
 *  - A rank dies inside a checkpoint (a test hook, before the commit): the restart resumes from
 *    the committed one before it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "pcs/clock.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define SUCCEEDED PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED
#define FAILED    PCS__V1__JOB_STATE__JOB_STATE_FAILED

static e2e_cluster_t g_cl;

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < g_cl.n_workers; i++)
        if (g_cl.workers[i] > 0)
            kill(g_cl.workers[i], SIGCONT);
    e2e_stop(&g_cl);
    return 0;
}

/* pipelined jobs (issue 14): the same job on a dp x pp 2 mesh with the 1F1B schedule */
static int g_pp;

static char *job_yaml(int world, int min_workers, int max_restarts, const char *resume_from)
{
    char *y = malloc(2048);
    assert_non_null(y);
    char resume[1300] = "", mesh[160];
    if (resume_from)
        snprintf(resume, sizeof resume, "resume: {from: '%s', step: 10}\n", resume_from);
    if (g_pp)
        snprintf(mesh, sizeof mesh,
                 "  - {dim: dp_shard, size: %d}\n  - {dim: pp, size: 2}\n"
                 "pipeline: {schedule: 1f1b}\n",
                 world / 2);
    else
        snprintf(mesh, sizeof mesh, "  - {dim: dp_shard, size: %d}\n", world);
    snprintf(y, 2048,
             "name: elastic\n"
             "model:\n"
             "  mlp: {input_dim: 8, hidden_dims: [32, 32], output_dim: 4, norm: layernorm}\n"
             "wrap: {module_class: [MLPBlock]}\n"
             "precision: {param_dtype: bf16, reduce_dtype: fp32}\n"
             "mesh:\n%s"
             "training: {steps: %d, micro_batch_size: 4, micro_batches: 2,"
             " optimizer: {adamw: {lr: 0.01}}}\n"
             "data: {synthetic: {seed: 7}}\n"
             "init: {seed: 3}\n"
             "checkpoint: {dir: ckpt, every_steps: 10, keep_last: 5}\n"
             "elastic: {min_workers: %d, max_restarts: %d}\n"
             "%s",
             mesh, 24, min_workers, max_restarts, resume);
    return y;
}


static void start(const char *tag, int workers)
{
    g_pp = 0;
    memset(&g_cl, 0, sizeof g_cl);
    g_cl.dir = pcs_test_tmpdir(tag);
    int port = e2e_free_port();
    assert_true(port > 0);
    static char mport[1100];
    snprintf(mport, sizeof mport, "%s/metrics.port", g_cl.dir);
    const char *const args[] = {"--elastic-wait-ms", "3000", "--lease-ms", "4000",
                                "--heartbeat-interval-ms", "300", "--metrics-listen", "127.0.0.1:0",
                                "--metrics-port-file", mport, NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, port, args), 0);
    static const char *const wargs[] = {"--step-pause-ms", "40", "--coll-timeout-ms", "4000",
                                        NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, workers, wargs), 0);
}

static Pcs__V1__Job *get_job(const char *job_id, Pcs__V1__GetJobResponse **keep)
{
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(g_cl.addr, &c), PCS_OK);
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_rpc_call(c, PCS_M_GET_JOB, &req.base,
                                  &pcs__v1__get_job_response__descriptor, 5000, &m, NULL),
                     PCS_OK);
    pcs_rpc_client_destroy(c);
    *keep = (Pcs__V1__GetJobResponse *)m;
    return (*keep)->job;
}

/* Submit (retrying until the workers registered) and wait until rank 0 reported `step`. */
static void submit_and_reach(const char *yaml, e2e_job_t *job, uint64_t step)
{
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) {
        rc = e2e_submit(&g_cl, yaml, "elastic", job);
        if (rc != 0)
            pcs_test_sleep_ms(100);
    }
    assert_int_equal(rc, 0);
    for (int i = 0; i < 1200; i++) {
        e2e_load_reports(&g_cl, job);
        size_t n = job->n_reports[0];
        if (n && job->reports[0][n - 1]->step >= step)
            return;
        pcs_test_sleep_ms(50);
    }
    fail_msg("job %s never reached step %llu (logs in %s)", job->job_id,
             (unsigned long long)step, g_cl.dir);
}

/* The worker process holding `rank` (by ListWorkers' pid). */
static pid_t holder(const char *job_id, uint32_t rank)
{
    pid_t p = e2e_worker_pid(&g_cl, job_id, rank);
    assert_true(p > 0);
    return p;
}

static void forget_worker(pid_t p)
{
    for (int i = 0; i < g_cl.n_workers; i++)
        if (g_cl.workers[i] == p)
            g_cl.workers[i] = -1;
}

/* SIGKILL the worker holding `rank` and reap it. */
static void kill_rank(const char *job_id, uint32_t rank)
{
    pid_t victim = holder(job_id, rank);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    forget_worker(victim);
}

/* Wait for the job's end, which must be SUCCEEDED. */
static void wait_succeeded(e2e_job_t *job)
{
    assert_int_equal(e2e_wait_job(&g_cl, job, 180000), 0);
    if (job->state != SUCCEEDED)
        fail_msg("job %s: state %d: %s (logs in %s)", job->job_id, job->state, job->reason,
                 g_cl.dir);
}

/* The uninterrupted reference: the same job on `w1` ranks to step 10 (a checkpoint), then, if w2
 * differs, resumed on w2 ranks to the end; the final export. */
static char *reference(int w1, int w2, char **dirs)
{
    e2e_job_t a, b;
    char *y = job_yaml(w1, w1, 0, NULL);
    assert_int_equal(e2e_run_local(y, "elastic-ref", w1, 0, 0, &a, &dirs[0]), 0);
    free(y);
    assert_int_equal(a.state, SUCCEEDED);
    if (w1 == w2) {
        char *out = strdup(a.export_path);
        e2e_job_free(&a);
        dirs[1] = NULL;
        return out;
    }
    char from[1200];
    snprintf(from, sizeof from, "%s/ckpt/local", dirs[0]);
    y = job_yaml(w2, w2, 0, from);
    assert_int_equal(e2e_run_local(y, "elastic-ref2", w2, 0, 0, &b, &dirs[1]), 0);
    free(y);
    assert_int_equal(b.state, SUCCEEDED);
    char *out = strdup(b.export_path);
    e2e_job_free(&a);
    e2e_job_free(&b);
    return out;
}

static void free_reference(char *out, char **dirs)
{
    free(out);
    for (int i = 0; i < 2; i++)
        if (dirs[i]) {
            pcs_test_rmtree(dirs[i]);
            free(dirs[i]);
        }
}


/* The coordinator's /metrics during the running job `job_id` of `world` ranks: every rank's
 * step time and loss from the real job, the straggler view, and an exposition Prometheus's own
 * linter (promtool check metrics) accepts. */
static void check_metrics_of_running_job(const char *job_id, int world)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.port", g_cl.dir);
    char *mp = pcs_test_wait_file(path, 5000);
    assert_non_null(mp);
    int port = atoi(mp);
    free(mp);
    char cmd[1400];
    snprintf(path, sizeof path, "%s/metrics.txt", g_cl.dir);
    snprintf(cmd, sizeof cmd,
             "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && printf \"GET /metrics HTTP/1.0\\r\\n\\r\\n\" >&3 "
             "&& sed \"1,/^\\r$/d\" <&3 > %s'",
             port, path);
    int st = -1;
    char *m = NULL;
    char last[256];
    snprintf(last, sizeof last, "pcs_rank_step_seconds{job_id=\"%s\",rank=\"%d\"} ", job_id,
             world - 1);
    for (int i = 0; i < 40 && !(m && strstr(m, last)); i++) { /* a snapshot every 500 ms */
        free(m);
        pcs_test_sleep_ms(100);
        free(pcs_test_run(cmd, &st));
        assert_int_equal(st, 0);
        m = pcs_test_read_file(path, NULL);
        assert_non_null(m);
    }
    for (int r = 0; r < world; r++) {
        char want[256];
        snprintf(want, sizeof want, "pcs_rank_step_seconds{job_id=\"%s\",rank=\"%d\"} ", job_id, r);
        if (!strstr(m, want))
            fail_msg("no %s in the scrape %s", want, path);
        snprintf(want, sizeof want, "pcs_rank_loss{job_id=\"%s\",rank=\"%d\"} ", job_id, r);
        assert_non_null(strstr(m, want));
    }
    char want[256];
    snprintf(want, sizeof want, "pcs_job_straggler_ratio{job_id=\"%s\"} ", job_id);
    assert_non_null(strstr(m, want));
    snprintf(want, sizeof want, "pcs_jobs{state=\"RUNNING\"} 1\n");
    assert_non_null(strstr(m, want));
    char why[1200];
    if (!pcs_test_exposition_grouped(m, why, sizeof why))
        fail_msg("/metrics does not group its families: %s", why);
    free(m);
    char *lint = NULL;
    if (pcs_test_promtool_check(path, &lint) == 1)
        fail_msg("promtool check metrics:\n%s", lint);
    free(lint);
}

/* A long job on 4 real workers, scraped while it runs (then stopped with the cluster). */
static void test_metrics_during_a_real_job_show_every_rank_and_pass_promtool(void **state)
{
    (void)state;
    start("elastic-metrics", 4);
    char *y = job_yaml(4, 4, 0, NULL);
    char *steps = strstr(y, "steps: 24,");
    assert_non_null(steps);
    memcpy(steps, "steps: 99,", 10); /* 4+ s at 40 ms a step: still running when scraped */
    e2e_job_t job;
    submit_and_reach(y, &job, 3);
    check_metrics_of_running_job(job.job_id, 4);
    e2e_job_free(&job);
    free(y);
}

/* 4 ranks and a spare; the worker of `victim` is killed after step 12: one restart from the
 * checkpoint of step 10, the same world, and the bits of an uninterrupted run. pp: the job is
 * pipelined (dp 2 x pp 2, 1F1B). */
static void killed_rank_with_a_spare(const char *tag, int pp, uint32_t victim)
{
    start(tag, 5);
    g_pp = pp;
    char *y = job_yaml(4, 4, 2, NULL);
    e2e_job_t job;
    submit_and_reach(y, &job, 12);
    uint64_t t0 = pcs_now_ms();
    kill_rank(job.job_id, victim);
    wait_succeeded(&job);
    fprintf(stderr, "elastic: job SUCCEEDED %.1f s after the kill\n",
            (double)(pcs_now_ms() - t0) / 1000.0);
    Pcs__V1__GetJobResponse *keep = NULL;
    Pcs__V1__Job *j = get_job(job.job_id, &keep);
    assert_int_equal(j->restarts, 1);
    assert_int_equal(j->generation, 2);
    assert_int_equal(j->n_restart_log, 1);
    assert_int_equal(j->restart_log[0]->generation, 1);
    assert_int_equal(j->restart_log[0]->world_before, 4);
    assert_int_equal(j->restart_log[0]->world_after, 4);
    assert_true(j->restart_log[0]->step >= 12);
    char cause[64];
    snprintf(cause, sizeof cause, "rank %u (worker", victim);
    if (!strstr(j->restart_log[0]->cause, cause))
        fail_msg("restart cause: %s", j->restart_log[0]->cause);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    char *dirs[2] = {NULL, NULL};
    char *ref = reference(4, 4, dirs);
    e2e_assert_same_bits(job.export_path, ref, job.job_id);
    free_reference(ref, dirs);
    e2e_job_free(&job);
    free(y);
}

static void test_a_killed_rank_with_a_spare_costs_one_restart_and_nothing_else(void **state)
{
    (void)state;
    killed_rank_with_a_spare("elastic-spare", 0, 1);
}

/* A pipelined job loses the rank holding stage 1 of replica 1: each stage's ranks wrote their
 * units into the checkpoint, the restart resumes them. */
static void test_a_killed_pipeline_stage_restarts_and_ends_bit_identical(void **state)
{
    (void)state;
    killed_rank_with_a_spare("elastic-pp", 1, 3);
}

static void test_without_a_spare_the_job_shrinks_to_the_survivors(void **state)
{
    (void)state;
    start("elastic-shrink", 4);
    char *y = job_yaml(4, 2, 2, NULL);
    e2e_job_t job;
    submit_and_reach(y, &job, 12);
    kill_rank(job.job_id, 3);
    wait_succeeded(&job);
    Pcs__V1__GetJobResponse *keep = NULL;
    Pcs__V1__Job *j = get_job(job.job_id, &keep);
    assert_int_equal(j->world_size, 3);
    assert_int_equal(j->restart_log[0]->world_after, 3);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    char *dirs[2] = {NULL, NULL};
    char *ref = reference(4, 3, dirs);
    e2e_assert_same_bits(job.export_path, ref, job.job_id);
    free_reference(ref, dirs);
    e2e_job_free(&job);
    free(y);
}

static void test_a_stopped_rank_is_named_silent_and_left_behind(void **state)
{
    (void)state;
    start("elastic-stop", 5);
    char *y = job_yaml(4, 4, 2, NULL);
    e2e_job_t job;
    submit_and_reach(y, &job, 12);
    pid_t paused = holder(job.job_id, 2);
    kill(paused, SIGSTOP);
    assert_int_equal(e2e_wait_job(&g_cl, &job, 180000), 0);
    kill(paused, SIGCONT);
    if (job.state != SUCCEEDED)
        fail_msg("job %s: state %d: %s (logs in %s)", job.job_id, job.state, job.reason,
                 g_cl.dir);
    Pcs__V1__GetJobResponse *keep = NULL;
    Pcs__V1__Job *j = get_job(job.job_id, &keep);
    assert_int_equal(j->restarts, 1);
    /* named by its peers (silent in a collective) or by its lease, whichever came first */
    if (!strstr(j->restart_log[0]->cause, "rank 2 (worker") &&
        !strstr(j->restart_log[0]->cause, "(rank 2) lost"))
        fail_msg("restart cause: %s", j->restart_log[0]->cause);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    e2e_job_free(&job);
    free(y);
}

static void test_the_restart_budget_is_per_job_and_its_end_fails_the_job(void **state)
{
    (void)state;
    start("elastic-budget", 6);
    char *y = job_yaml(4, 4, 1, NULL);
    e2e_job_t job;
    submit_and_reach(y, &job, 8);
    pid_t v1 = holder(job.job_id, 0);
    kill(v1, SIGKILL);
    waitpid(v1, NULL, 0);
    forget_worker(v1);
    /* wait for generation 2 to run, then kill another rank */
    Pcs__V1__GetJobResponse *keep = NULL;
    for (int i = 0; i < 600; i++) {
        Pcs__V1__Job *j = get_job(job.job_id, &keep);
        int running2 = j->generation == 2 && j->state == PCS__V1__JOB_STATE__JOB_STATE_RUNNING;
        protobuf_c_message_free_unpacked(&keep->base, NULL);
        if (running2)
            break;
        pcs_test_sleep_ms(100);
    }
    /* generation 2 runs (its ranks hold their assignments): kill another rank now, before the
     * short job can end (a fixed wait raced with it on an idle machine) */
    pid_t v2 = -1;
    for (int i = 0; i < 100 && v2 <= 0; i++)
        if ((v2 = e2e_worker_pid(&g_cl, job.job_id, 1)) <= 0)
            pcs_test_sleep_ms(20);
    assert_true(v2 > 0);
    kill(v2, SIGKILL);
    waitpid(v2, NULL, 0);
    forget_worker(v2);
    assert_int_equal(e2e_wait_job(&g_cl, &job, 180000), 0);
    assert_int_equal(job.state, FAILED);
    if (!strstr(job.reason, "after 1 restart (generation 1 at step"))
        fail_msg("reason: %s", job.reason);
    Pcs__V1__Job *j = get_job(job.job_id, &keep);
    assert_int_equal(j->restarts, 1);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    e2e_job_free(&job);
    free(y);
}

/* A rank dies in the middle of a checkpoint (its rank file written, the step not committed): the
 * restart resumes from the checkpoint before, never from the half-written one, and the result is
 * still bit-identical to the uninterrupted run. */
static void test_a_death_during_a_checkpoint_resumes_from_the_one_before(void **state)
{
    (void)state;
    memset(&g_cl, 0, sizeof g_cl);
    g_cl.dir = pcs_test_tmpdir("elastic-ckpt");
    int port = e2e_free_port();
    assert_true(port > 0);
    static const char *const args[] = {"--elastic-wait-ms", "3000", "--lease-ms", "4000",
                                       "--heartbeat-interval-ms", "300", NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, port, args), 0);
    static const char *const wargs[] = {"--step-pause-ms", "20", "--coll-timeout-ms", "4000",
                                        "--die-at-checkpoint", "20", "--die-rank", "2", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 5, wargs), 0);
    char *y = job_yaml(4, 4, 1, NULL);
    e2e_job_t job;
    memset(&job, 0, sizeof job);
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) {
        rc = e2e_submit(&g_cl, y, "elastic", &job);
        if (rc != 0)
            pcs_test_sleep_ms(100);
    }
    assert_int_equal(rc, 0);
    wait_succeeded(&job);
    Pcs__V1__GetJobResponse *keep = NULL;
    Pcs__V1__Job *j = get_job(job.job_id, &keep);
    assert_int_equal(j->restarts, 1);
    assert_true(j->restart_log[0]->step >= 19);
    protobuf_c_message_free_unpacked(&keep->base, NULL);
    /* generation 2 started from step 10: rank 0's report file (rewritten by the run) begins at
     * step 11 */
    assert_true(job.n_reports[0] > 0);
    assert_int_equal(job.reports[0][0]->step, 11);
    char *dirs[2] = {NULL, NULL};
    char *ref = reference(4, 4, dirs);
    e2e_assert_same_bits(job.export_path, ref, job.job_id);
    free_reference(ref, dirs);
    e2e_job_free(&job);
    free(y);
}

/* A pipelined job (dp 2 x pp 2, 1F1B) without a restart budget fails naming the dead stage's
 * rank. */
static void test_a_dead_pipeline_stage_without_restarts_fails_naming_it(void **state)
{
    (void)state;
    start("elastic-pp-dead", 4);
    g_pp = 1;
    char *y = job_yaml(4, 4, 0, NULL);
    e2e_job_t job;
    submit_and_reach(y, &job, 4);
    kill_rank(job.job_id, 1);
    assert_int_equal(e2e_wait_job(&g_cl, &job, 120000), 0);
    assert_int_equal(job.state, FAILED);
    fprintf(stderr, "pipelined job without restarts: %s\n", job.reason);
    if (!strstr(job.reason, "rank 1 (worker"))
        fail_msg("reason: %s", job.reason);
    e2e_job_free(&job);
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_metrics_during_a_real_job_show_every_rank_and_pass_promtool,
                                  teardown),
        cmocka_unit_test_teardown(
            test_a_killed_rank_with_a_spare_costs_one_restart_and_nothing_else, teardown),
        cmocka_unit_test_teardown(test_a_killed_pipeline_stage_restarts_and_ends_bit_identical,
                                  teardown),
        cmocka_unit_test_teardown(test_a_dead_pipeline_stage_without_restarts_fails_naming_it,
                                  teardown),
        cmocka_unit_test_teardown(test_without_a_spare_the_job_shrinks_to_the_survivors,
                                  teardown),
        cmocka_unit_test_teardown(test_a_stopped_rank_is_named_silent_and_left_behind, teardown),
        cmocka_unit_test_teardown(test_the_restart_budget_is_per_job_and_its_end_fails_the_job,
                                  teardown),
        cmocka_unit_test_teardown(test_a_death_during_a_checkpoint_resumes_from_the_one_before,
                                  teardown),
    };
    return cmocka_run_group_tests_name("elastic", tests, NULL, NULL);
}
