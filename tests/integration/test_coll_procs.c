/* The Gloo collectives with real processes on loopback: 1-4 ranks forked from this test (Gloo and
 * gRPC are only ever initialized in the children), rendezvous through a file KV store in a temp
 * dir or through a real pcs-coordinator's KV. Every op x dtype x count {0, 1, 7, 1000, 65537} is
 * compared bit-exactly with a reference computed here in the documented ring order (coll.h).
 * Failures: SIGKILL of a rank mid-collective, a silent peer (timeout), abort from a thread.
 * Everything runs on both Gloo transports: shared memory (what ranks on one host get) and TCP;
 * ranks whose locality keys differ (PCS_HOST_ID) must agree on TCP; ranks issuing different
 * collectives over shared memory must fail with a message saying so. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/kv.h"
#include "coll/shm.h"
#include "pcs/clock.h"
#include "pcs/half.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "test_util.h"

#define TIMEOUT_MS 2000

/* 65537 and 300007 span several shared-memory rounds (1 MiB slots) with an uneven last one */
static const size_t counts[] = {0, 1, 7, 1000, 65537, 300007};
static const pcs_dtype_t dtypes[] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16,
                                     PCS_DTYPE_FP64};

// ---- independent reference arithmetic (scalar, per element, via pcs/half.h) ----
/* In double: every fp32/bf16/fp16 sum or product of two such values computed in double and
 * rounded to fp32 is the fp32 result (double rounding is innocuous for + and x at 53 >= 2x24+2
 * bits), then rounded once more to bf16/fp16 as the layer does; fp64 is its own dtype. */

static double ld(const void *p, size_t i, pcs_dtype_t dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(((const uint16_t *)p)[i]);
    if (dt == PCS_DTYPE_FP64)
        return ((const double *)p)[i];
    return ((const float *)p)[i];
}

/* Round a value to the dtype and back. */
static double rnd(double v, pcs_dtype_t dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(pcs_f32_to_bf16((float)v));
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(pcs_f32_to_fp16((float)v));
    if (dt == PCS_DTYPE_FP64)
        return v;
    return (float)v;
}

