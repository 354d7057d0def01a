/* Unit runtime (see runtime.h). The order of operations per unit follows spec §4 (FSDP1 flat
 * parameter semantics with the plan's per-collective dtypes): unshard = cast master shard to the
 * all-gather dtype, all-gather; backward grads are written by the model into a zeroed padded
 * buffer; no-sync micro-batches accumulate into the plan's accumulation dtype; the synced one casts
 * to the reduce dtype, reduce-scatters with the plan's op and pre-divide (post-divide after the
 * HSDP all-reduce), casts back and accumulates into the sharded grad. All-gathers run on a
 * prefetch thread with its own communicator so the compute thread only waits when it is ahead.
 * Buffers are backend memory (device memory on cuda): the host only fills them through the
 * backend and reads back scalars with a D2H copy; streams and events order the compute stream,
 * the all-gather stream and the reduction stream (runtime.h states the contract).
 *
 * Sections: units and the runtime object; small helpers; collectives on backend buffers (direct
 * or staged); unshard (prefetch thread); create / destroy; step (unshard, reshard, gradients);
 * reductions (reduction thread); optimizer step; stats and shards. Timings and collective
 * records live in runtime_stats.c.
 *
 * Legend of the short names used throughout:
 *   rt         the runtime                      u     one unit (rt_unit_t); u->u its plan Unit
 *   c          elements of a rank's shard of the unit (Unit.shard_numel); `padded` = c * sg
 *   sg         the unit's shard group size (1: a replicated unit)
 *   rg         reshard group size (FSDP2 reshard_after_forward = int), 0 when none
 *   ag, rs, ar all-gather, reduce-scatter, all-reduce (their streams, threads, communicators)
 *   cs         the compute stream (the caller's)  be    the kernels backend
 *   master / param / reduce / grad / accum   the unit's dtypes, as the plan resolved them
 *   mst        the master shard's storage dtype: fp64 for fp64 masters, fp32 for the others
 *              (fp32 holding bf16/fp16 values for pure low precision); optimizer state too. A
 *              unit with no trainable parameter (no optimizer math on it) keeps its masters in
 *              their own dtype: a frozen bf16 base takes 2 bytes per element, as in FSDP.
 *   hst        what shard_to_host / shard_from_host exchange: fp64 for fp64 storage, else fp32 */

#include "worker/runtime.h"

#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "planner/mesh.h"
#include "planner/plan.h"
#include "worker/runtime_stats.h"

// ---- units and the runtime object ----

#define NO_UNIT UINT32_MAX

enum { U_SHARDED = 0, U_QUEUED, U_RUNNING, U_UNSHARDED };

typedef struct rt_unit {
    const Pcs__V1__Unit *u;
    uint32_t index;
    pcs_dtype_t master, param, reduce, grad, accum;
    pcs_dtype_t mst; /* storage of master_shard and the optimizer state (see the legend) */
    pcs_dtype_t hst; /* the host exchange dtype of the shard (see the legend) */
    uint64_t padded, c;
    uint32_t sg, shard_index;
    void *master_shard;   /* c, mst */
    void *grad_shard;     /* c, grad dtype; NULL for a unit with no trainable parameter */
    int trainable;        /* a parameter of the unit is not frozen (plan) */
    /* exp_avg/exp_avg_sq or momentum, compact: n_state elements, the shard's ranges outside
     * frozen parameters (upd_off/upd_len) back to back — PyTorch keeps no state for a frozen
     * parameter, and the plan's estimate counts none; NULL when n_state is 0 */
    void *opt_a, *opt_b; /* mst */
    uint64_t n_state;
    /* The full-size buffers come from the runtime's pool (rt_block_t) and are held only while
     * the unit is live, as the plan's estimate counts them: unsharded from prefetch/unshard to
     * reshard, grads from grad_buffer to the hand-in, rs_in from the hand-in to the end of the
     * reduction (the grads block itself when no cast is needed). NULL when not held. */
    void *unsharded;      /* padded, param dtype; == master_shard when `alias` */
    void *slice;          /* reshard_partial: my 1/rg of unsharded (pooled) until re-gathered */
    int alias;            /* replicated fp32 unit computing on its fp32 master: no copy */
    pcs_event_t ev_block; /* the unsharded block's release event: the all-gather stream waits
                           * for it (prefetch thread) before gathering into the block */
    int gathered;         /* an all-gather into `unsharded` was issued (ev_ag covers it) */
    int rs_borrowed;      /* rs_in is accum_buf (no copy): the next write of the accumulator
                           * waits for that reduction (compute thread only) */
    int rs_in_accum;      /* this reduction's rs_in is the accumulator: set at the copy-in,
                           * before it is queued, read by the thread that ends it */
    /* training.eval_backward: grads is an fp32 block from grad_buffer_full (an eval-mode
     * backward); the reduction queued from it runs in rdt with the plan's eval collectives when
     * rfull (rdt and rfull set at the copy-in like rs_in_accum) */
    int grads_full, rfull;
    pcs_dtype_t rdt;
    const Pcs__V1__CollectiveSpec *ev_rs, *ev_ar;
    void *full;           /* padded, fp32 (full-precision eval; pooled, until resharded) */
    void *grads;          /* padded, param (compute) dtype */
    void *accum_buf;      /* padded, accum dtype (micro_batches > 1, else on first no-sync) */
    int accum_async;      /* accum_buf came from alloc_async (lazily), not alloc (setup) */
    /* Frozen parameters (requires_grad off) overlapping this shard: the optimizer updates only
     * the element ranges [upd_off[k], +upd_len[k]) between them (a frozen parameter has no
     * gradient in PyTorch, so no step touches it, weight decay included). n_upd == 0: the
     * unit has no frozen parameter in this shard and the whole shard is updated. */
    uint64_t *upd_off, *upd_len;
    size_t n_upd;
    int has_frozen;
    uint64_t *frz_off, *frz_len; /* the frozen ranges themselves: their grads are zeroed */
    size_t n_frz;
    /* The element ranges of the padded gradient layout no trainable parameter covers (padding,
     * frozen parameters, gaps): all a backward that writes every trainable parameter leaves
     * unwritten, so grad_target zeroes only these. */
    uint64_t *gap_off, *gap_len;
    size_t n_gap;
    int grads_in_accum; /* grad_target pointed this micro-batch's backward at accum_buf */
    /* Unit.layout per_param (FSDP2): the pieces of every shard of the unit (shard s: pieces
     * [pc_at[s], pc_at[s + 1])). The all-gather lands in rt->gbuf as [sg, c] and is copied out
     * into `unsharded` (the flat layout the model binds); the reduction input [sg, c] is copied
     * in from the gradients (padding zeroed). NULL with the flat layout. */
    pcs_plan_piece_t *pieces;
    size_t *pc_at;
    void *rs_in;  /* padded, reduce dtype (pooled, see above); per_param: sg * c */
    void *rs_out; /* c, reduce dtype; only with a shard group */
    void *ag_in;  /* c, param dtype; only when the param dtype is not fp32 (the cast) */
    int accum_valid;
    /* hsdp_all_reduce last_micro_batch: the reduce-scattered partial sums of this step's earlier
     * micro-batches (c, reduce dtype), valid once written; syncs counts this step's reductions
     * (compute thread), skip_ar is the queued reduction's verdict (read by the thread that runs
     * it) */
    void *ar_partial;
    int ar_partial_valid;
    uint32_t syncs;
    int skip_ar;
    /* Gradient clipping's sum of squares fused with the accumulation into grad_shard
     * (pcs_kernel_accumulate_sumsq): fuse_ss is the queued reduction's verdict (set at the
     * hand-in, the step's last of the unit), ss_ok says rt->d_scal[3 + index] holds grad_shard's
     * sum of squares as it is now (written by the thread that ends the reduction; cleared by
     * any other write of grad_shard) */
    int fuse_ss, ss_ok;
    int held; /* this rank holds the unit: always, except for the units of other pipeline
               * stages (pp > 1), which get no memory, no collective and no update here */
    int state;           /* under mu */
    uint32_t rs_pending; /* queued or running reductions reading rs_in (under mu) */
    pcs_status_t ag_err;
    char ag_errmsg[512]; /* the prefetch thread's error text (its pcs_last_error is its own) */
    /* the plan's collectives for this unit */
    const Pcs__V1__CollectiveSpec *ag, *rs, *ar;
    const Pcs__V1__CollectiveSpec *ag_bwd; /* backward all-gather over the reshard group */
    const Pcs__V1__Reduction *local;       /* divide with no collective (world of one) */
    uint32_t rg; /* reshard_after_forward=int group size (1 < rg < shard group), else 0 */
    int partial; /* resharded to the reshard group: only my 1/rg slice of unsharded is valid */
    pcs_coll_t *ar_comm;
    /* events (runtime.h ordering contract) */
    pcs_event_t ev_ag;     /* all-gather stream: unsharded/full written */
    pcs_event_t ev_use;    /* compute stream at reshard: reads of unsharded/full enqueued */
    pcs_event_t ev_rsin;   /* compute stream: rs_in written by the copy-in */
    pcs_event_t ev_rsdone; /* reduction stream: rs_in read, grad_shard accumulated */
} rt_unit_t;

struct pcs_runtime {
    const Pcs__V1__Plan *plan;
    const pcs_backend_ops_t *be;
    int device;
    pcs_coll_backend_t coll;
    int stage;              /* collectives on host staging buffers */
    pcs_stream_t cstream;   /* the caller's compute stream (borrowed) */
    pcs_stream_t ag_stream; /* all-gathers (prefetch thread, or inline) */
    pcs_stream_t rs_stream; /* reductions (reduction thread, or inline) */
    pcs_event_t ev_opt;     /* compute stream: optimizer update of the master shards done */
    pcs_event_t ev_fence;   /* recorded on an idle side stream, waited by the compute stream */
    void *gbuf;             /* per_param units: the gathered [sg, c] before its copy-out (the
                             * largest such unit, fp32 when its param dtype is not the master's) */
    void *stage_ag;         /* host staging of the all-gather stream (padded fp32 of the largest
                             * unit); NULL without staging */
    void *stage_rs;         /* host staging of the reduction stream ((padded + c) fp32) */
    float *d_scal;          /* backend: [0] found_inf, [1] inv_scale, [2] scalar all-reduce,
                             * [3 + i] sum of squares of unit i */
    float *h_scal;          /* pinned host: read-back of d_scal, and staged scalar reductions */
    void *d_tmp;            /* backend: max shard scratch of the widest mst (grad widening,
                             * master rounding) */
    /* cpu_offload (plan): master shards and optimizer state are host memory (host_be's kernels
     * update them), h_grad the host copy of one gradient shard (max shard, widest mst) */
    int offload;
    int sync_every; /* plan: every micro-batch reduces (no unsharded accumulator at setup) */
    int ar_last;    /* plan: HSDP all-reduces once per step, on the last micro-batch */
    const pcs_backend_ops_t *host_be;
    void *h_grad;
    void *d_h2d; /* cpu_offload: device copy of one master shard for an all-gather (max shard,
                  * widest mst; used on the all-gather stream only, which orders its reuse) */
    pcs_rt_tpool_t tp_ag, tp_rs; /* collective timings of the all-gather and reduction
                                  * streams (runtime_stats.h) */
    double ev_ms[3];             /* resolved timings of this step by PCS_RT_T_* (under mu) */
    uint32_t rank, world;
    uint32_t micro_batches;
    int fuse_norm; /* cfg->fuse_grad_norm */
    pcs_opt_kind_t opt;
    pcs_adamw_config_t adamw;
    pcs_sgd_config_t sgd;
    uint64_t opt_steps;
    uint64_t fused_norms; /* units whose clipping sum came from their reduction (tests) */
    int prefetch;

    rt_unit_t *units;
    size_t n_units;

    /* communicators (NULL when the group has one rank) */
    pcs_coll_t *world_c, *shard_ag, *shard_rs, *rep_c, *dp_c, *reshard_c;
    pcs_coll_t *pp_c; /* the ranks with this rank's dp coordinates (pp > 1): the global grad norm
                       * and the loss across stages */
    uint32_t pp_size, pp_index;
    uint32_t reshard_n, reshard_index; /* FSDP2 reshard_after_forward=int groups */
    uint32_t shard_size, shard_index, rep_size, rep_index, dp_size, dp_index;

    /* prefetch thread */
    pthread_t ag_thread;
    int ag_started;
    /* reduction thread: reduce-scatters (and HSDP/NO_SHARD all-reduces) of units whose
     * backward finished, overlapping the backward of the next units */
    pthread_t rs_thread;
    int rs_started;
    uint32_t *rs_queue;
    size_t rs_head, rs_len;
    int rs_busy;
    pcs_status_t rs_err;
    char rs_errmsg[768];
    double rs_cast_ms; /* cast time spent on the reduction thread (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *queue;
    size_t q_head, q_len;
    int quit;
    atomic_int aborted;

    /* stats (under mu where the AG thread writes) */
    double ar_ms; /* step-level scalar all-reduces (host-timed: they end in a sync) */
    double cast_ms, opt_ms, wait_ms;
    double inline_reduce_ms; /* reductions run on the compute thread (no reduction thread) */
    double rs_wait_ms;       /* a hand-in waiting for the reduction in flight */
    double drain_ms;         /* optimizer step waiting for queued reductions */
    uint64_t ag_bytes, rs_bytes, ar_bytes;
    pcs_rt_records_t recs; /* this step's collectives, audit and fingerprint */
    uint32_t n_unsharded, max_unsharded;

    /* The pool of full-size unit buffers and the runtime's memory account (under pool_mu). */
    struct rt_block *blocks;
    size_t n_blocks, cap_blocks;
    pthread_mutex_t pool_mu;
    uint64_t mem_live;      /* bytes of backend memory in use: setup buffers + held blocks */
    uint64_t mem_reserved;  /* setup buffers + every pool block, held or free */
    uint64_t mem_peak;      /* most mem_live since create */
    uint64_t mem_step_peak; /* most mem_live since begin_step */
};

// ---- small helpers ----

static double ms_since(uint64_t t0_us)
{
    return (double)(pcs_now_us() - t0_us) / 1000.0;
}

