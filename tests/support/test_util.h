/* Test helpers: temp dirs, spawning real processes and killing them by pid, reading files.
 * Used by unit and integration tests; not part of any shipped binary. */
#ifndef PCS_TEST_UTIL_H
#define PCS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* mkdtemp under $TMPDIR (or /tmp); returns a malloc'd path. Aborts the test program on failure. */
char *pcs_test_tmpdir(const char *tag);
/* rm -rf path (best effort). */
void pcs_test_rmtree(const char *path);
/* Path of a built binary: $PCS_BIN_DIR/name (falls back to ./bin/name). Static buffer. */
const char *pcs_test_bin(const char *name);
/* Path under the source tree: $PCS_SOURCE_DIR/rel. Static buffer (one per call site is fine). */
const char *pcs_test_src(const char *rel, char *buf, size_t n);

/* fork+exec argv (NULL-terminated) with stdout/stderr redirected to `log_path` (NULL: inherit).
 * Returns the child's pid, or -1. */
pid_t pcs_test_spawn(char *const argv[], const char *log_path);
/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit status as from waitpid. */
int pcs_test_stop(pid_t pid, int timeout_ms);
/* Wait for the child to exit by itself up to timeout_ms; returns waitpid status or -1 on timeout.
 */
int pcs_test_wait(pid_t pid, int timeout_ms);

/* Wait until `path` exists and is non-empty (up to timeout_ms); read it into a malloc'd string. */
char *pcs_test_wait_file(const char *path, int timeout_ms);
/* Read a whole file (NULL if missing). Caller frees. */
char *pcs_test_read_file(const char *path, size_t *len);
/* Run a shell command, capture stdout into a malloc'd string; *status = exit code. */
char *pcs_test_run(const char *cmd, int *status);
/* `promtool check metrics` on the exposition in `path`: 0 clean, 1 problems (*report: what
 * promtool said, malloc'd), 77 promtool is not installed (1 with PCS_REQUIRE_TOOLS=1, as CI sets:
 * a missing tool fails there instead of skipping). */
int pcs_test_promtool_check(const char *path, char **report);
/* The Prometheus text exposition `text` keeps each family's samples together, right after its
 * `# TYPE` line (the format requires it; OpenMetrics parsers reject anything else, promtool does
 * not check it). 1 if so; else 0 with the first offending line in why. */
int pcs_test_exposition_grouped(const char *text, char *why, size_t n);
/* Sleep ms milliseconds. */
void pcs_test_sleep_ms(int ms);

/* The simulated cuda device a test process should switch on (pcs_backend_simulate_cuda): the
 * device count in PCS_SIMULATE_CUDA (ctest sets 1 for the *_sim entries, as pcs-worker reads its
 * --simulate-cuda from that variable), 0 when unset. */
unsigned pcs_test_simulated_cuda_devices(void);

/* Start pcs-coordinator on 127.0.0.1:0 with extra args; returns pid and fills addr ("127.0.0.1:N").
 * The coordinator writes its bound port to a file given by --port-file. */
pid_t pcs_test_start_coordinator(const char *dir, const char *const *extra_args, char *addr,
                                 size_t addr_len);

#endif
