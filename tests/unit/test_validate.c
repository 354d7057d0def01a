/* Unit tests of the job spec validator (planner/validate.c). Table-driven: every rule has one
 * row that breaks exactly that rule in an otherwise valid base spec (a YAML section replaced, or a
 * value the YAML parser cannot produce set in C), and the row expects the exact error text,
 * whose prefix is the field path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/pbtext.h"
#include "test_util.h"
#include "planner/validate.h"

typedef Pcs__V1__JobSpec job_t;

/* The valid base spec, one top-level key per section (replaced whole by a row). */
static const struct {
    const char *key, *yaml;
} base[] = {
    {"name", "name: base-job"},
    {"model", "model: {mlp: {input_dim: 8, hidden_dims: [16, 16], output_dim: 4}}"},
    {"wrap", "wrap: {module_class: [MLPBlock], ignored_module_classes: [BatchNorm1d]}"},
    {"precision", "precision: {param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: fp32, "
                  "master_dtype: fp32, overrides: [{match: {module_class: LayerNorm}, "
                  "param_dtype: fp32}, {match: {path: 'h*'}, output_dtype: bf16}, "
                  "{match: {path: head}, full_precision: true, output_dtype: fp32}]}"},
    {"strategy", "strategy: full_shard"},
    {"reshard_after_forward", "reshard_after_forward: 2"},
    {"mesh", "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard, size: 4}]"},
    {"training", "training: {steps: 10, micro_batch_size: 4, micro_batches: 2, optimizer: {adamw: "
                 "{lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.01}}, "
                 "clip_grad_norm: 1.0, grad_scaler: {enabled: true, init_scale: 65536, "
                 "growth_factor: 2, backoff_factor: 0.5, growth_interval: 2000}, loss: mse, "
                 "prefetch: 1}"},
    {"data", "data: {synthetic: {task: regression, seed: 1}}"},
    {"init", "init: {seed: 1, from: init.safetensors}"},
    {"checkpoint", "checkpoint: {dir: ckpt, every_steps: 5}"},
    {"elastic", "elastic: {min_workers: 8, max_workers: 8, max_restarts: 2}"},
    {"pipeline", "pipeline: {schedule: 1f1b}"},
    {"backend", "backend: cpu"},
    {"collectives", "collectives: gloo"},
};
#define N_BASE (sizeof base / sizeof base[0])

#define EXPLICIT_MODEL                                                                             \
    "model: {explicit: [{path: '', class: Net}, {path: enc, class: Linear, params: [{name: "       \
    "weight, shape: [4, 8]}, {name: bias, shape: [4]}], buffers: [{name: running_mean, shape: "    \
    "[4]}]}, {path: head, class: Linear, shared: [{name: weight, shares: enc.weight}]}]}"

typedef void (*mutate_fn)(job_t *);

#define LONG_NAME                                                                                  \
    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn" \
    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"

typedef struct row {
    const char *key1, *yaml1; /* section replaced (yaml "" removes it) */
    const char *key2, *yaml2; /* optional second section */
    mutate_fn mutate;         /* optional: values no YAML can spell */
    const char *expect;
} row_t;

// ---- mutations ----------------------------------------------------------------------------------

static void m_many_layers(job_t *s)
{
    Pcs__V1__MlpModel *m = s->model->mlp;
    free(m->hidden_dims);
    m->n_hidden_dims = 5000;
    m->hidden_dims = malloc(5000 * sizeof *m->hidden_dims);
    for (size_t i = 0; i < 5000; i++)
        m->hidden_dims[i] = 8;
}
static void m_long_path(job_t *s)
{
    /* Needs the explicit model: swap it in, then lengthen modules[1].path. */
    Pcs__V1__ModuleDecl *m = s->model->explicit_->modules[1];
    free(m->path);
    m->path = malloc(801);
    memset(m->path, 'p', 800);
    m->path[800] = '\0';
}
static void m_activation(job_t *s)
{
    s->model->mlp->activation = 9;
}
static void m_norm(job_t *s)
{
    s->model->mlp->norm = 9;
}
static void m_param_dtype_value(job_t *s)
{
    s->model->explicit_->modules[1]->params[0]->dtype = 42;
}
static void m_buffer_dtype_value(job_t *s)
{
    s->model->explicit_->modules[1]->buffers[0]->dtype = 42;
}
static void m_precision_dtype_value(job_t *s)
{
    s->precision->param_dtype = 42;
}
static void m_mesh_dim_value(job_t *s)
{
    s->mesh[0]->dim = 9;
}
static void m_strategy_value(job_t *s)
{
    s->strategy = 9;
}
static void m_loss_value(job_t *s)
{
    s->training->loss = 9;
}
static void m_task_value(job_t *s)
{
    s->data->synthetic->task = 9;
}