/* "<prefix>: <current last error>". */
static pcs_status_t wrap_err(pcs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static pcs_status_t wrap_err(pcs_status_t st, const char *fmt, ...)
{
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return pcs_set_error(st, "%s: %s", prefix, pcs_last_error());
}

// ---- the buffer pool ----

/* A full-size unit buffer (unsharded parameters, gradients, reduction input). Blocks are reused
 * by size, never returned to the backend before destroy (a caching allocator: units of one model
 * mostly share a size, so after the first step nothing is allocated). A block released by work
 * on stream s is reused by another stream only after `ev_free`, recorded on s at release. */
typedef struct rt_block {
    void *ptr;
    size_t bytes;
    pcs_event_t ev_free;
    int in_use;
} rt_block_t;

static void mem_add_locked(pcs_runtime_t *rt, uint64_t bytes)
{
    rt->mem_live += bytes;
    if (rt->mem_live > rt->mem_peak)
        rt->mem_peak = rt->mem_live;
    if (rt->mem_live > rt->mem_step_peak)
        rt->mem_step_peak = rt->mem_live;
}

/* A block of `bytes` (contents undefined) usable by work enqueued on stream `s` after the call.
 * Compute thread only (it may allocate: stream-ordered on the compute stream). bytes 0: NULL.
 * With `wait_ev` nothing is enqueued on `s`: *wait_ev is the event the stream that uses the block
 * must wait for first (the thread owning that stream enqueues the wait). */
static pcs_status_t pool_get_ev(pcs_runtime_t *rt, size_t bytes, pcs_stream_t s, void **out,
                                pcs_event_t *wait_ev)
{
    *out = NULL;
    if (wait_ev)
        *wait_ev = NULL;
    if (bytes == 0)
        return PCS_OK;
    pcs_event_t ev = NULL;
    pthread_mutex_lock(&rt->pool_mu);
    for (size_t i = 0; i < rt->n_blocks; i++) {
        rt_block_t *b = &rt->blocks[i];
        if (!b->in_use && b->bytes == bytes) {
            b->in_use = 1;
            *out = b->ptr;
            ev = b->ev_free;
            mem_add_locked(rt, bytes);
            break;
        }
    }
    pthread_mutex_unlock(&rt->pool_mu);
    if (*out && wait_ev) {
        *wait_ev = ev;
        return PCS_OK;
    }
    if (*out) /* s waits for the last user's work on the block */
        return rt->be->stream_wait_event(s, ev);
    void *p = NULL;
    PCS_CHECK(rt->be->alloc_async(bytes, rt->cstream, &p));
    pcs_status_t st = rt->be->event_create(&ev);
    /* memory from a stream-ordered allocation is usable on another stream after an event */
    if (st == PCS_OK)
        st = rt->be->event_record(ev, rt->cstream);
    if (st == PCS_OK && !wait_ev && s != rt->cstream)
        st = rt->be->stream_wait_event(s, ev);
    pthread_mutex_lock(&rt->pool_mu);
    if (st == PCS_OK)
        st = pcs_grow((void **)&rt->blocks, &rt->cap_blocks, rt->n_blocks + 1, sizeof *rt->blocks);
    if (st == PCS_OK) {
        rt->blocks[rt->n_blocks++] = (rt_block_t){p, bytes, ev, 1};
        rt->mem_reserved += bytes;
        mem_add_locked(rt, bytes);
    }
    pthread_mutex_unlock(&rt->pool_mu);
    if (st != PCS_OK) {
        if (ev)
            rt->be->event_destroy(ev);
        rt->be->free_async(p, rt->cstream);
        return st;
    }
    *out = p;
    if (wait_ev)
        *wait_ev = ev;
    return PCS_OK;
}

static pcs_status_t pool_get(pcs_runtime_t *rt, size_t bytes, pcs_stream_t s, void **out)
{
    return pool_get_ev(rt, bytes, s, out, NULL);
}

/* Give back the block at `p` (NULL: nothing) once the work enqueued on `s` so far is done. Any
 * thread. */
static pcs_status_t pool_put(pcs_runtime_t *rt, void *p, pcs_stream_t s)
{
    if (!p)
        return PCS_OK;
    pcs_status_t st = PCS_OK;
    int found = 0;
    pthread_mutex_lock(&rt->pool_mu);
    for (size_t i = 0; i < rt->n_blocks; i++) {
        rt_block_t *b = &rt->blocks[i];
        if (b->ptr == p && b->in_use) {
            st = rt->be->event_record(b->ev_free, s);
            b->in_use = 0;
            rt->mem_live -= b->bytes;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&rt->pool_mu);
    if (!found) /* the thread's last error is kept otherwise: callers release on error paths */
        return pcs_set_error(PCS_ERR_INTERNAL, "runtime pool: %p is not a block", p);
    return st;
}

static pcs_dtype_t dt_or(int v, pcs_dtype_t def)
{
    return v > 0 ? (pcs_dtype_t)v : def;
}

/* The storage dtype of a master shard and its optimizer state (the legend's mst). */
static pcs_dtype_t master_storage(pcs_dtype_t master, int trainable)
{
    return master == PCS_DTYPE_FP64 ? PCS_DTYPE_FP64 : trainable ? PCS_DTYPE_FP32 : master;
}

static const Pcs__V1__CollectiveSpec *find_coll(const Pcs__V1__Unit *u, int kind)
{
    for (size_t i = 0; i < u->n_collectives; i++)
        if ((int)u->collectives[i]->kind == kind)
            return u->collectives[i];
    return NULL;
}

static const Pcs__V1__CollectiveSpec *find_coll_phase(const Pcs__V1__Unit *u, int kind, int phase)
{
    for (size_t i = 0; i < u->n_collectives; i++)
        if ((int)u->collectives[i]->kind == kind && (int)u->collectives[i]->phase == phase)
            return u->collectives[i];
    return NULL;
}

static pcs_coll_red_t red_of(const Pcs__V1__CollectiveSpec *c, int use_pre, int use_post)
{
    pcs_coll_red_t r = {PCS_RED_SUM, 0, 0};
    if (!c || !c->reduction)
        return r;
    switch (c->reduction->op) {
    case PCS__V1__REDUCE_OP__REDUCE_OP_AVG:
        r.op = PCS_RED_AVG;
        break;
    case PCS__V1__REDUCE_OP__REDUCE_OP_MAX:
        r.op = PCS_RED_MAX;
        break;
    default:
        r.op = PCS_RED_SUM;
        break;
    }
    if (use_pre)
        r.pre_div = c->reduction->pre_divide;
    if (use_post)
        r.post_div = c->reduction->post_divide;
    if (c->reduction->op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM && c->reduction->premul > 0) {
        /* PREMUL_SUM(f) = SUM of inputs multiplied by f (spec §4.2, a custom divide factor):
         * a pre-divide by 1/f on the way in */
        double pre = r.pre_div > 0 ? r.pre_div : 1.0;
        r.pre_div = pre / c->reduction->premul;
    }
    return r;
}

static pcs_status_t make_comm(const pcs_runtime_config_t *cfg, const char *name, uint32_t id,
                              uint32_t index, uint32_t size, pcs_coll_t **out)
{
    *out = NULL;
    if (size <= 1)
        return PCS_OK;
    if (!cfg->kv)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "runtime: a KV store is needed for %u ranks",
                             size);
    char gname[128];
    snprintf(gname, sizeof gname, "%s%s", cfg->job_tag ? cfg->job_tag : "", name);
    pcs_coll_config_t cc;
    memset(&cc, 0, sizeof cc);
    cc.backend = cfg->coll == PCS_COLL_NCCL ? PCS_COLL_NCCL : PCS_COLL_GLOO;
    cc.kv = cfg->kv;
    cc.group_name = gname;
    cc.group_id = (int)id;
    cc.rank = (int)index;
    cc.size = (int)size;
    cc.timeout_ms = cfg->coll_timeout_ms;
    cc.hostname = cfg->hostname;
    cc.cuda_device = cfg->coll == PCS_COLL_NCCL ? cfg->device : -1;
    pcs_status_t st = pcs_coll_create(&cc, out);
    if (st != PCS_OK)
        return wrap_err(st, "communicator %s/%u (rank %u of %u)", name, id, index, size);
    return PCS_OK;
}

// ---- collectives on backend buffers, directly or through host staging ----

/* All-gather `count` elements per rank from `in` into `out` (backend memory) on stream `s`.
 * Staged: D2H of this rank's part into its slot of `stage`, the collective in place on the
 * host, one H2D of the whole result; the stream is synced before returning, so the gather is
 * complete and `stage` free again. */
static pcs_status_t coll_ag(pcs_runtime_t *rt, pcs_coll_t *c, void *stage, pcs_stream_t s,
                            const void *in, void *out, size_t count, pcs_dtype_t dt)
{
    if (!rt->stage)
        return pcs_coll_all_gather(c, in, out, count, dt, s);
    size_t bytes = count * pcs_dtype_size(dt);
    uint8_t *h = stage, *mine = h + (size_t)pcs_coll_rank(c) * bytes;
    PCS_CHECK(rt->be->copy(mine, in, bytes, PCS_COPY_D2H, s));
    PCS_CHECK(rt->be->sync(s));
    PCS_CHECK(pcs_coll_all_gather(c, mine, h, count, dt, NULL));
    PCS_CHECK(rt->be->copy(out, h, bytes * (size_t)pcs_coll_size(c), PCS_COPY_H2D, s));
    return rt->be->sync(s);
}

/* Reduce-scatter (recv_count per rank) from `in` into `out`, as coll_ag. */
static pcs_status_t coll_rs(pcs_runtime_t *rt, pcs_coll_t *c, void *stage, pcs_stream_t s,
                            const void *in, void *out, size_t recv_count, pcs_dtype_t dt,
                            const pcs_coll_red_t *red)
{
    if (!rt->stage)
        return pcs_coll_reduce_scatter(c, in, out, recv_count, dt, red, s);
    size_t bytes = recv_count * pcs_dtype_size(dt), in_bytes = bytes * (size_t)pcs_coll_size(c);
    uint8_t *h = stage;
    PCS_CHECK(rt->be->copy(h, in, in_bytes, PCS_COPY_D2H, s));
    PCS_CHECK(rt->be->sync(s));
    PCS_CHECK(pcs_coll_reduce_scatter(c, h, h + in_bytes, recv_count, dt, red, NULL));
    PCS_CHECK(rt->be->copy(out, h + in_bytes, bytes, PCS_COPY_H2D, s));
    return rt->be->sync(s);
}

/* In-place all-reduce of `buf` (count elements), as coll_ag. */
static pcs_status_t coll_ar(pcs_runtime_t *rt, pcs_coll_t *c, void *stage, pcs_stream_t s,
                            void *buf, size_t count, pcs_dtype_t dt, const pcs_coll_red_t *red)
{
    if (!rt->stage)
        return pcs_coll_all_reduce(c, buf, buf, count, dt, red, s);
    size_t bytes = count * pcs_dtype_size(dt);
    PCS_CHECK(rt->be->copy(stage, buf, bytes, PCS_COPY_D2H, s));
    PCS_CHECK(rt->be->sync(s));
    PCS_CHECK(pcs_coll_all_reduce(c, stage, stage, count, dt, red, NULL));
    PCS_CHECK(rt->be->copy(buf, stage, bytes, PCS_COPY_H2D, s));
    return rt->be->sync(s);
}

/* The fp32 scalar at `dev` (backend memory, written by work on the compute stream) reduced over
 * `c` (NULL: no reduction) and read back into *out: directly on the device then one D2H, or D2H
 * then a host collective on the pinned h_scal[0]. Synchronizes the compute stream. */
static pcs_status_t scalar_reduce(pcs_runtime_t *rt, pcs_coll_t *c, float *dev, pcs_red_op_t op,
                                  float *out)
{
    pcs_coll_red_t red = {op, 0, 0};
    if (c && !rt->stage)
        PCS_CHECK(pcs_coll_all_reduce(c, dev, dev, 1, PCS_DTYPE_FP32, &red, rt->cstream));
    PCS_CHECK(rt->be->copy(rt->h_scal, dev, sizeof(float), PCS_COPY_D2H, rt->cstream));
    PCS_CHECK(rt->be->sync(rt->cstream));
    if (c && rt->stage)
        PCS_CHECK(pcs_coll_all_reduce(c, rt->h_scal, rt->h_scal, 1, PCS_DTYPE_FP32, &red, NULL));
    *out = rt->h_scal[0];
    return PCS_OK;
}

/* The compute stream waits for everything queued so far on side stream `s`, which no other
 * thread is using right now (its thread is idle). */
static pcs_status_t fence_compute_after(pcs_runtime_t *rt, pcs_stream_t s)
{
    PCS_CHECK(rt->be->event_record(rt->ev_fence, s));
    return rt->be->stream_wait_event(rt->cstream, rt->ev_fence);
}

// ---- per_param layout: the FSDP2 copy-out and copy-in ----

/* [sg, c] of dtype dt (all shards, in rank order) -> the unit's flat buffer `flat`: each piece of
 * each shard to its parameter's place (FSDP2 foreach_all_gather_copy_out). Padding is not copied;
 * the flat buffer's gaps (alignment, tail) are never read. */
static pcs_status_t copy_out(pcs_runtime_t *rt, rt_unit_t *u, void *flat, const void *gathered,
                             pcs_dtype_t dt, pcs_stream_t s)
{
    size_t esz = pcs_dtype_size(dt);
    for (uint32_t r = 0; r < u->sg; r++)
        for (size_t k = u->pc_at[r]; k < u->pc_at[r + 1]; k++) {
            const pcs_plan_piece_t *q = &u->pieces[k];
            for (uint64_t j = 0; j < q->count; j++) {
                uint64_t at = u->u->params[q->param]->offset + q->elem + j * q->stride;
                uint64_t from = r * u->c + q->shard_off + j * q->len;
                PCS_CHECK(rt->be->copy((uint8_t *)flat + at * esz,
                                       (const uint8_t *)gathered + from * esz, q->len * esz,
                                       PCS_COPY_D2D, s));
            }
        }
    return PCS_OK;
}

/* The flat buffer `flat` (gradients, sdt) -> [sg, c] of ddt at `dst`: zeroed, then each piece cast
 * (or copied) to its place (FSDP2 foreach_reduce_scatter_copy_in: chunk-cat with zero padding,
 * cast to the reduce dtype during the copy). */
static pcs_status_t copy_in(pcs_runtime_t *rt, rt_unit_t *u, void *dst, pcs_dtype_t ddt,
                            const void *flat, pcs_dtype_t sdt, pcs_stream_t s)
{
    size_t de = pcs_dtype_size(ddt), se = pcs_dtype_size(sdt);
    PCS_CHECK(pcs_kernel_fill(rt->be, dst, ddt, (size_t)(u->sg * u->c), 0.0, s));
    for (uint32_t r = 0; r < u->sg; r++)
        for (size_t k = u->pc_at[r]; k < u->pc_at[r + 1]; k++) {
            const pcs_plan_piece_t *q = &u->pieces[k];
            for (uint64_t j = 0; j < q->count; j++) {
                uint64_t at = u->u->params[q->param]->offset + q->elem + j * q->stride;
                void *d = (uint8_t *)dst + (r * u->c + q->shard_off + j * q->len) * de;
                const void *src = (const uint8_t *)flat + at * se;
                PCS_CHECK(ddt == sdt ? rt->be->copy(d, src, q->len * de, PCS_COPY_D2D, s)
                                     : pcs_kernel_cast(rt->be, d, ddt, src, sdt, q->len, s));
            }
        }
    return PCS_OK;
}

// ---- unshard (runs on the prefetch thread, or inline) ----

static pcs_status_t do_unshard_comm(pcs_runtime_t *rt, rt_unit_t *u, int full);

static pcs_status_t do_unshard(pcs_runtime_t *rt, rt_unit_t *u, int full)
{
    /* The buffer may still be read by compute work enqueued before the last reshard, and the
     * master shard written by the last optimizer update: the all-gather stream waits for both. */
    PCS_CHECK(rt->be->stream_wait_event(rt->ag_stream, u->ev_use));
    PCS_CHECK(rt->be->stream_wait_event(rt->ag_stream, rt->ev_opt));
    if (!full && u->ev_block) { /* the pool block's previous user is done with it */
        PCS_CHECK(rt->be->stream_wait_event(rt->ag_stream, u->ev_block));
        u->ev_block = NULL;
    }
    if (!full)
        u->gathered = 1;
    PCS_CHECK(do_unshard_comm(rt, u, full));
    return rt->be->event_record(u->ev_ag, rt->ag_stream);
}

static pcs_status_t do_unshard_comm(pcs_runtime_t *rt, rt_unit_t *u, int full)
{
    if (u->partial && !full) {
        /* Re-gather from the reshard group (FSDP2 reshard_after_forward=int): each member kept
         * its 1/rg slice of the unsharded buffer after forward. */
        uint64_t chunk = u->padded / u->rg;
        size_t pe = pcs_dtype_size(u->param);
        pcs_rt_timing_t *tm = pcs_rt_timing_start(&rt->tp_ag, rt->ag_stream);
        pcs_status_t st = coll_ag(rt, rt->reshard_c, rt->stage_ag, rt->ag_stream, u->slice,
                                  u->unsharded, chunk, u->param);
        if (st == PCS_OK)
            pcs_rt_timing_end(&rt->tp_ag, tm, rt->ag_stream, PCS_RT_T_AG);
        /* the slice kept since forward goes back to the pool after the gather read it; a
         * failed gather falls back to the master shard next time (partial cleared) */
        pcs_status_t pst = pool_put(rt, u->slice, rt->ag_stream);
        u->slice = NULL;
        u->partial = 0;
        if (st == PCS_OK)
            st = pst;
        pthread_mutex_lock(&rt->mu);
        rt->ag_bytes += chunk * u->rg * pe;
        pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER, u->index, u->param,
                      chunk, u->rg, u->ag_bwd, 1);
        pthread_mutex_unlock(&rt->mu);
        if (st != PCS_OK)
            return wrap_err(st, "reshard-group all-gather of unit %u", u->index);
        u->partial = 0;
        return PCS_OK;
    }
    if (u->alias && !full)
        return PCS_OK; /* computes on the master shard itself */
    pcs_dtype_t dt = full ? u->mst : u->param;
    void *dst = full ? u->full : u->unsharded;
    size_t esz = pcs_dtype_size(dt);
    uint64_t t0 = pcs_now_us();
    const void *master = u->master_shard;
    if (rt->offload && u->c > 0) {
        /* cpu_offload: the master shard to the device first (the cast happens there) */
        PCS_CHECK(rt->be->copy(rt->d_h2d, u->master_shard, u->c * pcs_dtype_size(u->mst),
                               PCS_COPY_H2D, rt->ag_stream));
        master = rt->d_h2d;
    }
    const void *src = master;
    pcs_status_t st = PCS_OK;
    /* Master shards are stored in mst: fp64, or fp32 holding values of the master dtype (pure
     * fp16 keeps fp16-representable values), so the cast source is mst. */
    if (dt != u->mst) {
        st = pcs_kernel_cast(rt->be, u->ag_in, dt, master, u->mst, u->c, rt->ag_stream);
        src = u->ag_in;
    }
    double cast_ms = dt != u->mst ? ms_since(t0) : 0;
    if (u->sg <= 1) {
        if (st == PCS_OK)
            st = rt->be->copy(dst, src, u->c * esz, PCS_COPY_D2D, rt->ag_stream);
        pthread_mutex_lock(&rt->mu);
        rt->cast_ms += cast_ms;
        pthread_mutex_unlock(&rt->mu);
        return st;
    }
    pcs_rt_timing_t *tm = NULL;
    if (st == PCS_OK) {
        tm = pcs_rt_timing_start(&rt->tp_ag, rt->ag_stream);
        st = coll_ag(rt, rt->shard_ag, rt->stage_ag, rt->ag_stream, src,
                     u->pieces ? rt->gbuf : dst, u->c, dt);
        if (st == PCS_OK)
            pcs_rt_timing_end(&rt->tp_ag, tm, rt->ag_stream, PCS_RT_T_AG);
        if (st == PCS_OK && u->pieces) /* FSDP2 copy-out: [sg, c] -> the parameters */
            st = copy_out(rt, u, dst, rt->gbuf, dt, rt->ag_stream);
    }
    pthread_mutex_lock(&rt->mu);
    rt->cast_ms += cast_ms;
    rt->ag_bytes += u->c * u->sg * esz;
    pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER, u->index, dt, u->c, u->sg,
                  full ? NULL : u->ag, 1);
    pthread_mutex_unlock(&rt->mu);
    if (st != PCS_OK)
        return wrap_err(st, "all-gather of unit %u", u->index);
    return PCS_OK;
}

