/* pcsctl: the command-line client of the coordinator (DESIGN.md §9). Parses the global options,
 * then dispatches to one sub-command in cli/cmd_*.c; each describes its options in a
 * pcs_cli_spec_t that both its parser and the help text below read. */
#include "cli/cli.h"
#include "pcs/log.h"
#include "pcs/version.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const pcs_cli_spec_t *spec;
    int (*fn)(int, char **);
} commands[] = {
    {&pcs_cli_submit_spec, pcs_cli_submit},   {&pcs_cli_status_spec, pcs_cli_status},
    {&pcs_cli_jobs_spec, pcs_cli_jobs},       {&pcs_cli_workers_spec, pcs_cli_workers},
    {&pcs_cli_cancel_spec, pcs_cli_cancel},   {&pcs_cli_health_spec, pcs_cli_health},
    {&pcs_cli_plan_spec, pcs_cli_plan},       {&pcs_cli_export_spec, pcs_cli_export},
    {&pcs_cli_demo_spec, pcs_cli_demo},       {&pcs_cli_protoset_spec, pcs_cli_protoset},
};

/* `pcsctl --help`: every command with all its options, from the same tables the commands parse
 * with, so the two cannot disagree. */
static void usage(FILE *f)
{
    fprintf(f, "usage: pcsctl [--coordinator ADDR] [--json] [--timeout-ms N] <command> [args]\n\n"
               "commands:\n");
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++) {
        char syn[1024];
        pcs_cli_synopsis(commands[k].spec, syn, sizeof syn);
        fprintf(f, "  %s\n      %s\n", syn + strlen("pcsctl "), commands[k].spec->summary);
    }
    fprintf(f, "  version\n      print the version of pcsctl\n\n"
               "pcsctl COMMAND --help explains a command's options. ADDR defaults to\n"
               "$PCS_COORDINATOR, else 127.0.0.1:7070. --json prints the reply as JSON.\n"
               "Exit status: 0 ok, 1 failure, 2 usage error.\n");
}

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
            usage(stdout);
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
            return pcs_cli_usage(NULL, NULL, "unknown option '%s' (pcsctl --help lists them)", a);
        break;
    }
    if (i >= argc) {
        usage(stderr);
        return PCS_CLI_USAGE;
    }
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(argv[i], commands[k].spec->name))
            return commands[k].fn(argc - i, argv + i);
    return pcs_cli_usage(NULL, NULL, "unknown command '%s' (pcsctl --help lists them)", argv[i]);
}
