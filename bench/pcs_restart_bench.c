/* pcs-restart-bench: what a lost worker costs an elastic job (issue 13, DESIGN.md §8). It spawns
 * pcs-coordinator and W + 1 pcs-worker processes (one spare) on 127.0.0.1, submits an elastic job
 * (checkpoint every K steps), SIGKILLs the worker holding rank 1 once rank 0 reported step S, and
 * times the way back to training, split into:
 *   detection   kill -> the coordinator recorded the restart (a survivor reported the dead peer)
 *   regroup     -> generation 2 RUNNING: survivors left, the spare taken, the plan checked
 *   bootstrap   rank 0 of generation 2: rendezvous and communicators (StepReport.bootstrap_ms)
 *   ckpt load   rank 0: the resharded checkpoint read back (StepReport.resume_ms)
 *   first step  kill -> rank 0's first report of generation 2
 * and the steps redone (the last step reported before the kill minus the checkpoint's). Baseline,
 * in the same run: the job's first start, SubmitJob -> rank 0's first report, and its bootstrap.
 *   pcs-restart-bench [-w 4] [-s 12] [-k 10] [-r 3] [-p 40]
 *   (-r rounds; -p ms each worker sleeps after a step, so the kill lands mid-run) */
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/report.h"
#include "pcs/clock.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "pcs/version.h"

#define SPEC_FMT                                                                                   \
    "name: restart-bench\n"                                                                        \
    "model:\n"                                                                                     \
    "  mlp: {input_dim: 64, hidden_dims: [256, 256, 256, 256], output_dim: 8, norm: layernorm}\n" \
    "wrap: {module_class: [MLPBlock]}\n"                                                           \
    "precision: {param_dtype: bf16, reduce_dtype: fp32}\n"                                         \
    "mesh:\n  - {dim: dp_shard, size: %u}\n"                                                       \
    "training: {steps: %u, micro_batch_size: 8, optimizer: {adamw: {lr: 0.001}}}\n"              \
    "data: {synthetic: {seed: 1}}\n"                                                               \
    "checkpoint: {dir: ckpt, every_steps: %u, keep_last: 2}\n"                                     \
    "elastic: {max_restarts: 1}\n"

typedef struct opts {
    unsigned world, kill_step, every, rounds, pause_ms;
} opts_t;

static char g_bindir[4000];

