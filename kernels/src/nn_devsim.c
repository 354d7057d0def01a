/* The simulated "cuda" nn implementation (pcs_backend_simulate_cuda, tests only): every op clears the
 * poison tag of each device pointer it is given (arrays, the pointers inside the Linear / norm
 * descriptors and gradient destinations) and runs the "cpu" op on the untagged copies, so a model
 * that hands the device ops a host array fails with a message naming the op and the argument,
 * and a host dereference of a device array faults. The op runs on the context's stream when the
 * simulator runs that stream's work (ops_devsim.c). Numerics are the CPU twin's, bit for bit. */
#include <stdlib.h>

#include "kernels_internal.h"
#include "nn_internal.h"
#include "pcs/log.h"
#include "pcs/mem.h"

static const pcs_nn_ops_t *cpu_ops(void)
{
    return pcs_nn_cpu_ops();
}

/* The wrapped cpu context. */
static pcs_nn_t *inner(pcs_nn_t *nn)
{
    return nn->impl;
}

/* *out = the host address of device pointer p (NULL stays NULL), or return the error. */
#define DEV(op, what, p, out)                                                                      \
    do {                                                                                           \
        void *h_;                                                                                  \
        PCS_CHECK(pcs_devsim_arg(op, what, p, &h_));                                               \
        *(out) = h_;                                                                               \
    } while (0)

/* One queued nn op: its arguments, untagged and copied (descriptors by value). */
typedef enum {
    NN_COPY_ROUND,
    NN_ADD,
    NN_ACT_FWD,
    NN_ACT_BWD,
    NN_LIN_FWD,
    NN_LIN_BWD_P,
    NN_LIN_BWD_I,
    NN_NORM_FWD,
    NN_NORM_BWD
} nn_op_t;

typedef struct nn_task {
    nn_op_t op;
    pcs_nn_t *in;
    pcs_nn_act_t act;
    float *p[4];
    size_t n;
    pcs_dtype_t dt;
    pcs_nn_linear_t l;
    pcs_nn_norm_t nm;
    pcs_nn_grad_t gw, gb;
    int has_l, has_nm, has_gw, has_gb;
} nn_task_t;

static pcs_status_t run_nn(void *arg)
{
    nn_task_t *t = arg;
    const pcs_nn_ops_t *c = cpu_ops();
    const pcs_nn_linear_t *L = t->has_l ? &t->l : NULL;
    const pcs_nn_norm_t *P = t->has_nm ? &t->nm : NULL;
    const pcs_nn_grad_t *GW = t->has_gw ? &t->gw : NULL, *GB = t->has_gb ? &t->gb : NULL;
    float **p = t->p;
    switch (t->op) {
    case NN_COPY_ROUND:
        return c->copy_round(t->in, p[0], p[1], t->n, t->dt);
    case NN_ADD:
        return c->add(t->in, p[0], p[1], p[2], t->n, t->dt);
    case NN_ACT_FWD:
        return c->act_fwd(t->in, t->act, p[0], p[1], t->n, t->dt);
    case NN_ACT_BWD:
        return c->act_bwd(t->in, t->act, p[0], p[1], p[2], p[3], t->n);
    case NN_LIN_FWD:
        return c->linear_fwd(t->in, L, p[0], p[1]);
    case NN_LIN_BWD_P:
        return c->linear_bwd_params(t->in, L, p[0], p[1], GW, GB);
    case NN_LIN_BWD_I:
        return c->linear_bwd_input(t->in, L, p[0], p[1]);
    case NN_NORM_FWD:
        return c->norm_fwd(t->in, P, p[0], p[1]);
    case NN_NORM_BWD:
        return c->norm_bwd(t->in, P, p[0], p[1], p[2], GW, GB);
    }
    return pcs_set_error(PCS_ERR_INTERNAL, "simulated cuda nn: unknown op %d", (int)t->op);
}

static pcs_status_t new_task(pcs_nn_t *nn, nn_op_t op, nn_task_t **out)
{
    nn_task_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return pcs_set_error(PCS_ERR_NOMEM, "simulated cuda nn: out of memory");
    t->op = op;
    t->in = inner(nn);
    *out = t;
    return PCS_OK;
}

/* Queue t on the context's stream (the task is freed there, also on failure). The front door
 * (nn.c) validated the arguments when the op was called, as nn_cuda.cu's host side does before a
 * launch: bad input is an immediate status, not a sticky error at the next sync. */
