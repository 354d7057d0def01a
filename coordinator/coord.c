/* The coordinator's pure state machine (see coord.h): membership, leases, gang start, job
 * lifecycle, per-worker event queues and the rendezvous KV. Single-threaded by design (DESIGN.md
 * §2): the RPC loop is the only caller, so nothing here locks. Time comes from cfg.clock only.
 * Worker and job ids carry their number ("w-7", "job-3"), so id lookups are O(1) array reads. */
#include "coordinator/coord.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/strmap.h"
#include "pcs/utf8.h"
#include "planner/validate.h" /* PCS_PROGRAM_NAME_MAX */

#define FP_RING 16 /* steps remembered per pipeline stage */
/* Ids are handed out one after another, so a store row numbered past this is corrupt: restoring
 * it would grow the id tables to that size (a 4e9 id asked for 32 GiB). */
#define MAX_RESTORED_NUMBER (1u << 24)

typedef struct pcs_coord_fp_slot {
    uint64_t step, fp;
    uint32_t rank;
    bool used;
} fp_slot_t;

typedef struct pcs_coord_kv_waiter {
    void *token;
    char *key;
    uint64_t deadline_ms;
} kv_waiter_t;

struct pcs_coord {
    pcs_coord_config_t cfg;
    pcs_coord_worker_t **workers; /* index = number - 1 (NULL: unused number) */
    size_t n_workers, cap_workers;
    pcs_coord_job_t **jobs; /* index = number - 1 */
    size_t n_jobs, cap_jobs;
    pcs_strmap_t by_identity; /* identity -> worker number (keys: the workers' identities) */
    pcs_strmap_t by_request;  /* request id -> job number (keys: the jobs' request ids) */
    uint32_t idle_live;       /* IDLE workers (gang start checks this before scanning) */
    uint32_t n_pending;
    uint64_t kv_total;       /* KV bytes (keys + values) of every job */
    /* finished jobs in the order they finished: done[done_head .. done_head + n_done) */
    uint32_t *done;
    size_t done_head, n_done, cap_done;
    uint32_t forgotten; /* jobs the history no longer keeps */
    uint64_t last_tick_ms;   /* 0 before the first tick */
    uint64_t next_watch_ms;  /* next progress watchdog pass */
};

static const char *const worker_names[] = {"UNSPECIFIED", "IDLE", "ASSIGNED",
                                           "LOST",        "GONE", "STOPPING"};
static const char *const job_names[] = {"UNSPECIFIED", "PENDING", "RUNNING",
                                        "SUCCEEDED",   "FAILED",  "CANCELLED"};

const char *pcs_worker_state_name(pcs_worker_state_t s)
{
    return (s >= PCS_WORKER_IDLE && s <= PCS_WORKER_STOPPING) ? worker_names[s] : "UNSPECIFIED";
}

const char *pcs_job_state_name(pcs_job_state_t s)
{
    return (s >= PCS_JOB_PENDING && s <= PCS_JOB_CANCELLED) ? job_names[s] : "UNSPECIFIED";
}

bool pcs_job_state_terminal(pcs_job_state_t s)
{
    return s == PCS_JOB_SUCCEEDED || s == PCS_JOB_FAILED || s == PCS_JOB_CANCELLED;
}

static uint64_t now_ms(const pcs_coord_t *c)
{
    return pcs_clock_now(c->cfg.clock);
}

static uint64_t wall_ms(const pcs_coord_t *c)
{
    return pcs_clock_wall(c->cfg.clock);
}

pcs_status_t pcs_coord_create(const pcs_coord_config_t *cfg, pcs_coord_t **out)
{
    *out = NULL;
    pcs_coord_t *c;
    PCS_CHECK(pcs_calloc(1, sizeof *c, (void **)&c));
    c->cfg = *cfg;
    if (!c->cfg.clock)
        c->cfg.clock = pcs_clock_real();
    if (!c->cfg.heartbeat_interval_ms)
        c->cfg.heartbeat_interval_ms = 1000;
    if (!c->cfg.lease_ms)
        c->cfg.lease_ms = 10000;
    if (!c->cfg.readopt_ms)
        c->cfg.readopt_ms = c->cfg.lease_ms + 5000;
    if (!c->cfg.step_timeout_factor)
        c->cfg.step_timeout_factor = 10;
    if (!c->cfg.step_timeout_min_ms)
        c->cfg.step_timeout_min_ms = 300000;
    if (!c->cfg.first_step_timeout_ms)
        c->cfg.first_step_timeout_ms = 900000;
    if (!c->cfg.kv_max_key_bytes)
        c->cfg.kv_max_key_bytes = 256;
    if (!c->cfg.kv_max_value_bytes)
        c->cfg.kv_max_value_bytes = 64 * 1024;
    if (!c->cfg.kv_max_job_bytes)
        c->cfg.kv_max_job_bytes = 16ull << 20;
    if (!c->cfg.kv_max_total_bytes)
        c->cfg.kv_max_total_bytes = 256ull << 20;
    if (!c->cfg.max_finished_jobs)
        c->cfg.max_finished_jobs = 10000;
    *out = c;
    return PCS_OK;
}

const pcs_coord_config_t *pcs_coord_config(const pcs_coord_t *c)
{
    return &c->cfg;
}

static void kv_clear(pcs_coord_t *c, pcs_coord_job_t *j)
{
    c->kv_total -= j->kv_bytes;
    for (size_t i = 0; i < j->kv_len; i++) {
        free(j->kv[i].key);
        free(j->kv[i].value);
    }
    free(j->kv);
    j->kv = NULL;
    j->kv_len = j->kv_cap = 0;
    j->kv_bytes = 0;
    if (j->kv_index) {
        pcs_strmap_free(j->kv_index);
        free(j->kv_index);
        j->kv_index = NULL;
    }
}

static void job_free(pcs_coord_t *c, pcs_coord_job_t *j)
{
    if (!j)
        return;
    kv_clear(c, j);
    for (size_t i = 0; i < j->n_waiters; i++)
        free(j->waiters[i].key);
    free(j->waiters);
    if (c->cfg.free_payload && (j->spec || j->plan))
        c->cfg.free_payload(c->cfg.user, j->spec, j->plan);
    free(j->name);
    free(j->request_id);
    free(j->owner);
    free(j->reason);
    free(j->rank_worker);
    free(j->rank_reserved);
    free(j->rank_done);
    free(j->rank_report_ms);
    free(j->rank_step);
    free(j->rank_step_ms);
    free(j->rank_loss);
    free(j->rank_bubble);
    free(j->fp_ring);
    free(j->log);
    free(j);
}

static void worker_free(pcs_coord_worker_t *w)
{
    if (!w)
        return;
    free(w->identity);
    free(w->host);
    free(w->address);
    free(w->version);
    free(w->program);
    for (size_t i = 0; i < w->n_devices; i++) {
        free(w->devices[i].kind);
        free(w->devices[i].name);
    }
    free(w->devices);
    for (size_t i = 0; i < w->n_backends; i++)
        free(w->backends[i]);
    free(w->backends);
    free(w->events);
    free(w);
}

void pcs_coord_destroy(pcs_coord_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_jobs; i++)
        job_free(c, c->jobs[i]);
    free(c->jobs);
    for (size_t i = 0; i < c->n_workers; i++)
        worker_free(c->workers[i]);
    free(c->workers);
    pcs_strmap_free(&c->by_identity);
    pcs_strmap_free(&c->by_request);
    free(c->done);
    free(c);
}

// ---------------------------------------------------------------------------------------------
// events

static void push_event(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_coord_event_kind_t kind,
                       const pcs_coord_job_t *j, const char *reason)
{
    if (w->ev_len == PCS_COORD_EVENT_QUEUE) {
        /* A worker that never watches must not grow memory without bound: drop the oldest. */
        w->ev_head++;
        w->ev_len--;
    }
    if (w->ev_head + w->ev_len == w->ev_cap) {
        if (w->ev_head) {
            memmove(w->events, w->events + w->ev_head, w->ev_len * sizeof *w->events);
            w->ev_head = 0;
        } else if (pcs_grow((void **)&w->events, &w->ev_cap, w->ev_len + 1, sizeof *w->events) !=
                   PCS_OK) {
            PCS_WARN(PCS_SUB_COORD, "worker %s: event dropped (out of memory)", w->id);
            return;
        }
    }
    pcs_coord_event_t *e = &w->events[w->ev_head + w->ev_len];
    memset(e, 0, sizeof *e);
    e->seq = ++w->ev_seq;
    e->kind = kind;
    e->job = j->number;
    e->generation = j->generation;
    e->rank = w->rank;
    snprintf(e->reason, sizeof e->reason, "%s", reason ? reason : "");
    w->ev_len++;
    if (c->cfg.on_events)
        c->cfg.on_events(c->cfg.user, w);
}

bool pcs_coord_pop_event(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_coord_event_t *out)
{
    (void)c;
    if (!w->ev_len)
        return false;
    *out = w->events[w->ev_head];
    w->ev_head++;
    if (--w->ev_len == 0)
        w->ev_head = 0;
    return true;
}

void pcs_coord_watch_started(pcs_coord_t *c, pcs_coord_worker_t *w)
{
    if (w->state == PCS_WORKER_STOPPING) {
        /* a STOP popped for a stream that broke before it went out is sent again */
        pcs_coord_job_t *j = pcs_coord_job_by_number(c, w->stop_job);
        for (size_t i = 0; j && i < w->ev_len; i++) {
            const pcs_coord_event_t *e = &w->events[w->ev_head + i];
            if (e->kind == PCS_EV_STOP && e->job == j->number)
                return;
        }
        if (j)
            push_event(c, w, PCS_EV_STOP, j, j->reason);
        return;
    }
    if (w->state != PCS_WORKER_ASSIGNED || !w->job)
        return;
    for (size_t i = 0; i < w->ev_len; i++) {
        const pcs_coord_event_t *e = &w->events[w->ev_head + i];
        if (e->kind == PCS_EV_ASSIGNMENT && e->job == w->job->number &&
            e->generation == w->job->generation)
            return;
    }
    push_event(c, w, PCS_EV_ASSIGNMENT, w->job, "re-sent on a new watch");
}

// ---------------------------------------------------------------------------------------------
// workers

static void job_notify(pcs_coord_t *c, const pcs_coord_job_t *j)
{
    if (c->cfg.on_job_change)
        c->cfg.on_job_change(c->cfg.user, j);
}

static void set_worker_state(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_worker_state_t s)
{
    if (w->state == PCS_WORKER_IDLE)
        c->idle_live--;
    if (s == PCS_WORKER_IDLE)
        c->idle_live++;
    w->state = s;
}

static pcs_status_t parse_number(const char *id, const char *prefix, uint32_t *out)
{
    size_t pl = strlen(prefix);
    if (strncmp(id, prefix, pl) != 0 || !id[pl])
        return PCS_ERR_NOT_FOUND;
    uint64_t v = 0;
    for (const char *p = id + pl; *p; p++) {
        if (*p < '0' || *p > '9' || v > UINT32_MAX / 10)
            return PCS_ERR_NOT_FOUND;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v == 0 || v > UINT32_MAX)
        return PCS_ERR_NOT_FOUND;
    *out = (uint32_t)v;
    return PCS_OK;
}

