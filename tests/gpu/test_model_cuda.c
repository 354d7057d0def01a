/* Differential test of the built-in MLP on the "cuda" nn implementation against the CPU twin
 * (STYLE.md B9): the same model, parameters (copied H2D), inputs and output gradient on both; two
 * training steps, then an eval forward; outputs, every parameter gradient, the input gradient and
 * the BatchNorm buffers are compared, over relu/gelu x none/LayerNorm/BatchNorm x residual x bias x
 * fp32/bf16/fp16 parameters (+ fp32 gradients of low-precision parameters, + an fp32 unit inside
 * a bf16 model). Exits 77 (skip) when the cuda backend is not built or no device is present.
 *
 * Tolerance rule. The two sides differ only in GEMM summation order and GELU's erf/exp (CUDA's
 * erff/expf against the twin's polynomials, a few ulps); LayerNorm's row sums follow one stated
 * order on both (test_layernorm_rows_match_the_cpu_twin_bit_for_bit).
 * For a tensor whose values carry dtype dt, element i must satisfy
 *     |gpu_i - cpu_i| <= 4 * u(dt) * sqrt(K) * (|cpu_i| + rms(cpu))
 * with u = 2^-23 (fp32), 2^-7 (bf16), 2^-10 (fp16) the spacing at 1.0, and K the reduction length:
 * K = 64 (the widest fan-in / batch here) for bf16/fp16 values, which are re-rounded after every
 * op so differences do not accumulate across layers; K = 64 * 4 for fp32 values, whose order
 * differences accumulate through the 4 Linear layers. Low-precision tensors must also be mostly
 * bit-identical (>= 50% of elements; a flip needs an fp32 sum within ~2^-16 of a rounding
 * boundary, so a correct implementation gives far more), which catches a missing or wrong
 * rounding that the ulp bound alone would let through. num_batches_tracked must be equal.
 * One legitimate difference is outside any such rule: a ReLU input within summation-order noise
 * of 0 (about 1e-6 relative) can take different branches on the two sides, which changes whole
 * gradient rows. That happens for a few in 10^7 activations, so a ReLU configuration that fails
 * is re-drawn with new data, at most twice; a real defect fails every draw. */
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
#include "test_util.h"

enum { ROWS = 33, MAX_ROWS = 40, IN = 32, OUT = 10, NH = 3, MAXP = 32 };
static const uint32_t k_hidden[NH] = {64, 64, 48};

static const pcs_backend_ops_t *gpu;
static pcs_stream_t stream;

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
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
    assert_int_equal(gpu->sync(stream), PCS_OK);
}

static void d2h(void *h, const void *d, size_t bytes)
{
    assert_int_equal(gpu->sync(stream), PCS_OK);
    assert_int_equal(gpu->copy(h, d, bytes, PCS_COPY_D2H, stream), PCS_OK);
    assert_int_equal(gpu->sync(stream), PCS_OK);
}

// ---- comparison ----

static double unit(pcs_dtype_t dt)
{
    return dt == PCS_DTYPE_BF16   ? ldexp(1, -7)
           : dt == PCS_DTYPE_FP16 ? ldexp(1, -10)
                                  : ldexp(1, -23);
}

/* Compare n values (both as fp32) that carry dtype dt, per the rule in the header; returns the
 * number of violations (the first few are printed). */
static size_t compare(const char *what, const float *cpu, const float *gpu_v, size_t n,
                      pcs_dtype_t dt)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)cpu[i] * cpu[i];
    double rms = n ? sqrt(ss / (double)n) : 0;
    double k = dt == PCS_DTYPE_FP32 ? 64.0 * 4 : 64.0;
    double scale = 4 * unit(dt) * sqrt(k);
    size_t bad = 0, exact = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double c = cpu[i], g = gpu_v[i];
        if (memcmp(&cpu[i], &gpu_v[i], sizeof(float)) == 0) {
            exact++;
            continue;
        }
        double tol = scale * (fabs(c) + rms), err = fabs(g - c);
        if (!(err <= tol)) { /* NaN fails too */
            if (bad++ < 4)
                print_message("%s[%zu]: cpu %.9g gpu %.9g (tol %.3g)\n", what, i, c, g, tol);
        }
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
    }
    if (dt != PCS_DTYPE_FP32 && n >= 8 && exact * 2 < n) {
        print_message("%s: only %zu of %zu elements bit-identical\n", what, exact, n);
        bad++;
    }
    if (bad)
        print_message("%s: %zu elements outside the tolerance\n", what, bad);
    if (getenv("PCS_TEST_VERBOSE"))
        print_message("%-40s n %6zu exact %5.1f%% worst err/tol %.3f\n", what, n,
                      100.0 * (double)exact / (double)n, worst);
    return bad;
}

