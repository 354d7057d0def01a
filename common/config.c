/* The option-table engine of pcs/config.h (STYLE.md B6): each binary owns a static pcs_opt_t
 * table; this file applies defaults, the --config file, PCS_* environment variables and flags
 * in that order, checks types and bounds with errors that name the source, and prints --help,
 * the startup dump and the README's markdown table from the same rows. No globals. */
#include "pcs/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pcs/log.h"
#include "pcs/mem.h"

typedef struct opt_val {
    char *text; /* normalized value text (bools: "true"/"false") */
    uint64_t u;
    double d;
    int b;
    pcs_opt_source_t src;
    char origin[200]; /* "default", "file x.conf:3", "env PCS_X", "flag --x" */
} opt_val_t;

struct pcs_config {
    const pcs_opt_t *table; /* retained: the binary's static table */
    size_t n;
    opt_val_t *vals;
    char **args; /* positional arguments, NULL-terminated */
    int nargs;
    int help;
};

static const char *const type_names[] = {"u32", "u64", "double", "bool", "string"};
static const char *const source_names[] = {"default", "file", "env", "flag"};

// ---- helpers ----

static void env_name(const char *key, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "PCS_");
    for (const char *p = key; *p && o + 1 < n; p++)
        buf[o++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[o < n ? o : n - 1] = '\0';
}

static int find_row(const pcs_opt_t *table, size_t n, const char *key, size_t keylen)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].key) == keylen && strncmp(table[i].key, key, keylen) == 0)
            return (int)i;
    return -1;
}

static int has_bounds(const pcs_opt_t *o)
{
    return !(o->min == 0 && o->max == 0);
}

static int is_int_type(pcs_opt_type_t t)
{
    return t == PCS_OPT_U32 || t == PCS_OPT_U64;
}

/* "[10, 60000]" in the row's own terms (integers without exponents). */
static void format_bounds(const pcs_opt_t *o, char *buf, size_t n)
{
    if (is_int_type(o->type)) {
        uint64_t hi = o->type == PCS_OPT_U32 ? UINT32_MAX : UINT64_MAX;
        uint64_t lo = 0;
        if (has_bounds(o)) {
            lo = (uint64_t)o->min;
            if (o->max < (double)hi)
                hi = (uint64_t)o->max;
        }
        snprintf(buf, n, "[%" PRIu64 ", %" PRIu64 "]", lo, hi);
    } else if (o->type == PCS_OPT_DOUBLE && has_bounds(o)) {
        snprintf(buf, n, "[%g, %g]", o->min, o->max);
    } else {
        buf[0] = '\0';
    }
}

static int is_secret(const char *key)
{
    return strstr(key, "token") || strstr(key, "password") || strstr(key, "secret");
}

static int parse_bool(const char *s, int *out)
{
    static const char *const t[] = {"1", "true", "yes", "on"};
    static const char *const f[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, t[i]) == 0) {
            *out = 1;
            return 1;
        }
        if (strcasecmp(s, f[i]) == 0) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

/* Decimal or 0x-hex unsigned integer with nothing after it; no sign. */
static int parse_uint(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0]))
        return 0;
    int base = (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || end == s || *end != '\0')
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* Parse `text` for row `o` into *v. Errors name the key, value and origin. */
static pcs_status_t parse_value(const pcs_opt_t *o, const char *text, const char *origin,
                                opt_val_t *v)
{
    char bounds[96];
    format_bounds(o, bounds, sizeof bounds);
    const char *shown = is_secret(o->key) ? "***" : text;
    switch (o->type) {
    case PCS_OPT_U32:
    case PCS_OPT_U64: {
        uint64_t u;
        if (!parse_uint(text, &u))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s=%s (%s): not an unsigned integer", o->key,
                                 shown, origin);
        uint64_t hi = o->type == PCS_OPT_U32 ? UINT32_MAX : UINT64_MAX;
        if (u > hi || (has_bounds(o) && ((double)u < o->min || (double)u > o->max)))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s=%s (%s): must be in %s", o->key, shown,
                                 origin, bounds);
        v->u = u;
        v->d = (double)u;
        break;
    }
    case PCS_OPT_DOUBLE: {
        errno = 0;
        char *end = NULL;
        double d = strtod(text, &end);
        if (errno || end == text || *end != '\0' || !isfinite(d))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s=%s (%s): not a finite number", o->key,
                                 shown, origin);
        if (has_bounds(o) && (d < o->min || d > o->max))
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s=%s (%s): must be in %s", o->key, shown,
                                 origin, bounds);
        v->d = d;
        break;
    }
    case PCS_OPT_BOOL:
        if (!parse_bool(text, &v->b))
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "%s=%s (%s): not a boolean (true/false, yes/no, on/off, 1/0)",
                                 o->key, shown, origin);
        text = v->b ? "true" : "false";
        break;
    case PCS_OPT_STRING:
        break;
    default:
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: unknown option type %d", o->key, (int)o->type);
    }
    char *copy;
    PCS_CHECK(pcs_strdup(text, &copy));
    free(v->text);
    v->text = copy;
    return PCS_OK;
}

