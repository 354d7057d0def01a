# Worker compute core: built-in MLP, losses, data, init, safetensors/npy I/O, reference trainer.
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_model SOURCES unit/test_model.c LIBS pcs_worker_core LABELS unit
               TIMEOUT 120)
  pcs_add_test(NAME test_data SOURCES unit/test_data.c LIBS pcs_worker_core LABELS unit
               TIMEOUT 60)
  # The nn vtable (kernels/include/pcs/nn.h): validation, exact cases, cpu-backend refactor guard.
  pcs_add_test(NAME test_nn SOURCES unit/test_nn.c LIBS pcs_worker_core LABELS unit TIMEOUT 60)
  # The model on the cuda nn implementation vs the CPU twin; exits 77 (skip) without a device.
  pcs_add_test(NAME test_model_cuda SOURCES gpu/test_model_cuda.c LIBS pcs_worker_core LABELS gpu
               TIMEOUT 300)
endif()
# test_reference also checks the reference against the planner's plans (coordinator/plan.h).
if(TARGET pcs_worker_core AND TARGET pcs_plan)
  pcs_add_test(NAME test_reference SOURCES unit/test_reference.c LIBS pcs_worker_core pcs_plan
               LABELS unit TIMEOUT 120)
endif()
if(TARGET pcs_worker_core)
  # The fuzz target is replayed over deterministic mutations by the unit test (any compiler); with
  # clang it is also built as a libFuzzer binary: build/tests/fuzz_safetensors CORPUS_DIR.
  pcs_add_test(NAME test_safetensors SOURCES unit/test_safetensors.c fuzz/fuzz_safetensors.c
               LIBS pcs_worker_core LABELS unit TIMEOUT 120)
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_safetensors fuzz/fuzz_safetensors.c)
    target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_safetensors PRIVATE pcs_worker_core)
    set_target_properties(fuzz_safetensors PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                          ${CMAKE_BINARY_DIR}/tests)
  endif()
endif()
