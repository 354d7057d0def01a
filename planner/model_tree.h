/* Module-tree expansion: a JobSpec's model (built-in mlp or an explicit module list) becomes a
 * plain-C tree of modules in module-tree (preorder) order with their parameters, buffers and
 * shared-parameter aliases. The planner builds units from it; the worker uses it to know FQNs and
 * shapes. Pure C, no RPC, no allocation outside pcs_model_expand/pcs_model_free. */
#ifndef PCS_PLANNER_MODEL_TREE_H
#define PCS_PLANNER_MODEL_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"
#include "pcs/strmap.h"
#include "pcs/v1/job.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_MODEL_MAX_DIMS    8
#define PCS_MODEL_MAX_MODULES (1u << 20) /* bad-input guard, far above any real model */
#define PCS_MODEL_MAX_TENSORS (1u << 22)

typedef struct pcs_model_tensor {
    char *fqn;        /* layers.0.linear.weight (owned) */
    const char *name; /* local name: points into fqn */
    uint32_t module;  /* declaring module (index into modules) */
    uint32_t ndim;
    uint64_t shape[PCS_MODEL_MAX_DIMS];
    uint64_t numel;    /* product of shape (1 for a 0-dim buffer) */
    pcs_dtype_t dtype; /* declared dtype (default fp32; int64 buffers never cast) */
    bool frozen;       /* parameter with requires_grad off */
    uint32_t home;     /* params: module whose unit owns it = lowest common ancestor of
                        * the declaring module and every module sharing it */
} pcs_model_tensor_t;

/* A module's parameter `name` is the same tensor as params[param] (declared elsewhere). */
typedef struct pcs_model_alias {
    uint32_t module;
    char *fqn; /* FQN under the aliasing module (owned) */
    uint32_t param;
} pcs_model_alias_t;

typedef struct pcs_model_module {
    char *path;     /* FQN ("" = root), owned */
    char *cls;      /* class name, owned */
    int32_t parent; /* -1 for the root */
    uint32_t depth;
    uint32_t subtree_end;              /* descendants are the modules (index, subtree_end) */
    uint32_t param_begin, param_end;   /* own params: params[param_begin, param_end) */
    uint32_t buffer_begin, buffer_end; /* own buffers */
    uint32_t alias_begin, alias_end;   /* own shared-parameter aliases */
    uint64_t subtree_numel;            /* numel of params whose home lies in this subtree */
} pcs_model_module_t;

typedef struct pcs_model {
    pcs_model_module_t *modules; /* preorder: modules[0] is the root */
    uint32_t n_modules;
    pcs_model_tensor_t *params; /* module-tree order, declaration order inside a module */
    uint32_t n_params;
    pcs_model_tensor_t *buffers;
    uint32_t n_buffers;
    pcs_model_alias_t *aliases;
    uint32_t n_aliases;
    uint64_t numel;     /* total parameter elements (shared ones once) */
    pcs_strmap_t index; /* module path -> module index (pcs_model_find) */
} pcs_model_t;

/* Expand spec->model. MLP FQN scheme (fixed; the worker computes with these names): root ""
 * class MLP; "layers" class ModuleList; per hidden dim i "layers.{i}" MLPBlock containing
 * "layers.{i}.linear" Linear (weight [out,in], bias [out] unless bias=false), then for norm
 * layernorm "layers.{i}.norm" LayerNorm (weight, bias [out]) or batchnorm BatchNorm1d (weight,
 * bias [out]; buffers running_mean, running_var [out] fp32, num_batches_tracked [] int64), then
 * "layers.{i}.act" ReLU|GELU; last "head" Linear (weight [output_dim, last], bias). Explicit
 * trees are taken as given: missing ancestors are added (class "Module"), children keep the order
 * of their first appearance, shared parameters appear once (at their owner).
 * Errors: PCS_ERR_INVALID_ARG with every problem as "field.path: reason" joined by "; " in
 * pcs_last_error(); PCS_ERR_NOMEM. On success *out is freed with pcs_model_free(). Thread-safe
 * (no shared state). */
pcs_status_t pcs_model_expand(const Pcs__V1__JobSpec *spec, pcs_model_t **out);
void pcs_model_free(pcs_model_t *m);

/* Index of the module with FQN `path`, or -1. O(1). */
int32_t pcs_model_find(const pcs_model_t *m, const char *path);
/* True when module `a` is `b` or an ancestor of `b`. */
static inline bool pcs_model_contains(const pcs_model_t *m, uint32_t a, uint32_t b)
{
    return b >= a && b < m->modules[a].subtree_end;
}

// ---- error list shared by the model expansion and the planner (internal) ----
typedef struct pcs_errlist {
    char *text;
    size_t len, cap;
    uint32_t count;
} pcs_errlist_t;
/* Append "field.path: reason"; keeps the first ~8 KiB and counts the rest. */
void pcs_errlist_add(pcs_errlist_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Set pcs_last_error() to the joined list (with "(+N more)") and free it. */
pcs_status_t pcs_errlist_finish(pcs_errlist_t *e);
void pcs_errlist_free(pcs_errlist_t *e);

/* Expand into an existing error list (used by the planner so that model and plan errors are
 * reported together). Returns PCS_ERR_INVALID_ARG when errors were added. */
pcs_status_t pcs_model_expand_errs(const Pcs__V1__JobSpec *spec, pcs_errlist_t *errs,
                                   pcs_model_t **out);

#ifdef __cplusplus
}
#endif
#endif
