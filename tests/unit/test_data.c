/* Unit tests of model/data.c: the global sample order of DESIGN.md §5 (W=4, b=2 and W=1, b=8 see
 * identical global batches), determinism of synthetic rows, wrap-around, held-out eval rows, and
 * file data (.safetensors and .npy) read row range by row range, with clear errors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/data.h"
#include "io/npy.h"
#include "pcs/v1/job.pb-c.h"
#include "io/safetensors.h"
#include "test_util.h"

static char *g_dir;

static int setup(void **state)
{
    (void)state;
    g_dir = pcs_test_tmpdir("data");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pcs_test_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static pcs_data_t *synth(int classification, uint64_t seed, uint64_t n, uint32_t in, uint32_t out)
{
    Pcs__V1__DataSpec ds = PCS__V1__DATA_SPEC__INIT;
    Pcs__V1__SyntheticData sd = PCS__V1__SYNTHETIC_DATA__INIT;
    sd.task = classification ? PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_CLASSIFICATION
                             : PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_REGRESSION;
    sd.seed = seed;
    sd.num_samples = n;
    ds.source_case = PCS__V1__DATA_SPEC__SOURCE_SYNTHETIC;
    ds.synthetic = &sd;
    pcs_data_t *d = NULL;
    assert_int_equal(
        pcs_data_open(&ds, in, out, classification ? PCS_LOSS_CROSS_ENTROPY : PCS_LOSS_MSE, &d),
        PCS_OK);
    return d;
}

static void test_batch_start_follows_the_design_formula(void **state)
{
    (void)state;
    /* ((s*M + m)*D + r)*b */
    assert_int_equal(pcs_data_batch_start(3, 1, 4, 2, 1, 5), ((3 * 4 + 1) * 2 + 1) * 5);
    assert_int_equal(pcs_data_batch_start(0, 0, 1, 1, 0, 32), 0);
    assert_int_equal(pcs_data_batch_start(1, 0, 4, 4, 0, 32), 512);
    assert_int_equal(pcs_data_batch_start(1, 3, 4, 4, 3, 32), ((4 + 3) * 4 + 3) * 32);
}

/* W=4 ranks with b=2 and one rank with b=8 read exactly the same global batches, step after
 * step, micro-batch after micro-batch (and across the wrap-around of a 37-sample dataset). */
static void check_decomposition(int classification)
{
    const uint32_t in = 5, out = 3, M = 3;
    pcs_data_t *a = synth(classification, 9, 37, in, out);
    pcs_data_t *b = synth(classification, 9, 37, in, out);
    size_t ysz = classification ? sizeof(int64_t) : out * sizeof(float);
    float x4[8 * 5], x1[8 * 5];
    uint8_t y4[8 * 3 * 4], y1[8 * 3 * 4];
    for (uint64_t s = 0; s < 5; s++)
        for (uint32_t m = 0; m < M; m++) {
            for (uint32_t r = 0; r < 4; r++)
                assert_int_equal(pcs_data_read(a, pcs_data_batch_start(s, m, M, 4, r, 2), 2,
                                               x4 + r * 2 * in, y4 + r * 2 * ysz),
                                 PCS_OK);
            assert_int_equal(pcs_data_read(b, pcs_data_batch_start(s, m, M, 1, 0, 8), 8, x1, y1),
                             PCS_OK);
            assert_memory_equal(x4, x1, sizeof x1);
            assert_memory_equal(y4, y1, 8 * ysz);
        }
    pcs_data_close(a);
    pcs_data_close(b);
}

static void test_w4_b2_and_w1_b8_see_identical_global_batches(void **state)
{
    (void)state;
    check_decomposition(0);
    check_decomposition(1);
}

