/* Sharded checkpoint files and export (see checkpoint.h for the layout). Rank files are plain
 * safetensors so that any tool can inspect them; the plan saved next to them is what gives the
 * shards meaning, so export needs no coordinator and no worker. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
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

static pcs_status_t mkdir_p(const char *path)
{
    char tmp[1024];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return pcs_set_error(PCS_ERR_SYSTEM, "mkdir %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return pcs_set_error(PCS_ERR_SYSTEM, "mkdir %s: %s", tmp, strerror(errno));
    return PCS_OK;
}

/* Write bytes to path atomically (temp + rename) so readers never see a partial file. */
static pcs_status_t write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return pcs_set_error(PCS_ERR_SYSTEM, "open %s: %s", tmp, strerror(errno));
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int bad = w != len || fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return pcs_set_error(PCS_ERR_SYSTEM, "write %s: %s", path, strerror(errno));
    }
    return PCS_OK;
}

pcs_status_t pcs_ckpt_write_rank(const char *dir, const pcs_ckpt_rank_meta_t *m,
                                 const pcs_st_entry_t *e, size_t n)
{
    if (!dir || !m || (m->n_units && !m->units))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: dir and meta required");
    char sdir[1024], path[1100];
    pcs_ckpt_step_dir(dir, m->step, sdir, sizeof sdir);
    PCS_CHECK(mkdir_p(sdir));
    /* an earlier run's COMPLETE must not vouch for the files this run is writing */
    snprintf(path, sizeof path, "%s/COMPLETE", sdir);
    if (unlink(path) != 0 && errno != ENOENT)
        return pcs_set_error(PCS_ERR_SYSTEM, "unlink %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/rank-%05u.safetensors", sdir, m->rank);
    char v[8][64];
    snprintf(v[0], 64, "%llu", (unsigned long long)m->step);
    snprintf(v[1], 64, "%u", m->rank);
    snprintf(v[2], 64, "%u", m->world_size);
    snprintf(v[3], 64, "%u", m->shard_index);
    snprintf(v[4], 64, "%u", m->replicate_index);
    snprintf(v[5], 64, "%u", m->pp_index);
    snprintf(v[6], 64, "%016llx", (unsigned long long)m->plan_hash);
    snprintf(v[7], 64, "%.17g", m->loss_scale);
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
                           v[7]};
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
    st = pcs_st_write(path, e, n, meta, nm / 2);
out:
    free(meta);
    free(txt);
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

/* Parse COMPLETE of `sdir`. *legacy = 1 for the old "ok" marker (m untouched). */
static pcs_status_t manifest_read(const char *sdir, manifest_t *m, int *legacy)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/COMPLETE", sdir);
    FILE *f = NULL;
    pcs_status_t ost = pcs_file_fopen_read(path, "checkpoint manifest", "r", &f);
    if (ost == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "checkpoint %s is incomplete (no COMPLETE)", sdir);
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
    pcs_ckpt_rank_meta_t mm = *m;
    mm.units = f->units;
    mm.n_units = f->n_units;
    return pcs_ckpt_write_rank(dir, &mm, f->e, f->n);
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
    if (!dir || !plan || plan->world_size == 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint commit: dir and plan required");
    char sdir[1024], path[1100];
    pcs_ckpt_step_dir(dir, step, sdir, sizeof sdir);
    PCS_CHECK(mkdir_p(sdir));
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
        snprintf(path, sizeof path, "%s/rank-%05u.safetensors", sdir, r);
        PCS_CHECK_GOTO(pcs_st_open(path, &f), st, out);
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
        if (stat(path, &sb) != 0) {
            st = pcs_set_error(PCS_ERR_SYSTEM, "stat %s: %s", path, strerror(errno));
            goto out;
        }
        o += (size_t)snprintf(man + o, cap - o, "file %u rank-%05u.safetensors %lld\n", r, r,
                              (long long)sb.st_size);
    }
    size_t len = pcs__v1__plan__get_packed_size(plan);
    PCS_CHECK_GOTO(pcs_calloc(len ? len : 1, 1, (void **)&buf), st, out);
    pcs__v1__plan__pack(plan, buf);
    snprintf(path, sizeof path, "%s/plan.pb", sdir);
    PCS_CHECK_GOTO(write_file_atomic(path, buf, len), st, out);
    snprintf(path, sizeof path, "%s/COMPLETE", sdir);
    PCS_CHECK_GOTO(write_file_atomic(path, man, o), st, out);
    char txt[32];
    int tl = snprintf(txt, sizeof txt, "%llu\n", (unsigned long long)step);
    snprintf(path, sizeof path, "%s/latest", dir);
    st = write_file_atomic(path, txt, (size_t)tl);
out:
    pcs_st_close(f);
    free(man);
    free(buf);
    return st;
}

/* pcs' own names inside a step directory (and write_file_atomic's / pcs_st_write's temps). */
static int own_file(const char *name)
{
    unsigned r;
    char tail[32];
    if (!strcmp(name, "plan.pb") || !strcmp(name, "COMPLETE") || strstr(name, ".tmp"))
        return 1;
    return sscanf(name, "rank-%5u.safetensor%31s", &r, tail) == 2 && !strcmp(tail, "s");
}

static void remove_step_dir(const char *sdir)
{
    DIR *d = opendir(sdir);
    if (!d)
        return;
    struct dirent *de;
    char path[1400];
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", sdir, de->d_name);
        if (own_file(de->d_name))
            (void)unlink(path);
    }
    closedir(d);
    if (rmdir(sdir) != 0)
        PCS_WARN(PCS_SUB_WORKER, "checkpoint prune: %s kept (%s; not only pcs files)", sdir,
                 strerror(errno));
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

