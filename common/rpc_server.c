/* gRPC server glue (STYLE.md B7, DESIGN.md §2): one completion queue and one thread own every
 * call. Methods come from a table; each call is a small state machine (RECV -> HANDLE -> SEND ->
 * DONE) driven by tags whose on_done the loop calls. Handlers answer at once or keep the call
 * and answer later (deferred replies, server streams); RECV_CLOSE_ON_SERVER tells us when a
 * client went away so on_cancel can run. Not thread-safe: everything but stop() runs on the
 * loop thread. */
#include "rpc_internal.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/utf8.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

#define GENERIC_PATH "*" /* stats row of calls to unknown methods */
/* Requests kept armed per method. One (re-armed before the handler runs) is what the loop needs:
 * gRPC queues further incoming calls until the next request; more did not help on 2 cores. */
#define ARMED_PER_METHOD 1

typedef enum {
    CALL_RECV,   /* armed: waiting for a request */
    CALL_HANDLE, /* request delivered; the handler has it (or keeps it for later) */
    CALL_SEND,   /* the handler ended the call; final message/status being sent */
    CALL_DONE    /* the call is closed on the wire */
} call_state_t;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
} out_msg_t;

struct pcs_rpc_call {
    pcs_rpc_tag_t recv_tag;  /* the requested call arrived */
    pcs_rpc_tag_t send_tag;  /* the in-flight send batch finished */
    pcs_rpc_tag_t close_tag; /* RECV_CLOSE_ON_SERVER finished: the call is over on the wire */
    pcs_rpc_server_t *srv;
    struct pcs_rpc_call *prev, *next; /* every live call object, for teardown */
    int method;                       /* index into srv->methods; -1: unknown-method catcher */
    call_state_t state;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *req_bb;
    grpc_call_details details; /* unknown-method catcher only */
    int close_cancelled;       /* out-param of RECV_CLOSE_ON_SERVER */
    int refs;                  /* batches in flight (send, close) */
    bool send_in_flight, md_sent, status_queued, status_in_batch, status_sent, send_failed;
    bool ended;           /* the handler finished the call (reply/fail/finish) */
    bool closed;          /* close_tag seen */
    bool cancel_notified; /* on_cancel ran */
    bool ungated;         /* its output never waits for the gate (pcs_rpc_call_set_ungated) */
    bool held;            /* output waiting for the gate to open */
    out_msg_t *q_head, *q_tail;
    grpc_byte_buffer *sending; /* message of the in-flight batch */
    grpc_status_code code;
    grpc_slice status_details;
    grpc_metadata trailer; /* grpc-status-details-bin of an INVALID_ARGUMENT (field named) */
    bool has_trailer;
    void (*on_cancel)(pcs_rpc_call_t *call, void *arg);
    void *cancel_arg;
    uint64_t start_us;
    char *peer; /* gpr_malloc'd, lazily */
    uint64_t principal; /* set by the authorize hook for the handler (pcs_rpc_call_principal) */
};

typedef struct method_slot {
    const pcs_rpc_method_t *m;
    void *handle; /* from grpc_server_register_method */
} method_slot_t;

struct pcs_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    method_slot_t *methods;
    size_t n_methods;
    pcs_rpc_method_stats_t *stats; /* n_methods + 1 rows, the last for unknown methods */
    void *user;
    size_t max_message_bytes;
    int tick_ms;
    void (*tick)(void *user, uint64_t now_ms);
    pcs_status_t (*authorize)(void *user, const pcs_rpc_method_t *m, pcs_rpc_call_t *call);
    int port;
    volatile sig_atomic_t stop;
    bool started, shutting_down, shutdown_seen, cq_shut, torn_down;
    pcs_rpc_tag_t shutdown_tag;
    pcs_rpc_call_t *live; /* every call object (armed, active, zombie) */
    bool gate_closed;     /* gated calls' output waits (pcs_rpc_server_gate_close) */
    bool tick_soon;       /* run tick once the ready events are handled */
};

static const double lat_bounds_s[PCS_RPC_LAT_BUCKETS - 1] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
    50e-3, 100e-3, 250e-3, 1.0,    5.0,  30.0,   120.0, 300.0, 600.0,
};

const double *pcs_rpc_latency_bounds_s(void)
{
    return lat_bounds_s;
}

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

static void recv_done(pcs_rpc_tag_t *tag, bool ok);
static void send_done(pcs_rpc_tag_t *tag, bool ok);
static void close_done(pcs_rpc_tag_t *tag, bool ok);
static void flush(pcs_rpc_call_t *c);

