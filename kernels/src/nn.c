/* The nn registry (pcs_nn_get / pcs_nn_create), the front door of the ops (every pcs_nn_*()
 * validates its arguments here, once for every implementation, then calls the implementation's
 * unchecked op), and the host conversion helpers of the CPU twin (also what model/model.c's
 * pcs_round_to and friends are). The numerics themselves live in nn_cpu.c and nn_cuda.cu. */
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"
#include "nn_internal.h"
#include "pcs/half.h"
#include "pcs/log.h"

// ---- registry ----

pcs_status_t pcs_nn_get(const char *name, const pcs_nn_ops_t **out)
{
    if (!name || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_nn_get: NULL %s", name ? "out" : "name");
    *out = NULL;
    if (strcmp(name, "cpu") == 0) {
        *out = pcs_nn_cpu_ops();
        return PCS_OK;
    }
    if (strcmp(name, "cuda") == 0 && pcs_devsim_enabled()) {
        *out = pcs_nn_devsim_ops(); /* the CPU twin behind poisoned device pointers */
        return PCS_OK;
    }
    if (strcmp(name, "cuda") == 0)
        return pcs_nn_cuda_get(out);
    return pcs_set_error(PCS_ERR_NOT_FOUND, "nn implementation '%s' unknown (cpu, cuda)", name);
}

pcs_status_t pcs_nn_create(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out)
{
    if (!out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_nn_create: NULL out");
    *out = NULL;
    if (!be)
        PCS_CHECK(pcs_backend_get("cpu", &be));
    const pcs_nn_ops_t *ops;
    if (pcs_backend_is_simulated(be))
        return pcs_nn_devsim_ops()->create(be, s, out);
    PCS_CHECK(pcs_nn_get(be->name, &ops));
    return ops->create(be, s, out);
}

pcs_status_t pcs_nn_create_with(const pcs_nn_ops_t *ops, const pcs_backend_ops_t *be,
                                pcs_stream_t s, pcs_nn_t **out)
{
    if (!ops || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_nn_create_with: NULL %s",
                             ops ? "out" : "ops");
    *out = NULL;
    return ops->create(be, s, out);
}

void pcs_nn_destroy(pcs_nn_t *nn)
{
    if (nn)
        nn->ops->destroy(nn);
}

const pcs_nn_ops_t *pcs_nn_ops(const pcs_nn_t *nn)
{
    return nn ? nn->ops : NULL;
}

const char *pcs_nn_ops_name(const pcs_nn_ops_t *ops)
{
    return ops ? ops->name : NULL;
}

const pcs_backend_ops_t *pcs_nn_backend(const pcs_nn_t *nn)
{
    return nn ? nn->be : NULL;
}

pcs_stream_t pcs_nn_stream(const pcs_nn_t *nn)
{
    return nn ? nn->stream : NULL;
}

size_t pcs_nn_linear_saved_bytes(uint32_t in_dim, uint32_t out_dim)
{
    uint64_t b = (uint64_t)in_dim * out_dim * sizeof(float);
    return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

// ---- argument checks ----

static int is_compute(pcs_dtype_t t)
{
    return t == PCS_DTYPE_FP32 || t == PCS_DTYPE_BF16 || t == PCS_DTYPE_FP16;
}

static pcs_status_t check_ctx(const char *op, const pcs_nn_t *nn)
{
    if (!nn)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL context", op);
    return PCS_OK;
}

/* Up to four arrays of n elements, each non-NULL when n > 0 (repeat one for an unused slot);
 * `dt` must be FP32/BF16/FP16. */
static pcs_status_t check_ew(const char *op, const pcs_nn_t *nn, const void *a, const void *b,
                             const void *c, const void *d, size_t n, pcs_dtype_t dt)
{
    PCS_CHECK(check_ctx(op, nn));
    if (!is_compute(dt))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: dtype %s is not fp32/bf16/fp16", op,
                             pcs_dtype_name(dt));
    if (n && (!a || !b || !c || !d))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL array with %zu elements", op, n);
    return PCS_OK;
}

/* What an op reads of a Linear's weight: forward reads `weight` (and fills `saved`, when given,
 * for low precision), input-backward reads `weight` or, without one, `saved`, parameter-backward
 * neither. */
typedef enum { READ_FWD, READ_BWD_INPUT, READ_BWD_PARAMS } read_t;

/* A Linear: dims in [1, 2^31), compute dtype, the weight / saved buffer the op reads. */
static pcs_status_t check_linear(const char *op, const pcs_nn_t *nn, const pcs_nn_linear_t *l,
                                 read_t reads)
{
    PCS_CHECK(check_ctx(op, nn));
    if (!l)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL linear", op);
    if (l->rows == 0 || l->in_dim == 0 || l->out_dim == 0 || l->rows > INT32_MAX ||
        l->in_dim > INT32_MAX || l->out_dim > INT32_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn %s: bad dims rows %u in %u out %u (each in [1, 2^31))", op,
                             l->rows, l->in_dim, l->out_dim);
    if (!is_compute(l->dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: dtype %s is not fp32/bf16/fp16", op,
                             pcs_dtype_name(l->dtype));
    int low = l->dtype != PCS_DTYPE_FP32;
    if (reads == READ_BWD_PARAMS)
        return PCS_OK;
    if (!l->weight && (reads == READ_FWD || !low))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL weight", op);
    if (low && reads == READ_BWD_INPUT && !l->weight && !l->saved)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn %s: a %s weight needs the weight or forward's `saved` copy", op,
                             pcs_dtype_name(l->dtype));
    return PCS_OK;
}

/* A norm: kind, dims, dtypes, weight/bias/save present; forward of a BatchNorm: running stats
 * present and training with more than one row (backward reads neither). */
static pcs_status_t check_norm(const char *op, const pcs_nn_t *nn, const pcs_nn_norm_t *p,
                               int forward)
{
    PCS_CHECK(check_ctx(op, nn));
    if (!p)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL norm", op);
    if (p->kind != PCS_NN_LAYERNORM && p->kind != PCS_NN_BATCHNORM)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: unknown norm kind %d", op, (int)p->kind);
    if (p->rows == 0 || p->dim == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: bad dims rows %u dim %u", op, p->rows,
                             p->dim);
    if (!is_compute(p->dtype) || !is_compute(p->weight_dtype) || !is_compute(p->bias_dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn %s: dtypes input %s weight %s bias %s (each fp32/bf16/fp16)", op,
                             pcs_dtype_name(p->dtype), pcs_dtype_name(p->weight_dtype),
                             pcs_dtype_name(p->bias_dtype));
    if (!p->weight || (forward && !p->bias) || !p->save)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL %s", op,
                             !p->weight ? "weight"
                             : !p->save ? "save"
                                        : "bias");
    if (forward && p->kind == PCS_NN_BATCHNORM) {
        if (!p->running_mean || !p->running_var)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: BatchNorm without running stats", op);
        if (!is_compute(p->mean_dtype) || !is_compute(p->var_dtype))
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "nn %s: running stats dtypes %s/%s (each fp32/bf16/fp16)", op,
                                 pcs_dtype_name(p->mean_dtype), pcs_dtype_name(p->var_dtype));
        if (p->training && p->rows < 2)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "nn %s: expected more than 1 value per channel when training "
                                 "(batch of %u rows)",
                                 op, p->rows);
    }
    return PCS_OK;
}