static void st(void *p, size_t i, pcs_dtype_t dt, double v)
{
    if (dt == PCS_DTYPE_BF16)
        ((uint16_t *)p)[i] = pcs_f32_to_bf16((float)v);
    else if (dt == PCS_DTYPE_FP16)
        ((uint16_t *)p)[i] = pcs_f32_to_fp16((float)v);
    else if (dt == PCS_DTYPE_FP64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Input element i of rank r for test case `tc`: mixed signs and magnitudes so that rounding in
 * every dtype matters, and some +0 / -0 so that MAX's operand order shows (coll.h: a tie goes to
 * the first operand, so max(+0, -0) is +0 and max(-0, +0) is -0). fp64 inputs are thirds of
 * those, which no fp32 holds. */
static double input_val(int tc, int r, size_t i, pcs_dtype_t dt)
{
    uint32_t h = mix((uint32_t)tc * 2654435761U ^ mix((uint32_t)r * 97U + (uint32_t)i));
    if (h % 7u == 0)
        return (h >> 8) & 1u ? -0.0 : 0.0;
    float mant = (float)((int)(h % 20001u) - 10000) / 3001.0f;
    float v = ldexpf(mant, (int)((h >> 20) % 9u) - 4);
    return dt == PCS_DTYPE_FP64 ? (double)v / 3.0 : v;
}

static void fill_input(void *buf, size_t n, pcs_dtype_t dt, int tc, int r)
{
    for (size_t i = 0; i < n; i++)
        st(buf, i, dt, input_val(tc, r, i, dt));
}

/* x times the factor of a divide by d, as the layer multiplies: the fp32 reciprocal (fp64: the
 * double one) */
static double times_div(double x, double d, pcs_dtype_t dt)
{
    double f = dt == PCS_DTYPE_FP64 ? 1.0 / d : (double)(float)(1.0 / d);
    return rnd(x * f, dt);
}

/* One contribution as the layer prepares it: x, then * (1/pre), then * rnd(1/P) for avg, each
 * rounded to the dtype. */
static double contrib(double x, pcs_dtype_t dt, const pcs_coll_red_t *red, int P)
{
    if (red->pre_div != 0 && red->pre_div != 1)
        x = times_div(x, red->pre_div, dt);
    if (red->op == PCS_RED_AVG)
        x = rnd(x * (dt == PCS_DTYPE_FP64 ? 1.0 / P : rnd((float)(1.0 / P), dt)), dt);
    return x;
}

/* Reduction of element `i` of chunk owned by `owner`, in ring order owner+1, ..., owner, each
 * step rnd(x op acc) with the arriving rank's x first (coll.h). vals[r] = rank r's dtype value. */
static double ring_ref(const double *vals, int P, int owner, pcs_dtype_t dt,
                       const pcs_coll_red_t *red)
{
    double acc = contrib(vals[(owner + 1) % P], dt, red, P);
    for (int s = 2; s <= P; s++) {
        double x = contrib(vals[(owner + s) % P], dt, red, P);
        double mx = x != x ? acc : (acc > x ? acc : x); /* coll.h's MAX, x first */
        acc = red->op == PCS_RED_MAX ? rnd(mx, dt) : rnd(x + acc, dt);
    }
    if (red->post_div != 0 && red->post_div != 1)
        acc = times_div(acc, red->post_div, dt);
    return acc;
}

static int same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

// ---- child side ----

static char g_msg[1024];

#define CHILD_FAIL(...)                                                                            \
    do {                                                                                           \
        snprintf(g_msg, sizeof g_msg, __VA_ARGS__);                                                \
        return 1;                                                                                  \
    } while (0)

/* The transport the children ask for (set before fork) and whether they must get shared memory. */
static int g_transport = PCS_COLL_TRANSPORT_AUTO;
static int g_expect_tcp;

static int child_open(const char *dir, int rank, int size, const char *group, pcs_kv_t **kv,
                      pcs_coll_t **c, int timeout_ms)
{
    if (pcs_kv_file_create(dir, kv) != PCS_OK)
        CHILD_FAIL("kv: %s", pcs_last_error());
    pcs_coll_config_t cfg = {0};
    cfg.backend = PCS_COLL_GLOO;
    cfg.kv = *kv;
    cfg.group_name = group;
    cfg.rank = rank;
    cfg.size = size;
    cfg.timeout_ms = timeout_ms;
    cfg.transport = g_transport;
    if (pcs_coll_create(&cfg, c) != PCS_OK)
        CHILD_FAIL("create: %s", pcs_last_error());
    const char *want =
        size > 1 && g_transport == PCS_COLL_TRANSPORT_AUTO && !g_expect_tcp ? "shm" : "tcp";
    if (strcmp(pcs_coll_transport(*c), want) != 0)
        CHILD_FAIL("transport %s, want %s", pcs_coll_transport(*c), want);
    unsigned live[PCS_COLL_LIVE_N]; /* this process's only communicator, counted once */
    pcs_coll_live(live);
    int k = want[0] == 's' ? PCS_COLL_LIVE_SHM : PCS_COLL_LIVE_TCP;
    if (live[k] != 1 || live[PCS_COLL_LIVE_SHM] + live[PCS_COLL_LIVE_TCP] != 1)
        CHILD_FAIL("live communicators shm %u tcp %u, want one %s", live[PCS_COLL_LIVE_SHM],
                   live[PCS_COLL_LIVE_TCP], want);
    return 0;
}

static int check_vals(const char *what, const void *got, size_t n, pcs_dtype_t dt,
                      double (*expect)(size_t i, void *arg), void *arg)
{
    for (size_t i = 0; i < n; i++) {
        double e = rnd(expect(i, arg), dt), g = ld(got, i, dt);
        if (!same_bits(e, g))
            CHILD_FAIL("%s %s: element %zu of %zu: got %.17g want %.17g", what, pcs_dtype_name(dt),
                       i, n, g, e);
    }
    return 0;
}

typedef struct ref_ctx {
    int tc, P, owner;
    size_t count, chunk_off;
    pcs_dtype_t dt;
    const pcs_coll_red_t *red;
} ref_ctx_t;

static double exp_all_gather(size_t i, void *arg)
{
    ref_ctx_t *x = arg;
    return input_val(x->tc, (int)(i / x->count), i % x->count, x->dt);
}

static double exp_reduce(size_t i, void *arg)
{
    ref_ctx_t *x = arg;
    double vals[8];
    for (int r = 0; r < x->P; r++)
        vals[r] = rnd(input_val(x->tc, r, x->chunk_off + i, x->dt), x->dt);
    return ring_ref(vals, x->P, x->owner, x->dt, x->red);
}

static double exp_bcast(size_t i, void *arg)
{
    ref_ctx_t *x = arg;
    return input_val(x->tc, x->owner, i, x->dt);
}

/* 1.5 and 3 have reciprocals no fp32 holds: the fp64 divide must not use the fp32 one */
static const pcs_coll_red_t reds[] = {{PCS_RED_SUM, 0, 0},
                                      {PCS_RED_AVG, 0, 0},
                                      {PCS_RED_MAX, 0, 0},
                                      {PCS_RED_SUM, 2.0, 1.5},
                                      {PCS_RED_SUM, 3.0, 0}};

/* The full op x dtype x count matrix on one rank. */
static int child_matrix(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "world", &kv, &c, TIMEOUT_MS * 5))
        return 1;
    int tc = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t n = counts[ci];
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
            pcs_dtype_t dt = dtypes[di];
            size_t es = pcs_dtype_size(dt);
            char *in = calloc(n * (size_t)P + 1, es), *out = calloc(n * (size_t)P + 1, es);
            char *out2 = calloc(n * (size_t)P + 1, es);
            if (!in || !out || !out2)
                CHILD_FAIL("oom");
            ref_ctx_t x = {.P = P, .count = n, .dt = dt};

            /* all_gather, out of place and in place */
            x.tc = ++tc;
            fill_input(in, n, dt, x.tc, rank);
            if (pcs_coll_all_gather(c, in, out, n, dt, NULL) != PCS_OK)
                CHILD_FAIL("all_gather: %s", pcs_last_error());
            if (check_vals("all_gather", out, n * (size_t)P, dt, exp_all_gather, &x))
                return 1;
            memset(out, 0, n * (size_t)P * es);
            fill_input(out + (size_t)rank * n * es, n, dt, x.tc, rank);
            if (pcs_coll_all_gather(c, out + (size_t)rank * n * es, out, n, dt, NULL) != PCS_OK)
                CHILD_FAIL("all_gather in place: %s", pcs_last_error());
            if (check_vals("all_gather in place", out, n * (size_t)P, dt, exp_all_gather, &x))
                return 1;

            for (size_t ri = 0; ri < sizeof reds / sizeof reds[0]; ri++) {
                x.red = &reds[ri];
                /* reduce_scatter: in = P*n, out = n, chunk rank */
                x.tc = ++tc;
                fill_input(in, n * (size_t)P, dt, x.tc, rank);
                if (pcs_coll_reduce_scatter(c, in, out, n, dt, x.red, NULL) != PCS_OK)
                    CHILD_FAIL("reduce_scatter op %zu: %s", ri, pcs_last_error());
                x.owner = rank;
                x.chunk_off = (size_t)rank * n;
                if (check_vals("reduce_scatter", out, n, dt, exp_reduce, &x))
                    return 1;
                /* the input is the caller's (const): left as it was */
                memset(out2, 0, n * (size_t)P * es);
                fill_input(out2, n * (size_t)P, dt, x.tc, rank);
                if (memcmp(in, out2, n * (size_t)P * es) != 0)
                    CHILD_FAIL("reduce_scatter op %zu count %zu: the input was written", ri, n);
                /* in place: out is chunk `rank` of in (NCCL's in-place form) */
                if (pcs_coll_reduce_scatter(c, in, in + (size_t)rank * n * es, n, dt, x.red,
                                            NULL) != PCS_OK)
                    CHILD_FAIL("reduce_scatter in place op %zu: %s", ri, pcs_last_error());
                if (check_vals("reduce_scatter in place", in + (size_t)rank * n * es, n, dt,
                               exp_reduce, &x))
                    return 1;

                /* all_reduce in place: chunk k of the buffer reduced starting at k+1 */
                x.tc = ++tc;
                fill_input(out, n, dt, x.tc, rank);
                if (pcs_coll_all_reduce(c, out, out, n, dt, x.red, NULL) != PCS_OK)
                    CHILD_FAIL("all_reduce op %zu: %s", ri, pcs_last_error());
                for (int k = 0; k < P; k++) {
                    size_t off, cn;
                    pcs_coll_chunk(n, P, k, &off, &cn);
                    x.owner = k;
                    x.chunk_off = off;
                    if (check_vals("all_reduce", out + off * es, cn, dt, exp_reduce, &x))
                        return 1;
                }
            }

            /* broadcast from the last rank */
            x.tc = ++tc;
            x.owner = P - 1;
            if (rank == P - 1)
                fill_input(out, n, dt, x.tc, rank);
            else
                memset(out, 0xff, n * es);
            if (pcs_coll_broadcast(c, out, n, dt, P - 1, NULL) != PCS_OK)
                CHILD_FAIL("broadcast: %s", pcs_last_error());
            if (check_vals("broadcast", out, n, dt, exp_bcast, &x))
                return 1;

            /* plain point-to-point, as between pipeline stages: rank 0 -> rank P-1 */
            if (P > 1 && (rank == 0 || rank == P - 1)) {
                x.tc = ++tc;
                x.owner = 0;
                pcs_status_t rc;
                if (rank == 0) {
                    fill_input(in, n, dt, x.tc, 0);
                    rc = pcs_coll_send(c, in, n, dt, P - 1, NULL);
                } else {
                    memset(out, 0xff, n * es);
                    rc = pcs_coll_recv(c, out, n, dt, 0, NULL);
                }
                if (rc != PCS_OK)
                    CHILD_FAIL("send/recv: %s", pcs_last_error());
                if (rank == P - 1 && check_vals("recv", out, n, dt, exp_bcast, &x))
                    return 1;
            } else if (P > 1) {
                ++tc; /* keep the case numbering identical on every rank */
            }

            /* group: send right + recv left (a ring shift) + an all_gather, issued as one */
            if (P > 1) {
                x.tc = ++tc;
                fill_input(in, n, dt, x.tc, rank);
                int right = (rank + 1) % P, left = (rank + P - 1) % P;
                pcs_status_t rc = pcs_coll_group_start(c);
                if (rc == PCS_OK)
                    rc = pcs_coll_send(c, in, n, dt, right, NULL);
                if (rc == PCS_OK)
                    rc = pcs_coll_recv(c, out, n, dt, left, NULL);
                if (rc == PCS_OK)
                    rc = pcs_coll_all_gather(c, in, out2, n, dt, NULL);
                pcs_status_t rc2 = pcs_coll_group_end(c);
                if (rc != PCS_OK || rc2 != PCS_OK)
                    CHILD_FAIL("group: %s", pcs_last_error());
                x.owner = left;
                if (check_vals("group recv", out, n, dt, exp_bcast, &x))
                    return 1;
                if (check_vals("group all_gather", out2, n * (size_t)P, dt, exp_all_gather, &x))
                    return 1;
            }
            free(in);
            free(out);
            free(out2);
        }
    }
    if (pcs_coll_barrier(c) != PCS_OK)
        CHILD_FAIL("barrier: %s", pcs_last_error());
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

