// SPDX-License-Identifier: Apache-2.0
#pragma once

// What distributed_optimizer (distributed_optimizer.hpp) wraps, and the options it takes.

#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>

#include <concepts>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Anything that updates parameters from their gradients with `step()`.
template <class O>
concept optimizer = std::move_constructible<O> && requires(O& o) {
  o.step();
};

//! Options of `distributed_optimizer`.
struct distributed_optimizer_options {
  //! A parameter without a gradient in a step: an error naming it (default), or a zero gradient.
  missing_grad missing = missing_grad::report;
  //! The rank whose initial parameter values every replica starts from.
  int root = 0;
  //! ChainerMN's double buffering: each `step()` starts reducing this step's gradients (a copy of
  //! them, on cohort's thread) and updates with the previous step's, already reduced while this
  //! step computed. Communication then hides entirely behind compute, at the price of gradients
  //! one step stale and a second copy of them. The first step only starts a reduction; `finish()`
  //! applies the last one. Needs an overlapping (host) strategy and MPI_THREAD_MULTIPLE. A
  //! checkpoint does not hold the reduction in flight: call `finish()` before saving one.
  bool double_buffering = false;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
