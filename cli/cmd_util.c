/* pcsctl helpers (cli.h): global flags, the coordinator call with pcsctl's error wording, JSON
 * output, time formatting and aligned tables. No command logic here. */
#include "cli/cli.h"
#include "pcs/pbtext.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

static pcs_cli_t g_cli = {"127.0.0.1:7070", 0, 5000, 0};

pcs_cli_t *pcs_cli(void)
{
    return &g_cli;
}

// ---- messages -----------------------------------------------------------------------------------

int pcs_cli_usage(const char *cmd, const char *usage, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "pcsctl: %s%s", cmd ? cmd : "", cmd ? ": " : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (usage)
        fprintf(stderr, "usage: %s\n", usage);
    return PCS_CLI_USAGE;
}

int pcs_cli_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("pcsctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return PCS_CLI_FAIL;
}

static int parse_ms(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > 3600000)
        return -1;
    *out = (int)v;
    return 0;
}

int pcs_cli_global_flag(int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        g_cli.json = 1;
        return 1;
    }
    const char *val = NULL;
    int which = 0;
    if (!strcmp(a, "--coordinator") || !strcmp(a, "--timeout-ms")) {
        which = a[2] == 'c' ? 1 : 2;
        if (*i + 1 >= argc) {
            pcs_cli_usage(NULL, NULL, "%s needs a value", a);
            return -1;
        }
        val = argv[++*i];
    } else if (!strncmp(a, "--coordinator=", 14)) {
        which = 1;
        val = a + 14;
    } else if (!strncmp(a, "--timeout-ms=", 13)) {
        which = 2;
        val = a + 13;
    } else {
        return 0;
    }
    if (which == 1) {
        if (!*val) {
            pcs_cli_usage(NULL, NULL, "--coordinator needs an address (host:port)");
            return -1;
        }
        g_cli.addr = val;
    } else if (parse_ms(val, &g_cli.timeout_ms)) {
        pcs_cli_usage(NULL, NULL, "--timeout-ms must be an integer in [1, 3600000], got '%s'", val);
        return -1;
    }
    return 1;
}

// ---- RPC ----------------------------------------------------------------------------------------

int pcs_cli_call(const char *cmd, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp)
{
    pcs_rpc_client_t *c = NULL;
    *resp = NULL;
    g_cli.last_code = -1;
    if (pcs_rpc_client_create(g_cli.addr, &c) != PCS_OK)
        return pcs_cli_fail("cannot reach coordinator at %s (%s)", g_cli.addr, pcs_last_error());
    int code = -1;
    pcs_status_t st = pcs_rpc_call(c, method, req, resp_desc, g_cli.timeout_ms, resp, &code);
    g_cli.last_code = st == PCS_OK ? 0 : code;
    char why[1024];
    snprintf(why, sizeof why, "%s", pcs_last_error());
    pcs_rpc_client_destroy(c);
    if (st == PCS_OK)
        return PCS_CLI_OK;
    if (code == 14) /* UNAVAILABLE: nothing listens there, or the connection broke */
        return pcs_cli_fail("cannot reach coordinator at %s (%s)", g_cli.addr, why);
    if (code == 4) /* DEADLINE_EXCEEDED */
        return pcs_cli_fail("coordinator at %s did not answer within %d ms (%s)", g_cli.addr,
                            g_cli.timeout_ms, why);
    return pcs_cli_fail("%s: %s", cmd, why);
}

int pcs_cli_query(const char *cmd, const char *method, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp)
{
    int rc = pcs_cli_call(cmd, method, req, resp_desc, resp);
    if (rc != PCS_CLI_OK || !g_cli.json)
        return rc;
    rc = pcs_cli_print_json(*resp);
    protobuf_c_message_free_unpacked(*resp, NULL);
    *resp = NULL;
    return rc;
}

int pcs_cli_state_args(const pcs_cli_spec_t *spec, int argc, char **argv,
                       const ProtobufCEnumDescriptor *d, int *state)
{
    *state = 0;
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc;
    const char *val = a.val[0];
    if (!val)
        return PCS_CLI_OK;
    int v = pcs_cli_enum_parse(d, val);
    if (v < 0) {
        /* "JobState" -> "job state" */
        char noun[64];
        size_t o = 0;
        for (const char *c = d->short_name; *c && o + 2 < sizeof noun; c++) {
            if (*c >= 'A' && *c <= 'Z' && c != d->short_name)
                noun[o++] = ' ';
            noun[o++] = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        }
        noun[o] = '\0';
        return pcs_cli_bad_value(spec, "--state: unknown %s '%s'", noun, val);
    }
    *state = v;
    return PCS_CLI_OK;
}

int pcs_cli_print_json(const ProtobufCMessage *m)
{
    char *json = NULL;
    if (pcs_pb_to_json_canonical(m, 2, &json) != PCS_OK)
        return pcs_cli_fail("cannot render JSON: %s", pcs_last_error());
    fputs(json, stdout);
    fputc('\n', stdout);
    free(json);
    return PCS_CLI_OK;
}

