/* pcs-worker's operator endpoint (--metrics-listen): /metrics, /healthz, /readyz over
 * common/http.c, from a thread that publishes pcs_agent_stats every 500 ms.
 *   /healthz  200 while the agent goes round (its heartbeat thread, or the first Register loop,
 *             ran within live_ms); never fails because the coordinator is away, so a coordinator
 *             outage does not make Kubernetes restart every worker.
 *   /readyz   200 while the worker holds a registration the coordinator answered for and is not
 *             leaving; 503 with the reason otherwise (waiting for the coordinator, re-registering,
 *             shutting down).
 *   /metrics  pcs_build_info, process_*, and the pcs_worker_* families (docs/ARCHITECTURE.md). */
#ifndef PCS_WORKER_STATUS_HTTP_H
#define PCS_WORKER_STATUS_HTTP_H

#include "pcs/status.h"
#include "worker/agent.h"

typedef struct pcs_worker_http pcs_worker_http_t;

/* Serve on `listen` (host:port, port 0 = any); write the bound port to port_file unless it is
 * NULL or empty. live_ms: how long the agent may not go round before /healthz fails. */
pcs_status_t pcs_worker_http_start(pcs_agent_t *a, const char *listen, const char *port_file,
                                   unsigned live_ms, pcs_worker_http_t **out);
/* The exposition of `st` (start_wall_s: process start, Unix seconds) into a malloc'd string. */
char *pcs_worker_metrics_text(const pcs_agent_stats_t *st, double start_wall_s, size_t *len);
/* Stop the publisher and the server. NULL is fine. */
void pcs_worker_http_stop(pcs_worker_http_t *w);

#endif
