/* Unit tests of the CPU kernel backend (the reference twin): backend registry, cast special
 * values and every dtype pair, SIMD vs scalar identity, scale/accumulate rounding, the AMP
 * non-finite check, sum of squares, SGD/AdamW against double-precision references, fill/copy,
 * and bad input. References come from test_kernels_ref.h, not from pcs/half.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h" /* pcs_adamw_coef / pcs_sgd_coef: the host-side scalars */
#include "pcs/half.h"
#include "pcs/kernel_math.h"
#include "pcs/kernels.h"
#include "test_kernels_ref.h"

static const pcs_backend_ops_t *cpu;
static ref_fmt_t BF, FP;

static int setup(void **state)
{
    ref_bf16(&BF);
    ref_fp16(&FP);
    return pcs_backend_get("cpu", &cpu) == PCS_OK ? 0 : -1;
}

/* xorshift64*: reproducible random data */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
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

static uint32_t fbits(float f)
{
    return pcs_f32_bits(f);
}

// ----------------------------------------------------------------------------
// registry

static void test_cpu_backend_is_always_available_and_named_cpu(void **state)
{
    const pcs_backend_ops_t *be = NULL;
    assert_int_equal(pcs_backend_get("cpu", &be), PCS_OK);
    assert_non_null(be);
    assert_string_equal(be->name, "cpu");
    assert_true(pcs_backend_built("cpu"));
}

static void test_cpu_backend_has_exactly_device_zero(void **state)
{
    const pcs_backend_ops_t *be = NULL;
    assert_int_equal(pcs_backend_get("cpu", &be), PCS_OK);
    assert_int_equal(be->device_count(), 1);
    assert_int_equal(be->set_device(0), PCS_OK);
    assert_int_equal(be->set_device(1), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "only device 0"));
    char name[32];
    uint64_t mem = 0;
    assert_int_equal(be->device_info(0, name, sizeof name, &mem), PCS_OK);
    assert_string_equal(name, "host");
    assert_true(mem > 0);
    assert_int_equal(be->device_info(-1, name, sizeof name, &mem), PCS_ERR_INVALID_ARG);
}

static void test_unknown_backend_is_not_found_with_a_message(void **state)
{
    const pcs_backend_ops_t *be = (const pcs_backend_ops_t *)1;
    assert_int_equal(pcs_backend_get("tpu", &be), PCS_ERR_NOT_FOUND);
    assert_null(be);
    assert_non_null(strstr(pcs_last_error(), "tpu"));
    assert_int_equal(pcs_backend_get(NULL, &be), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_backend_get("cpu", NULL), PCS_ERR_INVALID_ARG);
}

static void test_cuda_backend_without_device_or_build_is_unsupported_not_a_crash(void **state)
{
    const pcs_backend_ops_t *be = NULL;
    pcs_status_t s = pcs_backend_get("cuda", &be);
    if (s == PCS_OK) { /* a GPU machine: the table must be the cuda one */
        assert_string_equal(be->name, "cuda");
        return;
    }
    assert_int_equal(s, PCS_ERR_UNSUPPORTED);
    assert_null(be);
    assert_non_null(strstr(pcs_last_error(), "cuda"));
}

// ----------------------------------------------------------------------------
// cast

typedef struct special {
    uint32_t in;
    uint16_t bf16, fp16;
    const char *what;
} special_t;

/* Expected bits are from the IEEE 754 definitions (derivations in the comments). */
static const special_t specials[] = {
    {0x00000000u, 0x0000, 0x0000, "+0"},
    {0x80000000u, 0x8000, 0x8000, "-0"},
    {0x7f800000u, 0x7f80, 0x7c00, "+inf"},
    {0xff800000u, 0xff80, 0xfc00, "-inf"},
    {0x7fc00000u, 0x7fc0, 0x7e00, "qnan"},
    {0xffc00001u, 0xffc0, 0xfe00, "-qnan with payload: sign kept, payload dropped"},
    {0x7f800001u, 0x7fc0, 0x7e00, "snan -> quiet"},
    {0x7fffffffu, 0x7fc0, 0x7e00, "nan all ones: no rounding into the sign"},
    {0x3f808000u, 0x3f80, 0x3c04, "1 + 2^-8: bf16 tie, even stays 1.0; fp16 exact 0x3c04"},
    {0x3f818000u, 0x3f82, 0x3c0c, "1 + 3*2^-8: bf16 tie rounds up to even"},
    {0x3f800001u, 0x3f80, 0x3c00, "1 + ulp: rounds down"},
    {0x3f801000u, 0x3f80, 0x3c00, "1 + 2^-11: fp16 tie -> even (down)"},
    {0x3f803000u, 0x3f80, 0x3c02, "1 + 3*2^-11: fp16 tie -> even (up)"},
    {0x477fe000u, 0x4780, 0x7bff, "65504 = fp16 max"},
    {0x477fefffu, 0x4780, 0x7bff, "just below the fp16 overflow midpoint"},
    {0x477ff000u, 0x4780, 0x7c00, "65520: fp16 tie at max rounds to inf"},
    {0x47800000u, 0x4780, 0x7c00, "65536 overflows fp16"},
    {0x7f7fffffu, 0x7f80, 0x7c00, "fp32 max rounds up into bf16 inf"},
    {0x7f7f7fffu, 0x7f7f, 0x7c00, "below bf16 overflow midpoint stays finite"},
    {0x7f7f8000u, 0x7f80, 0x7c00, "bf16 max + half ulp: tie to even = inf"},
    {0x38800000u, 0x3880, 0x0400, "2^-14: smallest fp16 normal"},
    {0x387fe000u, 0x3880, 0x0400, "2^-14 - 2^-25: fp16 tie 0x3ff/0x400 -> even, normal"},
    {0x387fc000u, 0x3880, 0x03ff, "2^-14 - 2^-24: largest fp16 subnormal, exact"},
    {0x33800000u, 0x3380, 0x0001, "2^-24: smallest fp16 subnormal"},
    {0x33000000u, 0x3300, 0x0000, "2^-25: fp16 tie with zero -> 0 (even)"},
    {0x33000001u, 0x3300, 0x0001, "just above 2^-25 -> smallest subnormal"},
    {0x33c00000u, 0x33c0, 0x0002, "1.5 * 2^-24: tie between 1 and 2 -> 2 (even)"},
    {0x00000001u, 0x0000, 0x0000, "smallest fp32 subnormal -> 0"},
    {0x80000001u, 0x8000, 0x8000, "-smallest subnormal -> -0"},
    {0x00400000u, 0x0040, 0x0000, "fp32 subnormal is a bf16 subnormal"},
    {0x00008000u, 0x0000, 0x0000, "bf16 subnormal tie -> 0 (even)"},
    {0x00018000u, 0x0002, 0x0000, "bf16 subnormal tie -> 2 (even)"},
    {0x007fffffu, 0x0080, 0x0000, "largest fp32 subnormal rounds up to bf16 min normal"},
};

