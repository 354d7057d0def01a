/* pcsctl status [--full] [JOB]: without JOB a coordinator summary (GetStatus counts; --full adds
 * the coordinator's INFO-style sections); with JOB the details of that job (GetJob): state,
 * progress, workers by rank. */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "pcsctl status [--full] [JOB]";

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

static int job_status(const char *id)
{
    Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    ProtobufCMessage *r = NULL;
    int rc = pcs_cli_call("status", PCS_M_GET_JOB, &req.base,
                          &pcs__v1__get_job_response__descriptor, &r);
    if (rc != PCS_CLI_OK)
        return rc;
    Pcs__V1__GetJobResponse *resp = (Pcs__V1__GetJobResponse *)r;
    if (pcs_cli()->json)
        rc = pcs_cli_print_json(r);
    else if (!resp->job)
        rc = pcs_cli_fail("status: the coordinator answered without a job");
    else
        print_job(resp->job);
    protobuf_c_message_free_unpacked(r, NULL);
    return rc;
}

int pcs_cli_status(int argc, char **argv)
{
    const char *job = NULL;
    int full = 0;
    for (int i = 1; i < argc; i++) {
        int g = pcs_cli_global_flag(argc, argv, &i);
        if (g < 0)
            return PCS_CLI_USAGE;
        if (g > 0)
            continue;
        if (!strcmp(argv[i], "--full")) {
            full = 1;
            continue;
        }
        if (argv[i][0] == '-')
            return pcs_cli_usage("status", usage, "unknown option '%s'", argv[i]);
        if (job)
            return pcs_cli_usage("status", usage, "one job at a time");
        job = argv[i];
    }
    return job ? job_status(job) : cluster_status(full);
}
