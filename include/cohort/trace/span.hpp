// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/trace/event.hpp>
#include <cohort/trace/profiler_range.hpp>
#include <cohort/trace/recorder.hpp>
#include <cohort/trace/ticks.hpp>

#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Records the span from its construction to its end into `recorder`, if not null, and opens a
//! profiler range for it if one is installed: two branches, and nothing else, when both are off.
class trace_span {
public:
  trace_span(trace_recorder* recorder, const char* name, trace_thread thread,
             std::uint64_t bytes = 0, std::int64_t bucket = -1,
             const char* operation = nullptr) noexcept
      : recorder_(recorder)
      , name_(name)
      , thread_(thread)
      , bytes_(bytes)
      , bucket_(bucket)
      , operation_(operation)
      , range_(name) {
    if (recorder_ != nullptr) {
      start_ = trace_ticks::now();
    }
  }
  ~trace_span() {
    if (recorder_ != nullptr) {
      recorder_->span(name_, thread_, start_, trace_ticks::now(), bytes_, bucket_, operation_);
    }
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;

  //! What the span turned out to be, known only at its end (an agreement that also reduced).
  void relabel(const char* name, std::uint64_t bytes, std::int64_t bucket) noexcept {
    name_ = name;
    bytes_ = bytes;
    bucket_ = bucket;
  }

private:
  trace_recorder* recorder_;
  const char* name_;
  trace_thread thread_;
  std::uint64_t bytes_;
  std::int64_t bucket_;
  const char* operation_;
  profiler_range range_;
  std::uint64_t start_ = 0;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
