/* Unit tests of the planner (planner/plan*.c, model.c): the acceptance cases of
 * spec/fsdp-semantics.md §9 that concern layout, dtypes, factors, strategies and groups (cases
 * 1, 6-9, 11, 12, 20-23, the §2.1 table, §7 mesh), the MLP FQN scheme, errors with field paths,
 * hashing and estimates. Expected values are the spec's tables or computed by hand in comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/model_tree.h"
#include "pcs/pbtext.h"
#include "planner/plan.h"

typedef Pcs__V1__JobSpec job_t;

// ---- helpers ----------------------------------------------------------------------------------

static job_t *spec_of(const char *yaml)
{
    ProtobufCMessage *m = NULL;
    pcs_status_t rc = pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &m);
    if (rc != PCS_OK)
        fail_msg("yaml: %s\n%s", pcs_last_error(), yaml);
    return (job_t *)m;
}

static void spec_free(job_t *s)
{
    protobuf_c_message_free_unpacked(&s->base, NULL);
}

static Pcs__V1__Plan *plan_of(const char *yaml, uint32_t ws)
{
    job_t *s = spec_of(yaml);
    Pcs__V1__Plan *p = NULL;
    pcs_status_t rc = pcs_plan_build(s, ws, &p);
    if (rc != PCS_OK)
        fail_msg("plan: %s: %s", pcs_status_str(rc), pcs_last_error());
    spec_free(s);
    return p;
}

static void expect_error(const char *yaml, uint32_t ws, const char *needle)
{
    job_t *s = spec_of(yaml);
    Pcs__V1__Plan *p = NULL;
    pcs_status_t rc = pcs_plan_build(s, ws, &p);
    spec_free(s);
    assert_int_equal(rc, PCS_ERR_INVALID_ARG);
    assert_null(p);
    if (!strstr(pcs_last_error(), needle))
        fail_msg("error '%s' does not contain '%s'", pcs_last_error(), needle);
}

static const Pcs__V1__Unit *unit_at(const Pcs__V1__Plan *p, const char *path)
{
    for (size_t i = 0; i < p->n_units; i++)
        if (strcmp(p->units[i]->path, path) == 0)
            return p->units[i];
    fail_msg("no unit '%s'", path);
    return NULL;
}

static const Pcs__V1__CollectiveSpec *coll_of(const Pcs__V1__Unit *u, Pcs__V1__CollKind k,
                                              Pcs__V1__Phase ph)
{
    for (size_t i = 0; i < u->n_collectives; i++)
        if (u->collectives[i]->kind == k && u->collectives[i]->phase == ph)
            return u->collectives[i];
    return NULL;
}

/* A root-only explicit model with 1-D params of the given numels, planned on dp_shard = ws. */
static Pcs__V1__Plan *flat_plan(const uint64_t *numel, size_t n, uint32_t ws, const char *prec)
{
    char y[2048];
    int o = snprintf(y, sizeof y, "model: {explicit: [{path: '', class: Net, params: [");
    for (size_t i = 0; i < n; i++)
        o += snprintf(y + o, sizeof y - o, "%s{name: p%zu, shape: [%llu]}", i ? ", " : "", i,
                      (unsigned long long)numel[i]);
    snprintf(y + o, sizeof y - o, "]}]}\nmesh: [{dim: dp_shard, size: %u}]\n%s", ws,
             prec ? prec : "");
    return plan_of(y, ws);
}

#define COLL(x)  PCS__V1__COLL_KIND__COLL_KIND_##x
#define PHASE(x) PCS__V1__PHASE__PHASE_##x
#define DT(x)    PCS__V1__DTYPE__DTYPE_##x
#define OP(x)    PCS__V1__REDUCE_OP__REDUCE_OP_##x
#define GK(x)    PCS__V1__GROUP_KIND__GROUP_KIND_##x

// ---- layout: spec §2.1 table (case 1), cases 6 and 7 ---------------------------------------

static void test_chunk_layout_matches_spec_table(void **state)
{
    (void)state;
    static const struct {
        uint64_t n;
        uint32_t ws;
        uint64_t c;
        uint64_t sizes[8];
        uint64_t pads[8];
    } rows[] = {
        {10, 4, 3, {3, 3, 3, 1}, {0, 0, 0, 2}},
        {9, 4, 3, {3, 3, 3, 0}, {0, 0, 0, 3}},
        {5, 4, 2, {2, 2, 1, 0}, {0, 0, 1, 2}},
        {17, 8, 3, {3, 3, 3, 3, 3, 2, 0, 0}, {0, 0, 0, 0, 0, 1, 3, 3}},
        {100, 3, 34, {34, 34, 32}, {0, 0, 2}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        Pcs__V1__Plan *p = flat_plan(&rows[i].n, 1, rows[i].ws, NULL);
        const Pcs__V1__Unit *u = p->units[0];
        assert_int_equal(u->flat_numel, rows[i].n);
        assert_int_equal(u->shard_numel, rows[i].c);
        assert_int_equal(u->padded_numel, rows[i].c * rows[i].ws);
        for (uint32_t r = 0; r < rows[i].ws; r++) {
            uint64_t b, e;
            pcs_plan_shard_range(u, r, &b, &e);
            assert_int_equal(e - b, rows[i].sizes[r]);
            /* pad per rank = c - unpadded size, the table's last column */
            assert_int_equal(u->shard_numel - (e - b), rows[i].pads[r]);
            if (e > b)
                assert_int_equal(b, r * rows[i].c);
        }
        pcs_plan_free(p);
    }
}

static void test_fsdp1_flat_shard_case6(void **state)
{
    (void)state;
    uint64_t numel[] = {8, 5};
    Pcs__V1__Plan *p = flat_plan(numel, 2, 4, NULL);
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->numel, 13);
    assert_int_equal(u->flat_numel, 13);
    assert_int_equal(u->shard_numel, 4);
    assert_int_equal(u->padded_numel, 16);
    static const uint64_t want[4][2] = {{0, 4}, {4, 8}, {8, 12}, {12, 13}};
    for (uint32_t r = 0; r < 4; r++) {
        uint64_t b, e;
        pcs_plan_shard_range(u, r, &b, &e);
        assert_int_equal(b, want[r][0]);
        assert_int_equal(e, want[r][1]);
    }
    pcs_plan_free(p);
}

static void test_aligned_flat_param_case7(void **state)
{
    (void)state;
    uint64_t numel[] = {10, 3};
    /* fp32: 10, pad 2, 3, pad 1 -> 16, c = 4 */
    Pcs__V1__Plan *p = flat_plan(numel, 2, 4, NULL);
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->align_numel, 4);
    assert_int_equal(u->params[0]->offset, 0);
    assert_int_equal(u->params[1]->offset, 12);
    assert_int_equal(u->flat_numel, 15);
    assert_int_equal(u->padded_numel, 16);
    assert_int_equal(u->shard_numel, 4);
    pcs_plan_free(p);
    /* param_dtype bf16 (aligned 8): 10, pad 6, 3, pad 1 -> 20, c = 5 */
    p = flat_plan(numel, 2, 4, "precision: {param_dtype: bf16}");
    u = p->units[0];
    assert_int_equal(u->align_numel, 8);
    assert_int_equal(u->params[1]->offset, 16);
    assert_int_equal(u->flat_numel, 19);
    assert_int_equal(u->padded_numel, 20);
    assert_int_equal(u->shard_numel, 5);
    assert_int_equal(u->param_dtype, DT(BF16));
    assert_int_equal(u->master_dtype, DT(FP32));
    pcs_plan_free(p);
}

// ---- FSDP2 per-parameter layout: cases 2, 4 and 5 --------------------------------------------

static Pcs__V1__Plan *per_param_plan(const char *params, uint32_t ws, const char *extra)
{
    char y[1024];
    snprintf(y, sizeof y,
             "model: {explicit: [{path: '', class: Net, params: [%s]}]}\n"
             "mesh: [{dim: dp_shard, size: %u}]\nshard_layout: per_param\n%s",
             params, ws, extra ? extra : "");
    return plan_of(y, ws);
}

static void test_fsdp2_param_shard_case2(void **state)
{
    (void)state;
    /* W (10, 3), ws 4: 3 rows a rank; rank 3 holds row 9 (sharded (1, 3), padded (3, 3)) */
    Pcs__V1__Plan *p = per_param_plan("{name: w, shape: [10, 3]}", 4, NULL);
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->layout, PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM);
    assert_int_equal(u->params[0]->shard_rows, 3);
    assert_int_equal(u->shard_numel, 9);
    pcs_plan_piece_t pc[1];
    assert_int_equal(pcs_plan_shard_pieces(u, 0, pc), 1);
    assert_int_equal(pc[0].elem, 0); /* rows 0-2 */
    assert_int_equal(pc[0].len, 9);
    assert_int_equal(pcs_plan_shard_pieces(u, 3, pc), 1);
    assert_int_equal(pc[0].elem, 27); /* row 9; rows 1-2 of the padded (3, 3) are padding */
    assert_int_equal(pc[0].len, 3);
    assert_int_equal(pc[0].shard_off, 0);
    pcs_plan_free(p);
    /* (3, 5), ws 4: one row a rank, rank 3 holds nothing (sharded (0, 5), padded (1, 5)) */
    p = per_param_plan("{name: w, shape: [3, 5]}", 4, NULL);
    u = p->units[0];
    assert_int_equal(u->params[0]->shard_rows, 1);
    assert_int_equal(u->shard_numel, 5);
    assert_int_equal(pcs_plan_shard_pieces(u, 2, pc), 1);
    assert_int_equal(pc[0].elem, 10);
    assert_int_equal(pcs_plan_shard_pieces(u, 3, pc), 0);
    /* the gathered [4, 5] fits the unsharded buffer, which keeps the flat offsets */
    assert_true(u->padded_numel >= 20 && u->padded_numel % 4 == 0);
    assert_int_equal(u->params[0]->offset, 0);
    pcs_plan_free(p);
}

/* Group {W (10, 3), b (10)}, ws 4, bf16: rank r's all-gather input is W's chunk r (9 elements)
 * then b's (3), 12 in all; the gathered [4, 12] copied out by the pieces rebuilds W and b, and the
 * reduce-scatter input built from gradients by the same pieces has row r = W rows 3r..3r+2 (zero
 * past row 9) then b[3r..3r+2] (zero past 9). */
static void test_fsdp2_all_gather_and_reduce_scatter_packing_cases_4_5(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = per_param_plan("{name: w, shape: [10, 3]}, {name: b, shape: [10]}", 4,
                                      "precision: {param_dtype: bf16}");
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->param_dtype, DT(BF16));
    assert_int_equal(u->shard_numel, 12);
    assert_int_equal(u->params[0]->shard_offset, 0);
    assert_int_equal(u->params[1]->shard_offset, 9);
    assert_int_equal(u->params[1]->shard_rows, 3);
    const Pcs__V1__CollectiveSpec *ag = coll_of(u, COLL(ALL_GATHER), PHASE(FORWARD));
    const Pcs__V1__CollectiveSpec *rs = coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP));
    assert_non_null(ag);
    assert_non_null(rs);
    assert_int_equal(ag->count, 12); /* per rank; the output is 48 */
    assert_int_equal(ag->dtype, DT(BF16));
    assert_int_equal(rs->count, 12);
    /* the flat (unsharded) buffer: W at 0, b at 32 (bf16: 16-byte alignment is 8 elements) */
    uint64_t woff = u->params[0]->offset, boff = u->params[1]->offset;
    assert_int_equal(woff, 0);
    assert_int_equal(boff, 32);
    float flat[64], gathered[48], rebuilt[64];
    for (int i = 0; i < 64; i++)
        flat[i] = rebuilt[i] = -1;
    for (int i = 0; i < 30; i++)
        flat[woff + i] = (float)(100 + i);
    for (int i = 0; i < 10; i++)
        flat[boff + i] = (float)(500 + i);
    for (int i = 0; i < 48; i++)
        gathered[i] = 0; /* padding */
    pcs_plan_piece_t pc[2];
    for (uint32_t r = 0; r < 4; r++) { /* each rank's all-gather input, from its pieces */
        size_t n = pcs_plan_shard_pieces(u, r, pc);
        for (size_t k = 0; k < n; k++)
            memcpy(gathered + r * 12 + pc[k].shard_off,
                   flat + u->params[pc[k].param]->offset + pc[k].elem, pc[k].len * sizeof(float));
    }
    for (uint32_t r = 0; r < 4; r++)
        for (int j = 0; j < 12; j++) {
            /* row r: W rows 3r..3r+2 (row-major), then b[3r..3r+2]; zero past the end */
            int row = j < 9 ? 3 * (int)r + j / 3 : 3 * (int)r + j - 9;
            float want = row >= 10 ? 0.f
                         : j < 9   ? (float)(100 + 9 * (int)r + j)
                                   : (float)(500 + row);
            assert_true(gathered[r * 12 + j] == want);
        }
    /* copy-out: every parameter rebuilt exactly */
    for (uint32_t r = 0; r < 4; r++) {
        size_t n = pcs_plan_shard_pieces(u, r, pc);
        for (size_t k = 0; k < n; k++)
            memcpy(rebuilt + u->params[pc[k].param]->offset + pc[k].elem,
                   gathered + r * 12 + pc[k].shard_off, pc[k].len * sizeof(float));
    }
    assert_memory_equal(rebuilt + woff, flat + woff, 30 * sizeof(float));
    assert_memory_equal(rebuilt + boff, flat + boff, 10 * sizeof(float));
    /* case 5: rank 3's W-grad is the first 3 output elements (row 9), its b-grad element 9 */
    assert_int_equal(pcs_plan_shard_pieces(u, 3, pc), 2);
    assert_int_equal(pc[0].param, 0);
    assert_int_equal(pc[0].shard_off, 0);
    assert_int_equal(pc[0].len, 3);
    assert_int_equal(pc[1].param, 1);
    assert_int_equal(pc[1].elem, 9);
    assert_int_equal(pc[1].shard_off, 9);
    assert_int_equal(pc[1].len, 1);
    pcs_plan_free(p);
}

/* Case 3: Shard(1) of (8, 6) at ws 4 is refused (6 % 4, FSDP2's NotImplementedError); (8, 8)
 * is accepted: rank r holds columns [2r, 2r+2) of every row, 8 runs of 2 back to back. */
