/* SQLite (WAL) persistence of job history and worker identities (see store.h). Writes join one
 * open transaction that the loop commits once per batch of requests (group commit), so a burst of
 * registrations costs one fsync instead of one each. synchronous=FULL (the default) makes every
 * commit durable across a power loss or a node crash, not only a crash of the process (NORMAL in
 * WAL mode): a coordinator acknowledges only what is committed, and on Kubernetes the node may go
 * as well as the pod. */
#include "coordinator/store.h"

#include <inttypes.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/log.h"
#include "pcs/mem.h"

struct pcs_store {
    sqlite3 *db;
    sqlite3_stmt *put_worker, *put_job, *put_meta, *del_job, *get_spec;
    bool in_tx;
    char *path;
};

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS workers(number INTEGER PRIMARY KEY, identity TEXT NOT NULL UNIQUE,"
    " host TEXT NOT NULL DEFAULT '', secret_hash BLOB);"
    "CREATE TABLE IF NOT EXISTS jobs(number INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT '',"
    " request_id TEXT NOT NULL DEFAULT '', state INTEGER NOT NULL, reason TEXT NOT NULL DEFAULT '',"
    " created_ms INTEGER, started_ms INTEGER, finished_ms INTEGER, generation INTEGER,"
    " plan_hash INTEGER, world_size INTEGER, spec BLOB, ranks BLOB, progress BLOB,"
    " owner TEXT NOT NULL DEFAULT '');";

/* ranks: "RNK2", then 16 bytes per rank, little-endian worker number (u32), pid (u32),
 * incarnation (u64): a fixed layout, so the file moves between hosts. Rows of 8 bytes per rank
 * (number, pid; no header; written before incarnations) are still read: 4 + 16 W is never a
 * multiple of 8, so the two layouts cannot be mistaken for each other. Databases written before
 * the column existed get it added on open. */
#define STORE_HASH_BYTES 32 /* SHA-256 of a worker secret */

#define RANK_MAGIC    "RNK2"
#define RANK_HEADER   4
#define RANK_BYTES    16
#define RANK_BYTES_V1 8

static void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static pcs_status_t db_error(pcs_store_t *s, const char *what)
{
    return pcs_set_error(PCS_ERR_SYSTEM, "store %s: %s: %s", s->path ? s->path : "?", what,
                         sqlite3_errmsg(s->db));
}

pcs_status_t pcs_store_open(const char *path, bool sync_full, pcs_store_t **out)
{
    *out = NULL;
    pcs_store_t *s;
    pcs_status_t st;
    PCS_CHECK(pcs_calloc(1, sizeof *s, (void **)&s));
    PCS_CHECK_GOTO(pcs_strdup(path, &s->path), st, fail);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        st = db_error(s, "open");
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 2000);
    char *err = NULL;
    /* WAL is a property of the file: a database that is already in WAL mode keeps it even when
     * this cannot write (a full disk after a crash), and the coordinator still starts */
    (void)sqlite3_exec(s->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (sqlite3_exec(s->db, sync_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
                     NULL, NULL, NULL) != SQLITE_OK) {
        st = db_error(s, "synchronous");
        goto fail;
    }
    if (sqlite3_exec(s->db, schema, NULL, NULL, &err) != SQLITE_OK) {
        st = pcs_set_error(PCS_ERR_SYSTEM, "store %s: schema: %s", path, err ? err : "?");
        sqlite3_free(err);
        goto fail;
    }
    /* columns newer databases have: one written before a column existed gets it (NULL = none) */
    static const char *const added[][2] = {
        {"SELECT ranks FROM jobs LIMIT 0", "ALTER TABLE jobs ADD COLUMN ranks BLOB"},
        {"SELECT progress FROM jobs LIMIT 0", "ALTER TABLE jobs ADD COLUMN progress BLOB"},
        {"SELECT secret_hash FROM workers LIMIT 0",
         "ALTER TABLE workers ADD COLUMN secret_hash BLOB"},
        {"SELECT owner FROM jobs LIMIT 0",
         "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''"}};
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        sqlite3_stmt *probe = NULL;
        if (sqlite3_prepare_v2(s->db, added[i][0], -1, &probe, NULL) != SQLITE_OK &&
            sqlite3_exec(s->db, added[i][1], NULL, NULL, NULL) != SQLITE_OK) {
            st = db_error(s, added[i][1]);
            goto fail;
        }
        sqlite3_finalize(probe);
    }
    if (sqlite3_prepare_v2(s->db,
                           "INSERT OR REPLACE INTO workers(number, identity, host, secret_hash)"
                           " VALUES(?,?,?,?)",
                           -1, &s->put_worker, NULL) != SQLITE_OK ||
        /* an upsert: a row written without its spec (NULL) keeps the stored one, so a finished
         * job whose spec left RAM can be written again */
        sqlite3_prepare_v2(s->db,
                           "INSERT INTO jobs(number, name, request_id, state, reason,"
                           " created_ms, started_ms, finished_ms, generation, plan_hash,"
                           " world_size, spec, ranks, progress, owner)"
                           " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                           " ON CONFLICT(number) DO UPDATE SET name = excluded.name,"
                           " request_id = excluded.request_id, state = excluded.state,"
                           " reason = excluded.reason, created_ms = excluded.created_ms,"
                           " started_ms = excluded.started_ms, finished_ms = excluded.finished_ms,"
                           " generation = excluded.generation, plan_hash = excluded.plan_hash,"
                           " world_size = excluded.world_size,"
                           " spec = COALESCE(excluded.spec, jobs.spec), ranks = excluded.ranks,"
                           " progress = excluded.progress, owner = excluded.owner",
                           -1, &s->put_job, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "DELETE FROM jobs WHERE number = ?", -1, &s->del_job, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "SELECT spec FROM jobs WHERE number = ?", -1, &s->get_spec,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?,?)", -1,
                           &s->put_meta, NULL) != SQLITE_OK) {
        st = db_error(s, "prepare");
        goto fail;
    }
    *out = s;
    return PCS_OK;
