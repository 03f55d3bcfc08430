// SPDX-License-Identifier: Apache-2.0
#pragma once

// What parameter_gather.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/training/detail/parameter_gather.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL void parameter_gather::build(std::span<const tensor_view> values,
                                         std::span<const std::string> names, const shard_plan& plan,
                                         int rank, std::size_t bucket_bytes) {
  rank_ = rank;
  ranks_ = static_cast<std::size_t>(plan.ranks());
  buckets_.clear();
  members_.clear();
  blocks_.clear();
  layout_.assign(values.begin(), values.end());
  std::size_t in_bytes = 0;
  std::size_t out_bytes = 0;
  for (const dtype type : all_dtypes) {
    std::vector<std::size_t> open;
    std::size_t open_bytes = 0;
    const auto close = [&] {
      if (!open.empty()) {
        add_bucket(type, open, values, plan, in_bytes, out_bytes);
      }
      open.clear();
      open_bytes = 0;
    };
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i].type != type || values[i].count == 0) {
        continue;
      }
      if (values[i].location != memory_location::host) {
        throw invalid_argument("cohort: sharded_optimizer: the value of parameter '" + names[i] +
                               "' is in device memory; parameters are gathered by host "
                               "strategies from host memory");
      }
      if (open_bytes + values[i].size_bytes() > bucket_bytes) {
        close();
      }
      open.push_back(i);
      open_bytes += values[i].size_bytes();
    }
    close();
  }
  in_.assign(in_bytes, std::byte{0});
  out_.assign(out_bytes, std::byte{0});
}

COHORT_DECL void parameter_gather::require_layout(std::span<const tensor_view> values,
                                                  std::span<const std::string> names) const {
  if (values.size() != layout_.size()) {
    throw invalid_argument("cohort: sharded_optimizer on rank " + std::to_string(rank_) + ": " +
                           std::to_string(values.size()) +
                           " parameters, but the shard plan "
                           "was made for " +
                           std::to_string(layout_.size()));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i].count != layout_[i].count || values[i].type != layout_[i].type) {
      throw invalid_argument(
          "cohort: sharded_optimizer on rank " + std::to_string(rank_) + ": parameter '" +
          names[i] + "' holds " + std::to_string(values[i].count) + " " +
          std::string(to_string(values[i].type)) + " elements, but the shard plan was made for " +
          std::to_string(layout_[i].count) + " " + std::string(to_string(layout_[i].type)) +
          " (parameters keep their sizes while sharded)");
    }
  }
}

COHORT_DECL void parameter_gather::add_bucket(dtype type, std::vector<std::size_t>& members,
                                              std::span<const tensor_view> values,
                                              const shard_plan& plan, std::size_t& in_bytes,
                                              std::size_t& out_bytes) {
  std::stable_sort(members.begin(), members.end(),
                   [&](std::size_t x, std::size_t y) { return plan.owner[x] < plan.owner[y]; });
  bucket b{type, members_.size(), members.size(), blocks_.size()};
  blocks_.resize(blocks_.size() + ranks_, 0);
  for (std::size_t m = 0; m < members.size(); ++m) {
    const std::size_t i = members[m];
    blocks_[b.first_block + static_cast<std::size_t>(plan.owner[i])] += values[i].count;
    b.count += values[i].count;
    if (plan.owner[i] == rank_) {
      b.own_first = b.own_members == 0 ? m : b.own_first;
      ++b.own_members;
      b.own_count += values[i].count;
    }
    members_.push_back(i);
  }
  if (members.size() == 1) {
    b.owner = plan.owner[members.front()];
  } else {
    in_bytes = std::max(in_bytes, b.own_count * size_of(type));
    out_bytes = std::max(out_bytes, b.count * size_of(type));
  }
  buckets_.push_back(b);
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
