/* A simulated "cuda" backend for machines without a GPU (PCS_SIMULATE_CUDA=1, tests only): device
 * memory is host memory handed out with bit 62 set, a non-canonical x86-64 address, so any host
 * load or store through a device pointer faults at once (also under ASan); every op clears the
 * tag before calling the CPU twin, copies check that their kind matches which side is tagged, new
 * buffers hold NaN bytes (never zeros), and freeing with the wrong allocator aborts. It checks
 * where data lives, not stream ordering (every op is synchronous), CUDA errors or cuBLAS numerics.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels_internal.h"
#include "pcs/log.h"

#define DEVSIM_TAG    ((uintptr_t)1 << 62)
#define DEVSIM_LIST_N 32 /* tensors untagged on the stack; longer lists are malloc'd */

static const char k_devsim_name[] = "simulated (PCS_SIMULATE_CUDA)";

// ---- tags ----

int pcs_devsim_is_device_ptr(const void *p)
{
    return ((uintptr_t)p & DEVSIM_TAG) != 0;
}

static void *untag(const void *p)
{
    return (void *)((uintptr_t)p & ~DEVSIM_TAG);
}

/* A pointer an op hands to a "kernel": NULL stays NULL (the CPU twin's checks report it), a host
 * pointer is the bug this backend exists to find (a kernel on pageable host memory is an illegal
 * address on a real device). */
static pcs_status_t dev_arg(const char *op, const char *what, const void *p, void **out)
{
    *out = NULL;
    if (p == NULL)
        return PCS_OK;
    if (!pcs_devsim_is_device_ptr(p))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "simulated cuda %s: %s %p is host memory, not a device pointer", op,
                             what, p);
    *out = untag(p);
    return PCS_OK;
}

pcs_status_t pcs_devsim_arg(const char *op, const char *what, const void *p, void **out)
{
    return dev_arg(op, what, p, out);
}

/* The untagged copy of a tensor list; empty tensors may carry any pointer (never read). */
typedef struct devsim_list {
    pcs_tensor_t small[DEVSIM_LIST_N];
    pcs_tensor_t *t;
} devsim_list_t;

static pcs_status_t list_in(const char *op, const char *what, const pcs_tensor_t *in, size_t count,
                            devsim_list_t *l)
{
    l->t = NULL;
    if (in == NULL || count == 0)
        return PCS_OK; /* the CPU twin reports a NULL list with count > 0 */
    if (count <= DEVSIM_LIST_N) {
        l->t = l->small;
    } else {
        if (count > SIZE_MAX / sizeof(pcs_tensor_t))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s count %zu overflows", op, what,
                                 count);
        l->t = malloc(count * sizeof(pcs_tensor_t));
        if (l->t == NULL)
            return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda %s: out of memory", op);
    }
    for (size_t k = 0; k < count; k++) {
        l->t[k] = in[k];
        if (in[k].n == 0) {
            l->t[k].data = untag(in[k].data);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "%s[%zu]", what, k);
        pcs_status_t st = dev_arg(op, name, in[k].data, &l->t[k].data);
        if (st != PCS_OK) {
            if (l->t != l->small)
                free(l->t);
            l->t = NULL;
            return st;
        }
    }
    return PCS_OK;
}

static void list_done(devsim_list_t *l)
{
    if (l->t != NULL && l->t != l->small)
        free(l->t);
    l->t = NULL;
}

static const pcs_backend_ops_t *cpu(void)
{
    return pcs_backend_cpu();
}

// ---- streams and events ----

/* Every kernel runs when it is enqueued, but a copy between device memory and *pinned* host
 * memory (host_alloc) on a stream is deferred until the stream is synchronized (sync, event_sync
 * of an event recorded on it, another stream waiting on such an event, or the next op on the same
 * stream), as cudaMemcpyAsync is asynchronous there: a D2H destination holds 0xff bytes until
 * then, so the host reading it without a sync sees NaN, and an H2D reads its source when it runs,
 * so the host rewriting it too early changes what arrives. Copies with pageable host memory are
 * synchronous, as CUDA makes them. The streams are non-blocking (as ops_cuda.cu creates them):
 * the NULL stream runs everything at once and synchronizes no other stream. */
typedef struct pending_copy {
    void *dst;
    const void *src;
    size_t bytes;
} pending_copy_t;