fail:
    PCS_WARN(PCS_SUB_STORE, "%s", pcs_last_error());
    pcs_store_close(s);
    return st;
}

pcs_status_t pcs_store_flush(pcs_store_t *s)
{
    if (!s || !s->in_tx)
        return PCS_OK;
    s->in_tx = false;
    if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK)
        return PCS_OK;
    pcs_status_t st = db_error(s, "commit");
    /* SQLite may have rolled the transaction back (a full disk) or kept it open (busy): end it
     * either way, so the caller's next attempt starts clean and writes every row again */
    if (!sqlite3_get_autocommit(s->db))
        (void)sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return st;
}

void pcs_store_rollback(pcs_store_t *s)
{
    if (!s || !s->in_tx)
        return;
    s->in_tx = false;
    if (!sqlite3_get_autocommit(s->db))
        (void)sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

void pcs_store_close(pcs_store_t *s)
{
    if (!s)
        return;
    if (s->db)
        (void)pcs_store_flush(s);
    sqlite3_finalize(s->put_worker);
    sqlite3_finalize(s->put_job);
    sqlite3_finalize(s->put_meta);
    sqlite3_finalize(s->del_job);
    sqlite3_finalize(s->get_spec);
    sqlite3_close(s->db);
    free(s->path);
    free(s);
}

static pcs_status_t begin(pcs_store_t *s)
{
    if (s->in_tx)
        return PCS_OK;
    if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_error(s, "begin");
    s->in_tx = true;
    return PCS_OK;
}

static pcs_status_t step(pcs_store_t *s, sqlite3_stmt *q, const char *what)
{
    int rc = sqlite3_step(q);
    pcs_status_t st = rc == SQLITE_DONE ? PCS_OK : db_error(s, what);
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return st;
}

pcs_status_t pcs_store_put_meta(pcs_store_t *s, const char *key, uint64_t value)
{
    PCS_CHECK(begin(s));
    sqlite3_bind_text(s->put_meta, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s->put_meta, 2, (sqlite3_int64)value);
    return step(s, s->put_meta, "put meta");
}

pcs_status_t pcs_store_get_meta(pcs_store_t *s, const char *key, uint64_t *value)
{
    *value = 0;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key = ?", -1, &q, NULL) !=
        SQLITE_OK)
        return db_error(s, "get meta");
    sqlite3_bind_text(q, 1, key, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW)
        *value = (uint64_t)sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_error(s, "get meta");
    return PCS_OK;
}

