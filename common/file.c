/* Non-blocking, regular-files-only opens for untrusted paths, writes that follow no link, and
 * roots that spec paths resolve beneath (see pcs/file.h). */
#define _GNU_SOURCE /* O_PATH, AT_EMPTY_PATH */
#include "pcs/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a file";
}

/* A descriptor just opened with O_NONBLOCK (f >= 0, or -1 with errno): keep it only if it is a
 * regular file, then make it blocking again. */
static pcs_status_t finish_open(int f, const char *what, const char *shown, int *fd,
                                uint64_t *size)
{
    if (f < 0) {
        int e = errno;
        if (e == ELOOP)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: a symlink (not followed)", what,
                                 shown);
        return pcs_set_error(e == ENOENT ? PCS_ERR_NOT_FOUND : PCS_ERR_SYSTEM, "%s %s: %s", what,
                             shown, strerror(e));
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return pcs_set_error(PCS_ERR_SYSTEM, "%s %s: %s", what, shown, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: not a regular file (%s)", what, shown,
                             kind_of(st.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0)
        (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    if (size)
        *size = (uint64_t)st.st_size;
    return PCS_OK;
}

pcs_status_t pcs_file_open_read(const char *path, const char *what, int *fd, uint64_t *size)
{
    *fd = -1;
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: empty path", what);
    return finish_open(open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY), what, path, fd,
                       size);
}

pcs_status_t pcs_file_fopen_read(const char *path, const char *what, const char *mode,
                                 FILE **out)
{
    *out = NULL;
    int fd;
    PCS_CHECK(pcs_file_open_read(path, what, &fd, NULL));
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int e = errno;
        close(fd);
        return pcs_set_error(PCS_ERR_SYSTEM, "%s %s: %s", what, path, strerror(e));
    }
    *out = f;
    return PCS_OK;
}

pcs_status_t pcs_file_open_read_at(int dirfd, const char *name, const char *shown,
                                   const char *what, int *fd, uint64_t *size)
{
    *fd = -1;
    if (!name || !*name || strchr(name, '/'))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: not one path component", what,
                             shown ? shown : "?");
    return finish_open(
        openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW), what, shown,
        fd, size);
}

// ---- writing without following anything ----