static void test_cast_special_values_match_ieee_and_the_reference(void **state)
{
    size_t n = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i < n; i++) {
        float x = pcs_bits_f32(specials[i].in);
        uint16_t b = 0, h = 0;
        assert_int_equal(pcs_kernel_cast(cpu, &b, PCS_DTYPE_BF16, &x, PCS_DTYPE_FP32, 1, NULL),
                         PCS_OK);
        assert_int_equal(pcs_kernel_cast(cpu, &h, PCS_DTYPE_FP16, &x, PCS_DTYPE_FP32, 1, NULL),
                         PCS_OK);
        if (b != specials[i].bf16 || h != specials[i].fp16 || ref_round(&BF, x) != b ||
            ref_round(&FP, x) != h)
            print_message("%s (0x%08x): bf16 0x%04x want 0x%04x, fp16 0x%04x want 0x%04x\n",
                          specials[i].what, specials[i].in, b, specials[i].bf16, h,
                          specials[i].fp16);
        assert_int_equal(b, specials[i].bf16);
        assert_int_equal(h, specials[i].fp16);
        assert_int_equal(ref_round(&BF, x), b);
        assert_int_equal(ref_round(&FP, x), h);
    }
}

/* Random fp32 patterns (all exponents) through the op vs the reference. */
static void test_cast_random_fp32_patterns_match_reference(void **state)
{
    enum { N = 1 << 16 };
    uint32_t *in = malloc(N * 4);
    uint16_t *b = malloc(N * 2), *h = malloc(N * 2);
    assert_non_null(in);
    assert_non_null(b);
    assert_non_null(h);
    for (int i = 0; i < N; i++)
        in[i] = (uint32_t)rnd();
    assert_int_equal(pcs_kernel_cast(cpu, b, PCS_DTYPE_BF16, in, PCS_DTYPE_FP32, N, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_cast(cpu, h, PCS_DTYPE_FP16, in, PCS_DTYPE_FP32, N, NULL), PCS_OK);
    for (int i = 0; i < N; i++) {
        float x = pcs_bits_f32(in[i]);
        assert_int_equal(b[i], ref_round(&BF, x));
        assert_int_equal(h[i], ref_round(&FP, x));
    }
    free(in);
    free(b);
    free(h);
}

static double as_double(const void *p, pcs_dtype_t t, size_t i)
{
    switch (t) {
    case PCS_DTYPE_FP32:
        return ((const float *)p)[i];
    case PCS_DTYPE_FP64:
        return ((const double *)p)[i];
    case PCS_DTYPE_BF16:
        return ref_decode(&BF, ((const uint16_t *)p)[i]);
    default:
        return ref_decode(&FP, ((const uint16_t *)p)[i]);
    }
}

/* Expected element of dst when casting value v (exactly representable in the source dtype). */
static double expect_cast(double v, pcs_dtype_t dt)
{
    switch (dt) {
    case PCS_DTYPE_FP64:
        return v;
    case PCS_DTYPE_FP32:
        return (double)(float)v;
    case PCS_DTYPE_BF16: /* via fp32, as c10::BFloat16(double) */
        return ref_decode(&BF, ref_round(&BF, (float)v));
    default:
        return ref_decode(&FP, ref_round(&FP, (float)v));
    }
}

static void test_cast_every_dtype_pair_rounds_once_via_fp32(void **state)
{
    const pcs_dtype_t dts[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16, PCS_DTYPE_FP64};
    enum { N = 1031 }; /* odd: exercises vector tails */
    double *vals = malloc(N * sizeof *vals);
    void *src = malloc(N * 8), *dst = malloc(N * 8);
    assert_non_null(vals);
    assert_non_null(src);
    assert_non_null(dst);
    for (int i = 0; i < N; i++) /* magnitudes across fp16's and beyond its range */
        vals[i] = ldexp(rndf(-1.0f, 1.0f), (int)(rnd() % 40) - 26);
    vals[0] = 0.0;
    vals[1] = -0.0;
    vals[2] = INFINITY;
    vals[3] = -INFINITY;
    for (size_t a = 0; a < 4; a++) {
        /* put vals into dtype a (so they are exactly representable there) */
        double *d64 = malloc(N * 8);
        assert_non_null(d64);
        memcpy(d64, vals, N * 8);
        assert_int_equal(pcs_kernel_cast(cpu, src, dts[a], d64, PCS_DTYPE_FP64, N, NULL), PCS_OK);
        free(d64);
        for (size_t b = 0; b < 4; b++) {
            memset(dst, 0xa5, N * 8);
            assert_int_equal(pcs_kernel_cast(cpu, dst, dts[b], src, dts[a], N, NULL), PCS_OK);
            for (int i = 0; i < N; i++) {
                double v = as_double(src, dts[a], i);
                double got = as_double(dst, dts[b], i);
                double want = expect_cast(v, dts[b]);
                if (got != want || signbit(got) != signbit(want))
                    fail_msg("%s -> %s [%d]: %a gave %a want %a", pcs_dtype_name(dts[a]),
                             pcs_dtype_name(dts[b]), i, v, got, want);
            }
        }
    }
    free(vals);
    free(src);
    free(dst);
}

/* Every vector path this CPU has (AVX-512, AVX2/F16C) gives the scalar loop's bits, at every
 * misalignment and tail length, and on sizes that take the streaming-store path. */
static void test_simd_and_scalar_paths_give_identical_bits(void **state)
{
    /* the last size makes both outputs >= 16 MB: the streaming-store loops */
    const size_t sizes[] = {1, 7, 15, 16, 17, 31, 33, 1000, 4099, (size_t)9 << 20};
    const char *paths[] = {"avx512", "avx2+f16c"};
    size_t maxn = ((size_t)9 << 20) + 64;
    uint32_t *in = malloc(maxn * 4);
    uint16_t *h16 = malloc(maxn * 2);
    uint16_t *a16 = malloc(maxn * 2 + 64), *b16 = malloc(maxn * 2 + 64);
    float *a32 = malloc(maxn * 4 + 64), *b32 = malloc(maxn * 4 + 64);
    assert_non_null(in);
    assert_non_null(h16);
    assert_non_null(a16);
    assert_non_null(b16);
    assert_non_null(a32);
    assert_non_null(b32);
    for (size_t i = 0; i < maxn; i++) {
        in[i] = (uint32_t)rnd();
        h16[i] = (uint16_t)rnd();
    }
    in[3] = 0x7fffffffu;
    in[5] = 0xff800001u;
    const pcs_dtype_t halves[] = {PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    int tested = 0;
    for (int p = 0; p < 2; p++) {
        if (pcs_cpu_cast_array_path(paths[p], a16, PCS_DTYPE_BF16, in, PCS_DTYPE_FP32, 1) ==
            PCS_ERR_UNSUPPORTED) {
            print_message("cpu simd path %s: not on this CPU\n", paths[p]);
            continue;
        }
        tested++;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            for (size_t off = 0; off < 3; off++) {
                size_t n = sizes[si];
                for (int k = 0; k < 2; k++) {
                    assert_int_equal(pcs_cpu_cast_array_path(paths[p], a16 + off, halves[k],
                                                             in + off, PCS_DTYPE_FP32, n),
                                     PCS_OK);
                    assert_int_equal(pcs_cpu_cast_array_path(paths[p], a32 + off, PCS_DTYPE_FP32,
                                                             h16 + off, halves[k], n),
                                     PCS_OK);
                    assert_int_equal(pcs_cpu_cast_array_path("scalar", b16 + off, halves[k],
                                                             in + off, PCS_DTYPE_FP32, n),
                                     PCS_OK);
                    assert_int_equal(pcs_cpu_cast_array_path("scalar", b32 + off, PCS_DTYPE_FP32,
                                                             h16 + off, halves[k], n),
                                     PCS_OK);
                    assert_memory_equal(a16 + off, b16 + off, n * 2);
                    assert_memory_equal(a32 + off, b32 + off, n * 4);
                }
            }
        }
    }
    /* the op itself follows the selected path */
    assert_int_equal(pcs_cpu_simd_select("scalar"), PCS_OK);
    assert_string_equal(pcs_cpu_simd_name(), "scalar");
    assert_int_equal(pcs_cpu_simd_select("auto"), PCS_OK);
    assert_int_equal(pcs_cpu_simd_select("sse9"), PCS_ERR_INVALID_ARG);
    print_message("cpu simd path: %s (%d vector paths checked)\n", pcs_cpu_simd_name(), tested);
    free(in);
    free(h16);
    free(a16);
    free(b16);
    free(a32);
    free(b32);
}

static void test_cast_list_handles_mixed_dtypes_and_lengths(void **state)
{
    float a[5] = {1.0f, -2.5f, 3.25f, 65504.0f, 1e-8f};
    float b[3] = {0.1f, 0.2f, 0.3f};
    uint16_t ab[5], bh[3];
    double c[2];
    pcs_tensor_t dst[3] = {
        {ab, PCS_DTYPE_BF16, 5}, {bh, PCS_DTYPE_FP16, 3}, {c, PCS_DTYPE_FP64, 2}};
    pcs_tensor_t src[3] = {{a, PCS_DTYPE_FP32, 5}, {b, PCS_DTYPE_FP32, 3}, {a, PCS_DTYPE_FP32, 2}};
    assert_int_equal(pcs_kernel_cast_list(cpu, dst, src, 3, NULL), PCS_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(ab[i], ref_round(&BF, a[i]));
    for (int i = 0; i < 3; i++)
        assert_int_equal(bh[i], ref_round(&FP, b[i]));
    assert_true(c[0] == 1.0 && c[1] == -2.5);
}

// ----------------------------------------------------------------------------
// scale / accumulate

static void test_scale_rounds_once_from_fp32_product_in_each_dtype(void **state)
{
    enum { N = 4096 };
    const float factor = 0.3f;
    float f[N], f0[N];
    uint16_t b[N], h[N], b0[N], h0[N];
    double d[N], d0[N];
    for (int i = 0; i < N; i++) {
        f0[i] = f[i] = rndf(-1000.0f, 1000.0f);
        b0[i] = b[i] = ref_round(&BF, rndf(-1000.0f, 1000.0f));
        h0[i] = h[i] = ref_round(&FP, rndf(-1000.0f, 1000.0f));
        d0[i] = d[i] = (double)rndf(-1.0f, 1.0f) / 3.0;
    }
    pcs_tensor_t t[4] = {{f, PCS_DTYPE_FP32, N},
                         {b, PCS_DTYPE_BF16, N},
                         {h, PCS_DTYPE_FP16, N},
                         {d, PCS_DTYPE_FP64, N}};
    assert_int_equal(pcs_kernel_scale_list(cpu, t, 4, factor, NULL), PCS_OK);
    for (int i = 0; i < N; i++) {
        /* the product of two fp32 values is exact in double; (float) rounds it once */
        assert_true(fbits(f[i]) == fbits((float)((double)f0[i] * factor)));
        float pb = (float)(ref_decode(&BF, b0[i]) * factor);
        float ph = (float)(ref_decode(&FP, h0[i]) * factor);
        assert_int_equal(b[i], ref_round(&BF, pb));
        assert_int_equal(h[i], ref_round(&FP, ph));
        assert_true(d[i] == d0[i] * (double)factor);
    }
}

static void test_accumulate_adds_in_fp32_and_rounds_once_to_dst(void **state)
{
    enum { N = 2048 };
    float f[N], f0[N], gf[N];
    uint16_t b[N], b0[N], gb[N], h[N], h0[N], gh[N];
    for (int i = 0; i < N; i++) {
        f0[i] = f[i] = rndf(-10.0f, 10.0f);
        gf[i] = rndf(-1.0f, 1.0f);
        b0[i] = b[i] = ref_round(&BF, rndf(-10.0f, 10.0f));
        gb[i] = ref_round(&BF, rndf(-1.0f, 1.0f));
        h0[i] = h[i] = ref_round(&FP, rndf(-10.0f, 10.0f));
        gh[i] = ref_round(&FP, rndf(-1.0f, 1.0f));
    }
    /* fp32 += bf16, bf16 += fp32, fp16 += fp16 */
    pcs_tensor_t dst[3] = {{f, PCS_DTYPE_FP32, N}, {b, PCS_DTYPE_BF16, N}, {h, PCS_DTYPE_FP16, N}};
    pcs_tensor_t src[3] = {
        {gb, PCS_DTYPE_BF16, N}, {gf, PCS_DTYPE_FP32, N}, {gh, PCS_DTYPE_FP16, N}};
    assert_int_equal(pcs_kernel_accumulate_list(cpu, dst, src, 3, NULL), PCS_OK);
    for (int i = 0; i < N; i++) {
        float s0 = (float)((double)f0[i] + ref_decode(&BF, gb[i]));
        float s1 = (float)(ref_decode(&BF, b0[i]) + (double)gf[i]);
        float s2 = (float)(ref_decode(&FP, h0[i]) + ref_decode(&FP, gh[i]));
        assert_true(fbits(f[i]) == fbits(s0));
        assert_int_equal(b[i], ref_round(&BF, s1));
        assert_int_equal(h[i], ref_round(&FP, s2));
    }
    /* dst and src may be the same buffer: x += x doubles exactly */
    uint16_t same[3] = {ref_round(&BF, 1.5f), ref_round(&BF, -0.75f), 0x0001 /* subnormal */};
    assert_int_equal(
        pcs_kernel_accumulate(cpu, same, PCS_DTYPE_BF16, same, PCS_DTYPE_BF16, 3, NULL), PCS_OK);
    assert_true(ref_decode(&BF, same[0]) == 3.0 && ref_decode(&BF, same[1]) == -1.5);
    assert_int_equal(same[2], 0x0002);
}

// ----------------------------------------------------------------------------
// AMP non-finite check + unscale

static void test_nonfinite_check_sets_flag_and_unscales_every_tensor(void **state)
{
    float a[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    uint16_t b[3] = {ref_round(&BF, 3.0f), ref_round(&BF, -5.0f), 0x7f80 /* +inf */};
    uint16_t h[2] = {ref_round(&FP, 6.0f), ref_round(&FP, 0.5f)};
    pcs_tensor_t t[3] = {{a, PCS_DTYPE_FP32, 4}, {b, PCS_DTYPE_BF16, 3}, {h, PCS_DTYPE_FP16, 2}};
    float found = 0.0f, inv = 0.5f;
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, t, 3, &found, &inv, NULL), PCS_OK);
    assert_true(found == 1.0f);
    assert_true(a[0] == 0.5f && a[3] == 4.0f);
    assert_true(ref_decode(&BF, b[0]) == 1.5 && ref_decode(&BF, b[1]) == -2.5);
    assert_int_equal(b[2], 0x7f80); /* inf * 0.5 stays inf */
    assert_true(ref_decode(&FP, h[0]) == 3.0 && ref_decode(&FP, h[1]) == 0.25);
}

static void test_nonfinite_check_never_clears_flag_and_skips_multiply_when_inv_is_one(void **state)
{
    float a[3] = {1.0f, pcs_bits_f32(0x7fc00123u), -3.0f};
    float b[2] = {1.0f, 2.0f};
    pcs_tensor_t ta = {a, PCS_DTYPE_FP32, 3}, tb = {b, PCS_DTYPE_FP32, 2};
    float found = 0.0f, inv = 1.0f;
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &ta, 1, &found, &inv, NULL),
                     PCS_OK);
    assert_true(found == 1.0f);
    assert_int_equal(fbits(a[1]), 0x7fc00123u); /* untouched, payload and all */
    assert_true(a[0] == 1.0f && a[2] == -3.0f);
    /* all finite: flag stays as it was (1 here, 0 below) */
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &tb, 1, &found, &inv, NULL),
                     PCS_OK);
    assert_true(found == 1.0f);
    found = 0.0f;
    inv = 0.25f;
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &tb, 1, &found, &inv, NULL),
                     PCS_OK);
    assert_true(found == 0.0f);
    assert_true(b[0] == 0.25f && b[1] == 0.5f);
}