static void test_fsdp2_shard_dim1_case3(void **state)
{
    (void)state;
    job_t *s = spec_of("model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8, "
                       "6]}]}]}\nmesh: [{dim: dp_shard, size: 4}]\nshard_layout: per_param\n"
                       "shard_placements: [{param: w, dim: 1}]\n");
    Pcs__V1__Plan *p = NULL;
    assert_int_equal(pcs_plan_build(s, 4, &p), PCS_ERR_INVALID_ARG);
    spec_free(s);
    if (!strstr(pcs_last_error(), "shard_placements[0]: w dim 1 has size 6, not a multiple of "
                                  "the shard group size 4"))
        fail_msg("%s", pcs_last_error());
    p = per_param_plan("{name: w, shape: [8, 8]}, {name: b, shape: [8]}", 4,
                       "shard_placements: [{param: w, dim: 1}]\n");
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->params[0]->shard_dim, 1);
    assert_int_equal(u->params[0]->shard_rows, 2);
    assert_int_equal(u->params[1]->shard_dim, 0);
    assert_int_equal(u->params[1]->shard_offset, 16);
    assert_int_equal(u->shard_numel, 18);
    pcs_plan_piece_t pc[2];
    for (uint32_t r = 0; r < 4; r++) {
        assert_int_equal(pcs_plan_shard_pieces(u, r, pc), 2);
        assert_int_equal(pc[0].elem, 2 * r);
        assert_int_equal(pc[0].len, 2);
        assert_int_equal(pc[0].count, 8);
        assert_int_equal(pc[0].stride, 8);
        assert_int_equal(pc[0].shard_off, 0);
        /* w[5][2r + 1] is the 12th element of rank r's chunk */
        uint32_t sh;
        uint64_t off, run;
        pcs_plan_locate(u, 0, 5 * 8 + 2 * r + 1, &sh, &off, &run);
        assert_int_equal(sh, r);
        assert_int_equal(off, 11);
        assert_int_equal(run, 1);
    }
    pcs_plan_free(p);
    /* a placement matching nothing, or a dim the parameter lacks, is an error */
    static const struct {
        const char *placements, *want;
    } bad[] = {{"[{param: v, dim: 0}]", "shard_placements[0].param: no parameter matches 'v'"},
               {"[{param: 'w*', dim: 0}, {param: w, dim: 1}]",
                "shard_placements[1]: w has 1 dims, no dim 1 to shard on"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char y[512];
        snprintf(y, sizeof y,
                 "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8]}]}]}\n"
                 "mesh: [{dim: dp_shard, size: 2}]\nshard_layout: per_param\n"
                 "shard_placements: %s\n",
                 bad[i].placements);
        s = spec_of(y);
        assert_int_equal(pcs_plan_build(s, 2, &p), PCS_ERR_INVALID_ARG);
        spec_free(s);
        if (!strstr(pcs_last_error(), bad[i].want))
            fail_msg("%s", pcs_last_error());
    }
}

/* A plan comes from the network or a file: pcs_plan_check_layout (run by
 * pcs_plan_check_runnable, hence by the coordinator, pcs_runtime_create and pcs_train) refuses
 * every per_param field that would put a piece outside its shard or buffer. */
static void test_check_layout_refuses_inconsistent_per_param_plans(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = per_param_plan("{name: w, shape: [10, 3]}, {name: b, shape: [10]}", 4,
                                      "shard_placements: [{param: w, dim: 0}]\n");
    Pcs__V1__Unit *u = p->units[0];
    Pcs__V1__ParamSlot *w = u->params[0], *b = u->params[1];
    assert_int_equal(pcs_plan_check_layout(p), PCS_OK);
    assert_int_equal(pcs_plan_check_runnable(p), PCS_OK);
    struct {
        uint64_t *field, value;
        const char *want;
    } muts[] = {
        {&w->shard_rows, 0, "shard_rows does not chunk its rows"},
        {&w->shard_rows, 2, "shard_rows does not chunk its rows"}, /* 2 x 4 < 10 rows */
        {&b->shard_offset, 5, "chunk lies outside the shard or overlaps"},
        {&b->shard_offset, 10, "chunk lies outside the shard or overlaps"},
        {&b->shard_offset, UINT64_MAX - 1, "chunk lies outside the shard or overlaps"},
        {&u->shard_numel, 11, "chunk lies outside the shard or overlaps"},
        {&u->shard_numel, UINT64_MAX / 2, "does not fit the padded size"},
        {&w->numel, 31, "shape, size or offset is inconsistent"},
        {&b->offset, UINT64_MAX - 3, "shape, size or offset is inconsistent"},
        {&u->flat_numel, 1000, "flat size beyond the padded size"},
    };
    for (size_t i = 0; i < sizeof muts / sizeof muts[0]; i++) {
        uint64_t keep = *muts[i].field;
        *muts[i].field = muts[i].value;
        assert_int_equal(pcs_plan_check_runnable(p), PCS_ERR_INVALID_ARG);
        if (!strstr(pcs_last_error(), muts[i].want) || !strstr(pcs_last_error(), "unit 0"))
            fail_msg("mutation %zu: '%s' lacks '%s'", i, pcs_last_error(), muts[i].want);
        *muts[i].field = keep;
    }
    w->shard_dim = 2; /* w has 2 dims */
    assert_int_equal(pcs_plan_check_layout(p), PCS_ERR_INVALID_ARG);
    w->shard_dim = 1; /* 3 columns do not split evenly over 4 */
    assert_int_equal(pcs_plan_check_layout(p), PCS_ERR_INVALID_ARG);
    w->shard_dim = 0;
    u->shard_group_size = 1; /* per_param means nothing without a shard group */
    assert_int_equal(pcs_plan_check_layout(p), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "per_param layout without a shard group"));
    u->shard_group_size = 4;
    u->layout = (Pcs__V1__ShardLayout)7;
    assert_int_equal(pcs_plan_check_layout(p), PCS_ERR_INVALID_ARG);
    u->layout = PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
    assert_int_equal(pcs_plan_check_layout(p), PCS_OK);
    pcs_plan_free(p);
}

/* Case 18's variant (param fp32, reduce fp16): with training.eval_backward the plan carries the
 * reductions of an eval-mode backward in fp32 (FSDP1 reduces in full precision in eval), with
 * fp32's ops (AVG, no pre/post divide), beside the fp16 training ones; HSDP gets both legs; a job
 * whose reductions are fp32 already, or that did not ask, gets none; the estimate makes room. */
static void test_eval_backward_plans_full_precision_reductions(void **state)
{
    (void)state;
#define EVAL_BWD_FMT                                                                               \
    "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8]}]}]}\n"               \
    "precision: {%s}\nmesh: [%s]\n"                                                                \
    "training: {steps: 1, micro_batch_size: 1, optimizer: {sgd: {lr: 1}},\n"                       \
    "           full_precision_eval: true, eval_backward: %s}\n"
    char y[1024];
    snprintf(y, sizeof y, EVAL_BWD_FMT, "reduce_dtype: fp16", "{dim: dp_shard, size: 4}", "true");
    Pcs__V1__Plan *p = plan_of(y, 4);
    const Pcs__V1__Unit *u = p->units[0];
    assert_true(p->eval_backward);
    const Pcs__V1__CollectiveSpec *rs = coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP));
    assert_non_null(rs);
    assert_int_equal(rs->dtype, DT(FP16));
    assert_int_equal(rs->reduction->op, OP(SUM));
    assert_int_equal(u->n_eval_collectives, 1);
    const Pcs__V1__CollectiveSpec *e = u->eval_collectives[0];
    assert_int_equal(e->kind, COLL(REDUCE_SCATTER));
    assert_int_equal(e->phase, PHASE(BACKWARD));
    assert_int_equal(e->dtype, DT(FP32));
    assert_int_equal(e->reduction->op, OP(AVG));
    assert_true(e->reduction->pre_divide == 1 && e->reduction->post_divide == 1);
    assert_int_equal(e->count, u->shard_numel);
    Pcs__V1__RankEstimate with, without;
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &with), PCS_OK);
    pcs_plan_free(p);
    snprintf(y, sizeof y, EVAL_BWD_FMT, "reduce_dtype: fp16", "{dim: dp_shard, size: 4}", "false");
    p = plan_of(y, 4);
    assert_false(p->eval_backward);
    assert_int_equal(p->units[0]->n_eval_collectives, 0);
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &without), PCS_OK);
    /* fp32 gradients beside the fp32 parameters, and an fp32-wide reduce-scatter output */
    assert_true(with.total_bytes > without.total_bytes);
    assert_true(with.staging_bytes > without.staging_bytes);
    pcs_plan_free(p);
    /* HSDP (2 x 2): the reduce-scatter and the all-reduce across replicas, both fp32 */
    snprintf(y, sizeof y, EVAL_BWD_FMT, "param_dtype: bf16",
             "{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 2}", "true");
    job_t *sp = spec_of(y);
    sp->strategy = PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD;
    assert_int_equal(pcs_plan_build(sp, 4, &p), PCS_OK);
    spec_free(sp);
    u = p->units[0];
    assert_int_equal(u->n_eval_collectives, 2);
    assert_int_equal(u->eval_collectives[0]->kind, COLL(REDUCE_SCATTER));
    assert_int_equal(u->eval_collectives[1]->kind, COLL(ALL_REDUCE));
    assert_int_equal(u->eval_collectives[1]->group, GK(REPLICATE));
    for (int k = 0; k < 2; k++)
        assert_int_equal(u->eval_collectives[k]->dtype, DT(FP32));
    pcs_plan_free(p);
    /* everything fp32 already: nothing to add */
    snprintf(y, sizeof y, EVAL_BWD_FMT, "", "{dim: dp_shard, size: 4}", "true");
    p = plan_of(y, 4);
    assert_int_equal(p->units[0]->n_eval_collectives, 0);
    pcs_plan_free(p);
    /* a world of one has no collective, but an eval backward still holds fp32 gradients */
    for (int k = 0; k < 2; k++) {
        snprintf(y, sizeof y, EVAL_BWD_FMT, "param_dtype: bf16", "{dim: dp_shard, size: 1}",
                 k ? "true" : "false");
        p = plan_of(y, 1);
        assert_int_equal(pcs_plan_rank_estimate(p, 0, k ? &with : &without), PCS_OK);
        pcs_plan_free(p);
    }
    assert_true(with.total_bytes >= without.total_bytes + 8 * 4);
}

static void test_per_param_layout_only_where_sharded(void **state)
{
    (void)state;
    /* flat by default; per_param with no_shard (one-rank shard groups) stays flat */
    uint64_t numel[] = {10, 3};
    Pcs__V1__Plan *p = flat_plan(numel, 2, 4, NULL);
    assert_int_equal(p->units[0]->layout, PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_FLAT);
    pcs_plan_free(p);
    p = per_param_plan("{name: w, shape: [10, 3]}", 4, "strategy: no_shard\n");
    assert_int_equal(p->units[0]->layout, PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_FLAT);
    assert_int_equal(p->units[0]->params[0]->shard_rows, 0);
    pcs_plan_free(p);
}

// ---- factors and ops: cases 8 and 9 -------------------------------------------------------

static void test_divide_factors_match_spec_table_case8(void **state)
{
    (void)state;
    static const double t[][3] = {{1, 1, 1},   {2, 2, 1},  {3, 2, 1.5},  {4, 2, 2},    {5, 2, 2.5},
                                  {6, 4, 1.5}, {8, 4, 2},  {12, 4, 3},   {16, 4, 4},   {24, 8, 3},
                                  {32, 8, 4},  {64, 8, 8}, {128, 16, 8}, {256, 16, 16}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        double pre, post;
        pcs_plan_divide_factors(t[i][0], &pre, &post);
        assert_true(pre == t[i][1]);
        assert_true(post == t[i][2]);
    }
}

static void test_fsdp2_reduce_op_choice_case9(void **state)
{
    (void)state;
    Pcs__V1__ReduceOp rs, ar;
    double premul, pre, post;
    /* dp = 4: fp32 and bf16 -> AVG/AVG, no division */
    pcs_plan_reduce_ops(PCS_DTYPE_FP32, 4, 1, 0, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(AVG));
    assert_int_equal(ar, OP(AVG));
    assert_true(pre == 1 && post == 1);
    pcs_plan_reduce_ops(PCS_DTYPE_BF16, 4, 1, 0, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(AVG));
    /* dp = 1 -> SUM, no division */
    pcs_plan_reduce_ops(PCS_DTYPE_FP32, 1, 1, 0, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(SUM));
    assert_true(pre == 1 && post == 1);
    /* fp16 dp = 8 -> pre 4, post 2, SUM */
    pcs_plan_reduce_ops(PCS_DTYPE_FP16, 8, 1, 0, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(SUM));
    assert_true(pre == 4 && post == 2);
    /* factor 4 with RS size 4 (fp32) -> RS AVG */
    pcs_plan_reduce_ops(PCS_DTYPE_FP32, 4, 1, 4, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(AVG));
    assert_int_equal(ar, OP(SUM));
    /* factor 8 with RS size 4 -> PREMUL_SUM(1/8) */
    pcs_plan_reduce_ops(PCS_DTYPE_FP32, 4, 1, 8, false, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(PREMUL_SUM));
    assert_true(premul == 0.125);
    /* force_sum fp32 dp = 4 -> SUM with post 4 */
    pcs_plan_reduce_ops(PCS_DTYPE_FP32, 4, 1, 0, true, &rs, &ar, &premul, &pre, &post);
    assert_int_equal(rs, OP(SUM));
    assert_true(pre == 1 && post == 4);
    /* HSDP fp16 2 x 4: factors over dp = 8 */
    pcs_plan_reduce_ops(PCS_DTYPE_FP16, 4, 2, 0, false, &rs, &ar, &premul, &pre, &post);
    assert_true(pre == 4 && post == 2);
}

/* training.gradient_divide_factor (FSDP2 set_gradient_divide_factor) reaches the plan: a world of
 * one has no collective but a local_reduction (fp32: PREMUL_SUM(1/4); fp16: pre 2 x post 2 = 4);
 * no factor, no local divide; NO_SHARD over 2 ranks folds the size-1 RS leg's PREMUL_SUM(1/4)
 * into the all-reduce (foreach_reduce divides before the all-reduce); a bad factor is refused. */
static void test_custom_divide_factor_reaches_world_of_one_and_no_shard(void **state)
{
    (void)state;
    static const uint64_t n[1] = {64};
    const char *f4 = "training: {gradient_divide_factor: 4}\n";
    Pcs__V1__Plan *p = flat_plan(n, 1, 1, f4);
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->n_collectives, 0);
    assert_non_null(u->local_reduction);
    assert_int_equal(u->local_reduction->op, OP(PREMUL_SUM));
    assert_true(u->local_reduction->premul == 0.25);
    assert_true(u->local_reduction->pre_divide == 1 && u->local_reduction->post_divide == 1);
    pcs_plan_free(p);

    p = flat_plan(n, 1, 1,
                  "precision: {param_dtype: fp16}\ntraining: {gradient_divide_factor: 4}\n");
    u = p->units[0];
    assert_non_null(u->local_reduction);
    assert_int_equal(u->local_reduction->op, OP(SUM));
    assert_true(u->local_reduction->pre_divide == 2 && u->local_reduction->post_divide == 2);
    pcs_plan_free(p);

    p = flat_plan(n, 1, 1, NULL);
    assert_null(p->units[0]->local_reduction);
    pcs_plan_free(p);

    p = plan_of("model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [64]}]}]}\n"
                "strategy: no_shard\nmesh: [{dim: dp_shard, size: 2}]\n"
                "training: {gradient_divide_factor: 4}\n",
                2);
    u = p->units[0];
    const Pcs__V1__CollectiveSpec *ar = coll_of(u, COLL(ALL_REDUCE), PHASE(STEP));
    assert_non_null(ar);
    assert_int_equal(ar->reduction->op, OP(PREMUL_SUM));
    assert_true(ar->reduction->premul == 0.25);
    assert_null(u->local_reduction);
    pcs_plan_free(p);

    expect_error("model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8]}]}]}\n"
                 "training: {gradient_divide_factor: 0}\n",
                 1, "training.gradient_divide_factor");
}

