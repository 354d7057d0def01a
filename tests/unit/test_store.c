/* Unit tests of the coordinator's SQLite store (coordinator/store.c): a job's rank -> worker
 * map (worker numbers, pids and incarnations) survives a close and reopen, a map of the previous
 * layout is still read, a database written before the ranks column existed is upgraded in place,
 * and a map that does not match the world size is not handed back. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/store.h"
#include "test_util.h"

typedef struct loaded {
    int n_jobs;
    uint32_t number[4], world[4], n_ranks[4];
    uint32_t worker[4][8], pid[4][8];
    uint64_t incarnation[4][8];
    char progress[4][16]; /* the stored bytes, as a string */
    char name[4][32];
    char owner[4][32];
    int n_workers;
    uint32_t worker_number[4];
    char identity[4][32];
    int has_secret[4];
    uint8_t secret[4][32];
} loaded_t;

static void on_worker(void *user, const pcs_store_worker_t *w)
{
    loaded_t *l = user;
    assert_true(l->n_workers < 4);
    int i = l->n_workers++;
    l->worker_number[i] = w->number;
    snprintf(l->identity[i], sizeof l->identity[i], "%s", w->identity);
    l->has_secret[i] = w->secret_hash != NULL;
    if (w->secret_hash)
        memcpy(l->secret[i], w->secret_hash, 32);
}

static void on_job(void *user, const pcs_store_job_t *j)
{
    loaded_t *l = user;
    assert_true(l->n_jobs < 4);
    int i = l->n_jobs++;
    l->number[i] = j->number;
    l->world[i] = j->world_size;
    l->n_ranks[i] = j->n_ranks;
    snprintf(l->name[i], sizeof l->name[i], "%s", j->name);
    snprintf(l->owner[i], sizeof l->owner[i], "%s", j->owner ? j->owner : "(null)");
    snprintf(l->progress[i], sizeof l->progress[i], "%.*s", (int)j->progress_len,
             j->progress ? (const char *)j->progress : "");
    for (uint32_t r = 0; r < j->n_ranks && r < 8; r++) {
        l->worker[i][r] = j->rank_worker[r];
        l->pid[i][r] = j->rank_pid[r];
        l->incarnation[i][r] = j->rank_incarnation ? j->rank_incarnation[r] : 0;
    }
}

static char *db_path(char **dir)
{
    *dir = pcs_test_tmpdir("store");
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/state.db", *dir);
    return p;
}

static void test_rank_map_round_trips_through_the_database(void **state)
{
    (void)state;
    char *dir, *path = db_path(&dir);
    pcs_store_t *s;
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    uint32_t workers[3] = {7, 3, 0x01020304}, pids[3] = {4242, 0, 0xfffffffe};
    uint64_t incs[3] = {0x8877665544332211ull, 0, 1};
    pcs_store_job_t running = {.number = 1,
                               .name = "run",
                               .state = 2,
                               .world_size = 3,
                               .generation = 2,
                               .rank_worker = workers,
                               .rank_pid = pids,
                               .rank_incarnation = incs,
                               .n_ranks = 3,
                               .progress = "step7",
                               .progress_len = 5};
    pcs_store_job_t pending = {.number = 2, .name = "wait", .state = 1, .world_size = 1};
    assert_int_equal(pcs_store_put_job(s, &running), PCS_OK);
    assert_int_equal(pcs_store_put_job(s, &pending), PCS_OK);
    pcs_store_close(s); /* commits */

    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    loaded_t l = {0};
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_jobs, 2);
    assert_int_equal(l.number[0], 1);
    assert_int_equal(l.n_ranks[0], 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(l.worker[0][r], workers[r]);
        assert_int_equal(l.pid[0][r], pids[r]);
        assert_true(l.incarnation[0][r] == incs[r]);
    }
    assert_int_equal(l.n_ranks[1], 0); /* none stored: none handed back */
    assert_string_equal(l.progress[0], "step7");
    assert_string_equal(l.progress[1], "");
    /* a later write of the same job replaces its map (a job that finished keeps none) */
    running.state = 3;
    running.n_ranks = 0;
    assert_int_equal(pcs_store_put_job(s, &running), PCS_OK);
    pcs_store_close(s);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    memset(&l, 0, sizeof l);
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_ranks[0], 0);
    pcs_store_close(s);
    pcs_test_rmtree(dir);
    free(dir);
    free(path);
}

/* A worker's row keeps the hash of its secret (the credential survives a restart); a later
 * registration's hash replaces it, a registration without one clears it. */
static void test_worker_secret_hash_round_trips(void **state)
{
    (void)state;
    char *dir, *path = db_path(&dir);
    pcs_store_t *s;
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    uint8_t h1[32], h2[32];
    for (int i = 0; i < 32; i++)
        h1[i] = (uint8_t)(i * 7 + 1), h2[i] = (uint8_t)(255 - i);
    pcs_store_worker_t a = {.number = 1, .identity = "pod-a", .host = "h1", .secret_hash = h1};
    pcs_store_worker_t b = {.number = 2, .identity = "pod-b", .host = "h2", .secret_hash = NULL};
    assert_int_equal(pcs_store_put_worker(s, &a), PCS_OK);
    assert_int_equal(pcs_store_put_worker(s, &b), PCS_OK);
    pcs_store_close(s);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    loaded_t l = {0};
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_workers, 2);
    assert_int_equal(l.worker_number[0], 1);
    assert_true(l.has_secret[0]);
    assert_memory_equal(l.secret[0], h1, 32);
    assert_false(l.has_secret[1]);
    a.secret_hash = h2;
    b.secret_hash = h1;
    assert_int_equal(pcs_store_put_worker(s, &a), PCS_OK);
    assert_int_equal(pcs_store_put_worker(s, &b), PCS_OK);
    pcs_store_close(s);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    memset(&l, 0, sizeof l);
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_memory_equal(l.secret[0], h2, 32);
    assert_memory_equal(l.secret[1], h1, 32);
    pcs_store_close(s);
    pcs_test_rmtree(dir);
    free(dir);
    free(path);
}

