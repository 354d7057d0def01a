# Planner (coordinator/plan*.c, model.c): table-driven acceptance cases and property tests.
if(TARGET pcs_plan)
  foreach(t test_plan test_plan_props)
    if(EXISTS ${PROJECT_SOURCE_DIR}/tests/unit/${t}.c)
      pcs_add_test(NAME ${t} SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/${t}.c
                   LIBS pcs_plan pcs_common LABELS unit TIMEOUT 120)
    endif()
  endforeach()
endif()

# pcsctl plan (offline, no coordinator): the demo job re-planned for 8 ranks, one rank's view.
if(TARGET pcsctl AND EXISTS ${PROJECT_SOURCE_DIR}/cli/cmd_plan.c)
  add_test(NAME plan_cli_demo COMMAND pcsctl plan ${PROJECT_SOURCE_DIR}/examples/demo-job.yaml
           --world 8 --rank 5)
  set_tests_properties(plan_cli_demo PROPERTIES LABELS integration TIMEOUT 60
    PASS_REGULAR_EXPRESSION "shard group \\(index 5 of 8\\): 0 1 2 3 4 5 6 7")
  add_test(NAME plan_cli_json COMMAND pcsctl plan ${PROJECT_SOURCE_DIR}/examples/hsdp-job.yaml
           --json)
  set_tests_properties(plan_cli_json PROPERTIES LABELS integration TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"strategy\": \"hybrid_shard\"")
  add_test(NAME plan_cli_bad_world_fails COMMAND pcsctl plan
           ${PROJECT_SOURCE_DIR}/examples/hsdp-job.yaml --world 7)
  set_tests_properties(plan_cli_bad_world_fails PROPERTIES LABELS integration TIMEOUT 60
    PASS_REGULAR_EXPRESSION "mesh: world size 7 is not a multiple of pp x dp_replicate = 2")
endif()
