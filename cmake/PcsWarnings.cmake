# Warning set of STYLE.md B10 plus -Wpedantic (ISO C11/C++17, no GNU extensions); PCS_WERROR
# turns them into errors (CI does).
set(PCS_C_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2
    -Wno-unused-parameter)
set(PCS_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wformat=2 -Wno-unused-parameter)
if(PCS_WERROR)
  list(APPEND PCS_C_WARNINGS -Werror)
  list(APPEND PCS_CXX_WARNINGS -Werror)
endif()

# pcs_target_warnings(target): apply the project's warning set to a target's own sources.
function(pcs_target_warnings tgt)
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${PCS_C_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CXX>:${PCS_CXX_WARNINGS}>)
endfunction()
