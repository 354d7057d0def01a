/* Module-tree expansion (model.h): the built-in mlp into its fixed FQN scheme, explicit module
 * lists into a preorder tree with synthesized ancestors and resolved shared parameters. Also the
 * small error list the planner shares, so one submit reports every problem at once. */
#include "planner/model_tree.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"

// ----------------------------------------------------------------------------------------------
// error list

#define ERRLIST_KEEP 8192

void pcs_errlist_add(pcs_errlist_t *e, const char *fmt, ...)
{
    e->count++;
    if (e->len >= ERRLIST_KEEP)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t ln = strlen(line);
    size_t need = e->len + ln + 3;
    if (need > e->cap) {
        size_t ncap = e->cap ? e->cap * 2 : 256;
        while (ncap < need)
            ncap *= 2;
        char *t = realloc(e->text, ncap);
        if (!t)
            return; /* the count still says an error happened */
        e->text = t;
        e->cap = ncap;
    }
    if (e->len) {
        memcpy(e->text + e->len, "; ", 2);
        e->len += 2;
    }
    memcpy(e->text + e->len, line, ln + 1);
    e->len += ln;
}

void pcs_errlist_free(pcs_errlist_t *e)
{
    free(e->text);
    memset(e, 0, sizeof *e);
}

pcs_status_t pcs_errlist_finish(pcs_errlist_t *e)
{
    if (!e->count) {
        pcs_errlist_free(e);
        return PCS_OK;
    }
    uint32_t shown = 1;
    for (size_t i = 0; e->text && i + 1 < e->len; i++)
        shown += (e->text[i] == ';' && e->text[i + 1] == ' ');
    if (!e->text)
        shown = 0;
    if (shown < e->count)
        pcs_set_error(PCS_ERR_INVALID_ARG, "%s (+%u more)", e->text ? e->text : "",
                      e->count - shown);
    else
        pcs_set_error(PCS_ERR_INVALID_ARG, "%s", e->text);
    pcs_errlist_free(e);
    return PCS_ERR_INVALID_ARG;
}

// ----------------------------------------------------------------------------------------------
// path and FQN lookups: pcs/strmap.h maps borrowing the module paths / FQNs (owned by the model or
// the node list, which outlive the maps)

/* Index stored for `k`, -1 if absent. */
static int32_t find(const pcs_strmap_t *h, const char *k)
{
    uint32_t i;
    return pcs_strmap_get(h, k, &i) ? (int32_t)i : -1;
}

int32_t pcs_model_find(const pcs_model_t *m, const char *path)
{
    return find(&m->index, path);
}

// ----------------------------------------------------------------------------------------------
// builder: modules must be added in preorder (parents before children, subtrees contiguous)

typedef struct builder {
    pcs_model_t *m;
    size_t cap_mod, cap_par, cap_buf, cap_ali;
} builder_t;

static char *join_path(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return NULL;
    if (la) {
        memcpy(s, a, la);
        s[la] = '.';
        memcpy(s + la + 1, b, lb + 1);
    } else {
        memcpy(s, b, lb + 1);
    }
    return s;
}

static pcs_status_t add_module(builder_t *b, const char *path, const char *cls, int32_t parent)
{
    pcs_model_t *m = b->m;
    if (m->n_modules >= PCS_MODEL_MAX_MODULES)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "model: more than %u modules",
                             PCS_MODEL_MAX_MODULES);
    PCS_CHECK(pcs_grow((void **)&m->modules, &b->cap_mod, m->n_modules + 1, sizeof *m->modules));
    pcs_model_module_t *mod = &m->modules[m->n_modules];
    memset(mod, 0, sizeof *mod);
    PCS_CHECK(pcs_strdup(path, &mod->path));
    m->n_modules++; /* counted once path is owned, so pcs_model_free releases it */
    PCS_CHECK(pcs_strdup(cls && *cls ? cls : "Module", &mod->cls));
    mod->parent = parent;
    mod->param_begin = mod->param_end = m->n_params;
    mod->buffer_begin = mod->buffer_end = m->n_buffers;
    mod->alias_begin = mod->alias_end = m->n_aliases;
    return PCS_OK;
}

