/* Unit runtime of a world of one (no communicators, so no KV): with the prefetch and reduction
 * threads running, a unit whose gradients are handed in with sync on every micro-batch (FSDP2
 * without no-sync) accumulates every micro-batch's reduced gradient exactly once; the copy-in of
 * the next hand-in must not overwrite the reduce buffer while the reduction thread still reads it.
 * Forked worlds of 2 and 4 ranks (file KV store): PREMUL_SUM and unplanned replicated averaging,
 * and host staging of every collective (stage_host) giving the direct path's bits for sharded,
 * replicated and hybrid-sharded units; bad device/collective settings are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "runtime.h"
#include "test_util.h"

#define N (1u << 20)

static pcs_status_t init_zero(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                              float *out)
{
    (void)ctx;
    (void)p;
    (void)first;
    memset(out, 0, n * sizeof *out);
    return PCS_OK;
}

static void test_sync_on_every_micro_batch_reduces_each_hand_in_once(void **state)
{
    (void)state;
    Pcs__V1__Plan plan = PCS__V1__PLAN__INIT;
    Pcs__V1__Unit unit = PCS__V1__UNIT__INIT, *up[1] = {&unit};
    Pcs__V1__ParamSlot ps = PCS__V1__PARAM_SLOT__INIT, *psp[1] = {&ps};
    uint64_t shape[1] = {N};
    ps.fqn = "w";
    ps.n_shape = 1;
    ps.shape = shape;
    ps.numel = N;
    unit.master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    unit.shard_group_size = 1;
    unit.padded_numel = N;
    unit.shard_numel = N;
    unit.n_params = 1;
    unit.params = psp;
    plan.world_size = 1;
    plan.n_units = 1;
    plan.units = up;

    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &plan;
    assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
    rc.micro_batches = 1;
    rc.init_param = init_zero;
    rc.opt = PCS_OPT_SGD;
    pcs_sgd_config_default(&rc.sgd);
    rc.sgd.lr = 1.0;
    rc.sgd.momentum = 0;
    rc.sgd.weight_decay = 0;
    rc.prefetch = 1; /* prefetch and reduction threads */
    pcs_runtime_t *rt = NULL;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);

    float expect = 0;
    for (int step = 0; step < 4; step++) {
        assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
        const float vals[3] = {1.0f, 1000.0f, 1000000.0f};
        for (int m = 0; m < 3; m++) {
            void *g;
            pcs_dtype_t dt;
            assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
            assert_int_equal(dt, PCS_DTYPE_FP32);
            for (uint32_t i = 0; i < N; i++)
                ((float *)g)[i] = vals[m];
            assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t r;
        assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
        assert_false(r.skipped);
        expect -= 1001001.0f;
        pcs_rt_shard_t sh;
        assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
        assert_int_equal(sh.numel, N);
        const float *w = sh.master;
        size_t bad = 0;
        for (uint32_t i = 0; i < N; i++)
            bad += w[i] != expect;
        assert_int_equal(bad, 0);
    }
    pcs_runtime_destroy(rt);
}

/* A no-sync hand-in accumulates even when the job has one micro-batch (the C API lets a program
 * skip the sync on any backward): the next synced hand-in reduces the sum, nothing is dropped. */
