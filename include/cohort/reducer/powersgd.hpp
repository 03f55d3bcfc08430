// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019), as PyTorch DDP's `powerSGD_hook`: each
// matrix-shaped gradient M (n x m) is sent as two thin factors, P = M Q (n x r) and
// Q = Mᵀ P̂ (m x r), with P̂ the orthonormalized sum of every rank's P, so a step carries
// (n + m) r values instead of n m. What the compression drops is added back at the next step
// (error feedback), and Q starts each step from the last one (warm start), one power iteration
// per step. A gradient hook (reducer/concepts.hpp):
//
//   cohort::distributed_optimizer<SGD, cohort::hierarchical<>, cohort::powersgd> opt(
//       sgd, comm, params, {}, cohort::powersgd({.rank = 4, .start_step = 100}));
//
// The P and Q exchanges go through the communicator's own strategy. Where it departs from
// PyTorch, on purpose:
// - the error kept is this rank's own, (I − P̂P̂ᵀ)(g + e), and only for compressed tensors:
//   the same updates in exact arithmetic as PyTorch's (g + e) − mean (docs/compression.md shows
//   why), without the random walk that PyTorch's per-rank error does, nor its copy of every
//   bucket at every step;
// - the uncompressed tensors and P travel in one all-reduce, where PyTorch makes two in a row;
// - state is kept per parameter, not per bucket, so buckets may be rebuilt at any step (PyTorch
//   needs `start_powerSGD_iter` > 1 for that);
// - a zero column gives zeros (PyTorch's orthogonalization divides by zero there, without an
//   epsilon), and rank > 2 is orthogonalized twice by Gram-Schmidt instead of by QR;
// - nothing is allocated after a layout's first step.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/detail/powersgd_state.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/powersgd_options.hpp>
#include <cohort/tensor/dtype.hpp>

#include <memory>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A handle on PowerSGD's state: copies share it (as the calls of DDP's hook share one
//! `PowerSGDState`), so the copy an optimizer holds and the one a checkpoint is given are the
//! same. float32 and float64 gradients are compressed; other dtypes, and every gradient during
//! the warm-up steps, are averaged as `mean` does.
class powersgd {
public:
  using state_type = detail::powersgd_state;

  //! Throws `invalid_argument` naming an option out of its range.
  explicit powersgd(powersgd_options options = {})
      : state_(std::make_shared<state_type>(options)) {}

  grad_reduction plan(dtype type, int ranks) const noexcept { return mean{}.plan(type, ranks); }

  const std::shared_ptr<state_type>& state() const noexcept { return state_; }
  const powersgd_options& options() const noexcept { return state_->options(); }

  //! Values sent and what they would have been uncompressed, since the handle was made.
  powersgd_stats stats() const { return state_->stats(); }

  //! This rank's error feedback for the parameter named `name` (its last layout that has one), as
  //! double; empty where it has none. For tests and diagnostics.
  std::vector<double> error_of(std::string_view name) const { return state_->error_of(name); }

private:
  std::shared_ptr<state_type> state_;
};

static_assert(gradient_hook<powersgd>);

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
