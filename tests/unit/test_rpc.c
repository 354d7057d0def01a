/* Unit tests of the gRPC glue (common/rpc_*): an in-process server on 127.0.0.1:0 running on its
 * own thread with a small method table of real pcs.v1 messages, exercised through the client
 * API and, where the client API cannot produce the input (malformed bytes), a raw gRPC call. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/rpc.h"
#include "pcs/v1/worker.pb-c.h"
#include "test_util.h"

// ---- the server under test: handlers and tick run on the server thread ----

typedef struct fixture {
    pcs_rpc_server_t *srv;
    pthread_t th;
    char addr[64];
    pcs_rpc_client_t *cli;
    /* server-thread state */
    pcs_rpc_call_t *deferred;
    uint64_t deferred_at;
    pcs_rpc_call_t *slow;
    uint64_t slow_at;
    pcs_rpc_call_t *kv_waiters[16]; /* pending KvGet calls, answered by a later KvSet */
    /* observed by the test thread */
    atomic_int handled;
    atomic_int kv_pending;
    atomic_int kv_cancels;
    atomic_int stream_cancels;
    atomic_int ticks;
    atomic_llong last_remaining_ms; /* of the last Register */
    char last_peer[128];            /* written before `handled` is bumped */
    int joined;
} fixture_t;

static void on_deferred_cancel(pcs_rpc_call_t *call, void *arg)
{
    fixture_t *f = arg;
    if (f->deferred == call)
        f->deferred = NULL;
}

static void h_register(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    fixture_t *f = user;
    const Pcs__V1__RegisterRequest *r = (const Pcs__V1__RegisterRequest *)req;
    atomic_store(&f->last_remaining_ms, (long long)pcs_rpc_call_remaining_ms(call));
    snprintf(f->last_peer, sizeof f->last_peer, "%s", pcs_rpc_call_peer(call));
    atomic_fetch_add(&f->handled, 1);
    if (strcmp(r->identity, "fail") == 0) {
        pcs_rpc_fail(call, PCS_ERR_STATE, "worker %s refused: job is draining", r->identity);
        return;
    }
    if (strcmp(r->identity, "whoami") == 0) { /* echoes the authorization header */
        char auth[64];
        long n = pcs_rpc_call_metadata(call, "authorization", auth, sizeof auth);
        Pcs__V1__RegisterResponse resp = PCS__V1__REGISTER_RESPONSE__INIT;
        resp.worker_id = n < 0 ? "(none)" : auth;
        resp.lease_ms = (uint32_t)(n < 0 ? 0 : n);
        pcs_rpc_reply(call, &resp.base);
        return;
    }
    if (strcmp(r->identity, "defer") == 0) { /* answered by tick later */
        f->deferred = call;
        f->deferred_at = pcs_now_ms();
        pcs_rpc_call_set_cancel(call, on_deferred_cancel, f);
        return;
    }
    char id[300];
    snprintf(id, sizeof id, "w-%s-%u", r->identity, r->pid);
    Pcs__V1__RegisterResponse resp = PCS__V1__REGISTER_RESPONSE__INIT;
    resp.worker_id = id;
    resp.lease_ms = 5000;
    assert_int_equal(pcs_rpc_reply(call, &resp.base), PCS_OK);
    /* a second reply on an ended call is a state error, not a crash */
    assert_int_equal(pcs_rpc_reply(call, &resp.base), PCS_ERR_STATE);
}

static void on_kv_cancel(pcs_rpc_call_t *call, void *arg)
{
    fixture_t *f = arg;
    for (int i = 0; i < 16; i++)
        if (f->kv_waiters[i] == call)
            f->kv_waiters[i] = NULL;
    atomic_fetch_sub(&f->kv_pending, 1);
    atomic_fetch_add(&f->kv_cancels, 1);
}

/* A cancel hook that ends its own call (allowed: the end is a no-op on a gone call). */
static void on_kv_cancel_and_fail(pcs_rpc_call_t *call, void *arg)
{
    fixture_t *f = arg;
    pcs_rpc_fail(call, PCS_ERR_CANCELLED, "client went away");
    assert_int_equal(
        pcs_rpc_reply(call, &(Pcs__V1__KvGetResponse)PCS__V1__KV_GET_RESPONSE__INIT.base),
        PCS_ERR_STATE);
    atomic_fetch_add(&f->kv_cancels, 1);
}

/* KvGet never answers: the call stays pending until the client or the server cancels it. Key
 * "zombie": kept without an on_cancel hook (the server must still free it); key
 * "fail-in-cancel": its hook ends the call itself. */
static void h_kv_get(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    fixture_t *f = user;
    const Pcs__V1__KvGetRequest *r = (const Pcs__V1__KvGetRequest *)req;
    atomic_fetch_add(&f->handled, 1);
    if (strcmp(r->key, "zombie") == 0)
        return;
    if (strcmp(r->key, "fail-in-cancel") == 0) {
        pcs_rpc_call_set_cancel(call, on_kv_cancel_and_fail, f);
        return;
    }
    pcs_rpc_call_set_cancel(call, on_kv_cancel, f);
    for (int i = 0; i < 16; i++) {
        if (!f->kv_waiters[i]) {
            f->kv_waiters[i] = call;
            break;
        }
    }
    atomic_fetch_add(&f->kv_pending, 1);
}

