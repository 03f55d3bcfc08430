// SPDX-License-Identifier: Apache-2.0
#pragma once

// LibTorch's state in a cohort checkpoint (needs cohort::checkpoint and cohort::torch):
//
//   ckpt.save(step, cohort::torch::module_state(*model),
//             cohort::torch::optimizer_state(opt.inner(), *model), rng, position);
//
// `module_state`: every parameter (frozen ones too) and buffer by name, dtype and shape, on the
// CPU or any device (copied through host memory). `optimizer_state`: the optimizer's state and
// its groups' options through LibTorch's own serialization, matched by parameter name as
// broadcast_optimizer_state matches them, so that a checkpoint resumes into a new process (whose
// tensors are at other addresses). The module's state is replicated (written once, split across
// the ranks, compared between them); the optimizer's is rank 0's (written by rank 0). A
// cohort::torch::sharded_optimizer's is each rank's shard: `sharded_optimizer_state(opt, module)`
// (sharded_checkpoint.hpp, included here).

#include <cohort/adapters/torch/detail/optimizer_names.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/adapters/torch/sharded_checkpoint.hpp>
#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! A module's parameters and buffers, for a checkpoint.
struct module_state_ref {
  std::vector<parameter> tensors;
};

//! `module`'s parameters (frozen ones too) and buffers, by name.
inline module_state_ref module_state(const ::torch::nn::Module& module) {
  module_state_ref state{all_parameters(module)};
  for (parameter& b : buffers(module)) {
    state.tensors.push_back(std::move(b));
  }
  return state;
}

//! A LibTorch optimizer and the names of its parameters, for a checkpoint.
struct optimizer_state_ref {
  ::torch::optim::Optimizer* optimizer;
  std::vector<parameter> named;
};

//! `optimizer`'s state and options, its parameters named after `module`'s.
inline optimizer_state_ref optimizer_state(::torch::optim::Optimizer& optimizer,
                                           const ::torch::nn::Module& module) {
  return {&optimizer, all_parameters(module)};
}

} // namespace torch

template <>
struct checkpoint_traits<torch::module_state_ref> {
  static constexpr state_scope scope = state_scope::replicated;
  static constexpr std::string_view kind = "torch module state";

  static void save(checkpoint::byte_writer& out, const torch::module_state_ref& state) {
    out.put<std::uint64_t>(state.tensors.size());
    for (const torch::parameter& p : state.tensors) {
      const at::Tensor host = p.value.detach().to(at::kCPU).contiguous();
      out.mark("tensor '" + p.name + "'");
      out.put_string(p.name, "a parameter's name");
      out.put_string(std::string(c10::toString(host.scalar_type())), "a dtype's name", 64);
      out.put<std::uint64_t>(static_cast<std::uint64_t>(host.dim()));
      for (const std::int64_t extent : host.sizes()) {
        out.put<std::int64_t>(extent);
      }
      const std::span<const std::byte> bytes{static_cast<const std::byte*>(host.data_ptr()),
                                             host.nbytes()};
      if (host.data_ptr() == p.value.data_ptr()) {
        out.put_block_borrowed(bytes); // the module's own CPU tensor: not copied
      } else {
        out.put_block(bytes); // a copy from the device, gone after this line
      }
    }
  }

  static void load(checkpoint::byte_reader& in, torch::module_state_ref& state,
                   const load_context&) {
    const auto saved = in.get<std::uint64_t>("the number of tensors");
    if (saved != state.tensors.size()) {
      in.fail("the module", "was saved with " + std::to_string(saved) +
                                " parameters and buffers, the one given has " +
                                std::to_string(state.tensors.size()));
    }
    const ::torch::NoGradGuard no_grad;
    for (torch::parameter& p : state.tensors) {
      const std::string name = in.get_string("a tensor's name");
      if (name != p.name) {
        in.fail("tensor '" + name + "'", "stands where the module has '" + p.name + "'");
      }
      const std::string type = in.get_string("the dtype of '" + name + "'", 64);
      const std::string given(c10::toString(p.value.scalar_type()));
      if (type != given) {
        in.fail("tensor '" + name + "'", "was saved as " + type + ", the module's is " + given);
      }
      const auto dims = in.get<std::uint64_t>("the dimensions of '" + name + "'");
      if (dims != static_cast<std::uint64_t>(p.value.dim())) {
        in.fail("tensor '" + name + "'", "was saved with " + std::to_string(dims) +
                                             " dimensions, the module's has " +
                                             std::to_string(p.value.dim()));
      }
      for (std::uint64_t d = 0; d < dims; ++d) {
        const auto extent = in.get<std::int64_t>("a size of '" + name + "'");
        if (extent != p.value.size(static_cast<std::int64_t>(d))) {
          in.fail("tensor '" + name + "'",
                  "was saved with size " + std::to_string(extent) + " in dimension " +
                      std::to_string(d) + ", the module's has " +
                      std::to_string(p.value.size(static_cast<std::int64_t>(d))));
        }
      }
      const std::span<const std::byte> bytes = in.get_block("the values of '" + name + "'");
      at::Tensor host = at::empty(p.value.sizes(), p.value.options().device(at::kCPU));
      if (bytes.size() != host.nbytes()) {
        in.fail("tensor '" + name + "'", "holds " + std::to_string(bytes.size()) +
                                             " bytes, the module's " +
                                             std::to_string(host.nbytes()));
      }
      if (!bytes.empty()) {
        std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
      }
      p.value.copy_(host);
    }
  }
};

template <>
struct checkpoint_traits<torch::optimizer_state_ref> {
  // LibTorch's archive of the state keys it by tensor address (1.13) and stamps it (2.x): the
  // ranks' bytes differ where their meaning does not, so rank 0's is written.
  static constexpr state_scope scope = state_scope::root;
  static constexpr std::string_view kind = "torch optimizer state";

  static void save(checkpoint::byte_writer& out, const torch::optimizer_state_ref& state) {
    torch::detail::put_optimizer_names(out, *state.optimizer, state.named);
    const torch::detail::state_message message = torch::detail::save_state(*state.optimizer);
    if (!message.failure.empty()) {
      throw checkpoint_error("cohort checkpoint: the optimizer's state does not serialize: " +
                             message.failure);
    }
    out.put<std::uint64_t>(message.states);
    out.put_string(message.bytes, "the optimizer's state", UINT64_MAX);
  }

  static void load(checkpoint::byte_reader& in, torch::optimizer_state_ref& state,
                   const load_context&) {
    torch::detail::require_optimizer_names(in, *state.optimizer, state.named);
    torch::detail::state_message message;
    message.states = static_cast<std::size_t>(in.get<std::uint64_t>("the number of states"));
    message.bytes = in.get_string("the optimizer's state", in.left());
    if (std::string failure = torch::detail::load_state(*state.optimizer, message, state.named);
        !failure.empty()) {
      in.fail("the optimizer's state", "does not load: " + failure);
    }
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
