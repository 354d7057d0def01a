/* gRPC-core glue (STYLE.md B7): the only place that creates gRPC calls, byte buffers and
 * completion queues. Messages cross this API as protobuf-c messages packed and unpacked through
 * their descriptors (one codec, no per-method code).
 *
 * Client part (used by pcsctl, workers, tests, benchmarks). Thread-safety: a client may be used
 * from several threads at once (each call has its own completion queue). */
#ifndef PCS_RPC_H
#define PCS_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- method paths (proto/pcs/v1/services.proto) ---- */
#define PCS_M_REGISTER         "/pcs.v1.WorkerService/Register"
#define PCS_M_HEARTBEAT        "/pcs.v1.WorkerService/Heartbeat"
#define PCS_M_WATCH_ASSIGNMENT "/pcs.v1.WorkerService/WatchAssignment"
#define PCS_M_KV_SET           "/pcs.v1.WorkerService/KvSet"
#define PCS_M_KV_GET           "/pcs.v1.WorkerService/KvGet"
#define PCS_M_REPORT_STEP      "/pcs.v1.WorkerService/ReportStep"
#define PCS_M_DEREGISTER       "/pcs.v1.WorkerService/Deregister"
#define PCS_M_SUBMIT_JOB       "/pcs.v1.JobService/SubmitJob"
#define PCS_M_GET_JOB          "/pcs.v1.JobService/GetJob"
#define PCS_M_LIST_JOBS        "/pcs.v1.JobService/ListJobs"
#define PCS_M_CANCEL_JOB       "/pcs.v1.JobService/CancelJob"
#define PCS_M_GET_PLAN         "/pcs.v1.JobService/GetPlan"
#define PCS_M_DRY_RUN_PLAN     "/pcs.v1.JobService/DryRunPlan"
#define PCS_M_LIST_WORKERS     "/pcs.v1.ClusterService/ListWorkers"
#define PCS_M_GET_STATUS       "/pcs.v1.ClusterService/GetStatus"
#define PCS_M_HEALTH_CHECK     "/grpc.health.v1.Health/Check"
#define PCS_M_HEALTH_WATCH     "/grpc.health.v1.Health/Watch"

/* ---- TLS (DESIGN.md §10) ----
 * PEM files, read when the server or client is created (borrowed for that call only). */
typedef struct pcs_rpc_tls {
    const char *cert_file; /* certificate chain: required on a server; a client's for mTLS */
    const char *key_file;  /* private key of cert_file */
    const char *ca_file;   /* roots: a client verifies the server with them (NULL: the system's
                            * roots); a server given them requires and verifies client certs */
    const char *target_name_override; /* client only, tests: name expected in the server cert */
} pcs_rpc_tls_t;

/* ---- client ---- */
typedef struct pcs_rpc_client pcs_rpc_client_t;

/* Connect lazily to `target` ("127.0.0.1:7070", "unix:/path"). TLS and the bearer token come from
 * the environment (PCS_TLS_CA, PCS_TLS_CLIENT_CERT/_KEY, PCS_TLS_TARGET_NAME, PCS_TOKEN). A lost
 * connection is retried after 100 ms, doubling up to PCS_RPC_RECONNECT_MAX_MS (gRPC's own default
 * grows to 120 s). Caller destroys. */
pcs_status_t pcs_rpc_client_create(const char *target, pcs_rpc_client_t **out);

#define PCS_RPC_RECONNECT_MAX_MS 1000
typedef struct pcs_rpc_client_options {
    uint32_t reconnect_max_ms; /* longest wait between connection attempts; 0 = the default */
} pcs_rpc_client_options_t;
/* pcs_rpc_client_create with options (o NULL: the defaults). */
pcs_status_t pcs_rpc_client_create_with(const char *target, const pcs_rpc_client_options_t *o,
                                        pcs_rpc_client_t **out);