// ---- precision: cases 11 and 12 -----------------------------------------------------------

static void resolve(pcs_dtype_t master, pcs_dtype_t param, pcs_dtype_t reduce, pcs_precision_t *out)
{
    pcs_precision_in_t in = {.master = master,
                             .param = param,
                             .reduce = reduce,
                             .cast_forward_inputs = true,
                             .mixed_precision = true};
    pcs_plan_resolve_precision(&in, out);
}

static void test_fsdp1_dtype_inference_case11(void **state)
{
    (void)state;
    static const struct {
        pcs_dtype_t orig, param, reduce, want_compute, want_reduce;
    } t[] = {
        {PCS_DTYPE_FP32, PCS_DTYPE_NONE, PCS_DTYPE_NONE, PCS_DTYPE_FP32, PCS_DTYPE_FP32},
        {PCS_DTYPE_FP32, PCS_DTYPE_FP16, PCS_DTYPE_NONE, PCS_DTYPE_FP16, PCS_DTYPE_FP16},
        {PCS_DTYPE_FP32, PCS_DTYPE_NONE, PCS_DTYPE_FP16, PCS_DTYPE_FP32, PCS_DTYPE_FP16},
        {PCS_DTYPE_FP32, PCS_DTYPE_FP16, PCS_DTYPE_FP32, PCS_DTYPE_FP16, PCS_DTYPE_FP32},
        {PCS_DTYPE_FP16, PCS_DTYPE_FP32, PCS_DTYPE_NONE, PCS_DTYPE_FP32, PCS_DTYPE_FP32},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        pcs_precision_t pr;
        resolve(t[i].orig, t[i].param, t[i].reduce, &pr);
        assert_int_equal(pr.compute, t[i].want_compute);
        assert_int_equal(pr.reduce, t[i].want_reduce);
        assert_int_equal(pr.master, t[i].orig);
        assert_int_equal(pr.grad, t[i].orig); /* params and grads full precision after bwd */
    }
}

static void test_fsdp2_clamp_case12(void **state)
{
    (void)state;
    pcs_precision_t pr;
    /* (bf16, bf16): reduce clamped to None -> RS in bf16 */
    resolve(PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_BF16, &pr);
    assert_int_equal(pr.reduce, PCS_DTYPE_BF16);
    assert_int_equal(pr.accum, PCS_DTYPE_BF16);
    /* (bf16, fp32) -> RS fp32, accumulate in fp32 (case 17) */
    resolve(PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP32, &pr);
    assert_int_equal(pr.compute, PCS_DTYPE_BF16);
    assert_int_equal(pr.reduce, PCS_DTYPE_FP32);
    assert_int_equal(pr.accum, PCS_DTYPE_FP32);
    /* (fp32, bf16) -> param None (all-gather fp32), RS bf16 */
    resolve(PCS_DTYPE_FP32, PCS_DTYPE_FP32, PCS_DTYPE_BF16, &pr);
    assert_int_equal(pr.compute, PCS_DTYPE_FP32);
    assert_int_equal(pr.reduce, PCS_DTYPE_BF16);
    /* (bf16, None) -> bf16: pcs's documented rule (FSDP2 <= 2.14) */
    resolve(PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_NONE, &pr);
    assert_int_equal(pr.reduce, PCS_DTYPE_BF16);
    assert_non_null(strstr(PCS_PLAN_REDUCE_DTYPE_RULE, "param_dtype when param_dtype is set"));
    /* non-float policy values are never applied (no cast) */
    resolve(PCS_DTYPE_FP32, PCS_DTYPE_INT64, PCS_DTYPE_INT64, &pr);
    assert_int_equal(pr.compute, PCS_DTYPE_FP32);
    assert_int_equal(pr.reduce, PCS_DTYPE_FP32);
    /* mixed precision off ignores the policy; keep_low_precision_grads -> param dtype grads */
    pcs_precision_in_t in = {.master = PCS_DTYPE_FP32,
                             .param = PCS_DTYPE_FP16,
                             .reduce = PCS_DTYPE_FP16,
                             .keep_low_precision_grads = true,
                             .mixed_precision = true};
    pcs_plan_resolve_precision(&in, &pr);
    assert_int_equal(pr.grad, PCS_DTYPE_FP16);
    in.mixed_precision = false;
    pcs_plan_resolve_precision(&in, &pr);
    assert_int_equal(pr.compute, PCS_DTYPE_FP32);
    assert_int_equal(pr.reduce, PCS_DTYPE_FP32);
    assert_int_equal(pr.grad, PCS_DTYPE_FP32);
    assert_false(pr.cast_forward_inputs);
}

// ---- units, strategies, groups -------------------------------------------------------------

#define MLP_BN                                                                                     \
    "model: {mlp: {input_dim: 8, hidden_dims: [16, 16, 16], output_dim: 4, norm: batchnorm}}\n"

static void test_batchnorm_units_have_mixed_precision_off_case20(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(MLP_BN "wrap: {size_based: {min_num_params: 100000}}\n"
                                      "precision: {param_dtype: bf16, buffer_dtype: bf16}\n"
                                      "mesh: [{dim: dp_shard, size: 2}]",
                               0);
    uint32_t bn_units = 0;
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        if (strcmp(u->module_class, "BatchNorm1d") != 0) {
            assert_true(u->mixed_precision);
            continue;
        }
        bn_units++;
        assert_false(u->mixed_precision);
        assert_int_equal(u->param_dtype, DT(FP32));
        assert_int_equal(u->reduce_dtype, DT(FP32));
        assert_int_equal(u->n_buffers, 3);
        assert_int_equal(u->buffers[0]->run_dtype, DT(FP32)); /* running stats stay fp32 */
        assert_int_equal(u->buffers[2]->dtype, DT(INT64));
        assert_int_equal(u->buffers[2]->run_dtype, DT(INT64));
    }
    assert_int_equal(bn_units, 3); /* == number of BatchNorm modules */
    /* the root unit keeps the original config */
    assert_int_equal(unit_at(p, "")->param_dtype, DT(BF16));
    pcs_plan_free(p);

    /* [none] disables: BatchNorm params stay in their block's unit */
    p = plan_of(MLP_BN "wrap: {module_class: [MLPBlock], ignored_module_classes: [none]}\n"
                       "precision: {param_dtype: bf16}\nmesh: [{dim: dp_shard, size: 2}]",
                0);
    assert_int_equal(p->n_units, 4);
    assert_int_equal(unit_at(p, "layers.1")->n_params, 4);
    assert_int_equal(unit_at(p, "layers.1")->n_buffers, 3);
    pcs_plan_free(p);
}

static void test_root_kept_unsharded_children_resharded_case21(void **state)
{
    (void)state;
    const char *base = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                       "wrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 4}]\n";
    char y[512];
    static const struct {
        const char *extra;
        bool child_raf, child_rab;
    } t[] = {
        {"strategy: full_shard", true, true},
        {"strategy: shard_grad_op", false, false},
        {"reshard_after_forward: false", false, true},
        {"strategy: shard_grad_op\nreshard_after_forward: true", true, false},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        snprintf(y, sizeof y, "%s%s", base, t[i].extra);
        Pcs__V1__Plan *p = plan_of(y, 0);
        assert_int_equal(p->n_units, 3);
        const Pcs__V1__Unit *root = unit_at(p, "");
        assert_true(root->is_root);
        assert_false(root->reshard_after_forward);
        for (int k = 0; k < 2; k++) {
            const Pcs__V1__Unit *u = unit_at(p, k ? "layers.1" : "layers.0");
            assert_int_equal(u->reshard_after_forward, t[i].child_raf);
            assert_int_equal(u->reshard_after_backward, t[i].child_rab);
            /* a backward all-gather exists iff the unit resharded after forward */
            assert_int_equal(coll_of(u, COLL(ALL_GATHER), PHASE(BACKWARD)) != NULL, t[i].child_raf);
        }
        assert_null(coll_of(root, COLL(ALL_GATHER), PHASE(BACKWARD)));
        pcs_plan_free(p);
    }
}

static void test_reshard_after_forward_int_case22(void **state)
{
    (void)state;
    const char *base = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                       "wrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 4}]\n"
                       "precision: {param_dtype: bf16}\n";
    char y[512];
    snprintf(y, sizeof y, "%sreshard_after_forward: 2", base);
    Pcs__V1__Plan *p = plan_of(y, 0);
    const Pcs__V1__Unit *u = unit_at(p, "layers.0");
    assert_true(u->reshard_after_forward);
    assert_int_equal(u->reshard_group_size, 2);
    const Pcs__V1__CollectiveSpec *bag = coll_of(u, COLL(ALL_GATHER), PHASE(BACKWARD));
    assert_non_null(bag);
    assert_int_equal(bag->group, GK(RESHARD));
    assert_int_equal(bag->group_size, 2);
    assert_int_equal(bag->count, u->padded_numel / 2); /* each rank keeps 1/2 */
    assert_int_equal(bag->dtype, DT(BF16));
    uint32_t ranks[4], n = 4, me = 99;
    assert_int_equal(pcs_plan_group_ranks(p, GK(RESHARD), 1, ranks, &n, &me), PCS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ranks[0], 0);
    assert_int_equal(ranks[1], 1);
    assert_int_equal(me, 1);
    n = 4;
    assert_int_equal(pcs_plan_group_ranks(p, GK(RESHARD), 2, ranks, &n, &me), PCS_OK);
    assert_int_equal(ranks[0], 2);
    assert_int_equal(ranks[1], 3);
    assert_int_equal(me, 0);
    pcs_plan_free(p);

    snprintf(y, sizeof y, "%sreshard_after_forward: 3", base);
    expect_error(y, 0,
                 "reshard_after_forward.group_size: 3 does not divide the shard group size 4");

    snprintf(y, sizeof y, "%sreshard_after_forward: 1", base); /* behaves as False */
    p = plan_of(y, 0);
    assert_false(unit_at(p, "layers.0")->reshard_after_forward);
    pcs_plan_free(p);

    snprintf(y, sizeof y, "%sreshard_after_forward: 4", base); /* behaves as True */
    p = plan_of(y, 0);
    u = unit_at(p, "layers.0");
    assert_true(u->reshard_after_forward);
    assert_int_equal(u->reshard_group_size, 0);
    assert_int_equal(coll_of(u, COLL(ALL_GATHER), PHASE(BACKWARD))->group, GK(SHARD));
    n = 4;
    assert_int_equal(pcs_plan_group_ranks(p, GK(RESHARD), 0, ranks, &n, &me), PCS_ERR_NOT_FOUND);
    pcs_plan_free(p);
}

static void test_hsdp_groups_and_averaging_case23(void **state)
{
    (void)state;
    const char *y = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                    "wrap: {module_class: [MLPBlock]}\nstrategy: hybrid_shard\n"
                    "precision: {param_dtype: bf16, reduce_dtype: fp32}\n"
                    "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 4}]";
    Pcs__V1__Plan *p = plan_of(y, 8);
    assert_int_equal(p->strategy, PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD);
    assert_int_equal(p->dp_size, 8);
    uint32_t ranks[8], n, me;
    for (uint32_t r = 0; r < 8; r++) {
        n = 8;
        assert_int_equal(pcs_plan_group_ranks(p, GK(SHARD), r, ranks, &n, &me), PCS_OK);
        assert_int_equal(n, 4);
        for (uint32_t i = 0; i < 4; i++)
            assert_int_equal(ranks[i], (r / 4) * 4 + i); /* {0-3}, {4-7} */
        assert_int_equal(me, r % 4);
        n = 8;
        assert_int_equal(pcs_plan_group_ranks(p, GK(REPLICATE), r, ranks, &n, &me), PCS_OK);
        assert_int_equal(n, 2);
        assert_int_equal(ranks[0], r % 4); /* {i, i+4} */
        assert_int_equal(ranks[1], r % 4 + 4);
    }
    const Pcs__V1__Unit *u = unit_at(p, "layers.1");
    const Pcs__V1__CollectiveSpec *rs = coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP));
    const Pcs__V1__CollectiveSpec *ar = coll_of(u, COLL(ALL_REDUCE), PHASE(STEP));
    assert_non_null(rs);
    assert_non_null(ar);
    /* mean over all 8 ranks: AVG over 4 shards then AVG over 2 replicas */
    assert_int_equal(rs->dtype, DT(FP32));
    assert_int_equal(rs->reduction->op, OP(AVG));
    assert_int_equal(rs->group_size, 4);
    assert_int_equal(ar->reduction->op, OP(AVG));
    assert_int_equal(ar->group, GK(REPLICATE));
    assert_int_equal(ar->group_size, 2);
    assert_int_equal(ar->count, u->shard_numel);
    pcs_plan_free(p);

    /* fp16 reduce: pre-divide 4 on the RS input, post-divide 2 on the AR output (dp = 8) */
    p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                "strategy: hybrid_shard\nprecision: {param_dtype: fp16}\n"
                "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 4}]",
                0);
    u = p->units[0];
    rs = coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP));
    ar = coll_of(u, COLL(ALL_REDUCE), PHASE(STEP));
    assert_int_equal(rs->dtype, DT(FP16));
    assert_int_equal(rs->reduction->op, OP(SUM));
    assert_true(rs->reduction->pre_divide == 4 && rs->reduction->post_divide == 1);
    assert_true(ar->reduction->pre_divide == 1 && ar->reduction->post_divide == 2);
    pcs_plan_free(p);
}

static void test_no_shard_all_reduces_over_dp(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                               "strategy: no_shard\nprecision: {param_dtype: fp16}\n"
                               "mesh: [{dim: dp_shard, size: 4}]",
                               0);
    const Pcs__V1__Unit *u = p->units[0];
    assert_int_equal(u->shard_group_size, 1);
    assert_int_equal(u->padded_numel, u->flat_numel);
    assert_null(coll_of(u, COLL(ALL_GATHER), PHASE(FORWARD)));
    assert_null(coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP)));
    const Pcs__V1__CollectiveSpec *ar = coll_of(u, COLL(ALL_REDUCE), PHASE(STEP));
    assert_non_null(ar);
    assert_int_equal(ar->group, GK(DP));
    assert_int_equal(ar->group_size, 4);
    assert_int_equal(ar->count, u->padded_numel);
    assert_true(ar->reduction->pre_divide == 2 && ar->reduction->post_divide == 2);
    pcs_plan_free(p);

    /* full_shard with a shard group of 1 runs as no_shard (FSDP1 rule) and says so */
    p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                "mesh: [{dim: dp_shard, size: 1}]",
                0);
    assert_int_equal(p->strategy, PCS__V1__STRATEGY__STRATEGY_NO_SHARD);
    assert_int_equal(p->units[0]->n_collectives, 0);
    assert_true(p->n_notes >= 1);
    pcs_plan_free(p);
}

