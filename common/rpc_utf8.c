/* UTF-8 check of every string field of a decoded protobuf-c message, walked through its
 * descriptor (sub-messages, repeated fields, oneofs, map entries). protobuf-c accepts any bytes
 * in a proto3 `string`; the coordinator would store them and echo them to other clients, whose
 * protobuf libraries (Python, Go, C++) then refuse the whole reply. The RPC server runs this on
 * every request before its handler, so handlers only ever see valid UTF-8. */
#include <stdio.h>
#include <string.h>

#include "pcs/rpc.h"
#include "pcs/utf8.h"

#define MAX_DEPTH 100 /* the decoder already refuses deeper nesting (has_field_zero) */

typedef struct path_buf {
    char s[256];
    size_t len;
} path_buf_t;

static size_t path_push(path_buf_t *p, const char *name, long index)
{
    size_t old = p->len;
    int n;
    if (index >= 0)
        n = snprintf(p->s + p->len, sizeof p->s - p->len, "%s%s[%ld]", p->len ? "." : "", name,
                     index);
    else
        n = snprintf(p->s + p->len, sizeof p->s - p->len, "%s%s", p->len ? "." : "", name);
    if (n > 0)
        p->len += (size_t)n < sizeof p->s - p->len ? (size_t)n : sizeof p->s - 1 - p->len;
    return old;
}

static void path_pop(path_buf_t *p, size_t old)
{
    p->len = old;
    p->s[old] = '\0';
}

static pcs_status_t check_string(path_buf_t *p, const char *name, long index, const char *v)
{
    if (!v)
        return PCS_OK;
    size_t len = strlen(v); /* protobuf-c NUL-terminates; an embedded NUL ends the C string */
    size_t bad = pcs_utf8_check(v, len);
    if (bad == len)
        return PCS_OK;
    size_t old = path_push(p, name, index);
    pcs_status_t st =
        pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not valid UTF-8 at byte %zu", p->s, bad);
    path_pop(p, old);
    return st;
}

static pcs_status_t walk(const ProtobufCMessage *m, path_buf_t *p, int depth)
{
    if (depth > MAX_DEPTH)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: nested more than %d deep",
                             p->len ? p->s : "request", MAX_DEPTH);
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type != PROTOBUF_C_TYPE_STRING && fd->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
            continue; /* another member of the oneof is set: this slot holds its value */
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            const void *arr = *(const void *const *)(base + fd->offset);
            for (size_t k = 0; k < n && arr; k++) {
                if (fd->type == PROTOBUF_C_TYPE_STRING) {
                    PCS_CHECK(check_string(p, fd->name, (long)k, ((char *const *)arr)[k]));
                } else {
                    const ProtobufCMessage *sub = ((ProtobufCMessage *const *)arr)[k];
                    if (!sub)
                        continue;
                    size_t old = path_push(p, fd->name, (long)k);
                    pcs_status_t st = walk(sub, p, depth + 1);
                    path_pop(p, old);
                    if (st != PCS_OK)
                        return st;
                }
            }
            continue;
        }
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            PCS_CHECK(check_string(p, fd->name, -1, *(char *const *)(base + fd->offset)));
            continue;
        }
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + fd->offset);
        if (!sub)
            continue;
        size_t old = path_push(p, fd->name, -1);
        pcs_status_t st = walk(sub, p, depth + 1);
        path_pop(p, old);
        if (st != PCS_OK)
            return st;
    }
    return PCS_OK;
}

pcs_status_t pcs_pb_check_utf8(const ProtobufCMessage *m)
{
    if (!m || !m->descriptor || m->descriptor->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "utf8 check: not a protobuf-c message");
    path_buf_t p = {.s = "", .len = 0};
    return walk(m, &p, 0);
}
