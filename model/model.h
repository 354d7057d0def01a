/* Built-in MLP computed by the worker (forward and backward) over "unsharded parameter views": the
 * caller binds, per parameter FQN, a pointer to its values in the unit's compute dtype (and where
 * its gradient goes), then runs forward/backward. Hooks fire before/after each module in forward
 * and backward, the way FSDP's pre/post-forward and pre/post-backward hooks do, so the sharded
 * runtime can all-gather a unit in its pre-forward hook, reshard after, and reduce-scatter in its
 * post-backward hook; the single-process reference binds everything once and passes no hooks.
 *
 * Module tree and FQNs (planner's scheme, planner/model_tree.c): "" MLP; "layers" ModuleList;
 * "layers.{i}" MLPBlock = "layers.{i}.linear" Linear [+ "layers.{i}.norm" LayerNorm|BatchNorm1d]
 * + "layers.{i}.act" ReLU|GELU (+ input if residual and in == out); "head" Linear.
 * Numerics, mixed precision and memory: see model.c's header; the numerics run through pcs/nn.h
 * on the host ("cpu") or the GPU ("cuda", pcs_mlp_create_on). Not thread-safe per model. */
#ifndef PCS_MODEL_MODEL_H
#define PCS_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/init.h"
#include "pcs/dtype.h"
#include "pcs/kernels.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Pcs__V1__MlpModel;
struct Pcs__V1__Unit;
struct Pcs__V1__Plan;

typedef enum { PCS_ACT_RELU = 1, PCS_ACT_GELU = 2 } pcs_act_t;
typedef enum { PCS_NORM_NONE = 1, PCS_NORM_LAYERNORM = 2, PCS_NORM_BATCHNORM = 3 } pcs_norm_t;

typedef struct pcs_mlp_config {
    uint32_t input_dim;
    uint32_t output_dim;
    uint32_t n_hidden;
    const uint32_t *hidden_dims; /* borrowed for pcs_mlp_create (copied) */
    pcs_act_t act;
    pcs_norm_t norm;
    int bias;
    int residual;
} pcs_mlp_config_t;

typedef enum {
    PCS_MOD_MLP,
    PCS_MOD_LIST,
    PCS_MOD_BLOCK,
    PCS_MOD_LINEAR,
    PCS_MOD_LAYERNORM,
    PCS_MOD_BATCHNORM,
    PCS_MOD_RELU,
    PCS_MOD_GELU
} pcs_mod_kind_t;

typedef struct pcs_mlp_module {
    const char *path; /* FQN of the module ("" = root) */
    const char *cls;  /* MLP, ModuleList, MLPBlock, Linear, LayerNorm, BatchNorm1d, ReLU, GELU */
    pcs_mod_kind_t kind;
    int parent;                       /* index of the parent module, -1 for the root */
    uint32_t first_param, n_params;   /* range in pcs_mlp_param() */
    uint32_t first_buffer, n_buffers; /* range in pcs_mlp_buffer() */
    uint32_t in_dim, out_dim;         /* feature widths (Linear/norm/act/block) */
} pcs_mlp_module_t;

typedef struct pcs_mlp pcs_mlp_t;

/* Hooks, all optional (NULL members are skipped). A non-OK return aborts the pass with that
 * status. `module` indexes pcs_mlp_module(). The "layers" container never fires (its forward is
 * never called, as in PyTorch). Backward: pre_backward(m) fires before the first gradient of m is
 * computed, post_backward(m) after m's parameter gradients and input gradient are written. */
typedef struct pcs_mlp_hooks {
    void *ctx;
    pcs_status_t (*pre_forward)(void *ctx, uint32_t module);
    pcs_status_t (*post_forward)(void *ctx, uint32_t module);
    pcs_status_t (*pre_backward)(void *ctx, uint32_t module);
    pcs_status_t (*post_backward)(void *ctx, uint32_t module);
} pcs_mlp_hooks_t;