static bool has_note(const Pcs__V1__Plan *p, const char *needle)
{
    for (size_t i = 0; i < p->n_notes; i++)
        if (strstr(p->notes[i], needle))
            return true;
    return false;
}

/* Per-module composition (seed replicate.py): strategy_overrides give the matched modules their
 * own units and strategies; the others keep spec.strategy. */
static void test_strategy_overrides_compose_replicate_and_fully_shard(void **state)
{
    (void)state;
    const char *mlp = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                      "wrap: {size_based: {min_num_params: 100000}}\n";
    char yaml[1024];
    /* replicate(model) + fully_shard(every block): the blocks become units (no wrap policy
     * would make them) and shard; the root all-reduces over dp */
    snprintf(yaml, sizeof yaml,
             "%sstrategy: no_shard\nmesh: [{dim: dp_shard, size: 4}]\n"
             "strategy_overrides: [{match: {module_class: MLPBlock}, strategy: full_shard}]",
             mlp);
    Pcs__V1__Plan *p = plan_of(yaml, 0);
    assert_int_equal(p->strategy, PCS__V1__STRATEGY__STRATEGY_NO_SHARD);
    assert_int_equal(p->n_units, 3);
    const Pcs__V1__Unit *root = unit_at(p, "");
    assert_int_equal(root->strategy, PCS__V1__STRATEGY__STRATEGY_NO_SHARD);
    assert_int_equal(root->shard_group_size, 1);
    assert_null(coll_of(root, COLL(ALL_GATHER), PHASE(FORWARD)));
    assert_int_equal(coll_of(root, COLL(ALL_REDUCE), PHASE(STEP))->group, GK(DP));
    for (int b = 0; b < 2; b++) {
        const Pcs__V1__Unit *u = unit_at(p, b ? "layers.1" : "layers.0");
        assert_int_equal(u->strategy, PCS__V1__STRATEGY__STRATEGY_FULL_SHARD);
        assert_int_equal(u->shard_group_size, 4);
        assert_int_equal(u->padded_numel % 4, 0);
        assert_true(u->reshard_after_forward);
        assert_non_null(coll_of(u, COLL(ALL_GATHER), PHASE(FORWARD)));
        assert_non_null(coll_of(u, COLL(ALL_GATHER), PHASE(BACKWARD)));
        assert_int_equal(coll_of(u, COLL(REDUCE_SCATTER), PHASE(STEP))->group_size, 4);
        assert_null(coll_of(u, COLL(ALL_REDUCE), PHASE(STEP)));
    }
    assert_true(has_note(p, "strategy_overrides[0]: 2 unit(s) run as full_shard"));
    pcs_plan_free(p);

    /* HSDP with one block replicated over all of dp (later entries win: the prefix match
     * shards both, the exact path takes layers.1 back); shard_grad_op keeps parameters */
    snprintf(yaml, sizeof yaml,
             "%sstrategy: hybrid_shard\n"
             "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 2}]\n"
             "strategy_overrides: [{match: {path: 'layers.*'}, strategy: shard_grad_op},\n"
             "                     {match: {path: layers.1}, strategy: no_shard}]",
             mlp);
    p = plan_of(yaml, 0);
    const Pcs__V1__Unit *l0 = unit_at(p, "layers.0"), *l1 = unit_at(p, "layers.1");
    root = unit_at(p, "");
    assert_int_equal(root->strategy, PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD);
    assert_int_equal(coll_of(root, COLL(ALL_REDUCE), PHASE(STEP))->group, GK(REPLICATE));
    /* shard_grad_op on a 2-D mesh is HSDP's zero2 (FSDP2), said in a note */
    assert_int_equal(l0->strategy, PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2);
    assert_false(l0->reshard_after_forward);
    assert_int_equal(coll_of(l0, COLL(REDUCE_SCATTER), PHASE(STEP))->group_size, 2);
    assert_int_equal(coll_of(l0, COLL(ALL_REDUCE), PHASE(STEP))->group, GK(REPLICATE));
    assert_int_equal(l1->strategy, PCS__V1__STRATEGY__STRATEGY_NO_SHARD);
    assert_int_equal(l1->shard_group_size, 1);
    const Pcs__V1__CollectiveSpec *ar = coll_of(l1, COLL(ALL_REDUCE), PHASE(STEP));
    assert_int_equal(ar->group, GK(DP));
    assert_int_equal(ar->group_size, 4);
    assert_true(has_note(p, "strategy_overrides[0].strategy: shard_grad_op on a mesh with "
                            "dp_replicate=2 runs as hybrid_shard_zero2"));
    pcs_plan_free(p);

    /* int reshard is checked against the shard dim when only an override shards */
    snprintf(yaml, sizeof yaml,
             "%sstrategy: no_shard\nmesh: [{dim: dp_shard, size: 4}]\n"
             "reshard_after_forward: 2\n"
             "strategy_overrides: [{match: {path: layers.0}, strategy: full_shard}]",
             mlp);
    p = plan_of(yaml, 0);
    assert_int_equal(unit_at(p, "layers.0")->reshard_group_size, 2);
    assert_int_equal(unit_at(p, "")->reshard_group_size, 0);
    pcs_plan_free(p);
    snprintf(yaml, sizeof yaml,
             "%sstrategy: no_shard\nmesh: [{dim: dp_shard, size: 4}]\n"
             "strategy_overrides: [{match: {path: layers.0}}]",
             mlp);
    expect_error(yaml, 0, "strategy_overrides[0].strategy: required");
}

/* training.gradient_sync every_micro_batch (FSDP2's default): no unsharded accumulator, the
 * reduce-scatter (and all-reduce) traffic of every micro-batch; hsdp_all_reduce last_micro_batch
 * keeps one all-reduce per step and holds the partial sums. */
static void test_gradient_sync_every_micro_batch_estimate(void **state)
{
    (void)state;
    const char *base = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                       "wrap: {module_class: [MLPBlock]}\nstrategy: hybrid_shard\n"
                       "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 2}]\n"
                       "precision: {param_dtype: bf16, reduce_dtype: fp32}\n";
    char yaml[1024];
    Pcs__V1__Plan *p[3];
    const char *extra[3] = {"", "gradient_sync: every_micro_batch",
                            "gradient_sync: every_micro_batch, hsdp_all_reduce: last_micro_batch"};
    for (int k = 0; k < 3; k++) {
        snprintf(yaml, sizeof yaml,
                 "%straining: {steps: 1, micro_batch_size: 4, micro_batches: 3, "
                 "optimizer: {sgd: {lr: 0.1}}%s%s}\n",
                 base, *extra[k] ? ", " : "", extra[k]);
        p[k] = plan_of(yaml, 0);
    }
    assert_false(p[0]->sync_every_micro_batch);
    assert_true(p[1]->sync_every_micro_batch && !p[1]->hsdp_all_reduce_last);
    assert_true(p[2]->sync_every_micro_batch && p[2]->hsdp_all_reduce_last);
    const Pcs__V1__RankEstimate *e0 = p[0]->estimate_max, *e1 = p[1]->estimate_max,
                                *e2 = p[2]->estimate_max;
    assert_int_equal(e1->reduce_scatter_bytes, 3 * e0->reduce_scatter_bytes);
    assert_int_equal(e1->all_reduce_bytes, 3 * e0->all_reduce_bytes);
    assert_int_equal(e2->reduce_scatter_bytes, 3 * e0->reduce_scatter_bytes);
    assert_int_equal(e2->all_reduce_bytes, e0->all_reduce_bytes);
    assert_true(e1->peak_unsharded_bytes < e0->peak_unsharded_bytes); /* no accumulators */
    assert_true(e2->staging_bytes > e1->staging_bytes);                /* the partial sums */
    /* pcs-worker (model.mlp) writes accumulating micro-batches' gradients into the accumulator:
     * no gradient block in the estimate, unless every micro-batch syncs; with the blocks the peak
     * is higher by at most the unsharded gradients (bf16) of a unit and its ancestors */
    assert_true(p[0]->grads_into_accumulator);
    assert_false(p[1]->grads_into_accumulator || p[2]->grads_into_accumulator);
    Pcs__V1__RankEstimate without, with;
    assert_int_equal(pcs_plan_rank_estimate(p[0], 0, &without), PCS_OK);
    p[0]->grads_into_accumulator = false;
    assert_int_equal(pcs_plan_rank_estimate(p[0], 0, &with), PCS_OK);
    uint64_t all = 0;
    for (size_t i = 0; i < p[0]->n_units; i++)
        all += p[0]->units[i]->padded_numel * 2;
    assert_true(with.peak_unsharded_bytes > without.peak_unsharded_bytes);
    assert_true(with.peak_unsharded_bytes - without.peak_unsharded_bytes <= all);
    for (int k = 0; k < 3; k++)
        pcs_plan_free(p[k]);
    /* a C API program's model (model.explicit) takes grad_buffer blocks: counted */
    Pcs__V1__Plan *x = plan_of("model: {explicit: [{path: '', class: Net, params: [{name: w, "
                               "shape: [64]}]}]}\nmesh: [{dim: dp_shard, size: 2}]\n"
                               "training: {micro_batches: 3}\n",
                               0);
    assert_false(x->grads_into_accumulator);
    pcs_plan_free(x);
}

/* FSDP ignored_modules: one unmanaged unit per ignored module with its whole subtree, in the
 * master dtype whatever the policy, no cast in or out, no collective or divide, untouched by
 * strategy and precision overrides. */
static void test_ignored_modules_are_unmanaged_units(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(
        "model: {mlp: {input_dim: 8, hidden_dims: [16, 16, 16], output_dim: 4, norm: layernorm}}\n"
        "wrap: {module_class: [MLPBlock, LayerNorm]}\nmesh: [{dim: dp_shard, size: 4}]\n"
        "precision: {param_dtype: bf16, reduce_dtype: fp32,\n"
        "            overrides: [{match: {path: 'layers.1*'}, output_dtype: fp32}]}\n"
        "strategy_overrides: [{match: {module_class: MLPBlock}, strategy: no_shard}]\n"
        "ignored_modules: [layers.1]\n",
        0);
    const Pcs__V1__Unit *u = unit_at(p, "layers.1");
    assert_true(u->unmanaged);
    assert_false(u->mixed_precision);
    assert_int_equal(u->param_dtype, PCS__V1__DTYPE__DTYPE_FP32);
    assert_int_equal(u->output_dtype, 0); /* no cast back: a following bf16 unit fails */
    assert_false(u->cast_forward_inputs);
    assert_int_equal(u->shard_group_size, 1);
    assert_int_equal(u->n_collectives, 0);
    assert_null(u->local_reduction);
    assert_int_equal(u->padded_numel, u->flat_numel);
    /* its LayerNorm is part of it, not a unit */
    for (size_t i = 0; i < p->n_units; i++)
        assert_null(strstr(p->units[i]->path, "layers.1."));
    bool has_norm = false;
    for (size_t i = 0; i < u->n_modules; i++)
        has_norm |= strcmp(u->modules[i], "layers.1.norm") == 0;
    assert_true(has_norm);
    /* the other blocks follow the overrides */
    assert_int_equal(unit_at(p, "layers.0")->strategy, PCS__V1__STRATEGY__STRATEGY_NO_SHARD);
    assert_false(unit_at(p, "layers.0")->unmanaged);
    assert_non_null(coll_of(unit_at(p, "layers.0"), COLL(ALL_REDUCE), PHASE(STEP)));
    assert_true(has_note(p, "ignored_modules: 1 module(s) not managed"));
    pcs_plan_free(p);
    expect_error("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                 "ignored_modules: [nope]\n",
                 2, "ignored_modules[0]: no such module in the model");
}

/* FSDP2 ignored_params: the ignored parameters leave their unit for one unmanaged unit per
 * module holding some (rooted at it, just them: no module, no buffer), in their own dtype, with
 * no collective; the module's other parameters stay where they were. */
static void test_ignored_params_get_unmanaged_units_of_their_own(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(
        "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4, norm: layernorm}}\n"
        "wrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 2}]\n"
        "precision: {param_dtype: bf16, reduce_dtype: fp32}\n"
        "ignored_params: [layers.1.linear.bias, layers.1.norm.weight, head.weight]\n",
        0);
    const Pcs__V1__Unit *blk = unit_at(p, "layers.1");
    assert_false(blk->unmanaged);
    for (size_t k = 0; k < blk->n_params; k++)
        if (!strcmp(blk->params[k]->fqn, "layers.1.linear.bias") ||
            !strcmp(blk->params[k]->fqn, "layers.1.norm.weight"))
            fail_msg("%s is still in the block's unit", blk->params[k]->fqn);
    size_t found = 0;
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        if (!u->unmanaged)
            continue;
        found++;
        assert_int_equal(u->n_params, 1);
        assert_int_equal(u->n_modules, 0);
        assert_int_equal(u->n_buffers, 0);
        assert_int_equal(u->n_collectives, 0);
        assert_int_equal(u->shard_group_size, 1);
        assert_false(u->mixed_precision);
        assert_int_equal(u->param_dtype, PCS__V1__DTYPE__DTYPE_FP32);
        const char *f = u->params[0]->fqn;
        if (!strcmp(f, "layers.1.linear.bias"))
            assert_string_equal(u->path, "layers.1.linear");
        else if (!strcmp(f, "layers.1.norm.weight"))
            assert_string_equal(u->path, "layers.1.norm");
        else
            assert_string_equal(f, "head.weight");
    }
    assert_int_equal(found, 3);
    assert_true(has_note(p, "ignored_params: 3 parameter(s) not managed, in 3 unit(s)"));
    assert_int_equal(pcs_plan_check_layout(p), PCS_OK);
    /* in forward order: right after the unit whose region holds their module */
    size_t at_blk = 0;
    while (strcmp(p->units[at_blk]->path, "layers.1") != 0)
        at_blk++;
    assert_string_equal(p->units[at_blk + 1]->path, "layers.1.linear");
    assert_string_equal(p->units[at_blk + 2]->path, "layers.1.norm");
    assert_string_equal(p->units[p->n_units - 1]->path, "head");
    for (size_t i = 0; i < p->n_units; i++)
        assert_int_equal(p->units[i]->index, i);
    pcs_plan_free(p);
    /* a DDP compression hook leaves them (and ignored modules) alone: no all-reduce, no cast */
    p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                "strategy: no_shard\nmesh: [{dim: dp_shard, size: 2}]\n"
                "ddp_comm_hook: fp16_compress\nignored_params: [head.bias]\n",
                0);
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        assert_int_equal(u->reduce_dtype, u->unmanaged ? PCS__V1__DTYPE__DTYPE_FP32
                                                       : PCS__V1__DTYPE__DTYPE_FP16);
    }
    pcs_plan_free(p);
    expect_error("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                 "ignored_params: [layers.0.linear.nope]\n",
                 2, "ignored_params[0]: no parameter 'layers.0.linear.nope' in the model");
    expect_error("model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                 "mesh: [{dim: dp_shard, size: 1}, {dim: pp, size: 2}]\n"
                 "ignored_params: [head.bias]\n",
                 2, "ignored_params[0]: not with pipeline stages");
}