typedef struct devsim_stream {
    pthread_mutex_t mu;
    pending_copy_t *q;
    size_t n, cap;
} devsim_stream_t;

typedef struct devsim_event {
    pcs_event_t cpu;
    devsim_stream_t *stream; /* the stream it was last recorded on (NULL: none or the NULL one) */
} devsim_event_t;

static devsim_stream_t *dstream(pcs_stream_t s)
{
    return (devsim_stream_t *)(void *)s;
}

static devsim_event_t *devent(pcs_event_t e)
{
    return (devsim_event_t *)(void *)e;
}

/* Run the stream's deferred copies in order. */
static void flush(devsim_stream_t *ds)
{
    if (ds == NULL)
        return;
    pthread_mutex_lock(&ds->mu);
    for (size_t i = 0; i < ds->n; i++)
        memmove(ds->q[i].dst, ds->q[i].src, ds->q[i].bytes);
    ds->n = 0;
    pthread_mutex_unlock(&ds->mu);
}

void pcs_devsim_stream_flush(pcs_stream_t s)
{
    flush(dstream(s));
}

static pcs_status_t defer(devsim_stream_t *ds, void *dst, const void *src, size_t bytes)
{
    pthread_mutex_lock(&ds->mu);
    if (ds->n == ds->cap) {
        size_t cap = ds->cap ? 2 * ds->cap : 16;
        pending_copy_t *q = realloc(ds->q, cap * sizeof *q);
        if (q == NULL) {
            pthread_mutex_unlock(&ds->mu);
            return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda copy: out of memory");
        }
        ds->q = q;
        ds->cap = cap;
    }
    ds->q[ds->n++] = (pending_copy_t){dst, src, bytes};
    pthread_mutex_unlock(&ds->mu);
    return PCS_OK;
}

static pcs_status_t ds_stream_create(pcs_stream_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_create: NULL out");
    devsim_stream_t *ds = calloc(1, sizeof *ds);
    if (ds == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "stream_create: out of memory");
    pthread_mutex_init(&ds->mu, NULL);
    *out = (pcs_stream_t)(void *)ds;
    return PCS_OK;
}

static void ds_stream_destroy(pcs_stream_t s)
{
    devsim_stream_t *ds = dstream(s);
    if (ds == NULL)
        return;
    flush(ds); /* cudaStreamDestroy lets queued work finish */
    pthread_mutex_destroy(&ds->mu);
    free(ds->q);
    free(ds);
}

static pcs_status_t ds_sync(pcs_stream_t s)
{
    flush(dstream(s));
    return PCS_OK;
}

static pcs_status_t ds_event_create(pcs_event_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_create: NULL out");
    devsim_event_t *de = calloc(1, sizeof *de);
    if (de == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "event_create: out of memory");
    pcs_status_t st = cpu()->event_create(&de->cpu);
    if (st != PCS_OK) {
        free(de);
        return st;
    }
    *out = (pcs_event_t)(void *)de;
    return PCS_OK;
}

static void ds_event_destroy(pcs_event_t e)
{
    devsim_event_t *de = devent(e);
    if (de == NULL)
        return;
    cpu()->event_destroy(de->cpu);
    free(de);
}

static pcs_status_t ds_event_record(pcs_event_t e, pcs_stream_t s)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_record: NULL event");
    devent(e)->stream = dstream(s);
    return cpu()->event_record(devent(e)->cpu, NULL);
}

static pcs_status_t ds_stream_wait_event(pcs_stream_t s, pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_wait_event: NULL event");
    flush(devent(e)->stream);
    return PCS_OK;
}

static pcs_status_t ds_event_sync(pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_sync: NULL event");
    flush(devent(e)->stream);
    return PCS_OK;
}

static pcs_status_t ds_event_elapsed_ms(pcs_event_t a, pcs_event_t b, float *ms)
{
    if (a == NULL || b == NULL)
        return cpu()->event_elapsed_ms(NULL, NULL, ms); /* its message */
    return cpu()->event_elapsed_ms(devent(a)->cpu, devent(b)->cpu, ms);
}

// ---- memory ----

/* cudaMalloc/cudaMallocHost memory is not zeroed: new buffers are filled with 0xff bytes (NaN in
 * every float dtype, -1 as int64), so reading one before it is written or uploaded poisons the
 * results instead of silently finding zeros. */
