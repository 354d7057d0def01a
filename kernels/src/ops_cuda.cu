/* The "cuda" backend: cudaMalloc'd memory, streams and events, and the element-wise kernels with
 * extern "C" entry points in the vtable. Every kernel evaluates the same PCS_HD scalar code as the
 * CPU twin (pcs/half.h, pcs/kernel_math.h; --fmad=false), so tests/gpu/test_kernels_cuda.c can
 * demand identical bits. Lists are batched (up to kMaxTensors per launch, same dtypes) so small
 * tensors cost one launch; each batch is a 2-D grid: blockIdx.y = tensor, x = grid-stride. */
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kernels_internal.h"

// ----------------------------------------------------------------------------
// device detection and launch geometry

namespace
{

constexpr int kThreads = 256;
constexpr int kVec = 8;         // elements per thread per step on the vector path
constexpr int kMaxTensors = 48; // tensors per launch: keeps kernel parameters under 4 KB

struct DeviceInfo {
    int count;
    int sm_count;
};

/* The first CUDA call of the process. The runtime drives two NCCL communicators from two threads
 * (all-gathers and reductions) on their own streams, and each rank may launch their kernels in a
 * different order: that only completes if both kernels can run at once. Streams share
 * CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8) in order, and the worker has ~20
 * streams (compute, 2 runtime, 1 per communicator plus NCCL's own), so two NCCL kernels can land
 * in one queue behind each other: rank A runs AG then RS, rank B RS then AG, each waits for the
 * other, a hang. 32 (the maximum) gives every stream its own queue. Set here, before the driver
 * reads it, unless the operator chose a value; a low one is warned about. */
void connections_guard(void)
{
    const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (v == NULL) {
        (void)setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    } else if (atoi(v) < 32) {
        PCS_WARN(PCS_SUB_KERNEL,
                 "CUDA_DEVICE_MAX_CONNECTIONS=%s: streams share hardware queues; NCCL kernels of "
                 "the all-gather and reduction communicators can then wait behind each other "
                 "(a cross-rank hang); 32 avoids it",
                 v);
    }
}

DeviceInfo probe_once(void)
{
    DeviceInfo d = {0, 80};
    int n = 0;
    connections_guard();
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError(); /* clear the sticky-free error of a device-less machine */
        return d;
    }
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
        d.sm_count = sms;
    d.count = n;
    return d;
}

/* C++11 guarantees a thread-safe one-time initialisation of this static. */
const DeviceInfo &dev_info(void)
{
    static const DeviceInfo info = probe_once();
    return info;
}

inline cudaStream_t cs(pcs_stream_t s)
{
    return reinterpret_cast<cudaStream_t>(s);
}

/* grid.x for a batch whose largest tensor has `max_work` work items of kThreads-thread blocks:
 * enough blocks to cover the work, capped at ~8 resident 256-thread blocks per SM in total. */
unsigned grid_x(size_t max_work, size_t ntensors)
{
    size_t want = PCS_CEIL_DIV(max_work, (size_t)kThreads);
    size_t cap = (size_t)dev_info().sm_count * 8u / (ntensors ? ntensors : 1u);
    if (cap < 1)
        cap = 1;
    if (want > cap)
        want = cap;
    if (want < 1)
        want = 1;
    return (unsigned)want;
}

inline bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

// ----------------------------------------------------------------------------
// element types: ld widens to fp32 (exact), st rounds once (pcs/half.h)

struct TF32 {
    using F = float; /* the scale factor */
    using T = float;
    static __device__ __forceinline__ float ld(T x)
    {
        return x;
    }
    static __device__ __forceinline__ T st(float f)
    {
        return f;
    }
    static __device__ __forceinline__ double ld64(T x)
    {
        return (double)x;
    }
    static __device__ __forceinline__ T scale(T x, float f)
    {
        return x * f;
    }
};
struct TBF16 {
    using F = float; /* the scale factor */
    using T = uint16_t;
    static __device__ __forceinline__ float ld(T x)
    {
        return pcs_bf16_to_f32(x);
    }
    static __device__ __forceinline__ T st(float f)
    {
        return pcs_f32_to_bf16(f);
    }
    static __device__ __forceinline__ double ld64(T x)
    {
        return (double)ld(x);
    }
    static __device__ __forceinline__ T scale(T x, float f)
    {
        return st(ld(x) * f);
    }
};
struct TFP16 {
    using F = float; /* the scale factor */
    using T = uint16_t;
    static __device__ __forceinline__ float ld(T x)
    {
        return pcs_fp16_to_f32(x);
    }
    static __device__ __forceinline__ T st(float f)
    {
        return pcs_f32_to_fp16(f);
    }
    static __device__ __forceinline__ double ld64(T x)
    {
        return (double)ld(x);
    }
    static __device__ __forceinline__ T scale(T x, float f)
    {
        return st(ld(x) * f);
    }
};
/* fp64 as a cast source narrows to fp32 first, as the CPU loop (and c10) do; fp64 scale is in
 * double. ld64 (every type): the exact value as a double, for fp64 accumulators. */
