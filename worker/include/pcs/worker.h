/* pcs worker C API: for training programs that do their own compute while pcs owns parameters,
 * gradients and communication. A program joins a job through the coordinator (it registers like
 * pcs-worker and receives its rank and the plan), then per step: unshard a unit (all-gather its
 * parameters in the plan's dtype), run its own forward/backward on the flat buffer, write the
 * gradients into the unit's gradient buffer, hand them in (reduce-scatter or accumulate), reshard,
 * and finally step (grad scaler verdict, clipping, optimizer on the fp32 shards; a step report goes
 * to the coordinator). Plain C; no gRPC or protobuf types. One thread drives a pcs_worker_t;
 * pcs_worker_abort() may be called from any thread. Errors are pcs_status_t with the reason in
 * pcs_last_error(). Example: examples/c_api_example.c. */
#ifndef PCS_WORKER_H
#define PCS_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_worker pcs_worker_t;

/* Initial values of parameter `fqn`: elements [first, first + n) of its flattened tensor. */
typedef pcs_status_t (*pcs_worker_init_fn)(void *ctx, const char *fqn, uint64_t first, uint64_t n,
                                           float *out);
/* The same as doubles, for units with fp64 masters (a model built in float64). */
typedef pcs_status_t (*pcs_worker_init64_fn)(void *ctx, const char *fqn, uint64_t first,
                                             uint64_t n, double *out);

typedef struct pcs_worker_options {
    const char *coordinator;  /* "127.0.0.1:7070" (required) */
    const char *identity;     /* NULL = "<host>:<pid>" */
    const char *hostname;     /* transport address, NULL = 127.0.0.1 */
    uint32_t join_timeout_ms; /* wait for an assignment; 0 = wait forever */
    uint32_t coll_timeout_ms; /* 0 = 30000 */
    /* NULL = U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from (init seed, FQN) for tensors of 2+ dims and
     * vectors sharing a module with one (Linear), ones for other "weight" vectors, zeros
     * otherwise (LayerNorm-style). */
    pcs_worker_init_fn init;
    void *init_ctx;
    /* Where this program can compute: NULL/"cpu", or "cuda" (it is then offered `backend: cuda`
     * jobs, and for those the buffers below are device memory on `device`). The job's
     * spec.backend decides; a cuda job needs "cuda" here. */
    const char *backend;
    int device; /* cuda device ordinal; -1 = $LOCAL_RANK modulo the visible devices */
} pcs_worker_options_t;

/* Register with the coordinator, wait for an assignment, build the communicators and the fp32
 * master shards. Errors: PCS_ERR_TIMEOUT (no job within join_timeout_ms), PCS_ERR_REMOTE
 * (coordinator unreachable), PCS_ERR_INVALID_ARG (a plan this runtime cannot run).
 * Caller ends with pcs_worker_finish() and pcs_worker_destroy(). */
pcs_status_t pcs_worker_join(const pcs_worker_options_t *opt, pcs_worker_t **out);
/* pcs_worker_join as `program` (RegisterRequest.program): a job whose spec.program names it is
 * given only to such workers, and a worker that names a program takes no job that names none.
 * NULL or "" = pcs_worker_join (not said: jobs that name no program). [A-Za-z0-9._-], at most 64
 * characters; the Python package joins as "pcs.torch". (Version node PCS_WORKER_0.2.) */
pcs_status_t pcs_worker_join_as(const pcs_worker_options_t *opt, const char *program,
                                pcs_worker_t **out);
/* pcs_worker_join_as, with the initial values of units with fp64 masters from init_f64 (called
 * with opt->init_ctx): NULL = from opt->init's floats (or the default), widened exactly. The
 * options struct is unchanged. (Version node PCS_WORKER_0.4.) */
pcs_status_t pcs_worker_join_as_f64(const pcs_worker_options_t *opt, const char *program,
                                    pcs_worker_init64_fn init_f64, pcs_worker_t **out);

uint32_t pcs_worker_rank(const pcs_worker_t *w);
uint32_t pcs_worker_world_size(const pcs_worker_t *w);
/* Data-parallel position of this rank (for picking its rows of a global batch). */
uint32_t pcs_worker_dp_rank(const pcs_worker_t *w);
uint32_t pcs_worker_dp_size(const pcs_worker_t *w);
/* The job's training.steps, micro_batches and micro_batch_size. */
uint64_t pcs_worker_total_steps(const pcs_worker_t *w);
uint32_t pcs_worker_micro_batches(const pcs_worker_t *w);
uint32_t pcs_worker_micro_batch_size(const pcs_worker_t *w);
/* 1 if the job allows an eval-mode backward reduced in full precision (training.eval_backward
 * with full_precision_eval: pcs_worker_grad_buffer_full), else 0. (Version node
 * PCS_WORKER_0.3.) */
int pcs_worker_eval_backward(const pcs_worker_t *w);
/* The job id (valid until destroy). */
const char *pcs_worker_job_id(const pcs_worker_t *w);

