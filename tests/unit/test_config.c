/* Unit tests of the option-table engine (common/config.c): precedence default < file < env <
 * flag, errors that name their source, type and bounds checks, positional arguments, --help,
 * and the dump/help/markdown printers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcs/config.h"
#include "test_util.h"

static const pcs_opt_t table[] = {
    {"heartbeat-interval-ms", PCS_OPT_U32, "1000", 10, 60000, "worker heartbeat period"},
    {"heartbeat-timeout-ms", PCS_OPT_U32, "5000", 50, 600000, "declare a worker dead after this"},
    {"max-bytes", PCS_OPT_U64, "4194304", 0, 0, "largest message"},
    {"lr-scale", PCS_OPT_DOUBLE, "1.0", 0.0, 10.0, "learning-rate multiplier"},
    {"metrics", PCS_OPT_BOOL, "false", 0, 0, "serve /metrics"},
    {"listen", PCS_OPT_STRING, "0.0.0.0:7070", 0, 0, "gRPC listen address"},
    {"auth-token", PCS_OPT_STRING, "", 0, 0, "bearer token"},
};
#define N_OPTS (sizeof table / sizeof table[0])

static const char *const env_keys[] = {
    "PCS_HEARTBEAT_INTERVAL_MS",
    "PCS_HEARTBEAT_TIMEOUT_MS",
    "PCS_MAX_BYTES",
    "PCS_LR_SCALE",
    "PCS_METRICS",
    "PCS_LISTEN",
    "PCS_AUTH_TOKEN",
    "PCS_CONFIG",
};

typedef struct fx {
    char *dir;
    char path[512];
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->dir = pcs_test_tmpdir("config");
    snprintf(f->path, sizeof f->path, "%s/pcs.conf", f->dir);
    for (size_t i = 0; i < sizeof env_keys / sizeof env_keys[0]; i++)
        unsetenv(env_keys[i]);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    for (size_t i = 0; i < sizeof env_keys / sizeof env_keys[0]; i++)
        unsetenv(env_keys[i]);
    pcs_test_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* argv from a NULL-terminated list of literals (argv[0] is the program). */
#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})

static pcs_status_t load(int argc, char **argv, pcs_config_t **out)
{
    return pcs_config_load(table, N_OPTS, argc, argv, out);
}

// ---- tests ----

static void test_defaults_apply_with_source_default(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    char *argv[] = {"prog", NULL};
    assert_int_equal(load(1, argv, &c), PCS_OK);
    assert_int_equal(pcs_config_u32(c, "heartbeat-interval-ms"), 1000);
    assert_int_equal(pcs_config_u64(c, "max-bytes"), 4194304);
    assert_true(pcs_config_double(c, "lr-scale") == 1.0);
    assert_int_equal(pcs_config_bool(c, "metrics"), 0);
    assert_string_equal(pcs_config_str(c, "listen"), "0.0.0.0:7070");
    assert_int_equal(pcs_config_source(c, "listen"), PCS_SRC_DEFAULT);
    assert_string_equal(pcs_config_origin(c, "listen"), "default");
    assert_int_equal(pcs_config_help_requested(c), 0);
    int n = -1;
    char **args = pcs_config_args(c, &n);
    assert_int_equal(n, 0);
    assert_null(args[0]);
    pcs_config_free(c);
}

