/* The planner's rules that workers and tests call directly: precision resolution, divide factors
 * and reduce ops, shard ranges, the plan hash, per-rank estimates (mesh coordinates and groups:
 * planner/mesh.c). Everything here reads only the Plan, so it works the same on a plan received
 * over the wire. */
#include "planner/plan.h"
#include "planner/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "pcs/hash.h"
#include "pcs/mem.h"

// ----------------------------------------------------------------------------------------------
// precision

static bool is_float(pcs_dtype_t t)
{
    return t > PCS_DTYPE_NONE && t < PCS_DTYPE_COUNT && pcs_dtype_is_float(t);
}

void pcs_plan_resolve_precision(const pcs_precision_in_t *in, pcs_precision_t *out)
{
    memset(out, 0, sizeof *out);
    pcs_dtype_t master = is_float(in->master) ? in->master : PCS_DTYPE_FP32;
    bool mp = in->mixed_precision;
    pcs_dtype_t p = mp && is_float(in->param) ? in->param : PCS_DTYPE_NONE;
    pcs_dtype_t r = mp && is_float(in->reduce) ? in->reduce : PCS_DTYPE_NONE;
    /* FSDP2 clamp, both steps on the policy values: reduce == param -> reduce unset; then
     * param == master -> no cast. */
    pcs_dtype_t r_c = (r == p) ? PCS_DTYPE_NONE : r;
    pcs_dtype_t p_c = (p == master) ? PCS_DTYPE_NONE : p;
    out->master = master;
    out->compute = p_c ? p_c : master;
    /* pcs rule: reduce unset -> param_dtype when set (FSDP1, FSDP2 <= 2.14), else master. */
    out->reduce = r_c ? r_c : out->compute;
    /* FSDP2: accumulate without sync in the (clamped) reduce dtype if set, else grad dtype. */
    out->accum = out->reduce;
    out->keep_low_precision_grads = mp && in->keep_low_precision_grads;
    /* FSDP1 prepare_gradient_for_optim: keep_low_precision_grads casts to param_dtype. */
    out->grad = out->keep_low_precision_grads ? out->compute : master;
    out->buffer = mp && is_float(in->buffer) ? in->buffer : PCS_DTYPE_NONE;
    out->output = mp && is_float(in->output) ? in->output : PCS_DTYPE_NONE;
    /* FSDP2 _pre_forward casts iff cast_forward_inputs and the (unclamped) param_dtype is set. */
    out->cast_forward_inputs = mp && in->cast_forward_inputs && p != PCS_DTYPE_NONE;
    out->mixed_precision = mp;
}

// ----------------------------------------------------------------------------------------------
// divide factors

void pcs_plan_divide_factors(double ws, double *pre, double *post)
{
    double f = 1;
    if (ws >= 1) {
        while (ws / f == (double)(uint64_t)(ws / f) && ws / f > f)
            f *= 2;
    }
    *pre = f;
    *post = ws >= 1 ? ws / f : 1;
}

void pcs_plan_reduce_ops(pcs_dtype_t reduce, uint32_t rs_size, uint32_t ar_size, double factor,
                         bool force_sum, Pcs__V1__ReduceOp *rs_op, Pcs__V1__ReduceOp *ar_op,
                         double *premul, double *pre, double *post)
{
    bool overflow_risk = !(reduce == PCS_DTYPE_FP32 || reduce == PCS_DTYPE_BF16);
    double dp = (double)(rs_size ? rs_size : 1) * (double)(ar_size ? ar_size : 1);
    *premul = 0;
    *pre = 1;
    *post = 1;
    *rs_op = PCS__V1__REDUCE_OP__REDUCE_OP_SUM;
    *ar_op = PCS__V1__REDUCE_OP__REDUCE_OP_SUM;
    if (!overflow_risk && !force_sum) {
        if (factor <= 0) {
            if (dp > 1) {
                *rs_op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
                *ar_op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
            }
            return;
        }
        if (rs_size > 1 && factor == (double)rs_size) {
            *rs_op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
        } else {
            *rs_op = PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM;
            *premul = 1.0 / factor;
        }
        return;
    }
    if (factor <= 0)
        factor = dp;
    if (overflow_risk)
        pcs_plan_divide_factors(factor, pre, post);
    else
        *post = factor; /* post-multiplying touches less data */
}

// ----------------------------------------------------------------------------------------------
// shard ranges and hash

void pcs_plan_shard_range(const Pcs__V1__Unit *u, uint32_t shard_rank, uint64_t *begin,
                          uint64_t *end)
{
    uint64_t c = u->shard_numel, n = u->flat_numel;
    uint64_t b = c ? (uint64_t)shard_rank * c : 0;
    uint64_t e = c ? b + c : 0;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

void pcs_plan_free(Pcs__V1__Plan *p)
{
    if (p)
        protobuf_c_message_free_unpacked(&p->base, NULL);
}

typedef struct fnv_buffer {
    ProtobufCBuffer base;
    uint64_t h;
} fnv_buffer_t;

static void fnv_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    fnv_buffer_t *f = (fnv_buffer_t *)b;
    f->h = pcs_fnv1a64(f->h, data, len);
}

