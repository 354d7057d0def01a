/* pcsctl workers [--state S]: ListWorkers as an aligned table (identity: the pod name in a
 * cluster, state, job and rank, program, devices, heartbeat age). */
#include "cli/cli.h"
#include "pcs/v1/coordinator.pb-c.h"

#include <string.h>

static const pcs_cli_opt_t workers_opts[] = {
    {"state", "S", "only workers in this state: idle, assigned, stopping, lost, gone"},
};
const pcs_cli_spec_t pcs_cli_workers_spec = {
    "workers", "",
    "list workers: id, identity (the pod name), state, job and rank, program, devices",
    NULL, workers_opts, 1, 0, 0};

/* "cuda:0,cuda:1" or "cpu"; devices are few per worker. */
static void devices_str(const Pcs__V1__Worker *w, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < w->n_devices && used + 1 < n; i++) {
        const Pcs__V1__Device *d = w->devices[i];
        int k = snprintf(buf + used, n - used, "%s%s:%u", i ? "," : "", *d->kind ? d->kind : "?",
                         d->index);
        if (k < 0)
            break;
        used += (size_t)k;
    }
    if (!buf[0])
        snprintf(buf, n, "-");
}

static void join(char **items, size_t count, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < count && used + 1 < n; i++) {
        int k = snprintf(buf + used, n - used, "%s%s", i ? "," : "", items[i]);
        if (k < 0)
            break;
        used += (size_t)k;
    }
    if (!buf[0])
        snprintf(buf, n, "-");
}

int pcs_cli_workers(int argc, char **argv)
{
    Pcs__V1__ListWorkersRequest req = PCS__V1__LIST_WORKERS_REQUEST__INIT;
    int state = 0;
    int rc = pcs_cli_state_args(&pcs_cli_workers_spec, argc, argv,
                                &pcs__v1__worker_state__descriptor, &state);
    if (rc != PCS_CLI_OK)
        return rc == PCS_CLI_HELP ? PCS_CLI_OK : rc;
    req.state = (Pcs__V1__WorkerState)state;
    ProtobufCMessage *r = NULL;
    rc = pcs_cli_query("workers", PCS_M_LIST_WORKERS, &req.base,
                       &pcs__v1__list_workers_response__descriptor, &r);
    if (rc != PCS_CLI_OK || !r)
        return rc;
    Pcs__V1__ListWorkersResponse *resp = (Pcs__V1__ListWorkersResponse *)r;
    const char *hdr[] = {"WORKER", "IDENTITY", "STATE",    "HOST",    "PID",      "JOB",
                         "RANK",   "PROGRAM",  "BACKENDS", "DEVICES", "HEARTBEAT"};
    pcs_cli_table_t *t = pcs_cli_table_new(11, hdr);
    if (!t) {
        protobuf_c_message_free_unpacked(r, NULL);
        return pcs_cli_fail("out of memory");
    }
    pcs_cli_table_right(t, 4);
    pcs_cli_table_right(t, 6);
    for (size_t i = 0; i < resp->n_workers; i++) {
        const Pcs__V1__Worker *w = resp->workers[i];
        char st[32], dev[128], be[128], age[32];
        int in_job = w->job_id && *w->job_id;
        pcs_cli_table_cell(t, "%s", w->worker_id);
        pcs_cli_table_cell(t, "%s", w->identity && *w->identity ? w->identity : "-");
        pcs_cli_table_cell(
            t, "%s", pcs_cli_enum(&pcs__v1__worker_state__descriptor, w->state, st, sizeof st));
        pcs_cli_table_cell(t, "%s", *w->host ? w->host : "-");
        pcs_cli_table_cell(t, "%u", w->pid);
        pcs_cli_table_cell(t, "%s", in_job ? w->job_id : "-");
        if (in_job)
            pcs_cli_table_cell(t, "%u", w->rank);
        else
            pcs_cli_table_cell(t, "-");
        pcs_cli_table_cell(t, "%s", w->program && *w->program ? w->program : "-");
        join(w->backends, w->n_backends, be, sizeof be);
        pcs_cli_table_cell(t, "%s", be);
        devices_str(w, dev, sizeof dev);
        pcs_cli_table_cell(t, "%s", dev);
        pcs_cli_age(w->last_heartbeat_ms, age, sizeof age);
        pcs_cli_table_cell(t, "%s%s", age, w->last_heartbeat_ms ? " ago" : "");
    }
    pcs_cli_table_print(t, stdout);
    pcs_cli_table_free(t);
    protobuf_c_message_free_unpacked(r, NULL);
    return PCS_CLI_OK;
}