/* Send "authorization: Bearer <token>" with every later call (NULL or "": stop). The token is
 * copied. Not thread-safe against calls in flight on this client: set it before use. */
pcs_status_t pcs_rpc_client_set_token(pcs_rpc_client_t *c, const char *token);
/* A worker's credential (DESIGN.md §10): Register answers a per-registration secret, which every
 * later WorkerService call carries in this header; the coordinator lets a call act only for the
 * worker the secret belongs to. */
#define PCS_RPC_WORKER_SECRET_HEADER "pcs-worker-secret"
#define PCS_RPC_WORKER_SECRET_MAX    128
/* Send the worker secret with every later call (NULL or "": stop). The secret is copied; it must
 * be printable ASCII. Thread-safe: calls already started keep the secret they started with. */
pcs_status_t pcs_rpc_client_set_worker_secret(pcs_rpc_client_t *c, const char *secret);
/* Same over TLS (tls NULL: insecure, as pcs_rpc_client_create). Errors: INVALID_ARG naming an
 * unreadable file or a cert without its key. */
pcs_status_t pcs_rpc_client_create_tls(const char *target, const pcs_rpc_tls_t *tls,
                                       pcs_rpc_client_t **out);
void pcs_rpc_client_destroy(pcs_rpc_client_t *c);

/* Unary call with a deadline (timeout_ms <= 0: none). The channel connects lazily; a server
 * that is not there yields PCS_ERR_REMOTE (UNAVAILABLE) at once rather than waiting for it.
 * Replies up to 64 MiB are accepted. On PCS_OK *resp is the unpacked reply (free with
 * protobuf_c_message_free_unpacked(*resp, NULL)). On failure *resp is NULL, the status is mapped
 * from the gRPC code (INVALID_ARGUMENT -> PCS_ERR_INVALID_ARG, UNAVAILABLE -> PCS_ERR_REMOTE, ...)
 * and pcs_last_error() holds "<CODE_NAME>: <details> (<method>)". grpc_code (may be NULL) gets the
 * raw code. */
pcs_status_t pcs_rpc_call(pcs_rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                          ProtobufCMessage **resp, int *grpc_code);

/* pcs_rpc_call carrying `secret` as this call's worker secret instead of the client's ("" none,
 * NULL the client's): tools and benchmarks that act for many workers over one channel. */
pcs_status_t pcs_rpc_call_as(pcs_rpc_client_t *c, const char *secret, const char *method,
                             const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                             ProtobufCMessage **resp, int *grpc_code);

/* Server streaming. open sends the request; next waits up to timeout_ms (<0: forever) for the
 * next message: PCS_OK with *msg set, PCS_OK with *msg == NULL at a clean end of stream (the
 * final code is then pcs_rpc_stream_code()), PCS_ERR_TIMEOUT if nothing came in time (the
 * stream stays usable), or an error mapped from the stream's failure status. close cancels the
 * call if it is still open. */
typedef struct pcs_rpc_stream pcs_rpc_stream_t;
pcs_status_t pcs_rpc_stream_open(pcs_rpc_client_t *c, const char *method,
                                 const ProtobufCMessage *req, pcs_rpc_stream_t **out);
/* pcs_rpc_stream_open with this call's own worker secret (see pcs_rpc_call_as). */
pcs_status_t pcs_rpc_stream_open_as(pcs_rpc_client_t *c, const char *secret, const char *method,
                                    const ProtobufCMessage *req, pcs_rpc_stream_t **out);
pcs_status_t pcs_rpc_stream_next(pcs_rpc_stream_t *s, const ProtobufCMessageDescriptor *desc,
                                 int timeout_ms, ProtobufCMessage **msg);
void pcs_rpc_stream_close(pcs_rpc_stream_t *s);

/* Final gRPC code of a stream once next() returned the end or an error (-1 while still open). */
int pcs_rpc_stream_code(const pcs_rpc_stream_t *s);

