/* Single-process reference trainer (see reference.h). Per unit it keeps fp32 master values, the
 * compute-dtype parameter and gradient buffers bound to the model, the no-sync accumulator and the
 * reduced gradient, all but the bound buffers as fp32 arrays holding values rounded to their
 * dtype (so each rounding step of the sharded run happens here too, in the same order):
 *   grad (compute) -> accum dtype (+= per micro-batch) -> reduce dtype, / pre, * premul,
 *   sum over ranks (rounded per addition, rank order), / avg, / post -> grad dtype.
 * What cannot be emulated without communication: the summation order of a ring/tree collective
 * (we add ranks 0..D-1 in order) and HSDP's two-level sum (flattened into one). Divisions use
 * x / d like PyTorch's div_ (not x * (1/d)). The optimizer, unscale/non-finite check and sum of
 * squares are the kernels' CPU twins, i.e. the code the sharded run executes. */
#include "model/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/data.h"
#include "model/loss.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"
#include "io/safetensors.h"

typedef struct {
    char *path;
    int module; /* module index of the unit root; -1 if not a module */
    pcs_dtype_t master, compute, reduce, accum, grad, output;
    int cast_inputs;
    double pre, post, premul, avg;
    uint32_t *pidx; /* model parameter indices */
    uint32_t np;
    uint64_t numel;
    float *master_v;      /* fp32 values (rounded to master dtype) */
    void *cparam;         /* compute dtype storage, bound to the model */
    void *cgrad;          /* compute dtype storage, bound as the gradient */
    float *accum_v;       /* accumulator values (accum dtype) */
    float *sum_v;         /* reduced gradient values (reduce dtype, then grad dtype) */
    float *opt_a, *opt_b; /* exp_avg / exp_avg_sq, or momentum buffer */
} ref_unit_t;

typedef enum { OPT_ADAMW, OPT_SGD } opt_kind_t;

struct pcs_reference {
    pcs_mlp_t *model;
    pcs_data_t *data;
    const pcs_backend_ops_t *be;
    ref_unit_t *units;
    uint32_t n_units;
    uint32_t *param_unit;
    uint64_t *param_off;
    uint32_t D, M, b;
    uint64_t steps, step;
    pcs_loss_kind_t loss;
    uint32_t in_dim, out_dim;
    int global_batch;
    int64_t inject;
    /* dtype the training program feeds inputs in: the data's, or a pure low-precision model's
     * own dtype (the user's x.half() of T-PF16) when the root unit does not cast */
    pcs_dtype_t feed_dtype;
    /* optimizer */
    opt_kind_t opt;
    pcs_adamw_config_t adamw;
    pcs_sgd_config_t sgd;
    int64_t opt_steps;
    double clip;
    /* grad scaler */
    int scaler;
    double scale, growth, backoff;
    uint32_t interval, tracker;
    uint32_t eval_every;
    int full_precision_eval; /* FSDP1 FSDP_USE_FULL_PREC_IN_EVAL: eval from fp32 masters, no casts
                              */
    /* buffers: per emulated rank, in their run dtype */
    void **bufs; /* [nranks_buf * n_bufs] */
    pcs_dtype_t *buf_dtype;
    uint32_t n_bufs, buf_ranks;
    /* batch scratch */
    float *x;
    void *y;
    float *gout;
    /* results */
    double *losses;
    size_t n_losses, cap_losses;
    double *evals;
    uint64_t *eval_steps;
    size_t n_evals, cap_evals, cap_eval_steps;
    char *name;
};

void pcs_ref_options_default(pcs_ref_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->inject_nonfinite_step = -1;
}

static pcs_dtype_t dt(int v)
{
    return (v > 0 && v < PCS_DTYPE_COUNT) ? (pcs_dtype_t)v : PCS_DTYPE_NONE;
}

static double opt_d(const Pcs__V1__OptDouble *o, double def)
{
    return o ? o->value : def;
}

// ---- units ----

static pcs_status_t unit_alloc(pcs_reference_t *r, ref_unit_t *u)
{
    size_t n = u->numel ? (size_t)u->numel : 1;
    size_t cs = pcs_dtype_size(u->compute);
    PCS_CHECK(pcs_calloc(n, sizeof(float), (void **)&u->master_v));
    PCS_CHECK(pcs_calloc(n, cs, &u->cparam));
    PCS_CHECK(pcs_calloc(n, cs, &u->cgrad));
    PCS_CHECK(pcs_calloc(n, sizeof(float), (void **)&u->accum_v));
    PCS_CHECK(pcs_calloc(n, sizeof(float), (void **)&u->sum_v));
    PCS_CHECK(pcs_calloc(n, sizeof(float), (void **)&u->opt_a));
    if (r->opt == OPT_ADAMW)
        PCS_CHECK(pcs_calloc(n, sizeof(float), (void **)&u->opt_b));
    return PCS_OK;
}

static void unit_free(ref_unit_t *u)
{
    free(u->path);
    free(u->pidx);
    free(u->master_v);
    free(u->cparam);
    free(u->cgrad);
    free(u->accum_v);
    free(u->sum_v);
    free(u->opt_a);
    free(u->opt_b);
}

static pcs_status_t unit_add_param(pcs_reference_t *r, uint32_t ui, uint32_t p)
{
    ref_unit_t *u = &r->units[ui];
    if (r->param_unit[p] != UINT32_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: parameter %s is in two units",
                             pcs_mlp_param(r->model, p)->fqn);
    uint32_t *np = realloc(u->pidx, (u->np + 1) * sizeof *np);
    if (!np)
        return pcs_set_error(PCS_ERR_NOMEM, "reference: out of memory");
    u->pidx = np;
    u->pidx[u->np++] = p;
    r->param_unit[p] = ui;
    r->param_off[p] = u->numel;
    u->numel += pcs_mlp_param(r->model, p)->numel;
    return PCS_OK;
}