static pcs_status_t submit(pcs_nn_t *nn, nn_task_t *t)
{
    return pcs_devsim_submit(nn->stream, run_nn, t);
}

/* Argument untagging into a task: on failure the task is freed and the status returned. */
#define TDEV(t, op, what, p, out)                                                                  \
    do {                                                                                           \
        void *h_;                                                                                  \
        pcs_status_t st_ = pcs_devsim_arg(op, what, p, &h_);                                       \
        if (st_ != PCS_OK) {                                                                       \
            free(t);                                                                               \
            return st_;                                                                            \
        }                                                                                          \
        *(out) = h_;                                                                               \
    } while (0)
#define TCHECK(t, call)                                                                            \
    do {                                                                                           \
        pcs_status_t st_ = (call);                                                                 \
        if (st_ != PCS_OK) {                                                                       \
            free(t);                                                                               \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

static pcs_status_t grad_in(const char *op, const char *what, const pcs_nn_grad_t *g,
                            pcs_nn_grad_t *out, const pcs_nn_grad_t **use)
{
    *use = g;
    if (g == NULL)
        return PCS_OK;
    *out = *g;
    DEV(op, what, g->data, &out->data);
    *use = out;
    return PCS_OK;
}

static pcs_status_t linear_in(const char *op, const pcs_nn_linear_t *l, pcs_nn_linear_t *out,
                              const pcs_nn_linear_t **use)
{
    *use = l;
    if (l == NULL)
        return PCS_OK;
    *out = *l;
    DEV(op, "weight", l->weight, &out->weight);
    DEV(op, "bias", l->bias, &out->bias);
    DEV(op, "saved", l->saved, &out->saved);
    *use = out;
    return PCS_OK;
}

static pcs_status_t norm_in(const char *op, const pcs_nn_norm_t *p, pcs_nn_norm_t *out,
                            const pcs_nn_norm_t **use)
{
    *use = p;
    if (p == NULL)
        return PCS_OK;
    *out = *p;
    DEV(op, "weight", p->weight, &out->weight);
    DEV(op, "bias", p->bias, &out->bias);
    DEV(op, "save", p->save, &out->save);
    DEV(op, "running_mean", p->running_mean, &out->running_mean);
    DEV(op, "running_var", p->running_var, &out->running_var);
    DEV(op, "num_batches_tracked", p->num_batches_tracked, &out->num_batches_tracked);
    *use = out;
    return PCS_OK;
}

// ---- context ----

static void ds_destroy(pcs_nn_t *nn)
{
    if (!nn)
        return;
    pcs_nn_destroy(nn->impl);
    free(nn);
}

static pcs_status_t ds_create(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out)
{
    if (!out || !pcs_backend_is_simulated(be))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn simulated cuda create: needs the simulated cuda backend (got %s)",
                             be ? be->name : "NULL");
    *out = NULL;
    pcs_nn_t *nn = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *nn, (void **)&nn));
    pcs_nn_t *in = NULL;
    pcs_status_t rc = cpu_ops()->create(pcs_backend_cpu(), s, &in);
    if (rc != PCS_OK) {
        free(nn);
        return rc;
    }
    nn->ops = pcs_nn_devsim_ops();
    nn->be = be;
    nn->stream = s;
    nn->impl = in;
    *out = nn;
    return PCS_OK;
}

// ---- element-wise ----

static pcs_status_t ds_copy_round(pcs_nn_t *nn, float *dst, const float *src, size_t n,
                                  pcs_dtype_t dt)
{
    const char *op = "copy_round";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_COPY_ROUND, &t));
    TDEV(t, op, "dst", dst, &t->p[0]);
    TDEV(t, op, "src", src, &t->p[1]);
    t->n = n;
    t->dt = dt;
    return submit(nn, t);
}

static pcs_status_t ds_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                           pcs_dtype_t dt)
{
    const char *op = "add";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_ADD, &t));
    TDEV(t, op, "y", y, &t->p[0]);
    TDEV(t, op, "a", a, &t->p[1]);
    TDEV(t, op, "b", b, &t->p[2]);
    t->n = n;
    t->dt = dt;
    return submit(nn, t);
}

static pcs_status_t ds_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                               pcs_dtype_t dt)
{
    const char *op = "act_fwd";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_ACT_FWD, &t));
    TDEV(t, op, "y", y, &t->p[0]);
    TDEV(t, op, "x", x, &t->p[1]);
    t->act = act;
    t->n = n;
    t->dt = dt;
    return submit(nn, t);
}

