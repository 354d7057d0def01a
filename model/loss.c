/* MSE and cross-entropy in fp32. The per-element terms are fp32 like PyTorch's kernels; the
 * reduction over the batch is accumulated in double and the mean rounded to fp32 once, which is
 * within an ulp of PyTorch's cascaded fp32 sum. Cross-entropy uses the log-sum-exp shift. */
#include "model/loss.h"

#include <math.h>
#include <stddef.h>

const char *pcs_loss_name(pcs_loss_kind_t kind)
{
    return kind == PCS_LOSS_CROSS_ENTROPY ? "cross_entropy" : "mse";
}

pcs_status_t pcs_loss_compute(pcs_loss_kind_t kind, const float *out, uint32_t rows, uint32_t cols,
                              const void *targets, float scale, double *loss, float *grad)
{
    if (!out || !targets || !loss || rows == 0 || cols == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "loss: bad argument");
    double total = 0;
    if (kind == PCS_LOSS_MSE) {
        const float *y = targets;
        size_t n = (size_t)rows * cols;
        float g = 2.0f * scale / (float)n;
        for (size_t i = 0; i < n; i++) {
            float d = out[i] - y[i];
            total += (double)d * d;
            if (grad)
                grad[i] = g * d;
        }
        *loss = (float)(total / (double)n);
        return PCS_OK;
    }
    if (kind != PCS_LOSS_CROSS_ENTROPY)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "loss: unknown kind %d", (int)kind);
    const int64_t *lab = targets;
    for (uint32_t r = 0; r < rows; r++)
        if (lab[r] < 0 || lab[r] >= (int64_t)cols)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "loss: row %u: target %lld is not a class "
                                 "in [0, %u)",
                                 r, (long long)lab[r], cols);
    float g = scale / (float)rows;
    for (uint32_t r = 0; r < rows; r++) {
        const float *x = out + (size_t)r * cols;
        float mx = x[0];
        for (uint32_t j = 1; j < cols; j++)
            mx = x[j] > mx ? x[j] : mx;
        double se = 0;
        for (uint32_t j = 0; j < cols; j++)
            se += exp((double)(x[j] - mx));
        double lse = mx + log(se);
        total += lse - x[lab[r]];
        if (grad) {
            float *gr = grad + (size_t)r * cols;
            for (uint32_t j = 0; j < cols; j++)
                gr[j] = g * (float)(exp((double)x[j] - lse) - (j == (uint32_t)lab[r]));
        }
    }
    *loss = (float)(total / rows);
    return PCS_OK;
}
