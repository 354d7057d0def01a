/* Logging: levels and a subsystem mask tested inline (NCCL INFO()), one line per event written
 * with a single fwrite under a mutex (STYLE.md B5). Settings: PCS_LOG_LEVEL, PCS_LOG_SUBSYS,
 * PCS_LOG_FILE (%h host, %p pid). WARN and ERROR lines carry file:line and also set
 * pcs_last_error(). Thread-safe. */
#ifndef PCS_LOG_H
#define PCS_LOG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PCS_LOG_NONE,
    PCS_LOG_ERROR,
    PCS_LOG_WARN,
    PCS_LOG_INFO,
    PCS_LOG_DEBUG,
    PCS_LOG_TRACE
} pcs_log_level_t;

typedef enum {
    PCS_SUB_INIT = 1u << 0,
    PCS_SUB_CONFIG = 1u << 1,
    PCS_SUB_RPC = 1u << 2,
    PCS_SUB_COORD = 1u << 3,
    PCS_SUB_WORKER = 1u << 4,
    PCS_SUB_BOOTSTRAP = 1u << 5,
    PCS_SUB_COLL = 1u << 6,
    PCS_SUB_KERNEL = 1u << 7,
    PCS_SUB_MEM = 1u << 8,
    PCS_SUB_BENCH = 1u << 9,
    PCS_SUB_PLAN = 1u << 10,
    PCS_SUB_STORE = 1u << 11,
    PCS_SUB_ALL = 0xfff
} pcs_log_sub_t;

extern int pcs_log_level_;        /* current level; read inline by the macros */
extern unsigned pcs_log_mask_;    /* current subsystem mask */

/* Read PCS_LOG_LEVEL / PCS_LOG_SUBSYS / PCS_LOG_FILE / PCS_LOG_FORMAT. Called lazily by the first
 * log line; call it explicitly in main() to fail early. `default_level` applies when
 * PCS_LOG_LEVEL is unset. PCS_LOG_FORMAT=json writes one JSON object a line (ts, level, subsys,
 * host, pid, tid, role, file, line, msg, and job / rank while set) for log collectors. */
void pcs_log_init(pcs_log_level_t default_level);
/* Role shown in each line: "coord", "ctl", "w3", ... (copied). */
void pcs_log_set_role(const char *role);
void pcs_log_set_level(pcs_log_level_t level);
/* The job and rank this process works on, in every JSON line from now on (job NULL: none). */
void pcs_log_set_job(const char *job, int rank);
/* Parse "error|warn|info|debug|trace|none"; returns -1 if unknown. */
int pcs_log_level_parse(const char *s);

void pcs_log_write(pcs_log_level_t level, unsigned sub, const char *file, int line, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));

#define PCS_LOG_(lvl, sub, ...)                                                                    \
    do {                                                                                           \
        if (pcs_log_level_ >= (int)(lvl) &&                                                        \
            ((lvl) <= PCS_LOG_WARN || (pcs_log_mask_ & (unsigned)(sub))))                          \
            pcs_log_write((lvl), (unsigned)(sub), __FILE__, __LINE__, __VA_ARGS__);                \
    } while (0)

#define PCS_ERROR(sub, ...) PCS_LOG_(PCS_LOG_ERROR, sub, __VA_ARGS__)
#define PCS_WARN(sub, ...) PCS_LOG_(PCS_LOG_WARN, sub, __VA_ARGS__)
#define PCS_INFO(sub, ...) PCS_LOG_(PCS_LOG_INFO, sub, __VA_ARGS__)
#define PCS_DEBUG(sub, ...) PCS_LOG_(PCS_LOG_DEBUG, sub, __VA_ARGS__)
#define PCS_TRACE(sub, ...) PCS_LOG_(PCS_LOG_TRACE, sub, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
