// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace bench {

//! A model's gradients as a trainer holds them: each parameter a value and a gradient vector of
//! float32, allocated by `Allocator` (a shared window's, say). The values are never read by
//! allreduce_grad but must be there with the right size, as in a model. `params` points into the
//! other two, which are not resized after it is built.
template <class Allocator = std::allocator<float>>
struct basic_gradient_set {
  using tensor = std::vector<float, Allocator>;
  std::vector<tensor> values, grads;
  std::vector<cohort::parameter_ref<tensor>> params;

  //! One parameter per (name, element count), in registration order.
  explicit basic_gradient_set(const std::vector<std::pair<std::string, std::size_t>>& tensors,
                              const Allocator& allocator = Allocator()) {
    values.reserve(tensors.size());
    grads.reserve(tensors.size());
    for (const auto& [name, count] : tensors) {
      values.emplace_back(count, 0.0f, allocator);
      grads.emplace_back(count, 0.0f, allocator);
    }
    params.reserve(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      params.push_back({tensors[i].first, &values[i], &grads[i]});
    }
  }

  //! `elements` in all, in tensors of at most `per_tensor`, named layer0, layer1, ...
  static basic_gradient_set uniform(std::size_t elements, std::size_t per_tensor) {
    std::vector<std::pair<std::string, std::size_t>> tensors;
    for (std::size_t begin = 0; begin < elements; begin += per_tensor) {
      tensors.emplace_back("layer" + std::to_string(tensors.size()),
                           std::min(per_tensor, elements - begin));
    }
    return basic_gradient_set(tensors);
  }

  std::size_t elements() const {
    std::size_t total = 0;
    for (const auto& g : grads) {
      total += g.size();
    }
    return total;
  }
  void fill(float x) {
    for (auto& g : grads) {
      std::fill(g.begin(), g.end(), x);
    }
  }
  std::size_t count_not_equal(float x) const {
    std::size_t wrong = 0;
    for (const auto& g : grads) {
      wrong += static_cast<std::size_t>(
          std::count_if(g.begin(), g.end(), [x](float y) { return y != x; }));
    }
    return wrong;
  }
};

using gradient_set = basic_gradient_set<>;

} // namespace bench