/* An ignored parameter of a wrapped module with a wrapped child: its unit follows the module's
 * unit and precedes the child's, and the estimate still counts the module's unit as the child's
 * enclosing unit (the same path is not a sibling). With cpu_offload every unit has a device
 * copy, so at the child's forward the root, the block, the ignored unit (kept: unmanaged) and
 * the child are all gathered; every parameter frozen, so that no gradient block hides a missing
 * ancestor. */
static void test_ignored_param_of_a_wrapped_module_keeps_the_estimate(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(
        "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8, 8],\n"
        "                                                  requires_grad_off: true}]},\n"
        "  {path: block, class: Block, params: [\n"
        "     {name: scale, shape: [64], requires_grad_off: true},\n"
        "     {name: big, shape: [64, 64], requires_grad_off: true}]},\n"
        "  {path: block.norm, class: LayerNorm,\n"
        "   params: [{name: weight, shape: [64], requires_grad_off: true}]}]}\n"
        "wrap: {explicit: [block, block.norm]}\nmesh: [{dim: dp_shard, size: 2}]\n"
        "cpu_offload: true\nignored_params: [block.scale, w]\n",
        0);
    assert_int_equal(p->n_units, 5);
    const char *order[5] = {"", "", "block", "block", "block.norm"};
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(p->units[i]->path, order[i]);
    assert_true(p->units[1]->unmanaged && p->units[3]->unmanaged);
    assert_string_equal(p->units[1]->params[0]->fqn, "w");
    assert_string_equal(p->units[3]->params[0]->fqn, "block.scale");
    Pcs__V1__RankEstimate e;
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &e), PCS_OK);
    uint64_t all = 0;
    for (size_t i = 0; i < 5; i++)
        all += p->units[i]->padded_numel * 4;
    if (e.peak_unsharded_bytes < all)
        fail_msg("peak %llu B < the %llu B gathered at block.norm's forward",
                 (unsigned long long)e.peak_unsharded_bytes, (unsigned long long)all);
    pcs_plan_free(p);
}

/* FSDP2 groups of mixed dtypes (spec §4.1 step 2: a group's all-gather moves bytes, uint8,
 * when its parameters' dtypes differ; the LoRA-on-a-bf16-base shape): under shard_layout
 * per_param the parameters of the unit's other dtypes form dtype parts, units right after it
 * with the same root and policy and no module or buffer; every parameter keeps FSDP2's shard.
 * FSDP1's flat layout refuses the mix as FSDP1 does, and trainable parameters of two dtypes in
 * one group are refused as FSDP2's _init_mp_dtypes refuses them. */
#define MIXED_MODEL(base_frozen)                                                                   \
    "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [4, 8]}]},\n"             \
    "  {path: blk, class: LoraLinear},\n"                                                          \
    "  {path: blk.base, class: Linear, params: [\n"                                                \
    "     {name: weight, shape: [8, 8], dtype: bf16, requires_grad_off: " base_frozen "},\n"       \
    "     {name: bias, shape: [8], dtype: bf16, requires_grad_off: " base_frozen "}]},\n"          \
    "  {path: blk.a, class: Linear, params: [{name: weight, shape: [2, 8]}]},\n"                   \
    "  {path: blk.b, class: Linear, params: [{name: weight, shape: [8, 2]}]}]}\n"                  \
    "wrap: {explicit: [blk]}\nmesh: [{dim: dp_shard, size: 2}]\n"

static void test_mixed_dtype_group_splits_into_dtype_parts(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(MIXED_MODEL("true") "shard_layout: per_param\n", 0);
    assert_int_equal(p->n_units, 3);
    const Pcs__V1__Unit *root = p->units[0], *blk = p->units[1], *part = p->units[2];
    assert_string_equal(root->path, "");
    assert_string_equal(blk->path, "blk");
    assert_string_equal(part->path, "blk");
    /* the unit keeps its first dtype (bf16: blk.base comes first), its modules and buffers */
    assert_int_equal(blk->master_dtype, DT(BF16));
    assert_int_equal(blk->param_dtype, DT(BF16));
    assert_int_equal(blk->n_params, 2);
    assert_string_equal(blk->params[0]->fqn, "blk.base.weight");
    assert_string_equal(blk->params[1]->fqn, "blk.base.bias");
    assert_int_equal(blk->n_modules, 4);
    /* the part: the fp32 parameters, no module, the same strategy and layout */
    assert_int_equal(part->master_dtype, DT(FP32));
    assert_int_equal(part->param_dtype, DT(FP32));
    assert_int_equal(part->n_params, 2);
    assert_string_equal(part->params[0]->fqn, "blk.a.weight");
    assert_string_equal(part->params[1]->fqn, "blk.b.weight");
    assert_int_equal(part->n_modules, 0);
    assert_int_equal(part->n_buffers, 0);
    assert_false(part->is_root);
    assert_int_equal(part->output_dtype, 0);
    for (size_t i = 0; i < 3; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        assert_int_equal(u->index, i);
        assert_int_equal(u->strategy, PCS__V1__STRATEGY__STRATEGY_FULL_SHARD);
        assert_int_equal(u->layout, PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM);
        for (size_t k = 0; k < u->n_params; k++)
            assert_int_equal(u->params[k]->dtype, u->master_dtype);
    }
    /* FSDP2's shards: ceil(d0 / 2) rows of each parameter, packed in parameter order */
    assert_int_equal(blk->params[0]->shard_rows, 4);
    assert_int_equal(blk->params[1]->shard_rows, 4);
    assert_int_equal(blk->params[1]->shard_offset, 32);
    assert_int_equal(blk->shard_numel, 36);
    assert_int_equal(part->params[0]->shard_rows, 1);
    assert_int_equal(part->params[1]->shard_rows, 4);
    assert_int_equal(part->params[1]->shard_offset, 8);
    assert_int_equal(part->shard_numel, 16);
    /* the frozen part has no reduction; the trainable one reduce-scatters */
    assert_null(coll_of(blk, COLL(REDUCE_SCATTER), PHASE(STEP)));
    assert_non_null(coll_of(part, COLL(REDUCE_SCATTER), PHASE(STEP)));
    assert_non_null(coll_of(blk, COLL(ALL_GATHER), PHASE(FORWARD)));
    assert_non_null(coll_of(part, COLL(ALL_GATHER), PHASE(FORWARD)));
    assert_true(has_note(p, "unit 'blk' mixes parameter dtypes: 1 more unit(s)"));
    assert_int_equal(pcs_plan_check_layout(p), PCS_OK);
    /* trainable masters are stored as fp32, the frozen bf16 unit's in bf16 (FSDP's 2 bytes):
     * 16 x 4 + 36 x 2 + 16 x 4 B */
    Pcs__V1__RankEstimate e;
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &e), PCS_OK);
    assert_int_equal(e.param_shard_bytes, 16 * 4 + 36 * 2 + 16 * 4);
    /* pcs-worker binds one unit per module: such a job is for pcs.torch or a C API program */
    job_t *s = spec_of(MIXED_MODEL("true") "shard_layout: per_param\n");
    assert_int_equal(pcs_job_check_runnable(s, p), PCS_ERR_UNSUPPORTED);
    assert_non_null(strstr(pcs_last_error(), "unit 2 ('blk') holds the fp32 parameters of a "
                                             "group of mixed dtypes"));
    spec_free(s);
    s = spec_of(MIXED_MODEL("true") "shard_layout: per_param\nprogram: pcs.torch\n");
    assert_int_equal(pcs_job_check_runnable(s, p), PCS_OK);
    spec_free(s);
    pcs_plan_free(p);

    /* trainable bf16 and fp32 parameters in one group: FSDP2 refuses them whatever the policy
     * (_init_mp_dtypes) */
    expect_error(MIXED_MODEL("false") "shard_layout: per_param\n", 2,
                 "model: unit 'blk' trains bf16 and fp32 parameters ('blk.base.weight', "
                 "'blk.a.weight'): the trainable parameters of an FSDP2 group share their dtype");
    expect_error(MIXED_MODEL("false") "shard_layout: per_param\n"
                                      "precision: {param_dtype: bf16, reduce_dtype: fp32}\n",
                 2, "FSDP expects uniform original parameter dtype");
    /* under a bf16 policy the frozen base and the adapters both compute in bf16 */
    p = plan_of(MIXED_MODEL("true") "shard_layout: per_param\n"
                                    "precision: {param_dtype: bf16, reduce_dtype: fp32}\n",
                0);
    assert_int_equal(p->n_units, 3);
    for (size_t i = 1; i < 3; i++)
        assert_int_equal(p->units[i]->param_dtype, DT(BF16));
    assert_int_equal(p->units[1]->master_dtype, DT(BF16));
    assert_int_equal(p->units[2]->master_dtype, DT(FP32));
    assert_int_equal(p->units[2]->reduce_dtype, DT(FP32));
    pcs_plan_free(p);
    /* FSDP1's flat parameter: one dtype */
    expect_error(MIXED_MODEL("true"), 2,
                 "model: unit 'blk' mixes bf16 and fp32 parameters ('blk.a.weight'); FSDP1's "
                 "flat parameter has one dtype");
    /* master_dtype converts the model: one dtype, no part */
    p = plan_of(MIXED_MODEL("true") "shard_layout: per_param\nprecision: {master_dtype: fp32}\n",
                0);
    assert_int_equal(p->n_units, 2);
    pcs_plan_free(p);
    /* an ignored module is never flattened (FSDP1 leaves it alone): split whatever the layout,
     * unmanaged parts with no collective */
    p = plan_of(MIXED_MODEL("true") "ignored_modules: [blk]\n", 0);
    assert_int_equal(p->n_units, 3);
    for (size_t i = 1; i < 3; i++) {
        assert_true(p->units[i]->unmanaged);
        assert_int_equal(p->units[i]->n_collectives, 0);
    }
    assert_int_equal(p->units[2]->master_dtype, DT(FP32));
    pcs_plan_free(p);
    /* the root's group: its part is a root unit too (kept gathered after forward); ignored
     * parameters of two dtypes: an unmanaged unit and its unmanaged part, after the managed
     * unit and its part on the same path; and the eval estimate gathers the root's group with
     * a unit's group (full-precision eval: fp32 copies of the bf16-computing fp32 units) */
    p = plan_of("model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [64, 8]},\n"
                "   {name: f, shape: [64, 8], dtype: bf16, requires_grad_off: true}]},\n"
                "  {path: blk, class: Block, params: [{name: a, shape: [64, 8]},\n"
                "   {name: b, shape: [64, 8], dtype: bf16, requires_grad_off: true},\n"
                "   {name: i, shape: [8]}, {name: j, shape: [8], dtype: bf16}]}]}\n"
                "wrap: {explicit: [blk]}\nmesh: [{dim: dp_shard, size: 2}]\n"
                "shard_layout: per_param\nignored_params: [blk.i, blk.j]\n"
                "precision: {param_dtype: bf16}\ntraining: {full_precision_eval: true}\n",
                0);
    assert_int_equal(p->n_units, 6);
    const char *paths[6] = {"", "", "blk", "blk", "blk", "blk"};
    const int mdt[6] = {DT(FP32), DT(BF16), DT(FP32), DT(BF16), DT(FP32), DT(BF16)};
    for (size_t i = 0; i < 6; i++) {
        assert_string_equal(p->units[i]->path, paths[i]);
        assert_int_equal(p->units[i]->master_dtype, mdt[i]);
        assert_int_equal(p->units[i]->unmanaged, i >= 4);
    }
    assert_true(p->units[0]->is_root && p->units[1]->is_root);
    assert_false(p->units[1]->reshard_after_forward);
    assert_true(p->units[3]->reshard_after_forward);
    assert_string_equal(p->units[4]->params[0]->fqn, "blk.i");
    assert_string_equal(p->units[5]->params[0]->fqn, "blk.j");
    assert_true(has_note(p, "unmanaged unit 'blk' mixes parameter dtypes: 1 more unit(s)"));
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &e), PCS_OK);
    uint64_t eval = 0; /* every unit's eval copy at once: the root's group and blk's */
    for (size_t i = 0; i < 6; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        bool fp32 = u->param_dtype != u->master_dtype || u->param_dtype == DT(FP32);
        eval += u->padded_numel * (fp32 ? 4 : 2);
    }
    if (e.peak_unsharded_bytes < eval)
        fail_msg("peak %llu B < the %llu B an eval forward of blk holds",
                 (unsigned long long)e.peak_unsharded_bytes, (unsigned long long)eval);
    pcs_plan_free(p);
    /* parameters in their own dtypes with no policy compute uncast: no output cast (FSDP2) */
    p = plan_of("model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8]}]},\n"
                "  {path: l0, class: Linear, params: [{name: w, shape: [8], dtype: bf16}]},\n"
                "  {path: l1, class: Linear, params: [{name: w, shape: [8], dtype: bf16}]}]}\n"
                "wrap: {explicit: [l0, l1]}\nmesh: [{dim: dp_shard, size: 2}]\n",
                0);
    assert_int_equal(unit_at(p, "l0")->output_dtype, 0);
    assert_int_equal(unit_at(p, "l1")->param_dtype, DT(BF16));
    pcs_plan_free(p);
    expect_error("model: {explicit: ["
                 "{path: emb, params: [{name: weight, shape: [4, 2]}]},"
                 "{path: blocks.0, params: [{name: w, shape: [2]}, {name: v, shape: [2], dtype: "
                 "bf16, requires_grad_off: true}]},"
                 "{path: blocks.1, params: [{name: w, shape: [2]}]},"
                 "{path: out, params: [{name: w, shape: [2]}]}]}\n"
                 "mesh: [{dim: pp, size: 2}]\nshard_layout: per_param\n",
                 2, "model: unit '' mixes parameter dtypes: not with pipeline stages");
}

/* FSDP1's MixedPrecision defaults (cast_forward_inputs False, cast_root_forward_inputs True):
 * only the root casts; the root casts if either flag is true; unset, cast_forward_inputs alone
 * decides (FSDP2). */
