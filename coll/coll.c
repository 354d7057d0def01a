/* Backend-independent part of the collectives layer: argument checks, the poisoned-after-error
 * state, group nesting, dispatch to the backend vtable, and the reduction arithmetic (in the
 * data type, rounding every step, see coll.h) that the Gloo backend and the tests share.
 * No transport code here. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"

struct pcs_coll {
    const pcs_coll_ops_t *ops;
    void *impl;
    int rank, size;
    int group_depth;
    pthread_mutex_t mu;  /* guards failed/err (abort may come from another thread) */
    pcs_status_t failed; /* first error; PCS_OK while healthy */
    char err[512];
    int transport; /* PCS_COLL_LIVE_* it is counted under */
};

/* Live communicators of this process by transport (pcs_coll_live). */
static unsigned live_count[PCS_COLL_LIVE_N];

// ---- backend table (CMake decides what is built; no #ifdef inside functions) ----

static const struct {
    pcs_coll_backend_t backend;
    const char *name;
    pcs_coll_backend_create_fn create;
} backends[] = {
    {PCS_COLL_GLOO, "gloo", pcs_coll_gloo_create},
#ifdef PCS_HAVE_NCCL
    {PCS_COLL_NCCL, "nccl", pcs_coll_nccl_create},
#endif
};

// ---- reduction arithmetic ----

int pcs_coll_dtype_reducible(pcs_dtype_t dt)
{
    return dt == PCS_DTYPE_FP32 || dt == PCS_DTYPE_BF16 || dt == PCS_DTYPE_FP16 ||
           dt == PCS_DTYPE_FP64;
}

/* MAX of the arriving value a and the accumulator b: fmaxf's rule (a NaN loses to a number)
 * with ties, +0 against -0 included, going to a. Spelled out because fmaxf leaves the sign of a
 * zero result open and its vectorized and scalar forms disagree; this form vectorizes to a
 * compare and blend. */
static inline float max_first(float a, float b)
{
    return a != a ? b : (b > a ? b : a);
}

/* One loop per dtype (no per-element switch) so the compiler can vectorize the bf16 path. */
#define PCS_COLL_LOOP16(name, to_f, from_f, expr)                                                  \
    static void name(uint16_t *d, const uint16_t *s, size_t n, float f)                            \
    {                                                                                              \
        (void)f;                                                                                   \
        for (size_t i = 0; i < n; i++) {                                                           \
            float a = to_f(d[i]), b = to_f(s[i]);                                                  \
            (void)a;                                                                               \
            d[i] = from_f(expr);                                                                   \
        }                                                                                          \
    }
PCS_COLL_LOOP16(add_bf16, pcs_bf16_to_f32, pcs_f32_to_bf16, a + b)
PCS_COLL_LOOP16(add_fp16, pcs_fp16_to_f32, pcs_f32_to_fp16, a + b)
PCS_COLL_LOOP16(max_bf16, pcs_bf16_to_f32, pcs_f32_to_bf16, max_first(a, b))
PCS_COLL_LOOP16(max_fp16, pcs_fp16_to_f32, pcs_f32_to_fp16, max_first(a, b))
PCS_COLL_LOOP16(add_bf16_acc, pcs_bf16_to_f32, pcs_f32_to_bf16, b + a)
PCS_COLL_LOOP16(add_fp16_acc, pcs_fp16_to_f32, pcs_f32_to_fp16, b + a)
PCS_COLL_LOOP16(max_bf16_acc, pcs_bf16_to_f32, pcs_f32_to_bf16, max_first(b, a))
PCS_COLL_LOOP16(max_fp16_acc, pcs_fp16_to_f32, pcs_f32_to_fp16, max_first(b, a))
PCS_COLL_LOOP16(mul_bf16, pcs_bf16_to_f32, pcs_f32_to_bf16, b *f)
PCS_COLL_LOOP16(mul_fp16, pcs_fp16_to_f32, pcs_f32_to_fp16, b *f)

/* The sum of two bf16/fp16 values is computed in fp32 and rounded once: the fp32 sum of two
 * 11-bit (or 8-bit) significands is exact unless the exponents differ by more than ~13 bits, in
 * which case the smaller one is below half an ulp of the dtype anyway, so rnd(fp32 sum) equals
 * the correctly rounded dtype sum that __hadd computes on the GPU. */
