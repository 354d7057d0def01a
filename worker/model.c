/* Built-in MLP forward/backward on the CPU with PyTorch-like mixed precision (no autocast):
 * - Storage: activations and their gradients live in fp32 arrays tagged with a dtype; a tensor
 *   tagged bf16/fp16 only ever holds values exactly representable in that dtype (every op rounds
 *   its result), so the values are bit-identical to bf16/fp16 storage while sgemm reads them
 *   directly. Parameters arrive as real bf16/fp16/fp32 buffers (uint16 storage, common half.h).
 * - Linear: operands converted to fp32, cblas_sgemm (fp32 accumulation), bias added in fp32 and
 *   the result rounded once to the compute dtype (cuBLASLt's bias epilogue). Backward: dX, dW by
 *   sgemm, db summed in fp32, each rounded once to its dtype.
 * - Elementwise ops (GELU, residual add) compute in fp32 from the low-precision inputs and round
 *   the result (PyTorch's opmath); ReLU is exact. GELU is the exact erf form.
 * - LayerNorm / BatchNorm statistics in fp32 (accumulated in double), output rounded to the input
 *   dtype; parameters may be fp32 under a low-precision input (PyTorch's mixed-type norm kernels).
 *   BatchNorm: biased batch variance for normalisation, unbiased for running_var, momentum 0.1,
 *   eps 1e-5, running stats updated in fp32 and stored in the buffer's dtype.
 * - Linear requires input dtype == weight dtype (else "mat1 and mat2 must have the same dtype", as
 *   PyTorch); FSDP input/output casts are explicit per-module casts (pcs_mlp_set_cast).
 * - Autograd semantics: a tensor used twice (residual input) sums its gradient contributions in
 *   its own dtype; a cast's gradient is cast back to the source dtype.
 * Buffers (slots, scratch) are allocated on the first pass and reused, so steady-state passes do
 * not allocate. A low-precision Linear weight is converted to fp32 once per forward and that copy
 * is reused by the backward (the values autograd saved; memory: 4 bytes per such weight element
 * between forward and backward). Parameters must still be bound during backward (norm weights and
 * fp32 weights are read from the binding), as FSDP re-gathers a unit in its pre-backward hook. */
#include "model.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"

#define LN_EPS      1e-5f
#define BN_EPS      1e-5f
#define BN_MOMENTUM 0.1f

typedef struct {
    const void *data;
    pcs_dtype_t dtype;
    void *grad;
    pcs_dtype_t grad_dtype;
} binding_t;

typedef struct {
    void *data;
    pcs_dtype_t dtype;
} bufbind_t;

typedef struct {
    float *v; /* values (owned unless slot 0) */
    size_t cap;
    float *g; /* gradient */
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
    float *save; /* LN: mean, rstd per row; BN: mean, invstd per feature */
    size_t save_cap;
} op_t;

struct pcs_mlp {
    pcs_mlp_config_t cfg;
    uint32_t *hidden;
    uint32_t max_rows;
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
    op_t *ops;
    size_t n_ops, cap_ops;
    uint32_t rows;
    int trained;      /* last forward was a training forward */
    int out_slot;     /* slot of the last forward's output */
    int want_in_grad; /* backward also computes the gradient of slot 0 (stage input) */
    /* scratch */
    float **wcache; /* per Linear module: fp32 copy of a low-precision weight, filled by
                       forward and reused by backward (the values autograd saved) */
    size_t *wcache_cap;
    float *gw32; /* fp32 dW */
    size_t gw32_cap;
    float *tmp; /* gradient contribution / misc */
    size_t tmp_cap;
    float *vec; /* bias / norm params as fp32 */
    size_t vec_cap;
};

// ---- numeric helpers ----

/* Conversions go through the kernels' CPU cast (AVX2/F16C when present, proven bit-identical to
 * pcs/half.h by the kernels' exhaustive test); the scalar loops are the fallback. */
