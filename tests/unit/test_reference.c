/* Unit tests of the single-process reference trainer (model/reference.c): training makes
 * progress in fp32 and bf16, the per-rank emulation equals the global-batch computation, the
 * data-parallel decomposition does not change an fp32 run, the fp16 grad scaler skips a step with
 * non-finite gradients, BatchNorm running statistics, eval, export and init-from-file. Jobs are
 * written in YAML (the `pcsctl submit` form) and parsed with pcs_pb_from_yaml. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/pbtext.h"
#include "planner/plan.h"
#include "pcs/v1/job.pb-c.h"
#include "model/reference.h"
#include "io/safetensors.h"
#include "test_util.h"

static Pcs__V1__JobSpec *job(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static Pcs__V1__JobSpec *job(const char *fmt, ...)
{
    char text[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ProtobufCMessage *m = NULL;
    pcs_status_t rc = pcs_pb_from_yaml(text, strlen(text), &pcs__v1__job_spec__descriptor, &m);
    if (rc != PCS_OK)
        print_error("yaml: %s\n", pcs_last_error());
    assert_int_equal(rc, PCS_OK);
    return (Pcs__V1__JobSpec *)m;
}

static void job_free(Pcs__V1__JobSpec *s)
{
    protobuf_c_message_free_unpacked(&s->base, NULL);
}

/* A small job: activation, norm, precision keys, dp size, steps, micro-batch rows, micro-batches,
 * loss, extra training keys, synthetic task, extra init keys. */
#define SMALL_JOB                                                                                  \
    "name: t\n"                                                                                    \
    "model: {mlp: {input_dim: 8, hidden_dims: [32, 32], output_dim: 4, activation: %s, "           \
    "norm: %s, residual: true}}\n"                                                                 \
    "precision: {%s}\n"                                                                            \
    "mesh: [{dim: dp_shard, size: %u}]\n"                                                          \
    "training: {steps: %u, micro_batch_size: %u, micro_batches: %u, loss: %s, %s}\n"               \
    "data: {synthetic: {task: %s, seed: 3, num_samples: 4096}}\n"                                  \
    "init: {seed: 11%s}\n"

static double mean_of(const double *v, size_t a, size_t b)
{
    double s = 0;
    for (size_t i = a; i < b; i++)
        s += v[i];
    return s / (double)(b - a);
}

static void check_loss_decreases(const char *precision, const char *opt)
{
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "gelu", "layernorm", precision, 2u, 60u, 8u, 2u, "mse",
                              opt, "regression", "");
    pcs_reference_t *r;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_OK);
    assert_int_equal(pcs_ref_run(r), PCS_OK);
    size_t n;
    const double *l = pcs_ref_losses(r, &n);
    assert_int_equal(n, 60);
    for (size_t i = 0; i < n; i++)
        assert_true(isfinite(l[i]));
    double first = mean_of(l, 0, 5), last = mean_of(l, 55, 60);
    if (!(last < 0.6 * first))
        print_error("%s / %s: first %.5f last %.5f\n", precision, opt, first, last);
    assert_true(last < 0.6 * first);
    pcs_ref_destroy(r);
    job_free(s);
}

static void test_fp32_adamw_loss_decreases(void **state)
{
    (void)state;
    check_loss_decreases("", "optimizer: {adamw: {lr: 0.003}}");
}

static void test_bf16_fp32_reduce_loss_decreases(void **state)
{
    (void)state;
    check_loss_decreases("param_dtype: bf16, reduce_dtype: fp32",
                         "optimizer: {adamw: {lr: 0.003}}, clip_grad_norm: 1.0");
}

static void test_bf16_sgd_momentum_loss_decreases(void **state)
{
    (void)state;
    check_loss_decreases("param_dtype: bf16", "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}");
}

static void test_classification_cross_entropy_loss_decreases(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "relu", "none", "", 1u, 60u, 16u, 1u, "cross_entropy",
                              "optimizer: {adamw: {lr: 0.01}}", "classification", "");
    pcs_reference_t *r;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_OK);
    assert_int_equal(pcs_ref_run(r), PCS_OK);
    size_t n;
    const double *l = pcs_ref_losses(r, &n);
    assert_true(mean_of(l, 55, 60) < 0.7 * mean_of(l, 0, 5));
    pcs_ref_destroy(r);
    job_free(s);
}

/* fp32: emulating 4 ranks (per-rank forward, /ws reduction) equals one forward over the global
 * micro-batch, and equals a 1-rank run with 4x the batch: the data-parallel decomposition is
 * invisible up to fp32 rounding. */