/* Repeated large all_reduce until killed or failed; writes
 * "<status> <ms> <blamed rank> <fault>\n<message>". */
static int child_loop(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "kill", &kv, &c, TIMEOUT_MS))
        return 1;
    size_t n = 1 << 20;
    float *buf = calloc(n, sizeof *buf);
    pcs_coll_red_t red = {PCS_RED_SUM, 0, 0};
    char path[512];
    snprintf(path, sizeof path, "%s/started.%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("started\n", f);
        fclose(f);
    }
    pcs_status_t rc = PCS_OK;
    uint64_t t_fail = 0;
    for (int it = 0; it < 100000 && rc == PCS_OK; it++) {
        rc = pcs_coll_all_reduce(c, buf, buf, n, PCS_DTYPE_FP32, &red, NULL);
        t_fail = pcs_now_ms();
    }
    snprintf(path, sizeof path, "%s/result.%d", dir, rank);
    f = fopen(path, "w");
    if (f) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pcs_last_error());
        pcs_coll_fault_t fault;
        int blamed = pcs_coll_blame(c, &fault);
        fprintf(f, "%d %llu %d %d\n%s", (int)rc, (unsigned long long)t_fail, blamed, (int)fault,
                msg);
        fclose(f);
    }
    free(buf);
    pcs_coll_abort(c, "test done");
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return rc == PCS_OK ? 1 : 0;
}

/* Rank 1 joins but never calls the collective: rank 0 must time out naming it. */
static int child_silent(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "silent", &kv, &c, 500))
        return 1;
    if (rank == 1) {
        pcs_test_sleep_ms(1500);
        pcs_coll_destroy(c);
        pcs_kv_destroy(kv);
        return 0;
    }
    float v = 1.0f;
    pcs_coll_red_t red = {PCS_RED_SUM, 0, 0};
    uint64_t t0 = pcs_now_ms();
    pcs_status_t rc = pcs_coll_all_reduce(c, &v, &v, 1, PCS_DTYPE_FP32, &red, NULL);
    uint64_t dt = pcs_now_ms() - t0;
    if (rc != PCS_ERR_TIMEOUT)
        CHILD_FAIL("want timeout, got %s: %s", pcs_status_str(rc), pcs_last_error());
    if (!strstr(pcs_last_error(), "peer rank 1"))
        CHILD_FAIL("timeout message does not name rank 1: %s", pcs_last_error());
    if (dt < 400 || dt > 2500)
        CHILD_FAIL("timed out after %llu ms, want ~500", (unsigned long long)dt);
    pcs_coll_fault_t fault;
    if (pcs_coll_blame(c, &fault) != 1 || fault != PCS_COLL_FAULT_SILENT)
        CHILD_FAIL("blame: rank %d fault %d, want rank 1 SILENT", pcs_coll_blame(c, NULL),
                   (int)fault);
    /* poisoned afterwards */
    if (pcs_coll_all_reduce(c, &v, &v, 1, PCS_DTYPE_FP32, &red, NULL) != PCS_ERR_STATE)
        CHILD_FAIL("second call after a timeout is not a state error");
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

typedef struct abort_arg {
    pcs_coll_t *c;
    int delay_ms;
} abort_arg_t;

static void *abort_thread(void *p)
{
    abort_arg_t *a = p;
    pcs_test_sleep_ms(a->delay_ms);
    pcs_coll_abort(a->c, "membership changed");
    return NULL;
}

