// SPDX-License-Identifier: Apache-2.0
#pragma once

// The wrapped optimizer's step as cohort's optimizer concept sees it, and what the wrapper asks
// of a communicator's memory.

#include <cohort/adapters/torch/detail/shard.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <exception>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// The wrapped optimizer's own step (the wrapper is one: its `step` overrides it), as cohort's
// optimizer concept sees it: `step()` without a closure. LBFGS has none (it needs the closure):
// its steps go through step(closure), and a plain step() is refused by name. With a shard
// (cohort::torch::sharded_optimizer), it steps this rank's parameters alone, then every rank's
// are gathered.
template <class Optimizer, class Communicator>
struct stepper {
  Optimizer* optimizer;
  shard<Communicator>* sharding = nullptr;
  void step() {
    if constexpr (requires { optimizer->Optimizer::step(); }) {
      if (sharding == nullptr) {
        optimizer->Optimizer::step();
        return;
      }
      sharding->hide_others();
      std::exception_ptr failure;
      try {
        optimizer->Optimizer::step();
      } catch (...) {
        failure = std::current_exception();
      }
      sharding->restore_others();
      sharding->require_every_rank_stepped(failure);
      sharding->gather();
    } else {
      throw invalid_argument("cohort::torch::distributed_optimizer: this optimizer steps with a "
                             "closure only (LBFGS): call step(closure)");
    }
  }
};

// Whether `Communicator` reduces device memory (a GPU strategy, or a run-time choice of them).
template <class Communicator>
constexpr bool reduces_device_memory() {
  return requires {
    requires Communicator::reduces_gpu_memory;
  };
}

// Whether it may: a run-time choice among host and GPU strategies, whose stream no one could
// follow (refused by stream_order).
template <class Communicator>
constexpr bool may_reduce_device_memory() {
  return reduces_device_memory<Communicator>() || requires {
    requires Communicator::may_reduce_gpu_memory;
  };
}

} // namespace detail
} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
