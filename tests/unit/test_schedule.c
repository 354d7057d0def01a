/* Pipeline schedules as data (planner/schedule.h): every schedule the spec names is generated for
 * every pp, virtual-stage and micro-batch count it allows and passes execution (no deadlock, each
 * stage micro-batch computed once, sends matched in order, compute only on unsharded stages); the
 * bubble with unit costs is GPipe/1F1B's (p-1)/(m+p-1) and the interleaved one's (p-1)/(vm+p-1);
 * broken lists fail naming the rank and the rule. Seed test_composability.py's shapes: pp 2,
 * 8 micro-batches, 1 or 2 stages per rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/schedule.h"

static pcs_schedule_t *build(pcs_sched_kind_t k, uint32_t pp, uint32_t v, uint32_t m, int per_mb)
{
    pcs_schedule_t *s = NULL;
    if (pcs_schedule_build(k, pp, v, m, per_mb, &s) != PCS_OK)
        fail_msg("%s pp %u v %u m %u: %s", pcs_sched_name(k), pp, v, m, pcs_last_error());
    return s;
}

static void test_every_allowed_shape_builds_and_validates(void **state)
{
    (void)state;
    int built = 0;
    for (int k = PCS_SCHED_GPIPE; k <= PCS_SCHED_ZERO_BUBBLE; k++)
        for (uint32_t pp = 1; pp <= 6; pp++)
            for (uint32_t v = 1; v <= 3; v++)
                for (uint32_t m = 1; m <= 12; m++)
                    for (int per_mb = 0; per_mb < 2; per_mb++) {
                        pcs_schedule_t *s = NULL;
                        pcs_status_t st = pcs_schedule_build((pcs_sched_kind_t)k, pp, v, m,
                                                             per_mb, &s);
                        uint32_t rounds = m / pp > 1 ? m / pp : 1;
                        int single = k == PCS_SCHED_GPIPE || k == PCS_SCHED_1F1B;
                        int interleaved =
                            k == PCS_SCHED_INTERLEAVED_1F1B || k == PCS_SCHED_ZERO_BUBBLE;
                        int allowed = !(single && v > 1) && !(interleaved && m % rounds);
                        if (allowed != (st == PCS_OK))
                            fail_msg("%s pp %u v %u m %u: %s", pcs_sched_name(k), pp, v, m,
                                     st == PCS_OK ? "built, should be refused"
                                                  : pcs_last_error());
                        if (!allowed) {
                            assert_int_equal(st, PCS_ERR_INVALID_ARG);
                            assert_non_null(strstr(pcs_last_error(), single
                                                                         ? "pipeline.virtual_stages"
                                                                         : "training.micro_batches"));
                            continue;
                        }
                        built++;
                        /* each rank computes each of its stages' micro-batches once */
                        for (uint32_t r = 0; r < pp; r++) {
                            size_t f = 0, b = 0, w = 0;
                            for (size_t i = 0; i < s->n_acts[r]; i++) {
                                uint8_t a = s->acts[r][i].kind;
                                f += a == PCS_ACT_F;
                                b += a == PCS_ACT_B || a == PCS_ACT_I;
                                w += a == PCS_ACT_W;
                            }
                            assert_int_equal(f, (size_t)v * m);
                            assert_int_equal(b, (size_t)v * m);
                            assert_int_equal(w, k == PCS_SCHED_ZERO_BUBBLE ? (size_t)v * m : 0);
                        }
                        assert_true(s->bubble >= 0 && s->bubble < 1);
                        pcs_schedule_free(s);
                    }
    assert_true(built > 900);
}

/* GPipe and 1F1B: makespan 3 (m + p - 1) with F = 1, B = 2, bubble (p-1)/(m+p-1); looped BFS and
 * interleaved 1F1B with v stages per rank: (p-1)/(vm+p-1) when m is a multiple of p. */
static void test_bubbles_match_the_theory(void **state)
{
    (void)state;
    for (uint32_t pp = 1; pp <= 6; pp++)
        for (uint32_t m = 1; m <= 12; m++) {
            for (int k = PCS_SCHED_GPIPE; k <= PCS_SCHED_1F1B; k++) {
                pcs_schedule_t *s = build((pcs_sched_kind_t)k, pp, 1, m, 0);
                assert_int_equal(s->makespan, 3 * (m + pp - 1));
                assert_true(fabs(s->bubble - pcs_sched_bubble_1f1b(pp, m)) < 1e-12);
                pcs_schedule_free(s);
            }
            for (uint32_t v = 1; m % pp == 0 && v <= 3; v++) {
                for (int k = PCS_SCHED_INTERLEAVED_1F1B; k <= PCS_SCHED_LOOPED_BFS; k++) {
                    pcs_schedule_t *s = build((pcs_sched_kind_t)k, pp, v, m, 0);
                    double want = (double)(pp - 1) / (double)(v * m + pp - 1);
                    if (fabs(s->bubble - want) > 1e-12)
                        fail_msg("%s pp %u v %u m %u: bubble %.4f, want %.4f",
                                 pcs_sched_name((pcs_sched_kind_t)k), pp, v, m, s->bubble, want);
                    pcs_schedule_free(s);
                }
            }
        }
}

