# Coordinator tests (owner: coord). test_coord compiles the pure state machine directly so it
# needs neither gRPC nor the planner; the integration tests drive the real pcs-coordinator.
pcs_add_test(NAME test_coord
  SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_coord.c ${PROJECT_SOURCE_DIR}/coordinator/coord.c
  LIBS pcs_base LABELS unit TIMEOUT 60)
target_include_directories(test_coord PRIVATE ${PROJECT_SOURCE_DIR}/coordinator)
