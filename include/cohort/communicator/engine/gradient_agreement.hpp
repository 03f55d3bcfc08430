// SPDX-License-Identifier: Apache-2.0
#pragma once

// Before gradients move, the ranks of a step agree on what they are about to reduce (the layout
// of the slots, the reducer's plan for each dtype, the mode), and only then is each rank's own
// trouble (a bad slot, a failure found on the way) thrown: found on every rank at once, so every
// rank throws. The check and what it may carry (a small step's one packed bucket) are separate
// from the throwing, and the step's parameters travel as one struct.

#include <cohort/communicator/engine/agreement.hpp>
#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/communicator/engine/slots.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! How a step's gradients are about to be reduced. Ranks that would reduce them in different
//! ways would issue different collectives, so they agree on it too.
enum class reduction_mode : unsigned char { blocking, overlapped, double_buffered };

constexpr std::string_view to_string(reduction_mode mode) noexcept {
  switch (mode) {
  case reduction_mode::overlapped:
    return "overlapped";
  case reduction_mode::double_buffered:
    return "double-buffered";
  case reduction_mode::blocking:
    break;
  }
  return "blocking";
}

//! What the ranks of one step agree on, and what each rank then requires of its own gradients.
struct gradient_step {
  const char* operation = "allreduce_grad";
  std::uint64_t sequence = 0;
  std::span<const grad_slot> slots;
  reduction_mode mode = reduction_mode::blocking;
  const reduction_table& plan_of; // the reducer's plan for each dtype
  missing_grad missing = missing_grad::report;
  std::string_view problem;  // what this rank's own checks found (empty: nothing)
  std::uint64_t buckets = 0; // the bucket plan's fingerprint (0: none, a device strategy's)
};

//! A small step's one packed bucket (of at most liveness::max_carried_bytes), which the
//! agreement's own messages may carry and reduce with `op`.
struct carried_bucket {
  tensor_view data;
  reduce_op op = reduce_op::sum;
};

//! What every rank must agree on beside the layout: how each dtype present is reduced (the
//! reducer's plan), and in which mode. Ranks that scale or cast differently would silently
//! diverge.
COHORT_DECL std::uint64_t reduction_fingerprint(std::span<const grad_slot> slots,
                                                reduction_mode mode,
                                                const reduction_table& plan_of);

COHORT_DECL std::vector<engine::signature_entry>
describe_reduction_plan(std::span<const grad_slot> slots, const reduction_table& plan_of);

//! The ranks agree on `step`'s layout, plan and mode, and whether each found a problem; a
//! disagreement throws on every rank, naming what differs. With `carried` not empty the
//! agreement carries it: returns whether it now holds the reduction over every rank (see
//! require_agreement_carrying_of).
COHORT_DECL bool agree_on_gradients(liveness& live, waiter who, const gradient_step& step,
                                    carried_bucket carried = {});

//! Throws this rank's problem, or names its first slot that cannot be reduced (and how to
//! fix a missing one). Called after the agreement: every rank with a problem throws together.
COHORT_DECL void require_usable_gradients(int rank, const gradient_step& step);

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/gradient_agreement.ipp>
#endif