// ----------------------------------------------------------------------------
// sum of squares

/* The fused accumulate + sum of squares (gradient clipping's sum taken by the reduction's
 * accumulation into the sharded gradient) gives exactly the bits of the two ops in turn, for
 * every dst/src dtype pair, including values that overflow fp16 on the way; an empty tensor sums
 * to 0. (Backends without it answer UNSUPPORTED: the runtime then runs the two.) */
static void test_accumulate_sumsq_equals_accumulate_then_sum_squares(void **state)
{
    (void)state;
    enum { N = 3001 };
    const pcs_dtype_t dts[3] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    static float src32[N], d32a[N];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            pcs_dtype_t dd = dts[a], sd = dts[b];
            for (int i = 0; i < N; i++) {
                d32a[i] = rndf(-300.0f, 300.0f) * (i % 97 == 0 ? 300.0f : 1.0f);
                src32[i] = rndf(-3.0f, 3.0f);
            }
            char dst1[N * 4], dst2[N * 4], src[N * 4];
            assert_int_equal(pcs_kernel_cast(cpu, dst1, dd, d32a, PCS_DTYPE_FP32, N, NULL), PCS_OK);
            memcpy(dst2, dst1, sizeof dst1);
            assert_int_equal(pcs_kernel_cast(cpu, src, sd, src32, PCS_DTYPE_FP32, N, NULL), PCS_OK);
            float want = -1.0f, got = -2.0f;
            assert_int_equal(pcs_kernel_accumulate(cpu, dst1, dd, src, sd, N, NULL), PCS_OK);
            assert_int_equal(pcs_kernel_sum_squares(cpu, dst1, dd, N, &want, NULL), PCS_OK);
            assert_int_equal(pcs_kernel_accumulate_sumsq(cpu, dst2, dd, src, sd, N, &got, NULL),
                             PCS_OK);
            assert_memory_equal(dst1, dst2, N * pcs_dtype_size(dd));
            assert_memory_equal(&want, &got, sizeof want);
        }
    float out = -1.0f, x = 1.0f;
    assert_int_equal(pcs_kernel_accumulate_sumsq(cpu, &x, PCS_DTYPE_FP32, &x, PCS_DTYPE_FP32, 0,
                                                 &out, NULL),
                     PCS_OK);
    assert_true(out == 0.0f);
    assert_int_equal(pcs_kernel_accumulate_sumsq(cpu, &x, PCS_DTYPE_FP32, &x, PCS_DTYPE_FP32, 1,
                                                 NULL, NULL),
                     PCS_ERR_INVALID_ARG);
}

