/* Numerical kernels behind a plain-C backend vtable (STYLE.md B8): device memory, streams and
 * events, and the element-wise ops of a sharded training step (cast, scale, accumulate, AMP
 * non-finite check + unscale, sum of squares, SGD/AdamW updates, fill). "cpu" is always built and
 * is the reference twin; "cuda" exists when built and a device is present. No CUDA header here.
 * Element math lives in pcs/half.h and pcs/kernel_math.h, shared by the CPU loops and CUDA code. */
#ifndef PCS_KERNELS_H
#define PCS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque stream / event handles. NULL stream = the backend's default stream (cpu: every op is
 * synchronous and streams are only ordering tokens). */
typedef struct pcs_stream *pcs_stream_t;
typedef struct pcs_event *pcs_event_t;

typedef enum pcs_copy_kind {
    PCS_COPY_DEFAULT = 0, /* inferred from the pointers (cuda: unified addressing) */
    PCS_COPY_H2H,
    PCS_COPY_H2D,
    PCS_COPY_D2H,
    PCS_COPY_D2D
} pcs_copy_kind_t;

/* A borrowed view of `n` elements of `dtype` at `data` (device memory of the backend). */
typedef struct pcs_tensor {
    void *data;
    pcs_dtype_t dtype;
    size_t n;
} pcs_tensor_t;

/* torch.optim.AdamW hyper-parameters (foreach=False, amsgrad=False, capturable=False). */
typedef struct pcs_adamw_config {
    double lr;           /* 1e-3 */
    double beta1;        /* 0.9 */
    double beta2;        /* 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 1e-2 */
    int maximize;        /* 0 */
} pcs_adamw_config_t;

/* torch.optim.SGD hyper-parameters. momentum == 0 needs no buffer (momentum_buf may be NULL). */
typedef struct pcs_sgd_config {
    double lr;           /* 1e-3 */
    double momentum;     /* 0 */
    double dampening;    /* 0 */
    double weight_decay; /* 0 */
    int nesterov;        /* 0; requires momentum > 0 and dampening == 0 (as torch) */
    int maximize;        /* 0 */
} pcs_sgd_config_t;

/* PyTorch's defaults. */
void pcs_adamw_config_default(pcs_adamw_config_t *cfg);
void pcs_sgd_config_default(pcs_sgd_config_t *cfg);

/* The element-wise ops of a backend (kernels/src/kernels_internal.h): reached only through the
 * pcs_kernel_*() front door below, which validates every argument once for every backend. */
struct pcs_kernel_ops;

/* Backend vtable: memory, streams and events, devices. Each entry checks what is its own to check
 * (NULL out-parameters, copy kinds, device ordinals) and returns PCS_ERR_INVALID_ARG,
 * PCS_ERR_UNSUPPORTED or PCS_ERR_CUDA with a message. Ops on a stream are asynchronous on cuda
 * (results are ready after sync(s)); on cpu they complete before returning. Pointers passed to an
 * op must stay valid until the stream has synchronized. Thread-safety: the table is immutable;
 * concurrent ops on different streams are fine. */
