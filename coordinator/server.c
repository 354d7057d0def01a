/* RPC handlers of pcs-coordinator: the method table for common/rpc_server.c, protobuf <-> domain
 * conversion around coord.c, watch streams, parked KvGets, grpc.health.v1, two-phase graceful
 * shutdown, and the once-a-tick side jobs (lease expiry, store flush, metrics snapshot).
 * Everything here runs on the RPC loop thread; handlers never block. */
#include "coordinator/auth.h"
#include "coordinator/server.h"

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/http.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/rpc.h"
#include "pcs/utf8.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "pcs/v1/job.pb-c.h"
#include "pcs/v1/plan.pb-c.h"
#include "pcs/v1/worker.pb-c.h"
#include "pcs/version.h"
#include "coordinator/store.h"

/* The spec validator (ctl engineer) and the planner (pure, in pcs_plan). */
#include "planner/plan.h"
#include "planner/validate.h"

#define SHUTDOWN_GRACE_MS         150
#define METRICS_EVERY_MS          500
/* /healthz fails when the loop has not published its snapshot for this long: a wedged loop
 * (deadlock, a commit that never returns) is restarted by a liveness probe. */
#define PCS_COORD_HTTP_STALE_MS 60000u
#define MAX_KV_WAIT_MS            600000u
#define DEFAULT_MAX_WATCH_STREAMS 1024u

typedef struct health_watch {
    pcs_rpc_call_t *call;
    int known; /* service name known: status follows the server's state */
} health_watch_t;

/* Numbers of jobs or workers changed since the last commit (each once). */
typedef struct dirty_set {
    uint32_t *list;
    size_t n, cap;
    uint8_t *mark; /* by number */
    size_t mark_cap;
} dirty_set_t;

struct pcs_server {
    pcs_server_config_t cfg;
    size_t max_spec; /* largest packed JobSpec accepted (max-spec-bytes) */
    pcs_coord_t *coord;
    pcs_rpc_server_t *rpc;
    pcs_http_t *http;
    pcs_store_t *store;
    uint64_t start_ms;
    double start_wall_s; /* for process_start_time_seconds */
    volatile sig_atomic_t stop_requested;
    int stopping;
    uint64_t stop_at_ms;
    uint64_t next_metrics_ms;
    health_watch_t *hw;
    size_t n_hw, cap_hw;
    uint32_t max_hw;     /* open Health/Watch streams allowed (--max-watch-streams) */
    uint64_t hw_refused; /* Watch calls refused at the cap, for /metrics */
    bool restoring;      /* store callbacks off while replaying the store */
    pcs_auth_t *auth;    /* NULL: no token checks */
    bool cert_identity;  /* mTLS: a worker's identity must be named by its client certificate */
    uint64_t coordinator_id; /* random, kept in the store: job uids are "<id>/<job id>" */
    bool write_coordinator_id;
    /* Durability (DESIGN.md §8): a state change marks its job/worker dirty and closes the rpc
     * gate; persist() writes the dirty rows in one transaction and opens the gate after the
     * COMMIT, so no client or worker hears of a change before it is on disk. */
    dirty_set_t dirty_jobs, dirty_workers;
    bool store_failed;     /* the last commit failed: NOT_SERVING until one works */
    char store_error[512]; /* why, for GetStatus and the replies it fails */
    uint64_t commits, commit_failures;
    uint64_t stalls, stalled_ms; /* ticks that found the loop stalled > lease / 2 */
};

static const char *const health_services[] = {"", "pcs.v1.WorkerService", "pcs.v1.JobService",
                                              "pcs.v1.ClusterService"};

// ---------------------------------------------------------------------------------------------
// helpers

static void fail_last(pcs_rpc_call_t *call, pcs_status_t st)
{
    const char *msg = pcs_last_error();
    pcs_rpc_fail(call, st, "%s", *msg ? msg : pcs_status_str(st));
}

static bool dirty_add(dirty_set_t *d, uint32_t number)
{
    if (number >= d->mark_cap) {
        size_t cap = d->mark_cap ? d->mark_cap : 64;
        while (cap <= number)
            cap *= 2;
        uint8_t *m = realloc(d->mark, cap);
        if (!m)
            return false;
        memset(m + d->mark_cap, 0, cap - d->mark_cap);
        d->mark = m;
        d->mark_cap = cap;
    }
    if (d->mark[number])
        return true;
    if (pcs_grow((void **)&d->list, &d->cap, d->n + 1, sizeof *d->list) != PCS_OK)
        return false;
    d->mark[number] = 1;
    d->list[d->n++] = number;
    return true;
}

static void dirty_clear(dirty_set_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        d->mark[d->list[i]] = 0;
    d->n = 0;
}

static void dirty_free(dirty_set_t *d)
{
    free(d->list);
    free(d->mark);
    memset(d, 0, sizeof *d);
}

/* A change to remember: from now on replies wait for the commit that holds it, which runs as
 * soon as the requests ready now are handled (group commit). */
static void mark_dirty(pcs_server_t *s, dirty_set_t *d, uint32_t number)
{
    if (!s->store || s->restoring)
        return;
    if (!dirty_add(d, number))
        PCS_WARN(PCS_SUB_STORE, "out of memory remembering a change to persist");
    if (s->rpc) {
        pcs_rpc_server_gate_close(s->rpc);
        pcs_rpc_server_tick_soon(s->rpc);
    }
}

/* New calls during the shutdown grace period get UNAVAILABLE at once. */
#define REFUSE_IF_STOPPING(s, call)                                                                \
    do {                                                                                           \
        if ((s)->stopping) {                                                                       \
            pcs_rpc_fail((call), PCS_ERR_REMOTE, "coordinator shutting down");                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void free_payload(void *user, void *spec, void *plan);

/* A restarted job starts at another world size: its plan for `world` ranks (coord.h replan). */
static pcs_status_t replan(void *user, pcs_coord_job_t *j, uint32_t world, uint64_t *plan_hash)
{
    pcs_server_t *s = user;
    const Pcs__V1__JobSpec *spec = j->spec;
    if (!spec)
        return pcs_set_error(PCS_ERR_STATE, "job %s: no spec in memory to re-plan", j->id);
    Pcs__V1__Plan *plan = NULL;
    PCS_CHECK(pcs_plan_build(spec, world, &plan));
    pcs_coord_job_set_plan(s->coord, j, plan);
    *plan_hash = pcs_plan_hash(plan);
    return PCS_OK;
}

static void free_payload(void *user, void *spec, void *plan)
{
    (void)user;
    if (spec)
        protobuf_c_message_free_unpacked(spec, NULL);
    if (plan)
        pcs_plan_free(plan);
}

/* Deep copy of a borrowed spec (the request is freed after the handler returns). */
static pcs_status_t copy_spec(const Pcs__V1__JobSpec *in, Pcs__V1__JobSpec **out)
{
    *out = NULL;
    size_t n = pcs__v1__job_spec__get_packed_size(in);
    uint8_t *buf;
    PCS_CHECK(pcs_calloc(n ? n : 1, 1, (void **)&buf));
    pcs__v1__job_spec__pack(in, buf);
    *out = pcs__v1__job_spec__unpack(NULL, n, buf);
    free(buf);
    if (!*out)
        return pcs_set_error(PCS_ERR_INTERNAL, "spec: cannot copy");
    return PCS_OK;
}

/* The spec's mesh as the coordinator runs it (pcs_coord_check_mesh's rules and world cap); errors
 * name the field. */
static pcs_status_t spec_mesh(const Pcs__V1__JobSpec *spec, pcs_mesh_t *out)
{
    pcs_mesh_t given;
    PCS_CHECK(pcs_mesh_from_spec(spec, &given));
    return pcs_coord_check_mesh(given.n, given.dim, given.size, out);
}

/* Validate a spec and build its plan. On error the status carries the field path. A spec larger
 * than max_spec_bytes packed is RESOURCE_EXHAUSTED before anything else looks at it: the
 * coordinator holds every live job's spec in memory and sends it with each assignment. */
static pcs_status_t check_and_plan(const pcs_server_t *s, const Pcs__V1__JobSpec *spec,
                                   uint32_t world_override, uint32_t *world, Pcs__V1__Plan **plan)
{
    *plan = NULL;
    if (!spec)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "spec: required");
    size_t bytes = pcs__v1__job_spec__get_packed_size(spec);
    if (bytes > s->max_spec)
        return pcs_set_error(PCS_ERR_LIMIT, "spec: %zu bytes exceeds max-spec-bytes (%zu)", bytes,
                             s->max_spec);
    char err[512] = "";
    pcs_status_t st = pcs_job_validate(spec, err, sizeof err);
    if (st != PCS_OK) {
        pcs_utf8_trim_partial(err); /* the validator quotes user text into a fixed buffer */
        /* the validator names fields of the spec; the request's path to them starts at `spec`
         * (what a google.rpc.BadRequest field violation must name) */
        size_t k = strspn(err, "abcdefghijklmnopqrstuvwxyz0123456789_.[]");
        int names_field = k > 0 && err[k] == ':' && err[k + 1] == ' ' && err[0] >= 'a';
        return pcs_set_error(st, "%s%s", names_field ? "spec." : "",
                             *err ? err : pcs_last_error());
    }
    pcs_mesh_t mesh;
    PCS_CHECK(spec_mesh(spec, &mesh));
    *world = mesh.world;
    if (world_override)
        *world = world_override;
    return pcs_plan_build(spec, *world, plan); /* its error names the field */
}

// ---------------------------------------------------------------------------------------------
// domain -> proto

typedef struct job_pb {
    Pcs__V1__Job job;
    Pcs__V1__JobProgress progress;
    char **workers;
    Pcs__V1__JobRestart log[PCS_COORD_RESTART_LOG];
    Pcs__V1__JobRestart *logp[PCS_COORD_RESTART_LOG];
} job_pb_t;

/* The operator's view of a job's progress, both ways (replies, and the store's progress column). */
static void progress_to_pb(const pcs_coord_progress_t *in, Pcs__V1__JobProgress *out)
{
    out->step = in->step;
    out->loss = in->loss;
    out->step_ms = in->step_ms;
    out->reports = in->reports;
    out->audit_ok = in->audit_ok;
    out->eval_loss = in->eval_loss;
    out->skipped_steps = in->skipped_steps;
    out->loss_scale = in->loss_scale;
}

static void progress_from_pb(const Pcs__V1__JobProgress *in, pcs_coord_progress_t *out)
{
    memset(out, 0, sizeof *out);
    out->step = in->step;
    out->loss = in->loss;
    out->step_ms = in->step_ms;
    out->reports = in->reports;
    out->audit_ok = in->audit_ok;
    out->eval_loss = in->eval_loss;
    out->skipped_steps = in->skipped_steps;
    out->loss_scale = in->loss_scale;
}

/* spec: the job's spec to include (job_spec), NULL for none. */
static void job_to_pb(pcs_server_t *s, pcs_coord_job_t *j, const Pcs__V1__JobSpec *spec,
                      job_pb_t *out)
{
    Pcs__V1__Job init = PCS__V1__JOB__INIT;
    Pcs__V1__JobProgress pinit = PCS__V1__JOB_PROGRESS__INIT;
    out->job = init;
    out->progress = pinit;
    out->workers = NULL;
    Pcs__V1__Job *p = &out->job;
    p->job_id = j->id;
    p->name = j->name;
    p->state = (Pcs__V1__JobState)j->state;
    p->reason = j->reason ? j->reason : "";
    p->created_ms = j->created_wall_ms;
    p->started_ms = j->started_wall_ms;
    p->finished_ms = j->finished_wall_ms;
    p->world_size = j->world_size;
    p->generation = j->generation;
    p->plan_hash = j->plan_hash;
    p->request_id = j->request_id;
    p->owner = j->owner ? j->owner : "";
    p->restarts = j->restarts;
    for (uint32_t i = 0; i < j->n_log && i < PCS_COORD_RESTART_LOG; i++) {
        Pcs__V1__JobRestart *e = &out->log[i];
        pcs__v1__job_restart__init(e);
        e->generation = j->log[i].generation;
        e->cause = j->log[i].cause;
        e->step = j->log[i].step;
        e->world_before = j->log[i].world_before;
        e->world_after = j->log[i].world_after;
        e->at_ms = j->log[i].at_wall_ms;
        out->logp[i] = e;
    }
    p->n_restart_log = j->n_log;
    p->restart_log = out->logp;
    p->spec = (Pcs__V1__JobSpec *)spec;
    progress_to_pb(&j->progress, &out->progress);
    p->progress = &out->progress;
    if (j->state == PCS_JOB_RUNNING &&
        pcs_calloc(j->world_size, sizeof *out->workers, (void **)&out->workers) == PCS_OK) {
        for (uint32_t r = 0; r < j->world_size; r++) {
            pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, j->rank_worker[r]);
            out->workers[r] = w ? w->id : "";
        }
        p->n_workers = j->world_size;
        p->workers = out->workers;
    }
}

