/* Synthetic and file-backed training data addressed by global sample index (DESIGN.md §5).
 * Synthetic rows are pure functions of (seed, index) through the counter RNG of init.h, so every
 * rank computes exactly the rows it needs. File rows are read with pread on demand (one or two
 * contiguous ranges per call, two when the batch wraps), so a rank touches only its own rows. */
#include "model/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/init.h"
#include "io/npy.h"
#include "pcs/mem.h"
#include "pcs/v1/job.pb-c.h"
#include "io/safetensors.h"

/* Held-out synthetic indices for evaluation start here (far beyond any dataset size). */
#define EVAL_BASE (1ull << 40)

typedef enum { SRC_SYNTH, SRC_ST, SRC_NPY } src_kind_t;

struct pcs_data {
    src_kind_t kind;
    uint32_t in_dim, out_dim;
    pcs_loss_kind_t loss;
    uint64_t n;
    pcs_dtype_t in_dtype;
    /* synthetic */
    int classification;
    uint64_t key_x, key_noise;
    float *teacher; /* [out_dim, in_dim] */
    /* safetensors */
    pcs_st_file_t *st;
    const pcs_st_tensor_t *tx, *ty;
    /* npy */
    pcs_npy_t *nx, *ny;
    int y_is_int;
};

uint64_t pcs_data_batch_start(uint64_t step, uint32_t micro, uint32_t M, uint32_t D, uint32_t rank,
                              uint32_t b)
{
    return ((step * M + micro) * D + rank) * (uint64_t)b;
}

uint64_t pcs_data_num_samples(const pcs_data_t *d)
{
    return d->n;
}

pcs_dtype_t pcs_data_input_dtype(const pcs_data_t *d)
{
    return d->in_dtype;
}

void pcs_data_close(pcs_data_t *d)
{
    if (!d)
        return;
    free(d->teacher);
    pcs_st_close(d->st);
    pcs_npy_close(d->nx);
    pcs_npy_close(d->ny);
    free(d);
}

// ---- synthetic ----

static pcs_status_t synth_open(pcs_data_t *d, const Pcs__V1__SyntheticData *s)
{
    d->kind = SRC_SYNTH;
    d->classification = s->task == PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_CLASSIFICATION;
    if (d->classification && d->loss != PCS_LOSS_CROSS_ENTROPY)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.synthetic.task: classification needs "
                                                  "training.loss cross_entropy");
    if (!d->classification && d->loss != PCS_LOSS_MSE)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.synthetic.task: regression needs "
                                                  "training.loss mse");
    d->n = s->num_samples ? s->num_samples : PCS_DATA_DEFAULT_SAMPLES;
    d->in_dtype = PCS_DTYPE_FP32;
    d->key_x = pcs_rng_key(s->seed, "inputs");
    d->key_noise = pcs_rng_key(s->seed, "noise");
    size_t tn = (size_t)d->out_dim * d->in_dim;
    PCS_CHECK(pcs_calloc(tn, sizeof(float), (void **)&d->teacher));
    uint64_t kt = pcs_rng_key(s->seed, "teacher");
    float sc = 1.0f / sqrtf((float)d->in_dim);
    for (size_t i = 0; i < tn; i++)
        d->teacher[i] = pcs_rng_normal(kt, i) * sc;
    return PCS_OK;
}

static void synth_row(const pcs_data_t *d, uint64_t idx, float *x, void *y, uint32_t row)
{
    for (uint32_t j = 0; j < d->in_dim; j++)
        x[j] = pcs_rng_normal(d->key_x, idx * d->in_dim + j);
    int64_t best = 0;
    float bestv = -INFINITY;
    for (uint32_t k = 0; k < d->out_dim; k++) {
        const float *t = d->teacher + (size_t)k * d->in_dim;
        float acc = 0;
        for (uint32_t j = 0; j < d->in_dim; j++)
            acc += t[j] * x[j];
        if (d->classification) {
            if (acc > bestv) {
                bestv = acc;
                best = k;
            }
        } else {
            ((float *)y)[(size_t)row * d->out_dim + k] =
                tanhf(acc) + 0.01f * pcs_rng_normal(d->key_noise, idx * d->out_dim + k);
        }
    }
    if (d->classification)
        ((int64_t *)y)[row] = best;
}