/* KvSet answers every pending KvGet with its value (a reply from another call's handler). */
static void h_kv_set(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    fixture_t *f = user;
    const Pcs__V1__KvSetRequest *r = (const Pcs__V1__KvSetRequest *)req;
    atomic_fetch_add(&f->handled, 1);
    for (int i = 0; i < 16; i++) {
        if (!f->kv_waiters[i])
            continue;
        Pcs__V1__KvGetResponse resp = PCS__V1__KV_GET_RESPONSE__INIT;
        resp.found = 1;
        resp.value = r->value;
        assert_int_equal(pcs_rpc_reply(f->kv_waiters[i], &resp.base), PCS_OK);
        f->kv_waiters[i] = NULL;
        atomic_fetch_sub(&f->kv_pending, 1);
    }
    Pcs__V1__KvSetResponse resp = PCS__V1__KV_SET_RESPONSE__INIT;
    pcs_rpc_reply(call, &resp.base);
}

static void on_stream_cancel(pcs_rpc_call_t *call, void *arg)
{
    fixture_t *f = arg;
    if (f->slow == call)
        f->slow = NULL;
    atomic_fetch_add(&f->stream_cancels, 1);
}

static pcs_status_t send_event(pcs_rpc_call_t *call, uint64_t seq)
{
    Pcs__V1__Directive d = PCS__V1__DIRECTIVE__INIT;
    d.kind = PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART;
    d.generation = seq * 10;
    Pcs__V1__AssignmentEvent ev = PCS__V1__ASSIGNMENT_EVENT__INIT;
    ev.seq = seq;
    ev.event_case = PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE;
    ev.directive = &d;
    return pcs_rpc_send(call, &ev.base);
}

/* worker_id "n=K": K events then OK; "slow": one event now, one from tick later, then OK;
 * "forever": one event, then the stream stays open until cancelled. */
static void h_watch(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    fixture_t *f = user;
    const Pcs__V1__WatchAssignmentRequest *r = (const Pcs__V1__WatchAssignmentRequest *)req;
    atomic_fetch_add(&f->handled, 1);
    if (strncmp(r->worker_id, "n=", 2) == 0) {
        int n = atoi(r->worker_id + 2);
        for (int i = 1; i <= n; i++)
            assert_int_equal(send_event(call, (uint64_t)i), PCS_OK);
        pcs_rpc_finish(call);
        assert_int_equal(send_event(call, 99), PCS_ERR_STATE); /* after finish: refused */
        return;
    }
    if (strncmp(r->worker_id, "fail-after=", 11) == 0) {
        int n = atoi(r->worker_id + 11);
        for (int i = 1; i <= n; i++)
            assert_int_equal(send_event(call, (uint64_t)i), PCS_OK);
        pcs_rpc_fail(call, PCS_ERR_STATE, "generation bumped to %d", 7);
        return;
    }
    pcs_rpc_call_set_cancel(call, on_stream_cancel, f);
    assert_int_equal(send_event(call, 1), PCS_OK);
    if (strcmp(r->worker_id, "slow") == 0) {
        f->slow = call;
        f->slow_at = pcs_now_ms();
    }
}

static void h_health(pcs_rpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Grpc__Health__V1__HealthCheckRequest *r =
        (const Grpc__Health__V1__HealthCheckRequest *)req;
    if (r->service[0] != '\0') {
        pcs_rpc_fail(call, PCS_ERR_NOT_FOUND, "unknown service %s", r->service);
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    pcs_rpc_reply(call, &resp.base);
}

static void tick(void *user, uint64_t now_ms)
{
    fixture_t *f = user;
    atomic_fetch_add(&f->ticks, 1);
    if (f->deferred && now_ms >= f->deferred_at + 100) {
        Pcs__V1__RegisterResponse resp = PCS__V1__REGISTER_RESPONSE__INIT;
        resp.worker_id = "deferred";
        pcs_rpc_reply(f->deferred, &resp.base);
        f->deferred = NULL;
    }
    if (f->slow && now_ms >= f->slow_at + 800) {
        send_event(f->slow, 2);
        pcs_rpc_finish(f->slow);
        f->slow = NULL;
    }
}

static const pcs_rpc_method_t methods[] = {
    {PCS_M_REGISTER, &pcs__v1__register_request__descriptor,
     &pcs__v1__register_response__descriptor, 0, h_register},
    {PCS_M_KV_GET, &pcs__v1__kv_get_request__descriptor, &pcs__v1__kv_get_response__descriptor, 0,
     h_kv_get},
    {PCS_M_WATCH_ASSIGNMENT, &pcs__v1__watch_assignment_request__descriptor,
     &pcs__v1__assignment_event__descriptor, 1, h_watch},
    {PCS_M_KV_SET, &pcs__v1__kv_set_request__descriptor, &pcs__v1__kv_set_response__descriptor, 0,
     h_kv_set},
    {PCS_M_HEALTH_CHECK, &grpc__health__v1__health_check_request__descriptor,
     &grpc__health__v1__health_check_response__descriptor, 0, h_health},
};

#define MAX_MSG (64u << 10)

static void *serve(void *arg)
{
    fixture_t *f = arg;
    pcs_status_t st = pcs_rpc_server_run(f->srv);
    return (void *)(intptr_t)st;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    pcs_rpc_server_config_t cfg = {
        .listen = "127.0.0.1:0",
        .methods = methods,
        .n_methods = sizeof methods / sizeof methods[0],
        .user = f,
        .max_message_bytes = MAX_MSG,
        .tick_ms = 20,
        .tick = tick,
    };
    if (pcs_rpc_server_create(&cfg, &f->srv) != PCS_OK) {
        fprintf(stderr, "server create: %s\n", pcs_last_error());
        free(f);
        return -1;
    }
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", pcs_rpc_server_port(f->srv));
    pthread_create(&f->th, NULL, serve, f);
    if (pcs_rpc_client_create(f->addr, &f->cli) != PCS_OK)
        return -1;
    *state = f;
    return 0;
}

static void stop_server(fixture_t *f)
{
    if (!f->srv || f->joined)
        return;
    f->joined = 1;
    pcs_rpc_server_stop(f->srv);
    void *ret;
    pthread_join(f->th, &ret);
    assert_int_equal((int)(intptr_t)ret, PCS_OK);
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    pcs_rpc_client_destroy(f->cli);
    stop_server(f);
    pcs_rpc_server_destroy(f->srv);
    free(f);
    return 0;
}

static int wait_atomic(atomic_int *v, int want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 5) {
        if (atomic_load(v) >= want)
            return 1;
        pcs_test_sleep_ms(5);
    }
    return atomic_load(v) >= want;
}

