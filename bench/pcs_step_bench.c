/* pcs-step-bench: step time breakdown of the sharded training loop for the demo model (MLP
 * 256-1024x4-16, FULL_SHARD, bf16 params / fp32 reduce, AdamW, 4 micro-batches of 32 rows; -p fp32
 * and -s shard_grad_op|no_shard change the policy and strategy) at
 * W = 1, 2, 4 ranks (forked processes, file KV store; CPU + Gloo over loopback by default,
 * `-d cuda [-c nccl|gloo]` for a backend: cuda job on the GPUs, rank r on device r % count), with
 * and without the all-gather prefetch thread, and the overlap efficiency max(compute, comm) / step.
 * W = 1 is the no-communication baseline measured in the same run. Correctness is checked in a
 * separate untimed pass: a short run of each W against the single-process reference (#wrong
 * counts parameters outside atol 1e-3 + rtol 1e-2). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_train.h"
#include "bench_util.h"
#include "io/checkpoint.h"
#include "coll/kv.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/kernels.h"
#include "pcs/pbtext.h"
#include "pcs/version.h"
#include "planner/plan.h"
#include "model/reference.h"
#include "io/safetensors.h"
#include "worker/train.h"

static const char k_job_fmt[] =
    "name: step-bench\n"
    "model:\n"
    "  mlp: {input_dim: %u, hidden_dims: [%s], output_dim: 16, activation: gelu,\n"
    "        norm: layernorm, bias: true, residual: true}\n"
    "wrap: {module_class: [MLPBlock]}\n"
    "precision: {param_dtype: %s, reduce_dtype: fp32}\n"
    "strategy: %s\n"
    "mesh: [{dim: dp_shard, size: %d}]\n"
    "training:\n"
    "  steps: %d\n"
    "  micro_batch_size: %u\n"
    "  micro_batches: 4\n"
    "  accumulation: %s\n"
    "  optimizer: {adamw: {lr: 1.0e-3}}\n"
    "  clip_grad_norm: 1.0\n"
    "data: {synthetic: {task: regression, seed: 7}}\n"
    "init: {seed: 13}\n"
    "%s";

typedef struct bench_cfg {
    unsigned input_dim, rows;
    char hidden[128];
    int warmup, iters;
    const char *backend; /* "cpu" | "cuda": the job's spec.backend */
    const char *coll;    /* "gloo" | "nccl": the job's spec.collectives */
    int devices;         /* cuda devices: rank r computes on r % devices */
    int blas_threads;    /* per rank; 0 = auto (the CPUs divided by the ranks) */
    const char *accumulation; /* training.accumulation */
    const char *precision;    /* param_dtype: bf16 (default) | fp32 */
    const char *strategy;     /* full_shard (default) | shard_grad_op | no_shard */
} bench_cfg_t;

/* Per-rank means over the timed steps. */
typedef struct step_stats {
    double step, compute, ag, rs, cast, opt, wait;
    double ag_mb, rs_mb;
    double mem_mb; /* the unit runtime's peak backend memory (its own account) */
    double rss_mb; /* the rank process's peak RSS (VmHWM) */
} step_stats_t;

/* Peak resident set of this process in MB (VmHWM), 0 if unknown. */
static double peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1)
            break;
    fclose(f);
    return kb / 1024.0;
}

typedef struct rank_ctx {
    int warmup;
    int n;
    step_stats_t sum;
} rank_ctx_t;

static void on_report(void *ctx, const Pcs__V1__StepReport *r)
{
    rank_ctx_t *c = ctx;
    if (r->error && r->error[0])
        return;
    if ((int)r->step <= c->warmup)
        return;
    c->sum.step += r->step_ms;
    c->sum.compute += r->compute_ms;
    c->sum.ag += r->all_gather_ms;
    c->sum.rs += r->reduce_scatter_ms;
    c->sum.cast += r->cast_ms;
    c->sum.opt += r->optimizer_ms;
    c->sum.ag_mb += (double)r->all_gather_bytes / 1e6;
    c->sum.rs_mb += (double)(r->reduce_scatter_bytes + r->all_reduce_bytes) / 1e6;
    double mem = (double)r->runtime_memory_peak_bytes / 1e6;
    c->sum.mem_mb = mem > c->sum.mem_mb ? mem : c->sum.mem_mb; /* a max, not a sum */
    c->n++;
}

