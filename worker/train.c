/* Training loop of one rank (DESIGN.md §7): the built-in MLP runs module by module with FSDP-style
 * hooks — a unit is unsharded in its root module's pre-forward (and the next unit prefetched),
 * resharded in its post-forward unless it is the root or the strategy keeps it, re-gathered in
 * pre-backward, and reduced in post-backward on the synced micro-batch (accumulated otherwise).
 * Then grad scaler verdict, clipping and the optimizer on the fp32 shards (runtime.c), a report
 * per step, eval every K steps, sharded checkpoints at every_steps and at the end. */
#include "worker/train.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "planner/reshard.h"
#include "coll/coll.h"
#include "model/data.h"
#include "coll/kv.h"
#include "model/loss.h"
#include "model/model.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "planner/mesh.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "worker/pipe.h"
#include "worker/runtime.h"

typedef struct train_buffer {
    const Pcs__V1__BufferSlot *slot;
    uint32_t unit; /* the plan unit listing it */
    int model_index;
    pcs_dtype_t run_dtype; /* dtype while training */
    void *data;            /* host copy (the only copy on cpu) */
    void *dev;             /* the model's copy in backend memory (== data on cpu) */
} train_buffer_t;

struct pcs_train {
    pcs_train_config_t cfg;
    const Pcs__V1__Assignment *as;
    const Pcs__V1__JobSpec *spec;
    const Pcs__V1__Plan *plan;
    const pcs_backend_ops_t *be; /* the job's backend (spec.backend) */
    pcs_coll_backend_t coll;     /* the job's transport (spec.collectives) */
    int device;                  /* cuda device ordinal */
    int on_host;                 /* be is the cpu backend: model inputs/outputs are host arrays */
    pcs_stream_t stream;         /* compute stream of the model (NULL on cpu) */
    pcs_mlp_t *model;
    pcs_runtime_t *rt;
    pcs_data_t *data;
    pcs_loss_kind_t loss;
    pcs_ckpt_dir_t ckpt; /* the job's own checkpoint directory (fd -1: none) */

    int32_t *mod_unit;   /* module index -> unit whose root it is, -1 otherwise */
    int32_t *slot_param; /* unit_slot0[u] + k -> model parameter of the unit's k-th slot */
    size_t *unit_slot0;
    uint32_t *fwd_order; /* units in forward order */
    uint32_t *unit_pos;  /* unit -> position in fwd_order */
    int *unit_mod;       /* unit -> root module index */
    size_t n_units;
    uint32_t root_unit;

    train_buffer_t *buffers;
    size_t n_buffers;

    struct pp_state *pp; /* pipeline stages (pp > 1): see "pipeline" below; NULL otherwise */
    uint32_t n_hidden, out_dim;

    /* step state */
    int sync, training, full_eval;
    /* M micro-batches per step, b rows per micro-batch, D data-parallel ranks (the sample-order
     * rule of DESIGN.md §5), dp_rank this rank's place among them, in_dim the model's input width
     */
    uint32_t M, b, D, dp_rank, in_dim;
    uint32_t fdepth, bdepth; /* ahead in forward / in backward (training.forward_prefetch,
                              * backward_prefetch: 0 = off) */
    int bpost;               /* backward prefetch after the unit's gradients (BACKWARD_POST) */
    pcs_dtype_t feed_dtype; /* dtype the inputs are fed in (pure low precision: the model's) */
    float *x;     /* host (pinned on cuda): the global eval batch or this rank's micro-batch */
    void *y;      /* host targets */
    float *gout;  /* host: dloss/dout */
    float *hout;  /* host copy of the model output (cuda) */
    float *dx;    /* device: the b rows fed to the model (cuda) */
    float *dgout; /* device: dloss/dout (cuda) */
    /* init.from: the file's full parameters and buffers as fp32 until the shards are filled */
    float *init_vals;
    uint64_t *init_off; /* per model param, then per model buffer: offset into init_vals */
    double scale;
    uint32_t growth_tracker;
    uint64_t skipped;
    uint64_t start_step; /* steps done before this run (a resume); training runs start_step + 1.. */
    double setup_ms, bootstrap_ms, resume_ms; /* pcs_train_create's, for the first report */

    atomic_int aborted;
    char abort_reason[256];
};

struct pp_state;
static pcs_status_t pp_setup(pcs_train_t *t, const pcs_mlp_config_t *mc);
static void pp_free(pcs_train_t *t);
static pcs_pipe_t *pp_pipe(const pcs_train_t *t);
static pcs_status_t pp_eval(pcs_train_t *t, const float *x, const void *y, double *loss);
static pcs_status_t pp_step(pcs_train_t *t, uint64_t step, double *loss_sum, double *compute_ms);

// ---- hooks ----

/* The unit's parameters as views into its unsharded buffer: after every unshard (the runtime
 * hands out a pooled buffer while the unit is live, not a fixed one). */
static pcs_status_t bind_unit(pcs_train_t *t, pcs_mlp_t *model, uint32_t unit, const void *flat,
                              pcs_dtype_t dt)
{
    const Pcs__V1__Unit *u = t->plan->units[unit];
    size_t esz = pcs_dtype_size(dt);
    const int32_t *pi = t->slot_param + t->unit_slot0[unit];
    for (size_t k = 0; k < u->n_params; k++)
        PCS_CHECK(pcs_mlp_bind_param(model, (uint32_t)pi[k], dt,
                                     (const uint8_t *)flat + u->params[k]->offset * esz));
    return PCS_OK;
}

/* Its gradients as views into the runtime's gradient target for a hand-in with `sync`, before
 * its backward (frozen: none): in accumulation the no-sync accumulator itself, written by the
 * first micro-batch and added to by the others (the model writes every bound gradient). */
static pcs_status_t bind_unit_grads(pcs_train_t *t, pcs_mlp_t *model, uint32_t unit, int sync)
{
    const Pcs__V1__Unit *u = t->plan->units[unit];
    void *g;
    pcs_dtype_t gdt;
    int acc;
    PCS_CHECK(pcs_runtime_grad_target(t->rt, unit, sync, &g, &gdt, &acc));
    size_t esz = pcs_dtype_size(gdt);
    const int32_t *pi = t->slot_param + t->unit_slot0[unit];
    for (size_t k = 0; k < u->n_params; k++)
        PCS_CHECK(pcs_mlp_bind_grad_mode(
            model, (uint32_t)pi[k], gdt,
            u->params[k]->frozen ? NULL : (uint8_t *)g + u->params[k]->offset * esz, acc));
    return PCS_OK;
}

static pcs_status_t hook_pre_forward(void *ctx, uint32_t mod)
{
    pcs_train_t *t = ctx;
    int32_t unit = t->mod_unit[mod];
    if (unit < 0)
        return PCS_OK;
    if (atomic_load(&t->aborted))
        return pcs_set_error(PCS_ERR_CANCELLED, "%s", t->abort_reason);
    const void *p;
    pcs_dtype_t dt;
    const Pcs__V1__Unit *u = t->plan->units[unit];
    int full = t->full_eval && u->mixed_precision && u->param_dtype != u->master_dtype;
    PCS_CHECK(pcs_runtime_unshard(t->rt, (uint32_t)unit, full, &p, &dt));
    PCS_CHECK(bind_unit(t, t->model, (uint32_t)unit, p, dt));
    /* Keep `fdepth` units gathered ahead in forward order (bounded memory: root + current +
     * fdepth). */
    uint32_t pos = t->unit_pos[unit];
    for (uint32_t k = 1; !full && k <= t->fdepth && pos + k < t->n_units; k++)
        PCS_CHECK(pcs_runtime_prefetch(t->rt, t->fwd_order[pos + k]));
    return PCS_OK;
}

static pcs_status_t hook_post_forward(void *ctx, uint32_t mod)
{
    pcs_train_t *t = ctx;
    int32_t unit = t->mod_unit[mod];
    if (unit < 0)
        return PCS_OK;
    const Pcs__V1__Unit *u = t->plan->units[unit];
    /* Eval: nothing follows, free everything. Training: FSDP keeps the root unit and whatever
     * the strategy keeps (reshard_after_forward false: SHARD_GRAD_OP, ZeRO-2). */
    if (!t->training)
        PCS_CHECK(pcs_runtime_reshard(t->rt, (uint32_t)unit));
    else if ((uint32_t)unit != t->root_unit && u->reshard_after_forward &&
             (t->sync || !u->keep_gathered_in_accumulation))
        PCS_CHECK(u->reshard_group_size > 1 ? pcs_runtime_reshard_partial(t->rt, (uint32_t)unit)
                                            : pcs_runtime_reshard(t->rt, (uint32_t)unit));
    return PCS_OK;
}

/* Gather the bdepth units before `unit` in forward order (the next ones in backward). */
static pcs_status_t prefetch_backward(pcs_train_t *t, uint32_t unit)
{
    uint32_t pos = t->unit_pos[unit];
    for (uint32_t k = 1; k <= t->bdepth && k <= pos; k++)
        PCS_CHECK(pcs_runtime_prefetch(t->rt, t->fwd_order[pos - k]));
    return PCS_OK;
}

static pcs_status_t hook_pre_backward(void *ctx, uint32_t mod)
{
    pcs_train_t *t = ctx;
    int32_t unit = t->mod_unit[mod];
    if (unit < 0)
        return PCS_OK;
    if (atomic_load(&t->aborted))
        return pcs_set_error(PCS_ERR_CANCELLED, "%s", t->abort_reason);
    const void *p;
    pcs_dtype_t dt;
    PCS_CHECK(pcs_runtime_unshard(t->rt, (uint32_t)unit, 0, &p, &dt));
    PCS_CHECK(bind_unit(t, t->model, (uint32_t)unit, p, dt));
    PCS_CHECK(bind_unit_grads(t, t->model, (uint32_t)unit, t->sync));
    if (!t->bpost) /* BACKWARD_PRE: before this unit's gradient computation */
        PCS_CHECK(prefetch_backward(t, (uint32_t)unit));
    return PCS_OK;
}

static pcs_status_t hook_post_backward(void *ctx, uint32_t mod)
{
    pcs_train_t *t = ctx;
    int32_t unit = t->mod_unit[mod];
    if (unit < 0)
        return PCS_OK;
    const Pcs__V1__Unit *u = t->plan->units[unit];
    PCS_CHECK(pcs_runtime_post_backward(t->rt, (uint32_t)unit, t->sync));
    /* FSDP1 _should_free_in_backward: sharded and (sync or FULL_SHARD-like). */
    if (t->sync || (u->reshard_after_backward && !u->keep_gathered_in_accumulation))
        PCS_CHECK(pcs_runtime_reshard(t->rt, (uint32_t)unit));
    /* BACKWARD_POST (FSDP1 _post_backward_hook): the current unit is freed first, then the next
     * one is gathered, while the reduction just queued runs */
    if (t->bpost)
        PCS_CHECK(prefetch_backward(t, (uint32_t)unit));
    return PCS_OK;
}

// ---- setup ----

static pcs_status_t init_param_cb(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first,
                                  uint64_t n, float *out)
{
    pcs_train_t *t = ctx;
    int pi = pcs_mlp_find_param(t->model, p->fqn);
    if (pi < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan parameter %s is not in the model", p->fqn);
    if (t->init_vals) {
        memcpy(out, t->init_vals + t->init_off[pi] + first, n * sizeof(float));
        return PCS_OK;
    }
    uint64_t seed = t->spec->init ? t->spec->init->seed : 0;
    return pcs_mlp_init_tensor(t->model, seed, 0, (uint32_t)pi, first, n, out);
}

/* init.from: read every parameter (required) and buffer (optional: absent ones keep their
 * deterministic init) of the file once, as the reference does; the shards copy their slices. The
 * whole model is in host memory only while the runtime fills its shards. */
static pcs_status_t load_init_file(pcs_train_t *t)
{
    const char *from =
        t->spec->init && t->spec->init->from && *t->spec->init->from ? t->spec->init->from : NULL;
    if (!from)
        return PCS_OK;
    uint32_t np = pcs_mlp_num_params(t->model), nb = pcs_mlp_num_buffers(t->model);
    uint64_t seed = t->spec->init->seed;
    pcs_named_tensor_t *all = NULL;
    float **dst = NULL;
    pcs_status_t st;
    uint64_t total = 0;
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *t->init_off, (void **)&t->init_off), st, out);
    for (uint32_t i = 0; i < np + nb; i++) {
        t->init_off[i] = total;
        total +=
            i < np ? pcs_mlp_param(t->model, i)->numel : pcs_mlp_buffer(t->model, i - np)->numel;
    }
    PCS_CHECK_GOTO(pcs_calloc(total + 1, sizeof(float), (void **)&t->init_vals), st, out);
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *all, (void **)&all), st, out);
    PCS_CHECK_GOTO(pcs_calloc(np + nb + 1, sizeof *dst, (void **)&dst), st, out);
    for (uint32_t i = 0; i < np + nb; i++) {
        all[i] = i < np ? *pcs_mlp_param(t->model, i) : *pcs_mlp_buffer(t->model, i - np);
        dst[i] = t->init_vals + t->init_off[i];
        if (i >= np)
            PCS_CHECK_GOTO(pcs_mlp_init_tensor(t->model, seed, 1, i - np, 0, all[i].numel, dst[i]),
                           st, out);
    }
    st = pcs_init_from_safetensors_in(t->cfg.init_root, from, all, np + nb, dst, NULL);
