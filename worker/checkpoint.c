/* Sharded checkpoint files and export (see checkpoint.h for the layout). Rank files are plain
 * safetensors so that any tool can inspect them; the plan saved next to them is what gives the
 * shards meaning, so export needs no coordinator and no worker. */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pcs/dtype.h"
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
    if (!dir || !m)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "checkpoint: dir and meta required");
    char sdir[1024], path[1100];
    pcs_ckpt_step_dir(dir, m->step, sdir, sizeof sdir);
    PCS_CHECK(mkdir_p(sdir));
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
    const char *meta[] = {"format",
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
    return pcs_st_write(path, e, n, meta, sizeof meta / sizeof meta[0] / 2);
}

pcs_status_t pcs_ckpt_commit(const char *dir, uint64_t step, const Pcs__V1__Plan *plan)
{
    char sdir[1024], path[1100];
    pcs_ckpt_step_dir(dir, step, sdir, sizeof sdir);
    PCS_CHECK(mkdir_p(sdir));
    size_t len = pcs__v1__plan__get_packed_size(plan);
    uint8_t *buf = NULL;
    PCS_CHECK(pcs_calloc(len ? len : 1, 1, (void **)&buf));
    pcs__v1__plan__pack(plan, buf);
    snprintf(path, sizeof path, "%s/plan.pb", sdir);
    pcs_status_t st = write_file_atomic(path, buf, len);
    free(buf);
    PCS_CHECK(st);
    snprintf(path, sizeof path, "%s/COMPLETE", sdir);
    PCS_CHECK(write_file_atomic(path, "ok\n", 3));
    char txt[32];
    int tl = snprintf(txt, sizeof txt, "%llu\n", (unsigned long long)step);
    snprintf(path, sizeof path, "%s/latest", dir);
    return write_file_atomic(path, txt, (size_t)tl);
}

pcs_status_t pcs_ckpt_latest(const char *dir, uint64_t *step)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "no complete checkpoint in %s (%s missing)", dir,
                             path);
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
    FILE *f = fopen(path, "rb");
    if (!f)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "open %s: %s", path, strerror(errno));
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
    snprintf(path, sizeof path, "%s/COMPLETE", sdir);
    if (access(path, F_OK) != 0)
        return pcs_set_error(PCS_ERR_NOT_FOUND, "checkpoint %s is incomplete (no COMPLETE)", sdir);

    uint8_t *pbuf = NULL;
    size_t plen = 0;
    snprintf(path, sizeof path, "%s/plan.pb", sdir);
    PCS_CHECK(read_whole(path, &pbuf, &plen));
    Pcs__V1__Plan *plan = pcs__v1__plan__unpack(NULL, plen, pbuf);
    free(pbuf);
    if (!plan)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a pcs.v1.Plan", path);

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
    for (uint32_t r = 0; r < W; r++) {
        snprintf(path, sizeof path, "%s/rank-%05u.safetensors", sdir, r);
        PCS_CHECK_GOTO(pcs_st_open(path, &files[r]), st, out);
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
                if (meta_u32(files[r], "replicate_index", 0) == 0 &&
                    meta_u32(files[r], "shard_index", 0) == s && pcs_st_find(files[r], key))
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
                if (meta_u32(files[r], "replicate_index", 0) == 0 &&
                    meta_u32(files[r], "shard_index", 0) == 0 && pcs_st_find(files[r], bkey))
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
    protobuf_c_message_free_unpacked(&plan->base, NULL);
    return st;
}
