/* The control plane never fails a healthy job (issue 11, item 2): a real pcs-coordinator with a
 * SQLite state file and four real pcs-worker processes on 127.0.0.1, default lease (10 s) and
 * heartbeat (1 s). While job J trains on two workers the coordinator goes away for 30 s, comes
 * back for 5 s, then goes away for 60 s; job K, started on the other two workers just before the
 * 60 s fault, finishes all its steps during it. Both jobs must SUCCEED, every rank's last report
 * must be its last step with no error and no step run twice, and no worker may be LOST.
 *
 * The fault is either a SIGKILL followed by a restart on the same address and state file
 * (`test_outage restart`: re-adoption, reconnect backoff, late final reports) or SIGSTOP then
 * SIGCONT (`test_outage pause`: the coordinator's own stall must not expire leases whose
 * heartbeats wait unread in its sockets). The workers sleep --step-pause-ms after each step, so
 * J runs for at least its steps x 10 ms whatever the machine's speed: it spans both faults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define STEP_PAUSE_MS 10
#define J_STEPS       11000 /* >= 110 s: past the end of the second fault (~100 s in) */
#define K_STEPS       1500  /* >= 15 s: ends during the 60 s fault it starts just before */

static const char k_job_fmt[] = "name: %s\n"
                                "model:\n"
                                "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                                "mesh:\n"
                                "  - {dim: dp_shard, size: 2}\n"
                                "training: {steps: %d, micro_batch_size: 4,"
                                " optimizer: {sgd: {lr: 0.01}}}\n"
                                "data: {synthetic: {seed: 3}}\n";

typedef enum { FAULT_RESTART, FAULT_PAUSE } fault_t;

static e2e_cluster_t g_cl;
static int g_port;
static const char *const k_coord_args[] = {"--lease-ms", "10000", "--heartbeat-interval-ms",
                                           "1000", NULL};

static int teardown(void **state)
{
    (void)state;
    if (g_cl.coord > 0)
        kill(g_cl.coord, SIGCONT); /* a failed pause test leaves it stopped */
    e2e_stop(&g_cl);
    return 0;
}

static int job_state(const char *job_id, char *reason, size_t n)
{
    return e2e_job_state(&g_cl, job_id, reason, n);
}

static int terminal(int s)
{
    return s == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
           s == PCS__V1__JOB_STATE__JOB_STATE_FAILED ||
           s == PCS__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

static int wait_terminal(const char *job_id, int timeout_ms, char *reason, size_t n)
{
    for (uint64_t t0 = pcs_now_ms(); pcs_now_ms() - t0 < (uint64_t)timeout_ms;
         pcs_test_sleep_ms(200)) {
        int s = job_state(job_id, reason, n);
        if (terminal(s))
            return s;
    }
    return 0;
}

/* The last step each rank wrote to its report file (0 before any). */
static uint64_t last_step(e2e_job_t *job, int rank, int *done)
{
    e2e_load_reports(&g_cl, job);
    size_t k = job->n_reports[rank];
    if (done)
        *done = k && job->reports[rank][k - 1]->done;
    return k ? job->reports[rank][k - 1]->step : 0;
}

static void wait_steps(e2e_job_t *job, uint64_t steps)
{
    for (int i = 0; i < 600 && (last_step(job, 0, NULL) < steps || last_step(job, 1, NULL) < steps);
         i++)
        pcs_test_sleep_ms(50);
    assert_true(last_step(job, 0, NULL) >= steps && last_step(job, 1, NULL) >= steps);
}

static void submit(const char *name, int steps, e2e_job_t *job)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, k_job_fmt, name, steps);
    assert_int_equal(e2e_submit(&g_cl, yaml, name, job), 0);
}

static void fault(fault_t f, int ms, e2e_job_t *running)
{
    uint64_t before = last_step(running, 0, NULL);
    fprintf(stderr, "outage: coordinator %s for %d s (job %s at step %llu)\n",
            f == FAULT_RESTART ? "killed" : "stopped", ms / 1000, running->job_id,
            (unsigned long long)before);
    if (f == FAULT_RESTART) {
        kill(g_cl.coord, SIGKILL);
        waitpid(g_cl.coord, NULL, 0);
        g_cl.coord = -1;
    } else {
        assert_int_equal(kill(g_cl.coord, SIGSTOP), 0);
    }
    pcs_test_sleep_ms(ms);
    /* training never waits on the coordinator */
    assert_true(last_step(running, 0, NULL) > before);
    if (f == FAULT_RESTART)
        assert_int_equal(e2e_start_coord_at(&g_cl, g_port, k_coord_args), 0);
    else
        assert_int_equal(kill(g_cl.coord, SIGCONT), 0);
}

static int workers_in(int state)
{
    return e2e_workers_in(&g_cl, state);
}