static void test_no_sync_hand_in_with_one_micro_batch_is_accumulated(void **state)
{
    (void)state;
    Pcs__V1__Plan plan = PCS__V1__PLAN__INIT;
    Pcs__V1__Unit unit = PCS__V1__UNIT__INIT, *up[1] = {&unit};
    Pcs__V1__ParamSlot ps = PCS__V1__PARAM_SLOT__INIT, *psp[1] = {&ps};
    uint64_t shape[1] = {8};
    ps.fqn = "w";
    ps.n_shape = 1;
    ps.shape = shape;
    ps.numel = 8;
    unit.master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    unit.padded_numel = 8;
    unit.shard_numel = 8;
    unit.n_params = 1;
    unit.params = psp;
    plan.world_size = 1;
    plan.n_units = 1;
    plan.units = up;
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        pcs_runtime_config_t rc;
        memset(&rc, 0, sizeof rc);
        rc.plan = &plan;
        assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
        rc.micro_batches = 1;
        rc.init_param = init_zero;
        rc.opt = PCS_OPT_SGD;
        pcs_sgd_config_default(&rc.sgd);
        rc.sgd.lr = 1.0;
        rc.sgd.momentum = 0;
        rc.prefetch = prefetch;
        pcs_runtime_t *rt = NULL;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
        const float vals[3] = {1.0f, 10.0f, 100.0f};
        for (int m = 0; m < 3; m++) {
            void *g;
            pcs_dtype_t dt;
            assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
            for (int i = 0; i < 8; i++)
                ((float *)g)[i] = vals[m];
            assert_int_equal(pcs_runtime_post_backward(rt, 0, m == 2), PCS_OK);
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t r;
        assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
        pcs_rt_shard_t sh;
        assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
        for (int i = 0; i < 8; i++)
            assert_true(((const float *)sh.master)[i] == -111.0f);
        pcs_runtime_destroy(rt);
    }
}

enum { TWO_PREMUL = 0, TWO_UNPLANNED_REPLICATED = 1 };

/* Rank `r` of 2 (forked), SGD with lr 1 from zero, exit status 0 when every element of the
 * rank's shard is `want`.
 * TWO_PREMUL: one unit sharded over both ranks whose reduce-scatter is PREMUL_SUM(0.25) (FSDP2
 * with a custom gradient divide factor of 4, spec §4.2); gradients of 1 on every rank make each
 * shard element 0.25 + 0.25, so -0.5.
 * TWO_UNPLANNED_REPLICATED: a replicated unit (2 data-parallel replicas) without a planned
 * collective is averaged: gradients 1 and 3 give 2, so -2 (a plain sum would give -4). */
static int two_rank_main(const char *kvdir, uint32_t r, int mode)
{
    Pcs__V1__Plan plan = PCS__V1__PLAN__INIT;
    Pcs__V1__MeshDim md = PCS__V1__MESH_DIM__INIT, *mdp[1] = {&md};
    Pcs__V1__Unit unit = PCS__V1__UNIT__INIT, *up[1] = {&unit};
    Pcs__V1__ParamSlot ps = PCS__V1__PARAM_SLOT__INIT, *psp[1] = {&ps};
    Pcs__V1__Reduction red = PCS__V1__REDUCTION__INIT;
    Pcs__V1__CollectiveSpec rs = PCS__V1__COLLECTIVE_SPEC__INIT, *csp[1] = {&rs};
    uint64_t shape[1] = {8};
    ps.fqn = "w";
    ps.n_shape = 1;
    ps.shape = shape;
    ps.numel = 8;
    red.op = PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM;
    red.premul = 0.25;
    rs.kind = PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER;
    rs.dtype = PCS__V1__DTYPE__DTYPE_FP32;
    rs.reduction = &red;
    rs.group = PCS__V1__GROUP_KIND__GROUP_KIND_SHARD;
    rs.group_size = 2;
    rs.count = 4;
    unit.master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    unit.shard_group_size = 2;
    unit.padded_numel = 8;
    unit.shard_numel = 4;
    unit.n_params = 1;
    unit.params = psp;
    unit.n_collectives = 1;
    unit.collectives = csp;
    md.dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    md.size = 2;
    plan.world_size = 2;
    plan.n_mesh = 1;
    plan.mesh = mdp;
    plan.shard_size = 2;
    plan.dp_size = 2;
    plan.n_units = 1;
    plan.units = up;
    float grad = 1.0f, want = -0.5f;
    uint64_t shard = 4;
    if (mode == TWO_UNPLANNED_REPLICATED) {
        md.dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE;
        plan.shard_size = 1;
        plan.replicate_size = 2;
        unit.shard_group_size = 1;
        unit.shard_numel = 8;
        unit.n_collectives = 0;
        shard = 8;
        grad = r == 0 ? 1.0f : 3.0f;
        want = -2.0f;
    }

    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &plan;
    rc.rank = r;
    rc.kv = kv;
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 20000;
    if (pcs_backend_get("cpu", &rc.be) != PCS_OK)
        return 3;
    rc.micro_batches = 1;
    rc.init_param = init_zero;
    rc.opt = PCS_OPT_SGD;
    pcs_sgd_config_default(&rc.sgd);
    rc.sgd.lr = 1.0;
    rc.sgd.momentum = 0;
    rc.prefetch = 1;
    pcs_runtime_t *rt = NULL;
    int bad = 4;
    if (pcs_runtime_create(&rc, &rt) == PCS_OK) {
        void *g;
        pcs_dtype_t dt;
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t res;
        pcs_rt_shard_t sh;
        if (pcs_runtime_begin_step(rt) == PCS_OK &&
            pcs_runtime_grad_buffer(rt, 0, &g, &dt) == PCS_OK) {
            for (int i = 0; i < 8; i++)
                ((float *)g)[i] = grad;
            if (pcs_runtime_post_backward(rt, 0, 1) == PCS_OK &&
                pcs_runtime_optimizer_step(rt, &o, &res) == PCS_OK &&
                pcs_runtime_shard(rt, 0, &sh) == PCS_OK && sh.numel == shard) {
                bad = 0;
                for (uint64_t i = 0; i < shard; i++)
                    if (((const float *)sh.master)[i] != want) {
                        fprintf(stderr, "rank %u: element %llu is %g, want %g\n", r,
                                (unsigned long long)i, (double)((const float *)sh.master)[i],
                                (double)want);
                        bad = 1;
                    }
            }
        }
        if (bad == 4)
            fprintf(stderr, "rank %u: %s\n", r, pcs_last_error());
        if (pcs_runtime_barrier(rt) != PCS_OK && !bad)
            bad = 5;
        pcs_runtime_destroy(rt);
    } else {
        fprintf(stderr, "rank %u: create: %s\n", r, pcs_last_error());
    }
    pcs_kv_destroy(kv);
    return bad;
}

