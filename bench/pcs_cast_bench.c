/* pcs-cast-bench: bandwidth of the kernel backend's casts against a plain copy of the same
 * traffic, measured in the same run (STYLE.md B12). For each size S (bytes of the fp32 side) and
 * each cast, GB/s = (bytes read + bytes written) / time, i.e. 6 B per element; the baseline
 * copies S*3/4 bytes (memcpy on cpu, a device-to-device copy on cuda), which also moves 6 B per
 * element. Correctness is checked in a separate untimed pass (#wrong, vs the scalar pcs/half.h).
 * Times are the best of -r interleaved rounds (the shared CI machine is noisy).
 *   pcs-cast-bench [-d cpu|cuda] [-b 4K] [-e 256M] [-f 2] [-w 3] [-n 20] [-r 5] [-s auto]
 *                  [-F out.csv]      (-s: the CPU vector path, for comparing them) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/version.h"

typedef struct opts {
    const char *dev;
    size_t min_bytes, max_bytes;
    unsigned factor;
    int warmup, iters, rounds;
    const char *csv;
    const char *simd;
} opts_t;

typedef struct cast_case {
    const char *name;
    pcs_dtype_t st, dt;
} cast_case_t;

static const cast_case_t cases[] = {
    {"f32>bf16", PCS_DTYPE_FP32, PCS_DTYPE_BF16},
    {"f32>f16", PCS_DTYPE_FP32, PCS_DTYPE_FP16},
    {"bf16>f32", PCS_DTYPE_BF16, PCS_DTYPE_FP32},
    {"f16>f32", PCS_DTYPE_FP16, PCS_DTYPE_FP32},
};
#define NCASES (sizeof cases / sizeof cases[0])

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: pcs-cast-bench [-d cpu|cuda] [-b min_bytes] [-e max_bytes] [-f factor]"
            " [-w warmup] [-n iters] [-r rounds] [-s auto|avx512|avx2|scalar] [-F csv]\n"
            "  sizes are bytes of the fp32 side, with K/M/G suffixes (default 4K..256M x2)\n");
}

typedef struct bufs {
    const pcs_backend_ops_t *be;
    pcs_stream_t s;
    void *f32, *h16; /* device: n fp32, n 16-bit */
    void *copy_src, *copy_dst;
    float *host_f32; /* host mirrors for checking */
    uint16_t *host_h16, *check16;
    float *check32;
} bufs_t;

/* Run `iters` back-to-back ops and return seconds per op (host clock around a sync). */
static double time_cast(bufs_t *b, const cast_case_t *c, size_t n, int warmup, int iters)
{
    void *dst = c->dt == PCS_DTYPE_FP32 ? b->f32 : b->h16;
    void *src = c->st == PCS_DTYPE_FP32 ? b->f32 : b->h16;
    for (int i = 0; i < warmup; i++)
        if (pcs_kernel_cast(b->be, dst, c->dt, src, c->st, n, b->s) != PCS_OK)
            return -1.0;
    if (b->be->sync(b->s) != PCS_OK)
        return -1.0;
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (pcs_kernel_cast(b->be, dst, c->dt, src, c->st, n, b->s) != PCS_OK)
            return -1.0;
    if (b->be->sync(b->s) != PCS_OK)
        return -1.0;
    return (now_s() - t0) / iters;
}

static double time_copy(bufs_t *b, size_t bytes, int warmup, int iters)
{
    pcs_copy_kind_t k = strcmp(b->be->name, "cpu") == 0 ? PCS_COPY_H2H : PCS_COPY_D2D;
    for (int i = 0; i < warmup; i++)
        if (b->be->copy(b->copy_dst, b->copy_src, bytes, k, b->s) != PCS_OK)
            return -1.0;
    if (b->be->sync(b->s) != PCS_OK)
        return -1.0;
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (b->be->copy(b->copy_dst, b->copy_src, bytes, k, b->s) != PCS_OK)
            return -1.0;
    if (b->be->sync(b->s) != PCS_OK)
        return -1.0;
    return (now_s() - t0) / iters;
}

