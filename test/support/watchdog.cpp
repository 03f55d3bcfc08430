// SPDX-License-Identifier: Apache-2.0
// The hang watchdog of test/support must turn a stuck collective into a failure that names the
// operation. Rank 0 enters an all-reduce that rank 1 never joins; the test passes when the output
// says "rank 0 stuck in allreduce" (ctest's PASS_REGULAR_EXPRESSION).
#define BOOST_TEST_MODULE support.watchdog
#include <cohort/cohort.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "support/mpi_test_main.hpp"

BOOST_AUTO_TEST_CASE(stuck_collective_is_named) {
  // Without the agreement check, so that nothing but the all-reduce itself waits.
  auto comm = cohort::make_communicator<cohort::naive>({.check_agreement = false});
  if (comm.rank() == 0) {
    std::vector<float> x(4, 1.0f);
    comm.allreduce(x);
  } else {
    // Longer than the watchdog limit, so that rank 0's watchdog fires first.
    std::this_thread::sleep_for(std::chrono::seconds(30));
  }
}
