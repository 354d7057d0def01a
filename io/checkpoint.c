/* Sharded checkpoint files and export (see checkpoint.h for the layout). Rank files are plain
 * safetensors so that any tool can inspect them; the plan saved next to them is what gives the
 * shards meaning, so export needs no coordinator and no worker. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pcs/dtype.h"
#include "pcs/file.h"
#include "pcs/log.h"
#include "pcs/mem.h"

void pcs_ckpt_step_dir(const char *dir, uint64_t step, char *buf, size_t n)
{
    snprintf(buf, n, "%s/step-%08llu", dir, (unsigned long long)step);
}

void pcs_ckpt_unit_key(uint32_t unit, const char *what, char *buf, size_t n)
{
    snprintf(buf, n, "unit.%u.%s", unit, what);
}

// ---- directories held open ----
/* Every file of a checkpoint is reached through its directory's descriptor and one name pcs
 * chose, never through a symlink: a link planted as a step directory, a rank file or a temp file
 * (in a directory a worker shares with others) is neither followed nor written through. */

pcs_status_t pcs_ckpt_dir_adopt(int fd, const char *shown, pcs_ckpt_dir_t *d)
{
    d->fd = fd;
    snprintf(d->path, sizeof d->path, "%s", shown ? shown : "?");
    return PCS_OK;
}

pcs_status_t pcs_ckpt_dir_open(const char *path, int create, pcs_ckpt_dir_t *d)
{
    d->fd = -1;
    d->path[0] = '\0';
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: directory required");
    if (strlen(path) >= sizeof d->path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint path too long: %s", path);
    int fd = -1;
    pcs_status_t st = pcs_root_open_dir(NULL, path, "checkpoint", create, &fd);
    if (st == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "no complete checkpoint in %s (no such directory)",
                             path);
    PCS_CHECK(st);
    return pcs_ckpt_dir_adopt(fd, path, d);
}

void pcs_ckpt_dir_close(pcs_ckpt_dir_t *d)
{
    if (d && d->fd >= 0) {
        close(d->fd);
        d->fd = -1;
    }
}

/* "step-%08llu" of d, opened (create: made when missing) into *sd. */
static pcs_status_t step_open(const pcs_ckpt_dir_t *d, uint64_t step, int create,
                              pcs_ckpt_dir_t *sd)
{
    char name[64], shown[1100];
    snprintf(name, sizeof name, "step-%08llu", (unsigned long long)step);
    pcs_ckpt_step_dir(d->path, step, shown, sizeof shown);
    int fd = -1;
    PCS_CHECK(pcs_file_subdir_at(d->fd, name, shown, create, &fd));
    return pcs_ckpt_dir_adopt(fd, shown, sd);
}

/* "<dir>/<name>" for messages. */
static const char *shown_in(const pcs_ckpt_dir_t *d, const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", d->path, name);
    return buf;
}

static pcs_status_t fopen_in(const pcs_ckpt_dir_t *d, const char *name, const char *what,
                             FILE **out)
{
    *out = NULL;
    char shown[1200];
    int fd = -1;
    PCS_CHECK(pcs_file_open_read_at(d->fd, name, shown_in(d, name, shown, sizeof shown), what, &fd,
                                    NULL));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return pcs_set_error(PCS_ERR_SYSTEM, "%s %s: %s", what, shown, strerror(errno));
    }
    *out = f;
    return PCS_OK;
}

static pcs_status_t write_rank_in(const pcs_ckpt_dir_t *d, const pcs_ckpt_rank_meta_t *m,
                                  const pcs_st_entry_t *e, size_t n);

pcs_status_t pcs_ckpt_write_rank(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                 const pcs_st_entry_t *e, size_t n)
{
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 1, &d));
    pcs_status_t st = write_rank_in(&d, m, e, n);
    pcs_ckpt_dir_close(&d);
    return st;
}

static pcs_status_t write_rank_in(const pcs_ckpt_dir_t *d, const pcs_ckpt_rank_meta_t *m,
                                  const pcs_st_entry_t *e, size_t n)
{
    if (!d || d->fd < 0 || !m || (m->n_units && !m->units))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: dir and meta required");
    pcs_ckpt_dir_t sd;
    PCS_CHECK(step_open(d, m->step, 1, &sd));
    char name[64], path[1200];
    /* an earlier run's COMPLETE must not vouch for the files this run is writing */
    if (unlinkat(sd.fd, "COMPLETE", 0) != 0 && errno != ENOENT) {
        pcs_status_t st = pcs_set_error(PCS_ERR_SYSTEM, "unlink %s: %s",
                                        shown_in(&sd, "COMPLETE", path, sizeof path),
                                        strerror(errno));
        pcs_ckpt_dir_close(&sd);
        return st;
    }
    snprintf(name, sizeof name, "rank-%05u.safetensors", m->rank);
    shown_in(&sd, name, path, sizeof path);
    char v[11][64];
    snprintf(v[0], 64, "%llu", (unsigned long long)m->step);
    snprintf(v[1], 64, "%u", m->rank);
    snprintf(v[2], 64, "%u", m->world_size);
    snprintf(v[3], 64, "%u", m->shard_index);
    snprintf(v[4], 64, "%u", m->replicate_index);
    snprintf(v[5], 64, "%u", m->pp_index);
    snprintf(v[6], 64, "%016llx", (unsigned long long)m->plan_hash);
    snprintf(v[7], 64, "%.17g", m->loss_scale);
    snprintf(v[8], 64, "%llu", (unsigned long long)m->opt_steps);
    snprintf(v[9], 64, "%u", m->growth_tracker);
    snprintf(v[10], 64, "%llu", (unsigned long long)m->skipped_steps);
    const char *fixed[] = {"format",
                           "pcs-shard",
                           "job_id",
                           m->job_id ? m->job_id : "",
                           "step",
                           v[0],
                           "rank",
                           v[1],
                           "world_size",
                           v[2],
                           "shard_index",
                           v[3],
                           "replicate_index",
                           v[4],
                           "pp_index",
                           v[5],
                           "plan_hash",
                           v[6],
                           "loss_scale",
                           v[7],
                           "opt_steps",
                           v[8],
                           "growth_tracker",
                           v[9],
                           "skipped_steps",
                           v[10]};
    size_t nf = sizeof fixed / sizeof fixed[0];
    size_t nm = nf + 4 * m->n_units;
    const char **meta = NULL;
    char(*txt)[48] = NULL;
    pcs_status_t st;
    PCS_CHECK_GOTO(pcs_calloc(nm, sizeof *meta, (void **)&meta), st, out);
    PCS_CHECK_GOTO(pcs_calloc(4 * m->n_units + 1, sizeof *txt, (void **)&txt), st, out);
    memcpy(meta, fixed, sizeof fixed);
    for (size_t i = 0; i < m->n_units; i++) {
        char *k = txt[4 * i];
        snprintf(k, 48, "unit.%u.shard_index", m->units[i].unit);
        snprintf(txt[4 * i + 1], 48, "%u", m->units[i].shard_index);
        snprintf(txt[4 * i + 2], 48, "unit.%u.replicate_index", m->units[i].unit);
        snprintf(txt[4 * i + 3], 48, "%u", m->units[i].replicate_index);
        for (int j = 0; j < 4; j++)
            meta[nf + 4 * i + (size_t)j] = txt[4 * i + (size_t)j];
    }
    st = pcs_st_write_at(sd.fd, name, path, e, n, meta, nm / 2);
out:
    free(meta);
    free(txt);
    pcs_ckpt_dir_close(&sd);
    return st;
}

