/* safetensors reader and writer. The JSON header is parsed with libyaml's event API (JSON is
 * YAML; DESIGN.md §4 forbids a hand-written parser where a dependency does the job), restricted to
 * the JSON subset: keys and strings must be double-quoted, numbers plain decimal, no anchors,
 * aliases or tags, one document. Validation follows the Rust reference reader: tensors must tile
 * the data section exactly (sorted by offset: contiguous from 0, no overlap, no gap, last end =
 * data length) and each byte range must equal numel * element size. Bad files never crash. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "pcs/file.h"
#include "pcs/half.h"
#include "pcs/log.h"
#include "pcs/mem.h"

struct pcs_st_file {
    char *origin;        /* path or "<memory>" for messages */
    int fd;              /* -1 for in-memory images */
    uint8_t *mem;        /* in-memory data section (copy) */
    uint64_t data_start; /* 8 + header length */
    uint64_t data_len;
    pcs_st_tensor_t *tensors;
    size_t n, cap;
    char **meta; /* key, value, key, value ... */
    size_t n_meta, cap_meta;
};

// ---- dtype table ----

static const struct {
    const char *name;
    pcs_dtype_t dtype;
    size_t size;
} k_dtypes[] = {
    {"F32", PCS_DTYPE_FP32, 4},     {"BF16", PCS_DTYPE_BF16, 2}, {"F16", PCS_DTYPE_FP16, 2},
    {"F64", PCS_DTYPE_FP64, 8},     {"I64", PCS_DTYPE_INT64, 8}, {"BOOL", PCS_DTYPE_NONE, 1},
    {"U8", PCS_DTYPE_NONE, 1},      {"I8", PCS_DTYPE_NONE, 1},   {"F8_E4M3", PCS_DTYPE_NONE, 1},
    {"F8_E5M2", PCS_DTYPE_NONE, 1}, {"I16", PCS_DTYPE_NONE, 2},  {"U16", PCS_DTYPE_NONE, 2},
    {"I32", PCS_DTYPE_NONE, 4},     {"U32", PCS_DTYPE_NONE, 4},  {"U64", PCS_DTYPE_NONE, 8},
};

const char *pcs_st_dtype_name(pcs_dtype_t t)
{
    for (size_t i = 0; i < 5; i++)
        if (k_dtypes[i].dtype == t)
            return k_dtypes[i].name;
    return NULL;
}

// ---- header parsing ----

typedef struct {
    yaml_parser_t parser;
    yaml_event_t ev;
    int have_ev;
    pcs_st_file_t *f;
} hdr_parser_t;

static pcs_status_t hdr_err(hdr_parser_t *p, const char *what)
{
    return pcs_set_error(PCS_ERR_INVALID_ARG, "safetensors %s: malformed header: %s", p->f->origin,
                         what);
}

/* Next event; rejects anchors, aliases and tags, which JSON does not have. */
static pcs_status_t hdr_next(hdr_parser_t *p)
{
    if (p->have_ev) {
        yaml_event_delete(&p->ev);
        p->have_ev = 0;
    }
    if (!yaml_parser_parse(&p->parser, &p->ev)) {
        char msg[160];
        snprintf(msg, sizeof msg, "not valid JSON (%s at byte %zu)",
                 p->parser.problem ? p->parser.problem : "parse error",
                 p->parser.problem_mark.index);
        return hdr_err(p, msg);
    }
    p->have_ev = 1;
    switch (p->ev.type) {
    case YAML_ALIAS_EVENT:
        return hdr_err(p, "aliases are not JSON");
    case YAML_SCALAR_EVENT:
        if (p->ev.data.scalar.anchor || p->ev.data.scalar.tag)
            return hdr_err(p, "anchors/tags are not JSON");
        break;
    case YAML_MAPPING_START_EVENT:
        if (p->ev.data.mapping_start.anchor || p->ev.data.mapping_start.tag)
            return hdr_err(p, "anchors/tags are not JSON");
        break;
    case YAML_SEQUENCE_START_EVENT:
        if (p->ev.data.sequence_start.anchor || p->ev.data.sequence_start.tag)
            return hdr_err(p, "anchors/tags are not JSON");
        break;
    default:
        break;
    }
    return PCS_OK;
}

