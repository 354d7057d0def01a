/* Integration test of pcsctl against a real pcs-coordinator on 127.0.0.1:0 (stopped by pid):
 * submit the example job files, list jobs and workers (two workers registered over RPC by the
 * test so that a job really starts), job details, cancel, health, --json output that parses back
 * into the response message, and the exit codes and messages of the error paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "test_util.h"

typedef struct env {
    char *dir;
    pid_t coord;
    char addr[64];
    char pcsctl[1024];
    char tiny_job[64]; /* job id of examples/tiny-job.yaml */
} env_t;

static env_t E;

/* Run pcsctl with `args` against the test coordinator; returns stdout+stderr, *rc = exit code. */
__attribute__((format(printf, 2, 3))) static char *ctl(int *rc, const char *fmt, ...)
{
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' --coordinator %s %s 2>&1", E.pcsctl, E.addr, args);
    char *out = pcs_test_run(cmd, rc);
    assert_non_null(out);
    return out;
}

/* Same, stdout only (for --json, which must not be mixed with anything else). */
static char *ctl_stdout(int *rc, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' --coordinator %s %s", E.pcsctl, E.addr, args);
    char *out = pcs_test_run(cmd, rc);
    assert_non_null(out);
    return out;
}

static const char *example(const char *name)
{
    static char buf[4][1024];
    static int k;
    char rel[256];
    snprintf(rel, sizeof rel, "examples/%s", name);
    return pcs_test_src(rel, buf[k++ % 4], sizeof buf[0]);
}

static void expect_contains(const char *out, const char *want)
{
    if (!strstr(out, want))
        fail_msg("output lacks '%s':\n%s", want, out);
}

static int setup(void **state)
{
    (void)state;
    E.dir = pcs_test_tmpdir("pcsctl");
    snprintf(E.pcsctl, sizeof E.pcsctl, "%s", pcs_test_bin("pcsctl"));
    if (access(E.pcsctl, X_OK) != 0 || access(pcs_test_bin("pcs-coordinator"), X_OK) != 0) {
        fprintf(stderr, "pcsctl or pcs-coordinator not built\n");
        return -1;
    }
    /* A long lease: the test's fake workers never heartbeat. */
    const char *extra[] = {"--lease-ms", "600000", NULL};
    E.coord = pcs_test_start_coordinator(E.dir, extra, E.addr, sizeof E.addr);
    return E.coord > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    if (E.coord > 0)
        pcs_test_stop(E.coord, 5000);
    pcs_test_rmtree(E.dir);
    free(E.dir);
    return 0;
}

/* The job id printed by `submit` ("job-N pending (world ...)"). */
static void job_id_of(const char *out, char *id, size_t n)
{
    size_t k = strcspn(out, " \n");
    assert_true(k > 0 && k < n);
    memcpy(id, out, k);
    id[k] = '\0';
    assert_memory_equal(id, "job-", 4);
}

// ---- tests (run in order against one coordinator) -----------------------------------------------

static void test_health_of_running_coordinator_is_serving(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "health");
    assert_int_equal(rc, 0);
    expect_contains(out, "SERVING");
    free(out);
}

static void test_submit_tiny_job_prints_id_and_pending_state(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "submit '%s' --request-id tiny-1", example("tiny-job.yaml"));
    assert_int_equal(rc, 0);
    expect_contains(out, " pending (world 2, request tiny-1)");
    job_id_of(out, E.tiny_job, sizeof E.tiny_job);
    free(out);
}

static void test_submit_with_same_request_id_returns_the_same_job(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "submit '%s' --request-id tiny-1", example("tiny-job.yaml"));
    assert_int_equal(rc, 0);
    char id[64];
    job_id_of(out, id, sizeof id);
    assert_string_equal(id, E.tiny_job);
    expect_contains(out, "duplicate request");
    free(out);
}

static char *register_worker(pcs_rpc_client_t *c, const char *identity, uint32_t pid)
{
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    char *backends[] = {"gloo"};
    Pcs__V1__Device dev = PCS__V1__DEVICE__INIT;
    Pcs__V1__Device *devs[] = {&dev};
    dev.kind = "cpu";
    req.identity = (char *)identity;
    req.host = "testhost";
    req.pid = pid;
    req.n_backends = 1;
    req.backends = backends;
    req.n_devices = 1;
    req.devices = devs;
    req.program = "pcs-worker";
    ProtobufCMessage *r = NULL;
    if (pcs_rpc_call(c, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor, 5000,
                     &r, NULL) != PCS_OK)
        fail_msg("Register: %s", pcs_last_error());
    char *id = strdup(((Pcs__V1__RegisterResponse *)r)->worker_id);
    protobuf_c_message_free_unpacked(r, NULL);
    return id;
}

