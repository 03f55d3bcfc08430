// SPDX-License-Identifier: Apache-2.0
#pragma once

// What gradients.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/gradients.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

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
         std::string(to_string(slot.grad.location)) + " memory";
}

COHORT_DECL std::uint64_t slots_fingerprint(std::span<const grad_slot> slots) {
  fingerprint f;
  f.add(slots.size());
  for (const auto& slot : slots) {
    f.add(slot.name)
        .add(slot.value_count)
        .add(static_cast<std::uint64_t>(slot.state))
        .add(slot.grad.count)
        .add(static_cast<std::uint64_t>(slot.grad.type))
        .add(static_cast<std::uint64_t>(slot.grad.location));
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

COHORT_DECL std::uint64_t reduction_fingerprint(std::span<const grad_slot> slots,
                                                std::string_view mode,
                                                const reduction_table& plan_of) {
  fingerprint f;
  f.add(mode);
  const unsigned present = present_dtypes(slots);
  for (std::size_t d = 0; d < dtype_count; ++d) {
    if ((present & (1u << d)) != 0) {
      const grad_reduction plan = plan_of(all_dtypes[d]);
      f.add(d)
          .add(static_cast<std::uint64_t>(plan.wire))
          .add(std::bit_cast<std::uint64_t>(plan.pre_scale))
          .add(std::bit_cast<std::uint64_t>(plan.post_scale))
          .add(static_cast<std::uint64_t>(plan.op));
    }
  }
  return f.value();
}

COHORT_DECL std::vector<signature_entry> describe_reduction_plan(std::span<const grad_slot> slots,
                                                                 const reduction_table& plan_of) {
  std::vector<signature_entry> entries;
  const unsigned present = present_dtypes(slots);
  for (std::size_t d = 0; d < dtype_count; ++d) {
    if ((present & (1u << d)) != 0) {
      entries.push_back(
          {"the reducer's plan for " + std::string(to_string(all_dtypes[d])) + " gradients",
           describe_reduction(plan_of(all_dtypes[d]))});
    }
  }
  return entries;
}

COHORT_DECL bool validate_gradients(liveness& live, waiter who, const char* operation,
                                    std::uint64_t sequence, std::span<const grad_slot> slots,
                                    bool check, missing_grad missing, const std::string& problem,
                                    std::string_view mode, const reduction_table& plan_of,
                                    tensor_view carried, reduce_op op) {
  bool reduced = false;
  if (check) {
    fingerprint f;
    f.add(slots_fingerprint(slots)).add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    f.add(mode);
    const auto describe_layout = [&] {
      std::vector<signature_entry> entries;
      entries.reserve(slots.size() + 2);
      if (!problem.empty()) {
        entries.push_back({"the call", "failed (" + problem + ")"});
      }
      if (mode != "blocking") {
        // Only where it is not the usual, so that layout messages keep their item numbers.
        entries.push_back({"the reduction", std::string(mode)});
      }
      for (const auto& slot : slots) {
        entries.push_back({slot_label(slot), slot_description(slot)});
      }
      return entries;
    };
    // The plan is compared only where the layouts agree (it follows from the layout's dtypes).
    const auto describe_plan = [&] { return describe_reduction_plan(slots, plan_of); };
    const auto layout =
        std::pair<std::uint64_t, decltype(describe_layout)&>(f.value(), describe_layout);
    const auto plan = std::pair<std::uint64_t, decltype(describe_plan)&>(
        reduction_fingerprint(slots, mode, plan_of), describe_plan);
    // (Nothing carried: the rendezvous only agrees, and says nothing was reduced.)
    reduced =
        require_agreement_carrying_of(live, who, operation, sequence, carried, op, layout, plan);
  }
  if (!problem.empty()) {
    throw invalid_argument(problem);
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const auto& slot = slots[i];
    if (slot.state == slot_state::ok) {
      continue;
    }
    std::string message = "cohort: " + std::string(operation) + ": " + slot_label(slot) + " (#" +
                          std::to_string(i) + ") on rank " + std::to_string(live.rank()) + " has " +
                          slot_description(slot);
    if (slot.state == slot_state::missing) {
      message += missing == missing_grad::report
                     ? "; pass missing_grad::zero_fill to reduce a zero gradient for it"
                     : "; zero_fill needs a gradient tensor to fill: a resizable one (an empty "
                       "std::vector, say), not a null pointer";
    }
    throw invalid_argument(message);
  }
  return reduced;
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