// ---- the manifest (COMPLETE) ----

/* COMPLETE is "pcs-checkpoint 1", then "step N", "job_id J", "plan_hash H", "world_size W" and one
 * "file R NAME BYTES" line per rank. The file from before manifests held "ok". */
typedef struct manifest {
    uint64_t step;
    char job[256], hash[32];
    uint32_t world;
    long long *sizes; /* per rank, -1 = not listed */
} manifest_t;

#define MANIFEST_MAGIC "pcs-checkpoint 1\n"

static uint64_t meta_u64(pcs_st_file_t *f, const char *key, uint64_t def)
{
    const char *v = pcs_st_metadata(f, key);
    return v ? strtoull(v, NULL, 10) : def;
}

static const char *meta_str(pcs_st_file_t *f, const char *key)
{
    const char *v = pcs_st_metadata(f, key);
    return v ? v : "";
}

/* The rank file `path` (rank r) belongs to step/job/plan? Else PCS_ERR_STATE naming what differs.
 */
static pcs_status_t check_rank_file(const char *path, pcs_st_file_t *f, uint32_t r, uint64_t step,
                                    const char *job, const char *hash)
{
    const char *what = strcmp(meta_str(f, "format"), "pcs-shard") != 0 ? "format"
                       : meta_u64(f, "step", UINT64_MAX) != step       ? "step"
                       : meta_u64(f, "rank", UINT64_MAX) != r          ? "rank"
                       : strcmp(meta_str(f, "job_id"), job) != 0       ? "job_id"
                       : strcmp(meta_str(f, "plan_hash"), hash) != 0   ? "plan_hash"
                                                                       : NULL;
    if (what)
        return pcs_set_error(PCS_ERR_STATE,
                             "%s: stale rank file (its %s is not this checkpoint's: step %llu, "
                             "job '%s', plan %s)",
                             path, what, (unsigned long long)step, job, hash);
    return PCS_OK;
}

/* Parse COMPLETE of the step directory sd. *legacy = 1 for the old "ok" marker (m untouched). */
static pcs_status_t manifest_read(const pcs_ckpt_dir_t *sd, manifest_t *m, int *legacy)
{
    char path[1200];
    shown_in(sd, "COMPLETE", path, sizeof path);
    FILE *f = NULL;
    pcs_status_t ost = fopen_in(sd, "COMPLETE", "checkpoint manifest", &f);
    if (ost == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "checkpoint %s is incomplete (no COMPLETE)",
                             sd->path);
    if (ost != PCS_OK)
        return ost;
    char line[1400] = ""; /* an empty file leaves it untouched by fgets */
    pcs_status_t st = PCS_OK;
    *legacy = 0;
    memset(m, 0, sizeof *m);
    if (!fgets(line, sizeof line, f) || strcmp(line, MANIFEST_MAGIC) != 0) {
        *legacy = strcmp(line, "ok\n") == 0;
        if (!*legacy)
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a pcs checkpoint manifest", path);
        fclose(f);
        return st;
    }
    int have = 0;
    while (st == PCS_OK && fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        if (l && line[l - 1] == '\n')
            line[--l] = 0;
        unsigned long long a = 0;
        unsigned r = 0;
        long long sz = 0;
        char name[64];
        if (sscanf(line, "step %llu", &a) == 1) {
            m->step = a;
            have |= 1;
        } else if (strncmp(line, "job_id ", 7) == 0) {
            size_t jl = strlen(line + 7);
            if (jl >= sizeof m->job)
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: job id too long", path);
            else
                memcpy(m->job, line + 7, jl + 1);
            have |= 2;
        } else if (sscanf(line, "plan_hash %31s", m->hash) == 1) {
            have |= 4;
        } else if (sscanf(line, "world_size %u", &r) == 1 && r > 0 && !m->sizes) {
            m->world = r;
            st = pcs_calloc(r, sizeof *m->sizes, (void **)&m->sizes);
            for (uint32_t i = 0; st == PCS_OK && i < r; i++)
                m->sizes[i] = -1;
            have |= 8;
        } else if (sscanf(line, "file %u %63s %lld", &r, name, &sz) == 3 && m->sizes &&
                   r < m->world && sz >= 0) {
            char want[64];
            snprintf(want, sizeof want, "rank-%05u.safetensors", r);
            if (strcmp(name, want) != 0)
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: rank %u's file is %s, not %s", path, r,
                                   name, want);
            m->sizes[r] = sz;
        } else {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: bad line '%s'", path, line);
        }
    }
    fclose(f);
    if (st == PCS_OK && have != 15)
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: manifest lacks step/job_id/plan_hash/world",
                           path);
    for (uint32_t i = 0; st == PCS_OK && i < m->world; i++)
        if (m->sizes[i] < 0)
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: rank %u's file is not listed", path, i);
    if (st != PCS_OK) {
        free(m->sizes);
        m->sizes = NULL;
    }
    return st;
}

// ---- assembling a rank file ----

struct pcs_ckpt_rank_file {
    pcs_st_entry_t *e; /* up to 3 per unit + 1 per buffer */
    char **names;      /* owned, one per entry */
    uint64_t (*shapes)[1];
    size_t n, cap;
    pcs_ckpt_unit_meta_t *units;
    size_t n_units, cap_units, cap_buffers, n_buffers;
};

