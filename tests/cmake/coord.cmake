# Coordinator tests (owner: coord). test_coord compiles the pure state machine directly so it
# needs neither gRPC nor the planner; the integration tests drive the real pcs-coordinator.
pcs_add_test(NAME test_coord
  SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_coord.c ${PROJECT_SOURCE_DIR}/coordinator/coord.c
  LIBS pcs_base LABELS unit TIMEOUT 60)
target_include_directories(test_coord PRIVATE ${PROJECT_SOURCE_DIR}/coordinator)

pcs_add_test(NAME test_coordinator
  SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/test_coordinator.c
  LIBS pcs_common Threads::Threads LABELS integration TIMEOUT 120)
add_dependencies(test_coordinator pcs-coordinator)

# Wire compatibility with a stock gRPC implementation (Debian python3-grpcio); exits 77 if absent.
add_test(NAME test_coordinator_grpcio
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/interop_grpcio.py)
set_tests_properties(test_coordinator_grpcio PROPERTIES LABELS integration TIMEOUT 120
  SKIP_RETURN_CODE 77
  ENVIRONMENT "PCS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn")

# SQLite store alone (rank -> worker map round trip, schema upgrade): compiled in, like test_coord.
pcs_add_test(NAME test_store
  SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/test_store.c ${PROJECT_SOURCE_DIR}/coordinator/store.c
  LIBS pcs_base PkgConfig::SQLITE LABELS unit TIMEOUT 60)
target_include_directories(test_store PRIVATE ${PROJECT_SOURCE_DIR}/coordinator)