#define DEVSIM_FRESH 0xff

static pcs_status_t ds_alloc(size_t bytes, void **out)
{
    PCS_CHECK(cpu()->alloc(bytes, out));
    if (*out != NULL) {
        memset(*out, DEVSIM_FRESH, bytes);
        *out = (void *)((uintptr_t)*out | DEVSIM_TAG);
    }
    return PCS_OK;
}

static void ds_free(void *p)
{
    if (p == NULL)
        return;
    if (!pcs_devsim_is_device_ptr(p)) {
        PCS_WARN(PCS_SUB_MEM,
                 "simulated cuda: free() of host pointer %p (allocated with "
                 "host_alloc or malloc, not alloc): a real bug, aborting",
                 p);
        abort();
    }
    cpu()->free(untag(p));
}

/* Live pinned allocations (few: the staging buffers), so copies know which host memory is
 * pinned. */
typedef struct pinned {
    uintptr_t base;
    size_t bytes;
} pinned_t;
static pthread_mutex_t g_pinned_mu = PTHREAD_MUTEX_INITIALIZER;
static pinned_t *g_pinned;
static size_t g_n_pinned, g_cap_pinned;

static int is_pinned(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&g_pinned_mu);
    for (size_t i = 0; i < g_n_pinned && !found; i++)
        found = a >= g_pinned[i].base && a - g_pinned[i].base < g_pinned[i].bytes &&
                bytes <= g_pinned[i].bytes - (a - g_pinned[i].base);
    pthread_mutex_unlock(&g_pinned_mu);
    return found;
}

static pcs_status_t ds_host_alloc(size_t bytes, void **out)
{
    PCS_CHECK(cpu()->host_alloc(bytes, out));
    if (*out == NULL)
        return PCS_OK;
    memset(*out, DEVSIM_FRESH, bytes);
    pthread_mutex_lock(&g_pinned_mu);
    if (g_n_pinned == g_cap_pinned) {
        size_t cap = g_cap_pinned ? 2 * g_cap_pinned : 16;
        pinned_t *q = realloc(g_pinned, cap * sizeof *q);
        if (q == NULL) {
            pthread_mutex_unlock(&g_pinned_mu);
            cpu()->host_free(*out);
            *out = NULL;
            return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda host_alloc: out of memory");
        }
        g_pinned = q;
        g_cap_pinned = cap;
    }
    g_pinned[g_n_pinned++] = (pinned_t){(uintptr_t)*out, bytes};
    pthread_mutex_unlock(&g_pinned_mu);
    return PCS_OK;
}

static void ds_host_free(void *p)
{
    if (p == NULL)
        return;
    if (pcs_devsim_is_device_ptr(p)) {
        PCS_WARN(PCS_SUB_MEM,
                 "simulated cuda: host_free() of device pointer %p (allocated with "
                 "alloc): a real bug, aborting",
                 p);
        abort();
    }
    pthread_mutex_lock(&g_pinned_mu);
    for (size_t i = 0; i < g_n_pinned; i++)
        if (g_pinned[i].base == (uintptr_t)p) {
            g_pinned[i] = g_pinned[--g_n_pinned];
            break;
        }
    pthread_mutex_unlock(&g_pinned_mu);
    cpu()->host_free(p);
}

static const char *kind_name(pcs_copy_kind_t k)
{
    switch (k) {
    case PCS_COPY_DEFAULT:
        return "DEFAULT";
    case PCS_COPY_H2H:
        return "H2H";
    case PCS_COPY_H2D:
        return "H2D";
    case PCS_COPY_D2H:
        return "D2H";
    case PCS_COPY_D2D:
        return "D2D";
    }
    return "?";
}