/* Rank 0 blocks in all_reduce (rank 1 is late); another thread aborts: CANCELLED, fast. Rank 1
 * then joins and must get an error naming rank 0's abort rather than hang. */
static int child_abort(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "abort", &kv, &c, 5000))
        return 1;
    float v[64] = {0};
    pcs_coll_red_t red = {PCS_RED_SUM, 0, 0};
    if (rank == 0) {
        abort_arg_t a = {c, 200};
        pthread_t th;
        pthread_create(&th, NULL, abort_thread, &a);
        uint64_t t0 = pcs_now_ms();
        pcs_status_t rc = pcs_coll_all_reduce(c, v, v, 64, PCS_DTYPE_FP32, &red, NULL);
        uint64_t dt = pcs_now_ms() - t0;
        pthread_join(th, NULL);
        if (rc != PCS_ERR_CANCELLED)
            CHILD_FAIL("want cancelled, got %s: %s", pcs_status_str(rc), pcs_last_error());
        if (dt > 2000)
            CHILD_FAIL("abort took %llu ms to wake the call", (unsigned long long)dt);
        if (!strstr(pcs_last_error(), "membership changed"))
            CHILD_FAIL("cancel message lacks the reason: %s", pcs_last_error());
        if (pcs_coll_blame(c, NULL) != -1)
            CHILD_FAIL("an abort blames rank %d", pcs_coll_blame(c, NULL));
        pcs_test_sleep_ms(1500); /* let rank 1 see the closed connection */
    } else {
        pcs_test_sleep_ms(800);
        uint64_t t0 = pcs_now_ms();
        pcs_status_t rc = pcs_coll_all_reduce(c, v, v, 64, PCS_DTYPE_FP32, &red, NULL);
        uint64_t dt = pcs_now_ms() - t0;
        if (rc == PCS_OK)
            CHILD_FAIL("all_reduce with an aborted peer succeeded");
        if (dt > 4000)
            CHILD_FAIL("error after %llu ms", (unsigned long long)dt);
        if (!strstr(pcs_last_error(), "rank 0"))
            CHILD_FAIL("error does not name rank 0: %s", pcs_last_error());
        /* rank 0 left on purpose (its note says so): that is not a peer fault */
        if (pcs_coll_blame(c, NULL) != -1)
            CHILD_FAIL("a peer's abort blamed on rank %d: %s", pcs_coll_blame(c, NULL),
                       pcs_last_error());
    }
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

/* Two ranks rendezvous through the real coordinator's KV (kv_coord) and run collectives. */
static char g_coord_addr[64], g_job_id[64];
static char g_secret[2][160]; /* of the workers holding ranks 0 and 1: the KV is theirs only */
static uint64_t g_generation;

static int child_coord(int rank, int P, const char *dir)
{
    (void)dir;
    pcs_kv_t *kv = NULL;
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(g_coord_addr, &cl) != PCS_OK ||
        pcs_rpc_client_set_worker_secret(cl, g_secret[rank]) != PCS_OK)
        CHILD_FAIL("client: %s", pcs_last_error());
    if (pcs_kv_coord_create_on(cl, g_job_id, g_generation, 5000, &kv) != PCS_OK)
        CHILD_FAIL("kv coord: %s", pcs_last_error());
    pcs_coll_config_t cfg = {0};
    cfg.backend = PCS_COLL_GLOO;
    cfg.kv = kv;
    cfg.group_name = "world";
    cfg.rank = rank;
    cfg.size = P;
    cfg.timeout_ms = 10000;
    pcs_coll_t *c = NULL;
    if (pcs_coll_create(&cfg, &c) != PCS_OK)
        CHILD_FAIL("create through the coordinator KV: %s", pcs_last_error());
    float v[5], all[10];
    for (int i = 0; i < 5; i++)
        v[i] = (float)(rank * 10 + i);
    pcs_coll_red_t sum = {PCS_RED_SUM, 0, 0};
    if (pcs_coll_all_gather(c, v, all, 5, PCS_DTYPE_FP32, NULL) != PCS_OK)
        CHILD_FAIL("all_gather: %s", pcs_last_error());
    for (int i = 0; i < 10; i++)
        if (all[i] != (float)((i / 5) * 10 + i % 5))
            CHILD_FAIL("all_gather element %d = %g", i, (double)all[i]);
    if (pcs_coll_all_reduce(c, v, v, 5, PCS_DTYPE_FP32, &sum, NULL) != PCS_OK)
        CHILD_FAIL("all_reduce: %s", pcs_last_error());
    for (int i = 0; i < 5; i++)
        if (v[i] != (float)(10 + 2 * i))
            CHILD_FAIL("all_reduce element %d = %g", i, (double)v[i]);
    pcs_coll_destroy(c);
    /* A stale generation is refused by the coordinator with a clear error. */
    pcs_kv_t *stale = NULL;
    if (pcs_kv_coord_create_on(cl, g_job_id, g_generation + 7, 5000, &stale) != PCS_OK)
        CHILD_FAIL("kv coord (stale): %s", pcs_last_error());
    pcs_status_t rc = pcs_kv_set(stale, "x", "y", 1);
    if (rc != PCS_ERR_STATE)
        CHILD_FAIL("stale generation set: want state error, got %s: %s", pcs_status_str(rc),
                   pcs_last_error());
    pcs_kv_destroy(stale);
    pcs_kv_destroy(kv);
    /* and a client without a worker's secret reads nothing of it */
    pcs_kv_t *anon = NULL;
    pcs_rpc_client_t *nobody = NULL;
    if (pcs_rpc_client_create(g_coord_addr, &nobody) != PCS_OK ||
        pcs_kv_coord_create_on(nobody, g_job_id, g_generation, 5000, &anon) != PCS_OK)
        CHILD_FAIL("kv coord (no secret): %s", pcs_last_error());
    void *val = NULL;
    size_t got = 0;
    rc = pcs_kv_get(anon, "x", 0, &val, &got);
    free(val);
    if (rc != PCS_ERR_UNAUTHENTICATED)
        CHILD_FAIL("get without a secret: want unauthenticated, got %s: %s", pcs_status_str(rc),
                   pcs_last_error());
    pcs_kv_destroy(anon);
    pcs_rpc_client_destroy(nobody);
    pcs_rpc_client_destroy(cl);
    return 0;
}

