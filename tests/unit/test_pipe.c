/* The pipeline channels (worker/pipe.h) between two pp ranks in one process (a thread per rank,
 * real Gloo pairs over loopback, file KV store):
 *  - activations both ways in bf16 and fp32: a header on the first message of a key, the dtype
 *    remembered for the key's later messages, values exact, FIFO per channel;
 *  - a message of another element count than the one posted is INVALID_ARG naming both counts
 *    (a peer's bytes never overrun a buffer), and that failure fails every later call;
 *  - take without a post is STATE; a peer without a channel is INVALID_ARG;
 *  - abort wakes a take blocked on a message that never comes, long before its timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/kv.h"
#include "pcs/clock.h"
#include "model/model.h"
#include "pcs/pbtext.h"
#include "planner/plan.h"
#include "test_util.h"
#include "worker/pipe.h"

static Pcs__V1__Plan *pp_plan(void)
{
    static const char y[] =
        "name: pipe\n"
        "model: {mlp: {input_dim: 4, hidden_dims: [4, 4, 4, 4], output_dim: 2}}\n"
        "wrap: {module_class: [MLPBlock]}\n"
        "mesh: [{dim: pp, size: 2}]\n"
        "pipeline: {schedule: interleaved_1f1b, virtual_stages: 2}\n"
        "training: {steps: 1, micro_batch_size: 1, micro_batches: 2,"
        " optimizer: {sgd: {lr: 0.1}}}\n"
        "data: {synthetic: {seed: 1}}\n";
    ProtobufCMessage *m = NULL;
    assert_int_equal(pcs_pb_from_yaml(y, strlen(y), &pcs__v1__job_spec__descriptor, &m), PCS_OK);
    Pcs__V1__Plan *p = NULL;
    assert_int_equal(pcs_plan_build((Pcs__V1__JobSpec *)m, 2, &p), PCS_OK);
    protobuf_c_message_free_unpacked(m, NULL);
    return p;
}

typedef struct side {
    const Pcs__V1__Plan *plan;
    const char *dir;
    const char *tag;
    uint32_t rank;
    pcs_kv_t *kv; /* retained by the pipe's communicators: destroyed after it */
    pcs_pipe_t *pipe;
    pcs_status_t st;
    char err[512]; /* the thread's error text (pcs_last_error is per thread) */
} side_t;

static void *open_side(void *arg)
{
    side_t *s = arg;
    s->st = pcs_kv_file_create(s->dir, &s->kv);
    if (s->st != PCS_OK)
        return NULL;
    pcs_pipe_config_t c = {s->plan, s->rank, s->kv, s->tag, "127.0.0.1", 20000};
    s->st = pcs_pipe_create(&c, &s->pipe);
    if (s->st != PCS_OK)
        snprintf(s->err, sizeof s->err, "%s", pcs_last_error());
    return NULL;
}

/* Both ends of both pp ranks connected (each create blocks on the other). */
static void open_pair(const Pcs__V1__Plan *plan, const char *dir, const char *tag, side_t s[2])
{
    pthread_t th[2];
    for (uint32_t r = 0; r < 2; r++) {
        s[r] = (side_t){plan, dir, tag, r, NULL, NULL, PCS_OK, ""};
        pthread_create(&th[r], NULL, open_side, &s[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        if (s[r].st != PCS_OK)
            fail_msg("pp rank %d: %s", r, s[r].err);
}

static void close_side(side_t *s)
{
    pcs_pipe_destroy(s->pipe);
    pcs_kv_destroy(s->kv);
}

static void test_messages_keep_their_dtype_and_order(void **state)
{
    (void)state;
    Pcs__V1__Plan *plan = pp_plan();
    char *dir = pcs_test_tmpdir("pipe-order");
    side_t s[2];
    open_pair(plan, dir, "a-", s);
    /* rank 0 -> 1 activations: key 1 in bf16 (header, then without), key 3 in fp32 */
    float a[3] = {1.5f, -2.25f, 3.0f}, b[3] = {0.5f, 8.0f, -1.0f}, c[2] = {0.1f, 0.2f};
    assert_int_equal(pcs_pipe_send(s[0].pipe, PCS_PIPE_FWD, 1, a, 3, PCS_DTYPE_BF16, 1), PCS_OK);
    assert_int_equal(pcs_pipe_send(s[0].pipe, PCS_PIPE_FWD, 1, b, 3, PCS_DTYPE_BF16, 0), PCS_OK);
    assert_int_equal(pcs_pipe_send(s[0].pipe, PCS_PIPE_FWD, 1, c, 2, PCS_DTYPE_FP32, 1), PCS_OK);
    /* and a gradient back, 1 -> 0 */
    assert_int_equal(pcs_pipe_send(s[1].pipe, PCS_PIPE_BWD, 0, c, 2, PCS_DTYPE_FP16, 1), PCS_OK);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 3, 1, 1), PCS_OK);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 3, 1, 0), PCS_OK);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 2, 3, 1), PCS_OK);
    assert_int_equal(pcs_pipe_post(s[0].pipe, PCS_PIPE_BWD, 1, 2, 0, 1), PCS_OK);
    float got[3];
    pcs_dtype_t dt;
    assert_int_equal(pcs_pipe_take(s[1].pipe, PCS_PIPE_FWD, 0, got, 3, &dt), PCS_OK);
    assert_int_equal(dt, PCS_DTYPE_BF16);
    assert_memory_equal(got, a, sizeof a); /* exact in bf16 */
    assert_int_equal(pcs_pipe_take(s[1].pipe, PCS_PIPE_FWD, 0, got, 3, &dt), PCS_OK);
    assert_int_equal(dt, PCS_DTYPE_BF16);
    assert_memory_equal(got, b, sizeof b);
    assert_int_equal(pcs_pipe_take(s[1].pipe, PCS_PIPE_FWD, 0, got, 2, &dt), PCS_OK);
    assert_int_equal(dt, PCS_DTYPE_FP32);
    assert_memory_equal(got, c, sizeof c);
    assert_int_equal(pcs_pipe_take(s[0].pipe, PCS_PIPE_BWD, 1, got, 2, &dt), PCS_OK);
    assert_int_equal(dt, PCS_DTYPE_FP16);
    float c16[2];
    pcs_to_f32(c, PCS_DTYPE_FP32, 2, c16);
    pcs_round_to(c16, 2, PCS_DTYPE_FP16);
    assert_memory_equal(got, c16, sizeof c16);
    assert_int_equal(pcs_pipe_flush(s[0].pipe), PCS_OK);
    assert_int_equal(pcs_pipe_flush(s[1].pipe), PCS_OK);
    /* misuse: nothing posted; a key out of range */
    assert_int_equal(pcs_pipe_take(s[1].pipe, PCS_PIPE_FWD, 0, got, 3, &dt), PCS_ERR_STATE);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 3, 99, 1), PCS_ERR_INVALID_ARG);
    close_side(&s[0]);
    close_side(&s[1]);
    pcs_test_rmtree(dir);
    free(dir);
    pcs_plan_free(plan);
}

