/* Element types shared by kernels, collectives, the planner and the worker. The numeric values
 * equal pcs.v1.DType so that conversion from the protocol is a cast. */
#ifndef PCS_DTYPE_H
#define PCS_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pcs_dtype {
    PCS_DTYPE_NONE = 0, /* unset / inherit (DTYPE_UNSPECIFIED) */
    PCS_DTYPE_FP32 = 1,
    PCS_DTYPE_BF16 = 2,
    PCS_DTYPE_FP16 = 3,
    PCS_DTYPE_FP64 = 4,
    PCS_DTYPE_INT64 = 5,
    PCS_DTYPE_COUNT
} pcs_dtype_t;

/* "fp32", "bf16", "fp16", "fp64", "int64"; "none" for PCS_DTYPE_NONE; "?" if out of range. */
const char *pcs_dtype_name(pcs_dtype_t t);
/* Bytes per element; 0 for NONE or out of range. */
size_t pcs_dtype_size(pcs_dtype_t t);
/* Parse a name (also accepts float32/bfloat16/float16/float64/half); -1 if unknown. */
int pcs_dtype_parse(const char *s);
/* fp32, bf16, fp16, fp64. */
int pcs_dtype_is_float(pcs_dtype_t t);

#ifdef __cplusplus
}
#endif
#endif
