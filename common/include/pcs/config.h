/* One option table (STYLE.md B6, redis standardConfig) drives parsing, --help, the startup dump
 * and GetStatus. Precedence: default < file (--config path, `key value` lines, # comments) < env
 * (PCS_ + key upper-cased, '-' -> '_') < flag (--key value or --key=value). Errors name the
 * source: "heartbeat-timeout-ms=5 (env PCS_HEARTBEAT_TIMEOUT_MS): must be in [50, 600000]".
 * The loaded pcs_config_t is immutable and passed explicitly; no globals. Owner: common/config.c */
#ifndef PCS_CONFIG_H
#define PCS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PCS_OPT_U32, PCS_OPT_U64, PCS_OPT_DOUBLE, PCS_OPT_BOOL, PCS_OPT_STRING } pcs_opt_type_t;
typedef enum { PCS_SRC_DEFAULT, PCS_SRC_FILE, PCS_SRC_ENV, PCS_SRC_FLAG } pcs_opt_source_t;

typedef struct pcs_opt {
    const char *key;       /* kebab-case: heartbeat-interval-ms */
    pcs_opt_type_t type;
    const char *def;       /* default, as text */
    double min, max;       /* bounds for numbers (inclusive) */
    const char *help;
} pcs_opt_t;

typedef struct pcs_config pcs_config_t;

/* Load `table` (n rows) from defaults, the file named by --config (if any), the environment and
 * argv (argv[0] skipped). Positional arguments are returned via pcs_config_args(). "--help" sets
 * pcs_config_help_requested(). Errors: PCS_ERR_INVALID_ARG with the source in pcs_last_error(). */
pcs_status_t pcs_config_load(const pcs_opt_t *table, size_t n, int argc, char **argv,
                             pcs_config_t **out);
void pcs_config_free(pcs_config_t *c);

uint32_t pcs_config_u32(const pcs_config_t *c, const char *key);
uint64_t pcs_config_u64(const pcs_config_t *c, const char *key);
double pcs_config_double(const pcs_config_t *c, const char *key);
int pcs_config_bool(const pcs_config_t *c, const char *key);
const char *pcs_config_str(const pcs_config_t *c, const char *key);
pcs_opt_source_t pcs_config_source(const pcs_config_t *c, const char *key);
int pcs_config_help_requested(const pcs_config_t *c);
/* Positional (non-option) arguments in order. */
char **pcs_config_args(const pcs_config_t *c, int *argc);

/* "default" | "file" | "env" | "flag". */
const char *pcs_config_source_name(pcs_opt_source_t s);
/* Where the value of `key` came from, for messages: "default", "file x.conf:3", "env PCS_X",
 * "flag --x". Valid while c lives. */
const char *pcs_config_origin(const pcs_config_t *c, const char *key);
/* Notes: rows with min == max == 0 have no bounds beyond their type's range. Getters accept
 * widening reads (u64/double of a u32 row); pcs_config_str returns the text of any row. A wrong
 * key or type is a programming error: one WARN and 0/NULL. Keys containing "token", "password"
 * or "secret" are shown as *** in the dump and the log. The config file may also be named by
 * env PCS_CONFIG (the --config flag wins). "--" ends options; "--no-KEY" sets a bool false. */

/* Print the --help table (key, default, bounds, env name, help). */
void pcs_config_print_help(const pcs_opt_t *table, size_t n, const char *usage);
/* Log every non-default value once at INFO with its source ("set by env PCS_X"). */
void pcs_config_log_nondefault(const pcs_config_t *c);
/* Append "key:value\n" lines (redis INFO style) to buf; returns bytes that would be written. */
size_t pcs_config_dump(const pcs_config_t *c, char *buf, size_t n);
/* Markdown table of the options (README's configuration table). */
void pcs_config_print_markdown(const pcs_opt_t *table, size_t n);

#ifdef __cplusplus
}
#endif
#endif
