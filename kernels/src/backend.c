/* Backend registry ("cpu" always, "cuda" when built and a device exists, or simulated after
 * pcs_backend_simulate_cuda), PyTorch's optimizer defaults, and the front door of the element-wise ops:
 * every pcs_kernel_*() validates its arguments here, once for every backend (as NCCL's
 * ncclEnqueueCheck), then calls the backend's unchecked op. Bad input gets a status and a message
 * naming the op and the argument, never a crash. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"
#include "pcs/log.h"

// ---- registry ----

int pcs_backend_built(const char *name)
{
    if (name == NULL)
        return 0;
    if (strcmp(name, "cpu") == 0)
        return 1;
    if (strcmp(name, "cuda") == 0)
        return pcs_backend_cuda_built();
    return 0;
}

pcs_status_t pcs_backend_get(const char *name, const pcs_backend_ops_t **out)
{
    if (name == NULL || out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_backend_get: NULL %s",
                             name == NULL ? "name" : "out");
    *out = NULL;
    if (strcmp(name, "cpu") == 0) {
        *out = pcs_backend_cpu();
        return PCS_OK;
    }
    if (strcmp(name, "cuda") == 0 && pcs_devsim_enabled()) {
        *out = pcs_backend_devsim(); /* tests without a GPU (ops_devsim.c) */
        return PCS_OK;
    }
    if (strcmp(name, "cuda") == 0)
        return pcs_backend_cuda_get(out);
    return pcs_set_error(PCS_ERR_NOT_FOUND, "unknown kernel backend '%s' (known: cpu, cuda)", name);
}

void pcs_adamw_config_default(pcs_adamw_config_t *cfg)
{
    cfg->lr = 1e-3;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->weight_decay = 1e-2;
    cfg->maximize = 0;
}

void pcs_sgd_config_default(pcs_sgd_config_t *cfg)
{
    cfg->lr = 1e-3;
    cfg->momentum = 0.0;
    cfg->dampening = 0.0;
    cfg->weight_decay = 0.0;
    cfg->nesterov = 0;
    cfg->maximize = 0;
}

// ---- argument checks: each records a message naming `op` with pcs_set_error() ----

#define DT_BIT(d) (1u << (unsigned)(d))
#define DT_HALFS  (DT_BIT(PCS_DTYPE_FP32) | DT_BIT(PCS_DTYPE_BF16) | DT_BIT(PCS_DTYPE_FP16))
#define DT_FLOATS (DT_HALFS | DT_BIT(PCS_DTYPE_FP64))
#define DT_FP32   DT_BIT(PCS_DTYPE_FP32)
#define DT_FP64   DT_BIT(PCS_DTYPE_FP64)

static pcs_status_t check_backend(const pcs_backend_ops_t *be, const char *op)
{
    if (be == NULL || be->kernels == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: NULL backend", op);
    return PCS_OK;
}

/* A buffer of n elements of `dt`: NULL with n > 0, or misaligned for the element size. */
static pcs_status_t check_buffer(const char *op, const char *what, const void *p, pcs_dtype_t dt,
                                 size_t n)
{
    size_t es = pcs_dtype_size(dt);
    if (es == 0)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "%s: %s has invalid dtype %d", op, what, (int)dt);
    if (n == 0)
        return PCS_OK;
    if (p == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s is NULL with n = %zu", op, what, n);
    if (((uintptr_t)p % es) != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s: %s %p is not aligned to its %zu-byte %s elements", op, what, p,
                             es, pcs_dtype_name(dt));
    if (n > SIZE_MAX / es)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s n = %zu overflows size_t", op, what, n);
    return PCS_OK;
}

/* A tensor list: NULL with count > 0; each dtype in `allowed` (a DT_BIT mask); each buffer as
 * check_buffer. */
static pcs_status_t check_list(const char *op, const char *what, const pcs_tensor_t *t,
                               size_t count, unsigned allowed)
{
    if (count == 0)
        return PCS_OK;
    if (t == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s list is NULL with count = %zu", op, what,
                             count);
    for (size_t k = 0; k < count; k++) {
        if ((unsigned)t[k].dtype >= 32u || !(allowed & DT_BIT(t[k].dtype)))
            return pcs_set_error(PCS_ERR_UNSUPPORTED, "%s: %s[%zu] dtype %s is not supported", op,
                                 what, k, pcs_dtype_name(t[k].dtype));
        PCS_CHECK(check_buffer(op, what, t[k].data, t[k].dtype, t[k].n));
    }
    return PCS_OK;
}

/* Two lists whose tensors pair up with equal n. */
static pcs_status_t check_pair(const char *op, const char *a_name, const pcs_tensor_t *a,
                               const char *b_name, const pcs_tensor_t *b, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (a[k].n != b[k].n)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s[%zu].n = %zu but %s[%zu].n = %zu", op,
                                 a_name, k, a[k].n, b_name, k, b[k].n);
    return PCS_OK;
}

