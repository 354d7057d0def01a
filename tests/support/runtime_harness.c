/* Shared harness of the runtime parity tests: plan, initial values, the step sequence, the
 * comparison of two runs and forked ranks (runtime_harness.h). Linked into test_runtime and
 * test_runtime_cuda; not part of any shipped binary. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pcs/half.h"
#include "pcs/kernels.h"
#include "runtime_harness.h"
#include "test_util.h"

// ---- plan and initial values ----

void pcs_rth_plan_build(pcs_rth_plan_t *b, pcs_rth_layout_t layout, uint32_t world,
                        const uint64_t numel[PCS_RTH_UNITS])
{
    memset(b, 0, sizeof *b);
    Pcs__V1__Plan plan0 = PCS__V1__PLAN__INIT;
    b->plan = plan0;
    /* ranks one unit-0 shard group spans */
    uint32_t sgs = layout == PCS_RTH_HYBRID ? 2 : world;
    uint32_t rep = layout == PCS_RTH_HYBRID ? 2 : 1;
    size_t nm = 0;
    Pcs__V1__MeshDim md0 = PCS__V1__MESH_DIM__INIT;
    if (layout == PCS_RTH_HYBRID) {
        b->md[nm] = md0;
        b->md[nm].dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE;
        b->md[nm].size = 2;
        nm++;
    }
    b->md[nm] = md0;
    b->md[nm].dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    b->md[nm].size = sgs;
    nm++;
    for (size_t i = 0; i < nm; i++)
        b->mdp[i] = &b->md[i];
    b->plan.world_size = world;
    b->plan.n_mesh = nm;
    b->plan.mesh = b->mdp;
    b->plan.shard_size = layout == PCS_RTH_NO_SHARD ? 1 : sgs;
    b->plan.replicate_size = rep;
    b->plan.dp_size = world;
    for (int k = 0; k < 2; k++) {
        Pcs__V1__Reduction r0 = PCS__V1__REDUCTION__INIT;
        Pcs__V1__CollectiveSpec c0 = PCS__V1__COLLECTIVE_SPEC__INIT;
        b->red[k] = r0;
        b->cs[k] = c0;
        b->cs[k].dtype = PCS__V1__DTYPE__DTYPE_FP32;
        b->cs[k].reduction = &b->red[k];
        b->csp[k] = &b->cs[k];
    }
    int sharded = layout != PCS_RTH_NO_SHARD && sgs > 1;
    for (int i = 0; i < PCS_RTH_UNITS; i++) {
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
        int sh = i == 0 && sharded;
        u->shard_group_size = sh ? sgs : 1;
        u->padded_numel = sh ? (numel[i] + sgs - 1) / sgs * sgs : numel[i];
        u->shard_numel = u->padded_numel / u->shard_group_size;
        b->up[i] = u;
    }
    Pcs__V1__Unit *u = &b->unit[0];
    if (layout == PCS_RTH_FULL && sharded) {
        b->cs[0].kind = PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER;
        b->cs[0].group = PCS__V1__GROUP_KIND__GROUP_KIND_SHARD;
        b->cs[0].group_size = sgs;
        b->cs[0].count = u->shard_numel;
        b->red[0].op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
        u->n_collectives = 1;
    } else if (layout == PCS_RTH_HYBRID) {
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
    } else if (layout == PCS_RTH_NO_SHARD) {
        b->cs[0].kind = PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE;
        b->cs[0].group = PCS__V1__GROUP_KIND__GROUP_KIND_DP;
        b->red[0].op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
        u->n_collectives = 1;
    }
    if (u->n_collectives)
        u->collectives = b->csp;
    b->plan.n_units = PCS_RTH_UNITS;
    b->plan.units = b->up;
}

pcs_status_t pcs_rth_init_wave(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                               float *out)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = first + i + (p->fqn[0] == 'b' ? 5000 : 0);
        out[i] = (float)((int)((k * 2654435761u) % 2001u) - 1000) / 1024.0f;
    }
    return PCS_OK;
}