static pcs_status_t random_hex(char *out, size_t digits)
{
    uint8_t raw[32];
    size_t want = (digits + 1) / 2, got = 0;
    if (want > sizeof raw)
        want = sizeof raw;
    while (got < want) {
        ssize_t r = getrandom(raw + got, want - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return pcs_set_error(PCS_ERR_SYSTEM, "getrandom: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < digits && i / 2 < want; i++)
        out[i] = hex[(raw[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[digits] = '\0';
    return PCS_OK;
}

pcs_status_t pcs_file_create_temp_at(int dirfd, const char *name, char *tmp, size_t n, int *fd)
{
    *fd = -1;
    for (int attempt = 0; attempt < 8; attempt++) {
        char rnd[17];
        PCS_CHECK(random_hex(rnd, 16));
        if (snprintf(tmp, n, "%s.tmp.%s", name, rnd) >= (int)n)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "temp name for %s too long", name);
        int f = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (f >= 0) {
            *fd = f;
            return PCS_OK;
        }
        if (errno != EEXIST)
            return pcs_set_error(PCS_ERR_SYSTEM, "create %s: %s", tmp, strerror(errno));
    }
    return pcs_set_error(PCS_ERR_SYSTEM, "create a temp file for %s: names taken", name);
}

pcs_status_t pcs_file_commit_temp_at(int dirfd, int fd, const char *tmp, const char *name,
                                     const char *shown)
{
    int sync_err = fsync(fd) != 0 ? errno : 0;
    int close_err = close(fd) != 0 ? errno : 0;
    if (sync_err || close_err) {
        (void)unlinkat(dirfd, tmp, 0);
        return pcs_set_error(PCS_ERR_SYSTEM, "write %s: %s failed: %s", shown,
                             sync_err ? "fsync" : "close",
                             strerror(sync_err ? sync_err : close_err));
    }
    /* renameat replaces a link at `name` itself, never what it points to */
    if (renameat(dirfd, tmp, dirfd, name) != 0) {
        int e = errno;
        (void)unlinkat(dirfd, tmp, 0);
        return pcs_set_error(PCS_ERR_SYSTEM, "write %s: rename failed: %s", shown, strerror(e));
    }
    return PCS_OK;
}

pcs_status_t pcs_file_write_atomic_at(int dirfd, const char *name, const char *shown,
                                      const void *data, size_t len)
{
    char tmp[300];
    int fd;
    PCS_CHECK(pcs_file_create_temp_at(dirfd, name, tmp, sizeof tmp, &fd));
    const uint8_t *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            (void)unlinkat(dirfd, tmp, 0);
            return pcs_set_error(PCS_ERR_SYSTEM, "write %s: %s", shown, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    return pcs_file_commit_temp_at(dirfd, fd, tmp, name, shown);
}

pcs_status_t pcs_file_subdir_at(int dirfd, const char *name, const char *shown, int create,
                                int *fd)
{
    *fd = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        int f = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (f >= 0) {
            *fd = f;
            return PCS_OK;
        }
        int e = errno;
        if (e == ENOENT && create && attempt == 0) {
            if (mkdirat(dirfd, name, 0755) != 0 && errno != EEXIST)
                return pcs_set_error(PCS_ERR_SYSTEM, "mkdir %s: %s", shown, strerror(errno));
            continue;
        }
        if (e == ELOOP || e == ENOTDIR)
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: not a directory (a symlink or a file; "
                                                      "not followed)",
                                 shown);
        return pcs_set_error(e == ENOENT ? PCS_ERR_NOT_FOUND : PCS_ERR_SYSTEM, "%s: %s", shown,
                             strerror(e));
    }
    return pcs_set_error(PCS_ERR_SYSTEM, "%s: cannot open", shown);
}

// ---- roots ----

#define ROOT_MAX_DEPTH 256 /* directories deep below a root */
#define ROOT_MAX_LINKS 40  /* as the kernel's MAXSYMLINKS */
#define ROOT_PATH_MAX  4096

struct pcs_root {
    int fd;
    char *path;  /* as configured, without trailing '/' (absolute) */
    char *canon; /* realpath of it */
    char what[48];
};

static char *dup_trimmed(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

pcs_status_t pcs_root_open(const char *path, const char *what, pcs_root_t **out)
{
    *out = NULL;
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: empty", what);
    char canon[PATH_MAX];
    if (!realpath(path, canon))
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: %s", what, path, strerror(errno));
    pcs_root_t *r = calloc(1, sizeof *r);
    if (!r)
        return pcs_set_error(PCS_ERR_NOMEM, "%s: out of memory", what);
    r->fd = open(canon, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    snprintf(r->what, sizeof r->what, "%s", what);
    char abs[PATH_MAX];
    if (path[0] == '/')
        snprintf(abs, sizeof abs, "%s", path);
    else
        snprintf(abs, sizeof abs, "%s", canon); /* a relative setting is shown as resolved */
    r->path = dup_trimmed(abs);
    r->canon = dup_trimmed(canon);
    if (r->fd < 0 || !r->path || !r->canon) {
        int e = errno;
        pcs_root_close(r);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: not a directory we can open: %s", what,
                             path, strerror(e));
    }
    *out = r;
    return PCS_OK;
}

void pcs_root_close(pcs_root_t *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->path);
    free(r->canon);
    free(r);
}

const char *pcs_root_path(const pcs_root_t *r)
{
    return r ? r->path : "";
}

/* `path` relative to the root: itself when relative; the rest after the root's path (as
 * configured or canonical) when absolute; NULL when an absolute path lies elsewhere. */
static const char *beneath(const pcs_root_t *r, const char *path)
{
    if (path[0] != '/')
        return path;
    const char *bases[2] = {r->path, r->canon};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(bases[i]);
        if (n == 1) /* the root is "/" */
            return path + 1;
        if (strncmp(path, bases[i], n) == 0 && (path[n] == '/' || path[n] == '\0'))
            return path[n] ? path + n + 1 : path + n;
    }
    return NULL;
}

typedef struct walk {
    int fds[ROOT_MAX_DEPTH + 1]; /* fds[0] = dup of the root */
    int depth;
    /* components still to walk, back to front in `buf` (a stack of strings) */
    char buf[2 * ROOT_PATH_MAX];
    size_t used;
    const char *comps[2 * ROOT_PATH_MAX / 2];
    int n;
} walk_t;

static void walk_free(walk_t *w)
{
    for (int i = 0; i <= w->depth; i++)
        if (w->fds[i] >= 0)
            close(w->fds[i]);
}

/* Push the components of `p` so that the first is walked next. */
static int walk_push(walk_t *w, const char *p)
{
    size_t len = strlen(p);
    if (w->used + len + 1 > sizeof w->buf)
        return -1;
    char *copy = w->buf + w->used;
    memcpy(copy, p, len + 1);
    w->used += len + 1;
    const char *parts[ROOT_PATH_MAX / 2];
    int k = 0;
    for (char *s = copy; *s;) {
        while (*s == '/')
            *s++ = '\0';
        if (!*s)
            break;
        if (k == (int)(sizeof parts / sizeof parts[0]))
            return -1;
        parts[k++] = s;
        while (*s && *s != '/')
            s++;
    }
    if (w->n + k > (int)(sizeof w->comps / sizeof w->comps[0]))
        return -1;
    for (int i = k - 1; i >= 0; i--)
        if (strcmp(parts[i], ".") != 0)
            w->comps[w->n++] = parts[i];
    return 0;
}

/* Component `c` of `path` is a link to `target`: walk the target next (a relative one, within the
 * link budget), or refuse it. */
static pcs_status_t follow_link(const pcs_root_t *r, walk_t *w, int *links, const char *target,
                                const char *c, const char *path, const char *field)
{
    if (++*links > ROOT_MAX_LINKS)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s: too many symlinks", field, path);
    if (target[0] == '/')
        return pcs_set_error(PCS_ERR_PERMISSION,
                             "%s: %s leads through an absolute symlink (%s): not followed beneath "
                             "the worker's %s",
                             field, path, c, r->what);
    if (walk_push(w, target) != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s: symlinks too long", field, path);
    return PCS_OK;
}

/* Walk `path` beneath r. The last component is left for the caller in *last (NULL when the path
 * names the root itself or ends in ".."), with w->fds[w->depth] its directory. Intermediate
 * directories are made when `mkdirs`. */
static pcs_status_t walk_to_parent(const pcs_root_t *r, const char *path, const char *field,
                                   int mkdirs, walk_t *w, const char **last)
{
    memset(w->fds, -1, sizeof w->fds);
    w->depth = 0;
    w->used = 0;
    w->n = 0;
    *last = NULL;
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: empty path", field);
    if (strlen(path) >= ROOT_PATH_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: longer than %d bytes", field,
                             ROOT_PATH_MAX - 1);
    const char *rel = beneath(r, path);
    if (!rel)
        return pcs_set_error(PCS_ERR_PERMISSION, "%s: %s is outside the worker's %s %s", field,
                             path, r->what, r->path);
    w->fds[0] = dup(r->fd);
    if (w->fds[0] < 0)
        return pcs_set_error(PCS_ERR_SYSTEM, "%s: %s", field, strerror(errno));
    if (walk_push(w, rel) != 0)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: too many path components", field);
    int links = 0;
    while (w->n > 0) {
        const char *c = w->comps[--w->n];
        if (strcmp(c, "..") == 0) {
            if (w->depth == 0)
                return pcs_set_error(PCS_ERR_PERMISSION,
                                     "%s: %s climbs above the worker's %s %s", field, path,
                                     r->what, r->path);
            close(w->fds[w->depth]);
            w->fds[w->depth--] = -1;
            continue;
        }
        if (w->n == 0) { /* the last component: resolve a link, else leave it to the caller */
            char target[ROOT_PATH_MAX];
            ssize_t tl = readlinkat(w->fds[w->depth], c, target, sizeof target - 1);
            if (tl < 0) {
                *last = c;
                return PCS_OK;
            }
            target[tl] = '\0';
            PCS_CHECK(follow_link(r, w, &links, target, c, path, field));
            continue;
        }
        int fd = openat(w->fds[w->depth], c, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT && mkdirs) {
            if (mkdirat(w->fds[w->depth], c, 0755) != 0 && errno != EEXIST)
                return pcs_set_error(PCS_ERR_SYSTEM, "%s: mkdir %s in %s: %s", field, c, path,
                                     strerror(errno));
            fd = openat(w->fds[w->depth], c, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        }
        if (fd < 0) {
            int e = errno;
            return pcs_set_error(e == ENOENT ? PCS_ERR_NOT_FOUND : PCS_ERR_SYSTEM, "%s: %s: %s",
                                 field, path, strerror(e));
        }
        struct stat st;
        if (fstatat(fd, "", &st, AT_EMPTY_PATH) != 0) {
            int e = errno;
            close(fd);
            return pcs_set_error(PCS_ERR_SYSTEM, "%s: %s: %s", field, path, strerror(e));
        }
        if (S_ISLNK(st.st_mode)) {
            char target[ROOT_PATH_MAX];
            ssize_t tl = readlinkat(fd, "", target, sizeof target - 1);
            close(fd);
            if (tl < 0)
                return pcs_set_error(PCS_ERR_SYSTEM, "%s: %s: %s", field, path, strerror(errno));
            target[tl] = '\0';
            PCS_CHECK(follow_link(r, w, &links, target, c, path, field));
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            close(fd);
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s: %s is not a directory", field, path,
                                 c);
        }
        if (w->depth == ROOT_MAX_DEPTH) {
            close(fd);
            return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: %s: too deep", field, path);
        }
        w->fds[++w->depth] = fd;
    }
    return PCS_OK; /* the path names a directory already on the stack */
}

pcs_status_t pcs_root_open_file(const pcs_root_t *r, const char *path, const char *field, int *fd,
                                uint64_t *size)
{
    *fd = -1;
    if (!r)
        return pcs_file_open_read(path, field, fd, size);
    walk_t *w = malloc(sizeof *w);
    if (!w)
        return pcs_set_error(PCS_ERR_NOMEM, "%s: out of memory", field);
    const char *last = NULL;
    pcs_status_t st = walk_to_parent(r, path, field, 0, w, &last);
    if (st == PCS_OK && !last)
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: not a regular file (a directory)", field,
                           path);
    if (st == PCS_OK)
        st = pcs_file_open_read_at(w->fds[w->depth], last, path, field, fd, size);
    walk_free(w);
    free(w);
    return st;
}

pcs_status_t pcs_root_open_dir(const pcs_root_t *r, const char *path, const char *field,
                               int create, int *fd)
{
    *fd = -1;
    if (!r) {
        int f = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (f < 0 && errno == ENOENT && create) {
            /* an operator's own path (tools, tests): made with its parents */
            char tmp[ROOT_PATH_MAX];
            if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
                return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: path too long", field);
            for (char *p = tmp + 1; *p; p++)
                if (*p == '/') {
                    *p = '\0';
                    (void)mkdir(tmp, 0755);
                    *p = '/';
                }
            (void)mkdir(tmp, 0755);
            f = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        }
        if (f < 0)
            return pcs_set_error(errno == ENOENT ? PCS_ERR_NOT_FOUND : PCS_ERR_SYSTEM, "%s %s: %s",
                                 field, path, strerror(errno));
        *fd = f;
        return PCS_OK;
    }
    walk_t *w = malloc(sizeof *w);
    if (!w)
        return pcs_set_error(PCS_ERR_NOMEM, "%s: out of memory", field);
    const char *last = NULL;
    pcs_status_t st = walk_to_parent(r, path, field, create, w, &last);
    if (st == PCS_OK && last)
        st = pcs_file_subdir_at(w->fds[w->depth], last, path, create, fd);
    else if (st == PCS_OK) {
        *fd = openat(w->fds[w->depth], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (*fd < 0)
            st = pcs_set_error(PCS_ERR_SYSTEM, "%s %s: %s", field, path, strerror(errno));
    }
    walk_free(w);
    free(w);
    return st;
}

int pcs_root_is_dir(const pcs_root_t *r, const char *path)
{
    if (!r) {
        struct stat st;
        return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    }
    int fd = -1;
    pcs_status_t st = pcs_root_open_dir(r, path, "path", 0, &fd);
    if (fd >= 0)
        close(fd);
    return st == PCS_OK;
}

pcs_status_t pcs_path_check_syntax(const char *path, const char *field)
{
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: empty path", field);
    if (strlen(path) >= ROOT_PATH_MAX)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: longer than %d bytes", field,
                             ROOT_PATH_MAX - 1);
    long depth = 0;
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        const char *e = p;
        while (*e && *e != '/')
            e++;
        size_t n = (size_t)(e - p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (--depth < 0)
                return pcs_set_error(PCS_ERR_INVALID_ARG,
                                     "%s: '%s' climbs above where it starts ('..')", field, path);
        } else if (n && !(n == 1 && p[0] == '.')) {
            depth++;
        }
        p = e;
    }
    return PCS_OK;
}
