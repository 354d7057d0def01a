/* NCCL backend against its CPU twin (the Gloo backend's documented arithmetic): device buffers,
 * every op and dtype, avg and pre/post divide factors, and stream ordering (a fill queued on the
 * caller's stream right before the collective must be seen by it; the D2H copy queued right
 * after must see its result). One rank per GPU: the 2-rank case needs 2 devices. Exits 77 when
 * no CUDA device (or no cuda backend) is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/kv.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "test_util.h"

static const pcs_backend_ops_t *be;
static const pcs_dtype_t dtypes[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};

static float ld(const void *p, size_t i, pcs_dtype_t dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void st(void *p, size_t i, pcs_dtype_t dt, float v)
{
    if (dt == PCS_DTYPE_BF16)
        ((uint16_t *)p)[i] = pcs_f32_to_bf16(v);
    else if (dt == PCS_DTYPE_FP16)
        ((uint16_t *)p)[i] = pcs_f32_to_fp16(v);
    else
        ((float *)p)[i] = v;
}

static float val(int r, size_t i)
{
    return (float)((int)((i * 2654435761u + (unsigned)r * 40503u) % 2001u) - 1000) / 64.0f;
}

static pcs_coll_t *open_comm(const char *dir, int rank, int size, pcs_kv_t **kv)
{
    assert_int_equal(pcs_kv_file_create(dir, kv), PCS_OK);
    pcs_coll_config_t cfg = {0};
    cfg.backend = PCS_COLL_NCCL;
    cfg.kv = *kv;
    cfg.group_name = "gpu";
    cfg.rank = rank;
    cfg.size = size;
    cfg.timeout_ms = 30000;
    cfg.cuda_device = rank;
    pcs_coll_t *c = NULL;
    pcs_status_t rc = pcs_coll_create(&cfg, &c);
    if (rc != PCS_OK)
        fprintf(stderr, "create: %s\n", pcs_last_error());
    assert_int_equal(rc, PCS_OK);
    return c;
}

/* Single rank: the results equal the CPU twin bit for bit (factors are powers of two, so the
 * single pre-multiply NCCL applies and the twin's two roundings agree). */