static pcs_status_t do_register(fixture_t *f, const char *identity, int timeout_ms,
                                Pcs__V1__RegisterResponse **out, int *code)
{
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    req.identity = (char *)identity;
    req.host = "localhost";
    req.pid = 42;
    return pcs_rpc_call(f->cli, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)out, code);
}

// ---- a raw unary call with arbitrary request bytes (what a broken client could send) ----

static int raw_call(const char *addr, const char *method, const void *bytes, size_t len,
                    char *details, size_t dn)
{
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(
        ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(5000, GPR_TIMESPAN)), NULL);
    grpc_slice_unref(m);
    grpc_slice s = grpc_slice_from_copied_buffer(bytes, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array md1, md2;
    grpc_metadata_array_init(&md1);
    grpc_metadata_array_init(&md2);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice det = grpc_empty_slice();
    const char *err = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md1;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md2;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &det;
    ops[5].data.recv_status_on_client.error_string = &err;
    char tag;
    assert_int_equal(grpc_call_start_batch(call, ops, 6, &tag, NULL), GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    assert_int_equal(ev.type, GRPC_OP_COMPLETE);
    snprintf(details, dn, "%.*s", (int)GRPC_SLICE_LENGTH(det),
             (const char *)GRPC_SLICE_START_PTR(det));
    grpc_byte_buffer_destroy(send);
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_metadata_array_destroy(&md1);
    grpc_metadata_array_destroy(&md2);
    grpc_slice_unref(det);
    gpr_free((void *)err);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return (int)code;
}

// ---- tests ----

static void test_unary_call_returns_the_handler_reply(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__RegisterResponse *resp = NULL;
    int code = -1;
    assert_int_equal(do_register(f, "alpha", 5000, &resp, &code), PCS_OK);
    assert_int_equal(code, GRPC_STATUS_OK);
    assert_non_null(resp);
    assert_string_equal(resp->worker_id, "w-alpha-42");
    assert_int_equal(resp->lease_ms, 5000);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    /* the handler saw the client's deadline and address */
    long long left = atomic_load(&f->last_remaining_ms);
    /* grpc-timeout travels with limited precision and is rounded up (5009 ms was seen) */
    assert_true(left > 0 && left <= 5000 + 100);
    assert_non_null(strstr(f->last_peer, "127.0.0.1"));
    /* without a client deadline there is none on the server either */
    assert_int_equal(do_register(f, "beta", 0, &resp, &code), PCS_OK);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    assert_true(atomic_load(&f->last_remaining_ms) == INT64_MAX);
}

static void test_bearer_token_reaches_the_handler_as_metadata(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__RegisterResponse *resp = NULL;
    assert_int_equal(do_register(f, "whoami", 5000, &resp, NULL), PCS_OK);
    assert_string_equal(resp->worker_id, "(none)");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    assert_int_equal(pcs_rpc_client_set_token(f->cli, "s3cret-token"), PCS_OK);
    assert_int_equal(do_register(f, "whoami", 5000, &resp, NULL), PCS_OK);
    assert_string_equal(resp->worker_id, "Bearer s3cret-token");
    assert_int_equal(resp->lease_ms, strlen("Bearer s3cret-token"));
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    /* async calls carry it too */
    pcs_rpc_async_t *a = NULL;
    assert_int_equal(pcs_rpc_async_create(f->cli, &a), PCS_OK);
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    req.identity = "whoami";
    assert_int_equal(pcs_rpc_async_start(a, PCS_M_REGISTER, &req.base,
                                         &pcs__v1__register_response__descriptor, 5000, NULL),
                     PCS_OK);
    void *user;
    pcs_status_t cst;
    assert_int_equal(pcs_rpc_async_next(a, 5000, &user, &cst, (ProtobufCMessage **)&resp, NULL),
                     PCS_OK);
    assert_int_equal(cst, PCS_OK);
    assert_string_equal(resp->worker_id, "Bearer s3cret-token");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    pcs_rpc_async_destroy(a);
    /* line breaks are refused; NULL clears it */
    assert_int_equal(pcs_rpc_client_set_token(f->cli, "bad\ntoken"), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_rpc_client_set_token(f->cli, NULL), PCS_OK);
    assert_int_equal(do_register(f, "whoami", 5000, &resp, NULL), PCS_OK);
    assert_string_equal(resp->worker_id, "(none)");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void test_handler_failure_maps_status_to_grpc_code_and_details(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__RegisterResponse *resp = (void *)1;
    int code = -1;
    assert_int_equal(do_register(f, "fail", 5000, &resp, &code), PCS_ERR_STATE);
    assert_null(resp);
    assert_int_equal(code, GRPC_STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(pcs_last_error(), "FAILED_PRECONDITION"));
    assert_non_null(strstr(pcs_last_error(), "worker fail refused: job is draining"));
}

static void test_deferred_reply_is_sent_later_from_tick(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__RegisterResponse *resp = NULL;
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(do_register(f, "defer", 5000, &resp, NULL), PCS_OK);
    uint64_t waited = pcs_now_ms() - t0;
    assert_string_equal(resp->worker_id, "deferred");
    assert_true(waited >= 90); /* the tick answers 100 ms after the handler kept the call */
    assert_true(atomic_load(&f->ticks) > 0);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void test_empty_request_message_decodes_as_defaults(void **state)
{
    fixture_t *f = *state;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    assert_int_equal(protobuf_c_message_get_packed_size(&req.base), 0);
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_HEALTH_CHECK, &req.base,
                                  &grpc__health__v1__health_check_response__descriptor, 5000,
                                  (ProtobufCMessage **)&resp, NULL),
                     PCS_OK);
    assert_int_equal(resp->status,
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    req.service = "nope";
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_HEALTH_CHECK, &req.base,
                                  &grpc__health__v1__health_check_response__descriptor, 5000,
                                  (ProtobufCMessage **)&resp, NULL),
                     PCS_ERR_NOT_FOUND);
}

