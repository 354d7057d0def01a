/* Rank <-> mesh coordinates <-> groups (see mesh.h). Row-major like init_device_mesh: with
 * strides s[i] = size[i+1] * ... * size[n-1], rank = sum coord[i] * s[i]. A group over a set of
 * varying dims is the ranks with every other coordinate equal; enumerating its varying
 * coordinates row-major (outer first) lists its members in ascending rank order. */
#include "planner/mesh.h"

#include <stdbool.h>
#include <string.h>

static const char *dim_name(uint32_t d)
{
    return d == PCS_MESH_PP ? "pp" : d == PCS_MESH_DP_REPLICATE ? "dp_replicate" : "dp_shard";
}

pcs_status_t pcs_mesh_init(uint32_t n, const uint32_t *dims, const uint32_t *sizes, pcs_mesh_t *out)
{
    memset(out, 0, sizeof *out);
    if (n == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh: required (at least one dimension)");
    if (n > PCS_MESH_MAX_DIMS)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh: more than %d dimensions",
                             PCS_MESH_MAX_DIMS);
    bool seen[4] = {false, false, false, false};
    uint64_t world = 1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t d = dims[i];
        if (d < PCS_MESH_PP || d > PCS_MESH_DP_SHARD)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "mesh[%u].dim: required (pp, dp_replicate or dp_shard)", i);
        if (seen[d])
            return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh: dimension %s given twice",
                                 dim_name(dims[i]));
        seen[d] = true;
        if (sizes[i] == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh[%u].size: must be >= 1", i);
        world *= sizes[i]; /* < 2^64: the running product is <= 2^32 before this */
        if (world > UINT32_MAX)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "mesh: world size (product of sizes) exceeds %u", UINT32_MAX);
        out->dim[i] = dims[i];
        out->size[i] = sizes[i];
    }
    out->n = n;
    out->world = (uint32_t)world;
    uint32_t s = 1;
    for (uint32_t i = n; i-- > 0;) {
        out->stride[i] = s;
        s *= out->size[i];
    }
    return PCS_OK;
}

pcs_status_t pcs_mesh_from_spec(const Pcs__V1__JobSpec *spec, pcs_mesh_t *out)
{
    uint32_t dims[PCS_MESH_MAX_DIMS], sizes[PCS_MESH_MAX_DIMS];
    size_t n = spec ? spec->n_mesh : 0;
    if (n > PCS_MESH_MAX_DIMS) {
        memset(out, 0, sizeof *out);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh: more than %d dimensions",
                             PCS_MESH_MAX_DIMS);
    }
    for (size_t i = 0; i < n; i++) {
        dims[i] = spec->mesh[i] ? (uint32_t)spec->mesh[i]->dim : 0;
        sizes[i] = spec->mesh[i] ? spec->mesh[i]->size : 0;
    }
    return pcs_mesh_init((uint32_t)n, dims, sizes, out);
}

pcs_status_t pcs_mesh_from_plan(const Pcs__V1__Plan *plan, pcs_mesh_t *out)
{
    uint32_t dims[PCS_MESH_MAX_DIMS], sizes[PCS_MESH_MAX_DIMS];
    size_t n = plan->n_mesh;
    if (n > PCS_MESH_MAX_DIMS)
        n = PCS_MESH_MAX_DIMS + 1; /* pcs_mesh_init names it */
    for (size_t i = 0; i < n && i < PCS_MESH_MAX_DIMS; i++) {
        if (!plan->mesh[i]) {
            memset(out, 0, sizeof *out);
            return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: mesh[%zu]: missing", i);
        }
        dims[i] = (uint32_t)plan->mesh[i]->dim;
        sizes[i] = plan->mesh[i]->size;
    }
    if (pcs_mesh_init((uint32_t)n, dims, sizes, out) != PCS_OK)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: %s", pcs_last_error());
    if (out->world != plan->world_size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: mesh does not match world size %u",
                             plan->world_size);
    return PCS_OK;
}

