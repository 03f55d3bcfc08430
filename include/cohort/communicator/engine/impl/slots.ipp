// SPDX-License-Identifier: Apache-2.0
#pragma once

// What engine/slots.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/agreement.hpp>
#include <cohort/communicator/engine/slots.hpp>
#include <cohort/detail/fingerprint.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::string slot_label(const grad_slot& slot) {
  return "parameter '" + std::string(slot.name) + "'";
}

COHORT_DECL std::string slot_description(const grad_slot& slot) {
  switch (slot.state) {
  case slot_state::missing:
    return "no gradient (value of " + std::to_string(slot.value_count) + " elements)";
  case slot_state::wrong_size:
    return "a gradient of " + describe_tensor(slot.grad.count, slot.grad.type) +
           " for a value of " + std::to_string(slot.value_count) + " elements";
  case slot_state::not_contiguous:
    return "a gradient that is not one dense block of memory (strided, or sparse)";
  case slot_state::ok:
    break;
  }
  return "a gradient of " + describe_tensor(slot.grad.count, slot.grad.type) + " in " +
         std::string(to_string(slot.grad.location)) + " memory" +
         (slot.rows == 0 ? std::string() : ", as " + std::to_string(slot.rows) + " rows");
}

COHORT_DECL std::uint64_t slots_fingerprint(std::span<const grad_slot> slots) {
  detail::fingerprint f;
  f.add(slots.size());
  for (const auto& slot : slots) {
    f.add(slot.name)
        .add(slot.value_count)
        .add(static_cast<std::uint64_t>(slot.state))
        .add(slot.grad.count)
        .add(static_cast<std::uint64_t>(slot.grad.type))
        .add(static_cast<std::uint64_t>(slot.grad.location))
        .add(slot.rows);
  }
  return f.value();
}

COHORT_DECL std::string describe_reduction(const grad_reduction& plan) {
  const auto number = [](double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return std::string(text);
  };
  return std::string(to_string(plan.op)) + " over " + std::string(to_string(plan.wire)) +
         " on the wire, scaled by " + number(plan.pre_scale) + " before and " +
         number(plan.post_scale) + " after";
}

COHORT_DECL void check_owners(std::span<const int> owners, std::span<const grad_slot> slots,
                              int rank, int ranks, bool device_strategy) {
  const std::string where =
      "cohort: a reduce-scattered allreduce_grad on rank " + std::to_string(rank) + ": ";
  if (device_strategy) {
    throw invalid_argument(where + "this communicator's strategy reduces device memory, and "
                                   "gradients are reduce-scattered by host strategies only");
  }
  if (owners.size() != slots.size()) {
    throw invalid_argument(where + std::to_string(owners.size()) + " owners for " +
                           std::to_string(slots.size()) +
                           " parameters (the shard plan is of another parameter set)");
  }
  for (std::size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] < 0 || owners[i] >= ranks) {
      throw invalid_argument(where + slot_label(slots[i]) + " is owned by rank " +
                             std::to_string(owners[i]) + ", not one of the " +
                             std::to_string(ranks) + " ranks");
    }
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
