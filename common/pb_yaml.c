/* YAML/JSON text -> protobuf-c message through descriptors (pcs/pbtext.h): job files for pcsctl
 * and the planner. A recursive descent over libyaml events (not the document API) so that depth
 * and size are bounded before anything is allocated, and aliases are refused outright. The result
 * is allocated exactly as protobuf_c_message_unpack() would, so free_unpacked(msg, NULL) frees it.
 * Not for output: pb_json.c renders messages. */
#include "pcs/pbtext.h"
#include "pcs/mem.h"
#include "pcs/utf8.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define PB_MAX_DEPTH     64          /* nesting of mappings and sequences */
#define PB_MAX_DOC_BYTES (16u << 20) /* a 100k-tensor explicit model is ~10 MB */

typedef struct yctx {
    yaml_parser_t parser;
    yaml_event_t ev; /* the current event; valid while has_ev */
    int has_ev;
    int depth;
    size_t plen;
    char path[512];
} yctx_t;

// ---- errors and the field path ----------------------------------------------------------------

static size_t ev_line(const yctx_t *c)
{
    return c->has_ev ? c->ev.start_mark.line + 1 : c->parser.mark.line + 1;
}

__attribute__((format(printf, 2, 3))) static pcs_status_t yfail(yctx_t *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->plen)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "line %zu: %s: %s", ev_line(c), c->path, msg);
    return pcs_set_error(PCS_ERR_INVALID_ARG, "line %zu: %s", ev_line(c), msg);
}

/* Append ".name" (or "name" at the root) or "[i]"; returns the old length for path_pop. */
static size_t path_push_field(yctx_t *c, const char *name)
{
    size_t old = c->plen;
    int n = snprintf(c->path + c->plen, sizeof c->path - c->plen, "%s%s", c->plen ? "." : "", name);
    if (n > 0)
        c->plen = strlen(c->path);
    return old;
}

static size_t path_push_index(yctx_t *c, size_t i)
{
    size_t old = c->plen;
    int n = snprintf(c->path + c->plen, sizeof c->path - c->plen, "[%zu]", i);
    if (n > 0)
        c->plen = strlen(c->path);
    return old;
}

static void path_pop(yctx_t *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

/* Show at most 40 bytes of a user value inside an error message. */
static const char *shown(const char *s, char *buf, size_t n)
{
    size_t len = strlen(s);
    if (len < 41)
        return s;
    snprintf(buf, n, "%.*s...", pcs_utf8_prefix(s, 37), s); /* whole characters only */
    return buf;
}

static pcs_status_t next_event(yctx_t *c)
{
    if (c->has_ev) {
        yaml_event_delete(&c->ev);
        c->has_ev = 0;
    }
    if (!yaml_parser_parse(&c->parser, &c->ev)) {
        return pcs_set_error(PCS_ERR_INVALID_ARG, "line %zu: YAML syntax error: %s%s%s",
                             c->parser.problem_mark.line + 1,
                             c->parser.problem ? c->parser.problem : "unknown problem",
                             c->parser.context ? " " : "",
                             c->parser.context ? c->parser.context : "");
    }
    c->has_ev = 1;
    return PCS_OK;
}

/* A field by its proto3 JSON name, lowerCamelCase of the .proto name (protoc's json_name:
 * "microBatchSize" for micro_batch_size), which canonical JSON uses; parsers accept both. */
static const ProtobufCFieldDescriptor *field_by_json_name(const ProtobufCMessageDescriptor *d,
                                                          const char *key)
{
    for (unsigned i = 0; i < d->n_fields; i++) {
        const char *n = d->fields[i].name, *k = key;
        int up = 0;
        for (; *n; n++) {
            if (*n == '_') {
                up = 1;
                continue;
            }
            char want = up && *n >= 'a' && *n <= 'z' ? (char)(*n - 'a' + 'A') : *n;
            up = 0;
            if (*k++ != want)
                break;
        }
        if (!*n && !*k)
            return &d->fields[i];
    }
    return NULL;
}

static const char *event_kind(const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT:
        return "a mapping";
    case YAML_SEQUENCE_START_EVENT:
        return "a sequence";
    case YAML_SCALAR_EVENT:
        return "a scalar";
    case YAML_ALIAS_EVENT:
        return "an alias";
    default:
        return "end of input";
    }
}

