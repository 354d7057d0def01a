/* Unit runtime of a world of one (no communicators, so no KV): with the prefetch and reduction
 * threads running, a unit whose gradients are handed in with sync on every micro-batch (FSDP2
 * without no-sync) accumulates every micro-batch's reduced gradient exactly once; the copy-in of
 * the next hand-in must not overwrite the reduce buffer while the reduction thread still reads it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/kernels.h"
#include "runtime.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_on_every_micro_batch_reduces_each_hand_in_once),
        cmocka_unit_test(test_no_sync_hand_in_with_one_micro_batch_is_accumulated),
    };
    return cmocka_run_group_tests_name("runtime", tests, NULL, NULL);
}
