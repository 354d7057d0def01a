/* .npy reader/writer. The header is a Python dict literal, which neither libyaml nor any other
 * project dependency parses (single quotes, tuples, True/False), so this file has a tiny scanner
 * for exactly the three keys NumPy writes. Anything else is rejected with a message naming the
 * file; nothing here trusts the header's sizes without checking them against the file size. */
#include "io/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pcs/file.h"
#include "pcs/half.h"
#include "pcs/mem.h"

static pcs_status_t npy_err(const char *path, const char *why)
{
    return pcs_set_error(PCS_ERR_INVALID_ARG, "npy %s: %s", path ? path : "<memory>", why);
}

static void skip_ws(const char **p, const char *end)
{
    while (*p < end && (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r'))
        (*p)++;
}

static int eat(const char **p, const char *end, char c)
{
    skip_ws(p, end);
    if (*p < end && **p == c) {
        (*p)++;
        return 1;
    }
    return 0;
}

/* A quoted Python string ('..' or ".."), no escapes (NumPy never writes any). */
static int read_str(const char **p, const char *end, char *out, size_t cap)
{
    skip_ws(p, end);
    if (*p >= end || (**p != '\'' && **p != '"'))
        return 0;
    char q = **p;
    (*p)++;
    size_t n = 0;
    while (*p < end && **p != q) {
        if (**p == '\\' || n + 1 >= cap)
            return 0;
        out[n++] = **p;
        (*p)++;
    }
    if (*p >= end)
        return 0;
    (*p)++;
    out[n] = 0;
    return 1;
}

static int read_uint(const char **p, const char *end, uint64_t *v)
{
    skip_ws(p, end);
    if (*p >= end || **p < '0' || **p > '9')
        return 0;
    uint64_t x = 0;
    while (*p < end && **p >= '0' && **p <= '9') {
        uint64_t d = (uint64_t)(**p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return 0;
        x = x * 10 + d;
        (*p)++;
    }
    /* NumPy on some platforms wrote 3L in Python 2; accept the suffix. */
    if (*p < end && **p == 'L')
        (*p)++;
    *v = x;
    return 1;
}

static pcs_status_t parse_descr(const char *path, const char *d, pcs_npy_t *a)
{
    char bo = d[0];
    if (strlen(d) != 3 || (bo != '<' && bo != '|' && bo != '='))
        return npy_err(path, "only little-endian f2/f4/f8/i4/i8 arrays are supported");
    char kind = d[1], sz = d[2];
    snprintf(a->descr, sizeof a->descr, "%s", d);
    if (kind == 'f' && sz == '4') {
        a->dtype = PCS_DTYPE_FP32, a->elem_size = 4;
    } else if (kind == 'f' && sz == '2') {
        a->dtype = PCS_DTYPE_FP16, a->elem_size = 2;
    } else if (kind == 'f' && sz == '8') {
        a->dtype = PCS_DTYPE_FP64, a->elem_size = 8;
    } else if (kind == 'i' && sz == '8') {
        a->dtype = PCS_DTYPE_INT64, a->elem_size = 8, a->is_int = 1;
    } else if (kind == 'i' && sz == '4') {
        a->dtype = PCS_DTYPE_NONE, a->elem_size = 4, a->is_int = 1;
    } else {
        char msg[96];
        snprintf(msg, sizeof msg, "unsupported descr '%s' (want <f2, <f4, <f8, <i4 or <i8)", d);
        return npy_err(path, msg);
    }
    return PCS_OK;
}

static pcs_status_t parse_impl(const char *path, const uint8_t *b, size_t len, uint64_t file_size,
                               pcs_npy_t *a)
{
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return npy_err(path, "bad magic (not a .npy file)");
    uint8_t major = b[6];
    uint64_t hlen, pre;
    if (major == 1) {
        hlen = (uint64_t)b[8] | ((uint64_t)b[9] << 8);
        pre = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return npy_err(path, "truncated header");
        hlen = (uint64_t)b[8] | ((uint64_t)b[9] << 8) | ((uint64_t)b[10] << 16) |
               ((uint64_t)b[11] << 24);
        pre = 12;
    } else {
        return npy_err(path, "unsupported format version");
    }
    if (hlen > len - pre)
        return npy_err(path, "header length exceeds the file");
    const char *p = (const char *)b + pre, *end = p + hlen;
    char key[32], val[32];
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!eat(&p, end, '{'))
        return npy_err(path, "header is not a dict");
    while (!eat(&p, end, '}')) {
        if (!read_str(&p, end, key, sizeof key) || !eat(&p, end, ':'))
            return npy_err(path, "malformed header dict");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (!read_str(&p, end, val, sizeof val))
                return npy_err(path, "descr must be a string");
            PCS_CHECK(parse_descr(path, val, a));
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            skip_ws(&p, end);
            if ((size_t)(end - p) >= 5 && memcmp(p, "False", 5) == 0)
                p += 5;
            else if ((size_t)(end - p) >= 4 && memcmp(p, "True", 4) == 0)
                return npy_err(path, "fortran_order arrays are not supported; save C order");
            else
                return npy_err(path, "fortran_order must be False or True");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (!eat(&p, end, '('))
                return npy_err(path, "shape must be a tuple");
            a->ndim = 0;
            while (!eat(&p, end, ')')) {
                uint64_t v;
                if (a->ndim >= PCS_NPY_MAX_DIMS || !read_uint(&p, end, &v))
                    return npy_err(path, "shape must be a tuple of at most 8 integers");
                a->shape[a->ndim++] = v;
                if (!eat(&p, end, ',')) {
                    if (!eat(&p, end, ')'))
                        return npy_err(path, "malformed shape tuple");
                    break;
                }
            }
            have_shape = 1;
        } else {
            return npy_err(path, "unexpected or repeated header key");
        }
        if (!eat(&p, end, ',')) {
            if (!eat(&p, end, '}'))
                return npy_err(path, "malformed header dict");
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return npy_err(path, "header needs descr, fortran_order and shape");
    uint64_t numel = 1;
    for (uint32_t i = 0; i < a->ndim; i++)
        if (__builtin_mul_overflow(numel, a->shape[i], &numel))
            return npy_err(path, "shape overflows");
    a->numel = numel;
    a->data_off = pre + hlen;
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)a->elem_size, &bytes) || file_size < a->data_off ||
        file_size - a->data_off < bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "file holds fewer bytes than shape x %s needs", a->descr);
        return npy_err(path, msg);
    }
    return PCS_OK;
}

