# deploy/: the Kubernetes overlays rendered by kustomize and validated strictly offline, the
# Dockerfiles linted (exit 77 without the tools, unless PCS_REQUIRE_TOOLS=1 as in CI), and the
# GPU overlay's per-node launcher run with real workers.
add_test(NAME test_deploy COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_deploy.sh
         ${PROJECT_SOURCE_DIR})
set_tests_properties(test_deploy PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
add_test(NAME test_worker_node COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_worker_node.sh
         ${CMAKE_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR})
set_tests_properties(test_worker_node PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "PCS_LOG_LEVEL=info")
# cmake --install into a fresh prefix: the C API example builds against it with pkg-config and
# find_package(pcs), and the two builds train a job through the installed coordinator.
add_test(NAME test_install COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install/test_install.sh
         ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(test_install PROPERTIES LABELS integration TIMEOUT 300)
# A real Prometheus scrapes a real coordinator with the shipped alert rules loaded (exit 77
# without prometheus, unless PCS_REQUIRE_TOOLS=1).
add_test(NAME test_prometheus_scrape COMMAND bash
         ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_prometheus_scrape.sh ${CMAKE_BINARY_DIR}/bin
         ${PROJECT_SOURCE_DIR})
set_tests_properties(test_prometheus_scrape PROPERTIES LABELS integration TIMEOUT 120
                     SKIP_RETURN_CODE 77)