static void test_dp_emulation_matches_global_batch_fp32(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s4 = job(SMALL_JOB, "gelu", "layernorm", "", 4u, 5u, 2u, 2u, "mse",
                               "optimizer: {sgd: {lr: 0.1, momentum: 0.0}}", "regression", "");
    Pcs__V1__JobSpec *s1 = job(SMALL_JOB, "gelu", "layernorm", "", 1u, 5u, 8u, 2u, "mse",
                               "optimizer: {sgd: {lr: 0.1, momentum: 0.0}}", "regression", "");
    pcs_reference_t *a, *b, *c;
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    assert_int_equal(pcs_ref_create(s4, NULL, &o, &a), PCS_OK);
    o.global_batch = 1;
    assert_int_equal(pcs_ref_create(s4, NULL, &o, &b), PCS_OK);
    assert_int_equal(pcs_ref_create(s1, NULL, NULL, &c), PCS_OK);
    assert_int_equal(pcs_ref_dp_size(a), 4);
    assert_int_equal(pcs_ref_dp_size(c), 1);
    assert_int_equal(pcs_ref_run(a), PCS_OK);
    assert_int_equal(pcs_ref_run(b), PCS_OK);
    assert_int_equal(pcs_ref_run(c), PCS_OK);
    size_t n;
    const double *la = pcs_ref_losses(a, &n), *lb = pcs_ref_losses(b, &n),
                 *lc = pcs_ref_losses(c, &n);
    for (size_t i = 0; i < n; i++) {
        assert_true(fabs(la[i] - lb[i]) <= 1e-5 * fabs(lb[i]) + 1e-7);
        assert_true(fabs(lc[i] - lb[i]) <= 1e-5 * fabs(lb[i]) + 1e-7);
    }
    const pcs_mlp_t *m = pcs_ref_model(a);
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        const float *pa = pcs_ref_param(a, t->fqn), *pb = pcs_ref_param(b, t->fqn),
                    *pc = pcs_ref_param(c, t->fqn);
        for (uint64_t e = 0; e < t->numel; e++) {
            assert_true(fabsf(pa[e] - pb[e]) <= 1e-5f * fabsf(pb[e]) + 1e-6f);
            assert_true(fabsf(pc[e] - pb[e]) <= 1e-5f * fabsf(pb[e]) + 1e-6f);
        }
    }
    pcs_ref_destroy(a);
    pcs_ref_destroy(b);
    pcs_ref_destroy(c);
    job_free(s4);
    job_free(s1);
}

/* A custom gradient divide factor divides the gradient in a world of one too (FSDP2 foreach_reduce,
 * world_size 1): one fp32 SGD step (lr 0.1, no momentum or clipping) with factor 4 moves every
 * parameter by a quarter of the factor-less step (dp = 1: no division). */
static void test_world_of_one_custom_divide_factor_quarters_the_step(void **state)
{
    (void)state;
    const char *opt = "optimizer: {sgd: {lr: 0.1, momentum: 0.0}}";
    char with[256];
    snprintf(with, sizeof with, "%s, gradient_divide_factor: 4", opt);
    Pcs__V1__JobSpec *s0 =
        job(SMALL_JOB, "gelu", "layernorm", "", 1u, 1u, 8u, 1u, "mse", opt, "regression", "");
    Pcs__V1__JobSpec *s4 =
        job(SMALL_JOB, "gelu", "layernorm", "", 1u, 1u, 8u, 1u, "mse", with, "regression", "");
    pcs_reference_t *a, *b, *c;
    assert_int_equal(pcs_ref_create(s0, NULL, NULL, &a), PCS_OK);
    assert_int_equal(pcs_ref_create(s4, NULL, NULL, &b), PCS_OK);
    Pcs__V1__Plan *plan = NULL; /* the planner's local_reduction drives the same divide */
    assert_int_equal(pcs_plan_build(s4, 1, &plan), PCS_OK);
    assert_int_equal(pcs_ref_create(s4, plan, NULL, &c), PCS_OK);
    const pcs_mlp_t *m = pcs_ref_model(a);
    uint64_t total = 0;
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++)
        total += pcs_mlp_param(m, p)->numel;
    float *init = malloc(total * sizeof *init);
    assert_non_null(init);
    uint64_t o = 0;
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        memcpy(init + o, pcs_ref_param(a, t->fqn), t->numel * sizeof *init);
        o += t->numel;
    }
    assert_int_equal(pcs_ref_run(a), PCS_OK);
    assert_int_equal(pcs_ref_run(b), PCS_OK);
    assert_int_equal(pcs_ref_run(c), PCS_OK);
    o = 0;
    size_t moved = 0;
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        const float *pa = pcs_ref_param(a, t->fqn), *pb = pcs_ref_param(b, t->fqn);
        for (uint64_t e = 0; e < t->numel; e++, o++) {
            double da = (double)pa[e] - init[o], db = (double)pb[e] - init[o];
            /* the subtraction from the parameter rounds once in each run */
            double tol = 2.0 * 0x1p-24 * (fabs(init[o]) + fabs(pa[e])) + 1e-12;
            if (fabs(db - da / 4.0) > tol)
                fail_msg("%s[%llu]: step %.9g, with factor 4 %.9g", t->fqn, (unsigned long long)e,
                         da, db);
            moved += da != 0;
            assert_true(pcs_ref_param(c, t->fqn)[e] == pb[e]);
        }
    }
    assert_true(moved > total / 2); /* the comparison is not vacuous */
    free(init);
    pcs_ref_destroy(a);
    pcs_ref_destroy(b);
    pcs_ref_destroy(c);
    pcs_plan_free(plan);
    job_free(s0);
    job_free(s4);
}

