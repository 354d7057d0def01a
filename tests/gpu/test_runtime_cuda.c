/* The unit runtime on device memory against the same sequence on the cpu backend: a few steps of
 * unshard / synthetic gradients (computed on the host from the gathered parameters, copied H2D on
 * the compute stream) / post_backward / optimizer_step (AdamW, grad scaler, an injected +Inf,
 * clipping that never scales) on the cuda backend, then the shards, optimizer state and gathered
 * parameters compared with the cpu backend's. Cast and optimizer kernels are bit-exact to the CPU
 * twin (kernels/src/ops_cuda.cu), Gloo's reductions are fixed-order, so a world of one with NCCL
 * and W=2 with Gloo through host staging must give identical bits; only the grad norm (sum of
 * squares: per-block partials on cuda, within 1 fp32 ulp) gets a tolerance. W=2 with NCCL needs a
 * device per rank (skipped otherwise); NCCL's ring sums may differ in order from Gloo's, so it is
 * held to a relative 1e-6 (for 2 ranks fp32 a + b is commutative, so equal bits are expected).
 * Every scenario runs in forked processes (CUDA must not be initialized before a fork). Exits 77
 * when no CUDA device (or no cuda backend) is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "runtime.h"
#include "test_util.h"

#define N_UNITS 2
#define N_STEPS 4

enum { ONE_NCCL = 0, TWO_GLOO_STAGED = 1, TWO_NCCL = 2 };

static uint32_t world_of(int mode)
{
    return mode == ONE_NCCL ? 1 : 2;
}

/* Two units, bf16 params and fp32 reduce: unit 0 sharded over the ranks (reduce-scatter AVG;
 * replicated in a world of one), unit 1 replicated (averaged over the ranks, no planned
 * collective). Odd sizes, so the sharded unit has padding. */
typedef struct plan_buf {
    Pcs__V1__Plan plan;
    Pcs__V1__MeshDim md, *mdp[1];
    Pcs__V1__Unit unit[N_UNITS], *up[N_UNITS];
    Pcs__V1__ParamSlot ps[N_UNITS], *psp[N_UNITS][1];
    Pcs__V1__Reduction red;
    Pcs__V1__CollectiveSpec rs, *csp[1];
    uint64_t shape[N_UNITS][1];
} plan_buf_t;

static void plan_build(plan_buf_t *b, uint32_t world)
{
    static const uint64_t numel[N_UNITS] = {1999, 77};
    Pcs__V1__Plan p0 = PCS__V1__PLAN__INIT;
    Pcs__V1__MeshDim md0 = PCS__V1__MESH_DIM__INIT;
    Pcs__V1__Reduction r0 = PCS__V1__REDUCTION__INIT;
    Pcs__V1__CollectiveSpec c0 = PCS__V1__COLLECTIVE_SPEC__INIT;
    memset(b, 0, sizeof *b);
    b->plan = p0;
    b->md = md0;
    b->md.dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    b->md.size = world;
    b->mdp[0] = &b->md;
    b->plan.world_size = world;
    b->plan.n_mesh = 1;
    b->plan.mesh = b->mdp;
    b->plan.shard_size = world;
    b->plan.dp_size = world;
    b->red = r0;
    b->red.op = PCS__V1__REDUCE_OP__REDUCE_OP_AVG;
    b->rs = c0;
    b->rs.kind = PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER;
    b->rs.dtype = PCS__V1__DTYPE__DTYPE_FP32;
    b->rs.group = PCS__V1__GROUP_KIND__GROUP_KIND_SHARD;
    b->rs.reduction = &b->red;
    b->csp[0] = &b->rs;
    for (int i = 0; i < N_UNITS; i++) {
        Pcs__V1__Unit u0 = PCS__V1__UNIT__INIT;
        Pcs__V1__ParamSlot s0 = PCS__V1__PARAM_SLOT__INIT;
        Pcs__V1__Unit *u = &b->unit[i];
        *u = u0;
        b->ps[i] = s0;
        b->shape[i][0] = numel[i];
        b->ps[i].fqn = i == 0 ? "a" : "b";
        b->ps[i].n_shape = 1;
        b->ps[i].shape = b->shape[i];
        b->ps[i].numel = numel[i];
        b->psp[i][0] = &b->ps[i];
        u->n_params = 1;
        u->params = b->psp[i];
        u->master_dtype = PCS__V1__DTYPE__DTYPE_FP32;
        u->param_dtype = PCS__V1__DTYPE__DTYPE_BF16;
        u->reduce_dtype = PCS__V1__DTYPE__DTYPE_FP32;
        int sharded = i == 0 && world > 1;
        u->shard_group_size = sharded ? world : 1;
        u->padded_numel = sharded ? (numel[i] + world - 1) / world * world : numel[i];
        u->shard_numel = u->padded_numel / u->shard_group_size;
        if (sharded) {
            b->rs.group_size = world;
            b->rs.count = u->shard_numel;
            u->n_collectives = 1;
            u->collectives = b->csp;
        }
        b->up[i] = u;
    }
    b->plan.n_units = N_UNITS;
    b->plan.units = b->up;
}