static void check_finished(e2e_job_t *job, const char *name, int steps)
{
    char reason[512] = "";
    int s = wait_terminal(job->job_id, 240000, reason, sizeof reason);
    if (s != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("job %s (%s) ended in state %d: %s (logs in %s)", job->job_id, name, s, reason,
                 g_cl.dir);
    char want[64];
    snprintf(want, sizeof want, "all 2 ranks finished at step %d", steps);
    assert_string_equal(reason, want);
    for (int r = 0; r < 2; r++) {
        int done = 0;
        assert_int_equal(last_step(job, r, &done), (uint64_t)steps);
        assert_true(done);
        size_t n = job->n_reports[r];
        for (size_t i = 0; i < n; i++) {
            const Pcs__V1__StepReport *rep = job->reports[r][i];
            assert_true(rep->error == NULL || rep->error[0] == 0);
            if (i) /* the tail of one run: a re-run would restart the file at step 1 */
                assert_int_equal(rep->step, job->reports[r][i - 1]->step + 1);
        }
    }
}

static void run_scenario(fault_t f)
{
    memset(&g_cl, 0, sizeof g_cl);
    g_cl.dir = pcs_test_tmpdir(f == FAULT_RESTART ? "outage-restart" : "outage-pause");
    g_port = e2e_free_port();
    assert_true(g_port > 0);
    assert_int_equal(e2e_start_coord_at(&g_cl, g_port, k_coord_args), 0);
    char pause[16];
    snprintf(pause, sizeof pause, "%d", STEP_PAUSE_MS);
    const char *const worker_args[] = {"--max-jobs",    "0",   "--heartbeat-interval-ms",
                                       "0",             "--step-pause-ms", pause,
                                       NULL};
    assert_int_equal(e2e_spawn_workers(&g_cl, 4, worker_args), 0);
    e2e_job_t j, k;
    memset(&j, 0, sizeof j);
    memset(&k, 0, sizeof k);
    int submitted = -1;
    for (int i = 0; i < 100 && submitted != 0; i++) { /* the workers register first */
        char yaml[1024];
        snprintf(yaml, sizeof yaml, k_job_fmt, "long", J_STEPS);
        submitted = e2e_submit(&g_cl, yaml, "long", &j);
        if (submitted != 0)
            pcs_test_sleep_ms(100);
    }
    assert_int_equal(submitted, 0);
    wait_steps(&j, 20);

    fault(f, 30000, &j);
    pcs_test_sleep_ms(5000);
    char reason[512] = "";
    int s = job_state(j.job_id, reason, sizeof reason);
    if (s != PCS__V1__JOB_STATE__JOB_STATE_RUNNING)
        fail_msg("after a 30 s fault job %s is in state %d: %s (logs in %s)", j.job_id, s, reason,
                 g_cl.dir);
    assert_int_equal(workers_in(PCS__V1__WORKER_STATE__WORKER_STATE_LOST), 0);

    submit("short", K_STEPS, &k);
    wait_steps(&k, 20);
    fault(f, 60000, &j);
    int k_done = 0;
    assert_int_equal(last_step(&k, 0, &k_done), K_STEPS); /* K ended during the fault */
    assert_true(k_done);
    uint64_t j_at_return = last_step(&j, 0, NULL);
    assert_true(j_at_return < J_STEPS); /* J spans the fault */

    check_finished(&k, "short", K_STEPS);
    check_finished(&j, "long", J_STEPS);
    assert_int_equal(workers_in(PCS__V1__WORKER_STATE__WORKER_STATE_LOST), 0);
    assert_int_equal(workers_in(PCS__V1__WORKER_STATE__WORKER_STATE_IDLE), 4);
    fprintf(stderr, "outage: both jobs SUCCEEDED; job %s was at step %llu when the coordinator "
                    "came back from the 60 s fault\n",
            j.job_id, (unsigned long long)j_at_return);
    e2e_job_free(&j);
    e2e_job_free(&k);
}

static void test_coordinator_killed_30_s_then_60_s_fails_no_job(void **state)
{
    (void)state;
    run_scenario(FAULT_RESTART);
}

static void test_coordinator_stopped_30_s_then_60_s_fails_no_job(void **state)
{
    (void)state;
    run_scenario(FAULT_PAUSE);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest restart[] = {cmocka_unit_test_teardown(
        test_coordinator_killed_30_s_then_60_s_fails_no_job, teardown)};
    const struct CMUnitTest pause[] = {cmocka_unit_test_teardown(
        test_coordinator_stopped_30_s_then_60_s_fails_no_job, teardown)};
    if (argc > 1 && strcmp(argv[1], "restart") == 0)
        return cmocka_run_group_tests_name("outage_restart", restart, NULL, NULL);
    if (argc > 1 && strcmp(argv[1], "pause") == 0)
        return cmocka_run_group_tests_name("outage_pause", pause, NULL, NULL);
    fprintf(stderr, "usage: test_outage restart|pause\n");
    return 2;
}