static void test_stream_delivers_n_messages_in_order_then_ok(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    req.worker_id = "n=7";
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open(f->cli, PCS_M_WATCH_ASSIGNMENT, &req.base, &s), PCS_OK);
    assert_int_equal(pcs_rpc_stream_code(s), -1);
    for (uint64_t i = 1; i <= 7; i++) {
        Pcs__V1__AssignmentEvent *ev = NULL;
        assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                             (ProtobufCMessage **)&ev),
                         PCS_OK);
        assert_non_null(ev);
        assert_int_equal(ev->seq, i);
        assert_int_equal(ev->event_case, PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE);
        assert_int_equal(ev->directive->generation, i * 10);
        protobuf_c_message_free_unpacked(&ev->base, NULL);
    }
    ProtobufCMessage *end = (void *)1;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000, &end),
                     PCS_OK);
    assert_null(end);
    assert_int_equal(pcs_rpc_stream_code(s), GRPC_STATUS_OK);
    /* next after the end keeps saying "ended" */
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 10, &end),
                     PCS_OK);
    assert_null(end);
    pcs_rpc_stream_close(s);
}

static void test_stream_failure_after_messages_maps_status_and_details(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    req.worker_id = "fail-after=2";
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open(f->cli, PCS_M_WATCH_ASSIGNMENT, &req.base, &s), PCS_OK);
    for (uint64_t i = 1; i <= 2; i++) {
        Pcs__V1__AssignmentEvent *ev = NULL;
        assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                             (ProtobufCMessage **)&ev),
                         PCS_OK);
        assert_int_equal(ev->seq, i);
        protobuf_c_message_free_unpacked(&ev->base, NULL);
    }
    ProtobufCMessage *m = (void *)1;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000, &m),
                     PCS_ERR_STATE);
    assert_null(m);
    assert_non_null(strstr(pcs_last_error(), "FAILED_PRECONDITION: generation bumped to 7"));
    assert_int_equal(pcs_rpc_stream_code(s), GRPC_STATUS_FAILED_PRECONDITION);
    /* asking again repeats the final status */
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 10, &m),
                     PCS_ERR_STATE);
    pcs_rpc_stream_close(s);
}

static void test_stream_next_timeout_leaves_stream_usable(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    req.worker_id = "slow";
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open(f->cli, PCS_M_WATCH_ASSIGNMENT, &req.base, &s), PCS_OK);
    Pcs__V1__AssignmentEvent *ev = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                         (ProtobufCMessage **)&ev),
                     PCS_OK);
    assert_int_equal(ev->seq, 1);
    protobuf_c_message_free_unpacked(&ev->base, NULL);
    ev = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 50,
                                         (ProtobufCMessage **)&ev),
                     PCS_ERR_TIMEOUT);
    assert_null(ev);
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                         (ProtobufCMessage **)&ev),
                     PCS_OK);
    assert_non_null(ev);
    assert_int_equal(ev->seq, 2);
    protobuf_c_message_free_unpacked(&ev->base, NULL);
    ev = (void *)1;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                         (ProtobufCMessage **)&ev),
                     PCS_OK);
    assert_null(ev);
    pcs_rpc_stream_close(s);
    assert_int_equal(atomic_load(&f->stream_cancels), 0); /* finished, not cancelled */
}

static void test_client_cancel_mid_stream_runs_on_cancel_and_server_keeps_serving(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    req.worker_id = "forever";
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open(f->cli, PCS_M_WATCH_ASSIGNMENT, &req.base, &s), PCS_OK);
    Pcs__V1__AssignmentEvent *ev = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000,
                                         (ProtobufCMessage **)&ev),
                     PCS_OK);
    assert_int_equal(ev->seq, 1);
    protobuf_c_message_free_unpacked(&ev->base, NULL);
    pcs_rpc_stream_close(s); /* cancels the open call */
    assert_true(wait_atomic(&f->stream_cancels, 1, 5000));
    Pcs__V1__RegisterResponse *resp = NULL;
    assert_int_equal(do_register(f, "after-cancel", 5000, &resp, NULL), PCS_OK);
    assert_string_equal(resp->worker_id, "w-after-cancel-42");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void test_client_deadline_on_pending_call_times_out_and_runs_on_cancel(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    req.key = "nccl-id";
    ProtobufCMessage *resp = (void *)1;
    int code = -1;
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_KV_GET, &req.base,
                                  &pcs__v1__kv_get_response__descriptor, 150, &resp, &code),
                     PCS_ERR_TIMEOUT);
    assert_null(resp);
    assert_int_equal(code, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_true(wait_atomic(&f->kv_cancels, 1, 5000));
    assert_int_equal(atomic_load(&f->kv_pending), 0);
}

