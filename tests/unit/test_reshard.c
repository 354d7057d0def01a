/* The transfer plan of a resharded resume (planner/reshard.c), checked by simulation: old rank
 * shards are filled with a code per parameter element (0 in padding), every new rank's shard is
 * rebuilt from the segments alone, and must equal the shard computed directly from the new plan's
 * layout (flat, or FSDP2's per-parameter chunks from the shapes) — for every pair of world sizes
 * 1..8, strategies (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD), wrap policies (units that
 * differ between the plans), shard layouts and meshes. Also
 * the refusals: a parameter missing from the checkpoint, another element count, pipelines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/pbtext.h"
#include "planner/plan.h"
#include "planner/reshard.h"

static const char *layout = "flat"; /* shard_layout of the plans made next */

static Pcs__V1__JobSpec *spec_of(const char *strategy, const char *wrap, uint32_t rep,
                                 uint32_t shard, uint32_t hidden)
{
    char y[2048];
    char mesh[256];
    if (rep > 1)
        snprintf(mesh, sizeof mesh,
                 "  - {dim: dp_replicate, size: %u}\n  - {dim: dp_shard, size: %u}\n", rep, shard);
    else
        snprintf(mesh, sizeof mesh, "  - {dim: dp_shard, size: %u}\n", shard);
    snprintf(y, sizeof y,
             "name: r\n"
             "model:\n"
             "  mlp: {input_dim: 7, hidden_dims: [%u, 13, 5], output_dim: 3, norm: layernorm}\n"
             "strategy: %s\n"
             "wrap: %s\n"
             "mesh:\n%s"
             "training: {steps: 1, micro_batch_size: 2, optimizer: {sgd: {lr: 0.1}}}\n"
             "shard_layout: %s\n",
             hidden, strategy, wrap, mesh, layout);
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        fail_msg("spec: %s\n%s", pcs_last_error(), y);
    return (Pcs__V1__JobSpec *)m;
}

static Pcs__V1__Plan *plan_of(const char *strategy, const char *wrap, uint32_t rep, uint32_t shard,
                              uint32_t hidden)
{
    Pcs__V1__JobSpec *s = spec_of(strategy, wrap, rep, shard, hidden);
    Pcs__V1__Plan *p = NULL;
    if (pcs_plan_build(s, rep * shard, &p) != PCS_OK)
        fail_msg("plan %s %s %ux%u: %s", strategy, wrap, rep, shard, pcs_last_error());
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return p;
}

/* The code of element e of the parameter named fqn: distinct per (parameter, element), never 0. */
static uint64_t code(const char *fqn, uint64_t e)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = fqn; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return (h << 24) ^ (e + 1);
}

/* What `rank`'s shard of unit u holds under plan p: codes of parameter elements, 0 in padding. */
static uint64_t *shard_of(const Pcs__V1__Plan *p, uint32_t u, uint32_t rank)
{
    const Pcs__V1__Unit *un = p->units[u];
    uint32_t s = 0, rep = 0;
    assert_int_equal(pcs_plan_rank_shard(p, u, rank, &s, &rep), PCS_OK);
    uint64_t c = un->shard_numel, lo = (uint64_t)s * c;
    uint64_t *v = calloc(c ? c : 1, sizeof *v);
    assert_non_null(v);
    if (un->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM) {
        /* FSDP2 _init_sharded_param, from the shapes and the placement's dim d alone: the
         * parameter as [outer, D, inner], ceil(D / G) rows of D a rank (even with d > 0), the
         * chunk [outer, R, inner] made contiguous, the parameters' chunks back to back */
        uint64_t G = un->shard_group_size, at = 0;
        for (size_t i = 0; i < un->n_params; i++) {
            const Pcs__V1__ParamSlot *ps = un->params[i];
            uint32_t d = ps->shard_dim;
            uint64_t outer = 1, D = ps->n_shape ? ps->shape[d] : 1, inner = 1;
            for (uint32_t k = 0; k < ps->n_shape; k++)
                if (k != d)
                    *(k < d ? &outer : &inner) *= ps->shape[k];
            uint64_t R = (D + G - 1) / G;
            if (d > 0)
                assert_int_equal(D % G, 0);
            for (uint64_t o = 0; o < outer; o++)
                for (uint64_t r = s * R; r < (s + 1) * R && r < D; r++)
                    for (uint64_t j = 0; j < inner; j++)
                        v[at + (o * R + r - s * R) * inner + j] =
                            code(ps->fqn, (o * D + r) * inner + j);
            at += outer * R * inner;
        }
        assert_int_equal(at, c);
        return v;
    }
    for (size_t i = 0; i < un->n_params; i++) {
        const Pcs__V1__ParamSlot *ps = un->params[i];
        for (uint64_t e = 0; e < ps->numel; e++) {
            uint64_t at = ps->offset + e;
            if (at >= lo && at < lo + c)
                v[at - lo] = code(ps->fqn, e);
        }
    }
    return v;
}