static void cast_scalar(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st, size_t n)
{
    if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_bf16(s[i]);
    } else if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_FP16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_fp16(s[i]);
    } else if (st == PCS_DTYPE_BF16 && dt == PCS_DTYPE_FP32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_bf16_to_f32(s[i]);
    } else if (st == PCS_DTYPE_FP16 && dt == PCS_DTYPE_FP32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_fp16_to_f32(s[i]);
    } else if (st == PCS_DTYPE_FP64 && dt == PCS_DTYPE_FP32) {
        const double *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)s[i];
    } else if (st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_FP64) {
        const float *s = src;
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    }
}

static void cast_fast(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st, size_t n)
{
    if (pcs_cpu_cast_array(dst, dt, src, st, n) != PCS_OK)
        cast_scalar(dst, dt, src, st, n);
}

void pcs_round_to(float *v, size_t n, pcs_dtype_t dtype)
{
    if (dtype != PCS_DTYPE_BF16 && dtype != PCS_DTYPE_FP16)
        return;
    uint16_t tmp[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        cast_fast(tmp, dtype, v + i, PCS_DTYPE_FP32, k);
        cast_fast(v + i, PCS_DTYPE_FP32, tmp, dtype, k);
    }
}

void pcs_to_f32(const void *src, pcs_dtype_t src_dtype, size_t n, float *dst)
{
    if (src_dtype == PCS_DTYPE_FP32)
        memcpy(dst, src, n * sizeof(float));
    else
        cast_fast(dst, PCS_DTYPE_FP32, src, src_dtype, n);
}

void pcs_from_f32(const float *src, size_t n, pcs_dtype_t dst_dtype, void *dst)
{
    if (dst_dtype == PCS_DTYPE_FP32)
        memmove(dst, src, n * sizeof(float));
    else
        cast_fast(dst, dst_dtype, src, PCS_DTYPE_FP32, n);
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

static pcs_status_t ensure(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return PCS_OK;
    float *q = realloc(*p, n * sizeof(float));
    if (!q)
        return pcs_set_error(PCS_ERR_NOMEM, "mlp: out of memory (%zu floats)", n);
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
    pcs_status_t rc;
    pcs_mlp_t *m = NULL;
    if (!cfg || !out || cfg->input_dim == 0 || cfg->output_dim == 0 || max_rows == 0 ||
        (cfg->n_hidden && !cfg->hidden_dims))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_create: bad config");
    for (uint32_t i = 0; i < cfg->n_hidden; i++)
        if (cfg->hidden_dims[i] == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_create: hidden_dims[%u] = 0", i);
    *out = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *m, (void **)&m));
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
    PCS_CHECK_GOTO(pcs_calloc(max_mods, sizeof *m->wcache, (void **)&m->wcache), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(max_mods, sizeof *m->wcache_cap, (void **)&m->wcache_cap), rc, fail);

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
    for (size_t i = 1; i < m->cap_slots; i++) {
        free(m->slots[i].v);
        free(m->slots[i].g);
    }
    if (m->cap_slots)
        free(m->slots[0].g);
    free(m->slots);
    for (size_t i = 0; i < m->cap_ops; i++)
        free(m->ops[i].save);
    free(m->ops);
    for (uint32_t i = 0; m->wcache && i < m->n_mods; i++)
        free(m->wcache[i]);
    free(m->wcache);
    free(m->wcache_cap);
    free(m->gw32);
    free(m->tmp);
    free(m->vec);
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

pcs_status_t pcs_mlp_bind_grad(pcs_mlp_t *m, uint32_t i, pcs_dtype_t dtype, void *data)
{
    if (!m || i >= m->n_params || (data && !is_compute_dtype(dtype) && dtype != PCS_DTYPE_FP64))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_bind_grad: bad index %u or dtype %s", i,
                             pcs_dtype_name(dtype));
    m->pb[i].grad = data;
    m->pb[i].grad_dtype = dtype;
    return PCS_OK;
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
    PCS_CHECK(ensure(&s->v, &s->cap, (size_t)m->max_rows * width));
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
        op_t *o = realloc(m->ops, nc * sizeof *o);
        if (!o)
            return pcs_set_error(PCS_ERR_NOMEM, "mlp: out of memory");
        memset(o + m->cap_ops, 0, (nc - m->cap_ops) * sizeof *o);
        m->ops = o;
        m->cap_ops = nc;
    }
    op_t *o = &m->ops[m->n_ops++];
    o->kind = k;
    o->module = mod;
    o->in = in;
    o->in2 = in2;
    o->out = out;
    if (op)
        *op = o;
    return PCS_OK;
}

