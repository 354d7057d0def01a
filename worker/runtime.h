/* Unit runtime of one rank: fp32 master shards (initialized per parameter, so any world size starts
 * from the same full model), unshard (cast + all-gather into the unsharded buffer, on a prefetch
 * thread with its own communicator), reshard, gradient reduction exactly as the plan says (cast to
 * the reduce dtype, pre/post divide or avg, reduce-scatter, all-reduce across replicas for HSDP or
 * all-reduce for NO_SHARD, cast back, accumulate into the sharded grad), no-sync accumulation in
 * the plan's accumulation dtype, and the optimizer step (grad scaler verdict over the world,
 * clipping with one all-reduce, AdamW/SGD on fp32 shards). Every collective is recorded and
 * audited against the dtype the plan gives it. Every buffer lives in the backend's memory
 * (cfg->be: host memory on cpu, device memory on cuda); collectives run on those buffers (NCCL)
 * or on pinned host staging buffers (Gloo with a device backend, or stage_host).
 *
 * Device memory and streams: the caller (the model) enqueues its forward/backward work on
 * cfg->stream (the compute stream; NULL = the backend's default stream). The runtime owns two
 * more streams, one per thread: the all-gather stream (prefetch thread) and the reduction stream
 * (reduction thread); inline work (prefetch 0) uses the same two streams from the caller's
 * thread. Ordering between them is by events, never by a full device sync, except where a
 * host-staged collective needs its input on the host. The contract for the caller:
 *  - unshard() returns when the unsharded buffer is ready for work the caller enqueues on
 *    cfg->stream afterwards: cfg->stream waits on an event recorded after the all-gather (with
 *    host staging the gather has completed before unshard returns).
 *  - grad_buffer() enqueues the zeroing on cfg->stream, before any backward the caller enqueues
 *    there afterwards.
 *  - post_backward() may be called as soon as the backward work of the unit is enqueued on
 *    cfg->stream (not complete): the copy-in (cast to the reduce dtype, or the no-sync
 *    accumulation) is enqueued on cfg->stream after it, and the reduction stream waits on an
 *    event recorded there before the collective reads the copy.
 *  - reshard() / reshard_partial() record an event on cfg->stream: the next all-gather into the
 *    buffer waits on it, so work already enqueued that reads the buffer is not overwritten.
 *  - optimizer_step() waits (host) for queued reductions, orders cfg->stream after the reduction
 *    and all-gather streams, runs on cfg->stream, and reads back the few scalars it needs on the
 *    host (found_inf, the squared norms) with a D2H copy and a sync of cfg->stream. The next
 *    all-gather of a shard waits for the update on an event.
 *  - pointers the runtime hands out (unshard, param_buffer, grad_buffer, shard) are backend
 *    pointers: device memory with a device backend; never dereference them on the host there
 *    (pcs_runtime_shard_to_host copies a shard out).
 * On the cpu backend streams and events are ordering tokens and every op completes before it
 * returns, so the same code runs there (that is what the CPU tests exercise). */
#ifndef PCS_WORKER_RUNTIME_H
#define PCS_WORKER_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "coll/kv.h"
#include "pcs/dtype.h"
#include "pcs/kernels.h"
#include "pcs/status.h"
#include "pcs/v1/plan.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_runtime pcs_runtime_t;

typedef enum { PCS_OPT_ADAMW = 0, PCS_OPT_SGD = 1 } pcs_opt_kind_t;

/* Fill elements [first, first + n) of parameter `p` (its flat, row-major order) as fp32. */
typedef pcs_status_t (*pcs_rt_init_fn)(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first,
                                       uint64_t n, float *out);
/* The same in double, for fp64 master shards (optional). */
typedef pcs_status_t (*pcs_rt_init64_fn)(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first,
                                         uint64_t n, double *out);

