/* Shared-memory transport for the ranks of one communicator that share a host (NCCL's SHM
 * transport is the model): each rank owns one POSIX shared-memory segment, a header of
 * progress counters plus two staging slots, and maps every peer's. A collective runs in rounds of
 * at most one slot per rank: every rank copies (and for reductions, prepares: pre-divide, AVG
 * multiplier) its piece into its slot and publishes the round; readers copy or reduce straight
 * out of the peers' slots and mark the round done; the two slots alternate so that a rank fills
 * round R+1 while its peers still read round R. Waits spin briefly, then sleep on a futex in the
 * shared page, in slices that re-check the peer's liveness (its pid), its state (it left or
 * aborted) and the caller's cancel flag, until the per-wait timeout.
 *
 * Numerics are bit-identical to the Gloo backend's ring (coll.h): the owner of chunk k reduces
 * it as acc = x[k+1]; acc = rnd(x[j] op acc) for j = k+2, ..., k (the ring's operand order, so
 * MAX with signed zeros agrees too); all_reduce splits into the ring's chunks and all-gathers
 * the owners' results.
 *
 * Used by coll_gloo.cc when every rank of a communicator has the same locality key (host id,
 * boot id, IPC/PID/mount/net namespaces, uid) and every rank could create and map the segments;
 * otherwise the communicator stays on TCP. Not thread-safe except pcs_shm_leave(). */
#ifndef PCS_COLL_SHM_H
#define PCS_COLL_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "pcs/dtype.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_SHM_MAX_RANKS  64
#define PCS_SHM_SLOT_BYTES (1u << 20) /* per slot; two slots per rank */

typedef struct pcs_shm pcs_shm_t;

/* Why an operation failed when a peer is involved. */
typedef enum pcs_shm_fault {
    PCS_SHM_OK = 0,
    PCS_SHM_DIED = 1,      /* the peer's process is gone (or a zombie) */
    PCS_SHM_SILENT = 2,    /* the peer made no progress within the timeout */
    PCS_SHM_LEFT = 3,      /* the peer aborted or gave up (its failure note says why) */
    PCS_SHM_CANCELLED = 4, /* this rank's cancel callback said stop */
    PCS_SHM_MISMATCH = 5   /* the peer runs another operation (kind, dtype or count) */
} pcs_shm_fault_t;

typedef struct pcs_shm_fail {
    int peer; /* -1 when no peer is to blame */
    pcs_shm_fault_t fault;
} pcs_shm_fail_t;

/* Nonzero = stop waiting (checked between sleep slices). */
typedef int (*pcs_shm_cancel_fn)(void *arg);

/* This process's locality key: ranks with equal keys may share memory. PCS_HOST_ID (like
 * NCCL_HOSTID) replaces the hostname and boot id; the namespaces and uid are always part of it. */
void pcs_shm_locality(char *out, size_t cap);

/* Create this rank's segment (shm_open + posix_fallocate, mode 0600, a unique name). Errors:
 * INVALID_ARG (size over PCS_SHM_MAX_RANKS), SYSTEM (no /dev/shm space, permissions). */
pcs_status_t pcs_shm_create(int rank, int size, int timeout_ms, pcs_shm_t **out);
const char *pcs_shm_name(const pcs_shm_t *s);
/* Map peer `peer`'s segment `name` and check its header (rank, size, version). */
pcs_status_t pcs_shm_attach(pcs_shm_t *s, int peer, const char *name);
/* Remove this rank's name from /dev/shm (peers that attached keep their mapping). Idempotent. */
void pcs_shm_unlink(pcs_shm_t *s);
void pcs_shm_set_cancel(pcs_shm_t *s, pcs_shm_cancel_fn fn, void *arg);
/* Tell the peers this rank stopped: aborted (1: peers fail with PCS_SHM_LEFT) or closed (0: a
 * normal destroy; a peer still waiting fails with PCS_SHM_LEFT as well). Any thread. */
void pcs_shm_leave(pcs_shm_t *s, int aborted);
/* Unmap everything and unlink if still linked. Accepts NULL. */
void pcs_shm_destroy(pcs_shm_t *s);

/* The collectives (arguments already validated by coll.c; size > 1). On failure *fail says whom
 * to blame and the status carries a message naming the peer. */
pcs_status_t pcs_shm_all_gather(pcs_shm_t *s, const void *in, void *out, size_t bytes,
                                pcs_shm_fail_t *fail);
pcs_status_t pcs_shm_broadcast(pcs_shm_t *s, void *buf, size_t bytes, int root,
                               pcs_shm_fail_t *fail);
pcs_status_t pcs_shm_reduce_scatter(pcs_shm_t *s, const void *in, void *out, size_t recv_count,
                                    pcs_dtype_t dt, const pcs_coll_red_t *red,
                                    pcs_shm_fail_t *fail);
pcs_status_t pcs_shm_all_reduce(pcs_shm_t *s, const void *in, void *out, size_t count,
                                pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_shm_fail_t *fail);

#ifdef __cplusplus
}
#endif
#endif
