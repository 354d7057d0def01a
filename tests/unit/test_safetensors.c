/* Unit tests of io/safetensors.c and io/npy.c: round trips of every dtype, the exact
 * header the writer produces, files written the way the reference (Rust) writer lays them out,
 * a catalogue of malformed files that must be rejected with a clear message, and a replay driver
 * that runs the fuzz target (tests/fuzz/fuzz_safetensors.c) over deterministic mutations. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/init.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *g_dir;

static int setup(void **state)
{
    (void)state;
    g_dir = pcs_test_tmpdir("st");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pcs_test_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* A file image: 8-byte little-endian header length, header, data. */
static uint8_t *image(const char *header, const void *data, size_t dlen, size_t *len)
{
    size_t h = strlen(header);
    uint8_t *b = malloc(8 + h + dlen + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    if (dlen)
        memcpy(b + 8 + h, data, dlen);
    *len = 8 + h + dlen;
    return b;
}

static pcs_status_t open_image(const char *header, const void *data, size_t dlen, pcs_st_file_t **f)
{
    size_t len;
    uint8_t *b = image(header, data, dlen, &len);
    pcs_status_t rc = pcs_st_open_mem(b, len, f);
    free(b);
    return rc;
}

/* Issue 12: a spec may name any readable file; the failure reason, which any viewer reads, must
 * not carry its bytes (the header length of "SECRET42..." was printed as 3617609057394967891). */
static void test_errors_on_a_foreign_file_carry_none_of_its_bytes(void **state)
{
    (void)state;
    const char *path = tmp_path("secret.txt");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("SECRET42 is the password of the day\n", f);
    fclose(f);
    pcs_st_file_t *st = NULL;
    assert_int_equal(pcs_st_open(path, &st), PCS_ERR_INVALID_ARG);
    const char *err = pcs_last_error();
    assert_non_null(strstr(err, "not a safetensors file"));
    assert_null(strstr(err, "SECRET"));
    assert_null(strstr(err, "3617609057394967891"));
    assert_null(strstr(err, "password"));
}

static void test_round_trip_every_dtype(void **state)
{
    (void)state;
    float f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e-3f};
    uint16_t bf[3] = {0x3f80, 0xc000, 0x7f80}; /* 1, -2, +inf */
    uint16_t hf[2] = {0x3c00, 0x0001};         /* 1, smallest subnormal */
    double f64[2] = {M_PI, -1e300};
    int64_t i64 = 42;
    uint64_t s23[2] = {2, 3}, s3[1] = {3}, s2[1] = {2};
    pcs_st_entry_t e[] = {
        {"w", PCS_DTYPE_FP32, 2, s23, f32},    {"layers.0.b\"q", PCS_DTYPE_BF16, 1, s3, bf},
        {"h", PCS_DTYPE_FP16, 1, s2, hf},      {"d", PCS_DTYPE_FP64, 1, s2, f64},
        {"n", PCS_DTYPE_INT64, 0, NULL, &i64},
    };
    const char *meta[] = {"format", "pt", "note", "line\nbreak"};
    const char *path = tmp_path("rt.safetensors");
    assert_int_equal(pcs_st_write(path, e, 5, meta, 2), PCS_OK);
    size_t len;
    char *raw = pcs_test_read_file(path, &len);
    assert_non_null(raw);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (uint8_t)raw[i];
    assert_int_equal(hl % 8, 0); /* padded like the reference writer */
    assert_true(raw[8] == '{');
    assert_int_equal(len, 8 + hl + 24 + 6 + 4 + 16 + 8);
    free(raw);

    pcs_st_file_t *f;
    assert_int_equal(pcs_st_open(path, &f), PCS_OK);
    assert_int_equal(pcs_st_count(f), 5);
    assert_string_equal(pcs_st_metadata(f, "format"), "pt");
    assert_string_equal(pcs_st_metadata(f, "note"), "line\nbreak");
    assert_null(pcs_st_metadata(f, "absent"));
    const pcs_st_tensor_t *t = pcs_st_find(f, "w");
    assert_int_equal(t->dtype, PCS_DTYPE_FP32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    float back[6];
    assert_int_equal(pcs_st_read_f32(f, t, 0, 6, back), PCS_OK);
    assert_memory_equal(back, f32, sizeof f32);
    assert_int_equal(pcs_st_read_f32(f, t, 4, 2, back), PCS_OK);
    assert_true(back[0] == -0.125f && back[1] == 1e-3f);
    assert_int_equal(pcs_st_read_f32(f, t, 5, 2, back), PCS_ERR_INVALID_ARG);
    t = pcs_st_find(f, "layers.0.b\"q");
    assert_non_null(t);
    assert_string_equal(t->dtype_str, "BF16");
    assert_int_equal(pcs_st_read_f32(f, t, 0, 3, back), PCS_OK);
    assert_true(back[0] == 1.0f && back[1] == -2.0f && isinf(back[2]));
    t = pcs_st_find(f, "h");
    assert_int_equal(pcs_st_read_f32(f, t, 0, 2, back), PCS_OK);
    assert_true(back[0] == 1.0f && back[1] == ldexpf(1.0f, -24));
    t = pcs_st_find(f, "d");
    double dd[2];
    assert_int_equal(pcs_st_read_raw(f, t, 0, 16, dd), PCS_OK);
    assert_memory_equal(dd, f64, sizeof f64);
    t = pcs_st_find(f, "n");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    int64_t n;
    assert_int_equal(pcs_st_read_raw(f, t, 0, 8, &n), PCS_OK);
    assert_int_equal(n, 42);
    assert_int_equal(pcs_st_read_f32(f, t, 0, 1, back), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "I64"));
    pcs_st_close(f);
}

