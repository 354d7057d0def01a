/* Collectives layer: one communicator per plan group (world, shard group, replicate group,
 * pipeline stage pair), rendezvous through a pcs_kv_t store (the coordinator's KV, or files in
 * tests). Backends sit behind pcs_coll_ops_t (STYLE.md B8): Gloo over TCP on host buffers
 * (coll_gloo.cc) and NCCL on device buffers (coll_nccl.c). This header is plain C.
 *
 * Numerics (both backends agree in kind; the Gloo backend is bit-exact to the order below):
 *  - Reductions run element-wise in the data type: every partial sum is rounded to the dtype
 *    (bf16/fp16 via fp32 and round-to-nearest-even, pcs/half.h), as NCCL's ring does.
 *  - Order: the chunk that rank r ends up owning is reduced along the ring starting at rank r+1:
 *    acc = x[r+1]; acc = rnd(x[r+2] op acc); ...; acc = rnd(x[r] op acc) (indices mod size; the
 *    arriving rank's value is the first operand, which MAX's signed zeros can tell apart).
 *    all_reduce splits the buffer into `size` chunks (the first count%size one element longer)
 *    and reduces chunk k in that order as well, then all-gathers.
 *  - AVG = NCCL's ncclAvg: each contribution is pre-multiplied by f = rnd(1/size) (rounded to
 *    the dtype once) and the products summed; MAX = fmaxf's rule (a NaN loses to a number) with
 *    a tie (+0 against -0 too) going to the first operand, the arriving rank's value (Gloo, both
 *    transports; NCCL's device max leaves the sign of a zero tie to the hardware).
 *  - pre_div / post_div (spec §4.2): x = rnd(x * (float)(1/pre)) on each input before the
 *    reduction, y = rnd(y * (float)(1/post)) on the result (PyTorch's CUDA div_ by a scalar
 *    multiplies by the fp32 reciprocal). Applied only when the factor is not 0 or 1.
 *    FSDP2's PREMUL_SUM(1/f) is {SUM, pre_div = f}: NCCL's ncclRedOpCreatePreMulSum computes the
 *    same per-contribution product rounded to the dtype. The NCCL backend folds AVG and pre_div
 *    into one pre-multiply by 1/(pre*size), rounding once instead of twice.
 *
 * Thread-safety: one thread issues operations on a communicator; pcs_coll_abort() may be called
 * from any thread at any time and wakes a blocked call with PCS_ERR_CANCELLED. */
#ifndef PCS_COLL_COLL_H
#define PCS_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "coll/kv.h"
#include "pcs/dtype.h"
#include "pcs/kernels.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pcs_coll_backend {
    PCS_COLL_GLOO = 1, /* host buffers, TCP */
    PCS_COLL_NCCL = 2  /* device buffers, CUDA streams */
} pcs_coll_backend_t;

typedef enum pcs_red_op { PCS_RED_SUM = 0, PCS_RED_AVG = 1, PCS_RED_MAX = 2 } pcs_red_op_t;

/* Reduction: op plus optional pre/post divide factors (0 or 1 = none). */
typedef struct pcs_coll_red {
    pcs_red_op_t op;
    double pre_div;
    double post_div;
} pcs_coll_red_t;

typedef struct pcs_coll_config {
    pcs_coll_backend_t backend;
    pcs_kv_t *kv;           /* borrowed; used during create and on the error path until destroy */
    const char *group_name; /* "world", "shard", "replicate", "pp"; part of the KV key prefix */
    int group_id;           /* distinguishes several groups of one kind (e.g. shard group 3) */
    int rank;               /* 0 <= rank < size */
    int size;
    int timeout_ms;       /* every call (and the rendezvous) fails after this; 0 = 30000 */
    const char *hostname; /* gloo: address to bind and publish (NULL = "127.0.0.1") */
    const char *iface;    /* gloo: interface name, overrides hostname when set (multi-host) */
    int cuda_device;      /* nccl: device ordinal; -1 = the current device */
    int transport;        /* gloo: PCS_COLL_TRANSPORT_AUTO (0) or PCS_COLL_TRANSPORT_TCP */
} pcs_coll_config_t;

