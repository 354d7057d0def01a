/* Unit tests of the coordinator's pure state machine (coordinator/coord.c): membership and
 * leases under a fake clock, gang start, job lifecycle, event queues and the rendezvous KV.
 * No network: the callbacks that server.c would implement are recorded here. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"

typedef struct wake {
    void *token;
    pcs_status_t st;
    char value[64];
    size_t len;
    int has_value;
} wake_t;

typedef struct fixture {
    pcs_fake_clock_t clock;
    pcs_coord_t *c;
    int payload_frees;
    int events_notified;
    wake_t wakes[16];
    int n_wakes;
    int job_changes;
    int worker_news;
} fixture_t;

static void free_payload(void *user, void *spec, void *plan)
{
    fixture_t *f = user;
    f->payload_frees++;
    free(spec);
    free(plan);
}

static void on_events(void *user, pcs_coord_worker_t *w)
{
    (void)w;
    ((fixture_t *)user)->events_notified++;
}

static void on_kv_wake(void *user, void *waiter, pcs_status_t st, const void *value, size_t len)
{
    fixture_t *f = user;
    assert_true(f->n_wakes < 16);
    wake_t *w = &f->wakes[f->n_wakes++];
    w->token = waiter;
    w->st = st;
    w->has_value = value != NULL;
    w->len = len;
    if (value)
        memcpy(w->value, value, len < sizeof w->value ? len : sizeof w->value);
}

static void on_job_change(void *user, const pcs_coord_job_t *j)
{
    (void)j;
    ((fixture_t *)user)->job_changes++;
}

static void on_worker_new(void *user, const pcs_coord_worker_t *w)
{
    (void)w;
    ((fixture_t *)user)->worker_news++;
}

static pcs_coord_config_t base_config(fixture_t *f)
{
    pcs_coord_config_t cfg = {
        .clock = &f->clock.clock,
        .heartbeat_interval_ms = 1000,
        .lease_ms = 10000,
        .kv_max_key_bytes = 16,
        .kv_max_value_bytes = 32,
        .kv_max_job_bytes = 100,
        .user = f,
        .free_payload = free_payload,
        .on_events = on_events,
        .on_kv_wake = on_kv_wake,
        .on_job_change = on_job_change,
        .on_worker_new = on_worker_new,
    };
    return cfg;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    pcs_fake_clock_init(&f->clock, 1000000);
    pcs_coord_config_t cfg = base_config(f);
    assert_int_equal(pcs_coord_create(&cfg, &f->c), PCS_OK);
    *state = f;
    return 0;
}

/* The fixture's coordinator again, with a progress watchdog of step_min_ms / first_ms. */
static void watchdog_config(fixture_t *f, uint32_t step_min_ms, uint32_t first_ms)
{
    pcs_coord_destroy(f->c);
    pcs_coord_config_t cfg = base_config(f);
    cfg.step_timeout_min_ms = step_min_ms;
    cfg.first_step_timeout_ms = first_ms;
    assert_int_equal(pcs_coord_create(&cfg, &f->c), PCS_OK);
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    pcs_coord_destroy(f->c);
    free(f);
    return 0;
}

static pcs_coord_worker_t *reg(fixture_t *f, const char *identity, bool *rereg)
{
    pcs_coord_register_t r = {.identity = identity, .host = "h", .pid = 42};
    pcs_coord_worker_t *w = NULL;
    bool rr = false;
    assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    if (rereg)
        *rereg = rr;
    return w;
}

static void reg_n(fixture_t *f, int n)
{
    char id[32];
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof id, "host-%d", (int)pcs_coord_max_worker(f->c) + 1);
        reg(f, id, NULL);
    }
}

/* Submit a job on a mesh; the payload is a malloc'd marker so that frees are counted. */
static pcs_status_t submit(fixture_t *f, const char *request_id, uint32_t n_dims,
                           const uint32_t *names, const uint32_t *sizes, pcs_coord_job_t **out)
{
    pcs_coord_job_desc_t d = {.name = "t",
                              .request_id = request_id,
                              .n_dims = n_dims,
                              .dim_name = names,
                              .dim_size = sizes,
                              .spec = malloc(8),
                              .plan = malloc(8),
                              .plan_hash = 0x1234};
    return pcs_coord_submit(f->c, &d, out);
}

static pcs_coord_job_t *submit_shard(fixture_t *f, uint32_t n, const char *request_id)
{
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {n};
    pcs_coord_job_t *j = NULL;
    assert_int_equal(submit(f, request_id, 1, names, sizes, &j), PCS_OK);
    return j;
}

/* Let `ms` pass with the loop running: a tick every 50 ms, as the server's loop does. (One jump
 * of the clock between two ticks is a stall of the coordinator itself: see the stall tests.) */
static void run_for(fixture_t *f, uint64_t ms)
{
    for (uint64_t t = 0; t < ms; t += 50) {
        f->clock.now += ms - t < 50 ? ms - t : 50;
        assert_int_equal(pcs_coord_tick(f->c), 0);
    }
}

/* run_for with workers w-1 .. w-<n> heartbeating every 100 ms, each naming the job its agent
 * still runs, as an agent does: the one it is ASSIGNED to, or the one it was told to stop (a
 * STOPPING worker leaves it only through left_job). */
static void run_alive(fixture_t *f, uint64_t ms, uint32_t n)
{
    for (uint64_t t = 0; t < ms; t += 100) {
        for (uint32_t k = 1; k <= n; k++) {
            pcs_coord_worker_t *w = pcs_coord_worker_by_number(f->c, k);
            if (!w)
                continue;
            const pcs_coord_job_t *j =
                w->job ? w->job
                       : (w->state == PCS_WORKER_STOPPING ? pcs_coord_job_by_number(f->c, w->stop_job)
                                                          : NULL);
            pcs_coord_heartbeat(f->c, w->id, j ? j->id : NULL, j ? j->generation : 0,
                                &(pcs_coord_worker_t *){NULL});
        }
        run_for(f, ms - t < 100 ? ms - t : 100);
    }
}

static pcs_coord_worker_t *worker(fixture_t *f, uint32_t number)
{
    pcs_coord_worker_t *w = pcs_coord_worker_by_number(f->c, number);
    assert_non_null(w);
    return w;
}

/* The agent of w-<number> left its job (its heartbeat names none): STOPPING -> IDLE (and at once
 * ASSIGNED when a pending job was waiting for it). */
static void left_job(fixture_t *f, uint32_t number)
{
    assert_int_equal(worker(f, number)->state, PCS_WORKER_STOPPING);
    assert_int_equal(
        pcs_coord_heartbeat(f->c, worker(f, number)->id, "", 0, &(pcs_coord_worker_t *){NULL}),
        PCS_OK);
    pcs_worker_state_t s = worker(f, number)->state;
    assert_true(s == PCS_WORKER_IDLE || s == PCS_WORKER_ASSIGNED);
}

// ---- membership ----

static void test_register_assigns_sequential_ids_and_reregister_keeps_id(void **state)
{
    fixture_t *f = *state;
    bool rr = true;
    pcs_coord_worker_t *a = reg(f, "pod-a", &rr);
    assert_false(rr);
    assert_string_equal(a->id, "w-1");
    pcs_coord_worker_t *b = reg(f, "pod-b", &rr);
    assert_string_equal(b->id, "w-2");
    pcs_coord_worker_t *a2 = reg(f, "pod-a", &rr);
    assert_true(rr);
    assert_ptr_equal(a, a2);
    assert_string_equal(a2->id, "w-1");
    assert_int_equal(a2->state, PCS_WORKER_IDLE);
    assert_int_equal(f->worker_news, 2);
    pcs_coord_counts_t cn;
    pcs_coord_counts(f->c, &cn);
    assert_int_equal(cn.workers[PCS_WORKER_IDLE], 2);
}

static void test_register_copies_devices_and_backends(void **state)
{
    fixture_t *f = *state;
    pcs_coord_device_t devs[2] = {{0, "cuda", "H100", 80ull << 30}, {1, "cuda", "H100", 1}};
    const char *backends[] = {"nccl", "gloo"};
    char ident[16] = "pod-x";
    pcs_coord_register_t r = {.identity = ident,
                              .host = "node1",
                              .pid = 7,
                              .devices = devs,
                              .n_devices = 2,
                              .backends = backends,
                              .n_backends = 2};
    pcs_coord_worker_t *w;
    bool rr;
    assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    ident[0] = 'X'; /* the coordinator must have copied the identity */
    assert_string_equal(w->identity, "pod-x");
    assert_int_equal(w->n_devices, 2);
    assert_string_equal(w->devices[0].name, "H100");
    assert_int_equal(w->devices[0].memory_bytes, 80ull << 30);
    assert_true(w->has_cuda);
    assert_int_equal(w->n_backends, 2);
    assert_string_equal(w->backends[1], "gloo");
    /* re-register with fewer devices replaces the list */
    strcpy(ident, "pod-x");
    r.n_devices = 1;
    r.devices = &devs[1];
    assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    assert_true(rr);
    assert_int_equal(w->n_devices, 1);
    assert_int_equal(w->devices[0].index, 1);
}

static void test_register_without_identity_is_invalid_arg(void **state)
{
    fixture_t *f = *state;
    pcs_coord_register_t r = {.identity = ""};
    pcs_coord_worker_t *w;
    bool rr;
    assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "identity: required");
    assert_int_equal(pcs_coord_max_worker(f->c), 0);
}

static void test_heartbeat_unknown_or_empty_worker_id_is_rejected(void **state)
{
    fixture_t *f = *state;
    pcs_coord_worker_t *w;
    reg(f, "a", NULL);
    assert_int_equal(pcs_coord_heartbeat(f->c, "", NULL, 0, &w), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "worker_id: required");
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-2", NULL, 0, &w), PCS_ERR_NOT_FOUND);
    assert_non_null(strstr(pcs_last_error(), "w-2"));
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-0", NULL, 0, &w), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1x", NULL, 0, &w), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-99999999999999", NULL, 0, &w), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
}

static void test_lease_expires_only_after_lease_ms_without_heartbeat(void **state)
{
    fixture_t *f = *state;
    pcs_coord_worker_t *a = reg(f, "a", NULL), *b = reg(f, "b", NULL), *w;
    f->clock.now += 6000;
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-2", NULL, 0, &w), PCS_OK); /* b renews at +6 s */
    f->clock.now += 4000;                                           /* a: exactly at the lease */
    pcs_coord_tick(f->c);
    assert_int_equal(a->state, PCS_WORKER_IDLE);
    f->clock.now += 1;
    pcs_coord_tick(f->c);
    assert_int_equal(a->state, PCS_WORKER_LOST);
    assert_int_equal(b->state, PCS_WORKER_IDLE);
    run_for(f, 6000);
    assert_int_equal(b->state, PCS_WORKER_LOST);
}

/* A coordinator that did not run (SIGSTOP, a frozen VM) read no heartbeats meanwhile: they wait
 * in its sockets. Its first tick after the stall must not expire the leases of workers that
 * sent them; a worker that really went away is still found a lease later. */
static void test_a_stalled_coordinator_renews_every_lease_instead_of_expiring_them(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 3);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    run_for(f, 1000);
    f->clock.now += 60000; /* a 60 s SIGSTOP */
    assert_int_equal(pcs_coord_tick(f->c), 60000);
    for (uint32_t n = 1; n <= 3; n++)
        assert_int_not_equal(worker(f, n)->state, PCS_WORKER_LOST);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    /* a gap of exactly half the lease is not a stall: leases keep running through it */
    f->clock.now += 5000;
    assert_int_equal(pcs_coord_tick(f->c), 0);
    /* w-1 and w-3 heartbeat from here on; w-2 (rank 1) never does */
    pcs_coord_worker_t *w;
    for (int i = 0; i < 60; i++) {
        assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
        assert_int_equal(pcs_coord_heartbeat(f->c, "w-3", NULL, 0, &w), PCS_OK);
        run_for(f, 100);
        if (worker(f, 2)->state == PCS_WORKER_LOST)
            break;
    }
    /* renewed at the stall's end, then 5000 + 5000 ms without a heartbeat */
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_LOST);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "worker w-2 (rank 1) lost"));
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_STOPPING); /* rank 0 must leave the job */
    assert_int_equal(worker(f, 3)->state, PCS_WORKER_IDLE);
    left_job(f, 1);
}

