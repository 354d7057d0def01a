/* SQLite (WAL) persistence of the coordinator: job history (spec bytes, state, timestamps,
 * reason, request id, rank -> worker map), worker identity -> id numbers and the id counters, so
 * a restarted coordinator keeps ids and history. Writes are batched: put_* statements join one
 * open transaction that pcs_store_flush() commits (the coordinator does it once per batch of
 * requests and answers them after it). Heartbeats are never persisted. Single-threaded (the RPC
 * loop). */
#ifndef PCS_COORD_STORE_H
#define PCS_COORD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_store pcs_store_t;

typedef struct pcs_store_job {
    uint32_t number;
    const char *name, *request_id, *reason;
    const char *owner; /* the submitter's principal ("" = none; rows written before it) */
    int state; /* pcs_job_state_t */
    uint64_t created_ms, started_ms, finished_ms, generation, plan_hash;
    uint32_t world_size;
    const void *spec; /* packed pcs.v1.JobSpec; NULL on a put: keep the stored one */
    size_t spec_len;
    /* rank -> worker of a started job: worker number, and its pid and incarnation when it got
     * the rank (0 = unknown), n_ranks entries each; n_ranks 0 = none stored (PENDING, or a row
     * written before the column existed). Lets a restarted coordinator reserve a RUNNING job's
     * workers. rank_incarnation may be NULL (all 0). */
    const uint32_t *rank_worker, *rank_pid;
    const uint64_t *rank_incarnation;
    uint32_t n_ranks;
    /* the operator's view of the job (a packed pcs.v1.JobProgress: step, loss, step time, audit),
     * written with every row, so a finished job does not read step 0 after a restart; NULL
     * (progress_len 0) = none */
    const void *progress;
    size_t progress_len;
} pcs_store_job_t;

/* Open (creating tables) the database at `path`; sync_full: synchronous=FULL (every commit
 * durable across a power loss), else NORMAL (across a crash of the process). A database that
 * cannot be written now (a full disk) still opens when its tables exist. Errors: PCS_ERR_SYSTEM
 * naming the file. */
pcs_status_t pcs_store_open(const char *path, bool sync_full, pcs_store_t **out);
/* Commits pending writes. NULL is fine. */
void pcs_store_close(pcs_store_t *s);
/* A worker's row: its id number, identity and host, and the SHA-256 of the secret its last
 * registration got (NULL: none), so workers keep their credentials across a restart. */
typedef struct pcs_store_worker {
    uint32_t number;
    const char *identity, *host;
    const uint8_t *secret_hash; /* 32 bytes or NULL */
} pcs_store_worker_t;
pcs_status_t pcs_store_put_worker(pcs_store_t *s, const pcs_store_worker_t *w);
pcs_status_t pcs_store_put_job(pcs_store_t *s, const pcs_store_job_t *j);
/* Remove a job's row (in the open transaction): the history forgot it. */
pcs_status_t pcs_store_delete_job(pcs_store_t *s, uint32_t number);
/* The packed spec of job `number` (*buf malloc'd, caller frees), read now. PCS_ERR_NOT_FOUND
 * when the row or its spec is not there. */
pcs_status_t pcs_store_get_spec(pcs_store_t *s, uint32_t number, void **buf, size_t *len);
/* Commit the open transaction (if any). On failure the transaction is gone (rolled back), the
 * error names the file and SQLite's reason, and the caller writes its rows again. */
pcs_status_t pcs_store_flush(pcs_store_t *s);
/* Drop the open transaction (a put failed half way). */
void pcs_store_rollback(pcs_store_t *s);
/* A named counter (the coordinator's next ids), in the open transaction / read now. */
pcs_status_t pcs_store_put_meta(pcs_store_t *s, const char *key, uint64_t value);
pcs_status_t pcs_store_get_meta(pcs_store_t *s, const char *key, uint64_t *value);
/* Call on_worker / on_job for every stored row (workers first, by number). Pointers passed to
 * the callbacks are valid during the call only. */
pcs_status_t pcs_store_load(pcs_store_t *s, void (*on_worker)(void *user, const pcs_store_worker_t *w),
                            void (*on_job)(void *user, const pcs_store_job_t *j), void *user);

#ifdef __cplusplus
}
#endif
#endif