static pcs_status_t set_value(pcs_config_t *c, size_t row, const char *text, pcs_opt_source_t src,
                              const char *origin)
{
    opt_val_t *v = &c->vals[row];
    PCS_CHECK(parse_value(&c->table[row], text, origin, v));
    v->src = src;
    snprintf(v->origin, sizeof v->origin, "%s", origin);
    return PCS_OK;
}

// ---- sources ----

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* redis-style `key value` lines; `#` starts a comment (at line start or after whitespace);
 * a value may be double-quoted to keep a `#` or surrounding spaces. */
static pcs_status_t load_file(pcs_config_t *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "cannot read config file %s: %s", path,
                             strerror(errno));
    pcs_status_t st = PCS_OK;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char origin[200];
        snprintf(origin, sizeof origin, "file %s:%d", path, lineno);
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *k = s;
        while (*s && !isspace((unsigned char)*s) && *s != '=')
            s++;
        size_t klen = (size_t)(s - k);
        while (isspace((unsigned char)*s))
            s++;
        if (*s == '=')
            s++;
        while (isspace((unsigned char)*s))
            s++;
        char *val = s;
        if (*val == '"') {
            char *q = strchr(val + 1, '"');
            if (!q) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%.*s (%s): unterminated quote", (int)klen,
                                   k, origin);
                break;
            }
            /* only blanks or a comment may follow: `key "a"b` is a typo, not "a" */
            const char *rest = q + 1;
            while (isspace((unsigned char)*rest))
                rest++;
            if (*rest && *rest != '#') {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%.*s (%s): text after the closing quote",
                                   (int)klen, k, origin);
                break;
            }
            *q = '\0';
            val++;
        } else {
            for (char *p = val; *p; p++) {
                if (*p == '#' && (p == val || isspace((unsigned char)p[-1]))) {
                    *p = '\0';
                    break;
                }
            }
            val = trim(val);
        }
        int row = find_row(c->table, c->n, k, klen);
        if (row < 0) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "unknown option '%.*s' (%s)", (int)klen, k,
                               origin);
            break;
        }
        if (!*val && c->table[row].type != PCS_OPT_STRING) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s (%s): missing value", c->table[row].key,
                               origin);
            break;
        }
        st = set_value(c, (size_t)row, val, PCS_SRC_FILE, origin);
        if (st != PCS_OK)
            break;
    }
    free(line);
    fclose(f);
    return st;
}

static pcs_status_t load_env(pcs_config_t *c)
{
    for (size_t i = 0; i < c->n; i++) {
        char name[160];
        env_name(c->table[i].key, name, sizeof name);
        const char *v = getenv(name);
        if (!v)
            continue;
        char origin[200];
        snprintf(origin, sizeof origin, "env %s", name);
        PCS_CHECK(set_value(c, i, v, PCS_SRC_ENV, origin));
    }
    return PCS_OK;
}

static int looks_like_option(const char *a)
{
    /* "-5" and "-.5" are values/positionals, "-" alone is stdin by convention */
    return a[0] == '-' && a[1] && !isdigit((unsigned char)a[1]) && a[1] != '.';
}

static pcs_status_t add_arg(pcs_config_t *c, const char *a)
{
    char **na = realloc(c->args, (size_t)(c->nargs + 2) * sizeof *na);
    if (!na)
        return pcs_set_error(PCS_ERR_NOMEM, "out of memory for arguments");
    c->args = na;
    PCS_CHECK(pcs_strdup(a, &c->args[c->nargs]));
    c->nargs++;
    c->args[c->nargs] = NULL;
    return PCS_OK;
}

/* Find --config (flag) before anything else is applied, since the file ranks below env/flags. */
static pcs_status_t find_config_path(int argc, char **argv, const char **path)
{
    *path = getenv("PCS_CONFIG");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc)
                return pcs_set_error(PCS_ERR_INVALID_ARG, "--config needs a file path (flag)");
            *path = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            *path = a + 9;
        }
    }
    return PCS_OK;
}

