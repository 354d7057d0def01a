/* Internal to kernels/: the backends' unchecked element-wise op tables (the front door in
 * backend.c validates before calling them), the per-backend getters the registry calls, and the
 * host-side coefficient setup of the optimizer updates. Not installed. */
#ifndef PCS_KERNELS_INTERNAL_H
#define PCS_KERNELS_INTERNAL_H

#include "pcs/kernel_math.h"
#include "pcs/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backend tables. The cuda getter returns PCS_ERR_UNSUPPORTED when not built (backend_nocuda.c)
 * or when no device is present. */
const pcs_backend_ops_t *pcs_backend_cpu(void);
pcs_status_t pcs_backend_cuda_get(const pcs_backend_ops_t **out);
int pcs_backend_cuda_built(void);

/* The simulated "cuda" backend (ops_devsim.c, always built; tests only): pcs_backend_get("cuda")
 * returns it when pcs_devsim_enabled() (pcs_backend_simulate_cuda). Its device pointers are host
 * pointers with a poison tag; pcs_devsim_arg() checks one is tagged (NULL passes) and gives the
 * host address, or records PCS_ERR_INVALID_ARG naming `op` and `what`. */
const pcs_backend_ops_t *pcs_backend_devsim(void);
int pcs_devsim_enabled(void);
int pcs_devsim_is_device_ptr(const void *p);
pcs_status_t pcs_devsim_arg(const char *op, const char *what, const void *p, void **out);
/* Queue run(arg) on simulated stream s (NULL: run now and return its status). arg is a malloc'd
 * block the simulator frees after running it (also when queueing fails). */
pcs_status_t pcs_devsim_submit(pcs_stream_t s, pcs_status_t (*run)(void *arg), void *arg);

/* The element-wise ops of one backend, unchecked: only the front door (backend.c,
 * pcs_kernel_*() in pcs/kernels.h, which states each op's contract) calls them, after it has
 * validated every argument. A backend checks only what is its own (device pointers of the
 * simulated device, CUDA launch errors). */
typedef struct pcs_kernel_ops {
    pcs_status_t (*fill)(void *dst, pcs_dtype_t dtype, size_t n, double value, pcs_stream_t s);
    pcs_status_t (*cast)(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                         pcs_stream_t s);
    pcs_status_t (*scale)(const pcs_tensor_t *t, size_t count, double factor, pcs_stream_t s);
    pcs_status_t (*accumulate)(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                               pcs_stream_t s);
    pcs_status_t (*nonfinite_check_and_unscale)(const pcs_tensor_t *t, size_t count,
                                                float *found_inf, const float *inv_scale,
                                                pcs_stream_t s);
    pcs_status_t (*sum_squares)(const pcs_tensor_t *t, size_t count, float *out, pcs_stream_t s);
    pcs_status_t (*adamw_update)(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                                 const pcs_tensor_t *exp_avg, const pcs_tensor_t *exp_avg_sq,
                                 size_t count, const pcs_adamw_config_t *cfg, int64_t step,
                                 pcs_stream_t s);
    pcs_status_t (*sgd_update)(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                               const pcs_tensor_t *momentum_buf, size_t count,
                               const pcs_sgd_config_t *cfg, int first_step, pcs_stream_t s);
    /* optional (NULL: the front door answers PCS_ERR_UNSUPPORTED): accumulate + sum_squares of
     * the result in one pass */
    pcs_status_t (*accumulate_sumsq)(const pcs_tensor_t *dst, const pcs_tensor_t *src, float *out,
                                     pcs_stream_t s);
} pcs_kernel_ops_t;

/* Host-side scalar setup, double precision then rounded once (as PyTorch passes Python floats). */
void pcs_adamw_coef(const pcs_adamw_config_t *cfg, int64_t step, pcs_adamw_coef_t *out);
void pcs_sgd_coef(const pcs_sgd_config_t *cfg, int first_step, pcs_sgd_coef_t *out);
/* The same for fp64 shards: the doubles themselves (PyTorch's opmath for float64). */
void pcs_adamw_coef64(const pcs_adamw_config_t *cfg, int64_t step, pcs_adamw_coef64_t *out);
void pcs_sgd_coef64(const pcs_sgd_config_t *cfg, int first_step, pcs_sgd_coef64_t *out);

#ifdef __cplusplus
}
#endif
#endif