// ---- scalar conversion (no side effects on failure; `why` gets the reason) --------------------

static int is_plain(const yaml_event_t *ev)
{
    return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static int is_null_scalar(const yaml_event_t *ev)
{
    const char *s = (const char *)ev->data.scalar.value;
    return is_plain(ev) && (ev->data.scalar.length == 0 || !strcmp(s, "~") || !strcmp(s, "null") ||
                            !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

static int parse_i64(const char *s, int64_t *out)
{
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    if (*p >= '0' && *p <= '9' && strspn(p, "0123456789") == strlen(p)) {
        errno = 0;
        long long v = strtoll(s, NULL, 10);
        if (errno == ERANGE)
            return -1;
        *out = v;
        return 0;
    }
    /* 1e6 and 1.0e8 are natural for sizes (FSDP writes min_num_params=1e8): accept a float
     * literal when it is an exact integer that a double represents exactly. */
    if (strspn(s, "0123456789+-.eE") != strlen(s) || !*s)
        return -2;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(d))
        return -2;
    if (d != floor(d))
        return -2;
    if (fabs(d) > 9007199254740992.0)
        return -1;
    *out = (int64_t)d;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && s[2] &&
        strspn(s + 2, "0123456789abcdefABCDEF") == strlen(s + 2)) {
        errno = 0;
        unsigned long long v = strtoull(s + 2, NULL, 16);
        if (errno == ERANGE)
            return -1;
        *out = v;
        return 0;
    }
    if (s[0] == '-')
        return (strspn(s + 1, "0123456789") == strlen(s + 1) && s[1]) ? -1 : -2;
    const char *p = s[0] == '+' ? s + 1 : s;
    if (*p && strspn(p, "0123456789") == strlen(p)) {
        errno = 0;
        unsigned long long v = strtoull(p, NULL, 10);
        if (errno == ERANGE)
            return -1;
        *out = v;
        return 0;
    }
    int64_t i;
    int rc = parse_i64(s, &i);
    if (rc)
        return rc;
    if (i < 0)
        return -1;
    *out = (uint64_t)i;
    return 0;
}

static int parse_f64(const char *s, double *out)
{
    static const struct {
        const char *name;
        double v;
    } special[] = {{"inf", INFINITY},    {".inf", INFINITY},       {"+inf", INFINITY},
                   {"+.inf", INFINITY},  {"infinity", INFINITY},   {"-inf", -INFINITY},
                   {"-.inf", -INFINITY}, {"-infinity", -INFINITY}, {"nan", NAN},
                   {".nan", NAN}};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        if (!strcasecmp(s, special[i].name)) {
            *out = special[i].v;
            return 0;
        }
    }
    /* Only decimal notation: strtod would also take hex floats and "nan(...)". */
    if (!*s || strspn(s, "0123456789+-.eE") != strlen(s) || !strpbrk(s, "0123456789"))
        return -2;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (*end)
        return -2;
    if (errno == ERANGE && fabs(d) > 1.0)
        return -1; /* overflow; underflow to a subnormal or 0 is fine */
    *out = d;
    return 0;
}

static size_t enum_prefix_len(const ProtobufCEnumDescriptor *d)
{
    if (d->n_values < 2)
        return 0;
    const char *first = d->values[0].name;
    size_t p = strlen(first);
    for (unsigned i = 1; i < d->n_values; i++) {
        const char *nm = d->values[i].name;
        size_t k = 0;
        while (k < p && nm[k] && nm[k] == first[k])
            k++;
        p = k;
    }
    while (p > 0 && first[p - 1] != '_')
        p--;
    for (unsigned i = 0; i < d->n_values; i++)
        if (strlen(d->values[i].name) <= p)
            return 0;
    return p;
}

const char *pcs_pb_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t n)
{
    const ProtobufCEnumValue *v = d ? protobuf_c_enum_descriptor_get_value(d, value) : NULL;
    if (!v || !buf || n == 0)
        return "?";
    const char *s = v->name + enum_prefix_len(d);
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++)
        buf[i] = (char)((s[i] >= 'A' && s[i] <= 'Z') ? s[i] - 'A' + 'a' : s[i]);
    buf[i] = '\0';
    return buf;
}

