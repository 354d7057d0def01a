/* Point-to-point channels between the pipeline stages of one data-parallel replica (issue 14):
 * activations forward (pp rank r to r + 1, and the last rank to the first when a rank holds
 * several stages) and their gradients backward (r to r - 1, and the first to the last).
 *
 * The schedules (planner/schedule.h) are validated with buffered sends and blocking receives,
 * as torch.distributed.pipelining's isend / irecv with waits at use: a rank that sends an
 * activation goes on to its next action before the receiver asked for it. Gloo's unbound-buffer
 * send is a rendezvous (it completes when the peer has posted the receive), so sends here are
 * copied and handed to a sender thread that sends them in order, and receives block on the
 * caller's thread. Every channel (direction, sender, receiver) is a communicator of its two
 * ranks, used on each side by one thread only (the sender thread at the source, the caller at
 * the destination): no communicator is ever driven by two threads, and the FIFO order of a
 * channel is the order the schedule validator checked.
 *
 * Messages are host memory and travel over Gloo on every backend (a cuda job copies activations
 * to and from the host around them). Not thread-safe: one caller thread. */
#ifndef PCS_WORKER_PIPE_H
#define PCS_WORKER_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "coll/kv.h"
#include "pcs/dtype.h"
#include "pcs/status.h"
#include "pcs/v1/plan.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_pipe pcs_pipe_t;

typedef enum { PCS_PIPE_FWD = 0, PCS_PIPE_BWD = 1 } pcs_pipe_dir_t;

typedef struct pcs_pipe_config {
    const Pcs__V1__Plan *plan; /* pp_size > 1; retained */
    uint32_t rank;             /* global rank */
    pcs_kv_t *kv;              /* rendezvous of the channels; retained */
    const char *job_tag;       /* prefix of the communicator names (as the runtime's) */
    const char *hostname;
    int timeout_ms; /* every send and receive fails after this (0 = 30000) */
} pcs_pipe_config_t;

/* Connect this rank's channels (blocks until each peer joined, or the timeout). */
pcs_status_t pcs_pipe_create(const pcs_pipe_config_t *cfg, pcs_pipe_t **out);
void pcs_pipe_destroy(pcs_pipe_t *p);

uint32_t pcs_pipe_pp_rank(const pcs_pipe_t *p);
uint32_t pcs_pipe_pp_size(const pcs_pipe_t *p);

/* Queue `count` elements of `dt` (copied now) for pp rank `peer` on direction `dir`; returns at
 * once. INVALID_ARG for a peer this rank has no channel to; the first failure of an earlier send
 * (REMOTE, TIMEOUT, CANCELLED, with the sender thread's message) fails every later call. */
pcs_status_t pcs_pipe_send(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, const void *data,
                           size_t count, pcs_dtype_t dt);
/* Receive the next message from pp rank `peer` on `dir` into data (its count and dtype must be
 * the sender's). Blocks until it arrived or the timeout. */
pcs_status_t pcs_pipe_recv(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, void *data,
                           size_t count, pcs_dtype_t dt);
/* Wait until every queued send has been received (end of a step); the first failure. */
pcs_status_t pcs_pipe_flush(pcs_pipe_t *p);
/* Wake blocked sends and receives (any thread). */
void pcs_pipe_abort(pcs_pipe_t *p, const char *reason);
/* After a failure: the global rank a channel blames (pcs_coll_blame), -1 when none does. */
int pcs_pipe_blame(const pcs_pipe_t *p, pcs_coll_fault_t *fault);

#ifdef __cplusplus
}
#endif
#endif
