/* Unit tests of the YAML/JSON <-> protobuf-c codec (common/pb_yaml.c, common/pb_json.c): the
 * shipped example job files parse into the values they spell, the shorthands of pbtext.h work,
 * errors carry the line and field path, and YAML -> message -> JSON -> message is byte-exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/pbtext.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "test_util.h"

typedef Pcs__V1__JobSpec job_t;

static job_t *parse_ok(const char *yaml)
{
    ProtobufCMessage *m = NULL;
    pcs_status_t rc = pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &m);
    if (rc != PCS_OK)
        fail_msg("parse failed: %s", pcs_last_error());
    assert_non_null(m);
    return (job_t *)m;
}

/* Parse must fail; the error must contain `want` (line and path). */
static void parse_err(const char *yaml, const char *want)
{
    ProtobufCMessage *m = (ProtobufCMessage *)0x1;
    pcs_status_t rc = pcs_pb_from_yaml(yaml, strlen(yaml), &pcs__v1__job_spec__descriptor, &m);
    assert_int_equal(rc, PCS_ERR_INVALID_ARG);
    assert_null(m);
    if (!strstr(pcs_last_error(), want))
        fail_msg("error '%s' does not contain '%s'", pcs_last_error(), want);
}

static job_t *parse_file(const char *rel)
{
    char buf[1024];
    ProtobufCMessage *m = NULL;
    pcs_status_t rc = pcs_pb_from_yaml_file(pcs_test_src(rel, buf, sizeof buf),
                                            &pcs__v1__job_spec__descriptor, &m);
    if (rc != PCS_OK)
        fail_msg("%s: %s", rel, pcs_last_error());
    return (job_t *)m;
}

static void free_job(job_t *j)
{
    protobuf_c_message_free_unpacked(&j->base, NULL);
}

// ---- the example files ------------------------------------------------------------------------