static void test_pending_call_is_answered_from_another_handler(void **state)
{
    fixture_t *f = *state;
    pcs_rpc_async_t *a = NULL;
    assert_int_equal(pcs_rpc_async_create(f->cli, &a), PCS_OK);
    Pcs__V1__KvGetRequest get = PCS__V1__KV_GET_REQUEST__INIT;
    get.key = "gloo/0";
    assert_int_equal(pcs_rpc_async_start(a, PCS_M_KV_GET, &get.base,
                                         &pcs__v1__kv_get_response__descriptor, 5000, NULL),
                     PCS_OK);
    assert_true(wait_atomic(&f->kv_pending, 1, 5000));
    void *user;
    pcs_status_t cst;
    ProtobufCMessage *resp = NULL;
    assert_int_equal(pcs_rpc_async_next(a, 50, &user, &cst, &resp, NULL), PCS_ERR_TIMEOUT);
    Pcs__V1__KvSetRequest set = PCS__V1__KV_SET_REQUEST__INIT;
    uint8_t value[3] = {1, 2, 3};
    set.key = "gloo/0";
    set.value.data = value;
    set.value.len = sizeof value;
    ProtobufCMessage *sresp = NULL;
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_KV_SET, &set.base,
                                  &pcs__v1__kv_set_response__descriptor, 5000, &sresp, NULL),
                     PCS_OK);
    protobuf_c_message_free_unpacked(sresp, NULL);
    assert_int_equal(pcs_rpc_async_next(a, 5000, &user, &cst, &resp, NULL), PCS_OK);
    assert_int_equal(cst, PCS_OK);
    const Pcs__V1__KvGetResponse *kv = (const Pcs__V1__KvGetResponse *)resp;
    assert_true(kv->found);
    assert_int_equal(kv->value.len, 3);
    assert_memory_equal(kv->value.data, value, 3);
    protobuf_c_message_free_unpacked(resp, NULL);
    assert_int_equal(atomic_load(&f->kv_cancels), 0);
    pcs_rpc_async_destroy(a);
}

static void test_cancel_hook_may_end_its_own_call(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    req.key = "fail-in-cancel";
    ProtobufCMessage *resp = NULL;
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_KV_GET, &req.base,
                                  &pcs__v1__kv_get_response__descriptor, 100, &resp, NULL),
                     PCS_ERR_TIMEOUT);
    assert_true(wait_atomic(&f->kv_cancels, 1, 5000));
    /* and the server still serves */
    Pcs__V1__RegisterResponse *r = NULL;
    assert_int_equal(do_register(f, "still-here", 5000, &r, NULL), PCS_OK);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_malformed_request_bytes_are_invalid_argument(void **state)
{
    fixture_t *f = *state;
    /* field 1 (identity), length 100, but only 2 bytes follow */
    const unsigned char bad[] = {0x0a, 0x64, 'a', 'b'};
    char details[512];
    int code = raw_call(f->addr, PCS_M_REGISTER, bad, sizeof bad, details, sizeof details);
    assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "pcs.v1.RegisterRequest"));
    assert_int_equal(atomic_load(&f->handled), 0); /* the handler never saw it */
    /* a well-formed request on the same server still works */
    const unsigned char good[] = {0x0a, 0x02, 'o', 'k'};
    assert_int_equal(raw_call(f->addr, PCS_M_REGISTER, good, sizeof good, details, sizeof details),
                     GRPC_STATUS_OK);
}

static void test_oversized_request_is_resource_exhausted(void **state)
{
    fixture_t *f = *state;
    size_t n = MAX_MSG + 1024;
    char *big = malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\0';
    Pcs__V1__RegisterResponse *resp = NULL;
    int code = -1;
    assert_int_equal(do_register(f, big, 5000, &resp, &code), PCS_ERR_LIMIT);
    assert_int_equal(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(atomic_load(&f->handled), 0);
    free(big);
    /* just under the limit is fine */
    big = malloc(MAX_MSG - 64);
    memset(big, 'y', MAX_MSG - 65);
    big[MAX_MSG - 65] = '\0';
    assert_int_equal(do_register(f, big, 5000, &resp, &code), PCS_OK);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    free(big);
}

static void test_unknown_method_is_unimplemented(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    assert_int_equal(pcs_rpc_call(f->cli, "/pcs.v1.Nope/Nothing", &req.base,
                                  &pcs__v1__kv_get_response__descriptor, 5000, &resp, &code),
                     PCS_ERR_UNSUPPORTED);
    assert_int_equal(code, GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(pcs_last_error(), "/pcs.v1.Nope/Nothing"));
    /* a known but unserved method (Deregister is not in the table) too */
    assert_int_equal(pcs_rpc_call(f->cli, PCS_M_DEREGISTER, &req.base,
                                  &pcs__v1__deregister_response__descriptor, 5000, &resp, &code),
                     PCS_ERR_UNSUPPORTED);
}

static void test_shutdown_with_pending_call_runs_on_cancel_and_fails_the_client(void **state)
{
    fixture_t *f = *state;
    pcs_rpc_async_t *a = NULL;
    assert_int_equal(pcs_rpc_async_create(f->cli, &a), PCS_OK);
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    req.key = "never";
    int marker = 7;
    assert_int_equal(pcs_rpc_async_start(a, PCS_M_KV_GET, &req.base,
                                         &pcs__v1__kv_get_response__descriptor, 10000, &marker),
                     PCS_OK);
    assert_true(wait_atomic(&f->kv_pending, 1, 5000));
    req.key = "zombie";
    assert_int_equal(pcs_rpc_async_start(a, PCS_M_KV_GET, &req.base,
                                         &pcs__v1__kv_get_response__descriptor, 10000, &marker),
                     PCS_OK);
    assert_true(wait_atomic(&f->handled, 2, 5000));
    /* also leave a stream open */
    Pcs__V1__WatchAssignmentRequest wreq = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
    wreq.worker_id = "forever";
    pcs_rpc_stream_t *s = NULL;
    assert_int_equal(pcs_rpc_stream_open(f->cli, PCS_M_WATCH_ASSIGNMENT, &wreq.base, &s), PCS_OK);
    ProtobufCMessage *ev = NULL;
    assert_int_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000, &ev),
                     PCS_OK);
    protobuf_c_message_free_unpacked(ev, NULL);

    stop_server(f);
    assert_int_equal(atomic_load(&f->kv_cancels), 1);
    assert_int_equal(atomic_load(&f->kv_pending), 0);
    assert_int_equal(atomic_load(&f->stream_cancels), 1);

    void *user = NULL;
    pcs_status_t call_st = PCS_OK;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pcs_rpc_async_next(a, 5000, &user, &call_st, &resp, &code), PCS_OK);
        assert_ptr_equal(user, &marker);
        assert_int_not_equal(call_st, PCS_OK);
        assert_int_not_equal(code, GRPC_STATUS_OK);
        assert_null(resp);
    }
    assert_int_equal(pcs_rpc_async_next(a, 10, &user, &call_st, &resp, &code), PCS_ERR_STATE);
    pcs_rpc_async_destroy(a);
    ev = (void *)1;
    assert_int_not_equal(pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 5000, &ev),
                         PCS_OK);
    assert_null(ev);
    pcs_rpc_stream_close(s);

    /* stats are readable after the loop stopped: per method, by code */
    pcs_rpc_method_stats_t rows[8];
    size_t n = pcs_rpc_server_stats(f->srv, rows, 8);
    assert_int_equal(n, sizeof methods / sizeof methods[0] + 1);
    assert_string_equal(rows[1].path, PCS_M_KV_GET);
    assert_int_equal(rows[1].calls_by_code[GRPC_STATUS_CANCELLED], 2);
    assert_string_equal(rows[n - 1].path, "*");
    pcs_rpc_server_destroy(f->srv); /* frees the zombie KvGet call too (ASan checks) */
    f->srv = NULL;
}