static void job_pb_free(job_pb_t *jp)
{
    free(jp->workers);
}

/* A job's spec for a reply: in memory while the job is live, else read back from the store (a
 * finished job's spec leaves RAM once it is committed). *loaded gets what to free after the
 * reply (NULL when nothing was loaded). NULL when there is none (a store that lost it). */
static const Pcs__V1__JobSpec *job_spec(pcs_server_t *s, const pcs_coord_job_t *j,
                                        Pcs__V1__JobSpec **loaded)
{
    *loaded = NULL;
    if (j->spec || !s->store)
        return j->spec;
    void *buf = NULL;
    size_t len = 0;
    if (pcs_store_get_spec(s->store, j->number, &buf, &len) != PCS_OK) {
        PCS_WARN(PCS_SUB_STORE, "job %s: spec not read back: %s", j->id, pcs_last_error());
        return NULL;
    }
    *loaded = pcs__v1__job_spec__unpack(NULL, len, buf);
    free(buf);
    return *loaded;
}

// ---------------------------------------------------------------------------------------------
// watch streams

static void send_event(pcs_server_t *s, pcs_coord_worker_t *w, const pcs_coord_event_t *e)
{
    char uid[64]; /* the assignment's job uid: alive until the event is sent */
    Pcs__V1__ResumeSpec own = PCS__V1__RESUME_SPEC__INIT;
    pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, e->job);
    Pcs__V1__AssignmentEvent ev = PCS__V1__ASSIGNMENT_EVENT__INIT;
    Pcs__V1__Assignment a = PCS__V1__ASSIGNMENT__INIT;
    Pcs__V1__MeshCoords mc = PCS__V1__MESH_COORDS__INIT;
    Pcs__V1__RankEstimate est = PCS__V1__RANK_ESTIMATE__INIT;
    Pcs__V1__Directive d = PCS__V1__DIRECTIVE__INIT;
    ev.seq = e->seq;
    if (e->kind == PCS_EV_ASSIGNMENT && j) {
        uint32_t co[4];
        pcs_mesh_coords(&j->mesh, e->rank, co);
        mc.pp = co[PCS_MESH_PP];
        mc.dp_replicate = co[PCS_MESH_DP_REPLICATE];
        mc.dp_shard = co[PCS_MESH_DP_SHARD];
        a.job_id = j->id;
        a.generation = e->generation;
        a.rank = e->rank;
        a.world_size = j->world_size;
        a.coords = &mc;
        a.spec = j->spec;
        a.plan = j->plan;
        a.plan_hash = j->plan_hash;
        snprintf(uid, sizeof uid, "%016" PRIx64 "/%s", s->coordinator_id, j->id);
        a.job_uid = uid;
        if (w->job == j && w->local_size) {
            a.local_rank = w->local_rank;
            a.local_world_size = w->local_size;
        }
        if (e->generation > 1)
            a.resume = &own; /* a restart: from the job's own last committed checkpoint */
        if (j->plan && pcs_plan_rank_estimate(j->plan, e->rank, &est) == PCS_OK)
            a.estimate = &est;
        ev.event_case = PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT;
        ev.assignment = &a;
    } else {
        d.kind = e->kind == PCS_EV_RESTART ? PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART
                                           : PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_STOP;
        d.job_id = j ? j->id : "";
        d.generation = e->generation;
        d.reason = (char *)e->reason;
        ev.event_case = PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE;
        ev.directive = &d;
    }
    if (pcs_rpc_send(w->watch, &ev.base) != PCS_OK)
        PCS_DEBUG(PCS_SUB_RPC, "watch of %s: event %" PRIu64 " not sent: %s", w->id, e->seq,
                  pcs_last_error());
}

static void drain(pcs_server_t *s, pcs_coord_worker_t *w)
{
    pcs_coord_event_t e;
    while (w->watch && pcs_coord_pop_event(s->coord, w, &e))
        send_event(s, w, &e);
}

static void on_events(void *user, pcs_coord_worker_t *w)
{
    pcs_server_t *s = user;
    if (w->watch)
        drain(s, w);
}

static void watch_cancelled(pcs_rpc_call_t *call, void *arg)
{
    pcs_coord_worker_t *w = arg;
    if (w->watch == call)
        w->watch = NULL;
    PCS_DEBUG(PCS_SUB_RPC, "watch of %s closed by the client", w->id);
}

/* The worker a WorkerService call acts for: the one whose secret it carries (authorize() checked
 * it), which must be the worker the request names. NULL after answering PERMISSION_DENIED. */
static pcs_coord_worker_t *caller_as(pcs_server_t *s, pcs_rpc_call_t *call, const char *worker_id)
{
    pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, (uint32_t)pcs_rpc_call_principal(call));
    if (!w) {
        pcs_rpc_fail(call, PCS_ERR_UNAUTHENTICATED, "worker secret: no worker: register again");
        return NULL;
    }
    if (worker_id && !*worker_id) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "worker_id: required");
        return NULL;
    }
    if (worker_id && strcmp(worker_id, w->id) != 0) {
        pcs_rpc_fail(call, PCS_ERR_PERMISSION,
                     "worker_id: %.*s, but the call's credential is worker %s's: a worker acts "
                     "only for itself",
                     (int)pcs_utf8_prefix(worker_id, 64), worker_id, w->id);
        return NULL;
    }
    return w;
}

/* KvSet/KvGet: only a rank of the job's current generation reads or writes its rendezvous. */
static bool kv_member(pcs_server_t *s, pcs_rpc_call_t *call, const char *job_id, uint64_t gen)
{
    pcs_coord_worker_t *w = caller_as(s, call, NULL);
    if (!w)
        return false;
    /* a rank of another generation of the job is told so by the KV itself (FAILED_PRECONDITION) */
    if (w->state != PCS_WORKER_ASSIGNED || !w->job || strcmp(w->job->id, job_id) != 0) {
        pcs_rpc_fail(call, PCS_ERR_PERMISSION,
                     "job_id: worker %s is not a rank of job %.*s (generation %" PRIu64
                     "): a job's rendezvous is its ranks' only",
                     w->id, (int)pcs_utf8_prefix(job_id, 64), job_id, gen);
        return false;
    }
    return true;
}

static void h_watch(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__WatchAssignmentRequest *req = (const void *)m;
    pcs_coord_worker_t *w = caller_as(s, call, req->worker_id);
    if (!w)
        return;
    if (w->state == PCS_WORKER_LOST || w->state == PCS_WORKER_GONE) {
        pcs_rpc_fail(call, PCS_ERR_STATE, "worker %s is %s: re-register", w->id,
                     pcs_worker_state_name(w->state));
        return;
    }
    if (w->watch) {
        pcs_rpc_call_t *old = w->watch;
        w->watch = NULL;
        pcs_rpc_fail(old, PCS_ERR_CANCELLED, "superseded by a newer WatchAssignment of %s", w->id);
    }
    w->watch = call;
    pcs_rpc_call_set_cancel(call, watch_cancelled, w);
    if (!w->watch)
        return; /* the client was already gone */
    pcs_coord_watch_started(s->coord, w);
    drain(s, w);
}

// ---------------------------------------------------------------------------------------------
// WorkerService

