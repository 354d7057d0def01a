/* Checked allocation helpers: failures log once and return PCS_ERR_NOMEM (STYLE.md B4). */
#ifndef PCS_MEM_H
#define PCS_MEM_H

#include <stddef.h>
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *out = zeroed n*size bytes (overflow-checked). Caller frees with free(). */
pcs_status_t pcs_calloc(size_t n, size_t size, void **out);
/* *out = copy of s (s may be NULL: *out = NULL). Caller frees with free(). */
pcs_status_t pcs_strdup(const char *s, char **out);
/* Grow *buf (of *cap elements of `size` bytes) to hold at least `need` elements. */
pcs_status_t pcs_grow(void **buf, size_t *cap, size_t need, size_t size);

#ifdef __cplusplus
}
#endif
#endif
