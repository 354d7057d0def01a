/* Property tests of the planner over random module trees, wrap policies, precision policies,
 * shard layouts and world sizes 1..64: shards tile the padded buffer exactly (flat layout), every
 * parameter element lies in exactly one piece of one shard (both layouts), every parameter appears once with its
 * bytes inside the flat buffer and 16-byte aligned, every module belongs to one unit, unit
 * selection equals a direct recursive transliteration of FSDP1 _recursive_wrap, the dtype rules
 * are total, and group membership agrees with the mesh coordinates. Seeded: failures reproduce. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/model_tree.h"
#include "pcs/pbtext.h"
#include "planner/plan.h"

#define ITERS 400

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    /* splitmix64: deterministic across platforms */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return n ? (uint32_t)(z % n) : 0;
}

typedef struct gen {
    char *y;
    size_t len, cap;
} gen_t;

__attribute__((format(printf, 2, 3))) static void put(gen_t *g, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(g->y + g->len, g->cap - g->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < g->cap - g->len) {
            g->len += (size_t)n;
            return;
        }
        g->cap = g->cap ? g->cap * 2 : 4096;
        g->y = realloc(g->y, g->cap);
        assert_non_null(g->y);
    }
}

static const char *classes[] = {"Block", "Linear", "LayerNorm", "BatchNorm1d", "ModuleList"};
static const char *dtypes[] = {NULL, "fp32", "bf16", "fp16"};

/* A random job: explicit tree of up to 40 modules with params, buffers, shared params. */
static void random_job(gen_t *g, uint32_t *ws_out)
{
    uint32_t nm = 1 + rnd(40);
    char(*paths)[256] = calloc(nm, sizeof *paths);
    uint32_t *nparams = calloc(nm, sizeof *nparams);
    assert_non_null(paths);
    put(g, "model: {explicit: [");
    for (uint32_t i = 0; i < nm; i++) {
        if (i == 0) {
            paths[0][0] = '\0';
        } else {
            uint32_t p = rnd(i);
            if (strlen(paths[p]) > 200)
                p = 0;
            size_t pl = strlen(paths[p]);
            memcpy(paths[i], paths[p], pl);
            snprintf(paths[i] + pl, sizeof paths[i] - pl, "%sm%u", pl ? "." : "", i);
        }
        put(g, "%s{path: '%s', class: %s, params: [", i ? ", " : "", paths[i], classes[rnd(5)]);
        nparams[i] = rnd(4);
        for (uint32_t k = 0; k < nparams[i]; k++) {
            put(g, "%s{name: p%u, shape: [", k ? ", " : "", k);
            uint32_t nd = 1 + rnd(3);
            for (uint32_t d = 0; d < nd; d++)
                put(g, "%s%u", d ? ", " : "", 1 + rnd(9));
            put(g, "]%s}", rnd(10) == 0 ? ", requires_grad_off: true" : "");
        }
        put(g, "], buffers: [");
        if (rnd(4) == 0)
            put(g, "{name: running_mean, shape: [%u]}, {name: steps, shape: [], dtype: int64}",
                1 + rnd(9));
        put(g, "], shared: [");
        /* share a parameter of an earlier module */
        if (i > 0 && rnd(5) == 0) {
            uint32_t j = rnd(i);
            if (nparams[j])
                put(g, "{name: s0, shares: '%s%sp%u'}", paths[j], paths[j][0] ? "." : "",
                    rnd(nparams[j]));
        }
        put(g, "]}");
    }
    put(g, "]}\n");
    bool wrap_open = true;
    switch (rnd(4)) {
    case 0:
        wrap_open = false;
        break;
    case 1:
        put(g, "wrap: {size_based: {min_num_params: %u}", 1 + rnd(200));
        break;
    case 2:
        put(g, "wrap: {module_class: [Block, Linear]");
        break;
    default:
        put(g, "wrap: {explicit: [");
        for (uint32_t i = 1, first = 1; i < nm; i++)
            if (rnd(3) == 0) {
                put(g, "%s'%s'", first ? "" : ", ", paths[i]);
                first = 0;
            }
        put(g, "]");
        break;
    }
    if (wrap_open)
        put(g, "%s}\n", rnd(2) ? ", ignored_module_classes: [none]" : "");
    put(g, "precision: {");
    const char *pd = dtypes[rnd(4)], *rd = dtypes[rnd(4)];
    if (pd)
        put(g, "param_dtype: %s, ", pd);
    if (rd)
        put(g, "reduce_dtype: %s, ", rd);
    if (rnd(5) == 0)
        put(g, "master_dtype: fp16, ");
    if (rnd(3) == 0)
        put(g, "overrides: [{match: {module_class: LayerNorm}, param_dtype: %s}], ",
            dtypes[1 + rnd(3)]);
    put(g, "keep_low_precision_grads: %s}\n", rnd(4) == 0 ? "true" : "false");
    uint32_t ws = 1 + rnd(64);
    static const char *strat[] = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard",
                                  "hybrid_shard_zero2"};
    uint32_t s = rnd(5);
    put(g, "strategy: %s\n", strat[s]);
    if (s >= 3) {
        uint32_t rep = 1 + rnd(4);
        while (ws % rep)
            rep--;
        put(g, "mesh: [{dim: dp_replicate, size: %u}, {dim: dp_shard, size: %u}]\n", rep, ws / rep);
    } else {
        put(g, "mesh: [{dim: dp_shard, size: %u}]\n", ws);
    }
    put(g, "training: {micro_batches: %u, prefetch: %u, optimizer: {adamw: {lr: 0.1}}}\n",
        1 + rnd(4), 1 + rnd(2));
    if (rnd(2))
        put(g, "shard_layout: %s\n", rnd(2) ? "per_param" : "flat");
    *ws_out = ws;
    free(paths);
    free(nparams);
}