/* FSDP1-style pre/post factors (spec §4.2) for fp16; AVG over the dp size otherwise (FSDP2).
 * A custom divide factor f (training.gradient_divide_factor, 0 = unset) replaces the dp size:
 * fp16 splits f into pre/post, fp32/bf16 multiply each contribution by 1/f (PREMUL_SUM), and it
 * applies with D = 1 too (FSDP2 foreach_reduce divides a world of one's gradient). */
static void default_reduction(ref_unit_t *u, uint32_t D, double f)
{
    u->pre = u->post = u->premul = u->avg = 1.0;
    if (f <= 0 && D <= 1)
        return;
    double w = f > 0 ? f : D;
    if (u->reduce == PCS_DTYPE_FP16) {
        double pre = 1;
        while (fmod(w, pre) == 0 && w / pre > pre)
            pre *= 2;
        u->pre = pre;
        u->post = w / pre;
    } else if (f > 0) {
        u->premul = 1.0 / f;
    } else {
        u->avg = D;
    }
}

static pcs_status_t units_from_plan(pcs_reference_t *r, const Pcs__V1__Plan *plan)
{
    r->n_units = (uint32_t)plan->n_units;
    PCS_CHECK(pcs_calloc(r->n_units ? r->n_units : 1, sizeof *r->units, (void **)&r->units));
    for (uint32_t k = 0; k < r->n_units; k++) {
        const Pcs__V1__Unit *pu = plan->units[k];
        ref_unit_t *u = &r->units[k];
        PCS_CHECK(pcs_strdup(pu->path ? pu->path : "", &u->path));
        u->module = pcs_mlp_find_module(r->model, u->path);
        u->master = dt(pu->master_dtype) ? dt(pu->master_dtype) : PCS_DTYPE_FP32;
        u->compute = dt(pu->param_dtype) ? dt(pu->param_dtype) : u->master;
        u->reduce = dt(pu->reduce_dtype) ? dt(pu->reduce_dtype) : u->compute;
        u->accum = dt(pu->accum_dtype) ? dt(pu->accum_dtype) : u->reduce;
        u->grad = dt(pu->grad_dtype) ? dt(pu->grad_dtype) : u->master;
        u->output = dt(pu->output_dtype);
        u->cast_inputs = pu->cast_forward_inputs && dt(pu->param_dtype); /* FSDP2 rule */
        u->pre = u->post = u->premul = u->avg = 1.0;
        int seen_pre = 0;
        for (size_t c = 0; c < pu->n_collectives; c++) {
            const Pcs__V1__CollectiveSpec *cs = pu->collectives[c];
            if (cs->kind != PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER &&
                cs->kind != PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE)
                continue;
            const Pcs__V1__Reduction *red = cs->reduction;
            if (!red)
                continue;
            if (red->pre_divide > 1 && !seen_pre) {
                u->pre = red->pre_divide;
                seen_pre = 1;
            }
            if (red->post_divide > 1)
                u->post = red->post_divide;
            if (red->op == PCS__V1__REDUCE_OP__REDUCE_OP_AVG && cs->group_size > 1)
                u->avg *= cs->group_size;
            if (red->op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM && red->premul > 0)
                u->premul *= red->premul;
        }
        /* A world of one has no collective but may still divide (FSDP2 foreach_reduce with a
         * custom factor): the same pre, premul, post as a collective's. */
        const Pcs__V1__Reduction *lr = pu->local_reduction;
        if (lr) {
            if (lr->pre_divide > 1 && !seen_pre)
                u->pre = lr->pre_divide;
            if (lr->post_divide > 1)
                u->post = lr->post_divide;
            if (lr->op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM && lr->premul > 0)
                u->premul *= lr->premul;
        }
        for (size_t j = 0; j < pu->n_params; j++) {
            const Pcs__V1__ParamSlot *ps = pu->params[j];
            int p = pcs_mlp_find_param(r->model, ps->fqn);
            if (p < 0)
                return pcs_set_error(PCS_ERR_INVALID_ARG,
                                     "plan.units[%u].params[%zu]: %s is not "
                                     "a parameter of the model",
                                     k, j, ps->fqn);
            if (ps->numel && ps->numel != pcs_mlp_param(r->model, (uint32_t)p)->numel)
                return pcs_set_error(
                    PCS_ERR_INVALID_ARG,
                    "plan.units[%u].params[%zu]: %s has "
                    "numel %llu, the model has %llu",
                    k, j, ps->fqn, (unsigned long long)ps->numel,
                    (unsigned long long)pcs_mlp_param(r->model, (uint32_t)p)->numel);
            PCS_CHECK(unit_add_param(r, k, (uint32_t)p));
        }
        for (size_t j = 0; j < pu->n_buffers; j++) {
            int bi = pcs_mlp_find_buffer(r->model, pu->buffers[j]->fqn);
            pcs_dtype_t rd = dt(pu->buffers[j]->run_dtype);
            if (bi >= 0 && pcs_dtype_is_float(rd) && r->buf_dtype[bi] != PCS_DTYPE_INT64)
                r->buf_dtype[bi] = rd == PCS_DTYPE_FP64 ? PCS_DTYPE_FP32 : rd;
        }
    }
    return PCS_OK;
}

/* Without a plan: one unit per MLPBlock, BatchNorm as its own full-precision unit (FSDP1's
 * ignored class default), the root unit takes the head; dtypes from the default policy. */
