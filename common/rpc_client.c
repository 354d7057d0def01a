/* gRPC client glue: one channel per pcs_rpc_client_t; unary calls with a deadline on a per-call
 * pluck completion queue (so any number of threads can call at once); server streams on a
 * per-stream queue whose next() can time out without breaking the stream; asynchronous unary
 * calls on a per-owner queue for load generators. Codes map to pcs_status_t, the server's details
 * go into pcs_last_error() as "<CODE_NAME>: <details>". */
#include "rpc_internal.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/log.h"
#include "pcs/mem.h"

#define MAX_CACHED_METHODS 64

struct pcs_rpc_client {
    grpc_channel *ch;
    char *target;
    pthread_mutex_t mu; /* guards the method-handle cache */
    struct {
        char *path; /* must outlive the channel (grpc_channel_register_call) */
        void *handle;
    } methods[MAX_CACHED_METHODS];
    size_t n_methods;
    bool has_auth; /* send "authorization: Bearer <token>" with every call */
    grpc_slice auth_key, auth_value;
    /* "pcs-worker-secret: <secret>" with every call once set (pcs_rpc_client_set_worker_secret):
     * replaced from one thread while others call, so each call takes a reference under mu */
    bool has_secret;
    grpc_slice secret_value;
};

/* The metadata one call sends: the client's headers at the time it starts (each call its own
 * grpc_metadata: gRPC writes into their internal fields). The secret's slice is referenced until
 * the call is released, whatever the client does meanwhile. */
typedef struct call_md {
    grpc_metadata md[2];
    bool has_secret;
    grpc_slice secret;
} call_md_t;

// ---- client ----

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Every pcs client (pcsctl, workers, their KV store, benches) is created here, so the TLS and
 * token settings of DESIGN.md §10 come from one place: PCS_TLS_CA (verify the coordinator),
 * PCS_TLS_CLIENT_CERT + PCS_TLS_CLIENT_KEY (client certificate for mTLS), PCS_TOKEN (bearer
 * token). The names differ from the coordinator's own --tls-cert/--tls-key (env PCS_TLS_CERT,
 * PCS_TLS_KEY) so that one shell can run both. */
static pcs_status_t client_create(const char *target, const pcs_rpc_tls_t *tls,
                                  uint32_t reconnect_max_ms, pcs_rpc_client_t **out);

pcs_status_t pcs_rpc_client_create(const char *target, pcs_rpc_client_t **out)
{
    return pcs_rpc_client_create_with(target, NULL, out);
}

pcs_status_t pcs_rpc_client_create_with(const char *target, const pcs_rpc_client_options_t *o,
                                        pcs_rpc_client_t **out)
{
    uint32_t reconnect_max_ms = o && o->reconnect_max_ms ? o->reconnect_max_ms : 0;
    pcs_rpc_tls_t tls = {.cert_file = env_nonempty("PCS_TLS_CLIENT_CERT"),
                         .key_file = env_nonempty("PCS_TLS_CLIENT_KEY"),
                         .ca_file = env_nonempty("PCS_TLS_CA"),
                         .target_name_override = env_nonempty("PCS_TLS_TARGET_NAME")};
    int use_tls = tls.ca_file || tls.cert_file;
    PCS_CHECK(client_create(target, use_tls ? &tls : NULL, reconnect_max_ms, out));
    const char *token = env_nonempty("PCS_TOKEN");
    if (token) {
        pcs_status_t st = pcs_rpc_client_set_token(*out, token);
        if (st != PCS_OK) {
            pcs_rpc_client_destroy(*out);
            *out = NULL;
            return st;
        }
    }
    return PCS_OK;
}

pcs_status_t pcs_rpc_client_create_tls(const char *target, const pcs_rpc_tls_t *tls,
                                       pcs_rpc_client_t **out)
{
    return client_create(target, tls, 0, out);
}

