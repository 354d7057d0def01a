/* The worker agent: Register, a heartbeat thread, a WatchAssignment thread (re-opened with backoff
 * when the stream breaks; re-registers when the coordinator forgot us), a reporter thread that
 * sends ReportStep in order without blocking the training loop, and the main loop that runs each
 * assigned job. A coordinator restart or pause does not stop training: heartbeats are retried,
 * reports wait in the queue until the coordinator is back (progress reports merge while they
 * wait; the final one is never dropped for being late). Only the collectives carry step data;
 * the coordinator is never on the hot path. */
#include "worker/agent.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "coll/kv.h"
#include "io/report.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/kernels.h"
#include "pcs/file.h"
#include "pcs/log.h"
#include "pcs/mem.h"
#include "pcs/rpc.h"
#include "pcs/utf8.h"
#include "pcs/v1/worker.pb-c.h"
#include "planner/validate.h" /* PCS_PROGRAM_NAME_MAX */
#include "worker/train.h"

#define GRPC_NOT_FOUND           5
#define GRPC_FAILED_PRECONDITION 9
#define GRPC_UNAUTHENTICATED     16

typedef struct report_item {
    struct report_item *next;
    Pcs__V1__ReportStepRequest *req; /* unpacked deep copy, freed after sending */
    int final;                       /* done or error: decides the job's state */
} report_item_t;

/* Queued reports beyond this merge: a progress report that cannot be sent yet (the coordinator is
 * away) is superseded by the next one, its byte counts added in. A 60 s outage at 100 steps/s
 * then costs a few dozen RPCs at reconnect rather than 6,000, and the queue stays bounded. */
#define REPORT_MERGE_AT 32
/* Re-registrations one report may cause before it is dropped (a coordinator that lost its store
 * no longer knows the job either). */
#define REPORT_MAX_REREGISTER 3

struct pcs_agent {
    char *coordinator, *identity, *backend, *coll, *hostname, *report_dir, *program;
    FILE *report_file; /* training thread only */
    uint32_t rpc_timeout_ms, coll_timeout_ms, heartbeat_ms, max_jobs, flush_ms;
    int device; /* resolved ordinal (0 on cpu) */
    uint64_t incarnation; /* random, nonzero: this process's Registers (RegisterRequest) */
    uint64_t inject_inf_step, die_at_checkpoint;
    uint32_t inject_inf_rank, step_pause_ms, die_rank, blas_threads;

    pcs_rpc_client_t *rpc;
    atomic_int stop; /* set by pcs_agent_stop (signal handler) */
    atomic_int quit; /* threads end */
    atomic_int reopen_watch;
    atomic_int leaving; /* Deregister is under way or done: never register again */
    int restarting;     /* the running job's generation was told to RESTART (under mu) */
    pcs_root_t *roots[3]; /* data, init, checkpoint: where a job's paths may lead */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    char worker_id[64]; /* under mu */
    uint32_t hb_interval_ms;
    Pcs__V1__Assignment *pending; /* under mu: next job to run */
    char job_id[64];              /* under mu: the running job ("" if idle) */
    uint64_t generation;
    uint32_t rank;
    pcs_train_t *train; /* under mu while running, for abort */
    int finished;       /* under mu: the running job reported its last step (done) without error */
    char done_job[64];  /* under mu: the last job this worker ran to its end (done or failed) */
    uint64_t done_generation;
    void (*abort_fn)(void *, const char *); /* under mu: custom job's abort */
    /* under mu: a STOP for the running job arrived before it could be aborted (while it was
     * being set up: data, init.from, rendezvous): applied as soon as it can be */
    int abort_pending;
    char abort_reason[512];
    void *abort_ctx;
    pcs_agent_job_fn job_fn;
    void *job_ctx;
    uint64_t last_step;

    report_item_t *rq_head, *rq_tail; /* under mu */
    size_t rq_len;
    int rq_busy;
    uint64_t rq_give_up_ms; /* under mu: exit flush deadline (0: keep trying) */

    /* under mu: what pcs_agent_stats reports */
    int registered;
    uint64_t answered_ms, loop_ms; /* pcs_now_ms() of the last answer / heartbeat round */
    uint64_t hb_failures, registrations, jobs_ok, jobs_failed, jobs_stopped, reports_sent;
    uint64_t ag_bytes, rs_bytes, ar_bytes;
    double last_loss, last_step_ms;

    pthread_t hb_thread, watch_thread, report_thread;
    int threads_started; /* bit 0 heartbeat, 1 watch, 2 reporter: joined in destroy */
};

// ---- helpers ----

/* Sleep up to ms, returning early when the agent quits (its threads end) or, with
 * `or_stop`, when it is asked to stop. The threads nap until quit only: after a SIGTERM they
 * still pace their heartbeats and report retries while the main loop flushes and deregisters. */
static void nap_until(pcs_agent_t *a, uint32_t ms, int or_stop)
{
    while (ms > 0 && !atomic_load(&a->quit) && !(or_stop && atomic_load(&a->stop))) {
        uint32_t d = ms > 50 ? 50 : ms;
        pcs_sleep_ms(d);
        ms -= d;
    }
}

static void nap(pcs_agent_t *a, uint32_t ms)
{
    nap_until(a, ms, 0);
}