static void test_heartbeat_from_lost_worker_is_failed_precondition(void **state)
{
    fixture_t *f = *state;
    reg(f, "a", NULL);
    f->clock.now += 10001;
    pcs_coord_tick(f->c);
    pcs_coord_worker_t *w;
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_ERR_STATE);
    assert_string_equal(pcs_last_error(), "worker w-1 is LOST: re-register");
}

static void test_reregister_revives_lost_worker_as_idle_with_same_id(void **state)
{
    fixture_t *f = *state;
    reg(f, "a", NULL);
    f->clock.now += 20000;
    pcs_coord_tick(f->c);
    bool rr;
    pcs_coord_worker_t *w = reg(f, "a", &rr);
    assert_true(rr);
    assert_string_equal(w->id, "w-1");
    assert_int_equal(w->state, PCS_WORKER_IDLE);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
}

static void test_deregister_makes_worker_gone_and_is_idempotent(void **state)
{
    fixture_t *f = *state;
    pcs_coord_worker_t *w = reg(f, "a", NULL);
    assert_int_equal(pcs_coord_deregister(f->c, "w-1", "bye"), PCS_OK);
    assert_int_equal(w->state, PCS_WORKER_GONE);
    assert_int_equal(pcs_coord_deregister(f->c, "w-1", "bye"), PCS_OK);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_ERR_STATE);
    assert_string_equal(pcs_last_error(), "worker w-1 is GONE: re-register");
    assert_int_equal(pcs_coord_deregister(f->c, "w-7", NULL), PCS_ERR_NOT_FOUND);
}

// ---- jobs ----

static void test_job_stays_pending_until_enough_workers_then_gang_starts_fifo(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 3);
    pcs_coord_job_t *j = submit_shard(f, 4, NULL);
    assert_string_equal(j->id, "job-1");
    assert_int_equal(j->state, PCS_JOB_PENDING);
    assert_int_equal(j->generation, 0);
    assert_int_equal(f->events_notified, 0);
    reg(f, "late", NULL);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->generation, 1);
    assert_int_equal(j->world_size, 4);
    for (uint32_t r = 0; r < 4; r++) {
        pcs_coord_worker_t *w = worker(f, r + 1);
        assert_int_equal(j->rank_worker[r], r + 1); /* registration order */
        assert_int_equal(w->state, PCS_WORKER_ASSIGNED);
        assert_int_equal(w->rank, r);
        assert_ptr_equal(w->job, j);
        pcs_coord_event_t e;
        assert_true(pcs_coord_pop_event(f->c, w, &e));
        assert_int_equal(e.kind, PCS_EV_ASSIGNMENT);
        assert_int_equal(e.job, j->number);
        assert_int_equal(e.generation, 1);
        assert_int_equal(e.rank, r);
        assert_int_equal(e.seq, 1);
        assert_false(pcs_coord_pop_event(f->c, w, &e));
    }
    assert_int_equal(f->events_notified, 4);
}

static void test_gang_start_skips_lost_workers_and_uses_registration_order(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 3);
    f->clock.now += 9000;
    pcs_coord_worker_t *w;
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-3", NULL, 0, &w), PCS_OK);
    f->clock.now += 2000;
    pcs_coord_tick(f->c); /* w-2 lost */
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->rank_worker[0], 1);
    assert_int_equal(j->rank_worker[1], 3);
}

/* Gang start tells each rank its place among the job's ranks on its host and how many share it
 * (LOCAL_RANK / LOCAL_WORLD_SIZE): hosts a, b, a, b, a -> local ranks 0 0 1 1 2, sizes 3 2 3 2 3. */
static void test_gang_start_numbers_the_ranks_of_each_host(void **state)
{
    fixture_t *f = *state;
    const char *hosts[5] = {"a", "b", "a", "b", "a"};
    for (int i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "local-%d", i);
        pcs_coord_register_t r = {.identity = id, .host = hosts[i], .pid = 42};
        pcs_coord_worker_t *w = NULL;
        bool rr = false;
        assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    }
    pcs_coord_job_t *j = submit_shard(f, 5, NULL);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    const uint32_t want_rank[5] = {0, 0, 1, 1, 2}, want_size[5] = {3, 2, 3, 2, 3};
    for (uint32_t r = 0; r < 5; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(f->c, j->rank_worker[r]);
        assert_string_equal(w->host, hosts[r]);
        assert_int_equal(w->local_rank, want_rank[r]);
        assert_int_equal(w->local_size, want_size[r]);
    }
}

static void test_large_pending_job_does_not_block_smaller_one_behind_it(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 3);
    pcs_coord_job_t *big = submit_shard(f, 8, NULL);
    pcs_coord_job_t *small = submit_shard(f, 2, NULL);
    assert_int_equal(big->state, PCS_JOB_PENDING);
    assert_int_equal(small->state, PCS_JOB_RUNNING);
}

static void test_cuda_job_only_takes_workers_with_a_cuda_device(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2); /* cpu only */
    pcs_coord_device_t dev = {0, "cuda", "H100", 1};
    pcs_coord_register_t r = {.identity = "gpu-0", .devices = &dev, .n_devices = 1};
    pcs_coord_worker_t *g;
    bool rr;
    assert_int_equal(pcs_coord_register(f->c, &r, &g, &rr), PCS_OK);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {1};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes, .need_cuda = true};
    pcs_coord_job_t *j;
    assert_int_equal(pcs_coord_submit(f->c, &d, &j), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->rank_worker[0], g->number);
}

/* A job's transport must be offered: a GPU pod started with --coll nccl cannot take a Gloo job
 * (cpu jobs run over Gloo), a worker that states nothing is not filtered, and the transport
 * follows spec.collectives ("auto": nccl for cuda jobs). */
static void test_jobs_only_take_workers_offering_their_transport(void **state)
{
    fixture_t *f = *state;
    pcs_coord_device_t dev = {0, "cuda", "H100", 1};
    const char *const nccl_only[] = {"nccl"};
    const char *const both[] = {"nccl", "gloo"};
    pcs_coord_register_t r1 = {.identity = "gpu-nccl",
                               .devices = &dev,
                               .n_devices = 1,
                               .backends = nccl_only,
                               .n_backends = 1};
    pcs_coord_worker_t *w1, *w2;
    bool rr;
    assert_int_equal(pcs_coord_register(f->c, &r1, &w1, &rr), PCS_OK);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {1};
    pcs_coord_job_desc_t gloo_job = {
        .n_dims = 1, .dim_name = names, .dim_size = sizes, .transport = "gloo"};
    pcs_coord_job_t *j1;
    assert_int_equal(pcs_coord_submit(f->c, &gloo_job, &j1), PCS_OK);
    assert_int_equal(j1->state, PCS_JOB_PENDING); /* the nccl-only pod cannot run it */
    pcs_coord_register_t r2 = {
        .identity = "gpu-both", .devices = &dev, .n_devices = 1, .backends = both, .n_backends = 2};
    assert_int_equal(pcs_coord_register(f->c, &r2, &w2, &rr), PCS_OK);
    assert_int_equal(j1->state, PCS_JOB_RUNNING);
    assert_int_equal(j1->rank_worker[0], w2->number);
    /* the nccl job takes the nccl-only worker */
    pcs_coord_job_desc_t nccl_job = {
        .n_dims = 1, .dim_name = names, .dim_size = sizes, .need_cuda = true, .transport = "nccl"};
    pcs_coord_job_t *j2;
    assert_int_equal(pcs_coord_submit(f->c, &nccl_job, &j2), PCS_OK);
    assert_int_equal(j2->state, PCS_JOB_RUNNING);
    assert_int_equal(j2->rank_worker[0], w1->number);
    assert_string_equal(pcs_coord_job_transport("cuda", ""), "nccl");
    assert_string_equal(pcs_coord_job_transport("cuda", "auto"), "nccl");
    assert_string_equal(pcs_coord_job_transport("cuda", "gloo"), "gloo");
    assert_string_equal(pcs_coord_job_transport("cpu", NULL), "gloo");
    assert_string_equal(pcs_coord_job_transport("", "auto"), "gloo");
}

/* A job naming its program (spec.program) runs only on workers that registered as that
 * program; one naming none runs on any; a bad program name is refused at Register and at
 * submit. */
static void test_jobs_naming_a_program_only_take_workers_of_it(void **state)
{
    fixture_t *f = *state;
    pcs_coord_register_t plain = {.identity = "plain", .program = "pcs-worker"};
    pcs_coord_register_t silent = {.identity = "silent"}; /* an older worker: says nothing */
    pcs_coord_worker_t *w1, *w2, *w3;
    bool rr;
    assert_int_equal(pcs_coord_register(f->c, &plain, &w1, &rr), PCS_OK);
    assert_string_equal(w1->program, "pcs-worker");
    assert_int_equal(pcs_coord_register(f->c, &silent, &w2, &rr), PCS_OK);
    assert_string_equal(w2->program, "");
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {1};
    pcs_coord_job_desc_t torch_job = {
        .n_dims = 1, .dim_name = names, .dim_size = sizes, .program = "pcs.torch"};
    pcs_coord_job_t *j1;
    assert_int_equal(pcs_coord_submit(f->c, &torch_job, &j1), PCS_OK);
    assert_string_equal(j1->program, "pcs.torch");
    assert_int_equal(j1->state, PCS_JOB_PENDING); /* neither is a pcs.torch program */
    pcs_coord_register_t py = {.identity = "python-0", .program = "pcs.torch"};
    assert_int_equal(pcs_coord_register(f->c, &py, &w3, &rr), PCS_OK);
    assert_int_equal(j1->state, PCS_JOB_RUNNING);
    assert_int_equal(j1->rank_worker[0], w3->number);
    /* a job naming no program takes pcs-worker or a worker that said nothing, in registration
     * order, never a worker that asked for jobs by name */
    pcs_coord_job_desc_t any = {.n_dims = 1, .dim_name = names, .dim_size = sizes};
    pcs_coord_job_t *j2, *j2b, *j2c;
    assert_int_equal(pcs_coord_submit(f->c, &any, &j2), PCS_OK);
    assert_int_equal(j2->state, PCS_JOB_RUNNING);
    assert_int_equal(j2->rank_worker[0], w1->number);
    assert_int_equal(pcs_coord_submit(f->c, &any, &j2b), PCS_OK);
    assert_int_equal(j2b->state, PCS_JOB_RUNNING);
    assert_int_equal(j2b->rank_worker[0], w2->number);
    pcs_coord_register_t py2 = {.identity = "python-1", .program = "pcs.torch"};
    pcs_coord_worker_t *w5;
    assert_int_equal(pcs_coord_register(f->c, &py2, &w5, &rr), PCS_OK);
    assert_int_equal(pcs_coord_submit(f->c, &any, &j2c), PCS_OK);
    assert_int_equal(j2c->state, PCS_JOB_PENDING); /* the idle pcs.torch worker is not taken */
    pcs_coord_register_t bad = {.identity = "bad", .program = "a b"};
    pcs_coord_worker_t *w4;
    assert_int_equal(pcs_coord_register(f->c, &bad, &w4, &rr), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "program"));
    pcs_coord_job_desc_t bad_job = {
        .n_dims = 1, .dim_name = names, .dim_size = sizes, .program = "x/../y"};
    pcs_coord_job_t *j3;
    assert_int_equal(pcs_coord_submit(f->c, &bad_job, &j3), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "program"));
}

static void test_mesh_coords_are_row_major_in_the_given_order(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 12);
    /* (pp 2, dp_replicate 3, dp_shard 2): reference enumerates nested loops, innermost fastest */
    uint32_t names[3] = {PCS_MESH_PP, PCS_MESH_DP_REPLICATE, PCS_MESH_DP_SHARD};
    uint32_t sizes[3] = {2, 3, 2};
    pcs_coord_job_t *j;
    assert_int_equal(submit(f, NULL, 3, names, sizes, &j), PCS_OK);
    assert_int_equal(j->world_size, 12);
    uint32_t rank = 0, co[4];
    for (uint32_t a = 0; a < 2; a++)
        for (uint32_t b = 0; b < 3; b++)
            for (uint32_t s = 0; s < 2; s++, rank++) {
                pcs_mesh_coords(&j->mesh, rank, co);
                assert_int_equal(co[PCS_MESH_PP], a);
                assert_int_equal(co[PCS_MESH_DP_REPLICATE], b);
                assert_int_equal(co[PCS_MESH_DP_SHARD], s);
            }
    /* ("dp", "pp") order puts pipeline pairs on consecutive ranks */
    uint32_t names2[2] = {PCS_MESH_DP_SHARD, PCS_MESH_PP}, sizes2[2] = {2, 2};
    pcs_coord_job_t *j2;
    assert_int_equal(submit(f, NULL, 2, names2, sizes2, &j2), PCS_OK);
    pcs_mesh_coords(&j2->mesh, 1, co);
    assert_int_equal(co[PCS_MESH_PP], 1);
    assert_int_equal(co[PCS_MESH_DP_SHARD], 0);
    pcs_mesh_coords(&j2->mesh, 2, co);
    assert_int_equal(co[PCS_MESH_PP], 0);
    assert_int_equal(co[PCS_MESH_DP_SHARD], 1);
}

