# worker/: the unit runtime (threads and forked worlds, no coordinator), pcs-worker processes
# end to end, the C API, start-up flags, and the GPU path.
pcs_add_test(NAME test_runtime SOURCES unit/test_runtime.c ${PCS_RUNTIME_HARNESS}
             LIBS pcs_worker LABELS unit TIMEOUT 60)
# The unit runtime on device memory against the cpu backend (one device; NCCL between ranks needs
# two); exits 77 without a CUDA device. test_runtime_cuda_sim runs it on the simulated device
# (PCS_SIMULATE_CUDA=1): the Gloo-staged W=2 case, bit for bit against cpu; the NCCL cases are
# skipped (not simulated).
pcs_add_test(NAME test_runtime_cuda SOURCES gpu/test_runtime_cuda.c ${PCS_RUNTIME_HARNESS}
             LIBS pcs_worker LABELS gpu TIMEOUT 300)
add_test(NAME test_runtime_cuda_sim COMMAND test_runtime_cuda)
set_tests_properties(test_runtime_cuda_sim PROPERTIES LABELS unit TIMEOUT 120
  ENVIRONMENT "PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")

# Real pcs-coordinator and pcs-worker processes on 127.0.0.1.
pcs_add_test(NAME test_e2e_cpu SOURCES integration/test_e2e_cpu.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
add_dependencies(test_e2e_cpu pcs-worker pcs-coordinator)
# Sharded runtime parity without a coordinator (forked ranks, file KV store).
pcs_add_test(NAME test_e2e_procs SOURCES integration/test_e2e_procs.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
# Resume from a sharded checkpoint: bit-identical continuation, resharding, refusals.
pcs_add_test(NAME test_resume SOURCES integration/test_resume.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
add_dependencies(test_resume pcsctl)
# The pipeline channels between two pp ranks in one process (real Gloo pairs, file KV store).
pcs_add_test(NAME test_pipe SOURCES unit/test_pipe.c LIBS pcs_worker LABELS unit TIMEOUT 60)
set_target_properties(test_pipe PROPERTIES LINKER_LANGUAGE CXX)
# Pipeline stages (issue 14): every schedule x FSDP / mixed precision / DDP x W 2 and 4 against
# the same job without stages (bit for bit) and the reference; clipping, eval and resume.
pcs_add_test(NAME test_pipeline SOURCES integration/test_pipeline.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 600)
# pcs-worker's start-up flags (backend, transport, device) as real processes.
pcs_add_test(NAME test_worker_flags SOURCES integration/test_worker_flags.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 120)
add_dependencies(test_worker_flags pcs-worker pcs-coordinator pcsctl)

# The public C API example program and its end-to-end test.
add_executable(pcs-c-api-example ${PROJECT_SOURCE_DIR}/examples/c_api_example.c)
target_link_libraries(pcs-c-api-example PRIVATE pcs_worker)
set_target_properties(pcs-c-api-example PROPERTIES LINKER_LANGUAGE CXX)
pcs_target_warnings(pcs-c-api-example)
pcs_add_test(NAME test_e2e_capi SOURCES integration/test_e2e_capi.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 120)
add_dependencies(test_e2e_capi pcs-c-api-example pcs-coordinator)

# The worker's GPU path end to end: label gpu in a CUDA build (exit 77 without a device).
# test_e2e_cuda_sim runs the same binary on the simulated device (PCS_SIMULATE_CUDA=1,
# kernels/src/ops_devsim.c) in every build, GPU or not: the workers' whole cuda path runs with
# poisoned device pointers, then the Gloo-staged test (NCCL is not simulated). Never skipped.
if(PCS_HAVE_CUDA)
  pcs_add_test(NAME test_e2e_cuda SOURCES gpu/test_e2e_cuda.c ${PCS_E2E_UTIL}
               LIBS pcs_worker LABELS gpu TIMEOUT 600)
else()
  add_executable(test_e2e_cuda gpu/test_e2e_cuda.c ${PCS_E2E_UTIL})
  set_target_properties(test_e2e_cuda PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_include_directories(test_e2e_cuda PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_link_libraries(test_e2e_cuda PRIVATE pcs_worker PkgConfig::CMOCKA pcs_test_support)
  pcs_target_warnings(test_e2e_cuda)
endif()
target_include_directories(test_e2e_cuda PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration)
add_dependencies(test_e2e_cuda pcs-worker pcs-coordinator)
add_test(NAME test_e2e_cuda_sim COMMAND test_e2e_cuda)
set_tests_properties(test_e2e_cuda_sim PROPERTIES LABELS integration TIMEOUT 300
  ENVIRONMENT "PCS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")

set_target_properties(test_runtime test_runtime_cuda test_e2e_cpu test_e2e_procs test_worker_flags
                      test_e2e_capi test_e2e_cuda test_resume test_pipeline
                      PROPERTIES LINKER_LANGUAGE CXX)