/* The build uses -O2, whose "very cheap" vectorizer cost model leaves these loops scalar; they
 * are the CPU backend's reduction hot path, so ask GCC to vectorize them (clang does at -O2). */
#if defined(__GNUC__) && !defined(__clang__)
#define PCS_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define PCS_VECTORIZE
#endif

PCS_VECTORIZE static void add_f32(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] += s[i];
}

PCS_VECTORIZE static void max_f32(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = max_first(d[i], s[i]);
}

/* The ring's operand order for an accumulator that arrives second: d = s op d. */
PCS_VECTORIZE static void add_f32_acc(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = s[i] + d[i];
}

PCS_VECTORIZE static void max_f32_acc(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = max_first(s[i], d[i]);
}

/* fp64: the same four loops in double */
static inline double max_first64(double a, double b)
{
    return a != a ? b : (b > a ? b : a);
}
#define PCS_COLL_LOOP64(name, expr)                                                                \
    PCS_VECTORIZE static void name(double *restrict d, const double *restrict s, size_t n)        \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = expr;                                                                           \
    }
PCS_COLL_LOOP64(add_f64, d[i] + s[i])
PCS_COLL_LOOP64(max_f64, max_first64(d[i], s[i]))
PCS_COLL_LOOP64(add_f64_acc, s[i] + d[i])
PCS_COLL_LOOP64(max_f64_acc, max_first64(s[i], d[i]))

/* bf16/fp16 blocks go through the kernels' vectorized casts (round-to-nearest-even, the same
 * results as the scalar pcs/half.h conversions): widen both blocks, add in fp32, narrow once. */
enum { BLOCK = 2048 };

static int reduce16_fast(uint16_t *d, const uint16_t *s, size_t n, pcs_dtype_t dt, int mx,
                         int acc)
{
    float fa[BLOCK], fb[BLOCK];
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t m = n - o < BLOCK ? n - o : BLOCK;
        if (pcs_cpu_cast_array(fa, PCS_DTYPE_FP32, d + o, dt, m) != PCS_OK ||
            pcs_cpu_cast_array(fb, PCS_DTYPE_FP32, s + o, dt, m) != PCS_OK)
            return 0;
        if (mx)
            (acc ? max_f32_acc : max_f32)(fa, fb, m);
        else
            (acc ? add_f32_acc : add_f32)(fa, fb, m);
        if (pcs_cpu_cast_array(d + o, dt, fa, PCS_DTYPE_FP32, m) != PCS_OK)
            return 0;
    }
    return 1;
}

static void reduce(void *dst, const void *src, size_t n, pcs_dtype_t dt, pcs_red_op_t op, int acc)
{
    int mx = op == PCS_RED_MAX;
    if ((dt == PCS_DTYPE_BF16 || dt == PCS_DTYPE_FP16) && reduce16_fast(dst, src, n, dt, mx, acc))
        return;
    switch (dt) {
    case PCS_DTYPE_BF16:
        (mx ? (acc ? max_bf16_acc : max_bf16) : (acc ? add_bf16_acc : add_bf16))(dst, src, n, 1.0f);
        return;
    case PCS_DTYPE_FP16:
        (mx ? (acc ? max_fp16_acc : max_fp16) : (acc ? add_fp16_acc : add_fp16))(dst, src, n, 1.0f);
        return;
    case PCS_DTYPE_FP64:
        (mx ? (acc ? max_f64_acc : max_f64) : (acc ? add_f64_acc : add_f64))(dst, src, n);
        return;
    default:
        if (mx)
            (acc ? max_f32_acc : max_f32)(dst, src, n);
        else
            (acc ? add_f32_acc : add_f32)(dst, src, n);
        return;
    }
}

void pcs_coll_reduce_into(void *dst, const void *src, size_t n, pcs_dtype_t dt, pcs_red_op_t op)
{
    reduce(dst, src, n, dt, op, 0);
}

void pcs_coll_reduce_acc(void *acc, const void *x, size_t n, pcs_dtype_t dt, pcs_red_op_t op)
{
    reduce(acc, x, n, dt, op, 1);
}

PCS_VECTORIZE static void mul_f32(float *d, const float *s, size_t n, float f)
{
    for (size_t i = 0; i < n; i++)
        d[i] = s[i] * f;
}

