/* NCCL backend of pcs_coll (device buffers). Group rank 0 creates the unique id and publishes it
 * through the KV store; the others fetch it; the communicator is non-blocking so that init and
 * every call can be bounded by the timeout and ncclCommAbort can stop them. Collectives run on
 * a dedicated stream ordered after the caller's stream with events and the caller's stream waits
 * for them the same way: no host synchronization (llm.c zero.cuh). Only this file and kernels/
 * see CUDA/NCCL headers. Built only when CMake found nvcc and nccl.h. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "pcs/clock.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/mem.h"

#define MAX_GROUP_STREAMS 16

typedef struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream; /* dedicated collective stream */
    cudaEvent_t ev_in;   /* caller stream -> collective stream */
    cudaEvent_t ev_out;  /* collective stream -> caller stream */
    int rank, size, device;
    int timeout_ms;
    int in_group;
    cudaStream_t group_streams[MAX_GROUP_STREAMS];
    int n_group_streams;
    const pcs_backend_ops_t *kernels; /* "cuda" backend, for the post-divide scale */
    pthread_mutex_t mu;               /* guards aborted, busy and the comm handle against abort() */
    int aborted;
    int busy; /* an operation is inside NCCL: abort() leaves ncclCommAbort to it */
} nccl_comm_t;

// ---- error helpers ----

static pcs_status_t nccl_fail(nccl_comm_t *n, ncclResult_t r, const char *what)
{
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : ncclGetLastError(NULL);
    pcs_status_t st = r == ncclRemoteError || r == ncclSystemError ? PCS_ERR_REMOTE : PCS_ERR_NCCL;
    PCS_WARN(PCS_SUB_COLL, "%s: %s (%d)%s%s", what, ncclGetErrorString(r), (int)r,
             last && last[0] ? ": " : "", last ? last : "");
    return pcs_set_error(st, "%s: %s%s%s", what, ncclGetErrorString(r), last && last[0] ? ": " : "",
                         last ? last : "");
}

static pcs_status_t cuda_fail(cudaError_t e, const char *what)
{
    PCS_WARN(PCS_SUB_COLL, "%s: %s", what, cudaGetErrorString(e));
    return pcs_set_error(PCS_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, what);                                                            \
    } while (0)

static int is_aborted(nccl_comm_t *n)
{
    pthread_mutex_lock(&n->mu);
    int a = n->aborted;
    pthread_mutex_unlock(&n->mu);
    return a;
}

/* A non-blocking communicator returns ncclInProgress; poll its async state until it settles,
 * the timeout passes (then abort it: NCCL has no other way to give up) or someone aborts. */
static pcs_status_t settle(nccl_comm_t *n, ncclResult_t r, const char *what)
{
    uint64_t deadline = pcs_now_ms() + (uint64_t)n->timeout_ms;
    while (r == ncclInProgress) {
        if (is_aborted(n))
            return pcs_set_error(PCS_ERR_CANCELLED, "%s: aborted", what);
        if (pcs_now_ms() > deadline) {
            /* leave() aborts the communicator: NCCL has no other way to give up */
            pthread_mutex_lock(&n->mu);
            n->aborted = 1;
            pthread_mutex_unlock(&n->mu);
            return pcs_set_error(PCS_ERR_TIMEOUT,
                                 "%s: no progress within %d ms (a peer rank "
                                 "is missing or dead; NCCL does not say which)",
                                 what, n->timeout_ms);
        }
        usleep(100);
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &r);
        if (q != ncclSuccess)
            r = q;
    }
    if (r != ncclSuccess)
        return nccl_fail(n, r, what);
    return PCS_OK;
}

static pcs_status_t check_async(nccl_comm_t *n, const char *what)
{
    if (is_aborted(n) || !n->comm)
        return pcs_set_error(PCS_ERR_CANCELLED, "%s: communicator aborted", what);
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &a);
    if (r != ncclSuccess)
        return nccl_fail(n, r, what);
    if (a != ncclSuccess && a != ncclInProgress)
        return nccl_fail(n, a, what);
    return PCS_OK;
}

static void enter(nccl_comm_t *n)
{
    pthread_mutex_lock(&n->mu);
    n->busy++;
    pthread_mutex_unlock(&n->mu);
}

