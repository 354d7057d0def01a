/* pcs-worker: config table -> agent -> serve assignments until SIGTERM/SIGINT (then Deregister and
 * exit 0). Everything else lives in pcs_worker_core (agent.c, train.c, runtime.c). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/agent.h"
#include "worker/status_http.h"
#include "pcs/config.h"
#include "pcs/kernels.h"
#include "pcs/log.h"

static const pcs_opt_t worker_opts[] = {
    {"coordinator", PCS_OPT_STRING, "127.0.0.1:7070", 0, 0, "coordinator address host:port"},
    {"identity", PCS_OPT_STRING, "", 0, 0, "stable identity for Register (default host:pid)"},
    {"backend", PCS_OPT_STRING, "cpu", 0, 0,
     "kernels backend this worker offers: cpu | cuda (cuda jobs need it; cpu jobs run on cpu)"},
    {"coll", PCS_OPT_STRING, "auto", 0, 0,
     "collectives it offers: auto (nccl+gloo on cuda, gloo on cpu) | nccl | gloo"},
    {"device", PCS_OPT_STRING, "auto", 0, 0,
     "cuda device ordinal, or auto = $LOCAL_RANK modulo the visible devices (else 0)"},
    {"hostname", PCS_OPT_STRING, "127.0.0.1", 0, 0,
     "address peers use for this worker's transport"},
    {"rpc-timeout-ms", PCS_OPT_U32, "5000", 100, 600000, "deadline of unary RPCs"},
    {"coll-timeout-ms", PCS_OPT_U32, "30000", 100, 3600000, "timeout of one collective"},
    {"heartbeat-interval-ms", PCS_OPT_U32, "0", 0, 60000,
     "heartbeat period (0 = the coordinator's value)"},
    {"max-jobs", PCS_OPT_U32, "0", 0, 1000000, "exit after this many jobs (0 = serve forever)"},
    {"reconnect-max-ms", PCS_OPT_U32, "1000", 10, 600000,
     "longest wait between attempts to reach a coordinator that is away (gRPC's own: 120 s)"},
    {"report-flush-ms", PCS_OPT_U32, "30000", 1, 3600000,
     "at exit, how long queued step reports (a job's final one) wait for the coordinator"},
    {"report-dir", PCS_OPT_STRING, "", 0, 0, "also write each step report to this directory"},
    {"root", PCS_OPT_STRING, ".", 0, 0,
     "directory a job's files (data, init.from, checkpoints) must lie beneath, unless a root "
     "below names another"},
    {"data-root", PCS_OPT_STRING, "", 0, 0, "where data.file paths may lead (empty: --root)"},
    {"init-root", PCS_OPT_STRING, "", 0, 0, "where init.from may lead (empty: --root)"},
    {"checkpoint-root", PCS_OPT_STRING, "", 0, 0,
     "where checkpoint.dir may lead (empty: --root); a job writes only its subdirectory named by "
     "its job id"},
    {"metrics-listen", PCS_OPT_STRING, "", 0, 0,
     "serve /metrics, /healthz (liveness) and /readyz (registered) on host:port (empty: off)"},
    {"metrics-port-file", PCS_OPT_STRING, "", 0, 0,
     "write the bound metrics port to this file (with --metrics-listen host:0)"},
    {"blas-threads", PCS_OPT_U32, "0", 0, 1024,
     "OpenBLAS threads of a cpu job (0 = auto: the CPUs this process may use, affinity and cgroup "
     "quota, divided by the job's ranks on this host)"},
    {"log-level", PCS_OPT_STRING, "info", 0, 0, "error | warn | info | debug | trace"},
    {"simulate-cuda", PCS_OPT_U32, "0", 0, PCS_SIMULATE_CUDA_MAX_DEVICES,
     "test hook: N > 0 makes backend cuda a simulated device (N devices) computing on the host"},
    {"inject-inf-step", PCS_OPT_U64, "0", 0, 1e18, "test hook: +Inf into a gradient at this step"},
    {"inject-inf-rank", PCS_OPT_U32, "0", 0, 1000000, "test hook: rank that injects the +Inf"},
    {"die-at-checkpoint", PCS_OPT_U64, "0", 0, 1e18,
     "test hook: rank --die-rank exits in the checkpoint of this step, before the commit"},
    {"die-rank", PCS_OPT_U32, "0", 0, 1000000, "test hook: see --die-at-checkpoint"},
    {"step-pause-ms", PCS_OPT_U32, "0", 0, 60000,
     "test hook: sleep this long after each step (a fault test's job runs for a known time)"},
};

static pcs_agent_t *g_agent;

static void on_signal(int sig)
{
    (void)sig;
    pcs_agent_stop(g_agent); /* only an atomic store */
}

