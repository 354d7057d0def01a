/* Unit tests of the nn vtable (kernels/include/pcs/nn.h) on the CPU twin: the registry, argument
 * validation of every op (bad dims / dtypes / NULLs are PCS_ERR_INVALID_ARG with a message naming
 * the op, never a crash), exact small cases against values computed here, and the refactor guard:
 * a model built with pcs_mlp_create_on(cpu backend) gives the same bits as pcs_mlp_create. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "pcs/kernels.h"
#include "pcs/nn.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

/* bf16 rounding written here (not via pcs/half.h): keep 8 significant bits, ties to even. */
static float ref_bf16(float v)
{
    if (v == 0 || !isfinite(v))
        return v;
    int e;
    frexpf(v, &e);
    float q = ldexpf(1.0f, e - 8);
    return nearbyintf(v / q) * q;
}

// ---- registry ----

static void test_registry_knows_cpu_and_reports_cuda_and_unknown_names(void **state)
{
    (void)state;
    const pcs_nn_ops_t *ops = NULL;
    assert_int_equal(pcs_nn_get("cpu", &ops), PCS_OK);
    assert_string_equal(pcs_nn_ops_name(ops), "cpu");
    pcs_status_t rc = pcs_nn_get("cuda", &ops);
    /* this host may or may not have a device: either the table or UNSUPPORTED, nothing else */
    assert_true(rc == PCS_OK || rc == PCS_ERR_UNSUPPORTED);
    if (rc == PCS_OK)
        assert_string_equal(pcs_nn_ops_name(ops), "cuda");
    else
        assert_non_null(strstr(pcs_last_error(), "cuda"));
    assert_int_equal(pcs_nn_get("tpu", &ops), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_nn_get(NULL, &ops), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_nn_get("cpu", NULL), PCS_ERR_INVALID_ARG);

    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    assert_string_equal(pcs_nn_ops_name(pcs_nn_ops(nn)), "cpu");
    assert_string_equal(pcs_nn_backend(nn)->name, "cpu");
    pcs_nn_destroy(nn);
    pcs_nn_destroy(NULL);
    assert_int_equal(pcs_nn_create(NULL, NULL, NULL), PCS_ERR_INVALID_ARG);
}

static void test_cuda_model_is_unsupported_or_built_never_a_crash(void **state)
{
    (void)state;
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get("cuda", &be) != PCS_OK) {
        /* no device (or not built): the backend itself is refused, with a message */
        assert_true(strlen(pcs_last_error()) > 0);
        const pcs_nn_ops_t *ops;
        assert_int_equal(pcs_nn_get("cuda", &ops), PCS_ERR_UNSUPPORTED);
        return;
    }
    uint32_t hid[1] = {4};
    pcs_mlp_config_t c = {3, 2, 1, hid, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0};
    pcs_mlp_t *m = NULL;
    assert_int_equal(pcs_mlp_create_on(&c, 4, be, NULL, &m), PCS_OK);
    assert_ptr_equal(pcs_mlp_backend(m), be);
    pcs_mlp_destroy(m);
}

// ---- validation ----

static void expect_invalid(pcs_status_t rc, const char *op)
{
    assert_int_equal(rc, PCS_ERR_INVALID_ARG);
    if (!strstr(pcs_last_error(), op))
        fail_msg("message '%s' does not name %s", pcs_last_error(), op);
}

