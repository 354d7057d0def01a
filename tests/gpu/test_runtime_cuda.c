/* The unit runtime on device memory against the same sequence on the cpu backend: a few steps of
 * unshard / synthetic gradients (computed on the host from the gathered parameters, copied H2D on
 * the compute stream) / post_backward / optimizer_step (AdamW, grad scaler, an injected +Inf,
 * clipping that never scales) on the cuda backend, then the shards, optimizer state and gathered
 * parameters compared with the cpu backend's. Cast and optimizer kernels are bit-exact to the CPU
 * twin (kernels/src/ops_cuda.cu), Gloo's reductions are fixed-order, so a world of one with NCCL
 * and W=2 with Gloo through host staging must give identical bits; only the grad norm (sum of
 * squares: per-block partials on cuda, within 1 fp32 ulp) gets a tolerance. W=2 with NCCL needs a
 * device per rank (skipped otherwise); NCCL's ring sums may differ in order from Gloo's, so it is
 * held to a relative 1e-6 (for 2 ranks fp32 a + b is commutative, so equal bits are expected).
 * Every scenario runs in forked processes (CUDA must not be initialized before a fork). Exits 77
 * when no CUDA device (or no cuda backend) is present. Built in every build: with
 * PCS_SIMULATE_CUDA=1 (test_runtime_cuda_sim) the W=2 Gloo-staged case runs on the simulated
 * device (queued streams, stream-ordered allocations, NaN-fresh buffers) and the NCCL cases are
 * skipped (NCCL is not simulated). The plan, step sequence and comparison are
 * tests/support/runtime_harness.c, shared with tests/unit/test_runtime.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/kv.h"
#include "pcs/kernels.h"
#include "worker/runtime.h"
#include "runtime_harness.h"
#include "test_util.h"

enum { ONE_NCCL = 0, TWO_GLOO_STAGED = 1, TWO_NCCL = 2 };

/* Set in main from a forked probe: the "cuda" backend is the simulator (PCS_SIMULATE_CUDA=1). */
static int g_simulated;

static uint32_t world_of(int mode)
{
    return mode == ONE_NCCL ? 1 : 2;
}

/* Two units, bf16 params and fp32 reduce: unit 0 sharded over the ranks (reduce-scatter AVG;
 * replicated in a world of one), unit 1 replicated (averaged over the ranks, no planned
 * collective). Odd sizes, so the sharded unit has padding (tests/support/runtime_harness.c). */
static const uint64_t k_numel[PCS_RTH_UNITS] = {1999, 77};

/* Rank `r` of mode's world: the cuda run, then the cpu run of the same sequence, compared.
 * Exit 3: not enough devices. */
static int rank_main(const char *kvdir, uint32_t r, void *arg)
{
    int mode = *(const int *)arg;
    const pcs_backend_ops_t *cu = NULL;
    if (pcs_backend_get("cuda", &cu) != PCS_OK)
        return 2;
    /* NCCL between ranks: one device per rank; every rank decides alike (a rank that went on
     * alone would wait for its peer's rendezvous until the timeout) */
    int device = mode == TWO_NCCL ? (int)r : 0;
    if (mode == TWO_NCCL && cu->device_count() < 2)
        return 3;
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 4;
    pcs_rth_result_t g, c;
    memset(&g, 0, sizeof g);
    memset(&c, 0, sizeof c);
    pcs_rth_run_t run;
    memset(&run, 0, sizeof run);
    run.backend = "cuda";
    run.device = device;
    run.coll = mode == TWO_GLOO_STAGED ? PCS_COLL_GLOO : PCS_COLL_NCCL;
    run.layout = PCS_RTH_FULL;
    run.world = world_of(mode);
    run.rank = r;
    run.numel = k_numel;
    run.job_tag = "cuda-";
    run.kv = kv;
    run.clip_norm = 1e30; /* norm computed and reduced, never scales */
    int rv = pcs_rth_run_steps(&run, &g);
    if (!rv) {
        run.backend = "cpu";
        run.device = 0;
        run.coll = PCS_COLL_GLOO;
        run.job_tag = "cpu-";
        rv = pcs_rth_run_steps(&run, &c);
    }
    /* the scaler verdict is the same everywhere; the norm within fp32 rounding of the sum of
     * squares (not used to scale: clip_norm is huge) */
    if (!rv)
        rv = pcs_rth_compare(&g, &c, mode == TWO_NCCL ? 1e-6 : 0, 1e-6, r,
                             "cuda run differs from cpu");
    pcs_rth_result_free(&g);
    pcs_rth_result_free(&c);
    pcs_kv_destroy(kv);
    return rv;
}

static void run_mode(int mode)
{
    /* NCCL is not simulated: it cannot use the simulator's buffers */
    if (g_simulated && mode != TWO_GLOO_STAGED)
        skip();
    uint32_t w = world_of(mode);
    int codes[2] = {0, 0};
    pcs_rth_fork_ranks("rt-cuda", w, rank_main, &mode, 240000, codes);
    if (codes[0] == 3 || codes[1] == 3)
        skip(); /* one device: NCCL between ranks needs one per rank */
    for (uint32_t r = 0; r < w; r++)
        assert_int_equal(codes[r], 0);
}

static void test_world_of_one_nccl_on_device_matches_cpu_bit_for_bit(void **s)
{
    (void)s;
    run_mode(ONE_NCCL);
}

static void test_two_ranks_gloo_staged_on_one_device_match_cpu_bit_for_bit(void **s)
{
    (void)s;
    run_mode(TWO_GLOO_STAGED);
}

static void test_two_ranks_nccl_on_two_devices_match_cpu(void **s)
{
    (void)s;
    run_mode(TWO_NCCL);
}

int main(void)
{
    pcs_backend_simulate_cuda(pcs_test_simulated_cuda_devices()); /* the forked ranks inherit it */
    fflush(NULL);
    pid_t probe = fork();
    if (probe == 0) {
        const pcs_backend_ops_t *be = NULL;
        if (pcs_backend_get("cuda", &be) != PCS_OK)
            _exit(77);
        _exit(pcs_backend_is_simulated(be) ? 1 : 0);
    }
    int stt = 0;
    if (probe < 0 || waitpid(probe, &stt, 0) < 0 || !WIFEXITED(stt) ||
        (WEXITSTATUS(stt) != 0 && WEXITSTATUS(stt) != 1)) {
        fprintf(stderr, "no CUDA device or cuda backend: skipping\n");
        return 77;
    }
    g_simulated = WEXITSTATUS(stt) == 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_one_nccl_on_device_matches_cpu_bit_for_bit),
        cmocka_unit_test(test_two_ranks_gloo_staged_on_one_device_match_cpu_bit_for_bit),
        cmocka_unit_test(test_two_ranks_nccl_on_two_devices_match_cpu),
    };
    return cmocka_run_group_tests_name("runtime_cuda", tests, NULL, NULL);
}
