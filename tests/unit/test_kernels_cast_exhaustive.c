/* Exhaustive cast proof: every one of the 2^32 fp32 bit patterns is converted to bf16 and to fp16
 * by (a) each vector path of the CPU backend this CPU has (AVX-512, AVX2/F16C; the op uses the
 * best) and (b) the scalar pcs/half.h functions, and all must equal a slow reference that rounds
 * with exact double arithmetic (test_kernels_ref.h). Also all 2^16 bf16/fp16 patterns to fp32 and
 * back on every path. Label: exhaustive. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/nn.h"
#include "test_kernels_ref.h"

#define BLOCK    (1u << 16)
#define NTHREADS 2
#define MAXPATHS 3

/* The array paths to prove: the vector paths this CPU has, plus "scalar" (the array loop over
 * pcs/half.h). The 2^32 sweep skips "scalar" there: it calls the very functions the sweep
 * already checks one by one. */
static const char *paths[MAXPATHS];
static int npaths;

static void find_paths(int with_scalar)
{
    static const char *all[] = {"avx512", "avx2+f16c", "scalar"};
    float x = 1.0f;
    uint16_t y;
    npaths = 0;
    for (int i = 0; i < (with_scalar ? 3 : 2); i++)
        if (pcs_cpu_cast_array_path(all[i], &y, PCS_DTYPE_BF16, &x, PCS_DTYPE_FP32, 1) == PCS_OK)
            paths[npaths++] = all[i];
}

typedef struct job {
    uint64_t begin, end; /* fp32 magnitude patterns [begin, end), each tried with both signs */
    const ref_fmt_t *bf, *fp;
    uint64_t bad_path[MAXPATHS]; /* array-path mismatches (bf16 + fp16) per path */
    uint64_t bad_scalar;         /* pcs_f32_to_bf16 / pcs_f32_to_fp16 mismatches */
    int failed;                  /* a call failed (allocation, unsupported) */
    uint32_t first_bad;          /* first failing input, for the message */
    int have_bad;
} job_t;

static void note_bad(job_t *j, uint32_t u)
{
    if (!j->have_bad) {
        j->have_bad = 1;
        j->first_bad = u;
    }
}

/* The reference rounds |x| and ORs the sign in, so it is evaluated once per magnitude and its
 * result reused for +x and -x: all 2^32 inputs are still converted and compared on every path. */
static void *run_range(void *arg)
{
    job_t *j = arg;
    uint32_t *in = malloc(BLOCK * sizeof *in);
    uint16_t *obf = malloc(BLOCK * sizeof *obf), *ofp = malloc(BLOCK * sizeof *ofp);
    uint16_t *rbf = malloc(BLOCK * sizeof *rbf), *rfp = malloc(BLOCK * sizeof *rfp);
    if (!in || !obf || !ofp || !rbf || !rfp) {
        j->failed = 1;
        goto out;
    }
    for (uint64_t b = j->begin; b < j->end; b += BLOCK) {
        for (uint32_t i = 0; i < BLOCK; i++) {
            float x = pcs_bits_f32((uint32_t)(b + i));
            rbf[i] = ref_round(j->bf, x);
            rfp[i] = ref_round(j->fp, x);
        }
        for (uint32_t sign = 0; sign <= 1; sign++) {
            const uint32_t sbit32 = sign << 31;
            const uint16_t sbit16 = (uint16_t)(sign << 15);
            for (uint32_t i = 0; i < BLOCK; i++)
                in[i] = (uint32_t)(b + i) | sbit32;
            for (int p = 0; p < npaths; p++) {
                if (pcs_cpu_cast_array_path(paths[p], obf, PCS_DTYPE_BF16, in, PCS_DTYPE_FP32,
                                            BLOCK) != PCS_OK ||
                    pcs_cpu_cast_array_path(paths[p], ofp, PCS_DTYPE_FP16, in, PCS_DTYPE_FP32,
                                            BLOCK) != PCS_OK) {
                    j->failed = 1;
                    goto out;
                }
                for (uint32_t i = 0; i < BLOCK; i++) {
                    if (obf[i] != (rbf[i] | sbit16) || ofp[i] != (rfp[i] | sbit16)) {
                        j->bad_path[p]++;
                        note_bad(j, in[i]);
                    }
                }
            }
            for (uint32_t i = 0; i < BLOCK; i++) {
                float x = pcs_bits_f32(in[i]);
                if (pcs_f32_to_bf16(x) != (rbf[i] | sbit16) ||
                    pcs_f32_to_fp16(x) != (rfp[i] | sbit16)) {
                    j->bad_scalar++;
                    note_bad(j, in[i]);
                }
            }
        }
    }
out:
    free(in);
    free(obf);
    free(ofp);
    free(rbf);
    free(rfp);
    return NULL;
}

