/* The single-process reference trainer: the same job (JobSpec + Plan) in one process, unsharded,
 * with the same precision policy per unit — the oracle of the parity tests and of the demo.
 * Each step runs the M micro-batches of the global batch; gradients go through each unit's
 * compute -> accumulation -> reduce -> grad dtypes with the plan's divide factors, then the
 * optional fp16 grad scaler (unscale + skip on non-finite), grad-norm clipping and AdamW/SGD on
 * fp32 master parameters through the kernels API (pcs_backend "cpu"). Not thread-safe. */
#ifndef PCS_MODEL_REFERENCE_H
#define PCS_MODEL_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Pcs__V1__JobSpec;
struct Pcs__V1__Plan;

typedef struct pcs_ref_options {
    /* Data-parallel ranks to emulate; 0 = plan->dp_size, else the product of the spec's
     * dp_replicate and dp_shard mesh sizes, else 1. */
    uint32_t dp_size;
    /* 0 (default): emulate each rank — every micro-batch runs once per rank on its b rows, the
     * rank's accumulated gradient is cast to the reduce dtype, pre-divided, summed over ranks in
     * rank order in the reduce dtype, post-divided: the sharded run's arithmetic without
     * communication (and BatchNorm sees per-rank batches and keeps per-rank running stats, as
     * unsynchronised BatchNorm under FSDP does; rank 0's are exported).
     * 1: one forward over the whole global micro-batch (D*b rows); the mean loss is already the
     * data-parallel average, so no divide factors apply (the literal issue text's reference). */
    int global_batch;
    /* Test seam: after the backward of this 0-based step, set the first gradient element of the
     * first unit to +Inf (as a rank that overflowed would). -1 = off. */
    int64_t inject_nonfinite_step;
} pcs_ref_options_t;

/* Defaults: dp_size 0, global_batch 0, inject_nonfinite_step -1. */
void pcs_ref_options_default(pcs_ref_options_t *o);

typedef struct pcs_ref_step_result {
    uint64_t step;    /* 0-based index of the step just run */
    double loss;      /* mean loss over the step's global batch (unscaled) */
    double grad_norm; /* total L2 norm of the (unscaled) gradients before clipping */
    int skipped;      /* 1: non-finite gradients, optimizer step skipped (grad scaler) */
    double scale;     /* grad-scaler scale after the update (1 when disabled) */
} pcs_ref_step_result_t;

typedef struct pcs_reference pcs_reference_t;

/* Build the model, data, units and optimizer state of `spec` (built-in mlp only). `plan` (may be
 * NULL) gives the units and their dtypes/reductions, e.g. from pcs_plan_build(spec, W); without
 * a plan the reference derives one unit per MLPBlock plus the root unit, BatchNorm modules as
 * full-precision units, dtypes from the spec's default policy (overrides are not applied).
 * Both are borrowed for the call. Errors: PCS_ERR_INVALID_ARG naming the field
 * ("model.mlp...", "training.micro_batch_size: ...", "init.from ...: ...").
 * Caller destroys with pcs_ref_destroy(). */
pcs_status_t pcs_ref_create(const struct Pcs__V1__JobSpec *spec, const struct Pcs__V1__Plan *plan,
                            const pcs_ref_options_t *opt, pcs_reference_t **out);
void pcs_ref_destroy(pcs_reference_t *r);

/* Run the next step. PCS_ERR_STATE after the spec's last step. */
pcs_status_t pcs_ref_step(pcs_reference_t *r, pcs_ref_step_result_t *res);
/* Run the remaining steps; with eval_every K > 0 an eval runs after every K-th step. */
pcs_status_t pcs_ref_run(pcs_reference_t *r);
/* Mean loss on the fixed eval batch (training = 0: BatchNorm uses running statistics). With
 * training.full_precision_eval (FSDP1's FSDP_USE_FULL_PREC_IN_EVAL=1) the forward runs on the fp32
 * master parameters without input/output casts; otherwise in the units' compute dtypes. */
pcs_status_t pcs_ref_eval(pcs_reference_t *r, double *loss);

/* Per-step losses so far (index = step). */
const double *pcs_ref_losses(const pcs_reference_t *r, size_t *n);
/* Eval losses so far with the step count after which each ran. */
const double *pcs_ref_eval_losses(const pcs_reference_t *r, const uint64_t **after_step, size_t *n);
uint64_t pcs_ref_steps_done(const pcs_reference_t *r);
uint32_t pcs_ref_dp_size(const pcs_reference_t *r);

/* The model (FQNs, shapes; bindings are the reference's own — do not rebind). */
const pcs_mlp_t *pcs_ref_model(const pcs_reference_t *r);
/* Full fp32 master values of parameter `fqn` (numel elements). NULL if unknown. */
const float *pcs_ref_param(const pcs_reference_t *r, const char *fqn);
/* Last synced gradient of parameter `fqn` as handed to the optimizer (fp32 values, after
 * unscale and clipping). NULL if unknown. */
const float *pcs_ref_grad(const pcs_reference_t *r, const char *fqn);
/* Buffer `fqn` of rank 0 as fp32 values (num_batches_tracked as a float count). */
pcs_status_t pcs_ref_buffer(const pcs_reference_t *r, const char *fqn, float *out);

/* Write every parameter (master dtype) and buffer (original dtype: running stats F32,
 * num_batches_tracked I64) to a .safetensors file keyed by FQN, with metadata format=pt,
 * producer=pcs, step=<steps done>: loads with safetensors.torch.load_file and into the PyTorch
 * module via load_state_dict. */
pcs_status_t pcs_ref_export(const pcs_reference_t *r, const char *path);

#ifdef __cplusplus
}
#endif
#endif