static pcs_status_t init_wave(void *ctx, const Pcs__V1__ParamSlot *p, uint64_t first, uint64_t n,
                              float *out)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = first + i + (p->fqn[0] == 'b' ? 7000 : 0);
        out[i] = (float)((int)((k * 2654435761u) % 2001u) - 1000) / 1024.0f;
    }
    return PCS_OK;
}

/* What one run produced (host copies). */
typedef struct run_out {
    float *master[N_UNITS], *a[N_UNITS], *b[N_UNITS];
    uint16_t *unsharded[N_UNITS];
    uint64_t numel[N_UNITS], padded[N_UNITS];
    double grad_norm[N_STEPS];
    int skipped[N_STEPS];
} run_out_t;

static void run_out_free(run_out_t *o)
{
    for (int i = 0; i < N_UNITS; i++) {
        free(o->master[i]);
        free(o->a[i]);
        free(o->b[i]);
        free(o->unsharded[i]);
    }
}

/* The step sequence on `backend` with collectives `coll` on `device`. Host access to runtime
 * buffers only through be->copy on the compute stream. 0 on success. */
static int run_seq(const char *backend, pcs_coll_backend_t coll, int device, pcs_kv_t *kv,
                   uint32_t world, uint32_t rank, const char *tag, run_out_t *out)
{
    plan_buf_t b;
    plan_build(&b, world);
    const pcs_backend_ops_t *be = NULL;
    if (pcs_backend_get(backend, &be) != PCS_OK || be->set_device(device) != PCS_OK)
        return 10;
    pcs_stream_t cs = NULL;
    if (be->stream_create(&cs) != PCS_OK)
        return 11;
    pcs_runtime_config_t rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = &b.plan;
    rc.rank = rank;
    rc.kv = kv;
    rc.job_tag = tag;
    rc.hostname = "127.0.0.1";
    rc.coll_timeout_ms = 60000;
    rc.be = be;
    rc.micro_batches = 2;
    rc.init_param = init_wave;
    rc.opt = PCS_OPT_ADAMW;
    pcs_adamw_config_default(&rc.adamw);
    rc.adamw.lr = 1e-2;
    rc.prefetch = 1;
    rc.stream = cs;
    rc.device = device;
    rc.coll = coll;
    pcs_runtime_t *rt = NULL;
    if (pcs_runtime_create(&rc, &rt) != PCS_OK) {
        fprintf(stderr, "rank %u %s: create: %s\n", rank, backend, pcs_last_error());
        be->stream_destroy(cs);
        return 12;
    }
    uint64_t maxp = 0;
    for (int k = 0; k < N_UNITS; k++)
        maxp = b.unit[k].padded_numel > maxp ? b.unit[k].padded_numel : maxp;
    uint16_t *hp = calloc(maxp, sizeof *hp), *hg = calloc(maxp, sizeof *hg);
    int rv = hp && hg ? 0 : 13;
    for (int step = 0; step < N_STEPS && !rv; step++) {
        if (pcs_runtime_begin_step(rt) != PCS_OK)
            rv = 14;
        for (int m = 0; m < 2 && !rv; m++) {
            for (uint32_t k = N_UNITS; k-- > 0 && !rv;) {
                const void *p;
                void *g;
                pcs_dtype_t pdt, gdt;
                uint64_t n = b.unit[k].padded_numel;
                if (pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK ||
                    pcs_runtime_grad_buffer(rt, k, &g, &gdt) != PCS_OK || pdt != PCS_DTYPE_BF16) {
                    rv = 15;
                    break;
                }
                /* the "model": reads the gathered parameters, writes gradients (times the loss
                 * scale), all ordered on the compute stream */
                if (be->copy(hp, p, n * 2, PCS_COPY_D2H, cs) != PCS_OK || be->sync(cs) != PCS_OK) {
                    rv = 16;
                    break;
                }
                for (uint64_t i = 0; i < n; i++) {
                    float x = pcs_bf16_to_f32(hp[i]);
                    float y = x * 0.75f + 0.03125f * (float)((rank + 1) * (i % 7)) -
                              0.0625f * (float)(m + step);
                    hg[i] = pcs_f32_to_bf16(y * 512.0f);
                }
                if (be->copy(g, hg, n * 2, PCS_COPY_H2D, cs) != PCS_OK || be->sync(cs) != PCS_OK ||
                    pcs_runtime_post_backward(rt, k, m == 1) != PCS_OK ||
                    pcs_runtime_reshard(rt, k) != PCS_OK)
                    rv = 17;
            }
        }
        pcs_rt_step_opts_t o;
        memset(&o, 0, sizeof o);
        o.clip_norm = 1e30; /* norm computed and reduced, never scales */
        o.scaler = 1;
        o.loss_scale = 512.0;
        o.inject_inf = step == 2 && rank == world - 1;
        pcs_rt_step_result_t res;
        memset(&res, 0, sizeof res);
        if (!rv && pcs_runtime_optimizer_step(rt, &o, &res) != PCS_OK)
            rv = 18;
        out->grad_norm[step] = res.grad_norm;
        out->skipped[step] = res.skipped;
        /* W=2: the device collectives are timed by events (the unit-0 all-gather and
         * reduce-scatter ran this step) */
        pcs_rt_stats_t rs;
        pcs_runtime_stats(rt, &rs);
        if (!rv && world > 1 && !(rs.all_gather_ms > 0 && rs.reduce_scatter_ms > 0)) {
            fprintf(stderr, "rank %u %s step %d: timings ag %.4f rs %.4f ms\n", rank, backend, step,
                    rs.all_gather_ms, rs.reduce_scatter_ms);
            rv = 23;
        }
    }
    for (uint32_t k = 0; k < N_UNITS && !rv; k++) {
        pcs_rt_shard_t sh;
        const void *p;
        pcs_dtype_t pdt;
        if (pcs_runtime_shard(rt, k, &sh) != PCS_OK ||
            pcs_runtime_unshard(rt, k, 0, &p, &pdt) != PCS_OK) {
            rv = 19;
            break;
        }
        out->numel[k] = sh.numel;
        out->padded[k] = b.unit[k].padded_numel;
        out->master[k] = calloc(sh.numel, sizeof(float));
        out->a[k] = calloc(sh.numel, sizeof(float));
        out->b[k] = calloc(sh.numel, sizeof(float));
        out->unsharded[k] = calloc(out->padded[k], sizeof(uint16_t));
        if (!out->master[k] || !out->a[k] || !out->b[k] || !out->unsharded[k] ||
            pcs_runtime_shard_to_host(rt, k, out->master[k], out->a[k], out->b[k]) != PCS_OK ||
            be->copy(out->unsharded[k], p, out->padded[k] * 2, PCS_COPY_D2H, cs) != PCS_OK ||
            be->sync(cs) != PCS_OK) {
            rv = 20;
            break;
        }
        if (pcs_runtime_reshard(rt, k) != PCS_OK)
            rv = 21;
    }
    if (rv)
        fprintf(stderr, "rank %u %s: failed (%d): %s\n", rank, backend, rv, pcs_last_error());
    if (pcs_runtime_barrier(rt) != PCS_OK && !rv)
        rv = 22;
    pcs_runtime_destroy(rt);
    be->stream_destroy(cs);
    free(hp);
    free(hg);
    return rv;
}