static pcs_status_t add_tensor(builder_t *b, bool is_param, const char *name, uint32_t ndim,
                               const uint64_t *shape, pcs_dtype_t dt, bool frozen)
{
    pcs_model_t *m = b->m;
    uint32_t mi = m->n_modules - 1;
    pcs_model_tensor_t **arr = is_param ? &m->params : &m->buffers;
    uint32_t *n = is_param ? &m->n_params : &m->n_buffers;
    if (m->n_params + m->n_buffers >= PCS_MODEL_MAX_TENSORS)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "model: more than %u tensors",
                             PCS_MODEL_MAX_TENSORS);
    PCS_CHECK(pcs_grow((void **)arr, is_param ? &b->cap_par : &b->cap_buf, *n + 1, sizeof **arr));
    pcs_model_tensor_t *t = &(*arr)[*n];
    memset(t, 0, sizeof *t);
    t->fqn = join_path(m->modules[mi].path, name);
    if (!t->fqn)
        return pcs_set_error(PCS_ERR_NOMEM, "out of memory");
    (*n)++;
    t->name = t->fqn + strlen(t->fqn) - strlen(name);
    t->module = mi;
    t->home = mi;
    t->ndim = ndim;
    t->numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= shape[d]; /* callers bound the product (checked_numel) */
    }
    t->dtype = dt;
    t->frozen = frozen;
    if (is_param)
        m->modules[mi].param_end = *n;
    else
        m->modules[mi].buffer_end = *n;
    return PCS_OK;
}

static pcs_status_t add_1d(builder_t *b, bool is_param, const char *name, uint64_t d0,
                           pcs_dtype_t dt)
{
    return add_tensor(b, is_param, name, 1, &d0, dt, false);
}

static void lca_update(const pcs_model_t *m, uint32_t *a, uint32_t bm)
{
    uint32_t x = *a, y = bm;
    while (m->modules[x].depth > m->modules[y].depth)
        x = (uint32_t)m->modules[x].parent;
    while (m->modules[y].depth > m->modules[x].depth)
        y = (uint32_t)m->modules[y].parent;
    while (x != y) {
        x = (uint32_t)m->modules[x].parent;
        y = (uint32_t)m->modules[y].parent;
    }
    *a = x;
}

/* Depths, subtree ranges, homes of shared params, subtree numels, the path index. */
static pcs_status_t finalize(pcs_model_t *m)
{
    for (uint32_t i = 0; i < m->n_modules; i++) {
        pcs_model_module_t *mod = &m->modules[i];
        mod->subtree_end = i + 1;
        mod->depth = mod->parent < 0 ? 0 : m->modules[mod->parent].depth + 1;
    }
    for (uint32_t i = m->n_modules; i-- > 1;) {
        pcs_model_module_t *p = &m->modules[m->modules[i].parent];
        if (m->modules[i].subtree_end > p->subtree_end)
            p->subtree_end = m->modules[i].subtree_end;
    }
    for (uint32_t a = 0; a < m->n_aliases; a++)
        lca_update(m, &m->params[m->aliases[a].param].home, m->aliases[a].module);
    m->numel = 0;
    for (uint32_t i = 0; i < m->n_modules; i++)
        m->modules[i].subtree_numel = 0;
    for (uint32_t p = 0; p < m->n_params; p++) {
        m->modules[m->params[p].home].subtree_numel += m->params[p].numel;
        m->numel += m->params[p].numel;
    }
    for (uint32_t i = m->n_modules; i-- > 1;)
        m->modules[m->modules[i].parent].subtree_numel += m->modules[i].subtree_numel;
    if (!pcs_strmap_len(&m->index)) {
        PCS_CHECK(pcs_strmap_reserve(&m->index, m->n_modules));
        for (uint32_t i = 0; i < m->n_modules; i++)
            PCS_CHECK(pcs_strmap_put(&m->index, m->modules[i].path, i));
    }
    return PCS_OK;
}

