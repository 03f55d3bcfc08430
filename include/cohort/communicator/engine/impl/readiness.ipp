// SPDX-License-Identifier: Apache-2.0
#pragma once

// What readiness.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/readiness.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL void readiness::begin(const bucket_plan& plan, std::size_t gradients) {
  ready_.assign(gradients, 0);
  remaining_.clear();
  for (const auto& b : plan.buckets()) {
    remaining_.push_back(b.member_count);
  }
  seen_.clear();
  seen_.reserve(gradients);
  launched_ = 0;
}

COHORT_DECL std::optional<std::size_t> readiness::mark(const bucket_plan& plan, std::size_t index,
                                                       std::string& problem) {
  if (index >= ready_.size()) {
    problem = "index " + std::to_string(index) + " is not a parameter of this " +
              std::to_string(ready_.size()) + "-parameter set";
    return std::nullopt;
  }
  if (ready_[index]) {
    problem = "was marked ready twice in one step: a second backward before step() (its hooks "
              "fire again); run every backward of a step but its last inside no_sync() "
              "(gradient accumulation; a GAN's discriminator over its real and its fake "
              "batch), or step() between them";
    return std::nullopt;
  }
  ready_[index] = 1;
  seen_.push_back(index);
  const std::size_t b = plan.bucket_of(index);
  if (b == bucket_plan::no_bucket || --remaining_[b] != 0) {
    return std::nullopt;
  }
  std::size_t launched = launched_;
  while (launched < remaining_.size() && remaining_[launched] == 0) {
    ++launched;
  }
  if (launched == launched_) {
    return std::nullopt;
  }
  launched_ = launched;
  return launched;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
