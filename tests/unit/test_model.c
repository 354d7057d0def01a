/* Unit tests of the built-in MLP (model/model.c) and losses (model/loss.c): forward and
 * backward against an independent fp64 implementation written here, finite differences, every
 * activation/norm, BatchNorm running statistics, bf16/fp16 rounding of outputs, dtype errors,
 * hook order and the FQN scheme shared with the planner. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/loss.h"
#include "model/model.h"

// ---- independent helpers ----

/* Round a double to bf16 / fp16 (nearest, ties to even) without pcs/half.h: via frexp. */
static double round_mant(double v, int mant_bits, int min_exp, double max_finite)
{
    if (v == 0 || !isfinite(v))
        return v;
    int e;
    frexp(v, &e); /* v = f * 2^e, 0.5 <= |f| < 1 */
    if (e - 1 < min_exp)
        e = min_exp + 1; /* subnormal: fixed quantum */
    double q = ldexp(1.0, e - 1 - mant_bits);
    double r = nearbyint(v / q) * q; /* default rounding mode: ties to even */
    if (fabs(r) > max_finite)
        return v > 0 ? INFINITY : -INFINITY;
    return r;
}

static double rbf16(double v)
{
    return round_mant(v, 7, -126, 3.3895313892515355e38);
}

static double rfp16(double v)
{
    return round_mant(v, 10, -14, 65504.0);
}

static uint64_t g_rng = 88172645463325252ull;
static double urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

// ---- fp64 reference MLP ----

typedef struct {
    pcs_mlp_config_t cfg;
    uint32_t nl; /* blocks */
    double **P;  /* params in model order */
    double **B;  /* buffers in model order */
} ref_t;

typedef struct {
    double *x_in[16], *lin[16], *nrm[16], *act[16], *out_blk[16];
    double *mean[16], *rstd[16];
    double *head_in, *out;
} cache_t;

static double gelu(double x)
{
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

static double gelu_d(double x)
{
    return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

/* Forward in fp64 with the model's parameter order. training: BN batch stats + running update. */
static void ref_forward(ref_t *r, const double *x, uint32_t R, int training, cache_t *c)
{
    const pcs_mlp_config_t *cfg = &r->cfg;
    uint32_t in = cfg->input_dim, pi = 0, bi = 0;
    const double *cur = x;
    for (uint32_t l = 0; l < r->nl; l++) {
        uint32_t o = cfg->hidden_dims[l];
        double *W = r->P[pi++], *b = cfg->bias ? r->P[pi++] : NULL;
        c->x_in[l] = (double *)cur;
        double *h = c->lin[l] = dalloc((size_t)R * o);
        for (uint32_t i = 0; i < R; i++)
            for (uint32_t j = 0; j < o; j++) {
                double s = b ? b[j] : 0;
                for (uint32_t k = 0; k < in; k++)
                    s += cur[i * in + k] * W[j * in + k];
                h[i * o + j] = s;
            }
        double *n = h;
        if (cfg->norm != PCS_NORM_NONE) {
            double *w = r->P[pi++], *bb = r->P[pi++];
            n = c->nrm[l] = dalloc((size_t)R * o);
            if (cfg->norm == PCS_NORM_LAYERNORM) {
                c->mean[l] = dalloc(R);
                c->rstd[l] = dalloc(R);
                for (uint32_t i = 0; i < R; i++) {
                    double mu = 0, var = 0;
                    for (uint32_t j = 0; j < o; j++)
                        mu += h[i * o + j] / o;
                    for (uint32_t j = 0; j < o; j++)
                        var += (h[i * o + j] - mu) * (h[i * o + j] - mu) / o;
                    c->mean[l][i] = mu;
                    c->rstd[l][i] = 1 / sqrt(var + 1e-5);
                    for (uint32_t j = 0; j < o; j++)
                        n[i * o + j] = (h[i * o + j] - mu) * c->rstd[l][i] * w[j] + bb[j];
                }
            } else {
                double *rm = r->B[bi++], *rv = r->B[bi++], *cnt = r->B[bi++];
                c->mean[l] = dalloc(o);
                c->rstd[l] = dalloc(o);
                for (uint32_t j = 0; j < o; j++) {
                    double mu = 0, var = 0;
                    if (training) {
                        for (uint32_t i = 0; i < R; i++)
                            mu += h[i * o + j] / R;
                        for (uint32_t i = 0; i < R; i++)
                            var += (h[i * o + j] - mu) * (h[i * o + j] - mu) / R;
                        rm[j] = 0.9 * rm[j] + 0.1 * mu;
                        rv[j] = 0.9 * rv[j] + 0.1 * var * R / (R - 1);
                    } else {
                        mu = rm[j];
                        var = rv[j];
                    }
                    c->mean[l][j] = mu;
                    c->rstd[l][j] = 1 / sqrt(var + 1e-5);
                    for (uint32_t i = 0; i < R; i++)
                        n[i * o + j] = (h[i * o + j] - mu) * c->rstd[l][j] * w[j] + bb[j];
                }
                if (training)
                    cnt[0] += 1;
            }
        }
        double *a = c->act[l] = dalloc((size_t)R * o);
        for (size_t e = 0; e < (size_t)R * o; e++)
            a[e] = cfg->act == PCS_ACT_GELU ? gelu(n[e]) : (n[e] > 0 ? n[e] : 0);
        double *ob = a;
        if (cfg->residual && in == o) {
            ob = c->out_blk[l] = dalloc((size_t)R * o);
            for (size_t e = 0; e < (size_t)R * o; e++)
                ob[e] = a[e] + cur[e];
        }
        cur = ob;
        in = o;
    }
    double *W = r->P[pi++], *b = cfg->bias ? r->P[pi++] : NULL;
    uint32_t O = cfg->output_dim;
    c->head_in = (double *)cur;
    c->out = dalloc((size_t)R * O);
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < O; j++) {
            double s = b ? b[j] : 0;
            for (uint32_t k = 0; k < in; k++)
                s += cur[i * in + k] * W[j * in + k];
            c->out[i * O + j] = s;
        }
}

/* Backward in fp64: G[p] receives dL/dparam given dL/dout. */
static void ref_backward(ref_t *r, const cache_t *c, const double *dout, uint32_t R, double **G)
{
    const pcs_mlp_config_t *cfg = &r->cfg;
    uint32_t np = 0;
    uint32_t pidx[16][4];
    for (uint32_t l = 0; l < r->nl; l++) {
        pidx[l][0] = np++;
        pidx[l][1] = cfg->bias ? np++ : 0;
        pidx[l][2] = cfg->norm != PCS_NORM_NONE ? np++ : 0;
        pidx[l][3] = cfg->norm != PCS_NORM_NONE ? np++ : 0;
    }
    uint32_t hw = np++, hb = cfg->bias ? np++ : 0;
    uint32_t O = cfg->output_dim;
    uint32_t in = r->nl ? cfg->hidden_dims[r->nl - 1] : cfg->input_dim;
    double *dcur = dalloc((size_t)R * in);
    for (uint32_t j = 0; j < O; j++)
        for (uint32_t k = 0; k < in; k++) {
            double s = 0;
            for (uint32_t i = 0; i < R; i++)
                s += dout[i * O + j] * c->head_in[i * in + k];
            G[hw][j * in + k] = s;
        }
    if (cfg->bias)
        for (uint32_t j = 0; j < O; j++) {
            double s = 0;
            for (uint32_t i = 0; i < R; i++)
                s += dout[i * O + j];
            G[hb][j] = s;
        }
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t k = 0; k < in; k++) {
            double s = 0;
            for (uint32_t j = 0; j < O; j++)
                s += dout[i * O + j] * r->P[hw][j * in + k];
            dcur[i * in + k] = s;
        }
    for (uint32_t l = r->nl; l-- > 0;) {
        uint32_t o = cfg->hidden_dims[l], li = l ? cfg->hidden_dims[l - 1] : cfg->input_dim;
        size_t n = (size_t)R * o;
        int res = cfg->residual && li == o;
        double *dn = dalloc(n);
        const double *pre_act = cfg->norm != PCS_NORM_NONE ? c->nrm[l] : c->lin[l];
        for (size_t e = 0; e < n; e++)
            dn[e] = dcur[e] * (cfg->act == PCS_ACT_GELU ? gelu_d(pre_act[e])
                                                        : (c->act[l][e] > 0 ? 1.0 : 0.0));
        double *dh = dn;
        if (cfg->norm != PCS_NORM_NONE) {
            double *w = r->P[pidx[l][2]];
            double *gw = G[pidx[l][2]], *gb = G[pidx[l][3]];
            dh = dalloc(n);
            const double *h = c->lin[l];
            if (cfg->norm == PCS_NORM_LAYERNORM) {
                for (uint32_t i = 0; i < R; i++) {
                    double mu = c->mean[l][i], rs = c->rstd[l][i], c1 = 0, c2 = 0;
                    for (uint32_t j = 0; j < o; j++) {
                        double xh = (h[i * o + j] - mu) * rs;
                        gw[j] += dn[i * o + j] * xh;
                        gb[j] += dn[i * o + j];
                        c1 += dn[i * o + j] * w[j] / o;
                        c2 += dn[i * o + j] * w[j] * xh / o;
                    }
                    for (uint32_t j = 0; j < o; j++) {
                        double xh = (h[i * o + j] - mu) * rs;
                        dh[i * o + j] = rs * (dn[i * o + j] * w[j] - c1 - xh * c2);
                    }
                }
            } else {
                for (uint32_t j = 0; j < o; j++) {
                    double mu = c->mean[l][j], rs = c->rstd[l][j], c1 = 0, c2 = 0;
                    for (uint32_t i = 0; i < R; i++) {
                        double xh = (h[i * o + j] - mu) * rs;
                        gw[j] += dn[i * o + j] * xh;
                        gb[j] += dn[i * o + j];
                        c1 += dn[i * o + j] * w[j] / R;
                        c2 += dn[i * o + j] * w[j] * xh / R;
                    }
                    for (uint32_t i = 0; i < R; i++) {
                        double xh = (h[i * o + j] - mu) * rs;
                        dh[i * o + j] = rs * (dn[i * o + j] * w[j] - c1 - xh * c2);
                    }
                }
            }
            free(dn);
        }
        double *W = r->P[pidx[l][0]], *gW = G[pidx[l][0]];
        const double *x = c->x_in[l];
        for (uint32_t j = 0; j < o; j++)
            for (uint32_t k = 0; k < li; k++) {
                double s = 0;
                for (uint32_t i = 0; i < R; i++)
                    s += dh[i * o + j] * x[i * li + k];
                gW[j * li + k] = s;
            }
        if (cfg->bias)
            for (uint32_t j = 0; j < o; j++) {
                double s = 0;
                for (uint32_t i = 0; i < R; i++)
                    s += dh[i * o + j];
                G[pidx[l][1]][j] = s;
            }
        double *dx = dalloc((size_t)R * li);
        for (uint32_t i = 0; i < R; i++)
            for (uint32_t k = 0; k < li; k++) {
                double s = res ? dcur[i * li + k] : 0;
                for (uint32_t j = 0; j < o; j++)
                    s += dh[i * o + j] * W[j * li + k];
                dx[i * li + k] = s;
            }
        free(dh);
        free(dcur);
        dcur = dx;
    }
    free(dcur);
}

