// SPDX-License-Identifier: Apache-2.0
#pragma once

// A profiler's ranges around cohort's spans, whether or not a trace file is written:
// <cohort/trace/nvtx.hpp> installs NVTX's (Nsight Systems' timeline then shows each step,
// agreement, pack, reduce and unpack) in every program that includes it, as a GPU build does.

#include <cohort/config.hpp>

#include <cstdint>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A profiler's range functions. Null by default: one branch per span. Installed before main,
//! read only after.
struct profiler_ranges {
  std::uint64_t (*start)(const char* name) noexcept = nullptr;
  void (*end)(std::uint64_t range) noexcept = nullptr;
};
inline profiler_ranges installed_profiler_ranges{};

//! A profiler range from `open` (or construction) to `close` (or destruction); nothing when no
//! profiler is installed.
class profiler_range {
public:
  profiler_range() = default;
  explicit profiler_range(const char* name) noexcept { open(name); }
  ~profiler_range() { close(); }
  profiler_range(const profiler_range&) = delete;
  profiler_range& operator=(const profiler_range&) = delete;

  void open(const char* name) noexcept {
    close();
    const profiler_ranges ranges = installed_profiler_ranges;
    if (ranges.start != nullptr && ranges.end != nullptr) {
      range_ = ranges.start(name);
      end_ = ranges.end; // the one that opened it closes it
    }
  }
  void close() noexcept {
    if (end_ != nullptr) {
      std::exchange(end_, nullptr)(range_);
    }
  }

private:
  std::uint64_t range_ = 0;
  void (*end_)(std::uint64_t) noexcept = nullptr;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
