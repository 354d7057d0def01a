/* Unit tests of the collectives layer without a network: the reduction arithmetic against an
 * independent double-precision-derived reference, the ncclAvg factor, ring chunking, and the
 * argument checks and size-1 semantics of pcs_coll_* (a single rank needs no rendezvous). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "pcs/half.h"

/* Independent reference for one rounded bf16/fp16 addition: add in double (exact for two
 * 11-bit-significand values within the fp16 range), then round to the dtype through fp32. The
 * double->fp32 step is exact because the double sum needs at most ~40 significant bits only
 * when exponents are far apart, and then the small addend is below half an ulp of the dtype. */
static uint16_t ref_add16(uint16_t a, uint16_t b, pcs_dtype_t dt)
{
    double x = dt == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(a) : pcs_fp16_to_f32(a);
    double y = dt == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(b) : pcs_fp16_to_f32(b);
    double s = x + y;
    /* Round the double to the dtype directly (not via fp32) with round-half-even on the dtype's
     * significand, so this reference does not reuse the code under test. */
    int mant_bits = dt == PCS_DTYPE_BF16 ? 8 : 11;
    if (s == 0.0 || isinf(s) || isnan(s))
        return dt == PCS_DTYPE_BF16 ? pcs_f32_to_bf16((float)s) : pcs_f32_to_fp16((float)s);
    int e;
    frexp(s, &e);                                  /* s = m * 2^e, 0.5 <= |m| < 1 */
    int min_e = dt == PCS_DTYPE_BF16 ? -125 : -13; /* smallest normal exponent (frexp form) */
    if (e < min_e)
        e = min_e; /* subnormal: fixed quantum */
    double q = ldexp(1.0, e - mant_bits);
    double r = nearbyint(s / q) * q; /* default rounding mode: ties to even */
    return dt == PCS_DTYPE_BF16 ? pcs_f32_to_bf16((float)r) : pcs_f32_to_fp16((float)r);
}

static void test_reduce_into_bf16_fp16_sum_is_correctly_rounded_per_step(void **s)
{
    (void)s;
    const pcs_dtype_t dts[] = {PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    uint32_t seed = 12345;
    for (int d = 0; d < 2; d++) {
        enum { N = 20000 };
        uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *want = malloc(N * 2);
        for (int i = 0; i < N; i++) {
            seed = seed * 1664525u + 1013904223u;
            float x =
                ldexpf((float)((int)(seed >> 8) % 4000 - 2000) / 1000.0f, (int)(seed % 7) - 3);
            seed = seed * 1664525u + 1013904223u;
            float y =
                ldexpf((float)((int)(seed >> 8) % 4000 - 2000) / 1000.0f, (int)(seed % 9) - 4);
            a[i] = dts[d] == PCS_DTYPE_BF16 ? pcs_f32_to_bf16(x) : pcs_f32_to_fp16(x);
            b[i] = dts[d] == PCS_DTYPE_BF16 ? pcs_f32_to_bf16(y) : pcs_f32_to_fp16(y);
            want[i] = ref_add16(a[i], b[i], dts[d]);
        }
        pcs_coll_reduce_into(a, b, N, dts[d], PCS_RED_SUM);
        for (int i = 0; i < N; i++)
            assert_int_equal(a[i], want[i]);
        free(a);
        free(b);
        free(want);
    }
}

static void test_reduce_into_bf16_tie_rounds_to_even(void **s)
{
    (void)s;
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0. */
    uint16_t a = pcs_f32_to_bf16(1.0f), b = pcs_f32_to_bf16(ldexpf(1.0f, -8));
    pcs_coll_reduce_into(&a, &b, 1, PCS_DTYPE_BF16, PCS_RED_SUM);
    assert_int_equal(a, 0x3f80);
    /* 1.0078125 + 2^-8: halfway to 1.015625, odd -> rounds up to even 1.015625. */
    a = 0x3f81;
    pcs_coll_reduce_into(&a, &b, 1, PCS_DTYPE_BF16, PCS_RED_SUM);
    assert_int_equal(a, 0x3f82);
}

static void test_reduce_into_fp16_overflow_becomes_inf(void **s)
{
    (void)s;
    uint16_t a = 0x7bff, b = 0x7bff; /* 65504 + 65504 */
    pcs_coll_reduce_into(&a, &b, 1, PCS_DTYPE_FP16, PCS_RED_SUM);
    assert_int_equal(a, 0x7c00);
}

static void test_reduce_into_max_ignores_nan_like_fmaxf(void **s)
{
    (void)s;
    float a[3] = {1.0f, NAN, -2.0f}, b[3] = {NAN, 3.0f, -1.0f};
    pcs_coll_reduce_into(a, b, 3, PCS_DTYPE_FP32, PCS_RED_MAX);
    assert_true(a[0] == 1.0f);
    assert_true(a[1] == 3.0f);
    assert_true(a[2] == -1.0f);
}

static void test_avg_factor_is_reciprocal_rounded_to_dtype(void **s)
{
    (void)s;
    assert_true(pcs_coll_avg_factor(4, PCS_DTYPE_FP32) == 0.25f);
    assert_true(pcs_coll_avg_factor(3, PCS_DTYPE_FP32) == (float)(1.0 / 3.0));
    /* bf16(1/3) = 0x3eab = 0.333984375; fp16(1/3) = 0x3555 = 0.333251953125 */
    assert_true(pcs_coll_avg_factor(3, PCS_DTYPE_BF16) == 0.333984375f);
    assert_true(pcs_coll_avg_factor(3, PCS_DTYPE_FP16) == 0.333251953125f);
    assert_true(pcs_coll_div_factor(0.0, PCS_DTYPE_FP32) == 1.0);
    assert_true(pcs_coll_div_factor(1.0, PCS_DTYPE_FP32) == 1.0);
    assert_true(pcs_coll_div_factor(1.5, PCS_DTYPE_FP32) == (float)(1.0 / 1.5));
    /* fp64: the double reciprocal (ATen's opmath for float64), not the fp32 one */
    assert_true(pcs_coll_div_factor(1.5, PCS_DTYPE_FP64) == 1.0 / 1.5);
    assert_true(pcs_coll_div_factor(1.5, PCS_DTYPE_FP64) != (double)(float)(1.0 / 1.5));
    assert_true(pcs_coll_avg_factor(3, PCS_DTYPE_FP64) == 1.0 / 3.0);
}

static void test_scale_rounds_once_in_dtype(void **s)
{
    (void)s;
    uint16_t x = pcs_f32_to_bf16(3.0f), y;
    pcs_coll_scale(&y, &x, 1, PCS_DTYPE_BF16, (float)(1.0 / 1.5));
    /* 3 * 0.6666667 = 2.0000001 in fp32 -> bf16 2.0 */
    assert_int_equal(y, pcs_f32_to_bf16(2.0f));
}

static void test_chunks_cover_count_with_first_chunks_longer(void **s)
{
    (void)s;
    const size_t counts[] = {0, 1, 3, 7, 10, 65537};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (int parts = 1; parts <= 5; parts++) {
            size_t next = 0;
            for (int k = 0; k < parts; k++) {
                size_t off, n;
                pcs_coll_chunk(counts[c], parts, k, &off, &n);
                assert_int_equal(off, next);
                assert_true(n == counts[c] / (size_t)parts || n == counts[c] / (size_t)parts + 1);
                next = off + n;
            }
            assert_int_equal(next, counts[c]);
        }
    }
}

