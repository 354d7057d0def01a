/* pcs-model-bench: forward+backward time of the built-in MLP (model/model.c) per micro-batch, in
 * fp32 / bf16 / fp16, against a baseline measured in the same run: the bare cblas_sgemm calls of
 * the same GEMMs (3 per Linear) on fp32 buffers. The ratio is the cost of mixed-precision
 * emulation, norms and activations on top of the GEMMs. A separate untimed pass checks the
 * model's forward output against a plain re-computation (#wrong). With -d cuda the same model
 * also runs on the GPU (pcs_mlp_create_on, cuBLAS) and its time is reported next to the CPU's
 * from the same run; its #wrong counts outputs outside the CPU twin's tolerance (4 ulps of the
 * dtype x sqrt(fan-in), relative to |value| + rms). The last tables time GELU's loops against
 * glibc's erff/expf per element (and erf alone) and LayerNorm against its previous double loops
 * written bare. With --job FILE it instead runs the single-process reference trainer on a job
 * file and reports losses and step time. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"
#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/log.h"
#include "pcs/nn.h"
#include "pcs/pbtext.h"
#include "pcs/v1/job.pb-c.h"
#include "model/reference.h"
#include "planner/plan.h"

/* Timings are the best of REPS repetitions of the mean over `iters`: the development box is
 * shared, and the minimum is the least disturbed estimate of both the model and the baseline. */
#define REPS 3

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* max |a[i] - b[i]|, in double: how far the model's output is from the baseline's */
static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        md = d > md ? d : md;
    }
    return md;
}

static int run_job(const char *path, int global_batch, int use_plan, const char *export_path)
{
    ProtobufCMessage *msg = NULL;
    if (pcs_pb_from_yaml_file(path, &pcs__v1__job_spec__descriptor, &msg) != PCS_OK) {
        fprintf(stderr, "pcs-model-bench: %s\n", pcs_last_error());
        return 1;
    }
    Pcs__V1__JobSpec *spec = (Pcs__V1__JobSpec *)msg;
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    o.global_batch = global_batch;
    pcs_reference_t *r = NULL;
    Pcs__V1__Plan *plan = NULL;
    if (use_plan && pcs_plan_build(spec, 0, &plan) != PCS_OK) {
        fprintf(stderr, "pcs-model-bench: plan: %s\n", pcs_last_error());
        protobuf_c_message_free_unpacked(msg, NULL);
        return 1;
    }
    double t0 = now_s();
    pcs_status_t crc = pcs_ref_create(spec, plan, &o, &r);
    pcs_plan_free(plan);
    if (crc != PCS_OK) {
        fprintf(stderr, "pcs-model-bench: %s\n", pcs_last_error());
        protobuf_c_message_free_unpacked(msg, NULL);
        return 1;
    }
    double t1 = now_s();
    printf("# reference run of %s: %llu params, dp %u (%s, %s)\n", path,
           (unsigned long long)pcs_mlp_total_params(pcs_ref_model(r)), pcs_ref_dp_size(r),
           global_batch ? "global batch" : "per-rank emulation",
           use_plan ? "planner's units" : "built-in units");
    printf("#  step        loss   grad_norm  skipped   time\n");
    printf("#                                          (ms)\n");
    pcs_ref_step_result_t res;
    int rc = 0;
    double ts = now_s();
    (void)plan;
    pcs_status_t src;
    while ((src = pcs_ref_step(r, &res)) == PCS_OK) {
        double te = now_s();
        printf("%7llu  %10.6f  %10.4f  %7d  %6.1f\n", (unsigned long long)res.step, res.loss,
               res.grad_norm, res.skipped, (te - ts) * 1e3);
        ts = te;
    }
    if (src != PCS_ERR_STATE) {
        fprintf(stderr, "pcs-model-bench: step failed: %s\n", pcs_last_error());
        rc = 1;
    }
    double t2 = now_s(), ev = 0;
    if (pcs_ref_eval(r, &ev) != PCS_OK)
        rc = 1;
    uint64_t steps = pcs_ref_steps_done(r);
    printf("# setup %.3f s, %llu steps in %.3f s (%.1f ms/step), eval loss %.6f\n", t1 - t0,
           (unsigned long long)steps, t2 - t1, steps ? (t2 - t1) * 1e3 / (double)steps : 0.0, ev);
    size_t n;
    const double *l = pcs_ref_losses(r, &n);
    int ok = n >= 2 && l[n - 1] < l[0];
    printf("# Loss decreased : %s\n", ok ? "OK" : "NO");
    if (export_path) {
        if (pcs_ref_export(r, export_path) != PCS_OK) {
            fprintf(stderr, "pcs-model-bench: export: %s\n", pcs_last_error());
            rc = 1;
        } else {
            printf("# exported %s\n", export_path);
        }
    }
    pcs_ref_destroy(r);
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc || !ok;
}

