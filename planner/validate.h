/* Job spec validation (DESIGN.md §5): every field of a pcs.v1.JobSpec is checked on submit, and a
 * bad spec is refused with the FIRST broken rule as "field.path: rule". Pure: no I/O, no RPC;
 * linked into pcs_plan so that the coordinator, pcsctl (local pre-check) and the planner share it.
 * Not a planner: divisibility of tensors by shard sizes is the planner's business. */
#ifndef PCS_PLANNER_VALIDATE_H
#define PCS_PLANNER_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"
#include "pcs/v1/job.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest world size a mesh may describe (product of its sizes). */
#define PCS_JOB_MAX_WORLD 65536u

/* Longest program name (spec.program, RegisterRequest.program): [A-Za-z0-9._-]. */
#define PCS_PROGRAM_NAME_MAX 64

/* Validate `spec` (borrowed). PCS_OK, or PCS_ERR_INVALID_ARG with the first error written to
 * `err` (may be NULL; truncated to errlen) as "field.path: rule", e.g.
 * "precision.overrides[2].param_dtype: int64 is not a floating dtype", and recorded with
 * pcs_set_error(). A NULL spec is "spec: required". Thread-safe (no shared state). */
pcs_status_t pcs_job_validate(const Pcs__V1__JobSpec *spec, char *err, size_t errlen);

/* Product of the mesh sizes (1 if there is no mesh; sizes of 0 count as 1); saturates at
 * UINT32_MAX. Meaningful for a validated spec. */
uint32_t pcs_job_world_size(const Pcs__V1__JobSpec *spec);

#ifdef __cplusplus
}
#endif
#endif