static int register_fake_worker(pcs_rpc_client_t *cl, const char *identity, char *secret,
                                size_t n)
{
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    char *backends[] = {"gloo"};
    req.identity = (char *)identity;
    req.host = "127.0.0.1";
    req.pid = (uint32_t)getpid();
    req.n_backends = 1;
    req.backends = backends;
    req.address = "127.0.0.1";
    ProtobufCMessage *resp = NULL;
    if (pcs_rpc_call(cl, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor, 5000,
                     &resp, NULL) != PCS_OK)
        CHILD_FAIL("Register: %s", pcs_last_error());
    snprintf(secret, n, "%s", ((Pcs__V1__RegisterResponse *)resp)->worker_secret);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* Runs in its own process (gRPC must not be initialized in the forking test process): register
 * two fake workers, submit the 2-rank tiny job, wait until it RUNS and write "<job> <gen>". */
static int child_setup_job(int rank, int P, const char *dir)
{
    (void)rank;
    (void)P;
    pcs_rpc_client_t *cl = NULL;
    if (pcs_rpc_client_create(g_coord_addr, &cl) != PCS_OK)
        CHILD_FAIL("client: %s", pcs_last_error());
    char secret[2][160]; /* of w-1 and w-2 */
    if (register_fake_worker(cl, "coll-test-a", secret[0], sizeof secret[0]) ||
        register_fake_worker(cl, "coll-test-b", secret[1], sizeof secret[1]))
        return 1;
    int holder[2] = {-1, -1}; /* rank -> index into secret */
    char path[1024];
    ProtobufCMessage *spec = NULL;
    if (pcs_pb_from_yaml_file(pcs_test_src("examples/tiny-job.yaml", path, sizeof path),
                              &pcs__v1__job_spec__descriptor, &spec) != PCS_OK)
        CHILD_FAIL("job spec: %s", pcs_last_error());
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.request_id = "coll-kv-test";
    req.spec = (Pcs__V1__JobSpec *)spec;
    ProtobufCMessage *resp = NULL;
    pcs_status_t rc = pcs_rpc_call(cl, PCS_M_SUBMIT_JOB, &req.base,
                                   &pcs__v1__submit_job_response__descriptor, 10000, &resp, NULL);
    protobuf_c_message_free_unpacked(spec, NULL);
    if (rc != PCS_OK)
        CHILD_FAIL("SubmitJob: %s", pcs_last_error());
    Pcs__V1__SubmitJobResponse *sr = (Pcs__V1__SubmitJobResponse *)resp;
    if (!sr->job)
        CHILD_FAIL("SubmitJob: no job in the reply");
    char job_id[64];
    snprintf(job_id, sizeof job_id, "%s", sr->job->job_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    /* gang start: 2 idle workers are registered, the job must be RUNNING shortly */
    uint64_t gen = 0;
    for (int i = 0; i < 100 && !gen; i++) {
        Pcs__V1__GetJobRequest gr = PCS__V1__GET_JOB_REQUEST__INIT;
        gr.job_id = job_id;
        if (pcs_rpc_call(cl, PCS_M_GET_JOB, &gr.base, &pcs__v1__get_job_response__descriptor, 5000,
                         &resp, NULL) != PCS_OK)
            CHILD_FAIL("GetJob: %s", pcs_last_error());
        Pcs__V1__GetJobResponse *jr = (Pcs__V1__GetJobResponse *)resp;
        if (jr->job && jr->job->state == PCS__V1__JOB_STATE__JOB_STATE_RUNNING &&
            jr->job->n_workers == 2) {
            gen = jr->job->generation;
            for (int r = 0; r < 2; r++)
                holder[r] = strcmp(jr->job->workers[r], "w-1") == 0   ? 0
                            : strcmp(jr->job->workers[r], "w-2") == 0 ? 1
                                                                      : -1;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
        if (!gen)
            pcs_test_sleep_ms(50);
    }
    pcs_rpc_client_destroy(cl);
    if (!gen)
        CHILD_FAIL("job %s never became RUNNING", job_id);
    if (holder[0] < 0 || holder[1] < 0)
        CHILD_FAIL("job %s: ranks not held by the two fake workers", job_id);
    snprintf(path, sizeof path, "%s/job", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        CHILD_FAIL("cannot write the job file in %.200s", dir);
    fprintf(f, "%s %llu %s %s\n", job_id, (unsigned long long)gen, secret[holder[0]],
            secret[holder[1]]);
    fclose(f);
    return 0;
}

/* Spec case 25, the DDP compress hooks as pcs runs them (ddp_comm_hook, planner: SUM with a
 * pre-divide by the group in the hook's dtype): gradients 1, 2, 3, 4 average to 2.5, and 60000 on
 * every rank stays 60000 in fp16 (divide before the sum: 4 x 60000 would overflow fp16's 65504);
 * bf16 first rounds 60000 to 59904, which survives the same way. */
static int child_ddp_hook(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "ddp-hook", &kv, &c, TIMEOUT_MS * 5))
        return 1;
    const pcs_dtype_t dts[2] = {PCS_DTYPE_FP16, PCS_DTYPE_BF16};
    const float want[2][2] = {{2.5f, 60000.0f}, {2.5f, 59904.0f}};
    pcs_coll_red_t red = {PCS_RED_SUM, (double)P, 0};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        float buf[2]; /* room for two elements of any dtype */
        st(buf, 0, dts[k], (float)(rank + 1)); /* the hook's cast of the fp32 gradient */
        st(buf, 1, dts[k], 60000.0f);
        if (pcs_coll_all_reduce(c, buf, buf, 2, dts[k], &red, NULL) != PCS_OK) {
            snprintf(g_msg, sizeof g_msg, "all_reduce %s: %s", pcs_dtype_name(dts[k]),
                     pcs_last_error());
            rc = 1;
        }
        for (int i = 0; i < 2 && !rc; i++)
            if (!same_bits(ld(buf, (size_t)i, dts[k]), want[k][i])) {
                snprintf(g_msg, sizeof g_msg, "%s element %d: got %.9g want %.9g",
                         pcs_dtype_name(dts[k]), i, (double)ld(buf, (size_t)i, dts[k]),
                         (double)want[k][i]);
                rc = 1;
            }
    }
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return rc;
}

// ---- parent side ----

typedef int (*child_fn)(int rank, int P, const char *dir);

static void spawn_ranks(int P, const char *dir, child_fn fn, pid_t *pids)
{
    fflush(NULL);
    for (int r = 0; r < P; r++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int code = fn(r, P, dir);
            if (code != 0) {
                fprintf(stderr, "rank %d/%d: %s\n", r, P, g_msg);
                char path[512];
                snprintf(path, sizeof path, "%s/error.%d", dir, r);
                FILE *f = fopen(path, "w");
                if (f) {
                    fputs(g_msg, f);
                    fclose(f);
                }
            }
            fflush(NULL);
            _exit(code);
        }
        pids[r] = pid;
    }
}

