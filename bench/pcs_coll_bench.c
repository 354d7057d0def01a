/* pcs-coll-bench: all_gather / reduce_scatter / all_reduce through pcs_coll, nccl-tests style
 * (STYLE.md B12). Spawns -g rank processes itself (fork; the backend is initialized only in the
 * children), rendezvous through a file KV store in a temp dir. For the Gloo backend the same run
 * also times the plain Gloo library call at the same sizes (gloo::allgather, gloo::allreduce
 * fp32) on the same context, so the layer's overhead is visible. When the ranks' collectives
 * run over shared memory (coll/shm.h: the default for ranks on one host), the same calls are
 * also timed on a second communicator forced to TCP ("tcp" columns). Correctness is checked in a
 * separate untimed pass (#wrong). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "coll/coll.h"
#include "coll/kv.h"
#include "pcs/clock.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/version.h"

typedef struct opts {
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, ranks, check;
    pcs_dtype_t dt;
    pcs_red_op_t op;
    const char *colls;
    const char *csv;
    pcs_coll_backend_t backend;
    char cmd[512];
} opts_t;

enum { AG, RS, AR, NCOLL };
static const char *coll_name[NCOLL] = {"AG", "RS", "AR"};

static void usage(void)
{
    fprintf(
        stderr,
        "usage: pcs-coll-bench [-g ranks] [-b min_bytes] [-e max_bytes] [-f factor] [-n iters]\n"
        "                      [-w warmup] [-d fp32|bf16|fp16] [-o sum|avg|max] [-c 0|1]\n"
        "                      [-C ag,rs,ar] [-B|--coll gloo|nccl] [-F out.csv]\n"
        "  sizes take K/M/G suffixes; size = total bytes (count_per_rank * ranks * elem for\n"
        "  AG/RS, count * elem for AR) as in nccl-tests.\n");
}

// ---- data and checks ----

static void fill(void *buf, size_t n, pcs_dtype_t dt, int rank, size_t base)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)((rank * 7 + (int)((base + i) % 13)) % 13); /* small ints: exact sums */
        if (dt == PCS_DTYPE_BF16)
            ((uint16_t *)buf)[i] = pcs_f32_to_bf16(v);
        else if (dt == PCS_DTYPE_FP16)
            ((uint16_t *)buf)[i] = pcs_f32_to_fp16(v);
        else
            ((float *)buf)[i] = v;
    }
}

static float load(const void *p, size_t i, pcs_dtype_t dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Reference of a reduction of element index `gi` over ranks: exact for sum/max of small ints; avg
 * compared with a tolerance of 2 ulps of the dtype (the ncclAvg pre-multiply rounds). */
static long wrong_reduce(const void *out, size_t n, size_t base, pcs_dtype_t dt, pcs_red_op_t op,
                         int P)
{
    double tol = dt == PCS_DTYPE_BF16 ? 2.0 / 128 : dt == PCS_DTYPE_FP16 ? 2.0 / 1024 : 4e-7;
    long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = 0, mx = -1;
        for (int r = 0; r < P; r++) {
            double v = (double)((r * 7 + (int)((base + i) % 13)) % 13);
            sum += v;
            mx = v > mx ? v : mx;
        }
        double want = op == PCS_RED_SUM ? sum : op == PCS_RED_MAX ? mx : sum / P;
        double got = load(out, i, dt);
        if (op == PCS_RED_AVG ? fabs(got - want) > tol * (fabs(want) + 1) : got != want)
            wrong++;
    }
    return wrong;
}

static long wrong_gather(const void *out, size_t n, int P, pcs_dtype_t dt)
{
    long wrong = 0;
    for (int r = 0; r < P; r++)
        for (size_t i = 0; i < n; i++)
            if (load(out, (size_t)r * n + i, dt) != (float)((r * 7 + (int)(i % 13)) % 13))
                wrong++;
    return wrong;
}

// ---- one rank ----

typedef struct result {
    double t_us, raw_us, tcp_us; /* max over ranks of the mean per iteration; < 0: not measured */
    long wrong;
} result_t;

static pcs_status_t run_coll(pcs_coll_t *c, int coll, const void *in, void *out, size_t count,
                             pcs_dtype_t dt, const pcs_coll_red_t *red)
{
    switch (coll) {
    case AG:
        return pcs_coll_all_gather(c, in, out, count, dt, NULL);
    case RS:
        return pcs_coll_reduce_scatter(c, in, out, count, dt, red, NULL);
    default:
        return pcs_coll_all_reduce(c, in, out, count, dt, red, NULL);
    }
}

static pcs_status_t run_raw(pcs_coll_t *c, int coll, const void *in, void *out, size_t count,
                            pcs_dtype_t dt)
{
    if (coll == AG)
        return pcs_coll_gloo_raw_all_gather(c, in, out, count * pcs_dtype_size(dt));
    memcpy(out, in, count * sizeof(float));
    return pcs_coll_gloo_raw_all_reduce_f32(c, out, count);
}