/* Whether the prefetch thread is running an all-gather (under mu). */
static int ag_in_flight(const pcs_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_units; i++)
        if (rt->units[i].state == U_RUNNING)
            return 1;
    return 0;
}

static void *ag_main(void *arg)
{
    pcs_runtime_t *rt = arg;
    pcs_thread_name("pcs-prefetch");
    /* CUDA's current device is per host thread: this thread's launches and copies target it. */
    char dev_err[512] = "";
    pcs_status_t dev_st = rt->be->set_device(rt->device);
    if (dev_st != PCS_OK)
        snprintf(dev_err, sizeof dev_err, "prefetch thread: %s", pcs_last_error());
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        while (!rt->q_len && !rt->quit)
            pthread_cond_wait(&rt->cv, &rt->mu);
        if (rt->quit)
            break;
        uint32_t ui = rt->queue[rt->q_head];
        rt->q_head = (rt->q_head + 1) % rt->n_units;
        rt->q_len--;
        rt_unit_t *u = &rt->units[ui];
        u->state = U_RUNNING;
        pthread_mutex_unlock(&rt->mu);
        pcs_status_t st =
            atomic_load(&rt->aborted)
                ? pcs_set_error(PCS_ERR_CANCELLED, "all-gather of unit %u: runtime aborted", ui)
            : dev_st != PCS_OK ? pcs_set_error(dev_st, "%s", dev_err)
                               : do_unshard(rt, u, 0);
        char err[512];
        if (st != PCS_OK)
            snprintf(err, sizeof err, "%s", pcs_last_error());
        pthread_mutex_lock(&rt->mu);
        u->ag_err = st;
        if (st != PCS_OK)
            snprintf(u->ag_errmsg, sizeof u->ag_errmsg, "%s", err);
        if (st == PCS_OK) {
            u->state = U_UNSHARDED;
            rt->n_unsharded++;
            if (rt->n_unsharded > rt->max_unsharded)
                rt->max_unsharded = rt->n_unsharded;
        } else {
            u->state = U_SHARDED;
            PCS_DEBUG(PCS_SUB_WORKER, "prefetch of unit %u failed: %s", ui, err);
        }
        pthread_cond_broadcast(&rt->cv);
    }
    pthread_mutex_unlock(&rt->mu);
    return NULL;
}

// ---- create / destroy ----

static void *rs_main(void *arg);
static pcs_status_t reduce_comm_ops(pcs_runtime_t *rt, rt_unit_t *u);
static pcs_status_t wait_reductions(pcs_runtime_t *rt);

/* n elements of dt in backend memory, zeroed on the compute stream (setup: before any step). */
static void mem_setup(pcs_runtime_t *rt, uint64_t bytes)
{
    pthread_mutex_lock(&rt->pool_mu);
    rt->mem_reserved += bytes;
    mem_add_locked(rt, bytes);
    pthread_mutex_unlock(&rt->pool_mu);
}

static pcs_status_t alloc_zero(pcs_runtime_t *rt, uint64_t n, pcs_dtype_t dt, void **out)
{
    *out = NULL;
    PCS_CHECK(rt->be->alloc((size_t)n * pcs_dtype_size(dt), out));
    mem_setup(rt, (uint64_t)n * pcs_dtype_size(dt));
    return pcs_kernel_fill(rt->be, *out, dt, (size_t)n, 0.0, rt->cstream);
}

/* A master shard or optimizer state: backend memory, or host memory with cpu_offload (not in the
 * runtime's device account; zeroed like alloc_zero). */
static pcs_status_t alloc_state(pcs_runtime_t *rt, uint64_t n, pcs_dtype_t dt, void **out)
{
    if (!rt->offload)
        return alloc_zero(rt, n, dt, out);
    *out = NULL;
    PCS_CHECK(rt->be->host_alloc((size_t)n * pcs_dtype_size(dt), out));
    if (*out)
        memset(*out, 0, (size_t)n * pcs_dtype_size(dt));
    return PCS_OK;
}

static void free_state(pcs_runtime_t *rt, void *p)
{
    if (rt->offload)
        rt->be->host_free(p);
    else
        rt->be->free(p);
}

/* The same for a buffer allocated lazily, while a step may run: the prefetch and reduction
 * threads' collectives may be in flight (NCCL kernels waiting for peers), and cudaMalloc may
 * synchronize the device, which can hang the job. Stream-ordered on the compute stream (the
 * calling compute thread's): work on the compute stream after this call may use it; another
 * stream only after an event recorded on the compute stream after this call (the caller's job).
 * Freed with free_async (destroy). */
static pcs_status_t alloc_zero_async(pcs_runtime_t *rt, uint64_t n, pcs_dtype_t dt, void **out)
{
    *out = NULL;
    PCS_CHECK(rt->be->alloc_async((size_t)n * pcs_dtype_size(dt), rt->cstream, out));
    mem_setup(rt, (uint64_t)n * pcs_dtype_size(dt));
    return pcs_kernel_fill(rt->be, *out, dt, (size_t)n, 0.0, rt->cstream);
}

/* This rank's shard (c elements, pieces `pc`) minus the frozen parameters' pieces in it, as local
 * element ranges (see rt_unit_t). Pieces are in shard order (both layouts keep parameter order
 * in a shard). */
static pcs_status_t trainable_ranges(rt_unit_t *u, const Pcs__V1__Unit *pu,
                                     const pcs_plan_piece_t *pc, size_t npc)
{
    size_t n_frozen = 0;
    for (size_t k = 0; k < npc; k++)
        n_frozen += pu->params[pc[k].param]->frozen;
    if (n_frozen == 0)
        return PCS_OK;
    u->has_frozen = 1;
    PCS_CHECK(pcs_calloc(n_frozen + 1, sizeof *u->upd_off, (void **)&u->upd_off));
    PCS_CHECK(pcs_calloc(n_frozen + 1, sizeof *u->upd_len, (void **)&u->upd_len));
    PCS_CHECK(pcs_calloc(n_frozen, sizeof *u->frz_off, (void **)&u->frz_off));
    PCS_CHECK(pcs_calloc(n_frozen, sizeof *u->frz_len, (void **)&u->frz_len));
    uint64_t at = 0; /* start of the next trainable range */
    for (size_t k = 0; k < npc; k++) {
        if (!pu->params[pc[k].param]->frozen)
            continue;
        uint64_t lo = pc[k].shard_off, hi = lo + pc[k].count * pc[k].len;
        if (lo > at) {
            u->upd_off[u->n_upd] = at;
            u->upd_len[u->n_upd++] = lo - at;
        }
        u->frz_off[u->n_frz] = lo;
        u->frz_len[u->n_frz++] = hi - lo;
        if (hi > at)
            at = hi;
    }
    if (u->c > at) {
        u->upd_off[u->n_upd] = at;
        u->upd_len[u->n_upd++] = u->c - at;
    }
    return PCS_OK;
}

/* The complement of the trainable parameters' ranges in [0, padded) (see rt_unit_t.gap_off). */
static pcs_status_t grad_gaps(rt_unit_t *u, const Pcs__V1__Unit *pu)
{
    size_t n = 0;
    uint64_t *lo = NULL, *hi = NULL;
    pcs_status_t st = pcs_calloc(pu->n_params + 1, sizeof *lo, (void **)&lo);
    if (st == PCS_OK)
        st = pcs_calloc(pu->n_params + 1, sizeof *hi, (void **)&hi);
    for (size_t k = 0; st == PCS_OK && k < pu->n_params; k++) {
        const Pcs__V1__ParamSlot *p = pu->params[k];
        if (p->frozen || p->numel == 0)
            continue;
        /* insertion by offset (plans keep parameter order, so this is usually an append) */
        size_t j = n++;
        for (; j > 0 && lo[j - 1] > p->offset; j--) {
            lo[j] = lo[j - 1];
            hi[j] = hi[j - 1];
        }
        lo[j] = p->offset;
        hi[j] = p->offset + p->numel; /* (pcs_plan_check_layout: within padded) */
    }
    if (st == PCS_OK)
        st = pcs_calloc(n + 1, sizeof *u->gap_off, (void **)&u->gap_off);
    if (st == PCS_OK)
        st = pcs_calloc(n + 1, sizeof *u->gap_len, (void **)&u->gap_len);
    uint64_t at = 0;
    for (size_t k = 0; st == PCS_OK && k <= n; k++) {
        uint64_t b = k < n ? lo[k] : u->padded;
        if (b > at) {
            u->gap_off[u->n_gap] = at;
            u->gap_len[u->n_gap++] = b - at;
        }
        if (k < n && hi[k] > at)
            at = hi[k];
    }
    free(lo);
    free(hi);
    return st;
}

/* Zero the gap ranges of a padded gradient layout in dtype dt, on the compute stream. */
static pcs_status_t fill_gaps(pcs_runtime_t *rt, const rt_unit_t *u, void *buf, pcs_dtype_t dt)
{
    size_t esz = pcs_dtype_size(dt);
    for (size_t k = 0; k < u->n_gap; k++)
        PCS_CHECK(pcs_kernel_fill(rt->be, (uint8_t *)buf + u->gap_off[k] * esz, dt, u->gap_len[k],
                                  0.0, rt->cstream));
    return PCS_OK;
}

static pcs_status_t alloc_units(pcs_runtime_t *rt, const pcs_runtime_config_t *cfg)
{
    const Pcs__V1__Plan *p = rt->plan;
    PCS_CHECK(pcs_calloc(p->n_units ? p->n_units : 1, sizeof *rt->units, (void **)&rt->units));
    rt->n_units = p->n_units;
    PCS_CHECK(pcs_calloc(p->n_units ? p->n_units : 1, sizeof *rt->queue, (void **)&rt->queue));
    PCS_CHECK(
        pcs_calloc(p->n_units ? p->n_units : 1, sizeof *rt->rs_queue, (void **)&rt->rs_queue));
    /* host staging of one master shard's initial values: fp32 from init_param (tmp32), in mst
     * (tmp: tmp32 itself for fp32, fp64 values from init_param64 or widened from tmp32) */
    float *tmp32 = NULL;
    double *tmp64 = NULL;
    size_t tmp_cap = 0;
    pcs_status_t st = PCS_OK;
    for (size_t i = 0; i < p->n_units; i++) {
        rt_unit_t *u = &rt->units[i];
        const Pcs__V1__Unit *pu = p->units[i];
        PCS_CHECK_GOTO(rt->be->event_create(&u->ev_ag), st, out);
        PCS_CHECK_GOTO(rt->be->event_create(&u->ev_use), st, out);
        PCS_CHECK_GOTO(rt->be->event_create(&u->ev_rsin), st, out);
        PCS_CHECK_GOTO(rt->be->event_create(&u->ev_rsdone), st, out);
        u->u = pu;
        u->index = (uint32_t)i;
        /* pipeline stage s runs on pp rank s mod pp (planner/schedule.h) */
        u->held = rt->pp_size <= 1 || pu->stage % rt->pp_size == rt->pp_index;
        u->master = dt_or(pu->master_dtype, PCS_DTYPE_FP32);
        for (size_t k = 0; k < pu->n_params && !u->trainable; k++)
            u->trainable = !pu->params[k]->frozen;
        u->mst = master_storage(u->master, u->trainable);
        u->hst = u->mst == PCS_DTYPE_FP64 ? PCS_DTYPE_FP64 : PCS_DTYPE_FP32;
        u->param = dt_or(pu->param_dtype, u->master);
        u->reduce = dt_or(pu->reduce_dtype, u->param);
        u->grad = dt_or(pu->grad_dtype, u->master);
        u->accum = dt_or(pu->accum_dtype, u->reduce);
        u->sg = pu->shard_group_size ? pu->shard_group_size : 1;
        u->padded = pu->padded_numel;
        u->c = pu->shard_numel ? pu->shard_numel : pu->padded_numel;
        if (u->sg > 1 && u->sg != rt->shard_size) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "unit %zu: shard group of %u ranks, mesh shard dim is %u "
                               "(unsupported by this runtime)",
                               i, u->sg, rt->shard_size);
            goto out;
        }
        int per_param = pu->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM && u->sg > 1;
        uint64_t all = 0; /* (pcs_plan_check_layout checked the plan at create) */
        if (__builtin_mul_overflow(u->c, (uint64_t)u->sg, &all) ||
            (per_param ? all > u->padded || u->padded < pu->flat_numel : all != u->padded)) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "unit %zu: shard %llu x %u %s padded %llu", i,
                               (unsigned long long)u->c, u->sg, per_param ? ">" : "!=",
                               (unsigned long long)u->padded);
            goto out;
        }
        u->shard_index = u->sg > 1 ? rt->shard_index : 0;
        if (!u->held) {
            u->c = 0; /* another stage's unit: nothing of it lives here */
            continue;
        }
        u->ag = find_coll(pu, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER);
        u->rs = find_coll(pu, PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER);
        u->ar = find_coll(pu, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE);
        u->local = pu->local_reduction;
        for (size_t k = 0; k < pu->n_eval_collectives; k++) {
            const Pcs__V1__CollectiveSpec *e = pu->eval_collectives[k];
            if (e->kind == PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER)
                u->ev_rs = e;
            else if (e->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE)
                u->ev_ar = e;
        }
        u->rdt = u->reduce;
        if (pu->reshard_group_size > 1 && pu->reshard_group_size == rt->reshard_n) {
            u->rg = pu->reshard_group_size;
            u->ag_bwd = find_coll_phase(pu, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER,
                                        PCS__V1__PHASE__PHASE_BACKWARD);
        }
        if (u->ar) {
            int g = (int)u->ar->group;
            u->ar_comm = g == PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE ? rt->rep_c
                         : g == PCS__V1__GROUP_KIND__GROUP_KIND_WORLD   ? rt->world_c
                                                                        : rt->dp_c;
        } else if (u->sg <= 1 && rt->dp_size > 1 && !pu->unmanaged) {
            u->ar_comm = rt->dp_c; /* replicated unit without a planned collective: average */
        } else if (u->sg > 1 && rt->rep_size > 1) {
            u->ar_comm = rt->rep_c;
        }
        /* Every buffer starts zeroed (as calloc did): padding stays 0 and optimizer state
         * starts at 0. */
        PCS_CHECK_GOTO(alloc_state(rt, u->c, u->mst, &u->master_shard), st, out);
        /* A unit whose parameters are all frozen has no gradient, optimizer state or
         * accumulator (as PyTorch: no .grad, no state; the plan's estimate counts none): its
         * hand-ins are dropped and the optimizer step passes it by. (u->trainable above.) */
        if (u->trainable)
            PCS_CHECK_GOTO(alloc_zero(rt, u->c, u->grad, &u->grad_shard), st, out);
        /* unsharded, grads and rs_in come from the pool while the unit is live; a replicated
         * unit computing in its fp32 (fp64) master's dtype computes on the master itself (DDP) */
        u->alias = u->sg <= 1 && u->param == u->mst && u->master == u->mst && !rt->offload;
        if (u->alias)
            u->unsharded = NULL; /* set to master_shard below */
        if (rt->micro_batches > 1 && !rt->sync_every && u->trainable)
            PCS_CHECK_GOTO(alloc_zero(rt, u->padded, u->accum, &u->accum_buf), st, out);
        if (rt->ar_last && rt->micro_batches > 1 && u->sg > 1 && u->ar && u->trainable &&
            u->ar->group == PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE)
            PCS_CHECK_GOTO(alloc_zero(rt, u->c, u->reduce, &u->ar_partial), st, out);
        if (u->sg > 1 && u->trainable) /* fp32 wide when an eval-mode backward reduces into
                                          * it too; a frozen unit never reduces */
            PCS_CHECK_GOTO(alloc_zero(rt, u->c,
                                      u->ev_rs && pcs_dtype_size(u->reduce) < 4 ? PCS_DTYPE_FP32
                                                                                : u->reduce,
                                      &u->rs_out),
                           st, out);
        if (u->param != u->mst)
            PCS_CHECK_GOTO(alloc_zero(rt, u->c, u->param, &u->ag_in), st, out);

        /* The pieces: this rank's tell what its shard holds; with per_param those of every
         * shard copy the gathered [sg, c] out and the gradients in (O(sg x params), kept); the
         * flat layout needs only this rank's, for setup (O(params), freed below). */
        uint32_t nsh = per_param ? u->sg : 1;
        PCS_CHECK_GOTO(pcs_calloc((size_t)nsh * (pu->n_params + 1), sizeof *u->pieces,
                                  (void **)&u->pieces),
                       st, out);
        PCS_CHECK_GOTO(pcs_calloc((size_t)nsh + 1, sizeof *u->pc_at, (void **)&u->pc_at), st, out);
        for (uint32_t r = 0; r < nsh; r++)
            u->pc_at[r + 1] = u->pc_at[r] + pcs_plan_shard_pieces(
                                                pu, per_param ? r : u->shard_index,
                                                u->pieces + u->pc_at[r]);
        uint32_t me = per_param ? u->shard_index : 0;
        const pcs_plan_piece_t *mine = u->pieces + u->pc_at[me];
        size_t n_mine = u->pc_at[me + 1] - u->pc_at[me];
        /* Master shard: the pieces of the parameters it holds (flat layout: elements
         * [shard_index*c, +c) of the flat buffer), each generated only for that piece (init is
         * a function of element index), into a zeroed host buffer copied H2D (init_param fills
         * host memory). fp64 masters take init_param64's doubles where the caller has them (a
         * model built in float64), else init_param's floats widened exactly. */
        if (u->c > tmp_cap) {
            free(tmp32);
            free(tmp64);
            tmp32 = NULL;
            tmp64 = NULL;
            tmp_cap = u->c;
            PCS_CHECK_GOTO(pcs_calloc(tmp_cap, sizeof *tmp32, (void **)&tmp32), st, out);
        }
        if (u->mst == PCS_DTYPE_FP64 && !tmp64 && tmp_cap)
            PCS_CHECK_GOTO(pcs_calloc(tmp_cap, sizeof *tmp64, (void **)&tmp64), st, out);
        int init64 = u->mst == PCS_DTYPE_FP64 && cfg->init_param64;
        if (u->c > 0)
            memset(init64 ? (void *)tmp64 : (void *)tmp32, 0,
                   u->c * (init64 ? sizeof *tmp64 : sizeof *tmp32));
        for (size_t k = 0; k < n_mine; k++)
            for (uint64_t j = 0; j < mine[k].count; j++) {
                uint64_t at = mine[k].shard_off + j * mine[k].len;
                uint64_t first = mine[k].elem + j * mine[k].stride;
                const Pcs__V1__ParamSlot *ps = pu->params[mine[k].param];
                PCS_CHECK_GOTO(init64 ? cfg->init_param64(cfg->init_ctx, ps, first, mine[k].len,
                                                          tmp64 + at)
                                      : cfg->init_param(cfg->init_ctx, ps, first, mine[k].len,
                                                        tmp32 + at),
                               st, out);
            }
        if (u->mst == PCS_DTYPE_FP64 && !init64 && u->c > 0)
            PCS_CHECK_GOTO(pcs_cpu_cast_array(tmp64, PCS_DTYPE_FP64, tmp32, PCS_DTYPE_FP32, u->c),
                           st, out);
        const void *tmp = u->mst == PCS_DTYPE_FP64 ? (const void *)tmp64 : (const void *)tmp32;
        if (pcs_dtype_size(u->mst) < 4 && u->c > 0) {
            /* a frozen unit stored in its bf16/fp16 master dtype: the values rounded to it once
             * (init gives floats), into the fp64 scratch, which holds c of any dtype */
            if (!tmp64)
                PCS_CHECK_GOTO(pcs_calloc(tmp_cap, sizeof *tmp64, (void **)&tmp64), st, out);
            PCS_CHECK_GOTO(pcs_cpu_cast_array(tmp64, u->mst, tmp32, PCS_DTYPE_FP32, u->c), st,
                           out);
            tmp = tmp64;
        }
        size_t mbytes = u->c * pcs_dtype_size(u->mst);
        PCS_CHECK_GOTO(trainable_ranges(u, pu, mine, n_mine), st, out);
        PCS_CHECK_GOTO(grad_gaps(u, pu), st, out);
        /* optimizer state for the elements outside frozen parameters only (compact); plain SGD
         * (momentum 0) keeps none */
        u->n_state = u->trainable ? u->c : 0;
        if (u->has_frozen && u->trainable) {
            u->n_state = 0;
            for (size_t k = 0; k < u->n_upd; k++)
                u->n_state += u->upd_len[k];
        }
        if (u->n_state && (rt->opt == PCS_OPT_ADAMW || rt->sgd.momentum != 0))
            PCS_CHECK_GOTO(alloc_state(rt, u->n_state, u->mst, &u->opt_a), st, out);
        if (u->n_state && rt->opt == PCS_OPT_ADAMW)
            PCS_CHECK_GOTO(alloc_state(rt, u->n_state, u->mst, &u->opt_b), st, out);
        if (!per_param) { /* the flat layout's moves are whole ranges: no pieces needed */
            free(u->pieces);
            free(u->pc_at);
            u->pieces = NULL;
            u->pc_at = NULL;
        }
        void *ms = u->master_shard;
        if (u->alias)
            u->unsharded = ms;
        if (rt->offload) {
            if (u->c > 0)
                memcpy(ms, tmp, mbytes);
            if (u->master != u->mst && u->c > 0) { /* the rounding below, on the host */
                PCS_CHECK_GOTO(pcs_kernel_cast(rt->host_be, rt->h_grad, u->master, ms,
                                               PCS_DTYPE_FP32, u->c, NULL),
                               st, out);
                PCS_CHECK_GOTO(pcs_kernel_cast(rt->host_be, ms, PCS_DTYPE_FP32, rt->h_grad,
                                               u->master, u->c, NULL),
                               st, out);
            }
            continue;
        }
        PCS_CHECK_GOTO(rt->be->copy(ms, tmp, mbytes, PCS_COPY_H2D, rt->cstream), st, out);
        /* the host buffer is reused for the next unit: the copy must have read it */
        PCS_CHECK_GOTO(rt->be->sync(rt->cstream), st, out);
        if (u->master != u->mst && u->c > 0) {
            /* values of a low-precision master dtype, kept in fp32 storage (round trip through
             * the d_tmp scratch) */
            PCS_CHECK_GOTO(pcs_kernel_cast(rt->be, rt->d_tmp, u->master, ms, PCS_DTYPE_FP32, u->c,
                                           rt->cstream),
                           st, out);
            PCS_CHECK_GOTO(pcs_kernel_cast(rt->be, ms, PCS_DTYPE_FP32, rt->d_tmp, u->master, u->c,
                                           rt->cstream),
                           st, out);
        }
    }
    PCS_CHECK_GOTO(rt->be->sync(rt->cstream), st, out);