out:
    free(all);
    free(dst);
    return st;
}

/* The job's own checkpoint directory: <checkpoint.dir>/<job id> beneath the checkpoint root,
 * claimed for this job (pcs_ckpt_job_dir), so it neither reads nor prunes another job's steps. */
static pcs_status_t open_checkpoint_dir(pcs_train_t *t)
{
    const char *dir = t->spec->checkpoint ? t->spec->checkpoint->dir : NULL;
    if (!dir || !dir[0])
        return PCS_OK;
    int fd = -1;
    PCS_CHECK(pcs_root_open_dir(t->cfg.checkpoint_root, dir, "checkpoint.dir", 1, &fd));
    pcs_ckpt_dir_t base;
    pcs_ckpt_dir_adopt(fd, dir, &base);
    const char *uid = t->as->job_uid && *t->as->job_uid ? t->as->job_uid : t->as->job_id;
    pcs_status_t st = pcs_ckpt_job_dir(&base, t->as->job_id, uid, &t->ckpt);
    pcs_ckpt_dir_close(&base);
    return st;
}

static pcs_status_t setup_buffers(pcs_train_t *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->plan->n_units; i++)
        n += t->plan->units[i]->n_buffers;
    t->n_buffers = n;
    if (!n)
        return PCS_OK;
    PCS_CHECK(pcs_calloc(n, sizeof *t->buffers, (void **)&t->buffers));
    size_t k = 0;
    uint64_t seed = t->spec->init ? t->spec->init->seed : 0;
    for (size_t i = 0; i < t->plan->n_units; i++) {
        const Pcs__V1__Unit *u = t->plan->units[i];
        for (size_t j = 0; j < u->n_buffers; j++, k++) {
            train_buffer_t *b = &t->buffers[k];
            b->slot = u->buffers[j];
            b->unit = (uint32_t)i;
            b->model_index = pcs_mlp_find_buffer(t->model, b->slot->fqn);
            if (b->model_index < 0)
                return pcs_set_error(PCS_ERR_INVALID_ARG, "plan buffer %s is not in the model",
                                     b->slot->fqn);
            pcs_dtype_t orig = b->slot->dtype ? (pcs_dtype_t)b->slot->dtype : PCS_DTYPE_FP32;
            b->run_dtype = b->slot->run_dtype ? (pcs_dtype_t)b->slot->run_dtype : orig;
            if (orig == PCS_DTYPE_INT64)
                b->run_dtype = PCS_DTYPE_INT64;
            uint64_t numel = b->slot->numel ? b->slot->numel : 1;
            PCS_CHECK(pcs_calloc(numel, pcs_dtype_size(b->run_dtype), &b->data));
            float *tmp = NULL;
            PCS_CHECK(pcs_calloc(numel, sizeof(float), (void **)&tmp));
            pcs_status_t st = PCS_OK;
            if (t->init_vals)
                memcpy(tmp,
                       t->init_vals +
                           t->init_off[pcs_mlp_num_params(t->model) + (uint32_t)b->model_index],
                       numel * sizeof(float));
            else
                st =
                    pcs_mlp_init_tensor(t->model, seed, 1, (uint32_t)b->model_index, 0, numel, tmp);
            if (st == PCS_OK) {
                if (b->run_dtype == PCS_DTYPE_INT64) {
                    for (uint64_t e = 0; e < numel; e++)
                        ((int64_t *)b->data)[e] = (int64_t)tmp[e];
                } else {
                    pcs_from_f32(tmp, numel, b->run_dtype, b->data);
                }
            }
            free(tmp);
            PCS_CHECK(st);
            b->dev = b->data;
            if (!t->on_host) {
                size_t bytes = numel * pcs_dtype_size(b->run_dtype);
                PCS_CHECK(t->be->alloc(bytes, &b->dev));
                PCS_CHECK(t->be->copy(b->dev, b->data, bytes, PCS_COPY_H2D, t->stream));
            }
            PCS_CHECK(
                pcs_mlp_bind_buffer(t->model, (uint32_t)b->model_index, b->run_dtype, b->dev));
        }
    }
    return PCS_OK;
}

// ---- resume (issue 13) ----

/* Read what `segs` say of tensor "unit.<src>.<what>" into dst (the new shard, zeroed). */
static pcs_status_t fill_shard(pcs_ckpt_reader_t *r, const pcs_xfer_seg_t *segs, size_t n,
                               uint32_t unit, const char *what, float *dst)
{
    for (size_t k = 0; k < n; k++) {
        if (segs[k].unit != unit)
            continue;
        char key[64];
        pcs_ckpt_unit_key(segs[k].src_unit, what, key, sizeof key);
        PCS_CHECK(pcs_ckpt_reader_read(r, segs[k].src_rank, key, segs[k].src, segs[k].count,
                                       dst + segs[k].dst));
    }
    return PCS_OK;
}

/* A module buffer from the checkpoint: the file of replica 0, shard 0 of the unit that held it. */
static pcs_status_t load_buffer(pcs_train_t *t, pcs_ckpt_reader_t *r, train_buffer_t *b)
{
    const Pcs__V1__Plan *old = pcs_ckpt_reader_plan(r);
    uint32_t holder = UINT32_MAX;
    for (size_t u = 0; u < old->n_units && holder == UINT32_MAX; u++)
        for (size_t j = 0; j < old->units[u]->n_buffers; j++)
            if (strcmp(old->units[u]->buffers[j]->fqn, b->slot->fqn) == 0)
                holder = pcs_plan_shard_holder(old, (uint32_t)u, 0);
    if (holder == UINT32_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "resume: buffer %s is not in the checkpoint",
                             b->slot->fqn);
    uint64_t numel = b->slot->numel ? b->slot->numel : 1;
    float *tmp = NULL;
    PCS_CHECK(pcs_calloc(numel, sizeof(float), (void **)&tmp));
    char key[512];
    snprintf(key, sizeof key, "buffer.%s", b->slot->fqn);
    /* every rank file holds the buffers its rank had (BatchNorm's running statistics are per
     * rank, unsynchronised as under FSDP): at the same world size each rank takes its own back */
    pcs_status_t st = PCS_ERR_NOT_FOUND;
    if (old->world_size == t->plan->world_size)
        st = pcs_ckpt_reader_read(r, t->as->rank, key, 0, numel, tmp);
    if (st == PCS_ERR_NOT_FOUND)
        st = pcs_ckpt_reader_read(r, holder, key, 0, numel, tmp);
    if (st == PCS_OK) {
        if (b->run_dtype == PCS_DTYPE_INT64)
            for (uint64_t e = 0; e < numel; e++)
                ((int64_t *)b->data)[e] = (int64_t)tmp[e];
        else
            pcs_from_f32(tmp, numel, b->run_dtype, b->data);
        if (b->dev != b->data)
            st = t->be->copy(b->dev, b->data, numel * pcs_dtype_size(b->run_dtype), PCS_COPY_H2D,
                             t->stream);
    }
    free(tmp);
    return st;
}

static uint64_t meta_u64(pcs_ckpt_reader_t *r, const char *key, uint64_t def)
{
    const char *v = pcs_ckpt_reader_meta(r, 0, key);
    return v ? strtoull(v, NULL, 10) : def;
}

/* Everything a step needs, from checkpoint reader r: this rank's master shards and optimizer
 * state through the transfer plan (any world size and strategy of the same model), buffers, the
 * step, the optimizer's step count, the grad scaler. */
static pcs_status_t load_checkpoint(pcs_train_t *t, pcs_ckpt_reader_t *r)
{
    pcs_xfer_seg_t *segs = NULL;
    size_t n = 0;
    PCS_CHECK(pcs_plan_transfer(pcs_ckpt_reader_plan(r), t->plan, t->as->rank, &segs, &n));
    pcs_status_t st = PCS_OK;
    float *m = NULL, *a = NULL, *b = NULL;
    for (size_t i = 0; i < t->n_units && st == PCS_OK; i++) {
        if (!pcs_runtime_holds(t->rt, (uint32_t)i))
            continue; /* another pipeline stage's */
        pcs_rt_shard_t sh;
        PCS_CHECK_GOTO(pcs_runtime_shard(t->rt, (uint32_t)i, &sh), st, out);
        size_t c = sh.numel ? sh.numel : 1;
        free(m), free(a), free(b);
        m = calloc(c, sizeof *m), a = calloc(c, sizeof *a), b = calloc(c, sizeof *b);
        if (!m || !a || !b) {
            st = pcs_set_error(PCS_ERR_NOMEM, "resume: unit %zu shard of %zu elements", i, c);
            break;
        }
        PCS_CHECK_GOTO(fill_shard(r, segs, n, (uint32_t)i, "param", m), st, out);
        /* (the states the optimizer has, whatever the shard's frozen parameters hold) */
        if (sh.states & PCS_RT_STATE_EXP_AVG)
            PCS_CHECK_GOTO(fill_shard(r, segs, n, (uint32_t)i, "exp_avg", a), st, out);
        if (sh.states & PCS_RT_STATE_EXP_AVG_SQ)
            PCS_CHECK_GOTO(fill_shard(r, segs, n, (uint32_t)i, "exp_avg_sq", b), st, out);
        if (sh.states & PCS_RT_STATE_MOMENTUM)
            PCS_CHECK_GOTO(fill_shard(r, segs, n, (uint32_t)i, "momentum", a), st, out);
        PCS_CHECK_GOTO(pcs_runtime_shard_from_host(
                           t->rt, (uint32_t)i, m,
                           sh.states & (PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_MOMENTUM) ? a : NULL,
                           sh.states & PCS_RT_STATE_EXP_AVG_SQ ? b : NULL),
                       st, out);
    }
    for (size_t i = 0; i < t->n_buffers && st == PCS_OK; i++)
        if (pcs_runtime_holds(t->rt, t->buffers[i].unit))
            st = load_buffer(t, r, &t->buffers[i]);
    if (st == PCS_OK && t->stream)
        st = t->be->sync(t->stream);
    if (st == PCS_OK) {
        t->start_step = pcs_ckpt_reader_step(r);
        const char *ls = pcs_ckpt_reader_meta(r, 0, "loss_scale");
        if (ls)
            t->scale = strtod(ls, NULL);
        t->growth_tracker = (uint32_t)meta_u64(r, "growth_tracker", 0);
        t->skipped = meta_u64(r, "skipped_steps", 0);
        /* files written before the count was kept: one optimizer step per training step */
        pcs_runtime_set_opt_steps(t->rt, meta_u64(r, "opt_steps", t->start_step));
        PCS_INFO(PCS_SUB_WORKER, "resumed from %s: step %llu (%zu segments from %u ranks)",
                 pcs_ckpt_reader_path(r), (unsigned long long)t->start_step, n,
                 pcs_ckpt_reader_plan(r)->world_size);
    }
out:
    if (st == PCS_ERR_NOT_FOUND)
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "resume: %s (the checkpoint was written with another optimizer)",
                           pcs_last_error());
    free(m), free(a), free(b);
    free(segs);
    return st;
}

/* Where this run starts (Assignment.resume, else the spec's resume): the job's own checkpoint
 * directory after an automatic restart (its latest step; none yet: the spec's resume, else step 0
 * of the same init), or a job directory named beneath the checkpoint root. */
