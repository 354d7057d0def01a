/* The nn registry (pcs_nn_get / pcs_nn_create), the argument checks both implementations share,
 * and the host conversion helpers of the CPU twin (also what model/model.c's pcs_round_to and
 * friends are). The numerics themselves live in nn_cpu.c and nn_cuda.cu. */
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

void pcs_nn_destroy(pcs_nn_t *nn)
{
    if (nn)
        nn->ops->destroy(nn);
}

const pcs_nn_ops_t *pcs_nn_ops(const pcs_nn_t *nn)
{
    return nn ? nn->ops : NULL;
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

pcs_status_t pcs_nn_check_ctx(const char *op, const pcs_nn_t *nn)
{
    if (!nn)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL context", op);
    return PCS_OK;
}

pcs_status_t pcs_nn_check_ew(const char *op, const pcs_nn_t *nn, const void *a, const void *b,
                             const void *c, const void *d, size_t n, pcs_dtype_t dt)
{
    PCS_CHECK(pcs_nn_check_ctx(op, nn));
    if (!is_compute(dt))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: dtype %s is not fp32/bf16/fp16", op,
                             pcs_dtype_name(dt));
    if (n && (!a || !b || !c || !d))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL array with %zu elements", op, n);
    return PCS_OK;
}

pcs_status_t pcs_nn_check_linear(const char *op, const pcs_nn_t *nn, const pcs_nn_linear_t *l,
                                 pcs_nn_read_t reads)
{
    PCS_CHECK(pcs_nn_check_ctx(op, nn));
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
    if (reads == PCS_NN_READ_BWD_PARAMS)
        return PCS_OK;
    if (!l->weight && (reads == PCS_NN_READ_FWD || !low))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: NULL weight", op);
    if (low && !l->saved)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn %s: a %s weight needs a `saved` buffer for backward", op,
                             pcs_dtype_name(l->dtype));
    return PCS_OK;
}

pcs_status_t pcs_nn_check_norm(const char *op, const pcs_nn_t *nn, const pcs_nn_norm_t *p,
                               int forward)
{
    PCS_CHECK(pcs_nn_check_ctx(op, nn));
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

pcs_status_t pcs_nn_check_grad(const char *op, const char *what, const pcs_nn_grad_t *g)
{
    if (!pcs_nn_wants(g))
        return PCS_OK;
    if ((!is_compute(g->dtype) && g->dtype != PCS_DTYPE_FP64) || !is_compute(g->param_dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn %s: %s gradient dtype %s of a %s parameter",
                             op, what, pcs_dtype_name(g->dtype), pcs_dtype_name(g->param_dtype));
    return PCS_OK;
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

void pcs_nn_host_round(float *v, size_t n, pcs_dtype_t dtype)
{
    if (dtype != PCS_DTYPE_BF16 && dtype != PCS_DTYPE_FP16)
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