// ---- call objects ----

static void call_link(pcs_rpc_server_t *s, pcs_rpc_call_t *c)
{
    c->next = s->live;
    if (s->live)
        s->live->prev = c;
    s->live = c;
}

static void drop_queue(pcs_rpc_call_t *c)
{
    while (c->q_head) {
        out_msg_t *o = c->q_head;
        c->q_head = o->next;
        grpc_byte_buffer_destroy(o->bb);
        free(o);
    }
    c->q_tail = NULL;
}

static void call_free(pcs_rpc_call_t *c)
{
    pcs_rpc_server_t *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->live = c->next;
    if (c->next)
        c->next->prev = c->prev;
    drop_queue(c);
    if (c->sending)
        grpc_byte_buffer_destroy(c->sending);
    if (c->req_bb)
        grpc_byte_buffer_destroy(c->req_bb);
    grpc_metadata_array_destroy(&c->md);
    if (c->method < 0)
        grpc_call_details_destroy(&c->details);
    grpc_slice_unref(c->status_details);
    if (c->has_trailer) {
        grpc_slice_unref(c->trailer.key);
        grpc_slice_unref(c->trailer.value);
    }
    if (c->peer)
        gpr_free(c->peer);
    if (c->call)
        grpc_call_unref(c->call);
    free(c);
}

/* Free the call once nobody can reach it: no batch in flight, closed on the wire, and either the
 * handler ended it or on_cancel told the handler it is gone. */
static void maybe_free(pcs_rpc_call_t *c)
{
    if (c->refs == 0 && c->closed && (c->ended || c->cancel_notified))
        call_free(c);
}

/* Keep one outstanding request per method (and one for unknown methods). */
static pcs_status_t arm(pcs_rpc_server_t *s, int method)
{
    pcs_rpc_call_t *c;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    c->srv = s;
    c->method = method;
    c->state = CALL_RECV;
    c->recv_tag.on_done = recv_done;
    c->send_tag.on_done = send_done;
    c->close_tag.on_done = close_done;
    c->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (method >= 0) {
        e = grpc_server_request_registered_call(s->server, s->methods[method].handle, &c->call,
                                                &c->deadline, &c->md, &c->req_bb, s->cq, s->cq,
                                                &c->recv_tag);
    } else {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->recv_tag);
    }
    if (e != GRPC_CALL_OK) {
        grpc_metadata_array_destroy(&c->md);
        if (method < 0)
            grpc_call_details_destroy(&c->details);
        free(c);
        PCS_WARN(PCS_SUB_RPC, "cannot request a call for %s (grpc_call_error %d)",
                 method >= 0 ? s->methods[method].m->path : GENERIC_PATH, (int)e);
        return PCS_ERR_INTERNAL;
    }
    call_link(s, c);
    return PCS_OK;
}

static pcs_rpc_method_stats_t *stats_row(pcs_rpc_call_t *c)
{
    return &c->srv->stats[c->method >= 0 ? (size_t)c->method : c->srv->n_methods];
}

static void record_stats(pcs_rpc_call_t *c)
{
    pcs_rpc_method_stats_t *row = stats_row(c);
    /* RECV_CLOSE_ON_SERVER reports "not cancelled" only once our status went out; its tag can
     * be dequeued before the send batch's, so do not wait for status_sent here. */
    int code = (!c->close_cancelled && c->status_queued) ? (int)c->code : GRPC_STATUS_CANCELLED;
    if (code < 0 || code > 16)
        code = GRPC_STATUS_UNKNOWN;
    row->calls_by_code[code]++;
    double lat = (double)(pcs_now_us() - c->start_us) * 1e-6;
    size_t b = 0;
    while (b < PCS_RPC_LAT_BUCKETS - 1 && lat > lat_bounds_s[b])
        b++;
    row->latency_bucket[b]++;
    row->latency_sum_s += lat;
}

// ---- sending ----

/* Start the next send batch if none is in flight: initial metadata with the first message,
 * one message per batch (gRPC allows one SEND_MESSAGE in flight), and the status with the last
 * queued message. */
static void flush(pcs_rpc_call_t *c)
{
    if (c->send_in_flight || c->closed || c->send_failed || c->status_in_batch || c->status_sent)
        return;
    if (c->srv->gate_closed && !c->ungated) {
        c->held = true; /* pcs_rpc_server_gate_open / _fail send it */
        return;
    }
    if (c->srv->cq_shut) { /* no new work after the queue is shut down */
        c->send_failed = true;
        return;
    }
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    }
    if (c->q_head) {
        out_msg_t *o = c->q_head;
        c->q_head = o->next;
        if (!c->q_head)
            c->q_tail = NULL;
        c->sending = o->bb;
        free(o);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->sending;
    }
    if (c->status_queued && !c->q_head) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = c->code;
        ops[n].data.send_status_from_server.status_details =
            GRPC_SLICE_LENGTH(c->status_details) ? &c->status_details : NULL;
        if (c->has_trailer) {
            ops[n].data.send_status_from_server.trailing_metadata_count = 1;
            ops[n].data.send_status_from_server.trailing_metadata = &c->trailer;
        }
        n++;
        c->status_in_batch = true;
    }
    if (n == 0 || (n == 1 && ops[0].op == GRPC_OP_SEND_INITIAL_METADATA && !c->status_queued))
        return; /* nothing to send yet; metadata goes out with the first message */
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->send_tag, NULL);
    if (e != GRPC_CALL_OK) {
        PCS_WARN(PCS_SUB_RPC, "send batch on %s failed to start (grpc_call_error %d)",
                 c->method >= 0 ? c->srv->methods[c->method].m->path : GENERIC_PATH, (int)e);
        c->send_failed = true;
        c->status_in_batch = false;
        grpc_call_cancel(c->call, NULL); /* makes close_tag complete */
        return;
    }
    c->md_sent = true;
    c->send_in_flight = true;
    c->refs++;
}

static void send_done(pcs_rpc_tag_t *tag, bool ok)
{
    pcs_rpc_call_t *c = container_of(tag, pcs_rpc_call_t, send_tag);
    c->refs--;
    c->send_in_flight = false;
    if (c->sending) {
        grpc_byte_buffer_destroy(c->sending);
        c->sending = NULL;
    }
    if (c->status_in_batch) {
        c->status_in_batch = false;
        c->status_sent = ok;
    }
    if (!ok) {
        c->send_failed = true; /* the client is gone; close_tag reports it */
        drop_queue(c);
    } else {
        flush(c);
    }
    maybe_free(c);
}

static pcs_status_t enqueue(pcs_rpc_call_t *c, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb;
    PCS_CHECK(pcs_rpc_encode(msg, PCS_RPC_CLIENT_MAX_RECEIVE, &bb));
    out_msg_t *o;
    pcs_status_t st = pcs_calloc(1, sizeof *o, (void **)&o);
    if (st != PCS_OK) {
        grpc_byte_buffer_destroy(bb);
        return st;
    }
    o->bb = bb;
    if (c->q_tail)
        c->q_tail->next = o;
    else
        c->q_head = o;
    c->q_tail = o;
    return PCS_OK;
}

/* The field an error message names: pcs's messages put it first, after any context ("invalid
 * job spec: spec.training.micro_batch_size: must be >= 1"), as the first ": "-separated segment
 * made only of field-path characters (proto field names are lower snake_case: a segment with a
 * capital is a type name, "pcs.v1.SubmitJobRequest: malformed protobuf", not a field). Copies
 * the field into `field` and returns the description after it, or NULL when no segment is a
 * path. */
static const char *named_field(const char *msg, char *field, size_t n)
{
    const char *seg = msg;
    while (seg && *seg) {
        const char *end = strstr(seg, ": ");
        if (!end)
            return NULL;
        size_t len = (size_t)(end - seg);
        int path = len > 0 && len < n;
        for (size_t i = 0; i < len && path; i++) {
            char ch = seg[i];
            path = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                   ch == '.' || ch == '[' || ch == ']';
        }
        if (path && !(seg[0] >= '0' && seg[0] <= '9')) {
            memcpy(field, seg, len);
            field[len] = '\0';
            return end + 2;
        }
        seg = end + 2;
    }
    return NULL;
}

/* gRPC's richer error model: an INVALID_ARGUMENT whose message names a field also carries a
 * google.rpc.Status with a google.rpc.BadRequest field violation in the
 * grpc-status-details-bin trailer, which grpc-status libraries (Go status.FromError, Java
 * StatusProto, Python grpc_status) decode. */