typedef struct {
    uint32_t in, hidden, layers, out;
} shape_t;

/* Plain forward of a ReLU MLP without norm: sgemm, + bias, round, relu. */
static void plain_forward(const shape_t *s, float **W, float **B, const float *x, uint32_t R,
                          pcs_dtype_t dt, float *h1, float *h2, float *out)
{
    const float *cur = x;
    uint32_t in = s->in;
    float *bufs[2] = {h1, h2};
    for (uint32_t l = 0; l <= s->layers; l++) {
        uint32_t o = l == s->layers ? s->out : s->hidden;
        float *y = l == s->layers ? out : bufs[l % 2];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)o, (int)in, 1.0f, cur,
                    (int)in, W[l], (int)in, 0.0f, y, (int)o);
        for (uint32_t i = 0; i < R; i++)
            for (uint32_t j = 0; j < o; j++) {
                float v = y[(size_t)i * o + j] + B[l][j];
                if (dt == PCS_DTYPE_BF16)
                    v = pcs_bf16_to_f32(pcs_f32_to_bf16(v));
                else if (dt == PCS_DTYPE_FP16)
                    v = pcs_fp16_to_f32(pcs_f32_to_fp16(v));
                if (l < s->layers && v < 0)
                    v = 0;
                y[(size_t)i * o + j] = v;
            }
        cur = y;
        in = o;
    }
}

