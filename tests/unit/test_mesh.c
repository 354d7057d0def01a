/* planner/mesh.c, the one home of rank <-> coordinates <-> groups, against the five places that
 * computed them before it: the planner's closed forms (pcs_plan_rank_coords / rank_of /
 * group_ranks in plan_rules.c, called live), and verbatim copies of the coordinator's
 * pcs_coord_rank_coords (coord.c), the runtime's O(world) group_of scan and reshard arithmetic
 * (runtime.c) and the data rank of train.c / worker_api.c. Every mesh of up to 64 ranks: every
 * subset of the three dims in every order, every size tuple, every rank, every group kind, every
 * reshard split of the shard group, pp > 1 included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "planner/mesh.h"
#include "planner/plan.h"

#define MAX_WORLD 64

// ---- the old helpers (frozen copies, deleted from the tree with this test's next change) -------

/* coordinator/coord.c pcs_coord_rank_coords, on the job's dim_name/dim_size arrays */
static void old_coord_rank_coords(uint32_t n_dims, const uint32_t *dim_name,
                                  const uint32_t *dim_size, uint32_t rank, uint32_t coords[4])
{
    memset(coords, 0, 4 * sizeof *coords);
    for (uint32_t i = n_dims; i-- > 0;) {
        uint32_t v = rank % dim_size[i];
        rank /= dim_size[i];
        if (dim_name[i] >= 1 && dim_name[i] <= 3)
            coords[dim_name[i]] = v;
    }
}

/* worker/runtime.c mesh_of / coords_of / group_of */
typedef struct mesh_info {
    size_t n;
    int dim[8];
    uint32_t size[8];
} mesh_info_t;

static void old_mesh_of(const Pcs__V1__Plan *p, mesh_info_t *m)
{
    m->n = 0;
    for (size_t i = 0; i < p->n_mesh && i < 8; i++) {
        m->dim[m->n] = (int)p->mesh[i]->dim;
        m->size[m->n] = p->mesh[i]->size ? p->mesh[i]->size : 1;
        m->n++;
    }
}

static void old_coords_of(const mesh_info_t *m, uint32_t rank, uint32_t *c)
{
    for (size_t i = m->n; i-- > 0;) {
        c[i] = rank % m->size[i];
        rank /= m->size[i];
    }
}

static void old_group_of(const mesh_info_t *m, uint32_t world, uint32_t rank, unsigned vary,
                         uint32_t *size, uint32_t *index, uint32_t *id)
{
    uint32_t mine[8], other[8];
    old_coords_of(m, rank, mine);
    *size = 0;
    *index = 0;
    *id = rank;
    int first = 1;
    for (uint32_t r = 0; r < world; r++) {
        old_coords_of(m, r, other);
        int same = 1;
        for (size_t i = 0; i < m->n; i++)
            if (!(vary & (1u << m->dim[i])) && other[i] != mine[i])
                same = 0;
        if (!same)
            continue;
        if (first) {
            *id = r;
            first = 0;
        }
        if (r == rank)
            *index = *size;
        (*size)++;
    }
}

/* worker/train.c and worker/worker_api.c: the data-parallel sample position */
static uint32_t old_dp_rank(const Pcs__V1__Plan *p, const Pcs__V1__MeshCoords *c)
{
    uint32_t S = p->shard_size ? p->shard_size : 1;
    uint32_t D = p->dp_size ? p->dp_size : 1;
    uint32_t r = c->dp_replicate * S + c->dp_shard;
    return D == 1 ? 0 : r;
}

// ---- meshes ----------------------------------------------------------------------------------

typedef struct fixture {
    Pcs__V1__Plan plan;
    Pcs__V1__MeshDim dims[3], *dimp[3];
    Pcs__V1__GroupSpec reshard, *groupp[1];
    pcs_mesh_t mesh;
    uint32_t name[3], size[3], n;
    uint32_t split; /* reshard block size, 0 = none */
} fixture_t;

static uint32_t dim_size(const fixture_t *f, uint32_t dim)
{
    for (uint32_t i = 0; i < f->n; i++)
        if (f->name[i] == dim)
            return f->size[i];
    return 1;
}

