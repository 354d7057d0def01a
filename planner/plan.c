/* pcs_plan_build: JobSpec + world size -> Plan. Mesh and strategy resolution, FSDP1
 * _recursive_wrap unit selection (plus ignored classes and override promotion), pipeline stage
 * split, flat layouts, per-unit precision and collectives, groups and estimates. Every input
 * problem is collected with its field path so that one submit reports all of them. The rules
 * themselves live in plan_rules.c; the reasoning is in docs/PLAN.md. */
#include "planner/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "planner/model_tree.h"
#include "planner/schedule.h"
#include "pcs/log.h"
#include "pcs/mem.h"

#define NEW_MSG(c, var, initfn)                                                                    \
    do {                                                                                           \
        (var) = calloc(1, sizeof *(var));                                                          \
        if (var)                                                                                   \
            initfn(var);                                                                           \
        else                                                                                       \
            (c)->oom = true;                                                                       \
    } while (0)

typedef struct unit_b {
    uint32_t root; /* module index */
    uint32_t stage;
    bool is_root; /* model root, or a stage's root with pp > 1 */
    bool ignored;   /* ignored class: mixed precision off */
    bool unmanaged; /* spec.ignored_modules: whole, uncast, unreduced */
    bool params_only; /* parameters only, no module and no buffer of its own: the unmanaged
                       * ignored_params of module `root`, or a dtype part */
    bool dtype_part;  /* the parameters of another dtype in the unit just before it (of the same
                       * region; split_dtype_groups) */
    /* its strategy (spec.strategy, or the last strategy_overrides entry matching its root),
     * shard group size and all-reduce group size */
    Pcs__V1__Strategy eff;
    uint32_t group, ar;
} unit_b_t;

typedef struct ctx {
    const Pcs__V1__JobSpec *spec;
    pcs_errlist_t errs;
    pcs_model_t *m;
    bool oom;
    /* mesh */
    uint32_t ws, pp, rep, shard, dp, group; /* group = shard group size G */
    uint32_t n_order;
    Pcs__V1__MeshDimName order[3];
    Pcs__V1__Strategy req, eff;
    uint32_t ar_size; /* all-reduce group after the RS (HSDP) */
    uint32_t vstages, nstages;
    /* per module */
    uint8_t *wrapped, *ignored, *promoted, *unmanaged;
    int32_t *ign_unit; /* per parameter: the unit it joins instead of its region's (its
                        * spec.ignored_params unit, its dtype part), or -1 */
    uint32_t *ign_home; /* the modules holding ignored parameters (build_units) */
    uint32_t *stage_of;
    int32_t *unit_of;
    int32_t container;
    uint32_t nlayers;
    /* units */
    unit_b_t *units;
    uint32_t nunits;
    uint32_t *stage_root; /* stage -> unit index of its root unit */
    /* notes */
    char **notes;
    size_t n_notes, cap_notes;
} ctx_t;

__attribute__((format(printf, 2, 3))) static void note(ctx_t *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = NULL;
    if (pcs_grow((void **)&c->notes, &c->cap_notes, c->n_notes + 1, sizeof *c->notes) != PCS_OK ||
        pcs_strdup(buf, &s) != PCS_OK) {
        c->oom = true;
        return;
    }
    c->notes[c->n_notes++] = s;
}

static char *dupstr(ctx_t *c, const char *s)
{
    char *d = NULL;
    if (pcs_strdup(s ? s : "", &d) != PCS_OK) {
        c->oom = true;
        return (char *)protobuf_c_empty_string;
    }
    return d;
}

static const char *dim_name(Pcs__V1__MeshDimName d)
{
    switch (d) {
    case PCS__V1__MESH_DIM_NAME__MESH_DIM_PP:
        return "pp";
    case PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE:
        return "dp_replicate";
    case PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD:
        return "dp_shard";
    default:
        return "?";
    }
}

static const char *strategy_name(Pcs__V1__Strategy s)
{
    switch (s) {
    case PCS__V1__STRATEGY__STRATEGY_FULL_SHARD:
        return "full_shard";
    case PCS__V1__STRATEGY__STRATEGY_SHARD_GRAD_OP:
        return "shard_grad_op";
    case PCS__V1__STRATEGY__STRATEGY_NO_SHARD:
        return "no_shard";
    case PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD:
        return "hybrid_shard";
    case PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2:
        return "hybrid_shard_zero2";
    default:
        return "?";
    }
}

// ----------------------------------------------------------------------------------------------
// mesh and strategy

static void resolve_mesh(ctx_t *c, uint32_t world_size)
{
    const Pcs__V1__JobSpec *s = c->spec;
    uint32_t size[4] = {0, 1, 1, 1};
    bool seen[4] = {false, false, false, false};
    bool bad = false;
    for (size_t i = 0; i < s->n_mesh; i++) {
        const Pcs__V1__MeshDim *d = s->mesh[i];
        int dim = d ? (int)d->dim : 0;
        if (dim < 1 || dim > 3) {
            pcs_errlist_add(&c->errs, "mesh[%zu].dim: required (pp, dp_replicate or dp_shard)", i);
            bad = true;
            continue;
        }
        if (seen[dim]) {
            pcs_errlist_add(&c->errs, "mesh[%zu].dim: %s given twice", i,
                            dim_name((Pcs__V1__MeshDimName)dim));
            bad = true;
            continue;
        }
        if (d->size < 1) {
            pcs_errlist_add(&c->errs, "mesh[%zu].size: must be >= 1", i);
            bad = true;
        }
        seen[dim] = true;
        size[dim] = d->size ? d->size : 1;
        c->order[c->n_order++] = (Pcs__V1__MeshDimName)dim;
    }
    /* dims not given have size 1; appended in torchtitan's default order (pp, dp_replicate,
     * dp_shard) so that dp_shard, when it absorbs the world size, is innermost */
    for (int dim = 1; dim <= 3; dim++)
        if (!seen[dim])
            c->order[c->n_order++] = (Pcs__V1__MeshDimName)dim;
    if (bad)
        return;
    uint64_t prod = (uint64_t)size[1] * size[2] * size[3];
    if (prod > UINT32_MAX) {
        pcs_errlist_add(&c->errs, "mesh: product of sizes exceeds 2^32");
        return;
    }
    uint32_t ws = world_size ? world_size : (uint32_t)prod;
    if (ws != prod) {
        uint64_t base = (uint64_t)size[1] * size[2];
        if (ws % base) {
            pcs_errlist_add(&c->errs,
                            "mesh: world size %u is not a multiple of pp x dp_replicate = %llu", ws,
                            (unsigned long long)base);
            return;
        }
        note(c, "mesh: dp_shard %u -> %llu to fit world size %u", size[3],
             (unsigned long long)(ws / base), ws);
        size[3] = (uint32_t)(ws / base);
    }
    c->ws = ws;
    c->pp = size[1];
    c->rep = size[2];
    c->shard = size[3];
    c->dp = c->rep * c->shard;
}

/* The effective strategy, shard group and all-reduce group of a requested strategy on this
 * mesh; `field` names it in the notes ("strategy", "strategy_overrides[2].strategy"). */
static void strategy_on_mesh(ctx_t *c, Pcs__V1__Strategy req, const char *field,
                             Pcs__V1__Strategy *eff, uint32_t *group, uint32_t *ar)
{
    *eff = req;
    switch (req) {
    case PCS__V1__STRATEGY__STRATEGY_FULL_SHARD:
    case PCS__V1__STRATEGY__STRATEGY_SHARD_GRAD_OP:
        if (c->rep > 1) {
            /* FSDP2: a 2-D (replicate, shard) mesh means HSDP */
            Pcs__V1__Strategy h = req == PCS__V1__STRATEGY__STRATEGY_FULL_SHARD
                                      ? PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD
                                      : PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2;
            note(c, "%s: %s on a mesh with dp_replicate=%u runs as %s (FSDP2 2-D mesh)", field,
                 strategy_name(req), c->rep, strategy_name(h));
            *eff = h;
            *group = c->shard;
            *ar = c->rep;
            break;
        }
        *group = c->shard;
        *ar = 1;
        break;
    case PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD:
    case PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2:
        *group = c->shard;
        *ar = c->rep;
        if (c->rep == 1)
            note(c, "%s: %s with dp_replicate=1 has no replicas (no all-reduce)", field,
                 strategy_name(req));
        break;
    default: /* NO_SHARD */
        *group = 1;
        *ar = c->dp;
        break;
    }
    if (*group == 1 && req != PCS__V1__STRATEGY__STRATEGY_NO_SHARD) {
        /* FSDP1 _init_core_state: a shard group of one rank runs NO_SHARD. pcs all-reduces over
         * every data-parallel rank (PyTorch would all-reduce over the size-1 group only). */
        note(c, "%s: %s with a shard group of 1 runs as no_shard", field, strategy_name(req));
        *eff = PCS__V1__STRATEGY__STRATEGY_NO_SHARD;
        *ar = c->dp;
    }
}

static void resolve_strategy(ctx_t *c)
{
    int s = (int)c->spec->strategy;
    if (s < 0 || s > PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2) {
        pcs_errlist_add(&c->errs, "strategy: unknown value %d", s);
        return;
    }
    c->req = s ? (Pcs__V1__Strategy)s : PCS__V1__STRATEGY__STRATEGY_FULL_SHARD;
    c->eff = c->req;
    if (!c->ws)
        return;
    strategy_on_mesh(c, c->req, "strategy", &c->eff, &c->group, &c->ar_size);
    const Pcs__V1__TrainingSpec *t = c->spec->training;
    if (t && t->gradient_divide_factor) {
        double f = t->gradient_divide_factor->value;
        if (!isfinite(f) || !(f > 0))
            pcs_errlist_add(&c->errs, "training.gradient_divide_factor: must be finite and > 0");
    }
}

// ----------------------------------------------------------------------------------------------
// precision validation and override matching

static void check_dtype(ctx_t *c, int dt, const char *path)
{
    if (dt == 0)
        return;
    if (dt < 0 || dt >= PCS_DTYPE_COUNT)
        pcs_errlist_add(&c->errs, "%s: unknown dtype %d", path, dt);
    else if (!pcs_dtype_is_float((pcs_dtype_t)dt))
        pcs_errlist_add(&c->errs, "%s: %s is not a floating dtype", path,
                        pcs_dtype_name((pcs_dtype_t)dt));
}

