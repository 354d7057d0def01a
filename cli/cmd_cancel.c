/* pcsctl cancel JOB [--reason R]: CancelJob; prints the job's state afterwards. */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <string.h>

static const pcs_cli_opt_t cancel_opts[] = {
    {"reason", "TEXT", "why, recorded as the job's reason (default: \"cancelled by user\")"},
};
const pcs_cli_spec_t pcs_cli_cancel_spec = {
    "cancel", "JOB", "cancel a job (its workers stop it and are freed)", NULL, cancel_opts, 1, 1, 1};

int pcs_cli_cancel(int argc, char **argv)
{
    Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_cancel_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    const char *job = a.pos[0];
    req.job_id = (char *)job;
    if (a.val[0])
        req.reason = (char *)a.val[0];
    ProtobufCMessage *r = NULL;
    rc = pcs_cli_call("cancel", PCS_M_CANCEL_JOB, &req.base,
                          &pcs__v1__cancel_job_response__descriptor, &r);
    if (rc != PCS_CLI_OK)
        return rc;
    Pcs__V1__CancelJobResponse *resp = (Pcs__V1__CancelJobResponse *)r;
    if (pcs_cli()->json) {
        rc = pcs_cli_print_json(r);
    } else {
        char st[32];
        printf("%s %s\n", resp->job ? resp->job->job_id : job,
               resp->job
                   ? pcs_cli_enum(&pcs__v1__job_state__descriptor, resp->job->state, st, sizeof st)
                   : "cancelled");
    }
    protobuf_c_message_free_unpacked(r, NULL);
    return rc;
}