/* Reconnect backoff: gRPC's default grows to 120 s, so a channel that lost its server during a
 * 20 s coordinator restart could wait two more minutes before it tried again, while the restarted
 * coordinator waits for its workers. pcs clients start at 100 ms and cap at reconnect_max_ms
 * (0: PCS_RPC_RECONNECT_MAX_MS); gRPC adds its own +-20 % jitter, which spreads a fleet's
 * reconnects. The connect deadline (MIN_RECONNECT_BACKOFF) stays gRPC's 20 s: a refused connect
 * fails at once on its own, a slow one is not cut short. */
static pcs_status_t client_create(const char *target, const pcs_rpc_tls_t *tls,
                                  uint32_t reconnect_max_ms, pcs_rpc_client_t **out)
{
    *out = NULL;
    if (!reconnect_max_ms)
        reconnect_max_ms = PCS_RPC_RECONNECT_MAX_MS;
    if (reconnect_max_ms > INT32_MAX)
        reconnect_max_ms = INT32_MAX;
    int initial_ms = reconnect_max_ms < 100 ? (int)reconnect_max_ms : 100;
    if (!target || !*target)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: empty target address");
    pcs_rpc_client_t *c;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    pcs_status_t st = pcs_strdup(target, &c->target);
    if (st != PCS_OK) {
        free(c);
        return st;
    }
    pthread_mutex_init(&c->mu, NULL);
    grpc_init();
    grpc_channel_credentials *cr = NULL;
    st = pcs_rpc_channel_creds(tls, &cr);
    if (st != PCS_OK) {
        pcs_rpc_client_destroy(c); /* no channel yet; undoes grpc_init */
        return st;
    }
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         {.integer = (int)PCS_RPC_CLIENT_MAX_RECEIVE}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_KEEPALIVE_TIME_MS,
         {.integer = PCS_RPC_CLIENT_KEEPALIVE_MS}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
         {.integer = PCS_RPC_CLIENT_KEEPALIVE_TIMEOUT_MS}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, {.integer = initial_ms}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         {.integer = (int)reconnect_max_ms}},
        {GRPC_ARG_STRING,
         (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
         {.string = tls ? (char *)tls->target_name_override : NULL}},
    };
    size_t nargs = sizeof args / sizeof args[0];
    if (!tls || !tls->target_name_override)
        nargs--; /* the override is the last row */
    grpc_channel_args ca = {nargs, args};
    c->ch = grpc_channel_create(target, cr, &ca);
    grpc_channel_credentials_release(cr);
    if (!c->ch) { /* grpc_channel_create returns a lame channel rather than NULL; be safe */
        pcs_rpc_client_destroy(c);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: cannot create channel to %s",
                             target);
    }
    *out = c;
    return PCS_OK;
}

void pcs_rpc_client_destroy(pcs_rpc_client_t *c)
{
    if (!c)
        return;
    if (c->has_auth) {
        grpc_slice_unref(c->auth_key);
        grpc_slice_unref(c->auth_value);
    }
    if (c->has_secret)
        grpc_slice_unref(c->secret_value);
    if (c->ch)
        grpc_channel_destroy(c->ch);
    for (size_t i = 0; i < c->n_methods; i++)
        free(c->methods[i].path);
    pthread_mutex_destroy(&c->mu);
    free(c->target);
    free(c);
    grpc_shutdown();
}

