/* pcsctl status [--full] [--watch [--interval-ms N]] [JOB]: without JOB a coordinator summary
 * (GetStatus counts; --full adds the coordinator's INFO-style sections); with JOB the details of
 * that job (GetJob): state, progress, restarts, workers by rank. --watch redraws every interval
 * (a terminal is cleared first; a pipe gets a dated separator), rides out a coordinator that is
 * away, and with a JOB ends when the job does: exit 0 iff it SUCCEEDED. */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pcs/clock.h"

static const pcs_cli_opt_t status_opts[] = {
    {"full", NULL, "add the coordinator's INFO-style sections (workers, jobs, config)"},
    {"watch", NULL,
     "redraw until interrupted; with JOB, until the job ends: exit 0 iff it SUCCEEDED, 1 if it "
     "failed, was cancelled or is unknown, 128+signal if interrupted"},
    {"interval-ms", "N", "--watch refresh period (default 2000)"},
};
const pcs_cli_spec_t pcs_cli_status_spec = {
    "status", "[JOB]", "coordinator summary, or the details of one job", NULL, status_opts, 3, 0,
    1};

static volatile sig_atomic_t g_interrupted; /* the signal that stopped --watch */

static void on_interrupt(int sig)
{
    g_interrupted = sig;
}

static void print_duration(uint64_t ms)
{
    uint64_t s = ms / 1000u;
    if (s >= 86400)
        printf("%" PRIu64 "d%" PRIu64 "h", s / 86400, (s % 86400) / 3600);
    else if (s >= 3600)
        printf("%" PRIu64 "h%" PRIu64 "m", s / 3600, (s % 3600) / 60);
    else if (s >= 60)
        printf("%" PRIu64 "m%" PRIu64 "s", s / 60, s % 60);
    else
        printf("%" PRIu64 ".%01" PRIu64 "s", s, (ms % 1000u) / 100u);
}

static int cluster_status(int full)
{
    Pcs__V1__GetStatusRequest req = PCS__V1__GET_STATUS_REQUEST__INIT;
    ProtobufCMessage *r = NULL;
    int rc = pcs_cli_query("status", PCS_M_GET_STATUS, &req.base,
                           &pcs__v1__get_status_response__descriptor, &r);
    if (rc != PCS_CLI_OK || !r)
        return rc;
    Pcs__V1__GetStatusResponse *s = (Pcs__V1__GetStatusResponse *)r;
    printf("coordinator  %s  version %s  up ", pcs_cli()->addr, *s->version ? s->version : "?");
    print_duration(s->uptime_ms);
    printf("\nworkers      idle %u  assigned %u  stopping %u  lost %u\n", s->workers_idle,
           s->workers_assigned, s->workers_stopping, s->workers_lost);
    printf("jobs         pending %u  running %u  finished %u\n", s->jobs_pending, s->jobs_running,
           s->jobs_finished);
    if (full && s->text && *s->text) {
        size_t n = strlen(s->text);
        printf("\n%s%s", s->text, s->text[n - 1] == '\n' ? "" : "\n");
    }
    protobuf_c_message_free_unpacked(r, NULL);
    return PCS_CLI_OK;
}

