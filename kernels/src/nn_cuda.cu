/* The "cuda" nn implementation: the built-in MLP's numerics on the GPU, twin of nn_cpu.c.
 * Representation: activations and their gradients stay fp32 device arrays carrying values rounded
 * to the tagged dtype (the project's representation, so model.c's tape, casts and accumulation
 * are the same code on both backends). A bf16/fp16 Linear converts its fp32 operands to real
 * bf16/fp16 scratch (exact: they hold representable values) and runs cublasGemmEx (16BF/16F in,
 * CUBLAS_COMPUTE_32F, fp32 out): products of bf16/fp16 values are exact in fp32, so it equals the
 * CPU's sgemm up to summation order and the tensor cores' fp32 accumulation (several products
 * added at once, not one IEEE rounding per add: the same as PyTorch on the GPU); an fp32 Linear is
 * cublasSgemm with CUBLAS_DEFAULT_MATH (no TF32, PyTorch's allow_tf32=False for matmul). A bias +
 * round-to-dtype epilogue follows. Everything else calls the element math nn_cpu.c calls
 * (nn_math.h: the same expressions and rounding, --fmad=false): column sums (db, BatchNorm,
 * LayerNorm dW/db) loop over rows in the CPU's order and give its bits; LayerNorm's row sums are
 * fp32 in nn_math.h's lane order (the block computes each chunk's terms, the first warp adds them
 * lane by lane, then a shuffle-down tree), the CPU's bits too; erff/expf are CUDA's (within 2
 * ulp of glibc). One cublasHandle_t per context, bound to the context's stream, with its own
 * workspace. Errors: PCS_ERR_CUDA with one WARN naming the failing call. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kernels_internal.h"
#include "nn_internal.h"
#include "nn_math.h"
#include "pcs/half.h"
#include "pcs/log.h"

#define PCS_CUBLAS_CHECK(call)                                                                     \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            PCS_WARN(PCS_SUB_KERNEL, "%s failed: %s (%s)", #call, cublasGetStatusString(st_),      \
                     cublasGetStatusName(st_));                                                    \
            return PCS_ERR_CUDA;                                                                   \
        }                                                                                          \
    } while (0)

/* A launch error (bad configuration) shows up here; execution errors at the next sync. */
#define PCS_LAUNCH_CHECK(what)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess) {                                                                   \
            PCS_WARN(PCS_SUB_KERNEL, "launch of %s failed: %s (%s)", what, cudaGetErrorString(e_), \
                     cudaGetErrorName(e_));                                                        \
            return PCS_ERR_CUDA;                                                                   \
        }                                                                                          \
    } while (0)

namespace
{

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;               /* grid-stride beyond this */
constexpr size_t kBlasWorkspace = (size_t)32 << 20; /* NVIDIA's recommendation for Hopper */

struct CudaNN {
    cublasHandle_t blas;
    void *blas_ws;
    void *ha; /* bf16/fp16 copy of GEMM operand A */
    size_t ha_bytes;
    void *hb; /* ... and operand B */
    size_t hb_bytes;
    float *f32; /* fp32 dW / db / norm dweight+dbias before rounding and storing */
    size_t f32_bytes;
};

const pcs_nn_ops_t *cuda_table(void);

inline cudaStream_t cs(const pcs_nn_t *nn)
{
    return reinterpret_cast<cudaStream_t>(nn->stream);
}

inline CudaNN *impl(pcs_nn_t *nn)
{
    return static_cast<CudaNN *>(nn->impl);
}

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    if (b < 1)
        b = 1;
    return (unsigned)(b > kMaxBlocks ? kMaxBlocks : b);
}

/* Blocks for a thread-per-column kernel (no grid-stride loop: each thread owns column j), so
 * not capped like blocks_for: a cap would leave columns >= kMaxBlocks*kThreads (2^20) unwritten.
 * n < 2^32, so at most 2^24 blocks, within gridDim.x's 2^31-1. */
