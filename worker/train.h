/* Training loop of one rank of a job (DESIGN.md §7): builds the communicators and the unit runtime
 * from an Assignment, runs the steps (micro-batches without sync, reduce, clip, scaler, optimizer),
 * reports every step, checkpoints and exports. Used by the agent (pcs-worker) and by tests that run
 * ranks without a coordinator (file KV store). Not thread-safe except pcs_train_abort(). */
#ifndef PCS_WORKER_TRAIN_H
#define PCS_WORKER_TRAIN_H

#include <stdint.h>

#include "coll/coll.h"
#include "pcs/file.h"
#include "pcs/status.h"
#include "pcs/v1/worker.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pcs_kv;
typedef struct pcs_train pcs_train_t;

/* Called on the training thread after every step (and once more with done/error). The report
 * is borrowed for the call; the callee copies what it keeps and must not block for long. */
typedef void (*pcs_train_report_fn)(void *ctx, const Pcs__V1__StepReport *report);

typedef struct pcs_train_config {
    const Pcs__V1__Assignment *assignment; /* retained: must outlive the pcs_train_t */
    struct pcs_kv *kv;                     /* rendezvous store, retained */
    const char *backend;                   /* kernels backend the worker offers: "cpu" (default)
                                            * | "cuda"; the job's spec.backend decides */
    const char *coll;                      /* collectives offered: "auto" (default) | "nccl" |
                                            * "gloo"; the job's spec.collectives decides */
    int device;                            /* cuda device ordinal (cuda jobs) */
    const char *hostname;                  /* transport address, default 127.0.0.1 */
    uint32_t coll_timeout_ms;              /* 0 = 30000 */
    pcs_train_report_fn report;            /* may be NULL */
    void *report_ctx;
    /* Test hooks: put +Inf into this rank's first gradient element at step inject_inf_step
     * (1-based; 0 = off) on rank inject_inf_rank. */
    uint64_t inject_inf_step;
    uint32_t inject_inf_rank;
    /* Test hook: the process of rank die_rank exits (as if killed) in the checkpoint of step
     * die_at_checkpoint of a job's first generation, after writing its rank file and before the
     * commit (0 = off). */
    uint64_t die_at_checkpoint;
    uint32_t die_rank;
    /* Test hook: sleep this long after each step's report (0 = off), so that a fault test's job
     * runs for a known time whatever the machine's speed; an abort cuts the sleep short. */
    uint32_t step_pause_ms;
    /* Test hook: 1 = collectives through host staging buffers on the cpu backend too (the staged
     * path must give the direct path's bits). */
    int stage_host;
    /* Overrides for the bench: -1 = plan's prefetch depth. */
    int prefetch;
    /* OpenBLAS threads of a cpu job (process-wide); 0 = auto: pcs_cpu_available() divided by
     * the assignment's local_world_size (the ranks sharing this host). */
    uint32_t blas_threads;
    /* Where the spec's paths may lead (DESIGN.md §10, pcs/file.h): data.file, init.from and
     * checkpoint.dir resolve beneath these (retained; NULL = as given: local runs and tools). The
     * checkpoints go to the job's own <checkpoint.dir>/<job id>, claimed by assignment.job_uid
     * (or the job id when the assignment has none). */
    const pcs_root_t *data_root, *init_root, *checkpoint_root;
} pcs_train_config_t;

/* Summary of a finished run. */
typedef struct pcs_train_result {
    uint64_t steps;
    double last_loss;
    uint64_t skipped_steps;
    double mean_step_ms;
} pcs_train_result_t;

/* Build communicators (rendezvous through cfg->kv), the unit runtime and the model. Errors:
 * PCS_ERR_INVALID_ARG (a plan/spec this runtime cannot run, with the reason), PCS_ERR_REMOTE /
 * PCS_ERR_TIMEOUT (rendezvous). Caller destroys. */
pcs_status_t pcs_train_create(const pcs_train_config_t *cfg, pcs_train_t **out);
/* Run all steps of the job; the last report carries done=true. On failure the error report has
 * been sent (report.error) and the status says why (a dead peer: PCS_ERR_REMOTE naming it). */
pcs_status_t pcs_train_run(pcs_train_t *t, pcs_train_result_t *result);
/* Wake every blocked collective with an error and make run() return PCS_ERR_CANCELLED.
 * Thread-safe; may be called before or during run(). */
void pcs_train_abort(pcs_train_t *t, const char *reason);
/* After pcs_train_run failed: the global rank the failure is blamed on and how (a peer that died
 * or went silent: pcs_runtime_blame), -1 when none is (NULL t too). */
int pcs_train_blame(const pcs_train_t *t, pcs_coll_fault_t *fault);
void pcs_train_destroy(pcs_train_t *t);

/* Fill a report's timing, byte, audit and per-collective fields from the runtime's stats of the
 * step: records aggregated per (kind, unit, dtype) into recs/rp (caller arrays of cap entries;
 * r->collectives points into rp). */
struct pcs_rt_stats;
void pcs_train_fill_report(Pcs__V1__StepReport *r, Pcs__V1__CollectiveRecord *recs,
                           Pcs__V1__CollectiveRecord **rp, size_t cap,
                           const struct pcs_rt_stats *s);

/* Where a job runs (docs/WORKER.md "Where a job runs"): the job's spec.backend and
 * spec.collectives ("auto": nccl for cuda jobs, gloo otherwise) against what this worker offers
 * (offer_backend "cpu"|"cuda", offer_coll "auto"|"nccl"|"gloo"; NULL = cpu / auto). Fills the
 * kernels backend and the transport. PCS_ERR_UNSUPPORTED with the reason when the worker does not
 * offer them; the backend lookup's error when "cuda" has no device. Shared by pcs-worker and the
 * C API. */
struct pcs_backend_ops;
pcs_status_t pcs_train_resolve_backend(const Pcs__V1__JobSpec *spec, const char *offer_backend,
                                       const char *offer_coll, const struct pcs_backend_ops **be,
                                       int *coll);

/* The rank's data-parallel sample position (pcs_mesh_data_rank of the plan's mesh) and the
 * data-parallel size. The assignment's coordinates, when sent, must be the plan's for its rank:
 * PCS_ERR_INVALID_ARG naming both otherwise (the plan is the contract). Shared by pcs-worker and
 * the C API. */
pcs_status_t pcs_train_data_position(const Pcs__V1__Assignment *as, uint32_t *dp_rank,
                                     uint32_t *dp_size);

/* The training spec's optimizer as runtime settings (kind, AdamW / SGD hyper-parameters; AdamW
 * with PyTorch's defaults when unset). Shared by pcs-worker and the C API. */
struct pcs_runtime_config;
void pcs_train_opt_from_spec(const Pcs__V1__TrainingSpec *tr, struct pcs_runtime_config *rc);
/* ShardedGradScaler.update (spec §5): back off on found_inf, else grow every growth_interval
 * clean steps unless the grown scale overflows fp32. */
void pcs_train_scaler_update(const Pcs__V1__GradScalerSpec *g, int found_inf, double *scale,
                             uint32_t *growth_tracker);

#ifdef __cplusplus
}
#endif
#endif