static double bench_dtype(const shape_t *s, uint32_t R, pcs_dtype_t dt, int iters, double *base_us,
                          long *wrong)
{
    uint32_t *hd = calloc(s->layers + 1, sizeof(uint32_t));
    for (uint32_t l = 0; l < s->layers; l++)
        hd[l] = s->hidden;
    pcs_mlp_config_t cfg = {s->in, s->out, s->layers, hd, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0};
    pcs_mlp_t *m = NULL;
    if (pcs_mlp_create(&cfg, R, &m) != PCS_OK) {
        fprintf(stderr, "%s\n", pcs_last_error());
        exit(1);
    }
    uint32_t np = pcs_mlp_num_params(m);
    float **Wf = calloc(np, sizeof(float *));
    void **pv = calloc(np, sizeof(void *)), **gv = calloc(np, sizeof(void *));
    size_t es = pcs_dtype_size(dt);
    for (uint32_t p = 0; p < np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(m, p);
        Wf[p] = calloc(t->numel, sizeof(float));
        pcs_mlp_init_tensor(m, 1, 0, p, 0, t->numel, Wf[p]);
        pcs_round_to(Wf[p], t->numel, dt);
        pv[p] = calloc(t->numel, es);
        gv[p] = calloc(t->numel, es);
        pcs_from_f32(Wf[p], t->numel, dt, pv[p]);
        pcs_mlp_bind_param(m, p, dt, pv[p]);
        pcs_mlp_bind_grad(m, p, dt, gv[p]);
    }
    pcs_mlp_set_cast(m, 0, dt, PCS_DTYPE_NONE);
    float *x = calloc((size_t)R * s->in, sizeof(float));
    float *dout = calloc((size_t)R * s->out, sizeof(float));
    for (size_t i = 0; i < (size_t)R * s->in; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < (size_t)R * s->out; i++)
        dout[i] = 1e-3f;
    const float *out;
    pcs_dtype_t odt;
    /* validation pass (untimed) */
    float *xr = calloc((size_t)R * s->in, sizeof(float));
    memcpy(xr, x, (size_t)R * s->in * sizeof(float));
    pcs_round_to(xr, (size_t)R * s->in, dt);
    float *h1 = calloc((size_t)R * s->hidden, sizeof(float));
    float *h2 = calloc((size_t)R * s->hidden, sizeof(float));
    float *ref = calloc((size_t)R * s->out, sizeof(float));
    float **W = calloc(s->layers + 1, sizeof(float *)),
          **B = calloc(s->layers + 1, sizeof(float *));
    for (uint32_t l = 0; l <= s->layers; l++) {
        W[l] = Wf[2 * l];
        B[l] = Wf[2 * l + 1];
    }
    plain_forward(s, W, B, xr, R, dt, h1, h2, ref);
    pcs_mlp_forward(m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt);
    *wrong = 0;
    for (size_t i = 0; i < (size_t)R * s->out; i++)
        *wrong += out[i] != ref[i];
    /* warm-up, then timed forward+backward */
    for (int i = 0; i < 2; i++) {
        pcs_mlp_forward(m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt);
        pcs_mlp_backward(m, dout, NULL);
    }
    double t0, t = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        t0 = now_s();
        for (int i = 0; i < iters; i++) {
            pcs_mlp_forward(m, x, PCS_DTYPE_FP32, R, 1, NULL, &out, &odt);
            pcs_mlp_backward(m, dout, NULL);
        }
        double tr = (now_s() - t0) / iters;
        t = tr < t ? tr : t;
    }
    /* baseline: the same 3 GEMMs per Linear on fp32 buffers */
    size_t maxw = s->hidden > s->in ? s->hidden : s->in;
    float *A = calloc((size_t)R * maxw, sizeof(float)),
          *C = calloc((size_t)R * maxw, sizeof(float));
    float *G = calloc(maxw * maxw, sizeof(float));
    *base_us = 1e30;
    for (int i = 0; i < 2 + REPS * iters; i++) {
        if (i >= 2 && (i - 2) % iters == 0)
            t0 = now_s();
        uint32_t in = s->in;
        for (uint32_t l = 0; l <= s->layers; l++) {
            uint32_t o = l == s->layers ? s->out : s->hidden;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)o, (int)in, 1.0f, A,
                        (int)in, W[l], (int)in, 0.0f, C, (int)o);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)o, (int)in, (int)R, 1.0f, C,
                        (int)o, A, (int)in, 0.0f, G, (int)in);
            if (l > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, (int)in, (int)o,
                            1.0f, C, (int)o, W[l], (int)in, 0.0f, A, (int)in);
            in = o;
        }
        if (i >= 2 && (i - 2) % iters == iters - 1) {
            double tb = (now_s() - t0) / iters * 1e6;
            *base_us = tb < *base_us ? tb : *base_us;
        }
    }
    for (uint32_t p = 0; p < np; p++) {
        free(Wf[p]);
        free(pv[p]);
        free(gv[p]);
    }
    free(Wf);
    free(pv);
    free(gv);
    free(W);
    free(B);
    free(x);
    free(xr);
    free(dout);
    free(h1);
    free(h2);
    free(ref);
    free(A);
    free(C);
    free(G);
    free(hd);
    pcs_mlp_destroy(m);
    return t * 1e6;
}

/* The model on backend `be` vs the CPU twin: forward+backward time per micro-batch on the GPU
 * (stream-synchronized after each rep of `iters`), and outputs outside the tolerance. */
