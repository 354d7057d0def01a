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

# Unit runtime of a world of one (threads, no communicators).
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_runtime
    SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_runtime.c
    LIBS pcs_worker_core LABELS unit TIMEOUT 60)
  set_target_properties(test_runtime PROPERTIES LINKER_LANGUAGE CXX)
endif()

# The unit runtime on device memory against the cpu backend (one device; NCCL between ranks needs
# two). Exits 77 without a CUDA device.
if(TARGET pcs_worker_core AND PCS_HAVE_CUDA)
  pcs_add_test(NAME test_runtime_cuda
    SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_runtime_cuda.c
    LIBS pcs_worker_core LABELS gpu TIMEOUT 300)
  set_target_properties(test_runtime_cuda PROPERTIES LINKER_LANGUAGE CXX)
endif()
