/* Fuzz target for job files (common/pb_yaml.c, pb_json.c, planner/validate.c): arbitrary
 * bytes are parsed as a JobSpec the way `pcsctl submit` and the planner read files. Contract:
 * no crash or leak; failure means PCS_ERR_INVALID_ARG, no message and an error naming a line;
 * success means the validator runs, and JSON output parses back to the same packed bytes.
 * Built as a libFuzzer target with PCS_LIBFUZZER (clang, -DPCS_FUZZ=ON), otherwise as a replay
 * driver (files on the command line, the examples, and mutations of them for --seconds). Inputs
 * are also parsed as Job, KvSetRequest and Plan to reach every field type. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pcs/pbtext.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "planner/validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long n_parsed, n_rejected;

static void die(const char *what, const uint8_t *data, size_t size)
{
    fprintf(stderr, "fuzz_yaml: %s\nlast error: %s\ninput (%zu bytes):\n%.*s\n", what,
            pcs_last_error(), size, (int)size, (const char *)data);
    abort();
}

static void check_roundtrip(const ProtobufCMessage *m, const uint8_t *data, size_t size)
{
    char *json = NULL;
    if (pcs_pb_to_json(m, (int)(size % 3), &json) != PCS_OK)
        die("parsed message does not render as JSON", data, size);
    ProtobufCMessage *back = NULL;
    if (pcs_pb_from_yaml(json, strlen(json), m->descriptor, &back) != PCS_OK) {
        fprintf(stderr, "json: %s\n", json);
        die("JSON output does not parse back", data, size);
    }
    size_t n1 = protobuf_c_message_get_packed_size(m);
    size_t n2 = protobuf_c_message_get_packed_size(back);
    uint8_t *p1 = malloc(n1 + 1), *p2 = malloc(n2 + 1);
    if (!p1 || !p2)
        abort();
    protobuf_c_message_pack(m, p1);
    protobuf_c_message_pack(back, p2);
    if (n1 != n2 || memcmp(p1, p2, n1) != 0) {
        fprintf(stderr, "json: %s\n", json);
        die("YAML -> JSON -> message changed the packed bytes", data, size);
    }
    free(p1);
    free(p2);
    free(json);
    protobuf_c_message_free_unpacked(back, NULL);
}

/* Parse as `d`; on success check the JSON round trip and return the message, else NULL. */
static ProtobufCMessage *parse_one(const ProtobufCMessageDescriptor *d, const uint8_t *data,
                                   size_t size)
{
    ProtobufCMessage *m = (ProtobufCMessage *)data; /* must be reset to NULL on failure */
    pcs_status_t st = pcs_pb_from_yaml((const char *)data, size, d, &m);
    if (st != PCS_OK) {
        if (m || st != PCS_ERR_INVALID_ARG)
            die("bad failure contract", data, size);
        const char *e = pcs_last_error();
        if (strncmp(e, "line ", 5) && !strstr(e, "exceeds the limit"))
            die("error does not name a line", data, size);
        n_rejected++;
        return NULL;
    }
    n_parsed++;
    check_roundtrip(m, data, size);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ProtobufCMessage *m = parse_one(&pcs__v1__job_spec__descriptor, data, size);
    if (m) {
        char err[256];
        pcs_status_t st = pcs_job_validate((const Pcs__V1__JobSpec *)m, err, sizeof err);
        if (st != PCS_OK && (st != PCS_ERR_INVALID_ARG || !strchr(err, ':')))
            die("validator broke its contract", data, size);
        (void)pcs_job_world_size((const Pcs__V1__JobSpec *)m);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    /* Other shapes through the same descriptor walk: fixed64 and nested specs (Job), bytes
     * (KvSetRequest), deep plans (Plan). */
    const ProtobufCMessageDescriptor *more[] = {&pcs__v1__job__descriptor,
                                                &pcs__v1__kv_set_request__descriptor,
                                                &pcs__v1__plan__descriptor};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        m = parse_one(more[i], data, size);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    return 0;
}

#ifndef PCS_LIBFUZZER
// ---- replay driver ------------------------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

typedef struct buf {
    char *data;
    size_t len;
} buf_t;

static buf_t seeds[32];
static size_t n_seeds;

static void add_seed(const char *data, size_t len)
{
    if (n_seeds >= sizeof seeds / sizeof seeds[0])
        return;
    seeds[n_seeds].data = malloc(len + 1);
    memcpy(seeds[n_seeds].data, data, len);
    seeds[n_seeds].data[len] = '\0';
    seeds[n_seeds].len = len;
    n_seeds++;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    if (n < 0) {
        fclose(fp);
        return NULL;
    }
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, fp) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(fp);
    if (p)
        *len = (size_t)n;
    return p;
}

/* Tokens that steer mutations into the interesting corners of YAML and of the shorthands. */
// clang-format off
static const char *const tokens[] = {
    "default", "~", "null", "true", "no", "1e8", "-1", "18446744073709551616", ".inf", ".nan",
    "0x1f", "[", "]", "{", "}", ":", ",", "- ", "\n  ", "&a ", "*a", "!!str ", "\"\\u0085\"",
    "'it''s'", "bf16", "int64", "mlp", "explicit", "group_size", "---\n", "\t", "#", "\"\\x01\"",
    "{dim: dp_shard, size: 0}", "overrides: [{match: {path: a*}}]"};