static pcs_status_t leave(nccl_comm_t *n, pcs_status_t rc)
{
    ncclComm_t dead = NULL;
    pthread_mutex_lock(&n->mu);
    n->busy--;
    if (n->aborted && n->busy == 0) {
        dead = n->comm;
        n->comm = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    if (dead)
        ncclCommAbort(dead);
    return rc;
}

static ncclDataType_t nccl_dtype(pcs_dtype_t dt)
{
    switch (dt) {
    case PCS_DTYPE_BF16:
        return ncclBfloat16;
    case PCS_DTYPE_FP16:
        return ncclFloat16;
    case PCS_DTYPE_FP64:
        return ncclFloat64;
    case PCS_DTYPE_INT64:
        return ncclInt64;
    default:
        return ncclFloat32;
    }
}

// ---- stream ordering ----

/* The collective stream waits for everything queued so far on the caller's stream. */
static pcs_status_t order_in(nccl_comm_t *n, pcs_coll_stream_t s)
{
    cudaStream_t us = (cudaStream_t)s;
    CUDA_TRY(cudaEventRecord(n->ev_in, us), "cudaEventRecord(in)");
    CUDA_TRY(cudaStreamWaitEvent(n->stream, n->ev_in, 0), "cudaStreamWaitEvent(coll)");
    if (n->in_group) {
        for (int i = 0; i < n->n_group_streams; i++)
            if (n->group_streams[i] == us)
                return PCS_OK;
        if (n->n_group_streams == MAX_GROUP_STREAMS)
            return pcs_set_error(PCS_ERR_LIMIT, "nccl group: more than %d caller streams",
                                 MAX_GROUP_STREAMS);
        n->group_streams[n->n_group_streams++] = us;
    }
    return PCS_OK;
}

/* The caller's stream waits for the collective (work queued later on it sees the result). */
static pcs_status_t order_out(nccl_comm_t *n, cudaStream_t us)
{
    CUDA_TRY(cudaEventRecord(n->ev_out, n->stream), "cudaEventRecord(out)");
    CUDA_TRY(cudaStreamWaitEvent(us, n->ev_out, 0), "cudaStreamWaitEvent(caller)");
    return PCS_OK;
}

static pcs_status_t after_op(nccl_comm_t *n, ncclResult_t r, pcs_coll_stream_t s, const char *what)
{
    PCS_CHECK(settle(n, r, what));
    if (n->in_group)
        return PCS_OK;
    return order_out(n, (cudaStream_t)s);
}

// ---- reductions ----

/* ncclRedOp for a reduction; a pre-divide becomes a PreMulSum op (destroyed by the caller via
 * *custom). AVG with a pre-divide multiplies once by 1/(pre*size) (one rounding where the Gloo
 * backend rounds twice: documented difference in kind). */
static pcs_status_t red_op(nccl_comm_t *n, pcs_dtype_t dt, const pcs_coll_red_t *red,
                           ncclRedOp_t *op, int *custom)
{
    *custom = 0;
    double f_pre = pcs_coll_div_factor(red->pre_div, dt);
    if (red->op == PCS_RED_MAX) {
        *op = ncclMax;
        return PCS_OK;
    }
    if (f_pre == 1.0) {
        *op = red->op == PCS_RED_AVG ? ncclAvg : ncclSum;
        return PCS_OK;
    }
    double f = 1.0 / red->pre_div;
    if (red->op == PCS_RED_AVG)
        f /= n->size;
    float f32 = (float)f;
    uint16_t h;
    void *scalar = &f32;
    if (dt == PCS_DTYPE_FP64) {
        scalar = &f; /* the double itself */
    } else if (dt == PCS_DTYPE_BF16) {
        h = pcs_f32_to_bf16(f32);
        scalar = &h;
    } else if (dt == PCS_DTYPE_FP16) {
        h = pcs_f32_to_fp16(f32);
        scalar = &h;
    }
    ncclResult_t r =
        ncclRedOpCreatePreMulSum(op, scalar, nccl_dtype(dt), ncclScalarHostImmediate, n->comm);
    if (r != ncclSuccess)
        return nccl_fail(n, r, "ncclRedOpCreatePreMulSum");
    *custom = 1;
    return PCS_OK;
}

static pcs_status_t post_divide(nccl_comm_t *n, void *buf, size_t count, pcs_dtype_t dt,
                                const pcs_coll_red_t *red)
{
    double f = pcs_coll_div_factor(red->post_div, dt);
    if (f == 1.0 || count == 0)
        return PCS_OK;
    if (n->in_group)
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "nccl: a post-divide inside a group call is not supported");
    if (!n->kernels)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "nccl: post-divide needs the cuda kernels");
    return pcs_kernel_scale(n->kernels, buf, dt, count, f, (pcs_stream_t)n->stream);
}