static void test_every_fp32_pattern_rounds_to_bf16_and_fp16_like_the_reference(void **state)
{
    static ref_fmt_t bf, fp;
    ref_bf16(&bf);
    ref_fp16(&fp);
    find_paths(0);
    job_t jobs[NTHREADS];
    pthread_t th[NTHREADS];
    const uint64_t total = (uint64_t)1 << 31, per = total / NTHREADS; /* magnitudes; x2 signs */
    for (int t = 0; t < NTHREADS; t++) {
        memset(&jobs[t], 0, sizeof jobs[t]);
        jobs[t].begin = per * (uint64_t)t;
        jobs[t].end = t == NTHREADS - 1 ? total : per * (uint64_t)(t + 1);
        jobs[t].bf = &bf;
        jobs[t].fp = &fp;
        assert_int_equal(pthread_create(&th[t], NULL, run_range, &jobs[t]), 0);
    }
    uint64_t bad = 0;
    int failed = 0;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        job_t *j = &jobs[t];
        failed |= j->failed;
        for (int p = 0; p < npaths; p++) {
            if (j->bad_path[p])
                print_message("range %d path %s: %llu mismatches\n", t, paths[p],
                              (unsigned long long)j->bad_path[p]);
            bad += j->bad_path[p];
        }
        if (j->bad_scalar)
            print_message("range %d scalar pcs/half.h: %llu mismatches\n", t,
                          (unsigned long long)j->bad_scalar);
        if (j->have_bad)
            print_message("range %d: first mismatching input 0x%08x\n", t, j->first_bad);
        bad += j->bad_scalar;
    }
    for (int p = 0; p < npaths; p++)
        print_message("checked path %s\n", paths[p]);
    assert_false(failed);
    assert_true(bad == 0);
}

/* pcs_nn_host_round to bf16 (the model's in-place rounding step, one pass) equals the two casts
 * through pcs/half.h bit for bit on every fp32 pattern. */
typedef struct round_job {
    uint64_t begin, end, bad;
    uint32_t first_bad;
} round_job_t;

static void *round_range(void *arg)
{
    round_job_t *j = arg;
    float *v = malloc(BLOCK * sizeof *v);
    if (!v) {
        j->bad = 1;
        return NULL;
    }
    for (uint64_t b = j->begin; b < j->end; b += BLOCK) {
        for (uint32_t i = 0; i < BLOCK; i++) {
            uint32_t u = (uint32_t)(b + i);
            memcpy(&v[i], &u, sizeof u);
        }
        pcs_nn_host_round(v, BLOCK, PCS_DTYPE_BF16);
        for (uint32_t i = 0; i < BLOCK; i++) {
            uint32_t u = (uint32_t)(b + i), got, want;
            float f;
            memcpy(&f, &u, sizeof f);
            float w = pcs_bf16_to_f32(pcs_f32_to_bf16(f));
            memcpy(&want, &w, sizeof want);
            memcpy(&got, &v[i], sizeof got);
            if (got != want && !j->bad++)
                j->first_bad = u;
        }
    }
    free(v);
    return NULL;
}