typedef struct pcs_backend_ops {
    const char *name; /* "cpu" | "cuda" */

    /* ---- memory ---- */
    /* Device memory, 256-byte aligned (cpu: aligned host memory). bytes == 0 gives *out = NULL. */
    pcs_status_t (*alloc)(size_t bytes, void **out);
    void (*free)(void *p); /* accepts NULL */
    /* Page-locked host memory for fast H2D/D2H (cpu: plain aligned memory). */
    pcs_status_t (*host_alloc)(size_t bytes, void **out);
    void (*host_free)(void *p);
    pcs_status_t (*copy)(void *dst, const void *src, size_t bytes, pcs_copy_kind_t kind,
                         pcs_stream_t s);

    /* ---- streams and events ---- */
    pcs_status_t (*stream_create)(pcs_stream_t *out);
    void (*stream_destroy)(pcs_stream_t s); /* accepts NULL */
    pcs_status_t (*sync)(pcs_stream_t s);   /* wait for all work queued on s */
    pcs_status_t (*event_create)(pcs_event_t *out);
    void (*event_destroy)(pcs_event_t e);
    pcs_status_t (*event_record)(pcs_event_t e, pcs_stream_t s);
    pcs_status_t (*stream_wait_event)(pcs_stream_t s,
                                      pcs_event_t e); /* s waits for e, no host sync */
    pcs_status_t (*event_sync)(pcs_event_t e);

    /* ---- element-wise ops: pcs_kernel_*() ---- */
    const struct pcs_kernel_ops *kernels;

    /* ---- devices ---- */
    /* Devices this backend can use (cpu: 1). */
    int (*device_count)(void);
    /* Make `ordinal` the calling thread's current device (cudaSetDevice: CUDA's current device is
     * per host thread, so every thread that allocates or launches must call it). cpu: only 0.
     * Out of range -> PCS_ERR_INVALID_ARG naming the count. */
    pcs_status_t (*set_device)(int ordinal);
    /* Name and memory of device `ordinal` (name: NUL-terminated, truncated to cap). */
    pcs_status_t (*device_info)(int ordinal, char *name, size_t cap, uint64_t *memory_bytes);

    /* ---- timing ---- */
    /* *ms = time between two recorded events (end recorded after start). cuda: the device
     * timestamps (cudaEventElapsedTime; event_create's events are timing-enabled), so `end` must
     * have completed (event_sync it first; PCS_ERR_CUDA otherwise); cpu: the host monotonic
     * clock read at each event_record. An event never recorded: PCS_ERR_STATE (cpu) or
     * PCS_ERR_CUDA. */
    pcs_status_t (*event_elapsed_ms)(pcs_event_t start, pcs_event_t end, float *ms);

    /* ---- stream-ordered memory ---- */
    /* When to use which: alloc/free at setup and teardown, when no step runs; alloc_async /
     * free_async for anything allocated or freed while a step may run (lazily on first use, on
     * regrowth). cudaMalloc/cudaFree may synchronize the whole device, and a device-wide sync while
     * another thread's NCCL kernels wait for peers that are themselves blocked can hang the job.
     * alloc_async: `bytes` of device memory usable by work enqueued on `s` after the call (cuda:
     * cudaMallocAsync from the device's default mempool, no device synchronization). Work on
     * ANOTHER stream may touch it only once ordered after the allocation: an event recorded on `s`
     * after this call and waited for by that stream (stream_wait_event), or a sync of `s`. Same
     * alignment guarantee as alloc for the element types here; bytes == 0 gives *out = NULL; NULL
     * out -> PCS_ERR_INVALID_ARG; PCS_ERR_NOMEM when the pool is exhausted. cpu: alloc.
     * free_async: release `p` after the work queued on `s` so far (cuda: cudaFreeAsync); work on
     * other streams that uses `p` must be ordered before it (an event waited for by `s`). Only for
     * memory from alloc_async (alloc's goes to free); accepts NULL. cpu: free. */
    pcs_status_t (*alloc_async)(size_t bytes, pcs_stream_t s, void **out);
    void (*free_async)(void *p, pcs_stream_t s);
} pcs_backend_ops_t;

/* The backend called `name` ("cpu", "cuda"). PCS_ERR_UNSUPPORTED if it was not built or (cuda)
 * no device is present; PCS_ERR_INVALID_ARG for NULL arguments; PCS_ERR_NOT_FOUND for an unknown
 * name. The returned table is static. */
pcs_status_t pcs_backend_get(const char *name, const pcs_backend_ops_t **out);

/* 1 if `name` is a backend compiled into this build (the device may still be missing). */
int pcs_backend_built(const char *name);

/* The simulated "cuda" device, for CI without a GPU: an explicit switch of the process, set by
 * pcs-worker's --simulate-cuda N (env PCS_SIMULATE_CUDA) and by tests. devices > 0 makes
 * pcs_backend_get("cuda") and pcs_nn_get("cuda") return a table named "cuda" with that many
 * devices that computes with the CPU twin on host memory whose device pointers are poisoned (a
 * host dereference faults); NCCL cannot use its buffers. 0 restores the real "cuda" backend.
 * Call at start-up, before any lookup (not thread-safe against concurrent lookups).
 * PCS_ERR_INVALID_ARG above PCS_SIMULATE_CUDA_MAX_DEVICES. */
#define PCS_SIMULATE_CUDA_MAX_DEVICES 64
pcs_status_t pcs_backend_simulate_cuda(unsigned devices);

/* 1 if `be` is the simulated "cuda" backend (pcs_backend_simulate_cuda). */
int pcs_backend_is_simulated(const pcs_backend_ops_t *be);