/* In bf16 the per-rank emulation differs from the global batch by rounding only. */
static void test_dp_emulation_bf16_within_bf16_tolerance(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "relu", "none", "param_dtype: bf16", 4u, 3u, 4u, 1u, "mse",
                              "optimizer: {sgd: {lr: 0.05, momentum: 0.0}}", "regression", "");
    pcs_reference_t *a, *b;
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    assert_int_equal(pcs_ref_create(s, NULL, &o, &a), PCS_OK);
    o.global_batch = 1;
    assert_int_equal(pcs_ref_create(s, NULL, &o, &b), PCS_OK);
    assert_int_equal(pcs_ref_run(a), PCS_OK);
    assert_int_equal(pcs_ref_run(b), PCS_OK);
    size_t n;
    const double *la = pcs_ref_losses(a, &n), *lb = pcs_ref_losses(b, &n);
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(fabs(la[i] - lb[i]) <= 1.6e-2 * fabs(lb[i]) + 1e-5);
        differ |= la[i] != lb[i];
    }
    /* the emulation really rounds per rank (else this test would not test anything) */
    const float *ga = pcs_ref_grad(a, "head.weight"), *gb = pcs_ref_grad(b, "head.weight");
    for (int e = 0; e < 128; e++)
        differ |= ga[e] != gb[e];
    assert_true(differ);
    pcs_ref_destroy(a);
    pcs_ref_destroy(b);
    job_free(s);
}

/* fp16 with the grad scaler: an Inf injected at step 2 skips that optimizer step on every
 * parameter, halves the scale (65536 -> 32768) and resets growth; other steps update. */
static void test_grad_scaler_skips_step_on_injected_inf(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "relu", "none", "param_dtype: fp16", 2u, 4u, 4u, 1u, "mse",
                              "optimizer: {adamw: {lr: 0.01}}, grad_scaler: {enabled: true, "
                              "growth_interval: 2}",
                              "regression", "");
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    o.inject_nonfinite_step = 2;
    pcs_reference_t *r;
    assert_int_equal(pcs_ref_create(s, NULL, &o, &r), PCS_OK);
    const pcs_mlp_t *m = pcs_ref_model(r);
    uint64_t total = pcs_mlp_total_params(m);
    float *before = calloc(total, sizeof(float)), *after = calloc(total, sizeof(float));
    pcs_ref_step_result_t res;
    assert_int_equal(pcs_ref_step(r, &res), PCS_OK);
    assert_false(res.skipped);
    assert_true(res.scale == 65536.0);
    assert_int_equal(pcs_ref_step(r, &res), PCS_OK);
    assert_false(res.skipped);
    assert_true(res.scale == 131072.0); /* growth_interval 2 reached */
    uint64_t off = 0;
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        memcpy(before + off, pcs_ref_param(r, t->fqn), t->numel * sizeof(float));
        off += t->numel;
    }
    assert_int_equal(pcs_ref_step(r, &res), PCS_OK);
    assert_true(res.skipped);
    assert_true(res.scale == 65536.0); /* backoff 0.5 */
    assert_false(isfinite(res.grad_norm));
    off = 0;
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        memcpy(after + off, pcs_ref_param(r, t->fqn), t->numel * sizeof(float));
        off += t->numel;
    }
    assert_memory_equal(before, after, total * sizeof(float));
    assert_int_equal(pcs_ref_step(r, &res), PCS_OK);
    assert_false(res.skipped);
    assert_true(res.scale == 65536.0); /* tracker restarted after the skip */
    assert_true(isfinite(res.loss));
    assert_int_equal(pcs_ref_step(r, &res), PCS_ERR_STATE);
    free(before);
    free(after);
    pcs_ref_destroy(r);
    job_free(s);
}

/* BatchNorm units: running statistics move with every training micro-batch of rank 0, the
 * counter counts them, and eval uses them. */
