/* Job spec validation (validate.h): one check per rule, run in field order, stopping at the first
 * broken rule so that the message names exactly one field path. The rules come from
 * DESIGN.md §5 and spec/fsdp-semantics.md §1-§3 (torch.optim and ShardedGradScaler bounds, the
 * FSDP2 reshard_after_forward group rule, floating-only parameter dtypes). Pure C over the
 * protobuf-c structs; tests/unit/test_validate.c has one row per rule. */
#include "planner/validate.h"

#include "pcs/dtype.h"
#include "pcs/file.h"
#include "pcs/strmap.h"
#include "pcs/utf8.h"
#include "planner/model_tree.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME_LEN       128
#define MAX_MLP_LAYERS     4096
#define MAX_PREFETCH       16
#define MAX_TENSOR_ELEMS   (1ull << 48)
#define MAX_PATH_LEN       768 /* module paths: FQNs (path + local name) fit 1 KiB buffers */
#define MAX_LOCAL_NAME_LEN 128

// ---- string sets (duplicate FQNs / module paths in O(n)): pcs/strmap.h, owning its keys ------

enum { KIND_MODULE = 1, KIND_PARAM = 2, KIND_BUFFER = 3 }; /* what a key of a set names */

/* Kind of `key` in the set, 0 if absent. */
static int kind_of(const pcs_strmap_t *s, const char *key)
{
    uint32_t kind = 0;
    return pcs_strmap_get(s, key, &kind) ? (int)kind : 0;
}

// ---- context and small helpers ------------------------------------------------------------------

typedef struct vctx {
    char *err;
    size_t errlen;
    pcs_strmap_t modules; /* module paths of an explicit model, as declared */
    pcs_strmap_t tree;    /* every module path of the model, implicit ancestors included */
    pcs_strmap_t tensors; /* parameter and buffer FQNs of an explicit model */
    int explicit_model;
} vctx_t;

__attribute__((format(printf, 2, 3))) static pcs_status_t bad(vctx_t *v, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (v->err && v->errlen)
        snprintf(v->err, v->errlen, "%s", msg);
    return pcs_set_error(PCS_ERR_INVALID_ARG, "%s", msg);
}

static const char *dtype_str(int d)
{
    return pcs_dtype_name((pcs_dtype_t)d);
}

static int enum_known(const ProtobufCEnumDescriptor *d, int value)
{
    return protobuf_c_enum_descriptor_get_value(d, value) != NULL;
}

/* A dtype field of a precision policy or a parameter: unset (0) or a floating dtype. */
static pcs_status_t float_dtype(vctx_t *v, const char *path, int d)
{
    if (d == 0)
        return PCS_OK;
    if (!enum_known(&pcs__v1__dtype__descriptor, d))
        return bad(v, "%s: unknown dtype value %d", path, d);
    if (!pcs_dtype_is_float((pcs_dtype_t)d))
        return bad(v, "%s: %s is not a floating dtype", path, dtype_str(d));
    return PCS_OK;
}

