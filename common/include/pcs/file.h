/* Opening files whose names come from a job spec, a checkpoint directory or the network: never
 * blocking in open(2), and only regular files. A FIFO, a character device or a socket opened
 * O_RDONLY can block until a writer appears, or stream without end; a job naming one must fail
 * with a message, not wedge its workers (issue 11). Operator-chosen inputs (a config file, a
 * spec read from stdin by pcsctl) do not go through here: a pipe is legitimate there. */
#ifndef PCS_FILE_H
#define PCS_FILE_H

#include <stddef.h>
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

/* The same relative to a directory descriptor, never following a symlink in `name` (one path
 * component that pcs chose: "COMPLETE", "rank-00001.safetensors"). `what` and `shown` (the path
 * to print) make the messages. */
pcs_status_t pcs_file_open_read_at(int dirfd, const char *name, const char *shown,
                                   const char *what, int *fd, uint64_t *size);

/* ---- writing without following anything (DESIGN.md §10) ----
 * A new file in dirfd under a random name "<name>.tmp.<16 hex>", created O_EXCL | O_NOFOLLOW
 * (mode 0644): a link or file planted under a predictable temp name is never written through.
 * *tmp (n bytes) gets the temp name. */
pcs_status_t pcs_file_create_temp_at(int dirfd, const char *name, char *tmp, size_t n, int *fd);
/* fsync and close `fd`, then rename its temp `tmp` to `name` in dirfd (atomic: readers see the
 * old file or the whole new one); on failure the temp is removed. `shown` names the target in
 * messages. */
pcs_status_t pcs_file_commit_temp_at(int dirfd, int fd, const char *tmp, const char *name,
                                     const char *shown);
/* pcs_file_create_temp_at + write + pcs_file_commit_temp_at of `len` bytes. */
pcs_status_t pcs_file_write_atomic_at(int dirfd, const char *name, const char *shown,
                                      const void *data, size_t len);
/* Open (create = make it, mode 0755, when missing) the subdirectory `name` of dirfd without
 * following a symlink; O_RDONLY | O_DIRECTORY. */
pcs_status_t pcs_file_subdir_at(int dirfd, const char *name, const char *shown, int create,
                                int *fd);

/* ---- roots: where the paths of a job spec may lead (DESIGN.md §10) ----
 * A worker opens data, init and checkpoint paths that a submitter chose. Each kind resolves
 * beneath a directory the operator configured: a relative path from the root, an absolute one
 * only when it lies under the root's path. The walk goes one component at a time from the
 * root's descriptor (openat + O_NOFOLLOW), resolving symlinks itself: a relative link that stays
 * beneath the root is followed; an absolute link, a `..` or a link that climbs above the root,
 * and more than 40 links are refused (the semantics of openat2's RESOLVE_BENEATH, without
 * needing that syscall). Nothing is ever opened through a path string after the check, so a
 * file swapped for a link meanwhile is not followed either. */
typedef struct pcs_root pcs_root_t;

/* Open the operator's directory `path` (symlinks in it are the operator's and are followed). `what`
 * names the setting in errors ("--data-root"). Caller closes. */
pcs_status_t pcs_root_open(const char *path, const char *what, pcs_root_t **out);
void pcs_root_close(pcs_root_t *r); /* accepts NULL */
const char *pcs_root_path(const pcs_root_t *r);

/* A regular file beneath the root, opened read-only without blocking (see pcs_file_open_read).
 * `field` names the spec field in errors ("data.file.path"). Errors: PCS_ERR_PERMISSION when the
 * path leaves the root ("data.file.path: /etc/passwd is outside the worker's data root /data"),
 * PCS_ERR_NOT_FOUND, PCS_ERR_INVALID_ARG (not a regular file, a symlink loop), PCS_ERR_SYSTEM. */
pcs_status_t pcs_root_open_file(const pcs_root_t *r, const char *path, const char *field, int *fd,
                                uint64_t *size);
/* A directory beneath the root (create: made with its missing parents, mode 0755). */
pcs_status_t pcs_root_open_dir(const pcs_root_t *r, const char *path, const char *field,
                               int create, int *fd);
/* Is `path` a directory beneath the root? 1 yes, 0 no (or it does not resolve). */
int pcs_root_is_dir(const pcs_root_t *r, const char *path);

/* Lexical check a coordinator can make without the worker's roots: not empty, no NUL byte, and
 * `..` never climbs above the path's start ("a/../../b" does; "/x/../y" stays under "/"). */
pcs_status_t pcs_path_check_syntax(const char *path, const char *field);

#ifdef __cplusplus
}
#endif
#endif