/* Max over ranks of a per-rank value (all_gather of doubles through the communicator). */
static pcs_status_t max_over_ranks(pcs_coll_t *c, double v, double *out)
{
    int P = pcs_coll_size(c);
    double *all = calloc((size_t)P, sizeof *all);
    if (!all)
        return PCS_ERR_NOMEM;
    pcs_status_t rc = pcs_coll_all_gather(c, &v, all, 1, PCS_DTYPE_FP64, NULL);
    double m = v;
    for (int r = 0; rc == PCS_OK && r < P; r++)
        m = all[r] > m ? all[r] : m;
    free(all);
    *out = m;
    return rc;
}

static double time_loop(pcs_coll_t *c, int coll, int raw, const void *in, void *out, size_t count,
                        const opts_t *o, const pcs_coll_red_t *red, pcs_status_t *rc)
{
    for (int i = 0; i < o->warmup && *rc == PCS_OK; i++)
        *rc = raw ? run_raw(c, coll, in, out, count, o->dt)
                  : run_coll(c, coll, in, out, count, o->dt, red);
    if (*rc == PCS_OK)
        *rc = pcs_coll_barrier(c);
    uint64_t t0 = pcs_now_us();
    for (int i = 0; i < o->iters && *rc == PCS_OK; i++)
        *rc = raw ? run_raw(c, coll, in, out, count, o->dt)
                  : run_coll(c, coll, in, out, count, o->dt, red);
    double us = (double)(pcs_now_us() - t0) / o->iters;
    double m = us;
    if (*rc == PCS_OK)
        *rc = max_over_ranks(c, us, &m);
    return m;
}

static int rank_main(int rank, const opts_t *o, const char *dir, int out_fd)
{
    pcs_kv_t *kv = NULL;
    pcs_coll_t *c = NULL;
    if (pcs_kv_file_create(dir, &kv) != PCS_OK)
        return 1;
    pcs_coll_config_t cfg = {0};
    cfg.backend = o->backend;
    cfg.kv = kv;
    cfg.group_name = "bench";
    cfg.rank = rank;
    cfg.size = o->ranks;
    cfg.timeout_ms = 60000;
    cfg.cuda_device = o->backend == PCS_COLL_NCCL ? rank : -1;
    if (pcs_coll_create(&cfg, &c) != PCS_OK) {
        fprintf(stderr, "rank %d: create: %s\n", rank, pcs_last_error());
        pcs_kv_destroy(kv);
        return 1;
    }
    pcs_coll_t *ctcp = NULL; /* the TCP twin of a shared-memory communicator */
    if (strcmp(pcs_coll_transport(c), "shm") == 0) {
        cfg.group_name = "bench-tcp";
        cfg.transport = PCS_COLL_TRANSPORT_TCP;
        if (pcs_coll_create(&cfg, &ctcp) != PCS_OK) {
            fprintf(stderr, "rank %d: create tcp: %s\n", rank, pcs_last_error());
            return 1;
        }
    }
    const int P = o->ranks;
    const size_t es = pcs_dtype_size(o->dt);
    const pcs_coll_red_t red = {o->op, 0, 0};
    const pcs_backend_ops_t *be = NULL;
    int nccl = o->backend == PCS_COLL_NCCL;
    if (nccl && pcs_backend_get("cuda", &be) != PCS_OK) {
        fprintf(stderr, "rank %d: cuda kernels: %s\n", rank, pcs_last_error());
        return 1;
    }
    size_t cap = o->max_bytes + (size_t)P * es;
    char *hin = malloc(cap), *hout = malloc(cap);
    void *in = hin, *out = hout;
    if (nccl && (be->alloc(cap, &in) != PCS_OK || be->alloc(cap, &out) != PCS_OK))
        return 1;
    if (!hin || !hout)
        return 1;
    pcs_status_t rc = PCS_OK;
    for (int coll = 0; coll < NCOLL && rc == PCS_OK; coll++) {
        if (!strstr(o->colls, coll == AG ? "ag" : coll == RS ? "rs" : "ar"))
            continue;
        for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && rc == PCS_OK;
             bytes = (size_t)ceil((double)bytes * o->factor)) {
            /* per-rank count: AG/RS split the total over ranks, AR reduces the whole buffer */
            size_t count = coll == AR ? bytes / es : bytes / es / (size_t)P;
            if (count == 0)
                continue;
            size_t in_n = coll == RS ? count * (size_t)P : count;
            size_t out_n = coll == AG ? count * (size_t)P : count;
            result_t res = {0, -1, -1, 0};
            /* untimed correctness pass */
            fill(hin, in_n, o->dt, rank, 0);
            if (nccl)
                rc = be->copy(in, hin, in_n * es, PCS_COPY_H2D, NULL);
            if (rc == PCS_OK)
                rc = run_coll(c, coll, in, out, count, o->dt, &red);
            if (nccl && rc == PCS_OK) {
                rc = be->sync(NULL);
                if (rc == PCS_OK)
                    rc = be->copy(hout, out, out_n * es, PCS_COPY_D2H, NULL);
            }
            if (rc != PCS_OK)
                break;
            long w = 0;
            if (o->check) {
                if (coll == AG)
                    w = wrong_gather(hout, count, P, o->dt);
                else
                    w = wrong_reduce(hout, count, coll == RS ? (size_t)rank * count : 0, o->dt,
                                     o->op, P);
            }
            double wd = (double)w, wsum = wd;
            rc = max_over_ranks(c, wd, &wsum); /* any rank wrong -> reported */
            res.wrong = (long)wsum;
            /* timed passes */
            if (rc == PCS_OK)
                res.t_us = time_loop(c, coll, 0, in, out, count, o, &red, &rc);
            if (rc == PCS_OK && ctcp)
                res.tcp_us = time_loop(ctcp, coll, 0, in, out, count, o, &red, &rc);
            int raw_ok =
                !nccl && P > 1 &&
                (coll == AG || (coll == AR && o->dt == PCS_DTYPE_FP32 && o->op == PCS_RED_SUM));
            if (rc == PCS_OK && raw_ok)
                res.raw_us = time_loop(ctcp ? ctcp : c, coll, 1, hin, hout, count, o, &red, &rc);
            if (rank == 0 && rc == PCS_OK) {
                double rec[5] = {(double)coll, (double)bytes, res.t_us, res.raw_us, res.tcp_us};
                double rec2[2] = {(double)res.wrong, (double)count};
                if (write(out_fd, rec, sizeof rec) != sizeof rec ||
                    write(out_fd, rec2, sizeof rec2) != sizeof rec2)
                    rc = PCS_ERR_SYSTEM;
            }
        }
    }
    if (rc != PCS_OK)
        fprintf(stderr, "rank %d: %s\n", rank, pcs_last_error());
    if (nccl) {
        be->free(in);
        be->free(out);
    }
    free(hin);
    free(hout);
    pcs_coll_destroy(ctcp);
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return rc == PCS_OK ? 0 : 1;
}