pcs_status_t pcs_ckpt_rank_file_create(size_t n_units, size_t n_buffers, pcs_ckpt_rank_file_t **out)
{
    *out = NULL;
    pcs_ckpt_rank_file_t *f = NULL;
    pcs_status_t st;
    size_t cap = 3 * n_units + n_buffers + 1;
    PCS_CHECK(pcs_calloc(1, sizeof *f, (void **)&f));
    f->cap = cap;
    f->cap_units = n_units;
    f->cap_buffers = n_buffers;
    PCS_CHECK_GOTO(pcs_calloc(cap, sizeof *f->e, (void **)&f->e), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(cap, sizeof *f->names, (void **)&f->names), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(cap, sizeof *f->shapes, (void **)&f->shapes), st, fail);
    PCS_CHECK_GOTO(pcs_calloc(n_units + 1, sizeof *f->units, (void **)&f->units), st, fail);
    *out = f;
    return PCS_OK;
fail:
    pcs_ckpt_rank_file_free(f);
    return st;
}

/* The next entry: a 1-d (or 0-d) tensor named "<a><b>". */
static pcs_status_t add_entry(pcs_ckpt_rank_file_t *f, const char *a, const char *b, pcs_dtype_t dt,
                              int ndim, uint64_t numel, const void *data)
{
    if (f->n == f->cap) /* cannot happen: 3 per unit (AdamW xor momentum) + 1 per buffer */
        return pcs_set_error(PCS_ERR_INTERNAL, "checkpoint: rank file full at %s%s", a, b);
    size_t len = strlen(a) + strlen(b) + 1;
    PCS_CHECK(pcs_calloc(len, 1, (void **)&f->names[f->n]));
    snprintf(f->names[f->n], len, "%s%s", a, b);
    f->shapes[f->n][0] = numel;
    f->e[f->n] = (pcs_st_entry_t){f->names[f->n], dt, ndim, f->shapes[f->n], data};
    f->n++;
    return PCS_OK;
}

pcs_status_t pcs_ckpt_rank_file_add_unit(pcs_ckpt_rank_file_t *f, const pcs_ckpt_unit_meta_t *um,
                                         uint64_t numel, pcs_dtype_t master_dtype,
                                         const void *master, const float *exp_avg,
                                         const float *exp_avg_sq, const float *momentum)
{
    if (f->n_units == f->cap_units || !master || (momentum && (exp_avg || exp_avg_sq)))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: unit %u: %s", um->unit,
                             f->n_units == f->cap_units ? "more units than the file was made for"
                             : !master                  ? "no master shard"
                                       : "AdamW state and a momentum buffer both given");
    f->units[f->n_units++] = *um;
    const struct {
        const char *what;
        pcs_dtype_t dt;
        const void *p;
    } parts[4] = {{"param", master_dtype, master},
                  {"exp_avg", PCS_DTYPE_FP32, exp_avg},
                  {"exp_avg_sq", PCS_DTYPE_FP32, exp_avg_sq},
                  {"momentum", PCS_DTYPE_FP32, momentum}};
    for (int j = 0; j < 4; j++) {
        if (!parts[j].p)
            continue;
        char key[64];
        pcs_ckpt_unit_key(um->unit, parts[j].what, key, sizeof key);
        PCS_CHECK(add_entry(f, key, "", parts[j].dt, 1, numel, parts[j].p));
    }
    return PCS_OK;
}

pcs_status_t pcs_ckpt_rank_file_add_buffer(pcs_ckpt_rank_file_t *f, const char *fqn,
                                           pcs_dtype_t dtype, uint64_t numel, int scalar,
                                           const void *data)
{
    if (f->n_buffers == f->cap_buffers || !fqn || !data)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: buffer %s: %s", fqn ? fqn : "?",
                             f->n_buffers == f->cap_buffers ? "more buffers than the file was "
                                                              "made for"
                                                            : "no data");
    PCS_CHECK(add_entry(f, "buffer.", fqn, dtype, scalar ? 0 : 1, numel, data));
    f->n_buffers++;
    return PCS_OK;
}

pcs_status_t pcs_ckpt_rank_file_write(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                      const pcs_ckpt_rank_file_t *f)
{
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 1, &d));
    pcs_status_t st = pcs_ckpt_rank_file_write_in(&d, m, f);
    pcs_ckpt_dir_close(&d);
    return st;
}

pcs_status_t pcs_ckpt_rank_file_write_in(const pcs_ckpt_dir_t *d, const pcs_ckpt_rank_meta_t *m,
                                         const pcs_ckpt_rank_file_t *f)
{
    pcs_ckpt_rank_meta_t mm = *m;
    mm.units = f->units;
    mm.n_units = f->n_units;
    return write_rank_in(d, &mm, f->e, f->n);
}

void pcs_ckpt_rank_file_free(pcs_ckpt_rank_file_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; f->names && i < f->n; i++)
        free(f->names[i]);
    free(f->e);
    free(f->names);
    free(f->shapes);
    free(f->units);
    free(f);
}

pcs_status_t pcs_ckpt_commit(const char *dir, uint64_t step, const Pcs__V1__Plan *plan)
{
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 1, &d));
    pcs_status_t st = pcs_ckpt_commit_in(&d, step, plan);
    pcs_ckpt_dir_close(&d);
    return st;
}