static int parse_enum(const ProtobufCEnumDescriptor *d, const char *s, int *out)
{
    size_t p = enum_prefix_len(d);
    for (unsigned i = 0; i < d->n_values; i++) {
        if (!strcasecmp(d->values[i].name + p, s) || !strcasecmp(d->values[i].name, s)) {
            *out = d->values[i].value;
            return 0;
        }
    }
    int64_t num;
    if (parse_i64(s, &num) == 0 && num >= INT32_MIN && num <= INT32_MAX &&
        protobuf_c_enum_descriptor_get_value(d, (int)num)) {
        *out = (int)num;
        return 0;
    }
    return -2;
}

static void enum_choices(const ProtobufCEnumDescriptor *d, char *buf, size_t n)
{
    size_t p = enum_prefix_len(d), used = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < d->n_values && used + 1 < n; i++) {
        if (d->values[i].value == 0 && d->n_values > 1)
            continue; /* the UNSPECIFIED value is written as `default` */
        char low[64];
        size_t k = 0;
        for (const char *s = d->values[i].name + p; *s && k + 1 < sizeof low; s++, k++)
            low[k] = (char)((*s >= 'A' && *s <= 'Z') ? *s - 'A' + 'a' : *s);
        low[k] = '\0';
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", low);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

static int b64_val(int ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+' || ch == '-')
        return 62;
    if (ch == '/' || ch == '_')
        return 63;
    return -1;
}

/* Standard or URL-safe base64, padding optional. */
static int parse_b64(const char *s, size_t len, ProtobufCBinaryData *out)
{
    while (len && s[len - 1] == '=')
        len--;
    if (len % 4 == 1)
        return -2;
    uint8_t *data = malloc(len * 3 / 4 + 1);
    if (!data)
        return -3;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(data);
            return -2;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            data[n++] = (uint8_t)(acc >> bits);
        }
    }
    if (n == 0) {
        free(data);
        data = NULL;
    }
    out->len = n;
    out->data = data;
    return 0;
}

static const char *type_noun(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_BOOL:
        return "true or false";
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
        return "a number";
    case PROTOBUF_C_TYPE_STRING:
        return "a string";
    case PROTOBUF_C_TYPE_BYTES:
        return "base64 bytes";
    case PROTOBUF_C_TYPE_ENUM:
        return "an enum name";
    case PROTOBUF_C_TYPE_MESSAGE:
        return "a mapping";
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return "a non-negative integer";
    default:
        return "an integer";
    }
}

/* Convert scalar text into *slot for field f. Returns 0, or -1 with `why` filled; -3 = no memory.
 * Strings and bytes are malloc'd (free_unpacked frees them). */