/* Asynchronous unary calls: many calls in flight on one completion queue, completed one at a
 * time by next(). For load generators (pcs-rpc-bench) and fan-out tools. One pcs_rpc_async_t is
 * used by one thread at a time; several may share a client. */
typedef struct pcs_rpc_async pcs_rpc_async_t;
pcs_status_t pcs_rpc_async_create(pcs_rpc_client_t *c, pcs_rpc_async_t **out);
/* Cancels the calls still in flight and waits for them. */
void pcs_rpc_async_destroy(pcs_rpc_async_t *a);
/* Start one call; `req` is packed before return (borrowed); `user` comes back from next(). On an
 * error return nothing was started and next() will not report this call. */
pcs_status_t pcs_rpc_async_start(pcs_rpc_async_t *a, const char *method,
                                 const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 void *user);
/* pcs_rpc_async_start with this call's own worker secret (see pcs_rpc_call_as). */
pcs_status_t pcs_rpc_async_start_as(pcs_rpc_async_t *a, const char *secret, const char *method,
                                    const ProtobufCMessage *req,
                                    const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                    void *user);
/* Wait up to timeout_ms (<0: forever) for one call to finish. PCS_OK: *user is that call's
 * pointer, *call_status its outcome (mapped as in pcs_rpc_call, pcs_last_error() has the text),
 * *resp its reply when *call_status == PCS_OK (caller frees), *grpc_code (may be NULL) the raw
 * code. PCS_ERR_TIMEOUT: none finished in time. PCS_ERR_STATE: no call is in flight. */
pcs_status_t pcs_rpc_async_next(pcs_rpc_async_t *a, int timeout_ms, void **user,
                                pcs_status_t *call_status, ProtobufCMessage **resp, int *grpc_code);
size_t pcs_rpc_async_in_flight(const pcs_rpc_async_t *a);

/* The known pcs.v1 (and grpc.health.v1) methods with their message descriptors, for generic
 * tools (raw calls in pcsctl, the codec fuzz target, benchmarks). Static table, n rows. */
typedef struct pcs_rpc_method_info {
    const char *path;
    const ProtobufCMessageDescriptor *req_desc;
    const ProtobufCMessageDescriptor *resp_desc;
    int server_streaming;
} pcs_rpc_method_info_t;
const pcs_rpc_method_info_t *pcs_rpc_known_methods(size_t *n);
/* Row of `path`, or NULL if it is not a known method. */
const pcs_rpc_method_info_t *pcs_rpc_method_lookup(const char *path);

/* Every string field of `m` (through sub-messages, repeated fields, oneofs and map entries) is
 * well-formed UTF-8 (RFC 3629), as proto3 requires and protobuf-c does not check. Otherwise
 * INVALID_ARG with pcs_last_error() naming the field path from `m` and the offset in that
 * string: "job.name: not valid UTF-8 at byte 7", "devices[1].kind: ...". The RPC server runs it
 * on every decoded request before the handler (common/rpc_utf8.c). Thread-safe. */
pcs_status_t pcs_pb_check_utf8(const ProtobufCMessage *m);

/* Name of a gRPC status code ("INVALID_ARGUMENT"). */
const char *pcs_grpc_code_name(int code);
/* Map a gRPC status code to pcs_status_t. */
pcs_status_t pcs_status_from_grpc(int code);

/* ---- server ----
 * One completion queue and one thread (the caller of pcs_rpc_server_run) own every call; handlers
 * and tick run on that thread, so the state behind them needs no locks (DESIGN.md §2). A handler
 * answers at once or keeps the call and answers later (a pending KvGet, a WatchAssignment
 * stream). Requests that do not decode get INVALID_ARGUMENT, larger than max_message_bytes get
 * RESOURCE_EXHAUSTED, unknown methods UNIMPLEMENTED, requests with a string field that is not
 * UTF-8 INVALID_ARGUMENT naming the field (pcs_pb_check_utf8), all before any handler runs. */
