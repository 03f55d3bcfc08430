// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Options shared by every communicator strategy.
struct communicator_options {
  //! Simulates nodes of this many consecutive ranks instead of asking MPI which ranks share
  //! memory (`MPI_COMM_TYPE_SHARED`): 0 asks MPI. When 0, the environment variable
  //! `COHORT_RANKS_PER_NODE` is read instead, so that a test can run "2 nodes x 2 ranks" on one
  //! machine without recompiling.
  int simulated_ranks_per_node = 0;

  //! Before each collective, check that every rank passes the same counts, sizes and dtypes, and
  //! throw `mismatch_error` on every rank if not (cost: one 16-byte all-reduce per call). When
  //! off, a mismatch is undefined behaviour of MPI: a hang, an MPI error or wrong numbers.
  bool check_agreement = true;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