int main(int argc, char **argv)
{
    pcs_config_t *cfg = NULL;
    size_t nopt = sizeof worker_opts / sizeof worker_opts[0];
    if (pcs_config_load(worker_opts, nopt, argc, argv, &cfg) != PCS_OK) {
        fprintf(stderr, "pcs-worker: %s\n", pcs_last_error());
        return 2;
    }
    if (pcs_config_help_requested(cfg)) {
        pcs_config_print_help(worker_opts, nopt, "pcs-worker [--coordinator ADDR] [options]");
        pcs_config_free(cfg);
        return 0;
    }
    int lvl = pcs_log_level_parse(pcs_config_str(cfg, "log-level"));
    setenv("PCS_LOG_SUBSYS", "INIT,CONFIG,BOOTSTRAP,WORKER", 0); /* lifecycle lines of the worker */
    pcs_log_init(lvl >= 0 ? (pcs_log_level_t)lvl : PCS_LOG_INFO);
    if (lvl >= 0 && !getenv("PCS_LOG_LEVEL"))
        pcs_log_set_level((pcs_log_level_t)lvl);
    pcs_log_set_role("w-");
    pcs_config_log_nondefault(cfg);

    if (pcs_backend_simulate_cuda(pcs_config_u32(cfg, "simulate-cuda")) != PCS_OK) {
        fprintf(stderr, "pcs-worker: %s\n", pcs_last_error());
        pcs_config_free(cfg);
        return 2;
    }

    pcs_agent_config_t ac;
    memset(&ac, 0, sizeof ac);
    ac.coordinator = pcs_config_str(cfg, "coordinator");
    ac.identity = pcs_config_str(cfg, "identity");
    ac.backend = pcs_config_str(cfg, "backend");
    ac.coll = pcs_config_str(cfg, "coll");
    const char *dev = pcs_config_str(cfg, "device");
    ac.device = -1;
    if (strcmp(dev, "auto") != 0) {
        char *end = NULL;
        long d = strtol(dev, &end, 10);
        if (end == dev || *end != '\0' || d < 0 || d > 1024) {
            fprintf(stderr, "pcs-worker: --device: must be a device ordinal or auto, got '%s'\n",
                    dev);
            pcs_config_free(cfg);
            return 2;
        }
        ac.device = (int)d;
    }
    ac.hostname = pcs_config_str(cfg, "hostname");
    ac.rpc_timeout_ms = pcs_config_u32(cfg, "rpc-timeout-ms");
    ac.coll_timeout_ms = pcs_config_u32(cfg, "coll-timeout-ms");
    ac.heartbeat_ms = pcs_config_u32(cfg, "heartbeat-interval-ms");
    ac.max_jobs = pcs_config_u32(cfg, "max-jobs");
    ac.reconnect_max_ms = pcs_config_u32(cfg, "reconnect-max-ms");
    ac.flush_ms = pcs_config_u32(cfg, "report-flush-ms");
    ac.report_dir = pcs_config_str(cfg, "report-dir");
    ac.root = pcs_config_str(cfg, "root");
    ac.data_root = pcs_config_str(cfg, "data-root");
    ac.init_root = pcs_config_str(cfg, "init-root");
    ac.checkpoint_root = pcs_config_str(cfg, "checkpoint-root");
    ac.inject_inf_step = pcs_config_u64(cfg, "inject-inf-step");
    ac.inject_inf_rank = pcs_config_u32(cfg, "inject-inf-rank");
    ac.die_at_checkpoint = pcs_config_u64(cfg, "die-at-checkpoint");
    ac.die_rank = pcs_config_u32(cfg, "die-rank");
    ac.step_pause_ms = pcs_config_u32(cfg, "step-pause-ms");
    ac.blas_threads = pcs_config_u32(cfg, "blas-threads");

    if (pcs_agent_create(&ac, &g_agent) != PCS_OK) {
        fprintf(stderr, "pcs-worker: %s\n", pcs_last_error());
        pcs_config_free(cfg);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    PCS_INFO(PCS_SUB_INIT, "pcs-worker starting: coordinator %s backend %s coll %s device %s",
             ac.coordinator, ac.backend, ac.coll, dev);
    pcs_worker_http_t *http = NULL;
    const char *mlisten = pcs_config_str(cfg, "metrics-listen");
    if (*mlisten) {
        /* liveness: the heartbeat thread goes round at least once per RPC deadline + interval */
        unsigned live_ms = 60000u + 2u * ac.rpc_timeout_ms;
        if (pcs_worker_http_start(g_agent, mlisten, pcs_config_str(cfg, "metrics-port-file"),
                                  live_ms, &http) != PCS_OK) {
            fprintf(stderr, "pcs-worker: %s\n", pcs_last_error());
            pcs_agent_t *a = g_agent;
            g_agent = NULL;
            pcs_agent_destroy(a);
            pcs_config_free(cfg);
            return 1;
        }
    }
    pcs_status_t st = pcs_agent_run(g_agent);
    pcs_worker_http_stop(http); /* before the agent it reads is freed */
    pcs_agent_t *a = g_agent;
    g_agent = NULL; /* a late signal must not touch the agent being freed */
    pcs_agent_destroy(a);
    pcs_config_free(cfg);
    if (st != PCS_OK) {
        fprintf(stderr, "pcs-worker: %s\n", pcs_last_error());
        return 1;
    }
    return 0;
}