/* b: a list paired with the list a, each b[k] of a[k]'s dtype (an optimizer's fp32 or fp64
 * shards). */
static pcs_status_t check_like(const char *op, const char *an, const pcs_tensor_t *a,
                               const char *bn, const pcs_tensor_t *b, size_t count)
{
    PCS_CHECK(check_list(op, bn, b, count, DT_FP32 | DT_FP64));
    for (size_t k = 0; k < count; k++)
        if (b[k].dtype != a[k].dtype)
            return pcs_set_error(PCS_ERR_UNSUPPORTED, "%s: %s[%zu] is %s but %s[%zu] is %s", op,
                                 bn, k, pcs_dtype_name(b[k].dtype), an, k,
                                 pcs_dtype_name(a[k].dtype));
    return check_pair(op, an, a, bn, b, count);
}

/* Accumulation pairs: every pair of float dtypes (pcs_kernel_accumulate_list states the
 * arithmetic of each). */
static pcs_status_t check_acc(const char *op, const pcs_tensor_t *dst, const pcs_tensor_t *src,
                              size_t count)
{
    PCS_CHECK(check_list(op, "dst", dst, count, DT_FLOATS));
    PCS_CHECK(check_list(op, "src", src, count, DT_FLOATS));
    return check_pair(op, "dst", dst, "src", src, count);
}

static pcs_status_t check_adamw(const pcs_adamw_config_t *cfg, int64_t step)
{
    if (cfg == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "adamw_update: NULL config");
    if (step < 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "adamw_update: step %lld < 1", (long long)step);
    /* torch.optim.Adam's constructor checks */
    if (!(cfg->lr >= 0.0) || !(cfg->eps >= 0.0) || !(cfg->weight_decay >= 0.0) ||
        !(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0) || !(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "adamw_update: invalid hyper-parameters lr=%g betas=(%g, %g) eps=%g "
                             "weight_decay=%g",
                             cfg->lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay);
    return PCS_OK;
}

static pcs_status_t check_sgd(const pcs_sgd_config_t *cfg)
{
    if (cfg == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "sgd_update: NULL config");
    if (!(cfg->lr >= 0.0) || !(cfg->momentum >= 0.0) || !(cfg->weight_decay >= 0.0) ||
        !isfinite(cfg->dampening))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "sgd_update: invalid hyper-parameters lr=%g momentum=%g "
                             "dampening=%g weight_decay=%g",
                             cfg->lr, cfg->momentum, cfg->dampening, cfg->weight_decay);
    if (cfg->nesterov && (cfg->momentum <= 0.0 || cfg->dampening != 0.0))
        return pcs_set_error(
            PCS_ERR_INVALID_ARG,
            "sgd_update: nesterov momentum requires a momentum and zero dampening");
    return PCS_OK;
}

// ---- the front door ----

pcs_status_t pcs_kernel_fill(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dt, size_t n,
                             double value, pcs_stream_t s)
{
    PCS_CHECK(check_backend(be, "fill"));
    if (dt != PCS_DTYPE_INT64 && !pcs_dtype_is_float(dt))
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "fill: dtype %d is not supported", (int)dt);
    PCS_CHECK(check_buffer("fill", "dst", dst, dt, n));
    if (dt == PCS_DTYPE_INT64 &&
        !(value >= -9223372036854775808.0 && value < 9223372036854775808.0))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "fill: %g does not fit int64", value);
    return be->kernels->fill(dst, dt, n, value, s);
}

pcs_status_t pcs_kernel_cast_list(const pcs_backend_ops_t *be, const pcs_tensor_t *dst,
                                  const pcs_tensor_t *src, size_t count, pcs_stream_t s)
{
    PCS_CHECK(check_backend(be, "cast"));
    PCS_CHECK(check_list("cast", "dst", dst, count, DT_FLOATS));
    PCS_CHECK(check_list("cast", "src", src, count, DT_FLOATS));
    PCS_CHECK(check_pair("cast", "dst", dst, "src", src, count));
    return be->kernels->cast(dst, src, count, s);
}