pcs_coord_worker_t *pcs_coord_worker_by_number(pcs_coord_t *c, uint32_t number)
{
    if (number == 0 || number > c->n_workers)
        return NULL;
    return c->workers[number - 1];
}

uint32_t pcs_coord_max_worker(const pcs_coord_t *c)
{
    return (uint32_t)c->n_workers;
}

uint32_t pcs_coord_max_job(const pcs_coord_t *c)
{
    return (uint32_t)c->n_jobs;
}

pcs_coord_job_t *pcs_coord_job_by_number(pcs_coord_t *c, uint32_t number)
{
    if (number == 0 || number > c->n_jobs)
        return NULL;
    return c->jobs[number - 1];
}

pcs_status_t pcs_coord_lookup_worker(pcs_coord_t *c, const char *worker_id,
                                     pcs_coord_worker_t **out)
{
    *out = NULL;
    if (!worker_id || !*worker_id)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "worker_id: required");
    uint32_t n;
    pcs_coord_worker_t *w = NULL;
    if (parse_number(worker_id, "w-", &n) == PCS_OK)
        w = pcs_coord_worker_by_number(c, n);
    if (!w)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "worker %.*s: unknown worker id (register first)",
                             pcs_utf8_prefix(worker_id, 64), worker_id);
    *out = w;
    return PCS_OK;
}

/* Grow an array of pointers indexed by number - 1 so that `number` fits. */
static pcs_status_t ensure_slot(void ***arr, size_t *n, size_t *cap, uint32_t number)
{
    if (number > *n) {
        PCS_CHECK(pcs_grow((void **)arr, cap, number, sizeof(void *)));
        for (size_t i = *n; i < number; i++)
            (*arr)[i] = NULL;
        *n = number;
    }
    return PCS_OK;
}

pcs_status_t pcs_coord_reserve_ids(pcs_coord_t *c, uint64_t next_worker, uint64_t next_job)
{
    if (next_worker > MAX_RESTORED_NUMBER || next_job > MAX_RESTORED_NUMBER)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "stored id counters %llu / %llu are past %u: not ids this "
                             "coordinator handed out",
                             (unsigned long long)next_worker, (unsigned long long)next_job,
                             MAX_RESTORED_NUMBER);
    if (next_worker > 1)
        PCS_CHECK(ensure_slot((void ***)&c->workers, &c->n_workers, &c->cap_workers,
                              (uint32_t)next_worker - 1));
    if (next_job > 1)
        PCS_CHECK(
            ensure_slot((void ***)&c->jobs, &c->n_jobs, &c->cap_jobs, (uint32_t)next_job - 1));
    return PCS_OK;
}

static pcs_status_t dup_or_empty(const char *s, char **out)
{
    return pcs_strdup(s ? s : "", out);
}

/* Replace the descriptive fields of `w` with those of `r` (copies). */
static pcs_status_t worker_fill(pcs_coord_worker_t *w, const pcs_coord_register_t *r)
{
    pcs_coord_worker_t tmp = {0};
    pcs_status_t st;
    PCS_CHECK_GOTO(dup_or_empty(r->host, &tmp.host), st, fail);
    PCS_CHECK_GOTO(dup_or_empty(r->address, &tmp.address), st, fail);
    PCS_CHECK_GOTO(dup_or_empty(r->version, &tmp.version), st, fail);
    PCS_CHECK_GOTO(dup_or_empty(r->program, &tmp.program), st, fail);
    if (r->n_devices) {
        PCS_CHECK_GOTO(pcs_calloc(r->n_devices, sizeof *tmp.devices, (void **)&tmp.devices), st,
                       fail);
        for (size_t i = 0; i < r->n_devices; i++, tmp.n_devices++) {
            tmp.devices[i].index = r->devices[i].index;
            tmp.devices[i].memory_bytes = r->devices[i].memory_bytes;
            PCS_CHECK_GOTO(dup_or_empty(r->devices[i].kind, &tmp.devices[i].kind), st, fail);
            PCS_CHECK_GOTO(dup_or_empty(r->devices[i].name, &tmp.devices[i].name), st, fail);
            if (strcmp(tmp.devices[i].kind, "cuda") == 0)
                tmp.has_cuda = true;
        }
    }
    if (r->n_backends) {
        PCS_CHECK_GOTO(pcs_calloc(r->n_backends, sizeof *tmp.backends, (void **)&tmp.backends), st,
                       fail);
        for (size_t i = 0; i < r->n_backends; i++, tmp.n_backends++)
            PCS_CHECK_GOTO(dup_or_empty(r->backends[i], &tmp.backends[i]), st, fail);
    }
    /* swap the new descriptive fields in, free the old ones through a scratch worker */
    pcs_coord_worker_t old = {0};
    old.host = w->host, old.address = w->address, old.version = w->version;
    old.program = w->program;
    old.devices = w->devices, old.n_devices = w->n_devices;
    old.backends = w->backends, old.n_backends = w->n_backends;
    w->host = tmp.host, w->address = tmp.address, w->version = tmp.version;
    w->program = tmp.program;
    w->devices = tmp.devices, w->n_devices = tmp.n_devices;
    w->backends = tmp.backends, w->n_backends = tmp.n_backends;
    w->has_cuda = tmp.has_cuda;
    w->pid = r->pid;
    tmp = old;
    st = PCS_OK;
fail:
    /* frees either the half-built copy (error) or the previous fields (success) */
    free(tmp.host);
    free(tmp.address);
    free(tmp.version);
    free(tmp.program);
    for (size_t i = 0; i < tmp.n_devices; i++) {
        free(tmp.devices[i].kind);
        free(tmp.devices[i].name);
    }
    if (st != PCS_OK && tmp.devices && r->n_devices > tmp.n_devices) {
        free(tmp.devices[tmp.n_devices].kind); /* partially filled entry */
        free(tmp.devices[tmp.n_devices].name);
    }
    free(tmp.devices);
    for (size_t i = 0; i < tmp.n_backends; i++)
        free(tmp.backends[i]);
    free(tmp.backends);
    return st;
}

static void try_start_jobs(pcs_coord_t *c);
static void worker_left(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_worker_state_t s,
                        const char *why);

static pcs_status_t new_worker(pcs_coord_t *c, uint32_t number, const char *identity,
                               pcs_coord_worker_t **out)
{
    pcs_coord_worker_t *w;
    PCS_CHECK(ensure_slot((void ***)&c->workers, &c->n_workers, &c->cap_workers, number));
    PCS_CHECK(pcs_calloc(1, sizeof *w, (void **)&w));
    pcs_status_t st = pcs_strdup(identity, &w->identity);
    if (st == PCS_OK)
        st = pcs_strmap_put(&c->by_identity, w->identity, number);
    if (st != PCS_OK) {
        worker_free(w);
        return st;
    }
    w->number = number;
    snprintf(w->id, sizeof w->id, "w-%" PRIu32, number);
    c->workers[number - 1] = w;
    *out = w;
    return PCS_OK;
}

