# Worker runtime, agent, checkpoint/export and end-to-end tests (owner: runtime).
# Integration tests start a real pcs-coordinator and pcs-worker processes on 127.0.0.1.
if(TARGET pcs_worker_core AND TARGET pcs-worker AND TARGET pcs-coordinator)
  pcs_add_test(NAME test_e2e_cpu
    SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_cpu.c
            ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
    LIBS pcs_worker_core pcs_plan LABELS integration TIMEOUT 300)
  set_target_properties(test_e2e_cpu PROPERTIES LINKER_LANGUAGE CXX)
  add_dependencies(test_e2e_cpu pcs-worker pcs-coordinator)
endif()

# Sharded runtime parity without a coordinator (forked ranks, file KV store).
if(TARGET pcs_worker_core AND TARGET pcs_plan)
  pcs_add_test(NAME test_e2e_procs
    SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_procs.c
            ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
    LIBS pcs_worker_core pcs_plan LABELS integration TIMEOUT 300)
  set_target_properties(test_e2e_procs PROPERTIES LINKER_LANGUAGE CXX)
endif()

# pcsctl demo / export as a user runs them.
if(TARGET pcsctl AND TARGET pcs-worker AND TARGET pcs-coordinator)
  pcs_add_test(NAME test_e2e_cli
    SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_cli.c
            ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
    LIBS pcs_worker_core pcs_plan LABELS integration TIMEOUT 300)
  set_target_properties(test_e2e_cli PROPERTIES LINKER_LANGUAGE CXX)
  add_dependencies(test_e2e_cli pcsctl pcs-worker pcs-coordinator)
endif()

# The public C API example program and its end-to-end test.
if(TARGET pcs_worker_core)
  add_executable(pcs-c-api-example ${PROJECT_SOURCE_DIR}/examples/c_api_example.c)
  target_link_libraries(pcs-c-api-example PRIVATE pcs_worker_core)
  set_target_properties(pcs-c-api-example PROPERTIES LINKER_LANGUAGE CXX)
  pcs_target_warnings(pcs-c-api-example)
  if(TARGET pcs-coordinator)
    pcs_add_test(NAME test_e2e_capi
      SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_capi.c
              ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
      LIBS pcs_worker_core pcs_plan LABELS integration TIMEOUT 120)
    set_target_properties(test_e2e_capi PROPERTIES LINKER_LANGUAGE CXX)
    add_dependencies(test_e2e_capi pcs-c-api-example pcs-coordinator)
  endif()
endif()

# Sharded checkpoint files and export (pure file I/O, no processes).
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_checkpoint
    SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_checkpoint.c
    LIBS pcs_worker_core LABELS unit TIMEOUT 60)
  set_target_properties(test_checkpoint PROPERTIES LINKER_LANGUAGE CXX)
endif()

# Unit runtime of a world of one (threads, no communicators) and forked worlds; the parity
# harness (plan, step sequence, comparison, forked ranks) is shared with test_runtime_cuda.
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_runtime
    SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_runtime.c
            ${PROJECT_SOURCE_DIR}/tests/support/runtime_harness.c
    LIBS pcs_worker_core LABELS unit TIMEOUT 60)
  set_target_properties(test_runtime PROPERTIES LINKER_LANGUAGE CXX)
endif()

# The unit runtime on device memory against the cpu backend (one device; NCCL between ranks needs
# two). Built in every build (it needs only the kernels vtable and the runtime); exits 77 without
# a CUDA device. test_runtime_cuda_sim runs it on the simulated device (PCS_SIMULATE_CUDA=1): the
# Gloo-staged W=2 case, bit for bit against cpu; the NCCL cases are skipped (not simulated).
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_runtime_cuda
    SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_runtime_cuda.c
            ${PROJECT_SOURCE_DIR}/tests/support/runtime_harness.c
    LIBS pcs_worker_core LABELS gpu TIMEOUT 300)
  set_target_properties(test_runtime_cuda PROPERTIES LINKER_LANGUAGE CXX)
  add_test(NAME test_runtime_cuda_sim COMMAND test_runtime_cuda)
  set_tests_properties(test_runtime_cuda_sim PROPERTIES LABELS unit TIMEOUT 120
    ENVIRONMENT "PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")
endif()