/* fp32 view of a bound floating tensor: the binding itself for fp32, else converted into *buf. */
static pcs_status_t param_f32(pcs_mlp_t *m, uint32_t p, float **buf, size_t *cap, const float **out)
{
    const binding_t *b = &m->pb[p];
    if (!b->data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameter %s is not bound (unit not gathered?)",
                             m->params[p].fqn);
    if (b->dtype == PCS_DTYPE_FP32) {
        *out = b->data;
        return PCS_OK;
    }
    PCS_CHECK(ensure(buf, cap, m->params[p].numel));
    pcs_to_f32(b->data, b->dtype, m->params[p].numel, *buf);
    *out = *buf;
    return PCS_OK;
}

/* Write a gradient: round to the parameter's compute dtype (autograd's dtype), store as grad dtype.
 */
static void store_grad(pcs_mlp_t *m, uint32_t p, float *g32)
{
    binding_t *b = &m->pb[p];
    size_t n = m->params[p].numel;
    if (b->grad_dtype != b->dtype)
        pcs_round_to(g32, n, b->dtype);
    pcs_from_f32(g32, n, b->grad_dtype, b->grad);
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
    slot_t *so = &m->slots[o];
    size_t n = (size_t)m->rows * si->width;
    memcpy(so->v, si->v, n * sizeof(float));
    pcs_round_to(so->v, n, to);
    PCS_CHECK(push_op(m, OP_CAST, mod, in, -1, o, NULL));
    *out = o;
    return PCS_OK;
}

static pcs_status_t linear_fwd(pcs_mlp_t *m, uint32_t mod, int in, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t pw = md->first_param, K = md->in_dim, N = md->out_dim;
    const binding_t *bw = &m->pb[pw];
    if (!bw->data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameter %s is not bound (unit not gathered?)",
                             m->params[pw].fqn);
    pcs_dtype_t dt = bw->dtype;
    if (m->slots[in].dtype != dt)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s: mat1 and mat2 must have the same dtype (input %s, weight %s); "
                             "cast the unit's inputs (cast_forward_inputs)",
                             md->path, pcs_dtype_name(m->slots[in].dtype), pcs_dtype_name(dt));
    if (md->n_params > 1 && m->pb[pw + 1].data && m->pb[pw + 1].dtype != dt)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: bias dtype %s differs from weight dtype %s",
                             md->path, pcs_dtype_name(m->pb[pw + 1].dtype), pcs_dtype_name(dt));
    const float *W;
    PCS_CHECK(param_f32(m, pw, &m->wcache[mod], &m->wcache_cap[mod], &W));
    int o;
    PCS_CHECK(new_slot(m, dt, N, &o));
    float *Y = m->slots[o].v;
    const float *X = m->slots[in].v;
    int R = (int)m->rows;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, (int)N, (int)K, 1.0f, X, (int)K, W,
                (int)K, 0.0f, Y, (int)N);
    if (md->n_params > 1) {
        const float *B;
        PCS_CHECK(param_f32(m, pw + 1, &m->vec, &m->vec_cap, &B));
        for (int r = 0; r < R; r++) {
            float *y = Y + (size_t)r * N;
            for (uint32_t j = 0; j < N; j++)
                y[j] += B[j];
        }
    }
    pcs_round_to(Y, (size_t)R * N, dt);
    PCS_CHECK(push_op(m, OP_LINEAR, mod, in, -1, o, NULL));
    *out = o;
    return PCS_OK;
}

