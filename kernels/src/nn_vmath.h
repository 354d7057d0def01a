/* erf and exp for the CPU twin's GELU loops, written branch-free so that GCC vectorizes the loops
 * that call them (nn_cpu.c; glibc's erff/expf are calls, one element at a time, which made GELU a
 * sixth of a gelu model's step on the CPU). Lane-wise IEEE arithmetic with explicit fmaf only
 * (C11: no contraction), so every clone of a loop (AVX-512, AVX2+FMA, baseline with libm's exact
 * fmaf) gives the same bits, NaN signs aside. Accuracy against the correctly rounded value
 * (test_nn_vmath, every third float): erf <= 1.2 ulp (glibc erff: ~1), exp <= 1.1 ulp. The CUDA
 * kernels keep CUDA's erff/expf (<= 2 ulp): CPU and GPU GELU differ by a few ulp of erf, as
 * before. The baseline clone (a CPU without AVX2+FMA) calls libm's fmaf, ~35 per element: about
 * twice glibc erff/expf's cost there, and far more where fmaf is emulated in software; the same
 * bits. Not installed. */
#ifndef PCS_NN_VMATH_H
#define PCS_NN_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* always inlined: the loops that call these carry optimize/target_clones attributes, across which
 * GCC does not inline on its own, and a call per element would not vectorize */
#if defined(__GNUC__)
#define PCS_VM_INLINE static inline __attribute__((always_inline))
#else
#define PCS_VM_INLINE static inline
#endif

/* Least-squares fits on Chebyshev nodes in double (numpy), rounded to float; highest degree first.
 * erf(a) = a + a * E1(a^2) on [0, 1); erfc(a) = E2((a - 1.6) / 0.6) on [1, 2.2),
 * E3((a - 3.1) / 0.9) on [2.2, 4); 1 from 4 on (erf(4) rounds to 1). */
static const float pcs_vm_e1[7] = {7.882497108e-05f, -8.018854992e-04f, 5.189311943e-03f,
                                   -2.685432880e-02f, 1.128359746e-01f, -3.761262690e-01f,
                                   1.2837916709551257e-01f};
static const float pcs_vm_e2[11] = {1.391696258e-06f, -1.355360090e-05f, 1.575478368e-05f,
                                    1.674750946e-04f, -7.227657584e-04f, 3.410725799e-04f,
                                    6.391097354e-03f, -2.587574569e-02f, 5.024393194e-02f,
                                    -5.233742930e-02f, 2.365161674e-02f};
static const float pcs_vm_e3[11] = {-4.091956502e-06f, -2.941590109e-06f, 5.253097638e-05f,
                                    -1.448746192e-04f, 2.650947902e-04f, -3.800241888e-04f,
                                    4.162797123e-04f, -3.355059176e-04f, 1.899686621e-04f,
                                    -6.807143948e-05f, 1.164895737e-05f};

/* Horner's rule written out (a loop over the coefficients would be an inner loop, which keeps
 * GCC from vectorizing the element loop around it). */
#define PCS_VM_H7(c, u)                                                                            \
    fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(c[0], u, c[1]), u, c[2]), u, c[3]), u, c[4]), u, c[5]), u, c[6])
#define PCS_VM_H11(c, u)                                                                           \
    fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(c[0], u, c[1]), u, c[2]), u, c[3]), u,      \
                                          c[4]),                                                   \
                                     u, c[5]),                                                     \
                                u, c[6]),                                                          \
                           u, c[7]),                                                               \
                      u, c[8]),                                                                    \
                 u, c[9]),                                                                         \
            u, c[10])

/* erf(x); NaN stays NaN, erf(-0) = -0, erf(+-inf) = +-1. */
PCS_VM_INLINE float pcs_vm_erf(float x)
{
    float a = fabsf(x);
    float t = x * x, u2 = (a - 1.6f) * (1.0f / 0.6f), u3 = (a - 3.1f) * (1.0f / 0.9f);
    float r1 = fmaf(a, PCS_VM_H7(pcs_vm_e1, t), a); /* the large part a is exact */
    float c2 = PCS_VM_H11(pcs_vm_e2, u2);
    float c3 = PCS_VM_H11(pcs_vm_e3, u3);
    /* every value computed before the selects (an FP operation under a condition keeps GCC from
     * if-converting the loop without AVX-512's masks: -ftrapping-math) */
    float e = 1.0f - (a < 2.2f ? c2 : c3);
    float r = a < 1.0f ? r1 : (a < 4.0f ? e : 1.0f);
    r = a == a ? r : x;
    return copysignf(r, x);
}

/* exp(x): Cody-Waite reduction by ln 2 and Cephes' expf polynomial; 2^n applied in two steps so
 * that subnormal results come out right; overflow to inf, underflow to 0, NaN stays NaN. */
PCS_VM_INLINE float pcs_vm_exp(float x)
{
    /* clamped by comparisons (fminf/fmaxf are libm calls for their NaN rule); NaN lanes compute
     * on 0 (no float-to-int conversion of a NaN) and take x at the end */
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 88.8f ? 88.8f : xc;
    xc = x == x ? xc : 0.0f;
    float n = rintf(xc * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500E-4f;
    p = fmaf(p, r, 1.3981999507E-3f);
    p = fmaf(p, r, 8.3334519073E-3f);
    p = fmaf(p, r, 4.1665795894E-2f);
    p = fmaf(p, r, 1.6666665459E-1f);
    p = fmaf(p, r, 5.0000001201E-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    /* (memcpy, not pcs/half.h's pcs_bits_f32: a plain static inline is not inlined across the
     * calling loops' optimize attribute, and a call would stop the vectorizer) */
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float y = p * s1 * s2;
    y = x > 88.8f ? INFINITY : y;
    y = x < -104.0f ? 0.0f : y;
    return x == x ? y : x;
}

#endif