static pcs_status_t units_default(pcs_reference_t *r, const Pcs__V1__JobSpec *spec)
{
    const Pcs__V1__PrecisionSpec *ps = spec->precision;
    pcs_dtype_t master = ps && dt(ps->master_dtype) ? dt(ps->master_dtype) : PCS_DTYPE_FP32;
    pcs_dtype_t param = ps ? dt(ps->param_dtype) : PCS_DTYPE_NONE;
    pcs_dtype_t reduce = ps ? dt(ps->reduce_dtype) : PCS_DTYPE_NONE;
    pcs_dtype_t output = ps ? dt(ps->output_dtype) : PCS_DTYPE_NONE;
    int cast = ps && ps->cast_forward_inputs ? ps->cast_forward_inputs->value : 1;
    /* FSDP1: the root also casts when cast_root_forward_inputs is set */
    int cast_root =
        cast || (ps && ps->cast_root_forward_inputs && ps->cast_root_forward_inputs->value);
    int keep_low = ps && ps->keep_low_precision_grads ? ps->keep_low_precision_grads->value : 0;
    const Pcs__V1__TrainingSpec *ts = spec->training;
    double factor = ts && ts->gradient_divide_factor ? ts->gradient_divide_factor->value : 0;
    if (ts && ts->gradient_divide_factor && !(isfinite(factor) && factor > 0))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "training.gradient_divide_factor: must be finite and > 0");
    const pcs_mlp_t *m = r->model;
    uint32_t nm = pcs_mlp_num_modules(m);
    PCS_CHECK(pcs_calloc(nm, sizeof *r->units, (void **)&r->units));
    r->n_units = 0;
    /* units in the order: root, then blocks (and BN units) in module order */
    for (uint32_t i = 0; i < nm; i++) {
        const pcs_mlp_module_t *md = pcs_mlp_module(m, i);
        int full = md->kind == PCS_MOD_BATCHNORM;
        if (!(md->kind == PCS_MOD_MLP || md->kind == PCS_MOD_BLOCK || full))
            continue;
        ref_unit_t *u = &r->units[r->n_units++];
        PCS_CHECK(pcs_strdup(md->path, &u->path));
        u->module = (int)i;
        u->master = master;
        u->compute = !full && param ? param : master;
        u->reduce = full ? master : reduce ? reduce : u->compute;
        u->accum = u->reduce;
        u->grad = keep_low && !full ? u->compute : master;
        u->output = full ? PCS_DTYPE_NONE : output;
        u->cast_inputs = !full && (md->kind == PCS_MOD_MLP ? cast_root : cast) && param;
        default_reduction(u, r->D, factor);
    }
    /* each parameter goes to its nearest enclosing unit */
    for (uint32_t p = 0; p < pcs_mlp_num_params(m); p++) {
        int mod = (int)pcs_mlp_param_module(m, p);
        uint32_t ui = UINT32_MAX;
        while (mod >= 0 && ui == UINT32_MAX) {
            for (uint32_t k = 0; k < r->n_units; k++)
                if (r->units[k].module == mod)
                    ui = k;
            mod = pcs_mlp_module(m, (uint32_t)mod)->parent;
        }
        PCS_CHECK(unit_add_param(r, ui, p));
    }
    return PCS_OK;
}

// ---- buffers ----

static void *buf_ptr(const pcs_reference_t *r, uint32_t rank, uint32_t i)
{
    return r->bufs[(size_t)rank * r->n_bufs + i];
}

static pcs_status_t buffers_alloc(pcs_reference_t *r)
{
    r->n_bufs = pcs_mlp_num_buffers(r->model);
    r->buf_ranks = r->global_batch ? 1 : r->D;
    PCS_CHECK(pcs_calloc((size_t)r->buf_ranks * r->n_bufs + 1, sizeof(void *), (void **)&r->bufs));
    for (uint32_t k = 0; k < r->buf_ranks; k++)
        for (uint32_t i = 0; i < r->n_bufs; i++) {
            const pcs_named_tensor_t *t = pcs_mlp_buffer(r->model, i);
            PCS_CHECK(pcs_calloc(t->numel, pcs_dtype_size(r->buf_dtype[i]),
                                 &r->bufs[(size_t)k * r->n_bufs + i]));
        }
    return PCS_OK;
}

static pcs_status_t bind_rank_buffers(pcs_reference_t *r, uint32_t rank)
{
    for (uint32_t i = 0; i < r->n_bufs; i++)
        PCS_CHECK(pcs_mlp_bind_buffer(r->model, i, r->buf_dtype[i], buf_ptr(r, rank, i)));
    return PCS_OK;
}

/* Store fp32 values into every rank's copy of buffer i. */
static void buffer_set_all(pcs_reference_t *r, uint32_t i, const float *v)
{
    const pcs_named_tensor_t *t = pcs_mlp_buffer(r->model, i);
    for (uint32_t k = 0; k < r->buf_ranks; k++) {
        void *p = buf_ptr(r, k, i);
        if (r->buf_dtype[i] == PCS_DTYPE_INT64) {
            for (uint64_t e = 0; e < t->numel; e++)
                ((int64_t *)p)[e] = (int64_t)v[e];
        } else {
            pcs_from_f32(v, t->numel, r->buf_dtype[i], p);
        }
    }
}

// ---- init ----

static pcs_status_t init_state(pcs_reference_t *r, const Pcs__V1__JobSpec *spec)
{
    const pcs_mlp_t *m = r->model;
    uint32_t np = pcs_mlp_num_params(m), nb = r->n_bufs;
    uint64_t seed = spec->init ? spec->init->seed : 0;
    const char *from =
        spec->init && spec->init->from && *spec->init->from ? spec->init->from : NULL;
    pcs_status_t rc = PCS_OK;
    float **dst = NULL, *bufv = NULL;
    pcs_named_tensor_t *all = NULL;
    int *loaded = NULL;
    uint64_t bufn = 0;
    for (uint32_t i = 0; i < nb; i++)
        bufn += pcs_mlp_buffer(m, i)->numel;
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *dst, (void **)&dst), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *all, (void **)&all), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *loaded, (void **)&loaded), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(bufn + 1, sizeof(float), (void **)&bufv), rc, out);
    uint64_t bo = 0;
    for (uint32_t p = 0; p < np; p++) {
        ref_unit_t *u = &r->units[r->param_unit[p]];
        dst[p] = u->master_v + r->param_off[p];
        all[p] = *pcs_mlp_param(m, p);
        PCS_CHECK_GOTO(pcs_mlp_init_tensor(m, seed, 0, p, 0, all[p].numel, dst[p]), rc, out);
    }
    for (uint32_t i = 0; i < nb; i++) {
        all[np + i] = *pcs_mlp_buffer(m, i);
        dst[np + i] = bufv + bo;
        PCS_CHECK_GOTO(pcs_mlp_init_tensor(m, seed, 1, i, 0, all[np + i].numel, dst[np + i]), rc,
                       out);
        bo += all[np + i].numel;
    }
    if (from)
        PCS_CHECK_GOTO(pcs_init_from_safetensors(from, all, np + nb, dst, loaded), rc, out);
    for (uint32_t i = 0; i < nb; i++)
        buffer_set_all(r, i, dst[np + i]);
    for (uint32_t k = 0; k < r->n_units; k++) {
        ref_unit_t *u = &r->units[k];
        pcs_round_to(u->master_v, u->numel, u->master);
        pcs_from_f32(u->master_v, u->numel, u->compute, u->cparam);
    }
