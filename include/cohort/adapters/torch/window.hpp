// SPDX-License-Identifier: Apache-2.0
#pragma once

// LibTorch gradients in a communicator's shared window (the shared_memory strategy): made there,
// so that each bucket is reduced where it lies, with loads and stores.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/config.hpp>
#include <cohort/memory/shared_arena.hpp>

#include <ATen/ATen.h>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <torch/types.h>
#include <torch/utils.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// A communicator whose ranks share a window the gradients may live in (shared_memory).
template <class Communicator>
concept shares_a_window = requires(const Communicator& c) {
  { c.arena() } -> std::convertible_to<const std::shared_ptr<shared_arena>&>;
};

// A zero gradient for `value`: in the communicator's shared window where it has one and the
// value is a dense CPU tensor, so that it is reduced there (in the same order on every rank, so
// at the same offsets); else LibTorch's own. What does not fit comes from LibTorch.
template <class Communicator>
at::Tensor zero_gradient(const Communicator& comm, const at::Tensor& value) {
  if constexpr (shares_a_window<Communicator>) {
    if (value.device().is_cpu() && value.layout() == c10::kStrided) {
      std::shared_ptr<shared_arena> arena = comm.arena();
      const std::size_t bytes = static_cast<std::size_t>(value.numel()) * value.element_size();
      if (void* p = arena->allocate(bytes)) {
        std::memset(p, 0, bytes);
        return at::from_blob(
            p, value.sizes(),
            [arena = std::move(arena), bytes](void* q) { arena->deallocate(q, bytes); },
            value.options().requires_grad(false));
      }
    }
  }
  return at::zeros_like(value);
}

// Every gradient of `params` in the communicator's window, its value kept (nothing where the
// communicator has no window).
template <class Communicator>
void place_gradients_in_window(const Communicator& comm, std::vector<parameter>& params) {
  if constexpr (shares_a_window<Communicator>) {
    const ::torch::NoGradGuard no_grad;
    for (parameter& p : params) {
      at::Tensor grad = zero_gradient(comm, p.value);
      if (p.value.grad().defined()) {
        grad.copy_(p.value.grad());
      }
      p.value.mutable_grad() = grad;
    }
  }
}

} // namespace detail
} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