static pcs_status_t norm_fwd(pcs_mlp_t *m, uint32_t mod, int in, int training, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    uint32_t D = md->out_dim, R = m->rows, pw = md->first_param;
    int bn = md->kind == PCS_MOD_BATCHNORM;
    if (!m->pb[pw].data || !m->pb[pw + 1].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameters of %s are not bound", md->path);
    PCS_CHECK(ensure(&m->vec, &m->vec_cap, 2 * (size_t)D));
    float *wb = m->vec;
    pcs_to_f32(m->pb[pw].data, m->pb[pw].dtype, D, wb);
    pcs_to_f32(m->pb[pw + 1].data, m->pb[pw + 1].dtype, D, wb + D);
    pcs_dtype_t dt = m->slots[in].dtype;
    int o;
    PCS_CHECK(new_slot(m, dt, D, &o));
    op_t *op;
    PCS_CHECK(push_op(m, bn ? OP_BN : OP_LN, mod, in, -1, o, &op));
    const float *X = m->slots[in].v;
    float *Y = m->slots[o].v;
    if (!bn) {
        PCS_CHECK(ensure(&op->save, &op->save_cap, 2 * (size_t)R));
        for (uint32_t r = 0; r < R; r++) {
            const float *x = X + (size_t)r * D;
            double s = 0, ss = 0;
            for (uint32_t j = 0; j < D; j++)
                s += x[j];
            double mean = s / D;
            for (uint32_t j = 0; j < D; j++)
                ss += (x[j] - mean) * (x[j] - mean);
            float mf = (float)mean, rstd = (float)(1.0 / sqrt(ss / D + LN_EPS));
            op->save[2 * r] = mf;
            op->save[2 * r + 1] = rstd;
            float *y = Y + (size_t)r * D;
            for (uint32_t j = 0; j < D; j++)
                y[j] = (x[j] - mf) * rstd * wb[j] + wb[D + j];
        }
    } else {
        uint32_t rm = md->first_buffer;
        bufbind_t *bm = &m->bb[rm], *bv = &m->bb[rm + 1], *bc = &m->bb[rm + 2];
        if (!bm->data || !bv->data)
            return pcs_set_error(PCS_ERR_STATE, "mlp: running statistics of %s are not bound",
                                 md->path);
        PCS_CHECK(ensure(&op->save, &op->save_cap, 4 * (size_t)D));
        float *mean = op->save, *invstd = op->save + D, *run = op->save + 2 * D;
        pcs_to_f32(bm->data, bm->dtype, D, run);
        pcs_to_f32(bv->data, bv->dtype, D, run + D);
        if (training) {
            if (R < 2)
                return pcs_set_error(PCS_ERR_INVALID_ARG,
                                     "%s: expected more than 1 value per "
                                     "channel when training (batch of %u rows)",
                                     md->path, R);
            for (uint32_t j = 0; j < D; j++) {
                double s = 0, ss = 0;
                for (uint32_t r = 0; r < R; r++)
                    s += X[(size_t)r * D + j];
                double mu = s / R;
                for (uint32_t r = 0; r < R; r++) {
                    double d = X[(size_t)r * D + j] - mu;
                    ss += d * d;
                }
                double var = ss / R;
                mean[j] = (float)mu;
                invstd[j] = (float)(1.0 / sqrt(var + BN_EPS));
                run[j] = (1.0f - BN_MOMENTUM) * run[j] + BN_MOMENTUM * (float)mu;
                run[D + j] =
                    (1.0f - BN_MOMENTUM) * run[D + j] + BN_MOMENTUM * (float)(ss / (R - 1));
            }
            pcs_from_f32(run, D, bm->dtype, bm->data);
            pcs_from_f32(run + D, D, bv->dtype, bv->data);
            if (bc->data)
                (*(int64_t *)bc->data)++;
        } else {
            for (uint32_t j = 0; j < D; j++) {
                mean[j] = run[j];
                invstd[j] = (float)(1.0 / sqrt((double)run[D + j] + BN_EPS));
            }
        }
        for (uint32_t r = 0; r < R; r++) {
            const float *x = X + (size_t)r * D;
            float *y = Y + (size_t)r * D;
            for (uint32_t j = 0; j < D; j++)
                y[j] = (x[j] - mean[j]) * invstd[j] * wb[j] + wb[D + j];
        }
    }
    pcs_round_to(Y, (size_t)R * D, dt);
    *out = o;
    return PCS_OK;
}

static const double k_sqrt1_2 = 0.70710678118654752440;
static const double k_inv_sqrt_2pi = 0.39894228040143267794;

static pcs_status_t act_fwd(pcs_mlp_t *m, uint32_t mod, int in, int *out)
{
    const pcs_mlp_module_t *md = &m->mods[mod];
    slot_t *si = &m->slots[in];
    int o;
    PCS_CHECK(new_slot(m, si->dtype, si->width, &o));
    si = &m->slots[in];
    size_t n = (size_t)m->rows * si->width;
    const float *X = si->v;
    float *Y = m->slots[o].v;
    if (md->kind == PCS_MOD_RELU) {
        for (size_t i = 0; i < n; i++)
            Y[i] = X[i] < 0.0f ? 0.0f : X[i]; /* keeps NaN, like torch.relu */
    } else {
        for (size_t i = 0; i < n; i++)
            Y[i] = 0.5f * X[i] * (1.0f + erff(X[i] * (float)k_sqrt1_2));
        pcs_round_to(Y, n, si->dtype);
    }
    PCS_CHECK(push_op(m, md->kind == PCS_MOD_RELU ? OP_RELU : OP_GELU, mod, in, -1, o, NULL));
    *out = o;
    return PCS_OK;
}

static pcs_status_t add_fwd(pcs_mlp_t *m, uint32_t mod, int a, int b, int *out)
{
    pcs_dtype_t dt = promote(m->slots[a].dtype, m->slots[b].dtype);
    int o;
    PCS_CHECK(new_slot(m, dt, m->slots[a].width, &o));
    size_t n = (size_t)m->rows * m->slots[a].width;
    const float *A = m->slots[a].v, *B = m->slots[b].v;
    float *Y = m->slots[o].v;
    for (size_t i = 0; i < n; i++)
        Y[i] = A[i] + B[i];
    pcs_round_to(Y, n, dt);
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
    size_t n = (size_t)m->rows * sl->width;
    if (!sl->gvalid) {
        PCS_CHECK(ensure(&sl->g, &sl->gcap, n));
        *dst = sl->g;
    } else {
        PCS_CHECK(ensure(&m->tmp, &m->tmp_cap, n));
        *dst = m->tmp;
    }
    return PCS_OK;
}

/* The contribution in `src` (fp32) is first rounded to the slot's dtype (what the producing
 * backward op outputs), then summed into the slot's gradient in that dtype. */
static void grad_commit(pcs_mlp_t *m, int s, float *src)
{
    slot_t *sl = &m->slots[s];
    size_t n = (size_t)m->rows * sl->width;
    pcs_round_to(src, n, sl->dtype);
    if (!sl->gvalid) {
        sl->gvalid = 1;
        return;
    }
    for (size_t i = 0; i < n; i++)
        sl->g[i] += src[i];
    pcs_round_to(sl->g, n, sl->dtype);
}

static pcs_status_t linear_bwd(pcs_mlp_t *m, const op_t *op)
{
    const pcs_mlp_module_t *md = &m->mods[op->module];
    uint32_t pw = md->first_param, K = md->in_dim, N = md->out_dim;
    int R = (int)m->rows;
    const float *dY = m->slots[op->out].g, *X = m->slots[op->in].v;
    if (m->pb[pw].grad && m->pb[pw].grad_dtype == PCS_DTYPE_FP32 &&
        m->pb[pw].dtype == PCS_DTYPE_FP32) {
        /* fp32 gradient of an fp32 weight: no rounding, so the GEMM writes it in place */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, R, 1.0f, dY, (int)N, X,
                    (int)K, 0.0f, m->pb[pw].grad, (int)K);
    } else if (m->pb[pw].grad) {
        PCS_CHECK(ensure(&m->gw32, &m->gw32_cap, (size_t)N * K));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, R, 1.0f, dY, (int)N, X,
                    (int)K, 0.0f, m->gw32, (int)K);
        store_grad(m, pw, m->gw32);
    }
    if (md->n_params > 1 && m->pb[pw + 1].grad) {
        PCS_CHECK(ensure(&m->gw32, &m->gw32_cap, N));
        for (uint32_t j = 0; j < N; j++)
            m->gw32[j] = 0.0f;
        for (int r = 0; r < R; r++)
            for (uint32_t j = 0; j < N; j++)
                m->gw32[j] += dY[(size_t)r * N + j];
        store_grad(m, pw + 1, m->gw32);
    }
    if (op->in == 0 && !m->want_in_grad)
        return PCS_OK; /* the model input needs no gradient */
    /* the weight values the forward used: the binding (fp32) or forward's converted copy */
    const float *W = m->pb[pw].dtype == PCS_DTYPE_FP32 && m->pb[pw].data ? m->pb[pw].data
                                                                         : m->wcache[op->module];
    if (!W)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameter %s is not bound in backward",
                             m->params[pw].fqn);
    float *dX;
    PCS_CHECK(grad_target(m, op->in, &dX));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, (int)K, (int)N, 1.0f, dY, (int)N, W,
                (int)K, 0.0f, dX, (int)K);
    grad_commit(m, op->in, dX);
    return PCS_OK;
}