out:
    free(tmp32);
    free(tmp64);
    return st;
}

/* Buffers shared by all units, sized by the largest unit: the fp32 scratch, the read-back
 * scalars and (staging) the two host staging buffers. */
static pcs_status_t alloc_shared(pcs_runtime_t *rt)
{
    const Pcs__V1__Plan *p = rt->plan;
    uint64_t max_c = 1, max_stage = 1, gbytes = 0;
    size_t msz = 4; /* the widest master storage */
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *pu = p->units[i];
        if (rt->pp_size > 1 && pu->stage % rt->pp_size != rt->pp_index)
            continue; /* another pipeline stage's unit */
        uint64_t c = pu->shard_numel ? pu->shard_numel : pu->padded_numel;
        max_c = c > max_c ? c : max_c;
        pcs_dtype_t md = dt_or(pu->master_dtype, PCS_DTYPE_FP32);
        int trainable = 0;
        for (size_t k = 0; k < pu->n_params && !trainable; k++)
            trainable = !pu->params[k]->frozen;
        size_t fsz = pcs_dtype_size(master_storage(md, trainable));
        msz = fsz > msz ? fsz : msz;
        max_stage = pu->padded_numel + c > max_stage ? pu->padded_numel + c : max_stage;
        uint64_t sg = pu->shard_group_size ? pu->shard_group_size : 1;
        if (pu->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM && sg > 1) {
            /* the gather in the param dtype, and the full-precision one (in the master storage
             * dtype) when the param dtype differs: the wider (a frozen bf16 unit computing in
             * fp32 gathers 4 bytes per element, its full gather 2) */
            pcs_dtype_t pd = dt_or(pu->param_dtype, md);
            size_t e = pcs_dtype_size(pd);
            if (pd != md && fsz > e)
                e = fsz;
            uint64_t b = sg * c * e;
            gbytes = b > gbytes ? b : gbytes;
        }
    }
    if (gbytes)
        PCS_CHECK(alloc_zero(rt, (gbytes + 3) / 4, PCS_DTYPE_FP32, &rt->gbuf));
    pcs_dtype_t wide = msz == 8 ? PCS_DTYPE_FP64 : PCS_DTYPE_FP32;
    PCS_CHECK(alloc_zero(rt, max_c, wide, &rt->d_tmp));
    PCS_CHECK(alloc_zero(rt, 3 + p->n_units, PCS_DTYPE_FP32, (void **)&rt->d_scal));
    PCS_CHECK(rt->be->host_alloc((3 + p->n_units) * sizeof(float), (void **)&rt->h_scal));
    if (rt->offload) {
        PCS_CHECK(rt->be->host_alloc((size_t)max_c * msz, &rt->h_grad));
        PCS_CHECK(alloc_zero(rt, max_c, wide, &rt->d_h2d));
    }
    if (rt->stage) {
        /* fp32 is the widest dtype a collective here moves, fp64 where masters are fp64 */
        PCS_CHECK(rt->be->host_alloc((size_t)max_stage * msz, &rt->stage_ag));
        PCS_CHECK(rt->be->host_alloc((size_t)max_stage * msz, &rt->stage_rs));
    }
    return PCS_OK;
}

pcs_status_t pcs_runtime_create(const pcs_runtime_config_t *cfg, pcs_runtime_t **out)
{
    if (!cfg || !out || !cfg->plan || !cfg->be || !cfg->init_param)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "runtime: plan, backend and init required");
    *out = NULL;
    PCS_CHECK(pcs_plan_check_runnable(cfg->plan)); /* what the coordinator accepts, no more */
    pcs_runtime_t *rt = NULL;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *rt, (void **)&rt));
    pthread_mutex_init(&rt->mu, NULL);
    pthread_mutex_init(&rt->pool_mu, NULL);
    pthread_cond_init(&rt->cv, NULL);
    rt->plan = cfg->plan;
    rt->be = cfg->be;
    rt->rank = cfg->rank;
    rt->world = cfg->plan->world_size ? cfg->plan->world_size : 1;
    rt->micro_batches = cfg->micro_batches ? cfg->micro_batches : 1;
    rt->fuse_norm = cfg->fuse_grad_norm;
    rt->opt = cfg->opt;
    rt->adamw = cfg->adamw;
    rt->sgd = cfg->sgd;
    rt->prefetch = cfg->prefetch;
    pcs_rt_tpool_init(&rt->tp_ag, cfg->be, &rt->mu);
    pcs_rt_tpool_init(&rt->tp_rs, cfg->be, &rt->mu);
    pcs_rt_records_reset(&rt->recs);
    rt->device = cfg->device;
    rt->coll = cfg->coll ? cfg->coll : PCS_COLL_GLOO;
    rt->cstream = cfg->stream;
    /* Gloo works on host memory: with a device backend it always goes through staging. */
    int host_be = strcmp(cfg->be->name, "cpu") == 0;
    rt->stage = cfg->stage_host || (rt->coll == PCS_COLL_GLOO && !host_be);
    /* offloading from host memory to host memory is nothing: a cpu job runs as before */
    rt->offload = cfg->plan->cpu_offload && !host_be;
    rt->sync_every = cfg->plan->sync_every_micro_batch;
    rt->ar_last = cfg->plan->hsdp_all_reduce_last;
    if (cfg->rank >= rt->world) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "runtime: rank %u >= world %u", cfg->rank,
                           rt->world);
        goto fail;
    }
    if (rt->coll != PCS_COLL_GLOO && rt->coll != PCS_COLL_NCCL) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "runtime: unknown collective backend %d",
                           (int)rt->coll);
        goto fail;
    }
    if (rt->coll == PCS_COLL_NCCL && (host_be || cfg->stage_host)) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "runtime: NCCL needs device buffers (backend %s%s); use gloo",
                           cfg->be->name, cfg->stage_host ? ", stage_host set" : "");
        goto fail;
    }
    if (rt->coll == PCS_COLL_NCCL && pcs_backend_is_simulated(cfg->be)) {
        /* its device pointers are poisoned host memory: NCCL would fault on them */
        st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                           "runtime: NCCL cannot run on the simulated cuda device "
                           "(simulate-cuda); use collectives: gloo");
        goto fail;
    }
    PCS_CHECK_GOTO(pcs_backend_get("cpu", &rt->host_be), st, fail);
    PCS_CHECK_GOTO(rt->be->set_device(rt->device), st, fail);
    PCS_CHECK_GOTO(rt->be->stream_create(&rt->ag_stream), st, fail);
    PCS_CHECK_GOTO(rt->be->stream_create(&rt->rs_stream), st, fail);
    PCS_CHECK_GOTO(rt->be->event_create(&rt->ev_opt), st, fail);
    PCS_CHECK_GOTO(rt->be->event_create(&rt->ev_fence), st, fail);
    /* The plan's groups (planner/mesh.c); a group is named by its lowest rank. */
    pcs_mesh_group_t shard_g, rep_g, dp_g;
    PCS_CHECK_GOTO(
        pcs_plan_group(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, rt->rank, &shard_g), st,
        fail);
    PCS_CHECK_GOTO(
        pcs_plan_group(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE, rt->rank, &rep_g), st,
        fail);
    PCS_CHECK_GOTO(pcs_plan_group(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_DP, rt->rank, &dp_g),
                   st, fail);
    rt->shard_size = shard_g.size;
    rt->shard_index = shard_g.index;
    rt->rep_size = rep_g.size;
    rt->rep_index = rep_g.index;
    rt->dp_size = dp_g.size;
    rt->dp_index = dp_g.index;
    pcs_mesh_group_t pp_g = {0};
    pp_g.size = 1;
    if (cfg->plan->pp_size > 1)
        PCS_CHECK_GOTO(
            pcs_plan_group(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_PP, rt->rank, &pp_g), st,
            fail);
    rt->pp_size = pp_g.size;
    rt->pp_index = pp_g.index;

    int any_sharded = 0, any_rep = 0;
    for (size_t i = 0; i < cfg->plan->n_units; i++) {
        const Pcs__V1__Unit *pu = cfg->plan->units[i];
        if (pu->shard_group_size > 1)
            any_sharded = 1;
        else
            any_rep = 1;
    }
    /* Communicators are created in the same order on every rank (rendezvous is by name). */
    PCS_CHECK_GOTO(make_comm(cfg, "world", 0, rt->rank, rt->world, &rt->world_c), st, fail);
    if (any_sharded) {
        PCS_CHECK_GOTO(make_comm(cfg, "shard-ag", shard_g.first, rt->shard_index, rt->shard_size,
                                 &rt->shard_ag),
                       st, fail);
        PCS_CHECK_GOTO(make_comm(cfg, "shard-rs", shard_g.first, rt->shard_index, rt->shard_size,
                                 &rt->shard_rs),
                       st, fail);
    }
    PCS_CHECK_GOTO(
        make_comm(cfg, "replicate", rep_g.first, rt->rep_index, rt->rep_size, &rt->rep_c), st,
        fail);
    for (size_t i = 0; i < cfg->plan->n_units; i++) {
        uint32_t n = cfg->plan->units[i]->reshard_group_size;
        if (n > 1 && n < rt->shard_size && rt->shard_size % n == 0)
            rt->reshard_n = n;
    }
    if (rt->reshard_n) {
        /* n consecutive ranks of the shard group (mesh.view(-1, n)) */
        pcs_mesh_t m;
        pcs_mesh_group_t g;
        PCS_CHECK_GOTO(pcs_mesh_from_plan(cfg->plan, &m), st, fail);
        PCS_CHECK_GOTO(
            pcs_mesh_group(&m, rt->rank, PCS_MESH_VARY(PCS_MESH_DP_SHARD), rt->reshard_n, &g), st,
            fail);
        rt->reshard_index = g.index;
        PCS_CHECK_GOTO(
            make_comm(cfg, "reshard", g.first, rt->reshard_index, rt->reshard_n, &rt->reshard_c),
            st, fail);
    }
    /* the dp group: replicated units' all-reduce, and the loss over the data-parallel ranks
     * when they are not the world (pipeline stages) */
    if (any_rep || cfg->plan->pp_size > 1)
        PCS_CHECK_GOTO(make_comm(cfg, "dp", dp_g.first, rt->dp_index, rt->dp_size, &rt->dp_c), st,
                       fail);
    PCS_CHECK_GOTO(make_comm(cfg, "pp", pp_g.first, rt->pp_index, rt->pp_size, &rt->pp_c), st,
                   fail);

    PCS_CHECK_GOTO(alloc_shared(rt), st, fail);
    /* the fused accumulate + sum of squares where the backend has it (asked once, not per
     * reduction: an empty call answers UNSUPPORTED on cuda and the simulated device) */
    if (rt->fuse_norm &&
        pcs_kernel_accumulate_sumsq(rt->be, rt->d_scal, PCS_DTYPE_FP32, rt->d_scal,
                                    PCS_DTYPE_FP32, 0, &rt->d_scal[2], rt->cstream) != PCS_OK)
        rt->fuse_norm = 0;
    PCS_CHECK_GOTO(alloc_units(rt, cfg), st, fail);
    if (rt->prefetch > 0) {
        if (pthread_create(&rt->ag_thread, NULL, ag_main, rt) != 0) {
            st = pcs_set_error(PCS_ERR_SYSTEM, "runtime: cannot start the prefetch thread");
            goto fail;
        }
        rt->ag_started = 1;
        if (pthread_create(&rt->rs_thread, NULL, rs_main, rt) != 0) {
            st = pcs_set_error(PCS_ERR_SYSTEM, "runtime: cannot start the reduction thread");
            goto fail;
        }
        rt->rs_started = 1;
    }
    *out = rt;
    return PCS_OK;
