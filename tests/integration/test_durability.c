/* Nothing acknowledged is lost (DESIGN.md §8, issue 11): a real pcs-coordinator with a SQLite
 * state file is SIGKILLed in the middle of bursts of SubmitJob and CancelJob calls from several
 * client threads, and restarted on the same file. Every submit that was answered OK must be there
 * after the restart, with its request id and job id (a resubmit is a duplicate of it), no job id
 * that was answered is ever handed to another request, and every cancel answered OK must have
 * left its job CANCELLED. A state directory on a full disk (a small tmpfs; needs root, skipped
 * otherwise) makes the coordinator answer UNAVAILABLE and go NOT_SERVING instead of acknowledging
 * what it cannot keep, start again after a crash, and serve again once there is space. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/pbtext.h"
#include "pcs/rpc.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "test_util.h"

#define THREADS  4
#define MAX_ACKS 60000
#define CALL_MS  3000
#define ROUNDS   3
#define BURST_MS 700 /* SIGKILL this long into a burst */

static const char spec_yaml[] = "name: durable\n"
                                "model:\n"
                                "  mlp: {input_dim: 8, hidden_dims: [16], output_dim: 4}\n"
                                "mesh:\n"
                                "  - {dim: dp_shard, size: 2}\n"
                                "training: {steps: 2, micro_batch_size: 2,"
                                " optimizer: {sgd: {lr: 0.1}}}\n"
                                "data: {synthetic: {seed: 1}}\n";

typedef struct ack {
    char rid[48];
    char job_id[24];
} ack_t;

typedef struct run {
    char *dir;
    char db[1100];
    pid_t pid;
    char addr[64];
    Pcs__V1__JobSpec *spec;
    /* what the coordinator answered OK, over every round */
    ack_t acks[MAX_ACKS];
    size_t n_acks;
    pthread_mutex_t mu;
    volatile int stop;
    int round;
} run_t;

static void start_coord(run_t *r, const char *extra)
{
    /* every cancelled job stays in the history: this test counts them all */
    const char *args[] = {"--db",      r->db, "--lease-ms", "600000", "--max-finished-jobs",
                          "10000000", extra,   NULL};
    r->pid = pcs_test_start_coordinator(r->dir, args, r->addr, sizeof r->addr);
    assert_true(r->pid > 0);
}

static void kill_coord(run_t *r)
{
    kill(r->pid, SIGKILL);
    int st;
    waitpid(r->pid, &st, 0);
    r->pid = -1;
}

static int call(pcs_rpc_client_t *c, const char *method, const void *req,
                const ProtobufCMessageDescriptor *d, void *resp)
{
    int code = -1;
    pcs_status_t st = pcs_rpc_call(c, method, req, d, CALL_MS, (ProtobufCMessage **)resp, &code);
    return st == PCS_OK ? 0 : (code > 0 ? code : 14);
}

static int submit(pcs_rpc_client_t *c, Pcs__V1__JobSpec *spec, const char *rid, char *job_id,
                  size_t n, int *duplicate)
{
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.spec = spec;
    req.request_id = (char *)rid;
    Pcs__V1__SubmitJobResponse *resp = NULL;
    int code = call(c, PCS_M_SUBMIT_JOB, &req, &pcs__v1__submit_job_response__descriptor, &resp);
    if (code == 0) {
        snprintf(job_id, n, "%s", resp->job->job_id);
        if (duplicate)
            *duplicate = resp->duplicate;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return code;
}

/* State and request id of a job (-1: not found or no answer). */
static int job_state(pcs_rpc_client_t *c, const char *job_id, char *rid, size_t n)
{
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)job_id;
    Pcs__V1__GetJobResponse *resp = NULL;
    if (call(c, PCS_M_GET_JOB, &req, &pcs__v1__get_job_response__descriptor, &resp) != 0)
        return -1;
    int state = (int)resp->job->state;
    if (rid)
        snprintf(rid, n, "%s", resp->job->request_id);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return state;
}

static void *submit_loop(void *arg)
{
    run_t *r = arg;
    static _Atomic int next_thread;
    int t = next_thread++;
    pcs_rpc_client_t *c = NULL;
    if (pcs_rpc_client_create(r->addr, &c) != PCS_OK)
        return NULL;
    for (int i = 0; !r->stop; i++) {
        char rid[48], job_id[24];
        snprintf(rid, sizeof rid, "r%d-t%d-%d", r->round, t, i);
        if (submit(c, r->spec, rid, job_id, sizeof job_id, NULL) != 0)
            continue;
        pthread_mutex_lock(&r->mu);
        if (r->n_acks < MAX_ACKS) {
            snprintf(r->acks[r->n_acks].rid, sizeof r->acks[0].rid, "%s", rid);
            snprintf(r->acks[r->n_acks].job_id, sizeof r->acks[0].job_id, "%s", job_id);
            r->n_acks++;
        }
        pthread_mutex_unlock(&r->mu);
    }
    pcs_rpc_client_destroy(c);
    return NULL;
}

/* Every acknowledged submit is there, with its request id; a resubmit is its duplicate; a new
 * submit gets an id no acknowledged submit had. */
static void check_acks(run_t *r)
{
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(r->addr, &c), PCS_OK);
    size_t lost = 0, wrong = 0;
    unsigned long max_id = 0;
    for (size_t i = 0; i < r->n_acks; i++) {
        char rid[64] = "";
        int state = job_state(c, r->acks[i].job_id, rid, sizeof rid);
        if (state < 0)
            lost++;
        else if (strcmp(rid, r->acks[i].rid) != 0)
            wrong++;
        unsigned long n = strtoul(r->acks[i].job_id + 4, NULL, 10);
        max_id = n > max_id ? n : max_id;
    }
    /* resubmits of a sample: the same job, a duplicate */
    for (size_t i = 0; i < r->n_acks; i += 1 + r->n_acks / 50) {
        char job_id[24];
        int dup = 0;
        assert_int_equal(submit(c, r->spec, r->acks[i].rid, job_id, sizeof job_id, &dup), 0);
        assert_true(dup);
        assert_string_equal(job_id, r->acks[i].job_id);
    }
    char rid[48], job_id[24];
    snprintf(rid, sizeof rid, "fresh-%d", r->round);
    assert_int_equal(submit(c, r->spec, rid, job_id, sizeof job_id, NULL), 0);
    fprintf(stderr,
            "round %d: %zu acknowledged submits, %zu lost, %zu with another request id; "
            "next id %s (highest acknowledged job-%lu)\n",
            r->round, r->n_acks, lost, wrong, job_id, max_id);
    assert_int_equal(lost, 0);
    assert_int_equal(wrong, 0);
    assert_true(strtoul(job_id + 4, NULL, 10) > max_id);
    pcs_rpc_client_destroy(c);
}

static run_t *run_new(const char *tag)
{
    run_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->dir = pcs_test_tmpdir(tag);
    snprintf(r->db, sizeof r->db, "%s/coordinator.db", r->dir);
    pthread_mutex_init(&r->mu, NULL);
    ProtobufCMessage *m = NULL;
    assert_int_equal(
        pcs_pb_from_yaml(spec_yaml, strlen(spec_yaml), &pcs__v1__job_spec__descriptor, &m), PCS_OK);
    r->spec = (Pcs__V1__JobSpec *)m;
    return r;
}

static void run_free(run_t *r)
{
    if (r->pid > 0)
        pcs_test_stop(r->pid, 5000);
    protobuf_c_message_free_unpacked(&r->spec->base, NULL);
    pthread_mutex_destroy(&r->mu);
    pcs_test_rmtree(r->dir);
    free(r->dir);
    free(r);
}

