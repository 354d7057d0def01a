/* The worker agent (pcs-worker's life cycle): Register, Heartbeat on its own thread,
 * WatchAssignment on its own thread (a broken stream is re-opened with backoff; a coordinator that
 * restarts is re-registered with the same identity), run each assigned job with the training loop,
 * ReportStep asynchronously from a reporter thread, Deregister on exit. */
#ifndef PCS_WORKER_AGENT_H
#define PCS_WORKER_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_agent pcs_agent_t;
struct Pcs__V1__Assignment;
struct Pcs__V1__StepReport;
struct pcs_kv;

/* A job runner other than the built-in training loop (the C API): runs on the agent's main loop
 * thread with the assignment and a KV store scoped to it (both valid until it returns); sends its
 * reports with pcs_agent_report(). A non-OK return is reported to the coordinator as the job's
 * error (PCS_ERR_CANCELLED is not). */
typedef pcs_status_t (*pcs_agent_job_fn)(void *ctx, pcs_agent_t *a,
                                         const struct Pcs__V1__Assignment *as, struct pcs_kv *kv);

typedef struct pcs_agent_config {
    const char *coordinator;  /* "127.0.0.1:7070" */
    const char *identity;     /* idempotency key for Register; NULL = "<host>:<pid>" */
    const char *backend;      /* kernels backend this worker offers: "cpu" (default) | "cuda" */
    const char *coll;         /* collectives it offers: "auto" (default: nccl + gloo on cuda,
                               * gloo on cpu) | "nccl" | "gloo"; the job's spec picks one */
    int device;               /* cuda device ordinal; -1 = auto: $LOCAL_RANK (torchrun's) modulo
                               * the visible devices, else 0 */
    const char *hostname;     /* transport address peers use, "127.0.0.1" */
    uint32_t rpc_timeout_ms;  /* unary RPC deadline; 0 = 5000 */
    uint32_t coll_timeout_ms; /* collective timeout; 0 = 30000 */
    uint32_t heartbeat_ms;    /* 0 = the interval the coordinator returns */
    uint32_t max_jobs;        /* exit after this many jobs (0 = serve until stopped) */
    uint32_t reconnect_max_ms; /* longest wait between connection attempts to the coordinator;
                                * 0 = PCS_RPC_RECONNECT_MAX_MS (1 s) */
    uint32_t flush_ms;         /* at exit, how long queued step reports may wait for a coordinator
                                * that is away; 0 = 30000 */
    const char *report_dir;   /* also append every StepReport to <dir>/<job>.rank<R>.reports
                               * (io/report.h); NULL = off */
    uint64_t inject_inf_step; /* test hook, see pcs_train_config_t */
    uint32_t inject_inf_rank;
    uint64_t die_at_checkpoint; /* test hook, see pcs_train_config_t */
    uint32_t die_rank;
    uint32_t step_pause_ms; /* test hook, see pcs_train_config_t */
    uint32_t blas_threads;  /* see pcs_train_config_t */
    /* Where a job's paths may lead (DESIGN.md §10): data.file, init.from and checkpoint.dir
     * resolve beneath these directories (opened at create: a missing one fails it). NULL or ""
     * = `root`; `root` NULL or "" = the working directory. */
    const char *root, *data_root, *init_root, *checkpoint_root;
    /* RegisterRequest.program: what this process is, so that a job naming its program
     * (spec.program) comes only here. NULL = "pcs-worker" with the built-in loop, "" (not said)
     * with a job_fn; else [A-Za-z0-9._-]{1,64}. */
    const char *program;
    pcs_agent_job_fn job_fn; /* NULL = the built-in training loop (pcs-worker) */
    void *job_ctx;
} pcs_agent_config_t;

/* Strings are copied. Nothing is contacted until run(), but the backend is checked here: "cuda"
 * without a device or a build with CUDA, an unknown name, a device out of range or "nccl" on a
 * cpu worker fail with PCS_ERR_UNSUPPORTED / PCS_ERR_INVALID_ARG and a message. */
pcs_status_t pcs_agent_create(const pcs_agent_config_t *cfg, pcs_agent_t **out);
/* Register (retrying while the coordinator is unreachable), then serve assignments until
 * pcs_agent_stop() or max_jobs jobs ran; wait up to flush_ms for queued reports, Deregister and
 * return. From the moment it leaves, the agent never registers again: a coordinator that answers
 * "re-register" to a late heartbeat gets no phantom worker. */
pcs_status_t pcs_agent_run(pcs_agent_t *a);
/* The device ordinal resolved at create (0 on the cpu backend). */
int pcs_agent_device(const pcs_agent_t *a);
/* Ask run() to return: aborts a running job. Async-signal-safe. */
void pcs_agent_stop(pcs_agent_t *a);
void pcs_agent_destroy(pcs_agent_t *a);

/* What the worker's /metrics, /healthz and /readyz show (worker/status_http.c). */
typedef struct pcs_agent_stats {
    int registered;             /* holds a registration the coordinator answered for */
    uint64_t heartbeat_age_ms;  /* since the coordinator last answered a heartbeat or Register
                                   (UINT64_MAX: never) */
    uint64_t loop_age_ms;       /* since the heartbeat thread (or the first Register loop) last
                                   went round: large only when the agent is wedged */
    uint64_t heartbeat_failures, registrations;
    uint64_t jobs_succeeded, jobs_failed, jobs_stopped;
    uint64_t reports_sent, reports_queued;
    uint64_t all_gather_bytes, reduce_scatter_bytes, all_reduce_bytes; /* all jobs */
    char worker_id[64], identity[128], backend[16];
    char job_id[64]; /* the running job ("" if idle), then its rank, generation and last report */
    uint32_t rank;
    uint64_t generation, step;
    double loss, step_ms;
    int leaving; /* Deregister under way: not ready */
} pcs_agent_stats_t;

void pcs_agent_stats(pcs_agent_t *a, pcs_agent_stats_t *out);

/* Queue a step report of the running job (copied; sent in order by the reporter thread). */
void pcs_agent_report(pcs_agent_t *a, const struct Pcs__V1__StepReport *r);
/* While a custom job runs: what to call when the coordinator stops it or the agent is stopped
 * (wakes its collectives). NULL clears. Thread-safe. */
void pcs_agent_set_abort(pcs_agent_t *a, void (*fn)(void *ctx, const char *reason), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
