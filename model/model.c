/* Built-in MLP forward/backward with PyTorch-like mixed precision (no autocast). This file keeps
 * the module tree, bindings, FSDP casts, the op tape and the hooks; every numeric operation goes
 * through the pcs/nn.h vtable: "cpu" (host arrays, OpenBLAS; kernels/src/nn_cpu.c, the reference
 * twin) or "cuda" (device arrays, cuBLAS + CUDA kernels; kernels/src/nn_cuda.cu). model.c never
 * dereferences a bound buffer or an activation: on cuda they are device pointers.
 * - Storage: activations and their gradients live in fp32 arrays tagged with a dtype; a tensor
 *   tagged bf16/fp16 only ever holds values exactly representable in that dtype (every op rounds
 *   its result), so the values are bit-identical to bf16/fp16 storage while sgemm reads them
 *   directly. Parameters arrive as real bf16/fp16/fp32 buffers (uint16 storage, common half.h).
 * - Linear: fp32 accumulation, bias added in fp32 and the result rounded once to the compute
 *   dtype (cuBLASLt's bias epilogue). Backward: dX, dW by GEMM, db summed in fp32, each rounded
 *   once to its dtype.
 * - Elementwise ops (GELU, residual add) compute in fp32 from the low-precision inputs and round
 *   the result (PyTorch's opmath); ReLU is exact. GELU is the exact erf form.
 * - LayerNorm statistics summed in fp32 (two-pass, PyTorch's precision), BatchNorm's accumulated
 *   in double, output rounded to the input dtype; parameters may be fp32 under a low-precision input (PyTorch's mixed-type norm kernels).
 *   BatchNorm: biased batch variance for normalisation, unbiased for running_var, momentum 0.1,
 *   eps 1e-5, running stats updated in fp32 and stored in the buffer's dtype.
 * - Linear requires input dtype == weight dtype (else "mat1 and mat2 must have the same dtype", as
 *   PyTorch); FSDP input/output casts are explicit per-module casts (pcs_mlp_set_cast).
 * - Autograd semantics: a tensor used twice (residual input) sums its gradient contributions in
 *   its own dtype; a cast's gradient is cast back to the source dtype.
 * Buffers (slots, saved statistics, scratch) are allocated in the backend's memory on the first
 * pass (stream-ordered, alloc_async on the model's stream) and reused, so steady-state passes do
 * not allocate. Backward reads a Linear's weight from its binding again (the values autograd
 * saved: parameters do not change between forward and backward) instead of keeping a copy of
 * every low-precision weight from forward to backward, which cost 4 bytes per weight element of
 * the whole model; the cpu twin converts a bounded block at a time. Parameters must be bound
 * during backward, as FSDP re-gathers a unit in its pre-backward hook. */
#include "model/model.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/nn.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"

typedef struct {
    const void *data;
    pcs_dtype_t dtype;
    void *grad;
    pcs_dtype_t grad_dtype;
    int grad_acc; /* backward adds into grad (pcs_mlp_bind_grad_mode) */
} binding_t;

typedef struct {
    void *data;
    pcs_dtype_t dtype;
} bufbind_t;

typedef struct {
    float *v; /* values (owned unless slot 0), backend memory */
    size_t cap;
    float *g; /* gradient, backend memory */
    size_t gcap;
    int gvalid;
    pcs_dtype_t dtype;
    uint32_t width;
} slot_t;

typedef enum {
    OP_ENTER,
    OP_EXIT,
    OP_CAST,
    OP_LINEAR,
    OP_LN,
    OP_BN,
    OP_RELU,
    OP_GELU,
    OP_ADD
} op_kind_t;

typedef struct {
    op_kind_t kind;
    uint32_t module;
    int in, in2, out;
    pcs_dtype_t wdt; /* Linear: the weight dtype forward used (backward's binding must match) */
    float *save;     /* backend memory. LN: mean, rstd per row; BN: mean, invstd per feature */
    size_t save_cap;
} op_t;

struct pcs_mlp {
    pcs_mlp_config_t cfg;
    uint32_t *hidden;
    uint32_t max_rows;
    const pcs_backend_ops_t *be; /* memory of slots and scratch */
    pcs_nn_t *nn;                /* numerics, on be's stream */
    pcs_mlp_module_t *mods;
    uint32_t n_mods;
    pcs_named_tensor_t *params;
    uint32_t *param_mod;
    uint32_t n_params;
    pcs_named_tensor_t *bufs;
    uint32_t n_bufs;
    char **names; /* all strings owned here */
    size_t n_names, cap_names;
    binding_t *pb;
    bufbind_t *bb;
    pcs_dtype_t *cast_in, *cast_out;
    /* pass state */
    slot_t *slots;
    size_t n_slots, cap_slots;
    op_t *ops_tape;
    size_t n_ops, cap_ops;
    uint32_t rows;
    int trained;      /* last forward was a training forward */
    int out_slot;     /* slot of the last forward's output */
    int want_in_grad; /* backward also computes the gradient of slot 0 (stage input) */
    int defer_w;      /* this backward leaves the parameter gradients to backward_weights */
    int w_pending;    /* a backward_input_only ran; its parameter gradients are not written */
    /* scratch, backend memory */
    float *tmp; /* gradient contribution */
    size_t tmp_cap;
};

// ---- numeric helpers ----

void pcs_round_to(float *v, size_t n, pcs_dtype_t dtype)
{
    pcs_nn_host_round(v, n, dtype);
}

void pcs_to_f32(const void *src, pcs_dtype_t src_dtype, size_t n, float *dst)
{
    pcs_nn_host_to_f32(src, src_dtype, n, dst);
}

void pcs_from_f32(const float *src, size_t n, pcs_dtype_t dst_dtype, void *dst)
{
    pcs_nn_host_from_f32(src, n, dst_dtype, dst);
}

static int is_compute_dtype(pcs_dtype_t t)
{
    return t == PCS_DTYPE_FP32 || t == PCS_DTYPE_BF16 || t == PCS_DTYPE_FP16;
}

/* PyTorch type promotion among fp32/bf16/fp16. */
static pcs_dtype_t promote(pcs_dtype_t a, pcs_dtype_t b)
{
    if (a == b)
        return a;
    return PCS_DTYPE_FP32;
}

/* Grow a backend buffer to n floats. Contents are not kept (every user rewrites it). Buffers are
 * allocated during a pass, while other threads' collectives may run (the runtime's NCCL kernels
 * waiting for peers): stream-ordered on the model's stream, because cudaMalloc/cudaFree may
 * synchronize the device and hang such a job. The old buffer is freed in stream order too, after
 * the work already queued that may still read it; every user of these buffers runs on this stream
 * (a consumer elsewhere orders itself after the model's work, hence after the allocation). */