static void check_precision(ctx_t *c)
{
    const Pcs__V1__PrecisionSpec *p = c->spec->precision;
    if (!p)
        return;
    check_dtype(c, p->param_dtype, "precision.param_dtype");
    check_dtype(c, p->reduce_dtype, "precision.reduce_dtype");
    check_dtype(c, p->buffer_dtype, "precision.buffer_dtype");
    check_dtype(c, p->output_dtype, "precision.output_dtype");
    check_dtype(c, p->master_dtype, "precision.master_dtype");
    char path[96];
    for (size_t i = 0; i < p->n_overrides; i++) {
        const Pcs__V1__PrecisionOverride *o = p->overrides[i];
        const Pcs__V1__OverrideMatch *mt = o->match;
        if (!mt || ((!mt->module_class || !*mt->module_class) && (!mt->path || !*mt->path)))
            pcs_errlist_add(&c->errs,
                            "precision.overrides[%zu].match: required (module_class "
                            "or path)",
                            i);
#define CHK(f)                                                                                     \
    snprintf(path, sizeof path, "precision.overrides[%zu]." #f, i);                                \
    check_dtype(c, o->f, path)
        CHK(param_dtype);
        CHK(reduce_dtype);
        CHK(buffer_dtype);
        CHK(output_dtype);
#undef CHK
    }
}

static bool override_matches(const Pcs__V1__OverrideMatch *mt, const pcs_model_module_t *mod)
{
    if (!mt)
        return false;
    bool has_cls = mt->module_class && *mt->module_class;
    bool has_path = mt->path && *mt->path;
    if (!has_cls && !has_path)
        return false;
    if (has_cls && strcmp(mt->module_class, mod->cls) != 0)
        return false;
    if (has_path) {
        size_t n = strlen(mt->path);
        if (mt->path[n - 1] == '*') {
            if (strncmp(mod->path, mt->path, n - 1) != 0)
                return false;
        } else if (strcmp(mt->path, mod->path) != 0) {
            return false;
        }
    }
    return true;
}

/* A shard_placements[].param: an FQN, or a prefix ending in '*'. */
static bool placement_matches(const char *pat, const char *fqn)
{
    size_t n = pat ? strlen(pat) : 0;
    if (n == 0)
        return false;
    return pat[n - 1] == '*' ? strncmp(fqn, pat, n - 1) == 0 : strcmp(fqn, pat) == 0;
}

static bool override_is_prefix(const Pcs__V1__OverrideMatch *mt)
{
    const char *p = mt ? mt->path : NULL;
    return p && *p && p[strlen(p) - 1] == '*';
}

// ----------------------------------------------------------------------------------------------
// units: FSDP1 _recursive_wrap over the tree, iteratively (explicit trees may be deep)

static bool class_in(const char *cls, char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] && strcmp(list[i], cls) == 0)
            return true;
    return false;
}

static void select_units(ctx_t *c)
{
    pcs_model_t *m = c->m;
    const Pcs__V1__WrapSpec *w = c->spec->wrap;
    const Pcs__V1__PrecisionSpec *prec = c->spec->precision;
    uint32_t n = m->n_modules;

    /* ignored classes: default the BatchNorms; [none] disables */
    static char *const default_ignored[] = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d"};
    char *const *ign = default_ignored;
    size_t n_ign = 3;
    if (w && w->n_ignored_module_classes) {
        ign = w->ignored_module_classes;
        n_ign = w->n_ignored_module_classes;
        for (size_t i = 0; i < n_ign; i++)
            if (ign[i] && strcasecmp(ign[i], "none") == 0)
                n_ign = 0;
    }
    uint32_t n_ignored = 0;
    for (uint32_t i = 1; i < n; i++)
        if (class_in(m->modules[i].cls, ign, n_ign)) {
            c->ignored[i] = 1;
            n_ignored++;
        }
    if (n_ignored)
        note(c,
             "wrap: %u module(s) of ignored classes are their own units with mixed precision "
             "off",
             n_ignored);

    /* overrides: a unit's flat buffer has one policy (precision) and one strategy, so a
     * matched module becomes a unit */
    const Pcs__V1__JobSpec *spec = c->spec;
    size_t n_prec = prec ? prec->n_overrides : 0;
    for (size_t o = 0; o < n_prec + spec->n_strategy_overrides; o++) {
        const Pcs__V1__OverrideMatch *mt = o < n_prec
                                               ? prec->overrides[o]->match
                                               : spec->strategy_overrides[o - n_prec]->match;
        const char *what = o < n_prec ? "precision.overrides" : "strategy_overrides";
        size_t idx = o < n_prec ? o : o - n_prec;
        bool prefix = override_is_prefix(mt);
        uint32_t hits = 0, n_promoted = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (!override_matches(mt, &m->modules[i]))
                continue;
            hits++;
            if (i == 0)
                continue;
            /* a prefix match promotes only the topmost matched modules */
            if (prefix && override_matches(mt, &m->modules[m->modules[i].parent]))
                continue;
            if (!c->promoted[i] && !c->ignored[i])
                n_promoted++;
            c->promoted[i] = 1;
        }
        if (!hits)
            note(c, "%s[%zu]: matches no module", what, idx);
        else if (n_promoted)
            note(c, "%s[%zu]: %u module(s) made their own units", what, idx, n_promoted);
    }

    int policy = w ? (int)w->policy_case : 0;
    uint64_t min_params = 0;
    if (policy == PCS__V1__WRAP_SPEC__POLICY_SIZE_BASED) {
        min_params = w->size_based ? w->size_based->min_num_params : 0;
        if (min_params < 1) {
            pcs_errlist_add(&c->errs, "wrap.size_based.min_num_params: must be >= 1");
            return;
        }
    }
    uint8_t *explicit_set = NULL;
    if (policy == PCS__V1__WRAP_SPEC__POLICY_EXPLICIT) {
        if (pcs_calloc(n, 1, (void **)&explicit_set) != PCS_OK) {
            c->oom = true;
            return;
        }
        const Pcs__V1__ExplicitWrap *ew = w->explicit_;
        for (size_t i = 0; ew && i < ew->n_paths; i++) {
            int32_t mi = pcs_model_find(m, ew->paths[i] ? ew->paths[i] : "");
            if (mi < 0)
                pcs_errlist_add(&c->errs, "wrap.explicit.paths[%zu]: no module '%s'", i,
                                ew->paths[i] ? ew->paths[i] : "");
            else
                explicit_set[mi] = 1;
        }
    }
    bool individual = false;
    for (uint32_t i = 1; i < n && !individual; i++)
        individual = c->ignored[i] || c->promoted[i];

    /* recurse(i): FSDP1 recurses into a module's children iff the policy says so for it */
    uint8_t *visit = NULL;
    uint64_t *ret = NULL;
    if (pcs_calloc(n, 1, (void **)&visit) != PCS_OK ||
        pcs_calloc(n, sizeof *ret, (void **)&ret) != PCS_OK) {
        c->oom = true;
        goto out;
    }
    uint8_t *recurse = c->wrapped; /* scratch until the bottom-up pass overwrites it */
    for (uint32_t i = 0; i < n; i++) {
        const pcs_model_module_t *mod = &m->modules[i];
        bool r;
        if (policy == PCS__V1__WRAP_SPEC__POLICY_SIZE_BASED)
            r = mod->subtree_numel >= min_params && strcmp(mod->cls, "MultiheadAttention") != 0;
        else
            r = policy != 0; /* module_class and explicit policies always recurse */
        recurse[i] = r || individual;
        visit[i] = i == 0 || (visit[mod->parent] && recurse[mod->parent]);
    }
    /* bottom-up: remainder = subtree - wrapped children; wrap if the policy says so */
    for (uint32_t i = n; i-- > 0;) {
        const pcs_model_module_t *mod = &m->modules[i];
        bool wrap = false;
        if (visit[i] && recurse[i]) {
            uint64_t wrapped_numel = ret[i]; /* children added their returns here */
            uint64_t rem = mod->subtree_numel - wrapped_numel;
            if (i != 0) {
                if (c->ignored[i] || c->promoted[i])
                    wrap = true;
                else if (policy == PCS__V1__WRAP_SPEC__POLICY_SIZE_BASED)
                    wrap = rem >= min_params && strcmp(mod->cls, "ModuleList") != 0 &&
                           strcmp(mod->cls, "ModuleDict") != 0;
                else if (policy == PCS__V1__WRAP_SPEC__POLICY_MODULE_CLASS)
                    wrap = w->module_class &&
                           class_in(mod->cls, w->module_class->classes, w->module_class->n_classes);
                else if (policy == PCS__V1__WRAP_SPEC__POLICY_EXPLICIT)
                    wrap = explicit_set[i];
            }
            ret[i] = wrap ? mod->subtree_numel : wrapped_numel;
        } else {
            ret[i] = 0;
        }
        if (i)
            ret[mod->parent] += ret[i];
        c->wrapped[i] = wrap;
    }
    /* FSDP ignored_modules: each is a unit of its own holding its whole subtree (no unit, no
     * ignored class, no promotion inside it) */
    const Pcs__V1__JobSpec *s = c->spec;
    uint32_t n_unmanaged = 0;
    for (size_t k = 0; k < s->n_ignored_modules; k++) {
        int32_t mi = pcs_model_find(m, s->ignored_modules[k] ? s->ignored_modules[k] : "");
        if (mi <= 0) {
            pcs_errlist_add(&c->errs, "ignored_modules[%zu]: %s", k,
                            mi == 0 ? "the root module cannot be ignored"
                                    : "no such module in the model");
            continue;
        }
        if (!c->unmanaged[mi])
            n_unmanaged++;
        c->unmanaged[mi] = 1;
    }
    for (uint32_t i = 1; i < n && n_unmanaged; i++) {
        if (!c->unmanaged[i])
            continue;
        c->wrapped[i] = 1;
        c->ignored[i] = 0;
        for (uint32_t d = i + 1; d < m->modules[i].subtree_end; d++)
            c->wrapped[d] = c->ignored[d] = c->promoted[d] = c->unmanaged[d] = 0;
        i = m->modules[i].subtree_end - 1; /* an ignored module inside one is part of it */
    }
    if (n_unmanaged)
        note(c,
             "ignored_modules: %u module(s) not managed (whole on every rank, no cast, no "
             "gradient reduction)",
             n_unmanaged);
out:
    free(visit);
    free(ret);
    free(explicit_set);
}

// ----------------------------------------------------------------------------------------------
// pipeline layers and stages