static void run_two_ranks(int mode)
{
    char *dir = pcs_test_tmpdir("rt-two");
    char kvdir[1024];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    pid_t pids[2];
    for (uint32_t r = 0; r < 2; r++) {
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(two_rank_main(kvdir, r, mode));
    }
    for (int r = 0; r < 2; r++) {
        int ws = 0;
        assert_int_equal(waitpid(pids[r], &ws, 0), pids[r]);
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_premul_sum_reduce_scatter_multiplies_every_input(void **state)
{
    (void)state;
    run_two_ranks(TWO_PREMUL);
}

static void test_replicated_unit_without_a_planned_all_reduce_is_averaged(void **state)
{
    (void)state;
    run_two_ranks(TWO_UNPLANNED_REPLICATED);
}

// ---- host staging gives the direct path's bits ----

enum { STAGE_FULL = 0, STAGE_NO_SHARD = 1, STAGE_HYBRID = 2 };

#define SP_UNITS 2
#define SP_STEPS 4

/* A plan of two units (bf16 params, fp32 reduce): unit 0 is sharded over the shard dim (FULL:
 * reduce-scatter AVG; HYBRID: reduce-scatter SUM pre-divide 2 then an all-reduce SUM post-divide 2
 * over the replicas), unit 1 is replicated (averaged over every data-parallel rank, no planned
 * collective). NO_SHARD: both units replicated, unit 0 with a planned fp32 all-reduce AVG over
 * the DP group. Sizes are odd so the sharded unit has padding. */
typedef struct stage_plan {
    Pcs__V1__Plan plan;
    Pcs__V1__MeshDim md[2], *mdp[2];
    Pcs__V1__Unit unit[SP_UNITS], *up[SP_UNITS];
    Pcs__V1__ParamSlot ps[SP_UNITS], *psp[SP_UNITS][1];
    Pcs__V1__Reduction red[2];
    Pcs__V1__CollectiveSpec cs[2], *csp[2];
    uint64_t shape[SP_UNITS][1];
} stage_plan_t;

static uint32_t stage_world(int mode)
{
    return mode == STAGE_HYBRID ? 4 : 2;
}

static void stage_plan_build(stage_plan_t *b, int mode)
{
    static const uint64_t numel[SP_UNITS] = {999, 37};
    memset(b, 0, sizeof *b);
    Pcs__V1__Plan plan0 = PCS__V1__PLAN__INIT;
    b->plan = plan0;
    uint32_t shard = mode == STAGE_NO_SHARD ? 1 : 2, rep = mode == STAGE_HYBRID ? 2 : 1;
    size_t nm = 0;
    Pcs__V1__MeshDim md0 = PCS__V1__MESH_DIM__INIT;
    if (mode == STAGE_HYBRID) {
        b->md[nm] = md0;
        b->md[nm].dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE;
        b->md[nm].size = 2;
        nm++;
    }
    b->md[nm] = md0;
    b->md[nm].dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    b->md[nm].size = 2;
    nm++;
    for (size_t i = 0; i < nm; i++)
        b->mdp[i] = &b->md[i];
    b->plan.world_size = stage_world(mode);
    b->plan.n_mesh = nm;
    b->plan.mesh = b->mdp;
    b->plan.shard_size = shard;
    b->plan.replicate_size = rep;
    b->plan.dp_size = stage_world(mode);
    for (int k = 0; k < 2; k++) {
        Pcs__V1__Reduction r0 = PCS__V1__REDUCTION__INIT;
        Pcs__V1__CollectiveSpec c0 = PCS__V1__COLLECTIVE_SPEC__INIT;
        b->red[k] = r0;
        b->cs[k] = c0;
        b->cs[k].dtype = PCS__V1__DTYPE__DTYPE_FP32;
        b->cs[k].reduction = &b->red[k];
        b->csp[k] = &b->cs[k];
    }
    for (int i = 0; i < SP_UNITS; i++) {
        Pcs__V1__Unit u0 = PCS__V1__UNIT__INIT;
        Pcs__V1__ParamSlot p0 = PCS__V1__PARAM_SLOT__INIT;
        Pcs__V1__Unit *u = &b->unit[i];
        *u = u0;
        b->ps[i] = p0;
        b->shape[i][0] = numel[i];
        b->ps[i].fqn = i == 0 ? "a" : "b";
        b->ps[i].n_shape = 1;
        b->ps[i].shape = b->shape[i];
        b->ps[i].numel = numel[i];
        b->psp[i][0] = &b->ps[i];
        u->n_params = 1;
        u->params = b->psp[i];
        u->master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
        u->param_dtype = PCS__V1__DTYPE__DTYPE_BF16;
        u->reduce_dtype = PCS__V1__DTYPE__DTYPE_FP32;
        int sharded = i == 0 && mode != STAGE_NO_SHARD;
        u->shard_group_size = sharded ? 2 : 1;
        u->padded_numel = sharded ? (numel[i] + 1) / 2 * 2 : numel[i];
        u->shard_numel = u->padded_numel / u->shard_group_size;
        b->up[i] = u;
    }
    Pcs__V1__Unit *u = &b->unit[0];
    if (mode == STAGE_FULL) {
        b->cs[0].kind = PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER;
        b->cs[0].group = PCS__V1__GROUP_KIND__GROUP_KIND_SHARD;
        b->red[0].op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
        u->n_collectives = 1;
    } else if (mode == STAGE_HYBRID) {
        b->cs[0].kind = PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER;
        b->cs[0].group = PCS__V1__GROUP_KIND__GROUP_KIND_SHARD;
        b->red[0].op = PCS__V1__REDUCE_OP__REDUCE_OP_SUM;
        b->red[0].pre_divide = 2;
        b->red[0].post_divide = 2;
        b->cs[1].kind = PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE;
        b->cs[1].group = PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE;
        b->red[1].op = PCS__V1__REDUCE_OP__REDUCE_OP_SUM;
        b->red[1].post_divide = 2;
        u->n_collectives = 2;
    } else {
        b->cs[0].kind = PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE;
        b->cs[0].group = PCS__V1__GROUP_KIND__GROUP_KIND_DP;
        b->red[0].op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
        u->n_collectives = 1;
    }
    u->collectives = b->csp;
    b->plan.n_units = SP_UNITS;
    b->plan.units = b->up;
}

/* Initial values: a function of the element index only (any world size starts alike). */
static pcs_status_t init_wave(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                              float *out)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = first + i + (p->fqn[0] == 'b' ? 5000 : 0);
        out[i] = (float)((int)((k * 2654435761u) % 2001u) - 1000) / 1024.0f;
    }
    return PCS_OK;
}