pcs_status_t pcs_rpc_client_set_token(pcs_rpc_client_t *c, const char *token)
{
    if (!c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: NULL client");
    if (token && (strchr(token, '\n') || strchr(token, '\r')))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: token contains a line break");
    if (c->has_auth) {
        grpc_slice_unref(c->auth_key);
        grpc_slice_unref(c->auth_value);
        c->has_auth = false;
    }
    if (!token || !*token)
        return PCS_OK;
    char *v = NULL;
    size_t n = strlen(token) + sizeof "Bearer ";
    PCS_CHECK(pcs_calloc(n, 1, (void **)&v));
    snprintf(v, n, "Bearer %s", token);
    c->auth_key = grpc_slice_from_static_string("authorization");
    c->auth_value = grpc_slice_from_copied_string(v);
    free(v);
    c->has_auth = true;
    return PCS_OK;
}

/* Point a SEND_INITIAL_METADATA op at the client's headers: the bearer token and the worker
 * secret, as they are now (or this call's own secret: NULL = the client's). */
static void add_auth_as(pcs_rpc_client_t *c, const char *secret, call_md_t *m, grpc_op *op)
{
    size_t n = 0;
    memset(m->md, 0, sizeof m->md);
    if (c->has_auth) {
        m->md[n].key = c->auth_key;
        m->md[n].value = c->auth_value;
        n++;
    }
    if (secret) { /* this call's own (a tool acting for many workers on one channel) */
        if (*secret) {
            m->secret = grpc_slice_from_copied_string(secret);
            m->has_secret = true;
        }
    } else {
        pthread_mutex_lock(&c->mu);
        if (c->has_secret) {
            m->secret = grpc_slice_ref(c->secret_value);
            m->has_secret = true;
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (m->has_secret) {
        m->md[n].key = grpc_slice_from_static_string(PCS_RPC_WORKER_SECRET_HEADER);
        m->md[n].value = m->secret;
        n++;
    }
    op->data.send_initial_metadata.count = n;
    op->data.send_initial_metadata.metadata = n ? m->md : NULL;
}

static void release_md(call_md_t *m)
{
    if (m->has_secret)
        grpc_slice_unref(m->secret);
    m->has_secret = false;
}

pcs_status_t pcs_rpc_client_set_worker_secret(pcs_rpc_client_t *c, const char *secret)
{
    if (!c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: NULL client");
    if (secret && strlen(secret) > PCS_RPC_WORKER_SECRET_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc client: worker secret longer than %d bytes",
                             PCS_RPC_WORKER_SECRET_MAX);
    for (const char *p = secret; p && *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "rpc client: worker secret is not printable ASCII");
    grpc_slice fresh = grpc_empty_slice(), old = grpc_empty_slice();
    bool has = secret && *secret, had;
    if (has)
        fresh = grpc_slice_from_copied_string(secret);
    pthread_mutex_lock(&c->mu);
    had = c->has_secret;
    old = c->secret_value;
    c->secret_value = fresh;
    c->has_secret = has;
    pthread_mutex_unlock(&c->mu);
    if (had)
        grpc_slice_unref(old);
    return PCS_OK;
}

/* Registered-call handle for `method` (cached: saves interning the path on every call). NULL if
 * the cache is full; the caller then creates an unregistered call. */
static void *method_handle(pcs_rpc_client_t *c, const char *method)
{
    void *h = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_methods; i++) {
        if (strcmp(c->methods[i].path, method) == 0) {
            h = c->methods[i].handle;
            goto out;
        }
    }
    if (c->n_methods < MAX_CACHED_METHODS) {
        char *p = strdup(method);
        if (p) {
            h = grpc_channel_register_call(c->ch, p, NULL, NULL);
            c->methods[c->n_methods].path = p;
            c->methods[c->n_methods].handle = h;
            c->n_methods++;
        }
    }
out:
    pthread_mutex_unlock(&c->mu);
    return h;
}

static grpc_call *new_call(pcs_rpc_client_t *c, const char *method, grpc_completion_queue *cq,
                           gpr_timespec deadline)
{
    void *h = method_handle(c, method);
    if (h)
        return grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, h,
                                                   deadline, NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call =
        grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL, deadline, NULL);
    grpc_slice_unref(m);
    return call;
}

static pcs_status_t check_call_args(pcs_rpc_client_t *c, const char *method,
                                    const ProtobufCMessage *req)
{
    if (!c || !method || method[0] != '/')
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc: bad client or method path '%s'",
                             method ? method : "(null)");
    if (!req)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc %s: NULL request", method);
    return PCS_OK;
}

/* Turn a finished call's status (and reply buffer on OK) into the pcs result. */
static pcs_status_t finish_status(const char *method, grpc_status_code code, grpc_slice details,
                                  const char *errstr, grpc_byte_buffer *bb,
                                  const ProtobufCMessageDescriptor *resp_desc,
                                  ProtobufCMessage **resp)
{
    if (code != GRPC_STATUS_OK) {
        size_t dn = GRPC_SLICE_LENGTH(details);
        const char *d = (const char *)GRPC_SLICE_START_PTR(details);
        if (dn == 0 && errstr) {
            d = errstr;
            dn = strlen(errstr);
        }
        return pcs_set_error(pcs_status_from_grpc((int)code), "%s: %.*s (%s)",
                             pcs_grpc_code_name((int)code), (int)(dn > 900 ? 900 : dn), d, method);
    }
    if (!resp_desc) /* the caller does not want the reply */
        return PCS_OK;
    if (!bb)
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: server returned OK without a reply", method);
    return pcs_rpc_decode(resp_desc, bb, PCS_RPC_CLIENT_MAX_RECEIVE, resp);
}

/* The six ops of a unary call; pointers in `u` must stay valid until the batch completes. */
typedef struct unary_state {
    grpc_byte_buffer *send_bb;
    grpc_byte_buffer *recv_bb;
    grpc_metadata_array md_init;
    grpc_metadata_array md_trail;
    grpc_status_code code;
    grpc_slice details;
    const char *errstr;
    call_md_t auth;
} unary_state_t;

static size_t unary_ops(unary_state_t *u, grpc_op ops[6])
{
    memset(ops, 0, 6 * sizeof ops[0]);
    grpc_metadata_array_init(&u->md_init);
    grpc_metadata_array_init(&u->md_trail);
    u->details = grpc_empty_slice();
    u->code = GRPC_STATUS_UNKNOWN;
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->md_init;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->md_trail;
    ops[5].data.recv_status_on_client.status = &u->code;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    ops[5].data.recv_status_on_client.error_string = &u->errstr;
    return 6;
}

static void unary_release(unary_state_t *u)
{
    if (u->send_bb)
        grpc_byte_buffer_destroy(u->send_bb);
    if (u->recv_bb)
        grpc_byte_buffer_destroy(u->recv_bb);
    grpc_metadata_array_destroy(&u->md_init);
    grpc_metadata_array_destroy(&u->md_trail);
    grpc_slice_unref(u->details);
    if (u->errstr)
        gpr_free((void *)u->errstr);
    release_md(&u->auth);
}

pcs_status_t pcs_rpc_call(pcs_rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                          ProtobufCMessage **resp, int *grpc_code)
{
    return pcs_rpc_call_as(c, NULL, method, req, resp_desc, timeout_ms, resp, grpc_code);
}

pcs_status_t pcs_rpc_call_as(pcs_rpc_client_t *c, const char *secret, const char *method,
                             const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                             ProtobufCMessage **resp, int *grpc_code)
{
    if (resp)
        *resp = NULL;
    if (grpc_code)
        *grpc_code = GRPC_STATUS_UNKNOWN;
    PCS_CHECK(check_call_args(c, method, req));
    unary_state_t u = {0};
    PCS_CHECK(pcs_rpc_encode(req, 0, &u.send_bb));
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call =
        new_call(c, method, cq, pcs_rpc_deadline_ms(timeout_ms > 0 ? timeout_ms : -1));
    grpc_op ops[6];
    size_t n = unary_ops(&u, ops);
    add_auth_as(c, secret, &u.auth, &ops[0]);
    pcs_status_t st;
    char tag;
    grpc_call_error e = grpc_call_start_batch(call, ops, n, &tag, NULL);
    if (e != GRPC_CALL_OK) {
        st = pcs_set_error(PCS_ERR_INTERNAL, "%s: grpc_call_start_batch failed (%d)", method,
                           (int)e);
    } else {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) /* not expected for a client batch */
            st = pcs_set_error(PCS_ERR_INTERNAL, "%s: call batch failed", method);
        else
            st = finish_status(method, u.code, u.details, u.errstr, u.recv_bb,
                               resp ? resp_desc : NULL, resp);
        if (grpc_code)
            *grpc_code = (int)u.code;
    }
    unary_release(&u);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    if (st != PCS_OK)
        PCS_DEBUG(PCS_SUB_RPC, "%s", pcs_last_error());
    return st;
}

