/* A clean worker life cycle (issue 11, item 3) with a real pcs-coordinator and real pcs-worker
 * processes on 127.0.0.1:
 * - SIGTERM to idle workers (every rollout and scale-down): they deregister and never come back
 *   as phantom IDLE workers, so a job submitted right after is not gang-started on them;
 * - a worker SIGKILLed mid-job: the survivor's report fails the job with a reason that leads
 *   with the dead rank ("rank 1 (worker w-2) died; reported by rank 0 ..."), the operator's
 *   progress still shows the last real step, and the next job runs on the survivor and a spare,
 *   never on the dead worker (one crash costs one job, not two);
 * - a SIGSTOPped worker (a peer finds it silent) is not scheduled while it is stopped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define IDLE     PCS__V1__WORKER_STATE__WORKER_STATE_IDLE
#define ASSIGNED PCS__V1__WORKER_STATE__WORKER_STATE_ASSIGNED
#define GONE     PCS__V1__WORKER_STATE__WORKER_STATE_GONE
#define LOST     PCS__V1__WORKER_STATE__WORKER_STATE_LOST
#define STOPPING PCS__V1__WORKER_STATE__WORKER_STATE_STOPPING
#define RUNNING  PCS__V1__JOB_STATE__JOB_STATE_RUNNING
#define PENDING  PCS__V1__JOB_STATE__JOB_STATE_PENDING

static const char k_job_fmt[] = "name: %s\n"
                                "model:\n"
                                "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                                "mesh:\n"
                                "  - {dim: dp_shard, size: %d}\n"
                                "training: {steps: %d, micro_batch_size: 4,"
                                " optimizer: {sgd: {lr: 0.01}}}\n"
                                "data: {synthetic: {seed: 3}}\n";

static e2e_cluster_t g_cl;

static int setup(void **state)
{
    (void)state;
    memset(&g_cl, 0, sizeof g_cl);
    g_cl.dir = pcs_test_tmpdir("lifecycle");
    int port = e2e_free_port();
    /* a lease long enough that nothing here is decided by a lease running out too early */
    const char *const args[] = {"--lease-ms", "10000", NULL};
    return port > 0 ? e2e_start_coord_at(&g_cl, port, args) : -1;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < g_cl.n_workers; i++)
        if (g_cl.workers[i] > 0)
            kill(g_cl.workers[i], SIGCONT);
    e2e_stop(&g_cl);
    return 0;
}

static void wait_workers(int state, int n)
{
    for (int i = 0; i < 200 && e2e_workers_in(&g_cl, state) != n; i++)
        pcs_test_sleep_ms(50);
    assert_int_equal(e2e_workers_in(&g_cl, state), n);
}

static void submit(const char *name, int world, int steps, e2e_job_t *job)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, k_job_fmt, name, world, steps);
    assert_int_equal(e2e_submit(&g_cl, yaml, name, job), 0);
}

static int wait_end(e2e_job_t *job, char *reason, size_t n)
{
    for (uint64_t t0 = pcs_now_ms(); pcs_now_ms() - t0 < 60000; pcs_test_sleep_ms(100)) {
        int s = e2e_job_state(&g_cl, job->job_id, reason, n);
        if (s != RUNNING && s != PENDING && s != 0)
            return s;
    }
    return 0;
}

/* The index in g_cl.workers of the process with this pid. */
static int slot_of(pid_t pid)
{
    for (int i = 0; i < g_cl.n_workers; i++)
        if (g_cl.workers[i] == pid)
            return i;
    fail_msg("pid %d is not one of the test's workers", (int)pid);
    return -1;
}

static void test_sigterm_of_idle_workers_leaves_no_phantom(void **state)
{
    (void)state;
    const char *const serve[] = {"--max-jobs", "0", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 4, serve), 0);
    wait_workers(IDLE, 4);
    for (int i = 0; i < 2; i++)
        kill(g_cl.workers[i], SIGTERM);
    for (int i = 0; i < 2; i++) {
        int st = pcs_test_wait(g_cl.workers[i], 10000);
        assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        g_cl.workers[i] = -1;
    }
    /* a job that needs three workers, submitted at once: only two live ones exist */
    e2e_job_t big, small;
    submit("three", 3, 5, &big);
    for (int i = 0; i < 30; i++) { /* 3 s, ten heartbeat periods of the workers (300 ms) */
        assert_int_equal(e2e_workers_in(&g_cl, GONE), 2);
        assert_int_equal(e2e_workers_in(&g_cl, IDLE), 2);
        assert_int_equal(e2e_job_state(&g_cl, big.job_id, NULL, 0), PENDING);
        pcs_test_sleep_ms(100);
    }
    /* one that fits runs on the live workers */
    submit("two", 2, 5, &small);
    char reason[512];
    assert_int_equal(wait_end(&small, reason, sizeof reason),
                     PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
    assert_int_equal(e2e_job_state(&g_cl, big.job_id, NULL, 0), PENDING);
    assert_int_equal(e2e_workers_in(&g_cl, GONE), 2);
}