static void find_layers(ctx_t *c)
{
    pcs_model_t *m = c->m;
    c->container = 0;
    for (uint32_t i = 1; i < m->n_modules; i++) {
        const char *cls = m->modules[i].cls;
        if ((strcmp(cls, "ModuleList") == 0 || strcmp(cls, "Sequential") == 0 ||
             strcmp(cls, "ModuleDict") == 0) &&
            m->modules[i].subtree_end > i + 1) {
            c->container = (int32_t)i;
            break;
        }
    }
    c->nlayers = 0;
    for (uint32_t i = (uint32_t)c->container + 1; i < m->modules[c->container].subtree_end;
         i = m->modules[i].subtree_end)
        c->nlayers++;
}

static void assign_stages(ctx_t *c)
{
    pcs_model_t *m = c->m;
    const Pcs__V1__PipelineSpec *ps = c->spec->pipeline;
    c->vstages = ps && ps->virtual_stages ? ps->virtual_stages : 1;
    if (c->pp == 1 && c->vstages > 1) {
        note(c, "pipeline.virtual_stages: %u ignored without a pp mesh dimension", c->vstages);
        c->vstages = 1;
    }
    uint64_t S = (uint64_t)c->pp * c->vstages;
    if (S > c->nlayers && S > 1) {
        pcs_errlist_add(&c->errs,
                        "mesh: pp=%u x pipeline.virtual_stages=%u = %llu stages need at least "
                        "as many layers; the model has %u (children of '%s')",
                        c->pp, c->vstages, (unsigned long long)S, c->nlayers,
                        m->modules[c->container].path);
        return;
    }
    c->nstages = (uint32_t)S;
    uint32_t cont = (uint32_t)c->container, L = c->nlayers;
    uint32_t layer = 0;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        uint32_t st;
        if (S <= 1)
            st = 0;
        else if (i <= cont)
            st = 0; /* the container, its ancestors and everything before it */
        else if (i >= m->modules[cont].subtree_end)
            st = (uint32_t)S - 1; /* after the layers (final norm, head) */
        else {
            if ((uint32_t)m->modules[i].parent == cont && i != cont + 1)
                layer++;
            /* stage s holds layers [floor(s L / S), floor((s+1) L / S)) */
            st = (uint32_t)((uint64_t)layer * S / L);
            while (st > 0 && (uint64_t)st * L / S > layer)
                st--;
            while (st + 1 < S && (uint64_t)(st + 1) * L / S <= layer)
                st++;
        }
        c->stage_of[i] = st;
    }
}

// ----------------------------------------------------------------------------------------------
// unit list and region assignment

static pcs_status_t build_units(ctx_t *c)
{
    pcs_model_t *m = c->m;
    uint32_t n = m->n_modules, S = c->nstages ? c->nstages : 1;
    uint32_t nw = 0;
    for (uint32_t i = 1; i < n; i++)
        nw += c->wrapped[i];
    /* spec.ignored_params: the modules holding some (each gets a unit of its own) */
    const Pcs__V1__JobSpec *spec = c->spec;
    uint32_t n_ign = 0, n_ign_params = 0;
    PCS_CHECK(pcs_calloc(m->n_params + 1, sizeof *c->ign_unit, (void **)&c->ign_unit));
    for (uint32_t i = 0; i < m->n_params; i++)
        c->ign_unit[i] = -1;
    PCS_CHECK(pcs_calloc(spec->n_ignored_params + 1, sizeof *c->ign_home, (void **)&c->ign_home));
    uint32_t *ign_home = c->ign_home;
    for (size_t k = 0; k < spec->n_ignored_params; k++) {
        const char *fqn = spec->ignored_params[k] ? spec->ignored_params[k] : "";
        uint32_t i = 0;
        while (i < m->n_params && strcmp(m->params[i].fqn, fqn) != 0)
            i++;
        if (i == m->n_params) {
            const char *owner = NULL;
            for (uint32_t a = 0; a < m->n_aliases && !owner; a++)
                if (!strcmp(m->aliases[a].fqn, fqn))
                    owner = m->params[m->aliases[a].param].fqn;
            if (owner)
                pcs_errlist_add(&c->errs,
                                "ignored_params[%zu]: '%.200s' is the shared parameter '%s': name "
                                "that one",
                                k, fqn, owner);
            else
                pcs_errlist_add(&c->errs, "ignored_params[%zu]: no parameter '%.200s' in the model",
                                k, fqn);
            continue;
        }
        if (S > 1) {
            pcs_errlist_add(&c->errs, "ignored_params[%zu]: not with pipeline stages", k);
            continue;
        }
        uint32_t home = m->params[i].home;
        /* inside an ignored module already: unmanaged with it */
        bool in_unmanaged = false;
        for (uint32_t a = home; !in_unmanaged; a = (uint32_t)m->modules[a].parent) {
            in_unmanaged = c->unmanaged[a] != 0;
            if (a == 0)
                break;
        }
        if (in_unmanaged || c->ign_unit[i] == -2)
            continue;
        c->ign_unit[i] = -2; /* (its unit below) */
        n_ign_params++;
        uint32_t h = 0;
        while (h < n_ign && ign_home[h] != home)
            h++;
        if (h == n_ign)
            ign_home[n_ign++] = home;
    }
    PCS_CHECK(pcs_calloc((size_t)nw + S + n_ign, sizeof *c->units, (void **)&c->units));
    PCS_CHECK(pcs_calloc(S, sizeof *c->stage_root, (void **)&c->stage_root));
    /* a wrapped module must lie inside one stage */
    if (S > 1) {
        for (uint32_t i = 1; i < n; i++)
            if (c->wrapped[i] && pcs_model_contains(m, i, (uint32_t)c->container))
                pcs_errlist_add(&c->errs,
                                "wrap: unit '%s' contains the pipeline layers of '%s' and would "
                                "span stages; wrap the layers or modules inside them",
                                m->modules[i].path, m->modules[c->container].path);
        if (c->errs.count)
            return PCS_ERR_INVALID_ARG;
    }
    /* stage-major, then preorder: bucket the wrapped modules by stage */
    uint32_t *cnt = NULL;
    PCS_CHECK(pcs_calloc((size_t)S + 1, sizeof *cnt, (void **)&cnt));
    for (uint32_t i = 1; i < n; i++)
        if (c->wrapped[i])
            cnt[c->stage_of[i] + 1]++;
    uint32_t pos = 0;
    for (uint32_t s = 0; s < S; s++) {
        uint32_t k = cnt[s + 1];
        cnt[s] = pos + 1; /* first slot after the stage root */
        c->stage_root[s] = pos;
        c->units[pos] = (unit_b_t){.root = 0, .stage = s, .is_root = true};
        pos += 1 + k;
    }
    c->nunits = pos;
    for (uint32_t i = 1; i < n; i++)
        if (c->wrapped[i]) {
            uint32_t s = c->stage_of[i];
            c->units[cnt[s]++] = (unit_b_t){.root = i,
                                            .stage = s,
                                            .ignored = c->ignored[i] != 0,
                                            .unmanaged = c->unmanaged[i] != 0};
        }
    free(cnt);
    /* the ignored parameters' units in forward (pre)order, each after the unit whose module
     * region its home module lies in (one stage here: units are in ascending root order) */
    for (uint32_t h = 1; h < n_ign; h++) /* (few: insertion sort) */
        for (uint32_t j = h; j > 0 && ign_home[j - 1] > ign_home[j]; j--) {
            uint32_t t = ign_home[j];
            ign_home[j] = ign_home[j - 1];
            ign_home[j - 1] = t;
        }
    for (uint32_t h = n_ign, k = c->nunits; h-- > 0;) {
        while (k > 0 && c->units[k - 1].root > ign_home[h]) {
            c->units[k - 1 + h + 1] = c->units[k - 1]; /* shift right by the h + 1 still to place */
            k--;
        }
        c->units[k + h] = (unit_b_t){.root = ign_home[h], .unmanaged = true, .params_only = true};
    }
    c->nunits += n_ign;
    for (uint32_t k = 0; k < c->nunits; k++)
        for (uint32_t i = 0; c->units[k].params_only && i < m->n_params; i++)
            if (c->ign_unit[i] == -2 && m->params[i].home == c->units[k].root)
                c->ign_unit[i] = (int32_t)k;
    if (n_ign)
        note(c,
             "ignored_params: %u parameter(s) not managed, in %u unit(s) of their own (whole on "
             "every rank, no cast, no gradient reduction)",
             n_ign_params, n_ign);
    /* region: nearest wrapped ancestor-or-self, else the root unit of the module's stage
     * (preorder: a parent is assigned before its children) */
    c->unit_of[0] = (int32_t)c->stage_root[c->stage_of[0]];
    for (uint32_t k = 0; k < c->nunits; k++)
        if (!c->units[k].is_root && !c->units[k].params_only)
            c->unit_of[c->units[k].root] = (int32_t)k;
    for (uint32_t i = 1; i < n; i++) {
        if (c->wrapped[i])
            continue;
        int32_t u = c->unit_of[m->modules[i].parent];
        if (c->units[u].is_root)
            u = (int32_t)c->stage_root[c->stage_of[i]];
        c->unit_of[i] = u;
    }
    return PCS_OK;
}

/* Per-module composition: every unit runs spec.strategy unless a strategy_overrides entry
 * matches its root module (later entries win). */
static void unit_strategies(ctx_t *c)
{
    const Pcs__V1__JobSpec *s = c->spec;
    for (uint32_t k = 0; k < c->nunits; k++) {
        bool own = c->units[k].unmanaged; /* replicated, never reduced */
        c->units[k].eff = own ? PCS__V1__STRATEGY__STRATEGY_NO_SHARD : c->eff;
        c->units[k].group = own ? 1 : c->group;
        c->units[k].ar = own ? 1 : c->ar_size;
    }
    for (size_t o = 0; o < s->n_strategy_overrides; o++) {
        const Pcs__V1__StrategyOverride *ov = s->strategy_overrides[o];
        int req = (int)ov->strategy;
        if (req <= 0 || req > PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2) {
            pcs_errlist_add(&c->errs, "strategy_overrides[%zu].strategy: %s", o,
                            req ? "unknown value" : "required");
            continue;
        }
        char field[64];
        snprintf(field, sizeof field, "strategy_overrides[%zu].strategy", o);
        Pcs__V1__Strategy eff;
        uint32_t group = 1, ar = 1, hits = 0;
        strategy_on_mesh(c, (Pcs__V1__Strategy)req, field, &eff, &group, &ar);
        for (uint32_t k = 0; k < c->nunits; k++) {
            if (c->units[k].unmanaged ||
                !override_matches(ov->match, &c->m->modules[c->units[k].root]))
                continue;
            c->units[k].eff = eff;
            c->units[k].group = group;
            c->units[k].ar = ar;
            hits++;
        }
        if (hits)
            note(c, "strategy_overrides[%zu]: %u unit(s) run as %s", o, hits, strategy_name(eff));
    }
}

