// SPDX-License-Identifier: Apache-2.0
#pragma once

// ChainerMN's global except hook, on by default: an exception that nothing catches (on any thread)
// ends the whole job at once with one line naming the rank and the exception, instead of leaving
// the other ranks waiting for this one. Installed when the first cohort communicator is made; a
// handler the program sets after that replaces it.

#include <cohort/config.hpp>
#include <cohort/detail/watchdog.hpp>

#include <mpi.h>

#include <exception>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

[[noreturn]] inline void end_job_on_terminate() noexcept {
  int rank = -1;
  int initialized = 0;
  int finalized = 0;
  if (MPI_Initialized(&initialized) == MPI_SUCCESS && initialized != 0 &&
      MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  std::string what = "std::terminate was called without an exception";
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      what = "uncaught exception: " + std::string(e.what());
    } catch (...) {
      what = "uncaught exception of a type not derived from std::exception";
    }
  }
  end_job("cohort: rank " + std::to_string(rank) + ": terminate called (" + what +
          "); ending the job");
}

inline void install_terminate_handler() {
  static const bool installed = [] {
    std::set_terminate(&end_job_on_terminate);
    return true;
  }();
  static_cast<void>(installed);
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
