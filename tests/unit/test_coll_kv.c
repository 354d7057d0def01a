/* Rendezvous KV stores: the file store's set/get/wait semantics, key validation and escaping,
 * and values that readers never see half-written. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/kv.h"
#include "pcs/clock.h"
#include "test_util.h"

static void test_file_set_then_get_returns_bytes_and_nul(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(dir, &kv), PCS_OK);
    const char bin[5] = {'a', 0, 'b', (char)0xff, 'c'};
    assert_int_equal(pcs_kv_set(kv, "world/0/gloo/0", bin, sizeof bin), PCS_OK);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(pcs_kv_get(kv, "world/0/gloo/0", 0, &v, &n), PCS_OK);
    assert_int_equal(n, sizeof bin);
    assert_memory_equal(v, bin, sizeof bin);
    assert_int_equal(((char *)v)[n], 0);
    free(v);
    /* overwrite */
    assert_int_equal(pcs_kv_set(kv, "world/0/gloo/0", "xy", 2), PCS_OK);
    assert_int_equal(pcs_kv_get(kv, "world/0/gloo/0", 0, &v, &n), PCS_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(v, "xy", 2);
    free(v);
    /* empty value */
    assert_int_equal(pcs_kv_set(kv, "empty", NULL, 0), PCS_OK);
    assert_int_equal(pcs_kv_get(kv, "empty", 0, &v, &n), PCS_OK);
    assert_int_equal(n, 0);
    free(v);
    pcs_kv_destroy(kv);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_file_keys_that_differ_only_in_escaped_bytes_stay_distinct(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(dir, &kv), PCS_OK);
    assert_int_equal(pcs_kv_set(kv, "a/b", "1", 1), PCS_OK);
    assert_int_equal(pcs_kv_set(kv, "a%2Fb", "2", 1), PCS_OK);
    assert_int_equal(pcs_kv_set(kv, "a_b", "3", 1), PCS_OK);
    void *v;
    size_t n;
    assert_int_equal(pcs_kv_get(kv, "a/b", 0, &v, &n), PCS_OK);
    assert_memory_equal(v, "1", 1);
    free(v);
    assert_int_equal(pcs_kv_get(kv, "a%2Fb", 0, &v, &n), PCS_OK);
    assert_memory_equal(v, "2", 1);
    free(v);
    assert_int_equal(pcs_kv_get(kv, "a_b", 0, &v, &n), PCS_OK);
    assert_memory_equal(v, "3", 1);
    free(v);
    pcs_kv_destroy(kv);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_file_missing_key_is_not_found_after_the_wait(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(dir, &kv), PCS_OK);
    void *v = (void *)1;
    size_t n = 7;
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(pcs_kv_get(kv, "nope", 150, &v, &n), PCS_ERR_NOT_FOUND);
    uint64_t dt = pcs_now_ms() - t0;
    assert_true(dt >= 150 && dt < 2000);
    assert_null(v);
    assert_int_equal(n, 0);
    pcs_kv_destroy(kv);
    pcs_test_rmtree(dir);
    free(dir);
}

typedef struct setter {
    pcs_kv_t *kv;
    int delay_ms;
} setter_t;

static void *late_set(void *p)
{
    setter_t *st = p;
    pcs_test_sleep_ms(st->delay_ms);
    pcs_kv_set(st->kv, "late", "here", 4);
    return NULL;
}