static void test_every_op_rejects_bad_arguments_with_a_message(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    float a[64] = {0}, b[64] = {0}, c[64] = {0}, save[64] = {0};
    uint16_t w16[64] = {0};

    expect_invalid(pcs_nn_copy_round(nn, a, NULL, 4, PCS_DTYPE_BF16), "copy_round");
    expect_invalid(pcs_nn_copy_round(nn, a, b, 4, PCS_DTYPE_INT64), "copy_round");
    expect_invalid(pcs_nn_copy_round(NULL, a, b, 4, PCS_DTYPE_FP32), "copy_round");
    assert_int_equal(pcs_nn_copy_round(nn, NULL, NULL, 0, PCS_DTYPE_FP16), PCS_OK); /* n == 0 */
    expect_invalid(pcs_nn_add(nn, a, b, NULL, 4, PCS_DTYPE_FP32), "add");
    expect_invalid(pcs_nn_add(nn, a, b, c, 4, PCS_DTYPE_FP64), "add");
    expect_invalid(pcs_nn_act_fwd(nn, (pcs_nn_act_t)7, a, b, 4, PCS_DTYPE_FP32), "act_fwd");
    expect_invalid(pcs_nn_act_fwd(nn, PCS_NN_GELU, NULL, b, 4, PCS_DTYPE_FP32), "act_fwd");
    expect_invalid(pcs_nn_act_bwd(nn, PCS_NN_RELU, a, b, NULL, c, 4), "act_bwd");

    pcs_nn_linear_t l = {2, 3, 4, PCS_DTYPE_BF16, w16, NULL, save};
    pcs_nn_linear_t bad = l;
    bad.rows = 0;
    expect_invalid(pcs_nn_linear_fwd(nn, &bad, a, b), "linear_fwd");
    bad = l;
    bad.in_dim = 0x80000000u;
    expect_invalid(pcs_nn_linear_fwd(nn, &bad, a, b), "linear_fwd");
    bad = l;
    bad.dtype = PCS_DTYPE_FP64;
    expect_invalid(pcs_nn_linear_fwd(nn, &bad, a, b), "linear_fwd");
    bad = l;
    bad.saved = NULL;
    bad.weight = NULL; /* a bf16 input-backward needs the weight or forward's saved copy */
    expect_invalid(pcs_nn_linear_bwd_input(nn, &bad, a, b), "linear_bwd_input");
    bad = l;
    bad.weight = NULL;
    expect_invalid(pcs_nn_linear_fwd(nn, &bad, a, b), "linear_fwd");
    expect_invalid(pcs_nn_linear_fwd(nn, &l, NULL, b), "linear_fwd");
    expect_invalid(pcs_nn_linear_fwd(nn, NULL, a, b), "linear_fwd");
    /* backward of a bf16 weight given no weight reads forward's `saved` copy */
    assert_int_equal(pcs_nn_linear_bwd_input(nn, &bad, a, b), PCS_OK);
    bad.dtype = PCS_DTYPE_FP32;
    expect_invalid(pcs_nn_linear_bwd_input(nn, &bad, a, b), "linear_bwd_input");
    expect_invalid(pcs_nn_linear_bwd_input(nn, &l, a, NULL), "linear_bwd_input");
    pcs_nn_grad_t g = {c, PCS_DTYPE_INT64, PCS_DTYPE_BF16, 0};
    expect_invalid(pcs_nn_linear_bwd_params(nn, &l, a, b, &g, NULL), "linear_bwd_params");
    g.dtype = PCS_DTYPE_FP32;
    g.param_dtype = PCS_DTYPE_NONE;
    expect_invalid(pcs_nn_linear_bwd_params(nn, &l, a, b, NULL, &g), "linear_bwd_params");
    g.param_dtype = PCS_DTYPE_BF16;
    expect_invalid(pcs_nn_linear_bwd_params(nn, &l, NULL, b, &g, NULL), "linear_bwd_params");

    float nw[4] = {1, 1, 1, 1}, nb[4] = {0}, rm[4] = {0}, rv[4] = {1, 1, 1, 1};
    pcs_nn_norm_t p = {PCS_NN_BATCHNORM,
                       1,
                       4,
                       PCS_DTYPE_FP32,
                       nw,
                       nb,
                       PCS_DTYPE_FP32,
                       PCS_DTYPE_FP32,
                       save,
                       rm,
                       rv,
                       PCS_DTYPE_FP32,
                       PCS_DTYPE_FP32,
                       NULL,
                       1};
    expect_invalid(pcs_nn_norm_fwd(nn, &p, a, b), "norm_fwd"); /* training BN with one row */
    assert_non_null(strstr(pcs_last_error(), "more than 1 value per channel"));
    pcs_nn_norm_t q = p;
    q.training = 0;
    assert_int_equal(pcs_nn_norm_fwd(nn, &q, a, b), PCS_OK); /* eval with one row is fine */
    q.running_var = NULL;
    expect_invalid(pcs_nn_norm_fwd(nn, &q, a, b), "norm_fwd");
    q = p;
    q.kind = (pcs_nn_norm_kind_t)9;
    expect_invalid(pcs_nn_norm_fwd(nn, &q, a, b), "norm_fwd");
    q = p;
    q.dim = 0;
    expect_invalid(pcs_nn_norm_fwd(nn, &q, a, b), "norm_fwd");
    q = p;
    q.weight_dtype = PCS_DTYPE_INT64;
    expect_invalid(pcs_nn_norm_fwd(nn, &q, a, b), "norm_fwd");
    q = p;
    q.kind = PCS_NN_LAYERNORM;
    q.save = NULL;
    expect_invalid(pcs_nn_norm_fwd(nn, &q, a, b), "norm_fwd");
    expect_invalid(pcs_nn_norm_bwd(nn, &q, a, b, c, NULL, NULL), "norm_bwd");
    q.save = save;
    expect_invalid(pcs_nn_norm_bwd(nn, &q, NULL, b, c, NULL, NULL), "norm_bwd");
    pcs_nn_destroy(nn);
}

// ---- exact small cases ----

/* Operands that are multiples of 1/8 with small numerators: every product and partial sum is
 * exact in fp32, so the only rounding is the one the contract names (after the bias, to bf16). */