static void h_register(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__RegisterRequest *req = (const void *)m;
    pcs_coord_device_t *devs = NULL;
    if (req->n_devices > 4096) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "devices: more than 4096 entries");
        return;
    }
    if (req->n_backends > 64) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "backends: more than 64 entries");
        return;
    }
    if (req->n_devices && pcs_calloc(req->n_devices, sizeof *devs, (void **)&devs) != PCS_OK) {
        fail_last(call, PCS_ERR_NOMEM);
        return;
    }
    for (size_t i = 0; i < req->n_devices; i++) {
        const Pcs__V1__Device *d = req->devices[i];
        devs[i].index = d->index;
        devs[i].kind = d->kind;
        devs[i].name = d->name;
        devs[i].memory_bytes = d->memory_bytes;
    }
    /* credentials: the secret the caller already holds (a re-register of the same process), the
     * identity its client certificate proves, and a fresh secret for a new registration */
    char presented[PCS_RPC_WORKER_SECRET_MAX + 1], pid_id[32];
    uint8_t presented_hash[PCS_AUTH_HASH_BYTES], fresh_hash[PCS_AUTH_HASH_BYTES];
    char fresh[PCS_AUTH_SECRET_HEX + 1];
    long plen = pcs_rpc_call_metadata(call, PCS_RPC_WORKER_SECRET_HEADER, presented,
                                      sizeof presented);
    bool has_presented =
        plen > 0 && plen <= PCS_RPC_WORKER_SECRET_MAX &&
        pcs_auth_secret_parse(presented, pid_id, sizeof pid_id, presented_hash) == PCS_OK;
    bool proven = false;
    if (s->cert_identity) {
        char first[256];
        int named = pcs_rpc_call_cert_names(call, req->identity, first, sizeof first);
        if (named != 1) {
            free(devs);
            pcs_rpc_fail(call, PCS_ERR_PERMISSION,
                         "identity: %.*s is not named by the client certificate (%s): with mTLS "
                         "a worker registers as its certificate's CN or a subject alternative "
                         "name",
                         (int)pcs_utf8_prefix(req->identity, 128), req->identity,
                         named < 0 ? "none presented" : first);
            return;
        }
        proven = true;
    }
    if (pcs_auth_secret_new(fresh, fresh_hash) != PCS_OK) {
        free(devs);
        fail_last(call, PCS_ERR_SYSTEM);
        return;
    }
    pcs_coord_register_t r = {.identity = req->identity,
                              .presented = has_presented ? presented_hash : NULL,
                              .identity_proven = proven,
                              .fresh = fresh_hash,
                              .host = req->host,
                              .address = req->address,
                              .version = req->version,
                              .program = req->program,
                              .pid = req->pid,
                              .incarnation = req->incarnation,
                              .devices = devs,
                              .n_devices = req->n_devices,
                              .backends = (const char *const *)req->backends,
                              .n_backends = req->n_backends};
    pcs_coord_worker_t *w;
    bool rereg, kept;
    pcs_status_t st = pcs_coord_register_ex(s->coord, &r, &w, &rereg, &kept);
    free(devs);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    const pcs_coord_config_t *cc = pcs_coord_config(s->coord);
    char secret[PCS_RPC_WORKER_SECRET_MAX + 1];
    if (kept)
        snprintf(secret, sizeof secret, "%s", presented);
    else
        snprintf(secret, sizeof secret, "%s.%s", w->id, fresh);
    Pcs__V1__RegisterResponse resp = PCS__V1__REGISTER_RESPONSE__INIT;
    resp.worker_id = w->id;
    resp.heartbeat_interval_ms = cc->heartbeat_interval_ms;
    resp.lease_ms = cc->lease_ms;
    resp.reregistered = rereg;
    resp.worker_secret = secret;
    pcs_rpc_reply(call, &resp.base);
    memset(fresh, 0, sizeof fresh);
    memset(secret, 0, sizeof secret);
}

static void h_heartbeat(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__HeartbeatRequest *req = (const void *)m;
    pcs_coord_worker_t *w = caller_as(s, call, req->worker_id);
    if (!w)
        return;
    pcs_status_t st =
        pcs_coord_heartbeat(s->coord, req->worker_id, req->job_id, req->generation, &w);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__HeartbeatResponse resp = PCS__V1__HEARTBEAT_RESPONSE__INIT;
    resp.state = (Pcs__V1__WorkerState)w->state;
    resp.lease_ms = pcs_coord_config(s->coord)->lease_ms;
    if (w->job) {
        resp.job_id = w->job->id;
        resp.generation = w->job->generation;
    }
    pcs_rpc_reply(call, &resp.base);
}

static void h_deregister(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__DeregisterRequest *req = (const void *)m;
    if (!caller_as(s, call, req->worker_id))
        return;
    pcs_status_t st = pcs_coord_deregister(s->coord, req->worker_id, req->reason);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    pcs_coord_worker_t *w;
    if (pcs_coord_lookup_worker(s->coord, req->worker_id, &w) == PCS_OK && w->watch) {
        pcs_rpc_call_t *wc = w->watch;
        w->watch = NULL;
        pcs_rpc_finish(wc); /* after any STOP just queued on it */
    }
    Pcs__V1__DeregisterResponse resp = PCS__V1__DEREGISTER_RESPONSE__INIT;
    pcs_rpc_reply(call, &resp.base);
}

static void h_report_step(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__ReportStepRequest *req = (const void *)m;
    if (!caller_as(s, call, req->worker_id))
        return;
    if (!req->report) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "report: required");
        return;
    }
    const Pcs__V1__StepReport *sr = req->report;
    pcs_coord_report_t r = {.worker_id = req->worker_id,
                            .job_id = req->job_id,
                            .generation = req->generation,
                            .rank = req->rank,
                            .step = sr->step,
                            .loss = sr->loss,
                            .step_ms = sr->step_ms,
                            .eval_loss = sr->eval_loss,
                            .loss_scale = sr->loss_scale,
                            .skipped_steps = sr->skipped_steps,
                            .audit_ok = sr->audit_ok,
                            .done = sr->done,
                            .error = sr->error,
                            .peer_fault = (int)sr->peer_fault,
                            .peer_rank = sr->peer_rank,
                            .fingerprint = sr->fingerprint,
                            .all_gather_bytes = sr->all_gather_bytes,
                            .reduce_scatter_bytes = sr->reduce_scatter_bytes,
                            .all_reduce_bytes = sr->all_reduce_bytes,
                            .compute_ms = sr->compute_ms,
                            .pipeline_ms = sr->pipeline_ms};
    int dir = 0;
    char reason[512];
    pcs_status_t st = pcs_coord_report_step(s->coord, &r, &dir, reason, sizeof reason);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__ReportStepResponse resp = PCS__V1__REPORT_STEP_RESPONSE__INIT;
    Pcs__V1__Directive d = PCS__V1__DIRECTIVE__INIT;
    if (dir) {
        d.kind = dir == PCS_EV_RESTART ? PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART
                                       : PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_STOP;
        d.job_id = req->job_id;
        d.generation = req->generation;
        d.reason = reason;
        resp.directive = &d;
    }
    pcs_rpc_reply(call, &resp.base);
}

static void h_kv_set(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__KvSetRequest *req = (const void *)m;
    pcs_rpc_call_set_ungated(call); /* rendezvous data is not persisted: nothing to wait for */
    if (!kv_member(s, call, req->job_id, req->generation))
        return;
    pcs_status_t st = pcs_coord_kv_set(s->coord, req->job_id, req->generation, req->key,
                                       req->value.data, req->value.len);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__KvSetResponse resp = PCS__V1__KV_SET_RESPONSE__INIT;
    pcs_rpc_reply(call, &resp.base);
}

static void kv_reply(pcs_rpc_call_t *call, const void *value, size_t len)
{
    Pcs__V1__KvGetResponse resp = PCS__V1__KV_GET_RESPONSE__INIT;
    resp.found = value != NULL;
    resp.value.data = (uint8_t *)value;
    resp.value.len = len;
    pcs_rpc_reply(call, &resp.base);
}

static void kv_get_cancelled(pcs_rpc_call_t *call, void *arg)
{
    pcs_server_t *s = arg;
    pcs_coord_kv_cancel(s->coord, call);
}

static void on_kv_wake(void *user, void *waiter, pcs_status_t st, const void *value, size_t len)
{
    (void)user;
    pcs_rpc_call_t *call = waiter;
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    kv_reply(call, value, len);
}

static void h_kv_get(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__KvGetRequest *req = (const void *)m;
    pcs_rpc_call_set_ungated(call);
    if (!kv_member(s, call, req->job_id, req->generation))
        return;
    uint32_t wait = req->wait_ms > MAX_KV_WAIT_MS ? MAX_KV_WAIT_MS : req->wait_ms;
    int64_t left = pcs_rpc_call_remaining_ms(call) - 50;
    if (left < (int64_t)wait) /* answer not-found a little before the client gives up */
        wait = left > 0 ? (uint32_t)left : 0;
    int found;
    const void *v;
    size_t len;
    pcs_status_t st = pcs_coord_kv_get(s->coord, req->job_id, req->generation, req->key, wait, call,
                                       &found, &v, &len);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    if (found == -1) {
        pcs_rpc_call_set_cancel(call, kv_get_cancelled, s);
        return;
    }
    kv_reply(call, found ? (v ? v : "") : NULL, len);
}

// ---------------------------------------------------------------------------------------------
// JobService

/* The principal of a JobService call's token ("" without a token file) and whether it may act
 * on every job (an admin token, or no token file at all). */
static const char *caller(const pcs_server_t *s, const pcs_rpc_call_t *call, bool *admin)
{
    long entry = (long)pcs_rpc_call_principal(call) - 1;
    const char *who = pcs_auth_principal(s->auth, entry);
    *admin = !s->auth || pcs_auth_role(s->auth, entry) == PCS_ROLE_ADMIN;
    return who ? who : "";
}

static void h_submit(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__SubmitJobRequest *req = (const void *)m;
    Pcs__V1__SubmitJobResponse resp = PCS__V1__SUBMIT_JOB_RESPONSE__INIT;
    job_pb_t jp;
    bool admin;
    const char *owner = caller(s, call, &admin);
    pcs_coord_job_t *j = pcs_coord_job_by_request(s->coord, req->request_id);
    if (j && !admin && *j->owner && strcmp(j->owner, owner) != 0) {
        /* an idempotency key names one submitter's request: another's does not get that job (an
         * admin's, or a job without owner, is everyone's, as for CancelJob) */
        pcs_rpc_fail(call, PCS_ERR_EXISTS,
                     "request_id: already used by another submitter's job; choose another key");
        return;
    }
    if (j) {
        Pcs__V1__JobSpec *loaded;
        job_to_pb(s, j, job_spec(s, j, &loaded), &jp);
        resp.job = &jp.job;
        resp.duplicate = true;
        pcs_rpc_reply(call, &resp.base);
        job_pb_free(&jp);
        if (loaded)
            pcs__v1__job_spec__free_unpacked(loaded, NULL);
        return;
    }
    if (strlen(req->request_id) > 256) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "request_id: longer than 256 bytes");
        return;
    }
    uint32_t world;
    Pcs__V1__Plan *plan = NULL;
    pcs_status_t st = check_and_plan(s, req->spec, 0, &world, &plan);
    if (st == PCS_OK && (st = pcs_job_check_runnable(req->spec, plan)) != PCS_OK) {
        /* planned (DryRunPlan shows it) but not run by the workers of this release: refused
         * now rather than failed at step 1 */
        char why[512];
        snprintf(why, sizeof why, "%s", pcs_last_error());
        pcs_set_error(st, "spec.%s", why);
        pcs_plan_free(plan);
        plan = NULL;
    }
    if (st != PCS_OK) {
        PCS_DEBUG(PCS_SUB_COORD, "SubmitJob rejected: %s", pcs_last_error());
        fail_last(call, st);
        return;
    }
    Pcs__V1__JobSpec *spec;
    st = copy_spec(req->spec, &spec);
    if (st != PCS_OK) {
        pcs_plan_free(plan);
        fail_last(call, st);
        return;
    }
    pcs_mesh_t mesh;
    st = spec_mesh(spec, &mesh); /* check_and_plan accepted it */
    if (st != PCS_OK) {
        pcs_plan_free(plan);
        pcs__v1__job_spec__free_unpacked(spec, NULL);
        fail_last(call, st);
        return;
    }
    pcs_coord_job_desc_t d = {.name = spec->name,
                              .request_id = req->request_id,
                              .owner = owner,
                              .n_dims = mesh.n,
                              .dim_name = mesh.dim,
                              .dim_size = mesh.size,
                              .need_cuda = strcmp(spec->backend, "cuda") == 0,
                              .transport =
                                  pcs_coord_job_transport(spec->backend, spec->collectives),
                              .program = spec->program,
                              .spec = spec,
                              .plan = plan,
                              .plan_hash = pcs_plan_hash(plan),
                              .steps = spec->training ? spec->training->steps : 0,
                              .max_restarts = spec->elastic ? spec->elastic->max_restarts : 0,
                              .min_workers = spec->elastic ? spec->elastic->min_workers : 0,
                              .max_workers = spec->elastic ? spec->elastic->max_workers : 0};
    st = pcs_coord_submit(s->coord, &d, &j); /* takes the payload */
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    job_to_pb(s, j, j->spec, &jp);
    resp.job = &jp.job;
    pcs_rpc_reply(call, &resp.base);
    job_pb_free(&jp);
}