void pcs_rth_result_free(pcs_rth_result_t *r)
{
    for (int i = 0; i < PCS_RTH_UNITS; i++) {
        free(r->master[i]);
        free(r->a[i]);
        free(r->b[i]);
        free(r->unsharded[i]);
    }
}

// ---- the step sequence ----

/* The "model" of one micro-batch for unit k: reads the gathered parameters, writes gradients
 * (times the loss scale), both through copies ordered on the compute stream. */
static int synth_grads(const pcs_backend_ops_t *be, pcs_stream_t cs, const void *p, void *g,
                       uint64_t n, uint32_t rank, int m, int step, uint16_t *hp, uint16_t *hg)
{
    if (be->copy(hp, p, n * 2, PCS_COPY_D2H, cs) != PCS_OK || be->sync(cs) != PCS_OK)
        return 16;
    for (uint64_t i = 0; i < n; i++) {
        float x = pcs_bf16_to_f32(hp[i]);
        float y =
            x * 0.75f + 0.03125f * (float)((rank + 1) * (i % 7)) - 0.0625f * (float)(m + step);
        hg[i] = pcs_f32_to_bf16(y * 512.0f);
    }
    if (be->copy(g, hg, n * 2, PCS_COPY_H2D, cs) != PCS_OK || be->sync(cs) != PCS_OK)
        return 17;
    return 0;
}

/* In a world > 1 the collectives are timed by events: nonzero where this step ran the kind
 * (only a sharded unit all-gathers; a sharded layout reduce-scatters, NO_SHARD all-reduces). */
static int check_timings(pcs_runtime_t *rt, const pcs_rth_run_t *c, int step)
{
    if (c->world <= 1)
        return 0;
    pcs_rt_stats_t st;
    pcs_runtime_stats(rt, &st);
    int has_ag = c->layout != PCS_RTH_NO_SHARD;
    double red_ms = c->layout == PCS_RTH_NO_SHARD ? st.all_reduce_ms : st.reduce_scatter_ms;
    if (!(st.all_gather_ms > 0) != !has_ag || !(red_ms > 0) ||
        !(st.reduce_scatter_ms + st.all_reduce_ms > 0)) {
        fprintf(stderr, "rank %u %s step %d: timings ag %.4f rs %.4f ar %.4f ms\n", c->rank,
                c->job_tag, step, st.all_gather_ms, st.reduce_scatter_ms, st.all_reduce_ms);
        return 23;
    }
    return 0;
}

/* Shards, optimizer state and the re-gathered parameters of every unit into *out. */
static int copy_out(pcs_runtime_t *rt, const pcs_rth_plan_t *b, const pcs_backend_ops_t *be,
                    pcs_stream_t cs, pcs_rth_result_t *out)
{
    for (uint32_t k = 0; k < PCS_RTH_UNITS; k++) {
        pcs_rt_shard_t sh;
        const void *p;
        pcs_dtype_t pdt;
        if (pcs_runtime_shard(rt, k, &sh) != PCS_OK ||
            pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK)
            return 19;
        out->numel[k] = sh.numel;
        out->padded[k] = b->unit[k].padded_numel;
        out->master[k] = calloc(sh.numel, sizeof(float));
        out->a[k] = calloc(sh.numel, sizeof(float));
        out->b[k] = calloc(sh.numel, sizeof(float));
        out->unsharded[k] = calloc(out->padded[k], sizeof(uint16_t));
        if (!out->master[k] || !out->a[k] || !out->b[k] || !out->unsharded[k] ||
            pcs_runtime_shard_to_host(rt, k, out->master[k], out->a[k], out->b[k]) != PCS_OK ||
            be->copy(out->unsharded[k], p, out->padded[k] * 2, PCS_COPY_D2H, cs) != PCS_OK ||
            be->sync(cs) != PCS_OK)
            return 20;
        if (pcs_runtime_reshard(rt, k) != PCS_OK)
            return 21;
    }
    return 0;
}