/* |a - b| <= rtol |b| element-wise (rtol 0: identical bits). */
static int floats_match(const float *a, const float *b, uint64_t n, double rtol)
{
    if (rtol == 0)
        return memcmp(a, b, n * sizeof(float)) == 0;
    for (uint64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - (double)b[i]) <= rtol * fabs((double)b[i])))
            return 0;
    return 1;
}

/* Rank `r` of mode's world: the cuda run, then the cpu run of the same sequence, compared.
 * Exit 3: not enough devices. */
static int rank_main(const char *kvdir, int mode, uint32_t r)
{
    const pcs_backend_ops_t *cu = NULL;
    if (pcs_backend_get("cuda", &cu) != PCS_OK)
        return 2;
    /* NCCL between ranks: one device per rank; every rank decides alike (a rank that went on
     * alone would wait for its peer's rendezvous until the timeout) */
    int device = mode == TWO_NCCL ? (int)r : 0;
    if (mode == TWO_NCCL && cu->device_count() < 2)
        return 3;
    pcs_kv_t *kv = NULL;
    if (pcs_kv_file_create(kvdir, &kv) != PCS_OK)
        return 4;
    uint32_t w = world_of(mode);
    run_out_t g, c;
    memset(&g, 0, sizeof g);
    memset(&c, 0, sizeof c);
    pcs_coll_backend_t coll = mode == TWO_GLOO_STAGED ? PCS_COLL_GLOO : PCS_COLL_NCCL;
    int rv = run_seq("cuda", coll, device, kv, w, r, "cuda-", &g);
    if (!rv)
        rv = run_seq("cpu", PCS_COLL_GLOO, 0, kv, w, r, "cpu-", &c);
    double rtol = mode == TWO_NCCL ? 1e-6 : 0;
    for (int s = 0; s < N_STEPS && !rv; s++) {
        /* the scaler verdict is the same everywhere; the norm within fp32 rounding of the
         * sum of squares (not used to scale: clip_norm is huge) */
        int norm_ok = g.skipped[s] ? isinf(g.grad_norm[s]) && isinf(c.grad_norm[s])
                                   : fabs(g.grad_norm[s] - c.grad_norm[s]) <=
                                         1e-6 * fabs(c.grad_norm[s]) + 1e-30;
        if (g.skipped[s] != c.skipped[s] || g.skipped[s] != (s == 2) || !norm_ok) {
            fprintf(stderr, "rank %u step %d: skipped %d/%d norm %.9g/%.9g\n", r, s, g.skipped[s],
                    c.skipped[s], g.grad_norm[s], c.grad_norm[s]);
            rv = 30;
        }
    }
    for (int k = 0; k < N_UNITS && !rv; k++) {
        uint64_t n = g.numel[k];
        int moved = 0;
        for (uint64_t i = 0; i < n; i++)
            moved |= c.a[k][i] != 0.0f;
        int unsh_ok = 1;
        if (rtol == 0) {
            unsh_ok = memcmp(g.unsharded[k], c.unsharded[k], g.padded[k] * 2) == 0;
        } else {
            for (uint64_t i = 0; i < g.padded[k]; i++) {
                double x = pcs_bf16_to_f32(g.unsharded[k][i]),
                       y = pcs_bf16_to_f32(c.unsharded[k][i]);
                unsh_ok &= fabs(x - y) <= 1e-2 * fabs(y) + 1e-6; /* one bf16 ulp after rounding */
            }
        }
        if (n != c.numel[k] || !moved || !floats_match(g.master[k], c.master[k], n, rtol) ||
            !floats_match(g.a[k], c.a[k], n, rtol) || !floats_match(g.b[k], c.b[k], n, rtol) ||
            !unsh_ok) {
            fprintf(stderr, "rank %u unit %d: cuda run differs from cpu (moved %d)\n", r, k, moved);
            rv = 31;
        }
    }
    run_out_free(&g);
    run_out_free(&c);
    pcs_kv_destroy(kv);
    return rv;
}