fail:
    pcs_runtime_destroy(rt);
    return st;
}

void pcs_runtime_abort(pcs_runtime_t *rt, const char *reason)
{
    if (!rt)
        return;
    atomic_store(&rt->aborted, 1);
    pcs_coll_t *cs[] = {rt->world_c, rt->shard_ag,  rt->shard_rs, rt->rep_c,
                        rt->dp_c,    rt->reshard_c, rt->pp_c};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        if (cs[i])
            pcs_coll_abort(cs[i], reason);
}

int pcs_runtime_blame(const pcs_runtime_t *rt, pcs_coll_fault_t *fault)
{
    if (fault)
        *fault = PCS_COLL_FAULT_NONE;
    if (!rt)
        return -1;
    /* each communicator with the plan group its ranks index (the world's index is the rank) */
    const struct {
        pcs_coll_t *c;
        Pcs__V1__GroupKind kind;
    } cs[] = {{rt->world_c, PCS__V1__GROUP_KIND__GROUP_KIND_WORLD},
              {rt->shard_ag, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD},
              {rt->shard_rs, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD},
              {rt->rep_c, PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE},
              {rt->dp_c, PCS__V1__GROUP_KIND__GROUP_KIND_DP},
              {rt->reshard_c, PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD},
              {rt->pp_c, PCS__V1__GROUP_KIND__GROUP_KIND_PP}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        pcs_coll_fault_t f;
        int idx = cs[i].c ? pcs_coll_blame(cs[i].c, &f) : -1;
        if (idx < 0)
            continue;
        uint32_t n = 0, my = 0;
        (void)pcs_plan_group_ranks(rt->plan, cs[i].kind, rt->rank, NULL, &n, &my);
        uint32_t *ranks = NULL;
        int global = -1;
        if (n > (uint32_t)idx && pcs_calloc(n, sizeof *ranks, (void **)&ranks) == PCS_OK &&
            pcs_plan_group_ranks(rt->plan, cs[i].kind, rt->rank, ranks, &n, &my) == PCS_OK)
            global = (int)ranks[idx];
        free(ranks);
        if (global >= 0) {
            if (fault)
                *fault = f;
            return global;
        }
    }
    return -1;
}

void pcs_runtime_destroy(pcs_runtime_t *rt)
{
    if (!rt)
        return;
    if (rt->ag_started) {
        pthread_mutex_lock(&rt->mu);
        rt->quit = 1;
        int busy = 0;
        for (size_t i = 0; i < rt->n_units; i++)
            busy |= rt->units[i].state == U_RUNNING;
        pthread_cond_broadcast(&rt->cv);
        pthread_mutex_unlock(&rt->mu);
        /* A prefetch blocked in a collective returns only when its communicator is aborted (the
         * shard group's, or the reshard group's for a partially resharded unit). */
        if (busy && rt->shard_ag)
            pcs_coll_abort(rt->shard_ag, "runtime destroyed");
        if (busy && rt->reshard_c)
            pcs_coll_abort(rt->reshard_c, "runtime destroyed");
        pthread_join(rt->ag_thread, NULL);
    }
    if (rt->rs_started) {
        pthread_mutex_lock(&rt->mu);
        rt->quit = 1;
        int busy = rt->rs_busy;
        pthread_cond_broadcast(&rt->cv);
        pthread_mutex_unlock(&rt->mu);
        if (busy) /* a reduction blocked on a dead peer returns only when aborted */
            pcs_runtime_abort(rt, "runtime destroyed");
        pthread_join(rt->rs_thread, NULL);
    }
    pcs_coll_destroy(rt->world_c);
    pcs_coll_destroy(rt->shard_ag);
    pcs_coll_destroy(rt->shard_rs);
    pcs_coll_destroy(rt->rep_c);
    pcs_coll_destroy(rt->dp_c);
    pcs_coll_destroy(rt->reshard_c);
    pcs_coll_destroy(rt->pp_c);
    /* nothing queued may still use the buffers (errors ignored: we are tearing down) */
    if (rt->ag_stream)
        (void)rt->be->sync(rt->ag_stream);
    if (rt->rs_stream)
        (void)rt->be->sync(rt->rs_stream);
    if (rt->be)
        (void)rt->be->sync(rt->cstream);
    for (size_t i = 0; rt->units && i < rt->n_units; i++) {
        rt_unit_t *u = &rt->units[i];
        const pcs_backend_ops_t *be = rt->be;
        free_state(rt, u->master_shard);
        be->free(u->grad_shard);
        free_state(rt, u->opt_a);
        free_state(rt, u->opt_b);
        /* unsharded, slice, grads and rs_in are pool blocks (freed below) */
        /* lazily allocated ones: stream-ordered on the compute stream (every stream synced
         * above, so nothing else still uses them), after which the compute stream syncs again */
        if (u->accum_async)
            be->free_async(u->accum_buf, rt->cstream);
        else
            be->free(u->accum_buf);
        be->free(u->rs_out);
        be->free(u->ar_partial);
        be->free(u->ag_in);
        free(u->upd_off);
        free(u->upd_len);
        free(u->frz_off);
        free(u->frz_len);
        free(u->gap_off);
        free(u->gap_len);
        free(u->pieces);
        free(u->pc_at);
        pcs_event_t evs[] = {u->ev_ag, u->ev_use, u->ev_rsin, u->ev_rsdone};
        for (size_t k = 0; k < sizeof evs / sizeof evs[0]; k++)
            if (evs[k])
                be->event_destroy(evs[k]);
    }
    for (size_t i = 0; rt->be && i < rt->n_blocks; i++) {
        rt->be->free_async(rt->blocks[i].ptr, rt->cstream);
        rt->be->event_destroy(rt->blocks[i].ev_free);
    }
    free(rt->blocks);
    if (rt->be) {
        (void)rt->be->sync(rt->cstream); /* the free_async above have run */
        pcs_rt_tpool_free(&rt->tp_ag);
        pcs_rt_tpool_free(&rt->tp_rs);
        rt->be->free(rt->d_tmp);
        rt->be->free(rt->d_scal);
        rt->be->host_free(rt->h_scal);
        rt->be->host_free(rt->h_grad);
        rt->be->free(rt->d_h2d);
        rt->be->free(rt->gbuf);
        rt->be->host_free(rt->stage_ag);
        rt->be->host_free(rt->stage_rs);
        if (rt->ev_opt)
            rt->be->event_destroy(rt->ev_opt);
        if (rt->ev_fence)
            rt->be->event_destroy(rt->ev_fence);
        rt->be->stream_destroy(rt->ag_stream);
        rt->be->stream_destroy(rt->rs_stream);
    }
    free(rt->units);
    free(rt->queue);
    free(rt->rs_queue);
    pcs_rt_records_free(&rt->recs);
    pthread_cond_destroy(&rt->cv);
    pthread_mutex_destroy(&rt->mu);
    pthread_mutex_destroy(&rt->pool_mu);
    free(rt);
}

size_t pcs_runtime_n_units(const pcs_runtime_t *rt)
{
    return rt->n_units;
}

// ---- step ----

pcs_status_t pcs_runtime_begin_step(pcs_runtime_t *rt)
{
    /* reductions still queued (post_backward without an optimizer step) accumulate into the
     * grads zeroed below: they finish first */
    PCS_CHECK(wait_reductions(rt));
    PCS_CHECK(fence_compute_after(rt, rt->rs_stream));
    for (size_t i = 0; i < rt->n_units; i++) {
        rt_unit_t *u = &rt->units[i];
        if (!u->held)
            continue;
        /* on the compute stream: the optimizer that read it ran there, and every reduction
         * waits for a copy-in enqueued after this */
        if (u->grad_shard)
            PCS_CHECK(pcs_kernel_fill(rt->be, u->grad_shard, u->grad, u->c, 0.0, rt->cstream));
        u->accum_valid = 0;
        u->ss_ok = 0;
        u->grads_in_accum = 0; /* (a backward abandoned mid-step: nothing to give back) */
        u->syncs = 0;
        u->ar_partial_valid = 0;
    }
    pthread_mutex_lock(&rt->mu);
    rt->ar_ms = rt->cast_ms = rt->opt_ms = rt->wait_ms = 0;
    rt->ev_ms[PCS_RT_T_AG] = rt->ev_ms[PCS_RT_T_RS] = rt->ev_ms[PCS_RT_T_AR] = 0;
    /* timings of the last step not read through stats are dropped; the reductions drained
     * above, and a prefetch the caller queued before begin_step may still hold a slot */
    pcs_rt_tpool_reset(&rt->tp_rs);
    if (!rt->q_len && !ag_in_flight(rt)) /* no timing slot held by the prefetch thread */
        pcs_rt_tpool_reset(&rt->tp_ag);
    rt->rs_cast_ms = 0;
    rt->inline_reduce_ms = rt->drain_ms = rt->rs_wait_ms = 0;
    rt->ag_bytes = rt->rs_bytes = rt->ar_bytes = 0;
    pcs_rt_records_reset(&rt->recs);
    rt->max_unsharded = rt->n_unsharded;
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_lock(&rt->pool_mu);
    rt->mem_step_peak = rt->mem_live;
    pthread_mutex_unlock(&rt->pool_mu);
    return PCS_OK;
}

static pcs_status_t check_unit(const pcs_runtime_t *rt, uint32_t unit)
{
    if (unit >= rt->n_units)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "unit %u out of range (%zu units)", unit,
                             rt->n_units);
    if (!rt->units[unit].held)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u belongs to pipeline stage %u, which pp rank %u does not hold",
                             unit, rt->units[unit].u->stage, rt->pp_index);
    return PCS_OK;
}

int pcs_runtime_holds(const pcs_runtime_t *rt, uint32_t unit)
{
    return unit < rt->n_units && rt->units[unit].held;
}

/* Take the unit's unsharded block from the pool (compute thread, unit not queued or running: only
 * this thread changes a sharded unit). The all-gather stream writes it. */
static pcs_status_t hold_unsharded(pcs_runtime_t *rt, rt_unit_t *u)
{
    if (u->alias || u->unsharded)
        return PCS_OK;
    /* the wait goes on the all-gather stream from the thread that owns it (do_unshard) */
    return pool_get_ev(rt, (size_t)u->padded * pcs_dtype_size(u->param), rt->ag_stream,
                       &u->unsharded, &u->ev_block);
}

/* Back to the pool once the compute work enqueued so far (which reads it) is done. */
static pcs_status_t drop_unsharded(pcs_runtime_t *rt, rt_unit_t *u)
{
    if (u->alias)
        return PCS_OK;
    void *p = u->unsharded;
    u->unsharded = NULL;
    u->ev_block = NULL;
    /* a gather issued into it (a prefetch never unsharded, too) is work on the all-gather
     * stream: the release orders after it as well as after the compute stream's reads */
    if (p && u->gathered)
        PCS_CHECK(rt->be->stream_wait_event(rt->cstream, u->ev_ag));
    u->gathered = 0;
    return pool_put(rt, p, rt->cstream);
}

pcs_status_t pcs_runtime_prefetch(pcs_runtime_t *rt, uint32_t unit)
{
    PCS_CHECK(check_unit(rt, unit));
    if (!rt->ag_started)
        return PCS_OK;
    rt_unit_t *u = &rt->units[unit];
    pthread_mutex_lock(&rt->mu);
    int sharded = u->state == U_SHARDED;
    pthread_mutex_unlock(&rt->mu);
    if (sharded)
        PCS_CHECK(hold_unsharded(rt, u));
    pthread_mutex_lock(&rt->mu);
    if (u->state == U_SHARDED) {
        u->state = U_QUEUED;
        rt->queue[(rt->q_head + rt->q_len) % rt->n_units] = unit;
        rt->q_len++;
        pthread_cond_broadcast(&rt->cv);
    }
    pthread_mutex_unlock(&rt->mu);
    return PCS_OK;
}

pcs_status_t pcs_runtime_unshard(pcs_runtime_t *rt, uint32_t unit, int full_precision,
                                 const void **params, pcs_dtype_t *dtype)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    if (atomic_load(&rt->aborted))
        return pcs_set_error(PCS_ERR_CANCELLED, "runtime aborted");
    if (full_precision && u->param != u->master) {
        /* Eval path: wait until the prefetch thread is idle (nothing queued and no all-gather of
         * any unit in flight: both would use the same communicator at once), then gather the
         * master dtype inline on the all-gather communicator. */
        pthread_mutex_lock(&rt->mu);
        while (rt->q_len || ag_in_flight(rt))
            pthread_cond_wait(&rt->cv, &rt->mu);
        pthread_mutex_unlock(&rt->mu);
        if (!u->full) /* a pool block until the unit is resharded */
            PCS_CHECK(pool_get(rt, (size_t)u->padded * pcs_dtype_size(u->mst), rt->ag_stream,
                               &u->full));
        PCS_CHECK(do_unshard(rt, u, 1));
        PCS_CHECK(rt->be->stream_wait_event(rt->cstream, u->ev_ag));
        *params = u->full;
        *dtype = u->mst;
        return PCS_OK;
    }
    uint64_t t0 = pcs_now_us();
    pcs_status_t st = PCS_OK;
    if (rt->ag_started) {
        PCS_CHECK(pcs_runtime_prefetch(rt, unit));
        pthread_mutex_lock(&rt->mu);
        while (u->state == U_QUEUED || u->state == U_RUNNING)
            pthread_cond_wait(&rt->cv, &rt->mu);
        char msg[512] = "";
        if (u->state != U_UNSHARDED) {
            st = u->ag_err != PCS_OK ? u->ag_err : PCS_ERR_INTERNAL;
            snprintf(msg, sizeof msg, "%s", u->ag_errmsg[0] ? u->ag_errmsg : "prefetch failed");
        }
        rt->wait_ms += ms_since(t0);
        pthread_mutex_unlock(&rt->mu);
        if (st != PCS_OK)
            return pcs_set_error(st, "%s", msg);
    } else if (u->state != U_UNSHARDED) {
        PCS_CHECK(hold_unsharded(rt, u));
        PCS_CHECK(do_unshard(rt, u, 0));
        pthread_mutex_lock(&rt->mu);
        u->state = U_UNSHARDED;
        rt->n_unsharded++;
        if (rt->n_unsharded > rt->max_unsharded)
            rt->max_unsharded = rt->n_unsharded;
        rt->wait_ms += ms_since(t0);
        pthread_mutex_unlock(&rt->mu);
    }
    /* work the caller enqueues on the compute stream from now on sees the gathered buffer */
    PCS_CHECK(rt->be->stream_wait_event(rt->cstream, u->ev_ag));
    *params = u->unsharded;
    *dtype = u->param;
    return PCS_OK;
}

pcs_status_t pcs_runtime_reshard(pcs_runtime_t *rt, uint32_t unit)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    pthread_mutex_lock(&rt->mu);
    /* A queued prefetch must finish before the buffer counts as free again. */
    while (u->state == U_QUEUED || u->state == U_RUNNING)
        pthread_cond_wait(&rt->cv, &rt->mu);
    if (u->state == U_UNSHARDED) {
        u->state = U_SHARDED;
        rt->n_unsharded--;
    }
    u->partial = 0;
    pthread_mutex_unlock(&rt->mu);
    /* sharded now (a failed prefetch too): its blocks go back to the pool after the compute work
     * enqueued so far, which the next all-gather into the buffer also waits for */
    PCS_CHECK(drop_unsharded(rt, u));
    void *slice = u->slice, *full = u->full;
    u->slice = u->full = NULL;
    PCS_CHECK(pool_put(rt, slice, rt->cstream));
    PCS_CHECK(pool_put(rt, full, rt->cstream));
    return rt->be->event_record(u->ev_use, rt->cstream);
}

pcs_status_t pcs_runtime_reshard_partial(pcs_runtime_t *rt, uint32_t unit)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    if (!u->rg || !rt->reshard_c)
        return pcs_runtime_reshard(rt, unit);
    pthread_mutex_lock(&rt->mu);
    while (u->state == U_QUEUED || u->state == U_RUNNING)
        pthread_cond_wait(&rt->cv, &rt->mu);
    int was = u->state == U_UNSHARDED;
    if (was) {
        u->state = U_SHARDED;
        rt->n_unsharded--;
    }
    pthread_mutex_unlock(&rt->mu);
    if (was && !u->slice) {
        /* Keep only my slice (a block of 1/rg, as the plan's estimate counts it); the rest of
         * the parameters come back only through the backward all-gather over the reshard
         * group. On the compute stream, after the forward work that still reads the buffer. */
        uint64_t chunk = u->padded / u->rg;
        size_t bytes = (size_t)chunk * pcs_dtype_size(u->param);
        PCS_CHECK(pool_get(rt, bytes, rt->cstream, &u->slice));
        if (bytes)
            PCS_CHECK(rt->be->copy(u->slice,
                                   (uint8_t *)u->unsharded + (size_t)rt->reshard_index * bytes,
                                   bytes, PCS_COPY_D2D, rt->cstream));
        u->partial = 1;
    }
    PCS_CHECK(drop_unsharded(rt, u));
    return rt->be->event_record(u->ev_use, rt->cstream);
}

