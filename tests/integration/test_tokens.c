/* The real coordinator started with --token-file: pcsctl and pcs-worker present PCS_TOKEN as a
 * bearer token; each role reaches exactly its RPCs, a missing or unknown token is
 * UNAUTHENTICATED, health probes need none, and a bad token file stops the coordinator at
 * start with the file and line in the message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#define VIEW "view-0123456789abcdef"
#define SUB  "sub-0123456789abcdef"
#define WRK  "wrk-0123456789abcdef"

typedef struct fx {
    char *dir;
    pid_t coord, worker;
    char addr[64];
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->dir = pcs_test_tmpdir("tokens");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokens.conf", f->dir);
    FILE *t = fopen(path, "w");
    if (!t)
        return -1;
    fprintf(t, "viewer %s\nsubmitter %s\nworker %s\n", VIEW, SUB, WRK);
    fclose(t);
    const char *args[] = {"--token-file", path, NULL};
    f->coord = pcs_test_start_coordinator(f->dir, args, f->addr, sizeof f->addr);
    if (f->coord <= 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    if (f->worker > 0)
        pcs_test_stop(f->worker, 5000);
    pcs_test_stop(f->coord, 5000);
    pcs_test_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static int ctl(const fx_t *f, const char *token, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && PCS_TOKEN=%s %s --coordinator %s %s 2>&1", f->dir,
             token ? token : "", pcs_test_bin("pcsctl"), f->addr, args);
    int status = -1;
    *out = pcs_test_run(cmd, &status);
    return status;
}

static void expect(const fx_t *f, const char *token, const char *args, int want_exit,
                   const char *needle)
{
    char *out = NULL;
    int st = ctl(f, token, args, &out);
    if (st != want_exit || (needle && !strstr(out, needle)))
        fail_msg("pcsctl %s (token %s): exit %d (want %d), output lacks '%s':\n%s", args,
                 token ? token : "none", st, want_exit, needle ? needle : "", out);
    free(out);
}

static void test_each_role_reaches_exactly_its_rpcs(void **state)
{
    fx_t *f = *state;
    char job[1100];
    char src[1024];
    snprintf(job, sizeof job, "submit %s", pcs_test_src("examples/tiny-job.yaml", src, sizeof src));
    expect(f, NULL, "health", 0, "SERVING");
    expect(f, NULL, "jobs", 1, "UNAUTHENTICATED");
    expect(f, "not-a-known-token-at-all", "jobs", 1, "UNAUTHENTICATED: unknown bearer token");
    expect(f, VIEW, "jobs", 0, "JOB");
    expect(f, VIEW, job, 1, "PERMISSION_DENIED: role viewer may not call");
    expect(f, WRK, job, 1, "PERMISSION_DENIED: role worker may not call");
    expect(f, SUB, job, 0, "job-1");
    expect(f, VIEW, "status job-1", 0, "job-1");
    expect(f, VIEW, "cancel job-1", 1, "PERMISSION_DENIED");
}

static void test_worker_with_its_token_registers(void **state)
{
    fx_t *f = *state;
    char log[1100];
    snprintf(log, sizeof log, "%s/worker.log", f->dir);
    const char *argv[] = {pcs_test_bin("pcs-worker"), "--coordinator", f->addr, NULL};
    setenv("PCS_TOKEN", WRK, 1);
    f->worker = pcs_test_spawn((char *const *)argv, log);
    unsetenv("PCS_TOKEN");
    assert_true(f->worker > 0);
    int seen = 0;
    for (int i = 0; i < 200 && !seen; i++) {
        char *out = NULL;
        ctl(f, VIEW, "workers", &out);
        seen = out && strstr(out, "w-1") != NULL;
        free(out);
        if (!seen)
            pcs_test_sleep_ms(50);
    }
    assert_true(seen);
}

static void test_bad_token_file_stops_the_coordinator_naming_the_line(void **state)
{
    fx_t *f = *state;
    char path[1024], cmd[3000];
    snprintf(path, sizeof path, "%s/bad.conf", f->dir);
    FILE *t = fopen(path, "w");
    assert_non_null(t);
    fprintf(t, "viewer %s\nroot root-0123456789abcdef\n", VIEW);
    fclose(t);
    snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:0 --token-file %s 2>&1",
             pcs_test_bin("pcs-coordinator"), path);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 1);
    assert_non_null(strstr(out, "bad.conf:2: unknown role 'root'"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_each_role_reaches_exactly_its_rpcs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_with_its_token_registers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_token_file_stops_the_coordinator_naming_the_line,
                                        setup, teardown),
    };
    return cmocka_run_group_tests_name("tokens", tests, NULL, NULL);
}
