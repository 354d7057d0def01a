/* pcsctl demo and pcsctl export as a user runs them: the demo (real coordinator and workers,
 * shortened to 2 workers x 3 steps) must succeed, audit its collectives and match the reference;
 * export must rebuild the full model from the demo's sharded checkpoint, and fail clearly on a
 * directory that is not a checkpoint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test_e2e_util.h"
#include "test_util.h"

static void test_demo_trains_exports_and_matches_reference(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("demo");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s demo --workers 2 --steps 3 --dir %s/run 2>&1",
             pcs_test_bin("pcsctl"), dir);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    fprintf(stderr, "%s", out);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "SUCCEEDED"));
    assert_non_null(strstr(out, "collective dtypes all match the plan"));
    /* the memory promise, shown: rank 0's runtime account against the plan's estimate */
    assert_non_null(strstr(out, "memory: rank 0's runtime held at most "));
    assert_non_null(strstr(out, "(within it)"));
    assert_null(strstr(out, "held at most 0.00 MiB")); /* the reports carry the account */
    assert_non_null(strstr(out, "reference: the same job in one process (pcs-reference, 3 steps)"));
    assert_non_null(strstr(out, "parity vs single-process reference (3 steps"));
    assert_non_null(strstr(out, "): OK"));
    assert_null(strstr(out, "removed ")); /* a --dir is the user's: kept */
    free(out);

    /* export again from the demo's checkpoint with the CLI and read the file back */
    snprintf(cmd, sizeof cmd, "%s export --checkpoint %s/run/ckpt/job-1 %s/again.safetensors 2>&1",
             pcs_test_bin("pcsctl"), dir, dir);
    out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "exported 18 parameters (3436560 elements)"));
    free(out);
    char path[1200];
    snprintf(path, sizeof path, "%s/again.safetensors", dir);
    pcs_st_file_t *f = NULL;
    assert_int_equal(pcs_st_open(path, &f), PCS_OK);
    assert_int_equal(pcs_st_count(f), 18);
    const pcs_st_tensor_t *w = pcs_st_find(f, "layers.1.linear.weight");
    assert_non_null(w);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 1024);
    assert_int_equal(w->shape[1], 1024);
    assert_int_equal(w->dtype, PCS_DTYPE_FP32);
    assert_string_equal(pcs_st_metadata(f, "format"), "pt");
    pcs_st_close(f);
    pcs_test_rmtree(dir);
    free(dir);
}

/* The demo's directories: without --dir its temporary directory is gone after a successful run
 * (unless --keep); --dir on the directory of an earlier demo clears that run and works (its old
 * port file must not send the demo to a dead coordinator); --dir on someone's non-empty directory
 * is refused before anything starts. */
static void test_demo_cleans_up_and_reuses_its_directories(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("demo-dirs");
    char cmd[2048];
    int status = -1;
    /* 1. TMPDIR=dir: the demo's temp dir appears there and is removed after success */
    snprintf(cmd, sizeof cmd,
             "TMPDIR=%s %s demo --workers 2 --steps 2 --no-reference 2>&1; ls -A %s | wc -l", dir,
             pcs_test_bin("pcsctl"), dir);
    char *out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    if (!strstr(out, "SUCCEEDED") || !strstr(out, "removed ") || !strstr(out, "\n0\n"))
        fail_msg("demo in a temp dir:\n%s", out);
    free(out);
    /* 2. --keep keeps it */
    snprintf(cmd, sizeof cmd,
             "TMPDIR=%s %s demo --workers 2 --steps 2 --no-reference --keep 2>&1; ls -A %s | wc -l",
             dir, pcs_test_bin("pcsctl"), dir);
    out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    if (!strstr(out, "SUCCEEDED") || strstr(out, "removed ") || !strstr(out, "\n1\n"))
        fail_msg("demo --keep:\n%s", out);
    free(out);
    /* 3. --dir twice: the second run clears the first and succeeds; the second names the
     * directory relative to the working directory (its checkpoints land in it, not in a copy of
     * the relative path beneath it, and the export finds them) */
    for (int run = 0; run < 2; run++) {
        if (run == 0)
            snprintf(cmd, sizeof cmd,
                     "%s demo --workers 2 --steps 2 --no-reference --dir %s/d 2>&1",
                     pcs_test_bin("pcsctl"), dir);
        else
            snprintf(cmd, sizeof cmd,
                     "cd %s && %s demo --workers 2 --steps 2 --no-reference --dir d 2>&1", dir,
                     pcs_test_bin("pcsctl"));
        out = pcs_test_run(cmd, &status);
        assert_non_null(out);
        if (status != 0 || !strstr(out, "SUCCEEDED") || !strstr(out, "exported model: "))
            fail_msg("demo --dir, run %d: rc %d:\n%s", run + 1, status, out);
        if (run == 1)
            assert_non_null(strstr(out, "pcs demo: cleared the earlier run in "));
        free(out);
    }
    /* 4. someone's directory: refused, untouched */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/mine && echo data > %s/mine/notes.txt && %s demo --dir "
                              "%s/mine 2>&1; echo rc=$?; cat %s/mine/notes.txt",
             dir, dir, pcs_test_bin("pcsctl"), dir, dir);
    out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    if (!strstr(out, "not empty and not a demo directory") || !strstr(out, "rc=1") ||
        !strstr(out, "data\n"))
        fail_msg("demo --dir on a user's directory:\n%s", out);
    free(out);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_export_of_a_non_checkpoint_fails_with_a_clear_error(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("export");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s export --checkpoint %s %s/x.safetensors 2>&1",
             pcs_test_bin("pcsctl"), dir, dir);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    assert_non_null(out);
    assert_int_equal(status, 1);
    assert_non_null(strstr(out, "no complete checkpoint"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s export 2>&1", pcs_test_bin("pcsctl"));
    out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 2);
    free(out);
    /* --step must be a step number: not empty (it read as 0, the latest), not negative */
    const char *bad_steps[] = {"''", "-1", "3x", "+2"};
    for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s export --checkpoint %s %s/x.safetensors --step %s 2>&1",
                 pcs_test_bin("pcsctl"), dir, dir, bad_steps[i]);
        out = pcs_test_run(cmd, &status);
        assert_non_null(out);
        if (status != 2)
            fail_msg("--step %s: exit %d: %s", bad_steps[i], status, out);
        assert_non_null(strstr(out, "--step: not a number"));
        free(out);
    }
    pcs_test_rmtree(dir);
    free(dir);
}

