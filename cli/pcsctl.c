/* pcsctl: the command-line client of the coordinator (DESIGN.md §9). Parses the global options,
 * then dispatches to one sub-command in cli/cmd_*.c. `plan`, `export` and `demo` live in files
 * owned by other areas; weak fallbacks below keep pcsctl linkable until they land, and say so
 * instead of pretending to work. */
#include "cli/cli.h"
#include "pcs/log.h"
#include "pcs/version.h"

#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: pcsctl [--coordinator ADDR] [--json] [--timeout-ms N] <command> [args]\n"
    "\n"
    "commands:\n"
    "  submit FILE|- [--request-id ID] validate a job file (YAML or JSON) and submit it\n"
    "  status [--full] [JOB]           coordinator summary, or the details of one job\n"
    "  jobs [--state S]                list jobs (pending, running, succeeded, failed, ...)\n"
    "  workers [--state S]             list workers (idle, assigned, lost, gone)\n"
    "  cancel JOB [--reason R]         cancel a job\n"
    "  health [--service S]            gRPC health check; exit 0 iff SERVING\n"
    "  plan FILE [--world N] [--rank R]  plan a job offline (no coordinator needed)\n"
    "  export JOB OUT.safetensors      gather a job's full parameters\n"
    "  demo                            run a local coordinator + CPU workers end to end\n"
    "  version                         print the version of pcsctl\n"
    "\n"
    "ADDR defaults to $PCS_COORDINATOR, else 127.0.0.1:7070. --json prints the reply as JSON.\n"
    "Exit status: 0 ok, 1 failure, 2 usage error.\n";

static int not_available(const char *cmd)
{
    fprintf(stderr, "pcsctl: '%s' is not available in this build\n", cmd);
    return PCS_CLI_USAGE;
}

__attribute__((weak)) int pcs_cli_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return not_available("plan");
}

__attribute__((weak)) int pcs_cli_export(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return not_available("export");
}

__attribute__((weak)) int pcs_cli_demo(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return not_available("demo");
}

static const struct {
    const char *name;
    int (*fn)(int, char **);
} commands[] = {
    {"submit", pcs_cli_submit},   {"status", pcs_cli_status}, {"jobs", pcs_cli_jobs},
    {"workers", pcs_cli_workers}, {"cancel", pcs_cli_cancel}, {"health", pcs_cli_health},
    {"plan", pcs_cli_plan},       {"export", pcs_cli_export}, {"demo", pcs_cli_demo},
};

int main(int argc, char **argv)
{
    /* A CLI prints its own errors; library WARN lines would repeat them. */
    pcs_log_init(PCS_LOG_ERROR);
    pcs_log_set_role("ctl");
    const char *env = getenv("PCS_COORDINATOR");
    if (env && *env)
        pcs_cli()->addr = env;

    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, "help")) {
            fputs(usage_text, stdout);
            return PCS_CLI_OK;
        }
        if (!strcmp(a, "--version") || !strcmp(a, "version")) {
            printf("pcsctl %s (git %s)\n", PCS_VERSION_STRING, PCS_GIT_SHA);
            return PCS_CLI_OK;
        }
        int g = pcs_cli_global_flag(argc, argv, &i);
        if (g < 0)
            return PCS_CLI_USAGE;
        if (g > 0)
            continue;
        if (a[0] == '-')
            return pcs_cli_usage(NULL, NULL, "unknown option '%s' (see pcsctl --help)", a);
        break;
    }
    if (i >= argc) {
        fputs(usage_text, stderr);
        return PCS_CLI_USAGE;
    }
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(argv[i], commands[k].name))
            return commands[k].fn(argc - i, argv + i);
    return pcs_cli_usage(NULL, NULL, "unknown command '%s' (see pcsctl --help)", argv[i]);
}