pcs_status_t pcs_kernel_scale_list(const pcs_backend_ops_t *be, const pcs_tensor_t *t, size_t count,
                                   double factor, pcs_stream_t s)
{
    PCS_CHECK(check_backend(be, "scale"));
    PCS_CHECK(check_list("scale", "t", t, count, DT_FLOATS));
    return be->kernels->scale(t, count, factor, s);
}

pcs_status_t pcs_kernel_accumulate_list(const pcs_backend_ops_t *be, const pcs_tensor_t *dst,
                                        const pcs_tensor_t *src, size_t count, pcs_stream_t s)
{
    PCS_CHECK(check_backend(be, "accumulate"));
    PCS_CHECK(check_acc("accumulate", dst, src, count));
    return be->kernels->accumulate(dst, src, count, s);
}

pcs_status_t pcs_kernel_accumulate_sumsq(const pcs_backend_ops_t *be, void *dst,
                                         pcs_dtype_t dst_dtype, const void *src,
                                         pcs_dtype_t src_dtype, size_t n, float *out,
                                         pcs_stream_t s)
{
    pcs_tensor_t d = {dst, dst_dtype, n}, t = {(void *)src, src_dtype, n};
    PCS_CHECK(check_backend(be, "accumulate_sumsq"));
    PCS_CHECK(check_list("accumulate_sumsq", "dst", &d, 1, DT_HALFS));
    PCS_CHECK(check_list("accumulate_sumsq", "src", &t, 1, DT_HALFS));
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "accumulate_sumsq: NULL out");
    if (be->kernels->accumulate_sumsq == NULL)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "accumulate_sumsq: not on the %s backend",
                             be->name);
    return be->kernels->accumulate_sumsq(&d, &t, out, s);
}

pcs_status_t pcs_kernel_nonfinite_check_and_unscale(const pcs_backend_ops_t *be,
                                                    const pcs_tensor_t *t, size_t count,
                                                    float *found_inf, const float *inv_scale,
                                                    pcs_stream_t s)
{
    const char *op = "nonfinite_check_and_unscale";
    PCS_CHECK(check_backend(be, op));
    PCS_CHECK(check_buffer(op, "found_inf", found_inf, PCS_DTYPE_FP32, 1));
    PCS_CHECK(check_buffer(op, "inv_scale", inv_scale, PCS_DTYPE_FP32, 1));
    PCS_CHECK(check_list(op, "t", t, count, DT_FLOATS));
    return be->kernels->nonfinite_check_and_unscale(t, count, found_inf, inv_scale, s);
}

pcs_status_t pcs_kernel_sum_squares_list(const pcs_backend_ops_t *be, const pcs_tensor_t *t,
                                         size_t count, float *out, pcs_stream_t s)
{
    PCS_CHECK(check_backend(be, "sum_squares"));
    PCS_CHECK(check_buffer("sum_squares", "out", out, PCS_DTYPE_FP32, 1));
    PCS_CHECK(check_list("sum_squares", "t", t, count, DT_FLOATS));
    return be->kernels->sum_squares(t, count, out, s);
}

pcs_status_t pcs_kernel_adamw_update(const pcs_backend_ops_t *be, const pcs_tensor_t *param,
                                     const pcs_tensor_t *grad, const pcs_tensor_t *exp_avg,
                                     const pcs_tensor_t *exp_avg_sq, size_t count,
                                     const pcs_adamw_config_t *cfg, int64_t step, pcs_stream_t s)
{
    const char *op = "adamw_update";
    PCS_CHECK(check_backend(be, op));
    PCS_CHECK(check_adamw(cfg, step));
    PCS_CHECK(check_list(op, "param", param, count, DT_FP32 | DT_FP64));
    PCS_CHECK(check_like(op, "param", param, "grad", grad, count));
    PCS_CHECK(check_like(op, "param", param, "exp_avg", exp_avg, count));
    PCS_CHECK(check_like(op, "param", param, "exp_avg_sq", exp_avg_sq, count));
    return be->kernels->adamw_update(param, grad, exp_avg, exp_avg_sq, count, cfg, step, s);
}

pcs_status_t pcs_kernel_sgd_update(const pcs_backend_ops_t *be, const pcs_tensor_t *param,
                                   const pcs_tensor_t *grad, const pcs_tensor_t *buf, size_t count,
                                   const pcs_sgd_config_t *cfg, int first_step, pcs_stream_t s)
{
    const char *op = "sgd_update";
    PCS_CHECK(check_backend(be, op));
    PCS_CHECK(check_sgd(cfg));
    PCS_CHECK(check_list(op, "param", param, count, DT_FP32 | DT_FP64));
    PCS_CHECK(check_like(op, "param", param, "grad", grad, count));
    if (cfg->momentum != 0.0) {
        if (buf == NULL && count > 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: momentum %g needs momentum buffers", op,
                                 cfg->momentum);
        PCS_CHECK(check_like(op, "param", param, "momentum_buf", buf, count));
    }
    return be->kernels->sgd_update(param, grad, buf, count, cfg, first_step, s);
}