static void test_bf16_linear_rounds_once_after_the_bias_and_saves_the_weight(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    enum { R = 3, K = 5, N = 4 };
    float x[R * K], w[N * K], bias[N], y[R * N], saved[N * K];
    uint16_t w16[N * K], b16[N];
    for (int i = 0; i < R * K; i++)
        x[i] = (float)((i * 7) % 13 - 6) / 8.0f;
    for (int i = 0; i < N * K; i++)
        w[i] = (float)((i * 5) % 11 - 5) / 8.0f;
    for (int j = 0; j < N; j++)
        bias[j] = 100.0f + (float)j / 4.0f; /* forces a visible bf16 rounding of the sum */
    pcs_from_f32(w, N * K, PCS_DTYPE_BF16, w16);
    pcs_from_f32(bias, N, PCS_DTYPE_BF16, b16);
    float bias_bf[N];
    pcs_to_f32(b16, PCS_DTYPE_BF16, N, bias_bf);
    pcs_nn_linear_t l = {R, K, N, PCS_DTYPE_BF16, w16, b16, saved};
    assert_int_equal(pcs_nn_linear_fwd(nn, &l, x, y), PCS_OK);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += x[r * K + k] * w[j * K + k];
            assert_true(y[r * N + j] == ref_bf16(s + bias_bf[j]));
        }
    for (int i = 0; i < N * K; i++)
        assert_true(saved[i] == w[i]); /* w's values are bf16-exact */

    /* backward: dX = dY W from `saved`, with the weight binding gone */
    float dy[R * N], dx[R * K];
    for (int i = 0; i < R * N; i++)
        dy[i] = (float)(i % 5 - 2) / 4.0f;
    l.weight = NULL;
    assert_int_equal(pcs_nn_linear_bwd_input(nn, &l, dy, dx), PCS_OK);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            float s = 0;
            for (int j = 0; j < N; j++)
                s += dy[r * N + j] * w[j * K + k];
            assert_true(dx[r * K + k] == s);
        }
    /* dW into an fp64 gradient of a bf16 parameter, db into fp32: exact sums, stored as is */
    double dw[N * K];
    float db[N];
    pcs_nn_grad_t gw = {dw, PCS_DTYPE_FP64, PCS_DTYPE_BF16, 0},
                  gb = {db, PCS_DTYPE_FP32, PCS_DTYPE_BF16, 0};
    assert_int_equal(pcs_nn_linear_bwd_params(nn, &l, dy, x, &gw, &gb), PCS_OK);
    for (int j = 0; j < N; j++) {
        float sb = 0;
        for (int r = 0; r < R; r++)
            sb += dy[r * N + j];
        assert_true(db[j] == ref_bf16(sb));
        for (int k = 0; k < K; k++) {
            float s = 0;
            for (int r = 0; r < R; r++)
                s += dy[r * N + j] * x[r * K + k];
            assert_true(dw[j * K + k] == (double)ref_bf16(s));
        }
    }
    pcs_nn_destroy(nn);
}

/* The built-in model gives no `saved` buffer and hands backward the re-gathered weight: the cpu
 * twin then converts a bounded block of the weight at a time (over features the GEMM does not
 * sum over). Forward, input-backward and the bf16 dW must equal the whole-weight path bit for
 * bit, also for a Linear above the block size (600 x 500). */
