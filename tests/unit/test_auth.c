/* Bearer-token roles (coordinator/auth.c): token-file parsing errors name file and line, the role
 * each method needs, and check results for every role against every kind of method. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "coordinator/auth.h"
#include "pcs/rpc.h"

static const char *file = "# roles\n"
                          "viewer    view-0123456789abcdef\n"
                          "submitter sub-0123456789abcdef   # CI\n"
                          "\n"
                          "worker    wrk-0123456789abcdef\n"
                          "admin     adm-0123456789abcdef\n";

static void expect_parse_error(const char *text, const char *needle)
{
    pcs_auth_t *a = (pcs_auth_t *)0x1;
    assert_int_equal(pcs_auth_parse(text, "tokens.conf", &a), PCS_ERR_INVALID_ARG);
    assert_null(a);
    if (!strstr(pcs_last_error(), needle))
        fail_msg("error '%s' lacks '%s'", pcs_last_error(), needle);
}

static void test_token_file_errors_name_file_and_line(void **state)
{
    (void)state;
    expect_parse_error("viewer view-0123456789abcdef\nroot root-0123456789abcdef\n",
                       "tokens.conf:2: unknown role 'root'");
    expect_parse_error("viewer\n", "tokens.conf:1: expected `role token [name]`");
    expect_parse_error("viewer view-0123456789abcdef alice extra\n",
                       "tokens.conf:1: expected `role token [name]`");
    expect_parse_error("submitter sub-0123456789abcdef al/ice\n",
                       "tokens.conf:1: name 'al/ice' must be 1-64 of [A-Za-z0-9._@-]");
    expect_parse_error("viewer short\n", "tokens.conf:1: token shorter than 16");
    expect_parse_error("viewer view-0123456789abcdef\nadmin view-0123456789abcdef\n",
                       "tokens.conf:2: token given twice");
    expect_parse_error("# nothing\n\n", "tokens.conf: no tokens");
}

/* Each token acts as a principal: the name after it, or "token:" and 12 hex digits of its
 * SHA-256 (the same for the same token, whatever line it is on); pcs_auth_identify says which
 * token a call carries and pcs_auth_principal / pcs_auth_role what it is. */
static void test_tokens_name_their_principals(void **state)
{
    (void)state;
    pcs_auth_t *a = NULL;
    assert_int_equal(pcs_auth_parse("submitter alice-0123456789abcdef alice\n"
                                    "submitter alice-new-0123456789ab alice   # rotated\n"
                                    "admin adm-0123456789abcdef\n",
                                    "t", &a),
                     PCS_OK);
    long e = -2;
    assert_int_equal(pcs_auth_identify(a, PCS_M_SUBMIT_JOB, "Bearer alice-new-0123456789ab", &e),
                     PCS_OK);
    assert_int_equal(e, 1);
    assert_string_equal(pcs_auth_principal(a, e), "alice");
    assert_int_equal(pcs_auth_role(a, e), PCS_ROLE_SUBMITTER | PCS_ROLE_VIEWER);
    assert_int_equal(pcs_auth_identify(a, PCS_M_CANCEL_JOB, "Bearer adm-0123456789abcdef", &e),
                     PCS_OK);
    /* `printf adm-0123456789abcdef | sha256sum` begins 21305c17ef80 */
    const char *p = pcs_auth_principal(a, e);
    assert_string_equal(p, "token:21305c17ef80");
    assert_int_equal(pcs_auth_role(a, e), PCS_ROLE_ADMIN);
    /* the health service needs no token: no entry */
    assert_int_equal(pcs_auth_identify(a, PCS_M_HEALTH_CHECK, NULL, &e), PCS_OK);
    assert_int_equal(e, -1);
    assert_null(pcs_auth_principal(a, -1));
    assert_null(pcs_auth_principal(a, 3));
    assert_int_equal(pcs_auth_role(a, 7), PCS_ROLE_NONE);
    /* the same token on another line of another file: the same principal */
    pcs_auth_t *b = NULL;
    assert_int_equal(pcs_auth_parse("viewer view-0123456789abcdef\nadmin adm-0123456789abcdef\n",
                                    "u", &b),
                     PCS_OK);
    assert_int_equal(pcs_auth_identify(b, PCS_M_CANCEL_JOB, "Bearer adm-0123456789abcdef", &e),
                     PCS_OK);
    assert_int_equal(e, 1);
    assert_string_equal(pcs_auth_principal(b, e), p);
    pcs_auth_free(a);
    pcs_auth_free(b);
}