static void attach_bad_request(pcs_rpc_call_t *c, const char *msg)
{
    char field[256];
    const char *desc = named_field(msg, field, sizeof field);
    if (!desc)
        return;
    Google__Rpc__BadRequest__FieldViolation fv = GOOGLE__RPC__BAD_REQUEST__FIELD_VIOLATION__INIT;
    Google__Rpc__BadRequest__FieldViolation *fvs[1] = {&fv};
    Google__Rpc__BadRequest br = GOOGLE__RPC__BAD_REQUEST__INIT;
    fv.field = field;
    fv.description = (char *)desc;
    br.n_field_violations = 1;
    br.field_violations = fvs;
    size_t blen = google__rpc__bad_request__get_packed_size(&br);
    uint8_t *bbuf = malloc(blen ? blen : 1);
    if (!bbuf)
        return;
    google__rpc__bad_request__pack(&br, bbuf);
    Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
    Google__Protobuf__Any *anys[1] = {&any};
    any.type_url = (char *)"type.googleapis.com/google.rpc.BadRequest";
    any.value.data = bbuf;
    any.value.len = blen;
    Google__Rpc__Status st = GOOGLE__RPC__STATUS__INIT;
    st.code = GRPC_STATUS_INVALID_ARGUMENT;
    st.message = (char *)msg;
    st.n_details = 1;
    st.details = anys;
    size_t slen = google__rpc__status__get_packed_size(&st);
    grpc_slice v = grpc_slice_malloc(slen);
    google__rpc__status__pack(&st, GRPC_SLICE_START_PTR(v));
    free(bbuf);
    if (c->has_trailer) {
        grpc_slice_unref(c->trailer.key);
        grpc_slice_unref(c->trailer.value);
    }
    memset(&c->trailer, 0, sizeof c->trailer);
    c->trailer.key = grpc_slice_from_static_string("grpc-status-details-bin");
    c->trailer.value = v;
    c->has_trailer = true;
}

static void end_with_status(pcs_rpc_call_t *c, grpc_status_code code, const char *details)
{
    if (code == GRPC_STATUS_INVALID_ARGUMENT && details && *details)
        attach_bad_request(c, details);
    c->ended = true;
    c->state = CALL_SEND;
    c->code = code;
    grpc_slice_unref(c->status_details);
    c->status_details =
        details && *details ? grpc_slice_from_copied_string(details) : grpc_empty_slice();
    c->status_queued = true;
    flush(c);
}

/* The call is already over on the wire and the handler just ended it: nothing to send, free. */
static bool end_if_gone(pcs_rpc_call_t *c)
{
    if (!c->closed)
        return false;
    c->ended = true;
    maybe_free(c);
    return true;
}

// ---- handler-facing API ----

pcs_status_t pcs_rpc_reply(pcs_rpc_call_t *c, const ProtobufCMessage *resp)
{
    if (!c || !resp)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc reply: NULL call or message");
    if (c->ended)
        return pcs_set_error(PCS_ERR_STATE, "rpc reply: call already ended");
    if (end_if_gone(c))
        return pcs_set_error(PCS_ERR_CANCELLED, "rpc reply: the client is gone");
    pcs_status_t st = enqueue(c, resp);
    if (st != PCS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "server cannot encode the reply: %s", pcs_last_error());
        pcs_utf8_trim_partial(msg);
        PCS_WARN(PCS_SUB_RPC, "%s", msg);
        end_with_status(c, (grpc_status_code)pcs_status_to_grpc(st), msg);
        return st;
    }
    end_with_status(c, GRPC_STATUS_OK, NULL);
    return PCS_OK;
}

void pcs_rpc_fail(pcs_rpc_call_t *c, pcs_status_t st, const char *fmt, ...)
{
    if (!c || c->ended)
        return;
    if (end_if_gone(c))
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pcs_utf8_trim_partial(msg); /* a long message cut mid-character would not be UTF-8 */
    end_with_status(c, (grpc_status_code)pcs_status_to_grpc(st), msg);
}

pcs_status_t pcs_rpc_send(pcs_rpc_call_t *c, const ProtobufCMessage *msg)
{
    if (!c || !msg)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc send: NULL call or message");
    if (c->ended)
        return pcs_set_error(PCS_ERR_STATE, "rpc send: call already ended");
    if (c->closed || c->send_failed)
        return pcs_set_error(PCS_ERR_CANCELLED, "rpc send: the client is gone");
    PCS_CHECK(enqueue(c, msg));
    flush(c);
    return PCS_OK;
}