uint64_t pcs_plan_hash(const Pcs__V1__Plan *p)
{
    /* Shallow copy with hash = 0: packing reads only, so the caller's plan stays untouched and
     * concurrent readers are safe. Packing streams into the hash: no buffer allocation. */
    Pcs__V1__Plan copy = *p;
    copy.hash = 0;
    fnv_buffer_t f = {{fnv_append}, PCS_FNV1A64_OFFSET};
    protobuf_c_message_pack_to_buffer(&copy.base, &f.base);
    return f.h;
}

// ----------------------------------------------------------------------------------------------
// per-rank estimates (formulas in docs/PLAN.md)

static uint64_t dsz(Pcs__V1__DType t)
{
    return pcs_dtype_size((pcs_dtype_t)t);
}

static bool unit_trainable(const Pcs__V1__Unit *u)
{
    for (size_t i = 0; i < u->n_params; i++)
        if (!u->params[i]->frozen)
            return true;
    return false;
}

/* per_param only means something with a shard group (the planner never writes it otherwise;
 * pcs_plan_check_layout refuses it). */
static bool per_param(const Pcs__V1__Unit *u)
{
    return u->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM && u->shard_group_size > 1;
}

/* The parameter viewed as [outer, rows, inner] around its shard dim (a 0-d parameter is one
 * row). */
static void param_dims(const Pcs__V1__ParamSlot *ps, uint64_t *outer, uint64_t *rows,
                       uint64_t *inner)
{
    uint32_t d = ps->shard_dim < ps->n_shape ? ps->shard_dim : 0;
    *outer = 1;
    *inner = 1;
    *rows = ps->n_shape ? ps->shape[d] : 1;
    for (size_t k = 0; k < ps->n_shape; k++) {
        if (k < d)
            *outer *= ps->shape[k];
        else if (k > d)
            *inner *= ps->shape[k];
    }
}

static uint64_t unit_c(const Pcs__V1__Unit *u)
{
    return u->shard_numel ? u->shard_numel : u->padded_numel;
}

/* per_param: shard r's rows [r0, r1) of parameter ps (clipped to its rows). */
static void chunk_rows(const Pcs__V1__ParamSlot *ps, uint64_t rows, uint32_t r, uint64_t *r0,
                       uint64_t *r1)
{
    *r0 = (uint64_t)r * ps->shard_rows;
    *r1 = *r0 + ps->shard_rows < rows ? *r0 + ps->shard_rows : rows;
    if (*r0 > *r1)
        *r0 = *r1;
}

size_t pcs_plan_shard_pieces(const Pcs__V1__Unit *u, uint32_t shard_rank, pcs_plan_piece_t *out)
{
    size_t n = 0;
    uint64_t c = unit_c(u);
    for (size_t i = 0; i < u->n_params; i++) {
        const Pcs__V1__ParamSlot *ps = u->params[i];
        if (per_param(u)) {
            uint64_t outer, rows, inner, r0, r1;
            param_dims(ps, &outer, &rows, &inner);
            chunk_rows(ps, rows, shard_rank, &r0, &r1);
            if (r0 < r1 && outer && inner)
                out[n++] = (pcs_plan_piece_t){(uint32_t)i, r0 * inner, (r1 - r0) * inner,
                                              ps->shard_offset, outer, rows * inner};
            continue;
        }
        uint64_t b = (uint64_t)shard_rank * c, e = b + c;
        uint64_t pb = ps->offset, pe = ps->offset + ps->numel;
        uint64_t a = pb > b ? pb : b, z = pe < e ? pe : e;
        if (a < z)
            out[n++] = (pcs_plan_piece_t){(uint32_t)i, a - pb, z - a, a - b, 1, z - a};
    }
    return n;
}

void pcs_plan_locate(const Pcs__V1__Unit *u, uint32_t param, uint64_t elem, uint32_t *shard,
                     uint64_t *shard_off, uint64_t *run)
{
    const Pcs__V1__ParamSlot *ps = u->params[param];
    if (per_param(u)) {
        uint64_t outer, rows, inner;
        param_dims(ps, &outer, &rows, &inner);
        uint64_t slab = rows * inner; /* > 0: the parameter has elem */
        if (!slab || !ps->shard_rows) { /* not a checked plan (pcs_plan_check_layout) */
            *shard = UINT32_MAX;
            *shard_off = 0;
            *run = 1;
            return;
        }
        uint64_t o = elem / slab, rem = elem % slab, row = rem / inner, i = rem % inner;
        uint64_t s = row / ps->shard_rows, r0 = s * ps->shard_rows;
        uint64_t r1 = r0 + ps->shard_rows < rows ? r0 + ps->shard_rows : rows;
        *shard = (uint32_t)s;
        *shard_off = ps->shard_offset + o * ps->shard_rows * inner + (row - r0) * inner + i;
        *run = (r1 - row) * inner - i;
        return;
    }
    uint64_t c = unit_c(u), idx = ps->offset + elem;
    if (!c) {
        *shard = UINT32_MAX;
        *shard_off = 0;
        *run = 1;
        return;
    }
    *shard = (uint32_t)(idx / c);
    *shard_off = idx % c;
    uint64_t left = c - *shard_off, rest = ps->numel - elem;
    *run = left < rest ? left : rest;
}

