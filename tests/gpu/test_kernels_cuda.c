/* Differential test of the "cuda" kernel backend against the CPU twin (STYLE.md B9): casts over
 * every fp32 bit pattern and every 16-bit pattern, misaligned/tail cases, list batching, scale,
 * accumulate, AMP unscale and the optimizers must give identical bits; sum of squares agrees to
 * fp32 rounding (different summation order). Plain C through the backend API: no CUDA headers.
 * Exits 77 (skip) when the cuda backend is not built or no device is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/half.h"
#include "test_util.h"
#include "pcs/kernels.h"

static const pcs_backend_ops_t *cpu, *gpu;
static pcs_stream_t stream;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static float rndf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0));
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(gpu->alloc(bytes, &p), PCS_OK);
    assert_non_null(p);
    return p;
}

static void h2d(void *d, const void *h, size_t bytes)
{
    assert_int_equal(gpu->copy(d, h, bytes, PCS_COPY_H2D, stream), PCS_OK);
}

static void d2h(void *h, const void *d, size_t bytes)
{
    assert_int_equal(gpu->copy(h, d, bytes, PCS_COPY_D2H, stream), PCS_OK);
    assert_int_equal(gpu->sync(stream), PCS_OK);
}

static int setup(void **state)
{
    if (pcs_backend_get("cpu", &cpu) != PCS_OK)
        return -1;
    if (pcs_backend_get("cuda", &gpu) != PCS_OK)
        return -1;
    return gpu->stream_create(&stream) == PCS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    gpu->stream_destroy(stream);
    return 0;
}

// ----------------------------------------------------------------------------
// casts

/* All 2^32 fp32 patterns in chunks: GPU cast == CPU cast, bit for bit, for bf16 and fp16. */
static void test_cuda_cast_of_every_fp32_pattern_equals_cpu_twin(void **state)
{
    const size_t chunk = (size_t)1 << 26;
    uint32_t *in = malloc(chunk * 4);
    uint16_t *want = malloc(chunk * 2), *got = malloc(chunk * 2);
    assert_non_null(in);
    assert_non_null(want);
    assert_non_null(got);
    void *din = dalloc(chunk * 4), *dout = dalloc(chunk * 2);
    const pcs_dtype_t halves[] = {PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    uint64_t bad = 0;
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += chunk) {
        for (size_t i = 0; i < chunk; i++)
            in[i] = (uint32_t)(base + i);
        h2d(din, in, chunk * 4);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(pcs_cpu_cast_array(want, halves[k], in, PCS_DTYPE_FP32, chunk),
                             PCS_OK);
            assert_int_equal(
                pcs_kernel_cast(gpu, dout, halves[k], din, PCS_DTYPE_FP32, chunk, stream), PCS_OK);
            d2h(got, dout, chunk * 2);
            if (memcmp(got, want, chunk * 2) != 0) {
                for (size_t i = 0; i < chunk; i++)
                    if (got[i] != want[i] && bad++ < 5)
                        print_message("%s 0x%08x: cuda 0x%04x cpu 0x%04x\n",
                                      pcs_dtype_name(halves[k]), in[i], got[i], want[i]);
            }
        }
    }
    gpu->free(din);
    gpu->free(dout);
    free(in);
    free(want);
    free(got);
    assert_true(bad == 0);
}