static void test_batchnorm_running_stats_tracked_per_rank(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s =
        job(SMALL_JOB, "relu", "batchnorm", "param_dtype: bf16", 2u, 3u, 4u, 2u, "mse",
            "optimizer: {adamw: {lr: 0.01}}, eval_every: 1", "regression", "");
    pcs_reference_t *r;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_OK);
    float nbt, rm[32], rv[32];
    assert_int_equal(pcs_ref_buffer(r, "layers.0.norm.num_batches_tracked", &nbt), PCS_OK);
    assert_true(nbt == 0.0f);
    assert_int_equal(pcs_ref_run(r), PCS_OK);
    assert_int_equal(pcs_ref_buffer(r, "layers.1.norm.num_batches_tracked", &nbt), PCS_OK);
    assert_true(nbt == 6.0f); /* 3 steps x 2 micro-batches on rank 0 */
    assert_int_equal(pcs_ref_buffer(r, "layers.0.norm.running_mean", rm), PCS_OK);
    assert_int_equal(pcs_ref_buffer(r, "layers.0.norm.running_var", rv), PCS_OK);
    int moved = 0;
    for (int j = 0; j < 32; j++) {
        moved += rm[j] != 0.0f;
        assert_true(rv[j] > 0.0f && rv[j] != 1.0f);
    }
    assert_true(moved > 16);
    size_t ne;
    const uint64_t *at;
    const double *ev = pcs_ref_eval_losses(r, &at, &ne);
    assert_int_equal(ne, 3);
    assert_int_equal(at[2], 3);
    assert_true(isfinite(ev[0]) && ev[0] > 0);
    assert_int_equal(pcs_ref_buffer(r, "layers.0.norm.nope", rm), PCS_ERR_NOT_FOUND);
    pcs_ref_destroy(r);
    job_free(s);
}

/* Export writes every parameter and buffer under its FQN; a new job initialised from that file
 * starts from exactly those values; a shape mismatch names the tensor. */
static void test_export_then_init_from_file_round_trips(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("ref");
    char path[512];
    snprintf(path, sizeof path, "%s/final.safetensors", dir);
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "gelu", "batchnorm", "", 1u, 2u, 4u, 1u, "mse",
                              "optimizer: {adamw: {lr: 0.01}}", "regression", "");
    pcs_reference_t *r, *r2;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_OK);
    assert_int_equal(pcs_ref_run(r), PCS_OK);
    assert_int_equal(pcs_ref_export(r, path), PCS_OK);
    pcs_st_file_t *f;
    assert_int_equal(pcs_st_open(path, &f), PCS_OK);
    const pcs_mlp_t *m = pcs_ref_model(r);
    assert_int_equal(pcs_st_count(f), pcs_mlp_num_params(m) + pcs_mlp_num_buffers(m));
    assert_string_equal(pcs_st_metadata(f, "format"), "pt");
    assert_string_equal(pcs_st_metadata(f, "step"), "2");
    const pcs_st_tensor_t *t = pcs_st_find(f, "layers.1.linear.weight");
    assert_non_null(t);
    assert_string_equal(t->dtype_str, "F32");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 32);
    assert_int_equal(t->shape[1], 32);
    float w[1024];
    assert_int_equal(pcs_st_read_f32(f, t, 0, 1024, w), PCS_OK);
    assert_memory_equal(w, pcs_ref_param(r, "layers.1.linear.weight"), sizeof w);
    t = pcs_st_find(f, "layers.0.norm.num_batches_tracked");
    assert_non_null(t);
    assert_string_equal(t->dtype_str, "I64");
    assert_int_equal(t->ndim, 0);
    int64_t cnt;
    assert_int_equal(pcs_st_read_raw(f, t, 0, 8, &cnt), PCS_OK);
    assert_int_equal(cnt, 2);
    pcs_st_close(f);

    char from[600];
    snprintf(from, sizeof from, ", from: '%s'", path);
    job_free(s);
    s = job(SMALL_JOB, "gelu", "batchnorm", "", 1u, 2u, 4u, 1u, "mse",
            "optimizer: {adamw: {lr: 0.01}}", "regression", from);
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r2), PCS_OK);
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        const char *fqn = pcs_mlp_param(m, p)->fqn;
        assert_memory_equal(pcs_ref_param(r2, fqn), pcs_ref_param(r, fqn),
                            pcs_mlp_param(m, p)->numel * sizeof(float));
    }
    float a[32], b[32];
    assert_int_equal(pcs_ref_buffer(r2, "layers.1.norm.running_var", a), PCS_OK);
    assert_int_equal(pcs_ref_buffer(r, "layers.1.norm.running_var", b), PCS_OK);
    assert_memory_equal(a, b, sizeof a);
    pcs_ref_destroy(r2);

    /* a model with another hidden width does not fit the file */
    s->model->mlp->hidden_dims[1] = 16;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r2), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "layers.1.linear.weight"));
    assert_non_null(strstr(pcs_last_error(), "shape"));
    pcs_ref_destroy(r);
    job_free(s);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_bad_jobs_name_the_field(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(SMALL_JOB, "relu", "none", "", 1u, 2u, 0u, 1u, "mse",
                              "optimizer: {adamw: {lr: 0.01}}", "regression", "");
    pcs_reference_t *r = NULL;
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "training.micro_batch_size"));
    assert_null(r);
    job_free(s);
    s = job(SMALL_JOB, "relu", "none", "", 1u, 2u, 4u, 1u, "mse", "optimizer: {adamw: {lr: 0.01}}",
            "classification", "");
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "data.synthetic.task"));
    job_free(s);
    s = job(SMALL_JOB, "relu", "none", "", 1u, 2u, 4u, 1u, "mse", "optimizer: {adamw: {lr: 0.01}}",
            "regression", ", from: /nonexistent/pretrained.safetensors");
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_ERR_NOT_FOUND);
    assert_non_null(strstr(pcs_last_error(), "init.from"));
    job_free(s);
}

