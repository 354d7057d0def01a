/* GetStatus text in redis INFO style (STYLE.md A4): sections "# Coordinator", "# Workers",
 * "# Jobs", "# Config", one "key:value" per line with units in the keys. Read-only over the
 * state machine; runs on the loop thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "coordinator/coord.h"
#include "pcs/version.h"
#include "coordinator/server.h"

pcs_status_t pcs_status_text(pcs_coord_t *c, const pcs_status_info_t *info, char **out)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return pcs_set_error(PCS_ERR_NOMEM, "status text: open_memstream failed");
    const pcs_coord_config_t *cc = pcs_coord_config(c);
    pcs_coord_counts_t cn;
    pcs_coord_counts(c, &cn);

    fprintf(f, "# Coordinator\n");
    fprintf(f, "version:%s\n", PCS_VERSION_STRING);
    fprintf(f, "git_sha:%s\n", PCS_GIT_SHA);
    fprintf(f, "uptime_ms:%" PRIu64 "\n", info->uptime_ms);
    fprintf(f, "listen:%s\n", info->listen ? info->listen : "");
    fprintf(f, "port:%d\n", info->port);
    fprintf(f, "metrics_port:%d\n", info->metrics_port);
    fprintf(f, "db:%s\n", info->db_path && *info->db_path ? info->db_path : ":memory:");
    if (info->db_path && *info->db_path) {
        int ok = !info->store_error || !*info->store_error;
        fprintf(f, "store_ok:%d\n", ok);
        if (!ok)
            fprintf(f, "store_error:%s\n", info->store_error);
        fprintf(f, "store_commits:%" PRIu64 "\n", info->commits);
        fprintf(f, "store_commit_failures:%" PRIu64 "\n", info->commit_failures);
    }
    fprintf(f, "heartbeat_interval_ms:%" PRIu32 "\n", cc->heartbeat_interval_ms);
    fprintf(f, "lease_ms:%" PRIu32 "\n", cc->lease_ms);
    fprintf(f, "readopt_ms:%" PRIu32 "\n", cc->readopt_ms);
    fprintf(f, "stalls:%" PRIu64 "\n", info->stalls);

    fprintf(f, "\n# Workers\n");
    fprintf(f, "workers_idle:%" PRIu32 "\n", cn.workers[PCS_WORKER_IDLE]);
    fprintf(f, "workers_assigned:%" PRIu32 "\n", cn.workers[PCS_WORKER_ASSIGNED]);
    fprintf(f, "workers_lost:%" PRIu32 "\n", cn.workers[PCS_WORKER_LOST]);
    fprintf(f, "workers_gone:%" PRIu32 "\n", cn.workers[PCS_WORKER_GONE]);
    fprintf(f, "workers_stopping:%" PRIu32 "\n", cn.workers[PCS_WORKER_STOPPING]);
    /* one line per live worker, capped so a 10k-worker cluster does not produce megabytes */
    uint32_t shown = 0;
    for (uint32_t i = 1; i <= pcs_coord_max_worker(c) && shown < 64; i++) {
        pcs_coord_worker_t *w = pcs_coord_worker_by_number(c, i);
        if (!w || (w->state != PCS_WORKER_IDLE && w->state != PCS_WORKER_ASSIGNED &&
                   w->state != PCS_WORKER_LOST))
            continue;
        fprintf(f, "%s:state=%s,host=%s,pid=%" PRIu32 ",job=%s,rank=%" PRIu32 ",devices=%zu\n",
                w->id, pcs_worker_state_name(w->state), w->host ? w->host : "", w->pid,
                w->job ? w->job->id : "-", w->job ? w->rank : 0, w->n_devices);
        shown++;
    }

    fprintf(f, "\n# Jobs\n");
    fprintf(f, "jobs_pending:%" PRIu32 "\n", cn.jobs[PCS_JOB_PENDING]);
    fprintf(f, "jobs_running:%" PRIu32 "\n", cn.jobs[PCS_JOB_RUNNING]);
    fprintf(f, "jobs_succeeded:%" PRIu32 "\n", cn.jobs[PCS_JOB_SUCCEEDED]);
    fprintf(f, "jobs_failed:%" PRIu32 "\n", cn.jobs[PCS_JOB_FAILED]);
    fprintf(f, "jobs_cancelled:%" PRIu32 "\n", cn.jobs[PCS_JOB_CANCELLED]);
    shown = 0;
    for (uint32_t i = pcs_coord_max_job(c); i >= 1 && shown < 32; i--) { /* newest first */
        pcs_coord_job_t *j = pcs_coord_job_by_number(c, i);
        if (!j)
            continue;
        fprintf(f,
                "%s:name=%s,state=%s,world_size=%" PRIu32 ",generation=%" PRIu64 ",step=%" PRIu64
                ",loss=%.6g,reason=%s\n",
                j->id, j->name, pcs_job_state_name(j->state), j->world_size, j->generation,
                j->progress.step, j->progress.loss, j->reason ? j->reason : "");
        shown++;
    }

    fprintf(f, "\n# Config\n");
    if (info->config) {
        size_t cap = 16384;
        char *cfg = malloc(cap);
        size_t need = cfg ? pcs_config_dump(info->config, cfg, cap) : 0;
        if (cfg && need >= cap) {
            char *bigger = realloc(cfg, need + 1);
            if (bigger) {
                cfg = bigger;
                cap = need + 1;
                pcs_config_dump(info->config, cfg, need + 1);
            }
        }
        if (cfg) {
            cfg[need < cap ? need : cap - 1] = 0;
            fputs(cfg, f);
            free(cfg);
        }
    } else {
        fprintf(f, "kv_max_key_bytes:%" PRIu32 "\n", cc->kv_max_key_bytes);
        fprintf(f, "kv_max_value_bytes:%" PRIu32 "\n", cc->kv_max_value_bytes);
        fprintf(f, "kv_max_job_bytes:%" PRIu64 "\n", cc->kv_max_job_bytes);
    }
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return pcs_set_error(PCS_ERR_NOMEM, "status text: out of memory");
    }
    *out = buf;
    return PCS_OK;
}
