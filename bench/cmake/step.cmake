# pcs-step-bench: step time breakdown of the sharded training loop (demo model, W = 1, 2, 4 CPU
# ranks), overlap efficiency with and without prefetch (docs/perf/step.md).
if(TARGET pcs_worker_core AND TARGET pcs_plan)
  add_executable(pcs-step-bench ${PROJECT_SOURCE_DIR}/bench/pcs_step_bench.c)
  target_link_libraries(pcs-step-bench PRIVATE pcs_worker_core pcs_plan pcs_bench_util)
  target_include_directories(pcs-step-bench PRIVATE ${CMAKE_BINARY_DIR}/include)
  set_target_properties(pcs-step-bench PROPERTIES LINKER_LANGUAGE CXX)
  pcs_target_warnings(pcs-step-bench)

  # bench-smoke: a tiny model, W = 1 and 2, two timed steps; fails if the parity pass is wrong.
  add_test(NAME bench_smoke_step COMMAND pcs-step-bench --tiny -g 1,2 -n 2 -w 1)
  set_tests_properties(bench_smoke_step PROPERTIES LABELS bench-smoke TIMEOUT 120
    PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
endif()