static void cache_free(ref_t *r, cache_t *c)
{
    for (uint32_t l = 0; l < r->nl; l++) {
        free(c->lin[l]);
        free(c->nrm[l]);
        free(c->act[l]);
        free(c->out_blk[l]);
        free(c->mean[l]);
        free(c->rstd[l]);
    }
    free(c->out);
    memset(c, 0, sizeof *c);
}

// ---- fixture: a model with fp32 params bound, plus the fp64 reference ----

typedef struct {
    pcs_mlp_t *m;
    ref_t ref;
    float **pv; /* fp32 params */
    float **gv; /* fp32 grads */
    void **bv;  /* buffers */
    uint32_t np, nb;
} fix_t;

static void fix_init(fix_t *f, const pcs_mlp_config_t *cfg, uint32_t max_rows)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(pcs_mlp_create(cfg, max_rows, &f->m), PCS_OK);
    f->ref.cfg = *cfg;
    f->ref.nl = cfg->n_hidden;
    f->np = pcs_mlp_num_params(f->m);
    f->nb = pcs_mlp_num_buffers(f->m);
    f->pv = calloc(f->np, sizeof *f->pv);
    f->gv = calloc(f->np, sizeof *f->gv);
    f->bv = calloc(f->nb + 1, sizeof *f->bv);
    f->ref.P = calloc(f->np, sizeof(double *));
    f->ref.B = calloc(f->nb + 1, sizeof(double *));
    for (uint32_t p = 0; p < f->np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(f->m, p);
        f->pv[p] = calloc(t->numel, sizeof(float));
        f->gv[p] = calloc(t->numel, sizeof(float));
        f->ref.P[p] = dalloc(t->numel);
        assert_int_equal(pcs_mlp_init_tensor(f->m, 5, 0, p, 0, t->numel, f->pv[p]), PCS_OK);
        /* perturb norm weights/biases away from 1/0 so that their gradients matter */
        if (!strstr(t->fqn, "linear") && !strstr(t->fqn, "head"))
            for (uint64_t e = 0; e < t->numel; e++)
                f->pv[p][e] += (float)(0.5 * (urand() - 0.5));
        for (uint64_t e = 0; e < t->numel; e++)
            f->ref.P[p][e] = f->pv[p][e];
        assert_int_equal(pcs_mlp_bind_param(f->m, p, PCS_DTYPE_FP32, f->pv[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(f->m, p, PCS_DTYPE_FP32, f->gv[p]), PCS_OK);
    }
    for (uint32_t i = 0; i < f->nb; i++) {
        const pcs_named_tensor_t *t = pcs_mlp_buffer(f->m, i);
        f->ref.B[i] = dalloc(t->numel);
        if (t->dtype == PCS_DTYPE_INT64) {
            f->bv[i] = calloc(1, sizeof(int64_t));
            assert_int_equal(pcs_mlp_bind_buffer(f->m, i, PCS_DTYPE_INT64, f->bv[i]), PCS_OK);
        } else {
            f->bv[i] = calloc(t->numel, sizeof(float));
            assert_int_equal(pcs_mlp_init_tensor(f->m, 5, 1, i, 0, t->numel, f->bv[i]), PCS_OK);
            for (uint64_t e = 0; e < t->numel; e++)
                f->ref.B[i][e] = ((float *)f->bv[i])[e];
            assert_int_equal(pcs_mlp_bind_buffer(f->m, i, PCS_DTYPE_FP32, f->bv[i]), PCS_OK);
        }
    }
}

static void fix_free(fix_t *f)
{
    for (uint32_t p = 0; p < f->np; p++) {
        free(f->pv[p]);
        free(f->gv[p]);
        free(f->ref.P[p]);
    }
    for (uint32_t i = 0; i < f->nb; i++) {
        free(f->bv[i]);
        free(f->ref.B[i]);
    }
    free(f->pv);
    free(f->gv);
    free(f->bv);
    free(f->ref.P);
    free(f->ref.B);
    pcs_mlp_destroy(f->m);
}

static void assert_close_d(double got, double want, double rtol, double atol, const char *what,
                           size_t idx)
{
    if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
        print_error("%s[%zu]: got %.9g want %.9g\n", what, idx, got, want);
        fail();
    }
}

