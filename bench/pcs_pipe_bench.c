/* pcs-pipe-bench: pipeline schedules measured (issue 14). For each schedule (GPipe, 1F1B,
 * Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) and micro-batch count m, pp ranks (forked
 * processes, one stage each, or two with the interleaved schedules; file KV store, CPU, Gloo over
 * loopback) train an MLP of L blocks, and each rank reports the wall time of its schedule action
 * list (StepReport.pipeline_ms) and the part of it spent computing (compute_ms). The measured
 * bubble is 1 - sum of compute / (pp x the slowest rank's action list), next to the schedule's
 * own bubble with unit costs (F 1, B 2, I = W = 1: planner/schedule.c) and GPipe/1F1B's
 * (p - 1) / (m + p - 1). The baseline in the same run is the same job without stages on one
 * rank (its forward/backward time is the whole work): speedup = baseline compute / pipelined
 * action list, ideally pp x (1 - bubble). Every rank, the baseline's too, computes with one BLAS
 * thread: the same resources per stage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_train.h"
#include "bench_util.h"
#include "coll/kv.h"
#include "pcs/log.h"
#include "pcs/pbtext.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "worker/train.h"

typedef struct cfg {
    unsigned width, layers, rows, pp;
    int warmup, iters;
} cfg_t;

typedef struct rank_ctx {
    int warmup, n;
    double step, pipe, compute;
} rank_ctx_t;

static void on_report(void *ctx, const Pcs__V1__StepReport *r)
{
    rank_ctx_t *c = ctx;
    if ((r->error && r->error[0]) || (int)r->step <= c->warmup)
        return;
    c->step += r->step_ms;
    c->pipe += r->pipeline_ms;
    c->compute += r->compute_ms;
    c->n++;
}

static Pcs__V1__JobSpec *make_spec(const cfg_t *c, const char *sched, unsigned v, unsigned m,
                                   int pp)
{
    char hidden[512] = "", mesh[256], pipe[128] = "";
    for (unsigned i = 0, n = 0; i < c->layers; i++)
        n += (unsigned)snprintf(hidden + n, sizeof hidden - n, "%s%u", i ? ", " : "", c->width);
    if (pp > 1) {
        snprintf(mesh, sizeof mesh, "[{dim: pp, size: %d}]", pp);
        snprintf(pipe, sizeof pipe, "pipeline: {schedule: %s, virtual_stages: %u}\n", sched, v);
    } else {
        snprintf(mesh, sizeof mesh, "[{dim: dp_shard, size: 1}]");
    }
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "name: pipe-bench\n"
             "model:\n"
             "  mlp: {input_dim: %u, hidden_dims: [%s], output_dim: 16, activation: gelu,\n"
             "        norm: layernorm, bias: true, residual: true}\n"
             "wrap: {module_class: [MLPBlock]}\n"
             "reshard_after_forward: false\n"
             "mesh: %s\n"
             "%s"
             "training: {steps: %d, micro_batch_size: %u, micro_batches: %u,"
             " optimizer: {adamw: {lr: 1.0e-3}}}\n"
             "data: {synthetic: {task: regression, seed: 7}}\n"
             "init: {seed: 13}\n",
             c->width, hidden, mesh, pipe, c->warmup + c->iters, c->rows, m);
    ProtobufCMessage *msg = NULL;
    if (pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &msg) != PCS_OK) {
        fprintf(stderr, "pcs-pipe-bench: job: %s\n", pcs_last_error());
        return NULL;
    }
    return (Pcs__V1__JobSpec *)msg;
}

static int rank_main(const cfg_t *c, Pcs__V1__JobSpec *spec, int world, int rank,
                     const char *dir, const char *out_path)
{
    Pcs__V1__Plan *plan = NULL;
    if (pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK) {
        fprintf(stderr, "pcs-pipe-bench: plan: %s\n", pcs_last_error());
        return 2;
    }
    Pcs__V1__MeshCoords coords;
    Pcs__V1__Assignment as;
    pcs_bench_assignment(spec, plan, world, rank, "pipe-bench", &as, &coords);
    char kvdir[1200];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    rank_ctx_t rc;
    memset(&rc, 0, sizeof rc);
    rc.warmup = c->warmup;
    pcs_train_config_t tc;
    memset(&tc, 0, sizeof tc);
    tc.assignment = &as;
    tc.kv = kv;
    tc.coll_timeout_ms = 60000;
    tc.report = on_report;
    tc.report_ctx = &rc;
    tc.prefetch = -1;
    tc.blas_threads = 1; /* one core per rank, the baseline's too: the same compute resources */
    pcs_train_t *t = NULL;
    pcs_train_result_t res;
    pcs_status_t st = pcs_train_create(&tc, &t);
    if (st == PCS_OK)
        st = pcs_train_run(t, &res);
    if (st != PCS_OK)
        fprintf(stderr, "rank %d: %s\n", rank, pcs_last_error());
    pcs_train_destroy(t);
    pcs_kv_destroy(kv);
    pcs_plan_free(plan);
    if (st != PCS_OK || rc.n == 0)
        return 1;
    FILE *f = fopen(out_path, "w");
    if (!f)
        return 2;
    fprintf(f, "%f %f %f\n", rc.step / rc.n, rc.pipe / rc.n, rc.compute / rc.n);
    fclose(f);
    return 0;
}

