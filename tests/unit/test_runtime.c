/* Unit runtime of a world of one (no communicators, so no KV): with the prefetch and reduction
 * threads running, a unit whose gradients are handed in with sync on every micro-batch (FSDP2
 * without no-sync) accumulates every micro-batch's reduced gradient exactly once; the copy-in of
 * the next hand-in must not overwrite the reduce buffer while the reduction thread still reads it.
 * Forked worlds of 2 and 4 ranks (file KV store): PREMUL_SUM and unplanned replicated averaging,
 * and host staging of every collective (stage_host) giving the direct path's bits for sharded,
 * replicated and hybrid-sharded units; bad device/collective settings are refused. The staged
 * parity's plan, step sequence, comparison and forked ranks are tests/support/runtime_harness.c,
 * shared with tests/gpu/test_runtime_cuda.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/kv.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/pbtext.h"
#include "planner/plan.h"
#include "worker/runtime.h"
#include "runtime_harness.h"
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

/* A runtime config on the cpu backend for these small hand-made plans: one micro-batch, zero
 * init, plain SGD with lr 1 (so master = -gradient after one step). */
static pcs_status_t sgd_lr1_config(pcs_runtime_config_t *rc, const Pcs__V1__Plan *plan,
                                   int prefetch)
{
    memset(rc, 0, sizeof *rc);
    rc->plan = plan;
    rc->micro_batches = 1;
    rc->init_param = init_zero;
    rc->opt = PCS_OPT_SGD;
    pcs_sgd_config_default(&rc->sgd);
    rc->sgd.lr = 1.0;
    rc->sgd.momentum = 0;
    rc->prefetch = prefetch;
    return pcs_backend_get("cpu", &rc->be);
}

/* The plan's mesh for a world of one (the planner always emits one; the runtime refuses a plan
 * without). */
static void world_of_one(Pcs__V1__Plan *plan)
{
    static Pcs__V1__MeshDim one = PCS__V1__MESH_DIM__INIT, *onep[1] = {&one};
    one.dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    one.size = 1;
    plan->world_size = 1;
    plan->n_mesh = 1;
    plan->mesh = onep;
}

/* A plan of one replicated fp32 unit holding one parameter "w" of n elements, in a world of
 * one (the single-unit runtime tests). Self-contained: keep it in place while the plan is used. */
typedef struct one_unit {
    Pcs__V1__Plan plan;
    Pcs__V1__Unit unit, *up[1];
    Pcs__V1__ParamSlot ps, *psp[1];
    uint64_t shape[1];
} one_unit_t;

static void one_unit_plan(one_unit_t *o, uint64_t n)
{
    *o = (one_unit_t){.plan = PCS__V1__PLAN__INIT,
                      .unit = PCS__V1__UNIT__INIT,
                      .ps = PCS__V1__PARAM_SLOT__INIT};
    o->up[0] = &o->unit;
    o->psp[0] = &o->ps;
    o->shape[0] = n;
    o->ps.fqn = "w";
    o->ps.n_shape = 1;
    o->ps.shape = o->shape;
    o->ps.numel = n;
    o->unit.master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    o->unit.shard_group_size = 1;
    o->unit.padded_numel = n;
    o->unit.shard_numel = n;
    o->unit.n_params = 1;
    o->unit.params = o->psp;
    world_of_one(&o->plan);
    o->plan.n_units = 1;
    o->plan.units = o->up;
}

static pcs_status_t init_one(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                             float *out)
{
    (void)ctx;
    (void)p;
    (void)first;
    for (uint64_t i = 0; i < n; i++)
        out[i] = 1.0f;
    return PCS_OK;
}

/* Unit [w 8 | f 8 frozen | v 8], or [w 8 | v 8] with no f, world of one, AdamW (weight decay). */
static void wfv_plan(Pcs__V1__Plan *plan, Pcs__V1__Unit *unit, Pcs__V1__Unit **up,
                     Pcs__V1__ParamSlot *ps, Pcs__V1__ParamSlot **psp, uint64_t *shape, int with_f)
{
    static const char *names[3] = {"w", "f", "v"};
    *plan = (Pcs__V1__Plan)PCS__V1__PLAN__INIT;
    *unit = (Pcs__V1__Unit)PCS__V1__UNIT__INIT;
    shape[0] = 8;
    int n = 0;
    for (int k = 0; k < 3; k++) {
        if (k == 1 && !with_f)
            continue;
        pcs__v1__param_slot__init(&ps[n]);
        ps[n].fqn = (char *)names[k];
        ps[n].n_shape = 1;
        ps[n].shape = shape;
        ps[n].numel = 8;
        ps[n].offset = 8 * (uint64_t)n;
        ps[n].frozen = k == 1;
        psp[n] = &ps[n];
        n++;
    }
    unit->master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    unit->shard_group_size = 1;
    unit->padded_numel = unit->shard_numel = 8 * (uint64_t)n;
    unit->n_params = (size_t)n;
    unit->params = psp;
    world_of_one(plan);
    plan->n_units = 1;
    up[0] = unit;
    plan->units = up;
}

/* A frozen parameter (requires_grad off) has no gradient in PyTorch, so the optimizer never
 * touches it — not even AdamW's weight decay — and it is not in clip_grad_norm_'s norm or the
 * scaler's inf check. Unit [w 8 | f 8 frozen | v 8] of a world of one, every gradient element
 * 1 (also where a C API program wrote into f's range): after a step f is still exactly 1, w and
 * v moved, and the reported norm is sqrt(16) = 4 (f's 8 elements excluded). */
static void test_frozen_parameters_are_not_updated_or_counted(void **state)
{
    (void)state;
    Pcs__V1__Plan plan;
    Pcs__V1__Unit unit, *up[1];
    Pcs__V1__ParamSlot ps[3], *psp[3];
    uint64_t shape[1];
    wfv_plan(&plan, &unit, up, ps, psp, shape, 1);
    for (int opt = 0; opt < 2; opt++) {
        pcs_runtime_config_t rc;
        memset(&rc, 0, sizeof rc);
        rc.plan = &plan;
        assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
        rc.micro_batches = 1;
        rc.init_param = init_one;
        rc.opt = opt == 0 ? PCS_OPT_ADAMW : PCS_OPT_SGD;
        pcs_adamw_config_default(&rc.adamw);
        rc.adamw.lr = 0.1;
        rc.adamw.weight_decay = 0.1;
        pcs_sgd_config_default(&rc.sgd);
        rc.sgd.lr = 0.1;
        rc.sgd.momentum = 0.9;
        rc.sgd.weight_decay = 0.1;
        pcs_runtime_t *rt = NULL;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
        void *g;
        pcs_dtype_t dt;
        assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
        assert_int_equal(dt, PCS_DTYPE_FP32);
        for (int i = 0; i < 24; i++)
            ((float *)g)[i] = 1.0f;
        assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        o.clip_norm = 1e30; /* computed, never scales */
        pcs_rt_step_result_t r;
        assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
        assert_true(fabs(r.grad_norm - 4.0) < 1e-6);
        pcs_rt_shard_t sh;
        assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
        const float *m = sh.master;
        for (int i = 0; i < 24; i++) {
            if (i >= 8 && i < 16)
                assert_true(m[i] == 1.0f);
            else
                assert_true(m[i] < 0.95f); /* decayed and stepped against the gradient */
        }
        pcs_runtime_destroy(rt);
    }
}

static pcs_status_t init_thirds32(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first,
                                   uint64_t n, float *out)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++)
        out[i] = 1.0f / 3.0f + (float)(p->offset + first + i) * 1e-3f; /* no bf16 holds these */
    return PCS_OK;
}

/* The master value of element i of a low-precision dtype: the fp32 init rounded once. */
static float low_value(pcs_dtype_t dt, uint64_t i)
{
    float x = 1.0f / 3.0f + (float)i * 1e-3f;
    return dt == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(pcs_f32_to_bf16(x))
                                : pcs_fp16_to_f32(pcs_f32_to_fp16(x));
}

/* A unit whose parameters are all frozen (a frozen bf16 base, a dtype part of a mixed group)
 * keeps its bf16 / fp16 masters in their own dtype: 2 bytes per element, as FSDP keeps them,
 * and what the plan's estimate counts. On the cpu backend, the simulated CUDA device and that
 * device with cpu_offload, computing in the master dtype and upcast to fp32: the shard holds
 * the init values rounded once, unshard casts them, a step with no gradient leaves them, the
 * host exchange is fp32 both ways (checkpoints and resumes as before), and the runtime stays
 * within the estimate. */