/* The seed's pipeline: pp 2, 8 micro-batches. Interleaving halves 1F1B's bubble, zero bubble
 * (weight gradients fill it) cuts it again. */
static void test_seed_shapes_order_the_bubbles(void **state)
{
    (void)state;
    pcs_schedule_t *g = build(PCS_SCHED_GPIPE, 2, 1, 8, 0);
    pcs_schedule_t *o = build(PCS_SCHED_1F1B, 2, 1, 8, 0);
    pcs_schedule_t *i = build(PCS_SCHED_INTERLEAVED_1F1B, 2, 2, 8, 0);
    pcs_schedule_t *l = build(PCS_SCHED_LOOPED_BFS, 2, 2, 8, 0);
    pcs_schedule_t *z = build(PCS_SCHED_ZERO_BUBBLE, 2, 2, 8, 0);
    assert_true(fabs(o->bubble - 1.0 / 9) < 1e-12);
    assert_true(fabs(g->bubble - o->bubble) < 1e-12);
    assert_true(fabs(i->bubble - 1.0 / 17) < 1e-12);
    assert_true(fabs(l->bubble - 1.0 / 17) < 1e-12);
    assert_true(z->bubble < i->bubble / 2);
    /* 1F1B keeps at most pp - rank micro-batches in flight on a rank (its memory bound): rank 0
     * runs F0 F1 B0 F2 B1 ... */
    const pcs_action_t *a = o->acts[0];
    char buf[64], seq[256] = "";
    for (size_t k = 0, n = 0; k < o->n_acts[0] && n < 6; k++)
        if (a[k].kind <= PCS_ACT_W) {
            pcs_action_str(&a[k], buf, sizeof buf);
            strcat(seq, buf);
            strcat(seq, " ");
            n++;
        }
    assert_string_equal(seq, "0F0 0F1 0B0 0F2 0B1 0F3 ");
    pcs_schedule_free(g);
    pcs_schedule_free(o);
    pcs_schedule_free(i);
    pcs_schedule_free(l);
    pcs_schedule_free(z);
}

static size_t find(const pcs_schedule_t *s, uint32_t r, uint8_t kind, uint32_t stage, uint32_t mb)
{
    for (size_t i = 0; i < s->n_acts[r]; i++)
        if (s->acts[r][i].kind == kind && s->acts[r][i].stage == stage && s->acts[r][i].mb == mb)
            return i;
    fail_msg("rank %u has no action %u of stage %u mb %u", r, kind, stage, mb);
    return 0;
}

static void drop(pcs_schedule_t *s, uint32_t r, size_t i)
{
    memmove(&s->acts[r][i], &s->acts[r][i + 1], (s->n_acts[r] - i - 1) * sizeof *s->acts[r]);
    s->n_acts[r]--;
}

static void expect_invalid(pcs_schedule_t *s, const char *needle)
{
    assert_int_equal(pcs_schedule_validate(s), PCS_ERR_INVALID_ARG);
    if (!strstr(pcs_last_error(), needle))
        fail_msg("'%s' does not contain '%s'", pcs_last_error(), needle);
    pcs_schedule_free(s);
}