static void test_submit_with_bad_mesh_is_invalid_arg_and_frees_payload(void **state)
{
    fixture_t *f = *state;
    uint32_t names[2] = {PCS_MESH_DP_SHARD, PCS_MESH_PP}, sizes[2] = {4, 0};
    pcs_coord_job_t *j = (pcs_coord_job_t *)1;
    assert_int_equal(submit(f, NULL, 2, names, sizes, &j), PCS_ERR_INVALID_ARG);
    assert_null(j);
    assert_string_equal(pcs_last_error(), "mesh[1].size: must be >= 1");
    assert_int_equal(f->payload_frees, 1);
    assert_int_equal(submit(f, NULL, 0, names, sizes, &j), PCS_ERR_INVALID_ARG);
    uint32_t huge[2] = {65536, 65536};
    assert_int_equal(submit(f, NULL, 2, names, huge, &j), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "world size"));
    assert_int_equal(f->payload_frees, 3);
    assert_int_equal(pcs_coord_max_job(f->c), 0);
}

static void test_duplicate_request_id_finds_the_existing_job(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *j = submit_shard(f, 2, "req-1");
    assert_ptr_equal(pcs_coord_job_by_request(f->c, "req-1"), j);
    assert_null(pcs_coord_job_by_request(f->c, "req-2"));
    assert_null(pcs_coord_job_by_request(f->c, ""));
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    assert_null(pcs_coord_job_by_request(f->c, ""));
    assert_ptr_not_equal(j, k);
    pcs_coord_job_t *found;
    assert_int_equal(pcs_coord_lookup_job(f->c, "job-2", &found), PCS_OK);
    assert_ptr_equal(found, k);
    assert_int_equal(pcs_coord_lookup_job(f->c, "job-3", &found), PCS_ERR_NOT_FOUND);
    assert_int_equal(pcs_coord_lookup_job(f->c, "", &found), PCS_ERR_INVALID_ARG);
}

static void test_lost_worker_fails_running_job_naming_worker_and_rank(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 5);
    pcs_coord_job_t *j = submit_shard(f, 4, NULL);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    pcs_coord_event_t e;
    for (uint32_t n = 1; n <= 4; n++)
        assert_true(pcs_coord_pop_event(f->c, worker(f, n), &e));
    f->clock.now += 5000;
    pcs_coord_worker_t *w;
    for (uint32_t n = 1; n <= 5; n++)
        if (n != 3)
            assert_int_equal(pcs_coord_heartbeat(f->c, worker(f, n)->id, NULL, 0, &w), PCS_OK);
    f->clock.now += 5001;
    pcs_coord_tick(f->c);
    assert_int_equal(worker(f, 3)->state, PCS_WORKER_LOST);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(j->reason);
    assert_non_null(strstr(j->reason, "worker w-3 (rank 2) lost"));
    assert_true(j->finished_wall_ms >= j->started_wall_ms);
    for (uint32_t n = 1; n <= 4; n++) {
        w = worker(f, n);
        assert_null(w->job);
        assert_int_equal(w->state, n == 3 ? PCS_WORKER_LOST : PCS_WORKER_STOPPING);
        assert_true(pcs_coord_pop_event(f->c, w, &e));
        assert_int_equal(e.kind, PCS_EV_STOP);
        assert_int_equal(e.job, j->number);
        assert_non_null(strstr(e.reason, "w-3"));
    }
    assert_false(pcs_coord_pop_event(f->c, worker(f, 5), &e));
}

static void test_deregistered_worker_fails_its_running_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    assert_int_equal(pcs_coord_deregister(f->c, "w-2", "node drained"), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "worker w-2 (rank 1) deregistered: node drained"));
    left_job(f, 1);
}

static void test_reregister_from_new_pid_fails_running_job_but_same_pid_keeps_it(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2); /* pid 42 */
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    pcs_coord_job_t *next = submit_shard(f, 2, NULL);
    assert_int_equal(next->state, PCS_JOB_PENDING);
    bool rr;
    pcs_coord_worker_t *w;
    pcs_coord_register_t same = {.identity = "host-2", .pid = 42};
    assert_int_equal(pcs_coord_register(f->c, &same, &w, &rr), PCS_OK);
    assert_int_equal(w->state, PCS_WORKER_ASSIGNED); /* reconnect of the same process */
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    pcs_coord_register_t fresh = {.identity = "host-2", .pid = 43};
    assert_int_equal(pcs_coord_register(f->c, &fresh, &w, &rr), PCS_OK);
    assert_true(rr);
    assert_string_equal(w->id, "w-2");
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "worker w-2 (rank 1) restarted: re-registered from a new "
                                      "process (pid 42 -> 43)"));
    assert_int_equal(w->pid, 43);
    /* the restarted worker is IDLE at once (nothing of the old process runs); w-1 must first
     * leave the failed job, then the job queued behind starts on both */
    assert_int_equal(w->state, PCS_WORKER_IDLE);
    assert_int_equal(next->state, PCS_JOB_PENDING);
    left_job(f, 1);
    assert_int_equal(next->state, PCS_JOB_RUNNING);
    assert_int_equal(w->state, PCS_WORKER_ASSIGNED);
    assert_ptr_equal(w->job, next);
    assert_ptr_equal(worker(f, 1)->job, next);
}

/* A second cancel is idempotent (a client that got UNAVAILABLE retries and must see its own
 * result, not an error); no second STOP is queued. */
static void test_cancel_sends_stop_and_second_cancel_is_idempotent(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL), *out;
    pcs_coord_event_t e;
    assert_true(pcs_coord_pop_event(f->c, worker(f, 1), &e));
    assert_int_equal(pcs_coord_cancel(f->c, "job-1", "user request", &out), PCS_OK);
    assert_ptr_equal(out, j);
    assert_int_equal(j->state, PCS_JOB_CANCELLED);
    assert_string_equal(j->reason, "cancelled: user request");
    assert_true(pcs_coord_pop_event(f->c, worker(f, 1), &e));
    assert_int_equal(e.kind, PCS_EV_STOP);
    assert_int_equal(e.seq, 2);
    left_job(f, 1);
    assert_int_equal(pcs_coord_cancel(f->c, "job-1", "again", &out), PCS_OK);
    assert_ptr_equal(out, j);
    assert_string_equal(j->reason, "cancelled: user request"); /* the first cancel's */
    assert_false(pcs_coord_pop_event(f->c, worker(f, 1), &e));
    /* a pending job can be cancelled too */
    pcs_coord_job_t *p = submit_shard(f, 5, NULL);
    assert_int_equal(pcs_coord_cancel(f->c, p->id, NULL, &out), PCS_OK);
    assert_int_equal(p->state, PCS_JOB_CANCELLED);
    pcs_coord_counts_t cn;
    pcs_coord_counts(f->c, &cn);
    assert_int_equal(cn.jobs[PCS_JOB_CANCELLED], 2);
    assert_int_equal(cn.jobs[PCS_JOB_PENDING], 0);
}

static void test_freed_workers_start_the_next_pending_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *a = submit_shard(f, 2, NULL), *b = submit_shard(f, 2, NULL), *out;
    assert_int_equal(b->state, PCS_JOB_PENDING);
    assert_int_equal(pcs_coord_cancel(f->c, a->id, NULL, &out), PCS_OK);
    assert_int_equal(b->state, PCS_JOB_PENDING); /* until both workers left job a */
    left_job(f, 1);
    assert_int_equal(b->state, PCS_JOB_PENDING);
    left_job(f, 2);
    assert_int_equal(b->state, PCS_JOB_RUNNING);
    pcs_coord_event_t e;
    assert_true(pcs_coord_pop_event(f->c, worker(f, 1), &e)); /* assignment a */
    assert_true(pcs_coord_pop_event(f->c, worker(f, 1), &e)); /* stop a */
    assert_int_equal(e.kind, PCS_EV_STOP);
    assert_true(pcs_coord_pop_event(f->c, worker(f, 1), &e)); /* assignment b */
    assert_int_equal(e.kind, PCS_EV_ASSIGNMENT);
    assert_int_equal(e.job, b->number);
}

static void test_watch_started_requeues_current_assignment_once(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    pcs_coord_job_t *j = submit_shard(f, 1, NULL);
    pcs_coord_worker_t *w = worker(f, 1);
    pcs_coord_watch_started(f->c, w); /* still queued: nothing added */
    assert_int_equal(w->ev_len, 1);
    pcs_coord_event_t e;
    assert_true(pcs_coord_pop_event(f->c, w, &e));
    pcs_coord_watch_started(f->c, w); /* stream reconnected after delivery */
    assert_true(pcs_coord_pop_event(f->c, w, &e));
    assert_int_equal(e.kind, PCS_EV_ASSIGNMENT);
    assert_int_equal(e.job, j->number);
    assert_int_equal(e.seq, 2);
    pcs_coord_worker_t *idle = reg(f, "idle", NULL);
    pcs_coord_watch_started(f->c, idle);
    assert_int_equal(idle->ev_len, 0);
}

static void test_event_queue_drops_oldest_when_full(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    pcs_coord_job_t *out;
    for (int i = 0; i < PCS_COORD_EVENT_QUEUE; i++) {
        pcs_coord_job_t *j = submit_shard(f, 1, NULL);
        assert_int_equal(pcs_coord_cancel(f->c, j->id, NULL, &out), PCS_OK);
        left_job(f, 1);
    }
    pcs_coord_worker_t *w = worker(f, 1);
    assert_int_equal(w->ev_len, PCS_COORD_EVENT_QUEUE);
    pcs_coord_event_t e;
    assert_true(pcs_coord_pop_event(f->c, w, &e));
    assert_int_equal(e.seq, PCS_COORD_EVENT_QUEUE + 1); /* 2 events per job; first half gone */
}

static void test_reports_done_from_all_ranks_succeed_the_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    int dir = -1;
    char why[128];
    pcs_coord_report_t r = {.worker_id = "w-1",
                            .job_id = "job-1",
                            .generation = 1,
                            .rank = 0,
                            .step = 3,
                            .loss = 0.5,
                            .audit_ok = true};
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, 0);
    assert_int_equal(j->progress.step, 3);
    assert_true(j->progress.loss == 0.5);
    r.worker_id = "w-2", r.rank = 1, r.done = true, r.audit_ok = false, r.loss = 9;
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_false(j->progress.audit_ok);
    assert_true(j->progress.loss == 0.5); /* loss is rank 0's */
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK); /* again */
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    r.worker_id = "w-1", r.rank = 0;
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_SUCCEEDED);
    pcs_coord_job_t *out = NULL; /* a finished job cannot be cancelled */
    assert_int_equal(pcs_coord_cancel(f->c, "job-1", NULL, &out), PCS_ERR_STATE);
    assert_string_equal(pcs_last_error(), "job job-1 is already SUCCEEDED");
    assert_int_equal(j->state, PCS_JOB_SUCCEEDED);
    assert_int_equal(j->progress.reports, 3); /* the repeat was a retry: counted once */
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_IDLE);
    /* a late report gets a STOP directive, not an error */
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, PCS_EV_STOP);
    assert_non_null(strstr(why, "SUCCEEDED"));
}

static int send_report(fixture_t *f, const pcs_coord_report_t *r)
{
    int dir = -1;
    char why[512];
    assert_int_equal(pcs_coord_report_step(f->c, r, &dir, why, sizeof why), PCS_OK);
    return dir;
}

