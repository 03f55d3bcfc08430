// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! How gradients are grouped into buckets (see `communicator_options` for what each means).
struct bucket_limits {
  std::size_t bucket_bytes = 0;
  std::size_t first_bucket_bytes = 0;
  std::size_t threshold_bytes = 0;
};

//! A group of gradients of one dtype reduced by one collective: packed into a buffer of the wire
//! dtype, or, for one gradient already of the wire dtype and of at least the threshold, reduced in
//! place.
struct bucket {
  dtype type = dtype::float32;
  grad_reduction plan;
  bool in_place = false;
  std::size_t first_member = 0; //!< into bucket_plan::members()
  std::size_t member_count = 0;
  std::size_t count = 0; //!< elements, all members together
};

//! Splits a layout of gradients into buckets, walking them in the order they are expected to
//! become ready (reverse registration order, until a step has shown the real order): each dtype has
//! one open bucket, which a gradient joins while it fits (the first bucket of each dtype has its
//! own, usually smaller, limit, so that the first reduction starts early); a gradient too large to
//! share is alone. The buckets are then ordered by when their last member becomes ready, which is
//! the order every rank reduces them in. Built once per layout; nothing here runs per step.
class bucket_plan {
public:
  static constexpr std::size_t no_bucket = std::numeric_limits<std::size_t>::max();

  void build(std::span<const grad_slot> slots, std::span<const std::size_t> order,
             const reduction_table& reduction, const bucket_limits& limits) {
    buckets_.clear();
    members_.clear();
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
      const auto start = [&](bool in_place) {
        buckets_.push_back({slot.grad.type, plan, in_place, 0, 0, 0});
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
      if (plan.wire == slot.grad.type && slot.grad.size_bytes() >= limits.threshold_bytes) {
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
      for (const std::size_t s : gathered[b]) {
        bucket_of_[s] = sorted.size();
        members_.push_back(s);
      }
      sorted.push_back(next);
    }
    buckets_ = std::move(sorted);
    order_.assign(order.begin(), order.end());
  }

  std::span<const bucket> buckets() const noexcept { return buckets_; }
  std::span<const std::size_t> members(const bucket& b) const noexcept {
    return std::span(members_).subspan(b.first_member, b.member_count);
  }
  //! The bucket that holds gradient `slot`, or `no_bucket` for an empty gradient.
  std::size_t bucket_of(std::size_t slot) const noexcept { return bucket_of_[slot]; }
  //! The walk order the plan was built from.
  std::span<const std::size_t> order() const noexcept { return order_; }

  //! Reverse registration order: backward produces the last layer's gradients first.
  static void reverse_order(std::size_t count, std::vector<std::size_t>& order) {
    order.resize(count);
    std::iota(order.rbegin(), order.rend(), std::size_t{0});
  }

private:
  std::vector<bucket> buckets_;
  std::vector<std::size_t> members_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::size_t> order_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
