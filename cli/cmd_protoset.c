/* pcsctl protoset [OUT]: write the API's FileDescriptorSet (pcs/protoset.h) to OUT or stdout, for
 * clients that discover an API at run time: `grpcurl -protoset pcs.protoset ADDR list`,
 * `grpcurl -protoset pcs.protoset -d '{"jobId":"job-1"}' ADDR pcs.v1.JobService/GetJob`. */
#include "cli/cli.h"
#include "pcs/protoset.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

const pcs_cli_spec_t pcs_cli_protoset_spec = {
    "protoset", "[OUT]",
    "write the API's protobuf descriptor set (for grpcurl -protoset and dynamic clients)",
    "Every service and message of the coordinator's API (pcs.v1, grpc.health.v1, google.rpc\n"
    "error details) with comments, as protoc --descriptor_set_out --include_imports writes it.\n",
    NULL, 0, 0, 1};

int pcs_cli_protoset(int argc, char **argv)
{
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_protoset_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    FILE *f = stdout;
    if (a.n_pos) {
        f = fopen(a.pos[0], "wb");
        if (!f)
            return pcs_cli_fail("protoset: %s: %s", a.pos[0], strerror(errno));
    } else if (isatty(STDOUT_FILENO)) {
        return pcs_cli_bad_value(&pcs_cli_protoset_spec,
                                 "binary output: name a file or redirect (pcsctl protoset > "
                                 "pcs.protoset)");
    }
    size_t w = fwrite(pcs_protoset, 1, pcs_protoset_len, f);
    int bad = w != pcs_protoset_len || (f == stdout ? fflush(f) : fclose(f)) != 0;
    if (bad)
        return pcs_cli_fail("protoset: write failed: %s", strerror(errno));
    return PCS_CLI_OK;
}
