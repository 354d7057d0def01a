/* The simulated "cuda" nn implementation (PCS_SIMULATE_CUDA=1, tests only): every op clears the
 * poison tag of each device pointer it is given (arrays, the pointers inside the Linear / norm
 * descriptors and gradient destinations) and runs the "cpu" op on the untagged copies, so a model
 * that hands the device ops a host array fails with a message naming the op and the argument,
 * and a host dereference of a device array faults. Numerics are the CPU twin's, bit for bit. */
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

/* Checks the context, and runs the copies deferred on its stream: the op comes after them. */
static pcs_status_t ctx(const char *op, pcs_nn_t *nn)
{
    PCS_CHECK(pcs_nn_check_ctx(op, nn));
    pcs_devsim_stream_flush(nn->stream);
    return PCS_OK;
}

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
    PCS_CHECK(ctx(op, nn));
    float *d, *x;
    DEV(op, "dst", dst, &d);
    DEV(op, "src", src, &x);
    return cpu_ops()->copy_round(inner(nn), d, x, n, dt);
}

static pcs_status_t ds_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                           pcs_dtype_t dt)
{
    const char *op = "add";
    PCS_CHECK(ctx(op, nn));
    float *Y, *A, *B;
    DEV(op, "y", y, &Y);
    DEV(op, "a", a, &A);
    DEV(op, "b", b, &B);
    return cpu_ops()->add(inner(nn), Y, A, B, n, dt);
}

static pcs_status_t ds_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                               pcs_dtype_t dt)
{
    const char *op = "act_fwd";
    PCS_CHECK(ctx(op, nn));
    float *Y, *X;
    DEV(op, "y", y, &Y);
    DEV(op, "x", x, &X);
    return cpu_ops()->act_fwd(inner(nn), act, Y, X, n, dt);
}

static pcs_status_t ds_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x,
                               const float *y, const float *dy, size_t n)
{
    const char *op = "act_bwd";
    PCS_CHECK(ctx(op, nn));
    float *DX, *X, *Y, *DY;
    DEV(op, "dx", dx, &DX);
    DEV(op, "x", x, &X);
    DEV(op, "y", y, &Y);
    DEV(op, "dy", dy, &DY);
    return cpu_ops()->act_bwd(inner(nn), act, DX, X, Y, DY, n);
}

// ---- Linear ----

static pcs_status_t ds_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y)
{
    const char *op = "linear_fwd";
    PCS_CHECK(ctx(op, nn));
    pcs_nn_linear_t lc;
    const pcs_nn_linear_t *L;
    PCS_CHECK(linear_in(op, l, &lc, &L));
    float *X, *Y;
    DEV(op, "x", x, &X);
    DEV(op, "y", y, &Y);
    return cpu_ops()->linear_fwd(inner(nn), L, X, Y);
}

static pcs_status_t ds_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                         const float *x, const pcs_nn_grad_t *dw,
                                         const pcs_nn_grad_t *db)
{
    const char *op = "linear_bwd_params";
    PCS_CHECK(ctx(op, nn));
    pcs_nn_linear_t lc;
    const pcs_nn_linear_t *L;
    PCS_CHECK(linear_in(op, l, &lc, &L));
    pcs_nn_grad_t gw, gb;
    const pcs_nn_grad_t *GW, *GB;
    PCS_CHECK(grad_in(op, "dweight", dw, &gw, &GW));
    PCS_CHECK(grad_in(op, "dbias", db, &gb, &GB));
    float *DY, *X;
    DEV(op, "dy", dy, &DY);
    DEV(op, "x", x, &X);
    return cpu_ops()->linear_bwd_params(inner(nn), L, DY, X, GW, GB);
}

static pcs_status_t ds_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                        float *dx)
{
    const char *op = "linear_bwd_input";
    PCS_CHECK(ctx(op, nn));
    pcs_nn_linear_t lc;
    const pcs_nn_linear_t *L;
    PCS_CHECK(linear_in(op, l, &lc, &L));
    float *DY, *DX;
    DEV(op, "dy", dy, &DY);
    DEV(op, "dx", dx, &DX);
    return cpu_ops()->linear_bwd_input(inner(nn), L, DY, DX);
}

// ---- LayerNorm / BatchNorm1d ----

static pcs_status_t ds_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y)
{
    const char *op = "norm_fwd";
    PCS_CHECK(ctx(op, nn));
    pcs_nn_norm_t pc;
    const pcs_nn_norm_t *P;
    PCS_CHECK(norm_in(op, p, &pc, &P));
    float *X, *Y;
    DEV(op, "x", x, &X);
    DEV(op, "y", y, &Y);
    return cpu_ops()->norm_fwd(inner(nn), P, X, Y);
}

static pcs_status_t ds_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x,
                                const float *dy, float *dx, const pcs_nn_grad_t *dw,
                                const pcs_nn_grad_t *db)
{
    const char *op = "norm_bwd";
    PCS_CHECK(ctx(op, nn));
    pcs_nn_norm_t pc;
    const pcs_nn_norm_t *P;
    PCS_CHECK(norm_in(op, p, &pc, &P));
    pcs_nn_grad_t gw, gb;
    const pcs_nn_grad_t *GW, *GB;
    PCS_CHECK(grad_in(op, "dweight", dw, &gw, &GW));
    PCS_CHECK(grad_in(op, "dbias", db, &gb, &GB));
    float *X, *DY, *DX;
    DEV(op, "x", x, &X);
    DEV(op, "dy", dy, &DY);
    DEV(op, "dx", dx, &DX);
    return cpu_ops()->norm_bwd(inner(nn), P, X, DY, DX, GW, GB);
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