static void check_pair(const Pcs__V1__Plan *old, const Pcs__V1__Plan *neu, const char *what)
{
    for (uint32_t r = 0; r < neu->world_size; r++) {
        pcs_xfer_seg_t *segs = NULL;
        size_t n = 0;
        if (pcs_plan_transfer(old, neu, r, &segs, &n) != PCS_OK)
            fail_msg("%s rank %u: %s", what, r, pcs_last_error());
        for (uint32_t u = 0; u < neu->n_units; u++) {
            uint64_t c = neu->units[u]->shard_numel;
            uint64_t *got = calloc(c ? c : 1, sizeof *got);
            assert_non_null(got);
            for (size_t k = 0; k < n; k++) {
                if (segs[k].unit != u)
                    continue;
                const pcs_xfer_seg_t *g = &segs[k];
                assert_true(g->dst + g->count <= c);
                assert_true(g->src_rank < old->world_size && g->src_unit < old->n_units);
                uint64_t *src = shard_of(old, g->src_unit, g->src_rank);
                uint32_t s = 0, rep = 1;
                assert_int_equal(pcs_plan_rank_shard(old, g->src_unit, g->src_rank, &s, &rep),
                                 PCS_OK);
                assert_int_equal(rep, 0); /* always read from replica 0 */
                assert_true(g->src + g->count <= old->units[g->src_unit]->shard_numel);
                for (uint64_t e = 0; e < g->count; e++) {
                    assert_int_equal(got[g->dst + e], 0); /* each element written once */
                    got[g->dst + e] = src[g->src + e];
                }
                free(src);
            }
            uint64_t *want = shard_of(neu, u, r);
            for (uint64_t e = 0; e < c; e++)
                if (got[e] != want[e])
                    fail_msg("%s: rank %u unit %u element %llu: got %llx want %llx", what, r, u,
                             (unsigned long long)e, (unsigned long long)got[e],
                             (unsigned long long)want[e]);
            free(want);
            free(got);
        }
        free(segs);
    }
}

static void test_every_world_strategy_and_wrap_pair_rebuilds_the_new_shards(void **state)
{
    (void)state;
    static const struct {
        const char *strategy;
        uint32_t rep; /* dp_replicate (hybrid) */
    } kinds[] = {{"full_shard", 1}, {"shard_grad_op", 1}, {"no_shard", 1}, {"hybrid_shard", 2}};
    static const char *wraps[] = {"{size_based: {min_num_params: 40}}", "{module_class: [MLPBlock]}"};
    int pairs = 0;
    for (uint32_t ow = 1; ow <= 8; ow++)
        for (uint32_t nw = 1; nw <= 8; nw++)
            for (size_t ok = 0; ok < 4; ok++) {
                size_t nk = (ok + ow + nw) % 4; /* another strategy on the other side */
                if (ow % kinds[ok].rep || nw % kinds[nk].rep)
                    continue;
                const char *ow_wrap = wraps[(ow + ok) % 2], *nw_wrap = wraps[(nw + nk + 1) % 2];
                /* shard layouts: flat -> flat, and the three pairs with FSDP2's per_param */
                static const char *lays[4][2] = {{"flat", "flat"},
                                                 {"per_param", "per_param"},
                                                 {"flat", "per_param"},
                                                 {"per_param", "flat"}};
                const char *const *lp = lays[(ow * 3 + nw + ok) % 4];
                layout = lp[0];
                Pcs__V1__Plan *old = plan_of(kinds[ok].strategy, ow_wrap, kinds[ok].rep,
                                             ow / kinds[ok].rep, 11);
                layout = lp[1];
                Pcs__V1__Plan *neu = plan_of(kinds[nk].strategy, nw_wrap, kinds[nk].rep,
                                             nw / kinds[nk].rep, 11);
                layout = "flat";
                char what[256];
                snprintf(what, sizeof what, "%s W=%u (%s, %s) -> %s W=%u (%s, %s)",
                         kinds[ok].strategy, ow, ow_wrap, lp[0], kinds[nk].strategy, nw, nw_wrap,
                         lp[1]);
                check_pair(old, neu, what);
                pcs_plan_free(old);
                pcs_plan_free(neu);
                pairs++;
            }
    assert_true(pairs > 150);
}

