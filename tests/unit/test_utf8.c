/* Unit tests of the UTF-8 checks: the byte validator (common/utf8.c) against an independent
 * decoder written from the RFC 3629 definition (decode, then range-check the code point), the
 * character-boundary cuts, and the descriptor walk over decoded requests (common/rpc_utf8.c)
 * naming the field path through nested, repeated and oneof fields. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "pcs/rpc.h"
#include "pcs/utf8.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/worker.pb-c.h"

// ---- reference: decode by the bit layout, then judge the code point (not the byte table) ----

static size_t ref_check(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned b = s[i];
        size_t n;
        uint32_t cp, min;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xe0) == 0xc0) {
            n = 2, cp = b & 0x1f, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
            n = 3, cp = b & 0x0f, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
            n = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (len - i < n)
            return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += n;
    }
    return len;
}

static void test_valid_multibyte_text_is_accepted(void **state)
{
    (void)state;
    const char *ok[] = {"",
                        "plain ascii",
                        "caf\xc3\xa9",
                        "\xe2\x82\xac 5", /* é, € */
                        "\xf0\x9f\x98\x80 smile",
                        "\xef\xbf\xbf",     /* U+FFFF */
                        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
                        "\xed\x9f\xbf",
                        "\xee\x80\x80",
                        "\xc2\x80",
                        "\xdf\xbf"}; /* edges */
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_int_equal(pcs_utf8_check(ok[i], strlen(ok[i])), strlen(ok[i]));
        assert_true(pcs_utf8_valid(ok[i], strlen(ok[i])));
    }
}

static void test_invalid_sequences_report_the_offset_of_the_bad_byte(void **state)
{
    (void)state;
    struct {
        const char *s;
        size_t bad;
    } cases[] = {
        {"ab\xc0\xafz", 2},        /* overlong '/' (2 bytes) */
        {"\xc1\xbf", 0},           /* overlong 2-byte lead */
        {"x\xe0\x80\xaf", 1},      /* overlong 3-byte */
        {"xy\xf0\x80\x80\xaf", 2}, /* overlong 4-byte */
        {"s\xed\xa0\x80", 1},      /* U+D800 high surrogate */
        {"s\xed\xbf\xbf", 1},      /* U+DFFF low surrogate */
        {"\xf4\x90\x80\x80", 0},   /* U+110000 */
        {"\xf5\x80\x80\x80", 0},   /* lead beyond U+10FFFF */
        {"\xff", 0},               /* never valid */
        {"abc\x80", 3},            /* stray continuation */
        {"job \xe2\x82", 4},       /* truncated 3-byte sequence at the end */
        {"\xe2\x82x", 0},          /* truncated, followed by ASCII */
        {"caf\xc3\xa9\xc3", 5},    /* valid é then a cut one */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = strlen(cases[i].s);
        assert_int_equal(pcs_utf8_check(cases[i].s, len), cases[i].bad);
        assert_int_equal(ref_check((const unsigned char *)cases[i].s, len), cases[i].bad);
        assert_false(pcs_utf8_valid(cases[i].s, len));
    }
}

/* Every 1..3 byte string and a pseudo-random sample of 4..6 byte strings: same verdict and
 * offset as the reference decoder. */
static void test_validator_agrees_with_reference_decoder_exhaustively(void **state)
{
    (void)state;
    unsigned char b[6];
    for (uint32_t v = 0; v < (1u << 24); v += 1) {
        b[0] = (unsigned char)(v >> 16), b[1] = (unsigned char)(v >> 8), b[2] = (unsigned char)v;
        for (size_t len = 1; len <= 3; len++)
            if (len == 3 || (v & ((1u << (8 * (3 - len))) - 1)) == 0) /* shorter: once each */
                assert_int_equal(pcs_utf8_check((const char *)b, len), ref_check(b, len));
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 2000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        for (int k = 0; k < 6; k++) /* bias towards the interesting lead and continuation bytes */
            b[k] = (unsigned char)((x >> (8 * k)) & 1 ? 0x80 | ((x >> (8 * k + 1)) & 0x7f)
                                                      : (x >> (8 * k)));
        size_t len = 4 + (size_t)(x >> 62) % 3;
        assert_int_equal(pcs_utf8_check((const char *)b, len), ref_check(b, len));
    }
}