static void test_bf16_linear_without_saved_copy_matches_the_saved_path(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    const uint32_t R = 7, K = 600, N = 500;
    size_t nw = (size_t)N * K;
    float *x = malloc(R * K * sizeof(float)), *w = malloc(nw * sizeof(float));
    float *saved = malloc(nw * sizeof(float)), *dy = malloc(R * N * sizeof(float));
    float *y1 = malloc(R * N * sizeof(float)), *y2 = malloc(R * N * sizeof(float));
    float *dx1 = malloc(R * K * sizeof(float)), *dx2 = malloc(R * K * sizeof(float));
    uint16_t *w16 = malloc(nw * 2), *dw1 = malloc(nw * 2), *dw2 = malloc(nw * 2);
    assert_non_null(x && w && saved && dy && y1 && y2 && dx1 && dx2 && w16 && dw1 && dw2);
    for (size_t i = 0; i < (size_t)R * K; i++)
        x[i] = (float)((int)((i * 7919u) % 2001u) - 1000) / 512.0f;
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)((int)((i * 104729u) % 4001u) - 2000) / 4096.0f;
    for (size_t i = 0; i < (size_t)R * N; i++)
        dy[i] = (float)((int)((i * 31u) % 17u) - 8) / 16.0f;
    pcs_from_f32(w, nw, PCS_DTYPE_BF16, w16);
    pcs_nn_linear_t with = {R, K, N, PCS_DTYPE_BF16, w16, NULL, saved};
    pcs_nn_linear_t without = {R, K, N, PCS_DTYPE_BF16, w16, NULL, NULL};
    assert_int_equal(pcs_nn_linear_fwd(nn, &with, x, y1), PCS_OK);
    assert_int_equal(pcs_nn_linear_fwd(nn, &without, x, y2), PCS_OK);
    assert_memory_equal(y1, y2, R * N * sizeof(float));
    with.weight = NULL; /* forward's copy */
    assert_int_equal(pcs_nn_linear_bwd_input(nn, &with, dy, dx1), PCS_OK);
    assert_int_equal(pcs_nn_linear_bwd_input(nn, &without, dy, dx2), PCS_OK);
    assert_memory_equal(dx1, dx2, R * K * sizeof(float));
    /* dW: blocks of rows against one GEMM of the whole, both rounded to bf16 */
    pcs_nn_grad_t g2 = {dw2, PCS_DTYPE_BF16, PCS_DTYPE_BF16, 0};
    assert_int_equal(pcs_nn_linear_bwd_params(nn, &without, dy, x, &g2, NULL), PCS_OK);
    float *full = malloc(nw * sizeof(float));
    assert_non_null(full);
    for (uint32_t j = 0; j < N; j++)
        for (uint32_t k = 0; k < K; k++) {
            float s = 0;
            for (uint32_t r = 0; r < R; r++)
                s += dy[r * N + j] * x[r * K + k];
            full[(size_t)j * K + k] = s;
        }
    pcs_from_f32(full, nw, PCS_DTYPE_BF16, dw1);
    size_t off = 0;
    for (size_t i = 0; i < nw; i++) /* a 7-term sum: the GEMM may fuse; allow one bf16 ulp */
        if (dw1[i] != dw2[i] && abs((int)dw1[i] - (int)dw2[i]) > 1)
            off++;
    assert_int_equal(off, 0);
    free(full);
    free(x), free(w), free(saved), free(dy), free(y1), free(y2), free(dx1), free(dx2);
    free(w16), free(dw1), free(dw2);
    pcs_nn_destroy(nn);
}

static void test_gradient_accumulation_rounds_each_contribution_then_the_sum(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    /* 1 + 2^-8 is halfway between bf16 neighbours (ties to even: 1); 0.01171875 = 3 * 2^-8 is
     * bf16; the sums then round again */
    float g[3] = {1.0f, 256.0f, -3.0f}, src[3] = {1.00390625f, 1.0f, 0.01171875f};
    float want[3];
    for (int i = 0; i < 3; i++)
        want[i] = ref_bf16(g[i] + ref_bf16(src[i]));
    assert_int_equal(pcs_nn_copy_round(nn, src, src, 3, PCS_DTYPE_BF16), PCS_OK);
    assert_int_equal(pcs_nn_add(nn, g, g, src, 3, PCS_DTYPE_BF16), PCS_OK);
    for (int i = 0; i < 3; i++)
        assert_true(g[i] == want[i]);
    pcs_nn_destroy(nn);
}

/* Accumulating gradient stores (pcs_nn_grad_t.accumulate, what pcs-worker's backward does in
 * no-sync micro-batches) give the bits of storing the gradient in the parameter's dtype and
 * pcs_kernel_accumulate'ing it into the held values: for every parameter/gradient dtype pair, the
 * weight (the fp32 GEMM path and the blocked one) and the bias, 24 x 40 with 1500 rows (more than
 * one of OpenBLAS's K blocks, where beta = 1 would differ) and 7, and 500 x 600 (more than one
 * of the twin's weight blocks) with 300 and 7. FP64 cannot accumulate. */