// ---- server streaming ----

struct pcs_rpc_stream {
    pcs_rpc_client_t *c;
    char *method;
    grpc_completion_queue *cq;
    grpc_call *call;
    int outstanding;                     /* batches started and not yet seen on cq */
    char tag_start, tag_msg, tag_status; /* addresses used as tags */
    int msg_pending;
    int status_done;
    grpc_byte_buffer *send_bb;
    grpc_byte_buffer *recv_bb;
    grpc_metadata_array md_init, md_trail;
    grpc_status_code code;
    grpc_slice details;
    const char *errstr;
    call_md_t auth;
    pcs_status_t final_st;
    char final_err[512];
};

pcs_status_t pcs_rpc_stream_open(pcs_rpc_client_t *c, const char *method,
                                 const ProtobufCMessage *req, pcs_rpc_stream_t **out)
{
    return pcs_rpc_stream_open_as(c, NULL, method, req, out);
}

pcs_status_t pcs_rpc_stream_open_as(pcs_rpc_client_t *c, const char *secret, const char *method,
                                    const ProtobufCMessage *req, pcs_rpc_stream_t **out)
{
    *out = NULL;
    PCS_CHECK(check_call_args(c, method, req));
    pcs_rpc_stream_t *s;
    PCS_CHECK(pcs_calloc(1, sizeof *s, (void **)&s));
    pcs_status_t st = pcs_rpc_encode(req, 0, &s->send_bb);
    if (st == PCS_OK)
        st = pcs_strdup(method, &s->method);
    if (st != PCS_OK) {
        if (s->send_bb)
            grpc_byte_buffer_destroy(s->send_bb);
        free(s);
        return st;
    }
    s->c = c;
    s->details = grpc_empty_slice();
    s->code = GRPC_STATUS_UNKNOWN;
    grpc_metadata_array_init(&s->md_init);
    grpc_metadata_array_init(&s->md_trail);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->call = new_call(c, method, s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    add_auth_as(c, secret, &s->auth, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->md_init;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
    if (e != GRPC_CALL_OK) {
        pcs_rpc_stream_close(s);
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: grpc_call_start_batch failed (%d)", method,
                             (int)e);
    }
    s->outstanding++;
    *out = s;
    return PCS_OK;
}

int pcs_rpc_stream_code(const pcs_rpc_stream_t *s)
{
    return s && s->status_done ? (int)s->code : -1;
}

static pcs_status_t stream_ended(pcs_rpc_stream_t *s)
{
    if (s->final_st == PCS_OK)
        return PCS_OK;
    return pcs_set_error(s->final_st, "%s", s->final_err);
}

pcs_status_t pcs_rpc_stream_next(pcs_rpc_stream_t *s, const ProtobufCMessageDescriptor *desc,
                                 int timeout_ms, ProtobufCMessage **msg)
{
    if (!msg)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream next: NULL output pointer");
    *msg = NULL;
    if (!s || !desc)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream next: NULL stream or descriptor");
    if (s->status_done)
        return stream_ended(s);
    if (!s->msg_pending) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &s->recv_bb;
        grpc_call_error e = grpc_call_start_batch(s->call, &op, 1, &s->tag_msg, NULL);
        if (e != GRPC_CALL_OK)
            return pcs_set_error(PCS_ERR_INTERNAL, "%s: cannot start RECV_MESSAGE (%d)", s->method,
                                 (int)e);
        s->msg_pending = 1;
        s->outstanding++;
    }
    gpr_timespec deadline = pcs_rpc_deadline_ms(timeout_ms);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            return pcs_set_error(PCS_ERR_TIMEOUT, "%s: no stream message within %d ms", s->method,
                                 timeout_ms);
        if (ev.type != GRPC_OP_COMPLETE)
            return pcs_set_error(PCS_ERR_INTERNAL, "%s: stream queue shut down", s->method);
        s->outstanding--;
        if (ev.tag == &s->tag_start)
            continue; /* a failure here shows up as the end of the message stream */
        if (ev.tag == &s->tag_msg) {
            s->msg_pending = 0;
            if (s->recv_bb) {
                pcs_status_t st = pcs_rpc_decode(desc, s->recv_bb, PCS_RPC_CLIENT_MAX_RECEIVE, msg);
                grpc_byte_buffer_destroy(s->recv_bb);
                s->recv_bb = NULL;
                return st;
            }
            /* End of messages: fetch the final status (arrives promptly now). */
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
            op.data.recv_status_on_client.trailing_metadata = &s->md_trail;
            op.data.recv_status_on_client.status = &s->code;
            op.data.recv_status_on_client.status_details = &s->details;
            op.data.recv_status_on_client.error_string = &s->errstr;
            grpc_call_error e = grpc_call_start_batch(s->call, &op, 1, &s->tag_status, NULL);
            if (e != GRPC_CALL_OK)
                return pcs_set_error(PCS_ERR_INTERNAL, "%s: cannot start RECV_STATUS (%d)",
                                     s->method, (int)e);
            s->outstanding++;
            deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
            continue;
        }
        if (ev.tag == &s->tag_status) {
            s->status_done = 1;
            s->final_st =
                finish_status(s->method, s->code, s->details, s->errstr, NULL, NULL, NULL);
            snprintf(s->final_err, sizeof s->final_err, "%s", pcs_last_error());
            return stream_ended(s);
        }
    }
}

