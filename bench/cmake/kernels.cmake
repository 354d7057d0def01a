# pcs-cast-bench: cast bandwidth vs a copy of the same traffic (docs/perf/kernels.md).
add_executable(pcs-cast-bench ${PROJECT_SOURCE_DIR}/bench/pcs_cast_bench.c)
target_link_libraries(pcs-cast-bench PRIVATE pcs_kernels pcs_bench_util)
pcs_target_warnings(pcs-cast-bench)

# bench-smoke: tiny sizes on the cpu backend; fails if any element is wrong.
add_test(NAME bench_smoke_cast COMMAND pcs-cast-bench -d cpu -b 4K -e 256K -f 4 -w 1 -n 2)
set_tests_properties(bench_smoke_cast PROPERTIES LABELS bench-smoke TIMEOUT 60
  PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