static void abs_deadline(struct timespec *ts, uint32_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static pcs_status_t do_register(pcs_agent_t *a)
{
    if (atomic_load(&a->leaving))
        return pcs_set_error(PCS_ERR_STATE, "worker is leaving: not registering again");
    Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
    Pcs__V1__Device dev = PCS__V1__DEVICE__INIT;
    Pcs__V1__Device *devs[1] = {&dev};
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    dev.index = (uint32_t)a->device;
    char name[128];
    if (strcmp(a->backend, "cuda") == 0) {
        /* checked at create; a failure here only loses the name and size in ListWorkers */
        const pcs_backend_ops_t *be = NULL;
        uint64_t mem = 0;
        name[0] = '\0';
        if (pcs_backend_get("cuda", &be) == PCS_OK)
            (void)be->device_info(a->device, name, sizeof name, &mem);
        dev.kind = (char *)"cuda";
        dev.memory_bytes = mem;
    } else {
        snprintf(name, sizeof name, "cpu x%ld", ncpu);
        dev.kind = (char *)"cpu";
        dev.memory_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    }
    dev.name = name;
    /* What the job's `collectives` may pick on this worker. */
    char *backends[2];
    size_t nb = 0;
    int cuda = strcmp(a->backend, "cuda") == 0;
    const pcs_backend_ops_t *cbe = NULL;
    /* the simulated device (simulate-cuda, CI) has no NCCL: never offer it there */
    int nccl = cuda && pcs_backend_get("cuda", &cbe) == PCS_OK && !pcs_backend_is_simulated(cbe);
    if (nccl && strcmp(a->coll, "gloo") != 0)
        backends[nb++] = (char *)"nccl";
    if (strcmp(a->coll, "nccl") != 0)
        backends[nb++] = (char *)"gloo";
    req.identity = a->identity;
    req.host = host;
    req.pid = (uint32_t)getpid();
    req.n_devices = 1;
    req.devices = devs;
    req.n_backends = nb;
    req.backends = backends;
    req.version = (char *)"0.1.0";
    req.program = a->program;
    req.address = a->hostname;
    req.incarnation = a->incarnation;
    ProtobufCMessage *resp = NULL;
    pcs_status_t st =
        pcs_rpc_call(a->rpc, PCS_M_REGISTER, &req.base, &pcs__v1__register_response__descriptor,
                     (int)a->rpc_timeout_ms, &resp, NULL);
    if (st != PCS_OK)
        return st;
    Pcs__V1__RegisterResponse *r = (Pcs__V1__RegisterResponse *)resp;
    /* the credential of this registration: every later call carries it (a re-register presents
     * it, and a coordinator that still knows it keeps this worker's id and secret) */
    st = pcs_rpc_client_set_worker_secret(a->rpc, r->worker_secret);
    if (st != PCS_OK) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return st;
    }
    pthread_mutex_lock(&a->mu);
    a->registered = 1;
    a->registrations++;
    a->answered_ms = pcs_now_ms();
    snprintf(a->worker_id, sizeof a->worker_id, "%s", r->worker_id ? r->worker_id : "");
    a->hb_interval_ms = a->heartbeat_ms
                            ? a->heartbeat_ms
                            : (r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 1000);
    pthread_mutex_unlock(&a->mu);
    PCS_INFO(PCS_SUB_WORKER, "registered with %s as %s (identity %s%s), heartbeat %u ms",
             a->coordinator, a->worker_id, a->identity, r->reregistered ? ", re-registered" : "",
             a->hb_interval_ms);
    protobuf_c_message_free_unpacked(resp, NULL);
    return PCS_OK;
}

static void copy_worker_id(pcs_agent_t *a, char *buf, size_t n)
{
    pthread_mutex_lock(&a->mu);
    snprintf(buf, n, "%s", a->worker_id);
    pthread_mutex_unlock(&a->mu);
}

/* Abort the running job if it is `job_id` (NULL: whatever runs) in generation `gen` (0: any): a
 * directive about an earlier generation of the job must not stop the generation that replaced
 * it after a restart. */
static void abort_running_gen(pcs_agent_t *a, const char *job_id, uint64_t gen, const char *reason)
{
    pthread_mutex_lock(&a->mu);
    int same = !job_id || (strcmp(job_id, a->job_id) == 0 && (!gen || gen == a->generation));
    if (same && a->finished) {
        /* The STOP that follows a job's success reaches us while the ranks leave together;
         * aborting then would tear down communicators that are closing cleanly. */
        PCS_DEBUG(PCS_SUB_WORKER, "job %s already finished: not aborting (%s)", a->job_id, reason);
    } else if ((a->train || a->abort_fn) && same) {
        PCS_INFO(PCS_SUB_WORKER, "aborting job %s: %s", a->job_id, reason);
        if (a->train)
            pcs_train_abort(a->train, reason);
        else
            a->abort_fn(a->abort_ctx, reason);
    } else if (same && a->job_id[0] && !a->abort_pending) {
        PCS_INFO(PCS_SUB_WORKER, "job %s is still being set up: aborting it once it can be (%s)",
                 a->job_id, reason);
        a->abort_pending = 1;
        snprintf(a->abort_reason, sizeof a->abort_reason, "%s", reason);
    }
    pthread_mutex_unlock(&a->mu);
}

static void abort_running(pcs_agent_t *a, const char *job_id, const char *reason)
{
    abort_running_gen(a, job_id, 0, reason);
}

// ---- heartbeat thread ----