static int conv_scalar(const ProtobufCFieldDescriptor *f, const char *s, size_t len, void *slot,
                       char *why, size_t wn)
{
    char sb[48];
    if (strlen(s) != len) {
        snprintf(why, wn, "value contains a NUL byte");
        return -1;
    }
    int rc = 0;
    int64_t i64 = 0;
    uint64_t u64 = 0;
    double d = 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        rc = parse_i64(s, &i64);
        if (rc == 0 && (i64 < INT32_MIN || i64 > INT32_MAX))
            rc = -1;
        if (rc == -1) {
            snprintf(why, wn, "%s is out of range for int32", shown(s, sb, sizeof sb));
            return -1;
        }
        if (rc == 0)
            *(int32_t *)slot = (int32_t)i64;
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        rc = parse_u64(s, &u64);
        if (rc == 0 && u64 > UINT32_MAX)
            rc = -1;
        if (rc == -1) {
            snprintf(why, wn, "%s is out of range for uint32 (0..4294967295)",
                     shown(s, sb, sizeof sb));
            return -1;
        }
        if (rc == 0)
            *(uint32_t *)slot = (uint32_t)u64;
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        rc = parse_i64(s, &i64);
        if (rc == -1) {
            snprintf(why, wn, "%s is out of range for int64", shown(s, sb, sizeof sb));
            return -1;
        }
        if (rc == 0)
            *(int64_t *)slot = i64;
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        rc = parse_u64(s, &u64);
        if (rc == -1) {
            snprintf(why, wn, "%s is out of range for uint64", shown(s, sb, sizeof sb));
            return -1;
        }
        if (rc == 0)
            *(uint64_t *)slot = u64;
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_FLOAT:
        rc = parse_f64(s, &d);
        if (rc == 0 && f->type == PROTOBUF_C_TYPE_FLOAT && isfinite(d) && fabs(d) > FLT_MAX)
            rc = -1;
        if (rc == -1) {
            snprintf(why, wn, "%s is out of range for %s", shown(s, sb, sizeof sb),
                     f->type == PROTOBUF_C_TYPE_FLOAT ? "float" : "double");
            return -1;
        }
        if (rc == 0) {
            if (f->type == PROTOBUF_C_TYPE_FLOAT)
                *(float *)slot = (float)d;
            else
                *(double *)slot = d;
        }
        break;
    case PROTOBUF_C_TYPE_BOOL:
        if (!strcasecmp(s, "true") || !strcasecmp(s, "yes"))
            *(protobuf_c_boolean *)slot = 1;
        else if (!strcasecmp(s, "false") || !strcasecmp(s, "no"))
            *(protobuf_c_boolean *)slot = 0;
        else
            rc = -2;
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v;
        if (parse_enum(f->descriptor, s, &v) == 0) {
            *(int *)slot = v;
        } else {
            char choices[400];
            enum_choices(f->descriptor, choices, sizeof choices);
            snprintf(why, wn, "unknown value '%s' (expected one of: %s)", shown(s, sb, sizeof sb),
                     choices);
            return -1;
        }
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *copy = malloc(len + 1);
        if (!copy)
            return -3;
        memcpy(copy, s, len + 1);
        *(char **)slot = copy;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES:
        rc = parse_b64(s, len, (ProtobufCBinaryData *)slot);
        if (rc == -3)
            return -3;
        break;
    case PROTOBUF_C_TYPE_MESSAGE:
        snprintf(why, wn, "expected a mapping, got a scalar");
        return -1;
    }
    if (rc == -2) {
        snprintf(why, wn, "expected %s, got '%s'", type_noun(f->type), shown(s, sb, sizeof sb));
        return -1;
    }
    return 0;
}

// ---- descriptor helpers ------------------------------------------------------------------------

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return 4;
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 8;
}

static int is_oneof(const ProtobufCFieldDescriptor *f)
{
    return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

/* The member of a oneof-of-scalars message, or a one-scalar-field message, that a plain scalar
 * may stand for: returns how many candidate fields there are (0 = no shorthand). */
static unsigned scalar_shorthand(const ProtobufCMessageDescriptor *d)
{
    if (d->n_fields == 0)
        return 0;
    if (d->n_fields == 1) {
        const ProtobufCFieldDescriptor *f = &d->fields[0];
        return (f->label != PROTOBUF_C_LABEL_REPEATED && f->type != PROTOBUF_C_TYPE_MESSAGE) ? 1
                                                                                             : 0;
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!is_oneof(f) || f->type == PROTOBUF_C_TYPE_MESSAGE ||
            f->quantifier_offset != d->fields[0].quantifier_offset)
            return 0;
    }
    return d->n_fields;
}

static void mark_present(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    if (is_oneof(f))
        *(uint32_t *)((char *)msg + f->quantifier_offset) = f->id;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
             f->type != PROTOBUF_C_TYPE_MESSAGE)
        *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = 1;
}

static void oneof_members(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                          char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *g = &d->fields[i];
        if (!is_oneof(g) || g->quantifier_offset != f->quantifier_offset)
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", g->name);
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
}

static pcs_status_t new_message(const ProtobufCMessageDescriptor *d, ProtobufCMessage **out)
{
    void *p;
    PCS_CHECK(pcs_calloc(1, d->sizeof_message, &p));
    d->message_init((ProtobufCMessage *)p);
    *out = p;
    return PCS_OK;
}

