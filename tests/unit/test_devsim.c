/* Unit tests of the simulated "cuda" backend (kernels/src/ops_devsim.c, nn_devsim.c): selected by
 * pcs_backend_simulate_cuda, named "cuda", device pointers carry a poison tag a host access faults
 * on, ops on device pointers give the CPU twin's bits, copies whose kind does not match where the
 * pointers live and host pointers handed to device ops are refused with a message, freeing
 * with the wrong allocator aborts, and stream-ordered allocations (alloc_async/free_async) take
 * effect in their stream's order. References: pcs/half.h rounding and the "cpu" backend/nn ops
 * on host copies of the same data. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pcs/half.h"
#include "pcs/kernels.h"
#include "pcs/nn.h"

#define TAG ((uintptr_t)1 << 62)

static const pcs_backend_ops_t *g_sim, *g_cpu;

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0) * 4.0f - 2.0f;
}

static int setup(void **state)
{
    (void)state;
    if (pcs_backend_simulate_cuda(1) != PCS_OK)
        return -1;
    if (pcs_backend_get("cuda", &g_sim) != PCS_OK || pcs_backend_get("cpu", &g_cpu) != PCS_OK)
        return -1;
    return 0;
}

/* Upload n floats to a new device buffer. */
static void *upload(const float *h, size_t n)
{
    void *d = NULL;
    assert_int_equal(g_sim->alloc(n * sizeof(float), &d), PCS_OK);
    assert_int_equal(g_sim->copy(d, h, n * sizeof(float), PCS_COPY_H2D, NULL), PCS_OK);
    return d;
}

static void download(float *h, const void *d, size_t n)
{
    assert_int_equal(g_sim->copy(h, d, n * sizeof(float), PCS_COPY_D2H, NULL), PCS_OK);
}

// ---- selection and devices ----

static void test_switch_selects_a_simulated_backend_named_cuda_with_one_device(void **state)
{
    (void)state;
    assert_string_equal(g_sim->name, "cuda");
    assert_true(pcs_backend_is_simulated(g_sim));
    assert_false(pcs_backend_is_simulated(g_cpu));
    assert_false(pcs_backend_is_simulated(NULL));
    assert_int_equal(g_sim->device_count(), 1);
    char name[64];
    uint64_t mem = 0;
    assert_int_equal(g_sim->device_info(0, name, sizeof name, &mem), PCS_OK);
    assert_string_equal(name, "simulated (simulate-cuda)");
    assert_true(mem > 0);
    assert_int_equal(g_sim->set_device(0), PCS_OK);
    assert_int_equal(g_sim->set_device(1), PCS_ERR_INVALID_ARG);
    assert_int_equal(g_sim->device_info(1, name, sizeof name, &mem), PCS_ERR_INVALID_ARG);

    assert_int_equal(pcs_backend_simulate_cuda(3), PCS_OK);
    assert_int_equal(g_sim->device_count(), 3);
    assert_int_equal(g_sim->set_device(2), PCS_OK);
    assert_int_equal(g_sim->set_device(3), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_backend_simulate_cuda(PCS_SIMULATE_CUDA_MAX_DEVICES + 1),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_backend_simulate_cuda(1), PCS_OK);

    /* the nn registry follows the same switch */
    const pcs_nn_ops_t *ops = NULL;
    assert_int_equal(pcs_nn_get("cuda", &ops), PCS_OK);
    assert_string_equal(pcs_nn_ops_name(ops), "cuda");
}

static void test_without_the_switch_cuda_is_not_the_simulator(void **state)
{
    (void)state;
    assert_int_equal(pcs_backend_simulate_cuda(0), PCS_OK);
    const pcs_backend_ops_t *be = NULL;
    pcs_status_t rc = pcs_backend_get("cuda", &be);
    assert_int_equal(pcs_backend_simulate_cuda(1), PCS_OK);
    /* a real device or UNSUPPORTED (none here / not built): never the simulator */
    assert_true(rc == PCS_OK || rc == PCS_ERR_UNSUPPORTED);
    if (rc == PCS_OK)
        assert_false(pcs_backend_is_simulated(be));
}

// ---- tagging ----

