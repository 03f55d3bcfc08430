// SPDX-License-Identifier: Apache-2.0
#pragma once

// What bucketed_reduction.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/bucketed_reduction.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL const bucket_plan& bucketed_reduction::prepare(std::span<const grad_slot> slots,
                                                           const reduction_table& reduction) {
  detail::fingerprint f;
  f.add(engine::slots_fingerprint(slots)).add(reduction.hooked_mask());
  if (reduction.scattered()) { // (not the rank: the key names a layout the same on every rank)
    for (const int owner : reduction.owners()) {
      f.add(static_cast<std::uint64_t>(owner));
    }
  }
  for (const dtype type : all_dtypes) {
    const grad_reduction& plan = reduction(type);
    f.add(static_cast<std::uint64_t>(plan.wire))
        .add(std::bit_cast<std::uint64_t>(plan.pre_scale))
        .add(std::bit_cast<std::uint64_t>(plan.post_scale))
        .add(static_cast<std::uint64_t>(plan.op));
  }
  ++clock_;
  const std::uint64_t key = f.value();
  auto found =
      std::find_if(entries_.begin(), entries_.end(), [&](const entry& e) { return e.key == key; });
  if (found == entries_.end()) {
    if (entries_.size() < max_layouts) {
      found = entries_.emplace(entries_.end());
    } else {
      found = std::min_element(entries_.begin(), entries_.end(),
                               [](const entry& a, const entry& b) { return a.used < b.used; });
    }
    found->key = key;
    found->learned = false;
    found->owned.clear(); // an evicted layout's overlap buffers are not this one's
    bucket_plan::reverse_order(slots.size(), order_);
    build(*found, slots, order_, reduction);
  }
  found->used = clock_;
  current_ = &*found;
  // An order pending for this layout (seen at the last step, or restored from a checkpoint)
  // wins over one learned before it: a restored one is what the run it continues reduced in.
  const auto pending = std::find_if(pending_.begin(), pending_.end(),
                                    [&](const bucket_order& o) { return o.layout == key; });
  if (pending != pending_.end()) {
    if (pending->order.size() == slots.size()) { // (the layout says so)
      found->learned = false;
      learn_order(slots, pending->order, reduction);
    }
    pending_.erase(pending);
  }
  return found->plan;
}

COHORT_DECL std::vector<bucket_order> bucketed_reduction::learned_orders() const {
  // What the next step of each layout will reduce in: a pending order first, then the plans'.
  std::vector<bucket_order> orders = pending_;
  for (const entry& e : entries_) {
    if (e.learned && std::none_of(orders.begin(), orders.end(),
                                  [&](const bucket_order& o) { return o.layout == e.key; })) {
      orders.push_back({e.key, {e.plan.order().begin(), e.plan.order().end()}});
    }
  }
  return orders;
}

COHORT_DECL void bucketed_reduction::restore_orders(std::vector<bucket_order> orders) {
  for (const bucket_order& o : orders) {
    std::vector<bool> seen(o.order.size());
    for (const std::size_t i : o.order) {
      if (i >= seen.size() || seen[i]) {
        throw invalid_argument("cohort: restore_bucket_orders: the order of layout " +
                               std::to_string(o.layout) + " holds gradient " + std::to_string(i) +
                               (i >= seen.size() ? ", past its " : " twice among its ") +
                               std::to_string(seen.size()));
      }
      seen[i] = true;
    }
  }
  pending_ = std::move(orders);
}

COHORT_DECL bool bucketed_reduction::learn_order(std::span<const grad_slot> slots,
                                                 std::span<const std::size_t> order,
                                                 const reduction_table& reduction) {
  if (current_->learned) {
    return false;
  }
  current_->learned = true;
  if (std::ranges::equal(order, current_->plan.order())) {
    return false;
  }
  build(*current_, slots, order, reduction);
  return true;
}

COHORT_DECL void bucketed_reduction::remember_order(std::span<const std::int64_t> order) {
  const std::uint64_t key = current_key();
  std::erase_if(pending_, [&](const bucket_order& o) { return o.layout == key; });
  pending_.push_back({key, {order.begin(), order.end()}});
}

COHORT_DECL void bucketed_reduction::own_buffers() {
  if (current_->owned.empty()) {
    own_buffers_of(*current_);
  }
}

COHORT_DECL std::vector<engine::signature_entry>
bucketed_reduction::describe_bucket(std::size_t b, std::span<const grad_slot> slots) const {
  const bucket_plan& plan = current_->plan;
  const bucket& k = plan.buckets()[b];
  std::string members;
  for (const std::size_t s : plan.members(k)) {
    members += (members.empty() ? "" : ", ") + engine::slot_label(slots[s]);
  }
  return {{"bucket " + std::to_string(b) + " of " + std::to_string(plan.buckets().size()),
           engine::describe_tensor(k.count, k.plan.wire) + " on the wire, " +
               (k.in_place ? "in place" : "packed") + " from " + members}};
}

COHORT_DECL std::size_t bucketed_reduction::buffer_bytes() const noexcept {
  std::size_t bytes = 0;
  if (current_ != nullptr) {
    bytes += current_->shared.size();
    for (const auto& buffer : current_->owned) {
      bytes += buffer.size();
    }
  }
  return bytes;
}

COHORT_DECL void bucketed_reduction::build(entry& e, std::span<const grad_slot> slots,
                                           std::span<const std::size_t> order,
                                           const reduction_table& reduction) {
  e.plan.build(slots, order, reduction, limits_);
  if (!host_buffers_) {
    return;
  }
  std::size_t largest = 0;
  for (const auto& b : e.plan.buckets()) {
    largest = std::max(largest, b.in_place ? 0 : b.count * size_of(b.plan.wire));
  }
  e.shared.resize(largest);
  e.shared.shrink_to_fit();
  const bool overlapped = !e.owned.empty();
  e.owned.clear();
  if (overlapped) {
    own_buffers_of(e);
  }
}

COHORT_DECL void bucketed_reduction::own_buffers_of(entry& e) {
  const auto buckets = e.plan.buckets();
  e.owned.resize(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (!buckets[b].in_place) {
      e.owned[b].resize(buckets[b].count * size_of(buckets[b].plan.wire));
    }
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