static void test_accumulating_stores_equal_store_then_accumulate(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    const pcs_backend_ops_t *cpu = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    assert_int_equal(pcs_backend_get("cpu", &cpu), PCS_OK);
    const struct {
        uint32_t K, N, rows[2];
    } shapes[] = {{40, 24, {7, 1500}}, {600, 500, {7, 300}}};
    const pcs_dtype_t dts[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    int cases = 0;
    for (size_t sh = 0; sh < 2; sh++) {
        const uint32_t K = shapes[sh].K, N = shapes[sh].N, RMAX = shapes[sh].rows[1];
        const size_t nw = (size_t)N * K;
        float *x = malloc((size_t)RMAX * K * sizeof(float));
        float *dy = malloc((size_t)RMAX * N * sizeof(float));
        float *w = malloc(nw * sizeof(float)), *held = malloc((nw + N) * sizeof(float));
        char *gp = malloc((nw + N) * 4), *want = malloc((nw + N) * 4), *got = malloc((nw + N) * 4);
        char *wbuf = malloc(nw * 4);
        assert_non_null(x && dy && w && held && gp && want && got && wbuf);
        for (size_t i = 0; i < (size_t)RMAX * K; i++) /* full-mantissa values: the sums round */
            x[i] = (float)sin((double)i * 0.7) * 3.0f;
        for (size_t i = 0; i < (size_t)RMAX * N; i++)
            dy[i] = (float)cos((double)i * 1.3) / 7.0f;
        for (size_t i = 0; i < nw; i++)
            w[i] = (float)((int)((i * 31u) % 17u) - 8) / 16.0f;
        for (size_t i = 0; i < nw + N; i++) /* an earlier micro-batch's gradient */
            held[i] = (float)sin((double)i * 2.1) * 5.0f;
        for (size_t r = 0; r < 2; r++)
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 2; b++) {
                    pcs_dtype_t pdt = dts[a], gdt = b ? PCS_DTYPE_FP32 : pdt;
                    if (b && pdt == PCS_DTYPE_FP32)
                        continue;
                    size_t ge = pcs_dtype_size(gdt), pe = pcs_dtype_size(pdt);
                    pcs_from_f32(w, nw, pdt, wbuf); /* the weight in its compute dtype */
                    pcs_nn_linear_t l = {shapes[sh].rows[r], K, N, pdt, wbuf, NULL, NULL};
                    /* reference: store into parameter-dtype buffers, accumulate into held ones */
                    pcs_from_f32(held, nw + N, gdt, want);
                    pcs_nn_grad_t sw = {gp, pdt, pdt, 0}, sb = {gp + nw * pe, pdt, pdt, 0};
                    assert_int_equal(pcs_nn_linear_bwd_params(nn, &l, dy, x, &sw, &sb), PCS_OK);
                    assert_int_equal(pcs_kernel_accumulate(cpu, want, gdt, gp, pdt, nw + N, NULL),
                                     PCS_OK);
                    /* accumulating straight into the held values */
                    pcs_from_f32(held, nw + N, gdt, got);
                    pcs_nn_grad_t aw = {got, gdt, pdt, 1}, ab = {got + nw * ge, gdt, pdt, 1};
                    assert_int_equal(pcs_nn_linear_bwd_params(nn, &l, dy, x, &aw, &ab), PCS_OK);
                    if (memcmp(want, got, (nw + N) * ge) != 0)
                        fail_msg("%u x %u, rows %u, param %s grad %s: accumulating store differs",
                                 N, K, shapes[sh].rows[r], pcs_dtype_name(pdt),
                                 pcs_dtype_name(gdt));
                    cases++;
                }
        if (sh == 0) {
            pcs_nn_linear_t l32 = {7, K, N, PCS_DTYPE_FP32, w, NULL, NULL};
            double d64[40 * 24];
            pcs_nn_grad_t bad = {d64, PCS_DTYPE_FP64, PCS_DTYPE_FP32, 1};
            assert_int_equal(pcs_nn_linear_bwd_params(nn, &l32, dy, x, &bad, NULL),
                             PCS_ERR_INVALID_ARG);
            assert_non_null(strstr(pcs_last_error(), "accumulating into fp64"));
        }
        free(x), free(dy), free(w), free(held), free(gp), free(want), free(got), free(wbuf);
    }
    assert_int_equal(cases, 20);
    pcs_nn_destroy(nn);
}

// ---- LayerNorm: fp32 row sums in one fixed order, two-pass variance ----

/* The order nn_math.h states, written here from its words (element j to lane j % 32 in order of
 * j; then for s = 16..1: lane[l] += lane[l + s]), not from the twin's code. */
static float lane_order_sum(const float *v, size_t n)
{
    float lane[32] = {0};
    for (size_t j = 0; j < n; j++)
        lane[j % 32] += v[j];
    for (int s = 16; s > 0; s /= 2)
        for (int l = 0; l < s; l++)
            lane[l] = lane[l] + lane[l + s];
    return lane[0];
}

/* Forward and backward of rows of several lengths (a partial lane block, exactly one, several
 * with a tail) against the stated order computed here: the saved mean and 1/std, the output, dx,
 * dweight and dbias are bit-identical. This is also what the GPU kernels must give
 * (test_model_cuda). It runs the clone this host dispatches (AVX-512 on the CI VM): one that
 * contracted a multiply-add or summed in another order would fail here; the other clones are
 * the same source under other target flags (kernels/CMakeLists.txt turns contraction off). */
