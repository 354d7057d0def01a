/* Pipeline parallelism runs (issue 14; seed test_composability.py; spec fsdp-semantics.md §7):
 * real pcs_train rank processes (forked, file KV store) run the plan's schedule action lists.
 *  - Every schedule (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) x {FSDP fp32,
 *    FSDP bf16 params / fp32 reduce, DDP fp32} x {W = 2: pp 2, W = 4: dp 2 x pp 2}, 8 micro-batches
 *    (the seed's): the exported parameters hold exactly the bits of the same job without stages
 *    (pp = 1 over the same data-parallel ranks: the stages compute what the whole model computes,
 *    an activation crosses a boundary in its own dtype; LoopedBFS accumulates its micro-batches
 *    in reverse, as PyTorch's does: tolerances only), and match the single-process reference
 *    at the seed's tolerances (FSDP atol 5e-5 rtol 2e-2; DDP fp32: torch's defaults 1e-5 /
 *    1.3e-6). reshard_after_forward true adds UNSHARD/RESHARD around every action (1F1B).
 *    Each step ends with every unit resharded (the worker checks it after its action list, the
 *    seed's test_pp_fsdp_unshard_reshard_runtime) and the runtime within the plan's memory
 *    estimate for pipelined ranks.
 *  - Clipping by the global norm across stages, eval through the stages, loss reports: equal to
 *    the pp = 1 job's.
 *  - A pipelined checkpoint resumes bit-identically, at the same pp and onto pp = 1.
 * What a schedule cannot run (micro-batch counts, virtual stages) is refused at plan time
 * (tests/unit/test_plan.c, test_schedule.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/v1/job.pb-c.h"
#include "planner/plan.h"
#include "test_e2e_util.h"
#include "test_util.h"

#define SUCCEEDED PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED

typedef struct pp_job {
    const char *schedule; /* NULL: no pipeline (pp = 1) */
    int v;                /* virtual stages */
    const char *strategy, *precision, *raf;
    int dp, steps, eval_every, ckpt_every;
    double clip;
    const char *resume_from;
    int resume_step;
    const char *extra; /* more top-level keys */
} pp_job_t;

static char *job_yaml(const pp_job_t *j)
{
    char *y = malloc(4096);
    assert_non_null(y);
    char mesh[256], pipe[128] = "", resume[1400] = "", ckpt[128] = "";
    const char *dpdim = strcmp(j->strategy, "no_shard") == 0 ? "dp_replicate" : "dp_shard";
    if (j->schedule)
        snprintf(mesh, sizeof mesh, "[{dim: %s, size: %d}, {dim: pp, size: 2}]", dpdim, j->dp);
    else
        snprintf(mesh, sizeof mesh, "[{dim: %s, size: %d}]", dpdim, j->dp);
    if (j->schedule)
        snprintf(pipe, sizeof pipe, "pipeline: {schedule: %s, virtual_stages: %d}\n", j->schedule,
                 j->v);
    if (j->resume_from)
        snprintf(resume, sizeof resume, "resume: {from: '%s', step: %d}\n", j->resume_from,
                 j->resume_step);
    if (j->ckpt_every)
        snprintf(ckpt, sizeof ckpt, "checkpoint: {dir: ckpt, every_steps: %d, keep_last: 4}\n",
                 j->ckpt_every);
    snprintf(y, 4096,
             "name: pipeline\n"
             "model:\n"
             "  mlp: {input_dim: 16, hidden_dims: [32, 32, 32, 32], output_dim: 8,"
             " activation: gelu, norm: layernorm, residual: true}\n"
             "wrap: {module_class: [MLPBlock]}\n"
             "precision: {%s}\n"
             "strategy: %s\n"
             "reshard_after_forward: %s\n"
             "mesh: %s\n"
             "%s"
             "training: {steps: %d, micro_batch_size: 2, micro_batches: 8,"
             " optimizer: {adamw: {lr: 1.0e-2}}, clip_grad_norm: %g, loss: mse,"
             " eval_every: %d}\n"
             "data: {synthetic: {task: regression, seed: 7}}\n"
             "init: {seed: 13}\n"
             "%s%s%s",
             j->precision, j->strategy, j->raf ? j->raf : "false", mesh, pipe,
             j->steps ? j->steps : 3, j->clip, j->eval_every, ckpt, resume,
             j->extra ? j->extra : "");
    return y;
}

