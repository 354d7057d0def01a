/* pcs/file.h: untrusted paths open without blocking and only as regular files. A FIFO with no
 * writer (which a plain open(2) would wait on forever), a directory and a character device are
 * refused at once with a message naming what they are. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_regular_file_opens_with_its_size),
        cmocka_unit_test(test_a_fifo_without_writer_is_refused_at_once),
        cmocka_unit_test(test_directories_devices_and_missing_files_get_their_own_errors),
    };
    return cmocka_run_group_tests_name("file", tests, NULL, NULL);
}
