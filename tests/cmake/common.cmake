# common/: gRPC glue, config engine, UTF-8, YAML/JSON <-> protobuf, and the codec fuzzing.
pcs_add_test(NAME test_rpc SOURCES unit/test_rpc.c LIBS pcs_common LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_config SOURCES unit/test_config.c LIBS pcs_base LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_cpu SOURCES unit/test_cpu.c LIBS pcs_base LABELS unit TIMEOUT 60)
# Untrusted paths: no blocking open, regular files only (a FIFO must not wedge a worker).
pcs_add_test(NAME test_file SOURCES unit/test_file.c LIBS pcs_base LABELS unit TIMEOUT 60)
# UTF-8 validation of proto3 strings: byte validator, boundary cuts, request walk.
pcs_add_test(NAME test_utf8 SOURCES unit/test_utf8.c LIBS pcs_common LABELS unit TIMEOUT 60)
# Job files (YAML/JSON <-> protobuf through descriptors).
pcs_add_test(NAME test_pb_yaml SOURCES unit/test_pb_yaml.c LIBS pcs_common LABELS unit TIMEOUT 60)

# Codec fuzzing: a plain replay driver (the committed corpus, built-in seeds, mutations and random
# bytes for a few seconds) runs under every compiler as a unit test; the libFuzzer target needs
# clang and -DPCS_FUZZ=ON:  build/fuzz/fuzz_rpc_decode tests/fuzz/corpus/rpc_decode
# (the corpus is libFuzzer's output, minimized with -merge=1).
pcs_add_test(NAME test_fuzz_rpc_decode_replay SOURCES fuzz/fuzz_rpc_decode.c LIBS pcs_common
             LABELS unit TIMEOUT 60
             ARGS --seconds 3 ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/rpc_decode)
target_include_directories(test_fuzz_rpc_decode_replay PRIVATE ${PROJECT_SOURCE_DIR}/common)
if(PCS_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  # the codec is compiled into the target so libFuzzer sees its coverage (pcs_common is not
  # instrumented)
  add_executable(fuzz_rpc_decode fuzz/fuzz_rpc_decode.c ${PROJECT_SOURCE_DIR}/common/rpc_codec.c)
  target_compile_definitions(fuzz_rpc_decode PRIVATE PCS_LIBFUZZER=1)
  target_compile_options(fuzz_rpc_decode PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_rpc_decode PRIVATE -fsanitize=fuzzer,address,undefined)
  target_include_directories(fuzz_rpc_decode PRIVATE ${PROJECT_SOURCE_DIR}/common)
  target_link_libraries(fuzz_rpc_decode PRIVATE pcs_common)
  set_target_properties(fuzz_rpc_decode PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
elseif(PCS_FUZZ)
  message(STATUS "pcs: PCS_FUZZ needs clang; libFuzzer targets skipped (replay drivers still built)")
endif()
# The one string map and the one hash (FNV-1a 64 test vectors).
pcs_add_test(NAME test_strmap SOURCES unit/test_strmap.c LIBS pcs_base LABELS unit TIMEOUT 60)
# The log's JSON lines (PCS_LOG_FORMAT=json) against a strict RFC 8259 reader and Python's json.
pcs_add_test(NAME test_log SOURCES unit/test_log.c LIBS pcs_base LABELS unit TIMEOUT 60)
# The operator endpoint (/metrics /healthz /readyz) over a real socket: liveness, staleness,
# readiness with its reason.
pcs_add_test(NAME test_http SOURCES unit/test_http.c LIBS pcs_common LABELS unit TIMEOUT 60)
