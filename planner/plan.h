/* The planner: a JobSpec and a world size in, the Plan (pcs.v1.Plan) out — units from the wrap
 * policy, flat layouts and shard ranges, the dtype and reduction of every collective, mesh groups,
 * pipeline stages and per-rank estimates. Pure C over protobuf-c structs: no RPC, no globals, so
 * the coordinator, pcsctl (offline `plan`) and the workers all get the same answer.
 * Rules and pcs's choices where PyTorch versions differ: docs/PLAN.md "Plan". */
#ifndef PCS_PLANNER_PLAN_H
#define PCS_PLANNER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"
#include "planner/mesh.h" /* rank <-> coordinates <-> groups of a plan */

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_PLAN_VERSION 1

/* The rule pcs applies when reduce_dtype is unset (also written into every plan). */
#define PCS_PLAN_REDUCE_DTYPE_RULE                                                                 \
    "reduce_dtype unset: reduce in param_dtype when param_dtype is set (FSDP1; FSDP2 <= 2.14), "   \
    "else in the master dtype; FSDP2 clamp: reduce_dtype == param_dtype keeps param_dtype, "       \
    "param_dtype == master dtype means no cast (PyTorch 2.15 FSDP2 reduces in the master dtype "   \
    "when reduce_dtype is unset: set reduce_dtype for that)"

/* Plan `spec` for `world_size` ranks (0 = the product of spec->mesh). When the mesh product
 * differs from world_size, dp_shard absorbs the difference (elastic re-plans, `pcsctl plan
 * --world N`); world_size must then be a multiple of pp x dp_replicate.
 * Errors: PCS_ERR_INVALID_ARG with every problem as "field.path: reason", joined by "; ", in
 * pcs_last_error(); PCS_ERR_NOMEM. On success the caller frees *out with pcs_plan_free().
 * Thread-safe; O(#modules + #tensors + pp x virtual_stages), independent of the world size. */
pcs_status_t pcs_plan_build(const Pcs__V1__JobSpec *spec, uint32_t world_size, Pcs__V1__Plan **out);

/* Free a plan from pcs_plan_build (it is laid out like an unpacked message, so this is
 * protobuf_c_message_free_unpacked and also frees unpacked plans). NULL is fine. */
void pcs_plan_free(Pcs__V1__Plan *p);

/* FNV-1a 64 over the packed plan with hash = 0; stable across processes and machines. */
uint64_t pcs_plan_hash(const Pcs__V1__Plan *p);

/* Memory and traffic estimate of `rank` (depends only on its pp coordinate). out is initialised
 * here. Formulas: docs/PLAN.md. PCS_ERR_INVALID_ARG if rank >= world size. */
pcs_status_t pcs_plan_rank_estimate(const Pcs__V1__Plan *p, uint32_t rank,
                                    Pcs__V1__RankEstimate *out);

struct pcs_schedule;
/* The plan's pipeline schedule (planner/schedule.h; free with pcs_schedule_free): its
 * `pipeline_schedule` over pp_size ranks, virtual_stages, micro_batches, with FSDP unsharding
 * around every micro-batch when a non-root unit reshards after forward, once per step otherwise.
 * Generated and validated; PCS_ERR_INVALID_ARG naming the field for what the schedule cannot
 * run. A plan with pp <= 1 has none (*out NULL, PCS_OK). */
pcs_status_t pcs_plan_schedule(const Pcs__V1__Plan *p, struct pcs_schedule **out);

/* What the unit runtime of this release runs of a plan; the coordinator refuses the rest at
 * SubmitJob and the runtime refuses it at create, so the two never disagree. Unit dtypes are
 * fp32, bf16, fp16 and fp64; fp64 param/reduce/grad/accumulation dtypes only in a unit with fp64
 * masters (the runtime sizes its fp64 storage by them). Buffers may be any floating dtype.
 * PCS_OK, or
 * PCS_ERR_UNSUPPORTED with "field: reason" (the spec field that asked for it) in
 * pcs_last_error(). Pure; O(units). */
pcs_status_t pcs_plan_check_runnable(const Pcs__V1__Plan *p);
/* The plan's layouts are consistent, so that no buffer is read or written outside its bounds:
 * per unit, shard size x group size against the padded size (equal with flat, <= with
 * per_param), every parameter's shape, size and offset inside the padded buffer, and with
 * per_param (only with a shard group) each parameter's shard_dim, shard_rows (chunking its rows;
 * evenly on a dim > 0) and chunk inside the shard, in order, not overlapping. PCS_ERR_INVALID_ARG
 * naming the unit. pcs_plan_check_runnable and pcs_plan_transfer (the checkpoint's plan) call it:
 * a plan comes from the network or a file. Pure; O(params). */
pcs_status_t pcs_plan_check_layout(const Pcs__V1__Plan *p);

/* The same for a job: its plan, pipeline stages (pp > 1) only for the built-in mlp model
 * (pcs-worker runs the stages; a C API program computes its whole model), and fp64 masters and
 * ignored_params only in jobs for a program doing its own math (spec.program other than "" and
 * pcs-worker: pcs.torch, a C API program), fp64 without clip_grad_norm or eval_backward. */
