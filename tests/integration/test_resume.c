/* Resume from a sharded checkpoint (issue 13): a job that resumes from another job's committed
 * step continues exactly where that job was. W ranks (forked processes running pcs_train over a
 * file KV store) train 8 steps with checkpoints at 4 and 8; a second job resumes from step 4 of
 * the first and trains to 8: its final parameters must be bit-identical to the first job's — fp32
 * and bf16/fp32 policies, AdamW and SGD with momentum, an fp16 grad scaler whose scale and growth
 * tracker must come back, BatchNorm running statistics, and a step skipped for an overflow before
 * the checkpoint. A resume at another world size and strategy reshards (planner/reshard.c) and
 * trains on; a checkpoint of another model is refused naming the parameter. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "test_e2e_util.h"
#include "test_util.h"

typedef struct variant {
    const char *name;
    const char *model;
    const char *precision;
    const char *optimizer;
    const char *strategy;
    const char *extra; /* more training: keys */
    int world;
    const char *layout, *layout2; /* shard_layout of the first jobs, of the resharded ones */
} variant_t;

static char *job_yaml(const variant_t *v, const char *resume_from, int resume_step,
                      const char *strategy, int world)
{
    const char *layout = (strategy ? v->layout2 : v->layout) ? (strategy ? v->layout2 : v->layout)
                                                            : "flat";
    char *y = malloc(4096);
    assert_non_null(y);
    char resume[1400] = "";
    if (resume_from)
        snprintf(resume, sizeof resume, "resume: {from: '%s', step: %d}\n", resume_from,
                 resume_step);
    snprintf(y, 4096,
             "name: %s\n"
             "model:\n  mlp: %s\n"
             "wrap: {module_class: [MLPBlock]}\n"
             "precision: %s\n"
             "strategy: %s\n"
             "mesh:\n  - {dim: dp_shard, size: %d}\n"
             "training: {steps: 8, micro_batch_size: 4, micro_batches: 2, optimizer: %s%s}\n"
             "data: {synthetic: {seed: 11}}\n"
             "init: {seed: 5}\n"
             "checkpoint: {dir: ckpt, every_steps: 4, keep_last: 4}\n"
             "shard_layout: %s\n"
             "%s",
             v->name, v->model, v->precision, strategy ? strategy : v->strategy, world,
             v->optimizer, v->extra ? v->extra : "", layout, resume);
    return y;
}


