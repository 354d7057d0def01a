/* gRPC credentials from PEM files (DESIGN.md §10): TLS for the coordinator's server, optional
 * mTLS for workers, and the matching channel credentials for clients. Files are read once, when
 * the server or channel is created; nothing here is kept afterwards. */
#include "rpc_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"

#define MAX_PEM_BYTES (1u << 20)

/* *out = NUL-terminated contents of a PEM file (NULL path: *out = NULL). Caller frees. */
static pcs_status_t read_pem(const char *what, const char *path, char **out)
{
    *out = NULL;
    if (!path || !*path)
        return PCS_OK;
    FILE *f = fopen(path, "rb");
    if (!f)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls %s %s: %s", what, path, strerror(errno));
    char *buf = NULL;
    pcs_status_t st = pcs_calloc(MAX_PEM_BYTES + 1, 1, (void **)&buf);
    size_t n = st == PCS_OK ? fread(buf, 1, MAX_PEM_BYTES + 1, f) : 0;
    fclose(f);
    if (st != PCS_OK)
        return st;
    if (n == 0 || n > MAX_PEM_BYTES || !strstr(buf, "-----BEGIN ")) {
        free(buf);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls %s %s: %s", what, path,
                             n > MAX_PEM_BYTES ? "larger than 1 MiB" : "not a PEM file");
    }
    *out = buf;
    return PCS_OK;
}

typedef struct pem_set {
    char *cert, *key, *ca;
} pem_set_t;

static void pem_free(pem_set_t *p)
{
    free(p->cert);
    free(p->key);
    free(p->ca);
}

static pcs_status_t pem_load(const pcs_rpc_tls_t *tls, pem_set_t *p)
{
    memset(p, 0, sizeof *p);
    if (!tls->cert_file != !tls->key_file)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls: a certificate needs its key and a key "
                                                  "its certificate");
    pcs_status_t st;
    PCS_CHECK_GOTO(read_pem("certificate", tls->cert_file, &p->cert), st, fail);
    PCS_CHECK_GOTO(read_pem("key", tls->key_file, &p->key), st, fail);
    PCS_CHECK_GOTO(read_pem("ca", tls->ca_file, &p->ca), st, fail);
    return PCS_OK;
fail:
    pem_free(p);
    return st;
}

pcs_status_t pcs_rpc_server_creds(const pcs_rpc_tls_t *tls, grpc_server_credentials **out)
{
    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_server_credentials_create();
        return PCS_OK;
    }
    if (!tls->cert_file || !tls->key_file)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls: a server needs cert_file and key_file");
    pem_set_t p;
    PCS_CHECK(pem_load(tls, &p));
    grpc_ssl_pem_key_cert_pair pair = {p.key, p.cert};
    *out = grpc_ssl_server_credentials_create_ex(
        p.ca, &pair, 1,
        p.ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    pem_free(&p); /* gRPC copied them */
    if (!*out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls: gRPC refused the server credentials");
    return PCS_OK;
}

pcs_status_t pcs_rpc_channel_creds(const pcs_rpc_tls_t *tls, grpc_channel_credentials **out)
{
    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_credentials_create();
        return PCS_OK;
    }
    pem_set_t p;
    PCS_CHECK(pem_load(tls, &p));
    grpc_ssl_pem_key_cert_pair pair = {p.key, p.cert};
    *out = grpc_ssl_credentials_create(p.ca, p.cert ? &pair : NULL, NULL, NULL);
    pem_free(&p);
    if (!*out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "tls: gRPC refused the channel credentials");
    return PCS_OK;
}