/* The exact bytes the writer emits for a small file: a compact JSON object, metadata first,
 * offsets in order, space padding to 8 bytes. */
static void test_writer_header_is_compact_json(void **state)
{
    (void)state;
    float v[2] = {1, 2};
    uint64_t s[1] = {2};
    pcs_st_entry_t e = {"a.b", PCS_DTYPE_FP32, 1, s, v};
    const char *meta[] = {"format", "pt"};
    const char *path = tmp_path("hdr.safetensors");
    assert_int_equal(pcs_st_write(path, &e, 1, meta, 1), PCS_OK);
    size_t len;
    char *raw = pcs_test_read_file(path, &len);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"a.b\":{\"dtype\":\"F32\",\"shape\":"
                       "[2],\"data_offsets\":[0,8]}}";
    size_t wl = strlen(want), padded = (wl + 7) / 8 * 8;
    assert_int_equal(len, 8 + padded + 8);
    assert_int_equal((uint8_t)raw[0], padded);
    assert_memory_equal(raw + 8, want, wl);
    for (size_t i = wl; i < padded; i++)
        assert_int_equal(raw[8 + i], ' ');
    free(raw);
}

/* A header laid out the way the Rust writer does it (metadata last, I32 dtype pcs does not
 * compute in, no padding) still validates and reads. */
static void test_reads_reference_layout_and_other_dtypes(void **state)
{
    (void)state;
    int32_t d[4] = {1, 2, 3, 4};
    uint8_t u[2] = {7, 9};
    char data[18];
    memcpy(data, d, 16);
    memcpy(data + 16, u, 2);
    pcs_st_file_t *f;
    assert_int_equal(open_image("{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,"
                                "16]},\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[16,"
                                "18]},\"__metadata__\":{\"foo\":\"bar\"}}",
                                data, 18, &f),
                     PCS_OK);
    const pcs_st_tensor_t *t = pcs_st_find(f, "test");
    assert_int_equal(t->dtype, PCS_DTYPE_NONE);
    assert_string_equal(t->dtype_str, "I32");
    int32_t back[4];
    assert_int_equal(pcs_st_read_raw(f, t, 0, 16, back), PCS_OK);
    assert_memory_equal(back, d, 16);
    assert_int_equal(pcs_st_read_raw(f, t, 8, 16, back), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_st_metadata(f, "foo"), "bar");
    pcs_st_close(f);
    /* an empty file with only metadata, and one with nothing at all */
    assert_int_equal(open_image("{\"__metadata__\":{}}", NULL, 0, &f), PCS_OK);
    assert_int_equal(pcs_st_count(f), 0);
    pcs_st_close(f);
    assert_int_equal(open_image("{}", NULL, 0, &f), PCS_OK);
    pcs_st_close(f);
}

static void expect_bad(const char *header, size_t dlen, const char *needle)
{
    char data[64] = {0};
    pcs_st_file_t *f = (pcs_st_file_t *)0x1;
    pcs_status_t rc = open_image(header, data, dlen, &f);
    if (rc != PCS_ERR_INVALID_ARG)
        print_error("header accepted or wrong status %d: %s\n", rc, header);
    assert_int_equal(rc, PCS_ERR_INVALID_ARG);
    assert_null(f);
    if (needle && !strstr(pcs_last_error(), needle))
        print_error("'%s' not in '%s'\n", needle, pcs_last_error());
    if (needle)
        assert_non_null(strstr(pcs_last_error(), needle));
}