static void run_variant(const variant_t *v)
{
    e2e_job_t full, resumed;
    char *full_dir = NULL, *res_dir = NULL;
    char *y = job_yaml(v, NULL, 0, NULL, v->world);
    /* inject an overflow at step 2 on rank 0 when the scaler is on: a skipped step before the
     * checkpoint, and a scale that halved and must come back */
    uint64_t inj = strstr(v->precision, "fp16") ? 2 : 0;
    assert_int_equal(e2e_run_local(y, "resume-full", v->world, inj, 0, &full, &full_dir), 0);
    if (full.state != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("%s: the uninterrupted run failed: %s", v->name, full.reason);
    free(y);
    char from[1200];
    snprintf(from, sizeof from, "%s/ckpt/local", full_dir);
    y = job_yaml(v, from, 4, NULL, v->world);
    assert_int_equal(e2e_run_local(y, "resume-half", v->world, 0, 0, &resumed, &res_dir), 0);
    if (resumed.state != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("%s: the resumed run failed: %s", v->name, resumed.reason);
    free(y);
    /* the resumed job reported steps 5..8 only, with the uninterrupted run's losses */
    assert_int_equal(resumed.n_reports[0], 4);
    assert_int_equal(resumed.reports[0][0]->step, 5);
    for (int i = 0; i < 4; i++) {
        const Pcs__V1__StepReport *a = full.reports[0][4 + i], *b = resumed.reports[0][i];
        assert_int_equal(a->step, b->step);
        if (a->loss != b->loss || a->loss_scale != b->loss_scale ||
            a->skipped_steps != b->skipped_steps || a->eval_loss != b->eval_loss)
            fail_msg("%s step %llu: loss %.9g/%.9g scale %g/%g skipped %llu/%llu eval %.9g/%.9g",
                     v->name, (unsigned long long)a->step, a->loss, b->loss, a->loss_scale,
                     b->loss_scale, (unsigned long long)a->skipped_steps,
                     (unsigned long long)b->skipped_steps, a->eval_loss, b->eval_loss);
    }
    e2e_assert_same_bits(full.export_path, resumed.export_path, v->name);
    e2e_job_free(&resumed);
    pcs_test_rmtree(res_dir);
    free(res_dir);

    /* resharded: from W ranks of one strategy to another W and strategy: it runs on and its
     * reports continue at step 5; pcsctl plan prints where each new rank reads from */
    int w2 = v->world == 4 ? 2 : 4;
    const char *s2 = strcmp(v->strategy, "full_shard") == 0 ? "no_shard" : "full_shard";
    y = job_yaml(v, from, 4, s2, w2);
    char yfile[1300], cmd[3000];
    snprintf(yfile, sizeof yfile, "%s/resume.yaml", full_dir);
    FILE *yf = fopen(yfile, "w");
    assert_non_null(yf);
    fputs(y, yf);
    fclose(yf);
    snprintf(cmd, sizeof cmd, "%s plan %s --world %d 2>&1", pcs_test_bin("pcsctl"), yfile, w2);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    if (status != 0)
        fail_msg("pcsctl plan of a resume: exit %d:\n%s", status, out);
    char want[128];
    snprintf(want, sizeof want, "step 4 (written by %d ranks", v->world);
    if (!strstr(out, want) || !strstr(out, "#   rank 0 reads ") || !strstr(out, "from rank-00000"))
        fail_msg("pcsctl plan of a resume:\n%s", out);
    free(out);
    assert_int_equal(e2e_run_local(y, "resume-reshard", w2, 0, 0, &resumed, &res_dir), 0);
    if (resumed.state != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("%s: the resharded resume failed: %s", v->name, resumed.reason);
    free(y);
    assert_int_equal(resumed.reports[0][0]->step, 5);
    e2e_job_free(&resumed);
    pcs_test_rmtree(res_dir);
    free(res_dir);
    /* what a resharded load holds: resumed at the last step (nothing to train), the job writes
     * its checkpoint of the state it loaded, whose export is the uninterrupted run's to the bit */
    y = job_yaml(v, from, 8, s2, w2);
    assert_int_equal(e2e_run_local(y, "resume-at-end", w2, 0, 0, &resumed, &res_dir), 0);
    free(y);
    if (resumed.state != PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fail_msg("%s: the resume at the last step failed: %s", v->name, resumed.reason);
    e2e_assert_same_bits(full.export_path, resumed.export_path, v->name);
    e2e_job_free(&resumed);
    pcs_test_rmtree(res_dir);
    free(res_dir);
    e2e_job_free(&full);
    pcs_test_rmtree(full_dir);
    free(full_dir);
}

static const char k_mlp[] =
    "{input_dim: 8, hidden_dims: [16, 16], output_dim: 4, norm: layernorm, residual: true}";
static const char k_bn[] = "{input_dim: 8, hidden_dims: [16, 16], output_dim: 4, norm: batchnorm}";

static void test_fp32_adamw_full_shard(void **state)
{
    (void)state;
    variant_t v = {"fp32-adamw", k_mlp, "{}", "{adamw: {lr: 0.01, weight_decay: 0.1}}",
                   "full_shard", NULL, 4, NULL, NULL};
    run_variant(&v);
}

static void test_bf16_sgd_momentum_shard_grad_op(void **state)
{
    (void)state;
    variant_t v = {"bf16-sgd", k_mlp, "{param_dtype: bf16, reduce_dtype: fp32}",
                   "{sgd: {lr: 0.05, momentum: 0.9}}", "shard_grad_op", NULL, 2, NULL, NULL};
    run_variant(&v);
}

static void test_fp16_grad_scaler_and_batchnorm(void **state)
{
    (void)state;
    variant_t v = {"fp16-scaler-bn",
                   k_bn,
                   "{param_dtype: fp16, reduce_dtype: fp32}",
                   "{adamw: {lr: 0.01}}",
                   "full_shard",
                   ", eval_every: 2, grad_scaler: {enabled: true, init_scale: 1024, "
                   "growth_interval: 3}",
                   4,
                   NULL,
                   NULL};
    run_variant(&v);
}

/* FSDP2's per-parameter layout: resumed in the same layout to the bit, then resharded to the
 * flat layout at another world size and strategy (and the reverse): the transfer finds every
 * element of a parameter by its rows, and the resume at the last step exports the uninterrupted
 * run's parameters to the bit. */
static void test_per_param_layout_resumes_and_reshards_to_flat(void **state)
{
    (void)state;
    variant_t v = {"per-param", k_mlp, "{param_dtype: bf16, reduce_dtype: fp32}",
                   "{adamw: {lr: 0.01}}", "shard_grad_op", NULL, 4, "per_param", "flat"};
    run_variant(&v);
}

static void test_flat_checkpoint_reshards_to_per_param(void **state)
{
    (void)state;
    variant_t v = {"flat-to-per-param", k_mlp, "{}", "{sgd: {lr: 0.05, momentum: 0.9}}",
                   "shard_grad_op", NULL, 2, "flat", "per_param"};
    run_variant(&v);
}

static void test_a_checkpoint_of_another_model_is_refused(void **state)
{
    (void)state;
    variant_t v = {"other", k_mlp, "{}", "{sgd: {lr: 0.1}}", "full_shard", NULL, 2, NULL, NULL};
    e2e_job_t full, other;
    char *full_dir = NULL, *other_dir = NULL;
    char *y = job_yaml(&v, NULL, 0, NULL, 2);
    assert_int_equal(e2e_run_local(y, "resume-model", 2, 0, 0, &full, &full_dir), 0);
    free(y);
    char from[1200];
    snprintf(from, sizeof from, "%s/ckpt/local", full_dir);
    v.model = "{input_dim: 8, hidden_dims: [16, 17], output_dim: 4, norm: layernorm, residual: "
              "true}";
    y = job_yaml(&v, from, 0, NULL, 2);
    assert_int_equal(e2e_run_local(y, "resume-model2", 2, 0, 0, &other, &other_dir), 0);
    free(y);
    assert_int_equal(other.state, PCS__V1__JOB_STATE__JOB_STATE_FAILED);
    if (!strstr(other.reason, "parameter head.weight has 64 elements in the checkpoint, 68 in this "
                              "job"))
        fail_msg("reason: %s", other.reason);
    e2e_job_free(&other);
    e2e_job_free(&full);
    pcs_test_rmtree(full_dir);
    pcs_test_rmtree(other_dir);
    free(full_dir);
    free(other_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_adamw_full_shard),
        cmocka_unit_test(test_bf16_sgd_momentum_shard_grad_op),
        cmocka_unit_test(test_fp16_grad_scaler_and_batchnorm),
        cmocka_unit_test(test_per_param_layout_resumes_and_reshards_to_flat),
        cmocka_unit_test(test_flat_checkpoint_reshards_to_per_param),
        cmocka_unit_test(test_a_checkpoint_of_another_model_is_refused),
    };
    if (getenv("PCS_TEST_FILTER")) /* e.g. "test_per_param*": the matching tests only */
        cmocka_set_test_filter(getenv("PCS_TEST_FILTER"));
    return cmocka_run_group_tests_name("resume", tests, NULL, NULL);
}
