// SPDX-License-Identifier: Apache-2.0
#pragma once

// The hooks an overlapping cohort::torch::distributed_optimizer puts on its parameters: a tensor
// hook on each (its gradient arrives, before AccumulateGrad adds it into the one there) and a
// post hook on its AccumulateGrad node (the gradient was accumulated, or came sparse). LibTorch's
// autograd API that 1.13 and 2.x share (`impl::grad_accumulator`, `Node::add_post_hook`,
// `Tensor::register_hook`), not c10d.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/config.hpp>

#include <ATen/ATen.h>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch::detail {

//! The hooks on one optimizer's parameters. Removed by `remove()` or on destruction; no backward
//! may run meanwhile.
class autograd_hooks {
public:
  autograd_hooks() = default;
  autograd_hooks(const autograd_hooks&) = delete;
  autograd_hooks& operator=(const autograd_hooks&) = delete;
  ~autograd_hooks() { remove(); }

  //! For each parameter i of `params`: `arrival(i)` as its gradient arrives, `ready(i, sparse)`
  //! once AccumulateGrad has added it in. All or none: a hook that cannot be added removes the
  //! others.
  template <class Arrival, class Ready>
  void add(const std::vector<parameter>& params, Arrival arrival, Ready ready) {
    try {
      hooks_.reserve(params.size());
      for (std::size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& value = params[i].value;
        auto node = ::torch::autograd::impl::grad_accumulator(value);
        const std::uintptr_t key =
            node->add_post_hook(std::make_unique<ready_hook<Ready>>(ready, i));
        // Held: a leaf keeps only a weak reference to its AccumulateGrad node, and a new node
        // would have no hook.
        hooks_.push_back({std::move(node), key, 0, value});
        hooks_.back().arrival =
            hooks_.back().value.register_hook([arrival, i](const at::Tensor&) { arrival(i); });
      }
    } catch (...) {
      remove();
      throw;
    }
  }

  void remove() noexcept {
    for (hook& h : hooks_) {
      h.node->del_post_hook(h.key);
      try {
        h.value.remove_hook(h.arrival);
      } catch (...) {
        // (its tensor hook was not registered: adding failed in between)
      }
    }
    hooks_.clear();
  }

private:
  template <class Ready>
  struct ready_hook final : ::torch::autograd::FunctionPostHook {
    ready_hook(Ready ready, std::size_t index)
        : ready(std::move(ready))
        , index(index) {}
    // For AccumulateGrad, `inputs` is the gradient that arrived (and was just accumulated).
    ::torch::autograd::variable_list
    operator()(const ::torch::autograd::variable_list& outputs,
               const ::torch::autograd::variable_list& inputs) override {
      ready(index, !inputs.empty() && inputs.front().defined() &&
                       inputs.front().layout() != c10::kStrided);
      return outputs;
    }
    Ready ready;
    std::size_t index;
  };

  // A std::shared_ptr in LibTorch 1.13, a c10::intrusive_ptr in later ones.
  using node_pointer =
      decltype(::torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

  struct hook {
    node_pointer node;
    std::uintptr_t key;
    unsigned arrival; // the tensor hook's handle
    at::Tensor value; // the parameter it is on
  };

  std::vector<hook> hooks_;
};

} // namespace torch::detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