struct TF64 {
    using F = double;
    using T = double;
    static __device__ __forceinline__ float ld(T x)
    {
        return (float)x;
    }
    static __device__ __forceinline__ T st(float f)
    {
        return (double)f;
    }
    static __device__ __forceinline__ double ld64(T x)
    {
        return x;
    }
    static __device__ __forceinline__ T scale(T x, double f)
    {
        return x * f;
    }
};

template <class F> pcs_status_t with_dtype(pcs_dtype_t t, F f)
{
    switch (t) {
    case PCS_DTYPE_FP32:
        return f(TF32{});
    case PCS_DTYPE_BF16:
        return f(TBF16{});
    case PCS_DTYPE_FP16:
        return f(TFP16{});
    case PCS_DTYPE_FP64:
        return f(TF64{});
    default:
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "cuda: dtype %s not supported here",
                             pcs_dtype_name(t));
    }
}

/* 8 elements through 16-byte transactions (p must be 16-byte aligned). */
template <typename T> __device__ __forceinline__ void load8(const T *p, T (&out)[kVec])
{
    constexpr int nv = kVec * (int)sizeof(T) / 16;
    union {
        uint4 v[nv];
        T e[kVec];
    } u;
    const uint4 *q = reinterpret_cast<const uint4 *>(p);
#pragma unroll
    for (int j = 0; j < nv; j++)
        u.v[j] = q[j];
#pragma unroll
    for (int j = 0; j < kVec; j++)
        out[j] = u.e[j];
}

template <typename T> __device__ __forceinline__ void store8(T *p, const T (&in)[kVec])
{
    constexpr int nv = kVec * (int)sizeof(T) / 16;
    union {
        uint4 v[nv];
        T e[kVec];
    } u;
#pragma unroll
    for (int j = 0; j < kVec; j++)
        u.e[j] = in[j];
    uint4 *q = reinterpret_cast<uint4 *>(p);
#pragma unroll
    for (int j = 0; j < nv; j++)
        q[j] = u.v[j];
}

// ----------------------------------------------------------------------------
// batches: kernel parameters describing up to kMaxTensors tensors

struct Batch2 {
    void *a[kMaxTensors];
    const void *b[kMaxTensors];
    size_t n[kMaxTensors];
};

struct Batch4 {
    float *p[kMaxTensors];
    const float *g[kMaxTensors];
    float *m[kMaxTensors]; /* exp_avg, or the SGD momentum buffer (may be NULL) */
    float *v[kMaxTensors]; /* exp_avg_sq */
    size_t n[kMaxTensors];
};

// ----------------------------------------------------------------------------
// kernels

template <class D, class S, bool VEC> __global__ void cast_kernel(Batch2 b)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    typename D::T *d = static_cast<typename D::T *>(b.a[k]);
    const typename S::T *s = static_cast<const typename S::T *>(b.b[k]);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (VEC) {
        const size_t groups = n / kVec;
        for (size_t g = i; g < groups; g += stride) {
            typename S::T in[kVec];
            typename D::T out[kVec];
            load8(s + g * kVec, in);
#pragma unroll
            for (int j = 0; j < kVec; j++)
                out[j] = D::st(S::ld(in[j]));
            store8(d + g * kVec, out);
        }
        tail = groups * kVec;
    }
    for (size_t j = tail + i; j < n; j += stride)
        d[j] = D::st(S::ld(s[j]));
}

template <class X, bool VEC> __global__ void scale_kernel(Batch2 b, typename X::F f)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    typename X::T *d = static_cast<typename X::T *>(b.a[k]);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (VEC) {
        const size_t groups = n / kVec;
        for (size_t g = i; g < groups; g += stride) {
            typename X::T x[kVec];
            load8(d + g * kVec, x);
#pragma unroll
            for (int j = 0; j < kVec; j++)
                x[j] = X::scale(x[j], f);
            store8(d + g * kVec, x);
        }
        tail = groups * kVec;
    }
    for (size_t j = tail + i; j < n; j += stride)
        d[j] = X::scale(d[j], f);
}

/* d + s rounded once to D: in fp32 for fp32/bf16/fp16 destinations, in fp64 for fp64 ones and
 * for an fp64 source (type promotion; the fp64 sum then stored through fp32). */
