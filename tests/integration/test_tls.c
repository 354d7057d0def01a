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
        cmocka_unit_test_setup_teardown(test_non_loopback_plaintext_listen_needs_insecure, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("tls", tests, NULL, NULL);
}
