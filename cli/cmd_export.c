/* `pcsctl export JOB out.safetensors [--step N]` and `pcsctl export --checkpoint DIR
 * out.safetensors`: the final full parameters (and buffers) of a job, assembled from its sharded
 * checkpoint through the plan saved next to the shards, written as a .safetensors file keyed by FQN
 * that PyTorch (safetensors.torch.load_file + load_state_dict) and Hugging Face tools load
 * directly. With a JOB id the checkpoint directory comes from the job's spec (GetJob): its own
 * <checkpoint.dir>/<job id>; --checkpoint names that directory itself. No worker needs to be
 * alive. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#define EXPORT_USAGE                                                                               \
    "pcsctl export JOB OUT.safetensors [--step N] | pcsctl export --checkpoint DIR "               \
    "OUT.safetensors [--step N]"

int pcs_cli_export(int argc, char **argv)
{
    const char *job = NULL, *out = NULL, *ckpt = NULL;
    unsigned long long step = 0;
    for (int i = 1; i < argc; i++) {
        int g = pcs_cli_global_flag(argc, argv, &i);
        if (g < 0)
            return PCS_CLI_USAGE;
        if (g > 0)
            continue;
        if (strcmp(argv[i], "--checkpoint") == 0 && i + 1 < argc) {
            ckpt = argv[++i];
        } else if (strcmp(argv[i], "--step") == 0 && i + 1 < argc) {
            char *end = NULL;
            step = strtoull(argv[++i], &end, 10);
            /* digits only: strtoull takes "" as 0 (the latest) and "-1" as 2^64 - 1 */
            if (!end || *end || !isdigit((unsigned char)argv[i][0]))
                return pcs_cli_usage("export", EXPORT_USAGE, "--step: not a number: %s", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return pcs_cli_usage("export", EXPORT_USAGE, "unknown option %s", argv[i]);
        } else if (!job && !ckpt) {
            job = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return pcs_cli_usage("export", EXPORT_USAGE, "unexpected argument %s", argv[i]);
        }
    }
    if (ckpt && job && !out) { /* `--checkpoint DIR OUT` parsed OUT as the job */
        out = job;
        job = NULL;
    }
    if ((!job && !ckpt) || !out)
        return pcs_cli_usage("export", EXPORT_USAGE,
                             "a job id (or --checkpoint DIR) and an "
                             "output path are required");
    char dir[1024];
    if (ckpt) {
        snprintf(dir, sizeof dir, "%s", ckpt);
    } else {
        Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
        req.job_id = (char *)job;
        ProtobufCMessage *resp = NULL;
        int rc = pcs_cli_call("export", PCS_M_GET_JOB, &req.base,
                              &pcs__v1__get_job_response__descriptor, &resp);
        if (rc != PCS_CLI_OK)
            return rc;
        const Pcs__V1__GetJobResponse *r = (const Pcs__V1__GetJobResponse *)resp;
        const char *d = r->job && r->job->spec && r->job->spec->checkpoint
                            ? r->job->spec->checkpoint->dir
                            : NULL;
        if (!d || !d[0]) {
            protobuf_c_message_free_unpacked(resp, NULL);
            return pcs_cli_fail("export: job %s has no checkpoint.dir: nothing to export from "
                                "(set checkpoint: {dir: ...} in the job)",
                                job);
        }
        /* a job checkpoints into its own <checkpoint.dir>/<job id> */
        snprintf(dir, sizeof dir, "%s/%s", d, r->job->job_id);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    pcs_ckpt_export_info_t info;
    if (pcs_ckpt_export(dir, step, out, &info) != PCS_OK)
        return pcs_cli_fail("export: %s", pcs_last_error());
    printf("exported %zu parameters (%llu elements) and %zu buffers of step %llu from %s to %s\n",
           info.n_params, (unsigned long long)info.numel, info.n_buffers,
           (unsigned long long)info.step, dir, out);
    return PCS_CLI_OK;
}