template <class D, class S> struct Acc {
    static __device__ __forceinline__ typename D::T add(typename D::T x, typename S::T y)
    {
        return D::st(D::ld(x) + S::ld(y));
    }
};
template <class S> struct Acc<TF64, S> {
    static __device__ __forceinline__ double add(double x, typename S::T y)
    {
        return x + S::ld64(y);
    }
};
/* an fp64 source into a narrower destination: the sum in fp64 (type promotion), stored
 * through fp32 */
template <class D> struct Acc<D, TF64> {
    static __device__ __forceinline__ typename D::T add(typename D::T x, double y)
    {
        return D::st((float)(D::ld64(x) + y));
    }
};
template <> struct Acc<TF64, TF64> {
    static __device__ __forceinline__ double add(double x, double y)
    {
        return x + y;
    }
};

template <class D, class S, bool VEC> __global__ void accumulate_kernel(Batch2 b)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    typename D::T *d = static_cast<typename D::T *>(b.a[k]);
    const typename S::T *s = static_cast<const typename S::T *>(b.b[k]);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (VEC) {
        const size_t groups = n / kVec;
        for (size_t g = i; g < groups; g += stride) {
            typename D::T x[kVec];
            typename S::T y[kVec];
            load8(d + g * kVec, x);
            load8(s + g * kVec, y);
#pragma unroll
            for (int j = 0; j < kVec; j++)
                x[j] = Acc<D, S>::add(x[j], y[j]);
            store8(d + g * kVec, x);
        }
        tail = groups * kVec;
    }
    for (size_t j = tail + i; j < n; j += stride)
        d[j] = Acc<D, S>::add(d[j], s[j]);
}

/* _amp_foreach_non_finite_check_and_unscale_: every thread that sees a non-finite value stores
 * 1.0f (same value, so the race is benign, as in ATen); the multiply is skipped when inv == 1. */
template <class X> struct Unscale { /* fp32 opmath */
    static __device__ __forceinline__ int run(typename X::T *d, float inv)
    {
        float x = X::ld(*d);
        if (inv != 1.0f)
            *d = X::st(x * inv);
        return !pcs_is_finite_f32(x);
    }
};
template <> struct Unscale<TF64> { /* fp64 opmath: the value itself, times the widened inv */
    static __device__ __forceinline__ int run(double *d, float inv)
    {
        double x = *d;
        if (inv != 1.0f)
            *d = x * (double)inv;
        return !isfinite(x);
    }
};

template <class X>
__global__ void nonfinite_kernel(Batch2 b, float *found_inf, const float *inv_scale)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    typename X::T *d = static_cast<typename X::T *>(b.a[k]);
    const float inv = *inv_scale;
    int found = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        found |= Unscale<X>::run(&d[j], inv);
    if (found)
        *found_inf = 1.0f;
}

/* Per-block partial sums of squares in double, written to partial[base + y*gridDim.x + x]. The
 * grid is fixed by the sizes, so the summation order (and the result) is deterministic. */
template <class X> __global__ void sumsq_kernel(Batch2 b, double *partial, size_t base)
{
    __shared__ double sh[kThreads];
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    const typename X::T *d = static_cast<const typename X::T *>(b.b[k]);
    double acc = 0.0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        double x = X::ld64(d[j]);
        acc += x * x;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[base + (size_t)blockIdx.y * gridDim.x + blockIdx.x] = sh[0];
}

__global__ void sumsq_final_kernel(const double *partial, size_t count, float *out)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (size_t j = threadIdx.x; j < count; j += blockDim.x)
        acc += partial[j];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = (float)sh[0];
}

template <bool VEC> __global__ void adamw_kernel(Batch4 b, pcs_adamw_coef_t c)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    float *p = b.p[k], *m = b.m[k], *v = b.v[k];
    const float *g = b.g[k];
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;
    if (VEC) {
        const size_t groups = n / 4;
        for (size_t q = i; q < groups; q += stride) {
            float4 P = reinterpret_cast<float4 *>(p)[q];
            float4 G = reinterpret_cast<const float4 *>(g)[q];
            float4 M = reinterpret_cast<float4 *>(m)[q];
            float4 V = reinterpret_cast<float4 *>(v)[q];
            pcs_adamw_elem(&P.x, G.x, &M.x, &V.x, &c);
            pcs_adamw_elem(&P.y, G.y, &M.y, &V.y, &c);
            pcs_adamw_elem(&P.z, G.z, &M.z, &V.z, &c);
            pcs_adamw_elem(&P.w, G.w, &M.w, &V.w, &c);
            reinterpret_cast<float4 *>(p)[q] = P;
            reinterpret_cast<float4 *>(m)[q] = M;
            reinterpret_cast<float4 *>(v)[q] = V;
        }
        tail = groups * 4;
    }
    for (size_t j = tail + i; j < n; j += stride)
        pcs_adamw_elem(&p[j], g[j], &m[j], &v[j], &c);
}