static pcs_status_t load_flags(pcs_config_t *c, int argc, char **argv)
{
    int positional_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (positional_only || !looks_like_option(a)) {
            PCS_CHECK(add_arg(c, a));
            continue;
        }
        if (strcmp(a, "--") == 0) {
            positional_only = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            c->help = 1;
            continue;
        }
        if (strcmp(a, "--config") == 0) {
            i++; /* loaded already */
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (a[1] != '-')
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "unknown option '%s' (flag); options are "
                                 "--key value or --key=value",
                                 a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int row = find_row(c->table, c->n, name, nlen);
        const char *val = eq ? eq + 1 : NULL;
        char origin[200];
        if (row < 0 && !eq && nlen > 3 && strncmp(name, "no-", 3) == 0) {
            int r2 = find_row(c->table, c->n, name + 3, nlen - 3);
            if (r2 >= 0 && c->table[r2].type == PCS_OPT_BOOL) {
                snprintf(origin, sizeof origin, "flag %s", a);
                PCS_CHECK(set_value(c, (size_t)r2, "false", PCS_SRC_FLAG, origin));
                continue;
            }
        }
        if (row < 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "unknown option '--%.*s' (flag)", (int)nlen,
                                 name);
        snprintf(origin, sizeof origin, "flag --%s", c->table[row].key);
        if (!val) {
            if (c->table[row].type == PCS_OPT_BOOL) {
                val = "true";
            } else {
                if (i + 1 >= argc)
                    return pcs_set_error(PCS_ERR_INVALID_ARG, "--%s needs a value (flag)",
                                         c->table[row].key);
                val = argv[++i];
            }
        }
        PCS_CHECK(set_value(c, (size_t)row, val, PCS_SRC_FLAG, origin));
    }
    return PCS_OK;
}

static pcs_status_t check_table(const pcs_opt_t *table, size_t n)
{
    if (n && !table)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "config: NULL option table");
    for (size_t i = 0; i < n; i++) {
        const pcs_opt_t *o = &table[i];
        if (!o->key || !*o->key || !o->def || (unsigned)o->type > PCS_OPT_STRING)
            return pcs_set_error(PCS_ERR_INTERNAL, "config: option row %zu is incomplete", i);
        if (strcmp(o->key, "config") == 0 || strcmp(o->key, "help") == 0)
            return pcs_set_error(PCS_ERR_INTERNAL, "config: '%s' is a built-in option", o->key);
        for (size_t j = 0; j < i; j++)
            if (strcmp(table[j].key, o->key) == 0)
                return pcs_set_error(PCS_ERR_INTERNAL, "config: option %s listed twice", o->key);
    }
    return PCS_OK;
}

// ---- public API ----

pcs_status_t pcs_config_load(const pcs_opt_t *table, size_t n, int argc, char **argv,
                             pcs_config_t **out)
{
    *out = NULL;
    PCS_CHECK(check_table(table, n));
    if (argc > 0 && !argv)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "config: argc %d but argv is NULL", argc);
    pcs_config_t *c;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    pcs_status_t st = PCS_OK;
    c->table = table;
    c->n = n;
    PCS_CHECK_GOTO(pcs_calloc(n ? n : 1, sizeof *c->vals, (void **)&c->vals), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(1, sizeof *c->args, (void **)&c->args), st, fail);
    for (size_t i = 0; i < n; i++) {
        st = set_value(c, i, table[i].def, PCS_SRC_DEFAULT, "default");
        if (st != PCS_OK) {
            st = pcs_set_error(PCS_ERR_INTERNAL, "config table bug: %s", pcs_last_error());
            goto fail;
        }
    }
    const char *path = NULL;
    PCS_CHECK_GOTO(find_config_path(argc, argv, &path), st, fail);
    if (path && *path)
        PCS_CHECK_GOTO(load_file(c, path), st, fail);
    PCS_CHECK_GOTO(load_env(c), st, fail);
    PCS_CHECK_GOTO(load_flags(c, argc, argv), st, fail);
    *out = c;
    return PCS_OK;
fail:
    pcs_config_free(c);
    return st;
}

void pcs_config_free(pcs_config_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->vals && i < c->n; i++)
        free(c->vals[i].text);
    free(c->vals);
    for (int i = 0; i < c->nargs; i++)
        free(c->args[i]);
    free(c->args);
    free(c);
}

/* Row of `key` checked against the getter's type; NULL (with one WARN) on a programming error. */
static const opt_val_t *get(const pcs_config_t *c, const char *key, int want_type)
{
    if (!c || !key)
        return NULL;
    int row = find_row(c->table, c->n, key, strlen(key));
    if (row < 0) {
        PCS_WARN(PCS_SUB_CONFIG, "config: no option named %s", key);
        return NULL;
    }
    pcs_opt_type_t t = c->table[row].type;
    int ok = want_type < 0 || (int)t == want_type ||
             (want_type == PCS_OPT_U64 && t == PCS_OPT_U32) ||
             (want_type == PCS_OPT_DOUBLE && is_int_type(t));
    if (!ok) {
        PCS_WARN(PCS_SUB_CONFIG, "config: option %s is %s, read as %s", key, type_names[t],
                 type_names[want_type]);
        return NULL;
    }
    return &c->vals[row];
}