/* Forward + backward of the model and the reference on the same random batch; compare the
 * output, every gradient and (BatchNorm) the running statistics. */
static void check_against_reference(const pcs_mlp_config_t *cfg, uint32_t R)
{
    fix_t f;
    fix_init(&f, cfg, R);
    size_t nx = (size_t)R * cfg->input_dim, no = (size_t)R * cfg->output_dim;
    float *x = calloc(nx, sizeof(float)), *dout = calloc(no, sizeof(float));
    double *xd = dalloc(nx), *doutd = dalloc(no);
    for (size_t i = 0; i < nx; i++)
        xd[i] = x[i] = (float)(2 * urand() - 1);
    for (size_t i = 0; i < no; i++)
        doutd[i] = dout[i] = (float)(2 * urand() - 1);
    const float *out;
    pcs_dtype_t odt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(odt, PCS_DTYPE_FP32);
    cache_t c = {0};
    ref_forward(&f.ref, xd, R, 1, &c);
    for (size_t i = 0; i < no; i++)
        assert_close_d(out[i], c.out[i], 1e-4, 1e-5, "output", i);
    assert_int_equal(pcs_mlp_backward(f.m, dout, NULL), PCS_OK);
    double **G = calloc(f.np, sizeof(double *));
    for (uint32_t p = 0; p < f.np; p++)
        G[p] = dalloc(pcs_mlp_param(f.m, p)->numel);
    ref_backward(&f.ref, &c, doutd, R, G);
    for (uint32_t p = 0; p < f.np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(f.m, p);
        for (uint64_t e = 0; e < t->numel; e++)
            assert_close_d(f.gv[p][e], G[p][e], 1e-3, 1e-5, t->fqn, e);
        free(G[p]);
    }
    free(G);
    for (uint32_t i = 0; i < f.nb; i++) {
        const pcs_named_tensor_t *t = pcs_mlp_buffer(f.m, i);
        if (t->dtype == PCS_DTYPE_INT64) {
            assert_int_equal(*(int64_t *)f.bv[i], 1);
            assert_int_equal((int64_t)f.ref.B[i][0], 1);
        } else {
            for (uint64_t e = 0; e < t->numel; e++)
                assert_close_d(((float *)f.bv[i])[e], f.ref.B[i][e], 1e-4, 1e-6, t->fqn, e);
        }
    }
    cache_free(&f.ref, &c);
    free(x);
    free(dout);
    free(xd);
    free(doutd);
    fix_free(&f);
}

static pcs_mlp_config_t mkcfg(uint32_t in, const uint32_t *h, uint32_t nh, uint32_t out,
                              pcs_act_t act, pcs_norm_t norm, int bias, int residual)
{
    pcs_mlp_config_t c = {in, out, nh, h, act, norm, bias, residual};
    return c;
}

// ---- tests ----

static void test_fqn_scheme_matches_planner(void **state)
{
    (void)state;
    uint32_t h[2] = {8, 8};
    pcs_mlp_config_t cfg = mkcfg(4, h, 2, 3, PCS_ACT_GELU, PCS_NORM_BATCHNORM, 1, 1);
    pcs_mlp_t *m;
    assert_int_equal(pcs_mlp_create(&cfg, 4, &m), PCS_OK);
    const char *mods[] = {"",
                          "layers",
                          "layers.0",
                          "layers.0.linear",
                          "layers.0.norm",
                          "layers.0.act",
                          "layers.1",
                          "layers.1.linear",
                          "layers.1.norm",
                          "layers.1.act",
                          "head"};
    const char *cls[] = {"MLP",      "ModuleList", "MLPBlock",    "Linear", "BatchNorm1d", "GELU",
                         "MLPBlock", "Linear",     "BatchNorm1d", "GELU",   "Linear"};
    assert_int_equal(pcs_mlp_num_modules(m), 11);
    for (uint32_t i = 0; i < 11; i++) {
        assert_string_equal(pcs_mlp_module(m, i)->path, mods[i]);
        assert_string_equal(pcs_mlp_module(m, i)->cls, cls[i]);
    }
    const char *params[] = {"layers.0.linear.weight",
                            "layers.0.linear.bias",
                            "layers.0.norm.weight",
                            "layers.0.norm.bias",
                            "layers.1.linear.weight",
                            "layers.1.linear.bias",
                            "layers.1.norm.weight",
                            "layers.1.norm.bias",
                            "head.weight",
                            "head.bias"};
    assert_int_equal(pcs_mlp_num_params(m), 10);
    for (uint32_t i = 0; i < 10; i++)
        assert_string_equal(pcs_mlp_param(m, i)->fqn, params[i]);
    assert_int_equal(pcs_mlp_param(m, 0)->shape[0], 8);
    assert_int_equal(pcs_mlp_param(m, 0)->shape[1], 4);
    assert_int_equal(pcs_mlp_param(m, 8)->shape[0], 3);
    assert_int_equal(pcs_mlp_param(m, 8)->shape[1], 8);
    assert_int_equal(pcs_mlp_num_buffers(m), 6);
    assert_string_equal(pcs_mlp_buffer(m, 2)->fqn, "layers.0.norm.num_batches_tracked");
    assert_int_equal(pcs_mlp_buffer(m, 2)->dtype, PCS_DTYPE_INT64);
    assert_int_equal(pcs_mlp_buffer(m, 2)->ndim, 0);
    assert_int_equal(pcs_mlp_total_params(m),
                     (8 * 4 + 8 + 2 * 8) + (8 * 8 + 8 + 2 * 8) + 3 * 8 + 3);
    pcs_mlp_destroy(m);
}

static void test_init_linear_bounds_and_norm_constants(void **state)
{
    (void)state;
    uint32_t h[1] = {16};
    pcs_mlp_config_t cfg = mkcfg(9, h, 1, 2, PCS_ACT_RELU, PCS_NORM_LAYERNORM, 1, 0);
    pcs_mlp_t *m;
    assert_int_equal(pcs_mlp_create(&cfg, 2, &m), PCS_OK);
    float w[144], w2[144], nw[16], nb[16];
    assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, 0, 0, 144, w), PCS_OK);
    double lo = 1, hi = -1;
    for (int i = 0; i < 144; i++) {
        assert_true(fabsf(w[i]) <= 1.0f / 3.0f); /* 1/sqrt(in = 9) */
        lo = fmin(lo, w[i]);
        hi = fmax(hi, w[i]);
    }
    assert_true(lo < -0.2 && hi > 0.2); /* spread over the range, not all zero */
    /* shards fill themselves: elements [50, 60) equal the full tensor's */
    assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, 0, 50, 10, w2), PCS_OK);
    assert_memory_equal(w2, w + 50, 10 * sizeof(float));
    /* another seed gives other values */
    assert_int_equal(pcs_mlp_init_tensor(m, 8, 0, 0, 0, 144, w2), PCS_OK);
    assert_memory_not_equal(w2, w, 144 * sizeof(float));
    assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, 2, 0, 16, nw), PCS_OK);
    assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, 3, 0, 16, nb), PCS_OK);
    for (int i = 0; i < 16; i++) {
        assert_true(nw[i] == 1.0f);
        assert_true(nb[i] == 0.0f);
    }
    assert_int_equal(pcs_mlp_init_tensor(m, 7, 0, 0, 140, 10, w2), PCS_ERR_INVALID_ARG);
    pcs_mlp_destroy(m);
}