/* The planner's plan (units, dtypes, reductions) drives the reference: for MLPBlock wrapping it
 * must reproduce the built-in unit derivation bit for bit; a LayerNorm fp32 override (norm
 * parameters in fp32 under bf16 blocks, output cast back to bf16) trains too, and without the
 * output cast the bf16 head rejects the fp32 activations as PyTorch does. */
#define PLAN_JOB                                                                                   \
    "name: p\n"                                                                                    \
    "model: {mlp: {input_dim: 8, hidden_dims: [32, 32], output_dim: 4, activation: gelu, "         \
    "norm: layernorm, residual: true}}\n"                                                          \
    "wrap: {module_class: [MLPBlock]}\n"                                                           \
    "precision: {param_dtype: bf16, reduce_dtype: fp32%s}\n"                                       \
    "mesh: [{dim: dp_shard, size: 2}]\n"                                                           \
    "training: {steps: 20, micro_batch_size: 4, micro_batches: 2, loss: mse, "                     \
    "optimizer: {adamw: {lr: 0.01}}}\n"                                                            \
    "data: {synthetic: {task: regression, seed: 3}}\n"                                             \
    "init: {seed: 11}\n"

static void test_planner_plan_drives_the_units(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(PLAN_JOB, "");
    Pcs__V1__Plan *plan = NULL;
    if (pcs_plan_build(s, 2, &plan) != PCS_OK)
        print_error("plan: %s\n", pcs_last_error());
    assert_non_null(plan);
    pcs_reference_t *a, *b;
    assert_int_equal(pcs_ref_create(s, plan, NULL, &a), PCS_OK);
    assert_int_equal(pcs_ref_create(s, NULL, NULL, &b), PCS_OK);
    assert_int_equal(pcs_ref_dp_size(a), 2);
    assert_int_equal(pcs_ref_run(a), PCS_OK);
    assert_int_equal(pcs_ref_run(b), PCS_OK);
    size_t n;
    const double *la = pcs_ref_losses(a, &n), *lb = pcs_ref_losses(b, &n);
    for (size_t i = 0; i < n; i++)
        assert_true(la[i] == lb[i]);
    assert_memory_equal(pcs_ref_param(a, "layers.1.linear.weight"),
                        pcs_ref_param(b, "layers.1.linear.weight"), 32 * 32 * sizeof(float));
    pcs_ref_destroy(a);
    pcs_ref_destroy(b);
    pcs_plan_free(plan);
    job_free(s);

    /* FSDP2 semantics: the fp32 LayerNorm unit casts its input to fp32, so its output (and the
     * residual sum) would be fp32 and PyTorch's bf16 head fails with "mat1 and mat2 must have
     * the same dtype"; output_dtype: bf16 on the override is the documented fix (spec §1.2). */
    s = job(PLAN_JOB, ", overrides: [{match: {module_class: LayerNorm}, param_dtype: fp32, "
                      "output_dtype: bf16}]");
    plan = NULL;
    if (pcs_plan_build(s, 2, &plan) != PCS_OK)
        print_error("plan: %s\n", pcs_last_error());
    assert_non_null(plan);
    assert_int_equal(pcs_ref_create(s, plan, NULL, &a), PCS_OK);
    pcs_status_t rc = pcs_ref_run(a);
    if (rc != PCS_OK)
        print_error("run: %s\n", pcs_last_error());
    assert_int_equal(rc, PCS_OK);
    la = pcs_ref_losses(a, &n);
    assert_int_equal(n, 20);
    for (size_t i = 0; i < n; i++)
        assert_true(isfinite(la[i]));
    assert_true(mean_of(la, 15, 20) < mean_of(la, 0, 5));
    pcs_ref_destroy(a);
    pcs_plan_free(plan);
    job_free(s);

    /* Without output_dtype the planner applies pcs's rule (docs/PLAN.md, precision 9): the fp32
     * norm unit inside a bf16 block casts its outputs back to bf16, so the run gives exactly
     * the losses of the explicit output_dtype: bf16 override above. */
    double explicit_losses[20];
    {
        Pcs__V1__JobSpec *se = job(PLAN_JOB, ", overrides: [{match: {module_class: LayerNorm}, "
                                             "param_dtype: fp32, output_dtype: bf16}]");
        Pcs__V1__Plan *pe = NULL;
        assert_int_equal(pcs_plan_build(se, 2, &pe), PCS_OK);
        assert_int_equal(pcs_ref_create(se, pe, NULL, &a), PCS_OK);
        assert_int_equal(pcs_ref_run(a), PCS_OK);
        la = pcs_ref_losses(a, &n);
        assert_int_equal(n, 20);
        memcpy(explicit_losses, la, sizeof explicit_losses);
        pcs_ref_destroy(a);
        pcs_plan_free(pe);
        job_free(se);
    }
    s = job(PLAN_JOB, ", overrides: [{match: {module_class: LayerNorm}, param_dtype: fp32}]");
    plan = NULL;
    assert_int_equal(pcs_plan_build(s, 2, &plan), PCS_OK);
    assert_int_equal(pcs_ref_create(s, plan, NULL, &a), PCS_OK);
    assert_int_equal(pcs_ref_run(a), PCS_OK);
    la = pcs_ref_losses(a, &n);
    assert_int_equal(n, 20);
    for (size_t i = 0; i < n; i++)
        assert_true(la[i] == explicit_losses[i]);
    pcs_ref_destroy(a);
    pcs_plan_free(plan);
    job_free(s);
}

