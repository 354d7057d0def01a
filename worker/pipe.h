/* Point-to-point channels between the pipeline stages of one data-parallel replica (issue 14):
 * activations forward (pp rank r to r + 1, and the last rank to the first when a rank holds
 * several stages) and their gradients backward (r to r - 1, and the first to the last).
 *
 * The schedules (planner/schedule.h) are validated with buffered sends and blocking receives,
 * as torch.distributed.pipelining's isend / irecv with waits at use: a rank that sends an
 * activation goes on to its next action before the receiver asked for it, and a receive posted
 * ahead lets the data land while the receiver still computes. Gloo's unbound-buffer send is a
 * rendezvous (it completes when the peer has posted the receive), so each channel has two
 * threads: at the source a sender thread sends the copied messages in order, at the destination
 * a receiver thread receives the messages the caller posted (pcs_pipe_post: the training loop
 * keeps each channel's next receive posted) into buffers of its own, which pcs_pipe_take hands
 * over. Every channel
 * (direction, sender, receiver) is a communicator of its two ranks driven by one thread at each
 * end, and the FIFO order of a channel is the order the schedule validator checked.
 *
 * A message is the elements, preceded by a header (dtype, element count) when the caller asks
 * for one (both ends must agree: the first message of each stage boundary in a pass): the
 * receiver learns the dtype an activation was produced in and checks the count it expected;
 * later messages of the same key (stage) travel alone, in the dtype the header named.
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

/* Queue `count` fp32 values (copied now, as dtype `dt`: fp32, bf16 or fp16, values exactly
 * representable there) for pp rank `peer` on direction `dir`; returns at once. INVALID_ARG for a
 * peer this rank has no channel to; the first failure of an earlier send (REMOTE, TIMEOUT,
 * CANCELLED, with the sender thread's message) fails every later call. */
pcs_status_t pcs_pipe_send(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, const float *rows,
                           size_t count, pcs_dtype_t dt, int header);
/* Post the receive of the next message from pp rank `peer` on `dir`, of `count` elements: the
 * receiver thread receives it as soon as it arrives (its timeout runs from then: post shortly
 * before the message is needed, not a whole step ahead). `header`: the message has one (the
 * sender's send said so); without one its dtype is the last header's of the same `key` (a
 * stage index below the plan's stage count) on this channel. INVALID_ARG for a peer without a
 * channel or a key out of range. */
pcs_status_t pcs_pipe_post(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, size_t count,
                           uint32_t key, int header);
/* The oldest posted message of (dir, peer), as fp32 values into rows[count] (*dt: the dtype it
 * travelled in, fp32 / bf16 / fp16). Blocks until it arrived; the receiver thread's failure
 * (timeout, dead peer, a count other than the posted one: INVALID_ARG) is returned here, and
 * STATE when nothing was posted. */
pcs_status_t pcs_pipe_take(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, float *rows,
                           size_t count, pcs_dtype_t *dt);
/* Wait until every queued send has been received (end of a step); the first failure. The first
 * failure of any channel aborts every channel of this rank: each later call returns it. */
pcs_status_t pcs_pipe_flush(pcs_pipe_t *p);
/* Wake blocked sends and receives (any thread). */
void pcs_pipe_abort(pcs_pipe_t *p, const char *reason);
/* After a failure: the global rank a channel blames (pcs_coll_blame), -1 when none does. */
int pcs_pipe_blame(const pcs_pipe_t *p, pcs_coll_fault_t *fault);

#ifdef __cplusplus
}
#endif
#endif
