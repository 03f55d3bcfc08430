// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/tensor/dtype.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "support/fill.hpp"

namespace cohort::test {

// The tolerance of a mean in T: 16-bit floats are divided before the sum and rounded at each step.
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, cohort::float16>) {
    return 4e-3;
  } else if constexpr (std::is_same_v<T, cohort::bfloat16>) {
    return 3e-2;
  } else if constexpr (std::is_same_v<T, float>) {
    return 1e-6;
  } else {
    return 1e-12;
  }
}

// Every gradient of `m` (a test::model) against the closed form of the sum over `ranks` ranks of
// what filled<T> gave each (or its mean, rounded for integers).
template <class Model>
void require_closed_form(const Model& m, int ranks, bool mean) {
  using T = typename Model::tensor::value_type;
  for (std::size_t t = 0; t < m.grads.size(); ++t) {
    for (std::size_t i = 0; i < m.grads[t].size(); ++i) {
      double expected = closed_form_sum(i, ranks);
      if (mean) {
        expected /= ranks;
        if (std::is_integral_v<T>) {
          expected = std::round(expected);
        }
      }
      const double got = as_double(m.grads[t][i]);
      BOOST_TEST_REQUIRE(std::abs(got - expected) <= tolerance<T>() * std::max(1.0, expected),
                         cohort::to_string(cohort::dtype_of_v<T>)
                             << " tensor " << t << " element " << i << ": " << got << " vs "
                             << expected);
    }
  }
}

} // namespace cohort::test