#include <stdint.h>

typedef struct pcs_rpc_server pcs_rpc_server_t;
typedef struct pcs_rpc_call pcs_rpc_call_t; /* valid until it is ended or cancelled */

/* `req` is borrowed for the duration of the handler call (the server frees it afterwards). */
typedef void (*pcs_rpc_handler_fn)(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user);

typedef struct pcs_rpc_method {
    const char *path; /* PCS_M_* */
    const ProtobufCMessageDescriptor *req_desc;
    const ProtobufCMessageDescriptor *resp_desc;
    int server_streaming;
    pcs_rpc_handler_fn handler;
} pcs_rpc_method_t;

typedef struct pcs_rpc_server_config {
    const char *listen;              /* "127.0.0.1:0", "0.0.0.0:7070", "unix:/path" */
    const pcs_rpc_method_t *methods; /* retained: must outlive the server */
    size_t n_methods;
    void *user;               /* passed to handlers and tick */
    size_t max_message_bytes; /* 0 = 4 MiB */
    int tick_ms;              /* tick() runs at least this often (0 = 100 ms) */
    void (*tick)(void *user, uint64_t now_ms);
    const pcs_rpc_tls_t *tls; /* NULL: insecure (plaintext HTTP/2) */
    /* Optional: runs after the request decoded and before the handler. A non-OK status ends the
     * call with its gRPC code and pcs_last_error() as the message (UNAUTHENTICATED,
     * PERMISSION_DENIED); the handler does not run. */
    pcs_status_t (*authorize)(void *user, const pcs_rpc_method_t *m, pcs_rpc_call_t *call);
} pcs_rpc_server_config_t;

/* Bind and start listening (the port is bound when this returns). Requests larger than
 * max_message_bytes are refused by gRPC itself with RESOURCE_EXHAUSTED (not counted in the
 * stats); replies are limited to 64 MiB (the clients' receive limit). Errors: INVALID_ARG for a
 * bad table, PCS_ERR_SYSTEM if the address cannot be bound. */
pcs_status_t pcs_rpc_server_create(const pcs_rpc_server_config_t *cfg, pcs_rpc_server_t **out);
/* The bound TCP port (useful with port 0); 1 for a unix: address. */
int pcs_rpc_server_port(const pcs_rpc_server_t *s);
/* Serve on the calling thread until pcs_rpc_server_stop(); then shut down gracefully: in-flight
 * calls are cancelled (their on_cancel runs), no new calls are accepted. */
pcs_status_t pcs_rpc_server_run(pcs_rpc_server_t *s);
/* Ask run() to return. Async-signal-safe (sets a flag read by the loop). */
void pcs_rpc_server_stop(pcs_rpc_server_t *s);
void pcs_rpc_server_destroy(pcs_rpc_server_t *s);

/* The gate: a server whose replies must wait for something (the coordinator's state to be
 * durable) closes it; from then on everything a gated call would send (replies, stream messages,
 * statuses) is held, in order, until pcs_rpc_server_gate_open() sends it, or
 * pcs_rpc_server_gate_fail() replaces it: every held call then ends with `st` and the message
 * (a stream the handler still keeps gets its on_cancel first, as when a client leaves, and ends).
 * Calls marked with pcs_rpc_call_set_ungated() (health, rendezvous) are never held. Open and
 * fail leave calls that hold nothing alone. Loop thread only. */