// ---- report ----

static double busbw_factor(int coll, int P)
{
    return coll == AR ? 2.0 * (P - 1) / P : (double)(P - 1) / P;
}

static void print_row(FILE *csv, const opts_t *o, const double rec[5], const double rec2[2],
                      double *bw_sum, int *bw_n)
{
    int coll = (int)rec[0];
    size_t bytes = (size_t)rec[1];
    double t = rec[2], raw = rec[3], tcp = rec[4];
    double alg = t > 0 ? (double)bytes / 1e3 / t : 0.0, bus = alg * busbw_factor(coll, o->ranks);
    const char *redop = coll == AG             ? "-"
                        : o->op == PCS_RED_SUM ? "sum"
                        : o->op == PCS_RED_AVG ? "avg"
                                               : "max";
    size_t elems = bytes / pcs_dtype_size(o->dt);
    printf(" %11zu %12zu %5s %3s %5s %10.1f %7.3f %7.3f %6ld", bytes, elems, pcs_dtype_name(o->dt),
           coll_name[coll], redop, t, alg, bus, (long)rec2[0]);
    if (tcp >= 0)
        printf(" %10.1f %6.2f", tcp, tcp > 0 ? t / tcp : 0.0);
    else
        printf(" %10s %6s", "-", "-");
    if (raw >= 0) {
        double ralg = raw > 0 ? (double)bytes / 1e3 / raw : 0.0;
        double rbus = ralg * busbw_factor(coll, o->ranks);
        printf(" %10.1f %7.3f %7.3f %6.2f\n", raw, ralg, rbus, raw > 0 ? t / raw : 0.0);
    } else {
        printf(" %10s %7s %7s %6s\n", "-", "-", "-", "-");
    }
    if (csv)
        fprintf(csv, "%zu,%zu,%s,%s,%s,%.3f,%.4f,%.4f,%ld,%.3f,%.3f\n", bytes, elems,
                pcs_dtype_name(o->dt), coll_name[coll], redop, t, alg, bus, (long)rec2[0], raw,
                tcp);
    *bw_sum += bus;
    (*bw_n)++;
}