typedef struct pcs_worker_unit_info {
    const char *path; /* module that roots the unit ("" = root) */
    size_t n_params;
    uint64_t padded_numel;   /* length of the flat (unsharded) buffer */
    pcs_dtype_t param_dtype; /* dtype of the unsharded parameters and of the gradient buffer */
    int is_root;
} pcs_worker_unit_info_t;

typedef struct pcs_worker_param_info {
    const char *fqn;
    uint32_t unit;
    uint64_t offset; /* element offset in the unit's flat buffer */
    uint64_t numel;
    uint32_t ndim;
    uint64_t shape[8];
} pcs_worker_param_info_t;

/* What the plan says a program computing `unit` must do around the collectives, the parts of
 * FSDP's mixed-precision policy that live in the forward (pcs casts the parameters and the
 * gradients itself): cast floating forward inputs to input_dtype, cast floating
 * outputs to output_dtype, keep the unit's module buffers in buffer_dtype, and whether the unit
 * is resharded after its forward (then unshard it again for its backward). */
typedef struct pcs_worker_unit_policy {
    int mixed_precision;         /* 0: an ignored class / full_precision override */
    int cast_forward_inputs;     /* the plan's flag (see input_dtype) */
    int reshard_after_forward;   /* FULL_SHARD / FSDP2 default for non-root units */
    int keep_low_precision_grads;
    pcs_dtype_t input_dtype;     /* cast floating inputs of the unit's forward to this (its
                                  * param_dtype where cast_forward_inputs and the plan sets
                                  * one); PCS_DTYPE_NONE: no cast */
    pcs_dtype_t reduce_dtype;    /* the dtype the gradients are reduced in */
    pcs_dtype_t master_dtype;    /* the sharded parameters' dtype (fp32; bf16/fp16: pure) */
    pcs_dtype_t buffer_dtype;    /* PCS_DTYPE_NONE: keep each buffer's own dtype */
    pcs_dtype_t output_dtype;    /* PCS_DTYPE_NONE: no cast */
    size_t n_modules;            /* modules whose parameters the unit owns */
    const char *const *modules;  /* their FQNs (valid until destroy) */
    int unmanaged;               /* spec.ignored_modules: no cast of any kind (pcs does not
                                  * reduce its gradients either) */
    int full_precision_eval;     /* eval forwards gather the masters (pcs_worker_unshard_full)
                                  * and run without casts, buffers in their own dtype */
    int keep_gathered_in_accumulation; /* training.accumulation: stays gathered from its first
                                        * gather of a step until the synced micro-batch (no
                                        * reshard after a no-sync forward or backward) */
} pcs_worker_unit_policy_t;

size_t pcs_worker_num_units(const pcs_worker_t *w);
pcs_status_t pcs_worker_unit(const pcs_worker_t *w, uint32_t unit, pcs_worker_unit_info_t *out);
pcs_status_t pcs_worker_unit_policy(const pcs_worker_t *w, uint32_t unit,
                                    pcs_worker_unit_policy_t *out);
/* The k-th parameter of `unit`, or a parameter by FQN (PCS_ERR_NOT_FOUND if absent). */
pcs_status_t pcs_worker_param(const pcs_worker_t *w, uint32_t unit, size_t k,
                              pcs_worker_param_info_t *out);
pcs_status_t pcs_worker_find_param(const pcs_worker_t *w, const char *fqn,
                                   pcs_worker_param_info_t *out);

/* Buffers handed out below (unshard's *params, grad_buffer's *grads) are memory of the job's
 * kernels backend: host memory on the cpu backend (today's C API jobs), device memory (CUDA
 * pointers) with a cuda backend, which the program must not dereference on the host; the
 * ordering against the program's own stream is the runtime's (worker/runtime.h). */

/* The CUDA stream (a cudaStream_t) pcs orders its work on for a cuda job; NULL on the cpu
 * backend. unshard returns when the buffer is ready for work the program enqueues on this stream
 * afterwards; hand_in_grads may be called right after the program enqueued the backward writing
 * the gradient buffer on it (pcs orders its reads after that work). A program computing on other
 * streams orders them against this one with events. */
void *pcs_worker_stream(const pcs_worker_t *w);

/* Start a step (zeroes the sharded gradients). */
pcs_status_t pcs_worker_begin_step(pcs_worker_t *w);
/* All-gather `unit`; *params is its flat buffer (padded_numel elements of *dtype), valid until
 * the unit is resharded (the buffer is the runtime's only while the unit is live: its address may
 * change from one unshard to the next). Prefetch queues the all-gather without waiting. */
pcs_status_t pcs_worker_unshard(pcs_worker_t *w, uint32_t unit, const void **params,
                                pcs_dtype_t *dtype);
pcs_status_t pcs_worker_prefetch(pcs_worker_t *w, uint32_t unit);
/* Full-precision eval (training.full_precision_eval, FSDP_USE_FULL_PREC_IN_EVAL): all-gather
 * `unit`'s fp32 masters instead (padded_numel fp32 elements, valid until the reshard), for a
 * forward with mixed precision off. A unit computing in its master dtype (fp32, or a pure
 * low-precision job) has nothing else to give: PCS_ERR_INVALID_ARG, use pcs_worker_unshard.
 * (Version node PCS_WORKER_0.2.) */