typedef struct pcs_runtime_config {
    const Pcs__V1__Plan *plan; /* retained */
    uint32_t rank;
    const char *job_tag; /* distinguishes communicators of several runtimes in one KV scope */
    pcs_kv_t *kv;        /* retained until destroy; NULL only when world_size == 1 */
    const char *hostname;
    int coll_timeout_ms;
    const pcs_backend_ops_t *be; /* "cpu" backend */
    uint32_t micro_batches;      /* no-sync accumulation when > 1 */
    /* the caller clips gradients (optimizer_step's clip_norm > 0): each unit's step-last
     * reduction computes its sum of squares while accumulating into the sharded gradient
     * (pcs_kernel_accumulate_sumsq, where the backend has it), and the optimizer step reads that
     * instead of a pass over the shard. The same bits either way; a hint, not a contract. */
    int fuse_grad_norm;
    pcs_rt_init_fn init_param;
    /* NULL: fp64 masters start from init_param's floats, widened (exact); set: from these
     * doubles (a model built in float64). Same ctx. */
    pcs_rt_init64_fn init_param64;
    void *init_ctx;
    pcs_opt_kind_t opt;
    pcs_adamw_config_t adamw;
    pcs_sgd_config_t sgd;
    int prefetch; /* units all-gathered ahead; 0 = issue all-gathers inline */
    /* Device memory and streams (all zero = today's host behaviour: default stream, device 0,
     * Gloo on the backend's buffers). */
    pcs_stream_t stream;     /* compute stream the model enqueues on (NULL = default); borrowed */
    int device;              /* device ordinal: create and every runtime thread call
                              * be->set_device(device) first (create changes the calling thread's
                              * current device; call the other functions from threads on it) */
    pcs_coll_backend_t coll; /* 0 or PCS_COLL_GLOO (host buffers), PCS_COLL_NCCL (device buffers,
                              * a non-cpu backend; groups of one rank get no communicator) */
    int stage_host;          /* 1: collectives run on pinned host staging buffers (be->host_alloc)
                              * with a D2H copy before and an H2D copy after. Forced on for Gloo
                              * with a non-cpu backend; settable on cpu so CPU tests run the
                              * staging code; INVALID_ARG with NCCL. */
} pcs_runtime_config_t;

/* One collective as issued, for reports and audits. */
typedef struct pcs_rt_coll_rec {
    int kind;      /* PCS__V1__COLL_KIND__* */
    uint32_t unit; /* UINT32_MAX for step-level collectives (found_inf, grad norm) */
    pcs_dtype_t dtype;
    uint64_t count; /* elements per rank (input of AG, output of RS, buffer of AR) */
    uint64_t bytes; /* bytes moved per rank as nccl-tests counts S (count * size * dtype) */
    int audit_ok;   /* dtype equals the plan's for this collective */
} pcs_rt_coll_rec_t;

typedef struct pcs_rt_stats {
    double all_gather_ms, reduce_scatter_ms, all_reduce_ms, cast_ms, optimizer_ms;
    double unshard_wait_ms;        /* time the compute thread waited for an all-gather */
    double compute_thread_comm_ms; /* forward/backward time the compute thread spent blocked on
                                    * communication (all-gather waits, inline reductions) */
    double reduce_drain_ms;        /* optimizer step waiting for queued reductions */
    uint64_t all_gather_bytes, reduce_scatter_bytes, all_reduce_bytes;
    size_t n_colls;
    const pcs_rt_coll_rec_t *colls; /* this step's collectives in issue order */
    uint64_t fingerprint;           /* FNV-1a over (kind, unit, dtype, count) of colls */
    int audit_ok;
    uint32_t max_unsharded; /* most units unsharded at once during the step */
    /* The runtime's backend memory (device memory on cuda): shards, optimizer state, staging,
     * accumulators, and the pooled full-size buffers (unsharded parameters, gradients, reduction
     * inputs) while units hold them. What the plan's estimate promises (pcs_plan_rank_estimate:
     * params + grads + optimizer + peak unsharded + staging); the model's activations and buffers
     * are the model's. */
    uint64_t mem_step_peak_bytes; /* most in use at once during the step */
    uint64_t mem_peak_bytes;      /* most in use at once since create */
    uint64_t mem_reserved_bytes;  /* held from the backend now (pool blocks kept for reuse) */
} pcs_rt_stats_t;

pcs_status_t pcs_runtime_create(const pcs_runtime_config_t *cfg, pcs_runtime_t **out);
void pcs_runtime_destroy(pcs_runtime_t *rt);
/* Wake blocked collectives (any thread). */
void pcs_runtime_abort(pcs_runtime_t *rt, const char *reason);
/* After a failed step: the global rank a communicator blames the failure on (pcs_coll_blame
 * mapped through the plan's groups), -1 when none does. Call once the step has returned. */
int pcs_runtime_blame(const pcs_runtime_t *rt, pcs_coll_fault_t *fault);

size_t pcs_runtime_n_units(const pcs_runtime_t *rt);
/* Whether this rank holds `unit`: always with pp = 1; with pipeline stages only the units of
 * its stages (stage s on pp rank s mod pp). The other units have no memory here and every call
 * naming one fails with INVALID_ARG; the step and the optimizer skip them. */
