/* The "cpu" nn implementation: host arrays, OpenBLAS sgemm and plain loops. This is the reference
 * twin of nn_cuda.cu and the numerics model/model.c always had, moved here unchanged (the same
 * rounding points and the same accumulation order: CPU results are bit-identical to before the
 * move). Every op completes before it returns; the stream is only an ordering token. See pcs/nn.h
 * for the contract of each op and model/model.c's header for the mixed-precision rules. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"
#include "nn_math.h"
#include "nn_vmath.h"
#include "pcs/log.h"
#include "pcs/mem.h"

/* A low-precision weight is converted to fp32 (and an fp32 dW of one is rounded) a block of at
 * most this many elements at a time, so the scratch does not grow with the model: the blocks
 * split dimensions the GEMM does not reduce over, so every element's sum is the same. */
enum { WBLOCK = 1 << 18 };

typedef struct {
    float *gw32; /* fp32 dW / db before rounding and storing (a block of dW) */
    size_t gw32_cap;
    float *wblk; /* a block of a low-precision weight as fp32 */
    size_t wblk_cap;
    float *vec; /* bias / norm parameters as fp32 */
    size_t vec_cap;
} cpu_nn_t;

static pcs_status_t ensure(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return PCS_OK;
    float *q = realloc(*p, n * sizeof(float));
    if (!q)
        return pcs_set_error(PCS_ERR_NOMEM, "nn cpu: out of memory (%zu floats)", n);
    *p = q;
    *cap = n;
    return PCS_OK;
}

static cpu_nn_t *impl(pcs_nn_t *nn)
{
    return nn->impl;
}

/* Write a gradient: round to the parameter's compute dtype (autograd's dtype), store as the
 * gradient's dtype; or, accumulating, add it to the held values (pcs_nn_grad_acc) a block at a
 * time. g32 is scratch and is modified. */
static void store_grad(const pcs_nn_grad_t *g, float *g32, size_t n)
{
    if (g->accumulate) {
        enum { B = 1024 };
        float held[B];
        size_t es = pcs_dtype_size(g->dtype);
        for (size_t o = 0; o < n; o += B) {
            size_t m = n - o < B ? n - o : B;
            char *d = (char *)g->data + o * es;
            pcs_nn_host_to_f32(d, g->dtype, m, held);
            for (size_t i = 0; i < m; i++)
                held[i] = pcs_nn_grad_acc(held[i], g32[o + i], (int)g->param_dtype);
            pcs_nn_host_from_f32(held, m, g->dtype, d);
        }
        return;
    }
    if (g->dtype != g->param_dtype)
        pcs_nn_host_round(g32, n, g->param_dtype);
    pcs_nn_host_from_f32(g32, n, g->dtype, g->data);
}

// ---- context ----

static void cpu_destroy(pcs_nn_t *nn)
{
    if (!nn)
        return;
    cpu_nn_t *c = nn->impl;
    if (c) {
        free(c->gw32);
        free(c->wblk);
        free(c->vec);
        free(c);
    }
    free(nn);
}

static pcs_status_t cpu_create(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out)
{
    if (!be || !out || strcmp(be->name, "cpu") != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn cpu create: needs the cpu backend (got %s)",
                             be ? be->name : "NULL");
    pcs_nn_t *nn = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *nn, (void **)&nn));
    pcs_status_t rc = pcs_calloc(1, sizeof(cpu_nn_t), &nn->impl);
    if (rc != PCS_OK) {
        free(nn);
        return rc;
    }
    nn->ops = pcs_nn_cpu_ops();
    nn->be = be;
    nn->stream = s;
    *out = nn;
    return PCS_OK;
}

// ---- element-wise ----

static pcs_status_t cpu_copy_round(pcs_nn_t *nn, float *dst, const float *src, size_t n,
                                   pcs_dtype_t dt)
{
    if (n == 0)
        return PCS_OK;
    if (dst != src)
        memcpy(dst, src, n * sizeof(float));
    pcs_nn_host_round(dst, n, dt);
    return PCS_OK;
}

