/* pcs-coordinator: option table -> pcs_server_create -> serve until SIGTERM/SIGINT -> graceful
 * exit 0. Everything else lives in server.c (handlers) and coord.c (state machine). */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pcs/config.h"
#include "pcs/http.h"
#include "pcs/log.h"
#include "pcs/version.h"
#include "coordinator/server.h"

static const pcs_opt_t options[] = {
    {"listen", PCS_OPT_STRING, "127.0.0.1:7070", 0, 0,
     "gRPC address: host:port (port 0 = any free port) or unix:/path"},
    {"insecure", PCS_OPT_BOOL, "false", 0, 0,
     "allow plaintext gRPC (without --tls-cert) and plaintext /metrics on a non-loopback "
     "address"},
    {"tls-cert", PCS_OPT_STRING, "", 0, 0, "server certificate chain (PEM): serve gRPC over TLS"},
    {"tls-key", PCS_OPT_STRING, "", 0, 0, "private key of --tls-cert (PEM)"},
    {"tls-client-ca", PCS_OPT_STRING, "", 0, 0,
     "CA bundle (PEM): require and verify worker/client certificates (mTLS)"},
    {"worker-cert-identity", PCS_OPT_BOOL, "true", 0, 0,
     "with --tls-client-ca: a worker registers only as an identity its client certificate names "
     "(false: shared worker certificates; the per-worker secret still binds every call)"},
    {"token-file", PCS_OPT_STRING, "", 0, 0,
     "bearer tokens by role: `role token [name]` lines (viewer|submitter|worker|admin); empty: "
     "none"},
    {"port-file", PCS_OPT_STRING, "", 0, 0, "write the bound gRPC port to this file"},
    {"heartbeat-interval-ms", PCS_OPT_U32, "1000", 10, 60000, "worker heartbeat period"},
    {"lease-ms", PCS_OPT_U32, "10000", 50, 600000,
     "a worker without a heartbeat for this long is LOST"},
    {"readopt-ms", PCS_OPT_U32, "0", 0, 3600000,
     "after a restart, how long a RUNNING job waits for its ranks (0 = lease-ms + 5000)"},
    {"step-timeout-factor", PCS_OPT_U32, "10", 1, 1000000,
     "a rank without a step report for this many step times fails its job (watchdog)"},
    {"step-timeout-min-ms", PCS_OPT_U32, "300000", 100, 86400000,
     "the watchdog's limit is never below this (checkpoints and evals make slow steps)"},
    {"first-step-timeout-ms", PCS_OPT_U32, "900000", 100, 86400000,
     "a rank without its first step report this long after the start fails its job"},
    {"elastic-wait-ms", PCS_OPT_U32, "30000", 0, 86400000,
     "a job that restarts (elastic.max_restarts) waits this long for its full world size before "
     "it starts with fewer workers (within elastic.min_workers)"},
    {"kv-max-key-bytes", PCS_OPT_U32, "256", 1, 65536, "rendezvous KV: longest key"},
    {"kv-max-value-bytes", PCS_OPT_U32, "65536", 1, 67108864, "rendezvous KV: largest value"},
    {"kv-max-job-bytes", PCS_OPT_U64, "16777216", 1, 17179869184.0,
     "rendezvous KV: keys + values per job"},
    {"kv-max-total-bytes", PCS_OPT_U64, "268435456", 1, 68719476736.0,
     "rendezvous KV: keys + values of all jobs together"},
    {"max-spec-bytes", PCS_OPT_U32, "0", 0, 1073741824,
     "largest job spec accepted, packed (0 = a quarter of max-message-bytes)"},
    {"max-finished-jobs", PCS_OPT_U32, "10000", 1, 100000000,
     "job history: finished jobs kept (older ones are forgotten, their ids never reused)"},
    {"max-message-bytes", PCS_OPT_U32, "4194304", 1024, 1073741824,
     "largest request accepted (RESOURCE_EXHAUSTED above)"},
    {"max-watch-streams", PCS_OPT_U32, "1024", 1, 1000000,
     "open grpc.health.v1 Health/Watch streams at once (RESOURCE_EXHAUSTED above)"},
    {"db", PCS_OPT_STRING, "", 0, 0,
     "SQLite file for job history and worker ids (empty: --state-dir, else in memory)"},
    {"state-dir", PCS_OPT_STRING, "", 0, 0, "directory for coordinator.db when --db is empty"},
    {"store-sync", PCS_OPT_STRING, "full", 0, 0,
     "full: a reply means the change survives a power loss | normal: a process crash only"},
    {"metrics-listen", PCS_OPT_STRING, "", 0, 0,
     "HTTP /metrics /healthz /readyz on host:port (empty: off; port 0 = any)"},
    {"metrics-port-file", PCS_OPT_STRING, "", 0, 0, "write the bound metrics port to this file"},
    {"log-level", PCS_OPT_STRING, "", 0, 0,
     "error|warn|info|debug|trace (empty: PCS_LOG_LEVEL or info)"},
};
#define N_OPTIONS (sizeof options / sizeof *options)