static Pcs__V1__JobSpec *parse(const char *y)
{
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        fail_msg("yaml: %s\n%s", pcs_last_error(), y);
    return (Pcs__V1__JobSpec *)m;
}

// ---- reference: FSDP1 _recursive_wrap, transliterated with recursion ---------------------

typedef struct refctx {
    const pcs_model_t *m;
    uint64_t min; /* 0: no size policy */
    int policy;   /* 0 none, 1 size, 2 class, 3 explicit */
    const uint8_t *indiv, *expl;
    const Pcs__V1__ModuleClassWrap *classes;
    int any_indiv;
    uint8_t *wrapped;
} refctx_t;

static int user_recurse(const refctx_t *r, uint32_t i, uint64_t nonwrapped)
{
    if (r->policy == 1)
        return nonwrapped >= r->min && strcmp(r->m->modules[i].cls, "MultiheadAttention") != 0;
    return r->policy != 0;
}

static int user_wrap(const refctx_t *r, uint32_t i, uint64_t rem)
{
    const char *cls = r->m->modules[i].cls;
    if (r->policy == 1)
        return rem >= r->min && strcmp(cls, "ModuleList") && strcmp(cls, "ModuleDict");
    if (r->policy == 2) {
        for (size_t k = 0; k < r->classes->n_classes; k++)
            if (!strcmp(cls, r->classes->classes[k]))
                return 1;
        return 0;
    }
    if (r->policy == 3)
        return r->expl[i];
    return 0;
}

static uint64_t ref_wrap(refctx_t *r, uint32_t i, int only_children)
{
    const pcs_model_t *m = r->m;
    uint64_t nonwrapped = m->modules[i].subtree_numel;
    if (!(r->any_indiv || user_recurse(r, i, nonwrapped)))
        return 0;
    uint64_t total = 0;
    for (uint32_t c = i + 1; c < m->modules[i].subtree_end; c = m->modules[c].subtree_end)
        total += ref_wrap(r, c, 0);
    uint64_t rem = nonwrapped - total;
    if (!only_children && (r->indiv[i] || user_wrap(r, i, rem))) {
        r->wrapped[i] = 1;
        return nonwrapped;
    }
    return total;
}

// ---- the properties ---------------------------------------------------------------------

static bool is_float(Pcs__V1__DType d)
{
    return pcs_dtype_is_float((pcs_dtype_t)d) && d != 0;
}