void pcs_model_free(pcs_model_t *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        free(m->modules[i].path);
        free(m->modules[i].cls);
    }
    for (uint32_t i = 0; i < m->n_params; i++)
        free(m->params[i].fqn);
    for (uint32_t i = 0; i < m->n_buffers; i++)
        free(m->buffers[i].fqn);
    for (uint32_t i = 0; i < m->n_aliases; i++)
        free(m->aliases[i].fqn);
    free(m->modules);
    free(m->params);
    free(m->buffers);
    free(m->aliases);
    pcs_strmap_free(&m->index);
    free(m);
}

// ----------------------------------------------------------------------------------------------
// built-in mlp

static pcs_status_t expand_mlp(const Pcs__V1__MlpModel *mlp, pcs_errlist_t *errs, builder_t *b)
{
    uint32_t before = errs->count;
    if (mlp->input_dim < 1)
        pcs_errlist_add(errs, "model.mlp.input_dim: must be >= 1");
    if (mlp->output_dim < 1)
        pcs_errlist_add(errs, "model.mlp.output_dim: must be >= 1");
    if (mlp->n_hidden_dims > PCS_MODEL_MAX_MODULES / 8)
        pcs_errlist_add(errs, "model.mlp.hidden_dims: more than %u layers",
                        PCS_MODEL_MAX_MODULES / 8);
    for (size_t i = 0; i < mlp->n_hidden_dims && i < PCS_MODEL_MAX_MODULES / 8; i++)
        if (mlp->hidden_dims[i] < 1)
            pcs_errlist_add(errs, "model.mlp.hidden_dims[%zu]: must be >= 1", i);
    if ((int)mlp->norm < 0 || mlp->norm > PCS__V1__NORM__NORM_BATCHNORM)
        pcs_errlist_add(errs, "model.mlp.norm: unknown value %d", (int)mlp->norm);
    if ((int)mlp->activation < 0 || mlp->activation > PCS__V1__ACTIVATION__ACTIVATION_GELU)
        pcs_errlist_add(errs, "model.mlp.activation: unknown value %d", (int)mlp->activation);
    if (errs->count != before)
        return PCS_ERR_INVALID_ARG;

    bool bias = mlp->bias ? mlp->bias->value : true;
    const char *act = mlp->activation == PCS__V1__ACTIVATION__ACTIVATION_GELU ? "GELU" : "ReLU";
    char path[64];
    PCS_CHECK(add_module(b, "", "MLP", -1));
    PCS_CHECK(add_module(b, "layers", "ModuleList", 0));
    uint64_t in = mlp->input_dim;
    for (size_t i = 0; i < mlp->n_hidden_dims; i++) {
        uint64_t out = mlp->hidden_dims[i];
        int32_t block = (int32_t)b->m->n_modules;
        snprintf(path, sizeof path, "layers.%zu", i);
        PCS_CHECK(add_module(b, path, "MLPBlock", 1));
        snprintf(path, sizeof path, "layers.%zu.linear", i);
        PCS_CHECK(add_module(b, path, "Linear", block));
        uint64_t w[2] = {out, in};
        PCS_CHECK(add_tensor(b, true, "weight", 2, w, PCS_DTYPE_FP32, false));
        if (bias)
            PCS_CHECK(add_1d(b, true, "bias", out, PCS_DTYPE_FP32));
        if (mlp->norm == PCS__V1__NORM__NORM_LAYERNORM ||
            mlp->norm == PCS__V1__NORM__NORM_BATCHNORM) {
            bool bn = mlp->norm == PCS__V1__NORM__NORM_BATCHNORM;
            snprintf(path, sizeof path, "layers.%zu.norm", i);
            PCS_CHECK(add_module(b, path, bn ? "BatchNorm1d" : "LayerNorm", block));
            PCS_CHECK(add_1d(b, true, "weight", out, PCS_DTYPE_FP32));
            PCS_CHECK(add_1d(b, true, "bias", out, PCS_DTYPE_FP32));
            if (bn) {
                PCS_CHECK(add_1d(b, false, "running_mean", out, PCS_DTYPE_FP32));
                PCS_CHECK(add_1d(b, false, "running_var", out, PCS_DTYPE_FP32));
                PCS_CHECK(
                    add_tensor(b, false, "num_batches_tracked", 0, NULL, PCS_DTYPE_INT64, false));
            }
        }
        snprintf(path, sizeof path, "layers.%zu.act", i);
        PCS_CHECK(add_module(b, path, act, block));
        in = out;
    }
    PCS_CHECK(add_module(b, "head", "Linear", 0));
    uint64_t w[2] = {mlp->output_dim, in};
    PCS_CHECK(add_tensor(b, true, "weight", 2, w, PCS_DTYPE_FP32, false));
    if (bias)
        PCS_CHECK(add_1d(b, true, "bias", mlp->output_dim, PCS_DTYPE_FP32));
    return PCS_OK;
}

