/* The CPU twin's GELU arithmetic (kernels/src/nn_vmath.h): erf and exp against the correctly
 * rounded value (glibc's double erf/exp, rounded to float) on every third fp32 pattern of the
 * ranges where they are not constant (erf: |x| < 4.5, then +-1; exp: [-104, 89], then 0 / inf)
 * plus every special value: erf <= 1.2 ulp, exp <= 1.1 ulp; the vectorized loops
 * (pcs_nn_host_erf/exp, one clone per ISA level, built with no-trapping-math) bit for bit equal
 * to the plain scalar functions compiled here (NaN signs aside); and
 * GELU forward/backward through pcs_nn_act_fwd/bwd equal to nn_math.h's expressions evaluated
 * with those functions. Label: exhaustive. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_math.h"
#include "nn_vmath.h"
#include "pcs/half.h"
#include "pcs/nn.h"

#define BLOCK    (1u << 16)
#define NTHREADS 2
#define STRIDE   3

/* |got - want| in ulps of the float nearest want (want in double, as exact as libm's double). */
static double ulps(float got, double want)
{
    if (isnan(want))
        return isnan(got) ? 0 : 1e30;
    if (isinf(want) || isinf(got))
        return got == (float)want ? 0 : 1e30;
    float w = (float)want;
    float up = nextafterf(fabsf(w), INFINITY);
    double u = (double)up - (double)fabsf(w);
    return fabs((double)got - want) / u;
}

typedef struct job {
    int fn; /* 0 erf, 1 exp */
    uint32_t lo, hi; /* bit-pattern range [lo, hi) of non-negative or negative floats */
    double worst;
    uint32_t worst_bits;
    uint64_t n, mismatches;
} job_t;

static void *sweep(void *arg)
{
    job_t *j = arg;
    float *x = malloc(BLOCK * sizeof *x), *y = malloc(BLOCK * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (uint64_t b = j->lo; b < j->hi;) {
        uint32_t k = 0;
        for (; k < BLOCK && b < j->hi; k++, b += STRIDE)
            x[k] = pcs_bits_f32((uint32_t)b);
        if (j->fn == 0)
            pcs_nn_host_erf(x, k, y);
        else
            pcs_nn_host_exp(x, k, y);
        for (uint32_t i = 0; i < k; i++) {
            float s = j->fn == 0 ? pcs_vm_erf(x[i]) : pcs_vm_exp(x[i]);
            if (pcs_f32_bits(s) != pcs_f32_bits(y[i]) && !(isnan(s) && isnan(y[i])))
                j->mismatches++;
            double want = j->fn == 0 ? erf((double)x[i]) : exp((double)x[i]);
            double e = ulps(y[i], want);
            if (e > j->worst) {
                j->worst = e;
                j->worst_bits = pcs_f32_bits(x[i]);
            }
            j->n++;
        }
    }
    free(x);
    free(y);
    return NULL;
}

/* Sweep [lo, hi] (floats, same sign) with the threads; returns the worst ulp error. */
static double run(int fn, float lo, float hi, uint64_t *count)
{
    uint32_t a = pcs_f32_bits(lo), z = pcs_f32_bits(hi);
    if (a > z) {
        uint32_t t = a;
        a = z;
        z = t;
    }
    job_t jobs[NTHREADS];
    pthread_t th[NTHREADS];
    uint32_t span = (z - a) / NTHREADS / STRIDE * STRIDE;
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (job_t){fn, a + (uint32_t)t * span, t + 1 == NTHREADS ? z + 1 : a + (t + 1) * span,
                          0, 0, 0, 0};
        assert_int_equal(pthread_create(&th[t], NULL, sweep, &jobs[t]), 0);
    }
    double worst = 0;
    uint32_t wb = 0;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(jobs[t].mismatches, 0); /* vector loop == scalar, bit for bit */
        *count += jobs[t].n;
        if (jobs[t].worst > worst) {
            worst = jobs[t].worst;
            wb = jobs[t].worst_bits;
        }
    }
    fprintf(stderr, "%s [%g, %g]: worst %.3f ulp at %a\n", fn ? "exp" : "erf", lo, hi, worst,
            pcs_bits_f32(wb));
    return worst;
}