out:
    free(dst);
    free(all);
    free(loaded);
    free(bufv);
    return rc;
}

// ---- create / destroy ----

static pcs_status_t read_training(pcs_reference_t *r, const Pcs__V1__JobSpec *spec)
{
    const Pcs__V1__TrainingSpec *t = spec->training;
    if (!t)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "training: required");
    if (t->micro_batch_size == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "training.micro_batch_size: must be > 0");
    r->steps = t->steps;
    r->b = t->micro_batch_size;
    r->M = t->micro_batches ? t->micro_batches : 1;
    r->loss = t->loss == PCS__V1__LOSS__LOSS_CROSS_ENTROPY ? PCS_LOSS_CROSS_ENTROPY : PCS_LOSS_MSE;
    r->clip = t->clip_grad_norm;
    if (r->clip < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "training.clip_grad_norm: must be >= 0");
    r->eval_every = t->eval_every;
    r->full_precision_eval = t->full_precision_eval;
    pcs_adamw_config_default(&r->adamw);
    pcs_sgd_config_default(&r->sgd);
    const Pcs__V1__OptimizerSpec *o = t->optimizer;
    if (o && o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_SGD) {
        const Pcs__V1__SgdOptimizer *s = o->sgd;
        r->opt = OPT_SGD;
        r->sgd.lr = s->lr;
        r->sgd.momentum = opt_d(s->momentum, 0.9);
        r->sgd.dampening = opt_d(s->dampening, 0.0);
        r->sgd.weight_decay = opt_d(s->weight_decay, 0.0);
        r->sgd.nesterov = s->nesterov;
        if (!(s->lr > 0))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "training.optimizer.sgd.lr: must be > 0");
    } else {
        r->opt = OPT_ADAMW;
        if (o && o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW) {
            const Pcs__V1__AdamWOptimizer *a = o->adamw;
            r->adamw.lr = a->lr;
            if (a->n_betas == 2) {
                r->adamw.beta1 = a->betas[0];
                r->adamw.beta2 = a->betas[1];
            } else if (a->n_betas != 0) {
                return pcs_set_error(PCS_ERR_INVALID_ARG, "training.optimizer.adamw.betas: need "
                                                          "exactly 2 values");
            }
            r->adamw.eps = opt_d(a->eps, 1e-8);
            r->adamw.weight_decay = opt_d(a->weight_decay, 0.01);
            if (!(a->lr > 0))
                return pcs_set_error(PCS_ERR_INVALID_ARG, "training.optimizer.adamw.lr: must be "
                                                          "> 0");
        }
    }
    const Pcs__V1__GradScalerSpec *g = t->grad_scaler;
    r->scaler = g && g->enabled;
    r->scale = r->scaler ? opt_d(g->init_scale, 65536.0) : 1.0;
    r->growth = g ? opt_d(g->growth_factor, 2.0) : 2.0;
    r->backoff = g ? opt_d(g->backoff_factor, 0.5) : 0.5;
    r->interval = g && g->growth_interval ? g->growth_interval->value : 2000;
    return PCS_OK;
}

static uint32_t spec_dp_size(const Pcs__V1__JobSpec *spec)
{
    uint32_t d = 1;
    for (size_t i = 0; i < spec->n_mesh; i++)
        if (spec->mesh[i]->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD ||
            spec->mesh[i]->dim == PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE)
            d *= spec->mesh[i]->size ? spec->mesh[i]->size : 1;
    return d;
}

