// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the LibTorch adapter's tests train: a model wide enough (1.2 MB of gradients: two
// buckets) that the last bucket is still on cohort's thread when backward returns, each rank's
// batches, and the check that the replicas are one.

#include <algorithm>
#include <cstdint>
#include <torch/torch.h>
#include <vector>

namespace torch_models {

struct wide_impl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  wide_impl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 512));
    fc3 = register_module("fc3", torch::nn::Linear(512, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
};
TORCH_MODULE_IMPL(wide, wide_impl);

inline wide wide_seeded(int seed) {
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  return wide();
}

// This rank's batch of step `step`.
inline torch::Tensor batch(int rank, int step) {
  torch::manual_seed(static_cast<std::uint64_t>(1000 * step + rank));
  return torch::randn({16, 64});
}

inline torch::Tensor loss_of(wide& m, int rank, int step) {
  return m->forward(batch(rank, step)).pow(2).mean();
}

// Whether every rank's `tensors` equal rank 0's.
template <class Communicator>
bool same_on_every_rank(Communicator& comm, const std::vector<at::Tensor>& tensors) {
  bool same = true;
  for (const at::Tensor& t : tensors) {
    at::Tensor root = t.detach().clone();
    comm.broadcast(root, 0);
    same = torch::equal(root, t.detach()) && same;
  }
  return comm.allreduce_obj(same ? 1 : 0, [](int a, int b) { return std::min(a, b); }) == 1;
}

} // namespace torch_models