static void job_set_reason(pcs_coord_job_t *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void job_finish(pcs_coord_t *c, pcs_coord_job_t *j, pcs_job_state_t state);
static void job_fail(pcs_coord_t *c, pcs_coord_job_t *j);
static void remember_finished(pcs_coord_t *c, pcs_coord_job_t *j);
static void drop_rank_state(pcs_coord_t *c, pcs_coord_job_t *j);

/* The restored RUNNING job still waiting for the rank `w` holds a reservation on, or NULL. */
static pcs_coord_job_t *reserved_job(pcs_coord_t *c, const pcs_coord_worker_t *w)
{
    if (!w->reserved_job)
        return NULL;
    pcs_coord_job_t *j = pcs_coord_job_by_number(c, w->reserved_job);
    if (!j || j->state != PCS_JOB_RUNNING || !j->n_unclaimed || !j->rank_reserved ||
        w->reserved_rank >= j->world_size || j->rank_worker[w->reserved_rank] ||
        j->rank_reserved[w->reserved_rank] != w->number)
        return NULL;
    return j;
}

/* Is a Register from (pid, incarnation) the process `w` knew? Incarnations decide when both
 * sides have one (every container's worker may be pid 1); otherwise pids, and an unknown pid is
 * trusted. */
static bool same_process(const pcs_coord_worker_t *w, uint32_t pid, uint64_t incarnation)
{
    if (w->incarnation && incarnation)
        return w->incarnation == incarnation;
    return !w->pid || !pid || w->pid == pid;
}

/* A STOPPING worker confirmed it left its job: schedulable again. */
static void stop_confirmed(pcs_coord_t *c, pcs_coord_worker_t *w, const char *how)
{
    if (w->state != PCS_WORKER_STOPPING)
        return;
    PCS_DEBUG(PCS_SUB_COORD, "worker %s left job-%" PRIu32 " (%s): IDLE", w->id, w->stop_job, how);
    w->stop_job = 0;
    w->stop_gen = 0;
    set_worker_state(c, w, PCS_WORKER_IDLE);
    try_start_jobs(c);
}

/* A rank of a job restored from the store comes back to `w` (IDLE or reviving). */
static void take_rank_back(pcs_coord_t *c, pcs_coord_job_t *j, pcs_coord_worker_t *w, uint32_t rank,
                           const char *how)
{
    j->rank_worker[rank] = w->number;
    w->job = j;
    w->rank = rank;
    w->reserved_job = 0;
    set_worker_state(c, w, PCS_WORKER_ASSIGNED);
    j->n_unclaimed--;
    PCS_INFO(PCS_SUB_COORD,
             "job %s: worker %s took rank %" PRIu32 " back (%s; %" PRIu32 " ranks still away)",
             j->id, w->id, rank, how, j->n_unclaimed);
}

/* Equal hashes, compared without an early exit. */
static bool hash_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (size_t i = 0; i < PCS_COORD_SECRET_HASH_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

/* Until when `w`'s registration holds its identity (0: it does not): a live lease, or a restored
 * worker's re-adoption window. */
static uint64_t held_until(const pcs_coord_t *c, const pcs_coord_worker_t *w)
{
    if (!w->has_secret)
        return 0;
    if (w->state == PCS_WORKER_IDLE || w->state == PCS_WORKER_ASSIGNED ||
        w->state == PCS_WORKER_STOPPING)
        return w->last_heartbeat_ms + c->cfg.lease_ms;
    if (w->state == PCS_WORKER_GONE)
        return w->held_until_ms;
    return 0; /* LOST: its lease lapsed */
}

pcs_coord_worker_t *pcs_coord_worker_by_secret(pcs_coord_t *c, const char *worker_id,
                                               const uint8_t *hash)
{
    pcs_coord_worker_t *w;
    if (!hash || pcs_coord_lookup_worker(c, worker_id, &w) != PCS_OK || !w->has_secret)
        return NULL;
    return hash_equal(w->secret_hash, hash) ? w : NULL;
}

pcs_status_t pcs_coord_register(pcs_coord_t *c, const pcs_coord_register_t *r,
                                pcs_coord_worker_t **out, bool *reregistered)
{
    bool kept;
    return pcs_coord_register_ex(c, r, out, reregistered, &kept);
}

pcs_status_t pcs_coord_register_ex(pcs_coord_t *c, const pcs_coord_register_t *r,
                                   pcs_coord_worker_t **out, bool *reregistered, bool *secret_kept)
{
    *out = NULL;
    *reregistered = false;
    *secret_kept = false;
    if (!r->identity || !*r->identity)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "identity: required");
    if (strlen(r->identity) > 256)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "identity: longer than 256 bytes");
    if (r->program && *r->program && !pcs_is_name_token(r->program, PCS_PROGRAM_NAME_MAX))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "program: must be at most %d characters of [A-Za-z0-9._-]",
                             PCS_PROGRAM_NAME_MAX);
    uint32_t num;
    pcs_coord_worker_t *w = NULL;
    bool is_new = false, same = true;
    if (pcs_strmap_get(&c->by_identity, r->identity, &num)) {
        w = pcs_coord_worker_by_number(c, num);
        bool owner = w->has_secret && r->presented && hash_equal(w->secret_hash, r->presented);
        uint64_t until = held_until(c, w), now = now_ms(c);
        if (!owner && !r->identity_proven && until > now)
            return pcs_set_error(PCS_ERR_STATE,
                                 "identity %s is held by worker %s (%s) for another %" PRIu64
                                 " ms: only the process it was issued to may register it now "
                                 "(a restarted process is let in when the hold lapses)",
                                 r->identity, w->id, pcs_worker_state_name(w->state),
                                 until - now);
        *secret_kept = owner;
        *reregistered = true;
        same = same_process(w, r->pid, r->incarnation);
        if (w->state == PCS_WORKER_ASSIGNED && w->job && !same) {
            /* Same identity, new process (a restarted pod): the old process's communicators
             * are gone, so its job cannot go on with this rank. */
            char why[128];
            snprintf(why, sizeof why,
                     "restarted: re-registered from a new process (pid %" PRIu32 " -> %" PRIu32 ")",
                     w->pid, r->pid);
            PCS_WARN(PCS_SUB_COORD, "worker %s (%s) %s", w->id, w->identity, why);
            worker_left(c, w, PCS_WORKER_IDLE, why);
        }
    } else {
        PCS_CHECK(new_worker(c, (uint32_t)c->n_workers + 1, r->identity, &w));
        w->registered_wall_ms = wall_ms(c);
        is_new = true;
    }
    uint32_t old_pid = w->pid;
    pcs_status_t st = worker_fill(w, r);
    if (st != PCS_OK)
        return st; /* a new worker stays GONE-like (state 0) and invisible to gang start */
    w->incarnation = r->incarnation;
    w->last_heartbeat_ms = now_ms(c);
    w->last_heartbeat_wall_ms = wall_ms(c);
    w->held_until_ms = 0;
    bool new_secret = !*secret_kept && r->fresh;
    if (new_secret) {
        memcpy(w->secret_hash, r->fresh, PCS_COORD_SECRET_HASH_BYTES);
        w->has_secret = true;
    } else if (!*secret_kept) {
        w->has_secret = false; /* registered without credentials: nothing to hold it by */
    }
    if (is_new) {
        set_worker_state(c, w, PCS_WORKER_IDLE);
        PCS_INFO(PCS_SUB_COORD, "worker %s registered: identity %s host %s pid %" PRIu32, w->id,
                 w->identity, w->host, w->pid);
        if (c->cfg.on_worker_new)
            c->cfg.on_worker_new(c->cfg.user, w);
        new_secret = false; /* written with the new row */
    } else if (w->state == PCS_WORKER_LOST || w->state == PCS_WORKER_GONE || w->state == 0) {
        /* Its job (if any) already moved on when it was lost: come back idle. */
        PCS_INFO(PCS_SUB_COORD, "worker %s (%s) re-registered after %s", w->id, w->identity,
                 pcs_worker_state_name(w->state));
        w->job = NULL;
        if (!w->registered_wall_ms)
            w->registered_wall_ms = wall_ms(c);
        pcs_coord_job_t *rj = reserved_job(c, w);
        w->reserved_job = 0;
        if (rj && same) {
            /* held a rank before the coordinator restarted: take it back before any pending
             * job can claim this worker */
            take_rank_back(c, rj, w, w->reserved_rank, "re-registered");
            push_event(c, w, PCS_EV_ASSIGNMENT, rj, "rank taken back after a coordinator restart");
        } else {
            w->stop_job = 0;
            set_worker_state(c, w, PCS_WORKER_IDLE);
            if (rj) {
                job_set_reason(rj,
                               "worker %s (rank %" PRIu32 ") restarted while the coordinator was "
                               "down: re-registered from a new process (pid %" PRIu32 " -> %" PRIu32
                               ")",
                               w->id, w->reserved_rank, old_pid, r->pid);
                PCS_WARN(PCS_SUB_COORD, "job %s: %s", rj->id, rj->reason);
                job_fail(c, rj);
            }
        }
    } else if (w->state == PCS_WORKER_STOPPING && !same) {
        /* the process that had to leave the job is gone: nothing of it runs anymore */
        stop_confirmed(c, w, "re-registered from a new process");
    }
    if (new_secret && c->cfg.on_worker_new)
        c->cfg.on_worker_new(c->cfg.user, w); /* its stored credential changed */
    *out = w;
    try_start_jobs(c);
    return PCS_OK;
}

/* A worker silent for more than half a lease (paused, partitioned, dying) is not given a new job,
 * though it is not LOST yet: the job would only fail when the lease runs out. */
static bool fresh(const pcs_coord_t *c, const pcs_coord_worker_t *w)
{
    return now_ms(c) - w->last_heartbeat_ms <= c->cfg.lease_ms / 2;
}

pcs_status_t pcs_coord_heartbeat(pcs_coord_t *c, const char *worker_id, const char *job_id,
                                 uint64_t generation, pcs_coord_worker_t **out)
{
    pcs_coord_worker_t *w;
    PCS_CHECK(pcs_coord_lookup_worker(c, worker_id, &w));
    *out = w;
    if (w->state == PCS_WORKER_LOST || w->state == PCS_WORKER_GONE)
        return pcs_set_error(PCS_ERR_STATE, "worker %s is %s: re-register", w->id,
                             pcs_worker_state_name(w->state));
    bool was_fresh = fresh(c, w);
    w->last_heartbeat_ms = now_ms(c);
    w->last_heartbeat_wall_ms = wall_ms(c);
    if (w->state == PCS_WORKER_STOPPING) {
        uint32_t n = 0;
        if (!job_id || !*job_id || parse_number(job_id, "job-", &n) != PCS_OK ||
            n != w->stop_job || generation != w->stop_gen)
            stop_confirmed(c, w, "heartbeat");
    } else if (w->state == PCS_WORKER_IDLE && !was_fresh && c->n_pending) {
        try_start_jobs(c); /* back from a silence: it may complete a gang */
    }
    return PCS_OK;
}

// ---------------------------------------------------------------------------------------------
// jobs

/* Make `s` one line of valid UTF-8 in place: control characters become ' ', bytes that are not
 * part of a well-formed UTF-8 sequence (foreign input, or a character cut by a "%.300s"
 * truncation) become '?'. A reason is logged as one line, printed in the GetStatus text and sent
 * as a proto3 string, which clients such as grpcio refuse to decode when it is not UTF-8. */
static void one_line_utf8(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            *p = ' ';
    pcs_utf8_sanitize(s);
}

static void job_set_reason(pcs_coord_job_t *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void job_set_reason(pcs_coord_job_t *j, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(buf, sizeof buf, fmt, ap) >= (int)sizeof buf)
        pcs_utf8_trim_partial(buf); /* cut at a character, not inside one */
    va_end(ap);
    one_line_utf8(buf);
    char *s = NULL;
    if (pcs_strdup(buf, &s) == PCS_OK) {
        free(j->reason);
        j->reason = s;
    }
}

static void kv_fail_waiters(pcs_coord_t *c, pcs_coord_job_t *j, pcs_status_t st, const char *why)
{
    /* Take the list first: a wake callback may call back into the coordinator. */
    kv_waiter_t *ws = j->waiters;
    size_t n = j->n_waiters;
    j->waiters = NULL;
    j->n_waiters = j->cap_waiters = 0;
    for (size_t i = 0; i < n; i++) {
        if (c->cfg.on_kv_wake) {
            pcs_set_error(st, "%s", why);
            c->cfg.on_kv_wake(c->cfg.user, ws[i].token, st, NULL, 0);
        }
        free(ws[i].key);
    }
    free(ws);
}

/* Move a RUNNING/PENDING job to a terminal state. Its workers get a STOP directive (a LOST/GONE
 * one too, for when it comes back). A worker whose rank sent its final report (done, or the
 * error that ends the job) has left the job and is IDLE; the others are STOPPING until they
 * confirm it (pcs_worker_state_t), so a dead, paused or wedged one is never scheduled. */
/* The generation's ranks leave the job: a rank whose loop over it has ended (its final report
 * came) is IDLE at once, the others STOPPING until they confirm they left; each gets `kind`
 * (STOP or RESTART) with `reason`. */
static void release_ranks(pcs_coord_t *c, pcs_coord_job_t *j, pcs_coord_event_kind_t kind,
                          const char *reason)
{
    for (uint32_t r = 0; r < j->world_size; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_worker[r]);
        if (!w || w->job != j)
            continue;
        w->job = NULL;
        if (w->state == PCS_WORKER_ASSIGNED && j->rank_done[r]) {
            set_worker_state(c, w, PCS_WORKER_IDLE);
        } else if (w->state == PCS_WORKER_ASSIGNED) {
            w->stop_job = j->number;
            w->stop_gen = j->generation;
            set_worker_state(c, w, PCS_WORKER_STOPPING);
        }
        push_event(c, w, kind, j, reason);
    }
}

// ---- elastic restarts ----

/* Per-rank arrays for `world` ranks (a restart at another world size), zeroed. */
static pcs_status_t resize_ranks(pcs_coord_job_t *j, uint32_t world)
{
    uint32_t *rw = NULL;
    uint8_t *done = NULL;
    uint64_t *rep = NULL, *stp = NULL;
    double *sms = NULL, *loss = NULL, *bub = NULL;
    if (pcs_calloc(world, sizeof *rw, (void **)&rw) != PCS_OK ||
        pcs_calloc(world, 1, (void **)&done) != PCS_OK ||
        pcs_calloc(world, sizeof *rep, (void **)&rep) != PCS_OK ||
        pcs_calloc(world, sizeof *stp, (void **)&stp) != PCS_OK ||
        pcs_calloc(world, sizeof *sms, (void **)&sms) != PCS_OK ||
        pcs_calloc(world, sizeof *loss, (void **)&loss) != PCS_OK ||
        pcs_calloc(world, sizeof *bub, (void **)&bub) != PCS_OK) {
        free(rw), free(done), free(rep), free(stp), free(sms), free(loss), free(bub);
        return PCS_ERR_NOMEM;
    }
    free(j->rank_worker), free(j->rank_done), free(j->rank_report_ms), free(j->rank_step);
    free(j->rank_step_ms), free(j->rank_loss), free(j->rank_bubble), free(j->rank_reserved);
    j->rank_bubble = bub;
    j->rank_reserved = NULL;
    j->rank_worker = rw, j->rank_done = done, j->rank_report_ms = rep, j->rank_step = stp;
    j->rank_step_ms = sms, j->rank_loss = loss;
    return PCS_OK;
}