static void test_two_workers_start_the_tiny_job_and_show_in_tables(void **state)
{
    (void)state;
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(E.addr, &c), PCS_OK);
    char *w1 = register_worker(c, "ctl-test-a", 1111);
    char *w2 = register_worker(c, "ctl-test-b", 2222);
    pcs_rpc_client_destroy(c);

    int rc;
    char *out = ctl(&rc, "workers");
    assert_int_equal(rc, 0);
    expect_contains(out, "WORKER");
    expect_contains(out, "HEARTBEAT");
    expect_contains(out, "PROGRAM");
    expect_contains(out, "pcs-worker");
    expect_contains(out, w1);
    expect_contains(out, w2);
    expect_contains(out, "assigned");
    expect_contains(out, "testhost");
    expect_contains(out, "1111");
    expect_contains(out, "cpu:0");
    expect_contains(out, E.tiny_job);
    free(out);

    out = ctl(&rc, "status %s", E.tiny_job);
    assert_int_equal(rc, 0);
    expect_contains(out, "state        running");
    expect_contains(out, "world size   2");
    expect_contains(out, "RANK  WORKER");
    expect_contains(out, w1);
    free(out);
    free(w1);
    free(w2);
}

static void test_submit_every_example_file(void **state)
{
    (void)state;
    const char *files[] = {"demo-job.yaml", "hsdp-job.yaml", "fp16-explicit-job.json"};
    const char *world[] = {"world 4", "world 4", "world 2"};
    for (size_t i = 0; i < 3; i++) {
        int rc;
        char *out = ctl(&rc, "submit '%s'", example(files[i]));
        if (rc != 0)
            fail_msg("%s: rc %d: %s", files[i], rc, out);
        expect_contains(out, " pending (");
        expect_contains(out, world[i]);
        free(out);
    }
}

static void test_jobs_lists_every_job_and_filters_by_state(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "jobs");
    assert_int_equal(rc, 0);
    expect_contains(out, "JOB");
    expect_contains(out, "STATE");
    expect_contains(out, "mlp-demo");
    expect_contains(out, "mlp-hsdp");
    expect_contains(out, "explicit-fp16");
    expect_contains(out, "tiny");
    expect_contains(out, "running");
    free(out);
    out = ctl(&rc, "jobs --state pending");
    assert_int_equal(rc, 0);
    expect_contains(out, "mlp-demo");
    assert_null(strstr(out, "tiny"));
    free(out);
    out = ctl(&rc, "jobs --state sleeping");
    assert_int_equal(rc, 2);
    expect_contains(out, "unknown job state 'sleeping'");
    free(out);
}

static void test_status_summary_counts_jobs_and_workers(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "status");
    assert_int_equal(rc, 0);
    expect_contains(out, "workers      idle 0  assigned 2");
    expect_contains(out, "jobs         pending 3  running 1");
    free(out);
}

static void test_cancel_moves_the_job_to_cancelled(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "cancel %s --reason 'done testing'", E.tiny_job);
    assert_int_equal(rc, 0);
    expect_contains(out, "cancelled");
    free(out);
    out = ctl(&rc, "status %s", E.tiny_job);
    assert_int_equal(rc, 0);
    expect_contains(out, "state        cancelled");
    expect_contains(out, "done testing");
    free(out);
    /* --watch on a job that has ended returns at once: exit 1 (it did not succeed) */
    out = ctl(&rc, "status --watch --interval-ms 200 %s", E.tiny_job);
    assert_int_equal(rc, 1);
    expect_contains(out, "--- every 0.2 s: pcsctl status ");
    expect_contains(out, "state        cancelled");
    free(out);
    /* --watch on a job the coordinator does not know ends at once: exit 1, NOT_FOUND shown */
    out = ctl(&rc, "status --watch --interval-ms 200 job-424242");
    assert_int_equal(rc, 1);
    expect_contains(out, "NOT_FOUND");
    free(out);
}

/* --watch redraws while the job runs and survives a coordinator it cannot reach: on an address
 * nobody serves it keeps retrying (each attempt shows the error) until stopped. */