static void expect_all_ok(int P, pid_t *pids, int timeout_ms)
{
    for (int r = 0; r < P; r++) {
        int st = pcs_test_wait(pids[r], timeout_ms);
        if (st == -1)
            pcs_test_stop(pids[r], 100);
        assert_int_not_equal(st, -1);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

/* Segments are removed from /dev/shm as soon as every rank mapped them: none of these
 * processes may have left one behind, whatever happened to them. */
static unsigned long pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0ul;
}

static void assert_no_segments_left(int P, const pid_t *pids)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        for (int r = 0; r < P; r++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "pcs-coll-%lu-%d-", pid_ns(), (int)pids[r]);
            if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
                fail_msg("/dev/shm/%s left behind by rank %d", e->d_name, r);
        }
    closedir(d);
}

static void run_children(int P, int transport, child_fn fn, const char *name, int timeout_ms)
{
    char *dir = pcs_test_tmpdir(name);
    pid_t pids[4];
    uint64_t t0 = pcs_now_ms();
    g_transport = transport;
    spawn_ranks(P, dir, fn, pids);
    g_transport = PCS_COLL_TRANSPORT_AUTO;
    expect_all_ok(P, pids, timeout_ms);
    fprintf(stderr, "# %d ranks, %s: %s took %llu ms\n", P,
            transport == PCS_COLL_TRANSPORT_TCP ? "tcp" : "auto", name,
            (unsigned long long)(pcs_now_ms() - t0));
    assert_no_segments_left(P, pids);
    pcs_test_rmtree(dir);
    free(dir);
}

static void run_matrix(int P, int transport)
{
    run_children(P, transport, child_matrix, "coll", 180000);
}

static void test_every_op_dtype_count_matches_ring_reference_1_rank(void **s)
{
    (void)s;
    run_matrix(1, PCS_COLL_TRANSPORT_AUTO);
}
static void test_every_op_dtype_count_matches_ring_reference_2_ranks_shm(void **s)
{
    (void)s;
    run_matrix(2, PCS_COLL_TRANSPORT_AUTO);
}
static void test_every_op_dtype_count_matches_ring_reference_3_ranks_shm(void **s)
{
    (void)s;
    run_matrix(3, PCS_COLL_TRANSPORT_AUTO);
}
static void test_every_op_dtype_count_matches_ring_reference_4_ranks_shm(void **s)
{
    (void)s;
    run_matrix(4, PCS_COLL_TRANSPORT_AUTO);
}
static void test_every_op_dtype_count_matches_ring_reference_2_ranks_tcp(void **s)
{
    (void)s;
    run_matrix(2, PCS_COLL_TRANSPORT_TCP);
}
static void test_every_op_dtype_count_matches_ring_reference_3_ranks_tcp(void **s)
{
    (void)s;
    run_matrix(3, PCS_COLL_TRANSPORT_TCP);
}
static void test_every_op_dtype_count_matches_ring_reference_4_ranks_tcp(void **s)
{
    (void)s;
    run_matrix(4, PCS_COLL_TRANSPORT_TCP);
}

/* The direct reduce-scatter over TCP (PCS_COLL_RS_ALGO=direct) gives the ring's bits too. */
static void test_every_op_dtype_count_matches_ring_reference_4_ranks_tcp_direct_rs(void **s)
{
    (void)s;
    setenv("PCS_COLL_RS_ALGO", "direct", 1);
    run_matrix(4, PCS_COLL_TRANSPORT_TCP);
    unsetenv("PCS_COLL_RS_ALGO");
}

/* Ranks 0 and 1 claim different hosts (PCS_HOST_ID, NCCL_HOSTID's role): all of them must settle
 * on TCP (a shared-memory rank waiting for a TCP one would hang) and compute the same sums. */
static int child_tcp_sum(int rank, int P, const char *dir)
{
    g_expect_tcp = 1;
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "hosts", &kv, &c, TIMEOUT_MS * 5))
        return 1;
    float v[5] = {0};
    for (int i = 0; i < 5; i++)
        v[i] = (float)(rank + 1) * (float)(i + 1);
    pcs_coll_red_t red = {PCS_RED_SUM, 0, 0};
    if (pcs_coll_all_reduce(c, v, v, 5, PCS_DTYPE_FP32, &red, NULL) != PCS_OK)
        CHILD_FAIL("all_reduce: %s", pcs_last_error());
    for (int i = 0; i < 5; i++)
        if (v[i] != (float)(P * (P + 1) / 2) * (float)(i + 1))
            CHILD_FAIL("element %d: %g", i, (double)v[i]);
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

static int child_other_hosts(int rank, int P, const char *dir)
{
    setenv("PCS_HOST_ID", rank == 1 ? "node-b" : "node-a", 1);
    return child_tcp_sum(rank, P, dir);
}

static void test_ranks_on_different_hosts_agree_on_tcp(void **s)
{
    (void)s;
    run_children(3, PCS_COLL_TRANSPORT_AUTO, child_other_hosts, "coll-hosts", 30000);
}

/* Only rank 2 says PCS_COLL_SHM=0: the others wanted shared memory and must settle on TCP too. */
static int child_one_disabled(int rank, int P, const char *dir)
{
    if (rank == 2)
        setenv("PCS_COLL_SHM", "0", 1);
    return child_tcp_sum(rank, P, dir);
}

static void test_one_rank_without_shm_keeps_every_rank_on_tcp(void **s)
{
    (void)s;
    run_children(3, PCS_COLL_TRANSPORT_AUTO, child_one_disabled, "coll-one-tcp", 30000);
}

/* The 32-bit round counters wrap in the first rounds (PCS_SHM_FIRST_ROUND, a test hook): the
 * whole matrix must still match the reference. */