static void print_job(const Pcs__V1__Job *j)
{
    char b1[64], b2[64];
    printf("job          %s\n", j->job_id);
    if (*j->name)
        printf("name         %s\n", j->name);
    printf("state        %s\n",
           pcs_cli_enum(&pcs__v1__job_state__descriptor, j->state, b1, sizeof b1));
    if (*j->reason)
        printf("reason       %s\n", j->reason);
    printf("world size   %u\n", j->world_size);
    printf("generation   %" PRIu64 "  restarts %u", j->generation, j->restarts);
    if (j->spec && j->spec->elastic && j->spec->elastic->max_restarts)
        printf(" of %u", j->spec->elastic->max_restarts);
    printf("\n");
    for (size_t i = 0; i < j->n_restart_log; i++) {
        const Pcs__V1__JobRestart *e = j->restart_log[i];
        printf("restart      generation %" PRIu64 " at step %" PRIu64 ", %s (%s): %u ranks -> ",
               e->generation, e->step, pcs_cli_time(e->at_ms, b1, sizeof b1),
               pcs_cli_age(e->at_ms, b2, sizeof b2), e->world_before);
        if (e->world_after)
            printf("%u", e->world_after);
        else
            printf("waiting for workers");
        printf("; %s\n", e->cause);
    }
    printf("created      %s (%s ago)\n", pcs_cli_time(j->created_ms, b1, sizeof b1),
           pcs_cli_age(j->created_ms, b2, sizeof b2));
    if (j->started_ms)
        printf("started      %s\n", pcs_cli_time(j->started_ms, b1, sizeof b1));
    if (j->finished_ms)
        printf("finished     %s\n", pcs_cli_time(j->finished_ms, b1, sizeof b1));
    if (j->plan_hash)
        printf("plan hash    %016" PRIx64 "\n", j->plan_hash);
    if (*j->request_id)
        printf("request id   %s\n", j->request_id);
    if (*j->owner)
        printf("owner        %s\n", j->owner);
    const Pcs__V1__JobProgress *p = j->progress;
    uint32_t steps = j->spec && j->spec->training ? j->spec->training->steps : 0;
    if (!p || (!p->reports && !p->step)) {
        printf("progress     -\n");
    } else {
        printf("progress     step %" PRIu64, p->step);
        if (steps)
            printf("/%u", steps);
        printf("  loss %.6g  step %.1f ms  audit %s", p->loss, p->step_ms,
               p->audit_ok ? "ok" : (p->reports ? "FAILED" : "-"));
        if (p->skipped_steps)
            printf("  skipped %" PRIu64, p->skipped_steps);
        if (p->loss_scale > 0)
            printf("  loss scale %g", p->loss_scale);
        if (p->eval_loss != 0)
            printf("  eval loss %.6g", p->eval_loss);
        printf("\n");
    }
    if (j->n_workers) {
        const char *hdr[] = {"RANK", "WORKER"};
        pcs_cli_table_t *t = pcs_cli_table_new(2, hdr);
        pcs_cli_table_right(t, 0);
        for (size_t i = 0; i < j->n_workers; i++) {
            pcs_cli_table_cell(t, "%zu", i);
            pcs_cli_table_cell(t, "%s", j->workers[i]);
        }
        printf("\n");
        pcs_cli_table_print(t, stdout);
        pcs_cli_table_free(t);
    }
}

/* GetJob and print it; *state: the job's state (0 when there was no answer). */
static int job_status(const char *id, int *state)
{
    *state = 0;
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    ProtobufCMessage *r = NULL;
    int rc = pcs_cli_call("status", PCS_M_GET_JOB, &req.base,
                          &pcs__v1__get_job_response__descriptor, &r);
    if (rc != PCS_CLI_OK)
        return rc;
    Pcs__V1__GetJobResponse *resp = (Pcs__V1__GetJobResponse *)r;
    if (resp->job)
        *state = resp->job->state;
    if (pcs_cli()->json)
        rc = pcs_cli_print_json(r);
    else if (!resp->job)
        rc = pcs_cli_fail("status: the coordinator answered without a job");
    else
        print_job(resp->job);
    protobuf_c_message_free_unpacked(r, NULL);
    return rc;
}

static int terminal(int state)
{
    return state == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
           state == PCS__V1__JOB_STATE__JOB_STATE_FAILED ||
           state == PCS__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

static int watch(const char *job, int full, uint32_t interval_ms)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int tty = isatty(STDOUT_FILENO);
    for (;;) {
        char when[64];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        if (tty)
            printf("\033[H\033[2J"); /* home, clear screen */
        printf("%s every %.1f s: pcsctl status%s%s   %s\n\n", tty ? "" : "---",
               interval_ms / 1e3, job ? " " : "", job ? job : "", when);
        fflush(stdout);
        int state = 0;
        int rc = job ? job_status(job, &state) : cluster_status(full);
        fflush(stdout);
        if (rc == PCS_CLI_OK && job && terminal(state))
            return state == PCS__V1__JOB_STATE__JOB_STATE_SUCCEEDED ? PCS_CLI_OK : PCS_CLI_FAIL;
        if (rc != PCS_CLI_OK && job && pcs_cli()->last_code == 5)
            return PCS_CLI_FAIL; /* NOT_FOUND: the coordinator answered and has no such job */
        /* a coordinator that is away (or answers late) is shown and retried */
        for (uint32_t t = 0; t < interval_ms && !g_interrupted; t += 50)
            pcs_sleep_ms(50);
        if (g_interrupted) /* watching a job: stopped is not "it succeeded" (128 + signal) */
            return job ? 128 + (int)g_interrupted : PCS_CLI_OK;
        if (!tty)
            printf("\n");
    }
}

int pcs_cli_status(int argc, char **argv)
{
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_status_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    const char *job = a.n_pos ? a.pos[0] : NULL;
    int full = a.val[0] != NULL;
    uint32_t interval = 2000;
    if (a.val[2] && pcs_cli_u32_opt(&pcs_cli_status_spec, "interval-ms", a.val[2], 100, 3600000,
                                    &interval) != PCS_CLI_OK)
        return PCS_CLI_USAGE;
    if (a.val[2] && !a.val[1])
        return pcs_cli_bad_value(&pcs_cli_status_spec, "--interval-ms: only with --watch");
    if (a.val[1])
        return watch(job, full, interval);
    int state;
    return job ? job_status(job, &state) : cluster_status(full);
}