pcs_status_t pcs_ckpt_commit_in(const pcs_ckpt_dir_t *d, uint64_t step, const Pcs__V1__Plan *plan)
{
    if (!d || d->fd < 0 || !plan || plan->world_size == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint commit: dir and plan required");
    pcs_ckpt_dir_t sd;
    PCS_CHECK(step_open(d, step, 1, &sd));
    char name[64], path[1200];
    uint32_t W = plan->world_size;
    /* the manifest: every rank file of this step, checked to be this run's */
    size_t cap = 512 + (size_t)W * 64;
    char *man = NULL;
    uint8_t *buf = NULL;
    pcs_st_file_t *f = NULL;
    char job[256] = "", hash[32] = "";
    pcs_status_t st;
    PCS_CHECK_GOTO(pcs_calloc(cap, 1, (void **)&man), st, out);
    size_t o = 0;
    for (uint32_t r = 0; r < W; r++) {
        snprintf(name, sizeof name, "rank-%05u.safetensors", r);
        shown_in(&sd, name, path, sizeof path);
        PCS_CHECK_GOTO(pcs_st_open_at(sd.fd, name, path, &f), st, out);
        if (r == 0) {
            if (strlen(meta_str(f, "job_id")) >= sizeof job) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: job id too long", path);
                goto out;
            }
            snprintf(job, sizeof job, "%s", meta_str(f, "job_id"));
            snprintf(hash, sizeof hash, "%s", meta_str(f, "plan_hash"));
            if (strchr(job, '\n')) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: job id holds a newline", path);
                goto out;
            }
            o += (size_t)snprintf(man + o, cap - o,
                                  MANIFEST_MAGIC "step %llu\njob_id %s\nplan_hash %s\nworld_size "
                                                 "%u\n",
                                  (unsigned long long)step, job, hash, W);
        }
        PCS_CHECK_GOTO(check_rank_file(path, f, r, step, job, hash), st, out);
        pcs_st_close(f);
        f = NULL;
        struct stat sb;
        if (fstatat(sd.fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            st = pcs_set_error(PCS_ERR_SYSTEM, "stat %s: %s", path, strerror(errno));
            goto out;
        }
        o += (size_t)snprintf(man + o, cap - o, "file %u rank-%05u.safetensors %lld\n", r, r,
                              (long long)sb.st_size);
    }
    size_t len = pcs__v1__plan__get_packed_size(plan);
    PCS_CHECK_GOTO(pcs_calloc(len ? len : 1, 1, (void **)&buf), st, out);
    pcs__v1__plan__pack(plan, buf);
    PCS_CHECK_GOTO(pcs_file_write_atomic_at(sd.fd, "plan.pb",
                                            shown_in(&sd, "plan.pb", path, sizeof path), buf, len),
                   st, out);
    PCS_CHECK_GOTO(pcs_file_write_atomic_at(sd.fd, "COMPLETE",
                                            shown_in(&sd, "COMPLETE", path, sizeof path), man, o),
                   st, out);
    char txt[32];
    int tl = snprintf(txt, sizeof txt, "%llu\n", (unsigned long long)step);
    st = pcs_file_write_atomic_at(d->fd, "latest", shown_in(d, "latest", path, sizeof path), txt,
                                  (size_t)tl);
out:
    pcs_st_close(f);
    free(man);
    free(buf);
    pcs_ckpt_dir_close(&sd);
    return st;
}

/* pcs' own names inside a step directory (and the temps of pcs_file_write_atomic_at and
 * pcs_st_write_at). */
static int own_file(const char *name)
{
    unsigned r;
    char tail[32];
    if (!strcmp(name, "plan.pb") || !strcmp(name, "COMPLETE") || strstr(name, ".tmp"))
        return 1;
    return sscanf(name, "rank-%5u.safetensor%31s", &r, tail) == 2 && !strcmp(tail, "s");
}

/* Remove step directory `name` of d: only pcs' own files in it, never through a link (a link in
 * its place, or one inside it, is removed as a link or left alone, never followed). */
static void remove_step_dir(const pcs_ckpt_dir_t *d, const char *name)
{
    char shown[1200];
    shown_in(d, name, shown, sizeof shown);
    int sfd = -1;
    if (pcs_file_subdir_at(d->fd, name, shown, 0, &sfd) != PCS_OK) {
        PCS_WARN(PCS_SUB_WORKER, "checkpoint prune: %s kept (%s)", shown, pcs_last_error());
        return;
    }
    int lfd = openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dd = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!dd) {
        if (lfd >= 0)
            close(lfd);
        close(sfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(dd)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (own_file(de->d_name))
            (void)unlinkat(sfd, de->d_name, 0); /* a link there goes as a link */
    }
    closedir(dd);
    close(sfd);
    if (unlinkat(d->fd, name, AT_REMOVEDIR) != 0)
        PCS_WARN(PCS_SUB_WORKER, "checkpoint prune: %s kept (%s; not only pcs files)", shown,
                 strerror(errno));
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

pcs_status_t pcs_ckpt_prune(const char *dir, uint64_t step, uint32_t keep)
{
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 0, &d));
    pcs_status_t st = pcs_ckpt_prune_in(&d, step, keep);
    pcs_ckpt_dir_close(&d);
    return st;
}

pcs_status_t pcs_ckpt_prune_in(const pcs_ckpt_dir_t *d, uint64_t step, uint32_t keep)
{
    if (!d || d->fd < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint prune: dir required");
    if (keep == 0)
        keep = 2;
    pcs_ckpt_dir_t sd;
    manifest_t cur, m;
    int legacy = 0;
    PCS_CHECK(step_open(d, step, 0, &sd));
    pcs_status_t st = manifest_read(&sd, &cur, &legacy);
    pcs_ckpt_dir_close(&sd);
    PCS_CHECK(st);
    free(cur.sizes);
    if (legacy)
        return pcs_set_error(PCS_ERR_STATE, "%s/step-%08llu: committed without a manifest",
                             d->path, (unsigned long long)step);
    /* a new open file description: a dup would share (and keep) the offset of an earlier list */
    int lfd = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dd = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!dd) {
        if (lfd >= 0)
            close(lfd);
        return pcs_set_error(PCS_ERR_SYSTEM, "opendir %s: %s", d->path, strerror(errno));
    }
    uint64_t *all = NULL, *kept = NULL;
    size_t n_all = 0, cap_all = 0, n_kept = 0, cap_kept = 0;
    struct dirent *de;
    while ((de = readdir(dd)) != NULL) {
        unsigned long long s = 0;
        char canon[64];
        if (sscanf(de->d_name, "step-%llu", &s) != 1)
            continue;
        snprintf(canon, sizeof canon, "step-%08llu", s);
        if (strcmp(canon, de->d_name) != 0 || s == step)
            continue; /* not one of ours, or the step just committed */
        PCS_CHECK_GOTO(pcs_grow((void **)&all, &cap_all, n_all + 1, sizeof *all), st, out);
        all[n_all++] = s;
        /* keep candidates: committed (with a manifest) by the same job, below this step */
        if (s < step && step_open(d, s, 0, &sd) == PCS_OK) {
            if (manifest_read(&sd, &m, &legacy) == PCS_OK && !legacy) {
                int same = m.step == s && !strcmp(m.job, cur.job);
                free(m.sizes);
                if (same) {
                    st = pcs_grow((void **)&kept, &cap_kept, n_kept + 1, sizeof *kept);
                    if (st == PCS_OK)
                        kept[n_kept++] = s;
                }
            }
            pcs_ckpt_dir_close(&sd);
            PCS_CHECK_GOTO(st, st, out);
        }
    }
    if (n_kept)
        qsort(kept, n_kept, sizeof *kept, cmp_desc);
    if (n_kept > keep - 1)
        n_kept = keep - 1;
    for (size_t i = 0; i < n_all; i++) {
        int keep_it = 0;
        for (size_t j = 0; j < n_kept; j++)
            keep_it |= kept[j] == all[i];
        if (keep_it)
            continue;
        char name[64];
        snprintf(name, sizeof name, "step-%08llu", (unsigned long long)all[i]);
        remove_step_dir(d, name);
    }
out:
    closedir(dd);
    free(all);
    free(kept);
    return st;
}

