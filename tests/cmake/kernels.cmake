# kernels/: CPU twin unit tests, the exhaustive cast proof, the nn vtable, the simulated device
# and the CUDA differential tests (label gpu: exit 77 without a device).
pcs_add_test(NAME test_kernels SOURCES unit/test_kernels.c LIBS pcs_kernels LABELS unit
             TIMEOUT 120)
target_include_directories(test_kernels PRIVATE ${PROJECT_SOURCE_DIR}/kernels/src)
pcs_add_test(NAME test_kernels_cast_exhaustive SOURCES unit/test_kernels_cast_exhaustive.c
             LIBS pcs_kernels LABELS exhaustive TIMEOUT 300)
pcs_add_test(NAME test_kernels_cuda SOURCES gpu/test_kernels_cuda.c LIBS pcs_kernels LABELS gpu
             TIMEOUT 300)
# The CPU twin's vectorized erf/exp (GELU): ulps against libm's double, loops == scalar bits.
pcs_add_test(NAME test_nn_vmath SOURCES unit/test_nn_vmath.c LIBS pcs_kernels LABELS exhaustive
             TIMEOUT 300)
target_include_directories(test_nn_vmath PRIVATE ${PROJECT_SOURCE_DIR}/kernels/src)
# The nn vtable (kernels/include/pcs/nn.h): validation, exact cases, cpu-backend refactor guard.
pcs_add_test(NAME test_nn SOURCES unit/test_nn.c LIBS pcs_model LABELS unit TIMEOUT 60)
target_compile_options(test_nn PRIVATE -ffp-contract=off) # its references are the twin's order

# The simulated "cuda" backend (PCS_SIMULATE_CUDA=1): tagging, copy kinds, CPU-twin bits.
pcs_add_test(NAME test_devsim SOURCES unit/test_devsim.c LIBS pcs_kernels LABELS unit TIMEOUT 60)
# The CUDA backend's differential test run against the simulator: the simulated "cuda" table keeps
# the backend contract (validation, streams and events order, every op's bits).
add_test(NAME test_kernels_cuda_sim COMMAND test_kernels_cuda)
set_tests_properties(test_kernels_cuda_sim PROPERTIES LABELS unit TIMEOUT 180
  ENVIRONMENT "PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")

# The CPU twin's LayerNorm and GELU against PyTorch (tests/python/test_nn_torch.py, label python):
# nn_probe runs one op on arrays from stdin.
add_executable(nn_probe support/nn_probe.c)
set_target_properties(nn_probe PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
target_link_libraries(nn_probe PRIVATE pcs_kernels)
pcs_target_warnings(nn_probe)
