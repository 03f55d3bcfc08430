// SPDX-License-Identifier: Apache-2.0
#pragma once

// What scatter_dataset.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/training/scatter_dataset.hpp>

#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed,
                                            std::uint64_t epoch) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::seed_seq sequence{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                         static_cast<std::uint32_t>(epoch),
                         static_cast<std::uint32_t>(epoch >> 32)};
  std::mt19937_64 engine(sequence);
  for (std::size_t i = n; i > 1; --i) {
    const std::uint64_t bound = i;
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                                std::numeric_limits<std::uint64_t>::max() % bound;
    std::uint64_t draw = engine();
    while (draw >= limit) {
      draw = engine();
    }
    std::swap(order[i - 1], order[static_cast<std::size_t>(draw % bound)]);
  }
  return order;
}

COHORT_DECL std::uint64_t random_seed() {
  return std::random_device{}() * 0x9e3779b97f4a7c15ull;
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
