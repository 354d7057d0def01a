/* Element math of the built-in model's nn ops, shared by the CPU twin (nn_cpu.c) and the CUDA
 * kernels (nn_cuda.cu), as pcs/kernel_math.h is for the update kernels: both compile these same
 * expressions without FMA contraction (C11 / nvcc --fmad=false), so the CPU tests pin the GPU's
 * arithmetic bit for bit. Only GEMM order and libm differ (GELU's erff/expf are CUDA's, within 2
 * ulp, where the CPU twin's loops use nn_vmath.h's vectorizable erf/exp in the same expressions);
 * LayerNorm's row sums follow one fixed order on both (PCS_NN_LANES below). Every function is
 * always inlined on the host too: the CPU loops that call them carry optimize/target_clones
 * attributes, across which GCC does not inline a plain static inline, and a call per element
 * would not vectorize. Not installed. */
#ifndef PCS_NN_MATH_H
#define PCS_NN_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/half.h"

#if !defined(__CUDACC__) && defined(__GNUC__)
#define PCS_NN_HD static inline __attribute__((always_inline))
#else
#define PCS_NN_HD PCS_HD
#endif

#define PCS_NN_LN_EPS      1e-5f
#define PCS_NN_BN_EPS      1e-5f
#define PCS_NN_BN_MOMENTUM 0.1f
/* double constants, narrowed to float where they are used (as the reference always did) */
#define PCS_NN_SQRT1_2      0.70710678118654752440
#define PCS_NN_INV_SQRT_2PI 0.39894228040143267794

// ---- rounding and stores ----

/* v rounded to a compute dtype (fp32: unchanged) through pcs/half.h. The CPU twin applies this
 * rounding step to whole arrays with pcs_nn_host_round() instead (the vectorised cast: the same
 * bits, test_kernels_cast_exhaustive; several times faster for fp16 than this scalar form), so
 * the math functions return unrounded values; the kernels round them with this and the two
 * rounding steps below. */
PCS_NN_HD float pcs_nn_round_to(float v, int dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(pcs_f32_to_bf16(v));
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(pcs_f32_to_fp16(v));
    return v;
}

/* A gradient before its store: rounded to the parameter's dtype when the gradient's differs
 * (autograd computes it in the parameter's dtype). */
PCS_NN_HD float pcs_nn_grad_round(float g, int gdt, int pdt)
{
    return gdt != pdt ? pcs_nn_round_to(g, pdt) : g;
}

/* An accumulated gradient store (autograd's .grad += g): g rounded to the parameter's dtype, added
 * in fp32 to the held value, rounded once to the gradient's dtype by the caller's store. */
PCS_NN_HD float pcs_nn_grad_acc(float held, float g, int pdt)
{
    return held + pcs_nn_round_to(g, pdt);
}

/* The Linear epilogue's add (fp32), before the one rounding to the dtype. */
PCS_NN_HD float pcs_nn_bias_add(float y, float b)
{
    return y + b;
}

/* The whole epilogue as the kernel runs it: + bias only with a bias (-0 + 0 would be +0), then
 * rounded once to dt. */
PCS_NN_HD float pcs_nn_bias_round(float y, float b, int has_bias, int dt)
{
    return pcs_nn_round_to(has_bias ? pcs_nn_bias_add(y, b) : y, dt);
}

/* Sum of one column (stride floats apart) over rows in order, in fp32: Linear's db. */
PCS_NN_HD float pcs_nn_col_sum(const float *col, size_t stride, uint32_t rows)
{
    float s = 0.0f;
    for (uint32_t r = 0; r < rows; r++)
        s += col[(size_t)r * stride];
    return s;
}

// ---- activations ----

PCS_NN_HD float pcs_nn_relu_fwd(float x)
{
    return x < 0.0f ? 0.0f : x; /* keeps NaN, like torch.relu */
}

/* threshold_backward(grad, result, 0): NaN results pass the gradient, like PyTorch */
PCS_NN_HD float pcs_nn_relu_bwd(float y, float dy)
{
    return y <= 0.0f ? 0.0f : dy;
}

/* GELU, erf form (approximate='none'), unrounded. */
PCS_NN_HD float pcs_nn_gelu_fwd(float x)
{
    return 0.5f * x * (1.0f + erff(x * (float)PCS_NN_SQRT1_2));
}

PCS_NN_HD float pcs_nn_gelu_bwd(float x, float dy)
{
    float cdf = 0.5f * (1.0f + erff(x * (float)PCS_NN_SQRT1_2));
    float pdf = (float)PCS_NN_INV_SQRT_2PI * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
}

// ---- normalisation (LayerNorm per row, BatchNorm1d per column) ----

/* LayerNorm's row reductions (the mean, the centred sum of squares, and backward's two sums) run
 * in fp32, as PyTorch's (float accumulators for float input on the CPU and the GPU), in one order
 * that both backends follow so that their statistics agree bit for bit: element j of a row is
 * added, in order of j, to lane j % PCS_NN_LANES; the lanes are then combined as a warp's
 * shuffle-down tree, for s = 16, 8, 4, 2, 1: lane[l] += lane[l + s], and lane 0 holds the sum.
 * The CPU twin keeps the lanes in an array (its loops vectorize over them, the same bits in every
 * clone); the GPU gives lane l to thread l of the block's first warp. The variance is two-pass
 * (the sum of squared deviations from the fp32 mean), the stable textbook form: no cancellation
 * of E[x^2] - mean^2 for rows far from zero (test_nn). The same bits for finite input: a row
 * holding Inf or NaN gives NaN on both, NaN bits aside (x86's default NaN is not CUDA's). */
#define PCS_NN_LANES 32