static void test_fp32_relu_plain_matches_fp64_reference(void **state)
{
    (void)state;
    uint32_t h[2] = {12, 7};
    pcs_mlp_config_t cfg = mkcfg(5, h, 2, 3, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0);
    check_against_reference(&cfg, 6);
}

static void test_fp32_gelu_layernorm_residual_matches_fp64_reference(void **state)
{
    (void)state;
    uint32_t h[3] = {6, 6, 4};
    pcs_mlp_config_t cfg = mkcfg(6, h, 3, 3, PCS_ACT_GELU, PCS_NORM_LAYERNORM, 1, 1);
    check_against_reference(&cfg, 5);
}

static void test_fp32_batchnorm_matches_fp64_reference_and_running_stats(void **state)
{
    (void)state;
    uint32_t h[2] = {9, 9};
    pcs_mlp_config_t cfg = mkcfg(4, h, 2, 2, PCS_ACT_RELU, PCS_NORM_BATCHNORM, 1, 1);
    check_against_reference(&cfg, 7);
}

static void test_fp32_no_bias_gelu_batchnorm_matches_fp64_reference(void **state)
{
    (void)state;
    uint32_t h[1] = {5};
    pcs_mlp_config_t cfg = mkcfg(3, h, 1, 4, PCS_ACT_GELU, PCS_NORM_BATCHNORM, 0, 0);
    check_against_reference(&cfg, 4);
}

static void test_head_only_model_matches_fp64_reference(void **state)
{
    (void)state;
    pcs_mlp_config_t cfg = mkcfg(7, NULL, 0, 2, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0);
    check_against_reference(&cfg, 3);
}

/* ReLU backward is threshold_backward(grad, result, 0): the gradient is dropped where the result
 * is <= 0, so a NaN activation (NaN <= 0 is false) passes its gradient on, as in PyTorch. */
static void test_relu_backward_passes_gradient_through_nan(void **state)
{
    (void)state;
    uint32_t h[1] = {2};
    pcs_mlp_config_t cfg = mkcfg(1, h, 1, 1, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0);
    fix_t f;
    fix_init(&f, &cfg, 1);
    /* layers.0.linear: weight [1, 1]^T = {1, -1}, bias 0; head: weight {2, 3}, bias 0 */
    const float w0[2] = {1.0f, -1.0f}, w1[2] = {2.0f, 3.0f};
    memcpy(f.pv[0], w0, sizeof w0);
    memset(f.pv[1], 0, 2 * sizeof(float));
    memcpy(f.pv[2], w1, sizeof w1);
    f.pv[3][0] = 0.0f;
    const float *out;
    pcs_dtype_t odt;
    float x = NAN, g = 1.0f;
    assert_int_equal(pcs_mlp_forward(f.m, &x, PCS_DTYPE_FP32, 1, 1, NULL, &out, &odt), PCS_OK);
    assert_true(isnan(out[0]));
    assert_int_equal(pcs_mlp_backward(f.m, &g, NULL), PCS_OK);
    /* d(out)/d(relu) = head.weight, passed through both NaN activations */
    assert_true(f.gv[1][0] == 2.0f);
    assert_true(f.gv[1][1] == 3.0f);
    /* a finite negative pre-activation still blocks its gradient */
    x = 1.0f;
    assert_int_equal(pcs_mlp_forward(f.m, &x, PCS_DTYPE_FP32, 1, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(pcs_mlp_backward(f.m, &g, NULL), PCS_OK);
    assert_true(f.gv[1][0] == 2.0f);
    assert_true(f.gv[1][1] == 0.0f);
    fix_free(&f);
}

/* Central finite differences of L = sum(out * R) on the C model itself (no reference). */
static void test_gradients_match_finite_differences(void **state)
{
    (void)state;
    uint32_t h[2] = {4, 4};
    pcs_mlp_config_t cfg = mkcfg(3, h, 2, 2, PCS_ACT_GELU, PCS_NORM_LAYERNORM, 1, 1);
    const uint32_t R = 3;
    fix_t f;
    fix_init(&f, &cfg, R);
    float x[9], wout[6];
    for (int i = 0; i < 9; i++)
        x[i] = (float)(2 * urand() - 1);
    for (int i = 0; i < 6; i++)
        wout[i] = (float)(2 * urand() - 1);
    const float *out;
    pcs_dtype_t odt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(pcs_mlp_backward(f.m, wout, NULL), PCS_OK);
    int checked = 0;
    for (uint32_t p = 0; p < f.np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(f.m, p);
        for (uint64_t e = 0; e < t->numel; e++) {
            float save = f.pv[p][e];
            double lp = 0, lm = 0;
            const float eps = 1e-2f;
            f.pv[p][e] = save + eps;
            assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 0, NULL, &out, &odt),
                             PCS_OK);
            for (int i = 0; i < 6; i++)
                lp += (double)out[i] * wout[i];
            f.pv[p][e] = save - eps;
            assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 0, NULL, &out, &odt),
                             PCS_OK);
            for (int i = 0; i < 6; i++)
                lm += (double)out[i] * wout[i];
            f.pv[p][e] = save;
            double fd = (lp - lm) / (2.0 * eps);
            assert_close_d(f.gv[p][e], fd, 2e-2, 2e-3, t->fqn, e);
            checked++;
        }
    }
    assert_true(checked > 50);
    fix_free(&f);
}

/* A single bf16 Linear: inputs/weights on a 1/8 grid so that fp32 accumulation is exact; the
 * output must be that exact sum rounded once to bf16 (checked with an independent rounding).
 * The same for fp16, where large sums overflow to inf. */