/* Fill a config from the job's mlp spec (defaults: relu, no norm, bias on). hidden_dims points into
 * `spec`, which must outlive the config. Invalid dims -> PCS_ERR_INVALID_ARG ("model.mlp....:
 * ..."). */
pcs_status_t pcs_mlp_config_from_proto(const struct Pcs__V1__MlpModel *spec, pcs_mlp_config_t *cfg);

/* Build the module tree. `max_rows` bounds the rows of one forward (buffers are preallocated
 * lazily on the first pass and reused). Caller destroys with pcs_mlp_destroy(). */
pcs_status_t pcs_mlp_create(const pcs_mlp_config_t *cfg, uint32_t max_rows, pcs_mlp_t **out);
/* The same on a kernels backend. be NULL or "cpu": host arrays and OpenBLAS (pcs_mlp_create is
 * pcs_mlp_create_on(cfg, rows, NULL, NULL, out)); "cuda": device arrays and cuBLAS, all work
 * enqueued on `stream` (retained; results ready after be->sync(stream)). Every pointer given to
 * bind_param/bind_grad/bind_buffer/bind_unit, x, grad_out, grad_in and the *out of forward is in
 * the backend's memory. Hooks run on the calling thread in program order, between enqueues.
 * PCS_ERR_UNSUPPORTED when the backend has no nn implementation (cuda not built, no device). */
pcs_status_t pcs_mlp_create_on(const pcs_mlp_config_t *cfg, uint32_t max_rows,
                               const pcs_backend_ops_t *be, pcs_stream_t stream, pcs_mlp_t **out);
/* The backend the model computes on (never NULL for a created model). */
const pcs_backend_ops_t *pcs_mlp_backend(const pcs_mlp_t *m);
void pcs_mlp_destroy(pcs_mlp_t *m);

uint32_t pcs_mlp_num_modules(const pcs_mlp_t *m);
const pcs_mlp_module_t *pcs_mlp_module(const pcs_mlp_t *m, uint32_t i);
/* Parameters in module-tree order (declaration order within a module); buffers likewise. */
uint32_t pcs_mlp_num_params(const pcs_mlp_t *m);
const pcs_named_tensor_t *pcs_mlp_param(const pcs_mlp_t *m, uint32_t i);
uint32_t pcs_mlp_num_buffers(const pcs_mlp_t *m);
const pcs_named_tensor_t *pcs_mlp_buffer(const pcs_mlp_t *m, uint32_t i);
/* Index of a parameter / buffer / module by FQN; -1 if none. */
int pcs_mlp_find_param(const pcs_mlp_t *m, const char *fqn);
int pcs_mlp_find_buffer(const pcs_mlp_t *m, const char *fqn);
int pcs_mlp_find_module(const pcs_mlp_t *m, const char *path);
/* Index of the module owning parameter i. */
uint32_t pcs_mlp_param_module(const pcs_mlp_t *m, uint32_t i);
uint64_t pcs_mlp_total_params(const pcs_mlp_t *m);

/* Deterministic init of elements [first, first+n) of parameter (is_buffer=0) or buffer i:
 * Linear weight and bias U(-1/sqrt(in), 1/sqrt(in)) from (seed, FQN) (PyTorch's Linear bounds),
 * norm weight 1 and bias 0, running_mean 0, running_var 1, num_batches_tracked 0. */
pcs_status_t pcs_mlp_init_tensor(const pcs_mlp_t *m, uint64_t seed, int is_buffer, uint32_t i,
                                 uint64_t first, uint64_t n, float *out);

/* Bind parameter i's values: `data` holds numel elements of `dtype` (FP32, BF16 or FP16; the
 * module's compute dtype). Retained until rebound or pcs_mlp_unbind_all(); not copied. */