uint64_t pcs_plan_unfrozen_numel(const Pcs__V1__Unit *u, uint32_t shard_rank)
{
    uint64_t c = u->shard_numel, frozen = 0;
    for (size_t i = 0; i < u->n_params; i++) {
        const Pcs__V1__ParamSlot *ps = u->params[i];
        if (!ps->frozen)
            continue;
        if (per_param(u)) {
            uint64_t outer, rows, inner, r0, r1;
            param_dims(ps, &outer, &rows, &inner);
            chunk_rows(ps, rows, shard_rank, &r0, &r1);
            frozen += outer * (r1 - r0) * inner;
            continue;
        }
        uint64_t b = (uint64_t)shard_rank * c, e = b + c;
        uint64_t lo = ps->offset > b ? ps->offset : b;
        uint64_t hi = ps->offset + ps->numel < e ? ps->offset + ps->numel : e;
        frozen += hi > lo ? hi - lo : 0;
    }
    return c - (frozen < c ? frozen : c);
}

pcs_status_t pcs_plan_schedule(const Pcs__V1__Plan *p, pcs_schedule_t **out)
{
    *out = NULL;
    if (p->pp_size <= 1)
        return PCS_OK;
    uint32_t v = p->virtual_stages ? p->virtual_stages : 1;
    int per_mb = 0;
    for (size_t k = 0; k < p->n_units; k++)
        per_mb |= !p->units[k]->is_root && p->units[k]->reshard_after_forward;
    pcs_sched_kind_t kind;
    PCS_CHECK(pcs_sched_parse(p->pipeline_schedule, v, &kind));
    return pcs_schedule_build(kind, p->pp_size, v, p->micro_batches ? p->micro_batches : 1,
                              per_mb, out);
}

static bool runnable_dtype(Pcs__V1__DType t)
{
    return t == PCS__V1__DTYPE__DTYPE_UNSPECIFIED || t == PCS__V1__DTYPE__DTYPE_FP32 ||
           t == PCS__V1__DTYPE__DTYPE_BF16 || t == PCS__V1__DTYPE__DTYPE_FP16 ||
           t == PCS__V1__DTYPE__DTYPE_FP64;
}

static pcs_status_t bad_layout(const Pcs__V1__Unit *u, size_t i, const char *why)
{
    return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: unit %zu (%s): %s", i,
                         u->path && *u->path ? u->path : "root", why);
}

pcs_status_t pcs_plan_check_layout(const Pcs__V1__Plan *p)
{
    if (!p)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: required");
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        uint64_t sg = u->shard_group_size ? u->shard_group_size : 1, c = unit_c(u), all;
        bool pp = u->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
        if (u->layout != PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_FLAT && !pp)
            return bad_layout(u, i, "unknown shard layout");
        if (pp && sg < 2)
            return bad_layout(u, i, "per_param layout without a shard group");
        if (__builtin_mul_overflow(c, sg, &all) || (pp ? all > u->padded_numel
                                                        : all != u->padded_numel))
            return bad_layout(u, i, "shard size x shard group does not fit the padded size");
        if (u->flat_numel > u->padded_numel)
            return bad_layout(u, i, "flat size beyond the padded size");
        uint64_t next = 0; /* per_param: end of the previous chunk in the shard */
        for (size_t k = 0; k < u->n_params; k++) {
            const Pcs__V1__ParamSlot *ps = u->params[k];
            uint64_t n = 1, end;
            for (size_t d = 0; d < ps->n_shape; d++)
                if (__builtin_mul_overflow(n, ps->shape[d], &n))
                    return bad_layout(u, i, "a parameter shape overflows");
            if (n != ps->numel || __builtin_add_overflow(ps->offset, ps->numel, &end) ||
                end > u->padded_numel)
                return bad_layout(u, i, "a parameter's shape, size or offset is inconsistent");
            if (!pp)
                continue;
            if (ps->n_shape ? ps->shard_dim >= ps->n_shape : ps->shard_dim != 0)
                return bad_layout(u, i, "a parameter's shard_dim is not one of its dims");
            uint64_t outer, rows, inner, chunk, cover;
            param_dims(ps, &outer, &rows, &inner);
            if (ps->numel == 0)
                continue;
            if (!ps->shard_rows || __builtin_mul_overflow(ps->shard_rows, sg, &cover) ||
                cover < rows || (ps->shard_dim > 0 && cover != rows) ||
                ps->shard_rows > rows)
                return bad_layout(u, i, "a parameter's shard_rows does not chunk its rows");
            if (__builtin_mul_overflow(ps->shard_rows, inner, &chunk) ||
                __builtin_mul_overflow(chunk, outer, &chunk) || ps->shard_offset < next ||
                ps->shard_offset > c || chunk > c - ps->shard_offset)
                return bad_layout(u, i, "a parameter's chunk lies outside the shard or overlaps "
                                        "another");
            next = ps->shard_offset + chunk;
        }
    }
    return PCS_OK;
}

