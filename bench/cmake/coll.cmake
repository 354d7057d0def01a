# pcs-coll-bench: all_gather / reduce_scatter / all_reduce through pcs_coll with the plain Gloo
# call at the same sizes as the baseline (docs/perf/coll.md).
if(TARGET pcs_coll)
  add_executable(pcs-coll-bench ${PROJECT_SOURCE_DIR}/bench/pcs_coll_bench.c)
  target_link_libraries(pcs-coll-bench PRIVATE pcs_coll pcs_bench_util)
  set_target_properties(pcs-coll-bench PROPERTIES LINKER_LANGUAGE CXX)
  pcs_target_warnings(pcs-coll-bench)

  # bench-smoke: 2 ranks, tiny sizes, every collective; fails if any element is wrong.
  add_test(NAME bench_smoke_coll COMMAND pcs-coll-bench -g 2 -b 64 -e 4K -f 8 -n 3 -w 1)
  set_tests_properties(bench_smoke_coll PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
  add_test(NAME bench_smoke_coll_bf16_avg COMMAND pcs-coll-bench -g 3 -b 96 -e 4K -f 8 -n 2 -w 1
           -d bf16 -o avg)
  set_tests_properties(bench_smoke_coll_bf16_avg PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
endif()