static void h_get_job(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    const Pcs__V1__GetJobRequest *req = (const void *)m;
    pcs_coord_job_t *j;
    pcs_status_t st = pcs_coord_lookup_job(s->coord, req->job_id, &j);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    job_pb_t jp;
    Pcs__V1__JobSpec *loaded;
    job_to_pb(s, j, job_spec(s, j, &loaded), &jp);
    Pcs__V1__GetJobResponse resp = PCS__V1__GET_JOB_RESPONSE__INIT;
    resp.job = &jp.job;
    pcs_rpc_reply(call, &resp.base);
    job_pb_free(&jp);
    if (loaded)
        pcs__v1__job_spec__free_unpacked(loaded, NULL);
}

static void h_list_jobs(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    const Pcs__V1__ListJobsRequest *req = (const void *)m;
    uint32_t max = pcs_coord_max_job(s->coord);
    job_pb_t *jps = NULL;
    Pcs__V1__Job **ptrs = NULL;
    if (max && (pcs_calloc(max, sizeof *jps, (void **)&jps) != PCS_OK ||
                pcs_calloc(max, sizeof *ptrs, (void **)&ptrs) != PCS_OK)) {
        free(jps);
        fail_last(call, PCS_ERR_NOMEM);
        return;
    }
    size_t n = 0;
    for (uint32_t i = 1; i <= max; i++) {
        pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, i);
        if (!j || (req->state && (int)req->state != (int)j->state))
            continue;
        job_to_pb(s, j, NULL, &jps[n]); /* specs stay out of listings: GetJob has them */
        ptrs[n] = &jps[n].job;
        n++;
    }
    Pcs__V1__ListJobsResponse resp = PCS__V1__LIST_JOBS_RESPONSE__INIT;
    resp.n_jobs = n;
    resp.jobs = ptrs;
    pcs_rpc_reply(call, &resp.base);
    for (size_t i = 0; i < n; i++)
        job_pb_free(&jps[i]);
    free(jps);
    free(ptrs);
}

static void h_cancel(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    REFUSE_IF_STOPPING(s, call);
    const Pcs__V1__CancelJobRequest *req = (const void *)m;
    pcs_coord_job_t *j;
    bool admin;
    const char *me = caller(s, call, &admin);
    pcs_status_t st = pcs_coord_lookup_job(s->coord, req->job_id, &j);
    if (st == PCS_OK && !admin && *j->owner && strcmp(j->owner, me) != 0) {
        /* (a job submitted without tokens, or before jobs had owners, has none: any submitter) */
        pcs_rpc_fail(call, PCS_ERR_PERMISSION,
                     "%s was submitted by '%s': a submitter cancels only its own jobs (an admin "
                     "token cancels any)",
                     j->id, j->owner);
        return;
    }
    if (st == PCS_OK)
        st = pcs_coord_cancel(s->coord, req->job_id, req->reason, &j);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    job_pb_t jp;
    job_to_pb(s, j, NULL, &jp);
    Pcs__V1__CancelJobResponse resp = PCS__V1__CANCEL_JOB_RESPONSE__INIT;
    resp.job = &jp.job;
    pcs_rpc_reply(call, &resp.base);
    job_pb_free(&jp);
}

static void h_get_plan(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    const Pcs__V1__GetPlanRequest *req = (const void *)m;
    pcs_coord_job_t *j;
    pcs_status_t st = pcs_coord_lookup_job(s->coord, req->job_id, &j);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__Plan *rebuilt = NULL;
    if (!j->plan) {
        /* finished jobs keep only their spec (in the store); the planner is pure, so rebuild */
        Pcs__V1__JobSpec *loaded;
        const Pcs__V1__JobSpec *spec = job_spec(s, j, &loaded);
        if (!spec) {
            pcs_rpc_fail(call, PCS_ERR_NOT_FOUND, "job %s: no spec kept", j->id);
            return;
        }
        st = pcs_plan_build(spec, j->world_size, &rebuilt);
        if (loaded)
            pcs__v1__job_spec__free_unpacked(loaded, NULL);
        if (st != PCS_OK) {
            fail_last(call, st);
            return;
        }
    }
    Pcs__V1__GetPlanResponse resp = PCS__V1__GET_PLAN_RESPONSE__INIT;
    resp.plan = j->plan ? j->plan : rebuilt;
    pcs_rpc_reply(call, &resp.base);
    pcs_plan_free(rebuilt);
}

static void h_dry_run(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const pcs_server_t *s = user;
    const Pcs__V1__DryRunPlanRequest *req = (const void *)m;
    if (req->world_size > PCS_COORD_MAX_WORLD) {
        pcs_rpc_fail(call, PCS_ERR_INVALID_ARG, "world_size: must be <= %u", PCS_COORD_MAX_WORLD);
        return;
    }
    uint32_t world;
    Pcs__V1__Plan *plan = NULL;
    pcs_status_t st = check_and_plan(s, req->spec, req->world_size, &world, &plan);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__DryRunPlanResponse resp = PCS__V1__DRY_RUN_PLAN_RESPONSE__INIT;
    resp.plan = plan;
    pcs_rpc_reply(call, &resp.base);
    pcs_plan_free(plan);
}

// ---------------------------------------------------------------------------------------------
// ClusterService

static void h_list_workers(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    const Pcs__V1__ListWorkersRequest *req = (const void *)m;
    uint32_t max = pcs_coord_max_worker(s->coord);
    size_t n_dev = 0;
    for (uint32_t i = 1; i <= max; i++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, i);
        if (w)
            n_dev += w->n_devices;
    }
    Pcs__V1__Worker *ws = NULL, **wp = NULL;
    Pcs__V1__Device *ds = NULL, **dp = NULL;
    if ((max && (pcs_calloc(max, sizeof *ws, (void **)&ws) != PCS_OK ||
                 pcs_calloc(max, sizeof *wp, (void **)&wp) != PCS_OK)) ||
        (n_dev && (pcs_calloc(n_dev, sizeof *ds, (void **)&ds) != PCS_OK ||
                   pcs_calloc(n_dev, sizeof *dp, (void **)&dp) != PCS_OK))) {
        free(ws), free(wp), free(ds);
        fail_last(call, PCS_ERR_NOMEM);
        return;
    }
    size_t n = 0, k = 0;
    for (uint32_t i = 1; i <= max; i++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, i);
        if (!w || !w->state || (req->state && (int)req->state != (int)w->state))
            continue;
        Pcs__V1__Worker init = PCS__V1__WORKER__INIT;
        Pcs__V1__Worker *o = &ws[n];
        *o = init;
        o->worker_id = w->id;
        o->identity = w->identity;
        o->host = w->host ? w->host : "";
        o->address = w->address ? w->address : "";
        o->program = w->program ? w->program : "";
        o->pid = w->pid;
        o->state = (Pcs__V1__WorkerState)w->state;
        o->backends = w->backends;
        o->n_backends = w->n_backends;
        o->job_id = w->job ? w->job->id : "";
        o->rank = w->job ? w->rank : 0;
        o->registered_ms = w->registered_wall_ms;
        o->last_heartbeat_ms = w->last_heartbeat_wall_ms;
        o->devices = &dp[k];
        o->n_devices = w->n_devices;
        for (size_t d = 0; d < w->n_devices; d++, k++) {
            Pcs__V1__Device dinit = PCS__V1__DEVICE__INIT;
            ds[k] = dinit;
            ds[k].index = w->devices[d].index;
            ds[k].kind = w->devices[d].kind;
            ds[k].name = w->devices[d].name;
            ds[k].memory_bytes = w->devices[d].memory_bytes;
            dp[k] = &ds[k];
        }
        wp[n++] = o;
    }
    Pcs__V1__ListWorkersResponse resp = PCS__V1__LIST_WORKERS_RESPONSE__INIT;
    resp.n_workers = n;
    resp.workers = wp;
    pcs_rpc_reply(call, &resp.base);
    free(ws), free(wp), free(ds), free(dp);
}

static void h_get_status(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    (void)m;
    pcs_server_t *s = user;
    /* the operator's view answers at once, also while the store fails (it says so); it is the
     * one reply that may show a change not yet committed */
    pcs_rpc_call_set_ungated(call);
    pcs_coord_counts_t cn;
    pcs_coord_counts(s->coord, &cn);
    pcs_status_info_t info = {.uptime_ms = pcs_now_ms() - s->start_ms,
                              .listen = s->cfg.listen,
                              .port = pcs_server_port(s),
                              .metrics_port = pcs_server_metrics_port(s),
                              .db_path = s->store ? s->cfg.db_path : NULL,
                              .store_error = s->store_failed ? s->store_error : NULL,
                              .commits = s->commits,
                              .commit_failures = s->commit_failures,
                              .stalls = s->stalls,
                              .config = s->cfg.config};
    char *text = NULL;
    pcs_status_t st = pcs_status_text(s->coord, &info, &text);
    if (st != PCS_OK) {
        fail_last(call, st);
        return;
    }
    Pcs__V1__GetStatusResponse resp = PCS__V1__GET_STATUS_RESPONSE__INIT;
    resp.version = PCS_VERSION_STRING;
    resp.uptime_ms = info.uptime_ms;
    resp.workers_idle = cn.workers[PCS_WORKER_IDLE];
    resp.workers_assigned = cn.workers[PCS_WORKER_ASSIGNED];
    resp.workers_lost = cn.workers[PCS_WORKER_LOST];
    resp.workers_stopping = cn.workers[PCS_WORKER_STOPPING];
    resp.jobs_pending = cn.jobs[PCS_JOB_PENDING];
    resp.jobs_running = cn.jobs[PCS_JOB_RUNNING];
    resp.jobs_finished =
        cn.jobs[PCS_JOB_SUCCEEDED] + cn.jobs[PCS_JOB_FAILED] + cn.jobs[PCS_JOB_CANCELLED];
    resp.text = text;
    pcs_rpc_reply(call, &resp.base);
    free(text);
}

