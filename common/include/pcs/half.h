/* Scalar fp32 <-> bf16 / fp16 conversions, the one definition used by the CPU loops, the CUDA
 * kernels (host/device inline) and the collectives' reductions, so that CPU tests cover the GPU
 * code path bit for bit. Round to nearest, ties to even; NaN handling documented per function.
 * Owner: kernels. tests/unit/test_kernels_cast_exhaustive.c checks all 2^32 fp32 inputs against an
 * independent reference and all 2^16 half inputs round-trip; docs/perf/kernels.md has the table.
 *
 * NaN policy (one rule for both formats): a NaN input gives the format's canonical quiet NaN with
 * the input's sign kept and the payload dropped: bf16 sign|0x7FC0, fp16 sign|0x7E00. This is
 * c10's payload for both (c10::BFloat16 round_to_nearest_even returns 0x7FC0, c10 fp16_ieee_from_
 * fp32_value returns sign|0x7E00). c10's bf16 path drops the sign (-NaN -> 0x7FC0); we keep it so
 * that bf16 and fp16 agree, the sign bit survives a cast as it does for every other value, and a
 * bf16 NaN widened back to fp32 keeps its sign as hardware cvt does. Only the sign of a NaN differs
 * from c10, and no arithmetic result depends on it. */
#ifndef PCS_HALF_H
#define PCS_HALF_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define PCS_HD __host__ __device__ __forceinline__
#else
#define PCS_HD static inline
#endif

PCS_HD uint32_t pcs_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

PCS_HD float pcs_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 -> fp32: exact (the bf16 bits are the top half of the fp32 bits). */
PCS_HD float pcs_bf16_to_f32(uint16_t h)
{
    return pcs_bits_f32((uint32_t)h << 16);
}

/* fp32 -> bf16, round to nearest even: add 0x7FFF plus the kept LSB, truncate. NaN -> sign|0x7FC0
 * (see the NaN policy above). Subnormals round like normals (bf16 shares fp32's exponent range);
 * values at or past the largest bf16 plus half an ulp (0x7F7F8000) become +-Inf; Inf stays Inf. */
PCS_HD uint16_t pcs_f32_to_bf16(float f)
{
    uint32_t u = pcs_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
    uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + bias) >> 16);
}

/* fp16 -> fp32: exact, including subnormals and Inf. NaN keeps sign and payload (shifted) and is
 * quietened (bit 22 set), as c10's fp16_ieee_to_fp32_value and x86 F16C vcvtph2ps do. */
PCS_HD float pcs_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else if (e == 0) {
        if (m == 0) {
            u = sign;
        } else {
            uint32_t ex = 113; /* 127 - 14: exponent of 2^-14 */
            while (!(m & 0x400u)) {
                m <<= 1;
                ex--;
            }
            u = sign | (ex << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    return pcs_bits_f32(u);
}

/* fp32 -> fp16, round to nearest even. NaN -> sign | 0x7E00 (quiet NaN, sign kept; as c10's
 * fp16_ieee_from_fp32_value). |x| >= 65520 (halfway above 65504) -> +-Inf; subnormals rounded. */
PCS_HD uint16_t pcs_f32_to_fp16(float f)
{
    uint32_t u = pcs_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {    /* below 2^-14: fp16 subnormal or zero */
        if (ax <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 is a tie, to even 0) */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13;
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

#endif