/* ---- element-wise ops: the front door ---------------------------------------------------
 * Every op validates its arguments here, once, whatever the backend, and returns
 * PCS_ERR_INVALID_ARG (NULL backend, NULL with n > 0, a pointer not aligned to its element size,
 * mismatched lengths, bad hyper-parameters), PCS_ERR_UNSUPPORTED (a dtype the op does not take)
 * or PCS_ERR_CUDA, with a message naming the op and the argument; n == 0 is a no-op returning
 * PCS_OK. Lists: one launch for many small tensors. Asynchronous on cuda like the vtable's ops. */

/* dst[i] = value rounded once to dtype (fp32/bf16/fp16/fp64/int64; int64: value must fit). */
pcs_status_t pcs_kernel_fill(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dtype, size_t n,
                             double value, pcs_stream_t s);
/* dst[k] = cast(src[k]) for k < count; dst[k].n must equal src[k].n. Every pair of fp32, bf16,
 * fp16, fp64 is supported; fp32->bf16/fp16 rounds to nearest even (see pcs/half.h). */
pcs_status_t pcs_kernel_cast_list(const pcs_backend_ops_t *be, const pcs_tensor_t *dst,
                                  const pcs_tensor_t *src, size_t count, pcs_stream_t s);
/* t[k] *= factor, computed in fp32 with factor rounded to fp32 (fp64 for fp64 tensors, with
 * factor as given) and rounded once to the tensor's dtype (ATen's opmath). For FSDP's
 * pre/post-divide t.div_(d), pass pcs_coll_div_factor(d, dtype): the reciprocal rounded to fp32
 * (fp64 tensors: 1.0 / d), exactly what ATen's CUDA div by a scalar computes (a * reciprocal(b));
 * ATen's CPU kernel divides, which can differ by one ulp. */
pcs_status_t pcs_kernel_scale_list(const pcs_backend_ops_t *be, const pcs_tensor_t *t, size_t count,
                                   double factor, pcs_stream_t s);
/* dst[k] += cast(src[k]): dst fp32/bf16/fp16 with src fp32/bf16/fp16, the sum computed in fp32
 * and rounded once to dst's dtype; dst fp64 with any float src, the sum in fp64 (an fp64
 * parameter's .grad accumulating a reduced gradient widened exactly); dst fp32/bf16/fp16 with an
 * fp64 src: PyTorch's in-place acc += g with type promotion, the sum in fp64 stored through fp32
 * as c10 narrows a double (an fp64 computation's gradient into a narrower no-sync accumulator,
 * spec §4.1 step 7, or gradient). */
pcs_status_t pcs_kernel_accumulate_list(const pcs_backend_ops_t *be, const pcs_tensor_t *dst,
                                        const pcs_tensor_t *src, size_t count, pcs_stream_t s);
/* torch._amp_foreach_non_finite_check_and_unscale_: for every element x of every tensor
 * (fp32/bf16/fp16/fp64): if x is Inf/NaN set *found_inf = 1.0f (never cleared); x = x * *inv_scale
 * in fp32 (fp64 for fp64 tensors: the fp32 inv_scale widened, ATen's opmath), skipped when
 * *inv_scale == 1. found_inf and inv_scale are 1-element fp32 device buffers. */
pcs_status_t pcs_kernel_nonfinite_check_and_unscale(const pcs_backend_ops_t *be,
                                                    const pcs_tensor_t *t, size_t count,
                                                    float *found_inf, const float *inv_scale,
                                                    pcs_stream_t s);
/* *out (1-element fp32 device buffer) = sum over all tensors of x*x, each x widened to fp32
 * (fp64 tensors: x itself); every square is exact in fp64 (fp64 tensors: rounded to fp64) and
 * the sum is accumulated in fp64, then rounded once to fp32.
 * Order: cpu sums each tensor front to back, then the per-tensor sums in list order; cuda sums
 * per-block partials (fixed grid, so run-to-run deterministic) then all partials in one
 * block. The two agree to within 1 fp32 ulp. Empty input writes 0. */
pcs_status_t pcs_kernel_sum_squares_list(const pcs_backend_ops_t *be, const pcs_tensor_t *t,
                                         size_t count, float *out, pcs_stream_t s);