static uint32_t n_per_param_units; /* the per_param layout was exercised */

static void check_plan(const Pcs__V1__JobSpec *spec, const Pcs__V1__Plan *p, const char *y)
{
    pcs_model_t *m = NULL;
    assert_int_equal(pcs_model_expand(spec, &m), PCS_OK);
    uint32_t *param_seen = calloc(m->n_params + 1, sizeof *param_seen);
    uint32_t *mod_seen = calloc(m->n_modules + 1, sizeof *mod_seen);
    uint8_t *unit_root = calloc(m->n_modules + 1, 1);

    for (size_t k = 0; k < p->n_units; k++) {
        const Pcs__V1__Unit *u = p->units[k];
        uint64_t G = u->shard_group_size;
        assert_true(G >= 1);
        /* dtype rules are total */
        assert_true(is_float(u->master_dtype) && is_float(u->param_dtype) &&
                    is_float(u->reduce_dtype) && is_float(u->accum_dtype) &&
                    is_float(u->grad_dtype));
        assert_int_equal(u->align_numel * pcs_dtype_size((pcs_dtype_t)u->param_dtype), 16);
        /* layout: aligned, ordered, non-overlapping, inside the flat buffer */
        uint64_t end = 0, sum = 0;
        for (size_t i = 0; i < u->n_params; i++) {
            const Pcs__V1__ParamSlot *s = u->params[i];
            if (i > 0)
                assert_int_equal(s->offset % u->align_numel, 0);
            assert_true(s->offset >= end);
            end = s->offset + s->numel;
            sum += s->numel;
            uint64_t prod = 1;
            for (size_t d = 0; d < s->n_shape; d++)
                prod *= s->shape[d];
            assert_int_equal(prod, s->numel);
            int32_t idx = -1;
            for (uint32_t q = 0; q < m->n_params; q++)
                if (strcmp(m->params[q].fqn, s->fqn) == 0)
                    idx = (int32_t)q;
            if (idx < 0)
                fail_msg("unit param '%s' is not a model parameter\n%s", s->fqn, y);
            param_seen[idx]++;
        }
        assert_int_equal(end, u->flat_numel);
        assert_int_equal(sum, u->numel);
        bool pp = u->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
        n_per_param_units += pp;
        const char *lay = spec->shard_layout ? spec->shard_layout : "";
        /* per_param exactly for the sharded, managed units of a per_param job */
        assert_int_equal(pp, !strcmp(lay, "per_param") && G > 1 && !u->unmanaged);
        assert_int_equal(u->padded_numel % G, 0);
        if (!pp) {
            /* padding and shards: padded = roundup(flat, G), shards tile it exactly */
            assert_true(u->padded_numel >= u->flat_numel && u->padded_numel - u->flat_numel < G);
            assert_int_equal(u->shard_numel * G, u->padded_numel);
            uint64_t next = 0;
            for (uint32_t r = 0; r < G; r++) {
                uint64_t b, e;
                pcs_plan_shard_range(u, r, &b, &e);
                assert_int_equal(b, next);
                assert_true(e >= b && e - b <= u->shard_numel);
                next = e;
            }
            assert_int_equal(next, u->flat_numel);
        } else {
            /* FSDP2 _init_sharded_param: ceil(rows / G) rows a rank, chunks back to back; the
             * unsharded buffer holds both the flat layout and the gathered [G, c] */
            uint64_t c = 0;
            for (size_t i = 0; i < u->n_params; i++) {
                const Pcs__V1__ParamSlot *q = u->params[i];
                uint64_t rows = q->n_shape ? q->shape[0] : 1;
                assert_int_equal(q->shard_rows, (rows + G - 1) / G);
                assert_int_equal(q->shard_offset, c);
                c += q->shard_rows * (rows ? q->numel / rows : 0);
            }
            assert_int_equal(u->shard_numel, c);
            assert_true(u->padded_numel >= u->flat_numel && u->padded_numel >= c * G);
            assert_true(u->padded_numel - (u->flat_numel > c * G ? u->flat_numel : c * G) < G);
        }
        /* every element of every parameter in exactly one piece of one shard, pieces inside
         * their shard and disjoint there, and pcs_plan_locate agreeing with them */
        {
            pcs_plan_piece_t *pcs = calloc(u->n_params + 1, sizeof *pcs);
            uint64_t c = u->shard_numel;
            uint8_t *used = calloc(c + 1, 1);
            uint8_t **seen = calloc(u->n_params + 1, sizeof *seen);
            assert_true(pcs && used && seen);
            for (size_t i = 0; i < u->n_params; i++)
                assert_non_null(seen[i] = calloc(u->params[i]->numel + 1, 1));
            for (uint32_t r = 0; r < G; r++) {
                memset(used, 0, c + 1);
                size_t np = pcs_plan_shard_pieces(u, r, pcs);
                assert_true(np <= u->n_params);
                for (size_t j = 0; j < np; j++) {
                    const pcs_plan_piece_t *q = &pcs[j];
                    assert_true(q->param < u->n_params && q->len > 0 && q->count >= 1);
                    if (j)
                        assert_true(q->param > pcs[j - 1].param);
                    assert_true(q->elem + (q->count - 1) * q->stride + q->len <=
                                u->params[q->param]->numel);
                    assert_true(q->shard_off + q->count * q->len <= c);
                    for (uint64_t t = 0; t < q->count; t++)
                        for (uint64_t e = 0; e < q->len; e++) {
                            assert_int_equal(used[q->shard_off + t * q->len + e]++, 0);
                            assert_int_equal(seen[q->param][q->elem + t * q->stride + e]++, 0);
                        }
                    if (!pp || !u->params[q->param]->shard_dim)
                        assert_int_equal(q->count, 1);
                    if (!pp) /* the flat buffer's own order: offset + elem at r*c + shard_off */
                        assert_int_equal(u->params[q->param]->offset + q->elem,
                                         (uint64_t)r * c + q->shard_off);
                    uint32_t s;
                    uint64_t off, run;
                    uint64_t e = q->elem + rnd((uint32_t)q->len);
                    pcs_plan_locate(u, q->param, e, &s, &off, &run);
                    assert_int_equal(s, r);
                    assert_int_equal(off, q->shard_off + (e - q->elem));
                    assert_int_equal(run, q->len - (e - q->elem));
                }
            }
            for (size_t i = 0; i < u->n_params; i++) {
                for (uint64_t e = 0; e < u->params[i]->numel; e++)
                    if (seen[i][e] != 1)
                        fail_msg("unit %zu param %s element %llu in %u pieces\n%s", k,
                                 u->params[i]->fqn, (unsigned long long)e, seen[i][e], y);
                free(seen[i]);
            }
            free(seen);
            free(used);
            free(pcs);
        }
        /* collectives run in the unit's dtypes, over groups of the plan's sizes */
        for (size_t i = 0; i < u->n_collectives; i++) {
            const Pcs__V1__CollectiveSpec *c = u->collectives[i];
            if (c->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER)
                assert_int_equal(c->dtype, u->param_dtype);
            else
                assert_int_equal(c->dtype, u->reduce_dtype);
            assert_true(c->group_size >= 2);
            if (c->kind != PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER)
                assert_non_null(c->reduction);
        }
        for (size_t i = 0; i < u->n_modules; i++) {
            int32_t mi = pcs_model_find(m, u->modules[i]);
            assert_true(mi >= 0);
            mod_seen[mi]++;
        }
        if (!u->is_root) {
            int32_t mi = pcs_model_find(m, u->path);
            assert_true(mi > 0);
            unit_root[mi] = 1;
        }
    }
    for (uint32_t q = 0; q < m->n_params; q++)
        if (param_seen[q] != 1)
            fail_msg("param '%s' appears %u times\n%s", m->params[q].fqn, param_seen[q], y);
    for (uint32_t i = 0; i < m->n_modules; i++)
        assert_int_equal(mod_seen[i], 1);

    /* unit selection equals the recursive transliteration of _recursive_wrap */
    const Pcs__V1__WrapSpec *w = spec->wrap;
    refctx_t r = {.m = m, .policy = w ? (int)w->policy_case : 0};
    uint8_t *indiv = calloc(m->n_modules + 1, 1), *expl = calloc(m->n_modules + 1, 1);
    uint8_t *wrapped = calloc(m->n_modules + 1, 1);
    bool ign_on = !(w && w->n_ignored_module_classes);
    for (uint32_t i = 1; i < m->n_modules; i++) {
        indiv[i] = (ign_on && strcmp(m->modules[i].cls, "BatchNorm1d") == 0);
        const Pcs__V1__PrecisionSpec *ps = spec->precision;
        if (ps && ps->n_overrides && strcmp(m->modules[i].cls, "LayerNorm") == 0)
            indiv[i] = 1;
        r.any_indiv |= indiv[i];
    }
    if (r.policy == 1)
        r.min = w->size_based->min_num_params;
    if (r.policy == 2)
        r.classes = w->module_class;
    if (r.policy == 3)
        for (size_t i = 0; i < w->explicit_->n_paths; i++)
            expl[pcs_model_find(m, w->explicit_->paths[i])] = 1;
    r.indiv = indiv;
    r.expl = expl;
    r.wrapped = wrapped;
    ref_wrap(&r, 0, 1);
    for (uint32_t i = 1; i < m->n_modules; i++)
        if (wrapped[i] != unit_root[i])
            fail_msg("module '%s': reference wrapped=%d, plan unit=%d\n%s", m->modules[i].path,
                     wrapped[i], unit_root[i], y);

    /* groups agree with coordinates */
    uint32_t ranks[64], n, me;
    uint32_t rank = rnd(p->world_size);
    Pcs__V1__MeshCoords mine;
    assert_int_equal(pcs_plan_rank_coords(p, rank, &mine), PCS_OK);
    n = 64;
    assert_int_equal(
        pcs_plan_group_ranks(p, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, rank, ranks, &n, &me),
        PCS_OK);
    assert_int_equal(n, p->shard_size);
    assert_int_equal(ranks[me], rank);
    for (uint32_t i = 0; i < n; i++) {
        Pcs__V1__MeshCoords c;
        assert_int_equal(pcs_plan_rank_coords(p, ranks[i], &c), PCS_OK);
        assert_int_equal(c.dp_shard, i);
        assert_int_equal(c.dp_replicate, mine.dp_replicate);
        assert_int_equal(c.pp, mine.pp);
        if (i)
            assert_true(ranks[i] > ranks[i - 1]);
    }
    Pcs__V1__RankEstimate e;
    assert_int_equal(pcs_plan_rank_estimate(p, rank, &e), PCS_OK);
    assert_true(e.total_bytes <= p->estimate_max->total_bytes);
    assert_true(pcs_plan_hash(p) == p->hash);

    free(indiv);
    free(expl);
    free(wrapped);
    free(param_seen);
    free(mod_seen);
    free(unit_root);
    pcs_model_free(m);
}

