/* The public worker C API (include/pcs/worker.h) on top of the agent and the unit runtime: the
 * agent runs on a background thread with a custom job function that hands the assignment to the
 * API caller and waits until pcs_worker_finish(); the caller's thread drives the runtime
 * (unshard/reshard/hand in gradients/step) and queues its step reports on the agent. */
#include "pcs/worker.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/agent.h"
#include "model/init.h"
#include "coll/kv.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/v1/worker.pb-c.h"
#include "planner/plan.h"
#include "worker/runtime.h"
#include "worker/train.h"

struct pcs_worker {
    pcs_worker_options_t opt;
    pcs_worker_init64_fn init_f64; /* pcs_worker_join_as_f64's, or NULL */
    pcs_agent_t *agent;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int joined, finished, agent_done;
    pcs_status_t agent_status;
    char error[1024];
    const Pcs__V1__Assignment *as; /* owned by the agent until finish */
    pcs_kv_t *kv;
    pcs_runtime_t *rt;
    const pcs_backend_ops_t *be;
    pcs_stream_t stream; /* compute stream of a cuda job (NULL on cpu) */
    uint32_t dp_rank, dp_size;
    uint64_t step;
    uint64_t step_t0_us; /* begin_step time, for the report's step time */
    double scale;
    uint32_t growth_tracker;
    uint64_t skipped;
    char job_id[64];
};

// ---- agent side ----

/* Any thread (the agent's on a STOP directive, the program's): the runtime is aborted under mu,
 * so pcs_worker_finish/destroy, which take it out under mu before destroying it, never free it
 * under a running abort. */
static void api_abort(void *ctx, const char *reason)
{
    pcs_worker_t *w = ctx;
    pthread_mutex_lock(&w->mu);
    if (w->rt)
        pcs_runtime_abort(w->rt, reason);
    pthread_mutex_unlock(&w->mu);
}

/* Take the runtime out (under mu: no abort is using it afterwards); abort it first if asked. */
static pcs_runtime_t *take_runtime(pcs_worker_t *w, const char *abort_reason)
{
    pthread_mutex_lock(&w->mu);
    pcs_runtime_t *rt = w->rt;
    w->rt = NULL;
    if (rt && abort_reason)
        pcs_runtime_abort(rt, abort_reason);
    pthread_mutex_unlock(&w->mu);
    return rt;
}

static pcs_status_t api_job(void *ctx, pcs_agent_t *a, const Pcs__V1__Assignment *as, pcs_kv_t *kv)
{
    pcs_worker_t *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->as = as;
    w->kv = kv;
    w->joined = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pcs_agent_set_abort(a, api_abort, w);
    pthread_mutex_lock(&w->mu);
    while (!w->finished)
        pthread_cond_wait(&w->cv, &w->mu);
    pcs_status_t st = w->error[0] ? PCS_ERR_INTERNAL : PCS_OK;
    if (st != PCS_OK)
        pcs_set_error(st, "%s", w->error);
    pthread_mutex_unlock(&w->mu);
    return st;
}

