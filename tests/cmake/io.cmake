# io/: safetensors (with its fuzz target replayed over deterministic mutations), sharded checkpoint
# files and export (pure file I/O, no processes).
pcs_add_test(NAME test_safetensors SOURCES unit/test_safetensors.c fuzz/fuzz_safetensors.c
             LIBS pcs_model LABELS unit TIMEOUT 120)
pcs_add_test(NAME test_checkpoint SOURCES unit/test_checkpoint.c LIBS pcs_io LABELS unit
             TIMEOUT 60)
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  # with clang also a libFuzzer binary: build/tests/fuzz_safetensors CORPUS_DIR
  add_executable(fuzz_safetensors fuzz/fuzz_safetensors.c)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors PRIVATE pcs_io)
  set_target_properties(fuzz_safetensors PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests)
endif()