// ---- formatting ---------------------------------------------------------------------------------

const char *pcs_cli_enum(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t n)
{
    const char *s = pcs_pb_enum_short(d, value, buf, n);
    if (!strcmp(s, "?")) {
        snprintf(buf, n, "%d", value);
        return buf;
    }
    return s;
}

int pcs_cli_enum_parse(const ProtobufCEnumDescriptor *d, const char *s)
{
    if (!*s || !strcasecmp(s, "all"))
        return 0;
    char buf[64];
    for (unsigned i = 0; i < d->n_values; i++) {
        if (!strcasecmp(pcs_pb_enum_short(d, d->values[i].value, buf, sizeof buf), s))
            return d->values[i].value;
    }
    return -1;
}

static uint64_t now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

const char *pcs_cli_age(uint64_t epoch_ms, char *buf, size_t n)
{
    if (!epoch_ms) {
        snprintf(buf, n, "-");
        return buf;
    }
    uint64_t now = now_ms();
    uint64_t s = now > epoch_ms ? (now - epoch_ms) / 1000u : 0;
    if (s < 120)
        snprintf(buf, n, "%llus", (unsigned long long)s);
    else if (s < 7200)
        snprintf(buf, n, "%llum", (unsigned long long)(s / 60));
    else if (s < 172800)
        snprintf(buf, n, "%lluh", (unsigned long long)(s / 3600));
    else
        snprintf(buf, n, "%llud", (unsigned long long)(s / 86400));
    return buf;
}

const char *pcs_cli_time(uint64_t epoch_ms, char *buf, size_t n)
{
    if (!epoch_ms) {
        snprintf(buf, n, "-");
        return buf;
    }
    time_t t = (time_t)(epoch_ms / 1000u);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// ---- tables -------------------------------------------------------------------------------------

#define TABLE_MAX_COLS 16

struct pcs_cli_table {
    int ncols;
    const char *headers[TABLE_MAX_COLS];
    int right[TABLE_MAX_COLS];
    char **cells; /* row-major */
    size_t n, cap;
    int oom;
};

pcs_cli_table_t *pcs_cli_table_new(int ncols, const char *const *headers)
{
    if (ncols < 1 || ncols > TABLE_MAX_COLS)
        return NULL;
    pcs_cli_table_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->ncols = ncols;
    for (int i = 0; i < ncols; i++)
        t->headers[i] = headers[i];
    return t;
}

void pcs_cli_table_right(pcs_cli_table_t *t, int col)
{
    if (t && col >= 0 && col < t->ncols)
        t->right[col] = 1;
}

void pcs_cli_table_cell(pcs_cli_table_t *t, const char *fmt, ...)
{
    if (!t || t->oom)
        return;
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 64;
        char **p = realloc(t->cells, ncap * sizeof *p);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->cells = p;
        t->cap = ncap;
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* One line per row: a newline inside a cell would break the alignment. */
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
    t->cells[t->n] = strdup(buf);
    if (!t->cells[t->n]) {
        t->oom = 1;
        return;
    }
    t->n++;
}

void pcs_cli_table_print(const pcs_cli_table_t *t, FILE *fp)
{
    if (!t)
        return;
    size_t w[TABLE_MAX_COLS];
    for (int c = 0; c < t->ncols; c++)
        w[c] = strlen(t->headers[c]);
    for (size_t i = 0; i < t->n; i++) {
        size_t len = strlen(t->cells[i]);
        if (len > w[i % (size_t)t->ncols])
            w[i % (size_t)t->ncols] = len;
    }
    size_t rows = (t->n + (size_t)t->ncols - 1) / (size_t)t->ncols;
    size_t linecap = 1;
    for (int c = 0; c < t->ncols; c++)
        linecap += w[c] + 2;
    char *line = malloc(linecap);
    if (!line)
        return;
    for (size_t r = 0; r <= rows; r++) { /* row 0 is the header */
        size_t used = 0;
        for (int c = 0; c < t->ncols; c++) {
            const char *s;
            if (r == 0) {
                s = t->headers[c];
            } else {
                size_t k = (r - 1) * (size_t)t->ncols + (size_t)c;
                s = k < t->n ? t->cells[k] : "";
            }
            int k = snprintf(line + used, linecap - used, t->right[c] ? "%*s%s" : "%-*s%s",
                             (int)w[c], s, c == t->ncols - 1 ? "" : "  ");
            if (k > 0)
                used += (size_t)k < linecap - used ? (size_t)k : linecap - used - 1;
        }
        while (used > 0 && line[used - 1] == ' ') /* no trailing blanks after empty cells */
            used--;
        line[used] = '\0';
        fprintf(fp, "%s\n", line);
    }
    free(line);
}

void pcs_cli_table_free(pcs_cli_table_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}