static void check_low_precision_linear(pcs_dtype_t dt, double scale)
{
    pcs_mlp_config_t cfg = mkcfg(16, NULL, 0, 8, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0);
    pcs_mlp_t *m;
    const uint32_t R = 4;
    assert_int_equal(pcs_mlp_create(&cfg, R, &m), PCS_OK);
    uint16_t w[128], b[8], gw[128], gb[8];
    float wf[128], bf[8], x[64], dout[32];
    for (int i = 0; i < 128; i++)
        wf[i] = (float)(((int)(urand() * 33) - 16) / 8.0 * scale);
    for (int i = 0; i < 8; i++)
        bf[i] = (float)(((int)(urand() * 33) - 16) / 8.0);
    for (int i = 0; i < 64; i++)
        x[i] = (float)(((int)(urand() * 33) - 16) / 8.0);
    for (int i = 0; i < 32; i++)
        dout[i] = (float)(((int)(urand() * 33) - 16) / 8.0);
    if (scale > 1000) /* one output row of 16 * 2 * 8192 = 262144: beyond fp16's 65504 */
        for (int k = 0; k < 16; k++) {
            x[k] = 2.0f;
            wf[k] = 8192.0f;
        }
    /* grid values are exact in both formats: storing them does not round */
    pcs_from_f32(wf, 128, dt, w);
    pcs_from_f32(bf, 8, dt, b);
    assert_int_equal(pcs_mlp_bind_param(m, 0, dt, w), PCS_OK);
    assert_int_equal(pcs_mlp_bind_param(m, 1, dt, b), PCS_OK);
    assert_int_equal(pcs_mlp_bind_grad(m, 0, dt, gw), PCS_OK);
    assert_int_equal(pcs_mlp_bind_grad(m, 1, dt, gb), PCS_OK);
    const float *out;
    pcs_dtype_t odt;
    /* fp32 input to a low-precision Linear is PyTorch's dtype error unless the unit casts */
    assert_int_equal(pcs_mlp_forward(m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "same dtype"));
    assert_int_equal(pcs_mlp_set_cast(m, 0, dt, PCS_DTYPE_NONE), PCS_OK);
    assert_int_equal(pcs_mlp_forward(m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(odt, dt);
    double (*rnd)(double) = dt == PCS_DTYPE_BF16 ? rbf16 : rfp16;
    int saw_inf = 0;
    for (uint32_t i = 0; i < R; i++)
        for (int j = 0; j < 8; j++) {
            double s = bf[j];
            for (int k = 0; k < 16; k++)
                s += (double)x[i * 16 + k] * wf[j * 16 + k];
            double want = rnd(s);
            saw_inf |= isinf(want);
            if (isinf(want))
                assert_true(isinf(out[i * 8 + j]) && (out[i * 8 + j] > 0) == (want > 0));
            else
                assert_true(out[i * 8 + j] == (float)want);
        }
    if (dt == PCS_DTYPE_FP16 && scale > 1000)
        assert_true(saw_inf);
    assert_int_equal(pcs_mlp_backward(m, dout, NULL), PCS_OK);
    float g[128];
    pcs_to_f32(gw, dt, 128, g);
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 16; k++) {
            double s = 0;
            for (uint32_t i = 0; i < R; i++)
                s += (double)dout[i * 8 + j] * x[i * 16 + k];
            assert_true(g[j * 16 + k] == (float)rnd(s));
        }
    pcs_to_f32(gb, dt, 8, g);
    for (int j = 0; j < 8; j++) {
        double s = 0;
        for (uint32_t i = 0; i < R; i++)
            s += dout[i * 8 + j];
        assert_true(g[j] == (float)rnd(s));
    }
    pcs_mlp_destroy(m);
}

static void test_bf16_linear_output_is_fp32_sum_rounded_once(void **state)
{
    (void)state;
    check_low_precision_linear(PCS_DTYPE_BF16, 1.0);
}

static void test_fp16_linear_rounds_once_and_overflows_to_inf(void **state)
{
    (void)state;
    check_low_precision_linear(PCS_DTYPE_FP16, 1.0);
    check_low_precision_linear(PCS_DTYPE_FP16, 4096.0);
}

/* Whole model with bf16 (and fp16) params: outputs and gradients are representable in the
 * compute dtype and within low-precision tolerance of the fp64 reference. */
static void check_low_precision_model(pcs_dtype_t dt, double rtol, double atol)
{
    uint32_t h[2] = {16, 16};
    pcs_mlp_config_t cfg = mkcfg(8, h, 2, 4, PCS_ACT_GELU, PCS_NORM_LAYERNORM, 1, 1);
    const uint32_t R = 8;
    fix_t f;
    fix_init(&f, &cfg, R);
    uint16_t **lp = calloc(f.np, sizeof *lp), **lg = calloc(f.np, sizeof *lg);
    for (uint32_t p = 0; p < f.np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(f.m, p);
        lp[p] = calloc(t->numel, 2);
        lg[p] = calloc(t->numel, 2);
        pcs_from_f32(f.pv[p], t->numel, dt, lp[p]);
        float *tmp = calloc(t->numel, sizeof(float));
        pcs_to_f32(lp[p], dt, t->numel, tmp);
        for (uint64_t e = 0; e < t->numel; e++)
            f.ref.P[p][e] = tmp[e]; /* the reference sees the same (rounded) parameters */
        free(tmp);
        assert_int_equal(pcs_mlp_bind_param(f.m, p, dt, lp[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(f.m, p, dt, lg[p]), PCS_OK);
    }
    assert_int_equal(pcs_mlp_set_cast(f.m, 0, dt, PCS_DTYPE_FP32), PCS_OK);
    float x[64], dout[32];
    double xd[64], doutd[32];
    for (int i = 0; i < 64; i++)
        x[i] = (float)(2 * urand() - 1);
    for (int i = 0; i < 64; i++)
        xd[i] = (dt == PCS_DTYPE_BF16 ? rbf16 : rfp16)(x[i]); /* the root casts its input */
    for (int i = 0; i < 32; i++)
        doutd[i] = dout[i] = (float)(urand() - 0.5);
    const float *out;
    pcs_dtype_t odt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(odt, PCS_DTYPE_FP32); /* output_dtype cast on the root */
    cache_t c = {0};
    ref_forward(&f.ref, xd, R, 1, &c);
    for (int i = 0; i < 32; i++) {
        assert_true(out[i] == (float)(dt == PCS_DTYPE_BF16 ? rbf16 : rfp16)(out[i]));
        assert_close_d(out[i], c.out[i], rtol, atol, "lp output", (size_t)i);
    }
    assert_int_equal(pcs_mlp_backward(f.m, dout, NULL), PCS_OK);
    double **G = calloc(f.np, sizeof(double *));
    for (uint32_t p = 0; p < f.np; p++)
        G[p] = dalloc(pcs_mlp_param(f.m, p)->numel);
    ref_backward(&f.ref, &c, doutd, R, G);
    for (uint32_t p = 0; p < f.np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(f.m, p);
        float *g = calloc(t->numel, sizeof(float));
        pcs_to_f32(lg[p], dt, t->numel, g);
        double gmax = 0;
        for (uint64_t e = 0; e < t->numel; e++)
            gmax = fmax(gmax, fabs(G[p][e]));
        for (uint64_t e = 0; e < t->numel; e++)
            assert_close_d(g[e], G[p][e], 4 * rtol, 4 * rtol * gmax + atol, t->fqn, e);
        free(g);
        free(G[p]);
        free(lp[p]);
        free(lg[p]);
    }
    free(G);
    free(lp);
    free(lg);
    cache_free(&f.ref, &c);
    fix_free(&f);
}

static void test_bf16_model_outputs_are_bf16_and_close_to_fp64(void **state)
{
    (void)state;
    check_low_precision_model(PCS_DTYPE_BF16, 5e-2, 3e-2);
}

static void test_fp16_model_outputs_are_fp16_and_close_to_fp64(void **state)
{
    (void)state;
    check_low_precision_model(PCS_DTYPE_FP16, 1e-2, 5e-3);
}

/* bf16 Linear feeding an fp32 LayerNorm (a full-precision override): the norm runs in fp32 on
 * bf16 input and its output stays bf16, like PyTorch's mixed-dtype layer_norm. */
static void test_mixed_norm_keeps_input_dtype(void **state)
{
    (void)state;
    uint32_t h[1] = {8};
    pcs_mlp_config_t cfg = mkcfg(4, h, 1, 2, PCS_ACT_RELU, PCS_NORM_LAYERNORM, 1, 0);
    fix_t f;
    fix_init(&f, &cfg, 4);
    uint16_t wl[32], bl[8], wh[16], bh[2];
    pcs_from_f32(f.pv[0], 32, PCS_DTYPE_BF16, wl);
    pcs_from_f32(f.pv[1], 8, PCS_DTYPE_BF16, bl);
    pcs_from_f32(f.pv[4], 16, PCS_DTYPE_BF16, wh);
    pcs_from_f32(f.pv[5], 2, PCS_DTYPE_BF16, bh);
    assert_int_equal(pcs_mlp_bind_param(f.m, 0, PCS_DTYPE_BF16, wl), PCS_OK);
    assert_int_equal(pcs_mlp_bind_param(f.m, 1, PCS_DTYPE_BF16, bl), PCS_OK);
    assert_int_equal(pcs_mlp_bind_param(f.m, 4, PCS_DTYPE_BF16, wh), PCS_OK);
    assert_int_equal(pcs_mlp_bind_param(f.m, 5, PCS_DTYPE_BF16, bh), PCS_OK);
    uint16_t g16[32];
    assert_int_equal(pcs_mlp_bind_grad(f.m, 0, PCS_DTYPE_BF16, g16), PCS_OK);
    assert_int_equal(pcs_mlp_bind_grad(f.m, 1, PCS_DTYPE_BF16, g16), PCS_OK);
    assert_int_equal(pcs_mlp_bind_grad(f.m, 4, PCS_DTYPE_BF16, g16), PCS_OK);
    assert_int_equal(pcs_mlp_bind_grad(f.m, 5, PCS_DTYPE_BF16, g16), PCS_OK);
    assert_int_equal(pcs_mlp_set_cast(f.m, 0, PCS_DTYPE_BF16, PCS_DTYPE_NONE), PCS_OK);
    float x[16], dout[8] = {1, -1, 0.5f, 2, 0, 1, -3, 1};
    for (int i = 0; i < 16; i++)
        x[i] = (float)(urand() - 0.5);
    const float *out;
    pcs_dtype_t odt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 4, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(odt, PCS_DTYPE_BF16);
    assert_int_equal(pcs_mlp_backward(f.m, dout, NULL), PCS_OK);
    /* the fp32 norm parameters received fp32 gradients that are not all bf16-representable */
    int non_bf16 = 0;
    for (int j = 0; j < 8; j++)
        non_bf16 += f.gv[2][j] != (float)rbf16(f.gv[2][j]);
    assert_true(non_bf16 > 0);
    fix_free(&f);
}

typedef struct {
    char log[64][32];
    int n;
    const pcs_mlp_t *m;
    int fail_at;
} hook_log_t;

static pcs_status_t rec(hook_log_t *h, const char *what, uint32_t mod)
{
    if (h->n == h->fail_at)
        return pcs_set_error(PCS_ERR_CANCELLED, "injected hook failure");
    const char *p = pcs_mlp_module(h->m, mod)->path;
    snprintf(h->log[h->n++], 32, "%s %s", what, *p ? p : "root");
    return PCS_OK;
}

static pcs_status_t h_pf(void *c, uint32_t m)
{
    return rec(c, "F<", m);
}
static pcs_status_t h_qf(void *c, uint32_t m)
{
    return rec(c, "F>", m);
}
static pcs_status_t h_pb(void *c, uint32_t m)
{
    return rec(c, "B<", m);
}
static pcs_status_t h_qb(void *c, uint32_t m)
{
    return rec(c, "B>", m);
}

static void test_hooks_fire_in_fsdp_order(void **state)
{
    (void)state;
    uint32_t h[1] = {4};
    pcs_mlp_config_t cfg = mkcfg(4, h, 1, 2, PCS_ACT_RELU, PCS_NORM_NONE, 1, 1);
    fix_t f;
    fix_init(&f, &cfg, 2);
    hook_log_t hl = {.m = f.m, .fail_at = -1};
    pcs_mlp_hooks_t hooks = {&hl, h_pf, h_qf, h_pb, h_qb};
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, d[4] = {1, 1, 1, 1};
    const float *out;
    pcs_dtype_t odt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 2, 1, &hooks, &out, &odt), PCS_OK);
    assert_int_equal(pcs_mlp_backward(f.m, d, &hooks), PCS_OK);
    const char *want[] = {"F< root",
                          "F< layers.0",
                          "F< layers.0.linear",
                          "F> layers.0.linear",
                          "F< layers.0.act",
                          "F> layers.0.act",
                          "F> layers.0",
                          "F< head",
                          "F> head",
                          "F> root",
                          "B< root",
                          "B< head",
                          "B> head",
                          "B< layers.0",
                          "B< layers.0.act",
                          "B> layers.0.act",
                          "B< layers.0.linear",
                          "B> layers.0.linear",
                          "B> layers.0",
                          "B> root"};
    assert_int_equal(hl.n, 20);
    for (int i = 0; i < 20; i++)
        assert_string_equal(hl.log[i], want[i]);
    /* a failing hook aborts the pass with its status */
    hl.n = 0;
    hl.fail_at = 3;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 2, 1, &hooks, &out, &odt),
                     PCS_ERR_CANCELLED);
    fix_free(&f);
}

