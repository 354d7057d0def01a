/* Status strings, the fixed pcs_status_t -> gRPC code mapping, and the thread-local last error. */
#include "pcs/status.h"
#include "pcs/log.h"
#include "pcs/utf8.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int grpc; /* grpc_status_code values (grpc/impl/codegen/status.h) */
} status_table[PCS_STATUS_COUNT] = {
    [PCS_OK] = {"ok", 0},
    [PCS_ERR_INVALID_ARG] = {"invalid_arg", 3},
    [PCS_ERR_STATE] = {"state", 9},
    [PCS_ERR_NOT_FOUND] = {"not_found", 5},
    [PCS_ERR_EXISTS] = {"exists", 6},
    [PCS_ERR_TIMEOUT] = {"timeout", 4},
    [PCS_ERR_REMOTE] = {"remote", 14},
    [PCS_ERR_NOMEM] = {"nomem", 8},
    [PCS_ERR_LIMIT] = {"limit", 8},
    [PCS_ERR_CANCELLED] = {"cancelled", 1},
    [PCS_ERR_SYSTEM] = {"system", 13},
    [PCS_ERR_CUDA] = {"cuda", 13},
    [PCS_ERR_NCCL] = {"nccl", 13},
    [PCS_ERR_INTERNAL] = {"internal", 13},
    [PCS_ERR_UNSUPPORTED] = {"unsupported", 12},
    [PCS_ERR_UNAUTHENTICATED] = {"unauthenticated", 16},
    [PCS_ERR_PERMISSION] = {"permission", 7},
};

const char *pcs_status_str(pcs_status_t s)
{
    if ((unsigned)s >= PCS_STATUS_COUNT)
        return "unknown";
    return status_table[s].name;
}

int pcs_status_to_grpc(pcs_status_t s)
{
    if ((unsigned)s >= PCS_STATUS_COUNT)
        return 2; /* UNKNOWN */
    return status_table[s].grpc;
}

static _Thread_local char last_error[1024];

const char *pcs_last_error(void)
{
    return last_error;
}

void pcs_clear_error(void)
{
    last_error[0] = '\0';
}

pcs_status_t pcs_set_errorv(pcs_status_t s, const char *fmt, va_list ap)
{
    /* Formatted aside first: an argument may be pcs_last_error() itself ("prefix: %s" around
     * the cause), which vsnprintf must not read while it writes the same buffer. */
    char buf[sizeof last_error];
    /* errors quote user text and reach clients as gRPC details: never end mid-character */
    if (vsnprintf(buf, sizeof buf, fmt, ap) >= (int)sizeof buf)
        pcs_utf8_trim_partial(buf);
    memcpy(last_error, buf, strlen(buf) + 1);
    return s;
}

pcs_status_t pcs_set_error(pcs_status_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pcs_set_errorv(s, fmt, ap);
    va_end(ap);
    return s;
}

void pcs_log_breadcrumb(pcs_status_t s, const char *file, int line)
{
    if (pcs_log_level_ >= PCS_LOG_DEBUG)
        pcs_log_write(PCS_LOG_DEBUG, PCS_SUB_ALL, file, line, "-> %s", pcs_status_str(s));
}