// ---- the table: one row per rule ----------------------------------------------------------------

static const row_t rows[] = {
    {"name", "name: 'bad name!'", NULL, NULL, NULL,
     "name: must be at most 128 characters of [A-Za-z0-9._-]"},
    /* model */
    {"model", "", NULL, NULL, NULL, "model: required (mlp or explicit)"},
    {"model", "model: {mlp: {input_dim: 0, hidden_dims: [4], output_dim: 2}}", NULL, NULL, NULL,
     "model.mlp.input_dim: must be >= 1"},
    {"model", "model: {mlp: {input_dim: 4, output_dim: 2}}", NULL, NULL, NULL,
     "model.mlp.hidden_dims: required"},
    {NULL, NULL, NULL, NULL, m_many_layers, "model.mlp.hidden_dims: at most 4096 layers"},
    {"model", "model: {mlp: {input_dim: 4, hidden_dims: [4, 0], output_dim: 2}}", NULL, NULL, NULL,
     "model.mlp.hidden_dims[1]: must be >= 1"},
    {"model", "model: {mlp: {input_dim: 4, hidden_dims: [4]}}", NULL, NULL, NULL,
     "model.mlp.output_dim: must be >= 1"},
    {"model", "model: {mlp: {input_dim: 4000000000, hidden_dims: [4000000000], output_dim: 2}}",
     NULL, NULL, NULL, "model.mlp: more than 2^48 parameters"},
    {NULL, NULL, NULL, NULL, m_activation, "model.mlp.activation: unknown value 9"},
    {NULL, NULL, NULL, NULL, m_norm, "model.mlp.norm: unknown value 9"},
    {"model", "model: {explicit: []}", NULL, NULL, NULL, "model.explicit.modules: required"},
    {"model", "model: {explicit: [{path: ''}, {path: 'a..b'}]}", NULL, NULL, NULL,
     "model.explicit.modules[1].path: 'a..b' is not a module path"},
    {"model", "model: {explicit: [{path: ''}, {class: Other}]}", NULL, NULL, NULL,
     "model.explicit.modules[1].path: duplicate module path '(root)'"},
    {"model", "model: {explicit: [{path: a, params: [{shape: [2]}]}]}", NULL, NULL, NULL,
     "model.explicit.modules[0].params[0].name: required"},
    {"model", "model: {explicit: [{path: a, params: [{name: x.y, shape: [2]}]}]}", NULL, NULL, NULL,
     "model.explicit.modules[0].params[0].name: 'x.y' must be a local name without '.'"},
    {"model", "model: {explicit: [{path: a, params: [{name: " LONG_NAME ", shape: [2]}]}]}", NULL,
     NULL, NULL, "model.explicit.modules[0].params[0].name: longer than 128 characters"},
    {"model", EXPLICIT_MODEL, NULL, NULL, m_long_path,
     "model.explicit.modules[1].path: longer than 768 characters"},
    {"model",
     "model: {explicit: [{path: a, params: [{name: w, shape: [2]}]}, {path: b, shared: "
     "[{name: x.y, shares: a.w}]}]}",
     NULL, NULL, NULL,
     "model.explicit.modules[1].shared[0].name: must be a local name (no '.', at most 128 "
     "characters)"},
    {"model", "model: {explicit: [{path: a, params: [{name: w}]}]}", NULL, NULL, NULL,
     "model.explicit.modules[0].params[0].shape: required (scalar parameters are not supported)"},
    {"model", "model: {explicit: [{path: a, params: [{name: w, shape: [2, 0]}]}]}", NULL, NULL,
     NULL, "model.explicit.modules[0].params[0].shape[1]: must be >= 1"},
    {"model", "model: {explicit: [{path: a, params: [{name: w, shape: [16777216, 16777216, 2]}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[0].params[0].shape: more than 2^48 elements"},
    {"model", "model: {explicit: [{path: a, params: [{name: w, shape: [2], dtype: int64}]}]}", NULL,
     NULL, NULL, "model.explicit.modules[0].params[0].dtype: int64 is not a floating dtype"},
    {"model", EXPLICIT_MODEL, NULL, NULL, m_param_dtype_value,
     "model.explicit.modules[1].params[0].dtype: unknown dtype value 42"},
    {"model", EXPLICIT_MODEL, NULL, NULL, m_buffer_dtype_value,
     "model.explicit.modules[1].buffers[0].dtype: unknown dtype value 42"},
    {"model",
     "model: {explicit: [{path: enc, params: [{name: w, shape: [2]}], buffers: [{name: w}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[0].buffers[0].name: duplicate FQN 'enc.w'"},
    {"model",
     "model: {explicit: [{path: a, params: [{name: w, shape: [2]}]}, {path: b, shared: "
     "[{shares: a.w}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[1].shared[0].name: required"},
    {"model",
     "model: {explicit: [{path: a, params: [{name: w, shape: [2]}], shared: [{name: w, "
     "shares: a.w}]}]}",
     NULL, NULL, NULL,
     "model.explicit.modules[0].shared[0].name: 'a.w' is also declared as a parameter or buffer"},
    {"model",
     "model: {explicit: [{path: a, params: [{name: w, shape: [2]}]}, {path: b, shared: "
     "[{name: w}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[1].shared[0].shares: required"},
    {"model",
     "model: {explicit: [{path: a, params: [{name: w, shape: [2]}]}, {path: b, shared: "
     "[{name: w, shares: a.x}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[1].shared[0].shares: no parameter 'a.x'"},
    {"model",
     "model: {explicit: [{path: a, buffers: [{name: m, shape: [2]}]}, {path: b, shared: "
     "[{name: w, shares: a.m}]}]}",
     NULL, NULL, NULL, "model.explicit.modules[1].shared[0].shares: no parameter 'a.m'"},
    /* wrap */
    {"wrap", "wrap: {size_based: {min_num_params: 0}}", NULL, NULL, NULL,
     "wrap.size_based.min_num_params: must be >= 1"},
    {"wrap", "wrap: {module_class: []}", NULL, NULL, NULL, "wrap.module_class.classes: required"},
    {"wrap", "wrap: {module_class: ['']}", NULL, NULL, NULL,
     "wrap.module_class.classes[0]: must not be empty"},
    {"wrap", "wrap: {explicit: []}", NULL, NULL, NULL, "wrap.explicit.paths: required"},
    {"wrap", "wrap: {explicit: ['']}", NULL, NULL, NULL,
     "wrap.explicit.paths[0]: must not be empty (the root is always a unit)"},
    {"wrap", "wrap: {explicit: ['a..b']}", NULL, NULL, NULL,
     "wrap.explicit.paths[0]: 'a..b' is not a module path"},
    {"wrap", "wrap: {explicit: [layers.0, layers.0]}", NULL, NULL, NULL,
     "wrap.explicit.paths[1]: 'layers.0' given twice"},
    {"wrap", "wrap: {explicit: [enc, nope]}", "model", EXPLICIT_MODEL, NULL,
     "wrap.explicit.paths[1]: no module 'nope' in the model"},
    {"wrap", "wrap: {explicit: [layers.1, layers.2]}", NULL, NULL, NULL,
     "wrap.explicit.paths[1]: no module 'layers.2' in the model"},
    {"wrap", "wrap: {ignored_module_classes: ['']}", NULL, NULL, NULL,
     "wrap.ignored_module_classes[0]: must not be empty"},
    {"wrap", "wrap: {ignored_module_classes: [none, BatchNorm2d]}", NULL, NULL, NULL,
     "wrap.ignored_module_classes: 'none' must be the only entry"},
    /* precision */
    {"precision", "precision: {param_dtype: int64}", NULL, NULL, NULL,
     "precision.param_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {reduce_dtype: int64}", NULL, NULL, NULL,
     "precision.reduce_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {buffer_dtype: int64}", NULL, NULL, NULL,
     "precision.buffer_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {output_dtype: int64}", NULL, NULL, NULL,
     "precision.output_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {master_dtype: int64}", NULL, NULL, NULL,
     "precision.master_dtype: int64 is not a floating dtype"},
    {NULL, NULL, NULL, NULL, m_precision_dtype_value,
     "precision.param_dtype: unknown dtype value 42"},
    {"precision", "precision: {overrides: [{param_dtype: fp32}]}", NULL, NULL, NULL,
     "precision.overrides[0].match: required (module_class or path)"},
    {"precision", "precision: {overrides: [{match: {path: 'a.*.b'}}]}", NULL, NULL, NULL,
     "precision.overrides[0].match.path: '*' is only allowed at the end"},
    {"precision", "precision: {overrides: [{match: {path: 'layers.0.norm'}}]}", NULL, NULL, NULL,
     "precision.overrides[0].match.path: no module matches 'layers.0.norm'"},
    {"precision", "precision: {overrides: [{match: {path: 'blocks.*'}}]}", NULL, NULL, NULL,
     "precision.overrides[0].match.path: no module matches 'blocks.*'"},
    {"precision",
     "precision: {overrides: [{match: {path: head}}, {match: {path: 'layers.1'}}, {match: "
     "{module_class: C}, param_dtype: int64}]}",
     NULL, NULL, NULL, "precision.overrides[2].param_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {overrides: [{match: {path: head}, reduce_dtype: int64}]}", NULL,
     NULL, NULL, "precision.overrides[0].reduce_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {overrides: [{match: {path: head}, buffer_dtype: int64}]}", NULL,
     NULL, NULL, "precision.overrides[0].buffer_dtype: int64 is not a floating dtype"},
    {"precision", "precision: {overrides: [{match: {path: head}, output_dtype: int64}]}", NULL,
     NULL, NULL, "precision.overrides[0].output_dtype: int64 is not a floating dtype"},
    {"precision",
     "precision: {overrides: [{match: {path: head}, full_precision: true, "
     "reduce_dtype: bf16}]}",
     NULL, NULL, NULL, "precision.overrides[0].full_precision: conflicts with reduce_dtype"},
    /* mesh */
    {"mesh", "mesh: [{size: 2}]", NULL, NULL, NULL,
     "mesh[0].dim: required (pp, dp_replicate or dp_shard)"},
    {NULL, NULL, NULL, NULL, m_mesh_dim_value, "mesh[0].dim: unknown value 9"},
    {"mesh", "mesh: [{dim: dp_replicate, size: 2}, {dim: dp_shard}]", NULL, NULL, NULL,
     "mesh[1].size: must be >= 1"},
    {"mesh", "mesh: [{dim: dp_shard, size: 2}, {dim: pp, size: 2}, {dim: dp_shard, size: 2}]", NULL,
     NULL, NULL, "mesh: dimension dp_shard given twice"},
    {"mesh", "mesh: [{dim: dp_replicate, size: 1024}, {dim: dp_shard, size: 128}]", NULL, NULL,
     NULL, "mesh: world size exceeds 65536"},
    {"training", "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, "
                 "accumulation: sometimes}", NULL, NULL,
     NULL, "training.accumulation: unknown value 'sometimes' (auto, reshard, keep_gathered)"},
    {"training", "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, "
                 "backward_prefetch: later}", NULL, NULL,
     NULL, "training.backward_prefetch: unknown value 'later' (pre, post, none)"},
    /* per-module composition (strategy_overrides) */
    {"collectives", "collectives: gloo\nstrategy_overrides: [{strategy: no_shard}]", NULL, NULL,
     NULL, "strategy_overrides[0].match: required (module_class or path)"},
    {"collectives", "collectives: gloo\nstrategy_overrides: [{match: {path: zz}, strategy: no_shard}]",
     NULL, NULL, NULL, "strategy_overrides[0].match.path: no module matches 'zz'"},
    {"collectives", "collectives: gloo\nstrategy_overrides: [{match: {module_class: Linear}}]",
     NULL, NULL, NULL, "strategy_overrides[0].strategy: required"},
    {"collectives",
     "collectives: gloo\nstrategy_overrides: [{match: {module_class: Linear}, strategy: "
     "hybrid_shard}]",
     "mesh", "mesh: [{dim: dp_shard, size: 8}]", NULL,
     "strategy_overrides[0].strategy: hybrid_shard needs a dp_replicate mesh dimension"},
    /* when gradients are reduced */
    {"training",
     "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, gradient_sync: "
     "sometimes}",
     NULL, NULL, NULL,
     "training.gradient_sync: unknown value 'sometimes' (last_micro_batch, every_micro_batch)"},
    {"training",
     "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, hsdp_all_reduce: "
     "last_micro_batch}",
     NULL, NULL, NULL,
     "training.hsdp_all_reduce: last_micro_batch needs training.gradient_sync: "
     "every_micro_batch (otherwise the one reduction of a step is the last)"},
    /* FSDP ignored_modules */
    {"collectives", "collectives: gloo\nignored_modules: ['']", NULL, NULL, NULL,
     "ignored_modules[0]: the root module cannot be ignored"},
    {"collectives", "collectives: gloo\nignored_modules: [layers.9]", NULL, NULL, NULL,
     "ignored_modules[0]: no module 'layers.9' in the model"},
    /* FSDP2 ignored_params (which parameters exist: the planner) */
    {"collectives", "collectives: gloo\nignored_params: ['']", NULL, NULL, NULL,
     "ignored_params[0]: must name a parameter"},
    {"collectives", "collectives: gloo\nignored_params: [head.bias, head.bias]", NULL, NULL, NULL,
     "ignored_params[1]: 'head.bias' is listed twice"},
    /* the worker program (spec.program) */
    {"collectives", "collectives: gloo\nprogram: 'pcs torch'", NULL, NULL, NULL,
     "program: must be at most 64 characters of [A-Za-z0-9._-], got 'pcs torch'"},
    {"collectives", "collectives: gloo\nprogram: ../x", NULL, NULL, NULL,
     "program: must be at most 64 characters of [A-Za-z0-9._-], got '../x'"},
    {"training",
     "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, eval_backward: true}",
     NULL, NULL, NULL,
     "training.eval_backward: needs training.full_precision_eval (an eval-mode backward reduces in "
     "full precision only then)"},
    /* shard layouts (FSDP1 flat, FSDP2 per-parameter) */
    {"collectives", "collectives: gloo\nshard_layout: fsdp2", NULL, NULL, NULL,
     "shard_layout: must be flat or per_param, got 'fsdp2'"},
    {"collectives", "collectives: gloo\nshard_placements: [{param: 'layers.*', dim: 1}]", NULL,
     NULL, NULL,
     "shard_placements: need shard_layout: per_param (FSDP1's flat parameter has no "
     "per-parameter placement)"},
    {"collectives",
     "collectives: gloo\nshard_layout: per_param\nshard_placements: [{param: 'a*b', dim: 1}]",
     NULL, NULL, NULL, "shard_placements[0].param: '*' is only allowed at the end"},
    {"collectives",
     "collectives: gloo\nshard_layout: per_param\nshard_placements: [{param: w, dim: 9}]", NULL,
     NULL, NULL, "shard_placements[0].dim: 9 is not a tensor dim (at most 8 dims)"},
    /* DDP communication hooks (spec §6) */
    {"strategy", "strategy: no_shard\nddp_comm_hook: allreduce",
     "training",
     "training: {steps: 1, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}, "
     "gradient_divide_factor: 4}",
     NULL,
     "ddp_comm_hook: divides by the data-parallel size; training.gradient_divide_factor "
     "conflicts with it"},
    {"collectives", "collectives: gloo\nddp_comm_hook: zzz", NULL, NULL, NULL,
     "ddp_comm_hook: unknown hook 'zzz' (allreduce, fp16_compress, bf16_compress)"},
    {"collectives", "collectives: gloo\nddp_comm_hook: fp16_compress", NULL, NULL, NULL,
     "ddp_comm_hook: needs strategy no_shard (DDP-style replication)"},
    {"collectives", "collectives: gloo\nddp_comm_hook: fp16_compress", "strategy",
     "strategy: no_shard", NULL,
     "ddp_comm_hook: fp16_compress reduces in fp16; precision.reduce_dtype fp32 contradicts it"},
    /* strategy and resharding */
    {NULL, NULL, NULL, NULL, m_strategy_value, "strategy: unknown value 9"},
    {"strategy", "strategy: hybrid_shard", "mesh", "mesh: [{dim: dp_shard, size: 4}]", NULL,
     "strategy: hybrid_shard needs a dp_replicate mesh dimension"},
    {"strategy", "strategy: hybrid_shard_zero2", "mesh", "mesh: [{dim: dp_shard, size: 4}]", NULL,
     "strategy: hybrid_shard_zero2 needs a dp_replicate mesh dimension"},
    {"reshard_after_forward", "reshard_after_forward: {group_size: 0}", NULL, NULL, NULL,
     "reshard_after_forward.group_size: must be >= 1"},
    {"reshard_after_forward", "reshard_after_forward: 3", NULL, NULL, NULL,
     "reshard_after_forward.group_size: must divide the shard group size 4"},
    /* training */
    {"training", "", NULL, NULL, NULL, "training: required"},
    {"training", "training: {micro_batch_size: 4, optimizer: {sgd: {lr: 0.1}}}", NULL, NULL, NULL,
     "training.steps: must be >= 1"},
    {"training", "training: {steps: 10, micro_batch_size: 0, optimizer: {sgd: {lr: 0.1}}}", NULL,
     NULL, NULL, "training.micro_batch_size: must be >= 1"},
    {"training", "training: {steps: 10, micro_batch_size: 4}", NULL, NULL, NULL,
     "training.optimizer: required (sgd or adamw)"},
    {"training", "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 0}}}", NULL,
     NULL, NULL, "training.optimizer.sgd.lr: must be > 0"},
    {"training", "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: .inf}}}", NULL,
     NULL, NULL, "training.optimizer.sgd.lr: must be finite"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1, momentum: -0.1}}}",
     NULL, NULL, NULL, "training.optimizer.sgd.momentum: must be >= 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1, dampening: 2}}}", NULL,
     NULL, NULL, "training.optimizer.sgd.dampening: must be in [0, 1]"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1, weight_decay: -1}}}",
     NULL, NULL, NULL, "training.optimizer.sgd.weight_decay: must be >= 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 0.1, nesterov: true, "
     "dampening: 0.5}}}",
     NULL, NULL, NULL, "training.optimizer.sgd.nesterov: requires momentum > 0 and dampening 0"},
    {"training", "training: {steps: 10, micro_batch_size: 4, optimizer: {adamw: {lr: -1}}}", NULL,
     NULL, NULL, "training.optimizer.adamw.lr: must be > 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {adamw: {lr: 1, betas: [0.9]}}}", NULL,
     NULL, NULL, "training.optimizer.adamw.betas: must have 2 values (beta1, beta2)"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {adamw: {lr: 1, betas: [0.9, 1.0]}}}",
     NULL, NULL, NULL, "training.optimizer.adamw.betas[1]: must be in [0, 1)"},
    {"training", "training: {steps: 10, micro_batch_size: 4, optimizer: {adamw: {lr: 1, eps: 0}}}",
     NULL, NULL, NULL, "training.optimizer.adamw.eps: must be > 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {adamw: {lr: 1, weight_decay: -0.1}}}",
     NULL, NULL, NULL, "training.optimizer.adamw.weight_decay: must be >= 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, clip_grad_norm: -1}",
     NULL, NULL, NULL, "training.clip_grad_norm: must be >= 0 (0 = off)"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, grad_scaler: "
     "{init_scale: 0}}",
     NULL, NULL, NULL, "training.grad_scaler.init_scale: must be > 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, grad_scaler: "
     "{growth_factor: 1}}",
     NULL, NULL, NULL, "training.grad_scaler.growth_factor: must be > 1"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, grad_scaler: "
     "{backoff_factor: 1}}",
     NULL, NULL, NULL, "training.grad_scaler.backoff_factor: must be in (0, 1)"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, grad_scaler: "
     "{growth_interval: 0}}",
     NULL, NULL, NULL, "training.grad_scaler.growth_interval: must be >= 1"},
    {NULL, NULL, NULL, NULL, m_loss_value, "training.loss: unknown value 9"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, loss: cross_entropy}",
     "model", "model: {mlp: {input_dim: 4, hidden_dims: [4], output_dim: 1}}", NULL,
     "training.loss: cross_entropy needs model.mlp.output_dim >= 2 classes"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, prefetch: 17}", NULL,
     NULL, NULL, "training.prefetch: must be <= 16"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, "
     "gradient_divide_factor: 0}",
     NULL, NULL, NULL, "training.gradient_divide_factor: must be > 0"},
    {"training",
     "training: {steps: 10, micro_batch_size: 4, optimizer: {sgd: {lr: 1}}, "
     "gradient_divide_factor: .inf}",
     NULL, NULL, NULL, "training.gradient_divide_factor: must be finite"},
    /* data, init, checkpoint, elastic, pipeline, backend */
    {NULL, NULL, NULL, NULL, m_task_value, "data.synthetic.task: unknown value 9"},
    {"data", "data: {file: {inputs: x, targets: y}}", NULL, NULL, NULL, "data.file.path: required"},
    {"data", "data: {file: {path: d.npy, targets: y}}", NULL, NULL, NULL,
     "data.file.inputs: required (tensor name of the inputs)"},
    {"data", "data: {file: {path: d.npy, inputs: x}}", NULL, NULL, NULL,
     "data.file.targets: required (tensor name of the targets)"},
    {"init", "init: {from: weights.pt}", NULL, NULL, NULL,
     "init.from: must be a .safetensors file"},
    {"init", "init: {from: ../../etc/w.safetensors}", NULL, NULL, NULL,
     "init.from: '../../etc/w.safetensors' climbs above where it starts ('..')"},
    {"data", "data: {file: {path: 'a/../../b.safetensors', inputs: x, targets: y}}", NULL, NULL,
     NULL, "data.file.path: 'a/../../b.safetensors' climbs above where it starts ('..')"},
    {"checkpoint", "checkpoint: {dir: 'x/../../shared'}", NULL, NULL, NULL,
     "checkpoint.dir: 'x/../../shared' climbs above where it starts ('..')"},
    {"checkpoint", "checkpoint: {every_steps: 5}", NULL, NULL, NULL,
     "checkpoint.every_steps: requires checkpoint.dir"},
    {"checkpoint", "checkpoint: {keep_last: 3}", NULL, NULL, NULL,
     "checkpoint.keep_last: requires checkpoint.dir"},
    {"elastic", "elastic: {min_workers: 9, max_workers: 8}", NULL, NULL, NULL,
     "elastic.min_workers: must be <= max_workers"},
    {"elastic", "elastic: {min_workers: 9}", NULL, NULL, NULL,
     "elastic.min_workers: must be <= the world size 8 of the mesh"},
    {"elastic", "elastic: {min_workers: 2, max_workers: 4}", NULL, NULL, NULL,
     "elastic.max_workers: must be >= the world size 8 of the mesh"},
    {"pipeline", "pipeline: {schedule: zigzag}", NULL, NULL, NULL,
     "pipeline.schedule: unknown schedule 'zigzag' (gpipe, 1f1b, interleaved_1f1b, looped_bfs, "
     "interleaved_zero_bubble)"},
    {"pipeline", "pipeline: {schedule: gpipe, virtual_stages: 2}", NULL, NULL, NULL,
     "pipeline.virtual_stages: gpipe runs one stage per rank"},
    {"backend", "backend: tpu", NULL, NULL, NULL, "backend: must be cpu or cuda, got 'tpu'"},
    {"collectives", "collectives: mpi", NULL, NULL, NULL,
     "collectives: must be auto, nccl or gloo, got 'mpi'"},
    {"collectives", "collectives: nccl", NULL, NULL, NULL,
     "collectives: nccl needs backend: cuda (NCCL reduces device buffers)"},
};
#define N_ROWS (sizeof rows / sizeof rows[0])

