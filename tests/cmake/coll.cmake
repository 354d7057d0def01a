# coll/: reduction arithmetic, argument checks and KV stores; real multi-process Gloo runs on
# loopback; the NCCL differential test (gpu).
pcs_add_test(NAME test_coll SOURCES unit/test_coll.c LIBS pcs_coll LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_coll_kv SOURCES unit/test_coll_kv.c LIBS pcs_coll LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_coll_procs SOURCES integration/test_coll_procs.c LIBS pcs_coll
             LABELS integration TIMEOUT 300)
add_dependencies(test_coll_procs pcs-coordinator) # the KV rendezvous case starts one
set_target_properties(test_coll test_coll_kv test_coll_procs PROPERTIES LINKER_LANGUAGE CXX)
if(PCS_HAVE_CUDA)
  pcs_add_test(NAME test_coll_nccl SOURCES gpu/test_coll_nccl.c LIBS pcs_coll LABELS gpu
               TIMEOUT 120)
  set_target_properties(test_coll_nccl PROPERTIES LINKER_LANGUAGE CXX)
endif()