static void test_prefix_never_cuts_a_character(void **state)
{
    (void)state;
    const char *s = "ab\xe2\x82\xac\xf0\x9f\x98\x80z"; /* a b € 😀 z: 10 bytes */
    assert_int_equal(pcs_utf8_prefix(s, 100), 10);
    assert_int_equal(pcs_utf8_prefix(s, 10), 10);
    assert_int_equal(pcs_utf8_prefix(s, 2), 2);
    assert_int_equal(pcs_utf8_prefix(s, 3), 2); /* inside € */
    assert_int_equal(pcs_utf8_prefix(s, 4), 2);
    assert_int_equal(pcs_utf8_prefix(s, 5), 5);
    assert_int_equal(pcs_utf8_prefix(s, 8), 5); /* inside 😀 */
    assert_int_equal(pcs_utf8_prefix(s, 9), 9);
    assert_int_equal(pcs_utf8_prefix(s, 0), 0);
    assert_int_equal(pcs_utf8_prefix(NULL, 5), 0);
    for (int max = 0; max <= 10; max++) { /* the printed prefix is always valid */
        char out[16];
        int p = pcs_utf8_prefix(s, max);
        assert_true(p <= max);
        snprintf(out, sizeof out, "%.*s", p, s);
        assert_true(pcs_utf8_valid(out, strlen(out)));
    }
}

static void test_trim_partial_drops_only_an_incomplete_tail(void **state)
{
    (void)state;
    char buf[32];
    const char *full = "x\xe2\x82\xac\xf0\x9f\x98\x80"; /* x € 😀 */
    for (size_t n = 0; n <= strlen(full); n++) {
        memcpy(buf, full, n);
        buf[n] = '\0';
        size_t len = pcs_utf8_trim_partial(buf);
        size_t want = n >= 8 ? 8 : n >= 4 ? 4 : n >= 1 ? 1 : 0;
        assert_int_equal(len, want);
        assert_int_equal(strlen(buf), want);
        assert_true(pcs_utf8_valid(buf, len));
    }
    /* a truncating snprintf of user text, as the server's fixed buffers do */
    char small[6];
    const char *euros = "\xe2\x82\xac\xe2\x82\xac";
    volatile size_t cap = sizeof small; /* not constant: the truncation is the point */
    snprintf(small, cap, "ab%s", euros);
    assert_int_equal(pcs_utf8_trim_partial(small), 5);
    assert_string_equal(small, "ab\xe2\x82\xac");
}

static void test_sanitize_replaces_only_the_bad_bytes(void **state)
{
    (void)state;
    char s[] = "ok caf\xc3\xa9 \xff\xfe x\xed\xa0\x80 \xe2\x82\xac \xe2\x82";
    assert_int_equal(pcs_utf8_sanitize(s), 7);
    assert_string_equal(s, "ok caf\xc3\xa9 ?? x??? \xe2\x82\xac ??");
    assert_true(pcs_utf8_valid(s, strlen(s)));
    char t[] = "already fine \xe6\x97\xa5";
    assert_int_equal(pcs_utf8_sanitize(t), 0);
    assert_string_equal(t, "already fine \xe6\x97\xa5");
}

// ---- descriptor walk over decoded messages ----

/* pcs_set_error may take its own last error as an argument: "prefix: %s" around the cause (it
 * used to format the buffer into itself: "init.from: init.from:  init.safetensors: No such
 * file"). A long result is cut at a character boundary. */
static void test_set_error_can_prefix_its_own_last_error(void **state)
{
    (void)state;
    pcs_set_error(PCS_ERR_NOT_FOUND, "open %s: No such file or directory", "init.safetensors");
    assert_int_equal(pcs_set_error(PCS_ERR_NOT_FOUND, "init.from: %s", pcs_last_error()),
                     PCS_ERR_NOT_FOUND);
    assert_string_equal(pcs_last_error(),
                        "init.from: open init.safetensors: No such file or directory");
    pcs_set_error(PCS_ERR_INVALID_ARG, "%s", "bad magic");
    pcs_set_error(PCS_ERR_INVALID_ARG, "data.file: %s: %s", pcs_last_error(), pcs_last_error());
    assert_string_equal(pcs_last_error(), "data.file: bad magic: bad magic");
    char big[2000];
    memset(big, 'a', sizeof big);
    memcpy(big + 1010, "\xe2\x82\xac", 3); /* a 3-byte character across the 1 KiB limit */
    big[sizeof big - 1] = '\0';
    pcs_set_error(PCS_ERR_INVALID_ARG, "%s", big);
    pcs_set_error(PCS_ERR_INVALID_ARG, "x: %s", pcs_last_error());
    size_t n = strlen(pcs_last_error());
    assert_true(n > 1000 && n < 1024);
    assert_true(pcs_utf8_valid(pcs_last_error(), n));
}

static void test_message_walk_names_a_top_level_field(void **state)
{
    (void)state;
    Pcs__V1__RegisterRequest r = PCS__V1__REGISTER_REQUEST__INIT;
    r.identity = "pod-\xc3\xa9";
    r.host = "node\xc0\xaf";
    assert_int_equal(pcs_pb_check_utf8(&r.base), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "host: not valid UTF-8 at byte 4");
    r.host = "node";
    assert_int_equal(pcs_pb_check_utf8(&r.base), PCS_OK);
}

