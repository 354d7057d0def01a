/* CPUs available to this process (see pcs/cpu.h). */
#define _GNU_SOURCE
#include "pcs/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int pcs_cpu_quota_parse(const char *cpu_max)
{
    if (!cpu_max)
        return 0;
    char quota[32];
    unsigned long long period = 0;
    if (sscanf(cpu_max, "%31s %llu", quota, &period) != 2 || period == 0)
        return 0;
    char *end = NULL;
    unsigned long long q = strtoull(quota, &end, 10);
    if (end == quota || *end || q == 0)
        return 0; /* "max": no limit */
    unsigned long long n = (q + period - 1) / period;
    return n > 1u << 20 ? 1 << 20 : (int)n;
}

static int read_small(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    return 0;
}

static int cgroup_quota(void)
{
    char buf[128];
    /* cgroup v2: this process's own cgroup (outside a cgroup namespace the root's cpu.max is
     * not the limit), then the namespace root */
    char line[512], path[600];
    if (read_small("/proc/self/cgroup", line, sizeof line) == 0 && !strncmp(line, "0::/", 4)) {
        line[strcspn(line, "\n")] = 0;
        if (line[4] && !strstr(line, "..")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", line + 3);
            if (read_small(path, buf, sizeof buf) == 0) {
                int q = pcs_cpu_quota_parse(buf);
                if (q > 0)
                    return q;
            }
        }
    }
    if (read_small("/sys/fs/cgroup/cpu.max", buf, sizeof buf) == 0)
        return pcs_cpu_quota_parse(buf);
    char q[64], p[64], both[160];
    if (read_small("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", q, sizeof q) != 0 ||
        read_small("/sys/fs/cgroup/cpu/cpu.cfs_period_us", p, sizeof p) != 0)
        return 0;
    long long qv = strtoll(q, NULL, 10);
    if (qv <= 0)
        return 0; /* -1: no limit */
    snprintf(both, sizeof both, "%lld %s", qv, p);
    return pcs_cpu_quota_parse(both);
}

int pcs_cpu_available(void)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    int q = cgroup_quota();
    if (q > 0 && q < n)
        n = q;
    return n > 0 ? n : 1;
}

int pcs_cpu_online(void)
{
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

int pcs_cpu_rank_threads(int available, int online, uint32_t local_ranks)
{
    if (available > 0 && available < online)
        return available; /* confined: this rank's own share */
    return pcs_cpu_threads_per_rank(available, local_ranks);
}

int pcs_cpu_threads_per_rank(int cpus, uint32_t local_ranks)
{
    int t = cpus / (int)(local_ranks ? local_ranks : 1);
    return t > 0 ? t : 1;
}

void pcs_thread_name(const char *name)
{
    char n[16];
    snprintf(n, sizeof n, "%s", name ? name : "");
    (void)pthread_setname_np(pthread_self(), n);
}