static void make(fixture_t *f, uint32_t n, const uint32_t *name, const uint32_t *size)
{
    memset(f, 0, sizeof *f);
    pcs__v1__plan__init(&f->plan);
    f->n = n;
    uint32_t world = 1;
    pcs_mesh_dim_t d[3];
    for (uint32_t i = 0; i < n; i++) {
        f->name[i] = name[i];
        f->size[i] = size[i];
        pcs__v1__mesh_dim__init(&f->dims[i]);
        f->dims[i].dim = (Pcs__V1__MeshDimName)name[i];
        f->dims[i].size = size[i];
        f->dimp[i] = &f->dims[i];
        d[i] = (pcs_mesh_dim_t)name[i];
        world *= size[i];
    }
    f->plan.mesh = f->dimp;
    f->plan.n_mesh = n;
    f->plan.world_size = world;
    f->plan.shard_size = dim_size(f, 3);
    f->plan.dp_size = dim_size(f, 2) * dim_size(f, 3);
    assert_int_equal(pcs_mesh_init(n, d, size, &f->mesh), PCS_OK);
    assert_int_equal(f->mesh.world, world);
}

static void set_split(fixture_t *f, uint32_t split)
{
    f->split = split;
    f->plan.n_groups = 0;
    if (!split)
        return;
    pcs__v1__group_spec__init(&f->reshard);
    f->reshard.kind = PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD;
    f->reshard.size = split;
    f->groupp[0] = &f->reshard;
    f->plan.groups = f->groupp;
    f->plan.n_groups = 1;
}

static const Pcs__V1__GroupKind kinds[] = {
    PCS__V1__GROUP_KIND__GROUP_KIND_WORLD, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD,
    PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE, PCS__V1__GROUP_KIND__GROUP_KIND_DP,
    PCS__V1__GROUP_KIND__GROUP_KIND_PP};
static const unsigned kind_vary[] = {
    PCS_MESH_VARY_ALL, PCS_MESH_VARY(PCS_MESH_DP_SHARD), PCS_MESH_VARY(PCS_MESH_DP_REPLICATE),
    PCS_MESH_VARY(PCS_MESH_DP_REPLICATE) | PCS_MESH_VARY(PCS_MESH_DP_SHARD),
    PCS_MESH_VARY(PCS_MESH_PP)};