static pcs_status_t ensure(pcs_mlp_t *m, float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return PCS_OK;
    pcs_stream_t st = pcs_nn_stream(m->nn);
    if (*p) {
        m->be->free_async(*p, st);
        *p = NULL;
        *cap = 0;
    }
    void *q = NULL;
    pcs_status_t rc = m->be->alloc_async(n * sizeof(float), st, &q);
    if (rc != PCS_OK)
        return pcs_set_error(rc, "mlp: cannot allocate %zu floats on %s", n, m->be->name);
    *p = q;
    *cap = n;
    return PCS_OK;
}

int pcs_mlp_blas_threads(int n)
{
    if (n > 0)
        openblas_set_num_threads(n);
    return openblas_get_num_threads();
}

// ---- construction ----

static pcs_status_t keep_name(pcs_mlp_t *m, char *s, const char **out)
{
    pcs_status_t rc = pcs_grow((void **)&m->names, &m->cap_names, m->n_names + 1, sizeof(char *));
    if (rc != PCS_OK) {
        free(s);
        return rc;
    }
    m->names[m->n_names++] = s;
    *out = s;
    return PCS_OK;
}

static pcs_status_t fmt_name(pcs_mlp_t *m, const char **out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static pcs_status_t fmt_name(pcs_mlp_t *m, const char **out, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = NULL;
    PCS_CHECK(pcs_strdup(buf, &s));
    return keep_name(m, s, out);
}

static pcs_status_t add_module(pcs_mlp_t *m, const char *path, const char *cls, pcs_mod_kind_t kind,
                               int parent, uint32_t in, uint32_t out, uint32_t *idx)
{
    pcs_mlp_module_t *md = &m->mods[m->n_mods];
    memset(md, 0, sizeof *md);
    PCS_CHECK(fmt_name(m, &md->path, "%s", path));
    md->cls = cls;
    md->kind = kind;
    md->parent = parent;
    md->in_dim = in;
    md->out_dim = out;
    md->first_param = m->n_params;
    md->first_buffer = m->n_bufs;
    *idx = m->n_mods++;
    return PCS_OK;
}

static pcs_status_t add_tensor(pcs_mlp_t *m, uint32_t mod, int is_buffer, const char *name,
                               pcs_dtype_t dtype, uint32_t ndim, uint64_t d0, uint64_t d1)
{
    pcs_mlp_module_t *md = &m->mods[mod];
    pcs_named_tensor_t *t = is_buffer ? &m->bufs[m->n_bufs] : &m->params[m->n_params];
    memset(t, 0, sizeof *t);
    PCS_CHECK(fmt_name(m, &t->fqn, "%s.%s", md->path, name));
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = ndim == 0 ? 1 : ndim == 1 ? d0 : d0 * d1;
    t->is_buffer = is_buffer;
    if (is_buffer) {
        m->n_bufs++;
        md->n_buffers++;
    } else {
        m->param_mod[m->n_params] = mod;
        m->n_params++;
        md->n_params++;
    }
    return PCS_OK;
}

pcs_status_t pcs_mlp_config_from_proto(const struct Pcs__V1__MlpModel *spec, pcs_mlp_config_t *cfg)
{
    if (!spec || !cfg)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "model.mlp: missing");
    memset(cfg, 0, sizeof *cfg);
    cfg->input_dim = spec->input_dim;
    cfg->output_dim = spec->output_dim;
    cfg->n_hidden = (uint32_t)spec->n_hidden_dims;
    cfg->hidden_dims = spec->hidden_dims;
    cfg->act =
        spec->activation == PCS__V1__ACTIVATION__ACTIVATION_GELU ? PCS_ACT_GELU : PCS_ACT_RELU;
    switch (spec->norm) {
    case PCS__V1__NORM__NORM_LAYERNORM:
        cfg->norm = PCS_NORM_LAYERNORM;
        break;
    case PCS__V1__NORM__NORM_BATCHNORM:
        cfg->norm = PCS_NORM_BATCHNORM;
        break;
    default:
        cfg->norm = PCS_NORM_NONE;
        break;
    }
    cfg->bias = spec->bias ? spec->bias->value : 1;
    cfg->residual = spec->residual;
    if (cfg->input_dim == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "model.mlp.input_dim: must be > 0");
    if (cfg->output_dim == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "model.mlp.output_dim: must be > 0");
    for (uint32_t i = 0; i < cfg->n_hidden; i++)
        if (cfg->hidden_dims[i] == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "model.mlp.hidden_dims[%u]: must be > 0", i);
    return PCS_OK;
}

pcs_status_t pcs_mlp_create(const pcs_mlp_config_t *cfg, uint32_t max_rows, pcs_mlp_t **out)
{
    return pcs_mlp_create_on(cfg, max_rows, NULL, NULL, out);
}

pcs_status_t pcs_mlp_create_on(const pcs_mlp_config_t *cfg, uint32_t max_rows,
                               const pcs_backend_ops_t *be, pcs_stream_t stream, pcs_mlp_t **out)
{
    pcs_status_t rc;
    pcs_mlp_t *m = NULL;
    if (!cfg || !out || cfg->input_dim == 0 || cfg->output_dim == 0 || max_rows == 0 ||
        (cfg->n_hidden && !cfg->hidden_dims))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_create: bad config");
    for (uint32_t i = 0; i < cfg->n_hidden; i++)
        if (cfg->hidden_dims[i] == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_create: hidden_dims[%u] = 0", i);
    *out = NULL;
    if (!be)
        PCS_CHECK(pcs_backend_get("cpu", &be));
    PCS_CHECK(pcs_calloc(1, sizeof *m, (void **)&m));
    m->be = be;
    PCS_CHECK_GOTO(pcs_nn_create(be, stream, &m->nn), rc, fail);
    m->cfg = *cfg;
    m->max_rows = max_rows;
    uint32_t nh = cfg->n_hidden;
    uint32_t max_mods = 3 + 4 * nh, max_params = 2 + 4 * nh, max_bufs = 3 * nh + 1;
    PCS_CHECK_GOTO(pcs_calloc(nh + 1, sizeof(uint32_t), (void **)&m->hidden), rc, fail);
    if (nh)
        memcpy(m->hidden, cfg->hidden_dims, nh * sizeof(uint32_t));
    m->cfg.hidden_dims = m->hidden;
    PCS_CHECK_GOTO(pcs_calloc(max_mods, sizeof *m->mods, (void **)&m->mods), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_params, sizeof *m->params, (void **)&m->params), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_params, sizeof *m->param_mod, (void **)&m->param_mod), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_bufs, sizeof *m->bufs, (void **)&m->bufs), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_mods, sizeof *m->cast_in, (void **)&m->cast_in), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_mods, sizeof *m->cast_out, (void **)&m->cast_out), rc, fail);

    uint32_t root, list, idx;
    PCS_CHECK_GOTO(
        add_module(m, "", "MLP", PCS_MOD_MLP, -1, cfg->input_dim, cfg->output_dim, &root), rc,
        fail);
    PCS_CHECK_GOTO(add_module(m, "layers", "ModuleList", PCS_MOD_LIST, (int)root, 0, 0, &list), rc,
                   fail);
    uint32_t in = cfg->input_dim;
    char path[96];
    for (uint32_t i = 0; i < nh; i++) {
        uint32_t o = cfg->hidden_dims[i], blk;
        snprintf(path, sizeof path, "layers.%u", i);
        PCS_CHECK_GOTO(add_module(m, path, "MLPBlock", PCS_MOD_BLOCK, (int)list, in, o, &blk), rc,
                       fail);
        snprintf(path, sizeof path, "layers.%u.linear", i);
        PCS_CHECK_GOTO(add_module(m, path, "Linear", PCS_MOD_LINEAR, (int)blk, in, o, &idx), rc,
                       fail);
        PCS_CHECK_GOTO(add_tensor(m, idx, 0, "weight", PCS_DTYPE_FP32, 2, o, in), rc, fail);
        if (cfg->bias)
            PCS_CHECK_GOTO(add_tensor(m, idx, 0, "bias", PCS_DTYPE_FP32, 1, o, 0), rc, fail);
        if (cfg->norm == PCS_NORM_LAYERNORM || cfg->norm == PCS_NORM_BATCHNORM) {
            int bn = cfg->norm == PCS_NORM_BATCHNORM;
            snprintf(path, sizeof path, "layers.%u.norm", i);
            PCS_CHECK_GOTO(add_module(m, path, bn ? "BatchNorm1d" : "LayerNorm",
                                      bn ? PCS_MOD_BATCHNORM : PCS_MOD_LAYERNORM, (int)blk, o, o,
                                      &idx),
                           rc, fail);
            PCS_CHECK_GOTO(add_tensor(m, idx, 0, "weight", PCS_DTYPE_FP32, 1, o, 0), rc, fail);
            PCS_CHECK_GOTO(add_tensor(m, idx, 0, "bias", PCS_DTYPE_FP32, 1, o, 0), rc, fail);
            if (bn) {
                PCS_CHECK_GOTO(add_tensor(m, idx, 1, "running_mean", PCS_DTYPE_FP32, 1, o, 0), rc,
                               fail);
                PCS_CHECK_GOTO(add_tensor(m, idx, 1, "running_var", PCS_DTYPE_FP32, 1, o, 0), rc,
                               fail);
                PCS_CHECK_GOTO(
                    add_tensor(m, idx, 1, "num_batches_tracked", PCS_DTYPE_INT64, 0, 0, 0), rc,
                    fail);
            }
        }
        snprintf(path, sizeof path, "layers.%u.act", i);
        int gelu = cfg->act == PCS_ACT_GELU;
        PCS_CHECK_GOTO(add_module(m, path, gelu ? "GELU" : "ReLU",
                                  gelu ? PCS_MOD_GELU : PCS_MOD_RELU, (int)blk, o, o, &idx),
                       rc, fail);
        in = o;
    }
    PCS_CHECK_GOTO(
        add_module(m, "head", "Linear", PCS_MOD_LINEAR, (int)root, in, cfg->output_dim, &idx), rc,
        fail);
    PCS_CHECK_GOTO(add_tensor(m, idx, 0, "weight", PCS_DTYPE_FP32, 2, cfg->output_dim, in), rc,
                   fail);
    if (cfg->bias)
        PCS_CHECK_GOTO(add_tensor(m, idx, 0, "bias", PCS_DTYPE_FP32, 1, cfg->output_dim, 0), rc,
                       fail);
    PCS_CHECK_GOTO(pcs_calloc(m->n_params, sizeof *m->pb, (void **)&m->pb), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(m->n_bufs ? m->n_bufs : 1, sizeof *m->bb, (void **)&m->bb), rc, fail);
    *out = m;
    return PCS_OK;
fail:
    pcs_mlp_destroy(m);
    return rc;
}

void pcs_mlp_destroy(pcs_mlp_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_names; i++)
        free(m->names[i]);
    free(m->names);
    /* The buffers came from alloc_async on the model's stream: freed in stream order there (after
     * the queued work that may still use them, with no device-wide synchronization that could
     * stall on another thread's collective), then one sync so they are back in the pool and no
     * queued work of this model outlives it. */
    pcs_stream_t st = m->nn ? pcs_nn_stream(m->nn) : NULL;
    for (size_t i = 1; i < m->cap_slots; i++) {
        m->be->free_async(m->slots[i].v, st);
        m->be->free_async(m->slots[i].g, st);
    }
    if (m->cap_slots)
        m->be->free_async(m->slots[0].g, st);
    free(m->slots);
    for (size_t i = 0; i < m->cap_ops; i++)
        m->be->free_async(m->ops_tape[i].save, st);
    free(m->ops_tape);
    if (m->be) {
        m->be->free_async(m->tmp, st);
        if (m->nn)
            (void)m->be->sync(st);
    }
    pcs_nn_destroy(m->nn);
    free(m->pb);
    free(m->bb);
    free(m->cast_in);
    free(m->cast_out);
    free(m->mods);
    free(m->params);
    free(m->param_mod);
    free(m->bufs);
    free(m->hidden);
    free(m);
}

const pcs_backend_ops_t *pcs_mlp_backend(const pcs_mlp_t *m)
{
    return m ? m->be : NULL;
}

// ---- queries ----

uint32_t pcs_mlp_num_modules(const pcs_mlp_t *m)
{
    return m->n_mods;
}

const pcs_mlp_module_t *pcs_mlp_module(const pcs_mlp_t *m, uint32_t i)
{
    return i < m->n_mods ? &m->mods[i] : NULL;
}

uint32_t pcs_mlp_num_params(const pcs_mlp_t *m)
{
    return m->n_params;
}

const pcs_named_tensor_t *pcs_mlp_param(const pcs_mlp_t *m, uint32_t i)
{
    return i < m->n_params ? &m->params[i] : NULL;
}

uint32_t pcs_mlp_num_buffers(const pcs_mlp_t *m)
{
    return m->n_bufs;
}

const pcs_named_tensor_t *pcs_mlp_buffer(const pcs_mlp_t *m, uint32_t i)
{
    return i < m->n_bufs ? &m->bufs[i] : NULL;
}

int pcs_mlp_find_param(const pcs_mlp_t *m, const char *fqn)
{
    for (uint32_t i = 0; fqn && i < m->n_params; i++)
        if (strcmp(m->params[i].fqn, fqn) == 0)
            return (int)i;
    return -1;
}

int pcs_mlp_find_buffer(const pcs_mlp_t *m, const char *fqn)
{
    for (uint32_t i = 0; fqn && i < m->n_bufs; i++)
        if (strcmp(m->bufs[i].fqn, fqn) == 0)
            return (int)i;
    return -1;
}

int pcs_mlp_find_module(const pcs_mlp_t *m, const char *path)
{
    for (uint32_t i = 0; path && i < m->n_mods; i++)
        if (strcmp(m->mods[i].path, path) == 0)
            return (int)i;
    return -1;
}

uint32_t pcs_mlp_param_module(const pcs_mlp_t *m, uint32_t i)
{
    return i < m->n_params ? m->param_mod[i] : 0;
}

uint64_t pcs_mlp_total_params(const pcs_mlp_t *m)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->n_params; i++)
        n += m->params[i].numel;
    return n;
}

pcs_status_t pcs_mlp_init_tensor(const pcs_mlp_t *m, uint64_t seed, int is_buffer, uint32_t i,
                                 uint64_t first, uint64_t n, float *out)
{
    const pcs_named_tensor_t *t = is_buffer ? pcs_mlp_buffer(m, i) : pcs_mlp_param(m, i);
    if (!t || first > t->numel || n > t->numel - first || (!out && n))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_init_tensor: bad tensor or range");
    if (is_buffer) {
        float v = strstr(t->fqn, "running_var") ? 1.0f : 0.0f;
        for (uint64_t k = 0; k < n; k++)
            out[k] = v;
        return PCS_OK;
    }
    const pcs_mlp_module_t *md = &m->mods[m->param_mod[i]];
    if (md->kind == PCS_MOD_LINEAR) {
        float bound = 1.0f / sqrtf((float)md->in_dim);
        pcs_init_uniform(seed, t->fqn, -bound, bound, first, n, out);
    } else {
        int is_weight = i == md->first_param;
        for (uint64_t k = 0; k < n; k++)
            out[k] = is_weight ? 1.0f : 0.0f;
    }
    return PCS_OK;
}

// ---- binding ----

