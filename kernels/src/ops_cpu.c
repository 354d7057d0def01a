/* The "cpu" backend: host memory, ordering-token streams/events, and every element-wise op as a
 * plain loop over pcs/half.h and pcs/kernel_math.h. This is the reference twin the CUDA backend
 * is tested against; ops complete before they return, so sync() is a no-op. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels_internal.h"
#include "pcs/log.h"
#include "pcs/mem.h"

struct pcs_stream {
    int unused;
};
struct pcs_event {
    uint64_t t_ns; /* host monotonic clock at the last event_record */
    int recorded;
};

// ---- memory ----

static pcs_status_t cpu_alloc(size_t bytes, void **out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc: NULL out");
    *out = NULL;
    if (bytes == 0)
        return PCS_OK;
    size_t rounded = (bytes + 255u) & ~(size_t)255u;
    if (rounded < bytes)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc: %zu bytes overflows", bytes);
    void *p = aligned_alloc(256, rounded);
    if (p == NULL) {
        PCS_WARN(PCS_SUB_MEM, "cpu alloc of %zu bytes failed", bytes);
        return PCS_ERR_NOMEM;
    }
    *out = p;
    return PCS_OK;
}

static void cpu_free(void *p)
{
    free(p);
}

static pcs_status_t cpu_copy(void *dst, const void *src, size_t bytes, pcs_copy_kind_t kind,
                             pcs_stream_t s)
{
    if (bytes == 0)
        return PCS_OK;
    if (dst == NULL || src == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "copy: NULL %s with %zu bytes",
                             dst == NULL ? "dst" : "src", bytes);
    if ((unsigned)kind > (unsigned)PCS_COPY_D2D)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "copy: invalid kind %d", (int)kind);
    memmove(dst, src, bytes);
    return PCS_OK;
}