static double bench_cuda(const shape_t *s, uint32_t R, pcs_dtype_t dt, int iters,
                         const pcs_backend_ops_t *be, pcs_stream_t st, long *wrong)
{
    uint32_t *hd = calloc(s->layers + 1, sizeof(uint32_t));
    for (uint32_t l = 0; l < s->layers; l++)
        hd[l] = s->hidden;
    pcs_mlp_config_t cfg = {s->in, s->out, s->layers, hd, PCS_ACT_RELU, PCS_NORM_NONE, 1, 0};
    pcs_mlp_t *mc = NULL, *mg = NULL;
    if (pcs_mlp_create(&cfg, R, &mc) != PCS_OK ||
        pcs_mlp_create_on(&cfg, R, be, st, &mg) != PCS_OK) {
        fprintf(stderr, "%s\n", pcs_last_error());
        exit(1);
    }
    uint32_t np = pcs_mlp_num_params(mc);
    void **hv = calloc(np, sizeof(void *)), **hg = calloc(np, sizeof(void *));
    void **dv = calloc(np, sizeof(void *)), **dg = calloc(np, sizeof(void *));
    size_t es = pcs_dtype_size(dt);
    int ok = 1;
    for (uint32_t p = 0; p < np; p++) {
        const pcs_named_tensor_t *t = pcs_mlp_param(mc, p);
        float *w = calloc(t->numel, sizeof(float));
        pcs_mlp_init_tensor(mc, 1, 0, p, 0, t->numel, w);
        hv[p] = calloc(t->numel, es);
        hg[p] = calloc(t->numel, es);
        pcs_from_f32(w, t->numel, dt, hv[p]);
        free(w);
        ok &= be->alloc(t->numel * es, &dv[p]) == PCS_OK &&
              be->alloc(t->numel * es, &dg[p]) == PCS_OK;
        ok &= be->copy(dv[p], hv[p], t->numel * es, PCS_COPY_H2D, st) == PCS_OK;
        pcs_mlp_bind_param(mc, p, dt, hv[p]);
        pcs_mlp_bind_grad(mc, p, dt, hg[p]);
        pcs_mlp_bind_param(mg, p, dt, dv[p]);
        pcs_mlp_bind_grad(mg, p, dt, dg[p]);
    }
    pcs_mlp_set_cast(mc, 0, dt, PCS_DTYPE_NONE);
    pcs_mlp_set_cast(mg, 0, dt, PCS_DTYPE_NONE);
    size_t nx = (size_t)R * s->in, no = (size_t)R * s->out;
    float *x = calloc(nx, sizeof(float)), *dout = calloc(no, sizeof(float));
    float *got = calloc(no, sizeof(float));
    void *dx = NULL, *ddout = NULL;
    ok &= be->alloc(nx * sizeof(float), &dx) == PCS_OK;
    ok &= be->alloc(no * sizeof(float), &ddout) == PCS_OK;
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < no; i++)
        dout[i] = 1e-3f;
    ok &= be->copy(dx, x, nx * sizeof(float), PCS_COPY_H2D, st) == PCS_OK;
    ok &= be->copy(ddout, dout, no * sizeof(float), PCS_COPY_H2D, st) == PCS_OK;
    if (!ok) {
        fprintf(stderr, "pcs-model-bench: cuda setup: %s\n", pcs_last_error());
        exit(1);
    }
    /* validation pass (untimed): the GPU output against the CPU twin's */
    const float *oc, *og;
    pcs_dtype_t odt;
    if (pcs_mlp_forward(mc, x, PCS_DTYPE_FP32, R, 1, NULL, &oc, &odt) != PCS_OK ||
        pcs_mlp_forward(mg, dx, PCS_DTYPE_FP32, R, 1, NULL, &og, &odt) != PCS_OK ||
        be->copy(got, og, no * sizeof(float), PCS_COPY_D2H, st) != PCS_OK ||
        be->sync(st) != PCS_OK) {
        fprintf(stderr, "pcs-model-bench: cuda forward: %s\n", pcs_last_error());
        exit(1);
    }
    double ss = 0, u = dt == PCS_DTYPE_BF16 ? 0x1p-7 : dt == PCS_DTYPE_FP16 ? 0x1p-10 : 0x1p-23;
    uint32_t fan = s->in > s->hidden ? s->in : s->hidden;
    for (size_t i = 0; i < no; i++)
        ss += (double)oc[i] * oc[i];
    double rms = sqrt(ss / (double)no), scale = 4 * u * sqrt((double)fan);
    *wrong = 0;
    for (size_t i = 0; i < no; i++)
        *wrong += !(fabs((double)got[i] - oc[i]) <= scale * (fabs(oc[i]) + rms));
    /* warm-up, then timed forward+backward */
    pcs_status_t rc = PCS_OK;
    for (int i = 0; i < 2 && rc == PCS_OK; i++) {
        rc = pcs_mlp_forward(mg, dx, PCS_DTYPE_FP32, R, 1, NULL, &og, &odt);
        if (rc == PCS_OK)
            rc = pcs_mlp_backward(mg, ddout, NULL);
    }
    if (rc == PCS_OK)
        rc = be->sync(st);
    double t = 1e30;
    for (int rep = 0; rep < REPS && rc == PCS_OK; rep++) {
        double t0 = now_s();
        for (int i = 0; i < iters && rc == PCS_OK; i++) {
            rc = pcs_mlp_forward(mg, dx, PCS_DTYPE_FP32, R, 1, NULL, &og, &odt);
            if (rc == PCS_OK)
                rc = pcs_mlp_backward(mg, ddout, NULL);
        }
        if (rc == PCS_OK)
            rc = be->sync(st);
        double tr = (now_s() - t0) / iters;
        t = tr < t ? tr : t;
    }
    if (rc != PCS_OK) {
        fprintf(stderr, "pcs-model-bench: cuda pass: %s\n", pcs_last_error());
        exit(1);
    }
    pcs_mlp_destroy(mg);
    pcs_mlp_destroy(mc);
    for (uint32_t p = 0; p < np; p++) {
        free(hv[p]);
        free(hg[p]);
        be->free(dv[p]);
        be->free(dg[p]);
    }
    be->free(dx);
    be->free(ddout);
    free(hv);
    free(hg);
    free(dv);
    free(dg);
    free(x);
    free(dout);
    free(got);
    free(hd);
    return t * 1e6;
}