static void test_sum_squares_over_list_matches_long_double_reference(void **state)
{
    enum { N = 100003 };
    float *f = malloc(N * 4);
    uint16_t *b = malloc(N * 2), *h = malloc(N * 2);
    assert_non_null(f);
    assert_non_null(b);
    assert_non_null(h);
    long double ref = 0.0L;
    for (int i = 0; i < N; i++) {
        f[i] = rndf(-3.0f, 3.0f);
        b[i] = ref_round(&BF, rndf(-3.0f, 3.0f));
        h[i] = ref_round(&FP, rndf(-3.0f, 3.0f));
        long double x = f[i], y = ref_decode(&BF, b[i]), z = ref_decode(&FP, h[i]);
        ref += x * x + y * y + z * z;
    }
    pcs_tensor_t t[3] = {{f, PCS_DTYPE_FP32, N}, {b, PCS_DTYPE_BF16, N}, {h, PCS_DTYPE_FP16, N}};
    float out = -1.0f;
    assert_int_equal(pcs_kernel_sum_squares_list(cpu, t, 3, &out, NULL), PCS_OK);
    /* fp64 accumulation of 3e5 exact squares: error << one fp32 ulp, so within 1 ulp */
    double rel = fabs((double)out - (double)ref) / (double)ref;
    assert_true(rel <= 1.2e-7);
    float one = -1.0f;
    assert_int_equal(pcs_kernel_sum_squares(cpu, f, PCS_DTYPE_FP32, 0, &one, NULL), PCS_OK);
    assert_true(one == 0.0f); /* empty input: 0, written */
    free(f);
    free(b);
    free(h);
}

// ----------------------------------------------------------------------------
// optimizers

/* AdamW over 20 steps on random data against the double reference. Tolerance: the fp32 kernel
 * rounds ~10 operations per step; after 20 steps the parameter differs from the double path by a
 * few fp32 ulps of |p| plus a few ulps of the per-step update (lr), so |dp| <= 4e-6*|p| +
 * 4e-7*lr*t. Moments: 1e-6 relative plus 1e-7 of the gradient scale. */
static void run_adamw(const pcs_adamw_config_t *cfg)
{
    enum { N = 1000, STEPS = 20 };
    float p[N], m[N], v[N], g[N];
    double rp[N], rm[N], rv[N];
    for (int i = 0; i < N; i++) {
        p[i] = rndf(-1.0f, 1.0f);
        rp[i] = p[i];
        m[i] = v[i] = 0.0f;
        rm[i] = rv[i] = 0.0;
    }
    pcs_tensor_t tp = {p, PCS_DTYPE_FP32, N}, tg = {g, PCS_DTYPE_FP32, N};
    pcs_tensor_t tm = {m, PCS_DTYPE_FP32, N}, tv = {v, PCS_DTYPE_FP32, N};
    double maxerr = 0.0;
    for (int s = 1; s <= STEPS; s++) {
        for (int i = 0; i < N; i++)
            g[i] = rndf(-0.1f, 0.1f) * (i % 7 == 0 ? 100.0f : 1.0f);
        assert_int_equal(pcs_kernel_adamw_update(cpu, &tp, &tg, &tm, &tv, 1, cfg, s, NULL), PCS_OK);
        for (int i = 0; i < N; i++)
            ref_adamw(&rp[i], g[i], &rm[i], &rv[i], cfg->lr, cfg->beta1, cfg->beta2, cfg->eps,
                      cfg->weight_decay, s, cfg->maximize);
        for (int i = 0; i < N; i++) {
            double tol = 4e-6 * fabs(rp[i]) + 4e-7 * cfg->lr * s;
            double err = fabs((double)p[i] - rp[i]);
            maxerr = err > maxerr ? err : maxerr;
            if (err > tol)
                fail_msg("adamw step %d [%d]: p %.9g ref %.9g", s, i, (double)p[i], rp[i]);
            /* moments: a few fp32 ulps of their own size plus of the gradient scale gs (the
             * running average can cancel towards 0, where only the absolute error is small) */
            double gs = i % 7 == 0 ? 10.0 : 0.1;
            if (fabs((double)m[i] - rm[i]) > 1e-6 * fabs(rm[i]) + 1e-7 * gs ||
                fabs((double)v[i] - rv[i]) > 1e-6 * fabs(rv[i]) + 1e-7 * gs * gs)
                fail_msg("adamw step %d [%d]: m %.9g ref %.9g v %.9g ref %.9g", s, i, (double)m[i],
                         rm[i], (double)v[i], rv[i]);
        }
    }
}

