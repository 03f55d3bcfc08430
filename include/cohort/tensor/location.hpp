// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Where a tensor's elements live. A strategy states which locations it accepts; handing it
//! memory it cannot reach is an error (at compile time when the tensor type knows its location).
enum class memory_location {
  host,   //!< ordinary or pinned host memory
  device, //!< memory of the current CUDA device
  managed //!< CUDA managed memory, reachable from both
};

constexpr std::string_view to_string(memory_location location) noexcept {
  switch (location) {
  case memory_location::host:
    return "host";
  case memory_location::device:
    return "device";
  case memory_location::managed:
    return "managed";
  }
  return "unknown";
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