int pcs_runtime_holds(const pcs_runtime_t *rt, uint32_t unit);
/* Sum of a scalar over the pipeline stages (the ranks with this rank's dp coordinates; one fp32
 * all-reduce, identity with pp = 1): the loss only the last stage computes. */
pcs_status_t pcs_runtime_sum_over_pp(pcs_runtime_t *rt, double *v);

/* Start of a step: zero sharded grads and stats. */
pcs_status_t pcs_runtime_begin_step(pcs_runtime_t *rt);
/* Queue the all-gather of `unit` (no-op if unsharded or queued). */
pcs_status_t pcs_runtime_prefetch(pcs_runtime_t *rt, uint32_t unit);
/* Make `unit` unsharded (waiting for a queued prefetch). full_precision: gather the master dtype
 * instead of the param dtype (FSDP1 full-precision eval). *params = the padded flat buffer, valid
 * until the unit is resharded: the buffer comes from the runtime's pool while the unit is live
 * (its address may differ from one unshard to the next; bind views after each unshard). */
pcs_status_t pcs_runtime_unshard(pcs_runtime_t *rt, uint32_t unit, int full_precision,
                                 const void **params, pcs_dtype_t *dtype);
pcs_status_t pcs_runtime_reshard(pcs_runtime_t *rt, uint32_t unit);
/* FSDP2 reshard_after_forward=int: keep only this rank's 1/n slice of the unsharded buffer; the
 * next unshard all-gathers over the n-rank reshard group instead of the shard group. Same as
 * reshard() for units without a reshard group. */
pcs_status_t pcs_runtime_reshard_partial(pcs_runtime_t *rt, uint32_t unit);
int pcs_runtime_is_unsharded(const pcs_runtime_t *rt, uint32_t unit);
/* The padded flat gradient buffer backward writes into (compute dtype), zeroed; valid until the
 * hand-in (post_backward), which gives it back. */
pcs_status_t pcs_runtime_grad_buffer(pcs_runtime_t *rt, uint32_t unit, void **grads,
                                     pcs_dtype_t *dtype);

/* pcs-worker's model (a backward that writes every trainable parameter's gradient, or adds it:
 * pcs_mlp_bind_grad_mode): where this micro-batch's backward puts the unit's gradients, for a
 * hand-in with the same `sync`. Accumulating — a no-sync micro-batch, or the synced one after
 * them — it is the no-sync accumulator itself (*dtype = the plan's accum dtype): *accumulate 0 on
 * the first micro-batch (write), 1 after it (add, rounded once to *dtype), so there is no
 * gradient block and no accumulation pass at the hand-in, with the bits of grad_buffer + hand-in.
 * Otherwise a gradient block as grad_buffer's (*accumulate 0). Either way only what no trainable
 * parameter covers (padding, frozen parameters) is zeroed: every trainable parameter's gradient
 * must be written. PCS_ERR_STATE while a buffer is out. */
pcs_status_t pcs_runtime_grad_target(pcs_runtime_t *rt, uint32_t unit, int sync, void **grads,
                                     pcs_dtype_t *dtype, int *accumulate);

/* training.eval_backward (with full_precision_eval): an fp32 gradient buffer (padded elements) for
 * an eval-mode backward through the fp32 parameters pcs_runtime_unshard(full_precision) gave;
 * pcs_runtime_post_backward(sync = 1) then reduces it in fp32 with the plan's eval collectives
 * (FSDP1 reduces in full precision in eval) and adds it to the sharded gradient. PCS_ERR_STATE
 * without training.eval_backward in the plan, with a buffer already out or a no-sync
 * accumulation pending; PCS_ERR_INVALID_ARG for a low-precision master. */
pcs_status_t pcs_runtime_grad_buffer_full(pcs_runtime_t *rt, uint32_t unit, float **grads);
/* After backward of `unit` for one micro-batch: sync=0 accumulates into the unsharded accumulator
 * (no communication), sync=1 reduces into the sharded grad. */
pcs_status_t pcs_runtime_post_backward(pcs_runtime_t *rt, uint32_t unit, int sync);

typedef struct pcs_rt_step_opts {
    double clip_norm;  /* 0 = off */
    int scaler;        /* fp16 grad scaler enabled */
    double loss_scale; /* current scale (grads are multiplied by it) */
    int inject_inf;    /* test hook: +Inf into this rank's first grad element */
} pcs_rt_step_opts_t;

