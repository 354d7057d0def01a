# cli/: pcsctl against a real coordinator, `pcsctl plan` offline, and demo / export as a user runs
# them.
pcs_add_test(NAME test_pcsctl SOURCES integration/test_pcsctl.c LIBS pcs_common
             LABELS integration TIMEOUT 120)
add_dependencies(test_pcsctl pcsctl pcs-coordinator)

pcs_add_test(NAME test_e2e_cli SOURCES integration/test_e2e_cli.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
set_target_properties(test_e2e_cli PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_e2e_cli pcsctl pcs-worker pcs-coordinator pcs-reference)

# pcsctl plan (offline, no coordinator): the demo job re-planned for 8 ranks, one rank's view.
add_test(NAME plan_cli_demo COMMAND pcsctl plan ${PROJECT_SOURCE_DIR}/examples/demo-job.yaml
         --world 8 --rank 5)
set_tests_properties(plan_cli_demo PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION "shard group \\(index 5 of 8\\): 0 1 2 3 4 5 6 7")
add_test(NAME plan_cli_json COMMAND pcsctl plan ${PROJECT_SOURCE_DIR}/examples/hsdp-job.yaml --json)
set_tests_properties(plan_cli_json PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION "\"strategy\": \"STRATEGY_HYBRID_SHARD\"")
add_test(NAME plan_cli_bad_world_fails COMMAND pcsctl plan
         ${PROJECT_SOURCE_DIR}/examples/hsdp-job.yaml --world 7)
set_tests_properties(plan_cli_bad_world_fails PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION "mesh: world size 7 is not a multiple of pp x dp_replicate = 2")
add_test(NAME plan_cli_pipeline_not_run COMMAND pcsctl plan
         ${PROJECT_SOURCE_DIR}/tests/data/pipeline-job.yaml)
set_tests_properties(plan_cli_pipeline_not_run PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION
  "not run by this release \\(SubmitJob refuses it\\): mesh: pipeline stages \\(pp = 2\\)")