/* `pcsctl export JOB out.safetensors`: the checkpoint directory comes from the job's spec on the
 * coordinator; the exported parameters equal the ones assembled directly from the checkpoint. */
static void test_export_by_job_id_reads_the_jobs_checkpoint(void **state)
{
    (void)state;
    static const char job[] = "name: exp\n"
                              "model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 2}}\n"
                              "wrap: {module_class: [MLPBlock]}\n"
                              "mesh: [{dim: dp_shard, size: 2}]\n"
                              "training: {steps: 3, micro_batch_size: 4, optimizer: {adamw: "
                              "{lr: 1.0e-2}}}\n";
    e2e_cluster_t c;
    assert_int_equal(e2e_start(&c, "export"), 0);
    assert_int_equal(e2e_spawn_workers(&c, 2, NULL), 0);
    e2e_job_t j;
    assert_int_equal(e2e_run_job(&c, job, "exp", 60000, &j), 0);
    assert_int_equal(j.state, PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
    char cmd[2048], out[1200];
    snprintf(out, sizeof out, "%s/by-id.safetensors", c.dir);
    snprintf(cmd, sizeof cmd, "%s --coordinator %s export %s %s 2>&1", pcs_test_bin("pcsctl"),
             c.addr, j.job_id, out);
    int status = -1;
    char *txt = pcs_test_run(cmd, &status);
    assert_non_null(txt);
    fprintf(stderr, "%s", txt);
    assert_int_equal(status, 0);
    assert_non_null(strstr(txt, "of step 3"));
    free(txt);
    /* byte-identical to the export the test helper made from the same checkpoint */
    size_t la = 0, lb = 0;
    char *a = pcs_test_read_file(out, &la), *b = pcs_test_read_file(j.export_path, &lb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    /* an unknown job is a clear error */
    snprintf(cmd, sizeof cmd, "%s --coordinator %s export job-999 %s 2>&1", pcs_test_bin("pcsctl"),
             c.addr, out);
    txt = pcs_test_run(cmd, &status);
    assert_int_equal(status, 1);
    assert_non_null(strstr(txt, "NOT_FOUND"));
    free(txt);
    e2e_job_free(&j);
    e2e_stop(&c);
}

/* A long demo (2 workers, no reference run) started in the background, once its table has begun:
 * pcsctl's pid, the coordinator's pid and address from "pcs demo: coordinator 127.0.0.1:P (pid
 * N), ...", and the pgrep command that counts the demo's workers. */
typedef struct demo_run {
    char *dir;
    char log[1100];
    pid_t pid;
    int coord;
    char addr[64];
    char pgrep[256];
} demo_run_t;

static void demo_start(demo_run_t *d, const char *tag)
{
    memset(d, 0, sizeof *d);
    d->coord = -1;
    d->dir = pcs_test_tmpdir(tag);
    char run[1100];
    snprintf(run, sizeof run, "%s/run", d->dir);
    snprintf(d->log, sizeof d->log, "%s/pcsctl.log", d->dir);
    const char *argv[] = {pcs_test_bin("pcsctl"), "demo",  "--workers", "2", "--steps", "100000",
                          "--no-reference",       "--dir", run,         NULL};
    d->pid = pcs_test_spawn((char *const *)argv, d->log);
    assert_true(d->pid > 0);
    for (int waited = 0; waited < 20000 && d->coord < 0; waited += 50) {
        char *txt = pcs_test_read_file(d->log, NULL);
        const char *a = txt ? strstr(txt, "coordinator 127.0.0.1:") : NULL;
        const char *p = txt ? strstr(txt, "(pid ") : NULL;
        if (a && p && strstr(txt, "step ")) {
            sscanf(a + strlen("coordinator "), "%63s", d->addr);
            d->coord = atoi(p + 5);
        }
        free(txt);
        if (d->coord < 0)
            pcs_test_sleep_ms(50);
    }
    assert_true(d->coord > 0);
    assert_true(d->addr[0]);
    /* the demo names its workers demo-<pcsctl pid>-w<i>: a worker of another test that happens
     * to point at a reused port is not counted; "[w]": the pattern must not match the shell that
     * runs pgrep */
    snprintf(d->pgrep, sizeof d->pgrep, "pgrep -f -- '--identity demo-%d-[w]' | wc -l",
             (int)d->pid);
}

/* Workers still pointed at the demo's coordinator. */
static int demo_workers_left(const demo_run_t *d)
{
    int status = -1;
    char *n = pcs_test_run(d->pgrep, &status);
    int left = n ? atoi(n) : -1;
    free(n);
    return left;
}

static void demo_finish(demo_run_t *d)
{
    pcs_test_rmtree(d->dir);
    free(d->dir);
}

/* A coordinator that dies while the demo runs must end the demo with an error naming it, not leave
 * it polling a job state nobody can answer. */
static void test_demo_ends_when_its_coordinator_dies(void **state)
{
    (void)state;
    demo_run_t d;
    demo_start(&d, "demo-dead");
    assert_int_equal(kill(d.coord, SIGKILL), 0);
    int ws = pcs_test_wait(d.pid, 20000);
    if (ws == -1) { /* still polling: stop it (it stops its workers) before failing */
        kill(d.pid, SIGTERM);
        pcs_test_wait(d.pid, 20000);
    }
    char *txt = pcs_test_read_file(d.log, NULL);
    fprintf(stderr, "%s", txt ? txt : "");
    assert_true(ws != -1);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) != 0);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "the coordinator exited before job"));
    free(txt);
    demo_finish(&d);
}