static pcs_status_t norm_bwd(pcs_mlp_t *m, const op_t *op)
{
    const pcs_mlp_module_t *md = &m->mods[op->module];
    uint32_t D = md->out_dim, R = m->rows, pw = md->first_param;
    int bn = op->kind == OP_BN;
    const float *X = m->slots[op->in].v, *dY = m->slots[op->out].g;
    if (!m->pb[pw].data)
        return pcs_set_error(PCS_ERR_STATE, "mlp: parameters of %s are not bound in backward",
                             md->path);
    PCS_CHECK(ensure(&m->vec, &m->vec_cap, 4 * (size_t)D));
    float *w = m->vec, *dw = m->vec + D, *db = m->vec + 2 * D;
    pcs_to_f32(m->pb[pw].data, m->pb[pw].dtype, D, w);
    memset(dw, 0, 2 * (size_t)D * sizeof(float));
    float *dX = NULL;
    if (op->in != 0 || m->want_in_grad)
        PCS_CHECK(grad_target(m, op->in, &dX));
    if (!bn) {
        for (uint32_t r = 0; r < R; r++) {
            const float *x = X + (size_t)r * D, *dy = dY + (size_t)r * D;
            float mean = op->save[2 * r], rstd = op->save[2 * r + 1];
            double c1 = 0, c2 = 0;
            for (uint32_t j = 0; j < D; j++) {
                float xh = (x[j] - mean) * rstd, g = dy[j] * w[j];
                c1 += g;
                c2 += (double)g * xh;
                dw[j] += dy[j] * xh;
                db[j] += dy[j];
            }
            c1 /= D;
            c2 /= D;
            if (dX) {
                float *dx = dX + (size_t)r * D;
                for (uint32_t j = 0; j < D; j++) {
                    float xh = (x[j] - mean) * rstd;
                    dx[j] = rstd * (float)(dy[j] * w[j] - c1 - xh * c2);
                }
            }
        }
    } else {
        const float *mean = op->save, *invstd = op->save + D;
        for (uint32_t j = 0; j < D; j++) {
            double sg = 0, sgx = 0, sdy = 0, sdyx = 0;
            for (uint32_t r = 0; r < R; r++) {
                float dy = dY[(size_t)r * D + j];
                float xh = (X[(size_t)r * D + j] - mean[j]) * invstd[j];
                sdy += dy;
                sdyx += (double)dy * xh;
                sg += dy * w[j];
                sgx += (double)dy * w[j] * xh;
            }
            dw[j] = (float)sdyx;
            db[j] = (float)sdy;
            if (dX) {
                double mg = sg / R, mgx = sgx / R;
                for (uint32_t r = 0; r < R; r++) {
                    float xh = (X[(size_t)r * D + j] - mean[j]) * invstd[j];
                    dX[(size_t)r * D + j] =
                        invstd[j] * (float)(dY[(size_t)r * D + j] * w[j] - mg - xh * mgx);
                }
            }
        }
    }
    if (m->pb[pw].grad)
        store_grad(m, pw, dw);
    if (m->pb[pw + 1].grad)
        store_grad(m, pw + 1, db);
    if (dX)
        grad_commit(m, op->in, dX);
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
            memcpy(dX, dY, n * sizeof(float));
            grad_commit(m, ins[k], dX);
        }
        return PCS_OK;
    }
    PCS_CHECK(grad_target(m, op->in, &dX));
    const float *X = m->slots[op->in].v, *Y = m->slots[op->out].v;
    if (op->kind == OP_CAST) {
        memcpy(dX, dY, n * sizeof(float));
    } else if (op->kind == OP_RELU) {
        /* threshold_backward(grad, result, 0): NaN results pass the gradient, like PyTorch */
        for (size_t i = 0; i < n; i++)
            dX[i] = Y[i] <= 0.0f ? 0.0f : dY[i];
    } else {
        for (size_t i = 0; i < n; i++) {
            float x = X[i];
            float cdf = 0.5f * (1.0f + erff(x * (float)k_sqrt1_2));
            float pdf = (float)k_inv_sqrt_2pi * expf(-0.5f * x * x);
            dX[i] = dY[i] * (cdf + x * pdf);
        }
    }
    grad_commit(m, op->in, dX);
    return PCS_OK;
}