void pcs_coll_scale(void *dst, const void *src, size_t n, pcs_dtype_t dt, double f64)
{
    const float f = (float)f64;
    if (dt == PCS_DTYPE_FP64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i] * f64;
        return;
    }
    if (dt == PCS_DTYPE_BF16 || dt == PCS_DTYPE_FP16) {
        float fa[BLOCK];
        for (size_t o = 0; o < n; o += BLOCK) {
            size_t m = n - o < BLOCK ? n - o : BLOCK;
            pcs_status_t rc =
                pcs_cpu_cast_array(fa, PCS_DTYPE_FP32, (const uint16_t *)src + o, dt, m);
            if (rc == PCS_OK) {
                mul_f32(fa, fa, m, f);
                rc = pcs_cpu_cast_array((uint16_t *)dst + o, dt, fa, PCS_DTYPE_FP32, m);
            }
            if (rc != PCS_OK) {
                /* the casts only fail for unsupported dtypes; keep the scalar twin as fallback */
                if (dt == PCS_DTYPE_BF16)
                    mul_bf16((uint16_t *)dst + o, (const uint16_t *)src + o, m, f);
                else
                    mul_fp16((uint16_t *)dst + o, (const uint16_t *)src + o, m, f);
            }
        }
        return;
    }
    mul_f32(dst, src, n, f);
}

void pcs_coll_prepare(void *dst, const void *src, size_t n, pcs_dtype_t dt, double f_pre,
                      double f_avg)
{
    if (f_pre != 1.0) {
        pcs_coll_scale(dst, src, n, dt, f_pre);
        src = dst;
    }
    if (f_avg != 1.0)
        pcs_coll_scale(dst, src, n, dt, f_avg);
    else if (dst != src)
        memcpy(dst, src, n * pcs_dtype_size(dt));
}

/* d = a op b out of place (the ring's operand order: the rank's own value first); d may be a or
 * b (same index only). */
PCS_VECTORIZE static void add3_f32(float *d, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] + b[i];
}

PCS_VECTORIZE static void max3_f32(float *d, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = max_first(a[i], b[i]);
}

void pcs_coll_prepare_reduce(void *dst, const void *src, const void *x, size_t n, pcs_dtype_t dt,
                             pcs_red_op_t op, double f_pre, double f_avg, double f_post)
{
    if (dt == PCS_DTYPE_FP32 && f_pre == 1.0 && f_avg == 1.0) {
        /* fp32 with nothing to prepare: one out-of-place pass, a block at a time for the scale */
        for (size_t o = 0; o < n; o += BLOCK) {
            size_t m = n - o < BLOCK ? n - o : BLOCK;
            float *d = (float *)dst + o;
            (op == PCS_RED_MAX ? max3_f32 : add3_f32)(d, (const float *)src + o,
                                                      (const float *)x + o, m);
            if (f_post != 1.0)
                mul_f32(d, d, m, (float)f_post);
        }
        return;
    }
    /* block by block through a stack block (dst may equal src or x): the same operations, so the
     * same bits, as pcs_coll_prepare + pcs_coll_reduce_into + pcs_coll_scale over whole buffers */
    _Alignas(64) unsigned char blk[BLOCK * sizeof(float)];
    const size_t es = pcs_dtype_size(dt), step = sizeof blk / es;
    for (size_t o = 0; o < n; o += step) {
        size_t m = n - o < step ? n - o : step;
        pcs_coll_prepare(blk, (const char *)src + o * es, m, dt, f_pre, f_avg);
        reduce(blk, (const char *)x + o * es, m, dt, op, 0);
        if (f_post != 1.0)
            pcs_coll_scale((char *)dst + o * es, blk, m, dt, f_post);
        else
            memcpy((char *)dst + o * es, blk, m * es);
    }
}

double pcs_coll_avg_factor(int size, pcs_dtype_t dt)
{
    float f = (float)(1.0 / (double)size);
    switch (dt) {
    case PCS_DTYPE_FP64:
        return 1.0 / (double)size;
    case PCS_DTYPE_BF16:
        return pcs_bf16_to_f32(pcs_f32_to_bf16(f));
    case PCS_DTYPE_FP16:
        return pcs_fp16_to_f32(pcs_f32_to_fp16(f));
    default:
        return f;
    }
}

double pcs_coll_div_factor(double d, pcs_dtype_t dt)
{
    if (d == 0.0 || d == 1.0)
        return 1.0;
    return dt == PCS_DTYPE_FP64 ? 1.0 / d : (double)(float)(1.0 / d);
}

