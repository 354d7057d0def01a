# pcs-plan-bench: planning time, plan bytes and assignment bytes per rank for a Llama-70B-shaped
# tree at 8 ... 16,384 ranks (docs/perf/plan.md).
if(TARGET pcs_plan AND EXISTS ${PROJECT_SOURCE_DIR}/bench/pcs_plan_bench.c)
  add_executable(pcs-plan-bench ${PROJECT_SOURCE_DIR}/bench/pcs_plan_bench.c)
  target_link_libraries(pcs-plan-bench PRIVATE pcs_plan)
  pcs_target_warnings(pcs-plan-bench)

  # bench-smoke: 4 blocks at 8..64 ranks; fails if any check of the untimed pass fails.
  add_test(NAME bench_smoke_plan COMMAND pcs-plan-bench -b 8 -e 64 -f 2 -w 1 -n 2 -L 4)
  set_tests_properties(bench_smoke_plan PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
endif()