// ---- ops ----

static pcs_status_t n_all_gather_body(void *impl, const void *in, void *out, size_t count,
                                      pcs_dtype_t dt, pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "all_gather"));
    if (count == 0)
        return PCS_OK;
    PCS_CHECK(order_in(n, s));
    /* moved as bytes so that every dtype works */
    ncclResult_t r =
        ncclAllGather(in, out, count * pcs_dtype_size(dt), ncclUint8, n->comm, n->stream);
    return after_op(n, r, s, "ncclAllGather");
}

static pcs_status_t n_reduce_scatter_body(void *impl, const void *in, void *out, size_t rc,
                                          pcs_dtype_t dt, const pcs_coll_red_t *red,
                                          pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "reduce_scatter"));
    if (rc == 0)
        return PCS_OK;
    ncclRedOp_t op;
    int custom;
    PCS_CHECK(order_in(n, s));
    PCS_CHECK(red_op(n, dt, red, &op, &custom));
    ncclResult_t r = ncclReduceScatter(in, out, rc, nccl_dtype(dt), op, n->comm, n->stream);
    if (custom)
        ncclRedOpDestroy(op, n->comm);
    PCS_CHECK(settle(n, r, "ncclReduceScatter"));
    PCS_CHECK(post_divide(n, out, rc, dt, red));
    return n->in_group ? PCS_OK : order_out(n, (cudaStream_t)s);
}

static pcs_status_t n_all_reduce_body(void *impl, const void *in, void *out, size_t count,
                                      pcs_dtype_t dt, const pcs_coll_red_t *red,
                                      pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "all_reduce"));
    if (count == 0)
        return PCS_OK;
    ncclRedOp_t op;
    int custom;
    PCS_CHECK(order_in(n, s));
    PCS_CHECK(red_op(n, dt, red, &op, &custom));
    ncclResult_t r = ncclAllReduce(in, out, count, nccl_dtype(dt), op, n->comm, n->stream);
    if (custom)
        ncclRedOpDestroy(op, n->comm);
    PCS_CHECK(settle(n, r, "ncclAllReduce"));
    PCS_CHECK(post_divide(n, out, count, dt, red));
    return n->in_group ? PCS_OK : order_out(n, (cudaStream_t)s);
}

static pcs_status_t n_broadcast_body(void *impl, void *buf, size_t count, pcs_dtype_t dt, int root,
                                     pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "broadcast"));
    if (count == 0)
        return PCS_OK;
    PCS_CHECK(order_in(n, s));
    ncclResult_t r =
        ncclBroadcast(buf, buf, count * pcs_dtype_size(dt), ncclUint8, root, n->comm, n->stream);
    return after_op(n, r, s, "ncclBroadcast");
}

static pcs_status_t n_send_body(void *impl, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                                pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "send"));
    if (count == 0)
        return PCS_OK;
    PCS_CHECK(order_in(n, s));
    ncclResult_t r = ncclSend(buf, count * pcs_dtype_size(dt), ncclUint8, peer, n->comm, n->stream);
    return after_op(n, r, s, "ncclSend");
}

static pcs_status_t n_recv_body(void *impl, void *buf, size_t count, pcs_dtype_t dt, int peer,
                                pcs_coll_stream_t s)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "recv"));
    if (count == 0)
        return PCS_OK;
    PCS_CHECK(order_in(n, s));
    ncclResult_t r = ncclRecv(buf, count * pcs_dtype_size(dt), ncclUint8, peer, n->comm, n->stream);
    return after_op(n, r, s, "ncclRecv");
}

/* A one-element all-reduce on the collective stream, then a bounded host wait for it: the only
 * NCCL call that synchronizes the host, and it fails after the timeout instead of hanging. */