static void test_frozen_low_precision_unit_keeps_its_dtype(void **state)
{
    (void)state;
    for (int dev = 0; dev < 3; dev++)
        for (int variant = 0; variant < 4; variant++) {
            pcs_dtype_t md = variant < 2 ? PCS_DTYPE_BF16 : PCS_DTYPE_FP16;
            pcs_dtype_t pd = variant % 2 ? PCS_DTYPE_FP32 : md;
            Pcs__V1__Plan plan;
            Pcs__V1__Unit unit, *up[1];
            Pcs__V1__ParamSlot ps[3], *psp[3];
            uint64_t shape[1];
            wfv_plan(&plan, &unit, up, ps, psp, shape, 0);
            ps[0].frozen = ps[1].frozen = true;
            ps[0].dtype = ps[1].dtype = (Pcs__V1__DType)md;
            unit.master_dtype = (Pcs__V1__DType)md;
            unit.param_dtype = (Pcs__V1__DType)pd;
            plan.optimizer_states = 2;
            plan.cpu_offload = dev == 2;
            assert_int_equal(pcs_plan_check_runnable(&plan), PCS_OK);
            assert_int_equal(pcs_backend_simulate_cuda(dev > 0), PCS_OK);
            pcs_runtime_config_t rc;
            memset(&rc, 0, sizeof rc);
            rc.plan = &plan;
            assert_int_equal(pcs_backend_get(dev ? "cuda" : "cpu", &rc.be), PCS_OK);
            const pcs_backend_ops_t *be = rc.be;
            assert_int_equal(be->set_device(0), PCS_OK);
            rc.micro_batches = 1;
            rc.init_param = init_thirds32;
            rc.opt = PCS_OPT_ADAMW;
            pcs_adamw_config_default(&rc.adamw);
            pcs_runtime_t *rt = NULL;
            assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
            pcs_rt_shard_t sh;
            assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
            assert_int_equal(sh.storage_dtype, md);
            assert_int_equal(sh.host_dtype, PCS_DTYPE_FP32);
            assert_int_equal(sh.states, PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_EXP_AVG_SQ);
            assert_int_equal(sh.state_numel, 0);
            float host[16], st_a[16], st_b[16];
            for (int step = 1; step <= 2; step++) {
                assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
                const void *w;
                pcs_dtype_t wdt;
                assert_int_equal(pcs_runtime_unshard(rt, 0, 0, &w, &wdt), PCS_OK);
                assert_int_equal(wdt, pd);
                union {
                    float f[16];
                    uint16_t h[16];
                } hb;
                assert_int_equal(be->copy(&hb, w, 16 * pcs_dtype_size(wdt), PCS_COPY_D2H, NULL),
                                 PCS_OK);
                assert_int_equal(be->sync(NULL), PCS_OK);
                for (int i = 0; i < 16; i++) {
                    float want = low_value(md, (uint64_t)i);
                    float got = pd == PCS_DTYPE_FP32   ? hb.f[i]
                                : md == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(hb.h[i])
                                                       : pcs_fp16_to_f32(hb.h[i]);
                    if (got != want)
                        fail_msg("dev %d variant %d [%d]: %.9g, want %.9g", dev, variant, i,
                                 (double)got, (double)want);
                }
                assert_int_equal(pcs_runtime_reshard(rt, 0), PCS_OK);
                assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
                pcs_rt_step_opts_t o;
                memset(&o, 0, sizeof o);
                pcs_rt_step_result_t r;
                assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
            }
            memset(st_a, 0xff, sizeof st_a);
            assert_int_equal(pcs_runtime_shard_to_host(rt, 0, host, st_a, st_b), PCS_OK);
            for (int i = 0; i < 16; i++) {
                assert_true(host[i] == low_value(md, (uint64_t)i));
                assert_true(st_a[i] == 0.0f && st_b[i] == 0.0f); /* no state: zeros */
            }
            /* a resume: fp32 values of the master dtype in, the same out */
            for (int i = 0; i < 16; i++)
                host[i] = (float)(i - 8) * 0.25f;
            assert_int_equal(pcs_runtime_shard_from_host(rt, 0, host, NULL, NULL), PCS_OK);
            float back[16];
            assert_int_equal(pcs_runtime_shard_to_host(rt, 0, back, NULL, NULL), PCS_OK);
            assert_memory_equal(back, host, sizeof back);
            /* the promise: 2 bytes per master element */
            Pcs__V1__RankEstimate e;
            assert_int_equal(pcs_plan_rank_estimate(&plan, 0, &e), PCS_OK);
            assert_int_equal(e.param_shard_bytes, 16 * 2);
            assert_int_equal(e.optimizer_bytes, 0);
            pcs_rt_stats_t stats;
            pcs_runtime_stats(rt, &stats);
            uint64_t promise = e.total_bytes - e.buffer_bytes;
            if (stats.mem_peak_bytes > promise)
                fail_msg("dev %d variant %d: runtime peak %llu B > estimate %llu B", dev, variant,
                         (unsigned long long)stats.mem_peak_bytes, (unsigned long long)promise);
            pcs_runtime_destroy(rt);
            assert_int_equal(pcs_backend_simulate_cuda(0), PCS_OK);
        }
}

static double third(uint64_t i)
{
    return 1.0 / 3.0 + (double)i * 1e-9; /* no fp32 holds these */
}

static pcs_status_t init64_thirds(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first,
                                  uint64_t n, double *out)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++)
        out[i] = third(p->offset + first + i);
    return PCS_OK;
}

/* fp64 masters (FSDP's full_precision_param_dtype float64), world of one, unit [w 8 | v 8],
 * AdamW. Computing in bf16 (reduce fp32) and in fp64 itself (with the grad scaler: gradients
 * scaled by 1024, unscaled in fp64), on the cpu backend, the simulated CUDA device, and that
 * device with cpu_offload (masters and state in host memory, the host optimizer): the masters
 * start as init_param64's doubles, the unsharded parameters are their casts (fp64 -> fp32 ->
 * bf16, as c10), the gradient reaches the fp64 shard exactly, the update runs in double (the
 * textbook double reference to 1e-13; an fp32 update misses by ~1e-8), state and masters come
 * back as fp64, and the runtime holds no more than the plan's estimate. */