/* GELU forward and backward (erf form) over n elements: the CPU twin (pcs_nn_act_fwd/bwd: the
 * vectorized erf/exp of kernels/src/nn_vmath.h) against the same expressions with glibc's
 * erff/expf, one element at a time (what the twin ran before), best of REPS means. The erf column
 * times the twin's erf loop alone (pcs_nn_host_erf) on the backward row: the most that reusing the
 * forward's erf in backward could save there (it would also store and reload a saved array). */
static void bench_gelu(int iters)
{
    pcs_nn_t *nn = NULL;
    if (pcs_nn_create(NULL, NULL, &nn) != PCS_OK)
        return;
    printf("# GELU, erf form, fp32: glibc = erff/expf per element; pcs = the CPU twin's loops\n");
    printf("#  elements  pass       glibc       pcs    ratio     max|d|       erf\n");
    printf("#                        (ns/el)   (ns/el)                        (ns/el)\n");
    for (size_t n = 1u << 12; n <= (1u << 20); n <<= 4) {
        float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy);
        float *y0 = malloc(n * sizeof *y0), *y1 = malloc(n * sizeof *y1);
        if (!x || !dy || !y0 || !y1)
            break;
        uint64_t r = 42;
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = ((float)(r >> 40) / (float)(1 << 24) - 0.5f) * 10.0f;
            dy[i] = 1.0f;
        }
        for (int pass = 0; pass < 2; pass++) {
            double best0 = 1e30, best1 = 1e30, best2 = 1e30;
            for (int rep = 0; rep < REPS; rep++) {
                if (pass == 1) {
                    double te = now_s();
                    for (int it = 0; it < iters; it++)
                        pcs_nn_host_erf(x, n, y0);
                    te = now_s() - te;
                    best2 = te < best2 ? te : best2;
                }
                double t0 = now_s();
                for (int it = 0; it < iters; it++)
                    for (size_t i = 0; i < n; i++) {
                        float v = x[i], c = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
                        y0[i] = pass == 0 ? v * c
                                          : dy[i] * (c + v * (0.39894228040143267794f *
                                                              expf(-0.5f * v * v)));
                    }
                double t1 = now_s();
                for (int it = 0; it < iters; it++)
                    if (pass == 0)
                        (void)pcs_nn_act_fwd(nn, PCS_NN_GELU, y1, x, n, PCS_DTYPE_FP32);
                    else
                        (void)pcs_nn_act_bwd(nn, PCS_NN_GELU, y1, x, y1, dy, n);
                double t2 = now_s();
                best0 = t1 - t0 < best0 ? t1 - t0 : best0;
                best1 = t2 - t1 < best1 ? t2 - t1 : best1;
            }
            /* absolute: in GELU's negative tail 1 + erf cancels, so one ulp of erf is a large
             * relative difference of a tiny value there (as between any two erff) */
            double md = max_abs_diff(y1, y0, n);
            printf("%10zu  %-8s  %8.2f  %8.2f  %7.3f  %9.2e", n, pass ? "backward" : "forward",
                   best0 / iters / n * 1e9, best1 / iters / n * 1e9, best1 / best0, md);
            if (pass == 1)
                printf("  %8.2f", best2 / iters / n * 1e9);
            printf("\n");
        }
        free(x);
        free(dy);
        free(y0);
        free(y1);
    }
    pcs_nn_destroy(nn);
}