// ---------------------------------------------------------------------------------------------
// grpc.health.v1

static int health_known(const char *service)
{
    for (size_t i = 0; i < sizeof health_services / sizeof *health_services; i++)
        if (strcmp(service, health_services[i]) == 0)
            return 1;
    return 0;
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus health_status(const pcs_server_t *s,
                                                                          int known)
{
    if (!known)
        return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    return s->stopping || s->store_failed
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

static void h_health_check(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    pcs_rpc_call_set_ungated(call); /* health is answered now, durable state or not */
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    if (!health_known(req->service)) {
        pcs_rpc_fail(call, PCS_ERR_NOT_FOUND, "unknown service %.*s",
                     pcs_utf8_prefix(req->service, 200), req->service);
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = health_status(s, 1);
    pcs_rpc_reply(call, &resp.base);
}

static void health_send(pcs_server_t *s, pcs_rpc_call_t *call, int known)
{
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = health_status(s, known);
    (void)pcs_rpc_send(call, &resp.base);
}

/* The serving status changed (a commit failed or works again): every watcher hears it. */
static void health_changed(pcs_server_t *s)
{
    for (size_t i = 0; i < s->n_hw; i++)
        health_send(s, s->hw[i].call, s->hw[i].known);
}

static void health_watch_cancelled(pcs_rpc_call_t *call, void *arg)
{
    pcs_server_t *s = arg;
    for (size_t i = 0; i < s->n_hw; i++) {
        if (s->hw[i].call == call) {
            s->hw[i] = s->hw[--s->n_hw];
            return;
        }
    }
}

static void h_health_watch(pcs_rpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    pcs_server_t *s = user;
    pcs_rpc_call_set_ungated(call);
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    int known = health_known(req->service);
    /* Each open stream holds a call and its memory until the client leaves: a prober that never
     * closes its watches (or a flood of them) must not grow the coordinator without bound. The
     * slot is freed in health_watch_cancelled and at shutdown. */
    if (!s->stopping && s->n_hw >= s->max_hw) {
        s->hw_refused++;
        PCS_DEBUG(PCS_SUB_RPC, "Health/Watch from %s refused: %zu streams open",
                  pcs_rpc_call_peer(call), s->n_hw);
        pcs_rpc_fail(call, PCS_ERR_LIMIT,
                     "too many open Health/Watch streams: %zu of max-watch-streams %" PRIu32
                     " (close one, use Health/Check, or raise --max-watch-streams)",
                     s->n_hw, s->max_hw);
        return;
    }
    /* The health protocol: Watch of an unknown service streams SERVICE_UNKNOWN (not an error). */
    health_send(s, call, known);
    if (s->stopping) {
        pcs_rpc_finish(call);
        return;
    }
    if (pcs_grow((void **)&s->hw, &s->cap_hw, s->n_hw + 1, sizeof *s->hw) != PCS_OK) {
        pcs_rpc_finish(call);
        return;
    }
    s->hw[s->n_hw].call = call;
    s->hw[s->n_hw].known = known;
    s->n_hw++;
    pcs_rpc_call_set_cancel(call, health_watch_cancelled, s);
}

// ---------------------------------------------------------------------------------------------
// method table

#define M(path, req, resp, stream, fn)                                                             \
    {                                                                                              \
        path, &req##__descriptor, &resp##__descriptor, stream, fn                                  \
    }
/* Bearer tokens by role (auth.h): runs before every handler when a token file is loaded. */
/* Every call: the bearer token's role (when a token file is loaded), then for WorkerService calls
 * after Register the worker secret, which names the one worker the call may act for (its number
 * becomes the call's principal; the handlers compare it with the request). With mTLS the
 * client certificate must also name that worker's identity. */
static pcs_status_t authorize(void *user, const pcs_rpc_method_t *m, pcs_rpc_call_t *call)
{
    pcs_server_t *s = user;
    long entry = -1;
    if (s->auth) {
        char value[1100];
        long n = pcs_rpc_call_metadata(call, "authorization", value, sizeof value);
        pcs_status_t st = pcs_auth_identify(s->auth, m->path, n >= 0 ? value : NULL, &entry);
        memset(value, 0, sizeof value);
        PCS_CHECK(st);
    }
    if (strncmp(m->path, "/pcs.v1.WorkerService/", 22) != 0) {
        /* JobService: the token (index + 1), whose principal owns what it submits */
        if (entry >= 0)
            pcs_rpc_call_set_principal(call, (uint64_t)entry + 1);
        return PCS_OK;
    }
    if (strcmp(m->path, PCS_M_REGISTER) == 0)
        return PCS_OK;
    char secret[PCS_RPC_WORKER_SECRET_MAX + 1], id[32];
    long n = pcs_rpc_call_metadata(call, PCS_RPC_WORKER_SECRET_HEADER, secret, sizeof secret);
    if (n < 0)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                             "%s needs the worker's secret (the pcs-worker-secret metadata that "
                             "Register answers)",
                             m->path);
    uint8_t hash[PCS_AUTH_HASH_BYTES];
    if (n > PCS_RPC_WORKER_SECRET_MAX)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED, "pcs-worker-secret: longer than %d bytes",
                             PCS_RPC_WORKER_SECRET_MAX);
    PCS_CHECK(pcs_auth_secret_parse(secret, id, sizeof id, hash));
    memset(secret, 0, sizeof secret);
    pcs_coord_worker_t *w = pcs_coord_worker_by_secret(s->coord, id, hash);
    if (!w)
        return pcs_set_error(PCS_ERR_UNAUTHENTICATED,
                             "pcs-worker-secret: not the current secret of a worker (revoked by "
                             "a newer registration, or unknown here): register again");
    if (s->cert_identity && pcs_rpc_call_cert_names(call, w->identity, NULL, 0) != 1)
        return pcs_set_error(PCS_ERR_PERMISSION,
                             "the client certificate does not name worker %s's identity", w->id);
    pcs_rpc_call_set_principal(call, w->number);
    return PCS_OK;
}

static const pcs_rpc_method_t methods[] = {
    M(PCS_M_REGISTER, pcs__v1__register_request, pcs__v1__register_response, 0, h_register),
    M(PCS_M_HEARTBEAT, pcs__v1__heartbeat_request, pcs__v1__heartbeat_response, 0, h_heartbeat),
    M(PCS_M_WATCH_ASSIGNMENT, pcs__v1__watch_assignment_request, pcs__v1__assignment_event, 1,
      h_watch),
    M(PCS_M_KV_SET, pcs__v1__kv_set_request, pcs__v1__kv_set_response, 0, h_kv_set),
    M(PCS_M_KV_GET, pcs__v1__kv_get_request, pcs__v1__kv_get_response, 0, h_kv_get),
    M(PCS_M_REPORT_STEP, pcs__v1__report_step_request, pcs__v1__report_step_response, 0,
      h_report_step),
    M(PCS_M_DEREGISTER, pcs__v1__deregister_request, pcs__v1__deregister_response, 0, h_deregister),
    M(PCS_M_SUBMIT_JOB, pcs__v1__submit_job_request, pcs__v1__submit_job_response, 0, h_submit),
    M(PCS_M_GET_JOB, pcs__v1__get_job_request, pcs__v1__get_job_response, 0, h_get_job),
    M(PCS_M_LIST_JOBS, pcs__v1__list_jobs_request, pcs__v1__list_jobs_response, 0, h_list_jobs),
    M(PCS_M_CANCEL_JOB, pcs__v1__cancel_job_request, pcs__v1__cancel_job_response, 0, h_cancel),
    M(PCS_M_GET_PLAN, pcs__v1__get_plan_request, pcs__v1__get_plan_response, 0, h_get_plan),
    M(PCS_M_DRY_RUN_PLAN, pcs__v1__dry_run_plan_request, pcs__v1__dry_run_plan_response, 0,
      h_dry_run),
    M(PCS_M_LIST_WORKERS, pcs__v1__list_workers_request, pcs__v1__list_workers_response, 0,
      h_list_workers),
    M(PCS_M_GET_STATUS, pcs__v1__get_status_request, pcs__v1__get_status_response, 0, h_get_status),
    M(PCS_M_HEALTH_CHECK, grpc__health__v1__health_check_request,
      grpc__health__v1__health_check_response, 0, h_health_check),
    M(PCS_M_HEALTH_WATCH, grpc__health__v1__health_check_request,
      grpc__health__v1__health_check_response, 1, h_health_watch),
};
#undef M

// ---------------------------------------------------------------------------------------------
// persistence hooks

static void on_worker_new(void *user, const pcs_coord_worker_t *w)
{
    pcs_server_t *s = user;
    mark_dirty(s, &s->dirty_workers, w->number);
}

/* The history forgot a finished job: its row goes with the next commit (persist deletes the
 * rows of dirty numbers that have no job). */
static void on_job_forget(void *user, uint32_t number)
{
    pcs_server_t *s = user;
    mark_dirty(s, &s->dirty_jobs, number);
}

static void on_job_change(void *user, const pcs_coord_job_t *j)
{
    pcs_server_t *s = user;
    if (pcs_job_state_terminal(j->state) && j->plan) /* history need not hold plans in memory */
        pcs_coord_job_drop_plan(s->coord, (pcs_coord_job_t *)j);
    mark_dirty(s, &s->dirty_jobs, j->number);
}

/* The job's row as it is now (into the open transaction). */
static pcs_status_t put_job(pcs_server_t *s, const pcs_coord_job_t *j)
{
    uint8_t *buf = NULL;
    size_t n = j->spec ? pcs__v1__job_spec__get_packed_size(j->spec) : 0;
    if (n)
        PCS_CHECK(pcs_calloc(n, 1, (void **)&buf));
    if (n)
        pcs__v1__job_spec__pack(j->spec, buf);
    /* rank -> worker (and its pid and incarnation) of a running job, so a restarted coordinator
     * can hold those workers for it; a rank not back yet after a restart keeps its reservation */
    uint32_t *ranks = NULL, known = 0;
    uint64_t *incs = NULL;
    if (j->state == PCS_JOB_RUNNING && j->world_size &&
        pcs_calloc((size_t)j->world_size * 2, sizeof *ranks, (void **)&ranks) == PCS_OK &&
        pcs_calloc(j->world_size, sizeof *incs, (void **)&incs) == PCS_OK) {
        for (uint32_t k = 0; k < j->world_size; k++) {
            uint32_t num = j->rank_worker[k];
            if (!num && j->rank_reserved)
                num = j->rank_reserved[k];
            const pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, num);
            ranks[k] = num;
            ranks[j->world_size + k] = w ? w->pid : 0;
            incs[k] = w ? w->incarnation : 0;
            known += num != 0;
        }
    }
    if (!known) { /* no map, or a restored job with no rank back yet: nothing to keep */
        free(ranks);
        free(incs);
        ranks = NULL;
        incs = NULL;
    }
    Pcs__V1__JobProgress prog = PCS__V1__JOB_PROGRESS__INIT;
    progress_to_pb(&j->progress, &prog);
    prog.restarts = j->restarts;
    uint8_t pbuf[128]; /* a JobProgress is a few scalars: well under 128 bytes packed */
    size_t plen = pcs__v1__job_progress__get_packed_size(&prog);
    if (plen > sizeof pbuf)
        plen = 0;
    else
        pcs__v1__job_progress__pack(&prog, pbuf);
    pcs_store_job_t r = {.number = j->number,
                         .name = j->name,
                         .request_id = j->request_id,
                         .owner = j->owner,
                         .reason = j->reason ? j->reason : "",
                         .state = (int)j->state,
                         .created_ms = j->created_wall_ms,
                         .started_ms = j->started_wall_ms,
                         .finished_ms = j->finished_wall_ms,
                         .generation = j->generation,
                         .plan_hash = j->plan_hash,
                         .world_size = j->world_size,
                         .spec = buf,
                         .spec_len = n,
                         .rank_worker = ranks,
                         .rank_pid = ranks ? ranks + j->world_size : NULL,
                         .rank_incarnation = incs,
                         .n_ranks = ranks ? j->world_size : 0,
                         .progress = plen ? pbuf : NULL,
                         .progress_len = plen};
    pcs_status_t st = pcs_store_put_job(s->store, &r);
    free(ranks);
    free(incs);
    free(buf);
    return st;
}