/* FSDP2 placements on other dims (Shard(1) of a matrix, Shard(2) of a 3-d tensor) resharded to
 * and from the flat layout and dim-0 per_param, every pair of world sizes 1, 2, 4, 8. */
static Pcs__V1__Plan *explicit_plan(int kind, uint32_t ws)
{
    static const char *const tails[] = {
        "", "shard_layout: per_param\n",
        "shard_layout: per_param\nshard_placements: [{param: w, dim: 1}, {param: 'v*', dim: 2}]\n"};
    char y[1024];
    snprintf(y, sizeof y,
             "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [6, 8]}, "
             "{name: b, shape: [6]}, {name: v, shape: [3, 4, 8]}]}]}\n"
             "mesh: [{dim: dp_shard, size: %u}]\n%s",
             ws, tails[kind]);
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        fail_msg("spec: %s\n%s", pcs_last_error(), y);
    Pcs__V1__Plan *p = NULL;
    if (pcs_plan_build((Pcs__V1__JobSpec *)m, ws, &p) != PCS_OK)
        fail_msg("plan: %s\n%s", pcs_last_error(), y);
    protobuf_c_message_free_unpacked(m, NULL);
    return p;
}

static void test_placements_on_other_dims_reshard_both_ways(void **state)
{
    (void)state;
    static const uint32_t ws[] = {1, 2, 4, 8};
    int pairs = 0;
    for (int ok = 0; ok < 3; ok++)
        for (int nk = 0; nk < 3; nk++)
            for (size_t a = 0; a < 4; a++)
                for (size_t b = 0; b < 4; b++) {
                    if (ok != 2 && nk != 2)
                        continue; /* the other pairs are the test above's */
                    Pcs__V1__Plan *old = explicit_plan(ok, ws[a]);
                    Pcs__V1__Plan *neu = explicit_plan(nk, ws[b]);
                    if (ws[a] > 1 && ok == 2)
                        assert_int_equal(old->units[0]->params[0]->shard_dim, 1);
                    char what[128];
                    snprintf(what, sizeof what, "layout %d W=%u -> layout %d W=%u", ok, ws[a], nk,
                             ws[b]);
                    check_pair(old, neu, what);
                    pcs_plan_free(old);
                    pcs_plan_free(neu);
                    pairs++;
                }
    assert_int_equal(pairs, 5 * 16);
}

/* A checkpoint's plan.pb is a file: an inconsistent per_param layout in it is refused before any
 * shard arithmetic (a chunk of 0 rows used to be a division by zero). */
static void test_a_corrupt_checkpoint_plan_is_refused(void **state)
{
    (void)state;
    Pcs__V1__Plan *old = explicit_plan(1, 4), *neu = explicit_plan(0, 2);
    old->units[0]->params[0]->shard_rows = 0;
    pcs_xfer_seg_t *segs = NULL;
    size_t n = 0;
    assert_int_equal(pcs_plan_transfer(old, neu, 0, &segs, &n), PCS_ERR_INVALID_ARG);
    assert_null(segs);
    if (!strstr(pcs_last_error(), "resume: the checkpoint's plan: unit 0"))
        fail_msg("%s", pcs_last_error());
    pcs_plan_free(old);
    pcs_plan_free(neu);
}

static void test_another_model_is_refused_naming_the_parameter(void **state)
{
    (void)state;
    Pcs__V1__Plan *old = plan_of("full_shard", "{module_class: [MLPBlock]}", 1, 2, 11);
    Pcs__V1__Plan *wider = plan_of("full_shard", "{module_class: [MLPBlock]}", 1, 2, 12);
    pcs_xfer_seg_t *segs = NULL;
    size_t n = 0;
    assert_int_equal(pcs_plan_transfer(old, wider, 0, &segs, &n), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "has 77 elements in the checkpoint, 84 in this job"));
    assert_null(segs);
    assert_int_equal(pcs_plan_transfer(old, wider, 5, &segs, &n), PCS_ERR_INVALID_ARG);
    pcs_plan_free(old);
    pcs_plan_free(wider);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_world_strategy_and_wrap_pair_rebuilds_the_new_shards),
        cmocka_unit_test(test_placements_on_other_dims_reshard_both_ways),
        cmocka_unit_test(test_a_corrupt_checkpoint_plan_is_refused),
        cmocka_unit_test(test_another_model_is_refused_naming_the_parameter),
    };
    return cmocka_run_group_tests_name("reshard", tests, NULL, NULL);
}