void pcs_coll_chunk(size_t count, int parts, int k, size_t *off, size_t *n)
{
    size_t p = (size_t)parts, kk = (size_t)k;
    size_t base = count / p, rem = count % p;
    *n = base + (kk < rem ? 1 : 0);
    *off = kk * base + (kk < rem ? kk : rem);
}

// ---- state ----

static pcs_status_t check_live(pcs_coll_t *c, const char *op)
{
    pthread_mutex_lock(&c->mu);
    pcs_status_t f = c->failed;
    char err[sizeof c->err];
    memcpy(err, c->err, sizeof err);
    pthread_mutex_unlock(&c->mu);
    if (f == PCS_OK)
        return PCS_OK;
    return pcs_set_error(PCS_ERR_STATE, "%s: communicator unusable after an earlier error (%s): %s",
                         op, pcs_status_str(f), err);
}

/* Record the first failure; returns rc so callers can `return poison(...)`. */
static pcs_status_t poison(pcs_coll_t *c, pcs_status_t rc, const char *op)
{
    if (rc == PCS_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    if (c->failed == PCS_OK) {
        c->failed = rc;
        snprintf(c->err, sizeof c->err, "%s", pcs_last_error());
    }
    pthread_mutex_unlock(&c->mu);
    PCS_DEBUG(PCS_SUB_COLL, "%s failed: %s", op, pcs_last_error());
    return rc;
}

// ---- create / destroy ----

static int name_ok(const char *s)
{
    if (!s || !s[0] || strlen(s) > 64)
        return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || (unsigned char)*p <= 0x20 || (unsigned char)*p > 0x7e)
            return 0;
    return 1;
}

pcs_status_t pcs_coll_create(const pcs_coll_config_t *cfg, pcs_coll_t **out)
{
    if (!cfg || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: NULL config or out");
    *out = NULL;
    if (cfg->size < 1 || cfg->size > 65536)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: size %d must be in [1, 65536]",
                             cfg->size);
    if (cfg->rank < 0 || cfg->rank >= cfg->size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: rank %d outside [0, %d)", cfg->rank,
                             cfg->size);
    if (!name_ok(cfg->group_name))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "coll create: group name must be 1..64 printable bytes without '/'");
    if (cfg->group_id < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: negative group id %d",
                             cfg->group_id);
    if (!cfg->kv && cfg->size > 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: a KV store is needed for size %d",
                             cfg->size);
    if (cfg->timeout_ms < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll create: negative timeout");

    pcs_coll_backend_create_fn create = NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (backends[i].backend == cfg->backend)
            create = backends[i].create;
    if (!create)
        return pcs_set_error(cfg->backend == PCS_COLL_NCCL ? PCS_ERR_UNSUPPORTED
                                                           : PCS_ERR_INVALID_ARG,
                             "coll create: backend %d %s", (int)cfg->backend,
                             cfg->backend == PCS_COLL_NCCL ? "(nccl) was not built" : "is unknown");

    pcs_coll_config_t eff = *cfg;
    if (eff.timeout_ms == 0)
        eff.timeout_ms = 30000;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s/%d/", cfg->group_name, cfg->group_id);

    pcs_coll_t *c = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    c->rank = cfg->rank;
    c->size = cfg->size;
    pthread_mutex_init(&c->mu, NULL);
    pcs_status_t rc = create(&eff, prefix, &c->ops, &c->impl);
    if (rc != PCS_OK) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return rc;
    }
    PCS_DEBUG(PCS_SUB_COLL, "comm %s rank %d/%d up (%s)", prefix, c->rank, c->size, c->ops->name);
    const char *t = pcs_coll_transport(c);
    c->transport = strcmp(t, "shm") == 0   ? PCS_COLL_LIVE_SHM
                   : strcmp(t, "tcp") == 0 ? PCS_COLL_LIVE_TCP
                                           : PCS_COLL_LIVE_NCCL;
    __atomic_add_fetch(&live_count[c->transport], 1u, __ATOMIC_RELAXED);
    *out = c;
    return PCS_OK;
}

void pcs_coll_live(unsigned counts[PCS_COLL_LIVE_N])
{
    for (int i = 0; i < PCS_COLL_LIVE_N; i++)
        counts[i] = __atomic_load_n(&live_count[i], __ATOMIC_RELAXED);
}