int main(int argc, char **argv)
{
    opts_t o = {8,          1 << 20, 2.0,           20, 5, 2, 1, PCS_DTYPE_FP32, PCS_RED_SUM,
                "ag,rs,ar", NULL,    PCS_COLL_GLOO, ""};
    size_t used = 0;
    for (int i = 0; i < argc && used + 2 < sizeof o.cmd; i++)
        used += (size_t)snprintf(o.cmd + used, sizeof o.cmd - used, "%s%s", i ? " " : "", argv[i]);
    static const struct option longopts[] = {{"coll", required_argument, NULL, 'B'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "g:b:e:f:n:w:d:o:c:C:B:F:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'g':
            o.ranks = atoi(optarg);
            break;
        case 'b':
            if (pcs_bench_parse_size(optarg, &o.min_bytes)) {
                usage();
                return 2;
            }
            break;
        case 'e':
            if (pcs_bench_parse_size(optarg, &o.max_bytes)) {
                usage();
                return 2;
            }
            break;
        case 'f':
            o.factor = atof(optarg);
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'd': {
            int d = pcs_dtype_parse(optarg);
            if (d != PCS_DTYPE_FP32 && d != PCS_DTYPE_BF16 && d != PCS_DTYPE_FP16) {
                usage();
                return 2;
            }
            o.dt = (pcs_dtype_t)d;
            break;
        }
        case 'o':
            if (!strcmp(optarg, "sum"))
                o.op = PCS_RED_SUM;
            else if (!strcmp(optarg, "avg"))
                o.op = PCS_RED_AVG;
            else if (!strcmp(optarg, "max"))
                o.op = PCS_RED_MAX;
            else {
                usage();
                return 2;
            }
            break;
        case 'c':
            o.check = atoi(optarg);
            break;
        case 'C':
            o.colls = optarg;
            break;
        case 'B':
            if (!strcmp(optarg, "gloo"))
                o.backend = PCS_COLL_GLOO;
            else if (!strcmp(optarg, "nccl"))
                o.backend = PCS_COLL_NCCL;
            else {
                usage();
                return 2;
            }
            break;
        case 'F':
            o.csv = optarg;
            break;
        default:
            usage();
            return 2;
        }
    }
    if (o.ranks < 1 || o.ranks > 64 || o.factor <= 1.0 || o.iters < 1 || o.warmup < 0 ||
        o.min_bytes == 0 || o.min_bytes > o.max_bytes) {
        usage();
        return 2;
    }

    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("# pcs-coll-bench  git %s  %s  cmd: %s\n", PCS_GIT_SHA, when, o.cmd);
    printf("# backend %s  nRanks %d (processes on this host)  cpus %ld\n",
           o.backend == PCS_COLL_GLOO ? "gloo" : "nccl", o.ranks, sysconf(_SC_NPROCESSORS_ONLN));
    printf("# warmup %d iters %d validation 1 timing max-over-ranks of the mean; raw = plain Gloo "
           "library call over TCP (AG: gloo::allgather; AR: gloo::allreduce fp32 sum; RS: none in "
           "Gloo 2022-05)\n",
           o.warmup, o.iters);
    printf("# gloo transport: shared memory when the ranks share this host (PCS_COLL_SHM=0: TCP); "
           "tcp time = the same call on a second communicator forced to TCP\n");
    printf("#%11s %12s %5s %3s %5s %10s %7s %7s %6s %10s %6s %10s %7s %7s %6s\n", "size", "count",
           "type", "op", "redop", "time", "algbw", "busbw", "#wrong", "tcp time", "ratio",
           "raw time", "algbw", "busbw", "ratio");
    printf("#%11s %12s %5s %3s %5s %10s %7s %7s %6s %10s %6s %10s %7s %7s %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "t/tcp", "(us)",
           "(GB/s)", "(GB/s)", "t/raw");
    fflush(stdout);

    const char *base = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/pcs-coll-bench-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        return 1;
    }
    pid_t pids[64];
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0) {
            close(fds[0]);
            int code = rank_main(r, &o, dir, fds[1]);
            fflush(NULL);
            _exit(code);
        }
    }
    close(fds[1]);
    FILE *csv = NULL;
    if (o.csv) {
        csv = fopen(o.csv, "w");
        if (csv)
            fprintf(csv, "size_bytes,count,type,op,redop,time_us,algbw_gbps,busbw_gbps,wrong,"
                         "raw_time_us,tcp_time_us\n");
    }
    double rec[5], rec2[2], bw_sum = 0;
    int bw_n = 0;
    long total_wrong = 0;
    while (read(fds[0], rec, sizeof rec) == sizeof rec &&
           read(fds[0], rec2, sizeof rec2) == sizeof rec2) {
        print_row(csv, &o, rec, rec2, &bw_sum, &bw_n);
        total_wrong += (long)rec2[0];
        fflush(stdout);
    }
    close(fds[0]);
    int failed = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    }
    if (csv)
        fclose(csv);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.3f\n", bw_n ? bw_sum / bw_n : 0.0);
    if (failed)
        printf("# a rank failed (see stderr)\n");
    return failed || total_wrong ? 1 : 0;
}