static void test_precedence_is_default_then_file_then_env_then_flag(void **state)
{
    fx_t *f = *state;
    write_file(f->path, "# comment line\n"
                        "heartbeat-interval-ms 200\n"
                        "heartbeat-timeout-ms 700   # trailing comment\n"
                        "  listen   \"10.0.0.1:7070\"\n"
                        "\n"
                        "lr-scale = 2.5\n");
    setenv("PCS_HEARTBEAT_INTERVAL_MS", "300", 1);
    setenv("PCS_HEARTBEAT_TIMEOUT_MS", "800", 1);
    char **argv = ARGV("--config", f->path, "--heartbeat-interval-ms", "400");
    pcs_config_t *c = NULL;
    assert_int_equal(load(5, argv, &c), PCS_OK);
    assert_int_equal(pcs_config_u32(c, "heartbeat-interval-ms"), 400); /* flag > env > file */
    assert_int_equal(pcs_config_source(c, "heartbeat-interval-ms"), PCS_SRC_FLAG);
    assert_string_equal(pcs_config_origin(c, "heartbeat-interval-ms"),
                        "flag --heartbeat-interval-ms");
    assert_int_equal(pcs_config_u32(c, "heartbeat-timeout-ms"), 800); /* env > file */
    assert_int_equal(pcs_config_source(c, "heartbeat-timeout-ms"), PCS_SRC_ENV);
    assert_string_equal(pcs_config_origin(c, "heartbeat-timeout-ms"),
                        "env PCS_HEARTBEAT_TIMEOUT_MS");
    assert_string_equal(pcs_config_str(c, "listen"), "10.0.0.1:7070"); /* file > default */
    assert_int_equal(pcs_config_source(c, "listen"), PCS_SRC_FILE);
    assert_true(pcs_config_double(c, "lr-scale") == 2.5);
    assert_int_equal(pcs_config_u64(c, "max-bytes"), 4194304); /* untouched: default */
    assert_int_equal(pcs_config_source(c, "max-bytes"), PCS_SRC_DEFAULT);
    pcs_config_free(c);

    /* --key=value form, env PCS_CONFIG naming the file, later flags win */
    setenv("PCS_CONFIG", f->path, 1);
    unsetenv("PCS_HEARTBEAT_INTERVAL_MS");
    char **argv2 = ARGV("--heartbeat-timeout-ms=900", "--heartbeat-timeout-ms=950");
    assert_int_equal(load(3, argv2, &c), PCS_OK);
    assert_int_equal(pcs_config_u32(c, "heartbeat-interval-ms"), 200);
    assert_int_equal(pcs_config_u32(c, "heartbeat-timeout-ms"), 950);
    pcs_config_free(c);
}

static void test_out_of_range_errors_name_the_source(void **state)
{
    fx_t *f = *state;
    pcs_config_t *c = (void *)1;
    setenv("PCS_HEARTBEAT_TIMEOUT_MS", "5", 1);
    char *argv[] = {"prog", NULL};
    assert_int_equal(load(1, argv, &c), PCS_ERR_INVALID_ARG);
    assert_null(c);
    assert_string_equal(pcs_last_error(),
                        "heartbeat-timeout-ms=5 (env PCS_HEARTBEAT_TIMEOUT_MS): must be in "
                        "[50, 600000]");
    unsetenv("PCS_HEARTBEAT_TIMEOUT_MS");

    write_file(f->path, "listen :1\nheartbeat-interval-ms 70000\n");
    char **argv2 = ARGV("--config", f->path);
    assert_int_equal(load(3, argv2, &c), PCS_ERR_INVALID_ARG);
    char want[700];
    snprintf(want, sizeof want, "heartbeat-interval-ms=70000 (file %s:2): must be in [10, 60000]",
             f->path);
    assert_string_equal(pcs_last_error(), want);

    char **argv3 = ARGV("--lr-scale", "11");
    assert_int_equal(load(3, argv3, &c), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "lr-scale=11 (flag --lr-scale): must be in [0, 10]");
}

static void test_malformed_numbers_are_rejected(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    const char *bad[][2] = {
        {"--heartbeat-interval-ms", "-5"},
        {"--heartbeat-interval-ms", "12abc"},
        {"--heartbeat-interval-ms", ""},
        {"--max-bytes", "99999999999999999999999"},
        {"--lr-scale", "nan"},
        {"--lr-scale", "1.5x"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"prog", (char *)bad[i][0], (char *)bad[i][1], NULL};
        assert_int_equal(load(3, argv, &c), PCS_ERR_INVALID_ARG);
        assert_non_null(strstr(pcs_last_error(), "(flag --"));
    }
    /* u32 type range applies even without table bounds */
    static const pcs_opt_t t2[] = {{"n", PCS_OPT_U32, "0", 0, 0, "n"}};
    char **argv = ARGV("--n", "4294967296");
    assert_int_equal(pcs_config_load(t2, 1, 3, argv, &c), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "[0, 4294967295]"));
    char **ok = ARGV("--max-bytes", "0x10", "--lr-scale", "1e-3");
    assert_int_equal(load(5, ok, &c), PCS_OK);
    assert_int_equal(pcs_config_u64(c, "max-bytes"), 16);
    assert_true(pcs_config_double(c, "lr-scale") == 1e-3);
    pcs_config_free(c);
}