static void test_fp64_masters_keep_and_update_doubles(void **state)
{
    (void)state;
    for (int dev = 0; dev < 3; dev++)
        for (int variant = 0; variant < 2; variant++) {
            Pcs__V1__Plan plan;
            Pcs__V1__Unit unit, *up[1];
            Pcs__V1__ParamSlot ps[3], *psp[3];
            uint64_t shape[1];
            wfv_plan(&plan, &unit, up, ps, psp, shape, 0);
            unit.master_dtype = PCS__V1__DTYPE__DTYPE_FP64;
            plan.optimizer_states = 2; /* AdamW (the planner's field) */
            plan.cpu_offload = dev == 2;
            if (variant == 0) {
                unit.param_dtype = PCS__V1__DTYPE__DTYPE_BF16;
                unit.reduce_dtype = PCS__V1__DTYPE__DTYPE_FP32;
            }
            assert_int_equal(pcs_plan_check_runnable(&plan), PCS_OK);
            assert_int_equal(pcs_backend_simulate_cuda(dev > 0), PCS_OK);
            pcs_runtime_config_t rc;
            memset(&rc, 0, sizeof rc);
            rc.plan = &plan;
            assert_int_equal(pcs_backend_get(dev ? "cuda" : "cpu", &rc.be), PCS_OK);
            const pcs_backend_ops_t *be = rc.be;
            assert_int_equal(be->set_device(0), PCS_OK);
            rc.micro_batches = 1;
            rc.init_param = init_one;
            rc.init_param64 = init64_thirds;
            rc.opt = PCS_OPT_ADAMW;
            pcs_adamw_config_default(&rc.adamw);
            rc.adamw.lr = 0.01;
            rc.adamw.weight_decay = 0.1;
            pcs_runtime_t *rt = NULL;
            assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
            pcs_rt_shard_t sh;
            assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
            assert_int_equal(sh.storage_dtype, PCS_DTYPE_FP64);
            assert_int_equal(sh.master_dtype, PCS_DTYPE_FP64);
            double ref_p[16], ref_m[16] = {0}, ref_v[16] = {0}, host[16];
            assert_int_equal(pcs_runtime_shard_to_host(rt, 0, host, NULL, NULL), PCS_OK);
            for (int i = 0; i < 16; i++) {
                ref_p[i] = third((uint64_t)i);
                assert_true(host[i] == ref_p[i]);
            }
            for (int64_t step = 1; step <= 3; step++) {
                assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
                const void *w;
                pcs_dtype_t wdt;
                assert_int_equal(pcs_runtime_unshard(rt, 0, 0, &w, &wdt), PCS_OK);
                assert_int_equal(wdt, variant == 0 ? PCS_DTYPE_BF16 : PCS_DTYPE_FP64);
                union {
                    double d[16];
                    uint16_t h[16];
                } hb;
                assert_int_equal(be->copy(&hb, w, 16 * pcs_dtype_size(wdt), PCS_COPY_D2H, NULL),
                                 PCS_OK);
                assert_int_equal(be->sync(NULL), PCS_OK);
                for (int i = 0; i < 16; i++) {
                    if (variant == 0)
                        assert_true(hb.h[i] == pcs_f32_to_bf16((float)ref_p[i]));
                    else
                        assert_true(hb.d[i] == ref_p[i]);
                }
                assert_int_equal(pcs_runtime_reshard(rt, 0), PCS_OK);
                void *g;
                pcs_dtype_t gdt;
                assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &gdt), PCS_OK);
                assert_int_equal(gdt, wdt);
                double gv[16];
                for (int i = 0; i < 16; i++) {
                    double x = (double)(i - 7) / 7.0 + (double)step * 1e-12;
                    if (variant == 0) {
                        hb.h[i] = pcs_f32_to_bf16((float)x);
                        gv[i] = pcs_bf16_to_f32(hb.h[i]); /* exact through fp32 */
                    } else {
                        gv[i] = x;
                        hb.d[i] = x * 1024.0; /* the scaled loss's gradient */
                    }
                }
                assert_int_equal(be->copy(g, &hb, 16 * pcs_dtype_size(gdt), PCS_COPY_H2D, NULL),
                                 PCS_OK);
                assert_int_equal(be->sync(NULL), PCS_OK);
                assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
                pcs_rt_step_opts_t o;
                memset(&o, 0, sizeof o);
                o.scaler = variant == 1;
                o.loss_scale = 1024.0;
                pcs_rt_step_result_t r;
                assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
                assert_false(r.skipped);
                for (int i = 0; i < 16; i++) {
                    double p = ref_p[i], m = ref_m[i], v = ref_v[i], b1 = rc.adamw.beta1,
                           b2 = rc.adamw.beta2;
                    p *= 1.0 - rc.adamw.lr * rc.adamw.weight_decay;
                    m = b1 * m + (1.0 - b1) * gv[i];
                    v = b2 * v + (1.0 - b2) * gv[i] * gv[i];
                    double den = sqrt(v) / sqrt(1.0 - pow(b2, (double)step)) + rc.adamw.eps;
                    p -= rc.adamw.lr / (1.0 - pow(b1, (double)step)) * m / den;
                    ref_p[i] = p;
                    ref_m[i] = m;
                    ref_v[i] = v;
                }
            }
            double st_a[16], st_b[16];
            assert_int_equal(pcs_runtime_shard_to_host(rt, 0, host, st_a, st_b), PCS_OK);
            for (int i = 0; i < 16; i++) {
                if (fabs(host[i] - ref_p[i]) > 1e-13 * fabs(ref_p[i]) + 1e-16)
                    fail_msg("dev %d variant %d [%d]: %.17g vs %.17g", dev, variant, i, host[i],
                             ref_p[i]);
                assert_true(host[i] != (double)(float)host[i]); /* not an fp32 value */
                assert_true(fabs(st_a[i] - ref_m[i]) <= 1e-13 * fabs(ref_m[i]) + 1e-18);
                assert_true(fabs(st_b[i] - ref_v[i]) <= 1e-13 * fabs(ref_v[i]) + 1e-20);
            }
            /* a resume: the doubles back in, bit for bit */
            host[3] = 0.125 / 3.0;
            assert_int_equal(pcs_runtime_shard_from_host(rt, 0, host, st_a, st_b), PCS_OK);
            double back[16];
            assert_int_equal(pcs_runtime_shard_to_host(rt, 0, back, NULL, NULL), PCS_OK);
            assert_memory_equal(back, host, sizeof back);
            /* the plan's promise holds fp64 storage (offload: in host memory, outside it) */
            Pcs__V1__RankEstimate e;
            assert_int_equal(pcs_plan_rank_estimate(&plan, 0, &e), PCS_OK);
            assert_int_equal(e.param_shard_bytes, 16 * 8);
            assert_int_equal(e.optimizer_bytes, 2 * 16 * 8);
            pcs_rt_stats_t stats;
            pcs_runtime_stats(rt, &stats);
            if (stats.mem_peak_bytes > e.total_bytes - e.buffer_bytes)
                fail_msg("dev %d variant %d: runtime peak %llu B > estimate %llu B", dev,
                         variant, (unsigned long long)stats.mem_peak_bytes,
                         (unsigned long long)(e.total_bytes - e.buffer_bytes));
            pcs_runtime_destroy(rt);
            assert_int_equal(pcs_backend_simulate_cuda(0), PCS_OK);
        }
}

static void test_sync_on_every_micro_batch_reduces_each_hand_in_once(void **state)
{
    (void)state;
    one_unit_t one;
    one_unit_plan(&one, N);

    pcs_runtime_config_t rc;
    assert_int_equal(sgd_lr1_config(&rc, &one.plan, 1), PCS_OK); /* prefetch and reduction threads */
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

/* A world of one has no communicator, but a custom gradient divide factor still divides the local
 * gradient (FSDP2 foreach_reduce, world_size 1: reduce_output = input / factor): the plan's
 * local_reduction as PREMUL_SUM(1/4) in fp32, and as pre 2 / post 2 in an fp16 reduce. SGD lr 1
 * from 0 with gradient 8: the master must be -2, not -8. */
static void test_world_of_one_divides_by_a_custom_factor(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        one_unit_t one;
        one_unit_plan(&one, 64);
        Pcs__V1__Unit *unit = &one.unit;
        Pcs__V1__Reduction red = PCS__V1__REDUCTION__INIT;
        if (variant == 0) {
            red.op = PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM;
            red.pre_divide = 1;
            red.post_divide = 1;
            red.premul = 0.25;
        } else {
            unit->reduce_dtype = PCS__V1__DTYPE__DTYPE_FP16;
            red.op = PCS__V1__REDUCE_OP__REDUCE_OP_SUM;
            red.pre_divide = 2;
            red.post_divide = 2;
        }
        unit->local_reduction = &red;
        pcs_runtime_config_t rc;
        assert_int_equal(sgd_lr1_config(&rc, &one.plan, variant),
                         PCS_OK); /* inline and on the reduction thread */
        pcs_runtime_t *rt = NULL;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
        void *g;
        pcs_dtype_t dt;
        assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
        assert_int_equal(dt, PCS_DTYPE_FP32);
        for (int i = 0; i < 64; i++)
            ((float *)g)[i] = 8.0f;
        assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t r;
        assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
        pcs_rt_shard_t sh;
        assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
        for (int i = 0; i < 64; i++)
            assert_true(((const float *)sh.master)[i] == -2.0f);
        pcs_runtime_destroy(rt);
    }
}

/* A no-sync hand-in accumulates even when the job has one micro-batch (the C API lets a program
 * skip the sync on any backward): the next synced hand-in reduces the sum, nothing is dropped. */
static void test_no_sync_hand_in_with_one_micro_batch_is_accumulated(void **state)
{
    (void)state;
    one_unit_t one;
    one_unit_plan(&one, 8);
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        pcs_runtime_config_t rc;
        assert_int_equal(sgd_lr1_config(&rc, &one.plan, prefetch), PCS_OK);
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

/* Two accumulations synced in one step (no-sync 1, sync 10, no-sync 100, sync 1000): the first
 * reduction reads the accumulator in place (fp32 accumulator = reduce dtype), so the third hand-in
 * must not write it before that reduction has read it; every hand-in counts once: -1111 after SGD
 * with lr 1 from zero, with and without the reduction thread, over many rounds. */
static void test_accumulator_read_in_place_is_not_overwritten_by_the_next_micro_batch(void **state)
{
    (void)state;
    one_unit_t one;
    one_unit_plan(&one, 4096);
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        for (int round = 0; round < 20; round++) {
            pcs_runtime_config_t rc;
            assert_int_equal(sgd_lr1_config(&rc, &one.plan, prefetch), PCS_OK);
            rc.micro_batches = 4;
            pcs_runtime_t *rt = NULL;
            assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
            assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
            const float vals[4] = {1.0f, 10.0f, 100.0f, 1000.0f};
            for (int m = 0; m < 4; m++) {
                void *g;
                pcs_dtype_t dt;
                assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
                for (int i = 0; i < 4096; i++)
                    ((float *)g)[i] = vals[m];
                assert_int_equal(pcs_runtime_post_backward(rt, 0, m % 2 == 1), PCS_OK);
            }
            pcs_rt_step_opts_t o;
            memset(&o, 0, sizeof o);
            pcs_rt_step_result_t r;
            assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
            pcs_rt_shard_t sh;
            assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
            for (int i = 0; i < 4096; i++)
                if (((const float *)sh.master)[i] != -1111.0f)
                    fail_msg("prefetch %d round %d: element %d is %g, want -1111", prefetch,
                             round, i, (double)((const float *)sh.master)[i]);
            pcs_runtime_destroy(rt);
        }
    }
}

