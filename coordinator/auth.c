/* Role tokens for the coordinator's RPCs (see auth.h). Tokens are compared in constant time. */
#include "coordinator/auth.h"

#include <openssl/evp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"
#include "pcs/rpc.h"

typedef struct entry {
    char *token;
    size_t len;
    pcs_role_t role;
    char name[128]; /* the principal: the file's name, or "token:<12 hex of its SHA-256>" */
} entry_t;

struct pcs_auth {
    entry_t *e;
    size_t n, cap;
};

static const struct {
    const char *name;
    pcs_role_t role;
} role_names[] = {{"viewer", PCS_ROLE_VIEWER},
                  {"submitter", PCS_ROLE_SUBMITTER | PCS_ROLE_VIEWER},
                  {"worker", PCS_ROLE_WORKER | PCS_ROLE_VIEWER},
                  {"admin", PCS_ROLE_ADMIN}};

void pcs_auth_free(pcs_auth_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++) {
        memset(a->e[i].token, 0, a->e[i].len);
        free(a->e[i].token);
    }
    free(a->e);
    free(a);
}

size_t pcs_auth_count(const pcs_auth_t *a)
{
    return a ? a->n : 0;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '@' || c == '-'))
            return false;
    }
    return true;
}

static pcs_status_t sha256(const void *p, size_t n, uint8_t out[PCS_AUTH_HASH_BYTES]);

/* "token:" and the first 12 hex digits of the token's SHA-256: stable across edits of the file,
 * and no help in guessing the token */
static pcs_status_t token_principal(const char *token, char *out, size_t n)
{
    uint8_t h[PCS_AUTH_HASH_BYTES];
    PCS_CHECK(sha256(token, strlen(token), h));
    snprintf(out, n, "token:%02x%02x%02x%02x%02x%02x", h[0], h[1], h[2], h[3], h[4], h[5]);
    return PCS_OK;
}

pcs_status_t pcs_auth_parse(const char *text, const char *name, pcs_auth_t **out)
{
    *out = NULL;
    pcs_auth_t *a;
    PCS_CHECK(pcs_calloc(1, sizeof *a, (void **)&a));
    pcs_status_t st = PCS_OK;
    int lineno = 0;
    const char *p = text;
    while (*p && st == PCS_OK) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        char line[1024];
        if (len >= sizeof line) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s:%d: line longer than %zu bytes", name,
                               lineno, sizeof line - 1);
            break;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl ? nl + 1 : p + len;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char role[64], token[1024], who[128], extra[8];
        int k = sscanf(line, "%63s %1023s %127s %7s", role, token, who, extra);
        if (k <= 0)
            continue;
        if (k != 2 && k != 3) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s:%d: expected `role token [name]`", name,
                               lineno);
            break;
        }
        if (k == 3 && !valid_name(who)) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "%s:%d: name '%.64s' must be 1-64 of [A-Za-z0-9._@-]", name,
                               lineno, who);
            break;
        }
        pcs_role_t r = PCS_ROLE_NONE;
        for (size_t i = 0; i < sizeof role_names / sizeof role_names[0]; i++)
            if (strcmp(role, role_names[i].name) == 0)
                r = role_names[i].role;
        if (r == PCS_ROLE_NONE) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "%s:%d: unknown role '%s' (viewer|submitter|worker|admin)", name,
                               lineno, role);
            break;
        }
        if (strlen(token) < 16) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s:%d: token shorter than 16 characters", name,
                               lineno);
            break;
        }
        for (size_t i = 0; i < a->n; i++)
            if (strcmp(a->e[i].token, token) == 0)
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s:%d: token given twice", name, lineno);
        if (st != PCS_OK)
            break;
        char principal[128];
        if (k == 3)
            snprintf(principal, sizeof principal, "%s", who);
        else
            st = token_principal(token, principal, sizeof principal);
        if (st == PCS_OK)
            st = pcs_grow((void **)&a->e, &a->cap, a->n + 1, sizeof *a->e);
        if (st == PCS_OK)
            st = pcs_strdup(token, &a->e[a->n].token);
        if (st == PCS_OK) {
            snprintf(a->e[a->n].name, sizeof a->e[a->n].name, "%s", principal);
            a->e[a->n].len = strlen(token);
            a->e[a->n].role = r;
            a->n++;
        }
        memset(token, 0, sizeof token);
    }
    if (st == PCS_OK && a->n == 0)
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: no tokens", name);
    if (st != PCS_OK) {
        pcs_auth_free(a);
        return st;
    }
    *out = a;
    return PCS_OK;
}