static pcs_status_t cpu_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                            pcs_dtype_t dt)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
    pcs_nn_host_round(y, n, dt);
    return PCS_OK;
}

/* GELU (erf form) and its derivative: nn_math.h's expressions, with the branch-free erf and exp
 * of nn_vmath.h so that the loops vectorize (one clone per ISA level, the same bits in each). */
/* no-trapping-math lets GCC if-convert the selects (FP exceptions are never inspected; values
 * are unchanged: test_nn_vmath checks the loops bit for bit against the plain scalar functions). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define VEC_CLONES                                                                                 \
    __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math"),      \
                   target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VEC_CLONES
#endif

VEC_CLONES static void gelu_fwd_loop(float *Y, const float *X, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = X[i];
        Y[i] = 0.5f * x * (1.0f + pcs_vm_erf(x * (float)PCS_NN_SQRT1_2));
    }
}

VEC_CLONES static void gelu_bwd_loop(float *dX, const float *X, const float *dY, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = X[i];
        float cdf = 0.5f * (1.0f + pcs_vm_erf(x * (float)PCS_NN_SQRT1_2));
        float pdf = (float)PCS_NN_INV_SQRT_2PI * pcs_vm_exp(-0.5f * x * x);
        dX[i] = dY[i] * (cdf + x * pdf);
    }
}

VEC_CLONES static void erf_loop(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = pcs_vm_erf(src[i]);
}

VEC_CLONES static void exp_loop(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = pcs_vm_exp(src[i]);
}

void pcs_nn_host_erf(const float *src, size_t n, float *dst)
{
    erf_loop(dst, src, n);
}

void pcs_nn_host_exp(const float *src, size_t n, float *dst)
{
    exp_loop(dst, src, n);
}

static pcs_status_t cpu_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *Y, const float *X, size_t n,
                                pcs_dtype_t dt)
{
    if (act == PCS_NN_RELU) {
        for (size_t i = 0; i < n; i++)
            Y[i] = pcs_nn_relu_fwd(X[i]);
    } else {
        gelu_fwd_loop(Y, X, n);
        pcs_nn_host_round(Y, n, dt);
    }
    return PCS_OK;
}

static pcs_status_t cpu_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dX, const float *X,
                                const float *Y, const float *dY, size_t n)
{
    if (act == PCS_NN_RELU) {
        for (size_t i = 0; i < n; i++)
            dX[i] = pcs_nn_relu_bwd(Y[i], dY[i]);
    } else {
        gelu_bwd_loop(dX, X, dY, n);
    }
    return PCS_OK;
}

// ---- Linear ----

static pcs_status_t cpu_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *X, float *Y)
{
    cpu_nn_t *c = impl(nn);
    uint32_t K = l->in_dim, N = l->out_dim;
    int R = (int)l->rows;
    if (l->dtype == PCS_DTYPE_FP32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, (int)N, (int)K, 1.0f, X, (int)K,
                    l->weight, (int)K, 0.0f, Y, (int)N);
    } else if (l->saved) {
        /* the whole weight as fp32 where a backward without a binding will read it */
        pcs_nn_host_to_f32(l->weight, l->dtype, (size_t)N * K, l->saved);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, (int)N, (int)K, 1.0f, X, (int)K,
                    l->saved, (int)K, 0.0f, Y, (int)N);
    } else {
        /* blocks of output features: rows n0.. of W give columns n0.. of Y */
        size_t es = pcs_dtype_size(l->dtype), nb = WBLOCK / K ? WBLOCK / K : 1;
        nb = nb < N ? nb : N;
        PCS_CHECK(ensure(&c->wblk, &c->wblk_cap, nb * K));
        for (size_t n0 = 0; n0 < N; n0 += nb) {
            size_t m = N - n0 < nb ? N - n0 : nb;
            pcs_nn_host_to_f32((const char *)l->weight + n0 * K * es, l->dtype, m * K, c->wblk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, (int)m, (int)K, 1.0f, X,
                        (int)K, c->wblk, (int)K, 0.0f, Y + n0, (int)N);
        }
    }
    const float *B = l->bias;
    if (B && l->dtype != PCS_DTYPE_FP32) {
        PCS_CHECK(ensure(&c->vec, &c->vec_cap, N));
        pcs_nn_host_to_f32(l->bias, l->dtype, N, c->vec);
        B = c->vec;
    }
    if (B) {
        for (int r = 0; r < R; r++) {
            float *y = Y + (size_t)r * N;
            for (uint32_t j = 0; j < N; j++)
                y[j] = pcs_nn_bias_add(y[j], B[j]);
        }
    }
    pcs_nn_host_round(Y, (size_t)R * N, l->dtype);
    return PCS_OK;
}