pcs_status_t pcs_mlp_backward_input(pcs_mlp_t *m, const float *grad_out,
                                    const pcs_mlp_hooks_t *hooks, float *grad_in)
{
    if (!m || !grad_out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_mlp_backward: NULL argument");
    if (!m->trained)
        return pcs_set_error(PCS_ERR_STATE, "pcs_mlp_backward: no training forward to "
                                            "differentiate");
    int fin = m->out_slot;
    slot_t *sf = &m->slots[fin];
    size_t n = (size_t)m->rows * sf->width;
    PCS_CHECK(ensure(&sf->g, &sf->gcap, n));
    memcpy(sf->g, grad_out, n * sizeof(float));
    pcs_round_to(sf->g, n, sf->dtype);
    sf->gvalid = 1;
    m->trained = 0; /* one backward per forward, like retain_graph=False */
    m->want_in_grad = grad_in != NULL;
    for (size_t k = m->n_ops; k-- > 0;) {
        const op_t *op = &m->ops[k];
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
        if (m->slots[0].gvalid)
            memcpy(grad_in, m->slots[0].g, n0 * sizeof(float));
        else
            memset(grad_in, 0, n0 * sizeof(float));
    }
    return PCS_OK;
}

pcs_status_t pcs_mlp_backward(pcs_mlp_t *m, const float *grad_out, const pcs_mlp_hooks_t *hooks)
{
    return pcs_mlp_backward_input(m, grad_out, hooks, NULL);
}