/* Gloo transports. AUTO: the collectives (all_gather, reduce_scatter, all_reduce, broadcast,
 * barrier) run over shared memory when every rank of the communicator has the same locality key
 * (host, boot, IPC/PID/mount/net namespaces, uid; coll/shm.h) and each could create a segment in
 * /dev/shm, else over TCP; point-to-point always uses TCP. PCS_COLL_SHM=0 in the environment
 * forces TCP (NCCL_SHM_DISABLE's role); PCS_HOST_ID replaces the host part of the key. */
enum { PCS_COLL_TRANSPORT_AUTO = 0, PCS_COLL_TRANSPORT_TCP = 1 };

typedef struct pcs_coll pcs_coll_t;

/* The caller's stream (pcs/kernels.h; a cudaStream_t for NCCL; ignored by Gloo, pass NULL). */
typedef pcs_stream_t pcs_coll_stream_t;

/* Create a communicator: rendezvous under "<group_name>/<group_id>/" in the KV scope and connect
 * all ranks. Blocks until every rank joined or timeout_ms passed (PCS_ERR_TIMEOUT). The same
 * (kv scope, group_name, group_id) must not be reused for a second communicator. Errors:
 * INVALID_ARG (bad rank/size/names), UNSUPPORTED (NCCL not built), TIMEOUT, REMOTE, SYSTEM.
 * The Gloo backend sets SIGPIPE to SIG_IGN if it is SIG_DFL (a write to a dead peer must fail
 * with EPIPE, not kill the process), as Python does at startup. */
pcs_status_t pcs_coll_create(const pcs_coll_config_t *cfg, pcs_coll_t **out);

int pcs_coll_rank(const pcs_coll_t *c);
/* "shm" or "tcp" for a Gloo communicator (what its collectives use), "nccl" for NCCL. */
const char *pcs_coll_transport(const pcs_coll_t *c);
/* How many communicators of this process are alive now, by transport (for /metrics). */
enum { PCS_COLL_LIVE_SHM = 0, PCS_COLL_LIVE_TCP = 1, PCS_COLL_LIVE_NCCL = 2, PCS_COLL_LIVE_N = 3 };
void pcs_coll_live(unsigned counts[PCS_COLL_LIVE_N]);
int pcs_coll_size(const pcs_coll_t *c);
const char *pcs_coll_backend_name(const pcs_coll_t *c);

/* Every operation: `count` elements of `dt`; count 0 is a valid no-op that still synchronizes
 * nothing. Pointers may be NULL only when the byte count they cover is 0. A failure (timeout,
 * dead peer, abort) poisons the communicator: later calls return PCS_ERR_STATE with the first
 * error's text. Peer failures are PCS_ERR_REMOTE and timeouts PCS_ERR_TIMEOUT, with a message
 * naming the peer rank ("peer rank 2 closed the connection (process died?)"). */

/* out[r*count .. (r+1)*count) = in of rank r. in may equal out + rank*count (in place). */
pcs_status_t pcs_coll_all_gather(pcs_coll_t *c, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, pcs_coll_stream_t s);
/* in has size*recv_count elements; out (recv_count) = reduction of chunk `rank` of every rank's
 * in. fp32/bf16/fp16; ops SUM, AVG (MAX allowed too). */
pcs_status_t pcs_coll_reduce_scatter(pcs_coll_t *c, const void *in, void *out, size_t recv_count,
                                     pcs_dtype_t dt, const pcs_coll_red_t *red,
                                     pcs_coll_stream_t s);
/* out = reduction over ranks of in (count elements each). in may equal out. */
pcs_status_t pcs_coll_all_reduce(pcs_coll_t *c, const void *in, void *out, size_t count,
                                 pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s);