static void test_file_get_waits_for_a_later_set(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(dir, &kv), PCS_OK);
    setter_t st = {kv, 100};
    pthread_t th;
    pthread_create(&th, NULL, late_set, &st);
    void *v;
    size_t n;
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(pcs_kv_get(kv, "late", 5000, &v, &n), PCS_OK);
    assert_true(pcs_now_ms() - t0 < 2000);
    assert_int_equal(n, 4);
    assert_memory_equal(v, "here", 4);
    free(v);
    pthread_join(th, NULL);
    pcs_kv_destroy(kv);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_bad_keys_and_values_are_invalid_arg(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(dir, &kv), PCS_OK);
    char longkey[PCS_KV_MAX_KEY + 2];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    assert_int_equal(pcs_kv_set(kv, longkey, "x", 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(kv, "", "x", 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(kv, NULL, "x", 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(kv, "tab\there", "x", 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(kv, "k", NULL, 3), PCS_ERR_INVALID_ARG);
    char *big = calloc(PCS_KV_MAX_VALUE + 1, 1);
    assert_int_equal(pcs_kv_set(kv, "k", big, PCS_KV_MAX_VALUE + 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(kv, "k", big, PCS_KV_MAX_VALUE), PCS_OK);
    free(big);
    void *v;
    size_t n;
    assert_int_equal(pcs_kv_get(kv, "", 0, &v, &n), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_get(NULL, "k", 0, &v, &n), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_file_create("", &kv), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_kv_set(NULL, "k", "x", 1), PCS_ERR_INVALID_ARG);
    pcs_kv_destroy(kv);
    pcs_kv_destroy(NULL);
    pcs_test_rmtree(dir);
    free(dir);
}

/* No coordinator listening: every call fails with a clear status within the RPC deadline. */
static void test_coord_store_unreachable_is_an_error_not_a_hang(void **s)
{
    (void)s;
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_coord_create("127.0.0.1:1", "job-1", 1, 300, &kv), PCS_OK);
    uint64_t t0 = pcs_now_ms();
    pcs_status_t rc = pcs_kv_set(kv, "k", "v", 1);
    assert_true(rc == PCS_ERR_REMOTE || rc == PCS_ERR_TIMEOUT);
    void *v = NULL;
    size_t n = 0;
    rc = pcs_kv_get(kv, "k", 200, &v, &n);
    assert_true(rc == PCS_ERR_REMOTE || rc == PCS_ERR_TIMEOUT);
    assert_null(v);
    assert_true(pcs_now_ms() - t0 < 5000);
    assert_int_equal(pcs_kv_coord_create(NULL, "job-1", 1, 300, &kv), PCS_ERR_INVALID_ARG);
    pcs_kv_destroy(kv);
}

/* A store whose directory went away (or was replaced by a file) fails with an error that names
 * the store and the path, not with a bare status and someone else's last error. */
static void test_file_store_errors_say_what_failed(void **s)
{
    (void)s;
    char *dir = pcs_test_tmpdir("kv");
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/store", dir);
    pcs_kv_t *kv = NULL;
    assert_int_equal(pcs_kv_file_create(sub, &kv), PCS_OK);
    assert_int_equal(rmdir(sub), 0);
    pcs_set_error(PCS_ERR_INTERNAL, "stale");
    assert_int_equal(pcs_kv_set(kv, "k", "x", 1), PCS_ERR_SYSTEM);
    assert_non_null(strstr(pcs_last_error(), "kv file"));
    assert_non_null(strstr(pcs_last_error(), sub));
    FILE *f = fopen(sub, "w"); /* the directory is now a file: open fails with ENOTDIR */
    assert_non_null(f);
    fclose(f);
    pcs_set_error(PCS_ERR_INTERNAL, "stale");
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(pcs_kv_get(kv, "k", 0, &v, &n), PCS_ERR_SYSTEM);
    assert_null(v);
    assert_non_null(strstr(pcs_last_error(), "kv file"));
    pcs_kv_destroy(kv);
    char sub2[1200];
    snprintf(sub2, sizeof sub2, "%s/x", sub); /* parent is a file */
    pcs_set_error(PCS_ERR_INTERNAL, "stale");
    assert_int_equal(pcs_kv_file_create(sub2, &kv), PCS_ERR_SYSTEM);
    assert_non_null(strstr(pcs_last_error(), "kv file: mkdir"));
    pcs_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_set_then_get_returns_bytes_and_nul),
        cmocka_unit_test(test_file_keys_that_differ_only_in_escaped_bytes_stay_distinct),
        cmocka_unit_test(test_file_missing_key_is_not_found_after_the_wait),
        cmocka_unit_test(test_file_get_waits_for_a_later_set),
        cmocka_unit_test(test_bad_keys_and_values_are_invalid_arg),
        cmocka_unit_test(test_coord_store_unreachable_is_an_error_not_a_hang),
        cmocka_unit_test(test_file_store_errors_say_what_failed),
    };
    return cmocka_run_group_tests_name("coll_kv", tests, NULL, NULL);
}
