/* pcsctl's argument parsing (cli.h): every sub-command describes its options in a pcs_cli_spec_t
 * and parses with getopt_long through pcs_cli_parse, so each one takes -h/--help, the global
 * options anywhere on its line, `--opt VALUE` and `--opt=VALUE`, and reports mistakes in one
 * wording: "pcsctl: CMD: PROBLEM" and its usage line, exit 2. */
#include "cli/cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { GLOBAL_COORDINATOR = 1000, GLOBAL_JSON, GLOBAL_TIMEOUT, GLOBAL_HELP, OPT_BASE = 2000 };

static const pcs_cli_opt_t global_opts[] = {
    {"coordinator", "ADDR", "coordinator address (default $PCS_COORDINATOR, else 127.0.0.1:7070)"},
    {"json", NULL, "print the reply as JSON (proto3 canonical mapping)"},
    {"timeout-ms", "N", "deadline of each call (default 5000)"},
    {"help", NULL, "this help"},
};

void pcs_cli_synopsis(const pcs_cli_spec_t *s, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "pcsctl %s", s->name);
    for (size_t i = 0; i < s->n_opts && o < n; i++) {
        const pcs_cli_opt_t *op = &s->opts[i];
        o += (size_t)snprintf(buf + o, n - o, " [--%s%s%s]", op->name, op->arg ? " " : "",
                              op->arg ? op->arg : "");
    }
    if (s->args && *s->args && o < n)
        snprintf(buf + o, n - o, " %s", s->args);
}

static void print_opt(FILE *f, const pcs_cli_opt_t *op)
{
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", op->name, op->arg ? " " : "", op->arg ? op->arg : "");
    fprintf(f, "  %-24s %s\n", left, op->help);
}

void pcs_cli_print_help(const pcs_cli_spec_t *s, FILE *f)
{
    char syn[1024];
    pcs_cli_synopsis(s, syn, sizeof syn);
    fprintf(f, "usage: %s\n\n%s\n", syn, s->summary);
    if (s->details)
        fprintf(f, "\n%s", s->details);
    if (s->n_opts) {
        fprintf(f, "\noptions:\n");
        for (size_t i = 0; i < s->n_opts; i++)
            print_opt(f, &s->opts[i]);
    }
    fprintf(f, "\nglobal options (before or after the command):\n");
    for (size_t i = 0; i < sizeof global_opts / sizeof global_opts[0]; i++)
        print_opt(f, &global_opts[i]);
}

/* The usage error: "pcsctl: CMD: MSG", the synopsis, and where the options are explained. */
static int usage_error(const pcs_cli_spec_t *s, const char *msg, const char *what)
{
    char syn[1024];
    pcs_cli_synopsis(s, syn, sizeof syn);
    fprintf(stderr, "pcsctl: %s: %s%s%s\nusage: %s\n(pcsctl %s --help explains the options)\n",
            s->name, msg, what ? " " : "", what ? what : "", syn, s->name);
    return PCS_CLI_USAGE;
}

int pcs_cli_parse(const pcs_cli_spec_t *s, int argc, char **argv, pcs_cli_args_t *a)
{
    memset(a, 0, sizeof *a);
    if (s->n_opts > PCS_CLI_MAX_OPTS)
        return pcs_cli_fail("%s: too many options (internal)", s->name);
    struct option lo[PCS_CLI_MAX_OPTS + 5];
    size_t k = 0;
    for (size_t i = 0; i < s->n_opts; i++)
        lo[k++] = (struct option){s->opts[i].name, s->opts[i].arg ? required_argument : no_argument,
                                  NULL, OPT_BASE + (int)i};
    lo[k++] = (struct option){"coordinator", required_argument, NULL, GLOBAL_COORDINATOR};
    lo[k++] = (struct option){"json", no_argument, NULL, GLOBAL_JSON};
    lo[k++] = (struct option){"timeout-ms", required_argument, NULL, GLOBAL_TIMEOUT};
    lo[k++] = (struct option){"help", no_argument, NULL, GLOBAL_HELP};
    lo[k] = (struct option){NULL, 0, NULL, 0};
    opterr = 0;
    optind = 1; /* argv[0] is the command's name */
    for (;;) {
        int li = -1;
        int c = getopt_long(argc, argv, ":h", lo, &li);
        if (c == -1)
            break;
        if (c == 'h' || c == GLOBAL_HELP) {
            pcs_cli_print_help(s, stdout);
            return PCS_CLI_HELP;
        }
        if (c == ':')
            return usage_error(s, "option needs a value:", argv[optind - 1]);
        if (c == '?')
            return usage_error(s, "unknown option", argv[optind - 1]);
        if (c == GLOBAL_COORDINATOR || c == GLOBAL_TIMEOUT) {
            /* the global parser checks values and prints its own error */
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", c == GLOBAL_COORDINATOR ? "coordinator" :
                                                                          "timeout-ms");
            char *gv[3] = {argv[0], flag, optarg};
            int gi = 1;
            if (pcs_cli_global_flag(3, gv, &gi) < 0)
                return PCS_CLI_USAGE;
            continue;
        }
        if (c == GLOBAL_JSON) {
            pcs_cli()->json = 1;
            continue;
        }
        a->val[c - OPT_BASE] = s->opts[c - OPT_BASE].arg ? optarg : "1";
    }
    a->pos = argv + optind;
    a->n_pos = argc - optind;
    if (a->n_pos < s->min_pos) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s is required", s->args);
        return usage_error(s, msg, NULL);
    }
    if (a->n_pos > s->max_pos)
        return usage_error(s, "unexpected argument", a->pos[s->max_pos]);
    return PCS_CLI_OK;
}

int pcs_cli_bad_value(const pcs_cli_spec_t *s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return usage_error(s, msg, NULL);
}

int pcs_cli_u32_opt(const pcs_cli_spec_t *s, const char *name, const char *val, uint32_t lo,
                    uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    unsigned long long v = val && *val && *val != '-' ? strtoull(val, &end, 10) : 0;
    if (!val || !*val || *val == '-' || !end || *end || v < lo || v > hi)
        return pcs_cli_bad_value(s, "--%s: want an integer in [%u, %u], got '%s'", name, lo, hi,
                                 val ? val : "");
    *out = (uint32_t)v;
    return PCS_CLI_OK;
}