// ---- helpers ------------------------------------------------------------------------------------

static job_t *build(const row_t *r)
{
    char doc[8192];
    size_t n = 0;
    for (size_t i = 0; i < N_BASE; i++) {
        const char *y = base[i].yaml;
        if (r && r->key1 && !strcmp(r->key1, base[i].key))
            y = r->yaml1;
        if (r && r->key2 && !strcmp(r->key2, base[i].key))
            y = r->yaml2;
        n += (size_t)snprintf(doc + n, sizeof doc - n, "%s\n", y);
        assert_true(n < sizeof doc);
    }
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(doc, n, &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        fail_msg("row YAML does not parse: %s\n%s", pcs_last_error(), doc);
    job_t *j = (job_t *)m;
    if (r && r->mutate)
        r->mutate(j);
    return j;
}

static void free_job(job_t *j)
{
    protobuf_c_message_free_unpacked(&j->base, NULL);
}

// ---- tests --------------------------------------------------------------------------------------

static void test_base_spec_is_valid(void **state)
{
    (void)state;
    job_t *j = build(NULL);
    char err[256];
    if (pcs_job_validate(j, err, sizeof err) != PCS_OK)
        fail_msg("base spec rejected: %s", err);
    assert_string_equal(err, "");
    free_job(j);
    /* A cuda job may pick either transport (gloo stages through host memory). */
    const char *colls[] = {"collectives: nccl", "collectives: gloo", "collectives: auto"};
    for (size_t i = 0; i < 3; i++) {
        row_t c = {"backend", "backend: cuda", "collectives", colls[i], NULL, NULL};
        j = build(&c);
        if (pcs_job_validate(j, err, sizeof err) != PCS_OK)
            fail_msg("cuda job with %s rejected: %s", colls[i], err);
        free_job(j);
    }
    /* Worker programs: pcs-worker, the Python package, a C API program's own name. */
    const char *progs[] = {"program: pcs-worker", "program: pcs.torch", "program: my_trainer-2"};
    for (size_t i = 0; i < 3; i++) {
        row_t c = {"collectives", progs[i], NULL, NULL, NULL, NULL};
        j = build(&c);
        if (pcs_job_validate(j, err, sizeof err) != PCS_OK)
            fail_msg("%s rejected: %s", progs[i], err);
        free_job(j);
    }
    /* The explicit model of the table is valid too. */
    row_t r = {"model", EXPLICIT_MODEL, "wrap", "wrap: {explicit: [enc, head]}", NULL, NULL};
    j = build(&r);
    if (pcs_job_validate(j, err, sizeof err) != PCS_OK)
        fail_msg("explicit base rejected: %s", err);
    free_job(j);
}

static void test_each_rule_row_gives_its_exact_error(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS; i++) {
        job_t *j = build(&rows[i]);
        char err[512];
        pcs_status_t rc = pcs_job_validate(j, err, sizeof err);
        if (rc != PCS_ERR_INVALID_ARG)
            fail_msg("row %zu (%s): accepted, expected '%s'", i, rows[i].expect, rows[i].expect);
        if (strcmp(err, rows[i].expect))
            fail_msg("row %zu: got '%s', expected '%s'", i, err, rows[i].expect);
        assert_string_equal(pcs_last_error(), rows[i].expect);
        free_job(j);
    }
}