static void test_matrix_across_the_round_counter_wrap_shm(void **s)
{
    (void)s;
    setenv("PCS_SHM_FIRST_ROUND", "0xfffffff0", 1);
    run_matrix(3, PCS_COLL_TRANSPORT_AUTO);
    unsetenv("PCS_SHM_FIRST_ROUND");
}

/* With 3 ranks, rank 2 takes rank 1 for the broadcast's root, ranks 0 and 1 take rank 0; with
 * 2, each rank takes itself. Every rank whose view disagrees with a peer it checks fails fast with
 * the mismatch, not at the timeout: rank 2 (rank 1's round names root 0), the roots (a peer's
 * round names another root); only rank 1 of 3, whose root agrees, may finish. */
static int child_bcast_roots(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "bcast-roots", &kv, &c, 10000))
        return 1;
    float v[4] = {0};
    int root = P == 2 ? rank : rank == 2 ? 1 : 0;
    uint64_t t0 = pcs_now_ms();
    pcs_status_t rc = pcs_coll_broadcast(c, v, 4, PCS_DTYPE_FP32, root, NULL);
    uint64_t dt = pcs_now_ms() - t0;
    if (P == 3 && rank == 1 && rc == PCS_OK) {
    } else if (rc == PCS_OK) {
        CHILD_FAIL("broadcast with another root succeeded");
    } else if (dt > 5000) {
        CHILD_FAIL("mismatch took %llu ms to fail", (unsigned long long)dt);
    } else if (!strstr(pcs_last_error(), "same collectives") &&
               !strstr(pcs_last_error(), "gave up")) {
        CHILD_FAIL("message does not say why: %s", pcs_last_error());
    }
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

static void test_broadcast_roots_that_differ_fail_fast_over_shm(void **s)
{
    (void)s;
    run_children(3, PCS_COLL_TRANSPORT_AUTO, child_bcast_roots, "coll-bcast-roots", 30000);
    run_children(2, PCS_COLL_TRANSPORT_AUTO, child_bcast_roots, "coll-bcast-self-roots", 30000);
}

/* A rank killed between creating its segment and the unlink leaves its name in /dev/shm: the
 * next segment created in this PID namespace removes it. Any process of the namespace sweeps, so
 * a test running beside this one (ctest -j) may remove the dead segment first: such a round
 * proves nothing about this create and is run again (a bounded number of times). */
static void test_segment_of_a_killed_rank_is_swept(void **st)
{
    (void)st;
    int swept_by_us = 0;
    for (int attempt = 0; attempt < 20 && !swept_by_us; attempt++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            pcs_shm_t *s = NULL;
            if (pcs_shm_create(0, 2, 1000, &s) == PCS_OK) {
                const char *n = pcs_shm_name(s);
                if (write(fds[1], n, strlen(n)) < 0)
                    _exit(2);
            }
            _exit(0); /* no destroy, no unlink: as if killed */
        }
        close(fds[1]);
        char name[128] = "";
        ssize_t n = read(fds[0], name, sizeof name - 1);
        close(fds[0]);
        assert_int_not_equal(pcs_test_wait(pid, 10000), -1);
        assert_true(n > 0);
        name[n] = '\0';
        char path[160];
        snprintf(path, sizeof path, "/dev/shm%s", name);
        if (access(path, F_OK) != 0)
            continue; /* swept already by another process's create */
        pcs_shm_t *s = NULL;
        assert_int_equal(pcs_shm_create(1, 2, 1000, &s), PCS_OK);
        assert_int_not_equal(access(path, F_OK), 0);
        pcs_shm_destroy(s);
        swept_by_us = 1;
    }
    assert_true(swept_by_us);
}

/* Over shared memory, rank 1 issues all_reduce of 12 elements where the others issue 10: every
 * rank fails fast (not at the timeout) with a message naming the mismatch. */
static int child_mismatch(int rank, int P, const char *dir)
{
    pcs_kv_t *kv;
    pcs_coll_t *c;
    if (child_open(dir, rank, P, "mismatch", &kv, &c, 10000))
        return 1;
    float v[12] = {0};
    pcs_coll_red_t red = {PCS_RED_SUM, 0, 0};
    uint64_t t0 = pcs_now_ms();
    pcs_status_t rc = pcs_coll_all_reduce(c, v, v, rank == 1 ? 12 : 10, PCS_DTYPE_FP32, &red, NULL);
    uint64_t dt = pcs_now_ms() - t0;
    if (rc == PCS_OK)
        CHILD_FAIL("mismatched all_reduce succeeded");
    if (dt > 5000)
        CHILD_FAIL("mismatch took %llu ms to fail", (unsigned long long)dt);
    if (!strstr(pcs_last_error(), "same collectives") && !strstr(pcs_last_error(), "gave up"))
        CHILD_FAIL("message does not say why: %s", pcs_last_error());
    pcs_coll_destroy(c);
    pcs_kv_destroy(kv);
    return 0;
}

static void test_mismatched_collectives_fail_fast_over_shm(void **s)
{
    (void)s;
    run_children(3, PCS_COLL_TRANSPORT_AUTO, child_mismatch, "coll-mismatch", 30000);
}

static void test_ddp_compress_hook_divides_before_the_sum_case25(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("coll-ddp");
    pid_t pids[4];
    spawn_ranks(4, dir, child_ddp_hook, pids);
    expect_all_ok(4, pids, 60000);
    pcs_test_rmtree(dir);
    free(dir);
}

/* The victim is reaped only after the survivors answered: over shared memory they must see a
 * zombie as dead (its pid still exists), as TCP peers see its sockets close. */
