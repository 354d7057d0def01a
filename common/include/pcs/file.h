/* Opening files whose names come from a job spec, a checkpoint directory or the network: never
 * blocking in open(2), and only regular files. A FIFO, a character device or a socket opened
 * O_RDONLY can block until a writer appears, or stream without end; a job naming one must fail
 * with a message, not wedge its workers (issue 11). Operator-chosen inputs (a config file, a
 * spec read from stdin by pcsctl) do not go through here: a pipe is legitimate there. */
#ifndef PCS_FILE_H
#define PCS_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open `path` read-only (close-on-exec) with O_NONBLOCK, so the open returns at once whatever the
 * file is, then require a regular file and clear O_NONBLOCK. `what` prefixes errors ("npy",
 * "data.file.path"). Errors: PCS_ERR_NOT_FOUND (no such file), PCS_ERR_INVALID_ARG (not a
 * regular file: "<what> <path>: not a regular file (a FIFO)"), PCS_ERR_SYSTEM (anything else,
 * with strerror). *fd: close it; *size (may be NULL): its size in bytes. */
pcs_status_t pcs_file_open_read(const char *path, const char *what, int *fd, uint64_t *size);
/* The same as a FILE * opened with `mode` ("r" or "rb"). */
pcs_status_t pcs_file_fopen_read(const char *path, const char *what, const char *mode,
                                 FILE **out);

#ifdef __cplusplus
}
#endif
#endif