__global__ void sgd_kernel(Batch4 b, pcs_sgd_coef_t c)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    float *p = b.p[k], *buf = b.m[k];
    const float *g = b.g[k];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        pcs_sgd_elem(&p[j], g[j], buf ? &buf[j] : NULL, &c);
}

struct Batch4D { /* Batch4 for fp64 shards */
    double *p[kMaxTensors];
    const double *g[kMaxTensors];
    double *m[kMaxTensors];
    double *v[kMaxTensors];
    size_t n[kMaxTensors];
};

__global__ void adamw64_kernel(Batch4D b, pcs_adamw_coef64_t c)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        pcs_adamw_elem64(&b.p[k][j], b.g[k][j], &b.m[k][j], &b.v[k][j], &c);
}

__global__ void sgd64_kernel(Batch4D b, pcs_sgd_coef64_t c)
{
    const int k = blockIdx.y;
    const size_t n = b.n[k];
    double *buf = b.m[k];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        pcs_sgd_elem64(&b.p[k][j], b.g[k][j], buf ? &buf[j] : NULL, &c);
}

/* An fp64 batch of the optimizer lists (m, v may be NULL lists). */
Batch4D batch4d(const size_t *idx, size_t nb, const pcs_tensor_t *p, const pcs_tensor_t *g,
                const pcs_tensor_t *m, const pcs_tensor_t *v, size_t *maxn)
{
    Batch4D b;
    *maxn = 0;
    for (size_t j = 0; j < nb; j++) {
        size_t k = idx[j];
        b.p[j] = static_cast<double *>(p[k].data);
        b.g[j] = static_cast<const double *>(g[k].data);
        b.m[j] = m ? static_cast<double *>(m[k].data) : NULL;
        b.v[j] = v ? static_cast<double *>(v[k].data) : NULL;
        b.n[j] = p[k].n;
        *maxn = b.n[j] > *maxn ? b.n[j] : *maxn;
    }
    return b;
}

template <typename T> __global__ void fill_kernel(T *d, size_t n, T v)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        d[j] = v;
}

// ----------------------------------------------------------------------------
// batching: consecutive tensors with the same key share a launch

pcs_status_t launch_check(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        PCS_WARN(PCS_SUB_KERNEL, "cuda %s kernel launch failed: %s", what, cudaGetErrorString(e));
        return PCS_ERR_CUDA;
    }
    return PCS_OK;
}

/* Calls emit(first, count) for runs of tensors (n > 0 only) that agree on key(k). */
template <class Key, class Emit>
pcs_status_t for_batches(size_t count, const pcs_tensor_t *lead, Key key, Emit emit)
{
    size_t idx[kMaxTensors];
    size_t nb = 0;
    unsigned cur = 0;
    for (size_t k = 0; k < count; k++) {
        if (lead[k].n == 0)
            continue;
        unsigned kk = key(k);
        if (nb > 0 && (kk != cur || nb == (size_t)kMaxTensors)) {
            PCS_CHECK(emit(idx, nb));
            nb = 0;
        }
        cur = kk;
        idx[nb++] = k;
    }
    if (nb > 0)
        PCS_CHECK(emit(idx, nb));
    return PCS_OK;
}

unsigned dkey(pcs_dtype_t a, pcs_dtype_t b, bool vec)
{
    return ((unsigned)a << 8) | ((unsigned)b << 1) | (vec ? 1u : 0u);
}

// ----------------------------------------------------------------------------
// memory, streams, events

pcs_status_t cu_alloc(size_t bytes, void **out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc: NULL out");
    *out = NULL;
    if (bytes == 0)
        return PCS_OK;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        PCS_WARN(PCS_SUB_MEM, "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        *out = NULL;
        return e == cudaErrorMemoryAllocation ? PCS_ERR_NOMEM : PCS_ERR_CUDA;
    }
    return PCS_OK;
}

void cu_free(void *p)
{
    if (p != NULL)
        (void)cudaFree(p);
}

/* Keep memory freed to the device's default pool in the pool across synchronizations (the
 * release threshold defaults to 0: the pool trims back to the OS at every sync, and the next
 * cudaMallocAsync maps memory anew, as PyTorch's caching allocator avoids). Once per device; a
 * failure here (no pool support) is left for cudaMallocAsync to report. */
void tune_default_pool(void)
{
    static std::atomic<unsigned long long> tuned{0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return;
    }
    unsigned long long bit = 1ull << dev;
    if (tuned.load(std::memory_order_acquire) & bit)
        return;
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
        (void)cudaGetLastError();
    tuned.fetch_or(bit, std::memory_order_acq_rel);
}

/* Stream-ordered: no device synchronization (cudaMalloc may synchronize the device, which can
 * hang a job while another thread's NCCL kernels wait for their peers). */