#define T4(name, b, e)                                                                             \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" #b "," #e "]}"

static void test_malformed_headers_are_rejected_with_a_reason(void **state)
{
    (void)state;
    expect_bad("[1,2]", 0, "start with '{'");
    expect_bad(" {}", 0, "start with '{'");
    expect_bad("{\"a\":", 0, "not valid JSON");
    expect_bad("{" T4("a", 0, 4), 4, "not valid JSON");
    expect_bad("{a: {dtype: F32, shape: [1], data_offsets: [0, 4]}}", 4, "keys must be strings");
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "unknown dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
               "do not hold");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "non-negative integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
               "non-negative integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4,
               "non-negative integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
               "non-negative integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
               "do not hold");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               "more than 2");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "needs dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
               "unexpected");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, "repeated");
    expect_bad("{\"a\":[]}", 0, "must be an object");
    /* layout: overlap, gap, uncovered bytes, out of range, duplicate names */
    expect_bad("{" T4("a", 0, 4) "," T4("b", 0, 4) "}", 4, "contiguous");
    expect_bad("{" T4("a", 0, 4) "," T4("b", 8, 12) "}", 12, "contiguous");
    expect_bad("{" T4("a", 0, 4) "}", 8, "data section has 8");
    expect_bad("{" T4("a", 0, 4) "}", 0, "data section has 0");
    expect_bad("{" T4("a", 0, 4) "," T4("a", 4, 8) "}", 8, "duplicate");
    expect_bad("{}", 4, "no tensors");
    /* metadata must map strings to strings */
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "values must be strings");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "repeated");
    /* YAML features that JSON does not have */
    expect_bad("{\"a\": &x {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "anchors");
    expect_bad("{\"a\":!!map {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "anchors");
    expect_bad("{\"__metadata__\":{\"k\":'v'}}", 0, "values must be strings");
    expect_bad("{}\n--- {}", 0, NULL);
}

static void test_truncated_and_oversized_files_are_rejected(void **state)
{
    (void)state;
    pcs_st_file_t *f = NULL;
    uint8_t b[16] = {0};
    assert_int_equal(pcs_st_open_mem(b, 7, &f), PCS_ERR_INVALID_ARG);
    b[0] = 100; /* header of 100 bytes in a 16-byte file */
    assert_int_equal(pcs_st_open_mem(b, 16, &f), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "does not fit"));
    memset(b, 0xff, 8); /* 2^64-1 */
    assert_int_equal(pcs_st_open_mem(b, 16, &f), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_st_open_mem(NULL, 5, &f), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_st_open(tmp_path("missing.safetensors"), &f), PCS_ERR_NOT_FOUND);
    assert_non_null(strstr(pcs_last_error(), "missing.safetensors"));
    assert_int_equal(pcs_st_open(g_dir, &f), PCS_ERR_INVALID_ARG);
    /* a header containing NUL */
    const char hdr[] = "{\"a\":{}}";
    uint8_t img[8 + sizeof hdr] = {sizeof hdr};
    memcpy(img + 8, hdr, sizeof hdr); /* includes the terminating NUL inside the header */
    assert_int_equal(pcs_st_open_mem(img, sizeof img, &f), PCS_ERR_INVALID_ARG);
    /* the writer refuses bad entries */
    uint64_t s[1] = {1};
    float v = 0;
    pcs_st_entry_t e[2] = {{"x", PCS_DTYPE_FP32, 1, s, &v}, {"x", PCS_DTYPE_FP32, 1, s, &v}};
    assert_int_equal(pcs_st_write(tmp_path("dup.safetensors"), e, 2, NULL, 0), PCS_ERR_INVALID_ARG);
    e[0].dtype = PCS_DTYPE_NONE;
    assert_int_equal(pcs_st_write(tmp_path("bad.safetensors"), e, 1, NULL, 0), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_st_write("/nonexistent/dir/x.safetensors", e + 1, 1, NULL, 0),
                     PCS_ERR_SYSTEM);
}