static pcs_status_t n_barrier_body(void *impl)
{
    nccl_comm_t *n = impl;
    PCS_CHECK(check_async(n, "barrier"));
    float *d = NULL;
    CUDA_TRY(cudaMallocAsync((void **)&d, sizeof(float), n->stream), "cudaMallocAsync");
    ncclResult_t r = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, n->comm, n->stream);
    pcs_status_t rc = settle(n, r, "barrier");
    if (rc != PCS_OK)
        return rc;
    cudaFreeAsync(d, n->stream);
    uint64_t deadline = pcs_now_ms() + (uint64_t)n->timeout_ms;
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess)
            return PCS_OK;
        if (e != cudaErrorNotReady)
            return cuda_fail(e, "barrier: cudaStreamQuery");
        /* "not ready" is a status, not a failure: clear it from this thread's last error (as
         * c10's CUDAStream::query does), or the caller's next launch check (cudaGetLastError
         * after a kernel launch, kernels/) could report it as a launch failure */
        (void)cudaGetLastError();
        PCS_CHECK(check_async(n, "barrier"));
        if (pcs_now_ms() > deadline)
            return pcs_set_error(PCS_ERR_TIMEOUT,
                                 "barrier: not complete within %d ms (a peer "
                                 "rank is missing or dead)",
                                 n->timeout_ms);
        usleep(200);
    }
}

static pcs_status_t n_group_start(void *impl)
{
    nccl_comm_t *n = impl;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return nccl_fail(n, r, "ncclGroupStart");
    n->in_group = 1;
    n->n_group_streams = 0;
    return PCS_OK;
}

static pcs_status_t n_group_end_body(void *impl)
{
    nccl_comm_t *n = impl;
    n->in_group = 0;
    ncclResult_t r = ncclGroupEnd();
    PCS_CHECK(settle(n, r, "ncclGroupEnd"));
    for (int i = 0; i < n->n_group_streams; i++)
        PCS_CHECK(order_out(n, n->group_streams[i]));
    n->n_group_streams = 0;
    return PCS_OK;
}

// ---- entry points: every operation is bracketed by enter/leave (see n_abort) ----

static pcs_status_t n_all_gather(void *impl, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_all_gather_body(impl, in, out, count, dt, s));
}

static pcs_status_t n_reduce_scatter(void *impl, const void *in, void *out, size_t rc,
                                     pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_reduce_scatter_body(impl, in, out, rc, dt, red, s));
}

static pcs_status_t n_all_reduce(void *impl, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_all_reduce_body(impl, in, out, count, dt, red, s));
}

static pcs_status_t n_broadcast(void *impl, void *buf, size_t count, pcs_dtype_t dt, int root,
                                pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_broadcast_body(impl, buf, count, dt, root, s));
}

static pcs_status_t n_send(void *impl, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_send_body(impl, buf, count, dt, peer, s));
}

static pcs_status_t n_recv(void *impl, void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s)
{
    enter(impl);
    return leave(impl, n_recv_body(impl, buf, count, dt, peer, s));
}

static pcs_status_t n_barrier(void *impl)
{
    enter(impl);
    return leave(impl, n_barrier_body(impl));
}

static pcs_status_t n_group_end(void *impl)
{
    enter(impl);
    return leave(impl, n_group_end_body(impl));
}

/* abort() may come from any thread while an operation polls the communicator: if one is inside
 * NCCL it sees `aborted` within ~100 us and leave() calls ncclCommAbort once it is out, so the
 * handle is never freed under a running call; otherwise abort() calls it here. */
