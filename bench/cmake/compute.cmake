# pcs-model-bench: built-in MLP forward+backward vs the bare sgemm calls (docs/perf/compute.md);
# --job FILE runs the single-process reference trainer on a job file.
if(TARGET pcs_worker_core)
  add_executable(pcs-model-bench ${PROJECT_SOURCE_DIR}/bench/pcs_model_bench.c)
  target_link_libraries(pcs-model-bench PRIVATE pcs_worker_core)
  pcs_target_warnings(pcs-model-bench)
  if(TARGET pcs_plan)
    target_compile_definitions(pcs-model-bench PRIVATE PCS_BENCH_HAVE_PLAN=1)
  endif()

  # bench-smoke: a tiny model at tiny sizes; fails if any output differs from the re-computation.
  add_test(NAME bench_smoke_model COMMAND pcs-model-bench -b 4 -e 16 -f 4 -n 2 -i 32 -H 64 -L 2
           -o 8)
  set_tests_properties(bench_smoke_model PROPERTIES LABELS bench-smoke TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
  # The same on the GPU vs the CPU twin (label gpu; exit 77 = skipped without a device).
  add_test(NAME bench_smoke_model_cuda COMMAND pcs-model-bench -d cuda -b 4 -e 16 -f 4 -n 2 -i 32
           -H 64 -L 2 -o 8)
  set_tests_properties(bench_smoke_model_cuda PROPERTIES LABELS gpu TIMEOUT 60
    SKIP_RETURN_CODE 77)
endif()