/* Untimed pass: run the cast once and compare every element with the scalar pcs/half.h code. */
static long check_cast(bufs_t *b, const cast_case_t *c, size_t n)
{
    const pcs_copy_kind_t up = strcmp(b->be->name, "cpu") == 0 ? PCS_COPY_H2H : PCS_COPY_H2D;
    const pcs_copy_kind_t down = up == PCS_COPY_H2H ? PCS_COPY_H2H : PCS_COPY_D2H;
    long wrong = 0;
    if (c->st == PCS_DTYPE_FP32) {
        if (b->be->copy(b->f32, b->host_f32, n * 4, up, b->s) != PCS_OK ||
            pcs_kernel_cast(b->be, b->h16, c->dt, b->f32, c->st, n, b->s) != PCS_OK ||
            b->be->copy(b->check16, b->h16, n * 2, down, b->s) != PCS_OK ||
            b->be->sync(b->s) != PCS_OK)
            return (long)n;
        for (size_t i = 0; i < n; i++) {
            uint16_t want = c->dt == PCS_DTYPE_BF16 ? pcs_f32_to_bf16(b->host_f32[i])
                                                    : pcs_f32_to_fp16(b->host_f32[i]);
            wrong += b->check16[i] != want;
        }
    } else {
        if (b->be->copy(b->h16, b->host_h16, n * 2, up, b->s) != PCS_OK ||
            pcs_kernel_cast(b->be, b->f32, c->dt, b->h16, c->st, n, b->s) != PCS_OK ||
            b->be->copy(b->check32, b->f32, n * 4, down, b->s) != PCS_OK ||
            b->be->sync(b->s) != PCS_OK)
            return (long)n;
        for (size_t i = 0; i < n; i++) {
            float want = c->st == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(b->host_h16[i])
                                                 : pcs_fp16_to_f32(b->host_h16[i]);
            wrong += pcs_f32_bits(b->check32[i]) != pcs_f32_bits(want);
        }
    }
    return wrong;
}

