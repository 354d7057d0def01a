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
#define PCS_M_REGISTER "/pcs.v1.WorkerService/Register"
#define PCS_M_HEARTBEAT "/pcs.v1.WorkerService/Heartbeat"
#define PCS_M_WATCH_ASSIGNMENT "/pcs.v1.WorkerService/WatchAssignment"
#define PCS_M_KV_SET "/pcs.v1.WorkerService/KvSet"
#define PCS_M_KV_GET "/pcs.v1.WorkerService/KvGet"
#define PCS_M_REPORT_STEP "/pcs.v1.WorkerService/ReportStep"
#define PCS_M_DEREGISTER "/pcs.v1.WorkerService/Deregister"
#define PCS_M_SUBMIT_JOB "/pcs.v1.JobService/SubmitJob"
#define PCS_M_GET_JOB "/pcs.v1.JobService/GetJob"
#define PCS_M_LIST_JOBS "/pcs.v1.JobService/ListJobs"
#define PCS_M_CANCEL_JOB "/pcs.v1.JobService/CancelJob"
#define PCS_M_GET_PLAN "/pcs.v1.JobService/GetPlan"
#define PCS_M_DRY_RUN_PLAN "/pcs.v1.JobService/DryRunPlan"
#define PCS_M_LIST_WORKERS "/pcs.v1.ClusterService/ListWorkers"
#define PCS_M_GET_STATUS "/pcs.v1.ClusterService/GetStatus"
#define PCS_M_HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define PCS_M_HEALTH_WATCH "/grpc.health.v1.Health/Watch"

/* ---- client ---- */
typedef struct pcs_rpc_client pcs_rpc_client_t;

/* Connect lazily to `target` ("127.0.0.1:7070", "unix:/path"). Caller destroys. */
pcs_status_t pcs_rpc_client_create(const char *target, pcs_rpc_client_t **out);
void pcs_rpc_client_destroy(pcs_rpc_client_t *c);

/* Unary call with a deadline. On PCS_OK *resp is the unpacked reply (free with
 * protobuf_c_message_free_unpacked(*resp, NULL)). On failure *resp is NULL, the status is mapped
 * from the gRPC code (INVALID_ARGUMENT -> PCS_ERR_INVALID_ARG, UNAVAILABLE -> PCS_ERR_REMOTE, ...)
 * and pcs_last_error() holds "<CODE_NAME>: <details>". grpc_code (may be NULL) gets the raw code. */
pcs_status_t pcs_rpc_call(pcs_rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                          ProtobufCMessage **resp, int *grpc_code);

/* Server streaming. open sends the request; next waits up to timeout_ms (<0: forever) for the
 * next message: PCS_OK with *msg set, PCS_OK with *msg == NULL at a clean end of stream (the
 * final status is then in *grpc_code of close), PCS_ERR_TIMEOUT if nothing came in time (the
 * stream stays usable), or an error mapped from the stream's failure status. close cancels the
 * call if it is still open. */
typedef struct pcs_rpc_stream pcs_rpc_stream_t;
pcs_status_t pcs_rpc_stream_open(pcs_rpc_client_t *c, const char *method,
                                 const ProtobufCMessage *req, pcs_rpc_stream_t **out);
pcs_status_t pcs_rpc_stream_next(pcs_rpc_stream_t *s, const ProtobufCMessageDescriptor *desc,
                                 int timeout_ms, ProtobufCMessage **msg);
void pcs_rpc_stream_close(pcs_rpc_stream_t *s);

/* Name of a gRPC status code ("INVALID_ARGUMENT"). */
const char *pcs_grpc_code_name(int code);
/* Map a gRPC status code to pcs_status_t. */
pcs_status_t pcs_status_from_grpc(int code);

#ifdef __cplusplus
}
#endif
#endif