static void test_layernorm_rows_follow_the_stated_fp32_order_bit_for_bit(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    const uint32_t dims[] = {1, 7, 32, 33, 100, 1024, 1031};
    enum { R = 3 };
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        uint32_t D = dims[di];
        size_t n = (size_t)R * D;
        float *x = malloc(n * 4), *dy = malloc(n * 4), *y = malloc(n * 4), *dx = malloc(n * 4);
        float *w = malloc(D * 4), *b = malloc(D * 4), *dw = malloc(D * 4), *db = malloc(D * 4);
        float *ew = calloc(D, 4), *eb = calloc(D, 4), *tmp = malloc(D * 4), *tmp2 = malloc(D * 4);
        float save[2 * R];
        assert_true(x && dy && y && dx && w && b && dw && db && ew && eb && tmp && tmp2);
        for (size_t i = 0; i < n; i++) {
            x[i] = urand() * 3.0f + (float)(i / D) * 50.0f; /* rows centred at 0, 50, 100 */
            dy[i] = urand();
        }
        for (uint32_t j = 0; j < D; j++) {
            w[j] = 1.0f + 0.5f * urand();
            b[j] = 0.25f * urand();
        }
        pcs_nn_norm_t p = {.kind = PCS_NN_LAYERNORM, .rows = R, .dim = D, .dtype = PCS_DTYPE_FP32,
                           .weight = w, .weight_dtype = PCS_DTYPE_FP32, .bias = b,
                           .bias_dtype = PCS_DTYPE_FP32, .save = save, .training = 1};
        pcs_nn_grad_t gw = {dw, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t gb = {db, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        assert_int_equal(pcs_nn_norm_fwd(nn, &p, x, y), PCS_OK);
        assert_int_equal(pcs_nn_norm_bwd(nn, &p, x, dy, dx, &gw, &gb), PCS_OK);
        size_t bad = 0;
        for (uint32_t r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * D, *dyr = dy + (size_t)r * D;
            float mean = lane_order_sum(xr, D) / (float)D;
            for (uint32_t j = 0; j < D; j++)
                tmp[j] = (xr[j] - mean) * (xr[j] - mean);
            float rstd = 1.0f / sqrtf(lane_order_sum(tmp, D) / (float)D + 1e-5f);
            bad += memcmp(&save[2 * r], &mean, 4) != 0;
            bad += memcmp(&save[2 * r + 1], &rstd, 4) != 0;
            for (uint32_t j = 0; j < D; j++) {
                float xh = (xr[j] - mean) * rstd;
                float want = xh * w[j] + b[j];
                bad += memcmp(&y[(size_t)r * D + j], &want, 4) != 0;
                tmp[j] = dyr[j] * w[j];
                tmp2[j] = tmp[j] * xh;
                ew[j] += dyr[j] * xh;
                eb[j] += dyr[j];
            }
            float m1 = lane_order_sum(tmp, D) / (float)D, m2 = lane_order_sum(tmp2, D) / (float)D;
            for (uint32_t j = 0; j < D; j++) {
                float xh = (xr[j] - mean) * rstd;
                float want = rstd * (dyr[j] * w[j] - m1 - xh * m2);
                bad += memcmp(&dx[(size_t)r * D + j], &want, 4) != 0;
            }
        }
        bad += memcmp(dw, ew, D * 4) != 0;
        bad += memcmp(db, eb, D * 4) != 0;
        if (bad)
            fprintf(stderr, "D = %u: %zu values differ from the stated order\n", D, bad);
        assert_int_equal(bad, 0);
        free(x), free(dy), free(y), free(dx), free(w), free(b), free(dw), free(db);
        free(ew), free(eb), free(tmp), free(tmp2);
    }
    pcs_nn_destroy(nn);
}

/* Rows far from zero (mean 1e4 to 4e4, std ~1): the two-pass fp32 statistics stay close to the
 * fp64 ones computed here: the mean within 4e-7 relative, 1/std within 1e-4 (its error is about
 * d^2 / (2 var) for a mean d off, and one ulp of 4e4 is 2^-8). The one-pass form E[x^2] - mean^2
 * in fp32, computed here in the same lane order, fails the same bound (it loses every digit of
 * the variance: errors of 0.6 and more), so the bound tells the stable algorithm from the
 * unstable one. Its own seed: the data does not depend on the tests run before. */
static void test_layernorm_statistics_are_stable_far_from_zero(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    enum { R = 4, D = 1024 };
    static float x[R * D], y[R * D], sq[D];
    g_rng = 0x5eed1e4ull;
    float w[D], b[D], save[2 * R];
    for (int j = 0; j < D; j++) {
        w[j] = 1.0f;
        b[j] = 0.0f;
    }
    for (int i = 0; i < R * D; i++)
        x[i] = 1.0e4f * (float)(1 + i / D) + urand() * 1.7f;
    pcs_nn_norm_t p = {.kind = PCS_NN_LAYERNORM, .rows = R, .dim = D, .dtype = PCS_DTYPE_FP32,
                       .weight = w, .weight_dtype = PCS_DTYPE_FP32, .bias = b,
                       .bias_dtype = PCS_DTYPE_FP32, .save = save, .training = 1};
    assert_int_equal(pcs_nn_norm_fwd(nn, &p, x, y), PCS_OK);
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * D;
        double s = 0, ss = 0;
        for (int j = 0; j < D; j++)
            s += xr[j];
        double mean = s / D;
        for (int j = 0; j < D; j++)
            ss += (xr[j] - mean) * (xr[j] - mean);
        double rstd = 1.0 / sqrt(ss / D + 1e-5);
        assert_true(fabs(save[2 * r] - mean) <= 4 * 1e-7 * fabs(mean));
        assert_true(fabs(save[2 * r + 1] - rstd) <= 1e-4 * rstd);
        for (int j = 0; j < D; j++)
            sq[j] = xr[j] * xr[j];
        float m1 = lane_order_sum(xr, D) / D;
        float naive = 1.0f / sqrtf(fabsf(lane_order_sum(sq, D) / D - m1 * m1) + 1e-5f);
        assert_false(fabs(naive - rstd) <= 1e-4 * rstd);
    }
    pcs_nn_destroy(nn);
}