static int world_of(const pp_job_t *j)
{
    return j->schedule ? 2 * j->dp : j->dp;
}

/* Run j (must succeed); *dir_out keeps its directory (rmtree + free by the caller). */
static void run(const pp_job_t *j, const char *tag, e2e_job_t *job, char **dir_out)
{
    char *y = job_yaml(j);
    assert_int_equal(e2e_run_local(y, tag, world_of(j), 0, 0, job, dir_out), 0);
    if (job->state != SUCCEEDED)
        fail_msg("%s %s %s dp %d: %s (logs in %s)", j->schedule ? j->schedule : "no pipeline",
                 j->strategy, j->precision, j->dp, job->reason, *dir_out);
    free(y);
}

static void done(e2e_job_t *job, char *dir)
{
    e2e_job_free(job);
    if (!getenv("PCS_TEST_KEEP"))
        pcs_test_rmtree(dir);
    free(dir);
}

/* bits: the schedule runs each stage's backwards in micro-batch order, so the accumulated
 * gradients add up in the order they do without stages; LoopedBFS runs them last micro-batch
 * first (as torch's ScheduleLoopedBFS), a different fp32 summation order: reference tolerances
 * only */
static const struct {
    const char *name;
    int v, bits;
} k_sched[] = {{"gpipe", 1, 1},
               {"1f1b", 1, 1},
               {"interleaved_1f1b", 2, 1},
               {"looped_bfs", 2, 0},
               {"interleaved_zero_bubble", 2, 1}};

static const struct {
    const char *strategy, *precision;
    double atol, rtol, loss_rtol;
} k_comp[] = {
    /* the seed's FSDP tolerances; DDP at torch.testing's fp32 defaults */
    {"full_shard", "param_dtype: fp32", 5e-5, 2e-2, 1e-5},
    {"full_shard", "param_dtype: bf16, reduce_dtype: fp32", 5e-5, 2e-2, 1.6e-2},
    {"no_shard", "param_dtype: fp32", 1e-5, 1.3e-6, 1e-5},
};

static void test_every_schedule_and_composition_matches_pp1_and_reference(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof k_comp / sizeof k_comp[0]; c++)
        for (int dp = 1; dp <= 2; dp++) {
            pp_job_t base = {.strategy = k_comp[c].strategy, .precision = k_comp[c].precision,
                             .dp = dp, .ckpt_every = 3};
            e2e_job_t ref;
            char *ref_dir = NULL;
            run(&base, "pp1", &ref, &ref_dir);
            for (size_t s = 0; s < sizeof k_sched / sizeof k_sched[0]; s++) {
                pp_job_t j = base;
                j.schedule = k_sched[s].name;
                j.v = k_sched[s].v;
                e2e_job_t job;
                char *dir = NULL;
                run(&j, "pp", &job, &dir);
                char *y = job_yaml(&j);
                double max_abs = 0;
                int fails = e2e_check_parity(&job, y, k_comp[c].atol, k_comp[c].rtol,
                                             k_comp[c].loss_rtol, &max_abs);
                fails += e2e_check_memory_promise(&job, y, 0.5);
                free(y);
                fprintf(stderr, "%-24s %-10s %-38s W=%d: max |d| vs reference %.3g, %.1f s\n",
                        j.schedule, j.strategy, j.precision, world_of(&j), max_abs, job.wall_s);
                assert_int_equal(fails, 0);
                /* the stages compute exactly what the whole model computes */
                if (k_sched[s].bits)
                    e2e_assert_same_bits(ref.export_path, job.export_path, j.schedule);
                /* and report the same loss: the last stage's, carried to every stage as fp32
                 * (as it crosses the dp group in every job) */
                for (size_t i = 0; i < ref.n_reports[0]; i++) {
                    double a = ref.reports[0][i]->loss, b = job.reports[0][i]->loss;
                    if (!(fabs(a - b) <= 1e-6 * fabs(a)))
                        fail_msg("%s step %zu: loss %.9g without stages, %.9g with", j.schedule,
                                 i + 1, a, b);
                }
                done(&job, dir);
            }
            done(&ref, ref_dir);
        }
}