/* Everything a run produced, for a bitwise comparison of the two paths. */
typedef struct stage_result {
    float *master[SP_UNITS], *a[SP_UNITS], *b[SP_UNITS];
    uint16_t *unsharded[SP_UNITS];
    uint64_t numel[SP_UNITS], padded[SP_UNITS];
    double grad_norm[SP_STEPS];
    int skipped[SP_STEPS];
} stage_result_t;

static void stage_result_free(stage_result_t *r)
{
    for (int i = 0; i < SP_UNITS; i++) {
        free(r->master[i]);
        free(r->a[i]);
        free(r->b[i]);
        free(r->unsharded[i]);
    }
}

/* SP_STEPS steps of 2 micro-batches (no-sync, then sync) with AdamW, the grad scaler, clipping
 * and (step 2) an +Inf injected on the last rank; gradients depend on the gathered parameters,
 * the rank and the micro-batch, so every collective feeds the next step. 0 on success. */
static int stage_run(pcs_kv_t *kv, int mode, uint32_t r, int stage, stage_result_t *out)
{
    stage_plan_t b;
    stage_plan_build(&b, mode);
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    rc.rank = r;
    rc.kv = kv;
    rc.job_tag = stage ? "staged-" : "direct-";
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 20000;
    if (pcs_backend_get("cpu", &rc.be) != PCS_OK)
        return 10;
    rc.micro_batches = 2;
    rc.init_param = init_wave;
    rc.opt = PCS_OPT_ADAMW;
    pcs_adamw_config_default(&rc.adamw);
    rc.adamw.lr = 1e-2;
    rc.prefetch = 1;
    rc.coll = PCS_COLL_GLOO;
    rc.stage_host = stage;
    pcs_runtime_t *rt = NULL;
    if (pcs_runtime_create(&rc, &rt) != PCS_OK) {
        fprintf(stderr, "rank %u: create: %s\n", r, pcs_last_error());
        return 11;
    }
    int rv = 0;
    for (int step = 0; step < SP_STEPS && !rv; step++) {
        if (pcs_runtime_begin_step(rt) != PCS_OK)
            rv = 12;
        for (int m = 0; m < 2 && !rv; m++) {
            for (uint32_t ui = 0; ui < SP_UNITS && !rv; ui++)
                if (pcs_runtime_prefetch(rt, ui) != PCS_OK)
                    rv = 13;
            for (uint32_t k = SP_UNITS; k-- > 0 && !rv;) { /* backward order */
                const void *p;
                void *g;
                pcs_dtype_t pdt, gdt;
                if (pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK ||
                    pcs_runtime_grad_buffer(rt, k, &g, &gdt) != PCS_OK || gdt != PCS_DTYPE_BF16) {
                    rv = 14;
                    break;
                }
                const uint16_t *pv = p;
                uint16_t *gv = g;
                for (uint64_t i = 0; i < b.unit[k].padded_numel; i++) {
                    float x = pcs_bf16_to_f32(pv[i]);
                    float y = x * 0.75f + 0.03125f * (float)((r + 1) * (i % 7)) -
                              0.0625f * (float)(m + step);
                    gv[i] = pcs_f32_to_bf16(y * 512.0f); /* gradients times the loss scale */
                }
                if (pcs_runtime_post_backward(rt, k, m == 1) != PCS_OK ||
                    pcs_runtime_reshard(rt, k) != PCS_OK)
                    rv = 15;
            }
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        o.clip_norm = 1.0;
        o.scaler = 1;
        o.loss_scale = 512.0;
        o.inject_inf = step == 2 && r == stage_world(mode) - 1;
        pcs_rt_step_result_t res;
        if (!rv && pcs_runtime_optimizer_step(rt, &o, &res) != PCS_OK)
            rv = 16;
        out->grad_norm[step] = res.grad_norm;
        out->skipped[step] = res.skipped;
        /* collective times come from events around each collective: nonzero where the step ran
         * that kind (every mode reduce-scatters or all-reduces gradients; only sharded units
         * all-gather) */
        pcs_rt_stats_t st;
        pcs_runtime_stats(rt, &st);
        int has_ag = mode != STAGE_NO_SHARD;
        if (!rv && (!(st.all_gather_ms > 0) != !has_ag ||
                    !(st.reduce_scatter_ms + st.all_reduce_ms > 0))) {
            fprintf(stderr, "rank %u step %d: timings ag %.3f rs %.3f ar %.3f ms\n", r, step,
                    st.all_gather_ms, st.reduce_scatter_ms, st.all_reduce_ms);
            rv = 23;
        }
    }
    for (uint32_t k = 0; k < SP_UNITS && !rv; k++) {
        pcs_rt_shard_t sh;
        const void *p;
        pcs_dtype_t pdt;
        if (pcs_runtime_shard(rt, k, &sh) != PCS_OK ||
            pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK) {
            rv = 17;
            break;
        }
        out->numel[k] = sh.numel;
        out->padded[k] = b.unit[k].padded_numel;
        out->master[k] = calloc(sh.numel, sizeof(float));
        out->a[k] = calloc(sh.numel, sizeof(float));
        out->b[k] = calloc(sh.numel, sizeof(float));
        out->unsharded[k] = calloc(out->padded[k], sizeof(uint16_t));
        if (!out->master[k] || !out->a[k] || !out->b[k] || !out->unsharded[k] ||
            pcs_runtime_shard_to_host(rt, k, out->master[k], out->a[k], out->b[k]) != PCS_OK) {
            rv = 18;
            break;
        }
        memcpy(out->unsharded[k], p, out->padded[k] * sizeof(uint16_t));
    }
    if (rv)
        fprintf(stderr, "rank %u (%s): failed (%d): %s\n", r, stage ? "staged" : "direct", rv,
                pcs_last_error());
    if (pcs_runtime_barrier(rt) != PCS_OK && !rv)
        rv = 19;
    pcs_runtime_destroy(rt);
    return rv;
}

static int stage_rank_main(const char *kvdir, uint32_t r, int mode)
{
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    stage_result_t d, s;
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    int rv = stage_run(kv, mode, r, 0, &d);
    if (!rv)
        rv = stage_run(kv, mode, r, 1, &s);
    for (int step = 0; step < SP_STEPS && !rv; step++) {
        /* the injected +Inf makes every rank skip step 2, and only that one */
        if (memcmp(&d.grad_norm[step], &s.grad_norm[step], sizeof(double)) != 0 ||
            d.skipped[step] != s.skipped[step] || d.skipped[step] != (step == 2)) {
            fprintf(stderr, "rank %u step %d: grad norm %.9g/%.9g skipped %d/%d\n", r, step,
                    d.grad_norm[step], s.grad_norm[step], d.skipped[step], s.skipped[step]);
            rv = 20;
        }
    }
    for (int k = 0; k < SP_UNITS && !rv; k++) {
        size_t nb = d.numel[k] * sizeof(float);
        int moved = 0;
        for (uint64_t i = 0; i < d.numel[k]; i++)
            moved |= d.a[k][i] != 0.0f; /* AdamW state is nonzero once a step ran */
        if (d.numel[k] != s.numel[k] || memcmp(d.master[k], s.master[k], nb) != 0 ||
            memcmp(d.a[k], s.a[k], nb) != 0 || memcmp(d.b[k], s.b[k], nb) != 0 ||
            memcmp(d.unsharded[k], s.unsharded[k], d.padded[k] * sizeof(uint16_t)) != 0 || !moved) {
            fprintf(stderr, "rank %u unit %d: staged run differs from the direct one (moved %d)\n",
                    r, k, moved);
            rv = 21;
        }
    }
    stage_result_free(&d);
    stage_result_free(&s);
    pcs_kv_destroy(kv);
    return rv;
}

static void run_stage_parity(int mode)
{
    char *dir = pcs_test_tmpdir("rt-stage");
    char kvdir[1024];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    uint32_t w = stage_world(mode);
    pid_t pids[4];
    for (uint32_t r = 0; r < w; r++) {
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(stage_rank_main(kvdir, r, mode));
    }
    for (uint32_t r = 0; r < w; r++) {
        int ws = 0;
        assert_int_equal(waitpid(pids[r], &ws, 0), pids[r]);
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_staged_full_shard_w2_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(STAGE_FULL);
}

static void test_staged_no_shard_w2_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(STAGE_NO_SHARD);
}

static void test_staged_hybrid_shard_w4_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(STAGE_HYBRID);
}

