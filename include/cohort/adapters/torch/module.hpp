// SPDX-License-Identifier: Apache-2.0
#pragma once

// A LibTorch module's parameters and buffers as cohort parameter sets, their broadcast, and the
// buffers' average over the ranks.

#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/parameter.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! One parameter (or buffer) of a module: its name in `named_parameters()` and the tensor. The
//! gradient is the tensor's own `grad()`, read when cohort reads the parameter set.
struct parameter {
  std::string name;
  at::Tensor value;
};

namespace detail {

// The tensors of `items` (a module's named parameters or buffers) that `keep` takes, named.
template <class Keep>
std::vector<parameter> named_tensors(const ::torch::OrderedDict<std::string, at::Tensor>& items,
                                     Keep keep) {
  std::vector<parameter> set;
  for (const auto& item : items) {
    if (keep(item.value())) {
      set.push_back({item.key(), item.value()});
    }
  }
  return set;
}

} // namespace detail

//! The parameters of `module` that require a gradient, named and in the order of
//! `named_parameters()` (registration order: the same on every rank that built the same model;
//! the agreement compares the names before anything is reduced).
inline std::vector<parameter> parameters(const ::torch::nn::Module& module) {
  return detail::named_tensors(module.named_parameters(/*recurse=*/true),
                               [](const at::Tensor& t) { return t.requires_grad(); });
}

//! Every parameter of `module`, frozen ones too (`requires_grad` false): what must be the same on
//! every rank even where no gradient is reduced.
inline std::vector<parameter> all_parameters(const ::torch::nn::Module& module) {
  return detail::named_tensors(module.named_parameters(/*recurse=*/true),
                               [](const at::Tensor&) { return true; });
}

//! The buffers of `module` (BatchNorm's running statistics, say), named: a parameter set without
//! gradients, to broadcast with `broadcast_parameters`. Undefined buffers are left out.
inline std::vector<parameter> buffers(const ::torch::nn::Module& module) {
  return detail::named_tensors(module.named_buffers(/*recurse=*/true),
                               [](const at::Tensor& t) { return t.defined(); });
}

//! What of `module` no gradient updates: its frozen parameters and its buffers.
inline std::vector<parameter> untrained_state(const ::torch::nn::Module& module) {
  std::vector<parameter> set =
      detail::named_tensors(module.named_parameters(/*recurse=*/true),
                            [](const at::Tensor& t) { return !t.requires_grad(); });
  for (parameter& b : buffers(module)) {
    set.push_back(std::move(b));
  }
  return set;
}

//! Overwrites every parameter and buffer of `module` with `root`'s (collective): the replicas
//! start identical. The ranks first agree on the names, sizes and dtypes.
template <class Communicator>
void broadcast_module(Communicator& comm, const ::torch::nn::Module& module, int root = 0) {
  std::vector<parameter> all = parameters(module);
  for (parameter& p : untrained_state(module)) {
    all.push_back(std::move(p));
  }
  comm.broadcast_parameters(all, root);
}

//! Replaces every floating-point buffer of `module` (BatchNorm's running statistics, say) with
//! its mean over the ranks (collective): ChainerMN's AllreducePersistent, before an evaluation or
//! a checkpoint, so that every replica evaluates and saves the same statistics. 16-bit buffers are
//! summed in float32. Integer buffers (`num_batches_tracked`), which a mean would not keep whole,
//! are `root`'s on every rank: a rank that ran a training-mode forward the others did not (a GAN
//! sampling on rank 0) counts no more than they do. The ranks first agree on the buffers' names,
//! sizes and dtypes (else `mismatch_error` on every rank, naming the first that differs): one
//! 16-byte all-reduce when they do.
template <class Communicator>
void average_buffers(Communicator& comm, const ::torch::nn::Module& module, int root = 0) {
  std::vector<parameter> floating;
  std::vector<parameter> integral;
  for (parameter& b : buffers(module)) {
    (b.value.is_floating_point() ? floating : integral).push_back(std::move(b));
  }
  comm.broadcast_parameters(integral, root); // (every rank, empty or not: they agree there)
  // The ranks agree on what they average first (a bad layout would otherwise be averaged into
  // nonsense wherever its total size happened to match).
  std::vector<setting> described;
  described.reserve(floating.size());
  for (const parameter& b : floating) {
    described.push_back(
        {"floating-point buffer", b.name + " (" + std::to_string(b.value.numel()) + " " +
                                      std::string(c10::toString(b.value.scalar_type())) + ")"});
  }
  agree_on_settings(comm, described, "average_buffers");
  if (floating.empty()) {
    return;
  }
  const ::torch::NoGradGuard no_grad;
  // One all-reduce of every buffer, packed in float32 (or float64 where a buffer is) in the
  // order agreed above.
  const bool wide = std::any_of(floating.begin(), floating.end(), [](const parameter& b) {
    return b.value.scalar_type() == at::kDouble;
  });
  std::vector<at::Tensor> flat;
  flat.reserve(floating.size());
  for (const parameter& b : floating) {
    flat.push_back(b.value.detach().reshape({-1}).to(wide ? at::kDouble : at::kFloat));
  }
  at::Tensor packed = at::cat(flat);
  comm.allreduce(packed, reduce_op::sum);
  packed.div_(comm.size());
  std::int64_t offset = 0;
  for (parameter& b : floating) {
    const std::int64_t n = b.value.numel();
    b.value.detach().copy_(packed.narrow(0, offset, n).view(b.value.sizes()));
    offset += n;
  }
}

} // namespace torch

template <>
struct parameter_traits<torch::parameter> {
  static std::string_view name(const torch::parameter& p) noexcept { return p.name; }
  static at::Tensor& value(torch::parameter& p) noexcept { return p.value; }
  static const at::Tensor& value(const torch::parameter& p) noexcept { return p.value; }
  //! The tensor's own gradient slot (undefined until backward writes it).
  static at::Tensor* grad(const torch::parameter& p) { return &p.value.mutable_grad(); }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
