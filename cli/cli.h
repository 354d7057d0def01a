/* pcsctl internals shared by the sub-commands (cli/cmd_*.c): the global options parsed by
 * pcsctl.c, the coordinator call with pcsctl's error wording, aligned tables and --json output.
 * Exit codes: 0 success, 1 failure (bad job file, server error, unreachable coordinator),
 * 2 usage error. Single-threaded CLI code; not a library for other binaries. */
#ifndef PCS_CLI_H
#define PCS_CLI_H

#include <protobuf-c/protobuf-c.h>
#include <stdint.h>
#include <stdio.h>

#include "pcs/rpc.h"
#include "pcs/status.h"

#define PCS_CLI_OK    0
#define PCS_CLI_FAIL  1
#define PCS_CLI_USAGE 2
#define PCS_CLI_HELP  (-1) /* pcs_cli_parse printed --help: the command exits 0 */

/* ---- arguments (cli/cmd_args.c): each sub-command describes itself, getopt_long parses ---- */
#define PCS_CLI_MAX_OPTS 16
typedef struct pcs_cli_opt {
    const char *name; /* long name without "--" */
    const char *arg;  /* metavar ("ID") for an option with a value; NULL for a flag */
    const char *help;
} pcs_cli_opt_t;

typedef struct pcs_cli_spec {
    const char *name;    /* "submit" */
    const char *args;    /* positional synopsis, "FILE|-" ("" for none) */
    const char *summary; /* one line: `pcsctl --help` lists it */
    const char *details; /* NULL, or paragraphs --help prints after the summary */
    const pcs_cli_opt_t *opts;
    size_t n_opts;
    int min_pos, max_pos; /* how many positional arguments */
} pcs_cli_spec_t;

typedef struct pcs_cli_args {
    const char *val[PCS_CLI_MAX_OPTS]; /* per opts[i]: its value, "1" for a flag, NULL unset */
    char **pos;                        /* positional arguments */
    int n_pos;
} pcs_cli_args_t;

/* Parse argv (argv[0] = the command's name): its options, the global ones (--coordinator,
 * --json, --timeout-ms) anywhere, -h/--help. Returns PCS_CLI_OK, PCS_CLI_HELP (help printed:
 * exit 0) or PCS_CLI_USAGE (error printed as "pcsctl: CMD: PROBLEM" + usage). */
