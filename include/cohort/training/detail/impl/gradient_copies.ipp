// SPDX-License-Identifier: Apache-2.0
#pragma once

// What gradient_copies.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/training/detail/gradient_copies.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL void gradient_copies::make(std::span<const grad_slot> slots) {
  bytes_.resize(slots.size());
  names_.resize(slots.size());
  slots_.resize(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    bytes_[i].assign(slots[i].grad.size_bytes(), std::byte{0});
    names_[i].assign(slots[i].name);
    slots_[i] = slots[i];
    slots_[i].grad.data = bytes_[i].data();
  }
  // Only now that the names have stopped moving may the views point into them.
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slots_[i].name = names_[i];
  }
}

COHORT_DECL void gradient_copies::require_same_layout(std::span<const grad_slot> slots, int rank,
                                                      std::string_view operation) const {
  const bool same = std::ranges::equal(slots, slots_, [](const auto& a, const auto& b) {
    return a.name == b.name && a.grad.count == b.grad.count && a.grad.type == b.grad.type;
  });
  if (!same) {
    throw invalid_argument("cohort: distributed_optimizer::" + std::string(operation) +
                           " on rank " + std::to_string(rank) +
                           ": with double_buffering the parameters must keep their names, "
                           "sizes and dtypes from step to step");
  }
}

COHORT_DECL void gradient_copies::swap_with(std::span<const grad_slot> slots) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto* grad = static_cast<std::byte*>(slots[i].grad.data);
    std::swap_ranges(grad, grad + slots[i].grad.size_bytes(), bytes_[i].begin());
  }
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