static void test_cast_root_forward_inputs_is_fsdp1s_root_cast(void **state)
{
    (void)state;
    const char *base = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                       "wrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 2}]\n";
    const struct {
        const char *flags;
        bool root, block;
    } rows[] = {
        {"", true, true},
        {"cast_forward_inputs: false, cast_root_forward_inputs: true", true, false},
        {"cast_forward_inputs: true, cast_root_forward_inputs: false", true, true},
        {"cast_forward_inputs: false", false, false},
        {"cast_forward_inputs: false, cast_root_forward_inputs: false", false, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "%sprecision: {param_dtype: bf16%s%s}\n", base,
                 *rows[i].flags ? ", " : "", rows[i].flags);
        Pcs__V1__Plan *p = plan_of(yaml, 0);
        if (unit_at(p, "")->cast_forward_inputs != rows[i].root ||
            unit_at(p, "layers.0")->cast_forward_inputs != rows[i].block)
            fail_msg("%s: root %d block %d", rows[i].flags, unit_at(p, "")->cast_forward_inputs,
                     unit_at(p, "layers.0")->cast_forward_inputs);
        pcs_plan_free(p);
    }
}

/* cpu_offload (FSDP1 CPUOffload / FSDP2 CPUOffloadPolicy) on a cuda job: masters and optimizer
 * state move to host_bytes, out of the device total, which gains the device copy of one master
 * shard; a cpu job has nothing to offload and says so. */
static void test_cpu_offload_moves_masters_and_state_to_the_host(void **state)
{
    (void)state;
    const char *base = "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}\n"
                       "wrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 2}]\n"
                       "precision: {param_dtype: bf16}\n";
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "%sbackend: cuda\n", base);
    Pcs__V1__Plan *on_dev = plan_of(yaml, 0);
    snprintf(yaml, sizeof yaml, "%sbackend: cuda\ncpu_offload: true\n", base);
    Pcs__V1__Plan *off = plan_of(yaml, 0);
    assert_false(on_dev->cpu_offload);
    assert_true(off->cpu_offload);
    const Pcs__V1__RankEstimate *a = off->estimate_max, *b = on_dev->estimate_max;
    uint64_t max_c = 0;
    for (size_t i = 0; i < off->n_units; i++)
        max_c = off->units[i]->shard_numel > max_c ? off->units[i]->shard_numel : max_c;
    assert_int_equal(a->param_shard_bytes, b->param_shard_bytes);
    assert_int_equal(a->optimizer_bytes, b->optimizer_bytes);
    assert_int_equal(a->host_bytes, a->param_shard_bytes + a->optimizer_bytes + 4 * max_c);
    assert_int_equal(a->staging_bytes, b->staging_bytes + 4 * max_c);
    assert_int_equal(b->host_bytes, 0);
    assert_int_equal(a->total_bytes,
                     b->total_bytes - b->param_shard_bytes - b->optimizer_bytes + 4 * max_c);
    pcs_plan_free(on_dev);
    pcs_plan_free(off);
    snprintf(yaml, sizeof yaml, "%scpu_offload: true\n", base);
    Pcs__V1__Plan *cpu = plan_of(yaml, 0);
    assert_false(cpu->cpu_offload);
    assert_int_equal(cpu->estimate_max->host_bytes, 0);
    assert_true(has_note(cpu, "cpu_offload: the cpu backend keeps"));
    pcs_plan_free(cpu);
}

static void test_dp_pp_mesh_groups_and_stages_section7(void **state)
{
    (void)state;
    /* T-CMP: ("dp", "pp") = (2, 2), 8 MLP layers */
    const char *y = "model: {mlp: {input_dim: 10, hidden_dims: [10, 10, 10, 10, 10, 10, 10, 10], "
                    "output_dim: 10}}\nwrap: {module_class: [MLPBlock]}\n"
                    "reshard_after_forward: false\n"
                    "mesh: [{dim: dp_shard, size: 2}, {dim: pp, size: 2}]";
    Pcs__V1__Plan *p = plan_of(y, 4);
    uint32_t ranks[4], n, me;
    for (uint32_t r = 0; r < 4; r++) {
        Pcs__V1__MeshCoords c;
        assert_int_equal(pcs_plan_rank_coords(p, r, &c), PCS_OK);
        assert_int_equal(c.dp_shard * 2 + c.pp, r); /* rank = dp_idx * 2 + pp_idx */
        assert_int_equal(pcs_plan_rank_of(p, &c), r);
        n = 4;
        assert_int_equal(pcs_plan_group_ranks(p, GK(PP), r, ranks, &n, &me), PCS_OK);
        assert_int_equal(n, 2);
        assert_int_equal(ranks[0], r / 2 * 2); /* {0,1}, {2,3} */
        assert_int_equal(ranks[1], r / 2 * 2 + 1);
        n = 4;
        assert_int_equal(pcs_plan_group_ranks(p, GK(DP), r, ranks, &n, &me), PCS_OK);
        assert_int_equal(ranks[0], r % 2); /* {0,2}, {1,3} */
        assert_int_equal(ranks[1], r % 2 + 2);
    }
    assert_int_equal(p->n_stages, 2);
    assert_int_equal(p->stages[0]->first_layer, 0);
    assert_int_equal(p->stages[0]->last_layer, 4);
    assert_int_equal(p->stages[1]->first_layer, 4);
    assert_int_equal(p->stages[1]->last_layer, 8);
    assert_string_equal(p->layer_container, "layers");
    /* every stage has its own root unit; blocks sit in their layer's stage; head is last */
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        if (strncmp(u->path, "layers.", 7) == 0)
            assert_int_equal(u->stage, (uint32_t)atoi(u->path + 7) / 4);
        if (u->is_root)
            assert_false(u->reshard_after_forward);
        for (size_t k = 0; k < u->n_params; k++)
            if (strncmp(u->params[k]->fqn, "head.", 5) == 0)
                assert_int_equal(u->stage, 1);
    }
    pcs_plan_free(p);

    /* interleaved: 2 virtual stages per rank -> 4 stages of 2 layers, pp rank k holds k, k+2 */
    char y2[1024];
    snprintf(y2, sizeof y2, "%s\npipeline: {schedule: interleaved_1f1b, virtual_stages: 2}", y);
    p = plan_of(y2, 4);
    assert_int_equal(p->n_stages, 4);
    for (uint32_t s = 0; s < 4; s++) {
        assert_int_equal(p->stages[s]->pp_rank, s % 2);
        assert_int_equal(p->stages[s]->first_layer, 2 * s);
        assert_int_equal(p->stages[s]->last_layer, 2 * s + 2);
    }
    pcs_plan_free(p);

    snprintf(y2, sizeof y2, "%s\npipeline: {virtual_stages: 8}", y);
    expect_error(y2, 4, "mesh: pp=2 x pipeline.virtual_stages=8 = 16 stages");
}

// ---- model expansion ----------------------------------------------------------------------

static void test_mlp_expansion_uses_the_fixed_fqn_scheme(void **state)
{
    (void)state;
    job_t *s = spec_of("model: {mlp: {input_dim: 3, hidden_dims: [5, 7], output_dim: 2, "
                       "norm: batchnorm, activation: gelu}}");
    pcs_model_t *m = NULL;
    assert_int_equal(pcs_model_expand(s, &m), PCS_OK);
    static const char *mods[][2] = {{"", "MLP"},
                                    {"layers", "ModuleList"},
                                    {"layers.0", "MLPBlock"},
                                    {"layers.0.linear", "Linear"},
                                    {"layers.0.norm", "BatchNorm1d"},
                                    {"layers.0.act", "GELU"},
                                    {"layers.1", "MLPBlock"},
                                    {"layers.1.linear", "Linear"},
                                    {"layers.1.norm", "BatchNorm1d"},
                                    {"layers.1.act", "GELU"},
                                    {"head", "Linear"}};
    assert_int_equal(m->n_modules, 11);
    for (uint32_t i = 0; i < m->n_modules; i++) {
        assert_string_equal(m->modules[i].path, mods[i][0]);
        assert_string_equal(m->modules[i].cls, mods[i][1]);
        assert_int_equal(pcs_model_find(m, mods[i][0]), (int32_t)i);
    }
    static const struct {
        const char *fqn;
        uint32_t ndim;
        uint64_t d0, d1;
    } params[] = {{"layers.0.linear.weight", 2, 5, 3},
                  {"layers.0.linear.bias", 1, 5, 0},
                  {"layers.0.norm.weight", 1, 5, 0},
                  {"layers.0.norm.bias", 1, 5, 0},
                  {"layers.1.linear.weight", 2, 7, 5},
                  {"layers.1.linear.bias", 1, 7, 0},
                  {"layers.1.norm.weight", 1, 7, 0},
                  {"layers.1.norm.bias", 1, 7, 0},
                  {"head.weight", 2, 2, 7},
                  {"head.bias", 1, 2, 0}};
    assert_int_equal(m->n_params, 10);
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->n_params; i++) {
        assert_string_equal(m->params[i].fqn, params[i].fqn);
        assert_int_equal(m->params[i].ndim, params[i].ndim);
        assert_int_equal(m->params[i].shape[0], params[i].d0);
        if (params[i].ndim == 2)
            assert_int_equal(m->params[i].shape[1], params[i].d1);
        total += params[i].d0 * (params[i].ndim == 2 ? params[i].d1 : 1);
    }
    assert_int_equal(m->numel, total);
    assert_int_equal(m->n_buffers, 6);
    assert_string_equal(m->buffers[0].fqn, "layers.0.norm.running_mean");
    assert_string_equal(m->buffers[1].fqn, "layers.0.norm.running_var");
    assert_string_equal(m->buffers[2].fqn, "layers.0.norm.num_batches_tracked");
    assert_int_equal(m->buffers[2].dtype, PCS_DTYPE_INT64);
    assert_int_equal(m->buffers[2].ndim, 0);
    pcs_model_free(m);
    spec_free(s);

    s = spec_of("model: {mlp: {input_dim: 3, hidden_dims: [4], output_dim: 2, bias: false, "
                "norm: layernorm}}");
    assert_int_equal(pcs_model_expand(s, &m), PCS_OK);
    assert_int_equal(m->n_params, 4); /* linear.weight, norm.weight, norm.bias, head.weight */
    assert_string_equal(m->params[1].fqn, "layers.0.norm.weight");
    assert_string_equal(m->modules[5].cls, "ReLU");
    pcs_model_free(m);
    spec_free(s);
}

static void test_explicit_tree_keeps_shared_params_once(void **state)
{
    (void)state;
    /* embed and head share one weight; "blocks" is synthesized; the tied weight's unit is the
     * lowest common ancestor's (the root), even though both users are wrapped */
    const char *y =
        "model: {explicit: ["
        "{path: embed, class: Embedding, params: [{name: weight, shape: [10, 4]}]},"
        "{path: blocks.0, class: Block, params: [{name: w, shape: [4, 4]}]},"
        "{path: blocks.1, class: Block, params: [{name: w, shape: [4, 4]}]},"
        "{path: head, class: Linear, shared: [{name: weight, shares: embed.weight}],"
        " params: [{name: bias, shape: [10]}]}]}\n"
        "wrap: {module_class: [Block, Embedding, Linear]}\nmesh: [{dim: dp_shard, size: 2}]";
    job_t *s = spec_of(y);
    pcs_model_t *m = NULL;
    assert_int_equal(pcs_model_expand(s, &m), PCS_OK);
    assert_int_equal(pcs_model_find(m, "blocks"), 2); /* root, embed, blocks, blocks.0 ... */
    assert_string_equal(m->modules[2].cls, "Module");
    assert_int_equal(m->n_aliases, 1);
    assert_string_equal(m->aliases[0].fqn, "head.weight");
    assert_int_equal(m->params[m->aliases[0].param].home, 0);
    assert_int_equal(m->numel, 40 + 16 + 16 + 10);
    pcs_model_free(m);
    spec_free(s);

    Pcs__V1__Plan *p = plan_of(y, 0);
    uint32_t seen = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_units; i++)
        for (size_t k = 0; k < p->units[i]->n_params; k++) {
            seen += strcmp(p->units[i]->params[k]->fqn, "embed.weight") == 0;
            total += p->units[i]->params[k]->numel;
        }
    assert_int_equal(seen, 1);
    assert_int_equal(total, 82);
    assert_int_equal(unit_at(p, "")->n_params, 1);
    assert_string_equal(unit_at(p, "")->params[0]->fqn, "embed.weight");
    assert_int_equal(unit_at(p, "embed")->n_params, 0);
    pcs_plan_free(p);
}

// ---- errors ------------------------------------------------------------------------------

static void test_errors_name_every_field_path(void **state)
{
    (void)state;
    expect_error("name: x", 1, "model: required (mlp or explicit)");
    expect_error("model: {mlp: {input_dim: 0, hidden_dims: [4, 0], output_dim: 2}}", 1,
                 "model.mlp.input_dim: must be >= 1; model.mlp.hidden_dims[1]: must be >= 1");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4], output_dim: 2}}\n"
                 "wrap: {explicit: [layers.0, layers.7]}",
                 1, "wrap.explicit.paths[1]: no module 'layers.7'");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4], output_dim: 2}}\n"
                 "wrap: {size_based: {min_num_params: 0}}",
                 1, "wrap.size_based.min_num_params: must be >= 1");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4], output_dim: 2}}\n"
                 "mesh: [{dim: pp, size: 2}, {dim: dp_replicate, size: 2}]",
                 6, "mesh: world size 6 is not a multiple of pp x dp_replicate = 4");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4], output_dim: 2}}\n"
                 "mesh: [{dim: dp_shard, size: 2}, {dim: dp_shard, size: 2}]",
                 0, "mesh[1].dim: dp_shard given twice");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4], output_dim: 2}}\n"
                 "precision: {param_dtype: int64, overrides: [{match: {}, reduce_dtype: int64}]}",
                 1,
                 "precision.param_dtype: int64 is not a floating dtype; "
                 "precision.overrides[0].match: required (module_class or path); "
                 "precision.overrides[0].reduce_dtype: int64 is not a floating dtype");
    expect_error("model: {explicit: [{path: a, params: [{name: w, shape: [0]}]}, {path: a},"
                 " {path: 'b..c'}]}",
                 1, "model.explicit.modules[1].path: duplicate module 'a'");
    expect_error("model: {explicit: [{path: a, params: [{name: w, shape: [2, 0]}]}]}", 1,
                 "model.explicit.modules[0].params[0].shape[1]: must be >= 1");
    expect_error("model: {explicit: [{path: a, shared: [{name: w, shares: z.w}]}]}", 1,
                 "model.explicit.modules[0].shared[0].shares: no parameter 'z.w'");
    expect_error("model: {explicit: [{path: a, params: [{name: w, shape: [2]}]},"
                 "{path: b, params: [{name: w, shape: [2], dtype: bf16}]}]}",
                 1, "model: unit '' mixes fp32 and bf16 parameters");
    expect_error("model: {mlp: {input_dim: 2, hidden_dims: [4, 4], output_dim: 2}}\n"
                 "wrap: {explicit: [layers]}\nmesh: [{dim: pp, size: 2}]",
                 2, "wrap: unit 'layers' contains the pipeline layers of 'layers'");
    expect_error("model: {explicit: ["
                 "{path: emb, params: [{name: weight, shape: [4, 2]}]},"
                 "{path: blocks.0, params: [{name: w, shape: [2]}]},"
                 "{path: blocks.1, params: [{name: w, shape: [2]}]},"
                 "{path: out, shared: [{name: weight, shares: emb.weight}]}]}\n"
                 "mesh: [{dim: pp, size: 2}]",
                 2,
                 "model: parameter 'emb.weight' is shared by 'out.weight' across pipeline "
                 "stages 0 and 1");
    /* every error of one spec is reported, joined by "; " */
    expect_error("model: {mlp: {input_dim: 0, hidden_dims: [4], output_dim: 2}}\n"
                 "precision: {reduce_dtype: int64}",
                 1, "precision.reduce_dtype: int64 is not a floating dtype; model.mlp.input_dim");
}

