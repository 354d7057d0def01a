# Collectives layer (worker/coll*, worker/kv*): unit tests of the reduction arithmetic, argument
# checks and KV stores; real multi-process Gloo runs on loopback; NCCL differential test (gpu).
if(TARGET pcs_coll)
  pcs_add_test(NAME test_coll SOURCES unit/test_coll.c LIBS pcs_coll LABELS unit TIMEOUT 60)
  set_target_properties(test_coll PROPERTIES LINKER_LANGUAGE CXX)
  pcs_add_test(NAME test_coll_kv SOURCES unit/test_coll_kv.c LIBS pcs_coll LABELS unit TIMEOUT 60)
  set_target_properties(test_coll_kv PROPERTIES LINKER_LANGUAGE CXX)
  pcs_add_test(NAME test_coll_procs SOURCES integration/test_coll_procs.c LIBS pcs_coll
               LABELS integration TIMEOUT 300)
  set_target_properties(test_coll_procs PROPERTIES LINKER_LANGUAGE CXX)
  if(TARGET pcs-coordinator)
    add_dependencies(test_coll_procs pcs-coordinator) # the KV rendezvous case starts one
  endif()
  if(PCS_HAVE_CUDA AND EXISTS ${PROJECT_SOURCE_DIR}/tests/gpu/test_coll_nccl.c)
    pcs_add_test(NAME test_coll_nccl SOURCES gpu/test_coll_nccl.c LIBS pcs_coll LABELS gpu
                 TIMEOUT 120)
    set_target_properties(test_coll_nccl PROPERTIES LINKER_LANGUAGE CXX)
  endif()
endif()