// ---- files ----

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static pcs_status_t check_rows(pcs_data_t *d, const char *path, uint32_t x_ndim,
                               const uint64_t *x_shape, uint32_t y_ndim, const uint64_t *y_shape,
                               int y_int)
{
    if (x_ndim != 2 || x_shape[1] != d->in_dim)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "data.file.inputs: %s: inputs must have shape "
                             "[N, %u] (model.mlp.input_dim)",
                             path, d->in_dim);
    d->n = x_shape[0];
    if (d->n == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.inputs: %s: no rows", path);
    if (d->loss == PCS_LOSS_CROSS_ENTROPY) {
        if (!y_int || y_ndim != 1)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "data.file.targets: %s: cross_entropy needs "
                                 "int64 class labels of shape [N]",
                                 path);
    } else {
        int ok = !y_int &&
                 ((y_ndim == 2 && y_shape[1] == d->out_dim) || (y_ndim == 1 && d->out_dim == 1));
        if (!ok)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "data.file.targets: %s: mse needs floating "
                                 "targets of shape [N, %u]",
                                 path, d->out_dim);
    }
    if (y_shape[0] != d->n)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "data.file.targets: %s: %llu target rows for "
                             "%llu input rows",
                             path, (unsigned long long)y_shape[0], (unsigned long long)d->n);
    d->y_is_int = y_int;
    return PCS_OK;
}

static pcs_status_t st_open_data(pcs_data_t *d, const Pcs__V1__FileData *f,
                                 const pcs_root_t *root)
{
    const char *xin = f->inputs && *f->inputs ? f->inputs : "inputs";
    const char *yin = f->targets && *f->targets ? f->targets : "targets";
    d->kind = SRC_ST;
    int fd = -1;
    PCS_CHECK(pcs_root_open_file(root, f->path, "data.file.path", &fd, NULL)); /* names it */
    pcs_status_t rc = pcs_st_open_fd(fd, f->path, &d->st);
    if (rc != PCS_OK)
        return pcs_set_error(rc, "data.file.path: %s", pcs_last_error());
    d->tx = pcs_st_find(d->st, xin);
    d->ty = pcs_st_find(d->st, yin);
    if (!d->tx)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.inputs: no tensor '%s' in %s", xin,
                             f->path);
    if (!d->ty)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.targets: no tensor '%s' in %s", yin,
                             f->path);
    if (!pcs_dtype_is_float(d->tx->dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "data.file.inputs: tensor '%s' has dtype %s, "
                             "expected F32, BF16, F16 or F64",
                             xin, d->tx->dtype_str);
    int y_int = d->ty->dtype == PCS_DTYPE_INT64;
    if (!y_int && !pcs_dtype_is_float(d->ty->dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.targets: tensor '%s' has dtype %s",
                             yin, d->ty->dtype_str);
    d->in_dtype = d->tx->dtype == PCS_DTYPE_FP64 ? PCS_DTYPE_FP32 : d->tx->dtype;
    return check_rows(d, f->path, d->tx->ndim, d->tx->shape, d->ty->ndim, d->ty->shape, y_int);
}

static pcs_status_t npy_open_data(pcs_data_t *d, const Pcs__V1__FileData *f,
                                  const pcs_root_t *root)
{
    char xp[4096], yp[4096];
    d->kind = SRC_NPY;
    if (pcs_root_is_dir(root, f->path)) {
        const char *xin = f->inputs && *f->inputs ? f->inputs : "inputs";
        const char *yin = f->targets && *f->targets ? f->targets : "targets";
        snprintf(xp, sizeof xp, "%s/%s%s", f->path, xin, ends_with(xin, ".npy") ? "" : ".npy");
        snprintf(yp, sizeof yp, "%s/%s%s", f->path, yin, ends_with(yin, ".npy") ? "" : ".npy");
    } else {
        if (!f->targets || !*f->targets)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.targets: required with a .npy "
                                                      "inputs file (path of the targets .npy)");
        snprintf(xp, sizeof xp, "%s", f->path);
        if (f->targets[0] == '/') {
            snprintf(yp, sizeof yp, "%s", f->targets);
        } else {
            const char *slash = strrchr(f->path, '/');
            int dl = slash ? (int)(slash - f->path) : 1;
            snprintf(yp, sizeof yp, "%.*s/%s", dl, slash ? f->path : ".", f->targets);
        }
    }
    int xfd = -1, yfd = -1;
    PCS_CHECK(pcs_root_open_file(root, xp, "data.file.inputs", &xfd, NULL)); /* names the field */
    pcs_status_t rc = pcs_npy_open_fd(xfd, xp, &d->nx);
    if (rc == PCS_OK) {
        PCS_CHECK(pcs_root_open_file(root, yp, "data.file.targets", &yfd, NULL));
        rc = pcs_npy_open_fd(yfd, yp, &d->ny);
    }
    if (rc != PCS_OK)
        return pcs_set_error(rc, "data.file: %s", pcs_last_error());
    if (d->nx->is_int)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.inputs: %s is an integer array", xp);
    d->in_dtype = d->nx->dtype == PCS_DTYPE_FP16 ? PCS_DTYPE_FP16 : PCS_DTYPE_FP32;
    return check_rows(d, xp, d->nx->ndim, d->nx->shape, d->ny->ndim, d->ny->shape, d->ny->is_int);
}