// ---- plan-level properties -----------------------------------------------------------------

#define DEMO                                                                                       \
    "model: {mlp: {input_dim: 256, hidden_dims: [1024, 1024, 1024, 1024], output_dim: 16,"         \
    " activation: gelu, norm: layernorm, residual: true}}\n"                                       \
    "wrap: {module_class: [MLPBlock], ignored_module_classes: [BatchNorm1d]}\n"                    \
    "precision: {param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: fp32,"                       \
    " overrides: [{match: {module_class: LayerNorm}, param_dtype: fp32}]}\n"                       \
    "mesh: [{dim: dp_shard, size: 4}]\n"                                                           \
    "training: {steps: 4, micro_batch_size: 32, micro_batches: 4,"                                 \
    " optimizer: {adamw: {lr: 1.0e-3}}}\n"

static void test_demo_job_units_and_per_collective_dtypes(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(DEMO, 0);
    /* root + 4 blocks + 4 LayerNorms promoted by the override */
    assert_int_equal(p->n_units, 9);
    const Pcs__V1__Unit *blk = unit_at(p, "layers.2");
    assert_int_equal(blk->n_params, 2); /* linear weight + bias; the norm is its own unit */
    assert_int_equal(coll_of(blk, COLL(ALL_GATHER), PHASE(FORWARD))->dtype, DT(BF16));
    assert_int_equal(coll_of(blk, COLL(REDUCE_SCATTER), PHASE(STEP))->dtype, DT(FP32));
    assert_int_equal(blk->accum_dtype, DT(FP32));
    const Pcs__V1__Unit *ln = unit_at(p, "layers.2.norm");
    assert_int_equal(ln->param_dtype, DT(FP32));
    assert_int_equal(coll_of(ln, COLL(ALL_GATHER), PHASE(FORWARD))->dtype, DT(FP32));
    assert_true(ln->mixed_precision);
    /* the root unit owns the head */
    const Pcs__V1__Unit *root = unit_at(p, "");
    assert_int_equal(root->n_params, 2);
    assert_string_equal(root->params[0]->fqn, "head.weight");
    assert_int_equal(p->micro_batches, 4);
    assert_int_equal(p->optimizer_states, 2);
    assert_non_null(strstr(p->reduce_dtype_rule, "reduce_dtype unset"));
    /* pcs rule: the fp32 norm unit inside a bf16 block hands its output back in bf16 */
    assert_int_equal(ln->output_dtype, DT(BF16));
    assert_int_equal(blk->output_dtype, DT(UNSPECIFIED));
    assert_int_equal(root->output_dtype, DT(UNSPECIFIED));
    pcs_plan_free(p);
}

static void test_override_unit_keeps_an_explicit_output_dtype(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of("name: t\n"
                               "model: {mlp: {input_dim: 8, hidden_dims: [8, 8], output_dim: 2,"
                               " norm: layernorm}}\n"
                               "wrap: {module_class: [MLPBlock]}\n"
                               "precision: {param_dtype: bf16, overrides: ["
                               "{match: {module_class: LayerNorm}, param_dtype: fp32,"
                               " output_dtype: fp16}]}\n"
                               "mesh: [{dim: dp_shard, size: 2}]\n"
                               "training: {steps: 1, micro_batch_size: 1,"
                               " optimizer: {sgd: {lr: 0.1}}}\n",
                               2);
    assert_int_equal(unit_at(p, "layers.1.norm")->output_dtype, DT(FP16));
    pcs_plan_free(p);
}

static void test_world_size_rescales_dp_shard(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of(DEMO, 8);
    assert_int_equal(p->world_size, 8);
    assert_int_equal(p->shard_size, 8);
    assert_int_equal(unit_at(p, "layers.0")->shard_group_size, 8);
    bool noted = false;
    for (size_t i = 0; i < p->n_notes; i++)
        noted |= strstr(p->notes[i], "dp_shard 4 -> 8") != NULL;
    assert_true(noted);
    pcs_plan_free(p);
}

static void test_hash_is_stable_and_covers_the_plan(void **state)
{
    (void)state;
    Pcs__V1__Plan *a = plan_of(DEMO, 0), *b = plan_of(DEMO, 0);
    assert_true(a->hash != 0);
    assert_true(a->hash == b->hash);
    assert_true(pcs_plan_hash(a) == a->hash);
    /* a packed and unpacked copy (what a worker receives) hashes the same */
    size_t len = protobuf_c_message_get_packed_size(&a->base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&a->base, buf);
    Pcs__V1__Plan *c = pcs__v1__plan__unpack(NULL, len, buf);
    assert_non_null(c);
    assert_true(pcs_plan_hash(c) == a->hash);
    c->units[1]->shard_numel++; /* any change changes the hash */
    assert_true(pcs_plan_hash(c) != a->hash);
    pcs_plan_free(c);
    free(buf);
    Pcs__V1__Plan *d = plan_of(DEMO, 8);
    assert_true(d->hash != a->hash);
    pcs_plan_free(a);
    pcs_plan_free(b);
    pcs_plan_free(d);
}

/* A plan read from the wire whose mesh product wraps uint64 onto its world size is rejected:
 * (2^32-1) x (2^32-1) x 2^31 = 2^31 mod 2^64. */
static void test_mesh_product_overflow_is_rejected(void **state)
{
    (void)state;
    Pcs__V1__Plan *p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                               "mesh: [{dim: dp_shard, size: 2}]",
                               0);
    assert_int_equal(p->n_mesh, 3);
    Pcs__V1__MeshCoords c;
    assert_int_equal(pcs_plan_rank_coords(p, 1, &c), PCS_OK);
    uint32_t saved[3], saved_ws = p->world_size;
    for (int i = 0; i < 3; i++)
        saved[i] = p->mesh[i]->size;
    p->mesh[0]->size = UINT32_MAX;
    p->mesh[1]->size = UINT32_MAX;
    p->mesh[2]->size = 1u << 31;
    p->world_size = 1u << 31;
    assert_int_equal(pcs_plan_rank_coords(p, 1, &c), PCS_ERR_INVALID_ARG);
    uint32_t n = 0, me = 0;
    assert_int_equal(pcs_plan_group_ranks(p, GK(WORLD), 1, NULL, &n, &me), PCS_ERR_INVALID_ARG);
    c.pp = c.dp_replicate = c.dp_shard = 0;
    assert_int_equal(pcs_plan_rank_of(p, &c), UINT32_MAX);
    for (int i = 0; i < 3; i++)
        p->mesh[i]->size = saved[i];
    p->world_size = saved_ws;
    pcs_plan_free(p);
}

/* pcs_plan_build does not rely on the validator's size caps: a unit whose running flat offset
 * would wrap uint64 (4(2^32-1) + (2^32-1) elements, then a (2^32-1)^2 weight) is an error, not
 * a plan with a wrapped flat_numel. */
static void test_flat_offset_overflow_is_an_error(void **state)
{
    (void)state;
    expect_error("model: {mlp: {input_dim: 4, hidden_dims: [4294967295, 4294967295], "
                 "output_dim: 1}}\nmesh: [{dim: dp_shard, size: 2}]",
                 0, "model: unit '' has more than 2^62 elements");
}

static void test_plan_size_does_not_grow_with_world_size(void **state)
{
    (void)state;
    Pcs__V1__Plan *small = plan_of(DEMO, 8), *big = plan_of(DEMO, 16384);
    size_t a = protobuf_c_message_get_packed_size(&small->base);
    size_t b = protobuf_c_message_get_packed_size(&big->base);
    /* only varint widths of counts and sizes differ */
    assert_true(b < a + 256);
    pcs_plan_free(small);
    pcs_plan_free(big);
}

static void test_rank_estimate_matches_hand_count(void **state)
{
    (void)state;
    /* two wrapped units of 8 fp32 elements, root without params, ws = 4, adamw, 1 micro-batch:
     * c = 2 per unit -> shards 2*2*4 = 16 B, grads 16 B, adam 2*16 = 32 B; all-gather: forward
     * and backward, (4-1)*2*4 = 24 B each, per unit -> 96 B; reduce-scatter 2*24 = 48 B.
     * peak (prefetch 1): backward of the last unit holds both units gathered (2*32 B) plus its
     * unsharded fp32 grad (32 B) = 96 B; so does the first unit's backward: itself gathered
     * (32 B), its grad (32 B) and the last unit's grad, the reduce-scatter input still in flight
     * (32 B). Staging: each unit's reduce-scatter output (2 * 2*4 B), the fp32 scratch of the
     * largest shard (2*4 B) and 3 + 3 scalars (24 B) = 48 B; no all-gather input (fp32). */
    Pcs__V1__Plan *p =
        plan_of("model: {explicit: [{path: a, class: Linear, params: [{name: w, shape: [8]}]},"
                "{path: b, class: Linear, params: [{name: w, shape: [8]}]}]}\n"
                "wrap: {module_class: [Linear]}\nmesh: [{dim: dp_shard, size: 4}]\n"
                "training: {optimizer: {adamw: {lr: 0.1}}}",
                0);
    Pcs__V1__RankEstimate e;
    assert_int_equal(pcs_plan_rank_estimate(p, 3, &e), PCS_OK);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.param_shard_bytes, 16);
    assert_int_equal(e.grad_shard_bytes, 16);
    assert_int_equal(e.optimizer_bytes, 32);
    assert_int_equal(e.all_gather_bytes, 96);
    assert_int_equal(e.reduce_scatter_bytes, 48);
    assert_int_equal(e.all_reduce_bytes, 0);
    assert_int_equal(e.peak_unsharded_bytes, 96);
    assert_int_equal(e.staging_bytes, 48);
    assert_int_equal(e.total_bytes, 16 + 16 + 32 + 96 + 48);
    assert_int_equal(p->estimate_max->total_bytes, e.total_bytes);
    assert_int_equal(pcs_plan_rank_estimate(p, 4, &e), PCS_ERR_INVALID_ARG);
    pcs_plan_free(p);
}

/* Frozen parameters (requires_grad_off) have no gradient and no optimizer state. Unit a is all
 * frozen: its 4-element shard on each of 2 ranks counts params only. Unit b is [w trainable 8 |
 * v frozen 8] (offsets 0 and 8, c = 8): it trains, so its flat sharded grad exists on both ranks
 * (8 x 4 B), but AdamW state (2 x 4 B per element) exists for rank 0's w elements only.
 * rank 0: params 16 + 32, grad 32, adam 64; rank 1: params 48, grad 32, adam 0. */
static void test_rank_estimate_skips_frozen_grads_and_optimizer_state(void **state)
{
    (void)state;
    Pcs__V1__Plan *p =
        plan_of("model: {explicit: [{path: a, class: Linear, params: [{name: w, shape: [8], "
                "requires_grad_off: true}]},"
                "{path: b, class: Linear, params: [{name: w, shape: [8]}, {name: v, shape: [8], "
                "requires_grad_off: true}]}]}\n"
                "wrap: {module_class: [Linear]}\nmesh: [{dim: dp_shard, size: 2}]\n"
                "training: {optimizer: {adamw: {lr: 0.1}}}",
                0);
    const Pcs__V1__Unit *a = unit_at(p, "a"), *b = unit_at(p, "b");
    assert_int_equal(b->shard_numel, 8);
    assert_int_equal(pcs_plan_unfrozen_numel(a, 0), 0);
    assert_int_equal(pcs_plan_unfrozen_numel(a, 1), 0);
    assert_int_equal(pcs_plan_unfrozen_numel(b, 0), 8);
    assert_int_equal(pcs_plan_unfrozen_numel(b, 1), 0);
    Pcs__V1__RankEstimate e;
    assert_int_equal(pcs_plan_rank_estimate(p, 0, &e), PCS_OK);
    assert_int_equal(e.param_shard_bytes, 48);
    assert_int_equal(e.grad_shard_bytes, 32);
    assert_int_equal(e.optimizer_bytes, 64);
    assert_int_equal(pcs_plan_rank_estimate(p, 1, &e), PCS_OK);
    assert_int_equal(e.param_shard_bytes, 48);
    assert_int_equal(e.grad_shard_bytes, 32);
    assert_int_equal(e.optimizer_bytes, 0);
    pcs_plan_free(p);
}

static void test_size_based_wrap_follows_recursive_wrap(void **state)
{
    (void)state;
    /* linears of 16*8+16 = 144 and 16*16+16 = 272 params, min 100: recursion enters each
     * block (>= 100), the linear wraps (remainder >= 100), the block's remainder (0) does not,
     * the ModuleList never wraps; the head (4*16+4 = 68 < 100) stays with the root. */
    Pcs__V1__Plan *p = plan_of("model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}"
                               "\nwrap: {size_based: {min_num_params: 100}}\n"
                               "mesh: [{dim: dp_shard, size: 2}]",
                               0);
    assert_int_equal(p->n_units, 3);
    assert_string_equal(p->units[1]->path, "layers.0.linear");
    assert_string_equal(p->units[2]->path, "layers.1.linear");
    assert_int_equal(unit_at(p, "")->numel, 68);
    pcs_plan_free(p);
}

/* training.accumulation on 8 wrapped blocks, 4 micro-batches: keep_gathered marks every sharded
 * non-root unit, all-gathers once per phase per step instead of per micro-batch, and its per-rank
 * estimate holds every unit gathered (more than the resharding one); auto keeps only within
 * memory_budget_bytes, and says why in a note. */