/* pcs-worker's gradient target (pcs_runtime_grad_target): accumulating micro-batches get the
 * no-sync accumulator itself — written by the first (accumulate 0), added to by the rest,
 * including the synced one after them (1) — and a synced micro-batch with nothing accumulated a
 * gradient block; only the padding (what no trainable parameter covers) is zeroed, every time,
 * even after a writer dirtied it. Unit w (4090 elements) padded to 4096, world of one, SGD lr 1:
 * hand-ins 1 / 10 (sync) / 100 / 1000 (sync) leave -1111 per step, as grad_buffer's do. */
static void test_grad_target_accumulates_in_place_and_zeroes_only_the_padding(void **state)
{
    (void)state;
    one_unit_t one;
    one_unit_plan(&one, 4090);
    one.unit.padded_numel = one.unit.shard_numel = 4096;
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        pcs_runtime_config_t rc;
        assert_int_equal(sgd_lr1_config(&rc, &one.plan, prefetch), PCS_OK);
        rc.micro_batches = 4;
        pcs_runtime_t *rt = NULL;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        const float vals[4] = {1.0f, 10.0f, 100.0f, 1000.0f};
        void *first = NULL;
        for (int step = 1; step <= 3; step++) {
            assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
            for (int m = 0; m < 4; m++) {
                void *g, *b;
                pcs_dtype_t dt, bdt;
                int acc = -1, sync = m % 2 == 1;
                assert_int_equal(pcs_runtime_grad_target(rt, 0, sync, &g, &dt, &acc), PCS_OK);
                assert_int_equal(dt, PCS_DTYPE_FP32);
                assert_int_equal(acc, sync); /* 0, 1, 0, 1: write, add, write, add */
                if (!first)
                    first = g;
                assert_ptr_equal(g, first); /* always the accumulator: no block */
                float *f = g;
                for (int i = 4090; i < 4096; i++)
                    if (f[i] != 0.0f)
                        fail_msg("step %d micro-batch %d: padding [%d] is %g", step, m, i,
                                 (double)f[i]);
                for (int i = 0; i < 4090; i++)
                    f[i] = acc ? f[i] + vals[m] : vals[m];
                for (int i = 4090; i < 4096; i++) /* a dirty writer: zeroed again next time */
                    f[i] = -0.0f;
                /* out: no second buffer until the hand-in */
                assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &b, &bdt), PCS_ERR_STATE);
                assert_int_equal(pcs_runtime_grad_target(rt, 0, sync, &b, &bdt, &acc),
                                 PCS_ERR_STATE);
                assert_int_equal(pcs_runtime_post_backward(rt, 0, sync), PCS_OK);
            }
            pcs_rt_step_opts_t o;
            memset(&o, 0, sizeof o);
            pcs_rt_step_result_t r;
            assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
            pcs_rt_shard_t sh;
            assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
            for (int i = 0; i < 4090; i++)
                if (((const float *)sh.master)[i] != -1111.0f * (float)step)
                    fail_msg("prefetch %d step %d: element %d is %g", prefetch, step, i,
                             (double)((const float *)sh.master)[i]);
        }
        pcs_runtime_destroy(rt);

        /* one micro-batch: a gradient block from the pool, its padding zeroed on every reuse */
        rc.micro_batches = 1;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        for (int step = 1; step <= 3; step++) {
            assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
            void *g;
            pcs_dtype_t dt;
            int acc = -1;
            assert_int_equal(pcs_runtime_grad_target(rt, 0, 1, &g, &dt, &acc), PCS_OK);
            assert_int_equal(acc, 0);
            float *f = g;
            for (int i = 4090; i < 4096; i++)
                assert_true(f[i] == 0.0f && !signbit(f[i]));
            for (int i = 0; i < 4096; i++)
                f[i] = i < 4090 ? 2.0f : 5.0f;
            assert_int_equal(pcs_runtime_post_backward(rt, 0, 1), PCS_OK);
            pcs_rt_step_opts_t o;
            memset(&o, 0, sizeof o);
            pcs_rt_step_result_t r;
            assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
        }
        pcs_runtime_destroy(rt);
    }
}

/* Gradient clipping's sum of squares taken by the step-last reduction's accumulation
 * (fuse_grad_norm, pcs_kernel_accumulate_sumsq on cpu) gives the bits of the optimizer step's own
 * pass: same grad norm and masters over 3 steps of 4 micro-batches (synced only on the last, and
 * synced on every one), clipping active. With the fp16 scaler the fused sum is of the scaled
 * gradient, so the step takes its own pass (none counted fused) and still agrees. */
static void test_fused_clipping_sum_is_bit_identical(void **state)
{
    (void)state;
    one_unit_t one;
    one_unit_plan(&one, 5000);
    for (int scaler = 0; scaler <= 1; scaler++)
        for (int every = 0; every <= 1; every++) {
            float master[2][5000];
            double norm[2][3];
            uint64_t fused[2];
            for (int fuse = 0; fuse <= 1; fuse++) {
                pcs_runtime_config_t rc;
                assert_int_equal(sgd_lr1_config(&rc, &one.plan, 1), PCS_OK);
                rc.micro_batches = 4;
                rc.fuse_grad_norm = fuse;
                rc.sgd.lr = 0.01;
                pcs_runtime_t *rt = NULL;
                assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
                for (int step = 0; step < 3; step++) {
                    assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
                    for (int m = 0; m < 4; m++) {
                        void *g;
                        pcs_dtype_t dt;
                        assert_int_equal(pcs_runtime_grad_buffer(rt, 0, &g, &dt), PCS_OK);
                        for (int i = 0; i < 5000; i++)
                            ((float *)g)[i] = (float)sin(0.37 * i + step + 1.7 * m) *
                                              (scaler ? 1024.0f : 1.0f);
                        assert_int_equal(pcs_runtime_post_backward(rt, 0, every || m == 3),
                                         PCS_OK);
                    }
                    pcs_rt_step_opts_t o = {.clip_norm = 1.0,
                                            .scaler = scaler,
                                            .loss_scale = 1024.0};
                    pcs_rt_step_result_t r;
                    assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
                    assert_false(r.skipped);
                    assert_true(r.grad_norm > 1.0); /* clipping scaled the gradient */
                    norm[fuse][step] = r.grad_norm;
                }
                pcs_rt_shard_t sh;
                assert_int_equal(pcs_runtime_shard(rt, 0, &sh), PCS_OK);
                memcpy(master[fuse], sh.master, sizeof master[fuse]);
                fused[fuse] = pcs_runtime_fused_norms(rt);
                pcs_runtime_destroy(rt);
            }
            assert_memory_equal(norm[0], norm[1], sizeof norm[0]);
            assert_memory_equal(master[0], master[1], sizeof master[0]);
            assert_int_equal(fused[0], 0);
            assert_int_equal(fused[1], scaler ? 0 : 3); /* one unit, three steps */
        }
}

/* AdamW keeps no state for a frozen parameter (as PyTorch, and as the plan's estimate counts):
 * the shard's state is compact (16 of 24 elements), the trained values and the states are those
 * of the same unit without the frozen parameter, bit for bit; shard_to_host expands the states
 * with zeros where f lies, and a runtime loaded from them continues to the same bits. */