// ----------------------------------------------------------------------------------------------
// explicit module trees

typedef struct node {
    const char *path; /* borrowed from the spec or owned (synth) */
    char *owned;
    int32_t decl; /* index into spec modules, -1 when synthesized */
    int32_t parent;
    int32_t first_child, last_child, next;
} node_t;

typedef struct nodes {
    node_t *v;
    uint32_t n;
    size_t cap;
} nodes_t;

/* A node for `path` (borrowed from the spec, or `owned`), indexed in h by path. */
static pcs_status_t node_add(nodes_t *ns, pcs_strmap_t *h, const char *path, char *owned,
                             int32_t parent)
{
    PCS_CHECK(pcs_grow((void **)&ns->v, &ns->cap, ns->n + 1, sizeof *ns->v));
    PCS_CHECK(pcs_strmap_put(h, path, ns->n));
    node_t *nd = &ns->v[ns->n];
    nd->path = path;
    nd->owned = owned;
    nd->decl = -1;
    nd->parent = parent;
    nd->first_child = nd->last_child = nd->next = -1;
    if (parent >= 0) {
        node_t *p = &ns->v[parent];
        if (p->last_child >= 0)
            ns->v[p->last_child].next = (int32_t)ns->n;
        else
            p->first_child = (int32_t)ns->n;
        p->last_child = (int32_t)ns->n;
    }
    ns->n++;
    return PCS_OK;
}

static bool path_ok(const char *p)
{
    if (!*p)
        return true;
    if (*p == '.' || p[strlen(p) - 1] == '.' || strstr(p, ".."))
        return false;
    for (; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == '*')
            return false;
    return true;
}

static bool name_ok(const char *s)
{
    if (!s || !*s)
        return false;
    for (; *s; s++)
        if (*s == '.' || (unsigned char)*s < 0x21)
            return false;
    return true;
}

/* Validate one tensor declaration; returns false (after adding errors) when unusable. */
static bool tensor_decl_ok(const Pcs__V1__TensorDecl *t, bool is_param, const char *where,
                           pcs_errlist_t *errs)
{
    bool ok = true;
    if (!name_ok(t->name)) {
        pcs_errlist_add(errs, "%s.name: must be a non-empty name without '.' or spaces", where);
        ok = false;
    }
    if (t->n_shape > PCS_MODEL_MAX_DIMS) {
        pcs_errlist_add(errs, "%s.shape: more than %d dimensions", where, PCS_MODEL_MAX_DIMS);
        return false;
    }
    if (is_param && t->n_shape == 0) {
        pcs_errlist_add(errs, "%s.shape: a parameter needs at least one dimension", where);
        ok = false;
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
        if (t->shape[d] < 1) {
            pcs_errlist_add(errs, "%s.shape[%zu]: must be >= 1", where, d);
            ok = false;
        } else if (numel > (1ull << 62) / t->shape[d]) {
            pcs_errlist_add(errs, "%s.shape: more than 2^62 elements", where);
            return false;
        } else {
            numel *= t->shape[d];
        }
    }
    int dt = (int)t->dtype;
    if (dt < 0 || dt >= PCS_DTYPE_COUNT) {
        pcs_errlist_add(errs, "%s.dtype: unknown dtype %d", where, dt);
        ok = false;
    } else if (is_param && dt != PCS_DTYPE_NONE && !pcs_dtype_is_float((pcs_dtype_t)dt)) {
        pcs_errlist_add(errs, "%s.dtype: %s is not a floating dtype", where,
                        pcs_dtype_name((pcs_dtype_t)dt));
        ok = false;
    }
    return ok;
}