/* Issue 11: a survivor reports that rank 1 died. The reason names the dead rank first; the
 * reporter, whose loop over the job has ended, is IDLE at once; the dead rank's worker stays
 * STOPPING (it never confirms), so the next job runs on the reporter and the spare, never on it;
 * its lease then makes it LOST. The error report counts as no step: progress, loss and the audit
 * keep the last real step. */
static void test_a_worker_a_peer_saw_die_is_never_given_the_next_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 3);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    pcs_coord_report_t ok = {.worker_id = "w-1",
                             .job_id = j->id,
                             .generation = 1,
                             .rank = 0,
                             .step = 4,
                             .loss = 0.25,
                             .step_ms = 12,
                             .audit_ok = true};
    assert_int_equal(send_report(f, &ok), 0);
    pcs_coord_report_t err = {.worker_id = "w-1",
                              .job_id = j->id,
                              .generation = 1,
                              .rank = 0,
                              .step = 5,
                              .error = "rank 0: all-gather of unit 1: peer rank 1 closed the "
                                       "connection (process died?)",
                              .peer_fault = 1,
                              .peer_rank = 1};
    assert_int_equal(send_report(f, &err), PCS_EV_STOP);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "rank 1 (worker w-2) died; reported by rank 0 (worker w-1) at "
                                   "step 5: rank 0: all-gather of unit 1: peer rank 1 closed the "
                                   "connection (process died?)");
    assert_int_equal(j->progress.step, 4);
    assert_true(j->progress.loss == 0.25);
    assert_true(j->progress.step_ms == 12);
    assert_int_equal(j->progress.reports, 1);
    assert_true(j->progress.audit_ok);
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_IDLE);
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_STOPPING);
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    assert_int_equal(k->state, PCS_JOB_RUNNING);
    assert_int_equal(k->rank_worker[0], 1);
    assert_int_equal(k->rank_worker[1], 3);
    run_alive(f, 10100, 1); /* w-3 is silent too, but ASSIGNED: LOST as well */
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_LOST);
    /* a silent peer reads "made no progress" */
    reg(f, "host-2", NULL);
    reg(f, "host-3", NULL);
    pcs_coord_job_t *m = submit_shard(f, 2, NULL);
    assert_int_equal(m->state, PCS_JOB_RUNNING);
    /* read before the job ends: a finished job keeps no rank map */
    const char *w0 = pcs_coord_worker_by_number(f->c, m->rank_worker[0])->id;
    pcs_coord_report_t silent = {.worker_id = pcs_coord_worker_by_number(f->c, m->rank_worker[1])->id,
                                 .job_id = m->id,
                                 .generation = 1,
                                 .rank = 1,
                                 .step = 2,
                                 .error = "timeout",
                                 .peer_fault = 2,
                                 .peer_rank = 0};
    assert_int_equal(send_report(f, &silent), PCS_EV_STOP);
    char want[200];
    snprintf(want, sizeof want,
             "rank 0 (worker %s) made no progress; reported by rank 1 (worker %s) at step 2: "
             "timeout",
             w0, silent.worker_id);
    assert_string_equal(m->reason, want);
}

/* STOPPING ends only when the worker shows it left the job: not by a heartbeat that still names
 * it, nor by a progress report of it, nor by a reconnect of the same process; by a heartbeat
 * naming no job, by its final report, or by a Register from a new process. */
static void test_a_stopping_worker_is_idle_only_once_it_left_the_job(void **state)
{
    fixture_t *f = *state;
    pcs_coord_worker_t *w;
    bool rr;
    for (int i = 1; i <= 2; i++) {
        char id[16];
        snprintf(id, sizeof id, "host-%d", i);
        pcs_coord_register_t r = {.identity = id, .pid = 1, .incarnation = 100 + (uint64_t)i};
        assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    }
    pcs_coord_job_t *j = submit_shard(f, 2, NULL), *out;
    assert_int_equal(pcs_coord_cancel(f->c, j->id, NULL, &out), PCS_OK);
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    assert_int_equal(k->state, PCS_JOB_PENDING);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", j->id, 1, &w), PCS_OK);
    assert_int_equal(w->state, PCS_WORKER_STOPPING); /* still in its loop over job-1 */
    pcs_coord_report_t prog = {.worker_id = "w-1", .job_id = j->id, .generation = 1, .step = 9};
    assert_int_equal(send_report(f, &prog), PCS_EV_STOP);
    assert_int_equal(w->state, PCS_WORKER_STOPPING);
    pcs_coord_register_t again = {.identity = "host-1", .pid = 1, .incarnation = 101};
    assert_int_equal(pcs_coord_register(f->c, &again, &w, &rr), PCS_OK);
    assert_int_equal(w->state, PCS_WORKER_STOPPING); /* a reconnect of the same process */
    pcs_coord_report_t fin = {
        .worker_id = "w-1", .job_id = j->id, .generation = 1, .step = 9, .error = "aborted"};
    assert_int_equal(send_report(f, &fin), PCS_EV_STOP);
    assert_int_equal(w->state, PCS_WORKER_IDLE);
    assert_int_equal(k->state, PCS_JOB_PENDING);
    /* host-2 restarted (same pid 1, as in every container; a new incarnation) */
    pcs_coord_register_t restarted = {.identity = "host-2", .pid = 1, .incarnation = 999};
    assert_int_equal(pcs_coord_register(f->c, &restarted, &w, &rr), PCS_OK);
    assert_int_equal(k->state, PCS_JOB_RUNNING);
    assert_int_equal(w->state, PCS_WORKER_ASSIGNED);
    /* and the same incarnation rule finds a restart of an ASSIGNED worker with pid 1 */
    pcs_coord_register_t again2 = {.identity = "host-2", .pid = 1, .incarnation = 1000};
    assert_int_equal(pcs_coord_register(f->c, &again2, &w, &rr), PCS_OK);
    assert_int_equal(k->state, PCS_JOB_FAILED);
    assert_non_null(strstr(k->reason, "worker w-2 (rank 1) restarted"));
    /* a STOPPING worker that goes silent is LOST after its lease */
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_STOPPING);
    run_alive(f, 10100, 0);
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_LOST);
}

/* A worker silent for more than half a lease (SIGSTOPped, partitioned) is not given a job it
 * would only fail a lease later; it is again once it heartbeats. */
static void test_an_idle_worker_silent_for_half_a_lease_is_not_scheduled(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    run_for(f, 3000);
    pcs_coord_worker_t *w;
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
    run_for(f, 2100); /* w-2: 5100 ms silent */
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &w), PCS_OK);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    assert_int_equal(j->state, PCS_JOB_PENDING);
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_IDLE);
    assert_int_equal(pcs_coord_heartbeat(f->c, "w-2", NULL, 0, &w), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
}

static void step_report(fixture_t *f, const char *worker_id, const pcs_coord_job_t *j, uint32_t rank,
                        uint64_t step, double step_ms)
{
    pcs_coord_report_t r = {.worker_id = worker_id,
                            .job_id = j->id,
                            .generation = j->generation,
                            .rank = rank,
                            .step = step,
                            .loss = 1,
                            .step_ms = step_ms,
                            .audit_ok = true};
    assert_int_equal(send_report(f, &r), 0);
}

/* Defaults: 10 step times, at least 300 s; 900 s for the first step. */
static void test_watchdog_defaults(void **state)
{
    fixture_t *f = *state;
    const pcs_coord_config_t *cc = pcs_coord_config(f->c);
    assert_int_equal(cc->step_timeout_factor, 10);
    assert_int_equal(cc->step_timeout_min_ms, 300000);
    assert_int_equal(cc->first_step_timeout_ms, 900000);
}

/* Rank 1's worker is paused: no reports, no heartbeats; rank 0 heartbeats but waits for it in a
 * collective, so it stops reporting too. Past the limit the job fails naming rank 1 first, as the
 * one that is silent altogether. Slow steps move the limit (10 x the step time). */
static void test_watchdog_fails_a_job_whose_ranks_stop_reporting_naming_the_silent_first(
    void **state)
{
    fixture_t *f = *state;
    watchdog_config(f, 5000, 60000);
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    for (uint64_t s = 1; s <= 5; s++) {
        step_report(f, "w-1", j, 0, s, 100);
        step_report(f, "w-2", j, 1, s, 100);
        run_alive(f, 100, 2);
    }
    run_alive(f, 4800, 1); /* 4.9 s since the last reports: within the limit */
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    run_alive(f, 1200, 1); /* a watchdog pass (once a second) past it */
    assert_int_equal(j->state, PCS_JOB_FAILED);
    const char *want_head = "no step report for over 5000 ms (10 x the 100.0 ms step time, at "
                            "least 5000 ms) from ranks 1 (worker w-2, no heartbeat for ";
    assert_memory_equal(j->reason, want_head, strlen(want_head));
    assert_non_null(strstr(j->reason, " ms), 0 (worker w-1, heartbeating); last step 5"));
    left_job(f, 1);
    left_job(f, 2);
    /* steps of 500 ms: the limit is max(5 s, 10 x 500 ms) */
    watchdog_config(f, 1000, 60000);
    reg_n(f, 2);
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    assert_int_equal(k->state, PCS_JOB_RUNNING);
    step_report(f, "w-1", k, 0, 1, 500);
    step_report(f, "w-2", k, 1, 1, 500);
    run_alive(f, 4900, 2);
    assert_int_equal(k->state, PCS_JOB_RUNNING);
    run_alive(f, 1200, 2);
    assert_int_equal(k->state, PCS_JOB_FAILED);
    assert_non_null(strstr(k->reason, "no step report for over 5000 ms (10 x the 500.0 ms"));
    assert_non_null(strstr(k->reason, "ranks 0 (worker w-1, heartbeating), 1 (worker w-2, "
                                      "heartbeating); last step 1"));
}

/* A job whose ranks never report (wedged while setting up) fails at the first-step deadline; a
 * rank that finished is not silent; a stall of the coordinator itself moves the deadlines. */
static void test_watchdog_first_step_deadline_finished_ranks_and_stalls(void **state)
{
    fixture_t *f = *state;
    watchdog_config(f, 2000, 8000);
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    run_alive(f, 7000, 2);
    f->clock.now += 20000; /* the coordinator stalled: no deadline passes for that */
    assert_int_equal(pcs_coord_tick(f->c), 20000);
    run_alive(f, 900, 2);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    run_alive(f, 1200, 2);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "no first step report within 8000 ms of the start from ranks 0 "
                                   "(worker w-1, heartbeating), 1 (worker w-2, heartbeating)");
    left_job(f, 1);
    left_job(f, 2);
    /* rank 0 finished (done) and waits for rank 1's last steps: only rank 1 can be silent */
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    step_report(f, "w-1", k, 0, 1, 10);
    pcs_coord_report_t done = {.worker_id = "w-1", .job_id = k->id, .generation = 1, .rank = 0,
                               .step = 2, .done = true};
    assert_int_equal(send_report(f, &done), 0);
    for (int i = 0; i < 10; i++) {
        step_report(f, "w-2", k, 1, 1 + (uint64_t)i, 10);
        run_alive(f, 500, 2);
    }
    assert_int_equal(k->state, PCS_JOB_RUNNING);
}

/* After a SIGSTOP the coordinator reads the reports that queued in its sockets before its first
 * tick sees the stall: those reports are fresh, and moving them forward by the stall would put
 * them in the future (the watchdog then read "silent for 2^64 ms" and failed a healthy job). */
static void test_reports_read_before_the_stall_tick_are_not_moved_into_the_future(void **state)
{
    fixture_t *f = *state;
    watchdog_config(f, 5000, 60000);
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    step_report(f, "w-1", j, 0, 1, 10);
    step_report(f, "w-2", j, 1, 1, 10);
    run_alive(f, 1000, 2);
    f->clock.now += 30000; /* a 30 s SIGSTOP; then the queued reports are read first */
    step_report(f, "w-1", j, 0, 2, 10);
    step_report(f, "w-2", j, 1, 2, 10);
    assert_int_equal(pcs_coord_tick(f->c), 30000);
    for (uint64_t s = 3; s <= 12; s++) {
        run_alive(f, 400, 2);
        assert_int_equal(j->state, PCS_JOB_RUNNING);
        step_report(f, "w-1", j, 0, s, 10);
        step_report(f, "w-2", j, 1, s, 10);
    }
    /* and the watchdog still works after it: silence past the limit fails the job */
    run_alive(f, 6200, 2);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "no step report for over 5000 ms"));
}

