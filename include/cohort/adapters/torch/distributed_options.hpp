// SPDX-License-Identifier: Apache-2.0
#pragma once

// The options of cohort::torch::distributed_optimizer (distributed_optimizer.hpp).

#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! Options of `cohort::torch::distributed_optimizer`.
struct distributed_options {
  //! Reduce buckets while backward runs (hooks on the AccumulateGrad nodes). Host strategies
  //! only (a device strategy reduces at `step()`); needs MPI started with MPI_THREAD_MULTIPLE.
  bool overlap = true;
  //! DDP's `find_unused_parameters`: a parameter backward gave no gradient counts as a zero
  //! gradient on this rank (the same zeros on every rank that did not use it). Off: it is an
  //! error naming the parameters, on every rank.
  bool find_unused_parameters = false;
  //! The rank whose parameters, buffers and optimizer state every replica starts from.
  int root = 0;
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