pcs_status_t pcs_job_check_runnable(const Pcs__V1__JobSpec *spec, const Pcs__V1__Plan *p);

/* [begin, end) of shard `shard_rank`'s unpadded part of the unit's flat buffer (torch.chunk rule:
 * c = shard_numel, begin = min(r*c, flat_numel), end = min((r+1)*c, flat_numel); trailing shards
 * may be empty). The rank's padded shard is always c elements starting at r*c. */
void pcs_plan_shard_range(const Pcs__V1__Unit *u, uint32_t shard_rank, uint64_t *begin,
                          uint64_t *end);

/* A parameter's part of a rank's shard, as `count` runs of `len` elements: run j is elements
 * [elem + j·stride, + len) of the unit's parameter `param` (row-major; in the unit's flat buffer
 * at params[param]->offset + elem + j·stride) and elements [shard_off + j·len, + len) of the
 * rank's c-element shard (the runs are back to back there). One run (count 1) except for a
 * per_param parameter chunked on a dim k > 0: one run per index of the dims before k. */
typedef struct pcs_plan_piece {
    uint32_t param;
    uint64_t elem, len, shard_off;
    uint64_t count, stride;
} pcs_plan_piece_t;

/* The non-empty pieces of shard `shard_rank` of unit u, in parameter order, into `out` (room for
 * u->n_params); returns their count. Flat layout: each parameter's overlap with [r*c, (r+1)*c)
 * (alignment padding between them is shard elements of no parameter); per_param: rows [r*rows,
 * (r+1)*rows) along each parameter's shard_dim at its shard_offset. Shard elements in no piece are padding
 * (zero). Works for every unit (a replicated one: its one shard is the flat buffer). Pure. */
size_t pcs_plan_shard_pieces(const Pcs__V1__Unit *u, uint32_t shard_rank, pcs_plan_piece_t *out);

/* Where element `elem` (< numel) of parameter `param` lives: its shard, its offset in that shard,
 * and `run` >= 1, the elements of the parameter from `elem` on that follow contiguously there. */
void pcs_plan_locate(const Pcs__V1__Unit *u, uint32_t param, uint64_t elem, uint32_t *shard,
                     uint64_t *shard_off, uint64_t *run);

/* Elements of shard `shard_rank`'s c-element range of the unit's flat buffer that are not part of
 * a frozen parameter: the elements with optimizer state (alignment and tail padding count, as
 * the flat optimizer state covers them; a unit without frozen parameters gives c on every
 * shard). */
uint64_t pcs_plan_unfrozen_numel(const Pcs__V1__Unit *u, uint32_t shard_rank);

// ---- the rules, exposed for tests, workers and the reference trainer ----

/* FSDP1 / fp16 pre- and post-divide factors for a data-parallel size (spec §4.2):
 * pre = 1; while ws % pre == 0 && ws / pre > pre: pre *= 2; post = ws / pre. */
void pcs_plan_divide_factors(double ws, double *pre, double *post);

/* FSDP2 op choice (_get_gradient_divide_factors, spec §4.2 / case 9) for a reduce-scatter over
 * rs_size ranks followed by an all-reduce over ar_size ranks (1 = none). factor <= 0 = unset
 * (the data-parallel size); force_sum = set_force_sum_reduction_for_comms. pre_divide applies to
 * the reduce-scatter input, post_divide to the final output; 1 = none. */
void pcs_plan_reduce_ops(pcs_dtype_t reduce, uint32_t rs_size, uint32_t ar_size, double factor,
                         bool force_sum, Pcs__V1__ReduceOp *rs_op, Pcs__V1__ReduceOp *ar_op,
                         double *premul, double *pre, double *post);

typedef struct pcs_precision_in {
    pcs_dtype_t master; /* dtype of the sharded parameters (fp32, or fp16 = pure fp16) */
    pcs_dtype_t param, reduce, buffer, output; /* policy values; PCS_DTYPE_NONE = unset */
    bool cast_forward_inputs;
    bool keep_low_precision_grads;
    bool mixed_precision; /* false: ignored class / full_precision override */
} pcs_precision_in_t;

typedef struct pcs_precision {
    pcs_dtype_t master;
    pcs_dtype_t compute; /* all-gather and forward/backward dtype */
    pcs_dtype_t reduce;  /* reduce-scatter and all-reduce dtype */
    pcs_dtype_t accum;   /* unsharded no-sync accumulator */
    pcs_dtype_t grad;    /* sharded grad handed to the optimizer */
    pcs_dtype_t buffer;  /* NONE = buffers keep their dtype */
    pcs_dtype_t output;  /* NONE = no output cast */
    bool cast_forward_inputs;
    bool keep_low_precision_grads;
    bool mixed_precision;
} pcs_precision_t;

/* Resolve one unit's policy: FSDP1 inference (case 11) with the FSDP2 clamp (case 12) and pcs's
 * reduce_dtype rule (PCS_PLAN_REDUCE_DTYPE_RULE). Total: every input gives floating dtypes. */
void pcs_plan_resolve_precision(const pcs_precision_in_t *in, pcs_precision_t *out);

#ifdef __cplusplus
}
#endif
#endif