static pcs_status_t expand_explicit(const Pcs__V1__ExplicitModel *em, pcs_errlist_t *errs,
                                    builder_t *b)
{
    pcs_status_t rc = PCS_OK;
    uint32_t before = errs->count;
    nodes_t ns = {0};
    pcs_strmap_t h = PCS_STRMAP_BORROWED;
    int32_t *stack = NULL;
    int32_t *mdecl = NULL; /* module index -> declaration index (-1 synthesized) */
    size_t nd = em ? em->n_modules : 0;
    if (nd > PCS_MODEL_MAX_MODULES) {
        pcs_errlist_add(errs, "model.explicit.modules: more than %u modules",
                        PCS_MODEL_MAX_MODULES);
        return PCS_ERR_INVALID_ARG;
    }
    if (nd == 0) {
        pcs_errlist_add(errs, "model.explicit.modules: required (at least one module)");
        return PCS_ERR_INVALID_ARG;
    }
    /* Every '.' of every path may add one synthesized ancestor. */
    size_t cap = 1;
    for (size_t i = 0; i < nd; i++) {
        const char *p = em->modules[i]->path ? em->modules[i]->path : "";
        cap += 1;
        for (; *p; p++)
            cap += (*p == '.');
        if (cap > 4u * PCS_MODEL_MAX_MODULES) {
            pcs_errlist_add(errs, "model.explicit.modules: paths too deep");
            return PCS_ERR_INVALID_ARG;
        }
    }
    PCS_CHECK_GOTO(pcs_strmap_reserve(&h, cap), rc, out);
    PCS_CHECK_GOTO(node_add(&ns, &h, "", NULL, -1), rc, out);

    for (size_t i = 0; i < nd; i++) {
        const Pcs__V1__ModuleDecl *md = em->modules[i];
        const char *path = md->path ? md->path : "";
        if (!path_ok(path)) {
            pcs_errlist_add(errs, "model.explicit.modules[%zu].path: '%s' is not a module FQN", i,
                            path);
            continue;
        }
        /* walk the prefixes "a", "a.b", ... creating missing ancestors */
        int32_t parent = 0;
        size_t len = strlen(path);
        for (size_t k = 0; len && k <= len; k++) {
            if (k < len && path[k] != '.')
                continue;
            char *pre = malloc(k + 1);
            if (!pre) {
                rc = PCS_ERR_NOMEM;
                goto out;
            }
            memcpy(pre, path, k);
            pre[k] = '\0';
            int32_t f = find(&h, pre);
            if (f >= 0) {
                free(pre);
                parent = f;
                continue;
            }
            rc = node_add(&ns, &h, pre, pre, parent);
            if (rc != PCS_OK) {
                free(pre);
                goto out;
            }
            parent = (int32_t)ns.n - 1;
        }
        node_t *self = &ns.v[parent];
        if (self->decl >= 0) {
            pcs_errlist_add(errs, "model.explicit.modules[%zu].path: duplicate module '%s'", i,
                            path);
            continue;
        }
        self->decl = (int32_t)i;
    }
    if (errs->count != before) {
        rc = PCS_ERR_INVALID_ARG;
        goto out;
    }

    /* preorder walk; children in order of first appearance */
    PCS_CHECK_GOTO(pcs_calloc(ns.n + 1, sizeof *stack, (void **)&stack), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(ns.n, sizeof *mdecl, (void **)&mdecl), rc, out);
    {
        int32_t *map = NULL; /* node -> module index */
        PCS_CHECK_GOTO(pcs_calloc(ns.n, sizeof *map, (void **)&map), rc, out);
        size_t sp = 0;
        stack[sp++] = 0;
        while (sp) {
            int32_t v = stack[--sp];
            node_t *n = &ns.v[v];
            const Pcs__V1__ModuleDecl *md = n->decl >= 0 ? em->modules[n->decl] : NULL;
            const char *cls =
                md && md->class_ && *md->class_ ? md->class_ : (v == 0 ? "Model" : "Module");
            map[v] = (int32_t)b->m->n_modules;
            mdecl[b->m->n_modules] = n->decl;
            rc = add_module(b, n->path, cls, n->parent >= 0 ? map[n->parent] : -1);
            if (rc == PCS_OK && md) {
                char where[96];
                for (size_t j = 0; j < md->n_params && rc == PCS_OK; j++) {
                    const Pcs__V1__TensorDecl *t = md->params[j];
                    snprintf(where, sizeof where, "model.explicit.modules[%d].params[%zu]", n->decl,
                             j);
                    if (!tensor_decl_ok(t, true, where, errs))
                        continue;
                    pcs_dtype_t dt = t->dtype ? (pcs_dtype_t)t->dtype : PCS_DTYPE_FP32;
                    rc = add_tensor(b, true, t->name, (uint32_t)t->n_shape, t->shape, dt,
                                    t->requires_grad_off);
                }
                for (size_t j = 0; j < md->n_buffers && rc == PCS_OK; j++) {
                    const Pcs__V1__TensorDecl *t = md->buffers[j];
                    snprintf(where, sizeof where, "model.explicit.modules[%d].buffers[%zu]",
                             n->decl, j);
                    if (!tensor_decl_ok(t, false, where, errs))
                        continue;
                    pcs_dtype_t dt = t->dtype ? (pcs_dtype_t)t->dtype : PCS_DTYPE_FP32;
                    rc = add_tensor(b, false, t->name, (uint32_t)t->n_shape, t->shape, dt, true);
                }
            }
            if (rc != PCS_OK) {
                free(map);
                goto out;
            }
            /* push children reversed so the first child is visited first */
            size_t base = sp;
            for (int32_t c = n->first_child; c >= 0; c = ns.v[c].next)
                stack[sp++] = c;
            for (size_t a = base, z = sp - 1; sp > base && a < z; a++, z--) {
                int32_t t = stack[a];
                stack[a] = stack[z];
                stack[z] = t;
            }
        }
        free(map);
    }
    if (errs->count != before) {
        rc = PCS_ERR_INVALID_ARG;
        goto out;
    }

    /* local names unique per module (params + buffers + shared) */
    {
        pcs_model_t *m = b->m;
        pcs_strmap_t ph = PCS_STRMAP_BORROWED; /* FQN -> parameter index */
        PCS_CHECK_GOTO(pcs_strmap_reserve(&ph, m->n_params), rc, out);
        for (uint32_t p = 0; p < m->n_params; p++) {
            bool added;
            rc = pcs_strmap_add(&ph, m->params[p].fqn, p, &added);
            if (rc != PCS_OK)
                break;
            if (!added)
                pcs_errlist_add(errs, "model.explicit: duplicate parameter '%s'", m->params[p].fqn);
        }
        for (uint32_t bu = 0; bu < m->n_buffers; bu++)
            if (find(&ph, m->buffers[bu].fqn) >= 0)
                pcs_errlist_add(errs, "model.explicit: '%s' is both a parameter and a buffer",
                                m->buffers[bu].fqn);
        /* shared parameters, in module order so aliases stay grouped per module */
        for (uint32_t mi = 0; mi < m->n_modules && rc == PCS_OK; mi++) {
            int32_t di = mdecl[mi];
            m->modules[mi].alias_begin = m->modules[mi].alias_end = m->n_aliases;
            if (di < 0)
                continue;
            const Pcs__V1__ModuleDecl *md = em->modules[di];
            for (size_t j = 0; j < md->n_shared; j++) {
                const Pcs__V1__SharedParam *sp2 = md->shared[j];
                if (!name_ok(sp2->name)) {
                    pcs_errlist_add(errs,
                                    "model.explicit.modules[%d].shared[%zu].name: must be a "
                                    "non-empty name without '.'",
                                    di, j);
                    continue;
                }
                int32_t target = find(&ph, sp2->shares ? sp2->shares : "");
                if (target < 0) {
                    pcs_errlist_add(errs,
                                    "model.explicit.modules[%d].shared[%zu].shares: no "
                                    "parameter '%s'",
                                    di, j, sp2->shares ? sp2->shares : "");
                    continue;
                }
                char *fqn = join_path(m->modules[mi].path, sp2->name);
                if (!fqn) {
                    rc = PCS_ERR_NOMEM;
                    break;
                }
                if (find(&ph, fqn) >= 0) {
                    pcs_errlist_add(errs,
                                    "model.explicit.modules[%d].shared[%zu].name: '%s' is "
                                    "already a parameter",
                                    di, j, fqn);
                    free(fqn);
                    continue;
                }
                rc = pcs_grow((void **)&m->aliases, &b->cap_ali, m->n_aliases + 1,
                              sizeof *m->aliases);
                if (rc != PCS_OK) {
                    free(fqn);
                    break;
                }
                m->aliases[m->n_aliases].module = mi;
                m->aliases[m->n_aliases].fqn = fqn;
                m->aliases[m->n_aliases].param = (uint32_t)target;
                m->n_aliases++;
                m->modules[mi].alias_end = m->n_aliases;
            }
        }
        pcs_strmap_free(&ph);
    }
    if (rc == PCS_OK && errs->count != before)
        rc = PCS_ERR_INVALID_ARG;
out:
    for (uint32_t i = 0; i < ns.n; i++)
        free(ns.v[i].owned);
    free(ns.v);
    pcs_strmap_free(&h);
    free(stack);
    free(mdecl);
    return rc;
}