pcs_status_t pcs_ckpt_latest(const char *dir, uint64_t *step)
{
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 0, &d));
    pcs_status_t st = pcs_ckpt_latest_in(&d, step);
    pcs_ckpt_dir_close(&d);
    return st;
}

pcs_status_t pcs_ckpt_latest_in(const pcs_ckpt_dir_t *d, uint64_t *step)
{
    char path[1200];
    shown_in(d, "latest", path, sizeof path);
    FILE *f = NULL;
    pcs_status_t ost = fopen_in(d, "latest", "checkpoint", &f);
    if (ost == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "no complete checkpoint in %s (%s missing)",
                             d->path, path);
    if (ost != PCS_OK)
        return ost;
    unsigned long long s = 0;
    int ok = fscanf(f, "%llu", &s) == 1;
    fclose(f);
    if (!ok)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a step number", path);
    *step = s;
    return PCS_OK;
}

static pcs_status_t read_whole(const pcs_ckpt_dir_t *d, const char *name, uint8_t **out,
                               size_t *len)
{
    char path[1200];
    shown_in(d, name, path, sizeof path);
    int fd = -1;
    uint64_t size = 0;
    PCS_CHECK(pcs_file_open_read_at(d->fd, name, path, "checkpoint file", &fd, &size));
    uint8_t *b = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!b) {
        close(fd);
        return pcs_set_error(PCS_ERR_NOMEM, "reading %s", path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, b + got, (size_t)size - got, (off_t)got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(b);
        return pcs_set_error(PCS_ERR_SYSTEM, "short read of %s", path);
    }
    *out = b;
    *len = (size_t)size;
    return PCS_OK;
}

/* Product of a plan shape (1 for a scalar); UINT64_MAX when it overflows. */
static uint64_t shape_numel(const uint64_t *shape, size_t n)
{
    uint64_t p = 1;
    for (size_t d = 0; d < n; d++) {
        if (shape[d] && p > UINT64_MAX / shape[d])
            return UINT64_MAX;
        p *= shape[d];
    }
    return p;
}

static uint32_t meta_u32(pcs_st_file_t *f, const char *key, uint32_t def)
{
    const char *v = pcs_st_metadata(f, key);
    return v ? (uint32_t)strtoul(v, NULL, 10) : def;
}

/* Unit u's shard/replicate index in rank file f: its own "unit.<u>.<what>", else the file's. */
static uint32_t unit_index(pcs_st_file_t *f, size_t u, const char *what)
{
    char key[64];
    snprintf(key, sizeof key, "unit.%zu.%s", u, what);
    return pcs_st_metadata(f, key) ? meta_u32(f, key, 0) : meta_u32(f, what, 0);
}

/* Unit.layout per_param (FSDP2): shard r holds rows [r*R, (r+1)*R) along each parameter's
 * shard_dim (R = shard_rows, clipped to its rows; the parameter viewed as [outer, rows, inner]),
 * made contiguous at shard_offset. The planner's pcs_plan_shard_pieces states the same rule; io
 * sits beside the planner (DESIGN.md dependency rule), so it reads the plan's fields itself, and
 * checks them first: a plan from a file must not point outside the buffers. */
static bool param_dims(const Pcs__V1__ParamSlot *ps, uint64_t *outer, uint64_t *rows,
                       uint64_t *inner)
{
    if (ps->n_shape && ps->shard_dim >= ps->n_shape)
        return false;
    uint32_t d = ps->shard_dim;
    *outer = 1;
    *inner = 1;
    *rows = ps->n_shape ? ps->shape[d] : 1;
    for (size_t k = 0; k < ps->n_shape; k++) {
        uint64_t *f = k < d ? outer : inner;
        if (k != d && __builtin_mul_overflow(*f, ps->shape[k], f))
            return false;
    }
    uint64_t all;
    return !__builtin_mul_overflow(*outer, *rows, &all) &&
           !__builtin_mul_overflow(all, *inner, &all) && all == ps->numel;
}

static bool per_param_ok(const Pcs__V1__Unit *u, uint32_t sg)
{
    uint64_t c = u->shard_numel;
    if (c > UINT64_MAX / sg || c * sg > u->padded_numel)
        return false;
    for (size_t i = 0; i < u->n_params; i++) {
        const Pcs__V1__ParamSlot *ps = u->params[i];
        uint64_t outer, rows, inner, chunk;
        if (!param_dims(ps, &outer, &rows, &inner))
            return false;
        if (ps->shard_rows > UINT64_MAX / sg || ps->shard_rows * sg < rows ||
            __builtin_mul_overflow(ps->shard_rows, inner, &chunk) ||
            __builtin_mul_overflow(chunk, outer, &chunk) || ps->shard_offset > c ||
            chunk > c - ps->shard_offset || ps->offset > u->padded_numel ||
            ps->numel > u->padded_numel - ps->offset)
            return false;
    }
    return true;
}

/* gathered [sg, c] -> flat (parameters at their offsets); per_param_ok(u, sg) holds. */
static void per_param_copy_out(const Pcs__V1__Unit *u, uint32_t sg, size_t esz,
                               const uint8_t *gathered, uint8_t *flat)
{
    for (size_t i = 0; i < u->n_params; i++) {
        const Pcs__V1__ParamSlot *ps = u->params[i];
        uint64_t outer, rows, inner;
        (void)param_dims(ps, &outer, &rows, &inner);
        for (uint64_t r = 0; r < sg; r++) {
            uint64_t r0 = r * ps->shard_rows;
            uint64_t r1 = r0 + ps->shard_rows < rows ? r0 + ps->shard_rows : rows;
            for (uint64_t o = 0; r0 < r1 && o < outer; o++)
                memcpy(flat + (ps->offset + (o * rows + r0) * inner) * esz,
                       gathered + (r * u->shard_numel + ps->shard_offset +
                                   o * ps->shard_rows * inner) *
                                      esz,
                       (r1 - r0) * inner * esz);
        }
    }
}

pcs_status_t pcs_ckpt_export(const char *dir, uint64_t step, const char *out_path,
                             pcs_ckpt_export_info_t *info)
{
    if (!dir || !out_path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "export: checkpoint dir and output required");
    pcs_ckpt_dir_t d;
    PCS_CHECK(pcs_ckpt_dir_open(dir, 0, &d));
    pcs_status_t st = pcs_ckpt_export_in(&d, step, out_path, info);
    pcs_ckpt_dir_close(&d);
    return st;
}