static void test_status_watch_keeps_watching_until_stopped(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "timeout --preserve-status -s INT 2 '%s' --coordinator 127.0.0.1:1 status --watch "
             "--interval-ms 200 job-1 2>&1; echo rc=$?",
             E.pcsctl);
    int rc;
    char *out = pcs_test_run(cmd, &rc);
    assert_non_null(out);
    expect_contains(out, "cannot reach coordinator at 127.0.0.1:1");
    expect_contains(out, "rc=130"); /* interrupted (SIGINT) while watching a job: not success */
    /* at 200 ms for 2 s: several redraws, each dated */
    int n = 0;
    for (const char *p = out; (p = strstr(p, "--- every 0.2 s")) != NULL; p++)
        n++;
    if (n < 3)
        fail_msg("%d redraws in 2 s at 200 ms:\n%s", n, out);
    free(out);
}

static void test_json_output_parses_back_into_the_response(void **state)
{
    (void)state;
    int rc;
    char *out = ctl_stdout(&rc, "--json jobs");
    assert_int_equal(rc, 0);
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(out, strlen(out), &pcs__v1__list_jobs_response__descriptor, &m) != PCS_OK)
        fail_msg("jobs --json: %s\n%s", pcs_last_error(), out);
    Pcs__V1__ListJobsResponse *jobs = (Pcs__V1__ListJobsResponse *)m;
    assert_int_equal(jobs->n_jobs, 4);
    int found = 0;
    for (size_t i = 0; i < jobs->n_jobs; i++)
        if (!strcmp(jobs->jobs[i]->job_id, E.tiny_job)) {
            found = 1;
            assert_int_equal(jobs->jobs[i]->state, PCS__V1__JOB_STATE__JOB_STATE_CANCELLED);
        }
    assert_true(found);
    protobuf_c_message_free_unpacked(m, NULL);
    free(out);

    /* The global flag also works after the command name. */
    char args[128];
    snprintf(args, sizeof args, "status %s --json", E.tiny_job);
    out = ctl_stdout(&rc, args);
    assert_int_equal(rc, 0);
    assert_int_equal(pcs_pb_from_yaml(out, strlen(out), &pcs__v1__get_job_response__descriptor, &m),
                     PCS_OK);
    Pcs__V1__GetJobResponse *gj = (Pcs__V1__GetJobResponse *)m;
    assert_string_equal(gj->job->name, "tiny");
    assert_int_equal(gj->job->world_size, 2);
    assert_int_equal(gj->job->spec->training->steps, 4);
    protobuf_c_message_free_unpacked(m, NULL);
    free(out);

    const char *more[] = {"--json workers", "--json status", "--json health"};
    const ProtobufCMessageDescriptor *descs[] = {
        &pcs__v1__list_workers_response__descriptor, &pcs__v1__get_status_response__descriptor,
        &grpc__health__v1__health_check_response__descriptor};
    for (size_t i = 0; i < 3; i++) {
        out = ctl_stdout(&rc, more[i]);
        assert_int_equal(rc, 0);
        if (pcs_pb_from_yaml(out, strlen(out), descs[i], &m) != PCS_OK)
            fail_msg("%s: %s\n%s", more[i], pcs_last_error(), out);
        protobuf_c_message_free_unpacked(m, NULL);
        free(out);
    }
}

static void test_bad_job_files_fail_locally_with_a_clear_message(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "submit /nonexistent/job.yaml");
    assert_int_equal(rc, 1);
    expect_contains(out, "pcsctl: /nonexistent/job.yaml: cannot open");
    free(out);

    char path[1024];
    snprintf(path, sizeof path, "%s/bad.yaml", E.dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("name: bad\ntraining:\n  steps: lots\n", fp);
    fclose(fp);
    out = ctl(&rc, "submit '%s'", path);
    assert_int_equal(rc, 1);
    expect_contains(out, "line 3: training.steps: expected a non-negative integer, got 'lots'");
    free(out);

    fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("name: bad\nmodel: {mlp: {input_dim: 4, hidden_dims: [4], output_dim: 2}}\n"
          "training: {steps: 0, micro_batch_size: 1, optimizer: {sgd: {lr: 0.1}}}\n",
          fp);
    fclose(fp);
    out = ctl(&rc, "submit '%s'", path);
    assert_int_equal(rc, 1);
    expect_contains(out, "invalid job spec: training.steps: must be >= 1");
    free(out);

    /* Nothing reached the coordinator: still the 4 jobs from before. */
    out = ctl_stdout(&rc, "--json jobs");
    ProtobufCMessage *m = NULL;
    assert_int_equal(
        pcs_pb_from_yaml(out, strlen(out), &pcs__v1__list_jobs_response__descriptor, &m), PCS_OK);
    assert_int_equal(((Pcs__V1__ListJobsResponse *)m)->n_jobs, 4);
    protobuf_c_message_free_unpacked(m, NULL);
    free(out);
}