int pcs_runtime_is_unsharded(const pcs_runtime_t *rt, uint32_t unit)
{
    return unit < rt->n_units && rt->units[unit].state == U_UNSHARDED;
}

pcs_status_t pcs_runtime_grad_buffer(pcs_runtime_t *rt, uint32_t unit, void **grads,
                                     pcs_dtype_t *dtype)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    if (u->grads_full)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: an eval-mode backward's fp32 gradient buffer is out (hand "
                             "it in first)",
                             unit);
    if (u->grads_in_accum)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: the backward's target is the accumulator (grad_target): "
                             "hand it in first",
                             unit);
    if (!u->grads)
        PCS_CHECK(pool_get(rt, (size_t)u->padded * pcs_dtype_size(u->param), rt->cstream,
                           &u->grads));
    PCS_CHECK(pcs_kernel_fill(rt->be, u->grads, u->param, u->padded, 0.0, rt->cstream));
    *grads = u->grads;
    *dtype = u->param;
    return PCS_OK;
}

/* Before the accumulator is written again: wait for a reduction that still reads it in place
 * (synced on an earlier micro-batch of this step), host and device. */
static pcs_status_t wait_accum_free(pcs_runtime_t *rt, rt_unit_t *u)
{
    if (!u->rs_borrowed)
        return PCS_OK;
    if (rt->rs_started) {
        pthread_mutex_lock(&rt->mu);
        while (u->rs_pending)
            pthread_cond_wait(&rt->cv, &rt->mu);
        pthread_mutex_unlock(&rt->mu);
    }
    PCS_CHECK(rt->be->stream_wait_event(rt->cstream, u->ev_rsdone));
    u->rs_borrowed = 0;
    return PCS_OK;
}

pcs_status_t pcs_runtime_grad_target(pcs_runtime_t *rt, uint32_t unit, int sync, void **grads,
                                     pcs_dtype_t *dtype, int *accumulate)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    if (u->grads || u->grads_in_accum)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: a gradient buffer is already out (hand it in first)", unit);
    if (!u->trainable) { /* every parameter frozen: nothing to write, nothing to hand in */
        *grads = NULL;
        *dtype = u->param;
        *accumulate = 0;
        return PCS_OK;
    }
    if (sync && !u->accum_valid) {
        /* nothing accumulated: a gradient block, zeroed only where the backward will not write */
        PCS_CHECK(pool_get(rt, (size_t)u->padded * pcs_dtype_size(u->param), rt->cstream,
                           &u->grads));
        PCS_CHECK(fill_gaps(rt, u, u->grads, u->param));
        *grads = u->grads;
        *dtype = u->param;
        *accumulate = 0;
        return PCS_OK;
    }
    /* accumulating (a no-sync micro-batch, or the synced one after them): the backward writes
     * (first micro-batch) or adds into the no-sync accumulator itself */
    PCS_CHECK(wait_accum_free(rt, u));
    if (!u->accum_buf) { /* micro_batches 1 with no-sync hand-ins: allocate on use */
        PCS_CHECK(alloc_zero_async(rt, u->padded, u->accum, &u->accum_buf));
        u->accum_async = 1;
    }
    if (!u->accum_valid)
        PCS_CHECK(fill_gaps(rt, u, u->accum_buf, u->accum));
    u->grads_in_accum = 1;
    *grads = u->accum_buf;
    *dtype = u->accum;
    *accumulate = u->accum_valid;
    return PCS_OK;
}

pcs_status_t pcs_runtime_grad_buffer_full(pcs_runtime_t *rt, uint32_t unit, float **grads)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    if (!rt->plan->eval_backward)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: an eval-mode backward needs training.eval_backward (with "
                             "full_precision_eval) in the job: its plan has no full-precision "
                             "reductions and its estimate no room for them",
                             unit);
    if (u->master != PCS_DTYPE_FP32)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u: master dtype %s: no full precision to reduce in", unit,
                             pcs_dtype_name(u->master));
    if (u->grads || u->grads_in_accum)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: a gradient buffer is already out (hand it in first)", unit);
    if (u->accum_valid)
        return pcs_set_error(PCS_ERR_STATE,
                             "unit %u: a training micro-batch's gradients are accumulating; an "
                             "eval-mode backward comes before the step or after it",
                             unit);
    if (!u->ev_rs && !u->ev_ar && (u->sg > 1 || u->ar_comm) && u->reduce != PCS_DTYPE_FP32)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u: the plan has no fp32 reductions for an eval-mode backward "
                             "(unit.eval_collectives) and reduces in %s",
                             unit, pcs_dtype_name(u->reduce));
    PCS_CHECK(pool_get(rt, (size_t)u->padded * sizeof(float), rt->cstream, &u->grads));
    PCS_CHECK(pcs_kernel_fill(rt->be, u->grads, PCS_DTYPE_FP32, u->padded, 0.0, rt->cstream));
    u->grads_full = 1;
    *grads = u->grads;
    return PCS_OK;
}

// ---- reductions (the reduction thread, or inline) ----

/* The grads block back to the pool after the compute work enqueued so far (which reads it). */
static pcs_status_t drop_grads(pcs_runtime_t *rt, rt_unit_t *u)
{
    void *p = u->grads;
    u->grads = NULL;
    u->grads_full = 0; /* (the flag describes the block out, none now) */
    return pool_put(rt, p, rt->cstream);
}

/* Copy-in on the compute thread: cast (accumulator or grads) to the reduce dtype into rs_in, so
 * the grads buffer is free for the next backward while the collective runs. */
static pcs_status_t reduce_copy_in(pcs_runtime_t *rt, rt_unit_t *u)
{
    const void *src = u->grads;
    pcs_dtype_t sdt = u->param;
    if (u->accum_valid) {
        src = u->accum_buf;
        sdt = u->accum;
    }
    /* an eval-mode backward: fp32 gradients, reduced in fp32 (the master dtype) */
    int full = u->grads_full; /* cleared with the block (drop_grads, or handed over below) */
    u->rfull = full && (u->ev_rs || u->ev_ar);
    u->rdt = full ? PCS_DTYPE_FP32 : u->reduce;
    if (full)
        sdt = PCS_DTYPE_FP32;
    const pcs_dtype_t rdt = u->rdt;
    uint64_t t0 = pcs_now_us();
    /* On the compute stream, after the backward that wrote the grads. */
    PCS_CHECK(rt->be->stream_wait_event(rt->cstream, u->ev_rsdone));
    u->rs_in_accum = 0;
    if (u->pieces) {
        /* per_param: the [sg, c] reduction input is always a block of its own, built by the
         * FSDP2 copy-in (chunk-cat with zero padding, cast to the reduce dtype on the way) */
        PCS_CHECK(pool_get(rt, (size_t)(u->sg * u->c) * pcs_dtype_size(rdt), rt->cstream,
                           &u->rs_in));
        pcs_status_t st = copy_in(rt, u, u->rs_in, rdt, src, sdt, rt->cstream);
        if (st != PCS_OK) {
            (void)pool_put(rt, u->rs_in, rt->cstream);
            u->rs_in = NULL;
            return st;
        }
        PCS_CHECK(drop_grads(rt, u));
    } else if (src == u->grads && sdt == rdt) {
        /* no cast: the gradient block itself is the reduction's input (no copy) */
        u->rs_in = u->grads;
        u->grads = NULL;
        u->grads_full = 0;
    } else if (src == u->accum_buf && sdt == rdt) {
        /* the no-sync accumulator in the reduce dtype is read in place (no copy, no block); it
         * is written again only after this reduction (post_backward waits) */
        u->rs_in = u->accum_buf;
        u->rs_borrowed = 1;
        u->rs_in_accum = 1;
        PCS_CHECK(drop_grads(rt, u));
    } else {
        PCS_CHECK(pool_get(rt, (size_t)u->padded * pcs_dtype_size(rdt), rt->cstream,
                           &u->rs_in));
        pcs_status_t st =
            sdt == rdt
                ? rt->be->copy(u->rs_in, src, u->padded * pcs_dtype_size(sdt), PCS_COPY_D2D,
                               rt->cstream)
                : pcs_kernel_cast(rt->be, u->rs_in, rdt, src, sdt, u->padded, rt->cstream);
        if (st != PCS_OK) { /* nothing will read it: back to the pool */
            (void)pool_put(rt, u->rs_in, rt->cstream);
            u->rs_in = NULL;
            return st;
        }
        PCS_CHECK(drop_grads(rt, u));
    }
    PCS_CHECK(rt->be->event_record(u->ev_rsin, rt->cstream));
    double ms = ms_since(t0);
    pthread_mutex_lock(&rt->mu); /* the prefetch thread adds its cast time too */
    rt->cast_ms += ms;
    pthread_mutex_unlock(&rt->mu);
    return PCS_OK;
}

/* The reduction input done with: a pool block goes back (after the work on `s`); the borrowed
 * accumulator is only let go (rs_borrowed stays until its next writer has waited). */
static pcs_status_t put_rs_in(pcs_runtime_t *rt, rt_unit_t *u, pcs_stream_t s)
{
    void *p = u->rs_in;
    u->rs_in = NULL;
    if (u->rs_in_accum)
        return PCS_OK;
    return pool_put(rt, p, s);
}

/* The collectives of one unit's reduction and the accumulation into its sharded grad; runs on the
 * reduction thread (stats under mu) or inline. */
static pcs_status_t reduce_comm(pcs_runtime_t *rt, rt_unit_t *u)
{
    pcs_status_t st = rt->be->stream_wait_event(rt->rs_stream, u->ev_rsin);
    if (st == PCS_OK)
        st = reduce_comm_ops(rt, u);
    if (st == PCS_OK)
        st = rt->be->event_record(u->ev_rsdone, rt->rs_stream);
    /* rs_in back to the pool once the reduction stream has read it (failed or not) */
    char err[768] = "";
    if (st != PCS_OK)
        snprintf(err, sizeof err, "%s", pcs_last_error());
    pcs_status_t pst = put_rs_in(rt, u, rt->rs_stream);
    if (st != PCS_OK)
        return pcs_set_error(st, "%s", err);
    return pst;
}

/* The plan's divide for a reduction with no collective, in the reduce dtype and with the
 * rounding a collective's pre/post divide has (coll.h: x = rnd(x * (float)(1/d))). */
static pcs_status_t local_divide(pcs_runtime_t *rt, rt_unit_t *u)
{
    if (!u->local)
        return PCS_OK;
    pcs_coll_red_t r = {PCS_RED_SUM, u->local->pre_divide, u->local->post_divide};
    if (u->local->op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM && u->local->premul > 0)
        r.pre_div = (r.pre_div > 0 ? r.pre_div : 1.0) / u->local->premul;
    if (!isfinite(r.pre_div) || !isfinite(r.post_div) || r.pre_div < 0 || r.post_div < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u: local divide factors must be finite and >= 0", u->index);
    double f[2] = {pcs_coll_div_factor(r.pre_div, u->rdt), pcs_coll_div_factor(r.post_div, u->rdt)};
    for (int k = 0; k < 2; k++)
        if (f[k] != 1.0)
            PCS_CHECK(
                pcs_kernel_scale(rt->be, u->rs_in, u->rdt, u->padded, f[k], rt->rs_stream));
    return PCS_OK;
}

static pcs_status_t reduce_comm_ops(pcs_runtime_t *rt, rt_unit_t *u)
{
    void *result;
    pcs_status_t st;
    /* the training reduction, or an eval-mode backward's in fp32 (the plan's eval collectives) */
    const pcs_dtype_t rdt = u->rdt;
    const Pcs__V1__CollectiveSpec *rs = u->rfull ? u->ev_rs : u->rs;
    const Pcs__V1__CollectiveSpec *ar = u->rfull ? u->ev_ar : u->ar;
    if (u->sg > 1) {
        int hsdp = u->ar_comm != NULL;
        pcs_coll_red_t red = red_of(rs, 1, !hsdp);
        pcs_rt_timing_t *tm = pcs_rt_timing_start(&rt->tp_rs, rt->rs_stream);
        st = coll_rs(rt, rt->shard_rs, rt->stage_rs, rt->rs_stream, u->rs_in, u->rs_out, u->c,
                     rdt, &red);
        if (st == PCS_OK)
            pcs_rt_timing_end(&rt->tp_rs, tm, rt->rs_stream, PCS_RT_T_RS);
        pthread_mutex_lock(&rt->mu);
        rt->rs_bytes += u->c * u->sg * pcs_dtype_size(rdt);
        pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER, u->index, rdt,
                      u->c, u->sg, rs, 0);
        pthread_mutex_unlock(&rt->mu);
        if (st != PCS_OK)
            return wrap_err(st, "reduce-scatter of unit %u", u->index);
        result = u->rs_out;
        if (hsdp && u->skip_ar) {
            /* keep the partial sum; the last micro-batch's reduction all-reduces it */
            st = u->ar_partial_valid ? pcs_kernel_accumulate(rt->be, u->ar_partial, rdt,
                                                          u->rs_out, rdt, u->c,
                                                          rt->rs_stream)
                                  : rt->be->copy(u->ar_partial, u->rs_out,
                                                 u->c * pcs_dtype_size(rdt), PCS_COPY_D2D,
                                                 rt->rs_stream);
            if (st == PCS_OK)
                u->ar_partial_valid = 1;
            return st;
        }
        if (hsdp && u->ar_partial_valid && !u->rfull) { /* (a partial is in the reduce dtype) */
            PCS_CHECK(pcs_kernel_accumulate(rt->be, u->rs_out, rdt, u->ar_partial,
                                            rdt, u->c, rt->rs_stream));
            u->ar_partial_valid = 0;
        }
        if (hsdp) {
            pcs_coll_red_t ared = red_of(ar ? ar : rs, 0, 1);
            if (!ar) /* unplanned HSDP leg: keep the RS op, post-divide after it */
                ared.pre_div = 0;
            tm = pcs_rt_timing_start(&rt->tp_rs, rt->rs_stream);
            st = coll_ar(rt, u->ar_comm, rt->stage_rs, rt->rs_stream, u->rs_out, u->c, rdt,
                         &ared);
            if (st == PCS_OK)
                pcs_rt_timing_end(&rt->tp_rs, tm, rt->rs_stream, PCS_RT_T_AR);
            uint32_t g = (uint32_t)pcs_coll_size(u->ar_comm);
            pthread_mutex_lock(&rt->mu);
            rt->ar_bytes += u->c * pcs_dtype_size(rdt);
            pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE, u->index, rdt,
                          u->c, g, ar, 0);
            pthread_mutex_unlock(&rt->mu);
            if (st != PCS_OK)
                return wrap_err(st, "all-reduce (replicas) of unit %u", u->index);
        }
    } else if (u->ar_comm) {
        pcs_coll_red_t red = red_of(ar, 1, 1);
        if (!ar) /* replicated unit without a planned collective: average over the ranks */
            red.op = PCS_RED_AVG;
        pcs_rt_timing_t *tm = pcs_rt_timing_start(&rt->tp_rs, rt->rs_stream);
        st = coll_ar(rt, u->ar_comm, rt->stage_rs, rt->rs_stream, u->rs_in, u->padded, rdt,
                     &red);
        if (st == PCS_OK)
            pcs_rt_timing_end(&rt->tp_rs, tm, rt->rs_stream, PCS_RT_T_AR);
        pthread_mutex_lock(&rt->mu);
        rt->ar_bytes += u->padded * pcs_dtype_size(rdt);
        pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE, u->index, rdt,
                      u->padded, (uint32_t)pcs_coll_size(u->ar_comm), ar, 0);
        pthread_mutex_unlock(&rt->mu);
        if (st != PCS_OK)
            return wrap_err(st, "all-reduce of unit %u", u->index);
        result = u->rs_in;
    } else {
        /* World of one: the local gradient is the reduced one, divided by a custom factor as
         * FSDP2's foreach_reduce does with no reduce-scatter (the plan's local_reduction). */
        result = u->rs_in;
        PCS_CHECK(local_divide(rt, u));
    }
    /* Cast back and accumulate into the sharded grad (grad dtype), as FSDP's
     * _saved_grad_shard += grad. */
    uint64_t t3 = pcs_now_us();
    u->ss_ok = 0;
    if (u->fuse_ss) {
        PCS_CHECK(pcs_kernel_accumulate_sumsq(rt->be, u->grad_shard, u->grad, result, rdt, u->c,
                                              &rt->d_scal[3 + u->index], rt->rs_stream));
        u->ss_ok = 1;
    } else {
        PCS_CHECK(pcs_kernel_accumulate(rt->be, u->grad_shard, u->grad, result, rdt, u->c,
                                        rt->rs_stream));
    }
    pthread_mutex_lock(&rt->mu);
    rt->rs_cast_ms += ms_since(t3);
    pthread_mutex_unlock(&rt->mu);
    return PCS_OK;
}