static int ev_is_string(const yaml_event_t *e)
{
    return e->type == YAML_SCALAR_EVENT &&
           e->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE &&
           strlen((const char *)e->data.scalar.value) == e->data.scalar.length;
}

/* A JSON non-negative integer without sign, fraction or leading zeros, fitting in uint64. */
static int ev_uint(const yaml_event_t *e, uint64_t *out)
{
    if (e->type != YAML_SCALAR_EVENT || e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = (const char *)e->data.scalar.value;
    size_t len = e->data.scalar.length;
    if (len == 0 || len > 20 || (len > 1 && s[0] == '0'))
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

static pcs_status_t hdr_uint_list(hdr_parser_t *p, uint64_t *vals, uint32_t max, uint32_t *n,
                                  const char *what)
{
    char msg[200];
    PCS_CHECK(hdr_next(p));
    if (p->ev.type != YAML_SEQUENCE_START_EVENT) {
        snprintf(msg, sizeof msg, "%s must be an array of integers", what);
        return hdr_err(p, msg);
    }
    *n = 0;
    for (;;) {
        PCS_CHECK(hdr_next(p));
        if (p->ev.type == YAML_SEQUENCE_END_EVENT)
            return PCS_OK;
        uint64_t v;
        if (!ev_uint(&p->ev, &v)) {
            snprintf(msg, sizeof msg, "%s must contain non-negative integers", what);
            return hdr_err(p, msg);
        }
        if (*n >= max) {
            snprintf(msg, sizeof msg, "%s has more than %u entries", what, max);
            return hdr_err(p, msg);
        }
        vals[(*n)++] = v;
    }
}

static pcs_status_t hdr_tensor(hdr_parser_t *p, pcs_st_tensor_t *t)
{
    char msg[256];
    int have_dtype = 0, have_shape = 0, have_off = 0;
    PCS_CHECK(hdr_next(p));
    if (p->ev.type != YAML_MAPPING_START_EVENT) {
        snprintf(msg, sizeof msg, "tensor '%s' must be an object", t->name);
        return hdr_err(p, msg);
    }
    for (;;) {
        PCS_CHECK(hdr_next(p));
        if (p->ev.type == YAML_MAPPING_END_EVENT)
            break;
        if (!ev_is_string(&p->ev))
            return hdr_err(p, "object keys must be strings");
        const char *key = (const char *)p->ev.data.scalar.value;
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            PCS_CHECK(hdr_next(p));
            if (!ev_is_string(&p->ev)) {
                snprintf(msg, sizeof msg, "tensor '%s': dtype must be a string", t->name);
                return hdr_err(p, msg);
            }
            const char *d = (const char *)p->ev.data.scalar.value;
            size_t k;
            for (k = 0; k < sizeof k_dtypes / sizeof k_dtypes[0]; k++)
                if (strcmp(d, k_dtypes[k].name) == 0)
                    break;
            if (k == sizeof k_dtypes / sizeof k_dtypes[0]) {
                snprintf(msg, sizeof msg, "tensor '%s': unknown dtype '%.16s'", t->name, d);
                return hdr_err(p, msg);
            }
            snprintf(t->dtype_str, sizeof t->dtype_str, "%s", k_dtypes[k].name);
            t->dtype = k_dtypes[k].dtype;
            t->elem_size = k_dtypes[k].size;
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            snprintf(msg, sizeof msg, "tensor '%s': shape", t->name);
            PCS_CHECK(hdr_uint_list(p, t->shape, PCS_ST_MAX_DIMS, &t->ndim, msg));
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0 && !have_off) {
            uint64_t off[2];
            uint32_t n = 0;
            snprintf(msg, sizeof msg, "tensor '%s': data_offsets", t->name);
            PCS_CHECK(hdr_uint_list(p, off, 2, &n, msg));
            if (n != 2) {
                snprintf(msg, sizeof msg, "tensor '%s': data_offsets must be [begin, end]",
                         t->name);
                return hdr_err(p, msg);
            }
            t->begin = off[0];
            t->end = off[1];
            have_off = 1;
        } else {
            snprintf(msg, sizeof msg, "tensor '%s': unexpected or repeated key '%.40s'", t->name,
                     key);
            return hdr_err(p, msg);
        }
    }
    if (!have_dtype || !have_shape || !have_off) {
        snprintf(msg, sizeof msg, "tensor '%s' needs dtype, shape and data_offsets", t->name);
        return hdr_err(p, msg);
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, t->shape[d], &numel))
            return hdr_err(p, "shape overflows");
    t->numel = numel;
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)t->elem_size, &bytes) || t->end < t->begin ||
        t->end - t->begin != bytes) {
        snprintf(msg, sizeof msg,
                 "tensor '%s': data_offsets [%llu, %llu] do not hold %llu elements of %s", t->name,
                 (unsigned long long)t->begin, (unsigned long long)t->end,
                 (unsigned long long)numel, t->dtype_str);
        return hdr_err(p, msg);
    }
    return PCS_OK;
}