static void test_server_errors_print_the_grpc_code(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "status job-does-not-exist");
    assert_int_equal(rc, 1);
    expect_contains(out, "pcsctl: status: NOT_FOUND: ");
    free(out);
    out = ctl(&rc, "cancel job-does-not-exist");
    assert_int_equal(rc, 1);
    expect_contains(out, "pcsctl: cancel: NOT_FOUND: ");
    free(out);
}

static void test_usage_errors_exit_2(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"", "usage: pcsctl"},
        {"frobnicate", "unknown command 'frobnicate'"},
        {"submit", "pcsctl: submit: FILE|- is required"},
        {"cancel", "pcsctl: cancel: JOB is required"},
        {"--bogus jobs", "unknown option '--bogus'"},
        {"jobs --bogus", "pcsctl: jobs: unknown option --bogus"},
        {"--timeout-ms 0 jobs", "--timeout-ms must be an integer"},
        {"submit a.yaml b.yaml", "pcsctl: submit: unexpected argument b.yaml"},
        {"submit --request-id", "pcsctl: submit: option needs a value: --request-id"},
        {"plan x.yaml --world zero", "pcsctl: plan: --world: want an integer"},
        {"status --interval-ms 500", "pcsctl: status: --interval-ms: only with --watch"},
        {"demo --job examples/tiny-job.yaml --workers 2",
         "pcsctl: demo: --workers and --steps shape the built-in demo job"},
        {"export job-1", "pcsctl: export: a job id and an output path are required"},
        {"workers --state sleepy", "pcsctl: workers: --state: unknown worker state 'sleepy'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc;
        char *out = ctl(&rc, "%s", cases[i][0]);
        if (rc != 2)
            fail_msg("'%s': rc %d, expected 2: %s", cases[i][0], rc, out);
        expect_contains(out, cases[i][1]);
        free(out);
    }
}

/* Every sub-command answers -h and --help with exit 0, its synopsis and every option of its own
 * (the table it parses with), and `pcsctl --help` lists every option of every sub-command. */
