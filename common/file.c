/* Non-blocking, regular-files-only opens for untrusted paths (see pcs/file.h). */
#include "pcs/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
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

pcs_status_t pcs_file_open_read(const char *path, const char *what, int *fd, uint64_t *size)
{
    *fd = -1;
    if (!path || !*path)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s: empty path", what);
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) {
        int e = errno;
        return pcs_set_error(e == ENOENT ? PCS_ERR_NOT_FOUND : PCS_ERR_SYSTEM, "%s %s: %s", what,
                             path, strerror(e));
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return pcs_set_error(PCS_ERR_SYSTEM, "%s %s: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return pcs_set_error(PCS_ERR_INVALID_ARG, "%s %s: not a regular file (%s)", what, path,
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