static Pcs__V1__DType dt_or(Pcs__V1__DType v, Pcs__V1__DType def)
{
    return v != PCS__V1__DTYPE__DTYPE_UNSPECIFIED ? v : def;
}

pcs_status_t pcs_plan_check_runnable(const Pcs__V1__Plan *p)
{
    if (!p)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: required");
    PCS_CHECK(pcs_plan_check_layout(p));
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        const struct {
            const char *what;
            Pcs__V1__DType t;
        } d[] = {{"master", u->master_dtype},
                 {"param", u->param_dtype},
                 {"reduce", u->reduce_dtype},
                 {"grad", u->grad_dtype},
                 {"accumulation", u->accum_dtype}};
        const char *path = u->path && *u->path ? u->path : "root";
        for (size_t k = 0; k < sizeof d / sizeof d[0]; k++) {
            if (!runnable_dtype(d[k].t))
                return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                     "precision: unit %zu (%s) has %s dtype %s; this release "
                                     "computes, reduces and keeps masters in fp32, bf16, fp16 "
                                     "and fp64 only",
                                     i, path, d[k].what, pcs_dtype_name((pcs_dtype_t)d[k].t));
            /* fp64 storage exists for fp64 masters only (the runtime's scratch, staging and
             * optimizer state are sized by the masters) */
            if (k > 0 && d[k].t == PCS__V1__DTYPE__DTYPE_FP64 &&
                u->master_dtype != PCS__V1__DTYPE__DTYPE_FP64)
                return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                     "precision: unit %zu (%s) has %s dtype fp64 with master "
                                     "dtype %s; fp64 computing, reducing and gradients need fp64 "
                                     "masters (full_precision_param_dtype float64)",
                                     i, path, d[k].what,
                                     pcs_dtype_name((pcs_dtype_t)dt_or(
                                         u->master_dtype, PCS__V1__DTYPE__DTYPE_FP32)));
        }
    }
    return PCS_OK;
}


/* The memory part follows what the unit runtime holds (worker/runtime.c), so that the estimate is
 * a promise the runtime's own account (pcs_rt_stats_t.mem_*) is checked against: masters and
 * optimizer state in fp32 storage, the full-size buffers from its pool only while a unit is live,
 * one reduction in flight. docs/PLAN.md "Estimates" states the formulas. */