static void test_stats_count_calls_by_method_and_code(void **state)
{
    fixture_t *f = *state;
    Pcs__V1__RegisterResponse *resp = NULL;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(do_register(f, "s", 5000, &resp, NULL), PCS_OK);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    assert_int_equal(do_register(f, "fail", 5000, &resp, NULL), PCS_ERR_STATE);
    Pcs__V1__KvGetRequest req = PCS__V1__KV_GET_REQUEST__INIT;
    ProtobufCMessage *r = NULL;
    pcs_rpc_call(f->cli, "/x.Y/Z", &req.base, &pcs__v1__kv_get_response__descriptor, 5000, &r,
                 NULL);
    stop_server(f);
    pcs_rpc_method_stats_t rows[8];
    size_t n = pcs_rpc_server_stats(f->srv, rows, 8);
    assert_int_equal(n, 6);
    assert_string_equal(rows[0].path, PCS_M_REGISTER);
    assert_int_equal(rows[0].calls_by_code[GRPC_STATUS_OK], 3);
    assert_int_equal(rows[0].calls_by_code[GRPC_STATUS_FAILED_PRECONDITION], 1);
    uint64_t in_buckets = 0;
    for (int b = 0; b < PCS_RPC_LAT_BUCKETS; b++)
        in_buckets += rows[0].latency_bucket[b];
    assert_int_equal(in_buckets, 4);
    assert_true(rows[0].latency_sum_s > 0.0);
    assert_int_equal(rows[5].calls_by_code[GRPC_STATUS_UNIMPLEMENTED], 1);
    const double *bounds = pcs_rpc_latency_bounds_s();
    for (int b = 1; b < PCS_RPC_LAT_BUCKETS - 1; b++)
        assert_true(bounds[b] > bounds[b - 1]);
    pcs_rpc_server_destroy(f->srv);
    f->srv = NULL;
}

static void test_async_calls_all_complete_with_their_user_pointer(void **state)
{
    fixture_t *f = *state;
    pcs_rpc_async_t *a = NULL;
    assert_int_equal(pcs_rpc_async_create(f->cli, &a), PCS_OK);
    enum { N = 64 };
    int seen[N] = {0};
    char ids[N][16];
    for (int i = 0; i < N; i++) {
        Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
        snprintf(ids[i], sizeof ids[i], "a%d", i);
        req.identity = ids[i];
        req.pid = (uint32_t)i;
        assert_int_equal(pcs_rpc_async_start(a, PCS_M_REGISTER, &req.base,
                                             &pcs__v1__register_response__descriptor, 5000,
                                             &seen[i]),
                         PCS_OK);
    }
    assert_int_equal(pcs_rpc_async_in_flight(a), N);
    for (int k = 0; k < N; k++) {
        void *user = NULL;
        pcs_status_t st;
        Pcs__V1__RegisterResponse *resp = NULL;
        assert_int_equal(pcs_rpc_async_next(a, 5000, &user, &st, (ProtobufCMessage **)&resp, NULL),
                         PCS_OK);
        assert_int_equal(st, PCS_OK);
        int i = (int)((int *)user - seen);
        assert_true(i >= 0 && i < N);
        char want[64];
        snprintf(want, sizeof want, "w-a%d-%d", i, i);
        assert_string_equal(resp->worker_id, want);
        seen[i]++;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    pcs_rpc_async_destroy(a);
}

static void test_unreachable_server_is_remote_error(void **state)
{
    (void)state;
    /* bind a server, note its port, destroy it: nothing listens there now */
    pcs_rpc_server_config_t cfg = {.listen = "127.0.0.1:0", .methods = methods, .n_methods = 1};
    pcs_rpc_server_t *srv = NULL;
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pcs_rpc_server_port(srv));
    pcs_rpc_server_destroy(srv);
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(addr, &c), PCS_OK);
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    assert_int_equal(pcs_rpc_call(c, PCS_M_REGISTER, &req.base,
                                  &pcs__v1__register_response__descriptor, 2000, &resp, &code),
                     PCS_ERR_REMOTE);
    assert_int_equal(code, GRPC_STATUS_UNAVAILABLE);
    assert_non_null(strstr(pcs_last_error(), "UNAVAILABLE"));
    pcs_rpc_client_destroy(c);
}