pcs_status_t pcs_ref_create(const struct Pcs__V1__JobSpec *spec, const struct Pcs__V1__Plan *plan,
                            const pcs_ref_options_t *opt, pcs_reference_t **out)
{
    pcs_status_t rc;
    pcs_reference_t *r = NULL;
    pcs_ref_options_t defaults;
    if (!spec || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_ref_create: NULL argument");
    if (!opt) {
        pcs_ref_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    if (!spec->model || spec->model->kind_case != PCS__V1__MODEL_SPEC__KIND_MLP)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "model: the reference computes only the "
                                                  "built-in mlp");
    PCS_CHECK(pcs_calloc(1, sizeof *r, (void **)&r));
    PCS_CHECK_GOTO(pcs_strdup(spec->name ? spec->name : "", &r->name), rc, fail);
    PCS_CHECK_GOTO(read_training(r, spec), rc, fail);
    r->global_batch = opt->global_batch;
    r->inject = opt->inject_nonfinite_step;
    r->D =
        opt->dp_size ? opt->dp_size : (plan && plan->dp_size ? plan->dp_size : spec_dp_size(spec));
    if (r->D == 0)
        r->D = 1;
    PCS_CHECK_GOTO(pcs_backend_get("cpu", &r->be), rc, fail);

    pcs_mlp_config_t mc;
    PCS_CHECK_GOTO(pcs_mlp_config_from_proto(spec->model->mlp, &mc), rc, fail);
    r->in_dim = mc.input_dim;
    r->out_dim = mc.output_dim;
    uint64_t rows = (uint64_t)r->D * r->b;
    if (rows > (1u << 24)) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "training.micro_batch_size: global micro-batch "
                           "of %llu rows is too large",
                           (unsigned long long)rows);
        goto fail;
    }
    PCS_CHECK_GOTO(pcs_mlp_create(&mc, (uint32_t)rows, &r->model), rc, fail);
    PCS_CHECK_GOTO(pcs_data_open(spec->data, r->in_dim, r->out_dim, r->loss, &r->data), rc, fail);

    uint32_t np = pcs_mlp_num_params(r->model), nb = pcs_mlp_num_buffers(r->model);
    PCS_CHECK_GOTO(pcs_calloc(np, sizeof *r->param_unit, (void **)&r->param_unit), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(np, sizeof *r->param_off, (void **)&r->param_off), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(nb + 1, sizeof *r->buf_dtype, (void **)&r->buf_dtype), rc, fail);
    for (uint32_t p = 0; p < np; p++)
        r->param_unit[p] = UINT32_MAX;
    for (uint32_t i = 0; i < nb; i++)
        r->buf_dtype[i] = pcs_mlp_buffer(r->model, i)->dtype;
    if (plan)
        PCS_CHECK_GOTO(units_from_plan(r, plan), rc, fail);
    else
        PCS_CHECK_GOTO(units_default(r, spec), rc, fail);
    for (uint32_t p = 0; p < np; p++)
        if (r->param_unit[p] == UINT32_MAX) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG, "plan: parameter %s is in no unit",
                               pcs_mlp_param(r->model, p)->fqn);
            goto fail;
        }
    for (uint32_t k = 0; k < r->n_units; k++) {
        ref_unit_t *u = &r->units[k];
        if (!pcs_dtype_is_float(u->compute) || u->compute == PCS_DTYPE_FP64 ||
            !pcs_dtype_is_float(u->master)) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "plan.units[%u] (%s): compute dtype %s is not "
                               "fp32, bf16 or fp16",
                               k, u->path, pcs_dtype_name(u->compute));
            goto fail;
        }
        PCS_CHECK_GOTO(unit_alloc(r, u), rc, fail);
        if (u->module >= 0)
            PCS_CHECK_GOTO(pcs_mlp_set_cast(r->model, (uint32_t)u->module,
                                            u->cast_inputs ? u->compute : PCS_DTYPE_NONE,
                                            u->output),
                           rc, fail);
        if (r->global_batch)
            u->pre = u->post = u->premul = u->avg = 1.0;
    }
    for (uint32_t p = 0; p < np; p++) {
        ref_unit_t *u = &r->units[r->param_unit[p]];
        size_t cs = pcs_dtype_size(u->compute);
        PCS_CHECK_GOTO(
            pcs_mlp_bind_param(r->model, p, u->compute, (char *)u->cparam + r->param_off[p] * cs),
            rc, fail);
        PCS_CHECK_GOTO(
            pcs_mlp_bind_grad(r->model, p, u->compute, (char *)u->cgrad + r->param_off[p] * cs), rc,
            fail);
    }
    r->feed_dtype = pcs_data_input_dtype(r->data);
    if (plan)
        r->feed_dtype = pcs_mlp_feed_dtype(plan, r->feed_dtype);
    for (uint32_t k = 0; !plan && k < r->n_units; k++) {
        const ref_unit_t *u = &r->units[k];
        if (u->module == 0 && !u->cast_inputs && u->master != PCS_DTYPE_FP32 &&
            u->compute == u->master)
            r->feed_dtype = u->master;
    }
    PCS_CHECK_GOTO(buffers_alloc(r), rc, fail);
    PCS_CHECK_GOTO(init_state(r, spec), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(rows * r->in_dim, sizeof(float), (void **)&r->x), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(rows * r->out_dim, sizeof(float), (void **)&r->gout), rc, fail);
    PCS_CHECK_GOTO(
        pcs_calloc(rows * (r->loss == PCS_LOSS_MSE ? r->out_dim : 2), sizeof(float), &r->y), rc,
        fail);
    PCS_INFO(PCS_SUB_WORKER,
             "reference: %s, %llu params in %u units, dp %u, %u x %u rows per "
             "step, %llu steps",
             r->name, (unsigned long long)pcs_mlp_total_params(r->model), r->n_units, r->D, r->M,
             r->D * r->b, (unsigned long long)r->steps);
    *out = r;
    return PCS_OK;
fail:
    pcs_ref_destroy(r);
    return rc;
}

void pcs_ref_destroy(pcs_reference_t *r)
{
    if (!r)
        return;
    for (uint32_t k = 0; r->units && k < r->n_units; k++)
        unit_free(&r->units[k]);
    free(r->units);
    if (r->bufs)
        for (size_t i = 0; i < (size_t)r->buf_ranks * r->n_bufs; i++)
            free(r->bufs[i]);
    free(r->bufs);
    free(r->buf_dtype);
    free(r->param_unit);
    free(r->param_off);
    free(r->x);
    free(r->y);
    free(r->gout);
    free(r->losses);
    free(r->evals);
    free(r->eval_steps);
    free(r->name);
    pcs_data_close(r->data);
    pcs_mlp_destroy(r->model);
    free(r);
}

// ---- one step ----

/* One forward/backward over `rows` rows starting at global sample `first`; the unit gradients
 * land in each unit's cgrad (compute dtype) and are accumulated into accum_v. */
