/* protobuf-c message -> JSON through descriptors (pcs/pbtext.h), for pcsctl --json and tests.
 * The output is valid input for pb_yaml.c (JSON is YAML), so YAML -> message -> JSON -> message
 * gives the same packed bytes: presence follows protobuf-c's own packing rules, wrappers (OptX)
 * and oneofs of scalars print as plain scalars, doubles print with the fewest digits that round
 * trip, and non-finite numbers print as the strings "inf", "-inf", "nan". */
#include "pcs/pbtext.h"
#include "pcs/utf8.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PB_JSON_MAX_DEPTH 64

typedef struct sbuf {
    char *b;
    size_t n, cap;
    int oom;
    int canonical; /* proto3's JSON mapping (pcs_pb_to_json_canonical) */
} sbuf_t;

static void sb_put(sbuf_t *s, const char *p, size_t n)
{
    if (s->oom)
        return;
    if (s->n + n + 1 > s->cap) {
        size_t ncap = s->cap ? s->cap : 256;
        while (s->n + n + 1 > ncap)
            ncap *= 2;
        char *q = realloc(s->b, ncap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->b = q;
        s->cap = ncap;
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = '\0';
}

static void sb_str(sbuf_t *s, const char *p)
{
    sb_put(s, p, strlen(p));
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf_t *s, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_newline(sbuf_t *s, int indent, int level)
{
    if (indent <= 0)
        return;
    sb_put(s, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        sb_put(s, " ", 1);
}

/* JSON string; bytes that are not valid UTF-8 become U+FFFD so the output is always valid. */
static void sb_json_string(sbuf_t *s, const char *str)
{
    const unsigned char *p = (const unsigned char *)(str ? str : "");
    size_t len = strlen((const char *)p);
    sb_put(s, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(s, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            switch (c) {
            case '\n':
                sb_str(s, "\\n");
                break;
            case '\t':
                sb_str(s, "\\t");
                break;
            case '\r':
                sb_str(s, "\\r");
                break;
            default:
                sb_printf(s, "\\u%04x", c);
            }
            i++;
        } else {
            size_t n = pcs_utf8_seq((const char *)p + i, len - i);
            uint32_t cp = 0;
            if (n == 2)
                cp = ((uint32_t)(p[i] & 0x1f) << 6) | (p[i + 1] & 0x3f);
            else if (n == 3)
                cp = ((uint32_t)(p[i] & 0x0f) << 12) | ((uint32_t)(p[i + 1] & 0x3f) << 6) |
                     (p[i + 2] & 0x3f);
            if (n == 0) {
                sb_str(s, "\\ufffd");
                i++;
            } else if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff ||
                       cp == 0xfffe || cp == 0xffff) {
                /* Valid JSON raw, but YAML readers fold line breaks (NEL, LS, PS) and refuse
                 * the others: escaped, the output stays loadable by pb_yaml.c. */
                sb_printf(s, "\\u%04x", (unsigned)cp);
                i += n;
            } else {
                sb_put(s, (const char *)p + i, n);
                i += n;
            }
        }
    }
    sb_put(s, "\"", 1);
}

static void sb_double(sbuf_t *s, double v, int is_float)
{
    if (isnan(v)) {
        sb_str(s, s->canonical ? "\"NaN\"" : "\"nan\"");
        return;
    }
    if (isinf(v)) {
        if (s->canonical)
            sb_str(s, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        else
            sb_str(s, v > 0 ? "\"inf\"" : "\"-inf\"");
        return;
    }
    char buf[40];
    int maxp = is_float ? 9 : 17;
    for (int prec = 1; prec <= maxp; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)v : back == v)
            break;
    }
    sb_str(s, buf);
}

static void sb_base64(sbuf_t *s, const ProtobufCBinaryData *b)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    sb_put(s, "\"", 1);
    for (size_t i = 0; i < b->len; i += 3) {
        uint32_t v = (uint32_t)b->data[i] << 16;
        if (i + 1 < b->len)
            v |= (uint32_t)b->data[i + 1] << 8;
        if (i + 2 < b->len)
            v |= b->data[i + 2];
        char out[4] = {tbl[(v >> 18) & 63], tbl[(v >> 12) & 63],
                       i + 1 < b->len ? tbl[(v >> 6) & 63] : '=',
                       i + 2 < b->len ? tbl[v & 63] : '='};
        sb_put(s, out, 4);
    }
    sb_put(s, "\"", 1);
}

// ---- presence (mirrors protobuf-c's packing rules, so round trips are byte-exact) -------------

static int is_oneof(const ProtobufCFieldDescriptor *f)
{
    return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

static int zeroish(const ProtobufCFieldDescriptor *f, const void *m)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        return *(const protobuf_c_boolean *)m == 0;
    case PROTOBUF_C_TYPE_ENUM:
        return *(const int *)m == 0;
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const uint32_t *)m == 0; /* bits: -0.0 is packed */
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const uint64_t *)m == 0;
    case PROTOBUF_C_TYPE_STRING:
        return *(const char *const *)m == NULL || **(const char *const *)m == '\0';
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)m)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(const void *const *)m == NULL;
    }
    return 1;
}