static pcs_status_t cpu_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dY,
                                          const float *X, const pcs_nn_grad_t *dw,
                                          const pcs_nn_grad_t *db)
{
    cpu_nn_t *c = impl(nn);
    uint32_t K = l->in_dim, N = l->out_dim;
    int R = (int)l->rows;
    if (pcs_nn_wants(dw) && dw->dtype == PCS_DTYPE_FP32 && dw->param_dtype == PCS_DTYPE_FP32 &&
        !dw->accumulate) {
        /* fp32 gradient of an fp32 weight: no rounding, so the GEMM writes it in place.
         * Accumulating goes through the blocks below, not beta = 1: OpenBLAS adds a GEMM's
         * K-blocks (K = rows here) into C one by one, so beta = 1 would give (C + p1) + p2
         * where autograd's .grad += g gives C + (p1 + p2) once rows exceed its block. */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, R, 1.0f, dY, (int)N, X,
                    (int)K, 0.0f, dw->data, (int)K);
    } else if (pcs_nn_wants(dw)) {
        /* blocks of rows of dW (output features): dW[n0..] = dY[:, n0..]^T X */
        size_t es = pcs_dtype_size(dw->dtype), nb = WBLOCK / K ? WBLOCK / K : 1;
        nb = nb < N ? nb : N;
        PCS_CHECK(ensure(&c->gw32, &c->gw32_cap, nb * K));
        for (size_t n0 = 0; n0 < N; n0 += nb) {
            size_t m = N - n0 < nb ? N - n0 : nb;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)K, R, 1.0f, dY + n0,
                        (int)N, X, (int)K, 0.0f, c->gw32, (int)K);
            pcs_nn_grad_t part = *dw;
            part.data = (char *)dw->data + n0 * K * es;
            store_grad(&part, c->gw32, m * K);
        }
    }
    if (pcs_nn_wants(db)) {
        PCS_CHECK(ensure(&c->gw32, &c->gw32_cap, N));
        for (uint32_t j = 0; j < N; j++)
            c->gw32[j] = pcs_nn_col_sum(dY + j, N, (uint32_t)R);
        store_grad(db, c->gw32, N);
    }
    return PCS_OK;
}

static pcs_status_t cpu_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dY,
                                         float *dX)
{
    cpu_nn_t *c = impl(nn);
    uint32_t K = l->in_dim, N = l->out_dim;
    int R = (int)l->rows;
    /* the weight values the forward used: the fp32 binding, the low-precision binding converted
     * again (the same values: parameters do not change between forward and backward), or, with no
     * binding, forward's converted copy */
    const float *W = l->dtype == PCS_DTYPE_FP32 ? l->weight : l->saved;
    if (l->dtype != PCS_DTYPE_FP32 && l->weight) {
        /* blocks of input features: columns k0.. of W give columns k0.. of dX, each element's
         * sum over the N output features unchanged */
        size_t es = pcs_dtype_size(l->dtype), kb = WBLOCK / N > 16 ? WBLOCK / N : 16;
        kb = kb < K ? kb : K; /* at least 16 columns: a huge N still converts whole runs */
        PCS_CHECK(ensure(&c->wblk, &c->wblk_cap, kb * N));
        for (size_t k0 = 0; k0 < K; k0 += kb) {
            size_t kk = K - k0 < kb ? K - k0 : kb;
            for (size_t n = 0; n < N; n++)
                pcs_nn_host_to_f32((const char *)l->weight + (n * K + k0) * es, l->dtype, kk,
                                   c->wblk + n * kk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, (int)kk, (int)N, 1.0f, dY,
                        (int)N, c->wblk, (int)kk, 0.0f, dX + k0, (int)K);
        }
        return PCS_OK;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, (int)K, (int)N, 1.0f, dY, (int)N, W,
                (int)K, 0.0f, dX, (int)K);
    return PCS_OK;
}

