// SPDX-License-Identifier: Apache-2.0
#pragma once

// What bucket_plan.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/detail/fingerprint.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL void bucket_plan::build(std::span<const grad_slot> slots,
                                    std::span<const std::size_t> order,
                                    const reduction_table& reduction, const bucket_limits& limits) {
  buckets_.clear();
  members_.clear();
  blocks_.clear();
  // A scattered reduction's buckets have their members grouped by owner (a gradient alone in
  // place has one); an owner list of another length is this rank's problem, reported in the
  // agreement (local_problem): until then the plan is built unscattered, so that it holds
  // nothing out of range.
  const auto owners = reduction.owners();
  const bool scattered =
      reduction.scattered() && owners.size() == slots.size() &&
      std::ranges::all_of(owners, [&](int r) { return r >= 0 && r < reduction.ranks(); });
  ranks_ = scattered ? static_cast<std::size_t>(reduction.ranks()) : 0;
  bucket_of_.assign(slots.size(), no_bucket);
  std::array<std::size_t, dtype_count> open;
  std::array<bool, dtype_count> had_first{};
  open.fill(no_bucket);
  // Members gathered per bucket first, with the walk position of each bucket's last member.
  std::vector<std::vector<std::size_t>> gathered;
  std::vector<std::size_t> closed_at;
  for (std::size_t position = 0; position < order.size(); ++position) {
    const std::size_t s = order[position];
    const grad_slot& slot = slots[s];
    if (slot.grad.count == 0) {
      continue;
    }
    const std::size_t d = dtype_index(slot.grad.type);
    const grad_reduction& plan = reduction(slot.grad.type);
    const std::size_t wire_bytes = slot.grad.count * size_of(plan.wire);
    const bool hooked = reduction.hooked(slot.grad.type);
    const auto start = [&](bool in_place) {
      buckets_.push_back({slot.grad.type, plan, in_place, hooked, 0, 0, 0});
      gathered.emplace_back();
      closed_at.push_back(position);
      return buckets_.size() - 1;
    };
    const auto add = [&](std::size_t b) {
      gathered[b].push_back(s);
      buckets_[b].count += slot.grad.count;
      bucket_of_[s] = b;
    };
    const std::size_t limit = had_first[d] ? limits.bucket_bytes : limits.first_bucket_bytes;
    if (!hooked && plan.wire == slot.grad.type &&
        slot.grad.size_bytes() >= limits.threshold_bytes) {
      add(start(true));
      continue;
    }
    if (open[d] != no_bucket &&
        (buckets_[open[d]].count * size_of(plan.wire) + wire_bytes) > limit) {
      had_first[d] = true;
      open[d] = no_bucket;
    }
    if (open[d] == no_bucket) {
      open[d] = start(false);
    }
    add(open[d]);
    closed_at[open[d]] = position;
  }
  // Reduce the buckets in the order they fill up; members keep their walk order.
  std::vector<std::size_t> by_readiness(buckets_.size());
  std::iota(by_readiness.begin(), by_readiness.end(), std::size_t{0});
  std::stable_sort(by_readiness.begin(), by_readiness.end(),
                   [&](std::size_t a, std::size_t b) { return closed_at[a] < closed_at[b]; });
  std::vector<bucket> sorted;
  sorted.reserve(buckets_.size());
  for (const std::size_t b : by_readiness) {
    bucket next = buckets_[b];
    next.first_member = members_.size();
    next.member_count = gathered[b].size();
    if (scattered && !next.hooked) {
      scatter(next, gathered[b], slots, owners, reduction.rank());
    }
    for (const std::size_t s : gathered[b]) {
      bucket_of_[s] = sorted.size();
      members_.push_back(s);
    }
    sorted.push_back(next);
  }
  buckets_ = std::move(sorted);
  order_.assign(order.begin(), order.end());
  detail::fingerprint f;
  for (const bucket& b : buckets_) {
    f.add(b.member_count);
    for (const std::size_t s : members(b)) {
      f.add(s);
      if (b.scattered) {
        f.add(static_cast<std::uint64_t>(owners[s]));
      }
    }
  }
  fingerprint_ = f.value();
}

COHORT_DECL void bucket_plan::scatter(bucket& b, std::vector<std::size_t>& members,
                                      std::span<const grad_slot> slots, std::span<const int> owners,
                                      int rank) {
  // Rank r's block is the run of members it owns: members grouped by owner, in walk order
  // within each group, so that one reduce-scatter hands every rank its own.
  std::stable_sort(members.begin(), members.end(),
                   [&](std::size_t x, std::size_t y) { return owners[x] < owners[y]; });
  b.scattered = true;
  b.first_block = blocks_.size();
  blocks_.resize(blocks_.size() + ranks_, 0);
  for (std::size_t i = 0; i < members.size(); ++i) {
    const std::size_t s = members[i];
    const auto owner = static_cast<std::size_t>(owners[s]);
    const std::size_t total =
        static_cast<std::size_t>(blocks_[b.first_block + owner]) + slots[s].grad.count;
    if (!b.in_place && total > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw invalid_argument("cohort: a reduce-scattered bucket holds " + std::to_string(total) +
                             " elements for rank " + std::to_string(owner) +
                             ", more than one MPI call takes (INT_MAX): use smaller buckets");
    }
    // (A gradient alone in place is reduced to its owner, in chunks: any size.)
    blocks_[b.first_block + owner] =
        static_cast<int>(std::min<std::size_t>(total, std::numeric_limits<int>::max()));
    if (owners[s] == rank) {
      if (b.own_members == 0) {
        b.own_first = i;
      }
      ++b.own_members;
      b.own_count += slots[s].grad.count;
    }
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
