# Writes <out>/pcs/version.h from version.h.in with the current git sha. Run at every build (a
# custom target), so benchmark headers and --version name the commit that was built, not the one
# CMake was configured at; the file is rewritten only when its content changes.
#   cmake -DSRC=<source dir> -DOUT=<file> -DVERSION=<x.y.z> -P PcsVersion.cmake
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE PCS_GIT_SHA OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT PCS_GIT_SHA)
  set(PCS_GIT_SHA "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(dirty)
  set(PCS_GIT_SHA "${PCS_GIT_SHA}-dirty")
endif()
set(PROJECT_VERSION ${VERSION})
configure_file(${SRC}/common/include/pcs/version.h.in ${OUT}.tmp @ONLY)
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
