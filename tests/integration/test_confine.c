/* A job spec cannot reach files outside the worker's roots (issue 12, DESIGN.md §10), on a real
 * pcs-coordinator and real pcs-worker processes whose --root is the test's directory:
 *  - paths whose `..` climbs above their start are refused at SubmitJob, naming the field;
 *  - an absolute path elsewhere, and a symlink inside the root that leads out of it, fail the job
 *    at start with a reason naming the field, and nothing of the target is read;
 *  - a FIFO as init.from fails the job at once (no wedged worker);
 *  - a file that is not what the field needs fails without a byte of it in the reason, which any
 *    viewer can read ("SECRET42" once leaked as a header length);
 *  - a step directory planted as a symlink into another directory is never entered by the prune;
 *  - two jobs sharing a checkpoint root keep each other's steps, each in <dir>/<job id>; a new
 *    coordinator's job-1 finds the old job-1's directory claimed and touches nothing in it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "pcs/clock.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define FAILED    PCS__V1__JOB_STATE__JOB_STATE_FAILED
#define SUCCEEDED PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED

static const char k_job_fmt[] = "name: %s\n"
                                "model:\n"
                                "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                                "mesh:\n"
                                "  - {dim: dp_shard, size: 1}\n"
                                "training: {steps: 3, micro_batch_size: 4,"
                                " optimizer: {sgd: {lr: 0.1}}}\n"
                                "%s";

static e2e_cluster_t g_cl;
static char *g_outside; /* a directory beside the root, with a secret in it */

static int setup(void **state)
{
    (void)state;
    memset(&g_cl, 0, sizeof g_cl);
    if (e2e_start(&g_cl, "confine") != 0)
        return -1;
    g_outside = pcs_test_tmpdir("confine-outside");
    char path[1200];
    snprintf(path, sizeof path, "%s/secret.safetensors", g_outside);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs("SECRET42 the outside world", f);
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    e2e_stop(&g_cl);
    pcs_test_rmtree(g_outside);
    free(g_outside);
    return 0;
}

