# SPDX-License-Identifier: Apache-2.0
# Builds and runs test/package/consumer the way a user would, for ctest:
#   cmake -DROUTE=... -DWORK=<scratch dir> -DSOURCE=<cohort source> -DBUILD=<cohort build>
#         -DMPIEXEC=... [-DCOMPONENTS=nccl] [-DEXTRA=...] -P consume.cmake
# ROUTE: build_tree, install_tree, add_subdirectory, fetchcontent, or staging (configure and
# install cohort afresh with the options vcpkg's portfile uses, then consume the install).
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${result}): ${command}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(consumer_args -DCOHORT_COMPONENTS=${COMPONENTS})
if(ROUTE STREQUAL "build_tree")
  list(APPEND consumer_args -DCOHORT_ROUTE=find_package -Dcohort_DIR=${BUILD})
elseif(ROUTE STREQUAL "install_tree")
  run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
  list(APPEND consumer_args -DCOHORT_ROUTE=find_package -DCMAKE_PREFIX_PATH=${WORK}/prefix)
elseif(ROUTE STREQUAL "staging")
  # What packaging/vcpkg/cohort/portfile.cmake runs, by hand: configure, install, then consume.
  run(${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK}/cohort-build -DCOHORT_BUILD_TESTS=OFF
      -DCOHORT_BUILD_EXAMPLES=OFF -DCOHORT_BUILD_BENCHMARKS=OFF -DCMAKE_INSTALL_DATADIR=share)
  run(${CMAKE_COMMAND} --install ${WORK}/cohort-build --prefix ${WORK}/staging)
  list(APPEND consumer_args -DCOHORT_ROUTE=find_package -DCMAKE_PREFIX_PATH=${WORK}/staging)
elseif(ROUTE STREQUAL "add_subdirectory" OR ROUTE STREQUAL "fetchcontent")
  list(APPEND consumer_args -DCOHORT_ROUTE=${ROUTE} -DCOHORT_SOURCE_DIR=${SOURCE})
else()
  message(FATAL_ERROR "unknown ROUTE '${ROUTE}'")
endif()

run(${CMAKE_COMMAND} -S ${SOURCE}/test/package/consumer -B ${WORK}/consumer ${consumer_args}
    ${EXTRA})
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${MPIEXEC} -np 2 ${WORK}/consumer/trainer)
# An installed package has the launcher beside it (bin/cohort-run), and it runs the trainer.
foreach(prefix IN ITEMS ${WORK}/prefix ${WORK}/staging)
  if(EXISTS ${prefix})
    run(${prefix}/bin/cohort-run --mpirun ${MPIEXEC} --ranks-per-host 2 --max-restarts 0 --
        ${WORK}/consumer/trainer)
  endif()
endforeach()
