// SPDX-License-Identifier: Apache-2.0
#pragma once

// MPI errors as cohort's exceptions: every MPI return code is checked, and names the operation,
// the rank and MPI's own message.

#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/archive/archive_exception.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/exception.hpp>
#include <mpi.h>

#include <string>
#include <string_view>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

//! The rank of the calling process in `comm`, or -1 if MPI cannot tell (used in messages only).
inline int rank_of(MPI_Comm comm) noexcept {
  int rank = -1;
  if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) {
    return -1;
  }
  return rank;
}

//! The rank of this process in MPI_COMM_WORLD, or -1 before MPI_Init and after MPI_Finalize: what
//! errors of other engines (CUDA, NCCL) name as "the rank".
inline int world_rank() noexcept {
  int initialized = 0;
  int finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || initialized == 0 ||
      MPI_Finalized(&finalized) != MPI_SUCCESS || finalized != 0) {
    return -1;
  }
  return rank_of(MPI_COMM_WORLD);
}

//! Turns an MPI return code into an `engine_error` naming the operation, the rank and MPI's own
//! message.
COHORT_DECL void check(int code, std::string_view operation, MPI_Comm comm);

//! The number of ranks of `comm`.
inline int comm_size(MPI_Comm comm) {
  int size = 0;
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size", comm);
  return size;
}

//! Runs a Boost.MPI call and turns its `boost::mpi::exception` into an `engine_error`.
//! A Boost.Serialization failure (an archive that cannot be read) becomes a `cohort::error` too.
template <class F>
decltype(auto) translate(std::string_view operation, const boost::mpi::communicator& comm, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const boost::mpi::exception& e) {
    throw engine_error("MPI", std::string(operation), rank_of(comm), e.result_code(), e.what());
  } catch (const boost::archive::archive_exception& e) {
    throw error("cohort: " + std::string(operation) + " on rank " + std::to_string(rank_of(comm)) +
                ": serialization failed: " + e.what());
  }
}

//! Makes every error on `comm` return a code instead of aborting, so that it becomes an exception.
inline void return_errors(MPI_Comm comm) {
  check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", comm);
}

} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/transport/impl/mpi_error.ipp>
#endif