/* The unit parameter i joins: its home module's region's (the stage root's for the root
 * region), or the unit of its own it was given (ignored_params, a dtype part). */
static uint32_t param_unit(const ctx_t *c, uint32_t i)
{
    const pcs_model_tensor_t *t = &c->m->params[i];
    if (c->ign_unit[i] >= 0)
        return (uint32_t)c->ign_unit[i];
    int32_t u = c->unit_of[t->home];
    if (c->units[u].is_root)
        u = (int32_t)c->stage_root[c->stage_of[t->module]];
    return (uint32_t)u;
}

/* Mixed-dtype groups (FSDP2: a group's parameters may differ in dtype, e.g. frozen bf16 base
 * weights beside fp32 adapters; its all-gather then moves bytes, as uint8, spec §4.1 step 2).
 * pcs keeps one dtype per unit's buffers: the parameters of each other dtype become a unit of
 * their own right after it, a dtype part, with the same root, strategy and policy and no module
 * or buffer. Each parameter's shard is the same as in FSDP2's group (per-parameter sharding);
 * a part has its own collectives. FSDP1's flat layout keeps one dtype (fill_unit says so), as
 * do units whose masters precision.master_dtype converts. Unmanaged units (ignored modules and
 * parameters) are never flattened by PyTorch: they split whatever the layout. */
static pcs_status_t split_dtype_groups(ctx_t *c)
{
    const pcs_model_t *m = c->m;
    const Pcs__V1__PrecisionSpec *ps = c->spec->precision;
    if (ps && ps->master_dtype)
        return PCS_OK;
    const char *lay = c->spec->shard_layout ? c->spec->shard_layout : "";
    bool per_param = !strcmp(lay, "per_param");
    uint32_t nu = c->nunits, np = m->n_params;
    enum { ND = PCS_DTYPE_COUNT };
    /* per unit and dtype: -1 unseen, else the order of first appearance (0: the unit's own) */
    int8_t *seen = NULL;
    uint32_t *nparts = NULL, *newi = NULL;
    int32_t *to = NULL;
    unit_b_t *units = NULL;
    pcs_status_t rc = PCS_OK;
    PCS_CHECK_GOTO(pcs_calloc((size_t)nu * ND, 1, (void **)&seen), rc, out);
    PCS_CHECK_GOTO(pcs_calloc((size_t)nu + 1, sizeof *nparts, (void **)&nparts), rc, out);
    memset(seen, -1, (size_t)nu * ND);
    uint32_t extra = 0;
    for (uint32_t i = 0; i < np; i++) {
        uint32_t u = param_unit(c, i);
        pcs_dtype_t d = m->params[i].dtype;
        if ((unsigned)d >= ND || seen[(size_t)u * ND + d] >= 0)
            continue;
        /* order of first appearance: the count of dtypes seen so far */
        int8_t k = 0;
        for (int e = 0; e < ND; e++)
            k += seen[(size_t)u * ND + e] >= 0;
        seen[(size_t)u * ND + d] = k;
        if (k > 0 && (per_param || c->units[u].unmanaged)) {
            nparts[u]++;
            extra++;
        }
    }
    if (!extra)
        goto out;
    if (c->nstages > 1) {
        for (uint32_t u = 0; u < nu; u++)
            if (nparts[u])
                pcs_errlist_add(&c->errs,
                                "model: unit '%s' mixes parameter dtypes: not with pipeline "
                                "stages",
                                m->modules[c->units[u].root].path);
        goto out;
    }
    PCS_CHECK_GOTO(pcs_calloc((size_t)nu + extra, sizeof *units, (void **)&units), rc, out);
    PCS_CHECK_GOTO(pcs_calloc((size_t)nu + 1, sizeof *newi, (void **)&newi), rc, out);
    uint32_t pos = 0;
    for (uint32_t u = 0; u < nu; u++) {
        newi[u] = pos;
        units[pos++] = c->units[u];
        for (uint32_t j = 0; j < nparts[u]; j++) {
            units[pos] = c->units[u];
            units[pos].params_only = true;
            units[pos].dtype_part = true;
            pos++;
        }
    }
    /* each parameter of another dtype than its unit's first joins the part of its dtype (the
     * old indices until the units are replaced) */
    PCS_CHECK_GOTO(pcs_calloc((size_t)np + 1, sizeof *to, (void **)&to), rc, out);
    for (uint32_t i = 0; i < np; i++) {
        uint32_t u = param_unit(c, i);
        pcs_dtype_t d = m->params[i].dtype;
        int8_t k = (unsigned)d < ND ? seen[(size_t)u * ND + d] : -1;
        to[i] = nparts[u] && k > 0 ? (int32_t)(newi[u] + (uint32_t)k)
                : c->ign_unit[i] >= 0 ? (int32_t)newi[c->ign_unit[i]]
                                      : -1;
    }
    for (uint32_t i = 0; i < m->n_modules; i++)
        c->unit_of[i] = (int32_t)newi[c->unit_of[i]];
    for (uint32_t s = 0; s < (c->nstages ? c->nstages : 1); s++)
        c->stage_root[s] = newi[c->stage_root[s]];
    for (uint32_t u = 0; u < nu; u++)
        if (nparts[u] && c->units[u].unmanaged)
            note(c,
                 "unmanaged unit '%s' mixes parameter dtypes: %u more unit(s) of its parameters "
                 "of another dtype",
                 m->modules[c->units[u].root].path, nparts[u]);
        else if (nparts[u])
            note(c,
                 "unit '%s' mixes parameter dtypes: %u more unit(s) of its parameters of another "
                 "dtype (FSDP2 gathers the group's bytes in one collective, pcs one per dtype; "
                 "the shards are the same)",
                 m->modules[c->units[u].root].path, nparts[u]);
    memcpy(c->ign_unit, to, (size_t)np * sizeof *to);
    free(c->units);
    c->units = units;
    units = NULL;
    c->nunits = nu + extra;
out:
    free(seen);
    free(nparts);
    free(newi);
    free(to);
    free(units);
    return rc;
}

// ----------------------------------------------------------------------------------------------
// per-unit precision

static pcs_status_t unit_precision(ctx_t *c, const unit_b_t *ub, pcs_dtype_t master,
                                   pcs_precision_t *out)
{
    const Pcs__V1__PrecisionSpec *p = c->spec->precision;
    const pcs_model_module_t *mod = &c->m->modules[ub->root];
    pcs_precision_in_t in = {
        .master = master, .cast_forward_inputs = true, .mixed_precision = !ub->ignored};
    if (ub->unmanaged) { /* not FSDP's: its own dtype, no policy, no override */
        in.mixed_precision = false;
        pcs_plan_resolve_precision(&in, out);
        return PCS_OK;
    }
    if (p) {
        in.param = (pcs_dtype_t)p->param_dtype;
        in.reduce = (pcs_dtype_t)p->reduce_dtype;
        in.buffer = (pcs_dtype_t)p->buffer_dtype;
        in.output = (pcs_dtype_t)p->output_dtype;
        if (p->cast_forward_inputs)
            in.cast_forward_inputs = p->cast_forward_inputs->value;
        /* FSDP1 _root_pre_forward: the root casts when cast_root_forward_inputs is set, whatever
         * cast_forward_inputs says (_pre_forward casts on that one) */
        if (ub->is_root && p->cast_root_forward_inputs && p->cast_root_forward_inputs->value)
            in.cast_forward_inputs = true;
        if (p->keep_low_precision_grads)
            in.keep_low_precision_grads = p->keep_low_precision_grads->value;
        for (size_t i = 0; i < p->n_overrides; i++) {
            const Pcs__V1__PrecisionOverride *o = p->overrides[i];
            if (!override_matches(o->match, mod))
                continue;
            if (o->param_dtype)
                in.param = (pcs_dtype_t)o->param_dtype;
            if (o->reduce_dtype)
                in.reduce = (pcs_dtype_t)o->reduce_dtype;
            if (o->buffer_dtype)
                in.buffer = (pcs_dtype_t)o->buffer_dtype;
            if (o->output_dtype)
                in.output = (pcs_dtype_t)o->output_dtype;
            if (o->cast_forward_inputs)
                in.cast_forward_inputs = o->cast_forward_inputs->value;
            if (o->keep_low_precision_grads)
                in.keep_low_precision_grads = o->keep_low_precision_grads->value;
            if (o->full_precision)
                in.mixed_precision = false;
        }
    }
    pcs_plan_resolve_precision(&in, out);
    return PCS_OK;
}

// ----------------------------------------------------------------------------------------------
// plan message assembly

typedef struct pkey {
    uint32_t unit, key, p;
} pkey_t;

static int pkey_cmp(const void *a, const void *b)
{
    const pkey_t *x = a, *y = b;
    if (x->unit != y->unit)
        return x->unit < y->unit ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->p < y->p ? -1 : (x->p > y->p);
}

static Pcs__V1__CollectiveSpec *coll(ctx_t *c, Pcs__V1__CollKind kind, Pcs__V1__Phase phase,
                                     pcs_dtype_t dt, Pcs__V1__GroupKind g, uint32_t gsize,
                                     uint64_t count)
{
    Pcs__V1__CollectiveSpec *cs;
    NEW_MSG(c, cs, pcs__v1__collective_spec__init);
    if (!cs)
        return NULL;
    cs->kind = kind;
    cs->phase = phase;
    cs->dtype = (Pcs__V1__DType)dt;
    cs->group = g;
    cs->group_size = gsize;
    cs->count = count;
    return cs;
}

static void add_coll(ctx_t *c, Pcs__V1__Unit *u, Pcs__V1__CollectiveSpec *cs)
{
    if (cs)
        u->collectives[u->n_collectives++] = cs;
}

static Pcs__V1__Reduction *reduction(ctx_t *c, Pcs__V1__ReduceOp op, double pre, double post,
                                     double premul)
{
    Pcs__V1__Reduction *r;
    NEW_MSG(c, r, pcs__v1__reduction__init);
    if (!r)
        return NULL;
    r->op = op;
    r->pre_divide = pre;
    r->post_divide = post;
    r->premul = premul;
    return r;
}

