/* The unit runtime's bookkeeping (private to worker/runtime.c): what each step's collectives
 * cost and what they were. Timings: per issuing stream, a pool of event pairs recorded around
 * each collective and resolved into milliseconds when stats are read (device work is
 * asynchronous: host time around the call would measure the enqueue only). Records: every
 * collective with its dtype, count and bytes, audited against the plan's dtype, and folded into
 * the step's collective-sequence fingerprint (DESIGN.md §8). */
#ifndef PCS_WORKER_RUNTIME_STATS_H
#define PCS_WORKER_RUNTIME_STATS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/kernels.h"
#include "pcs/v1/plan.pb-c.h"
#include "worker/runtime.h"

enum { PCS_RT_T_AG = 0, PCS_RT_T_RS = 1, PCS_RT_T_AR = 2 }; /* what a timing measured */

typedef struct pcs_rt_timing {
    pcs_event_t t0, t1;
    int kind; /* PCS_RT_T_* */
} pcs_rt_timing_t;

/* The timings of one issuing stream: v[0, n_used) are published (both events recorded),
 * v[0, n_done) resolved. One writer at a time (the stream's thread); growth and publication
 * under *mu, the runtime's lock, which the pool borrows. */
typedef struct pcs_rt_tpool {
    const pcs_backend_ops_t *be;
    pthread_mutex_t *mu;
    pcs_rt_timing_t **v;
    size_t n_alloc, n_used, n_done;
} pcs_rt_tpool_t;

void pcs_rt_tpool_init(pcs_rt_tpool_t *p, const pcs_backend_ops_t *be, pthread_mutex_t *mu);
/* The next free timing with its start recorded on `s`; NULL when none could be had (timings are
 * stats only: the collective then runs untimed). */
pcs_rt_timing_t *pcs_rt_timing_start(pcs_rt_tpool_t *p, pcs_stream_t s);
/* Record the end of `t` (may be NULL) on `s` and publish it as a `kind` timing. */
void pcs_rt_timing_end(pcs_rt_tpool_t *p, pcs_rt_timing_t *t, pcs_stream_t s, int kind);
/* Add the published, unresolved timings into ms[PCS_RT_T_*] (updated under *mu). Waits for their
 * events without holding *mu: a collective may need a peer that waits for one of our streams'
 * threads, which need it. Called by the compute thread only. */
void pcs_rt_timing_resolve(pcs_rt_tpool_t *p, double ms[3]);
/* Drop every timing (with *mu held, when no collective of the pool is in flight). */
void pcs_rt_tpool_reset(pcs_rt_tpool_t *p);
void pcs_rt_tpool_free(pcs_rt_tpool_t *p);

/* One step's collectives in issue order. */
typedef struct pcs_rt_records {
    pcs_rt_coll_rec_t *v;
    size_t n, cap;
    uint64_t h_ag, h_main; /* sequence hashes of the all-gather thread and of the others */
    int audit_ok;          /* every collective ran in the dtype the plan says */
} pcs_rt_records_t;

void pcs_rt_records_reset(pcs_rt_records_t *r);
/* Record one collective of `count` elements per rank over a group of `group` ranks; `spec` is the
 * plan's (NULL: not in the plan, nothing to audit). Called with the runtime's lock held by the
 * all-gather thread (on_ag_thread), or by the other threads. A record that cannot be stored (no
 * memory) is dropped: stats only. */
void pcs_rt_record(pcs_rt_records_t *r, int kind, uint32_t unit, pcs_dtype_t dt, uint64_t count,
                   uint64_t group, const Pcs__V1__CollectiveSpec *spec, int on_ag_thread);
/* The step's fingerprint: both threads' sequence hashes, combined so that the same collectives on
 * the other thread do not cancel out. */
uint64_t pcs_rt_records_fingerprint(const pcs_rt_records_t *r);
void pcs_rt_records_free(pcs_rt_records_t *r);

#endif