static void test_cuda_widening_of_every_16bit_pattern_equals_cpu_twin(void **state)
{
    uint16_t h[65536];
    float want[65536], got[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    void *dh = dalloc(sizeof h), *df = dalloc(sizeof got);
    h2d(dh, h, sizeof h);
    const pcs_dtype_t halves[] = {PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(pcs_cpu_cast_array(want, PCS_DTYPE_FP32, h, halves[k], 65536), PCS_OK);
        assert_int_equal(pcs_kernel_cast(gpu, df, PCS_DTYPE_FP32, dh, halves[k], 65536, stream),
                         PCS_OK);
        d2h(got, df, sizeof got);
        assert_memory_equal(got, want, sizeof got);
    }
    gpu->free(dh);
    gpu->free(df);
}

/* Every dtype pair, odd lengths, and offsets that break 16-byte alignment (scalar kernel path). */
static void test_cuda_cast_all_pairs_and_misalignments_equal_cpu_twin(void **state)
{
    const pcs_dtype_t dts[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16, PCS_DTYPE_FP64};
    const size_t n = 100003, pad = 16;
    double *vals = malloc((n + pad) * 8);
    unsigned char *src = malloc((n + pad) * 8), *want = malloc((n + pad) * 8),
                  *got = malloc((n + pad) * 8);
    assert_non_null(vals);
    assert_non_null(src);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t i = 0; i < n + pad; i++)
        vals[i] = ldexp(rndf(-1.0f, 1.0f), (int)(rnd() % 60) - 30);
    unsigned char *ds = dalloc((n + pad) * 8), *dd = dalloc((n + pad) * 8);
    for (int a = 0; a < 4; a++) {
        size_t as = pcs_dtype_size(dts[a]);
        assert_int_equal(pcs_cpu_cast_array(src, dts[a], vals, PCS_DTYPE_FP64, n + pad), PCS_OK);
        h2d(ds, src, (n + pad) * as);
        for (int b = 0; b < 4; b++) {
            size_t bs = pcs_dtype_size(dts[b]);
            for (size_t off = 0; off < 3; off++) {
                size_t len = n - off * 7;
                assert_int_equal(pcs_cpu_cast_array(want, dts[b], src + off * as, dts[a], len),
                                 PCS_OK);
                assert_int_equal(
                    pcs_kernel_cast(gpu, dd + off * bs, dts[b], ds + off * as, dts[a], len, stream),
                    PCS_OK);
                d2h(got, dd + off * bs, len * bs);
                if (memcmp(got, want, len * bs) != 0)
                    fail_msg("cast %s -> %s offset %zu differs from the cpu twin",
                             pcs_dtype_name(dts[a]), pcs_dtype_name(dts[b]), off);
            }
        }
    }
    gpu->free(ds);
    gpu->free(dd);
    free(vals);
    free(src);
    free(want);
    free(got);
}

/* 100 tensors of assorted sizes (including empty) in one list call: more than one batch. */
static void test_cuda_cast_list_of_many_small_tensors_equals_cpu_twin(void **state)
{
    enum { T = 100 };
    pcs_tensor_t hs[T], hd[T], ds[T], dd[T];
    size_t total = 0, sizes[T];
    for (int k = 0; k < T; k++) {
        sizes[k] = (k % 10 == 0) ? 0 : (size_t)(rnd() % 5000);
        total += sizes[k];
    }
    float *src = malloc(total * 4 + 4);
    uint16_t *want = malloc(total * 2 + 2), *got = malloc(total * 2 + 2);
    assert_non_null(src);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t i = 0; i < total; i++)
        src[i] = rndf(-100.0f, 100.0f);
    float *dsrc = dalloc(total * 4 + 4);
    uint16_t *ddst = dalloc(total * 2 + 2);
    h2d(dsrc, src, total * 4);
    size_t at = 0;
    for (int k = 0; k < T; k++) {
        pcs_dtype_t dt = (k & 1) ? PCS_DTYPE_BF16 : PCS_DTYPE_FP16;
        hs[k] = (pcs_tensor_t){src + at, PCS_DTYPE_FP32, sizes[k]};
        hd[k] = (pcs_tensor_t){want + at, dt, sizes[k]};
        ds[k] = (pcs_tensor_t){dsrc + at, PCS_DTYPE_FP32, sizes[k]};
        dd[k] = (pcs_tensor_t){ddst + at, dt, sizes[k]};
        at += sizes[k];
    }
    assert_int_equal(pcs_kernel_cast_list(cpu, hd, hs, T, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_cast_list(gpu, dd, ds, T, stream), PCS_OK);
    d2h(got, ddst, total * 2);
    assert_memory_equal(got, want, total * 2);
    gpu->free(dsrc);
    gpu->free(ddst);
    free(src);
    free(want);
    free(got);
}

// ----------------------------------------------------------------------------
// scale, accumulate, unscale