/* A tensor of numel elements stored as dt (host copy for cpu, device copy for gpu) -> fp32. */
static size_t compare_stored(const char *what, const void *host, const void *dev, size_t numel,
                             pcs_dtype_t dt, pcs_dtype_t carries)
{
    size_t es = pcs_dtype_size(dt);
    void *g = malloc(numel * es);
    float *a = malloc(numel * sizeof(float)), *b = malloc(numel * sizeof(float));
    assert_non_null(g);
    assert_non_null(a);
    assert_non_null(b);
    d2h(g, dev, numel * es);
    if (dt == PCS_DTYPE_FP64) {
        for (size_t i = 0; i < numel; i++) {
            a[i] = (float)((const double *)host)[i];
            b[i] = (float)((const double *)g)[i];
        }
    } else {
        pcs_to_f32(host, dt, numel, a);
        pcs_to_f32(g, dt, numel, b);
    }
    size_t bad = compare(what, a, b, numel, carries);
    free(g);
    free(a);
    free(b);
    return bad;
}

// ---- one configuration ----

typedef struct {
    pcs_act_t act;
    pcs_norm_t norm;
    int residual, bias;
    pcs_dtype_t pdt, gdt;
    int override; /* layers.1 is an fp32 unit inside the low-precision model */
} cfg_t;