// ---- LayerNorm / BatchNorm1d ----

/* One LayerNorm row: statistics in fp32 in nn_math.h's lane order (the GPU's bits), then the
 * affine output, unrounded. The lane loops vectorize (the same bits in every clone); size_t
 * indices and a block pointer keep GCC from treating a lane's load as a gather. */
VEC_CLONES static void ln_row_fwd(const float *x, size_t D, const float *w, const float *b,
                                  float *y, float *save)
{
    enum { L = PCS_NN_LANES };
    size_t full = D - D % L, tail = D % L;
    float a[L] = {0}, q[L] = {0};
    for (size_t j = 0; j < full; j += L) {
        const float *xb = x + j;
        for (size_t l = 0; l < L; l++)
            a[l] += xb[l];
    }
    for (size_t l = 0; l < tail; l++)
        a[l] += x[full + l];
    float mean = pcs_nn_ln_mean(pcs_nn_lane_tree(a), (uint32_t)D);
    for (size_t j = 0; j < full; j += L) {
        const float *xb = x + j;
        for (size_t l = 0; l < L; l++)
            q[l] += pcs_nn_ln_sq(xb[l], mean);
    }
    for (size_t l = 0; l < tail; l++)
        q[l] += pcs_nn_ln_sq(x[full + l], mean);
    float rstd = pcs_nn_ln_rstd(pcs_nn_lane_tree(q), (uint32_t)D);
    save[0] = mean;
    save[1] = rstd;
    for (size_t j = 0; j < D; j++)
        y[j] = pcs_nn_norm_out(x[j], mean, rstd, w[j], b[j]);
}

/* One LayerNorm element of backward's first pass: its dw/db terms (rows in order, per column) and
 * its lane's two row sums. */
#define LN_BWD_ELEM(k, l)                                                                          \
    do {                                                                                           \
        float xh_ = pcs_nn_xhat(x[k], mean, rstd);                                                 \
        pcs_nn_ln_bwd_acc(dy[k], w[k], xh_, &c1[l], &c2[l]);                                       \
        pcs_nn_norm_param_acc(dy[k], xh_, &dw[k], &db[k]);                                         \
    } while (0)

/* One LayerNorm row backward: dw/db terms, the two row sums in the lane order, then dx when
 * wanted. */
VEC_CLONES static void ln_row_bwd(const float *x, const float *dy, const float *w, float mean,
                                  float rstd, size_t D, float *dw, float *db, float *dx)
{
    enum { L = PCS_NN_LANES };
    size_t full = D - D % L, tail = D % L;
    float c1[L] = {0}, c2[L] = {0};
    for (size_t j = 0; j < full; j += L)
        for (size_t l = 0; l < L; l++)
            LN_BWD_ELEM(j + l, l);
    for (size_t l = 0; l < tail; l++)
        LN_BWD_ELEM(full + l, l);
    if (!dx)
        return;
    float m1 = pcs_nn_ln_mean(pcs_nn_lane_tree(c1), (uint32_t)D);
    float m2 = pcs_nn_ln_mean(pcs_nn_lane_tree(c2), (uint32_t)D);
    for (size_t j = 0; j < D; j++)
        dx[j] = pcs_nn_ln_dx(dy[j], w[j], pcs_nn_xhat(x[j], mean, rstd), rstd, m1, m2);
}

