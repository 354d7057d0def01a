# planner/: table-driven acceptance cases, property tests, spec validation and job-file fuzzing.
pcs_add_test(NAME test_plan SOURCES unit/test_plan.c LIBS pcs_planner pcs_common LABELS unit
             TIMEOUT 120)
pcs_add_test(NAME test_schedule SOURCES unit/test_schedule.c LIBS pcs_planner LABELS unit TIMEOUT 120)
pcs_add_test(NAME test_plan_props SOURCES unit/test_plan_props.c LIBS pcs_planner pcs_common
             LABELS unit TIMEOUT 120)
pcs_add_test(NAME test_validate SOURCES unit/test_validate.c LIBS pcs_planner pcs_common
             LABELS unit TIMEOUT 60)

# Job-file fuzzing: the replay driver (examples, mutations, random bytes for a few seconds) runs as
# a unit test under every compiler; the libFuzzer target needs clang and -DPCS_FUZZ=ON.
pcs_add_test(NAME test_fuzz_yaml_replay SOURCES fuzz/fuzz_yaml.c LIBS pcs_planner pcs_common
             LABELS unit TIMEOUT 60 ARGS --seconds 3)
if(PCS_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_yaml fuzz/fuzz_yaml.c)
  target_compile_definitions(fuzz_yaml PRIVATE PCS_LIBFUZZER=1)
  target_compile_options(fuzz_yaml PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_yaml PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_yaml PRIVATE pcs_planner pcs_common)
  set_target_properties(fuzz_yaml PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
endif()
# The mesh (rank <-> coordinates <-> groups) on every mesh of up to 64 ranks.
pcs_add_test(NAME test_mesh SOURCES unit/test_mesh.c LIBS pcs_planner LABELS unit TIMEOUT 120)
# Resharding: the transfer plan rebuilds every new shard for every pair of world sizes,
# strategies and wrap policies.
pcs_add_test(NAME test_reshard SOURCES unit/test_reshard.c LIBS pcs_planner pcs_common LABELS unit
             TIMEOUT 120)
