/* CPU cast loops: the reference scalar path (pcs/half.h, every dtype pair) and AVX-512 (F+BW+VL)
 * and AVX2+F16C paths for the four fp32 <-> bf16/fp16 directions, the best one chosen at run
 * time with __builtin_cpu_supports. All paths produce identical bits (test_kernels_cast_exhaustive
 * proves each over all 2^32 fp32 and 2^16 half inputs). Large outputs use non-temporal stores: a
 * big cast is memory-bound and write-allocate would add a read of the destination. */
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"
#include "pcs/half.h"

#if defined(__x86_64__) || defined(__i386__)
#define PCS_X86 1
#include <immintrin.h>
#else
#define PCS_X86 0
#endif

/* Outputs at least this big are written with streaming stores. Below it the destination may
 * still be cache-resident (half of a 32 MB server L3), where streaming stores are slower than
 * ordinary ones (measured in docs/perf/kernels.md: 4 MB widening ran at 0.5x memcpy with them). */
#define NT_STORE_MIN_BYTES ((size_t)16 << 20)

typedef enum simd_path { PATH_SCALAR = 0, PATH_AVX2 = 1, PATH_AVX512 = 2 } simd_path_t;

static const char *const path_names[] = {"scalar", "avx2+f16c", "avx512"};

/* -1: automatic (best supported); otherwise a forced path (tests, bench). */
static int forced_path = -1;

// ---- scalar reference loops ----

static float load_f32(const void *src, pcs_dtype_t st, size_t i)
{
    switch (st) {
    case PCS_DTYPE_FP32:
        return ((const float *)src)[i];
    case PCS_DTYPE_BF16:
        return pcs_bf16_to_f32(((const uint16_t *)src)[i]);
    case PCS_DTYPE_FP16:
        return pcs_fp16_to_f32(((const uint16_t *)src)[i]);
    default:
        return (float)((const double *)src)[i];
    }
}

/* fp64 -> bf16/fp16 goes through fp32 (double rounding), exactly as c10::BFloat16(double) and
 * c10::Half(double) do: their constructors take a float. */
static void cast_scalar(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st, size_t n)
{
    if (dt == st) {
        memmove(dst, src, n * pcs_dtype_size(dt));
        return;
    }
    if (dt == PCS_DTYPE_FP64) {
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = (double)load_f32(src, st, i); /* bf16/fp16/fp32 -> fp64 is exact */
        return;
    }
    if (dt == PCS_DTYPE_FP32) {
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = load_f32(src, st, i);
        return;
    }
    uint16_t *d = dst;
    if (dt == PCS_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_bf16(load_f32(src, st, i));
    } else {
        for (size_t i = 0; i < n; i++)
            d[i] = pcs_f32_to_fp16(load_f32(src, st, i));
    }
}

// ---- AVX2 + F16C ----
#if PCS_X86
#define AVX2_FN __attribute__((target("avx2,f16c")))

/* 8 fp32 -> 8 bf16 (RNE, NaN -> sign|0x7FC0), same integer steps as pcs_f32_to_bf16. */
AVX2_FN static inline __m128i f32x8_to_bf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    const __m256i nanv =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                        _mm256_set1_epi32(0x7fc0));
    const __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, nanv, isnan);
    /* every lane is <= 0xffff, so unsigned saturation is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 8 fp32 -> 8 fp16: the hardware rounds to nearest even (overflow, subnormals included); NaN is
 * forced to sign|0x7E00 like pcs_f32_to_fp16 (the hardware would keep the top payload bits). */
AVX2_FN static inline __m128i f32x8_to_fp16(__m256 x)
{
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(isnan), _mm256_extracti128_si256(isnan, 1));
    return _mm_andnot_si128(_mm_and_si128(nan16, _mm_set1_epi16(0x01ff)), h);
}