/* LayerNorm forward and backward over [rows, D] fp32: the CPU twin (pcs_nn_norm_fwd/bwd: row sums
 * in fp32 in nn_math.h's 32-lane order, vectorized) against the twin's previous form written
 * inline as bare loops (statistics and backward sums in double, sequential; no front door, no
 * weight widening, no gradient store), best of REPS means; max|d| compares outputs and input
 * gradients (what the fp32 sums change). */
static void bench_layernorm(int iters)
{
    pcs_nn_t *nn = NULL;
    if (pcs_nn_create(NULL, NULL, &nn) != PCS_OK)
        return;
    const uint32_t R = 32;
    printf("# LayerNorm fp32, %u rows: double = sequential double sums, bare loops inline (the "
           "twin before); pcs = the CPU twin through pcs_nn_norm_fwd/bwd (fp32 lane sums)\n",
           R);
    printf("#       D  pass      double       pcs    ratio     max|d|\n");
    printf("#                    (ns/el)   (ns/el)\n");
    for (uint32_t D = 256; D <= 4096; D <<= 2) {
        size_t n = (size_t)R * D;
        float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy), *y0 = malloc(n * 4);
        float *y1 = malloc(n * 4), *w = malloc(D * 4), *b = malloc(D * 4), *save = malloc(4 * D * 4);
        float *dw = malloc(2 * D * 4);
        if (!x || !dy || !y0 || !y1 || !w || !b || !save || !dw)
            break;
        uint64_t r = 7;
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = ((float)(r >> 40) / (float)(1 << 24) - 0.3f) * 4.0f;
            dy[i] = ((float)((r >> 20) & 0xffff) / 65536.0f - 0.5f);
        }
        for (uint32_t j = 0; j < D; j++) {
            w[j] = 1.0f + (float)j / (float)D;
            b[j] = 0.25f;
        }
        pcs_nn_norm_t p = {.kind = PCS_NN_LAYERNORM, .rows = R, .dim = D, .dtype = PCS_DTYPE_FP32,
                           .weight = w, .weight_dtype = PCS_DTYPE_FP32, .bias = b,
                           .bias_dtype = PCS_DTYPE_FP32, .save = save, .training = 1};
        pcs_nn_grad_t gw = {dw, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t gb = {dw + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        (void)pcs_nn_norm_fwd(nn, &p, x, y1); /* the saved statistics both backwards read */
        for (int pass = 0; pass < 2; pass++) {
            double best0 = 1e30, best1 = 1e30;
            for (int rep = 0; rep < REPS; rep++) {
                double t0 = now_s();
                for (int it = 0; it < iters; it++)
                    for (uint32_t q = 0; q < R; q++) {
                        const float *xr = x + (size_t)q * D, *dyr = dy + (size_t)q * D;
                        float *yr = y0 + (size_t)q * D;
                        if (pass == 0) {
                            double s = 0, ss = 0;
                            for (uint32_t j = 0; j < D; j++)
                                s += xr[j];
                            double mean = s / D;
                            for (uint32_t j = 0; j < D; j++)
                                ss += (xr[j] - mean) * (xr[j] - mean);
                            float mf = (float)mean, rstd = (float)(1.0 / sqrt(ss / D + 1e-5));
                            for (uint32_t j = 0; j < D; j++)
                                yr[j] = (xr[j] - mf) * rstd * w[j] + b[j];
                            continue;
                        }
                        float mf = save[2 * q], rstd = save[2 * q + 1];
                        double c1 = 0, c2 = 0;
                        for (uint32_t j = 0; j < D; j++) {
                            float xh = (xr[j] - mf) * rstd, g = dyr[j] * w[j];
                            c1 += g;
                            c2 += (double)g * xh;
                            dw[j] += dyr[j] * xh;
                            dw[D + j] += dyr[j];
                        }
                        c1 /= D;
                        c2 /= D;
                        for (uint32_t j = 0; j < D; j++) {
                            float xh = (xr[j] - mf) * rstd;
                            yr[j] = rstd * (float)(dyr[j] * w[j] - c1 - xh * c2);
                        }
                    }
                double t1 = now_s();
                for (int it = 0; it < iters; it++)
                    (void)(pass == 0 ? pcs_nn_norm_fwd(nn, &p, x, y1)
                                     : pcs_nn_norm_bwd(nn, &p, x, dy, y1, &gw, &gb));
                double t2 = now_s();
                best0 = t1 - t0 < best0 ? t1 - t0 : best0;
                best1 = t2 - t1 < best1 ? t2 - t1 : best1;
            }
            double md = max_abs_diff(y1, y0, n);
            printf("%9u  %-8s  %8.2f  %8.2f  %7.3f  %9.2e\n", D, pass ? "backward" : "forward",
                   best0 / iters / n * 1e9, best1 / iters / n * 1e9, best1 / best0, md);
        }
        free(x), free(dy), free(y0), free(y1), free(w), free(b), free(save), free(dw);
    }
    pcs_nn_destroy(nn);
}