// ---- single-tensor forms ----

pcs_status_t pcs_kernel_cast(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                             const void *src, pcs_dtype_t src_dtype, size_t n, pcs_stream_t s)
{
    pcs_tensor_t d = {dst, dst_dtype, n};
    pcs_tensor_t t = {(void *)(uintptr_t)src, src_dtype, n};
    return pcs_kernel_cast_list(be, &d, &t, 1, s);
}

pcs_status_t pcs_kernel_scale(const pcs_backend_ops_t *be, void *t, pcs_dtype_t dtype, size_t n,
                              double factor, pcs_stream_t s)
{
    pcs_tensor_t x = {t, dtype, n};
    return pcs_kernel_scale_list(be, &x, 1, factor, s);
}

pcs_status_t pcs_kernel_accumulate(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                                   const void *src, pcs_dtype_t src_dtype, size_t n, pcs_stream_t s)
{
    pcs_tensor_t d = {dst, dst_dtype, n};
    pcs_tensor_t t = {(void *)(uintptr_t)src, src_dtype, n};
    return pcs_kernel_accumulate_list(be, &d, &t, 1, s);
}

pcs_status_t pcs_kernel_sum_squares(const pcs_backend_ops_t *be, const void *t, pcs_dtype_t dtype,
                                    size_t n, float *out, pcs_stream_t s)
{
    pcs_tensor_t x = {(void *)(uintptr_t)t, dtype, n};
    return pcs_kernel_sum_squares_list(be, &x, 1, out, s);
}

// ---- optimizer scalars ----

void pcs_adamw_coef(const pcs_adamw_config_t *cfg, int64_t step, pcs_adamw_coef_t *out)
{
    double t = (double)step;
    double bias1 = 1.0 - pow(cfg->beta1, t);
    double bias2 = 1.0 - pow(cfg->beta2, t);
    out->decay = (float)(1.0 - cfg->lr * cfg->weight_decay);
    out->w1 = (float)(1.0 - cfg->beta1);
    out->beta2 = (float)cfg->beta2;
    out->omb2 = (float)(1.0 - cfg->beta2);
    out->neg_step = (float)(-(cfg->lr / bias1));
    out->bc2_sqrt = (float)sqrt(bias2);
    out->eps = (float)cfg->eps;
    out->gsign = cfg->maximize ? -1.0f : 1.0f;
}

void pcs_adamw_coef64(const pcs_adamw_config_t *cfg, int64_t step, pcs_adamw_coef64_t *out)
{
    double t = (double)step;
    out->decay = 1.0 - cfg->lr * cfg->weight_decay;
    out->w1 = 1.0 - cfg->beta1;
    out->beta2 = cfg->beta2;
    out->omb2 = 1.0 - cfg->beta2;
    out->neg_step = -(cfg->lr / (1.0 - pow(cfg->beta1, t)));
    out->bc2_sqrt = sqrt(1.0 - pow(cfg->beta2, t));
    out->eps = cfg->eps;
    out->gsign = cfg->maximize ? -1.0 : 1.0;
}

void pcs_sgd_coef64(const pcs_sgd_config_t *cfg, int first_step, pcs_sgd_coef64_t *out)
{
    out->wd = cfg->weight_decay;
    out->momentum = cfg->momentum;
    out->omd = 1.0 - cfg->dampening;
    out->neg_lr = -cfg->lr;
    out->gsign = cfg->maximize ? -1.0 : 1.0;
    out->use_wd = cfg->weight_decay != 0.0;
    out->use_momentum = cfg->momentum != 0.0;
    out->nesterov = cfg->nesterov != 0;
    out->first_step = first_step != 0;
}

void pcs_sgd_coef(const pcs_sgd_config_t *cfg, int first_step, pcs_sgd_coef_t *out)
{
    out->wd = (float)cfg->weight_decay;
    out->momentum = (float)cfg->momentum;
    out->omd = (float)(1.0 - cfg->dampening);
    out->neg_lr = (float)(-cfg->lr);
    out->gsign = cfg->maximize ? -1.0f : 1.0f;
    out->use_wd = cfg->weight_decay != 0.0;
    out->use_momentum = cfg->momentum != 0.0;
    out->nesterov = cfg->nesterov != 0;
    out->first_step = first_step != 0;
}