/* A database from the previous release (no ranks column) opens, keeps its rows, and stores maps
 * from then on. */
static void test_database_without_ranks_column_is_upgraded_in_place(void **state)
{
    (void)state;
    char *dir, *path = db_path(&dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db,
                     "CREATE TABLE workers(number INTEGER PRIMARY KEY, identity TEXT NOT NULL "
                     "UNIQUE, host TEXT NOT NULL DEFAULT '');"
                     "CREATE TABLE jobs(number INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT '',"
                     " request_id TEXT NOT NULL DEFAULT '', state INTEGER NOT NULL, reason TEXT NOT"
                     " NULL DEFAULT '', created_ms INTEGER, started_ms INTEGER, finished_ms "
                     "INTEGER, generation INTEGER, plan_hash INTEGER, world_size INTEGER, spec "
                     "BLOB);"
                     "INSERT INTO jobs(number, name, state, world_size) VALUES(1, 'old', 2, 2);",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "INSERT INTO workers VALUES(3, 'pod-a', 'h')", NULL, NULL,
                                  NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    pcs_store_t *s;
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    loaded_t l = {0};
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_jobs, 1);
    assert_string_equal(l.name[0], "old");
    assert_string_equal(l.owner[0], ""); /* a job of a database without owners has none */
    assert_int_equal(l.n_ranks[0], 0);
    /* a worker of a database without credentials has none: it registers anew */
    assert_int_equal(l.n_workers, 1);
    assert_string_equal(l.identity[0], "pod-a");
    assert_false(l.has_secret[0]);
    uint32_t workers[2] = {5, 6}, pids[2] = {50, 60};
    pcs_store_job_t j = {.number = 1,
                         .name = "old",
                         .owner = "alice",
                         .state = 2,
                         .world_size = 2,
                         .rank_worker = workers,
                         .rank_pid = pids,
                         .n_ranks = 2};
    assert_int_equal(pcs_store_put_job(s, &j), PCS_OK);
    pcs_store_close(s);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK); /* the second open finds the column */
    memset(&l, 0, sizeof l);
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_string_equal(l.owner[0], "alice");
    assert_int_equal(l.n_ranks[0], 2);
    assert_int_equal(l.worker[0][1], 6);
    assert_int_equal(l.pid[0][1], 60);
    pcs_store_close(s);
    pcs_test_rmtree(dir);
    free(dir);
    free(path);
}

/* A map written before incarnations (8 bytes per rank: number, pid; no header) is still read,
 * with incarnation 0 (unknown: the coordinator compares pids then). */
static void test_rank_map_of_the_previous_layout_is_still_read(void **state)
{
    (void)state;
    char *dir, *path = db_path(&dir);
    pcs_store_t *s;
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    pcs_store_close(s);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    /* ranks: worker 5 pid 50, worker 6 pid 60 */
    assert_int_equal(sqlite3_exec(db,
                                  "INSERT INTO jobs(number, name, state, world_size, ranks) "
                                  "VALUES(1, 'v1', 2, 2, x'0500000032000000060000003c000000')",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    loaded_t l = {0};
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_ranks[0], 2);
    assert_int_equal(l.worker[0][0], 5);
    assert_int_equal(l.pid[0][0], 50);
    assert_int_equal(l.worker[0][1], 6);
    assert_int_equal(l.pid[0][1], 60);
    assert_true(l.incarnation[0][0] == 0 && l.incarnation[0][1] == 0);
    pcs_store_close(s);
    pcs_test_rmtree(dir);
    free(dir);
    free(path);
}

static void test_rank_map_not_matching_the_world_size_is_not_handed_back(void **state)
{
    (void)state;
    char *dir, *path = db_path(&dir);
    pcs_store_t *s;
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    uint32_t workers[2] = {1, 2};
    pcs_store_job_t j = {.number = 1,
                         .name = "j",
                         .state = 2,
                         .world_size = 2,
                         .rank_worker = workers,
                         .n_ranks = 2};
    assert_int_equal(pcs_store_put_job(s, &j), PCS_OK);
    pcs_store_close(s);
    sqlite3 *db; /* a row someone else changed: world size no longer matches the map */
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    /* 4 would read 36 bytes as the old layout if the layouts could be confused: neither is */
    assert_int_equal(sqlite3_exec(db, "UPDATE jobs SET world_size = 4", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(pcs_store_open(path, true, &s), PCS_OK);
    loaded_t l = {0};
    assert_int_equal(pcs_store_load(s, on_worker, on_job, &l), PCS_OK);
    assert_int_equal(l.n_jobs, 1);
    assert_int_equal(l.world[0], 4);
    assert_int_equal(l.n_ranks[0], 0);
    pcs_store_close(s);
    pcs_test_rmtree(dir);
    free(dir);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_map_round_trips_through_the_database),
        cmocka_unit_test(test_worker_secret_hash_round_trips),
        cmocka_unit_test(test_database_without_ranks_column_is_upgraded_in_place),
        cmocka_unit_test(test_rank_map_of_the_previous_layout_is_still_read),
        cmocka_unit_test(test_rank_map_not_matching_the_world_size_is_not_handed_back),
    };
    return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