/* training.gradient_divide_factor (FSDP2 set_gradient_divide_factor); 0 = unset (the dp size).
 * Checked in check_divide_factor. */
static double grad_divide_factor(const ctx_t *c)
{
    const Pcs__V1__TrainingSpec *t = c->spec->training;
    return t && t->gradient_divide_factor ? t->gradient_divide_factor->value : 0;
}

/* The unit's gradient reductions in dtype `dt`: into unit.collectives (eval false: with the DDP
 * hook's arithmetic and a world of one's local divide) or unit.eval_collectives (eval true: an
 * eval-mode backward, FSDP's plain rule). FSDP2 _get_gradient_divide_factors picks the ops. */
static void add_reductions(ctx_t *c, const unit_b_t *ub, Pcs__V1__Unit *u, pcs_dtype_t dt,
                           bool eval)
{
    uint32_t rs = ub->group > 1 ? ub->group : 1;
    uint32_t ar = ub->ar;
    Pcs__V1__ReduceOp rs_op, ar_op;
    double premul, pre, post;
    pcs_plan_reduce_ops(dt, rs, ar, grad_divide_factor(c), false, &rs_op, &ar_op, &premul, &pre,
                        &post);
    Pcs__V1__CollectiveSpec **list = eval ? u->eval_collectives : u->collectives;
    size_t *n = eval ? &u->n_eval_collectives : &u->n_collectives;
    Pcs__V1__Phase phase = eval ? PCS__V1__PHASE__PHASE_BACKWARD : PCS__V1__PHASE__PHASE_STEP;
    if (rs <= 1 && ar <= 1) {
        /* World of one: no collective, but FSDP2 foreach_reduce still divides the local gradient
         * by a custom factor (world_size 1 branch; spec §4.2). Unset factor: nothing to do. */
        if (!eval && (premul > 0 || pre != 1 || post != 1))
            u->local_reduction = reduction(c, rs_op, pre, post, premul);
        return;
    }
    if (rs > 1) {
        Pcs__V1__CollectiveSpec *cs = coll(c, PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER, phase,
                                           dt, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, rs,
                                           u->shard_numel);
        if (cs)
            cs->reduction = reduction(c, rs_op, pre, ar > 1 ? 1 : post, premul);
        if (cs)
            list[(*n)++] = cs;
    }
    if (ar > 1) {
        bool hsdp = rs > 1;
        Pcs__V1__CollectiveSpec *cs = coll(
            c, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE, phase, dt,
            hsdp ? PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE : PCS__V1__GROUP_KIND__GROUP_KIND_DP,
            ar, hsdp ? u->shard_numel : u->padded_numel);
        /* No shard group: the size-1 RS leg is local (its PREMUL_SUM(1/factor) multiplies each
         * contribution on the way into the all-reduce, as foreach_reduce divides before it).
         * A DDP hook divides by the whole group before a SUM (DDP's reducer and its compress
         * hooks: no overflow of the low-precision sum); not in eval (FSDP's full precision). */
        const char *ddp = c->spec->ddp_comm_hook ? c->spec->ddp_comm_hook : "";
        if (cs && *ddp && !hsdp && !eval)
            cs->reduction = reduction(c, PCS__V1__REDUCE_OP__REDUCE_OP_SUM, ar, 1, 0);
        else if (cs)
            cs->reduction =
                hsdp ? reduction(c, ar_op, 1, post, 0)
                     : reduction(c,
                                 rs_op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM ? rs_op : ar_op,
                                 pre, post, premul);
        if (cs)
            list[(*n)++] = cs;
    }
}

/* Fill the unit's message (params, buffers, layout, precision, strategy, collectives). */
static void fill_unit(ctx_t *c, uint32_t k, const pkey_t *pk, size_t npk, const uint32_t *mods,
                      size_t nmods, const uint32_t *bufs, size_t nbufs, Pcs__V1__Unit *u)
{
    const pcs_model_t *m = c->m;
    const unit_b_t *ub = &c->units[k];
    const pcs_model_module_t *root = &m->modules[ub->root];
    const Pcs__V1__PrecisionSpec *ps = c->spec->precision;
    u->index = k;
    u->path = dupstr(c, root->path);
    u->module_class = dupstr(c, root->cls);
    u->is_root = ub->is_root;
    u->stage = ub->stage;
    u->shard_group_size = ub->group;
    u->strategy = ub->eff;
    u->unmanaged = ub->unmanaged;

    /* master dtype: precision.master_dtype converts the model (model.half()); else the
     * parameters' own dtype, which must be uniform in a flat buffer (FSDP1's FlatParameter;
     * per_param units and unmanaged ones were split by dtype: split_dtype_groups) */
    pcs_dtype_t master = ps && ps->master_dtype ? (pcs_dtype_t)ps->master_dtype : PCS_DTYPE_NONE;
    if (!master) {
        for (size_t i = 0; i < npk; i++) {
            pcs_dtype_t d = m->params[pk[i].p].dtype;
            if (!master) {
                master = d;
            } else if (d != master) {
                pcs_errlist_add(&c->errs,
                                "model: unit '%s' mixes %s and %s parameters ('%s'); FSDP1's "
                                "flat parameter has one dtype (\"Must flatten tensors with "
                                "uniform dtype\"): set shard_layout: per_param (FSDP2 groups "
                                "them), precision.master_dtype, or wrap them apart",
                                root->path, pcs_dtype_name(master), pcs_dtype_name(d),
                                m->params[pk[i].p].fqn);
                break;
            }
        }
        if (!master)
            master = PCS_DTYPE_FP32;
    }
    pcs_precision_t pr;
    unit_precision(c, ub, master, &pr);
    /* DDP compression hooks (spec §6): the all-reduce runs in the hook's dtype for every bucket;
     * gradients accumulate and come back in their own dtype. Not for unmanaged units (ignored
     * modules and parameters: no all-reduce, no cast) */
    const char *hook = c->spec->ddp_comm_hook && !ub->unmanaged ? c->spec->ddp_comm_hook : "";
    if (!strcmp(hook, "fp16_compress"))
        pr.reduce = PCS_DTYPE_FP16;
    else if (!strcmp(hook, "bf16_compress"))
        pr.reduce = PCS_DTYPE_BF16;
    u->mixed_precision = pr.mixed_precision;
    u->master_dtype = (Pcs__V1__DType)pr.master;
    u->param_dtype = (Pcs__V1__DType)pr.compute;
    u->reduce_dtype = (Pcs__V1__DType)pr.reduce;
    u->grad_dtype = (Pcs__V1__DType)pr.grad;
    u->accum_dtype = (Pcs__V1__DType)pr.accum;
    u->buffer_dtype = (Pcs__V1__DType)pr.buffer;
    u->output_dtype = (Pcs__V1__DType)pr.output;
    u->cast_forward_inputs = pr.cast_forward_inputs;
    u->keep_low_precision_grads = pr.keep_low_precision_grads;

    /* modules */
    u->modules = calloc(nmods ? nmods : 1, sizeof *u->modules);
    if (!u->modules)
        c->oom = true;
    for (size_t i = 0; u->modules && i < nmods; i++) {
        char *s = NULL;
        if (pcs_strdup(m->modules[mods[i]].path, &s) != PCS_OK) {
            c->oom = true;
            break;
        }
        u->modules[u->n_modules++] = s;
    }

    /* layout: FSDP1 use_orig_params=True alignment in the compute dtype */
    uint64_t align = 16 / pcs_dtype_size(pr.compute);
    u->align_numel = align;
    uint64_t off = 0, numel = 0;
    bool trainable = false;
    u->params = calloc(npk ? npk : 1, sizeof *u->params);
    if (!u->params)
        c->oom = true;
    for (size_t i = 0; u->params && i < npk; i++) {
        const pcs_model_tensor_t *t = &m->params[pk[i].p];
        if (i > 0 && off % align)
            off += align - off % align;
        Pcs__V1__ParamSlot *ps2;
        NEW_MSG(c, ps2, pcs__v1__param_slot__init);
        if (!ps2)
            break;
        ps2->fqn = dupstr(c, t->fqn);
        ps2->shape = calloc(t->ndim ? t->ndim : 1, sizeof *ps2->shape);
        if (ps2->shape) {
            memcpy(ps2->shape, t->shape, t->ndim * sizeof *ps2->shape);
            ps2->n_shape = t->ndim;
        } else {
            c->oom = true;
        }
        ps2->numel = t->numel;
        ps2->offset = off;
        ps2->dtype = (Pcs__V1__DType)pr.master;
        ps2->frozen = t->frozen;
        trainable |= !t->frozen;
        u->params[u->n_params++] = ps2;
        numel += t->numel; /* <= off, so it wraps only when off does (an error) */
        /* the validator caps sizes, but the planner does not rely on it (unvalidated specs,
         * mlp weights up to (2^32-1)^2): a wrapping offset is an error, not a small layout */
        if (__builtin_add_overflow(off, t->numel, &off) || off > (1ull << 62)) {
            pcs_errlist_add(&c->errs, "model: unit '%s' has more than 2^62 elements", root->path);
            break;
        }
    }
    uint64_t G = ub->group ? ub->group : 1;
    u->numel = numel;
    u->flat_numel = off;
    u->padded_numel = (off + G - 1) / G * G;
    u->shard_numel = u->padded_numel / G;
    const char *lay = c->spec->shard_layout ? c->spec->shard_layout : "";
    if (!strcmp(lay, "per_param") && G > 1 && !ub->unmanaged && u->params &&
        u->n_params == npk) {
        /* FSDP2 _init_sharded_param: each parameter chunked on dim 0 by the torch.chunk rule,
         * chunks packed back to back in parameter order (no alignment: the all-gather input of
         * foreach_all_gather); the flat buffer keeps its aligned offsets for compute */
        uint64_t sc = 0;
        for (size_t i = 0; i < u->n_params; i++) {
            Pcs__V1__ParamSlot *q = u->params[i];
            uint32_t dim = 0;
            size_t pi = SIZE_MAX;
            for (size_t j = 0; j < c->spec->n_shard_placements; j++) {
                const Pcs__V1__ShardPlacement *sp = c->spec->shard_placements[j];
                if (sp && placement_matches(sp->param, q->fqn)) {
                    dim = sp->dim;
                    pi = j;
                }
            }
            if (dim > 0 && dim >= q->n_shape) {
                pcs_errlist_add(&c->errs,
                                "shard_placements[%zu]: %s has %zu dims, no dim %u to shard on", pi,
                                q->fqn, q->n_shape, dim);
                continue;
            }
            uint64_t rows = q->n_shape ? q->shape[dim] : 1;
            uint64_t inner = rows ? q->numel / rows : 0;
            if (dim > 0 && rows % G) {
                /* FSDP2 _init_sharded_param: NotImplementedError for uneven Shard(k > 0) */
                pcs_errlist_add(&c->errs,
                                "shard_placements[%zu]: %s dim %u has size %llu, not a multiple "
                                "of the shard group size %llu (FSDP2 shards dims other than 0 "
                                "evenly only)",
                                pi, q->fqn, dim, (unsigned long long)rows, (unsigned long long)G);
                continue;
            }
            q->shard_dim = dim;
            q->shard_rows = (rows + G - 1) / G;
            q->shard_offset = sc;
            sc += q->shard_rows * inner; /* <= numel: no overflow past the flat offsets' cap */
        }
        u->layout = PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
        u->shard_numel = sc;
        uint64_t need = 0;
        if (__builtin_mul_overflow(sc, G, &need) || need > (1ull << 62))
            pcs_errlist_add(&c->errs, "model: unit '%s' has more than 2^62 elements", root->path);
        need = need > off ? need : off;
        u->padded_numel = (need + G - 1) / G * G;
    }

    /* buffers: never sharded; floating ones run in buffer_dtype when mixed precision is on */
    u->buffers = calloc(nbufs ? nbufs : 1, sizeof *u->buffers);
    if (!u->buffers)
        c->oom = true;
    for (size_t i = 0; u->buffers && i < nbufs; i++) {
        const pcs_model_tensor_t *t = &m->buffers[bufs[i]];
        Pcs__V1__BufferSlot *bs;
        NEW_MSG(c, bs, pcs__v1__buffer_slot__init);
        if (!bs)
            break;
        bs->fqn = dupstr(c, t->fqn);
        bs->shape = calloc(t->ndim ? t->ndim : 1, sizeof *bs->shape);
        if (bs->shape) {
            memcpy(bs->shape, t->shape, t->ndim * sizeof *bs->shape);
            bs->n_shape = t->ndim;
        } else {
            c->oom = true;
        }
        bs->numel = t->numel;
        bs->dtype = (Pcs__V1__DType)t->dtype;
        bs->run_dtype =
            (Pcs__V1__DType)(pr.buffer && pcs_dtype_is_float(t->dtype) ? pr.buffer : t->dtype);
        u->buffers[u->n_buffers++] = bs;
    }

    /* resharding: root kept after forward; reshard_after_forward overrides the strategy for
     * the other units; shard_grad_op keeps params across no-sync micro-batches */
    bool sharded = ub->eff != PCS__V1__STRATEGY__STRATEGY_NO_SHARD;
    bool zero2 = ub->eff == PCS__V1__STRATEGY__STRATEGY_SHARD_GRAD_OP ||
                 ub->eff == PCS__V1__STRATEGY__STRATEGY_HYBRID_SHARD_ZERO2;
    const Pcs__V1__ReshardAfterForward *raf = c->spec->reshard_after_forward;
    bool r = sharded && !zero2;
    uint32_t rgroup = 0;
    if (raf && raf->value_case == PCS__V1__RESHARD_AFTER_FORWARD__VALUE_ENABLED)
        r = raf->enabled;
    else if (raf && raf->value_case == PCS__V1__RESHARD_AFTER_FORWARD__VALUE_GROUP_SIZE) {
        uint32_t gsz = raf->group_size;
        r = gsz > 1; /* n == 1 behaves as False */
        if (gsz > 1 && gsz < ub->group)
            rgroup = gsz;
    }
    if (!sharded || ub->is_root)
        r = false, rgroup = 0;
    u->reshard_after_forward = r;
    u->reshard_group_size = rgroup;
    u->reshard_after_backward = sharded && !zero2;

    /* collectives, in issue order */
    bool has_params = u->n_params > 0;
    u->collectives = calloc(4, sizeof *u->collectives);
    if (!u->collectives) {
        c->oom = true;
        return;
    }
    if (!has_params || ub->unmanaged) /* an ignored module: no collective, no divide */
        return;
    pcs_dtype_t ag = pr.compute;
    if (ub->group > 1) {
        add_coll(c, u,
                 coll(c, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER, PCS__V1__PHASE__PHASE_FORWARD,
                      ag, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, ub->group, u->shard_numel));
        if (r) {
            if (rgroup)
                add_coll(c, u,
                         coll(c, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER,
                              PCS__V1__PHASE__PHASE_BACKWARD, ag,
                              PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD, rgroup,
                              u->padded_numel / rgroup));
            else
                add_coll(c, u,
                         coll(c, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER,
                              PCS__V1__PHASE__PHASE_BACKWARD, ag,
                              PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, ub->group, u->shard_numel));
        }
    }
    if (!trainable)
        return;
    add_reductions(c, ub, u, pr.reduce, false);
    /* training.eval_backward: the same reductions in the master dtype for an eval-mode backward
     * (FSDP1 _use_full_prec_in_eval), where the training ones are in another dtype */
    const Pcs__V1__TrainingSpec *tr = c->spec->training;
    if (tr && tr->eval_backward && tr->full_precision_eval && pr.mixed_precision &&
        pr.master == PCS_DTYPE_FP32 && (pr.reduce != pr.master || pr.compute != pr.master)) {
        u->eval_collectives = calloc(2, sizeof *u->eval_collectives);
        if (!u->eval_collectives) {
            c->oom = true;
            return;
        }
        add_reductions(c, ub, u, pr.master, true);
    }
}

