/* Test helpers (see test_util.h). Plain POSIX; aborts on setup failures so tests fail loudly. */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *pcs_test_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    char *p = malloc(strlen(base) + strlen(tag) + 32);
    if (!p)
        abort();
    sprintf(p, "%s/pcs-%s-XXXXXX", base, tag);
    if (!mkdtemp(p)) {
        perror("mkdtemp");
        abort();
    }
    return p;
}

void pcs_test_rmtree(const char *path)
{
    if (!path || !*path || strcmp(path, "/") == 0)
        return;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}

const char *pcs_test_bin(const char *name)
{
    static _Thread_local char buf[8][1024];
    static _Thread_local int idx;
    char *b = buf[idx++ % 8];
    const char *dir = getenv("PCS_BIN_DIR");
    snprintf(b, 1024, "%s/%s", dir && *dir ? dir : "./bin", name);
    return b;
}

const char *pcs_test_src(const char *rel, char *buf, size_t n)
{
    const char *dir = getenv("PCS_SOURCE_DIR");
    snprintf(buf, n, "%s/%s", dir && *dir ? dir : ".", rel);
    return buf;
}

pid_t pcs_test_spawn(char *const argv[], const char *log_path)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (log_path) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "execv %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

void pcs_test_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int pcs_test_wait(pid_t pid, int timeout_ms)
{
    int status;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0)
            return -1;
        pcs_test_sleep_ms(10);
    }
    return -1;
}

int pcs_test_stop(pid_t pid, int timeout_ms)
{
    if (pid <= 0)
        return -1;
    kill(pid, SIGTERM);
    int st = pcs_test_wait(pid, timeout_ms);
    if (st == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    return st;
}

char *pcs_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            b = realloc(b, cap);
        }
    }
    fclose(f);
    if (!b)
        return NULL;
    b[n] = '\0';
    if (len)
        *len = n;
    return b;
}

char *pcs_test_wait_file(const char *path, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        size_t n = 0;
        char *s = pcs_test_read_file(path, &n);
        if (s && n > 0 && s[n - 1] == '\n')
            return s;
        free(s);
        pcs_test_sleep_ms(10);
    }
    return NULL;
}

char *pcs_test_run(const char *cmd, int *status)
{
    fflush(NULL);
    FILE *p = popen(cmd, "r");
    if (!p) {
        *status = -1;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            b = realloc(b, cap);
        }
    }
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (b)
        b[n] = '\0';
    return b;
}

pid_t pcs_test_start_coordinator(const char *dir, const char *const *extra_args, char *addr,
                                 size_t addr_len)
{
    char port_file[1024], log_file[1024];
    snprintf(port_file, sizeof port_file, "%s/coord.port", dir);
    snprintf(log_file, sizeof log_file, "%s/coord.log", dir);
    unlink(port_file);
    const char *argv[64];
    int n = 0;
    argv[n++] = pcs_test_bin("pcs-coordinator");
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = port_file;
    for (int i = 0; extra_args && extra_args[i] && n < 62; i++)
        argv[n++] = extra_args[i];
    argv[n] = NULL;
    pid_t pid = pcs_test_spawn((char *const *)argv, log_file);
    if (pid < 0)
        return -1;
    char *port = pcs_test_wait_file(port_file, 10000);
    if (!port) {
        pcs_test_stop(pid, 1000);
        return -1;
    }
    snprintf(addr, addr_len, "127.0.0.1:%d", atoi(port));
    free(port);
    return pid;
}

unsigned pcs_test_simulated_cuda_devices(void)
{
    const char *e = getenv("PCS_SIMULATE_CUDA");
    long n = e && *e ? strtol(e, NULL, 10) : 0;
    return n > 0 && n <= 64 ? (unsigned)n : 0;
}

int pcs_test_promtool_check(const char *path, char **report)
{
    int st = -1;
    *report = NULL;
    free(pcs_test_run("command -v promtool", &st));
    if (st != 0) {
        const char *req = getenv("PCS_REQUIRE_TOOLS");
        if (req && strcmp(req, "1") == 0) {
            *report = strdup("promtool is not installed (deploy/install-deps.sh installs it)");
            return 1;
        }
        fprintf(stderr, "SKIP: promtool not installed (deploy/install-deps.sh installs it)\n");
        return 77;
    }
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
    *report = pcs_test_run(cmd, &st);
    return st == 0 ? 0 : 1;
}

int pcs_test_exposition_grouped(const char *text, char *why, size_t n)
{
    char family[256] = "";
    char seen[64][256]; /* families already closed: one may not come back */
    int n_seen = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), l);
        l = e ? e + 1 : NULL;
        if (!strncmp(line, "# TYPE ", 7)) {
            char name[256];
            if (sscanf(line + 7, "%255s", name) != 1)
                continue;
            for (int i = 0; i < n_seen; i++)
                if (!strcmp(seen[i], name)) {
                    snprintf(why, n, "family %s declared twice: %s", name, line);
                    return 0;
                }
            if (family[0] && n_seen < 64)
                snprintf(seen[n_seen++], sizeof seen[0], "%s", family);
            snprintf(family, sizeof family, "%s", name);
            continue;
        }
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char name[256];
        size_t k = strcspn(line, "{ ");
        snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name ? k : sizeof name - 1), line);
        static const char *const suffix[] = {"_bucket", "_sum", "_count", "_total"};
        int ok = !strcmp(name, family);
        for (size_t i = 0; i < 4 && !ok; i++) {
            size_t nl = strlen(name), sl = strlen(suffix[i]);
            ok = nl > sl && !strcmp(name + nl - sl, suffix[i]) && strlen(family) == nl - sl &&
                 !strncmp(name, family, nl - sl);
        }
        if (!ok) {
            snprintf(why, n, "sample of %s under # TYPE %s: %s", name, family, line);
            return 0;
        }
    }
    return 1;
}
