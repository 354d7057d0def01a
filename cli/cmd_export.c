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

static const pcs_cli_opt_t export_opts[] = {
    {"checkpoint", "DIR", "export this checkpoint directory instead of a job's (no coordinator)"},
    {"step", "N", "the checkpoint of this step (default: the latest committed)"},
};
const pcs_cli_spec_t pcs_cli_export_spec = {
    "export", "[JOB] OUT.safetensors",
    "gather a job's full parameters from its sharded checkpoint into one .safetensors file",
    "JOB's checkpoint directory comes from the coordinator (its <checkpoint.dir>/<job id>);\n"
    "with --checkpoint DIR there is no JOB and no coordinator. The file is keyed by module FQN\n"
    "and loads with safetensors.torch.load_file.\n",
    export_opts, 2, 1, 2};

int pcs_cli_export(int argc, char **argv)
{
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_export_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    const char *ckpt = a.val[0], *job = NULL, *out = NULL;
    unsigned long long step = 0;
    if (a.val[1]) {
        char *end = NULL;
        step = strtoull(a.val[1], &end, 10);
        /* digits only: strtoull takes "" as 0 (the latest) and "-1" as 2^64 - 1 */
        if (!end || *end || !isdigit((unsigned char)a.val[1][0]))
            return pcs_cli_bad_value(&pcs_cli_export_spec, "--step: not a number: '%s'",
                                     a.val[1]);
    }
    if (ckpt && a.n_pos == 1) {
        out = a.pos[0];
    } else if (!ckpt && a.n_pos == 2) {
        job = a.pos[0];
        out = a.pos[1];
    } else {
        return pcs_cli_bad_value(&pcs_cli_export_spec,
                                 ckpt ? "with --checkpoint: one output path"
                                      : "a job id and an output path are required");
    }
    char dir[1024];
    if (ckpt) {
        snprintf(dir, sizeof dir, "%s", ckpt);
    } else {
        Pcs__V1__GetJobRequest req = PCS__V1__GET_JOB_REQUEST__INIT;
        req.job_id = (char *)job;
        ProtobufCMessage *resp = NULL;
        rc = pcs_cli_call("export", PCS_M_GET_JOB, &req.base,
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