static void add_group(ctx_t *c, Pcs__V1__Plan *p, Pcs__V1__GroupKind kind, uint32_t size,
                      const Pcs__V1__MeshDimName *dims, size_t ndims)
{
    Pcs__V1__GroupSpec *g;
    NEW_MSG(c, g, pcs__v1__group_spec__init);
    if (!g)
        return;
    g->kind = kind;
    g->size = size;
    g->count = size ? c->ws / size : 0;
    g->dims = calloc(ndims ? ndims : 1, sizeof *g->dims);
    if (g->dims) {
        memcpy(g->dims, dims, ndims * sizeof *dims);
        g->n_dims = ndims;
    } else {
        c->oom = true;
    }
    p->groups[p->n_groups++] = g;
}

static uint32_t optimizer_states(const Pcs__V1__JobSpec *s)
{
    const Pcs__V1__OptimizerSpec *o = s->training ? s->training->optimizer : NULL;
    if (!o)
        return 0;
    if (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW)
        return 2; /* exp_avg, exp_avg_sq */
    if (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_SGD) {
        double mom = o->sgd && o->sgd->momentum ? o->sgd->momentum->value : 0.9;
        return mom != 0 ? 1 : 0;
    }
    return 0;
}

static pcs_status_t assemble(ctx_t *c, Pcs__V1__Plan *p)
{
    pcs_model_t *m = c->m;
    pcs_status_t rc = PCS_OK;
    pkey_t *pk = NULL;
    uint32_t *mods = NULL, *mstart = NULL, *bufs = NULL, *bstart = NULL, *pstart = NULL;
    uint32_t nu = c->nunits;

    /* parameters: unit of the home module (stage roots split the root region by stage), in
     * order of first use (owner or alias) in module-tree order */
    PCS_CHECK_GOTO(pcs_calloc(m->n_params + 1, sizeof *pk, (void **)&pk), rc, out);
    for (uint32_t i = 0; i < m->n_params; i++) {
        pk[i] = (pkey_t){param_unit(c, i), m->params[i].module, i};
    }
    for (uint32_t a = 0; a < m->n_aliases; a++) {
        const pcs_model_alias_t *al = &m->aliases[a];
        pkey_t *k = &pk[al->param];
        if (al->module < k->key)
            k->key = al->module;
        if (c->nstages > 1 && c->stage_of[al->module] != c->stage_of[m->params[al->param].module])
            pcs_errlist_add(&c->errs,
                            "model: parameter '%s' is shared by '%s' across pipeline stages %u "
                            "and %u (not supported)",
                            m->params[al->param].fqn, al->fqn,
                            c->stage_of[m->params[al->param].module], c->stage_of[al->module]);
    }
    qsort(pk, m->n_params, sizeof *pk, pkey_cmp);
    PCS_CHECK_GOTO(pcs_calloc(nu + 1, sizeof *pstart, (void **)&pstart), rc, out);
    for (uint32_t i = 0; i < m->n_params; i++)
        pstart[pk[i].unit + 1]++;
    for (uint32_t k = 0; k < nu; k++)
        pstart[k + 1] += pstart[k];

    /* modules and buffers bucketed by unit (stable: preorder) */
    PCS_CHECK_GOTO(pcs_calloc(m->n_modules + 1, sizeof *mods, (void **)&mods), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(nu + 2, sizeof *mstart, (void **)&mstart), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(m->n_buffers + 1, sizeof *bufs, (void **)&bufs), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(nu + 2, sizeof *bstart, (void **)&bstart), rc, out);
    for (uint32_t i = 0; i < m->n_modules; i++)
        mstart[c->unit_of[i] + 2]++;
    for (uint32_t i = 0; i < m->n_buffers; i++)
        bstart[c->unit_of[m->buffers[i].module] + 2]++;
    for (uint32_t k = 0; k < nu; k++) {
        mstart[k + 2] += mstart[k + 1];
        bstart[k + 2] += bstart[k + 1];
    }
    for (uint32_t i = 0; i < m->n_modules; i++)
        mods[mstart[c->unit_of[i] + 1]++] = i;
    for (uint32_t i = 0; i < m->n_buffers; i++)
        bufs[bstart[c->unit_of[m->buffers[i].module] + 1]++] = i;

    p->units = calloc(nu ? nu : 1, sizeof *p->units);
    if (!p->units) {
        rc = PCS_ERR_NOMEM;
        goto out;
    }
    for (uint32_t k = 0; k < nu && !c->oom; k++) {
        Pcs__V1__Unit *u;
        NEW_MSG(c, u, pcs__v1__unit__init);
        if (!u)
            break;
        p->units[p->n_units++] = u;
        fill_unit(c, k, pk + pstart[k], pstart[k + 1] - pstart[k], mods + mstart[k],
                  mstart[k + 1] - mstart[k], bufs + bstart[k], bstart[k + 1] - bstart[k], u);
    }

    /* pcs rule, explicit where PyTorch is silent: a unit that computes in another dtype than
     * the unit around it hands its outputs back in the enclosing unit's compute dtype unless
     * output_dtype is set. Without it an fp32 LayerNorm override inside a bf16 model feeds fp32
     * activations into the next bf16 matmul ("mat1 and mat2 must have the same dtype" in
     * PyTorch); FSDP2's documented fix is output_dtype = param_dtype on such a unit. */
    for (uint32_t k = 0; k < p->n_units && !c->oom; k++) {
        Pcs__V1__Unit *u = p->units[k];
        if (u->is_root || u->output_dtype || u->unmanaged || c->units[k].dtype_part)
            continue; /* (a dtype part's outputs are its module's unit's) */
        uint32_t parent = m->modules[c->units[k].root].parent;
        const Pcs__V1__Unit *pu = p->units[c->unit_of[parent]];
        /* only where a policy made the difference: parameters of their own dtypes computing
         * uncast (a bf16 block in an fp32 model, no policy) get no cast, as in FSDP2 */
        bool cast = u->param_dtype != u->master_dtype || pu->param_dtype != pu->master_dtype;
        if (cast && pu->param_dtype != u->param_dtype) {
            u->output_dtype = pu->param_dtype;
            note(c,
                 "unit %u '%s' computes in %s inside %s unit '%s': its outputs are cast to %s "
                 "(set output_dtype to override)",
                 k, u->path, pcs_dtype_name((pcs_dtype_t)u->param_dtype),
                 pcs_dtype_name((pcs_dtype_t)pu->param_dtype), pu->path,
                 pcs_dtype_name((pcs_dtype_t)pu->param_dtype));
        }
    }

    /* FSDP2's group rule (FSDPParamGroup._init_mp_dtypes, spec §1): the trainable parameters
     * of a group share their original dtype; only frozen ones may differ (a frozen bf16 base
     * beside fp32 adapters) */
    for (uint32_t k = 0; k < p->n_units && !c->oom; k++) {
        const Pcs__V1__Unit *u = p->units[k];
        if (c->units[k].dtype_part || u->unmanaged)
            continue;
        const Pcs__V1__ParamSlot *first = NULL;
        Pcs__V1__DType dt = 0;
        for (uint32_t j = k; j < p->n_units && (j == k || c->units[j].dtype_part); j++) {
            const Pcs__V1__Unit *q = p->units[j];
            const Pcs__V1__ParamSlot *t = NULL;
            for (size_t i = 0; i < q->n_params && !t; i++)
                if (!q->params[i]->frozen)
                    t = q->params[i];
            if (!t)
                continue;
            if (!first) {
                first = t;
                dt = q->master_dtype;
            } else if (q->master_dtype != dt) {
                pcs_errlist_add(&c->errs,
                                "model: unit '%s' trains %s and %s parameters ('%s', '%s'): the "
                                "trainable parameters of an FSDP2 group share their dtype "
                                "(\"FSDP expects uniform original parameter dtype\"); freeze "
                                "one dtype, convert the model (precision.master_dtype) or wrap "
                                "them apart",
                                u->path, pcs_dtype_name((pcs_dtype_t)dt),
                                pcs_dtype_name((pcs_dtype_t)q->master_dtype), first->fqn, t->fqn);
                break;
            }
        }
    }

    /* stages */
    uint32_t S = c->nstages ? c->nstages : 1;
    p->stages = calloc(S, sizeof *p->stages);
    if (!p->stages)
        c->oom = true;
    for (uint32_t s = 0; p->stages && s < S && !c->oom; s++) {
        Pcs__V1__StageSpec *st;
        NEW_MSG(c, st, pcs__v1__stage_spec__init);
        if (!st)
            break;
        p->stages[p->n_stages++] = st;
        st->stage = s;
        st->pp_rank = s % c->pp;
        st->first_layer = (uint32_t)((uint64_t)s * c->nlayers / S);
        st->last_layer = (uint32_t)((uint64_t)(s + 1) * c->nlayers / S);
        uint32_t first = c->stage_root[s];
        uint32_t last = s + 1 < S ? c->stage_root[s + 1] : nu;
        st->units = calloc(last - first + 1, sizeof *st->units);
        if (!st->units) {
            c->oom = true;
            break;
        }
        for (uint32_t k = first; k < last; k++)
            st->units[st->n_units++] = k;
    }
out:
    free(pk);
    free(pstart);
    free(mods);
    free(mstart);
    free(bufs);
    free(bstart);
    if (rc == PCS_OK && c->oom)
        rc = PCS_ERR_NOMEM;
    return rc;
}