static pcs_status_t cpu_fill(void *dst, pcs_dtype_t dt, size_t n, double value, pcs_stream_t s)
{
    switch (dt) {
    case PCS_DTYPE_FP64: {
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = value;
        break;
    }
    case PCS_DTYPE_FP32: {
        float *d = dst, v = (float)value;
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    case PCS_DTYPE_INT64: { /* the front door checked that value fits */
        int64_t *d = dst, v = (int64_t)value;
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    default: {
        /* via fp32 like c10::BFloat16(double)/c10::Half(double) */
        uint16_t *d = dst;
        uint16_t v =
            dt == PCS_DTYPE_BF16 ? pcs_f32_to_bf16((float)value) : pcs_f32_to_fp16((float)value);
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    }
    return PCS_OK;
}

// ---- streams and events: ordering tokens only ----

static pcs_status_t cpu_stream_create(pcs_stream_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_create: NULL out");
    return pcs_calloc(1, sizeof(struct pcs_stream), (void **)out);
}

static void cpu_stream_destroy(pcs_stream_t s)
{
    free(s);
}

static pcs_status_t cpu_sync(pcs_stream_t s)
{
    return PCS_OK;
}

static pcs_status_t cpu_event_create(pcs_event_t *out)
{
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_create: NULL out");
    return pcs_calloc(1, sizeof(struct pcs_event), (void **)out);
}

static void cpu_event_destroy(pcs_event_t e)
{
    free(e);
}

static pcs_status_t cpu_event_record(pcs_event_t e, pcs_stream_t s)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_record: NULL event");
    /* every op before it has completed: the host clock now is when the event "happens" */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    e->recorded = 1;
    return PCS_OK;
}

static pcs_status_t cpu_stream_wait_event(pcs_stream_t s, pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "stream_wait_event: NULL event");
    return PCS_OK;
}

static pcs_status_t cpu_event_sync(pcs_event_t e)
{
    if (e == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_sync: NULL event");
    return PCS_OK;
}

static pcs_status_t cpu_event_elapsed_ms(pcs_event_t start, pcs_event_t end, float *ms)
{
    if (start == NULL || end == NULL || ms == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "event_elapsed_ms: NULL argument");
    if (!start->recorded || !end->recorded)
        return pcs_set_error(PCS_ERR_STATE, "event_elapsed_ms: %s event was never recorded",
                             !start->recorded ? "start" : "end");
    *ms = (float)((double)((int64_t)(end->t_ns - start->t_ns)) / 1e6);
    return PCS_OK;
}

// ---- element loops, one per dtype (combination), so the dtype test is not per element ----

#define LD_FP32(x) (x)
#define ST_FP32(x) (x)
#define LD_BF16(x) pcs_bf16_to_f32(x)
#define ST_BF16(x) pcs_f32_to_bf16(x)
#define LD_FP16(x) pcs_fp16_to_f32(x)
#define ST_FP16(x) pcs_f32_to_fp16(x)

#define SCALE_LOOP(NAME, T, LD, ST)                                                                \
    static void NAME(void *data, size_t n, float f)                                                \
    {                                                                                              \
        T *restrict d = data;                                                                      \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = ST(LD(d[i]) * f);                                                               \
    }
SCALE_LOOP(scale_fp32, float, LD_FP32, ST_FP32)
SCALE_LOOP(scale_bf16, uint16_t, LD_BF16, ST_BF16)
SCALE_LOOP(scale_fp16, uint16_t, LD_FP16, ST_FP16)

/* no restrict: dst and src may be the same buffer (x += x) */
#define ACC_LOOP(NAME, TD, LDD, STD, TS, LDS)                                                      \
    static void NAME(void *dv, const void *sv, size_t n)                                           \
    {                                                                                              \
        TD *d = dv;                                                                                \
        const TS *x = sv;                                                                          \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = STD(LDD(d[i]) + LDS(x[i]));                                                     \
    }
/* every (dst, src) dtype pair, in hidx order: X(suffix, TD, LDD, STD, TS, LDS) */
#define ACC_PAIRS(X)                                                                               \
    X(fp32_fp32, float, LD_FP32, ST_FP32, float, LD_FP32)                                          \
    X(fp32_bf16, float, LD_FP32, ST_FP32, uint16_t, LD_BF16)                                       \
    X(fp32_fp16, float, LD_FP32, ST_FP32, uint16_t, LD_FP16)                                       \
    X(bf16_fp32, uint16_t, LD_BF16, ST_BF16, float, LD_FP32)                                       \
    X(bf16_bf16, uint16_t, LD_BF16, ST_BF16, uint16_t, LD_BF16)                                    \
    X(bf16_fp16, uint16_t, LD_BF16, ST_BF16, uint16_t, LD_FP16)                                    \
    X(fp16_fp32, uint16_t, LD_FP16, ST_FP16, float, LD_FP32)                                       \
    X(fp16_bf16, uint16_t, LD_FP16, ST_FP16, uint16_t, LD_BF16)                                    \
    X(fp16_fp16, uint16_t, LD_FP16, ST_FP16, uint16_t, LD_FP16)
#define ACC_ONE(SUF, TD, LDD, STD, TS, LDS) ACC_LOOP(acc_##SUF, TD, LDD, STD, TS, LDS)
ACC_PAIRS(ACC_ONE)

/* ACC_LOOP, returning the sum of squares of the stored results in SUMSQ_LOOP's order and types */
#define ACC_SUMSQ_LOOP(NAME, TD, LDD, STD, TS, LDS)                                                \
    static double NAME(void *dv, const void *sv, size_t n)                                         \
    {                                                                                              \
        TD *d = dv;                                                                                \
        const TS *x = sv;                                                                          \
        double acc = 0.0;                                                                          \
        for (size_t i = 0; i < n; i++) {                                                           \
            TD v = STD(LDD(d[i]) + LDS(x[i]));                                                     \
            d[i] = v;                                                                              \
            double y = (double)LDD(v);                                                             \
            acc += y * y;                                                                          \
        }                                                                                          \
        return acc;                                                                                \
    }
#define ACC_SUMSQ_ONE(SUF, TD, LDD, STD, TS, LDS) ACC_SUMSQ_LOOP(accsq_##SUF, TD, LDD, STD, TS, LDS)
ACC_PAIRS(ACC_SUMSQ_ONE)

/* returns 1 if a non-finite value was seen; multiplies unless inv == 1 */
#define UNSCALE_LOOP(NAME, T, LD, ST)                                                              \
    static int NAME(void *data, size_t n, float inv)                                               \
    {                                                                                              \
        T *restrict d = data;                                                                      \
        int found = 0;                                                                             \
        if (inv == 1.0f) {                                                                         \
            for (size_t i = 0; i < n; i++)                                                         \
                found |= !pcs_is_finite_f32(LD(d[i]));                                             \
        } else {                                                                                   \
            for (size_t i = 0; i < n; i++) {                                                       \
                float x = LD(d[i]);                                                                \
                found |= !pcs_is_finite_f32(x);                                                    \
                d[i] = ST(x * inv);                                                                \
            }                                                                                      \
        }                                                                                          \
        return found;                                                                              \
    }
UNSCALE_LOOP(unscale_fp32, float, LD_FP32, ST_FP32)
UNSCALE_LOOP(unscale_bf16, uint16_t, LD_BF16, ST_BF16)
UNSCALE_LOOP(unscale_fp16, uint16_t, LD_FP16, ST_FP16)

/* front to back in fp64: each square of a widened fp32 value is exact (24-bit mantissas) */
#define SUMSQ_LOOP(NAME, T, LD)                                                                    \
    static double NAME(const void *data, size_t n)                                                 \
    {                                                                                              \
        const T *restrict d = data;                                                                \
        double acc = 0.0;                                                                          \
        for (size_t i = 0; i < n; i++) {                                                           \
            double x = (double)LD(d[i]);                                                           \
            acc += x * x;                                                                          \
        }                                                                                          \
        return acc;                                                                                \
    }
SUMSQ_LOOP(sumsq_fp32, float, LD_FP32)
SUMSQ_LOOP(sumsq_bf16, uint16_t, LD_BF16)
SUMSQ_LOOP(sumsq_fp16, uint16_t, LD_FP16)

/* fp64 destinations: the sum in fp64 of the exactly widened source */
#define LD64_FP32(x) ((double)(x))
#define LD64_BF16(x) ((double)pcs_bf16_to_f32(x))
#define LD64_FP16(x) ((double)pcs_fp16_to_f32(x))
#define LD64_FP64(x) (x)
#define ID64(x)      (x)
ACC_LOOP(acc_fp64_fp32, double, ID64, ID64, float, LD64_FP32)
ACC_LOOP(acc_fp64_bf16, double, ID64, ID64, uint16_t, LD64_BF16)
ACC_LOOP(acc_fp64_fp16, double, ID64, ID64, uint16_t, LD64_FP16)
ACC_LOOP(acc_fp64_fp64, double, ID64, ID64, double, LD64_FP64)
/* an fp64 source into a narrower destination: PyTorch's in-place acc += g with type promotion,
 * the sum in fp64, stored through fp32 as c10 narrows a double */
#define ST64_FP32(x) ((float)(x))
#define ST64_BF16(x) pcs_f32_to_bf16((float)(x))
#define ST64_FP16(x) pcs_f32_to_fp16((float)(x))
ACC_LOOP(acc_fp32_fp64, float, LD64_FP32, ST64_FP32, double, LD64_FP64)
ACC_LOOP(acc_bf16_fp64, uint16_t, LD64_BF16, ST64_BF16, double, LD64_FP64)
ACC_LOOP(acc_fp16_fp64, uint16_t, LD64_FP16, ST64_FP16, double, LD64_FP64)

/* fp64: the check on the value itself, the product in fp64 (ATen's opmath for double) */
static int unscale_fp64(void *data, size_t n, float inv)
{
    double *restrict d = data;
    const double f = (double)inv;
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        found |= !isfinite(d[i]);
        if (inv != 1.0f)
            d[i] = d[i] * f;
    }
    return found;
}

SUMSQ_LOOP(sumsq_fp64, double, LD64_FP64)

/* index of a 16/32-bit float dtype: fp32 0, bf16 1, fp16 2 (fp64 3 where a table has it) */
static int hidx(pcs_dtype_t t)
{
    return t == PCS_DTYPE_FP32 ? 0 : t == PCS_DTYPE_BF16 ? 1 : t == PCS_DTYPE_FP16 ? 2 : 3;
}

// ---- ops ----

static pcs_status_t cpu_cast(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                             pcs_stream_t s)
{
    for (size_t k = 0; k < count; k++)
        PCS_CHECK(
            pcs_cpu_cast_array(dst[k].data, dst[k].dtype, src[k].data, src[k].dtype, src[k].n));
    return PCS_OK;
}

static pcs_status_t cpu_scale(const pcs_tensor_t *t, size_t count, double factor64,
                               pcs_stream_t s)
{
    const float factor = (float)factor64;
    static void (*const loops[3])(void *, size_t, float) = {scale_fp32, scale_bf16, scale_fp16};
    for (size_t k = 0; k < count; k++) {
        if (t[k].dtype == PCS_DTYPE_FP64) {
            double *d = t[k].data, f = factor64;
            for (size_t i = 0; i < t[k].n; i++)
                d[i] = d[i] * f;
        } else {
            loops[hidx(t[k].dtype)](t[k].data, t[k].n, factor);
        }
    }
    return PCS_OK;
}

static pcs_status_t cpu_accumulate(const pcs_tensor_t *dst, const pcs_tensor_t *src, size_t count,
                                   pcs_stream_t s)
{
    static void (*const loops[4][4])(void *, const void *, size_t) = {
        {acc_fp32_fp32, acc_fp32_bf16, acc_fp32_fp16, acc_fp32_fp64},
        {acc_bf16_fp32, acc_bf16_bf16, acc_bf16_fp16, acc_bf16_fp64},
        {acc_fp16_fp32, acc_fp16_bf16, acc_fp16_fp16, acc_fp16_fp64},
        {acc_fp64_fp32, acc_fp64_bf16, acc_fp64_fp16, acc_fp64_fp64},
    };
    for (size_t k = 0; k < count; k++)
        loops[hidx(dst[k].dtype)][hidx(src[k].dtype)](dst[k].data, src[k].data, dst[k].n);
    return PCS_OK;
}

static pcs_status_t cpu_accumulate_sumsq(const pcs_tensor_t *dst, const pcs_tensor_t *src,
                                         float *out, pcs_stream_t s)
{
    static double (*const loops[3][3])(void *, const void *, size_t) = {
        {accsq_fp32_fp32, accsq_fp32_bf16, accsq_fp32_fp16},
        {accsq_bf16_fp32, accsq_bf16_bf16, accsq_bf16_fp16},
        {accsq_fp16_fp32, accsq_fp16_bf16, accsq_fp16_fp16},
    };
    /* (cpu_sum_squares adds each tensor's sum to 0.0 first: exact, the same value) */
    double total = dst->n > 0 ? loops[hidx(dst->dtype)][hidx(src->dtype)](dst->data, src->data,
                                                                           dst->n)
                              : 0.0;
    *out = (float)total;
    return PCS_OK;
}

static pcs_status_t cpu_nonfinite(const pcs_tensor_t *t, size_t count, float *found_inf,
                                  const float *inv_scale, pcs_stream_t s)
{
    static int (*const loops[4])(void *, size_t, float) = {unscale_fp32, unscale_bf16,
                                                           unscale_fp16, unscale_fp64};
    const float inv = *inv_scale;
    int found = 0;
    for (size_t k = 0; k < count; k++)
        if (t[k].n > 0)
            found |= loops[hidx(t[k].dtype)](t[k].data, t[k].n, inv);
    if (found)
        *found_inf = 1.0f;
    return PCS_OK;
}

static pcs_status_t cpu_sum_squares(const pcs_tensor_t *t, size_t count, float *out, pcs_stream_t s)
{
    static double (*const loops[4])(const void *, size_t) = {sumsq_fp32, sumsq_bf16, sumsq_fp16,
                                                             sumsq_fp64};
    double total = 0.0;
    for (size_t k = 0; k < count; k++)
        total += t[k].n > 0 ? loops[hidx(t[k].dtype)](t[k].data, t[k].n) : 0.0;
    *out = (float)total;
    return PCS_OK;
}

static pcs_status_t cpu_adamw(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                              const pcs_tensor_t *exp_avg, const pcs_tensor_t *exp_avg_sq,
                              size_t count, const pcs_adamw_config_t *cfg, int64_t step,
                              pcs_stream_t s)
{
    pcs_adamw_coef_t c;
    pcs_adamw_coef64_t c64;
    pcs_adamw_coef(cfg, step, &c);
    pcs_adamw_coef64(cfg, step, &c64);
    for (size_t k = 0; k < count; k++) {
        if (param[k].dtype == PCS_DTYPE_FP64) {
            double *restrict p = param[k].data, *restrict m = exp_avg[k].data,
                             *restrict v = exp_avg_sq[k].data;
            const double *restrict g = grad[k].data;
            const pcs_adamw_coef64_t cc = c64;
            for (size_t i = 0; i < param[k].n; i++)
                pcs_adamw_elem64(&p[i], g[i], &m[i], &v[i], &cc);
            continue;
        }
        /* restrict: distinct state buffers, so the compiler may vectorize (lane-wise IEEE ops,
         * the same bits as the scalar loop) */
        float *restrict p = param[k].data, *restrict m = exp_avg[k].data,
                        *restrict v = exp_avg_sq[k].data;
        const float *restrict g = grad[k].data;
        const pcs_adamw_coef_t cc = c;
        for (size_t i = 0; i < param[k].n; i++)
            pcs_adamw_elem(&p[i], g[i], &m[i], &v[i], &cc);
    }
    return PCS_OK;
}

static pcs_status_t cpu_sgd(const pcs_tensor_t *param, const pcs_tensor_t *grad,
                            const pcs_tensor_t *buf, size_t count, const pcs_sgd_config_t *cfg,
                            int first_step, pcs_stream_t s)
{
    pcs_sgd_coef_t c;
    pcs_sgd_coef64_t c64;
    pcs_sgd_coef(cfg, first_step, &c);
    pcs_sgd_coef64(cfg, first_step, &c64);
    for (size_t k = 0; k < count; k++) {
        if (param[k].dtype == PCS_DTYPE_FP64) {
            double *restrict p = param[k].data;
            const double *restrict g = grad[k].data;
            double *restrict b = c64.use_momentum ? buf[k].data : NULL;
            const pcs_sgd_coef64_t cc = c64;
            for (size_t i = 0; i < param[k].n; i++)
                pcs_sgd_elem64(&p[i], g[i], b ? &b[i] : NULL, &cc);
            continue;
        }
        float *restrict p = param[k].data;
        const float *restrict g = grad[k].data;
        const pcs_sgd_coef_t cc = c;
        if (cc.use_momentum) {
            float *restrict b = buf[k].data;
            for (size_t i = 0; i < param[k].n; i++)
                pcs_sgd_elem(&p[i], g[i], &b[i], &cc);
        } else {
            for (size_t i = 0; i < param[k].n; i++)
                pcs_sgd_elem(&p[i], g[i], NULL, &cc);
        }
    }
    return PCS_OK;
}

static int cpu_device_count(void)
{
    return 1;
}

static pcs_status_t cpu_set_device(int ordinal)
{
    if (ordinal != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "set_device: cpu backend has only device 0, not %d", ordinal);
    return PCS_OK;
}

/* The host: its name from /proc/cpuinfo is not worth a parse; memory from sysconf. */
static pcs_status_t cpu_device_info(int ordinal, char *name, size_t cap, uint64_t *memory_bytes)
{
    PCS_CHECK(cpu_set_device(ordinal));
    if (name != NULL && cap > 0)
        snprintf(name, cap, "host");
    if (memory_bytes != NULL) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        *memory_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    }
    return PCS_OK;
}

