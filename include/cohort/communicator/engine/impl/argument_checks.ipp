// SPDX-License-Identifier: Apache-2.0
#pragma once

// What argument_checks.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/argument_checks.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/dtype.hpp>

#include <climits>
#include <limits>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::string argument_checks::where(std::string_view operation) const {
  return "cohort: " + std::string(operation) + " on rank " + std::to_string(rank()) + ": ";
}

COHORT_DECL void argument_checks::require_one_dtype(const_tensor_view block,
                                                    const_tensor_view whole,
                                                    const std::string& where) const {
  if (block.type != whole.type) {
    throw invalid_argument(where + "the per-rank tensor is " + std::string(to_string(block.type)) +
                           " but the " + std::to_string(size()) + "-rank tensor is " +
                           std::string(to_string(whole.type)));
  }
}

COHORT_DECL void argument_checks::check_rank(int r, std::string_view role,
                                             std::string_view operation) const {
  if (r < 0 || r >= size()) {
    throw invalid_argument(where(operation) + std::string(role) + " " + std::to_string(r) +
                           " is not a rank of this " + std::to_string(size()) +
                           "-rank communicator");
  }
}

COHORT_DECL void argument_checks::check_blocks(const_tensor_view block, const_tensor_view whole,
                                               std::string_view operation) const {
  require_one_dtype(block, whole, where(operation));
  const std::size_t expected = block.count * static_cast<std::size_t>(size());
  if (whole.count != expected) {
    throw invalid_argument(
        where(operation) + "the per-rank tensor has " + std::to_string(block.count) +
        " elements, so the " + std::to_string(size()) + "-rank tensor needs " +
        std::to_string(expected) + ", but it has " + std::to_string(whole.count));
  }
}

COHORT_DECL std::pair<std::vector<int>, std::vector<int>>
argument_checks::check_variable_blocks(const_tensor_view block, const_tensor_view whole,
                                       std::span<const std::size_t> counts,
                                       std::string_view operation) const {
  const std::vector<std::size_t> offsets = check_counted_blocks(block, whole, counts, operation);
  if (whole.count > static_cast<std::size_t>(INT_MAX)) {
    throw invalid_argument(
        where(operation) + "the counts add up to " + std::to_string(whole.count) +
        " elements, more than one MPI call takes (INT_MAX, " + std::to_string(INT_MAX) + ")");
  }
  // Every count and offset is at most whole.count, so each fits an int.
  return {std::vector<int>(counts.begin(), counts.end()),
          std::vector<int>(offsets.begin(), offsets.end())};
}

COHORT_DECL std::vector<std::size_t>
argument_checks::check_counted_blocks(const_tensor_view block, const_tensor_view whole,
                                      std::span<const std::size_t> counts,
                                      std::string_view operation) const {
  const std::string where = this->where(operation);
  if (counts.size() != static_cast<std::size_t>(size())) {
    throw invalid_argument(where + "the counts have " + std::to_string(counts.size()) +
                           " entries, not one per rank (" + std::to_string(size()) + ")");
  }
  require_one_dtype(block, whole, where);
  std::vector<std::size_t> offsets;
  offsets.reserve(counts.size());
  std::size_t total = 0;
  for (const std::size_t count : counts) {
    offsets.push_back(total);
    if (count > std::numeric_limits<std::size_t>::max() - total) {
      throw invalid_argument(where + "the counts add up to more than a size_t holds (" +
                             std::to_string(total) + " before a count of " + std::to_string(count) +
                             ")");
    }
    total += count;
  }
  const std::size_t mine = counts[static_cast<std::size_t>(rank())];
  if (block.count != mine) {
    throw invalid_argument(where + "the per-rank tensor has " + std::to_string(block.count) +
                           " elements, but this rank's count is " + std::to_string(mine));
  }
  if (whole.count != total) {
    throw invalid_argument(where + "the counts add up to " + std::to_string(total) +
                           " elements, but the " + std::to_string(size()) + "-rank tensor has " +
                           std::to_string(whole.count));
  }
  return offsets;
}

COHORT_DECL void argument_checks::check_exchange(const_tensor_view in, const_tensor_view out,
                                                 std::string_view operation) const {
  const std::string where = this->where(operation);
  if (in.type != out.type) {
    throw invalid_argument(where + "the input is " + std::string(to_string(in.type)) +
                           " but the output is " + std::string(to_string(out.type)));
  }
  if (in.count != out.count) {
    throw invalid_argument(where + "the input has " + std::to_string(in.count) +
                           " elements but the output has " + std::to_string(out.count));
  }
  if (in.count % static_cast<std::size_t>(size()) != 0) {
    throw invalid_argument(where + "the input's " + std::to_string(in.count) +
                           " elements do not split into " + std::to_string(size()) +
                           " equal blocks, one a rank");
  }
}

COHORT_DECL void argument_checks::require_location(memory_location location, bool device,
                                                   std::string_view operation) const {
  if (device && location == memory_location::host) {
    throw invalid_argument(where(operation) +
                           "this strategy reduces GPU memory, and the tensor is in host memory "
                           "(use flat for host memory)");
  }
  if (!device && location == memory_location::device) {
    throw invalid_argument(where(operation) +
                           "this strategy reduces host memory only, and the tensor is in device "
                           "memory (use pure_nccl or host_staged)");
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