pcs_status_t cu_alloc_async(size_t bytes, pcs_stream_t s, void **out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc_async: NULL out");
    *out = NULL;
    if (bytes == 0)
        return PCS_OK;
    tune_default_pool();
    cudaError_t e = cudaMallocAsync(out, bytes, cs(s));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        PCS_WARN(PCS_SUB_MEM, "cudaMallocAsync of %zu bytes failed: %s", bytes,
                 cudaGetErrorString(e));
        *out = NULL;
        return e == cudaErrorMemoryAllocation ? PCS_ERR_NOMEM
               : e == cudaErrorNotSupported   ? PCS_ERR_UNSUPPORTED
                                              : PCS_ERR_CUDA;
    }
    return PCS_OK;
}

void cu_free_async(void *p, pcs_stream_t s)
{
    if (p == NULL)
        return;
    cudaError_t e = cudaFreeAsync(p, cs(s));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        PCS_WARN(PCS_SUB_MEM, "cudaFreeAsync(%p) failed: %s", p, cudaGetErrorString(e));
    }
}

pcs_status_t cu_host_alloc(size_t bytes, void **out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "host_alloc: NULL out");
    *out = NULL;
    if (bytes == 0)
        return PCS_OK;
    cudaError_t e = cudaMallocHost(out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        PCS_WARN(PCS_SUB_MEM, "cudaMallocHost of %zu bytes failed: %s", bytes,
                 cudaGetErrorString(e));
        *out = NULL;
        return e == cudaErrorMemoryAllocation ? PCS_ERR_NOMEM : PCS_ERR_CUDA;
    }
    return PCS_OK;
}

void cu_host_free(void *p)
{
    if (p != NULL)
        (void)cudaFreeHost(p);
}

pcs_status_t cu_copy(void *dst, const void *src, size_t bytes, pcs_copy_kind_t kind, pcs_stream_t s)
{
    if (bytes == 0)
        return PCS_OK;
    if (dst == NULL || src == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "copy: NULL %s with %zu bytes",
                             dst == NULL ? "dst" : "src", bytes);
    cudaMemcpyKind k;
    switch (kind) {
    case PCS_COPY_DEFAULT:
        k = cudaMemcpyDefault;
        break;
    case PCS_COPY_H2H:
        k = cudaMemcpyHostToHost;
        break;
    case PCS_COPY_H2D:
        k = cudaMemcpyHostToDevice;
        break;
    case PCS_COPY_D2H:
        k = cudaMemcpyDeviceToHost;
        break;
    case PCS_COPY_D2D:
        k = cudaMemcpyDeviceToDevice;
        break;
    default:
        return pcs_set_error(PCS_ERR_INVALID_ARG, "copy: invalid kind %d", (int)kind);
    }
    PCS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, cs(s)));
    return PCS_OK;
}

template <typename T>
pcs_status_t fill_launch(void *dst, size_t n, const void *pattern, pcs_stream_t s)
{
    T v;
    memcpy(&v, pattern, sizeof v);
    fill_kernel<T><<<grid_x(n, 1), kThreads, 0, cs(s)>>>(static_cast<T *>(dst), n, v);
    return launch_check("fill");
}

pcs_status_t cu_fill(void *dst, pcs_dtype_t dt, size_t n, double value, pcs_stream_t s)
{
    uint64_t pattern = 0; /* 8-byte aligned: the CPU fill checks element alignment */
    /* the CPU twin rounds the value (once, to the dtype) into a host word */
    PCS_CHECK(pcs_backend_cpu()->kernels->fill(&pattern, dt, 1, value, NULL));
    if (n == 0)
        return PCS_OK;
    switch (pcs_dtype_size(dt)) {
    case 2:
        return fill_launch<uint16_t>(dst, n, &pattern, s);
    case 4:
        return fill_launch<uint32_t>(dst, n, &pattern, s);
    default:
        return fill_launch<uint64_t>(dst, n, &pattern, s);
    }
}

pcs_status_t cu_stream_create(pcs_stream_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_create: NULL out");
    cudaStream_t st;
    PCS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *out = reinterpret_cast<pcs_stream_t>(st);
    return PCS_OK;
}

void cu_stream_destroy(pcs_stream_t s)
{
    if (s != NULL)
        (void)cudaStreamDestroy(cs(s));
}

pcs_status_t cu_sync(pcs_stream_t s)
{
    PCS_CUDA_CHECK(cudaStreamSynchronize(cs(s)));
    return PCS_OK;
}

pcs_status_t cu_event_create(pcs_event_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_create: NULL out");
    cudaEvent_t ev;
    /* timing-enabled: event_elapsed_ms times device work (the runtime's collectives) */
    PCS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDefault));
    *out = reinterpret_cast<pcs_event_t>(ev);
    return PCS_OK;
}