pcs_status_t pcs_store_put_worker(pcs_store_t *s, const pcs_store_worker_t *w)
{
    PCS_CHECK(begin(s));
    sqlite3_bind_int64(s->put_worker, 1, w->number);
    sqlite3_bind_text(s->put_worker, 2, w->identity, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s->put_worker, 3, w->host ? w->host : "", -1, SQLITE_TRANSIENT);
    if (w->secret_hash)
        sqlite3_bind_blob(s->put_worker, 4, w->secret_hash, STORE_HASH_BYTES, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s->put_worker, 4);
    return step(s, s->put_worker, "put worker");
}

pcs_status_t pcs_store_put_job(pcs_store_t *s, const pcs_store_job_t *j)
{
    PCS_CHECK(begin(s));
    sqlite3_stmt *q = s->put_job;
    sqlite3_bind_int64(q, 1, j->number);
    sqlite3_bind_text(q, 2, j->name ? j->name : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 3, j->request_id ? j->request_id : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(q, 4, j->state);
    sqlite3_bind_text(q, 5, j->reason ? j->reason : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 15, j->owner ? j->owner : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(q, 6, (sqlite3_int64)j->created_ms);
    sqlite3_bind_int64(q, 7, (sqlite3_int64)j->started_ms);
    sqlite3_bind_int64(q, 8, (sqlite3_int64)j->finished_ms);
    sqlite3_bind_int64(q, 9, (sqlite3_int64)j->generation);
    sqlite3_bind_int64(q, 10, (sqlite3_int64)j->plan_hash);
    sqlite3_bind_int64(q, 11, j->world_size);
    if (j->spec)
        sqlite3_bind_blob(q, 12, j->spec, (int)j->spec_len, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(q, 12); /* keeps the stored spec */
    uint8_t *ranks = NULL;
    if (j->n_ranks && j->rank_worker) {
        size_t len = RANK_HEADER + (size_t)j->n_ranks * RANK_BYTES;
        if (pcs_calloc(len, 1, (void **)&ranks) != PCS_OK) {
            sqlite3_reset(q);
            sqlite3_clear_bindings(q);
            return PCS_ERR_NOMEM;
        }
        memcpy(ranks, RANK_MAGIC, RANK_HEADER);
        for (uint32_t r = 0; r < j->n_ranks; r++) {
            uint8_t *e = ranks + RANK_HEADER + (size_t)r * RANK_BYTES;
            put_u32le(e, j->rank_worker[r]);
            put_u32le(e + 4, j->rank_pid ? j->rank_pid[r] : 0);
            uint64_t inc = j->rank_incarnation ? j->rank_incarnation[r] : 0;
            put_u32le(e + 8, (uint32_t)inc);
            put_u32le(e + 12, (uint32_t)(inc >> 32));
        }
        sqlite3_bind_blob(q, 13, ranks, (int)len, SQLITE_TRANSIENT);
    } else {
        sqlite3_bind_null(q, 13);
    }
    if (j->progress && j->progress_len)
        sqlite3_bind_blob(q, 14, j->progress, (int)j->progress_len, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(q, 14);
    pcs_status_t st = step(s, q, "put job");
    free(ranks);
    return st;
}

pcs_status_t pcs_store_delete_job(pcs_store_t *s, uint32_t number)
{
    PCS_CHECK(begin(s));
    sqlite3_bind_int64(s->del_job, 1, number);
    return step(s, s->del_job, "delete job");
}

pcs_status_t pcs_store_get_spec(pcs_store_t *s, uint32_t number, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    sqlite3_stmt *q = s->get_spec;
    sqlite3_bind_int64(q, 1, number);
    int rc = sqlite3_step(q);
    pcs_status_t st = PCS_OK;
    if (rc == SQLITE_ROW && sqlite3_column_type(q, 0) == SQLITE_BLOB) {
        const void *b = sqlite3_column_blob(q, 0);
        size_t n = (size_t)sqlite3_column_bytes(q, 0);
        st = pcs_calloc(n ? n : 1, 1, buf);
        if (st == PCS_OK) {
            memcpy(*buf, b, n);
            *len = n;
        }
    } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
        st = pcs_set_error(PCS_ERR_NOT_FOUND, "store: job %" PRIu32 " has no stored spec", number);
    } else {
        st = db_error(s, "get spec");
    }
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return st;
}

static const char *col_text(sqlite3_stmt *q, int i)
{
    const unsigned char *t = sqlite3_column_text(q, i);
    return t ? (const char *)t : "";
}

pcs_status_t pcs_store_load(pcs_store_t *s, void (*on_worker)(void *user, const pcs_store_worker_t *w),
                            void (*on_job)(void *user, const pcs_store_job_t *j), void *user)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT number, identity, host, secret_hash FROM workers ORDER BY number",
                           -1, &q, NULL) != SQLITE_OK)
        return db_error(s, "load workers");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        sqlite3_int64 n = sqlite3_column_int64(q, 0);
        const void *h = sqlite3_column_blob(q, 3);
        pcs_store_worker_t w = {
            .number = (uint32_t)n,
            .identity = col_text(q, 1),
            .host = col_text(q, 2),
            /* a hash of another length is not ours: the worker then registers anew */
            .secret_hash = h && sqlite3_column_bytes(q, 3) == STORE_HASH_BYTES ? h : NULL};
        if (n > 0 && n <= UINT32_MAX)
            on_worker(user, &w);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE)
        return db_error(s, "load workers");
    if (sqlite3_prepare_v2(s->db,
                           "SELECT number, name, request_id, state, reason, created_ms, started_ms,"
                           " finished_ms, generation, plan_hash, world_size, spec, ranks, progress,"
                           " owner FROM jobs"
                           " ORDER BY number",
                           -1, &q, NULL) != SQLITE_OK)
        return db_error(s, "load jobs");
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        sqlite3_int64 n = sqlite3_column_int64(q, 0);
        int state = sqlite3_column_int(q, 3);
        if (n <= 0 || n > UINT32_MAX || state < 1 || state > 5)
            continue; /* a row we did not write: skip rather than trust it */
        pcs_store_job_t j = {.number = (uint32_t)n,
                             .name = col_text(q, 1),
                             .request_id = col_text(q, 2),
                             .state = state,
                             .reason = col_text(q, 4),
                             .created_ms = (uint64_t)sqlite3_column_int64(q, 5),
                             .started_ms = (uint64_t)sqlite3_column_int64(q, 6),
                             .finished_ms = (uint64_t)sqlite3_column_int64(q, 7),
                             .generation = (uint64_t)sqlite3_column_int64(q, 8),
                             .plan_hash = (uint64_t)sqlite3_column_int64(q, 9),
                             .world_size = (uint32_t)sqlite3_column_int64(q, 10),
                             .owner = col_text(q, 14)};
        j.spec = sqlite3_column_blob(q, 11);
        j.spec_len = (size_t)sqlite3_column_bytes(q, 11);
        j.progress = sqlite3_column_blob(q, 13);
        j.progress_len = (size_t)sqlite3_column_bytes(q, 13);
        /* a map whose size does not match the world size is not trusted: left out */
        const uint8_t *rb = sqlite3_column_blob(q, 12);
        size_t rlen = (size_t)sqlite3_column_bytes(q, 12);
        uint32_t *rw = NULL;
        uint64_t *ri = NULL;
        size_t per = 0;
        if (rb && j.world_size && rlen == RANK_HEADER + (size_t)j.world_size * RANK_BYTES &&
            memcmp(rb, RANK_MAGIC, RANK_HEADER) == 0) {
            per = RANK_BYTES;
            rb += RANK_HEADER;
        } else if (rb && j.world_size && rlen == (size_t)j.world_size * RANK_BYTES_V1) {
            per = RANK_BYTES_V1;
        }
        if (per && pcs_calloc((size_t)j.world_size * 2, sizeof *rw, (void **)&rw) == PCS_OK &&
            pcs_calloc(j.world_size, sizeof *ri, (void **)&ri) == PCS_OK) {
            for (uint32_t r = 0; r < j.world_size; r++) {
                const uint8_t *e = rb + (size_t)r * per;
                rw[r] = get_u32le(e);
                rw[j.world_size + r] = get_u32le(e + 4);
                if (per == RANK_BYTES)
                    ri[r] = get_u32le(e + 8) | (uint64_t)get_u32le(e + 12) << 32;
            }
            j.rank_worker = rw;
            j.rank_pid = rw + j.world_size;
            j.rank_incarnation = ri;
            j.n_ranks = j.world_size;
        }
        on_job(user, &j);
        free(rw);
        free(ri);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE)
        return db_error(s, "load jobs");
    return PCS_OK;
}