static void test_a_killed_worker_costs_one_job_and_is_named_first(void **state)
{
    (void)state;
    /* --step-pause-ms: job A is still running when its rank 1 is killed */
    const char *const serve[] = {"--max-jobs", "0", "--step-pause-ms", "10", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 3, serve), 0);
    wait_workers(IDLE, 3);
    e2e_job_t a, b;
    memset(&a, 0, sizeof a);
    submit("victim", 2, 100000, &a);
    for (int i = 0; i < 400 && (a.n_reports[0] < 3 || a.n_reports[1] < 3); i++) {
        pcs_test_sleep_ms(50);
        e2e_load_reports(&g_cl, &a);
    }
    assert_true(a.n_reports[0] >= 3 && a.n_reports[1] >= 3);
    pid_t victim = e2e_worker_pid(&g_cl, a.job_id, 1);
    pid_t survivor = e2e_worker_pid(&g_cl, a.job_id, 0);
    assert_true(victim > 0 && survivor > 0);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    g_cl.workers[slot_of(victim)] = -1;
    char reason[1024];
    assert_int_equal(wait_end(&a, reason, sizeof reason), PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    fprintf(stderr, "job %s: %s\n", a.job_id, reason);
    /* the dead rank first, then who saw it */
    assert_true(strncmp(reason, "rank 1 (worker w-", 17) == 0);
    assert_non_null(strstr(reason, ") died; reported by rank 0 (worker w-"));
    /* the operator's view keeps the last real step */
    pcs_rpc_client_t *cl = NULL;
    assert_int_equal(pcs_rpc_client_create(g_cl.addr, &cl), PCS_OK);
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = a.job_id;
    ProtobufCMessage *resp = NULL;
    assert_int_equal(pcs_rpc_call(cl, PCS_M_GET_JOB, &req.base,
                                  &pcs__v1__get_job_response__descriptor, 5000, &resp, NULL),
                     PCS_OK);
    const Pcs__V1__Job *jb = ((Pcs__V1__GetJobResponse *)resp)->job;
    assert_non_null(jb->progress);
    assert_true(jb->progress->step >= 3);
    assert_true(jb->progress->loss > 0);
    assert_true(jb->progress->step_ms > 0);
    assert_true(jb->progress->audit_ok);
    protobuf_c_message_free_unpacked(resp, NULL);
    pcs_rpc_client_destroy(cl);
    /* the dead worker is never scheduled: the next job runs on the survivor and the spare */
    memset(&b, 0, sizeof b);
    submit("next", 2, 20, &b);
    for (int i = 0; i < 600; i++) {
        int s = e2e_job_state(&g_cl, b.job_id, NULL, 0);
        int dead = e2e_worker_state_of_pid(&g_cl, victim);
        assert_true(dead == STOPPING || dead == LOST);
        if (s != RUNNING && s != PENDING)
            break;
        pcs_test_sleep_ms(50);
    }
    assert_int_equal(wait_end(&b, reason, sizeof reason), PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
    e2e_job_free(&a);
}

static void test_a_stopped_worker_is_not_scheduled(void **state)
{
    (void)state;
    const char *const serve[] = {"--max-jobs", "0", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 2, serve), 0);
    wait_workers(IDLE, 2);
    kill(g_cl.workers[1], SIGSTOP);
    /* silent for more than half the lease: not eligible, though not LOST yet */
    pcs_test_sleep_ms(6000);
    assert_int_equal(e2e_worker_state_of_pid(&g_cl, g_cl.workers[1]), IDLE);
    e2e_job_t j;
    submit("wait", 2, 5, &j);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(e2e_job_state(&g_cl, j.job_id, NULL, 0), PENDING);
        pcs_test_sleep_ms(100);
    }
    kill(g_cl.workers[1], SIGCONT); /* back: its next heartbeat makes the gang */
    char reason[512];
    assert_int_equal(wait_end(&j, reason, sizeof reason), PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
}

/* A rank whose process is paused mid-job: its peer waits for it in a collective (whose timeout is
 * long here), so neither reports; the coordinator's progress watchdog fails the job within its
 * limit, naming the paused rank first, before any lease or collective timeout would. */