static void test_demo_job_parses_into_expected_values(void **state)
{
    (void)state;
    job_t *j = parse_file("examples/demo-job.yaml");
    assert_string_equal(j->name, "mlp-demo");
    assert_int_equal(j->model->kind_case, PCS__V1__MODEL_SPEC__KIND_MLP);
    Pcs__V1__MlpModel *mlp = j->model->mlp;
    assert_int_equal(mlp->input_dim, 256);
    assert_int_equal(mlp->n_hidden_dims, 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(mlp->hidden_dims[i], 1024);
    assert_int_equal(mlp->output_dim, 16);
    assert_int_equal(mlp->activation, PCS__V1__ACTIVATION__ACTIVATION_GELU);
    assert_int_equal(mlp->norm, PCS__V1__NORM__NORM_LAYERNORM);
    assert_non_null(mlp->bias);
    assert_true(mlp->bias->value);
    assert_true(mlp->residual);

    assert_int_equal(j->wrap->policy_case, PCS__V1__WRAP_SPEC__POLICY_MODULE_CLASS);
    assert_int_equal(j->wrap->module_class->n_classes, 1);
    assert_string_equal(j->wrap->module_class->classes[0], "MLPBlock");
    assert_int_equal(j->wrap->n_ignored_module_classes, 1);
    assert_string_equal(j->wrap->ignored_module_classes[0], "BatchNorm1d");

    Pcs__V1__PrecisionSpec *p = j->precision;
    assert_int_equal(p->param_dtype, PCS__V1__DTYPE__DTYPE_BF16);
    assert_int_equal(p->reduce_dtype, PCS__V1__DTYPE__DTYPE_FP32);
    assert_int_equal(p->buffer_dtype, PCS__V1__DTYPE__DTYPE_FP32);
    assert_int_equal(p->output_dtype, PCS__V1__DTYPE__DTYPE_UNSPECIFIED);
    assert_non_null(p->cast_forward_inputs);
    assert_true(p->cast_forward_inputs->value);
    assert_non_null(p->keep_low_precision_grads); /* given as false: present, value false */
    assert_false(p->keep_low_precision_grads->value);
    assert_int_equal(p->n_overrides, 1);
    assert_string_equal(p->overrides[0]->match->module_class, "LayerNorm");
    assert_string_equal(p->overrides[0]->match->path, "");
    assert_int_equal(p->overrides[0]->param_dtype, PCS__V1__DTYPE__DTYPE_FP32);

    assert_int_equal(j->strategy, PCS__V1__STRATEGY__STRATEGY_FULL_SHARD);
    assert_null(j->reshard_after_forward); /* `default` leaves it unset */
    assert_int_equal(j->n_mesh, 1);
    assert_int_equal(j->mesh[0]->dim, PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD);
    assert_int_equal(j->mesh[0]->size, 4);

    Pcs__V1__TrainingSpec *t = j->training;
    assert_int_equal(t->steps, 40);
    assert_int_equal(t->micro_batch_size, 32);
    assert_int_equal(t->micro_batches, 4);
    assert_int_equal(t->optimizer->kind_case, PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW);
    Pcs__V1__AdamWOptimizer *a = t->optimizer->adamw;
    assert_true(a->lr == 1.0e-3);
    assert_int_equal(a->n_betas, 2);
    assert_true(a->betas[0] == 0.9 && a->betas[1] == 0.999);
    assert_true(a->eps->value == 1.0e-8);
    assert_true(a->weight_decay->value == 0.01);
    assert_true(t->clip_grad_norm == 1.0);
    assert_non_null(t->grad_scaler);
    assert_false(t->grad_scaler->enabled);
    assert_null(t->grad_scaler->init_scale);
    assert_int_equal(t->loss, PCS__V1__LOSS__LOSS_MSE);
    assert_int_equal(t->eval_every, 10);

    assert_int_equal(j->data->source_case, PCS__V1__DATA_SPEC__SOURCE_SYNTHETIC);
    assert_int_equal(j->data->synthetic->task, PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_REGRESSION);
    assert_int_equal(j->data->synthetic->seed, 7);
    assert_int_equal(j->init->seed, 13);
    assert_string_equal(j->init->from, "");
    assert_string_equal(j->checkpoint->dir, "ckpt/mlp-demo");
    assert_int_equal(j->checkpoint->every_steps, 20);
    assert_int_equal(j->elastic->min_workers, 4);
    assert_int_equal(j->elastic->max_workers, 4);
    assert_int_equal(j->elastic->max_restarts, 3);
    assert_string_equal(j->backend, "");
    free_job(j);
}

static void test_json_example_with_explicit_model_parses(void **state)
{
    (void)state;
    job_t *j = parse_file("examples/fp16-explicit-job.json");
    assert_int_equal(j->model->kind_case, PCS__V1__MODEL_SPEC__KIND_EXPLICIT);
    Pcs__V1__ExplicitModel *e = j->model->explicit_;
    assert_int_equal(e->n_modules, 5);
    assert_string_equal(e->modules[0]->path, "");
    assert_string_equal(e->modules[1]->class_, "Embedding");
    assert_int_equal(e->modules[1]->params[0]->n_shape, 2);
    assert_int_equal(e->modules[1]->params[0]->shape[0], 1000);
    assert_int_equal(e->modules[3]->n_buffers, 3);
    assert_int_equal(e->modules[3]->buffers[2]->dtype, PCS__V1__DTYPE__DTYPE_INT64);
    assert_int_equal(e->modules[3]->buffers[2]->n_shape, 0);
    assert_string_equal(e->modules[4]->shared[0]->shares, "embed.weight");
    assert_int_equal(j->wrap->policy_case, PCS__V1__WRAP_SPEC__POLICY_EXPLICIT);
    assert_string_equal(j->wrap->explicit_->paths[0], "blocks.0");
    assert_true(j->precision->overrides[0]->full_precision);
    assert_int_equal(j->reshard_after_forward->value_case,
                     PCS__V1__RESHARD_AFTER_FORWARD__VALUE_ENABLED);
    assert_false(j->reshard_after_forward->enabled);
    assert_true(j->training->optimizer->sgd->nesterov);
    assert_non_null(j->training->optimizer->sgd->dampening);
    assert_true(j->training->optimizer->sgd->dampening->value == 0.0);
    assert_true(j->training->grad_scaler->init_scale->value == 1024.0);
    assert_int_equal(j->training->grad_scaler->growth_interval->value, 100);
    assert_int_equal(j->training->loss, PCS__V1__LOSS__LOSS_CROSS_ENTROPY);
    free_job(j);
}

static void test_every_example_file_parses(void **state)
{
    (void)state;
    const char *files[] = {"examples/demo-job.yaml", "examples/tiny-job.yaml",
                           "examples/hsdp-job.yaml", "examples/fp16-explicit-job.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        free_job(parse_file(files[i]));
}

// ---- shorthands ---------------------------------------------------------------------------------

static void test_enum_names_are_case_insensitive_and_accept_full_names(void **state)
{
    (void)state;
    job_t *j = parse_ok("strategy: HYBRID_SHARD_ZERO2\nprecision: {param_dtype: BF16, "
                        "reduce_dtype: DTYPE_FP16, buffer_dtype: 4}\n");
    assert_int_equal(j->strategy, PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2);
    assert_int_equal(j->precision->param_dtype, PCS__V1__DTYPE__DTYPE_BF16);
    assert_int_equal(j->precision->reduce_dtype, PCS__V1__DTYPE__DTYPE_FP16);
    assert_int_equal(j->precision->buffer_dtype, PCS__V1__DTYPE__DTYPE_FP64);
    free_job(j);
}

static void test_reshard_after_forward_scalar_picks_the_oneof_member(void **state)
{
    (void)state;
    job_t *j = parse_ok("reshard_after_forward: 2\n");
    assert_int_equal(j->reshard_after_forward->value_case,
                     PCS__V1__RESHARD_AFTER_FORWARD__VALUE_GROUP_SIZE);
    assert_int_equal(j->reshard_after_forward->group_size, 2);
    free_job(j);
    j = parse_ok("reshard_after_forward: true\n");
    assert_int_equal(j->reshard_after_forward->value_case,
                     PCS__V1__RESHARD_AFTER_FORWARD__VALUE_ENABLED);
    assert_true(j->reshard_after_forward->enabled);
    free_job(j);
    j = parse_ok("reshard_after_forward: {group_size: 4}\n");
    assert_int_equal(j->reshard_after_forward->group_size, 4);
    free_job(j);
    parse_err("reshard_after_forward: maybe\n",
              "line 1: reshard_after_forward: 'maybe' fits none of enabled, group_size");
}

static void test_wrapper_scalars_and_default_leave_unset(void **state)
{
    (void)state;
    job_t *j = parse_ok("training:\n  optimizer:\n    sgd: {lr: 0.1, momentum: 0, "
                        "weight_decay: default, dampening: ~}\n");
    Pcs__V1__SgdOptimizer *s = j->training->optimizer->sgd;
    assert_non_null(s->momentum); /* 0 given explicitly: present */
    assert_true(s->momentum->value == 0.0);
    assert_null(s->weight_decay);
    assert_null(s->dampening);
    free_job(j);
}

static void test_sequence_shorthand_fills_the_single_repeated_field(void **state)
{
    (void)state;
    job_t *j = parse_ok("wrap:\n  explicit: [layers.0, layers.1, head]\n");
    assert_int_equal(j->wrap->explicit_->n_paths, 3);
    assert_string_equal(j->wrap->explicit_->paths[2], "head");
    free_job(j);
    j = parse_ok("wrap: {module_class: {classes: [A, B]}}\n");
    assert_int_equal(j->wrap->module_class->n_classes, 2);
    free_job(j);
}

static void test_numbers_accept_exponents_and_integer_floats(void **state)
{
    (void)state;
    job_t *j = parse_ok("wrap: {size_based: {min_num_params: 1e8}}\n"
                        "training: {clip_grad_norm: 5E-1, optimizer: {adamw: {lr: 1e-3}}}\n"
                        "data: {synthetic: {seed: 18446744073709551615}}\n");
    assert_int_equal(j->wrap->size_based->min_num_params, 100000000);
    assert_true(j->training->clip_grad_norm == 0.5);
    assert_true(j->training->optimizer->adamw->lr == 1e-3);
    assert_true(j->data->synthetic->seed == UINT64_MAX);
    free_job(j);
}

static void test_bools_accept_yes_and_no(void **state)
{
    (void)state;
    job_t *j = parse_ok("model: {mlp: {residual: yes, bias: no}}\n");
    assert_true(j->model->mlp->residual);
    assert_false(j->model->mlp->bias->value);
    free_job(j);
}

static void test_quoted_default_is_a_literal_string(void **state)
{
    (void)state;
    job_t *j = parse_ok("name: \"default\"\nbackend: default\n");
    assert_string_equal(j->name, "default");
    assert_string_equal(j->backend, "");
    free_job(j);
}

// ---- errors -------------------------------------------------------------------------------------

static void test_wrong_type_names_line_and_path(void **state)
{
    (void)state;
    parse_err("name: x\ntraining:\n  optimizer:\n    adamw: {lr: fast}\n",
              "line 4: training.optimizer.adamw.lr: expected a number, got 'fast'");
    parse_err("mesh:\n  - {dim: dp_shard, size: -2}\n",
              "line 2: mesh[0].size: -2 is out of range for uint32");
    parse_err("training: {steps: 4294967296}\n", "line 1: training.steps: 4294967296 is out of "
                                                 "range for uint32");
    parse_err("training: {steps: 1.5}\n", "training.steps: expected a non-negative integer");
    parse_err("model: {mlp: {residual: maybe}}\n",
              "line 1: model.mlp.residual: expected true or false, got 'maybe'");
    parse_err("model:\n  mlp:\n    hidden_dims: 3\n",
              "line 3: model.mlp.hidden_dims: expected a sequence, got a scalar");
    parse_err("training: 5\n", "line 1: training: expected a mapping, got a scalar");
    parse_err("name: [a]\n", "line 1: name: expected a string, got a sequence");
}

static void test_unknown_key_is_an_error_naming_the_fields(void **state)
{
    (void)state;
    parse_err("name: x\nmodel:\n  mlp:\n    input_dims: 3\n",
              "line 4: model.mlp.input_dims: unknown field (MlpModel has: input_dim,");
}

static void test_bad_enum_lists_the_choices(void **state)
{
    (void)state;
    parse_err("precision:\n  param_dtype: bf17\n",
              "line 2: precision.param_dtype: unknown value 'bf17' (expected one of: fp32, bf16, "
              "fp16, fp64, int64)");
}

static void test_two_oneof_members_conflict(void **state)
{
    (void)state;
    parse_err("model:\n  mlp: {input_dim: 2}\n  explicit: []\n",
              "line 3: model.explicit: only one of mlp, explicit may be set (mlp is already set)");
}

static void test_duplicate_key_is_an_error(void **state)
{
    (void)state;
    parse_err("name: a\nname: b\n", "line 2: name: duplicate key");
}

static void test_structure_errors_are_clear(void **state)
{
    (void)state;
    parse_err("", "document is empty");
    parse_err("# only a comment\n", "document is empty");
    parse_err("a: &x 1\nb: *x\n", "unknown field");
    parse_err("name: &x a\ninit: {from: *x}\n",
              "line 2: init.from: YAML aliases are not supported");
    parse_err("name: a\n---\nname: b\n", "more than one YAML document");
    parse_err("name: x\ninit: {seed: 1\n", "YAML syntax error");
    parse_err("mesh: [~]\n", "mesh[0]: null is not allowed in a sequence");
}

static void test_deep_nesting_is_refused_without_crash(void **state)
{
    (void)state;
    size_t depth = 100000;
    char *buf = malloc(2 * depth + 16);
    assert_non_null(buf);
    size_t n = 0;
    memcpy(buf, "name: ", 6);
    n = 6;
    for (size_t i = 0; i < depth; i++)
        buf[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        buf[n++] = ']';
    buf[n] = '\0';
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_pb_from_yaml(buf, n, &pcs__v1__job_spec__descriptor, &m),
                     PCS_ERR_INVALID_ARG);
    assert_null(m);
    /* Deep nesting through a repeated message field reaches the depth limit. */
    n = 0;
    n += (size_t)sprintf(buf + n, "model: {explicit: ");
    for (size_t i = 0; i < 200; i++)
        buf[n++] = '[';
    buf[n] = '\0';
    assert_int_equal(pcs_pb_from_yaml(buf, n, &pcs__v1__job_spec__descriptor, &m),
                     PCS_ERR_INVALID_ARG);
    free(buf);
}

static void test_file_errors_name_the_file(void **state)
{
    (void)state;
    ProtobufCMessage *m = NULL;
    assert_int_equal(
        pcs_pb_from_yaml_file("/nonexistent/job.yaml", &pcs__v1__job_spec__descriptor, &m),
        PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "/nonexistent/job.yaml: cannot open"));
    char *dir = pcs_test_tmpdir("pbyaml");
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.yaml", dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("name: x\ntraining: {steps: many}\n", fp);
    fclose(fp);
    assert_int_equal(pcs_pb_from_yaml_file(path, &pcs__v1__job_spec__descriptor, &m),
                     PCS_ERR_INVALID_ARG);
    char want[1100];
    snprintf(want, sizeof want, "%s: line 2: training.steps:", path);
    if (!strstr(pcs_last_error(), want))
        fail_msg("'%s' lacks '%s'", pcs_last_error(), want);
    pcs_test_rmtree(dir);
    free(dir);
}

// ---- JSON output and round trips ----------------------------------------------------------------

static void assert_same_packed(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    size_t na = protobuf_c_message_get_packed_size(a), nb = protobuf_c_message_get_packed_size(b);
    assert_int_equal(na, nb);
    uint8_t *pa = malloc(na + 1), *pb = malloc(nb + 1);
    assert_non_null(pa);
    assert_non_null(pb);
    protobuf_c_message_pack(a, pa);
    protobuf_c_message_pack(b, pb);
    assert_memory_equal(pa, pb, na);
    free(pa);
    free(pb);
}

static void roundtrip_as(const ProtobufCMessage *m, int indent, int canonical)
{
    char *json = NULL;
    assert_int_equal(canonical ? pcs_pb_to_json_canonical(m, indent, &json)
                               : pcs_pb_to_json(m, indent, &json),
                     PCS_OK);
    ProtobufCMessage *back = NULL;
    if (pcs_pb_from_yaml(json, strlen(json), m->descriptor, &back) != PCS_OK)
        fail_msg("JSON output does not parse back: %s\n%s", pcs_last_error(), json);
    assert_same_packed(m, back);
    protobuf_c_message_free_unpacked(back, NULL);
    free(json);
}

static void roundtrip(const ProtobufCMessage *m, int indent)
{
    roundtrip_as(m, indent, 0);
    roundtrip_as(m, indent, 1);
}

static void test_yaml_to_json_round_trip_is_byte_exact(void **state)
{
    (void)state;
    const char *files[] = {"examples/demo-job.yaml", "examples/tiny-job.yaml",
                           "examples/hsdp-job.yaml", "examples/fp16-explicit-job.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        job_t *j = parse_file(files[i]);
        roundtrip(&j->base, 0);
        roundtrip(&j->base, 2);
        free_job(j);
    }
}

/* proto3's canonical JSON (what pcsctl --json prints and every protobuf library parses):
 * lowerCamelCase names, enum value names as declared, 64-bit integers as strings, wrappers and
 * scalar oneofs as objects, NaN/Infinity as the mapping spells them. */
static void test_canonical_json_follows_the_proto3_mapping(void **state)
{
    (void)state;
    job_t *j = parse_ok("strategy: no_shard\nreshard_after_forward: 3\nprecision: "
                        "{param_dtype: bf16, cast_forward_inputs: false}\n"
                        "training: {micro_batch_size: 4}\n");
    char *json = NULL;
    assert_int_equal(pcs_pb_to_json_canonical(&j->base, 0, &json), PCS_OK);
    assert_non_null(strstr(json, "\"paramDtype\":\"DTYPE_BF16\""));
    assert_non_null(strstr(json, "\"castForwardInputs\":"));
    assert_non_null(strstr(json, "\"strategy\":\"STRATEGY_NO_SHARD\""));
    assert_non_null(strstr(json, "\"microBatchSize\":4"));
    assert_null(strstr(json, "\"reshardAfterForward\":3")); /* an object, not a bare scalar */
    assert_non_null(strstr(json, "\"reshardAfterForward\":{"));
    free(json);
    free_job(j);
    Pcs__V1__JobProgress prog = PCS__V1__JOB_PROGRESS__INIT;
    prog.loss = NAN;
    prog.step_ms = -INFINITY;
    prog.step = UINT64_MAX;
    Pcs__V1__Job job = PCS__V1__JOB__INIT;
    job.progress = &prog;
    job.plan_hash = 0x8000000000000001ull;
    assert_int_equal(pcs_pb_to_json_canonical(&job.base, 0, &json), PCS_OK);
    assert_non_null(strstr(json, "\"planHash\":\"9223372036854775809\""));
    assert_non_null(strstr(json, "\"step\":\"18446744073709551615\""));
    assert_non_null(strstr(json, "\"loss\":\"NaN\""));
    assert_non_null(strstr(json, "\"stepMs\":\"-Infinity\""));
    ProtobufCMessage *back = NULL;
    if (pcs_pb_from_yaml(json, strlen(json), &pcs__v1__job__descriptor, &back) != PCS_OK)
        fail_msg("canonical JSON does not parse back: %s\n%s", pcs_last_error(), json);
    Pcs__V1__Job *b = (Pcs__V1__Job *)back;
    assert_true(b->plan_hash == 0x8000000000000001ull);
    assert_true(b->progress->step == UINT64_MAX);
    assert_true(isnan(b->progress->loss));
    assert_true(isinf(b->progress->step_ms) && b->progress->step_ms < 0);
    protobuf_c_message_free_unpacked(back, NULL);
    free(json);
}

static void test_json_shows_enums_short_and_wrappers_plain(void **state)
{
    (void)state;
    job_t *j = parse_ok("strategy: no_shard\nreshard_after_forward: 3\nprecision: "
                        "{param_dtype: bf16, cast_forward_inputs: false}\n"
                        "training: {optimizer: {adamw: {lr: 0.001, eps: 1e-8}}}\n");
    char *json = NULL;
    assert_int_equal(pcs_pb_to_json(&j->base, 0, &json), PCS_OK);
    assert_string_equal(json, "{\"precision\":{\"param_dtype\":\"bf16\",\"cast_forward_inputs\":"
                              "false},\"strategy\":\"no_shard\",\"reshard_after_forward\":3,"
                              "\"training\":{\"optimizer\":{\"adamw\":{\"lr\":0.001,\"eps\":1e-08}"
                              "}}}");
    free(json);
    free_job(j);
}

static void test_json_escapes_strings_and_handles_special_numbers(void **state)
{
    (void)state;
    Pcs__V1__JobProgress prog = PCS__V1__JOB_PROGRESS__INIT;
    prog.loss = NAN;
    prog.step_ms = -INFINITY;
    prog.loss_scale = 65536.0;
    prog.step = UINT64_MAX;
    Pcs__V1__Job job = PCS__V1__JOB__INIT;
    char name[] = "a\"b\\c\n\x01\xff";
    job.name = name;
    job.progress = &prog;
    job.plan_hash = 0x8000000000000001ull;
    char *json = NULL;
    assert_int_equal(pcs_pb_to_json(&job.base, 0, &json), PCS_OK);
    assert_non_null(strstr(json, "\"name\":\"a\\\"b\\\\c\\n\\u0001\\ufffd\""));
    assert_non_null(strstr(json, "\"step\":18446744073709551615"));
    assert_non_null(strstr(json, "\"loss\":\"nan\""));
    assert_non_null(strstr(json, "\"step_ms\":\"-inf\""));
    assert_non_null(strstr(json, "\"plan_hash\":9223372036854775809"));
    /* It parses back (the invalid byte became U+FFFD, so compare the rest field by field). */
    ProtobufCMessage *back = NULL;
    assert_int_equal(pcs_pb_from_yaml(json, strlen(json), &pcs__v1__job__descriptor, &back),
                     PCS_OK);
    Pcs__V1__Job *b = (Pcs__V1__Job *)back;
    assert_string_equal(b->name, "a\"b\\c\n\x01\xef\xbf\xbd");
    assert_true(isnan(b->progress->loss));
    assert_true(isinf(b->progress->step_ms) && b->progress->step_ms < 0);
    assert_true(b->progress->step == UINT64_MAX);
    assert_true(b->plan_hash == 0x8000000000000001ull);
    protobuf_c_message_free_unpacked(back, NULL);
    free(json);
}

static void test_doubles_round_trip_exactly(void **state)
{
    (void)state;
    const double vals[] = {0.1,  1.0 / 3.0,   1e-300, 5e-324, 1.7976931348623157e308,
                           -0.0, 123456789.0, 2.5e-8};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        Pcs__V1__AdamWOptimizer a = PCS__V1__ADAM_WOPTIMIZER__INIT;
        a.lr = vals[i];
        roundtrip(&a.base, 0);
    }
}

