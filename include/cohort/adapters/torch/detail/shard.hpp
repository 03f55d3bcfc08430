// SPDX-License-Identifier: Apache-2.0
#pragma once

// What cohort::torch::sharded_optimizer adds to the LibTorch wrapper's step: the wrapped optimizer
// steps this rank's parameters alone (LibTorch's optimizers skip a parameter whose gradient is
// undefined, and make its state lazily at its first step: so the state is this rank's shard's),
// then every rank's updated parameters are all-gathered.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/adapters/torch/window.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/training/detail/parameter_gather.hpp>
#include <cohort/training/shard_plan.hpp>
#include <cohort/training/sharded_optimizer.hpp>

#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

template <class Communicator>
class shard {
public:
  //! Agrees on the plan over `params` (collective).
  shard(Communicator& comm, std::vector<parameter>& params, zero_stage stage)
      : comm_(&comm)
      , params_(&params)
      , source_(params)
      , stage_(stage)
      , plan_(cohort::detail::plan_parameter_shards(comm, source_, values_, names_,
                                                    "cohort::torch::sharded_optimizer"))
      , stash_(params.size()) {
    gather_.build(values_, names_, plan_, comm.rank(), comm.options().bucket_bytes);
  }

  const shard_plan& plan() const noexcept { return plan_; }
  zero_stage stage() const noexcept { return stage_; }
  bool owns(std::size_t index) const noexcept { return plan_.owner[index] == comm_->rank(); }

  //! Whose each gradient is, for a reduce-scatter (stage 2), or nothing (stage 1: all-reduced).
  std::span<const int> scatter_owners() const noexcept {
    return stage_ == zero_stage::gradients ? std::span<const int>(plan_.owner)
                                           : std::span<const int>();
  }

  //! Before the wrapped optimizer steps: the gradients this rank does not own are taken away, so
  //! that it steps (and keeps state for) its own alone. Stage 1 puts them back after the step
  //! (they hold reduced values); stage 2 frees them (they hold this rank's unreduced ones), but
  //! in a shared window (shared_memory), where they must stay.
  void hide_others() {
    for (std::size_t i = 0; i < params_->size(); ++i) {
      if (!owns(i)) {
        at::Tensor& grad = (*params_)[i].value.mutable_grad();
        if (keeps_others()) {
          stash_[i] = std::move(grad);
        }
        grad = at::Tensor();
      }
    }
  }

  void restore_others() noexcept {
    if (keeps_others()) {
      for (std::size_t i = 0; i < params_->size(); ++i) {
        if (stash_[i].defined()) {
          (*params_)[i].value.mutable_grad() = std::move(stash_[i]);
          stash_[i] = at::Tensor();
        }
      }
    }
  }

  //! Throws on every rank if the wrapped optimizer's step failed on any (collective).
  void require_every_rank_stepped(const std::exception_ptr& failure) {
    cohort::detail::require_every_rank_succeeded(*comm_, failure,
                                                 "cohort::torch::sharded_optimizer::step");
  }

  //! Every rank's updated parameters, from their owners (collective). Those received count as
  //! modified in place, as the optimizer's own updates do (a graph that saved them refuses a
  //! backward through them on every rank alike).
  void gather() {
    source_.values(values_, names_);
    gather_.run(*comm_, values_, names_);
    for (std::size_t i = 0; i < params_->size(); ++i) {
      if (!owns(i)) {
        ::torch::autograd::impl::bump_version((*params_)[i].value);
      }
    }
  }

  //! Drops the state of the parameters this rank does not own (after the root's whole state was
  //! copied to every rank: at construction, or a load).
  void drop_others_state(::torch::optim::Optimizer& optimizer) const {
    auto& state = optimizer.state();
    for (std::size_t i = 0; i < params_->size(); ++i) {
      if (!owns(i)) {
        state.erase(state_key(state, (*params_)[i].value));
      }
    }
  }

private:
  // Stage 2 frees them, except in a shared window (shared_memory), where they must stay.
  bool keeps_others() const noexcept {
    return stage_ == zero_stage::optimizer_state || shares_a_window<Communicator>;
  }

  Communicator* comm_;
  std::vector<parameter>* params_;
  parameter_source source_;
  zero_stage stage_;
  std::vector<tensor_view> values_;
  std::vector<std::string> names_;
  shard_plan plan_;
  std::vector<at::Tensor> stash_;
  cohort::detail::parameter_gather gather_;
};

} // namespace detail
} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
