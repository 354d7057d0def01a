/* The numeric operations of the built-in MLP (model/model.c) behind a plain-C vtable, so the same
 * module tree, op tape and hooks drive host arrays + OpenBLAS ("cpu", the reference twin) or
 * device arrays + cuBLAS/CUDA kernels ("cuda"). Activations and their gradients are fp32 arrays
 * that carry values rounded to a tagged dtype (fp32/bf16/fp16); parameters, gradients and
 * buffers are real arrays of their dtype. No CUDA header here (STYLE.md B8). */
#ifndef PCS_NN_H
#define PCS_NN_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/kernels.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-model context: the backend and stream every op is enqueued on, plus the implementation's
 * handles (cuda: one cublasHandle_t bound to the stream, with its workspace) and scratch.
 * Not thread-safe: one model, one thread. */
typedef struct pcs_nn pcs_nn_t;

typedef enum { PCS_NN_RELU = 1, PCS_NN_GELU = 2 } pcs_nn_act_t;
typedef enum { PCS_NN_LAYERNORM = 1, PCS_NN_BATCHNORM = 2 } pcs_nn_norm_kind_t;

/* Where a parameter gradient goes: `data` holds numel elements of `dtype` (FP32, BF16, FP16 or
 * FP64; NULL = not wanted). The fp32 result is first rounded to `param_dtype` when dtype differs
 * from it (autograd computes the gradient in the parameter's dtype), then stored as `dtype`.
 * With `accumulate` (FP32/BF16/FP16 only) it is instead added to what `data` holds, as autograd
 * accumulates into .grad: data = rnd_dtype(data + rnd_param_dtype(g)), the sum in fp32 — the bits
 * of storing the gradient in param_dtype and pcs_kernel_accumulate'ing that into data, without
 * the gradient buffer and the pass. */
typedef struct pcs_nn_grad {
    void *data;
    pcs_dtype_t dtype;
    pcs_dtype_t param_dtype;
    int accumulate;
} pcs_nn_grad_t;

/* y[rows, out_dim] = x[rows, in_dim] . weight^T + bias, fp32 accumulation, rounded once to dtype.
 * weight [out_dim, in_dim] and bias [out_dim] (NULL = none) are arrays of `dtype`; x and y are
 * fp32 arrays carrying `dtype` values. `saved` (optional backend memory, at least in_dim *
 * out_dim * 4 bytes; only used when dtype != FP32): forward copies a low-precision weight there
 * in the form the GEMM reads (cpu: fp32) so that an input-backward given no `weight` can still
 * run. The built-in model passes none and gives backward the re-gathered weight (FSDP re-gathers
 * a unit before its backward): the cpu twin then converts a bounded block at a time. */
typedef struct pcs_nn_linear {
    uint32_t rows, in_dim, out_dim;
    pcs_dtype_t dtype;
    const void *weight;
    const void *bias;
    void *saved;
} pcs_nn_linear_t;

/* LayerNorm over the last dim (per row) or BatchNorm1d over the rows (per feature), eps 1e-5.
 * LayerNorm's row sums in fp32 in one stated order (kernels/src/nn_math.h; two-pass variance),
 * BatchNorm's statistics accumulated in double, both saved as fp32; output rounded to `dtype` (the input's). weight/bias
 * [dim] have their own dtypes (mixed-type norm kernels). `save` (backend memory, fp32): LN 2*rows
 * floats (mean, rstd per row), BN 4*dim (mean, invstd, then the running stats as fp32), written by
 * forward and read by backward. BatchNorm: training uses the biased batch variance and updates
 * running_mean/running_var (momentum 0.1, unbiased variance; stored in their dtypes) and
 * num_batches_tracked (int64, may be NULL); eval normalises with the running statistics. */
typedef struct pcs_nn_norm {
    pcs_nn_norm_kind_t kind;
    uint32_t rows, dim;
    pcs_dtype_t dtype;
    const void *weight, *bias;
    pcs_dtype_t weight_dtype, bias_dtype;
    float *save;
    void *running_mean, *running_var; /* BatchNorm only */
    pcs_dtype_t mean_dtype, var_dtype;
    int64_t *num_batches_tracked;
    int training;
} pcs_nn_norm_t;

/* An implementation's table (kernels/src/nn_internal.h): its ops are reached only through the
 * pcs_nn_*() front door below, which validates every argument once for every implementation. */
typedef struct pcs_nn_ops pcs_nn_ops_t;

// ---- the ops: the front door ------------------------------------------------------------------
/* Every op: pointers are in the backend's memory; work is enqueued on the context's stream (cpu:
 * done on return; cuda: ready after be->sync(stream)). Bad arguments (a NULL context, NULL with
 * n > 0, zero dims, a dtype the op does not take, BatchNorm training with 1 row) ->
 * PCS_ERR_INVALID_ARG with a message naming the op, checked here for every implementation;
 * device failures -> PCS_ERR_CUDA with one WARN naming the call. n == 0 is a no-op. fp32 results
 * called "unrounded" are what the caller then rounds (grad accumulation). */