static void *agent_main(void *arg)
{
    pcs_worker_t *w = arg;
    pcs_thread_name("pcs-agent");
    pcs_status_t st = pcs_agent_run(w->agent);
    pthread_mutex_lock(&w->mu);
    w->agent_status = st;
    if (st != PCS_OK && !w->error[0])
        snprintf(w->error, sizeof w->error, "%s", pcs_last_error());
    w->agent_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

// ---- parameter init ----

typedef struct init_ctx {
    pcs_worker_t *w;
} init_ctx_t;

static const Pcs__V1__ParamSlot *find_slot(const Pcs__V1__Plan *p, const char *fqn)
{
    for (size_t u = 0; u < p->n_units; u++)
        for (size_t k = 0; k < p->units[u]->n_params; k++)
            if (strcmp(p->units[u]->params[k]->fqn, fqn) == 0)
                return p->units[u]->params[k];
    return NULL;
}

static pcs_status_t api_init_param(void *ctx, const Pcs__V1__ParamSlot *ps, uint64_t first,
                                   uint64_t n, float *out)
{
    pcs_worker_t *w = ctx;
    if (w->opt.init)
        return w->opt.init(w->opt.init_ctx, ps->fqn, first, n, out);
    uint64_t seed = w->as->spec->init ? w->as->spec->init->seed : 0;
    /* PyTorch Linear-style defaults: U(+-1/sqrt(fan_in)) for matrices and the bias next to one;
     * ones for other weight vectors, zeros for the rest. */
    uint64_t fan_in = 0;
    if (ps->n_shape >= 2 && ps->shape[0] > 0) {
        fan_in = ps->numel / ps->shape[0];
    } else {
        const char *dot = strrchr(ps->fqn, '.');
        char sib[512];
        snprintf(sib, sizeof sib, "%.*sweight", dot ? (int)(dot - ps->fqn + 1) : 0, ps->fqn);
        const Pcs__V1__ParamSlot *ws = find_slot(w->as->plan, sib);
        if (ws && ws->n_shape >= 2 && ws->shape[0] > 0)
            fan_in = ws->numel / ws->shape[0];
    }
    if (fan_in > 0) {
        float b = (float)(1.0 / sqrt((double)fan_in));
        pcs_init_uniform(seed, ps->fqn, -b, b, first, n, out);
        return PCS_OK;
    }
    const char *dot = strrchr(ps->fqn, '.');
    float v = strcmp(dot ? dot + 1 : ps->fqn, "weight") == 0 ? 1.0f : 0.0f;
    for (uint64_t i = 0; i < n; i++)
        out[i] = v;
    return PCS_OK;
}

static pcs_status_t api_init_param64(void *ctx, const Pcs__V1__ParamSlot *ps, uint64_t first,
                                     uint64_t n, double *out)
{
    pcs_worker_t *w = ctx;
    return w->init_f64(w->opt.init_ctx, ps->fqn, first, n, out);
}

// ---- join / leave ----

pcs_status_t pcs_worker_join(const pcs_worker_options_t *opt, pcs_worker_t **out)
{
    return pcs_worker_join_as(opt, NULL, out);
}

pcs_status_t pcs_worker_join_as(const pcs_worker_options_t *opt, const char *program,
                                pcs_worker_t **out)
{
    return pcs_worker_join_as_f64(opt, program, NULL, out);
}

pcs_status_t pcs_worker_join_as_f64(const pcs_worker_options_t *opt, const char *program,
                                    pcs_worker_init64_fn init_f64, pcs_worker_t **out)
{
    if (!opt || !out || !opt->coordinator)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_worker_join: coordinator required");
    *out = NULL;
    pcs_worker_t *w = NULL;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *w, (void **)&w));
    w->opt = *opt;
    w->init_f64 = init_f64;
    w->scale = 1.0;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pcs_agent_config_t ac;
    memset(&ac, 0, sizeof ac);
    ac.coordinator = opt->coordinator;
    ac.identity = opt->identity;
    ac.hostname = opt->hostname;
    ac.coll_timeout_ms = opt->coll_timeout_ms;
    ac.backend = opt->backend;
    ac.program = program ? program : "";
    ac.device = opt->device;
    ac.max_jobs = 1;
    ac.job_fn = api_job;
    ac.job_ctx = w;
    PCS_CHECK_GOTO(pcs_agent_create(&ac, &w->agent), st, fail);
    if (pthread_create(&w->thread, NULL, agent_main, w) != 0) {
        st = pcs_set_error(PCS_ERR_SYSTEM, "pcs_worker_join: cannot start the agent thread");
        goto fail;
    }
    w->thread_started = 1;

    uint64_t deadline = opt->join_timeout_ms ? pcs_now_ms() + opt->join_timeout_ms : 0;
    pthread_mutex_lock(&w->mu);
    while (!w->joined && !w->agent_done && (!deadline || pcs_now_ms() < deadline)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    int joined = w->joined;
    pthread_mutex_unlock(&w->mu);
    if (!joined) {
        st = w->agent_done
                 ? pcs_set_error(PCS_ERR_REMOTE, "pcs_worker_join: %s", w->error)
                 : pcs_set_error(PCS_ERR_TIMEOUT, "pcs_worker_join: no assignment within %u ms",
                                 opt->join_timeout_ms);
        goto fail;
    }
    const Pcs__V1__Assignment *as = w->as;
    snprintf(w->job_id, sizeof w->job_id, "%s", as->job_id ? as->job_id : "");
    const Pcs__V1__Plan *plan = as->plan;
    const Pcs__V1__TrainingSpec *tr = as->spec ? as->spec->training : NULL;
    if (!plan || !tr) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "assignment without plan or training spec");
        goto fail_job;
    }
    /* The job's backend: host buffers on cpu, device buffers on cuda (pcs/worker.h). */
    int coll = 0;
    PCS_CHECK_GOTO(pcs_train_resolve_backend(as->spec, opt->backend, NULL, &w->be, &coll), st,
                   fail_job);
    if (strcmp(w->be->name, "cpu") != 0) {
        PCS_CHECK_GOTO(w->be->set_device(pcs_agent_device(w->agent)), st, fail_job);
        PCS_CHECK_GOTO(w->be->stream_create(&w->stream), st, fail_job);
    }
    PCS_CHECK_GOTO(pcs_train_data_position(as, &w->dp_rank, &w->dp_size), st, fail_job);
    if (plan->pp_size > 1) { /* the coordinator refuses these at SubmitJob */
        st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                           "mesh: pipeline stages (pp = %u) run in pcs-worker only; a C API "
                           "program computes its whole model",
                           plan->pp_size);
        goto fail_job;
    }
    if (plan->grads_into_accumulator) {
        /* the plan's memory estimate counts no gradient block in no-sync micro-batches: pcs-worker
         * writes them into the accumulator, grad_buffer takes a block the promise lacks */
        st = pcs_set_error(PCS_ERR_UNSUPPORTED,
                           "model.mlp with training.micro_batches > 1 is pcs-worker's built-in "
                           "model (its plan counts no gradient block for no-sync micro-batches); "
                           "a C API program computes a model.explicit tree");
        goto fail_job;
    }
    if (tr->grad_scaler && tr->grad_scaler->enabled)
        w->scale = tr->grad_scaler->init_scale ? tr->grad_scaler->init_scale->value : 65536.0;
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = plan;
    rc.rank = as->rank;
    rc.kv = w->kv;
    rc.hostname = opt->hostname;
    rc.coll_timeout_ms = opt->coll_timeout_ms ? (int)opt->coll_timeout_ms : 30000;
    rc.be = w->be;
    rc.stream = w->stream;
    rc.device = strcmp(w->be->name, "cpu") != 0 ? pcs_agent_device(w->agent) : 0;
    rc.coll = (pcs_coll_backend_t)coll;
    rc.micro_batches = tr->micro_batches ? tr->micro_batches : 1;
    rc.fuse_grad_norm = tr->clip_grad_norm > 0;
    rc.init_param = api_init_param;
    rc.init_param64 = w->init_f64 ? api_init_param64 : NULL;
    rc.init_ctx = w;
    rc.prefetch = (int)(plan->prefetch ? plan->prefetch : 1);
    pcs_train_opt_from_spec(tr, &rc);
    {
        pcs_runtime_t *rt = NULL;
        st = pcs_runtime_create(&rc, &rt);
        pthread_mutex_lock(&w->mu);
        w->rt = rt;
        pthread_mutex_unlock(&w->mu);
        if (st != PCS_OK)
            goto fail_job;
    }
    *out = w;
    return PCS_OK;
