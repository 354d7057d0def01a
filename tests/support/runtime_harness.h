/* Shared harness of the runtime parity tests (tests/unit/test_runtime.c: host staging against the
 * direct path; tests/gpu/test_runtime_cuda.c: the cuda backend, real or simulated, against cpu):
 * the two-unit plan, the initial values, a few steps of the sharded runtime with synthetic
 * gradients, the comparison of two runs, and forked ranks. One copy, so the two tests exercise
 * the same sequence. Test code only: failures are exit codes plus one stderr line. */
#ifndef PCS_RUNTIME_HARNESS_H
#define PCS_RUNTIME_HARNESS_H

#include <stdint.h>

#include "coll/kv.h"
#include "worker/runtime.h"

#define PCS_RTH_UNITS 2
#define PCS_RTH_STEPS 4

/* How unit 0 is placed (unit 1 is always replicated: averaged over every data-parallel rank
 * without a planned collective). FULL: sharded over all `world` ranks (reduce-scatter AVG; not
 * sharded in a world of one). HYBRID (world 4): 2 replicas x 2 shards, reduce-scatter SUM
 * pre-divide 2 then an all-reduce SUM post-divide 2 over the replicas. NO_SHARD: replicated, a
 * planned fp32 all-reduce AVG over the data-parallel group. */
typedef enum pcs_rth_layout {
    PCS_RTH_FULL = 0,
    PCS_RTH_NO_SHARD = 1,
    PCS_RTH_HYBRID = 2,
} pcs_rth_layout_t;

/* A plan of two units (fp32 master, bf16 params, fp32 reduce) and the storage it points into. */
typedef struct pcs_rth_plan {
    Pcs__V1__Plan plan;
    Pcs__V1__MeshDim md[2], *mdp[2];
    Pcs__V1__Unit unit[PCS_RTH_UNITS], *up[PCS_RTH_UNITS];
    Pcs__V1__ParamSlot ps[PCS_RTH_UNITS], *psp[PCS_RTH_UNITS][1];
    Pcs__V1__Reduction red[2];
    Pcs__V1__CollectiveSpec cs[2], *csp[2];
    uint64_t shape[PCS_RTH_UNITS][1];
} pcs_rth_plan_t;

/* Fill *b (self-contained: keep it in place while the plan is used). Parameters "a" and "b" of
 * numel[0] and numel[1] elements (odd sizes give the sharded unit padding). HYBRID needs
 * world 4. */
void pcs_rth_plan_build(pcs_rth_plan_t *b, pcs_rth_layout_t layout, uint32_t world,
                        const uint64_t numel[PCS_RTH_UNITS]);

/* Initial values (pcs_runtime_config_t.init_param): a function of the element index only, so any
 * world size starts alike. */
pcs_status_t pcs_rth_init_wave(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                               float *out);

/* What one run produced (host copies; pcs_rth_result_free releases them). */
typedef struct pcs_rth_result {
    float *master[PCS_RTH_UNITS], *a[PCS_RTH_UNITS], *b[PCS_RTH_UNITS];
    uint16_t *unsharded[PCS_RTH_UNITS];
    uint64_t numel[PCS_RTH_UNITS], padded[PCS_RTH_UNITS];
    double grad_norm[PCS_RTH_STEPS];
    int skipped[PCS_RTH_STEPS];
} pcs_rth_result_t;

void pcs_rth_result_free(pcs_rth_result_t *r);

/* One run's settings. */
typedef struct pcs_rth_run {
    const char *backend; /* "cpu" | "cuda" */
    int device;
    pcs_coll_backend_t coll;
    int stage_host;
    pcs_rth_layout_t layout;
    uint32_t world, rank;
    const uint64_t *numel; /* PCS_RTH_UNITS sizes */
    const char *job_tag;   /* distinct per run sharing a KV store */
    pcs_kv_t *kv;          /* NULL in a world of one */
    double clip_norm;      /* 1e30: the norm is computed and reduced but never scales */
    int prefetch_all;      /* pcs_runtime_prefetch every unit before each micro-batch */
} pcs_rth_run_t;

/* PCS_RTH_STEPS steps of 2 micro-batches (no-sync, then sync) with AdamW (lr 1e-2), the grad
 * scaler (loss scale 512) and clipping, an +Inf injected on the last rank at step 2; gradients
 * depend on the gathered parameters, the rank and the micro-batch, so every collective feeds the
 * next step. Runtime buffers are touched from the host only through be->copy on the compute
 * stream (device memory on cuda). In a world > 1 the collectives' event timings must be nonzero
 * where the step ran that kind. Then the shards, optimizer state and re-gathered parameters are
 * copied out. 0 on success, else an exit code (10..23) with a stderr line. */
int pcs_rth_run_steps(const pcs_rth_run_t *c, pcs_rth_result_t *out);

/* 0 when run `x` matches the reference run `ref`, else an exit code (30: steps, 31: state) with
 * a stderr line naming `what`. Every step's scaler verdict must agree (only step 2 skipped); the
 * grad norm must be identical bits when norm_rtol == 0, else within norm_rtol relative (both
 * Inf on a skipped step). Shards, optimizer state (which must have moved) and re-gathered bf16
 * parameters: identical bits when rtol == 0, else within rtol relative (parameters: one bf16
 * ulp). */
int pcs_rth_compare(const pcs_rth_result_t *x, const pcs_rth_result_t *ref, double rtol,
                    double norm_rtol, uint32_t rank, const char *what);

/* Fork `world` ranks (at most 8) running rank_main(kvdir, r, arg) with a file KV store directory
 * in a fresh temp dir, wait for each up to timeout_ms (a rank past it is killed and fails the
 * test), remove the dir and store each rank's exit code in codes[r]. cmocka-asserts that every
 * rank was forked and exited normally; the caller asserts the codes. */
void pcs_rth_fork_ranks(const char *tag, uint32_t world,
                        int (*rank_main)(const char *kvdir, uint32_t r, void *arg), void *arg,
                        int timeout_ms, int *codes);

#endif