static void test_bad_use_is_a_clear_error(void **state)
{
    (void)state;
    uint32_t h[1] = {4};
    pcs_mlp_config_t cfg = mkcfg(3, h, 1, 2, PCS_ACT_RELU, PCS_NORM_BATCHNORM, 1, 0);
    fix_t f;
    fix_init(&f, &cfg, 4);
    float x[12] = {0}, d[8] = {0};
    const float *out;
    pcs_dtype_t odt;
    /* backward without a training forward */
    assert_int_equal(pcs_mlp_backward(f.m, d, NULL), PCS_ERR_STATE);
    /* BatchNorm in training mode needs more than one row */
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 1, 1, NULL, &out, &odt),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "layers.0.norm"));
    /* ... but evaluates one row with running stats */
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 1, 0, NULL, &out, &odt), PCS_OK);
    /* too many rows */
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 5, 1, NULL, &out, &odt),
                     PCS_ERR_INVALID_ARG);
    /* an unbound parameter (unit not gathered) */
    assert_int_equal(pcs_mlp_bind_param(f.m, 4, PCS_DTYPE_FP32, NULL), PCS_OK);
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 2, 1, NULL, &out, &odt),
                     PCS_ERR_STATE);
    assert_non_null(strstr(pcs_last_error(), "head.weight"));
    /* bad bindings */
    assert_int_equal(pcs_mlp_bind_param(f.m, 99, PCS_DTYPE_FP32, x), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_mlp_bind_param(f.m, 0, PCS_DTYPE_INT64, x), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_mlp_bind_buffer(f.m, 2, PCS_DTYPE_FP32, x), PCS_ERR_INVALID_ARG);
    pcs_mlp_config_t bad = cfg;
    uint32_t zero[1] = {0};
    bad.hidden_dims = zero;
    pcs_mlp_t *m2;
    assert_int_equal(pcs_mlp_create(&bad, 4, &m2), PCS_ERR_INVALID_ARG);
    fix_free(&f);
}

static void test_batchnorm_eval_uses_running_stats(void **state)
{
    (void)state;
    pcs_mlp_config_t cfg =
        mkcfg(3, (const uint32_t[]){2}, 1, 1, PCS_ACT_RELU, PCS_NORM_BATCHNORM, 1, 0);
    fix_t f;
    fix_init(&f, &cfg, 8);
    float x[24];
    double xd[24];
    for (int i = 0; i < 24; i++)
        xd[i] = x[i] = (float)(3 * urand());
    const float *out;
    pcs_dtype_t odt;
    cache_t c = {0};
    for (int it = 0; it < 3; it++) {
        assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 8, 1, NULL, &out, &odt), PCS_OK);
        ref_forward(&f.ref, xd, 8, 1, &c);
        cache_free(&f.ref, &c);
    }
    assert_int_equal(*(int64_t *)f.bv[2], 3);
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, 8, 0, NULL, &out, &odt), PCS_OK);
    ref_forward(&f.ref, xd, 8, 0, &c);
    for (int i = 0; i < 8; i++)
        assert_close_d(out[i], c.out[i], 1e-4, 1e-5, "eval output", (size_t)i);
    /* eval does not move the running stats */
    assert_int_equal(*(int64_t *)f.bv[2], 3);
    cache_free(&f.ref, &c);
    fix_free(&f);
}