static void test_cuda_scale_and_accumulate_equal_cpu_twin(void **state)
{
    const size_t n = 77777;
    const pcs_dtype_t dts[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    float *vals = malloc(n * 4);
    unsigned char *a = malloc(n * 4), *b = malloc(n * 4), *got = malloc(n * 4);
    assert_non_null(vals);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(got);
    unsigned char *da = dalloc(n * 4), *db = dalloc(n * 4);
    for (int x = 0; x < 3; x++) {
        for (int y = 0; y < 3; y++) {
            size_t xs = pcs_dtype_size(dts[x]), ys = pcs_dtype_size(dts[y]);
            for (size_t i = 0; i < n; i++)
                vals[i] = rndf(-300.0f, 300.0f);
            assert_int_equal(pcs_cpu_cast_array(a, dts[x], vals, PCS_DTYPE_FP32, n), PCS_OK);
            for (size_t i = 0; i < n; i++)
                vals[i] = rndf(-3.0f, 3.0f);
            assert_int_equal(pcs_cpu_cast_array(b, dts[y], vals, PCS_DTYPE_FP32, n), PCS_OK);
            h2d(da, a, n * xs);
            h2d(db, b, n * ys);
            /* dst[x] += src[y], then dst *= 0.37 (offset by one element: unaligned path) */
            assert_int_equal(pcs_kernel_accumulate(cpu, a, dts[x], b, dts[y], n, NULL), PCS_OK);
            assert_int_equal(pcs_kernel_accumulate(gpu, da, dts[x], db, dts[y], n, stream), PCS_OK);
            assert_int_equal(pcs_kernel_scale(cpu, a + xs, dts[x], n - 1, 0.37f, NULL), PCS_OK);
            assert_int_equal(pcs_kernel_scale(gpu, da + xs, dts[x], n - 1, 0.37f, stream), PCS_OK);
            d2h(got, da, n * xs);
            if (memcmp(got, a, n * xs) != 0)
                fail_msg("accumulate/scale %s += %s differs from the cpu twin",
                         pcs_dtype_name(dts[x]), pcs_dtype_name(dts[y]));
        }
    }
    gpu->free(da);
    gpu->free(db);
    free(vals);
    free(a);
    free(b);
    free(got);
}

static void test_cuda_nonfinite_check_and_unscale_equals_cpu_twin(void **state)
{
    const size_t n = 50000;
    float *f = malloc(n * 4), *gf = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *gh = malloc(n * 2);
    assert_non_null(f);
    assert_non_null(gf);
    assert_non_null(h);
    assert_non_null(gh);
    for (size_t i = 0; i < n; i++) {
        f[i] = rndf(-1e4f, 1e4f);
        h[i] = pcs_f32_to_fp16(rndf(-1e4f, 1e4f));
    }
    float *df = dalloc(n * 4), *dflag = dalloc(8);
    uint16_t *dh = dalloc(n * 2);
    for (int round = 0; round < 2; round++) {
        if (round == 1)
            f[n / 2] = INFINITY; /* second round: one Inf in the fp32 tensor */
        h2d(df, f, n * 4);
        h2d(dh, h, n * 2);
        float flag[2] = {0.0f, 1.0f / 1024.0f}; /* found_inf, inv_scale */
        h2d(dflag, flag, 8);
        pcs_tensor_t ht[2] = {{f, PCS_DTYPE_FP32, n}, {h, PCS_DTYPE_FP16, n}};
        pcs_tensor_t dt[2] = {{df, PCS_DTYPE_FP32, n}, {dh, PCS_DTYPE_FP16, n}};
        assert_int_equal(
            pcs_kernel_nonfinite_check_and_unscale(cpu, ht, 2, &flag[0], &flag[1], NULL), PCS_OK);
        assert_int_equal(
            pcs_kernel_nonfinite_check_and_unscale(gpu, dt, 2, dflag, dflag + 1, stream), PCS_OK);
        float gflag[2];
        d2h(gflag, dflag, 8);
        d2h(gf, df, n * 4);
        d2h(gh, dh, n * 2);
        assert_true(gflag[0] == flag[0]);
        assert_true(flag[0] == (round == 1 ? 1.0f : 0.0f));
        assert_memory_equal(gf, f, n * 4);
        assert_memory_equal(gh, h, n * 2);
    }
    gpu->free(df);
    gpu->free(dh);
    gpu->free(dflag);
    free(f);
    free(gf);
    free(h);
    free(gh);
}

static void test_cuda_sum_squares_agrees_with_cpu_to_fp32_rounding(void **state)
{
    const size_t n = (size_t)3 << 20;
    float *f = malloc(n * 4);
    uint16_t *b = malloc(n * 2);
    assert_non_null(f);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        f[i] = rndf(-2.0f, 2.0f);
        b[i] = pcs_f32_to_bf16(rndf(-2.0f, 2.0f));
    }
    float *df = dalloc(n * 4), *dout = dalloc(4);
    uint16_t *db = dalloc(n * 2);
    h2d(df, f, n * 4);
    h2d(db, b, n * 2);
    pcs_tensor_t ht[3] = {{f, PCS_DTYPE_FP32, n}, {b, PCS_DTYPE_BF16, n}, {f, PCS_DTYPE_FP32, 0}};
    pcs_tensor_t dt[3] = {
        {df, PCS_DTYPE_FP32, n}, {db, PCS_DTYPE_BF16, n}, {df, PCS_DTYPE_FP32, 0}};
    float want = 0.0f, got = -1.0f;
    assert_int_equal(pcs_kernel_sum_squares_list(cpu, ht, 3, &want, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_sum_squares_list(gpu, dt, 3, dout, stream), PCS_OK);
    d2h(&got, dout, 4);
    /* both accumulate in fp64 (different order) and round once: at most 1 fp32 ulp apart */
    assert_true(fabsf(got - want) <= 1.2e-7f * want);
    gpu->free(df);
    gpu->free(db);
    gpu->free(dout);
    free(f);
    free(b);
}

// ----------------------------------------------------------------------------
// optimizers: identical bits (same PCS_HD code, no FMA contraction on either side)

static void test_cuda_adamw_and_sgd_equal_cpu_twin_bit_for_bit(void **state)
{
    const size_t n = 123457; /* odd: vector body + scalar tail */
    size_t bytes = n * 4;
    float *p = malloc(bytes), *g = malloc(bytes), *m = calloc(n, 4), *v = calloc(n, 4);
    float *got = malloc(bytes);
    assert_non_null(p);
    assert_non_null(g);
    assert_non_null(m);
    assert_non_null(v);
    assert_non_null(got);
    for (size_t i = 0; i < n; i++)
        p[i] = rndf(-1.0f, 1.0f);
    float *dp = dalloc(bytes), *dg = dalloc(bytes), *dm = dalloc(bytes), *dv = dalloc(bytes);
    h2d(dp, p, bytes);
    h2d(dm, m, bytes);
    h2d(dv, v, bytes);
    pcs_adamw_config_t ac;
    pcs_adamw_config_default(&ac);
    pcs_tensor_t hp = {p, PCS_DTYPE_FP32, n}, hg = {g, PCS_DTYPE_FP32, n};
    pcs_tensor_t hm = {m, PCS_DTYPE_FP32, n}, hv = {v, PCS_DTYPE_FP32, n};
    pcs_tensor_t tp = {dp, PCS_DTYPE_FP32, n}, tg = {dg, PCS_DTYPE_FP32, n};
    pcs_tensor_t tm = {dm, PCS_DTYPE_FP32, n}, tv = {dv, PCS_DTYPE_FP32, n};
    for (int s = 1; s <= 5; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = rndf(-0.1f, 0.1f);
        h2d(dg, g, bytes);
        assert_int_equal(pcs_kernel_adamw_update(cpu, &hp, &hg, &hm, &hv, 1, &ac, s, NULL), PCS_OK);
        assert_int_equal(pcs_kernel_adamw_update(gpu, &tp, &tg, &tm, &tv, 1, &ac, s, stream),
                         PCS_OK);
    }
    d2h(got, dp, bytes);
    assert_memory_equal(got, p, bytes);
    d2h(got, dm, bytes);
    assert_memory_equal(got, m, bytes);
    d2h(got, dv, bytes);
    assert_memory_equal(got, v, bytes);

    pcs_sgd_config_t sc;
    pcs_sgd_config_default(&sc);
    sc.lr = 0.01;
    sc.momentum = 0.9;
    sc.weight_decay = 1e-4;
    sc.nesterov = 1;
    for (int s = 1; s <= 3; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = rndf(-1.0f, 1.0f);
        h2d(dg, g, bytes);
        assert_int_equal(pcs_kernel_sgd_update(cpu, &hp, &hg, &hm, 1, &sc, s == 1, NULL), PCS_OK);
        assert_int_equal(pcs_kernel_sgd_update(gpu, &tp, &tg, &tm, 1, &sc, s == 1, stream), PCS_OK);
    }
    d2h(got, dp, bytes);
    assert_memory_equal(got, p, bytes);
    d2h(got, dm, bytes);
    assert_memory_equal(got, m, bytes);
    gpu->free(dp);
    gpu->free(dg);
    gpu->free(dm);
    gpu->free(dv);
    free(p);
    free(g);
    free(m);
    free(v);
    free(got);
}

/* fp64 shards (fp64 masters): the optimizers, the accumulation into fp64 from every float dtype,
 * the unscale and the scale by a double factor, bit for bit with the cpu twin; the fp64 sum of
 * squares to fp32 rounding. */
static void test_cuda_fp64_ops_equal_cpu_twin(void **state)
{
    const size_t n = 10007;
    const size_t bytes = n * 8;
    double *p = malloc(bytes), *g = malloc(bytes), *m = calloc(n, 8), *v = calloc(n, 8);
    double *got = malloc(bytes);
    float *f = malloc(n * 4);
    uint16_t *h = malloc(n * 2);
    assert_true(p && g && m && v && got && f && h);
    for (size_t i = 0; i < n; i++)
        p[i] = (double)rndf(-1.0f, 1.0f) / 3.0;
    double *dp = dalloc(bytes), *dg = dalloc(bytes), *dm = dalloc(bytes), *dv = dalloc(bytes);
    float *df = dalloc(n * 4), *dflag = dalloc(8);
    uint16_t *dh = dalloc(n * 2);
    h2d(dp, p, bytes);
    h2d(dm, m, bytes);
    h2d(dv, v, bytes);
    pcs_adamw_config_t ac;
    pcs_adamw_config_default(&ac);
    ac.weight_decay = 0.1;
    pcs_tensor_t hp = {p, PCS_DTYPE_FP64, n}, hg = {g, PCS_DTYPE_FP64, n};
    pcs_tensor_t hm = {m, PCS_DTYPE_FP64, n}, hv = {v, PCS_DTYPE_FP64, n};
    pcs_tensor_t tp = {dp, PCS_DTYPE_FP64, n}, tg = {dg, PCS_DTYPE_FP64, n};
    pcs_tensor_t tm = {dm, PCS_DTYPE_FP64, n}, tv = {dv, PCS_DTYPE_FP64, n};
    for (int s = 1; s <= 3; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = (double)rndf(-0.1f, 0.1f) / 7.0;
        h2d(dg, g, bytes);
        assert_int_equal(pcs_kernel_adamw_update(cpu, &hp, &hg, &hm, &hv, 1, &ac, s, NULL), PCS_OK);
        assert_int_equal(pcs_kernel_adamw_update(gpu, &tp, &tg, &tm, &tv, 1, &ac, s, stream),
                         PCS_OK);
    }
    pcs_sgd_config_t sc;
    pcs_sgd_config_default(&sc);
    sc.lr = 0.01;
    sc.momentum = 0.9;
    sc.nesterov = 1;
    for (int s = 1; s <= 3; s++) {
        assert_int_equal(pcs_kernel_sgd_update(cpu, &hp, &hg, &hm, 1, &sc, s == 1, NULL), PCS_OK);
        assert_int_equal(pcs_kernel_sgd_update(gpu, &tp, &tg, &tm, 1, &sc, s == 1, stream), PCS_OK);
    }
    d2h(got, dp, bytes);
    assert_memory_equal(got, p, bytes);
    d2h(got, dm, bytes);
    assert_memory_equal(got, m, bytes);
    d2h(got, dv, bytes);
    assert_memory_equal(got, v, bytes);
    /* p += fp32, bf16, fp16, fp64 sources (offset by one element: the unaligned path), then
     * scaled by 1/3 in double */
    for (size_t i = 0; i < n; i++) {
        f[i] = rndf(-3.0f, 3.0f);
        h[i] = pcs_f32_to_bf16(rndf(-3.0f, 3.0f));
    }
    h2d(df, f, n * 4);
    h2d(dh, h, n * 2);
    const struct {
        const void *hs, *ds;
        pcs_dtype_t dt;
    } src[4] = {{f, df, PCS_DTYPE_FP32},
                {h, dh, PCS_DTYPE_BF16},
                {h, dh, PCS_DTYPE_FP16},
                {g, dg, PCS_DTYPE_FP64}};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(pcs_kernel_accumulate(cpu, p + 1, PCS_DTYPE_FP64, src[k].hs, src[k].dt,
                                               n - 1, NULL),
                         PCS_OK);
        assert_int_equal(pcs_kernel_accumulate(gpu, dp + 1, PCS_DTYPE_FP64, src[k].ds, src[k].dt,
                                               n - 1, stream),
                         PCS_OK);
    }
    /* and an fp64 source into fp32 and bf16 destinations (cast first, then their own sum) */
    assert_int_equal(pcs_kernel_accumulate(cpu, f, PCS_DTYPE_FP32, g, PCS_DTYPE_FP64, n, NULL),
                     PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(gpu, df, PCS_DTYPE_FP32, dg, PCS_DTYPE_FP64, n, stream),
                     PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(cpu, h, PCS_DTYPE_BF16, g, PCS_DTYPE_FP64, n, NULL),
                     PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(gpu, dh, PCS_DTYPE_BF16, dg, PCS_DTYPE_FP64, n, stream),
                     PCS_OK);
    float *gotf = malloc(n * 4);
    uint16_t *goth = malloc(n * 2);
    assert_true(gotf && goth);
    d2h(gotf, df, n * 4);
    d2h(goth, dh, n * 2);
    assert_memory_equal(gotf, f, n * 4);
    assert_memory_equal(goth, h, n * 2);
    free(gotf);
    free(goth);
    assert_int_equal(pcs_kernel_scale(cpu, p, PCS_DTYPE_FP64, n, 1.0 / 3.0, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_scale(gpu, dp, PCS_DTYPE_FP64, n, 1.0 / 3.0, stream), PCS_OK);
    /* unscale by 1/1024 with one NaN */
    p[n / 2] = NAN;
    h2d(dp + n / 2, p + n / 2, 8);
    float flag[2] = {0.0f, 1.0f / 1024.0f}, gflag[2];
    h2d(dflag, flag, 8);
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &hp, 1, &flag[0], &flag[1], NULL),
                     PCS_OK);
    assert_int_equal(
        pcs_kernel_nonfinite_check_and_unscale(gpu, &tp, 1, dflag, dflag + 1, stream), PCS_OK);
    d2h(gflag, dflag, 8);
    d2h(got, dp, bytes);
    assert_true(flag[0] == 1.0f && gflag[0] == 1.0f);
    assert_memory_equal(got, p, bytes);
    /* sum of squares of an fp64 tensor (no NaN): fp64 sums in two orders, one fp32 rounding */
    float want = 0.0f, sgot = -1.0f;
    assert_int_equal(pcs_kernel_sum_squares(cpu, g, PCS_DTYPE_FP64, n, &want, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_sum_squares(gpu, dg, PCS_DTYPE_FP64, n, dflag, stream), PCS_OK);
    d2h(&sgot, dflag, 4);
    assert_true(fabsf(sgot - want) <= 1.2e-7f * want);
    gpu->free(dp);
    gpu->free(dg);
    gpu->free(dm);
    gpu->free(dv);
    gpu->free(df);
    gpu->free(dh);
    gpu->free(dflag);
    free(p);
    free(g);
    free(m);
    free(v);
    free(got);
    free(f);
    free(h);
}