/* FSDP1 full-precision eval: before any step the masters of a bf16 job equal those of an fp32
 * job (same seed), so its full-precision eval equals the fp32 job's eval exactly, while the
 * ordinary bf16 eval differs by rounding. */
static void test_full_precision_eval_uses_fp32_masters(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *sb =
        job(SMALL_JOB, "gelu", "layernorm", "param_dtype: bf16", 1u, 2u, 4u, 1u, "mse",
            "optimizer: {adamw: {lr: 0.01}}, full_precision_eval: true", "regression", "");
    Pcs__V1__JobSpec *sl = job(SMALL_JOB, "gelu", "layernorm", "param_dtype: bf16", 1u, 2u, 4u, 1u,
                               "mse", "optimizer: {adamw: {lr: 0.01}}", "regression", "");
    Pcs__V1__JobSpec *sf = job(SMALL_JOB, "gelu", "layernorm", "", 1u, 2u, 4u, 1u, "mse",
                               "optimizer: {adamw: {lr: 0.01}}", "regression", "");
    pcs_reference_t *b, *l, *f;
    assert_int_equal(pcs_ref_create(sb, NULL, NULL, &b), PCS_OK);
    assert_int_equal(pcs_ref_create(sl, NULL, NULL, &l), PCS_OK);
    assert_int_equal(pcs_ref_create(sf, NULL, NULL, &f), PCS_OK);
    double eb, el, ef;
    assert_int_equal(pcs_ref_eval(b, &eb), PCS_OK);
    assert_int_equal(pcs_ref_eval(l, &el), PCS_OK);
    assert_int_equal(pcs_ref_eval(f, &ef), PCS_OK);
    assert_true(eb == ef);
    assert_true(el != ef);
    assert_true(fabs(el - ef) < 2e-2 * ef);
    /* training afterwards still runs in bf16: identical to the job without the flag */
    pcs_ref_step_result_t rb, rl;
    assert_int_equal(pcs_ref_step(b, &rb), PCS_OK);
    assert_int_equal(pcs_ref_step(l, &rl), PCS_OK);
    assert_true(rb.loss == rl.loss);
    pcs_ref_destroy(b);
    pcs_ref_destroy(l);
    pcs_ref_destroy(f);
    job_free(sb);
    job_free(sl);
    job_free(sf);
}

/* pcs_mlp_bind_unit: parameters bound as views into each unit's flat buffer at the plan's
 * offsets (the sharded runtime's path) compute exactly what per-parameter buffers compute. */