static Pcs__V1__JobSpec *make_spec(const bench_cfg_t *b, int world, int steps, const char *ckpt)
{
    char extra[1400] = "";
    int n = snprintf(extra, sizeof extra, "backend: %s\ncollectives: %s\n", b->backend, b->coll);
    if (ckpt)
        snprintf(extra + n, sizeof extra - (size_t)n, "checkpoint: {dir: '%s'}\n", ckpt);
    char yaml[4096];
    snprintf(yaml, sizeof yaml, k_job_fmt, b->input_dim, b->hidden, b->precision, b->strategy,
             world, steps, b->rows, b->accumulation, extra);
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &m) != PCS_OK) {
        fprintf(stderr, "pcs-step-bench: job: %s\n", pcs_last_error());
        return NULL;
    }
    return (Pcs__V1__JobSpec *)m;
}

static int rank_main(const bench_cfg_t *b, int world, int rank, int prefetch, int steps,
                     const char *dir, const char *ckpt, const char *out_path)
{
    Pcs__V1__JobSpec *spec = make_spec(b, world, steps, ckpt);
    Pcs__V1__Plan *plan = NULL;
    if (!spec || pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK)
        return 2;
    Pcs__V1__MeshCoords coords;
    Pcs__V1__Assignment as;
    pcs_bench_assignment(spec, plan, world, rank, "bench", &as, &coords);
    char kvdir[1200];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    rank_ctx_t rc;
    memset(&rc, 0, sizeof rc);
    rc.warmup = ckpt ? 0 : b->warmup;
    pcs_train_config_t tc;
    memset(&tc, 0, sizeof tc);
    tc.assignment = &as;
    tc.kv = kv;
    tc.coll_timeout_ms = 60000;
    tc.backend = b->backend;
    tc.coll = b->coll;
    tc.device = b->devices > 0 ? rank % b->devices : 0;
    tc.report = on_report;
    tc.report_ctx = &rc;
    tc.prefetch = prefetch;
    tc.blas_threads = (uint32_t)b->blas_threads;
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
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    if (st == PCS_OK && out_path && rc.n > 0) {
        FILE *f = fopen(out_path, "w");
        if (!f)
            return 2;
        double n = rc.n;
        fprintf(f, "%f %f %f %f %f %f %f %f %f %f\n", rc.sum.step / n, rc.sum.compute / n,
                rc.sum.ag / n, rc.sum.rs / n, rc.sum.cast / n, rc.sum.opt / n, rc.sum.ag_mb / n,
                rc.sum.rs_mb / n, rc.sum.mem_mb, peak_rss_mb());
        fclose(f);
    }
    return st == PCS_OK ? 0 : 1;
}

static void rmtree(const char *dir)
{
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "pcs-step-bench: could not remove %s\n", dir);
}

/* Run `world` ranks; fills the max over ranks of each per-rank mean. 0 on success. */
static int run(const bench_cfg_t *b, int world, int prefetch, int steps, const char *ckpt,
               step_stats_t *out)
{
    char dir[] = "/tmp/pcs-step-bench-XXXXXX";
    if (!mkdtemp(dir))
        return -1;
    pid_t pids[64];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char path[1200];
            snprintf(path, sizeof path, "%s/rank%d.txt", dir, r);
            _exit(rank_main(b, world, r, prefetch, steps, dir, ckpt, path));
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
        step_stats_t s;
        if (!f) {
            ok = ckpt != NULL; /* the check pass has no timed steps */
            continue;
        }
        if (fscanf(f, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &s.step, &s.compute, &s.ag, &s.rs,
                   &s.cast, &s.opt, &s.ag_mb, &s.rs_mb, &s.mem_mb, &s.rss_mb) != 10)
            ok = 0;
        fclose(f);
        out->step = fmax(out->step, s.step);
        out->compute = fmax(out->compute, s.compute);
        out->ag = fmax(out->ag, s.ag);
        out->rs = fmax(out->rs, s.rs);
        out->cast = fmax(out->cast, s.cast);
        out->opt = fmax(out->opt, s.opt);
        out->ag_mb = fmax(out->ag_mb, s.ag_mb);
        out->rs_mb = fmax(out->rs_mb, s.rs_mb);
        out->mem_mb = fmax(out->mem_mb, s.mem_mb);
        out->rss_mb = fmax(out->rss_mb, s.rss_mb);
    }
    rmtree(dir);
    return ok ? 0 : -1;
}

