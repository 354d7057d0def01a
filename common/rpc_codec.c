/* The one protobuf-c <-> grpc_byte_buffer codec (STYLE.md B7): every request and reply of every
 * method goes through pcs_rpc_encode / pcs_rpc_decode by descriptor, so size limits and decode
 * errors are checked in one place. Also the table of known methods and the gRPC code names and
 * mapping. No per-method code lives here. */
#include "rpc_internal.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/log.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"

// ---- codec ----

pcs_status_t pcs_rpc_encode(const ProtobufCMessage *m, size_t max_bytes, grpc_byte_buffer **out)
{
    *out = NULL;
    if (!m || !m->descriptor || m->descriptor->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "encode: not a protobuf-c message");
    size_t n = protobuf_c_message_get_packed_size(m);
    if (max_bytes && n > max_bytes)
        return pcs_set_error(PCS_ERR_LIMIT, "%s: packed size %zu bytes exceeds the limit of %zu",
                             m->descriptor->name, n, max_bytes);
    grpc_slice s = grpc_slice_malloc(n);
    size_t w = protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    if (w != n) {
        grpc_slice_unref(s);
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: packed %zu bytes, expected %zu",
                             m->descriptor->name, w, n);
    }
    *out = grpc_raw_byte_buffer_create(&s, 1); /* takes its own reference */
    grpc_slice_unref(s);
    return PCS_OK;
}

/* protobuf-c keeps unknown fields and packs them again; it accepts field number 0 (invalid in
 * protobuf, e.g. a non-canonical tag 0x82 0x00) on the way in but then writes a tag it rejects,
 * so a stored message would not decode later. Found by fuzz_rpc_decode; such input is refused. */
static int has_field_zero(const ProtobufCMessage *m, int depth)
{
    if (depth > 64)
        return 1;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + fd->offset);
            for (size_t k = 0; k < n; k++)
                if (arr[k] && has_field_zero(arr[k], depth + 1))
                    return 1;
            continue;
        }
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + fd->offset);
        if (sub && has_field_zero(sub, depth + 1))
            return 1;
    }
    return 0;
}

pcs_status_t pcs_rpc_decode_bytes(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                  size_t len, size_t max_bytes, ProtobufCMessage **out)
{
    *out = NULL;
    if (!desc)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "decode: no message descriptor");
    if (max_bytes && len > max_bytes)
        return pcs_set_error(PCS_ERR_LIMIT, "%s: message of %zu bytes exceeds the limit of %zu",
                             desc->name, len, max_bytes);
    /* protobuf-c wants a non-NULL pointer even for zero bytes */
    static const uint8_t empty[1];
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, len ? data : empty);
    if (!m)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: malformed protobuf (%zu bytes)", desc->name,
                             len);
    if (has_field_zero(m, 0)) {
        protobuf_c_message_free_unpacked(m, NULL);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: malformed protobuf (field number 0)",
                             desc->name);
    }
    *out = m;
    return PCS_OK;
}

pcs_status_t pcs_rpc_decode(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                            size_t max_bytes, ProtobufCMessage **out)
{
    *out = NULL;
    if (!bb)
        return pcs_rpc_decode_bytes(desc, NULL, 0, max_bytes, out);
    if (!desc)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "decode: no message descriptor");
    /* Check the wire length first so an oversized buffer is never flattened. */
    size_t wire = grpc_byte_buffer_length(bb);
    if (max_bytes && wire > max_bytes)
        return pcs_set_error(PCS_ERR_LIMIT, "%s: message of %zu bytes exceeds the limit of %zu",
                             desc->name, wire, max_bytes);
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) /* fails on a bad compressed payload */
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: unreadable (bad compression?) payload",
                             desc->name);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r); /* flattens and decompresses */
    grpc_byte_buffer_reader_destroy(&r);
    pcs_status_t st =
        pcs_rpc_decode_bytes(desc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), max_bytes, out);
    grpc_slice_unref(s);
    return st;
}

