/* Element math of the built-in model's nn ops, shared by the CPU twin (nn_cpu.c) and the CUDA
 * kernels (nn_cuda.cu), as pcs/kernel_math.h is for the update kernels: both compile these same
 * expressions without FMA contraction (C11 / nvcc --fmad=false), so the CPU tests pin the GPU's
 * arithmetic bit for bit. Only reduction order and libm differ (LayerNorm row statistics are block
 * reductions on the GPU; GELU's erff/expf are CUDA's, within 2 ulp, where the CPU twin's loops
 * use nn_vmath.h's vectorizable erf/exp in the same expressions). Not installed. */
#ifndef PCS_NN_MATH_H
#define PCS_NN_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "pcs/dtype.h"
#include "pcs/half.h"

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
PCS_HD float pcs_nn_round_to(float v, int dt)
{
    if (dt == PCS_DTYPE_BF16)
        return pcs_bf16_to_f32(pcs_f32_to_bf16(v));
    if (dt == PCS_DTYPE_FP16)
        return pcs_fp16_to_f32(pcs_f32_to_fp16(v));
    return v;
}

/* A gradient before its store: rounded to the parameter's dtype when the gradient's differs
 * (autograd computes it in the parameter's dtype). */
PCS_HD float pcs_nn_grad_round(float g, int gdt, int pdt)
{
    return gdt != pdt ? pcs_nn_round_to(g, pdt) : g;
}

/* An accumulated gradient store (autograd's .grad += g): g rounded to the parameter's dtype, added
 * in fp32 to the held value, rounded once to the gradient's dtype by the caller's store. */
PCS_HD float pcs_nn_grad_acc(float held, float g, int pdt)
{
    return held + pcs_nn_round_to(g, pdt);
}

/* The Linear epilogue's add (fp32), before the one rounding to the dtype. */
PCS_HD float pcs_nn_bias_add(float y, float b)
{
    return y + b;
}

/* The whole epilogue as the kernel runs it: + bias only with a bias (-0 + 0 would be +0), then
 * rounded once to dt. */
PCS_HD float pcs_nn_bias_round(float y, float b, int has_bias, int dt)
{
    return pcs_nn_round_to(has_bias ? pcs_nn_bias_add(y, b) : y, dt);
}

/* Sum of one column (stride floats apart) over rows in order, in fp32: Linear's db. */
PCS_HD float pcs_nn_col_sum(const float *col, size_t stride, uint32_t rows)
{
    float s = 0.0f;
    for (uint32_t r = 0; r < rows; r++)
        s += col[(size_t)r * stride];
    return s;
}

// ---- activations ----

PCS_HD float pcs_nn_relu_fwd(float x)
{
    return x < 0.0f ? 0.0f : x; /* keeps NaN, like torch.relu */
}

/* threshold_backward(grad, result, 0): NaN results pass the gradient, like PyTorch */
PCS_HD float pcs_nn_relu_bwd(float y, float dy)
{
    return y <= 0.0f ? 0.0f : dy;
}

/* GELU, erf form (approximate='none'), unrounded. */
PCS_HD float pcs_nn_gelu_fwd(float x)
{
    return 0.5f * x * (1.0f + erff(x * (float)PCS_NN_SQRT1_2));
}

PCS_HD float pcs_nn_gelu_bwd(float x, float dy)
{
    float cdf = 0.5f * (1.0f + erff(x * (float)PCS_NN_SQRT1_2));
    float pdf = (float)PCS_NN_INV_SQRT_2PI * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
}

// ---- normalisation (LayerNorm per row, BatchNorm1d per column) ----

/* One term of a row's variance sum, in double around the double mean. */
PCS_HD double pcs_nn_sq_dev(float x, double mean)
{
    return (x - mean) * (x - mean);
}

/* LayerNorm's saved statistics from a row's sum of squared deviations over d elements. */
PCS_HD float pcs_nn_ln_rstd(double ss, uint32_t d)
{
    return (float)(1.0 / sqrt(ss / d + PCS_NN_LN_EPS));
}

/* x-hat in fp32 (both norms). */
PCS_HD float pcs_nn_xhat(float x, float mean, float rstd)
{
    return (x - mean) * rstd;
}

/* The affine output of both norms, unrounded. */
PCS_HD float pcs_nn_norm_out(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

/* BatchNorm1d training statistics of one feature: the column of R rows stride floats apart.
 * Writes mean and invstd (biased variance) and updates the fp32 running stats in place (momentum,
 * unbiased variance). Two passes in double, rows in order. R > 1 (checked by the caller). */
PCS_HD void pcs_nn_bn_train_col(const float *x, size_t stride, uint32_t R, float *mean,
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
PCS_HD float pcs_nn_bn_eval_invstd(float run_var)
{
    return (float)(1.0 / sqrt((double)run_var + PCS_NN_BN_EPS));
}

/* LayerNorm backward, one element of a row: accumulates c1 = sum(dy*w), c2 = sum(dy*w*xhat) in
 * double (divided by the row length afterwards). */
PCS_HD void pcs_nn_ln_bwd_acc(float dy, float w, float xh, double *c1, double *c2)
{
    float g = dy * w;
    *c1 += g;
    *c2 += (double)g * xh;
}

/* A norm's weight/bias gradient terms in fp32, added in row order: dw += dy*xhat, db += dy. */
PCS_HD void pcs_nn_norm_param_acc(float dy, float xh, float *dw, float *db)
{
    *dw += dy * xh;
    *db += dy;
}

/* dx of both norms given the means m1 = mean(dy*w) and m2 = mean(dy*w*xhat) over the reduced
 * dimension: scale * (dy*w - m1 - xhat*m2), the bracket in double. */
PCS_HD float pcs_nn_norm_dx(float dy, float w, float xh, float scale, double m1, double m2)
{
    return scale * (float)(dy * w - m1 - xh * m2);
}

/* BatchNorm1d backward of one feature (column of R rows, stride floats apart): dweight and
 * dbias in double summed in row order, then dx (dX may be NULL). */
PCS_HD void pcs_nn_bn_bwd_col(const float *X, const float *dY, float *dX, size_t stride, uint32_t R,
                              float mean, float invstd, float w, float *dw, float *db)
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
            dX[(size_t)r * stride] = pcs_nn_norm_dx(dY[(size_t)r * stride], w, xh, invstd, mg, mgx);
        }
    }
}

#endif