/* The world size a restarted job starts at with `avail` eligible workers: its own when there
 * are enough, else, once it waited elastic_wait_ms, the largest its mesh allows within
 * [min_world, max_world]; 0 = not yet. */
static uint32_t restart_world(const pcs_coord_t *c, const pcs_coord_job_t *j, uint32_t avail)
{
    uint32_t want = j->base_world < j->max_world ? j->base_world : j->max_world;
    if (avail >= want)
        return want;
    uint32_t wait = c->cfg.elastic_wait_ms ? c->cfg.elastic_wait_ms : 30000;
    if (now_ms(c) - j->restart_since_ms < wait || !c->cfg.replan)
        return 0;
    uint32_t q = j->world_quantum ? j->world_quantum : 1;
    uint32_t w = (avail / q) * q;
    return w >= j->min_world && w >= q ? w : 0;
}

/* The generation failed; the job has restarts left: stop every rank (RESTART, fencing the
 * generation: its reports and KV are refused from now on), record why, and wait for workers as
 * a PENDING job that keeps its id. The survivors come back IDLE once they confirm they left. */
static void job_restart(pcs_coord_t *c, pcs_coord_job_t *j)
{
    pcs_coord_restart_t rec;
    memset(&rec, 0, sizeof rec);
    rec.generation = j->generation;
    rec.step = j->progress.step;
    rec.at_wall_ms = wall_ms(c);
    rec.world_before = j->world_size;
    snprintf(rec.cause, sizeof rec.cause, "%s", j->reason ? j->reason : "?");
    pcs_utf8_trim_partial(rec.cause);
    if (!j->log)
        (void)pcs_calloc(PCS_COORD_RESTART_LOG, sizeof *j->log, (void **)&j->log);
    if (j->log) {
        if (j->n_log == PCS_COORD_RESTART_LOG) {
            memmove(j->log, j->log + 1, (PCS_COORD_RESTART_LOG - 1) * sizeof *j->log);
            j->n_log--;
        }
        j->log[j->n_log++] = rec;
    }
    j->restarts++;
    char why[200];
    snprintf(why, sizeof why, "restart %" PRIu32 " of %" PRIu32 " (generation %" PRIu64 " failed)",
             j->restarts, j->max_restarts, j->generation);
    PCS_WARN(PCS_SUB_COORD, "job %s: %s: %s", j->id, why, rec.cause);
    release_ranks(c, j, PCS_EV_RESTART, why);
    kv_fail_waiters(c, j, PCS_ERR_STATE, "the job restarts: its generation ended");
    kv_clear(c, j);
    j->n_unclaimed = 0;
    j->state = PCS_JOB_PENDING;
    j->restart_since_ms = now_ms(c);
    c->n_pending++;
    memset(j->rank_worker, 0, (size_t)j->world_size * sizeof *j->rank_worker);
    job_notify(c, j);
    try_start_jobs(c);
}

/* A RUNNING job's generation failed (j->reason says why): restart it while its budget lasts,
 * else FAILED with every restart it had in the reason. */
static void job_fail(pcs_coord_t *c, pcs_coord_job_t *j)
{
    if (j->restarts < j->max_restarts && j->rank_worker) {
        job_restart(c, j);
        return;
    }
    if (j->restarts) {
        char buf[512];
        size_t o = (size_t)snprintf(buf, sizeof buf, "%s; after %" PRIu32 " restart%s (",
                                    j->reason ? j->reason : "failed", j->restarts,
                                    j->restarts > 1 ? "s" : "");
        for (uint32_t i = 0; i < j->n_log && o < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%sgeneration %" PRIu64 " at step %"
                                  PRIu64 ": %.80s", i ? "; " : "", j->log[i].generation,
                                  j->log[i].step, j->log[i].cause);
        if (o < sizeof buf)
            snprintf(buf + o, sizeof buf - o, ")");
        job_set_reason(j, "%s", buf);
    }
    job_finish(c, j, PCS_JOB_FAILED);
}

static void job_finish(pcs_coord_t *c, pcs_coord_job_t *j, pcs_job_state_t state)
{
    pcs_job_state_t prev = j->state;
    if (prev == PCS_JOB_PENDING)
        c->n_pending--;
    j->n_unclaimed = 0;
    j->state = state;
    j->finished_wall_ms = wall_ms(c);
    for (uint32_t r = 0; j->rank_reserved && r < j->world_size; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_reserved[r]);
        if (w && w->reserved_job == j->number)
            w->reserved_job = 0; /* the reservation ends with the job */
    }
    if (prev == PCS_JOB_RUNNING)
        release_ranks(c, j, PCS_EV_STOP, j->reason);
    kv_fail_waiters(c, j, PCS_ERR_STATE, "job ended while waiting for the key");
    drop_rank_state(c, j);
    PCS_INFO(PCS_SUB_COORD, "job %s %s -> %s%s%s", j->id, pcs_job_state_name(prev),
             pcs_job_state_name(state), j->reason ? ": " : "", j->reason ? j->reason : "");
    job_notify(c, j);
    remember_finished(c, j); /* may forget older finished jobs, never this one */
    try_start_jobs(c);
}

static void worker_left(pcs_coord_t *c, pcs_coord_worker_t *w, pcs_worker_state_t s,
                        const char *why)
{
    pcs_coord_job_t *j = w->job;
    set_worker_state(c, w, s);
    if (j && j->state == PCS_JOB_RUNNING) {
        job_set_reason(j, "worker %s (rank %" PRIu32 ") %s", w->id, w->rank, why);
        job_fail(c, j);
    }
    /* job_finish may already have handed an IDLE worker a new job: keep that one */
    if (w->job == j)
        w->job = NULL;
}

pcs_status_t pcs_coord_deregister(pcs_coord_t *c, const char *worker_id, const char *reason)
{
    pcs_coord_worker_t *w;
    PCS_CHECK(pcs_coord_lookup_worker(c, worker_id, &w));
    if (w->state == PCS_WORKER_GONE)
        return PCS_OK; /* idempotent */
    char why[256];
    snprintf(why, sizeof why, "deregistered%s%.*s", reason && *reason ? ": " : "",
             pcs_utf8_prefix(reason, 200), reason ? reason : "");
    PCS_INFO(PCS_SUB_COORD, "worker %s %s", w->id, why);
    worker_left(c, w, PCS_WORKER_GONE, why);
    return PCS_OK;
}

pcs_status_t pcs_coord_check_mesh(uint32_t n_dims, const uint32_t *dim_name,
                                  const uint32_t *dim_size, pcs_mesh_t *out)
{
    PCS_CHECK(pcs_mesh_init(n_dims, dim_name, dim_size, out));
    if (out->world > PCS_COORD_MAX_WORLD)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "mesh: world size (product of sizes) exceeds %u",
                             PCS_COORD_MAX_WORLD);
    return PCS_OK;
}

static bool mesh_has_dim(const pcs_mesh_t *m, uint32_t dim)
{
    for (uint32_t k = 0; k < m->n; k++)
        if (m->dim[k] == dim)
            return true;
    return false;
}

static pcs_status_t new_job(pcs_coord_t *c, uint32_t number, const pcs_coord_job_desc_t *d,
                            pcs_coord_job_t **out)
{
    pcs_coord_job_t *j = NULL;
    pcs_status_t st;
    pcs_mesh_t mesh;
    PCS_CHECK_GOTO(pcs_coord_check_mesh(d->n_dims, d->dim_name, d->dim_size, &mesh), st, fail);
    uint32_t world = mesh.world;
    PCS_CHECK_GOTO(ensure_slot((void ***)&c->jobs, &c->n_jobs, &c->cap_jobs, number), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(1, sizeof *j, (void **)&j), st, fail);
    j->spec = d->spec;
    j->plan = d->plan;
    PCS_CHECK_GOTO(dup_or_empty(d->name, &j->name), st, fail);
    PCS_CHECK_GOTO(dup_or_empty(d->request_id, &j->request_id), st, fail);
    PCS_CHECK_GOTO(dup_or_empty(d->owner, &j->owner), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_worker, (void **)&j->rank_worker), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(world, 1, (void **)&j->rank_done), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_report_ms, (void **)&j->rank_report_ms), st,
                   fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_step, (void **)&j->rank_step), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_step_ms, (void **)&j->rank_step_ms), st,
                   fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_loss, (void **)&j->rank_loss), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(world, sizeof *j->rank_bubble, (void **)&j->rank_bubble), st, fail);
    j->number = number;
    j->steps = d->steps;
    j->max_restarts = d->max_restarts;
    j->base_world = world;
    j->world_quantum = world / (pcs_mesh_size(&mesh, PCS_MESH_DP_SHARD)
                                    ? pcs_mesh_size(&mesh, PCS_MESH_DP_SHARD)
                                    : 1);
    if (!j->world_quantum || !mesh_has_dim(&mesh, PCS_MESH_DP_SHARD))
        j->world_quantum = world; /* no dp_shard dim to absorb a change: this world only */
    j->min_world = d->min_workers ? d->min_workers : world;
    j->max_world = d->max_workers ? d->max_workers : world;
    snprintf(j->id, sizeof j->id, "job-%" PRIu32, number);
    j->world_size = world;
    j->mesh = mesh;
    j->need_cuda = d->need_cuda;
    if (d->program && *d->program && !pcs_is_name_token(d->program, PCS_PROGRAM_NAME_MAX)) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "program: must be at most %d characters of [A-Za-z0-9._-]",
                           PCS_PROGRAM_NAME_MAX);
        goto fail;
    }
    snprintf(j->program, sizeof j->program, "%s", d->program ? d->program : "");
    snprintf(j->transport, sizeof j->transport, "%s",
             d->transport && strcmp(d->transport, "nccl") == 0 ? "nccl" : "gloo");
    j->plan_hash = d->plan_hash;
    j->fp_stages = pcs_mesh_size(&mesh, PCS_MESH_PP);
    PCS_CHECK_GOTO(
        pcs_calloc((size_t)j->fp_stages * FP_RING, sizeof *j->fp_ring, (void **)&j->fp_ring), st,
        fail);
    /* last: the map borrows j->request_id, which a failure above would free */
    if (*j->request_id)
        PCS_CHECK_GOTO(pcs_strmap_put(&c->by_request, j->request_id, number), st, fail);
    j->progress.audit_ok = true;
    c->jobs[number - 1] = j;
    *out = j;
    return PCS_OK;
