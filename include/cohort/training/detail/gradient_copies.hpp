// SPDX-License-Identifier: Apache-2.0
#pragma once

// ChainerMN's double buffering, for distributed_optimizer: a copy of each gradient, reduced on
// cohort's thread while the next step computes, then swapped with the fresh gradients.

#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

class gradient_copies {
public:
  //! Copies as large as `slots`' gradients (zeros), named alike.
  void make(std::span<const grad_slot> slots) {
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

  //! The copies, as the slots the communicator reduces.
  std::span<const grad_slot> slots() const noexcept { return slots_; }

  //! A reduced copy goes back to the parameter it came from, or nowhere: throws
  //! `invalid_argument` naming `operation` unless `slots` match the copies' names, sizes, dtypes.
  void require_same_layout(std::span<const grad_slot> slots, int rank,
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

  //! Swaps each gradient of `slots` with its copy.
  void swap_with(std::span<const grad_slot> slots) {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto* grad = static_cast<std::byte*>(slots[i].grad.data);
      std::swap_ranges(grad, grad + slots[i].grad.size_bytes(), bytes_[i].begin());
    }
  }

private:
  std::vector<std::vector<std::byte>> bytes_;
  std::vector<std::string> names_;
  std::vector<grad_slot> slots_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
