# pcs-worker's start-up flags (backend, transport, device) as real processes.
if(TARGET pcs-worker AND TARGET pcs-coordinator AND TARGET pcsctl)
  pcs_add_test(NAME test_worker_flags
    SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_worker_flags.c
            ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
    LIBS pcs_worker_core pcs_plan LABELS integration TIMEOUT 120)
  set_target_properties(test_worker_flags PROPERTIES LINKER_LANGUAGE CXX)
  add_dependencies(test_worker_flags pcs-worker pcs-coordinator pcsctl)
endif()

# The worker's GPU path end to end (label gpu: exits 77 without a CUDA device).
if(PCS_HAVE_CUDA AND TARGET pcs-worker AND TARGET pcs-coordinator)
  pcs_add_test(NAME test_e2e_cuda
    SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_e2e_cuda.c
            ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c
    LIBS pcs_worker_core pcs_plan LABELS gpu TIMEOUT 600)
  target_include_directories(test_e2e_cuda PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration)
  set_target_properties(test_e2e_cuda PROPERTIES LINKER_LANGUAGE CXX)
  add_dependencies(test_e2e_cuda pcs-worker pcs-coordinator)
endif()
# The same binary on the simulated device (PCS_SIMULATE_CUDA=1, kernels/src/ops_devsim.c): the
# workers' whole cuda path runs with poisoned device pointers in every build, GPU or not; main()
# then runs the Gloo-staged test (NCCL is not simulated). Never skipped: no 77 here.
if(TARGET pcs-worker AND TARGET pcs-coordinator)
  if(NOT TARGET test_e2e_cuda)
    add_executable(test_e2e_cuda ${PROJECT_SOURCE_DIR}/tests/gpu/test_e2e_cuda.c
                                 ${PROJECT_SOURCE_DIR}/tests/integration/test_e2e_util.c)
    set_target_properties(test_e2e_cuda PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                          ${CMAKE_BINARY_DIR}/tests LINKER_LANGUAGE CXX)
    target_include_directories(test_e2e_cuda PRIVATE ${PROJECT_SOURCE_DIR}/tests/support
                               ${PROJECT_SOURCE_DIR}/tests/integration)
    target_link_libraries(test_e2e_cuda PRIVATE pcs_worker_core pcs_plan PkgConfig::CMOCKA
                          pcs_test_support)
    pcs_target_warnings(test_e2e_cuda)
    add_dependencies(test_e2e_cuda pcs-worker pcs-coordinator)
  endif()
  add_test(NAME test_e2e_cuda_sim COMMAND test_e2e_cuda)
  set_tests_properties(test_e2e_cuda_sim PROPERTIES LABELS integration TIMEOUT 300
    ENVIRONMENT "PCS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")
endif()
# The model's cuda nn path (test_model_cuda, tests/cmake/compute.cmake) on the simulated device:
# every activation, parameter and gradient is a poisoned device pointer; the simulator computes
# with the CPU twin, so the test's tolerances hold trivially and what it checks is where data is.
if(TARGET test_model_cuda)
  add_test(NAME test_model_cuda_sim COMMAND test_model_cuda)
  set_tests_properties(test_model_cuda_sim PROPERTIES LABELS unit TIMEOUT 120
    ENVIRONMENT "PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")
endif()
