/* pcsctl cancel JOB [--reason R]: CancelJob; prints the job's state afterwards. */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <string.h>

static const char usage[] = "pcsctl cancel JOB [--reason R]";

int pcs_cli_cancel(int argc, char **argv)
{
    Pcs__V1__CancelJobRequest req = PCS__V1__CANCEL_JOB_REQUEST__INIT;
    const char *job = NULL;
    for (int i = 1; i < argc; i++) {
        int g = pcs_cli_global_flag(argc, argv, &i);
        if (g < 0)
            return PCS_CLI_USAGE;
        if (g > 0)
            continue;
        if (!strcmp(argv[i], "--reason")) {
            if (i + 1 >= argc)
                return pcs_cli_usage("cancel", usage, "--reason needs a value");
            req.reason = argv[++i];
        } else if (!strncmp(argv[i], "--reason=", 9)) {
            req.reason = argv[i] + 9;
        } else if (argv[i][0] == '-') {
            return pcs_cli_usage("cancel", usage, "unknown option '%s'", argv[i]);
        } else if (job) {
            return pcs_cli_usage("cancel", usage, "one job at a time");
        } else {
            job = argv[i];
        }
    }
    if (!job)
        return pcs_cli_usage("cancel", usage, "missing job id");
    req.job_id = (char *)job;
    ProtobufCMessage *r = NULL;
    int rc = pcs_cli_call("cancel", PCS_M_CANCEL_JOB, &req.base,
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