/* The element-wise max of the ranks' estimates (x->rank: the rank with the largest total):
 * ranks differ by their pp coordinate, and by their shard index only when a unit mixes frozen
 * and trainable parameters (optimizer state covers the trainable elements of the rank's shard);
 * walking the shard indices is then O(shard x units). x is initialised here. */
static pcs_status_t estimate_max_of(const ctx_t *c, const Pcs__V1__Plan *p,
                                    Pcs__V1__RankEstimate *x)
{
    pcs__v1__rank_estimate__init(x);
    bool mixed = false;
    for (size_t i = 0; i < p->n_units && !mixed; i++) {
        const Pcs__V1__Unit *un = p->units[i];
        bool fz = false, tr = false;
        for (size_t j = 0; j < un->n_params; j++) {
            fz |= un->params[j]->frozen;
            tr |= !un->params[j]->frozen;
        }
        mixed = fz && tr;
    }
    uint32_t nshard = mixed ? c->shard : 1;
    for (uint32_t k = 0; k < c->pp * nshard; k++) {
        Pcs__V1__MeshCoords mc = PCS__V1__MESH_COORDS__INIT;
        mc.pp = k / nshard;
        mc.dp_shard = k % nshard;
        uint32_t rank = pcs_plan_rank_of(p, &mc);
        Pcs__V1__RankEstimate e;
        PCS_CHECK(pcs_plan_rank_estimate(p, rank, &e));
        if (k == 0 || e.total_bytes > x->total_bytes)
            x->rank = rank;
#define MAXF(f) x->f = e.f > x->f ? e.f : x->f
        MAXF(param_shard_bytes);
        MAXF(grad_shard_bytes);
        MAXF(optimizer_bytes);
        MAXF(peak_unsharded_bytes);
        MAXF(all_gather_bytes);
        MAXF(reduce_scatter_bytes);
        MAXF(all_reduce_bytes);
        MAXF(buffer_bytes);
        MAXF(staging_bytes);
        MAXF(host_bytes);
        MAXF(total_bytes);
#undef MAXF
    }
    return PCS_OK;
}

