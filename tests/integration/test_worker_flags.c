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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_on_a_cpu_worker_is_refused_at_start),
        cmocka_unit_test(test_unknown_backend_and_transport_are_refused_at_start),
        cmocka_unit_test(test_bad_device_is_a_usage_error),
        cmocka_unit_test(test_cuda_backend_starts_only_where_a_device_is),
        cmocka_unit_test(test_list_workers_shows_what_each_worker_offers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
