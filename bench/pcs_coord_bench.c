/* pcs-coord-bench: gang-start latency of a coordinator (STYLE.md B12, DESIGN.md §11 "registered,
 * planned, bootstrapped"). For each world size W: W workers are registered and watching; the
 * timed phase runs from SubmitJob (validation + planning + gang start) until every one of the W
 * WatchAssignment streams has received its assignment. Baseline, measured first in the same run
 * on the same W streams' worth of calls: W grpc.health.v1 Watch streams each receiving their
 * first (2-byte) message, i.e. what stream delivery alone costs. Every assignment is checked
 * (#wrong): rank, world size, mesh coordinates, plan present and its hash.
 *   pcs-coord-bench [-w 16,128,1024] [--coordinator ADDR] [-F out.csv]
 * Without --coordinator it spawns <dir of this binary>/pcs-coordinator on 127.0.0.1:0. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "pcs/version.h"

#define T_MS      30000
#define MAX_SIZES 16

/* a macro, not a variable: -Wformat-nonliteral checks the arguments in every build type */
#define SPEC_FMT                                                                                   \
    "name: bench-%u\n"                                                                             \
    "model:\n"                                                                                     \
    "  mlp: {input_dim: 256, hidden_dims: [1024, 1024, 1024, "                                     \
    "1024], output_dim: 16, norm: layernorm}\n"                                                    \
    "wrap:\n"                                                                                      \
    "  module_class: [MLPBlock]\n"                                                                 \
    "precision: {param_dtype: bf16, reduce_dtype: fp32}\n"                                         \
    "mesh:\n"                                                                                      \
    "  - {dim: dp_shard, size: %u}\n"                                                              \
    "training:\n"                                                                                  \
    "  steps: 10\n"                                                                                \
    "  micro_batch_size: 4\n"                                                                      \
    "  optimizer:\n"                                                                               \
    "    adamw: {lr: 1.0e-3}\n"                                                                    \
    "data:\n"                                                                                      \
    "  synthetic: {seed: 1}\n"

typedef struct row {
    unsigned w;
    const char *phase;
    double ms;
    double bytes_per_rank;
    unsigned long wrong;
} row_t;

