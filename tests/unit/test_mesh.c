/* planner/mesh.c, the one home of rank <-> coordinates <-> groups, against the definitions, on
 * every mesh of up to 64 ranks: every subset of the three dims in every order, every size tuple,
 * every rank, every group kind, every reshard split of the shard group, pp > 1 included. The
 * references are the brute-force forms the closed forms replace (before they were deleted, this
 * test also compared mesh.c with the five copies it replaced: coord.c, plan_rules.c, runtime.c,
 * train.c and worker_api.c): coordinates by repeated div/mod from the innermost dim, a group as a
 * scan of every rank for those that share the non-varying coordinates, reshard blocks as
 * consecutive runs of that list. The plan-level wrappers (pcs_plan_rank_coords / rank_of /
 * group_ranks) must agree with both. */
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

// ---- references ------------------------------------------------------------------------------

/* row-major: the innermost (last) dim varies fastest, as init_device_mesh numbers ranks */
static void ref_coords(uint32_t n, const uint32_t *name, const uint32_t *size, uint32_t rank,
                       uint32_t coords[4])
{
    memset(coords, 0, 4 * sizeof *coords);
    for (uint32_t i = n; i-- > 0;) {
        coords[name[i]] = rank % size[i];
        rank /= size[i];
    }
}

/* The ranks sharing every coordinate of `rank` outside `vary`, ascending; *index = rank's place. */
static uint32_t ref_group(uint32_t n, const uint32_t *name, const uint32_t *size, uint32_t world,
                          uint32_t rank, unsigned vary, uint32_t *members, uint32_t *index)
{
    uint32_t mine[4], other[4], count = 0;
    ref_coords(n, name, size, rank, mine);
    for (uint32_t r = 0; r < world; r++) {
        ref_coords(n, name, size, r, other);
        int same = 1;
        for (uint32_t d = 1; d <= 3; d++)
            if (!(vary & (1u << d)) && other[d] != mine[d])
                same = 0;
        if (!same)
            continue;
        if (r == rank)
            *index = count;
        members[count++] = r;
    }
    return count;
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
    uint32_t d[3];
    for (uint32_t i = 0; i < n; i++) {
        f->name[i] = name[i];
        f->size[i] = size[i];
        pcs__v1__mesh_dim__init(&f->dims[i]);
        f->dims[i].dim = (Pcs__V1__MeshDimName)name[i];
        f->dims[i].size = size[i];
        f->dimp[i] = &f->dims[i];
        d[i] = name[i];
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
    uint32_t world = m->world, ranks[MAX_WORLD], members[MAX_WORLD];
    for (uint32_t r = 0; r < world; r++) {
        /* coordinates */
        uint32_t c_new[4], c_ref[4];
        pcs_mesh_coords(m, r, c_new);
        ref_coords(f->n, f->name, f->size, r, c_ref);
        assert_memory_equal(c_new, c_ref, sizeof c_new);
        Pcs__V1__MeshCoords pc;
        assert_int_equal(pcs_plan_rank_coords(&f->plan, r, &pc), PCS_OK);
        assert_int_equal(pc.pp, c_ref[PCS_MESH_PP]);
        assert_int_equal(pc.dp_replicate, c_ref[PCS_MESH_DP_REPLICATE]);
        assert_int_equal(pc.dp_shard, c_ref[PCS_MESH_DP_SHARD]);
        /* rank of coordinates, and out-of-range coordinates */
        assert_int_equal(pcs_mesh_rank(m, c_ref), r);
        assert_int_equal(pcs_plan_rank_of(&f->plan, &pc), r);
        for (uint32_t d = 1; d <= 3; d++) {
            uint32_t bad[4];
            memcpy(bad, c_ref, sizeof bad);
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
        /* data rank (DESIGN.md section 5): dp_replicate * |dp_shard| + dp_shard */
        assert_int_equal(pcs_mesh_data_rank(m, r),
                         c_ref[PCS_MESH_DP_REPLICATE] * dim_size(f, 3) + c_ref[PCS_MESH_DP_SHARD]);
        /* groups of every kind */
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            uint32_t ref_index = 0;
            uint32_t ref_n =
                ref_group(f->n, f->name, f->size, world, r, kind_vary[k], members, &ref_index);
            pcs_mesh_group_t g;
            assert_int_equal(pcs_mesh_group(m, r, kind_vary[k], 0, &g), PCS_OK);
            assert_int_equal(g.size, ref_n);
            assert_int_equal(g.index, ref_index);
            assert_int_equal(g.first, members[0]);
            for (uint32_t i = 0; i < ref_n; i++)
                assert_int_equal(pcs_mesh_group_member(m, r, kind_vary[k], &g, i), members[i]);
            assert_int_equal(pcs_plan_group_vary(kinds[k]), kind_vary[k]);
            uint32_t n = MAX_WORLD, mine = 0;
            assert_int_equal(pcs_plan_group_ranks(&f->plan, kinds[k], r, ranks, &n, &mine), PCS_OK);
            assert_int_equal(n, ref_n);
            assert_int_equal(mine, ref_index);
            assert_memory_equal(ranks, members, n * sizeof *ranks);
            checks++;
        }
        /* reshard blocks: consecutive runs of `split` members of the shard group */
        if (f->split) {
            unsigned vs = PCS_MESH_VARY(PCS_MESH_DP_SHARD);
            uint32_t pos = 0;
            ref_group(f->n, f->name, f->size, world, r, vs, members, &pos);
            const uint32_t *block = members + pos / f->split * f->split;
            pcs_mesh_group_t g;
            assert_int_equal(pcs_mesh_group(m, r, vs, f->split, &g), PCS_OK);
            assert_int_equal(g.size, f->split);
            assert_int_equal(g.index, pos % f->split);
            assert_int_equal(g.first, block[0]);
            for (uint32_t i = 0; i < f->split; i++)
                assert_int_equal(pcs_mesh_group_member(m, r, vs, &g, i), block[i]);
            uint32_t n = MAX_WORLD, mine = 0;
            assert_int_equal(pcs_plan_group_ranks(&f->plan, PCS__V1__GROUP_KIND__GROUP_KIND_RESHARD,
                                                  r, ranks, &n, &mine),
                             PCS_OK);
            assert_int_equal(n, f->split);
            assert_int_equal(mine, pos % f->split);
            assert_memory_equal(ranks, block, n * sizeof *ranks);
            checks++;
        }
    }
    return checks;
}

/* Every ordered choice of n of the 3 dims, every size tuple with a product <= MAX_WORLD. */
static void test_mesh_matches_the_definitions_on_every_mesh_up_to_64_ranks(void **state)
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
    uint32_t d[4] = {PCS_MESH_PP, PCS_MESH_DP_SHARD, PCS_MESH_DP_REPLICATE, PCS_MESH_PP};
    uint32_t s[4] = {2, 3, 4, 1};
    assert_int_equal(pcs_mesh_init(0, d, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: required (at least one dimension)");
    assert_int_equal(pcs_mesh_init(4, d, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: more than 3 dimensions");
    uint32_t twice[2] = {PCS_MESH_DP_SHARD, PCS_MESH_DP_SHARD};
    assert_int_equal(pcs_mesh_init(2, twice, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: dimension dp_shard given twice");
    uint32_t unknown[1] = {7};
    assert_int_equal(pcs_mesh_init(1, unknown, s, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh[0].dim: required (pp, dp_replicate or dp_shard)");
    uint32_t zero[2] = {2, 0};
    assert_int_equal(pcs_mesh_init(2, d, zero, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh[1].size: must be >= 1");
    uint32_t big[3] = {65536, 65536, 2};
    assert_int_equal(pcs_mesh_init(3, d, big, &m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "mesh: world size (product of sizes) exceeds 4294967295");
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
        cmocka_unit_test(test_mesh_matches_the_definitions_on_every_mesh_up_to_64_ranks),
        cmocka_unit_test(test_mesh_init_names_the_field),
        cmocka_unit_test(test_mesh_from_plan_refuses_a_mesh_that_is_not_the_world),
    };
    return cmocka_run_group_tests_name("mesh", tests, NULL, NULL);
}