/* Spec §9 case 10 with the ops a fp16 reduction runs (scale, accumulate, cast): ws = 4, pre 2,
 * post 2, every rank's grad 30000: 15000 each, SUM 60000 (<= 65504), / 2 -> 30000.0f exactly;
 * a SUM without the pre-divide (120000) overflows fp16 to inf. */
static void test_fp16_pre_post_divide_keeps_the_sum_finite_case10(void **state)
{
    enum { WS = 4, N = 3 };
    uint16_t g[WS][N], sum[N], plain[N];
    for (int r = 0; r < WS; r++)
        for (int i = 0; i < N; i++)
            g[r][i] = pcs_f32_to_fp16(30000.0f);
    memcpy(plain, g[0], sizeof plain);
    for (int r = 1; r < WS; r++)
        assert_int_equal(
            pcs_kernel_accumulate(cpu, plain, PCS_DTYPE_FP16, g[r], PCS_DTYPE_FP16, N, NULL),
            PCS_OK);
    for (int r = 0; r < WS; r++)
        assert_int_equal(pcs_kernel_scale(cpu, g[r], PCS_DTYPE_FP16, N, 0.5f, NULL), PCS_OK);
    assert_true(pcs_fp16_to_f32(g[0][0]) == 15000.0f);
    memcpy(sum, g[0], sizeof sum);
    for (int r = 1; r < WS; r++)
        assert_int_equal(
            pcs_kernel_accumulate(cpu, sum, PCS_DTYPE_FP16, g[r], PCS_DTYPE_FP16, N, NULL), PCS_OK);
    assert_true(pcs_fp16_to_f32(sum[0]) == 60000.0f);
    assert_int_equal(pcs_kernel_scale(cpu, sum, PCS_DTYPE_FP16, N, 0.5f, NULL), PCS_OK);
    float out[N];
    assert_int_equal(pcs_kernel_cast(cpu, out, PCS_DTYPE_FP32, sum, PCS_DTYPE_FP16, N, NULL),
                     PCS_OK);
    for (int i = 0; i < N; i++) {
        assert_true(out[i] == 30000.0f);
        assert_true(isinf(pcs_fp16_to_f32(plain[i])));
    }
}

static void test_adamw_defaults_are_pytorchs(void **state)
{
    pcs_adamw_config_t c;
    pcs_adamw_config_default(&c);
    assert_true(c.lr == 1e-3 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8 &&
                c.weight_decay == 1e-2 && c.maximize == 0);
    pcs_sgd_config_t s;
    pcs_sgd_config_default(&s);
    assert_true(s.lr == 1e-3 && s.momentum == 0.0 && s.dampening == 0.0 && s.weight_decay == 0.0 &&
                !s.nesterov && !s.maximize);
}

static void test_adamw_matches_double_reference_with_bias_correction(void **state)
{
    pcs_adamw_config_t c;
    pcs_adamw_config_default(&c);
    run_adamw(&c);
    c.lr = 3e-2;
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.95;
    c.maximize = 1;
    run_adamw(&c);
    c.beta1 = 0.3; /* lerp weight 0.7 >= 0.5: ATen's other lerp branch */
    run_adamw(&c);
}

static void test_adamw_first_step_moves_each_param_by_about_lr(void **state)
{
    /* bias-corrected first step: m_hat = g, v_hat = g^2, so p' = p(1 - lr*wd) - lr*sign(g) */
    pcs_adamw_config_t c;
    pcs_adamw_config_default(&c);
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -4.0f}, m[2] = {0}, v[2] = {0};
    pcs_tensor_t tp = {p, PCS_DTYPE_FP32, 2}, tg = {g, PCS_DTYPE_FP32, 2};
    pcs_tensor_t tm = {m, PCS_DTYPE_FP32, 2}, tv = {v, PCS_DTYPE_FP32, 2};
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tp, &tg, &tm, &tv, 1, &c, 1, NULL), PCS_OK);
    assert_true(fabs(p[0] - (1.0 * (1 - 1e-5) - 1e-3)) < 1e-6);
    assert_true(fabs(p[1] - (-2.0 * (1 - 1e-5) + 1e-3)) < 1e-6);
}

static void run_sgd(const pcs_sgd_config_t *cfg)
{
    enum { N = 1000, STEPS = 20 };
    float p[N], b[N], g[N];
    double rp[N], rb[N];
    for (int i = 0; i < N; i++) {
        p[i] = rndf(-1.0f, 1.0f);
        rp[i] = p[i];
        b[i] = 123.0f; /* garbage: the first step must overwrite it */
        rb[i] = 0.0;
    }
    pcs_tensor_t tp = {p, PCS_DTYPE_FP32, N}, tg = {g, PCS_DTYPE_FP32, N};
    pcs_tensor_t tb = {b, PCS_DTYPE_FP32, N};
    for (int s = 1; s <= STEPS; s++) {
        for (int i = 0; i < N; i++)
            g[i] = rndf(-1.0f, 1.0f);
        float g0 = g[0];
        assert_int_equal(pcs_kernel_sgd_update(cpu, &tp, &tg, cfg->momentum != 0.0 ? &tb : NULL, 1,
                                               cfg, s == 1, NULL),
                         PCS_OK);
        assert_true(g[0] == g0); /* grad is read-only */
        for (int i = 0; i < N; i++)
            ref_sgd(&rp[i], g[i], &rb[i], cfg->lr, cfg->momentum, cfg->dampening, cfg->weight_decay,
                    cfg->nesterov, cfg->maximize, s == 1);
        /* |p| <= ~2 here; each step rounds ~6 times: 2e-6 relative of |p| + lr-scale terms */
        for (int i = 0; i < N; i++) {
            double tol = 2e-6 * fabs(rp[i]) + 1e-6 * cfg->lr * s;
            if (fabs((double)p[i] - rp[i]) > tol)
                fail_msg("sgd step %d [%d]: p %.9g ref %.9g", s, i, (double)p[i], rp[i]);
        }
    }
}

static void test_sgd_variants_match_double_reference(void **state)
{
    pcs_sgd_config_t c;
    pcs_sgd_config_default(&c);
    c.lr = 0.01;
    run_sgd(&c); /* plain */
    c.momentum = 0.9;
    run_sgd(&c); /* momentum, buffer initialised from the first grad */
    c.dampening = 0.1;
    c.weight_decay = 1e-2;
    run_sgd(&c);
    c.dampening = 0.0;
    c.nesterov = 1;
    c.maximize = 1;
    run_sgd(&c);
}

static void test_sgd_first_step_copies_grad_into_momentum_buffer(void **state)
{
    pcs_sgd_config_t c;
    pcs_sgd_config_default(&c);
    c.lr = 0.5;
    c.momentum = 0.9;
    c.dampening = 0.5; /* torch ignores dampening on the first step */
    float p[1] = {1.0f}, g[1] = {2.0f}, b[1] = {-7.0f};
    pcs_tensor_t tp = {p, PCS_DTYPE_FP32, 1}, tg = {g, PCS_DTYPE_FP32, 1},
                 tb = {b, PCS_DTYPE_FP32, 1};
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tp, &tg, &tb, 1, &c, 1, NULL), PCS_OK);
    assert_true(b[0] == 2.0f && p[0] == 0.0f);
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tp, &tg, &tb, 1, &c, 0, NULL), PCS_OK);
    assert_true(b[0] == 0.9f * 2.0f + 0.5f * 2.0f); /* 2.8 */
    assert_true(p[0] == 0.0f - 0.5f * b[0]);
}

