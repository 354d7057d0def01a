# ctl area: job files (YAML/JSON <-> protobuf), spec validation, pcsctl.
pcs_add_test(NAME test_pb_yaml SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_pb_yaml.c
             LIBS pcs_common LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_validate SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_validate.c
             LIBS pcs_plan pcs_common LABELS unit TIMEOUT 60)

# Job-file fuzzing: the replay driver (examples, mutations, random bytes for a few seconds) runs as
# a unit test under every compiler; the libFuzzer target needs clang and -DPCS_FUZZ=ON.
pcs_add_test(NAME test_fuzz_yaml_replay SOURCES ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_yaml.c
             LIBS pcs_plan pcs_common LABELS unit TIMEOUT 60 ARGS --seconds 3)
if(PCS_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_yaml ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_yaml.c)
  target_compile_definitions(fuzz_yaml PRIVATE PCS_LIBFUZZER=1)
  target_compile_options(fuzz_yaml PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_yaml PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_yaml PRIVATE pcs_plan pcs_common)
  set_target_properties(fuzz_yaml PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
endif()

# pcsctl against a real coordinator (both binaries must be built first).
pcs_add_test(NAME test_pcsctl SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_pcsctl.c
             LIBS pcs_common LABELS integration TIMEOUT 120)
foreach(bin pcsctl pcs-coordinator)
  if(TARGET ${bin})
    add_dependencies(test_pcsctl ${bin})
  endif()
endforeach()