static pcs_status_t ds_copy(void *dst, const void *src, size_t bytes, pcs_copy_kind_t kind,
                            pcs_stream_t s)
{
    if (bytes == 0)
        return PCS_OK;
    if (dst == NULL || src == NULL || (unsigned)kind > (unsigned)PCS_COPY_D2D)
        return cpu()->copy(dst, src, bytes, kind, s); /* its message */
    int dd = pcs_devsim_is_device_ptr(dst), sd = pcs_devsim_is_device_ptr(src);
    int want_dd = kind == PCS_COPY_H2D || kind == PCS_COPY_D2D;
    int want_sd = kind == PCS_COPY_D2H || kind == PCS_COPY_D2D;
    /* cudaMemcpyDefault infers the direction from the pointers (unified addressing) */
    if (kind != PCS_COPY_DEFAULT && (dd != want_dd || sd != want_sd))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "simulated cuda copy: kind %s but dst %p is %s memory and src %p is "
                             "%s memory (%zu bytes)",
                             kind_name(kind), dst, dd ? "device" : "host", src,
                             sd ? "device" : "host", bytes);
    flush(dstream(s));
    void *d = untag(dst);
    const void *x = untag(src);
    if (s != NULL && dd != sd && is_pinned(dd ? src : dst, bytes)) {
        if (!dd)
            memset(d, DEVSIM_FRESH, bytes); /* not arrived yet: see "streams and events" */
        return defer(dstream(s), d, x, bytes);
    }
    return cpu()->copy(d, x, bytes, kind, NULL);
}

static pcs_status_t ds_fill(void *dst, pcs_dtype_t dt, size_t n, double value, pcs_stream_t s)
{
    void *d = NULL;
    if (n > 0)
        PCS_CHECK(dev_arg("fill", "dst", dst, &d));
    flush(dstream(s));
    return cpu()->fill(d, dt, n, value, NULL);
}

// ---- element-wise ops: untag, then the CPU twin ----

static pcs_status_t ds_cast(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                            pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    devsim_list_t d, x;
    PCS_CHECK(list_in("cast", "dst", dst, count, &d));
    pcs_status_t st = list_in("cast", "src", src, count, &x);
    if (st == PCS_OK)
        st = cpu()->cast(d.t, x.t, count, NULL);
    list_done(&d);
    list_done(&x);
    return st;
}

static pcs_status_t ds_scale(const pcs_tensor_t *t, size_t count, float factor, pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    devsim_list_t l;
    PCS_CHECK(list_in("scale", "t", t, count, &l));
    pcs_status_t st = cpu()->scale(l.t, count, factor, NULL);
    list_done(&l);
    return st;
}

static pcs_status_t ds_accumulate(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                                  pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    devsim_list_t d, x;
    PCS_CHECK(list_in("accumulate", "dst", dst, count, &d));
    pcs_status_t st = list_in("accumulate", "src", src, count, &x);
    if (st == PCS_OK)
        st = cpu()->accumulate(d.t, x.t, count, NULL);
    list_done(&d);
    list_done(&x);
    return st;
}

static pcs_status_t ds_nonfinite(const pcs_tensor_t *t, size_t count, float *found_inf,
                                 const float *inv_scale, pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    const char *op = "nonfinite_check_and_unscale";
    void *fi, *is;
    PCS_CHECK(dev_arg(op, "found_inf", found_inf, &fi));
    PCS_CHECK(dev_arg(op, "inv_scale", inv_scale, &is));
    devsim_list_t l;
    PCS_CHECK(list_in(op, "t", t, count, &l));
    pcs_status_t st = cpu()->nonfinite_check_and_unscale(l.t, count, fi, is, NULL);
    list_done(&l);
    return st;
}

static pcs_status_t ds_sum_squares(const pcs_tensor_t *t, size_t count, float *out, pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    void *o;
    PCS_CHECK(dev_arg("sum_squares", "out", out, &o));
    devsim_list_t l;
    PCS_CHECK(list_in("sum_squares", "t", t, count, &l));
    pcs_status_t st = cpu()->sum_squares(l.t, count, o, NULL);
    list_done(&l);
    return st;
}

static pcs_status_t ds_adamw(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                             const pcs_tensor_t *exp_avg, const pcs_tensor_t *exp_avg_sq,
                             size_t count, const pcs_adamw_config_t *cfg, int64_t step,
                             pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    const char *op = "adamw_update";
    devsim_list_t p, g, m, v;
    p.t = g.t = m.t = v.t = NULL;
    pcs_status_t st = list_in(op, "param", param, count, &p);
    if (st == PCS_OK)
        st = list_in(op, "grad", grad, count, &g);
    if (st == PCS_OK)
        st = list_in(op, "exp_avg", exp_avg, count, &m);
    if (st == PCS_OK)
        st = list_in(op, "exp_avg_sq", exp_avg_sq, count, &v);
    if (st == PCS_OK)
        st = cpu()->adamw_update(p.t, g.t, m.t, v.t, count, cfg, step, NULL);
    list_done(&p);
    list_done(&g);
    list_done(&m);
    list_done(&v);
    return st;
}