/* AdamW on fp32 or fp64 shards: param/grad/exp_avg/exp_avg_sq [k] all of param[k]'s dtype with
 * equal n, computed in that dtype (the coefficients rounded once to fp32 for fp32 shards, the
 * doubles themselves for fp64, as PyTorch's single-tensor Adam on such parameters). `step` is
 * the 1-based step count after this update's increment (bias correction uses it). */
pcs_status_t pcs_kernel_adamw_update(const pcs_backend_ops_t *be, const pcs_tensor_t *param,
                                     const pcs_tensor_t *grad, const pcs_tensor_t *exp_avg,
                                     const pcs_tensor_t *exp_avg_sq, size_t count,
                                     const pcs_adamw_config_t *cfg, int64_t step, pcs_stream_t s);
/* SGD on fp32 or fp64 shards (as AdamW: every list of param[k]'s dtype, computed in it).
 * momentum_buf may be NULL iff cfg->momentum == 0. first_step != 0 means
 * the buffer is initialised from the gradient (torch: momentum_buffer is None). grad is not
 * modified. */
pcs_status_t pcs_kernel_sgd_update(const pcs_backend_ops_t *be, const pcs_tensor_t *param,
                                   const pcs_tensor_t *grad, const pcs_tensor_t *momentum_buf,
                                   size_t count, const pcs_sgd_config_t *cfg, int first_step,
                                   pcs_stream_t s);

/* Single-tensor forms: each builds a pcs_tensor_t and calls the list op. */
pcs_status_t pcs_kernel_cast(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                             const void *src, pcs_dtype_t src_dtype, size_t n, pcs_stream_t s);
pcs_status_t pcs_kernel_scale(const pcs_backend_ops_t *be, void *t, pcs_dtype_t dtype, size_t n,
                              double factor, pcs_stream_t s);
pcs_status_t pcs_kernel_accumulate(const pcs_backend_ops_t *be, void *dst, pcs_dtype_t dst_dtype,
                                   const void *src, pcs_dtype_t src_dtype, size_t n,
                                   pcs_stream_t s);
pcs_status_t pcs_kernel_sum_squares(const pcs_backend_ops_t *be, const void *t, pcs_dtype_t dtype,
                                    size_t n, float *out, pcs_stream_t s);

/* pcs_kernel_accumulate, then *out (1-element fp32 device buffer) = the sum of squares of dst's n
 * elements after it, in one pass with the bits of pcs_kernel_sum_squares on dst (the gradient
 * norm's sum fused with the reduction's accumulation into the sharded gradient). A fused op a
 * backend may lack: PCS_ERR_UNSUPPORTED where it does (cuda and the simulated device today), and
 * the caller runs the two ops instead. */
pcs_status_t pcs_kernel_accumulate_sumsq(const pcs_backend_ops_t *be, void *dst,
                                         pcs_dtype_t dst_dtype, const void *src,
                                         pcs_dtype_t src_dtype, size_t n, float *out,
                                         pcs_stream_t s);

/* ---- CPU implementation details that tests and benches use directly ---- */
/* Which CPU vector path the cast loops use: "avx512", "avx2+f16c" or "scalar". */
const char *pcs_cpu_simd_name(void);
/* Force a path ("avx512", "avx2+f16c" (or "avx2"), "scalar") or restore run-time detection
 * ("auto"), for tests and the bench. PCS_ERR_UNSUPPORTED if this CPU lacks the path,
 * PCS_ERR_INVALID_ARG for an unknown name. Not thread-safe against concurrent ops. */
pcs_status_t pcs_cpu_simd_select(const char *path);
/* Same as pcs_cpu_simd_select("scalar") (on != 0) or ("auto") (on == 0). */
void pcs_cpu_simd_force_scalar(int on);
/* Host-memory array cast with the CPU backend's current path, no validation beyond dtype
 * support: the exhaustive test and the bench call it to prove/measure exactly what the op runs. */
pcs_status_t pcs_cpu_cast_array(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st,
                                size_t n);
/* The same through an explicit path (as pcs_cpu_simd_select names; "auto" = best); thread-safe.
 * PCS_ERR_UNSUPPORTED if this CPU lacks the path. */
pcs_status_t pcs_cpu_cast_array_path(const char *path, void *dst, pcs_dtype_t dt, const void *src,
                                     pcs_dtype_t st, size_t n);

#ifdef __cplusplus
}
#endif
#endif