/* One step: 2 micro-batches in backward order, then the optimizer step. */
static int one_step(pcs_runtime_t *rt, const pcs_rth_run_t *c, const pcs_rth_plan_t *b,
                    const pcs_backend_ops_t *be, pcs_stream_t cs, int step, uint16_t *hp,
                    uint16_t *hg, pcs_rth_result_t *out)
{
    if (pcs_runtime_begin_step(rt) != PCS_OK)
        return 14;
    for (int m = 0; m < 2; m++) {
        for (uint32_t ui = 0; c->prefetch_all && ui < PCS_RTH_UNITS; ui++)
            if (pcs_runtime_prefetch(rt, ui) != PCS_OK)
                return 13;
        for (uint32_t k = PCS_RTH_UNITS; k-- > 0;) {
            const void *p;
            void *g;
            pcs_dtype_t pdt, gdt;
            if (pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK ||
                pcs_runtime_grad_buffer(rt, k, &g, &gdt) != PCS_OK || pdt != PCS_DTYPE_BF16 ||
                gdt != PCS_DTYPE_BF16)
                return 15;
            int rv = synth_grads(be, cs, p, g, b->unit[k].padded_numel, c->rank, m, step, hp, hg);
            if (rv)
                return rv;
            if (pcs_runtime_post_backward(rt, k, m == 1) != PCS_OK ||
                pcs_runtime_reshard(rt, k) != PCS_OK)
                return 17;
        }
    }
    pcs_rt_step_opts_t o;
    memset(&o, 0, sizeof o);
    o.clip_norm = c->clip_norm;
    o.scaler = 1;
    o.loss_scale = 512.0;
    o.inject_inf = step == 2 && c->rank == c->world - 1;
    pcs_rt_step_result_t res;
    memset(&res, 0, sizeof res);
    if (pcs_runtime_optimizer_step(rt, &o, &res) != PCS_OK)
        return 18;
    out->grad_norm[step] = res.grad_norm;
    out->skipped[step] = res.skipped;
    return check_timings(rt, c, step);
}

int pcs_rth_run_steps(const pcs_rth_run_t *c, pcs_rth_result_t *out)
{
    pcs_rth_plan_t b;
    pcs_rth_plan_build(&b, c->layout, c->world, c->numel);
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get(c->backend, &be) != PCS_OK || be->set_device(c->device) != PCS_OK)
        return 10;
    pcs_stream_t cs = NULL;
    if (be->stream_create(&cs) != PCS_OK)
        return 11;
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    rc.rank = c->rank;
    rc.kv = c->kv;
    rc.job_tag = c->job_tag;
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 60000;
    rc.be = be;
    rc.micro_batches = 2;
    rc.init_param = pcs_rth_init_wave;
    rc.opt = PCS_OPT_ADAMW;
    pcs_adamw_config_default(&rc.adamw);
    rc.adamw.lr = 1e-2;
    rc.prefetch = 1;
    rc.stream = cs;
    rc.device = c->device;
    rc.coll = c->coll;
    rc.stage_host = c->stage_host;
    pcs_runtime_t *rt = NULL;
    if (pcs_runtime_create(&rc, &rt) != PCS_OK) {
        fprintf(stderr, "rank %u %s: create: %s\n", c->rank, c->job_tag, pcs_last_error());
        be->stream_destroy(cs);
        return 12;
    }
    uint64_t maxp = 0;
    for (int k = 0; k < PCS_RTH_UNITS; k++)
        maxp = b.unit[k].padded_numel > maxp ? b.unit[k].padded_numel : maxp;
    uint16_t *hp = calloc(maxp, sizeof *hp), *hg = calloc(maxp, sizeof *hg);
    int rv = hp && hg ? 0 : 13;
    for (int step = 0; step < PCS_RTH_STEPS && !rv; step++)
        rv = one_step(rt, c, &b, be, cs, step, hp, hg, out);
    if (!rv)
        rv = copy_out(rt, &b, be, cs, out);
    if (rv)
        fprintf(stderr, "rank %u %s (%s): failed (%d): %s\n", c->rank, c->job_tag, c->backend, rv,
                pcs_last_error());
    if (pcs_runtime_barrier(rt) != PCS_OK && !rv)
        rv = 22;
    pcs_runtime_destroy(rt);
    be->stream_destroy(cs);
    free(hp);
    free(hg);
    return rv;
}