static pcs_server_t *g_server;

static void on_signal(int sig)
{
    (void)sig;
    pcs_server_request_stop(g_server); /* sets a sig_atomic_t flag only */
}

/* The host must be a loopback literal: a prefix test let "127.example.com:7070", a name that
 * resolves anywhere, serve plaintext without --insecure. */
static int loopback(const char *listen)
{
    if (strncmp(listen, "unix:", 5) == 0)
        return 1;
    if (strncmp(listen, "localhost:", 10) == 0 || strncmp(listen, "[::1]:", 6) == 0)
        return 1;
    const char *colon = strrchr(listen, ':');
    size_t n = colon ? (size_t)(colon - listen) : strlen(listen);
    char host[64];
    struct in_addr a;
    if (n >= sizeof host)
        return 0;
    memcpy(host, listen, n);
    host[n] = '\0';
    return inet_aton(host, &a) != 0 && (ntohl(a.s_addr) >> 24) == 127;
}

int main(int argc, char **argv)
{
    pcs_log_init(PCS_LOG_INFO);
    pcs_log_set_role("coord");
    pcs_config_t *cfg = NULL;
    if (pcs_config_load(options, N_OPTIONS, argc, argv, &cfg) != PCS_OK) {
        fprintf(stderr, "pcs-coordinator: %s\n", pcs_last_error());
        return 2;
    }
    if (pcs_config_help_requested(cfg)) {
        pcs_config_print_help(options, N_OPTIONS, "pcs-coordinator [--key value ...]");
        pcs_config_free(cfg);
        return 0;
    }
    const char *lvl = pcs_config_str(cfg, "log-level");
    if (lvl && *lvl) {
        int l = pcs_log_level_parse(lvl);
        if (l < 0) {
            fprintf(stderr,
                    "pcs-coordinator: log-level '%s': expected error|warn|info|debug|trace\n", lvl);
            pcs_config_free(cfg);
            return 2;
        }
        pcs_log_set_level((pcs_log_level_t)l);
    }
    const char *sync = pcs_config_str(cfg, "store-sync");
    if (strcmp(sync, "full") != 0 && strcmp(sync, "normal") != 0) {
        fprintf(stderr, "pcs-coordinator: store-sync '%s': expected full or normal\n", sync);
        pcs_config_free(cfg);
        return 2;
    }
    const char *listen = pcs_config_str(cfg, "listen");
    const char *tls_cert = pcs_config_str(cfg, "tls-cert");
    const char *tls_key = pcs_config_str(cfg, "tls-key");
    const char *tls_ca = pcs_config_str(cfg, "tls-client-ca");
    if ((*tls_cert != 0) != (*tls_key != 0) || (*tls_ca && !*tls_cert)) {
        fprintf(stderr, "pcs-coordinator: tls-cert and tls-key go together, and tls-client-ca "
                        "needs them\n");
        pcs_config_free(cfg);
        return 2;
    }
    pcs_rpc_tls_t tls = {
        .cert_file = tls_cert, .key_file = tls_key, .ca_file = *tls_ca ? tls_ca : NULL};
    if (!loopback(listen) && !*tls_cert && !pcs_config_bool(cfg, "insecure")) {
        fprintf(stderr,
                "pcs-coordinator: listen %s: plaintext gRPC on a non-loopback address needs "
                "--tls-cert/--tls-key or --insecure\n",
                listen);
        pcs_config_free(cfg);
        return 2;
    }
    /* /metrics is plaintext HTTP (job names, worker identities): the same rule as --listen */
    const char *metrics = pcs_config_str(cfg, "metrics-listen");
    if (*metrics && !loopback(metrics) && !pcs_config_bool(cfg, "insecure")) {
        fprintf(stderr,
                "pcs-coordinator: metrics-listen %s: plaintext HTTP on a non-loopback address "
                "needs --insecure (scrape it on 127.0.0.1, or through a sidecar or a "
                "NetworkPolicy you control)\n",
                metrics);
        pcs_config_free(cfg);
        return 2;
    }
    if (*pcs_config_str(cfg, "token-file") && !*tls_cert && !loopback(listen))
        fprintf(stderr,
                "pcs-coordinator: WARNING: bearer tokens over plaintext gRPC on %s (--insecure): "
                "anyone on the path can read and replay them; serve TLS (--tls-cert/--tls-key)\n",
                listen);
    /* cross-field rule: a lease shorter than the heartbeat period expires healthy workers */
    if (pcs_config_u32(cfg, "heartbeat-interval-ms") >= pcs_config_u32(cfg, "lease-ms")) {
        fprintf(stderr,
                "pcs-coordinator: heartbeat-interval-ms (%u, %s) must be less than lease-ms "
                "(%u, %s)\n",
                pcs_config_u32(cfg, "heartbeat-interval-ms"),
                pcs_config_origin(cfg, "heartbeat-interval-ms"), pcs_config_u32(cfg, "lease-ms"),
                pcs_config_origin(cfg, "lease-ms"));
        pcs_config_free(cfg);
        return 2;
    }
    /* and a re-adoption window shorter than a lease plus the workers' reconnect backoff fails
     * jobs whose workers are merely slow to notice the restart */
    uint32_t readopt = pcs_config_u32(cfg, "readopt-ms");
    if (readopt && (uint64_t)readopt < (uint64_t)pcs_config_u32(cfg, "lease-ms") +
                                           PCS_RPC_RECONNECT_MAX_MS) {
        fprintf(stderr,
                "pcs-coordinator: readopt-ms (%u, %s) must be 0 or at least lease-ms + %u (the "
                "workers' default reconnect backoff): %u\n",
                readopt, pcs_config_origin(cfg, "readopt-ms"), PCS_RPC_RECONNECT_MAX_MS,
                pcs_config_u32(cfg, "lease-ms") + PCS_RPC_RECONNECT_MAX_MS);
        pcs_config_free(cfg);
        return 2;
    }
    if (pcs_config_u32(cfg, "max-spec-bytes") &&
        pcs_config_u32(cfg, "max-spec-bytes") >= pcs_config_u32(cfg, "max-message-bytes")) {
        fprintf(stderr,
                "pcs-coordinator: max-spec-bytes (%u, %s) must be less than max-message-bytes "
                "(%u, %s): the SubmitJob request carries the spec\n",
                pcs_config_u32(cfg, "max-spec-bytes"), pcs_config_origin(cfg, "max-spec-bytes"),
                pcs_config_u32(cfg, "max-message-bytes"),
                pcs_config_origin(cfg, "max-message-bytes"));
        pcs_config_free(cfg);
        return 2;
    }
    char db[4096] = "";
    const char *state_dir = pcs_config_str(cfg, "state-dir");
    if (*pcs_config_str(cfg, "db"))
        snprintf(db, sizeof db, "%s", pcs_config_str(cfg, "db"));
    else if (state_dir && *state_dir) {
        if (mkdir(state_dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "pcs-coordinator: state-dir %s: %s\n", state_dir, strerror(errno));
            pcs_config_free(cfg);
            return 1;
        }
        snprintf(db, sizeof db, "%s/coordinator.db", state_dir);
    }

    PCS_INFO(PCS_SUB_INIT, "pcs-coordinator %s (git %s) starting: listen %s, state %s",
             PCS_VERSION_STRING, PCS_GIT_SHA, listen, *db ? db : "in memory");
    pcs_config_log_nondefault(cfg);

    pcs_server_config_t sc = {.listen = listen,
                              .max_message_bytes = pcs_config_u32(cfg, "max-message-bytes"),
                              .heartbeat_interval_ms = pcs_config_u32(cfg, "heartbeat-interval-ms"),
                              .lease_ms = pcs_config_u32(cfg, "lease-ms"),
                              .readopt_ms = pcs_config_u32(cfg, "readopt-ms"),
                              .step_timeout_factor = pcs_config_u32(cfg, "step-timeout-factor"),
                              .step_timeout_min_ms = pcs_config_u32(cfg, "step-timeout-min-ms"),
                              .first_step_timeout_ms =
                                  pcs_config_u32(cfg, "first-step-timeout-ms"),
                              .kv_max_key_bytes = pcs_config_u32(cfg, "kv-max-key-bytes"),
                              .kv_max_value_bytes = pcs_config_u32(cfg, "kv-max-value-bytes"),
                              .kv_max_job_bytes = pcs_config_u64(cfg, "kv-max-job-bytes"),
                              .kv_max_total_bytes = pcs_config_u64(cfg, "kv-max-total-bytes"),
                              .max_spec_bytes = pcs_config_u32(cfg, "max-spec-bytes"),
                              .max_finished_jobs = pcs_config_u32(cfg, "max-finished-jobs"),
                              .db_path = db,
                              .store_sync_normal =
                                  strcmp(pcs_config_str(cfg, "store-sync"), "normal") == 0,
                              .metrics_listen = pcs_config_str(cfg, "metrics-listen"),
                              .metrics_port_file = pcs_config_str(cfg, "metrics-port-file"),
                              .config = cfg,
                              .tls = *tls_cert ? &tls : NULL,
                              .token_file = pcs_config_str(cfg, "token-file"),
                              .worker_cert_identity_off = !pcs_config_bool(cfg, "worker-cert-identity"),
                              .max_watch_streams = pcs_config_u32(cfg, "max-watch-streams"),
                              .elastic_wait_ms = pcs_config_u32(cfg, "elastic-wait-ms")};
    pcs_server_t *srv = NULL;
    if (pcs_server_create(&sc, &srv) != PCS_OK) {
        fprintf(stderr, "pcs-coordinator: %s\n", pcs_last_error());
        pcs_config_free(cfg);
        return 1;
    }
    g_server = srv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int port = pcs_server_port(srv);
    const char *port_file = pcs_config_str(cfg, "port-file");
    if (port_file && *port_file &&
        pcs_port_file_write("port-file", port_file, port) != PCS_OK) {
        fprintf(stderr, "pcs-coordinator: %s\n", pcs_last_error());
        pcs_server_destroy(srv);
        pcs_config_free(cfg);
        return 1;
    }
    if (pcs_server_metrics_port(srv))
        PCS_INFO(PCS_SUB_INIT, "serving gRPC on port %d, metrics on port %d", port,
                 pcs_server_metrics_port(srv));
    else
        PCS_INFO(PCS_SUB_INIT, "serving gRPC on port %d (metrics off)", port);
    pcs_status_t st = pcs_server_run(srv);
    g_server = NULL;
    pcs_server_destroy(srv);
    PCS_INFO(PCS_SUB_INIT, "pcs-coordinator stopped");
    pcs_config_free(cfg);
    return st == PCS_OK ? 0 : 1;
}
