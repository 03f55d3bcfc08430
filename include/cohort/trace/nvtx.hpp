// SPDX-License-Identifier: Apache-2.0
#pragma once

// NVTX ranges, so that Nsight Systems shows cohort's work on the CPU timeline beside the kernels it
// launched: around what the device strategies enqueue (pack, reduce, unpack, scale), and, once
// this header is in the program, around every span of the trace (each step, agreement, pack,
// reduce, unpack, wait), whether or not a trace file is written. NVTX 3 is header-only (CUDA's
// include/nvtx3): with no tool attached, a range is a call through a null pointer check.

#include <cohort/config.hpp>
#include <cohort/trace/profiler_range.hpp>

#include <cstdint>
#include <nvtx3/nvToolsExt.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

namespace detail {
inline nvtxDomainHandle_t nvtx_domain() noexcept {
  static const nvtxDomainHandle_t handle = nvtxDomainCreateA("cohort");
  return handle;
}

inline std::uint64_t nvtx_start(const char* name) noexcept {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  return nvtxDomainRangeStartEx(nvtx_domain(), &attributes);
}

inline void nvtx_end(std::uint64_t range) noexcept {
  nvtxDomainRangeEnd(nvtx_domain(), range);
}

// Every span of cohort's (steps, agreements, pack, reduce, unpack, on the trainer's thread and
// cohort's) an NVTX range too, in every program that includes this header. Start/end ranges, not
// push/pop: an overlapped step begins in one call and ends in another, around the trainer's own
// ranges.
inline const bool nvtx_ranges_installed = [] {
  installed_profiler_ranges = {&nvtx_start, &nvtx_end};
  return true;
}();
} // namespace detail

//! An NVTX range from construction to destruction, in the domain "cohort".
class nvtx_range {
public:
  explicit nvtx_range(const char* name) noexcept {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(detail::nvtx_domain(), &attributes);
  }
  ~nvtx_range() { nvtxDomainRangePop(detail::nvtx_domain()); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