void cu_event_destroy(pcs_event_t e)
{
    if (e != NULL)
        (void)cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e));
}

pcs_status_t cu_event_record(pcs_event_t e, pcs_stream_t s)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_record: NULL event");
    PCS_CUDA_CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(e), cs(s)));
    return PCS_OK;
}

pcs_status_t cu_stream_wait_event(pcs_stream_t s, pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_wait_event: NULL event");
    PCS_CUDA_CHECK(cudaStreamWaitEvent(cs(s), reinterpret_cast<cudaEvent_t>(e), 0));
    return PCS_OK;
}

pcs_status_t cu_event_sync(pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_sync: NULL event");
    PCS_CUDA_CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(e)));
    return PCS_OK;
}

pcs_status_t cu_event_elapsed_ms(pcs_event_t start, pcs_event_t end, float *ms)
{
    if (start == NULL || end == NULL || ms == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_elapsed_ms: NULL argument");
    PCS_CUDA_CHECK(cudaEventElapsedTime(ms, reinterpret_cast<cudaEvent_t>(start),
                                        reinterpret_cast<cudaEvent_t>(end)));
    return PCS_OK;
}

// ----------------------------------------------------------------------------
// ops

pcs_status_t cu_cast(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count, pcs_stream_t s)
{
    auto vec = [&](size_t k) { return aligned16(dst[k].data) && aligned16(src[k].data); };
    auto key = [&](size_t k) { return dkey(dst[k].dtype, src[k].dtype, vec(k)); };
    return for_batches(count, src, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        const size_t k0 = idx[0];
        if (dst[k0].dtype == src[k0].dtype) { /* same dtype: a copy engine copy each */
            for (size_t j = 0; j < nb; j++)
                PCS_CHECK(cu_copy(dst[idx[j]].data, src[idx[j]].data,
                                  src[idx[j]].n * pcs_dtype_size(src[idx[j]].dtype), PCS_COPY_D2D,
                                  s));
            return PCS_OK;
        }
        Batch2 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            b.a[j] = dst[idx[j]].data;
            b.b[j] = src[idx[j]].data;
            b.n[j] = src[idx[j]].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        const bool v = vec(k0);
        dim3 grid(grid_x(v ? PCS_CEIL_DIV(maxn, (size_t)kVec) : maxn, nb), (unsigned)nb);
        return with_dtype(dst[k0].dtype, [&](auto D) {
            return with_dtype(src[k0].dtype, [&](auto S) {
                using DT = decltype(D);
                using ST = decltype(S);
                if (v)
                    cast_kernel<DT, ST, true><<<grid, kThreads, 0, cs(s)>>>(b);
                else
                    cast_kernel<DT, ST, false><<<grid, kThreads, 0, cs(s)>>>(b);
                return launch_check("cast");
            });
        });
    });
}

pcs_status_t cu_scale(const pcs_tensor_t *t, size_t count, double factor, pcs_stream_t s)
{
    auto key = [&](size_t k) { return dkey(t[k].dtype, t[k].dtype, aligned16(t[k].data)); };
    return for_batches(count, t, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        Batch2 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            b.a[j] = t[idx[j]].data;
            b.b[j] = NULL;
            b.n[j] = t[idx[j]].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        const bool v = aligned16(t[idx[0]].data);
        dim3 grid(grid_x(v ? PCS_CEIL_DIV(maxn, (size_t)kVec) : maxn, nb), (unsigned)nb);
        return with_dtype(t[idx[0]].dtype, [&](auto X) {
            using XT = decltype(X);
            const typename XT::F f = (typename XT::F)factor; /* fp32, or fp64 for fp64 */
            if (v)
                scale_kernel<XT, true><<<grid, kThreads, 0, cs(s)>>>(b, f);
            else
                scale_kernel<XT, false><<<grid, kThreads, 0, cs(s)>>>(b, f);
            return launch_check("scale");
        });
    });
}

pcs_status_t cu_accumulate(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                           pcs_stream_t s)
{
    auto vec = [&](size_t k) { return aligned16(dst[k].data) && aligned16(src[k].data); };
    auto key = [&](size_t k) { return dkey(dst[k].dtype, src[k].dtype, vec(k)); };
    return for_batches(count, src, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        Batch2 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            b.a[j] = dst[idx[j]].data;
            b.b[j] = src[idx[j]].data;
            b.n[j] = src[idx[j]].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        const size_t k0 = idx[0];
        const bool v = vec(k0);
        dim3 grid(grid_x(v ? PCS_CEIL_DIV(maxn, (size_t)kVec) : maxn, nb), (unsigned)nb);
        return with_dtype(dst[k0].dtype, [&](auto D) {
            return with_dtype(src[k0].dtype, [&](auto S) {
                using DT = decltype(D);
                using ST = decltype(S);
                if (v)
                    accumulate_kernel<DT, ST, true><<<grid, kThreads, 0, cs(s)>>>(b);
                else
                    accumulate_kernel<DT, ST, false><<<grid, kThreads, 0, cs(s)>>>(b);
                return launch_check("accumulate");
            });
        });
    });
}