/* reshard_after_forward true: FSDP unshards each stage around every compute action (the
 * schedule's per-micro-batch UNSHARD / RESHARD); same bits as without stages. */
static void test_reshard_after_forward_unshards_around_every_action(void **state)
{
    (void)state;
    pp_job_t base = {.strategy = "full_shard",
                     .precision = "param_dtype: bf16, reduce_dtype: fp32",
                     .raf = "true",
                     .dp = 2,
                     .ckpt_every = 3};
    e2e_job_t ref, job, once;
    char *ref_dir = NULL, *dir = NULL, *once_dir = NULL;
    run(&base, "pp1-raf", &ref, &ref_dir);
    for (size_t s = 0; s < 2; s++) { /* 1f1b and interleaved_1f1b */
        pp_job_t j = base;
        j.schedule = s ? "interleaved_1f1b" : "1f1b";
        j.v = s ? 2 : 1;
        run(&j, "pp-raf", &job, &dir);
        char *y = job_yaml(&j);
        assert_int_equal(e2e_check_memory_promise(&job, y, 0.5), 0);
        free(y);
        e2e_assert_same_bits(ref.export_path, job.export_path, j.schedule);
        /* every micro-batch's forward and backward gathers its stage again: 8 micro-batches x
         * (F + B) = 16 times the bytes of the same schedule gathering once per step */
        pp_job_t o = j;
        o.raf = "false";
        run(&o, "pp-once", &once, &once_dir);
        uint64_t ag = job.reports[0][0]->all_gather_bytes;
        uint64_t ag1 = once.reports[0][0]->all_gather_bytes;
        fprintf(stderr, "%s: %llu all-gather bytes per step on rank 0 resharding after forward, "
                        "%llu once per step\n",
                j.schedule, (unsigned long long)ag, (unsigned long long)ag1);
        assert_true(ag1 > 0);
        assert_int_equal(ag, 16 * ag1);
        /* as the plan's traffic estimate says: it counts what rank 0 receives, (g - 1) / g of
         * the bytes a report counts (nccl-tests' S), g = 2 */
        for (int k = 0; k < 2; k++) {
            char *yk = job_yaml(k ? &o : &j);
            Pcs__V1__JobSpec *spec = e2e_parse_spec(yk);
            Pcs__V1__Plan *plan = NULL;
            assert_int_equal(pcs_plan_build(spec, 4, &plan), PCS_OK);
            Pcs__V1__RankEstimate e;
            assert_int_equal(pcs_plan_rank_estimate(plan, 0, &e), PCS_OK);
            assert_int_equal(2 * e.all_gather_bytes, k ? ag1 : ag);
            pcs_plan_free(plan);
            protobuf_c_message_free_unpacked(&spec->base, NULL);
            free(yk);
        }
        done(&once, once_dir);
        done(&job, dir);
    }
    done(&ref, ref_dir);
}

/* Clipping by the global norm (every stage's gradients: torch clip_grad_norm_ over the model),
 * eval through the stages every step: the same norms, losses and eval losses as without stages,
 * parameters within fp32 summation-order noise (the norm's per-stage partial sums). */
