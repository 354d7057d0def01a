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