/* Every rank of f's mesh: the new functions against the old ones. Returns the checks made. */
static uint64_t check_mesh(fixture_t *f)
{
    uint64_t checks = 0;
    const pcs_mesh_t *m = &f->mesh;
    uint32_t world = m->world, ranks[MAX_WORLD];
    mesh_info_t mi;
    old_mesh_of(&f->plan, &mi);
    for (uint32_t r = 0; r < world; r++) {
        /* coordinates: coord.c and plan_rules.c */
        uint32_t c_new[4], c_old[4];
        pcs_mesh_coords(m, r, c_new);
        old_coord_rank_coords(f->n, f->name, f->size, r, c_old);
        assert_memory_equal(c_new, c_old, sizeof c_new);
        Pcs__V1__MeshCoords pc;
        assert_int_equal(pcs_plan_rank_coords(&f->plan, r, &pc), PCS_OK);
        assert_int_equal(pc.pp, c_new[PCS_MESH_PP]);
        assert_int_equal(pc.dp_replicate, c_new[PCS_MESH_DP_REPLICATE]);
        assert_int_equal(pc.dp_shard, c_new[PCS_MESH_DP_SHARD]);
        /* rank of coordinates, and out-of-range coordinates */
        assert_int_equal(pcs_mesh_rank(m, c_new), r);
        assert_int_equal(pcs_plan_rank_of(&f->plan, &pc), r);
        for (uint32_t d = 1; d <= 3; d++) {
            uint32_t bad[4];
            memcpy(bad, c_new, sizeof bad);
            bad[d] = dim_size(f, d);
            Pcs__V1__MeshCoords pb = pc;
            if (d == 1)
                pb.pp = bad[d];
            else if (d == 2)
                pb.dp_replicate = bad[d];
            else
                pb.dp_shard = bad[d];
            assert_int_equal(pcs_mesh_rank(m, bad), UINT32_MAX);
            assert_int_equal(pcs_plan_rank_of(&f->plan, &pb), UINT32_MAX);
        }
        /* data rank: train.c / worker_api.c */
        assert_int_equal(pcs_mesh_data_rank(m, r), old_dp_rank(&f->plan, &pc));
        /* groups of every kind: plan_rules.c's lists, runtime.c's scan */
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            pcs_mesh_group_t g;
            assert_int_equal(pcs_mesh_group(m, r, kind_vary[k], 0, &g), PCS_OK);
            uint32_t n = MAX_WORLD, mine = 0;
            assert_int_equal(pcs_plan_group_ranks(&f->plan, kinds[k], r, ranks, &n, &mine), PCS_OK);
            assert_int_equal(g.size, n);
            assert_int_equal(g.index, mine);
            assert_int_equal(g.first, ranks[0]);
            for (uint32_t i = 0; i < n; i++)
                assert_int_equal(pcs_mesh_group_member(m, r, kind_vary[k], &g, i), ranks[i]);
            uint32_t osz, oix, oid;
            old_group_of(&mi, world, r, kind_vary[k], &osz, &oix, &oid);
            assert_int_equal(g.size, osz);
            assert_int_equal(g.index, oix);
            assert_int_equal(g.first, oid);
            checks++;
        }
        /* reshard blocks of the shard group: plan_rules.c, and runtime.c's index arithmetic */
        if (f->split) {
            unsigned vs = PCS_MESH_VARY(PCS_MESH_DP_SHARD);
            pcs_mesh_group_t g, sg;
            assert_int_equal(pcs_mesh_group(m, r, vs, f->split, &g), PCS_OK);
            assert_int_equal(pcs_mesh_group(m, r, vs, 0, &sg), PCS_OK);
            uint32_t n = MAX_WORLD, mine = 0;
            assert_int_equal(pcs_plan_group_ranks(&f->plan, PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD,
                                                  r, ranks, &n, &mine),
                             PCS_OK);
            assert_int_equal(g.size, n);
            assert_int_equal(g.index, mine);
            assert_int_equal(g.first, ranks[0]);
            for (uint32_t i = 0; i < n; i++)
                assert_int_equal(pcs_mesh_group_member(m, r, vs, &g, i), ranks[i]);
            assert_int_equal(g.index, sg.index % f->split); /* runtime: reshard_index */
            assert_int_equal(g.first,
                             pcs_mesh_group_member(m, r, vs, &sg, sg.index / f->split * f->split));
            checks++;
        }
    }
    return checks;
}

