/* The worker agent (pcs-worker's life cycle): Register, Heartbeat on its own thread,
 * WatchAssignment on its own thread (a broken stream is re-opened with backoff; a coordinator that
 * restarts is re-registered with the same identity), run each assigned job with the training loop,
 * ReportStep asynchronously from a reporter thread, Deregister on exit. */
#ifndef PCS_AGENT_H
#define PCS_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_agent pcs_agent_t;

/* Path of a rank's report file in report_dir (see pcs_agent_config_t.report_dir). */
void pcs_agent_report_path(const char *dir, const char *job_id, uint32_t rank, char *buf,
                           size_t n);

typedef struct pcs_agent_config {
    const char *coordinator;   /* "127.0.0.1:7070" */
    const char *identity;      /* idempotency key for Register; NULL = "<host>:<pid>" */
    const char *backend;       /* kernels backend, "cpu" */
    const char *coll;          /* collectives backend, "gloo" */
    const char *hostname;      /* transport address peers use, "127.0.0.1" */
    uint32_t rpc_timeout_ms;   /* unary RPC deadline; 0 = 5000 */
    uint32_t coll_timeout_ms;  /* collective timeout; 0 = 30000 */
    uint32_t heartbeat_ms;     /* 0 = the interval the coordinator returns */
    uint32_t max_jobs;         /* exit after this many jobs (0 = serve until stopped) */
    const char *report_dir;    /* also append every StepReport to <dir>/<job>.rank<R>.reports
                                * (u32 little-endian length + packed StepReport); NULL = off */
    uint64_t inject_inf_step;  /* test hook, see pcs_train_config_t */
    uint32_t inject_inf_rank;
} pcs_agent_config_t;

/* Strings are copied. Nothing is contacted until run(). */
pcs_status_t pcs_agent_create(const pcs_agent_config_t *cfg, pcs_agent_t **out);
/* Register (retrying while the coordinator is unreachable), then serve assignments until
 * pcs_agent_stop() or max_jobs jobs ran; Deregister before returning. */
pcs_status_t pcs_agent_run(pcs_agent_t *a);
/* Ask run() to return: aborts a running job. Async-signal-safe. */
void pcs_agent_stop(pcs_agent_t *a);
void pcs_agent_destroy(pcs_agent_t *a);

#ifdef __cplusplus
}
#endif
#endif