static void test_losses_match_closed_forms(void **state)
{
    (void)state;
    float out[6] = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f}, y[6] = {0, 0, 1, 1, 1, 0};
    float g[6];
    double l;
    assert_int_equal(pcs_loss_compute(PCS_LOSS_MSE, out, 2, 3, y, 0.5f, &l, g), PCS_OK);
    double want = 0;
    for (int i = 0; i < 6; i++)
        want += (out[i] - y[i]) * (out[i] - y[i]) / 6.0;
    assert_close_d(l, want, 1e-6, 0, "mse", 0);
    for (int i = 0; i < 6; i++)
        assert_close_d(g[i], 0.5 * 2 * (out[i] - y[i]) / 6.0, 1e-6, 1e-7, "mse grad", (size_t)i);
    int64_t lab[2] = {2, 0};
    assert_int_equal(pcs_loss_compute(PCS_LOSS_CROSS_ENTROPY, out, 2, 3, lab, 1.0f, &l, g), PCS_OK);
    want = 0;
    for (int r = 0; r < 2; r++) {
        double se = 0;
        for (int j = 0; j < 3; j++)
            se += exp(out[r * 3 + j]);
        want += (log(se) - out[r * 3 + lab[r]]) / 2;
        for (int j = 0; j < 3; j++)
            assert_close_d(g[r * 3 + j], (exp(out[r * 3 + j]) / se - (j == lab[r])) / 2, 1e-6, 1e-7,
                           "ce grad", (size_t)j);
    }
    assert_close_d(l, want, 1e-6, 0, "ce", 0);
    /* large logits stay finite (log-sum-exp shift) */
    float big[2] = {1000.0f, 0.0f};
    int64_t l0 = 0;
    assert_int_equal(pcs_loss_compute(PCS_LOSS_CROSS_ENTROPY, big, 1, 2, &l0, 1.0f, &l, g), PCS_OK);
    assert_true(isfinite(l) && l < 1e-6);
    lab[1] = 3;
    assert_int_equal(pcs_loss_compute(PCS_LOSS_CROSS_ENTROPY, out, 2, 3, lab, 1.0f, &l, g),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "row 1"));
}

/* Two pipeline stages (layers [0, 2) and [2, 4) of a 3-block bf16 model) run as separate model
 * instances compose to the full model bit for bit: stage B's output, every parameter gradient
 * and, through pcs_mlp_backward_input, the input gradient handed from B to A. */