pcs_status_t pcs_ckpt_export_in(const pcs_ckpt_dir_t *d, uint64_t step, const char *out_path,
                                pcs_ckpt_export_info_t *info)
{
    pcs_status_t st = PCS_OK;
    if (!d || d->fd < 0 || !out_path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "export: checkpoint dir and output required");
    if (step == 0)
        PCS_CHECK(pcs_ckpt_latest_in(d, &step));
    pcs_ckpt_dir_t sdh;
    PCS_CHECK(step_open(d, step, 0, &sdh));
    const char *sdir = sdh.path;
    char name[64], path[1200];
    manifest_t man;
    int legacy = 0;
    st = manifest_read(&sdh, &man, &legacy);
    if (st != PCS_OK) {
        pcs_ckpt_dir_close(&sdh);
        return st;
    }

    uint8_t *pbuf = NULL;
    size_t plen = 0;
    st = read_whole(&sdh, "plan.pb", &pbuf, &plen);
    if (st != PCS_OK) {
        free(man.sizes);
        pcs_ckpt_dir_close(&sdh);
        return st;
    }
    Pcs__V1__Plan *plan = pcs__v1__plan__unpack(NULL, plen, pbuf);
    free(pbuf);
    if (!plan) {
        free(man.sizes);
        pcs_ckpt_dir_close(&sdh);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a pcs.v1.Plan",
                             shown_in(&sdh, "plan.pb", path, sizeof path));
    }

    uint32_t W = plan->world_size;
    pcs_st_file_t **files = NULL;
    uint8_t **flats = NULL;
    pcs_st_entry_t *ents = NULL;
    uint64_t(*shapes)[PCS_ST_MAX_DIMS] = NULL;
    size_t n_ent = 0, cap_ent = 0;
    uint8_t **bufdata = NULL;
    size_t n_bufdata = 0;
    PCS_CHECK_GOTO(pcs_calloc(W ? W : 1, sizeof *files, (void **)&files), st, out);
    PCS_CHECK_GOTO(pcs_calloc(plan->n_units ? plan->n_units : 1, sizeof *flats, (void **)&flats),
                   st, out);
    if (!legacy && (man.world != W || man.step != step)) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "%s: manifest (step %llu, %u ranks) disagrees with the plan (%u ranks)",
                           sdir, (unsigned long long)man.step, man.world, W);
        goto out;
    }
    for (uint32_t r = 0; r < W; r++) {
        snprintf(name, sizeof name, "rank-%05u.safetensors", r);
        shown_in(&sdh, name, path, sizeof path);
        PCS_CHECK_GOTO(pcs_st_open_at(sdh.fd, name, path, &files[r]), st, out);
        if (legacy)
            continue;
        /* only the files the commit listed, unchanged since */
        struct stat sb;
        sb.st_size = -1; /* stat failed: the message must not print an unset size */
        if (fstatat(sdh.fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
            (long long)sb.st_size != man.sizes[r]) {
            st = pcs_set_error(PCS_ERR_STATE,
                               "%s: stale rank file (%lld bytes, the commit recorded %lld)", path,
                               (long long)sb.st_size, man.sizes[r]);
            goto out;
        }
        PCS_CHECK_GOTO(check_rank_file(path, files[r], r, step, man.job, man.hash), st, out);
    }
    for (size_t u = 0; u < plan->n_units; u++) {
        cap_ent += plan->units[u]->n_params + plan->units[u]->n_buffers;
    }
    PCS_CHECK_GOTO(pcs_calloc(cap_ent ? cap_ent : 1, sizeof *ents, (void **)&ents), st, out);
    PCS_CHECK_GOTO(pcs_calloc(cap_ent ? cap_ent : 1, sizeof *shapes, (void **)&shapes), st, out);
    PCS_CHECK_GOTO(pcs_calloc(cap_ent ? cap_ent : 1, sizeof *bufdata, (void **)&bufdata), st, out);

    uint64_t total = 0;
    size_t n_par = 0, n_buf = 0;
    for (size_t u = 0; u < plan->n_units; u++) {
        const Pcs__V1__Unit *un = plan->units[u];
        pcs_dtype_t md = un->master_dtype ? (pcs_dtype_t)un->master_dtype : PCS_DTYPE_FP32;
        size_t esz = pcs_dtype_size(md);
        uint32_t sg = un->shard_group_size ? un->shard_group_size : 1;
        uint64_t c = un->shard_numel;
        bool per_param = un->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM && sg > 1;
        if (per_param && !per_param_ok(un, sg)) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "plan unit %zu: a per_param chunk lies outside the shard or the "
                               "padded buffer",
                               u);
            goto out;
        }
        if (!per_param && (c > UINT64_MAX / sg || c * sg < un->padded_numel)) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "plan unit %zu: shard %llu x %u < padded %llu",
                               u, (unsigned long long)c, sg, (unsigned long long)un->padded_numel);
            goto out;
        }
        PCS_CHECK_GOTO(pcs_calloc((c * sg) != 0 ? c * sg : 1, esz, (void **)&flats[u]), st, out);
        char key[64];
        pcs_ckpt_unit_key((uint32_t)u, "param", key, sizeof key);
        for (uint32_t s = 0; s < sg; s++) {
            pcs_st_file_t *src = NULL;
            for (uint32_t r = 0; r < W && !src; r++) {
                if (unit_index(files[r], u, "replicate_index") == 0 &&
                    unit_index(files[r], u, "shard_index") == s && pcs_st_find(files[r], key))
                    src = files[r];
            }
            if (!src) {
                st = pcs_set_error(PCS_ERR_NOT_FOUND,
                                   "%s: no rank file holds shard %u of unit %zu (%s)", sdir, s, u,
                                   key);
                goto out;
            }
            const pcs_st_tensor_t *t = pcs_st_find(src, key);
            if (t->numel != c || t->dtype != md) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "%s: %s has %llu elements of %s, plan says %llu of %s", sdir,
                                   key, (unsigned long long)t->numel, t->dtype_str,
                                   (unsigned long long)c, pcs_dtype_name(md));
                goto out;
            }
            PCS_CHECK_GOTO(pcs_st_read_raw(src, t, 0, c * esz, flats[u] + (size_t)(s * c) * esz),
                           st, out);
        }
        if (per_param) { /* the gathered [sg, c] to the flat layout the entries point into */
            uint8_t *flat = NULL;
            PCS_CHECK_GOTO(pcs_calloc(un->padded_numel ? un->padded_numel : 1, esz,
                                      (void **)&flat),
                           st, out);
            per_param_copy_out(un, sg, esz, flats[u], flat);
            free(flats[u]);
            flats[u] = flat;
        }
        uint64_t flat_len = per_param ? un->padded_numel : c * sg;
        for (size_t p = 0; p < un->n_params; p++) {
            const Pcs__V1__ParamSlot *ps = un->params[p];
            if (ps->numel > flat_len || ps->offset > flat_len - ps->numel ||
                ps->n_shape > PCS_ST_MAX_DIMS) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG, "plan: param %s outside unit %zu", ps->fqn,
                                   u);
                goto out;
            }
            /* the output writes shape-product elements from the flat buffer */
            if (shape_numel(ps->shape, ps->n_shape) != ps->numel) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "plan: param %s has %llu elements but its shape holds more or "
                                   "fewer",
                                   ps->fqn, (unsigned long long)ps->numel);
                goto out;
            }
            pcs_st_entry_t *e = &ents[n_ent];
            for (size_t k = 0; k < ps->n_shape; k++)
                shapes[n_ent][k] = ps->shape[k];
            e->name = ps->fqn;
            e->dtype = md;
            e->ndim = (uint32_t)ps->n_shape;
            e->shape = shapes[n_ent];
            e->data = flats[u] + (size_t)ps->offset * esz;
            n_ent++;
            n_par++;
            total += ps->numel;
        }
        for (size_t b = 0; b < un->n_buffers; b++) {
            const Pcs__V1__BufferSlot *bs = un->buffers[b];
            char bkey[512];
            snprintf(bkey, sizeof bkey, "buffer.%s", bs->fqn);
            pcs_st_file_t *src = NULL;
            for (uint32_t r = 0; r < W && !src; r++)
                if (unit_index(files[r], u, "replicate_index") == 0 &&
                    unit_index(files[r], u, "shard_index") == 0 && pcs_st_find(files[r], bkey))
                    src = files[r];
            if (!src || bs->n_shape > PCS_ST_MAX_DIMS) {
                st = pcs_set_error(PCS_ERR_NOT_FOUND, "%s: buffer %s missing", sdir, bs->fqn);
                goto out;
            }
            const pcs_st_tensor_t *t = pcs_st_find(src, bkey);
            uint64_t nb = t->end - t->begin;
            uint64_t want = shape_numel(bs->shape, bs->n_shape);
            if (want == UINT64_MAX || want * pcs_dtype_size(t->dtype) != nb) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "%s: buffer %s holds %llu bytes of %s, its plan shape does not "
                                   "match",
                                   sdir, bs->fqn, (unsigned long long)nb, t->dtype_str);
                goto out;
            }
            PCS_CHECK_GOTO(pcs_calloc(nb ? nb : 1, 1, (void **)&bufdata[n_bufdata]), st, out);
            PCS_CHECK_GOTO(pcs_st_read_raw(src, t, 0, nb, bufdata[n_bufdata]), st, out);
            pcs_st_entry_t *e = &ents[n_ent];
            for (size_t k = 0; k < bs->n_shape; k++)
                shapes[n_ent][k] = bs->shape[k];
            e->name = bs->fqn;
            e->dtype = t->dtype;
            e->ndim = (uint32_t)bs->n_shape;
            e->shape = shapes[n_ent];
            e->data = bufdata[n_bufdata++];
            n_ent++;
            n_buf++;
        }
    }
    {
        const char *meta[] = {"format", "pt"};
        PCS_CHECK_GOTO(pcs_st_write(out_path, ents, n_ent, meta, 1), st, out);
    }
    if (info) {
        info->step = step;
        info->n_params = n_par;
        info->n_buffers = n_buf;
        info->numel = total;
    }