fail_job : {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pcs_last_error());
    pcs_worker_finish(w, msg);
    pcs_worker_destroy(w);
    return pcs_set_error(st, "%s", msg);
}
fail:
    pcs_worker_destroy(w);
    return st;
}

pcs_status_t pcs_worker_finish(pcs_worker_t *w, const char *error)
{
    if (!w)
        return PCS_ERR_INVALID_ARG;
    /* Leave together: a rank that tears its connections down while a peer still uses them makes
     * that peer see a failure. The runtime stays reachable for an abort (a STOP, a dead peer's
     * job failing) while the barrier waits. */
    if (w->rt && !(error && error[0]) && pcs_runtime_barrier(w->rt) != PCS_OK)
        PCS_DEBUG(PCS_SUB_WORKER, "final barrier: %s", pcs_last_error());
    /* The communicators use the job's KV store and plan, which the agent frees when the job
     * function returns: release them first. */
    pcs_runtime_destroy(take_runtime(w, NULL));
    pthread_mutex_lock(&w->mu);
    if (error && error[0] && !w->error[0])
        snprintf(w->error, sizeof w->error, "%s", error);
    w->finished = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->thread_started) {
        pthread_join(w->thread, NULL);
        w->thread_started = 0;
    }
    return w->agent_status;
}