void pcs_rpc_stream_close(pcs_rpc_stream_t *s)
{
    if (!s)
        return;
    if (s->call && !s->status_done)
        grpc_call_cancel(s->call, NULL);
    while (s->outstanding > 0) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        s->outstanding--;
    }
    if (s->recv_bb)
        grpc_byte_buffer_destroy(s->recv_bb);
    if (s->send_bb)
        grpc_byte_buffer_destroy(s->send_bb);
    grpc_metadata_array_destroy(&s->md_init);
    grpc_metadata_array_destroy(&s->md_trail);
    grpc_slice_unref(s->details);
    if (s->errstr)
        gpr_free((void *)s->errstr);
    release_md(&s->auth);
    if (s->call)
        grpc_call_unref(s->call);
    grpc_completion_queue_shutdown(s->cq);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    grpc_completion_queue_destroy(s->cq);
    free(s->method);
    free(s);
}

// ---- asynchronous unary calls ----

typedef struct async_call {
    struct async_call *prev, *next; /* in-flight list, for cancel on destroy */
    void *user;
    char *method; /* copied: the caller's string may be gone by next() */
    const ProtobufCMessageDescriptor *resp_desc;
    grpc_call *call;
    unary_state_t u;
} async_call_t;

struct pcs_rpc_async {
    pcs_rpc_client_t *c;
    grpc_completion_queue *cq;
    async_call_t *head;
    size_t in_flight;
};