int pcs_cli_parse(const pcs_cli_spec_t *s, int argc, char **argv, pcs_cli_args_t *a);
/* A bad option value, in the same wording as pcs_cli_parse; returns PCS_CLI_USAGE. */
int pcs_cli_bad_value(const pcs_cli_spec_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* `--name VALUE` as an integer in [lo, hi], else the usage error. */
int pcs_cli_u32_opt(const pcs_cli_spec_t *s, const char *name, const char *val, uint32_t lo,
                    uint32_t hi, uint32_t *out);
/* "pcsctl submit [--request-id ID] FILE|-" */
void pcs_cli_synopsis(const pcs_cli_spec_t *s, char *buf, size_t n);
void pcs_cli_print_help(const pcs_cli_spec_t *s, FILE *f);

/* The sub-commands' descriptions (each in its cmd_*.c). */
extern const pcs_cli_spec_t pcs_cli_submit_spec, pcs_cli_status_spec, pcs_cli_jobs_spec,
    pcs_cli_workers_spec, pcs_cli_cancel_spec, pcs_cli_health_spec, pcs_cli_plan_spec,
    pcs_cli_export_spec, pcs_cli_demo_spec, pcs_cli_protoset_spec;

/* Global options (`pcsctl [--coordinator ADDR] [--json] [--timeout-ms N] <command> ...`); the
 * sub-commands also accept them after the command name (pcs_cli_global_flag). */
typedef struct pcs_cli {
    const char *addr; /* --coordinator, else $PCS_COORDINATOR, else 127.0.0.1:7070 */
    int json;         /* --json: print the response message as JSON (pb_json) */
    int timeout_ms;   /* --timeout-ms: deadline of each RPC (default 5000) */
    int last_code;    /* gRPC code of the last pcs_cli_call (-1: no answer at all) */
} pcs_cli_t;

/* The process's options (set up by pcsctl.c before a command runs). */
pcs_cli_t *pcs_cli(void);

/* ---- sub-commands: argv[0] is the command name ---- */
int pcs_cli_submit(int argc, char **argv);
int pcs_cli_status(int argc, char **argv);
int pcs_cli_jobs(int argc, char **argv);
int pcs_cli_workers(int argc, char **argv);
int pcs_cli_cancel(int argc, char **argv);
int pcs_cli_health(int argc, char **argv);
/* `pcsctl plan FILE [--world N] [--json] [--rank R]` (cli/cmd_plan.c, planner). */
int pcs_cli_plan(int argc, char **argv);
/* `pcsctl export JOB out.safetensors` and `pcsctl demo` (cli/cmd_export.c, cli/cmd_demo.c). */
int pcs_cli_export(int argc, char **argv);
int pcs_cli_demo(int argc, char **argv);
/* `pcsctl protoset [OUT]`: the API's descriptor set (cli/cmd_protoset.c). */
int pcs_cli_protoset(int argc, char **argv);

/* ---- helpers (cli/cmd_util.c) ---- */

/* If argv[*i] is a global option (--json, --coordinator ADDR|=ADDR, --timeout-ms N|=N), apply it,
 * advance *i past its value and return 1; return -1 (message printed) on a bad value, else 0. */
int pcs_cli_global_flag(int argc, char **argv, int *i);

/* Print "pcsctl: <cmd>: <msg>" plus "usage: <usage>" to stderr; returns PCS_CLI_USAGE. */
int pcs_cli_usage(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Print "pcsctl: <msg>" to stderr; returns PCS_CLI_FAIL. */
int pcs_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One unary call to the coordinator at pcs_cli()->addr. Returns PCS_CLI_OK with *resp set (free
 * with protobuf_c_message_free_unpacked), or PCS_CLI_FAIL after printing
 * "pcsctl: cannot reach coordinator at ADDR (UNAVAILABLE: ...)" or "pcsctl: <cmd>: <CODE>: ...". */
int pcs_cli_call(const char *cmd, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp);

/* Print `m` as indented JSON on stdout. Returns PCS_CLI_OK or PCS_CLI_FAIL. */
int pcs_cli_print_json(const ProtobufCMessage *m);

/* pcs_cli_call, and in --json mode print the reply and free it: on PCS_CLI_OK *resp is NULL when
 * the JSON was printed, so callers render their table only when *resp is set. */
int pcs_cli_query(const char *cmd, const char *method, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp);

/* Arguments of a list command whose only option (opts[0]) is `--state S` (a short name of an enum
 * value of `d`; "all" = 0). Returns PCS_CLI_OK with *state set, PCS_CLI_HELP, or PCS_CLI_USAGE
 * after printing. */
int pcs_cli_state_args(const pcs_cli_spec_t *spec, int argc, char **argv,
                       const ProtobufCEnumDescriptor *d, int *state);

/* Lower-case short name of an enum value ("running", "idle"). Static buffer per call site is not
 * needed: the result lives in `buf`. */
const char *pcs_cli_enum(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t n);
/* Parse an enum short name (case-insensitive, "all"/"" = 0); -1 if unknown. */
int pcs_cli_enum_parse(const ProtobufCEnumDescriptor *d, const char *s);

/* "3s", "12m", "5h", "2d" since a Unix-epoch-ms time ("-" for 0). */
const char *pcs_cli_age(uint64_t epoch_ms, char *buf, size_t n);
/* "2026-01-02T03:04:05Z" of a Unix-epoch-ms time ("-" for 0). */
const char *pcs_cli_time(uint64_t epoch_ms, char *buf, size_t n);

/* Aligned text table: columns sized to their widest cell, two spaces apart. */
typedef struct pcs_cli_table pcs_cli_table_t;
/* NULL on out of memory. Headers are borrowed (string literals). */
pcs_cli_table_t *pcs_cli_table_new(int ncols, const char *const *headers);
/* Right-align column `col` (numbers). */
void pcs_cli_table_right(pcs_cli_table_t *t, int col);
/* Append one cell to the current row (a new row starts after ncols cells). */
void pcs_cli_table_cell(pcs_cli_table_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void pcs_cli_table_print(const pcs_cli_table_t *t, FILE *fp);
void pcs_cli_table_free(pcs_cli_table_t *t);

#endif
