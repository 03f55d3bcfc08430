// SPDX-License-Identifier: Apache-2.0
#pragma once

// Closed-form test data (Gloo's habit): element i of rank r is small and exact in every dtype, so
// the expected reduction is known without an oracle run.

#include <cohort/tensor/dtype.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace cohort::test {

//! Element i on rank r: (i % 7) + r, at most 6 + 3 = 9 for 4 ranks: exact in every dtype, and so
//! are the sums over 4 ranks (at most 36, below uint8's 255 and bf16's 8-bit mantissa's 256).
inline double closed_form(std::size_t i, int rank) {
  return static_cast<double>(i % 7) + static_cast<double>(rank);
}

//! The sum of closed_form(i, r) over r in [0, ranks).
inline double closed_form_sum(std::size_t i, int ranks) {
  return static_cast<double>(i % 7) * ranks + static_cast<double>(ranks * (ranks - 1)) / 2.0;
}

template <class T>
std::vector<T> filled(std::size_t n, int rank) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<T>(static_cast<float>(closed_form(i, rank)));
  }
  return v;
}

//! Any element as a double, for comparisons with the closed forms.
template <class T>
double as_double(T value) {
  if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) {
    return static_cast<double>(value);
  } else {
    return static_cast<double>(static_cast<float>(value));
  }
}

} // namespace cohort::test