static void test_bind_unit_views_match_per_param_binding(void **state)
{
    (void)state;
    Pcs__V1__JobSpec *s = job(PLAN_JOB, "");
    Pcs__V1__Plan *plan = NULL;
    assert_int_equal(pcs_plan_build(s, 2, &plan), PCS_OK);
    pcs_mlp_config_t cfg;
    assert_int_equal(pcs_mlp_config_from_proto(s->model->mlp, &cfg), PCS_OK);
    pcs_mlp_t *a, *b;
    assert_int_equal(pcs_mlp_create(&cfg, 4, &a), PCS_OK);
    assert_int_equal(pcs_mlp_create(&cfg, 4, &b), PCS_OK);
    void *flat[16] = {0}, *gflat[16] = {0};
    uint32_t np = pcs_mlp_num_params(a);
    uint16_t *pp[16] = {0}, *pg[16] = {0};
    assert_true(plan->n_units <= 16 && np <= 16);
    for (size_t k = 0; k < plan->n_units; k++) {
        const Pcs__V1__Unit *u = plan->units[k];
        pcs_dtype_t dt = (pcs_dtype_t)u->param_dtype;
        assert_int_equal(dt, PCS_DTYPE_BF16);
        flat[k] = calloc(u->padded_numel, 2);
        gflat[k] = calloc(u->padded_numel, 2);
        for (size_t j = 0; j < u->n_params; j++) {
            int p = pcs_mlp_find_param(a, u->params[j]->fqn);
            assert_true(p >= 0);
            uint64_t n = pcs_mlp_param(a, (uint32_t)p)->numel;
            float *v = calloc(n, sizeof(float));
            assert_int_equal(pcs_mlp_init_tensor(a, 3, 0, (uint32_t)p, 0, n, v), PCS_OK);
            pcs_from_f32(v, n, dt, (uint16_t *)flat[k] + u->params[j]->offset);
            pp[p] = calloc(n, 2);
            pg[p] = calloc(n, 2);
            pcs_from_f32(v, n, dt, pp[p]);
            assert_int_equal(pcs_mlp_bind_param(b, (uint32_t)p, dt, pp[p]), PCS_OK);
            assert_int_equal(pcs_mlp_bind_grad(b, (uint32_t)p, dt, pg[p]), PCS_OK);
            free(v);
        }
        assert_int_equal(pcs_mlp_bind_unit(a, u, dt, flat[k], dt, gflat[k], u->padded_numel),
                         PCS_OK);
        int mod = pcs_mlp_find_module(b, u->path);
        assert_true(mod >= 0);
        assert_int_equal(pcs_mlp_set_cast(b, (uint32_t)mod, PCS_DTYPE_BF16, PCS_DTYPE_NONE),
                         PCS_OK);
    }
    assert_int_equal(pcs_mlp_apply_plan_casts(a, plan), PCS_OK);
    float x[32], d[16];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i % 7) * 0.25f - 0.7f;
    for (int i = 0; i < 16; i++)
        d[i] = (float)(i % 5) * 0.1f - 0.2f;
    const float *oa, *ob;
    pcs_dtype_t ta, tb;
    assert_int_equal(pcs_mlp_forward(a, x, PCS_DTYPE_FP32, 4, 1, NULL, &oa, &ta), PCS_OK);
    assert_int_equal(pcs_mlp_forward(b, x, PCS_DTYPE_FP32, 4, 1, NULL, &ob, &tb), PCS_OK);
    assert_int_equal(ta, PCS_DTYPE_BF16);
    assert_memory_equal(oa, ob, 16 * sizeof(float));
    assert_int_equal(pcs_mlp_backward(a, d, NULL), PCS_OK);
    assert_int_equal(pcs_mlp_backward(b, d, NULL), PCS_OK);
    for (size_t k = 0; k < plan->n_units; k++) {
        const Pcs__V1__Unit *u = plan->units[k];
        for (size_t j = 0; j < u->n_params; j++) {
            int p = pcs_mlp_find_param(a, u->params[j]->fqn);
            assert_memory_equal((uint16_t *)gflat[k] + u->params[j]->offset, pg[p],
                                pcs_mlp_param(a, (uint32_t)p)->numel * 2);
        }
    }
    /* a buffer shorter than the layout is refused, naming the parameter */
    const Pcs__V1__Unit *u0 = plan->units[plan->n_units - 1];
    assert_int_equal(pcs_mlp_bind_unit(a, u0, PCS_DTYPE_BF16, flat[0], PCS_DTYPE_BF16, NULL, 8),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), u0->params[0]->fqn));
    for (size_t k = 0; k < 16; k++) {
        free(flat[k]);
        free(gflat[k]);
        free(pp[k]);
        free(pg[k]);
    }
    pcs_mlp_destroy(a);
    pcs_mlp_destroy(b);
    pcs_plan_free(plan);
    job_free(s);
}

static int all_in_dtype(const float *v, uint64_t n, pcs_dtype_t dt)
{
    float *c = malloc(n * sizeof(float));
    memcpy(c, v, n * sizeof(float));
    pcs_round_to(c, n, dt);
    int same = memcmp(c, v, n * sizeof(float)) == 0;
    free(c);
    return same;
}

