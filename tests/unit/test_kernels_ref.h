/* Slow, obviously-correct references for the kernels tests: rounding a finite fp32 value to a
 * binary format by arithmetic on exact doubles (no bit tricks shared with pcs/half.h), decoding
 * a 16-bit pattern by its IEEE definition, and the PyTorch optimizer formulas in double. */
#ifndef PCS_TEST_KERNELS_REF_H
#define PCS_TEST_KERNELS_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A 16-bit binary format: fraction bits, min normal exponent, max exponent, exponent bias. */
typedef struct ref_fmt {
    int mbits, emin, emax, bias;
    uint16_t inf, qnan;
    double pow2[400]; /* pow2[i] = 2^(i-200) */
} ref_fmt_t;

static inline double ref_p2(const ref_fmt_t *f, int e)
{
    return f->pow2[e + 200];
}

static inline void ref_fmt_init(ref_fmt_t *f, int mbits, int emin, int emax, int bias, uint16_t inf,
                                uint16_t qnan)
{
    f->mbits = mbits;
    f->emin = emin;
    f->emax = emax;
    f->bias = bias;
    f->inf = inf;
    f->qnan = qnan;
    for (int i = 0; i < 400; i++)
        f->pow2[i] = ldexp(1.0, i - 200);
}

static inline void ref_bf16(ref_fmt_t *f)
{
    ref_fmt_init(f, 7, -126, 127, 127, 0x7f80, 0x7fc0);
}

static inline void ref_fp16(ref_fmt_t *f)
{
    ref_fmt_init(f, 10, -14, 15, 15, 0x7c00, 0x7e00);
}

/* Round fp32 x to the format, nearest with ties to the even pattern; NaN -> sign|qnan (the
 * documented pcs policy), overflow -> sign|inf. */
static inline uint16_t ref_round(const ref_fmt_t *f, float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (x != x)
        return sign | f->qnan;
    double a = fabs((double)x); /* exact */
    if (isinf(a))
        return sign | f->inf;
    if (a == 0.0)
        return sign;
    /* a lies in [2^e, 2^(e+1)); fp32 subnormals have e < -126 <= emin and are clamped below */
    int e = (int)((u >> 23) & 0xffu) - 127;
    if (e < f->emin)
        e = f->emin; /* below the normal range the spacing stays that of emin (subnormals) */
    double q = ref_p2(f, e - f->mbits);     /* spacing of representable values here */
    double k = a * ref_p2(f, f->mbits - e); /* = a / q, exact: q is a power of two */
    double fl = floor(k);
    double rem = k - fl;
    if (rem > 0.5 || (rem == 0.5 && ((uint64_t)fl & 1u)))
        fl += 1.0;
    double r = fl * q;
    if (r >= ref_p2(f, f->emax + 1))
        return sign | f->inf;
    if (r == 0.0)
        return sign;
    if (r < ref_p2(f, f->emin)) /* subnormal: the pattern is the multiple of the spacing */
        return sign | (uint16_t)(r * ref_p2(f, f->mbits - f->emin));
    uint64_t rb;
    memcpy(&rb, &r, sizeof rb);
    int re = (int)((rb >> 52) & 0x7ffu) - 1023;
    uint32_t frac = (uint32_t)(r * ref_p2(f, f->mbits - re)) - (1u << f->mbits);
    return (uint16_t)(sign | ((uint32_t)(re + f->bias) << f->mbits) | frac);
}

/* Value of a 16-bit pattern by definition (NaN -> NAN of the right sign). */
static inline double ref_decode(const ref_fmt_t *f, uint16_t h)
{
    int s = h >> 15;
    int ebits = 15 - f->mbits;
    int e = (h >> f->mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << f->mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, f->emin - f->mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -f->mbits), e - f->bias);
    return s ? -v : v;
}

/* ---- optimizer references in double (torch.optim, textbook form) ---- */

static inline void ref_adamw(double *p, double g, double *m, double *v, double lr, double b1,
                             double b2, double eps, double wd, int64_t step, int maximize)
{
    if (maximize)
        g = -g;
    *p *= 1.0 - lr * wd;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    double bias1 = 1.0 - pow(b1, (double)step);
    double bias2 = 1.0 - pow(b2, (double)step);
    double denom = sqrt(*v) / sqrt(bias2) + eps;
    *p -= (lr / bias1) * *m / denom;
}

static inline void ref_sgd(double *p, double g, double *buf, double lr, double momentum,
                           double dampening, double wd, int nesterov, int maximize, int first)
{
    if (maximize)
        g = -g;
    if (wd != 0.0)
        g += wd * *p;
    if (momentum != 0.0) {
        if (first)
            *buf = g;
        else
            *buf = momentum * *buf + (1.0 - dampening) * g;
        g = nesterov ? g + momentum * *buf : *buf;
    }
    *p -= lr * g;
}

#endif