static pcs_status_t resume_if_asked(pcs_train_t *t)
{
    const Pcs__V1__ResumeSpec *own = t->as->resume;
    const Pcs__V1__ResumeSpec *rs = own && own->from && *own->from ? own : t->spec->resume;
    pcs_ckpt_reader_t *r = NULL;
    if (own && (!own->from || !*own->from) && t->ckpt.fd >= 0) {
        pcs_status_t st = pcs_ckpt_reader_open(&t->ckpt, own->step, &r);
        if (st != PCS_OK && st != PCS_ERR_NOT_FOUND)
            return st;
        if (st == PCS_ERR_NOT_FOUND)
            PCS_INFO(PCS_SUB_WORKER, "restart: no committed checkpoint in %s yet", t->ckpt.path);
    }
    if (!r && rs && rs->from && *rs->from) {
        int fd = -1;
        PCS_CHECK(pcs_root_open_dir(t->cfg.checkpoint_root, rs->from, "resume.from", 0, &fd));
        pcs_ckpt_dir_t d;
        pcs_ckpt_dir_adopt(fd, rs->from, &d);
        pcs_status_t st = pcs_ckpt_reader_open(&d, rs->step, &r);
        pcs_ckpt_dir_close(&d);
        if (st != PCS_OK)
            return pcs_set_error(st, "resume.from: %s", pcs_last_error());
    }
    if (!r)
        return PCS_OK; /* step 0 */
    pcs_status_t st = load_checkpoint(t, r);
    pcs_ckpt_reader_close(r);
    return st;
}

pcs_status_t pcs_train_data_position(const Pcs__V1__Assignment *as, uint32_t *dp_rank,
                                     uint32_t *dp_size)
{
    *dp_rank = 0;
    *dp_size = 1;
    if (!as->plan)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "assignment: no plan");
    pcs_mesh_t m;
    PCS_CHECK(pcs_mesh_from_plan(as->plan, &m));
    if (as->rank >= m.world)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "assignment: rank %u: must be < world size %u",
                             as->rank, m.world);
    uint32_t c[4];
    pcs_mesh_coords(&m, as->rank, c);
    const Pcs__V1__MeshCoords *ac = as->coords;
    if (ac && (ac->pp != c[PCS_MESH_PP] || ac->dp_replicate != c[PCS_MESH_DP_REPLICATE] ||
               ac->dp_shard != c[PCS_MESH_DP_SHARD]))
        return pcs_set_error(
            PCS_ERR_INVALID_ARG,
            "assignment: coordinates (pp %u, dp_replicate %u, dp_shard %u) are not "
            "rank %u's in the plan's mesh (pp %u, dp_replicate %u, dp_shard %u)",
            ac->pp, ac->dp_replicate, ac->dp_shard, as->rank, c[PCS_MESH_PP],
            c[PCS_MESH_DP_REPLICATE], c[PCS_MESH_DP_SHARD]);
    *dp_rank = pcs_mesh_data_rank(&m, as->rank);
    *dp_size = pcs_mesh_size(&m, PCS_MESH_DP_REPLICATE) * pcs_mesh_size(&m, PCS_MESH_DP_SHARD);
    return PCS_OK;
}

void pcs_train_opt_from_spec(const Pcs__V1__TrainingSpec *tr, pcs_runtime_config_t *rc)
{
    pcs_adamw_config_default(&rc->adamw);
    pcs_sgd_config_default(&rc->sgd);
    rc->opt = PCS_OPT_ADAMW;
    if (!tr || !tr->optimizer)
        return;
    const Pcs__V1__OptimizerSpec *o = tr->optimizer;
    if (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_SGD && o->sgd) {
        rc->opt = PCS_OPT_SGD;
        rc->sgd.lr = o->sgd->lr > 0 ? o->sgd->lr : rc->sgd.lr;
        rc->sgd.momentum = o->sgd->momentum ? o->sgd->momentum->value : 0.9;
        rc->sgd.dampening = o->sgd->dampening ? o->sgd->dampening->value : 0;
        rc->sgd.weight_decay = o->sgd->weight_decay ? o->sgd->weight_decay->value : 0;
        rc->sgd.nesterov = o->sgd->nesterov;
    } else if (o->kind_case == PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW && o->adamw) {
        rc->adamw.lr = o->adamw->lr > 0 ? o->adamw->lr : rc->adamw.lr;
        if (o->adamw->n_betas >= 2) {
            rc->adamw.beta1 = o->adamw->betas[0];
            rc->adamw.beta2 = o->adamw->betas[1];
        }
        if (o->adamw->eps)
            rc->adamw.eps = o->adamw->eps->value;
        if (o->adamw->weight_decay)
            rc->adamw.weight_decay = o->adamw->weight_decay->value;
    }
}

pcs_status_t pcs_train_resolve_backend(const Pcs__V1__JobSpec *spec, const char *offer_backend,
                                       const char *offer_coll, const pcs_backend_ops_t **be,
                                       int *coll)
{
    /* The job decides where it computes and which transport all its ranks use; the worker's
     * flags say what it offers (the coordinator only gives a job to workers offering both). */
    const char *job_be = spec->backend && spec->backend[0] ? spec->backend : "cpu";
    const char *offer_be = offer_backend && offer_backend[0] ? offer_backend : "cpu";
    const char *offer_c = offer_coll && offer_coll[0] ? offer_coll : "auto";
    const char *job_coll = spec->collectives && spec->collectives[0] ? spec->collectives : "auto";
    if (strcmp(job_coll, "auto") == 0)
        job_coll = strcmp(job_be, "cuda") == 0 ? "nccl" : "gloo";
    if (strcmp(job_be, "cuda") == 0 && strcmp(offer_be, "cuda") != 0)
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "backend: the job computes on cuda; this worker offers %s only "
                             "(start it with --backend cuda)",
                             offer_be);
    if (strcmp(job_coll, offer_c) != 0 && strcmp(offer_c, "auto") != 0)
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "collectives: the job uses %s; this worker offers %s only (--coll)",
                             job_coll, offer_c);
    *coll = strcmp(job_coll, "nccl") == 0 ? PCS_COLL_NCCL : PCS_COLL_GLOO;
    return pcs_backend_get(job_be, be);
}

pcs_status_t pcs_train_create(const pcs_train_config_t *cfg, pcs_train_t **out)
{
    if (!cfg || !out || !cfg->assignment || !cfg->assignment->spec || !cfg->assignment->plan)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "train: assignment with spec and plan required");
    *out = NULL;
    pcs_train_t *t = NULL;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *t, (void **)&t));
    uint64_t t_create = pcs_now_us();
    t->cfg = *cfg;
    t->ckpt.fd = -1;
    t->as = cfg->assignment;
    t->spec = t->as->spec;
    t->plan = t->as->plan;
    const Pcs__V1__JobSpec *spec = t->spec;
    const Pcs__V1__TrainingSpec *tr = spec->training;
    if (!spec->model || spec->model->kind_case != PCS__V1__MODEL_SPEC__KIND_MLP) {
        st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                           "model: pcs-worker computes built-in mlp models only (explicit module "
                           "trees are for programs using the C API)");
        goto fail;
    }
    if (t->as->plan_hash && pcs_plan_hash(t->plan) != t->as->plan_hash) {
        /* the plan is the contract: refuse one that is not the coordinator's */
        st = pcs_set_error(
            PCS_ERR_INVALID_ARG, "assignment: plan hash %016llx does not match the plan's %016llx",
            (unsigned long long)t->as->plan_hash, (unsigned long long)pcs_plan_hash(t->plan));
        goto fail;
    }
    PCS_CHECK_GOTO(pcs_plan_check_runnable(t->plan), st, fail);
    /* (the coordinator gives pcs-worker no such job: pcs_job_check_runnable) */
    for (size_t i = 0; i < t->plan->n_units; i++) {
        const Pcs__V1__Unit *pu = t->plan->units[i];
        if (pu->master_dtype == PCS__V1__DTYPE__DTYPE_FP64) {
            st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                               "precision: unit %zu has fp64 masters; pcs-worker computes and "
                               "checkpoints in fp32, bf16 and fp16",
                               i);
            goto fail;
        }
        if (pu->n_modules == 0 && pu->n_params > 0) {
            st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                               "%s: unit %zu; pcs-worker binds one unit per module",
                               pu->unmanaged ? "ignored_params" : "a group of mixed dtypes", i);
            goto fail;
        }
    }
    {
        int coll = 0;
        PCS_CHECK_GOTO(pcs_train_resolve_backend(spec, cfg->backend, cfg->coll, &t->be, &coll), st,
                       fail);
        t->coll = (pcs_coll_backend_t)coll;
        t->device = strcmp(t->be->name, "cpu") != 0 ? cfg->device : 0;
    }
    t->on_host = strcmp(t->be->name, "cpu") == 0;
    if (t->on_host) {
        /* ranks on one host share its CPUs: a pool per rank sized to all of them spins in
         * sched_yield (issue 18) */
        int cpus = pcs_cpu_available();
        int n = cfg->blas_threads
                    ? (int)cfg->blas_threads
                    : pcs_cpu_rank_threads(cpus, pcs_cpu_online(), t->as->local_world_size);
        int got = pcs_mlp_blas_threads(n);
        PCS_INFO(PCS_SUB_WORKER, "rank %u: %d BLAS threads (%s; %d CPUs, %u ranks on this host)",
                 t->as->rank, got, cfg->blas_threads ? "--blas-threads" : "auto", cpus,
                 t->as->local_world_size);
    }
    if (!t->on_host) {
        /* CUDA's current device is per thread: this (training) thread computes on t->device;
         * the runtime's threads set it themselves. */
        PCS_CHECK_GOTO(t->be->set_device(t->device), st, fail);
        PCS_CHECK_GOTO(t->be->stream_create(&t->stream), st, fail);
    }

    t->M = tr && tr->micro_batches ? tr->micro_batches : 1;
    t->b = tr && tr->micro_batch_size ? tr->micro_batch_size : 1;
    t->loss =
        tr && tr->loss == PCS__V1__LOSS__LOSS_CROSS_ENTROPY ? PCS_LOSS_CROSS_ENTROPY : PCS_LOSS_MSE;
    t->scale = 1.0;
    if (tr && tr->grad_scaler && tr->grad_scaler->enabled)
        t->scale = tr->grad_scaler->init_scale ? tr->grad_scaler->init_scale->value : 65536.0;

    /* Data-parallel position: which samples this rank reads (DESIGN.md §5 sample order). */
    PCS_CHECK_GOTO(pcs_train_data_position(t->as, &t->dp_rank, &t->D), st, fail);

    pcs_mlp_config_t mc;
    PCS_CHECK_GOTO(pcs_mlp_config_from_proto(spec->model->mlp, &mc), st, fail);
    t->in_dim = mc.input_dim;
    t->n_hidden = mc.n_hidden;
    t->out_dim = mc.output_dim;
    /* Eval reads the global eval batch (D*b rows, as the reference) and forwards this rank's b. */
    uint32_t eval_rows = t->D * t->b;
    PCS_CHECK_GOTO(pcs_mlp_create_on(&mc, t->b, t->be, t->stream, &t->model), st, fail);
    PCS_CHECK_GOTO(pcs_data_open_in(spec->data, t->cfg.data_root, mc.input_dim, mc.output_dim,
                                    t->loss, &t->data),
                   st, fail);
    PCS_CHECK_GOTO(open_checkpoint_dir(t), st, fail);

    /* Units: map root modules, forward order = order of their root modules. */
    t->n_units = t->plan->n_units;
    uint32_t nm = pcs_mlp_num_modules(t->model);
    PCS_CHECK_GOTO(pcs_calloc(nm, sizeof *t->mod_unit, (void **)&t->mod_unit), st, fail);
    for (uint32_t i = 0; i < nm; i++)
        t->mod_unit[i] = -1;
    PCS_CHECK_GOTO(pcs_calloc(t->n_units + 1, sizeof *t->fwd_order, (void **)&t->fwd_order), st,
                   fail);
    PCS_CHECK_GOTO(pcs_calloc(t->n_units + 1, sizeof *t->unit_pos, (void **)&t->unit_pos), st,
                   fail);
    PCS_CHECK_GOTO(pcs_calloc(t->n_units + 1, sizeof *t->unit_mod, (void **)&t->unit_mod), st,
                   fail);
    t->root_unit = UINT32_MAX;
    for (size_t i = 0; i < t->n_units; i++) {
        const Pcs__V1__Unit *u = t->plan->units[i];
        int mi = pcs_mlp_find_module(t->model, u->path ? u->path : "");
        if (mi < 0) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "plan unit %zu roots at '%s', not a module", i,
                               u->path);
            goto fail;
        }
        t->mod_unit[mi] = (int32_t)i;
        t->unit_mod[i] = mi;
        if (u->is_root)
            t->root_unit = (uint32_t)i;
        t->fwd_order[i] = (uint32_t)i;
    }
    /* every plan parameter is a model parameter (bound to unit buffers at each unshard) */
    {
        size_t slots = 0;
        for (size_t i = 0; i < t->n_units; i++)
            slots += t->plan->units[i]->n_params;
        PCS_CHECK_GOTO(
            pcs_calloc(t->n_units + 1, sizeof *t->unit_slot0, (void **)&t->unit_slot0), st, fail);
        PCS_CHECK_GOTO(
            pcs_calloc(slots + 1, sizeof *t->slot_param, (void **)&t->slot_param), st, fail);
        for (size_t i = 0, at = 0; i < t->n_units; i++) {
            const Pcs__V1__Unit *u = t->plan->units[i];
            t->unit_slot0[i] = at;
            for (size_t k = 0; k < u->n_params; k++) {
                int pi = pcs_mlp_find_param(t->model, u->params[k]->fqn);
                if (pi < 0) {
                    st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                       "plan parameter %s is not in the model", u->params[k]->fqn);
                    goto fail;
                }
                t->slot_param[at++] = pi;
            }
        }
    }
    /* FSDP casting at unit boundaries (spec §1.3), the same rule the reference applies. */
    PCS_CHECK_GOTO(pcs_mlp_apply_plan_casts(t->model, t->plan), st, fail);
    t->feed_dtype = pcs_mlp_feed_dtype(t->plan, pcs_data_input_dtype(t->data));
    for (size_t i = 1; i < t->n_units; i++) /* insertion sort by root module index */
        for (size_t j = i; j > 0 && t->unit_mod[t->fwd_order[j - 1]] > t->unit_mod[t->fwd_order[j]];
             j--) {
            uint32_t tmp = t->fwd_order[j];
            t->fwd_order[j] = t->fwd_order[j - 1];
            t->fwd_order[j - 1] = tmp;
        }
    for (size_t i = 0; i < t->n_units; i++)
        t->unit_pos[t->fwd_order[i]] = (uint32_t)i;

    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = t->plan;
    rc.rank = t->as->rank;
    rc.kv = cfg->kv;
    rc.hostname = cfg->hostname;
    rc.coll_timeout_ms = cfg->coll_timeout_ms ? (int)cfg->coll_timeout_ms : 30000;
    rc.be = t->be;
    rc.micro_batches = t->M;
    rc.fuse_grad_norm = tr && tr->clip_grad_norm > 0;
    rc.init_param = init_param_cb;
    rc.init_ctx = t;
    rc.prefetch =
        cfg->prefetch >= 0 ? cfg->prefetch : (int)(t->plan->prefetch ? t->plan->prefetch : 1);
    rc.stream = t->stream; /* the model's compute stream */
    rc.device = t->device;
    rc.coll = t->coll;
    rc.stage_host = cfg->stage_host;
    /* the plan's per-direction depths; the bench's override applies to both */
    uint32_t depth = rc.prefetch > 0 ? (uint32_t)rc.prefetch : 0;
    t->fdepth = cfg->prefetch >= 0 ? depth : t->plan->forward_prefetch_depth;
    t->bdepth = cfg->prefetch >= 0 ? depth : t->plan->backward_prefetch_depth;
    t->bpost = t->plan->backward_prefetch_post;
    pcs_train_opt_from_spec(tr, &rc);
    PCS_CHECK_GOTO(load_init_file(t), st, fail);
    uint64_t t_boot = pcs_now_us();
    PCS_CHECK_GOTO(pcs_runtime_create(&rc, &t->rt), st, fail);
    t->bootstrap_ms = (double)(pcs_now_us() - t_boot) / 1000.0;

    PCS_CHECK_GOTO(setup_buffers(t), st, fail);
    if (t->plan->pp_size > 1)
        PCS_CHECK_GOTO(pp_setup(t, &mc), st, fail);
    uint64_t t_resume = pcs_now_us();
    PCS_CHECK_GOTO(resume_if_asked(t), st, fail);
    t->resume_ms = (double)(pcs_now_us() - t_resume) / 1000.0;
    if (t->stream)
        PCS_CHECK_GOTO(t->be->sync(t->stream), st, fail); /* buffer uploads done */
    free(t->init_vals); /* the shards and buffers hold their values now */
    t->init_vals = NULL;

    uint32_t out_dim = mc.output_dim;
    size_t xin = (size_t)eval_rows * mc.input_dim, yout = (size_t)eval_rows * out_dim;
    /* host side in page-locked memory on cuda (fast async copies); plain memory on cpu */
    PCS_CHECK_GOTO(t->be->host_alloc(xin * sizeof(float), (void **)&t->x), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(yout, sizeof(double), &t->y), st, fail);
    PCS_CHECK_GOTO(t->be->host_alloc(yout * sizeof(float), (void **)&t->gout), st, fail);
    if (!t->on_host) {
        size_t rows = t->b;
        PCS_CHECK_GOTO(t->be->host_alloc(rows * out_dim * sizeof(float), (void **)&t->hout), st,
                       fail);
        PCS_CHECK_GOTO(t->be->alloc(rows * mc.input_dim * sizeof(float), (void **)&t->dx), st,
                       fail);
        PCS_CHECK_GOTO(t->be->alloc(rows * out_dim * sizeof(float), (void **)&t->dgout), st, fail);
    }
    t->setup_ms = (double)(pcs_now_us() - t_create) / 1000.0;
    *out = t;
    return PCS_OK;