void pcs_coll_destroy(pcs_coll_t *c)
{
    if (!c)
        return;
    c->ops->destroy(c->impl);
    __atomic_sub_fetch(&live_count[c->transport], 1u, __ATOMIC_RELAXED);
    pthread_mutex_destroy(&c->mu);
    memset(c, 0, sizeof *c);
    free(c);
}

int pcs_coll_blame(const pcs_coll_t *c, pcs_coll_fault_t *fault)
{
    int f = PCS_COLL_FAULT_NONE;
    int r = c && c->ops->blame ? c->ops->blame(c->impl, &f) : -1;
    if (fault)
        *fault = r >= 0 ? (pcs_coll_fault_t)f : PCS_COLL_FAULT_NONE;
    return r;
}

void pcs_coll_abort(pcs_coll_t *c, const char *reason)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->failed == PCS_OK) {
        c->failed = PCS_ERR_CANCELLED;
        snprintf(c->err, sizeof c->err, "aborted: %s", reason ? reason : "(no reason)");
    }
    pthread_mutex_unlock(&c->mu);
    c->ops->abort(c->impl, reason ? reason : "(no reason)");
}

int pcs_coll_rank(const pcs_coll_t *c)
{
    return c->rank;
}

int pcs_coll_size(const pcs_coll_t *c)
{
    return c->size;
}

void *pcs_coll_backend_impl(const pcs_coll_t *c)
{
    return c->impl;
}

const char *pcs_coll_backend_name(const pcs_coll_t *c)
{
    return c->ops->name;
}

const char *pcs_coll_gloo_transport(const pcs_coll_t *c);

const char *pcs_coll_transport(const pcs_coll_t *c)
{
    const char *t = pcs_coll_gloo_transport(c);
    return t ? t : c->ops->name;
}

// ---- argument checks ----

static pcs_status_t check_common(pcs_coll_t *c, const char *op, pcs_dtype_t dt)
{
    if (!c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: NULL communicator", op);
    if (pcs_dtype_size(dt) == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: invalid dtype %d", op, (int)dt);
    return check_live(c, op);
}

/* bytes = count * elem * mult without overflow (so pointer arithmetic in backends is safe). */
static pcs_status_t check_bytes(const char *op, size_t count, pcs_dtype_t dt, size_t mult,
                                size_t *bytes)
{
    size_t es = pcs_dtype_size(dt);
    if (mult && count > SIZE_MAX / es / mult)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: count %zu overflows", op, count);
    *bytes = count * es * mult;
    return PCS_OK;
}

static pcs_status_t check_ptr(const char *op, const char *what, const void *p, size_t bytes)
{
    if (!p && bytes > 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: NULL %s with %zu bytes", op, what, bytes);
    return PCS_OK;
}

static pcs_status_t check_red(const char *op, pcs_dtype_t dt, const pcs_coll_red_t *red)
{
    if (!red)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: NULL reduction", op);
    if (!pcs_coll_dtype_reducible(dt))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s: dtype %s cannot be reduced (fp32, bf16, fp16, fp64)", op,
                             pcs_dtype_name(dt));
    if (red->op != PCS_RED_SUM && red->op != PCS_RED_AVG && red->op != PCS_RED_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: unknown reduction op %d", op, (int)red->op);
    if (!isfinite(red->pre_div) || !isfinite(red->post_div) || red->pre_div < 0 ||
        red->post_div < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: divide factors must be finite and >= 0", op);
    if (red->op == PCS_RED_MAX &&
        (pcs_coll_div_factor(red->pre_div, dt) != 1.0 ||
         pcs_coll_div_factor(red->post_div, dt) != 1.0))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: divide factors apply to sum/avg only", op);
    return PCS_OK;
}

static pcs_status_t check_peer(pcs_coll_t *c, const char *op, const char *what, int peer)
{
    if (peer < 0 || peer >= c->size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s %d outside [0, %d)", op, what, peer,
                             c->size);
    return PCS_OK;
}

// ---- operations ----

pcs_status_t pcs_coll_all_gather(pcs_coll_t *c, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, pcs_coll_stream_t s)
{
    static const char op[] = "all_gather";
    size_t in_b = 0, out_b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_bytes(op, count, dt, (size_t)c->size, &out_b));
    PCS_CHECK(check_bytes(op, count, dt, 1, &in_b));
    PCS_CHECK(check_ptr(op, "input", in, in_b));
    PCS_CHECK(check_ptr(op, "output", out, out_b));
    return poison(c, c->ops->all_gather(c->impl, in, out, count, dt, s), op);
}

pcs_status_t pcs_coll_reduce_scatter(pcs_coll_t *c, const void *in, void *out, size_t recv_count,
                                     pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s)
{
    static const char op[] = "reduce_scatter";
    size_t in_b = 0, out_b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_red(op, dt, red));
    PCS_CHECK(check_bytes(op, recv_count, dt, (size_t)c->size, &in_b));
    PCS_CHECK(check_bytes(op, recv_count, dt, 1, &out_b));
    PCS_CHECK(check_ptr(op, "input", in, in_b));
    PCS_CHECK(check_ptr(op, "output", out, out_b));
    return poison(c, c->ops->reduce_scatter(c->impl, in, out, recv_count, dt, red, s), op);
}

pcs_status_t pcs_coll_all_reduce(pcs_coll_t *c, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s)
{
    static const char op[] = "all_reduce";
    size_t b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_red(op, dt, red));
    PCS_CHECK(check_bytes(op, count, dt, 1, &b));
    PCS_CHECK(check_ptr(op, "input", in, b));
    PCS_CHECK(check_ptr(op, "output", out, b));
    return poison(c, c->ops->all_reduce(c->impl, in, out, count, dt, red, s), op);
}

pcs_status_t pcs_coll_broadcast(pcs_coll_t *c, void *buf, size_t count, pcs_dtype_t dt, int root,
                                pcs_coll_stream_t s)
{
    static const char op[] = "broadcast";
    size_t b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_peer(c, op, "root", root));
    PCS_CHECK(check_bytes(op, count, dt, 1, &b));
    PCS_CHECK(check_ptr(op, "buffer", buf, b));
    return poison(c, c->ops->broadcast(c->impl, buf, count, dt, root, s), op);
}