static void test_device_pointers_are_tagged_and_host_memory_is_not(void **state)
{
    (void)state;
    void *d = NULL, *h = NULL, *z = (void *)1;
    assert_int_equal(g_sim->alloc(100, &d), PCS_OK);
    assert_int_equal(g_sim->host_alloc(100, &h), PCS_OK);
    assert_true(((uintptr_t)d & TAG) != 0);
    assert_true(((uintptr_t)h & TAG) == 0);
    /* pointer arithmetic stays tagged: an offset view is still a device pointer */
    assert_true(((uintptr_t)((char *)d + 64) & TAG) != 0);
    assert_int_equal(g_sim->alloc(0, &z), PCS_OK);
    assert_null(z);
    g_sim->free(d);
    g_sim->host_free(h);
    g_sim->free(NULL);
    g_sim->host_free(NULL);
}

/* The child stores through a device pointer: a non-canonical address, so it must die (SIGSEGV,
 * or ASan's report and exit) before reaching _exit(0). */
static void test_host_store_through_a_device_pointer_faults(void **state)
{
    (void)state;
    void *d = NULL;
    assert_int_equal(g_sim->alloc(64, &d), PCS_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* die by the fault itself, not through cmocka's handler (which would go on running the
         * rest of the suite in this child); silence its output */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        FILE *f = freopen("/dev/null", "w", stderr);
        f = freopen("/dev/null", "w", stdout);
        (void)f;
        volatile float *p = d;
        p[3] = 1.0f;
        _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    /* SIGSEGV (SIGBUS on some kernels for non-canonical addresses), or ASan's report + exit */
    assert_false(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (WIFSIGNALED(ws))
        assert_true(WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS);
    g_sim->free(d);
}

static int dies_by_abort(void (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen("/dev/null", "w", stderr);
        f = freopen("/dev/null", "w", stdout);
        (void)f;
        fn(arg);
        _exit(0);
    }
    int ws = 0;
    if (waitpid(pid, &ws, 0) != pid)
        return 0;
    return WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT;
}

static void call_free(void *p)
{
    g_sim->free(p);
}

static void call_host_free(void *p)
{
    g_sim->host_free(p);
}

static void test_freeing_with_the_wrong_allocator_aborts(void **state)
{
    (void)state;
    void *d = NULL, *h = NULL;
    assert_int_equal(g_sim->alloc(64, &d), PCS_OK);
    assert_int_equal(g_sim->host_alloc(64, &h), PCS_OK);
    assert_true(dies_by_abort(call_free, h));      /* device free of host memory */
    assert_true(dies_by_abort(call_host_free, d)); /* host free of device memory */
    g_sim->free(d);
    g_sim->host_free(h);
}

// ---- stream-ordered allocation ----

static void call_free_async(void *p)
{
    g_sim->free_async(p, NULL);
}

/* alloc_async memory is a tagged device buffer usable by later work on its stream; its fresh NaN
 * fill is queued on that stream, so a second stream that writes the buffer without waiting for
 * an event recorded after the allocation has its result overwritten (as the use is undefined on a
 * device), and with the wait it keeps it. Argument checks as alloc; the cpu backend's twin is
 * plain aligned memory. */
static void test_alloc_async_is_ordered_on_its_stream_and_another_stream_must_wait(void **state)
{
    (void)state;
    enum { N = 16 };
    pcs_stream_t a = NULL, b = NULL;
    pcs_event_t ev = NULL;
    assert_int_equal(g_sim->stream_create(&a), PCS_OK);
    assert_int_equal(g_sim->stream_create(&b), PCS_OK);
    assert_int_equal(g_sim->event_create(&ev), PCS_OK);
    float back[N];

    /* same stream: the fill after the allocation wins */
    float *d = NULL;
    assert_int_equal(g_sim->alloc_async(N * sizeof(float), a, (void **)&d), PCS_OK);
    assert_true(((uintptr_t)d & TAG) != 0);
    assert_int_equal(((uintptr_t)d & ~TAG) % 256, 0);
    assert_int_equal(pcs_kernel_fill(g_sim, d, PCS_DTYPE_FP32, N, 2.5, a), PCS_OK);
    assert_int_equal(g_sim->sync(a), PCS_OK);
    download(back, d, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == 2.5f);
    g_sim->free_async(d, a);

    /* another stream without waiting: the allocation's NaN fill runs after its write */
    assert_int_equal(g_sim->alloc_async(N * sizeof(float), a, (void **)&d), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, d, PCS_DTYPE_FP32, N, 1.0, b), PCS_OK);
    assert_int_equal(g_sim->sync(b), PCS_OK);
    assert_int_equal(g_sim->sync(a), PCS_OK);
    download(back, d, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] != back[i]); /* NaN */
    g_sim->free_async(d, a);

    /* with an event recorded after the allocation and waited for: the write stays */
    assert_int_equal(g_sim->alloc_async(N * sizeof(float), a, (void **)&d), PCS_OK);
    assert_int_equal(g_sim->event_record(ev, a), PCS_OK);
    assert_int_equal(g_sim->stream_wait_event(b, ev), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, d, PCS_DTYPE_FP32, N, 1.0, b), PCS_OK);
    assert_int_equal(g_sim->sync(b), PCS_OK);
    assert_int_equal(g_sim->sync(a), PCS_OK);
    download(back, d, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == 1.0f);
    g_sim->free_async(d, a);
    assert_int_equal(g_sim->sync(a), PCS_OK);

    /* arguments */
    assert_int_equal(g_sim->alloc_async(64, a, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "alloc_async"));
    d = (float *)&back[0];
    assert_int_equal(g_sim->alloc_async(0, a, (void **)&d), PCS_OK);
    assert_null(d);
    g_sim->free_async(NULL, a);
    assert_true(dies_by_abort(call_free_async, back)); /* host memory */
    void *h = NULL;
    assert_int_equal(g_cpu->alloc_async(100, NULL, &h), PCS_OK);
    assert_non_null(h);
    assert_int_equal((uintptr_t)h % 256, 0);
    memset(h, 0, 100);
    g_cpu->free_async(h, NULL);
    assert_int_equal(g_cpu->alloc_async(64, NULL, NULL), PCS_ERR_INVALID_ARG);

    g_sim->event_destroy(ev);
    g_sim->stream_destroy(a);
    g_sim->stream_destroy(b);
}

