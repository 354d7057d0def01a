/* Internal glue shared by common/rpc_{codec,server,client}.c (and the codec fuzz target): the
 * protobuf-c <-> grpc_byte_buffer codec, the completion-queue tag type and gpr time helpers.
 * Not installed and not for other modules: only common/rpc_* touch gRPC resources (STYLE.md B4). */
#ifndef PCS_RPC_INTERNAL_H
#define PCS_RPC_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/rpc.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default limit on a single message (request on the server, either way in the codec). */
#define PCS_RPC_DEFAULT_MAX_MESSAGE (4u << 20)
/* Client receive limit: plans of large models are big, so clients accept up to 64 MiB. */
#define PCS_RPC_CLIENT_MAX_RECEIVE (64u << 20)

/* Keepalive (both ends are ours, so they agree): clients ping every 20 s, also on idle streams
 * such as WatchAssignment, and drop a connection whose pings go unanswered for 10 s; the server
 * accepts pings every >= 10 s without calling them abuse (gRPC's default policy would answer
 * "too_many_pings" after two) and pings its clients every 60 s so a vanished worker's pending
 * calls end (on_cancel) instead of waiting forever. */
#define PCS_RPC_CLIENT_KEEPALIVE_MS         20000
#define PCS_RPC_CLIENT_KEEPALIVE_TIMEOUT_MS 10000
#define PCS_RPC_SERVER_MIN_PING_INTERVAL_MS 10000
#define PCS_RPC_SERVER_KEEPALIVE_MS         60000
#define PCS_RPC_SERVER_KEEPALIVE_TIMEOUT_MS 20000

/* Completion-queue tag (STYLE.md B7): embedded in the object it belongs to; the loop only calls
 * tag->on_done(tag, ok), with no switch on a type. */
typedef struct pcs_rpc_tag {
    void (*on_done)(struct pcs_rpc_tag *tag, bool ok);
} pcs_rpc_tag_t;

/* Pack `m` into a new byte buffer (*out; caller destroys with grpc_byte_buffer_destroy).
 * PCS_ERR_LIMIT if the packed size exceeds max_bytes (0 = no limit). */
pcs_status_t pcs_rpc_encode(const ProtobufCMessage *m, size_t max_bytes, grpc_byte_buffer **out);

/* Unpack `bb` as a `desc` message. bb == NULL (no payload) decodes as the empty message.
 * PCS_ERR_LIMIT if larger than max_bytes (0 = no limit), PCS_ERR_INVALID_ARG naming the message
 * type if the bytes do not decode. *out: free with protobuf_c_message_free_unpacked(*out, NULL). */
pcs_status_t pcs_rpc_decode(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                            size_t max_bytes, ProtobufCMessage **out);

/* Same as pcs_rpc_decode over plain bytes (no gRPC buffer). */
pcs_status_t pcs_rpc_decode_bytes(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                  size_t len, size_t max_bytes, ProtobufCMessage **out);

/* Credentials for a server / a channel from PEM files (tls NULL: insecure). Caller releases. */
pcs_status_t pcs_rpc_server_creds(const pcs_rpc_tls_t *tls, grpc_server_credentials **out);
pcs_status_t pcs_rpc_channel_creds(const pcs_rpc_tls_t *tls, grpc_channel_credentials **out);

/* Absolute monotonic deadline timeout_ms from now (timeout_ms < 0: infinite future). */
gpr_timespec pcs_rpc_deadline_ms(int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