/* Module path: "" (the root) or dot-separated non-empty names without blanks or '*'. */
static int valid_module_path(const char *p)
{
    if (!*p)
        return 1;
    size_t comp = 0;
    for (const char *s = p;; s++) {
        if (*s == '.' || *s == '\0') {
            if (comp == 0)
                return 0;
            comp = 0;
            if (*s == '\0')
                return 1;
            continue;
        }
        if (*s == '*' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
            return 0;
        comp++;
    }
}

static void fqn(char *buf, size_t n, const char *path, const char *name)
{
    snprintf(buf, n, "%s%s%s", path, *path ? "." : "", name);
}

static const Pcs__V1__MeshDim *mesh_dim(const Pcs__V1__JobSpec *s, Pcs__V1__MeshDimName dim)
{
    for (size_t i = 0; i < s->n_mesh; i++)
        if (s->mesh[i] && s->mesh[i]->dim == dim)
            return s->mesh[i];
    return NULL;
}

/* A double that must be a finite number > 0 (lr, eps, init_scale). */
static pcs_status_t positive(vctx_t *v, const char *path, double x)
{
    if (isinf(x))
        return bad(v, "%s: must be finite", path);
    if (!(x > 0))
        return bad(v, "%s: must be > 0", path);
    return PCS_OK;
}

static pcs_status_t non_negative(vctx_t *v, const char *path, double x)
{
    if (isinf(x))
        return bad(v, "%s: must be finite", path);
    if (!(x >= 0))
        return bad(v, "%s: must be >= 0", path);
    return PCS_OK;
}

// ---- model --------------------------------------------------------------------------------------

static pcs_status_t check_mlp(vctx_t *v, const Pcs__V1__MlpModel *m)
{
    if (m->input_dim < 1)
        return bad(v, "model.mlp.input_dim: must be >= 1");
    if (m->n_hidden_dims == 0)
        return bad(v, "model.mlp.hidden_dims: required");
    if (m->n_hidden_dims > MAX_MLP_LAYERS)
        return bad(v, "model.mlp.hidden_dims: at most %d layers", MAX_MLP_LAYERS);
    for (size_t i = 0; i < m->n_hidden_dims; i++)
        if (m->hidden_dims[i] < 1)
            return bad(v, "model.mlp.hidden_dims[%zu]: must be >= 1", i);
    if (m->output_dim < 1)
        return bad(v, "model.mlp.output_dim: must be >= 1");
    /* Weights and biases of every layer: dims are uint32, so each product fits in uint64; the
     * running sum is checked before it can overflow. */
    uint64_t params = 0, in = m->input_dim;
    for (size_t i = 0; i <= m->n_hidden_dims; i++) {
        uint64_t out = i < m->n_hidden_dims ? m->hidden_dims[i] : m->output_dim;
        uint64_t layer = in * out + out;
        if (layer > MAX_TENSOR_ELEMS || params > MAX_TENSOR_ELEMS - layer)
            return bad(v, "model.mlp: more than 2^48 parameters");
        params += layer;
        in = out;
    }
    if (!enum_known(&pcs__v1__activation__descriptor, m->activation))
        return bad(v, "model.mlp.activation: unknown value %d", (int)m->activation);
    if (!enum_known(&pcs__v1__norm__descriptor, m->norm))
        return bad(v, "model.mlp.norm: unknown value %d", (int)m->norm);
    return PCS_OK;
}

static pcs_status_t check_tensor(vctx_t *v, const char *mpath, const char *what, size_t i, size_t j,
                                 const Pcs__V1__TensorDecl *t, int is_param)
{
    char p[160], full[1024];
    snprintf(p, sizeof p, "model.explicit.modules[%zu].%s[%zu]", i, what, j);
    if (!t)
        return bad(v, "%s: required", p);
    if (!t->name || !*t->name)
        return bad(v, "%s.name: required", p);
    if (strchr(t->name, '.'))
        return bad(v, "%s.name: '%s' must be a local name without '.'", p, t->name);
    if (strlen(t->name) > MAX_LOCAL_NAME_LEN)
        return bad(v, "%s.name: longer than %d characters", p, MAX_LOCAL_NAME_LEN);
    if (is_param && t->n_shape == 0)
        return bad(v, "%s.shape: required (scalar parameters are not supported)", p);
    uint64_t numel = 1;
    for (size_t k = 0; k < t->n_shape; k++) {
        if (t->shape[k] < 1)
            return bad(v, "%s.shape[%zu]: must be >= 1", p, k);
        if (t->shape[k] > MAX_TENSOR_ELEMS || numel > MAX_TENSOR_ELEMS / t->shape[k])
            return bad(v, "%s.shape: more than 2^48 elements", p);
        numel *= t->shape[k];
    }
    char dp[200];
    snprintf(dp, sizeof dp, "%s.dtype", p);
    if (is_param) {
        PCS_CHECK(float_dtype(v, dp, t->dtype));
    } else if (!enum_known(&pcs__v1__dtype__descriptor, t->dtype)) {
        return bad(v, "%s: unknown dtype value %d", dp, (int)t->dtype);
    }
    fqn(full, sizeof full, mpath, t->name);
    if (kind_of(&v->tensors, full))
        return bad(v, "%s.name: duplicate FQN '%s'", p, full);
    return pcs_strmap_put(&v->tensors, full, is_param ? KIND_PARAM : KIND_BUFFER);
}

static pcs_status_t check_explicit(vctx_t *v, const Pcs__V1__ExplicitModel *e)
{
    if (e->n_modules == 0)
        return bad(v, "model.explicit.modules: required");
    size_t ntensors = 0;
    for (size_t i = 0; i < e->n_modules; i++)
        if (e->modules[i])
            ntensors += e->modules[i]->n_params + e->modules[i]->n_buffers;
    PCS_CHECK(pcs_strmap_reserve(&v->modules, e->n_modules));
    PCS_CHECK(pcs_strmap_reserve(&v->tensors, ntensors));
    for (size_t i = 0; i < e->n_modules; i++) {
        const Pcs__V1__ModuleDecl *m = e->modules[i];
        if (!m)
            return bad(v, "model.explicit.modules[%zu]: required", i);
        const char *path = m->path ? m->path : "";
        if (strlen(path) > MAX_PATH_LEN)
            return bad(v, "model.explicit.modules[%zu].path: longer than %d characters", i,
                       MAX_PATH_LEN);
        if (!valid_module_path(path))
            return bad(v, "model.explicit.modules[%zu].path: '%s' is not a module path", i, path);
        if (kind_of(&v->modules, path))
            return bad(v, "model.explicit.modules[%zu].path: duplicate module path '%s'", i,
                       *path ? path : "(root)");
        PCS_CHECK(pcs_strmap_put(&v->modules, path, KIND_MODULE));
        for (size_t j = 0; j < m->n_params; j++)
            PCS_CHECK(check_tensor(v, path, "params", i, j, m->params[j], 1));
        for (size_t j = 0; j < m->n_buffers; j++)
            PCS_CHECK(check_tensor(v, path, "buffers", i, j, m->buffers[j], 0));
    }
    /* Shared parameters point at parameters that may be declared later in the list. */
    for (size_t i = 0; i < e->n_modules; i++) {
        const Pcs__V1__ModuleDecl *m = e->modules[i];
        for (size_t k = 0; k < m->n_shared; k++) {
            const Pcs__V1__SharedParam *sp = m->shared[k];
            char full[1024];
            if (!sp || !sp->name || !*sp->name)
                return bad(v, "model.explicit.modules[%zu].shared[%zu].name: required", i, k);
            if (strchr(sp->name, '.') || strlen(sp->name) > MAX_LOCAL_NAME_LEN)
                return bad(v,
                           "model.explicit.modules[%zu].shared[%zu].name: must be a local name "
                           "(no '.', at most %d characters)",
                           i, k, MAX_LOCAL_NAME_LEN);
            fqn(full, sizeof full, m->path ? m->path : "", sp->name);
            if (kind_of(&v->tensors, full))
                return bad(v,
                           "model.explicit.modules[%zu].shared[%zu].name: '%s' is also declared "
                           "as a parameter or buffer",
                           i, k, full);
            if (!sp->shares || !*sp->shares)
                return bad(v, "model.explicit.modules[%zu].shared[%zu].shares: required", i, k);
            if (kind_of(&v->tensors, sp->shares) != KIND_PARAM)
                return bad(v, "model.explicit.modules[%zu].shared[%zu].shares: no parameter '%s'",
                           i, k, sp->shares);
        }
    }
    return PCS_OK;
}

/* Add `path` and its ancestors ("a.b.c" -> "a.b", "a", "") to v->tree. */
static pcs_status_t tree_add(vctx_t *v, const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (;;) {
        if (kind_of(&v->tree, buf))
            return PCS_OK; /* its ancestors are in already */
        PCS_CHECK(pcs_strmap_put(&v->tree, buf, KIND_MODULE));
        char *dot = strrchr(buf, '.');
        if (!dot) {
            if (!buf[0])
                return PCS_OK;
            buf[0] = '\0';
        } else {
            *dot = '\0';
        }
    }
}

/* The module paths wrap and precision may name: the MLP scheme of planner/model_tree.h, or the
 * explicit modules with their implicit ancestors. Called on a valid model. */
static pcs_status_t build_tree(vctx_t *v, const Pcs__V1__ModelSpec *m)
{
    char path[64];
    if (m->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP) {
        const Pcs__V1__MlpModel *mlp = m->mlp;
        PCS_CHECK(pcs_strmap_reserve(&v->tree, 3 + 4 * mlp->n_hidden_dims));
        PCS_CHECK(tree_add(v, "head"));
        PCS_CHECK(tree_add(v, "layers"));
        int norm = mlp->norm == PCS__V1__NORM__NORM_LAYERNORM ||
                   mlp->norm == PCS__V1__NORM__NORM_BATCHNORM;
        for (size_t i = 0; i < mlp->n_hidden_dims; i++) {
            snprintf(path, sizeof path, "layers.%zu.linear", i);
            PCS_CHECK(tree_add(v, path));
            snprintf(path, sizeof path, "layers.%zu.act", i);
            PCS_CHECK(tree_add(v, path));
            if (norm) {
                snprintf(path, sizeof path, "layers.%zu.norm", i);
                PCS_CHECK(tree_add(v, path));
            }
        }
        return PCS_OK;
    }
    const Pcs__V1__ExplicitModel *e = m->explicit_;
    size_t n = 1;
    for (size_t i = 0; i < e->n_modules; i++) {
        n++;
        for (const char *c = e->modules[i]->path; c && *c; c++)
            n += *c == '.';
    }
    PCS_CHECK(pcs_strmap_reserve(&v->tree, n));
    for (size_t i = 0; i < e->n_modules; i++)
        PCS_CHECK(tree_add(v, e->modules[i]->path ? e->modules[i]->path : ""));
    return PCS_OK;
}

/* Does a module path, or with a trailing '*' a path prefix, name a module of the model? */
static int tree_matches(const vctx_t *v, const char *pattern)
{
    size_t n = strlen(pattern);
    if (n == 0 || pattern[n - 1] != '*')
        return kind_of(&v->tree, pattern) != 0;
    for (size_t i = 0; i < v->tree.cap; i++) /* every key of the set: its table's slots */
        if (v->tree.keys[i] && !strncmp(v->tree.keys[i], pattern, n - 1))
            return 1;
    return 0;
}

static pcs_status_t check_model(vctx_t *v, const Pcs__V1__ModelSpec *m)
{
    if (!m || m->kind_case == PCS__V1__MODEL_SPEC__KIND__NOT_SET ||
        (m->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP && !m->mlp) ||
        (m->kind_case == PCS__V1__MODEL_SPEC__KIND_EXPLICIT && !m->explicit_))
        return bad(v, "model: required (mlp or explicit)");
    if (m->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP)
        PCS_CHECK(check_mlp(v, m->mlp));
    else
        PCS_CHECK(check_explicit(v, m->explicit_));
    return build_tree(v, m);
}

// ---- wrap and precision -------------------------------------------------------------------------

static pcs_status_t check_wrap(vctx_t *v, const Pcs__V1__WrapSpec *w)
{
    if (!w)
        return PCS_OK;
    switch (w->policy_case) {
    case PCS__V1__WRAP_SPEC__POLICY_SIZE_BASED:
        if (!w->size_based || w->size_based->min_num_params < 1)
            return bad(v, "wrap.size_based.min_num_params: must be >= 1");
        break;
    case PCS__V1__WRAP_SPEC__POLICY_MODULE_CLASS:
        if (!w->module_class || w->module_class->n_classes == 0)
            return bad(v, "wrap.module_class.classes: required");
        for (size_t i = 0; i < w->module_class->n_classes; i++)
            if (!w->module_class->classes[i] || !*w->module_class->classes[i])
                return bad(v, "wrap.module_class.classes[%zu]: must not be empty", i);
        break;
    case PCS__V1__WRAP_SPEC__POLICY_EXPLICIT: {
        if (!w->explicit_ || w->explicit_->n_paths == 0)
            return bad(v, "wrap.explicit.paths: required");
        pcs_strmap_t seen = PCS_STRMAP_OWNED;
        PCS_CHECK(pcs_strmap_reserve(&seen, w->explicit_->n_paths));
        pcs_status_t rc = PCS_OK;
        for (size_t i = 0; i < w->explicit_->n_paths && rc == PCS_OK; i++) {
            const char *p = w->explicit_->paths[i] ? w->explicit_->paths[i] : "";
            if (!*p)
                rc = bad(v,
                         "wrap.explicit.paths[%zu]: must not be empty (the root is always a "
                         "unit)",
                         i);
            else if (!valid_module_path(p))
                rc = bad(v, "wrap.explicit.paths[%zu]: '%s' is not a module path", i, p);
            else if (kind_of(&seen, p))
                rc = bad(v, "wrap.explicit.paths[%zu]: '%s' given twice", i, p);
            else if (!kind_of(&v->tree, p))
                rc = bad(v, "wrap.explicit.paths[%zu]: no module '%s' in the model", i, p);
            else
                rc = pcs_strmap_put(&seen, p, KIND_MODULE);
        }
        pcs_strmap_free(&seen);
        PCS_CHECK(rc);
        break;
    }
    default:
        break;
    }
    for (size_t i = 0; i < w->n_ignored_module_classes; i++) {
        const char *c = w->ignored_module_classes[i];
        if (!c || !*c)
            return bad(v, "wrap.ignored_module_classes[%zu]: must not be empty", i);
        if (!strcmp(c, "none") && w->n_ignored_module_classes > 1)
            return bad(v, "wrap.ignored_module_classes: 'none' must be the only entry");
    }
    return PCS_OK;
}

/* `what`[i].match of an override (precision.overrides, strategy_overrides). */
static pcs_status_t check_match(vctx_t *v, const char *what, size_t i,
                                const Pcs__V1__OverrideMatch *m)
{
    if (!m || ((!m->module_class || !*m->module_class) && (!m->path || !*m->path)))
        return bad(v, "%s[%zu].match: required (module_class or path)", what, i);
    const char *mp = m->path ? m->path : "";
    const char *star = strchr(mp, '*');
    if (star && star[1] != '\0')
        return bad(v, "%s[%zu].match.path: '*' is only allowed at the end", what, i);
    /* A path that matches nothing is a typo that would silently change nothing. */
    if (*mp && !tree_matches(v, mp))
        return bad(v, "%s[%zu].match.path: no module matches '%s'", what, i, mp);
    return PCS_OK;
}

static pcs_status_t check_override(vctx_t *v, size_t i, const Pcs__V1__PrecisionOverride *o)
{
    char p[160];
    PCS_CHECK(check_match(v, "precision.overrides", i, o ? o->match : NULL));
    const struct {
        const char *name;
        int value;
    } d[] = {{"param_dtype", o->param_dtype},
             {"reduce_dtype", o->reduce_dtype},
             {"buffer_dtype", o->buffer_dtype},
             {"output_dtype", o->output_dtype}};
    for (size_t k = 0; k < 4; k++) {
        snprintf(p, sizeof p, "precision.overrides[%zu].%s", i, d[k].name);
        PCS_CHECK(float_dtype(v, p, d[k].value));
    }
    if (o->full_precision) {
        for (size_t k = 0; k < 3; k++) /* output_dtype stays usable (FSDP2 BatchNorm fix) */
            if (d[k].value)
                return bad(v, "precision.overrides[%zu].full_precision: conflicts with %s", i,
                           d[k].name);
    }
    return PCS_OK;
}

static pcs_status_t check_precision(vctx_t *v, const Pcs__V1__PrecisionSpec *p)
{
    if (!p)
        return PCS_OK;
    PCS_CHECK(float_dtype(v, "precision.param_dtype", p->param_dtype));
    PCS_CHECK(float_dtype(v, "precision.reduce_dtype", p->reduce_dtype));
    PCS_CHECK(float_dtype(v, "precision.buffer_dtype", p->buffer_dtype));
    PCS_CHECK(float_dtype(v, "precision.output_dtype", p->output_dtype));
    PCS_CHECK(float_dtype(v, "precision.master_dtype", p->master_dtype));
    for (size_t i = 0; i < p->n_overrides; i++)
        PCS_CHECK(check_override(v, i, p->overrides[i]));
    return PCS_OK;
}

// ---- mesh, strategy, resharding -----------------------------------------------------------------

static pcs_status_t check_mesh(vctx_t *v, const Pcs__V1__JobSpec *s)
{
    uint64_t world = 1;
    for (size_t i = 0; i < s->n_mesh; i++) {
        const Pcs__V1__MeshDim *m = s->mesh[i];
        if (!m || m->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_UNSPECIFIED)
            return bad(v, "mesh[%zu].dim: required (pp, dp_replicate or dp_shard)", i);
        if (!enum_known(&pcs__v1__mesh_dim_name__descriptor, m->dim))
            return bad(v, "mesh[%zu].dim: unknown value %d", i, (int)m->dim);
        if (m->size < 1)
            return bad(v, "mesh[%zu].size: must be >= 1", i);
        for (size_t j = 0; j < i; j++)
            if (s->mesh[j]->dim == m->dim) {
                const char *nm = m->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_PP ? "pp"
                                 : m->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE
                                     ? "dp_replicate"
                                     : "dp_shard";
                return bad(v, "mesh: dimension %s given twice", nm);
            }
        world *= m->size; /* <= 3 dims of uint32: no overflow in uint64 before the check */
        if (world > PCS_JOB_MAX_WORLD)
            return bad(v, "mesh: world size exceeds %u", PCS_JOB_MAX_WORLD);
    }
    return PCS_OK;
}

static pcs_status_t check_strategy(vctx_t *v, const Pcs__V1__JobSpec *s)
{
    if (!enum_known(&pcs__v1__strategy__descriptor, s->strategy))
        return bad(v, "strategy: unknown value %d", (int)s->strategy);
    if ((s->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD ||
         s->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2) &&
        !mesh_dim(s, PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE))
        return bad(v, "strategy: %s needs a dp_replicate mesh dimension",
                   s->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD ? "hybrid_shard"
                                                                           : "hybrid_shard_zero2");
    const Pcs__V1__ReshardAfterForward *r = s->reshard_after_forward;
    if (r && r->value_case == PCS__V1__RESHARD_AFTER_FORWARD__VALUE_GROUP_SIZE) {
        if (r->group_size < 1)
            return bad(v, "reshard_after_forward.group_size: must be >= 1");
        const Pcs__V1__MeshDim *sh = mesh_dim(s, PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD);
        uint32_t shard = sh ? sh->size : 1;
        if (shard % r->group_size != 0)
            return bad(v, "reshard_after_forward.group_size: must divide the shard group size %u",
                       shard);
    }
    return PCS_OK;
}

// ---- training -----------------------------------------------------------------------------------

static pcs_status_t check_sgd(vctx_t *v, const Pcs__V1__SgdOptimizer *o)
{
    PCS_CHECK(positive(v, "training.optimizer.sgd.lr", o->lr));
    if (o->momentum)
        PCS_CHECK(non_negative(v, "training.optimizer.sgd.momentum", o->momentum->value));
    if (o->dampening && !(o->dampening->value >= 0 && o->dampening->value <= 1))
        return bad(v, "training.optimizer.sgd.dampening: must be in [0, 1]");
    if (o->weight_decay)
        PCS_CHECK(non_negative(v, "training.optimizer.sgd.weight_decay", o->weight_decay->value));
    double momentum = o->momentum ? o->momentum->value : 0.9; /* proto defaults */
    double dampening = o->dampening ? o->dampening->value : 0.0;
    if (o->nesterov && (momentum <= 0 || dampening != 0))
        return bad(v, "training.optimizer.sgd.nesterov: requires momentum > 0 and dampening 0");
    return PCS_OK;
}

static pcs_status_t check_adamw(vctx_t *v, const Pcs__V1__AdamWOptimizer *o)
{
    PCS_CHECK(positive(v, "training.optimizer.adamw.lr", o->lr));
    if (o->n_betas != 0 && o->n_betas != 2)
        return bad(v, "training.optimizer.adamw.betas: must have 2 values (beta1, beta2)");
    for (size_t i = 0; i < o->n_betas; i++)
        if (!(o->betas[i] >= 0 && o->betas[i] < 1))
            return bad(v, "training.optimizer.adamw.betas[%zu]: must be in [0, 1)", i);
    if (o->eps)
        PCS_CHECK(positive(v, "training.optimizer.adamw.eps", o->eps->value));
    if (o->weight_decay)
        PCS_CHECK(non_negative(v, "training.optimizer.adamw.weight_decay", o->weight_decay->value));
    return PCS_OK;
}

static pcs_status_t check_scaler(vctx_t *v, const Pcs__V1__GradScalerSpec *g)
{
    if (!g)
        return PCS_OK;
    if (g->init_scale)
        PCS_CHECK(positive(v, "training.grad_scaler.init_scale", g->init_scale->value));
    if (g->growth_factor && !(g->growth_factor->value > 1 && isfinite(g->growth_factor->value)))
        return bad(v, "training.grad_scaler.growth_factor: must be > 1");
    if (g->backoff_factor && !(g->backoff_factor->value > 0 && g->backoff_factor->value < 1))
        return bad(v, "training.grad_scaler.backoff_factor: must be in (0, 1)");
    if (g->growth_interval && g->growth_interval->value < 1)
        return bad(v, "training.grad_scaler.growth_interval: must be >= 1");
    return PCS_OK;
}

static pcs_status_t check_training(vctx_t *v, const Pcs__V1__JobSpec *s)
{
    const Pcs__V1__TrainingSpec *t = s->training;
    if (!t)
        return bad(v, "training: required");
    if (t->steps < 1)
        return bad(v, "training.steps: must be >= 1");
    if (t->micro_batch_size < 1)
        return bad(v, "training.micro_batch_size: must be >= 1");
    const Pcs__V1__OptimizerSpec *o = t->optimizer;
    if (!o || (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_SGD && !o->sgd) ||
        (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW && !o->adamw) ||
        o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND__NOT_SET)
        return bad(v, "training.optimizer: required (sgd or adamw)");
    if (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_SGD)
        PCS_CHECK(check_sgd(v, o->sgd));
    else
        PCS_CHECK(check_adamw(v, o->adamw));
    if (isinf(t->clip_grad_norm) || !(t->clip_grad_norm >= 0))
        return bad(v, "training.clip_grad_norm: must be >= 0 (0 = off)");
    PCS_CHECK(check_scaler(v, t->grad_scaler));
    if (!enum_known(&pcs__v1__loss__descriptor, t->loss))
        return bad(v, "training.loss: unknown value %d", (int)t->loss);
    if (t->loss == PCS__V1__LOSS__LOSS_CROSS_ENTROPY && s->model &&
        s->model->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP && s->model->mlp->output_dim < 2)
        return bad(v, "training.loss: cross_entropy needs model.mlp.output_dim >= 2 classes");
    if (t->prefetch > MAX_PREFETCH)
        return bad(v, "training.prefetch: must be <= %d", MAX_PREFETCH);
    if (t->gradient_divide_factor)
        PCS_CHECK(positive(v, "training.gradient_divide_factor", t->gradient_divide_factor->value));
    return PCS_OK;
}

// ---- data, init, checkpoint, elastic, pipeline, backend -----------------------------------------

/* A path a worker will resolve beneath one of its roots (DESIGN.md §10): what can be told here,
 * without the roots, is that its `..` never climbs above where it starts. */
static pcs_status_t path_syntax(vctx_t *v, const char *path, const char *field)
{
    if (pcs_path_check_syntax(path, field) == PCS_OK)
        return PCS_OK;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pcs_last_error());
    return bad(v, "%s", msg);
}