static void run_mode(int mode)
{
    char *dir = pcs_test_tmpdir("rt-cuda");
    char kvdir[1024];
    snprintf(kvdir, sizeof kvdir, "%s/kv", dir);
    uint32_t w = world_of(mode);
    pid_t pids[2];
    fflush(NULL);
    for (uint32_t r = 0; r < w; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(rank_main(kvdir, mode, r));
    }
    int codes[2] = {0, 0};
    for (uint32_t r = 0; r < w; r++) {
        int stt = pcs_test_wait(pids[r], 240000);
        if (stt == -1)
            pcs_test_stop(pids[r], 100);
        assert_true(stt != -1 && WIFEXITED(stt));
        codes[r] = WEXITSTATUS(stt);
    }
    pcs_test_rmtree(dir);
    free(dir);
    if (codes[0] == 3 || codes[1] == 3)
        skip(); /* one device: NCCL between ranks needs one per rank */
    for (uint32_t r = 0; r < w; r++)
        assert_int_equal(codes[r], 0);
}

static void test_world_of_one_nccl_on_device_matches_cpu_bit_for_bit(void **s)
{
    (void)s;
    run_mode(ONE_NCCL);
}

static void test_two_ranks_gloo_staged_on_one_device_match_cpu_bit_for_bit(void **s)
{
    (void)s;
    run_mode(TWO_GLOO_STAGED);
}

static void test_two_ranks_nccl_on_two_devices_match_cpu(void **s)
{
    (void)s;
    run_mode(TWO_NCCL);
}

int main(void)
{
    fflush(NULL);
    pid_t probe = fork();
    if (probe == 0) {
        const pcs_backend_ops_t *be = NULL;
        _exit(pcs_backend_get("cuda", &be) == PCS_OK ? 0 : 77);
    }
    int stt = 0;
    if (probe < 0 || waitpid(probe, &stt, 0) < 0 || !WIFEXITED(stt) || WEXITSTATUS(stt) != 0) {
        fprintf(stderr, "no CUDA device or cuda backend: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_one_nccl_on_device_matches_cpu_bit_for_bit),
        cmocka_unit_test(test_two_ranks_gloo_staged_on_one_device_match_cpu_bit_for_bit),
        cmocka_unit_test(test_two_ranks_nccl_on_two_devices_match_cpu),
    };
    return cmocka_run_group_tests_name("runtime_cuda", tests, NULL, NULL);
}
