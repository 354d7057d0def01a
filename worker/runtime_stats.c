/* The unit runtime's timings and collective records (see runtime_stats.h). */
#include "worker/runtime_stats.h"

#include <stdlib.h>

#include "pcs/hash.h"
#include "pcs/log.h"

// ---- timings ----

void pcs_rt_tpool_init(pcs_rt_tpool_t *p, const pcs_backend_ops_t *be, pthread_mutex_t *mu)
{
    *p = (pcs_rt_tpool_t){be, mu, NULL, 0, 0, 0};
}

pcs_rt_timing_t *pcs_rt_timing_start(pcs_rt_tpool_t *p, pcs_stream_t s)
{
    pcs_rt_timing_t *t = NULL;
    pthread_mutex_lock(p->mu);
    if (p->n_used == p->n_alloc) {
        pcs_rt_timing_t **nv = realloc(p->v, (p->n_alloc + 1) * sizeof *nv);
        pcs_rt_timing_t *e = calloc(1, sizeof *e);
        if (nv)
            p->v = nv;
        if (nv && e && p->be->event_create(&e->t0) == PCS_OK &&
            p->be->event_create(&e->t1) == PCS_OK) {
            p->v[p->n_alloc++] = e;
        } else if (e) {
            if (e->t0)
                p->be->event_destroy(e->t0);
            free(e);
        }
    }
    if (p->n_used < p->n_alloc)
        t = p->v[p->n_used];
    pthread_mutex_unlock(p->mu);
    if (t && p->be->event_record(t->t0, s) != PCS_OK)
        t = NULL;
    return t;
}

void pcs_rt_timing_end(pcs_rt_tpool_t *p, pcs_rt_timing_t *t, pcs_stream_t s, int kind)
{
    if (!t || p->be->event_record(t->t1, s) != PCS_OK)
        return;
    pthread_mutex_lock(p->mu);
    t->kind = kind;
    p->n_used++;
    pthread_mutex_unlock(p->mu);
}

void pcs_rt_timing_resolve(pcs_rt_tpool_t *p, double ms[3])
{
    pthread_mutex_lock(p->mu);
    size_t lo = p->n_done, hi = p->n_used;
    pthread_mutex_unlock(p->mu);
    double add[3] = {0, 0, 0};
    for (size_t i = lo; i < hi; i++) {
        /* the array may grow (realloc) under mu; elements never move and published ones are
         * not rewritten until the pool is reset */
        pthread_mutex_lock(p->mu);
        pcs_rt_timing_t *t = p->v[i];
        pthread_mutex_unlock(p->mu);
        float m = 0;
        if (p->be->event_sync(t->t1) == PCS_OK &&
            p->be->event_elapsed_ms(t->t0, t->t1, &m) == PCS_OK && m > 0)
            add[t->kind] += m;
    }
    pthread_mutex_lock(p->mu);
    for (int k = 0; k < 3; k++)
        ms[k] += add[k];
    p->n_done = hi;
    pthread_mutex_unlock(p->mu);
}

void pcs_rt_tpool_reset(pcs_rt_tpool_t *p)
{
    p->n_used = p->n_done = 0;
}

void pcs_rt_tpool_free(pcs_rt_tpool_t *p)
{
    for (size_t i = 0; i < p->n_alloc; i++) {
        p->be->event_destroy(p->v[i]->t0);
        p->be->event_destroy(p->v[i]->t1);
        free(p->v[i]);
    }
    free(p->v);
    p->v = NULL;
    p->n_alloc = p->n_used = p->n_done = 0;
}

// ---- records ----

void pcs_rt_records_reset(pcs_rt_records_t *r)
{
    r->n = 0;
    r->h_ag = r->h_main = PCS_FNV1A64_OFFSET;
    r->audit_ok = 1;
}

static const char *kind_name(int kind)
{
    return kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER       ? "all-gather"
           : kind == PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER ? "reduce-scatter"
                                                                  : "all-reduce";
}

void pcs_rt_record(pcs_rt_records_t *r, int kind, uint32_t unit, pcs_dtype_t dt, uint64_t count,
                   uint64_t group, const Pcs__V1__CollectiveSpec *spec, int on_ag_thread)
{
    int ok = spec ? (pcs_dtype_t)spec->dtype == dt : 1;
    if (!ok) {
        PCS_WARN(PCS_SUB_WORKER, "dtype audit: unit %u %s ran in %s, plan says %s", unit,
                 kind_name(kind), pcs_dtype_name(dt), pcs_dtype_name((pcs_dtype_t)spec->dtype));
        r->audit_ok = 0;
    }
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 64;
        pcs_rt_coll_rec_t *n = realloc(r->v, nc * sizeof *n);
        if (!n)
            return; /* stats only */
        r->v = n;
        r->cap = nc;
    }
    r->v[r->n++] = (pcs_rt_coll_rec_t){.kind = kind,
                                       .unit = unit,
                                       .dtype = dt,
                                       .count = count,
                                       .bytes = count * group * pcs_dtype_size(dt),
                                       .audit_ok = ok};
    uint64_t *h = on_ag_thread ? &r->h_ag : &r->h_main;
    *h = pcs_fnv1a64_u64(*h, (uint64_t)kind);
    *h = pcs_fnv1a64_u64(*h, unit);
    *h = pcs_fnv1a64_u64(*h, (uint64_t)dt);
    *h = pcs_fnv1a64_u64(*h, count);
}

uint64_t pcs_rt_records_fingerprint(const pcs_rt_records_t *r)
{
    return r->h_ag ^ ((r->h_main << 1) | (r->h_main >> 63));
}

void pcs_rt_records_free(pcs_rt_records_t *r)
{
    free(r->v);
    r->v = NULL;
    r->n = r->cap = 0;
}