unsigned blocks_cover(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Grow a device scratch buffer (contents not kept); growth happens only on the first passes.
 * Stream-ordered (cudaFreeAsync/cudaMallocAsync on the context's stream): the old buffer is
 * released after the work already enqueued that reads it, with no host wait. Not cudaFree: it
 * synchronizes the whole device, and the first passes run while the runtime's prefetch and
 * reduction threads have NCCL kernels in flight on other streams, which wait for peers; a device
 * sync there is the cross-thread deadlock NCCL's docs warn about (and stalls overlap anyway). */
pcs_status_t grow(pcs_nn_t *nn, void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return PCS_OK;
    if (*p) {
        PCS_CUDA_CHECK(cudaFreeAsync(*p, cs(nn)));
        *p = NULL;
        *cap = 0;
    }
    PCS_CUDA_CHECK(cudaMallocAsync(p, bytes, cs(nn)));
    *cap = bytes;
    return PCS_OK;
}

// ----------------------------------------------------------------------------
// element access: widen to fp32 exactly, round once (pcs/half.h: the CPU's bits)

__device__ __forceinline__ float ldv(const void *p, int dt, size_t i)
{
    switch (dt) {
    case PCS_DTYPE_BF16:
        return pcs_bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    case PCS_DTYPE_FP16:
        return pcs_fp16_to_f32(static_cast<const uint16_t *>(p)[i]);
    default:
        return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void stv(void *p, int dt, size_t i, float v)
{
    switch (dt) {
    case PCS_DTYPE_BF16:
        static_cast<uint16_t *>(p)[i] = pcs_f32_to_bf16(v);
        break;
    case PCS_DTYPE_FP16:
        static_cast<uint16_t *>(p)[i] = pcs_f32_to_fp16(v);
        break;
    case PCS_DTYPE_FP64:
        static_cast<double *>(p)[i] = (double)v;
        break;
    default:
        static_cast<float *>(p)[i] = v;
        break;
    }
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

// ----------------------------------------------------------------------------
// CUDA kernels: element-wise

__global__ void k_copy_round(float *dst, const float *src, size_t n, int dt)
{
    GRID_STRIDE(i, n)
    dst[i] = pcs_nn_round_to(src[i], dt);
}

__global__ void k_add(float *y, const float *a, const float *b, size_t n, int dt)
{
    GRID_STRIDE(i, n)
    y[i] = pcs_nn_round_to(a[i] + b[i], dt);
}

__global__ void k_relu_fwd(float *y, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
    y[i] = pcs_nn_relu_fwd(x[i]);
}

__global__ void k_gelu_fwd(float *y, const float *x, size_t n, int dt)
{
    GRID_STRIDE(i, n)
    y[i] = pcs_nn_round_to(pcs_nn_gelu_fwd(x[i]), dt);
}

__global__ void k_relu_bwd(float *dx, const float *y, const float *dy, size_t n)
{
    GRID_STRIDE(i, n)
    dx[i] = pcs_nn_relu_bwd(y[i], dy[i]);
}

__global__ void k_gelu_bwd(float *dx, const float *x, const float *dy, size_t n)
{
    GRID_STRIDE(i, n)
    dx[i] = pcs_nn_gelu_bwd(x[i], dy[i]);
}

/* fp32 values representable in dt -> real dt storage (exact), for the GEMM operands. */
__global__ void k_to_half(uint16_t *dst, const float *src, size_t n, int dt)
{
    GRID_STRIDE(i, n)
    dst[i] = dt == PCS_DTYPE_BF16 ? pcs_f32_to_bf16(src[i]) : pcs_f32_to_fp16(src[i]);
}

/* Gradient store: round to the parameter's dtype when the gradient's differs, store as gdt; or,
 * accumulating, add to the held value (pcs_nn_grad_acc) and store that. */
__global__ void k_store_grad(void *dst, int gdt, const float *src, size_t n, int pdt, int acc)
{
    GRID_STRIDE(i, n)
    stv(dst, gdt, i,
        acc ? pcs_nn_grad_acc(ldv(dst, gdt, i), src[i], pdt) : pcs_nn_grad_round(src[i], gdt, pdt));
}

// ----------------------------------------------------------------------------
// CUDA kernels: Linear epilogue and column sums

/* y[r, j] = round(y[r, j] + bias[j], dt) (bias NULL: just the rounding). */
__global__ void k_bias_round(float *y, const void *bias, size_t rows, uint32_t n, int dt)
{
    GRID_STRIDE(i, rows * n)
    y[i] = pcs_nn_bias_round(y[i], bias ? ldv(bias, dt, i % n) : 0.0f, bias != NULL, dt);
}

/* out[j] = sum over rows of dy[r, j] in fp32, rows in order: the CPU's db loop, same bits. */
__global__ void k_colsum(float *out, const float *dy, uint32_t rows, uint32_t n)
{
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    out[j] = pcs_nn_col_sum(dy + j, n, rows);
}

// ----------------------------------------------------------------------------
// CUDA kernels: LayerNorm (block per row, row sums in chunks; thread per column for dW/db)

/* A warp's shuffle-down tree over PCS_NN_LANES = 32 lanes (nn_math.h's lane order): lane 0 gets
 * the CPU twin's pcs_nn_lane_tree bits. */
__device__ float lane_tree(float v)
{
    static_assert(PCS_NN_LANES == 32, "one lane per thread of a warp");
    for (int o = PCS_NN_LANES / 2; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* K row sums of terms f(j, t[K]) over j < D in nn_math.h's lane order, written to out[K] (shared)
 * and visible to the whole block on return. The block computes the terms of a chunk of kThreads
 * elements into sh (thread i: element base + i, all loads in flight at once); lane l of the first
 * warp then adds sh[l], sh[l + 32], ... in order: element j still goes to lane j % 32 in order of
 * j (kThreads is a multiple of 32), so the bits are the CPU's. out must not be read by any thread
 * during the call (thread 0 writes it at the end). */
template <int K, typename F>
__device__ __forceinline__ void ln_row_sums(uint32_t D, F f, float (*sh)[kThreads], float *out)
{
    static_assert(kThreads % PCS_NN_LANES == 0, "chunks keep every element in its lane");
    float acc[K];
#pragma unroll
    for (int k = 0; k < K; k++)
        acc[k] = 0.0f;
    for (size_t base = 0; base < D; base += kThreads) {
        size_t j = base + threadIdx.x;
        if (j < D) {
            float t[K];
            f((uint32_t)j, t);
#pragma unroll
            for (int k = 0; k < K; k++)
                sh[k][threadIdx.x] = t[k];
        }
        __syncthreads();
        if (threadIdx.x < PCS_NN_LANES) {
            uint32_t n = D - base < (size_t)kThreads ? (uint32_t)(D - base) : (uint32_t)kThreads;
            for (uint32_t i = threadIdx.x; i < n; i += PCS_NN_LANES)
#pragma unroll
                for (int k = 0; k < K; k++)
                    acc[k] += sh[k][i];
        }
        __syncthreads(); /* sh is rewritten by the next chunk */
    }
    if (threadIdx.x < PCS_NN_LANES)
#pragma unroll
        for (int k = 0; k < K; k++) {
            float v = lane_tree(acc[k]);
            if (threadIdx.x == 0)
                out[k] = v;
        }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    k_ln_fwd(float *Y, const float *X, uint32_t D, const void *w, int wdt, const void *b, int bdt,
             float *save, int dt)
{
    __shared__ float sh[2][kThreads];
    __shared__ float st[2];
    size_t r = blockIdx.x;
    const float *x = X + r * D;
    float *y = Y + r * D;
    ln_row_sums<1>(D, [&](uint32_t j, float *t) { t[0] = x[j]; }, sh, &st[0]);
    float mean = pcs_nn_ln_mean(st[0], D); /* st[0] is read here, so the next sum goes to st[1] */
    ln_row_sums<1>(D, [&](uint32_t j, float *t) { t[0] = pcs_nn_ln_sq(x[j], mean); }, sh, &st[1]);
    float rstd = pcs_nn_ln_rstd(st[1], D);
    if (threadIdx.x == 0) {
        save[2 * r] = mean;
        save[2 * r + 1] = rstd;
    }
    for (uint32_t j = threadIdx.x; j < D; j += kThreads)
        y[j] = pcs_nn_round_to(pcs_nn_norm_out(x[j], mean, rstd, ldv(w, wdt, j), ldv(b, bdt, j)),
                               dt);
}

/* dx for one row: m1 = mean(dy*w), m2 = mean(dy*w*xhat) in the lane order (the CPU's bits). */
__global__ void __launch_bounds__(kThreads)
    k_ln_bwd_dx(float *dX, const float *X, const float *dY, uint32_t D, const void *w, int wdt,
                const float *save)
{
    __shared__ float sh[2][kThreads];
    __shared__ float st[2];
    size_t r = blockIdx.x;
    const float *x = X + r * D, *dy = dY + r * D;
    float mean = save[2 * r], rstd = save[2 * r + 1];
    ln_row_sums<2>(
        D,
        [&](uint32_t j, float *t) {
            pcs_nn_ln_bwd_terms(dy[j], ldv(w, wdt, j), pcs_nn_xhat(x[j], mean, rstd), &t[0], &t[1]);
        },
        sh, st);
    float m1 = pcs_nn_ln_mean(st[0], D), m2 = pcs_nn_ln_mean(st[1], D);
    float *dx = dX + r * D;
    for (uint32_t j = threadIdx.x; j < D; j += kThreads)
        dx[j] = pcs_nn_ln_dx(dy[j], ldv(w, wdt, j), pcs_nn_xhat(x[j], mean, rstd), rstd, m1, m2);
}

/* dweight[j] = sum_r dy*xhat, dbias[j] = sum_r dy in fp32, rows in order (the CPU's order). */
__global__ void k_ln_bwd_params(float *dw, float *db, const float *X, const float *dY, uint32_t R,
                                uint32_t D, const float *save)
{
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    float sw = 0.0f, sb = 0.0f;
    for (uint32_t r = 0; r < R; r++) {
        float dy = dY[(size_t)r * D + j];
        pcs_nn_norm_param_acc(dy, pcs_nn_xhat(X[(size_t)r * D + j], save[2 * r], save[2 * r + 1]),
                              &sw, &sb);
    }
    dw[j] = sw;
    db[j] = sb;
}

// ----------------------------------------------------------------------------
// CUDA kernels: BatchNorm1d (thread per feature, rows in the CPU's order)

/* save = [mean, invstd, running_mean, running_var] as fp32, 4*D floats. Training also updates
 * the running statistics in their dtypes and num_batches_tracked. */
__global__ void k_bn_stats(float *save, const float *X, uint32_t R, uint32_t D, void *rm, int rmdt,
                           void *rv, int rvdt, int64_t *nbt, int training)
{
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    float *mean = save, *invstd = save + D, *run = save + 2 * D;
    run[j] = ldv(rm, rmdt, j);
    run[D + j] = ldv(rv, rvdt, j);
    if (training) {
        pcs_nn_bn_train_col(X + j, D, R, &mean[j], &invstd[j], &run[j], &run[D + j]);
        stv(rm, rmdt, j, run[j]);
        stv(rv, rvdt, j, run[D + j]);
        if (j == 0 && nbt)
            (*nbt)++;
    } else {
        mean[j] = run[j];
        invstd[j] = pcs_nn_bn_eval_invstd(run[D + j]);
    }
}

__global__ void k_bn_apply(float *Y, const float *X, size_t R, uint32_t D, const float *save,
                           const void *w, int wdt, const void *b, int bdt, int dt)
{
    const float *mean = save, *invstd = save + D;
    GRID_STRIDE(i, R * D)
    {
        uint32_t j = (uint32_t)(i % D);
        Y[i] = pcs_nn_round_to(
            pcs_nn_norm_out(X[i], mean[j], invstd[j], ldv(w, wdt, j), ldv(b, bdt, j)), dt);
    }
}

/* dweight, dbias into dwb[j], dwb[D + j]; dX (may be NULL) for feature j. */
__global__ void k_bn_bwd(float *dwb, float *dX, const float *X, const float *dY, uint32_t R,
                         uint32_t D, const float *save, const void *w, int wdt)
{
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    const float *mean = save, *invstd = save + D;
    pcs_nn_bn_bwd_col(X + j, dY + j, dX ? dX + j : NULL, D, R, mean[j], invstd[j], ldv(w, wdt, j),
                      &dwb[j], &dwb[D + j]);
}

// ----------------------------------------------------------------------------
// kernel launchers and the vtable

pcs_status_t store_grad(pcs_nn_t *nn, const pcs_nn_grad_t *g, const float *src, size_t n)
{
    k_store_grad<<<blocks_for(n), kThreads, 0, cs(nn)>>>(g->data, (int)g->dtype, src, n,
                                                         (int)g->param_dtype, g->accumulate);
    PCS_LAUNCH_CHECK("k_store_grad");
    return PCS_OK;
}

/* A dt copy of n fp32 values in scratch *buf (exact: the values are representable). */
pcs_status_t to_half(pcs_nn_t *nn, void **buf, size_t *cap, const float *src, size_t n,
                     pcs_dtype_t dt)
{
    PCS_CHECK(grow(nn, buf, cap, n * sizeof(uint16_t)));
    k_to_half<<<blocks_for(n), kThreads, 0, cs(nn)>>>(static_cast<uint16_t *>(*buf), src, n,
                                                      (int)dt);
    PCS_LAUNCH_CHECK("k_to_half");
    return PCS_OK;
}

cudaDataType_t cuda_type(pcs_dtype_t dt)
{
    return dt == PCS_DTYPE_BF16 ? CUDA_R_16BF : dt == PCS_DTYPE_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* C (column-major m x n, ldc) = op(A) op(B), fp32 out, fp32 accumulation; A/B of type dt. */
pcs_status_t gemm(pcs_nn_t *nn, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const void *A, int lda, const void *B, int ldb, float *C, int ldc, pcs_dtype_t dt)
{
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = impl(nn)->blas;
    if (dt == PCS_DTYPE_FP32) {
        PCS_CUBLAS_CHECK(cublasSgemm(h, ta, tb, m, n, k, &one, static_cast<const float *>(A), lda,
                                     static_cast<const float *>(B), ldb, &zero, C, ldc));
        return PCS_OK;
    }
    PCS_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &one, A, cuda_type(dt), lda, B, cuda_type(dt),
                                  ldb, &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    return PCS_OK;
}

void cu_destroy(pcs_nn_t *nn)
{
    if (!nn)
        return;
    CudaNN *c = impl(nn);
    if (c) {
        /* the scratch came from cudaMallocAsync on the stream (grow); queued work may still
         * use it and the workspace */
        if (c->ha)
            (void)cudaFreeAsync(c->ha, cs(nn));
        if (c->hb)
            (void)cudaFreeAsync(c->hb, cs(nn));
        if (c->f32)
            (void)cudaFreeAsync(c->f32, cs(nn));
        (void)cudaStreamSynchronize(cs(nn));
        if (c->blas)
            (void)cublasDestroy(c->blas);
        (void)cudaFree(c->blas_ws);
        free(c);
    }
    free(nn);
}

pcs_status_t cu_create_into(pcs_nn_t *nn)
{
    CudaNN *c = impl(nn);
    /* cublasCreate binds the handle (and the workspace below) to the calling thread's current
     * device: a stream of another device would fail at the first GEMM with a vague status */
    int cur = -1, sdev = -1;
    PCS_CUDA_CHECK(cudaGetDevice(&cur));
    PCS_CUDA_CHECK(cudaStreamGetDevice(cs(nn), &sdev));
    if (sdev != cur)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "nn cuda create: the stream is on device %d but the current device "
                             "is %d (be->set_device(%d) first)",
                             sdev, cur, sdev);
    PCS_CUBLAS_CHECK(cublasCreate(&c->blas));
    PCS_CUBLAS_CHECK(cublasSetStream(c->blas, cs(nn)));
    /* after SetStream, which resets the handle to the default workspace pool */
    PCS_CUDA_CHECK(cudaMalloc(&c->blas_ws, kBlasWorkspace));
    PCS_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, kBlasWorkspace));
    /* no TF32: fp32 GEMMs are IEEE fp32 FMAs, as PyTorch's default allow_tf32=False */
    PCS_CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    return PCS_OK;
}

pcs_status_t cu_create(const pcs_backend_ops_t *be, pcs_stream_t s, pcs_nn_t **out)
{
    if (!be || !out || strcmp(be->name, "cuda") != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "nn cuda create: needs the cuda backend (got %s)",
                             be ? be->name : "NULL");
    *out = NULL;
    pcs_nn_t *nn = static_cast<pcs_nn_t *>(calloc(1, sizeof *nn));
    CudaNN *c = static_cast<CudaNN *>(calloc(1, sizeof *c));
    if (!nn || !c) {
        free(nn);
        free(c);
        return pcs_set_error(PCS_ERR_NOMEM, "nn cuda create: out of memory");
    }
    nn->ops = cuda_table();
    nn->be = be;
    nn->stream = s;
    nn->impl = c;
    pcs_status_t rc = cu_create_into(nn);
    if (rc != PCS_OK) {
        cu_destroy(nn);
        return rc;
    }
    *out = nn;
    return PCS_OK;
}

pcs_status_t cu_copy_round(pcs_nn_t *nn, float *dst, const float *src, size_t n, pcs_dtype_t dt)
{
    if (n == 0)
        return PCS_OK;
    if (dt == PCS_DTYPE_FP32) {
        if (dst != src)
            PCS_CUDA_CHECK(
                cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cs(nn)));
        return PCS_OK;
    }
    k_copy_round<<<blocks_for(n), kThreads, 0, cs(nn)>>>(dst, src, n, (int)dt);
    PCS_LAUNCH_CHECK("k_copy_round");
    return PCS_OK;
}

pcs_status_t cu_add(pcs_nn_t *nn, float *y, const float *a, const float *b, size_t n,
                    pcs_dtype_t dt)
{
    if (n == 0)
        return PCS_OK;
    k_add<<<blocks_for(n), kThreads, 0, cs(nn)>>>(y, a, b, n, (int)dt);
    PCS_LAUNCH_CHECK("k_add");
    return PCS_OK;
}

pcs_status_t cu_act_fwd(pcs_nn_t *nn, pcs_nn_act_t act, float *y, const float *x, size_t n,
                        pcs_dtype_t dt)
{
    if (n == 0)
        return PCS_OK;
    if (act == PCS_NN_RELU)
        k_relu_fwd<<<blocks_for(n), kThreads, 0, cs(nn)>>>(y, x, n);
    else
        k_gelu_fwd<<<blocks_for(n), kThreads, 0, cs(nn)>>>(y, x, n, (int)dt);
    PCS_LAUNCH_CHECK("act_fwd");
    return PCS_OK;
}

pcs_status_t cu_act_bwd(pcs_nn_t *nn, pcs_nn_act_t act, float *dx, const float *x, const float *y,
                        const float *dy, size_t n)
{
    if (n == 0)
        return PCS_OK;
    if (act == PCS_NN_RELU)
        k_relu_bwd<<<blocks_for(n), kThreads, 0, cs(nn)>>>(dx, y, dy, n);
    else
        k_gelu_bwd<<<blocks_for(n), kThreads, 0, cs(nn)>>>(dx, x, dy, n);
    PCS_LAUNCH_CHECK("act_bwd");
    return PCS_OK;
}

/* Row-major to cuBLAS (column-major): a row-major M[r, c] buffer with ld c IS the column-major
 * matrix M^T (c x r, ld c). So, with X [R,K], W [N,K], Y [R,N], dY [R,N], dX [R,K], dW [N,K]:
 *   forward  Y = X W^T   <=>  Y^T (N x R) = W (N x K) . X^T (K x R):
 *            A = W buffer (col-major K x N, ld K) with op T; B = X buffer (K x R, ld K) op N;
 *            gemm(T, N, m=N, n=R, k=K, A=W lda=K, B=X ldb=K, C=Y ldc=N)
 *   dX = dY W            <=>  dX^T (K x R) = W^T (K x N) . dY^T (N x R):
 *            gemm(N, N, m=K, n=R, k=N, A=W lda=K, B=dY ldb=N, C=dX ldc=K)
 *   dW = dY^T X          <=>  dW^T (K x N) = X^T (K x R) . dY (R x N):
 *            A = X buffer (K x R, ld K) op N; B = dY buffer (col-major N x R, ld N) op T;
 *            gemm(N, T, m=K, n=N, k=R, A=X lda=K, B=dY ldb=N, C=dW ldc=K) */
pcs_status_t cu_linear_fwd(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *x, float *y)
{
    CudaNN *c = impl(nn);
    int R = (int)l->rows, K = (int)l->in_dim, N = (int)l->out_dim;
    if (l->dtype == PCS_DTYPE_FP32) {
        PCS_CHECK(
            gemm(nn, CUBLAS_OP_T, CUBLAS_OP_N, N, R, K, l->weight, K, x, K, y, N, PCS_DTYPE_FP32));
    } else {
        /* with `saved`, the weight as a backward without a binding reads it */
        if (l->saved)
            PCS_CUDA_CHECK(cudaMemcpyAsync(l->saved, l->weight, (size_t)N * K * sizeof(uint16_t),
                                           cudaMemcpyDeviceToDevice, cs(nn)));
        PCS_CHECK(to_half(nn, &c->ha, &c->ha_bytes, x, (size_t)R * K, l->dtype));
        PCS_CHECK(gemm(nn, CUBLAS_OP_T, CUBLAS_OP_N, N, R, K, l->weight, K, c->ha, K, y, N,
                       l->dtype));
    }
    if (l->bias || l->dtype != PCS_DTYPE_FP32) {
        size_t n = (size_t)R * N;
        k_bias_round<<<blocks_for(n), kThreads, 0, cs(nn)>>>(y, l->bias, (size_t)R, (uint32_t)N,
                                                             (int)l->dtype);
        PCS_LAUNCH_CHECK("k_bias_round");
    }
    return PCS_OK;
}

pcs_status_t cu_linear_bwd_params(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy,
                                  const float *x, const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db)
{
    CudaNN *c = impl(nn);
    int R = (int)l->rows, K = (int)l->in_dim, N = (int)l->out_dim;
    size_t nw = (size_t)N * K;
    if (pcs_nn_wants(dw)) {
        const void *A = x, *B = dy;
        if (l->dtype != PCS_DTYPE_FP32) {
            PCS_CHECK(to_half(nn, &c->ha, &c->ha_bytes, x, (size_t)R * K, l->dtype));
            PCS_CHECK(to_half(nn, &c->hb, &c->hb_bytes, dy, (size_t)R * N, l->dtype));
            A = c->ha;
            B = c->hb;
        }
        if (dw->dtype == PCS_DTYPE_FP32 && dw->param_dtype == PCS_DTYPE_FP32 && !dw->accumulate) {
            /* fp32 gradient of an fp32 weight: no rounding, so the GEMM writes it in place */
            PCS_CHECK(gemm(nn, CUBLAS_OP_N, CUBLAS_OP_T, K, N, R, A, K, B, N,
                           static_cast<float *>(dw->data), K, l->dtype));
        } else {
            PCS_CHECK(grow(nn, (void **)&c->f32, &c->f32_bytes, nw * sizeof(float)));
            PCS_CHECK(gemm(nn, CUBLAS_OP_N, CUBLAS_OP_T, K, N, R, A, K, B, N, c->f32, K, l->dtype));
            PCS_CHECK(store_grad(nn, dw, c->f32, nw));
        }
    }
    if (pcs_nn_wants(db)) {
        PCS_CHECK(grow(nn, (void **)&c->f32, &c->f32_bytes, (size_t)N * sizeof(float)));
        k_colsum<<<blocks_cover((size_t)N), kThreads, 0, cs(nn)>>>(c->f32, dy, (uint32_t)R,
                                                                   (uint32_t)N);
        PCS_LAUNCH_CHECK("k_colsum");
        PCS_CHECK(store_grad(nn, db, c->f32, (size_t)N));
    }
    return PCS_OK;
}

pcs_status_t cu_linear_bwd_input(pcs_nn_t *nn, const pcs_nn_linear_t *l, const float *dy, float *dx)
{
    CudaNN *c = impl(nn);
    int R = (int)l->rows, K = (int)l->in_dim, N = (int)l->out_dim;
    if (l->dtype == PCS_DTYPE_FP32)
        return gemm(nn, CUBLAS_OP_N, CUBLAS_OP_N, K, R, N, l->weight, K, dy, N, dx, K,
                    PCS_DTYPE_FP32);
    PCS_CHECK(to_half(nn, &c->hb, &c->hb_bytes, dy, (size_t)R * N, l->dtype));
    /* the re-gathered binding when given (same values as forward's), else forward's copy */
    const void *w = l->weight ? l->weight : l->saved;
    return gemm(nn, CUBLAS_OP_N, CUBLAS_OP_N, K, R, N, w, K, c->hb, N, dx, K, l->dtype);
}

pcs_status_t cu_norm_fwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, float *y)
{
    uint32_t R = p->rows, D = p->dim;
    if (p->kind == PCS_NN_LAYERNORM) {
        k_ln_fwd<<<R, kThreads, 0, cs(nn)>>>(y, x, D, p->weight, (int)p->weight_dtype, p->bias,
                                             (int)p->bias_dtype, p->save, (int)p->dtype);
        PCS_LAUNCH_CHECK("k_ln_fwd");
        return PCS_OK;
    }
    k_bn_stats<<<blocks_cover(D), kThreads, 0, cs(nn)>>>(
        p->save, x, R, D, p->running_mean, (int)p->mean_dtype, p->running_var, (int)p->var_dtype,
        p->training ? p->num_batches_tracked : NULL, p->training);
    PCS_LAUNCH_CHECK("k_bn_stats");
    size_t n = (size_t)R * D;
    k_bn_apply<<<blocks_for(n), kThreads, 0, cs(nn)>>>(y, x, (size_t)R, D, p->save, p->weight,
                                                       (int)p->weight_dtype, p->bias,
                                                       (int)p->bias_dtype, (int)p->dtype);
    PCS_LAUNCH_CHECK("k_bn_apply");
    return PCS_OK;
}

pcs_status_t cu_norm_bwd(pcs_nn_t *nn, const pcs_nn_norm_t *p, const float *x, const float *dy,
                         float *dx, const pcs_nn_grad_t *dw, const pcs_nn_grad_t *db)
{
    CudaNN *c = impl(nn);
    uint32_t R = p->rows, D = p->dim;
    PCS_CHECK(grow(nn, (void **)&c->f32, &c->f32_bytes, 2 * (size_t)D * sizeof(float)));
    float *gw = c->f32, *gb = c->f32 + D;
    if (p->kind == PCS_NN_LAYERNORM) {
        k_ln_bwd_params<<<blocks_cover(D), kThreads, 0, cs(nn)>>>(gw, gb, x, dy, R, D, p->save);
        PCS_LAUNCH_CHECK("k_ln_bwd_params");
        if (dx) {
            k_ln_bwd_dx<<<R, kThreads, 0, cs(nn)>>>(dx, x, dy, D, p->weight, (int)p->weight_dtype,
                                                    p->save);
            PCS_LAUNCH_CHECK("k_ln_bwd_dx");
        }
    } else {
        k_bn_bwd<<<blocks_cover(D), kThreads, 0, cs(nn)>>>(c->f32, dx, x, dy, R, D, p->save,
                                                           p->weight, (int)p->weight_dtype);
        PCS_LAUNCH_CHECK("k_bn_bwd");
    }
    if (pcs_nn_wants(dw))
        PCS_CHECK(store_grad(nn, dw, gw, D));
    if (pcs_nn_wants(db))
        PCS_CHECK(store_grad(nn, db, gb, D));
    return PCS_OK;
}

const pcs_nn_ops_t cuda_nn_ops = {
    "cuda",     cu_create,     cu_destroy,           cu_copy_round,       cu_add,      cu_act_fwd,
    cu_act_bwd, cu_linear_fwd, cu_linear_bwd_params, cu_linear_bwd_input, cu_norm_fwd, cu_norm_bwd,
};

const pcs_nn_ops_t *cuda_table(void)
{
    return &cuda_nn_ops;
}

} // namespace

// ----------------------------------------------------------------------------
// registry hook (extern "C" through nn_internal.h)

pcs_status_t pcs_nn_cuda_get(const pcs_nn_ops_t **out)
{
    *out = NULL;
    const pcs_backend_ops_t *be = NULL;
    PCS_CHECK(pcs_backend_cuda_get(&be)); /* UNSUPPORTED without a device, with its message */
    *out = &cuda_nn_ops;
    return PCS_OK;
}