static void put(const char *rel, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", g_cl.dir, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Submit a 1-rank job with `extra` spec lines on one fresh worker (more args appended to it) and
 * wait for its end. Returns the job's state; reason filled. The checkpoint dir is left to the
 * spec (e2e_submit sets one: the yaml's own `checkpoint:` overrides it below). */
static int run_one(const char *name, const char *extra, const char *const *wargs, e2e_job_t *job)
{
    char yaml[2048];
    snprintf(yaml, sizeof yaml, k_job_fmt, name, extra);
    memset(job, 0, sizeof *job);
    assert_int_equal(e2e_spawn_workers(&g_cl, 1, wargs), 0);
    assert_int_equal(e2e_submit(&g_cl, yaml, name, job), 0);
    assert_int_equal(e2e_wait_job(&g_cl, job, 60000), 0);
    return job->state;
}

static void expect_failed(const e2e_job_t *job, const char *needle)
{
    if (job->state != FAILED || !strstr(job->reason, needle))
        fail_msg("job %s: state %d, reason '%s' (wanted FAILED with '%s')", job->job_id,
                 job->state, job->reason, needle);
    assert_null(strstr(job->reason, "SECRET"));
    assert_null(strstr(job->reason, "3617609057394967891"));
    assert_null(strstr(job->reason, "outside world"));
}

static void test_spec_paths_outside_the_roots_fail_naming_the_field(void **state)
{
    (void)state;
    /* refused at SubmitJob: the coordinator can tell from the text */
    e2e_job_t job;
    memset(&job, 0, sizeof job);
    char yaml[2048];
    snprintf(yaml, sizeof yaml, k_job_fmt, "climb",
             "init: {from: '../confine-outside/secret.safetensors'}\n");
    assert_int_not_equal(e2e_submit(&g_cl, yaml, "climb", &job), 0);

    /* an absolute path elsewhere: the worker refuses it */
    char extra[1400];
    snprintf(extra, sizeof extra, "init: {from: '%s/secret.safetensors'}\n", g_outside);
    run_one("abs", extra, NULL, &job);
    expect_failed(&job, "init.from: ");
    assert_non_null(strstr(job.reason, "is outside the worker's init root"));
    e2e_job_free(&job);

    /* a link inside the root that leads out of it */
    char link[1200], target[1200];
    snprintf(target, sizeof target, "%s/secret.safetensors", g_outside);
    snprintf(link, sizeof link, "%s/data-link.safetensors", g_cl.dir);
    assert_int_equal(symlink(target, link), 0);
    run_one("link", "data: {file: {path: data-link.safetensors, inputs: x, targets: y}}\n", NULL,
            &job);
    expect_failed(&job, "data.file.path: ");
    assert_non_null(strstr(job.reason, "absolute symlink"));
    e2e_job_free(&job);

    /* a file inside the root that is not a safetensors file: no byte of it in the reason */
    put("notes.safetensors", "SECRET42 is not a tensor file");
    run_one("bytes", "init: {from: notes.safetensors}\n", NULL, &job);
    expect_failed(&job, "init.from: ");
    assert_non_null(strstr(job.reason, "not a safetensors file"));
    e2e_job_free(&job);

    /* a FIFO fails at once */
    char fifo[1200];
    snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", g_cl.dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    uint64_t t0 = pcs_now_ms();
    run_one("fifo", "init: {from: pipe.safetensors}\n", NULL, &job);
    expect_failed(&job, "not a regular file (a FIFO)");
    assert_true(pcs_now_ms() - t0 < 30000);
    e2e_job_free(&job);

    /* a root given to the worker elsewhere: the same relative path now means another file */
    char other[1200];
    snprintf(other, sizeof other, "%s/r2", g_cl.dir);
    assert_int_equal(mkdir(other, 0755), 0);
    const char *const init_root[] = {"--init-root", other, NULL};
    run_one("root", "init: {from: notes.safetensors}\n", init_root, &job);
    expect_failed(&job, "init.from notes.safetensors: No such file");
    e2e_job_free(&job);
}

static int exists(const char *dir, const char *rel)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static void test_checkpoints_stay_in_the_jobs_own_directory(void **state)
{
    (void)state;
    /* a victim directory beside the root, with files under pcs' names */
    static const char *const names[] = {"COMPLETE", "plan.pb", "rank-00000.safetensors", "x.tmp"};
    char victim[1200], path[1400];
    snprintf(victim, sizeof victim, "%s/victim", g_outside);
    assert_int_equal(mkdir(victim, 0755), 0);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", victim, names[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    }
    /* job-1 and job-2 share the checkpoint root "shared"; in job-1's directory a step that its
     * prune will remove is planted as a link to the victim */
    char jd[1200];
    snprintf(jd, sizeof jd, "%s/shared/job-1", g_cl.dir);
    snprintf(path, sizeof path, "%s/shared", g_cl.dir);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(mkdir(jd, 0755), 0);
    snprintf(path, sizeof path, "%s/step-00000009", jd);
    assert_int_equal(symlink(victim, path), 0);
    const char *ck = "checkpoint: {dir: shared, every_steps: 1, keep_last: 1}\n";
    e2e_job_t a, b;
    assert_int_equal(run_one("share-a", ck, NULL, &a), SUCCEEDED);
    assert_string_equal(a.job_id, "job-1");
    assert_int_equal(run_one("share-b", ck, NULL, &b), SUCCEEDED);
    assert_string_equal(b.job_id, "job-2");
    for (int i = 0; i < 4; i++)
        assert_true(exists(victim, names[i])); /* the link was never followed */
    assert_true(exists(jd, "step-00000009"));  /* nor removed: it is not pcs' */
    assert_true(exists(jd, "step-00000003"));  /* job-1's last step, kept by job-2's prune */
    assert_false(exists(jd, "step-00000002")); /* its own prune (keep_last 1) */
    char jd2[1200];
    snprintf(jd2, sizeof jd2, "%s/shared/job-2", g_cl.dir);
    assert_true(exists(jd2, "step-00000003"));
    char out[1400];
    snprintf(out, sizeof out, "%s/a.safetensors", g_cl.dir);
    assert_int_equal(pcs_ckpt_export(jd, 0, out, NULL), PCS_OK);
    e2e_job_free(&a);
    e2e_job_free(&b);

    /* a new coordinator (its own memory) hands out job-1 again, into the same root */
    kill(g_cl.coord, SIGKILL);
    pcs_test_wait(g_cl.coord, 5000);
    int port = e2e_free_port();
    static const char *const fresh[] = {"--db", ":memory:", NULL};
    assert_int_equal(e2e_start_coord_at(&g_cl, port, fresh), 0);
    e2e_job_t c;
    run_one("again", ck, NULL, &c);
    assert_string_equal(c.job_id, "job-1");
    expect_failed(&c, "holds the checkpoints of another job job-1");
    assert_true(exists(jd, "step-00000003")); /* untouched */
    assert_int_equal(pcs_ckpt_export(jd, 0, out, NULL), PCS_OK);
    e2e_job_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_spec_paths_outside_the_roots_fail_naming_the_field,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoints_stay_in_the_jobs_own_directory, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("confine", tests, NULL, NULL);
}
