/* CUDA error checking for the kernels .cu files only (no other directory sees CUDA headers). The
 * first failing call logs one WARN with the call text and CUDA's message, and returns PCS_ERR_CUDA.
 */
#ifndef PCS_CUDA_CHECK_H
#define PCS_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "pcs/log.h"
#include "pcs/status.h"

#define PCS_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)cudaGetLastError(); /* a non-sticky error must not blame the next launch */      \
            PCS_WARN(PCS_SUB_KERNEL, "%s failed: %s (%s)", #call, cudaGetErrorString(e_),          \
                     cudaGetErrorName(e_));                                                        \
            return PCS_ERR_CUDA;                                                                   \
        }                                                                                          \
    } while (0)

#define PCS_CEIL_DIV(a, b) (((a) + (b)-1) / (b))

#endif
