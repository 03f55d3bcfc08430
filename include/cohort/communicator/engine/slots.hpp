// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the engine says of gradient slots: their labels and descriptions in messages, the
// fingerprint of a layout the ranks compare, the dtypes present, a reducer's plan in words.

#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>

#include <cstdint>
#include <span>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::string slot_label(const grad_slot& slot);

COHORT_DECL std::string slot_description(const grad_slot& slot);

COHORT_DECL std::uint64_t slots_fingerprint(std::span<const grad_slot> slots);

//! The dtypes among `slots` that have a gradient to reduce, as a bit mask over `all_dtypes`.
inline unsigned present_dtypes(std::span<const grad_slot> slots) noexcept {
  unsigned mask = 0;
  for (const auto& slot : slots) {
    if (slot.state == slot_state::ok && slot.grad.count != 0) {
      mask |= 1u << dtype_index(slot.grad.type);
    }
  }
  return mask;
}

//! "summed as float16 on the wire, scaled by 0.5 before and 1 after", for messages.
COHORT_DECL std::string describe_reduction(const grad_reduction& plan);

//! Throws `invalid_argument` unless `owners` (grad_sync_options::owners) names a rank of `ranks`
//! for each of `slots`, on a strategy that can reduce-scatter them (a host one).
COHORT_DECL void check_owners(std::span<const int> owners, std::span<const grad_slot> slots,
                              int rank, int ranks, bool device_strategy);

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/slots.ipp>
#endif