/* Every ordered choice of n of the 3 dims, every size tuple with a product <= MAX_WORLD. */
static void test_mesh_matches_old_helpers_on_every_mesh_up_to_64_ranks(void **state)
{
    (void)state;
    uint64_t meshes = 0, checks = 0;
    static fixture_t f;
    for (uint32_t n = 1; n <= 3; n++) {
        for (uint32_t a = 1; a <= 3; a++) {
            for (uint32_t b = 1; b <= 3; b++) {
                for (uint32_t c = 1; c <= 3; c++) {
                    uint32_t name[3] = {a, b, c};
                    if ((n >= 2 && b == a) || (n == 3 && (c == a || c == b)))
                        continue;
                    if ((n < 2 && b != 1) || (n < 3 && c != 1))
                        continue; /* each order once */
                    for (uint32_t s0 = 1; s0 <= MAX_WORLD; s0++) {
                        for (uint32_t s1 = 1; s0 * s1 <= MAX_WORLD; s1++) {
                            for (uint32_t s2 = 1; s0 * s1 * s2 <= MAX_WORLD; s2++) {
                                uint32_t size[3] = {s0, s1, s2};
                                if ((n < 2 && s1 > 1) || (n < 3 && s2 > 1))
                                    break;
                                make(&f, n, name, size);
                                meshes++;
                                set_split(&f, 0);
                                checks += check_mesh(&f);
                                uint32_t S = dim_size(&f, 3);
                                for (uint32_t split = 2; split < S; split++) {
                                    if (S % split)
                                        continue;
                                    set_split(&f, split);
                                    checks += check_mesh(&f);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    printf("# %llu meshes, %llu group checks\n", (unsigned long long)meshes,
           (unsigned long long)checks);
    assert_true(meshes > 1000);
}

static void test_mesh_init_names_the_field(void **state)
{
    (void)state;
    pcs_mesh_t m;
    pcs_mesh_dim_t d[4] = {PCS_MESH_PP, PCS_MESH_DP_SHARD, PCS_MESH_DP_REPLICATE, PCS_MESH_PP};
    uint32_t s[4] = {2, 3, 4, 1};
    assert_int_equal(pcs_mesh_init(0, d, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: required (at least one dimension)");
    assert_int_equal(pcs_mesh_init(4, d, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: more than 3 dimensions");
    pcs_mesh_dim_t twice[2] = {PCS_MESH_DP_SHARD, PCS_MESH_DP_SHARD};
    assert_int_equal(pcs_mesh_init(2, twice, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: dimension dp_shard given twice");
    pcs_mesh_dim_t unknown[1] = {(pcs_mesh_dim_t)7};
    assert_int_equal(pcs_mesh_init(1, unknown, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh[0].dim: required (pp, dp_replicate or dp_shard)");
    uint32_t zero[2] = {2, 0};
    assert_int_equal(pcs_mesh_init(2, d, zero, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh[1].size: must be >= 1");
    uint32_t big[3] = {1024, 1024, 2};
    assert_int_equal(pcs_mesh_init(3, d, big, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: world size (product of sizes) exceeds 1048576");
    assert_int_equal(pcs_mesh_init(3, d, s, &m), PCS_OK);
    assert_int_equal(m.world, 24);
    /* row-major, innermost fastest: rank 23 = (pp 1, dp_shard 2, dp_replicate 3) */
    uint32_t c[4];
    pcs_mesh_coords(&m, 23, c);
    assert_int_equal(c[PCS_MESH_PP], 1);
    assert_int_equal(c[PCS_MESH_DP_SHARD], 2);
    assert_int_equal(c[PCS_MESH_DP_REPLICATE], 3);
    pcs_mesh_group_t g;
    assert_int_equal(pcs_mesh_group(&m, 24, PCS_MESH_VARY_ALL, 0, &g), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_mesh_group(&m, 0, PCS_MESH_VARY(PCS_MESH_DP_SHARD), 2, &g),
                     PCS_ERR_INVALID_ARG); /* 3 ranks do not split into blocks of 2 */
}

/* A plan whose mesh does not multiply to its world size is refused, not read with wrong strides
 * (a plan from the wire is not trusted): three sizes whose product wraps uint64 included. */
static void test_mesh_from_plan_refuses_a_mesh_that_is_not_the_world(void **state)
{
    (void)state;
    fixture_t f;
    uint32_t name[3] = {1, 2, 3}, size[3] = {2, 2, 2};
    make(&f, 3, name, size);
    pcs_mesh_t m;
    assert_int_equal(pcs_mesh_from_plan(&f.plan, &m), PCS_OK);
    f.plan.world_size = 9;
    assert_int_equal(pcs_mesh_from_plan(&f.plan, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "plan: mesh does not match world size 9");
    f.plan.world_size = 0;
    f.dims[0].size = f.dims[1].size = f.dims[2].size = 1u << 22; /* 2^66 wraps to 0 */
    assert_int_equal(pcs_mesh_from_plan(&f.plan, &m), PCS_ERR_INVALID_ARG);
    f.plan.n_mesh = 0;
    assert_int_equal(pcs_mesh_from_plan(&f.plan, &m), PCS_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_matches_old_helpers_on_every_mesh_up_to_64_ranks),
        cmocka_unit_test(test_mesh_init_names_the_field),
        cmocka_unit_test(test_mesh_from_plan_refuses_a_mesh_that_is_not_the_world),
    };
    return cmocka_run_group_tests_name("mesh", tests, NULL, NULL);
}