/* ---- element-wise, fp32 arrays carrying `dt` values ---- */
/* dst[i] = round(src[i], dt); dst may equal src; dt FP32 = plain copy. */
pcs_status_t pcs_nn_copy_round(pcs_nn_t *nn, float *dst, const float *src, size_t n,
                               pcs_dtype_t dt);
/* y[i] = round(a[i] + b[i], dt) (y may alias a or b): residual add, gradient accumulation. */
pcs_status_t pcs_nn_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                        pcs_dtype_t dt);
/* ReLU (exact, NaN kept) or GELU (erf form, computed in fp32, rounded to dt). */
pcs_status_t pcs_nn_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                            pcs_dtype_t dt);
/* dx (unrounded) from the forward's x, y and dy: ReLU passes dy where y > 0 or y is NaN. */
pcs_status_t pcs_nn_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x,
                            const float *y, const float *dy, size_t n);

/* ---- Linear ---- */
pcs_status_t pcs_nn_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y);
/* dW = dy^T x and db = column sums of dy (fp32, rows in order), stored through dw/db (either
 * may be NULL or have NULL data). dy carries l->dtype values. */
pcs_status_t pcs_nn_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                      const float *x, const pcs_nn_grad_t *dw,
                                      const pcs_nn_grad_t *db);
/* dx (unrounded) = dy . W, W being l->weight (cpu, low precision: converted a block at a time),
 * or what forward left in l->saved when a low-precision l->weight is NULL. */
pcs_status_t pcs_nn_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                     float *dx);

/* ---- LayerNorm / BatchNorm1d ---- */
pcs_status_t pcs_nn_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y);
/* From the training forward's x and p->save: dx (unrounded; NULL = not wanted), dweight and
 * dbias through dw/db. Reads p->weight. */
pcs_status_t pcs_nn_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, const float *dy,
                             float *dx, const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db);

// ---- implementations and contexts ----------------------------------------------------------

/* The implementation called `name` ("cpu", "cuda"): PCS_ERR_UNSUPPORTED when cuda was not built
 * or no device is present, PCS_ERR_NOT_FOUND for another name. The table is static. */
pcs_status_t pcs_nn_get(const char *name, const pcs_nn_ops_t **out);

/* Context for backend `be` (NULL = "cpu") on stream `s`: looks up pcs_nn_get(be->name) and calls
 * its create. Caller destroys with pcs_nn_destroy(). */
pcs_status_t pcs_nn_create(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out);
/* Context of implementation `ops` (from pcs_nn_get) on `be`: PCS_ERR_INVALID_ARG naming the
 * backend when it is not that implementation's. Caller destroys with pcs_nn_destroy(). */
pcs_status_t pcs_nn_create_with(const pcs_nn_ops_t *ops, const pcs_backend_ops_t *be,
                                pcs_stream_t s, pcs_nn_t **out);
void pcs_nn_destroy(pcs_nn_t *nn);
const pcs_nn_ops_t *pcs_nn_ops(const pcs_nn_t *nn);
/* The implementation's name: "cpu" | "cuda" (NULL for NULL). */
const char *pcs_nn_ops_name(const pcs_nn_ops_t *ops);
const pcs_backend_ops_t *pcs_nn_backend(const pcs_nn_t *nn);
pcs_stream_t pcs_nn_stream(const pcs_nn_t *nn);

/* Bytes `saved` must hold for a Linear of in_dim x out_dim (overflow -> SIZE_MAX). */
size_t pcs_nn_linear_saved_bytes(uint32_t in_dim, uint32_t out_dim);

/* ---- host helpers: the CPU twin's conversions, shared with model/model.c ---- */
/* Round fp32 values to dtype in place (nearest even; other dtypes: unchanged). */
void pcs_nn_host_round(float *v, size_t n, pcs_dtype_t dtype);
/* n values of src_dtype (FP32/BF16/FP16/FP64) to fp32. */
void pcs_nn_host_to_f32(const void *src, pcs_dtype_t src_dtype, size_t n, float *dst);
/* n fp32 values stored as dst_dtype (FP32/BF16/FP16/FP64), nearest even; dst may alias src. */
void pcs_nn_host_from_f32(const float *src, size_t n, pcs_dtype_t dst_dtype, void *dst);
/* erf / exp of n floats, the arithmetic of the CPU twin's GELU (vectorized, <= 1.2 / 1.1 ulp of
 * the correctly rounded value; dst may alias src). */
void pcs_nn_host_erf(const float *src, size_t n, float *dst);
void pcs_nn_host_exp(const float *src, size_t n, float *dst);

#ifdef __cplusplus
}
#endif
#endif