fail:
    if (j) {
        job_free(c, j); /* frees the payload */
    } else if (c->cfg.free_payload && (d->spec || d->plan)) {
        c->cfg.free_payload(c->cfg.user, d->spec, d->plan);
    }
    return st;
}

pcs_coord_job_t *pcs_coord_job_by_request(pcs_coord_t *c, const char *request_id)
{
    uint32_t n;
    if (!request_id || !*request_id || !pcs_strmap_get(&c->by_request, request_id, &n))
        return NULL;
    return pcs_coord_job_by_number(c, n);
}

pcs_status_t pcs_coord_submit(pcs_coord_t *c, const pcs_coord_job_desc_t *d, pcs_coord_job_t **out)
{
    *out = NULL;
    pcs_coord_job_t *j;
    PCS_CHECK(new_job(c, (uint32_t)c->n_jobs + 1, d, &j));
    j->state = PCS_JOB_PENDING;
    j->created_wall_ms = wall_ms(c);
    c->n_pending++;
    PCS_INFO(PCS_SUB_COORD, "job %s submitted: name '%s' world size %" PRIu32, j->id, j->name,
             j->world_size);
    job_notify(c, j);
    *out = j;
    try_start_jobs(c);
    return PCS_OK;
}

pcs_status_t pcs_coord_lookup_job(pcs_coord_t *c, const char *job_id, pcs_coord_job_t **out)
{
    *out = NULL;
    if (!job_id || !*job_id)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "job_id: required");
    uint32_t n;
    pcs_coord_job_t *j = NULL;
    if (parse_number(job_id, "job-", &n) == PCS_OK)
        j = pcs_coord_job_by_number(c, n);
    if (!j && n && n <= c->n_jobs)
        return pcs_set_error(PCS_ERR_NOT_FOUND,
                             "job %.*s: finished and forgotten (the history keeps the newest %" PRIu32
                             " finished jobs: max-finished-jobs)",
                             pcs_utf8_prefix(job_id, 64), job_id, c->cfg.max_finished_jobs);
    if (!j)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "job %.*s: no such job",
                             pcs_utf8_prefix(job_id, 64), job_id);
    *out = j;
    return PCS_OK;
}

void pcs_coord_job_drop_spec(pcs_coord_t *c, pcs_coord_job_t *j)
{
    if (!j->spec || !pcs_job_state_terminal(j->state))
        return;
    if (c->cfg.free_payload)
        c->cfg.free_payload(c->cfg.user, j->spec, NULL);
    j->spec = NULL;
}

/* History keeps no per-rank state: a finished job of a million ranks costs what one of two does
 * (every reader of these arrays checks for a RUNNING job first). */
static void drop_rank_state(pcs_coord_t *c, pcs_coord_job_t *j)
{
    kv_clear(c, j);
    free(j->rank_worker);
    free(j->rank_reserved);
    free(j->rank_done);
    free(j->rank_report_ms);
    free(j->rank_step);
    free(j->rank_step_ms);
    free(j->rank_loss);
    free(j->rank_bubble);
    free(j->fp_ring);
    j->rank_worker = j->rank_reserved = NULL;
    j->rank_done = NULL;
    j->rank_report_ms = NULL;
    j->rank_step = NULL;
    j->rank_step_ms = j->rank_loss = j->rank_bubble = NULL;
    j->fp_ring = NULL;
    j->fp_stages = 0;
}

/* The history keeps the newest max_finished_jobs finished jobs: older ones are freed, their
 * request ids no longer deduplicate, their numbers are never handed out again. */
static void remember_finished(pcs_coord_t *c, pcs_coord_job_t *j)
{
    if (c->done_head + c->n_done == c->cap_done) {
        if (c->done_head) {
            memmove(c->done, c->done + c->done_head, c->n_done * sizeof *c->done);
            c->done_head = 0;
        } else if (pcs_grow((void **)&c->done, &c->cap_done, c->n_done + 1, sizeof *c->done) !=
                   PCS_OK) {
            return; /* kept, just never forgotten */
        }
    }
    c->done[c->done_head + c->n_done++] = j->number;
    while (c->n_done > c->cfg.max_finished_jobs) {
        uint32_t num = c->done[c->done_head++];
        c->n_done--;
        pcs_coord_job_t *old = pcs_coord_job_by_number(c, num);
        if (!old || !pcs_job_state_terminal(old->state))
            continue;
        if (*old->request_id)
            pcs_strmap_del(&c->by_request, old->request_id);
        c->jobs[num - 1] = NULL;
        job_free(c, old);
        c->forgotten++;
        if (c->cfg.on_job_forget)
            c->cfg.on_job_forget(c->cfg.user, num);
    }
    if (!c->n_done)
        c->done_head = 0;
}

void pcs_coord_job_set_plan(pcs_coord_t *c, pcs_coord_job_t *j, void *plan)
{
    if (j->plan && j->plan != plan && c->cfg.free_payload)
        c->cfg.free_payload(c->cfg.user, NULL, j->plan);
    j->plan = plan;
}

void pcs_coord_job_set_restarts(pcs_coord_job_t *j, uint32_t restarts)
{
    j->restarts = restarts;
}

void pcs_coord_job_drop_plan(pcs_coord_t *c, pcs_coord_job_t *j)
{
    if (!j->plan || !pcs_job_state_terminal(j->state))
        return;
    if (c->cfg.free_payload)
        c->cfg.free_payload(c->cfg.user, NULL, j->plan);
    j->plan = NULL;
}

const char *pcs_coord_job_transport(const char *backend, const char *collectives)
{
    if (collectives && strcmp(collectives, "nccl") == 0)
        return "nccl";
    if (collectives && strcmp(collectives, "gloo") == 0)
        return "gloo";
    return backend && strcmp(backend, "cuda") == 0 ? "nccl" : "gloo";
}

/* A job that names its program runs only on workers that registered as that program (a Python
 * program of pcs.torch computes any nn.Module; pcs-worker only its own layer classes); a job that
 * names none runs on pcs-worker or on a worker that named no program, never on one that asked
 * for jobs by name (a pcs.torch process cannot run the built-in model). */
static bool is_program(const pcs_coord_worker_t *w, const pcs_coord_job_t *j)
{
    const char *wp = w->program ? w->program : "";
    if (!j->program[0])
        return !wp[0] || strcmp(wp, "pcs-worker") == 0;
    return strcmp(wp, j->program) == 0;
}

/* A worker that states what it offers must offer the job's transport (a GPU pod started with
 * --coll nccl cannot take a Gloo job); one that states nothing is not filtered. */
static bool offers(const pcs_coord_worker_t *w, const char *transport)
{
    if (w->n_backends == 0)
        return true;
    for (size_t i = 0; i < w->n_backends; i++)
        if (strcmp(w->backends[i], transport) == 0)
            return true;
    return false;
}

static bool eligible(const pcs_coord_t *c, const pcs_coord_worker_t *w, const pcs_coord_job_t *j)
{
    return w && w->state == PCS_WORKER_IDLE && fresh(c, w) && (!j->need_cuda || w->has_cuda) &&
           offers(w, j->transport) && is_program(w, j);
}

static void start_job(pcs_coord_t *c, pcs_coord_job_t *j)
{
    uint32_t r = 0;
    if (j->generation && (j->restarts || j->world_size != j->base_world)) {
        /* a restart: the world size its eligible workers allow (its own, or fewer after the
         * elastic wait), with a plan for it */
        uint32_t avail = 0;
        for (size_t i = 0; i < c->n_workers; i++)
            avail += eligible(c, c->workers[i], j);
        uint32_t world = restart_world(c, j, avail);
        if (!world)
            return;
        if (world != j->world_size) {
            uint64_t hash = 0;
            pcs_mesh_t m = j->mesh;
            uint32_t sizes[4], names[4];
            for (uint32_t k = 0; k < m.n; k++) {
                names[k] = m.dim[k];
                sizes[k] = m.dim[k] == PCS_MESH_DP_SHARD ? m.size[k] * world / j->world_size
                                                         : m.size[k];
            }
            pcs_mesh_t nm;
            if (pcs_mesh_init(m.n, names, sizes, &nm) != PCS_OK || nm.world != world ||
                c->cfg.replan(c->cfg.user, j, world, &hash) != PCS_OK ||
                resize_ranks(j, world) != PCS_OK) {
                PCS_WARN(PCS_SUB_COORD, "job %s: cannot restart with %" PRIu32 " ranks: %s",
                         j->id, world, pcs_last_error());
                return;
            }
            PCS_INFO(PCS_SUB_COORD, "job %s: restarts with %" PRIu32 " ranks instead of %" PRIu32,
                     j->id, world, j->world_size);
            j->mesh = nm;
            j->world_size = world;
            j->plan_hash = hash;
        }
        if (j->n_log)
            j->log[j->n_log - 1].world_after = world;
    }
    /* FIFO by registration: worker numbers are handed out in registration order. */
    for (size_t i = 0; i < c->n_workers && r < j->world_size; i++) {
        pcs_coord_worker_t *w = c->workers[i];
        if (eligible(c, w, j))
            j->rank_worker[r++] = w->number;
    }
    if (r < j->world_size)
        return; /* not enough eligible (e.g. cuda) workers yet */
    c->n_pending--;
    j->state = PCS_JOB_RUNNING;
    j->generation++;
    j->started_wall_ms = wall_ms(c);
    j->started_mono_ms = now_ms(c);
    memset(j->rank_done, 0, j->world_size);
    memset(j->rank_report_ms, 0, (size_t)j->world_size * sizeof *j->rank_report_ms);
    memset(j->rank_step, 0, (size_t)j->world_size * sizeof *j->rank_step);
    memset(j->rank_step_ms, 0, (size_t)j->world_size * sizeof *j->rank_step_ms);
    memset(j->rank_loss, 0, (size_t)j->world_size * sizeof *j->rank_loss);
    memset(j->rank_bubble, 0, (size_t)j->world_size * sizeof *j->rank_bubble);
    j->n_done = 0;
    if (j->fp_ring)
        memset(j->fp_ring, 0, (size_t)j->fp_stages * FP_RING * sizeof *j->fp_ring);
    free(j->reason);
    j->reason = NULL;
    /* ranks per host: one pass counting (local rank = ranks before on the same host), one
     * reading the counts back; a host map that cannot grow leaves the sizes unknown (0) */
    pcs_strmap_t hosts = PCS_STRMAP_BORROWED;
    bool counted = pcs_strmap_reserve(&hosts, j->world_size) == PCS_OK;
    for (r = 0; r < j->world_size; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_worker[r]);
        set_worker_state(c, w, PCS_WORKER_ASSIGNED);
        w->job = j;
        w->rank = r;
        w->local_rank = w->local_size = 0;
        uint32_t n = 0;
        const char *h = w->host ? w->host : "";
        if (counted) {
            pcs_strmap_get(&hosts, h, &n);
            counted = pcs_strmap_put(&hosts, h, n + 1) == PCS_OK;
            w->local_rank = n;
        }
    }
    for (r = 0; counted && r < j->world_size; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_worker[r]);
        pcs_strmap_get(&hosts, w->host ? w->host : "", &w->local_size);
    }
    pcs_strmap_free(&hosts);
    PCS_INFO(PCS_SUB_COORD,
             "job %s RUNNING: generation %" PRIu64 ", %" PRIu32 " workers (%s .. %s)", j->id,
             j->generation, j->world_size, pcs_coord_worker_by_number(c, j->rank_worker[0])->id,
             pcs_coord_worker_by_number(c, j->rank_worker[j->world_size - 1])->id);
    job_notify(c, j);
    for (r = 0; r < j->world_size; r++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_worker[r]);
        push_event(c, w, PCS_EV_ASSIGNMENT, j, "gang start");
    }
}

/* Gang start: each PENDING job, oldest first, starts when enough eligible IDLE workers exist.
 * A job too large for the cluster does not block smaller ones behind it (backfill). */
static void try_start_jobs(pcs_coord_t *c)
{
    for (size_t i = 0; i < c->n_jobs && c->n_pending && c->idle_live; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        /* a restarting job may start smaller than it was (elastic) */
        uint32_t need = j && j->generation ? j->min_world : j ? j->world_size : 0;
        if (j && j->state == PCS_JOB_PENDING && need <= c->idle_live)
            start_job(c, j);
    }
}

pcs_status_t pcs_coord_cancel(pcs_coord_t *c, const char *job_id, const char *reason,
                              pcs_coord_job_t **out)
{
    pcs_coord_job_t *j;
    PCS_CHECK(pcs_coord_lookup_job(c, job_id, &j));
    *out = j;
    if (j->state == PCS_JOB_CANCELLED)
        return PCS_OK; /* idempotent: a retried cancel (after UNAVAILABLE) sees its own result */
    if (pcs_job_state_terminal(j->state))
        return pcs_set_error(PCS_ERR_STATE, "job %s is already %s", j->id,
                             pcs_job_state_name(j->state));
    job_set_reason(j, "cancelled%s%.*s", reason && *reason ? ": " : "",
                   pcs_utf8_prefix(reason, 400), reason ? reason : "");
    job_finish(c, j, PCS_JOB_CANCELLED);
    return PCS_OK;
}

pcs_status_t pcs_coord_report_step(pcs_coord_t *c, const pcs_coord_report_t *r, int *directive,
                                   char *reason, size_t reason_len)
{
    *directive = 0;
    if (reason_len)
        reason[0] = 0;
    pcs_coord_worker_t *w;
    pcs_coord_job_t *j;
    PCS_CHECK(pcs_coord_lookup_worker(c, r->worker_id, &w));
    PCS_CHECK(pcs_coord_lookup_job(c, r->job_id, &j));
    if (w->state == PCS_WORKER_LOST || w->state == PCS_WORKER_GONE)
        return pcs_set_error(PCS_ERR_STATE, "worker %s is %s: re-register", w->id,
                             pcs_worker_state_name(w->state));
    if (j->state == PCS_JOB_RUNNING && j->n_unclaimed && r->generation == j->generation &&
        r->rank < j->world_size && !j->rank_worker[r->rank] && !w->job &&
        w->state == PCS_WORKER_IDLE &&
        (!j->rank_reserved || !j->rank_reserved[r->rank] ||
         j->rank_reserved[r->rank] == w->number)) {
        /* a rank of a job restored from the store comes back (a rank reserved for another
         * worker is not given to whoever reports it) */
        take_rank_back(c, j, w, r->rank, "step report");
    }
    if (w->state == PCS_WORKER_STOPPING && w->stop_job == j->number &&
        w->stop_gen == r->generation && (r->done || (r->error && *r->error)))
        stop_confirmed(c, w, "final report"); /* its loop over the job has ended */
    if (j->state != PCS_JOB_RUNNING || w->job != j || r->generation != j->generation) {
        /* Not an error: the worker is behind. Tell it to stop (a generation that a restart
         * replaced: to restart, it will be given its place in the next one). */
        *directive = j->state == PCS_JOB_PENDING && j->restarts ? PCS_EV_RESTART : PCS_EV_STOP;
        snprintf(reason, reason_len, "job %s is %s%s%s", j->id, pcs_job_state_name(j->state),
                 j->reason ? ": " : "", j->reason ? j->reason : "");
        if (j->state == PCS_JOB_RUNNING)
            snprintf(reason, reason_len, "worker %s is not in job %s generation %" PRIu64, w->id,
                     j->id, r->generation);
        return PCS_OK;
    }
    if (r->rank != w->rank)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "rank: %" PRIu32 " but worker %s has rank %" PRIu32, r->rank, w->id,
                             w->rank);
    if (j->steps && r->step > j->steps)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "step: %" PRIu64 " but job %s runs %" PRIu64 " steps", r->step, j->id,
                             j->steps);
    if (r->done && j->steps && r->step != j->steps && !(r->error && *r->error))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "done: at step %" PRIu64 " but job %s ends at step %" PRIu64, r->step,
                             j->id, j->steps);
    uint64_t last = j->rank_step[r->rank];
    if (last && !(r->error && *r->error)) { /* an error may come at any step */
        if (r->step < last)
            return pcs_set_error(PCS_ERR_STATE,
                                 "step: %" PRIu64 " of rank %" PRIu32 " does not follow its last "
                                 "report (step %" PRIu64 ")",
                                 r->step, r->rank, last);
        if (r->step == last && (!r->done || j->rank_done[r->rank]))
            return PCS_OK; /* a retry of a report whose reply was lost: counted once */
    }
    w->last_heartbeat_ms = now_ms(c); /* a report is proof of life too */
    w->last_heartbeat_wall_ms = wall_ms(c);
    if (r->error && *r->error) {
        /* An error report is no step: progress, loss and the audit keep the last real step.
         * The reason leads with the rank the reporter blames (the one that died or went
         * silent), then who reported it. */
        pcs_coord_worker_t *peer =
            r->peer_fault && r->peer_rank < j->world_size && r->peer_rank != r->rank
                ? pcs_coord_worker_by_number(c, j->rank_worker[r->peer_rank])
                : NULL;
        if (peer)
            job_set_reason(j,
                           "rank %" PRIu32 " (worker %s) %s; reported by rank %" PRIu32
                           " (worker %s) at step %" PRIu64 ": %.*s",
                           r->peer_rank, peer->id,
                           r->peer_fault == 2 ? "made no progress" : "died", r->rank, w->id,
                           r->step, pcs_utf8_prefix(r->error, 300), r->error);
        else
            job_set_reason(j, "rank %" PRIu32 " (worker %s) failed at step %" PRIu64 ": %.*s",
                           r->rank, w->id, r->step, pcs_utf8_prefix(r->error, 300), r->error);
        j->rank_done[r->rank] = 1; /* its loop over the job has ended: it is IDLE at once */
        job_fail(c, j);
        *directive = PCS_EV_STOP;
        snprintf(reason, reason_len, "%s", j->reason);
        return PCS_OK;
    }
    j->rank_report_ms[r->rank] = now_ms(c);
    j->rank_step[r->rank] = r->step;
    j->rank_step_ms[r->rank] = r->step_ms;
    j->rank_loss[r->rank] = r->loss;
    /* pipeline stages: the share of the action list not computing (-1: no stages) */
    j->rank_bubble[r->rank] =
        r->pipeline_ms > 0 && r->compute_ms <= r->pipeline_ms ? 1.0 - r->compute_ms / r->pipeline_ms
        : r->pipeline_ms > 0                                  ? 0.0
                                                              : -1.0;
    pcs_coord_progress_t *p = &j->progress;
    p->reports++;
    if (r->step >= p->step) {
        p->step = r->step;
        if (r->rank == 0 || p->reports == 1) {
            p->loss = r->loss;
            p->step_ms = r->step_ms;
            p->eval_loss = r->eval_loss;
            p->loss_scale = r->loss_scale;
            p->skipped_steps = r->skipped_steps;
        }
    }
    if (!r->audit_ok)
        p->audit_ok = false;
    p->all_gather_bytes += r->all_gather_bytes;
    p->reduce_scatter_bytes += r->reduce_scatter_bytes;
    p->all_reduce_bytes += r->all_reduce_bytes;
    if (r->fingerprint) {
        uint32_t co[4];
        pcs_mesh_coords(&j->mesh, r->rank, co);
        fp_slot_t *slot = &j->fp_ring[(size_t)co[PCS_MESH_PP] * FP_RING + r->step % FP_RING];
        if (slot->used && slot->step == r->step && slot->fp != r->fingerprint &&
            slot->rank != r->rank) {
            pcs_coord_worker_t *other = pcs_coord_worker_by_number(c, j->rank_worker[slot->rank]);
            job_set_reason(j,
                           "ranks %" PRIu32 " (worker %s) and %" PRIu32
                           " (worker %s) ran different "
                           "collective sequences at step %" PRIu64 " (fingerprint %016" PRIx64
                           " vs %016" PRIx64 ")",
                           slot->rank, other ? other->id : "?", r->rank, w->id, r->step, slot->fp,
                           r->fingerprint);
            PCS_WARN(PCS_SUB_COORD, "job %s: %s", j->id, j->reason);
            job_finish(c, j, PCS_JOB_FAILED);
            *directive = PCS_EV_STOP;
            snprintf(reason, reason_len, "%s", j->reason);
            return PCS_OK;
        }
        if (!slot->used || slot->step != r->step) {
            slot->used = true;
            slot->step = r->step;
            slot->fp = r->fingerprint;
            slot->rank = r->rank;
        }
    }
    if (r->done && !j->rank_done[r->rank]) {
        j->rank_done[r->rank] = 1;
        if (++j->n_done == j->world_size) {
            job_set_reason(j, "all %" PRIu32 " ranks finished at step %" PRIu64, j->world_size,
                           p->step);
            job_finish(c, j, PCS_JOB_SUCCEEDED);
        }
    }
    return PCS_OK;
}

// ---------------------------------------------------------------------------------------------
// rendezvous KV

static pcs_status_t kv_scope(pcs_coord_t *c, const char *job_id, uint64_t generation,
                             const char *key, pcs_coord_job_t **out)
{
    pcs_coord_job_t *j;
    PCS_CHECK(pcs_coord_lookup_job(c, job_id, &j));
    if (!key || !*key)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "key: required");
    size_t kl = strlen(key);
    if (kl > c->cfg.kv_max_key_bytes)
        return pcs_set_error(PCS_ERR_LIMIT, "key: %zu bytes exceeds the limit of %" PRIu32 " bytes",
                             kl, c->cfg.kv_max_key_bytes);
    if (j->state != PCS_JOB_RUNNING)
        return pcs_set_error(PCS_ERR_STATE, "job %s is %s: the KV exists only while it runs", j->id,
                             pcs_job_state_name(j->state));
    if (generation != j->generation)
        return pcs_set_error(PCS_ERR_STATE,
                             "generation %" PRIu64 " of job %s is not current (%" PRIu64 ")",
                             generation, j->id, j->generation);
    *out = j;
    return PCS_OK;
}