/* free_async releases the buffer only once the work queued on its stream before it has run: a
 * queued copy still reads the right values (under ASan a premature free would be a
 * use-after-free), and the stream's other work is not disturbed. */
static void test_free_async_runs_after_the_work_queued_before_it(void **state)
{
    (void)state;
    enum { N = 32 };
    pcs_stream_t a = NULL;
    assert_int_equal(g_sim->stream_create(&a), PCS_OK);
    float h[N], back[N];
    for (int i = 0; i < N; i++)
        h[i] = urand();
    float *out = upload(h, N);
    float *tmp = NULL;
    assert_int_equal(g_sim->alloc_async(N * sizeof(float), a, (void **)&tmp), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, tmp, PCS_DTYPE_FP32, N, -3.0, a), PCS_OK);
    assert_int_equal(g_sim->copy(out, tmp, N * sizeof(float), PCS_COPY_D2D, a), PCS_OK);
    g_sim->free_async(tmp, a); /* queued: the copy above still reads tmp */
    download(back, out, N);    /* not yet synced: the NULL stream does not wait for a */
    assert_memory_equal(back, h, sizeof h);
    assert_int_equal(g_sim->sync(a), PCS_OK);
    download(back, out, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == -3.0f);
    g_sim->free(out);
    g_sim->stream_destroy(a);
}

// ---- copies ----