fail:
    pcs_train_destroy(t);
    return st;
}

void pcs_train_abort(pcs_train_t *t, const char *reason)
{
    if (!t)
        return;
    if (!atomic_exchange(&t->aborted, 1))
        snprintf(t->abort_reason, sizeof t->abort_reason, "%s", reason ? reason : "aborted");
    pcs_runtime_abort(t->rt, reason);
    pcs_pipe_abort(pp_pipe(t), reason);
}

int pcs_train_blame(const pcs_train_t *t, pcs_coll_fault_t *fault)
{
    if (fault)
        *fault = PCS_COLL_FAULT_NONE;
    if (!t)
        return -1;
    int r = pcs_runtime_blame(t->rt, fault);
    return r >= 0 ? r : pcs_pipe_blame(pp_pipe(t), fault);
}

void pcs_train_destroy(pcs_train_t *t)
{
    if (!t)
        return;
    pcs_ckpt_dir_close(&t->ckpt);
    pp_free(t); /* its instances bind the buffers freed below */
    pcs_runtime_destroy(t->rt);
    pcs_mlp_destroy(t->model);
    pcs_data_close(t->data);
    for (size_t i = 0; i < t->n_buffers; i++) {
        if (t->buffers[i].dev != t->buffers[i].data)
            t->be->free(t->buffers[i].dev);
        free(t->buffers[i].data);
    }
    free(t->buffers);
    free(t->mod_unit);
    free(t->slot_param);
    free(t->unit_slot0);
    free(t->fwd_order);
    free(t->unit_pos);
    free(t->unit_mod);
    if (t->be) {
        t->be->host_free(t->x);
        t->be->host_free(t->gout);
        t->be->host_free(t->hout);
        t->be->free(t->dx);
        t->be->free(t->dgout);
        t->be->stream_destroy(t->stream);
    }
    free(t->y);
    free(t->init_vals);
    free(t->init_off);
    free(t);
}

// ---- step ----

static const pcs_mlp_hooks_t *hooks_of(pcs_train_t *t, pcs_mlp_hooks_t *h)
{
    h->ctx = t;
    h->pre_forward = hook_pre_forward;
    h->post_forward = hook_post_forward;
    h->pre_backward = hook_pre_backward;
    h->post_backward = hook_post_backward;
    return h;
}


// ---- host <-> model memory (identity on cpu) ----

/* The model's input: `rows` rows of host x, copied to device memory on cuda. */
static pcs_status_t feed_input(pcs_train_t *t, const float *x, uint32_t rows, const float **in)
{
    if (t->on_host) {
        *in = x;
        return PCS_OK;
    }
    PCS_CHECK(
        t->be->copy(t->dx, x, (size_t)rows * t->in_dim * sizeof(float), PCS_COPY_H2D, t->stream));
    *in = t->dx;
    return PCS_OK;
}

/* The forward's output on the host (waits for the forward on cuda: the loss needs it). */
static pcs_status_t fetch_output(pcs_train_t *t, const float *out, size_t n, const float **host)
{
    if (t->on_host) {
        *host = out;
        return PCS_OK;
    }
    PCS_CHECK(t->be->copy(t->hout, out, n * sizeof(float), PCS_COPY_D2H, t->stream));
    PCS_CHECK(t->be->sync(t->stream));
    *host = t->hout;
    return PCS_OK;
}

/* dloss/dout for backward, in model memory. The copy is ordered before the backward on the
 * stream, and t->gout is not rewritten before the next fetch_output's sync. */
static pcs_status_t feed_grad(pcs_train_t *t, size_t n, const float **g)
{
    if (t->on_host) {
        *g = t->gout;
        return PCS_OK;
    }
    PCS_CHECK(t->be->copy(t->dgout, t->gout, n * sizeof(float), PCS_COPY_H2D, t->stream));
    *g = t->dgout;
    return PCS_OK;
}

static pcs_status_t run_eval(pcs_train_t *t, double *eval_loss)
{
    /* The fixed eval batch of D*b rows (as the reference); this rank forwards its b rows and the
     * mean over ranks of the per-rank means is the batch mean. */
    uint32_t n = t->b;
    const float *out;
    pcs_dtype_t odt;
    pcs_mlp_hooks_t h;
    t->training = 0;
    /* FSDP1 forces full precision only where mixed precision is in use (not for a model fed in
     * its own low precision), as the reference */
    t->full_eval = t->spec->training && t->spec->training->full_precision_eval &&
                   t->feed_dtype == pcs_data_input_dtype(t->data);
    PCS_CHECK(pcs_data_read_eval(t->data, t->D * t->b, t->x, t->y));
    uint32_t in_dim = t->in_dim;
    const pcs_mlp_module_t *head = NULL;
    for (uint32_t i = 0; i < pcs_mlp_num_modules(t->model); i++)
        if (strcmp(pcs_mlp_module(t->model, i)->path, "head") == 0)
            head = pcs_mlp_module(t->model, i);
    uint32_t od = head ? head->out_dim : 1;
    float *x = t->x + (size_t)t->dp_rank * n * in_dim;
    pcs_round_to(x, (size_t)n * in_dim, t->feed_dtype);
    const void *y = t->loss == PCS_LOSS_CROSS_ENTROPY
                        ? (const void *)((const int64_t *)t->y + (size_t)t->dp_rank * n)
                        : (const void *)((const float *)t->y + (size_t)t->dp_rank * n * od);
    if (t->pp) {
        pcs_status_t st = pp_eval(t, x, y, eval_loss);
        t->full_eval = 0;
        t->training = 1;
        return st;
    }
    if (t->full_eval) {
        /* FSDP1 forced full precision: fp32 params, no input/output casts */
        for (size_t i = 0; i < t->n_units; i++)
            PCS_CHECK(pcs_mlp_set_cast(t->model, (uint32_t)t->unit_mod[i], PCS_DTYPE_NONE,
                                       PCS_DTYPE_NONE));
    }
    const float *in = NULL;
    pcs_status_t st = feed_input(t, x, n, &in);
    if (st == PCS_OK)
        st = pcs_mlp_forward(t->model, in, t->feed_dtype, n, 0, hooks_of(t, &h), &out, &odt);
    int was_full = t->full_eval;
    t->full_eval = 0;
    t->training = 1;
    if (st == PCS_OK)
        st = fetch_output(t, out, (size_t)n * od, &out);
    if (st == PCS_OK)
        st = pcs_loss_compute(t->loss, out, n, od, y, 1.0f, eval_loss, NULL);
    if (was_full && st == PCS_OK)
        st = pcs_mlp_apply_plan_casts(t->model, t->plan);
    return st;
}

void pcs_train_scaler_update(const Pcs__V1__GradScalerSpec *g, int found_inf, double *scale,
                             uint32_t *growth_tracker)
{
    double growth = g->growth_factor ? g->growth_factor->value : 2.0;
    double backoff = g->backoff_factor ? g->backoff_factor->value : 0.5;
    uint32_t interval = g->growth_interval ? g->growth_interval->value : 2000;
    if (found_inf) {
        *scale *= backoff;
        *growth_tracker = 0;
    } else if (++*growth_tracker >= interval) {
        double ns = *scale * growth;
        if (isfinite((float)ns)) /* ATen skips growth that would overflow fp32 */
            *scale = ns;
        *growth_tracker = 0;
    }
}

/* Write this rank's checkpoint of `step` (io/checkpoint.h): device shards and buffers copied to
 * the host in the dtypes the format keeps, handed to the rank-file builder; rank 0 commits and
 * prunes after every rank has written. */
