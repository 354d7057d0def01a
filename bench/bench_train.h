/* The benchmarks that run pcs_train on forked local ranks (pcs-step-bench, pcs-pipe-bench): the
 * Assignment a rank would get from the coordinator, built locally. Not part of any shipped
 * library. */
#ifndef PCS_BENCH_TRAIN_H
#define PCS_BENCH_TRAIN_H

#include "pcs/v1/worker.pb-c.h"
#include "planner/plan.h"

/* Rank `rank` of `world` of spec / plan, every rank on this host; *coords is filled and the
 * assignment points to it, to spec and to plan (none copied). */
static inline void pcs_bench_assignment(Pcs__V1__JobSpec *spec, Pcs__V1__Plan *plan, int world,
                                        int rank, const char *job_id, Pcs__V1__Assignment *as,
                                        Pcs__V1__MeshCoords *coords)
{
    pcs__v1__mesh_coords__init(coords);
    pcs_plan_rank_coords(plan, (uint32_t)rank, coords);
    pcs__v1__assignment__init(as);
    as->job_id = (char *)job_id;
    as->generation = 1;
    as->rank = (uint32_t)rank;
    as->world_size = (uint32_t)world;
    as->local_rank = (uint32_t)rank;
    as->local_world_size = (uint32_t)world;
    as->coords = coords;
    as->spec = spec;
    as->plan = plan;
}

#endif