static void test_enum_short_name_helper(void **state)
{
    (void)state;
    char buf[32];
    assert_string_equal(pcs_pb_enum_short(&pcs__v1__strategy__descriptor, 5, buf, sizeof buf),
                        "hybrid_shard_zero2");
    assert_string_equal(pcs_pb_enum_short(&pcs__v1__job_state__descriptor, 2, buf, sizeof buf),
                        "running");
    assert_string_equal(pcs_pb_enum_short(&pcs__v1__strategy__descriptor, 99, buf, sizeof buf),
                        "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_job_parses_into_expected_values),
        cmocka_unit_test(test_json_example_with_explicit_model_parses),
        cmocka_unit_test(test_every_example_file_parses),
        cmocka_unit_test(test_enum_names_are_case_insensitive_and_accept_full_names),
        cmocka_unit_test(test_reshard_after_forward_scalar_picks_the_oneof_member),
        cmocka_unit_test(test_wrapper_scalars_and_default_leave_unset),
        cmocka_unit_test(test_sequence_shorthand_fills_the_single_repeated_field),
        cmocka_unit_test(test_numbers_accept_exponents_and_integer_floats),
        cmocka_unit_test(test_bools_accept_yes_and_no),
        cmocka_unit_test(test_quoted_default_is_a_literal_string),
        cmocka_unit_test(test_wrong_type_names_line_and_path),
        cmocka_unit_test(test_unknown_key_is_an_error_naming_the_fields),
        cmocka_unit_test(test_bad_enum_lists_the_choices),
        cmocka_unit_test(test_two_oneof_members_conflict),
        cmocka_unit_test(test_duplicate_key_is_an_error),
        cmocka_unit_test(test_structure_errors_are_clear),
        cmocka_unit_test(test_deep_nesting_is_refused_without_crash),
        cmocka_unit_test(test_file_errors_name_the_file),
        cmocka_unit_test(test_yaml_to_json_round_trip_is_byte_exact),
        cmocka_unit_test(test_json_shows_enums_short_and_wrappers_plain),
        cmocka_unit_test(test_canonical_json_follows_the_proto3_mapping),
        cmocka_unit_test(test_json_escapes_strings_and_handles_special_numbers),
        cmocka_unit_test(test_doubles_round_trip_exactly),
        cmocka_unit_test(test_enum_short_name_helper),
    };
    return cmocka_run_group_tests_name("pb_yaml", tests, NULL, NULL);
}
