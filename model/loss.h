/* Losses of the built-in models, computed in fp32 from the model output (the output is cast to
 * fp32 first, as `loss_fn(out.float(), y)` does): MSE (mean over all elements, torch.nn.MSELoss)
 * and cross-entropy over int64 class labels (mean over rows, torch.nn.CrossEntropyLoss). */
#ifndef PCS_MODEL_LOSS_H
#define PCS_MODEL_LOSS_H

#include <stdint.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PCS_LOSS_MSE = 1, PCS_LOSS_CROSS_ENTROPY = 2 } pcs_loss_kind_t;

/* Mean loss of `rows` rows of `out` ([rows, cols] fp32 values) against `targets` (fp32
 * [rows, cols] for MSE; int64 [rows] class indices for cross-entropy). If grad is not NULL it
 * receives d(scale * loss)/d(out) in fp32 ([rows, cols]); `scale` carries 1/M for gradient
 * accumulation and the grad scaler's factor. *loss gets the unscaled mean loss.
 * Errors: a label outside [0, cols) -> PCS_ERR_INVALID_ARG naming the row. */
pcs_status_t pcs_loss_compute(pcs_loss_kind_t kind, const float *out, uint32_t rows, uint32_t cols,
                              const void *targets, float scale, double *loss, float *grad);

/* "mse" / "cross_entropy". */
const char *pcs_loss_name(pcs_loss_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif
