// SPDX-License-Identifier: Apache-2.0
#pragma once

// What cohort::torch::distributed_optimizer compares across ranks at every step: the param
// groups' learning rates (what an edit of param_groups() or a scheduler changes) and sizes, in
// one 16-byte all-reduce; and that no group was added after it was made.

#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <torch/optim/optimizer.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch::detail {

class step_settings {
public:
  explicit step_settings(const ::torch::optim::Optimizer& optimizer)
      : optimized_(tensors_in(optimizer))
      , lr_readable_(lr_readable(optimizer)) {}

  //! Collective (none with the agreement check off). Where the ranks' settings differ, every
  //! rank throws `mismatch_error` naming the option; a group added since construction is an
  //! `invalid_argument` on every rank (its parameters are not reduced).
  template <class Communicator>
  void agree(Communicator& comm, const ::torch::optim::Optimizer& optimizer) const {
    if (!comm.options().check_agreement) {
      return;
    }
    if (!cohort::detail::same_on_every_rank(comm, fingerprint_of(optimizer))) {
      agree_on_optimizer(comm, optimizer, "distributed_optimizer::step (the optimizer's settings)");
      throw mismatch_error("cohort::torch::distributed_optimizer::step on rank " +
                           std::to_string(comm.rank()) +
                           ": the ranks' param groups differ in number or size (a group added on "
                           "some ranks only?)");
    }
    if (const std::size_t now = tensors_in(optimizer); now != optimized_) {
      // (on every rank alike: their groups' sizes agree)
      throw invalid_argument(
          "cohort::torch::distributed_optimizer::step on rank " + std::to_string(comm.rank()) +
          ": its param groups hold " + std::to_string(now) + " tensors, and held " +
          std::to_string(optimized_) +
          " when it was made: cohort reduces the gradients of the module it was made over only "
          "(add every param group before wrapping the optimizer)");
    }
  }

private:
  static std::size_t tensors_in(const ::torch::optim::Optimizer& optimizer) {
    std::size_t n = 0;
    for (const auto& group : optimizer.param_groups()) {
      n += group.params().size();
    }
    return n;
  }

  // Whether the options have a learning rate (LibTorch's do; a user's own may not, and throw):
  // asked once, not at every step.
  static bool lr_readable(const ::torch::optim::Optimizer& optimizer) {
    try {
      for (const auto& group : optimizer.param_groups()) {
        if (group.has_options()) {
          (void)group.options().get_lr();
        }
      }
      return true;
    } catch (const c10::Error&) {
      return false;
    }
  }

  cohort::detail::fingerprint fingerprint_of(const ::torch::optim::Optimizer& optimizer) const {
    cohort::detail::fingerprint f;
    f.add(optimizer.param_groups().size());
    for (const auto& group : optimizer.param_groups()) {
      f.add(group.params().size());
      if (lr_readable_ && group.has_options()) {
        f.add(std::bit_cast<std::uint64_t>(group.options().get_lr()));
      }
    }
    return f;
  }

  std::size_t optimized_; // the tensors in the param groups, at construction
  bool lr_readable_;
};

} // namespace torch::detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
