// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "support/fill.hpp"

namespace cohort::test {

template <class T>
using param = cohort::parameter_ref<std::vector<T>>;

// A model with tensors of every awkward size in one dtype, allocated by `Allocator` (a window's
// shared_allocator, say) in the same order on every rank.
template <class T, class Allocator = std::allocator<T>>
struct model {
  using tensor = std::vector<T, Allocator>;
  std::vector<tensor> values, grads;
  std::vector<cohort::parameter_ref<tensor>> params;

  model(int ranks, int rank, const Allocator& allocator = Allocator()) {
    const std::size_t sizes[] = {0, 1, 3, static_cast<std::size_t>(ranks) * 4 + 1, 1000, 4099};
    for (const std::size_t n : sizes) {
      values.emplace_back(n, T{}, allocator);
      const std::vector<T> grad = cohort::test::filled<T>(n, rank);
      grads.emplace_back(grad.begin(), grad.end(), allocator);
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      params.push_back({"layer" + std::to_string(i), &values[i], &grads[i]});
    }
  }
};

} // namespace cohort::test