pcs_status_t pcs_mlp_bind_param(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, const void *data);
/* Where backward writes parameter i's gradient (overwritten, not accumulated): numel elements of
 * `dtype`. The gradient is rounded to the parameter's compute dtype first (autograd's dtype), then
 * stored in `dtype`. NULL = do not compute it (frozen, or not wanted). Retained. */
pcs_status_t pcs_mlp_bind_grad(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data);
/* The same with accumulate = 1: backward adds the gradient (rounded to the parameter's compute
 * dtype) to what `data` holds, in fp32, rounded once to `dtype` (FP32/BF16/FP16), as autograd
 * accumulates into .grad (pcs_nn_grad_t.accumulate). accumulate = 0 is pcs_mlp_bind_grad. */
pcs_status_t pcs_mlp_bind_grad_mode(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data,
                                    int accumulate);
/* Buffer i (BatchNorm running_mean / running_var in FP32, BF16 or FP16; num_batches_tracked
 * INT64). Updated in place by training forwards. Retained. */
pcs_status_t pcs_mlp_bind_buffer(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data);
void pcs_mlp_unbind_all(pcs_mlp_t *m);

/* Bind every parameter of plan unit `u` to its view in the unit's unsharded flat buffer: the
 * parameter at ParamSlot offset o (in elements) is `flat + o * sizeof(dtype)`; gradients likewise
 * into `grad_flat` (NULL: none). `flat_numel` is the buffer length in elements (>= the unit's
 * flat_numel). What the sharded runtime calls after all-gathering a unit. Errors: an FQN that is
 * not a model parameter, a numel that differs, a slot beyond the buffer -> PCS_ERR_INVALID_ARG
 * naming the parameter. Retains the pointers like pcs_mlp_bind_param. */
pcs_status_t pcs_mlp_bind_unit(pcs_mlp_t *m, const struct Pcs__V1__Unit *u, pcs_dtype_t dtype,
                               const void *flat, pcs_dtype_t grad_dtype, void *grad_flat,
                               uint64_t flat_numel);
/* Apply every unit's casts from the plan (cast_forward_inputs -> input cast to the unit's
 * param_dtype at its root module; output_dtype -> output cast), clearing all others. Units rooted
 * at a module the model does not have are an error (PCS_ERR_INVALID_ARG). */
pcs_status_t pcs_mlp_apply_plan_casts(pcs_mlp_t *m, const struct Pcs__V1__Plan *plan);

/* The dtype a training program feeds model inputs in under `plan`: the data's own dtype, except
 * for a pure low-precision model (root unit with a bf16/fp16 master dtype that does not cast its
 * inputs), which is fed in its dtype as a user's `x.half()` would (T-PF16). The reference and the
 * sharded training loop both use this rule; round the inputs with pcs_round_to() before forward. */
pcs_dtype_t pcs_mlp_feed_dtype(const struct Pcs__V1__Plan *plan, pcs_dtype_t data_dtype);

/* FSDP casting at a module boundary (spec §1.3): before module `mod` runs, cast its floating input
 * to `input_dtype` (NONE = no cast); after it runs, cast its output to `output_dtype` (NONE = no
 * cast). Both are differentiable (gradients are cast back). Use on unit root modules. */
pcs_status_t pcs_mlp_set_cast(pcs_mlp_t *m, uint32_t mod, pcs_dtype_t input_dtype,
                              pcs_dtype_t output_dtype);

/* Forward `rows` rows of x (row-major [rows, input_dim]; values must be representable in x_dtype,
 * i.e. already rounded: fp32 arrays carrying bf16/fp16 values). training=1 records what backward
 * needs and uses/updates BatchNorm batch statistics; training=0 uses running statistics.
 * *out (valid until the next forward) receives [rows, output_dim] values of dtype *out_dtype.
 * Errors: unbound parameter -> PCS_ERR_STATE; dtype mismatch at a Linear ("mat1 and mat2 must have
 * the same dtype") or BatchNorm training with 1 row -> PCS_ERR_INVALID_ARG, naming the module. */