// ---- recursive descent --------------------------------------------------------------------------

static pcs_status_t parse_message(yctx_t *c, const ProtobufCMessageDescriptor *d,
                                  ProtobufCMessage *msg);

static pcs_status_t depth_enter(yctx_t *c)
{
    if (++c->depth > PB_MAX_DEPTH)
        return yfail(c, "nesting deeper than %d levels", PB_MAX_DEPTH);
    return PCS_OK;
}

/* Scalar event -> one scalar slot, with the error naming the current path. */
static pcs_status_t scalar_into(yctx_t *c, const ProtobufCFieldDescriptor *f, void *slot)
{
    if (c->ev.type != YAML_SCALAR_EVENT)
        return yfail(c, "expected %s, got %s", type_noun(f->type), event_kind(&c->ev));
    char why[512];
    int rc = conv_scalar(f, (const char *)c->ev.data.scalar.value, c->ev.data.scalar.length, slot,
                         why, sizeof why);
    if (rc == -3)
        return pcs_set_error(PCS_ERR_NOMEM, "out of memory parsing %s", c->path);
    if (rc)
        return yfail(c, "%s", why);
    return PCS_OK;
}

static pcs_status_t parse_repeated(yctx_t *c, ProtobufCMessage *msg,
                                   const ProtobufCFieldDescriptor *f)
{
    size_t *n = (size_t *)((char *)msg + f->quantifier_offset);
    void **arr = (void **)((char *)msg + f->offset);
    size_t esz = elem_size(f->type), cap = 0;
    PCS_CHECK(depth_enter(c));
    for (;;) {
        PCS_CHECK(next_event(c));
        if (c->ev.type == YAML_SEQUENCE_END_EVENT)
            break;
        size_t old = path_push_index(c, *n);
        if (c->ev.type == YAML_ALIAS_EVENT)
            return yfail(c, "YAML aliases are not supported");
        if (*n == cap) {
            size_t ncap = cap ? cap * 2 : 4;
            void *p = realloc(*arr, ncap * esz);
            if (!p)
                return pcs_set_error(PCS_ERR_NOMEM, "out of memory parsing %s", c->path);
            *arr = p;
            cap = ncap;
        }
        char *slot = (char *)*arr + *n * esz;
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (c->ev.type == YAML_SCALAR_EVENT && is_null_scalar(&c->ev))
                return yfail(c, "null is not allowed in a sequence");
            ProtobufCMessage *sub;
            PCS_CHECK(new_message(f->descriptor, &sub));
            *(ProtobufCMessage **)slot = sub;
            (*n)++; /* attached first, so that an error below frees it with the root */
            PCS_CHECK(parse_message(c, f->descriptor, sub));
        } else {
            if (c->ev.type == YAML_SCALAR_EVENT && is_null_scalar(&c->ev))
                return yfail(c, "null is not allowed in a sequence");
            memset(slot, 0, esz);
            PCS_CHECK(scalar_into(c, f, slot));
            (*n)++;
        }
        path_pop(c, old);
    }
    if (*n == 0) {
        free(*arr);
        *arr = NULL;
    }
    c->depth--;
    return PCS_OK;
}

static pcs_status_t parse_field(yctx_t *c, const ProtobufCMessageDescriptor *d,
                                ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    if (c->ev.type == YAML_ALIAS_EVENT)
        return yfail(c, "YAML aliases are not supported");
    if (c->ev.type == YAML_SCALAR_EVENT) {
        const char *s = (const char *)c->ev.data.scalar.value;
        int text = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES;
        /* `default` (and null) leave the field unset; a quoted "default" is a real string. */
        if (is_null_scalar(&c->ev) ||
            (!strcmp(s, "default") &&
             (is_plain(&c->ev) || !text || f->label == PROTOBUF_C_LABEL_REPEATED)))
            return PCS_OK;
    }
    if (is_oneof(f)) {
        uint32_t cur = *(uint32_t *)((char *)msg + f->quantifier_offset);
        if (cur != 0 && cur != f->id) {
            char members[256];
            oneof_members(d, f, members, sizeof members);
            const ProtobufCFieldDescriptor *g = protobuf_c_message_descriptor_get_field(d, cur);
            return yfail(c, "only one of %s may be set (%s is already set)", members,
                         g ? g->name : "another");
        }
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        if (c->ev.type != YAML_SEQUENCE_START_EVENT)
            return yfail(c, "expected a sequence, got %s", event_kind(&c->ev));
        return parse_repeated(c, msg, f);
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        ProtobufCMessage *sub;
        PCS_CHECK(new_message(f->descriptor, &sub));
        *(ProtobufCMessage **)((char *)msg + f->offset) = sub;
        mark_present(msg, f);
        return parse_message(c, f->descriptor, sub);
    }
    PCS_CHECK(scalar_into(c, f, (char *)msg + f->offset));
    mark_present(msg, f);
    return PCS_OK;
}