static void test_copies_round_trip_and_a_kind_that_does_not_match_is_refused(void **state)
{
    (void)state;
    enum { N = 37 };
    float h[N], back[N], h2[N];
    for (int i = 0; i < N; i++)
        h[i] = urand();
    void *d = upload(h, N), *d2 = NULL;
    assert_int_equal(g_sim->alloc(N * sizeof(float), &d2), PCS_OK);
    assert_int_equal(g_sim->copy(d2, d, N * sizeof(float), PCS_COPY_D2D, NULL), PCS_OK);
    memset(back, 0, sizeof back);
    download(back, d2, N);
    assert_memory_equal(back, h, sizeof h);
    /* DEFAULT infers the direction, as cudaMemcpyDefault */
    memset(back, 0, sizeof back);
    assert_int_equal(g_sim->copy(back, d, sizeof back, PCS_COPY_DEFAULT, NULL), PCS_OK);
    assert_memory_equal(back, h, sizeof h);
    assert_int_equal(g_sim->copy(h2, h, sizeof h, PCS_COPY_H2H, NULL), PCS_OK);
    assert_memory_equal(h2, h, sizeof h);

    size_t b = sizeof h;
    assert_int_equal(g_sim->copy(d, d2, b, PCS_COPY_H2D, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "H2D"));
    assert_int_equal(g_sim->copy(h2, h, b, PCS_COPY_H2D, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(g_sim->copy(h2, h, b, PCS_COPY_D2H, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "D2H"));
    assert_int_equal(g_sim->copy(d, h, b, PCS_COPY_D2H, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(g_sim->copy(d, h, b, PCS_COPY_D2D, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(g_sim->copy(h2, d, b, PCS_COPY_D2D, NULL), PCS_ERR_INVALID_ARG);
    assert_int_equal(g_sim->copy(h2, d, b, PCS_COPY_H2H, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "device"));
    /* nothing was written by a refused copy */
    download(back, d, N);
    assert_memory_equal(back, h, sizeof h);
    g_sim->free(d);
    g_sim->free(d2);
}

// ---- fresh memory and stream order ----

static void test_fresh_buffers_hold_nan_bytes_not_zeros(void **state)
{
    (void)state;
    float *d = NULL, *h = NULL, back[4];
    assert_int_equal(g_sim->alloc(sizeof back, (void **)&d), PCS_OK);
    assert_int_equal(g_sim->host_alloc(sizeof back, (void **)&h), PCS_OK);
    download(back, d, 4);
    for (int i = 0; i < 4; i++) {
        assert_true(back[i] != back[i]); /* NaN */
        assert_true(h[i] != h[i]);
    }
    g_sim->free(d);
    g_sim->host_free(h);
}

/* Work on a stream runs when something waits for it: the host sees a pinned D2H result only after
 * sync / event_sync, an H2D reads its source when it runs, other streams see the work only after
 * waiting on an event recorded after it. A pageable D2H waits for the stream (as CUDA does). */
static void test_pinned_copies_on_a_stream_complete_at_its_sync(void **state)
{
    (void)state;
    enum { N = 8 };
    float src[N], pageable[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)i + 0.5f;
    float *d = upload(src, N), *pin = NULL;
    assert_int_equal(g_sim->host_alloc(N * sizeof(float), (void **)&pin), PCS_OK);
    pcs_stream_t s = NULL, s2 = NULL;
    pcs_event_t e = NULL;
    assert_int_equal(g_sim->stream_create(&s), PCS_OK);
    assert_int_equal(g_sim->stream_create(&s2), PCS_OK);
    assert_int_equal(g_sim->event_create(&e), PCS_OK);

    assert_int_equal(g_sim->copy(pin, d, sizeof src, PCS_COPY_D2H, s), PCS_OK);
    assert_true(pin[0] != pin[0]); /* not arrived: a host read without a sync sees NaN */
    assert_int_equal(g_sim->sync(s), PCS_OK);
    assert_memory_equal(pin, src, sizeof src);

    assert_int_equal(g_sim->copy(pageable, d, sizeof src, PCS_COPY_D2H, s), PCS_OK);
    assert_memory_equal(pageable, src, sizeof src); /* pageable: synchronous */

    memset(pin, 0, sizeof src);
    assert_int_equal(g_sim->copy(pin, d, sizeof src, PCS_COPY_D2H, s), PCS_OK);
    assert_int_equal(g_sim->event_record(e, s), PCS_OK);
    assert_true(pin[1] != pin[1]);
    assert_int_equal(g_sim->event_sync(e), PCS_OK);
    assert_memory_equal(pin, src, sizeof src);

    /* H2D from pinned memory reads its source when the stream runs it; work queued on s is not
     * seen by the NULL stream (non-blocking streams) until s is synchronized */
    for (int i = 0; i < N; i++)
        pin[i] = 2.0f;
    assert_int_equal(g_sim->copy(d, pin, sizeof src, PCS_COPY_H2D, s), PCS_OK);
    for (int i = 0; i < N; i++)
        pin[i] = 3.0f; /* a host write racing the copy: what arrives is what is there at its turn */
    assert_int_equal(pcs_kernel_scale(g_sim, d, PCS_DTYPE_FP32, N, 2.0f, s), PCS_OK);
    float back[N];
    download(back, d, N);
    assert_memory_equal(back, src, sizeof src); /* no wait for s: the old contents */
    assert_int_equal(g_sim->sync(s), PCS_OK);
    download(back, d, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == 6.0f);

    /* bad input to a queued op is refused when it is queued (as the cuda backend validates on
     * the host), and nothing is left to fail at the next sync */
    pcs_tensor_t bad = {d, PCS_DTYPE_INT64, 1};
    assert_int_equal(pcs_kernel_scale_list(g_sim, &bad, 1, 2.0f, s), PCS_ERR_UNSUPPORTED);
    assert_non_null(strstr(pcs_last_error(), "scale"));
    assert_int_equal(g_sim->sync(s), PCS_OK);

    /* another stream waiting on an event recorded after a D2H orders it first */
    assert_int_equal(g_sim->copy(pin, d, sizeof src, PCS_COPY_D2H, s), PCS_OK);
    assert_int_equal(g_sim->event_record(e, s), PCS_OK);
    assert_int_equal(g_sim->stream_wait_event(s2, e), PCS_OK);
    assert_int_equal(g_sim->sync(s2), PCS_OK);
    assert_true(pin[0] == 6.0f);

    /* destroying a stream lets its queued copies finish (cudaStreamDestroy) */
    assert_int_equal(g_sim->copy(d, src, sizeof src, PCS_COPY_H2D, NULL), PCS_OK);
    assert_int_equal(g_sim->copy(pin, d, sizeof src, PCS_COPY_D2H, s), PCS_OK);
    g_sim->stream_destroy(s);
    assert_memory_equal(pin, src, sizeof src);

    g_sim->stream_destroy(s2);
    g_sim->event_destroy(e);
    g_sim->host_free(pin);
    g_sim->free(d);
}

// ---- element-wise ops ----

static void test_ops_on_device_pointers_give_the_cpu_twins_bits(void **state)
{
    (void)state;
    enum { N = 301 };
    float a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = urand();
        b[i] = urand();
    }
    a[7] = 1.0f / 0.0f; /* one Inf for the non-finite check */
    float *da = upload(a, N), *db = upload(b, N);
    void *dh = NULL;
    assert_int_equal(g_sim->alloc(N * sizeof(uint16_t), &dh), PCS_OK);

    /* cast fp32 -> bf16 on the device; the reference is pcs/half.h's rounding */
    assert_int_equal(pcs_kernel_cast(g_sim, dh, PCS_DTYPE_BF16, db, PCS_DTYPE_FP32, N, NULL),
                     PCS_OK);
    uint16_t hb[N];
    assert_int_equal(g_sim->copy(hb, dh, sizeof hb, PCS_COPY_D2H, NULL), PCS_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(hb[i], pcs_f32_to_bf16(b[i]));

    /* the same sequence on the cpu backend over host copies */
    float ra[N], rb[N];
    memcpy(ra, a, sizeof a);
    memcpy(rb, b, sizeof b);
    assert_int_equal(pcs_kernel_scale(g_sim, db, PCS_DTYPE_FP32, N, 0.37f, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_scale(g_cpu, rb, PCS_DTYPE_FP32, N, 0.37f, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(g_sim, db, PCS_DTYPE_FP32, dh, PCS_DTYPE_BF16, N, NULL),
                     PCS_OK);
    assert_int_equal(pcs_kernel_accumulate(g_cpu, rb, PCS_DTYPE_FP32, hb, PCS_DTYPE_BF16, N, NULL),
                     PCS_OK);
    float out[N];
    download(out, db, N);
    assert_memory_equal(out, rb, sizeof rb);

    /* sum of squares into a device scalar */
    float *dsum = NULL, sum = -1, rsum = -2;
    assert_int_equal(g_sim->alloc(sizeof(float), (void **)&dsum), PCS_OK);
    assert_int_equal(pcs_kernel_sum_squares(g_sim, db, PCS_DTYPE_FP32, N, dsum, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_sum_squares(g_cpu, rb, PCS_DTYPE_FP32, N, &rsum, NULL), PCS_OK);
    download(&sum, dsum, 1);
    assert_memory_equal(&sum, &rsum, sizeof sum);
    assert_true(sum > 0);

    /* non-finite check + unscale: found_inf and inv_scale are device scalars */
    float *dfi = NULL, *dinv = NULL, fi = 0.0f, inv = 0.5f, rfi = 0.0f;
    assert_int_equal(g_sim->alloc(sizeof(float), (void **)&dfi), PCS_OK);
    assert_int_equal(g_sim->alloc(sizeof(float), (void **)&dinv), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, dfi, PCS_DTYPE_FP32, 1, 0.0, NULL), PCS_OK);
    assert_int_equal(g_sim->copy(dinv, &inv, sizeof inv, PCS_COPY_H2D, NULL), PCS_OK);
    pcs_tensor_t t = {da, PCS_DTYPE_FP32, N}, rt = {ra, PCS_DTYPE_FP32, N};
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(g_sim, &t, 1, dfi, dinv, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_nonfinite_check_and_unscale(g_cpu, &rt, 1, &rfi, &inv, NULL),
                     PCS_OK);
    download(&fi, dfi, 1);
    assert_true(fi == 1.0f && rfi == 1.0f);
    download(out, da, N);
    assert_memory_equal(out, ra, sizeof ra);

    /* AdamW on device shards, with an offset view into the buffers (pointer arithmetic) */
    a[7] = 0.25f;
    ra[7] = 0.25f;
    assert_int_equal(g_sim->copy(da, a, sizeof a, PCS_COPY_H2D, NULL), PCS_OK);
    memcpy(ra, a, sizeof a);
    float *dm = NULL, *dv = NULL, rm[N], rv[N];
    assert_int_equal(g_sim->alloc(sizeof rm, (void **)&dm), PCS_OK);
    assert_int_equal(g_sim->alloc(sizeof rv, (void **)&dv), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, dm, PCS_DTYPE_FP32, N, 0.0, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, dv, PCS_DTYPE_FP32, N, 0.0, NULL), PCS_OK);
    memset(rm, 0, sizeof rm);
    memset(rv, 0, sizeof rv);
    pcs_adamw_config_t cfg;
    pcs_adamw_config_default(&cfg);
    pcs_tensor_t p = {da + 1, PCS_DTYPE_FP32, N - 1}, g = {db + 1, PCS_DTYPE_FP32, N - 1};
    pcs_tensor_t m = {dm + 1, PCS_DTYPE_FP32, N - 1}, v = {dv + 1, PCS_DTYPE_FP32, N - 1};
    pcs_tensor_t rp = {ra + 1, PCS_DTYPE_FP32, N - 1}, rg = {rb + 1, PCS_DTYPE_FP32, N - 1};
    pcs_tensor_t rmt = {rm + 1, PCS_DTYPE_FP32, N - 1}, rvt = {rv + 1, PCS_DTYPE_FP32, N - 1};
    assert_int_equal(pcs_kernel_adamw_update(g_sim, &p, &g, &m, &v, 1, &cfg, 1, NULL), PCS_OK);
    assert_int_equal(pcs_kernel_adamw_update(g_cpu, &rp, &rg, &rmt, &rvt, 1, &cfg, 1, NULL),
                     PCS_OK);
    download(out, da, N);
    assert_memory_equal(out, ra, sizeof ra);
    download(out, dv, N);
    assert_memory_equal(out, rv, sizeof rv);

    g_sim->free(da);
    g_sim->free(db);
    g_sim->free(dh);
    g_sim->free(dsum);
    g_sim->free(dfi);
    g_sim->free(dinv);
    g_sim->free(dm);
    g_sim->free(dv);
}

static void test_a_host_pointer_given_to_a_device_op_is_refused_with_its_name(void **state)
{
    (void)state;
    float h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, before[8];
    memcpy(before, h, sizeof h);
    assert_int_equal(pcs_kernel_scale(g_sim, h, PCS_DTYPE_FP32, 8, 2.0f, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "host memory"));
    assert_memory_equal(h, before, sizeof h);
    float *d = upload(h, 8);
    float hs = 0;
    assert_int_equal(pcs_kernel_sum_squares(g_sim, d, PCS_DTYPE_FP32, 8, &hs, NULL),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "out"));
    assert_int_equal(pcs_kernel_fill(g_sim, h, PCS_DTYPE_FP32, 8, 0.0, NULL), PCS_ERR_INVALID_ARG);
    pcs_tensor_t t[2] = {{d, PCS_DTYPE_FP32, 8}, {h, PCS_DTYPE_FP32, 8}};
    assert_int_equal(pcs_kernel_scale_list(g_sim, t, 2, 2.0f, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "t[1]"));
    /* an empty tensor is never read: any pointer is fine */
    t[1].n = 0;
    assert_int_equal(pcs_kernel_scale_list(g_sim, t, 2, 2.0f, NULL), PCS_OK);
    g_sim->free(d);
}

// ---- nn ops ----

static void test_nn_ops_on_device_pointers_give_the_cpu_ops_bits(void **state)
{
    (void)state;
    enum { R = 5, K = 12, NO = 7 };
    float x[R * K], w[NO * K], bias[NO];
    for (int i = 0; i < R * K; i++)
        x[i] = urand();
    for (int i = 0; i < NO * K; i++)
        w[i] = urand();
    for (int i = 0; i < NO; i++)
        bias[i] = urand();
    uint16_t wb[NO * K], bb[NO];
    for (int i = 0; i < NO * K; i++)
        wb[i] = pcs_f32_to_bf16(w[i]);
    for (int i = 0; i < NO; i++)
        bb[i] = pcs_f32_to_bf16(bias[i]);

    pcs_nn_t *sim = NULL, *ref = NULL;
    assert_int_equal(pcs_nn_create(g_sim, NULL, &sim), PCS_OK);
    assert_string_equal(pcs_nn_ops_name(pcs_nn_ops(sim)), "cuda");
    assert_true(pcs_nn_backend(sim) == g_sim);
    assert_int_equal(pcs_nn_create(g_cpu, NULL, &ref), PCS_OK);

    /* bf16 Linear forward + both backwards */
    void *dwb = NULL, *dbb = NULL, *dsaved = NULL;
    float *dx = upload(x, R * K), *dy = NULL, *ddx = NULL;
    assert_int_equal(g_sim->alloc(sizeof wb, &dwb), PCS_OK);
    assert_int_equal(g_sim->alloc(sizeof bb, &dbb), PCS_OK);
    assert_int_equal(g_sim->alloc(pcs_nn_linear_saved_bytes(K, NO), &dsaved), PCS_OK);
    assert_int_equal(g_sim->alloc(R * NO * sizeof(float), (void **)&dy), PCS_OK);
    assert_int_equal(g_sim->alloc(R * K * sizeof(float), (void **)&ddx), PCS_OK);
    assert_int_equal(g_sim->copy(dwb, wb, sizeof wb, PCS_COPY_H2D, NULL), PCS_OK);
    assert_int_equal(g_sim->copy(dbb, bb, sizeof bb, PCS_COPY_H2D, NULL), PCS_OK);
    float rsaved[NO * K], ry[R * NO], y[R * NO], rdx[R * K], gx[R * K];
    pcs_nn_linear_t l = {R, K, NO, PCS_DTYPE_BF16, dwb, dbb, dsaved};
    pcs_nn_linear_t rl = {R, K, NO, PCS_DTYPE_BF16, wb, bb, rsaved};
    assert_int_equal(pcs_nn_linear_fwd(sim, &l, dx, dy), PCS_OK);
    assert_int_equal(pcs_nn_linear_fwd(ref, &rl, x, ry), PCS_OK);
    download(y, dy, R * NO);
    assert_memory_equal(y, ry, sizeof ry);
    assert_int_equal(pcs_nn_linear_bwd_input(sim, &l, dy, ddx), PCS_OK);
    assert_int_equal(pcs_nn_linear_bwd_input(ref, &rl, ry, rdx), PCS_OK);
    download(gx, ddx, R * K);
    assert_memory_equal(gx, rdx, sizeof rdx);
    void *dgw = NULL;
    uint16_t gw[NO * K], rgw[NO * K];
    assert_int_equal(g_sim->alloc(sizeof gw, &dgw), PCS_OK);
    pcs_nn_grad_t g = {dgw, PCS_DTYPE_BF16, PCS_DTYPE_BF16, 0},
                  rg = {rgw, PCS_DTYPE_BF16, PCS_DTYPE_BF16, 0};
    assert_int_equal(pcs_nn_linear_bwd_params(sim, &l, dy, dx, &g, NULL), PCS_OK);
    assert_int_equal(pcs_nn_linear_bwd_params(ref, &rl, ry, x, &rg, NULL), PCS_OK);
    assert_int_equal(g_sim->copy(gw, dgw, sizeof gw, PCS_COPY_D2H, NULL), PCS_OK);
    assert_memory_equal(gw, rgw, sizeof rgw);

    /* BatchNorm training forward: running stats and num_batches_tracked live on the device */
    float rmean[K], rvar[K], save[4 * K], rsave[4 * K], nw[K], nb[K];
    for (int j = 0; j < K; j++) {
        rmean[j] = 0.0f;
        rvar[j] = 1.0f;
        nw[j] = urand();
        nb[j] = urand();
    }
    int64_t nbt = 0, rnbt = 0;
    float *dmean = upload(rmean, K), *dvar = upload(rvar, K), *dnw = upload(nw, K),
          *dnb = upload(nb, K), *dsave = NULL, *dny = NULL;
    int64_t *dnbt = NULL;
    assert_int_equal(g_sim->alloc(sizeof save, (void **)&dsave), PCS_OK);
    assert_int_equal(g_sim->alloc(R * K * sizeof(float), (void **)&dny), PCS_OK);
    assert_int_equal(g_sim->alloc(sizeof nbt, (void **)&dnbt), PCS_OK);
    assert_int_equal(pcs_kernel_fill(g_sim, dnbt, PCS_DTYPE_INT64, 1, 0.0, NULL), PCS_OK);
    const pcs_nn_norm_t f32bn = {.kind = PCS_NN_BATCHNORM,
                                 .rows = R,
                                 .dim = K,
                                 .dtype = PCS_DTYPE_FP32,
                                 .weight_dtype = PCS_DTYPE_FP32,
                                 .bias_dtype = PCS_DTYPE_FP32,
                                 .mean_dtype = PCS_DTYPE_FP32,
                                 .var_dtype = PCS_DTYPE_FP32,
                                 .training = 1};
    pcs_nn_norm_t np = f32bn, rnp = f32bn;
    np.weight = dnw;
    np.bias = dnb;
    np.save = dsave;
    np.running_mean = dmean;
    np.running_var = dvar;
    np.num_batches_tracked = dnbt;
    rnp.weight = nw;
    rnp.bias = nb;
    rnp.save = rsave;
    rnp.running_mean = rmean;
    rnp.running_var = rvar;
    rnp.num_batches_tracked = &rnbt;
    float ny[R * K], rny[R * K];
    assert_int_equal(pcs_nn_norm_fwd(sim, &np, dx, dny), PCS_OK);
    assert_int_equal(pcs_nn_norm_fwd(ref, &rnp, x, rny), PCS_OK);
    download(ny, dny, R * K);
    assert_memory_equal(ny, rny, sizeof rny);
    float m2[K];
    download(m2, dmean, K);
    assert_memory_equal(m2, rmean, sizeof rmean);
    assert_int_equal(g_sim->copy(&nbt, dnbt, sizeof nbt, PCS_COPY_D2H, NULL), PCS_OK);
    assert_int_equal(nbt, 1);
    assert_int_equal(rnbt, 1);

    /* a host array anywhere in an op is refused, naming the op and the argument */
    assert_int_equal(pcs_nn_add(sim, dy, dy, ry, R * NO, PCS_DTYPE_FP32), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "add"));
    l.bias = bb;
    assert_int_equal(pcs_nn_linear_fwd(sim, &l, dx, dy), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "bias"));
    np.num_batches_tracked = &nbt;
    assert_int_equal(pcs_nn_norm_fwd(sim, &np, dx, dny), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "num_batches_tracked"));
    l.bias = dbb;
    g.data = gw;
    assert_int_equal(pcs_nn_linear_bwd_params(sim, &l, dy, dx, &g, NULL), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "dweight"));
    /* and the cpu nn refuses the simulated backend (it is not "cpu") */
    const pcs_nn_ops_t *cpu_nn = NULL;
    pcs_nn_t *bad = NULL;
    assert_int_equal(pcs_nn_get("cpu", &cpu_nn), PCS_OK);
    assert_int_equal(pcs_nn_create_with(cpu_nn, g_sim, NULL, &bad), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_nn_create_with(pcs_nn_ops(sim), g_cpu, NULL, &bad), PCS_ERR_INVALID_ARG);

    void *bufs[] = {dwb, dbb, dsaved, dx, dy, ddx, dgw, dmean, dvar, dnw, dnb, dsave, dny, dnbt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        g_sim->free(bufs[i]);
    pcs_nn_destroy(sim);
    pcs_nn_destroy(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_selects_a_simulated_backend_named_cuda_with_one_device),
        cmocka_unit_test(test_without_the_switch_cuda_is_not_the_simulator),
        cmocka_unit_test(test_device_pointers_are_tagged_and_host_memory_is_not),
        cmocka_unit_test(test_host_store_through_a_device_pointer_faults),
        cmocka_unit_test(test_freeing_with_the_wrong_allocator_aborts),
        cmocka_unit_test(test_alloc_async_is_ordered_on_its_stream_and_another_stream_must_wait),
        cmocka_unit_test(test_free_async_runs_after_the_work_queued_before_it),
        cmocka_unit_test(test_copies_round_trip_and_a_kind_that_does_not_match_is_refused),
        cmocka_unit_test(test_fresh_buffers_hold_nan_bytes_not_zeros),
        cmocka_unit_test(test_pinned_copies_on_a_stream_complete_at_its_sync),
        cmocka_unit_test(test_ops_on_device_pointers_give_the_cpu_twins_bits),
        cmocka_unit_test(test_a_host_pointer_given_to_a_device_op_is_refused_with_its_name),
        cmocka_unit_test(test_nn_ops_on_device_pointers_give_the_cpu_ops_bits),
    };
    return cmocka_run_group_tests_name("devsim", tests, setup, NULL);
}
