# SPDX-License-Identifier: Apache-2.0
# The consumer compiled and linked by hand with `pkg-config --cflags --libs cohort`, as a build
# system that is not CMake would, from an install tree; then run at 2 ranks.
#   cmake -DWORK=... -DSOURCE=... -DBUILD=... -DMPIEXEC=... -DPKG_CONFIG=... -DCXX=... -P ...
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${result}): ${command}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
set(ENV{PKG_CONFIG_PATH} ${WORK}/prefix/share/pkgconfig)
run(${PKG_CONFIG} --cflags --libs cohort)
separate_arguments(flags UNIX_COMMAND "${output}")
message(STATUS "pkg-config --cflags --libs cohort: ${output}")
run(${CXX} ${SOURCE}/test/package/consumer/main.cpp ${flags} -o ${WORK}/trainer)
run(${MPIEXEC} -np 2 ${WORK}/trainer)
