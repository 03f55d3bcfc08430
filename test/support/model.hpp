// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "support/fill.hpp"

namespace cohort::test {

template <class T>
using param = cohort::parameter_ref<std::vector<T>>;

// A model with tensors of every awkward size in one dtype.
template <class T>
struct model {
  std::vector<std::vector<T>> values, grads;
  std::vector<param<T>> params;

  model(int ranks, int rank) {
    const std::size_t sizes[] = {0, 1, 3, static_cast<std::size_t>(ranks) * 4 + 1, 1000, 4099};
    for (const std::size_t n : sizes) {
      values.emplace_back(n);
      grads.push_back(cohort::test::filled<T>(n, rank));
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      params.push_back({"layer" + std::to_string(i), &values[i], &grads[i]});
    }
  }
};

} // namespace cohort::test
