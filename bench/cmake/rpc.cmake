# pcs-rpc-bench: register/heartbeat load on a coordinator vs the health Check baseline
# (docs/perf/rpc.md). It spawns bin/pcs-coordinator unless --coordinator is given.
add_executable(pcs-rpc-bench ${PROJECT_SOURCE_DIR}/bench/pcs_rpc_bench.c)
target_link_libraries(pcs-rpc-bench PRIVATE pcs_common pcs_bench_util)
pcs_target_warnings(pcs-rpc-bench)

# bench-smoke: 50 workers for 1 s against a spawned coordinator; fails on any error or wrong reply.
if(TARGET pcs-coordinator)
  add_test(NAME bench_smoke_rpc COMMAND pcs-rpc-bench -n 50 -t 1 -j 2)
  set_tests_properties(bench_smoke_rpc PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Errors and wrong replies : 0 OK")
endif()