/* Spec §9 dtype invariants seen at the optimizer: keep_low_precision_grads hands fp16 grads
 * (case 14); reduce_dtype bf16 under fp32 params reduces in bf16 (case 16: every reduced grad is
 * bf16-representable although params are fp32); pure fp16 keeps fp16 masters (case 27); the
 * default (bf16 compute, fp32 reduce) gives fp32 grads that are not all bf16 values. */
static void test_grad_and_master_dtypes_follow_the_policy(void **state)
{
    (void)state;
    struct {
        const char *prec;
        pcs_dtype_t grad_in, master_in;
        int grad_expect, master_expect;
    } cases[] = {
        {"param_dtype: fp16, keep_low_precision_grads: true", PCS_DTYPE_FP16, PCS_DTYPE_FP16, 1, 0},
        {"reduce_dtype: bf16", PCS_DTYPE_BF16, PCS_DTYPE_BF16, 1, 0},
        {"master_dtype: fp16", PCS_DTYPE_FP16, PCS_DTYPE_FP16, 1, 1},
        {"param_dtype: bf16, reduce_dtype: fp32", PCS_DTYPE_BF16, PCS_DTYPE_BF16, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Pcs__V1__JobSpec *s = job(SMALL_JOB, "relu", "none", cases[c].prec, 2u, 2u, 4u, 2u, "mse",
                                  "optimizer: {sgd: {lr: 0.01, momentum: 0.0}}", "regression", "");
        pcs_reference_t *r;
        assert_int_equal(pcs_ref_create(s, NULL, NULL, &r), PCS_OK);
        pcs_status_t rc = pcs_ref_run(r);
        if (rc != PCS_OK)
            print_error("case '%s': %s\n", cases[c].prec, pcs_last_error());
        assert_int_equal(rc, PCS_OK);
        const float *g = pcs_ref_grad(r, "layers.0.linear.weight");
        const float *p = pcs_ref_param(r, "layers.0.linear.weight");
        int gi = all_in_dtype(g, 256, cases[c].grad_in);
        int pi = all_in_dtype(p, 256, cases[c].master_in);
        if (gi != cases[c].grad_expect || pi != cases[c].master_expect)
            print_error("case '%s': grads in %s: %d, masters in %s: %d\n", cases[c].prec,
                        pcs_dtype_name(cases[c].grad_in), gi, pcs_dtype_name(cases[c].master_in),
                        pi);
        assert_int_equal(gi, cases[c].grad_expect);
        assert_int_equal(pi, cases[c].master_expect);
        /* the planner's units give the same run (pure fp16 is fed in fp16 either way:
         * pcs_mlp_feed_dtype) */
        Pcs__V1__Plan *plan = NULL;
        assert_int_equal(pcs_plan_build(s, 2, &plan), PCS_OK);
        pcs_reference_t *rp;
        assert_int_equal(pcs_ref_create(s, plan, NULL, &rp), PCS_OK);
        rc = pcs_ref_run(rp);
        if (rc != PCS_OK)
            print_error("case '%s' with plan: %s\n", cases[c].prec, pcs_last_error());
        assert_int_equal(rc, PCS_OK);
        size_t n1, n2;
        const double *l1 = pcs_ref_losses(r, &n1), *l2 = pcs_ref_losses(rp, &n2);
        assert_int_equal(n1, n2);
        for (size_t i = 0; i < n1; i++)
            if (l1[i] != l2[i]) {
                print_error("case '%s': step %zu loss %.9g (built-in units) vs %.9g (plan)\n",
                            cases[c].prec, i, l1[i], l2[i]);
                fail();
            }
        pcs_ref_destroy(rp);
        pcs_plan_free(plan);
        pcs_ref_destroy(r);
        job_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_adamw_loss_decreases),
        cmocka_unit_test(test_bf16_fp32_reduce_loss_decreases),
        cmocka_unit_test(test_bf16_sgd_momentum_loss_decreases),
        cmocka_unit_test(test_classification_cross_entropy_loss_decreases),
        cmocka_unit_test(test_dp_emulation_matches_global_batch_fp32),
        cmocka_unit_test(test_world_of_one_custom_divide_factor_quarters_the_step),
        cmocka_unit_test(test_dp_emulation_bf16_within_bf16_tolerance),
        cmocka_unit_test(test_grad_scaler_skips_step_on_injected_inf),
        cmocka_unit_test(test_batchnorm_running_stats_tracked_per_rank),
        cmocka_unit_test(test_export_then_init_from_file_round_trips),
        cmocka_unit_test(test_bad_jobs_name_the_field),
        cmocka_unit_test(test_planner_plan_drives_the_units),
        cmocka_unit_test(test_full_precision_eval_uses_fp32_masters),
        cmocka_unit_test(test_bind_unit_views_match_per_param_binding),
        cmocka_unit_test(test_grad_and_master_dtypes_follow_the_policy),
    };
    return cmocka_run_group_tests_name("reference", tests, NULL, NULL);
}
