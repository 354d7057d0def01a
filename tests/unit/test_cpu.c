/* pcs/cpu.h: the cgroup quota text as the kernel writes it, the CPUs this process may use, and
 * the split of a host's CPUs among the ranks on it. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sched.h>
#include <unistd.h>

#include "pcs/cpu.h"

static void test_quota_text_rounds_up_and_max_is_unlimited(void **state)
{
    (void)state;
    assert_int_equal(pcs_cpu_quota_parse("100000 100000\n"), 1);
    assert_int_equal(pcs_cpu_quota_parse("150000 100000\n"), 2); /* limits.cpu: 1500m */
    assert_int_equal(pcs_cpu_quota_parse("50000 100000"), 1);    /* half a CPU: still one */
    assert_int_equal(pcs_cpu_quota_parse("800000 100000"), 8);
    assert_int_equal(pcs_cpu_quota_parse("max 100000\n"), 0);
    assert_int_equal(pcs_cpu_quota_parse(""), 0);
    assert_int_equal(pcs_cpu_quota_parse("100000 0"), 0);
    assert_int_equal(pcs_cpu_quota_parse("abc def"), 0);
    assert_int_equal(pcs_cpu_quota_parse(NULL), 0);
}

/* The affinity mask bounds it: pinned to one CPU, this process may use one. */
static void test_available_follows_the_affinity_mask(void **state)
{
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int n = pcs_cpu_available();
    assert_true(n >= 1);
    assert_true(n <= CPU_COUNT(&all));
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(pcs_cpu_available(), 1);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(pcs_cpu_available(), n);
}

static void test_threads_per_rank_split_the_host(void **state)
{
    (void)state;
    assert_int_equal(pcs_cpu_threads_per_rank(2, 4), 1); /* 4 ranks on 2 cores: no BLAS pool */
    assert_int_equal(pcs_cpu_threads_per_rank(16, 4), 4);
    assert_int_equal(pcs_cpu_threads_per_rank(16, 3), 5);
    assert_int_equal(pcs_cpu_threads_per_rank(8, 0), 8); /* unknown: this rank alone */
    assert_int_equal(pcs_cpu_threads_per_rank(1, 1), 1);
    /* a rank already confined (its own cpuset or quota) uses what it was given; an unconfined
     * one shares the machine */
    assert_int_equal(pcs_cpu_rank_threads(4, 16, 4), 4);
    assert_int_equal(pcs_cpu_rank_threads(16, 16, 4), 4);
    assert_int_equal(pcs_cpu_rank_threads(2, 2, 4), 1);
    assert_int_equal(pcs_cpu_rank_threads(1, 8, 8), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quota_text_rounds_up_and_max_is_unlimited),
        cmocka_unit_test(test_available_follows_the_affinity_mask),
        cmocka_unit_test(test_threads_per_rank_split_the_host),
    };
    return cmocka_run_group_tests_name("cpu", tests, NULL, NULL);
}