uint32_t pcs_config_u32(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, PCS_OPT_U32);
    return v ? (uint32_t)v->u : 0;
}

uint64_t pcs_config_u64(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, PCS_OPT_U64);
    return v ? v->u : 0;
}

double pcs_config_double(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, PCS_OPT_DOUBLE);
    return v ? v->d : 0.0;
}

int pcs_config_bool(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, PCS_OPT_BOOL);
    return v ? v->b : 0;
}

const char *pcs_config_str(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, -1); /* any type: its text */
    return v ? v->text : NULL;
}

pcs_opt_source_t pcs_config_source(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, -1);
    return v ? v->src : PCS_SRC_DEFAULT;
}

int pcs_config_help_requested(const pcs_config_t *c)
{
    return c ? c->help : 0;
}

char **pcs_config_args(const pcs_config_t *c, int *argc)
{
    if (argc)
        *argc = c ? c->nargs : 0;
    return c ? c->args : NULL;
}

void pcs_config_print_help(const pcs_opt_t *table, size_t n, const char *usage)
{
    /* PCS_HELP_FORMAT=markdown: the README's configuration table, from the same rows */
    const char *fmt = getenv("PCS_HELP_FORMAT");
    if (fmt && strcmp(fmt, "markdown") == 0) {
        pcs_config_print_markdown(table, n);
        return;
    }
    if (usage)
        printf("%s\n\n", usage);
    printf("Options (precedence: default < --config FILE < env PCS_* < --flag):\n");
    printf("  %-34s %s\n", "--config FILE", "read `key value` lines (# comments); env PCS_CONFIG");
    printf("  %-34s %s\n", "--help, -h", "print this help");
    for (size_t i = 0; i < n; i++) {
        const pcs_opt_t *o = &table[i];
        char flag[160], env[160], bounds[96];
        if (o->type == PCS_OPT_BOOL)
            snprintf(flag, sizeof flag, "--%s[=BOOL], --no-%s", o->key, o->key);
        else
            snprintf(flag, sizeof flag, "--%s %s", o->key,
                     o->type == PCS_OPT_STRING   ? "STR"
                     : o->type == PCS_OPT_DOUBLE ? "X"
                                                 : "N");
        env_name(o->key, env, sizeof env);
        format_bounds(o, bounds, sizeof bounds);
        printf("  %-34s %s\n", flag, o->help ? o->help : "");
        printf("  %-34s default %s%s%s, env %s\n", "", *o->def ? o->def : "\"\"",
               has_bounds(o) ? ", range " : "", has_bounds(o) ? bounds : "", env);
    }
}

void pcs_config_log_nondefault(const pcs_config_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        const opt_val_t *v = &c->vals[i];
        if (v->src == PCS_SRC_DEFAULT)
            continue;
        PCS_INFO(PCS_SUB_CONFIG, "%s set by %s to %s", c->table[i].key, v->origin,
                 is_secret(c->table[i].key) ? "***" : v->text);
    }
}

size_t pcs_config_dump(const pcs_config_t *c, char *buf, size_t n)
{
    size_t total = 0;
    if (buf && n)
        buf[0] = '\0';
    if (!c)
        return 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *val = is_secret(c->table[i].key) ? "***" : c->vals[i].text;
        int w = snprintf(buf && total < n ? buf + total : NULL, buf && total < n ? n - total : 0,
                         "%s:%s\n", c->table[i].key, val);
        if (w > 0)
            total += (size_t)w;
    }
    return total;
}

void pcs_config_print_markdown(const pcs_opt_t *table, size_t n)
{
    printf("| option | env | type | default | range | description |\n");
    printf("|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const pcs_opt_t *o = &table[i];
        char env[160], bounds[96];
        env_name(o->key, env, sizeof env);
        format_bounds(o, bounds, sizeof bounds);
        char def[256] = "";
        if (o->def && *o->def)
            snprintf(def, sizeof def, "`%s`", o->def);
        printf("| `%s` | `%s` | %s | %s | %s | ", o->key, env, type_names[o->type], def,
               has_bounds(o) ? bounds : "");
        /* a '|' in the help text would end the table cell */
        for (const char *h = o->help ? o->help : ""; *h; h++) {
            if (*h == '|')
                fputs("\\|", stdout);
            else
                putchar(*h);
        }
        printf(" |\n");
    }
}

const char *pcs_config_source_name(pcs_opt_source_t s)
{
    return (unsigned)s <= PCS_SRC_FLAG ? source_names[s] : "?";
}

const char *pcs_config_origin(const pcs_config_t *c, const char *key)
{
    const opt_val_t *v = get(c, key, -1);
    return v ? v->origin : "?";
}
