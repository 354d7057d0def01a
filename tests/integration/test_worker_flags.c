/* pcs-worker's backend flags as an operator meets them: a pod started with a backend or transport
 * it cannot serve fails at start with one clear line (exit 1, usage errors exit 2) instead of
 * registering and failing every job; what a worker offers shows in ListWorkers. Real processes
 * on 127.0.0.1; the cuda case depends on the machine (no device: start-up refusal; a device: an
 * ordinal out of range is refused naming the count). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>

#include "pcs/kernels.h"
#include "test_e2e_util.h"
#include "test_util.h"

/* Run pcs-worker with `args` against an address nobody listens on (start-up checks come before
 * any RPC); returns its exit code and the output in *out (caller frees). */
static int run_worker(const char *args, char **out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --coordinator 127.0.0.1:1 --max-jobs 1 %s 2>&1",
             pcs_test_bin("pcs-worker"), args);
    int status = -1;
    *out = pcs_test_run(cmd, &status);
    assert_non_null(*out);
    return status;
}

static void expect_refusal(const char *args, int code, const char *needle)
{
    char *out = NULL;
    int rc = run_worker(args, &out);
    if (rc != code || strstr(out, needle) == NULL)
        fail_msg("pcs-worker %s: exit %d (want %d), output:\n%s\n(want it to contain '%s')", args,
                 rc, code, out, needle);
    free(out);
}

static void test_nccl_on_a_cpu_worker_is_refused_at_start(void **state)
{
    (void)state;
    expect_refusal("--coll nccl", 1, "coll: nccl needs --backend cuda");
}

static void test_unknown_backend_and_transport_are_refused_at_start(void **state)
{
    (void)state;
    expect_refusal("--backend tpu", 1, "unknown kernel backend 'tpu'");
    expect_refusal("--coll mpi", 1, "coll: must be auto, nccl or gloo, got 'mpi'");
}

static void test_bad_device_is_a_usage_error(void **state)
{
    (void)state;
    expect_refusal("--device gpu0", 2, "--device: must be a device ordinal or auto, got 'gpu0'");
    expect_refusal("--device -1", 2, "--device: must be a device ordinal or auto");
}

static void test_cuda_backend_starts_only_where_a_device_is(void **state)
{
    (void)state;
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get("cuda", &be) != PCS_OK) {
        /* this build or machine has no GPU: the worker says so instead of registering (the
         * backend's own message: "cuda" alone also matches the flag's CONFIG log line) */
        expect_refusal("--backend cuda", 1, "kernel backend 'cuda'");
        return;
    }
    /* a device out of range names the count */
    char args[64];
    snprintf(args, sizeof args, "--backend cuda --device %d", be->device_count());
    expect_refusal(args, 1, "out of range");
}

/* ListWorkers shows what each worker offers, which is what a job's spec.collectives is matched
 * against: a cpu worker offers gloo (never nccl, whatever --coll says) and its device is the
 * host. */
static void test_list_workers_shows_what_each_worker_offers(void **state)
{
    (void)state;
    e2e_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    assert_int_equal(e2e_start(&cl, "wflags"), 0);
    const char *const gloo_only[] = {"--coll", "gloo", NULL};
    assert_int_equal(e2e_spawn_workers(&cl, 1, NULL), 0);
    assert_int_equal(e2e_spawn_workers(&cl, 1, gloo_only), 0);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --coordinator %s workers --json", pcs_test_bin("pcsctl"),
             cl.addr);
    char *out = NULL;
    int status = -1;
    for (int tries = 0; tries < 100; tries++) {
        free(out);
        out = pcs_test_run(cmd, &status);
        if (status == 0 && out && strstr(out, "e2e-") && strstr(strstr(out, "e2e-") + 4, "e2e-"))
            break;
        pcs_test_sleep_ms(100);
    }
    assert_int_equal(status, 0);
    assert_non_null(out);
    /* both cpu workers offer exactly gloo, and their device is the host */
    assert_non_null(strstr(out, "\"gloo\""));
    assert_null(strstr(out, "\"nccl\""));
    assert_non_null(strstr(out, "\"cpu\""));
    free(out);
    e2e_stop(&cl);
}

/* GET `path` from 127.0.0.1:port; the HTTP status code (0: no answer), the whole reply in *out
 * when out is not NULL. */
static int http_get(int port, const char *path, char **out)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && printf \"GET %s HTTP/1.0\\r\\n\\r\\n\" >&3 "
             "&& cat <&3' 2>/dev/null",
             port, path);
    int st = -1;
    char *r = pcs_test_run(cmd, &st);
    int code = 0;
    if (r && strncmp(r, "HTTP/1.", 7) == 0)
        code = atoi(r + 9);
    if (out)
        *out = r;
    else
        free(r);
    return code;
}

/* Poll GET path until it answers `code` (10 s). */
static void wait_code(int port, const char *path, int code)
{
    int got = 0;
    for (int i = 0; i < 200 && (got = http_get(port, path, NULL)) != code; i++)
        pcs_test_sleep_ms(50);
    if (got != code)
        fail_msg("GET %s: %d, want %d", path, got, code);
}

/* --metrics-listen as a Kubernetes probe and a Prometheus scrape meet it: a worker started
 * before its coordinator is live but not ready and says in its log where it retries and when;
 * ready once registered; /metrics shows the job it runs (promtool-clean); when the coordinator
 * dies the worker stays live (a coordinator outage must not make Kubernetes restart every
 * worker) and counts the failed heartbeats. */
