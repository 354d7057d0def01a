# ctl area: job files (YAML/JSON <-> protobuf), spec validation, pcsctl.
pcs_add_test(NAME test_pb_yaml SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_pb_yaml.c
             LIBS pcs_common LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_validate SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_validate.c
             LIBS pcs_plan pcs_common LABELS unit TIMEOUT 60)