/* The cpu backend's events carry the host clock at record time: elapsed time between two records
 * spans what ran between them; an event never recorded has no time. */
static void test_cpu_event_elapsed_is_host_time_between_records(void **state)
{
    (void)state;
    const pcs_backend_ops_t *be = NULL;
    assert_int_equal(pcs_backend_get("cpu", &be), PCS_OK);
    pcs_event_t e0 = NULL, e1 = NULL;
    assert_int_equal(be->event_create(&e0), PCS_OK);
    assert_int_equal(be->event_create(&e1), PCS_OK);
    float ms = -1;
    assert_int_equal(be->event_elapsed_ms(e0, e1, &ms), PCS_ERR_STATE);
    assert_int_equal(be->event_record(e0, NULL), PCS_OK);
    usleep(20000);
    assert_int_equal(be->event_record(e1, NULL), PCS_OK);
    assert_int_equal(be->event_sync(e1), PCS_OK);
    assert_int_equal(be->event_elapsed_ms(e0, e1, &ms), PCS_OK);
    assert_true(ms >= 19.0f && ms < 5000.0f);
    assert_int_equal(be->event_elapsed_ms(e0, NULL, &ms), PCS_ERR_INVALID_ARG);
    be->event_destroy(e0);
    be->event_destroy(e1);
}

