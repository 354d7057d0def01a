/* Checked allocation (STYLE.md B4): one WARN on failure, PCS_ERR_NOMEM to the caller. */
#include "pcs/mem.h"
#include "pcs/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

pcs_status_t pcs_calloc(size_t n, size_t size, void **out)
{
    *out = NULL;
    if (size && n > SIZE_MAX / size) {
        PCS_WARN(PCS_SUB_MEM, "allocation of %zu x %zu bytes overflows", n, size);
        return PCS_ERR_NOMEM;
    }
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        PCS_WARN(PCS_SUB_MEM, "out of memory allocating %zu bytes", n * size);
        return PCS_ERR_NOMEM;
    }
    *out = p;
    return PCS_OK;
}

pcs_status_t pcs_strdup(const char *s, char **out)
{
    *out = NULL;
    if (!s)
        return PCS_OK;
    size_t n = strlen(s) + 1;
    void *p;
    PCS_CHECK(pcs_calloc(n, 1, &p));
    memcpy(p, s, n);
    *out = p;
    return PCS_OK;
}

pcs_status_t pcs_grow(void **buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return PCS_OK;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need)
        ncap *= 2;
    if (ncap > SIZE_MAX / size)
        return PCS_ERR_NOMEM;
    void *p = realloc(*buf, ncap * size);
    if (!p) {
        PCS_WARN(PCS_SUB_MEM, "out of memory growing a buffer to %zu elements", ncap);
        return PCS_ERR_NOMEM;
    }
    memset((char *)p + *cap * size, 0, (ncap - *cap) * size);
    *buf = p;
    *cap = ncap;
    return PCS_OK;
}