gpr_timespec pcs_rpc_deadline_ms(int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

// ---- known methods ----

static const pcs_rpc_method_info_t known_methods[] = {
    {PCS_M_REGISTER, &pcs__v1__register_request__descriptor,
     &pcs__v1__register_response__descriptor, 0},
    {PCS_M_HEARTBEAT, &pcs__v1__heartbeat_request__descriptor,
     &pcs__v1__heartbeat_response__descriptor, 0},
    {PCS_M_WATCH_ASSIGNMENT, &pcs__v1__watch_assignment_request__descriptor,
     &pcs__v1__assignment_event__descriptor, 1},
    {PCS_M_KV_SET, &pcs__v1__kv_set_request__descriptor, &pcs__v1__kv_set_response__descriptor, 0},
    {PCS_M_KV_GET, &pcs__v1__kv_get_request__descriptor, &pcs__v1__kv_get_response__descriptor, 0},
    {PCS_M_REPORT_STEP, &pcs__v1__report_step_request__descriptor,
     &pcs__v1__report_step_response__descriptor, 0},
    {PCS_M_DEREGISTER, &pcs__v1__deregister_request__descriptor,
     &pcs__v1__deregister_response__descriptor, 0},
    {PCS_M_SUBMIT_JOB, &pcs__v1__submit_job_request__descriptor,
     &pcs__v1__submit_job_response__descriptor, 0},
    {PCS_M_GET_JOB, &pcs__v1__get_job_request__descriptor, &pcs__v1__get_job_response__descriptor,
     0},
    {PCS_M_LIST_JOBS, &pcs__v1__list_jobs_request__descriptor,
     &pcs__v1__list_jobs_response__descriptor, 0},
    {PCS_M_CANCEL_JOB, &pcs__v1__cancel_job_request__descriptor,
     &pcs__v1__cancel_job_response__descriptor, 0},
    {PCS_M_GET_PLAN, &pcs__v1__get_plan_request__descriptor,
     &pcs__v1__get_plan_response__descriptor, 0},
    {PCS_M_DRY_RUN_PLAN, &pcs__v1__dry_run_plan_request__descriptor,
     &pcs__v1__dry_run_plan_response__descriptor, 0},
    {PCS_M_LIST_WORKERS, &pcs__v1__list_workers_request__descriptor,
     &pcs__v1__list_workers_response__descriptor, 0},
    {PCS_M_GET_STATUS, &pcs__v1__get_status_request__descriptor,
     &pcs__v1__get_status_response__descriptor, 0},
    {PCS_M_HEALTH_CHECK, &grpc__health__v1__health_check_request__descriptor,
     &grpc__health__v1__health_check_response__descriptor, 0},
    {PCS_M_HEALTH_WATCH, &grpc__health__v1__health_check_request__descriptor,
     &grpc__health__v1__health_check_response__descriptor, 1},
};

const pcs_rpc_method_info_t *pcs_rpc_known_methods(size_t *n)
{
    *n = sizeof known_methods / sizeof known_methods[0];
    return known_methods;
}

const pcs_rpc_method_info_t *pcs_rpc_method_lookup(const char *path)
{
    if (!path)
        return NULL;
    for (size_t i = 0; i < sizeof known_methods / sizeof known_methods[0]; i++)
        if (strcmp(known_methods[i].path, path) == 0)
            return &known_methods[i];
    return NULL;
}

// ---- gRPC status codes ----

static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *pcs_grpc_code_name(int code)
{
    if (code < 0 || (size_t)code >= sizeof code_names / sizeof code_names[0])
        return "UNKNOWN_CODE";
    return code_names[code];
}

pcs_status_t pcs_status_from_grpc(int code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return PCS_OK;
    case GRPC_STATUS_CANCELLED:
        return PCS_ERR_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
        return PCS_ERR_INVALID_ARG;
    case GRPC_STATUS_PERMISSION_DENIED:
        return PCS_ERR_PERMISSION;
    case GRPC_STATUS_UNAUTHENTICATED:
        return PCS_ERR_UNAUTHENTICATED;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return PCS_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return PCS_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
        return PCS_ERR_EXISTS;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return PCS_ERR_LIMIT;
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_ABORTED:
        return PCS_ERR_STATE;
    case GRPC_STATUS_UNIMPLEMENTED:
        return PCS_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE:
        return PCS_ERR_REMOTE;
    default:
        return PCS_ERR_INTERNAL; /* UNKNOWN, INTERNAL, DATA_LOSS, anything newer */
    }
}