static pcs_status_t parse_mapping(yctx_t *c, const ProtobufCMessageDescriptor *d,
                                  ProtobufCMessage *msg)
{
    uint8_t seen_small[64];
    uint8_t *seen = seen_small;
    pcs_status_t rc = PCS_OK;
    if (d->n_fields > sizeof seen_small) {
        void *p;
        PCS_CHECK(pcs_calloc(d->n_fields, 1, &p));
        seen = p;
    } else {
        memset(seen_small, 0, sizeof seen_small);
    }
    PCS_CHECK_GOTO(depth_enter(c), rc, out);
    for (;;) {
        PCS_CHECK_GOTO(next_event(c), rc, out);
        if (c->ev.type == YAML_MAPPING_END_EVENT)
            break;
        if (c->ev.type != YAML_SCALAR_EVENT) {
            rc = yfail(c, "mapping keys must be plain names, got %s", event_kind(&c->ev));
            goto out;
        }
        const char *key = (const char *)c->ev.data.scalar.value;
        const ProtobufCFieldDescriptor *f = NULL;
        if (strlen(key) == c->ev.data.scalar.length) {
            f = protobuf_c_message_descriptor_get_field_by_name(d, key);
            if (!f)
                f = field_by_json_name(d, key);
        }
        size_t old = path_push_field(c, key);
        if (!f) {
            char names[400];
            size_t used = 0;
            names[0] = '\0';
            for (unsigned i = 0; i < d->n_fields && used + 1 < sizeof names; i++) {
                int w = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                 d->fields[i].name);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            rc = yfail(c, "unknown field (%s has: %s)", d->short_name, names);
            goto out;
        }
        size_t idx = (size_t)(f - d->fields);
        if (seen[idx]) {
            rc = yfail(c, "duplicate key");
            goto out;
        }
        seen[idx] = 1;
        PCS_CHECK_GOTO(next_event(c), rc, out);
        PCS_CHECK_GOTO(parse_field(c, d, msg, f), rc, out);
        path_pop(c, old);
    }
    c->depth--;
out:
    if (seen != seen_small)
        free(seen);
    return rc;
}

static pcs_status_t parse_message(yctx_t *c, const ProtobufCMessageDescriptor *d,
                                  ProtobufCMessage *msg)
{
    switch (c->ev.type) {
    case YAML_MAPPING_START_EVENT:
        return parse_mapping(c, d, msg);
    case YAML_SCALAR_EVENT: {
        unsigned n = scalar_shorthand(d);
        if (n == 0)
            return yfail(c, "expected a mapping, got a scalar");
        char why[512] = "";
        for (unsigned i = 0; i < n; i++) {
            const ProtobufCFieldDescriptor *f = &d->fields[i];
            char tmp[sizeof(ProtobufCBinaryData) + sizeof(double)];
            memset(tmp, 0, sizeof tmp);
            int rc = conv_scalar(f, (const char *)c->ev.data.scalar.value, c->ev.data.scalar.length,
                                 tmp, why, sizeof why);
            if (rc == -3)
                return pcs_set_error(PCS_ERR_NOMEM, "out of memory parsing %s", c->path);
            if (rc == 0) {
                memcpy((char *)msg + f->offset, tmp, elem_size(f->type));
                mark_present(msg, f);
                return PCS_OK;
            }
        }
        if (n == 1)
            return yfail(c, "%s", why);
        char sb[48], members[256];
        oneof_members(d, &d->fields[0], members, sizeof members);
        return yfail(c, "'%s' fits none of %s",
                     shown((const char *)c->ev.data.scalar.value, sb, sizeof sb), members);
    }
    case YAML_SEQUENCE_START_EVENT:
        if (d->n_fields == 1 && d->fields[0].label == PROTOBUF_C_LABEL_REPEATED)
            return parse_repeated(c, msg, &d->fields[0]);
        return yfail(c, "expected a mapping, got a sequence");
    case YAML_ALIAS_EVENT:
        return yfail(c, "YAML aliases are not supported");
    default:
        return yfail(c, "expected a mapping, got %s", event_kind(&c->ev));
    }
}