typedef struct result {
    double step, pipe, compute_sum;
} result_t;

/* world ranks of spec; the slowest rank's step and action list, the ranks' summed compute. */
static int run(const cfg_t *c, Pcs__V1__JobSpec *spec, int world, result_t *out)
{
    char dir[] = "/tmp/pcs-pipe-bench-XXXXXX";
    if (!mkdtemp(dir))
        return -1;
    pid_t pids[64];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char path[1200];
            snprintf(path, sizeof path, "%s/rank%d.txt", dir, r);
            _exit(rank_main(c, spec, world, r, dir, path));
        }
    }
    int ok = 1;
    for (int r = 0; r < world; r++) {
        int ws = 0;
        waitpid(pids[r], &ws, 0);
        ok &= WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    }
    memset(out, 0, sizeof *out);
    for (int r = 0; ok && r < world; r++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/rank%d.txt", dir, r);
        FILE *f = fopen(path, "r");
        double s = 0, p = 0, cm = 0;
        if (!f || fscanf(f, "%lf %lf %lf", &s, &p, &cm) != 3)
            ok = 0;
        if (f)
            fclose(f);
        out->step = fmax(out->step, s);
        out->pipe = fmax(out->pipe, p);
        out->compute_sum += cm;
    }
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "pcs-pipe-bench: could not remove %s\n", dir);
    return ok ? 0 : -1;
}

static void loadavg(char *buf, size_t n)
{
    FILE *f = fopen("/proc/loadavg", "r");
    snprintf(buf, n, "?");
    if (f) {
        if (!fgets(buf, (int)n, f))
            snprintf(buf, n, "?");
        fclose(f);
        buf[strcspn(buf, "\n")] = 0;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: pcs-pipe-bench [-p PP] [-m M1,M2,...] [-l LAYERS] [-h WIDTH] "
                    "[-b ROWS] [-n ITERS] [-w WARMUP] [--tiny]\n"
                    "  -p  pipeline ranks (default 2)\n"
                    "  -m  micro-batch counts (default 4,8,16)\n"
                    "  -l  MLP blocks (default 8), -h their width (default 512)\n"
                    "  -b  rows per micro-batch (default 32)\n"
                    "  -n  timed steps (default 5), -w warm-up steps (default 2)\n"
                    "  --tiny  a seconds-long smoke run (16-wide blocks, m 4, 2 steps)\n");
}

