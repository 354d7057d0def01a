/* A string-keyed hash map of uint32 values: open addressing with linear probing over a
 * power-of-two table kept at most half full, FNV-1a 64 (pcs/hash.h). The one map of pcs: worker
 * identities and request ids (coordinator), rendezvous keys, module paths and FQNs (planner).
 * Deletion shifts the probe sequence back (no tombstones), so a map under insert/delete churn
 * (the request ids of jobs the coordinator's history forgets) does not degrade.
 *
 * Keys are borrowed by default: the map retains the caller's pointer, which must stay valid and
 * unchanged while the map holds it (typically the key is a field of the record the value indexes).
 * A map made with PCS_STRMAP_OWNED copies every key it stores and frees them in pcs_strmap_free.
 * Not thread-safe; a zeroed pcs_strmap_t is an empty map that borrows its keys. */
#ifndef PCS_STRMAP_H
#define PCS_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_strmap {
    const char **keys; /* cap slots, NULL = empty */
    uint32_t *vals;
    size_t cap, len;
    bool owns_keys;
} pcs_strmap_t;

#define PCS_STRMAP_BORROWED                                                                        \
    {                                                                                              \
        NULL, NULL, 0, 0, false                                                                    \
    }
#define PCS_STRMAP_OWNED                                                                           \
    {                                                                                              \
        NULL, NULL, 0, 0, true                                                                     \
    }

/* Room for `n` keys without growing (an upper bound known up front saves rehashing). */
pcs_status_t pcs_strmap_reserve(pcs_strmap_t *m, size_t n);
/* true and *val (may be NULL) when `key` is in the map. */
bool pcs_strmap_get(const pcs_strmap_t *m, const char *key, uint32_t *val);
/* Insert `key` -> val, or overwrite the value of a key already there (a borrowing map then
 * retains the new pointer). PCS_ERR_NOMEM leaves the map as it was. */
pcs_status_t pcs_strmap_put(pcs_strmap_t *m, const char *key, uint32_t val);
/* Insert only: false (and nothing changes) when `key` is already there. */
pcs_status_t pcs_strmap_add(pcs_strmap_t *m, const char *key, uint32_t val, bool *added);
static inline size_t pcs_strmap_len(const pcs_strmap_t *m)
{
    return m->len;
}
/* Remove `key` (an owning map frees its copy); false when it was not there. */
bool pcs_strmap_del(pcs_strmap_t *m, const char *key);
/* Frees the table (and the keys of an owning map); the map is empty again, same ownership. */
void pcs_strmap_free(pcs_strmap_t *m);

#ifdef __cplusplus
}
#endif
#endif