static int field_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    const char *base = (const char *)msg;
    if (f->label == PROTOBUF_C_LABEL_REPEATED)
        return *(const size_t *)(base + f->quantifier_offset) > 0;
    if (is_oneof(f))
        return *(const uint32_t *)(base + f->quantifier_offset) == f->id &&
               (f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING
                    ? 1
                    : *(const void *const *)(base + f->offset) != NULL);
    if (f->label == PROTOBUF_C_LABEL_REQUIRED)
        return 1;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
        if (f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING)
            return *(const void *const *)(base + f->offset) != NULL &&
                   (f->type == PROTOBUF_C_TYPE_MESSAGE ||
                    *(const char *const *)(base + f->offset) != f->default_value);
        return *(const protobuf_c_boolean *)(base + f->quantifier_offset) != 0;
    }
    return !zeroish(f, base + f->offset);
}

// ---- rendering ----------------------------------------------------------------------------------

static int emit_message(sbuf_t *s, const ProtobufCMessage *m, int indent, int level, int top);

static int emit_scalar(sbuf_t *s, const ProtobufCFieldDescriptor *f, const void *p, int indent,
                       int level)
{
    char ebuf[64];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        sb_printf(s, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        sb_printf(s, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: /* canonical: a string, as JavaScript's numbers are doubles */
        sb_printf(s, s->canonical ? "\"%" PRId64 "\"" : "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        sb_printf(s, s->canonical ? "\"%" PRIu64 "\"" : "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        sb_double(s, *(const float *)p, 1);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        sb_double(s, *(const double *)p, 0);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        sb_str(s, *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        if (ev && s->canonical)
            sb_json_string(s, ev->name); /* the value's name in the .proto: DTYPE_BF16 */
        else if (ev)
            sb_json_string(s, pcs_pb_enum_short(f->descriptor, v, ebuf, sizeof ebuf));
        else
            sb_printf(s, "%d", v); /* a value this build does not know: keep the number */
        break;
    }
    case PROTOBUF_C_TYPE_STRING:
        sb_json_string(s, *(const char *const *)p);
        break;
    case PROTOBUF_C_TYPE_BYTES:
        sb_base64(s, (const ProtobufCBinaryData *)p);
        break;
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)p;
        if (!sub) {
            sb_str(s, "{}");
            return 0;
        }
        return emit_message(s, sub, indent, level, 0);
    }
    }
    return 0;
}

/* A nested message that YAML may write as one scalar: a one-field wrapper (OptDouble) or a oneof
 * of scalars (ReshardAfterForward). Returns the field to print, or NULL. */
static const ProtobufCFieldDescriptor *as_scalar(const ProtobufCMessage *m, int *empty)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    *empty = 0;
    if (d->n_fields == 1) {
        const ProtobufCFieldDescriptor *f = &d->fields[0];
        if (f->label == PROTOBUF_C_LABEL_NONE && !is_oneof(f) && f->type != PROTOBUF_C_TYPE_MESSAGE)
            return f;
        return NULL;
    }
    if (d->n_fields == 0)
        return NULL;
    const ProtobufCFieldDescriptor *hit = NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!is_oneof(f) || f->type == PROTOBUF_C_TYPE_MESSAGE ||
            f->quantifier_offset != d->fields[0].quantifier_offset)
            return NULL;
        if (field_present(m, f))
            hit = f;
    }
    *empty = hit == NULL;
    return hit;
}

