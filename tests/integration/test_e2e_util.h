/* Helpers of the end-to-end tests: a real pcs-coordinator and N real pcs-worker processes on
 * 127.0.0.1, a job submitted over gRPC, the per-rank step reports the workers write next to the
 * RPCs, the exported final parameters, and the single-process reference run of the same job. */
#ifndef PCS_TEST_E2E_UTIL_H
#define PCS_TEST_E2E_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"

#define E2E_MAX_RANKS 8
#define E2E_MAX_STEPS 64

typedef struct e2e_cluster {
    char *dir;
    char addr[64];
    pid_t coord;
    pid_t workers[E2E_MAX_RANKS];
    int n_workers;
} e2e_cluster_t;

typedef struct e2e_job {
    char job_id[64];
    int state; /* PCS__V1__JOB_STATE__* at the end */
    char reason[1024];
    int world;
    /* reports[rank][i], n_reports[rank]: the last E2E_MAX_STEPS + 2 of each rank */
    Pcs__V1__StepReport *reports[E2E_MAX_RANKS][E2E_MAX_STEPS + 2];
    size_t n_reports[E2E_MAX_RANKS];
    char export_path[1200];
    double wall_s;
} e2e_job_t;

/* Start a coordinator (in-memory DB) in a fresh temp dir. 0 on success. */
int e2e_start(e2e_cluster_t *c, const char *tag);
/* A free TCP port on 127.0.0.1 (bound, read and let go, so a restarted coordinator can take it
 * again); -1 on error. */
int e2e_free_port(void);
/* (Re)start the cluster's coordinator on 127.0.0.1:port with its SQLite state in
 * <dir>/coordinator.db (log: <dir>/coord-<port>.log, appended), extra args appended; sets c->coord
 * and c->addr and returns 0 once it answers GetStatus (within 15 s). For fault tests that kill
 * and restart it on the same address. */
int e2e_start_coord_at(e2e_cluster_t *c, int port, const char *const *extra);
/* Spawn n workers (--max-jobs 1, reports into the cluster dir); extra args appended to each. */
int e2e_spawn_workers(e2e_cluster_t *c, int n, const char *const *extra);
/* Submit `yaml` (a JobSpec; a checkpoint dir it does not name is <dir>/ckpt-<tag>), wait for a
 * terminal state up to timeout_ms, load the reports and export the final parameters when it
 * succeeded. Returns 0 when the job reached a terminal state (check job->state). */
int e2e_run_job(e2e_cluster_t *c, const char *yaml, const char *tag, int timeout_ms,
                e2e_job_t *job);
/* Same but only submits; e2e_wait_job finishes it. */
int e2e_submit(e2e_cluster_t *c, const char *yaml, const char *tag, e2e_job_t *job);
int e2e_wait_job(e2e_cluster_t *c, e2e_job_t *job, int timeout_ms);
/* GetJob now: the state (PCS__V1__JOB_STATE__*) and reason (may be NULL); 0 when the coordinator
 * did not answer. */
int e2e_job_state(e2e_cluster_t *c, const char *job_id, char *reason, size_t n);
/* ListWorkers now: how many are in `state` (PCS__V1__WORKER_STATE__*); -1 without an answer. */
int e2e_workers_in(e2e_cluster_t *c, int state);
/* ListWorkers now: the state of the worker with this pid (0: not listed, -1: no answer). */
int e2e_worker_state_of_pid(e2e_cluster_t *c, pid_t pid);
/* pid of the worker that holds `rank` in the job (ListWorkers); -1 if unknown. */
pid_t e2e_worker_pid(e2e_cluster_t *c, const char *job_id, uint32_t rank);
/* Reports of one rank from its report file (re-read). */
int e2e_load_reports(e2e_cluster_t *c, e2e_job_t *job);
void e2e_job_free(e2e_job_t *job);
/* Stop all processes and remove the temp dir. */
void e2e_stop(e2e_cluster_t *c);

/* Parse a JobSpec from YAML text (NULL on error, message printed). Caller frees with
 * protobuf_c_message_free_unpacked. */
Pcs__V1__JobSpec *e2e_parse_spec(const char *yaml);

/* Run the job without a coordinator: fork `world` rank processes that build their Assignment
 * locally (pcs_plan_build + coordinates), rendezvous through a file KV store in a temp dir and
 * run pcs_train; reports and the export land in job like e2e_run_job. inject_inf_step/rank as in
 * pcs_train_config_t (0 = off). *dir_out (malloc'd) is the temp dir; remove with
 * pcs_test_rmtree. Returns 0 when every rank exited (check job->state: SUCCEEDED iff all ranks
 * returned OK; job->reason holds the first failing rank's error). */
int e2e_run_local(const char *yaml, const char *tag, int world, uint64_t inject_inf_step,
                  uint32_t inject_inf_rank, e2e_job_t *job, char **dir_out);

/* Compare the exported parameters with the reference run of the same spec for `world` ranks.
 * |a - r| <= atol + rtol |r| for every element; prints the worst element. Fills max_abs.
 * Also compares per-step losses of rank 0's reports with the reference (loss_rtol).
 * Returns the number of failures (0 = parity). */
int e2e_check_parity(const e2e_job_t *job, const char *yaml, double atol, double rtol,
                     double loss_rtol, double *max_abs);

/* The plan's memory estimate is a promise (issue 18): on every rank and step the unit runtime's
 * peak backend memory (StepReport.runtime_memory_peak_bytes) is at most the rank's estimate
 * (RankEstimate.total_bytes less the model's buffer_bytes), and the largest step reaches at least
 * `floor` of it (the estimate is not a loose bound). Prints measured / estimate per rank. Returns
 * the number of violations (0 = kept). */
int e2e_check_memory_promise(const e2e_job_t *job, const char *yaml, double floor);

/* Every tensor of the safetensors files a and b holds the same bits (fails the test naming the
 * first tensor that does not, with `what`). */
void e2e_assert_same_bits(const char *a_path, const char *b_path, const char *what);

#endif