pcs_status_t pcs_npy_parse(const void *buf, size_t len, uint64_t file_size, pcs_npy_t *out)
{
    if (!buf || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_parse: NULL argument");
    memset(out, 0, sizeof *out);
    out->fd = -1;
    return parse_impl(NULL, buf, len, file_size, out);
}

pcs_status_t pcs_npy_open(const char *path, pcs_npy_t **out)
{
    if (!path || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_open: NULL argument");
    *out = NULL;
    int fd = -1;
    PCS_CHECK(pcs_file_open_read(path, "npy", &fd, NULL)); /* a FIFO must not wedge the worker */
    return pcs_npy_open_fd(fd, path, out);
}

pcs_status_t pcs_npy_open_fd(int fd, const char *path, pcs_npy_t **out)
{
    pcs_status_t rc;
    pcs_npy_t *a = NULL;
    uint8_t *hdr = NULL;
    if (!out || !path) {
        close(fd);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_open_fd: NULL argument");
    }
    *out = NULL;
    rc = pcs_calloc(1, sizeof *a, (void **)&a);
    if (rc != PCS_OK) {
        close(fd);
        return rc;
    }
    a->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = pcs_set_error(PCS_ERR_SYSTEM, "npy %s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    PCS_CHECK_GOTO(pcs_strdup(path, &a->path), rc, fail);
    /* Headers are small (NumPy pads them to 64 bytes; v2 allows up to 4 GiB but nobody writes
     * that): read at most 1 MiB and let the parser report a header that is longer. */
    size_t want = fsize < (1u << 20) ? (size_t)fsize : (1u << 20);
    PCS_CHECK_GOTO(pcs_calloc(want ? want : 1, 1, (void **)&hdr), rc, fail);
    if (pread(a->fd, hdr, want, 0) != (ssize_t)want) {
        rc = pcs_set_error(PCS_ERR_SYSTEM, "npy %s: short read", path);
        goto fail;
    }
    PCS_CHECK_GOTO(parse_impl(path, hdr, want, fsize, a), rc, fail);
    free(hdr);
    *out = a;
    return PCS_OK;
fail:
    free(hdr);
    pcs_npy_close(a);
    return rc;
}

void pcs_npy_close(pcs_npy_t *a)
{
    if (!a)
        return;
    if (a->fd >= 0)
        close(a->fd);
    free(a->path);
    free(a);
}

static pcs_status_t read_bytes(pcs_npy_t *a, uint64_t off, size_t n, void *dst)
{
    uint8_t *d = dst;
    while (n) {
        ssize_t r = pread(a->fd, d, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return pcs_set_error(PCS_ERR_SYSTEM, "npy %s: read failed: %s", a->path,
                                 r < 0 ? strerror(errno) : "end of file");
        d += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return PCS_OK;
}

static pcs_status_t check_range(pcs_npy_t *a, uint64_t first, uint64_t n)
{
    if (first > a->numel || n > a->numel - first)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "npy %s: elements [%llu, +%llu) outside the "
                             "array of %llu",
                             a->path, (unsigned long long)first, (unsigned long long)n,
                             (unsigned long long)a->numel);
    return PCS_OK;
}

pcs_status_t pcs_npy_read_f32(pcs_npy_t *a, uint64_t first, uint64_t n, float *dst)
{
    if (!a || (!dst && n))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_read_f32: NULL argument");
    if (a->is_int)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "npy %s: %s is an integer array, expected "
                             "floating point",
                             a->path, a->descr);
    PCS_CHECK(check_range(a, first, n));
    if (a->dtype == PCS_DTYPE_FP32)
        return read_bytes(a, a->data_off + first * 4, (size_t)n * 4, dst);
    uint8_t tmp[8192];
    size_t es = a->elem_size, per = sizeof tmp / es;
    for (uint64_t done = 0; done < n;) {
        size_t k = (size_t)(n - done < per ? n - done : per);
        PCS_CHECK(read_bytes(a, a->data_off + (first + done) * es, k * es, tmp));
        for (size_t i = 0; i < k; i++) {
            if (a->dtype == PCS_DTYPE_FP64) {
                double v;
                memcpy(&v, tmp + 8 * i, 8);
                dst[done + i] = (float)v;
            } else {
                uint16_t h;
                memcpy(&h, tmp + 2 * i, 2);
                dst[done + i] = pcs_fp16_to_f32(h);
            }
        }
        done += k;
    }
    return PCS_OK;
}

pcs_status_t pcs_npy_read_i64(pcs_npy_t *a, uint64_t first, uint64_t n, int64_t *dst)
{
    if (!a || (!dst && n))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_read_i64: NULL argument");
    if (!a->is_int)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "npy %s: %s is not an integer array", a->path,
                             a->descr);
    PCS_CHECK(check_range(a, first, n));
    if (a->elem_size == 8)
        return read_bytes(a, a->data_off + first * 8, (size_t)n * 8, dst);
    int32_t tmp[2048];
    for (uint64_t done = 0; done < n;) {
        size_t k = (size_t)(n - done < 2048 ? n - done : 2048);
        PCS_CHECK(read_bytes(a, a->data_off + (first + done) * 4, k * 4, tmp));
        for (size_t i = 0; i < k; i++)
            dst[done + i] = tmp[i];
        done += k;
    }
    return PCS_OK;
}

pcs_status_t pcs_npy_write(const char *path, pcs_dtype_t dtype, uint32_t ndim,
                           const uint64_t *shape, const void *data)
{
    const char *descr = dtype == PCS_DTYPE_FP32 ? "<f4" : dtype == PCS_DTYPE_INT64 ? "<i8" : NULL;
    if (!path || !descr || ndim > PCS_NPY_MAX_DIMS || (ndim && !shape))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_npy_write: bad argument");
    char dict[256];
    int n =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%llu%s", (unsigned long long)shape[i],
                      ndim == 1 || i + 1 < ndim ? ", " : "");
        numel *= shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad with spaces so that magic + len + dict + '\n' is a multiple of 64 (NumPy's rule). */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return pcs_set_error(PCS_ERR_SYSTEM, "npy %s: %s", path, strerror(errno));
    uint8_t pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(hlen & 0xff), (uint8_t)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, fp) == 10 && fwrite(dict, 1, (size_t)n, fp) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    ok = ok &&
         fwrite(data, 8 / (dtype == PCS_DTYPE_FP32 ? 2 : 1), (size_t)numel, fp) == (size_t)numel;
    if (fclose(fp) != 0)
        ok = 0;
    if (!ok)
        return pcs_set_error(PCS_ERR_SYSTEM, "npy %s: write failed", path);
    return PCS_OK;
}
