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

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
