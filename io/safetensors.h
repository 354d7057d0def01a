/* safetensors read/write (https://github.com/huggingface/safetensors format): an 8-byte
 * little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"},
 * "__metadata__": {str: str}}, then the raw little-endian tensor bytes. Used for init-from-file,
 * file data and exporting final parameters that torch / Hugging Face load directly. The reader
 * validates as strictly as the Rust reference (contiguous, non-overlapping, fully covered data). */
#ifndef PCS_IO_SAFETENSORS_H
#define PCS_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_ST_MAX_DIMS 8
/* Largest accepted header (the Rust reader's limit). */
#define PCS_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct pcs_st_tensor {
    const char *name;   /* owned by the file handle */
    char dtype_str[12]; /* as written: "F32", "BF16", "I32", ... */
    pcs_dtype_t dtype;  /* PCS_DTYPE_NONE for valid safetensors dtypes pcs does not compute in */
    size_t elem_size;   /* bytes per element of dtype_str */
    uint32_t ndim;
    uint64_t shape[PCS_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* byte range in the data section (after the header) */
} pcs_st_tensor_t;

typedef struct pcs_st_file pcs_st_file_t;

/* Open and validate a file. Errors: PCS_ERR_NOT_FOUND / PCS_ERR_SYSTEM (I/O),
 * PCS_ERR_INVALID_ARG (malformed; pcs_last_error() names the file and the rule broken).
 * Caller closes with pcs_st_close(). The handle is not thread-safe for concurrent reads. */
pcs_status_t pcs_st_open(const char *path, pcs_st_file_t **out);
/* The same for `name` in dirfd, never through a symlink (a checkpoint's own files); `shown` is
 * the path in messages. */
pcs_status_t pcs_st_open_at(int dirfd, const char *name, const char *shown, pcs_st_file_t **out);
/* The same for an open descriptor (a file resolved beneath a root), which the handle takes over
 * (closed on failure too). */
pcs_status_t pcs_st_open_fd(int fd, const char *shown, pcs_st_file_t **out);
/* Validate an in-memory file image (copied: `buf` is borrowed for the call only). Same errors. */
pcs_status_t pcs_st_open_mem(const void *buf, size_t len, pcs_st_file_t **out);
/* Accepts NULL. */
void pcs_st_close(pcs_st_file_t *f);

size_t pcs_st_count(const pcs_st_file_t *f);
/* Tensors in header order. i < pcs_st_count(). */
const pcs_st_tensor_t *pcs_st_tensor(const pcs_st_file_t *f, size_t i);
/* NULL if absent. */
const pcs_st_tensor_t *pcs_st_find(const pcs_st_file_t *f, const char *name);
/* Value of a "__metadata__" key, NULL if absent. */
const char *pcs_st_metadata(const pcs_st_file_t *f, const char *key);

/* Copy `nbytes` raw bytes starting `byte_off` bytes into tensor `t`'s data into dst.
 * Range outside the tensor -> PCS_ERR_INVALID_ARG; read failures -> PCS_ERR_SYSTEM. */
pcs_status_t pcs_st_read_raw(pcs_st_file_t *f, const pcs_st_tensor_t *t, uint64_t byte_off,
                             uint64_t nbytes, void *dst);
/* Elements [first, first+n) of a floating tensor (F32, F16, BF16, F64) converted to fp32 (F64 is
 * rounded to nearest). Other dtypes -> PCS_ERR_INVALID_ARG naming the tensor. */
pcs_status_t pcs_st_read_f32(pcs_st_file_t *f, const pcs_st_tensor_t *t, uint64_t first, uint64_t n,
                             float *dst);

/* One tensor to write. `data` holds numel * pcs_dtype_size(dtype) little-endian bytes. */
typedef struct pcs_st_entry {
    const char *name;
    pcs_dtype_t dtype; /* FP32, BF16, FP16, FP64 or INT64 */
    uint32_t ndim;     /* 0 = scalar */
    const uint64_t *shape;
    const void *data;
} pcs_st_entry_t;

/* Write `n` tensors (data in the given order, header keys as given) and `n_meta` metadata pairs
 * (meta[2i] = key, meta[2i+1] = value) to `path` atomically (temp file + rename). The header is
 * padded with spaces to a multiple of 8 bytes, as the reference writer does. Duplicate names or
 * bad dtypes -> PCS_ERR_INVALID_ARG; I/O -> PCS_ERR_SYSTEM. */
pcs_status_t pcs_st_write(const char *path, const pcs_st_entry_t *e, size_t n,
                          const char *const *meta, size_t n_meta);

/* pcs_st_write of `name` (one path component) in dirfd: the temp file is created exclusively under
 * a random name and renamed over `name`, so no link there or at a temp name is written through.
 * `shown` is the path in messages. */
pcs_status_t pcs_st_write_at(int dirfd, const char *name, const char *shown,
                             const pcs_st_entry_t *e, size_t n, const char *const *meta,
                             size_t n_meta);

/* "F32" etc. for a pcs dtype; NULL if it has no safetensors name. */
const char *pcs_st_dtype_name(pcs_dtype_t t);

#ifdef __cplusplus
}
#endif
#endif