static void *heartbeat_main(void *arg)
{
    pcs_agent_t *a = arg;
    pcs_thread_name("pcs-heartbeat");
    uint32_t backoff = 100;
    while (!atomic_load(&a->quit) && !atomic_load(&a->leaving)) {
        char wid[64], job[64];
        uint64_t gen;
        uint32_t interval;
        pthread_mutex_lock(&a->mu);
        snprintf(wid, sizeof wid, "%s", a->worker_id);
        snprintf(job, sizeof job, "%s", a->job_id);
        gen = a->generation;
        interval = a->hb_interval_ms ? a->hb_interval_ms : 1000;
        a->loop_ms = pcs_now_ms();
        pthread_mutex_unlock(&a->mu);

        Pcs__V1__HeartbeatRequest req = PCS__V1__HEARTBEAT_REQUEST__INIT;
        req.worker_id = wid;
        req.job_id = job;
        req.generation = gen;
        ProtobufCMessage *resp = NULL;
        int code = 0;
        pcs_status_t st = pcs_rpc_call(a->rpc, PCS_M_HEARTBEAT, &req.base,
                                       &pcs__v1__heartbeat_response__descriptor,
                                       (int)a->rpc_timeout_ms, &resp, &code);
        if (st == PCS_OK) {
            const Pcs__V1__HeartbeatResponse *hr = (const Pcs__V1__HeartbeatResponse *)resp;
            /* The coordinator ended the job this worker still runs (a STOP that did not arrive):
             * stop it, so the worker confirms it left and is scheduled again. */
            if (job[0] && hr->state == PCS__V1__WORKER_STATE__WORKER_STATE_STOPPING)
                abort_running_gen(a, job, gen,
                                  "the coordinator ended this job (heartbeat: STOPPING)");
            protobuf_c_message_free_unpacked(resp, NULL);
            pthread_mutex_lock(&a->mu);
            a->registered = 1;
            a->answered_ms = pcs_now_ms();
            pthread_mutex_unlock(&a->mu);
            backoff = 100;
            nap(a, interval);
            continue;
        }
        if (atomic_load(&a->leaving))
            break; /* deregistered (or about to be): a GONE answer is the expected one */
        pthread_mutex_lock(&a->mu);
        a->hb_failures++;
        if (code == GRPC_NOT_FOUND || code == GRPC_FAILED_PRECONDITION ||
            code == GRPC_UNAUTHENTICATED)
            a->registered = 0; /* until the Register below is answered */
        pthread_mutex_unlock(&a->mu);
        if (code == GRPC_NOT_FOUND || code == GRPC_FAILED_PRECONDITION ||
            code == GRPC_UNAUTHENTICATED) {
            /* The coordinator restarted without our id or our secret, or declared us LOST:
             * register again with the same identity and re-open the assignment stream. The
             * running job continues. */
            PCS_WARN(PCS_SUB_WORKER, "heartbeat rejected (%s); re-registering", pcs_last_error());
            if (do_register(a) == PCS_OK)
                atomic_store(&a->reopen_watch, 1);
        } else {
            PCS_DEBUG(PCS_SUB_WORKER, "heartbeat failed: %s", pcs_last_error());
        }
        nap(a, backoff < interval ? backoff : interval);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    return NULL;
}

// ---- assignment watch thread ----

static void handle_event(pcs_agent_t *a, Pcs__V1__AssignmentEvent *ev)
{
    if (ev->event_case == PCS__V1__ASSIGNMENT_EVENT__EVENT_ASSIGNMENT && ev->assignment) {
        Pcs__V1__Assignment *as = ev->assignment;
        pthread_mutex_lock(&a->mu);
        int running_same = a->job_id[0] && as->job_id && strcmp(as->job_id, a->job_id) == 0 &&
                           as->generation == a->generation;
        if (running_same) {
            /* Re-delivered after a reconnect: we are already running it. */
            pthread_mutex_unlock(&a->mu);
            return;
        }
        int ran_it = as->job_id && strcmp(as->job_id, a->done_job) == 0 &&
                     as->generation == a->done_generation;
        if (ran_it) {
            /* A coordinator that restarted while this job ended here hands its rank back; its
             * final reports are queued (or sent), which ends the job there. Running it again
             * would redo the work and overwrite its checkpoint. */
            pthread_mutex_unlock(&a->mu);
            PCS_INFO(PCS_SUB_WORKER,
                     "assignment: job %s generation %llu already ran to its end here: ignored",
                     as->job_id, (unsigned long long)as->generation);
            return;
        }
        if (a->pending)
            protobuf_c_message_free_unpacked(&a->pending->base, NULL);
        a->pending = as;
        ev->assignment = NULL; /* ownership moved (freed with free_unpacked of the pending) */
        ev->event_case = PCS__V1__ASSIGNMENT_EVENT__EVENT__NOT_SET;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        PCS_INFO(PCS_SUB_WORKER, "assignment: job %s generation %llu rank %u of %u", as->job_id,
                 (unsigned long long)as->generation, as->rank, as->world_size);
    } else if (ev->event_case == PCS__V1__ASSIGNMENT_EVENT__EVENT_DIRECTIVE && ev->directive) {
        Pcs__V1__Directive *d = ev->directive;
        const char *kind =
            d->kind == PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART ? "RESTART" : "STOP";
        char reason[512];
        snprintf(reason, sizeof reason, "%s directive from coordinator: %s", kind,
                 d->reason && d->reason[0] ? d->reason : "(no reason)");
        int restart = d->kind == PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART;
        pthread_mutex_lock(&a->mu);
        if (a->pending && d->job_id && strcmp(a->pending->job_id, d->job_id) == 0 &&
            (!d->generation || a->pending->generation <= d->generation)) {
            protobuf_c_message_free_unpacked(&a->pending->base, NULL);
            a->pending = NULL;
        }
        if (restart && d->job_id && strcmp(d->job_id, a->job_id) == 0 &&
            (!d->generation || d->generation == a->generation))
            a->restarting = 1; /* this run ends, the job goes on: not one of max_jobs */
        pthread_mutex_unlock(&a->mu);
        abort_running_gen(a, d->job_id, d->generation, reason);
    }
}

/* The stream owns the unpacked message: an Assignment moved out of it must not be freed with it.
 * protobuf-c frees a oneof member only when the case is set, so clearing the case is enough. */
static void *watch_main(void *arg)
{
    pcs_agent_t *a = arg;
    pcs_thread_name("pcs-watch");
    uint32_t backoff = 100;
    while (!atomic_load(&a->quit) && !atomic_load(&a->leaving)) {
        char wid[64];
        copy_worker_id(a, wid, sizeof wid);
        Pcs__V1__WatchAssignmentRequest req = PCS__V1__WATCH_ASSIGNMENT_REQUEST__INIT;
        req.worker_id = wid;
        pcs_rpc_stream_t *s = NULL;
        atomic_store(&a->reopen_watch, 0);
        pcs_status_t st = pcs_rpc_stream_open(a->rpc, PCS_M_WATCH_ASSIGNMENT, &req.base, &s);
        while (st == PCS_OK && !atomic_load(&a->quit) && !atomic_load(&a->reopen_watch)) {
            if (atomic_load(&a->stop))
                abort_running(a, NULL, "worker is shutting down");
            ProtobufCMessage *msg = NULL;
            st = pcs_rpc_stream_next(s, &pcs__v1__assignment_event__descriptor, 200, &msg);
            if (st == PCS_ERR_TIMEOUT) {
                st = PCS_OK;
                continue;
            }
            if (st != PCS_OK)
                break;
            if (!msg) { /* clean end of stream: the coordinator is going away */
                st = PCS_ERR_REMOTE;
                break;
            }
            backoff = 100;
            handle_event(a, (Pcs__V1__AssignmentEvent *)msg);
            protobuf_c_message_free_unpacked(msg, NULL);
        }
        if (s)
            pcs_rpc_stream_close(s);
        if (atomic_load(&a->quit))
            break;
        if (st != PCS_OK)
            PCS_DEBUG(PCS_SUB_WORKER, "assignment stream broke (%s); re-opening in %u ms",
                      pcs_last_error(), backoff);
        if (atomic_load(&a->stop))
            abort_running(a, NULL, "worker is shutting down");
        nap(a, backoff);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    return NULL;
}

// ---- reporter thread ----

/* The report goes out under the worker's current id: a coordinator that lost its store hands a
 * re-registering worker a new one. */
static void refresh_worker_id(pcs_agent_t *a, Pcs__V1__ReportStepRequest *req)
{
    char wid[64];
    copy_worker_id(a, wid, sizeof wid);
    if (req->worker_id && strcmp(req->worker_id, wid) == 0)
        return;
    char *copy = strdup(wid); /* protobuf-c's default allocator is malloc/free */
    if (!copy)
        return;
    free(req->worker_id);
    req->worker_id = copy;
}

static int report_give_up(pcs_agent_t *a)
{
    if (atomic_load(&a->quit))
        return 1;
    pthread_mutex_lock(&a->mu);
    uint64_t at = a->rq_give_up_ms;
    pthread_mutex_unlock(&a->mu);
    return at && pcs_now_ms() >= at;
}

/* Deliver one report. While the coordinator is unreachable (UNAVAILABLE, DEADLINE_EXCEEDED: a
 * restart, a pause, a rescheduled pod) it is retried every <= 1 s for as long as it takes: the
 * final report decides whether a job that finished during an outage is SUCCEEDED, and progress
 * reports merge behind it (enqueue_report), so waiting costs no memory. It gives up only when the
 * agent quits or the exit flush deadline passes. A coordinator that does not know this worker
 * (NOT_FOUND) or holds it GONE/LOST (FAILED_PRECONDITION: restored from its store, or its lease
 * ran out during a pause) gets a Register from the same identity and the report again, which is
 * how a restored RUNNING job takes this rank back. Any other refusal drops the report. */
static void send_report(pcs_agent_t *a, report_item_t *it)
{
    uint32_t backoff = 100;
    int reregistered = 0, said = 0;
    uint64_t since = 0;
    for (;;) {
        refresh_worker_id(a, it->req);
        ProtobufCMessage *resp = NULL;
        int code = 0;
        pcs_status_t st = pcs_rpc_call(a->rpc, PCS_M_REPORT_STEP, &it->req->base,
                                       &pcs__v1__report_step_response__descriptor,
                                       (int)a->rpc_timeout_ms, &resp, &code);
        if (st == PCS_OK) {
            Pcs__V1__ReportStepResponse *r = (Pcs__V1__ReportStepResponse *)resp;
            if (r->directive && r->directive->kind == PCS__V1__DIRECTIVE_KIND__DIRECTIVE_KIND_RESTART) {
                pthread_mutex_lock(&a->mu);
                if (it->req->job_id && strcmp(it->req->job_id, a->job_id) == 0 &&
                    it->req->generation == a->generation)
                    a->restarting = 1;
                pthread_mutex_unlock(&a->mu);
            }
            if (r->directive && r->directive->kind != 0) {
                char reason[512];
                snprintf(reason, sizeof reason, "directive in ReportStep reply: %s",
                         r->directive->reason ? r->directive->reason : "");
                abort_running_gen(a, it->req->job_id, it->req->generation, reason);
            }
            protobuf_c_message_free_unpacked(resp, NULL);
            pthread_mutex_lock(&a->mu);
            a->reports_sent++;
            a->answered_ms = pcs_now_ms();
            pthread_mutex_unlock(&a->mu);
            if (said)
                PCS_INFO(PCS_SUB_WORKER, "coordinator back: step %llu report delivered after %llu ms",
                         (unsigned long long)(it->req->report ? it->req->report->step : 0),
                         (unsigned long long)(pcs_now_ms() - since));
            return;
        }
        uint64_t step = it->req->report ? it->req->report->step : 0;
        if ((code == GRPC_NOT_FOUND || code == GRPC_FAILED_PRECONDITION ||
             code == GRPC_UNAUTHENTICATED) &&
            reregistered < REPORT_MAX_REREGISTER && !atomic_load(&a->leaving)) {
            reregistered++;
            PCS_INFO(PCS_SUB_WORKER, "ReportStep for step %llu refused (%s): re-registering",
                     (unsigned long long)step, pcs_last_error());
            if (do_register(a) == PCS_OK) {
                atomic_store(&a->reopen_watch, 1);
                continue;
            }
            /* not reachable now: wait below like any other outage */
        } else if (st != PCS_ERR_REMOTE && st != PCS_ERR_TIMEOUT) {
            PCS_WARN(PCS_SUB_WORKER, "ReportStep for step %llu dropped: %s",
                     (unsigned long long)step, pcs_last_error());
            return;
        }
        if (!since)
            since = pcs_now_ms();
        if (report_give_up(a)) {
            PCS_WARN(PCS_SUB_WORKER, "%sReportStep for step %llu undeliverable after %llu ms: %s",
                     it->final ? "final " : "", (unsigned long long)step,
                     (unsigned long long)(pcs_now_ms() - since), pcs_last_error());
            return;
        }
        if (!said && pcs_now_ms() - since >= 2000) {
            said = 1;
            PCS_WARN(PCS_SUB_WORKER,
                     "coordinator unreachable (%s): step reports wait until it is back",
                     pcs_last_error());
        }
        nap(a, backoff);
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
}

static void *report_main(void *arg)
{
    pcs_agent_t *a = arg;
    pcs_thread_name("pcs-report");
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->rq_head && !atomic_load(&a->quit)) {
            struct timespec ts;
            abs_deadline(&ts, 200);
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
        }
        if (!a->rq_head)
            break; /* quit with an empty queue */
        report_item_t *it = a->rq_head;
        a->rq_head = it->next;
        if (!a->rq_head)
            a->rq_tail = NULL;
        a->rq_len--;
        a->rq_busy = 1;
        pthread_mutex_unlock(&a->mu);

        if (report_give_up(a))
            PCS_WARN(PCS_SUB_WORKER, "ReportStep for step %llu not sent: worker exiting",
                     (unsigned long long)(it->req->report ? it->req->report->step : 0));
        else
            send_report(a, it);
        protobuf_c_message_free_unpacked(&it->req->base, NULL);
        free(it);
        pthread_mutex_lock(&a->mu);
        a->rq_busy = 0;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* `older` (queued, not sent) is superseded by `newer`: newer keeps its own step, loss and
 * fingerprint; the per-step byte counts add up and a failed audit stays failed. */
static void merge_progress(const Pcs__V1__StepReport *older, Pcs__V1__StepReport *newer)
{
    newer->all_gather_bytes += older->all_gather_bytes;
    newer->reduce_scatter_bytes += older->reduce_scatter_bytes;
    newer->all_reduce_bytes += older->all_reduce_bytes;
    newer->audit_ok = newer->audit_ok && older->audit_ok;
}

/* Enqueue a deep copy (pack + unpack) of the report: the training thread never waits on the
 * network. */
static void enqueue_report(pcs_agent_t *a, const Pcs__V1__StepReport *rep)
{
    char wid[64], job[64];
    Pcs__V1__ReportStepRequest req = PCS__V1__REPORT_STEP_REQUEST__INIT;
    pthread_mutex_lock(&a->mu);
    snprintf(wid, sizeof wid, "%s", a->worker_id);
    snprintf(job, sizeof job, "%s", a->job_id);
    req.generation = a->generation;
    req.rank = a->rank;
    if (rep->step > a->last_step)
        a->last_step = rep->step;
    a->last_loss = rep->loss;
    a->last_step_ms = rep->step_ms;
    a->ag_bytes += rep->all_gather_bytes;
    a->rs_bytes += rep->reduce_scatter_bytes;
    a->ar_bytes += rep->all_reduce_bytes;
    pthread_mutex_unlock(&a->mu);
    req.worker_id = wid;
    req.job_id = job;
    req.report = (Pcs__V1__StepReport *)rep;
    /* The coordinator refuses strings that are not UTF-8 (proto3); error text can quote bytes of
     * any origin (file names, strerror in another locale), so send it with those bytes as '?'. */
    Pcs__V1__StepReport clean;
    char *clean_err = NULL;
    if (rep->error && !pcs_utf8_valid(rep->error, strlen(rep->error)) &&
        (clean_err = strdup(rep->error)) != NULL) {
        pcs_utf8_sanitize(clean_err);
        clean = *rep;
        clean.error = clean_err;
        req.report = &clean;
        rep = &clean;
    }
    size_t n = pcs__v1__report_step_request__get_packed_size(&req);
    uint8_t *buf = malloc(n ? n : 1);
    report_item_t *it = calloc(1, sizeof *it);
    if (!buf || !it) {
        free(buf);
        free(it);
        free(clean_err);
        PCS_WARN(PCS_SUB_WORKER, "out of memory queueing a step report");
        return;
    }
    pcs__v1__report_step_request__pack(&req, buf);
    if (a->report_file && pcs_report_file_append(a->report_file, rep) != PCS_OK)
        PCS_WARN(PCS_SUB_WORKER, "report file: %s", pcs_last_error()); /* the local copy only */
    it->req = pcs__v1__report_step_request__unpack(NULL, n, buf);
    free(buf);
    int done_ok = rep->done && !(rep->error && rep->error[0]); /* rep may point at clean_err */
    int final = rep->done || (rep->error && rep->error[0]);
    free(clean_err);
    if (!it->req) {
        free(it);
        PCS_WARN(PCS_SUB_WORKER, "could not copy a step report");
        return;
    }
    it->final = final;
    pthread_mutex_lock(&a->mu);
    report_item_t *tail = a->rq_tail;
    if (!it->final && tail && !tail->final && a->rq_len >= REPORT_MERGE_AT && tail->req->report &&
        it->req->report && it->req->generation == tail->req->generation &&
        strcmp(it->req->job_id, tail->req->job_id) == 0) {
        /* the reporter is stuck on an older report: the tail is superseded (swap the reports,
         * free the older one with the new item's shell) */
        merge_progress(tail->req->report, it->req->report);
        Pcs__V1__StepReport *older = tail->req->report;
        tail->req->report = it->req->report;
        it->req->report = older;
        pthread_mutex_unlock(&a->mu);
        protobuf_c_message_free_unpacked(&it->req->base, NULL);
        free(it);
        return;
    }
    if (tail)
        tail->next = it;
    else
        a->rq_head = it;
    a->rq_tail = it;
    a->rq_len++;
    if (done_ok)
        a->finished = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static void report_cb(void *ctx, const Pcs__V1__StepReport *rep)
{
    enqueue_report(ctx, rep);
}

void pcs_agent_stats(pcs_agent_t *a, pcs_agent_stats_t *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&a->mu);
    uint64_t now = pcs_now_ms(); /* under mu: never before a time a thread just stored */
    o->registered = a->registered;
    o->heartbeat_age_ms = a->answered_ms ? now - a->answered_ms : UINT64_MAX;
    o->loop_age_ms = now - a->loop_ms;
    o->heartbeat_failures = a->hb_failures;
    o->registrations = a->registrations;
    o->jobs_succeeded = a->jobs_ok;
    o->jobs_failed = a->jobs_failed;
    o->jobs_stopped = a->jobs_stopped;
    o->reports_sent = a->reports_sent;
    o->reports_queued = a->rq_len + (size_t)a->rq_busy;
    o->all_gather_bytes = a->ag_bytes;
    o->reduce_scatter_bytes = a->rs_bytes;
    o->all_reduce_bytes = a->ar_bytes;
    snprintf(o->worker_id, sizeof o->worker_id, "%s", a->worker_id);
    snprintf(o->identity, sizeof o->identity, "%s", a->identity);
    snprintf(o->backend, sizeof o->backend, "%s", a->backend);
    snprintf(o->job_id, sizeof o->job_id, "%s", a->job_id);
    if (a->job_id[0]) {
        o->rank = a->rank;
        o->generation = a->generation;
        o->step = a->last_step;
        o->loss = a->last_loss;
        o->step_ms = a->last_step_ms;
    }
    pthread_mutex_unlock(&a->mu);
    o->leaving = atomic_load(&a->leaving) || atomic_load(&a->stop);
}

void pcs_agent_report(pcs_agent_t *a, const Pcs__V1__StepReport *r)
{
    enqueue_report(a, r);
}

void pcs_agent_set_abort(pcs_agent_t *a, void (*fn)(void *ctx, const char *reason), void *ctx)
{
    pthread_mutex_lock(&a->mu);
    a->abort_fn = fn;
    a->abort_ctx = ctx;
    int stopping = atomic_load(&a->stop);
    char pending[512] = "";
    if (a->abort_pending)
        snprintf(pending, sizeof pending, "%s", a->abort_reason);
    pthread_mutex_unlock(&a->mu);
    if (fn && stopping)
        fn(ctx, "worker is shutting down");
    else if (fn && pending[0])
        fn(ctx, pending);
}

/* Wait until the report queue is empty, at most max_ms. At exit (`last`), the reporter stops
 * retrying at that deadline too, so a coordinator that stays away cannot hold the process. */
static void flush_reports(pcs_agent_t *a, uint32_t max_ms, int last)
{
    uint64_t end = pcs_now_ms() + max_ms;
    pthread_mutex_lock(&a->mu);
    if (last)
        a->rq_give_up_ms = end;
    while ((a->rq_head || a->rq_busy) && pcs_now_ms() < end) {
        struct timespec ts;
        abs_deadline(&ts, 50);
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    pthread_mutex_unlock(&a->mu);
}

// ---- job ----

/* The job failed here; blamed >= 0: the peer (global rank) the failure is blamed on. */
static void report_error(pcs_agent_t *a, uint64_t step, const char *msg, int blamed,
                         pcs_coll_fault_t fault)
{
    Pcs__V1__StepReport rep = PCS__V1__STEP_REPORT__INIT;
    rep.step = step;
    rep.error = (char *)msg;
    if (blamed >= 0 && fault != PCS_COLL_FAULT_NONE) {
        rep.peer_fault = (Pcs__V1__PeerFault)fault;
        rep.peer_rank = (uint32_t)blamed;
    }
    enqueue_report(a, &rep);
}

static void run_job(pcs_agent_t *a, Pcs__V1__Assignment *as)
{
    char role[16];
    snprintf(role, sizeof role, "w%u", as->rank);
    pcs_log_set_role(role);
    pcs_log_set_job(as->job_id, (int)as->rank);
    pthread_mutex_lock(&a->mu);
    snprintf(a->job_id, sizeof a->job_id, "%s", as->job_id ? as->job_id : "");
    a->generation = as->generation;
    a->rank = as->rank;
    a->last_step = 0;
    a->finished = 0;
    a->abort_pending = 0;
    pthread_mutex_unlock(&a->mu);

    if (a->report_dir) {
        char path[1024];
        pcs_report_file_path(a->report_dir, as->job_id, as->rank, path, sizeof path);
        a->report_file = fopen(path, "wb");
        if (!a->report_file)
            PCS_WARN(PCS_SUB_WORKER, "cannot write reports to %s", path);
    }
    pcs_kv_t *kv = NULL;
    pcs_train_t *t = NULL;
    pcs_train_result_t res;
    memset(&res, 0, sizeof res);
    uint64_t t0 = pcs_now_ms();
    pcs_status_t st =
        pcs_kv_coord_create_on(a->rpc, as->job_id, as->generation, (int)a->rpc_timeout_ms, &kv);
    if (st == PCS_OK && a->job_fn) {
        st = a->job_fn(a->job_ctx, a, as, kv);
        pthread_mutex_lock(&a->mu);
        a->abort_fn = NULL;
        pthread_mutex_unlock(&a->mu);
    } else if (st == PCS_OK) {
        pcs_train_config_t tc;
        memset(&tc, 0, sizeof tc);
        tc.assignment = as;
        tc.kv = kv;
        tc.backend = a->backend;
        tc.coll = a->coll;
        tc.device = a->device;
        tc.hostname = a->hostname;
        tc.coll_timeout_ms = a->coll_timeout_ms;
        tc.report = report_cb;
        tc.report_ctx = a;
        tc.inject_inf_step = a->inject_inf_step;
        tc.inject_inf_rank = a->inject_inf_rank;
        tc.die_at_checkpoint = a->die_at_checkpoint;
        tc.die_rank = a->die_rank;
        tc.step_pause_ms = a->step_pause_ms;
        tc.blas_threads = a->blas_threads;
        tc.prefetch = -1;
        tc.data_root = a->roots[0];
        tc.init_root = a->roots[1];
        tc.checkpoint_root = a->roots[2];
        st = pcs_train_create(&tc, &t);
    }
    if (st == PCS_OK && t) {
        pthread_mutex_lock(&a->mu);
        a->train = t;
        int stopping = atomic_load(&a->stop);
        char pending[512] = "";
        if (a->abort_pending)
            snprintf(pending, sizeof pending, "%s", a->abort_reason);
        pthread_mutex_unlock(&a->mu);
        if (stopping)
            pcs_train_abort(t, "worker is shutting down");
        else if (pending[0])
            pcs_train_abort(t, pending); /* stopped while it was being set up */
        st = pcs_train_run(t, &res);
    }
    if (st != PCS_OK && st != PCS_ERR_CANCELLED) {
        pthread_mutex_lock(&a->mu);
        if (a->abort_pending) /* stopped during set-up: its KV or rendezvous failed for that */
            st = pcs_set_error(PCS_ERR_CANCELLED, "%s", a->abort_reason);
        pthread_mutex_unlock(&a->mu);
    }
    if (st != PCS_OK && st != PCS_ERR_CANCELLED) {
        char msg[1024];
        snprintf(msg, sizeof msg, "rank %u: %s", as->rank, pcs_last_error());
        pcs_utf8_trim_partial(msg); /* the coordinator refuses a report that is not UTF-8 */
        PCS_WARN(PCS_SUB_WORKER, "job %s failed: %s", as->job_id, msg);
        uint64_t step;
        pthread_mutex_lock(&a->mu);
        step = a->last_step + 1;
        pthread_mutex_unlock(&a->mu);
        pcs_coll_fault_t fault;
        int blamed = pcs_train_blame(t, &fault);
        report_error(a, step, msg, blamed, fault);
    } else if (st == PCS_OK) {
        PCS_INFO(PCS_SUB_WORKER, "job %s finished: %llu steps in %.1f s, last loss %.6g",
                 as->job_id, (unsigned long long)(t ? res.steps : a->last_step),
                 (double)(pcs_now_ms() - t0) / 1e3, res.last_loss);
    }
    /* the rest goes on in the background; a worker asked to stop leaves after the final flush,
     * whose budget (--report-flush-ms) bounds this one too */
    uint32_t job_flush = atomic_load(&a->stop) && a->flush_ms < 10000 ? a->flush_ms : 10000;
    flush_reports(a, job_flush, 0);
    pthread_mutex_lock(&a->mu);
    if (st == PCS_OK)
        a->jobs_ok++;
    else if (st == PCS_ERR_CANCELLED)
        a->jobs_stopped++;
    else
        a->jobs_failed++;
    a->train = NULL;
    a->finished = 0;
    if (st != PCS_ERR_CANCELLED) { /* a stopped job may be assigned again (RESTART) */
        snprintf(a->done_job, sizeof a->done_job, "%s", a->job_id);
        a->done_generation = a->generation;
    }
    a->job_id[0] = 0;
    a->generation = 0;
    pthread_mutex_unlock(&a->mu);
    pcs_log_set_job(NULL, -1);
    pcs_train_destroy(t);
    pcs_kv_destroy(kv);
    if (a->report_file) {
        fclose(a->report_file);
        a->report_file = NULL;
    }
    pcs_log_set_role("w-");
}

// ---- public ----

int pcs_agent_device(const pcs_agent_t *a)
{
    return a ? a->device : 0;
}

/* Check the offered backends now, so a misconfigured pod fails at start with a message instead of
 * registering and failing every job; pick the device (-1: $LOCAL_RANK modulo the count, else 0). */
static pcs_status_t resolve_device(pcs_agent_t *a, int device)
{
    if (strcmp(a->coll, "auto") != 0 && strcmp(a->coll, "nccl") != 0 &&
        strcmp(a->coll, "gloo") != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "coll: must be auto, nccl or gloo, got '%s'",
                             a->coll);
    const pcs_backend_ops_t *be = NULL;
    PCS_CHECK(pcs_backend_get(a->backend, &be));
    if (strcmp(be->name, "cuda") != 0) {
        if (strcmp(a->coll, "nccl") == 0)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "coll: nccl needs --backend cuda (NCCL reduces device buffers)");
        a->device = 0;
        return PCS_OK;
    }
    int n = be->device_count();
    if (device < 0) {
        const char *lr = getenv("LOCAL_RANK");
        long v = lr && *lr ? strtol(lr, NULL, 10) : 0;
        device = n > 0 && v >= 0 ? (int)(v % n) : 0;
    }
    if (device >= n)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "device: %d out of range (%d cuda devices visible)", device, n);
    a->device = device;
    return PCS_OK;
}

pcs_status_t pcs_agent_create(const pcs_agent_config_t *cfg, pcs_agent_t **out)
{
    if (!cfg || !out || !cfg->coordinator || !cfg->coordinator[0])
        return pcs_set_error(PCS_ERR_INVALID_ARG, "agent: coordinator address required");
    *out = NULL;
    pcs_agent_t *a = NULL;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *a, (void **)&a));
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->loop_ms = pcs_now_ms();
    char ident[300];
    if (cfg->identity && cfg->identity[0]) {
        snprintf(ident, sizeof ident, "%s", cfg->identity);
    } else {
        char host[256] = "localhost";
        gethostname(host, sizeof host - 1);
        snprintf(ident, sizeof ident, "%s:%d", host, (int)getpid());
    }
    PCS_CHECK_GOTO(pcs_strdup(cfg->coordinator, &a->coordinator), st, fail);
    PCS_CHECK_GOTO(pcs_strdup(ident, &a->identity), st, fail);
    PCS_CHECK_GOTO(pcs_strdup(cfg->backend ? cfg->backend : "cpu", &a->backend), st, fail);
    PCS_CHECK_GOTO(pcs_strdup(cfg->coll && cfg->coll[0] ? cfg->coll : "auto", &a->coll), st, fail);
    PCS_CHECK_GOTO(resolve_device(a, cfg->device), st, fail);
    PCS_CHECK_GOTO(pcs_strdup(cfg->hostname ? cfg->hostname : "127.0.0.1", &a->hostname), st, fail);
    {
        const char *prog = cfg->program ? cfg->program : cfg->job_fn ? "" : "pcs-worker";
        if (*prog && !pcs_is_name_token(prog, PCS_PROGRAM_NAME_MAX)) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "program: must be at most %d characters of [A-Za-z0-9._-]",
                               PCS_PROGRAM_NAME_MAX);
            goto fail;
        }
        PCS_CHECK_GOTO(pcs_strdup(prog, &a->program), st, fail);
    }
    if (cfg->report_dir && cfg->report_dir[0])
        PCS_CHECK_GOTO(pcs_strdup(cfg->report_dir, &a->report_dir), st, fail);
    {
        const char *base = cfg->root && cfg->root[0] ? cfg->root : ".";
        const char *given[3] = {cfg->data_root, cfg->init_root, cfg->checkpoint_root};
        static const char *const what[3] = {"data root", "init root", "checkpoint root"};
        for (int i = 0; i < 3; i++) {
            const char *dir = given[i] && given[i][0] ? given[i] : base;
            PCS_CHECK_GOTO(pcs_root_open(dir, what[i], &a->roots[i]), st, fail);
            PCS_INFO(PCS_SUB_WORKER, "%s: %s", what[i], pcs_root_path(a->roots[i]));
        }
    }
    a->rpc_timeout_ms = cfg->rpc_timeout_ms ? cfg->rpc_timeout_ms : 5000;
    a->coll_timeout_ms = cfg->coll_timeout_ms ? cfg->coll_timeout_ms : 30000;
    a->heartbeat_ms = cfg->heartbeat_ms;
    a->max_jobs = cfg->max_jobs;
    if (getrandom(&a->incarnation, sizeof a->incarnation, 0) != (ssize_t)sizeof a->incarnation)
        a->incarnation = pcs_now_us() ^ ((uint64_t)getpid() << 32); /* no entropy source */
    if (!a->incarnation)
        a->incarnation = 1;
    a->flush_ms = cfg->flush_ms ? cfg->flush_ms : 30000;
    a->inject_inf_step = cfg->inject_inf_step;
    a->inject_inf_rank = cfg->inject_inf_rank;
    a->die_at_checkpoint = cfg->die_at_checkpoint;
    a->die_rank = cfg->die_rank;
    a->step_pause_ms = cfg->step_pause_ms;
    a->blas_threads = cfg->blas_threads;
    a->job_fn = cfg->job_fn;
    a->job_ctx = cfg->job_ctx;
    pcs_rpc_client_options_t ro = {.reconnect_max_ms = cfg->reconnect_max_ms};
    PCS_CHECK_GOTO(pcs_rpc_client_create_with(a->coordinator, &ro, &a->rpc), st, fail);
    *out = a;
    return PCS_OK;
