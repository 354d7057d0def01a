/* Element math of the update kernels, shared by the CPU loops (kernels/src/ops_cpu.c) and the CUDA
 * kernels (kernels/src/ops_cuda.cu) so that the CPU twin is an exact oracle for the GPU: both are
 * compiled without FMA contraction (C11 mode / nvcc --fmad=false) and evaluate the same fp32
 * expressions in the same order as PyTorch's single-tensor optimizers (torch/optim/adam.py,
 * sgd.py, foreach=False). Scalars that PyTorch computes in Python (double) are precomputed on the
 * host in double and rounded once to float, as PyTorch does when it passes them to a kernel. */
#ifndef PCS_KERNEL_MATH_H
#define PCS_KERNEL_MATH_H

#include <math.h>

#include "pcs/half.h"

/* Per-update scalars of AdamW, computed once on the host by pcs_adamw_coef() (fp32 shards: each
 * rounded once to float) or pcs_adamw_coef64() (fp64 shards: the doubles PyTorch passes). */
#define PCS_ADAMW_COEF_FIELDS(T)                                                                   \
    T decay;    /* 1 - lr*wd                  (param.mul_(1 - lr*wd)) */                           \
    T w1;       /* 1 - beta1                  (exp_avg.lerp_(grad, 1 - beta1)) */                  \
    T beta2;    /* beta2                      (exp_avg_sq.mul_(beta2)) */                          \
    T omb2;     /* 1 - beta2                  (.addcmul_(grad, grad, value=1 - beta2)) */          \
    T neg_step; /* -lr / (1 - beta1^t)        (param.addcdiv_(.., value=-step_size)) */            \
    T bc2_sqrt; /* sqrt(1 - beta2^t) */                                                            \
    T eps;      /* eps */                                                                          \
    T gsign;    /* -1 when maximize */
typedef struct pcs_adamw_coef {
    PCS_ADAMW_COEF_FIELDS(float)
} pcs_adamw_coef_t;
typedef struct pcs_adamw_coef64 {
    PCS_ADAMW_COEF_FIELDS(double)
} pcs_adamw_coef64_t;

/* Per-update scalars of SGD (pcs_sgd_coef / pcs_sgd_coef64). */
#define PCS_SGD_COEF_FIELDS(T)                                                                     \
    T wd;       /* grad.add(param, alpha=wd) */                                                    \
    T momentum; /* buf.mul_(momentum) ; nesterov grad.add(buf, alpha=momentum) */                  \
    T omd;      /* 1 - dampening              (buf.add_(grad, alpha=1 - dampening)) */             \
    T neg_lr;   /* param.add_(grad, alpha=-lr) */                                                  \
    T gsign;    /* -1 when maximize */                                                             \
    int use_wd, use_momentum, nesterov, first_step;
typedef struct pcs_sgd_coef {
    PCS_SGD_COEF_FIELDS(float)
} pcs_sgd_coef_t;
typedef struct pcs_sgd_coef64 {
    PCS_SGD_COEF_FIELDS(double)
} pcs_sgd_coef64_t;

/* One AdamW element in T (float for fp32 shards, double for fp64: PyTorch's opmath of each).
 * ATen's CPU lerp: weight < 0.5 ? a + w*(b-a) : b - (b-a)*(1-w); addcmul: self + value*t1*t2;
 * addcdiv: self + value*t1/t2; denom = sqrt(v)/bc2_sqrt + eps. */
#define PCS_ADAMW_ELEM(NAME, T, COEF, SQRT)                                                        \
    PCS_HD void NAME(T *p, T g, T *m, T *v, const COEF *c)                                         \
    {                                                                                              \
        T gg = g * c->gsign;                                                                       \
        T pp = *p * c->decay;                                                                      \
        T mm = *m;                                                                                 \
        mm = (c->w1 < (T)0.5) ? mm + c->w1 * (gg - mm) : gg - (gg - mm) * ((T)1 - c->w1);          \
        T vv = *v * c->beta2;                                                                      \
        vv = vv + c->omb2 * gg * gg;                                                               \
        T denom = SQRT(vv) / c->bc2_sqrt + c->eps;                                                 \
        pp = pp + c->neg_step * mm / denom;                                                        \
        *p = pp;                                                                                   \
        *m = mm;                                                                                   \
        *v = vv;                                                                                   \
    }
PCS_ADAMW_ELEM(pcs_adamw_elem, float, pcs_adamw_coef_t, sqrtf)
PCS_ADAMW_ELEM(pcs_adamw_elem64, double, pcs_adamw_coef64_t, sqrt)

/* One SGD element in T; `buf` may be NULL when momentum is off. */
#define PCS_SGD_ELEM(NAME, T, COEF)                                                                \
    PCS_HD void NAME(T *p, T g, T *buf, const COEF *c)                                             \
    {                                                                                              \
        T gg = g * c->gsign;                                                                       \
        if (c->use_wd)                                                                             \
            gg = gg + c->wd * *p;                                                                  \
        if (c->use_momentum) {                                                                     \
            T b;                                                                                   \
            if (c->first_step) {                                                                   \
                b = gg;                                                                            \
            } else {                                                                               \
                b = *buf * c->momentum;                                                            \
                b = b + c->omd * gg;                                                               \
            }                                                                                      \
            *buf = b;                                                                              \
            gg = c->nesterov ? gg + c->momentum * b : b;                                           \
        }                                                                                          \
        *p = *p + c->neg_lr * gg;                                                                  \
    }
PCS_SGD_ELEM(pcs_sgd_elem, float, pcs_sgd_coef_t)
PCS_SGD_ELEM(pcs_sgd_elem64, double, pcs_sgd_coef64_t)

/* PyTorch's isfinite on the fp32 value (bf16/fp16 widen exactly). */
PCS_HD int pcs_is_finite_f32(float x)
{
    return (pcs_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

#endif
