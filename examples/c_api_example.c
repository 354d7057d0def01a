/* Example of the pcs worker C API (pcs/worker.h): a program that does its own compute — here a
 * linear regression y = W x + b written by hand — while pcs owns the parameters (sharded fp32
 * masters), the communication (all-gather, reduce-scatter) and the optimizer.
 *
 *   pcs-c-api-example --coordinator 127.0.0.1:7070
 *
 * joins the next job (an explicit model with a Linear "fc": see tests/integration/
 * test_e2e_capi.c), trains it and exits 0 if the loss went down. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/half.h"
#include "pcs/worker.h"

/* Deterministic data: the same global sample index gives the same row on every rank. */
static float rnd(uint64_t i, uint64_t j)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + j * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static float load(const void *p, pcs_dtype_t dt, uint64_t i)
{
    switch (dt) {
    case PCS_DTYPE_BF16:
        return pcs_bf16_to_f32(((const uint16_t *)p)[i]);
    case PCS_DTYPE_FP16:
        return pcs_fp16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static void store(void *p, pcs_dtype_t dt, uint64_t i, float v)
{
    switch (dt) {
    case PCS_DTYPE_BF16:
        ((uint16_t *)p)[i] = pcs_f32_to_bf16(v);
        break;
    case PCS_DTYPE_FP16:
        ((uint16_t *)p)[i] = pcs_f32_to_fp16(v);
        break;
    default:
        ((float *)p)[i] = v;
        break;
    }
}

static int fail(pcs_worker_t *w, const char *what)
{
    fprintf(stderr, "c_api_example: %s: %s\n", what, pcs_last_error());
    if (w) {
        pcs_worker_finish(w, pcs_last_error());
        pcs_worker_destroy(w);
    }
    return 1;
}

int main(int argc, char **argv)
{
    pcs_worker_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.join_timeout_ms = 60000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--coordinator") == 0)
            opt.coordinator = argv[i + 1];
        else if (strcmp(argv[i], "--identity") == 0)
            opt.identity = argv[i + 1];
    }
    if (!opt.coordinator) {
        fprintf(stderr, "usage: %s --coordinator ADDR [--identity ID]\n", argv[0]);
        return 2;
    }
    pcs_worker_t *w = NULL;
    if (pcs_worker_join(&opt, &w) != PCS_OK)
        return fail(NULL, "join");

    pcs_worker_param_info_t wi, bi;
    if (pcs_worker_find_param(w, "fc.weight", &wi) != PCS_OK ||
        pcs_worker_find_param(w, "fc.bias", &bi) != PCS_OK || wi.ndim != 2 || wi.unit != bi.unit)
        return fail(w, "the job's model must have a Linear fc (weight [out, in], bias [out])");
    uint32_t out = (uint32_t)wi.shape[0], in = (uint32_t)wi.shape[1], unit = wi.unit;
    uint32_t M = pcs_worker_micro_batches(w), b = pcs_worker_micro_batch_size(w);
    uint32_t D = pcs_worker_dp_size(w), r = pcs_worker_dp_rank(w);
    printf("rank %u of %u in %s: fc [%u, %u], %u micro-batches of %u rows\n", pcs_worker_rank(w),
           pcs_worker_world_size(w), pcs_worker_job_id(w), out, in, M, b);

    float *x = calloc((size_t)b * in, sizeof(float)), *y = calloc((size_t)b * out, sizeof(float));
    float *e = calloc((size_t)b * out, sizeof(float));
    float *gw = calloc((size_t)out * in, sizeof(float)), *gb = calloc(out, sizeof(float));
    if (!x || !y || !e || !gw || !gb)
        return fail(w, "out of memory");
    double first_loss = -1, last_loss = 0;
    size_t n_units = pcs_worker_num_units(w);
    for (uint64_t s = 0; s < pcs_worker_total_steps(w); s++) {
        if (pcs_worker_begin_step(w) != PCS_OK)
            return fail(w, "begin_step");
        double loss = 0;
        for (uint32_t m = 0; m < M; m++) {
            /* unshard every unit (the root unit of an explicit wrap may hold nothing) */
            const void *params = NULL;
            pcs_dtype_t pdt = PCS_DTYPE_FP32;
            for (uint32_t u = 0; u < n_units; u++) {
                const void *p;
                pcs_dtype_t dt;
                if (pcs_worker_unshard(w, u, &p, &dt) != PCS_OK)
                    return fail(w, "unshard");
                if (u == unit) {
                    params = p;
                    pdt = dt;
                }
            }
            /* rows of this rank: global sample ((s*M + m)*D + r)*b + i; teacher y = sin(x.k) */
            uint64_t first = ((s * M + m) * D + r) * b;
            for (uint32_t i = 0; i < b; i++) {
                for (uint32_t j = 0; j < in; j++)
                    x[i * in + j] = rnd(first + i, j);
                for (uint32_t o = 0; o < out; o++) {
                    float t = 0;
                    for (uint32_t j = 0; j < in; j++)
                        t += x[i * in + j] * rnd(1000003 + o, j);
                    y[i * out + o] = sinf(t);
                }
            }
            /* forward + MSE (mean over rows and outputs) */
            double l = 0;
            for (uint32_t i = 0; i < b; i++)
                for (uint32_t o = 0; o < out; o++) {
                    float z = load(params, pdt, bi.offset + o);
                    for (uint32_t j = 0; j < in; j++)
                        z += load(params, pdt, wi.offset + (uint64_t)o * in + j) * x[i * in + j];
                    e[i * out + o] = z - y[i * out + o];
                    l += (double)e[i * out + o] * e[i * out + o];
                }
            l /= (double)b * out;
            loss += l / M;
            /* backward of the step's mean loss: d/dz = 2 e / (b out) / M, times the loss scale */
            float k = (float)(2.0 / ((double)b * out * M) * pcs_worker_loss_scale(w));
            memset(gw, 0, (size_t)out * in * sizeof(float));
            memset(gb, 0, out * sizeof(float));
            for (uint32_t i = 0; i < b; i++)
                for (uint32_t o = 0; o < out; o++) {
                    float d = k * e[i * out + o];
                    gb[o] += d;
                    for (uint32_t j = 0; j < in; j++)
                        gw[o * in + j] += d * x[i * in + j];
                }
            for (uint32_t u = 0; u < n_units; u++) {
                void *g;
                pcs_dtype_t gdt;
                if (pcs_worker_grad_buffer(w, u, &g, &gdt) != PCS_OK)
                    return fail(w, "grad_buffer");
                if (u == unit) {
                    for (uint64_t q = 0; q < (uint64_t)out * in; q++)
                        store(g, gdt, wi.offset + q, gw[q]);
                    for (uint32_t o = 0; o < out; o++)
                        store(g, gdt, bi.offset + o, gb[o]);
                }
                if (pcs_worker_hand_in_grads(w, u, m + 1 == M) != PCS_OK)
                    return fail(w, "hand_in_grads");
                if (pcs_worker_reshard(w, u) != PCS_OK)
                    return fail(w, "reshard");
            }
        }
        pcs_worker_step_result_t res;
        if (pcs_worker_step(w, loss, &res) != PCS_OK)
            return fail(w, "step");
        if (first_loss < 0)
            first_loss = res.loss;
        last_loss = res.loss;
        if (pcs_worker_rank(w) == 0)
            printf("step %llu loss %.6f grad_norm %.4f%s\n", (unsigned long long)res.step, res.loss,
                   res.grad_norm, res.skipped ? " (skipped)" : "");
    }
    free(x);
    free(y);
    free(e);
    free(gw);
    free(gb);
    int ok = last_loss < first_loss;
    printf("rank %u: loss %.6f -> %.6f (%s)\n", pcs_worker_rank(w), first_loss, last_loss,
           ok ? "decreased" : "DID NOT DECREASE");
    /* the plan's memory estimate is a promise: pcs's own buffers stayed within it */
    pcs_worker_memory_t mem = {0};
    int kept = pcs_worker_memory(w, &mem) == PCS_OK && mem.peak_bytes <= mem.promised_bytes;
    printf("rank %u: runtime memory peak %llu B, the plan's estimate %llu B (%s)\n",
           pcs_worker_rank(w), (unsigned long long)mem.peak_bytes,
           (unsigned long long)mem.promised_bytes, kept ? "kept" : "EXCEEDED");
    pcs_status_t st = pcs_worker_finish(w, !ok     ? "loss did not decrease"
                                           : !kept ? "runtime memory exceeded the plan's estimate"
                                                   : NULL);
    ok = ok && kept;
    pcs_worker_destroy(w);
    return ok && st == PCS_OK ? 0 : 1;
}