static void test_server_create_rejects_bad_tables_and_addresses(void **state)
{
    (void)state;
    pcs_rpc_server_t *srv = (void *)1;
    pcs_rpc_method_t dup[2] = {methods[0], methods[0]};
    pcs_rpc_server_config_t cfg = {.listen = "127.0.0.1:0", .methods = dup, .n_methods = 2};
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_INVALID_ARG);
    assert_null(srv);
    assert_non_null(strstr(pcs_last_error(), "listed twice"));
    pcs_rpc_method_t nohandler = methods[0];
    nohandler.handler = NULL;
    cfg.methods = &nohandler;
    cfg.n_methods = 1;
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_INVALID_ARG);
    cfg.methods = methods;
    cfg.listen = "";
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_INVALID_ARG);
    cfg.listen = "not-an-address:xyz";
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_SYSTEM);
    assert_null(srv);
    pcs_rpc_client_t *c = (void *)1;
    assert_int_equal(pcs_rpc_client_create("", &c), PCS_ERR_INVALID_ARG);
    assert_null(c);
}

// ---- TLS ----

typedef struct certs {
    char *dir;
    char ca[512], srv_cert[512], srv_key[512], cli_cert[512], cli_key[512], other_ca[512];
} certs_t;

/* A test CA, a server cert for localhost/127.0.0.1 and a client cert, made with the openssl CLI
 * (P-256 keys: fast). Returns 0 if openssl is not available. */
static int make_certs(certs_t *c)
{
    c->dir = pcs_test_tmpdir("rpc-tls");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd %s && ( printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > san.ext && "
             "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes' && "
             "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=pcs-test-ca && "
             "openssl req -x509 $K -keyout other.key -out other.pem -days 2 -subj /CN=other-ca && "
             "openssl req $K -keyout srv.key -out srv.csr -subj /CN=localhost && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
             "-extfile san.ext -out srv.pem && "
             "openssl req $K -keyout cli.key -out cli.csr -subj /CN=worker-0 && "
             "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
             "-out cli.pem ) >openssl.log 2>&1",
             c->dir);
    int status = -1;
    char *out = pcs_test_run(cmd, &status);
    free(out);
    snprintf(c->ca, sizeof c->ca, "%s/ca.pem", c->dir);
    snprintf(c->other_ca, sizeof c->other_ca, "%s/other.pem", c->dir);
    snprintf(c->srv_cert, sizeof c->srv_cert, "%s/srv.pem", c->dir);
    snprintf(c->srv_key, sizeof c->srv_key, "%s/srv.key", c->dir);
    snprintf(c->cli_cert, sizeof c->cli_cert, "%s/cli.pem", c->dir);
    snprintf(c->cli_key, sizeof c->cli_key, "%s/cli.key", c->dir);
    return status == 0;
}

static void free_certs(certs_t *c)
{
    pcs_test_rmtree(c->dir);
    free(c->dir);
}

typedef struct tls_server {
    fixture_t f;
    pcs_rpc_server_t *srv;
    pthread_t th;
    int port;
} tls_server_t;

static void *serve_plain(void *arg)
{
    pcs_rpc_server_run(arg);
    return NULL;
}

static void tls_server_start(tls_server_t *t, const pcs_rpc_tls_t *tls)
{
    memset(t, 0, sizeof *t);
    pcs_rpc_server_config_t cfg = {
        .listen = "127.0.0.1:0", .methods = methods, .n_methods = 1, .user = &t->f, .tls = tls};
    assert_int_equal(pcs_rpc_server_create(&cfg, &t->srv), PCS_OK);
    t->port = pcs_rpc_server_port(t->srv);
    pthread_create(&t->th, NULL, serve_plain, t->srv);
}

static void tls_server_stop(tls_server_t *t)
{
    pcs_rpc_server_stop(t->srv);
    pthread_join(t->th, NULL);
    pcs_rpc_server_destroy(t->srv);
}

/* Register over a fresh client; returns the status. */
static pcs_status_t register_via(int port, const pcs_rpc_tls_t *tls)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pcs_rpc_client_t *c = NULL;
    pcs_status_t st = pcs_rpc_client_create_tls(addr, tls, &c);
    if (st != PCS_OK)
        return st;
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    req.identity = "tls";
    ProtobufCMessage *resp = NULL;
    st = pcs_rpc_call(c, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor, 5000,
                      &resp, NULL);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    pcs_rpc_client_destroy(c);
    return st;
}

static void test_tls_server_serves_tls_clients_and_refuses_plaintext(void **state)
{
    (void)state;
    certs_t c;
    if (!make_certs(&c)) {
        free_certs(&c);
        skip(); /* no openssl CLI on this machine */
    }
    pcs_rpc_tls_t stls = {.cert_file = c.srv_cert, .key_file = c.srv_key};
    tls_server_t t;
    tls_server_start(&t, &stls);
    pcs_rpc_tls_t ctls = {.ca_file = c.ca};
    assert_int_equal(register_via(t.port, &ctls), PCS_OK);
    ctls.target_name_override = "localhost";
    assert_int_equal(register_via(t.port, &ctls), PCS_OK);
    /* plaintext client, and a client that trusts another CA, cannot talk to it */
    assert_int_equal(register_via(t.port, NULL), PCS_ERR_REMOTE);
    pcs_rpc_tls_t wrong = {.ca_file = c.other_ca};
    assert_int_equal(register_via(t.port, &wrong), PCS_ERR_REMOTE);
    /* the name in the certificate is checked */
    pcs_rpc_tls_t badname = {.ca_file = c.ca, .target_name_override = "coordinator.example"};
    assert_int_equal(register_via(t.port, &badname), PCS_ERR_REMOTE);
    tls_server_stop(&t);
    free_certs(&c);
}

