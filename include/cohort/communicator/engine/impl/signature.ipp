// SPDX-License-Identifier: Apache-2.0
#pragma once

// What engine/signature.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/signature.hpp>

#include <algorithm>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::string describe_mismatch(std::string_view operation,
                                          const std::vector<std::vector<signature_entry>>& all,
                                          std::size_t reference_rank) {
  const auto& reference = all.at(reference_rank);
  const std::string on_reference = " on rank " + std::to_string(reference_rank);
  std::string message = "cohort: " + std::string(operation) + ": the ranks disagree: ";
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto& other = all[r];
    const std::size_t common = std::min(reference.size(), other.size());
    for (std::size_t i = 0; i < common; ++i) {
      if (reference[i].label != other[i].label ||
          reference[i].description != other[i].description) {
        const std::string item = " (#" + std::to_string(i) + ") has ";
        return message + reference[i].label + item + reference[i].description + on_reference +
               " but " + (reference[i].label == other[i].label ? "" : other[i].label + item) +
               other[i].description + " on rank " + std::to_string(r);
      }
    }
    if (reference.size() != other.size()) {
      return message + "rank " + std::to_string(reference_rank) + " passes " +
             std::to_string(reference.size()) + " items but rank " + std::to_string(r) +
             " passes " + std::to_string(other.size());
    }
  }
  return message + "their fingerprints differ, but the descriptions they exchanged are the same "
                   "(something this call does not describe differs: a cohort bug, please report)";
}

COHORT_DECL std::string describe_tensor(std::size_t count, dtype type) {
  return std::to_string(count) + " " + std::string(to_string(type)) + " elements";
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