fail:
    pcs_agent_destroy(a);
    return st;
}

void pcs_agent_stop(pcs_agent_t *a)
{
    if (a)
        atomic_store(&a->stop, 1);
}

pcs_status_t pcs_agent_run(pcs_agent_t *a)
{
    uint32_t backoff = 100;
    int held_said = 0;
    pcs_status_t st;
    for (;;) {
        if (atomic_load(&a->stop))
            return PCS_OK;
        pthread_mutex_lock(&a->mu);
        a->loop_ms = pcs_now_ms();
        pthread_mutex_unlock(&a->mu);
        st = do_register(a);
        if (st == PCS_OK)
            break;
        if (st == PCS_ERR_STATE) {
            /* our identity is still held by the registration of an earlier process (this one
             * restarted within its lease): it is ours once that lease lapses */
            if (!held_said++)
                PCS_WARN(PCS_SUB_WORKER, "Register with %s: %s; retrying", a->coordinator,
                         pcs_last_error());
        } else if (st != PCS_ERR_REMOTE && st != PCS_ERR_TIMEOUT) {
            PCS_WARN(PCS_SUB_WORKER, "Register with %s failed: %s", a->coordinator,
                     pcs_last_error());
            return st;
        } else {
            PCS_INFO(PCS_SUB_WORKER, "coordinator %s not reachable yet (%s): retrying in %u ms",
                     a->coordinator, pcs_last_error(), backoff);
        }
        nap_until(a, backoff, 1);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    if (pthread_create(&a->hb_thread, NULL, heartbeat_main, a) == 0)
        a->threads_started |= 1;
    if (pthread_create(&a->watch_thread, NULL, watch_main, a) == 0)
        a->threads_started |= 2;
    if (pthread_create(&a->report_thread, NULL, report_main, a) == 0)
        a->threads_started |= 4;
    if (a->threads_started != 7) {
        /* The threads that did start end on quit and are joined in destroy (they use `a`). */
        atomic_store(&a->quit, 1);
        return pcs_set_error(PCS_ERR_SYSTEM, "agent: cannot start its threads");
    }

    uint32_t jobs = 0;
    while (!atomic_load(&a->stop) && (a->max_jobs == 0 || jobs < a->max_jobs)) {
        pthread_mutex_lock(&a->mu);
        while (!a->pending && !atomic_load(&a->stop)) {
            struct timespec ts;
            abs_deadline(&ts, 200);
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
        }
        Pcs__V1__Assignment *as = a->pending;
        a->pending = NULL;
        pthread_mutex_unlock(&a->mu);
        if (!as)
            continue;
        pthread_mutex_lock(&a->mu);
        a->restarting = 0;
        pthread_mutex_unlock(&a->mu);
        run_job(a, as);
        protobuf_c_message_free_unpacked(&as->base, NULL);
        pthread_mutex_lock(&a->mu);
        int restarted = a->restarting;
        pthread_mutex_unlock(&a->mu);
        if (!restarted) /* a generation that restarts is the same job going on */
            jobs++;
    }

    flush_reports(a, a->flush_ms, 1);
    /* From here on nothing registers again: the Deregister below makes this worker GONE, and a
     * heartbeat or report answered "re-register" must not bring it back as a phantom IDLE
     * worker that the next job would be gang-started on. */
    atomic_store(&a->leaving, 1);
    char wid[64];
    copy_worker_id(a, wid, sizeof wid);
    Pcs__V1__DeregisterRequest dreq = PCS__V1__DEREGISTER_REQUEST__INIT;
    dreq.worker_id = wid;
    dreq.reason =
        (char *)(atomic_load(&a->stop) ? "worker stopped by signal" : "job limit reached");
    ProtobufCMessage *resp = NULL;
    if (pcs_rpc_call(a->rpc, PCS_M_DEREGISTER, &dreq.base,
                     &pcs__v1__deregister_response__descriptor, (int)a->rpc_timeout_ms, &resp,
                     NULL) == PCS_OK) {
        protobuf_c_message_free_unpacked(resp, NULL);
        PCS_INFO(PCS_SUB_WORKER, "deregistered %s", wid);
    } else {
        PCS_DEBUG(PCS_SUB_WORKER, "Deregister failed: %s", pcs_last_error());
    }
    return PCS_OK;
}

void pcs_agent_destroy(pcs_agent_t *a)
{
    if (!a)
        return;
    atomic_store(&a->quit, 1);
    if (a->threads_started) {
        pthread_mutex_lock(&a->mu);
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        if (a->threads_started & 1)
            pthread_join(a->hb_thread, NULL);
        if (a->threads_started & 2)
            pthread_join(a->watch_thread, NULL);
        if (a->threads_started & 4)
            pthread_join(a->report_thread, NULL);
    }
    while (a->rq_head) {
        report_item_t *it = a->rq_head;
        a->rq_head = it->next;
        protobuf_c_message_free_unpacked(&it->req->base, NULL);
        free(it);
    }
    if (a->pending)
        protobuf_c_message_free_unpacked(&a->pending->base, NULL);
    pcs_rpc_client_destroy(a->rpc);
    free(a->coordinator);
    free(a->identity);
    free(a->backend);
    free(a->coll);
    free(a->hostname);
    free(a->program);
    free(a->report_dir);
    for (int i = 0; i < 3; i++)
        pcs_root_close(a->roots[i]);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