static void test_sigkill_during_submit_bursts_loses_no_acknowledged_submit(void **state)
{
    (void)state;
    run_t *r = run_new("durable-submit");
    start_coord(r, NULL);
    for (r->round = 1; r->round <= ROUNDS; r->round++) {
        pthread_t th[THREADS];
        r->stop = 0;
        for (int i = 0; i < THREADS; i++)
            assert_int_equal(pthread_create(&th[i], NULL, submit_loop, r), 0);
        pcs_test_sleep_ms(BURST_MS + 150 * r->round);
        kill_coord(r); /* mid-burst: some submits are in flight, some in a commit */
        r->stop = 1;
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        start_coord(r, NULL);
        check_acks(r);
    }
    assert_true(r->n_acks > 100); /* the bursts did reach the coordinator */
    run_free(r);
}

typedef struct cancel_arg {
    run_t *r;
    size_t first, step;
    char (*acked)[24];
    size_t *n_acked;
} cancel_arg_t;

static void *cancel_loop(void *arg)
{
    cancel_arg_t *a = arg;
    run_t *r = a->r;
    pcs_rpc_client_t *c = NULL;
    if (pcs_rpc_client_create(r->addr, &c) != PCS_OK)
        return NULL;
    for (size_t i = a->first; i < r->n_acks && !r->stop; i += a->step) {
        Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
        req.job_id = r->acks[i].job_id;
        req.reason = "burst";
        Pcs__V1__CancelJobResponse *resp = NULL;
        if (call(c, PCS_M_CANCEL_JOB, &req, &pcs__v1__cancel_job_response__descriptor, &resp) != 0)
            continue;
        int cancelled = resp->job->state == PCS__V1__JOB_STATE__JOB_STATE_CANCELLED;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        if (!cancelled)
            continue;
        pthread_mutex_lock(&r->mu);
        snprintf(a->acked[*a->n_acked], 24, "%s", r->acks[i].job_id);
        (*a->n_acked)++;
        pthread_mutex_unlock(&r->mu);
    }
    pcs_rpc_client_destroy(c);
    return NULL;
}

static void test_sigkill_during_cancel_bursts_loses_no_acknowledged_cancel(void **state)
{
    (void)state;
    run_t *r = run_new("durable-cancel");
    start_coord(r, NULL);
    /* jobs to cancel (no workers: they stay PENDING), acknowledged */
    r->round = 0;
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, submit_loop, r), 0);
    pcs_test_sleep_ms(1500);
    r->stop = 1;
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_true(r->n_acks > 50);
    static char acked[MAX_ACKS][24];
    size_t n_acked = 0;
    r->stop = 0;
    cancel_arg_t args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (cancel_arg_t){r, (size_t)i, THREADS, acked, &n_acked};
        assert_int_equal(pthread_create(&th[i], NULL, cancel_loop, &args[i]), 0);
    }
    pcs_test_sleep_ms(300); /* well before every job is cancelled */
    kill_coord(r);
    r->stop = 1;
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    start_coord(r, NULL);
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(r->addr, &c), PCS_OK);
    size_t back = 0;
    for (size_t i = 0; i < n_acked; i++)
        if (job_state(c, acked[i], NULL, 0) != PCS__V1__JOB_STATE__JOB_STATE_CANCELLED)
            back++;
    fprintf(stderr, "%zu acknowledged cancels of %zu jobs, %zu came back not CANCELLED\n", n_acked,
            r->n_acks, back);
    assert_true(n_acked > 0 && n_acked < r->n_acks); /* the kill did land mid-burst */
    assert_int_equal(back, 0);
    pcs_rpc_client_destroy(c);
    r->round = 99;
    check_acks(r); /* and no submit was lost either */
    run_free(r);
}

// ---- a full disk ----

