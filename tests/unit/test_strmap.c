/* common/: the one string map (pcs/strmap.h) against a brute-force list, and the one hash
 * (pcs/hash.h) against the FNV-1a 64 test vectors of its authors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pcs/hash.h"
#include "pcs/strmap.h"

/* http://www.isthe.com/chongo/src/fnv/test_fnv.c (FNV-1a 64 column) */
static void test_fnv1a64_matches_the_published_vectors(void **state)
{
    (void)state;
    assert_true(pcs_fnv1a64_str("") == 0xcbf29ce484222325ull);
    assert_true(pcs_fnv1a64_str(NULL) == 0xcbf29ce484222325ull);
    assert_true(pcs_fnv1a64_str("a") == 0xaf63dc4c8601ec8cull);
    assert_true(pcs_fnv1a64_str("foobar") == 0x85944171f73967e8ull);
    assert_true(pcs_fnv1a64(PCS_FNV1A64_OFFSET, "foobar", 6) == 0x85944171f73967e8ull);
    /* streaming in pieces is hashing the whole */
    assert_true(pcs_fnv1a64(pcs_fnv1a64(PCS_FNV1A64_OFFSET, "foo", 3), "bar", 3) ==
                0x85944171f73967e8ull);
    /* a u64 folds its 8 bytes least significant first, whatever the host order */
    const unsigned char le[8] = {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
    assert_true(pcs_fnv1a64_u64(PCS_FNV1A64_OFFSET, 0x1122334455667788ull) ==
                pcs_fnv1a64(PCS_FNV1A64_OFFSET, le, 8));
}

/* Random keys (many sharing prefixes, so slots collide) put, overwritten and looked up; a
 * linear list is the oracle. Both ownership modes; the borrowing map retains the pointers. */
static void test_strmap_agrees_with_a_list_under_growth_and_overwrite(void **state)
{
    (void)state;
    enum { N = 5000 };
    static char keys[N][24];
    static uint32_t want[N];
    for (int owned = 0; owned < 2; owned++) {
        pcs_strmap_t m = PCS_STRMAP_BORROWED;
        m.owns_keys = owned != 0;
        srand(7 + owned);
        int n = 0;
        for (int i = 0; i < 3 * N; i++) {
            int k = rand() % N;
            if (k >= n) { /* a new key */
                k = n++;
                snprintf(keys[k], sizeof keys[k], "layers.%d.w%d", k % 97, k);
            }
            want[k] = (uint32_t)rand();
            char copy[24];
            snprintf(copy, sizeof copy, "%s", keys[k]);
            assert_int_equal(pcs_strmap_put(&m, owned ? copy : keys[k], want[k]), PCS_OK);
            if (owned)
                memset(copy, 'x', sizeof copy - 1); /* the map kept its own copy */
            assert_int_equal(pcs_strmap_len(&m), (size_t)n);
        }
        for (int k = 0; k < n; k++) {
            uint32_t v = 0;
            assert_true(pcs_strmap_get(&m, keys[k], &v));
            assert_int_equal(v, want[k]);
        }
        assert_false(pcs_strmap_get(&m, "layers.1.w", NULL));
        assert_false(pcs_strmap_get(&m, "", NULL));
        assert_true(m.len * 2 <= m.cap); /* never more than half full */
        bool added = true;
        assert_int_equal(pcs_strmap_add(&m, keys[0], 99, &added), PCS_OK);
        assert_false(added); /* add never overwrites */
        uint32_t v = 0;
        assert_true(pcs_strmap_get(&m, keys[0], &v));
        assert_int_equal(v, want[0]);
        assert_int_equal(pcs_strmap_add(&m, "head.bias", 5, &added), PCS_OK);
        assert_true(added);
        assert_true(pcs_strmap_get(&m, "head.bias", &v));
        assert_int_equal(v, 5);
        pcs_strmap_free(&m);
        assert_int_equal(pcs_strmap_len(&m), 0);
        assert_int_equal(m.owns_keys, owned != 0); /* free keeps the map's mode */
        assert_false(pcs_strmap_get(&m, keys[0], NULL));
    }
}

/* Random puts and deletes against a presence oracle, in a small table where runs wrap around
 * its end: after each delete every remaining key is still found (the backward shift kept each
 * probe sequence whole) and every deleted one is gone; the table does not grow under churn. */
static void test_strmap_delete_keeps_every_probe_sequence_whole(void **state)
{
    (void)state;
    enum { N = 600 };
    static char keys[N][16];
    static bool in[N];
    static uint32_t want[N];
    for (int owned = 0; owned < 2; owned++) {
        pcs_strmap_t m = PCS_STRMAP_BORROWED;
        m.owns_keys = owned != 0;
        memset(in, 0, sizeof in);
        srand(11 + owned);
        for (int k = 0; k < N; k++)
            snprintf(keys[k], sizeof keys[k], "req-%d", k);
        size_t n = 0, cap_at_100k = 0;
        for (int i = 0; i < 200000; i++) {
            int k = rand() % N;
            if (n < 40 || rand() % 2) {
                want[k] = (uint32_t)i;
                n += !in[k];
                in[k] = true;
                assert_int_equal(pcs_strmap_put(&m, keys[k], want[k]), PCS_OK);
            } else {
                assert_int_equal(pcs_strmap_del(&m, keys[k]), in[k]);
                n -= in[k];
                in[k] = false;
            }
            assert_int_equal(pcs_strmap_len(&m), n);
            if (i % 997 == 0 || i > 199000) {
                for (int q = 0; q < N; q++) {
                    uint32_t v = 0;
                    assert_int_equal(pcs_strmap_get(&m, keys[q], &v), in[q]);
                    if (in[q])
                        assert_int_equal(v, want[q]);
                }
            }
            if (i == 100000)
                cap_at_100k = m.cap;
        }
        assert_int_equal(m.cap, cap_at_100k); /* churn at a steady size does not grow it */
        assert_false(pcs_strmap_del(&m, "never-there"));
        pcs_strmap_free(&m);
    }
}

/* An empty (zeroed) map answers lookups without a table; reserve sizes it once. */
static void test_strmap_empty_and_reserved(void **state)
{
    (void)state;
    pcs_strmap_t m = PCS_STRMAP_BORROWED;
    assert_false(pcs_strmap_get(&m, "x", NULL));
    assert_int_equal(pcs_strmap_reserve(&m, 1000), PCS_OK);
    size_t cap = m.cap;
    assert_true(cap >= 2000);
    char keys[1000][8];
    for (int i = 0; i < 1000; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        assert_int_equal(pcs_strmap_put(&m, keys[i], (uint32_t)i), PCS_OK);
    }
    assert_int_equal(m.cap, cap); /* no rehash within the reservation */
    pcs_strmap_free(&m);
    pcs_strmap_free(&m); /* twice is fine */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fnv1a64_matches_the_published_vectors),
        cmocka_unit_test(test_strmap_agrees_with_a_list_under_growth_and_overwrite),
        cmocka_unit_test(test_strmap_empty_and_reserved),
        cmocka_unit_test(test_strmap_delete_keeps_every_probe_sequence_whole),
    };
    return cmocka_run_group_tests_name("strmap", tests, NULL, NULL);
}