static void test_accumulation_keep_gathered_and_auto_budget(void **state)
{
    (void)state;
#define ACC_MLP                                                                                    \
    "model: {mlp: {input_dim: 64, hidden_dims: [64, 64, 64, 64, 64, 64, 64, 64], "              \
    "output_dim: 4}}\nwrap: {module_class: [MLPBlock]}\nmesh: [{dim: dp_shard, size: 2}]\n"
    Pcs__V1__Plan *r = plan_of(ACC_MLP "training: {micro_batches: 4, accumulation: reshard}", 0);
    Pcs__V1__Plan *k =
        plan_of(ACC_MLP "training: {micro_batches: 4, accumulation: keep_gathered}", 0);
    size_t kept = 0;
    for (size_t i = 0; i < k->n_units; i++) {
        assert_false(r->units[i]->keep_gathered_in_accumulation);
        kept += k->units[i]->keep_gathered_in_accumulation;
        assert_int_equal(k->units[i]->keep_gathered_in_accumulation,
                         !k->units[i]->is_root && k->units[i]->numel > 0);
    }
    assert_int_equal(kept, 8);
    Pcs__V1__RankEstimate er, ek;
    assert_int_equal(pcs_plan_rank_estimate(r, 0, &er), PCS_OK);
    assert_int_equal(pcs_plan_rank_estimate(k, 0, &ek), PCS_OK);
    assert_true(ek.peak_unsharded_bytes > er.peak_unsharded_bytes);
    assert_true(ek.all_gather_bytes * 3 < er.all_gather_bytes); /* 2 per unit-step vs 8 */
    /* auto: within the budget keeps (the note says so), below it reshards */
    char y[1024];
    snprintf(y, sizeof y,
             ACC_MLP "training: {micro_batches: 4, memory_budget_bytes: %llu}",
             (unsigned long long)ek.total_bytes);
    Pcs__V1__Plan *a = plan_of(y, 0);
    assert_true(a->units[1]->keep_gathered_in_accumulation);
    pcs_plan_free(a);
    snprintf(y, sizeof y,
             ACC_MLP "training: {micro_batches: 4, memory_budget_bytes: %llu}",
             (unsigned long long)ek.total_bytes - 1);
    a = plan_of(y, 0);
    assert_false(a->units[1]->keep_gathered_in_accumulation);
    int said = 0;
    for (size_t i = 0; i < a->n_notes; i++)
        said |= strstr(a->notes[i], "accumulation: units reshard in every micro-batch") != NULL;
    assert_true(said);
    pcs_plan_free(a);
    /* no budget: auto reshards (FSDP's default) */
    a = plan_of(ACC_MLP "training: {micro_batches: 4}", 0);
    assert_false(a->units[1]->keep_gathered_in_accumulation);
    pcs_plan_free(a);
    pcs_plan_free(r);
    pcs_plan_free(k);
#undef ACC_MLP
}

/* DDP communication hooks (spec §6, cases 24 and 25) next to FSDP's NO_SHARD reduction: the
 * hook divides by the whole data-parallel group before a SUM, in its own dtype; FSDP pre- and
 * post-divides with the §4.2 factors. Gradients accumulate and come back in their own dtype. */
static void test_ddp_hooks_divide_before_a_sum_in_their_dtype_case25(void **state)
{
    (void)state;
#define DDP_MLP                                                                                    \
    "model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\nstrategy: no_shard\n"      \
    "mesh: [{dim: dp_shard, size: 4}]\ntraining: {micro_batches: 2}\n"
    const struct {
        const char *hook;
        Pcs__V1__DType dt;
    } c[] = {{"fp16_compress", DT(FP16)}, {"bf16_compress", DT(BF16)}, {"allreduce", DT(FP32)}};
    for (size_t k = 0; k < 3; k++) {
        char y[512];
        snprintf(y, sizeof y, DDP_MLP "ddp_comm_hook: %s\n", c[k].hook);
        Pcs__V1__Plan *p = plan_of(y, 0);
        const Pcs__V1__Unit *u = unit_at(p, "");
        const Pcs__V1__CollectiveSpec *ar = coll_of(u, COLL(ALL_REDUCE), PHASE(STEP));
        assert_non_null(ar);
        assert_int_equal(ar->dtype, c[k].dt);
        assert_int_equal(u->reduce_dtype, c[k].dt);
        assert_int_equal(u->accum_dtype, DT(FP32)); /* the gradient's own dtype */
        assert_int_equal(u->grad_dtype, DT(FP32));
        assert_int_equal(ar->reduction->op, OP(SUM));
        assert_true(ar->reduction->pre_divide == 4);
        assert_true(ar->reduction->post_divide == 1);
        assert_null(coll_of(u, COLL(ALL_GATHER), PHASE(FORWARD)));
        pcs_plan_free(p);
    }
    /* FSDP NO_SHARD on the same mesh: fp32 AVG (§4.2), no hook */
    Pcs__V1__Plan *p = plan_of(DDP_MLP, 0);
    const Pcs__V1__CollectiveSpec *ar =
        coll_of(unit_at(p, ""), COLL(ALL_REDUCE), PHASE(STEP));
    assert_int_equal(ar->dtype, DT(FP32));
    assert_int_not_equal(ar->reduction->op, OP(SUM));
    pcs_plan_free(p);
#undef DDP_MLP
}

/* A pipelined plan carries a schedule that exists and validates (planner/schedule.h): the
 * schedule and its bubble are noted; a micro-batch count the schedule cannot run is an error
 * naming training.micro_batches. */
static void test_pipeline_schedule_is_validated_and_noted(void **state)
{
    (void)state;
#define PP_MLP                                                                                     \
    "model: {mlp: {input_dim: 8, hidden_dims: [8, 8, 8, 8], output_dim: 4}}\n"                     \
    "wrap: {module_class: [MLPBlock]}\nreshard_after_forward: false\n"                             \
    "mesh: [{dim: dp_shard, size: 2}, {dim: pp, size: 2}]\n"
    Pcs__V1__Plan *p = plan_of(PP_MLP "training: {micro_batches: 8}\n"
                                      "pipeline: {schedule: interleaved_1f1b, virtual_stages: 2}",
                               4);
    int noted = 0;
    for (size_t i = 0; i < p->n_notes; i++)
        noted |= strstr(p->notes[i], "pipeline: interleaved_1f1b over 2 ranks x 2 stages, 8 "
                                     "micro-batches; FSDP unshards each stage once per step; "
                                     "bubble 0.059") != NULL;
    assert_true(noted);
    pcs_plan_free(p);
    expect_error(PP_MLP "training: {micro_batches: 5}\n"
                        "pipeline: {schedule: interleaved_1f1b, virtual_stages: 2}",
                 4, "training.micro_batches: interleaved_1f1b needs a multiple of its 2 rounds");
#undef PP_MLP
}

/* The plan/runtime contract: what a plan asks for that this release's runtime does not run is
 * UNSUPPORTED, naming the spec field (the coordinator refuses it at SubmitJob); everything else
 * the planner builds is runnable. */
static void expect_unrunnable(const char *yaml, uint32_t ws, const char *needle)
{
    Pcs__V1__Plan *p = plan_of(yaml, ws);
    assert_int_equal(pcs_plan_check_runnable(p), PCS_ERR_UNSUPPORTED);
    if (!strstr(pcs_last_error(), needle))
        fail_msg("error '%s' does not contain '%s'", pcs_last_error(), needle);
    pcs_plan_free(p);
}

/* fp64 masters run in programs doing their own math (pcs.torch, a C API program): a job that
 * pcs-worker would take, or one clipping gradients, is refused naming the field. */
static void test_job_check_runnable_fp64_only_for_programs(void **state)
{
    (void)state;
    const struct {
        const char *extra;
        const char *needle; /* NULL: runnable */
    } c[] = {
        {"", "fp64 masters run in programs that do their own math"},
        {"program: pcs-worker\n", "fp64 masters run in programs that do their own math"},
        {"program: pcs.torch\n", NULL},
        {"program: my-trainer\n", NULL},
        {"program: pcs.torch\ntraining: {clip_grad_norm: 1.0}\n",
         "training.clip_grad_norm: not with fp64 masters"},
        {"program: pcs.torch\ntraining: {full_precision_eval: true, eval_backward: true}\n",
         "training.eval_backward: not with fp64 masters"},
        {"program: pcs.torch\nignored_params: [head.bias]\n", NULL},
        {"program: pcs-worker\nignored_params: [head.bias]\n",
         "ignored_params: run in programs that do their own math"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char y[1024];
        snprintf(y, sizeof y,
                 "model: {mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}}\n"
                 "mesh: [{dim: dp_shard, size: 2}]\n"
                 "precision: {master_dtype: fp64, param_dtype: bf16}\n%s",
                 c[i].extra);
        job_t *s = spec_of(y);
        Pcs__V1__Plan *p = NULL;
        assert_int_equal(pcs_plan_build(s, 2, &p), PCS_OK);
        pcs_status_t rc = pcs_job_check_runnable(s, p);
        if (!c[i].needle && rc != PCS_OK)
            fail_msg("case %zu: %s", i, pcs_last_error());
        if (c[i].needle) {
            assert_int_equal(rc, PCS_ERR_UNSUPPORTED);
            if (!strstr(pcs_last_error(), c[i].needle))
                fail_msg("case %zu: '%s' lacks '%s'", i, pcs_last_error(), c[i].needle);
        }
        pcs_plan_free(p);
        spec_free(s);
    }
}

static void test_check_runnable_fp64_needs_fp64_masters(void **state)
{
    (void)state;
#define RUN_MLP                                                                                    \
    "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4, norm: layernorm}}\n"       \
    "wrap: {module_class: [MLPBlock]}\n"
    expect_unrunnable(RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {param_dtype: fp64}", 2,
                      "param dtype fp64 with master dtype fp32; fp64 computing, reducing and "
                      "gradients need fp64 masters");
    expect_unrunnable(RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {reduce_dtype: fp64}",
                      2, "reduce dtype fp64 with master dtype fp32");
    /* an override reaches one unit (the LayerNorm, a unit of its own): the error names it */
    expect_unrunnable(RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\n"
                              "precision: {param_dtype: bf16, overrides: [{match: {module_class: "
                              "LayerNorm}, param_dtype: fp64}]}",
                      2, "precision: unit 2 (layers.0.norm) has param dtype fp64 with master");
    /* runnable: fp64 masters computing in fp64, fp32 or bf16 (the seed's rows) */
    const char *ok64[] = {
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {master_dtype: fp64}",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {master_dtype: fp64, param_dtype: fp32}",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\n"
                "precision: {master_dtype: fp64, param_dtype: bf16, reduce_dtype: fp32}",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {master_dtype: fp64, "
                "reduce_dtype: fp16}\ntraining: {micro_batches: 2, gradient_sync: "
                "every_micro_batch}",
        /* fp64 compute accumulating no-sync micro-batches in the reduce dtype (FSDP2's rule) */
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\n"
                "precision: {master_dtype: fp64, reduce_dtype: bf16}\ntraining: {micro_batches: 2}",
    };
    for (size_t i = 0; i < sizeof ok64 / sizeof ok64[0]; i++) {
        Pcs__V1__Plan *p = plan_of(ok64[i], 0);
        if (pcs_plan_check_runnable(p) != PCS_OK)
            fail_msg("fp64 case %zu: %s", i, pcs_last_error());
        pcs_plan_free(p);
    }
    /* runnable: the policies of the seeds, fp64 buffers, every strategy, one rank */
    const char *ok[] = {
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {param_dtype: bf16, reduce_dtype: fp32}",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {master_dtype: fp16}",
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}]\nprecision: {param_dtype: fp16, buffer_dtype: fp64}",
        RUN_MLP "strategy: no_shard\nmesh: [{dim: dp_shard, size: 4}]",
        RUN_MLP "strategy: hybrid_shard\nmesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 2}]",
        RUN_MLP "mesh: [{dim: pp, size: 1}, {dim: dp_shard, size: 1}]",
        /* pipeline stages run (issue 14) */
        RUN_MLP "mesh: [{dim: dp_shard, size: 2}, {dim: pp, size: 2}]",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        Pcs__V1__Plan *p = plan_of(ok[i], 0);
        if (pcs_plan_check_runnable(p) != PCS_OK)
            fail_msg("case %zu: %s", i, pcs_last_error());
        pcs_plan_free(p);
    }
#undef RUN_MLP
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_layout_matches_spec_table),
        cmocka_unit_test(test_fsdp1_flat_shard_case6),
        cmocka_unit_test(test_aligned_flat_param_case7),
        cmocka_unit_test(test_fsdp2_param_shard_case2),
        cmocka_unit_test(test_fsdp2_all_gather_and_reduce_scatter_packing_cases_4_5),
        cmocka_unit_test(test_fsdp2_shard_dim1_case3),
        cmocka_unit_test(test_check_layout_refuses_inconsistent_per_param_plans),
        cmocka_unit_test(test_eval_backward_plans_full_precision_reductions),
        cmocka_unit_test(test_per_param_layout_only_where_sharded),
        cmocka_unit_test(test_divide_factors_match_spec_table_case8),
        cmocka_unit_test(test_custom_divide_factor_reaches_world_of_one_and_no_shard),
        cmocka_unit_test(test_fsdp2_reduce_op_choice_case9),
        cmocka_unit_test(test_fsdp1_dtype_inference_case11),
        cmocka_unit_test(test_fsdp2_clamp_case12),
        cmocka_unit_test(test_batchnorm_units_have_mixed_precision_off_case20),
        cmocka_unit_test(test_root_kept_unsharded_children_resharded_case21),
        cmocka_unit_test(test_reshard_after_forward_int_case22),
        cmocka_unit_test(test_hsdp_groups_and_averaging_case23),
        cmocka_unit_test(test_no_shard_all_reduces_over_dp),
        cmocka_unit_test(test_strategy_overrides_compose_replicate_and_fully_shard),
        cmocka_unit_test(test_cpu_offload_moves_masters_and_state_to_the_host),
        cmocka_unit_test(test_cast_root_forward_inputs_is_fsdp1s_root_cast),
        cmocka_unit_test(test_ignored_modules_are_unmanaged_units),
        cmocka_unit_test(test_ignored_params_get_unmanaged_units_of_their_own),
        cmocka_unit_test(test_mixed_dtype_group_splits_into_dtype_parts),
        cmocka_unit_test(test_ignored_param_of_a_wrapped_module_keeps_the_estimate),
        cmocka_unit_test(test_gradient_sync_every_micro_batch_estimate),
        cmocka_unit_test(test_dp_pp_mesh_groups_and_stages_section7),
        cmocka_unit_test(test_mlp_expansion_uses_the_fixed_fqn_scheme),
        cmocka_unit_test(test_explicit_tree_keeps_shared_params_once),
        cmocka_unit_test(test_errors_name_every_field_path),
        cmocka_unit_test(test_demo_job_units_and_per_collective_dtypes),
        cmocka_unit_test(test_override_unit_keeps_an_explicit_output_dtype),
        cmocka_unit_test(test_world_size_rescales_dp_shard),
        cmocka_unit_test(test_hash_is_stable_and_covers_the_plan),
        cmocka_unit_test(test_mesh_product_overflow_is_rejected),
        cmocka_unit_test(test_flat_offset_overflow_is_an_error),
        cmocka_unit_test(test_plan_size_does_not_grow_with_world_size),
        cmocka_unit_test(test_rank_estimate_matches_hand_count),
        cmocka_unit_test(test_rank_estimate_skips_frozen_grads_and_optimizer_state),
        cmocka_unit_test(test_size_based_wrap_follows_recursive_wrap),
        cmocka_unit_test(test_check_runnable_fp64_needs_fp64_masters),
        cmocka_unit_test(test_job_check_runnable_fp64_only_for_programs),
        cmocka_unit_test(test_pipeline_schedule_is_validated_and_noted),
        cmocka_unit_test(test_ddp_hooks_divide_before_a_sum_in_their_dtype_case25),
        cmocka_unit_test(test_accumulation_keep_gathered_and_auto_budget),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