/* Every op completes before returning, so stream order is program order: plain alloc/free. */
static pcs_status_t cpu_alloc_async(size_t bytes, pcs_stream_t s, void **out)
{
    (void)s;
    if (out == NULL)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "alloc_async: NULL out");
    return cpu_alloc(bytes, out);
}

static void cpu_free_async(void *p, pcs_stream_t s)
{
    (void)s;
    cpu_free(p);
}

static const pcs_kernel_ops_t cpu_kernels = {
    .fill = cpu_fill,
    .cast = cpu_cast,
    .scale = cpu_scale,
    .accumulate = cpu_accumulate,
    .nonfinite_check_and_unscale = cpu_nonfinite,
    .sum_squares = cpu_sum_squares,
    .adamw_update = cpu_adamw,
    .sgd_update = cpu_sgd,
    .accumulate_sumsq = cpu_accumulate_sumsq,
};

static const pcs_backend_ops_t cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .sync = cpu_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .kernels = &cpu_kernels,
    .device_count = cpu_device_count,
    .set_device = cpu_set_device,
    .device_info = cpu_device_info,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .alloc_async = cpu_alloc_async,
    .free_async = cpu_free_async,
};

const pcs_backend_ops_t *pcs_backend_cpu(void)
{
    return &cpu_ops;
}
