// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! How gradients are grouped into buckets (see `communicator_options` for what each means).
struct bucket_limits {
  std::size_t bucket_bytes = 0;
  std::size_t first_bucket_bytes = 0;
  std::size_t threshold_bytes = 0;
};

//! A group of gradients of one dtype reduced by one collective: packed into a buffer of the wire
//! dtype, or, for one gradient already of the wire dtype and of at least the threshold, reduced in
//! place. A gradient hook's buckets are never in place: a hook exchanges what it computes from
//! the bucket's gradients, and fewer, larger buckets mean fewer of its exchanges.
struct bucket {
  dtype type = dtype::float32;
  grad_reduction plan;
  bool in_place = false;
  bool hooked = false;          //!< reduced by the reducer's gradient hook (never in place)
  std::size_t first_member = 0; //!< into bucket_plan::members()
  std::size_t member_count = 0;
  std::size_t count = 0; //!< elements, all members together
  //! Reduce-scattered (a sharded optimizer's reduction): the members are ordered by the rank
  //! that owns them, rank r's block holds `bucket_plan::blocks(*this)[r]` elements, and only this
  //! rank's members (`own_first`, `own_members` into `members`, `own_count` elements) receive
  //! their reduced values.
  bool scattered = false;
  std::size_t first_block = 0; //!< into bucket_plan's blocks
  std::size_t own_first = 0;
  std::size_t own_members = 0;
  std::size_t own_count = 0;
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
             const reduction_table& reduction, const bucket_limits& limits);

  std::span<const bucket> buckets() const noexcept { return buckets_; }
  std::span<const std::size_t> members(const bucket& b) const noexcept {
    return std::span(members_).subspan(b.first_member, b.member_count);
  }
  //! A scattered bucket's elements per rank (empty for the others).
  std::span<const int> blocks(const bucket& b) const noexcept {
    return b.scattered ? std::span(blocks_).subspan(b.first_block, ranks_) : std::span<const int>{};
  }
  //! The bucket that holds gradient `slot`, or `no_bucket` for an empty gradient.
  std::size_t bucket_of(std::size_t slot) const noexcept { return bucket_of_[slot]; }
  //! The walk order the plan was built from.
  std::span<const std::size_t> order() const noexcept { return order_; }
  //! Which gradients share which bucket, in which order (and, scattered, whose each is): the
  //! ranks compare it at every step (buckets of the same sizes over other members would add up
  //! unrelated gradients).
  std::uint64_t fingerprint() const noexcept { return fingerprint_; }

  //! Reverse registration order: backward produces the last layer's gradients first.
  static void reverse_order(std::size_t count, std::vector<std::size_t>& order) {
    order.resize(count);
    std::iota(order.rbegin(), order.rend(), std::size_t{0});
  }

private:
  // Groups a bucket's members by owner and counts each rank's block.
  void scatter(bucket& b, std::vector<std::size_t>& members, std::span<const grad_slot> slots,
               std::span<const int> owners, int rank);

  std::vector<bucket> buckets_;
  std::vector<std::size_t> members_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::size_t> order_;
  std::vector<int> blocks_;
  std::size_t ranks_ = 0;
  std::uint64_t fingerprint_ = 0;
};

//! The one rank whose block of a scattered bucket is not empty (a bucket of one rank's
//! gradients alone: reduced to it, not scattered), or -1: none, or several.
inline int single_owner(std::span<const int> blocks) noexcept {
  const auto owner = std::find_if(blocks.begin(), blocks.end(), [](int n) { return n != 0; });
  if (owner == blocks.end() || std::any_of(owner + 1, blocks.end(), [](int n) { return n != 0; })) {
    return -1;
  }
  return static_cast<int>(owner - blocks.begin());
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/bucket_plan.ipp>
#endif