/* Untimed correctness pass: `steps` steps at W ranks vs the reference; returns #wrong. */
static long check(const bench_cfg_t *b, int world, int steps)
{
    char dir[] = "/tmp/pcs-step-check-XXXXXX";
    if (!mkdtemp(dir))
        return -1;
    char ckpt[1200], job_ckpt[1300], out[1300];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(job_ckpt, sizeof job_ckpt, "%s/bench", ckpt); /* the job's own directory */
    snprintf(out, sizeof out, "%s/final.safetensors", dir);
    step_stats_t s;
    long wrong = -1;
    Pcs__V1__JobSpec *spec = NULL;
    Pcs__V1__Plan *plan = NULL;
    pcs_reference_t *ref = NULL;
    pcs_st_file_t *f = NULL;
    float *buf = NULL;
    if (run(b, world, 1, steps, ckpt, &s) != 0 ||
        pcs_ckpt_export(job_ckpt, 0, out, NULL) != PCS_OK)
        goto done;
    spec = make_spec(b, world, steps, NULL);
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    if (!spec || pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK ||
        pcs_ref_create(spec, plan, &o, &ref) != PCS_OK || pcs_ref_run(ref) != PCS_OK ||
        pcs_st_open(out, &f) != PCS_OK)
        goto done;
    wrong = 0;
    const pcs_mlp_t *m = pcs_ref_model(ref);
    for (uint32_t i = 0; i < pcs_mlp_num_params(m); i++) {
        const pcs_named_tensor_t *p = pcs_mlp_param(m, i);
        const pcs_st_tensor_t *t = pcs_st_find(f, p->fqn);
        const float *r = pcs_ref_param(ref, p->fqn);
        free(buf);
        buf = malloc(p->numel * sizeof(float));
        if (!t || !r || !buf || pcs_st_read_f32(f, t, 0, p->numel, buf) != PCS_OK) {
            wrong += (long)p->numel;
            continue;
        }
        for (uint64_t e = 0; e < p->numel; e++)
            if (!(fabs((double)buf[e] - r[e]) <= 1e-3 + 1e-2 * fabs((double)r[e])))
                wrong++;
    }
done:
    free(buf);
    pcs_st_close(f);
    pcs_ref_destroy(ref);
    pcs_plan_free(plan);
    if (spec)
        protobuf_c_message_free_unpacked(&spec->base, NULL);
    rmtree(dir);
    return wrong;
}

/* Parameters of the bench model and rank 0's promise (estimate less the model's buffers). */
static int plan_numbers(const bench_cfg_t *b, int world, double *params, double *promise_mb)
{
    Pcs__V1__JobSpec *spec = make_spec(b, world, 1, NULL);
    Pcs__V1__Plan *plan = NULL;
    if (!spec || pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK) {
        if (spec)
            protobuf_c_message_free_unpacked(&spec->base, NULL);
        return -1;
    }
    *params = 0;
    for (size_t i = 0; i < plan->n_units; i++)
        *params += (double)plan->units[i]->numel;
    Pcs__V1__RankEstimate e;
    pcs_plan_rank_estimate(plan, 0, &e);
    *promise_mb = (double)(e.total_bytes - e.buffer_bytes) / 1e6;
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return 0;
}

/* --memory: bytes per model parameter against W. Two widths of the model (hidden 1024 and 2048,
 * 4 layers) run a few steps at each W; the slope between them (what one more parameter costs a
 * rank) is printed for the plan's promise, the runtime's own account and the process RSS, whose
 * fixed part (code, gRPC/Gloo, activations of 32 rows) the slope leaves out. */