static void test_clipping_and_eval_span_the_stages(void **state)
{
    (void)state;
    pp_job_t base = {.strategy = "full_shard",
                     .precision = "param_dtype: bf16, reduce_dtype: fp32",
                     .dp = 2,
                     .steps = 4,
                     .clip = 0.05,
                     .eval_every = 1,
                     .ckpt_every = 4};
    e2e_job_t ref, job;
    char *ref_dir = NULL, *dir = NULL;
    run(&base, "pp1-clip", &ref, &ref_dir);
    pp_job_t j = base;
    j.schedule = "interleaved_1f1b";
    j.v = 2;
    run(&j, "pp-clip", &job, &dir);
    int clipped = 0;
    for (int r = 0; r < 4; r++)
        assert_int_equal(job.n_reports[r], ref.n_reports[0]);
    for (size_t i = 0; i < ref.n_reports[0]; i++) {
        const Pcs__V1__StepReport *a = ref.reports[0][i], *b = job.reports[0][i];
        fprintf(stderr, "step %llu: grad norm %.9g / %.9g, loss %.9g / %.9g, eval %.9g / %.9g\n",
                (unsigned long long)a->step, a->grad_norm, b->grad_norm, a->loss, b->loss,
                a->eval_loss, b->eval_loss);
        assert_true(fabs(a->grad_norm - b->grad_norm) <= 1e-6 * a->grad_norm);
        assert_true(fabs(a->loss - b->loss) <= 1e-6 * fabs(a->loss));
        assert_true(a->eval_loss > 0);
        assert_true(fabs(a->eval_loss - b->eval_loss) <= 1e-6 * fabs(a->eval_loss));
        clipped += a->grad_norm > 0.05;
        /* every rank reports the same step (the loss reaches the first stage too) */
        for (int r = 1; r < 4; r++)
            assert_true(job.reports[r][i]->loss == b->loss);
    }
    assert_true(clipped > 0); /* the norm did clip */
    char *y = job_yaml(&j);
    double max_abs = 0;
    assert_int_equal(e2e_check_parity(&job, y, 5e-5, 2e-2, 1.6e-2, &max_abs), 0);
    free(y);
    done(&job, dir);
    done(&ref, ref_dir);
}

/* A pipelined job's checkpoint (each stage's ranks write their units) resumes: at the same pp,
 * bit-identical to the uninterrupted run; onto pp = 1 (the same dp ranks), bit-identical to the
 * uninterrupted run too (the stages computed the whole model's bits). */
static void test_a_pipelined_checkpoint_resumes_at_any_pp(void **state)
{
    (void)state;
    pp_job_t j = {.schedule = "1f1b",
                  .v = 1,
                  .strategy = "full_shard",
                  .precision = "param_dtype: bf16, reduce_dtype: fp32",
                  .dp = 2,
                  .steps = 6,
                  .ckpt_every = 3};
    e2e_job_t full, half, flat;
    char *full_dir = NULL, *half_dir = NULL, *flat_dir = NULL;
    run(&j, "pp-full", &full, &full_dir);
    char from[1200];
    snprintf(from, sizeof from, "%s/ckpt/local", full_dir);
    pp_job_t r = j;
    r.resume_from = from;
    r.resume_step = 3;
    run(&r, "pp-half", &half, &half_dir);
    assert_int_equal(half.reports[0][0]->step, 4);
    e2e_assert_same_bits(full.export_path, half.export_path, "resumed at pp 2");
    pp_job_t f = r;
    f.schedule = NULL; /* the same 2 data-parallel ranks, no stages */
    run(&f, "pp-flat", &flat, &flat_dir);
    assert_int_equal(flat.reports[0][0]->step, 4);
    e2e_assert_same_bits(full.export_path, flat.export_path, "resumed at pp 1");
    done(&flat, flat_dir);
    done(&half, half_dir);
    done(&full, full_dir);
}

/* HSDP (dp_replicate 2 x dp_shard 2) x pp 2, interleaved, fp16 with the grad scaler, clipping
 * and full-precision eval every step: the stages' replicate all-reduces, the scaler's verdict
 * over the world, the estimate kept; within the mixed-precision tolerance of the reference. */
/* FSDP2's per-parameter layout under pipeline stages (1F1B, bf16 / fp32 reduce, dp 2, resharding
 * around every action): the stages' units copy out and in per piece; the same bits as the flat
 * layout without stages (sums of two), and the reference. */
