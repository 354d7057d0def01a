/* Fuzz target for the RPC codec (common/rpc_codec.c): arbitrary bytes are decoded as every
 * pcs.v1 request and response type through a grpc_byte_buffer, as the server and clients do
 * with network input. Decoded messages must re-encode canonically. Built two ways: with
 * PCS_LIBFUZZER (clang -fsanitize=fuzzer, -DPCS_FUZZ=ON) as a libFuzzer target, and otherwise as
 * a replay driver (files/dirs given on the command line + seeds, mutations and random bytes for
 * --seconds) registered as a unit test so CI runs the decoder under gcc and ASan too. */
#include "rpc_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pcs/clock.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/worker.pb-c.h"

#define FUZZ_MAX_BYTES (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long n_decoded, n_rejected;

/* Decode once through the byte-buffer path; on success check the canonical round trip. */
static void decode_one(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size)
{
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)data, size);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    ProtobufCMessage *m = NULL;
    pcs_status_t st = pcs_rpc_decode(desc, bb, FUZZ_MAX_BYTES, &m);
    grpc_byte_buffer_destroy(bb);
    if (st != PCS_OK) {
        if (m || (st != PCS_ERR_INVALID_ARG && st != PCS_ERR_LIMIT)) {
            fprintf(stderr, "%s: bad failure contract (status %d)\n", desc->name, (int)st);
            abort();
        }
        if (st == PCS_ERR_INVALID_ARG && !strstr(pcs_last_error(), desc->name)) {
            fprintf(stderr, "%s: error does not name the type: %s\n", desc->name, pcs_last_error());
            abort();
        }
        n_rejected++;
        return;
    }
    n_decoded++;
    /* pack(unpack(x)) is canonical: packing its decode again gives the same bytes */
    grpc_byte_buffer *b1 = NULL, *b2 = NULL;
    ProtobufCMessage *m2 = NULL;
    if (pcs_rpc_encode(m, 0, &b1) != PCS_OK || pcs_rpc_decode(desc, b1, 0, &m2) != PCS_OK ||
        pcs_rpc_encode(m2, 0, &b2) != PCS_OK) {
        fprintf(stderr, "%s: decoded message does not re-encode: %s\ninput:", desc->name,
                pcs_last_error());
        for (size_t i = 0; i < size; i++)
            fprintf(stderr, " %02x", data[i]);
        fprintf(stderr, "\n");
        abort();
    }
    size_t n1 = protobuf_c_message_get_packed_size(m), n2 = protobuf_c_message_get_packed_size(m2);
    uint8_t *p1 = malloc(n1 + 1), *p2 = malloc(n2 + 1);
    protobuf_c_message_pack(m, p1);
    protobuf_c_message_pack(m2, p2);
    if (n1 != n2 || memcmp(p1, p2, n1) != 0) {
        fprintf(stderr, "%s: re-encoding is not stable (%zu vs %zu bytes)\n", desc->name, n1, n2);
        abort();
    }
    free(p1);
    free(p2);
    grpc_byte_buffer_destroy(b1);
    grpc_byte_buffer_destroy(b2);
    protobuf_c_message_free_unpacked(m2, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = 0;
    const pcs_rpc_method_info_t *methods = pcs_rpc_known_methods(&n);
    for (size_t i = 0; i < n; i++) {
        decode_one(methods[i].req_desc, data, size);
        decode_one(methods[i].resp_desc, data, size); /* clients decode replies from the wire */
    }
    return 0;
}

#ifndef PCS_LIBFUZZER
// ---- replay driver ----

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

typedef struct seed {
    uint8_t *data;
    size_t len;
} seed_t;

static seed_t seeds[64];
static size_t n_seeds;

static void add_seed(const ProtobufCMessage *m)
{
    if (n_seeds >= sizeof seeds / sizeof seeds[0])
        return;
    size_t len = protobuf_c_message_get_packed_size(m);
    seeds[n_seeds].data = malloc(len + 1);
    seeds[n_seeds].len = protobuf_c_message_pack(m, seeds[n_seeds].data);
    n_seeds++;
}

/* Valid messages with nested, repeated, bytes, oneof and map-like fields to mutate from. */
static void make_seeds(void)
{
    Pcs__V1__Device dev = PCS__V1__DEVICE__INIT;
    dev.index = 1;
    dev.kind = "cuda";
    dev.name = "H100";
    dev.memory_bytes = 80ull << 30;
    Pcs__V1__Device *devs[] = {&dev, &dev};
    char *backends[] = {"gloo", "nccl"};
    Pcs__V1__RegisterRequest reg = PCS__V1__REGISTER_REQUEST__INIT;
    reg.identity = "pod-7";
    reg.host = "node-a";
    reg.pid = 4242;
    reg.n_devices = 2;
    reg.devices = devs;
    reg.n_backends = 2;
    reg.backends = backends;
    add_seed(&reg.base);

    uint8_t id[128];
    for (size_t i = 0; i < sizeof id; i++)
        id[i] = (uint8_t)(i * 37);
    Pcs__V1__KvSetRequest kv = PCS__V1__KV_SET_REQUEST__INIT;
    kv.job_id = "job-1";
    kv.generation = 3;
    kv.key = "nccl-id/0";
    kv.value.data = id;
    kv.value.len = sizeof id;
    add_seed(&kv.base);

    Pcs__V1__CollectiveRecord rec = PCS__V1__COLLECTIVE_RECORD__INIT;
    rec.count = 1024;
    rec.bytes = 2048;
    rec.calls = 2;
    Pcs__V1__CollectiveRecord *recs[] = {&rec, &rec, &rec};
    Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
    rep.step = 10;
    rep.loss = 0.25;
    rep.step_ms = 12.5;
    rep.n_collectives = 3;
    rep.collectives = recs;
    rep.fingerprint = 0x0123456789abcdefull;
    Pcs__V1__ReportStepRequest rs = PCS__V1__REPORT_STEP_REQUEST__INIT;
    rs.worker_id = "w-1";
    rs.report = &rep;
    add_seed(&rs.base);

    Pcs__V1__Directive d = PCS__V1__DIRECTIVE__INIT;
    d.kind = PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_STOP;
    d.reason = "cancelled";
    Pcs__V1__AssignmentEvent ev = PCS__V1__ASSIGNMENT_EVENT__INIT;
    ev.seq = 9;
    ev.event_case = PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE;
    ev.directive = &d;
    add_seed(&ev.base);

    Pcs__V1__HeartbeatRequest hb = PCS__V1__HEARTBEAT_REQUEST__INIT;
    hb.worker_id = "w-2";
    hb.generation = 1;
    add_seed(&hb.base);

    Pcs__V1__GetJobRequest gj = PCS__V1__GET_JOB_REQUEST__INIT;
    gj.job_id = "job-42";
    add_seed(&gj.base);
}

