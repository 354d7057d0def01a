/* Rendezvous key-value store used by the collectives to exchange addresses (Gloo) and unique ids
 * (NCCL). A small vtable with two implementations: the coordinator's KvSet/KvGet RPCs (the real
 * one, scoped by job and generation) and a directory of files (tests and benches that run without
 * a coordinator). Values are opaque bytes; keys are printable, at most PCS_KV_MAX_KEY bytes. */
#ifndef PCS_COLL_KV_H
#define PCS_COLL_KV_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_KV_MAX_KEY   256
#define PCS_KV_MAX_VALUE (64u * 1024u) /* the coordinator's default kv-max-value-bytes */

typedef struct pcs_kv pcs_kv_t;

/* Backend table. get: PCS_OK with *val (malloc'd, caller frees) and *len when the key exists;
 * PCS_ERR_NOT_FOUND when it did not appear within wait_ms (0 = answer at once). */
typedef struct pcs_kv_ops {
    const char *name; /* "file" | "coord" */
    pcs_status_t (*set)(pcs_kv_t *kv, const char *key, const void *val, size_t len);
    pcs_status_t (*get)(pcs_kv_t *kv, const char *key, int wait_ms, void **val, size_t *len);
    void (*destroy)(pcs_kv_t *kv);
} pcs_kv_ops_t;

/* Every implementation embeds this as its first member. */
struct pcs_kv {
    const pcs_kv_ops_t *ops;
};

/* Set `key` to `len` bytes (overwrites). Keys are 1..PCS_KV_MAX_KEY bytes of printable ASCII.
 * Errors: INVALID_ARG for a bad key or a value over PCS_KV_MAX_VALUE, SYSTEM/REMOTE from the
 * backend. Thread-safe. */
pcs_status_t pcs_kv_set(pcs_kv_t *kv, const char *key, const void *val, size_t len);
/* Get `key`, waiting up to wait_ms for it to be set. *val is malloc'd (one extra NUL byte is
 * appended so string values can be read directly); caller frees. NOT_FOUND after the wait.
 * Thread-safe. */
pcs_status_t pcs_kv_get(pcs_kv_t *kv, const char *key, int wait_ms, void **val, size_t *len);
/* Accepts NULL. */
void pcs_kv_destroy(pcs_kv_t *kv);

/* File store: one file per key in `dir` (created if missing), written to a temp name and renamed
 * so readers never see partial values. Works across processes on one host. */
pcs_status_t pcs_kv_file_create(const char *dir, pcs_kv_t **out);

/* Coordinator store: KvSet/KvGet on the coordinator at `target` ("127.0.0.1:7070") in the scope
 * (job_id, generation). rpc_timeout_ms bounds each RPC on top of the requested wait. The store
 * makes its own RPC client. */
pcs_status_t pcs_kv_coord_create(const char *target, const char *job_id, uint64_t generation,
                                 int rpc_timeout_ms, pcs_kv_t **out);
/* Same over a client the caller owns (borrowed: it must outlive the store), so a worker's KV
 * calls share its channel, its credentials and its reconnect settings. */
struct pcs_rpc_client;
pcs_status_t pcs_kv_coord_create_on(struct pcs_rpc_client *client, const char *job_id,
                                    uint64_t generation, int rpc_timeout_ms, pcs_kv_t **out);

#ifdef __cplusplus
}
#endif
#endif
