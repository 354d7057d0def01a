/* Rendezvous store on the coordinator's KvSet/KvGet RPCs (DESIGN.md §9), scoped by (job id,
 * generation) so that a restarted job never reads the previous generation's addresses. Long
 * waits are split into bounded KvGet calls, so a coordinator restart costs one RPC, not a hang.
 * The only RPC code of the collectives layer; it goes through common/include/pcs/rpc.h. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "coll/kv.h"
#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/rpc.h"
#include "pcs/v1/worker.pb-c.h"

typedef struct kv_coord {
    pcs_kv_t base;
    pcs_rpc_client_t *client;
    bool own_client; /* made here (pcs_kv_coord_create), not borrowed */
    char *job_id;
    uint64_t generation;
    int rpc_timeout_ms;
} kv_coord_t;

/* The coordinator parks a KvGet for at most this long per call (it answers found=false after). */
#define KV_COORD_MAX_WAIT_MS 10000

static pcs_status_t coord_set(pcs_kv_t *kv, const char *key, const void *val, size_t len)
{
    kv_coord_t *c = (kv_coord_t *)kv;
    Pcs__V1__KvSetRequest req = PCS__V1__KV_SET_REQUEST__INIT;
    req.job_id = c->job_id;
    req.generation = c->generation;
    req.key = (char *)key;
    req.value.data = (uint8_t *)val;
    req.value.len = len;
    ProtobufCMessage *resp = NULL;
    pcs_status_t rc =
        pcs_rpc_call(c->client, PCS_M_KV_SET, &req.base, &pcs__v1__kv_set_response__descriptor,
                     c->rpc_timeout_ms, &resp, NULL);
    if (rc != PCS_OK) {
        PCS_WARN(PCS_SUB_BOOTSTRAP, "KvSet '%s' (job %s gen %llu) failed: %s", key, c->job_id,
                 (unsigned long long)c->generation, pcs_last_error());
        return rc;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return PCS_OK;
}

static pcs_status_t coord_get(pcs_kv_t *kv, const char *key, int wait_ms, void **val, size_t *len)
{
    kv_coord_t *c = (kv_coord_t *)kv;
    uint64_t deadline = pcs_now_ms() + (uint64_t)wait_ms;
    for (;;) {
        uint64_t now = pcs_now_ms();
        uint64_t left = deadline > now ? deadline - now : 0;
        if (left > KV_COORD_MAX_WAIT_MS)
            left = KV_COORD_MAX_WAIT_MS;
        Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
        req.job_id = c->job_id;
        req.generation = c->generation;
        req.key = (char *)key;
        req.wait_ms = (uint32_t)left;
        ProtobufCMessage *m = NULL;
        pcs_status_t rc =
            pcs_rpc_call(c->client, PCS_M_KV_GET, &req.base, &pcs__v1__kv_get_response__descriptor,
                         (int)left + c->rpc_timeout_ms, &m, NULL);
        if (rc != PCS_OK) {
            PCS_WARN(PCS_SUB_BOOTSTRAP, "KvGet '%s' (job %s gen %llu) failed: %s", key, c->job_id,
                     (unsigned long long)c->generation, pcs_last_error());
            return rc;
        }
        Pcs__V1__KvGetResponse *resp = (Pcs__V1__KvGetResponse *)m;
        if (resp->found) {
            char *buf = NULL;
            rc = pcs_calloc(resp->value.len + 1, 1, (void **)&buf);
            if (rc == PCS_OK) {
                if (resp->value.len)
                    memcpy(buf, resp->value.data, resp->value.len);
                *val = buf;
                *len = resp->value.len;
            }
            protobuf_c_message_free_unpacked(m, NULL);
            return rc;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (pcs_now_ms() >= deadline)
            return pcs_set_error(PCS_ERR_NOT_FOUND, "kv coord: key '%s' not set within %d ms", key,
                                 wait_ms);
    }
}

static void coord_destroy(pcs_kv_t *kv)
{
    kv_coord_t *c = (kv_coord_t *)kv;
    if (c->own_client)
        pcs_rpc_client_destroy(c->client);
    free(c->job_id);
    free(c);
}

static const pcs_kv_ops_t coord_ops = {"coord", coord_set, coord_get, coord_destroy};

static pcs_status_t kv_coord_new(pcs_rpc_client_t *client, const char *target, const char *job_id,
                                 uint64_t generation, int rpc_timeout_ms, pcs_kv_t **out)
{
    if ((!client && (!target || !target[0])) || !job_id || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv coord: NULL target, job id or out");
    pcs_status_t rc;
    kv_coord_t *c = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    c->base.ops = &coord_ops;
    c->generation = generation;
    c->rpc_timeout_ms = rpc_timeout_ms > 0 ? rpc_timeout_ms : 5000;
    PCS_CHECK_GOTO(pcs_strdup(job_id, &c->job_id), rc, fail);
    if (client) {
        c->client = client;
    } else {
        PCS_CHECK_GOTO(pcs_rpc_client_create(target, &c->client), rc, fail);
        c->own_client = true;
    }
    *out = &c->base;
    return PCS_OK;
fail:
    free(c->job_id);
    free(c);
    return rc;
}

pcs_status_t pcs_kv_coord_create(const char *target, const char *job_id, uint64_t generation,
                                 int rpc_timeout_ms, pcs_kv_t **out)
{
    return kv_coord_new(NULL, target, job_id, generation, rpc_timeout_ms, out);
}

pcs_status_t pcs_kv_coord_create_on(pcs_rpc_client_t *client, const char *job_id,
                                    uint64_t generation, int rpc_timeout_ms, pcs_kv_t **out)
{
    if (!client)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv coord: NULL client");
    return kv_coord_new(client, NULL, job_id, generation, rpc_timeout_ms, out);
}
