// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace bench {

//! The parameter tensors of torchvision's ResNet-50, in registration order: 161 tensors,
//! 25,557,032 float32 values (53 convolutions, 53 batch norms of two tensors each, the fully
//! connected layer's weight and bias). What a gradient synchronisation of a real model reduces:
//! a few large tensors and many small ones.
struct resnet50 {
  struct tensor {
    std::string name;
    std::size_t count;
  };
  std::vector<tensor> tensors;

  resnet50() {
    const auto conv = [&](const std::string& name, std::size_t in, std::size_t out, std::size_t k) {
      tensors.push_back({name + ".weight", out * in * k * k});
    };
    const auto norm = [&](const std::string& name, std::size_t channels) {
      tensors.push_back({name + ".weight", channels});
      tensors.push_back({name + ".bias", channels});
    };
    conv("conv1", 3, 64, 7);
    norm("bn1", 64);
    std::size_t in = 64;
    const std::size_t blocks[] = {3, 4, 6, 3};
    for (std::size_t layer = 0; layer < 4; ++layer) {
      const std::size_t width = std::size_t{64} << layer;
      for (std::size_t b = 0; b < blocks[layer]; ++b) {
        const std::string prefix = "layer" + std::to_string(layer + 1) + "." + std::to_string(b);
        conv(prefix + ".conv1", in, width, 1);
        norm(prefix + ".bn1", width);
        conv(prefix + ".conv2", width, width, 3);
        norm(prefix + ".bn2", width);
        conv(prefix + ".conv3", width, width * 4, 1);
        norm(prefix + ".bn3", width * 4);
        if (b == 0) {
          conv(prefix + ".downsample.0", in, width * 4, 1);
          norm(prefix + ".downsample.1", width * 4);
        }
        in = width * 4;
      }
    }
    tensors.push_back({"fc.weight", 1000 * 2048});
    tensors.push_back({"fc.bias", 1000});
  }

  std::size_t elements() const {
    std::size_t total = 0;
    for (const auto& t : tensors) {
      total += t.count;
    }
    return total;
  }
};

//! A model's values and gradients as a trainer holds them, one vector each per tensor.
struct resnet50_replica {
  resnet50 shapes;
  std::vector<std::vector<float>> values, grads;
  std::vector<cohort::parameter_ref<std::vector<float>>> params;

  resnet50_replica() {
    for (const auto& t : shapes.tensors) {
      values.emplace_back(t.count, 0.0f);
      grads.emplace_back(t.count, 0.0f);
    }
    for (std::size_t i = 0; i < grads.size(); ++i) {
      params.push_back({shapes.tensors[i].name, &values[i], &grads[i]});
    }
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

} // namespace bench