/* A gradient destination (NULL or NULL data = skipped): dtype FP32/BF16/FP16/FP64 (accumulating:
 * not FP64), param dtype a compute dtype. */
static pcs_status_t check_grad(const char *op, const char *what, const pcs_nn_grad_t *g)
{
    if (!pcs_nn_wants(g))
        return PCS_OK;
    if ((!is_compute(g->dtype) && g->dtype != PCS_DTYPE_FP64) || !is_compute(g->param_dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: %s gradient dtype %s of a %s parameter",
                             op, what, pcs_dtype_name(g->dtype), pcs_dtype_name(g->param_dtype));
    if (g->accumulate && !is_compute(g->dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn %s: %s gradient: accumulating into %s (fp32, bf16 or fp16 only)",
                             op, what, pcs_dtype_name(g->dtype));
    return PCS_OK;
}

static pcs_status_t check_act(const char *op, pcs_nn_act_t act)
{
    if (act != PCS_NN_RELU && act != PCS_NN_GELU)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: unknown activation %d", op, (int)act);
    return PCS_OK;
}

// ---- the front door ----

pcs_status_t pcs_nn_copy_round(pcs_nn_t *nn, float *dst, const float *src, size_t n, pcs_dtype_t dt)
{
    PCS_CHECK(check_ew("copy_round", nn, dst, src, src, src, n, dt));
    return nn->ops->copy_round(nn, dst, src, n, dt);
}

pcs_status_t pcs_nn_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                        pcs_dtype_t dt)
{
    PCS_CHECK(check_ew("add", nn, y, a, b, b, n, dt));
    return nn->ops->add(nn, y, a, b, n, dt);
}

pcs_status_t pcs_nn_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                            pcs_dtype_t dt)
{
    PCS_CHECK(check_ew("act_fwd", nn, y, x, x, x, n, dt));
    PCS_CHECK(check_act("act_fwd", act));
    return nn->ops->act_fwd(nn, act, y, x, n, dt);
}

pcs_status_t pcs_nn_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x,
                            const float *y, const float *dy, size_t n)
{
    PCS_CHECK(check_ew("act_bwd", nn, dx, x, y, dy, n, PCS_DTYPE_FP32));
    PCS_CHECK(check_act("act_bwd", act));
    return nn->ops->act_bwd(nn, act, dx, x, y, dy, n);
}