/* The op's (auto-vectorized, -O3) loops give exactly the bits of pcs_kernel_math.h's element
 * functions applied one element at a time: the CPU twin is the scalar math the GPU runs. */
static void test_optimizer_loops_equal_the_shared_element_math_bit_for_bit(void **state)
{
    enum { N = 1003 };
    float p[N], g[N], m[N], v[N], p2[N], m2[N], v2[N];
    for (int i = 0; i < N; i++) {
        p[i] = p2[i] = rndf(-1.0f, 1.0f);
        m[i] = m2[i] = rndf(-0.01f, 0.01f);
        v[i] = v2[i] = rndf(0.0f, 1e-4f);
        g[i] = rndf(-0.1f, 0.1f);
    }
    pcs_adamw_config_t ac;
    pcs_adamw_config_default(&ac);
    pcs_tensor_t tp = {p, PCS_DTYPE_FP32, N}, tg = {g, PCS_DTYPE_FP32, N};
    pcs_tensor_t tm = {m, PCS_DTYPE_FP32, N}, tv = {v, PCS_DTYPE_FP32, N};
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tp, &tg, &tm, &tv, 1, &ac, 7, NULL), PCS_OK);
    pcs_adamw_coef_t c;
    pcs_adamw_coef(&ac, 7, &c);
    for (int i = 0; i < N; i++)
        pcs_adamw_elem(&p2[i], g[i], &m2[i], &v2[i], &c);
    assert_memory_equal(p, p2, sizeof p);
    assert_memory_equal(m, m2, sizeof m);
    assert_memory_equal(v, v2, sizeof v);

    pcs_sgd_config_t sc;
    pcs_sgd_config_default(&sc);
    sc.lr = 0.05;
    sc.momentum = 0.9;
    sc.dampening = 0.1;
    sc.weight_decay = 1e-3;
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tp, &tg, &tm, 1, &sc, 0, NULL), PCS_OK);
    pcs_sgd_coef_t sgc;
    pcs_sgd_coef(&sc, 0, &sgc);
    for (int i = 0; i < N; i++)
        pcs_sgd_elem(&p2[i], g[i], &m2[i], &sgc);
    assert_memory_equal(p, p2, sizeof p);
    assert_memory_equal(m, m2, sizeof m);
}

// ----------------------------------------------------------------------------
// fill / copy / memory / streams

/* fp64 shards (fp64 masters, FSDP's full_precision_param_dtype=float64): the optimizers compute
 * in double, as PyTorch's do on float64 parameters. The textbook double reference differs from
 * ATen's lerp form by a few fp64 ulps per step; an update in fp32 would miss by ~1e-8. */