static pcs_status_t hdr_metadata(hdr_parser_t *p)
{
    pcs_st_file_t *f = p->f;
    PCS_CHECK(hdr_next(p));
    if (p->ev.type != YAML_MAPPING_START_EVENT)
        return hdr_err(p, "__metadata__ must be an object of strings");
    for (;;) {
        PCS_CHECK(hdr_next(p));
        if (p->ev.type == YAML_MAPPING_END_EVENT)
            return PCS_OK;
        if (!ev_is_string(&p->ev))
            return hdr_err(p, "__metadata__ keys must be strings");
        char *key = NULL, *val = NULL;
        PCS_CHECK(pcs_strdup((const char *)p->ev.data.scalar.value, &key));
        pcs_status_t rc = hdr_next(p);
        if (rc == PCS_OK && !ev_is_string(&p->ev))
            rc = hdr_err(p, "__metadata__ values must be strings");
        if (rc == PCS_OK)
            rc = pcs_strdup((const char *)p->ev.data.scalar.value, &val);
        if (rc == PCS_OK)
            rc = pcs_grow((void **)&f->meta, &f->cap_meta, f->n_meta + 2, sizeof(char *));
        if (rc != PCS_OK) {
            free(key);
            free(val);
            return rc;
        }
        f->meta[f->n_meta++] = key;
        f->meta[f->n_meta++] = val;
    }
}

static int cmp_by_offset(const void *a, const void *b)
{
    const pcs_st_tensor_t *x = *(pcs_st_tensor_t *const *)a, *y = *(pcs_st_tensor_t *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

static int cmp_by_name(const void *a, const void *b)
{
    const pcs_st_tensor_t *x = *(pcs_st_tensor_t *const *)a, *y = *(pcs_st_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

/* Tensors must tile [0, data_len) exactly and names must be unique. */
static pcs_status_t check_layout(pcs_st_file_t *f)
{
    pcs_status_t rc = PCS_OK;
    pcs_st_tensor_t **idx = NULL;
    if (f->n == 0) {
        if (f->data_len != 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "safetensors %s: %llu data bytes but no tensors", f->origin,
                                 (unsigned long long)f->data_len);
        return PCS_OK;
    }
    PCS_CHECK(pcs_calloc(f->n, sizeof *idx, (void **)&idx));
    for (size_t i = 0; i < f->n; i++)
        idx[i] = &f->tensors[i];
    qsort(idx, f->n, sizeof *idx, cmp_by_name);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(idx[i - 1]->name, idx[i]->name) == 0) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG, "safetensors %s: duplicate tensor '%s'",
                               f->origin, idx[i]->name);
            goto out;
        }
    qsort(idx, f->n, sizeof *idx, cmp_by_offset);
    uint64_t expect = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (idx[i]->begin != expect) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "safetensors %s: tensor '%s' starts at byte %llu, expected %llu "
                               "(tensors must be contiguous and must not overlap)",
                               f->origin, idx[i]->name, (unsigned long long)idx[i]->begin,
                               (unsigned long long)expect);
            goto out;
        }
        expect = idx[i]->end;
    }
    if (expect != f->data_len)
        rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "safetensors %s: tensors cover %llu bytes but the data section has "
                           "%llu",
                           f->origin, (unsigned long long)expect, (unsigned long long)f->data_len);
out:
    free(idx);
    return rc;
}

