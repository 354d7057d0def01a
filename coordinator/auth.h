/* Bearer tokens by role (DESIGN.md §10): a token file of `role token [name]` lines maps each
 * token to a role and a principal; each RPC needs a role. Pure C (no gRPC): server.c reads the
 * `authorization` metadata and asks pcs_auth_identify. */
#ifndef PCS_COORD_AUTH_H
#define PCS_COORD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

typedef enum pcs_role {
    PCS_ROLE_NONE = 0,
    PCS_ROLE_VIEWER = 1u << 0,    /* Get/List/Status/GetPlan/DryRunPlan */
    PCS_ROLE_SUBMITTER = 1u << 1, /* + SubmitJob, CancelJob */
    PCS_ROLE_WORKER = 1u << 2,    /* + WorkerService */
    PCS_ROLE_ADMIN = 0x7,         /* everything */
} pcs_role_t;

typedef struct pcs_auth pcs_auth_t;

/* Load a token file: `role token [name]` per line (roles: viewer, submitter, worker, admin),
 * `#` comments, blank lines. `name` is the principal the token acts as (1-64 of [A-Za-z0-9._@-];
 * several tokens may share one, e.g. while a token is rotated); without it the principal is
 * "token:" and the first 12 hex digits of the token's SHA-256. A submitter owns the jobs it
 * submits (pcs_auth_principal). Errors name the file and line (INVALID_ARG). Caller frees. */
pcs_status_t pcs_auth_load(const char *path, pcs_auth_t **out);
/* The same from text (tests); `name` is used in error messages. */
pcs_status_t pcs_auth_parse(const char *text, const char *name, pcs_auth_t **out);
void pcs_auth_free(pcs_auth_t *a);
size_t pcs_auth_count(const pcs_auth_t *a);

/* The role a method needs: NONE for the health service (probes carry no token). */
pcs_role_t pcs_auth_method_role(const char *method_path);

/* Check an `authorization` metadata value ("Bearer <token>", NULL if absent) for `method`.
 * PCS_OK, PCS_ERR_UNAUTHENTICATED (missing or unknown token) or PCS_ERR_PERMISSION (the token's
 * role may not call the method); the reason is in pcs_last_error() and never echoes the token. */
pcs_status_t pcs_auth_check(const pcs_auth_t *a, const char *method_path,
                            const char *authorization);
/* The same, and which token the call carries: *entry is its index (for pcs_auth_principal /
 * pcs_auth_role), or -1 when no token was needed (no token file, the health service). */
pcs_status_t pcs_auth_identify(const pcs_auth_t *a, const char *method_path,
                               const char *authorization, long *entry);
/* Token `entry`'s principal name and role (NULL / PCS_ROLE_NONE for an index out of range). */
const char *pcs_auth_principal(const pcs_auth_t *a, long entry);
pcs_role_t pcs_auth_role(const pcs_auth_t *a, long entry);

/* ---- worker credentials (DESIGN.md §10) ----
 * Register answers each new registration a secret "<worker id>.<64 hex digits>" (256 random bits
 * from getrandom); every later WorkerService call carries it in the pcs-worker-secret header. The
 * coordinator keeps (and stores) only the SHA-256 of the random part; the id in front routes the
 * lookup. */
#define PCS_AUTH_SECRET_HEX  64
#define PCS_AUTH_HASH_BYTES  32
#define PCS_AUTH_SECRET_SIZE (24 + 1 + PCS_AUTH_SECRET_HEX + 1) /* with a "w-<n>" id */

/* New random part (PCS_AUTH_SECRET_HEX hex digits + NUL into hex) and its hash. PCS_ERR_SYSTEM
 * when the kernel gives no randomness. */
pcs_status_t pcs_auth_secret_new(char hex[PCS_AUTH_SECRET_HEX + 1],
                                 uint8_t hash[PCS_AUTH_HASH_BYTES]);
/* Split a presented secret into its worker id (into id, n bytes) and the hash of its random
 * part. PCS_ERR_UNAUTHENTICATED for a value that is not of the form. */
pcs_status_t pcs_auth_secret_parse(const char *secret, char *id, size_t n,
                                   uint8_t hash[PCS_AUTH_HASH_BYTES]);

#endif
