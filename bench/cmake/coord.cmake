# pcs-coord-bench: gang-start latency (SubmitJob -> all W assignments on their watch streams)
# against the health Watch baseline (docs/perf/coord.md). Spawns bin/pcs-coordinator.
add_executable(pcs-coord-bench ${PROJECT_SOURCE_DIR}/bench/pcs_coord_bench.c)
target_link_libraries(pcs-coord-bench PRIVATE pcs_common)
pcs_target_warnings(pcs-coord-bench)

if(TARGET pcs-coordinator)
  add_dependencies(pcs-coord-bench pcs-coordinator)
  add_test(NAME bench_smoke_coord COMMAND pcs-coord-bench -w 2,8)
  set_tests_properties(bench_smoke_coord PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Errors and wrong replies : 0 OK")
endif()
