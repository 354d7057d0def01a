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

/* Per-update scalars of AdamW, computed once on the host by pcs_adamw_coef(). */
typedef struct pcs_adamw_coef {
    float decay;    /* 1 - lr*wd                  (param.mul_(1 - lr*wd)) */
    float w1;       /* 1 - beta1                  (exp_avg.lerp_(grad, 1 - beta1)) */
    float beta2;    /* beta2                      (exp_avg_sq.mul_(beta2)) */
    float omb2;     /* 1 - beta2                  (.addcmul_(grad, grad, value=1 - beta2)) */
    float neg_step; /* -lr / (1 - beta1^t)        (param.addcdiv_(.., value=-step_size)) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float eps;      /* eps */
    float gsign;    /* -1 when maximize */
} pcs_adamw_coef_t;

/* Per-update scalars of SGD. */
typedef struct pcs_sgd_coef {
    float wd;       /* grad.add(param, alpha=wd) */
    float momentum; /* buf.mul_(momentum) ; nesterov grad.add(buf, alpha=momentum) */
    float omd;      /* 1 - dampening              (buf.add_(grad, alpha=1 - dampening)) */
    float neg_lr;   /* param.add_(grad, alpha=-lr) */
    float gsign;    /* -1 when maximize */
    int use_wd, use_momentum, nesterov, first_step;
} pcs_sgd_coef_t;

/* One AdamW element. ATen's CPU lerp: weight < 0.5 ? a + w*(b-a) : b - (b-a)*(1-w);
 * addcmul: self + value*t1*t2; addcdiv: self + value*t1/t2; denom = sqrt(v)/bc2_sqrt + eps. */
PCS_HD void pcs_adamw_elem(float *p, float g, float *m, float *v, const pcs_adamw_coef_t *c)
{
    float gg = g * c->gsign;
    float pp = *p * c->decay;
    float mm = *m;
    mm = (c->w1 < 0.5f) ? mm + c->w1 * (gg - mm) : gg - (gg - mm) * (1.0f - c->w1);
    float vv = *v * c->beta2;
    vv = vv + c->omb2 * gg * gg;
    float denom = sqrtf(vv) / c->bc2_sqrt + c->eps;
    pp = pp + c->neg_step * mm / denom;
    *p = pp;
    *m = mm;
    *v = vv;
}

/* One SGD element; `buf` may be NULL when momentum is off. */
PCS_HD void pcs_sgd_elem(float *p, float g, float *buf, const pcs_sgd_coef_t *c)
{
    float gg = g * c->gsign;
    if (c->use_wd)
        gg = gg + c->wd * *p;
    if (c->use_momentum) {
        float b;
        if (c->first_step) {
            b = gg;
        } else {
            b = *buf * c->momentum;
            b = b + c->omd * gg;
        }
        *buf = b;
        gg = c->nesterov ? gg + c->momentum * b : b;
    }
    *p = *p + c->neg_lr * gg;
}

/* PyTorch's isfinite on the fp32 value (bf16/fp16 widen exactly). */
PCS_HD int pcs_is_finite_f32(float x)
{
    return (pcs_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

#endif