pcs_status_t pcs_plan_rank_estimate(const Pcs__V1__Plan *p, uint32_t rank,
                                    Pcs__V1__RankEstimate *out)
{
    pcs__v1__rank_estimate__init(out);
    Pcs__V1__MeshCoords c;
    PCS_CHECK(pcs_plan_rank_coords(p, rank, &c));
    out->rank = rank;
    uint32_t pp = p->pp_size ? p->pp_size : 1;
    uint64_t mb = p->micro_batches ? p->micro_batches : 1;
    /* micro-batches whose gradients accumulate unsharded (no-sync): none when every micro-batch
     * reduces (training.gradient_sync every_micro_batch), whose hand-ins then look like mb 1's */
    uint64_t mb_acc = p->sync_every_micro_batch ? 1 : mb;
    /* units gathered ahead in forward and in backward (0: prefetch off in that direction) */
    uint64_t fdepth = p->forward_prefetch_depth, bdepth = p->backward_prefetch_depth;
    const uint64_t f32 = 4;

    /* this rank's units in forward order: unsharded (full) and kept-after-forward bytes, the
     * unsharded gradient (param dtype), the reduction input when it is a separate block (cast,
     * or copied out of the no-sync accumulator), the reduction input of the unit and whether
     * its gradient stays gathered across no-sync micro-batches */
    size_t nu = 0;
    uint64_t *full = NULL;
    size_t n = p->n_units;
    PCS_CHECK(pcs_calloc(n * 15 + 6, sizeof *full, (void **)&full));
    uint64_t *kept = full + n, *gradb = kept + n, *copyb = gradb + n, *rsb = copyb + n,
             *held = rsb + n, *anc_f = held + n, *anc_b = anc_f + n, *evalb = anc_b + n,
             *pk = evalb + n, *pf = pk + n + 1, *ps = pf + n + 1, *stg = ps + n + 1,
             *isroot = stg + n, *uix = isroot + n;
    /* pipeline: stages unshard around every compute action (pcs_plan_schedule's rule) — F and B,
     * or F, I and W with the zero-bubble schedule — or once per step */
    bool per_mb = false;
    for (size_t i = 0; pp > 1 && i < p->n_units; i++)
        per_mb |= !p->units[i]->is_root && p->units[i]->reshard_after_forward;
    uint64_t pp_gathers =
        !per_mb ? 1
                : mb * (p->pipeline_schedule &&
                                !strcmp(p->pipeline_schedule, "interleaved_zero_bubble")
                            ? 3
                            : 2);
    uint64_t root_eval = 0; /* the root unit's eval copy (with its dtype parts') */
    bool keep = false; /* units stay gathered across no-sync micro-batches */
    uint64_t acc = 0, max_c = 1, max_g = 0, ev_bwd_peak = 0, ev_rs_max = 0;
    uint64_t wide = f32; /* the widest master storage: 8 bytes where a master is fp64 */
    for (size_t i = 0; i < n; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        if (u->stage % pp != c.pp)
            continue;
        stg[nu] = u->stage;
        bool train = unit_trainable(u);
        uint64_t sh = u->shard_numel;
        uint32_t sg = u->shard_group_size ? u->shard_group_size : 1;
        Pcs__V1__DType master = dt_or(u->master_dtype, PCS__V1__DTYPE__DTYPE_FP32);
        Pcs__V1__DType param = dt_or(u->param_dtype, master);
        Pcs__V1__DType reduce = dt_or(u->reduce_dtype, param);
        Pcs__V1__DType grad = dt_or(u->grad_dtype, master);
        Pcs__V1__DType accum = dt_or(u->accum_dtype, reduce);
        /* masters are stored in fp32 (holding master-dtype values), fp64 ones in fp64, as is
         * the optimizer state; a unit with no trainable parameter keeps its own dtype (the
         * runtime's mst: a frozen bf16 base takes 2 bytes per element) */
        Pcs__V1__DType mst = master == PCS__V1__DTYPE__DTYPE_FP64 ? master
                             : train                              ? PCS__V1__DTYPE__DTYPE_FP32
                                                                  : master;
        uint64_t msz = dsz(mst);
        wide = msz > wide ? msz : wide;
        out->param_shard_bytes += sh * msz;
        if (train) {
            /* the flat sharded grad covers the whole shard (FSDP1 flat layout); optimizer state
             * leaves out the frozen parameters' elements of this rank's shard (they have no grad,
             * so the optimizer never makes state for them) */
            out->grad_shard_bytes += sh * dsz(grad);
            out->optimizer_bytes += (uint64_t)p->optimizer_states *
                                    pcs_plan_unfrozen_numel(u, sg > 1 ? c.dp_shard % sg : 0) * msz;
        }
        /* staging: the all-gather input (the cast master shard) unless it is in the master's
         * storage dtype already, the reduce-scatter output with a shard group */
        if (param != mst)
            out->staging_bytes += sh * dsz(param);
        /* the reduce-scatter output: fp32 wide when an eval-mode backward reduces in it too
         * (none for a frozen unit: it never reduces) */
        bool evcoll = u->n_eval_collectives > 0;
        if (sg > 1 && train)
            out->staging_bytes += sh * (evcoll && dsz(reduce) < f32 ? f32 : dsz(reduce));
        /* an eval-mode backward may run on every trainable unit with an fp32 master (the
         * runtime's grad_buffer_full), with or without planned eval collectives */
        bool evbwd = p->eval_backward && train && master == PCS__V1__DTYPE__DTYPE_FP32;
        max_c = sh > max_c ? sh : max_c;
        bool pp_lay = per_param(u) && sg > 1;
        if (pp_lay) {
            /* the runtime's gather buffer [sg, c] before the FSDP2 copy-out, one for all
             * per_param units: the largest (the wider of the param dtype and, when a
             * full-precision gather may land there, the master's storage dtype) */
            uint64_t e = dsz(param);
            if (param != master && msz > e)
                e = msz;
            uint64_t g = sg * sh * e;
            g = (g + f32 - 1) / f32 * f32;
            max_g = g > max_g ? g : max_g;
        }
        for (size_t b = 0; b < u->n_buffers; b++)
            out->buffer_bytes += u->buffers[b]->numel * dsz(u->buffers[b]->run_dtype);
        /* a replicated unit computing in its fp32 (fp64) master's dtype on that master needs no
         * unsharded copy, unless the master is in host memory (cpu_offload) */
        bool copy = sg > 1 || param != mst || master != mst || p->cpu_offload;
        uint64_t f = copy ? u->padded_numel * dsz(param) : 0;
        full[nu] = f;
        kept[nu] = !u->reshard_after_forward ? f
                   : u->reshard_group_size   ? f / u->reshard_group_size
                                             : 0;
        /* full-precision eval gathers fp32 (fp64) copies (mixed-precision units), one unit at a
         * time beside the root's */
        evalb[nu] = p->full_precision_eval && u->mixed_precision && param != master
                        ? u->padded_numel * msz
                        : f;
        uix[nu] = i;
        if (u->is_root) {
            root_eval += evalb[nu];
            isroot[nu] = 1;
        }
        if (evbwd) {
            /* training.eval_backward: the unit's fp32 copy, its fp32 gradient block (the flat
             * reduction input itself: fp32 is the eval reduction's dtype) and, per_param, the
             * [sg, c] copy-in block; the previous unit's input may still be in flight */
            uint64_t rsf = pp_lay ? sg * sh * f32 : 0;
            uint64_t b = evalb[nu] + u->padded_numel * f32 + rsf;
            ev_bwd_peak = b > ev_bwd_peak ? b : ev_bwd_peak;
            /* what a unit's reduction holds while in flight: its [sg, c] block (per_param) or
             * its fp32 gradient block itself (flat: the reduction reads it in place) */
            uint64_t inflight = pp_lay ? rsf : u->padded_numel * f32;
            ev_rs_max = inflight > ev_rs_max ? inflight : ev_rs_max;
        }
        if (train) {
            /* the reduction input is a block of its own unless it is the gradient block itself
             * (mb 1, no cast) or the no-sync accumulator read in place (mb > 1, accumulated in
             * the reduce dtype) */
            bool borrow = mb_acc > 1 && accum == reduce;
            /* the gradient block a backward writes into; none when pcs-worker's backward writes
             * straight into the accumulator (Plan.grads_into_accumulator) */
            gradb[nu] = mb_acc > 1 && p->grads_into_accumulator ? 0
                                                                 : u->padded_numel * dsz(param);
            rsb[nu] = borrow ? 0 : u->padded_numel * dsz(reduce);
            copyb[nu] = reduce != param || mb_acc > 1 ? rsb[nu] : 0;
            if (pp_lay) /* per_param: always its own [sg, c] block, filled by the copy-in */
                rsb[nu] = copyb[nu] = sg * sh * dsz(reduce);
            if (mb_acc > 1)
                acc += u->padded_numel * dsz(accum);
        }
        /* still gathered after its backward in a no-sync micro-batch (not freed after it) */
        held[nu] = mb_acc > 1 && (!u->reshard_after_backward || u->keep_gathered_in_accumulation)
                       ? f
                       : 0;
        keep |= mb_acc > 1 && u->keep_gathered_in_accumulation;
        /* hsdp_all_reduce last_micro_batch: the partial sums of an HSDP unit's earlier
         * micro-batches wait for the last one's all-reduce (runtime: allocated at setup) */
        bool hsdp = false;
        for (size_t k = 0; k < u->n_collectives; k++)
            hsdp |= u->collectives[k]->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE &&
                    u->collectives[k]->group == PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE;
        if (p->hsdp_all_reduce_last && mb > 1 && hsdp && sg > 1 && train)
            out->staging_bytes += sh * dsz(reduce);
        nu++;
        for (size_t k = 0; k < u->n_collectives; k++) {
            const Pcs__V1__CollectiveSpec *cs = u->collectives[k];
            uint64_t g = cs->group_size, bytes = cs->count * dsz(cs->dtype);
            if (g < 2)
                continue;
            if (cs->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER) {
                /* forward: every micro-batch unless params stay unsharded between no-sync
                 * micro-batches (shard_grad_op); backward re-gather: every micro-batch. With
                 * pipeline stages the schedule's UNSHARDs gather the stage (count them once,
                 * on the forward collective) */
                uint64_t times = pp > 1 ? (cs->phase == PCS__V1__PHASE__PHASE_FORWARD ? pp_gathers : 0)
                                 : u->keep_gathered_in_accumulation ? 1
                                 : cs->phase == PCS__V1__PHASE__PHASE_FORWARD
                                     ? (u->reshard_after_backward || mb_acc == 1 ? mb : 1)
                                     : mb;
                out->all_gather_bytes += times * (g - 1) * bytes;
            } else if (cs->kind == PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER) {
                /* once per step, or every micro-batch (gradient_sync every_micro_batch) */
                out->reduce_scatter_bytes += (mb / mb_acc) * (g - 1) * bytes;
            } else if (cs->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE) {
                bool once = p->hsdp_all_reduce_last &&
                            cs->group == PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE;
                out->all_reduce_bytes += (once ? 1 : mb / mb_acc) * 2 * (g - 1) * bytes / g;
            }
        }
    }
    /* the runtime's scratch (largest shard, widest master storage) and read-back scalars */
    out->staging_bytes += max_c * wide + (3 + (uint64_t)n) * f32 + max_g;
    /* prefix sums make the walks O(units); ancestors (units whose module encloses unit i's, by
     * path, in pre-order) stay gathered, with their gradient, while unit i computes */
    for (size_t i = 0; i < nu; i++) {
        pk[i + 1] = pk[i] + kept[i];
        pf[i + 1] = pf[i] + full[i];
        /* a reshard_after_forward=int unit's kept slice is a block of its own, held beside
         * the full buffer while the slice is cut (forward) or re-gathered (backward) */
        ps[i + 1] = ps[i] + (kept[i] && kept[i] < full[i] ? kept[i] : 0);
    }
    {
        size_t *stack = NULL, top = 0;
        const Pcs__V1__Unit **mine = NULL;
        if (pcs_calloc(nu + 1, sizeof *stack, (void **)&stack) != PCS_OK ||
            pcs_calloc(nu + 1, sizeof *mine, (void **)&mine) != PCS_OK) {
            free(stack);
            free(full);
            return PCS_ERR_NOMEM;
        }
        for (size_t i = 0, k = 0; i < n; i++)
            if (p->units[i]->stage % pp == c.pp)
                mine[k++] = p->units[i];
        uint64_t extra_full = 0, extra_grad = 0; /* sums over the stack */
        for (size_t i = 0; i < nu; i++) {
            const char *pi = mine[i]->path ? mine[i]->path : "";
            while (top) {
                const char *pa = mine[stack[top - 1]]->path ? mine[stack[top - 1]]->path : "";
                size_t la = strlen(pa);
                /* (an equal path: an ignored-parameter unit inside its module's unit) */
                if (la == 0 || (strncmp(pa, pi, la) == 0 && (pi[la] == '.' || pi[la] == '\0')))
                    break;
                top--;
                extra_full -= full[stack[top]] - kept[stack[top]];
                extra_grad -= gradb[stack[top]];
            }
            /* what ancestors hold beyond their kept bytes: forward, their params; backward,
             * their params and gradients (an ancestor inside the prefetch window is counted
             * twice: a bound, not an equality, for nested wrapping) */
            anc_f[i] = extra_full;
            anc_b[i] = extra_full + extra_grad;
            stack[top++] = i;
            extra_full += full[i] - kept[i];
            extra_grad += gradb[i];
        }
        free(stack);
        free(mine);
    }
    /* forward: units before i hold their kept bytes (ancestors their full bytes), i..i+fdepth
     * are fully gathered */
    uint64_t peak = 0;
    for (size_t i = 0; i < nu; i++) {
        size_t hi = i + fdepth + 1 < nu ? i + fdepth + 1 : nu;
        uint64_t s = pk[i] + (pf[hi] - pf[i]) + anc_f[i] + (ps[i + 1] - ps[i]);
        if (s > peak)
            peak = s;
    }
    /* backward (reverse): units below i - bdepth still kept, i - bdepth..i gathered, ancestors
     * gathered with their gradients, unit i's unsharded gradient; then either (sync
     * micro-batch) its separate reduction input or the reduction of the unit after it still in
     * flight, or (no-sync micro-batch) the units after it that stay gathered */
    uint64_t after = 0;
    for (size_t i = nu; i-- > 0;) {
        size_t lo = i > bdepth ? i - bdepth : 0;
        uint64_t inflight = i + 1 < nu ? rsb[i + 1] : 0;
        uint64_t sync = copyb[i] > inflight ? copyb[i] : inflight;
        uint64_t tail = sync > after ? sync : after;
        uint64_t s = pk[lo] + (pf[i + 1] - pf[lo]) + (ps[i + 1] - ps[lo]) + anc_b[i] + gradb[i] +
                     tail;
        if (s > peak)
            peak = s;
        after += held[i];
    }
    /* kept gathered across no-sync micro-batches: every unit gathered, with the ancestors'
     * gradients and unit i's (no reduction runs in those micro-batches) */
    for (size_t i = 0; keep && i < nu; i++) {
        uint64_t s = pf[nu] + (anc_b[i] - anc_f[i]) + gradb[i];
        if (s > peak)
            peak = s;
    }
    /* eval (after a step: every unit resharded, no gradients): the root and one unit gathered,
     * inline, with the units sharing its module (dtype parts, ignored parameters: gathered by
     * the same forward) */
    for (size_t i = 0; i < nu; i++) {
        if (isroot[i])
            continue;
        uint64_t s = root_eval + evalb[i];
        const Pcs__V1__Unit *u = p->units[uix[i]];
        for (size_t j = i + 1; j < nu; j++) {
            const Pcs__V1__Unit *q = p->units[uix[j]];
            if (q->n_modules || strcmp(q->path, u->path) != 0)
                break;
            s += evalb[j];
        }
        if (s > peak)
            peak = s;
    }
    if (root_eval > peak)
        peak = root_eval;
    /* an eval-mode backward (training.eval_backward): the root's fp32 copy beside a unit's eval
     * backward (above), and a reduction input in flight */
    if (ev_bwd_peak && root_eval + ev_bwd_peak + ev_rs_max > peak)
        peak = root_eval + ev_bwd_peak + ev_rs_max;
    if (pp > 1) {
        /* Pipeline stages (worker/train.c): UNSHARD gathers a whole stage and RESHARD frees it
         * (around every compute action, or once per step, when every stage of this rank stays
         * gathered); a backward takes the gradient blocks of its stage's units at once and hands
         * them in together, and reductions of every stage may be in flight at the same time.
         * Eval gathers one stage at a time. A bound over the schedule's order. */
        uint64_t all_full = pf[nu], full_max = 0, grad_max = 0, copy_all = 0, eval_max = 0;
        for (uint32_t k = 0; k < (p->virtual_stages ? p->virtual_stages : 1); k++) {
            uint64_t sf = 0, sgr = 0, se = 0, stage = c.pp + (uint64_t)k * pp;
            for (size_t i = 0; i < nu; i++) {
                if (stg[i] != stage)
                    continue;
                sf += full[i];
                sgr += gradb[i];
                se += evalb[i];
                copy_all += copyb[i] > rsb[i] ? copyb[i] : rsb[i];
            }
            full_max = sf > full_max ? sf : full_max;
            grad_max = sgr > grad_max ? sgr : grad_max;
            eval_max = se > eval_max ? se : eval_max;
        }
        peak = (per_mb ? full_max : all_full) + grad_max + copy_all;
        if (eval_max > peak)
            peak = eval_max;
    }
    free(full);
    out->peak_unsharded_bytes = peak + acc;
    out->total_bytes = out->peak_unsharded_bytes + out->grad_shard_bytes + out->staging_bytes +
                       out->buffer_bytes;
    if (p->cpu_offload) {
        /* masters and optimizer state in host memory, with the host copy of one gradient shard
         * (widened to fp32) the CPU optimizer reads; on the device, the fp32 master shard being
         * copied in for an all-gather (one at a time: the all-gather stream's pool block) */
        out->host_bytes = out->param_shard_bytes + out->optimizer_bytes + max_c * wide;
        out->staging_bytes += max_c * wide;
        out->total_bytes += max_c * wide;
    } else {
        out->total_bytes += out->param_shard_bytes + out->optimizer_bytes;
    }
    return PCS_OK;
}

