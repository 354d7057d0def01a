/* NumPy .npy reader (format versions 1.0, 2.0 and 3.0): parses the header dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (N, D), } and reads row ranges with pread, so
 * that a rank reads only its own rows. C order only; little-endian f2/f4/f8 and i4/i8. */
#ifndef PCS_IO_NPY_H
#define PCS_IO_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_NPY_MAX_DIMS 8

typedef struct pcs_npy {
    char descr[8];     /* "<f4" ... */
    pcs_dtype_t dtype; /* FP32 / FP16 / FP64 / INT64; NONE for int32 (read as int64 only) */
    int is_int;        /* integer element type */
    size_t elem_size;
    uint32_t ndim;
    uint64_t shape[PCS_NPY_MAX_DIMS];
    uint64_t numel;
    uint64_t data_off; /* byte offset of element 0 in the file */
    int fd;
    char *path;
} pcs_npy_t;

/* Open and validate. Errors: PCS_ERR_NOT_FOUND / PCS_ERR_SYSTEM for I/O, PCS_ERR_INVALID_ARG for a
 * malformed or unsupported file (message names the file and the reason). Close with
 * pcs_npy_close(). */
pcs_status_t pcs_npy_open(const char *path, pcs_npy_t **out);
/* The same for an open descriptor (a file resolved beneath a root), which the handle takes over
 * (closed on failure too); `path` is shown in messages. */
pcs_status_t pcs_npy_open_fd(int fd, const char *path, pcs_npy_t **out);
/* Parse just a header image (magic .. end of dict) for validation and fuzzing; `file_size` is the
 * size of the whole file so that the data size can be checked. */
pcs_status_t pcs_npy_parse(const void *buf, size_t len, uint64_t file_size, pcs_npy_t *out);
void pcs_npy_close(pcs_npy_t *a);

/* Elements [first, first+n) converted to fp32 (floating arrays only). */
pcs_status_t pcs_npy_read_f32(pcs_npy_t *a, uint64_t first, uint64_t n, float *dst);
/* Elements [first, first+n) as int64 (integer arrays only). */
pcs_status_t pcs_npy_read_i64(pcs_npy_t *a, uint64_t first, uint64_t n, int64_t *dst);

/* Write a C-order little-endian .npy (version 1.0) of fp32 or int64 data; used by tests and tools.
 */
pcs_status_t pcs_npy_write(const char *path, pcs_dtype_t dtype, uint32_t ndim,
                           const uint64_t *shape, const void *data);

#ifdef __cplusplus
}
#endif
#endif
