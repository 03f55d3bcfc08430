# SPDX-License-Identifier: Apache-2.0
# Running programs under mpirun from ctest, on a machine with fewer cores than ranks:
# oversubscription allowed, idle ranks yield the core instead of busy-polling (5-10x faster when
# oversubscribed), and root allowed (CI containers run as root).

set(COHORT_MPI_TEST_ENVIRONMENT
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe)

# cohort_add_mpi_test(NAME name TARGET target RANKS n [ARGS ...] [TIMEOUT s] [LABELS ...]
#                     [ENVIRONMENT ...])
function(cohort_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;RANKS;TIMEOUT" "ARGS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${T_NAME}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES
    TIMEOUT ${T_TIMEOUT}
    LABELS "mpi;${T_LABELS}"
    PROCESSORS 2
    ENVIRONMENT "${COHORT_MPI_TEST_ENVIRONMENT};${T_ENVIRONMENT}")
endfunction()

# cohort_add_skipped_test(name reason LABELS ...): where a test cannot run on this machine, a test
# that says why and that ctest reports as skipped, never a silent pass.
function(cohort_add_skipped_test name reason)
  cmake_parse_arguments(S "" "" "LABELS" ${ARGN})
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E echo "${reason}: skipped")
  set_tests_properties(${name} PROPERTIES LABELS "${S_LABELS}"
                       SKIP_REGULAR_EXPRESSION ": skipped")
endfunction()