static pcs_status_t finish_plan(ctx_t *c, Pcs__V1__Plan *p)
{
    const Pcs__V1__JobSpec *s = c->spec;
    p->version = PCS_PLAN_VERSION;
    p->world_size = c->ws;
    p->strategy = c->eff;
    p->pp_size = c->pp;
    p->replicate_size = c->rep;
    p->shard_size = c->shard;
    p->dp_size = c->dp;
    p->reduce_dtype_rule = dupstr(c, PCS_PLAN_REDUCE_DTYPE_RULE);
    p->prefetch = s->training && s->training->prefetch ? s->training->prefetch : 1;
    p->virtual_stages = c->vstages;
    if (s->cpu_offload) {
        if (s->backend && strcmp(s->backend, "cuda") == 0)
            p->cpu_offload = true;
        else
            note(c, "cpu_offload: the cpu backend keeps shards, gradients and optimizer state in "
                    "host memory already (nothing to offload)");
    }
    p->micro_batches = s->training && s->training->micro_batches ? s->training->micro_batches : 1;
    p->full_precision_eval = s->training && s->training->full_precision_eval;
    p->eval_backward = p->full_precision_eval && s->training->eval_backward;
    {
        const Pcs__V1__TrainingSpec *t = s->training;
        bool fwd = !(t && t->forward_prefetch && !t->forward_prefetch->value);
        const char *bp = t && t->backward_prefetch ? t->backward_prefetch : "";
        p->forward_prefetch_depth = fwd ? p->prefetch : 0;
        p->backward_prefetch_depth = strcmp(bp, "none") ? p->prefetch : 0;
        p->backward_prefetch_post = !strcmp(bp, "post");
    }
    p->optimizer_states = optimizer_states(s);
    p->layer_container = dupstr(c, c->m->modules[c->container].path);
    p->num_layers = c->nlayers;

    p->mesh = calloc(3, sizeof *p->mesh);
    if (!p->mesh)
        return PCS_ERR_NOMEM;
    for (uint32_t i = 0; i < c->n_order; i++) {
        Pcs__V1__MeshDim *d;
        NEW_MSG(c, d, pcs__v1__mesh_dim__init);
        if (!d)
            return PCS_ERR_NOMEM;
        d->dim = c->order[i];
        d->size = d->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_PP             ? c->pp
                  : d->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE ? c->rep
                                                                            : c->shard;
        p->mesh[p->n_mesh++] = d;
    }

    p->groups = calloc(6, sizeof *p->groups);
    if (!p->groups)
        return PCS_ERR_NOMEM;
    const Pcs__V1__MeshDimName all[3] = {PCS__V1__MESH_DIM_NAME__MESH_DIM_PP,
                                         PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE,
                                         PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD};
    add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_WORLD, c->ws, all, 3);
    add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, c->shard, all + 2, 1);
    add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE, c->rep, all + 1, 1);
    add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_DP, c->dp, all + 1, 2);
    add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_PP, c->pp, all, 1);
    uint32_t rg = 0;
    for (size_t k = 0; k < p->n_units && !rg; k++)
        rg = p->units[k]->reshard_group_size;
    if (rg)
        add_group(c, p, PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD, rg, all + 2, 1);

    /* when gradients are reduced (training.gradient_sync), and HSDP's all-reduce with it */
    const Pcs__V1__TrainingSpec *tr = s->training;
    if (tr && tr->gradient_sync && !strcmp(tr->gradient_sync, "every_micro_batch")) {
        if (p->micro_batches > 1)
            p->sync_every_micro_batch = true;
        else
            note(c, "training.gradient_sync: every_micro_batch with one micro-batch is the "
                    "default");
    }
    if (tr && tr->hsdp_all_reduce && !strcmp(tr->hsdp_all_reduce, "last_micro_batch") &&
        p->sync_every_micro_batch) {
        bool hsdp = false;
        for (size_t k = 0; k < p->n_units; k++) {
            const Pcs__V1__Unit *u = p->units[k];
            for (size_t j = 0; j < u->n_collectives; j++)
                hsdp |= u->collectives[j]->kind == PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE &&
                        u->collectives[j]->group == PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE;
        }
        if (hsdp)
            p->hsdp_all_reduce_last = true;
        else
            note(c, "training.hsdp_all_reduce: no unit all-reduces across replicas (not HSDP)");
    }

    /* pcs-worker (the built-in mlp's only program) accumulates in place: set before the
     * estimate below reads it */
    p->grads_into_accumulator = p->micro_batches > 1 && !p->sync_every_micro_batch && s->model &&
                                s->model->kind_case == PCS__V1__MODEL_SPEC__KIND_MLP;

    /* gradient accumulation: units that reshard may stay gathered across the no-sync
     * micro-batches (training.accumulation); auto decides by the per-rank estimate */
    if (p->sync_every_micro_batch && tr && tr->accumulation &&
        !strcmp(tr->accumulation, "keep_gathered"))
        note(c, "training.accumulation: keep_gathered applies to no-sync micro-batches; with "
                "gradient_sync every_micro_batch every micro-batch syncs and reshards");
    if (p->micro_batches > 1 && !p->sync_every_micro_batch) {
        const char *acc = s->training && s->training->accumulation ? s->training->accumulation : "";
        uint64_t budget = s->training ? s->training->memory_budget_bytes : 0;
        size_t n_keep = 0;
        for (size_t k = 0; k < p->n_units; k++) {
            Pcs__V1__Unit *u = p->units[k];
            bool can = u->shard_group_size > 1 && !u->is_root &&
                       (u->reshard_after_forward || u->reshard_after_backward);
            u->keep_gathered_in_accumulation = can && strcmp(acc, "reshard") != 0;
            n_keep += u->keep_gathered_in_accumulation;
        }
        if (n_keep) {
            bool keep = !strcmp(acc, "keep_gathered");
            Pcs__V1__RankEstimate most;
            PCS_CHECK(estimate_max_of(c, p, &most));
            uint64_t with = most.total_bytes;
            if (!keep && budget && with <= budget)
                keep = true;
            char fits[96] = "";
            if (budget)
                snprintf(fits, sizeof fits, ", %s memory_budget_bytes %llu",
                         with <= budget ? "within" : "OVER", (unsigned long long)budget);
            if (keep)
                note(c,
                     "accumulation: %zu units stay gathered across the %u micro-batches of a step "
                     "(%s; per-rank estimate %llu bytes%s)",
                     n_keep, p->micro_batches, *acc && strcmp(acc, "auto") ? acc : "auto",
                     (unsigned long long)with, fits);
            else if (budget)
                note(c,
                     "accumulation: units reshard in every micro-batch (keeping them gathered "
                     "needs %llu bytes per rank, memory_budget_bytes is %llu)",
                     (unsigned long long)with, (unsigned long long)budget);
            for (size_t k = 0; !keep && k < p->n_units; k++)
                p->units[k]->keep_gathered_in_accumulation = false;
        }
    }

    /* pipeline: the schedule must exist for this pp, virtual stages and micro-batch count and
     * pass validation (planner/schedule.h); the plan notes its shape and bubble */
    if (c->pp > 1) {
        pcs_sched_kind_t kind;
        pcs_schedule_t *sch = NULL;
        pcs_status_t st = pcs_sched_parse(s->pipeline ? s->pipeline->schedule : NULL,
                                          c->vstages ? c->vstages : 1, &kind);
        if (st == PCS_OK) {
            p->pipeline_schedule = dupstr(c, pcs_sched_name(kind));
            st = pcs_plan_schedule(p, &sch);
        }
        if (st == PCS_ERR_NOMEM)
            return st;
        if (st != PCS_OK)
            pcs_errlist_add(&c->errs, "%s", pcs_last_error());
        else
            note(c,
                 "pipeline: %s over %u ranks x %u stages, %u micro-batches; FSDP unshards each "
                 "stage %s; bubble %.3f with unit costs (F 1, B 2; GPipe/1F1B: %.3f)",
                 p->pipeline_schedule, sch->pp, sch->v, sch->m,
                 sch->unshard_per_mb ? "around every micro-batch (reshard_after_forward)"
                                     : "once per step",
                 sch->bubble, pcs_sched_bubble_1f1b(sch->pp, sch->m));
        pcs_schedule_free(sch);
    }

    /* notes become part of the plan (and of its hash) */
    p->notes = c->notes;
    p->n_notes = c->n_notes;
    c->notes = NULL;
    c->n_notes = 0;
    if (c->oom)
        return PCS_ERR_NOMEM;

    NEW_MSG(c, p->estimate_max, pcs__v1__rank_estimate__init);
    if (!p->estimate_max)
        return PCS_ERR_NOMEM;
    PCS_CHECK(estimate_max_of(c, p, p->estimate_max));
    p->hash = pcs_plan_hash(p);
    return PCS_OK;
}

// ----------------------------------------------------------------------------------------------

static void check_reshard(ctx_t *c)
{
    const Pcs__V1__ReshardAfterForward *raf = c->spec->reshard_after_forward;
    if (!raf || raf->value_case != PCS__V1__RESHARD_AFTER_FORWARD__VALUE_GROUP_SIZE || !c->ws)
        return;
    uint32_t n = raf->group_size;
    /* every sharded unit, the plan's or a strategy override's, shards over the shard dim */
    bool sharded = c->eff != PCS__V1__STRATEGY__STRATEGY_NO_SHARD;
    for (size_t o = 0; o < c->spec->n_strategy_overrides; o++)
        if (c->spec->strategy_overrides[o]->strategy != PCS__V1__STRATEGY__STRATEGY_NO_SHARD &&
            c->shard > 1)
            sharded = true;
    uint32_t G = c->shard;
    if (n < 1) {
        pcs_errlist_add(&c->errs, "reshard_after_forward.group_size: must be >= 1");
    } else if (!sharded) {
        note(c, "reshard_after_forward: %u ignored (no_shard keeps parameters replicated)", n);
    } else if (n > G || G % n) {
        pcs_errlist_add(&c->errs,
                        "reshard_after_forward.group_size: %u does not divide the shard group "
                        "size %u",
                        n, G);
    } else if (n == 1) {
        note(c, "reshard_after_forward: 1 behaves as false (FSDP2)");
    } else if (n == G) {
        note(c, "reshard_after_forward: %u = shard group size behaves as true", n);
    }
}

pcs_status_t pcs_plan_build(const Pcs__V1__JobSpec *spec, uint32_t world_size, Pcs__V1__Plan **out)
{
    *out = NULL;
    if (!spec)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "spec: required");
    ctx_t c = {.spec = spec};
    pcs_status_t rc = PCS_OK;
    Pcs__V1__Plan *p = NULL;

    resolve_mesh(&c, world_size);
    resolve_strategy(&c);
    check_reshard(&c);
    check_precision(&c);
    rc = pcs_model_expand_errs(spec, &c.errs, &c.m);
    if (rc != PCS_OK && rc != PCS_ERR_INVALID_ARG)
        goto out;
    if (c.errs.count)
        goto out;
    /* a placement that matches no parameter is a typo that would silently change nothing */
    for (size_t k = 0; k < spec->n_shard_placements; k++) {
        const char *pat = spec->shard_placements[k] ? spec->shard_placements[k]->param : NULL;
        bool hit = false;
        for (uint32_t i = 0; !hit && i < c.m->n_params; i++)
            hit = placement_matches(pat, c.m->params[i].fqn);
        if (!hit)
            pcs_errlist_add(&c.errs, "shard_placements[%zu].param: no parameter matches '%s'", k,
                            pat ? pat : "");
    }
    uint32_t n = c.m->n_modules;
    if (pcs_calloc(n, 1, (void **)&c.wrapped) != PCS_OK ||
        pcs_calloc(n, 1, (void **)&c.ignored) != PCS_OK ||
        pcs_calloc(n, 1, (void **)&c.unmanaged) != PCS_OK ||
        pcs_calloc(n, 1, (void **)&c.promoted) != PCS_OK ||
        pcs_calloc(n, sizeof *c.stage_of, (void **)&c.stage_of) != PCS_OK ||
        pcs_calloc(n, sizeof *c.unit_of, (void **)&c.unit_of) != PCS_OK) {
        rc = PCS_ERR_NOMEM;
        goto out;
    }
    select_units(&c);
    find_layers(&c);
    assign_stages(&c);
    if (c.oom) {
        rc = PCS_ERR_NOMEM;
        goto out;
    }
    if (c.errs.count)
        goto out;
    rc = build_units(&c);
    if (rc != PCS_OK || c.errs.count)
        goto out;
    unit_strategies(&c);
    if (c.errs.count)
        goto out;
    rc = split_dtype_groups(&c);
    if (rc != PCS_OK || c.errs.count)
        goto out;
    NEW_MSG(&c, p, pcs__v1__plan__init);
    if (!p) {
        rc = PCS_ERR_NOMEM;
        goto out;
    }
    rc = assemble(&c, p);
    if (rc == PCS_OK && !c.errs.count)
        rc = finish_plan(&c, p);
out:
    if (rc == PCS_OK && c.errs.count)
        rc = PCS_ERR_INVALID_ARG;
    if (rc == PCS_ERR_INVALID_ARG && c.errs.count) {
        rc = pcs_errlist_finish(&c.errs);
        PCS_DEBUG(PCS_SUB_PLAN, "plan rejected: %s", pcs_last_error());
    } else {
        pcs_errlist_free(&c.errs);
        if (rc == PCS_ERR_NOMEM)
            pcs_set_error(rc, "plan: out of memory");
    }
    for (size_t i = 0; i < c.n_notes; i++)
        free(c.notes[i]);
    free(c.notes);
    free(c.wrapped);
    free(c.ignored);
    free(c.promoted);
    free(c.unmanaged);
    free(c.ign_unit);
    free(c.ign_home);
    free(c.stage_of);
    free(c.unit_of);
    free(c.units);
    free(c.stage_root);
    pcs_model_free(c.m);
    if (rc != PCS_OK) {
        pcs_plan_free(p);
        return rc;
    }
    *out = p;
    return PCS_OK;
}