pcs_status_t pcs_coll_send(pcs_coll_t *c, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s)
{
    static const char op[] = "send";
    size_t b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_peer(c, op, "peer", peer));
    if (peer == c->rank)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "send: peer %d is this rank", peer);
    PCS_CHECK(check_bytes(op, count, dt, 1, &b));
    PCS_CHECK(check_ptr(op, "buffer", buf, b));
    return poison(c, c->ops->send(c->impl, buf, count, dt, peer, s), op);
}

pcs_status_t pcs_coll_recv(pcs_coll_t *c, void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s)
{
    static const char op[] = "recv";
    size_t b = 0;
    PCS_CHECK(check_common(c, op, dt));
    PCS_CHECK(check_peer(c, op, "peer", peer));
    if (peer == c->rank)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "recv: peer %d is this rank", peer);
    PCS_CHECK(check_bytes(op, count, dt, 1, &b));
    PCS_CHECK(check_ptr(op, "buffer", buf, b));
    return poison(c, c->ops->recv(c->impl, buf, count, dt, peer, s), op);
}

pcs_status_t pcs_coll_barrier(pcs_coll_t *c)
{
    PCS_CHECK(check_common(c, "barrier", PCS_DTYPE_FP32));
    if (c->group_depth > 0)
        return pcs_set_error(PCS_ERR_STATE, "barrier: not allowed inside a group");
    return poison(c, c->ops->barrier(c->impl), "barrier");
}

pcs_status_t pcs_coll_group_start(pcs_coll_t *c)
{
    PCS_CHECK(check_common(c, "group_start", PCS_DTYPE_FP32));
    if (c->group_depth++ == 0)
        return poison(c, c->ops->group_start(c->impl), "group_start");
    return PCS_OK;
}

pcs_status_t pcs_coll_group_end(pcs_coll_t *c)
{
    if (!c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "group_end: NULL communicator");
    if (c->group_depth == 0)
        return pcs_set_error(PCS_ERR_STATE, "group_end without group_start");
    if (--c->group_depth > 0)
        return PCS_OK;
    /* Always let the backend drop its queue, even when poisoned, so buffers are not retained. */
    pcs_status_t rc = c->ops->group_end(c->impl);
    if (rc != PCS_OK)
        return poison(c, rc, "group_end");
    return check_live(c, "group_end");
}
