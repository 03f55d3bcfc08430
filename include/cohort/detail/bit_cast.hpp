// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

// std::bit_cast is not usable in device code; the builtin behind it is, with GCC, Clang and nvcc.
template <class To, class From>
COHORT_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, from);
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