static void health_changed(pcs_server_t *s);

/* Write every dirty row and the id counters in one transaction and commit. Success opens the
 * gate (the replies and events that waited go out); failure ends them with UNAVAILABLE, keeps
 * the rows dirty for the next attempt, and turns health NOT_SERVING until a commit works. */
static pcs_status_t persist(pcs_server_t *s)
{
    if (!s->store || (!s->dirty_jobs.n && !s->dirty_workers.n))
        return PCS_OK;
    pcs_status_t st = PCS_OK;
    for (size_t i = 0; i < s->dirty_workers.n && st == PCS_OK; i++) {
        const pcs_coord_worker_t *w =
            pcs_coord_worker_by_number(s->coord, s->dirty_workers.list[i]);
        if (w) {
            pcs_store_worker_t row = {.number = w->number,
                                      .identity = w->identity,
                                      .host = w->host,
                                      .secret_hash = w->has_secret ? w->secret_hash : NULL};
            st = pcs_store_put_worker(s->store, &row);
        }
    }
    for (size_t i = 0; i < s->dirty_jobs.n && st == PCS_OK; i++) {
        const pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, s->dirty_jobs.list[i]);
        st = j ? put_job(s, j) : pcs_store_delete_job(s->store, s->dirty_jobs.list[i]);
    }
    /* ids are never handed out twice, even when history rows are gone */
    if (st == PCS_OK)
        st = pcs_store_put_meta(s->store, "next_worker", pcs_coord_max_worker(s->coord) + 1ull);
    if (st == PCS_OK)
        st = pcs_store_put_meta(s->store, "next_job", pcs_coord_max_job(s->coord) + 1ull);
    if (st == PCS_OK && s->write_coordinator_id)
        st = pcs_store_put_meta(s->store, "coordinator_id", s->coordinator_id);
    if (st == PCS_OK)
        st = pcs_store_flush(s->store);
    else
        pcs_store_rollback(s->store);
    if (st == PCS_OK) {
        /* a finished job's spec is in the store now: RAM keeps only its record */
        for (size_t i = 0; i < s->dirty_jobs.n; i++) {
            pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, s->dirty_jobs.list[i]);
            if (j)
                pcs_coord_job_drop_spec(s->coord, j);
        }
        dirty_clear(&s->dirty_jobs);
        dirty_clear(&s->dirty_workers);
        s->write_coordinator_id = false;
        s->commits++;
        if (s->store_failed) {
            s->store_failed = false;
            PCS_INFO(PCS_SUB_STORE, "store writes again: serving");
            health_changed(s);
        }
        if (s->rpc)
            pcs_rpc_server_gate_open(s->rpc);
        return PCS_OK;
    }
    s->commit_failures++;
    snprintf(s->store_error, sizeof s->store_error, "%s", pcs_last_error());
    pcs_utf8_trim_partial(s->store_error);
    if (!s->store_failed) {
        s->store_failed = true;
        PCS_WARN(PCS_SUB_STORE,
                 "cannot persist the coordinator's state (%s): not serving until "
                 "a commit works; retrying every tick",
                 s->store_error);
        health_changed(s);
    }
    if (s->rpc)
        pcs_rpc_server_gate_fail(s->rpc, PCS_ERR_REMOTE,
                                 "coordinator cannot persist its state (%s); nothing was "
                                 "acknowledged, retry",
                                 s->store_error);
    return st;
}

static void restore_worker(void *user, const pcs_store_worker_t *r)
{
    pcs_server_t *s = user;
    if (pcs_coord_restore_worker(s->coord, r->number, r->identity, r->host) != PCS_OK ||
        (r->secret_hash && pcs_coord_restore_secret(s->coord, r->number, r->secret_hash) != PCS_OK))
        PCS_WARN(PCS_SUB_STORE, "store: worker %" PRIu32 " not restored: %s", r->number,
                 pcs_last_error());
}

static void restore_job(void *user, const pcs_store_job_t *r)
{
    pcs_server_t *s = user;
    Pcs__V1__JobSpec *spec = NULL;
    Pcs__V1__Plan *plan = NULL;
    if (r->spec_len)
        spec = pcs__v1__job_spec__unpack(NULL, r->spec_len, r->spec);
    pcs_mesh_t mesh = {0};
    pcs_job_state_t state = (pcs_job_state_t)r->state;
    uint64_t finished_ms = r->finished_ms;
    const char *reason = r->reason;
    char why[700];
    bool live = state == PCS_JOB_PENDING || state == PCS_JOB_RUNNING;
    const char *resumed = state == PCS_JOB_RUNNING ? "resumed" : "started";
    if (spec) {
        /* The plan is a pure function of the spec: rebuild it (for jobs that can still start
         * or run on) rather than store it. */
        pcs_status_t mst = spec_mesh(spec, &mesh);
        if (mst != PCS_OK)
            mesh.n = 0;
        if (live && (mst != PCS_OK || pcs_plan_build(spec, mesh.world, &plan) != PCS_OK)) {
            snprintf(why, sizeof why, "not %s after a coordinator restart: %.*s", resumed,
                     pcs_utf8_prefix(pcs_last_error(), 600), pcs_last_error());
            plan = NULL;
        }
    } else {
        snprintf(why, sizeof why, "not %s after a coordinator restart: stored spec unreadable",
                 resumed);
    }
    /* A live job without a plan would hand its workers no plan: fail it instead. */
    if (live && !plan) {
        state = PCS_JOB_FAILED;
        reason = why;
        finished_ms = pcs_wall_ms();
    }
    if (spec && !live && state == (pcs_job_state_t)r->state) {
        /* history: the spec stays in the store (job_spec reads it back when asked) */
        pcs__v1__job_spec__free_unpacked(spec, NULL);
        spec = NULL;
    }
    if (!mesh.n) { /* unreadable spec: keep the history row with a 1-rank mesh */
        mesh.n = 1;
        mesh.dim[0] = PCS_MESH_DP_SHARD;
        mesh.size[0] = r->world_size ? r->world_size : 1;
    }
    pcs_coord_job_desc_t d = {
        .name = r->name,
        .request_id = r->request_id,
        .owner = r->owner,
        .n_dims = mesh.n,
        .dim_name = mesh.dim,
        .dim_size = mesh.size,
        .need_cuda = spec && strcmp(spec->backend, "cuda") == 0,
        .transport = spec ? pcs_coord_job_transport(spec->backend, spec->collectives) : NULL,
        .program = spec ? spec->program : NULL,
        .spec = spec,
        .plan = plan,
        /* the rebuilt plan's own hash: the one its workers check (a coordinator of another
         * version may have stored another) */
        .plan_hash = plan ? pcs_plan_hash(plan) : r->plan_hash,
        .steps = spec && spec->training ? spec->training->steps : 0,
        .max_restarts = spec && spec->elastic ? spec->elastic->max_restarts : 0,
        .min_workers = spec && spec->elastic ? spec->elastic->min_workers : 0,
        .max_workers = spec && spec->elastic ? spec->elastic->max_workers : 0};
    if (pcs_coord_restore_job(s->coord, r->number, &d, state, reason, r->created_ms, r->started_ms,
                              finished_ms, r->generation) != PCS_OK) {
        PCS_WARN(PCS_SUB_STORE, "store: job %" PRIu32 " not restored: %s", r->number,
                 pcs_last_error());
        return;
    }
    pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, r->number);
    Pcs__V1__JobProgress *prog =
        j && r->progress_len ? pcs__v1__job_progress__unpack(NULL, r->progress_len, r->progress)
                             : NULL;
    if (prog) {
        pcs_coord_progress_t p;
        progress_from_pb(prog, &p);
        pcs_coord_restore_progress(s->coord, j, &p);
        pcs_coord_job_set_restarts(j, prog->restarts);
        pcs__v1__job_progress__free_unpacked(prog, NULL);
    }
    if (j && state == PCS_JOB_RUNNING && r->n_ranks) {
        /* hold its workers for it: a pending job must not take one before it is back */
        if (pcs_coord_restore_ranks(s->coord, j, r->rank_worker, r->rank_pid, r->rank_incarnation,
                                    r->n_ranks) == PCS_OK)
            PCS_INFO(PCS_SUB_STORE, "job %s: %" PRIu32 " ranks reserved for their workers", j->id,
                     r->n_ranks);
        else
            PCS_WARN(PCS_SUB_STORE,
                     "job %s: rank map not restored (%s); ranks come back by step "
                     "report",
                     j->id, pcs_last_error());
    }
}