pcs_status_t cu_nonfinite(const pcs_tensor_t *t, size_t count, float *found_inf,
                          const float *inv_scale, pcs_stream_t s)
{
    auto key = [&](size_t k) { return dkey(t[k].dtype, t[k].dtype, false); };
    return for_batches(count, t, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        Batch2 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            b.a[j] = t[idx[j]].data;
            b.b[j] = NULL;
            b.n[j] = t[idx[j]].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        dim3 grid(grid_x(maxn, nb), (unsigned)nb);
        return with_dtype(t[idx[0]].dtype, [&](auto X) {
            nonfinite_kernel<decltype(X)><<<grid, kThreads, 0, cs(s)>>>(b, found_inf, inv_scale);
            return launch_check("nonfinite_check_and_unscale");
        });
    });
}

pcs_status_t cu_sum_squares(const pcs_tensor_t *t, size_t count, float *out, pcs_stream_t s)
{
    auto key = [&](size_t k) { return dkey(t[k].dtype, t[k].dtype, false); };
    /* pass 1 on the host: count the partial sums the batches will produce */
    size_t npart = 0;
    PCS_CHECK(for_batches(count, t, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++)
            maxn = t[idx[j]].n > maxn ? t[idx[j]].n : maxn;
        npart += (size_t)grid_x(maxn, nb) * nb;
        return PCS_OK;
    }));
    double *partial = NULL;
    PCS_CUDA_CHECK(cudaMallocAsync((void **)&partial, (npart ? npart : 1) * sizeof(double), cs(s)));
    size_t base = 0;
    pcs_status_t rc = for_batches(count, t, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        Batch2 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            b.a[j] = NULL;
            b.b[j] = t[idx[j]].data;
            b.n[j] = t[idx[j]].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        dim3 grid(grid_x(maxn, nb), (unsigned)nb);
        pcs_status_t r = with_dtype(t[idx[0]].dtype, [&](auto X) {
            sumsq_kernel<decltype(X)><<<grid, kThreads, 0, cs(s)>>>(b, partial, base);
            return launch_check("sum_squares");
        });
        base += (size_t)grid.x * nb;
        return r;
    });
    if (rc == PCS_OK) {
        sumsq_final_kernel<<<1, kThreads, 0, cs(s)>>>(partial, npart, out);
        rc = launch_check("sum_squares final");
    }
    cudaError_t e = cudaFreeAsync(partial, cs(s));
    if (rc == PCS_OK && e != cudaSuccess) {
        PCS_WARN(PCS_SUB_KERNEL, "cudaFreeAsync failed: %s", cudaGetErrorString(e));
        rc = PCS_ERR_CUDA;
    }
    return rc;
}

pcs_status_t cu_adamw(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                      const pcs_tensor_t *exp_avg, const pcs_tensor_t *exp_avg_sq, size_t count,
                      const pcs_adamw_config_t *cfg, int64_t step, pcs_stream_t s)
{
    pcs_adamw_coef_t c;
    pcs_adamw_coef(cfg, step, &c);
    auto vec = [&](size_t k) {
        return aligned16(param[k].data) && aligned16(grad[k].data) && aligned16(exp_avg[k].data) &&
               aligned16(exp_avg_sq[k].data);
    };
    auto key = [&](size_t k) {
        return param[k].dtype == PCS_DTYPE_FP64 ? 2u : vec(k) ? 1u : 0u;
    };
    return for_batches(count, param, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        if (param[idx[0]].dtype == PCS_DTYPE_FP64) {
            pcs_adamw_coef64_t c64;
            pcs_adamw_coef64(cfg, step, &c64);
            size_t maxn;
            Batch4D b = batch4d(idx, nb, param, grad, exp_avg, exp_avg_sq, &maxn);
            dim3 grid(grid_x(maxn, nb), (unsigned)nb);
            adamw64_kernel<<<grid, kThreads, 0, cs(s)>>>(b, c64);
            return launch_check("adamw_update");
        }
        Batch4 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            size_t k = idx[j];
            b.p[j] = static_cast<float *>(param[k].data);
            b.g[j] = static_cast<const float *>(grad[k].data);
            b.m[j] = static_cast<float *>(exp_avg[k].data);
            b.v[j] = static_cast<float *>(exp_avg_sq[k].data);
            b.n[j] = param[k].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        const bool v = vec(idx[0]);
        dim3 grid(grid_x(v ? PCS_CEIL_DIV(maxn, (size_t)4) : maxn, nb), (unsigned)nb);
        if (v)
            adamw_kernel<true><<<grid, kThreads, 0, cs(s)>>>(b, c);
        else
            adamw_kernel<false><<<grid, kThreads, 0, cs(s)>>>(b, c);
        return launch_check("adamw_update");
    });
}