static void test_message_walk_names_repeated_and_nested_fields(void **state)
{
    (void)state;
    Pcs__V1__RegisterRequest r = PCS__V1__REGISTER_REQUEST__INIT;
    r.identity = "w";
    char *backends[] = {"gloo", "nc\xed\xa0\x80l"};
    r.backends = backends;
    r.n_backends = 2;
    assert_int_equal(pcs_pb_check_utf8(&r.base), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "backends[1]: not valid UTF-8 at byte 2");
    backends[1] = "nccl";
    Pcs__V1__Device d0 = PCS__V1__DEVICE__INIT, d1 = PCS__V1__DEVICE__INIT;
    d0.kind = "cpu";
    d1.kind = "cuda";
    d1.name = "H100 \xf4\x90\x80\x80";
    Pcs__V1__Device *devs[] = {&d0, &d1};
    r.devices = devs;
    r.n_devices = 2;
    assert_int_equal(pcs_pb_check_utf8(&r.base), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "devices[1].name: not valid UTF-8 at byte 5");
    d1.name = "H100";
    assert_int_equal(pcs_pb_check_utf8(&r.base), PCS_OK);

    /* two levels down and through a oneof: spec.model.explicit.modules[0].params[1].name */
    Pcs__V1__SubmitJobRequest sj = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    Pcs__V1__JobSpec spec = PCS__V1__JOB_SPEC__INIT;
    Pcs__V1__ModelSpec model = PCS__V1__MODEL_SPEC__INIT;
    Pcs__V1__ExplicitModel ex = PCS__V1__EXPLICIT_MODEL__INIT;
    Pcs__V1__ModuleDecl mod = PCS__V1__MODULE_DECL__INIT;
    Pcs__V1__TensorDecl t0 = PCS__V1__TENSOR_DECL__INIT, t1 = PCS__V1__TENSOR_DECL__INIT;
    t0.name = "weight";
    t1.name = "bi\xe2\x82";
    Pcs__V1__TensorDecl *params[] = {&t0, &t1};
    mod.path = "enc.0";
    mod.params = params;
    mod.n_params = 2;
    Pcs__V1__ModuleDecl *mods[] = {&mod};
    ex.modules = mods;
    ex.n_modules = 1;
    model.kind_case = PCS__V1__MODEL_SPEC__KIND_EXPLICIT;
    model.explicit_ = &ex;
    spec.name = "job";
    spec.model = &model;
    sj.spec = &spec;
    assert_int_equal(pcs_pb_check_utf8(&sj.base), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(),
                        "spec.model.explicit.modules[0].params[1].name: not valid UTF-8 at byte 2");
    t1.name = "bias";
    assert_int_equal(pcs_pb_check_utf8(&sj.base), PCS_OK);
    spec.name = "\xe6\x97\xa5\xe6\x9c\xac\xff"; /* 日本 then a bad byte */
    assert_int_equal(pcs_pb_check_utf8(&sj.base), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "spec.name: not valid UTF-8 at byte 6");
}

/* What the server sees: bytes off the wire, decoded, then checked. */
static void test_decoded_wire_bytes_with_bad_utf8_are_refused(void **state)
{
    (void)state;
    Pcs__V1__KvSetRequest k = PCS__V1__KV_SET_REQUEST__INIT;
    k.job_id = "job-1";
    k.key = "rank/\xc0\x80"; /* overlong NUL, the classic smuggling form */
    uint8_t buf[128];
    size_t n = pcs__v1__kv_set_request__pack(&k, buf);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(&pcs__v1__kv_set_request__descriptor, NULL, n, buf);
    assert_non_null(m); /* protobuf-c itself accepts it: that is the gap */
    assert_int_equal(pcs_pb_check_utf8(m), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "key: not valid UTF-8 at byte 5");
    protobuf_c_message_free_unpacked(m, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_multibyte_text_is_accepted),
        cmocka_unit_test(test_invalid_sequences_report_the_offset_of_the_bad_byte),
        cmocka_unit_test(test_validator_agrees_with_reference_decoder_exhaustively),
        cmocka_unit_test(test_prefix_never_cuts_a_character),
        cmocka_unit_test(test_trim_partial_drops_only_an_incomplete_tail),
        cmocka_unit_test(test_sanitize_replaces_only_the_bad_bytes),
        cmocka_unit_test(test_set_error_can_prefix_its_own_last_error),
        cmocka_unit_test(test_message_walk_names_a_top_level_field),
        cmocka_unit_test(test_message_walk_names_repeated_and_nested_fields),
        cmocka_unit_test(test_decoded_wire_bytes_with_bad_utf8_are_refused),
    };
    return cmocka_run_group_tests_name("utf8", tests, NULL, NULL);
}
