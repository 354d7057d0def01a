/* Deterministic initialization. Every value is a pure function of (seed, FQN, element index)
 * through a counter-based RNG (splitmix64), so any world size, any shard and any rank start from
 * the same full model, and a rank can fill only its own shard. Also: loading full parameters from
 * a .safetensors file keyed by FQN (fine-tuning), with strict name/shape/dtype checks. */
#ifndef PCS_MODEL_INIT_H
#define PCS_MODEL_INIT_H

#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/file.h"
#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_TENSOR_MAX_DIMS 4

/* A named full tensor of the model (a parameter or a buffer), in module-tree order. */
typedef struct pcs_named_tensor {
    const char *fqn;   /* layers.0.linear.weight */
    pcs_dtype_t dtype; /* the original (master) dtype: FP32 for mlp params, INT64 counters */
    uint32_t ndim;
    uint64_t shape[PCS_TENSOR_MAX_DIMS];
    uint64_t numel;
    int is_buffer;
} pcs_named_tensor_t;

// ---- counter-based random numbers (shared with synthetic data) ----

/* splitmix64 finalizer of (key + counter * golden ratio): independent streams per key. */
uint64_t pcs_rng_u64(uint64_t key, uint64_t counter);
/* Uniform in [0, 1) with 24 random bits (exact in fp32). */
float pcs_rng_uniform(uint64_t key, uint64_t counter);
/* Standard normal (Box-Muller over counters 2c and 2c+1). */
float pcs_rng_normal(uint64_t key, uint64_t counter);
/* Key of the stream for (seed, name): mixes both so that equal FQNs under different seeds differ
 * (the name's stream id is its FNV-1a 64, pcs/hash.h). */
uint64_t pcs_rng_key(uint64_t seed, const char *name);

// ---- parameter init ----

/* out[i] = lo + (hi - lo) * U(key(seed, fqn), first + i) for i < n: elements [first, first + n)
 * of the tensor, so shards fill themselves independently. */
void pcs_init_uniform(uint64_t seed, const char *fqn, float lo, float hi, uint64_t first,
                      uint64_t n, float *out);

/* Load the listed tensors from a .safetensors file of full parameters. dst[i] receives t[i].numel
 * values as fp32 (INT64 buffers: as float values, exact below 2^24). Every non-buffer tensor must
 * be present; buffers are optional (left untouched when absent); the file may not hold names that
 * are not in `t` (strict, like load_state_dict). A file dtype other than t[i].dtype or a different
 * shape is PCS_ERR_INVALID_ARG naming the tensor, e.g.
 * "init.from x.safetensors: tensor layers.0.linear.weight: shape [8, 4] in file, model has [8, 3]".
 * `loaded`, if not NULL, gets 1 per tensor found. */
pcs_status_t pcs_init_from_safetensors(const char *path, const pcs_named_tensor_t *t, size_t n,
                                       float *const *dst, int *loaded);
/* The same with `path` resolved beneath `root` (a worker's init root; NULL: as given). */
pcs_status_t pcs_init_from_safetensors_in(const pcs_root_t *root, const char *path,
                                          const pcs_named_tensor_t *t, size_t n, float *const *dst,
                                          int *loaded);

#ifdef __cplusplus
}
#endif
#endif
