/* Sharded checkpoints and export of full parameters. Each rank writes its fp32 master shards and
 * optimizer state to <dir>/step-<N>/rank-<R>.safetensors (a worker's <dir> is the job's own
 * <checkpoint.dir>/<job id>, see pcs_ckpt_job_dir); after a barrier rank 0 writes the plan
 * (plan.pb) and COMPLETE (the manifest: job, plan hash and every rank file with its size) and
 * points <dir>/latest at N, then prunes stale steps. Export reads only the files the manifest
 * lists and assembles every parameter from the shards of replica 0 through the plan's flat layout
 * into a .safetensors file keyed by FQN that torch / Hugging Face load directly. */
#ifndef PCS_IO_CHECKPOINT_H
#define PCS_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"
#include "pcs/v1/plan.pb-c.h"
#include "io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where one unit's shard in a rank file sits: units differ (a replicated NO_SHARD or
 * full-precision unit next to sharded ones), so each unit carries its own indices. */
typedef struct pcs_ckpt_unit_meta {
    uint32_t unit;
    uint32_t shard_index;     /* index in the unit's shard group (0 for a replicated unit) */
    uint32_t replicate_index; /* replica of that shard (dp index for a replicated unit) */
} pcs_ckpt_unit_meta_t;

typedef struct pcs_ckpt_rank_meta {
    const char *job_id;
    uint64_t step; /* optimizer steps done */
    uint32_t rank, world_size;
    uint32_t shard_index;     /* index in the shard group (dp_shard coordinate) */
    uint32_t replicate_index; /* dp_replicate coordinate */
    uint32_t pp_index;
    uint64_t plan_hash;
    double loss_scale;
    /* what a resume needs besides the tensors: optimizer steps taken (AdamW bias correction, SGD
     * momentum start), the grad scaler's growth tracker, steps skipped so far */
    uint64_t opt_steps;
    uint32_t growth_tracker;
    uint64_t skipped_steps;
    /* per-unit indices ("unit.<i>.shard_index" / ".replicate_index" in the file's metadata);
     * units not listed (or units = NULL) use shard_index / replicate_index above */
    const pcs_ckpt_unit_meta_t *units;
    size_t n_units;
} pcs_ckpt_rank_meta_t;

/* ---- directories ----
 * A checkpoint directory held open: every file in it is reached by its descriptor and a name pcs
 * chose, without following a symlink (a worker writes where submitters choose; see DESIGN.md §10).
 * The functions below that take a `const char *dir` open it as an operator's path (tools, tests)
 * and call their `_in` twin. */
typedef struct pcs_ckpt_dir {
    int fd;
    char path[1024]; /* for messages */
} pcs_ckpt_dir_t;
/* Open `path` (create: made with its parents). PCS_ERR_NOT_FOUND when it does not exist. */
pcs_status_t pcs_ckpt_dir_open(const char *path, int create, pcs_ckpt_dir_t *d);
/* Take over a directory descriptor (a worker's, resolved beneath its checkpoint root). */
pcs_status_t pcs_ckpt_dir_adopt(int fd, const char *shown, pcs_ckpt_dir_t *d);
void pcs_ckpt_dir_close(pcs_ckpt_dir_t *d);
/* A job's own subdirectory <base>/<job_id>, made when missing and claimed for the job by a JOB
 * file holding `job_uid` (unique across coordinators): the first rank writes it (O_EXCL), every
 * rank checks it. PCS_ERR_STATE when it holds another job's uid (a reused job id of another
 * coordinator): that directory is never written or pruned. */
pcs_status_t pcs_ckpt_job_dir(const pcs_ckpt_dir_t *base, const char *job_id, const char *job_uid,
                              pcs_ckpt_dir_t *out);

/* "<dir>/step-%08llu" into buf. */
void pcs_ckpt_step_dir(const char *dir, uint64_t step, char *buf, size_t n);

/* Tensor names inside a rank file: "unit.<i>.<what>" (param, exp_avg, exp_avg_sq, momentum) and
 * "buffer.<fqn>" for module buffers. */
void pcs_ckpt_unit_key(uint32_t unit, const char *what, char *buf, size_t n);

/* Write one rank's file (directories are created). The step's COMPLETE is removed first: a step
 * being (re)written is not complete, whatever an earlier run left there. Errors: PCS_ERR_SYSTEM /
 * INVALID_ARG. */
pcs_status_t pcs_ckpt_write_rank(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                 const pcs_st_entry_t *e, size_t n);
/* ---- assembling a rank file ----
 * The rank's units and buffers, given as host arrays; the builder names them as the format says
 * ("unit.<i>.param" in the master dtype, "unit.<i>.exp_avg" / ".exp_avg_sq" (AdamW) or
 * ".momentum" (SGD) in fp32, "buffer.<fqn>" flat in the state_dict dtype) and records each unit's
 * indices. Arrays are borrowed until pcs_ckpt_rank_file_write returns. Not thread-safe. */
typedef struct pcs_ckpt_rank_file pcs_ckpt_rank_file_t;

/* Room for n_units units and n_buffers buffers. Caller frees with pcs_ckpt_rank_file_free(). */
pcs_status_t pcs_ckpt_rank_file_create(size_t n_units, size_t n_buffers,
                                       pcs_ckpt_rank_file_t **out);
/* Unit um->unit's shard of `numel` elements: the master values (master_dtype) and its optimizer
 * state (fp32; NULL = none: a frozen-only unit, or SGD without momentum). PCS_ERR_INVALID_ARG
 * past the capacity or with AdamW state and a momentum buffer both given. */
pcs_status_t pcs_ckpt_rank_file_add_unit(pcs_ckpt_rank_file_t *f, const pcs_ckpt_unit_meta_t *um,
                                         uint64_t numel, pcs_dtype_t master_dtype,
                                         const void *master, const float *exp_avg,
                                         const float *exp_avg_sq, const float *momentum);
/* A module buffer: numel values of `dtype`, stored flat (export restores the plan's shape), or as
 * a 0-d tensor when `scalar`. */
pcs_status_t pcs_ckpt_rank_file_add_buffer(pcs_ckpt_rank_file_t *f, const char *fqn,
                                           pcs_dtype_t dtype, uint64_t numel, int scalar,
                                           const void *data);
/* pcs_ckpt_write_rank of what was added, with its per-unit indices (m->units is not read). */
pcs_status_t pcs_ckpt_rank_file_write(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                      const pcs_ckpt_rank_file_t *f);
pcs_status_t pcs_ckpt_rank_file_write_in(const pcs_ckpt_dir_t *d, const pcs_ckpt_rank_meta_t *m,
                                         const pcs_ckpt_rank_file_t *f);
void pcs_ckpt_rank_file_free(pcs_ckpt_rank_file_t *f); /* accepts NULL */

/* Called by one rank after every rank has written: checks that rank files 0..W-1 all belong to
 * this step, job and plan (rank 0's file gives the job and plan hash; a stale file of another
 * run is PCS_ERR_STATE naming it), then writes plan.pb, COMPLETE (the manifest) and latest. */
pcs_status_t pcs_ckpt_commit(const char *dir, uint64_t step, const Pcs__V1__Plan *plan);
pcs_status_t pcs_ckpt_commit_in(const pcs_ckpt_dir_t *d, uint64_t step, const Pcs__V1__Plan *plan);
/* After committing `step`: keep the newest `keep` (0 = 2) committed steps of the same job up to
 * `step`; remove every other step-<N> directory (older, uncommitted, of another job, or above
 * `step` from an earlier run). Only pcs' own files are removed; a directory holding anything else
 * is left with one WARN. Errors: PCS_ERR_SYSTEM when dir cannot be listed. */
pcs_status_t pcs_ckpt_prune(const char *dir, uint64_t step, uint32_t keep);
pcs_status_t pcs_ckpt_prune_in(const pcs_ckpt_dir_t *d, uint64_t step, uint32_t keep);
/* Step of <dir>/latest. PCS_ERR_NOT_FOUND if there is no complete checkpoint. */
pcs_status_t pcs_ckpt_latest(const char *dir, uint64_t *step);
pcs_status_t pcs_ckpt_latest_in(const pcs_ckpt_dir_t *d, uint64_t *step);

typedef struct pcs_ckpt_export_info {
    uint64_t step;
    size_t n_params, n_buffers;
    uint64_t numel;
} pcs_ckpt_export_info_t;

/* Assemble full parameters (master dtype) and buffers (from the shard-index-0 rank of replica 0,
 * per unit) of checkpoint `step` (0 = latest) into a .safetensors file at out_path, reading only
 * the rank files COMPLETE lists and refusing one whose size, step, job or plan hash differs from
 * the manifest. Errors name the missing or inconsistent file. info may be NULL. */
pcs_status_t pcs_ckpt_export(const char *dir, uint64_t step, const char *out_path,
                             pcs_ckpt_export_info_t *info);
pcs_status_t pcs_ckpt_export_in(const pcs_ckpt_dir_t *d, uint64_t step, const char *out_path,
                                pcs_ckpt_export_info_t *info);

/* ---- reading a checkpoint back (resume) ----
 * A committed step opened for reading: its manifest and saved plan; each rank file is opened on
 * first use and refused unless it is the file the commit recorded (size, step, job, plan hash).
 * Which ranges to read comes from the planner (planner/reshard.h), so a checkpoint of W ranks
 * loads at any W'. */
typedef struct pcs_ckpt_reader pcs_ckpt_reader_t;
/* step 0 = latest. PCS_ERR_NOT_FOUND when d holds no committed step. */
pcs_status_t pcs_ckpt_reader_open(const pcs_ckpt_dir_t *d, uint64_t step,
                                  pcs_ckpt_reader_t **out);
void pcs_ckpt_reader_close(pcs_ckpt_reader_t *r); /* accepts NULL */
uint64_t pcs_ckpt_reader_step(const pcs_ckpt_reader_t *r);
const Pcs__V1__Plan *pcs_ckpt_reader_plan(const pcs_ckpt_reader_t *r); /* the writers' plan */
const char *pcs_ckpt_reader_path(const pcs_ckpt_reader_t *r);        /* for messages */
/* A metadata value of rank `rank`'s file (NULL if absent or the file is not usable). */
const char *pcs_ckpt_reader_meta(pcs_ckpt_reader_t *r, uint32_t rank, const char *key);
/* Elements [first, first + count) of tensor `tensor` ("unit.<i>.param", "unit.<i>.exp_avg",
 * "buffer.<fqn>", ...) of rank `rank`'s file, converted to fp32 into dst. PCS_ERR_NOT_FOUND
 * when the file has no such tensor (an SGD checkpoint has no exp_avg). */
pcs_status_t pcs_ckpt_reader_read(pcs_ckpt_reader_t *r, uint32_t rank, const char *tensor,
                                  uint64_t first, uint64_t count, float *dst);

#ifdef __cplusplus
}
#endif
#endif