/* NCCL needs device buffers: on the cpu backend (or with host staging) it is refused with a
 * reason, as is a collective backend that does not exist. */
static void test_nccl_on_host_buffers_is_refused_with_a_reason(void **state)
{
    (void)state;
    stage_plan_t b;
    stage_plan_build(&b, STAGE_FULL);
    b.plan.world_size = 1; /* no communicator is ever created */
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
    rc.init_param = init_wave;
    rc.coll = PCS_COLL_NCCL;
    pcs_runtime_t *rt = NULL;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_ERR_INVALID_ARG);
    assert_null(rt);
    assert_non_null(strstr(pcs_last_error(), "NCCL needs device buffers (backend cpu)"));
    rc.coll = (pcs_coll_backend_t)7;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "unknown collective backend 7"));
    rc.coll = PCS_COLL_GLOO;
    rc.device = 1; /* the cpu backend has device 0 only */
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_ERR_INVALID_ARG);
    assert_null(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_on_every_micro_batch_reduces_each_hand_in_once),
        cmocka_unit_test(test_no_sync_hand_in_with_one_micro_batch_is_accumulated),
        cmocka_unit_test(test_premul_sum_reduce_scatter_multiplies_every_input),
        cmocka_unit_test(test_replicated_unit_without_a_planned_all_reduce_is_averaged),
        cmocka_unit_test(test_staged_full_shard_w2_is_bit_identical_to_direct),
        cmocka_unit_test(test_staged_no_shard_w2_is_bit_identical_to_direct),
        cmocka_unit_test(test_staged_hybrid_shard_w4_is_bit_identical_to_direct),
        cmocka_unit_test(test_nccl_on_host_buffers_is_refused_with_a_reason),
        cmocka_unit_test(test_cpu_event_elapsed_is_host_time_between_records),
    };
    return cmocka_run_group_tests_name("runtime", tests, NULL, NULL);
}