/* init.from: names, shapes and dtypes are checked and the message names the tensor. */
static void test_init_from_file_checks_names_shapes_dtypes(void **state)
{
    (void)state;
    float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
    uint64_t sw[2] = {2, 3}, sb[1] = {2}, sw_bad[2] = {3, 2};
    pcs_named_tensor_t t[2] = {{"l.weight", PCS_DTYPE_FP32, 2, {2, 3}, 6, 0},
                               {"l.bias", PCS_DTYPE_FP32, 1, {2}, 2, 0}};
    float dw[6], db[2];
    float *dst[2] = {dw, db};
    const char *p = tmp_path("init.safetensors");
    pcs_st_entry_t e[3] = {{"l.weight", PCS_DTYPE_FP32, 2, sw, w},
                           {"l.bias", PCS_DTYPE_FP32, 1, sb, b},
                           {"extra", PCS_DTYPE_FP32, 1, sb, b}};
    assert_int_equal(pcs_st_write(p, e, 2, NULL, 0), PCS_OK);
    int loaded[2];
    assert_int_equal(pcs_init_from_safetensors(p, t, 2, dst, loaded), PCS_OK);
    assert_memory_equal(dw, w, sizeof w);
    assert_memory_equal(db, b, sizeof b);
    assert_true(loaded[0] && loaded[1]);
    e[0].shape = sw_bad;
    assert_int_equal(pcs_st_write(p, e, 2, NULL, 0), PCS_OK);
    assert_int_equal(pcs_init_from_safetensors(p, t, 2, dst, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "l.weight: shape [3, 2] in file, model has [2, 3]"));
    e[0].shape = sw;
    uint16_t wb[6] = {0};
    e[0].dtype = PCS_DTYPE_BF16;
    e[0].data = wb;
    assert_int_equal(pcs_st_write(p, e, 2, NULL, 0), PCS_OK);
    assert_int_equal(pcs_init_from_safetensors(p, t, 2, dst, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "l.weight: dtype BF16 in file, model has F32"));
    e[0].dtype = PCS_DTYPE_FP32;
    e[0].data = w;
    assert_int_equal(pcs_st_write(p, e + 1, 1, NULL, 0), PCS_OK);
    assert_int_equal(pcs_init_from_safetensors(p, t, 2, dst, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "missing tensor 'l.weight'"));
    assert_int_equal(pcs_st_write(p, e, 3, NULL, 0), PCS_OK);
    assert_int_equal(pcs_init_from_safetensors(p, t, 2, dst, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "unexpected tensor 'extra'"));
}

static void test_npy_round_trip_and_bad_headers(void **state)
{
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t y[3] = {0, 2, 1};
    uint64_t sx[2] = {3, 2}, sy[1] = {3};
    const char *px = tmp_path("x.npy"), *py = tmp_path("y.npy");
    assert_int_equal(pcs_npy_write(px, PCS_DTYPE_FP32, 2, sx, x), PCS_OK);
    assert_int_equal(pcs_npy_write(py, PCS_DTYPE_INT64, 1, sy, y), PCS_OK);
    size_t len;
    char *raw = pcs_test_read_file(px, &len);
    assert_int_equal((len - 24) % 64, 0); /* header padded to 64 bytes as NumPy does */
    assert_non_null(strstr(raw + 10, "'shape': (3, 2), }"));
    free(raw);
    pcs_npy_t *a;
    assert_int_equal(pcs_npy_open(px, &a), PCS_OK);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 3);
    float back[6];
    assert_int_equal(pcs_npy_read_f32(a, 2, 4, back), PCS_OK);
    assert_memory_equal(back, x + 2, 4 * sizeof(float));
    assert_int_equal(pcs_npy_read_f32(a, 4, 4, back), PCS_ERR_INVALID_ARG);
    pcs_npy_close(a);
    assert_int_equal(pcs_npy_open(py, &a), PCS_OK);
    int64_t yb[3];
    assert_int_equal(pcs_npy_read_i64(a, 0, 3, yb), PCS_OK);
    assert_memory_equal(yb, y, sizeof y);
    assert_int_equal(pcs_npy_read_f32(a, 0, 1, back), PCS_ERR_INVALID_ARG);
    pcs_npy_close(a);

    /* headers NumPy writes in other forms, and bad ones */
    struct {
        const char *dict;
        pcs_status_t want;
    } cases[] = {
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", PCS_OK},
        {"{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2, 2)}", PCS_OK},
        {"{'descr': '<i4', 'fortran_order': False, 'shape': (), }", PCS_OK},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", PCS_ERR_INVALID_ARG},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'shape': (2,), }", PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999,), }",
         PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", PCS_ERR_INVALID_ARG},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", PCS_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t buf[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
        size_t dl = strlen(cases[i].dict);
        buf[8] = (uint8_t)dl;
        memcpy(buf + 10, cases[i].dict, dl);
        pcs_npy_t h;
        pcs_status_t rc = pcs_npy_parse(buf, 10 + dl, 10 + dl + 32, &h);
        if (rc != cases[i].want)
            print_error("case %zu: %s -> %d (%s)\n", i, cases[i].dict, rc, pcs_last_error());
        assert_int_equal(rc, cases[i].want);
    }
    uint8_t bad[16] = "\x93NUMPX";
    pcs_npy_t h;
    assert_int_equal(pcs_npy_parse(bad, 16, 16, &h), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_npy_open(tmp_path("none.npy"), &a), PCS_ERR_NOT_FOUND);
}