static void test_random_trees_tile_align_and_cover_every_param_once(void **state)
{
    (void)state;
    uint32_t planned = 0;
    for (uint32_t it = 0; it < ITERS; it++) {
        rng_state = 0x5eed0000ull + it;
        gen_t g = {0};
        uint32_t ws;
        random_job(&g, &ws);
        Pcs__V1__JobSpec *spec = parse(g.y);
        Pcs__V1__Plan *p = NULL;
        pcs_status_t rc = pcs_plan_build(spec, ws, &p);
        if (rc != PCS_OK) {
            /* the only legitimate refusal of these jobs: mixed dtypes cannot happen (params
             * are fp32), so any error is a bug */
            fail_msg("iteration %u: %s\n%s", it, pcs_last_error(), g.y);
        }
        check_plan(spec, p, g.y);
        planned++;
        pcs_plan_free(p);
        protobuf_c_message_free_unpacked(&spec->base, NULL);
        free(g.y);
    }
    assert_int_equal(planned, ITERS);
    assert_true(n_per_param_units > 0);
}

static void test_precision_rules_are_total(void **state)
{
    (void)state;
    for (int master = 0; master < PCS_DTYPE_COUNT; master++)
        for (int p = 0; p < PCS_DTYPE_COUNT; p++)
            for (int r = 0; r < PCS_DTYPE_COUNT; r++)
                for (int b = 0; b < PCS_DTYPE_COUNT; b++)
                    for (int flags = 0; flags < 8; flags++) {
                        pcs_precision_in_t in = {(pcs_dtype_t)master, (pcs_dtype_t)p,
                                                 (pcs_dtype_t)r,      (pcs_dtype_t)b,
                                                 PCS_DTYPE_NONE,      flags & 1,
                                                 (flags >> 1) & 1,    (flags >> 2) & 1};
                        pcs_precision_t o;
                        pcs_plan_resolve_precision(&in, &o);
                        assert_true(pcs_dtype_is_float(o.master));
                        assert_true(pcs_dtype_is_float(o.compute));
                        assert_true(pcs_dtype_is_float(o.reduce));
                        assert_true(pcs_dtype_is_float(o.accum));
                        assert_true(pcs_dtype_is_float(o.grad));
                        assert_true(o.buffer == PCS_DTYPE_NONE || pcs_dtype_is_float(o.buffer));
                        if (!in.mixed_precision) {
                            assert_int_equal(o.compute, o.master);
                            assert_int_equal(o.reduce, o.master);
                        }
                        /* grads handed to the optimizer: master, or compute when kept low */
                        assert_int_equal(o.grad, o.keep_low_precision_grads ? o.compute : o.master);
                    }
}