out:
    if (files)
        for (uint32_t r = 0; r < W; r++)
            pcs_st_close(files[r]);
    free(files);
    if (flats)
        for (size_t u = 0; u < plan->n_units; u++)
            free(flats[u]);
    free(flats);
    for (size_t i = 0; i < n_bufdata; i++)
        free(bufdata[i]);
    free(bufdata);
    free(ents);
    free(shapes);
    free(man.sizes);
    protobuf_c_message_free_unpacked(&plan->base, NULL);
    pcs_ckpt_dir_close(&sdh);
    return st;
}

// ---- a job's own directory ----

#define JOB_MARKER "JOB"

pcs_status_t pcs_ckpt_job_dir(const pcs_ckpt_dir_t *base, const char *job_id, const char *job_uid,
                              pcs_ckpt_dir_t *out)
{
    out->fd = -1;
    if (!base || base->fd < 0 || !job_id || !*job_id || strchr(job_id, '/') ||
        !strcmp(job_id, ".") || !strcmp(job_id, "..") || !job_uid || !*job_uid ||
        strchr(job_uid, '\n'))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: job id and uid required");
    char shown[1200], path[1300];
    shown_in(base, job_id, shown, sizeof shown);
    int fd = -1;
    PCS_CHECK(pcs_file_subdir_at(base->fd, job_id, shown, 1, &fd));
    pcs_ckpt_dir_adopt(fd, shown, out);
    shown_in(out, JOB_MARKER, path, sizeof path);
    /* the first rank here claims the directory; every rank checks the claim */
    char line[512];
    int n = snprintf(line, sizeof line, "%s\n", job_uid);
    if ((size_t)n >= sizeof line) {
        pcs_ckpt_dir_close(out);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: job uid too long");
    }
    int mfd = openat(out->fd, JOB_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0644);
    if (mfd >= 0) {
        int bad = write(mfd, line, (size_t)n) != n || fsync(mfd) != 0;
        bad |= close(mfd) != 0;
        if (!bad)
            return PCS_OK;
        (void)unlinkat(out->fd, JOB_MARKER, 0);
        pcs_ckpt_dir_close(out);
        return pcs_set_error(PCS_ERR_SYSTEM, "write %s: %s", path, strerror(errno));
    }
    if (errno != EEXIST) {
        int e = errno;
        pcs_ckpt_dir_close(out);
        return pcs_set_error(PCS_ERR_SYSTEM, "create %s: %s", path, strerror(e));
    }
    /* claimed already: by this job (another rank, or an earlier life of this job), or not */
    char have[512] = "";
    int rfd = -1;
    pcs_status_t st = pcs_file_open_read_at(out->fd, JOB_MARKER, path, "checkpoint", &rfd, NULL);
    for (int tries = 0; st == PCS_OK && tries < 50; tries++) {
        ssize_t r = pread(rfd, have, sizeof have - 1, 0);
        have[r > 0 ? r : 0] = '\0';
        if (strchr(have, '\n'))
            break;
        struct timespec ts = {0, 20 * 1000 * 1000}; /* the claimer is still writing it */
        nanosleep(&ts, NULL);
    }
    if (rfd >= 0)
        close(rfd);
    if (st == PCS_OK && strcmp(have, line) != 0)
        st = pcs_set_error(PCS_ERR_STATE,
                           "checkpoint.dir: %s holds the checkpoints of another job %s (another "
                           "coordinator's, or an earlier one's): nothing there is touched; give "
                           "this job another checkpoint.dir or move them",
                           out->path, job_id);
    if (st != PCS_OK)
        pcs_ckpt_dir_close(out);
    return st;
}

