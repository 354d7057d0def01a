/* pcs-worker's /metrics, /healthz and /readyz (see status_http.h): a publisher thread turns
 * pcs_agent_stats into a snapshot for common/http.c every 500 ms. */
#include "worker/status_http.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/http.h"
#include "pcs/log.h"
#include "pcs/mem.h"

#define PUBLISH_EVERY_MS 500u

struct pcs_worker_http {
    pcs_agent_t *agent;
    pcs_http_t *http;
    unsigned live_ms;
    double start_wall_s;
    atomic_int quit;
    pthread_t thread;
    int started;
};

/* A label value as Prometheus's text format wants it: backslash, quote and newline escaped. */
static void label_value(const char *s, char *out, size_t n)
{
    size_t o = 0;
    for (; *s && o + 3 < n; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *pcs_worker_metrics_text(const pcs_agent_stats_t *st, double start_wall_s, size_t *len)
{
    char *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    char lab[512], id[160], ident[300], job[160];
    pcs_metrics_build_info(f, "worker");
    pcs_metrics_process(f, start_wall_s);
    label_value(st->worker_id, id, sizeof id);
    label_value(st->identity, ident, sizeof ident);
    family(f, "pcs_worker_info", "gauge",
           "This worker's id from the coordinator, its identity and backend (always 1).");
    snprintf(lab, sizeof lab, "worker_id=\"%s\",identity=\"%s\",backend=\"%s\"", id, ident,
             st->backend);
    pcs_metrics_line(f, "pcs_worker_info", lab, 1);
    family(f, "pcs_worker_registered", "gauge",
           "1 while the worker holds a registration the coordinator answered for.");
    pcs_metrics_line(f, "pcs_worker_registered", NULL, st->registered ? 1 : 0);
    if (st->heartbeat_age_ms != UINT64_MAX) {
        family(f, "pcs_worker_coordinator_silence_seconds", "gauge",
               "Seconds since the coordinator last answered (heartbeat, Register or ReportStep).");
        pcs_metrics_line(f, "pcs_worker_coordinator_silence_seconds", NULL,
                         (double)st->heartbeat_age_ms / 1e3);
    }
    family(f, "pcs_worker_heartbeat_failures_total", "counter",
           "Heartbeats the coordinator did not answer or refused.");
    pcs_metrics_line(f, "pcs_worker_heartbeat_failures_total", NULL,
                     (double)st->heartbeat_failures);
    family(f, "pcs_worker_registrations_total", "counter",
           "Registers the coordinator answered (more than 1: it restarted or declared us lost).");
    pcs_metrics_line(f, "pcs_worker_registrations_total", NULL, (double)st->registrations);
    family(f, "pcs_worker_jobs_total", "counter", "Jobs (generations) run here, by outcome.");
    pcs_metrics_line(f, "pcs_worker_jobs_total", "outcome=\"succeeded\"",
                     (double)st->jobs_succeeded);
    pcs_metrics_line(f, "pcs_worker_jobs_total", "outcome=\"failed\"", (double)st->jobs_failed);
    pcs_metrics_line(f, "pcs_worker_jobs_total", "outcome=\"stopped\"", (double)st->jobs_stopped);
    family(f, "pcs_worker_reports_sent_total", "counter", "Step reports the coordinator took.");
    pcs_metrics_line(f, "pcs_worker_reports_sent_total", NULL, (double)st->reports_sent);
    family(f, "pcs_worker_reports_queued", "gauge",
           "Step reports waiting for the coordinator (grows while it is away).");
    pcs_metrics_line(f, "pcs_worker_reports_queued", NULL, (double)st->reports_queued);
    family(f, "pcs_worker_collective_bytes_total", "counter",
           "Bytes this rank moved by collectives, by kind, over all jobs.");
    pcs_metrics_line(f, "pcs_worker_collective_bytes_total", "kind=\"all_gather\"",
                     (double)st->all_gather_bytes);
    pcs_metrics_line(f, "pcs_worker_collective_bytes_total", "kind=\"reduce_scatter\"",
                     (double)st->reduce_scatter_bytes);
    pcs_metrics_line(f, "pcs_worker_collective_bytes_total", "kind=\"all_reduce\"",
                     (double)st->all_reduce_bytes);
    unsigned live[PCS_COLL_LIVE_N];
    pcs_coll_live(live);
    family(f, "pcs_worker_communicators", "gauge",
           "Communicators alive in this worker, by the transport of their collectives (shm: every "
           "rank on this host; tcp: across hosts, PCS_COLL_SHM=0, pipeline channels; nccl).");
    pcs_metrics_line(f, "pcs_worker_communicators", "transport=\"shm\"",
                     (double)live[PCS_COLL_LIVE_SHM]);
    pcs_metrics_line(f, "pcs_worker_communicators", "transport=\"tcp\"",
                     (double)live[PCS_COLL_LIVE_TCP]);
    pcs_metrics_line(f, "pcs_worker_communicators", "transport=\"nccl\"",
                     (double)live[PCS_COLL_LIVE_NCCL]);
    if (st->job_id[0]) {
        label_value(st->job_id, job, sizeof job);
        family(f, "pcs_worker_job_info", "gauge",
               "The job this worker runs now: its rank and generation (always 1).");
        snprintf(lab, sizeof lab, "job_id=\"%s\",rank=\"%u\",generation=\"%llu\"", job, st->rank,
                 (unsigned long long)st->generation);
        pcs_metrics_line(f, "pcs_worker_job_info", lab, 1);
        snprintf(lab, sizeof lab, "job_id=\"%s\"", job);
        family(f, "pcs_worker_step", "gauge", "Last step this rank reported.");
        pcs_metrics_line(f, "pcs_worker_step", lab, (double)st->step);
        family(f, "pcs_worker_loss", "gauge", "Loss of this rank's last step.");
        pcs_metrics_line(f, "pcs_worker_loss", lab, st->loss);
        family(f, "pcs_worker_step_seconds", "gauge", "Time of this rank's last step.");
        pcs_metrics_line(f, "pcs_worker_step_seconds", lab, st->step_ms / 1e3);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void publish(pcs_worker_http_t *w)
{
    pcs_agent_stats_t st;
    pcs_agent_stats(w->agent, &st);
    size_t len = 0;
    char *text = pcs_worker_metrics_text(&st, w->start_wall_s, &len);
    int live = st.loop_age_ms <= w->live_ms;
    int ready = st.registered && !st.leaving;
    char why[200];
    if (!live)
        snprintf(why, sizeof why, "the agent has not gone round for %llu ms",
                 (unsigned long long)st.loop_age_ms);
    else if (st.leaving)
        snprintf(why, sizeof why, "shutting down");
    else if (!st.registered)
        snprintf(why, sizeof why, "not registered with the coordinator yet");
    else
        why[0] = '\0';
    pcs_http_publish(w->http, text ? text : "", text ? len : 0, live, ready, why);
    free(text);
}

static void *publisher_main(void *arg)
{
    pcs_worker_http_t *w = arg;
    pcs_thread_name("pcs-metrics");
    while (!atomic_load(&w->quit)) {
        publish(w);
        for (unsigned t = 0; t < PUBLISH_EVERY_MS && !atomic_load(&w->quit); t += 50)
            pcs_sleep_ms(50);
    }
    return NULL;
}

pcs_status_t pcs_worker_http_start(pcs_agent_t *a, const char *listen, const char *port_file,
                                   unsigned live_ms, pcs_worker_http_t **out)
{
    *out = NULL;
    pcs_worker_http_t *w;
    PCS_CHECK(pcs_calloc(1, sizeof *w, (void **)&w));
    w->agent = a;
    w->live_ms = live_ms;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    w->start_wall_s = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    /* a snapshot older than the liveness bound plus a few publish periods: the publisher is stuck */
    pcs_status_t st = pcs_http_start(listen, "metrics-listen", live_ms + 5 * PUBLISH_EVERY_MS,
                                     &w->http);
    if (st == PCS_OK && port_file && *port_file)
        st = pcs_port_file_write("metrics-port-file", port_file, pcs_http_port(w->http));
    if (st == PCS_OK) {
        publish(w);
        if (pthread_create(&w->thread, NULL, publisher_main, w) != 0)
            st = pcs_set_error(PCS_ERR_SYSTEM, "metrics-listen: cannot start its thread");
        else
            w->started = 1;
    }
    if (st != PCS_OK) {
        pcs_worker_http_stop(w);
        return st;
    }
    PCS_INFO(PCS_SUB_INIT, "serving /metrics /healthz /readyz on %s (port %d)", listen,
             pcs_http_port(w->http));
    *out = w;
    return PCS_OK;
}

void pcs_worker_http_stop(pcs_worker_http_t *w)
{
    if (!w)
        return;
    atomic_store(&w->quit, 1);
    if (w->started)
        pthread_join(w->thread, NULL);
    pcs_http_stop(w->http);
    free(w);
}