static int serving(const char *addr)
{
    pcs_rpc_client_t *c = NULL;
    if (pcs_rpc_client_create(addr, &c) != PCS_OK)
        return -1;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "";
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    int code = call(c, PCS_M_HEALTH_CHECK, &req,
                    &grpc__health__v1__health_check_response__descriptor, &resp);
    int s = -1;
    if (code == 0) {
        s = resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    pcs_rpc_client_destroy(c);
    return s;
}

/* Fill the file system of `dir` (a tmpfs) to the last byte. */
static void fill(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static char block[4096];
    while (fwrite(block, 1, sizeof block, f) == sizeof block && fflush(f) == 0)
        ;
    while (fwrite(block, 1, 1, f) == 1 && fflush(f) == 0)
        ;
    fclose(f);
}

static void test_full_disk_is_unavailable_not_a_lost_ack_and_the_coordinator_restarts(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        skip(); /* mounting a tmpfs needs root */
        return;
    }
    run_t *r = run_new("durable-full");
    char mnt[900], filler[1000];
    snprintf(mnt, sizeof mnt, "%s/state", r->dir);
    assert_int_equal(mkdir(mnt, 0700), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=2m") != 0) {
        fprintf(stderr, "cannot mount a tmpfs (%s): skipped\n", strerror(errno));
        run_free(r);
        skip();
        return;
    }
    snprintf(r->db, sizeof r->db, "%s/coordinator.db", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    start_coord(r, NULL);
    pcs_rpc_client_t *c = NULL;
    assert_int_equal(pcs_rpc_client_create(r->addr, &c), PCS_OK);
    char job_id[24], rid[48];
    for (int i = 0; i < 20; i++) { /* some history before the disk fills */
        snprintf(rid, sizeof rid, "before-%d", i);
        assert_int_equal(submit(c, r->spec, rid, job_id, sizeof job_id, NULL), 0);
        snprintf(r->acks[r->n_acks].rid, sizeof r->acks[0].rid, "%s", rid);
        snprintf(r->acks[r->n_acks].job_id, sizeof r->acks[0].job_id, "%s", job_id);
        r->n_acks++;
    }
    assert_int_equal(serving(r->addr), 1);
    fill(filler);
    /* until a commit fails, answers may still come; after it, UNAVAILABLE and NOT_SERVING */
    int unavailable = 0, acked_full = 0;
    for (int i = 0; i < 5000 && unavailable < 20; i++) {
        snprintf(rid, sizeof rid, "full-%d", i);
        int code = submit(c, r->spec, rid, job_id, sizeof job_id, NULL);
        if (code == 0) {
            snprintf(r->acks[r->n_acks].rid, sizeof r->acks[0].rid, "%s", rid);
            snprintf(r->acks[r->n_acks].job_id, sizeof r->acks[0].job_id, "%s", job_id);
            r->n_acks++;
            acked_full++;
        } else {
            assert_int_equal(code, 14); /* UNAVAILABLE */
            unavailable++;
        }
    }
    fprintf(stderr, "disk full: %d submits refused with UNAVAILABLE, %d still acknowledged\n",
            unavailable, acked_full);
    assert_true(unavailable >= 20);
    assert_int_equal(serving(r->addr), 0);
    /* a crash while the disk is full: it starts again, and everything acknowledged is there */
    kill_coord(r);
    start_coord(r, NULL);
    r->round = 100;
    pcs_rpc_client_destroy(c);
    assert_int_equal(pcs_rpc_client_create(r->addr, &c), PCS_OK);
    for (size_t i = 0; i < r->n_acks; i++) {
        char got[64] = "";
        assert_true(job_state(c, r->acks[i].job_id, got, sizeof got) > 0);
        assert_string_equal(got, r->acks[i].rid);
    }
    /* space again: it serves again (the next commit works) */
    assert_int_equal(unlink(filler), 0);
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        snprintf(rid, sizeof rid, "after-%d", i);
        ok = submit(c, r->spec, rid, job_id, sizeof job_id, NULL) == 0;
        if (!ok)
            pcs_test_sleep_ms(50);
    }
    assert_true(ok);
    assert_int_equal(serving(r->addr), 1);
    pcs_rpc_client_destroy(c);
    pcs_test_stop(r->pid, 5000);
    r->pid = -1;
    umount2(mnt, MNT_DETACH);
    run_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_during_submit_bursts_loses_no_acknowledged_submit),
        cmocka_unit_test(test_sigkill_during_cancel_bursts_loses_no_acknowledged_cancel),
        cmocka_unit_test(test_full_disk_is_unavailable_not_a_lost_ack_and_the_coordinator_restarts),
    };
    return cmocka_run_group_tests_name("durability", tests, NULL, NULL);
}