static void test_unknown_keys_are_errors_in_file_and_flags(void **state)
{
    fx_t *f = *state;
    pcs_config_t *c = NULL;
    write_file(f->path, "listen :1\n\nhearbeat-interval-ms 100\n");
    char **argv = ARGV("--config", f->path);
    assert_int_equal(load(3, argv, &c), PCS_ERR_INVALID_ARG);
    char want[700];
    snprintf(want, sizeof want, "unknown option 'hearbeat-interval-ms' (file %s:3)", f->path);
    assert_string_equal(pcs_last_error(), want);

    char **argv2 = ARGV("--no-such-thing", "1");
    assert_int_equal(load(3, argv2, &c), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "unknown option '--no-such-thing' (flag)");
    char **argv3 = ARGV("-x");
    assert_int_equal(load(2, argv3, &c), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "'-x'"));
    char **argv4 = ARGV("--config", "/nonexistent/pcs.conf");
    assert_int_equal(load(3, argv4, &c), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "/nonexistent/pcs.conf"));
    /* a quoted value is the whole value: text after the quote (other than a comment) is an error,
     * and so is a quote that never closes */
    write_file(f->path, "listen \"10.0.0.1:7070\"   # ok\nlisten \"10.0.0.1\":7070\n");
    char **argv6 = ARGV("--config", f->path);
    assert_int_equal(load(3, argv6, &c), PCS_ERR_INVALID_ARG);
    snprintf(want, sizeof want, "listen (file %s:2): text after the closing quote", f->path);
    assert_string_equal(pcs_last_error(), want);
    write_file(f->path, "listen \"10.0.0.1:7070\n");
    assert_int_equal(load(3, argv6, &c), PCS_ERR_INVALID_ARG);
    snprintf(want, sizeof want, "listen (file %s:1): unterminated quote", f->path);
    assert_string_equal(pcs_last_error(), want);
    char **argv5 = ARGV("--listen");
    assert_int_equal(load(2, argv5, &c), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "--listen needs a value (flag)");
}

static void test_bool_forms_parse_from_every_source(void **state)
{
    fx_t *f = *state;
    pcs_config_t *c = NULL;
    char **a1 = ARGV("--metrics");
    assert_int_equal(load(2, a1, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "metrics"), 1);
    assert_string_equal(pcs_config_str(c, "metrics"), "true");
    pcs_config_free(c);
    char **a2 = ARGV("--metrics", "--no-metrics");
    assert_int_equal(load(3, a2, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "metrics"), 0);
    pcs_config_free(c);
    setenv("PCS_METRICS", "Yes", 1);
    char **a3 = ARGV("pos");
    assert_int_equal(load(2, a3, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "metrics"), 1);
    pcs_config_free(c);
    char **a4 = ARGV("--metrics=off");
    assert_int_equal(load(2, a4, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "metrics"), 0);
    pcs_config_free(c);
    unsetenv("PCS_METRICS");
    write_file(f->path, "metrics on\n");
    char **a5 = ARGV("--config", f->path);
    assert_int_equal(load(3, a5, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "metrics"), 1);
    pcs_config_free(c);
    char **a6 = ARGV("--metrics=maybe");
    assert_int_equal(load(2, a6, &c), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "metrics=maybe (flag --metrics): not a boolean"));
}

static void test_positional_args_keep_order_and_double_dash_ends_options(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    char **argv = ARGV("submit", "--listen", "h:1", "job.yaml", "-5", "--", "--metrics", "-");
    assert_int_equal(load(9, argv, &c), PCS_OK);
    int n = 0;
    char **args = pcs_config_args(c, &n);
    assert_int_equal(n, 5);
    assert_string_equal(args[0], "submit");
    assert_string_equal(args[1], "job.yaml");
    assert_string_equal(args[2], "-5");
    assert_string_equal(args[3], "--metrics");
    assert_string_equal(args[4], "-");
    assert_null(args[5]);
    assert_string_equal(pcs_config_str(c, "listen"), "h:1");
    assert_int_equal(pcs_config_bool(c, "metrics"), 0); /* after --: not an option */
    pcs_config_free(c);
}

static void test_help_flag_is_reported_not_an_error(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    char **argv = ARGV("--help");
    assert_int_equal(load(2, argv, &c), PCS_OK);
    assert_int_equal(pcs_config_help_requested(c), 1);
    pcs_config_free(c);
    char **argv2 = ARGV("-h", "--listen", "x:1");
    assert_int_equal(load(4, argv2, &c), PCS_OK);
    assert_int_equal(pcs_config_help_requested(c), 1);
    pcs_config_free(c);
}

