/* The real pcs-coordinator served over TLS (and mTLS) with pcsctl as the client: the client's TLS
 * settings come from PCS_TLS_CA / PCS_TLS_CLIENT_CERT / PCS_TLS_CLIENT_KEY (common/rpc_client.c),
 * a plaintext or unverified client is refused, and a non-loopback listen without TLS needs
 * --insecure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

typedef struct fx {
    char *dir;
    pid_t coord;
    char addr[64];
} fx_t;

static int make_certs(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && ( printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
             "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes' && "
             "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=pcs-test-ca && "
             "openssl req -x509 $K -keyout other.key -out other.pem -days 2 -subj /CN=other && "
             "openssl req $K -keyout srv.key -out srv.csr -subj /CN=localhost && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
             "-extfile san.ext -out srv.pem && "
             "openssl req $K -keyout cli.key -out cli.csr -subj /CN=worker-0 && "
             "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
             "-out cli.pem ) >openssl.log 2>&1",
             dir);
    int status = -1;
    free(pcs_test_run(cmd, &status));
    return status == 0;
}

static int start(fx_t *f, int mtls)
{
    char cert[1024], key[1024], ca[1024];
    snprintf(cert, sizeof cert, "%s/srv.pem", f->dir);
    snprintf(key, sizeof key, "%s/srv.key", f->dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", f->dir);
    const char *args[] = {"--tls-cert", cert, "--tls-key", key,
                          mtls ? "--tls-client-ca" : NULL, ca, NULL};
    f->coord = pcs_test_start_coordinator(f->dir, args, f->addr, sizeof f->addr);
    return f->coord > 0;
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->dir = pcs_test_tmpdir("tls");
    if (!make_certs(f->dir)) {
        fprintf(stderr, "openssl could not make test certificates\n");
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    if (f->coord > 0)
        pcs_test_stop(f->coord, 5000);
    pcs_test_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* Run pcsctl health with the given environment prefix; returns its exit code, output in *out. */
static int ctl_health(const fx_t *f, const char *env, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && %s %s --coordinator %s --timeout-ms 3000 health 2>&1",
             f->dir, env, pcs_test_bin("pcsctl"), f->addr);
    int status = -1;
    *out = pcs_test_run(cmd, &status);
    return status;
}

/* pcsctl workers over mTLS (the test's client certificate). */
static void ctl_workers(const fx_t *f, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && PCS_TLS_CA=ca.pem PCS_TLS_TARGET_NAME=localhost PCS_TLS_CLIENT_CERT=cli.pem "
             "PCS_TLS_CLIENT_KEY=cli.key %s --coordinator %s --timeout-ms 3000 workers 2>&1",
             f->dir, pcs_test_bin("pcsctl"), f->addr);
    int status = -1;
    *out = pcs_test_run(cmd, &status);
}

static void test_tls_coordinator_serves_verified_clients_only(void **state)
{
    fx_t *f = *state;
    assert_true(start(f, 0));
    char *out = NULL;
    assert_int_equal(ctl_health(f, "PCS_TLS_CA=ca.pem PCS_TLS_TARGET_NAME=localhost", &out), 0);
    assert_non_null(strstr(out, "SERVING"));
    free(out);
    /* plaintext client against the TLS port: refused, with the transport's reason */
    assert_int_equal(ctl_health(f, "", &out), 1);
    assert_non_null(strstr(out, "UNAVAILABLE"));
    free(out);
    /* a client that trusts another CA does not accept the server */
    assert_int_equal(ctl_health(f, "PCS_TLS_CA=other.pem PCS_TLS_TARGET_NAME=localhost", &out),
                     1);
    free(out);
}

static void test_mtls_coordinator_requires_a_client_certificate(void **state)
{
    fx_t *f = *state;
    assert_true(start(f, 1));
    char *out = NULL;
    assert_int_equal(ctl_health(f,
                                "PCS_TLS_CA=ca.pem PCS_TLS_TARGET_NAME=localhost "
                                "PCS_TLS_CLIENT_CERT=cli.pem PCS_TLS_CLIENT_KEY=cli.key",
                                &out),
                     0);
    assert_non_null(strstr(out, "SERVING"));
    free(out);
    assert_int_equal(ctl_health(f, "PCS_TLS_CA=ca.pem PCS_TLS_TARGET_NAME=localhost", &out), 1);
    free(out);
}

/* With mTLS a worker's credential is its certificate's identity: a pcs-worker whose client
 * certificate names worker-0 registers as worker-0, and one presenting the same certificate as
 * worker-1 is refused at Register and exits naming the certificate. */