static void usage(void)
{
    fprintf(stderr, "usage: pcs-model-bench [-b ROWS] [-e ROWS] [-f FACTOR] [-n ITERS] [-i IN] "
                    "[-H HIDDEN] [-L LAYERS] [-o OUT] [-t BLAS_THREADS] [-d cpu|cuda]\n"
                    "       pcs-model-bench --job FILE.yaml [--plan] [--global-batch] [--export "
                    "OUT.safetensors]"
                    " [-t BLAS_THREADS]\n");
}

int main(int argc, char **argv)
{
    pcs_log_init(PCS_LOG_WARN);
    shape_t s = {256, 1024, 4, 16}; /* the demo job's model */
    uint32_t b = 8, e = 128, f = 2;
    int iters = 10;
    const char *jobf = NULL, *export_path = NULL;
    int global = 0, use_plan = 0;
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--job") == 0 && v) {
            jobf = v;
            i++;
        } else if (strcmp(a, "--global-batch") == 0) {
            global = 1;
        } else if (strcmp(a, "--export") == 0 && v) {
            export_path = v;
            i++;
        } else if (strcmp(a, "-d") == 0 && v) {
            device = v;
            i++;
        } else if (strcmp(a, "--plan") == 0) {
            use_plan = 1;
        } else if (strcmp(a, "-t") == 0 && v) {
            pcs_mlp_blas_threads(atoi(v));
            i++;
        } else if (v && a[0] == '-' && a[1] && !a[2] && strchr("befniHLo", a[1])) {
            unsigned long x = strtoul(v, NULL, 10);
            switch (a[1]) {
            case 'b':
                b = (uint32_t)x;
                break;
            case 'e':
                e = (uint32_t)x;
                break;
            case 'f':
                f = (uint32_t)x;
                break;
            case 'n':
                iters = (int)x;
                break;
            case 'i':
                s.in = (uint32_t)x;
                break;
            case 'H':
                s.hidden = (uint32_t)x;
                break;
            case 'L':
                s.layers = (uint32_t)x;
                break;
            default:
                s.out = (uint32_t)x;
                break;
            }
            i++;
        } else {
            usage();
            return 2;
        }
    }
    if (jobf)
        return run_job(jobf, global, use_plan, export_path);
    if (b == 0 || e < b || f < 2 || iters < 1 || !s.in || !s.hidden || !s.out ||
        (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)) {
        usage();
        return 2;
    }
    const pcs_backend_ops_t *gpu = NULL;
    pcs_stream_t gst = NULL;
    if (strcmp(device, "cuda") == 0) {
        if (pcs_backend_get("cuda", &gpu) != PCS_OK || gpu->stream_create(&gst) != PCS_OK) {
            /* 77: ctest's skip code, so the gpu smoke test skips on a host without a device */
            fprintf(stderr, "pcs-model-bench: -d cuda: %s\n", pcs_last_error());
            return 77;
        }
        char name[128] = "?";
        uint64_t mem = 0;
        (void)gpu->device_info(0, name, sizeof name, &mem);
        printf("# device %s (%.0f GiB)\n", name, (double)mem / (1u << 30));
    }
    printf("# pcs-model-bench  mlp %u -> %u x %u -> %u (relu, bias)  iters %d  blas threads %d\n",
           s.in, s.hidden, s.layers, s.out, iters, pcs_mlp_blas_threads(0));
    printf("# time = forward + backward of one micro-batch; sgemm = the same GEMMs alone (fp32);"
           " best of %d means\n",
           REPS);
    if (gpu) {
        printf("# cuda = the same model on the GPU (cuBLAS, no TF32), stream-synchronized per rep;"
               " #wrong: CPU re-computation | GPU vs CPU twin tolerance\n");
        printf("#   rows  type      time     GF/s     sgemm    ratio  #wrong      cuda     GF/s  "
               "speedup  #wrong\n");
        printf("#                   (us)               (us)                        (us)\n");
    } else {
        printf("#   rows  type      time     GF/s     sgemm    ratio  #wrong\n");
        printf("#                   (us)               (us)\n");
    }
    long total_wrong = 0;
    for (uint32_t R = b; R <= e; R *= f) {
        const pcs_dtype_t dts[3] = {PCS_DTYPE_FP32, PCS_DTYPE_BF16, PCS_DTYPE_FP16};
        for (int k = 0; k < 3; k++) {
            double base, wrongd;
            long wrong;
            double t = bench_dtype(&s, R, dts[k], iters, &base, &wrong);
            (void)wrongd;
            double flops = 0;
            uint32_t in = s.in;
            for (uint32_t l = 0; l <= s.layers; l++) {
                uint32_t o = l == s.layers ? s.out : s.hidden;
                flops += 2.0 * R * o * in * (l > 0 ? 3 : 2);
                in = o;
            }
            printf("%8u  %4s  %8.1f  %7.2f  %8.1f  %7.2f  %6ld", R, pcs_dtype_name(dts[k]), t,
                   flops / t * 1e-3, base, t / base, wrong);
            total_wrong += wrong;
            if (gpu) {
                long gw = 0;
                double tg = bench_cuda(&s, R, dts[k], iters, gpu, gst, &gw);
                printf("  %8.1f  %7.2f  %7.2f  %6ld", tg, flops / tg * 1e-3, t / tg, gw);
                total_wrong += gw;
            }
            printf("\n");
        }
        if (R > UINT32_MAX / f)
            break;
    }
    bench_gelu(iters);
    bench_layernorm(iters);
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    if (gpu)
        gpu->stream_destroy(gst);
    return total_wrong ? 1 : 0;
}