/* Ctrl-C on the demo stops everything it started: pcsctl ends within seconds and neither its
 * coordinator nor any of its workers is left running. */
static void test_demo_ctrl_c_stops_coordinator_and_workers(void **state)
{
    (void)state;
    demo_run_t d;
    demo_start(&d, "demo-int");
    assert_int_equal(kill(d.pid, SIGINT), 0);
    int ws = pcs_test_wait(d.pid, 20000);
    if (ws == -1) {
        kill(d.pid, SIGKILL);
        pcs_test_wait(d.pid, 5000);
    }
    assert_true(ws != -1);
    /* the coordinator (the demo's child, reaped by it) and every worker pointed at it are gone */
    assert_true(kill(d.coord, 0) == -1);
    assert_int_equal(demo_workers_left(&d), 0);
    demo_finish(&d);
}

/* pcsctl demo killed outright (SIGKILL, or SIGPIPE from `pcsctl demo | head`) cannot clean up
 * itself: its coordinator and workers must still go away on their own. */
static void test_demo_killed_leaves_no_children(void **state)
{
    (void)state;
    demo_run_t d;
    demo_start(&d, "demo-kill");
    assert_int_equal(demo_workers_left(&d), 2);
    assert_int_equal(kill(d.pid, SIGKILL), 0);
    pcs_test_wait(d.pid, 5000);
    int left = -1;
    for (int waited = 0; waited < 10000 && left != 0; waited += 100) {
        left = demo_workers_left(&d) + (kill(d.coord, 0) == 0);
        if (left != 0)
            pcs_test_sleep_ms(100);
    }
    if (left != 0) { /* do not leave them running for the rest of the suite */
        char cmd[512];
        int status;
        snprintf(cmd, sizeof cmd, "pkill -KILL -f -- '--identity demo-%d-[w]'", (int)d.pid);
        free(pcs_test_run(cmd, &status));
        kill(d.coord, SIGKILL);
    }
    assert_int_equal(left, 0); /* neither worker nor the coordinator outlived pcsctl */
    demo_finish(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_trains_exports_and_matches_reference),
        cmocka_unit_test(test_demo_cleans_up_and_reuses_its_directories),
        cmocka_unit_test(test_export_of_a_non_checkpoint_fails_with_a_clear_error),
        cmocka_unit_test(test_export_by_job_id_reads_the_jobs_checkpoint),
        cmocka_unit_test(test_demo_ends_when_its_coordinator_dies),
        cmocka_unit_test(test_demo_ctrl_c_stops_coordinator_and_workers),
        cmocka_unit_test(test_demo_killed_leaves_no_children),
    };
    return cmocka_run_group_tests_name("e2e_cli", tests, NULL, NULL);
}