void pcs_worker_abort(pcs_worker_t *w, const char *reason)
{
    if (w)
        api_abort(w, reason);
}

void pcs_worker_destroy(pcs_worker_t *w)
{
    if (!w)
        return;
    if (w->thread_started) {
        pcs_runtime_destroy(take_runtime(w, "pcs_worker_destroy"));
        pcs_agent_stop(w->agent);
        pthread_mutex_lock(&w->mu);
        w->finished = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pcs_runtime_destroy(w->rt);
    if (w->be && w->stream)
        w->be->stream_destroy(w->stream);
    pcs_agent_destroy(w->agent);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

// ---- queries ----

void *pcs_worker_stream(const pcs_worker_t *w)
{
    return w ? (void *)w->stream : NULL;
}

uint32_t pcs_worker_rank(const pcs_worker_t *w)
{
    return w->as->rank;
}
uint32_t pcs_worker_world_size(const pcs_worker_t *w)
{
    return w->as->world_size;
}
uint32_t pcs_worker_dp_rank(const pcs_worker_t *w)
{
    return w->dp_rank;
}
uint32_t pcs_worker_dp_size(const pcs_worker_t *w)
{
    return w->dp_size;
}
uint64_t pcs_worker_total_steps(const pcs_worker_t *w)
{
    return w->as->spec->training->steps;
}
int pcs_worker_eval_backward(const pcs_worker_t *w)
{
    return w->as->plan->eval_backward ? 1 : 0;
}

uint32_t pcs_worker_micro_batches(const pcs_worker_t *w)
{
    uint32_t m = w->as->spec->training->micro_batches;
    return m ? m : 1;
}
uint32_t pcs_worker_micro_batch_size(const pcs_worker_t *w)
{
    uint32_t b = w->as->spec->training->micro_batch_size;
    return b ? b : 1;
}
const char *pcs_worker_job_id(const pcs_worker_t *w)
{
    return w->job_id;
}
double pcs_worker_loss_scale(const pcs_worker_t *w)
{
    return w->scale;
}

size_t pcs_worker_num_units(const pcs_worker_t *w)
{
    return w->as->plan->n_units;
}

pcs_status_t pcs_worker_unit(const pcs_worker_t *w, uint32_t unit, pcs_worker_unit_info_t *out)
{
    if (unit >= w->as->plan->n_units)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "unit %u out of range", unit);
    const Pcs__V1__Unit *u = w->as->plan->units[unit];
    out->path = u->path;
    out->n_params = u->n_params;
    out->padded_numel = u->padded_numel;
    out->param_dtype = u->param_dtype
                           ? (pcs_dtype_t)u->param_dtype
                           : (u->master_dtype ? (pcs_dtype_t)u->master_dtype : PCS_DTYPE_FP32);
    out->is_root = u->is_root;
    return PCS_OK;
}

pcs_status_t pcs_worker_unit_policy(const pcs_worker_t *w, uint32_t unit,
                                    pcs_worker_unit_policy_t *out)
{
    if (unit >= w->as->plan->n_units)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "unit %u out of range", unit);
    const Pcs__V1__Unit *u = w->as->plan->units[unit];
    memset(out, 0, sizeof *out);
    out->mixed_precision = u->mixed_precision;
    out->cast_forward_inputs = u->cast_forward_inputs;
    out->reshard_after_forward = u->reshard_after_forward;
    out->keep_low_precision_grads = u->keep_low_precision_grads;
    out->input_dtype = u->cast_forward_inputs && pcs_dtype_is_float((pcs_dtype_t)u->param_dtype)
                           ? (pcs_dtype_t)u->param_dtype
                           : PCS_DTYPE_NONE;
    out->reduce_dtype = (pcs_dtype_t)u->reduce_dtype;
    out->master_dtype = u->master_dtype ? (pcs_dtype_t)u->master_dtype : PCS_DTYPE_FP32;
    out->buffer_dtype = (pcs_dtype_t)u->buffer_dtype;
    out->output_dtype = (pcs_dtype_t)u->output_dtype;
    out->n_modules = u->n_modules;
    out->modules = (const char *const *)u->modules;
    out->unmanaged = u->unmanaged;
    out->keep_gathered_in_accumulation = u->keep_gathered_in_accumulation;
    /* the mixed-precision units computing in another dtype than the master (FSDP1 forces full
     * precision only where mixed precision is in use) */
    out->full_precision_eval = w->as->plan->full_precision_eval && u->mixed_precision &&
                               u->param_dtype && u->param_dtype != u->master_dtype;
    return PCS_OK;
}