static void test_per_param_layout_under_stages(void **state)
{
    (void)state;
    pp_job_t flat = {.strategy = "full_shard", .precision = "param_dtype: bf16, reduce_dtype: fp32",
                     .raf = "true", .dp = 2};
    e2e_job_t ref, job;
    char *ref_dir = NULL, *dir = NULL;
    run(&flat, "pp-flat", &ref, &ref_dir);
    pp_job_t j = flat;
    j.schedule = "1f1b";
    j.v = 1;
    j.extra = "shard_layout: per_param\n";
    run(&j, "pp-per-param", &job, &dir);
    char *y = job_yaml(&j);
    double max_abs = 0;
    int fails = e2e_check_parity(&job, y, 5e-5, 2e-2, 1.6e-2, &max_abs);
    fails += e2e_check_memory_promise(&job, y, 0.5);
    Pcs__V1__JobSpec *spec = e2e_parse_spec(y);
    Pcs__V1__Plan *plan = NULL;
    assert_int_equal(pcs_plan_build(spec, (uint32_t)world_of(&j), &plan), PCS_OK);
    assert_int_equal(plan->units[1]->layout, PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM);
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    free(y);
    assert_int_equal(fails, 0);
    e2e_assert_same_bits(ref.export_path, job.export_path, "per_param under 1f1b");
    done(&job, dir);
    done(&ref, ref_dir);
}

static void test_hsdp_fp16_scaler_full_precision_eval(void **state)
{
    (void)state;
    const char *y = "name: hsdp-pp\n"
                    "model:\n"
                    "  mlp: {input_dim: 16, hidden_dims: [32, 32, 32, 32], output_dim: 8,"
                    " activation: gelu, norm: layernorm, residual: true}\n"
                    "wrap: {module_class: [MLPBlock]}\n"
                    "strategy: hybrid_shard\n"
                    "precision: {param_dtype: fp16, reduce_dtype: fp32}\n"
                    "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 2},"
                    " {dim: pp, size: 2}]\n"
                    "pipeline: {schedule: interleaved_1f1b, virtual_stages: 2}\n"
                    "training: {steps: 3, micro_batch_size: 2, micro_batches: 4,"
                    " optimizer: {adamw: {lr: 1.0e-3}}, clip_grad_norm: 0.5,"
                    " grad_scaler: {enabled: true}, loss: mse, eval_every: 1,"
                    " full_precision_eval: true}\n"
                    "data: {synthetic: {task: regression, seed: 7}}\n"
                    "init: {seed: 13}\n"
                    "checkpoint: {dir: ckpt}\n";
    e2e_job_t job;
    char *dir = NULL;
    assert_int_equal(e2e_run_local(y, "pp-hsdp", 8, 0, 0, &job, &dir), 0);
    if (job.state != SUCCEEDED)
        fail_msg("%s (logs in %s)", job.reason, dir);
    double max_abs = 0;
    int fails = e2e_check_parity(&job, y, 1e-4, 1e-3, 1.6e-2, &max_abs);
    fails += e2e_check_memory_promise(&job, y, 0.5);
    for (int r = 0; r < 8; r++)
        assert_true(job.reports[r][0]->eval_loss > 0);
    assert_int_equal(fails, 0);
    done(&job, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_schedule_and_composition_matches_pp1_and_reference),
        cmocka_unit_test(test_reshard_after_forward_unshards_around_every_action),
        cmocka_unit_test(test_clipping_and_eval_span_the_stages),
        cmocka_unit_test(test_a_pipelined_checkpoint_resumes_at_any_pp),
        cmocka_unit_test(test_hsdp_fp16_scaler_full_precision_eval),
        cmocka_unit_test(test_per_param_layout_under_stages),
    };
    if (getenv("PCS_TEST_FILTER")) /* e.g. "*per_param*": the matching tests only */
        cmocka_set_test_filter(getenv("PCS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