static void test_a_wrong_count_fails_cleanly_and_stays_failed(void **state)
{
    (void)state;
    Pcs__V1__Plan *plan = pp_plan();
    char *dir = pcs_test_tmpdir("pipe-count");
    side_t s[2];
    open_pair(plan, dir, "b-", s);
    float a[5] = {1, 2, 3, 4, 5}, got[5];
    pcs_dtype_t dt;
    assert_int_equal(pcs_pipe_send(s[0].pipe, PCS_PIPE_FWD, 1, a, 5, PCS_DTYPE_FP32, 1), PCS_OK);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 4, 1, 1), PCS_OK);
    assert_int_equal(pcs_pipe_take(s[1].pipe, PCS_PIPE_FWD, 0, got, 4, &dt),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "5 elements"));
    assert_non_null(strstr(pcs_last_error(), "4 elements"));
    /* every later call fails with it */
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 4, 1, 1), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_pipe_send(s[1].pipe, PCS_PIPE_BWD, 0, a, 4, PCS_DTYPE_FP32, 1),
                     PCS_ERR_INVALID_ARG);
    close_side(&s[1]); /* its channels were aborted: the sender does not hang */
    close_side(&s[0]);
    pcs_test_rmtree(dir);
    free(dir);
    pcs_plan_free(plan);
}

typedef struct taker {
    pcs_pipe_t *pipe;
    pcs_status_t st;
} taker_t;

static void *take_forever(void *arg)
{
    taker_t *t = arg;
    float got[3];
    pcs_dtype_t dt;
    t->st = pcs_pipe_take(t->pipe, PCS_PIPE_FWD, 0, got, 3, &dt);
    return NULL;
}

static void test_abort_wakes_a_blocked_take(void **state)
{
    (void)state;
    Pcs__V1__Plan *plan = pp_plan();
    char *dir = pcs_test_tmpdir("pipe-abort");
    side_t s[2];
    open_pair(plan, dir, "c-", s);
    assert_int_equal(pcs_pipe_post(s[1].pipe, PCS_PIPE_FWD, 0, 3, 1, 1), PCS_OK);
    taker_t tk = {s[1].pipe, PCS_OK};
    uint64_t t0 = pcs_now_ms();
    pthread_t th;
    pthread_create(&th, NULL, take_forever, &tk);
    pcs_test_sleep_ms(200);
    pcs_pipe_abort(s[1].pipe, "test abort");
    pthread_join(th, NULL);
    /* CANCELLED when the receive was waiting, STATE when the abort came first and the receive
     * found its communicator poisoned: either way well before the 20 s timeout */
    if (tk.st != PCS_ERR_CANCELLED && tk.st != PCS_ERR_STATE)
        fail_msg("take after abort: status %d", (int)tk.st);
    assert_true(pcs_now_ms() - t0 < 10000);
    close_side(&s[1]);
    close_side(&s[0]);
    pcs_test_rmtree(dir);
    free(dir);
    pcs_plan_free(plan);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages_keep_their_dtype_and_order),
        cmocka_unit_test(test_a_wrong_count_fails_cleanly_and_stays_failed),
        cmocka_unit_test(test_abort_wakes_a_blocked_take),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