static void test_mtls_binds_a_worker_to_its_certificate_identity(void **state)
{
    fx_t *f = *state;
    assert_true(start(f, 1));
    char log0[1100], log1[1100];
    snprintf(log0, sizeof log0, "%s/worker0.log", f->dir);
    snprintf(log1, sizeof log1, "%s/worker1.log", f->dir);
    setenv("PCS_TLS_CA", "ca.pem", 1);
    setenv("PCS_TLS_TARGET_NAME", "localhost", 1);
    setenv("PCS_TLS_CLIENT_CERT", "cli.pem", 1);
    setenv("PCS_TLS_CLIENT_KEY", "cli.key", 1);
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(f->dir), 0);
    const char *good[] = {pcs_test_bin("pcs-worker"), "--coordinator", f->addr, "--identity",
                          "worker-0", NULL};
    const char *bad[] = {pcs_test_bin("pcs-worker"), "--coordinator", f->addr, "--identity",
                         "worker-1", NULL};
    pid_t w0 = pcs_test_spawn((char *const *)good, log0);
    pid_t w1 = pcs_test_spawn((char *const *)bad, log1);
    assert_int_equal(chdir(cwd), 0);
    assert_true(w0 > 0 && w1 > 0);
    int code = pcs_test_wait(w1, 15000);
    char *out = pcs_test_read_file(log1, NULL);
    if (code == -1 || code == 0 || !out ||
        !strstr(out, "identity: worker-1 is not named by the client certificate (worker-0)"))
        fail_msg("worker-1 with worker-0's certificate: exit %d, log:\n%s", code,
                 out ? out : "(none)");
    free(out);
    int seen = 0;
    char *ls = NULL;
    for (int i = 0; i < 200 && !seen; i++) {
        free(ls);
        ctl_workers(f, &ls);
        seen = ls && strstr(ls, "w-1") != NULL;
        if (!seen)
            pcs_test_sleep_ms(50);
    }
    if (!seen)
        fprintf(stderr, "pcsctl workers:\n%s\n", ls ? ls : "(none)");
    else
        assert_null(strstr(ls, "w-2")); /* worker-1 never got an id */
    free(ls);
    pcs_test_stop(w0, 5000);
    unsetenv("PCS_TLS_CA");
    unsetenv("PCS_TLS_TARGET_NAME");
    unsetenv("PCS_TLS_CLIENT_CERT");
    unsetenv("PCS_TLS_CLIENT_KEY");
    assert_true(seen);
}

static void test_non_loopback_plaintext_listen_needs_insecure(void **state)
{
    fx_t *f = *state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --listen 0.0.0.0:0 2>&1", pcs_test_bin("pcs-coordinator"));
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 2);
    assert_non_null(strstr(out, "--insecure"));
    free(out);
    /* a host name that merely starts like a loopback address is not one */
    snprintf(cmd, sizeof cmd, "timeout 20 %s --listen 127.example.invalid:0 2>&1",
             pcs_test_bin("pcs-coordinator"));
    out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 2);
    assert_non_null(strstr(out, "--insecure"));
    free(out);
    /* /metrics is plaintext too: a non-loopback address needs --insecure as well */
    snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:0 --metrics-listen 0.0.0.0:0 2>&1",
             pcs_test_bin("pcs-coordinator"));
    out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 2);
    assert_non_null(strstr(out, "metrics-listen 0.0.0.0:0: plaintext HTTP"));
    free(out);
    /* tokens over plaintext on a non-loopback address: served (--insecure) but said loudly */
    char tokens[1200];
    snprintf(tokens, sizeof tokens, "%s/tokens.conf", f->dir);
    FILE *t = fopen(tokens, "w");
    assert_non_null(t);
    fputs("admin adm-0123456789abcdef\n", t);
    fclose(t);
    snprintf(cmd, sizeof cmd,
             "timeout -s TERM 3 %s --listen 0.0.0.0:0 --insecure --token-file %s 2>&1",
             pcs_test_bin("pcs-coordinator"), tokens);
    out = pcs_test_run(cmd, &status);
    assert_non_null(strstr(out, "WARNING: bearer tokens over plaintext gRPC on 0.0.0.0:0"));
    free(out);
    /* a key without its certificate is a usage error naming both flags */
    snprintf(cmd, sizeof cmd, "%s --tls-key %s/srv.key 2>&1", pcs_test_bin("pcs-coordinator"),
             f->dir);
    out = pcs_test_run(cmd, &status);
    assert_int_equal(status, 2);
    assert_non_null(strstr(out, "tls-cert"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tls_coordinator_serves_verified_clients_only, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_mtls_coordinator_requires_a_client_certificate,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_mtls_binds_a_worker_to_its_certificate_identity,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_loopback_plaintext_listen_needs_insecure, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("tls", tests, NULL, NULL);
}