static void test_dump_lists_every_key_and_masks_secrets(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    char **argv = ARGV("--auth-token", "s3cr3t", "--metrics");
    assert_int_equal(load(4, argv, &c), PCS_OK);
    assert_string_equal(pcs_config_str(c, "auth-token"), "s3cr3t"); /* the program sees it */
    char buf[2048];
    size_t need = pcs_config_dump(c, buf, sizeof buf);
    assert_int_equal(need, strlen(buf));
    assert_non_null(strstr(buf, "heartbeat-interval-ms:1000\n"));
    assert_non_null(strstr(buf, "metrics:true\n"));
    assert_non_null(strstr(buf, "auth-token:***\n"));
    assert_null(strstr(buf, "s3cr3t"));
    char small[16];
    assert_int_equal(pcs_config_dump(c, small, sizeof small), need); /* snprintf-like */
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(pcs_config_dump(c, NULL, 0), need);
    pcs_config_log_nondefault(c);
    pcs_config_free(c);
}

static char *capture_stdout(void (*fn)(void))
{
    char *dir = pcs_test_tmpdir("config-out");
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    fflush(stdout);
    int saved = dup(1);
    FILE *fp = fopen(path, "w");
    dup2(fileno(fp), 1);
    fn();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(fp);
    char *text = pcs_test_read_file(path, NULL);
    pcs_test_rmtree(dir);
    free(dir);
    return text;
}

static void print_help(void)
{
    pcs_config_print_help(table, N_OPTS, "usage: prog [options]");
}

static void print_md(void)
{
    pcs_config_print_markdown(table, N_OPTS);
}

static void test_help_and_markdown_show_defaults_bounds_and_env_names(void **state)
{
    (void)state;
    char *help = capture_stdout(print_help);
    assert_non_null(help);
    assert_non_null(strstr(help, "usage: prog [options]"));
    assert_non_null(strstr(help, "--heartbeat-timeout-ms N"));
    assert_non_null(strstr(help, "default 5000, range [50, 600000], env PCS_HEARTBEAT_TIMEOUT_MS"));
    assert_non_null(strstr(help, "--no-metrics"));
    free(help);
    char *md = capture_stdout(print_md);
    assert_non_null(md);
    assert_non_null(strstr(md, "| option | env | type | default | range | description |"));
    assert_non_null(strstr(md, "| `heartbeat-interval-ms` | `PCS_HEARTBEAT_INTERVAL_MS` | u32 | "
                               "`1000` | [10, 60000] | worker heartbeat period |"));
    free(md);
}

static void test_table_bugs_are_internal_errors(void **state)
{
    (void)state;
    pcs_config_t *c = NULL;
    char *argv[] = {"prog", NULL};
    static const pcs_opt_t bad_default[] = {{"x", PCS_OPT_U32, "5", 10, 20, "x"}};
    assert_int_equal(pcs_config_load(bad_default, 1, 1, argv, &c), PCS_ERR_INTERNAL);
    assert_non_null(strstr(pcs_last_error(), "x=5 (default): must be in [10, 20]"));
    static const pcs_opt_t dup[] = {{"x", PCS_OPT_U32, "5", 0, 0, "x"},
                                    {"x", PCS_OPT_U32, "5", 0, 0, "x"}};
    assert_int_equal(pcs_config_load(dup, 2, 1, argv, &c), PCS_ERR_INTERNAL);
    static const pcs_opt_t reserved[] = {{"config", PCS_OPT_STRING, "", 0, 0, "x"}};
    assert_int_equal(pcs_config_load(reserved, 1, 1, argv, &c), PCS_ERR_INTERNAL);
    /* wrong-type reads are refused, not reinterpreted */
    assert_int_equal(pcs_config_load(table, N_OPTS, 1, argv, &c), PCS_OK);
    assert_int_equal(pcs_config_bool(c, "listen"), 0);
    assert_null(pcs_config_str(c, "no-such-key"));
    assert_int_equal(pcs_config_u64(c, "heartbeat-interval-ms"), 1000); /* widening is fine */
    pcs_config_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults_apply_with_source_default, setup, teardown),
        cmocka_unit_test_setup_teardown(test_precedence_is_default_then_file_then_env_then_flag,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range_errors_name_the_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_numbers_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_keys_are_errors_in_file_and_flags, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bool_forms_parse_from_every_source, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_positional_args_keep_order_and_double_dash_ends_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_flag_is_reported_not_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_lists_every_key_and_masks_secrets, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_help_and_markdown_show_defaults_bounds_and_env_names,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_bugs_are_internal_errors, setup, teardown),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
