# rpc area (owner: rpc): gRPC glue, config engine, codec fuzzing.
pcs_add_test(NAME test_rpc SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_rpc.c
             LIBS pcs_common LABELS unit TIMEOUT 60)
