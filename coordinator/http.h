/* /metrics (Prometheus text), /healthz and /readyz over libmicrohttpd. MHD serves from its own
 * thread, so it never touches coordinator state: the loop publishes a text snapshot (copied under
 * a mutex) and the HTTP thread serves the latest copy. */
#ifndef PCS_COORD_HTTP_H
#define PCS_COORD_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_http pcs_http_t;

/* Listen on "host:port" (port 0 = any). Errors: PCS_ERR_INVALID_ARG (bad address),
 * PCS_ERR_SYSTEM (bind failed). */
pcs_status_t pcs_http_start(const char *listen, pcs_http_t **out);
int pcs_http_port(const pcs_http_t *h);
/* Replace the served snapshot (copied). ready: /readyz answers 200 (else 503). Thread-safe. */
void pcs_http_publish(pcs_http_t *h, const char *metrics, size_t len, bool ready);
/* Stop the daemon and free. NULL is fine. */
void pcs_http_stop(pcs_http_t *h);

#ifdef __cplusplus
}
#endif
#endif