static void test_every_command_has_help_with_all_its_options(void **state)
{
    (void)state;
    int rc;
    char *top = ctl(&rc, "--help");
    assert_int_equal(rc, 0);
    const char *cmds[] = {"submit", "status", "jobs",   "workers", "cancel",
                          "health", "plan",   "export", "demo",    "protoset"};
    const char *opts[][7] = {
        {"--request-id ID", NULL},
        {"--full", "--watch", "--interval-ms N", NULL},
        {"--state S", NULL},
        {"--state S", NULL},
        {"--reason TEXT", NULL},
        {"--service NAME", NULL},
        {"--world N", "--rank R", NULL},
        {"--checkpoint DIR", "--step N", NULL},
        {"--workers N", "--steps S", "--job FILE", "--dir DIR", "--keep", "--no-reference", NULL},
        {NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        for (int h = 0; h < 2; h++) {
            char *out = ctl(&rc, "%s %s", cmds[i], h ? "-h" : "--help");
            if (rc != 0)
                fail_msg("pcsctl %s %s: rc %d: %s", cmds[i], h ? "-h" : "--help", rc, out);
            char want[64];
            snprintf(want, sizeof want, "usage: pcsctl %s", cmds[i]);
            expect_contains(out, want);
            expect_contains(out, "--coordinator ADDR");
            if (strstr(out, "\\n")) /* an escaped newline printed as two characters */
                fail_msg("pcsctl %s --help prints a literal \\n:\n%s", cmds[i], out);
            for (int k = 0; opts[i][k]; k++) {
                expect_contains(out, opts[i][k]);
                expect_contains(top, opts[i][k]);
            }
            free(out);
        }
    }
    free(top);
}

static void test_unreachable_coordinator_is_a_clear_error(void **state)
{
    (void)state;
    /* A port nothing listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    char dead[64], cmd[2048], want[128];
    snprintf(dead, sizeof dead, "127.0.0.1:%d", ntohs(sa.sin_port));
    snprintf(want, sizeof want, "pcsctl: cannot reach coordinator at %s (UNAVAILABLE", dead);
    const char *cmds[] = {"jobs", "health", "workers", "status"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "'%s' --coordinator %s %s 2>&1", E.pcsctl, dead, cmds[i]);
        int rc;
        char *out = pcs_test_run(cmd, &rc);
        assert_int_equal(rc, 1);
        expect_contains(out, want);
        free(out);
    }
    /* The address also comes from $PCS_COORDINATOR. */
    snprintf(cmd, sizeof cmd, "PCS_COORDINATOR=%s '%s' health 2>&1", dead, E.pcsctl);
    int rc;
    char *out = pcs_test_run(cmd, &rc);
    assert_int_equal(rc, 1);
    expect_contains(out, want);
    free(out);
    snprintf(cmd, sizeof cmd, "PCS_COORDINATOR=%s '%s' health 2>&1", E.addr, E.pcsctl);
    out = pcs_test_run(cmd, &rc);
    assert_int_equal(rc, 0);
    expect_contains(out, "SERVING");
    free(out);
}

/* FSDP2's per-parameter layout offline: the plan says so and --rank lists the rank's rows of each
 * parameter (W = 3: 32 rows in chunks of 11, rank 2 holds rows 22..31; the 4-row head leaves it
 * nothing); the coordinator accepts the job. */
static void test_plan_rank_lists_per_param_rows(void **state)
{
    (void)state;
    char path[1200], cmd[3000];
    snprintf(path, sizeof path, "%s/per-param.yaml", E.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("name: pp\n"
          "model: {mlp: {input_dim: 16, hidden_dims: [32, 32], output_dim: 4, norm: layernorm}}\n"
          "wrap: {module_class: [MLPBlock]}\n"
          "mesh: [{dim: dp_shard, size: 3}]\n"
          "shard_layout: per_param\n"
          "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}}\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' plan '%s' --rank 2 2>&1", E.pcsctl, path);
    int rc;
    char *out = pcs_test_run(cmd, &rc);
    assert_int_equal(rc, 0);
    expect_contains(out, "# shard layout: per_param");
    expect_contains(out, "unit 1 (layers.0) shard 2 of 3, replica 0, per_param: 209 elements");
    expect_contains(out, "[0, +160) layers.0.linear.weight rows [22, 32) of 32");
    expect_contains(out,
                    "unit 0 (<root>) shard 2 of 3, replica 0, per_param: 66 elements\n#   unit 1");
    free(out);
    out = ctl(&rc, "submit '%s'", path);
    assert_int_equal(rc, 0);
    expect_contains(out, " pending (world 3, request ctl-");
    free(out);
}

static void test_submit_reads_the_job_from_stdin(void **state)
{
    (void)state;
    int rc;
    char *out = ctl(&rc, "submit - < '%s'", example("tiny-job.yaml"));
    assert_int_equal(rc, 0);
    expect_contains(out, " pending (world 2, request ctl-");
    free(out);
    out = ctl(&rc, "submit - < /dev/null");
    assert_int_equal(rc, 1);
    expect_contains(out, "pcsctl: <stdin>: line 1: document is empty");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_of_running_coordinator_is_serving),
        cmocka_unit_test(test_submit_tiny_job_prints_id_and_pending_state),
        cmocka_unit_test(test_submit_with_same_request_id_returns_the_same_job),
        cmocka_unit_test(test_two_workers_start_the_tiny_job_and_show_in_tables),
        cmocka_unit_test(test_submit_every_example_file),
        cmocka_unit_test(test_jobs_lists_every_job_and_filters_by_state),
        cmocka_unit_test(test_status_summary_counts_jobs_and_workers),
        cmocka_unit_test(test_cancel_moves_the_job_to_cancelled),
        cmocka_unit_test(test_json_output_parses_back_into_the_response),
        cmocka_unit_test(test_bad_job_files_fail_locally_with_a_clear_message),
        cmocka_unit_test(test_server_errors_print_the_grpc_code),
        cmocka_unit_test(test_usage_errors_exit_2),
        cmocka_unit_test(test_every_command_has_help_with_all_its_options),
        cmocka_unit_test(test_status_watch_keeps_watching_until_stopped),
        cmocka_unit_test(test_unreachable_coordinator_is_a_clear_error),
        cmocka_unit_test(test_submit_reads_the_job_from_stdin),
        cmocka_unit_test(test_plan_rank_lists_per_param_rows),
    };
    return cmocka_run_group_tests_name("pcsctl", tests, setup, teardown);
}