pcs_status_t pcs_auth_load(const char *path, pcs_auth_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "token file %s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    pcs_status_t st = PCS_OK;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            if (cap > (1u << 20)) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "token file %s: larger than 1 MiB", path);
                break;
            }
            size_t old = cap;
            cap = cap ? cap * 2 : 8192;
            void *nb = realloc(buf, cap);
            if (!nb) {
                cap = old;
                st = PCS_ERR_NOMEM;
                break;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    if (st == PCS_OK) {
        buf[n] = '\0';
        st = pcs_auth_parse(buf, path, out);
    }
    if (buf) {
        memset(buf, 0, n);
        free(buf);
    }
    return st;
}

pcs_role_t pcs_auth_method_role(const char *m)
{
    if (strncmp(m, "/grpc.health.v1.Health/", 23) == 0)
        return PCS_ROLE_NONE;
    if (strncmp(m, "/pcs.v1.WorkerService/", 22) == 0)
        return PCS_ROLE_WORKER;
    if (strcmp(m, PCS_M_SUBMIT_JOB) == 0 || strcmp(m, PCS_M_CANCEL_JOB) == 0)
        return PCS_ROLE_SUBMITTER;
    return PCS_ROLE_VIEWER;
}

static int same_token(const entry_t *e, const char *tok, size_t len)
{
    /* constant time in the candidate's length: no early exit on the first differing byte */
    unsigned char diff = (unsigned char)(e->len != len);
    size_t n = e->len < len ? e->len : len;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(e->token[i] ^ tok[i]);
    return diff == 0;
}

pcs_status_t pcs_auth_check(const pcs_auth_t *a, const char *method, const char *authorization)
{
    long entry;
    return pcs_auth_identify(a, method, authorization, &entry);
}

const char *pcs_auth_principal(const pcs_auth_t *a, long entry)
{
    return a && entry >= 0 && (size_t)entry < a->n ? a->e[entry].name : NULL;
}

pcs_role_t pcs_auth_role(const pcs_auth_t *a, long entry)
{
    return a && entry >= 0 && (size_t)entry < a->n ? a->e[entry].role : PCS_ROLE_NONE;
}

pcs_status_t pcs_auth_identify(const pcs_auth_t *a, const char *method, const char *authorization,
                               long *entry)
{
    *entry = -1;
    pcs_role_t need = pcs_auth_method_role(method);
    if (!a || need == PCS_ROLE_NONE)
        return PCS_OK;
    if (!authorization || !*authorization)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                             "%s needs a bearer token (authorization metadata; PCS_TOKEN)", method);
    if (strncmp(authorization, "Bearer ", 7) != 0)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                             "authorization metadata must be 'Bearer <token>'");
    const char *tok = authorization + 7;
    size_t len = strlen(tok);
    const entry_t *hit = NULL;
    for (size_t i = 0; i < a->n; i++)
        if (same_token(&a->e[i], tok, len))
            hit = &a->e[i];
    if (!hit)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED, "unknown bearer token");
    if (!(hit->role & need)) {
        const char *have = "?";
        for (size_t i = 0; i < sizeof role_names / sizeof role_names[0]; i++)
            if (role_names[i].role == hit->role)
                have = role_names[i].name;
        return pcs_set_error(PCS_ERR_PERMISSION, "role %s may not call %s", have, method);
    }
    *entry = (long)(hit - a->e);
    return PCS_OK;
}

// ---- worker credentials ----

static pcs_status_t sha256(const void *p, size_t n, uint8_t out[PCS_AUTH_HASH_BYTES])
{
    unsigned int len = 0;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1 || len != PCS_AUTH_HASH_BYTES)
        return pcs_set_error(PCS_ERR_INTERNAL, "worker secret: SHA-256 failed");
    return PCS_OK;
}

pcs_status_t pcs_auth_secret_new(char hex[PCS_AUTH_SECRET_HEX + 1],
                                 uint8_t hash[PCS_AUTH_HASH_BYTES])
{
    uint8_t raw[PCS_AUTH_SECRET_HEX / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0)
            return pcs_set_error(PCS_ERR_SYSTEM, "worker secret: getrandom failed");
        got += (size_t)r;
    }
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[PCS_AUTH_SECRET_HEX] = '\0';
    memset(raw, 0, sizeof raw);
    return sha256(hex, PCS_AUTH_SECRET_HEX, hash);
}

pcs_status_t pcs_auth_secret_parse(const char *secret, char *id, size_t n,
                                   uint8_t hash[PCS_AUTH_HASH_BYTES])
{
    const char *dot = secret ? strrchr(secret, '.') : NULL;
    if (!dot || dot == secret || (size_t)(dot - secret) >= n ||
        strlen(dot + 1) != PCS_AUTH_SECRET_HEX)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                             "pcs-worker-secret: not a worker secret (<worker id>.<%d hex digits>)",
                             PCS_AUTH_SECRET_HEX);
    for (const char *p = dot + 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                                 "pcs-worker-secret: not a worker secret (hex digits expected)");
    memcpy(id, secret, (size_t)(dot - secret));
    id[dot - secret] = '\0';
    return sha256(dot + 1, PCS_AUTH_SECRET_HEX, hash);
}