static void test_frozen_parameters_get_no_optimizer_state(void **state)
{
    (void)state;
    Pcs__V1__Plan plan[2];
    Pcs__V1__Unit unit[2], *up[2][1];
    Pcs__V1__ParamSlot ps[2][3], *psp[2][3];
    uint64_t shape[2][1];
    pcs_runtime_t *rt[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 2; k++)
        wfv_plan(&plan[k], &unit[k], up[k], ps[k], psp[k], shape[k], k == 0);
    for (int k = 0; k < 3; k++) {
        pcs_runtime_config_t rc;
        memset(&rc, 0, sizeof rc);
        rc.plan = &plan[k == 1];
        assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
        rc.micro_batches = 1;
        rc.init_param = init_one;
        rc.opt = PCS_OPT_ADAMW;
        pcs_adamw_config_default(&rc.adamw);
        rc.adamw.lr = 0.1;
        rc.adamw.weight_decay = 0.1;
        assert_int_equal(pcs_runtime_create(&rc, &rt[k]), PCS_OK);
    }
    float host[3][3][24]; /* runtime, (master, exp_avg, exp_avg_sq), elements */
    for (int step = 1; step <= 3; step++) {
        if (step == 3) { /* runtime 2 resumes from runtime 0 after two steps */
            assert_int_equal(pcs_runtime_shard_to_host(rt[0], 0, host[0][0], host[0][1],
                                                       host[0][2]),
                             PCS_OK);
            for (int i = 8; i < 16; i++) /* f has no state: zeros */
                assert_true(host[0][1][i] == 0.0f && host[0][2][i] == 0.0f);
            assert_int_equal(pcs_runtime_shard_from_host(rt[2], 0, host[0][0], host[0][1],
                                                         host[0][2]),
                             PCS_OK);
            pcs_runtime_set_opt_steps(rt[2], 2);
        }
        for (int k = 0; k < 3; k++) {
            if (k == 2 && step < 3)
                continue;
            assert_int_equal(pcs_runtime_begin_step(rt[k]), PCS_OK);
            void *g;
            pcs_dtype_t dt;
            assert_int_equal(pcs_runtime_grad_buffer(rt[k], 0, &g, &dt), PCS_OK);
            for (int i = 0, n = k == 1 ? 16 : 24; i < n; i++) {
                int e = k == 1 && i >= 8 ? i + 8 : i; /* the element's place in w|f|v */
                ((float *)g)[i] = (float)sin(0.9 * e + step);
            }
            assert_int_equal(pcs_runtime_post_backward(rt[k], 0, 1), PCS_OK);
            pcs_rt_step_opts_t o;
            memset(&o, 0, sizeof o);
            pcs_rt_step_result_t r;
            assert_int_equal(pcs_runtime_optimizer_step(rt[k], &o, &r), PCS_OK);
        }
    }
    pcs_rt_shard_t sh;
    assert_int_equal(pcs_runtime_shard(rt[0], 0, &sh), PCS_OK);
    assert_int_equal(sh.numel, 24);
    assert_int_equal(sh.state_numel, 16);
    assert_int_equal(sh.states, PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_EXP_AVG_SQ);
    for (int k = 0; k < 3; k++)
        assert_int_equal(
            pcs_runtime_shard_to_host(rt[k], 0, host[k][0], host[k][1], host[k][2]), PCS_OK);
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 8; i++) { /* w and v: as without f; f's master untouched, no state */
            assert_memory_equal(&host[0][j][i], &host[1][j][i], sizeof(float));
            assert_memory_equal(&host[0][j][16 + i], &host[1][j][8 + i], sizeof(float));
            assert_true(host[0][j][8 + i] == (j == 0 ? 1.0f : 0.0f));
        }
        assert_memory_equal(host[2][j], host[0][j], sizeof host[0][j]); /* the resumed one */
    }
    /* the state memory: two fp32 arrays of the 16 unfrozen elements (an SGD runtime without
     * momentum on the same plan holds everything else the same) */
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &plan[0];
    assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
    rc.micro_batches = 1;
    rc.init_param = init_one;
    rc.opt = PCS_OPT_SGD;
    pcs_sgd_config_default(&rc.sgd);
    rc.sgd.momentum = 0;
    pcs_runtime_t *plain = NULL, *adamw = NULL;
    assert_int_equal(pcs_runtime_create(&rc, &plain), PCS_OK);
    rc.opt = PCS_OPT_ADAMW;
    pcs_adamw_config_default(&rc.adamw);
    assert_int_equal(pcs_runtime_create(&rc, &adamw), PCS_OK);
    pcs_rt_stats_t sa, sb;
    pcs_runtime_stats(adamw, &sa);
    pcs_runtime_stats(plain, &sb);
    assert_int_equal(sa.mem_reserved_bytes - sb.mem_reserved_bytes, 2 * 16 * sizeof(float));
    pcs_runtime_destroy(plain);
    pcs_runtime_destroy(adamw);
    for (int k = 0; k < 3; k++)
        pcs_runtime_destroy(rt[k]);
}

/* A unit whose parameters are all frozen (a frozen embedding, a LoRA base block) holds no
 * gradient, optimizer state or accumulator: two units [w 8] and [f 8, frozen], AdamW, 2
 * micro-batches, clipping and the fp16 scaler. grad_target gives the frozen unit no buffer; a C
 * API program's grad_buffer block for it (holding 1e30) is dropped at the hand-in and the steps
 * run (not skipped); f stays 1; its states read back as zeros; the runtime holds 8 floats of
 * master, and neither gradient, states nor accumulator, for it (against a plan where f is
 * trainable). */
