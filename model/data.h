/* Training data for the built-in models, addressed by global sample index so that a run on W ranks
 * and a single-process run see the same global batches (DESIGN.md §5): in step s, micro-batch m,
 * data-parallel rank r of D reads the b rows starting at ((s*M + m)*D + r)*b, wrapping around the
 * dataset. Sources: synthetic (a pure function of (seed, index): no state, any rank any row) or a
 * .safetensors / .npy file of inputs and targets, of which each rank reads only its own rows. */
#ifndef PCS_MODEL_DATA_H
#define PCS_MODEL_DATA_H

#include <stdint.h>

#include "model/loss.h"
#include "pcs/dtype.h"
#include "pcs/file.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Pcs__V1__DataSpec;

typedef struct pcs_data pcs_data_t;

#define PCS_DATA_DEFAULT_SAMPLES 65536u

/* Open the data source of a job. Targets are fp32 [output_dim] per row for PCS_LOSS_MSE and one
 * int64 class label per row for PCS_LOSS_CROSS_ENTROPY.
 * Synthetic: inputs N(0,1); a fixed teacher T (N(0,1)/sqrt(input_dim) entries from the seed);
 *   regression targets tanh(T x) + 0.01 N(0,1); classification labels argmax(T x). The task must
 *   agree with the loss (regression <-> mse, classification <-> cross_entropy).
 * File (spec->file): path ending in .safetensors: tensors `inputs` [N, input_dim] (F32/BF16/F16;
 *   F64 read as fp32) and `targets` ([N, output_dim] or [N] when output_dim = 1, floating; [N] I64
 *   labels for cross-entropy); names default to "inputs" / "targets". Path ending in .npy: the
 *   inputs array; `targets` names the targets .npy (relative to the inputs file's directory).
 *   A directory: <dir>/<inputs>.npy and <dir>/<targets>.npy.
 * Errors: PCS_ERR_INVALID_ARG naming the field ("data.file.inputs: ...") or file problem;
 * PCS_ERR_NOT_FOUND for a missing file. Caller closes with pcs_data_close(). */
pcs_status_t pcs_data_open(const struct Pcs__V1__DataSpec *spec, uint32_t input_dim,
                           uint32_t output_dim, pcs_loss_kind_t loss, pcs_data_t **out);
/* The same with the file paths resolved beneath `root` (a worker's data root, pcs/file.h; NULL:
 * as given, for tools and the reference trainer): a path that leaves it is PCS_ERR_PERMISSION. */
pcs_status_t pcs_data_open_in(const struct Pcs__V1__DataSpec *spec, const pcs_root_t *root,
                              uint32_t input_dim, uint32_t output_dim, pcs_loss_kind_t loss,
                              pcs_data_t **out);
void pcs_data_close(pcs_data_t *d);

uint64_t pcs_data_num_samples(const pcs_data_t *d);
/* dtype of the input values (FP32, BF16 or FP16; values delivered as fp32 holding them exactly). */
pcs_dtype_t pcs_data_input_dtype(const pcs_data_t *d);

/* Rows [first, first + n) modulo the dataset size: x gets [n, input_dim] fp32 values, y gets
 * [n, output_dim] fp32 (MSE) or [n] int64 (cross-entropy). Not thread-safe per handle. */
pcs_status_t pcs_data_read(pcs_data_t *d, uint64_t first, uint32_t n, float *x, void *y);

/* First global sample index of (step, micro-batch, dp rank) with M micro-batches per step, D
 * data-parallel ranks and b rows per rank micro-batch: ((step*M + micro)*D + rank)*b. */
uint64_t pcs_data_batch_start(uint64_t step, uint32_t micro, uint32_t M, uint32_t D, uint32_t rank,
                              uint32_t b);

/* The fixed evaluation batch of n rows: synthetic data draws them from a held-out index range
 * (never seen in training); file data uses its last n rows. Same layout as pcs_data_read. */
pcs_status_t pcs_data_read_eval(pcs_data_t *d, uint32_t n, float *x, void *y);

#ifdef __cplusplus
}
#endif
#endif
