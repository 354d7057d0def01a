/* Internal to kernels/: argument validation shared by every backend, the per-backend getters the
 * registry calls, and the host-side coefficient setup of the optimizer updates. Not installed. */
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
 * returns it when pcs_devsim_enabled() (PCS_SIMULATE_CUDA=1). Its device pointers are host
 * pointers with a poison tag; pcs_devsim_arg() checks one is tagged (NULL passes) and gives the
 * host address, or records PCS_ERR_INVALID_ARG naming `op` and `what`. */
const pcs_backend_ops_t *pcs_backend_devsim(void);
int pcs_devsim_enabled(void);
int pcs_devsim_is_device_ptr(const void *p);
pcs_status_t pcs_devsim_arg(const char *op, const char *what, const void *p, void **out);
/* Queue run(arg) on simulated stream s (NULL: run now and return its status). arg is a malloc'd
 * block the simulator frees after running it (also when queueing fails). */
pcs_status_t pcs_devsim_submit(pcs_stream_t s, pcs_status_t (*run)(void *arg), void *arg);

/* Validation: each records a message with pcs_set_error() naming `op`, and returns the status. */
/* A buffer of n elements of `dt` (NULL with n > 0, or misaligned for the element size). */
pcs_status_t pcs_kv_buffer(const char *op, const char *what, const void *p, pcs_dtype_t dt,
                           size_t n);
/* A tensor list (NULL list with count > 0; each tensor's dtype in `allowed` bitmask of
 * 1u << dtype; each data pointer as pcs_kv_buffer). */
pcs_status_t pcs_kv_list(const char *op, const char *what, const pcs_tensor_t *t, size_t count,
                         unsigned allowed);
/* Two lists of the same length whose tensors pair up with equal n. */
pcs_status_t pcs_kv_pair(const char *op, const char *a_name, const pcs_tensor_t *a,
                         const char *b_name, const pcs_tensor_t *b, size_t count);
pcs_status_t pcs_kv_adamw(const pcs_adamw_config_t *cfg, int64_t step);
pcs_status_t pcs_kv_sgd(const pcs_sgd_config_t *cfg);

#define PCS_DT_BIT(d) (1u << (unsigned)(d))
#define PCS_DT_HALFS                                                                               \
    (PCS_DT_BIT(PCS_DTYPE_FP32) | PCS_DT_BIT(PCS_DTYPE_BF16) | PCS_DT_BIT(PCS_DTYPE_FP16))
#define PCS_DT_FLOATS (PCS_DT_HALFS | PCS_DT_BIT(PCS_DTYPE_FP64))

/* Host-side scalar setup, double precision then rounded once (as PyTorch passes Python floats). */
void pcs_adamw_coef(const pcs_adamw_config_t *cfg, int64_t step, pcs_adamw_coef_t *out);
void pcs_sgd_coef(const pcs_sgd_config_t *cfg, int first_step, pcs_sgd_coef_t *out);

#ifdef __cplusplus
}
#endif
#endif