// ---- reading a checkpoint back (resume) ----

struct pcs_ckpt_reader {
    pcs_ckpt_dir_t sd; /* the step directory */
    manifest_t man;
    int legacy;
    uint64_t step;
    Pcs__V1__Plan *plan;
    pcs_st_file_t **files; /* per rank, opened on first use */
};

pcs_status_t pcs_ckpt_reader_open(const pcs_ckpt_dir_t *d, uint64_t step,
                                  pcs_ckpt_reader_t **out)
{
    *out = NULL;
    if (!d || d->fd < 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "resume: checkpoint directory required");
    if (step == 0)
        PCS_CHECK(pcs_ckpt_latest_in(d, &step));
    pcs_ckpt_reader_t *r = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *r, (void **)&r));
    r->sd.fd = -1;
    r->step = step;
    pcs_status_t st;
    PCS_CHECK_GOTO(step_open(d, step, 0, &r->sd), st, fail);
    PCS_CHECK_GOTO(manifest_read(&r->sd, &r->man, &r->legacy), st, fail);
    if (r->legacy) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "%s: committed without a manifest (an older pcs): cannot resume from it",
                           r->sd.path);
        goto fail;
    }
    uint8_t *pbuf = NULL;
    size_t plen = 0;
    PCS_CHECK_GOTO(read_whole(&r->sd, "plan.pb", &pbuf, &plen), st, fail);
    r->plan = pcs__v1__plan__unpack(NULL, plen, pbuf);
    free(pbuf);
    if (!r->plan || r->plan->world_size != r->man.world || r->man.step != step) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s: plan.pb and the manifest disagree",
                           r->sd.path);
        goto fail;
    }
    PCS_CHECK_GOTO(pcs_calloc(r->man.world, sizeof *r->files, (void **)&r->files), st, fail);
    *out = r;
    return PCS_OK;
fail:
    pcs_ckpt_reader_close(r);
    return st;
}

void pcs_ckpt_reader_close(pcs_ckpt_reader_t *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; r->files && i < r->man.world; i++)
        pcs_st_close(r->files[i]);
    free(r->files);
    free(r->man.sizes);
    if (r->plan)
        protobuf_c_message_free_unpacked(&r->plan->base, NULL);
    pcs_ckpt_dir_close(&r->sd);
    free(r);
}

uint64_t pcs_ckpt_reader_step(const pcs_ckpt_reader_t *r)
{
    return r->step;
}

const Pcs__V1__Plan *pcs_ckpt_reader_plan(const pcs_ckpt_reader_t *r)
{
    return r->plan;
}

const char *pcs_ckpt_reader_path(const pcs_ckpt_reader_t *r)
{
    return r->sd.path;
}

/* Rank r's file, opened and checked against the manifest on first use. */
static pcs_status_t reader_file(pcs_ckpt_reader_t *r, uint32_t rank, pcs_st_file_t **f)
{
    if (rank >= r->man.world)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: no rank %u in a checkpoint of %u ranks",
                             r->sd.path, rank, r->man.world);
    if (!r->files[rank]) {
        char name[64], path[1200];
        snprintf(name, sizeof name, "rank-%05u.safetensors", rank);
        shown_in(&r->sd, name, path, sizeof path);
        pcs_st_file_t *file = NULL;
        PCS_CHECK(pcs_st_open_at(r->sd.fd, name, path, &file));
        struct stat sb;
        pcs_status_t st = PCS_OK;
        if (fstatat(r->sd.fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
            (long long)sb.st_size != r->man.sizes[rank])
            st = pcs_set_error(PCS_ERR_STATE, "%s: not the file the commit recorded", path);
        if (st == PCS_OK)
            st = check_rank_file(path, file, rank, r->step, r->man.job, r->man.hash);
        if (st != PCS_OK) {
            pcs_st_close(file);
            return st;
        }
        r->files[rank] = file;
    }
    *f = r->files[rank];
    return PCS_OK;
}

const char *pcs_ckpt_reader_meta(pcs_ckpt_reader_t *r, uint32_t rank, const char *key)
{
    pcs_st_file_t *f = NULL;
    if (reader_file(r, rank, &f) != PCS_OK)
        return NULL;
    return pcs_st_metadata(f, key);
}

pcs_status_t pcs_ckpt_reader_read(pcs_ckpt_reader_t *r, uint32_t rank, const char *tensor,
                                  uint64_t first, uint64_t count, float *dst)
{
    pcs_st_file_t *f = NULL;
    PCS_CHECK(reader_file(r, rank, &f));
    const pcs_st_tensor_t *t = pcs_st_find(f, tensor);
    if (!t)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "%s: rank %u's file has no %s",
                             r->sd.path, rank, tensor);
    if (first > t->numel || count > t->numel - first)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "%s: %s of rank %u has %llu elements, [%llu, +%llu) asked", r->sd.path,
                             tensor, rank, (unsigned long long)t->numel,
                             (unsigned long long)first, (unsigned long long)count);
    if (t->dtype == PCS_DTYPE_INT64) { /* a counter buffer (num_batches_tracked) */
        int64_t *raw = malloc((count ? count : 1) * sizeof *raw);
        if (!raw)
            return pcs_set_error(PCS_ERR_NOMEM, "%s: %s", r->sd.path, tensor);
        pcs_status_t st = pcs_st_read_raw(f, t, first * 8, count * 8, raw);
        for (uint64_t i = 0; st == PCS_OK && i < count; i++)
            dst[i] = (float)raw[i]; /* exact below 2^24, as init.from reads them */
        free(raw);
        return st;
    }
    return pcs_st_read_f32(f, t, first, count, dst);
}