pcs_status_t pcs_ckpt_prune(const char *dir, uint64_t step, uint32_t keep)
{
    if (!dir)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint prune: dir required");
    if (keep == 0)
        keep = 2;
    char sdir[1024];
    manifest_t cur, m;
    int legacy = 0;
    pcs_ckpt_step_dir(dir, step, sdir, sizeof sdir);
    PCS_CHECK(manifest_read(sdir, &cur, &legacy));
    free(cur.sizes);
    if (legacy)
        return pcs_set_error(PCS_ERR_STATE, "%s: committed without a manifest", sdir);
    DIR *d = opendir(dir);
    if (!d)
        return pcs_set_error(PCS_ERR_SYSTEM, "opendir %s: %s", dir, strerror(errno));
    uint64_t *all = NULL, *kept = NULL;
    size_t n_all = 0, cap_all = 0, n_kept = 0, cap_kept = 0;
    pcs_status_t st = PCS_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        unsigned long long s = 0;
        char canon[64];
        if (sscanf(de->d_name, "step-%llu", &s) != 1)
            continue;
        snprintf(canon, sizeof canon, "step-%08llu", s);
        if (strcmp(canon, de->d_name) != 0 || s == step)
            continue; /* not one of ours, or the step just committed */
        PCS_CHECK_GOTO(pcs_grow((void **)&all, &cap_all, n_all + 1, sizeof *all), st, out);
        all[n_all++] = s;
        pcs_ckpt_step_dir(dir, s, sdir, sizeof sdir);
        /* keep candidates: committed (with a manifest) by the same job, below this step */
        if (s < step && manifest_read(sdir, &m, &legacy) == PCS_OK && !legacy) {
            int same = m.step == s && !strcmp(m.job, cur.job);
            free(m.sizes);
            if (same) {
                PCS_CHECK_GOTO(pcs_grow((void **)&kept, &cap_kept, n_kept + 1, sizeof *kept), st,
                               out);
                kept[n_kept++] = s;
            }
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
        pcs_ckpt_step_dir(dir, all[i], sdir, sizeof sdir);
        remove_step_dir(sdir);
    }
out:
    closedir(d);
    free(all);
    free(kept);
    return st;
}

pcs_status_t pcs_ckpt_latest(const char *dir, uint64_t *step)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = NULL;
    pcs_status_t ost = pcs_file_fopen_read(path, "checkpoint", "r", &f);
    if (ost == PCS_ERR_NOT_FOUND)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "no complete checkpoint in %s (%s missing)", dir,
                             path);
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

static pcs_status_t read_whole(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = NULL;
    pcs_status_t ost = pcs_file_fopen_read(path, "checkpoint file", "rb", &f);
    if (ost != PCS_OK)
        return ost;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return pcs_set_error(PCS_ERR_SYSTEM, "size of %s: %s", path, strerror(errno));
    }
    uint8_t *b = malloc((size_t)n + 1);
    if (!b) {
        fclose(f);
        return pcs_set_error(PCS_ERR_NOMEM, "reading %s", path);
    }
    size_t r = fread(b, 1, (size_t)n, f);
    fclose(f);
    if (r != (size_t)n) {
        free(b);
        return pcs_set_error(PCS_ERR_SYSTEM, "short read of %s", path);
    }
    *out = b;
    *len = (size_t)n;
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

pcs_status_t pcs_ckpt_export(const char *dir, uint64_t step, const char *out_path,
                             pcs_ckpt_export_info_t *info)
{
    pcs_status_t st = PCS_OK;
    if (!dir || !out_path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "export: checkpoint dir and output required");
    if (step == 0)
        PCS_CHECK(pcs_ckpt_latest(dir, &step));
    char sdir[1024], path[1100];
    pcs_ckpt_step_dir(dir, step, sdir, sizeof sdir);
    manifest_t man;
    int legacy = 0;
    PCS_CHECK(manifest_read(sdir, &man, &legacy));

    uint8_t *pbuf = NULL;
    size_t plen = 0;
    snprintf(path, sizeof path, "%s/plan.pb", sdir);
    st = read_whole(path, &pbuf, &plen);
    if (st != PCS_OK) {
        free(man.sizes);
        return st;
    }
    Pcs__V1__Plan *plan = pcs__v1__plan__unpack(NULL, plen, pbuf);
    free(pbuf);
    if (!plan) {
        free(man.sizes);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a pcs.v1.Plan", path);
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
        snprintf(path, sizeof path, "%s/rank-%05u.safetensors", sdir, r);
        PCS_CHECK_GOTO(pcs_st_open(path, &files[r]), st, out);
        if (legacy)
            continue;
        /* only the files the commit listed, unchanged since */
        struct stat sb;
        sb.st_size = -1; /* stat failed: the message must not print an unset size */
        if (stat(path, &sb) != 0 || (long long)sb.st_size != man.sizes[r]) {
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
        if (c * sg < un->padded_numel) {
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
        for (size_t p = 0; p < un->n_params; p++) {
            const Pcs__V1__ParamSlot *ps = un->params[p];
            if (ps->numel > c * sg || ps->offset > c * sg - ps->numel ||
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
            for (size_t d = 0; d < ps->n_shape; d++)
                shapes[n_ent][d] = ps->shape[d];
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
            for (size_t d = 0; d < bs->n_shape; d++)
                shapes[n_ent][d] = bs->shape[d];
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
    return st;
}