// ---- comparison ----

/* |a - b| <= rtol |b| element-wise (rtol 0: identical bits). */
static int floats_match(const float *a, const float *b, uint64_t n, double rtol)
{
    if (rtol == 0)
        return memcmp(a, b, n * sizeof(float)) == 0;
    for (uint64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - (double)b[i]) <= rtol * fabs((double)b[i])))
            return 0;
    return 1;
}

int pcs_rth_compare(const pcs_rth_result_t *x, const pcs_rth_result_t *ref, double rtol,
                    double norm_rtol, uint32_t rank, const char *what)
{
    for (int s = 0; s < PCS_RTH_STEPS; s++) {
        int norm_ok;
        if (norm_rtol == 0)
            norm_ok = memcmp(&x->grad_norm[s], &ref->grad_norm[s], sizeof(double)) == 0;
        else if (x->skipped[s])
            norm_ok = isinf(x->grad_norm[s]) && isinf(ref->grad_norm[s]);
        else
            norm_ok = fabs(x->grad_norm[s] - ref->grad_norm[s]) <=
                      norm_rtol * fabs(ref->grad_norm[s]) + 1e-30;
        /* the injected +Inf makes every rank skip step 2, and only that one */
        if (x->skipped[s] != ref->skipped[s] || x->skipped[s] != (s == 2) || !norm_ok) {
            fprintf(stderr, "rank %u step %d: %s: skipped %d/%d grad norm %.9g/%.9g\n", rank, s,
                    what, x->skipped[s], ref->skipped[s], x->grad_norm[s], ref->grad_norm[s]);
            return 30;
        }
    }
    for (int k = 0; k < PCS_RTH_UNITS; k++) {
        uint64_t n = ref->numel[k];
        int moved = 0;
        for (uint64_t i = 0; i < n; i++)
            moved |= ref->a[k][i] != 0.0f; /* AdamW state is nonzero once a step ran */
        int unsh_ok = x->padded[k] == ref->padded[k];
        if (unsh_ok && rtol == 0) {
            unsh_ok = memcmp(x->unsharded[k], ref->unsharded[k], ref->padded[k] * 2) == 0;
        } else {
            for (uint64_t i = 0; unsh_ok && i < ref->padded[k]; i++) {
                double a = pcs_bf16_to_f32(x->unsharded[k][i]),
                       b = pcs_bf16_to_f32(ref->unsharded[k][i]);
                unsh_ok &= fabs(a - b) <= 1e-2 * fabs(b) + 1e-6; /* one bf16 ulp after rounding */
            }
        }
        if (x->numel[k] != n || !moved || !floats_match(x->master[k], ref->master[k], n, rtol) ||
            !floats_match(x->a[k], ref->a[k], n, rtol) ||
            !floats_match(x->b[k], ref->b[k], n, rtol) || !unsh_ok) {
            fprintf(stderr, "rank %u unit %d: %s (moved %d)\n", rank, k, what, moved);
            return 31;
        }
    }
    return 0;
}

// ---- forked ranks ----

void pcs_rth_fork_ranks(const char *tag, uint32_t world,
                        int (*rank_main)(const char *kvdir, uint32_t r, void *arg), void *arg,
                        int timeout_ms, int *codes)
{
    assert_true(world >= 1 && world <= 8);
    char *dir = pcs_test_tmpdir(tag);
    char kvdir[1024];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    pid_t pids[8];
    for (uint32_t r = 0; r < world; r++) {
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(rank_main(kvdir, r, arg));
    }
    int hung = 0, abnormal = 0;
    for (uint32_t r = 0; r < world; r++) {
        int stt = pcs_test_wait(pids[r], timeout_ms);
        if (stt == -1) {
            pcs_test_stop(pids[r], 100);
            hung = 1;
            codes[r] = -1;
            continue;
        }
        abnormal |= !WIFEXITED(stt);
        codes[r] = WIFEXITED(stt) ? WEXITSTATUS(stt) : -1;
    }
    pcs_test_rmtree(dir);
    free(dir);
    assert_false(hung);
    assert_false(abnormal);
}