/* The lane tree over a[PCS_NN_LANES] in place (the CPU's form of the warp shuffle); returns the
 * sum. */
PCS_NN_HD float pcs_nn_lane_tree(float *a)
{
    for (uint32_t s = PCS_NN_LANES / 2; s > 0; s >>= 1)
        for (uint32_t l = 0; l < s; l++)
            a[l] += a[l + s];
    return a[0];
}

/* A row sum divided by the row length d: the mean, and backward's means of dy*w and dy*w*xhat. */
PCS_NN_HD float pcs_nn_ln_mean(float sum, uint32_t d)
{
    return sum / (float)d;
}

/* One term of a row's centred sum of squares. */
PCS_NN_HD float pcs_nn_ln_sq(float x, float mean)
{
    float dev = x - mean;
    return dev * dev;
}

/* LayerNorm's saved 1/std from a row's centred sum of squares over d elements (biased variance). */
PCS_NN_HD float pcs_nn_ln_rstd(float ss, uint32_t d)
{
    return 1.0f / sqrtf(ss / (float)d + PCS_NN_LN_EPS);
}

/* x-hat in fp32 (both norms). */
PCS_NN_HD float pcs_nn_xhat(float x, float mean, float rstd)
{
    return (x - mean) * rstd;
}

/* The affine output of both norms, unrounded. */
PCS_NN_HD float pcs_nn_norm_out(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

/* BatchNorm1d training statistics of one feature: the column of R rows stride floats apart.
 * Writes mean and invstd (biased variance) and updates the fp32 running stats in place (momentum,
 * unbiased variance). Two passes in double, rows in order. R > 1 (checked by the caller). */
PCS_NN_HD void pcs_nn_bn_train_col(const float *x, size_t stride, uint32_t R, float *mean,
                                   float *invstd, float *run_mean, float *run_var)
{
    double s = 0, ss = 0;
    for (uint32_t r = 0; r < R; r++)
        s += x[(size_t)r * stride];
    double mu = s / R;
    for (uint32_t r = 0; r < R; r++) {
        double d = x[(size_t)r * stride] - mu;
        ss += d * d;
    }
    double var = ss / R;
    *mean = (float)mu;
    *invstd = (float)(1.0 / sqrt(var + PCS_NN_BN_EPS));
    *run_mean = (1.0f - PCS_NN_BN_MOMENTUM) * *run_mean + PCS_NN_BN_MOMENTUM * (float)mu;
    *run_var = (1.0f - PCS_NN_BN_MOMENTUM) * *run_var + PCS_NN_BN_MOMENTUM * (float)(ss / (R - 1));
}

/* BatchNorm1d eval: invstd from the (fp32) running variance. */
PCS_NN_HD float pcs_nn_bn_eval_invstd(float run_var)
{
    return (float)(1.0 / sqrt((double)run_var + PCS_NN_BN_EPS));
}

/* LayerNorm backward's two row-sum terms of one element: g = dy*w and g*xhat. */
PCS_NN_HD void pcs_nn_ln_bwd_terms(float dy, float w, float xh, float *g, float *gx)
{
    *g = dy * w;
    *gx = *g * xh;
}

/* The same terms added to lanes c1 and c2 (the row means m1, m2 come from the lane trees). */
PCS_NN_HD void pcs_nn_ln_bwd_acc(float dy, float w, float xh, float *c1, float *c2)
{
    float g, gx;
    pcs_nn_ln_bwd_terms(dy, w, xh, &g, &gx);
    *c1 += g;
    *c2 += gx;
}

/* LayerNorm's dx in fp32: rstd * (dy*w - m1 - xhat*m2). */
PCS_NN_HD float pcs_nn_ln_dx(float dy, float w, float xh, float rstd, float m1, float m2)
{
    return rstd * (dy * w - m1 - xh * m2);
}

/* A norm's weight/bias gradient terms in fp32, added in row order: dw += dy*xhat, db += dy. */
PCS_NN_HD void pcs_nn_norm_param_acc(float dy, float xh, float *dw, float *db)
{
    *dw += dy * xh;
    *db += dy;
}

/* BatchNorm1d's dx given the means m1 = mean(dy*w) and m2 = mean(dy*w*xhat) over the rows:
 * scale * (dy*w - m1 - xhat*m2), the bracket in double. */
PCS_NN_HD float pcs_nn_bn_dx(float dy, float w, float xh, float scale, double m1, double m2)
{
    return scale * (float)(dy * w - m1 - xh * m2);
}

/* BatchNorm1d backward of one feature (column of R rows, stride floats apart): dweight and
 * dbias in double summed in row order, then dx (dX may be NULL). */
PCS_NN_HD void pcs_nn_bn_bwd_col(const float *X, const float *dY, float *dX, size_t stride,
                                 uint32_t R, float mean, float invstd, float w, float *dw,
                                 float *db)
{
    double sg = 0, sgx = 0, sdy = 0, sdyx = 0;
    for (uint32_t r = 0; r < R; r++) {
        float dy = dY[(size_t)r * stride];
        float xh = pcs_nn_xhat(X[(size_t)r * stride], mean, invstd);
        sdy += dy;
        sdyx += (double)dy * xh;
        sg += dy * w;
        sgx += (double)dy * w * xh;
    }
    *dw = (float)sdyx;
    *db = (float)sdy;
    if (dX) {
        double mg = sg / R, mgx = sgx / R;
        for (uint32_t r = 0; r < R; r++) {
            float xh = pcs_nn_xhat(X[(size_t)r * stride], mean, invstd);
            dX[(size_t)r * stride] = pcs_nn_bn_dx(dY[(size_t)r * stride], w, xh, invstd, mg, mgx);
        }
    }
}

#endif