static void *rs_main(void *arg)
{
    pcs_runtime_t *rt = arg;
    pcs_thread_name("pcs-reduce");
    char dev_err[512] = "";
    pcs_status_t dev_st = rt->be->set_device(rt->device);
    if (dev_st != PCS_OK)
        snprintf(dev_err, sizeof dev_err, "reduction thread: %s", pcs_last_error());
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        while (!rt->rs_len && !rt->quit)
            pthread_cond_wait(&rt->cv, &rt->mu);
        if (rt->quit)
            break;
        uint32_t ui = rt->rs_queue[rt->rs_head];
        rt->rs_head = (rt->rs_head + 1) % rt->n_units;
        rt->rs_len--;
        rt->rs_busy = 1;
        int skip = rt->rs_err != PCS_OK || atomic_load(&rt->aborted);
        pthread_mutex_unlock(&rt->mu);
        pcs_status_t st = PCS_OK;
        if (skip || dev_st != PCS_OK) { /* not run: its input goes back to the pool, after the
                                         * compute stream's copy-in that writes it */
            (void)rt->be->stream_wait_event(rt->rs_stream, rt->units[ui].ev_rsin);
            (void)put_rs_in(rt, &rt->units[ui], rt->rs_stream);
            if (!skip)
                st = pcs_set_error(dev_st, "%s", dev_err);
        } else {
            st = reduce_comm(rt, &rt->units[ui]);
        }
        char err[768];
        if (st != PCS_OK)
            snprintf(err, sizeof err, "%s", pcs_last_error());
        pthread_mutex_lock(&rt->mu);
        if (st != PCS_OK && rt->rs_err == PCS_OK) {
            rt->rs_err = st;
            snprintf(rt->rs_errmsg, sizeof rt->rs_errmsg, "%s", err);
        }
        rt->units[ui].rs_pending--;
        rt->rs_busy = 0;
        pthread_cond_broadcast(&rt->cv);
    }
    pthread_mutex_unlock(&rt->mu);
    return NULL;
}

/* Wait until every queued reduction finished; their first error, with its text. */
static pcs_status_t wait_reductions(pcs_runtime_t *rt)
{
    if (!rt->rs_started)
        return PCS_OK;
    uint64_t t0 = pcs_now_us();
    pthread_mutex_lock(&rt->mu);
    while (rt->rs_len || rt->rs_busy)
        pthread_cond_wait(&rt->cv, &rt->mu);
    pcs_status_t st = rt->rs_err;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", rt->rs_errmsg);
    rt->drain_ms += ms_since(t0);
    pthread_mutex_unlock(&rt->mu);
    if (st != PCS_OK)
        return pcs_set_error(st, "%s", msg);
    return PCS_OK;
}

pcs_status_t pcs_runtime_post_backward(pcs_runtime_t *rt, uint32_t unit, int sync)
{
    PCS_CHECK(check_unit(rt, unit));
    if (atomic_load(&rt->aborted))
        return pcs_set_error(PCS_ERR_CANCELLED, "runtime aborted");
    rt_unit_t *u = &rt->units[unit];
    if (u->grads_full && !sync)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u: an eval-mode backward's gradients are reduced when handed "
                             "in (sync = 1); they do not accumulate",
                             unit);
    const int full = u->grads_full;
    if (!u->trainable) /* no gradient to reduce: a block a C API program wrote goes back */
        return drop_grads(rt, u);
    if (u->grads_in_accum) {
        /* grad_target: the backward wrote (or added) straight into the accumulator */
        if (sync && !u->accum_valid) /* cannot happen: grad_target chose by the same rule */
            return pcs_set_error(PCS_ERR_INTERNAL, "unit %u: accumulator target on a synced "
                                 "micro-batch with nothing accumulated", unit);
        u->grads_in_accum = 0;
        u->accum_valid = 1;
    } else if (!u->grads) {
        /* handed in without grad_buffer: a zero gradient, as an untouched buffer holds */
        PCS_CHECK(pool_get(rt, (size_t)u->padded * pcs_dtype_size(u->param), rt->cstream,
                           &u->grads));
        PCS_CHECK(pcs_kernel_fill(rt->be, u->grads, u->param, u->padded, 0.0, rt->cstream));
    }
    if ((!sync || u->accum_valid) && u->grads) {
        /* the accumulator is still the input of this unit's last reduction (synced on an
         * earlier micro-batch of this step): wait for it, host and device */
        PCS_CHECK(wait_accum_free(rt, u));
        if (!u->accum_buf) { /* no-sync hand-in with micro_batches 1 (C API): allocate on use */
            /* every user (this accumulation, reduce_copy_in) is on the compute stream */
            PCS_CHECK(alloc_zero_async(rt, u->padded, u->accum, &u->accum_buf));
            u->accum_async = 1;
        }
        uint64_t t0 = pcs_now_us();
        /* on the compute stream, after the backward that wrote the grads */
        if (!u->accum_valid) {
            PCS_CHECK(pcs_kernel_cast(rt->be, u->accum_buf, u->accum, u->grads, u->param, u->padded,
                                      rt->cstream));
            u->accum_valid = 1;
        } else {
            PCS_CHECK(pcs_kernel_accumulate(rt->be, u->accum_buf, u->accum, u->grads, u->param,
                                            u->padded, rt->cstream));
        }
        double ms = ms_since(t0);
        pthread_mutex_lock(&rt->mu);
        rt->cast_ms += ms;
        pthread_mutex_unlock(&rt->mu);
    }
    /* hsdp_all_reduce last_micro_batch: the step's last hand-in of a unit all-reduces across
     * replicas (hand-ins counted synced or not; a partial left by fewer hand-ins is all-reduced
     * by the optimizer step) */
    if (!full) /* an eval-mode backward is not a micro-batch of the step */
        u->syncs++;
    if (!sync)
        return drop_grads(rt, u);
    if (rt->rs_started) {
        /* One reduction in flight (FSDP2's rule, and what the plan's memory estimate counts):
         * the reduction of the unit before overlaps this unit's backward, and this copy-in
         * waits for it, so at most one reduction input besides this unit's gradient is held. */
        uint64_t t0 = pcs_now_us();
        pthread_mutex_lock(&rt->mu);
        while (rt->rs_len || rt->rs_busy)
            pthread_cond_wait(&rt->cv, &rt->mu);
        rt->rs_wait_ms += ms_since(t0);
        pthread_mutex_unlock(&rt->mu);
    }
    /* FSDP2 set_requires_all_reduce(False) before the last micro-batch: only the step's last
     * reduction of an HSDP unit all-reduces across replicas (counted per unit, so a C API
     * program that syncs every micro-batch gets it too) */
    u->skip_ar = u->ar_partial != NULL && u->syncs < rt->micro_batches && !full;
    /* the step's last reduction of the unit computes clipping's sum of squares on the way (not
     * with frozen ranges, which the optimizer zeroes first) */
    u->fuse_ss = rt->fuse_norm && !full && u->syncs >= rt->micro_batches && u->n_frz == 0 &&
                 u->grad != PCS_DTYPE_FP64 &&
                 u->reduce != PCS_DTYPE_FP64; /* (the fused op has no fp64 form) */
    pcs_status_t st = reduce_copy_in(rt, u);
    u->accum_valid = 0;
    if (st != PCS_OK)
        return st;
    if (!rt->rs_started) {
        uint64_t t1 = pcs_now_us();
        st = reduce_comm(rt, u);
        pthread_mutex_lock(&rt->mu);
        rt->inline_reduce_ms += ms_since(t1);
        pthread_mutex_unlock(&rt->mu);
        return st;
    }
    pthread_mutex_lock(&rt->mu);
    if (rt->rs_err != PCS_OK) { /* fail fast: an earlier reduction failed */
        char msg[768];
        snprintf(msg, sizeof msg, "%s", rt->rs_errmsg);
        st = rt->rs_err;
        pthread_mutex_unlock(&rt->mu);
        (void)put_rs_in(rt, u, rt->cstream); /* not queued: back after the copy-in */
        return pcs_set_error(st, "%s", msg);
    }
    if (rt->rs_len >= rt->n_units) { /* cannot happen: a unit is queued at most once */
        pthread_mutex_unlock(&rt->mu);
        return pcs_set_error(PCS_ERR_STATE, "unit %u: reduction queue full", unit);
    }
    rt->rs_queue[(rt->rs_head + rt->rs_len) % rt->n_units] = unit;
    rt->rs_len++;
    u->rs_pending++;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
    return PCS_OK;
}

// ---- optimizer step ----

/* `dev` (an fp32 scalar in backend memory) reduced over `c` and read back into *v, recorded as a
 * step-level collective. */
static pcs_status_t world_all_reduce_f32(pcs_runtime_t *rt, pcs_coll_t *c, float *dev, float *v,
                                         pcs_red_op_t op)
{
    uint64_t t0 = pcs_now_us();
    pcs_status_t st = scalar_reduce(rt, c, dev, op, v);
    if (!c)
        return st;
    rt->ar_ms += ms_since(t0);
    rt->ar_bytes += 4;
    pthread_mutex_lock(&rt->mu);
    pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE, NO_UNIT, PCS_DTYPE_FP32, 1,
                  (uint32_t)pcs_coll_size(c), NULL, 0);
    pthread_mutex_unlock(&rt->mu);
    return st;
}

/* hsdp_all_reduce last_micro_batch: all-reduce a partial sum that no last hand-in carried (a
 * program synced fewer times than micro_batches, or a unit sat out a micro-batch), on the idle
 * reduction stream, and add it to the sharded gradient. */
static pcs_status_t flush_partial(pcs_runtime_t *rt, rt_unit_t *u)
{
    pcs_coll_red_t ared = red_of(u->ar, 0, 1);
    pcs_status_t st = coll_ar(rt, u->ar_comm, rt->stage_rs, rt->rs_stream, u->ar_partial, u->c,
                              u->reduce, &ared);
    pthread_mutex_lock(&rt->mu);
    rt->ar_bytes += u->c * pcs_dtype_size(u->reduce);
    pcs_rt_record(&rt->recs, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE, u->index, u->reduce, u->c,
                  (uint32_t)pcs_coll_size(u->ar_comm), u->ar, 0);
    pthread_mutex_unlock(&rt->mu);
    if (st != PCS_OK)
        return wrap_err(st, "all-reduce (replicas) of unit %u's partial sum", u->index);
    u->ar_partial_valid = 0;
    u->ss_ok = 0;
    return pcs_kernel_accumulate(rt->be, u->grad_shard, u->grad, u->ar_partial, u->reduce, u->c,
                                 rt->rs_stream);
}

/* The compute stream waits for everything the all-gather and reduction streams hold: the
 * prefetch thread idle (nothing queued or running), the reductions drained. */
static pcs_status_t fence_side_streams(pcs_runtime_t *rt)
{
    PCS_CHECK(wait_reductions(rt));
    pthread_mutex_lock(&rt->mu);
    while (rt->q_len || ag_in_flight(rt))
        pthread_cond_wait(&rt->cv, &rt->mu);
    pthread_mutex_unlock(&rt->mu);
    PCS_CHECK(fence_compute_after(rt, rt->rs_stream));
    return fence_compute_after(rt, rt->ag_stream);
}

/* The optimizer on one unit's shard (grads g in mst): the whole shard in one tensor, or, when
 * frozen parameters overlap it, the trainable ranges as one tensor list (one launch on cuda);
 * with backend be's kernels on stream cs (cpu_offload: the host backend on host memory). */
static pcs_status_t update_unit(pcs_runtime_t *rt, const pcs_backend_ops_t *be, rt_unit_t *u,
                                void *g, pcs_stream_t cs)
{
    const pcs_dtype_t dt = u->mst;
    const size_t es = pcs_dtype_size(dt);
#define AT(base, k) ((base) ? (void *)((char *)(base) + (k) * es) : NULL)
    enum { MAXR = 32 };
    pcs_tensor_t p[MAXR], gt[MAXR], a[MAXR], b[MAXR];
    size_t done = 0, total = u->has_frozen ? u->n_upd : 1;
    uint64_t soff = 0; /* the compact state's offset of the range */
    while (done < total) {
        size_t n = 0;
        for (; n < MAXR && done + n < total; n++) {
            uint64_t off = u->has_frozen ? u->upd_off[done + n] : 0;
            uint64_t len = u->has_frozen ? u->upd_len[done + n] : u->c;
            p[n] = (pcs_tensor_t){AT(u->master_shard, off), dt, len};
            gt[n] = (pcs_tensor_t){AT(g, off), dt, len};
            a[n] = (pcs_tensor_t){AT(u->opt_a, soff), dt, len};
            b[n] = (pcs_tensor_t){AT(u->opt_b, soff), dt, len};
            soff += len;
        }
        if (rt->opt == PCS_OPT_ADAMW) {
            PCS_CHECK(pcs_kernel_adamw_update(be, p, gt, a, b, n, &rt->adamw,
                                              (int64_t)rt->opt_steps, cs));
        } else {
            int need_buf = rt->sgd.momentum != 0;
            PCS_CHECK(pcs_kernel_sgd_update(be, p, gt, need_buf ? a : NULL, n, &rt->sgd,
                                            rt->opt_steps == 1, cs));
        }
        done += n;
    }
#undef AT
    return PCS_OK;
}