/* One configuration on both sides; returns the number of tolerance violations. */
static size_t run_config(const cfg_t *t)
{
    size_t bad = 0;
    pcs_mlp_config_t c = {IN, OUT, NH, k_hidden, t->act, t->norm, t->bias, t->residual};
    pcs_mlp_t *mc = NULL, *mg = NULL;
    assert_int_equal(pcs_mlp_create(&c, MAX_ROWS, &mc), PCS_OK);
    assert_int_equal(pcs_mlp_create_on(&c, MAX_ROWS, gpu, stream, &mg), PCS_OK);
    assert_ptr_equal(pcs_mlp_backend(mg), gpu);
    uint32_t np = pcs_mlp_num_params(mc), nb = pcs_mlp_num_buffers(mc);
    assert_true(np <= MAXP && nb <= MAXP);
    void *hp[MAXP], *hg[MAXP], *hb[MAXP], *dp[MAXP], *dg[MAXP], *db[MAXP];
    pcs_dtype_t pd[MAXP], gd[MAXP], bd[MAXP];
    char label[160];

    for (uint32_t i = 0; i < np; i++) {
        const pcs_named_tensor_t *p = pcs_mlp_param(mc, i);
        float *v = malloc(p->numel * sizeof(float));
        assert_non_null(v);
        assert_int_equal(pcs_mlp_init_tensor(mc, 11, 0, i, 0, p->numel, v), PCS_OK);
        for (uint64_t k = 0; k < p->numel; k++)
            v[k] += 0.1f * urand(); /* norm weights away from 1, biases away from 0 */
        int fp32 = t->override && strncmp(p->fqn, "layers.1.", 9) == 0;
        pd[i] = fp32 ? PCS_DTYPE_FP32 : t->pdt;
        gd[i] = fp32 ? PCS_DTYPE_FP32 : t->gdt;
        size_t pb = p->numel * pcs_dtype_size(pd[i]), gb = p->numel * pcs_dtype_size(gd[i]);
        hp[i] = malloc(pb);
        hg[i] = calloc(1, gb);
        assert_non_null(hp[i]);
        assert_non_null(hg[i]);
        pcs_from_f32(v, p->numel, pd[i], hp[i]);
        dp[i] = dalloc(pb);
        dg[i] = dalloc(gb);
        h2d(dp[i], hp[i], pb);
        h2d(dg[i], hg[i], gb);
        assert_int_equal(pcs_mlp_bind_param(mc, i, pd[i], hp[i]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_param(mg, i, pd[i], dp[i]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(mc, i, gd[i], hg[i]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(mg, i, gd[i], dg[i]), PCS_OK);
        free(v);
    }
    for (uint32_t i = 0; i < nb; i++) {
        const pcs_named_tensor_t *b = pcs_mlp_buffer(mc, i);
        bd[i] = b->dtype == PCS_DTYPE_INT64 ? PCS_DTYPE_INT64 : t->pdt;
        size_t bytes = b->numel * pcs_dtype_size(bd[i]);
        hb[i] = calloc(1, bytes);
        assert_non_null(hb[i]);
        if (bd[i] != PCS_DTYPE_INT64) {
            float v[128];
            assert_true(b->numel <= 128);
            assert_int_equal(pcs_mlp_init_tensor(mc, 11, 1, i, 0, b->numel, v), PCS_OK);
            pcs_from_f32(v, b->numel, bd[i], hb[i]);
        }
        db[i] = dalloc(bytes);
        h2d(db[i], hb[i], bytes);
        assert_int_equal(pcs_mlp_bind_buffer(mc, i, bd[i], hb[i]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_buffer(mg, i, bd[i], db[i]), PCS_OK);
    }
    if (t->override) {
        uint32_t blk = (uint32_t)pcs_mlp_find_module(mc, "layers.1");
        assert_int_equal(pcs_mlp_set_cast(mc, blk, PCS_DTYPE_FP32, t->pdt), PCS_OK);
        assert_int_equal(pcs_mlp_set_cast(mg, blk, PCS_DTYPE_FP32, t->pdt), PCS_OK);
    }

    float hx[ROWS * IN], hgo[ROWS * OUT], hgi[ROWS * IN], got[ROWS * IN];
    float *dx = dalloc(sizeof hx), *dgo = dalloc(sizeof hgo), *dgi = dalloc(sizeof hgi);
    for (size_t k = 0; k < ROWS * IN; k++)
        hx[k] = 2 * urand();
    pcs_round_to(hx, ROWS * IN, t->pdt);
    h2d(dx, hx, sizeof hx);
    const float *yc, *yg;
    pcs_dtype_t odc, odg;
    for (int step = 0; step < 2; step++) {
        assert_int_equal(pcs_mlp_forward(mc, hx, t->pdt, ROWS, 1, NULL, &yc, &odc), PCS_OK);
        assert_int_equal(pcs_mlp_forward(mg, dx, t->pdt, ROWS, 1, NULL, &yg, &odg), PCS_OK);
        assert_int_equal(odc, odg);
        d2h(got, yg, ROWS * OUT * sizeof(float));
        snprintf(label, sizeof label, "step %d output", step);
        bad += compare(label, yc, got, ROWS * OUT, odc);

        for (size_t k = 0; k < ROWS * OUT; k++)
            hgo[k] = urand();
        h2d(dgo, hgo, sizeof hgo);
        assert_int_equal(pcs_mlp_backward_input(mc, hgo, NULL, hgi), PCS_OK);
        assert_int_equal(pcs_mlp_backward_input(mg, dgo, NULL, dgi), PCS_OK);
        d2h(got, dgi, sizeof got);
        snprintf(label, sizeof label, "step %d grad input", step);
        bad += compare(label, hgi, got, ROWS * IN, t->pdt);
        for (uint32_t i = 0; i < np; i++) {
            const pcs_named_tensor_t *p = pcs_mlp_param(mc, i);
            snprintf(label, sizeof label, "step %d grad %s", step, p->fqn);
            /* the gradient carries the parameter's dtype even when stored wider */
            bad += compare_stored(label, hg[i], dg[i], p->numel, gd[i], pd[i]);
        }
        for (uint32_t i = 0; i < nb; i++) {
            const pcs_named_tensor_t *b = pcs_mlp_buffer(mc, i);
            if (bd[i] == PCS_DTYPE_INT64) {
                int64_t n_gpu = -1;
                d2h(&n_gpu, db[i], sizeof n_gpu);
                assert_int_equal(n_gpu, *(const int64_t *)hb[i]);
                assert_int_equal(n_gpu, step + 1);
            } else {
                snprintf(label, sizeof label, "step %d %s", step, b->fqn);
                bad += compare_stored(label, hb[i], db[i], b->numel, bd[i], bd[i]);
            }
        }
    }
    assert_int_equal(pcs_mlp_forward(mc, hx, t->pdt, ROWS, 0, NULL, &yc, &odc), PCS_OK);
    assert_int_equal(pcs_mlp_forward(mg, dx, t->pdt, ROWS, 0, NULL, &yg, &odg), PCS_OK);
    d2h(got, yg, ROWS * OUT * sizeof(float));
    bad += compare("eval output", yc, got, ROWS * OUT, odc);

    pcs_mlp_destroy(mg);
    pcs_mlp_destroy(mc);
    for (uint32_t i = 0; i < np; i++) {
        free(hp[i]);
        free(hg[i]);
        gpu->free(dp[i]);
        gpu->free(dg[i]);
    }
    for (uint32_t i = 0; i < nb; i++) {
        free(hb[i]);
        gpu->free(db[i]);
    }
    gpu->free(dx);
    gpu->free(dgo);
    gpu->free(dgi);
    return bad;
}

static void run_all(pcs_dtype_t pdt, pcs_dtype_t gdt, int override)
{
    for (int act = PCS_ACT_RELU; act <= PCS_ACT_GELU; act++)
        for (int norm = PCS_NORM_NONE; norm <= PCS_NORM_BATCHNORM; norm++)
            for (int res = 0; res <= 1; res++)
                for (int bias = 0; bias <= 1; bias++) {
                    cfg_t t = {(pcs_act_t)act, (pcs_norm_t)norm, res, bias, pdt, gdt, override};
                    /* ReLU: up to 3 draws (see the header); GELU has no branch: one */
                    int draws = act == PCS_ACT_RELU ? 3 : 1;
                    size_t bad = 0;
                    for (int d = 0; d < draws; d++) {
                        if (getenv("PCS_TEST_VERBOSE"))
                            print_message("# act %d norm %d residual %d bias %d params %s grads "
                                          "%s%s draw %d\n",
                                          act, norm, res, bias, pcs_dtype_name(pdt),
                                          pcs_dtype_name(gdt), override ? " fp32 unit" : "", d);
                        bad = run_config(&t);
                        if (bad == 0)
                            break;
                        print_message("# act %d norm %d residual %d bias %d params %s: draw %d "
                                      "had %zu violations%s\n",
                                      act, norm, res, bias, pcs_dtype_name(pdt), d, bad,
                                      d + 1 < draws ? ", drawing new data" : "");
                    }
                    if (bad)
                        fail_msg("act %d norm %d residual %d bias %d params %s grads %s: %zu "
                                 "values outside the tolerance in every draw",
                                 act, norm, res, bias, pcs_dtype_name(pdt), pcs_dtype_name(gdt),
                                 bad);
                }
}

static void test_fp32_model_matches_cpu_twin_to_summation_order(void **state)
{
    (void)state;
    run_all(PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0);
}

static void test_bf16_model_matches_cpu_twin(void **state)
{
    (void)state;
    run_all(PCS_DTYPE_BF16, PCS_DTYPE_BF16, 0);
}

static void test_fp16_model_matches_cpu_twin(void **state)
{
    (void)state;
    run_all(PCS_DTYPE_FP16, PCS_DTYPE_FP16, 0);
}

static void test_low_precision_params_with_fp32_and_fp64_grads_match_cpu_twin(void **state)
{
    (void)state;
    run_all(PCS_DTYPE_BF16, PCS_DTYPE_FP32, 0);
    run_all(PCS_DTYPE_FP16, PCS_DTYPE_FP64, 0);
}

static void test_fp32_unit_inside_bf16_model_matches_cpu_twin(void **state)
{
    (void)state;
    run_all(PCS_DTYPE_BF16, PCS_DTYPE_BF16, 1);
}

/* Column-sum kernels run one thread per column (db, LayerNorm/BatchNorm dweight and dbias): a
 * layer wider than 2^20 columns (4096 blocks of 256, the element-wise grid cap) must still get
 * every column. Backward from the same x, dy and saved statistics sums each column over the rows
 * in the CPU's order on both sides, so the results are bit-identical; the device outputs start as
 * NaN so an unwritten column fails. */
static void test_column_sums_cover_layers_wider_than_the_grid_cap(void **state)
{
    (void)state;
    const uint32_t R = 3, D = (1u << 20) + 37;
    const size_t n = (size_t)R * D;
    pcs_nn_t *cn = NULL, *gn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &cn), PCS_OK);
    assert_int_equal(pcs_nn_create(gpu, stream, &gn), PCS_OK);
    float *hx = malloc(n * sizeof(float)), *hdy = malloc(n * sizeof(float));
    float *hw = malloc(D * sizeof(float)), *hb = malloc(D * sizeof(float));
    float *hsave = malloc(4 * (size_t)D * sizeof(float));
    float *cout = malloc(2 * (size_t)D * sizeof(float)),
          *gout = malloc(2 * (size_t)D * sizeof(float));
    assert_true(hx && hdy && hw && hb && hsave && cout && gout);
    for (size_t i = 0; i < n; i++) {
        hx[i] = urand();
        hdy[i] = urand();
    }
    for (uint32_t j = 0; j < D; j++) {
        hw[j] = urand();
        hb[j] = urand();
        hsave[j] = 0.25f * urand();              /* BN mean / LN: first 2R are (mean, rstd) */
        hsave[D + j] = 1.0f + 0.5f * urand();    /* BN invstd */
        hsave[2 * D + j] = hsave[3 * D + j] = 0; /* running stats copies: unused by backward */
    }
    for (uint32_t r = 0; r < R; r++) {
        hsave[2 * r] = 0.1f * (float)r;
        hsave[2 * r + 1] = 1.25f;
    }
    float *dx = dalloc(n * sizeof(float)), *ddy = dalloc(n * sizeof(float));
    float *dw = dalloc(D * sizeof(float)), *db = dalloc(D * sizeof(float));
    float *dsave = dalloc(4 * (size_t)D * sizeof(float)),
          *dout = dalloc(2 * (size_t)D * sizeof(float));
    h2d(dx, hx, n * sizeof(float));
    h2d(ddy, hdy, n * sizeof(float));
    h2d(dw, hw, D * sizeof(float));
    h2d(db, hb, D * sizeof(float));
    h2d(dsave, hsave, 4 * (size_t)D * sizeof(float));
    /* acc 1: the same stores accumulating (pcs_nn_grad_t.accumulate) into what pass 0 wrote */
    for (int ka = 0; ka < 2 * (PCS_NN_BATCHNORM + 1); ka++) {
        int kind = PCS_NN_LAYERNORM + ka / 2, acc = ka % 2;
        if (!acc) {
            assert_int_equal(pcs_kernel_fill(gpu, dout, PCS_DTYPE_FP32, 2 * (size_t)D, NAN, stream),
                             PCS_OK);
            memset(cout, 0xff, 2 * (size_t)D * sizeof(float));
        }
        pcs_nn_grad_t cgw = {cout, PCS_DTYPE_FP32, PCS_DTYPE_FP32, acc};
        pcs_nn_grad_t cgb = {cout + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, acc};
        pcs_nn_grad_t ggw = {dout, PCS_DTYPE_FP32, PCS_DTYPE_FP32, acc};
        pcs_nn_grad_t ggb = {dout + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, acc};
        const char *what;
        if (kind <= PCS_NN_BATCHNORM) {
            what = kind == PCS_NN_LAYERNORM ? "LayerNorm dweight|dbias" : "BatchNorm dweight|dbias";
            pcs_nn_norm_t p;
            memset(&p, 0, sizeof p);
            p.kind = (pcs_nn_norm_kind_t)kind;
            p.rows = R;
            p.dim = D;
            p.dtype = p.weight_dtype = p.bias_dtype = PCS_DTYPE_FP32;
            p.weight = hw;
            p.bias = hb;
            p.save = hsave;
            assert_int_equal(pcs_nn_norm_bwd(cn, &p, hx, hdy, NULL, &cgw, &cgb), PCS_OK);
            p.weight = dw;
            p.bias = db;
            p.save = dsave;
            assert_int_equal(pcs_nn_norm_bwd(gn, &p, dx, ddy, NULL, &ggw, &ggb), PCS_OK);
        } else {
            what = "Linear db";
            pcs_nn_linear_t l = {R, 1, D, PCS_DTYPE_FP32, hw, NULL, NULL};
            pcs_nn_grad_t none = {NULL, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
            assert_int_equal(pcs_nn_linear_bwd_params(cn, &l, hdy, hx, &none, &cgb), PCS_OK);
            l.weight = dw;
            assert_int_equal(pcs_nn_linear_bwd_params(gn, &l, ddy, dx, &none, &ggb), PCS_OK);
        }
        d2h(gout, dout, 2 * (size_t)D * sizeof(float));
        size_t first = kind <= PCS_NN_BATCHNORM ? 0 : D, bad = 0, first_bad = 0;
        for (size_t j = first; j < 2 * (size_t)D; j++)
            if (memcmp(&cout[j], &gout[j], sizeof(float)) != 0 && bad++ == 0)
                first_bad = j;
        if (bad)
            fprintf(stderr, "%s%s: %zu of %zu columns differ, first at %zu (cpu %g gpu %g)\n", what,
                    acc ? " (accumulating)" : "", bad, 2 * (size_t)D - first, first_bad,
                    (double)cout[first_bad], (double)gout[first_bad]);
        assert_int_equal(bad, 0);
    }
    void *dev[] = {dx, ddy, dw, db, dsave, dout};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        gpu->free(dev[i]);
    free(hx);
    free(hdy);
    free(hw);
    free(hb);
    free(hsave);
    free(cout);
    free(gout);
    pcs_nn_destroy(gn);
    pcs_nn_destroy(cn);
}

/* LayerNorm forward and backward on rows of several lengths (one element, under a warp, one lane
 * block and one more, one whole chunk, many with a tail, longer than a chunk) and offsets, output
 * in fp32 and bf16: the saved mean and 1/std, the output, dx, dweight and dbias are bit-identical
 * to the CPU twin's, which test_nn pins to nn_math.h's stated fp32 lane order. The device outputs
 * start as NaN, so an unwritten element fails. */
static void test_layernorm_rows_match_the_cpu_twin_bit_for_bit(void **state)
{
    (void)state;
    const uint32_t dims[] = {1, 7, 32, 33, 256, 1031, 4099};
    enum { R = 5 };
    pcs_nn_t *cn = NULL, *gn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &cn), PCS_OK);
    assert_int_equal(pcs_nn_create(gpu, stream, &gn), PCS_OK);
    for (size_t c = 0; c < 2 * sizeof dims / sizeof dims[0]; c++) {
        uint32_t D = dims[c / 2];
        pcs_dtype_t dt = c % 2 ? PCS_DTYPE_BF16 : PCS_DTYPE_FP32;
        size_t n = (size_t)R * D, vb = n * sizeof(float), wbytes = D * sizeof(float);
        /* host: inputs, then the cpu's and the gpu's y, dx, [dw | db], save */
        float *hx = malloc(vb), *hdy = malloc(vb), *hw = malloc(wbytes), *hb = malloc(wbytes);
        float *cy = malloc(vb), *cdx = malloc(vb), *cg = malloc(2 * wbytes), csave[2 * R];
        float *gy = malloc(vb), *gdx = malloc(vb), *gg = malloc(2 * wbytes), gsave[2 * R];
        assert_true(hx && hdy && hw && hb && cy && cdx && cg && gy && gdx && gg);
        for (size_t i = 0; i < n; i++) {
            hx[i] = 2.0f * urand() + 40.0f * (float)(i / D); /* rows centred at 0, 40, ... */
            hdy[i] = urand();
        }
        for (uint32_t j = 0; j < D; j++) {
            hw[j] = 1.0f + 0.5f * urand();
            hb[j] = 0.25f * urand();
        }
        /* device: inputs d_*, outputs o_* */
        float *d_x = dalloc(vb), *d_dy = dalloc(vb), *d_w = dalloc(wbytes), *d_b = dalloc(wbytes);
        float *o_y = dalloc(vb), *o_dx = dalloc(vb), *o_g = dalloc(2 * wbytes);
        float *o_save = dalloc(2 * R * sizeof(float));
        h2d(d_x, hx, vb);
        h2d(d_dy, hdy, vb);
        h2d(d_w, hw, wbytes);
        h2d(d_b, hb, wbytes);
        const struct {
            float *p;
            size_t n;
        } outs[] = {{o_y, n}, {o_dx, n}, {o_g, 2 * (size_t)D}, {o_save, 2 * R}};
        for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++)
            assert_int_equal(
                pcs_kernel_fill(gpu, outs[k].p, PCS_DTYPE_FP32, outs[k].n, NAN, stream), PCS_OK);
        pcs_nn_norm_t p;
        memset(&p, 0, sizeof p);
        p.kind = PCS_NN_LAYERNORM;
        p.rows = R;
        p.dim = D;
        p.dtype = dt;
        p.weight_dtype = p.bias_dtype = PCS_DTYPE_FP32;
        p.training = 1;
        pcs_nn_norm_t q = p;
        p.weight = hw, p.bias = hb, p.save = csave;
        q.weight = d_w, q.bias = d_b, q.save = o_save;
        pcs_nn_grad_t cgw = {cg, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t cgb = {cg + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t ggw = {o_g, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t ggb = {o_g + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        assert_int_equal(pcs_nn_norm_fwd(cn, &p, hx, cy), PCS_OK);
        assert_int_equal(pcs_nn_norm_bwd(cn, &p, hx, hdy, cdx, &cgw, &cgb), PCS_OK);
        assert_int_equal(pcs_nn_norm_fwd(gn, &q, d_x, o_y), PCS_OK);
        assert_int_equal(pcs_nn_norm_bwd(gn, &q, d_x, d_dy, o_dx, &ggw, &ggb), PCS_OK);
        d2h(gy, o_y, vb);
        d2h(gdx, o_dx, vb);
        d2h(gg, o_g, 2 * wbytes);
        d2h(gsave, o_save, sizeof gsave);
        size_t bad = 0;
        bad += memcmp(csave, gsave, sizeof csave) != 0;
        for (size_t i = 0; i < n; i++)
            bad += (memcmp(&cy[i], &gy[i], 4) != 0) + (memcmp(&cdx[i], &gdx[i], 4) != 0);
        for (size_t j = 0; j < 2 * (size_t)D; j++)
            bad += memcmp(&cg[j], &gg[j], 4) != 0;
        if (bad)
            fprintf(stderr,
                    "LayerNorm D = %u %s: %zu values differ (mean cpu %a gpu %a, rstd %a %a)\n", D,
                    pcs_dtype_name(dt), bad, (double)csave[0], (double)gsave[0], (double)csave[1],
                    (double)gsave[1]);
        assert_int_equal(bad, 0);
        void *dev[] = {d_x, d_dy, d_w, d_b, o_y, o_dx, o_g, o_save};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            gpu->free(dev[i]);
        free(hx), free(hdy), free(hw), free(hb), free(cy), free(cdx), free(cg), free(gy), free(gdx);
        free(gg);
    }
    pcs_nn_destroy(gn);
    pcs_nn_destroy(cn);
}

static int setup(void **state)
{
    (void)state;
    if (pcs_backend_get("cuda", &gpu) != PCS_OK)
        return -1;
    return gpu->stream_create(&stream) == PCS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    gpu->stream_destroy(stream);
    return 0;
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
        cmocka_unit_test(test_fp32_model_matches_cpu_twin_to_summation_order),
        cmocka_unit_test(test_bf16_model_matches_cpu_twin),
        cmocka_unit_test(test_fp16_model_matches_cpu_twin),
        cmocka_unit_test(test_low_precision_params_with_fp32_and_fp64_grads_match_cpu_twin),
        cmocka_unit_test(test_fp32_unit_inside_bf16_model_matches_cpu_twin),
        cmocka_unit_test(test_column_sums_cover_layers_wider_than_the_grid_cap),
        cmocka_unit_test(test_layernorm_rows_match_the_cpu_twin_bit_for_bit),
    };
    return cmocka_run_group_tests_name("model_cuda", tests, setup, teardown);
}