static pcs_status_t parse_header(pcs_st_file_t *f, const uint8_t *hdr, size_t len)
{
    pcs_status_t rc = PCS_OK;
    hdr_parser_t p;
    memset(&p, 0, sizeof p);
    p.f = f;
    /* The Rust reader requires the header to start with '{'; that also rules out YAML directives
     * and a BOM. Trailing spaces (padding) are allowed. */
    if (len == 0 || hdr[0] != '{')
        return hdr_err(&p, "must start with '{'");
    if (memchr(hdr, 0, len))
        return hdr_err(&p, "contains a NUL byte");
    if (!yaml_parser_initialize(&p.parser))
        return pcs_set_error(PCS_ERR_NOMEM, "safetensors: libyaml init failed");
    yaml_parser_set_input_string(&p.parser, hdr, len);
    PCS_CHECK_GOTO(hdr_next(&p), rc, out);
    if (p.ev.type != YAML_STREAM_START_EVENT) {
        rc = hdr_err(&p, "no stream");
        goto out;
    }
    PCS_CHECK_GOTO(hdr_next(&p), rc, out);
    if (p.ev.type != YAML_DOCUMENT_START_EVENT) {
        rc = hdr_err(&p, "no document");
        goto out;
    }
    PCS_CHECK_GOTO(hdr_next(&p), rc, out);
    if (p.ev.type != YAML_MAPPING_START_EVENT ||
        p.ev.data.mapping_start.style != YAML_FLOW_MAPPING_STYLE) {
        rc = hdr_err(&p, "must be a JSON object");
        goto out;
    }
    int have_meta = 0;
    for (;;) {
        PCS_CHECK_GOTO(hdr_next(&p), rc, out);
        if (p.ev.type == YAML_MAPPING_END_EVENT)
            break;
        if (!ev_is_string(&p.ev)) {
            rc = hdr_err(&p, "object keys must be strings");
            goto out;
        }
        const char *key = (const char *)p.ev.data.scalar.value;
        if (strcmp(key, "__metadata__") == 0) {
            if (have_meta) {
                rc = hdr_err(&p, "__metadata__ repeated");
                goto out;
            }
            have_meta = 1;
            PCS_CHECK_GOTO(hdr_metadata(&p), rc, out);
            continue;
        }
        PCS_CHECK_GOTO(pcs_grow((void **)&f->tensors, &f->cap, f->n + 1, sizeof *f->tensors), rc,
                       out);
        pcs_st_tensor_t *t = &f->tensors[f->n];
        memset(t, 0, sizeof *t);
        PCS_CHECK_GOTO(pcs_strdup(key, (char **)&t->name), rc, out);
        f->n++;
        PCS_CHECK_GOTO(hdr_tensor(&p, t), rc, out);
    }
    PCS_CHECK_GOTO(hdr_next(&p), rc, out);
    if (p.ev.type != YAML_DOCUMENT_END_EVENT) {
        rc = hdr_err(&p, "trailing content");
        goto out;
    }
    PCS_CHECK_GOTO(hdr_next(&p), rc, out);
    if (p.ev.type != YAML_STREAM_END_EVENT) {
        rc = hdr_err(&p, "more than one document");
        goto out;
    }
    rc = check_layout(f);
out:
    if (p.have_ev)
        yaml_event_delete(&p.ev);
    yaml_parser_delete(&p.parser);
    return rc;
}

// ---- open / close ----

static pcs_status_t file_new(const char *origin, pcs_st_file_t **out)
{
    pcs_st_file_t *f = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *f, (void **)&f));
    f->fd = -1;
    pcs_status_t rc = pcs_strdup(origin, &f->origin);
    if (rc != PCS_OK) {
        free(f);
        return rc;
    }
    *out = f;
    return PCS_OK;
}

/* The 8-byte little-endian header length, checked against the limit and the file size. */
static pcs_status_t header_len(const pcs_st_file_t *f, const uint8_t *b, uint64_t size,
                               uint64_t *out)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    /* the value is not printed: those are the first 8 bytes of whatever file a spec named */
    if (n > PCS_ST_MAX_HEADER || n > size - 8)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "safetensors %s: not a safetensors file (its header length does not "
                             "fit the %llu-byte file)",
                             f->origin, (unsigned long long)size);
    *out = n;
    return PCS_OK;
}