static void test_worker_health_and_metrics_follow_the_coordinator(void **state)
{
    (void)state;
    e2e_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    cl.dir = pcs_test_tmpdir("wflags-http");
    int cport = e2e_free_port();
    assert_true(cport > 0);
    snprintf(cl.addr, sizeof cl.addr, "127.0.0.1:%d", cport);
    char mport_file[1100];
    snprintf(mport_file, sizeof mport_file, "%s/worker-metrics.port", cl.dir);
    const char *const wargs[] = {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                                 mport_file, "--step-pause-ms", "100", NULL};
    setenv("PCS_LOG_LEVEL", "info", 1); /* ctest runs at warn; the retry lines are info */
    assert_int_equal(e2e_spawn_workers(&cl, 1, wargs), 0);
    setenv("PCS_LOG_LEVEL", "warn", 1);
    char *mp = pcs_test_wait_file(mport_file, 10000);
    assert_non_null(mp);
    int port = atoi(mp);
    free(mp);
    assert_true(port > 0);

    /* no coordinator yet: live, not ready, and the log names the address and the next delay */
    wait_code(port, "/healthz", 200);
    char *body = NULL;
    assert_int_equal(http_get(port, "/readyz", &body), 503);
    assert_non_null(strstr(body, "not registered"));
    free(body);
    char logp[1100], want[200];
    snprintf(logp, sizeof logp, "%s/worker0.log", cl.dir);
    snprintf(want, sizeof want, "coordinator %s not reachable yet", cl.addr);
    char *log = NULL;
    for (int i = 0; i < 100; i++) {
        free(log);
        log = pcs_test_read_file(logp, NULL);
        if (log && strstr(log, want) && strstr(log, "retrying in"))
            break;
        pcs_test_sleep_ms(50);
    }
    assert_non_null(log);
    if (!strstr(log, want) || !strstr(log, "retrying in"))
        fail_msg("no retry line naming %s in the worker's log:\n%s", cl.addr, log);
    free(log);

    /* the coordinator comes: ready */
    assert_int_equal(e2e_start_coord_at(&cl, cport, NULL), 0);
    wait_code(port, "/readyz", 200);

    /* a job: the worker's /metrics shows it */
    const char *yaml = "name: wmetrics\n"
                       "model:\n  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                       "mesh:\n  - {dim: dp_shard, size: 1}\n"
                       "training: {steps: 100, micro_batch_size: 4, optimizer: {sgd: {lr: 0.01}}}\n"
                       "data: {synthetic: {seed: 1}}\n";
    e2e_job_t job;
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++)
        if ((rc = e2e_submit(&cl, yaml, "wmetrics", &job)) != 0)
            pcs_test_sleep_ms(100);
    assert_int_equal(rc, 0);
    char info[200];
    snprintf(info, sizeof info, "pcs_worker_job_info{job_id=\"%s\",rank=\"0\",generation=\"1\"} 1",
             job.job_id);
    char *m = NULL;
    for (int i = 0; i < 200; i++) {
        free(m);
        m = NULL;
        if (http_get(port, "/metrics", &m) == 200 && strstr(m, info) &&
            strstr(m, "pcs_worker_step{job_id="))
            break;
        pcs_test_sleep_ms(50);
    }
    assert_non_null(m);
    if (!strstr(m, info))
        fail_msg("no %s in the worker's /metrics:\n%s", info, m);
    assert_non_null(strstr(m, "pcs_worker_registered 1\n"));
    assert_non_null(strstr(m, "pcs_worker_registrations_total 1\n"));
    /* a world of one has no communicator */
    assert_non_null(strstr(m, "pcs_worker_communicators{transport=\"shm\"} 0\n"));
    assert_non_null(strstr(m, "pcs_worker_communicators{transport=\"tcp\"} 0\n"));
    assert_non_null(strstr(m, "pcs_worker_info{worker_id=\"w-"));
    assert_non_null(strstr(m, "pcs_build_info{version=\""));
    assert_non_null(strstr(m, "# TYPE process_resident_memory_bytes gauge"));
    char *exposition = strstr(m, "\r\n\r\n");
    assert_non_null(exposition);
    char mfile[1200];
    snprintf(mfile, sizeof mfile, "%s/worker-metrics.txt", cl.dir);
    FILE *f = fopen(mfile, "w");
    assert_non_null(f);
    fputs(exposition + 4, f);
    fclose(f);
    char why[1200];
    if (!pcs_test_exposition_grouped(exposition + 4, why, sizeof why))
        fail_msg("/metrics does not group its families: %s", why);
    char *lint = NULL;
    if (pcs_test_promtool_check(mfile, &lint) == 1)
        fail_msg("promtool check metrics:\n%s", lint);
    free(lint);
    free(m);

    /* the coordinator dies: the worker stays live and counts its failed heartbeats */
    kill(cl.coord, SIGKILL);
    waitpid(cl.coord, NULL, 0);
    cl.coord = 0;
    m = NULL;
    for (int i = 0; i < 100; i++) {
        free(m);
        m = NULL;
        if (http_get(port, "/metrics", &m) == 200 &&
            !strstr(m, "pcs_worker_heartbeat_failures_total 0\n"))
            break;
        pcs_test_sleep_ms(50);
    }
    assert_non_null(m);
    assert_null(strstr(m, "pcs_worker_heartbeat_failures_total 0\n"));
    free(m);
    assert_int_equal(http_get(port, "/healthz", NULL), 200);
    assert_int_equal(http_get(port, "/nope", NULL), 404);
    e2e_job_free(&job);
    e2e_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_on_a_cpu_worker_is_refused_at_start),
        cmocka_unit_test(test_unknown_backend_and_transport_are_refused_at_start),
        cmocka_unit_test(test_bad_device_is_a_usage_error),
        cmocka_unit_test(test_cuda_backend_starts_only_where_a_device_is),
        cmocka_unit_test(test_list_workers_shows_what_each_worker_offers),
        cmocka_unit_test(test_worker_health_and_metrics_follow_the_coordinator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
