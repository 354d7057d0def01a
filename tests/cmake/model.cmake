# model/: the built-in MLP, losses, data, init and the reference trainer (checked against the
# planner's plans), and the model's cuda nn path against the CPU twin.
pcs_add_test(NAME test_model SOURCES unit/test_model.c LIBS pcs_model LABELS unit TIMEOUT 120)
pcs_add_test(NAME test_data SOURCES unit/test_data.c LIBS pcs_model LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_reference SOURCES unit/test_reference.c LIBS pcs_model pcs_planner pcs_common
             LABELS unit TIMEOUT 120)
# exits 77 (skip) without a device
pcs_add_test(NAME test_model_cuda SOURCES gpu/test_model_cuda.c LIBS pcs_model LABELS gpu
             TIMEOUT 300)
# The same on the simulated device: every activation, parameter and gradient is a poisoned device
# pointer; the simulator computes with the CPU twin, so the test's tolerances hold trivially and
# what it checks is where data is.
add_test(NAME test_model_cuda_sim COMMAND test_model_cuda)
set_tests_properties(test_model_cuda_sim PROPERTIES LABELS unit TIMEOUT 120
  ENVIRONMENT "PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn;PCS_SIMULATE_CUDA=1")