static pcs_status_t checkpoint(pcs_train_t *t, uint64_t step)
{
    if (t->ckpt.fd < 0)
        return PCS_OK;
    const char *dir = t->ckpt.path;
    pcs_ckpt_rank_file_t *f = NULL;
    void **host = NULL; /* per unit: master (storage dtype), state a, state b, master dtype;
                         * then one converted copy per buffer */
    size_t n_host = t->n_units * 4 + t->n_buffers;
    pcs_status_t st;
    PCS_CHECK_GOTO(pcs_ckpt_rank_file_create(t->n_units, t->n_buffers, &f), st, out);
    PCS_CHECK_GOTO(pcs_calloc(n_host + 1, sizeof *host, (void **)&host), st, out);
    pcs_rt_shard_t sh;
    memset(&sh, 0, sizeof sh);
    const pcs_backend_ops_t *host_be = NULL; /* host-side conversions of the copied shards */
    PCS_CHECK_GOTO(pcs_backend_get("cpu", &host_be), st, out);
    for (size_t i = 0; i < t->n_units; i++) {
        if (!pcs_runtime_holds(t->rt, (uint32_t)i))
            continue; /* another pipeline stage's: its ranks write it */
        /* the shard's pointers are backend (device) memory: copy it to host buffers */
        PCS_CHECK_GOTO(pcs_runtime_shard(t->rt, (uint32_t)i, &sh), st, out);
        void **h = &host[i * 4];
        size_t nb = (sh.numel ? sh.numel : 1) * sizeof(float);
        PCS_CHECK_GOTO(pcs_calloc(1, nb, &h[0]), st, out);
        if (sh.states & (PCS_RT_STATE_EXP_AVG | PCS_RT_STATE_MOMENTUM))
            PCS_CHECK_GOTO(pcs_calloc(1, nb, &h[1]), st, out);
        if (sh.states & PCS_RT_STATE_EXP_AVG_SQ)
            PCS_CHECK_GOTO(pcs_calloc(1, nb, &h[2]), st, out);
        PCS_CHECK_GOTO(pcs_runtime_shard_to_host(t->rt, (uint32_t)i, h[0], h[1], h[2]), st, out);
        const void *master = h[0];
        if (sh.master_dtype != sh.host_dtype) {
            /* checkpoints hold the master dtype (pure fp16: fp16 values) */
            PCS_CHECK_GOTO(
                pcs_calloc(sh.numel ? sh.numel : 1, pcs_dtype_size(sh.master_dtype), &h[3]), st,
                out);
            PCS_CHECK_GOTO(pcs_kernel_cast(host_be, h[3], sh.master_dtype, h[0], sh.host_dtype,
                                           sh.numel, NULL),
                           st, out);
            master = h[3];
        }
        pcs_ckpt_unit_meta_t um = {(uint32_t)i, sh.shard_index, sh.replicate_index};
        PCS_CHECK_GOTO(pcs_ckpt_rank_file_add_unit(f, &um, sh.numel, sh.master_dtype, master,
                                                   sh.states & PCS_RT_STATE_MOMENTUM ? NULL : h[1],
                                                   h[2],
                                                   sh.states & PCS_RT_STATE_MOMENTUM ? h[1] : NULL),
                       st, out);
    }
    for (size_t i = 0; i < t->n_buffers; i++) {
        train_buffer_t *b = &t->buffers[i];
        if (!pcs_runtime_holds(t->rt, b->unit))
            continue; /* updated by the stage that holds it */
        pcs_dtype_t orig = b->slot->dtype ? (pcs_dtype_t)b->slot->dtype : PCS_DTYPE_FP32;
        uint64_t numel = b->slot->numel ? b->slot->numel : 1;
        if (b->dev != b->data) {
            /* the model updates the device copy (BatchNorm running stats) */
            PCS_CHECK_GOTO(t->be->copy(b->data, b->dev, numel * pcs_dtype_size(b->run_dtype),
                                       PCS_COPY_D2H, t->stream),
                           st, out);
            PCS_CHECK_GOTO(t->be->sync(t->stream), st, out);
        }
        const void *data = b->data;
        if (orig != b->run_dtype && orig != PCS_DTYPE_INT64) {
            /* state_dict gives buffers in their original dtype (spec §1.4) */
            void **conv = &host[t->n_units * 4 + i];
            float *tmp = NULL;
            PCS_CHECK_GOTO(pcs_calloc(numel, sizeof(float), (void **)&tmp), st, out);
            pcs_to_f32(b->data, b->run_dtype, numel, tmp);
            st = pcs_calloc(numel, pcs_dtype_size(orig), conv);
            if (st == PCS_OK)
                pcs_from_f32(tmp, numel, orig, *conv);
            free(tmp);
            if (st != PCS_OK)
                goto out;
            data = *conv;
        }
        PCS_CHECK_GOTO(pcs_ckpt_rank_file_add_buffer(f, b->slot->fqn, orig, numel,
                                                     b->slot->n_shape == 0, data),
                       st, out);
    }
    {
        pcs_ckpt_rank_meta_t m;
        memset(&m, 0, sizeof m);
        m.job_id = t->as->job_id;
        m.step = step;
        m.rank = t->as->rank;
        m.world_size = t->plan->world_size;
        /* file-level indices: the last unit's (kept for older readers); export uses the
         * per-unit ones, since a replicated unit's indices differ from a sharded unit's */
        m.shard_index = sh.shard_index;
        m.replicate_index = sh.replicate_index;
        m.plan_hash = t->as->plan_hash;
        m.loss_scale = t->scale;
        m.opt_steps = pcs_runtime_opt_steps(t->rt);
        m.growth_tracker = t->growth_tracker;
        m.skipped_steps = t->skipped;
        PCS_CHECK_GOTO(pcs_ckpt_rank_file_write_in(&t->ckpt, &m, f), st, out);
    }
    if (t->cfg.die_at_checkpoint == step && t->cfg.die_rank == t->as->rank &&
        t->as->generation == 1) {
        PCS_WARN(PCS_SUB_WORKER, "test hook: dying in the checkpoint of step %llu",
                 (unsigned long long)step);
        _exit(70);
    }
    PCS_CHECK_GOTO(pcs_runtime_barrier(t->rt), st, out);
    if (t->as->rank == 0) {
        PCS_CHECK_GOTO(pcs_ckpt_commit_in(&t->ckpt, step, t->plan), st, out);
        /* the step is committed: failing to clean up older ones must not fail the job */
        if (pcs_ckpt_prune_in(&t->ckpt, step, t->spec->checkpoint->keep_last) != PCS_OK)
            PCS_WARN(PCS_SUB_WORKER, "checkpoint of step %llu committed; prune failed: %s",
                     (unsigned long long)step, pcs_last_error());
    }
    PCS_DEBUG(PCS_SUB_WORKER, "checkpoint of step %llu written to %s", (unsigned long long)step,
              dir);
    st = PCS_OK;
out:
    pcs_ckpt_rank_file_free(f);
    for (size_t i = 0; host && i < n_host; i++)
        free(host[i]);
    free(host);
    return st;
}

void pcs_train_fill_report(Pcs__V1__StepReport *r, Pcs__V1__CollectiveRecord *recs,
                           Pcs__V1__CollectiveRecord **rp, size_t cap, const pcs_rt_stats_t *s)
{
    r->all_gather_ms = s->all_gather_ms;
    r->reduce_scatter_ms = s->reduce_scatter_ms + s->all_reduce_ms;
    r->cast_ms = s->cast_ms;
    r->optimizer_ms = s->optimizer_ms;
    r->all_gather_bytes = s->all_gather_bytes;
    r->reduce_scatter_bytes = s->reduce_scatter_bytes;
    r->all_reduce_bytes = s->all_reduce_bytes;
    r->fingerprint = s->fingerprint;
    r->audit_ok = s->audit_ok;
    r->max_unsharded_units = s->max_unsharded;
    r->runtime_memory_peak_bytes = s->mem_step_peak_bytes;
    r->runtime_memory_reserved_bytes = s->mem_reserved_bytes;
    /* Aggregate per (kind, unit, dtype): calls and bytes. */
    size_t n = 0;
    for (size_t i = 0; i < s->n_colls; i++) {
        const pcs_rt_coll_rec_t *c = &s->colls[i];
        size_t j = 0;
        for (; j < n; j++)
            if ((int)recs[j].kind == c->kind && recs[j].unit == c->unit &&
                (pcs_dtype_t)recs[j].dtype == c->dtype)
                break;
        if (j == n) {
            if (n == cap)
                continue;
            pcs__v1__collective_record__init(&recs[n]);
            recs[n].kind = (Pcs__V1__CollKind)c->kind;
            recs[n].unit = c->unit;
            recs[n].dtype = (Pcs__V1__DType)c->dtype;
            recs[n].count = c->count;
            recs[n].audit_ok = 1;
            rp[n] = &recs[n];
            n++;
        }
        recs[j].calls++;
        recs[j].bytes += c->bytes;
        recs[j].audit_ok = recs[j].audit_ok && c->audit_ok;
    }
    r->n_collectives = n;
    r->collectives = rp;
}

// ---- pipeline stages (issue 14) ----
//
// With pp > 1 this rank runs its pp rank's action list of the plan's schedule
// (planner/schedule.h) instead of the forward/backward loop: F and B (I for the zero-bubble
// schedule) on one of its stages (layers [first, end) of the model, pcs_mlp_forward_range), the
// sends and receives of activations and their gradients (worker/pipe.h), and the FSDP actions
// UNSHARD / RESHARD around them. A micro-batch's forward state lives in a model instance of its
// stage until its backward: a stage has as many instances as its schedule keeps micro-batches in
// flight (GPipe: all of them; 1F1B: at most pp), every instance bound to the same unsharded
// parameters and buffers. Gradients accumulate per micro-batch as without stages, and the
// stage's last backward of the step reduces them over its data-parallel group (REDUCE_GRAD,
// FSDP's sync on the last micro-batch). An activation crosses a stage boundary in the dtype
// the forward produced it in (its values are exactly representable there) and its gradient in
// the same dtype (the first message across a boundary in a pass names its dtype and element
// count, which the receiver checks); each channel keeps its next receive posted, so the data
// lands while the stage still computes. The zero-bubble schedule's I action computes the
// activation gradients only (pcs_mlp_backward_input_only) and sends the input gradient on; its
// W action computes the parameter gradients later from what the micro-batch's instance kept
// (pcs_mlp_backward_weights) and hands them in: the instance is busy from F to W.

typedef struct pp_stage {
    uint32_t stage, first, end; /* global stage; model layers [first, end) */
    uint32_t in_w, out_w;       /* row widths of the stage's input and output */
    int is_first, is_last;
    uint32_t *units;
    size_t n_units;
    pcs_mlp_t **inst; /* forward state of the micro-batches in flight */
    int32_t *inst_mb; /* micro-batch an instance holds, -1 when free */
    uint32_t n_inst;
    int32_t *mb_inst; /* [M] instance of a micro-batch between its F and its B (or W) */
    float **in;       /* [M] stage input (backend memory, b x in_w) */
    float **gout;     /* [M] gradient of the stage output (backend memory, b x out_w) */
    float **h_out;    /* [M] host: output awaiting SEND_F */
    float **h_gin;    /* [M] host: input gradient awaiting SEND_B */
    float *gin;       /* backend: the input gradient of one backward (b x in_w) */
    pcs_dtype_t in_dt, out_dt;
    uint32_t n_bwd; /* backwards run this step */
    /* this pass's first message across each boundary carries a header (worker/pipe.h) */
    int hdr_sent_f, hdr_sent_b, hdr_post_f, hdr_post_b;
} pp_stage_t;

typedef struct pp_state {
    pcs_schedule_t *sch;
    pcs_pipe_t *pipe;
    /* receives of this rank's list: each channel's first, and after each the next one on its
     * channel (SIZE_MAX: none) — a channel's next receive is posted when the one before it is
     * taken, so the data lands while the stage computes and a receive's timeout starts just
     * before it is needed */
    size_t *next_recv, *first_recv;
    size_t n_first;
    uint32_t me, pp, n_stages;
    pp_stage_t *st; /* this rank's stages, st[k] = stage me + k * pp */
    uint32_t n_st;
} pp_state_t;

static pcs_pipe_t *pp_pipe(const pcs_train_t *t)
{
    return t->pp ? t->pp->pipe : NULL;
}