/* Issue 12: a rank's reports only move forward within a generation and stay within the job's
 * steps; `done` comes at the last step only. A retry of the last report is answered and counted
 * once. */
static void test_reports_follow_the_last_one_and_stay_within_the_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {.name = "t",
                              .n_dims = 1,
                              .dim_name = names,
                              .dim_size = sizes,
                              .spec = malloc(8),
                              .plan = malloc(8),
                              .steps = 20};
    pcs_coord_job_t *j = NULL;
    assert_int_equal(pcs_coord_submit(f->c, &d, &j), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    int dir;
    char why[256];
    pcs_coord_report_t r = {.worker_id = "w-1", .job_id = j->id, .generation = 1, .rank = 0,
                            .step = 5, .audit_ok = true};
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->progress.reports, 1);
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK); /* retry */
    assert_int_equal(j->progress.reports, 1);
    r.step = 4;
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_ERR_STATE);
    assert_string_equal(pcs_last_error(),
                        "step: 4 of rank 0 does not follow its last report (step 5)");
    r.step = 100000, r.done = true; /* a forged SUCCEEDED */
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "step: 100000 but job job-1 runs 20 steps");
    r.step = 6;
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "done: at step 6 but job job-1 ends at step 20");
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->progress.step, 5);
    /* an error may name any step */
    r.done = false, r.step = 3, r.error = "NaN";
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_FAILED);
}

/* Issue 12: a registration with a credential holds its identity while its lease runs: another
 * Register of it (another process, no secret, or a wrong one) is refused; the holder presenting
 * its secret keeps it, a certificate-proven identity takes it over, and once the lease lapsed a
 * new process gets a new secret. A lookup by secret finds only the current one. */
static void test_a_held_identity_is_taken_only_with_its_secret(void **state)
{
    fixture_t *f = *state;
    uint8_t s1[32], s2[32], s3[32], bad[32];
    memset(s1, 1, sizeof s1), memset(s2, 2, sizeof s2), memset(s3, 3, sizeof s3);
    memset(bad, 9, sizeof bad);
    pcs_coord_register_t r = {.identity = "pod-a", .host = "h", .pid = 10, .incarnation = 100,
                              .fresh = s1};
    pcs_coord_worker_t *w = NULL;
    bool rr, kept;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_OK);
    assert_false(kept);
    assert_ptr_equal(pcs_coord_worker_by_secret(f->c, "w-1", s1), w);
    assert_null(pcs_coord_worker_by_secret(f->c, "w-1", bad));
    assert_null(pcs_coord_worker_by_secret(f->c, "w-2", s1));
    /* another process, no secret / a wrong one: refused, and the holder is untouched */
    r.incarnation = 200, r.pid = 11, r.fresh = s2;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_ERR_STATE);
    assert_non_null(strstr(pcs_last_error(), "identity pod-a is held by worker w-1 (IDLE) for "
                                             "another 10000 ms"));
    r.presented = bad;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_ERR_STATE);
    assert_non_null(pcs_coord_worker_by_secret(f->c, "w-1", s1));
    assert_int_equal(pcs_coord_worker_by_number(f->c, 1)->incarnation, 100);
    /* the holder re-registering with its secret keeps it */
    r.incarnation = 100, r.pid = 10, r.presented = s1;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_OK);
    assert_true(rr && kept);
    assert_non_null(pcs_coord_worker_by_secret(f->c, "w-1", s1));
    /* an identity its client certificate proves takes over at once, with a new secret */
    r.incarnation = 300, r.presented = NULL, r.identity_proven = true, r.fresh = s3;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_OK);
    assert_false(kept);
    assert_null(pcs_coord_worker_by_secret(f->c, "w-1", s1));
    assert_non_null(pcs_coord_worker_by_secret(f->c, "w-1", s3));
    /* its lease lapses (LOST): a new process takes the identity without the old secret */
    f->clock.now += 10001;
    pcs_coord_tick(f->c);
    assert_int_equal(w->state, PCS_WORKER_LOST);
    r.incarnation = 400, r.identity_proven = false, r.fresh = s2;
    assert_int_equal(pcs_coord_register_ex(f->c, &r, &w, &rr, &kept), PCS_OK);
    assert_non_null(pcs_coord_worker_by_secret(f->c, "w-1", s2));
    assert_null(pcs_coord_worker_by_secret(f->c, "w-1", s3));
    /* a restored worker's identity is held for the re-adoption window (readopt = lease + 5 s) */
    assert_int_equal(pcs_coord_restore_worker(f->c, 7, "pod-r", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_secret(f->c, 7, s3), PCS_OK);
    pcs_coord_register_t q = {.identity = "pod-r", .host = "h", .pid = 5, .fresh = s1};
    assert_int_equal(pcs_coord_register_ex(f->c, &q, &w, &rr, &kept), PCS_ERR_STATE);
    q.presented = s3;
    assert_int_equal(pcs_coord_register_ex(f->c, &q, &w, &rr, &kept), PCS_OK);
    assert_true(kept);
    assert_int_equal(w->number, 7);
    assert_int_equal(w->state, PCS_WORKER_IDLE);
}

static uint32_t g_replan_world;
static pcs_status_t replan_cb(void *user, pcs_coord_job_t *j, uint32_t world, uint64_t *hash)
{
    fixture_t *f = user;
    g_replan_world = world;
    pcs_coord_job_set_plan(f->c, j, malloc(8)); /* the old plan goes to free_payload */
    *hash = 0x5000 + world;
    return PCS_OK;
}

/* The next event queued for worker n (0 kind when none). */
static pcs_coord_event_t next_ev(fixture_t *f, uint32_t n)
{
    pcs_coord_event_t e;
    memset(&e, 0, sizeof e);
    (void)pcs_coord_pop_event(f->c, worker(f, n), &e);
    return e;
}

/* Issue 13: an elastic job (max_restarts 2, min 2) whose rank dies restarts instead of failing:
 * every rank gets RESTART, the old generation is fenced (its reports get RESTART back, its KV is
 * closed), the survivors and a spare start generation 2 at the same world; without enough
 * workers it waits elastic_wait_ms, then starts smaller through replan; a failure past the budget
 * fails the job with every restart in its reason. */
static void test_an_elastic_job_restarts_within_its_budget(void **state)
{
    fixture_t *f = *state;
    pcs_coord_destroy(f->c);
    pcs_coord_config_t cfg = base_config(f);
    cfg.replan = replan_cb;
    cfg.elastic_wait_ms = 5000;
    assert_int_equal(pcs_coord_create(&cfg, &f->c), PCS_OK);
    reg_n(f, 5); /* 4 ranks and a spare */
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {4};
    pcs_coord_job_desc_t d = {.name = "e", .n_dims = 1, .dim_name = names, .dim_size = sizes,
                              .spec = malloc(8), .plan = malloc(8), .plan_hash = 0x4000,
                              .steps = 100, .max_restarts = 2, .min_workers = 2};
    pcs_coord_job_t *j = NULL;
    assert_int_equal(pcs_coord_submit(f->c, &d, &j), PCS_OK);
    assert_int_equal(j->generation, 1);
    for (uint32_t n = 1; n <= 5; n++)
        while (next_ev(f, n).kind) {
        }
    for (uint32_t r = 0; r < 4; r++)
        step_report(f, worker(f, r + 1)->id, j, r, 7, 10);
    /* rank 0 reports rank 2 died */
    int dir;
    char why[256];
    pcs_coord_report_t err = {.worker_id = "w-1", .job_id = j->id, .generation = 1, .rank = 0,
                              .step = 8, .error = "peer closed", .peer_fault = 1, .peer_rank = 2};
    assert_int_equal(pcs_coord_report_step(f->c, &err, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->restarts, 1);
    assert_int_equal(j->n_log, 1);
    assert_int_equal(j->log[0].step, 7);
    assert_non_null(strstr(j->log[0].cause, "rank 2 (worker w-3) died"));
    /* ranks 1 and 3 get RESTART; the dead one's too (it never confirms) */
    assert_int_equal(next_ev(f, 2).kind, PCS_EV_RESTART);
    assert_int_equal(next_ev(f, 3).kind, PCS_EV_RESTART);
    /* a late report of generation 1 is told to restart, not recorded */
    pcs_coord_report_t late = {.worker_id = "w-2", .job_id = j->id, .generation = 1, .rank = 1,
                               .step = 8, .audit_ok = true};
    assert_int_equal(pcs_coord_report_step(f->c, &late, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, PCS_EV_RESTART);
    assert_int_not_equal(pcs_coord_kv_set(f->c, j->id, 1, "k", "v", 1), PCS_OK);
    /* the reporter is IDLE at once; w-2 and w-4 confirm they left; w-3 (dead) never does, the
     * spare w-5 fills its place: generation 2 with 4 ranks, no replan */
    assert_int_equal(j->state, PCS_JOB_PENDING);
    left_job(f, 2);
    left_job(f, 4);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->generation, 2);
    assert_int_equal(j->world_size, 4);
    assert_int_equal(j->log[0].world_after, 4);
    assert_int_equal(g_replan_world, 0);
    for (uint32_t r = 0; r < 4; r++)
        assert_int_not_equal(j->rank_worker[r], 3);
    /* generation 2 loses a rank, no spare now (w-3 is away): the job waits for 4 workers for the
     * elastic wait, then restarts with the 3 it has */
    uint32_t dead = j->rank_worker[1];
    char dead_id[24];
    snprintf(dead_id, sizeof dead_id, "%s", worker(f, dead)->id);
    pcs_coord_report_t err2 = {.worker_id = worker(f, j->rank_worker[0])->id, .job_id = j->id,
                               .generation = 2, .rank = 0, .step = 12, .error = "peer closed",
                               .peer_fault = 1, .peer_rank = 1};
    assert_int_equal(pcs_coord_report_step(f->c, &err2, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->restarts, 2);
    for (uint32_t n = 1; n <= 5; n++)
        if (n != dead && n != 3 && worker(f, n)->state == PCS_WORKER_STOPPING)
            left_job(f, n);
    assert_int_equal(j->state, PCS_JOB_PENDING); /* 3 idle, waiting for a 4th */
    for (int t = 0; t < 51; t++) { /* the idle ones heartbeat through the elastic wait */
        for (uint32_t n = 1; n <= 5; n++)
            if (worker(f, n)->state == PCS_WORKER_IDLE)
                assert_int_equal(pcs_coord_heartbeat(f->c, worker(f, n)->id, "", 0,
                                                     &(pcs_coord_worker_t *){NULL}),
                                 PCS_OK);
        if (t == 45)
            assert_int_equal(j->state, PCS_JOB_PENDING); /* 4.5 s: still waiting */
        f->clock.now += 100;
        pcs_coord_tick(f->c);
    }
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->world_size, 3);
    assert_int_equal(g_replan_world, 3);
    assert_int_equal(j->plan_hash, 0x5003);
    assert_int_equal(j->log[1].world_before, 4);
    assert_int_equal(j->log[1].world_after, 3);
    /* the budget is spent: the next failure fails the job, listing the restarts */
    pcs_coord_report_t err3 = {.worker_id = worker(f, j->rank_worker[2])->id, .job_id = j->id,
                               .generation = 3, .rank = 2, .step = 14, .error = "NaN"};
    assert_int_equal(pcs_coord_report_step(f->c, &err3, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "failed at step 14: NaN; after 2 restarts (generation 1 at "
                                      "step 7: rank 2 (worker w-3) died"));
    if (!strstr(j->reason, "; generation 2 at step "))
        fail_msg("reason: %s", j->reason);
    (void)dead_id;
}

static void test_report_with_error_fails_the_job_with_reason(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    int dir;
    char why[256];
    pcs_coord_report_t r = {.worker_id = "w-2",
                            .job_id = j->id,
                            .generation = 1,
                            .rank = 1,
                            .step = 7,
                            .error = "NaN in loss"};
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, PCS_EV_STOP);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "rank 1 (worker w-2) failed at step 7: NaN in loss");
}

/* A reason is one line of valid UTF-8 whatever the worker sent: newlines become spaces, stray
 * bytes become '?', and the 300-byte truncation ends before a character it would cut. */