static void test_single_gpu_ops_match_cpu_twin_and_respect_stream_order(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("nccl1");
    pcs_kv_t *kv;
    pcs_coll_t *c = open_comm(dir, 0, 1, &kv);
    pcs_stream_t strm = NULL;
    assert_int_equal(be->stream_create(&strm), PCS_OK);
    const size_t n = 100003;
    for (size_t d = 0; d < 3; d++) {
        pcs_dtype_t dt = dtypes[d];
        size_t es = pcs_dtype_size(dt);
        void *hin = malloc(n * es), *hout = malloc(n * es), *want = malloc(n * es);
        void *din = NULL, *dout = NULL;
        assert_int_equal(be->alloc(n * es, &din), PCS_OK);
        assert_int_equal(be->alloc(n * es, &dout), PCS_OK);
        for (size_t i = 0; i < n; i++)
            st(hin, i, dt, val(0, i));

        /* all_reduce sum with pre 2 / post 4 */
        pcs_coll_red_t red = {PCS_RED_SUM, 2.0, 4.0};
        assert_int_equal(be->copy(din, hin, n * es, PCS_COPY_H2D, strm), PCS_OK);
        assert_int_equal(pcs_coll_all_reduce(c, din, dout, n, dt, &red, strm), PCS_OK);
        assert_int_equal(be->copy(hout, dout, n * es, PCS_COPY_D2H, strm), PCS_OK);
        assert_int_equal(be->sync(strm), PCS_OK);
        pcs_coll_scale(want, hin, n, dt, 0.5f);
        pcs_coll_scale(want, want, n, dt, 0.25f);
        assert_memory_equal(hout, want, n * es);

        /* reduce_scatter avg (size 1: factor 1) */
        red = (pcs_coll_red_t){PCS_RED_AVG, 0, 0};
        assert_int_equal(pcs_coll_reduce_scatter(c, din, dout, n, dt, &red, strm), PCS_OK);
        assert_int_equal(be->copy(hout, dout, n * es, PCS_COPY_D2H, strm), PCS_OK);
        assert_int_equal(be->sync(strm), PCS_OK);
        assert_memory_equal(hout, hin, n * es);

        /* stream order: fill on the caller's stream, then all_gather, then copy back */
        assert_int_equal(pcs_kernel_fill(be, din, dt, n, 3.0, strm), PCS_OK);
        assert_int_equal(pcs_coll_all_gather(c, din, dout, n, dt, strm), PCS_OK);
        assert_int_equal(be->copy(hout, dout, n * es, PCS_COPY_D2H, strm), PCS_OK);
        assert_int_equal(be->sync(strm), PCS_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(ld(hout, i, dt) == 3.0f);

        assert_int_equal(pcs_coll_broadcast(c, dout, n, dt, 0, strm), PCS_OK);
        assert_int_equal(pcs_coll_barrier(c), PCS_OK);
        be->free(din);
        be->free(dout);
        free(hin);
        free(hout);
        free(want);
    }
    be->stream_destroy(strm);
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    pcs_test_rmtree(dir);
    free(dir);
}

/* Two ranks on two GPUs: sums agree with the CPU ring reference within the documented
 * tolerance (NCCL may pick another order: |err| <= 2 ulp of the dtype at the result's scale). */
static int two_rank_child(int rank, const char *dir)
{
    if (pcs_backend_get("cuda", &be) != PCS_OK)
        return 2;
    pcs_kv_t *kv;
    if (pcs_kv_file_create(dir, &kv) != PCS_OK)
        return 2;
    pcs_coll_config_t cfg = {0};
    cfg.backend = PCS_COLL_NCCL;
    cfg.kv = kv;
    cfg.group_name = "gpu2";
    cfg.rank = rank;
    cfg.size = 2;
    cfg.timeout_ms = 30000;
    cfg.cuda_device = rank;
    pcs_coll_t *c = NULL;
    pcs_status_t rc = pcs_coll_create(&cfg, &c);
    if (rc == PCS_ERR_INVALID_ARG)
        return 3; /* fewer than 2 devices */
    if (rc != PCS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, pcs_last_error());
        return 1;
    }
    const size_t n = 65537;
    int bad = 0;
    for (size_t d = 0; d < 3 && !bad; d++) {
        pcs_dtype_t dt = dtypes[d];
        size_t es = pcs_dtype_size(dt);
        void *hin = malloc(2 * n * es), *hout = malloc(2 * n * es);
        void *din = NULL, *dout = NULL;
        if (be->alloc(2 * n * es, &din) != PCS_OK || be->alloc(2 * n * es, &dout) != PCS_OK)
            return 1;
        for (size_t i = 0; i < 2 * n; i++)
            st(hin, i, dt, val(rank, i));
        pcs_coll_red_t red = {PCS_RED_AVG, 0, 0};
        be->copy(din, hin, 2 * n * es, PCS_COPY_H2D, NULL);
        if (pcs_coll_reduce_scatter(c, din, dout, n, dt, &red, NULL) != PCS_OK)
            return 1;
        be->copy(hout, dout, n * es, PCS_COPY_D2H, NULL);
        be->sync(NULL);
        double ulp = dt == PCS_DTYPE_BF16 ? 1.0 / 128 : dt == PCS_DTYPE_FP16 ? 1.0 / 1024 : 1e-7;
        for (size_t i = 0; i < n && !bad; i++) {
            size_t gi = (size_t)rank * n + i;
            uint8_t tmp[4];
            st(tmp, 0, dt, val(0, gi));
            float x0 = ld(tmp, 0, dt);
            st(tmp, 0, dt, val(1, gi));
            float x1 = ld(tmp, 0, dt);
            double a = ((double)x0 + (double)x1) / 2.0;
            if (fabs(ld(hout, i, dt) - a) > 2 * ulp * (fabs(a) + 1e-3))
                bad = 1;
        }
        be->free(din);
        be->free(dout);
        free(hin);
        free(hout);
    }
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return bad;
}

static void test_two_gpus_reduce_scatter_avg_within_two_ulps_of_cpu(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("nccl2");
    pid_t pids[2];
    fflush(NULL);
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(two_rank_child(r, dir));
    }
    int codes[2];
    for (int r = 0; r < 2; r++) {
        int stt = pcs_test_wait(pids[r], 120000);
        if (stt == -1)
            pcs_test_stop(pids[r], 100);
        assert_true(stt != -1 && WIFEXITED(stt));
        codes[r] = WEXITSTATUS(stt);
    }
    pcs_test_rmtree(dir);
    free(dir);
    if (codes[0] == 3 || codes[1] == 3)
        skip(); /* one GPU: the multi-rank case needs one device per rank */
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

static int setup_cuda(void **s)
{
    (void)s;
    return pcs_backend_get("cuda", &be) == PCS_OK ? 0 : -1;
}

/* CUDA must not be initialized in a process that forks ranks afterwards, so the device probe
 * runs in a child and the forking test runs before the in-process one. */
int main(void)
{
    fflush(NULL);
    pid_t probe = fork();
    if (probe == 0)
        _exit(pcs_backend_get("cuda", &be) == PCS_OK ? 0 : 77);
    int stt = 0;
    if (probe < 0 || waitpid(probe, &stt, 0) < 0 || !WIFEXITED(stt) || WEXITSTATUS(stt) != 0) {
        fprintf(stderr, "no CUDA device or cuda backend: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_gpus_reduce_scatter_avg_within_two_ulps_of_cpu),
        cmocka_unit_test_setup(test_single_gpu_ops_match_cpu_twin_and_respect_stream_order,
                               setup_cuda),
    };
    return cmocka_run_group_tests_name("coll_nccl", tests, NULL, NULL);
}
