# Worker compute core: built-in MLP, losses, data, init, safetensors/npy I/O, reference trainer.
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_model SOURCES unit/test_model.c LIBS pcs_worker_core LABELS unit
               TIMEOUT 120)
endif()
if(TARGET pcs_worker_core)
  pcs_add_test(NAME test_reference SOURCES unit/test_reference.c LIBS pcs_worker_core LABELS unit
               TIMEOUT 120)
endif()
