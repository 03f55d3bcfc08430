// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The elementwise operation of a reduction. Every engine and every kernel maps this one enum.
enum class reduce_op { sum, prod, min, max };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum:
    return "sum";
  case reduce_op::prod:
    return "prod";
  case reduce_op::min:
    return "min";
  case reduce_op::max:
    return "max";
  }
  return "unknown";
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