void pcs_rpc_finish(pcs_rpc_call_t *c)
{
    if (!c || c->ended)
        return;
    if (end_if_gone(c))
        return;
    end_with_status(c, GRPC_STATUS_OK, NULL);
}

void pcs_rpc_call_set_cancel(pcs_rpc_call_t *c, void (*on_cancel)(pcs_rpc_call_t *, void *),
                             void *arg)
{
    if (!c)
        return;
    c->on_cancel = on_cancel;
    c->cancel_arg = arg;
    /* Already gone while the handler held it without a hook: tell it now. */
    if (c->closed && !c->ended && !c->cancel_notified && on_cancel) {
        c->cancel_notified = true;
        c->refs++; /* the hook may end the call: free only after it returns */
        on_cancel(c, arg);
        c->refs--;
        maybe_free(c);
    }
}

const char *pcs_rpc_call_peer(const pcs_rpc_call_t *c)
{
    if (!c || !c->call)
        return "?";
    if (!c->peer)
        ((pcs_rpc_call_t *)c)->peer = grpc_call_get_peer(c->call); /* cached; logically const */
    return c->peer ? c->peer : "?";
}

void pcs_rpc_call_set_principal(pcs_rpc_call_t *c, uint64_t principal)
{
    if (c)
        c->principal = principal;
}

uint64_t pcs_rpc_call_principal(const pcs_rpc_call_t *c)
{
    return c ? c->principal : 0;
}

int pcs_rpc_call_cert_names(const pcs_rpc_call_t *c, const char *name, char *first, size_t n)
{
    if (first && n)
        first[0] = '\0';
    if (!c || !c->call)
        return -1;
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    if (!ctx)
        return -1;
    int found = 0, any = 0;
    /* the subject's common name and every subject alternative name (DNS, URI, e-mail, IP) */
    static const char *const props[] = {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME};
    for (size_t k = 0; k < sizeof props / sizeof props[0] && !found; k++) {
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, props[k]);
        for (const grpc_auth_property *p = grpc_auth_property_iterator_next(&it); p;
             p = grpc_auth_property_iterator_next(&it)) {
            if (!any && first && n)
                snprintf(first, n, "%.*s", (int)p->value_length, p->value);
            any = 1;
            if (name && strlen(name) == p->value_length &&
                memcmp(name, p->value, p->value_length) == 0) {
                found = 1;
                break;
            }
        }
    }
    grpc_auth_context_release(ctx);
    return any ? found : -1;
}

long pcs_rpc_call_metadata(const pcs_rpc_call_t *c, const char *key, char *buf, size_t n)
{
    if (buf && n)
        buf[0] = '\0';
    if (!c || !key)
        return -1;
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_metadata *m = &c->md.metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != klen ||
            memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) != 0)
            continue;
        size_t vlen = GRPC_SLICE_LENGTH(m->value);
        if (buf && n) {
            size_t k = vlen < n - 1 ? vlen : n - 1;
            memcpy(buf, GRPC_SLICE_START_PTR(m->value), k);
            buf[k] = '\0';
        }
        return (long)vlen;
    }
    return -1;
}

int64_t pcs_rpc_call_remaining_ms(const pcs_rpc_call_t *c)
{
    if (!c)
        return 0;
    gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) >= 0 || d.tv_sec >= INT64_MAX / 2000)
        return INT64_MAX;
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t ms = (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
    return ms > 0 ? ms : 0;
}

void pcs_rpc_call_set_ungated(pcs_rpc_call_t *c)
{
    if (c)
        c->ungated = true;
}

// ---- the gate ----

void pcs_rpc_server_gate_close(pcs_rpc_server_t *s)
{
    if (s)
        s->gate_closed = true;
}

void pcs_rpc_server_gate_open(pcs_rpc_server_t *s)
{
    if (!s)
        return;
    s->gate_closed = false;
    for (pcs_rpc_call_t *c = s->live; c; c = c->next) {
        if (!c->held)
            continue;
        c->held = false;
        flush(c); /* starts a batch at most: the call stays on the list */
    }
}