pcs_status_t pcs_coord_kv_set(pcs_coord_t *c, const char *job_id, uint64_t generation,
                              const char *key, const void *value, size_t len)
{
    pcs_coord_job_t *j;
    PCS_CHECK(kv_scope(c, job_id, generation, key, &j));
    if (len > c->cfg.kv_max_value_bytes)
        return pcs_set_error(PCS_ERR_LIMIT,
                             "value: %zu bytes exceeds the limit of %" PRIu32 " bytes", len,
                             c->cfg.kv_max_value_bytes);
    if (!j->kv_index) {
        PCS_CHECK(pcs_calloc(1, sizeof(pcs_strmap_t), &j->kv_index));
    }
    uint32_t idx;
    bool exists = pcs_strmap_get(j->kv_index, key, &idx);
    uint64_t old = exists ? j->kv[idx].len + strlen(key) : 0;
    uint64_t total = j->kv_bytes - old + len + strlen(key);
    if (total > c->cfg.kv_max_job_bytes)
        return pcs_set_error(PCS_ERR_LIMIT,
                             "job %s: KV would hold %" PRIu64 " bytes, over the limit of %" PRIu64,
                             j->id, total, c->cfg.kv_max_job_bytes);
    uint64_t all = c->kv_total - j->kv_bytes + total;
    if (all > c->cfg.kv_max_total_bytes)
        return pcs_set_error(PCS_ERR_LIMIT,
                             "KV of all jobs would hold %" PRIu64 " bytes, over the limit of %" PRIu64
                             " (kv-max-total-bytes)",
                             all, c->cfg.kv_max_total_bytes);
    uint8_t *copy = NULL;
    PCS_CHECK(pcs_calloc(len ? len : 1, 1, (void **)&copy));
    if (len)
        memcpy(copy, value, len);
    if (exists) {
        free(j->kv[idx].value);
    } else {
        pcs_status_t st = pcs_grow((void **)&j->kv, &j->kv_cap, j->kv_len + 1, sizeof *j->kv);
        char *k = NULL;
        if (st == PCS_OK)
            st = pcs_strdup(key, &k);
        if (st == PCS_OK)
            st = pcs_strmap_put(j->kv_index, k, (uint32_t)j->kv_len);
        if (st != PCS_OK) {
            free(k);
            free(copy);
            return st;
        }
        idx = (uint32_t)j->kv_len++;
        j->kv[idx].key = k;
    }
    j->kv[idx].value = copy;
    j->kv[idx].len = len;
    c->kv_total = all;
    j->kv_bytes = total;
    /* Wake the parked gets of this key. Compact the list first: callbacks may re-enter. */
    size_t n = 0, woke = 0;
    kv_waiter_t *hits = NULL;
    for (size_t i = 0; i < j->n_waiters; i++)
        if (strcmp(j->waiters[i].key, key) == 0)
            woke++;
    if (woke && pcs_calloc(woke, sizeof *hits, (void **)&hits) == PCS_OK) {
        woke = 0;
        for (size_t i = 0; i < j->n_waiters; i++) {
            if (strcmp(j->waiters[i].key, key) == 0)
                hits[woke++] = j->waiters[i];
            else
                j->waiters[n++] = j->waiters[i];
        }
        j->n_waiters = n;
        for (size_t i = 0; i < woke; i++) {
            /* value stays valid: no KV mutation happens before the callbacks return */
            if (c->cfg.on_kv_wake)
                c->cfg.on_kv_wake(c->cfg.user, hits[i].token, PCS_OK, copy, len);
            free(hits[i].key);
        }
        free(hits);
    }
    return PCS_OK;
}

pcs_status_t pcs_coord_kv_get(pcs_coord_t *c, const char *job_id, uint64_t generation,
                              const char *key, uint32_t wait_ms, void *waiter, int *found,
                              const void **value, size_t *len)
{
    *found = 0;
    *value = NULL;
    *len = 0;
    pcs_coord_job_t *j;
    PCS_CHECK(kv_scope(c, job_id, generation, key, &j));
    uint32_t idx;
    if (j->kv_index && pcs_strmap_get(j->kv_index, key, &idx)) {
        *found = 1;
        *value = j->kv[idx].value;
        *len = j->kv[idx].len;
        return PCS_OK;
    }
    if (wait_ms == 0 || !waiter)
        return PCS_OK;
    /* Rendezvous parks a few gets per rank at a time; a client that parks without bound would
     * hold coordinator memory until the job ends. */
    size_t limit = (size_t)PCS_COORD_KV_WAITERS_PER_RANK * j->world_size + 1024;
    if (j->n_waiters >= limit)
        return pcs_set_error(PCS_ERR_LIMIT,
                             "KvGet: job %s already has %zu parked gets (limit %zu = %u per rank "
                             "+ 1024): retry later",
                             j->id, j->n_waiters, limit, PCS_COORD_KV_WAITERS_PER_RANK);
    PCS_CHECK(
        pcs_grow((void **)&j->waiters, &j->cap_waiters, j->n_waiters + 1, sizeof *j->waiters));
    kv_waiter_t *wt = &j->waiters[j->n_waiters];
    memset(wt, 0, sizeof *wt);
    PCS_CHECK(pcs_strdup(key, &wt->key));
    wt->token = waiter;
    wt->deadline_ms = now_ms(c) + wait_ms;
    j->n_waiters++;
    *found = -1;
    return PCS_OK;
}

void pcs_coord_kv_cancel(pcs_coord_t *c, void *waiter)
{
    for (size_t i = 0; i < c->n_jobs; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        if (!j)
            continue;
        for (size_t k = 0; k < j->n_waiters; k++) {
            if (j->waiters[k].token == waiter) {
                free(j->waiters[k].key);
                j->waiters[k] = j->waiters[--j->n_waiters];
                return;
            }
        }
    }
}

void pcs_coord_kv_fail_all(pcs_coord_t *c, pcs_status_t st, const char *why)
{
    for (size_t i = 0; i < c->n_jobs; i++)
        if (c->jobs[i] && c->jobs[i]->n_waiters)
            kv_fail_waiters(c, c->jobs[i], st, why);
}

// ---------------------------------------------------------------------------------------------
// time

/* A time stamp taken before a stall of `gap` ms, moved forward by it, never past `now`. */
static uint64_t shift_by_gap(uint64_t t, uint64_t gap, uint64_t now)
{
    return t + gap < now ? t + gap : now;
}

/* The coordinator did not run for `gap` ms: nobody could reach it, so nobody failed to. */
static void stalled(pcs_coord_t *c, uint64_t now, uint64_t gap)
{
    uint32_t renewed = 0, moved = 0;
    for (size_t i = 0; i < c->n_workers; i++) {
        pcs_coord_worker_t *w = c->workers[i];
        if (w &&
            (w->state == PCS_WORKER_IDLE || w->state == PCS_WORKER_ASSIGNED ||
             w->state == PCS_WORKER_STOPPING) &&
            w->last_heartbeat_ms < now) {
            w->last_heartbeat_ms = now;
            renewed++;
        }
        if (w && w->held_until_ms)
            w->held_until_ms += gap; /* a restored worker's hold: nobody could come back */
    }
    for (size_t i = 0; i < c->n_jobs; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        if (!j || j->state != PCS_JOB_RUNNING)
            continue;
        if (j->n_unclaimed) {
            j->reclaim_by_ms += gap;
            moved++;
        }
        /* nobody could report to a coordinator that did not run; a report read before this
         * tick (queued during the stall) is already fresh and must not move into the future */
        j->started_mono_ms = shift_by_gap(j->started_mono_ms, gap, now);
        for (uint32_t r = 0; r < j->world_size; r++)
            if (j->rank_report_ms[r])
                j->rank_report_ms[r] = shift_by_gap(j->rank_report_ms[r], gap, now);
    }
    PCS_WARN(PCS_SUB_COORD,
             "coordinator stalled for %" PRIu64 " ms (more than half the lease, %" PRIu32
             " ms): renewed %" PRIu32 " leases, moved %" PRIu32 " re-adoption deadlines",
             gap, c->cfg.lease_ms, renewed, moved);
}

/* "61.0 s" / "850 ms" */
static void fmt_ms(char *buf, size_t n, uint64_t ms)
{
    if (ms >= 10000)
        snprintf(buf, n, "%.1f s", (double)ms / 1e3);
    else
        snprintf(buf, n, "%" PRIu64 " ms", ms);
}

/* Progress watchdog (once a second): a RUNNING job none of whose ranks may be silent longer than
 * its limit. Ranks whose workers do not heartbeat either (dead, paused) are named first: the
 * others are most likely waiting for them in a collective. */
static void watch_progress(pcs_coord_t *c, uint64_t now)
{
    uint64_t hb_stale = 3ull * c->cfg.heartbeat_interval_ms;
    for (size_t i = 0; i < c->n_jobs; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        if (!j || j->state != PCS_JOB_RUNNING || j->n_unclaimed)
            continue;
        uint64_t step_ms = j->progress.step_ms > 0 ? (uint64_t)j->progress.step_ms : 0;
        uint64_t limit = (uint64_t)c->cfg.step_timeout_factor * step_ms;
        if (limit < c->cfg.step_timeout_min_ms)
            limit = c->cfg.step_timeout_min_ms;
        uint32_t silent = 0;
        for (uint32_t r = 0; r < j->world_size; r++) {
            uint64_t last = j->rank_report_ms[r];
            if (j->rank_done[r])
                continue; /* finished: waits for the others, says nothing more */
            if (last ? now > last && now - last > limit
                     : now - j->started_mono_ms > c->cfg.first_step_timeout_ms)
                silent++;
        }
        if (!silent)
            continue;
        char list[320] = "";
        size_t o = 0;
        uint32_t listed = 0;
        for (int pass = 0; pass < 2; pass++) { /* no heartbeat either first */
            for (uint32_t r = 0; r < j->world_size && listed < 8; r++) {
                uint64_t last = j->rank_report_ms[r];
                if (j->rank_done[r] ||
                    !(last ? now > last && now - last > limit
                           : now - j->started_mono_ms > c->cfg.first_step_timeout_ms))
                    continue;
                pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, j->rank_worker[r]);
                uint64_t quiet = w ? now - w->last_heartbeat_ms : UINT64_MAX;
                if ((quiet > hb_stale) != (pass == 0))
                    continue;
                char q[32] = "";
                if (w && quiet > hb_stale)
                    fmt_ms(q, sizeof q, quiet);
                int n = snprintf(list + o, sizeof list - o, "%s%" PRIu32 " (worker %s, %s%s)",
                                 listed ? ", " : "", r, w ? w->id : "?",
                                 quiet > hb_stale ? "no heartbeat for " : "heartbeating", q);
                o += n > 0 && (size_t)n < sizeof list - o ? (size_t)n : 0;
                listed++;
            }
        }
        if (silent > listed)
            snprintf(list + o, sizeof list - o, " and %" PRIu32 " more", silent - listed);
        char lim[32], first[32], smin[32];
        fmt_ms(lim, sizeof lim, limit);
        fmt_ms(first, sizeof first, c->cfg.first_step_timeout_ms);
        fmt_ms(smin, sizeof smin, c->cfg.step_timeout_min_ms);
        if (j->progress.reports)
            job_set_reason(j,
                           "no step report for over %s (%" PRIu32 " x the %.1f ms step time, at "
                           "least %s) from rank%s %s; last step %" PRIu64,
                           lim, c->cfg.step_timeout_factor, j->progress.step_ms, smin,
                           silent > 1 ? "s" : "", list, j->progress.step);
        else
            job_set_reason(j, "no first step report within %s of the start from rank%s %s", first,
                           silent > 1 ? "s" : "", list);
        PCS_WARN(PCS_SUB_COORD, "job %s: %s", j->id, j->reason);
        job_fail(c, j);
    }
}