pcs_status_t pcs_st_open_mem(const void *buf, size_t len, pcs_st_file_t **out)
{
    pcs_st_file_t *f = NULL;
    pcs_status_t rc;
    if (!out || (!buf && len))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_open_mem: NULL argument");
    *out = NULL;
    PCS_CHECK(file_new("<memory>", &f));
    const uint8_t *b = buf;
    if (len < 8) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "safetensors <memory>: %zu bytes, shorter than "
                           "the 8-byte header length",
                           len);
        goto fail;
    }
    uint64_t n = 0;
    PCS_CHECK_GOTO(header_len(f, b, len, &n), rc, fail);
    f->data_start = 8 + n;
    f->data_len = len - f->data_start;
    PCS_CHECK_GOTO(parse_header(f, b + 8, (size_t)n), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(f->data_len ? f->data_len : 1, 1, (void **)&f->mem), rc, fail);
    if (f->data_len)
        memcpy(f->mem, b + f->data_start, f->data_len);
    *out = f;
    return PCS_OK;
fail:
    pcs_st_close(f);
    return rc;
}

pcs_status_t pcs_st_open(const char *path, pcs_st_file_t **out)
{
    if (!path || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_open: NULL argument");
    *out = NULL;
    int fd = -1;
    /* never blocks in open(2) (a FIFO as init.from must not wedge the worker), regular files only */
    PCS_CHECK(pcs_file_open_read(path, "safetensors", &fd, NULL));
    return pcs_st_open_fd(fd, path, out);
}

pcs_status_t pcs_st_open_at(int dirfd, const char *name, const char *shown, pcs_st_file_t **out)
{
    if (!name || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_open_at: NULL argument");
    *out = NULL;
    int fd = -1;
    PCS_CHECK(pcs_file_open_read_at(dirfd, name, shown, "safetensors", &fd, NULL));
    return pcs_st_open_fd(fd, shown, out);
}

pcs_status_t pcs_st_open_fd(int fd, const char *shown, pcs_st_file_t **out)
{
    pcs_st_file_t *f = NULL;
    uint8_t *hdr = NULL;
    pcs_status_t rc;
    const char *path = shown ? shown : "?";
    if (!out) {
        close(fd);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_open_fd: NULL argument");
    }
    *out = NULL;
    rc = file_new(path, &f);
    if (rc != PCS_OK) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = pcs_set_error(PCS_ERR_SYSTEM, "safetensors %s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    uint8_t lenb[8];
    if (size < 8 || pread(f->fd, lenb, 8, 0) != 8) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "safetensors %s: shorter than the 8-byte header "
                           "length",
                           path);
        goto fail;
    }
    uint64_t n = 0;
    PCS_CHECK_GOTO(header_len(f, lenb, size, &n), rc, fail);
    PCS_CHECK_GOTO(pcs_calloc(n ? n : 1, 1, (void **)&hdr), rc, fail);
    if (n && pread(f->fd, hdr, n, 8) != (ssize_t)n) {
        rc = pcs_set_error(PCS_ERR_SYSTEM, "safetensors %s: short read of the header", path);
        goto fail;
    }
    f->data_start = 8 + n;
    f->data_len = size - f->data_start;
    PCS_CHECK_GOTO(parse_header(f, hdr, (size_t)n), rc, fail);
    free(hdr);
    *out = f;
    return PCS_OK;
fail:
    free(hdr);
    pcs_st_close(f);
    return rc;
}

void pcs_st_close(pcs_st_file_t *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->n; i++)
        free((char *)f->tensors[i].name);
    for (size_t i = 0; i < f->n_meta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->tensors);
    free(f->mem);
    free(f->origin);
    free(f);
}

size_t pcs_st_count(const pcs_st_file_t *f)
{
    return f ? f->n : 0;
}

const pcs_st_tensor_t *pcs_st_tensor(const pcs_st_file_t *f, size_t i)
{
    return f && i < f->n ? &f->tensors[i] : NULL;
}

const pcs_st_tensor_t *pcs_st_find(const pcs_st_file_t *f, const char *name)
{
    if (!f || !name)
        return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *pcs_st_metadata(const pcs_st_file_t *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i + 1 < f->n_meta; i += 2)
        if (strcmp(f->meta[i], key) == 0)
            return f->meta[i + 1];
    return NULL;
}

// ---- reading data ----

