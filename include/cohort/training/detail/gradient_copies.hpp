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
  void make(std::span<const grad_slot> slots);

  //! The copies, as the slots the communicator reduces.
  std::span<const grad_slot> slots() const noexcept { return slots_; }

  //! A reduced copy goes back to the parameter it came from, or nowhere: throws
  //! `invalid_argument` naming `operation` unless `slots` match the copies' names, sizes, dtypes.
  void require_same_layout(std::span<const grad_slot> slots, int rank,
                           std::string_view operation) const;

  //! Swaps each gradient of `slots` with its copy.
  void swap_with(std::span<const grad_slot> slots);

private:
  std::vector<std::vector<std::byte>> bytes_;
  std::vector<std::string> names_;
  std::vector<grad_slot> slots_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/training/detail/impl/gradient_copies.ipp>
#endif
