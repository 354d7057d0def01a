/* File-backed rendezvous store for tests and benches that run without a coordinator: one file per
 * key in a directory, written to a unique temp name and renamed (atomic on POSIX), read by
 * polling. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/kv.h"
#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/mem.h"

// ---- file store ----

typedef struct kv_file {
    pcs_kv_t base;
    char *dir;
} kv_file_t;

/* Keys contain '/' (group prefixes); map every byte outside [A-Za-z0-9._-] to %XX so that each
 * key is one flat, unambiguous file name. */
static void key_to_path(const kv_file_t *f, const char *key, char *buf, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = (size_t)snprintf(buf, n, "%s/k_", f->dir);
    for (const char *p = key; *p && o + 4 < n; p++) {
        unsigned char ch = (unsigned char)*p;
        int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        if (plain) {
            buf[o++] = (char)ch;
        } else {
            buf[o++] = '%';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        }
    }
    buf[o] = '\0';
}

static pcs_status_t write_all(int fd, const void *p, size_t len)
{
    const char *c = p;
    while (len > 0) {
        ssize_t w = write(fd, c, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return PCS_ERR_SYSTEM;
        }
        c += w;
        len -= (size_t)w;
    }
    return PCS_OK;
}

static pcs_status_t file_set(pcs_kv_t *kv, const char *key, const void *val, size_t len)
{
    kv_file_t *f = (kv_file_t *)kv;
    char path[PCS_KV_MAX_KEY * 3 + 512], tmp[sizeof path + 64];
    key_to_path(f, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.XXXXXX", f->dir, (long)getpid());
    int fd = mkstemp(tmp);
    if (fd < 0)
        return pcs_set_error(PCS_ERR_SYSTEM, "kv file: mkstemp in %s: %s", f->dir, strerror(errno));
    pcs_status_t rc = write_all(fd, val, len);
    int err = rc != PCS_OK ? errno : 0;
    if (close(fd) != 0 && rc == PCS_OK) {
        rc = PCS_ERR_SYSTEM;
        err = errno;
    }
    if (rc == PCS_OK && rename(tmp, path) != 0) {
        rc = PCS_ERR_SYSTEM;
        err = errno;
    }
    if (rc != PCS_OK) {
        unlink(tmp);
        return pcs_set_error(rc, "kv file: writing '%s' to %s: %s", key, path, strerror(err));
    }
    return rc;
}

/* PCS_OK and the contents, or PCS_ERR_NOT_FOUND if the file does not exist. */
static pcs_status_t read_file(const char *path, void **val, size_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0 && errno == ENOENT)
        return PCS_ERR_NOT_FOUND;
    if (fd < 0)
        return pcs_set_error(PCS_ERR_SYSTEM, "kv file: open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (size_t)st.st_size > PCS_KV_MAX_VALUE) {
        close(fd);
        return pcs_set_error(PCS_ERR_SYSTEM, "kv file: cannot stat %s or it is too large", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = NULL;
    pcs_status_t rc = pcs_calloc(n + 1, 1, (void **)&buf);
    size_t got = 0;
    while (rc == PCS_OK && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            rc = pcs_set_error(PCS_ERR_SYSTEM, "kv file: short read of %s", path);
        else
            got += (size_t)r;
    }
    close(fd);
    if (rc != PCS_OK) {
        free(buf);
        return rc;
    }
    *val = buf;
    *len = n;
    return PCS_OK;
}

static pcs_status_t file_get(pcs_kv_t *kv, const char *key, int wait_ms, void **val, size_t *len)
{
    kv_file_t *f = (kv_file_t *)kv;
    char path[PCS_KV_MAX_KEY * 3 + 512];
    key_to_path(f, key, path, sizeof path);
    uint64_t deadline = pcs_now_ms() + (uint64_t)wait_ms;
    int sleep_us = 200;
    for (;;) {
        pcs_status_t rc = read_file(path, val, len);
        if (rc != PCS_ERR_NOT_FOUND)
            return rc;
        if (pcs_now_ms() >= deadline)
            return pcs_set_error(PCS_ERR_NOT_FOUND, "kv file: key '%s' not set within %d ms", key,
                                 wait_ms);
        usleep((useconds_t)sleep_us);
        if (sleep_us < 5000) /* back off: rendezvous is latency-sensitive only at first */
            sleep_us *= 2;
    }
}

static void file_destroy(pcs_kv_t *kv)
{
    kv_file_t *f = (kv_file_t *)kv;
    free(f->dir);
    free(f);
}

static const pcs_kv_ops_t file_ops = {"file", file_set, file_get, file_destroy};

pcs_status_t pcs_kv_file_create(const char *dir, pcs_kv_t **out)
{
    if (!dir || !dir[0] || !out)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv file: NULL or empty directory");
    if (strlen(dir) > 256)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "kv file: directory path too long");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return pcs_set_error(PCS_ERR_SYSTEM, "kv file: mkdir %s: %s", dir, strerror(errno));
    kv_file_t *f = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *f, (void **)&f));
    pcs_status_t rc = pcs_strdup(dir, &f->dir);
    if (rc != PCS_OK) {
        free(f);
        return rc;
    }
    f->base.ops = &file_ops;
    *out = &f->base;
    return PCS_OK;
}