static pcs_status_t micro_batch(pcs_reference_t *r, uint64_t first, uint32_t rows, int is_first,
                                double *loss)
{
    const float *out;
    pcs_dtype_t odt;
    PCS_CHECK(pcs_data_read(r->data, first, rows, r->x, r->y));
    pcs_round_to(r->x, (size_t)rows * r->in_dim, r->feed_dtype);
    PCS_CHECK(pcs_mlp_forward(r->model, r->x, r->feed_dtype, rows, 1, NULL, &out, &odt));
    /* Loss in fp32 from the output (the output values are already fp32-representable). The
     * scaled loss is loss * scale / M: the 1/M of gradient accumulation and the grad scaler. */
    PCS_CHECK(pcs_loss_compute(r->loss, out, rows, r->out_dim, r->y,
                               (float)(r->scale / (double)r->M), loss, r->gout));
    PCS_CHECK(pcs_mlp_backward(r->model, r->gout, NULL));
    for (uint32_t k = 0; k < r->n_units; k++) {
        ref_unit_t *u = &r->units[k];
        if (!u->numel)
            continue;
        if (is_first) {
            pcs_to_f32(u->cgrad, u->compute, u->numel, u->accum_v);
            pcs_round_to(u->accum_v, u->numel, u->accum);
        } else if (u->compute == PCS_DTYPE_FP32) {
            const float *g = u->cgrad;
            for (uint64_t i = 0; i < u->numel; i++)
                u->accum_v[i] += g[i];
            pcs_round_to(u->accum_v, u->numel, u->accum);
        } else {
            const uint16_t *g = u->cgrad;
            for (uint64_t i = 0; i < u->numel; i++)
                u->accum_v[i] +=
                    u->compute == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(g[i]) : pcs_fp16_to_f32(g[i]);
            pcs_round_to(u->accum_v, u->numel, u->accum);
        }
    }
    return PCS_OK;
}

/* Rank `rank`'s accumulated gradient joins the reduction: cast to the reduce dtype, pre-divide,
 * premultiply, add into the running sum in the reduce dtype. */
static void contribute(ref_unit_t *u, int first_rank)
{
    float *a = u->accum_v, *s = u->sum_v;
    size_t n = u->numel;
    pcs_round_to(a, n, u->reduce);
    if (u->pre != 1.0) {
        float d = (float)u->pre;
        for (size_t i = 0; i < n; i++)
            a[i] = a[i] / d;
        pcs_round_to(a, n, u->reduce);
    }
    if (u->premul != 1.0) {
        float f = (float)u->premul;
        for (size_t i = 0; i < n; i++)
            a[i] = a[i] * f;
        pcs_round_to(a, n, u->reduce);
    }
    if (first_rank) {
        memcpy(s, a, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++)
            s[i] += a[i];
        pcs_round_to(s, n, u->reduce);
    }
}

static void finish_reduction(ref_unit_t *u)
{
    float *s = u->sum_v;
    size_t n = u->numel;
    double divs[2] = {u->avg, u->post};
    for (int k = 0; k < 2; k++) {
        if (divs[k] == 1.0)
            continue;
        float d = (float)divs[k];
        for (size_t i = 0; i < n; i++)
            s[i] = s[i] / d;
        pcs_round_to(s, n, u->reduce);
    }
    pcs_round_to(s, n, u->grad);
}

static pcs_status_t grad_list(pcs_reference_t *r, pcs_tensor_t *g, pcs_tensor_t *p, pcs_tensor_t *a,
                              pcs_tensor_t *b, size_t *count)
{
    size_t c = 0;
    for (uint32_t k = 0; k < r->n_units; k++) {
        ref_unit_t *u = &r->units[k];
        if (!u->numel)
            continue;
        g[c] = (pcs_tensor_t){u->sum_v, PCS_DTYPE_FP32, (size_t)u->numel};
        p[c] = (pcs_tensor_t){u->master_v, PCS_DTYPE_FP32, (size_t)u->numel};
        a[c] = (pcs_tensor_t){u->opt_a, PCS_DTYPE_FP32, (size_t)u->numel};
        b[c] = (pcs_tensor_t){u->opt_b, PCS_DTYPE_FP32, (size_t)u->numel};
        c++;
    }
    *count = c;
    return PCS_OK;
}

static pcs_status_t push_double(double **arr, size_t *n, size_t *cap, double v)
{
    PCS_CHECK(pcs_grow((void **)arr, cap, *n + 1, sizeof(double)));
    (*arr)[(*n)++] = v;
    return PCS_OK;
}

