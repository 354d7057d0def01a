/* pcsctl health [--service S]: grpc.health.v1.Health/Check, as a Kubernetes probe would call it.
 * Prints the serving status; exit 0 iff SERVING, 1 otherwise (including unreachable). */
#include "cli/cli.h"
#include "grpc/health/v1/health.pb-c.h"

#include <string.h>

static const pcs_cli_opt_t health_opts[] = {
    {"service", "NAME",
     "the service to check: pcs.v1.WorkerService, pcs.v1.JobService, pcs.v1.ClusterService "
     "(default \"\": the server)"},
};
const pcs_cli_spec_t pcs_cli_health_spec = {
    "health", "", "gRPC health check (grpc.health.v1); exit 0 iff SERVING", NULL, health_opts, 1,
    0, 0};

int pcs_cli_health(int argc, char **argv)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_health_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    if (a.val[0])
        req.service = (char *)a.val[0];
    ProtobufCMessage *r = NULL;
    rc = pcs_cli_call("health", PCS_M_HEALTH_CHECK, &req.base,
                          &grpc__health__v1__health_check_response__descriptor, &r);
    if (rc != PCS_CLI_OK)
        return rc;
    Grpc__Health__V1__HealthCheckResponse *resp = (Grpc__Health__V1__HealthCheckResponse *)r;
    int serving = resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (pcs_cli()->json) {
        rc = pcs_cli_print_json(r);
    } else {
        char st[32];
        /* Upper case as in the gRPC health protocol (SERVING, NOT_SERVING). */
        const char *s =
            pcs_cli_enum(&grpc__health__v1__health_check_response__serving_status__descriptor,
                         resp->status, st, sizeof st);
        for (char *p = st; *p && s == st; p++)
            if (*p >= 'a' && *p <= 'z')
                *p = (char)(*p - 'a' + 'A');
        printf("%s %s\n", pcs_cli()->addr, s);
    }
    protobuf_c_message_free_unpacked(r, NULL);
    if (rc != PCS_CLI_OK)
        return rc;
    return serving ? PCS_CLI_OK : PCS_CLI_FAIL;
}