uint64_t pcs_coord_tick(pcs_coord_t *c)
{
    uint64_t now = now_ms(c);
    uint64_t gap = c->last_tick_ms && now > c->last_tick_ms ? now - c->last_tick_ms : 0;
    c->last_tick_ms = now;
    if (gap > c->cfg.lease_ms / 2)
        stalled(c, now, gap);
    else
        gap = 0;
    if (now >= c->next_watch_ms) {
        c->next_watch_ms = now + 1000;
        watch_progress(c, now);
        if (c->n_pending && c->idle_live)
            try_start_jobs(c); /* a restarting job whose elastic wait has passed */
    }
    for (size_t i = 0; i < c->n_workers; i++) {
        pcs_coord_worker_t *w = c->workers[i];
        if (!w || (w->state != PCS_WORKER_IDLE && w->state != PCS_WORKER_ASSIGNED &&
                   w->state != PCS_WORKER_STOPPING))
            continue;
        if (now > w->last_heartbeat_ms + c->cfg.lease_ms) {
            char why[128];
            snprintf(why, sizeof why,
                     "lost: no heartbeat for %" PRIu64 " ms (lease %" PRIu32 " ms)",
                     now - w->last_heartbeat_ms, c->cfg.lease_ms);
            PCS_WARN(PCS_SUB_COORD, "worker %s (%s) %s", w->id, w->identity, why);
            worker_left(c, w, PCS_WORKER_LOST, why);
        }
    }
    for (size_t i = 0; i < c->n_jobs; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        if (!j || j->state != PCS_JOB_RUNNING || !j->n_unclaimed || now < j->reclaim_by_ms)
            continue;
        uint32_t r = 0;
        while (r + 1 < j->world_size && j->rank_worker[r])
            r++;
        /* name the missing ranks (and the workers that held them, when the store knew) */
        char missing[256] = "";
        size_t o = 0;
        uint32_t listed = 0;
        for (uint32_t k = 0; k < j->world_size && o < sizeof missing; k++) {
            if (j->rank_worker[k])
                continue;
            if (listed == 8) {
                o += (size_t)snprintf(missing + o, sizeof missing - o, ", ...");
                break;
            }
            pcs_coord_worker_t *held =
                j->rank_reserved ? pcs_coord_worker_by_number(c, j->rank_reserved[k]) : NULL;
            int n = held ? snprintf(missing + o, sizeof missing - o, "%s%" PRIu32 " (%s)",
                                    listed ? ", " : "", k, held->id)
                         : snprintf(missing + o, sizeof missing - o, "%s%" PRIu32,
                                    listed ? ", " : "", k);
            o += n > 0 ? (size_t)n : 0;
            listed++;
        }
        job_set_reason(j,
                       "%" PRIu32 " of %" PRIu32 " ranks (first: rank %" PRIu32 ") did not come "
                       "back within %" PRIu32 " ms of a coordinator restart; missing ranks: %s",
                       j->n_unclaimed, j->world_size, r, c->cfg.readopt_ms, missing);
        PCS_WARN(PCS_SUB_COORD, "job %s: %s", j->id, j->reason);
        j->n_unclaimed = 0;
        job_fail(c, j);
    }
    for (size_t i = 0; i < c->n_jobs; i++) {
        pcs_coord_job_t *j = c->jobs[i];
        if (!j || !j->n_waiters)
            continue;
        for (size_t k = 0; k < j->n_waiters;) {
            if (now >= j->waiters[k].deadline_ms) {
                kv_waiter_t wt = j->waiters[k];
                j->waiters[k] = j->waiters[--j->n_waiters];
                if (c->cfg.on_kv_wake)
                    c->cfg.on_kv_wake(c->cfg.user, wt.token, PCS_OK, NULL, 0);
                free(wt.key);
            } else {
                k++;
            }
        }
    }
    return gap;
}

void pcs_coord_counts(const pcs_coord_t *c, pcs_coord_counts_t *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < c->n_workers; i++)
        if (c->workers[i] && c->workers[i]->state >= 1 && c->workers[i]->state <= 5)
            out->workers[c->workers[i]->state]++;
    for (size_t i = 0; i < c->n_jobs; i++)
        if (c->jobs[i])
            out->jobs[c->jobs[i]->state]++;
}

// ---------------------------------------------------------------------------------------------
// restore

pcs_status_t pcs_coord_restore_worker(pcs_coord_t *c, uint32_t number, const char *identity,
                                      const char *host)
{
    if (number == 0 || !identity || !*identity)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "restore: worker number and identity required");
    if (number > MAX_RESTORED_NUMBER)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "restore: worker number %" PRIu32 " exceeds %u (corrupt store row)",
                             number, MAX_RESTORED_NUMBER);
    uint32_t n;
    if (pcs_coord_worker_by_number(c, number) || pcs_strmap_get(&c->by_identity, identity, &n))
        return pcs_set_error(PCS_ERR_EXISTS, "restore: worker %" PRIu32 " / %s already known",
                             number, identity);
    pcs_coord_worker_t *w;
    PCS_CHECK(new_worker(c, number, identity, &w));
    w->state = PCS_WORKER_GONE;
    PCS_CHECK(dup_or_empty(host, &w->host));
    return PCS_OK;
}

pcs_status_t pcs_coord_restore_secret(pcs_coord_t *c, uint32_t number, const uint8_t *hash)
{
    pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, number);
    if (!w || !hash)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "restore: no worker %" PRIu32, number);
    memcpy(w->secret_hash, hash, PCS_COORD_SECRET_HASH_BYTES);
    w->has_secret = true;
    w->held_until_ms = now_ms(c) + c->cfg.readopt_ms;
    return PCS_OK;
}

pcs_status_t pcs_coord_restore_job(pcs_coord_t *c, uint32_t number, const pcs_coord_job_desc_t *d,
                                   pcs_job_state_t state, const char *reason,
                                   uint64_t created_wall_ms, uint64_t started_wall_ms,
                                   uint64_t finished_wall_ms, uint64_t generation)
{
    if (number == 0 || number > MAX_RESTORED_NUMBER || pcs_coord_job_by_number(c, number)) {
        if (c->cfg.free_payload && (d->spec || d->plan))
            c->cfg.free_payload(c->cfg.user, d->spec, d->plan);
        if (number == 0 || number > MAX_RESTORED_NUMBER)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "restore: job number %" PRIu32
                                 " not in [1, %u] (corrupt store row)",
                                 number, MAX_RESTORED_NUMBER);
        return pcs_set_error(PCS_ERR_EXISTS, "restore: job %" PRIu32 " already known", number);
    }
    pcs_coord_job_t *j;
    PCS_CHECK(new_job(c, number, d, &j));
    j->created_wall_ms = created_wall_ms;
    j->started_wall_ms = started_wall_ms;
    j->finished_wall_ms = finished_wall_ms;
    j->generation = generation;
    if (reason && *reason)
        job_set_reason(j, "%s", reason);
    if (state == PCS_JOB_RUNNING) {
        /* Its workers train on (collectives never go through the coordinator): wait for each
         * rank to come back through a re-register or a step report. */
        j->n_unclaimed = j->world_size;
        j->reclaim_by_ms = now_ms(c) + c->cfg.readopt_ms;
        /* the watchdog starts over: every rank gets a full window from the restore */
        j->started_mono_ms = now_ms(c);
        for (uint32_t r = 0; r < j->world_size; r++)
            j->rank_report_ms[r] = j->started_mono_ms;
    }
    j->state = state;
    if (state == PCS_JOB_PENDING) {
        j->generation = 0;
        c->n_pending++;
    }
    if (pcs_job_state_terminal(state)) {
        drop_rank_state(c, j);
        remember_finished(c, j); /* rows come by number: the oldest are forgotten first */
    }
    return PCS_OK;
}

void pcs_coord_restore_progress(pcs_coord_t *c, pcs_coord_job_t *j, const pcs_coord_progress_t *p)
{
    (void)c;
    j->progress = *p;
}

pcs_status_t pcs_coord_restore_ranks(pcs_coord_t *c, pcs_coord_job_t *j, const uint32_t *worker,
                                     const uint32_t *pid, const uint64_t *incarnation, uint32_t n)
{
    if (!j || j->state != PCS_JOB_RUNNING || !j->n_unclaimed || j->n_unclaimed != j->world_size)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "restore ranks: job %s is not a restored RUNNING job",
                             j ? j->id : "(null)");
    if (j->rank_reserved)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "restore ranks: job %s: already restored", j->id);
    if (!worker || n != j->world_size)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "restore ranks: job %s: %" PRIu32 " ranks stored, world size %" PRIu32,
                             j->id, n, j->world_size);
    /* check everything before keeping anything: a corrupt row reserves nothing */
    pcs_status_t st = PCS_OK;
    uint32_t r = 0;
    for (; r < n; r++) {
        if (!worker[r])
            continue; /* holder not known: this rank comes back by step report only */
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, worker[r]);
        if (!w) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "restore ranks: job %s rank %" PRIu32 ": unknown worker %" PRIu32,
                               j->id, r, worker[r]);
            goto undo;
        }
        if (w->reserved_job || w->state != PCS_WORKER_GONE) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "restore ranks: job %s rank %" PRIu32
                               ": worker %s listed twice or not restored",
                               j->id, r, w->id);
            goto undo;
        }
        w->reserved_job = j->number; /* also marks it seen, to catch a repeated number */
        w->reserved_rank = r;
    }
    PCS_CHECK_GOTO(pcs_calloc(n, sizeof *j->rank_reserved, (void **)&j->rank_reserved), st, undo);
    for (r = 0; r < n; r++) {
        j->rank_reserved[r] = worker[r];
        if (worker[r]) { /* what a re-register is compared against */
            pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, worker[r]);
            w->pid = pid ? pid[r] : 0;
            w->incarnation = incarnation ? incarnation[r] : 0;
        }
    }
    return PCS_OK;
undo:
    for (uint32_t k = 0; k < r; k++) {
        pcs_coord_worker_t *w = worker[k] ? pcs_coord_worker_by_number(c, worker[k]) : NULL;
        if (w && w->reserved_job == j->number)
            w->reserved_job = 0;
    }
    return st;
}