pcs_status_t pcs_ref_step(pcs_reference_t *r, pcs_ref_step_result_t *res)
{
    pcs_status_t rc = PCS_OK;
    pcs_tensor_t *tg = NULL, *tp = NULL, *ta = NULL, *tb = NULL;
    if (!r)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_ref_step: NULL argument");
    if (r->step >= r->steps)
        return pcs_set_error(PCS_ERR_STATE, "reference: all %llu steps done",
                             (unsigned long long)r->steps);
    double loss_sum = 0, l;
    uint32_t ranks = r->global_batch ? 1 : r->D;
    uint32_t rows = r->global_batch ? r->D * r->b : r->b;
    for (uint32_t rk = 0; rk < ranks; rk++) {
        PCS_CHECK(bind_rank_buffers(r, rk));
        for (uint32_t m = 0; m < r->M; m++) {
            uint64_t first = r->global_batch
                                 ? pcs_data_batch_start(r->step, m, r->M, 1, 0, rows)
                                 : pcs_data_batch_start(r->step, m, r->M, r->D, rk, r->b);
            PCS_CHECK(micro_batch(r, first, rows, m == 0, &l));
            loss_sum += l;
        }
        for (uint32_t k = 0; k < r->n_units; k++)
            if (r->units[k].numel)
                contribute(&r->units[k], rk == 0);
    }
    for (uint32_t k = 0; k < r->n_units; k++)
        if (r->units[k].numel)
            finish_reduction(&r->units[k]);
    if (r->inject >= 0 && (uint64_t)r->inject == r->step)
        for (uint32_t k = 0; k < r->n_units; k++)
            if (r->units[k].numel) {
                r->units[k].sum_v[0] = INFINITY;
                break;
            }

    size_t count;
    PCS_CHECK_GOTO(pcs_calloc(r->n_units + 1, sizeof *tg, (void **)&tg), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(r->n_units + 1, sizeof *tp, (void **)&tp), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(r->n_units + 1, sizeof *ta, (void **)&ta), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(r->n_units + 1, sizeof *tb, (void **)&tb), rc, out);
    grad_list(r, tg, tp, ta, tb, &count);

    /* grad scaler: unscale + non-finite check (one flag for the whole model, as the all-reduced
     * found_inf of the sharded run) */
    float found = 0.0f;
    if (r->scaler) {
        float inv = (float)(1.0 / r->scale);
        PCS_CHECK_GOTO(pcs_kernel_nonfinite_check_and_unscale(r->be, tg, count, &found, &inv, NULL),
                       rc, out);
        for (uint32_t k = 0; k < r->n_units; k++)
            pcs_round_to(r->units[k].sum_v, r->units[k].numel, r->units[k].grad);
    }
    float ss = 0.0f;
    PCS_CHECK_GOTO(pcs_kernel_sum_squares_list(r->be, tg, count, &ss, NULL), rc, out);
    double norm = sqrt((double)ss);
    if (r->clip > 0) {
        /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
        double coef = r->clip / (norm + 1e-6);
        if (coef < 1.0) {
            PCS_CHECK_GOTO(pcs_kernel_scale_list(r->be, tg, count, (float)coef, NULL), rc, out);
            for (uint32_t k = 0; k < r->n_units; k++)
                pcs_round_to(r->units[k].sum_v, r->units[k].numel, r->units[k].grad);
        }
    }
    int skipped = r->scaler && found != 0.0f;
    if (!skipped) {
        r->opt_steps++;
        if (r->opt == OPT_ADAMW)
            PCS_CHECK_GOTO(pcs_kernel_adamw_update(r->be, tp, tg, ta, tb, count, &r->adamw,
                                                   r->opt_steps, NULL),
                           rc, out);
        else
            PCS_CHECK_GOTO(pcs_kernel_sgd_update(r->be, tp, tg, r->sgd.momentum != 0 ? ta : NULL,
                                                 count, &r->sgd, r->opt_steps == 1, NULL),
                           rc, out);
        for (uint32_t k = 0; k < r->n_units; k++) {
            ref_unit_t *u = &r->units[k];
            pcs_round_to(u->master_v, u->numel, u->master);
            pcs_from_f32(u->master_v, u->numel, u->compute, u->cparam);
        }
    }
    if (r->scaler) {
        if (skipped) {
            r->scale *= r->backoff;
            r->tracker = 0;
        } else if (++r->tracker >= r->interval) {
            double ns = r->scale * r->growth;
            if (isfinite((float)ns))
                r->scale = ns;
            r->tracker = 0;
        }
    }
    double loss = loss_sum / ((double)ranks * r->M);
    PCS_CHECK_GOTO(push_double(&r->losses, &r->n_losses, &r->cap_losses, loss), rc, out);
    if (res) {
        res->step = r->step;
        res->loss = loss;
        res->grad_norm = norm;
        res->skipped = skipped;
        res->scale = r->scaler ? r->scale : 1.0;
    }
    PCS_DEBUG(PCS_SUB_WORKER, "reference step %llu loss %.6f grad_norm %.4g%s",
              (unsigned long long)r->step, loss, norm, skipped ? " (skipped: non-finite)" : "");
    r->step++;
out:
    free(tg);
    free(tp);
    free(ta);
    free(tb);
    return rc;
}

/* Bind every parameter to its compute buffer and set the units' casts (training state), or, for
 * full-precision eval, to the fp32 master values with no casts (FSDP1 unshards from the
 * full-precision shard and the root does not cast inputs). */
static pcs_status_t bind_params(pcs_reference_t *r, int full_precision)
{
    for (uint32_t p = 0; p < pcs_mlp_num_params(r->model); p++) {
        ref_unit_t *u = &r->units[r->param_unit[p]];
        if (full_precision && u->master == PCS_DTYPE_FP32)
            PCS_CHECK(
                pcs_mlp_bind_param(r->model, p, PCS_DTYPE_FP32, u->master_v + r->param_off[p]));
        else
            PCS_CHECK(pcs_mlp_bind_param(r->model, p, u->compute,
                                         (char *)u->cparam +
                                             r->param_off[p] * pcs_dtype_size(u->compute)));
    }
    for (uint32_t k = 0; k < r->n_units; k++) {
        ref_unit_t *u = &r->units[k];
        if (u->module < 0)
            continue;
        if (full_precision)
            PCS_CHECK(
                pcs_mlp_set_cast(r->model, (uint32_t)u->module, PCS_DTYPE_NONE, PCS_DTYPE_NONE));
        else
            PCS_CHECK(pcs_mlp_set_cast(r->model, (uint32_t)u->module,
                                       u->cast_inputs ? u->compute : PCS_DTYPE_NONE, u->output));
    }
    return PCS_OK;
}

pcs_status_t pcs_ref_eval(pcs_reference_t *r, double *loss)
{
    if (!r || !loss)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_ref_eval: NULL argument");
    uint32_t rows = r->D * r->b;
    const float *out;
    pcs_dtype_t odt;
    PCS_CHECK(bind_rank_buffers(r, 0));
    PCS_CHECK(pcs_data_read_eval(r->data, rows, r->x, r->y));
    /* FSDP1 forces full precision only where mixed precision is in use: not for a pure
     * low-precision model, which is fed in its own dtype */
    int full = r->full_precision_eval && r->feed_dtype == pcs_data_input_dtype(r->data);
    if (full)
        PCS_CHECK(bind_params(r, 1));
    pcs_round_to(r->x, (size_t)rows * r->in_dim, r->feed_dtype);
    pcs_status_t rc = pcs_mlp_forward(r->model, r->x, r->feed_dtype, rows, 0, NULL, &out, &odt);
    if (rc == PCS_OK)
        rc = pcs_loss_compute(r->loss, out, rows, r->out_dim, r->y, 1.0f, loss, NULL);
    if (full) {
        pcs_status_t rc2 = bind_params(r, 0);
        if (rc == PCS_OK)
            rc = rc2;
    }
    return rc;
}