void pcs_rpc_server_gate_fail(pcs_rpc_server_t *s, pcs_status_t st, const char *fmt, ...)
{
    if (!s)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pcs_utf8_trim_partial(msg);
    pcs_rpc_call_t *next;
    for (pcs_rpc_call_t *c = s->live; c; c = next) {
        next = c->next;
        if (!c->held)
            continue;
        c->held = false;
        c->ungated = true; /* what it sends now is only the failure */
        drop_queue(c);     /* nothing it was going to say is durable */
        if (!c->ended && !c->cancel_notified && c->on_cancel) {
            /* a stream the handler keeps: it forgets the call first, as when a client leaves */
            c->cancel_notified = true;
            c->refs++;
            c->on_cancel(c, c->cancel_arg);
            c->refs--;
        }
        c->ended = true;
        c->state = CALL_SEND;
        c->code = (grpc_status_code)pcs_status_to_grpc(st);
        grpc_slice_unref(c->status_details);
        c->status_details = grpc_slice_from_copied_string(msg);
        c->status_queued = true;
        flush(c);
        maybe_free(c);
    }
}

void pcs_rpc_server_tick_soon(pcs_rpc_server_t *s)
{
    if (s)
        s->tick_soon = true;
}

// ---- receiving ----

static void recv_done(pcs_rpc_tag_t *tag, bool ok)
{
    pcs_rpc_call_t *c = container_of(tag, pcs_rpc_call_t, recv_tag);
    pcs_rpc_server_t *s = c->srv;
    if (!ok) { /* the server is shutting down: this request will never be matched */
        call_free(c);
        return;
    }
    /* Re-arm before handling so a slow handler never leaves the method without a listener. */
    if (!s->shutting_down)
        (void)arm(s, c->method);
    c->start_us = pcs_now_us();
    c->state = CALL_HANDLE;

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->close_tag, NULL);
    if (e != GRPC_CALL_OK) {
        PCS_WARN(PCS_SUB_RPC, "cannot watch a call for close (grpc_call_error %d)", (int)e);
        c->closed = true;
        c->ended = true;
        grpc_call_cancel(c->call, NULL);
        maybe_free(c);
        return;
    }
    c->refs++;

    if (c->method < 0) {
        char path[256];
        size_t n = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(path, sizeof path, "%.*s", (int)(n > 200 ? 200 : n),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        pcs_utf8_sanitize(path); /* the client's bytes, echoed in the status details */
        PCS_DEBUG(PCS_SUB_RPC, "unknown method %s from %s", path, pcs_rpc_call_peer(c));
        char msg[300];
        snprintf(msg, sizeof msg, "unknown method %s", path);
        end_with_status(c, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }

    const pcs_rpc_method_t *m = s->methods[c->method].m;
    ProtobufCMessage *req = NULL;
    pcs_status_t st;
    if (!c->req_bb)
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: request without a message", m->path);
    else
        st = pcs_rpc_decode(m->req_desc, c->req_bb, s->max_message_bytes, &req);
    if (st == PCS_OK) {
        /* proto3 strings must be UTF-8; a handler that stored other bytes would echo them to
         * every client, whose decoders refuse the whole reply */
        st = pcs_pb_check_utf8(req);
        if (st != PCS_OK) {
            protobuf_c_message_free_unpacked(req, NULL);
            req = NULL;
        }
    }
    if (c->req_bb) {
        grpc_byte_buffer_destroy(c->req_bb);
        c->req_bb = NULL;
    }
    if (st != PCS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pcs_last_error());
        PCS_DEBUG(PCS_SUB_RPC, "%s from %s: %s", m->path, pcs_rpc_call_peer(c), msg);
        end_with_status(c, (grpc_status_code)pcs_status_to_grpc(st), msg);
        return;
    }
    if (s->authorize) {
        pcs_clear_error();
        st = s->authorize(s->user, m, c);
        if (st != PCS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pcs_last_error());
            pcs_utf8_trim_partial(msg);
            PCS_DEBUG(PCS_SUB_RPC, "%s from %s refused: %s", m->path, pcs_rpc_call_peer(c), msg);
            protobuf_c_message_free_unpacked(req, NULL);
            end_with_status(c, (grpc_status_code)pcs_status_to_grpc(st), msg);
            return;
        }
    }
    m->handler(c, req, s->user);
    protobuf_c_message_free_unpacked(req, NULL);
}

static void close_done(pcs_rpc_tag_t *tag, bool ok)
{
    pcs_rpc_call_t *c = container_of(tag, pcs_rpc_call_t, close_tag);
    c->refs--;
    c->closed = true;
    if (!ok)
        c->close_cancelled = 1;
    record_stats(c);
    c->state = CALL_DONE;
    drop_queue(c);
    if (!c->ended && !c->cancel_notified && c->on_cancel) {
        c->cancel_notified = true;
        c->refs++; /* the hook may end the call (a no-op now): free only after it returns */
        c->on_cancel(c, c->cancel_arg);
        c->refs--;
    }
    /* Without an on_cancel hook and not yet ended, the handler may still hold the call: keep it
     * (a zombie) until the handler ends it (then freed at once) or the server is destroyed. */
    maybe_free(c);
}