uint32_t pcs_mesh_size(const pcs_mesh_t *m, pcs_mesh_dim_t dim)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (m->dim[i] == dim)
            return m->size[i];
    return 1;
}

void pcs_mesh_coords(const pcs_mesh_t *m, uint32_t rank, uint32_t coords[4])
{
    memset(coords, 0, 4 * sizeof *coords);
    for (uint32_t i = 0; i < m->n; i++)
        coords[m->dim[i]] = (rank / m->stride[i]) % m->size[i];
}

uint32_t pcs_mesh_rank(const pcs_mesh_t *m, const uint32_t coords[4])
{
    bool named[4] = {false, false, false, false};
    uint32_t r = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        uint32_t c = coords[m->dim[i]];
        if (c >= m->size[i])
            return UINT32_MAX;
        named[m->dim[i]] = true;
        r += c * m->stride[i];
    }
    for (unsigned d = PCS_MESH_PP; d <= PCS_MESH_DP_SHARD; d++)
        if (!named[d] && coords[d] != 0)
            return UINT32_MAX;
    return r;
}

/* The group without a split: size, rank's position (row-major over the varying dims) and the
 * base rank (varying coordinates zeroed). */
static void full_group(const pcs_mesh_t *m, uint32_t rank, unsigned vary, uint32_t *size,
                       uint32_t *pos, uint32_t *base)
{
    *size = 1;
    *pos = 0;
    *base = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        uint32_t c = (rank / m->stride[i]) % m->size[i];
        if (vary & PCS_MESH_VARY(m->dim[i])) {
            *size *= m->size[i];
            *pos = *pos * m->size[i] + c;
        } else {
            *base += c * m->stride[i];
        }
    }
}

pcs_status_t pcs_mesh_group(const pcs_mesh_t *m, uint32_t rank, unsigned vary, uint32_t split,
                            pcs_mesh_group_t *out)
{
    memset(out, 0, sizeof *out);
    if (rank >= m->world)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: must be < world size %u", rank,
                             m->world);
    uint32_t size, pos, base;
    full_group(m, rank, vary, &size, &pos, &base);
    uint32_t first_pos = 0;
    if (split) {
        if (size % split)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "mesh: group of %u ranks does not split "
                                 "into blocks of %u",
                                 size, split);
        first_pos = pos / split * split;
        size = split;
        pos -= first_pos;
    }
    out->size = size;
    out->index = pos;
    out->first = base;
    /* the block's first member: position first_pos of the full group */
    for (uint32_t i = m->n, p = first_pos; i-- > 0;) {
        if (vary & PCS_MESH_VARY(m->dim[i])) {
            out->first += (p % m->size[i]) * m->stride[i];
            p /= m->size[i];
        }
    }
    return PCS_OK;
}

uint32_t pcs_mesh_group_member(const pcs_mesh_t *m, uint32_t rank, unsigned vary,
                               const pcs_mesh_group_t *g, uint32_t i)
{
    uint32_t size, pos, base;
    full_group(m, rank, vary, &size, &pos, &base);
    /* position in the full group: the block starts at pos - g->index */
    uint32_t p = pos - g->index + i, r = base;
    for (uint32_t k = m->n; k-- > 0;) {
        if (vary & PCS_MESH_VARY(m->dim[k])) {
            r += (p % m->size[k]) * m->stride[k];
            p /= m->size[k];
        }
    }
    return r;
}

uint32_t pcs_mesh_data_rank(const pcs_mesh_t *m, uint32_t rank)
{
    uint32_t c[4];
    pcs_mesh_coords(m, rank, c);
    return c[PCS_MESH_DP_REPLICATE] * pcs_mesh_size(m, PCS_MESH_DP_SHARD) + c[PCS_MESH_DP_SHARD];
}

// ---- on a plan ---------------------------------------------------------------------------------