static pcs_status_t ds_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x,
                               const float *y, const float *dy, size_t n)
{
    const char *op = "act_bwd";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_ACT_BWD, &t));
    TDEV(t, op, "dx", dx, &t->p[0]);
    TDEV(t, op, "x", x, &t->p[1]);
    TDEV(t, op, "y", y, &t->p[2]);
    TDEV(t, op, "dy", dy, &t->p[3]);
    t->act = act;
    t->n = n;
    return submit(nn, t);
}

// ---- Linear ----

static pcs_status_t ds_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y)
{
    const char *op = "linear_fwd";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_LIN_FWD, &t));
    const pcs_nn_linear_t *L;
    TCHECK(t, linear_in(op, l, &t->l, &L));
    t->has_l = L != NULL;
    TDEV(t, op, "x", x, &t->p[0]);
    TDEV(t, op, "y", y, &t->p[1]);
    return submit(nn, t);
}

static pcs_status_t ds_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                         const float *x, const pcs_nn_grad_t *dw,
                                         const pcs_nn_grad_t *db)
{
    const char *op = "linear_bwd_params";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_LIN_BWD_P, &t));
    const pcs_nn_linear_t *L;
    const pcs_nn_grad_t *GW, *GB;
    TCHECK(t, linear_in(op, l, &t->l, &L));
    TCHECK(t, grad_in(op, "dweight", dw, &t->gw, &GW));
    TCHECK(t, grad_in(op, "dbias", db, &t->gb, &GB));
    t->has_l = L != NULL;
    t->has_gw = GW != NULL;
    t->has_gb = GB != NULL;
    TDEV(t, op, "dy", dy, &t->p[0]);
    TDEV(t, op, "x", x, &t->p[1]);
    return submit(nn, t);
}

static pcs_status_t ds_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                        float *dx)
{
    const char *op = "linear_bwd_input";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_LIN_BWD_I, &t));
    const pcs_nn_linear_t *L;
    TCHECK(t, linear_in(op, l, &t->l, &L));
    t->has_l = L != NULL;
    TDEV(t, op, "dy", dy, &t->p[0]);
    TDEV(t, op, "dx", dx, &t->p[1]);
    return submit(nn, t);
}

// ---- LayerNorm / BatchNorm1d ----

static pcs_status_t ds_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y)
{
    const char *op = "norm_fwd";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_NORM_FWD, &t));
    const pcs_nn_norm_t *P;
    TCHECK(t, norm_in(op, p, &t->nm, &P));
    t->has_nm = P != NULL;
    TDEV(t, op, "x", x, &t->p[0]);
    TDEV(t, op, "y", y, &t->p[1]);
    return submit(nn, t);
}

static pcs_status_t ds_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x,
                                const float *dy, float *dx, const pcs_nn_grad_t *dw,
                                const pcs_nn_grad_t *db)
{
    const char *op = "norm_bwd";
    nn_task_t *t = NULL;
    PCS_CHECK(new_task(nn, NN_NORM_BWD, &t));
    const pcs_nn_norm_t *P;
    const pcs_nn_grad_t *GW, *GB;
    TCHECK(t, norm_in(op, p, &t->nm, &P));
    TCHECK(t, grad_in(op, "dweight", dw, &t->gw, &GW));
    TCHECK(t, grad_in(op, "dbias", db, &t->gb, &GB));
    t->has_nm = P != NULL;
    t->has_gw = GW != NULL;
    t->has_gb = GB != NULL;
    TDEV(t, op, "x", x, &t->p[0]);
    TDEV(t, op, "dy", dy, &t->p[1]);
    TDEV(t, op, "dx", dx, &t->p[2]);
    return submit(nn, t);
}

static const pcs_nn_ops_t k_devsim_ops = {
    .name = "cuda",
    .create = ds_create,
    .destroy = ds_destroy,
    .copy_round = ds_copy_round,
    .add = ds_add,
    .act_fwd = ds_act_fwd,
    .act_bwd = ds_act_bwd,
    .linear_fwd = ds_linear_fwd,
    .linear_bwd_params = ds_linear_bwd_params,
    .linear_bwd_input = ds_linear_bwd_input,
    .norm_fwd = ds_norm_fwd,
    .norm_bwd = ds_norm_bwd,
};

const pcs_nn_ops_t *pcs_nn_devsim_ops(void)
{
    return &k_devsim_ops;
}