pcs_status_t cu_sgd(const pcs_tensor_t *param, const pcs_tensor_t *grad, const pcs_tensor_t *buf,
                    size_t count, const pcs_sgd_config_t *cfg, int first_step, pcs_stream_t s)
{
    pcs_sgd_coef_t c;
    pcs_sgd_coef(cfg, first_step, &c);
    auto key = [&](size_t k) { return param[k].dtype == PCS_DTYPE_FP64 ? 1u : 0u; };
    return for_batches(count, param, key, [&](const size_t *idx, size_t nb) -> pcs_status_t {
        if (param[idx[0]].dtype == PCS_DTYPE_FP64) {
            pcs_sgd_coef64_t c64;
            pcs_sgd_coef64(cfg, first_step, &c64);
            size_t maxn;
            Batch4D b = batch4d(idx, nb, param, grad, c64.use_momentum ? buf : NULL, NULL, &maxn);
            dim3 grid(grid_x(maxn, nb), (unsigned)nb);
            sgd64_kernel<<<grid, kThreads, 0, cs(s)>>>(b, c64);
            return launch_check("sgd_update");
        }
        Batch4 b;
        size_t maxn = 0;
        for (size_t j = 0; j < nb; j++) {
            size_t k = idx[j];
            b.p[j] = static_cast<float *>(param[k].data);
            b.g[j] = static_cast<const float *>(grad[k].data);
            b.m[j] = c.use_momentum ? static_cast<float *>(buf[k].data) : NULL;
            b.v[j] = NULL;
            b.n[j] = param[k].n;
            maxn = b.n[j] > maxn ? b.n[j] : maxn;
        }
        dim3 grid(grid_x(maxn, nb), (unsigned)nb);
        sgd_kernel<<<grid, kThreads, 0, cs(s)>>>(b, c);
        return launch_check("sgd_update");
    });
}

int cu_device_count(void)
{
    return dev_info().count;
}

pcs_status_t cu_set_device(int ordinal)
{
    int n = dev_info().count;
    if (ordinal < 0 || ordinal >= n)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "set_device: device %d out of range (%d visible)",
                             ordinal, n);
    PCS_CUDA_CHECK(cudaSetDevice(ordinal));
    return PCS_OK;
}

pcs_status_t cu_device_info(int ordinal, char *name, size_t cap, uint64_t *memory_bytes)
{
    int n = dev_info().count;
    if (ordinal < 0 || ordinal >= n)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "device_info: device %d out of range (%d visible)", ordinal, n);
    cudaDeviceProp p;
    PCS_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
    if (name != NULL && cap > 0)
        snprintf(name, cap, "%s", p.name);
    if (memory_bytes != NULL)
        *memory_bytes = (uint64_t)p.totalGlobalMem;
    return PCS_OK;
}

const pcs_kernel_ops_t cuda_kernels = {
    cu_fill, cu_cast, cu_scale, cu_accumulate, cu_nonfinite, cu_sum_squares, cu_adamw, cu_sgd,
    nullptr, /* accumulate_sumsq: not fused on the GPU (the runtime runs the two kernels) */
};

/* positional, in kernels.h order */
const pcs_backend_ops_t cuda_ops = {
    "cuda",
    cu_alloc,
    cu_free,
    cu_host_alloc,
    cu_host_free,
    cu_copy,
    cu_stream_create,
    cu_stream_destroy,
    cu_sync,
    cu_event_create,
    cu_event_destroy,
    cu_event_record,
    cu_stream_wait_event,
    cu_event_sync,
    &cuda_kernels,
    cu_device_count,
    cu_set_device,
    cu_device_info,
    cu_event_elapsed_ms,
    cu_alloc_async,
    cu_free_async,
};

} // namespace

// ----------------------------------------------------------------------------
// registry hooks (extern "C" through kernels_internal.h)

int pcs_backend_cuda_built(void)
{
    return 1;
}

pcs_status_t pcs_backend_cuda_get(const pcs_backend_ops_t **out)
{
    *out = NULL;
    if (dev_info().count <= 0)
        return pcs_set_error(PCS_ERR_UNSUPPORTED,
                             "kernel backend 'cuda' is built but no CUDA device is available");
    *out = &cuda_ops;
    return PCS_OK;
}
