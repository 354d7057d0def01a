# python/ (the pcs package over libpcs_worker.so). Label python, not integration: the ASan pass
# cannot load a sanitized libpcs_worker into python3. Each exits 77 without its Debian package
# (python3-numpy, python3-torch), unless PCS_REQUIRE_TOOLS=1 as in CI.
# pcs.worker: the C API one to one, two processes training through a real coordinator.
add_test(NAME test_python_worker
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/python/test_pcs_worker.py ${CMAKE_BINARY_DIR})
# pcs.torch: the seeds' models trained by two rank processes, against plain PyTorch.
add_test(NAME test_python_torch
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/python/test_pcs_torch.py ${CMAKE_BINARY_DIR})
# The CPU twin's LayerNorm and GELU (nn_probe) against torch's, fp64 torch as the truth.
add_test(NAME test_python_nn
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/python/test_nn_torch.py $<TARGET_FILE:nn_probe>)
set_tests_properties(test_python_worker test_python_torch test_python_nn PROPERTIES LABELS python TIMEOUT 600
  SKIP_RETURN_CODE 77 ENVIRONMENT "PCS_LOG_LEVEL=warn")