static int emit_message(sbuf_t *s, const ProtobufCMessage *m, int indent, int level, int top)
{
    if (level > PB_JSON_MAX_DEPTH)
        return -1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    if (!top && !s->canonical) { /* canonical JSON keeps every message an object */
        int empty;
        const ProtobufCFieldDescriptor *f = as_scalar(m, &empty);
        if (f)
            return emit_scalar(s, f, base + f->offset, indent, level);
        if (empty) {
            sb_str(s, "{}");
            return 0;
        }
    }
    int any = 0;
    sb_put(s, "{", 1);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!field_present(m, f))
            continue;
        if (any)
            sb_put(s, ",", 1);
        any = 1;
        sb_newline(s, indent, level + 1);
        if (s->canonical) {
            /* the field's JSON name: lowerCamelCase of the .proto name (protoc's json_name) */
            char jn[128];
            size_t o = 0;
            int up = 0;
            for (const char *c = f->name; *c && o + 1 < sizeof jn; c++) {
                if (*c == '_') {
                    up = 1;
                    continue;
                }
                jn[o++] = up && *c >= 'a' && *c <= 'z' ? (char)(*c - 'a' + 'A') : *c;
                up = 0;
            }
            jn[o] = '\0';
            sb_json_string(s, jn);
        } else {
            sb_json_string(s, f->name);
        }
        sb_str(s, indent > 0 ? ": " : ":");
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(const char *const *)(base + f->offset);
            size_t esz;
            switch (f->type) {
            case PROTOBUF_C_TYPE_INT64:
            case PROTOBUF_C_TYPE_SINT64:
            case PROTOBUF_C_TYPE_SFIXED64:
            case PROTOBUF_C_TYPE_UINT64:
            case PROTOBUF_C_TYPE_FIXED64:
            case PROTOBUF_C_TYPE_DOUBLE:
                esz = 8;
                break;
            case PROTOBUF_C_TYPE_STRING:
            case PROTOBUF_C_TYPE_MESSAGE:
                esz = sizeof(void *);
                break;
            case PROTOBUF_C_TYPE_BYTES:
                esz = sizeof(ProtobufCBinaryData);
                break;
            case PROTOBUF_C_TYPE_BOOL:
                esz = sizeof(protobuf_c_boolean);
                break;
            default:
                esz = 4;
            }
            /* Scalars stay on one line: shapes and dims read better as [1024, 256]. */
            int multiline = f->type == PROTOBUF_C_TYPE_MESSAGE;
            sb_put(s, "[", 1);
            for (size_t k = 0; k < n; k++) {
                if (k)
                    sb_str(s, multiline || indent <= 0 ? "," : ", ");
                if (multiline)
                    sb_newline(s, indent, level + 2);
                if (emit_scalar(s, f, arr + k * esz, indent, level + 2))
                    return -1;
            }
            if (multiline)
                sb_newline(s, indent, level + 1);
            sb_put(s, "]", 1);
        } else if (emit_scalar(s, f, base + f->offset, indent, level + 1)) {
            return -1;
        }
    }
    if (any)
        sb_newline(s, indent, level);
    sb_put(s, "}", 1);
    return 0;
}

static pcs_status_t to_json(const ProtobufCMessage *m, int indent, int canonical, char **out)
{
    if (!m || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pcs_pb_to_json: NULL argument");
    *out = NULL;
    if (indent > 16)
        indent = 16;
    sbuf_t s = {0};
    s.canonical = canonical;
    int rc = emit_message(&s, m, indent, 0, 1);
    if (rc) {
        free(s.b);
        return pcs_set_error(PCS_ERR_LIMIT, "message nested deeper than %d levels",
                             PB_JSON_MAX_DEPTH);
    }
    if (s.oom) {
        free(s.b);
        return pcs_set_error(PCS_ERR_NOMEM, "out of memory rendering JSON");
    }
    *out = s.b;
    return PCS_OK;
}

pcs_status_t pcs_pb_to_json(const ProtobufCMessage *m, int indent, char **out)
{
    return to_json(m, indent, 0, out);
}

pcs_status_t pcs_pb_to_json_canonical(const ProtobufCMessage *m, int indent, char **out)
{
    return to_json(m, indent, 1, out);
}
