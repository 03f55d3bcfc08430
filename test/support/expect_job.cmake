# SPDX-License-Identifier: Apache-2.0
# Runs a whole MPI job that is meant to fail, and checks how it ends: not by the time limit (a
# hang), with a non-zero exit code unless EXPECT_EXIT_ZERO, with output matching EXPECT, and
# never matching REJECT. Used by the fault tests (test/communicator/failure.cpp).
#
# With TRACE, the job runs with COHORT_TRACE=TRACE and its trace files, together, must match
# TRACE_EXPECT.
#
# cmake -DMPIEXEC=... -DRANKS=n -DPROGRAM=... -DMODE=... -DEXPECT=regex [-DREJECT=regex]
#       [-DLIMIT=seconds] [-DEXPECT_EXIT_ZERO=ON] [-DTRACE=dir -DTRACE_EXPECT=regex]
#       -P expect_job.cmake
if(NOT LIMIT)
  set(LIMIT 40)
endif()
if(TRACE)
  file(REMOVE_RECURSE ${TRACE})
  set(ENV{COHORT_TRACE} ${TRACE})
endif()
string(TIMESTAMP started "%s")
execute_process(
  COMMAND ${MPIEXEC} -n ${RANKS} ${PROGRAM} ${MODE}
  TIMEOUT ${LIMIT}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
string(TIMESTAMP ended "%s")
math(EXPR took "${ended} - ${started}")
message("${output}")
message("-- the job ended with '${result}' after ${took} s")
if(result MATCHES "timeout|Process terminated due to timeout")
  message(FATAL_ERROR "the job hung: still running after ${LIMIT} s")
endif()
if(EXPECT_EXIT_ZERO)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "the job failed (${result}) where it should have succeeded")
  endif()
elseif(result EQUAL 0)
  message(FATAL_ERROR "the job succeeded where it should have failed")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not say '${EXPECT}'")
endif()
if(REJECT AND output MATCHES "${REJECT}")
  message(FATAL_ERROR "the output says '${REJECT}'")
endif()
if(TRACE)
  file(GLOB traces ${TRACE}/*.json)
  set(all)
  foreach(f ${traces})
    file(READ ${f} text)
    string(APPEND all "${text}")
  endforeach()
  list(LENGTH traces files)
  if(NOT all MATCHES "${TRACE_EXPECT}")
    message(FATAL_ERROR "the ${files} trace files in ${TRACE} do not say '${TRACE_EXPECT}'")
  endif()
  message("-- ${files} trace files, saying '${TRACE_EXPECT}'")
endif()