static void test_erf_within_1_2_ulp(void **state)
{
    (void)state;
    uint64_t n = 0;
    assert_true(run(0, 0.0f, 4.5f, &n) <= 1.2);
    assert_true(run(0, -0.0f, -4.5f, &n) <= 1.2);
    assert_true(n > 700000000ull);
    /* beyond 4.5 erf is +-1 in float, and the specials */
    static const float ones[] = {4.5f, 5.0f, 10.0f, 1e10f, 3.4e38f, INFINITY};
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++) {
        float y[2], x[2] = {ones[i], -ones[i]};
        pcs_nn_host_erf(x, 2, y);
        assert_true(y[0] == 1.0f && y[1] == -1.0f);
    }
    float x[4] = {0.0f, -0.0f, NAN, 1e-45f}, y[4];
    pcs_nn_host_erf(x, 4, y);
    assert_true(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && signbit(y[1]));
    assert_true(isnan(y[2]));
    assert_true(ulps(y[3], erf(1e-45)) <= 1.0);
}

static void test_exp_within_1_1_ulp(void **state)
{
    (void)state;
    uint64_t n = 0;
    assert_true(run(1, 0.0f, 89.0f, &n) <= 1.1);
    assert_true(run(1, -0.0f, -104.0f, &n) <= 1.1);
    float x[6] = {-105.0f, -1e30f, -INFINITY, 89.0f, INFINITY, NAN}, y[6];
    pcs_nn_host_exp(x, 6, y);
    assert_true(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f);
    assert_true(isinf(y[3]) && isinf(y[4]) && isnan(y[5]));
}

/* GELU through the nn front door = nn_math.h's erf-form expressions with these functions. */
static void test_gelu_loops_are_the_scalar_expressions(void **state)
{
    (void)state;
    pcs_nn_t *nn = NULL;
    assert_int_equal(pcs_nn_create(NULL, NULL, &nn), PCS_OK);
    enum { N = 1000003 };
    float *x = malloc(N * sizeof *x), *dy = malloc(N * sizeof *dy);
    float *y = malloc(N * sizeof *y), *dx = malloc(N * sizeof *dx);
    assert_true(x && dy && y && dx);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 40.0f; /* [-20, 20) */
        dy[i] = (float)(s & 0xffff) / 65536.0f - 0.5f;
    }
    x[0] = NAN;
    x[1] = INFINITY;
    x[2] = -INFINITY;
    x[3] = -0.0f;
    assert_int_equal(pcs_nn_act_fwd(nn, PCS_NN_GELU, y, x, N, PCS_DTYPE_FP32), PCS_OK);
    assert_int_equal(pcs_nn_act_bwd(nn, PCS_NN_GELU, dx, x, y, dy, N), PCS_OK);
    for (size_t i = 0; i < N; i++) {
        float v = x[i];
        float want = 0.5f * v * (1.0f + pcs_vm_erf(v * (float)PCS_NN_SQRT1_2));
        float cdf = 0.5f * (1.0f + pcs_vm_erf(v * (float)PCS_NN_SQRT1_2));
        float pdf = (float)PCS_NN_INV_SQRT_2PI * pcs_vm_exp(-0.5f * v * v);
        float dwant = dy[i] * (cdf + v * pdf);
        /* (a NaN's sign depends on operand order, which the vectorizer may swap) */
        if ((pcs_f32_bits(want) != pcs_f32_bits(y[i]) && !(isnan(want) && isnan(y[i]))) ||
            (pcs_f32_bits(dwant) != pcs_f32_bits(dx[i]) && !(isnan(dwant) && isnan(dx[i]))))
            fail_msg("x = %a: gelu %a / %a, d %a / %a", v, y[i], want, dx[i], dwant);
    }
    free(x);
    free(dy);
    free(y);
    free(dx);
    pcs_nn_destroy(nn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_loops_are_the_scalar_expressions),
        cmocka_unit_test(test_exp_within_1_1_ulp),
        cmocka_unit_test(test_erf_within_1_2_ulp),
    };
    return cmocka_run_group_tests_name("nn_vmath", tests, NULL, NULL);
}