pcs_status_t pcs_data_open(const struct Pcs__V1__DataSpec *spec, uint32_t input_dim,
                           uint32_t output_dim, pcs_loss_kind_t loss, pcs_data_t **out)
{
    return pcs_data_open_in(spec, NULL, input_dim, output_dim, loss, out);
}

pcs_status_t pcs_data_open_in(const struct Pcs__V1__DataSpec *spec, const pcs_root_t *root,
                              uint32_t input_dim, uint32_t output_dim, pcs_loss_kind_t loss,
                              pcs_data_t **out)
{
    pcs_data_t *d = NULL;
    pcs_status_t rc;
    if (!out || input_dim == 0 || output_dim == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_data_open: bad argument");
    *out = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *d, (void **)&d));
    d->in_dim = input_dim;
    d->out_dim = output_dim;
    d->loss = loss;
    if (!spec || spec->source_case == PCS__V1__DATA_SPEC__SOURCE__NOT_SET) {
        Pcs__V1__SyntheticData def = PCS__V1__SYNTHETIC_DATA__INIT;
        if (loss == PCS_LOSS_CROSS_ENTROPY)
            def.task = PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_CLASSIFICATION;
        rc = synth_open(d, &def);
    } else if (spec->source_case == PCS__V1__DATA_SPEC__SOURCE_SYNTHETIC) {
        rc = synth_open(d, spec->synthetic);
    } else {
        const Pcs__V1__FileData *f = spec->file;
        if (!f || !f->path || !*f->path)
            rc = pcs_set_error(PCS_ERR_INVALID_ARG, "data.file.path: required");
        else if (ends_with(f->path, ".safetensors"))
            rc = st_open_data(d, f, root);
        else
            rc = npy_open_data(d, f, root);
    }
    if (rc != PCS_OK) {
        pcs_data_close(d);
        return rc;
    }
    *out = d;
    return PCS_OK;
}

/* Rows [first, first + n) of a file, no wrap: caller splits. */
static pcs_status_t file_rows(pcs_data_t *d, uint64_t first, uint32_t n, float *x, void *y)
{
    uint64_t xi = first * d->in_dim, xn = (uint64_t)n * d->in_dim;
    uint64_t yw = d->y_is_int ? 1 : d->out_dim;
    if (d->kind == SRC_ST) {
        PCS_CHECK(pcs_st_read_f32(d->st, d->tx, xi, xn, x));
        if (d->y_is_int)
            return pcs_st_read_raw(d->st, d->ty, first * 8, (uint64_t)n * 8, y);
        return pcs_st_read_f32(d->st, d->ty, first * yw, n * yw, y);
    }
    PCS_CHECK(pcs_npy_read_f32(d->nx, xi, xn, x));
    if (d->y_is_int)
        return pcs_npy_read_i64(d->ny, first, n, y);
    return pcs_npy_read_f32(d->ny, first * yw, n * yw, y);
}

pcs_status_t pcs_data_read(pcs_data_t *d, uint64_t first, uint32_t n, float *x, void *y)
{
    if (!d || (n && (!x || !y)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_data_read: NULL argument");
    size_t ysz = d->loss == PCS_LOSS_CROSS_ENTROPY ? sizeof(int64_t) : d->out_dim * sizeof(float);
    if (d->kind == SRC_SYNTH) {
        for (uint32_t r = 0; r < n; r++)
            synth_row(d, (first + r) % d->n, x + (size_t)r * d->in_dim, y, r);
        return PCS_OK;
    }
    uint32_t done = 0;
    while (done < n) {
        uint64_t pos = (first + done) % d->n;
        uint64_t avail = d->n - pos;
        uint32_t k = (uint32_t)(n - done < avail ? n - done : avail);
        PCS_CHECK(file_rows(d, pos, k, x + (size_t)done * d->in_dim, (char *)y + done * ysz));
        done += k;
    }
    return PCS_OK;
}

pcs_status_t pcs_data_read_eval(pcs_data_t *d, uint32_t n, float *x, void *y)
{
    if (!d || (n && (!x || !y)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_data_read_eval: NULL argument");
    if (d->kind == SRC_SYNTH) {
        for (uint32_t r = 0; r < n; r++)
            synth_row(d, EVAL_BASE + r, x + (size_t)r * d->in_dim, y, r);
        return PCS_OK;
    }
    uint64_t first = n >= d->n ? 0 : d->n - n;
    return pcs_data_read(d, first, n, x, y);
}
