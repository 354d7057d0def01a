/* Internal to kernels/: the implementation table and the pcs_nn_t layout every nn implementation
 * shares, and the registry getters. Arguments are checked once, by the front door in nn.c (so a
 * bad call is the same error on cpu and cuda, and a CPU test proves the cuda path's validation).
 * Not installed. */
#ifndef PCS_NN_INTERNAL_H
#define PCS_NN_INTERNAL_H

#include "pcs/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An implementation: its ops are unchecked, the front door (nn.c, pcs_nn_*() in pcs/nn.h, which
 * states each op's contract) has validated every argument before one is called. An
 * implementation checks only what is its own (its backend, device pointers of the simulated
 * device, CUDA errors). */
struct pcs_nn_ops {
    const char *name; /* "cpu" | "cuda" */
    /* Context on `be` (must be this implementation's backend) and stream `s` (retained). */
    pcs_status_t (*create)(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out);
    void (*destroy)(pcs_nn_t *nn); /* accepts NULL */
    /* each: pcs_nn_<name>() of pcs/nn.h */
    pcs_status_t (*copy_round)(pcs_nn_t *nn, float *dst, const float *src, size_t n,
                               pcs_dtype_t dt);
    pcs_status_t (*add)(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                        pcs_dtype_t dt);
    pcs_status_t (*act_fwd)(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                            pcs_dtype_t dt);
    pcs_status_t (*act_bwd)(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x,
                            const float *y, const float *dy, size_t n);
    pcs_status_t (*linear_fwd)(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y);
    pcs_status_t (*linear_bwd_params)(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                      const float *x, const pcs_nn_grad_t *dw,
                                      const pcs_nn_grad_t *db);
    pcs_status_t (*linear_bwd_input)(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                     float *dx);
    pcs_status_t (*norm_fwd)(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y);
    pcs_status_t (*norm_bwd)(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, const float *dy,
                             float *dx, const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db);
};

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

/* 1 if g asks for a gradient. */
static inline int pcs_nn_wants(const pcs_nn_grad_t *g)
{
    return g && g->data;
}

#ifdef __cplusplus
}
#endif
#endif