AVX2_FN static inline __m256 bf16x8_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* fp32 -> 16-bit, 16 elements per step; streaming stores once dst is 16-byte aligned. */
#define NARROW_LOOP(NAME, CONV, SCALAR)                                                            \
    AVX2_FN static void NAME(uint16_t *d, const float *s, size_t n)                                \
    {                                                                                              \
        size_t i = 0;                                                                              \
        int nt = n * 2 >= NT_STORE_MIN_BYTES;                                                      \
        if (nt)                                                                                    \
            for (; i < n && ((uintptr_t)(d + i) & 15u); i++)                                       \
                d[i] = SCALAR(s[i]);                                                               \
        if (nt) {                                                                                  \
            for (; i + 16 <= n; i += 16) {                                                         \
                __m128i a = CONV(_mm256_loadu_ps(s + i));                                          \
                __m128i b = CONV(_mm256_loadu_ps(s + i + 8));                                      \
                _mm_stream_si128((__m128i *)(d + i), a);                                           \
                _mm_stream_si128((__m128i *)(d + i + 8), b);                                       \
            }                                                                                      \
            _mm_sfence();                                                                          \
        } else {                                                                                   \
            for (; i + 16 <= n; i += 16) {                                                         \
                __m128i a = CONV(_mm256_loadu_ps(s + i));                                          \
                __m128i b = CONV(_mm256_loadu_ps(s + i + 8));                                      \
                _mm_storeu_si128((__m128i *)(d + i), a);                                           \
                _mm_storeu_si128((__m128i *)(d + i + 8), b);                                       \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            d[i] = SCALAR(s[i]);                                                                   \
    }

NARROW_LOOP(avx2_f32_to_bf16, f32x8_to_bf16, pcs_f32_to_bf16)
NARROW_LOOP(avx2_f32_to_fp16, f32x8_to_fp16, pcs_f32_to_fp16)

/* 16-bit -> fp32, 16 elements per step. */
#define WIDEN_LOOP(NAME, CONV, SCALAR)                                                             \
    AVX2_FN static void NAME(float *d, const uint16_t *s, size_t n)                                \
    {                                                                                              \
        size_t i = 0;                                                                              \
        int nt = n * 4 >= NT_STORE_MIN_BYTES;                                                      \
        if (nt)                                                                                    \
            for (; i < n && ((uintptr_t)(d + i) & 31u); i++)                                       \
                d[i] = SCALAR(s[i]);                                                               \
        if (nt) {                                                                                  \
            for (; i + 16 <= n; i += 16) {                                                         \
                __m256 a = CONV(_mm_loadu_si128((const __m128i *)(s + i)));                        \
                __m256 b = CONV(_mm_loadu_si128((const __m128i *)(s + i + 8)));                    \
                _mm256_stream_ps(d + i, a);                                                        \
                _mm256_stream_ps(d + i + 8, b);                                                    \
            }                                                                                      \
            _mm_sfence();                                                                          \
        } else {                                                                                   \
            for (; i + 16 <= n; i += 16) {                                                         \
                __m256 a = CONV(_mm_loadu_si128((const __m128i *)(s + i)));                        \
                __m256 b = CONV(_mm_loadu_si128((const __m128i *)(s + i + 8)));                    \
                _mm256_storeu_ps(d + i, a);                                                        \
                _mm256_storeu_ps(d + i + 8, b);                                                    \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            d[i] = SCALAR(s[i]);                                                                   \
    }

WIDEN_LOOP(avx2_bf16_to_f32, bf16x8_to_f32, pcs_bf16_to_f32)
WIDEN_LOOP(avx2_fp16_to_f32, _mm256_cvtph_ps, pcs_fp16_to_f32)

// ---- AVX-512 (F + BW + VL): 16 elements per instruction, mask registers for the NaN fix-up ----
#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

/* 16 fp32 -> 16 bf16, the same integer steps as pcs_f32_to_bf16 */
AVX512_FN static inline __m256i f32x16_to_bf16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i nanv =
        _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    r = _mm512_mask_mov_epi32(r, isnan, nanv);
    return _mm512_cvtepi32_epi16(r); /* every lane <= 0xffff: truncation is exact */
}

/* 16 fp32 -> 16 fp16: hardware RNE, NaN forced to sign|0x7E00 as in pcs_f32_to_fp16 */
AVX512_FN static inline __m256i f32x16_to_fp16(__m512 x)
{
    __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm256_mask_mov_epi16(h, isnan, _mm256_and_si256(h, _mm256_set1_epi16((short)0xfe00)));
}

AVX512_FN static inline __m512 bf16x16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512_FN static inline __m512 fp16x16_to_f32(__m256i h)
{
    return _mm512_cvtph_ps(h);
}

#define NARROW_LOOP512(NAME, CONV, SCALAR)                                                         \
    AVX512_FN static void NAME(uint16_t *d, const float *s, size_t n)                              \
    {                                                                                              \
        size_t i = 0;                                                                              \
        int nt = n * 2 >= NT_STORE_MIN_BYTES;                                                      \
        if (nt) {                                                                                  \
            for (; i < n && ((uintptr_t)(d + i) & 31u); i++)                                       \
                d[i] = SCALAR(s[i]);                                                               \
            for (; i + 32 <= n; i += 32) {                                                         \
                __m256i a = CONV(_mm512_loadu_ps(s + i));                                          \
                __m256i b = CONV(_mm512_loadu_ps(s + i + 16));                                     \
                _mm256_stream_si256((__m256i *)(d + i), a);                                        \
                _mm256_stream_si256((__m256i *)(d + i + 16), b);                                   \
            }                                                                                      \
            _mm_sfence();                                                                          \
        } else {                                                                                   \
            for (; i + 32 <= n; i += 32) {                                                         \
                __m256i a = CONV(_mm512_loadu_ps(s + i));                                          \
                __m256i b = CONV(_mm512_loadu_ps(s + i + 16));                                     \
                _mm256_storeu_si256((__m256i *)(d + i), a);                                        \
                _mm256_storeu_si256((__m256i *)(d + i + 16), b);                                   \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            d[i] = SCALAR(s[i]);                                                                   \
    }

NARROW_LOOP512(avx512_f32_to_bf16, f32x16_to_bf16, pcs_f32_to_bf16)
NARROW_LOOP512(avx512_f32_to_fp16, f32x16_to_fp16, pcs_f32_to_fp16)

#define WIDEN_LOOP512(NAME, CONV, SCALAR)                                                          \
    AVX512_FN static void NAME(float *d, const uint16_t *s, size_t n)                              \
    {                                                                                              \
        size_t i = 0;                                                                              \
        int nt = n * 4 >= NT_STORE_MIN_BYTES;                                                      \
        if (nt) {                                                                                  \
            for (; i < n && ((uintptr_t)(d + i) & 63u); i++)                                       \
                d[i] = SCALAR(s[i]);                                                               \
            for (; i + 32 <= n; i += 32) {                                                         \
                __m512 a = CONV(_mm256_loadu_si256((const __m256i *)(s + i)));                     \
                __m512 b = CONV(_mm256_loadu_si256((const __m256i *)(s + i + 16)));                \
                _mm512_stream_ps(d + i, a);                                                        \
                _mm512_stream_ps(d + i + 16, b);                                                   \
            }                                                                                      \
            _mm_sfence();                                                                          \
        } else {                                                                                   \
            for (; i + 32 <= n; i += 32) {                                                         \
                __m512 a = CONV(_mm256_loadu_si256((const __m256i *)(s + i)));                     \
                __m512 b = CONV(_mm256_loadu_si256((const __m256i *)(s + i + 16)));                \
                _mm512_storeu_ps(d + i, a);                                                        \
                _mm512_storeu_ps(d + i + 16, b);                                                   \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            d[i] = SCALAR(s[i]);                                                                   \
    }

WIDEN_LOOP512(avx512_bf16_to_f32, bf16x16_to_f32, pcs_bf16_to_f32)
WIDEN_LOOP512(avx512_fp16_to_f32, fp16x16_to_f32, pcs_fp16_to_f32)

static int cpu_has(simd_path_t p)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        int a2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        int a5 = a2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
        cached = a5 ? PATH_AVX512 : a2 ? PATH_AVX2 : PATH_SCALAR;
    }
    return (int)p <= cached;
}

static simd_path_t best_path(void)
{
    return cpu_has(PATH_AVX512) ? PATH_AVX512 : cpu_has(PATH_AVX2) ? PATH_AVX2 : PATH_SCALAR;
}

/* 1 if handled by a vector loop of `p`. */
static int cast_simd(simd_path_t p, void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st,
                     size_t n)
{
    const int f2b = st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_BF16;
    const int f2h = st == PCS_DTYPE_FP32 && dt == PCS_DTYPE_FP16;
    const int b2f = st == PCS_DTYPE_BF16 && dt == PCS_DTYPE_FP32;
    const int h2f = st == PCS_DTYPE_FP16 && dt == PCS_DTYPE_FP32;
    if (p == PATH_AVX512) {
        if (f2b)
            avx512_f32_to_bf16(dst, src, n);
        else if (f2h)
            avx512_f32_to_fp16(dst, src, n);
        else if (b2f)
            avx512_bf16_to_f32(dst, src, n);
        else if (h2f)
            avx512_fp16_to_f32(dst, src, n);
        else
            return 0;
        return 1;
    }
    if (p == PATH_AVX2) {
        if (f2b)
            avx2_f32_to_bf16(dst, src, n);
        else if (f2h)
            avx2_f32_to_fp16(dst, src, n);
        else if (b2f)
            avx2_bf16_to_f32(dst, src, n);
        else if (h2f)
            avx2_fp16_to_f32(dst, src, n);
        else
            return 0;
        return 1;
    }
    return 0;
}
#else
static int cpu_has(simd_path_t p)
{
    return p == PATH_SCALAR;
}

static simd_path_t best_path(void)
{
    return PATH_SCALAR;
}

static int cast_simd(simd_path_t p, void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st,
                     size_t n)
{
    return 0;
}
#endif

static simd_path_t current_path(void)
{
    return forced_path >= 0 ? (simd_path_t)forced_path : best_path();
}

const char *pcs_cpu_simd_name(void)
{
    return path_names[current_path()];
}

void pcs_cpu_simd_force_scalar(int on)
{
    forced_path = on ? PATH_SCALAR : -1;
}

/* -1 auto, -2 unknown, else a path */
static int parse_path(const char *name)
{
    if (name == NULL)
        return -2;
    if (strcmp(name, "auto") == 0)
        return -1;
    if (strcmp(name, "avx2") == 0)
        return PATH_AVX2;
    for (int p = 0; p < 3; p++)
        if (strcmp(name, path_names[p]) == 0)
            return p;
    return -2;
}

pcs_status_t pcs_cpu_simd_select(const char *name)
{
    int p = parse_path(name);
    if (p == -2)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "cpu simd path '%s' unknown (auto, avx512, avx2+f16c, scalar)",
                             name ? name : "(null)");
    if (p >= 0 && !cpu_has((simd_path_t)p))
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "cpu simd path '%s' not supported by this CPU",
                             name);
    forced_path = p;
    return PCS_OK;
}

static int is_cast_dtype(pcs_dtype_t t)
{
    return t == PCS_DTYPE_FP32 || t == PCS_DTYPE_BF16 || t == PCS_DTYPE_FP16 || t == PCS_DTYPE_FP64;
}

static pcs_status_t cast_array(simd_path_t p, void *dst, pcs_dtype_t dt, const void *src,
                               pcs_dtype_t st, size_t n)
{
    if (!is_cast_dtype(dt) || !is_cast_dtype(st))
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "cast: %s -> %s is not supported",
                             pcs_dtype_name(st), pcs_dtype_name(dt));
    if (n == 0)
        return PCS_OK;
    if (!cast_simd(p, dst, dt, src, st, n))
        cast_scalar(dst, dt, src, st, n);
    return PCS_OK;
}

pcs_status_t pcs_cpu_cast_array(void *dst, pcs_dtype_t dt, const void *src, pcs_dtype_t st,
                                size_t n)
{
    return cast_array(current_path(), dst, dt, src, st, n);
}

pcs_status_t pcs_cpu_cast_array_path(const char *path, void *dst, pcs_dtype_t dt, const void *src,
                                     pcs_dtype_t st, size_t n)
{
    int p = parse_path(path);
    if (p == -2)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "cpu simd path '%s' unknown",
                             path ? path : "(null)");
    if (p == -1)
        p = (int)best_path();
    if (!cpu_has((simd_path_t)p))
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "cpu simd path '%s' not supported by this CPU",
                             path);
    return cast_array((simd_path_t)p, dst, dt, src, st, n);
}