typedef struct pcs_rt_step_result {
    double grad_norm; /* total norm before clipping (0 when clipping is off and no scaler) */
    int found_inf;    /* global verdict */
    int skipped;
} pcs_rt_step_result_t;

/* Unscale + global inf check (one all-reduce over the world), clipping (one all-reduce over the
 * shard group, and one over the pp group with pipeline stages: the norm covers every stage),
 * optimizer update on the held shards unless skipped. */
pcs_status_t pcs_runtime_optimizer_step(pcs_runtime_t *rt, const pcs_rt_step_opts_t *o,
                                        pcs_rt_step_result_t *r);
/* Barrier over the world (checkpoints). */
pcs_status_t pcs_runtime_barrier(pcs_runtime_t *rt);
/* Mean of a scalar over the data-parallel group (one fp32 all-reduce, not recorded as a gradient
 * collective): the loss over ranks for reports and eval. */
pcs_status_t pcs_runtime_mean_over_dp(pcs_runtime_t *rt, double *v);

void pcs_runtime_stats(const pcs_runtime_t *rt, pcs_rt_stats_t *s);

/* Shard access for checkpoints and the C API. The pointers are backend pointers (device memory
 * with a device backend), valid until destroy; their contents are current once the work queued
 * on cfg->stream is done (sync it, or use pcs_runtime_shard_to_host). */
typedef struct pcs_rt_shard {
    uint32_t unit;
    pcs_dtype_t master_dtype;  /* the plan's master dtype */
    pcs_dtype_t storage_dtype; /* dtype of `master` and the optimizer states in memory: fp64 for
                                * fp64 masters, else fp32 (holding master_dtype values), but the
                                * master dtype itself for a unit with no trainable parameter */
    pcs_dtype_t host_dtype;    /* what shard_to_host / shard_from_host exchange: fp64 for fp64
                                * storage, else fp32 */
    uint64_t numel;            /* c (padded shard) */
    void *master;              /* c elements of storage_dtype */
    /* Which optimizer states the shard has (the optimizer's, whatever is frozen), PCS_RT_STATE_*
     * bits: what shard_to_host / shard_from_host exchange as c-element arrays. */
    unsigned states;
    /* The states themselves, compact: state_numel elements, the shard's ranges outside frozen
     * parameters back to back (no state for a frozen parameter, as in PyTorch); NULL when the
     * optimizer has no such state or state_numel is 0. */
    uint64_t state_numel;
    void *exp_avg, *exp_avg_sq, *momentum; /* storage_dtype */
    uint32_t shard_index, shard_group_size;
    uint32_t replicate_index;
} pcs_rt_shard_t;
enum { PCS_RT_STATE_EXP_AVG = 1, PCS_RT_STATE_EXP_AVG_SQ = 2, PCS_RT_STATE_MOMENTUM = 4 };
pcs_status_t pcs_runtime_shard(pcs_runtime_t *rt, uint32_t unit, pcs_rt_shard_t *out);
/* Copy unit's shard into caller host buffers of pcs_rt_shard_t.numel elements each, synchronously
 * (ordered after all work queued on cfg->stream): master in the host dtype, and the
 * optimizer state (state_a = exp_avg or momentum, state_b = exp_avg_sq) expanded to the shard's
 * layout, 0 where a frozen parameter lies. NULL members are skipped, as is a state the optimizer
 * does not have. INVALID_ARG for a bad unit; CUDA errors. */
pcs_status_t pcs_runtime_shard_to_host(pcs_runtime_t *rt, uint32_t unit, void *master,
                                       void *state_a, void *state_b);
/* The reverse (a resume): host values of the host dtype into unit's shard — master (master
 * values held in it) and the optimizer state the optimizer has (c-element arrays; what lies at
 * frozen parameters is dropped); NULL members are left as they are. Sync. */
pcs_status_t pcs_runtime_shard_from_host(pcs_runtime_t *rt, uint32_t unit, const void *master,
                                         const void *state_a, const void *state_b);
/* Optimizer steps taken (AdamW's bias correction, SGD's first-step momentum); set on a resume. */
uint64_t pcs_runtime_opt_steps(const pcs_runtime_t *rt);
/* How many unit-steps took clipping's sum of squares from their reduction (fuse_grad_norm). */
uint64_t pcs_runtime_fused_norms(const pcs_runtime_t *rt);
void pcs_runtime_set_opt_steps(pcs_runtime_t *rt, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