static pcs_status_t ds_sgd(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                           const pcs_tensor_t *buf, size_t count, const pcs_sgd_config_t *cfg,
                           int first_step, pcs_stream_t s)
{
    flush(dstream(s)); /* in stream order after its deferred copies */
    const char *op = "sgd_update";
    devsim_list_t p, g, b;
    p.t = g.t = b.t = NULL;
    pcs_status_t st = list_in(op, "param", param, count, &p);
    if (st == PCS_OK)
        st = list_in(op, "grad", grad, count, &g);
    if (st == PCS_OK)
        st = list_in(op, "momentum_buf", buf, count, &b);
    if (st == PCS_OK)
        st = cpu()->sgd_update(p.t, g.t, buf ? b.t : NULL, count, cfg, first_step, NULL);
    list_done(&p);
    list_done(&g);
    list_done(&b);
    return st;
}

// ---- devices ----

static int ds_device_count(void)
{
    const char *e = getenv("PCS_SIMULATE_CUDA_DEVICES");
    long n = e && *e ? strtol(e, NULL, 10) : 1;
    return n >= 1 && n <= 64 ? (int)n : 1;
}

static pcs_status_t ds_set_device(int ordinal)
{
    int n = ds_device_count();
    if (ordinal < 0 || ordinal >= n)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "set_device: device %d out of range (%d visible)",
                             ordinal, n);
    return PCS_OK;
}

static pcs_status_t ds_device_info(int ordinal, char *name, size_t cap, uint64_t *memory_bytes)
{
    int n = ds_device_count();
    if (ordinal < 0 || ordinal >= n)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "device_info: device %d out of range (%d visible)", ordinal, n);
    PCS_CHECK(cpu()->device_info(0, NULL, 0, memory_bytes));
    if (name != NULL && cap > 0)
        snprintf(name, cap, "%s", k_devsim_name);
    return PCS_OK;
}

static const pcs_backend_ops_t devsim_ops = {
    .name = "cuda",
    .alloc = ds_alloc,
    .free = ds_free,
    .host_alloc = ds_host_alloc,
    .host_free = ds_host_free,
    .copy = ds_copy,
    .fill = ds_fill,
    .stream_create = ds_stream_create,
    .stream_destroy = ds_stream_destroy,
    .sync = ds_sync,
    .event_create = ds_event_create,
    .event_destroy = ds_event_destroy,
    .event_record = ds_event_record,
    .stream_wait_event = ds_stream_wait_event,
    .event_sync = ds_event_sync,
    .cast = ds_cast,
    .scale = ds_scale,
    .accumulate = ds_accumulate,
    .nonfinite_check_and_unscale = ds_nonfinite,
    .sum_squares = ds_sum_squares,
    .adamw_update = ds_adamw,
    .sgd_update = ds_sgd,
    .device_count = ds_device_count,
    .set_device = ds_set_device,
    .device_info = ds_device_info,
    .event_elapsed_ms = ds_event_elapsed_ms,
};

// ---- registry hooks ----

int pcs_devsim_enabled(void)
{
    const char *e = getenv("PCS_SIMULATE_CUDA");
    return e != NULL && strcmp(e, "1") == 0;
}

static pthread_once_t g_warn_once = PTHREAD_ONCE_INIT;

static void warn_simulated(void)
{
    PCS_WARN(PCS_SUB_KERNEL,
             "kernel backend 'cuda' is SIMULATED on the host (PCS_SIMULATE_CUDA=1, pid %ld): the "
             "CPU twin computes, device pointers are poisoned host memory; for tests only",
             (long)getpid());
}

const pcs_backend_ops_t *pcs_backend_devsim(void)
{
    pthread_once(&g_warn_once, warn_simulated);
    return &devsim_ops;
}

int pcs_backend_is_simulated(const pcs_backend_ops_t *be)
{
    return be != NULL && be == &devsim_ops;
}