void pcs_rpc_server_gate_close(pcs_rpc_server_t *s);
void pcs_rpc_server_gate_open(pcs_rpc_server_t *s);
void pcs_rpc_server_gate_fail(pcs_rpc_server_t *s, pcs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pcs_rpc_call_set_ungated(pcs_rpc_call_t *call);
/* Run tick as soon as the events ready now are handled (at most a few thousand more), instead of
 * at the next tick_ms: group commit of the requests that arrived together. Loop thread only. */
void pcs_rpc_server_tick_soon(pcs_rpc_server_t *s);

/* Unary: end the call with OK and `resp` (packed before return; borrowed). */
pcs_status_t pcs_rpc_reply(pcs_rpc_call_t *call, const ProtobufCMessage *resp);
/* Unary or streaming: end the call with the gRPC code of `st` and a message (the details). */
void pcs_rpc_fail(pcs_rpc_call_t *call, pcs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Streaming: queue one message (packed now, sent in order; one SEND in flight at a time). */
pcs_status_t pcs_rpc_send(pcs_rpc_call_t *call, const ProtobufCMessage *msg);
/* Streaming: end with OK after the queued messages are sent. */
void pcs_rpc_finish(pcs_rpc_call_t *call);
/* Called once if the client goes away, the deadline passes or the server shuts down before the
 * call was ended by the handler. The call is invalid after on_cancel returns. A handler that
 * keeps a call should set this; without it a call whose client left stays allocated until the
 * handler ends it (reply/fail/finish then free it; reply returns PCS_ERR_CANCELLED) or the
 * server is destroyed. Set on a call already gone, on_cancel runs at once. */
void pcs_rpc_call_set_cancel(pcs_rpc_call_t *call,
                             void (*on_cancel)(pcs_rpc_call_t *call, void *arg), void *arg);
/* Peer address ("ipv4:127.0.0.1:5555"), for logs. */
const char *pcs_rpc_call_peer(const pcs_rpc_call_t *call);
/* Request metadata (e.g. "authorization"; keys are lower-case): copies the value, truncated and
 * NUL-terminated, into buf (n bytes) and returns its full length, or -1 if the key is absent. */
long pcs_rpc_call_metadata(const pcs_rpc_call_t *call, const char *key, char *buf, size_t n);
/* A value the authorize hook attaches to the call for the handler (the coordinator: the number
 * of the worker whose secret the call carries); 0 until set. */
void pcs_rpc_call_set_principal(pcs_rpc_call_t *call, uint64_t principal);
uint64_t pcs_rpc_call_principal(const pcs_rpc_call_t *call);
/* The client certificate of a TLS call: 1 when its subject CN or one of its subject alternative
 * names equals `name` (NULL: just look), 0 when it names others, -1 when the call carries no
 * client certificate. `first` (may be NULL) gets the first name, for messages. */
int pcs_rpc_call_cert_names(const pcs_rpc_call_t *call, const char *name, char *first, size_t n);
/* Milliseconds until the client's deadline (INT64_MAX if none). */
int64_t pcs_rpc_call_remaining_ms(const pcs_rpc_call_t *call);

/* Per-method counters for /metrics: calls by gRPC code (counted when the call closes; calls the
 * client or the server cancelled count as CANCELLED) and a latency histogram (receipt to close):
 * latency_bucket[i] counts calls in (bound[i-1], bound[i]], the last bucket is +Inf; not
 * cumulative. Loop thread only. Returns the number of rows, n_methods + 1 (the last row, path
 * "*", counts calls to unknown methods); fills at most n rows. */
#define PCS_RPC_LAT_BUCKETS 19 /* upper bounds: 50us .. 10 min, +Inf: a unary call's
                                * microseconds and a parked KvGet's or a stream's minutes */
typedef struct pcs_rpc_method_stats {
    const char *path;
    uint64_t calls_by_code[17];
    uint64_t latency_bucket[PCS_RPC_LAT_BUCKETS];
    double latency_sum_s;
} pcs_rpc_method_stats_t;
size_t pcs_rpc_server_stats(const pcs_rpc_server_t *s, pcs_rpc_method_stats_t *rows, size_t n);
const double *pcs_rpc_latency_bounds_s(void); /* PCS_RPC_LAT_BUCKETS - 1 finite bounds */

#ifdef __cplusplus
}
#endif
#endif