/* A unit of the plan keeps fp64 masters. */
static bool plan_has_fp64(const Pcs__V1__Plan *p)
{
    for (size_t i = 0; p && i < p->n_units; i++)
        if (p->units[i]->master_dtype == PCS__V1__DTYPE__DTYPE_FP64)
            return true;
    return false;
}

pcs_status_t pcs_job_check_runnable(const Pcs__V1__JobSpec *spec, const Pcs__V1__Plan *p)
{
    const char *program = spec && spec->program ? spec->program : "";
    bool pcs_worker = !*program || !strcmp(program, "pcs-worker");
    if (spec && spec->n_ignored_params && pcs_worker)
        /* its model hooks gather one unit per module; an ignored parameter's unit shares its
         * module with the unit of the module's other parameters */
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "ignored_params: run in programs that do their own math "
                             "(spec.program pcs.torch or a C API program's name); pcs-worker "
                             "binds one unit per module");
    for (size_t i = 0; pcs_worker && p && i < p->n_units; i++)
        if (p->units[i]->n_modules == 0 && p->units[i]->n_params > 0)
            /* (a dtype part of a mixed-dtype group: the same reason) */
            return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                 "model: unit %zu ('%s') holds the %s parameters of a group of "
                                 "mixed dtypes; such groups run in programs that do their own "
                                 "math (spec.program pcs.torch or a C API program's name); "
                                 "pcs-worker binds one unit per module",
                                 i, p->units[i]->path,
                                 pcs_dtype_name((pcs_dtype_t)p->units[i]->master_dtype));
    if (plan_has_fp64(p)) {
        /* pcs-worker's own math (model.mlp and its layer classes) and its checkpoints are
         * fp32/bf16/fp16; a program doing its own math (pcs.torch, a C API program) runs fp64 */
        if (pcs_worker)
            return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                 "precision: fp64 masters run in programs that do their own math "
                                 "(spec.program pcs.torch or a C API program's name); pcs-worker "
                                 "computes and checkpoints in fp32, bf16 and fp16");
        if (spec && spec->training && spec->training->clip_grad_norm > 0)
            return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                 "training.clip_grad_norm: not with fp64 masters (the global "
                                 "norm is computed in fp32; PyTorch's is fp64 there)");
        if (spec && spec->training && spec->training->eval_backward)
            return pcs_set_error(PCS_ERR_UNSUPPORTED,
                                 "training.eval_backward: not with fp64 masters (an eval-mode "
                                 "backward in full precision takes fp32 masters here; FSDP1's "
                                 "would reduce in fp64)");
    }
    if (p && p->pp_size > 1 &&
        (!spec || !spec->model || spec->model->kind_case != PCS__V1__MODEL_SPEC__KIND_MLP))
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "mesh: pipeline stages (pp = %u) run the built-in mlp model only; "
                             "programs using the C API (model.explicit) compute whole models",
                             p->pp_size);
    return pcs_plan_check_runnable(p);
}