pcs_status_t pcs_nn_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y)
{
    PCS_CHECK(check_linear("linear_fwd", nn, l, READ_FWD));
    if (!x || !y)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn linear_fwd: NULL x or y");
    return nn->ops->linear_fwd(nn, l, x, y);
}

pcs_status_t pcs_nn_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                      const float *x, const pcs_nn_grad_t *dw,
                                      const pcs_nn_grad_t *db)
{
    PCS_CHECK(check_linear("linear_bwd_params", nn, l, READ_BWD_PARAMS));
    PCS_CHECK(check_grad("linear_bwd_params", "weight", dw));
    PCS_CHECK(check_grad("linear_bwd_params", "bias", db));
    if (!dy || (pcs_nn_wants(dw) && !x))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn linear_bwd_params: NULL dy or x");
    return nn->ops->linear_bwd_params(nn, l, dy, x, dw, db);
}

pcs_status_t pcs_nn_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                     float *dx)
{
    PCS_CHECK(check_linear("linear_bwd_input", nn, l, READ_BWD_INPUT));
    if (!dy || !dx)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn linear_bwd_input: NULL dy or dx");
    return nn->ops->linear_bwd_input(nn, l, dy, dx);
}

pcs_status_t pcs_nn_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y)
{
    PCS_CHECK(check_norm("norm_fwd", nn, p, 1));
    if (!x || !y)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn norm_fwd: NULL x or y");
    return nn->ops->norm_fwd(nn, p, x, y);
}

pcs_status_t pcs_nn_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, const float *dy,
                             float *dx, const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db)
{
    PCS_CHECK(check_norm("norm_bwd", nn, p, 0));
    PCS_CHECK(check_grad("norm_bwd", "weight", dw));
    PCS_CHECK(check_grad("norm_bwd", "bias", db));
    if (!x || !dy)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn norm_bwd: NULL x or dy");
    return nn->ops->norm_bwd(nn, p, x, dy, dx, dw, db);
}

// ---- host conversions ----

/* The kernels' CPU cast (AVX2/F16C when present, proven bit-identical to pcs/half.h by the
 * exhaustive test); the scalar loops are the fallback for pairs it does not take. */
static void cast_scalar(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st, size_t n)
{
    if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_bf16(s[i]);
    } else if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_FP16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_fp16(s[i]);
    } else if (st == PCS_DTYPE_BF16 && dt == PCS_DTYPE_FP32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_bf16_to_f32(s[i]);
    } else if (st == PCS_DTYPE_FP16 && dt == PCS_DTYPE_FP32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_fp16_to_f32(s[i]);
    } else if (st == PCS_DTYPE_FP64 && dt == PCS_DTYPE_FP32) {
        const double *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)s[i];
    } else if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_FP64) {
        const float *s = src;
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    }
}

static void cast_fast(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st, size_t n)
{
    if (pcs_cpu_cast_array(dst, dt, src, st, n) != PCS_OK)
        cast_scalar(dst, dt, src, st, n);
}

/* fp32 -> bf16 -> fp32 in place in one pass, the bits of the two casts (pcs_f32_to_bf16:
 * nearest even, NaN to the canonical quiet NaN with its sign): the rounding step of every bf16 op
 * of the model, which the two casts through a buffer made a sizeable share of a bf16 step.
 * Proven on all 2^32 inputs by test_kernels_cast_exhaustive. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"),
               target_clones("avx512f", "avx2", "default")))
#endif
static void round_bf16(float *restrict v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, v + i, sizeof x);
        uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
        uint32_t q = (x & 0x80000000u) | 0x7fc00000u;
        x = (x & 0x7fffffffu) > 0x7f800000u ? q : r;
        memcpy(v + i, &x, sizeof x);
    }
}

void pcs_nn_host_round(float *v, size_t n, pcs_dtype_t dtype)
{
    if (dtype == PCS_DTYPE_BF16) {
        round_bf16(v, n);
        return;
    }
    if (dtype != PCS_DTYPE_FP16)
        return;
    uint16_t tmp[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        cast_fast(tmp, dtype, v + i, PCS_DTYPE_FP32, k);
        cast_fast(v + i, PCS_DTYPE_FP32, tmp, dtype, k);
    }
}

void pcs_nn_host_to_f32(const void *src, pcs_dtype_t src_dtype, size_t n, float *dst)
{
    if (src_dtype == PCS_DTYPE_FP32)
        memcpy(dst, src, n * sizeof(float));
    else
        cast_fast(dst, PCS_DTYPE_FP32, src, src_dtype, n);
}

void pcs_nn_host_from_f32(const float *src, size_t n, pcs_dtype_t dst_dtype, void *dst)
{
    if (dst_dtype == PCS_DTYPE_FP32)
        memmove(dst, src, n * sizeof(float));
    else
        cast_fast(dst, dst_dtype, src, PCS_DTYPE_FP32, n);
}