static void n_abort(void *impl, const char *reason)
{
    nccl_comm_t *n = impl;
    ncclComm_t dead = NULL;
    pthread_mutex_lock(&n->mu);
    int first = !n->aborted;
    n->aborted = 1;
    if (!n->busy) {
        dead = n->comm;
        n->comm = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    if (first)
        PCS_INFO(PCS_SUB_COLL, "nccl rank %d/%d abort: %s", n->rank, n->size, reason);
    if (dead)
        ncclCommAbort(dead);
}

static void n_destroy(void *impl)
{
    nccl_comm_t *n = impl;
    if (!n)
        return;
    if (n->comm && n->aborted) {
        ncclCommAbort(n->comm); /* timed out or aborted (also during init) */
    } else if (n->comm) {
        /* A healthy communicator is finalized (flushes queued work; non-blocking, so poll),
         * then destroyed; if that fails or hangs it is aborted. */
        ncclResult_t r = ncclCommFinalize(n->comm);
        ncclResult_t a = r;
        uint64_t deadline = pcs_now_ms() + (uint64_t)n->timeout_ms;
        while (a == ncclInProgress && pcs_now_ms() < deadline) {
            usleep(100);
            if (ncclCommGetAsyncError(n->comm, &a) != ncclSuccess)
                break;
        }
        if (a == ncclSuccess)
            ncclCommDestroy(n->comm);
        else
            ncclCommAbort(n->comm);
    }
    if (n->ev_in)
        cudaEventDestroy(n->ev_in);
    if (n->ev_out)
        cudaEventDestroy(n->ev_out);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

static const pcs_coll_ops_t nccl_ops = {
    "nccl", n_all_gather, n_reduce_scatter, n_all_reduce, n_broadcast, n_send,
    n_recv, n_barrier,    n_group_start,    n_group_end,  n_abort,     n_destroy,
    NULL, /* blame: NCCL does not say which peer failed */
};

// ---- create ----

/* Rank 0 makes the id (its process hosts NCCL's bootstrap root until init completes) and
 * publishes it; the others wait for it for up to the timeout. */
static pcs_status_t exchange_id(const pcs_coll_config_t *cfg, const char *prefix, ncclUniqueId *id)
{
    char key[160];
    snprintf(key, sizeof key, "%snccl/unique_id", prefix);
    if (cfg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return nccl_fail(NULL, r, "ncclGetUniqueId");
        return pcs_kv_set(cfg->kv, key, id, sizeof *id);
    }
    void *val = NULL;
    size_t len = 0;
    pcs_status_t rc = pcs_kv_get(cfg->kv, key, cfg->timeout_ms, &val, &len);
    if (rc == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_TIMEOUT,
                             "nccl: rank 0 did not publish the unique id under "
                             "'%s' within %d ms",
                             key, cfg->timeout_ms);
    PCS_CHECK(rc);
    if (len != sizeof *id) {
        free(val);
        return pcs_set_error(PCS_ERR_REMOTE, "nccl: unique id under '%s' has %zu bytes, want %zu",
                             key, len, sizeof *id);
    }
    memcpy(id, val, sizeof *id);
    free(val);
    return PCS_OK;
}

pcs_status_t pcs_coll_nccl_create(const pcs_coll_config_t *cfg, const char *key_prefix,
                                  const pcs_coll_ops_t **ops, void **impl)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "nccl: no CUDA device (%s)",
                             ce != cudaSuccess ? cudaGetErrorString(ce) : "count 0");
    if (cfg->cuda_device >= ndev)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nccl: device %d of %d", cfg->cuda_device, ndev);
    if (!cfg->kv)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nccl: a KV store is needed");
    if (cfg->cuda_device >= 0)
        CUDA_TRY(cudaSetDevice(cfg->cuda_device), "cudaSetDevice");

    pcs_status_t rc;
    nccl_comm_t *n = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *n, (void **)&n));
    pthread_mutex_init(&n->mu, NULL);
    n->rank = cfg->rank;
    n->size = cfg->size;
    n->timeout_ms = cfg->timeout_ms;
    cudaGetDevice(&n->device);
    if (pcs_backend_get("cuda", &n->kernels) != PCS_OK)
        n->kernels = NULL; /* only post-divides need it; they then report UNSUPPORTED */
    if ((ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&n->ev_in, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&n->ev_out, cudaEventDisableTiming)) != cudaSuccess) {
        rc = cuda_fail(ce, "nccl: stream/event create");
        goto fail;
    }
    ncclUniqueId id;
    PCS_CHECK_GOTO(exchange_id(cfg, key_prefix, &id), rc, fail);
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    conf.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, cfg->size, id, cfg->rank, &conf);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_fail(n, r, "ncclCommInitRankConfig");
        goto fail;
    }
    PCS_CHECK_GOTO(settle(n, ncclInProgress, "ncclCommInitRankConfig"), rc, fail);
    *ops = &nccl_ops;
    *impl = n;
    return PCS_OK;
fail:
    n_destroy(n);
    return rc;
}