static pcs_status_t cpu_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *X, float *Y)
{
    cpu_nn_t *c = impl(nn);
    uint32_t D = p->dim, R = p->rows;
    PCS_CHECK(ensure(&c->vec, &c->vec_cap, 2 * (size_t)D));
    float *wb = c->vec;
    pcs_nn_host_to_f32(p->weight, p->weight_dtype, D, wb);
    pcs_nn_host_to_f32(p->bias, p->bias_dtype, D, wb + D);
    if (p->kind == PCS_NN_LAYERNORM) {
        for (uint32_t r = 0; r < R; r++)
            ln_row_fwd(X + (size_t)r * D, D, wb, wb + D, Y + (size_t)r * D, p->save + 2 * r);
    } else {
        float *mean = p->save, *invstd = p->save + D, *run = p->save + 2 * D;
        pcs_nn_host_to_f32(p->running_mean, p->mean_dtype, D, run);
        pcs_nn_host_to_f32(p->running_var, p->var_dtype, D, run + D);
        if (p->training) {
            for (uint32_t j = 0; j < D; j++)
                pcs_nn_bn_train_col(X + j, D, R, &mean[j], &invstd[j], &run[j], &run[D + j]);
            pcs_nn_host_from_f32(run, D, p->mean_dtype, p->running_mean);
            pcs_nn_host_from_f32(run + D, D, p->var_dtype, p->running_var);
            if (p->num_batches_tracked)
                (*p->num_batches_tracked)++;
        } else {
            for (uint32_t j = 0; j < D; j++) {
                mean[j] = run[j];
                invstd[j] = pcs_nn_bn_eval_invstd(run[D + j]);
            }
        }
        for (uint32_t r = 0; r < R; r++) {
            const float *x = X + (size_t)r * D;
            float *y = Y + (size_t)r * D;
            for (uint32_t j = 0; j < D; j++)
                y[j] = pcs_nn_norm_out(x[j], mean[j], invstd[j], wb[j], wb[D + j]);
        }
    }
    pcs_nn_host_round(Y, (size_t)R * D, p->dtype);
    return PCS_OK;
}

static pcs_status_t cpu_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *X,
                                 const float *dY, float *dX, const pcs_nn_grad_t *dwg,
                                 const pcs_nn_grad_t *dbg)
{
    cpu_nn_t *c = impl(nn);
    uint32_t D = p->dim, R = p->rows;
    PCS_CHECK(ensure(&c->vec, &c->vec_cap, 4 * (size_t)D));
    float *w = c->vec, *dw = c->vec + D, *db = c->vec + 2 * D;
    pcs_nn_host_to_f32(p->weight, p->weight_dtype, D, w);
    memset(dw, 0, 2 * (size_t)D * sizeof(float));
    if (p->kind == PCS_NN_LAYERNORM) {
        const float *save = p->save;
        for (uint32_t r = 0; r < R; r++)
            ln_row_bwd(X + (size_t)r * D, dY + (size_t)r * D, w, save[2 * r], save[2 * r + 1], D,
                       dw, db, dX ? dX + (size_t)r * D : NULL);
    } else {
        const float *mean = p->save, *invstd = p->save + D;
        for (uint32_t j = 0; j < D; j++)
            pcs_nn_bn_bwd_col(X + j, dY + j, dX ? dX + j : NULL, D, R, mean[j], invstd[j], w[j],
                              &dw[j], &db[j]);
    }
    if (pcs_nn_wants(dwg))
        store_grad(dwg, dw, D);
    if (pcs_nn_wants(dbg))
        store_grad(dbg, db, D);
    return PCS_OK;
}

static const pcs_nn_ops_t k_cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .copy_round = cpu_copy_round,
    .add = cpu_add,
    .act_fwd = cpu_act_fwd,
    .act_bwd = cpu_act_bwd,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd_params = cpu_linear_bwd_params,
    .linear_bwd_input = cpu_linear_bwd_input,
    .norm_fwd = cpu_norm_fwd,
    .norm_bwd = cpu_norm_bwd,
};

const pcs_nn_ops_t *pcs_nn_cpu_ops(void)
{
    return &k_cpu_ops;
}