static void test_broken_lists_fail_naming_the_rule(void **state)
{
    (void)state;
    /* receives swapped: rank 0 expects micro-batch 1's gradient before micro-batch 0's */
    pcs_schedule_t *s = build(PCS_SCHED_GPIPE, 2, 1, 2, 0);
    size_t a = find(s, 0, PCS_ACT_RECV_B, 0, 0), b = find(s, 0, PCS_ACT_RECV_B, 0, 1);
    s->acts[0][a].mb = 1;
    s->acts[0][b].mb = 0;
    s->acts[0][a + 1].mb = 1; /* the backward after each receive follows it */
    s->acts[0][b + 1].mb = 0;
    expect_invalid(s, "out of order");
    /* a receive removed: rank 1 waits forever for micro-batch 0's activation */
    s = build(PCS_SCHED_1F1B, 2, 1, 4, 0);
    drop(s, 1, find(s, 1, PCS_ACT_RECV_F, 1, 0));
    expect_invalid(s, "deadlock: rank 0 waits at RECV_B 0<1 mb0; rank 1 waits at 1F0");
    /* a send to a rank that does not hold the next stage */
    s = build(PCS_SCHED_1F1B, 2, 1, 4, 0);
    s->acts[0][find(s, 0, PCS_ACT_SEND_F, 0, 3)].peer = 0;
    expect_invalid(s, "rank 0: SEND_F 0>0 mb3: stage 1 is not on rank 0");
    /* a send nobody receives: the last activation sent twice */
    s = build(PCS_SCHED_1F1B, 2, 1, 4, 0);
    size_t at = find(s, 0, PCS_ACT_SEND_F, 0, 3);
    pcs_action_t *grown = realloc(s->acts[0], (s->n_acts[0] + 1) * sizeof *grown);
    assert_non_null(grown);
    s->acts[0] = grown;
    memmove(&grown[at + 1], &grown[at], (s->n_acts[0] - at) * sizeof *grown);
    s->n_acts[0]++;
    expect_invalid(s, "rank 0 sends stage 0 micro-batch 3 to rank 1, which never receives it");
    /* backward before its forward on the same rank */
    s = build(PCS_SCHED_GPIPE, 2, 1, 2, 0);
    size_t f = find(s, 1, PCS_ACT_F, 1, 1), bw = find(s, 1, PCS_ACT_B, 1, 1);
    pcs_action_t t = s->acts[1][f];
    s->acts[1][f] = s->acts[1][bw];
    s->acts[1][bw] = t;
    expect_invalid(s, "deadlock");
    /* FSDP (test_pp_fsdp_unshard_reshard_runtime): compute on a sharded stage, a stage left
     * unsharded, gradients never reduced */
    s = build(PCS_SCHED_1F1B, 2, 1, 2, 0);
    drop(s, 1, find(s, 1, PCS_ACT_UNSHARD, 1, 0));
    expect_invalid(s, "rank 1: 1F0 on stage 1 while it is sharded");
    s = build(PCS_SCHED_1F1B, 2, 1, 2, 0);
    drop(s, 0, find(s, 0, PCS_ACT_RESHARD, 0, 0));
    expect_invalid(s, "stage 0: still unsharded at the end of the step");
    s = build(PCS_SCHED_1F1B, 2, 1, 2, 0);
    drop(s, 1, find(s, 1, PCS_ACT_REDUCE_GRAD, 1, 0));
    expect_invalid(s, "stage 1: gradients not reduced");
    /* a missing weight gradient: the reduction would read an incomplete gradient */
    s = build(PCS_SCHED_ZERO_BUBBLE, 2, 1, 2, 0);
    drop(s, 0, find(s, 0, PCS_ACT_W, 0, 1));
    expect_invalid(s, "rank 0: REDUCE_GRAD 0 after 1 of 2 backwards (gradients reduced early)");
    /* a weight gradient before its input gradient waits for it forever */
    s = build(PCS_SCHED_ZERO_BUBBLE, 2, 1, 2, 0);
    size_t wi = find(s, 1, PCS_ACT_W, 1, 0), ii = find(s, 1, PCS_ACT_I, 1, 0);
    pcs_action_t wa = s->acts[1][wi];
    memmove(&s->acts[1][ii + 1], &s->acts[1][ii], (wi - ii) * sizeof wa);
    s->acts[1][ii] = wa;
    expect_invalid(s, "rank 1 waits at 1W0");
    /* every compute action wrapped in UNSHARD / RESHARD (reshard_after_forward) also holds */
    s = build(PCS_SCHED_INTERLEAVED_1F1B, 2, 2, 4, 1);
    size_t unshards = 0;
    for (size_t i = 0; i < s->n_acts[0]; i++)
        unshards += s->acts[0][i].kind == PCS_ACT_UNSHARD;
    assert_int_equal(unshards, 2 * 2 * 4); /* F and B of 4 micro-batches on 2 stages */
    pcs_schedule_free(s);
}

static void test_names_parse_with_defaults(void **state)
{
    (void)state;
    pcs_sched_kind_t k;
    assert_int_equal(pcs_sched_parse(NULL, 1, &k), PCS_OK);
    assert_int_equal(k, PCS_SCHED_1F1B);
    assert_int_equal(pcs_sched_parse("", 2, &k), PCS_OK);
    assert_int_equal(k, PCS_SCHED_INTERLEAVED_1F1B);
    assert_int_equal(pcs_sched_parse("interleaved_zero_bubble", 2, &k), PCS_OK);
    assert_int_equal(k, PCS_SCHED_ZERO_BUBBLE);
    assert_string_equal(pcs_sched_name(k), "interleaved_zero_bubble");
    assert_int_equal(pcs_sched_parse("zb-v", 1, &k), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "pipeline.schedule: unknown schedule 'zb-v'"));
    pcs_schedule_t *s = NULL;
    assert_int_equal(pcs_schedule_build(PCS_SCHED_1F1B, 2, 1, 0, 0, &s), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_schedule_build(PCS_SCHED_1F1B, 256, 1, 512, 0, &s), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "65536 stage micro-batches"));
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allowed_shape_builds_and_validates),
        cmocka_unit_test(test_bubbles_match_the_theory),
        cmocka_unit_test(test_seed_shapes_order_the_bubbles),
        cmocka_unit_test(test_broken_lists_fail_naming_the_rule),
        cmocka_unit_test(test_names_parse_with_defaults),
    };
    return cmocka_run_group_tests_name("schedule", tests, NULL, NULL);
}
