// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which gradients of an overlapped step are ready, and so which buckets may leave: a bucket is
// launched once all its members are ready and every bucket before it was launched (every rank
// issues the same collectives in the same order). Plain bookkeeping, no communication.

#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/config.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

class readiness {
public:
  //! A step of `gradients` gradients reduced as `plan` groups them: none ready.
  void begin(const bucket_plan& plan, std::size_t gradients);

  //! Marks gradient `index` ready. Returns the new launch watermark (buckets [0, watermark) may
  //! leave) if it moved, or what is wrong with `index` (out of range, marked twice) as `problem`.
  std::optional<std::size_t> mark(const bucket_plan& plan, std::size_t index, std::string& problem);

  //! Every bucket may leave (the rest of the gradients are ready, or the step is abandoned).
  std::size_t launch_all() noexcept { return launched_ = remaining_.size(); }

  bool is_ready(std::size_t index) const noexcept {
    return index < ready_.size() && ready_[index] != 0;
  }
  std::size_t gradients() const noexcept { return ready_.size(); }
  std::size_t launched() const noexcept { return launched_; }
  bool all_launched() const noexcept { return launched_ == remaining_.size(); }
  //! The gradients in the order they became ready.
  std::span<const std::size_t> seen() const noexcept { return seen_; }

private:
  std::vector<char> ready_;
  std::vector<std::size_t> remaining_; // per bucket: members not yet ready
  std::vector<std::size_t> seen_;
  std::size_t launched_ = 0;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/readiness.ipp>
#endif