static pid_t spawn_coordinator(const char *dir, char *addr, size_t n)
{
    char exe[4000], bin[4100], port_file[4200], logf[4200];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return -1;
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(bin, sizeof bin, "%s/pcs-coordinator", exe);
    snprintf(port_file, sizeof port_file, "%s/port", dir);
    snprintf(logf, sizeof logf, "%s/coordinator.log", dir);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "pcs-coord-bench: %s not found (or pass --coordinator ADDR)\n", bin);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(logf, "w", stderr))
            _exit(127);
        setenv("PCS_LOG_LEVEL", "warn", 0);
        /* the baseline holds W Health/Watch streams open at once: lift the coordinator's cap */
        execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--lease-ms", "600000",
              "--max-watch-streams", "1000000", (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0) {
            snprintf(addr, n, "127.0.0.1:%d", port);
            return pid;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* The credential of worker w-<i+1> (Register's answer): its watch and heartbeats carry it. */
static char (*g_secret)[160];
static unsigned g_n_secret;

static const char *secret_of(unsigned i)
{
    return i < g_n_secret ? g_secret[i] : "";
}

static int reg_workers(pcs_rpc_client_t *c, unsigned from, unsigned to)
{
    if (to > g_n_secret) {
        void *grown = realloc(g_secret, (size_t)to * sizeof *g_secret);
        if (!grown)
            return -1;
        g_secret = grown;
        memset(g_secret[g_n_secret], 0, (size_t)(to - g_n_secret) * sizeof *g_secret);
        g_n_secret = to;
    }
    for (unsigned i = from; i < to; i++) {
        char ident[64];
        snprintf(ident, sizeof ident, "bench-worker-%u", i);
        Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
        req.identity = ident;
        req.host = "127.0.0.1";
        ProtobufCMessage *resp = NULL;
        if (pcs_rpc_call(c, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor,
                         T_MS, &resp, NULL) != PCS_OK) {
            fprintf(stderr, "pcs-coord-bench: register: %s\n", pcs_last_error());
            return -1;
        }
        snprintf(g_secret[i], sizeof g_secret[i], "%s",
                 ((Pcs__V1__RegisterResponse *)resp)->worker_secret);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return 0;
}

/* Baseline: W health Watch streams, time until each got its first message. */
static int baseline(pcs_rpc_client_t *c, unsigned w, row_t *r)
{
    pcs_rpc_stream_t **s = calloc(w, sizeof *s);
    if (!s)
        return -1;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    int rc = 0;
    uint64_t t0 = pcs_now_us();
    for (unsigned i = 0; i < w && rc == 0; i++)
        if (pcs_rpc_stream_open(c, PCS_M_HEALTH_WATCH, &req.base, &s[i]) != PCS_OK)
            rc = -1;
    for (unsigned i = 0; i < w && rc == 0; i++) {
        ProtobufCMessage *m = NULL;
        if (pcs_rpc_stream_next(s[i], &grpc__health__v1__health_check_response__descriptor, T_MS,
                                &m) != PCS_OK ||
            !m) {
            rc = -1;
            break;
        }
        r->bytes_per_rank += (double)protobuf_c_message_get_packed_size(m) / w;
        if (((Grpc__Health__V1__HealthCheckResponse *)m)->status != 1)
            r->wrong++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    r->ms = (double)(pcs_now_us() - t0) / 1000.0;
    for (unsigned i = 0; i < w; i++)
        if (s[i])
            pcs_rpc_stream_close(s[i]);
    free(s);
    return rc;
}

/* Timed: watch streams open for w-1..w-W (gang start picks idle workers in registration order),
 * then SubmitJob until all W assignments arrived. Cancels the job afterwards. */
static int gang_start(pcs_rpc_client_t *c, unsigned w, row_t *r, row_t *submit_row)
{
    pcs_rpc_stream_t **s = calloc(w, sizeof *s);
    if (!s)
        return -1;
    int rc = 0;
    char id[32];
    for (unsigned i = 0; i < w && rc == 0; i++) {
        Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
        snprintf(id, sizeof id, "w-%u", i + 1);
        req.worker_id = id;
        if (pcs_rpc_stream_open_as(c, secret_of(i), PCS_M_WATCH_ASSIGNMENT, &req.base, &s[i]) !=
            PCS_OK)
            rc = -1;
    }
    char yaml[2048];
    snprintf(yaml, sizeof yaml, SPEC_FMT, w, w);
    ProtobufCMessage *spec = NULL;
    if (rc == 0 &&
        pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &spec) != PCS_OK)
        rc = -1;
    char job_id[64] = "";
    uint64_t plan_hash = 0;
    uint64_t t0 = pcs_now_us();
    if (rc == 0) {
        Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
        req.spec = (Pcs__V1__JobSpec *)spec;
        ProtobufCMessage *resp = NULL;
        if (pcs_rpc_call(c, PCS_M_SUBMIT_JOB, &req.base, &pcs__v1__submit_job_response__descriptor,
                         T_MS, &resp, NULL) != PCS_OK) {
            fprintf(stderr, "pcs-coord-bench: submit: %s\n", pcs_last_error());
            rc = -1;
        } else {
            Pcs__V1__Job *j = ((Pcs__V1__SubmitJobResponse *)resp)->job;
            snprintf(job_id, sizeof job_id, "%s", j->job_id);
            plan_hash = j->plan_hash;
            if (j->state != PCS__V1__JOB_STATE__JOB_STATE_RUNNING)
                submit_row->wrong++;
            protobuf_c_message_free_unpacked(resp, NULL);
        }
    }
    submit_row->ms = (double)(pcs_now_us() - t0) / 1000.0;
    for (unsigned i = 0; i < w && rc == 0; i++) {
        ProtobufCMessage *m = NULL;
        if (pcs_rpc_stream_next(s[i], &pcs__v1__assignment_event__descriptor, T_MS, &m) != PCS_OK ||
            !m) {
            fprintf(stderr, "pcs-coord-bench: watch of w-%u: %s\n", i + 1, pcs_last_error());
            rc = -1;
            break;
        }
        r->bytes_per_rank += (double)protobuf_c_message_get_packed_size(m) / w;
        Pcs__V1__AssignmentEvent *e = (Pcs__V1__AssignmentEvent *)m;
        Pcs__V1__Assignment *a = e->assignment;
        if (e->event_case != PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT || !a || a->rank != i ||
            a->world_size != w || !a->coords || a->coords->dp_shard != i || !a->plan ||
            a->plan_hash != plan_hash || strcmp(a->job_id, job_id) != 0)
            r->wrong++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    r->ms = (double)(pcs_now_us() - t0) / 1000.0;
    if (*job_id) {
        Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
        req.job_id = job_id;
        ProtobufCMessage *resp = NULL;
        if (pcs_rpc_call(c, PCS_M_CANCEL_JOB, &req.base, &pcs__v1__cancel_job_response__descriptor,
                         T_MS, &resp, NULL) == PCS_OK)
            protobuf_c_message_free_unpacked(resp, NULL);
        /* as an agent does once its job loop ended: a heartbeat naming no job makes the
         * STOPPING worker IDLE for the next round */
        for (unsigned i = 0; i < w; i++) {
            Pcs__V1__HeartbeatRequest hb = PCS__V1__HEARTBEAT_REQUEST__INIT;
            snprintf(id, sizeof id, "w-%u", i + 1);
            hb.worker_id = id;
            if (pcs_rpc_call_as(c, secret_of(i), PCS_M_HEARTBEAT, &hb.base,
                                &pcs__v1__heartbeat_response__descriptor, T_MS, &resp,
                                NULL) == PCS_OK)
                protobuf_c_message_free_unpacked(resp, NULL);
        }
    }
    for (unsigned i = 0; i < w; i++)
        if (s[i])
            pcs_rpc_stream_close(s[i]);
    free(s);
    if (spec)
        protobuf_c_message_free_unpacked(spec, NULL);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: pcs-coord-bench [-w 16,128,1024] [--coordinator HOST:PORT] "
                    "[-F out.csv]\n");
}

int main(int argc, char **argv)
{
    pcs_log_init(PCS_LOG_WARN);
    const char *sizes_arg = "16,128,1024", *coordinator = NULL, *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-w") == 0 && i + 1 < argc)
            sizes_arg = argv[++i];
        else if (strcmp(argv[i], "--coordinator") == 0 && i + 1 < argc)
            coordinator = argv[++i];
        else if (strcmp(argv[i], "-F") == 0 && i + 1 < argc)
            csv = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    unsigned sizes[MAX_SIZES], n_sizes = 0, w_max = 0;
    for (const char *p = sizes_arg; *p && n_sizes < MAX_SIZES;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v == 0 || v > 65536) {
            usage();
            return 2;
        }
        sizes[n_sizes++] = (unsigned)v;
        if (v > w_max)
            w_max = (unsigned)v;
        p = *end == ',' ? end + 1 : end;
    }
    char dir[] = "/tmp/pcs-coord-bench-XXXXXX", addr[64];
    pid_t pid = -1;
    if (coordinator) {
        snprintf(addr, sizeof addr, "%s", coordinator);
    } else {
        if (!mkdtemp(dir) || (pid = spawn_coordinator(dir, addr, sizeof addr)) < 0) {
            fprintf(stderr, "pcs-coord-bench: cannot start pcs-coordinator\n");
            return 1;
        }
    }
    pcs_rpc_client_t *c = NULL;
    if (pcs_rpc_client_create(addr, &c) != PCS_OK) {
        fprintf(stderr, "pcs-coord-bench: %s\n", pcs_last_error());
        return 1;
    }
    char cmd[1024] = "";
    for (int i = 0; i < argc; i++) {
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 2);
        strcat(cmd, " ");
    }
    char date[64];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("# pcs-coord-bench  git %s  %s  cmd: %s\n", PCS_GIT_SHA, date, cmd);
    printf("# machine: nproc %ld  coordinator %s (%s)  transport tcp insecure, one channel\n",
           sysconf(_SC_NPROCESSORS_ONLN), addr, coordinator ? "given" : "spawned");
    printf("# job: mlp 256-4x1024-16 layernorm, wrap MLPBlock, bf16/fp32, mesh dp_shard W; "
           "timed = SubmitJob -> all W assignments received\n");
    printf("# baseline = W grpc.health.v1 Watch streams each receiving their first message\n");
    printf("#  workers  phase                 time   per-rank      bytes  #wrong\n");
    printf("#                                 (ms)       (us)   per-rank\n");
    FILE *cf = csv ? fopen(csv, "w") : NULL;
    if (cf)
        fprintf(cf, "workers,phase,time_ms,per_rank_us,bytes_per_rank,wrong\n");
    int rc = reg_workers(c, 0, w_max);
    unsigned long total_wrong = 0;
    double ratio_max = 0;
    for (unsigned k = 0; k < n_sizes && rc == 0; k++) {
        unsigned w = sizes[k];
        row_t rows[3] = {{w, "health-watch (base)", 0, 0, 0},
                         {w, "submit rpc", 0, 0, 0},
                         {w, "submit->all assigned", 0, 0, 0}};
        rc = baseline(c, w, &rows[0]);
        if (rc == 0)
            rc = gang_start(c, w, &rows[2], &rows[1]);
        for (int i = 0; i < 3; i++) {
            printf("%10u  %-20s %9.2f %10.2f %10.0f %7lu\n", rows[i].w, rows[i].phase, rows[i].ms,
                   rows[i].ms * 1000.0 / w, rows[i].bytes_per_rank, rows[i].wrong);
            if (cf)
                fprintf(cf, "%u,%s,%.3f,%.3f,%.0f,%lu\n", rows[i].w, rows[i].phase, rows[i].ms,
                        rows[i].ms * 1000.0 / w, rows[i].bytes_per_rank, rows[i].wrong);
            total_wrong += rows[i].wrong;
        }
        if (rows[0].ms > 0 && rows[2].ms / rows[0].ms > ratio_max)
            ratio_max = rows[2].ms / rows[0].ms;
    }
    if (cf)
        fclose(cf);
    printf("# gang start costs at most %.2f x the health-watch baseline at the same W\n",
           ratio_max);
    if (rc != 0)
        printf("# run failed: %s\n", pcs_last_error());
    printf("# Errors and wrong replies : %lu %s\n", total_wrong + (rc != 0),
           total_wrong == 0 && rc == 0 ? "OK" : "FAILED");
    pcs_rpc_client_destroy(c);
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        char path[256];
        snprintf(path, sizeof path, "%s/port", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/coordinator.log", dir);
        unlink(path);
        rmdir(dir);
    }
    free(g_secret);
    return rc == 0 && total_wrong == 0 ? 0 : 1;
}