pcs_status_t pcs_st_read_raw(pcs_st_file_t *f, const pcs_st_tensor_t *t, uint64_t byte_off,
                             uint64_t nbytes, void *dst)
{
    if (!f || !t || (!dst && nbytes))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_read_raw: NULL argument");
    uint64_t size = t->end - t->begin;
    if (byte_off > size || nbytes > size - byte_off)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "safetensors %s: read of bytes [%llu, +%llu) outside tensor '%s' "
                             "(%llu bytes)",
                             f->origin, (unsigned long long)byte_off, (unsigned long long)nbytes,
                             t->name, (unsigned long long)size);
    if (nbytes == 0)
        return PCS_OK;
    if (f->mem) {
        memcpy(dst, f->mem + t->begin + byte_off, nbytes);
        return PCS_OK;
    }
    uint8_t *d = dst;
    uint64_t pos = f->data_start + t->begin + byte_off;
    while (nbytes) {
        ssize_t r = pread(f->fd, d, nbytes, (off_t)pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return pcs_set_error(PCS_ERR_SYSTEM, "safetensors %s: read of tensor '%s' failed: %s",
                                 f->origin, t->name, r < 0 ? strerror(errno) : "end of file");
        d += r;
        pos += (uint64_t)r;
        nbytes -= (uint64_t)r;
    }
    return PCS_OK;
}

pcs_status_t pcs_st_read_f32(pcs_st_file_t *f, const pcs_st_tensor_t *t, uint64_t first, uint64_t n,
                             float *dst)
{
    if (!f || !t || (!dst && n))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_read_f32: NULL argument");
    if (!pcs_dtype_is_float(t->dtype))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "safetensors %s: tensor '%s' has dtype %s, "
                             "expected a floating dtype (F32, BF16, F16, F64)",
                             f->origin, t->name, t->dtype_str);
    if (first > t->numel || n > t->numel - first)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "safetensors %s: elements [%llu, +%llu) outside "
                             "tensor '%s'",
                             f->origin, (unsigned long long)first, (unsigned long long)n, t->name);
    if (t->dtype == PCS_DTYPE_FP32)
        return pcs_st_read_raw(f, t, first * 4, n * 4, dst);
    /* Convert in chunks through a small stack buffer so that big tensors need no extra heap. */
    uint8_t tmp[8192];
    size_t es = t->elem_size, per = sizeof tmp / es;
    for (uint64_t done = 0; done < n;) {
        size_t k = (size_t)(n - done < per ? n - done : per);
        PCS_CHECK(pcs_st_read_raw(f, t, (first + done) * es, k * es, tmp));
        for (size_t i = 0; i < k; i++) {
            float v;
            if (t->dtype == PCS_DTYPE_FP64) {
                double dv;
                memcpy(&dv, tmp + i * 8, 8);
                v = (float)dv;
            } else {
                uint16_t h;
                memcpy(&h, tmp + i * 2, 2);
                v = t->dtype == PCS_DTYPE_BF16 ? pcs_bf16_to_f32(h) : pcs_fp16_to_f32(h);
            }
            dst[done + i] = v;
        }
        done += k;
    }
    return PCS_OK;
}

// ---- writing ----

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_putn(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (pcs_grow((void **)&b->s, &b->cap, b->len + n + 1, 1) != PCS_OK) {
        b->oom = 1;
        return;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_puts(sbuf_t *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

/* JSON string with the escapes RFC 8259 requires. */
static void sb_json_str(sbuf_t *b, const char *s)
{
    sb_putn(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_putn(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_puts(b, esc);
        } else {
            sb_putn(b, (const char *)&c, 1);
        }
    }
    sb_putn(b, "\"", 1);
}

static pcs_status_t write_all(int fd, const void *buf, size_t n, const char *path)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return pcs_set_error(PCS_ERR_SYSTEM, "safetensors %s: write failed: %s", path,
                                 strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return PCS_OK;
}

pcs_status_t pcs_st_write(const char *path, const pcs_st_entry_t *e, size_t n,
                          const char *const *meta, size_t n_meta)
{
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_write: NULL argument");
    /* an operator's path (export, tools): its directory as given, the file created beside */
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) >= sizeof dir)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "safetensors %s: path too long", path);
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return pcs_set_error(PCS_ERR_SYSTEM, "safetensors %s: directory %s: %s", path, dir,
                             strerror(errno));
    pcs_status_t rc = pcs_st_write_at(dfd, slash ? slash + 1 : path, path, e, n, meta, n_meta);
    close(dfd);
    return rc;
}

