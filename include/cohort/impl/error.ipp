// SPDX-License-Identifier: Apache-2.0
#pragma once

// What error.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/error.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL std::string engine_error::describe(const std::string& engine,
                                               const std::string& operation, int rank, int code,
                                               const std::string& message) {
  return "cohort: " + engine + " error in " + operation + " on rank " + std::to_string(rank) +
         ": " + message + " (code " + std::to_string(code) + ")";
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
