/* dtype names and sizes. */
#include "pcs/dtype.h"

#include <strings.h>

static const struct {
    const char *name;
    const char *alias;
    size_t size;
} dtype_table[PCS_DTYPE_COUNT] = {
    [PCS_DTYPE_NONE] = {"none", "unspecified", 0}, [PCS_DTYPE_FP32] = {"fp32", "float32", 4},
    [PCS_DTYPE_BF16] = {"bf16", "bfloat16", 2},    [PCS_DTYPE_FP16] = {"fp16", "float16", 2},
    [PCS_DTYPE_FP64] = {"fp64", "float64", 8},     [PCS_DTYPE_INT64] = {"int64", "long", 8},
};

const char *pcs_dtype_name(pcs_dtype_t t)
{
    return (unsigned)t < PCS_DTYPE_COUNT ? dtype_table[t].name : "?";
}

size_t pcs_dtype_size(pcs_dtype_t t)
{
    return (unsigned)t < PCS_DTYPE_COUNT ? dtype_table[t].size : 0;
}

int pcs_dtype_parse(const char *s)
{
    for (int i = 0; i < PCS_DTYPE_COUNT; i++)
        if (strcasecmp(s, dtype_table[i].name) == 0 || strcasecmp(s, dtype_table[i].alias) == 0)
            return i;
    if (strcasecmp(s, "half") == 0)
        return PCS_DTYPE_FP16;
    return -1;
}

int pcs_dtype_is_float(pcs_dtype_t t)
{
    return t == PCS_DTYPE_FP32 || t == PCS_DTYPE_BF16 || t == PCS_DTYPE_FP16 ||
           t == PCS_DTYPE_FP64;
}