static pp_stage_t *pp_local(pcs_train_t *t, uint32_t stage)
{
    pp_state_t *pp = t->pp;
    uint32_t k = stage / pp->pp;
    return stage % pp->pp == pp->me && k < pp->n_st ? &pp->st[k] : NULL;
}

static void pp_free(pcs_train_t *t)
{
    pp_state_t *pp = t->pp;
    if (!pp)
        return;
    pcs_pipe_destroy(pp->pipe);
    for (uint32_t k = 0; pp->st && k < pp->n_st; k++) {
        pp_stage_t *ls = &pp->st[k];
        for (uint32_t i = 0; ls->inst && i < ls->n_inst; i++)
            pcs_mlp_destroy(ls->inst[i]);
        for (uint32_t m = 0; m < t->M; m++) {
            if (ls->in)
                t->be->free(ls->in[m]);
            if (ls->gout)
                t->be->free(ls->gout[m]);
            if (ls->h_out)
                free(ls->h_out[m]);
            if (ls->h_gin)
                free(ls->h_gin[m]);
        }
        t->be->free(ls->gin);
        free(ls->inst), free(ls->inst_mb), free(ls->mb_inst), free(ls->units);
        free(ls->in), free(ls->gout), free(ls->h_out), free(ls->h_gin);
    }
    free(pp->st);
    free(pp->next_recv);
    free(pp->first_recv);
    pcs_schedule_free(pp->sch);
    free(pp);
    t->pp = NULL;
}

static uint32_t layer_width(pcs_train_t *t, uint32_t layer, int out)
{
    char path[32];
    if (layer < t->n_hidden)
        snprintf(path, sizeof path, "layers.%u", layer);
    else
        snprintf(path, sizeof path, "head");
    int mi = pcs_mlp_find_module(t->model, path);
    if (mi < 0)
        return 0;
    const pcs_mlp_module_t *m = pcs_mlp_module(t->model, (uint32_t)mi);
    return out ? m->out_dim : m->in_dim;
}

/* Stages, instances, buffers and channels (after the runtime and the buffers exist). */
static pcs_status_t pp_setup(pcs_train_t *t, const pcs_mlp_config_t *mc)
{
    const Pcs__V1__Plan *plan = t->plan;
    pp_state_t *pp = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *pp, (void **)&pp));
    t->pp = pp;
    PCS_CHECK(pcs_plan_schedule(plan, &pp->sch));
    pp->pp = plan->pp_size;
    {
        uint32_t n = 0, my = 0;
        PCS_CHECK(pcs_plan_group_ranks(plan, PCS__V1__GROUP_KIND__GROUP_KIND_PP, t->as->rank, NULL,
                                       &n, &my));
        pp->me = my;
    }
    pp->n_stages = pp->sch->n_stages;
    pp->n_st = pp->sch->v;
    if (plan->n_stages != pp->n_stages || pp->sch->m != t->M)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "plan: %zu stages and %u micro-batches, the schedule has %u and %u",
                             plan->n_stages, t->M, pp->n_stages, pp->sch->m);
    {
        /* every action is on a stage of this rank, for a micro-batch of the step */
        const pcs_action_t *a = pp->sch->acts[pp->me];
        size_t n = pp->sch->n_acts[pp->me];
        for (size_t i = 0; i < n; i++)
            if (a[i].stage % pp->pp != pp->me || a[i].stage >= pp->n_stages || a[i].mb >= t->M ||
                a[i].peer >= pp->pp)
                return pcs_set_error(PCS_ERR_INTERNAL, "pipeline: action %zu of pp rank %u is "
                                     "not one of its stages' micro-batches", i, pp->me);
        PCS_CHECK(pcs_calloc(n + 1, sizeof *pp->next_recv, (void **)&pp->next_recv));
        PCS_CHECK(pcs_calloc(4 * (size_t)pp->pp + 1, sizeof *pp->first_recv,
                             (void **)&pp->first_recv));
        size_t *last = NULL; /* per channel (direction, peer): its receive seen last */
        PCS_CHECK(pcs_calloc(2 * (size_t)pp->pp, sizeof *last, (void **)&last));
        for (size_t c = 0; c < 2 * (size_t)pp->pp; c++)
            last[c] = SIZE_MAX;
        for (size_t i = n; i-- > 0;) {
            pp->next_recv[i] = SIZE_MAX;
            if (a[i].kind != PCS_ACT_RECV_F && a[i].kind != PCS_ACT_RECV_B)
                continue;
            size_t c = (size_t)(a[i].kind == PCS_ACT_RECV_B) * pp->pp + a[i].peer;
            pp->next_recv[i] = last[c];
            last[c] = i;
        }
        for (size_t c = 0; c < 2 * (size_t)pp->pp; c++)
            if (last[c] != SIZE_MAX)
                pp->first_recv[pp->n_first++] = last[c];
        free(last);
    }
    PCS_CHECK(pcs_calloc(pp->n_st, sizeof *pp->st, (void **)&pp->st));
    for (uint32_t k = 0; k < pp->n_st; k++) {
        pp_stage_t *ls = &pp->st[k];
        ls->stage = pp->me + k * pp->pp;
        const Pcs__V1__StageSpec *ss = NULL;
        for (size_t i = 0; i < plan->n_stages; i++)
            if (plan->stages[i]->stage == ls->stage)
                ss = plan->stages[i];
        if (!ss || ss->first_layer >= ss->last_layer || ss->last_layer > t->n_hidden)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: stage %u has no layer range of the "
                                 "model's %u blocks", ls->stage, t->n_hidden);
        ls->is_first = ls->stage == 0;
        ls->is_last = ls->stage + 1 == pp->n_stages;
        ls->first = ss->first_layer;
        /* the head follows the last block on the last stage */
        ls->end = ls->is_last ? t->n_hidden + 1 : ss->last_layer;
        if (ls->is_first && ls->first != 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: stage 0 starts at layer %u",
                                 ls->first);
        ls->in_w = ls->first == 0 ? t->in_dim : layer_width(t, ls->first, 0);
        ls->out_w = layer_width(t, ls->end - 1, 1);
        if (!ls->in_w || !ls->out_w)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "stage %u: layers [%u, %u) not in the model",
                                 ls->stage, ls->first, ls->end);
        /* the plan's units of this stage */
        PCS_CHECK(pcs_calloc(t->n_units + 1, sizeof *ls->units, (void **)&ls->units));
        for (size_t i = 0; i < t->n_units; i++)
            if (plan->units[i]->stage == ls->stage)
                ls->units[ls->n_units++] = (uint32_t)i;
        /* micro-batches in flight: forwards not yet consumed by their backward */
        uint32_t live = 0, most = 1;
        const pcs_action_t *a = pp->sch->acts[pp->me];
        for (size_t i = 0; i < pp->sch->n_acts[pp->me]; i++) {
            if (a[i].stage != ls->stage)
                continue;
            if (a[i].kind == PCS_ACT_F && ++live > most)
                most = live;
            if ((a[i].kind == PCS_ACT_B || a[i].kind == PCS_ACT_W) && live)
                live--;
        }
        ls->n_inst = most;
        PCS_CHECK(pcs_calloc(most, sizeof *ls->inst, (void **)&ls->inst));
        PCS_CHECK(pcs_calloc(most, sizeof *ls->inst_mb, (void **)&ls->inst_mb));
        for (uint32_t i = 0; i < most; i++) {
            PCS_CHECK(pcs_mlp_create_on(mc, t->b, t->be, t->stream, &ls->inst[i]));
            PCS_CHECK(pcs_mlp_apply_plan_casts(ls->inst[i], plan));
            ls->inst_mb[i] = -1;
            for (size_t b = 0; b < t->n_buffers; b++) { /* the shared running statistics */
                train_buffer_t *tb = &t->buffers[b];
                PCS_CHECK(pcs_mlp_bind_buffer(ls->inst[i], (uint32_t)tb->model_index,
                                              tb->run_dtype, tb->dev));
            }
        }
        PCS_CHECK(pcs_calloc(t->M, sizeof *ls->mb_inst, (void **)&ls->mb_inst));
        PCS_CHECK(pcs_calloc(t->M, sizeof *ls->in, (void **)&ls->in));
        PCS_CHECK(pcs_calloc(t->M, sizeof *ls->gout, (void **)&ls->gout));
        PCS_CHECK(pcs_calloc(t->M, sizeof *ls->h_out, (void **)&ls->h_out));
        PCS_CHECK(pcs_calloc(t->M, sizeof *ls->h_gin, (void **)&ls->h_gin));
        size_t in_b = (size_t)t->b * ls->in_w * sizeof(float);
        size_t out_b = (size_t)t->b * ls->out_w * sizeof(float);
        for (uint32_t m = 0; m < t->M; m++) {
            ls->mb_inst[m] = -1;
            PCS_CHECK(t->be->alloc(in_b, (void **)&ls->in[m]));
            PCS_CHECK(t->be->alloc(out_b, (void **)&ls->gout[m]));
            if (!ls->is_last)
                PCS_CHECK(pcs_calloc(1, out_b, (void **)&ls->h_out[m]));
            if (!ls->is_first)
                PCS_CHECK(pcs_calloc(1, in_b, (void **)&ls->h_gin[m]));
        }
        PCS_CHECK(t->be->alloc(in_b, (void **)&ls->gin));
        ls->in_dt = t->feed_dtype;
    }
    pcs_pipe_config_t pc;
    memset(&pc, 0, sizeof pc);
    pc.plan = plan;
    pc.rank = t->as->rank;
    pc.kv = t->cfg.kv;
    pc.hostname = t->cfg.hostname;
    pc.timeout_ms = t->cfg.coll_timeout_ms ? (int)t->cfg.coll_timeout_ms : 30000;
    PCS_CHECK(pcs_pipe_create(&pc, &pp->pipe));
    PCS_INFO(PCS_SUB_WORKER,
             "rank %u: pipeline %s, pp rank %u of %u, %u stage(s) here, %u micro-batches",
             t->as->rank, pcs_sched_name(pp->sch->kind), pp->me, pp->pp, pp->n_st, t->M);
    return PCS_OK;
}

/* Unshard the stage's units (a no-op for those already unsharded) and bind them on `m`. */
static pcs_status_t pp_bind(pcs_train_t *t, pp_stage_t *ls, pcs_mlp_t *m, int full, int grads,
                            int sync)
{
    for (size_t i = 0; i < ls->n_units; i++) {
        const void *p;
        pcs_dtype_t dt;
        const Pcs__V1__Unit *u = t->plan->units[ls->units[i]];
        int f = full && u->mixed_precision && u->param_dtype != u->master_dtype;
        PCS_CHECK(pcs_runtime_unshard(t->rt, ls->units[i], f, &p, &dt));
        PCS_CHECK(bind_unit(t, m, ls->units[i], p, dt));
        if (grads)
            PCS_CHECK(bind_unit_grads(t, m, ls->units[i], sync));
    }
    return PCS_OK;
}

static pcs_status_t pp_reshard(pcs_train_t *t, pp_stage_t *ls)
{
    for (size_t i = 0; i < ls->n_units; i++)
        if (pcs_runtime_is_unsharded(t->rt, ls->units[i]))
            PCS_CHECK(pcs_runtime_reshard(t->rt, ls->units[i]));
    return PCS_OK;
}

/* Post the receive of RECV action a (the pass's first message across its boundary carries a
 * header: both ends count the same way). */
static pcs_status_t pp_post(pcs_train_t *t, const pcs_action_t *a)
{
    pp_stage_t *ls = pp_local(t, a->stage);
    if (a->kind == PCS_ACT_RECV_F) {
        PCS_CHECK(pcs_pipe_post(t->pp->pipe, PCS_PIPE_FWD, a->peer, (size_t)t->b * ls->in_w,
                                ls->stage, !ls->hdr_post_f));
        ls->hdr_post_f = 1;
        return PCS_OK;
    }
    PCS_CHECK(pcs_pipe_post(t->pp->pipe, PCS_PIPE_BWD, a->peer, (size_t)t->b * ls->out_w,
                            ls->stage, !ls->hdr_post_b));
    ls->hdr_post_b = 1;
    return PCS_OK;
}

/* The next message from `peer` on `dir` (posted before) into host rows; an
 * activation sets the stage's input dtype (the dtype its producer computed it in). */
static pcs_status_t pp_take(pcs_train_t *t, pp_stage_t *ls, pcs_pipe_dir_t dir, uint32_t peer,
                            float *rows, size_t n)
{
    pcs_dtype_t dt;
    PCS_CHECK(pcs_pipe_take(t->pp->pipe, dir, peer, rows, n, &dt));
    if (dir == PCS_PIPE_FWD)
        ls->in_dt = dt;
    else if (dt != ls->out_dt)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "pipeline: stage %u's output gradient from pp rank %u is %s, its "
                             "output %s",
                             ls->stage, peer, pcs_dtype_name(dt), pcs_dtype_name(ls->out_dt));
    return PCS_OK;
}