static void test_fully_frozen_unit_holds_no_gradient_or_state(void **state)
{
    (void)state;
    uint64_t shape[1] = {8};
    uint64_t mem[2];
    for (int frozen = 1; frozen >= 0; frozen--) {
        Pcs__V1__Plan plan = PCS__V1__PLAN__INIT;
        Pcs__V1__Unit unit[2], *up[2] = {&unit[0], &unit[1]};
        Pcs__V1__ParamSlot ps[2], *psp[2][1] = {{&ps[0]}, {&ps[1]}};
        const char *names[2] = {"w", "f"};
        for (int k = 0; k < 2; k++) {
            pcs__v1__unit__init(&unit[k]);
            pcs__v1__param_slot__init(&ps[k]);
            ps[k].fqn = (char *)names[k];
            ps[k].n_shape = 1;
            ps[k].shape = shape;
            ps[k].numel = 8;
            ps[k].frozen = k == 1 && frozen;
            unit[k].index = (uint32_t)k;
            unit[k].master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
            unit[k].shard_group_size = 1;
            unit[k].padded_numel = unit[k].shard_numel = 8;
            unit[k].n_params = 1;
            unit[k].params = psp[k];
        }
        world_of_one(&plan);
        plan.n_units = 2;
        plan.units = up;
        pcs_runtime_config_t rc;
        memset(&rc, 0, sizeof rc);
        rc.plan = &plan;
        assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
        rc.micro_batches = 2;
        rc.init_param = init_one;
        rc.opt = PCS_OPT_ADAMW;
        pcs_adamw_config_default(&rc.adamw);
        rc.fuse_grad_norm = 1;
        pcs_runtime_t *rt = NULL;
        assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
        pcs_rt_stats_t st;
        pcs_runtime_stats(rt, &st);
        mem[frozen] = st.mem_reserved_bytes;
        for (int step = 1; step <= 3; step++) {
            assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
            for (int m = 0; m < 2; m++)
                for (uint32_t k = 0; k < 2; k++) {
                    void *g;
                    pcs_dtype_t dt;
                    int acc;
                    if (k == 1 && frozen && m == 1) { /* a C API program's block: dropped */
                        assert_int_equal(pcs_runtime_grad_buffer(rt, k, &g, &dt), PCS_OK);
                        assert_non_null(g);
                        ((float *)g)[0] = 1e30f;
                    } else {
                        assert_int_equal(pcs_runtime_grad_target(rt, k, m == 1, &g, &dt, &acc),
                                         PCS_OK);
                        if (k == 1 && frozen)
                            assert_null(g);
                        for (int i = 0; g && i < 8; i++) {
                            float v = 1024.0f * (float)sin(1.3 * i + step + m + k);
                            ((float *)g)[i] = acc ? ((float *)g)[i] + v : v;
                        }
                    }
                    assert_int_equal(pcs_runtime_post_backward(rt, k, m == 1), PCS_OK);
                }
            pcs_rt_step_opts_t o = {.clip_norm = 0.5, .scaler = 1, .loss_scale = 1024.0};
            pcs_rt_step_result_t r;
            assert_int_equal(pcs_runtime_optimizer_step(rt, &o, &r), PCS_OK);
            assert_false(r.skipped);
            assert_true(r.grad_norm > 0.5); /* clipping active */
        }
        float h[3][8];
        assert_int_equal(pcs_runtime_shard_to_host(rt, 0, h[0], h[1], h[2]), PCS_OK);
        if (frozen) {
            assert_int_equal(pcs_runtime_shard_to_host(rt, 1, h[0], h[1], h[2]), PCS_OK);
            for (int i = 0; i < 8; i++)
                assert_true(h[0][i] == 1.0f && h[1][i] == 0.0f && h[2][i] == 0.0f);
            pcs_rt_shard_t sh;
            assert_int_equal(pcs_runtime_shard(rt, 1, &sh), PCS_OK);
            assert_int_equal(sh.state_numel, 0);
            assert_int_equal(sh.states, PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_EXP_AVG_SQ);
        }
        pcs_runtime_destroy(rt);
    }
    /* f trainable: its gradient (8), two states (16) and accumulator (8) floats */
    assert_int_equal(mem[0] - mem[1], (8 + 16 + 8) * sizeof(float));
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
    if (sgd_lr1_config(&rc, &plan, 1) != PCS_OK)
        return 3;
    rc.rank = r;
    rc.kv = kv;
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 20000;
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

static int two_rank_entry(const char *kvdir, uint32_t r, void *arg)
{
    return two_rank_main(kvdir, r, *(const int *)arg);
}

static void run_two_ranks(int mode)
{
    int codes[2];
    pcs_rth_fork_ranks("rt-two", 2, two_rank_entry, &mode, 120000, codes);
    for (int r = 0; r < 2; r++)
        assert_int_equal(codes[r], 0);
}

/* training.eval_backward (seed test_full_precision_in_eval_comm): fp32 parameters, fp16 reduce,
 * full_precision_eval. An eval-mode backward's fp32 gradients are reduce-scattered in fp32 (the
 * plan's eval collective), a training one's in fp16. Gradients 1 + 2^-20 (rank 0) and 1 (rank
 * 1): fp32 averages them to 1 + 2^-21 exactly, fp16 would round the first to 1; SGD lr 1 from 0
 * moves the master by exactly that. */
static Pcs__V1__Plan *eval_bwd_plan(int eval_backward, uint32_t world)
{
    char y[1024];
    snprintf(y, sizeof y,
             "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [8]}]}]}\n"
             "precision: {reduce_dtype: fp16}\n"
             "mesh: [{dim: dp_shard, size: %u}]\n"
             "training: {steps: 1, micro_batch_size: 1, optimizer: {sgd: {lr: 1}},\n"
             "           full_precision_eval: true, eval_backward: %s}\n",
             world, eval_backward ? "true" : "false");
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        return NULL;
    Pcs__V1__Plan *p = NULL;
    if (pcs_plan_build((Pcs__V1__JobSpec *)m, world, &p) != PCS_OK)
        p = NULL;
    protobuf_c_message_free_unpacked(m, NULL);
    return p;
}

/* the reduce-scatters of the step (after its optimizer step: reductions run on their own
 * thread): their dtypes in order; -1 if an audit against the plan failed */
static int rs_dtypes(pcs_runtime_t *rt, pcs_dtype_t *out, int cap)
{
    pcs_rt_stats_t st;
    pcs_runtime_stats(rt, &st);
    int n = 0;
    for (size_t i = 0; i < st.n_colls; i++)
        if (st.colls[i].kind == PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER && n < cap) {
            if (!st.colls[i].audit_ok)
                return -1;
            out[n++] = st.colls[i].dtype;
        }
    return n;
}

/* A forked rank's runtime over the file kv in kvdir (SGD lr 1, prefetch on; init_param
 * `init`): 0, or the failing stage's code with the error printed. */
static int rank_runtime(const char *kvdir, uint32_t r, const Pcs__V1__Plan *plan,
                        pcs_status_t (*init)(void *, const Pcs__V1__ParamSlot *, uint64_t,
                                             uint64_t, float *),
                        pcs_kv_t **kv, pcs_runtime_t **rt)
{
    *kv = NULL;
    *rt = NULL;
    if (pcs_kv_file_create(kvdir, kv) != PCS_OK)
        return 3;
    pcs_runtime_config_t rc;
    if (sgd_lr1_config(&rc, plan, 1) != PCS_OK)
        return 4;
    if (init)
        rc.init_param = init;
    rc.rank = r;
    rc.kv = *kv;
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 20000;
    if (pcs_runtime_create(&rc, rt) != PCS_OK) {
        fprintf(stderr, "rank %u: create: %s\n", r, pcs_last_error());
        return 5;
    }
    return 0;
}

/* The end of a forked rank: its verdict printed, a barrier, everything released. */
static int rank_done(uint32_t r, int bad, pcs_kv_t *kv, pcs_runtime_t *rt, Pcs__V1__Plan *plan)
{
    if (bad)
        fprintf(stderr, "rank %u: step %d: %s\n", r, bad, pcs_last_error());
    if (rt) {
        if (pcs_runtime_barrier(rt) != PCS_OK && !bad)
            bad = 99;
        pcs_runtime_destroy(rt);
    }
    pcs_kv_destroy(kv);
    pcs_plan_free(plan);
    return bad;
}

static int eval_bwd_rank(const char *kvdir, uint32_t r, void *arg)
{
    (void)arg;
    Pcs__V1__Plan *plan = eval_bwd_plan(1, 2);
    if (!plan || plan->units[0]->n_eval_collectives != 1)
        return 2;
    pcs_kv_t *kv = NULL;
    pcs_runtime_t *rt = NULL;
    int bad = rank_runtime(kvdir, r, plan, NULL, &kv, &rt);
    const float g = r == 0 ? 1.0f + 0x1p-20f : 1.0f;
    if (!bad) {
        float *gf = NULL;
        void *gb = NULL;
        pcs_dtype_t dt;
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t res;
        pcs_rt_shard_t sh;
        pcs_dtype_t seen[4];
        bad = 6;
        /* eval-mode backward: fp32 all the way */
        if (pcs_runtime_begin_step(rt) == PCS_OK &&
            pcs_runtime_grad_buffer_full(rt, 0, &gf) == PCS_OK) {
            for (int i = 0; i < 8; i++)
                gf[i] = g;
            /* no accumulation of an eval-mode backward, no second buffer beside it */
            if (pcs_runtime_post_backward(rt, 0, 0) != PCS_ERR_INVALID_ARG ||
                pcs_runtime_grad_buffer(rt, 0, &gb, &dt) != PCS_ERR_STATE)
                bad = 7;
            else if (pcs_runtime_post_backward(rt, 0, 1) == PCS_OK &&
                     pcs_runtime_optimizer_step(rt, &o, &res) == PCS_OK &&
                     rs_dtypes(rt, seen, 4) == 1 && seen[0] == PCS_DTYPE_FP32 &&
                     pcs_runtime_shard(rt, 0, &sh) == PCS_OK && sh.numel == 4) {
                bad = 0;
                for (int i = 0; i < 4; i++)
                    if (((const float *)sh.master)[i] != -(1.0f + 0x1p-21f))
                        bad = 8;
            }
        }
        /* a training backward of the same gradients: reduced in fp16, 1 + 2^-20 is 1 there */
        if (!bad) {
            bad = 9;
            if (pcs_runtime_begin_step(rt) == PCS_OK &&
                pcs_runtime_grad_buffer(rt, 0, &gb, &dt) == PCS_OK && dt == PCS_DTYPE_FP32) {
                for (int i = 0; i < 8; i++)
                    ((float *)gb)[i] = g;
                if (pcs_runtime_post_backward(rt, 0, 1) == PCS_OK &&
                    pcs_runtime_optimizer_step(rt, &o, &res) == PCS_OK &&
                    rs_dtypes(rt, seen, 4) == 1 && seen[0] == PCS_DTYPE_FP16 &&
                    pcs_runtime_shard(rt, 0, &sh) == PCS_OK) {
                    bad = 0;
                    for (int i = 0; i < 4; i++)
                        if (((const float *)sh.master)[i] != -(1.0f + 0x1p-21f) - 1.0f)
                            bad = 10;
                }
            }
        }
    }
    return rank_done(r, bad, kv, rt, plan);
}

static void test_eval_backward_reduces_in_full_precision(void **state)
{
    (void)state;
    int codes[2];
    pcs_rth_fork_ranks("rt-evalbwd", 2, eval_bwd_rank, NULL, 120000, codes);
    for (int r = 0; r < 2; r++)
        assert_int_equal(codes[r], 0);
    /* a job that did not ask for it: refused, naming the field */
    Pcs__V1__Plan *p = eval_bwd_plan(0, 1);
    assert_non_null(p);
    assert_int_equal(p->units[0]->n_eval_collectives, 0);
    pcs_runtime_config_t rc;
    assert_int_equal(sgd_lr1_config(&rc, p, 0), PCS_OK);
    pcs_runtime_t *rt = NULL;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
    float *gf = NULL;
    assert_int_equal(pcs_runtime_grad_buffer_full(rt, 0, &gf), PCS_ERR_STATE);
    assert_non_null(strstr(pcs_last_error(), "training.eval_backward"));
    pcs_runtime_destroy(rt);
    pcs_plan_free(p);
}

/* A frozen bf16 dtype part computing in fp32 (param_dtype fp32 over a model with a frozen bf16
 * weight), sharded per parameter on 2 ranks and the largest per_param unit: its gather buffer
 * holds fp32 [sg, c] although its masters are 2-byte bf16 (the buffer was once sized by the
 * storage dtype: a heap overflow under ASan, and an estimate short of the runtime). Each rank
 * gathers every unit, checks the part's values (the init rounded to bf16 once, then widened),
 * steps, and stays within the plan's estimate. */
static Pcs__V1__Plan *frozen_bf16_part_plan(void)
{
    static const char y[] =
        "model: {explicit: [{path: '', class: Net, params: [{name: w, shape: [16, 8]}]},\n"
        "  {path: blk, class: Block, params: [{name: a, shape: [8, 8]},\n"
        "   {name: b, shape: [128, 8], dtype: bf16, requires_grad_off: true}]}]}\n"
        "wrap: {explicit: [blk]}\nmesh: [{dim: dp_shard, size: 2}]\nshard_layout: per_param\n"
        "precision: {param_dtype: fp32}\n"
        "training: {steps: 1, micro_batch_size: 1, optimizer: {sgd: {lr: 1}}}\n";
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        return NULL;
    Pcs__V1__Plan *p = NULL;
    if (pcs_plan_build((Pcs__V1__JobSpec *)m, 2, &p) != PCS_OK)
        p = NULL;
    protobuf_c_message_free_unpacked(m, NULL);
    return p;
}

static int frozen_bf16_part_rank(const char *kvdir, uint32_t r, void *arg)
{
    (void)arg;
    Pcs__V1__Plan *plan = frozen_bf16_part_plan();
    if (!plan || plan->n_units != 3 || plan->units[2]->master_dtype != PCS__V1__DTYPE__DTYPE_BF16 ||
        plan->units[2]->param_dtype != PCS__V1__DTYPE__DTYPE_FP32)
        return 2;
    pcs_kv_t *kv = NULL;
    pcs_runtime_t *rt = NULL;
    int bad = rank_runtime(kvdir, r, plan, init_thirds32, &kv, &rt);
    if (!bad) {
        pcs_rt_shard_t sh;
        if (pcs_runtime_shard(rt, 2, &sh) != PCS_OK || sh.storage_dtype != PCS_DTYPE_BF16)
            bad = 6;
        if (!bad && pcs_runtime_begin_step(rt) != PCS_OK)
            bad = 7;
        for (uint32_t k = 0; k < 3 && !bad; k++) {
            const void *buf;
            pcs_dtype_t dt;
            if (pcs_runtime_unshard(rt, k, 0, &buf, &dt) != PCS_OK || dt != PCS_DTYPE_FP32) {
                bad = 8;
                break;
            }
            if (k == 2) /* b: 1024 elements at offset 0 of the part */
                for (uint64_t i = 0; i < 1024 && !bad; i++)
                    if (((const float *)buf)[i] != low_value(PCS_DTYPE_BF16, i))
                        bad = 9;
            if (!bad && (pcs_runtime_reshard(rt, k) != PCS_OK ||
                         pcs_runtime_post_backward(rt, k, 1) != PCS_OK))
                bad = 10;
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t res;
        if (!bad && pcs_runtime_optimizer_step(rt, &o, &res) != PCS_OK)
            bad = 11;
        Pcs__V1__RankEstimate e;
        pcs_rt_stats_t st;
        pcs_runtime_stats(rt, &st);
        if (!bad && (pcs_plan_rank_estimate(plan, r, &e) != PCS_OK ||
                     st.mem_peak_bytes > e.total_bytes - e.buffer_bytes)) {
            fprintf(stderr, "rank %u: runtime peak %llu B, estimate %llu B\n", r,
                    (unsigned long long)st.mem_peak_bytes,
                    (unsigned long long)(e.total_bytes - e.buffer_bytes));
            bad = 12;
        }
    }
    return rank_done(r, bad, kv, rt, plan);
}

static void test_frozen_bf16_part_gathers_fp32_on_two_ranks(void **state)
{
    (void)state;
    int codes[2];
    pcs_rth_fork_ranks("rt-bf16part", 2, frozen_bf16_part_rank, NULL, 120000, codes);
    for (int r = 0; r < 2; r++)
        assert_int_equal(codes[r], 0);
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

// ---- HSDP all-reduce once per step (hsdp_all_reduce last_micro_batch) ----

/* Rank r of a 2 x 2 HSDP world, unit 0 sharded (plan: reduce-scatter SUM pre-divide 2 over the
 * shard pair, all-reduce SUM post-divide 2 over the replicas), SGD lr 1 from 0, 3 micro-batches
 * of power-of-two gradients (exact sums): the master after each step must equal the mean over
 * the 4 ranks of the summed micro-batch gradients, whether each micro-batch all-reduces
 * (ar_last 0), the partial sums wait for the third hand-in (ar_last 1, all synced), or a
 * micro-batch is left out so the optimizer step all-reduces the partial sum itself (ar_last 1,
 * pattern 2: hand-ins at micro-batches 0 and 1 only). */
typedef struct {
    int ar_last, pattern;
} partial_arg_t;

static int partial_rank_main(const char *kvdir, uint32_t r, void *arg)
{
    const partial_arg_t *a = arg;
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    static const uint64_t numel[PCS_RTH_UNITS] = {64, 8};
    pcs_rth_plan_t b;
    pcs_rth_plan_build(&b, PCS_RTH_HYBRID, 4, numel);
    b.plan.micro_batches = 3;
    b.plan.sync_every_micro_batch = 1;
    b.plan.hsdp_all_reduce_last = a->ar_last;
    b.unit[0].param_dtype = PCS__V1__DTYPE__DTYPE_FP32; /* exact: no bf16 rounding */
    b.unit[1].param_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    pcs_runtime_config_t rc;
    if (sgd_lr1_config(&rc, &b.plan, 1) != PCS_OK)
        return 3;
    rc.micro_batches = 3;
    rc.rank = r;
    rc.kv = kv;
    rc.coll = PCS_COLL_GLOO;
    rc.job_tag = a->ar_last ? (a->pattern == 2 ? "partial-flush-" : "partial-last-") : "every-";
    pcs_runtime_t *rt = NULL;
    int rv = 0;
    if (pcs_runtime_create(&rc, &rt) != PCS_OK) {
        fprintf(stderr, "rank %u: create: %s\n", r, pcs_last_error());
        pcs_kv_destroy(kv);
        return 4;
    }
    float expect = 0;
    for (int step = 0; step < 2 && !rv; step++) {
        if (pcs_runtime_begin_step(rt) != PCS_OK)
            rv = 5;
        float want = 0;
        for (int m = 0; m < 3 && !rv; m++) {
            int in = !(a->pattern == 2 && m == 2);
            /* rank r, micro-batch m: 2^(r + 2m) (exact in fp32, summed in any order) */
            float v = (float)(1u << (r + 2 * m));
            for (uint32_t q = 0; q < 4; q++)
                want += in ? (float)(1u << (q + 2 * m)) / 4 : 0;
            for (uint32_t u = 0; u < PCS_RTH_UNITS && in; u++) {
                void *g;
                pcs_dtype_t dt;
                if (pcs_runtime_grad_buffer(rt, u, &g, &dt) != PCS_OK) {
                    rv = 6;
                    break;
                }
                for (uint64_t i = 0; i < b.unit[u].padded_numel; i++)
                    ((float *)g)[i] = i < numel[u] ? v : 0;
                if (pcs_runtime_post_backward(rt, u, 1) != PCS_OK)
                    rv = 7;
            }
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        pcs_rt_step_result_t res;
        if (!rv && pcs_runtime_optimizer_step(rt, &o, &res) != PCS_OK) {
            fprintf(stderr, "rank %u: step: %s\n", r, pcs_last_error());
            rv = 8;
        }
        expect -= want;
        pcs_rt_shard_t sh;
        if (!rv && pcs_runtime_shard(rt, 0, &sh) != PCS_OK)
            rv = 9;
        /* the shard's elements that belong to the parameter (padding stays 0) */
        for (uint64_t i = 0; !rv && i < sh.numel; i++) {
            uint64_t g = sh.shard_index * sh.numel + i;
            float w = ((const float *)sh.master)[i], e = g < numel[0] ? expect : 0;
            if (w != e) {
                fprintf(stderr, "rank %u step %d: master[%llu] = %g, want %g\n", r, step,
                        (unsigned long long)g, w, e);
                rv = 10;
            }
        }
    }
    pcs_runtime_destroy(rt);
    pcs_kv_destroy(kv);
    return rv;
}

static void test_hsdp_partial_sums_all_reduce_once_per_step(void **state)
{
    (void)state;
    const partial_arg_t args[3] = {{0, 1}, {1, 1}, {1, 2}};
    for (int k = 0; k < 3; k++) {
        int codes[4];
        pcs_rth_fork_ranks("rt-partial", 4, partial_rank_main, (void *)&args[k], 120000, codes);
        for (uint32_t r = 0; r < 4; r++)
            assert_int_equal(codes[r], 0);
    }
}

// ---- host staging gives the direct path's bits ----

/* Unit 0 sharded (FULL: reduce-scatter AVG; HYBRID: reduce-scatter SUM pre-divide 2 then an
 * all-reduce SUM post-divide 2 over the replicas) or replicated with a planned all-reduce AVG
 * (NO_SHARD); unit 1 replicated. The plan, the step sequence (AdamW, grad scaler, clipping, an
 * injected +Inf at step 2) and the comparison live in tests/support/runtime_harness.c. */
static const uint64_t k_stage_numel[PCS_RTH_UNITS] = {999, 37};

static uint32_t stage_world(pcs_rth_layout_t layout)
{
    return layout == PCS_RTH_HYBRID ? 4 : 2;
}

/* Rank r: the direct run, then the staged run of the same sequence, compared bit for bit (grad
 * norm included). */
static int stage_rank_main(const char *kvdir, uint32_t r, void *arg)
{
    pcs_rth_layout_t layout = *(const pcs_rth_layout_t *)arg;
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 2;
    pcs_rth_result_t d, s;
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    pcs_rth_run_t c;
    memset(&c, 0, sizeof c);
    c.backend = "cpu";
    c.coll = PCS_COLL_GLOO;
    c.layout = layout;
    c.world = stage_world(layout);
    c.rank = r;
    c.numel = k_stage_numel;
    c.kv = kv;
    c.clip_norm = 1.0;
    c.prefetch_all = 1;
    c.job_tag = "direct-";
    int rv = pcs_rth_run_steps(&c, &d);
    if (!rv) {
        c.stage_host = 1;
        c.job_tag = "staged-";
        rv = pcs_rth_run_steps(&c, &s);
    }
    if (!rv)
        rv = pcs_rth_compare(&s, &d, 0, 0, r, "staged run differs from the direct one");
    pcs_rth_result_free(&d);
    pcs_rth_result_free(&s);
    pcs_kv_destroy(kv);
    return rv;
}

static void run_stage_parity(pcs_rth_layout_t layout)
{
    int codes[4];
    uint32_t w = stage_world(layout);
    pcs_rth_fork_ranks("rt-stage", w, stage_rank_main, &layout, 240000, codes);
    for (uint32_t r = 0; r < w; r++)
        assert_int_equal(codes[r], 0);
}

static void test_staged_full_shard_w2_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(PCS_RTH_FULL);
}

static void test_staged_no_shard_w2_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(PCS_RTH_NO_SHARD);
}

static void test_staged_hybrid_shard_w4_is_bit_identical_to_direct(void **state)
{
    (void)state;
    run_stage_parity(PCS_RTH_HYBRID);
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
    pcs_rth_plan_t b;
    pcs_rth_plan_build(&b, PCS_RTH_FULL, 2, k_stage_numel);
    b.plan.world_size = 1; /* no communicator is ever created */
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    assert_int_equal(pcs_backend_get("cpu", &rc.be), PCS_OK);
    rc.init_param = pcs_rth_init_wave;
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
    /* what the coordinator refuses at SubmitJob (pcs_plan_check_runnable) the runtime refuses
     * too, before allocating anything */
    rc.device = 0;
    b.plan.units[0]->reduce_dtype = PCS__V1__DTYPE__DTYPE_FP64;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_ERR_UNSUPPORTED);
    assert_null(rt);
    assert_non_null(strstr(pcs_last_error(), "reduce dtype fp64"));
    b.plan.units[0]->reduce_dtype = PCS__V1__DTYPE__DTYPE_FP32;
}

/* A pool block is reused only after every stream's work on it: unit 0 prefetched (its
 * all-gather queued on the all-gather stream) and resharded without ever being unsharded gives
 * its block back; unit 1's gradient buffer, the same size, takes it on the compute stream and is
 * zeroed there. On the simulated device (streams run asynchronously) the queued gather must not
 * land in it afterwards: the release waits for the gather (review of the pool, finding 1). */
static void test_prefetched_block_is_reused_only_after_its_gather(void **state)
{
    (void)state;
    assert_int_equal(pcs_backend_simulate_cuda(1), PCS_OK);
    const pcs_backend_ops_t *be = NULL;
    assert_int_equal(pcs_backend_get("cuda", &be), PCS_OK);
    assert_true(pcs_backend_is_simulated(be));
    assert_int_equal(be->set_device(0), PCS_OK);
    uint64_t numel[2] = {64, 64};
    pcs_rth_plan_t b;
    pcs_rth_plan_build(&b, PCS_RTH_FULL, 1, numel);
    pcs_stream_t cs = NULL;
    assert_int_equal(be->stream_create(&cs), PCS_OK);
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    rc.be = be;
    rc.micro_batches = 1;
    rc.init_param = pcs_rth_init_wave;
    rc.opt = PCS_OPT_SGD;
    rc.sgd.lr = 0.1;
    rc.prefetch = 1;
    rc.stream = cs;
    pcs_runtime_t *rt = NULL;
    assert_int_equal(pcs_runtime_create(&rc, &rt), PCS_OK);
    assert_int_equal(pcs_runtime_begin_step(rt), PCS_OK);
    uint64_t padded = b.unit[0].padded_numel;
    assert_int_equal(b.unit[1].padded_numel, padded);
    for (int round = 0; round < 20; round++) {
        assert_int_equal(pcs_runtime_prefetch(rt, 0), PCS_OK);
        assert_int_equal(pcs_runtime_reshard(rt, 0), PCS_OK); /* never unsharded */
        void *g;
        pcs_dtype_t gdt;
        assert_int_equal(pcs_runtime_grad_buffer(rt, 1, &g, &gdt), PCS_OK);
        const void *p;
        pcs_dtype_t pdt;
        assert_int_equal(pcs_runtime_unshard(rt, 1, 0, &p, &pdt), PCS_OK);
        size_t es = pcs_dtype_size(gdt);
        uint8_t *h = calloc(padded, es);
        assert_non_null(h);
        assert_int_equal(be->copy(h, g, padded * es, PCS_COPY_D2H, cs), PCS_OK);
        assert_int_equal(be->sync(cs), PCS_OK);
        size_t nz = 0;
        for (size_t i = 0; i < padded * es; i++)
            nz += h[i] != 0;
        free(h);
        if (nz)
            fail_msg("round %d: unit 1's zeroed gradient buffer has %zu nonzero bytes", round, nz);
        assert_int_equal(pcs_runtime_post_backward(rt, 1, 0), PCS_OK);
        assert_int_equal(pcs_runtime_reshard(rt, 1), PCS_OK);
    }
    pcs_runtime_destroy(rt);
    be->stream_destroy(cs);
    assert_int_equal(pcs_backend_simulate_cuda(0), PCS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_on_every_micro_batch_reduces_each_hand_in_once),
        cmocka_unit_test(test_prefetched_block_is_reused_only_after_its_gather),
        cmocka_unit_test(test_no_sync_hand_in_with_one_micro_batch_is_accumulated),
        cmocka_unit_test(test_accumulator_read_in_place_is_not_overwritten_by_the_next_micro_batch),
        cmocka_unit_test(test_grad_target_accumulates_in_place_and_zeroes_only_the_padding),
        cmocka_unit_test(test_fused_clipping_sum_is_bit_identical),
        cmocka_unit_test(test_frozen_parameters_get_no_optimizer_state),
        cmocka_unit_test(test_fully_frozen_unit_holds_no_gradient_or_state),
        cmocka_unit_test(test_world_of_one_divides_by_a_custom_factor),
        cmocka_unit_test(test_frozen_parameters_are_not_updated_or_counted),
        cmocka_unit_test(test_fp64_masters_keep_and_update_doubles),
        cmocka_unit_test(test_frozen_low_precision_unit_keeps_its_dtype),
        cmocka_unit_test(test_premul_sum_reduce_scatter_multiplies_every_input),
        cmocka_unit_test(test_eval_backward_reduces_in_full_precision),
        cmocka_unit_test(test_frozen_bf16_part_gathers_fp32_on_two_ranks),
        cmocka_unit_test(test_replicated_unit_without_a_planned_all_reduce_is_averaged),
        cmocka_unit_test(test_staged_full_shard_w2_is_bit_identical_to_direct),
        cmocka_unit_test(test_staged_no_shard_w2_is_bit_identical_to_direct),
        cmocka_unit_test(test_staged_hybrid_shard_w4_is_bit_identical_to_direct),
        cmocka_unit_test(test_hsdp_partial_sums_all_reduce_once_per_step),
        cmocka_unit_test(test_nccl_on_host_buffers_is_refused_with_a_reason),
        cmocka_unit_test(test_cpu_event_elapsed_is_host_time_between_records),
    };
    return cmocka_run_group_tests_name("runtime", tests, NULL, NULL);
}