pcs_status_t pcs_rpc_async_create(pcs_rpc_client_t *c, pcs_rpc_async_t **out)
{
    *out = NULL;
    if (!c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc async: NULL client");
    pcs_rpc_async_t *a;
    PCS_CHECK(pcs_calloc(1, sizeof *a, (void **)&a));
    a->c = c;
    a->cq = grpc_completion_queue_create_for_next(NULL);
    *out = a;
    return PCS_OK;
}

static void async_unlink(pcs_rpc_async_t *a, async_call_t *ac)
{
    if (ac->prev)
        ac->prev->next = ac->next;
    else
        a->head = ac->next;
    if (ac->next)
        ac->next->prev = ac->prev;
    a->in_flight--;
}

static void async_free(async_call_t *ac)
{
    unary_release(&ac->u);
    free(ac->method);
    if (ac->call)
        grpc_call_unref(ac->call);
    free(ac);
}

void pcs_rpc_async_destroy(pcs_rpc_async_t *a)
{
    if (!a)
        return;
    for (async_call_t *ac = a->head; ac; ac = ac->next)
        grpc_call_cancel(ac->call, NULL);
    while (a->in_flight > 0) {
        grpc_event ev =
            grpc_completion_queue_next(a->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        async_call_t *ac = ev.tag;
        async_unlink(a, ac);
        async_free(ac);
    }
    grpc_completion_queue_shutdown(a->cq);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(a->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    grpc_completion_queue_destroy(a->cq);
    free(a);
}

pcs_status_t pcs_rpc_async_start(pcs_rpc_async_t *a, const char *method,
                                 const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 void *user)
{
    return pcs_rpc_async_start_as(a, NULL, method, req, resp_desc, timeout_ms, user);
}

pcs_status_t pcs_rpc_async_start_as(pcs_rpc_async_t *a, const char *secret, const char *method,
                                    const ProtobufCMessage *req,
                                    const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                    void *user)
{
    if (!a)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc async: NULL handle");
    PCS_CHECK(check_call_args(a->c, method, req));
    async_call_t *ac;
    PCS_CHECK(pcs_calloc(1, sizeof *ac, (void **)&ac));
    pcs_status_t st = pcs_rpc_encode(req, 0, &ac->u.send_bb);
    if (st != PCS_OK) {
        free(ac);
        return st;
    }
    ac->user = user;
    if (pcs_strdup(method, &ac->method) != PCS_OK) {
        grpc_byte_buffer_destroy(ac->u.send_bb);
        free(ac);
        return PCS_ERR_NOMEM;
    }
    ac->resp_desc = resp_desc;
    ac->call = new_call(a->c, method, a->cq, pcs_rpc_deadline_ms(timeout_ms > 0 ? timeout_ms : -1));
    grpc_op ops[6];
    size_t n = unary_ops(&ac->u, ops);
    add_auth_as(a->c, secret, &ac->u.auth, &ops[0]);
    grpc_call_error e = grpc_call_start_batch(ac->call, ops, n, ac, NULL);
    if (e != GRPC_CALL_OK) {
        async_free(ac);
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: grpc_call_start_batch failed (%d)", method,
                             (int)e);
    }
    ac->next = a->head;
    if (a->head)
        a->head->prev = ac;
    a->head = ac;
    a->in_flight++;
    return PCS_OK;
}

pcs_status_t pcs_rpc_async_next(pcs_rpc_async_t *a, int timeout_ms, void **user,
                                pcs_status_t *call_status, ProtobufCMessage **resp, int *grpc_code)
{
    if (!user || !call_status || !resp)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc async next: NULL output pointer");
    *user = NULL;
    *resp = NULL;
    *call_status = PCS_ERR_INTERNAL;
    if (grpc_code)
        *grpc_code = GRPC_STATUS_UNKNOWN;
    if (!a)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "rpc async: NULL handle");
    if (a->in_flight == 0)
        return pcs_set_error(PCS_ERR_STATE, "rpc async: no call in flight");
    grpc_event ev = grpc_completion_queue_next(a->cq, pcs_rpc_deadline_ms(timeout_ms), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT)
        return pcs_set_error(PCS_ERR_TIMEOUT, "rpc async: no call finished within %d ms",
                             timeout_ms);
    if (ev.type != GRPC_OP_COMPLETE)
        return pcs_set_error(PCS_ERR_INTERNAL, "rpc async: queue shut down");
    async_call_t *ac = ev.tag;
    async_unlink(a, ac);
    *user = ac->user;
    if (!ev.success)
        *call_status = pcs_set_error(PCS_ERR_INTERNAL, "%s: call batch failed", ac->method);
    else
        *call_status = finish_status(ac->method, ac->u.code, ac->u.details, ac->u.errstr,
                                     ac->u.recv_bb, ac->resp_desc, resp);
    if (grpc_code)
        *grpc_code = (int)ac->u.code;
    async_free(ac);
    return PCS_OK;
}

size_t pcs_rpc_async_in_flight(const pcs_rpc_async_t *a)
{
    return a ? a->in_flight : 0;
}