// ---------------------------------------------------------------------------------------------
// metrics snapshot (built on the loop thread, served by the HTTP thread)

#define MAX_RANK_SERIES 256 /* per-rank series of one job; the straggler view covers them all */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The straggler view of job j: the slowest rank's last step time over the median rank's, and
 * which rank that is. Returns the number of ranks that reported (0: no view yet). */
static uint32_t job_straggler(const pcs_coord_job_t *j, double *ratio, uint32_t *slowest)
{
    double *t = NULL;
    uint32_t n = 0;
    *ratio = 1.0;
    *slowest = 0;
    if (pcs_calloc(j->world_size ? j->world_size : 1, sizeof *t, (void **)&t) != PCS_OK)
        return 0;
    for (uint32_t r = 0; r < j->world_size; r++) {
        if (!j->rank_step[r])
            continue; /* no report yet */
        if (!n || j->rank_step_ms[r] > j->rank_step_ms[*slowest])
            *slowest = r;
        t[n++] = j->rank_step_ms[r];
    }
    if (n) {
        qsort(t, n, sizeof *t, cmp_double);
        double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
        *ratio = median > 0 ? t[n - 1] / median : 1.0;
    }
    free(t);
    return n;
}

/* Per-rank step time and loss (the first MAX_RANK_SERIES ranks of each running job) and the
 * straggler view over every rank; each family's samples together after its HELP and TYPE, as
 * the exposition format requires. */
static void rank_metrics(pcs_server_t *s, FILE *f)
{
    static const struct {
        const char *name, *help;
    } fam[] = {
        {"pcs_rank_step_seconds", "Last reported step time of a rank."},
        {"pcs_rank_loss", "Last reported loss of a rank."},
        {"pcs_job_straggler_ratio", "Slowest rank's last step time over the median rank's (1: "
                                    "none lags)."},
        {"pcs_job_slowest_rank", "The rank with the longest last step time."},
        {"pcs_rank_pipeline_bubble", "Pipeline stages: the share of a rank's last schedule action "
                                     "list not spent computing (absent without stages)."},
    };
    char lab[256];
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", fam[k].name, fam[k].help, fam[k].name);
        for (uint32_t i = 1; i <= pcs_coord_max_job(s->coord); i++) {
            pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, i);
            if (!j || j->state != PCS_JOB_RUNNING || !j->rank_step_ms)
                continue;
            if (k < 2 || k == 4) {
                for (uint32_t r = 0; r < j->world_size && r < MAX_RANK_SERIES; r++) {
                    if (!j->rank_step[r] || (k == 4 && j->rank_bubble[r] < 0))
                        continue;
                    snprintf(lab, sizeof lab, "job_id=\"%s\",rank=\"%u\"", j->id, r);
                    pcs_metrics_line(f, fam[k].name, lab,
                                     k == 0   ? j->rank_step_ms[r] / 1000.0
                                     : k == 1 ? j->rank_loss[r]
                                              : j->rank_bubble[r]);
                }
                continue;
            }
            double ratio;
            uint32_t slowest;
            if (!job_straggler(j, &ratio, &slowest))
                continue;
            snprintf(lab, sizeof lab, "job_id=\"%s\"", j->id);
            pcs_metrics_line(f, fam[k].name, lab, k == 2 ? ratio : (double)slowest);
        }
    }
}

static void publish_metrics(pcs_server_t *s)
{
    if (!s->http)
        return;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    pcs_coord_counts_t cn;
    pcs_coord_counts(s->coord, &cn);
    char lab[256];
    pcs_metrics_build_info(f, "coordinator");
    pcs_metrics_process(f, s->start_wall_s);
    fprintf(f, "# HELP pcs_up 1 while the coordinator serves.\n# TYPE pcs_up gauge\n");
    pcs_metrics_line(f, "pcs_up", NULL, s->stopping ? 0 : 1);
    fprintf(f, "# HELP pcs_uptime_seconds Seconds since start.\n# TYPE pcs_uptime_seconds gauge\n");
    pcs_metrics_line(f, "pcs_uptime_seconds", NULL, (double)(pcs_now_ms() - s->start_ms) / 1000.0);
    fprintf(f, "# HELP pcs_health_watch_streams Open grpc.health.v1 Health/Watch streams.\n"
               "# TYPE pcs_health_watch_streams gauge\n");
    pcs_metrics_line(f, "pcs_health_watch_streams", NULL, (double)s->n_hw);
    fprintf(f, "# HELP pcs_health_watch_streams_max The cap (max-watch-streams).\n"
               "# TYPE pcs_health_watch_streams_max gauge\n");
    pcs_metrics_line(f, "pcs_health_watch_streams_max", NULL, s->max_hw);
    fprintf(f, "# HELP pcs_health_watch_refused_total Health/Watch calls refused at the cap.\n"
               "# TYPE pcs_health_watch_refused_total counter\n");
    pcs_metrics_line(f, "pcs_health_watch_refused_total", NULL, (double)s->hw_refused);
    fprintf(f, "# HELP pcs_coordinator_stalls_total Times the coordinator's loop did not run for "
               "over half a lease (leases were renewed after each).\n"
               "# TYPE pcs_coordinator_stalls_total counter\n");
    pcs_metrics_line(f, "pcs_coordinator_stalls_total", NULL, (double)s->stalls);
    fprintf(f, "# HELP pcs_coordinator_stalled_seconds_total Time spent in those stalls.\n"
               "# TYPE pcs_coordinator_stalled_seconds_total counter\n");
    pcs_metrics_line(f, "pcs_coordinator_stalled_seconds_total", NULL, (double)s->stalled_ms / 1e3);
    if (s->store) {
        fprintf(f,
                "# HELP pcs_store_ok 1 while the last commit of the state worked (0: replies are "
                "refused with UNAVAILABLE).\n# TYPE pcs_store_ok gauge\n");
        pcs_metrics_line(f, "pcs_store_ok", NULL, s->store_failed ? 0 : 1);
        fprintf(f, "# HELP pcs_store_commits_total Commits of the coordinator's state.\n"
                   "# TYPE pcs_store_commits_total counter\n");
        pcs_metrics_line(f, "pcs_store_commits_total", NULL, (double)s->commits);
        fprintf(f, "# HELP pcs_store_commit_failures_total Commits that failed (each answered "
                   "UNAVAILABLE).\n# TYPE pcs_store_commit_failures_total counter\n");
        pcs_metrics_line(f, "pcs_store_commit_failures_total", NULL, (double)s->commit_failures);
    }
    fprintf(f, "# HELP pcs_workers Workers by state.\n# TYPE pcs_workers gauge\n");
    for (int st = PCS_WORKER_IDLE; st <= PCS_WORKER_STOPPING; st++) {
        snprintf(lab, sizeof lab, "state=\"%s\"", pcs_worker_state_name((pcs_worker_state_t)st));
        pcs_metrics_line(f, "pcs_workers", lab, cn.workers[st]);
    }
    fprintf(f, "# HELP pcs_jobs Jobs by state.\n# TYPE pcs_jobs gauge\n");
    for (int st = PCS_JOB_PENDING; st <= PCS_JOB_CANCELLED; st++) {
        snprintf(lab, sizeof lab, "state=\"%s\"", pcs_job_state_name((pcs_job_state_t)st));
        pcs_metrics_line(f, "pcs_jobs", lab, cn.jobs[st]);
    }
    /* per running job: one HELP/TYPE block per family, then one line per job */
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"pcs_job_step", "gauge", "Last reported step."},
        {"pcs_job_loss", "gauge", "Last reported loss (rank 0)."},
        {"pcs_job_step_seconds", "gauge", "Last reported step time (rank 0)."},
        {"pcs_job_reports_total", "counter", "Step reports received."},
        {"pcs_job_audit_ok", "gauge", "1 while every collective ran in the planned dtype."},
        {"pcs_job_generation", "gauge", "Current generation."},
        {"pcs_job_restarts_total", "counter", "Automatic restarts (spec.elastic)."},
        {"pcs_job_collective_bytes_total", "counter", "Bytes moved by collectives, by kind."},
    };
    for (size_t k = 0; k < sizeof fam / sizeof *fam; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fam[k].name, fam[k].help, fam[k].name,
                fam[k].type);
        for (uint32_t i = 1; i <= pcs_coord_max_job(s->coord); i++) {
            pcs_coord_job_t *j = pcs_coord_job_by_number(s->coord, i);
            if (!j || !(j->state == PCS_JOB_RUNNING || (j->state == PCS_JOB_PENDING && j->restarts)))
                continue; /* running, or waiting for workers to restart */
            const pcs_coord_progress_t *p = &j->progress;
            snprintf(lab, sizeof lab, "job_id=\"%s\"", j->id);
            switch (k) {
            case 0:
                pcs_metrics_line(f, fam[k].name, lab, (double)p->step);
                break;
            case 1:
                pcs_metrics_line(f, fam[k].name, lab, p->loss);
                break;
            case 2:
                pcs_metrics_line(f, fam[k].name, lab, p->step_ms / 1000.0);
                break;
            case 3:
                pcs_metrics_line(f, fam[k].name, lab, (double)p->reports);
                break;
            case 4:
                pcs_metrics_line(f, fam[k].name, lab, p->audit_ok ? 1 : 0);
                break;
            case 5:
                pcs_metrics_line(f, fam[k].name, lab, (double)j->generation);
                break;
            case 6:
                pcs_metrics_line(f, fam[k].name, lab, (double)j->restarts);
                break;
            default: {
                const char *kinds[3] = {"all_gather", "reduce_scatter", "all_reduce"};
                const uint64_t v[3] = {p->all_gather_bytes, p->reduce_scatter_bytes,
                                       p->all_reduce_bytes};
                for (int c = 0; c < 3; c++) {
                    snprintf(lab, sizeof lab, "job_id=\"%s\",kind=\"%s\"", j->id, kinds[c]);
                    pcs_metrics_line(f, fam[k].name, lab, (double)v[c]);
                }
            }
            }
        }
    }
    rank_metrics(s, f);
    size_t nm = pcs_rpc_server_stats(s->rpc, NULL, 0);
    pcs_rpc_method_stats_t *rows = NULL;
    if (nm && pcs_calloc(nm, sizeof *rows, (void **)&rows) == PCS_OK) {
        nm = pcs_rpc_server_stats(s->rpc, rows, nm);
        const double *bounds = pcs_rpc_latency_bounds_s();
        fprintf(f, "# HELP pcs_rpc_calls_total RPCs by method and gRPC code.\n# TYPE "
                   "pcs_rpc_calls_total counter\n");
        for (size_t i = 0; i < nm; i++)
            for (int code = 0; code < 17; code++)
                if (rows[i].calls_by_code[code]) {
                    snprintf(lab, sizeof lab, "method=\"%s\",code=\"%s\"",
                             rows[i].path ? rows[i].path : "unknown", pcs_grpc_code_name(code));
                    pcs_metrics_line(f, "pcs_rpc_calls_total", lab,
                                 (double)rows[i].calls_by_code[code]);
                }
        fprintf(f, "# HELP pcs_rpc_latency_seconds RPC latency.\n# TYPE pcs_rpc_latency_seconds "
                   "histogram\n");
        for (size_t i = 0; i < nm; i++) {
            const char *path = rows[i].path ? rows[i].path : "unknown";
            uint64_t cum = 0;
            for (int b = 0; b < PCS_RPC_LAT_BUCKETS; b++) {
                cum += rows[i].latency_bucket[b];
                char le[32];
                if (b < PCS_RPC_LAT_BUCKETS - 1)
                    snprintf(le, sizeof le, "%g", bounds[b]);
                else
                    snprintf(le, sizeof le, "+Inf");
                snprintf(lab, sizeof lab, "method=\"%s\",le=\"%s\"", path, le);
                pcs_metrics_line(f, "pcs_rpc_latency_seconds_bucket", lab, (double)cum);
            }
            snprintf(lab, sizeof lab, "method=\"%s\"", path);
            pcs_metrics_line(f, "pcs_rpc_latency_seconds_sum", lab, rows[i].latency_sum_s);
            pcs_metrics_line(f, "pcs_rpc_latency_seconds_count", lab, (double)cum);
        }
        free(rows);
    }
    fclose(f);
    pcs_http_publish(s->http, buf, len, true, !s->stopping && !s->store_failed,
                     s->stopping ? "shutting down" : "the state store cannot commit");
    free(buf);
}

