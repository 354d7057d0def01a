/* The rendezvous store's front door: pcs_kv_set / pcs_kv_get validate the key, the value and the
 * arguments once for every implementation (coordinator KV, files), then call the
 * implementation. */
#include <string.h>

#include "coll/kv.h"

/* Keys: 1..PCS_KV_MAX_KEY bytes of printable ASCII. */
static pcs_status_t check_key(const char *key)
{
    if (!key || !key[0])
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: empty key");
    size_t n = strlen(key);
    if (n > PCS_KV_MAX_KEY)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: key of %zu bytes exceeds %d", n,
                             PCS_KV_MAX_KEY);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)key[i];
        if (ch < 0x20 || ch > 0x7e)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: key has a non-printable byte at %zu", i);
    }
    return PCS_OK;
}

pcs_status_t pcs_kv_set(pcs_kv_t *kv, const char *key, const void *val, size_t len)
{
    if (!kv)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: NULL store");
    PCS_CHECK(check_key(key));
    if (len > PCS_KV_MAX_VALUE)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: value of %zu bytes for '%s' exceeds %u", len,
                             key, PCS_KV_MAX_VALUE);
    if (len > 0 && !val)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: NULL value with length %zu", len);
    return kv->ops->set(kv, key, val, len);
}

pcs_status_t pcs_kv_get(pcs_kv_t *kv, const char *key, int wait_ms, void **val, size_t *len)
{
    if (!kv || !val || !len)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv: NULL argument");
    *val = NULL;
    *len = 0;
    PCS_CHECK(check_key(key));
    if (wait_ms < 0)
        wait_ms = 0;
    return kv->ops->get(kv, key, wait_ms, val, len);
}

void pcs_kv_destroy(pcs_kv_t *kv)
{
    if (kv)
        kv->ops->destroy(kv);
}