static void test_methods_need_the_documented_roles(void **state)
{
    (void)state;
    assert_int_equal(pcs_auth_method_role(PCS_M_HEALTH_CHECK), PCS_ROLE_NONE);
    assert_int_equal(pcs_auth_method_role(PCS_M_HEALTH_WATCH), PCS_ROLE_NONE);
    assert_int_equal(pcs_auth_method_role(PCS_M_REGISTER), PCS_ROLE_WORKER);
    assert_int_equal(pcs_auth_method_role(PCS_M_KV_GET), PCS_ROLE_WORKER);
    assert_int_equal(pcs_auth_method_role(PCS_M_SUBMIT_JOB), PCS_ROLE_SUBMITTER);
    assert_int_equal(pcs_auth_method_role(PCS_M_CANCEL_JOB), PCS_ROLE_SUBMITTER);
    assert_int_equal(pcs_auth_method_role(PCS_M_LIST_JOBS), PCS_ROLE_VIEWER);
    assert_int_equal(pcs_auth_method_role(PCS_M_GET_STATUS), PCS_ROLE_VIEWER);
    assert_int_equal(pcs_auth_method_role(PCS_M_DRY_RUN_PLAN), PCS_ROLE_VIEWER);
}

static void test_each_role_may_call_exactly_its_methods(void **state)
{
    (void)state;
    pcs_auth_t *a = NULL;
    assert_int_equal(pcs_auth_parse(file, "tokens.conf", &a), PCS_OK);
    assert_int_equal(pcs_auth_count(a), 4);
    static const struct {
        const char *token, *method;
        pcs_status_t want;
    } rows[] = {
        {"Bearer view-0123456789abcdef", PCS_M_LIST_JOBS, PCS_OK},
        {"Bearer view-0123456789abcdef", PCS_M_SUBMIT_JOB, PCS_ERR_PERMISSION},
        {"Bearer view-0123456789abcdef", PCS_M_REGISTER, PCS_ERR_PERMISSION},
        {"Bearer sub-0123456789abcdef", PCS_M_SUBMIT_JOB, PCS_OK},
        {"Bearer sub-0123456789abcdef", PCS_M_GET_JOB, PCS_OK},
        {"Bearer sub-0123456789abcdef", PCS_M_HEARTBEAT, PCS_ERR_PERMISSION},
        {"Bearer wrk-0123456789abcdef", PCS_M_KV_SET, PCS_OK},
        {"Bearer wrk-0123456789abcdef", PCS_M_LIST_WORKERS, PCS_OK},
        {"Bearer wrk-0123456789abcdef", PCS_M_CANCEL_JOB, PCS_ERR_PERMISSION},
        {"Bearer adm-0123456789abcdef", PCS_M_CANCEL_JOB, PCS_OK},
        {"Bearer adm-0123456789abcdef", PCS_M_REPORT_STEP, PCS_OK},
        {"Bearer adm-0123456789abcde", PCS_M_LIST_JOBS, PCS_ERR_UNAUTHENTICATED},   /* prefix */
        {"Bearer adm-0123456789abcdefX", PCS_M_LIST_JOBS, PCS_ERR_UNAUTHENTICATED}, /* longer */
        {"adm-0123456789abcdef", PCS_M_LIST_JOBS, PCS_ERR_UNAUTHENTICATED},         /* no scheme */
        {NULL, PCS_M_LIST_JOBS, PCS_ERR_UNAUTHENTICATED},
        {NULL, PCS_M_HEALTH_CHECK, PCS_OK},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        pcs_status_t st = pcs_auth_check(a, rows[i].method, rows[i].token);
        if (st != rows[i].want)
            fail_msg("row %zu: %s with '%s': got %s, want %s (%s)", i, rows[i].method,
                     rows[i].token ? rows[i].token : "(none)", pcs_status_str(st),
                     pcs_status_str(rows[i].want), pcs_last_error());
        /* refusals never echo the presented token */
        if (st != PCS_OK && rows[i].token)
            assert_null(strstr(pcs_last_error(), rows[i].token + 7));
    }
    pcs_auth_free(a);
    /* no token file: everything passes */
    assert_int_equal(pcs_auth_check(NULL, PCS_M_SUBMIT_JOB, NULL), PCS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_file_errors_name_file_and_line),
        cmocka_unit_test(test_tokens_name_their_principals),
        cmocka_unit_test(test_methods_need_the_documented_roles),
        cmocka_unit_test(test_each_role_may_call_exactly_its_methods),
    };
    return cmocka_run_group_tests_name("auth", tests, NULL, NULL);
}