/* buf of every rank = buf of `root`. */
pcs_status_t pcs_coll_broadcast(pcs_coll_t *c, void *buf, size_t count, pcs_dtype_t dt, int root,
                                pcs_coll_stream_t s);
/* Point-to-point (pipeline stages): messages between a pair arrive in the order sent; the
 * receiver's count must equal the sender's. */
pcs_status_t pcs_coll_send(pcs_coll_t *c, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s);
pcs_status_t pcs_coll_recv(pcs_coll_t *c, void *buf, size_t count, pcs_dtype_t dt, int peer,
                           pcs_coll_stream_t s);
/* Returns once every rank entered the barrier (not allowed inside a group). */
pcs_status_t pcs_coll_barrier(pcs_coll_t *c);

/* Group calls (ncclGroupStart/End): operations between start and end are queued and issued as
 * one at end (buffers must stay valid until end returns). Sends and receives of a group are all
 * posted before any is waited for, so a pair may exchange in both directions. Groups nest; the
 * outermost end issues them. An error from end covers the whole group. */
pcs_status_t pcs_coll_group_start(pcs_coll_t *c);
pcs_status_t pcs_coll_group_end(pcs_coll_t *c);

/* Wake every blocked call with PCS_ERR_CANCELLED and poison the communicator; peers see the
 * connection drop and report "rank r aborted". Safe from any thread, idempotent. */
void pcs_coll_abort(pcs_coll_t *c, const char *reason);
/* Release everything. No call may be running (abort first). Accepts NULL. */
void pcs_coll_destroy(pcs_coll_t *c);

/* Why a failed communicator failed, when a peer is to blame (values equal pcs.v1.PeerFault). */
typedef enum pcs_coll_fault {
    PCS_COLL_FAULT_NONE = 0,
    PCS_COLL_FAULT_DIED = 1,  /* it closed its connections: its process died or was killed */
    PCS_COLL_FAULT_SILENT = 2 /* it made no progress within the timeout */
} pcs_coll_fault_t;
/* The rank (in this communicator) the first failure is blamed on, -1 when none is: no failure,
 * a failure of this rank's own, an abort, or a backend that cannot tell (NCCL). Another rank's
 * failure note counts (a rank that gave up because of rank 2 blames rank 2). *fault gets the
 * kind. Thread-safe. */
int pcs_coll_blame(const pcs_coll_t *c, pcs_coll_fault_t *fault);

// ---- backend vtable (implemented by coll_gloo.cc and coll_nccl.c) ----

/* Arguments are already checked by coll.c (dtype, counts, ranks, NULLs, poisoned state). */
typedef struct pcs_coll_ops {
    const char *name; /* "gloo" | "nccl" */
    pcs_status_t (*all_gather)(void *impl, const void *in, void *out, size_t count, pcs_dtype_t dt,
                               pcs_coll_stream_t s);
    pcs_status_t (*reduce_scatter)(void *impl, const void *in, void *out, size_t recv_count,
                                   pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t s);
    pcs_status_t (*all_reduce)(void *impl, const void *in, void *out, size_t count, pcs_dtype_t dt,
                               const pcs_coll_red_t *red, pcs_coll_stream_t s);
    pcs_status_t (*broadcast)(void *impl, void *buf, size_t count, pcs_dtype_t dt, int root,
                              pcs_coll_stream_t s);
    pcs_status_t (*send)(void *impl, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                         pcs_coll_stream_t s);
    pcs_status_t (*recv)(void *impl, void *buf, size_t count, pcs_dtype_t dt, int peer,
                         pcs_coll_stream_t s);
    pcs_status_t (*barrier)(void *impl);
    pcs_status_t (*group_start)(void *impl);
    pcs_status_t (*group_end)(void *impl);
    void (*abort)(void *impl, const char *reason);
    void (*destroy)(void *impl);
    int (*blame)(void *impl, int *fault); /* pcs_coll_blame; NULL: never known */
} pcs_coll_ops_t;