pcs_status_t pcs_st_write_at(int dirfd, const char *name, const char *shown,
                             const pcs_st_entry_t *e, size_t n, const char *const *meta,
                             size_t n_meta)
{
    pcs_status_t rc = PCS_OK;
    sbuf_t b = {0};
    char tmp[300] = "";
    int fd = -1;
    const char *path = shown ? shown : name;
    if (!name || !*name || strchr(name, '/') || (!e && n) || (!meta && n_meta))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_st_write_at: bad argument");
    for (size_t i = 0; i < n; i++) {
        if (!e[i].name || !pcs_st_dtype_name(e[i].dtype) || e[i].ndim > PCS_ST_MAX_DIMS ||
            strcmp(e[i].name, "__metadata__") == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "safetensors %s: entry %zu (%s): bad name, "
                                 "dtype or rank",
                                 path, i, e[i].name ? e[i].name : "(null)");
        for (size_t j = 0; j < i; j++)
            if (strcmp(e[i].name, e[j].name) == 0)
                return pcs_set_error(PCS_ERR_INVALID_ARG, "safetensors %s: duplicate tensor '%s'",
                                     path, e[i].name);
    }
    uint64_t off = 0;
    char num[64];
    sb_puts(&b, "{");
    if (n_meta) {
        sb_puts(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i)
                sb_puts(&b, ",");
            sb_json_str(&b, meta[2 * i] ? meta[2 * i] : "");
            sb_puts(&b, ":");
            sb_json_str(&b, meta[2 * i + 1] ? meta[2 * i + 1] : "");
        }
        sb_puts(&b, "}");
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < e[i].ndim; d++)
            numel *= e[i].shape[d];
        uint64_t bytes = numel * pcs_dtype_size(e[i].dtype);
        if (i || n_meta)
            sb_puts(&b, ",");
        sb_json_str(&b, e[i].name);
        sb_puts(&b, ":{\"dtype\":\"");
        sb_puts(&b, pcs_st_dtype_name(e[i].dtype));
        sb_puts(&b, "\",\"shape\":[");
        for (uint32_t d = 0; d < e[i].ndim; d++) {
            snprintf(num, sizeof num, "%s%llu", d ? "," : "", (unsigned long long)e[i].shape[d]);
            sb_puts(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        sb_puts(&b, num);
        off += bytes;
    }
    sb_puts(&b, "}");
    while (!b.oom && b.len % 8)
        sb_puts(&b, " ");
    if (b.oom) {
        rc = pcs_set_error(PCS_ERR_NOMEM, "safetensors %s: out of memory for the header", path);
        goto out;
    }
    /* an exclusive random temp name: a link planted under a predictable one is never written
     * through */
    PCS_CHECK_GOTO(pcs_file_create_temp_at(dirfd, name, tmp, sizeof tmp, &fd), rc, out);
    uint8_t lenb[8];
    uint64_t hl = b.len;
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)(hl >> (8 * i));
    PCS_CHECK_GOTO(write_all(fd, lenb, 8, path), rc, out);
    PCS_CHECK_GOTO(write_all(fd, b.s, b.len, path), rc, out);
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < e[i].ndim; d++)
            numel *= e[i].shape[d];
        size_t bytes = (size_t)(numel * pcs_dtype_size(e[i].dtype));
        if (bytes && !e[i].data) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG, "safetensors %s: tensor '%s' has no data", path,
                               e[i].name);
            goto out;
        }
        PCS_CHECK_GOTO(write_all(fd, e[i].data, bytes, path), rc, out);
    }
    /* fsync, close and rename (it removes the temp itself when that fails) */
    rc = pcs_file_commit_temp_at(dirfd, fd, tmp, name, path);
    fd = -1;
    tmp[0] = '\0';
out:
    if (fd >= 0)
        close(fd);
    if (rc != PCS_OK && tmp[0])
        (void)unlinkat(dirfd, tmp, 0);
    free(b.s);
    return rc;
}