static void test_failure_reason_is_one_line_of_valid_utf8(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    int dir;
    char why[512];
    char err[400];
    memset(err, 'x', 299);
    memcpy(err + 299, "\xc3\xa9", 3); /* U+00E9 across the 300-byte cut */
    pcs_coord_report_t r = {
        .worker_id = "w-2", .job_id = j->id, .generation = 1, .rank = 1, .step = 7, .error = err};
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    size_t n = strlen(j->reason);
    assert_true(n > 300);
    /* the whole character is left out: no half of it, and no '?' standing in for it */
    assert_int_equal(j->reason[n - 1], 'x');
    assert_null(strchr(j->reason, '?'));
    assert_null(strchr(j->reason, '\xc3'));

    left_job(f, 1); /* w-2 sent the error: it left the job already */
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_IDLE);
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    pcs_coord_report_t r2 = {
        .worker_id = "w-2",
        .job_id = k->id,
        .generation = 1,
        .rank = 1,
        .step = 3,
        .error = "gloo:\n  read \xff\xfe failed\tcaf\xc3\xa9 \xe2\x82\xac \xed\xa0\x80"};
    assert_int_equal(pcs_coord_report_step(f->c, &r2, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(k->state, PCS_JOB_FAILED);
    assert_string_equal(k->reason, "rank 1 (worker w-2) failed at step 3: gloo:   read ?? failed "
                                   "caf\xc3\xa9 \xe2\x82\xac ???");
    assert_string_equal(why, k->reason); /* the directive's reason is the same line */
}

static void test_report_with_wrong_rank_or_generation_is_rejected_or_stopped(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    submit_shard(f, 2, NULL);
    int dir;
    char why[256];
    pcs_coord_report_t r = {.worker_id = "w-2", .job_id = "job-1", .generation = 1, .rank = 0};
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_ERR_INVALID_ARG);
    r.rank = 1, r.generation = 5;
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, PCS_EV_STOP);
    r.job_id = "job-9";
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_ERR_NOT_FOUND);
}

static void test_diverging_fingerprints_in_one_stage_fail_the_job_naming_both_ranks(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 4);
    /* (pp 2, dp_shard 2): ranks 0,1 are stage 0 and ranks 2,3 stage 1 */
    uint32_t names[2] = {PCS_MESH_PP, PCS_MESH_DP_SHARD}, sizes[2] = {2, 2};
    pcs_coord_job_t *j;
    assert_int_equal(submit(f, NULL, 2, names, sizes, &j), PCS_OK);
    int dir;
    char why[512];
    const uint64_t fp[4] = {0xaaa, 0xaaa, 0xbbb, 0xbbb}; /* stages differ: that is fine */
    for (uint32_t step = 1; step <= 3; step++)
        for (uint32_t r = 0; r < 4; r++) {
            pcs_coord_report_t rep = {.worker_id = worker(f, r + 1)->id,
                                      .job_id = j->id,
                                      .generation = 1,
                                      .rank = r,
                                      .step = step,
                                      .fingerprint = fp[r] + step,
                                      .audit_ok = true};
            assert_int_equal(pcs_coord_report_step(f->c, &rep, &dir, why, sizeof why), PCS_OK);
            assert_int_equal(dir, 0);
        }
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    pcs_coord_report_t rep = {.worker_id = "w-3",
                              .job_id = j->id,
                              .generation = 1,
                              .rank = 2,
                              .step = 4,
                              .fingerprint = 0x111};
    assert_int_equal(pcs_coord_report_step(f->c, &rep, &dir, why, sizeof why), PCS_OK);
    rep.fingerprint = 0; /* rank 3 gives no fingerprint: never compared */
    rep.worker_id = "w-4", rep.rank = 3;
    assert_int_equal(pcs_coord_report_step(f->c, &rep, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    rep.worker_id = "w-3", rep.rank = 2, rep.step = 5, rep.fingerprint = 0x555;
    assert_int_equal(pcs_coord_report_step(f->c, &rep, &dir, why, sizeof why), PCS_OK);
    rep.worker_id = "w-4", rep.rank = 3, rep.fingerprint = 0x222;
    assert_int_equal(pcs_coord_report_step(f->c, &rep, &dir, why, sizeof why), PCS_OK);
    assert_int_equal(dir, PCS_EV_STOP);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_non_null(strstr(j->reason, "ranks 2 (worker w-3) and 3 (worker w-4) ran different "
                                      "collective sequences at step 5"));
}

// ---- KV ----

static void test_kv_set_get_roundtrip_and_overwrite(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    submit_shard(f, 1, NULL);
    int found;
    const void *v;
    size_t len;
    assert_int_equal(pcs_coord_kv_get(f->c, "job-1", 1, "k", 0, NULL, &found, &v, &len), PCS_OK);
    assert_int_equal(found, 0);
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "k", "abc", 3), PCS_OK);
    assert_int_equal(pcs_coord_kv_get(f->c, "job-1", 1, "k", 0, NULL, &found, &v, &len), PCS_OK);
    assert_int_equal(found, 1);
    assert_int_equal(len, 3);
    assert_memory_equal(v, "abc", 3);
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "k", "xy", 2), PCS_OK);
    assert_int_equal(pcs_coord_kv_get(f->c, "job-1", 1, "k", 0, NULL, &found, &v, &len), PCS_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(v, "xy", 2);
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "empty", "", 0), PCS_OK);
    assert_int_equal(pcs_coord_kv_get(f->c, "job-1", 1, "empty", 0, NULL, &found, &v, &len),
                     PCS_OK);
    assert_int_equal(found, 1);
    assert_int_equal(len, 0);
}

/* kv_max_total_bytes caps the KV of all jobs together; a job's end gives its bytes back. */
static void test_kv_total_of_all_jobs_is_capped(void **state)
{
    fixture_t *f = *state;
    pcs_coord_destroy(f->c);
    pcs_coord_config_t cfg = base_config(f);
    cfg.kv_max_total_bytes = 150;
    assert_int_equal(pcs_coord_create(&cfg, &f->c), PCS_OK);
    reg_n(f, 3);
    pcs_coord_job_t *a = submit_shard(f, 1, NULL), *b = submit_shard(f, 1, NULL), *out;
    char val[32] = {0};
    assert_int_equal(pcs_coord_kv_set(f->c, a->id, 1, "k1", val, 30), PCS_OK); /* 32 */
    assert_int_equal(pcs_coord_kv_set(f->c, a->id, 1, "k2", val, 30), PCS_OK); /* 64 */
    assert_int_equal(pcs_coord_kv_set(f->c, b->id, 1, "k1", val, 30), PCS_OK); /* 96 */
    assert_int_equal(pcs_coord_kv_set(f->c, b->id, 1, "k2", val, 30), PCS_OK); /* 128 */
    assert_int_equal(pcs_coord_kv_set(f->c, b->id, 1, "k3", val, 30), PCS_ERR_LIMIT);
    assert_string_equal(pcs_last_error(), "KV of all jobs would hold 160 bytes, over the limit "
                                          "of 150 (kv-max-total-bytes)");
    assert_int_equal(pcs_coord_cancel(f->c, a->id, NULL, &out), PCS_OK); /* frees 64 */
    assert_int_equal(pcs_coord_kv_set(f->c, b->id, 1, "k3", val, 30), PCS_OK);
}

/* The history keeps the newest max_finished_jobs finished jobs: an older one is forgotten (freed,
 * on_job_forget, NOT_FOUND saying so, its request id free again), its number never reused; live
 * jobs are never forgotten, whatever their age. A finished job keeps no per-rank state. */
static int forgets;
static uint32_t forgot[8];
static void count_forget(void *user, uint32_t number)
{
    (void)user;
    forgot[forgets++ % 8] = number;
}

static void test_history_keeps_the_newest_finished_jobs(void **state)
{
    fixture_t *f = *state;
    pcs_coord_destroy(f->c);
    pcs_coord_config_t cfg = base_config(f);
    cfg.max_finished_jobs = 2;
    cfg.on_job_forget = count_forget;
    forgets = 0;
    assert_int_equal(pcs_coord_create(&cfg, &f->c), PCS_OK);
    reg_n(f, 1);
    pcs_coord_job_t *old_live = submit_shard(f, 5, "live"); /* pending all along */
    pcs_coord_job_t *out;
    char rid[16];
    for (int i = 0; i < 4; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        pcs_coord_job_t *j = submit_shard(f, 1, rid);
        assert_int_equal(pcs_coord_cancel(f->c, j->id, NULL, &out), PCS_OK);
        assert_null(j->rank_worker); /* no per-rank state in the history */
        assert_null(j->rank_report_ms);
        left_job(f, 1);
    }
    /* job-2 .. job-5 finished in that order: job-2 and job-3 are forgotten */
    assert_int_equal(forgets, 2);
    assert_int_equal(forgot[0], 2);
    assert_int_equal(forgot[1], 3);
    assert_null(pcs_coord_job_by_number(f->c, 2));
    assert_int_equal(pcs_coord_lookup_job(f->c, "job-2", &out), PCS_ERR_NOT_FOUND);
    assert_string_equal(pcs_last_error(), "job job-2: finished and forgotten (the history keeps "
                                          "the newest 2 finished jobs: max-finished-jobs)");
    assert_int_equal(pcs_coord_lookup_job(f->c, "job-9", &out), PCS_ERR_NOT_FOUND);
    assert_string_equal(pcs_last_error(), "job job-9: no such job");
    assert_int_equal(pcs_coord_lookup_job(f->c, "job-5", &out), PCS_OK);
    assert_ptr_equal(pcs_coord_job_by_number(f->c, 1), old_live); /* never forgotten */
    assert_null(pcs_coord_job_by_request(f->c, "r0"));
    assert_non_null(pcs_coord_job_by_request(f->c, "r3"));
    pcs_coord_job_t *again = submit_shard(f, 1, "r0");
    assert_string_equal(again->id, "job-6"); /* a new job, a new number */
    pcs_coord_counts_t cn;
    pcs_coord_counts(f->c, &cn);
    assert_int_equal(cn.jobs[PCS_JOB_CANCELLED], 2);
}

static void test_kv_limits_on_key_value_and_job_total(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    submit_shard(f, 1, NULL);
    char val[40] = {0};
    /* key limit 16 bytes */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "0123456789abcdef", "v", 1), PCS_OK);
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "0123456789abcdefg", "v", 1),
                     PCS_ERR_LIMIT);
    assert_non_null(strstr(pcs_last_error(), "key: 17 bytes exceeds the limit of 16"));
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "", "v", 1), PCS_ERR_INVALID_ARG);
    /* value limit 32 bytes */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "v", val, 32), PCS_OK);
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "v", val, 33), PCS_ERR_LIMIT);
    assert_non_null(strstr(pcs_last_error(), "value: 33 bytes"));
    /* job total 100 bytes (keys + values): 17 + 33 used so far */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "a", val, 32), PCS_OK); /* 83 */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "b", val, 30), PCS_ERR_LIMIT);
    assert_non_null(strstr(pcs_last_error(), "over the limit of 100"));
    /* overwriting an existing key counts only the difference */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "a", val, 10), PCS_OK); /* 61 */
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 1, "b", val, 30), PCS_OK); /* 92 */
}

static void test_kv_stale_generation_or_finished_job_is_failed_precondition(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    pcs_coord_job_t *j = submit_shard(f, 1, NULL), *out;
    assert_int_equal(pcs_coord_kv_set(f->c, "job-1", 2, "k", "v", 1), PCS_ERR_STATE);
    assert_non_null(strstr(pcs_last_error(), "generation 2 of job job-1 is not current (1)"));
    assert_int_equal(pcs_coord_kv_set(f->c, "job-2", 1, "k", "v", 1), PCS_ERR_NOT_FOUND);
    pcs_coord_job_t *pending = submit_shard(f, 3, NULL);
    assert_int_equal(pcs_coord_kv_set(f->c, pending->id, 0, "k", "v", 1), PCS_ERR_STATE);
    assert_int_equal(pcs_coord_kv_set(f->c, j->id, 1, "k", "v", 1), PCS_OK);
    assert_int_equal(pcs_coord_cancel(f->c, j->id, NULL, &out), PCS_OK);
    assert_int_equal(pcs_coord_kv_set(f->c, j->id, 1, "k", "v", 1), PCS_ERR_STATE);
    assert_null(j->kv); /* freed with the job's end */
}