static void test_random_mlp_pipelines_split_layers_contiguously(void **state)
{
    (void)state;
    for (uint32_t it = 0; it < 100; it++) {
        rng_state = 0xabc00000ull + it;
        uint32_t L = 1 + rnd(24), pp = 1 + rnd(4), v = 1 + rnd(3), dp = 1 + rnd(4);
        if (pp * v > L)
            continue;
        char y[1024];
        int o = snprintf(y, sizeof y, "model: {mlp: {input_dim: 4, output_dim: 2, hidden_dims: [");
        for (uint32_t i = 0; i < L; i++)
            o += snprintf(y + o, sizeof y - o, "%s%u", i ? ", " : "", 1 + rnd(8));
        snprintf(y + o, sizeof y - o,
                 "]}}\nwrap: {module_class: [MLPBlock]}\npipeline: {virtual_stages: %u}\n"
                 "mesh: [{dim: pp, size: %u}, {dim: dp_shard, size: %u}]\n",
                 v, pp, dp);
        Pcs__V1__JobSpec *spec = parse(y);
        Pcs__V1__Plan *p = NULL;
        if (pcs_plan_build(spec, 0, &p) != PCS_OK)
            fail_msg("%s\n%s", pcs_last_error(), y);
        uint32_t S = pp == 1 ? 1 : pp * v;
        assert_int_equal(p->n_stages, S);
        uint32_t next = 0;
        for (uint32_t s = 0; s < S; s++) {
            const Pcs__V1__StageSpec *st = p->stages[s];
            assert_int_equal(st->first_layer, next);
            assert_true(st->last_layer > st->first_layer); /* no empty stage */
            assert_int_equal(st->pp_rank, s % pp);
            next = st->last_layer;
            /* the stage's first unit is its root; its blocks are its layers */
            assert_true(p->units[st->units[0]]->is_root);
            for (size_t k = 1; k < st->n_units; k++) {
                const Pcs__V1__Unit *u = p->units[st->units[k]];
                uint32_t layer = (uint32_t)atoi(u->path + strlen("layers."));
                assert_true(layer >= st->first_layer && layer < st->last_layer);
                assert_int_equal(u->stage, s);
            }
        }
        assert_int_equal(next, L);
        check_plan(spec, p, y);
        pcs_plan_free(p);
        protobuf_c_message_free_unpacked(&spec->base, NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_trees_tile_align_and_cover_every_param_once),
        cmocka_unit_test(test_precision_rules_are_total),
        cmocka_unit_test(test_random_mlp_pipelines_split_layers_contiguously),
    };
    return cmocka_run_group_tests_name("plan_props", tests, NULL, NULL);
}