static void test_pipeline_stages_compose_to_the_full_model(void **state)
{
    (void)state;
    uint32_t h[3] = {6, 6, 6};
    pcs_mlp_config_t cfg = mkcfg(6, h, 3, 3, PCS_ACT_GELU, PCS_NORM_LAYERNORM, 1, 1);
    const uint32_t R = 4;
    fix_t f;
    fix_init(&f, &cfg, R);
    pcs_mlp_t *sa, *sb;
    assert_int_equal(pcs_mlp_create(&cfg, R, &sa), PCS_OK);
    assert_int_equal(pcs_mlp_create(&cfg, R, &sb), PCS_OK);
    uint16_t *lp[16], *gf[16], *gs[16];
    for (uint32_t p = 0; p < f.np; p++) {
        uint64_t n = pcs_mlp_param(f.m, p)->numel;
        lp[p] = calloc(n, 2);
        gf[p] = calloc(n, 2);
        gs[p] = calloc(n, 2);
        pcs_from_f32(f.pv[p], n, PCS_DTYPE_BF16, lp[p]);
        assert_int_equal(pcs_mlp_bind_param(f.m, p, PCS_DTYPE_BF16, lp[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(f.m, p, PCS_DTYPE_BF16, gf[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_param(sa, p, PCS_DTYPE_BF16, lp[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(sa, p, PCS_DTYPE_BF16, gs[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_param(sb, p, PCS_DTYPE_BF16, lp[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(sb, p, PCS_DTYPE_BF16, gs[p]), PCS_OK);
    }
    assert_int_equal(pcs_mlp_set_cast(f.m, 0, PCS_DTYPE_BF16, PCS_DTYPE_NONE), PCS_OK);
    assert_int_equal(pcs_mlp_set_cast(sa, 0, PCS_DTYPE_BF16, PCS_DTYPE_NONE), PCS_OK);
    assert_int_equal(pcs_mlp_set_cast(sb, 0, PCS_DTYPE_BF16, PCS_DTYPE_NONE), PCS_OK);
    float x[24], d[12], gin_full[24], gin_a[24], mid[24], gmid[24], out_full[12];
    for (int i = 0; i < 24; i++)
        x[i] = (float)(2 * urand() - 1);
    for (int i = 0; i < 12; i++)
        d[i] = (float)(urand() - 0.5);
    const float *out;
    pcs_dtype_t odt, mdt;
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    memcpy(out_full, out, sizeof out_full);
    assert_int_equal(pcs_mlp_backward_input(f.m, d, NULL, gin_full), PCS_OK);
    /* stage A, ship its output, stage B */
    assert_int_equal(pcs_mlp_forward_range(sa, 0, 2, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &mdt),
                     PCS_OK);
    assert_int_equal(mdt, PCS_DTYPE_BF16);
    memcpy(mid, out, sizeof mid);
    assert_int_equal(pcs_mlp_forward_range(sb, 2, 4, mid, mdt, R, 1, NULL, &out, &odt), PCS_OK);
    assert_memory_equal(out, out_full, sizeof out_full);
    assert_int_equal(pcs_mlp_backward_input(sb, d, NULL, gmid), PCS_OK);
    assert_int_equal(pcs_mlp_backward_input(sa, gmid, NULL, gin_a), PCS_OK);
    assert_memory_equal(gin_a, gin_full, sizeof gin_full);
    for (uint32_t p = 0; p < f.np; p++)
        assert_memory_equal(gs[p], gf[p], pcs_mlp_param(f.m, p)->numel * 2);
    /* the input gradient is the real one: compare with the fp64 reference in fp32 */
    float gx[24];
    for (uint32_t p = 0; p < f.np; p++) {
        assert_int_equal(pcs_mlp_bind_param(f.m, p, PCS_DTYPE_FP32, f.pv[p]), PCS_OK);
        assert_int_equal(pcs_mlp_bind_grad(f.m, p, PCS_DTYPE_FP32, f.gv[p]), PCS_OK);
    }
    assert_int_equal(pcs_mlp_set_cast(f.m, 0, PCS_DTYPE_NONE, PCS_DTYPE_NONE), PCS_OK);
    assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt), PCS_OK);
    assert_int_equal(pcs_mlp_backward_input(f.m, d, NULL, gx), PCS_OK);
    double xd[24], dd[12];
    for (int i = 0; i < 24; i++)
        xd[i] = x[i];
    for (int i = 0; i < 12; i++)
        dd[i] = d[i];
    const double eps = 1e-6;
    for (int i = 0; i < 24; i += 5) {
        cache_t c1 = {0}, c2 = {0};
        xd[i] = x[i] + eps;
        ref_forward(&f.ref, xd, R, 1, &c1);
        xd[i] = x[i] - eps;
        ref_forward(&f.ref, xd, R, 1, &c2);
        xd[i] = x[i];
        double fd = 0;
        for (int k = 0; k < 12; k++)
            fd += (c1.out[k] - c2.out[k]) * dd[k] / (2 * eps);
        assert_close_d(gx[i], fd, 1e-3, 1e-5, "input grad", (size_t)i);
        cache_free(&f.ref, &c1);
        cache_free(&f.ref, &c2);
    }
    assert_int_equal(pcs_mlp_forward_range(sa, 2, 2, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &mdt),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_mlp_forward_range(sa, 0, 5, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &mdt),
                     PCS_ERR_INVALID_ARG);
    for (uint32_t p = 0; p < f.np; p++) {
        free(lp[p]);
        free(gf[p]);
        free(gs[p]);
    }
    pcs_mlp_destroy(sa);
    pcs_mlp_destroy(sb);
    fix_free(&f);
}

/* The zero-bubble split: backward_input_only then backward_weights writes the bits one
 * backward_input writes (every parameter gradient and the input gradient), for LayerNorm and
 * BatchNorm blocks, fp32 and bf16 parameters; the input-only pass writes no parameter gradient;
 * a forward or a second backward with weight gradients pending is refused. */
static void test_zero_bubble_split_backward_writes_the_same_bits(void **state)
{
    (void)state;
    uint32_t h[3] = {6, 6, 6};
    const pcs_norm_t norms[2] = {PCS_NORM_LAYERNORM, PCS_NORM_BATCHNORM};
    const pcs_dtype_t dts[2] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16};
    for (int ni = 0; ni < 2; ni++)
        for (int di = 0; di < 2; di++) {
            pcs_mlp_config_t cfg = mkcfg(6, h, 3, 3, PCS_ACT_GELU, norms[ni], 1, 1);
            const uint32_t R = 4;
            fix_t f;
            fix_init(&f, &cfg, R);
            pcs_mlp_t *s;
            assert_int_equal(pcs_mlp_create(&cfg, R, &s), PCS_OK);
            for (uint32_t i = 0; i < f.nb; i++) { /* the same running statistics */
                const pcs_named_tensor_t *t = pcs_mlp_buffer(f.m, i);
                assert_int_equal(pcs_mlp_bind_buffer(s, i, t->dtype, f.bv[i]), PCS_OK);
            }
            size_t esz = pcs_dtype_size(dts[di]);
            void *lp[16], *gf[16], *gs[16];
            for (uint32_t p = 0; p < f.np; p++) {
                uint64_t n = pcs_mlp_param(f.m, p)->numel;
                lp[p] = calloc(n, esz);
                gf[p] = calloc(n, esz);
                gs[p] = calloc(n, esz);
                pcs_from_f32(f.pv[p], n, dts[di], lp[p]);
                assert_int_equal(pcs_mlp_bind_param(f.m, p, dts[di], lp[p]), PCS_OK);
                assert_int_equal(pcs_mlp_bind_grad(f.m, p, dts[di], gf[p]), PCS_OK);
                assert_int_equal(pcs_mlp_bind_param(s, p, dts[di], lp[p]), PCS_OK);
                assert_int_equal(pcs_mlp_bind_grad(s, p, dts[di], gs[p]), PCS_OK);
            }
            if (dts[di] != PCS_DTYPE_FP32) {
                assert_int_equal(pcs_mlp_set_cast(f.m, 0, dts[di], PCS_DTYPE_NONE), PCS_OK);
                assert_int_equal(pcs_mlp_set_cast(s, 0, dts[di], PCS_DTYPE_NONE), PCS_OK);
            }
            float x[24], d[12], gin_full[24], gin_s[24];
            for (int i = 0; i < 24; i++)
                x[i] = (float)(2 * urand() - 1);
            for (int i = 0; i < 12; i++)
                d[i] = (float)(urand() - 0.5);
            const float *out;
            pcs_dtype_t odt;
            assert_int_equal(pcs_mlp_forward(f.m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt),
                             PCS_OK);
            assert_int_equal(pcs_mlp_backward_input(f.m, d, NULL, gin_full), PCS_OK);
            assert_int_equal(pcs_mlp_forward(s, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt),
                             PCS_OK);
            assert_int_equal(pcs_mlp_backward_input_only(s, d, gin_s), PCS_OK);
            assert_memory_equal(gin_s, gin_full, sizeof gin_full);
            for (uint32_t p = 0; p < f.np; p++) { /* nothing written yet */
                uint64_t n = pcs_mlp_param(f.m, p)->numel;
                for (uint64_t e = 0; e < n * esz; e++)
                    assert_int_equal(((uint8_t *)gs[p])[e], 0);
            }
            assert_int_equal(pcs_mlp_forward(s, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt),
                             PCS_ERR_STATE);
            assert_int_equal(pcs_mlp_backward_input_only(s, d, gin_s), PCS_ERR_STATE);
            assert_int_equal(pcs_mlp_backward_weights(s), PCS_OK);
            for (uint32_t p = 0; p < f.np; p++)
                if (memcmp(gs[p], gf[p], pcs_mlp_param(f.m, p)->numel * esz) != 0)
                    fail_msg("%s (%s, %s): the split backward's gradient differs",
                             pcs_mlp_param(f.m, p)->fqn, ni ? "batchnorm" : "layernorm",
                             pcs_dtype_name(dts[di]));
            assert_int_equal(pcs_mlp_backward_weights(s), PCS_ERR_STATE); /* once */
            for (uint32_t p = 0; p < f.np; p++) {
                free(lp[p]);
                free(gf[p]);
                free(gs[p]);
            }
            pcs_mlp_destroy(s);
            fix_free(&f);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fqn_scheme_matches_planner),
        cmocka_unit_test(test_init_linear_bounds_and_norm_constants),
        cmocka_unit_test(test_fp32_relu_plain_matches_fp64_reference),
        cmocka_unit_test(test_fp32_gelu_layernorm_residual_matches_fp64_reference),
        cmocka_unit_test(test_fp32_batchnorm_matches_fp64_reference_and_running_stats),
        cmocka_unit_test(test_fp32_no_bias_gelu_batchnorm_matches_fp64_reference),
        cmocka_unit_test(test_head_only_model_matches_fp64_reference),
        cmocka_unit_test(test_relu_backward_passes_gradient_through_nan),
        cmocka_unit_test(test_gradients_match_finite_differences),
        cmocka_unit_test(test_bf16_linear_output_is_fp32_sum_rounded_once),
        cmocka_unit_test(test_fp16_linear_rounds_once_and_overflows_to_inf),
        cmocka_unit_test(test_bf16_model_outputs_are_bf16_and_close_to_fp64),
        cmocka_unit_test(test_fp16_model_outputs_are_fp16_and_close_to_fp64),
        cmocka_unit_test(test_mixed_norm_keeps_input_dtype),
        cmocka_unit_test(test_hooks_fire_in_fsdp_order),
        cmocka_unit_test(test_bad_use_is_a_clear_error),
        cmocka_unit_test(test_batchnorm_eval_uses_running_stats),
        cmocka_unit_test(test_losses_match_closed_forms),
        cmocka_unit_test(test_pipeline_stages_compose_to_the_full_model),
        cmocka_unit_test(test_zero_bubble_split_backward_writes_the_same_bits),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