static pid_t spawn(char *const argv[], const char *log)
{
    fflush(NULL); /* the child's freopen would write our buffered output again */
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "a", stderr) || !freopen("/dev/null", "w", stdout))
            _exit(127);
        setenv("PCS_LOG_LEVEL", "warn", 0);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int read_port(const char *path)
{
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(path, "r");
        int port = 0;
        if (f) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0)
            return port;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static int get_job(pcs_rpc_client_t *c, const char *id, int *state, uint64_t *gen, uint32_t *rst)
{
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    ProtobufCMessage *m = NULL;
    if (pcs_rpc_call(c, PCS_M_GET_JOB, &req.base, &pcs__v1__get_job_response__descriptor, 5000, &m,
                     NULL) != PCS_OK)
        return -1;
    Pcs__V1__Job *j = ((Pcs__V1__GetJobResponse *)m)->job;
    *state = (int)j->state;
    *gen = j->generation;
    *rst = j->restarts;
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static pid_t holder(pcs_rpc_client_t *c, const char *job, uint32_t rank)
{
    Pcs__V1__ListWorkersRequest req = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    pid_t pid = -1;
    if (pcs_rpc_call(c, PCS_M_LIST_WORKERS, &req.base,
                     &pcs__v1__list_workers_response__descriptor, 5000, &m, NULL) != PCS_OK)
        return -1;
    Pcs__V1__ListWorkersResponse *r = (Pcs__V1__ListWorkersResponse *)m;
    for (size_t i = 0; i < r->n_workers; i++)
        if (r->workers[i]->job_id && !strcmp(r->workers[i]->job_id, job) &&
            r->workers[i]->rank == rank)
            pid = (pid_t)r->workers[i]->pid;
    protobuf_c_message_free_unpacked(m, NULL);
    return pid;
}

typedef struct round {
    double first_start_ms, first_bootstrap_ms;
    double detect_ms, regroup_ms, bootstrap_ms, load_ms, first_step_ms;
    uint64_t redone;
    int ok;
} round_t;

static void run_round(const opts_t *o, int n, round_t *out)
{
    memset(out, 0, sizeof *out);
    char dir[] = "/tmp/pcs-restart-bench-XXXXXX";
    if (!mkdtemp(dir))
        return;
    char bin[4200], port_file[4200], log[4200], addr[64];
    snprintf(bin, sizeof bin, "%s/pcs-coordinator", g_bindir);
    snprintf(port_file, sizeof port_file, "%s/port", dir);
    snprintf(log, sizeof log, "%s/coordinator.log", dir);
    char *cargv[] = {bin,        "--listen",          "127.0.0.1:0",  "--port-file", port_file,
                     "--lease-ms", "3000",            "--heartbeat-interval-ms", "200",
                     "--elastic-wait-ms", "1000",       NULL};
    pid_t coord = spawn(cargv, log);
    int port = read_port(port_file);
    pid_t workers[64];
    unsigned nw = 0;
    pcs_rpc_client_t *cl = NULL;
    if (port <= 0 || pcs_rpc_client_create((snprintf(addr, sizeof addr, "127.0.0.1:%d", port), addr),
                                           &cl) != PCS_OK)
        goto out;
    char wbin[4200], pause[16], ident[64], wlog[4200];
    snprintf(wbin, sizeof wbin, "%s/pcs-worker", g_bindir);
    snprintf(pause, sizeof pause, "%u", o->pause_ms);
    for (nw = 0; nw < o->world + 1; nw++) {
        snprintf(ident, sizeof ident, "bench-%d-%u", n, nw);
        snprintf(wlog, sizeof wlog, "%s/worker%u.log", dir, nw);
        char *wargv[] = {wbin,          "--coordinator",  addr,        "--identity", ident,
                         "--root",      dir,              "--report-dir", dir,
                         "--step-pause-ms", pause,        "--coll-timeout-ms", "5000",
                         "--heartbeat-interval-ms", "200", NULL};
        workers[nw] = spawn(wargv, wlog);
    }
    char yaml[2048];
    unsigned steps = o->kill_step + 3 * o->every;
    snprintf(yaml, sizeof yaml, SPEC_FMT, o->world, steps, o->every);
    ProtobufCMessage *spec = NULL;
    if (pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &spec) != PCS_OK)
        goto out;
    char job[64] = "";
    uint64_t t_submit = 0;
    /* submit once every worker is IDLE: the baseline times a start, not a wait for workers */
    for (int i = 0; i < 600; i++) {
        Pcs__V1__GetStatusRequest sr = PCS__V1__GET_STATUS_REQUEST__INIT;
        ProtobufCMessage *st = NULL;
        uint32_t idle = 0;
        if (pcs_rpc_call(cl, PCS_M_GET_STATUS, &sr.base, &pcs__v1__get_status_response__descriptor,
                         5000, &st, NULL) == PCS_OK) {
            idle = ((Pcs__V1__GetStatusResponse *)st)->workers_idle;
            protobuf_c_message_free_unpacked(st, NULL);
        }
        if (idle >= o->world + 1)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    {
        Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
        req.spec = (Pcs__V1__JobSpec *)spec;
        ProtobufCMessage *m = NULL;
        t_submit = pcs_now_us();
        if (pcs_rpc_call(cl, PCS_M_SUBMIT_JOB, &req.base,
                         &pcs__v1__submit_job_response__descriptor, 10000, &m, NULL) == PCS_OK) {
            snprintf(job, sizeof job, "%s", ((Pcs__V1__SubmitJobResponse *)m)->job->job_id);
            protobuf_c_message_free_unpacked(m, NULL);
        }
    }
    protobuf_c_message_free_unpacked(spec, NULL);
    if (!job[0])
        goto out;
    char rpath[4200];
    pcs_report_file_path(dir, job, 0, rpath, sizeof rpath);
    long off = 0;
    uint64_t last = 0, t_kill = 0;
    /* generation 1: its first report (the baseline), then the kill at kill_step */
    while (!t_kill && pcs_now_us() - t_submit < 120000000ull) {
        Pcs__V1__StepReport *r = NULL;
        while (pcs_report_file_next(rpath, &off, &r)) {
            if (!last) {
                out->first_start_ms = (double)(pcs_now_us() - t_submit) / 1000.0;
                out->first_bootstrap_ms = r->bootstrap_ms;
            }
            last = r->step;
            pcs__v1__step_report__free_unpacked(r, NULL);
        }
        if (last >= o->kill_step) {
            pid_t victim = holder(cl, job, 1);
            if (victim <= 0)
                break;
            t_kill = pcs_now_us();
            kill(victim, SIGKILL);
            for (unsigned i = 0; i < nw; i++)
                if (workers[i] == victim)
                    workers[i] = -1;
            waitpid(victim, NULL, 0);
            break;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!t_kill)
        goto out;
    int state = 0;
    uint64_t gen = 0;
    uint32_t rst = 0;
    uint64_t t_detect = 0, t_run = 0;
    while (pcs_now_us() - t_kill < 120000000ull && !t_run) {
        if (get_job(cl, job, &state, &gen, &rst) == 0) {
            if (rst && !t_detect)
                t_detect = pcs_now_us();
            if (gen >= 2 && (state == PCS__V1__JOB_STATE__JOB_STATE_RUNNING ||
                             state == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED))
                t_run = pcs_now_us();
            if (state == PCS__V1__JOB_STATE__JOB_STATE_FAILED)
                break;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* generation 2's first report: a step at or below the last one seen, with setup timings
     * (the rank's report file starts over with each run: reread it when it shrank) */
    while (t_run && pcs_now_us() - t_kill < 120000000ull && !out->ok) {
        struct stat sb;
        if (stat(rpath, &sb) == 0 && sb.st_size < off)
            off = 0;
        Pcs__V1__StepReport *r = NULL;
        while (!out->ok && pcs_report_file_next(rpath, &off, &r)) {
            if (r->setup_ms > 0 && !r->error[0]) {
                out->first_step_ms = (double)(pcs_now_us() - t_kill) / 1000.0;
                out->bootstrap_ms = r->bootstrap_ms;
                out->load_ms = r->resume_ms;
                out->redone = last >= r->step - 1 ? last - (r->step - 1) : 0;
                out->ok = 1;
            } else if (!r->error[0] && r->step > last) {
                last = r->step; /* generation 1 still finishing its step at the kill */
            }
            pcs__v1__step_report__free_unpacked(r, NULL);
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!out->ok)
        fprintf(stderr, "pcs-restart-bench: state %d generation %llu restarts %u detect %d run %d "
                        "last step %llu\n",
                state, (unsigned long long)gen, rst, t_detect != 0, t_run != 0,
                (unsigned long long)last);
    out->detect_ms = t_detect ? (double)(t_detect - t_kill) / 1000.0 : 0;
    out->regroup_ms = t_detect && t_run ? (double)(t_run - t_detect) / 1000.0 : 0;
out:
    pcs_rpc_client_destroy(cl);
    for (unsigned i = 0; i < nw; i++)
        if (workers[i] > 0) {
            kill(workers[i], SIGKILL);
            waitpid(workers[i], NULL, 0);
        }
    if (coord > 0) {
        kill(coord, SIGTERM);
        waitpid(coord, NULL, 0);
    }
    if (out->ok) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "pcs-restart-bench: could not remove %s\n", dir);
    } else {
        fprintf(stderr, "pcs-restart-bench: round %d failed (logs in %s)\n", n, dir);
    }
}

int main(int argc, char **argv)
{
    opts_t o = {4, 12, 10, 3, 40};
    int c;
    while ((c = getopt(argc, argv, "w:s:k:r:p:h")) != -1) {
        unsigned v = (unsigned)strtoul(optarg ? optarg : "0", NULL, 10);
        switch (c) {
        case 'w':
            o.world = v;
            break;
        case 's':
            o.kill_step = v;
            break;
        case 'k':
            o.every = v;
            break;
        case 'r':
            o.rounds = v;
            break;
        case 'p':
            o.pause_ms = v;
            break;
        default:
            fprintf(stderr, "usage: pcs-restart-bench [-w W] [-s kill step] [-k ckpt every] "
                            "[-r rounds] [-p step pause ms]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (o.world < 2 || o.world > 32 || !o.every || !o.rounds) {
        fprintf(stderr, "pcs-restart-bench: -w in [2, 32], -k and -r > 0\n");
        return 2;
    }
    ssize_t len = readlink("/proc/self/exe", g_bindir, sizeof g_bindir - 1);
    if (len <= 0)
        return 1;
    g_bindir[len] = '\0';
    *strrchr(g_bindir, '/') = '\0';
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    printf("# pcs-restart-bench  git %s  cmd:", PCS_GIT_SHA);
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n# machine: nproc %ld  load %.2f  W %u + 1 spare  kill rank 1 after step %u  "
           "checkpoint every %u  step pause %u ms\n",
           ncpu, load[0], o.world, o.kill_step, o.every, o.pause_ms);
    printf("#  round   first-start  (bootstrap)  detection   regroup  bootstrap  ckpt-load  "
           "first-step  redone\n");
    printf("#               (ms)         (ms)       (ms)      (ms)       (ms)       (ms)        "
           "(ms)  (steps)\n");
    int bad = 0;
    double sum[7] = {0};
    unsigned okr = 0;
    for (unsigned n = 0; n < o.rounds; n++) {
        round_t r;
        run_round(&o, (int)n, &r);
        if (!r.ok) {
            bad++;
            continue;
        }
        okr++;
        double v[7] = {r.first_start_ms, r.first_bootstrap_ms, r.detect_ms, r.regroup_ms,
                       r.bootstrap_ms,   r.load_ms,            r.first_step_ms};
        for (int k = 0; k < 7; k++)
            sum[k] += v[k];
        printf("%8u %13.1f %12.1f %10.1f %9.1f %10.1f %10.1f %11.1f %7llu\n", n, v[0], v[1], v[2],
               v[3], v[4], v[5], v[6], (unsigned long long)r.redone);
    }
    if (okr)
        printf("#   mean %13.1f %12.1f %10.1f %9.1f %10.1f %10.1f %11.1f\n", sum[0] / okr,
               sum[1] / okr, sum[2] / okr, sum[3] / okr, sum[4] / okr, sum[5] / okr,
               sum[6] / okr);
    if (okr)
        printf("# back to training: %.2f x a fresh start of the same job (the baseline)\n",
               (sum[6] / okr) / (sum[0] / okr));
    printf("# Failed rounds : %d %s\n", bad, bad ? "FAILED" : "OK");
    return bad ? 1 : 0;
}