static void sigkill_mid_collective(int transport)
{
    const int P = 4, victim = 2;
    char *dir = pcs_test_tmpdir("coll-kill");
    pid_t pids[4];
    g_transport = transport;
    spawn_ranks(P, dir, child_loop, pids);
    g_transport = PCS_COLL_TRANSPORT_AUTO;
    char path[512];
    for (int r = 0; r < P; r++) {
        snprintf(path, sizeof path, "%s/started.%d", dir, r);
        free(pcs_test_wait_file(path, 20000));
    }
    pcs_test_sleep_ms(300); /* let a few all_reduces run */
    kill(pids[victim], SIGKILL);
    uint64_t t_kill = pcs_now_ms();
    int status[4] = {0};
    for (int r = 0; r < P; r++) { /* collect every survivor first: a failure shows them all */
        if (r == victim)
            continue;
        status[r] = pcs_test_wait(pids[r], TIMEOUT_MS + 5000);
        if (status[r] == -1)
            pcs_test_stop(pids[r], 100);
        snprintf(path, sizeof path, "%s/result.%d", dir, r);
        char *res = pcs_test_read_file(path, NULL);
        fprintf(stderr, "# rank %d: exit status 0x%x, result: %s\n", r, (unsigned)status[r],
                res ? res : "(none)");
        free(res);
    }
    for (int r = 0; r < P; r++) {
        if (r == victim)
            continue;
        assert_int_not_equal(status[r], -1);
        assert_true(WIFEXITED(status[r]));
        assert_int_equal(WEXITSTATUS(status[r]), 0);
        snprintf(path, sizeof path, "%s/result.%d", dir, r);
        char *res = pcs_test_read_file(path, NULL);
        assert_non_null(res);
        int code = -1, blamed = -2, fault = -1;
        unsigned long long t_fail = 0;
        assert_int_equal(sscanf(res, "%d %llu %d %d", &code, &t_fail, &blamed, &fault), 4);
        assert_int_equal(code, PCS_ERR_REMOTE);
        /* every survivor blames the killed rank, also those that heard it from a note */
        assert_int_equal(blamed, victim);
        assert_int_equal(fault, PCS_COLL_FAULT_DIED);
        assert_true((long long)t_fail - (long long)t_kill < TIMEOUT_MS);
        char want[32];
        snprintf(want, sizeof want, "peer rank %d ", victim);
        assert_non_null(strstr(res, want));
        free(res);
    }
    waitpid(pids[victim], NULL, 0);
    assert_no_segments_left(P, pids);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_sigkill_mid_collective_fails_survivors_within_timeout_naming_rank_shm(void **s)
{
    (void)s;
    sigkill_mid_collective(PCS_COLL_TRANSPORT_AUTO);
}

static void test_sigkill_mid_collective_fails_survivors_within_timeout_naming_rank_tcp(void **s)
{
    (void)s;
    sigkill_mid_collective(PCS_COLL_TRANSPORT_TCP);
}

static void test_silent_peer_times_out_naming_it_shm(void **s)
{
    (void)s;
    run_children(2, PCS_COLL_TRANSPORT_AUTO, child_silent, "coll-silent", 20000);
}

static void test_silent_peer_times_out_naming_it_tcp(void **s)
{
    (void)s;
    run_children(2, PCS_COLL_TRANSPORT_TCP, child_silent, "coll-silent", 20000);
}

static void test_abort_wakes_blocked_call_and_peer_names_aborter_shm(void **s)
{
    (void)s;
    run_children(2, PCS_COLL_TRANSPORT_AUTO, child_abort, "coll-abort", 20000);
}

static void test_abort_wakes_blocked_call_and_peer_names_aborter_tcp(void **s)
{
    (void)s;
    run_children(2, PCS_COLL_TRANSPORT_TCP, child_abort, "coll-abort", 20000);
}

static void run_ranks(int P, const char *dir, child_fn fn, int timeout_ms);

/* The coordinator of the test below: stopped by its teardown, which cmocka runs after a failed
 * assertion too (a failure no longer leaves it running). */
static pid_t g_coord = -1;

static int stop_coordinator(void **s)
{
    (void)s;
    if (g_coord > 0)
        pcs_test_stop(g_coord, 2000);
    g_coord = -1;
    return 0;
}

static void test_gloo_rendezvous_through_coordinator_kv(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("coll-coord");
    const char *extra[] = {"--lease-ms", "600000", NULL};
    g_coord = pcs_test_start_coordinator(dir, extra, g_coord_addr, sizeof g_coord_addr);
    assert_true(g_coord > 0);
    run_ranks(1, dir, child_setup_job, 30000);
    char path[1024];
    snprintf(path, sizeof path, "%s/job", dir);
    char *job = pcs_test_read_file(path, NULL);
    assert_non_null(job);
    unsigned long long gen = 0;
    assert_int_equal(sscanf(job, "%63s %llu %159s %159s", g_job_id, &gen, g_secret[0], g_secret[1]),
                     4);
    g_generation = gen;
    free(job);
    run_ranks(2, dir, child_coord, 30000);
    stop_coordinator(NULL);
    pcs_test_rmtree(dir);
    free(dir);
}

static void run_ranks(int P, const char *dir, child_fn fn, int timeout_ms)
{
    pid_t pids[4];
    spawn_ranks(P, dir, fn, pids);
    expect_all_ok(P, pids, timeout_ms);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_1_rank),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_2_ranks_shm),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_3_ranks_shm),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_4_ranks_shm),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_2_ranks_tcp),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_3_ranks_tcp),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_4_ranks_tcp),
        cmocka_unit_test(test_every_op_dtype_count_matches_ring_reference_4_ranks_tcp_direct_rs),
        cmocka_unit_test(test_ranks_on_different_hosts_agree_on_tcp),
        cmocka_unit_test(test_one_rank_without_shm_keeps_every_rank_on_tcp),
        cmocka_unit_test(test_matrix_across_the_round_counter_wrap_shm),
        cmocka_unit_test(test_broadcast_roots_that_differ_fail_fast_over_shm),
        cmocka_unit_test(test_segment_of_a_killed_rank_is_swept),
        cmocka_unit_test(test_mismatched_collectives_fail_fast_over_shm),
        cmocka_unit_test(test_ddp_compress_hook_divides_before_the_sum_case25),
        cmocka_unit_test(test_sigkill_mid_collective_fails_survivors_within_timeout_naming_rank_shm),
        cmocka_unit_test(test_sigkill_mid_collective_fails_survivors_within_timeout_naming_rank_tcp),
        cmocka_unit_test(test_silent_peer_times_out_naming_it_shm),
        cmocka_unit_test(test_silent_peer_times_out_naming_it_tcp),
        cmocka_unit_test(test_abort_wakes_blocked_call_and_peer_names_aborter_shm),
        cmocka_unit_test(test_abort_wakes_blocked_call_and_peer_names_aborter_tcp),
        cmocka_unit_test_teardown(test_gloo_rendezvous_through_coordinator_kv, stop_coordinator),
    };
    return cmocka_run_group_tests_name("coll_procs", tests, NULL, NULL);
}