pcs_status_t pcs_worker_unshard_full(pcs_worker_t *w, uint32_t unit, const float **params);
/* The same in the masters' own storage: *params is padded_numel elements of *dtype — fp32, fp64
 * for a unit with fp64 masters, or the master dtype of a unit with no trainable parameter
 * (pcs_worker_unshard_full refuses both) — and for a unit
 * computing in its master dtype, pcs_worker_unshard's buffer. Valid until the reshard. (Version
 * node PCS_WORKER_0.4.) */
pcs_status_t pcs_worker_unshard_master(pcs_worker_t *w, uint32_t unit, const void **params,
                                       pcs_dtype_t *dtype);
pcs_status_t pcs_worker_reshard(pcs_worker_t *w, uint32_t unit);
/* The buffer the program writes `unit`'s gradients into (padded_numel elements of *dtype, laid
 * out like the parameters; padding must stay zero; the ranges of frozen parameters are ignored:
 * they take no part in the norm, the inf check or the update). The gradient of the step's mean loss:
 * scale each micro-batch's gradient by 1/micro_batches (and by the loss scale with fp16).
 * Zeroed, and valid until the hand-in, which gives it back to the runtime: ask for it again for
 * each micro-batch (a hand-in without asking hands in a zero gradient). */
pcs_status_t pcs_worker_grad_buffer(pcs_worker_t *w, uint32_t unit, void **grads,
                                    pcs_dtype_t *dtype);
/* An eval-mode backward (training.full_precision_eval with training.eval_backward;
 * FSDP_USE_FULL_PREC_IN_EVAL): the fp32 buffer (padded_numel floats, laid out like the
 * parameters) for the gradients of a backward through pcs_worker_unshard_full's fp32 parameters
 * (or pcs_worker_unshard's, for a unit computing in fp32). Its hand-in (sync = 1 only) reduces it
 * in full precision, as FSDP1 does in eval, and adds it to the sharded gradient (the next
 * begin_step zeroes it). PCS_ERR_STATE if the job did not ask for training.eval_backward, a
 * buffer is out or a no-sync accumulation is pending; PCS_ERR_INVALID_ARG for a unit whose master
 * is not fp32 (nothing fuller than its own gradients: use pcs_worker_grad_buffer). (Version node
 * PCS_WORKER_0.3.) */
pcs_status_t pcs_worker_grad_buffer_full(pcs_worker_t *w, uint32_t unit, float **grads);
/* Hand in the gradient buffer: sync = 0 accumulates (micro-batch without sync), sync = 1 reduces
 * across ranks and adds the result to the sharded gradient: on the last micro-batch (FSDP1
 * no_sync), or on every micro-batch (FSDP2's default; training.gradient_sync every_micro_batch).
 * With training.hsdp_all_reduce last_micro_batch, a unit's micro_batches-th reduction of the step
 * is the one that all-reduces across replicas. */
pcs_status_t pcs_worker_hand_in_grads(pcs_worker_t *w, uint32_t unit, int sync);

typedef struct pcs_worker_step_result {
    uint64_t step; /* 1-based step just finished */
    double loss;   /* mean over data-parallel ranks of the loss handed in */
    double grad_norm;
    int skipped;       /* grad scaler found Inf/NaN on some rank */
    double loss_scale; /* the scale to multiply the next step's loss gradient by */
    int done;          /* this was the job's last step */
} pcs_worker_step_result_t;

/* Optimizer step on the shards (the job's optimizer, clipping and grad scaler), then a step
 * report to the coordinator. `loss` is this rank's mean loss of the step. */
pcs_status_t pcs_worker_step(pcs_worker_t *w, double loss, pcs_worker_step_result_t *res);
/* Current loss scale (1 without the grad scaler). */
double pcs_worker_loss_scale(const pcs_worker_t *w);

/* The runtime's backend memory (device memory on cuda: shards, optimizer state, staging,
 * accumulators and the pooled unsharded parameters, gradients and reduction inputs while units
 * hold them) against the plan's per-rank estimate, the promise `pcsctl plan` prints (total less
 * buffers: the model's activations and buffers are the program's). (Version node
 * PCS_WORKER_0.5.) */
typedef struct pcs_worker_memory {
    uint64_t step_peak_bytes; /* most in use at once during the last (or current) step */
    uint64_t peak_bytes;      /* most in use at once since the join */
    uint64_t reserved_bytes;  /* held from the backend now (pool blocks kept for reuse) */
    uint64_t promised_bytes;  /* RankEstimate.total_bytes - buffer_bytes of this rank */
} pcs_worker_memory_t;
pcs_status_t pcs_worker_memory(pcs_worker_t *w, pcs_worker_memory_t *out);

/* Leave the job: error == NULL reports success (the last step must have been reported), else
 * the job fails with this message. Deregisters. */
pcs_status_t pcs_worker_finish(pcs_worker_t *w, const char *error);
/* Wake blocked collectives with PCS_ERR_CANCELLED. Any thread. */
void pcs_worker_abort(pcs_worker_t *w, const char *reason);
void pcs_worker_destroy(pcs_worker_t *w);

#ifdef __cplusplus
}
#endif
#endif
