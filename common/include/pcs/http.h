/* The operator endpoints of a pcs process over libmicrohttpd: /metrics (Prometheus text),
 * /healthz (liveness) and /readyz (readiness). MHD serves from its own thread, so it never touches
 * the process's state: the owner publishes a snapshot (copied under a mutex) with its liveness and
 * readiness, and the HTTP thread serves the latest copy. A snapshot older than `stale_ms` makes
 * /healthz fail: the thread that publishes it is wedged, and a liveness probe should restart the
 * process. Used by pcs-coordinator and pcs-worker; the helpers below write the families both
 * export. */
#ifndef PCS_HTTP_H
#define PCS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_http pcs_http_t;

/* Listen on "host:port" (port 0 = any; host an IPv4 address or "localhost"). `what` names the
 * option in errors ("metrics-listen"). stale_ms: /healthz fails once the last publish is older
 * (0 = never). Errors: PCS_ERR_INVALID_ARG (bad address), PCS_ERR_SYSTEM (bind failed). */
pcs_status_t pcs_http_start(const char *listen, const char *what, unsigned stale_ms,
                            pcs_http_t **out);
int pcs_http_port(const pcs_http_t *h);
/* Replace the served snapshot (copied). live: /healthz answers 200 (else 503 with `why`); ready:
 * /readyz answers 200 (else 503 with `why`). why may be NULL. Thread-safe. */
void pcs_http_publish(pcs_http_t *h, const char *metrics, size_t len, bool live, bool ready,
                      const char *why);
/* Stop the daemon and free. NULL is fine. */
void pcs_http_stop(pcs_http_t *h);

/* `name{labels} value` (labels NULL or "" for none). */
void pcs_metrics_line(FILE *f, const char *name, const char *labels, double v);
/* The process_* family every Prometheus client library exports (from /proc/self): CPU seconds,
 * resident and virtual memory, open and max fds, start time (start_wall_s, Unix seconds). */
void pcs_metrics_process(FILE *f, double start_wall_s);
/* pcs_build_info{version,git_sha} 1, with `who` in its help text ("coordinator"). */
void pcs_metrics_build_info(FILE *f, const char *who);

/* Write `port` to `path` atomically (a temp file renamed over it: a test or script polling for
 * the file reads it whole). `flag` names the option in errors. */
pcs_status_t pcs_port_file_write(const char *flag, const char *path, int port);

#ifdef __cplusplus
}
#endif
#endif