// ----------------------------------------------------------------------------
// memory, events, fill, bad input

static void test_cuda_fill_copy_and_events_order_work_across_streams(void **state)
{
    const size_t n = 1 << 20;
    pcs_stream_t s2 = NULL;
    pcs_event_t e = NULL;
    assert_int_equal(gpu->stream_create(&s2), PCS_OK);
    assert_int_equal(gpu->event_create(&e), PCS_OK);
    uint16_t *d = dalloc(n * 2), *d2 = dalloc(n * 2);
    uint16_t *h = NULL;
    assert_int_equal(gpu->host_alloc(n * 2, (void **)&h), PCS_OK);
    assert_int_equal(pcs_kernel_fill(gpu, d, PCS_DTYPE_BF16, n, 0.1, stream), PCS_OK);
    assert_int_equal(gpu->event_record(e, stream), PCS_OK);
    assert_int_equal(gpu->stream_wait_event(s2, e), PCS_OK); /* s2 sees the fill */
    assert_int_equal(gpu->copy(d2, d, n * 2, PCS_COPY_D2D, s2), PCS_OK);
    assert_int_equal(gpu->copy(h, d2, n * 2, PCS_COPY_D2H, s2), PCS_OK);
    assert_int_equal(gpu->sync(s2), PCS_OK);
    uint16_t want = pcs_f32_to_bf16(0.1f);
    for (size_t i = 0; i < n; i += 4099)
        assert_int_equal(h[i], want);
    assert_int_equal(h[n - 1], want);
    assert_int_equal(gpu->event_sync(e), PCS_OK);
    gpu->host_free(h);
    gpu->free(d);
    gpu->free(d2);
    gpu->event_destroy(e);
    gpu->stream_destroy(s2);
}