static void test_the_watchdog_fails_a_stuck_job_naming_the_paused_rank(void **state)
{
    (void)state;
    pcs_test_stop(g_cl.coord, 5000);
    const char *const args[] = {"--lease-ms", "60000", "--step-timeout-min-ms", "3000", NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, e2e_free_port(), args), 0);
    const char *const serve[] = {"--max-jobs",      "0",     "--step-pause-ms", "10",
                                 "--coll-timeout-ms", "120000", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 2, serve), 0);
    wait_workers(IDLE, 2);
    e2e_job_t a;
    memset(&a, 0, sizeof a);
    submit("stuck", 2, 100000, &a);
    for (int i = 0; i < 400 && (a.n_reports[0] < 3 || a.n_reports[1] < 3); i++) {
        pcs_test_sleep_ms(50);
        e2e_load_reports(&g_cl, &a);
    }
    assert_true(a.n_reports[0] >= 3 && a.n_reports[1] >= 3);
    pid_t paused = e2e_worker_pid(&g_cl, a.job_id, 1);
    assert_true(paused > 0);
    kill(paused, SIGSTOP);
    uint64_t t0 = pcs_now_ms();
    char reason[1024];
    int s = wait_end(&a, reason, sizeof reason);
    double took = (double)(pcs_now_ms() - t0) / 1e3;
    kill(paused, SIGCONT);
    fprintf(stderr, "after %.1f s: %s\n", took, reason);
    assert_int_equal(s, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    assert_true(strncmp(reason, "no step report for over 3000 ms", 31) == 0);
    assert_non_null(strstr(reason, "from ranks 1 (worker w-"));
    assert_non_null(strstr(reason, ", no heartbeat for "));
    assert_non_null(strstr(reason, "), 0 (worker w-"));
    assert_true(took < 3.0 + 5.0); /* the limit, a watchdog pass, a commit: far below 60 s */
    e2e_job_free(&a);
}

#define FIFO_JOB_HEAD                                                                              \
    "model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"                             \
    "mesh: [{dim: dp_shard, size: 2}]\n"                                                           \
    "training: {steps: 5, micro_batch_size: 4, optimizer: {sgd: {lr: 0.01}}}\n"
#define FIFO_DATA_FMT                                                                              \
    "name: fifo-data\n" FIFO_JOB_HEAD "data: {file: {path: '%s', inputs: x, targets: y}}\n"
#define FIFO_INIT_FMT                                                                              \
    "name: fifo-init\n" FIFO_JOB_HEAD "data: {synthetic: {seed: 3}}\ninit: {from: '%s'}\n"

/* A FIFO (any file whose open blocks) as data.file.path or init.from: the job fails at once with
 * a message naming the field and what the path is; the workers are not wedged, and the next job
 * runs on them. */
static void test_a_fifo_as_a_job_file_fails_the_job_without_wedging_workers(void **state)
{
    (void)state;
    const char *const serve[] = {"--max-jobs", "0", NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 2, serve), 0);
    wait_workers(IDLE, 2);
    char fifo[1100];
    snprintf(fifo, sizeof fifo, "%s/blocks.safetensors", g_cl.dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *field[2] = {"data.file.path", "init.from"};
    for (int k = 0; k < 2; k++) {
        char yaml[1600];
        if (k == 0)
            snprintf(yaml, sizeof yaml, FIFO_DATA_FMT, fifo);
        else
            snprintf(yaml, sizeof yaml, FIFO_INIT_FMT, fifo);
        e2e_job_t j;
        assert_int_equal(e2e_submit(&g_cl, yaml, k ? "fifo-init" : "fifo-data", &j), 0);
        char reason[1024] = "";
        uint64_t t0 = pcs_now_ms();
        int s = 0;
        while (pcs_now_ms() - t0 < 30000) {
            s = e2e_job_state(&g_cl, j.job_id, reason, sizeof reason);
            if (s != RUNNING && s != PENDING && s != 0)
                break;
            pcs_test_sleep_ms(100);
        }
        fprintf(stderr, "%s: %s\n", field[k], reason);
        assert_int_equal(s, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
        assert_non_null(strstr(reason, field[k]));
        assert_non_null(strstr(reason, "not a regular file (a FIFO)"));
    }
    e2e_job_t ok;
    submit("after", 2, 5, &ok);
    char reason[512];
    assert_int_equal(wait_end(&ok, reason, sizeof reason), PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sigterm_of_idle_workers_leaves_no_phantom, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_killed_worker_costs_one_job_and_is_named_first,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_stopped_worker_is_not_scheduled, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_fifo_as_a_job_file_fails_the_job_without_wedging_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_watchdog_fails_a_stuck_job_naming_the_paused_rank,
                                        setup, teardown),
    };
    return cmocka_run_group_tests_name("lifecycle", tests, NULL, NULL);
}