// ---- refactor guard ----

typedef struct {
    unsigned char *p;
    size_t n, cap;
} blob_t;

static void put(blob_t *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* Train-forward + backward twice, eval forward and a pipeline-stage pass; every output, gradient
 * and buffer byte goes into `out`. explicit_cpu: build with pcs_mlp_create_on(cpu backend). */
static void run_model(const pcs_mlp_config_t *c, pcs_dtype_t pdt, pcs_dtype_t gdt, int override,
                      int explicit_cpu, blob_t *out)
{
    g_rng = 0x1234567ull; /* both runs see the same values */
    pcs_mlp_t *m = NULL;
    const pcs_backend_ops_t *cpu = NULL;
    if (explicit_cpu) {
        assert_int_equal(pcs_backend_get("cpu", &cpu), PCS_OK);
        assert_int_equal(pcs_mlp_create_on(c, 8, cpu, NULL, &m), PCS_OK);
        assert_ptr_equal(pcs_mlp_backend(m), cpu);
    } else {
        assert_int_equal(pcs_mlp_create(c, 8, &m), PCS_OK);
        assert_string_equal(pcs_mlp_backend(m)->name, "cpu");
    }
    uint32_t np = pcs_mlp_num_params(m), nb = pcs_mlp_num_buffers(m);
    void *P[32], *G[32], *B[32];
    pcs_dtype_t gd[32];
    assert_true(np <= 32 && nb <= 32);
    for (uint32_t i = 0; i < np; i++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, i);
        float *v = malloc(t->numel * sizeof(float));
        assert_non_null(v);
        assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, i, 0, t->numel, v), PCS_OK);
        for (uint64_t k = 0; k < t->numel; k++)
            v[k] += 0.1f * urand(); /* norm weights away from 1, biases away from 0 */
        int fp32 = override && strncmp(t->fqn, "layers.1.", 9) == 0;
        pcs_dtype_t d = fp32 ? PCS_DTYPE_FP32 : pdt;
        gd[i] = fp32 ? PCS_DTYPE_FP32 : gdt;
        P[i] = malloc(t->numel * 8);
        G[i] = calloc(t->numel, 8);
        pcs_from_f32(v, t->numel, d, P[i]);
        assert_int_equal(pcs_mlp_bind_param(m, i, d, P[i]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(m, i, gd[i], G[i]), PCS_OK);
        free(v);
    }
    for (uint32_t i = 0; i < nb; i++) {
        const pcs_named_tensor_t *t = pcs_mlp_buffer(m, i);
        B[i] = calloc(t->numel, 8);
        if (t->dtype == PCS_DTYPE_INT64) {
            assert_int_equal(pcs_mlp_bind_buffer(m, i, PCS_DTYPE_INT64, B[i]), PCS_OK);
        } else {
            float v[64];
            assert_int_equal(pcs_mlp_init_tensor(m, 7, 1, i, 0, t->numel, v), PCS_OK);
            pcs_from_f32(v, t->numel, pdt, B[i]);
            assert_int_equal(pcs_mlp_bind_buffer(m, i, pdt, B[i]), PCS_OK);
        }
    }
    if (override)
        assert_int_equal(
            pcs_mlp_set_cast(m, (uint32_t)pcs_mlp_find_module(m, "layers.1"), PCS_DTYPE_FP32, pdt),
            PCS_OK);
    enum { R = 7 };
    uint32_t in = c->input_dim, od_n = c->output_dim;
    float x[R * 16], go[R * 16], gi[R * 16];
    for (uint32_t k = 0; k < R * in; k++)
        x[k] = 2 * urand();
    pcs_round_to(x, R * in, pdt);
    for (uint32_t k = 0; k < R * od_n; k++)
        go[k] = urand();
    const float *y;
    pcs_dtype_t od;
    for (int it = 0; it < 2; it++) {
        assert_int_equal(pcs_mlp_forward(m, x, pdt, R, 1, NULL, &y, &od), PCS_OK);
        put(out, y, R * od_n * sizeof(float));
        put(out, &od, sizeof od);
        assert_int_equal(pcs_mlp_backward_input(m, go, NULL, it ? gi : NULL), PCS_OK);
        if (it)
            put(out, gi, R * in * sizeof(float));
        for (uint32_t i = 0; i < np; i++)
            put(out, G[i], pcs_mlp_param(m, i)->numel * pcs_dtype_size(gd[i]));
        for (uint32_t i = 0; i < nb; i++)
            put(out, B[i], pcs_mlp_buffer(m, i)->numel * 8);
    }
    assert_int_equal(pcs_mlp_forward(m, x, pdt, R, 0, NULL, &y, &od), PCS_OK);
    put(out, y, R * od_n * sizeof(float));
    /* a pipeline stage: layers [1, n_hidden + 1) with the stage-input gradient */
    pcs_dtype_t sdt = override ? PCS_DTYPE_FP32 : pdt;
    uint32_t w1 = c->hidden_dims[0];
    float x1[R * 16];
    for (uint32_t k = 0; k < R * w1; k++)
        x1[k] = urand();
    pcs_round_to(x1, R * w1, sdt);
    assert_int_equal(pcs_mlp_forward_range(m, 1, c->n_hidden + 1, x1, sdt, R, 1, NULL, &y, &od),
                     PCS_OK);
    put(out, y, R * od_n * sizeof(float));
    assert_int_equal(pcs_mlp_backward_input(m, go, NULL, gi), PCS_OK);
    put(out, gi, R * w1 * sizeof(float));
    for (uint32_t i = 0; i < np; i++) {
        put(out, G[i], pcs_mlp_param(m, i)->numel * pcs_dtype_size(gd[i]));
        free(P[i]);
        free(G[i]);
    }
    for (uint32_t i = 0; i < nb; i++)
        free(B[i]);
    pcs_mlp_destroy(m);
}

