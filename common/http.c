/* /metrics, /healthz, /readyz over libmicrohttpd (see pcs/http.h). MHD's internal polling
 * thread serves a copy of the last published snapshot; the owner's state is never read here. */
#include "pcs/http.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/version.h"

struct pcs_http {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    char *metrics;
    size_t len;
    bool live, ready;
    char why[256];
    unsigned stale_ms;
    uint64_t published_ms; /* pcs_now_ms() of the last publish */
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
    if (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0) {
        bool health = strcmp(url, "/healthz") == 0;
        char body[320];
        pthread_mutex_lock(&h->mu);
        uint64_t age = pcs_now_ms() - h->published_ms;
        bool ok = health ? h->live : h->ready;
        if (h->stale_ms && age > h->stale_ms && health) {
            ok = false;
            snprintf(body, sizeof body, "not live: no state published for %llu ms\n",
                     (unsigned long long)age);
        } else {
            snprintf(body, sizeof body, "%s%s%s\n",
                     ok ? (health ? "ok" : "ready") : (health ? "not live" : "not ready"),
                     !ok && h->why[0] ? ": " : "", !ok ? h->why : "");
        }
        pthread_mutex_unlock(&h->mu);
        return respond(conn, ok ? 200 : 503, "text/plain", body, strlen(body));
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

pcs_status_t pcs_http_start(const char *listen, const char *what, unsigned stale_ms,
                            pcs_http_t **out)
{
    *out = NULL;
    char host[256];
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s '%s': expected host:port", what,
                             listen ? listen : "");
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s '%s': bad port", what, listen);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    const char *h4 = (!*host || strcmp(host, "localhost") == 0) ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h4, &sa.sin_addr) != 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s '%s': host must be an IPv4 address", what, listen);
    pcs_http_t *h;
    PCS_CHECK(pcs_calloc(1, sizeof *h, (void **)&h));
    pthread_mutex_init(&h->mu, NULL);
    h->stale_ms = stale_ms;
    h->published_ms = pcs_now_ms();
    snprintf(h->why, sizeof h->why, "starting");
    /* MHD_USE_AUTO: epoll or poll, never select(), whose fd limit of 1024 a coordinator with
     * a thousand gRPC connections passes (a probe on fd 1024 would fail and restart it) */
    h->d = MHD_start_daemon(MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0,
                            NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        pcs_status_t st = pcs_set_error(PCS_ERR_SYSTEM,
                                        "%s '%s': cannot serve (port in use?)", what, listen);
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

void pcs_http_publish(pcs_http_t *h, const char *metrics, size_t len, bool live, bool ready,
                      const char *why)
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
    h->live = live;
    h->ready = ready;
    snprintf(h->why, sizeof h->why, "%s", why ? why : "");
    h->published_ms = pcs_now_ms();
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

// ---- the families every pcs process exports ----

void pcs_metrics_line(FILE *f, const char *name, const char *labels, double v)
{
    fprintf(f, "%s%s%s%s %.10g\n", name, labels && *labels ? "{" : "", labels ? labels : "",
            labels && *labels ? "}" : "", v);
}

void pcs_metrics_process(FILE *f, double start_s)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        fprintf(f, "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
                   "seconds.\n# TYPE process_cpu_seconds_total counter\n");
        pcs_metrics_line(f, "process_cpu_seconds_total", NULL, cpu);
    }
    long pages = 0, rss = 0, psz = sysconf(_SC_PAGESIZE);
    FILE *sm = fopen("/proc/self/statm", "r");
    if (sm) {
        if (fscanf(sm, "%ld %ld", &pages, &rss) == 2 && psz > 0) {
            fprintf(f, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                       "# TYPE process_resident_memory_bytes gauge\n");
            pcs_metrics_line(f, "process_resident_memory_bytes", NULL, (double)rss * (double)psz);
            fprintf(f, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                       "# TYPE process_virtual_memory_bytes gauge\n");
            pcs_metrics_line(f, "process_virtual_memory_bytes", NULL,
                             (double)pages * (double)psz);
        }
        fclose(sm);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long n = -1; /* the directory's own descriptor */
        while (readdir(d))
            n++;
        closedir(d);
        fprintf(f, "# HELP process_open_fds Number of open file descriptors.\n"
                   "# TYPE process_open_fds gauge\n");
        pcs_metrics_line(f, "process_open_fds", NULL, (double)(n > 2 ? n - 2 : 0)); /* . .. */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        fprintf(f, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                   "# TYPE process_max_fds gauge\n");
        pcs_metrics_line(f, "process_max_fds", NULL, (double)rl.rlim_cur);
    }
    fprintf(f, "# HELP process_start_time_seconds Start time of the process since unix epoch in "
               "seconds.\n# TYPE process_start_time_seconds gauge\n");
    pcs_metrics_line(f, "process_start_time_seconds", NULL, start_s);
}

void pcs_metrics_build_info(FILE *f, const char *who)
{
    char lab[256];
    fprintf(f, "# HELP pcs_build_info The %s's version and commit (always 1).\n"
               "# TYPE pcs_build_info gauge\n",
            who);
    snprintf(lab, sizeof lab, "version=\"%s\",git_sha=\"%s\"", PCS_VERSION_STRING, PCS_GIT_SHA);
    pcs_metrics_line(f, "pcs_build_info", lab, 1);
}

pcs_status_t pcs_port_file_write(const char *flag, const char *path, int port)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: path too long", flag);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return pcs_set_error(PCS_ERR_SYSTEM, "%s: cannot write %s", flag, tmp);
    fprintf(f, "%d\n", port);
    /* rename makes the file appear complete: tests poll for it */
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        (void)remove(tmp);
        return pcs_set_error(PCS_ERR_SYSTEM, "%s: cannot write %s", flag, path);
    }
    return PCS_OK;
}