pcs_status_t pcs_mlp_bind_param(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, const void *data)
{
    if (!m || i >= m->n_params || (data && !is_compute_dtype(dtype)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_bind_param: bad index %u or dtype %s", i,
                             pcs_dtype_name(dtype));
    m->pb[i].data = data;
    m->pb[i].dtype = dtype;
    return PCS_OK;
}

pcs_status_t pcs_mlp_bind_grad_mode(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data,
                                    int accumulate)
{
    if (!m || i >= m->n_params ||
        (data && !is_compute_dtype(dtype) && (dtype != PCS_DTYPE_FP64 || accumulate)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_bind_grad: bad index %u or dtype %s%s",
                             i, pcs_dtype_name(dtype), accumulate ? " (accumulating)" : "");
    m->pb[i].grad = data;
    m->pb[i].grad_dtype = dtype;
    m->pb[i].grad_acc = accumulate != 0;
    return PCS_OK;
}

pcs_status_t pcs_mlp_bind_grad(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data)
{
    return pcs_mlp_bind_grad_mode(m, i, dtype, data, 0);
}

pcs_status_t pcs_mlp_bind_buffer(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data)
{
    if (!m || i >= m->n_bufs)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_bind_buffer: bad index %u", i);
    int is_count = m->bufs[i].dtype == PCS_DTYPE_INT64;
    if (data && (is_count ? dtype != PCS_DTYPE_INT64 : !is_compute_dtype(dtype)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "buffer %s: cannot bind dtype %s", m->bufs[i].fqn,
                             pcs_dtype_name(dtype));
    m->bb[i].data = data;
    m->bb[i].dtype = dtype;
    return PCS_OK;
}

void pcs_mlp_unbind_all(pcs_mlp_t *m)
{
    if (!m)
        return;
    memset(m->pb, 0, m->n_params * sizeof *m->pb);
    memset(m->bb, 0, (m->n_bufs ? m->n_bufs : 1) * sizeof *m->bb);
}

pcs_status_t pcs_mlp_set_cast(pcs_mlp_t *m, uint32_t mod, pcs_dtype_t input_dtype,
                              pcs_dtype_t output_dtype)
{
    if (!m || mod >= m->n_mods ||
        (input_dtype != PCS_DTYPE_NONE && !is_compute_dtype(input_dtype)) ||
        (output_dtype != PCS_DTYPE_NONE && !is_compute_dtype(output_dtype)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_set_cast: bad module %u or dtype", mod);
    m->cast_in[mod] = input_dtype;
    m->cast_out[mod] = output_dtype;
    return PCS_OK;
}

pcs_status_t pcs_mlp_bind_unit(pcs_mlp_t *m, const struct Pcs__V1__Unit *u, pcs_dtype_t dtype,
                               const void *flat, pcs_dtype_t grad_dtype, void *grad_flat,
                               uint64_t flat_numel)
{
    if (!m || !u || !flat || !is_compute_dtype(dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_bind_unit: bad argument");
    size_t es = pcs_dtype_size(dtype), gs = grad_flat ? pcs_dtype_size(grad_dtype) : 0;
    for (size_t j = 0; j < u->n_params; j++) {
        const Pcs__V1__ParamSlot *ps = u->params[j];
        int p = pcs_mlp_find_param(m, ps->fqn);
        if (p < 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "unit %s: %s is not a parameter of the "
                                 "model",
                                 u->path, ps->fqn);
        uint64_t numel = m->params[p].numel;
        if ((ps->numel && ps->numel != numel) || ps->offset > flat_numel ||
            numel > flat_numel - ps->offset)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "unit %s: parameter %s (numel %llu at "
                                 "offset %llu) does not fit the model or the %llu-element buffer",
                                 u->path, ps->fqn, (unsigned long long)numel,
                                 (unsigned long long)ps->offset, (unsigned long long)flat_numel);
        PCS_CHECK(pcs_mlp_bind_param(m, (uint32_t)p, dtype, (const char *)flat + ps->offset * es));
        PCS_CHECK(pcs_mlp_bind_grad(m, (uint32_t)p, grad_dtype,
                                    grad_flat ? (char *)grad_flat + ps->offset * gs : NULL));
    }
    return PCS_OK;
}

pcs_status_t pcs_mlp_apply_plan_casts(pcs_mlp_t *m, const struct Pcs__V1__Plan *plan)
{
    if (!m || !plan)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_apply_plan_casts: NULL argument");
    memset(m->cast_in, 0, m->n_mods * sizeof *m->cast_in);
    memset(m->cast_out, 0, m->n_mods * sizeof *m->cast_out);
    for (size_t k = 0; k < plan->n_units; k++) {
        const Pcs__V1__Unit *u = plan->units[k];
        int mod = pcs_mlp_find_module(m, u->path);
        if (mod < 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "plan.units[%zu]: no module '%s' in the "
                                 "model",
                                 k, u->path);
        pcs_dtype_t pd = (pcs_dtype_t)u->param_dtype, od = (pcs_dtype_t)u->output_dtype;
        PCS_CHECK(pcs_mlp_set_cast(
            m, (uint32_t)mod, u->cast_forward_inputs && is_compute_dtype(pd) ? pd : PCS_DTYPE_NONE,
            is_compute_dtype(od) ? od : PCS_DTYPE_NONE));
    }
    return PCS_OK;
}

pcs_dtype_t pcs_mlp_feed_dtype(const struct Pcs__V1__Plan *plan, pcs_dtype_t data_dtype)
{
    for (size_t k = 0; plan && k < plan->n_units; k++) {
        const Pcs__V1__Unit *u = plan->units[k];
        pcs_dtype_t master = (pcs_dtype_t)u->master_dtype, param = (pcs_dtype_t)u->param_dtype;
        int casts = u->cast_forward_inputs && is_compute_dtype(param);
        if (u->path && !*u->path && !casts &&
            (master == PCS_DTYPE_BF16 || master == PCS_DTYPE_FP16) &&
            (param == PCS_DTYPE_NONE || param == master))
            return master;
    }
    return data_dtype;
}

// ---- pass machinery ----

static pcs_status_t new_slot(pcs_mlp_t *m, pcs_dtype_t dtype, uint32_t width, int *out)
{
    if (m->n_slots == m->cap_slots) {
        size_t nc = m->cap_slots ? 2 * m->cap_slots : 32;
        slot_t *s = realloc(m->slots, nc * sizeof *s);
        if (!s)
            return pcs_set_error(PCS_ERR_NOMEM, "mlp: out of memory");
        memset(s + m->cap_slots, 0, (nc - m->cap_slots) * sizeof *s);
        m->slots = s;
        m->cap_slots = nc;
    }
    slot_t *s = &m->slots[m->n_slots];
    PCS_CHECK(ensure(m, &s->v, &s->cap, (size_t)m->max_rows * width));
    s->dtype = dtype;
    s->width = width;
    s->gvalid = 0;
    *out = (int)m->n_slots++;
    return PCS_OK;
}

static pcs_status_t push_op(pcs_mlp_t *m, op_kind_t k, uint32_t mod, int in, int in2, int out,
                            op_t **op)
{
    if (m->n_ops == m->cap_ops) {
        size_t nc = m->cap_ops ? 2 * m->cap_ops : 64;
        op_t *o = realloc(m->ops_tape, nc * sizeof *o);
        if (!o)
            return pcs_set_error(PCS_ERR_NOMEM, "mlp: out of memory");
        memset(o + m->cap_ops, 0, (nc - m->cap_ops) * sizeof *o);
        m->ops_tape = o;
        m->cap_ops = nc;
    }
    op_t *o = &m->ops_tape[m->n_ops++];
    o->kind = k;
    o->module = mod;
    o->in = in;
    o->in2 = in2;
    o->out = out;
    if (op)
        *op = o;
    return PCS_OK;
}

static pcs_status_t need_bound(const pcs_mlp_t *m, uint32_t p)
{
    if (!m->pb[p].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameter %s is not bound (unit not gathered?)",
                             m->params[p].fqn);
    return PCS_OK;
}

/* Where parameter p's gradient goes (data NULL = not wanted). */
static pcs_nn_grad_t grad_dst(const pcs_mlp_t *m, uint32_t p)
{
    pcs_nn_grad_t g = {m->pb[p].grad, m->pb[p].grad_dtype, m->pb[p].dtype, m->pb[p].grad_acc};
    return g;
}

static pcs_status_t cast_op(pcs_mlp_t *m, uint32_t mod, int in, pcs_dtype_t to, int *out)
{
    slot_t *si = &m->slots[in];
    if (to == PCS_DTYPE_NONE || to == si->dtype) {
        *out = in;
        return PCS_OK;
    }
    int o;
    PCS_CHECK(new_slot(m, to, si->width, &o));
    si = &m->slots[in];
    size_t n = (size_t)m->rows * si->width;
    PCS_CHECK(pcs_nn_copy_round(m->nn, m->slots[o].v, si->v, n, to));
    PCS_CHECK(push_op(m, OP_CAST, mod, in, -1, o, NULL));
    *out = o;
    return PCS_OK;
}

/* The Linear of module `mod` as the nn ops see it; weight dtype `dt`. */
static pcs_nn_linear_t linear_desc(const pcs_mlp_t *m, uint32_t mod, pcs_dtype_t dt)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t pw = md->first_param;
    pcs_nn_linear_t l = {m->rows,      md->in_dim,     md->out_dim,
                         dt,           m->pb[pw].data, md->n_params > 1 ? m->pb[pw + 1].data : NULL,
                         NULL};
    return l;
}

static pcs_status_t linear_fwd(pcs_mlp_t *m, uint32_t mod, int in, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t pw = md->first_param, N = md->out_dim;
    const binding_t *bw = &m->pb[pw];
    PCS_CHECK(need_bound(m, pw));
    pcs_dtype_t dt = bw->dtype;
    if (m->slots[in].dtype != dt)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s: mat1 and mat2 must have the same dtype (input %s, weight %s); "
                             "cast the unit's inputs (cast_forward_inputs)",
                             md->path, pcs_dtype_name(m->slots[in].dtype), pcs_dtype_name(dt));
    if (md->n_params > 1 && m->pb[pw + 1].data && m->pb[pw + 1].dtype != dt)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: bias dtype %s differs from weight dtype %s",
                             md->path, pcs_dtype_name(m->pb[pw + 1].dtype), pcs_dtype_name(dt));
    if (md->n_params > 1)
        PCS_CHECK(need_bound(m, pw + 1));
    int o;
    PCS_CHECK(new_slot(m, dt, N, &o));
    pcs_nn_linear_t l = linear_desc(m, mod, dt);
    PCS_CHECK(pcs_nn_linear_fwd(m->nn, &l, m->slots[in].v, m->slots[o].v));
    op_t *op;
    PCS_CHECK(push_op(m, OP_LINEAR, mod, in, -1, o, &op));
    op->wdt = dt;
    *out = o;
    return PCS_OK;
}

/* The norm of module `mod` as the nn ops see it (input dtype dt, statistics in `save`). */
static pcs_nn_norm_t norm_desc(const pcs_mlp_t *m, uint32_t mod, pcs_dtype_t dt, float *save,
                               int training)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t pw = md->first_param;
    pcs_nn_norm_t p;
    memset(&p, 0, sizeof p);
    p.kind = md->kind == PCS_MOD_BATCHNORM ? PCS_NN_BATCHNORM : PCS_NN_LAYERNORM;
    p.rows = m->rows;
    p.dim = md->out_dim;
    p.dtype = dt;
    p.weight = m->pb[pw].data;
    p.bias = m->pb[pw + 1].data;
    p.weight_dtype = m->pb[pw].dtype;
    p.bias_dtype = m->pb[pw + 1].dtype;
    p.save = save;
    p.training = training;
    if (p.kind == PCS_NN_BATCHNORM) {
        const bufbind_t *bb = &m->bb[md->first_buffer];
        p.running_mean = bb[0].data;
        p.running_var = bb[1].data;
        p.mean_dtype = bb[0].dtype;
        p.var_dtype = bb[1].dtype;
        p.num_batches_tracked = bb[2].data;
    }
    return p;
}

static pcs_status_t norm_fwd(pcs_mlp_t *m, uint32_t mod, int in, int training, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t D = md->out_dim, R = m->rows, pw = md->first_param;
    int bn = md->kind == PCS_MOD_BATCHNORM;
    if (!m->pb[pw].data || !m->pb[pw + 1].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameters of %s are not bound", md->path);
    pcs_dtype_t dt = m->slots[in].dtype;
    int o;
    PCS_CHECK(new_slot(m, dt, D, &o));
    op_t *op;
    PCS_CHECK(push_op(m, bn ? OP_BN : OP_LN, mod, in, -1, o, &op));
    if (bn) {
        const bufbind_t *bb = &m->bb[md->first_buffer];
        if (!bb[0].data || !bb[1].data)
            return pcs_set_error(PCS_ERR_STATE, "mlp: running statistics of %s are not bound",
                                 md->path);
        if (training && R < 2)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "%s: expected more than 1 value per "
                                 "channel when training (batch of %u rows)",
                                 md->path, R);
    }
    /* LayerNorm: sized for max_rows, never regrown (see grad_target) */
    PCS_CHECK(ensure(m, &op->save, &op->save_cap, bn ? 4 * (size_t)D : 2 * (size_t)m->max_rows));
    pcs_nn_norm_t p = norm_desc(m, mod, dt, op->save, training);
    PCS_CHECK(pcs_nn_norm_fwd(m->nn, &p, m->slots[in].v, m->slots[o].v));
    *out = o;
    return PCS_OK;
}

static pcs_status_t act_fwd(pcs_mlp_t *m, uint32_t mod, int in, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    int o;
    PCS_CHECK(new_slot(m, m->slots[in].dtype, m->slots[in].width, &o));
    const slot_t *si = &m->slots[in];
    size_t n = (size_t)m->rows * si->width;
    int relu = md->kind == PCS_MOD_RELU;
    PCS_CHECK(pcs_nn_act_fwd(m->nn, relu ? PCS_NN_RELU : PCS_NN_GELU, m->slots[o].v, si->v, n,
                             si->dtype));
    PCS_CHECK(push_op(m, relu ? OP_RELU : OP_GELU, mod, in, -1, o, NULL));
    *out = o;
    return PCS_OK;
}

static pcs_status_t add_fwd(pcs_mlp_t *m, uint32_t mod, int a, int b, int *out)
{
    pcs_dtype_t dt = promote(m->slots[a].dtype, m->slots[b].dtype);
    int o;
    PCS_CHECK(new_slot(m, dt, m->slots[a].width, &o));
    size_t n = (size_t)m->rows * m->slots[a].width;
    PCS_CHECK(pcs_nn_add(m->nn, m->slots[o].v, m->slots[a].v, m->slots[b].v, n, dt));
    PCS_CHECK(push_op(m, OP_ADD, mod, a, b, o, NULL));
    *out = o;
    return PCS_OK;
}

static pcs_status_t enter(pcs_mlp_t *m, uint32_t mod, const pcs_mlp_hooks_t *h)
{
    if (h && h->pre_forward)
        PCS_CHECK(h->pre_forward(h->ctx, mod));
    return push_op(m, OP_ENTER, mod, -1, -1, -1, NULL);
}

static pcs_status_t leave(pcs_mlp_t *m, uint32_t mod, const pcs_mlp_hooks_t *h)
{
    PCS_CHECK(push_op(m, OP_EXIT, mod, -1, -1, -1, NULL));
    if (h && h->post_forward)
        PCS_CHECK(h->post_forward(h->ctx, mod));
    return PCS_OK;
}

/* One leaf module (Linear, norm, activation) with its boundary casts. */
static pcs_status_t leaf_fwd(pcs_mlp_t *m, uint32_t mod, int in, int training,
                             const pcs_mlp_hooks_t *h, int *out)
{
    int x, y = in;
    PCS_CHECK(enter(m, mod, h));
    PCS_CHECK(cast_op(m, mod, in, m->cast_in[mod], &x));
    switch (m->mods[mod].kind) {
    case PCS_MOD_LINEAR:
        PCS_CHECK(linear_fwd(m, mod, x, &y));
        break;
    case PCS_MOD_LAYERNORM:
    case PCS_MOD_BATCHNORM:
        PCS_CHECK(norm_fwd(m, mod, x, training, &y));
        break;
    default:
        PCS_CHECK(act_fwd(m, mod, x, &y));
        break;
    }
    PCS_CHECK(cast_op(m, mod, y, m->cast_out[mod], out));
    return leave(m, mod, h);
}

pcs_status_t pcs_mlp_forward_range(pcs_mlp_t *m, uint32_t first, uint32_t end, const float *x,
                                   pcs_dtype_t x_dtype, uint32_t rows, int training,
                                   const pcs_mlp_hooks_t *hooks, const float **out,
                                   pcs_dtype_t *out_dtype)
{
    if (!m || !x || !out || !out_dtype || !is_compute_dtype(x_dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_forward: bad argument");
    uint32_t nl = m->cfg.n_hidden + 1;
    if (first >= end || end > nl)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "pcs_mlp_forward: layer range [%u, %u) not in "
                             "[0, %u]",
                             first, end, nl);
    if (rows == 0 || rows > m->max_rows)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_forward: %u rows, limit is %u", rows,
                             m->max_rows);
    if (m->w_pending)
        return pcs_set_error(PCS_ERR_STATE, "pcs_mlp_forward: the last backward's weight "
                                            "gradients are pending (pcs_mlp_backward_weights)");
    m->trained = 0;
    m->rows = rows;
    m->n_ops = 0;
    m->n_slots = 0;
    /* Slot 0 is the caller's input, borrowed: it is never written. */
    if (m->cap_slots == 0) {
        int s0;
        uint32_t save = m->max_rows;
        m->max_rows = 0;
        pcs_status_t rc = new_slot(m, x_dtype, m->cfg.input_dim, &s0);
        m->max_rows = save;
        PCS_CHECK(rc);
    } else {
        m->n_slots = 1;
    }
    m->slots[0].v = (float *)x;
    m->slots[0].cap = 0;
    m->slots[0].dtype = x_dtype;
    m->slots[0].width = first == 0 ? m->cfg.input_dim : m->cfg.hidden_dims[first - 1];
    m->slots[0].gvalid = 0;

    /* The root module is entered (hooks, input cast) only by the range that starts the model and
     * left (output cast, hooks) only by the one that ends it: a pipeline stage is a slice of it. */
    int cur = 0;
    if (first == 0) {
        PCS_CHECK(enter(m, 0, hooks));
        PCS_CHECK(cast_op(m, 0, 0, m->cast_in[0], &cur));
    }
    uint32_t mod = 2;
    for (uint32_t i = 0; i < m->cfg.n_hidden; i++) {
        uint32_t blk = mod++;
        if (i < first || i >= end) {
            while (mod < m->n_mods && m->mods[mod].parent == (int)blk)
                mod++;
            continue;
        }
        int bin, h;
        PCS_CHECK(enter(m, blk, hooks));
        PCS_CHECK(cast_op(m, blk, cur, m->cast_in[blk], &bin));
        h = bin;
        while (mod < m->n_mods && m->mods[mod].parent == (int)blk)
            PCS_CHECK(leaf_fwd(m, mod++, h, training, hooks, &h));
        if (m->cfg.residual && m->mods[blk].in_dim == m->mods[blk].out_dim)
            PCS_CHECK(add_fwd(m, blk, h, bin, &h));
        PCS_CHECK(cast_op(m, blk, h, m->cast_out[blk], &cur));
        PCS_CHECK(leave(m, blk, hooks));
    }
    if (end == nl) {
        PCS_CHECK(leaf_fwd(m, mod, cur, training, hooks, &cur));
        PCS_CHECK(cast_op(m, 0, cur, m->cast_out[0], &cur));
        PCS_CHECK(leave(m, 0, hooks));
    }
    *out = m->slots[cur].v;
    *out_dtype = m->slots[cur].dtype;
    m->out_slot = cur;
    m->trained = training;
    return PCS_OK;
}

pcs_status_t pcs_mlp_forward(pcs_mlp_t *m, const float *x, pcs_dtype_t x_dtype, uint32_t rows,
                             int training, const pcs_mlp_hooks_t *hooks, const float **out,
                             pcs_dtype_t *out_dtype)
{
    if (!m)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_forward: bad argument");
    return pcs_mlp_forward_range(m, 0, m->cfg.n_hidden + 1, x, x_dtype, rows, training, hooks, out,
                                 out_dtype);
}

// ---- backward ----

/* Buffer to receive a gradient contribution to slot s: its own grad storage when it has none
 * yet, otherwise scratch that grad_commit() adds in. */
static pcs_status_t grad_target(pcs_mlp_t *m, int s, float **dst)
{
    slot_t *sl = &m->slots[s];
    /* Capacities for max_rows and (scratch) the widest slot, so a buffer is allocated once and
     * never regrown: regrowing frees, and cudaFree synchronizes the whole device while the
     * runtime's NCCL kernels of earlier units wait for peers (docs/WORKER.md, threads and
     * communicators). */
    if (!sl->gvalid) {
        PCS_CHECK(ensure(m, &sl->g, &sl->gcap, (size_t)m->max_rows * sl->width));
        *dst = sl->g;
    } else {
        uint32_t wmax = 0;
        for (size_t i = 0; i < m->n_slots; i++)
            wmax = m->slots[i].width > wmax ? m->slots[i].width : wmax;
        PCS_CHECK(ensure(m, &m->tmp, &m->tmp_cap, (size_t)m->max_rows * wmax));
        *dst = m->tmp;
    }
    return PCS_OK;
}

/* The contribution in `src` (fp32) is first rounded to the slot's dtype (what the producing
 * backward op outputs), then summed into the slot's gradient in that dtype. */
static pcs_status_t grad_commit(pcs_mlp_t *m, int s, float *src)
{
    slot_t *sl = &m->slots[s];
    size_t n = (size_t)m->rows * sl->width;
    PCS_CHECK(pcs_nn_copy_round(m->nn, src, src, n, sl->dtype));
    if (!sl->gvalid) {
        sl->gvalid = 1;
        return PCS_OK;
    }
    return pcs_nn_add(m->nn, sl->g, sl->g, src, n, sl->dtype);
}

static pcs_status_t linear_bwd(pcs_mlp_t *m, const op_t *op)
{
    const pcs_mlp_module_t *md = &m->mods[op->module];
    uint32_t pw = md->first_param;
    const float *dY = m->slots[op->out].g, *X = m->slots[op->in].v;
    pcs_nn_linear_t l = linear_desc(m, op->module, op->wdt);
    pcs_nn_grad_t gw = grad_dst(m, pw), gb = {NULL, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
    if (md->n_params > 1)
        gb = grad_dst(m, pw + 1);
    int need_dx = op->in != 0 || m->want_in_grad; /* the model input needs no gradient */
    /* the weight values the forward used: the binding (re-gathered by the unit's pre-backward
     * hook; the nn op converts a low-precision one again), checked before anything is written */
    if (need_dx && !m->pb[pw].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameter %s is not bound in backward",
                             m->params[pw].fqn);
    if (need_dx && m->pb[pw].dtype != op->wdt)
        return pcs_set_error(PCS_ERR_STATE,
                             "mlp: parameter %s is bound as %s in backward, forward used %s",
                             m->params[pw].fqn, pcs_dtype_name(m->pb[pw].dtype),
                             pcs_dtype_name(op->wdt));
    if ((gw.data || gb.data) && !m->defer_w)
        PCS_CHECK(pcs_nn_linear_bwd_params(m->nn, &l, dY, X, &gw, &gb));
    if (!need_dx)
        return PCS_OK;
    l.weight = m->pb[pw].data;
    float *dX;
    PCS_CHECK(grad_target(m, op->in, &dX));
    PCS_CHECK(pcs_nn_linear_bwd_input(m->nn, &l, dY, dX));
    return grad_commit(m, op->in, dX);
}

static pcs_status_t norm_bwd(pcs_mlp_t *m, const op_t *op)
{
    const pcs_mlp_module_t *md = &m->mods[op->module];
    uint32_t pw = md->first_param;
    if (!m->pb[pw].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameters of %s are not bound in backward",
                             md->path);
    pcs_nn_norm_t p = norm_desc(m, op->module, m->slots[op->in].dtype, op->save, 1);
    if (!p.bias) /* backward does not read the bias: any dtype passes validation */
        p.bias_dtype = p.weight_dtype;
    pcs_nn_grad_t gw = grad_dst(m, pw), gb = grad_dst(m, pw + 1);
    if (m->defer_w) /* backward_weights computes them */
        gw.data = gb.data = NULL;
    float *dX = NULL;
    if (op->in != 0 || m->want_in_grad)
        PCS_CHECK(grad_target(m, op->in, &dX));
    if (!dX && !gw.data && !gb.data)
        return PCS_OK;
    PCS_CHECK(pcs_nn_norm_bwd(m->nn, &p, m->slots[op->in].v, m->slots[op->out].g, dX, &gw, &gb));
    if (dX)
        PCS_CHECK(grad_commit(m, op->in, dX));
    return PCS_OK;
}

static pcs_status_t elementwise_bwd(pcs_mlp_t *m, const op_t *op)
{
    if (op->in == 0 && op->kind != OP_ADD && !m->want_in_grad)
        return PCS_OK;
    size_t n = (size_t)m->rows * m->slots[op->out].width;
    const float *dY = m->slots[op->out].g;
    float *dX;
    if (op->kind == OP_ADD) {
        int ins[2] = {op->in, op->in2};
        for (int k = 0; k < 2; k++) {
            if (ins[k] == 0 && !m->want_in_grad)
                continue;
            PCS_CHECK(grad_target(m, ins[k], &dX));
            PCS_CHECK(pcs_nn_copy_round(m->nn, dX, dY, n, PCS_DTYPE_FP32));
            PCS_CHECK(grad_commit(m, ins[k], dX));
        }
        return PCS_OK;
    }
    PCS_CHECK(grad_target(m, op->in, &dX));
    const float *X = m->slots[op->in].v, *Y = m->slots[op->out].v;
    if (op->kind == OP_CAST)
        PCS_CHECK(pcs_nn_copy_round(m->nn, dX, dY, n, PCS_DTYPE_FP32));
    else
        PCS_CHECK(pcs_nn_act_bwd(m->nn, op->kind == OP_RELU ? PCS_NN_RELU : PCS_NN_GELU, dX, X, Y,
                                 dY, n));
    return grad_commit(m, op->in, dX);
}

static pcs_status_t backward(pcs_mlp_t *m, const float *grad_out, const pcs_mlp_hooks_t *hooks,
                             float *grad_in, int defer_w)
{
    if (!m || !grad_out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_backward: NULL argument");
    if (m->w_pending)
        return pcs_set_error(PCS_ERR_STATE, "pcs_mlp_backward: the last backward's weight "
                                            "gradients are pending (pcs_mlp_backward_weights)");
    if (!m->trained)
        return pcs_set_error(PCS_ERR_STATE, "pcs_mlp_backward: no training forward to "
                                            "differentiate");
    int fin = m->out_slot;
    slot_t *sf = &m->slots[fin];
    size_t n = (size_t)m->rows * sf->width;
    PCS_CHECK(ensure(m, &sf->g, &sf->gcap, (size_t)m->max_rows * sf->width)); /* grad_target */
    PCS_CHECK(pcs_nn_copy_round(m->nn, sf->g, grad_out, n, sf->dtype));
    sf->gvalid = 1;
    m->trained = 0; /* one backward per forward, like retain_graph=False */
    m->want_in_grad = grad_in != NULL;
    m->defer_w = defer_w;
    for (size_t k = m->n_ops; k-- > 0;) {
        const op_t *op = &m->ops_tape[k];
        if (op->kind == OP_EXIT) {
            if (hooks && hooks->pre_backward)
                PCS_CHECK(hooks->pre_backward(hooks->ctx, op->module));
            continue;
        }
        if (op->kind == OP_ENTER) {
            if (hooks && hooks->post_backward)
                PCS_CHECK(hooks->post_backward(hooks->ctx, op->module));
            continue;
        }
        if (!m->slots[op->out].gvalid)
            continue; /* nothing flows back through this op */
        switch (op->kind) {
        case OP_LINEAR:
            PCS_CHECK(linear_bwd(m, op));
            break;
        case OP_LN:
        case OP_BN:
            PCS_CHECK(norm_bwd(m, op));
            break;
        default:
            PCS_CHECK(elementwise_bwd(m, op));
            break;
        }
    }
    if (grad_in) {
        size_t n0 = (size_t)m->rows * m->slots[0].width;
        pcs_stream_t st = pcs_nn_stream(m->nn);
        if (m->slots[0].gvalid)
            PCS_CHECK(
                m->be->copy(grad_in, m->slots[0].g, n0 * sizeof(float), PCS_COPY_DEFAULT, st));
        else
            PCS_CHECK(pcs_kernel_fill(m->be, grad_in, PCS_DTYPE_FP32, n0, 0.0, st));
    }
    m->defer_w = 0;
    m->w_pending = defer_w;
    return PCS_OK;
}

pcs_status_t pcs_mlp_backward_input(pcs_mlp_t *m, const float *grad_out,
                                    const pcs_mlp_hooks_t *hooks, float *grad_in)
{
    return backward(m, grad_out, hooks, grad_in, 0);
}

pcs_status_t pcs_mlp_backward_input_only(pcs_mlp_t *m, const float *grad_out, float *grad_in)
{
    return backward(m, grad_out, NULL, grad_in, 1);
}

pcs_status_t pcs_mlp_backward_weights(pcs_mlp_t *m)
{
    if (!m)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_backward_weights: NULL argument");
    if (!m->w_pending)
        return pcs_set_error(PCS_ERR_STATE, "pcs_mlp_backward_weights: no input-only backward "
                                            "to finish");
    m->w_pending = 0;
    /* Every op that has parameters, from what the input pass left: its input's values (the
     * forward's) and its output's gradient (the input pass's). The same kernels on the same
     * operands as a whole backward: the same bits. */
    for (size_t k = m->n_ops; k-- > 0;) {
        const op_t *op = &m->ops_tape[k];
        if (op->kind != OP_LINEAR && op->kind != OP_LN && op->kind != OP_BN)
            continue; /* no parameters (ENTER / EXIT marks have no slots) */
        if (!m->slots[op->out].gvalid)
            continue;
        const pcs_mlp_module_t *md = &m->mods[op->module];
        uint32_t pw = md->first_param;
        if (op->kind == OP_LINEAR) {
            pcs_nn_linear_t l = linear_desc(m, op->module, op->wdt);
            pcs_nn_grad_t gw = grad_dst(m, pw), gb = {NULL, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
            if (md->n_params > 1)
                gb = grad_dst(m, pw + 1);
            if (gw.data || gb.data)
                PCS_CHECK(pcs_nn_linear_bwd_params(m->nn, &l, m->slots[op->out].g,
                                                   m->slots[op->in].v, &gw, &gb));
        } else if (op->kind == OP_LN || op->kind == OP_BN) {
            if (!m->pb[pw].data)
                return pcs_set_error(PCS_ERR_STATE,
                                     "mlp: parameters of %s are not bound in backward", md->path);
            pcs_nn_norm_t p = norm_desc(m, op->module, m->slots[op->in].dtype, op->save, 1);
            if (!p.bias)
                p.bias_dtype = p.weight_dtype;
            pcs_nn_grad_t gw = grad_dst(m, pw), gb = grad_dst(m, pw + 1);
            if (gw.data || gb.data)
                PCS_CHECK(pcs_nn_norm_bwd(m->nn, &p, m->slots[op->in].v, m->slots[op->out].g,
                                          NULL, &gw, &gb));
        }
    }
    return PCS_OK;
}

pcs_status_t pcs_mlp_backward(pcs_mlp_t *m, const float *grad_out, const pcs_mlp_hooks_t *hooks)
{
    return pcs_mlp_backward_input(m, grad_out, hooks, NULL);
}
