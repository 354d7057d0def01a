/* The device mesh: named dimensions (pp, dp_replicate, dp_shard) given outer to inner, ranks
 * numbered row-major over them exactly like torch.distributed.init_device_mesh (the innermost
 * dimension varies fastest). The only home of rank <-> coordinates <-> group arithmetic
 * (DESIGN.md §3): the coordinator's assignments, the planner's groups and estimates, the worker's
 * communicators and data rank, the C API and `pcsctl plan` all call these. Pure: no allocation,
 * no I/O, no globals; every function is thread-safe. O(dims) per call, never O(world). */
#ifndef PCS_PLANNER_MESH_H
#define PCS_PLANNER_MESH_H

#include <stdint.h>

#include "pcs/status.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_MESH_MAX_DIMS 3

/* Dimension names: the values of pcs.v1.MeshDimName. Coordinates are indexed by them ([0] is
 * unused), so a dimension the mesh does not name has coordinate 0 and size 1. */
typedef enum pcs_mesh_dim {
    PCS_MESH_PP = PCS__V1__MESH_DIM_NAME__MESH_DIM_PP,
    PCS_MESH_DP_REPLICATE = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_REPLICATE,
    PCS_MESH_DP_SHARD = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD,
} pcs_mesh_dim_t;

/* A set of dimensions, for the groups below: bit (1u << dim). */
#define PCS_MESH_VARY(dim) (1u << (unsigned)(dim))
#define PCS_MESH_VARY_ALL                                                                          \
    (PCS_MESH_VARY(PCS_MESH_PP) | PCS_MESH_VARY(PCS_MESH_DP_REPLICATE) |                           \
     PCS_MESH_VARY(PCS_MESH_DP_SHARD))

typedef struct pcs_mesh {
    uint32_t n;                      /* dimensions, outer to inner */
    uint32_t dim[PCS_MESH_MAX_DIMS]; /* pcs_mesh_dim_t values */
    uint32_t size[PCS_MESH_MAX_DIMS];
    uint32_t stride[PCS_MESH_MAX_DIMS]; /* rank distance between neighbours along dim[i] */
    uint32_t world;                     /* product of the sizes */
} pcs_mesh_t;

/* A mesh of n dimensions named dims[i] (pcs_mesh_dim_t values) with sizes[i], outer to inner.
 * Errors (PCS_ERR_INVALID_ARG, naming the field): no dimension, more than PCS_MESH_MAX_DIMS, an
 * unknown or repeated name, a size of 0, a product that does not fit uint32. A service caps the
 * world size further (the coordinator: PCS_COORD_MAX_WORLD). */
pcs_status_t pcs_mesh_init(uint32_t n, const uint32_t *dims, const uint32_t *sizes,
                           pcs_mesh_t *out);
/* The mesh of a job spec (spec->mesh, as the user ordered it); errors as pcs_mesh_init. */
pcs_status_t pcs_mesh_from_spec(const Pcs__V1__JobSpec *spec, pcs_mesh_t *out);
/* The mesh of a plan (plan->mesh); PCS_ERR_INVALID_ARG also when its product is not the plan's
 * world size (a plan from the wire is not trusted). */
pcs_status_t pcs_mesh_from_plan(const Pcs__V1__Plan *plan, pcs_mesh_t *out);

/* Size of dimension `dim` (1 when the mesh does not name it). */
uint32_t pcs_mesh_size(const pcs_mesh_t *m, pcs_mesh_dim_t dim);

/* coords[dim] of `rank` (rank < m->world), indexed by pcs_mesh_dim_t; unnamed dims get 0. */
void pcs_mesh_coords(const pcs_mesh_t *m, uint32_t rank, uint32_t coords[4]);
/* Inverse of pcs_mesh_coords: UINT32_MAX when a coordinate is out of range (an unnamed dim's
 * coordinate must be 0). */
uint32_t pcs_mesh_rank(const pcs_mesh_t *m, const uint32_t coords[4]);

/* `rank`'s group over the dimensions in `vary` (a PCS_MESH_VARY mask): the ranks that share
 * every other coordinate, in ascending rank order (which is row-major over the varying dims in
 * mesh order, as DeviceMesh numbers a sub-mesh). split > 0 cuts that group into consecutive
 * blocks of `split` members (FSDP2 reshard_after_forward=int: mesh.view(-1, split)) and gives
 * the block; it must divide the group size. */
typedef struct pcs_mesh_group {
    uint32_t size;  /* members */
    uint32_t index; /* this rank's position among them */
    uint32_t first; /* the lowest member: names the group among the groups of the same vary/split */
} pcs_mesh_group_t;
pcs_status_t pcs_mesh_group(const pcs_mesh_t *m, uint32_t rank, unsigned vary, uint32_t split,
                            pcs_mesh_group_t *out);
/* Member `i` (< g->size) of group g of `rank` over `vary` (the same vary/split as g). */
uint32_t pcs_mesh_group_member(const pcs_mesh_t *m, uint32_t rank, unsigned vary,
                               const pcs_mesh_group_t *g, uint32_t i);

/* The rank's data-parallel sample position (DESIGN.md §5 sample order):
 * dp_replicate * |dp_shard| + dp_shard, whatever order the mesh gives those dims. Ranks of
 * different pipeline stages with the same dp coordinates read the same samples. */
uint32_t pcs_mesh_data_rank(const pcs_mesh_t *m, uint32_t rank);

// ---- on a plan (pcs.v1 types) ---------------------------------------------------------------

/* Rank -> (pp, dp_replicate, dp_shard), row-major over plan->mesh. out is initialised here.
 * PCS_ERR_INVALID_ARG if rank >= world size or the plan's mesh is not valid. */
pcs_status_t pcs_plan_rank_coords(const Pcs__V1__Plan *p, uint32_t rank, Pcs__V1__MeshCoords *out);
/* Inverse of pcs_plan_rank_coords; UINT32_MAX if a coordinate is out of range. */
uint32_t pcs_plan_rank_of(const Pcs__V1__Plan *p, const Pcs__V1__MeshCoords *c);

/* The dims a group kind varies (WORLD: all, SHARD / RESHARD: dp_shard, REPLICATE: dp_replicate,
 * DP: both dp dims, PP: pp); 0 for an unknown kind. */
unsigned pcs_plan_group_vary(Pcs__V1__GroupKind k);
/* `rank`'s group of kind k. RESHARD is the plan's GROUP_KIND_RESHARD group (consecutive blocks
 * of the shard group); PCS_ERR_NOT_FOUND in a plan without one. */
pcs_status_t pcs_plan_group(const Pcs__V1__Plan *p, Pcs__V1__GroupKind k, uint32_t rank,
                            pcs_mesh_group_t *out);
/* The ranks of `rank`'s group of kind k in group-rank order (ascending global rank), its
 * position in *my_index. *n: in = capacity of `ranks`, out = group size; ranks may be NULL to
 * ask only for the size. Errors: PCS_ERR_INVALID_ARG (bad rank/kind, capacity too small; *n is
 * still set), PCS_ERR_NOT_FOUND (kind RESHARD in a plan without int reshard_after_forward). */
pcs_status_t pcs_plan_group_ranks(const Pcs__V1__Plan *p, Pcs__V1__GroupKind k, uint32_t rank,
                                  uint32_t *ranks, uint32_t *n, uint32_t *my_index);

#ifdef __cplusplus
}
#endif
#endif
