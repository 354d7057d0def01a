/* /metrics, /healthz, /readyz over libmicrohttpd (see http.h). MHD's internal polling thread
 * serves a copy of the last published snapshot; the coordinator's state is never read here. */
#include "coordinator/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "pcs/log.h"
#include "pcs/mem.h"

struct pcs_http {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    char *metrics;
    size_t len;
    bool ready;
};

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *type,
                               const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls)
{
    (void)version, (void)upload, (void)upload_size, (void)req_cls;
    pcs_http_t *h = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond(conn, 405, "text/plain", "method not allowed\n", 19);
    if (strcmp(url, "/healthz") == 0)
        return respond(conn, 200, "text/plain", "ok\n", 3);
    if (strcmp(url, "/readyz") == 0) {
        pthread_mutex_lock(&h->mu);
        bool ready = h->ready;
        pthread_mutex_unlock(&h->mu);
        return ready ? respond(conn, 200, "text/plain", "ready\n", 6)
                     : respond(conn, 503, "text/plain", "not ready\n", 10);
    }
    if (strcmp(url, "/metrics") == 0) {
        pthread_mutex_lock(&h->mu);
        enum MHD_Result r = respond(conn, 200, "text/plain; version=0.0.4; charset=utf-8",
                                    h->metrics ? h->metrics : "", h->metrics ? h->len : 0);
        pthread_mutex_unlock(&h->mu);
        return r;
    }
    return respond(conn, 404, "text/plain", "not found\n", 10);
}

pcs_status_t pcs_http_start(const char *listen, pcs_http_t **out)
{
    *out = NULL;
    char host[256];
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "metrics-listen '%s': expected host:port",
                             listen ? listen : "");
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "metrics-listen '%s': bad port", listen);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    const char *h4 = (!*host || strcmp(host, "localhost") == 0) ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h4, &sa.sin_addr) != 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "metrics-listen '%s': host must be an IPv4 address", listen);
    pcs_http_t *h;
    PCS_CHECK(pcs_calloc(1, sizeof *h, (void **)&h));
    pthread_mutex_init(&h->mu, NULL);
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                            handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        pcs_status_t st = pcs_set_error(PCS_ERR_SYSTEM,
                                        "metrics-listen '%s': cannot serve (port in use?)", listen);
        PCS_WARN(PCS_SUB_INIT, "%s", pcs_last_error());
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? (int)di->port : (int)port;
    *out = h;
    return PCS_OK;
}

int pcs_http_port(const pcs_http_t *h)
{
    return h ? h->port : 0;
}

void pcs_http_publish(pcs_http_t *h, const char *metrics, size_t len, bool ready)
{
    if (!h)
        return;
    char *copy = malloc(len + 1);
    if (copy) {
        memcpy(copy, metrics, len);
        copy[len] = 0;
    }
    pthread_mutex_lock(&h->mu);
    if (copy) {
        free(h->metrics);
        h->metrics = copy;
        h->len = len;
    }
    h->ready = ready;
    pthread_mutex_unlock(&h->mu);
}

void pcs_http_stop(pcs_http_t *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    free(h->metrics);
    free(h);
}