static void fill_param(const Pcs__V1__ParamSlot *ps, uint32_t unit, pcs_worker_param_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->fqn = ps->fqn;
    out->unit = unit;
    out->offset = ps->offset;
    out->numel = ps->numel;
    out->ndim = (uint32_t)(ps->n_shape > 8 ? 8 : ps->n_shape);
    for (uint32_t d = 0; d < out->ndim; d++)
        out->shape[d] = ps->shape[d];
}

pcs_status_t pcs_worker_param(const pcs_worker_t *w, uint32_t unit, size_t k,
                              pcs_worker_param_info_t *out)
{
    if (unit >= w->as->plan->n_units || k >= w->as->plan->units[unit]->n_params)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "parameter %zu of unit %u out of range", k, unit);
    fill_param(w->as->plan->units[unit]->params[k], unit, out);
    return PCS_OK;
}

pcs_status_t pcs_worker_find_param(const pcs_worker_t *w, const char *fqn,
                                   pcs_worker_param_info_t *out)
{
    const Pcs__V1__Plan *p = w->as->plan;
    for (size_t u = 0; u < p->n_units; u++)
        for (size_t k = 0; k < p->units[u]->n_params; k++)
            if (strcmp(p->units[u]->params[k]->fqn, fqn) == 0) {
                fill_param(p->units[u]->params[k], (uint32_t)u, out);
                return PCS_OK;
            }
    return pcs_set_error(PCS_ERR_NOT_FOUND, "no parameter %s in the plan", fqn ? fqn : "(null)");
}

// ---- step ----

pcs_status_t pcs_worker_begin_step(pcs_worker_t *w)
{
    w->step_t0_us = pcs_now_us();
    return pcs_runtime_begin_step(w->rt);
}

pcs_status_t pcs_worker_unshard(pcs_worker_t *w, uint32_t unit, const void **params,
                                pcs_dtype_t *dtype)
{
    return pcs_runtime_unshard(w->rt, unit, 0, params, dtype);
}

pcs_status_t pcs_worker_unshard_full(pcs_worker_t *w, uint32_t unit, const float **params)
{
    const void *p = NULL;
    pcs_dtype_t dt;
    /* masters stored in another dtype (fp64, a frozen unit's bf16/fp16): refused before
     * gathering anything */
    pcs_rt_shard_t sh;
    PCS_CHECK(pcs_runtime_shard(w->rt, unit, &sh));
    if (sh.storage_dtype != PCS_DTYPE_FP32)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u keeps %s masters: pcs_worker_unshard_master gives them",
                             unit, pcs_dtype_name(sh.storage_dtype));
    PCS_CHECK(pcs_runtime_unshard(w->rt, unit, 1, &p, &dt));
    if (dt != PCS_DTYPE_FP32)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "unit %u computes in its master dtype %s: pcs_worker_unshard gives "
                             "its masters",
                             unit, pcs_dtype_name(dt));
    *params = p;
    return PCS_OK;
}

pcs_status_t pcs_worker_unshard_master(pcs_worker_t *w, uint32_t unit, const void **params,
                                       pcs_dtype_t *dtype)
{
    if (!params || !dtype)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_worker_unshard_master: NULL out");
    return pcs_runtime_unshard(w->rt, unit, 1, params, dtype);
}

pcs_status_t pcs_worker_prefetch(pcs_worker_t *w, uint32_t unit)
{
    return pcs_runtime_prefetch(w->rt, unit);
}