// ---- entry points -------------------------------------------------------------------------------

pcs_status_t pcs_pb_from_yaml(const char *text, size_t len, const ProtobufCMessageDescriptor *d,
                              ProtobufCMessage **out)
{
    if (!out || !d || (!text && len))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_pb_from_yaml: NULL argument");
    *out = NULL;
    if (len > PB_MAX_DOC_BYTES)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "document of %zu bytes exceeds the limit of %u",
                             len, PB_MAX_DOC_BYTES);
    yctx_t *c;
    pcs_status_t rc;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    ProtobufCMessage *msg = NULL;
    if (!yaml_parser_initialize(&c->parser)) {
        free(c);
        return pcs_set_error(PCS_ERR_NOMEM, "cannot initialise the YAML parser");
    }
    yaml_parser_set_input_string(&c->parser, (const unsigned char *)(text ? text : ""), len);

    PCS_CHECK_GOTO(next_event(c), rc, fail); /* STREAM_START */
    PCS_CHECK_GOTO(next_event(c), rc, fail);
    if (c->ev.type != YAML_DOCUMENT_START_EVENT) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG, "line 1: document is empty");
        goto fail;
    }
    PCS_CHECK_GOTO(next_event(c), rc, fail);
    if (c->ev.type == YAML_SCALAR_EVENT && is_null_scalar(&c->ev)) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG, "line %zu: document is empty", ev_line(c));
        goto fail;
    }
    PCS_CHECK_GOTO(new_message(d, &msg), rc, fail);
    PCS_CHECK_GOTO(parse_message(c, d, msg), rc, fail);
    PCS_CHECK_GOTO(next_event(c), rc, fail); /* DOCUMENT_END */
    PCS_CHECK_GOTO(next_event(c), rc, fail);
    if (c->ev.type != YAML_STREAM_END_EVENT) {
        rc = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "line %zu: more than one YAML document (one job per file)", ev_line(c));
        goto fail;
    }
    *out = msg;
    msg = NULL;
    rc = PCS_OK;
fail:
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    if (c->has_ev)
        yaml_event_delete(&c->ev);
    yaml_parser_delete(&c->parser);
    free(c);
    return rc;
}

pcs_status_t pcs_pb_from_yaml_file(const char *path, const ProtobufCMessageDescriptor *d,
                                   ProtobufCMessage **out)
{
    if (!path || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_pb_from_yaml_file: NULL argument");
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    pcs_status_t rc = PCS_OK;
    for (;;) {
        if (len == cap) {
            if (cap > PB_MAX_DOC_BYTES) {
                rc = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: larger than the limit of %u bytes",
                                   path, PB_MAX_DOC_BYTES);
                goto out;
            }
            size_t ncap = cap ? cap * 2 : 8192;
            char *p = realloc(buf, ncap);
            if (!p) {
                rc = pcs_set_error(PCS_ERR_NOMEM, "%s: out of memory", path);
                goto out;
            }
            buf = p;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) {
            if (ferror(fp)) {
                rc =
                    pcs_set_error(PCS_ERR_INVALID_ARG, "%s: read error: %s", path, strerror(errno));
                goto out;
            }
            break;
        }
    }
    rc = pcs_pb_from_yaml(buf, len, d, out);
    if (rc != PCS_OK) {
        pcs_set_error(rc, "%s: %s", path, pcs_last_error());
    }
out:
    free(buf);
    fclose(fp);
    return rc;
}