static void test_explicit_cpu_backend_model_is_bit_identical_to_pcs_mlp_create(void **state)
{
    (void)state;
    uint32_t hid[3] = {16, 16, 10};
    const pcs_dtype_t dts[3] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};
    int configs = 0;
    for (int act = PCS_ACT_RELU; act <= PCS_ACT_GELU; act++)
        for (int norm = PCS_NORM_NONE; norm <= PCS_NORM_BATCHNORM; norm++)
            for (int res = 0; res <= 1; res++)
                for (int bias = 0; bias <= 1; bias++)
                    for (int d = 0; d < 3; d++)
                        for (int variant = 0; variant < (d ? 3 : 1); variant++) {
                            /* variant 0: grads in the param dtype; 1: fp32 grads of low-precision
                             * params; 2: an fp32 unit (layers.1) inside a low-precision model */
                            pcs_mlp_config_t c = {
                                12, 5, 3, hid, (pcs_act_t)act, (pcs_norm_t)norm, bias, res};
                            pcs_dtype_t gdt = variant == 1 ? PCS_DTYPE_FP32 : dts[d];
                            blob_t a = {0}, b = {0};
                            run_model(&c, dts[d], gdt, variant == 2, 0, &a);
                            run_model(&c, dts[d], gdt, variant == 2, 1, &b);
                            assert_true(a.n > 0);
                            assert_int_equal(a.n, b.n);
                            if (memcmp(a.p, b.p, a.n) != 0)
                                fail_msg("act %d norm %d res %d bias %d dtype %s variant %d: "
                                         "results differ",
                                         act, norm, res, bias, pcs_dtype_name(dts[d]), variant);
                            free(a.p);
                            free(b.p);
                            configs++;
                        }
    assert_int_equal(configs, 2 * 3 * 2 * 2 * 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_knows_cpu_and_reports_cuda_and_unknown_names),
        cmocka_unit_test(test_cuda_model_is_unsupported_or_built_never_a_crash),
        cmocka_unit_test(test_every_op_rejects_bad_arguments_with_a_message),
        cmocka_unit_test(test_bf16_linear_rounds_once_after_the_bias_and_saves_the_weight),
        cmocka_unit_test(test_bf16_linear_without_saved_copy_matches_the_saved_path),
        cmocka_unit_test(test_gradient_accumulation_rounds_each_contribution_then_the_sum),
        cmocka_unit_test(test_accumulating_stores_equal_store_then_accumulate),
        cmocka_unit_test(test_layernorm_rows_follow_the_stated_fp32_order_bit_for_bit),
        cmocka_unit_test(test_layernorm_statistics_are_stable_far_from_zero),
        cmocka_unit_test(test_explicit_cpu_backend_model_is_bit_identical_to_pcs_mlp_create),
    };
    return cmocka_run_group_tests_name("nn", tests, NULL, NULL);
}