static pcs_status_t pp_copy(pcs_train_t *t, void *dst, const void *src, size_t bytes,
                            pcs_copy_kind_t kind)
{
    if (t->on_host) {
        memmove(dst, src, bytes);
        return PCS_OK;
    }
    PCS_CHECK(t->be->copy(dst, src, bytes, kind, t->stream));
    return kind == PCS_COPY_D2H ? t->be->sync(t->stream) : PCS_OK;
}

static pcs_status_t pp_forward(pcs_train_t *t, pp_stage_t *ls, uint32_t mb, uint64_t step,
                               double *loss_sum)
{
    uint32_t b = t->b;
    int32_t k = -1;
    for (uint32_t i = 0; i < ls->n_inst && k < 0; i++)
        if (ls->inst_mb[i] < 0)
            k = (int32_t)i;
    if (mb >= t->M || ls->mb_inst[mb] >= 0)
        return pcs_set_error(PCS_ERR_INTERNAL,
                             "pipeline: stage %u forward of micro-batch %u, which is in flight",
                             ls->stage, mb);
    if (k < 0)
        return pcs_set_error(PCS_ERR_INTERNAL, "pipeline: stage %u forward of micro-batch %u "
                             "has no free instance", ls->stage, mb);
    pcs_mlp_t *m = ls->inst[k];
    if (ls->is_first || ls->is_last) {
        uint64_t first = pcs_data_batch_start(step - 1, mb, t->M, t->D, t->dp_rank, b);
        PCS_CHECK(pcs_data_read(t->data, first, b, t->x, t->y));
    }
    if (ls->is_first) {
        pcs_round_to(t->x, (size_t)b * t->in_dim, t->feed_dtype);
        PCS_CHECK(pp_copy(t, ls->in[mb], t->x, (size_t)b * t->in_dim * sizeof(float),
                          PCS_COPY_H2D));
    }
    PCS_CHECK(pp_bind(t, ls, m, 0, 0, 0));
    const float *out;
    pcs_dtype_t odt;
    PCS_CHECK(pcs_mlp_forward_range(m, ls->first, ls->end, ls->in[mb], ls->in_dt, b, 1, NULL,
                                    &out, &odt));
    ls->inst_mb[k] = (int32_t)mb;
    ls->mb_inst[mb] = k;
    ls->out_dt = odt;
    size_t n = (size_t)b * ls->out_w;
    if (!ls->is_last)
        return pp_copy(t, ls->h_out[mb], out, n * sizeof(float), PCS_COPY_D2H);
    /* the loss, scaled as scale_grads: the mean over the step's micro-batches */
    const float *host;
    PCS_CHECK(fetch_output(t, out, n, &host));
    double l = 0;
    float sc = (float)(t->scale / (double)t->M);
    PCS_CHECK(pcs_loss_compute(t->loss, host, b, ls->out_w, t->y, sc, &l, t->gout));
    *loss_sum += l;
    return pp_copy(t, ls->gout[mb], t->gout, n * sizeof(float), PCS_COPY_H2D);
}

/* B (whole backward), I (activation gradients only: zero bubble) or W (the parameter gradients
 * of an earlier I) of micro-batch mb. B and W hand the gradients in and free the instance. */
static pcs_status_t pp_backward(pcs_train_t *t, pp_stage_t *ls, uint32_t mb, pcs_act_kind_t kind)
{
    int32_t k = mb < t->M ? ls->mb_inst[mb] : -1;
    if (k < 0)
        return pcs_set_error(PCS_ERR_INTERNAL,
                             "pipeline: stage %u backward of micro-batch %u before its forward",
                             ls->stage, mb);
    pcs_mlp_t *m = ls->inst[k];
    /* the units may have been re-gathered into other blocks since the forward; gradient blocks
     * are taken where parameter gradients are written */
    /* the stage's last backward of the step reduces (REDUCE_GRAD); the others accumulate */
    int sync = ls->n_bwd + 1 == t->M || t->plan->sync_every_micro_batch;
    PCS_CHECK(pp_bind(t, ls, m, 0, kind != PCS_ACT_I, sync));
    float *gin = ls->is_first ? NULL : ls->gin;
    if (kind == PCS_ACT_W)
        PCS_CHECK(pcs_mlp_backward_weights(m));
    else if (kind == PCS_ACT_I)
        PCS_CHECK(pcs_mlp_backward_input_only(m, ls->gout[mb], gin));
    else
        PCS_CHECK(pcs_mlp_backward_input(m, ls->gout[mb], NULL, gin));
    if (kind == PCS_ACT_I)
        return ls->is_first ? PCS_OK
                            : pp_copy(t, ls->h_gin[mb], ls->gin,
                                      (size_t)t->b * ls->in_w * sizeof(float), PCS_COPY_D2H);
    ls->n_bwd++;
    for (size_t i = 0; i < ls->n_units; i++)
        PCS_CHECK(pcs_runtime_post_backward(t->rt, ls->units[i], sync));
    ls->inst_mb[k] = -1;
    ls->mb_inst[mb] = -1;
    if (ls->is_first || kind == PCS_ACT_W)
        return PCS_OK;
    return pp_copy(t, ls->h_gin[mb], ls->gin, (size_t)t->b * ls->in_w * sizeof(float),
                   PCS_COPY_D2H);
}

static void pp_begin_pass(pcs_train_t *t)
{
    for (uint32_t k = 0; k < t->pp->n_st; k++) {
        pp_stage_t *ls = &t->pp->st[k];
        ls->in_dt = ls->is_first ? t->feed_dtype : ls->in_dt;
        ls->n_bwd = 0;
        ls->hdr_sent_f = ls->hdr_sent_b = ls->hdr_post_f = ls->hdr_post_b = 0;
        for (uint32_t i = 0; i < ls->n_inst; i++)
            ls->inst_mb[i] = -1;
        for (uint32_t m = 0; m < t->M; m++)
            ls->mb_inst[m] = -1;
    }
}

/* Before a receive that may wait: when the action after it gathers a stage (the schedule's
 * UNSHARD right after RECV), start that all-gather on the prefetch thread so it overlaps the
 * wait. Nothing else of this rank is gathered then beyond what the list holds anyway (around
 * every action: no stage; once per step: the stages gathered so far), so the estimate holds. */
static pcs_status_t pp_prefetch_next(pcs_train_t *t, const pcs_action_t *acts, size_t n, size_t i)
{
    if (i + 1 >= n || acts[i + 1].kind != PCS_ACT_UNSHARD)
        return PCS_OK;
    pp_stage_t *ls = pp_local(t, acts[i + 1].stage);
    for (size_t u = 0; ls && u < ls->n_units; u++)
        PCS_CHECK(pcs_runtime_prefetch(t->rt, ls->units[u]));
    return PCS_OK;
}

/* One training step's forward and backward: this pp rank's action list. */
static pcs_status_t pp_step(pcs_train_t *t, uint64_t step, double *loss_sum, double *compute_ms)
{
    pp_state_t *pp = t->pp;
    pp_begin_pass(t);
    const pcs_action_t *acts = pp->sch->acts[pp->me];
    size_t n = pp->sch->n_acts[pp->me];
    double by_kind[PCS_ACT_REDUCE_GRAD + 1] = {0}; /* ms per action kind (debug log) */
    for (size_t c = 0; c < pp->n_first; c++) /* each channel's first receive of the step */
        PCS_CHECK(pp_post(t, &acts[pp->first_recv[c]]));
    for (size_t i = 0; i < n; i++) {
        const pcs_action_t *a = &acts[i];
        if (atomic_load(&t->aborted))
            return pcs_set_error(PCS_ERR_CANCELLED, "%s", t->abort_reason);
        pp_stage_t *ls = pp_local(t, a->stage);
        if (!ls) {
            char what[64];
            pcs_action_str(a, what, sizeof what);
            return pcs_set_error(PCS_ERR_INTERNAL, "pipeline: action %s is not on pp rank %u",
                                 what, pp->me);
        }
        size_t nin = (size_t)t->b * ls->in_w, nout = (size_t)t->b * ls->out_w;
        uint64_t c0 = pcs_now_us();
        if (pcs_log_level_ >= (int)PCS_LOG_TRACE && (pcs_log_mask_ & PCS_SUB_WORKER)) {
            char what[64];
            pcs_action_str(a, what, sizeof what);
            PCS_TRACE(PCS_SUB_WORKER, "step %llu: %s", (unsigned long long)step, what);
        }
        pcs_dtype_t dt;
        switch ((pcs_act_kind_t)a->kind) {
        case PCS_ACT_UNSHARD:
            for (size_t u = 0; u < ls->n_units; u++) {
                const void *p;
                PCS_CHECK(pcs_runtime_unshard(t->rt, ls->units[u], 0, &p, &dt));
            }
            break;
        case PCS_ACT_RESHARD:
            PCS_CHECK(pp_reshard(t, ls));
            break;
        case PCS_ACT_REDUCE_GRAD: /* issued by the stage's last backward */
            break;
        case PCS_ACT_F:
        case PCS_ACT_B:
        case PCS_ACT_I:
        case PCS_ACT_W:
            if (a->kind == PCS_ACT_F)
                PCS_CHECK(pp_forward(t, ls, a->mb, step, loss_sum));
            else
                PCS_CHECK(pp_backward(t, ls, a->mb, (pcs_act_kind_t)a->kind));
            if (t->stream) /* compute time = the device's, not the enqueue */
                PCS_CHECK(t->be->sync(t->stream));
            *compute_ms += (double)(pcs_now_us() - c0) / 1000.0;
            break;
        case PCS_ACT_SEND_F:
            PCS_CHECK(pcs_pipe_send(pp->pipe, PCS_PIPE_FWD, a->peer, ls->h_out[a->mb], nout,
                                    ls->out_dt, !ls->hdr_sent_f));
            ls->hdr_sent_f = 1;
            break;
        case PCS_ACT_RECV_F: {
            float *h = t->on_host ? ls->in[a->mb] : ls->h_gin[a->mb]; /* host staging */
            PCS_CHECK(pp_prefetch_next(t, acts, n, i));
            PCS_CHECK(pp_take(t, ls, PCS_PIPE_FWD, a->peer, h, nin));
            if (pp->next_recv[i] != SIZE_MAX)
                PCS_CHECK(pp_post(t, &acts[pp->next_recv[i]]));
            if (!t->on_host)
                PCS_CHECK(pp_copy(t, ls->in[a->mb], h, nin * sizeof(float), PCS_COPY_H2D));
            break;
        }
        case PCS_ACT_SEND_B:
            PCS_CHECK(pcs_pipe_send(pp->pipe, PCS_PIPE_BWD, a->peer, ls->h_gin[a->mb], nin,
                                    ls->in_dt, !ls->hdr_sent_b));
            ls->hdr_sent_b = 1;
            break;
        case PCS_ACT_RECV_B: {
            float *h = t->on_host ? ls->gout[a->mb] : ls->h_out[a->mb];
            PCS_CHECK(pp_prefetch_next(t, acts, n, i));
            PCS_CHECK(pp_take(t, ls, PCS_PIPE_BWD, a->peer, h, nout));
            if (pp->next_recv[i] != SIZE_MAX)
                PCS_CHECK(pp_post(t, &acts[pp->next_recv[i]]));
            if (!t->on_host)
                PCS_CHECK(pp_copy(t, ls->gout[a->mb], h, nout * sizeof(float), PCS_COPY_H2D));
            break;
        }
        default:
            return pcs_set_error(PCS_ERR_INTERNAL, "pipeline: action kind %u", a->kind);
        }
        by_kind[a->kind] += (double)(pcs_now_us() - c0) / 1000.0;
    }
    PCS_DEBUG(PCS_SUB_WORKER,
              "step %llu pipeline: F %.2f B %.2f I %.2f W %.2f ms computing; waiting %.2f ms for "
              "activations, %.2f ms for gradients; sends %.2f ms; unshard %.2f reshard %.2f ms",
              (unsigned long long)step, by_kind[PCS_ACT_F], by_kind[PCS_ACT_B], by_kind[PCS_ACT_I],
              by_kind[PCS_ACT_W], by_kind[PCS_ACT_RECV_F], by_kind[PCS_ACT_RECV_B],
              by_kind[PCS_ACT_SEND_F] + by_kind[PCS_ACT_SEND_B], by_kind[PCS_ACT_UNSHARD],
              by_kind[PCS_ACT_RESHARD]);
    /* the schedule's RESHARDs left every stage sharded (seed test_pp_fsdp_unshard_reshard_runtime:
     * a unit still gathered here would be a schedule that leaks memory into the next step) */
    for (uint32_t k = 0; k < pp->n_st; k++)
        for (size_t i = 0; i < pp->st[k].n_units; i++)
            if (pcs_runtime_is_unsharded(t->rt, pp->st[k].units[i]))
                return pcs_set_error(PCS_ERR_INTERNAL,
                                     "pipeline: unit %u of stage %u is still unsharded after "
                                     "pp rank %u's action list",
                                     pp->st[k].units[i], pp->st[k].stage, pp->me);
    return pcs_pipe_flush(pp->pipe);
}

