/* pcs/file.h: untrusted paths open without blocking and only as regular files. A FIFO with no
 * writer (which a plain open(2) would wait on forever), a directory and a character device are
 * refused at once with a message naming what they are. Roots: a spec path resolves beneath the
 * operator's directory or not at all (`..`, absolute paths elsewhere, symlinks out of the root,
 * absolute symlinks, loops), while links that stay inside are followed; writes never follow a
 * planted link; the coordinator's lexical check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/file.h"
#include "test_util.h"

static void test_a_regular_file_opens_with_its_size(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("file");
    char path[1024];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    FILE *w = fopen(path, "wb");
    assert_non_null(w);
    fputs("hello", w);
    fclose(w);
    int fd = -1;
    uint64_t size = 0;
    assert_int_equal(pcs_file_open_read(path, "data.file.path", &fd, &size), PCS_OK);
    assert_true(fd >= 0);
    assert_int_equal(size, 5);
    char buf[8] = {0};
    assert_int_equal(read(fd, buf, sizeof buf), 5); /* blocking mode again: an ordinary read */
    assert_string_equal(buf, "hello");
    close(fd);
    FILE *f = NULL;
    assert_int_equal(pcs_file_fopen_read(path, "x", "rb", &f), PCS_OK);
    assert_non_null(fgets(buf, sizeof buf, f));
    assert_string_equal(buf, "hello");
    fclose(f);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_a_fifo_without_writer_is_refused_at_once(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("file");
    char path[1024];
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    int fd = 7;
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(pcs_file_open_read(path, "data.file.path", &fd, NULL), PCS_ERR_INVALID_ARG);
    assert_true(pcs_now_ms() - t0 < 1000);
    assert_int_equal(fd, -1);
    char want[1200];
    snprintf(want, sizeof want, "data.file.path %s: not a regular file (a FIFO)", path);
    assert_string_equal(pcs_last_error(), want);
    FILE *f = (FILE *)1;
    assert_int_equal(pcs_file_fopen_read(path, "init.from", "rb", &f), PCS_ERR_INVALID_ARG);
    assert_null(f);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_directories_devices_and_missing_files_get_their_own_errors(void **state)
{
    (void)state;
    int fd;
    assert_int_equal(pcs_file_open_read("/tmp", "npy", &fd, NULL), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "npy /tmp: not a regular file (a directory)");
    assert_int_equal(pcs_file_open_read("/dev/zero", "npy", &fd, NULL), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(), "npy /dev/zero: not a regular file (a character device)");
    assert_int_equal(pcs_file_open_read("/nonexistent/x.npy", "npy", &fd, NULL),
                     PCS_ERR_NOT_FOUND);
    assert_string_equal(pcs_last_error(), "npy /nonexistent/x.npy: No such file or directory");
    assert_int_equal(pcs_file_open_read("", "npy", &fd, NULL), PCS_ERR_INVALID_ARG);
}

static void put(const char *dir, const char *rel, const char *text)
{
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void link_at(const char *dir, const char *target, const char *rel)
{
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    assert_int_equal(symlink(target, path), 0);
}

/* Open `path` beneath `root`: the status; on PCS_OK the file's first bytes into got. */
static pcs_status_t open_in(const pcs_root_t *r, const char *path, char *got, size_t n)
{
    int fd = -1;
    uint64_t size = 0;
    pcs_status_t st = pcs_root_open_file(r, path, "data.file.path", &fd, &size);
    if (st == PCS_OK) {
        ssize_t k = read(fd, got, n - 1);
        got[k > 0 ? k : 0] = '\0';
        close(fd);
    }
    return st;
}

static void test_spec_paths_resolve_beneath_their_root_or_not_at_all(void **state)
{
    (void)state;
    char *base = pcs_test_tmpdir("root");
    char root[1100], path[1300];
    snprintf(root, sizeof root, "%s/data", base);
    assert_int_equal(mkdir(root, 0755), 0);
    snprintf(path, sizeof path, "%s/sub", root);
    assert_int_equal(mkdir(path, 0755), 0);
    put(base, "secret", "SECRET42");
    put(root, "train.bin", "train");
    put(root, "sub/x.bin", "x");
    link_at(root, "sub/x.bin", "inside");       /* relative, stays inside */
    link_at(root, "../data/train.bin", "round"); /* climbs to the root's own name: refused */
    link_at(root, "../secret", "out");          /* leaves the root */
    link_at(root, "/etc/hostname", "abs");      /* absolute */
    link_at(root, "loop", "loop");
    link_at(root, "sub", "subdir"); /* a link to a directory inside */
    snprintf(path, sizeof path, "%s/fifo", root);
    assert_int_equal(mkfifo(path, 0600), 0);
    pcs_root_t *r = NULL;
    assert_int_equal(pcs_root_open(root, "data root", &r), PCS_OK);
    char got[64];
    assert_int_equal(open_in(r, "train.bin", got, sizeof got), PCS_OK);
    assert_string_equal(got, "train");
    assert_int_equal(open_in(r, "./sub/../train.bin", got, sizeof got), PCS_OK);
    assert_string_equal(got, "train");
    assert_int_equal(open_in(r, "inside", got, sizeof got), PCS_OK);
    assert_string_equal(got, "x");
    assert_int_equal(open_in(r, "subdir/x.bin", got, sizeof got), PCS_OK);
    snprintf(path, sizeof path, "%s/sub/x.bin", root); /* absolute, under the root */
    assert_int_equal(open_in(r, path, got, sizeof got), PCS_OK);
    assert_string_equal(got, "x");
    /* escapes */
    assert_int_equal(open_in(r, "../secret", got, sizeof got), PCS_ERR_PERMISSION);
    assert_non_null(strstr(pcs_last_error(), "data.file.path: ../secret climbs above the "
                                             "worker's data root"));
    assert_int_equal(open_in(r, "sub/../../secret", got, sizeof got), PCS_ERR_PERMISSION);
    snprintf(path, sizeof path, "%s/secret", base);
    assert_int_equal(open_in(r, path, got, sizeof got), PCS_ERR_PERMISSION);
    assert_non_null(strstr(pcs_last_error(), "is outside the worker's data root"));
    snprintf(path, sizeof path, "%s/../secret", root); /* absolute, lexically under the root */
    assert_int_equal(open_in(r, path, got, sizeof got), PCS_ERR_PERMISSION);
    assert_int_equal(open_in(r, "/etc/hostname", got, sizeof got), PCS_ERR_PERMISSION);
    assert_int_equal(open_in(r, "out", got, sizeof got), PCS_ERR_PERMISSION);
    assert_int_equal(open_in(r, "round", got, sizeof got), PCS_ERR_PERMISSION);
    assert_int_equal(open_in(r, "abs", got, sizeof got), PCS_ERR_PERMISSION);
    assert_non_null(strstr(pcs_last_error(), "absolute symlink"));
    assert_int_equal(open_in(r, "loop", got, sizeof got), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "too many symlinks"));
    /* not files: a FIFO is refused at once, a directory is not a file */
    uint64_t t0 = pcs_now_ms();
    assert_int_equal(open_in(r, "fifo", got, sizeof got), PCS_ERR_INVALID_ARG);
    assert_true(pcs_now_ms() - t0 < 2000);
    assert_non_null(strstr(pcs_last_error(), "a FIFO"));
    assert_int_equal(open_in(r, "sub", got, sizeof got), PCS_ERR_INVALID_ARG);
    assert_int_equal(open_in(r, "missing.bin", got, sizeof got), PCS_ERR_NOT_FOUND);
    assert_int_equal(open_in(r, "", got, sizeof got), PCS_ERR_INVALID_ARG);
    /* directories: made beneath the root, never through a link out of it */
    int fd = -1;
    assert_int_equal(pcs_root_open_dir(r, "ckpt/job-1", "checkpoint.dir", 1, &fd), PCS_OK);
    close(fd);
    snprintf(path, sizeof path, "%s/ckpt/job-1", root);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    link_at(root, "..", "up");
    assert_int_equal(pcs_root_open_dir(r, "up/elsewhere", "checkpoint.dir", 1, &fd),
                     PCS_ERR_PERMISSION);
    snprintf(path, sizeof path, "%s/elsewhere", base);
    assert_int_not_equal(stat(path, &sb), 0); /* nothing was made outside */
    assert_true(pcs_root_is_dir(r, "sub"));
    assert_false(pcs_root_is_dir(r, "train.bin"));
    assert_false(pcs_root_is_dir(r, "out"));
    pcs_root_close(r);
    /* a root of "/" lets every absolute path through (no confinement, said by the operator) */
    assert_int_equal(pcs_root_open("/", "data root", &r), PCS_OK);
    snprintf(path, sizeof path, "%s/secret", base);
    assert_int_equal(open_in(r, path, got, sizeof got), PCS_OK);
    assert_string_equal(got, "SECRET42");
    pcs_root_close(r);
    pcs_test_rmtree(base);
    free(base);
}

/* Writes go to an exclusive random temp name and are renamed over the target: a link planted at
 * the target or at any temp name is replaced, never written through. */
static void test_writes_never_follow_a_planted_link(void **state)
{
    (void)state;
    char *dir = pcs_test_tmpdir("write");
    put(dir, "victim", "keep me");
    char victim[1100];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    link_at(dir, victim, "latest");
    link_at(dir, victim, "latest.tmp.0000000000000000");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    assert_int_equal(pcs_file_write_atomic_at(dfd, "latest", "ckpt/latest", "7\n", 2), PCS_OK);
    char *v = pcs_test_read_file(victim, NULL);
    assert_string_equal(v, "keep me");
    free(v);
    struct stat sb;
    char latest[1100];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    assert_int_equal(lstat(latest, &sb), 0);
    assert_true(S_ISREG(sb.st_mode)); /* the link itself was replaced */
    /* a subdirectory that is a link is not entered; a reader does not follow one either */
    link_at(dir, "/tmp", "step-00000001");
    int sfd = -1;
    assert_int_equal(pcs_file_subdir_at(dfd, "step-00000001", "ckpt/step-00000001", 1, &sfd),
                     PCS_ERR_INVALID_ARG);
    int rfd = -1;
    assert_int_equal(pcs_file_open_read_at(dfd, "latest.tmp.0000000000000000", "x", "checkpoint",
                                           &rfd, NULL),
                     PCS_ERR_INVALID_ARG);
    close(dfd);
    pcs_test_rmtree(dir);
    free(dir);
}

static void test_the_coordinator_checks_path_syntax(void **state)
{
    (void)state;
    assert_int_equal(pcs_path_check_syntax("data/train.bin", "data.file.path"), PCS_OK);
    assert_int_equal(pcs_path_check_syntax("/data/x/../y", "data.file.path"), PCS_OK);
    assert_int_equal(pcs_path_check_syntax("a/./b/..", "data.file.path"), PCS_OK);
    assert_int_equal(pcs_path_check_syntax("a/../../b", "checkpoint.dir"), PCS_ERR_INVALID_ARG);
    assert_string_equal(pcs_last_error(),
                        "checkpoint.dir: 'a/../../b' climbs above where it starts ('..')");
    assert_int_equal(pcs_path_check_syntax("../shared", "checkpoint.dir"), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_path_check_syntax("/..", "init.from"), PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_path_check_syntax("", "init.from"), PCS_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_regular_file_opens_with_its_size),
        cmocka_unit_test(test_a_fifo_without_writer_is_refused_at_once),
        cmocka_unit_test(test_directories_devices_and_missing_files_get_their_own_errors),
        cmocka_unit_test(test_spec_paths_resolve_beneath_their_root_or_not_at_all),
        cmocka_unit_test(test_writes_never_follow_a_planted_link),
        cmocka_unit_test(test_the_coordinator_checks_path_syntax),
    };
    return cmocka_run_group_tests_name("file", tests, NULL, NULL);
}
