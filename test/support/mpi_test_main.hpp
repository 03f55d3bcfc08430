// SPDX-License-Identifier: Apache-2.0
#pragma once

// The main() of every multi-rank test: MPI is started by a boost::mpi::environment (the user owns
// it, as in a trainer), then Boost.Test runs on every rank. A hang watchdog turns a stuck
// collective into a failed test that names the operation: if the tests have not finished after
// COHORT_TEST_WATCHDOG seconds (default 60) plus one second per rank, the rank prints where it is
// and exits with 124, and mpirun then ends the others. The stagger lets the lowest stuck rank
// speak first instead of every rank at once.
//
// Include it once, after defining BOOST_TEST_MODULE, in each test executable. The build defines
// BOOST_TEST_DYN_LINK and BOOST_TEST_NO_MAIN for such executables (test/CMakeLists.txt), so that
// the order of includes does not matter.

#if !defined(BOOST_TEST_DYN_LINK) || !defined(BOOST_TEST_NO_MAIN)
#error "multi-rank tests are built with BOOST_TEST_DYN_LINK and BOOST_TEST_NO_MAIN defined"
#endif

#include <cohort/detail/operation.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace cohort::test {

class hang_watchdog {
public:
  // The rank is read here, on the main thread: MPI runs single-threaded, so the watchdog thread
  // makes no MPI call of its own.
  hang_watchdog(std::chrono::seconds limit, int rank)
      : thread_([this, limit, rank] {
        std::unique_lock lock(mutex_);
        if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) {
          const char* operation = cohort::current_operation();
          std::fprintf(stderr, "cohort test watchdog: rank %d stuck in %s after %lld s; aborting\n",
                       rank, operation != nullptr ? operation : "(no cohort operation)",
                       static_cast<long long>(limit.count()));
          std::fflush(stderr);
          std::_Exit(124);
        }
      }) {}

  ~hang_watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }

private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

inline std::chrono::seconds watchdog_limit(int rank) {
  const char* text = std::getenv("COHORT_TEST_WATCHDOG");
  return std::chrono::seconds((text != nullptr ? std::atol(text) : 60) + rank);
}

} // namespace cohort::test

int main(int argc, char* argv[]) {
#ifdef COHORT_TEST_MPI_THREAD_MULTIPLE
  // For the tests of overlap, whose reductions run on cohort's own thread.
  boost::mpi::environment env(argc, argv, boost::mpi::threading::multiple);
#else
  boost::mpi::environment env(argc, argv);
#endif
  int result = 0;
  {
    const int rank = boost::mpi::communicator().rank();
    cohort::test::hang_watchdog watchdog(cohort::test::watchdog_limit(rank), rank);
    result = boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
  }
  return result;
}
