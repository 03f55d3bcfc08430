// SPDX-License-Identifier: Apache-2.0
#pragma once

// NVTX ranges around what the device strategies enqueue (pack, reduce, unpack, scale), so that
// Nsight Systems shows cohort's work on the CPU timeline beside the kernels it launched. NVTX 3 is
// header-only (CUDA's include/nvtx3): with no tool attached, a range is a call through a null
// pointer check, nothing more.

#include <cohort/config.hpp>

#include <nvtx3/nvToolsExt.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! An NVTX range from construction to destruction, in the domain "cohort".
class nvtx_range {
public:
  explicit nvtx_range(const char* name) noexcept {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &attributes);
  }
  ~nvtx_range() { nvtxDomainRangePop(domain()); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;

private:
  static nvtxDomainHandle_t domain() noexcept {
    static const nvtxDomainHandle_t handle = nvtxDomainCreateA("cohort");
    return handle;
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