pcs_status_t pcs_worker_reshard(pcs_worker_t *w, uint32_t unit)
{
    return pcs_runtime_reshard(w->rt, unit);
}

pcs_status_t pcs_worker_grad_buffer(pcs_worker_t *w, uint32_t unit, void **grads,
                                    pcs_dtype_t *dtype)
{
    return pcs_runtime_grad_buffer(w->rt, unit, grads, dtype);
}

pcs_status_t pcs_worker_memory(pcs_worker_t *w, pcs_worker_memory_t *out)
{
    if (!out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_worker_memory: NULL out");
    Pcs__V1__RankEstimate e;
    PCS_CHECK(pcs_plan_rank_estimate(w->as->plan, w->as->rank, &e));
    pcs_rt_stats_t s;
    pcs_runtime_stats(w->rt, &s);
    out->step_peak_bytes = s.mem_step_peak_bytes;
    out->peak_bytes = s.mem_peak_bytes;
    out->reserved_bytes = s.mem_reserved_bytes;
    out->promised_bytes = e.total_bytes - e.buffer_bytes;
    return PCS_OK;
}

pcs_status_t pcs_worker_grad_buffer_full(pcs_worker_t *w, uint32_t unit, float **grads)
{
    return pcs_runtime_grad_buffer_full(w->rt, unit, grads);
}

pcs_status_t pcs_worker_hand_in_grads(pcs_worker_t *w, uint32_t unit, int sync)
{
    return pcs_runtime_post_backward(w->rt, unit, sync);
}

pcs_status_t pcs_worker_step(pcs_worker_t *w, double loss, pcs_worker_step_result_t *res)
{
    const Pcs__V1__TrainingSpec *tr = w->as->spec->training;
    int scaler = tr->grad_scaler && tr->grad_scaler->enabled;
    pcs_rt_step_opts_t so;
    memset(&so, 0, sizeof so);
    so.clip_norm = tr->clip_grad_norm;
    so.scaler = scaler;
    so.loss_scale = w->scale;
    pcs_rt_step_result_t sr;
    PCS_CHECK(pcs_runtime_optimizer_step(w->rt, &so, &sr));
    double used_scale = w->scale;
    if (scaler)
        pcs_train_scaler_update(tr->grad_scaler, sr.found_inf, &w->scale, &w->growth_tracker);
    if (sr.skipped)
        w->skipped++;
    PCS_CHECK(pcs_runtime_mean_over_dp(w->rt, &loss));
    w->step++;
    pcs_rt_stats_t rs;
    pcs_runtime_stats(w->rt, &rs);
    size_t cap = 4 * w->as->plan->n_units + 8;
    Pcs__V1__CollectiveRecord *recs = calloc(cap, sizeof *recs);
    Pcs__V1__CollectiveRecord **rp = calloc(cap, sizeof *rp);
    if (!recs || !rp) {
        free(recs);
        free(rp);
        return pcs_set_error(PCS_ERR_NOMEM, "step report");
    }
    Pcs__V1__StepReport r = PCS__V1__STEP_REPORT__INIT;
    r.step = w->step;
    r.loss = loss;
    r.grad_norm = sr.grad_norm;
    r.loss_scale = used_scale;
    r.skipped = sr.skipped;
    r.skipped_steps = w->skipped;
    pcs_train_fill_report(&r, recs, rp, cap, &rs);
    if (w->step_t0_us) {
        /* the program's own compute is what is left of the step after communication waits,
         * casts and the optimizer */
        r.step_ms = (double)(pcs_now_us() - w->step_t0_us) / 1000.0;
        double other =
            rs.compute_thread_comm_ms + rs.reduce_drain_ms + rs.cast_ms + rs.optimizer_ms;
        r.compute_ms = r.step_ms > other ? r.step_ms - other : 0;
    }
    r.done = w->step >= tr->steps;
    pcs_agent_report(w->agent, &r);
    free(recs);
    free(rp);
    if (res) {
        res->step = w->step;
        res->loss = loss;
        res->grad_norm = sr.grad_norm;
        res->skipped = sr.skipped;
        res->loss_scale = w->scale;
        res->done = r.done;
    }
    return PCS_OK;
}
