/* The coordinator process minus main(): the RPC method table and handlers (server.c) around the
 * pure state machine (coord.c), plus the GetStatus text (status_text.c). main.c only parses the
 * config, installs signal handlers and calls create/run/destroy. */
#ifndef PCS_COORD_SERVER_H
#define PCS_COORD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"
#include "pcs/config.h"
#include "pcs/rpc.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_server_config {
    const char *listen;             /* "127.0.0.1:0" */
    size_t max_message_bytes;       /* 0 = 4 MiB */
    uint32_t heartbeat_interval_ms; /* 0 = 1000 */
    uint32_t lease_ms;              /* 0 = 10000 */
    uint32_t readopt_ms;            /* restored RUNNING jobs wait this long for their ranks;
                                     * 0 = lease_ms + 5000 */
    uint32_t step_timeout_factor;   /* progress watchdog (pcs_coord_config_t); 0 = defaults */
    uint32_t step_timeout_min_ms;
    uint32_t first_step_timeout_ms;
    uint32_t kv_max_key_bytes;
    uint32_t kv_max_value_bytes;
    uint64_t kv_max_job_bytes;
    uint64_t kv_max_total_bytes;   /* every job's KV together; 0 = 256 MiB */
    size_t max_spec_bytes;         /* largest packed JobSpec; 0 = max_message_bytes / 4 */
    uint32_t max_finished_jobs;    /* history kept; 0 = 10000 */
    uint32_t elastic_wait_ms;      /* a restarted job waits this long for its full world size
                                    * before it starts smaller; 0 = 30000 */
    const char *db_path;           /* SQLite file; NULL, "" or ":memory:" = no persistence */
    bool store_sync_normal;        /* synchronous=NORMAL (durable across a process crash only)
                                    * instead of FULL (across a power loss) */
    const char *metrics_listen;    /* "127.0.0.1:9090"; NULL or "" = no HTTP endpoint */
    const char *metrics_port_file; /* written with the bound metrics port (may be NULL) */
    const pcs_config_t *config;    /* borrowed, for GetStatus "# Config" (may be NULL) */
    const pcs_rpc_tls_t *tls;      /* NULL: plaintext; borrowed for pcs_server_create only */
    const char *token_file;        /* `role token [name]` lines; NULL or "": no token checks */
    bool worker_cert_identity_off; /* with mTLS (tls->ca_file): do not require that a worker's
                                    * client certificate names its identity (shared worker
                                    * certificates; the worker secret still binds each call) */
    uint32_t max_watch_streams;    /* open Health/Watch streams at once; 0 = 1024. Above it a
                                    * Watch gets RESOURCE_EXHAUSTED (WatchAssignment is one per
                                    * worker: a newer one supersedes the older) */
} pcs_server_config_t;

typedef struct pcs_server pcs_server_t;

/* Bind the gRPC port (and the metrics port), open the store and restore its state. */
pcs_status_t pcs_server_create(const pcs_server_config_t *cfg, pcs_server_t **out);
int pcs_server_port(const pcs_server_t *s);
int pcs_server_metrics_port(const pcs_server_t *s);
/* Serve until pcs_server_request_stop(); then finish gracefully: open streams and parked calls
 * end with UNAVAILABLE "coordinator shutting down", health watchers see NOT_SERVING. */
pcs_status_t pcs_server_run(pcs_server_t *s);
/* Async-signal-safe: sets a flag the loop reads at its next tick. */
void pcs_server_request_stop(pcs_server_t *s);
void pcs_server_destroy(pcs_server_t *s);

/* ---- GetStatus text (status_text.c) ---- */
typedef struct pcs_status_info {
    uint64_t uptime_ms;
    const char *listen;
    int port;
    int metrics_port;
    const char *db_path;
    const char *store_error; /* why the last commit failed; NULL or "" when it worked */
    uint64_t commits, commit_failures;
    uint64_t stalls; /* ticks that found the loop stalled for over half a lease */
    const pcs_config_t *config; /* may be NULL */
} pcs_status_info_t;

/* redis-INFO style text: "# Coordinator", "# Workers", "# Jobs", "# Config" sections of
 * "key:value" lines. *out is malloc'd; caller frees. */
pcs_status_t pcs_status_text(pcs_coord_t *c, const pcs_status_info_t *info, char **out);

#ifdef __cplusplus
}
#endif
#endif