static void mutate(const seed_t *s, uint8_t *out, size_t *len, size_t cap)
{
    size_t n = s->len < cap ? s->len : cap;
    memcpy(out, s->data, n);
    int edits = 1 + (int)(rnd() % 4);
    for (int e = 0; e < edits; e++) {
        switch (rnd() % 5) {
        case 0: /* flip a byte */
            if (n)
                out[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* truncate */
            if (n)
                n = rnd() % n;
            break;
        case 2: /* interesting value */
            if (n) {
                static const uint8_t vals[] = {0x00, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x08};
                out[rnd() % n] = vals[rnd() % sizeof vals];
            }
            break;
        case 3: /* insert a random byte */
            if (n < cap) {
                size_t at = n ? rnd() % n : 0;
                memmove(out + at + 1, out + at, n - at);
                out[at] = (uint8_t)rnd();
                n++;
            }
            break;
        default: /* append a huge length prefix */
            if (n + 6 <= cap) {
                const uint8_t tail[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f};
                memcpy(out + n, tail, sizeof tail);
                n += sizeof tail;
            }
            break;
        }
    }
    *len = n;
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = malloc(FUZZ_MAX_BYTES + 16);
    size_t n = fread(buf, 1, FUZZ_MAX_BYTES + 16, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "cannot stat %s\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path);
    DIR *d = opendir(path);
    if (!d)
        return 1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        rc |= run_file(p);
    }
    closedir(d);
    return rc;
}

/* Inputs whose outcome is known: proves the checks above are live, not vacuous. */
static int known_answers(void)
{
    int bad = 0;
    ProtobufCMessage *m = NULL;
    for (size_t i = 0; i < n_seeds; i++) {
        unsigned long before = n_decoded;
        LLVMFuzzerTestOneInput(seeds[i].data, seeds[i].len);
        if (n_decoded == before) {
            fprintf(stderr, "seed %zu decoded as no type at all\n", i);
            bad++;
        }
    }
    const uint8_t trunc[] = {0x0a, 0x64, 'a', 'b'}; /* length 100, 2 bytes follow */
    if (pcs_rpc_decode_bytes(&pcs__v1__register_request__descriptor, trunc, sizeof trunc, 0, &m) !=
            PCS_ERR_INVALID_ARG ||
        !strstr(pcs_last_error(), "pcs.v1.RegisterRequest")) {
        fprintf(stderr, "truncated field was not rejected by name: %s\n", pcs_last_error());
        bad++;
    }
    if (pcs_rpc_decode_bytes(&pcs__v1__register_request__descriptor, seeds[0].data, seeds[0].len,
                             seeds[0].len - 1, &m) != PCS_ERR_LIMIT) {
        fprintf(stderr, "oversized input was not PCS_ERR_LIMIT\n");
        bad++;
    }
    if (pcs_rpc_decode(&pcs__v1__register_request__descriptor, NULL, 0, &m) != PCS_OK || !m) {
        fprintf(stderr, "missing payload does not decode as the empty message\n");
        bad++;
    } else {
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return bad;
}

int main(int argc, char **argv)
{
    double seconds = 2.0;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int rc = 0;
    make_seeds();
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else
            rc |= run_path(argv[i]);
    }
    rng_state = seed ? seed : 1;
    if (known_answers() != 0)
        return 1;
    uint8_t buf[4096];
    unsigned long runs = 0;
    uint64_t t_end = pcs_now_ms() + (uint64_t)(seconds * 1000.0);
    while (pcs_now_ms() < t_end) {
        for (int k = 0; k < 32; k++, runs++) {
            size_t len;
            if (rnd() % 4 == 0) { /* pure random bytes */
                len = (size_t)(rnd() % 64);
                for (size_t i = 0; i < len; i++)
                    buf[i] = (uint8_t)rnd();
            } else {
                mutate(&seeds[rnd() % n_seeds], buf, &len, sizeof buf);
            }
            LLVMFuzzerTestOneInput(buf, len);
        }
    }
    size_t n_methods = 0;
    pcs_rpc_known_methods(&n_methods);
    printf("fuzz_rpc_decode replay: seed 0x%llx, %lu inputs x %zu types: %lu decoded, %lu "
           "rejected\n",
           (unsigned long long)seed, runs, 2 * n_methods, n_decoded, n_rejected);
    for (size_t i = 0; i < n_seeds; i++)
        free(seeds[i].data);
    if (runs == 0 || n_rejected == 0 || n_decoded == 0) {
        fprintf(stderr, "fuzz replay exercised nothing\n");
        return 1;
    }
    return rc;
}
#endif