pcs_status_t pcs_mlp_forward(pcs_mlp_t *m, const float *x, pcs_dtype_t x_dtype, uint32_t rows,
                             int training, const pcs_mlp_hooks_t *hooks, const float **out,
                             pcs_dtype_t *out_dtype);

/* Forward of layers [first, end) only — a pipeline stage: layer i < n_hidden is block
 * "layers.{i}", layer n_hidden is the head. x holds the stage input ([rows, width of layer first's
 * input]); the root module's hooks and input cast apply only when first == 0, its output cast and
 * post-forward hook only when end == n_hidden + 1. pcs_mlp_forward(...) = range [0, n_hidden+1).
 * Errors as pcs_mlp_forward, plus an empty or out-of-range layer range (PCS_ERR_INVALID_ARG). */
pcs_status_t pcs_mlp_forward_range(pcs_mlp_t *m, uint32_t first, uint32_t end, const float *x,
                                   pcs_dtype_t x_dtype, uint32_t rows, int training,
                                   const pcs_mlp_hooks_t *hooks, const float **out,
                                   pcs_dtype_t *out_dtype);

/* Backward of the last training forward. grad_out: fp32 [rows, output_dim] gradient of the loss
 * w.r.t. the output (rounded to the output dtype first, as autograd's cast-back does). Writes
 * every bound gradient. PCS_ERR_STATE without a preceding training forward. */
pcs_status_t pcs_mlp_backward(pcs_mlp_t *m, const float *grad_out, const pcs_mlp_hooks_t *hooks);
/* Same, and if grad_in is not NULL it receives the gradient w.r.t. the forward's input x (fp32
 * values in x's dtype, [rows, input width]): what a pipeline stage sends to the previous one. */
pcs_status_t pcs_mlp_backward_input(pcs_mlp_t *m, const float *grad_out,
                                    const pcs_mlp_hooks_t *hooks, float *grad_in);

/* The zero-bubble split of pcs_mlp_backward_input (pipeline schedules' I and W actions, ZB-H1):
 * backward_input_only computes every activation gradient and grad_in (as backward_input) but
 * writes no parameter gradient; backward_weights then writes every bound parameter gradient of
 * that backward (Linear weight and bias, norm affine) from the activations and activation
 * gradients the model kept: the same kernels on the same operands, so the pair writes exactly
 * what backward_input writes. Parameters may be rebound in between (the gradient destinations
 * are read by backward_weights); no other forward or backward may run on the model in between
 * (PCS_ERR_STATE), and the stage input x must stay valid until backward_weights (the first
 * Linear's weight gradient reads it). No hooks. */
pcs_status_t pcs_mlp_backward_input_only(pcs_mlp_t *m, const float *grad_out, float *grad_in);
pcs_status_t pcs_mlp_backward_weights(pcs_mlp_t *m);

/* Threads OpenBLAS may use for the GEMMs (process-wide). Workers that share a host with other
 * ranks should use 1 (the default OpenBLAS pool oversubscribes the cores); 0 = leave as is.
 * Returns the count in effect. */
int pcs_mlp_blas_threads(int n);

// ---- numeric helpers shared with loss/reference ----

/* Round fp32 values to dtype in place (round to nearest even; FP32/FP64: unchanged). */
void pcs_round_to(float *v, size_t n, pcs_dtype_t dtype);
/* Convert n values of src_dtype (FP32/BF16/FP16) to fp32. */
void pcs_to_f32(const void *src, pcs_dtype_t src_dtype, size_t n, float *dst);
/* Store n fp32 values as dst_dtype (FP32/BF16/FP16/FP64), rounding to nearest even. */
void pcs_from_f32(const float *src, size_t n, pcs_dtype_t dst_dtype, void *dst);

#ifdef __cplusplus
}
#endif
#endif
