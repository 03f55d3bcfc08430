// SPDX-License-Identifier: Apache-2.0
#pragma once

// What gradient_agreement.hpp declares: in every translation unit by default, compiled once where
// <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/gradient_agreement.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::uint64_t reduction_fingerprint(std::span<const grad_slot> slots,
                                                reduction_mode mode,
                                                const reduction_table& plan_of) {
  detail::fingerprint f;
  f.add(to_string(mode));
  const unsigned present = engine::present_dtypes(slots);
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

COHORT_DECL std::vector<engine::signature_entry>
describe_reduction_plan(std::span<const grad_slot> slots, const reduction_table& plan_of) {
  std::vector<engine::signature_entry> entries;
  const unsigned present = engine::present_dtypes(slots);
  for (std::size_t d = 0; d < dtype_count; ++d) {
    if ((present & (1u << d)) != 0) {
      entries.push_back(
          {"the reducer's plan for " + std::string(to_string(all_dtypes[d])) + " gradients",
           engine::describe_reduction(plan_of(all_dtypes[d]))});
    }
  }
  return entries;
}

COHORT_DECL bool agree_on_gradients(liveness& live, waiter who, const gradient_step& step,
                                    carried_bucket carried) {
  const std::span<const grad_slot> slots = step.slots;
  const std::uint64_t layout_key = engine::slots_fingerprint(slots);
  detail::fingerprint f;
  f.add(layout_key).add(static_cast<std::uint64_t>(step.problem.empty() ? 0 : 1));
  f.add(to_string(step.mode));
  const auto describe_layout = [&] {
    std::vector<engine::signature_entry> entries;
    entries.reserve(slots.size() + 2);
    if (!step.problem.empty()) {
      entries.push_back({"the call", "failed (" + std::string(step.problem) + ")"});
    }
    if (step.mode != reduction_mode::blocking) {
      // Only where it is not the usual, so that layout messages keep their item numbers.
      entries.push_back({"the reduction", std::string(to_string(step.mode))});
    }
    for (const auto& slot : slots) {
      entries.push_back({engine::slot_label(slot), engine::slot_description(slot)});
    }
    return entries;
  };
  // The plan is compared only where the layouts agree (it follows from the layout's dtypes).
  const auto describe_plan = [&] {
    std::vector<engine::signature_entry> entries = describe_reduction_plan(slots, step.plan_of);
    if (const hook_ref& hook = step.plan_of.hook()) {
      std::vector<hook_signature::entry> described;
      hook_signature signature(&described);
      hook.sign(layout_key, signature);
      for (hook_signature::entry& e : described) {
        entries.push_back({"the gradient hook's " + e.what, std::move(e.value)});
      }
    }
    char buckets[24];
    std::snprintf(buckets, sizeof buckets, "%016llx",
                  static_cast<unsigned long long>(step.buckets));
    entries.push_back({"the buckets (which gradients, in which order: learned or restored "
                       "orders that differ)",
                       buckets});
    return entries;
  };
  detail::fingerprint plan_f;
  plan_f.add(reduction_fingerprint(slots, step.mode, step.plan_of)).add(step.buckets);
  if (const hook_ref& hook = step.plan_of.hook()) {
    hook_signature signature;
    hook.sign(layout_key, signature);
    plan_f.add(signature.fingerprint());
  }
  const auto layout =
      std::pair<std::uint64_t, decltype(describe_layout)&>(f.value(), describe_layout);
  const auto plan =
      std::pair<std::uint64_t, decltype(describe_plan)&>(plan_f.value(), describe_plan);
  // (Nothing carried: the rendezvous only agrees, and says nothing was reduced.)
  return engine::require_agreement_carrying_of(live, who, step.operation, step.sequence,
                                               carried.data, carried.op, layout, plan);
}

COHORT_DECL void require_usable_gradients(int rank, const gradient_step& step) {
  if (!step.problem.empty()) {
    throw invalid_argument(std::string(step.problem));
  }
  for (std::size_t i = 0; i < step.slots.size(); ++i) {
    const auto& slot = step.slots[i];
    if (slot.state == slot_state::ok) {
      continue;
    }
    std::string message = "cohort: " + std::string(step.operation) + ": " +
                          engine::slot_label(slot) + " (#" + std::to_string(i) + ") on rank " +
                          std::to_string(rank) + " has " + engine::slot_description(slot);
    if (slot.state == slot_state::missing) {
      message += step.missing == missing_grad::report
                     ? "; pass missing_grad::zero_fill to reduce a zero gradient for it"
                     : "; zero_fill needs a gradient tensor to fill: a resizable one (an empty "
                       "std::vector, say), not a null pointer";
    }
    throw invalid_argument(message);
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
