/* Deterministic init from (seed, FQN) and init-from-safetensors. The RNG is splitmix64 over a
 * counter: O(1) access to any element, no state, identical on every rank (DESIGN.md §5). */
#include "model/init.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pcs/hash.h"
#include "pcs/mem.h"
#include "io/safetensors.h"

uint64_t pcs_rng_u64(uint64_t key, uint64_t counter)
{
    uint64_t z = key + (counter + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float pcs_rng_uniform(uint64_t key, uint64_t counter)
{
    return (float)(pcs_rng_u64(key, counter) >> 40) * (1.0f / 16777216.0f);
}

float pcs_rng_normal(uint64_t key, uint64_t counter)
{
    /* u1 in (0, 1] so that log() is finite. */
    double u1 = ((double)(pcs_rng_u64(key, 2 * counter) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(pcs_rng_u64(key, 2 * counter + 1) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t pcs_rng_key(uint64_t seed, const char *name)
{
    return pcs_rng_u64(seed ^ 0x5ca1ab1e0ddba11ull, pcs_fnv1a64_str(name));
}

void pcs_init_uniform(uint64_t seed, const char *fqn, float lo, float hi, uint64_t first,
                      uint64_t n, float *out)
{
    uint64_t key = pcs_rng_key(seed, fqn);
    float w = hi - lo;
    for (uint64_t i = 0; i < n; i++)
        out[i] = lo + w * pcs_rng_uniform(key, first + i);
}

static void shape_str(char *buf, size_t cap, uint32_t ndim, const uint64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "",
                              (unsigned long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

pcs_status_t pcs_init_from_safetensors(const char *path, const pcs_named_tensor_t *t, size_t n,
                                       float *const *dst, int *loaded)
{
    return pcs_init_from_safetensors_in(NULL, path, t, n, dst, loaded);
}

pcs_status_t pcs_init_from_safetensors_in(const pcs_root_t *root, const char *path,
                                          const pcs_named_tensor_t *t, size_t n, float *const *dst,
                                          int *loaded)
{
    pcs_st_file_t *f = NULL;
    pcs_status_t rc = PCS_OK;
    if (!path || (!t && n) || (!dst && n))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "init.from: NULL argument");
    int fd = -1;
    PCS_CHECK(pcs_root_open_file(root, path, "init.from", &fd, NULL)); /* names the field */
    rc = pcs_st_open_fd(fd, path, &f);
    if (rc != PCS_OK)
        return pcs_set_error(rc, "init.from: %s", pcs_last_error());
    /* Strict: every name in the file must be a model tensor. */
    for (size_t i = 0; i < pcs_st_count(f); i++) {
        const pcs_st_tensor_t *ft = pcs_st_tensor(f, i);
        size_t j;
        for (j = 0; j < n; j++)
            if (strcmp(t[j].fqn, ft->name) == 0)
                break;
        if (j == n) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "init.from %s: unexpected tensor '%s' (not a "
                               "parameter or buffer of the model)",
                               path, ft->name);
            goto out;
        }
    }
    for (size_t j = 0; j < n; j++) {
        const pcs_st_tensor_t *ft = pcs_st_find(f, t[j].fqn);
        if (loaded)
            loaded[j] = ft != NULL;
        if (!ft) {
            if (t[j].is_buffer)
                continue;
            rc = pcs_set_error(PCS_ERR_INVALID_ARG, "init.from %s: missing tensor '%s'", path,
                               t[j].fqn);
            goto out;
        }
        int same = ft->ndim == t[j].ndim;
        for (uint32_t d = 0; same && d < ft->ndim; d++)
            same = ft->shape[d] == t[j].shape[d];
        if (!same) {
            char a[96], b[96];
            shape_str(a, sizeof a, ft->ndim, ft->shape);
            shape_str(b, sizeof b, t[j].ndim, t[j].shape);
            rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "init.from %s: tensor %s: shape %s in file, "
                               "model has %s",
                               path, t[j].fqn, a, b);
            goto out;
        }
        if (ft->dtype != t[j].dtype) {
            rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "init.from %s: tensor %s: dtype %s in file, "
                               "model has %s",
                               path, t[j].fqn, ft->dtype_str,
                               pcs_st_dtype_name(t[j].dtype) ? pcs_st_dtype_name(t[j].dtype)
                                                             : pcs_dtype_name(t[j].dtype));
            goto out;
        }
        if (ft->dtype == PCS_DTYPE_INT64) {
            for (uint64_t e = 0; e < ft->numel; e++) {
                int64_t v;
                PCS_CHECK_GOTO(pcs_st_read_raw(f, ft, e * 8, 8, &v), rc, out);
                dst[j][e] = (float)v;
            }
        } else {
            PCS_CHECK_GOTO(pcs_st_read_f32(f, ft, 0, ft->numel, dst[j]), rc, out);
        }
    }
out:
    pcs_st_close(f);
    return rc;
}
