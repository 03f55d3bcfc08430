// SPDX-License-Identifier: Apache-2.0
#pragma once

// The gradient-sync engine's step before anything is reduced (see grad_sync.hpp): the step is
// prepared (its buckets and buffers), a small one packed to travel in the agreement, the ranks
// agree, and then each requires its own gradients usable. Inline in every translation unit by
// default, compiled once in the one that includes <cohort/src.hpp> when
// COHORT_SEPARATE_COMPILATION is defined.

#include <cohort/communicator/engine/impl/grad_sync.ipp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL void grad_sync::validate_copies(const checks& c, std::span<const grad_slot> slots,
                                            const reduction_table& table,
                                            missing_grad missing) const {
  const gradient_step step{.sequence = c.live().next_sequence(waiter::caller),
                           .slots = slots,
                           .mode = reduction_mode::double_buffered,
                           .plan_of = table,
                           .missing = missing,
                           .problem = {}};
  if (c.options().check_agreement) {
    agree_on_gradients(c.live(), waiter::caller, step);
  }
  require_usable_gradients(c.rank(), step);
}

COHORT_DECL std::string grad_sync::prepare(const checks& c, const strategy_ref& s,
                                           const reduction_table& table, reduction_mode mode,
                                           std::string problem) {
  std::size_t bytes = 0;
  for (const auto& slot : slots_) {
    bytes += slot.grad.size_bytes();
  }
  step_bytes_ = bytes;
  hook_ = table.hook();
  hook_alive_ = hook_ ? hook_.share() : nullptr;
  hook_prepared_ = false;
  const bool usable = std::ranges::all_of(
      slots_, [](const grad_slot& slot) { return slot.state == slot_state::ok; });
  if (!problem.empty() || !usable) {
    return problem;
  }
  if (hook_ && s.device()) {
    return "cohort: allreduce_grad on rank " + std::to_string(c.rank()) +
           ": a gradient hook (powersgd, ...) reduces host gradients over a host strategy, and "
           "this communicator's strategy reduces device memory";
  }
  try {
    if (!s.device()) {
      prepare_buckets(s, table, mode != reduction_mode::blocking);
      if (hook_) {
        prepare_hook(c, table);
      }
    } else if (s.prepare_all != nullptr) {
      s.prepare_all(s.self, slots_, table);
    }
  } catch (const std::exception& e) {
    return "cohort: allreduce_grad on rank " + std::to_string(c.rank()) +
           ": preparing the reduction failed: " + e.what();
  }
  return problem;
}

COHORT_DECL carried_bucket grad_sync::pack_carried(const checks& c, const strategy_ref& s) {
  if (!s.exchange_is_allreduce || !c.options().check_agreement ||
      reduction_.plan().buckets().size() != 1) {
    return {};
  }
  const bucket& k = reduction_.plan().buckets().front();
  if (k.in_place || k.hooked || k.scattered || k.count == 0 ||
      k.count * size_of(k.plan.wire) > liveness::max_carried_bytes) {
    return {};
  }
  try {
    observer_.carried_packing();
    return {reduction_.pack_shared(0, slots_, observer_.untraced_packer()), k.plan.op};
  } catch (const std::exception&) {
    return {}; // reduced the usual way after the agreement
  }
}

COHORT_DECL bool grad_sync::validate(const checks& c, const strategy_ref& s,
                                     const reduction_table& table, missing_grad missing,
                                     reduction_mode mode, std::string problem) {
  problem = prepare(c, s, table, mode, std::move(problem));
  const bool usable = problem.empty() && std::ranges::all_of(slots_, [](const grad_slot& slot) {
                        return slot.state == slot_state::ok;
                      });
  // A blocking step of one small packed bucket: packed now (the gradients are only read), it
  // travels in the agreement's own messages, one round trip instead of two.
  const carried_bucket carried =
      usable && mode == reduction_mode::blocking ? pack_carried(c, s) : carried_bucket{};
  const bool carrying = carried.data.count > 0;
  const gradient_step step{.operation = "allreduce_grad",
                           .sequence = c.live().next_sequence(waiter::caller, step_bytes_),
                           .slots = slots_,
                           .mode = mode,
                           .plan_of = table,
                           .missing = missing,
                           .problem = problem,
                           .buckets = usable && !s.device() ? reduction_.plan().fingerprint() : 0};
  bool reduced = false;
  if (c.options().check_agreement) {
    const trace_span span = observer_.agreement(carrying);
    reduced = agree_on_gradients(c.live(), waiter::caller, step, carried);
  }
  require_usable_gradients(c.rank(), step);
  observer_.agreement_ended(carried.data, reduced);
  return reduced;
}

COHORT_DECL void grad_sync::prepare_buckets(const strategy_ref& s, const reduction_table& table,
                                            bool overlapped) {
  const std::span<const grad_slot> slots(slots_);
  reduction_.prepare(slots, table);
  if (overlapped) {
    reduction_.own_buffers();
  }
  if (s.prepare != nullptr) {
    for (const bucket& b : reduction_.plan().buckets()) {
      s.prepare(s.self, b);
    }
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