static int memory_table(const bench_cfg_t *b0, const int *worlds, int n_worlds)
{
    const char *widths[2] = {"1024, 1024, 1024, 1024", "2048, 2048, 2048, 2048"};
    printf("# --memory: per-rank bytes per model parameter = (value at hidden 2048 - value at "
           "hidden 1024) / (params difference); FULL_SHARD bf16/fp32, AdamW, 4 micro-batches\n");
    printf("#  W    params(1024)  params(2048)  promise B/param  runtime B/param  RSS B/param  "
           "RSS/promise  RSS MB(2048)\n");
    int failures = 0;
    for (int wi = 0; wi < n_worlds; wi++) {
        int W = worlds[wi];
        double p[2], promise[2], mem[2], rss[2];
        int ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            bench_cfg_t b = *b0;
            snprintf(b.hidden, sizeof b.hidden, "%s", widths[k]);
            step_stats_t s;
            ok = plan_numbers(&b, W, &p[k], &promise[k]) == 0 &&
                 run(&b, W, 1, 3, NULL, &s) == 0;
            mem[k] = s.mem_mb;
            rss[k] = s.rss_mb;
        }
        if (!ok) {
            printf("%4d  run failed\n", W);
            failures++;
            continue;
        }
        double dp = p[1] - p[0];
        double pr = (promise[1] - promise[0]) * 1e6 / dp, rt = (mem[1] - mem[0]) * 1e6 / dp,
               rs = (rss[1] - rss[0]) * 1024 * 1024 / dp;
        printf("%4d  %12.0f  %12.0f  %15.2f  %15.2f  %11.2f  %11.2f  %12.1f\n", W, p[0], p[1],
               pr, rt, rs, pr > 0 ? rs / pr : 0, rss[1]);
        fflush(stdout);
    }
    printf("# Out of bounds values : %d %s\n", failures, failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    bench_cfg_t b = {256,  32, "1024, 1024, 1024, 1024", 2, 5, "cpu", "gloo", 0, 0, "reshard",
                     "bf16", "full_shard"};
    int rss_slope = 0;
    char cmdline[1024] = "";
    for (int i = 0, o = 0; i < argc && o < (int)sizeof cmdline - 2; i++)
        o += snprintf(cmdline + o, sizeof cmdline - (size_t)o, " %s", argv[i]);
    int worlds[8] = {1, 2, 4}, n_worlds = 3, check_steps = 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            b.iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc) {
            b.warmup = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-g") == 0 && i + 1 < argc) {
            n_worlds = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_worlds < 8; tok = strtok(NULL, ","))
                worlds[n_worlds++] = atoi(tok);
        } else if (strcmp(argv[i], "--tiny") == 0) {
            b.input_dim = 16;
            b.rows = 4;
            snprintf(b.hidden, sizeof b.hidden, "32, 32");
        } else if (strcmp(argv[i], "--check-steps") == 0 && i + 1 < argc) {
            check_steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) {
            b.backend = argv[++i];
        } else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            b.coll = argv[++i];
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            b.blas_threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-a") == 0 && i + 1 < argc) {
            b.accumulation = argv[++i];
        } else if (strcmp(argv[i], "--memory") == 0) {
            rss_slope = 1;
        } else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) {
            b.precision = argv[++i];
        } else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            b.strategy = argv[++i];
        } else {
            fprintf(stderr, "usage: pcs-step-bench [-g 1,2,4] [-n iters] [-w warmup] [--tiny] "
                            "[--check-steps N] [-d cpu|cuda] [-c gloo|nccl] [-t blas-threads] "
                            "[-a reshard|keep_gathered] [-p bf16|fp32] "
                            "[-s full_shard|shard_grad_op|no_shard] [--memory]\n");
            return 2;
        }
    }
    if (strcmp(b.precision, "bf16") != 0 && strcmp(b.precision, "fp32") != 0) {
        fprintf(stderr, "pcs-step-bench: -p: bf16 or fp32, got '%s'\n", b.precision);
        return 2;
    }
    if (strcmp(b.strategy, "full_shard") != 0 && strcmp(b.strategy, "shard_grad_op") != 0 &&
        strcmp(b.strategy, "no_shard") != 0) {
        fprintf(stderr, "pcs-step-bench: -s: full_shard, shard_grad_op or no_shard, got '%s'\n",
                b.strategy);
        return 2;
    }
    if (strcmp(b.backend, "cpu") != 0 && strcmp(b.backend, "cuda") != 0) {
        fprintf(stderr, "pcs-step-bench: -d: cpu or cuda, got '%s'\n", b.backend);
        return 2;
    }
    if (strcmp(b.coll, "gloo") != 0 && strcmp(b.coll, "nccl") != 0) {
        fprintf(stderr, "pcs-step-bench: -c: gloo or nccl, got '%s'\n", b.coll);
        return 2;
    }
    char devname[128] = "host";
    if (strcmp(b.backend, "cuda") == 0) {
        const pcs_backend_ops_t *be = NULL;
        if (pcs_backend_get("cuda", &be) != PCS_OK) {
            fprintf(stderr, "pcs-step-bench: -d cuda: %s (skipped)\n", pcs_last_error());
            return 77;
        }
        b.devices = be->device_count();
        uint64_t mem = 0;
        (void)be->device_info(0, devname, sizeof devname, &mem);
    }
    char host[64] = "?", cpu[128] = "?";
    gethostname(host, sizeof host);
    pcs_bench_cpu_model(cpu, sizeof cpu);
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("# pcs-step-bench  git %s  %s  cmd:%s", PCS_GIT_SHA, ts, cmdline);
    const char *shm = getenv("PCS_COLL_SHM");
    printf("\n# host %s  nproc %ld  cpu %s  backend %s (%s, %d devices)  coll %s (%s)\n", host,
           sysconf(_SC_NPROCESSORS_ONLN), cpu, b.backend, devname, b.devices, b.coll,
           strcmp(b.coll, "gloo") != 0     ? "device"
           : shm && strcmp(shm, "0") == 0 ? "loopback TCP: PCS_COLL_SHM=0"
                                           : "shared memory between the ranks of this host");
    printf("# model mlp %u-[%s]-16, %s %s params / fp32 reduce, AdamW, 4 micro-batches "
           "x %u rows per rank (accumulation: %s), clip 1.0\n",
           b.input_dim, b.hidden, b.strategy, b.precision, b.rows, b.accumulation);
    printf("# warmup %d steps, timed %d steps, per-rank mean, max over ranks; comm = AG + RS/AR "
           "time; overlap = max(compute, comm) / step\n",
           b.warmup, b.iters);
    if (rss_slope)
        return memory_table(&b, worlds, n_worlds);
    printf("# BLAS threads per rank: %s; mem = the unit runtime's peak memory (its account), RSS "
           "= the rank's peak resident set, max over ranks\n",
           b.blas_threads ? "-t" : "auto (CPUs / ranks on the host)");
    printf("#  W     async    step   compute      AG    RS+AR    cast     opt   AG MB  RS MB  "
           "overlap #wrong  blas  mem MB  RSS MB\n");
    printf("#                 (ms)      (ms)    (ms)     (ms)    (ms)    (ms)                   "
           "         \n");
    int failures = 0;
    for (int wi = 0; wi < n_worlds; wi++) {
        int W = worlds[wi];
        long wrong = check_steps > 0 ? check(&b, W, check_steps) : 0;
        if (wrong != 0)
            failures++;
        for (int pf = 1; pf >= 0; pf--) {
            if (W == 1 && pf == 0)
                continue; /* nothing to prefetch without communication */
            step_stats_t s;
            if (run(&b, W, pf, b.warmup + b.iters, NULL, &s) != 0) {
                printf("%4d  %8s  run failed\n", W, pf ? "on" : "off");
                failures++;
                continue;
            }
            double comm = s.ag + s.rs;
            double ov = s.step > 0 ? fmax(s.compute, comm) / s.step : 0;
            int threads = b.blas_threads ? b.blas_threads
                                         : pcs_cpu_rank_threads(pcs_cpu_available(),
                                                                pcs_cpu_online(), (uint32_t)W);
            printf("%4d  %8s %7.1f %9.1f %7.1f %8.1f %7.1f %7.1f %7.1f %6.1f %8.3f %6ld %5d "
                   "%7.1f %7.1f\n",
                   W, pf ? "on" : "off", s.step, s.compute, s.ag, s.rs, s.cast, s.opt, s.ag_mb,
                   s.rs_mb, ov, wrong, threads, s.mem_mb, s.rss_mb);
            fflush(stdout);
        }
    }
    printf("# Out of bounds values : %d %s\n", failures, failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
