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
# the pipeline example as a user runs it: 4 workers, interleaved 1F1B, compared with the
# single-process reference
add_test(NAME demo_cli_pipeline COMMAND pcsctl demo --job
         ${PROJECT_SOURCE_DIR}/examples/pipeline-job.yaml)
set_tests_properties(demo_cli_pipeline PROPERTIES LABELS integration TIMEOUT 180
  PASS_REGULAR_EXPRESSION "parity vs single-process reference \\([0-9]+ steps[^)]*\\): OK")
# pipeline stages of the built-in model run (issue 14): the plan names the schedule and does not
# say SubmitJob refuses it
add_test(NAME plan_cli_pipeline_runs COMMAND pcsctl plan
         ${PROJECT_SOURCE_DIR}/tests/data/pipeline-job.yaml)
set_tests_properties(plan_cli_pipeline_runs PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION "note: pipeline: 1f1b over 2 ranks x 1 stages, 8 micro-batches"
  FAIL_REGULAR_EXPRESSION "not run by this release")
# the schedule as data: 1F1B's steady state on rank 0 is F then B of the micro-batch pp - 1 before
add_test(NAME plan_cli_timeline COMMAND pcsctl plan
         ${PROJECT_SOURCE_DIR}/tests/data/pipeline-job.yaml --timeline)
set_tests_properties(plan_cli_timeline PROPERTIES LABELS integration TIMEOUT 60
  PASS_REGULAR_EXPRESSION
  "timeline: 1f1b, pp 2 x 1 stages per rank, 8 micro-batches: makespan 27, bubble 0.111.*# rank 0: UNSHARD 0, 0F0, SEND_F 0>1 mb0, 0F1, SEND_F 0>1 mb1, RECV_B 0<1 mb0, 0B0")