static void test_fp64_optimizers_compute_in_double(void **state)
{
    enum { N = 1000, STEPS = 20 };
    static double p[N], g[N], m[N], v[N], rp[N], rm[N], rv[N];
    pcs_adamw_config_t c;
    pcs_adamw_config_default(&c);
    c.lr = 1e-2;
    c.weight_decay = 0.1;
    for (int i = 0; i < N; i++) {
        p[i] = rp[i] = (double)rndf(-1.0f, 1.0f) / 3.0; /* not fp32-representable */
        m[i] = v[i] = rm[i] = rv[i] = 0.0;
    }
    pcs_tensor_t tp = {p, PCS_DTYPE_FP64, N}, tg = {g, PCS_DTYPE_FP64, N};
    pcs_tensor_t tm = {m, PCS_DTYPE_FP64, N}, tv = {v, PCS_DTYPE_FP64, N};
    for (int s = 1; s <= STEPS; s++) {
        for (int i = 0; i < N; i++)
            g[i] = (double)rndf(-1.0f, 1.0f) / 7.0;
        assert_int_equal(pcs_kernel_adamw_update(cpu, &tp, &tg, &tm, &tv, 1, &c, s, NULL),
                         PCS_OK);
        for (int i = 0; i < N; i++) {
            ref_adamw(&rp[i], g[i], &rm[i], &rv[i], c.lr, c.beta1, c.beta2, c.eps,
                      c.weight_decay, s, 0);
            if (fabs(p[i] - rp[i]) > 1e-14 + 1e-13 * fabs(rp[i]))
                fail_msg("adamw fp64 step %d [%d]: %.17g vs %.17g", s, i, p[i], rp[i]);
        }
    }
    /* SGD with nesterov momentum and weight decay */
    pcs_sgd_config_t sc;
    pcs_sgd_config_default(&sc);
    sc.lr = 0.01;
    sc.momentum = 0.9;
    sc.weight_decay = 1e-2;
    sc.nesterov = 1;
    for (int i = 0; i < N; i++) {
        p[i] = rp[i] = (double)rndf(-1.0f, 1.0f) / 3.0;
        m[i] = 123.0; /* garbage: the first step overwrites it */
        rm[i] = 0.0;
    }
    for (int s = 1; s <= STEPS; s++) {
        for (int i = 0; i < N; i++)
            g[i] = (double)rndf(-1.0f, 1.0f) / 7.0;
        assert_int_equal(pcs_kernel_sgd_update(cpu, &tp, &tg, &tm, 1, &sc, s == 1, NULL), PCS_OK);
        for (int i = 0; i < N; i++) {
            ref_sgd(&rp[i], g[i], &rm[i], sc.lr, sc.momentum, sc.dampening, sc.weight_decay,
                    sc.nesterov, 0, s == 1);
            if (fabs(p[i] - rp[i]) > 1e-15 + 1e-14 * fabs(rp[i]))
                fail_msg("sgd fp64 step %d [%d]: %.17g vs %.17g", s, i, p[i], rp[i]);
        }
    }
    /* the element math the CUDA kernels share, bit for bit */
    double q = 0.25 / 3.0, qm = 0.01, qv = 0.002, e = q, em = qm, ev = qv;
    pcs_adamw_coef64_t k;
    pcs_adamw_coef64(&c, 3, &k);
    pcs_adamw_elem64(&e, 1.0 / 7.0, &em, &ev, &k);
    double gg = 1.0 / 7.0;
    pcs_tensor_t t1 = {&q, PCS_DTYPE_FP64, 1}, t2 = {&gg, PCS_DTYPE_FP64, 1};
    pcs_tensor_t t3 = {&qm, PCS_DTYPE_FP64, 1}, t4 = {&qv, PCS_DTYPE_FP64, 1};
    assert_int_equal(pcs_kernel_adamw_update(cpu, &t1, &t2, &t3, &t4, 1, &c, 3, NULL), PCS_OK);
    assert_true(q == e && qm == em && qv == ev);
    /* every list of one update in the param's dtype */
    float f32[4] = {0};
    pcs_tensor_t bad = {f32, PCS_DTYPE_FP32, 1};
    assert_int_equal(pcs_kernel_adamw_update(cpu, &t1, &bad, &t3, &t4, 1, &c, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_non_null(strstr(pcs_last_error(), "grad[0] is fp32 but param[0] is fp64"));
    assert_int_equal(pcs_kernel_sgd_update(cpu, &t1, &t2, &bad, 1, &sc, 0, NULL),
                     PCS_ERR_UNSUPPORTED);
}

/* An fp64 gradient accumulates in fp64 whatever the reduced dtype (FSDP's _cast_grad_to_param_dtype
 * then +=); fp64 into a narrower destination is refused. */
static void test_fp64_accumulate_and_unscale_stay_in_double(void **state)
{
    double d[4] = {1.0, 1.0, 1.0, 1.0 / 3.0};
    float f32[4] = {0x1p-30f, 0, 0, 0};
    uint16_t b16[4] = {pcs_f32_to_bf16(0x1p-40f), 0, 0, 0};
    uint16_t h16[4] = {pcs_f32_to_fp16(0x1p-20f), 0, 0, 0};
    double d64[4] = {0x1p-50, 0, 0, 0};
    assert_int_equal(pcs_kernel_accumulate(cpu, d, PCS_DTYPE_FP64, f32, PCS_DTYPE_FP32, 1, NULL),
                     PCS_OK);
    assert_int_equal(
        pcs_kernel_accumulate(cpu, d + 1, PCS_DTYPE_FP64, b16, PCS_DTYPE_BF16, 1, NULL), PCS_OK);
    assert_int_equal(
        pcs_kernel_accumulate(cpu, d + 2, PCS_DTYPE_FP64, h16, PCS_DTYPE_FP16, 1, NULL), PCS_OK);
    assert_int_equal(
        pcs_kernel_accumulate(cpu, d + 3, PCS_DTYPE_FP64, d64, PCS_DTYPE_FP64, 1, NULL), PCS_OK);
    /* each sum exact in fp64, each lost in an fp32 sum */
    assert_true(d[0] == 1.0 + 0x1p-30 && d[1] == 1.0 + 0x1p-40 && d[2] == 1.0 + 0x1p-20);
    assert_true(d[3] == 1.0 / 3.0 + 0x1p-50);
    /* an fp64 source into a narrower destination: in-place acc += g with type promotion, the sum
     * in fp64, stored through fp32 as c10 narrows a double */
    double g64[3] = {1.0 / 3.0, 1.0 + 0x1p-8 + 0x1p-30, -2.0 / 3.0};
    float a32[3] = {1.0f, 0.0f, 0.25f};
    uint16_t a16[3] = {pcs_f32_to_bf16(1.0f), pcs_f32_to_bf16(0.0f), pcs_f32_to_bf16(0.25f)};
    assert_int_equal(pcs_kernel_accumulate(cpu, a32, PCS_DTYPE_FP32, g64, PCS_DTYPE_FP64, 3, NULL),
                     PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(cpu, a16, PCS_DTYPE_BF16, g64, PCS_DTYPE_FP64, 3, NULL),
                     PCS_OK);
    uint16_t a16h[3] = {pcs_f32_to_fp16(1.0f), pcs_f32_to_fp16(0.0f), pcs_f32_to_fp16(0.25f)};
    assert_int_equal(pcs_kernel_accumulate(cpu, a16h, PCS_DTYPE_FP16, g64, PCS_DTYPE_FP64, 3, NULL),
                     PCS_OK);
    for (int i = 0; i < 3; i++) {
        float init = i == 0 ? 1.0f : i == 1 ? 0.0f : 0.25f;
        assert_true(a32[i] == (float)((double)init + g64[i]));
        assert_true(a16[i] == pcs_f32_to_bf16((float)((double)init + g64[i])));
        assert_true(a16h[i] == pcs_f32_to_fp16((float)((double)init + g64[i])));
    }
    /* 1 + 2^-8 + 2^-30: fp32 drops 2^-30, then bf16's tie goes to even (1.0), where a direct
     * fp64 -> bf16 rounding would give 1 + 2^-7 */
    assert_true(pcs_bf16_to_f32(a16[1]) == 1.0f);
    /* one rounding of the fp64 sum, not a cast then a sum: 1 + (2^-24 + 2^-50) is 1 + 2^-23 in
     * fp32 (above the tie), where (float)g = 2^-24 first would tie to 1 */
    float one = 1.0f;
    double tiny = 0x1p-24 + 0x1p-50;
    assert_int_equal(pcs_kernel_accumulate(cpu, &one, PCS_DTYPE_FP32, &tiny, PCS_DTYPE_FP64, 1,
                                           NULL),
                     PCS_OK);
    assert_true(one == 1.0f + 0x1p-23f);

    /* unscale: finite beyond fp32's range is finite; the product in fp64 with the widened inv */
    double x[3] = {1e300, 1.0 / 3.0, -2.5};
    float found = 0.0f, inv = 1.0f / 3.0f;
    pcs_tensor_t t = {x, PCS_DTYPE_FP64, 3};
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &t, 1, &found, &inv, NULL),
                     PCS_OK);
    assert_true(found == 0.0f);
    assert_true(x[0] == 1e300 * (double)inv && x[1] == (1.0 / 3.0) * (double)inv &&
                x[2] == -2.5 * (double)inv);
    x[1] = NAN;
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &t, 1, &found, &inv, NULL),
                     PCS_OK);
    assert_true(found == 1.0f);

    /* sum of squares of an fp64 tensor: the doubles themselves */
    double sq[2] = {1.0 / 3.0, 3.0};
    float out = 0.0f;
    assert_int_equal(pcs_kernel_sum_squares(cpu, sq, PCS_DTYPE_FP64, 2, &out, NULL), PCS_OK);
    assert_true(out == (float)(1.0 / 3.0 * (1.0 / 3.0) + 9.0));
}