/* Replay driver for the fuzz target: a valid safetensors image and a valid .npy image, each
 * mutated 6000 times (bit flips, byte overwrites with interesting values, truncation, header
 * length edits). Every call must return without crashing; ASan/UBSan CI runs make this a real
 * memory-safety check. */
static void test_fuzz_target_replays_mutations(void **state)
{
    (void)state;
    float v[4] = {1, 2, 3, 4};
    uint16_t h[3] = {1, 2, 3};
    int64_t c = 5;
    uint64_t s4[1] = {4}, s3[1] = {3};
    pcs_st_entry_t e[3] = {{"layers.0.linear.weight", PCS_DTYPE_FP32, 1, s4, v},
                           {"b", PCS_DTYPE_BF16, 1, s3, h},
                           {"n", PCS_DTYPE_INT64, 0, NULL, &c}};
    const char *meta[] = {"format", "pt"};
    const char *p = tmp_path("seed.safetensors");
    assert_int_equal(pcs_st_write(p, e, 3, meta, 1), PCS_OK);
    size_t slen, nlen;
    uint8_t *seed = (uint8_t *)pcs_test_read_file(p, &slen);
    uint64_t sx[2] = {2, 2};
    const char *pn = tmp_path("seed.npy");
    assert_int_equal(pcs_npy_write(pn, PCS_DTYPE_FP32, 2, sx, v), PCS_OK);
    uint8_t *nseed = (uint8_t *)pcs_test_read_file(pn, &nlen);
    assert_int_equal(LLVMFuzzerTestOneInput(seed, slen), 0);
    pcs_st_file_t *f;
    assert_int_equal(pcs_st_open_mem(seed, slen, &f), PCS_OK); /* the seed itself is valid */
    pcs_st_close(f);
    static const uint8_t interesting[] = {0,   1,   0x7f, 0x80, 0xff, '{', '}', '"', ',', ':',
                                          '[', ']', '0',  '9',  '-',  ' ', '&', '*', '!', '\\'};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    for (int it = 0; it < 12000; it++) {
        const uint8_t *src = it % 2 ? nseed : seed;
        size_t len = it % 2 ? nlen : slen;
        uint8_t *buf = malloc(len + 1);
        memcpy(buf, src, len);
        int muts = 1 + (int)(pcs_rng_u64(rng, (uint64_t)it) % 4);
        for (int k = 0; k < muts; k++) {
            uint64_t r = pcs_rng_u64(rng, (uint64_t)it * 8 + (uint64_t)k + 1000000);
            size_t pos = (size_t)(r % len);
            switch ((r >> 32) % 5) {
            case 0:
                buf[pos] ^= (uint8_t)(1u << ((r >> 40) % 8));
                break;
            case 1:
                buf[pos] = interesting[(r >> 40) % sizeof interesting];
                break;
            case 2:
                len = pos; /* truncate */
                break;
            case 3:
                buf[(r >> 40) % 8] = (uint8_t)(r >> 48); /* header length */
                break;
            default:
                if (pos + 1 < len)
                    memmove(buf + pos, buf + pos + 1, len - pos - 1);
                break;
            }
            if (len == 0)
                break;
        }
        assert_int_equal(LLVMFuzzerTestOneInput(buf, len), 0);
        if (!(it % 2) && pcs_st_open_mem(buf, len, &f) == PCS_OK) {
            accepted++;
            pcs_st_close(f);
        }
        free(buf);
    }
    /* most mutations must be rejected, but the driver must also reach the accept path */
    assert_true(accepted > 0 && accepted < 6000);
    free(seed);
    free(nseed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors_on_a_foreign_file_carry_none_of_its_bytes),
        cmocka_unit_test(test_round_trip_every_dtype),
        cmocka_unit_test(test_writer_header_is_compact_json),
        cmocka_unit_test(test_reads_reference_layout_and_other_dtypes),
        cmocka_unit_test(test_malformed_headers_are_rejected_with_a_reason),
        cmocka_unit_test(test_truncated_and_oversized_files_are_rejected),
        cmocka_unit_test(test_init_from_file_checks_names_shapes_dtypes),
        cmocka_unit_test(test_npy_round_trip_and_bad_headers),
        cmocka_unit_test(test_fuzz_target_replays_mutations),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup, teardown);
}
