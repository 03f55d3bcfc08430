// SPDX-License-Identifier: Apache-2.0
#pragma once

// ZeRO stages 1 and 2 for LibTorch: `cohort::torch::sharded_optimizer<Adam, flat>` in place of
// `cohort::torch::distributed_optimizer<Adam, flat>`, the trainer's loop unchanged.

#include <cohort/adapters/torch/distributed_optimizer.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/training/shard_plan.hpp>
#include <cohort/training/sharded_optimizer.hpp>

#include <concepts>
#include <cstddef>
#include <string>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! Options of `cohort::torch::sharded_optimizer`: `distributed_options`' (in their order, so that
//! a designated initializer of those compiles here too), and the stage.
struct sharded_options {
  bool overlap = true;
  bool find_unused_parameters = false;
  int root = 0;
  zero_stage stage = zero_stage::gradients;
};

//! A drop-in for `cohort::torch::distributed_optimizer` whose optimizer state (and, at stage 2,
//! reduced gradients) shrink with the number of ranks, as PyTorch's ZeroRedundancyOptimizer
//! (stage 1) and DeepSpeed's ZeRO-2. Each rank owns a balanced shard of the module's parameters
//! (whole tensors, by bytes: `plan()`, the same on every rank); the wrapped optimizer steps that
//! shard alone (LibTorch's optimizers skip a parameter without a gradient and make state lazily,
//! so its state is the shard's), and the updated parameters are then all-gathered, so that every
//! replica holds the same values after every step.
//!
//! Stage 1: the gradients are all-reduced as by `distributed_optimizer`, while backward runs.
//! Stage 2: they are reduce-scattered instead, bucket by bucket while backward runs (each rank
//! receives its own parameters' reduced gradients only; half the bytes of an all-reduce, and
//! the all-gather the other half), and the step frees the gradients of the parameters this rank
//! does not own: between steps a rank holds its shard's gradients alone. (LibTorch's backward
//! makes every gradient: during backward they all exist, as with stage 1.) At stage 2 a second
//! backward onto reduced gradients (accumulation without `no_sync()`) is an error on every rank.
//!
//! Host strategies only; not with a gradient hook (powersgd), nor with a closure (LBFGS). Its
//! state is spread over the ranks: `torch::save` / `torch::load` of it are refused, rather than
//! saving one rank's shard as the whole; a cohort checkpoint holds every rank's shard and
//! resumes at any number of ranks (`sharded_optimizer_state`, in
//! `<cohort/adapters/torch/checkpoint.hpp>`).
template <class Optimizer, class Communicator, reducer Reducer = mean>
requires std::derived_from<Optimizer, ::torch::optim::Optimizer>
class sharded_optimizer : public distributed_optimizer<Optimizer, Communicator, Reducer> {
  using base = distributed_optimizer<Optimizer, Communicator, Reducer>;
  static_assert(!detail::may_reduce_device_memory<Communicator>(),
                "cohort::torch::sharded_optimizer packs its buckets in host memory, over host "
                "strategies (flat, hierarchical, ...); not over a GPU strategy");
  static_assert(!gradient_hook<Reducer>,
                "cohort::torch::sharded_optimizer reduces plain gradients (mean, sum, "
                "compressed); a gradient hook (powersgd) all-reduces what it computes");

public:
  using LossClosure = ::torch::optim::Optimizer::LossClosure;

  //! Collective: agrees on the shard plan (the ranks' parameter names and sizes must match),
  //! then as `distributed_optimizer`'s constructor; the state of the parameters this rank does
  //! not own is dropped once the root's has been copied.
  sharded_optimizer(Optimizer optimizer, Communicator& comm, const ::torch::nn::Module& module,
                    sharded_options options = {}, Reducer reducer = {})
      : base(std::move(optimizer), comm, module,
             distributed_options{options.overlap, options.find_unused_parameters, options.root},
             std::move(reducer), checked(options.stage)) {}

  //! Reduces (or waits for the overlapped reduction), steps this rank's shard and gathers every
  //! rank's parameters. Collective. A closure (LBFGS) is refused: its evaluations step every
  //! parameter.
  at::Tensor step(LossClosure closure = nullptr) override {
    if (closure) {
      throw invalid_argument("cohort::torch::sharded_optimizer: step(closure) (LBFGS) is not "
                             "sharded; use cohort::torch::distributed_optimizer");
    }
    return base::step();
  }

  //! Refused: this rank holds its shard's state alone, and a file of it would pass for the
  //! whole optimizer's.
  void save(::torch::serialize::OutputArchive& /*archive*/) const override {
    throw invalid_argument(spread("torch::save"));
  }
  void load(::torch::serialize::InputArchive& /*archive*/) override {
    throw invalid_argument(spread("torch::load"));
  }

  //! Who owns which parameter (in `named_parameters()`' order), the same on every rank.
  const shard_plan& plan() const noexcept { return this->sharding()->plan(); }
  //! Whether this rank owns parameter `index` (steps it; at stage 2, receives its reduced
  //! gradient).
  bool owns(std::size_t index) const noexcept { return this->sharding()->owns(index); }
  zero_stage stage() const noexcept { return this->sharding()->stage(); }

private:
  static zero_stage checked(zero_stage stage) {
    if (stage != zero_stage::optimizer_state && stage != zero_stage::gradients) {
      throw invalid_argument("cohort::torch::sharded_optimizer: stage " +
                             std::to_string(static_cast<int>(stage)) +
                             "; stages 1 (optimizer_state) and 2 (gradients) are built");
    }
    return stage;
  }

  static std::string spread(const char* what) {
    return std::string("cohort::torch::sharded_optimizer: ") + what +
           " of a sharded optimizer: each rank holds its own shard of the state, and one "
           "rank's file would pass for the whole; checkpoint every rank's shard with "
           "cohort::torch::sharded_optimizer_state (<cohort/adapters/torch/checkpoint.hpp>)";
  }
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