static void test_every_fp32_pattern_rounds_in_place_to_bf16_like_the_two_casts(void **state)
{
    (void)state;
    round_job_t jobs[NTHREADS];
    pthread_t th[NTHREADS];
    const uint64_t total = (uint64_t)1 << 32, per = total / NTHREADS;
    for (int t = 0; t < NTHREADS; t++) {
        memset(&jobs[t], 0, sizeof jobs[t]);
        jobs[t].begin = per * (uint64_t)t;
        jobs[t].end = t == NTHREADS - 1 ? total : per * (uint64_t)(t + 1);
        assert_int_equal(pthread_create(&th[t], NULL, round_range, &jobs[t]), 0);
    }
    uint64_t bad = 0;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        if (jobs[t].bad)
            print_message("range %d: %llu mismatches, first input 0x%08x\n", t,
                          (unsigned long long)jobs[t].bad, jobs[t].first_bad);
        bad += jobs[t].bad;
    }
    assert_true(bad == 0);
}

/* Every 16-bit pattern widens exactly (value by definition; NaN stays NaN with its sign) through
 * both the fast and the scalar path, and narrows back to itself (NaN: to the canonical NaN). */
static void check_all_halfs(pcs_dtype_t dt, const ref_fmt_t *f, uint16_t (*narrow)(float),
                            float (*widen)(uint16_t))
{
    uint16_t *h = malloc(65536 * sizeof *h), *back = malloc(65536 * sizeof *back);
    float *w = malloc(65536 * sizeof *w);
    assert_non_null(h);
    assert_non_null(back);
    assert_non_null(w);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    unsigned bad = 0;
    find_paths(1);
    for (int p = 0; p < npaths; p++) {
        assert_int_equal(pcs_cpu_cast_array_path(paths[p], w, PCS_DTYPE_FP32, h, dt, 65536),
                         PCS_OK);
        assert_int_equal(pcs_cpu_cast_array_path(paths[p], back, dt, w, PCS_DTYPE_FP32, 65536),
                         PCS_OK);
        for (uint32_t i = 0; i < 65536; i++) {
            double ref = ref_decode(f, h[i]);
            float s = widen(h[i]);
            uint32_t wb = pcs_f32_bits(w[i]), sb = pcs_f32_bits(s);
            if (ref != ref) { /* NaN: NaN out, sign kept, identical on both paths */
                int ok = w[i] != w[i] && (wb >> 31) == (uint32_t)(h[i] >> 15) && wb == sb &&
                         back[i] == (uint16_t)((h[i] & 0x8000u) | f->qnan) && narrow(s) == back[i];
                bad += !ok;
            } else {
                int ok = (double)w[i] == ref && wb == sb && back[i] == h[i] && narrow(s) == h[i] &&
                         ((wb >> 31) == (uint32_t)(h[i] >> 15)); /* -0 stays -0 */
                bad += !ok;
                if (!ok && bad < 5)
                    print_message("%s %s 0x%04x: path %a scalar %a ref %a back 0x%04x\n", paths[p],
                                  pcs_dtype_name(dt), h[i], (double)w[i], (double)s, ref, back[i]);
            }
        }
    }
    free(h);
    free(back);
    free(w);
    assert_int_equal(bad, 0);
}

static void test_every_bf16_pattern_widens_exactly_and_round_trips(void **state)
{
    static ref_fmt_t f;
    ref_bf16(&f);
    check_all_halfs(PCS_DTYPE_BF16, &f, pcs_f32_to_bf16, pcs_bf16_to_f32);
}

static void test_every_fp16_pattern_widens_exactly_and_round_trips(void **state)
{
    static ref_fmt_t f;
    ref_fp16(&f);
    check_all_halfs(PCS_DTYPE_FP16, &f, pcs_f32_to_fp16, pcs_fp16_to_f32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_bf16_pattern_widens_exactly_and_round_trips),
        cmocka_unit_test(test_every_fp16_pattern_widens_exactly_and_round_trips),
        cmocka_unit_test(test_every_fp32_pattern_rounds_to_bf16_and_fp16_like_the_reference),
        cmocka_unit_test(test_every_fp32_pattern_rounds_in_place_to_bf16_like_the_two_casts),
    };
    return cmocka_run_group_tests_name("kernels_cast_exhaustive", tests, NULL, NULL);
}