// ---- the API on a single rank ----

static pcs_coll_t *solo(void)
{
    pcs_coll_config_t cfg = {0};
    cfg.backend = PCS_COLL_GLOO;
    cfg.group_name = "world";
    cfg.rank = 0;
    cfg.size = 1;
    cfg.timeout_ms = 1000;
    pcs_coll_t *c = NULL;
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_OK);
    assert_non_null(c);
    return c;
}

static void test_create_rejects_bad_config(void **s)
{
    (void)s;
    pcs_coll_t *c = NULL;
    pcs_coll_config_t cfg = {PCS_COLL_GLOO, NULL, "world", 0, 0, 1, 1000, NULL, NULL, -1, PCS_COLL_TRANSPORT_AUTO};
    cfg.rank = 1;
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    cfg.rank = 0;
    cfg.size = 0;
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    cfg.size = 2; /* no KV store */
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    cfg.size = 1;
    cfg.group_name = "a/b";
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    cfg.group_name = "world";
    cfg.backend = (pcs_coll_backend_t)99;
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_create(NULL, &c), PCS_ERR_INVALID_ARG);
    assert_null(c);
}

static void test_bad_arguments_are_invalid_arg_not_crash(void **s)
{
    (void)s;
    pcs_coll_t *c = solo();
    float buf[4] = {0};
    pcs_coll_red_t sum = {PCS_RED_SUM, 0, 0};
    assert_int_equal(pcs_coll_all_gather(c, NULL, buf, 4, PCS_DTYPE_FP32, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_all_gather(c, buf, buf, 4, (pcs_dtype_t)77, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_all_reduce(c, buf, buf, 1, PCS_DTYPE_INT64, &sum, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_all_reduce(c, buf, buf, 1, PCS_DTYPE_FP32, NULL, NULL),
                     PCS_ERR_INVALID_ARG);
    pcs_coll_red_t bad = {(pcs_red_op_t)9, 0, 0};
    assert_int_equal(pcs_coll_all_reduce(c, buf, buf, 1, PCS_DTYPE_FP32, &bad, NULL),
                     PCS_ERR_INVALID_ARG);
    pcs_coll_red_t maxdiv = {PCS_RED_MAX, 2.0, 0};
    assert_int_equal(pcs_coll_reduce_scatter(c, buf, buf, 1, PCS_DTYPE_FP32, &maxdiv, NULL),
                     PCS_ERR_INVALID_ARG);
    pcs_coll_red_t nandiv = {PCS_RED_SUM, NAN, 0};
    assert_int_equal(pcs_coll_reduce_scatter(c, buf, buf, 1, PCS_DTYPE_FP32, &nandiv, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_broadcast(c, buf, 1, PCS_DTYPE_FP32, 1, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_send(c, buf, 1, PCS_DTYPE_FP32, 0, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_recv(c, buf, 1, PCS_DTYPE_FP32, -1, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_all_gather(c, buf, buf, SIZE_MAX / 2, PCS_DTYPE_FP32, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_coll_group_end(c), PCS_ERR_STATE);
    assert_int_equal(pcs_coll_group_start(c), PCS_OK);
    assert_int_equal(pcs_coll_barrier(c), PCS_ERR_STATE);
    assert_int_equal(pcs_coll_group_end(c), PCS_OK);
    /* NULL with zero bytes is fine */
    assert_int_equal(pcs_coll_all_gather(c, NULL, NULL, 0, PCS_DTYPE_FP32, NULL), PCS_OK);
    /* argument errors do not poison the communicator */
    assert_int_equal(pcs_coll_barrier(c), PCS_OK);
    pcs_coll_destroy(c);
}

static void test_single_rank_ops_apply_factors_and_copy(void **s)
{
    (void)s;
    pcs_coll_t *c = solo();
    float in[3] = {1.0f, -3.0f, 0.3f}, out[3] = {0};
    assert_int_equal(pcs_coll_all_gather(c, in, out, 3, PCS_DTYPE_FP32, NULL), PCS_OK);
    assert_memory_equal(in, out, sizeof in);
    pcs_coll_red_t avg = {PCS_RED_AVG, 0, 0};
    assert_int_equal(pcs_coll_reduce_scatter(c, in, out, 3, PCS_DTYPE_FP32, &avg, NULL), PCS_OK);
    assert_memory_equal(in, out, sizeof in);
    pcs_coll_red_t prepost = {PCS_RED_SUM, 2.0, 4.0};
    assert_int_equal(pcs_coll_all_reduce(c, in, out, 3, PCS_DTYPE_FP32, &prepost, NULL), PCS_OK);
    for (int i = 0; i < 3; i++)
        assert_true(out[i] == (in[i] * 0.5f) * 0.25f);
    assert_int_equal(pcs_coll_broadcast(c, out, 3, PCS_DTYPE_FP32, 0, NULL), PCS_OK);
    assert_int_equal(pcs_coll_group_start(c), PCS_OK);
    assert_int_equal(pcs_coll_all_gather(c, in, out, 3, PCS_DTYPE_FP32, NULL), PCS_OK);
    assert_int_equal(pcs_coll_group_end(c), PCS_OK);
    assert_memory_equal(in, out, sizeof in);
    assert_string_equal(pcs_coll_backend_name(c), "gloo");
    assert_int_equal(pcs_coll_size(c), 1);
    /* the bench-only raw Gloo calls refuse a single rank instead of touching an unconnected
     * context */
    assert_int_equal(pcs_coll_gloo_raw_all_gather(c, in, out, sizeof in), PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_coll_gloo_raw_all_reduce_f32(NULL, out, 3), PCS_ERR_UNSUPPORTED);
    pcs_coll_destroy(c);
}

static void test_abort_poisons_later_calls_with_reason(void **s)
{
    (void)s;
    pcs_coll_t *c = solo();
    float v = 1.0f;
    pcs_coll_abort(c, "membership changed");
    pcs_coll_abort(c, "twice is fine");
    assert_int_equal(pcs_coll_all_gather(c, &v, &v, 1, PCS_DTYPE_FP32, NULL), PCS_ERR_STATE);
    assert_non_null(strstr(pcs_last_error(), "membership changed"));
    pcs_coll_destroy(c);
    pcs_coll_destroy(NULL);
}

static void test_nccl_backend_absent_or_needs_store(void **s)
{
    (void)s;
    pcs_coll_config_t cfg = {PCS_COLL_NCCL, NULL, "world", 0, 0, 2, 1000, NULL, NULL, -1, PCS_COLL_TRANSPORT_AUTO};
    pcs_coll_t *c = NULL;
    /* size 2 without a store is rejected before the backend is touched */
    assert_int_equal(pcs_coll_create(&cfg, &c), PCS_ERR_INVALID_ARG);
    assert_null(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_into_bf16_fp16_sum_is_correctly_rounded_per_step),
        cmocka_unit_test(test_reduce_into_bf16_tie_rounds_to_even),
        cmocka_unit_test(test_reduce_into_fp16_overflow_becomes_inf),
        cmocka_unit_test(test_reduce_into_max_ignores_nan_like_fmaxf),
        cmocka_unit_test(test_avg_factor_is_reciprocal_rounded_to_dtype),
        cmocka_unit_test(test_scale_rounds_once_in_dtype),
        cmocka_unit_test(test_chunks_cover_count_with_first_chunks_longer),
        cmocka_unit_test(test_create_rejects_bad_config),
        cmocka_unit_test(test_bad_arguments_are_invalid_arg_not_crash),
        cmocka_unit_test(test_single_rank_ops_apply_factors_and_copy),
        cmocka_unit_test(test_abort_poisons_later_calls_with_reason),
        cmocka_unit_test(test_nccl_backend_absent_or_needs_store),
    };
    return cmocka_run_group_tests_name("coll", tests, NULL, NULL);
}
