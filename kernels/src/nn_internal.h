/* Internal to kernels/: the pcs_nn_t layout every nn implementation shares, the registry getters
 * and the argument checks both twins run first (so a bad call is the same error on cpu and cuda,
 * and a CPU test proves the cuda path's validation). Not installed. */
#ifndef PCS_NN_INTERNAL_H
#define PCS_NN_INTERNAL_H

#include "pcs/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pcs_nn {
    const pcs_nn_ops_t *ops;
    const pcs_backend_ops_t *be;
    pcs_stream_t stream;
    void *impl; /* the implementation's state */
};

const pcs_nn_ops_t *pcs_nn_cpu_ops(void);
/* The simulated "cuda" implementation (nn_devsim.c): the cpu ops on untagged device pointers. */
const pcs_nn_ops_t *pcs_nn_devsim_ops(void);
/* PCS_ERR_UNSUPPORTED when not built (nn_nocuda.c) or when no device is present. */
pcs_status_t pcs_nn_cuda_get(const pcs_nn_ops_t **out);

/* Each records a message naming `op` with pcs_set_error() and returns PCS_ERR_INVALID_ARG. */
pcs_status_t pcs_nn_check_ctx(const char *op, const pcs_nn_t *nn);
/* Up to four arrays of n elements, each non-NULL when n > 0 (repeat one for an unused slot);
 * `dt` must be FP32/BF16/FP16. */
pcs_status_t pcs_nn_check_ew(const char *op, const pcs_nn_t *nn, const void *a, const void *b,
                             const void *c, const void *d, size_t n, pcs_dtype_t dt);
/* What an op reads of a Linear's weight: forward reads `weight` (and fills `saved` for low
 * precision), input-backward reads `weight` (fp32) or `saved`, parameter-backward neither. */
typedef enum { PCS_NN_READ_FWD, PCS_NN_READ_BWD_INPUT, PCS_NN_READ_BWD_PARAMS } pcs_nn_read_t;
/* A Linear: dims in [1, 2^31), compute dtype, the weight / saved buffer the op reads. */
pcs_status_t pcs_nn_check_linear(const char *op, const pcs_nn_t *nn, const pcs_nn_linear_t *l,
                                 pcs_nn_read_t reads);
/* A norm: kind, dims, dtypes, weight/bias/save present; forward of a BatchNorm: running stats
 * present and training with more than one row (backward reads neither). */
pcs_status_t pcs_nn_check_norm(const char *op, const pcs_nn_t *nn, const pcs_nn_norm_t *p,
                               int forward);
/* A gradient destination (NULL or NULL data = skipped): dtype FP32/BF16/FP16/FP64, param dtype
 * a compute dtype. */
pcs_status_t pcs_nn_check_grad(const char *op, const char *what, const pcs_nn_grad_t *g);
/* 1 if g asks for a gradient. */
static inline int pcs_nn_wants(const pcs_nn_grad_t *g)
{
    return g && g->data;
}

/* The whole argument check of linear_bwd_params: the Linear, both gradient destinations, dy, and
 * x when dW is wanted. */
static inline pcs_status_t pcs_nn_check_linear_bwd_params(const pcs_nn_t *nn,
                                                          const pcs_nn_linear_t *l, const float *dy,
                                                          const float *x, const pcs_nn_grad_t *dw,
                                                          const pcs_nn_grad_t *db)
{
    PCS_CHECK(pcs_nn_check_linear("linear_bwd_params", nn, l, PCS_NN_READ_BWD_PARAMS));
    PCS_CHECK(pcs_nn_check_grad("linear_bwd_params", "weight", dw));
    PCS_CHECK(pcs_nn_check_grad("linear_bwd_params", "bias", db));
    if (!dy || (pcs_nn_wants(dw) && !x))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn linear_bwd_params: NULL dy or x");
    return PCS_OK;
}

/* The whole argument check of norm_bwd: the norm, both gradient destinations, x and dy. */
static inline pcs_status_t pcs_nn_check_norm_bwd(const pcs_nn_t *nn, const pcs_nn_norm_t *p,
                                                 const float *x, const float *dy,
                                                 const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db)
{
    PCS_CHECK(pcs_nn_check_norm("norm_bwd", nn, p, 0));
    PCS_CHECK(pcs_nn_check_grad("norm_bwd", "weight", dw));
    PCS_CHECK(pcs_nn_check_grad("norm_bwd", "bias", db));
    if (!x || !dy)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn norm_bwd: NULL x or dy");
    return PCS_OK;
}

#ifdef __cplusplus
}
#endif
#endif