/* Eval through the stages: each stage forwards this rank's rows of the eval batch once, in
 * stage order (one micro-batch: the sends cannot cross). Only the last stage has a loss. */
static pcs_status_t pp_eval(pcs_train_t *t, const float *x, const void *y, double *loss)
{
    pp_state_t *pp = t->pp;
    pp_begin_pass(t);
    *loss = 0;
    uint32_t b = t->b;
    for (uint32_t k = 0; k < pp->n_st; k++) {
        pp_stage_t *ls = &pp->st[k];
        pcs_mlp_t *m = ls->inst[0];
        size_t nin = (size_t)b * ls->in_w, nout = (size_t)b * ls->out_w;
        if (ls->is_first) {
            PCS_CHECK(pp_copy(t, ls->in[0], x, nin * sizeof(float), PCS_COPY_H2D));
        } else {
            float *h = t->on_host ? ls->in[0] : ls->h_gin[0];
            uint32_t from = (ls->stage - 1) % pp->pp;
            PCS_CHECK(pcs_pipe_post(pp->pipe, PCS_PIPE_FWD, from, nin, ls->stage, 1));
            PCS_CHECK(pp_take(t, ls, PCS_PIPE_FWD, from, h, nin));
            if (!t->on_host)
                PCS_CHECK(pp_copy(t, ls->in[0], h, nin * sizeof(float), PCS_COPY_H2D));
        }
        if (t->full_eval) /* FSDP1 forced full precision: fp32 params, no casts */
            for (size_t i = 0; i < ls->n_units; i++)
                PCS_CHECK(pcs_mlp_set_cast(m, (uint32_t)t->unit_mod[ls->units[i]], PCS_DTYPE_NONE,
                                           PCS_DTYPE_NONE));
        const float *out;
        pcs_dtype_t odt;
        pcs_status_t st = pp_bind(t, ls, m, t->full_eval, 0, 0);
        if (st == PCS_OK)
            st = pcs_mlp_forward_range(m, ls->first, ls->end, ls->in[0], ls->in_dt, b, 0, NULL,
                                       &out, &odt);
        /* every unit, gathered or not: a full-precision gather holds its fp32 block until the
         * reshard, which is_unsharded does not report (as the hooks' eval) */
        for (size_t i = 0; st == PCS_OK && i < ls->n_units; i++)
            st = pcs_runtime_reshard(t->rt, ls->units[i]);
        if (t->full_eval) {
            pcs_status_t cs = pcs_mlp_apply_plan_casts(m, t->plan);
            st = st == PCS_OK ? cs : st;
        }
        PCS_CHECK(st);
        if (ls->is_last) {
            const float *host;
            PCS_CHECK(fetch_output(t, out, nout, &host));
            PCS_CHECK(pcs_loss_compute(t->loss, host, b, ls->out_w, y, 1.0f, loss, NULL));
        } else {
            PCS_CHECK(pp_copy(t, ls->h_out[0], out, nout * sizeof(float), PCS_COPY_D2H));
            PCS_CHECK(pcs_pipe_send(pp->pipe, PCS_PIPE_FWD, (ls->stage + 1) % pp->pp, ls->h_out[0],
                                    nout, odt, 1));
        }
    }
    return pcs_pipe_flush(pp->pipe);
}

pcs_status_t pcs_train_run(pcs_train_t *t, pcs_train_result_t *result)
{
    const Pcs__V1__TrainingSpec *tr = t->spec->training;
    uint64_t steps = tr ? tr->steps : 0;
    int scaler = tr && tr->grad_scaler && tr->grad_scaler->enabled;
    uint32_t eval_every = tr ? tr->eval_every : 0;
    uint32_t ckpt_every = t->spec->checkpoint ? t->spec->checkpoint->every_steps : 0;
    const pcs_mlp_module_t *head = NULL;
    for (uint32_t i = 0; i < pcs_mlp_num_modules(t->model); i++)
        if (strcmp(pcs_mlp_module(t->model, i)->path, "head") == 0)
            head = pcs_mlp_module(t->model, i);
    uint32_t out_dim = head ? head->out_dim : 1;
    size_t cap = 4 * t->n_units + 8;
    Pcs__V1__CollectiveRecord *recs = NULL;
    Pcs__V1__CollectiveRecord **rp = NULL;
    pcs_status_t st;
    PCS_CHECK_GOTO(pcs_calloc(cap, sizeof *recs, (void **)&recs), st, out);
    PCS_CHECK_GOTO(pcs_calloc(cap, sizeof *rp, (void **)&rp), st, out);
    t->training = 1;
    double sum_ms = 0;
    if (t->start_step >= steps) {
        /* resumed at the job's last step: nothing to train. The state it loaded is this job's
         * checkpoint (resharded when the world or strategy changed): export reads it there. */
        if (t->ckpt.fd >= 0)
            PCS_CHECK_GOTO(checkpoint(t, steps), st, out);
        Pcs__V1__StepReport r = PCS__V1__STEP_REPORT__INIT;
        r.step = steps;
        r.done = 1;
        r.audit_ok = 1;
        r.loss_scale = t->scale;
        r.skipped_steps = t->skipped;
        if (t->cfg.report)
            t->cfg.report(t->cfg.report_ctx, &r);
    }
    for (uint64_t s = t->start_step + 1; s <= steps; s++) {
        if (atomic_load(&t->aborted)) {
            st = pcs_set_error(PCS_ERR_CANCELLED, "%s", t->abort_reason);
            goto out;
        }
        uint64_t t0 = pcs_now_us();
        double compute_ms = 0, loss_sum = 0;
        PCS_CHECK_GOTO(pcs_runtime_begin_step(t->rt), st, fail);
        pcs_mlp_hooks_t h;
        double pipeline_ms = 0;
        if (t->pp) {
            uint64_t p0 = pcs_now_us();
            PCS_CHECK_GOTO(pp_step(t, s, &loss_sum, &compute_ms), st, fail);
            pipeline_ms = (double)(pcs_now_us() - p0) / 1000.0;
        }
        for (uint32_t m = 0; !t->pp && m < t->M; m++) {
            /* training.gradient_sync every_micro_batch: every backward reduces (FSDP2) */
            t->sync = m + 1 == t->M || t->plan->sync_every_micro_batch;
            uint64_t first = pcs_data_batch_start(s - 1, m, t->M, t->D, t->dp_rank, t->b);
            PCS_CHECK_GOTO(pcs_data_read(t->data, first, t->b, t->x, t->y), st, fail);
            uint64_t c0 = pcs_now_us();
            const float *out, *in, *g;
            pcs_dtype_t odt;
            pcs_round_to(t->x, (size_t)t->b * t->in_dim, t->feed_dtype);
            PCS_CHECK_GOTO(feed_input(t, t->x, t->b, &in), st, fail);
            PCS_CHECK_GOTO(
                pcs_mlp_forward(t->model, in, t->feed_dtype, t->b, 1, hooks_of(t, &h), &out, &odt),
                st, fail);
            PCS_CHECK_GOTO(fetch_output(t, out, (size_t)t->b * out_dim, &out), st, fail);
            double l = 0;
            float sc = (float)(t->scale / (double)t->M);
            PCS_CHECK_GOTO(pcs_loss_compute(t->loss, out, t->b, out_dim, t->y, sc, &l, t->gout), st,
                           fail);
            loss_sum += l;
            PCS_CHECK_GOTO(feed_grad(t, (size_t)t->b * out_dim, &g), st, fail);
            PCS_CHECK_GOTO(pcs_mlp_backward(t->model, g, &h), st, fail);
            if (t->stream) /* compute time = the GPU's, not the enqueue */
                PCS_CHECK_GOTO(t->be->sync(t->stream), st, fail);
            compute_ms += (double)(pcs_now_us() - c0) / 1000.0;
        }
        pcs_rt_step_opts_t so;
        memset(&so, 0, sizeof so);
        so.clip_norm = tr ? tr->clip_grad_norm : 0;
        so.scaler = scaler;
        so.loss_scale = t->scale;
        so.inject_inf = t->cfg.inject_inf_step == s && t->cfg.inject_inf_rank == t->as->rank;
        pcs_rt_step_result_t sr;
        PCS_CHECK_GOTO(pcs_runtime_optimizer_step(t->rt, &so, &sr), st, fail);
        double reported_scale = t->scale;
        if (scaler)
            pcs_train_scaler_update(tr->grad_scaler, sr.found_inf, &t->scale, &t->growth_tracker);
        if (sr.skipped)
            t->skipped++;
        double loss = loss_sum / (double)t->M;
        /* pipeline: only the last stage has the loss */
        PCS_CHECK_GOTO(pcs_runtime_sum_over_pp(t->rt, &loss), st, fail);
        PCS_CHECK_GOTO(pcs_runtime_mean_over_dp(t->rt, &loss), st, fail);
        pcs_rt_stats_t rs;
        pcs_runtime_stats(t->rt, &rs);
        double step_ms = (double)(pcs_now_us() - t0) / 1000.0;

        Pcs__V1__StepReport r = PCS__V1__STEP_REPORT__INIT;
        r.step = s;
        r.loss = loss;
        r.step_ms = step_ms;
        /* compute = forward/backward wall time minus the communication it waited on (with
         * pipeline stages the gathers are the schedule's UNSHARD actions, outside the compute
         * actions' time: nothing to take off) */
        double waited = t->pp ? 0 : rs.compute_thread_comm_ms;
        r.compute_ms = compute_ms > waited ? compute_ms - waited : 0;
        r.grad_norm = sr.grad_norm;
        r.pipeline_ms = pipeline_ms;
        r.loss_scale = reported_scale;
        r.skipped = sr.skipped;
        r.skipped_steps = t->skipped;
        if (s == t->start_step + 1) {
            r.setup_ms = t->setup_ms;
            r.bootstrap_ms = t->bootstrap_ms;
            r.resume_ms = t->resume_ms;
        }
        pcs_train_fill_report(&r, recs, rp, cap, &rs);
        if (eval_every && s % eval_every == 0) {
            double el = 0;
            PCS_CHECK_GOTO(run_eval(t, &el), st, fail);
            PCS_CHECK_GOTO(pcs_runtime_sum_over_pp(t->rt, &el), st, fail);
            PCS_CHECK_GOTO(pcs_runtime_mean_over_dp(t->rt, &el), st, fail);
            r.eval_loss = el;
        }
        if ((ckpt_every && s % ckpt_every == 0) || s == steps)
            PCS_CHECK_GOTO(checkpoint(t, s), st, fail);
        r.done = s == steps;
        sum_ms += step_ms;
        PCS_DEBUG(PCS_SUB_WORKER, "step %llu loss %.6f %.1f ms", (unsigned long long)s, loss,
                  step_ms);
        if (t->cfg.report)
            t->cfg.report(t->cfg.report_ctx, &r);
        for (uint32_t p = 0; p < t->cfg.step_pause_ms && s < steps && !atomic_load(&t->aborted);
             p += 10)
            pcs_sleep_ms(t->cfg.step_pause_ms - p < 10 ? t->cfg.step_pause_ms - p : 10);
        if (result) {
            result->steps = s;
            result->last_loss = loss;
            result->skipped_steps = t->skipped;
            result->mean_step_ms = sum_ms / (double)(s - t->start_step);
        }
    }
    /* Leave together (see pcs_worker_finish): no rank tears down its connections while a peer
     * still uses them. */
    PCS_CHECK_GOTO(pcs_runtime_barrier(t->rt), st, fail);
    st = PCS_OK;
    goto out;
fail:
    if (atomic_load(&t->aborted) && st != PCS_OK)
        st = pcs_set_error(PCS_ERR_CANCELLED, "%s", t->abort_reason);
out:
    free(recs);
    free(rp);
    return st;
}
