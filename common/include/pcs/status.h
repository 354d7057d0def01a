/* pcs status codes: one closed enum that says whose fault an error is, with a fixed gRPC mapping
 * (STYLE.md B3). Every function that can fail returns pcs_status_t; results go in out-parameters. */
#ifndef PCS_STATUS_H
#define PCS_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pcs_status {
    PCS_OK = 0,
    PCS_ERR_INVALID_ARG,   /* INVALID_ARGUMENT: the caller's input is wrong */
    PCS_ERR_STATE,         /* FAILED_PRECONDITION: valid input, wrong moment */
    PCS_ERR_NOT_FOUND,     /* NOT_FOUND */
    PCS_ERR_EXISTS,        /* ALREADY_EXISTS */
    PCS_ERR_TIMEOUT,       /* DEADLINE_EXCEEDED */
    PCS_ERR_REMOTE,        /* UNAVAILABLE: a peer or the coordinator is gone */
    PCS_ERR_NOMEM,         /* RESOURCE_EXHAUSTED */
    PCS_ERR_LIMIT,         /* RESOURCE_EXHAUSTED: a configured size limit was exceeded */
    PCS_ERR_CANCELLED,     /* CANCELLED: aborted on purpose (communicator abort, shutdown) */
    PCS_ERR_SYSTEM,        /* INTERNAL: an OS call failed */
    PCS_ERR_CUDA,          /* INTERNAL */
    PCS_ERR_NCCL,          /* INTERNAL */
    PCS_ERR_INTERNAL,      /* INTERNAL: a bug in pcs */
    PCS_ERR_UNSUPPORTED,   /* UNIMPLEMENTED: e.g. the cuda backend was not built */
    PCS_ERR_UNAUTHENTICATED, /* UNAUTHENTICATED: no or unknown credentials */
    PCS_ERR_PERMISSION,    /* PERMISSION_DENIED: known caller, role may not do this */
    PCS_STATUS_COUNT
} pcs_status_t;

/* Stable lower-case name of a status ("ok", "invalid_arg", ...). Never NULL. */
const char *pcs_status_str(pcs_status_t s);

/* The grpc_status_code value (as int, so this header needs no gRPC) a status maps to. */
int pcs_status_to_grpc(pcs_status_t s);

/* Thread-local text of the last error recorded with pcs_set_error() (or by a WARN/ERROR log line).
 * Empty string if none. The pointer stays valid until the next error on this thread. */
const char *pcs_last_error(void);

/* Record the cause of an error for pcs_last_error() without logging it, and return `s` so that
 * callers can write `return pcs_set_error(PCS_ERR_INVALID_ARG, "field %s: ...", name);`. An
 * argument may be pcs_last_error() itself (`pcs_set_error(st, "init.from: %s",
 * pcs_last_error())` prefixes the cause). */
pcs_status_t pcs_set_error(pcs_status_t s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
pcs_status_t pcs_set_errorv(pcs_status_t s, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
void pcs_clear_error(void);

/* Breadcrumb at DEBUG level (NCCL's "-> <status>"), gives a backtrace of a failure on demand. */
void pcs_log_breadcrumb(pcs_status_t s, const char *file, int line);

#define PCS_CHECK(expr)                                                                            \
    do {                                                                                           \
        pcs_status_t s_ = (expr);                                                                  \
        if (s_ != PCS_OK) {                                                                        \
            pcs_log_breadcrumb(s_, __FILE__, __LINE__);                                            \
            return s_;                                                                             \
        }                                                                                          \
    } while (0)

#define PCS_CHECK_GOTO(expr, rc, label)                                                            \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) != PCS_OK) {                                                                      \
            pcs_log_breadcrumb((rc), __FILE__, __LINE__);                                          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
