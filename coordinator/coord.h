/* The coordinator's pure state machine: worker membership with leases, jobs with gang start,
 * per-worker assignment/directive queues and the job-scoped rendezvous KV. No gRPC, no I/O, no
 * locks: one thread (the RPC loop) calls everything, and time comes only from the injected
 * pcs_clock_t, so unit tests drive leases with a fake clock. The job spec and plan are carried as
 * opaque owned pointers (freed through cfg.free_payload); server.c converts protobuf <-> these. */
#ifndef PCS_COORD_H
#define PCS_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/clock.h"
#include "pcs/status.h"
#include "planner/mesh.h" /* a job's mesh: rank <-> coordinates (PCS_MESH_PP ...) */

#ifdef __cplusplus
extern "C" {
#endif

/* Values equal the pcs.v1.WorkerState / JobState enum numbers, so server.c can cast. */
typedef enum {
    PCS_WORKER_IDLE = 1,
    PCS_WORKER_ASSIGNED = 2,
    PCS_WORKER_LOST = 3,
    PCS_WORKER_GONE = 4,
    /* Its job ended (failed or cancelled) and it has not confirmed yet that it left it: a
     * heartbeat naming no job or another one, its final report, or a Register from a new
     * process does. Not scheduled meanwhile, so a worker a peer saw die, or one that is paused
     * or wedged, never gets the next job; its lease still runs. */
    PCS_WORKER_STOPPING = 5
} pcs_worker_state_t;

typedef enum {
    PCS_JOB_PENDING = 1,
    PCS_JOB_RUNNING = 2,
    PCS_JOB_SUCCEEDED = 3,
    PCS_JOB_FAILED = 4,
    PCS_JOB_CANCELLED = 5
} pcs_job_state_t;

#define PCS_COORD_MAX_WORLD   (1u << 20) /* ranks of one job */
#define PCS_COORD_EVENT_QUEUE 64         /* per worker; the oldest event is dropped beyond this */

typedef enum {
    PCS_EV_ASSIGNMENT = 1, /* the worker's rank in job_id / generation */
    PCS_EV_STOP = 2,       /* equal pcs.v1.DirectiveKind numbers for the two directives */
    PCS_EV_RESTART = 3
} pcs_coord_event_kind_t;

typedef struct pcs_coord_event {
    uint64_t seq; /* per worker, increasing from 1 */
    pcs_coord_event_kind_t kind;
    uint32_t job; /* job number (pcs_coord_job_by_number) */
    uint64_t generation;
    uint32_t rank;
    char reason[200];
} pcs_coord_event_t;

typedef struct pcs_coord_device {
    uint32_t index;
    char *kind; /* cpu | cuda */
    char *name;
    uint64_t memory_bytes;
} pcs_coord_device_t;

struct pcs_coord_job;

#define PCS_COORD_SECRET_HASH_BYTES 32 /* SHA-256 */

/* Read-only outside coord.c, except `watch`, which belongs to the server (its open
 * WatchAssignment call for this worker, or NULL). */
typedef struct pcs_coord_worker {
    char id[24]; /* "w-<number>" */
    uint32_t number;
    char *identity, *host, *address, *version;
    char *program; /* RegisterRequest.program ("" = not said) */
    uint32_t pid;
    uint64_t incarnation; /* random per process (0: not sent by an older worker) */
    pcs_coord_device_t *devices;
    size_t n_devices;
    char **backends;
    size_t n_backends;
    bool has_cuda;
    pcs_worker_state_t state;
    struct pcs_coord_job *job; /* while ASSIGNED */
    uint32_t rank;
    /* while ASSIGNED: its place among the job's ranks on the same host (registered `host`), and
     * how many there are (torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE); 0 size = not known (a
     * re-adopted job) */
    uint32_t local_rank, local_size;
    uint32_t stop_job;    /* while STOPPING: the number of the job it must confirm it left */
    uint64_t stop_gen;    /* and its generation */
    uint64_t registered_wall_ms;
    uint64_t last_heartbeat_ms; /* monotonic */
    uint64_t last_heartbeat_wall_ms;
    /* event queue: events[ev_head .. ev_head + ev_len), allocated on first use (most workers
     * hold 0-2 events; a fixed ring would cost ~15 KB per worker) */
    pcs_coord_event_t *events;
    size_t ev_head, ev_len, ev_cap;
    uint64_t ev_seq;
    /* Restored from the store (pcs_coord_restore_ranks): this worker held rank reserved_rank of
     * job number reserved_job when the coordinator went down; 0 when it holds no reservation.
     * It takes that rank back when it re-registers from the same process. */
    uint32_t reserved_job, reserved_rank;
    /* Its credential (DESIGN.md §10): the SHA-256 of the secret its registration got. While the
     * registration is held (a live lease, or a restored worker within the re-adoption window) a
     * Register of its identity must present that secret or prove the identity by mTLS. */
    bool has_secret;
    uint8_t secret_hash[PCS_COORD_SECRET_HASH_BYTES];
    uint64_t held_until_ms; /* restored: held until then (monotonic) although GONE */
    void *watch;
} pcs_coord_worker_t;

typedef struct pcs_coord_progress {
    uint64_t step;
    double loss;
    double step_ms;
    uint64_t reports;
    bool audit_ok;
    double eval_loss;
    uint64_t skipped_steps;
    double loss_scale;
    /* sums over every report of every rank: bytes each collective kind moved */
    uint64_t all_gather_bytes, reduce_scatter_bytes, all_reduce_bytes;
} pcs_coord_progress_t;

typedef struct pcs_coord_kv_entry {
    char *key;
    uint8_t *value;
    size_t len;
} pcs_coord_kv_entry_t;

/* One automatic restart of a job: why, at which generation and step, the world before and after
 * (after = 0 while it waits for workers). */
#define PCS_COORD_RESTART_LOG 16
typedef struct pcs_coord_restart {
    uint64_t generation; /* the generation that failed */
    uint64_t step;       /* the job's last reported step then */
    uint64_t at_wall_ms;
    uint32_t world_before, world_after;
    char cause[240];
} pcs_coord_restart_t;

/* Read-only outside coord.c. */
typedef struct pcs_coord_job {
    char id[24]; /* "job-<number>" */
    uint32_t number;
    char *name, *request_id;
    char *owner; /* the submitter's principal (pcs_auth_principal), "" without tokens */
    pcs_job_state_t state;
    char *reason;
    uint64_t created_wall_ms, started_wall_ms, finished_wall_ms;
    uint32_t world_size;
    pcs_mesh_t mesh; /* the dims in the user's order, outer first: pcs_mesh_coords(&j->mesh, ..) */
    bool need_cuda;
    char transport[8];   /* "gloo" | "nccl": the job's collectives, which a worker must offer */
    char program[65];    /* spec.program ("" = any worker): the program a worker must be */
    uint64_t generation; /* 0 while PENDING */
    uint64_t plan_hash;
    uint32_t restarts;
    /* elastic restarts (DESIGN.md §8): the budget, the world sizes allowed (a multiple of
     * `world_quantum`, the mesh's ranks per dp_shard index, in [min_world, max_world]), the
     * world of the spec, and while a restart waits for workers (PENDING, generation > 0) when it
     * began. `log` keeps the last PCS_COORD_RESTART_LOG restarts. */
    uint32_t max_restarts, min_world, max_world, base_world, world_quantum;
    uint64_t restart_since_ms;
    struct pcs_coord_restart *log;
    uint32_t n_log;
    uint32_t *rank_worker; /* worker number of each rank (world_size entries, RUNNING) */
    /* RUNNING job restored from the store: its ranks are re-adopted from the workers' step
     * reports (rank_worker 0 = not back yet) until every rank is back or reclaim_by_ms passes */
    uint32_t n_unclaimed;
    uint64_t reclaim_by_ms;
    /* restored RUNNING job whose rank -> worker map was stored: the worker number that held each
     * rank (world_size entries, NULL when not known). Reserved workers take their ranks back on
     * re-register; other workers cannot take these ranks through a report. */
    uint32_t *rank_reserved;
    uint8_t *rank_done;
    uint32_t n_done;
    /* progress watchdog (monotonic ms): when the current generation started (or was restored),
     * and each rank's last step report (0: none yet) */
    uint64_t started_mono_ms;
    uint64_t *rank_report_ms;
    uint64_t *rank_step; /* each rank's last reported step in this generation (0: none) */
    double *rank_step_ms, *rank_loss; /* and its step time and loss (stragglers, /metrics) */
    double *rank_bubble; /* pipeline stages: 1 - compute / action list of its last step; -1 none */
    uint64_t steps;      /* training steps the job runs (0: not known; no bound) */
    pcs_coord_progress_t progress;
    struct pcs_coord_fp_slot *fp_ring; /* recent step fingerprints per pp stage (coord.c) */
    uint32_t fp_stages;
    void *spec, *plan; /* owned, opaque (server.c: Pcs__V1__JobSpec / Pcs__V1__Plan) */
    /* rendezvous KV of the current generation */
    pcs_coord_kv_entry_t *kv;
    size_t kv_len, kv_cap;
    uint64_t kv_bytes;
    void *kv_index; /* key -> entry (coord.c private) */
    struct pcs_coord_kv_waiter *waiters;
    size_t n_waiters, cap_waiters;
} pcs_coord_job_t;

typedef struct pcs_coord_config {
    const pcs_clock_t *clock;       /* NULL = real clock */
    uint32_t heartbeat_interval_ms; /* told to workers; default 1000 */
    uint32_t lease_ms;              /* default 10000 */
    uint32_t readopt_ms;            /* a RUNNING job restored from the store waits this long for
                                     * its ranks to come back; 0 = lease_ms + 5000. It must cover a
                                     * lease plus the workers' longest reconnect backoff. */
    /* Progress watchdog: a RUNNING job fails, naming the silent ranks, when a rank sent no step
     * report for step_timeout_factor x the job's step time (but at least step_timeout_min_ms),
     * or none at all within first_step_timeout_ms of the start (set-up: data, init.from,
     * rendezvous). 0 = 10, 300000 and 900000. */
    uint32_t step_timeout_factor;
    uint32_t step_timeout_min_ms;
    uint32_t first_step_timeout_ms;
    uint32_t kv_max_key_bytes;      /* default 256 */
    uint32_t kv_max_value_bytes;    /* default 64 KiB */
    uint64_t kv_max_job_bytes;      /* default 16 MiB */
    uint64_t kv_max_total_bytes;    /* every job's KV together; default 256 MiB */
    uint32_t max_finished_jobs;     /* history: the newest this many finished jobs are kept,
                                     * older ones forgotten (on_job_forget); 0 = 10000 */
    void *user;
    /* Releases a job's opaque spec/plan (either may be NULL). NULL: not freed. */
    void (*free_payload)(void *user, void *spec, void *plan);
    /* New events were queued for `w` (drain with pcs_coord_pop_event). May be NULL. */
    void (*on_events)(void *user, pcs_coord_worker_t *w);
    /* A parked KvGet completes: st PCS_OK with value (found) or value == NULL (wait expired),
     * or an error (job ended, generation moved on) with pcs_last_error() set. */
    void (*on_kv_wake)(void *user, void *waiter, pcs_status_t st, const void *value, size_t len);
    /* Persistence hooks (store.c): a job's state or a worker identity changed. May be NULL. */
    void (*on_job_change)(void *user, const pcs_coord_job_t *j);
    void (*on_worker_new)(void *user, const pcs_coord_worker_t *w);
    /* A finished job left the history (max_finished_jobs): its number is never used again. */
    void (*on_job_forget)(void *user, uint32_t number);
    /* A restarted job starts at another world size: replace j's plan (free_payload the old one)
     * with one for `world` ranks and set *plan_hash. NULL or an error: the job waits for its
     * current world size. */
    pcs_status_t (*replan)(void *user, pcs_coord_job_t *j, uint32_t world, uint64_t *plan_hash);
    /* How long a restarted job waits for its full world size before it starts with fewer
     * workers (within its elastic bounds); 0 = 30000. */
    uint32_t elastic_wait_ms;
} pcs_coord_config_t;

typedef struct pcs_coord pcs_coord_t;

pcs_status_t pcs_coord_create(const pcs_coord_config_t *cfg, pcs_coord_t **out);
/* Frees everything, including the jobs' payloads. Parked KV waiters are dropped silently (the
 * server cancels its calls first). NULL is fine. */
void pcs_coord_destroy(pcs_coord_t *c);
const pcs_coord_config_t *pcs_coord_config(const pcs_coord_t *c);

// ---- workers ----
typedef struct pcs_coord_register {
    const char *identity; /* required: the idempotency key */
    const char *host, *address, *version;
    const char *program; /* NULL or "": not said; else [A-Za-z0-9._-]{1,64} */
    uint32_t pid;
    uint64_t incarnation; /* random per worker process; 0 = not sent (compare pids then) */
    const pcs_coord_device_t *devices;
    size_t n_devices;
    const char *const *backends;
    size_t n_backends;
    /* Credentials (hashes of PCS_COORD_SECRET_HASH_BYTES; the server hashes, this compares):
     * `presented`: the secret the caller sent (NULL: none); `identity_proven`: its mTLS
     * certificate names `identity`; `fresh`: the hash of a new secret, installed when the
     * registration is new (NULL: the registration gets no secret and is not protected — unit
     * tests of other rules). */
    const uint8_t *presented;
    bool identity_proven;
    const uint8_t *fresh;
} pcs_coord_register_t;

/* Register or re-register (same identity -> same worker, *reregistered = true). A LOST or GONE
 * worker comes back IDLE; an IDLE/ASSIGNED/STOPPING one keeps its state (an agent that only lost
 * its connection gets its assignment again on its next WatchAssignment). One that re-registers
 * from another process (another incarnation; without incarnations, another pid) was restarted:
 * an ASSIGNED worker's job fails naming it, and it comes back IDLE. Strings are copied.
 * Credentials: an identity whose registration is held (it has a secret, and a lease that has not
 * lapsed, or it is a restored worker within the re-adoption window) is taken only by a caller
 * presenting its secret (who keeps it) or proving the identity by mTLS; others get
 * PCS_ERR_STATE naming the worker and how long the hold lasts (a restarted process retries
 * until then). Every other registration installs `fresh`. *secret_kept: the caller's presented
 * secret stays valid (no new one was installed). */
pcs_status_t pcs_coord_register_ex(pcs_coord_t *c, const pcs_coord_register_t *r,
                                   pcs_coord_worker_t **out, bool *reregistered, bool *secret_kept);
/* pcs_coord_register_ex without the flag. */
pcs_status_t pcs_coord_register(pcs_coord_t *c, const pcs_coord_register_t *r,
                                pcs_coord_worker_t **out, bool *reregistered);
/* The worker whose credential has this hash (and whose id the secret names), or NULL: the
 * comparison does not stop at the first differing byte. */
pcs_coord_worker_t *pcs_coord_worker_by_secret(pcs_coord_t *c, const char *worker_id,
                                               const uint8_t *hash);
/* Errors: INVALID_ARG for an empty id, NOT_FOUND for an unknown one. */
pcs_status_t pcs_coord_lookup_worker(pcs_coord_t *c, const char *worker_id,
                                     pcs_coord_worker_t **out);
/* Renew the lease; job_id / generation: the job the worker is running ("" or NULL: none). A
 * STOPPING worker whose heartbeat no longer names the job it must leave is IDLE again. LOST/GONE
 * workers get PCS_ERR_STATE ("worker w-3 is LOST: re-register"). */
pcs_status_t pcs_coord_heartbeat(pcs_coord_t *c, const char *worker_id, const char *job_id,
                                 uint64_t generation, pcs_coord_worker_t **out);
/* GONE; a RUNNING job it belonged to fails, naming the worker and rank. */
pcs_status_t pcs_coord_deregister(pcs_coord_t *c, const char *worker_id, const char *reason);
/* Pop the oldest queued event; false if none. */
bool pcs_coord_pop_event(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_coord_event_t *out);
/* A watch stream (re)opened: an ASSIGNED worker whose queue holds no assignment for its current
 * job gets it queued again, so a reconnecting agent never misses its assignment; a STOPPING one
 * gets its STOP again. */
void pcs_coord_watch_started(pcs_coord_t *c, pcs_coord_worker_t *w);

// ---- jobs ----
typedef struct pcs_coord_job_desc {
    const char *name;
    const char *request_id; /* "" or NULL: no idempotency */
    const char *owner;      /* the submitter's principal; "" or NULL: none (no token file) */
    uint32_t n_dims;
    const uint32_t *dim_name; /* PCS_MESH_* (planner/mesh.h) */
    const uint32_t *dim_size;
    bool need_cuda;
    const char *transport; /* "gloo" | "nccl" (NULL: gloo); see pcs_coord_job_transport() */
    const char *program;   /* spec.program: NULL or "" = any worker, else only workers that
                            * registered with this program */
    void *spec, *plan;     /* ownership passes to the coordinator, also on failure */
    uint64_t plan_hash;
    uint64_t steps; /* training.steps: reports past it, or `done` before it, are refused (0: no
                     * bound) */
    /* elastic (spec.elastic): a failed generation restarts the job up to max_restarts times in
     * all, at a world size in [min_workers, max_workers] (0: the mesh's) that the mesh allows */
    uint32_t max_restarts, min_workers, max_workers;
} pcs_coord_job_desc_t;

/* The transport a job's ranks use: spec.collectives, where "" and "auto" mean nccl for a cuda job
 * and gloo otherwise. */
const char *pcs_coord_job_transport(const char *backend, const char *collectives);

/* The job submitted earlier with this request id, or NULL. */
pcs_coord_job_t *pcs_coord_job_by_request(pcs_coord_t *c, const char *request_id);
/* New PENDING job (it may start at once if enough IDLE workers exist). World size = product of
 * the mesh sizes; errors: INVALID_ARG (as pcs_coord_check_mesh). */
pcs_status_t pcs_coord_submit(pcs_coord_t *c, const pcs_coord_job_desc_t *d, pcs_coord_job_t **out);
/* Errors: INVALID_ARG (empty id), NOT_FOUND ("no such job", or "finished and forgotten" for a
 * job the history no longer keeps). */
pcs_status_t pcs_coord_lookup_job(pcs_coord_t *c, const char *job_id, pcs_coord_job_t **out);
pcs_coord_job_t *pcs_coord_job_by_number(pcs_coord_t *c, uint32_t number);
/* After a restore: new workers and jobs are numbered from next_worker / next_job on (at least),
 * so an id is never handed out twice even when its history row is gone. INVALID_ARG for a
 * counter no coordinator could have reached (a corrupt store). */
pcs_status_t pcs_coord_reserve_ids(pcs_coord_t *c, uint64_t next_worker, uint64_t next_job);
/* CANCELLED (+ STOP to its workers). A job already CANCELLED is left as it is (PCS_OK: a retry
 * sees its own result); one that SUCCEEDED or FAILED gets PCS_ERR_STATE. */
pcs_status_t pcs_coord_cancel(pcs_coord_t *c, const char *job_id, const char *reason,
                              pcs_coord_job_t **out);
/* Replace a job's plan (the old one goes to free_payload): replan, for a restart at another
 * world size. */
void pcs_coord_job_set_plan(pcs_coord_t *c, pcs_coord_job_t *j, void *plan);
/* A restored job's restarts so far (the budget is per job and survives a coordinator restart). */
void pcs_coord_job_set_restarts(pcs_coord_job_t *j, uint32_t restarts);
/* Release a finished job's plan (free_payload(NULL, plan)): history keeps only the spec, from
 * which the pure planner rebuilds the plan on demand. No-op for PENDING/RUNNING jobs. */
void pcs_coord_job_drop_plan(pcs_coord_t *c, pcs_coord_job_t *j);
/* Release a finished job's spec too (free_payload(spec, NULL)), once a store holds it: RAM then
 * keeps only the job's small record. No-op for PENDING/RUNNING jobs. */
void pcs_coord_job_drop_spec(pcs_coord_t *c, pcs_coord_job_t *j);
/* A job's mesh: pcs_mesh_init's rules (no dims, an unknown or repeated name, a size of 0) and a
 * world of at most PCS_COORD_MAX_WORLD ranks; INVALID_ARG naming the field. */
pcs_status_t pcs_coord_check_mesh(uint32_t n_dims, const uint32_t *dim_name,
                                  const uint32_t *dim_size, pcs_mesh_t *out);

typedef struct pcs_coord_report {
    const char *worker_id, *job_id;
    uint64_t generation;
    uint32_t rank;
    uint64_t step;
    double loss, step_ms, eval_loss, loss_scale;
    uint64_t skipped_steps;
    bool audit_ok, done;
    const char *error;    /* non-empty: the worker failed the job */
    int peer_fault;       /* with error: 1 = peer_rank died, 2 = it made no progress (the
                           * pcs.v1.PeerFault values); 0 = not a peer's fault */
    uint32_t peer_rank;
    uint64_t fingerprint; /* of the step's collective sequence; 0 = not given */
    uint64_t all_gather_bytes, reduce_scatter_bytes, all_reduce_bytes;
    double compute_ms, pipeline_ms; /* pipeline stages: the action list and its compute part */
} pcs_coord_report_t;

/* Record a step report. *directive is PCS_EV_STOP when the worker should stop (job no longer
 * running, or not its job anymore), 0 otherwise; reason gets why. A rank's steps only move
 * forward within a generation: a repeat of its last step (a retry whose reply was lost) is
 * answered OK and counted once, an earlier step is PCS_ERR_STATE; a step past the job's `steps`,
 * or `done` before its last step, is INVALID_ARG. Ranks of one pipeline stage
 * run the same collective sequence, so two of them reporting different fingerprints for the same
 * step fail the job at once, naming both ranks (instead of a hang until the NCCL watchdog). Errors:
 * unknown worker/job (NOT_FOUND), rank or generation that do not match (PCS_ERR_STATE /
 * INVALID_ARG). */
pcs_status_t pcs_coord_report_step(pcs_coord_t *c, const pcs_coord_report_t *r, int *directive,
                                   char *reason, size_t reason_len);

// ---- rendezvous KV ----
pcs_status_t pcs_coord_kv_set(pcs_coord_t *c, const char *job_id, uint64_t generation,
                              const char *key, const void *value, size_t len);
/* Parked KvGets a job may hold: this many per rank, plus 1024 (RESOURCE_EXHAUSTED above). */
#define PCS_COORD_KV_WAITERS_PER_RANK 64

/* *found = 1 with value and len borrowed (valid until the next KV call), 0 not found, or -1 parked
 * (wait_ms > 0 and `waiter` != NULL): on_kv_wake(waiter, ...) runs later from kv_set or tick. */
pcs_status_t pcs_coord_kv_get(pcs_coord_t *c, const char *job_id, uint64_t generation,
                              const char *key, uint32_t wait_ms, void *waiter, int *found,
                              const void **value, size_t *len);
/* Forget a parked waiter (its call went away); no callback. */
void pcs_coord_kv_cancel(pcs_coord_t *c, void *waiter);
/* Wake every parked waiter with `st` and `why` (shutdown). */
void pcs_coord_kv_fail_all(pcs_coord_t *c, pcs_status_t st, const char *why);

// ---- time ----
/* Expire leases and parked KV waits; called from the loop at least every few hundred ms.
 * A gap of more than lease_ms / 2 since the previous tick means the coordinator itself stalled
 * (SIGSTOP, a frozen VM, a long fsync): heartbeats sent meanwhile are still unread in its
 * sockets, so the tick renews every live lease and moves the restored jobs' deadlines by the gap
 * instead of expiring healthy workers (etcd renews its leases after a leader change the same
 * way). Returns the stall in ms (0: none). */
uint64_t pcs_coord_tick(pcs_coord_t *c);

// ---- views ----
/* Iterate by number: returns NULL for numbers never used. Numbers run 1..max. */
uint32_t pcs_coord_max_worker(const pcs_coord_t *c);
pcs_coord_worker_t *pcs_coord_worker_by_number(pcs_coord_t *c, uint32_t number);
uint32_t pcs_coord_max_job(const pcs_coord_t *c);

typedef struct pcs_coord_counts {
    uint32_t workers[6]; /* by pcs_worker_state_t */
    uint32_t jobs[6];    /* by pcs_job_state_t */
} pcs_coord_counts_t;
void pcs_coord_counts(const pcs_coord_t *c, pcs_coord_counts_t *out);

const char *pcs_worker_state_name(pcs_worker_state_t s); /* "IDLE" */
const char *pcs_job_state_name(pcs_job_state_t s);       /* "RUNNING" */
bool pcs_job_state_terminal(pcs_job_state_t s);

// ---- restore (store.c, before serving) ----
/* Recreate a known identity -> id mapping as a GONE worker (it revives on re-register). */
pcs_status_t pcs_coord_restore_worker(pcs_coord_t *c, uint32_t number, const char *identity,
                                      const char *host);
/* A restored worker's credential: the hash its last registration got. The identity stays held
 * for the re-adoption window (readopt_ms from now), so only that process takes it back. */
pcs_status_t pcs_coord_restore_secret(pcs_coord_t *c, uint32_t number, const uint8_t *hash);
/* Recreate a job of a previous life; payload ownership passes. A RUNNING job stays RUNNING in
 * its generation: each worker that re-registers and reports a step of it takes its rank back
 * (training never waits on the coordinator); ranks not back within readopt_ms fail the job. */
pcs_status_t pcs_coord_restore_job(pcs_coord_t *c, uint32_t number, const pcs_coord_job_desc_t *d,
                                   pcs_job_state_t state, const char *reason,
                                   uint64_t created_wall_ms, uint64_t started_wall_ms,
                                   uint64_t finished_wall_ms, uint64_t generation);

/* After pcs_coord_restore_job: the job's progress as stored (step, loss, step time, audit...). */
void pcs_coord_restore_progress(pcs_coord_t *c, pcs_coord_job_t *j, const pcs_coord_progress_t *p);

/* After pcs_coord_restore_job of a RUNNING job: which worker held each rank (n = world_size
 * worker numbers of restored workers; 0 = holder unknown, that rank comes back by step report
 * only) and the pid and incarnation it had when it got the rank (0 = unknown; either array may
 * be NULL).
 * Reserves those workers for the job: a reserved worker that re-registers from the same process
 * (same incarnation; without one, the same pid or an unknown one) takes its rank back at once (ASSIGNED, an assignment event queued), so no
 * PENDING job can take it first; one that re-registers from another process was restarted while the
 * coordinator was down, so the job fails naming it and the worker comes back IDLE. Ranks still
 * away after readopt_ms fail the job as before, naming them. Errors: INVALID_ARG (job not
 * RUNNING and waiting for its ranks, n != world_size, a worker number unknown or listed twice):
 * nothing is reserved and ranks come back only through step reports. Arrays are borrowed. */
pcs_status_t pcs_coord_restore_ranks(pcs_coord_t *c, pcs_coord_job_t *j, const uint32_t *worker,
                                     const uint32_t *pid, const uint64_t *incarnation, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif
