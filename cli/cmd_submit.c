/* pcsctl submit FILE [--request-id ID]: parse a job file (YAML or JSON), validate it locally for a
 * fast, clear error (the coordinator validates again), then SubmitJob. The request id makes a
 * retried submit idempotent; by default each invocation gets a fresh random one. */
#include "cli/cli.h"
#include "pcs/pbtext.h"
#include "pcs/v1/coordinator.pb-c.h"
#include "planner/validate.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const pcs_cli_opt_t submit_opts[] = {
    {"request-id", "ID",
     "idempotency key: a retried submit with the same ID returns the same job (default: random)"},
};
const pcs_cli_spec_t pcs_cli_submit_spec = {
    "submit", "FILE|-", "validate a job file (YAML or JSON; - reads stdin) and submit it",
    NULL, submit_opts, 1, 1, 1};

static void random_request_id(char *buf, size_t n)
{
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    if (fd >= 0)
        close(fd);
    snprintf(buf, n, "ctl-%016llx", (unsigned long long)r);
}

/* `-`: the job file comes on stdin (pcsctl submit - < job.yaml, or from a generator). */
static pcs_status_t read_stdin_job(ProtobufCMessage **out)
{
    size_t len = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            if (cap >= (32u << 20)) {
                free(buf);
                return pcs_set_error(PCS_ERR_INVALID_ARG, "<stdin>: larger than 32 MiB");
            }
            size_t ncap = cap ? cap * 2 : 65536;
            char *p = realloc(buf, ncap);
            if (!p) {
                free(buf);
                return pcs_set_error(PCS_ERR_NOMEM, "<stdin>: out of memory");
            }
            buf = p;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0)
            break;
    }
    pcs_status_t st = pcs_pb_from_yaml(buf, len, &pcs__v1__job_spec__descriptor, out);
    free(buf);
    if (st != PCS_OK) {
        pcs_set_error(st, "<stdin>: %s", pcs_last_error());
    }
    return st;
}

int pcs_cli_submit(int argc, char **argv)
{
    pcs_cli_args_t a;
    int rc = pcs_cli_parse(&pcs_cli_submit_spec, argc, argv, &a);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    const char *file = a.pos[0], *request_id = a.val[0];
    if (request_id && !*request_id)
        return pcs_cli_bad_value(&pcs_cli_submit_spec, "--request-id: must not be empty");

    ProtobufCMessage *m = NULL;
    int from_stdin = !strcmp(file, "-");
    if ((from_stdin ? read_stdin_job(&m)
                    : pcs_pb_from_yaml_file(file, &pcs__v1__job_spec__descriptor, &m)) != PCS_OK)
        return pcs_cli_fail("%s", pcs_last_error());
    if (from_stdin)
        file = "<stdin>";
    Pcs__V1__JobSpec *spec = (Pcs__V1__JobSpec *)m;
    char err[512];
    if (pcs_job_validate(spec, err, sizeof err) != PCS_OK) {
        protobuf_c_message_free_unpacked(m, NULL);
        return pcs_cli_fail("%s: invalid job spec: %s", file, err);
    }

    char rid[32];
    if (!request_id) {
        random_request_id(rid, sizeof rid);
        request_id = rid;
    }
    Pcs__V1__SubmitJobRequest req = PCS__V1__SUBMIT_JOB_REQUEST__INIT;
    req.request_id = (char *)request_id;
    req.spec = spec;
    ProtobufCMessage *r = NULL;
    rc = pcs_cli_call("submit", PCS_M_SUBMIT_JOB, &req.base,
                      &pcs__v1__submit_job_response__descriptor, &r);
    protobuf_c_message_free_unpacked(m, NULL);
    if (rc != PCS_CLI_OK)
        return rc;
    Pcs__V1__SubmitJobResponse *resp = (Pcs__V1__SubmitJobResponse *)r;
    if (pcs_cli()->json) {
        rc = pcs_cli_print_json(r);
    } else if (!resp->job) {
        rc = pcs_cli_fail("submit: the coordinator answered without a job");
    } else {
        char st[32];
        printf("%s %s (world %u, request %s)%s\n", resp->job->job_id,
               pcs_cli_enum(&pcs__v1__job_state__descriptor, resp->job->state, st, sizeof st),
               resp->job->world_size, request_id,
               resp->duplicate ? " - duplicate request, existing job returned" : "");
    }
    protobuf_c_message_free_unpacked(r, NULL);
    return rc;
}
