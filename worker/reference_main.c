/* pcs-reference: the single-process reference trainer (model/reference.c) as a command. It trains
 * a job file the way W ranks would (the planner's units, precision and sample order for --world W)
 * in one process, then writes the final model as safetensors keyed by FQN and the loss of every
 * step, so a sharded run can be compared with it (`pcsctl demo` does, without linking the model
 * itself). Prints the loss of every step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/reference.h"
#include "pcs/log.h"
#include "pcs/pbtext.h"
#include "pcs/v1/job.pb-c.h"
#include "planner/plan.h"

#define USAGE                                                                                      \
    "usage: pcs-reference JOB_FILE [--world N] --out MODEL.safetensors [--losses FILE]\n"          \
    "  --world N    train as N ranks would (default: the product of the job's mesh)\n"             \
    "  --out FILE   the final parameters and buffers, safetensors keyed by module FQN\n"           \
    "  --losses F   one line per step: `step loss` (%.17g, exact doubles)\n"

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "pcs-reference: %s\n", why);
    fputs(USAGE, stderr);
    return 2;
}

static int write_losses(const char *path, const double *l, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "pcs-reference: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%zu %.17g\n", i + 1, l[i]);
    return fclose(f) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *job = NULL, *out = NULL, *losses = NULL;
    unsigned long world = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            char *end = NULL;
            world = strtoul(argv[++i], &end, 10);
            if (!*argv[i] || *end || world < 1 || world > (1u << 20))
                return usage("--world: must be a number in [1, 1048576]");
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--losses") && i + 1 < argc) {
            losses = argv[++i];
        } else if (argv[i][0] != '-' && !job) {
            job = argv[i];
        } else {
            return usage("unknown argument");
        }
    }
    if (!job || !out)
        return usage(!job ? "a job file is required" : "--out is required");
    pcs_log_init(PCS_LOG_WARN);

    ProtobufCMessage *msg = NULL;
    Pcs__V1__Plan *plan = NULL;
    pcs_reference_t *ref = NULL;
    int rc = 1;
    if (pcs_pb_from_yaml_file(job, &pcs__v1__job_spec__descriptor, &msg) != PCS_OK) {
        fprintf(stderr, "pcs-reference: %s: %s\n", job, pcs_last_error());
        return 1;
    }
    const Pcs__V1__JobSpec *spec = (const Pcs__V1__JobSpec *)msg;
    pcs_ref_options_t o;
    pcs_ref_options_default(&o);
    if (pcs_plan_build(spec, (uint32_t)world, &plan) != PCS_OK ||
        pcs_ref_create(spec, plan, &o, &ref) != PCS_OK || pcs_ref_run(ref) != PCS_OK) {
        fprintf(stderr, "pcs-reference: %s\n", pcs_last_error());
        goto out;
    }
    size_t n = 0;
    const double *l = pcs_ref_losses(ref, &n);
    printf("# reference run of %s as %u ranks\n#  step          loss\n", job, plan->world_size);
    for (size_t i = 0; i < n; i++)
        printf("%7zu  %12.6f\n", i + 1, l[i]);
    if (pcs_ref_export(ref, out) != PCS_OK) {
        fprintf(stderr, "pcs-reference: %s: %s\n", out, pcs_last_error());
        goto out;
    }
    if (losses && write_losses(losses, l, n) != 0)
        goto out;
    printf("# wrote %s (%zu steps)\n", out, n);
    rc = 0;
out:
    pcs_ref_destroy(ref);
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
}
