/* pcsctl jobs [--state S]: ListJobs as an aligned table, newest information per job on one line. */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <inttypes.h>
#include <string.h>

static const pcs_cli_opt_t jobs_opts[] = {
    {"state", "S", "only jobs in this state: pending, running, succeeded, failed, cancelled"},
};
const pcs_cli_spec_t pcs_cli_jobs_spec = {
    "jobs", "", "list jobs: state, world size, generation, step, loss, age, reason", NULL,
    jobs_opts, 1, 0, 0};

int pcs_cli_jobs(int argc, char **argv)
{
    Pcs__V1__ListJobsRequest req = PCS__V1__LIST_JOBS_REQUEST__INIT;
    int state = 0;
    int rc = pcs_cli_state_args(&pcs_cli_jobs_spec, argc, argv, &pcs__v1__job_state__descriptor,
                                &state);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    req.state = (Pcs__V1__JobState)state;
    ProtobufCMessage *r = NULL;
    rc = pcs_cli_query("jobs", PCS_M_LIST_JOBS, &req.base, &pcs__v1__list_jobs_response__descriptor,
                       &r);
    if (rc != PCS_CLI_OK || !r)
        return rc;
    Pcs__V1__ListJobsResponse *resp = (Pcs__V1__ListJobsResponse *)r;
    const char *hdr[] = {"JOB", "NAME", "STATE", "WORLD", "GEN", "STEP", "LOSS", "AGE", "REASON"};
    pcs_cli_table_t *t = pcs_cli_table_new(9, hdr);
    if (!t) {
        protobuf_c_message_free_unpacked(r, NULL);
        return pcs_cli_fail("out of memory");
    }
    for (int c = 3; c <= 7; c++)
        pcs_cli_table_right(t, c);
    for (size_t i = 0; i < resp->n_jobs; i++) {
        const Pcs__V1__Job *j = resp->jobs[i];
        char st[32], age[32];
        uint32_t steps = j->spec && j->spec->training ? j->spec->training->steps : 0;
        pcs_cli_table_cell(t, "%s", j->job_id);
        pcs_cli_table_cell(t, "%s", *j->name ? j->name : "-");
        pcs_cli_table_cell(t, "%s",
                           pcs_cli_enum(&pcs__v1__job_state__descriptor, j->state, st, sizeof st));
        pcs_cli_table_cell(t, "%u", j->world_size);
        pcs_cli_table_cell(t, "%" PRIu64, j->generation);
        if (j->progress && steps)
            pcs_cli_table_cell(t, "%" PRIu64 "/%u", j->progress->step, steps);
        else if (j->progress)
            pcs_cli_table_cell(t, "%" PRIu64, j->progress->step);
        else
            pcs_cli_table_cell(t, "-");
        if (j->progress && j->progress->reports)
            pcs_cli_table_cell(t, "%.4g", j->progress->loss);
        else
            pcs_cli_table_cell(t, "-");
        pcs_cli_table_cell(t, "%s", pcs_cli_age(j->created_ms, age, sizeof age));
        pcs_cli_table_cell(t, "%s", *j->reason ? j->reason : "");
    }
    pcs_cli_table_print(t, stdout);
    pcs_cli_table_free(t);
    protobuf_c_message_free_unpacked(r, NULL);
    return PCS_CLI_OK;
}