// clang-format on

static size_t mutate(char *out, size_t cap, const buf_t *s)
{
    size_t len = s->len < cap ? s->len : cap;
    memcpy(out, s->data, len);
    int rounds = 1 + (int)(rnd() % 4);
    for (int r = 0; r < rounds; r++) {
        size_t pos = len ? (size_t)(rnd() % (len + 1)) : 0;
        switch (rnd() % 5) {
        case 0: /* flip a byte */
            if (len)
                out[pos % len] = (char)rnd();
            break;
        case 1: { /* insert a token */
            const char *t = tokens[rnd() % (sizeof tokens / sizeof tokens[0])];
            size_t tl = strlen(t);
            if (len + tl <= cap) {
                memmove(out + pos + tl, out + pos, len - pos);
                memcpy(out + pos, t, tl);
                len += tl;
            }
            break;
        }
        case 2: { /* delete a span */
            size_t n = (size_t)(rnd() % 16);
            if (pos + n > len)
                n = len - pos;
            memmove(out + pos, out + pos + n, len - pos - n);
            len -= n;
            break;
        }
        case 3: /* truncate */
            len = pos;
            break;
        default: { /* splice a span of another seed */
            const buf_t *o = &seeds[rnd() % n_seeds];
            if (!o->len)
                break;
            size_t from = (size_t)(rnd() % o->len), n = (size_t)(rnd() % 64);
            if (from + n > o->len)
                n = o->len - from;
            if (len + n <= cap) {
                memmove(out + pos + n, out + pos, len - pos);
                memcpy(out + pos, o->data + from, n);
                len += n;
            }
        }
        }
    }
    return len;
}

int main(int argc, char **argv)
{
    double seconds = 3.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = atof(argv[++i]);
            continue;
        }
        size_t len = 0;
        char *p = read_file(argv[i], &len);
        if (!p) {
            fprintf(stderr, "fuzz_yaml: cannot read %s\n", argv[i]);
            return 2;
        }
        LLVMFuzzerTestOneInput((const uint8_t *)p, len);
        add_seed(p, len);
        free(p);
    }
    const char *src = getenv("PCS_SOURCE_DIR");
    const char *examples[] = {"examples/demo-job.yaml", "examples/tiny-job.yaml",
                              "examples/hsdp-job.yaml", "examples/fp16-explicit-job.json"};
    for (size_t i = 0; src && i < sizeof examples / sizeof examples[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", src, examples[i]);
        size_t len = 0;
        char *p = read_file(path, &len);
        if (p) {
            add_seed(p, len);
            free(p);
        }
    }
    static const char *inline_seeds[] = {
        "name: x\nreshard_after_forward: 2\nmesh: [{dim: dp_shard, size: 2}]\n",
        "{\"model\": {\"explicit\": [{\"path\": \"a\", \"params\": [{\"name\": \"w\", \"shape\": "
        "[2, 3]}]}]}, \"wrap\": {\"explicit\": [\"a\"]}}",
        "training: {optimizer: {sgd: {lr: 0.1, momentum: default}}, grad_scaler: {enabled: yes}}\n",
        "name: \"a\\tb\\u2028c\\x85\"\ninit: {from: 'w.safetensors'}\n",
        "job_id: j\ngeneration: 3\nkey: nccl-id/0\nvalue: AAECAwQFBgc=\n",
        "{job_id: job-1, plan_hash: 18446744073709551615, progress: {loss: .nan, step_ms: 1.5}, "
        "workers: [w-1, w-2], spec: {name: x, reshard_after_forward: 4}}",
    };
    for (size_t i = 0; i < sizeof inline_seeds / sizeof inline_seeds[0]; i++)
        add_seed(inline_seeds[i], strlen(inline_seeds[i]));
    for (size_t i = 0; i < n_seeds; i++)
        LLVMFuzzerTestOneInput((const uint8_t *)seeds[i].data, seeds[i].len);

    const size_t cap = 1u << 16;
    char *scratch = malloc(cap);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long iters = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 >= seconds)
            break;
        size_t len;
        if (rnd() % 16 == 0) { /* plain random bytes, mostly printable */
            len = (size_t)(rnd() % 256);
            for (size_t i = 0; i < len; i++)
                scratch[i] = (char)(rnd() % 4 ? 32 + rnd() % 95 : rnd());
        } else {
            len = mutate(scratch, cap, &seeds[rnd() % n_seeds]);
        }
        LLVMFuzzerTestOneInput((const uint8_t *)scratch, len);
        iters++;
    }
    free(scratch);
    for (size_t i = 0; i < n_seeds; i++)
        free(seeds[i].data);
    printf("fuzz_yaml: %lu inputs (%lu parsed, %lu rejected) in %.1f s, %zu seeds\n",
           iters + n_seeds, n_parsed, n_rejected, seconds, n_seeds);
    /* The examples must parse: a replay that rejects everything tests nothing. */
    return n_parsed >= 4 ? 0 : 1;
}
#endif
