/* Backend registry ("cpu" always, "cuda" when built and a device exists, or simulated with
 * PCS_SIMULATE_CUDA=1), PyTorch's optimizer
 * defaults, the single-tensor conveniences over the list ops, and the argument validation every
 * backend runs before touching memory (bad input gets a status and a message, never a crash). */
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

// ---- single-tensor conveniences ----

static pcs_status_t check_be(const pcs_backend_ops_t *be, const char *op)
{
    if (be == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: NULL backend", op);
    return PCS_OK;
}

pcs_status_t pcs_kernel_cast(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                             const void *src, pcs_dtype_t src_dtype, size_t n, pcs_stream_t s)
{
    PCS_CHECK(check_be(be, "cast"));
    pcs_tensor_t d = {dst, dst_dtype, n};
    pcs_tensor_t t = {(void *)(uintptr_t)src, src_dtype, n};
    return be->cast(&d, &t, 1, s);
}

pcs_status_t pcs_kernel_scale(const pcs_backend_ops_t *be, void *t, pcs_dtype_t dtype, size_t n,
                              float factor, pcs_stream_t s)
{
    PCS_CHECK(check_be(be, "scale"));
    pcs_tensor_t x = {t, dtype, n};
    return be->scale(&x, 1, factor, s);
}

pcs_status_t pcs_kernel_accumulate(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                                   const void *src, pcs_dtype_t src_dtype, size_t n, pcs_stream_t s)
{
    PCS_CHECK(check_be(be, "accumulate"));
    pcs_tensor_t d = {dst, dst_dtype, n};
    pcs_tensor_t t = {(void *)(uintptr_t)src, src_dtype, n};
    return be->accumulate(&d, &t, 1, s);
}

pcs_status_t pcs_kernel_sum_squares(const pcs_backend_ops_t *be, const void *t, pcs_dtype_t dtype,
                                    size_t n, float *out, pcs_stream_t s)
{
    PCS_CHECK(check_be(be, "sum_squares"));
    pcs_tensor_t x = {(void *)(uintptr_t)t, dtype, n};
    return be->sum_squares(&x, 1, out, s);
}

// ---- validation ----

pcs_status_t pcs_kv_buffer(const char *op, const char *what, const void *p, pcs_dtype_t dt,
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

pcs_status_t pcs_kv_list(const char *op, const char *what, const pcs_tensor_t *t, size_t count,
                         unsigned allowed)
{
    if (count == 0)
        return PCS_OK;
    if (t == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s list is NULL with count = %zu", op, what,
                             count);
    for (size_t k = 0; k < count; k++) {
        if ((unsigned)t[k].dtype >= 32u || !(allowed & PCS_DT_BIT(t[k].dtype)))
            return pcs_set_error(PCS_ERR_UNSUPPORTED, "%s: %s[%zu] dtype %s is not supported", op,
                                 what, k, pcs_dtype_name(t[k].dtype));
        PCS_CHECK(pcs_kv_buffer(op, what, t[k].data, t[k].dtype, t[k].n));
    }
    return PCS_OK;
}

pcs_status_t pcs_kv_pair(const char *op, const char *a_name, const pcs_tensor_t *a,
                         const char *b_name, const pcs_tensor_t *b, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (a[k].n != b[k].n)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s[%zu].n = %zu but %s[%zu].n = %zu", op,
                                 a_name, k, a[k].n, b_name, k, b[k].n);
    return PCS_OK;
}

pcs_status_t pcs_kv_adamw(const pcs_adamw_config_t *cfg, int64_t step)
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

pcs_status_t pcs_kv_sgd(const pcs_sgd_config_t *cfg)
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