pcs_status_t pcs_ref_run(pcs_reference_t *r)
{
    if (!r)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_ref_run: NULL argument");
    while (r->step < r->steps) {
        pcs_ref_step_result_t res;
        PCS_CHECK(pcs_ref_step(r, &res));
        if (r->eval_every && r->step % r->eval_every == 0) {
            double e;
            PCS_CHECK(pcs_ref_eval(r, &e));
            PCS_CHECK(push_double(&r->evals, &r->n_evals, &r->cap_evals, e));
            PCS_CHECK(pcs_grow((void **)&r->eval_steps, &r->cap_eval_steps, r->n_evals,
                               sizeof(uint64_t)));
            r->eval_steps[r->n_evals - 1] = r->step;
            PCS_DEBUG(PCS_SUB_WORKER, "reference eval after step %llu: %.6f",
                      (unsigned long long)r->step, e);
        }
    }
    return PCS_OK;
}

// ---- results ----

const double *pcs_ref_losses(const pcs_reference_t *r, size_t *n)
{
    if (n)
        *n = r ? r->n_losses : 0;
    return r ? r->losses : NULL;
}

const double *pcs_ref_eval_losses(const pcs_reference_t *r, const uint64_t **after_step, size_t *n)
{
    if (n)
        *n = r ? r->n_evals : 0;
    if (after_step)
        *after_step = r ? r->eval_steps : NULL;
    return r ? r->evals : NULL;
}

uint64_t pcs_ref_steps_done(const pcs_reference_t *r)
{
    return r ? r->step : 0;
}

uint32_t pcs_ref_dp_size(const pcs_reference_t *r)
{
    return r ? r->D : 0;
}

const pcs_mlp_t *pcs_ref_model(const pcs_reference_t *r)
{
    return r ? r->model : NULL;
}

const float *pcs_ref_param(const pcs_reference_t *r, const char *fqn)
{
    int p = r ? pcs_mlp_find_param(r->model, fqn) : -1;
    if (p < 0)
        return NULL;
    return r->units[r->param_unit[p]].master_v + r->param_off[p];
}

const float *pcs_ref_grad(const pcs_reference_t *r, const char *fqn)
{
    int p = r ? pcs_mlp_find_param(r->model, fqn) : -1;
    if (p < 0)
        return NULL;
    return r->units[r->param_unit[p]].sum_v + r->param_off[p];
}

pcs_status_t pcs_ref_buffer(const pcs_reference_t *r, const char *fqn, float *out)
{
    int i = r ? pcs_mlp_find_buffer(r->model, fqn) : -1;
    if (i < 0 || !out)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "reference: no buffer '%s'", fqn ? fqn : "");
    const pcs_named_tensor_t *t = pcs_mlp_buffer(r->model, (uint32_t)i);
    const void *p = buf_ptr(r, 0, (uint32_t)i);
    if (r->buf_dtype[i] == PCS_DTYPE_INT64) {
        for (uint64_t e = 0; e < t->numel; e++)
            out[e] = (float)((const int64_t *)p)[e];
    } else {
        pcs_to_f32(p, r->buf_dtype[i], t->numel, out);
    }
    return PCS_OK;
}

pcs_status_t pcs_ref_export(const pcs_reference_t *r, const char *path)
{
    pcs_status_t rc = PCS_OK;
    if (!r || !path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_ref_export: NULL argument");
    const pcs_mlp_t *m = r->model;
    uint32_t np = pcs_mlp_num_params(m), nb = r->n_bufs, n = 0;
    pcs_st_entry_t *e = NULL;
    void **tmp = NULL;
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *e, (void **)&e), rc, out);
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *tmp, (void **)&tmp), rc, out);
    /* state_dict order: per module, parameters then buffers */
    for (uint32_t mi = 0; mi < pcs_mlp_num_modules(m); mi++) {
        const pcs_mlp_module_t *md = pcs_mlp_module(m, mi);
        for (uint32_t j = 0; j < md->n_params; j++) {
            uint32_t p = md->first_param + j;
            const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
            const ref_unit_t *u = &r->units[r->param_unit[p]];
            const float *v = u->master_v + r->param_off[p];
            e[n] = (pcs_st_entry_t){t->fqn, u->master, t->ndim, t->shape, v};
            if (u->master != PCS_DTYPE_FP32) {
                PCS_CHECK_GOTO(pcs_calloc(t->numel, pcs_dtype_size(u->master), &tmp[n]), rc, out);
                pcs_from_f32(v, t->numel, u->master, tmp[n]);
                e[n].data = tmp[n];
            }
            n++;
        }
        for (uint32_t j = 0; j < md->n_buffers; j++) {
            uint32_t i = md->first_buffer + j;
            const pcs_named_tensor_t *t = pcs_mlp_buffer(m, i);
            const void *p = buf_ptr(r, 0, i);
            e[n] = (pcs_st_entry_t){t->fqn, t->dtype, t->ndim, t->shape, p};
            if (t->dtype != r->buf_dtype[i]) {
                /* buffers go back to their original dtype (FSDP1 state_dict) */
                PCS_CHECK_GOTO(pcs_calloc(t->numel, sizeof(float), &tmp[n]), rc, out);
                pcs_to_f32(p, r->buf_dtype[i], t->numel, tmp[n]);
                e[n].data = tmp[n];
            }
            n++;
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%llu", (unsigned long long)r->step);
    const char *meta[] = {"format", "pt", "producer", "pcs", "step", step};
    rc = pcs_st_write(path, e, n, meta, 3);
out:
    for (uint32_t i = 0; tmp && i < np + nb; i++)
        free(tmp[i]);
    free(tmp);
    free(e);
    return rc;
}
