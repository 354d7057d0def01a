/* The CPUs this process may use, for sizing compute thread pools (OpenBLAS) so that the ranks
 * sharing a host do not oversubscribe it: the affinity mask (taskset, cpusets, Kubernetes static
 * CPU manager) capped by the cgroup CPU quota (Kubernetes limits.cpu, docker --cpus). */
#ifndef PCS_CPU_H
#define PCS_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPUs a cgroup quota allows, rounded up: cgroup v2 cpu.max text ("150000 100000" -> 2;
 * "max 100000" -> 0 = no limit). 0 also for text that is not a quota. Pure. */
int pcs_cpu_quota_parse(const char *cpu_max);

/* min(CPUs in the affinity mask, the cgroup quota (v2 /sys/fs/cgroup/cpu.max, else v1
 * cpu.cfs_quota_us / cpu.cfs_period_us)); at least 1. */
int pcs_cpu_available(void);

/* Threads per rank when `local_ranks` ranks share `cpus` CPUs: cpus / local_ranks, at least 1
 * (local_ranks 0 = unknown: 1 rank). Pure. */
int pcs_cpu_threads_per_rank(int cpus, uint32_t local_ranks);

/* Name the calling thread (at most 15 bytes are kept) so that `top -H`, `ps -L` and debuggers
 * show what each of a worker's threads is for. Best effort. */
void pcs_thread_name(const char *name);

/* CPUs the machine has online (sysconf). */
int pcs_cpu_online(void);

/* Compute threads for one rank: a process already confined below the machine (its own affinity
 * mask or cgroup quota: taskset per rank, a Kubernetes pod per worker) uses all it was given;
 * an unconfined one shares the machine with the other `local_ranks` ranks on it. Pure. */
int pcs_cpu_rank_threads(int available, int online, uint32_t local_ranks);

#ifdef __cplusplus
}
#endif
#endif