// ---------------------------------------------------------------------------------------------
// loop

static void begin_shutdown(pcs_server_t *s, uint64_t now)
{
    s->stopping = 1;
    s->stop_at_ms = now + SHUTDOWN_GRACE_MS;
    PCS_INFO(PCS_SUB_INIT, "shutting down: ending streams and parked calls");
    for (uint32_t i = 1; i <= pcs_coord_max_worker(s->coord); i++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(s->coord, i);
        if (w && w->watch) {
            pcs_rpc_call_t *c = w->watch;
            w->watch = NULL;
            pcs_rpc_fail(c, PCS_ERR_REMOTE, "coordinator shutting down");
        }
    }
    pcs_coord_kv_fail_all(s->coord, PCS_ERR_REMOTE, "coordinator shutting down");
    for (size_t i = 0; i < s->n_hw; i++) {
        health_send(s, s->hw[i].call, s->hw[i].known);
        pcs_rpc_finish(s->hw[i].call);
    }
    s->n_hw = 0;
    (void)persist(s); /* what was answered is committed; what cannot be is refused */
    publish_metrics(s);
}

static void tick(void *user, uint64_t now)
{
    pcs_server_t *s = user;
    if (s->stop_requested && !s->stopping)
        begin_shutdown(s, now);
    if (s->stopping) {
        if (now >= s->stop_at_ms)
            pcs_rpc_server_stop(s->rpc);
        return;
    }
    uint64_t stall = pcs_coord_tick(s->coord);
    if (stall) {
        s->stalls++;
        s->stalled_ms += stall;
    }
    (void)persist(s); /* replies and events of this batch go out after its commit */
    if (now >= s->next_metrics_ms) {
        publish_metrics(s);
        s->next_metrics_ms = now + METRICS_EVERY_MS;
    }
}

pcs_status_t pcs_server_create(const pcs_server_config_t *cfg, pcs_server_t **out)
{
    *out = NULL;
    pcs_server_t *s;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *s, (void **)&s));
    s->cfg = *cfg;
    s->start_ms = pcs_now_ms();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    s->start_wall_s = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    s->max_hw = cfg->max_watch_streams ? cfg->max_watch_streams : DEFAULT_MAX_WATCH_STREAMS;
    size_t max_msg = cfg->max_message_bytes ? cfg->max_message_bytes : (4u << 20);
    s->max_spec = cfg->max_spec_bytes ? cfg->max_spec_bytes : max_msg / 4;
    s->cert_identity = cfg->tls && cfg->tls->ca_file && *cfg->tls->ca_file &&
                       !cfg->worker_cert_identity_off;
    if (cfg->token_file && *cfg->token_file) {
        PCS_CHECK_GOTO(pcs_auth_load(cfg->token_file, &s->auth), st, fail);
        PCS_INFO(PCS_SUB_INIT, "bearer tokens required: %zu tokens from %s",
                 pcs_auth_count(s->auth), cfg->token_file);
    }
    /* this coordinator's identity (a stored one replaces it below), for job uids */
    if (getrandom(&s->coordinator_id, sizeof s->coordinator_id, 0) !=
        (ssize_t)sizeof s->coordinator_id)
        s->coordinator_id = pcs_now_us() ^ ((uint64_t)getpid() << 32);
    uint64_t fresh_id = s->coordinator_id;
    pcs_coord_config_t cc = {.clock = pcs_clock_real(),
                             .heartbeat_interval_ms = cfg->heartbeat_interval_ms,
                             .lease_ms = cfg->lease_ms,
                             .readopt_ms = cfg->readopt_ms,
                             .step_timeout_factor = cfg->step_timeout_factor,
                             .step_timeout_min_ms = cfg->step_timeout_min_ms,
                             .first_step_timeout_ms = cfg->first_step_timeout_ms,
                             .kv_max_key_bytes = cfg->kv_max_key_bytes,
                             .kv_max_value_bytes = cfg->kv_max_value_bytes,
                             .kv_max_job_bytes = cfg->kv_max_job_bytes,
                             .user = s,
                             .free_payload = free_payload,
                             .on_events = on_events,
                             .on_kv_wake = on_kv_wake,
                             .on_job_change = on_job_change,
                             .on_worker_new = on_worker_new,
                             .on_job_forget = on_job_forget,
                             .replan = replan,
                             .elastic_wait_ms = cfg->elastic_wait_ms,
                             .kv_max_total_bytes = cfg->kv_max_total_bytes,
                             .max_finished_jobs = cfg->max_finished_jobs};
    PCS_CHECK_GOTO(pcs_coord_create(&cc, &s->coord), st, fail);
    if (cfg->db_path && *cfg->db_path && strcmp(cfg->db_path, ":memory:") != 0) {
        PCS_CHECK_GOTO(pcs_store_open(cfg->db_path, !cfg->store_sync_normal, &s->store), st, fail);
        s->restoring = true;
        st = pcs_store_load(s->store, restore_worker, restore_job, s);
        uint64_t next_worker = 0, next_job = 0;
        if (st == PCS_OK)
            st = pcs_store_get_meta(s->store, "next_worker", &next_worker);
        if (st == PCS_OK)
            st = pcs_store_get_meta(s->store, "next_job", &next_job);
        if (st == PCS_OK)
            st = pcs_coord_reserve_ids(s->coord, next_worker, next_job);
        if (st == PCS_OK)
            st = pcs_store_get_meta(s->store, "coordinator_id", &s->coordinator_id);
        s->restoring = false;
        if (st != PCS_OK)
            goto fail;
        if (!s->coordinator_id)
            s->coordinator_id = fresh_id; /* a new store: written with the first commit */
        s->write_coordinator_id = true;
        /* restored jobs may have changed (running ones without a plan are FAILED now): write
         * them all back; a store that cannot be written (a full disk) does not stop the start,
         * the coordinator comes up NOT_SERVING and retries every tick */
        for (uint32_t i = 1; i <= pcs_coord_max_job(s->coord); i++)
            if (pcs_coord_job_by_number(s->coord, i))
                mark_dirty(s, &s->dirty_jobs, i);
        (void)persist(s);
        PCS_INFO(PCS_SUB_STORE, "restored %" PRIu32 " worker ids and %" PRIu32 " jobs from %s%s",
                 pcs_coord_max_worker(s->coord), pcs_coord_max_job(s->coord), cfg->db_path,
                 s->store_failed ? " (not writable now: NOT_SERVING until it is)" : "");
    }
    pcs_rpc_server_config_t rc = {.listen = cfg->listen,
                                  .methods = methods,
                                  .n_methods = sizeof methods / sizeof *methods,
                                  .user = s,
                                  .max_message_bytes = cfg->max_message_bytes,
                                  .tick_ms = 50,
                                  .tick = tick,
                                  .tls = cfg->tls,
                                  .authorize = authorize};
    PCS_CHECK_GOTO(pcs_rpc_server_create(&rc, &s->rpc), st, fail);
    if (cfg->metrics_listen && *cfg->metrics_listen) {
        PCS_CHECK_GOTO(pcs_http_start(cfg->metrics_listen, "metrics-listen",
                                      PCS_COORD_HTTP_STALE_MS, &s->http), st, fail);
        const char *mpf = cfg->metrics_port_file;
        if (mpf && *mpf)
            PCS_CHECK_GOTO(
                pcs_port_file_write("metrics-port-file", mpf, pcs_http_port(s->http)), st,
                fail);
        publish_metrics(s);
    }
    *out = s;
    return PCS_OK;
fail:
    pcs_server_destroy(s);
    return st;
}

int pcs_server_port(const pcs_server_t *s)
{
    return s && s->rpc ? pcs_rpc_server_port(s->rpc) : 0;
}

int pcs_server_metrics_port(const pcs_server_t *s)
{
    return s && s->http ? pcs_http_port(s->http) : 0;
}

pcs_status_t pcs_server_run(pcs_server_t *s)
{
    return pcs_rpc_server_run(s->rpc);
}

void pcs_server_request_stop(pcs_server_t *s)
{
    if (s)
        s->stop_requested = 1;
}

void pcs_server_destroy(pcs_server_t *s)
{
    if (!s)
        return;
    /* The RPC server first: its teardown cancels calls whose hooks still reach coord state. */
    pcs_rpc_server_destroy(s->rpc);
    pcs_http_stop(s->http);
    pcs_coord_destroy(s->coord);
    pcs_store_close(s->store);
    pcs_auth_free(s->auth);
    dirty_free(&s->dirty_jobs);
    dirty_free(&s->dirty_workers);
    free(s->hw);
    free(s);
}