static void test_mtls_server_requires_a_client_certificate(void **state)
{
    (void)state;
    certs_t c;
    if (!make_certs(&c)) {
        free_certs(&c);
        skip();
    }
    pcs_rpc_tls_t stls = {.cert_file = c.srv_cert, .key_file = c.srv_key, .ca_file = c.ca};
    tls_server_t t;
    tls_server_start(&t, &stls);
    pcs_rpc_tls_t nocert = {.ca_file = c.ca};
    assert_int_not_equal(register_via(t.port, &nocert), PCS_OK);
    pcs_rpc_tls_t withcert = {.ca_file = c.ca, .cert_file = c.cli_cert, .key_file = c.cli_key};
    assert_int_equal(register_via(t.port, &withcert), PCS_OK);
    tls_server_stop(&t);
    free_certs(&c);
}

static void test_tls_bad_files_are_invalid_arg_naming_the_file(void **state)
{
    (void)state;
    pcs_rpc_tls_t missing = {.cert_file = "/nonexistent/srv.pem", .key_file = "/nonexistent/k"};
    pcs_rpc_server_config_t cfg = {
        .listen = "127.0.0.1:0", .methods = methods, .n_methods = 1, .tls = &missing};
    pcs_rpc_server_t *srv = (void *)1;
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_INVALID_ARG);
    assert_null(srv);
    assert_non_null(strstr(pcs_last_error(), "/nonexistent/srv.pem"));
    pcs_rpc_tls_t nokey = {.cert_file = "/etc/hostname"};
    cfg.tls = &nokey;
    assert_int_equal(pcs_rpc_server_create(&cfg, &srv), PCS_ERR_INVALID_ARG);
    pcs_rpc_tls_t notpem = {.ca_file = "/etc/hostname"};
    pcs_rpc_client_t *cl = (void *)1;
    assert_int_equal(pcs_rpc_client_create_tls("127.0.0.1:1", &notpem, &cl), PCS_ERR_INVALID_ARG);
    assert_null(cl);
    assert_non_null(strstr(pcs_last_error(), "not a PEM file"));
}

static void test_grpc_codes_map_to_status_and_names(void **state)
{
    (void)state;
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_OK), PCS_OK);
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_INVALID_ARGUMENT), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_DEADLINE_EXCEEDED), PCS_ERR_TIMEOUT);
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_UNAVAILABLE), PCS_ERR_REMOTE);
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_NOT_FOUND), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_status_from_grpc(GRPC_STATUS_UNIMPLEMENTED), PCS_ERR_UNSUPPORTED);
    assert_int_equal(pcs_status_from_grpc(99), PCS_ERR_INTERNAL);
    /* every pcs status round-trips to its own class through gRPC */
    for (int s = 1; s < PCS_STATUS_COUNT; s++) {
        int code = pcs_status_to_grpc((pcs_status_t)s);
        assert_int_equal(pcs_status_to_grpc(pcs_status_from_grpc(code)), code);
    }
    assert_string_equal(pcs_grpc_code_name(3), "INVALID_ARGUMENT");
    assert_string_equal(pcs_grpc_code_name(16), "UNAUTHENTICATED");
    assert_string_equal(pcs_grpc_code_name(-1), "UNKNOWN_CODE");
    size_t n = 0;
    const pcs_rpc_method_info_t *known = pcs_rpc_known_methods(&n);
    assert_true(n >= 17);
    assert_ptr_equal(pcs_rpc_method_lookup(PCS_M_KV_GET), &known[4]);
    assert_null(pcs_rpc_method_lookup("/nope"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_call_returns_the_handler_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bearer_token_reaches_the_handler_as_metadata, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_handler_failure_maps_status_to_grpc_code_and_details,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_reply_is_sent_later_from_tick, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_empty_request_message_decodes_as_defaults, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stream_delivers_n_messages_in_order_then_ok, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stream_failure_after_messages_maps_status_and_details,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_next_timeout_leaves_stream_usable, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_client_cancel_mid_stream_runs_on_cancel_and_server_keeps_serving, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_client_deadline_on_pending_call_times_out_and_runs_on_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pending_call_is_answered_from_another_handler, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_cancel_hook_may_end_its_own_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_request_bytes_are_invalid_argument, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_oversized_request_is_resource_exhausted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unknown_method_is_unimplemented, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_shutdown_with_pending_call_runs_on_cancel_and_fails_the_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_count_calls_by_method_and_code, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_calls_all_complete_with_their_user_pointer,
                                        setup, teardown),
        cmocka_unit_test(test_unreachable_server_is_remote_error),
        cmocka_unit_test(test_server_create_rejects_bad_tables_and_addresses),
        cmocka_unit_test(test_grpc_codes_map_to_status_and_names),
        cmocka_unit_test(test_tls_server_serves_tls_clients_and_refuses_plaintext),
        cmocka_unit_test(test_mtls_server_requires_a_client_certificate),
        cmocka_unit_test(test_tls_bad_files_are_invalid_arg_naming_the_file),
    };
    return cmocka_run_group_tests_name("rpc", tests, NULL, NULL);
}