int main(int argc, char **argv)
{
    pcs_log_init(PCS_LOG_WARN); /* PCS_LOG_LEVEL=debug: each rank's time per action kind */
    cfg_t c = {.width = 512, .layers = 8, .rows = 32, .pp = 2, .warmup = 2, .iters = 5};
    unsigned ms[8] = {4, 8, 16};
    int n_ms = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tiny")) {
            c.width = 16;
            c.layers = 4;
            c.rows = 4;
            c.iters = 2;
            c.warmup = 1;
            ms[0] = 4;
            n_ms = 1;
        } else if (v && !strcmp(a, "-p")) {
            c.pp = (unsigned)atoi(v), i++;
        } else if (v && !strcmp(a, "-l")) {
            c.layers = (unsigned)atoi(v), i++;
        } else if (v && !strcmp(a, "-h")) {
            c.width = (unsigned)atoi(v), i++;
        } else if (v && !strcmp(a, "-b")) {
            c.rows = (unsigned)atoi(v), i++;
        } else if (v && !strcmp(a, "-n")) {
            c.iters = atoi(v), i++;
        } else if (v && !strcmp(a, "-w")) {
            c.warmup = atoi(v), i++;
        } else if (v && !strcmp(a, "-m")) {
            n_ms = 0;
            for (char *s = argv[++i], *e; *s && n_ms < 8; s = *e ? e + 1 : e)
                ms[n_ms++] = (unsigned)strtoul(s, &e, 10);
        } else {
            usage();
            return 2;
        }
    }
    if (c.pp < 2 || c.pp > 16 || c.layers < 2 * c.pp || c.iters < 1 || c.warmup < 0 || !n_ms) {
        usage();
        return 2;
    }
    char cpu[128], load0[128], load1[128];
    pcs_bench_cpu_model(cpu, sizeof cpu);
    loadavg(load0, sizeof load0);
    printf("# pcs-pipe-bench: MLP %u-%ux%u-16 fp32, %u rows per micro-batch, pp %u (one rank per "
           "pp coordinate, dp 1), CPU + Gloo loopback\n",
           c.width, c.width, c.layers, c.rows, c.pp);
    printf("# machine: %s, %ld CPUs online; load before: %s\n", cpu, sysconf(_SC_NPROCESSORS_ONLN),
           load0);
    printf("# bubble = 1 - sum(compute) / (pp x action list); unit = the schedule's with F 1, B 2, "
           "I = W = 1; 1f1b = (p-1)/(m+p-1)\n");
    printf("# speedup = baseline (the job without stages on 1 rank: its forward/backward time) / "
           "action list; ideal pp x (1 - bubble); every rank (the baseline too) computes with 1 "
           "BLAS thread\n");
    printf("#\n# %-24s %2s %3s %10s %10s %10s %8s %8s %8s %8s\n", "schedule", "v", "m",
           "step ms", "list ms", "base ms", "bubble", "unit", "1f1b", "speedup");
    const struct {
        const char *name;
        pcs_sched_kind_t kind;
        unsigned v;
    } sched[] = {{"gpipe", PCS_SCHED_GPIPE, 1},
                 {"1f1b", PCS_SCHED_1F1B, 1},
                 {"interleaved_1f1b", PCS_SCHED_INTERLEAVED_1F1B, 2},
                 {"looped_bfs", PCS_SCHED_LOOPED_BFS, 2},
                 {"interleaved_zero_bubble", PCS_SCHED_ZERO_BUBBLE, 2}};
    int failed = 0;
    for (int mi = 0; mi < n_ms; mi++) {
        unsigned m = ms[mi];
        Pcs__V1__JobSpec *base = make_spec(&c, NULL, 1, m, 1);
        result_t b;
        if (!base || run(&c, base, 1, &b) != 0) {
            fprintf(stderr, "pcs-pipe-bench: baseline m %u failed\n", m);
            return 1;
        }
        protobuf_c_message_free_unpacked(&base->base, NULL);
        for (size_t k = 0; k < sizeof sched / sizeof sched[0]; k++) {
            pcs_schedule_t *s = NULL;
            if (pcs_schedule_build(sched[k].kind, c.pp, sched[k].v, m, 0, &s) != PCS_OK) {
                printf("  %-24s %2u %3u  (not run: %s)\n", sched[k].name, sched[k].v, m,
                       pcs_last_error());
                continue;
            }
            double unit = s->bubble;
            pcs_schedule_free(s);
            Pcs__V1__JobSpec *spec = make_spec(&c, sched[k].name, sched[k].v, m, (int)c.pp);
            result_t r;
            if (!spec || run(&c, spec, (int)c.pp, &r) != 0) {
                printf("  %-24s %2u %3u  FAILED\n", sched[k].name, sched[k].v, m);
                failed = 1;
                if (spec)
                    protobuf_c_message_free_unpacked(&spec->base, NULL);
                continue;
            }
            protobuf_c_message_free_unpacked(&spec->base, NULL);
            double bubble = r.pipe > 0 ? 1.0 - r.compute_sum / ((double)c.pp * r.pipe) : 0;
            printf("  %-24s %2u %3u %10.2f %10.2f %10.2f %8.3f %8.3f %8.3f %8.2f\n",
                   sched[k].name, sched[k].v, m, r.step, r.pipe, b.compute_sum, bubble, unit,
                   pcs_sched_bubble_1f1b(c.pp, m), r.pipe > 0 ? b.compute_sum / r.pipe : 0);
        }
    }
    loadavg(load1, sizeof load1);
    printf("# load after: %s\n", load1);
    return failed;
}