typedef pcs_status_t (*pcs_coll_backend_create_fn)(const pcs_coll_config_t *cfg,
                                                   const char *key_prefix,
                                                   const pcs_coll_ops_t **ops, void **impl);
pcs_status_t pcs_coll_gloo_create(const pcs_coll_config_t *cfg, const char *key_prefix,
                                  const pcs_coll_ops_t **ops, void **impl);
pcs_status_t pcs_coll_nccl_create(const pcs_coll_config_t *cfg, const char *key_prefix,
                                  const pcs_coll_ops_t **ops, void **impl);

/* The backend's private state (for backend-specific extras such as the raw Gloo bench calls). */
void *pcs_coll_backend_impl(const pcs_coll_t *c);
/* Benchmark baselines: the plain Gloo library algorithms (gloo::allgather, gloo::allreduce ring
 * with fp32 sum) on the communicator's own context, without this layer's work. Gloo backend and
 * size > 1 only. */
pcs_status_t pcs_coll_gloo_raw_all_gather(pcs_coll_t *c, const void *in, void *out, size_t bytes);
pcs_status_t pcs_coll_gloo_raw_all_reduce_f32(pcs_coll_t *c, float *buf, size_t count);

// ---- reduction arithmetic shared by the CPU backend, the NCCL backend's host helpers and tests --

/* 1 if dt can be reduced (fp32, bf16, fp16, fp64). */
int pcs_coll_dtype_reducible(pcs_dtype_t dt);
/* dst[i] = rnd(dst[i] op src[i]) in dt; op SUM (also used for AVG after pre-multiplying) or MAX. */
void pcs_coll_reduce_into(void *dst, const void *src, size_t n, pcs_dtype_t dt, pcs_red_op_t op);
/* acc[i] = rnd(x[i] op acc[i]): the same value with the ring's operand order (the rank's own
 * contribution first, the arriving accumulator second), for transports that accumulate. */
void pcs_coll_reduce_acc(void *acc, const void *x, size_t n, pcs_dtype_t dt, pcs_red_op_t op);
/* dst[i] = rnd(src[i] * f) in dt, the product in fp32 with f rounded to fp32 (fp64: in fp64 with
 * f as given); dst may equal src. Factors come from pcs_coll_div_factor / pcs_coll_avg_factor,
 * which round them for dt already. */
void pcs_coll_scale(void *dst, const void *src, size_t n, pcs_dtype_t dt, double f);
/* dst = src with one contribution's factors applied: x * f_pre, then * f_avg, each rounded to dt
 * (1.0 = skipped; a plain copy when both are; dst may equal src). */
void pcs_coll_prepare(void *dst, const void *src, size_t n, pcs_dtype_t dt, double f_pre,
                      double f_avg);
/* dst = rnd(prepare(src) op x), then * f_post unless 1.0: one ring step that reads the rank's
 * own contribution straight from its input (no prepared copy), with the bits of pcs_coll_prepare,
 * pcs_coll_reduce_into and pcs_coll_scale in turn. dst may equal src or x. */
void pcs_coll_prepare_reduce(void *dst, const void *src, const void *x, size_t n, pcs_dtype_t dt,
                             pcs_red_op_t op, double f_pre, double f_avg, double f_post);
/* The ncclAvg pre-multiplier: (float)(1.0/size) rounded to dt (fp64: 1.0/size). */
double pcs_coll_avg_factor(int size, pcs_dtype_t dt);
/* The factor x of dtype dt is multiplied by for pre/post divide d: (float)(1.0/d), as ATen's CUDA
 * div by a scalar (fp64: 1.0/d in double, its opmath); 1.0 if d is 0 or 1. */
double pcs_coll_div_factor(double d, pcs_dtype_t dt);
/* Element range [*off, *off + *n) of chunk k when `count` is split into `parts` ring chunks. */
void pcs_coll_chunk(size_t count, int parts, int k, size_t *off, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