// ----------------------------------------------------------------------------------------------

pcs_status_t pcs_model_expand_errs(const Pcs__V1__JobSpec *spec, pcs_errlist_t *errs,
                                   pcs_model_t **out)
{
    *out = NULL;
    pcs_status_t rc = PCS_OK;
    builder_t b = {0};
    PCS_CHECK(pcs_calloc(1, sizeof *b.m, (void **)&b.m));
    const Pcs__V1__ModelSpec *ms = spec ? spec->model : NULL;
    if (!ms || ms->kind_case == PCS__V1__MODEL_SPEC__KIND__NOT_SET) {
        pcs_errlist_add(errs, "model: required (mlp or explicit)");
        rc = PCS_ERR_INVALID_ARG;
    } else if (ms->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP) {
        rc = expand_mlp(ms->mlp, errs, &b);
    } else if (ms->kind_case == PCS__V1__MODEL_SPEC__KIND_EXPLICIT) {
        rc = expand_explicit(ms->explicit_, errs, &b);
    } else {
        pcs_errlist_add(errs, "model: unknown kind %d", (int)ms->kind_case);
        rc = PCS_ERR_INVALID_ARG;
    }
    if (rc == PCS_ERR_INVALID_ARG && errs->count == 0)
        pcs_errlist_add(errs, "%s", pcs_last_error()); /* a limit error raised while building */
    if (rc == PCS_OK)
        rc = finalize(b.m);
    if (rc != PCS_OK) {
        pcs_model_free(b.m);
        return rc;
    }
    *out = b.m;
    return PCS_OK;
}

pcs_status_t pcs_model_expand(const Pcs__V1__JobSpec *spec, pcs_model_t **out)
{
    pcs_errlist_t errs = {0};
    pcs_status_t rc = pcs_model_expand_errs(spec, &errs, out);
    if (rc == PCS_ERR_INVALID_ARG)
        return pcs_errlist_finish(&errs);
    pcs_errlist_free(&errs);
    return rc;
}
