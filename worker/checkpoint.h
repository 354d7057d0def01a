/* Sharded checkpoints and export of full parameters. Each rank writes its fp32 master shards and
 * optimizer state to <dir>/step-<N>/rank-<R>.safetensors; after a barrier rank 0 writes the plan
 * (plan.pb) and COMPLETE and points <dir>/latest at N. Export assembles every parameter from the
 * shards of one replica through the plan's flat layout and writes a .safetensors file keyed by
 * FQN that torch / Hugging Face load directly. Restarting from a checkpoint is a later issue. */
#ifndef PCS_CHECKPOINT_H
#define PCS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"
#include "pcs/v1/plan.pb-c.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_ckpt_rank_meta {
    const char *job_id;
    uint64_t step; /* optimizer steps done */
    uint32_t rank, world_size;
    uint32_t shard_index;     /* index in the shard group (dp_shard coordinate) */
    uint32_t replicate_index; /* dp_replicate coordinate */
    uint32_t pp_index;
    uint64_t plan_hash;
    double loss_scale;
} pcs_ckpt_rank_meta_t;

/* "<dir>/step-%08llu" into buf. */
void pcs_ckpt_step_dir(const char *dir, uint64_t step, char *buf, size_t n);

/* Tensor names inside a rank file: "unit.<i>.<what>" (param, exp_avg, exp_avg_sq, momentum) and
 * "buffer.<fqn>" for module buffers. */
void pcs_ckpt_unit_key(uint32_t unit, const char *what, char *buf, size_t n);

/* Write one rank's file (directories are created). Errors: PCS_ERR_SYSTEM / INVALID_ARG. */
pcs_status_t pcs_ckpt_write_rank(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                 const pcs_st_entry_t *e, size_t n);
/* Called by one rank after every rank has written: plan.pb, COMPLETE, then latest. */
pcs_status_t pcs_ckpt_commit(const char *dir, uint64_t step, const Pcs__V1__Plan *plan);
/* Step of <dir>/latest. PCS_ERR_NOT_FOUND if there is no complete checkpoint. */
pcs_status_t pcs_ckpt_latest(const char *dir, uint64_t *step);

typedef struct pcs_ckpt_export_info {
    uint64_t step;
    size_t n_params, n_buffers;
    uint64_t numel;
} pcs_ckpt_export_info_t;

/* Assemble full parameters (master dtype) and buffers (from the shard-index-0 rank of replica 0)
 * of checkpoint `step` (0 = latest) into a .safetensors file at out_path. Errors name the missing
 * or inconsistent file. info may be NULL. */
pcs_status_t pcs_ckpt_export(const char *dir, uint64_t step, const char *out_path,
                             pcs_ckpt_export_info_t *info);

#ifdef __cplusplus
}
#endif
#endif