static void test_synthetic_rows_are_pure_functions_of_seed_and_index(void **state)
{
    (void)state;
    pcs_data_t *a = synth(0, 4, 100, 6, 2), *b = synth(0, 4, 100, 6, 2),
               *c = synth(0, 5, 100, 6, 2);
    float xa[60], xb[60], xc[60], ya[20], yb[20], yc[20];
    /* rows 90..99 read in one call equal rows read one by one, in any order */
    assert_int_equal(pcs_data_read(a, 90, 10, xa, ya), PCS_OK);
    for (int r = 9; r >= 0; r--)
        assert_int_equal(pcs_data_read(b, 90 + (uint64_t)r, 1, xb + r * 6, yb + r * 2), PCS_OK);
    assert_memory_equal(xa, xb, sizeof xa);
    assert_memory_equal(ya, yb, sizeof ya);
    /* another seed, other data */
    assert_int_equal(pcs_data_read(c, 90, 10, xc, yc), PCS_OK);
    assert_memory_not_equal(xa, xc, sizeof xa);
    /* wrap-around: index 100 + i is row i */
    assert_int_equal(pcs_data_read(a, 195, 10, xb, yb), PCS_OK);
    assert_int_equal(pcs_data_read(a, 95, 5, xc, yc), PCS_OK);
    assert_int_equal(pcs_data_read(a, 0, 5, xc + 30, yc + 10), PCS_OK);
    assert_memory_equal(xb, xc, sizeof xb);
    assert_memory_equal(yb, yc, sizeof yb);
    /* inputs look standard normal, targets are tanh(.) + small noise */
    float big[6000], ty[2000];
    assert_int_equal(pcs_data_read(a, 0, 1000, big, ty), PCS_OK);
    double mu = 0, var = 0;
    for (int i = 0; i < 6000; i++)
        mu += big[i] / 6000.0;
    for (int i = 0; i < 6000; i++)
        var += (big[i] - mu) * (big[i] - mu) / 6000.0;
    assert_true(fabs(mu) < 0.1 && fabs(var - 1) < 0.15);
    double ymin = 1, ymax = -1;
    for (int i = 0; i < 2000; i++) {
        ymin = fmin(ymin, ty[i]);
        ymax = fmax(ymax, ty[i]);
    }
    assert_true(ymin > -1.1 && ymax < 1.1 && ymax - ymin > 0.5);
    assert_int_equal(pcs_data_input_dtype(a), PCS_DTYPE_FP32);
    assert_int_equal(pcs_data_num_samples(a), 100);
    /* eval rows are held out: not any training row */
    float ex[6 * 4], ey[8];
    assert_int_equal(pcs_data_read_eval(a, 4, ex, ey), PCS_OK);
    for (int r = 0; r < 100; r++)
        assert_memory_not_equal(ex, big + r * 6, 6 * sizeof(float));
    pcs_data_close(a);
    pcs_data_close(b);
    pcs_data_close(c);
}

static void test_classification_labels_cover_all_classes(void **state)
{
    (void)state;
    pcs_data_t *d = synth(1, 1, 5000, 8, 4);
    static float x[2000 * 8];
    int64_t y[2000];
    int count[4] = {0};
    assert_int_equal(pcs_data_read(d, 0, 2000, x, y), PCS_OK);
    for (int i = 0; i < 2000; i++) {
        assert_true(y[i] >= 0 && y[i] < 4);
        count[y[i]]++;
    }
    for (int k = 0; k < 4; k++)
        assert_true(count[k] > 100);
    pcs_data_close(d);
}

static pcs_status_t open_file(const char *path, const char *inputs, const char *targets,
                              uint32_t in, uint32_t out, pcs_loss_kind_t loss, pcs_data_t **d)
{
    Pcs__V1__DataSpec ds = PCS__V1__DATA_SPEC__INIT;
    Pcs__V1__FileData fd = PCS__V1__FILE_DATA__INIT;
    fd.path = (char *)path;
    fd.inputs = (char *)inputs;
    fd.targets = (char *)targets;
    ds.source_case = PCS__V1__DATA_SPEC__SOURCE_FILE;
    ds.file = &fd;
    return pcs_data_open(&ds, in, out, loss, d);
}

static void test_safetensors_file_rows_with_wrap(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/d.safetensors", g_dir);
    float xf[10 * 3], y[10 * 2];
    uint16_t xb[10 * 3];
    int64_t lab[10];
    for (int i = 0; i < 30; i++)
        xf[i] = (float)i * 0.5f; /* exact in bf16 */
    for (int i = 0; i < 20; i++)
        y[i] = (float)i;
    for (int i = 0; i < 10; i++)
        lab[i] = i % 2;
    for (int i = 0; i < 30; i++) {
        uint32_t u;
        memcpy(&u, &xf[i], 4);
        xb[i] = (uint16_t)(u >> 16);
    }
    uint64_t sx[2] = {10, 3}, sy[2] = {10, 2}, sl[1] = {10};
    pcs_st_entry_t e[3] = {{"x", PCS_DTYPE_BF16, 2, sx, xb},
                           {"y", PCS_DTYPE_FP32, 2, sy, y},
                           {"labels", PCS_DTYPE_INT64, 1, sl, lab}};
    assert_int_equal(pcs_st_write(path, e, 3, NULL, 0), PCS_OK);
    pcs_data_t *d;
    assert_int_equal(open_file(path, "x", "y", 3, 2, PCS_LOSS_MSE, &d), PCS_OK);
    assert_int_equal(pcs_data_num_samples(d), 10);
    assert_int_equal(pcs_data_input_dtype(d), PCS_DTYPE_BF16);
    /* rank 1 of 2, b = 3, step 1, micro 0, M = 1: rows 9, 10 -> 0, 11 -> 1 */
    uint64_t first = pcs_data_batch_start(1, 0, 1, 2, 1, 3);
    assert_int_equal(first, 9);
    float x[12], yy[6];
    assert_int_equal(pcs_data_read(d, first, 3, x, yy), PCS_OK);
    const int rows[3] = {9, 0, 1};
    for (int r = 0; r < 3; r++) {
        for (int j = 0; j < 3; j++)
            assert_true(x[r * 3 + j] == xf[rows[r] * 3 + j]);
        for (int j = 0; j < 2; j++)
            assert_true(yy[r * 2 + j] == y[rows[r] * 2 + j]);
    }
    /* eval = last rows of the file */
    assert_int_equal(pcs_data_read_eval(d, 2, x, yy), PCS_OK);
    assert_true(x[0] == xf[24] && yy[3] == y[19]);
    pcs_data_close(d);
    /* cross-entropy reads int64 labels */
    assert_int_equal(open_file(path, "x", "labels", 3, 2, PCS_LOSS_CROSS_ENTROPY, &d), PCS_OK);
    int64_t l[4];
    assert_int_equal(pcs_data_read(d, 8, 4, x, l), PCS_OK);
    assert_true(l[0] == 0 && l[1] == 1 && l[2] == 0 && l[3] == 1);
    pcs_data_close(d);
    /* errors name the field */
    assert_int_equal(open_file(path, "x", "y", 4, 2, PCS_LOSS_MSE, &d), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "data.file.inputs"));
    assert_int_equal(open_file(path, "x", "y", 3, 3, PCS_LOSS_MSE, &d), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "data.file.targets"));
    assert_int_equal(open_file(path, "x", "y", 3, 2, PCS_LOSS_CROSS_ENTROPY, &d),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "int64"));
    assert_int_equal(open_file(path, "nope", "y", 3, 2, PCS_LOSS_MSE, &d), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "no tensor 'nope'"));
    assert_int_equal(open_file("/nonexistent.safetensors", "x", "y", 3, 2, PCS_LOSS_MSE, &d),
                     PCS_ERR_NOT_FOUND);
    assert_non_null(strstr(pcs_last_error(), "data.file.path"));
}