static void test_rows_are_distinct_rules(void **state)
{
    (void)state;
    /* One row per rule: no two rows expect the same message. */
    for (size_t i = 0; i < N_ROWS; i++)
        for (size_t k = i + 1; k < N_ROWS; k++)
            if (!strcmp(rows[i].expect, rows[k].expect))
                fail_msg("rows %zu and %zu test the same rule '%s'", i, k, rows[i].expect);
}

static void test_shipped_examples_are_valid(void **state)
{
    (void)state;
    const char *files[] = {"examples/demo-job.yaml", "examples/tiny-job.yaml",
                           "examples/hsdp-job.yaml", "examples/fp16-explicit-job.json"};
    const uint32_t world[] = {4, 2, 4, 2};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char buf[1024], err[256];
        ProtobufCMessage *m = NULL;
        if (pcs_pb_from_yaml_file(pcs_test_src(files[i], buf, sizeof buf),
                                  &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
            fail_msg("%s: %s", files[i], pcs_last_error());
        if (pcs_job_validate((job_t *)m, err, sizeof err) != PCS_OK)
            fail_msg("%s: %s", files[i], err);
        assert_int_equal(pcs_job_world_size((job_t *)m), world[i]);
        protobuf_c_message_free_unpacked(m, NULL);
    }
}

static void test_first_error_in_field_order_wins(void **state)
{
    (void)state;
    row_t r = {"training", "", "mesh", "mesh: [{dim: pp, size: 0}]", NULL, NULL};
    job_t *j = build(&r);
    char err[256];
    assert_int_equal(pcs_job_validate(j, err, sizeof err), PCS_ERR_INVALID_ARG);
    assert_string_equal(err, "mesh[0].size: must be >= 1");
    free_job(j);
}

static void test_null_spec_and_null_err_buffer(void **state)
{
    (void)state;
    char err[64];
    assert_int_equal(pcs_job_validate(NULL, err, sizeof err), PCS_ERR_INVALID_ARG);
    assert_string_equal(err, "spec: required");
    row_t r = {"backend", "backend: gpu", NULL, NULL, NULL, NULL};
    job_t *j = build(&r);
    assert_int_equal(pcs_job_validate(j, NULL, 0), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "backend: must be cpu or cuda, got 'gpu'");
    /* A short buffer is truncated, never overrun. */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    assert_int_equal(pcs_job_validate(j, tiny, 5), PCS_ERR_INVALID_ARG);
    assert_string_equal(tiny, "back");
    assert_int_equal(tiny[5], 'x');
    free_job(j);
}

static void test_world_size_is_the_mesh_product(void **state)
{
    (void)state;
    job_t *j = build(NULL);
    assert_int_equal(pcs_job_world_size(j), 8);
    free_job(j);
    Pcs__V1__JobSpec empty = PCS__V1__JOB_SPEC__INIT;
    assert_int_equal(pcs_job_world_size(&empty), 1);
    assert_int_equal(pcs_job_world_size(NULL), 1);
    Pcs__V1__MeshDim a = PCS__V1__MESH_DIM__INIT, b = PCS__V1__MESH_DIM__INIT,
                     c = PCS__V1__MESH_DIM__INIT;
    a.size = 65536;
    b.size = 65536;
    c.size = 3;
    Pcs__V1__MeshDim *dims[] = {&a, &b, &c};
    empty.n_mesh = 3;
    empty.mesh = dims;
    assert_int_equal(pcs_job_world_size(&empty), UINT32_MAX); /* saturates */
    empty.n_mesh = 1;
    c.size = 0;
    dims[0] = &c;
    assert_int_equal(pcs_job_world_size(&empty), 1);
}

static void test_large_explicit_model_is_checked_in_linear_time(void **state)
{
    (void)state;
    /* 50k modules x 2 params: a quadratic duplicate check would take minutes here. */
    const size_t n = 50000;
    size_t cap = n * 128 + 4096, len = 0;
    char *doc = malloc(cap);
    assert_non_null(doc);
    len += (size_t)snprintf(doc + len, cap - len,
                            "training: {steps: 1, micro_batch_size: 1, optimizer: {sgd: {lr: 1}}}\n"
                            "model:\n  explicit:\n");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(doc + len, cap - len,
                                "    - {path: blocks.%zu, params: [{name: w, shape: [4, 4]}, "
                                "{name: b, shape: [4]}]}\n",
                                i);
    ProtobufCMessage *m = NULL;
    if (pcs_pb_from_yaml(doc, len, &pcs__v1__job_spec__descriptor, &m) != PCS_OK)
        fail_msg("%s", pcs_last_error());
    job_t *j = (job_t *)m;
    char err[256];
    if (pcs_job_validate(j, err, sizeof err) != PCS_OK)
        fail_msg("%s", err);
    /* The last module repeats the first one's path: found, and named by its index. */
    Pcs__V1__ModuleDecl *last = j->model->explicit_->modules[n - 1];
    free(last->path);
    last->path = strdup("blocks.0");
    assert_int_equal(pcs_job_validate(j, err, sizeof err), PCS_ERR_INVALID_ARG);
    char want[128];
    snprintf(want, sizeof want,
             "model.explicit.modules[%zu].path: duplicate module path 'blocks.0'", n - 1);
    assert_string_equal(err, want);
    free_job(j);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_spec_is_valid),
        cmocka_unit_test(test_each_rule_row_gives_its_exact_error),
        cmocka_unit_test(test_rows_are_distinct_rules),
        cmocka_unit_test(test_shipped_examples_are_valid),
        cmocka_unit_test(test_first_error_in_field_order_wins),
        cmocka_unit_test(test_null_spec_and_null_err_buffer),
        cmocka_unit_test(test_world_size_is_the_mesh_product),
        cmocka_unit_test(test_large_explicit_model_is_checked_in_linear_time),
    };
    return cmocka_run_group_tests_name("validate", tests, NULL, NULL);
}