static pcs_status_t check_data(vctx_t *v, const Pcs__V1__DataSpec *d)
{
    if (!d)
        return PCS_OK;
    if (d->source_case == PCS__V1__DATA_SPEC__SOURCE_SYNTHETIC && d->synthetic &&
        !enum_known(&pcs__v1__synthetic_task__descriptor, d->synthetic->task))
        return bad(v, "data.synthetic.task: unknown value %d", (int)d->synthetic->task);
    if (d->source_case == PCS__V1__DATA_SPEC__SOURCE_FILE) {
        const Pcs__V1__FileData *f = d->file;
        if (!f || !f->path || !*f->path)
            return bad(v, "data.file.path: required");
        if (!f->inputs || !*f->inputs)
            return bad(v, "data.file.inputs: required (tensor name of the inputs)");
        if (!f->targets || !*f->targets)
            return bad(v, "data.file.targets: required (tensor name of the targets)");
        PCS_CHECK(path_syntax(v, f->path, "data.file.path"));
    }
    return PCS_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static pcs_status_t check_rest(vctx_t *v, const Pcs__V1__JobSpec *s)
{
    if (s->init && s->init->from && *s->init->from && !ends_with(s->init->from, ".safetensors"))
        return bad(v, "init.from: must be a .safetensors file");
    if (s->init && s->init->from && *s->init->from)
        PCS_CHECK(path_syntax(v, s->init->from, "init.from"));
    if (s->checkpoint && s->checkpoint->dir && *s->checkpoint->dir)
        PCS_CHECK(path_syntax(v, s->checkpoint->dir, "checkpoint.dir"));
    if (s->resume && (!s->resume->from || !*s->resume->from))
        return bad(v, "resume.from: required (a job's checkpoint directory, "
                      "<checkpoint.dir>/<job id>)");
    if (s->resume)
        PCS_CHECK(path_syntax(v, s->resume->from, "resume.from"));
    if (s->checkpoint && s->checkpoint->every_steps > 0 &&
        (!s->checkpoint->dir || !*s->checkpoint->dir))
        return bad(v, "checkpoint.every_steps: requires checkpoint.dir");
    if (s->checkpoint && s->checkpoint->keep_last > 0 &&
        (!s->checkpoint->dir || !*s->checkpoint->dir))
        return bad(v, "checkpoint.keep_last: requires checkpoint.dir");
    if (s->elastic && s->elastic->max_workers > 0 &&
        s->elastic->min_workers > s->elastic->max_workers)
        return bad(v, "elastic.min_workers: must be <= max_workers");
    /* The mesh gives the starting world size; elastic restarts stay within [min, max]. */
    uint32_t world = pcs_job_world_size(s);
    if (s->elastic && s->elastic->min_workers > world)
        return bad(v, "elastic.min_workers: must be <= the world size %u of the mesh", world);
    if (s->elastic && s->elastic->max_workers > 0 && s->elastic->max_workers < world)
        return bad(v, "elastic.max_workers: must be >= the world size %u of the mesh", world);
    if (s->pipeline) {
        static const char *const sched[] = {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs",
                                            "interleaved_zero_bubble"};
        const char *sc = s->pipeline->schedule ? s->pipeline->schedule : "";
        int known = !*sc;
        for (size_t i = 0; i < sizeof sched / sizeof sched[0]; i++)
            known |= !strcmp(sc, sched[i]);
        if (!known)
            return bad(v,
                       "pipeline.schedule: unknown schedule '%s' (gpipe, 1f1b, interleaved_1f1b, "
                       "looped_bfs, interleaved_zero_bubble)",
                       sc);
        if (s->pipeline->virtual_stages > 1 && (!strcmp(sc, "gpipe") || !strcmp(sc, "1f1b")))
            return bad(v, "pipeline.virtual_stages: %s runs one stage per rank", sc);
    }
    const char *acc = s->training && s->training->accumulation ? s->training->accumulation : "";
    if (*acc && strcmp(acc, "auto") && strcmp(acc, "reshard") && strcmp(acc, "keep_gathered"))
        return bad(v, "training.accumulation: unknown value '%s' (auto, reshard, keep_gathered)",
                   acc);
    const char *bp = s->training && s->training->backward_prefetch ? s->training->backward_prefetch
                                                                   : "";
    if (*bp && strcmp(bp, "pre") && strcmp(bp, "post") && strcmp(bp, "none"))
        return bad(v, "training.backward_prefetch: unknown value '%s' (pre, post, none)", bp);
    const char *gs = s->training && s->training->gradient_sync ? s->training->gradient_sync : "";
    if (*gs && strcmp(gs, "last_micro_batch") && strcmp(gs, "every_micro_batch"))
        return bad(v,
                   "training.gradient_sync: unknown value '%s' (last_micro_batch, "
                   "every_micro_batch)",
                   gs);
    const char *ha =
        s->training && s->training->hsdp_all_reduce ? s->training->hsdp_all_reduce : "";
    if (*ha && strcmp(ha, "every_sync") && strcmp(ha, "last_micro_batch"))
        return bad(v, "training.hsdp_all_reduce: unknown value '%s' (every_sync, last_micro_batch)",
                   ha);
    if (!strcmp(ha, "last_micro_batch") && strcmp(gs, "every_micro_batch"))
        return bad(v, "training.hsdp_all_reduce: last_micro_batch needs training.gradient_sync: "
                      "every_micro_batch (otherwise the one reduction of a step is the last)");
    const char *hook = s->ddp_comm_hook ? s->ddp_comm_hook : "";
    if (*hook) {
        if (strcmp(hook, "allreduce") && strcmp(hook, "fp16_compress") &&
            strcmp(hook, "bf16_compress"))
            return bad(v,
                       "ddp_comm_hook: unknown hook '%s' (allreduce, fp16_compress, "
                       "bf16_compress)",
                       hook);
        if (s->strategy != PCS__V1__STRATEGY__STRATEGY_NO_SHARD)
            return bad(v, "ddp_comm_hook: needs strategy no_shard (DDP-style replication)");
        if (s->training && s->training->gradient_divide_factor)
            return bad(v, "ddp_comm_hook: divides by the data-parallel size; "
                          "training.gradient_divide_factor conflicts with it");
        int want = !strcmp(hook, "fp16_compress")   ? PCS__V1__DTYPE__DTYPE_FP16
                   : !strcmp(hook, "bf16_compress") ? PCS__V1__DTYPE__DTYPE_BF16
                                                    : 0;
        int red = s->precision ? (int)s->precision->reduce_dtype : 0;
        if (want && red && red != want)
            return bad(v,
                       "ddp_comm_hook: %s reduces in %s; precision.reduce_dtype %s contradicts "
                       "it",
                       hook, dtype_str(want), dtype_str(red));
    }
    if (s->training && s->training->eval_backward && !s->training->full_precision_eval)
        return bad(v, "training.eval_backward: needs training.full_precision_eval (an eval-mode "
                      "backward reduces in full precision only then)");
    const char *lay = s->shard_layout ? s->shard_layout : "";
    if (*lay && strcmp(lay, "flat") && strcmp(lay, "per_param"))
        return bad(v, "shard_layout: must be flat or per_param, got '%s'", lay);
    for (size_t i = 0; i < s->n_shard_placements; i++) {
        const Pcs__V1__ShardPlacement *sp = s->shard_placements[i];
        const char *pp = sp && sp->param ? sp->param : "";
        if (strcmp(lay, "per_param"))
            return bad(v, "shard_placements: need shard_layout: per_param (FSDP1's flat "
                          "parameter has no per-parameter placement)");
        if (!*pp)
            return bad(v, "shard_placements[%zu].param: required (an FQN or a prefix ending in "
                          "'*')",
                       i);
        const char *star = strchr(pp, '*');
        if (star && star[1] != '\0')
            return bad(v, "shard_placements[%zu].param: '*' is only allowed at the end", i);
        if (sp->dim >= PCS_MODEL_MAX_DIMS)
            return bad(v, "shard_placements[%zu].dim: %u is not a tensor dim (at most %d dims)",
                       i, sp->dim, PCS_MODEL_MAX_DIMS);
    }
    const char *b = s->backend ? s->backend : "";
    if (*b && strcmp(b, "cpu") && strcmp(b, "cuda"))
        return bad(v, "backend: must be cpu or cuda, got '%s'", b);
    const char *c = s->collectives ? s->collectives : "";
    if (*c && strcmp(c, "auto") && strcmp(c, "nccl") && strcmp(c, "gloo"))
        return bad(v, "collectives: must be auto, nccl or gloo, got '%s'", c);
    if (!strcmp(c, "nccl") && strcmp(b, "cuda"))
        return bad(v, "collectives: nccl needs backend: cuda (NCCL reduces device buffers)");
    if (s->program && *s->program && !pcs_is_name_token(s->program, PCS_PROGRAM_NAME_MAX))
        return bad(v, "program: must be at most %d characters of [A-Za-z0-9._-], got '%.*s'",
                   PCS_PROGRAM_NAME_MAX, pcs_utf8_prefix(s->program, 80), s->program);
    for (size_t i = 0; i < s->n_strategy_overrides; i++) {
        const Pcs__V1__StrategyOverride *o = s->strategy_overrides[i];
        PCS_CHECK(check_match(v, "strategy_overrides", i, o ? o->match : NULL));
        if (!o->strategy)
            return bad(v, "strategy_overrides[%zu].strategy: required", i);
        if (!enum_known(&pcs__v1__strategy__descriptor, o->strategy))
            return bad(v, "strategy_overrides[%zu].strategy: unknown value %d", i,
                       (int)o->strategy);
        if ((o->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD ||
             o->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2) &&
            !mesh_dim(s, PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE))
            return bad(v, "strategy_overrides[%zu].strategy: %s needs a dp_replicate mesh dimension",
                       i,
                       o->strategy == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD
                           ? "hybrid_shard"
                           : "hybrid_shard_zero2");
    }
    for (size_t i = 0; i < s->n_ignored_modules; i++) {
        const char *p = s->ignored_modules[i] ? s->ignored_modules[i] : "";
        if (!*p)
            return bad(v, "ignored_modules[%zu]: the root module cannot be ignored", i);
        if (!valid_module_path(p))
            return bad(v, "ignored_modules[%zu]: '%.*s' is not a module path", i,
                       pcs_utf8_prefix(p, 80), p);
        if (!kind_of(&v->tree, p))
            return bad(v, "ignored_modules[%zu]: no module '%.*s' in the model", i,
                       pcs_utf8_prefix(p, 80), p);
    }
    /* (whether each names a parameter of the model: the planner, which expands the model) */
    for (size_t i = 0; i < s->n_ignored_params; i++) {
        const char *p = s->ignored_params[i] ? s->ignored_params[i] : "";
        if (!*p)
            return bad(v, "ignored_params[%zu]: must name a parameter", i);
        for (size_t j = 0; j < i; j++)
            if (s->ignored_params[j] && !strcmp(s->ignored_params[j], p))
                return bad(v, "ignored_params[%zu]: '%.*s' is listed twice", i,
                           pcs_utf8_prefix(p, 80), p);
    }
    return PCS_OK;
}

static pcs_status_t check_name(vctx_t *v, const char *name)
{
    if (!name || !*name)
        return PCS_OK;
    if (!pcs_is_name_token(name, MAX_NAME_LEN))
        return bad(v, "name: must be at most %d characters of [A-Za-z0-9._-]", MAX_NAME_LEN);
    return PCS_OK;
}

// ---- entry points -------------------------------------------------------------------------------

pcs_status_t pcs_job_validate(const Pcs__V1__JobSpec *spec, char *err, size_t errlen)
{
    vctx_t v = {.err = err,
                .errlen = errlen,
                .modules = PCS_STRMAP_OWNED,
                .tree = PCS_STRMAP_OWNED,
                .tensors = PCS_STRMAP_OWNED};
    if (err && errlen)
        err[0] = '\0';
    if (!spec)
        return bad(&v, "spec: required");
    pcs_status_t rc = PCS_OK;
    PCS_CHECK_GOTO(check_name(&v, spec->name), rc, out);
    PCS_CHECK_GOTO(check_model(&v, spec->model), rc, out);
    PCS_CHECK_GOTO(check_wrap(&v, spec->wrap), rc, out);
    PCS_CHECK_GOTO(check_precision(&v, spec->precision), rc, out);
    PCS_CHECK_GOTO(check_mesh(&v, spec), rc, out);
    PCS_CHECK_GOTO(check_strategy(&v, spec), rc, out);
    PCS_CHECK_GOTO(check_training(&v, spec), rc, out);
    PCS_CHECK_GOTO(check_data(&v, spec->data), rc, out);
    PCS_CHECK_GOTO(check_rest(&v, spec), rc, out);
out:
    pcs_strmap_free(&v.modules);
    pcs_strmap_free(&v.tree);
    pcs_strmap_free(&v.tensors);
    if (rc != PCS_OK && rc != PCS_ERR_INVALID_ARG && err && errlen)
        snprintf(err, errlen, "%s", pcs_last_error());
    return rc;
}

uint32_t pcs_job_world_size(const Pcs__V1__JobSpec *spec)
{
    uint64_t w = 1;
    for (size_t i = 0; spec && i < spec->n_mesh; i++) {
        if (spec->mesh[i] && spec->mesh[i]->size > 0)
            w *= spec->mesh[i]->size;
        if (w > UINT32_MAX)
            return UINT32_MAX;
    }
    return (uint32_t)w;
}