static void test_kv_parked_get_is_woken_by_set_or_expires_in_tick(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    pcs_coord_job_t *j = submit_shard(f, 1, NULL);
    int found;
    const void *v;
    size_t len;
    int t1, t2, t3;
    assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, "k", 500, &t1, &found, &v, &len), PCS_OK);
    assert_int_equal(found, -1);
    assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, "other", 200, &t2, &found, &v, &len), PCS_OK);
    assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, "k", 1000, &t3, &found, &v, &len), PCS_OK);
    pcs_coord_kv_cancel(f->c, &t3); /* its caller went away: no callback */
    assert_int_equal(f->n_wakes, 0);
    assert_int_equal(pcs_coord_kv_set(f->c, j->id, 1, "k", "addr", 4), PCS_OK);
    assert_int_equal(f->n_wakes, 1);
    assert_ptr_equal(f->wakes[0].token, &t1);
    assert_int_equal(f->wakes[0].st, PCS_OK);
    assert_true(f->wakes[0].has_value);
    assert_memory_equal(f->wakes[0].value, "addr", 4);
    f->clock.now += 199;
    pcs_coord_tick(f->c);
    assert_int_equal(f->n_wakes, 1);
    f->clock.now += 1;
    pcs_coord_tick(f->c);
    assert_int_equal(f->n_wakes, 2);
    assert_ptr_equal(f->wakes[1].token, &t2);
    assert_int_equal(f->wakes[1].st, PCS_OK);
    assert_false(f->wakes[1].has_value);
    f->clock.now += 5000;
    pcs_coord_tick(f->c);
    assert_int_equal(f->n_wakes, 2); /* t3 was cancelled */
}

static void test_kv_parked_gets_are_capped_per_job(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 2);
    pcs_coord_job_t *j = submit_shard(f, 2, NULL);
    size_t limit = (size_t)PCS_COORD_KV_WAITERS_PER_RANK * 2 + 1024;
    char *tokens = calloc(limit + 1, 1);
    assert_non_null(tokens);
    int found;
    const void *v;
    size_t len;
    char key[32];
    for (size_t i = 0; i < limit; i++) {
        snprintf(key, sizeof key, "k%zu", i);
        assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, key, 1000, &tokens[i], &found, &v, &len),
                         PCS_OK);
        assert_int_equal(found, -1);
    }
    assert_int_equal(
        pcs_coord_kv_get(f->c, j->id, 1, "one-more", 1000, &tokens[limit], &found, &v, &len),
        PCS_ERR_LIMIT);
    assert_non_null(strstr(pcs_last_error(), "parked gets"));
    /* a key that exists is still answered at once, and a non-waiting get is never refused */
    assert_int_equal(pcs_coord_kv_set(f->c, j->id, 1, "k0", "x", 1), PCS_OK);
    assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, "absent", 0, NULL, &found, &v, &len), PCS_OK);
    assert_int_equal(found, 0);
    /* the woken get freed a slot */
    assert_int_equal(
        pcs_coord_kv_get(f->c, j->id, 1, "one-more", 1000, &tokens[limit], &found, &v, &len),
        PCS_OK);
    assert_int_equal(found, -1);
    for (size_t i = 1; i <= limit; i++)
        pcs_coord_kv_cancel(f->c, &tokens[i]);
    free(tokens);
}

static void test_kv_parked_get_fails_when_job_ends(void **state)
{
    fixture_t *f = *state;
    reg_n(f, 1);
    pcs_coord_job_t *j = submit_shard(f, 1, NULL), *out;
    int found, t;
    const void *v;
    size_t len;
    assert_int_equal(pcs_coord_kv_get(f->c, j->id, 1, "k", 5000, &t, &found, &v, &len), PCS_OK);
    assert_int_equal(pcs_coord_cancel(f->c, j->id, NULL, &out), PCS_OK);
    assert_int_equal(f->n_wakes, 1);
    assert_int_equal(f->wakes[0].st, PCS_ERR_STATE);
}

// ---- restore ----

static void test_restore_keeps_ids_and_new_ids_continue_after_them(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(pcs_coord_restore_worker(f->c, 5, "pod-5", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_worker(f->c, 5, "pod-x", "h"), PCS_ERR_EXISTS);
    bool rr;
    pcs_coord_worker_t *w = reg(f, "pod-5", &rr);
    assert_true(rr);
    assert_string_equal(w->id, "w-5");
    assert_int_equal(w->state, PCS_WORKER_IDLE);
    pcs_coord_worker_t *n = reg(f, "pod-new", &rr);
    assert_string_equal(n->id, "w-6");
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {
        .n_dims = 1, .dim_name = names, .dim_size = sizes, .request_id = "r9", .spec = malloc(4)};
    assert_int_equal(
        pcs_coord_restore_job(f->c, 3, &d, PCS_JOB_CANCELLED, "cancelled: x", 1, 2, 3, 1), PCS_OK);
    pcs_coord_job_t *j = pcs_coord_job_by_number(f->c, 3);
    assert_int_equal(j->state, PCS_JOB_CANCELLED);
    assert_string_equal(j->reason, "cancelled: x");
    assert_ptr_equal(pcs_coord_job_by_request(f->c, "r9"), j);
    pcs_coord_job_t *k = submit_shard(f, 2, NULL);
    assert_string_equal(k->id, "job-4");
    assert_int_equal(k->state, PCS_JOB_RUNNING);
}

/* Restore job-1 RUNNING (world 2, generation 3) with workers w-1, w-2 known from the store, and
 * re-register both (a coordinator restart while the job trains). */
static pcs_coord_job_t *restore_running(fixture_t *f)
{
    assert_int_equal(pcs_coord_restore_worker(f->c, 1, "pod-a", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_worker(f->c, 2, "pod-b", "h"), PCS_OK);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes};
    assert_int_equal(pcs_coord_restore_job(f->c, 1, &d, PCS_JOB_RUNNING, NULL, 1, 2, 0, 3), PCS_OK);
    pcs_coord_job_t *j = pcs_coord_job_by_number(f->c, 1);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(j->generation, 3);
    reg(f, "pod-a", NULL);
    reg(f, "pod-b", NULL);
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_IDLE);
    return j;
}

/* job-1 RUNNING (world 2, generation 3) restored with w-1 (pod-a) and w-2 (pod-b) still GONE. */
static pcs_coord_job_t *restore_running_no_rereg(fixture_t *f)
{
    assert_int_equal(pcs_coord_restore_worker(f->c, 1, "pod-a", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_worker(f->c, 2, "pod-b", "h"), PCS_OK);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes};
    assert_int_equal(pcs_coord_restore_job(f->c, 1, &d, PCS_JOB_RUNNING, NULL, 1, 2, 0, 3), PCS_OK);
    return pcs_coord_job_by_number(f->c, 1);
}

static int report(fixture_t *f, const char *worker_id, uint32_t rank, uint64_t step, bool done)
{
    pcs_coord_report_t r = {.worker_id = worker_id,
                            .job_id = "job-1",
                            .generation = 3,
                            .rank = rank,
                            .step = step,
                            .done = done};
    int dir = -1;
    char why[256];
    assert_int_equal(pcs_coord_report_step(f->c, &r, &dir, why, sizeof why), PCS_OK);
    return dir;
}

/* DESIGN.md: after a coordinator restart, workers reconnect and carry on without losing a step. */
static void test_restored_running_job_takes_its_ranks_back_from_reports(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *j = restore_running(f);
    assert_int_equal(report(f, "w-2", 0, 40, false), 0); /* no STOP: the rank is taken back */
    assert_int_equal(worker(f, 2)->state, PCS_WORKER_ASSIGNED);
    assert_ptr_equal(worker(f, 2)->job, j);
    assert_int_equal(worker(f, 2)->rank, 0);
    /* a rank already taken is not given to another worker */
    reg(f, "pod-c", NULL);
    assert_int_equal(report(f, "w-3", 0, 40, false), PCS_EV_STOP);
    assert_null(worker(f, 3)->job);
    assert_int_equal(report(f, "w-1", 1, 41, false), 0);
    assert_int_equal(worker(f, 1)->rank, 1);
    f->clock.now += 20000; /* past the lease: every rank is back, nothing fails */
    pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &(pcs_coord_worker_t *){NULL});
    pcs_coord_heartbeat(f->c, "w-2", NULL, 0, &(pcs_coord_worker_t *){NULL});
    pcs_coord_tick(f->c);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(report(f, "w-1", 1, 100, true), 0);
    assert_int_equal(report(f, "w-2", 0, 100, true), 0);
    assert_int_equal(j->state, PCS_JOB_SUCCEEDED);
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_IDLE);
}

/* The window is readopt_ms (default lease + 5 s), not the lease: workers notice a restart only
 * after their reconnect backoff, and their first heartbeat is then refused (GONE) before they
 * register again. */
static void test_restored_running_job_fails_when_a_rank_stays_away_past_the_window(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(pcs_coord_config(f->c)->readopt_ms, 15000);
    pcs_coord_job_t *j = restore_running(f);
    assert_int_equal(report(f, "w-1", 1, 7, false), 0);
    run_alive(f, 14900, 2);
    f->clock.now += 99;
    pcs_coord_tick(f->c); /* 14999 ms after the restore */
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    f->clock.now += 1;
    pcs_coord_tick(f->c);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "1 of 2 ranks (first: rank 0) did not come back within "
                                   "15000 ms of a coordinator restart; missing ranks: 0");
    assert_null(worker(f, 1)->job); /* the rank that came back is freed with a STOP */
    left_job(f, 1);
    assert_int_equal(report(f, "w-2", 0, 8, false), PCS_EV_STOP);
}

/* A job that finished while the coordinator was down: its ranks' final reports arrive late,
 * after a stall of the restarted coordinator too; the job SUCCEEDS. */
static void test_late_done_reports_of_a_restored_job_succeed_it_even_after_a_stall(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *j = restore_running(f);
    run_alive(f, 14000, 2);
    f->clock.now += 30000; /* stalled: the window moves by the gap */
    assert_int_equal(pcs_coord_tick(f->c), 30000);
    run_alive(f, 500, 2);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(report(f, "w-2", 0, 6000, true), 0); /* only the final report, no progress */
    run_alive(f, 200, 2);
    assert_int_equal(report(f, "w-1", 1, 6000, true), 0);
    assert_int_equal(j->state, PCS_JOB_SUCCEEDED);
    assert_string_equal(j->reason, "all 2 ranks finished at step 6000");
    assert_int_equal(j->progress.step, 6000);
}

static pcs_coord_worker_t *reg_pid(fixture_t *f, const char *identity, uint32_t pid)
{
    pcs_coord_register_t r = {.identity = identity, .host = "h", .pid = pid};
    pcs_coord_worker_t *w = NULL;
    bool rr = false;
    assert_int_equal(pcs_coord_register(f->c, &r, &w, &rr), PCS_OK);
    return w;
}

/* The store of a coordinator that went down with job-1 RUNNING on w-2 (rank 0, pid 42) and w-1
 * (rank 1, pid 43), job-2 (world 1) PENDING, and a third known worker w-3. */
static pcs_coord_job_t *restore_with_rank_map(fixture_t *f, pcs_coord_job_t **pending)
{
    assert_int_equal(pcs_coord_restore_worker(f->c, 1, "pod-a", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_worker(f->c, 2, "pod-b", "h"), PCS_OK);
    assert_int_equal(pcs_coord_restore_worker(f->c, 3, "pod-c", "h"), PCS_OK);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2}, one[1] = {1};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes};
    assert_int_equal(pcs_coord_restore_job(f->c, 1, &d, PCS_JOB_RUNNING, NULL, 1, 2, 0, 3), PCS_OK);
    pcs_coord_job_t *j = pcs_coord_job_by_number(f->c, 1);
    uint32_t held[2] = {2, 1}, pids[2] = {42, 43};
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, held, pids, NULL, 2), PCS_OK);
    pcs_coord_job_desc_t p = {.n_dims = 1, .dim_name = names, .dim_size = one};
    assert_int_equal(pcs_coord_restore_job(f->c, 2, &p, PCS_JOB_PENDING, NULL, 5, 0, 0, 0), PCS_OK);
    *pending = pcs_coord_job_by_number(f->c, 2);
    assert_int_equal((*pending)->state, PCS_JOB_PENDING);
    return j;
}

/* The gap this closes: without the stored map, pod-a came back IDLE and job-2 (pending, world 1)
 * took it at once, although it was still training rank 1 of job-1. */