static void test_cuda_bad_input_gets_a_status_never_a_crash(void **state)
{
    char *d = dalloc(64);
    assert_int_equal(pcs_kernel_cast(gpu, NULL, PCS_DTYPE_BF16, d, PCS_DTYPE_FP32, 4, stream),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_cast(gpu, d, PCS_DTYPE_BF16, d + 2, PCS_DTYPE_FP32, 4, stream),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_cast(gpu, d, PCS_DTYPE_INT64, d, PCS_DTYPE_FP32, 4, stream),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_cast(gpu, NULL, PCS_DTYPE_BF16, NULL, PCS_DTYPE_FP32, 0, stream),
                     PCS_OK);
    assert_int_equal(gpu->copy(d, NULL, 4, PCS_COPY_D2D, stream), PCS_ERR_INVALID_ARG);
    assert_int_equal(gpu->sync(stream), PCS_OK);
    gpu->free(d);
}

int main(void)
{
    pcs_backend_simulate_cuda(pcs_test_simulated_cuda_devices());
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get("cuda", &be) != PCS_OK) {
        printf("# skipped: %s\n", pcs_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_widening_of_every_16bit_pattern_equals_cpu_twin),
        cmocka_unit_test(test_cuda_cast_all_pairs_and_misalignments_equal_cpu_twin),
        cmocka_unit_test(test_cuda_cast_list_of_many_small_tensors_equals_cpu_twin),
        cmocka_unit_test(test_cuda_scale_and_accumulate_equal_cpu_twin),
        cmocka_unit_test(test_cuda_nonfinite_check_and_unscale_equals_cpu_twin),
        cmocka_unit_test(test_cuda_sum_squares_agrees_with_cpu_to_fp32_rounding),
        cmocka_unit_test(test_cuda_adamw_and_sgd_equal_cpu_twin_bit_for_bit),
        cmocka_unit_test(test_cuda_fp64_ops_equal_cpu_twin),
        cmocka_unit_test(test_cuda_fill_copy_and_events_order_work_across_streams),
        cmocka_unit_test(test_cuda_bad_input_gets_a_status_never_a_crash),
        cmocka_unit_test(test_cuda_cast_of_every_fp32_pattern_equals_cpu_twin),
    };
    return cmocka_run_group_tests_name("kernels_cuda", tests, setup, teardown);
}
