# Planner (coordinator/plan*.c, model.c): table-driven acceptance cases and property tests.
if(TARGET pcs_plan)
  foreach(t test_plan test_plan_props)
    if(EXISTS ${PROJECT_SOURCE_DIR}/tests/unit/${t}.c)
      pcs_add_test(NAME ${t} SOURCES ${PROJECT_SOURCE_DIR}/tests/unit/${t}.c
                   LIBS pcs_plan pcs_common LABELS unit TIMEOUT 120)
    endif()
  endforeach()
endif()