static void test_npy_file_and_directory_sources(void **state)
{
    (void)state;
    char px[640], py[640], sub[512];
    snprintf(sub, sizeof sub, "%s/npy", g_dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", sub);
    int st;
    free(pcs_test_run(cmd, &st));
    snprintf(px, sizeof px, "%s/inputs.npy", sub);
    snprintf(py, sizeof py, "%s/targets.npy", sub);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t y[4] = {3, 2, 1, 0};
    uint64_t sx[2] = {4, 2}, sy[1] = {4};
    assert_int_equal(pcs_npy_write(px, PCS_DTYPE_FP32, 2, sx, x), PCS_OK);
    assert_int_equal(pcs_npy_write(py, PCS_DTYPE_INT64, 1, sy, y), PCS_OK);
    pcs_data_t *d;
    float xb[6];
    int64_t yb[3];
    /* file form: targets relative to the inputs file */
    assert_int_equal(open_file(px, "", "targets.npy", 2, 4, PCS_LOSS_CROSS_ENTROPY, &d), PCS_OK);
    assert_int_equal(pcs_data_read(d, 3, 3, xb, yb), PCS_OK);
    assert_true(xb[0] == 7 && xb[1] == 8 && xb[2] == 1 && xb[5] == 4);
    assert_true(yb[0] == 0 && yb[1] == 3 && yb[2] == 2);
    pcs_data_close(d);
    /* directory form */
    assert_int_equal(open_file(sub, "inputs", "targets", 2, 4, PCS_LOSS_CROSS_ENTROPY, &d), PCS_OK);
    assert_int_equal(pcs_data_read(d, 1, 1, xb, yb), PCS_OK);
    assert_true(xb[0] == 3 && yb[0] == 2);
    pcs_data_close(d);
    assert_int_equal(open_file(px, "", "", 2, 4, PCS_LOSS_CROSS_ENTROPY, &d), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "data.file.targets"));
    assert_int_equal(open_file(px, "", "targets.npy", 2, 4, PCS_LOSS_MSE, &d), PCS_ERR_INVALID_ARG);
}

static void test_task_must_match_loss(void **state)
{
    (void)state;
    Pcs__V1__DataSpec ds = PCS__V1__DATA_SPEC__INIT;
    Pcs__V1__SyntheticData sd = PCS__V1__SYNTHETIC_DATA__INIT;
    sd.task = PCS__V1__SYNTHETIC_TASK__SYNTHETIC_TASK_CLASSIFICATION;
    ds.source_case = PCS__V1__DATA_SPEC__SOURCE_SYNTHETIC;
    ds.synthetic = &sd;
    pcs_data_t *d = NULL;
    assert_int_equal(pcs_data_open(&ds, 4, 2, PCS_LOSS_MSE, &d), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "data.synthetic.task"));
    assert_null(d);
    /* no data section at all: synthetic defaults matching the loss */
    assert_int_equal(pcs_data_open(NULL, 4, 2, PCS_LOSS_CROSS_ENTROPY, &d), PCS_OK);
    assert_int_equal(pcs_data_num_samples(d), PCS_DATA_DEFAULT_SAMPLES);
    pcs_data_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_start_follows_the_design_formula),
        cmocka_unit_test(test_w4_b2_and_w1_b8_see_identical_global_batches),
        cmocka_unit_test(test_synthetic_rows_are_pure_functions_of_seed_and_index),
        cmocka_unit_test(test_classification_labels_cover_all_classes),
        cmocka_unit_test(test_safetensors_file_rows_with_wrap),
        cmocka_unit_test(test_npy_file_and_directory_sources),
        cmocka_unit_test(test_task_must_match_loss),
    };
    return cmocka_run_group_tests_name("data", tests, setup, teardown);
}