static void test_fill_rounds_the_value_once_per_dtype(void **state)
{
    float f[5];
    uint16_t b[3], h[3];
    double d[2];
    int64_t q[2];
    assert_int_equal(pcs_kernel_fill(cpu, f, PCS_DTYPE_FP32, 5, 0.1, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_fill(cpu, b, PCS_DTYPE_BF16, 3, 0.1, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_fill(cpu, h, PCS_DTYPE_FP16, 3, 1e6, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_fill(cpu, d, PCS_DTYPE_FP64, 2, 0.1, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_fill(cpu, q, PCS_DTYPE_INT64, 2, -42.0, NULL), PCS_OK);
    assert_true(f[4] == 0.1f && d[1] == 0.1 && q[1] == -42);
    assert_int_equal(b[2], ref_round(&BF, 0.1f));
    assert_int_equal(h[0], 0x7c00); /* 1e6 overflows fp16 */
    assert_int_equal(pcs_kernel_fill(cpu, q, PCS_DTYPE_INT64, 2, 1e30, NULL), PCS_ERR_INVALID_ARG);
}

static void test_memory_streams_and_events_work_on_cpu(void **state)
{
    void *p = NULL;
    assert_int_equal(cpu->alloc(1000, &p), PCS_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 256, 0);
    pcs_stream_t s = NULL;
    pcs_event_t e = NULL;
    assert_int_equal(cpu->stream_create(&s), PCS_OK);
    assert_int_equal(cpu->event_create(&e), PCS_OK);
    char src[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (char)i;
    assert_int_equal(cpu->copy(p, src, 1000, PCS_COPY_H2D, s), PCS_OK);
    assert_int_equal(cpu->event_record(e, s), PCS_OK);
    assert_int_equal(cpu->stream_wait_event(NULL, e), PCS_OK);
    assert_int_equal(cpu->event_sync(e), PCS_OK);
    assert_int_equal(cpu->sync(s), PCS_OK);
    assert_memory_equal(p, src, 1000);
    cpu->event_destroy(e);
    cpu->stream_destroy(s);
    cpu->free(p);
    cpu->free(NULL);
    assert_int_equal(cpu->alloc(0, &p), PCS_OK);
    assert_null(p);
}

// ----------------------------------------------------------------------------
// bad input

static void test_bad_input_gets_a_status_never_a_crash(void **state)
{
    float f[8] = {0};
    uint16_t h[8] = {0};
    char raw[64] = {0};
    float *mis = (float *)(void *)(raw + 2); /* not 4-byte aligned */
    float found = 0.0f, inv = 1.0f, out = 0.0f;

    /* n == 0 is a no-op, even with NULL pointers */
    assert_int_equal(pcs_kernel_cast(cpu, NULL, PCS_DTYPE_BF16, NULL, PCS_DTYPE_FP32, 0, NULL),
                     PCS_OK);
    assert_int_equal(pcs_kernel_scale(cpu, NULL, PCS_DTYPE_FP32, 0, 2.0f, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_cast_list(cpu, NULL, NULL, 0, NULL), PCS_OK);
    /* NULL with n > 0 */
    assert_int_equal(pcs_kernel_cast(cpu, NULL, PCS_DTYPE_BF16, f, PCS_DTYPE_FP32, 8, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "NULL"));
    assert_int_equal(pcs_kernel_cast(cpu, h, PCS_DTYPE_BF16, NULL, PCS_DTYPE_FP32, 8, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_cast_list(cpu, NULL, NULL, 2, NULL), PCS_ERR_INVALID_ARG);
    /* misaligned */
    assert_int_equal(pcs_kernel_cast(cpu, h, PCS_DTYPE_BF16, mis, PCS_DTYPE_FP32, 4, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "aligned"));
    assert_int_equal(
        pcs_kernel_cast(cpu, (char *)h + 1, PCS_DTYPE_FP16, f, PCS_DTYPE_FP32, 4, NULL),
        PCS_ERR_INVALID_ARG);
    /* unsupported dtypes */
    assert_int_equal(pcs_kernel_cast(cpu, h, PCS_DTYPE_INT64, f, PCS_DTYPE_FP32, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_cast(cpu, h, (pcs_dtype_t)99, f, PCS_DTYPE_FP32, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_cast(cpu, h, PCS_DTYPE_NONE, f, PCS_DTYPE_FP32, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_accumulate(cpu, f, PCS_DTYPE_FP32, f, PCS_DTYPE_INT64, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_sum_squares(cpu, f, PCS_DTYPE_INT64, 1, &out, NULL),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_kernel_fill(cpu, f, PCS_DTYPE_NONE, 1, 0.0, NULL), PCS_ERR_UNSUPPORTED);
    /* mismatched lengths */
    pcs_tensor_t d1 = {h, PCS_DTYPE_BF16, 3}, s1 = {f, PCS_DTYPE_FP32, 4};
    assert_int_equal(pcs_kernel_cast_list(cpu, &d1, &s1, 1, NULL), PCS_ERR_INVALID_ARG);
    /* NULL scalars of the AMP op and the sum */
    pcs_tensor_t tf = {f, PCS_DTYPE_FP32, 8};
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &tf, 1, NULL, &inv, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(cpu, &tf, 1, &found, NULL, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_sum_squares_list(cpu, &tf, 1, NULL, NULL), PCS_ERR_INVALID_ARG);
    /* optimizer configs and dtypes */
    pcs_adamw_config_t ac;
    pcs_adamw_config_default(&ac);
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tf, &tf, &tf, &tf, 1, &ac, 0, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tf, &tf, &tf, &tf, 1, NULL, 1, NULL),
                     PCS_ERR_INVALID_ARG);
    ac.beta1 = 1.0;
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tf, &tf, &tf, &tf, 1, &ac, 1, NULL),
                     PCS_ERR_INVALID_ARG);
    pcs_adamw_config_default(&ac);
    pcs_tensor_t th = {h, PCS_DTYPE_BF16, 8};
    assert_int_equal(pcs_kernel_adamw_update(cpu, &tf, &th, &tf, &tf, 1, &ac, 1, NULL),
                     PCS_ERR_UNSUPPORTED);
    pcs_sgd_config_t sc;
    pcs_sgd_config_default(&sc);
    sc.nesterov = 1; /* without momentum */
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tf, &tf, NULL, 1, &sc, 1, NULL),
                     PCS_ERR_INVALID_ARG);
    sc.nesterov = 0;
    sc.momentum = 0.9;
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tf, &tf, NULL, 1, &sc, 1, NULL),
                     PCS_ERR_INVALID_ARG);
    sc.lr = -1.0;
    assert_int_equal(pcs_kernel_sgd_update(cpu, &tf, &tf, &tf, 1, &sc, 1, NULL),
                     PCS_ERR_INVALID_ARG);
    /* copy and handles */
    assert_int_equal(cpu->copy(NULL, f, 4, PCS_COPY_D2D, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(cpu->copy(f, f, 4, (pcs_copy_kind_t)42, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(cpu->event_record(NULL, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(cpu->alloc(16, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kernel_cast(NULL, h, PCS_DTYPE_BF16, f, PCS_DTYPE_FP32, 1, NULL),
                     PCS_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_backend_is_always_available_and_named_cpu),
        cmocka_unit_test(test_cpu_backend_has_exactly_device_zero),
        cmocka_unit_test(test_unknown_backend_is_not_found_with_a_message),
        cmocka_unit_test(test_cuda_backend_without_device_or_build_is_unsupported_not_a_crash),
        cmocka_unit_test(test_cast_special_values_match_ieee_and_the_reference),
        cmocka_unit_test(test_cast_random_fp32_patterns_match_reference),
        cmocka_unit_test(test_cast_every_dtype_pair_rounds_once_via_fp32),
        cmocka_unit_test(test_simd_and_scalar_paths_give_identical_bits),
        cmocka_unit_test(test_cast_list_handles_mixed_dtypes_and_lengths),
        cmocka_unit_test(test_scale_rounds_once_from_fp32_product_in_each_dtype),
        cmocka_unit_test(test_accumulate_adds_in_fp32_and_rounds_once_to_dst),
        cmocka_unit_test(test_accumulate_sumsq_equals_accumulate_then_sum_squares),
        cmocka_unit_test(test_nonfinite_check_sets_flag_and_unscales_every_tensor),
        cmocka_unit_test(test_nonfinite_check_never_clears_flag_and_skips_multiply_when_inv_is_one),
        cmocka_unit_test(test_sum_squares_over_list_matches_long_double_reference),
        cmocka_unit_test(test_fp16_pre_post_divide_keeps_the_sum_finite_case10),
        cmocka_unit_test(test_adamw_defaults_are_pytorchs),
        cmocka_unit_test(test_adamw_matches_double_reference_with_bias_correction),
        cmocka_unit_test(test_adamw_first_step_moves_each_param_by_about_lr),
        cmocka_unit_test(test_sgd_variants_match_double_reference),
        cmocka_unit_test(test_sgd_first_step_copies_grad_into_momentum_buffer),
        cmocka_unit_test(test_optimizer_loops_equal_the_shared_element_math_bit_for_bit),
        cmocka_unit_test(test_fp64_optimizers_compute_in_double),
        cmocka_unit_test(test_fp64_accumulate_and_unscale_stay_in_double),
        cmocka_unit_test(test_fill_rounds_the_value_once_per_dtype),
        cmocka_unit_test(test_memory_streams_and_events_work_on_cpu),
        cmocka_unit_test(test_bad_input_gets_a_status_never_a_crash),
    };
    return cmocka_run_group_tests_name("kernels", tests, setup, NULL);
}
