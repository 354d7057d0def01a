/* String -> uint32 map (see pcs/strmap.h). Linear probing; the table doubles when it would pass
 * half full, so a probe sequence always ends at an empty slot. */
#include "pcs/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "pcs/hash.h"
#include "pcs/mem.h"

/* The slot of `key`: where it is, or the empty slot where it would go. */
static size_t slot_of(const pcs_strmap_t *m, const char *key)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)pcs_fnv1a64_str(key) & mask;
    while (m->keys[i] && strcmp(m->keys[i], key) != 0)
        i = (i + 1) & mask;
    return i;
}

static pcs_status_t rehash(pcs_strmap_t *m, size_t cap)
{
    pcs_strmap_t n = {NULL, NULL, cap, 0, m->owns_keys};
    PCS_CHECK(pcs_calloc(cap, sizeof *n.keys, (void **)&n.keys));
    pcs_status_t st = pcs_calloc(cap, sizeof *n.vals, (void **)&n.vals);
    if (st != PCS_OK) {
        free(n.keys);
        return st;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = slot_of(&n, m->keys[i]);
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
        n.len++;
    }
    free(m->keys);
    free(m->vals);
    *m = n;
    return PCS_OK;
}

pcs_status_t pcs_strmap_reserve(pcs_strmap_t *m, size_t n)
{
    size_t cap = m->cap ? m->cap : 16;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 4)
            return pcs_set_error(PCS_ERR_NOMEM, "string map: %zu keys is too many", n);
        cap *= 2;
    }
    return cap == m->cap ? PCS_OK : rehash(m, cap);
}

bool pcs_strmap_get(const pcs_strmap_t *m, const char *key, uint32_t *val)
{
    if (!m->cap)
        return false;
    size_t i = slot_of(m, key);
    if (!m->keys[i])
        return false;
    if (val)
        *val = m->vals[i];
    return true;
}

/* Store into slot i (empty or holding an equal key). */
static pcs_status_t store(pcs_strmap_t *m, size_t i, const char *key, uint32_t val)
{
    const char *k = key;
    if (m->owns_keys) {
        if (m->keys[i]) { /* an owning map keeps the copy it has */
            m->vals[i] = val;
            return PCS_OK;
        }
        char *copy;
        PCS_CHECK(pcs_strdup(key, &copy));
        k = copy;
    }
    if (!m->keys[i])
        m->len++;
    m->keys[i] = k;
    m->vals[i] = val;
    return PCS_OK;
}

pcs_status_t pcs_strmap_add(pcs_strmap_t *m, const char *key, uint32_t val, bool *added)
{
    *added = false;
    PCS_CHECK(pcs_strmap_reserve(m, m->len + 1));
    size_t i = slot_of(m, key);
    if (m->keys[i])
        return PCS_OK;
    PCS_CHECK(store(m, i, key, val));
    *added = true;
    return PCS_OK;
}

pcs_status_t pcs_strmap_put(pcs_strmap_t *m, const char *key, uint32_t val)
{
    PCS_CHECK(pcs_strmap_reserve(m, m->len + 1));
    return store(m, slot_of(m, key), key, val);
}

bool pcs_strmap_del(pcs_strmap_t *m, const char *key)
{
    if (!m->cap)
        return false;
    size_t mask = m->cap - 1, i = slot_of(m, key);
    if (!m->keys[i])
        return false;
    if (m->owns_keys)
        free((char *)m->keys[i]);
    m->keys[i] = NULL;
    m->len--;
    /* Backward shift: a later key of the same run moves into the hole unless its home slot lies
     * cyclically in (hole, its slot], where the hole does not interrupt its probe sequence. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = (size_t)pcs_fnv1a64_str(m->keys[j]) & mask;
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        m->keys[j] = NULL;
        i = j;
    }
    return true;
}

void pcs_strmap_free(pcs_strmap_t *m)
{
    if (m->owns_keys)
        for (size_t i = 0; i < m->cap; i++)
            free((char *)m->keys[i]);
    free(m->keys);
    free(m->vals);
    bool owns = m->owns_keys;
    memset(m, 0, sizeof *m);
    m->owns_keys = owns;
}
