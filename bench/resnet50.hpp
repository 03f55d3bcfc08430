// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradient_set.hpp"

namespace bench {

//! The parameter tensors of torchvision's ResNet-50, in registration order: 161 tensors,
//! 25,557,032 float32 values (53 convolutions, 53 batch norms of two tensors each, the fully
//! connected layer's weight and bias). What a gradient synchronisation of a real model reduces:
//! a few large tensors and many small ones.
struct resnet50 {
  struct tensor {
    std::string name;
    std::size_t count;
    std::size_t rows = 0; // as DDP's hooks see a weight: out channels x the rest; 0: a vector
  };
  std::vector<tensor> tensors;

  resnet50() {
    const auto conv = [&](const std::string& name, std::size_t in, std::size_t out, std::size_t k) {
      tensors.push_back({name + ".weight", out * in * k * k, out});
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
    tensors.push_back({"fc.weight", 1000 * 2048, 1000});
    tensors.push_back({"fc.bias", 1000});
  }
};

//! ResNet-50's gradients as a trainer holds them.
template <class Allocator = std::allocator<float>>
basic_gradient_set<Allocator> resnet50_gradients(const Allocator& allocator = Allocator()) {
  std::vector<std::pair<std::string, std::size_t>> tensors;
  const resnet50 model;
  for (const auto& t : model.tensors) {
    tensors.emplace_back(t.name, t.count);
  }
  basic_gradient_set<Allocator> set(tensors, allocator);
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    set.params[i].rows = model.tensors[i].rows; // (read by powersgd only)
  }
  return set;
}

} // namespace bench