pcs_status_t pcs_plan_rank_coords(const Pcs__V1__Plan *p, uint32_t rank, Pcs__V1__MeshCoords *out)
{
    pcs__v1__mesh_coords__init(out);
    pcs_mesh_t m;
    PCS_CHECK(pcs_mesh_from_plan(p, &m));
    if (rank >= m.world)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: must be < world size %u", rank,
                             m.world);
    uint32_t c[4];
    pcs_mesh_coords(&m, rank, c);
    out->pp = c[PCS_MESH_PP];
    out->dp_replicate = c[PCS_MESH_DP_REPLICATE];
    out->dp_shard = c[PCS_MESH_DP_SHARD];
    return PCS_OK;
}

uint32_t pcs_plan_rank_of(const Pcs__V1__Plan *p, const Pcs__V1__MeshCoords *c)
{
    pcs_mesh_t m;
    if (pcs_mesh_from_plan(p, &m) != PCS_OK)
        return UINT32_MAX;
    const uint32_t coords[4] = {0, c->pp, c->dp_replicate, c->dp_shard};
    return pcs_mesh_rank(&m, coords);
}

unsigned pcs_plan_group_vary(Pcs__V1__GroupKind k)
{
    switch (k) {
    case PCS__V1__GROUP_KIND__GROUP_KIND_WORLD:
        return PCS_MESH_VARY_ALL;
    case PCS__V1__GROUP_KIND__GROUP_KIND_SHARD:
    case PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD:
        return PCS_MESH_VARY(PCS_MESH_DP_SHARD);
    case PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE:
        return PCS_MESH_VARY(PCS_MESH_DP_REPLICATE);
    case PCS__V1__GROUP_KIND__GROUP_KIND_DP:
        return PCS_MESH_VARY(PCS_MESH_DP_REPLICATE) | PCS_MESH_VARY(PCS_MESH_DP_SHARD);
    case PCS__V1__GROUP_KIND__GROUP_KIND_PP:
        return PCS_MESH_VARY(PCS_MESH_PP);
    default:
        return 0;
    }
}

/* The block size of kind k's groups: the plan's RESHARD group size, 0 for the other kinds. */
static pcs_status_t split_of(const Pcs__V1__Plan *p, Pcs__V1__GroupKind k, uint32_t *split)
{
    *split = 0;
    if (k != PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD)
        return PCS_OK;
    for (size_t i = 0; i < p->n_groups; i++)
        if (p->groups[i]->kind == PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD) {
            *split = p->groups[i]->size;
            break;
        }
    if (!*split)
        return pcs_set_error(PCS_ERR_NOT_FOUND,
                             "plan: no reshard group (reshard_after_forward is not an int)");
    return PCS_OK;
}

pcs_status_t pcs_plan_group(const Pcs__V1__Plan *p, Pcs__V1__GroupKind k, uint32_t rank,
                            pcs_mesh_group_t *out)
{
    memset(out, 0, sizeof *out);
    pcs_mesh_t m;
    PCS_CHECK(pcs_mesh_from_plan(p, &m));
    unsigned vary = pcs_plan_group_vary(k);
    if (!vary)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "group kind %d: unknown", (int)k);
    uint32_t split;
    PCS_CHECK(split_of(p, k, &split));
    return pcs_mesh_group(&m, rank, vary, split, out);
}

pcs_status_t pcs_plan_group_ranks(const Pcs__V1__Plan *p, Pcs__V1__GroupKind k, uint32_t rank,
                                  uint32_t *ranks, uint32_t *n, uint32_t *my_index)
{
    uint32_t cap = *n;
    *n = 0;
    pcs_mesh_group_t g;
    PCS_CHECK(pcs_plan_group(p, k, rank, &g));
    *n = g.size;
    if (my_index)
        *my_index = g.index;
    if (!ranks)
        return PCS_OK;
    if (cap < g.size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "group of %u ranks: capacity %u too small",
                             g.size, cap);
    pcs_mesh_t m;
    PCS_CHECK(pcs_mesh_from_plan(p, &m));
    unsigned vary = pcs_plan_group_vary(k);
    for (uint32_t i = 0; i < g.size; i++)
        ranks[i] = pcs_mesh_group_member(&m, rank, vary, &g, i);
    return PCS_OK;
}