pcs_status_t pcs_runtime_optimizer_step(pcs_runtime_t *rt, const pcs_rt_step_opts_t *o,
                                        pcs_rt_step_result_t *r)
{
    memset(r, 0, sizeof *r);
    if (atomic_load(&rt->aborted))
        return pcs_set_error(PCS_ERR_CANCELLED, "runtime aborted");
    /* Everything below runs on the compute stream: the sharded grads were accumulated on the
     * reduction stream, and an all-gather still running reads the master shard. */
    PCS_CHECK(fence_side_streams(rt));
    int flushed = 0;
    for (size_t i = 0; i < rt->n_units; i++)
        if (rt->units[i].ar_partial_valid) {
            PCS_CHECK(flush_partial(rt, &rt->units[i]));
            flushed = 1;
        }
    if (flushed)
        PCS_CHECK(fence_compute_after(rt, rt->rs_stream));
    const pcs_backend_ops_t *be = rt->be;
    pcs_stream_t cs = rt->cstream;
    uint64_t t0 = pcs_now_us();
    /* A frozen parameter has no gradient: whatever a C API program wrote there takes no part in
     * the inf check, the norm or the update. */
    for (size_t i = 0; i < rt->n_units; i++) {
        rt_unit_t *u = &rt->units[i];
        size_t esz = pcs_dtype_size(u->grad);
        for (size_t k = 0; u->grad_shard && u->held && k < u->n_frz; k++)
            PCS_CHECK(pcs_kernel_fill(be, (uint8_t *)u->grad_shard + u->frz_off[k] * esz, u->grad,
                                      u->frz_len[k], 0.0, cs));
    }
    /* mst view of every grad shard (keep_low_precision_grads keeps them in the param dtype:
     * FSDP1 hands those to the optimizer; we widen for the update in the master's storage). */
    size_t first_held = 0;
    while (first_held < rt->n_units &&
           !(rt->units[first_held].held && rt->units[first_held].grad_shard))
        first_held++;
    if (o->inject_inf && first_held < rt->n_units) {
        rt_unit_t *u = &rt->units[first_held];
        /* fill rounds +Inf once to the grad dtype: the same bits a cast of an fp32 +Inf gives */
        PCS_CHECK(pcs_kernel_fill(be, u->grad_shard, u->grad, 1, (double)INFINITY, cs));
        u->ss_ok = 0;
        PCS_INFO(PCS_SUB_WORKER, "test hook: injected +Inf into unit %zu's gradient", first_held);
    }
    if (o->scaler) {
        float found = 0.0f, inv = (float)(1.0 / o->loss_scale);
        float *d_found = &rt->d_scal[0], *d_inv = &rt->d_scal[1];
        PCS_CHECK(pcs_kernel_fill(be, d_found, PCS_DTYPE_FP32, 1, 0.0, cs));
        PCS_CHECK(pcs_kernel_fill(be, d_inv, PCS_DTYPE_FP32, 1, (double)inv, cs));
        for (size_t i = 0; i < rt->n_units; i++) {
            rt_unit_t *u = &rt->units[i];
            if (!u->held || !u->grad_shard)
                continue;
            pcs_tensor_t t = {u->grad_shard, u->grad, u->c};
            PCS_CHECK(pcs_kernel_nonfinite_check_and_unscale(be, &t, 1, d_found, d_inv, cs));
            if (inv != 1.0f)
                u->ss_ok = 0; /* unscaled: the fused sum was of the scaled gradient */
        }
        rt->opt_ms += ms_since(t0);
        /* One verdict for the world: every rank skips together (spec §5). */
        pcs_status_t st = world_all_reduce_f32(rt, rt->world_c, d_found, &found, PCS_RED_MAX);
        if (st != PCS_OK)
            return wrap_err(st, "found_inf all-reduce");
        t0 = pcs_now_us();
        r->found_inf = found > 0.0f;
    }
    if (r->found_inf) {
        r->skipped = 1;
        r->grad_norm = INFINITY;
        rt->opt_ms += ms_since(t0);
        return PCS_OK;
    }
    if (o->clip_norm > 0) {
        /* one sum of squares per unit in d_scal[3 + i], read back together; the host adds them
         * in fp64 in unit order. A unit whose last reduction computed it on the way (ss_ok, the
         * same bits) needs no pass here. */
        float *d_ss = &rt->d_scal[3];
        for (size_t i = 0; i < rt->n_units; i++) {
            rt_unit_t *u = &rt->units[i];
            if (!u->grad_shard) /* all frozen: no gradient, 0 */
                PCS_CHECK(pcs_kernel_fill(be, &d_ss[i], PCS_DTYPE_FP32, 1, 0.0, cs));
            else if (u->held && !u->ss_ok)
                PCS_CHECK(pcs_kernel_sum_squares(be, u->grad_shard, u->grad, u->c, &d_ss[i], cs));
            else if (u->held)
                rt->fused_norms++;
        }
        if (rt->n_units > 0) {
            PCS_CHECK(
                be->copy(&rt->h_scal[3], d_ss, rt->n_units * sizeof(float), PCS_COPY_D2H, cs));
            PCS_CHECK(be->sync(cs));
        }
        double local_sh = 0, local_rep = 0;
        for (size_t i = 0; i < rt->n_units; i++) {
            float ss = rt->h_scal[3 + i];
            if (!rt->units[i].held)
                continue;
            if (rt->units[i].sg > 1)
                local_sh += ss;
            else
                local_rep += ss;
        }
        float tot = (float)local_sh;
        rt->opt_ms += ms_since(t0);
        if (rt->shard_rs) {
            /* fill rounds the double once to fp32: exactly tot */
            PCS_CHECK(pcs_kernel_fill(be, &rt->d_scal[2], PCS_DTYPE_FP32, 1, (double)tot, cs));
            pcs_status_t st =
                world_all_reduce_f32(rt, rt->shard_rs, &rt->d_scal[2], &tot, PCS_RED_SUM);
            if (st != PCS_OK)
                return wrap_err(st, "grad-norm all-reduce");
        }
        float stage_tot = tot + (float)local_rep;
        if (rt->pp_c) {
            /* pipeline: every stage's part of the norm (torch clip_grad_norm_ over the stages'
             * parameters) — one more fp32 sum over the pp group */
            PCS_CHECK(
                pcs_kernel_fill(be, &rt->d_scal[2], PCS_DTYPE_FP32, 1, (double)stage_tot, cs));
            pcs_status_t st =
                world_all_reduce_f32(rt, rt->pp_c, &rt->d_scal[2], &stage_tot, PCS_RED_SUM);
            if (st != PCS_OK)
                return wrap_err(st, "grad-norm all-reduce over the pipeline stages");
        }
        t0 = pcs_now_us();
        float total_norm = sqrtf(stage_tot);
        r->grad_norm = total_norm;
        float coef = (float)o->clip_norm / (total_norm + 1e-6f);
        if (coef < 1.0f) {
            for (size_t i = 0; i < rt->n_units; i++) {
                rt_unit_t *u = &rt->units[i];
                if (!u->held || !u->grad_shard)
                    continue;
                PCS_CHECK(pcs_kernel_scale(be, u->grad_shard, u->grad, u->c, coef, cs));
            }
        }
    }
    rt->opt_steps++;
    pcs_status_t st = PCS_OK;
    void *tmp = rt->d_tmp; /* max shard scratch of the widest mst */
    if (rt->offload) {
        /* the host update must not race the last all-gathers' copies of the masters */
        PCS_CHECK_GOTO(be->sync(rt->ag_stream), st, out);
    }
    for (size_t i = 0; i < rt->n_units; i++) {
        rt_unit_t *u = &rt->units[i];
        if (!u->held || !u->grad_shard) /* (all frozen: nothing to update) */
            continue;
        void *g = u->grad_shard;
        if (u->grad != u->mst) {
            PCS_CHECK_GOTO(pcs_kernel_cast(be, tmp, u->mst, u->grad_shard, u->grad, u->c, cs), st,
                           out);
            g = tmp;
        }
        if (rt->offload) {
            /* FSDP1 CPUOffload: the reduced gradient comes back to the host and the optimizer
             * steps there, on the host masters and state */
            if (u->c == 0)
                continue;
            PCS_CHECK_GOTO(
                be->copy(rt->h_grad, g, u->c * pcs_dtype_size(u->mst), PCS_COPY_D2H, cs), st, out);
            PCS_CHECK_GOTO(be->sync(cs), st, out);
            PCS_CHECK_GOTO(update_unit(rt, rt->host_be, u, rt->h_grad, NULL), st, out);
            if (u->master != u->mst) { /* as below, on the host (h_grad is free) */
                PCS_CHECK_GOTO(pcs_kernel_cast(rt->host_be, rt->h_grad, u->master,
                                               u->master_shard, PCS_DTYPE_FP32, u->c, NULL),
                               st, out);
                PCS_CHECK_GOTO(pcs_kernel_cast(rt->host_be, u->master_shard, PCS_DTYPE_FP32,
                                               rt->h_grad, u->master, u->c, NULL),
                               st, out);
            }
            continue;
        }
        PCS_CHECK_GOTO(update_unit(rt, be, u, g, cs), st, out);
        if (u->master != u->mst) {
            /* Low-precision masters (pure fp16): the fp32 update is rounded back to the master
             * dtype, as a parameter stored in fp16 would be. */
            PCS_CHECK_GOTO(
                pcs_kernel_cast(be, tmp, u->master, u->master_shard, PCS_DTYPE_FP32, u->c, cs), st,
                out);
            PCS_CHECK_GOTO(
                pcs_kernel_cast(be, u->master_shard, PCS_DTYPE_FP32, tmp, u->master, u->c, cs), st,
                out);
        }
    }
    /* the next all-gathers read the updated master shards */
    PCS_CHECK_GOTO(be->event_record(rt->ev_opt, cs), st, out);
out:
    rt->opt_ms += ms_since(t0);
    return st;
}

// ---- barrier, scalars, stats and shards ----

pcs_status_t pcs_runtime_barrier(pcs_runtime_t *rt)
{
    if (!rt->world_c)
        return PCS_OK;
    /* world_c can be a unit's all-reduce communicator, which the reduction thread drives: one
     * communicator is never used by two threads at once (neither NCCL nor Gloo is thread-safe
     * per communicator, and each rank must issue its operations in the same order) */
    PCS_CHECK(wait_reductions(rt));
    return pcs_coll_barrier(rt->world_c);
}

pcs_status_t pcs_runtime_mean_over_dp(pcs_runtime_t *rt, double *v)
{
    pcs_coll_t *c = rt->dp_c ? rt->dp_c : (rt->dp_size == rt->world ? rt->world_c : NULL);
    if (!c)
        return PCS_OK;
    /* dp_c / world_c is also a replicated unit's all-reduce communicator on the reduction
     * thread: as in pcs_runtime_barrier, the queued reductions are issued first */
    PCS_CHECK(wait_reductions(rt));
    /* through the backend scalar (device memory for NCCL), on the compute stream */
    float f = (float)*v;
    PCS_CHECK(pcs_kernel_fill(rt->be, &rt->d_scal[2], PCS_DTYPE_FP32, 1, (double)f, rt->cstream));
    PCS_CHECK(scalar_reduce(rt, c, &rt->d_scal[2], PCS_RED_SUM, &f));
    *v = (double)f / (double)pcs_coll_size(c);
    return PCS_OK;
}

pcs_status_t pcs_runtime_sum_over_pp(pcs_runtime_t *rt, double *v)
{
    if (!rt->pp_c)
        return PCS_OK;
    float f = (float)*v;
    PCS_CHECK(pcs_kernel_fill(rt->be, &rt->d_scal[2], PCS_DTYPE_FP32, 1, (double)f, rt->cstream));
    PCS_CHECK(scalar_reduce(rt, rt->pp_c, &rt->d_scal[2], PCS_RED_SUM, &f));
    *v = (double)f;
    return PCS_OK;
}

void pcs_runtime_stats(const pcs_runtime_t *rt, pcs_rt_stats_t *s)
{
    pcs_runtime_t *m = (pcs_runtime_t *)rt;
    /* collective times come from events (waits for the timed collectives to finish) */
    pcs_rt_timing_resolve(&m->tp_ag, m->ev_ms);
    pcs_rt_timing_resolve(&m->tp_rs, m->ev_ms);
    pthread_mutex_lock(&m->mu);
    s->all_gather_ms = rt->ev_ms[PCS_RT_T_AG];
    s->reduce_scatter_ms = rt->ev_ms[PCS_RT_T_RS];
    s->all_reduce_ms = rt->ar_ms + rt->ev_ms[PCS_RT_T_AR];
    s->cast_ms = rt->cast_ms + rt->rs_cast_ms;
    s->optimizer_ms = rt->opt_ms;
    s->unshard_wait_ms = rt->wait_ms;
    s->compute_thread_comm_ms = rt->wait_ms + rt->inline_reduce_ms + rt->rs_wait_ms;
    s->reduce_drain_ms = rt->drain_ms;
    s->all_gather_bytes = rt->ag_bytes;
    s->reduce_scatter_bytes = rt->rs_bytes;
    s->all_reduce_bytes = rt->ar_bytes;
    s->n_colls = rt->recs.n;
    s->colls = rt->recs.v;
    s->fingerprint = pcs_rt_records_fingerprint(&rt->recs);
    s->audit_ok = rt->recs.audit_ok;
    s->max_unsharded = rt->max_unsharded;
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_lock(&m->pool_mu);
    s->mem_step_peak_bytes = rt->mem_step_peak;
    s->mem_peak_bytes = rt->mem_peak;
    s->mem_reserved_bytes = rt->mem_reserved;
    pthread_mutex_unlock(&m->pool_mu);
}

pcs_status_t pcs_runtime_shard(pcs_runtime_t *rt, uint32_t unit, pcs_rt_shard_t *out)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    memset(out, 0, sizeof *out);
    out->unit = unit;
    out->master_dtype = u->master;
    out->storage_dtype = u->mst;
    out->host_dtype = u->hst;
    out->numel = u->c;
    out->master = u->master_shard;
    out->state_numel = u->n_state;
    if (rt->opt == PCS_OPT_ADAMW) {
        out->states = PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_EXP_AVG_SQ;
        out->exp_avg = u->opt_a;
        out->exp_avg_sq = u->opt_b;
    } else if (rt->sgd.momentum != 0) {
        out->states = PCS_RT_STATE_MOMENTUM;
        out->momentum = u->opt_a;
    }
    out->shard_index = u->shard_index;
    out->shard_group_size = u->sg;
    /* Replica 0 is the canonical copy: for replicated units every dp rank but the first is a
     * replica. */
    out->replicate_index = u->sg > 1 ? rt->rep_index : rt->dp_index;
    return PCS_OK;
}

/* One optimizer state between the compact runtime layout (n_state elements, the ranges outside
 * frozen parameters back to back) and a c-element host array: to_host expands (0 at frozen
 * ranges), from host compacts. `st` is backend memory (host memory with cpu_offload), possibly
 * NULL when n_state is 0. Copies are queued on the compute stream (offload: done at once). */
static pcs_status_t state_xfer(pcs_runtime_t *rt, const rt_unit_t *u, void *st, void *host,
                               int to_host)
{
    const size_t es = pcs_dtype_size(u->hst); /* (== mst's wherever a state exists) */
    if (!st) { /* no state (every element frozen): zeros out, nothing in */
        if (to_host && u->c > 0)
            memset(host, 0, u->c * es);
        return PCS_OK;
    }
    if (!u->has_frozen) { /* compact == the shard */
        size_t bytes = u->c * es;
        if (bytes == 0)
            return PCS_OK;
        if (rt->offload) {
            memcpy(to_host ? host : st, to_host ? st : host, bytes);
            return PCS_OK;
        }
        return rt->be->copy(to_host ? host : st, to_host ? st : host, bytes,
                            to_host ? PCS_COPY_D2H : PCS_COPY_H2D, rt->cstream);
    }
    if (to_host && u->c > 0)
        memset(host, 0, u->c * es);
    uint64_t soff = 0;
    for (size_t k = 0; k < u->n_upd; k++) {
        size_t bytes = u->upd_len[k] * es;
        char *h = (char *)host + u->upd_off[k] * es, *d = (char *)st + soff * es;
        soff += u->upd_len[k];
        if (bytes == 0)
            continue;
        if (rt->offload)
            memcpy(to_host ? h : d, to_host ? d : h, bytes);
        else
            PCS_CHECK(rt->be->copy(to_host ? h : d, to_host ? d : h, bytes,
                                   to_host ? PCS_COPY_D2H : PCS_COPY_H2D, rt->cstream));
    }
    return PCS_OK;
}

pcs_status_t pcs_runtime_shard_to_host(pcs_runtime_t *rt, uint32_t unit, void *master,
                                       void *state_a, void *state_b)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    size_t bytes = u->c * pcs_dtype_size(u->mst);
    /* the optimizer state the optimizer has (pcs_runtime_shard's states) */
    int has_a = rt->opt == PCS_OPT_ADAMW || rt->sgd.momentum != 0;
    int has_b = rt->opt == PCS_OPT_ADAMW;
    /* a narrow (frozen bf16/fp16) shard goes out widened to fp32, through a host copy */
    void *narrow = NULL, *raw = master;
    if (u->mst != u->hst && master && bytes) {
        PCS_CHECK(pcs_calloc(1, bytes, &narrow));
        raw = narrow;
    }
    pcs_status_t st = PCS_OK;
    if (rt->offload) { /* host memory, updated synchronously by the host optimizer */
        if (master && bytes)
            memcpy(raw, u->master_shard, bytes);
    } else if (master && bytes) {
        /* ordered after the update on the compute stream; one sync for every copy */
        st = rt->be->copy(raw, u->master_shard, bytes, PCS_COPY_D2H, rt->cstream);
    }
    if (st == PCS_OK && state_a && has_a)
        st = state_xfer(rt, u, u->opt_a, state_a, 1);
    if (st == PCS_OK && state_b && has_b)
        st = state_xfer(rt, u, u->opt_b, state_b, 1);
    if (st == PCS_OK && !rt->offload)
        st = rt->be->sync(rt->cstream);
    if (st == PCS_OK && narrow)
        st = pcs_cpu_cast_array(master, u->hst, narrow, u->mst, u->c);
    else if (narrow && !rt->offload)
        (void)rt->be->sync(rt->cstream); /* (a queued copy into it must land before the free) */
    free(narrow);
    return st;
}

pcs_status_t pcs_runtime_shard_from_host(pcs_runtime_t *rt, uint32_t unit, const void *master,
                                         const void *state_a, const void *state_b)
{
    PCS_CHECK(check_unit(rt, unit));
    rt_unit_t *u = &rt->units[unit];
    size_t bytes = u->c * pcs_dtype_size(u->mst);
    int has_a = rt->opt == PCS_OPT_ADAMW || rt->sgd.momentum != 0;
    int has_b = rt->opt == PCS_OPT_ADAMW;
    void *narrow = NULL; /* a frozen bf16/fp16 shard: the fp32 values rounded to it first */
    if (u->mst != u->hst && master && bytes) {
        PCS_CHECK(pcs_calloc(1, bytes, &narrow));
        pcs_status_t cst = pcs_cpu_cast_array(narrow, u->mst, master, u->hst, u->c);
        if (cst != PCS_OK) {
            free(narrow);
            return cst;
        }
        master = narrow;
    }
    pcs_status_t st = PCS_OK;
    if (rt->offload) {
        if (bytes == 0)
            return PCS_OK;
        /* an all-gather still queued may be copying the old master in */
        st = rt->be->sync(rt->ag_stream);
        if (st == PCS_OK && master)
            memcpy(u->master_shard, master, bytes);
    } else if (master && bytes) {
        st = rt->be->copy(u->master_shard, master, bytes, PCS_COPY_H2D, rt->cstream);
        if (st == PCS_OK && narrow)
            st = rt->be->sync(rt->cstream); /* (the copy read it) */
    }
    free(narrow);
    PCS_CHECK(st);
    if (state_a && has_a)
        PCS_CHECK(state_xfer(rt, u, u->opt_a, (void *)(uintptr_t)state_a, 0));
    if (state_b && has_b)
        PCS_CHECK(state_xfer(rt, u, u->opt_b, (void *)(uintptr_t)state_b, 0));
    return rt->offload ? PCS_OK : rt->be->sync(rt->cstream);
}

uint64_t pcs_runtime_fused_norms(const pcs_runtime_t *rt)
{
    return rt->fused_norms;
}

uint64_t pcs_runtime_opt_steps(const pcs_runtime_t *rt)
{
    return rt->opt_steps;
}

void pcs_runtime_set_opt_steps(pcs_runtime_t *rt, uint64_t n)
{
    rt->opt_steps = n;
}
