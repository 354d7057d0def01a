/* Helpers shared by the benchmarks (STYLE.md B12): nccl-tests style size arguments and the
 * machine line of the report header. Not part of any shipped library. */
#ifndef PCS_BENCH_UTIL_H
#define PCS_BENCH_UTIL_H

#include <stddef.h>

/* "4096", "4K", "256M", "1G" (binary multiples) -> *out. Returns 0, or -1 on a malformed or
 * zero size. */
int pcs_bench_parse_size(const char *s, size_t *out);

/* The CPU model from /proc/cpuinfo ("AMD EPYC ..."), or "unknown". */
void pcs_bench_cpu_model(char *buf, size_t n);

#endif
