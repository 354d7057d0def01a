/* A simulated "cuda" backend for machines without a GPU (pcs_backend_simulate_cuda, tests only):
 * device memory is host memory handed out with bit 62 set, a non-canonical x86-64 address, so any
 * host load or store through a device pointer faults at once (also under ASan); every op clears the
 * tag before calling the CPU twin, copies check that their kind matches which side is tagged, new
 * buffers hold NaN bytes (never zeros), and freeing with the wrong allocator aborts. Stream work
 * is queued until waited for (see below), so missing event waits break results; stream-ordered
 * allocations (alloc_async) are refilled with NaN in stream order. It does not check CUDA errors
 * or cuBLAS numerics. */
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

static const char k_devsim_name[] = "simulated (simulate-cuda)";

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

/* An untagged, heap-allocated copy of a tensor list (a queued op owns it; NULL when empty or
 * when `in` is NULL, which the CPU twin reports). Empty tensors may carry any pointer. */
static pcs_status_t list_in(const char *op, const char *what, const pcs_tensor_t *in, size_t count,
                            pcs_tensor_t **out)
{
    *out = NULL;
    if (in == NULL || count == 0)
        return PCS_OK;
    if (count > SIZE_MAX / sizeof(pcs_tensor_t))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s count %zu overflows", op, what, count);
    pcs_tensor_t *t = malloc(count * sizeof *t);
    if (t == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda %s: out of memory", op);
    for (size_t k = 0; k < count; k++) {
        t[k] = in[k];
        if (in[k].n == 0) {
            t[k].data = untag(in[k].data);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "%s[%zu]", what, k);
        pcs_status_t st = dev_arg(op, name, in[k].data, &t[k].data);
        if (st != PCS_OK) {
            free(t);
            return st;
        }
    }
    *out = t;
    return PCS_OK;
}

static const pcs_backend_ops_t *cpu(void)
{
    return pcs_backend_cpu();
}

// ---- streams and events: work is queued per stream and runs when the host waits for it ----

/* Work on a stream runs in stream order, but only when something waits for it: sync(s),
 * event_sync of an event recorded on s, another stream waiting on such an event (the prefix
 * recorded runs then), a pageable D2H on s (synchronous in CUDA), or a free (cudaFree and
 * cudaFreeHost synchronize the device). So a consumer on another stream that forgot its
 * stream_wait_event reads what was there before the producer's work, a host read of a pinned D2H
 * destination before the sync sees the 0xff bytes put there at enqueue, and an H2D from pinned
 * memory reads its source when it runs. The streams are non-blocking (as ops_cuda.cu creates
 * them): the NULL stream runs its work at once and waits for no other stream. An error found when
 * queued work runs is sticky on its stream and returned by the next sync or event_sync there. */
typedef struct devsim_task {
    pcs_status_t (*run)(void *arg);
    void *arg; /* malloc'd, freed after run */
} devsim_task_t;

typedef struct devsim_stream {
    pthread_mutex_t mu;
    devsim_task_t *q;
    size_t n, cap;
    uint64_t enqueued, done; /* task sequence numbers */
    pcs_status_t err;        /* first failure of queued work, reported once by a sync */
    char msg[512];
    struct devsim_stream *next, *prev; /* every live stream, for frees */
} devsim_stream_t;

typedef struct devsim_event {
    pcs_event_t cpu;
    devsim_stream_t *stream; /* where it was last recorded (NULL: the NULL stream or never) */
    uint64_t seq;            /* work enqueued there before the record */
} devsim_event_t;

static pthread_mutex_t g_streams_mu = PTHREAD_MUTEX_INITIALIZER;
static devsim_stream_t *g_streams;

static devsim_stream_t *dstream(pcs_stream_t s)
{
    return (devsim_stream_t *)(void *)s;
}

static devsim_event_t *devent(pcs_event_t e)
{
    return (devsim_event_t *)(void *)e;
}

/* Run the stream's queued work up to sequence number `upto` (UINT64_MAX: all of it), in order. */
static void run_until(devsim_stream_t *ds, uint64_t upto)
{
    if (ds == NULL)
        return;
    pthread_mutex_lock(&ds->mu);
    size_t k = 0;
    while (k < ds->n && ds->done < upto) {
        devsim_task_t t = ds->q[k++];
        pcs_status_t st = t.run(t.arg);
        free(t.arg);
        ds->done++;
        if (st != PCS_OK && ds->err == PCS_OK) {
            ds->err = st;
            snprintf(ds->msg, sizeof ds->msg, "%s", pcs_last_error());
        }
    }
    if (k > 0 && k < ds->n)
        memmove(ds->q, ds->q + k, (ds->n - k) * sizeof *ds->q);
    ds->n -= k;
    pthread_mutex_unlock(&ds->mu);
}

/* The sticky error of queued work, once. */
static pcs_status_t take_error(devsim_stream_t *ds)
{
    if (ds == NULL)
        return PCS_OK;
    pthread_mutex_lock(&ds->mu);
    pcs_status_t st = ds->err;
    char msg[sizeof ds->msg];
    snprintf(msg, sizeof msg, "%s", ds->msg);
    ds->err = PCS_OK;
    pthread_mutex_unlock(&ds->mu);
    if (st != PCS_OK)
        return pcs_set_error(st, "simulated cuda: queued work failed: %s", msg);
    return PCS_OK;
}

static void run_all_streams(void)
{
    pthread_mutex_lock(&g_streams_mu);
    for (devsim_stream_t *ds = g_streams; ds != NULL; ds = ds->next)
        run_until(ds, UINT64_MAX);
    pthread_mutex_unlock(&g_streams_mu);
}

/* Queue run(arg) on s (it owns arg, a malloc'd block, also on failure); the NULL stream runs it
 * now and returns its status. */
pcs_status_t pcs_devsim_submit(pcs_stream_t s, pcs_status_t (*run)(void *arg), void *arg)
{
    devsim_stream_t *ds = dstream(s);
    if (ds == NULL) {
        pcs_status_t st = run(arg);
        free(arg);
        return st;
    }
    pthread_mutex_lock(&ds->mu);
    if (ds->n == ds->cap) {
        size_t cap = ds->cap ? 2 * ds->cap : 64;
        devsim_task_t *q = realloc(ds->q, cap * sizeof *q);
        if (q == NULL) {
            pthread_mutex_unlock(&ds->mu);
            free(arg);
            return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda: out of memory queueing work");
        }
        ds->q = q;
        ds->cap = cap;
    }
    ds->q[ds->n++] = (devsim_task_t){run, arg};
    ds->enqueued++;
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
    pthread_mutex_lock(&g_streams_mu);
    ds->next = g_streams;
    if (g_streams)
        g_streams->prev = ds;
    g_streams = ds;
    pthread_mutex_unlock(&g_streams_mu);
    *out = (pcs_stream_t)(void *)ds;
    return PCS_OK;
}

static void ds_stream_destroy(pcs_stream_t s)
{
    devsim_stream_t *ds = dstream(s);
    if (ds == NULL)
        return;
    run_until(ds, UINT64_MAX); /* cudaStreamDestroy lets queued work finish */
    pthread_mutex_lock(&g_streams_mu);
    if (ds->prev)
        ds->prev->next = ds->next;
    else
        g_streams = ds->next;
    if (ds->next)
        ds->next->prev = ds->prev;
    pthread_mutex_unlock(&g_streams_mu);
    pthread_mutex_destroy(&ds->mu);
    free(ds->q);
    free(ds);
}

static pcs_status_t ds_sync(pcs_stream_t s)
{
    run_until(dstream(s), UINT64_MAX);
    return take_error(dstream(s));
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
    devsim_event_t *de = devent(e);
    devsim_stream_t *ds = dstream(s);
    de->stream = ds;
    if (ds != NULL) {
        pthread_mutex_lock(&ds->mu);
        de->seq = ds->enqueued;
        pthread_mutex_unlock(&ds->mu);
    }
    return cpu()->event_record(de->cpu, NULL);
}

static pcs_status_t ds_stream_wait_event(pcs_stream_t s, pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_wait_event: NULL event");
    /* the recorded prefix runs now, so s's later work comes after it */
    run_until(devent(e)->stream, devent(e)->seq);
    return PCS_OK;
}

static pcs_status_t ds_event_sync(pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_sync: NULL event");
    run_until(devent(e)->stream, devent(e)->seq);
    return take_error(devent(e)->stream);
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
    run_all_streams(); /* cudaFree synchronizes: queued work may still use the buffer */
    cpu()->free(untag(p));
}

/* Stream-ordered allocation (cudaMallocAsync): the memory exists at once, but the allocation
 * itself is queued on `s` as a task that refills it with fresh bytes when it runs. Work on s after
 * the call runs after that task; work on another stream that touched the buffer without waiting
 * for an event recorded on s after the allocation (or a sync of s) has its results overwritten
 * with NaN when s's queue runs later, which breaks the bit parity, as such a use is undefined on
 * a real device (the pool may hand out the same memory to a block still freed in stream order). */
typedef struct fresh_task {
    void *p;
    size_t bytes;
} fresh_task_t;

static pcs_status_t run_fresh(void *arg)
{
    fresh_task_t *t = arg;
    memset(t->p, DEVSIM_FRESH, t->bytes);
    return PCS_OK;
}

static pcs_status_t ds_alloc_async(size_t bytes, pcs_stream_t s, void **out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc_async: NULL out");
    PCS_CHECK(ds_alloc(bytes, out));
    if (*out == NULL || s == NULL)
        return PCS_OK; /* the NULL stream runs its work at once */
    fresh_task_t *t = malloc(sizeof *t);
    pcs_status_t st =
        t == NULL ? pcs_set_error(PCS_ERR_NOMEM, "alloc_async: out of memory") : PCS_OK;
    if (st == PCS_OK) {
        *t = (fresh_task_t){untag(*out), bytes};
        st = pcs_devsim_submit(s, run_fresh, t);
    }
    if (st != PCS_OK) {
        cpu()->free(untag(*out));
        *out = NULL;
    }
    return st;
}

static pcs_status_t run_free(void *arg)
{
    cpu()->free(*(void **)arg);
    return PCS_OK;
}

/* cudaFreeAsync: the memory is released when the stream's queued work has run (so a queued
 * kernel still using it is fine, and another stream's later use is a use-after-free that ASan
 * reports). No other stream is synchronized. */
static void ds_free_async(void *p, pcs_stream_t s)
{
    if (p == NULL)
        return;
    if (!pcs_devsim_is_device_ptr(p)) {
        PCS_WARN(PCS_SUB_MEM,
                 "simulated cuda: free_async() of host pointer %p (not from alloc_async): a real "
                 "bug, aborting",
                 p);
        abort();
    }
    void *raw = untag(p);
    void **t = s == NULL ? NULL : malloc(sizeof *t);
    if (t != NULL) {
        *t = raw;
        if (pcs_devsim_submit(s, run_free, t) == PCS_OK)
            return;
    }
    /* the NULL stream (runs at once), or no memory to queue the free: release it after the
     * stream's work, now */
    run_until(dstream(s), UINT64_MAX);
    cpu()->free(raw);
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
    run_all_streams(); /* cudaFreeHost synchronizes too */
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

typedef struct copy_task {
    void *dst;
    const void *src;
    size_t bytes;
} copy_task_t; /* a staged pageable source follows the struct */

static pcs_status_t run_copy(void *arg)
{
    copy_task_t *t = arg;
    memmove(t->dst, t->src, t->bytes);
    return PCS_OK;
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
    void *d = untag(dst);
    const void *x = untag(src);
    if (s == NULL)
        return cpu()->copy(d, x, bytes, kind, NULL);
    if (!dd && !sd) { /* H2H: ordered after the stream's work */
        run_until(dstream(s), UINT64_MAX);
        return cpu()->copy(d, x, bytes, kind, NULL);
    }
    if (!dd && !is_pinned(dst, bytes)) { /* pageable D2H: synchronous */
        run_until(dstream(s), UINT64_MAX);
        PCS_CHECK(take_error(dstream(s)));
        return cpu()->copy(d, x, bytes, kind, NULL);
    }
    copy_task_t *t = malloc(sizeof *t + (!sd && !is_pinned(src, bytes) ? bytes : 0));
    if (t == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda copy: out of memory");
    t->dst = d;
    t->src = x;
    t->bytes = bytes;
    if (!sd && !is_pinned(src, bytes)) { /* pageable H2D: CUDA stages the source at once */
        memcpy(t + 1, x, bytes);
        t->src = t + 1;
    }
    if (!dd)
        memset(d, DEVSIM_FRESH, bytes); /* a pinned D2H result is not there before the sync */
    return pcs_devsim_submit(s, run_copy, t);
}

typedef struct fill_task {
    void *dst;
    pcs_dtype_t dt;
    size_t n;
    double value;
} fill_task_t;

static pcs_status_t run_fill(void *arg)
{
    fill_task_t *t = arg;
    return cpu()->kernels->fill(t->dst, t->dt, t->n, t->value, NULL);
}

static pcs_status_t ds_fill(void *dst, pcs_dtype_t dt, size_t n, double value, pcs_stream_t s)
{
    void *d = NULL;
    if (n > 0)
        PCS_CHECK(dev_arg("fill", "dst", dst, &d));
    fill_task_t *t = malloc(sizeof *t);
    if (t == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda fill: out of memory");
    *t = (fill_task_t){d, dt, n, value};
    return pcs_devsim_submit(s, run_fill, t);
}

// ---- element-wise ops: untag, then the CPU twin when the stream runs them ----

typedef enum { OP_CAST, OP_SCALE, OP_ACC, OP_NONFINITE, OP_SUMSQ, OP_ADAMW, OP_SGD } list_op_t;

typedef struct list_task {
    list_op_t op;
    size_t count;
    pcs_tensor_t *a, *b, *c, *d; /* untagged lists, owned */
    int has_c;                   /* sgd: momentum buffers given */
    double factor;
    void *p1, *p2; /* found_inf / inv_scale, sum_squares out */
    pcs_adamw_config_t adamw;
    pcs_sgd_config_t sgd;
    int64_t step;
    int first_step;
} list_task_t;

static pcs_status_t run_list(void *arg)
{
    list_task_t *t = arg;
    const pcs_kernel_ops_t *c = cpu()->kernels;
    pcs_status_t st = PCS_OK;
    switch (t->op) {
    case OP_CAST:
        st = c->cast(t->a, t->b, t->count, NULL);
        break;
    case OP_SCALE:
        st = c->scale(t->a, t->count, t->factor, NULL);
        break;
    case OP_ACC:
        st = c->accumulate(t->a, t->b, t->count, NULL);
        break;
    case OP_NONFINITE:
        st = c->nonfinite_check_and_unscale(t->a, t->count, t->p1, t->p2, NULL);
        break;
    case OP_SUMSQ:
        st = c->sum_squares(t->a, t->count, t->p1, NULL);
        break;
    case OP_ADAMW:
        st = c->adamw_update(t->a, t->b, t->c, t->d, t->count, &t->adamw, t->step, NULL);
        break;
    case OP_SGD:
        st = c->sgd_update(t->a, t->b, t->has_c ? t->c : NULL, t->count, &t->sgd, t->first_step,
                           NULL);
        break;
    }
    free(t->a);
    free(t->b);
    free(t->c);
    free(t->d);
    return st;
}

/* A task for `op` with up to four lists untagged (NULL lists skipped). */
static pcs_status_t list_task(const char *opname, list_op_t op, size_t count, const pcs_tensor_t *a,
                              const char *an, const pcs_tensor_t *b, const char *bn,
                              const pcs_tensor_t *c, const char *cn, const pcs_tensor_t *d,
                              const char *dn, list_task_t **out)
{
    list_task_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda %s: out of memory", opname);
    t->op = op;
    t->count = count;
    pcs_status_t st = list_in(opname, an, a, count, &t->a);
    if (st == PCS_OK && bn)
        st = list_in(opname, bn, b, count, &t->b);
    if (st == PCS_OK && cn)
        st = list_in(opname, cn, c, count, &t->c);
    if (st == PCS_OK && dn)
        st = list_in(opname, dn, d, count, &t->d);
    if (st != PCS_OK) {
        free(t->a);
        free(t->b);
        free(t->c);
        free(t);
        return st;
    }
    *out = t;
    return PCS_OK;
}

/* Queue (the front door validated the arguments when the op was called, as the cuda backend's
 * host side does before a launch, so bad input is an immediate status, not a sticky error at the
 * next sync). */
static pcs_status_t submit_list(pcs_stream_t s, list_task_t *t)
{
    return pcs_devsim_submit(s, run_list, t);
}

static pcs_status_t ds_cast(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                            pcs_stream_t s)
{
    list_task_t *t = NULL;
    PCS_CHECK(
        list_task("cast", OP_CAST, count, dst, "dst", src, "src", NULL, NULL, NULL, NULL, &t));
    return submit_list(s, t);
}

static pcs_status_t ds_scale(const pcs_tensor_t *x, size_t count, double factor, pcs_stream_t s)
{
    list_task_t *t = NULL;
    PCS_CHECK(list_task("scale", OP_SCALE, count, x, "t", NULL, NULL, NULL, NULL, NULL, NULL, &t));
    t->factor = factor;
    return submit_list(s, t);
}

static pcs_status_t ds_accumulate(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                                  pcs_stream_t s)
{
    list_task_t *t = NULL;
    PCS_CHECK(
        list_task("accumulate", OP_ACC, count, dst, "dst", src, "src", NULL, NULL, NULL, NULL, &t));
    return submit_list(s, t);
}

static pcs_status_t ds_nonfinite(const pcs_tensor_t *x, size_t count, float *found_inf,
                                 const float *inv_scale, pcs_stream_t s)
{
    const char *op = "nonfinite_check_and_unscale";
    void *fi, *is;
    PCS_CHECK(dev_arg(op, "found_inf", found_inf, &fi));
    PCS_CHECK(dev_arg(op, "inv_scale", inv_scale, &is));
    list_task_t *t = NULL;
    PCS_CHECK(list_task(op, OP_NONFINITE, count, x, "t", NULL, NULL, NULL, NULL, NULL, NULL, &t));
    t->p1 = fi;
    t->p2 = is;
    return submit_list(s, t);
}

static pcs_status_t ds_sum_squares(const pcs_tensor_t *x, size_t count, float *out, pcs_stream_t s)
{
    void *o;
    PCS_CHECK(dev_arg("sum_squares", "out", out, &o));
    list_task_t *t = NULL;
    PCS_CHECK(
        list_task("sum_squares", OP_SUMSQ, count, x, "t", NULL, NULL, NULL, NULL, NULL, NULL, &t));
    t->p1 = o;
    return submit_list(s, t);
}

static pcs_status_t ds_adamw(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                             const pcs_tensor_t *exp_avg, const pcs_tensor_t *exp_avg_sq,
                             size_t count, const pcs_adamw_config_t *cfg, int64_t step,
                             pcs_stream_t s)
{
    list_task_t *t = NULL; /* the config is copied now, not read when the update runs */
    PCS_CHECK(list_task("adamw_update", OP_ADAMW, count, param, "param", grad, "grad", exp_avg,
                        "exp_avg", exp_avg_sq, "exp_avg_sq", &t));
    t->adamw = *cfg;
    t->step = step;
    return submit_list(s, t);
}

static pcs_status_t ds_sgd(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                           const pcs_tensor_t *buf, size_t count, const pcs_sgd_config_t *cfg,
                           int first_step, pcs_stream_t s)
{
    list_task_t *t = NULL;
    PCS_CHECK(list_task("sgd_update", OP_SGD, count, param, "param", grad, "grad", buf,
                        "momentum_buf", NULL, NULL, &t));
    t->has_c = buf != NULL;
    t->sgd = *cfg;
    t->first_step = first_step;
    return submit_list(s, t);
}

// ---- devices ----

/* Simulated devices (pcs_backend_simulate_cuda): 0 = the simulator is off. */
static unsigned g_devices;

static int ds_device_count(void)
{
    return (int)g_devices;
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

static const pcs_kernel_ops_t devsim_kernels = {
    .fill = ds_fill,
    .cast = ds_cast,
    .scale = ds_scale,
    .accumulate = ds_accumulate,
    .nonfinite_check_and_unscale = ds_nonfinite,
    .sum_squares = ds_sum_squares,
    .adamw_update = ds_adamw,
    .sgd_update = ds_sgd,
};

static const pcs_backend_ops_t devsim_ops = {
    .name = "cuda",
    .alloc = ds_alloc,
    .free = ds_free,
    .host_alloc = ds_host_alloc,
    .host_free = ds_host_free,
    .copy = ds_copy,
    .stream_create = ds_stream_create,
    .stream_destroy = ds_stream_destroy,
    .sync = ds_sync,
    .event_create = ds_event_create,
    .event_destroy = ds_event_destroy,
    .event_record = ds_event_record,
    .stream_wait_event = ds_stream_wait_event,
    .event_sync = ds_event_sync,
    .kernels = &devsim_kernels,
    .device_count = ds_device_count,
    .set_device = ds_set_device,
    .device_info = ds_device_info,
    .event_elapsed_ms = ds_event_elapsed_ms,
    .alloc_async = ds_alloc_async,
    .free_async = ds_free_async,
};

// ---- registry hooks ----

int pcs_devsim_enabled(void)
{
    return g_devices > 0;
}

pcs_status_t pcs_backend_simulate_cuda(unsigned devices)
{
    if (devices > PCS_SIMULATE_CUDA_MAX_DEVICES)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "simulate-cuda: %u devices (at most %d)", devices,
                             PCS_SIMULATE_CUDA_MAX_DEVICES);
    g_devices = devices;
    return PCS_OK;
}

static pthread_once_t g_warn_once = PTHREAD_ONCE_INIT;

static void warn_simulated(void)
{
    PCS_WARN(PCS_SUB_KERNEL,
             "kernel backend 'cuda' is SIMULATED on the host (simulate-cuda, pid %ld): the "
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
