/* Resharding (issue 13, DESIGN.md §8): which elements of a checkpoint written under one plan
 * (world size W, any strategy and mesh) a rank of another plan (W', the same model) needs, and
 * from which old rank's shard. Parameters are matched by FQN: unit boundaries, shard sizes and
 * the flat layout's padding may all differ. Pure: no I/O (io/checkpoint.c reads the segments). */
#ifndef PCS_PLANNER_RESHARD_H
#define PCS_PLANNER_RESHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"
#include "pcs/v1/plan.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A run of `count` elements: positions [dst, dst + count) of the new rank's shard of new `unit`
 * come from positions [src, src + count) of old rank `src_rank`'s shard of old unit `src_unit`
 * (replica 0 of that shard). Padding of the new shard is in no segment (zeros). */
typedef struct pcs_xfer_seg {
    uint32_t unit;
    uint64_t dst;
    uint32_t src_rank;
    uint32_t src_unit;
    uint64_t src;
    uint64_t count;
} pcs_xfer_seg_t;

/* The segments `rank` of `neu` needs from a checkpoint of `old`, in (unit, dst) order, for the
 * units it holds (pipeline stages: the units of its stages only); *segs is malloc'd (NULL with
 * *n = 0 when none). Either plan may have pipeline stages, pp may differ: a unit's shards come
 * from the ranks of its stage. Errors: PCS_ERR_INVALID_ARG naming the first parameter the two
 * plans disagree on (missing in the checkpoint, another element count), a plan without a valid
 * mesh or a rank out of range. */
pcs_status_t pcs_plan_transfer(const Pcs__V1__Plan *old, const Pcs__V1__Plan *neu, uint32_t rank,
                               pcs_xfer_seg_t **segs, size_t *n);

/* Whether `rank` holds `unit` (true with pp = 1; with pipeline stages the ranks whose pp
 * coordinate is the unit's stage mod pp). */
bool pcs_plan_rank_holds(const Pcs__V1__Plan *p, uint32_t unit, uint32_t rank);

/* Old rank holding replica 0 of shard `shard` of old unit `unit` (the rank files export reads);
 * UINT32_MAX when none does. */
uint32_t pcs_plan_shard_holder(const Pcs__V1__Plan *p, uint32_t unit, uint32_t shard);

/* The shard index of `rank` in unit `unit` (0 for a replicated unit) and its replica index. */
pcs_status_t pcs_plan_rank_shard(const Pcs__V1__Plan *p, uint32_t unit, uint32_t rank,
                                 uint32_t *shard, uint32_t *replica);

#ifdef __cplusplus
}
#endif
#endif