static void shutdown_done(pcs_rpc_tag_t *tag, bool ok)
{
    pcs_rpc_server_t *s = container_of(tag, pcs_rpc_server_t, shutdown_tag);
    s->shutdown_seen = true;
}

// ---- server lifecycle ----

static pcs_status_t check_config(const pcs_rpc_server_config_t *cfg)
{
    if (!cfg || !cfg->listen || !*cfg->listen)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc server: no listen address");
    if (cfg->n_methods && !cfg->methods)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc server: NULL method table");
    for (size_t i = 0; i < cfg->n_methods; i++) {
        const pcs_rpc_method_t *m = &cfg->methods[i];
        if (!m->path || m->path[0] != '/' || !m->req_desc || !m->resp_desc || !m->handler)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "rpc server: method row %zu (%s) needs a /path, descriptors and "
                                 "a handler",
                                 i, m->path ? m->path : "(null)");
        for (size_t j = 0; j < i; j++)
            if (strcmp(cfg->methods[j].path, m->path) == 0)
                return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc server: method %s listed twice",
                                     m->path);
    }
    return PCS_OK;
}

pcs_status_t pcs_rpc_server_create(const pcs_rpc_server_config_t *cfg, pcs_rpc_server_t **out)
{
    *out = NULL;
    PCS_CHECK(check_config(cfg));
    pcs_rpc_server_t *s;
    PCS_CHECK(pcs_calloc(1, sizeof *s, (void **)&s));
    pcs_status_t st = PCS_OK;
    grpc_init();
    s->user = cfg->user;
    s->max_message_bytes =
        cfg->max_message_bytes ? cfg->max_message_bytes : PCS_RPC_DEFAULT_MAX_MESSAGE;
    s->tick_ms = cfg->tick_ms > 0 ? cfg->tick_ms : 100;
    s->tick = cfg->tick;
    s->authorize = cfg->authorize;
    s->n_methods = cfg->n_methods;
    s->shutdown_tag.on_done = shutdown_done;
    PCS_CHECK_GOTO(pcs_calloc(cfg->n_methods + 1, sizeof *s->methods, (void **)&s->methods), st,
                   fail);
    PCS_CHECK_GOTO(pcs_calloc(cfg->n_methods + 1, sizeof *s->stats, (void **)&s->stats), st, fail);

    /* gRPC itself rejects oversized requests with RESOURCE_EXHAUSTED before they are buffered */
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         {.integer =
              s->max_message_bytes > (size_t)INT32_MAX ? INT32_MAX : (int)s->max_message_bytes}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         {.integer = PCS_RPC_SERVER_MIN_PING_INTERVAL_MS}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_KEEPALIVE_TIME_MS,
         {.integer = PCS_RPC_SERVER_KEEPALIVE_MS}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
         {.integer = PCS_RPC_SERVER_KEEPALIVE_TIMEOUT_MS}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
    };
    grpc_channel_args ca = {sizeof args / sizeof args[0], args};
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->server = grpc_server_create(&ca, NULL);
    for (size_t i = 0; i < cfg->n_methods; i++) {
        s->methods[i].m = &cfg->methods[i];
        s->stats[i].path = cfg->methods[i].path;
        s->methods[i].handle = grpc_server_register_method(
            s->server, cfg->methods[i].path, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (!s->methods[i].handle) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "rpc server: cannot register method %s",
                               cfg->methods[i].path);
            goto fail;
        }
    }
    s->stats[cfg->n_methods].path = GENERIC_PATH;
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    grpc_server_credentials *cr = NULL;
    PCS_CHECK_GOTO(pcs_rpc_server_creds(cfg->tls, &cr), st, fail);
    s->port = grpc_server_add_http2_port(s->server, cfg->listen, cr);
    grpc_server_credentials_release(cr);
    if (s->port == 0) {
        st = pcs_set_error(PCS_ERR_SYSTEM,
                           "rpc server: cannot listen on %s (address in use or "
                           "invalid)",
                           cfg->listen);
        PCS_WARN(PCS_SUB_RPC, "%s", pcs_last_error());
        goto fail;
    }
    grpc_server_start(s->server);
    s->started = true;
    for (int k = 0; k < ARMED_PER_METHOD; k++)
        for (size_t i = 0; i < cfg->n_methods; i++)
            PCS_CHECK_GOTO(arm(s, (int)i), st, fail);
    PCS_CHECK_GOTO(arm(s, -1), st, fail);
    PCS_DEBUG(PCS_SUB_RPC, "listening on %s (port %d), %zu methods", cfg->listen, s->port,
              cfg->n_methods);
    *out = s;
    return PCS_OK;