int main(int argc, char **argv)
{
    opts_t o = {"cpu", 4096, (size_t)256 << 20, 2, 3, 20, 5, NULL, "auto"};
    int opt;
    while ((opt = getopt(argc, argv, "d:b:e:f:w:n:r:F:s:h")) != -1) {
        switch (opt) {
        case 'd':
            o.dev = optarg;
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
            o.factor = (unsigned)atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'r':
            o.rounds = atoi(optarg);
            break;
        case 'F':
            o.csv = optarg;
            break;
        case 's':
            o.simd = optarg;
            break;
        default:
            usage();
            return opt == 'h' ? 0 : 2;
        }
    }
    if (o.factor < 2 || o.iters < 1 || o.rounds < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes ||
        o.min_bytes < 8) {
        usage();
        return 2;
    }
    const int is_cpu = strcmp(o.dev, "cpu") == 0;
    double target = is_cpu ? 0.80 : 0.85;
    size_t target_from = is_cpu ? ((size_t)1 << 20) : ((size_t)64 << 20);

    char cmd[512] = "";
    for (int i = 0; i < argc; i++) {
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 2);
        strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    }
    char when[32];
    time_t t = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    printf("# pcs-cast-bench  git %s  %s  cmd: %s\n", PCS_GIT_SHA, when, cmd);

    if (pcs_cpu_simd_select(o.simd) != PCS_OK) {
        fprintf(stderr, "pcs-cast-bench: -s %s: %s\n", o.simd, pcs_last_error());
        return 2;
    }
    bufs_t b;
    memset(&b, 0, sizeof b);
    pcs_status_t got = pcs_backend_get(o.dev, &b.be);
    if (got != PCS_OK) {
        /* a backend that is merely unavailable here (no GPU) is not an error of the bench */
        printf("# %s backend not available: %s\n", o.dev, pcs_last_error());
        return got == PCS_ERR_UNSUPPORTED ? 0 : 2;
    }
    printf("# backend %s  cpu simd %s  warmup %d iters %d (more below 200 MB moved) best of %d "
           "rounds  validation 1\n",
           b.be->name, pcs_cpu_simd_name(), o.warmup, o.iters, o.rounds);
    printf("# GB/s = (bytes read + bytes written)/time = 6 B/element; baseline: %s of the same "
           "traffic (S*3/4 B copied)\n",
           is_cpu ? "memcpy" : "device-to-device copy");

    size_t nmax = o.max_bytes / 4;
    int rc = 1;
    FILE *csv = NULL;
    if (b.be->stream_create(&b.s) != PCS_OK || b.be->alloc(nmax * 4, &b.f32) != PCS_OK ||
        b.be->alloc(nmax * 2, &b.h16) != PCS_OK ||
        b.be->alloc(nmax * 3 + 16, &b.copy_src) != PCS_OK ||
        b.be->alloc(nmax * 3 + 16, &b.copy_dst) != PCS_OK) {
        fprintf(stderr, "pcs-cast-bench: allocation failed: %s\n", pcs_last_error());
        goto out;
    }
    b.host_f32 = malloc(nmax * 4);
    b.host_h16 = malloc(nmax * 2);
    b.check16 = malloc(nmax * 2);
    b.check32 = malloc(nmax * 4);
    if (!b.host_f32 || !b.host_h16 || !b.check16 || !b.check32) {
        fprintf(stderr, "pcs-cast-bench: host allocation failed\n");
        goto out;
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nmax; i++) {
        r ^= r >> 12;
        r ^= r << 25;
        r ^= r >> 27;
        uint64_t x = r * 2685821657736338717ull;
        /* normal-range values with random mantissas and both signs (+ ties and specials) */
        b.host_f32[i] =
            pcs_bits_f32((uint32_t)(x & 0x807fffffu) | ((uint32_t)(100 + (x >> 40) % 60) << 23));
        b.host_h16[i] = (uint16_t)(x >> 24);
    }
    memset(b.check16, 0, nmax * 2);
    {
        pcs_copy_kind_t up = is_cpu ? PCS_COPY_H2H : PCS_COPY_H2D;
        if (b.be->copy(b.f32, b.host_f32, nmax * 4, up, b.s) != PCS_OK ||
            b.be->copy(b.h16, b.host_h16, nmax * 2, up, b.s) != PCS_OK ||
            b.be->copy(b.copy_src, b.host_f32, nmax * 3, up, b.s) != PCS_OK ||
            b.be->copy(b.copy_dst, b.host_f32, nmax * 3, up, b.s) != PCS_OK ||
            b.be->sync(b.s) != PCS_OK)
            goto out;
    }
    if (o.csv) {
        csv = fopen(o.csv, "w");
        if (!csv) {
            fprintf(stderr, "pcs-cast-bench: cannot write %s\n", o.csv);
            goto out;
        }
        fprintf(csv, "size_bytes,count,type,time_us,gbps,copy_time_us,copy_gbps,ratio,wrong\n");
    }

    printf("#%11s %12s %9s %10s %8s %10s %8s %6s %6s\n", "size", "count", "type", "time", "GB/s",
           "copy", "GB/s", "ratio", "#wrong");
    printf("#%11s %12s %9s %10s %8s %10s %8s %6s %6s\n", "(B)", "(elements)", "", "(us)", "",
           "(us)", "", "", "");
    long total_wrong = 0;
    double ratio_sum = 0.0, ratio_min = 1e9;
    int ratio_n = 0;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
        size_t n = bytes / 4;
        size_t moved = n * 6;
        /* small sizes: repeat so one measurement spans at least ~20 ms of work at ~10 GB/s */
        int iters = o.iters;
        while (iters < 100000 && (double)iters * (double)moved < 2e8)
            iters *= 2;
        /* best of `rounds` interleaved rounds: copy and casts alternate, so a noisy neighbour
         * on a shared machine slows both sides alike, and the minimum is the uncontended time */
        double tc = 1e30, tks[NCASES];
        for (size_t k = 0; k < NCASES; k++)
            tks[k] = 1e30;
        for (int round = 0; round < o.rounds; round++) {
            double x = time_copy(&b, n * 3, o.warmup, iters);
            if (x < 0) {
                fprintf(stderr, "pcs-cast-bench: copy failed: %s\n", pcs_last_error());
                goto out;
            }
            tc = x < tc ? x : tc;
            for (size_t k = 0; k < NCASES; k++) {
                double y = time_cast(&b, &cases[k], n, o.warmup, iters);
                if (y < 0) {
                    fprintf(stderr, "pcs-cast-bench: %s failed: %s\n", cases[k].name,
                            pcs_last_error());
                    goto out;
                }
                tks[k] = y < tks[k] ? y : tks[k];
            }
        }
        for (size_t k = 0; k < NCASES; k++) {
            const cast_case_t *c = &cases[k];
            double tk = tks[k];
            long wrong = check_cast(&b, c, n);
            total_wrong += wrong;
            double gbps = (double)moved / tk / 1e9, cgbps = (double)moved / tc / 1e9;
            double ratio = gbps / cgbps;
            if (bytes >= target_from) {
                ratio_sum += ratio;
                ratio_n++;
                ratio_min = ratio < ratio_min ? ratio : ratio_min;
            }
            printf(" %11zu %12zu %9s %10.2f %8.2f %10.2f %8.2f %6.2f %6ld\n", bytes, n, c->name,
                   tk * 1e6, gbps, tc * 1e6, cgbps, ratio, wrong);
            if (csv)
                fprintf(csv, "%zu,%zu,%s,%.3f,%.3f,%.3f,%.3f,%.4f,%ld\n", bytes, n, c->name,
                        tk * 1e6, gbps, tc * 1e6, cgbps, ratio, wrong);
        }
        fflush(stdout);
        if (bytes > o.max_bytes / o.factor)
            break;
    }
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    if (ratio_n > 0)
        printf("# Avg cast/copy ratio at >= %zu B: %.3f (min %.3f), target >= %.2f: %s\n",
               target_from, ratio_sum / ratio_n, ratio_min, target,
               ratio_sum / ratio_n >= target ? "MET" : "NOT MET");
    else
        printf("# no size >= %zu B in this run: target (>= %.2f of copy) not evaluated\n",
               target_from, target);
    rc = total_wrong ? 1 : 0;
out:
    if (csv)
        fclose(csv);
    if (b.be) {
        b.be->free(b.f32);
        b.be->free(b.h16);
        b.be->free(b.copy_src);
        b.be->free(b.copy_dst);
        b.be->stream_destroy(b.s);
    }
    free(b.host_f32);
    free(b.host_h16);
    free(b.check16);
    free(b.check32);
    return rc;
}