static void
test_restored_rank_map_gives_a_reregistered_worker_its_rank_before_pending_jobs(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *pending;
    pcs_coord_job_t *j = restore_with_rank_map(f, &pending);
    pcs_coord_worker_t *a = reg_pid(f, "pod-a", 43);
    assert_int_equal(a->state, PCS_WORKER_ASSIGNED);
    assert_ptr_equal(a->job, j);
    assert_int_equal(a->rank, 1);
    assert_int_equal(j->rank_worker[1], 1);
    assert_int_equal(j->n_unclaimed, 1);
    assert_int_equal(pending->state, PCS_JOB_PENDING); /* did not take pod-a */
    pcs_coord_event_t e;
    assert_true(pcs_coord_pop_event(f->c, a, &e));
    assert_int_equal(e.kind, PCS_EV_ASSIGNMENT);
    assert_int_equal(e.job, 1);
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.generation, 3);
    /* a worker without a reservation is free for the pending job */
    pcs_coord_worker_t *c3 = reg_pid(f, "pod-c", 7);
    assert_int_equal(pending->state, PCS_JOB_RUNNING);
    assert_ptr_equal(c3->job, pending);
    /* nobody but pod-b may take rank 0, not even through a step report */
    reg_pid(f, "pod-d", 8);
    assert_int_equal(report(f, "w-4", 0, 50, false), PCS_EV_STOP);
    assert_null(worker(f, 4)->job);
    pcs_coord_worker_t *b = reg_pid(f, "pod-b", 42);
    assert_int_equal(b->state, PCS_WORKER_ASSIGNED);
    assert_int_equal(b->rank, 0);
    assert_int_equal(j->n_unclaimed, 0);
    /* reports go on as usual; a full lease later nothing fails */
    assert_int_equal(report(f, "w-2", 0, 51, false), 0);
    assert_int_equal(report(f, "w-1", 1, 51, false), 0);
    f->clock.now += 20000;
    for (uint32_t n = 1; n <= 4; n++) {
        char id[16];
        snprintf(id, sizeof id, "w-%u", n);
        pcs_coord_heartbeat(f->c, id, NULL, 0, &(pcs_coord_worker_t *){NULL});
    }
    pcs_coord_tick(f->c);
    assert_int_equal(j->state, PCS_JOB_RUNNING);
    assert_int_equal(report(f, "w-1", 1, 60, true), 0);
    assert_int_equal(report(f, "w-2", 0, 60, true), 0);
    assert_int_equal(j->state, PCS_JOB_SUCCEEDED);
}

/* Same identity, other pid: the process that held the rank is gone (its communicators too). */
static void test_reserved_worker_back_from_a_new_process_fails_its_job_and_is_idle(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *pending;
    pcs_coord_job_t *j = restore_with_rank_map(f, &pending);
    pcs_coord_worker_t *b = reg_pid(f, "pod-b", 99);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "worker w-2 (rank 0) restarted while the coordinator was down: "
                                   "re-registered from a new process (pid 42 -> 99)");
    /* it came back idle, so the pending job may have it now */
    assert_ptr_equal(b->job, pending);
    assert_int_equal(pending->state, PCS_JOB_RUNNING);
    /* the other reservation ended with the job: pod-a comes back idle */
    assert_int_equal(worker(f, 1)->reserved_job, 0);
    pcs_coord_worker_t *a = reg_pid(f, "pod-a", 43);
    assert_int_equal(a->state, PCS_WORKER_IDLE);
    assert_null(a->job);
}

static void test_reserved_rank_away_a_lease_fails_the_job_naming_rank_and_worker(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *pending;
    pcs_coord_job_t *j = restore_with_rank_map(f, &pending);
    reg_pid(f, "pod-a", 43);
    f->clock.now += 15000;
    pcs_coord_heartbeat(f->c, "w-1", NULL, 0, &(pcs_coord_worker_t *){NULL});
    pcs_coord_tick(f->c);
    assert_int_equal(j->state, PCS_JOB_FAILED);
    assert_string_equal(j->reason, "1 of 2 ranks (first: rank 0) did not come back within "
                                   "15000 ms of a coordinator restart; missing ranks: 0 (w-2)");
    /* w-1 was freed with a STOP and, once it left the job, went to the pending one; w-2's
     * reservation is over */
    assert_int_equal(worker(f, 2)->reserved_job, 0);
    left_job(f, 1);
    assert_int_equal(worker(f, 1)->state, PCS_WORKER_ASSIGNED);
    assert_ptr_equal(worker(f, 1)->job, pending);
    pcs_coord_worker_t *b = reg_pid(f, "pod-b", 42);
    assert_int_equal(b->state, PCS_WORKER_IDLE);
}

static void test_restore_ranks_refuses_bad_maps_and_reserves_nothing(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *j = restore_running_no_rereg(f);
    uint32_t too_few[1] = {1}, unknown[2] = {1, 9}, twice[2] = {2, 2}, ok[2] = {1, 2};
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, too_few, NULL, NULL, 1), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "1 ranks stored, world size 2"));
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, unknown, NULL, NULL, 2), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "unknown worker 9"));
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, twice, NULL, NULL, 2), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "listed twice"));
    assert_int_equal(worker(f, 1)->reserved_job, 0);
    assert_int_equal(worker(f, 2)->reserved_job, 0);
    assert_null(j->rank_reserved);
    /* a finished job has nothing to reserve */
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes};
    assert_int_equal(pcs_coord_restore_job(f->c, 2, &d, PCS_JOB_SUCCEEDED, NULL, 1, 2, 3, 1),
                     PCS_OK);
    assert_int_equal(pcs_coord_restore_ranks(f->c, pcs_coord_job_by_number(f->c, 2), ok, NULL, NULL, 2),
                     PCS_ERR_INVALID_ARG);
    /* with an unknown pid (0) the same worker is trusted back */
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, ok, NULL, NULL, 2), PCS_OK);
    pcs_coord_worker_t *b = reg_pid(f, "pod-b", 1234);
    assert_int_equal(b->state, PCS_WORKER_ASSIGNED);
    assert_int_equal(b->rank, 1);
}

/* A map with a hole (rank 0's holder unknown): rank 1 is reserved, rank 0 is taken back by
 * whichever worker reports it, as without a map. */
static void test_rank_with_unknown_holder_comes_back_by_report(void **state)
{
    fixture_t *f = *state;
    pcs_coord_job_t *j = restore_running_no_rereg(f);
    uint32_t held[2] = {0, 2};
    assert_int_equal(pcs_coord_restore_ranks(f->c, j, held, NULL, NULL, 2), PCS_OK);
    assert_int_equal(worker(f, 1)->reserved_job, 0);
    pcs_coord_worker_t *a = reg_pid(f, "pod-a", 5);
    assert_int_equal(a->state, PCS_WORKER_IDLE);
    assert_int_equal(report(f, "w-1", 0, 9, false), 0);
    assert_int_equal(a->rank, 0);
    assert_int_equal(reg_pid(f, "pod-b", 6)->rank, 1);
    assert_int_equal(j->n_unclaimed, 0);
}

/* A corrupt store row with a huge id is refused (with its payload freed) instead of growing the
 * id tables to that size. */
static void test_restore_refuses_absurd_ids(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(pcs_coord_restore_worker(f->c, UINT32_MAX, "pod-big", "h"),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "corrupt store row"));
    assert_int_equal(pcs_coord_max_worker(f->c), 0);
    uint32_t names[1] = {PCS_MESH_DP_SHARD}, sizes[1] = {2};
    pcs_coord_job_desc_t d = {.n_dims = 1, .dim_name = names, .dim_size = sizes, .spec = malloc(4)};
    assert_int_equal(
        pcs_coord_restore_job(f->c, UINT32_MAX, &d, PCS_JOB_SUCCEEDED, NULL, 1, 2, 3, 1),
        PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "job number"));
    assert_int_equal(f->payload_frees, 1);
    assert_int_equal(pcs_coord_max_job(f->c), 0);
    /* the store's ids stay usable: a sane row after it restores */
    assert_int_equal(pcs_coord_restore_worker(f->c, 2, "pod-2", "h"), PCS_OK);
    assert_int_equal(pcs_coord_max_worker(f->c), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
        T(test_register_assigns_sequential_ids_and_reregister_keeps_id),
        T(test_register_copies_devices_and_backends),
        T(test_register_without_identity_is_invalid_arg),
        T(test_heartbeat_unknown_or_empty_worker_id_is_rejected),
        T(test_lease_expires_only_after_lease_ms_without_heartbeat),
        T(test_a_stalled_coordinator_renews_every_lease_instead_of_expiring_them),
        T(test_heartbeat_from_lost_worker_is_failed_precondition),
        T(test_reregister_revives_lost_worker_as_idle_with_same_id),
        T(test_deregister_makes_worker_gone_and_is_idempotent),
        T(test_job_stays_pending_until_enough_workers_then_gang_starts_fifo),
        T(test_gang_start_skips_lost_workers_and_uses_registration_order),
        T(test_gang_start_numbers_the_ranks_of_each_host),
        T(test_large_pending_job_does_not_block_smaller_one_behind_it),
        T(test_cuda_job_only_takes_workers_with_a_cuda_device),
        T(test_jobs_only_take_workers_offering_their_transport),
        T(test_jobs_naming_a_program_only_take_workers_of_it),
        T(test_mesh_coords_are_row_major_in_the_given_order),
        T(test_submit_with_bad_mesh_is_invalid_arg_and_frees_payload),
        T(test_duplicate_request_id_finds_the_existing_job),
        T(test_lost_worker_fails_running_job_naming_worker_and_rank),
        T(test_deregistered_worker_fails_its_running_job),
        T(test_reregister_from_new_pid_fails_running_job_but_same_pid_keeps_it),
        T(test_cancel_sends_stop_and_second_cancel_is_idempotent),
        T(test_freed_workers_start_the_next_pending_job),
        T(test_watch_started_requeues_current_assignment_once),
        T(test_event_queue_drops_oldest_when_full),
        T(test_reports_done_from_all_ranks_succeed_the_job),
        T(test_report_with_error_fails_the_job_with_reason),
        T(test_a_worker_a_peer_saw_die_is_never_given_the_next_job),
        T(test_watchdog_defaults),
        T(test_watchdog_fails_a_job_whose_ranks_stop_reporting_naming_the_silent_first),
        T(test_watchdog_first_step_deadline_finished_ranks_and_stalls),
        T(test_reports_read_before_the_stall_tick_are_not_moved_into_the_future),
        T(test_reports_follow_the_last_one_and_stay_within_the_job),
        T(test_a_held_identity_is_taken_only_with_its_secret),
        T(test_an_elastic_job_restarts_within_its_budget),
        T(test_a_stopping_worker_is_idle_only_once_it_left_the_job),
        T(test_an_idle_worker_silent_for_half_a_lease_is_not_scheduled),
        T(test_failure_reason_is_one_line_of_valid_utf8),
        T(test_report_with_wrong_rank_or_generation_is_rejected_or_stopped),
        T(test_diverging_fingerprints_in_one_stage_fail_the_job_naming_both_ranks),
        T(test_kv_set_get_roundtrip_and_overwrite),
        T(test_kv_limits_on_key_value_and_job_total),
        T(test_kv_total_of_all_jobs_is_capped),
        T(test_history_keeps_the_newest_finished_jobs),
        T(test_kv_stale_generation_or_finished_job_is_failed_precondition),
        T(test_kv_parked_get_is_woken_by_set_or_expires_in_tick),
        T(test_kv_parked_gets_are_capped_per_job),
        T(test_kv_parked_get_fails_when_job_ends),
        T(test_restore_keeps_ids_and_new_ids_continue_after_them),
        T(test_restore_refuses_absurd_ids),
        T(test_restored_running_job_takes_its_ranks_back_from_reports),
        T(test_restored_running_job_fails_when_a_rank_stays_away_past_the_window),
        T(test_late_done_reports_of_a_restored_job_succeed_it_even_after_a_stall),
        T(test_restored_rank_map_gives_a_reregistered_worker_its_rank_before_pending_jobs),
        T(test_reserved_worker_back_from_a_new_process_fails_its_job_and_is_idle),
        T(test_reserved_rank_away_a_lease_fails_the_job_naming_rank_and_worker),
        T(test_restore_ranks_refuses_bad_maps_and_reserves_nothing),
        T(test_rank_with_unknown_holder_comes_back_by_report),
#undef T
    };
    return cmocka_run_group_tests_name("coord", tests, NULL, NULL);
}
