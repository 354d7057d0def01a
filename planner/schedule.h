/* Pipeline schedules as data (spec fsdp-semantics.md §7, issue 14): for each pp rank the ordered
 * list of actions it runs in one step — forward / backward of a micro-batch on one of its stages,
 * the zero-bubble split of backward into input-gradient (I) and weight-gradient (W), the
 * point-to-point sends and receives of activations and their gradients, and the FSDP actions
 * around them (UNSHARD, RESHARD, REDUCE_GRAD). Generated like torch.distributed.pipelining's
 * ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleLoopedBFS and
 * ScheduleInterleavedZeroBubble (ZB-H1), then validated by executing every rank's list in order
 * against the data dependencies: each stage's micro-batch is computed exactly once, every send
 * has the receive that matches it in order on its channel, no rank waits forever (sends are
 * buffered, receives block: isend/irecv with waits at use), and compute runs only on an unsharded
 * stage, which ends the step resharded. The same execution with unit costs (F = 1, B = 2,
 * I = W = 1, communication free) gives the timeline `pcsctl plan` prints and the bubble fraction.
 *
 * Stage s runs on pp rank s mod pp (rank k holds k, k + pp, ...: virtual stages, as the planner
 * splits layers). Pure: no I/O, no globals. */
#ifndef PCS_PLANNER_SCHEDULE_H
#define PCS_PLANNER_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pcs_sched_kind {
    PCS_SCHED_GPIPE = 0,
    PCS_SCHED_1F1B,
    PCS_SCHED_INTERLEAVED_1F1B,
    PCS_SCHED_LOOPED_BFS,
    PCS_SCHED_ZERO_BUBBLE, /* interleaved_zero_bubble (ZB-H1) */
} pcs_sched_kind_t;

typedef enum pcs_act_kind {
    PCS_ACT_F = 0,       /* forward of (stage, mb) */
    PCS_ACT_B,           /* full backward */
    PCS_ACT_I,           /* backward, input gradient only (zero bubble) */
    PCS_ACT_W,           /* backward, weight gradient only (zero bubble) */
    PCS_ACT_SEND_F,      /* activation of (stage, mb) to stage + 1 on `peer` */
    PCS_ACT_RECV_F,      /* activation for (stage, mb) from stage - 1 on `peer` */
    PCS_ACT_SEND_B,      /* input gradient of (stage, mb) to stage - 1 on `peer` */
    PCS_ACT_RECV_B,      /* output gradient for (stage, mb) from stage + 1 on `peer` */
    PCS_ACT_UNSHARD,     /* all-gather the stage's parameters (FSDP) */
    PCS_ACT_RESHARD,     /* free them */
    PCS_ACT_REDUCE_GRAD, /* reduce the stage's gradients over its data-parallel group */
} pcs_act_kind_t;

typedef struct pcs_action {
    uint8_t kind; /* pcs_act_kind_t */
    uint32_t stage;
    uint32_t mb;   /* micro-batch (unused by UNSHARD, RESHARD, REDUCE_GRAD) */
    uint32_t peer; /* pp rank of the other side of a send / receive */
} pcs_action_t;

typedef struct pcs_schedule {
    pcs_sched_kind_t kind;
    uint32_t pp, v, m, n_stages; /* ranks, stages per rank, micro-batches, pp * v */
    int unshard_per_mb;          /* 1: UNSHARD/RESHARD around every compute action
                                  * (reshard_after_forward true); 0: once per step */
    pcs_action_t **acts;         /* [pp rank][i] */
    size_t *n_acts;
    /* filled by pcs_schedule_validate: start time of each action with unit costs, the step's
     * makespan, and the bubble fraction 1 - busy / (pp * makespan) */
    uint32_t **start;
    uint32_t makespan;
    double bubble;
} pcs_schedule_t;

/* "gpipe" | "1f1b" | "interleaved_1f1b" | "looped_bfs" | "interleaved_zero_bubble"; "" or NULL
 * = 1f1b with one stage per rank, interleaved_1f1b with more. PCS_ERR_INVALID_ARG naming
 * pipeline.schedule otherwise. */
pcs_status_t pcs_sched_parse(const char *name, uint32_t virtual_stages, pcs_sched_kind_t *out);
const char *pcs_sched_name(pcs_sched_kind_t k);

/* Generate and validate the schedule of `kind` for pp ranks, v stages per rank and m
 * micro-batches. PCS_ERR_INVALID_ARG with "pipeline...: reason" for what the schedule does not
 * allow (gpipe / 1f1b with v > 1, interleaved with m not a multiple of its rounds, m == 0, ...)
 * or what fails validation; PCS_ERR_NOMEM. Free with pcs_schedule_free. */
pcs_status_t pcs_schedule_build(pcs_sched_kind_t kind, uint32_t pp, uint32_t v, uint32_t m,
                                int unshard_per_mb, pcs_schedule_t **out);

/* Execute every rank's list against the rules above (a schedule built elsewhere too: tests feed
 * broken ones); fills start / makespan / bubble. PCS_ERR_INVALID_ARG naming the rank, the action
 * and the rule broken (a deadlock names each blocked rank's next action). */
pcs_status_t pcs_schedule_validate(pcs_schedule_t *s);

void pcs_schedule_free(pcs_schedule_t *s);

/* "2F5" (stage 2 forward of micro-batch 5), "1B3", "1I3", "1W3", "SEND_F 2F5>1" ... */
void pcs_action_str(const pcs_action_t *a, char *buf, size_t n);

/* Bubble fraction of GPipe / 1F1B: (pp - 1) / (m + pp - 1). */
double pcs_sched_bubble_1f1b(uint32_t pp, uint32_t m);

#ifdef __cplusplus
}
#endif
#endif