fail:
    pcs_rpc_server_destroy(s);
    return st;
}

int pcs_rpc_server_port(const pcs_rpc_server_t *s)
{
    return s ? s->port : 0;
}

void pcs_rpc_server_stop(pcs_rpc_server_t *s)
{
    if (s)
        s->stop = 1;
}

static void dispatch(grpc_event ev)
{
    if (ev.type == GRPC_OP_COMPLETE && ev.tag) {
        pcs_rpc_tag_t *tag = ev.tag;
        tag->on_done(tag, ev.success != 0);
    }
}

/* Graceful teardown: refuse new calls, cancel in-flight ones (their on_cancel runs), drain every
 * tag, shut the queue down. Idempotent. */
static void server_teardown(pcs_rpc_server_t *s)
{
    if (s->torn_down)
        return;
    s->torn_down = true;
    s->shutting_down = true;
    if (s->server && s->cq) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
        grpc_server_cancel_all_calls(s->server);
        while (!s->shutdown_seen) {
            grpc_event ev =
                grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            dispatch(ev);
        }
    }
    if (s->cq) {
        grpc_completion_queue_shutdown(s->cq);
        s->cq_shut = true;
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            dispatch(ev);
        }
    }
}

pcs_status_t pcs_rpc_server_run(pcs_rpc_server_t *s)
{
    if (!s || !s->started)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc server run: not created");
    if (s->torn_down)
        return pcs_set_error(PCS_ERR_STATE, "rpc server run: already shut down");
    const int slice_ms = s->tick_ms < 50 ? s->tick_ms : 50; /* how soon stop() is noticed */
    uint64_t next_tick = pcs_now_ms() + (uint64_t)s->tick_ms;
    while (!s->stop) {
        uint64_t now = pcs_now_ms();
        int64_t wait = (int64_t)next_tick - (int64_t)now;
        if (wait > slice_ms)
            wait = slice_ms;
        if (wait < 0)
            wait = 0;
        grpc_event ev = grpc_completion_queue_next(s->cq, pcs_rpc_deadline_ms(wait), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        dispatch(ev);
        if (s->tick_soon) {
            /* group commit: handle what is ready now (bounded), then tick once for all of it */
            for (int k = 0; k < 4096 && ev.type == GRPC_OP_COMPLETE && !s->stop; k++) {
                ev = grpc_completion_queue_next(s->cq, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN)
                    break;
                dispatch(ev);
            }
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            next_tick = 0;
        }
        now = pcs_now_ms();
        if (now >= next_tick) {
            s->tick_soon = false; /* this tick is the one asked for */
            if (s->tick)
                s->tick(s->user, now);
            next_tick = now + (uint64_t)s->tick_ms;
        }
    }
    PCS_DEBUG(PCS_SUB_RPC, "server loop stopping");
    server_teardown(s);
    return PCS_OK;
}

void pcs_rpc_server_destroy(pcs_rpc_server_t *s)
{
    if (!s)
        return;
    if (s->started)
        server_teardown(s);
    /* Zombies (deferred calls without on_cancel that the handler never ended) and nothing else
     * are left once every tag has drained. */
    while (s->live)
        call_free(s->live);
    if (s->server)
        grpc_server_destroy(s->server);
    if (s->cq) {
        if (!s->cq_shut) { /* create failed before start */
            grpc_completion_queue_shutdown(s->cq);
            for (;;) {
                grpc_event ev =
                    grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN)
                    break;
            }
        }
        grpc_completion_queue_destroy(s->cq);
    }
    free(s->methods);
    free(s->stats);
    free(s);
    grpc_shutdown();
}

size_t pcs_rpc_server_stats(const pcs_rpc_server_t *s, pcs_rpc_method_stats_t *rows, size_t n)
{
    if (!s)
        return 0;
    size_t total = s->n_methods + 1;
    for (size_t i = 0; i < total && i < n && rows; i++)
        rows[i] = s->stats[i];
    return total;
}
