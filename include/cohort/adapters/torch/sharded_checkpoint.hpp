// SPDX-License-Identifier: Apache-2.0
#pragma once

// A cohort::torch::sharded_optimizer's state in a cohort checkpoint (needs cohort::checkpoint),
// resumed at any number of ranks:
//
//   ckpt.save(step, cohort::torch::module_state(*model),
//             cohort::torch::sharded_optimizer_state(opt, *model), rng, position);
//
// Each rank writes the state it holds (its shard's, through LibTorch's own serialization of the
// wrapped optimizer) into its own file. At resume every rank loads each saved rank's part in
// turn and keeps the state of the parameters it owns under the plan of the ranks there are now,
// so that it never holds more than its own and one saved rank's (the files themselves are mapped
// from the page cache, not copied): 2 ranks' checkpoint resumes at 3, and 3's at 2. Saved and
// resumed optimizers must have the same parameters in the same order (their names are compared,
// each part's against the one given).

#include <cohort/adapters/torch/detail/optimizer_names.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/adapters/torch/sharded_optimizer.hpp>
#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <unordered_set>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! A sharded optimizer and the names of its parameters, for a checkpoint.
template <class Optimizer, class Communicator, class Reducer>
struct sharded_optimizer_state_ref {
  sharded_optimizer<Optimizer, Communicator, Reducer>* optimizer;
  std::vector<parameter> named;
};

//! `optimizer`'s state, each rank's shard of it, its parameters named after `module`'s.
template <class Optimizer, class Communicator, class Reducer>
sharded_optimizer_state_ref<Optimizer, Communicator, Reducer>
sharded_optimizer_state(sharded_optimizer<Optimizer, Communicator, Reducer>& optimizer,
                        const ::torch::nn::Module& module) {
  return {&optimizer, all_parameters(module)};
}

} // namespace torch

template <class Optimizer, class Communicator, class Reducer>
struct checkpoint_traits<torch::sharded_optimizer_state_ref<Optimizer, Communicator, Reducer>> {
  using ref = torch::sharded_optimizer_state_ref<Optimizer, Communicator, Reducer>;
  static constexpr state_scope scope = state_scope::sharded;
  static constexpr std::string_view kind = "torch sharded optimizer state";

  // Each part: the optimizer's parameter names (group by group), the positions among them that
  // have state on the rank that wrote it, and LibTorch's archive of that state.
  static void save(checkpoint::byte_writer& out, const ref& state) {
    auto& sharded = *state.optimizer;
    // Not inner(), which waits for a reduction in flight, collectively: a rank whose earlier
    // thing failed would not be there. The state is the step's, which no reduction writes.
    ::torch::optim::Optimizer& optimizer = static_cast<Optimizer&>(sharded);
    torch::detail::put_optimizer_names(out, optimizer, state.named);
    const std::vector<at::Tensor> params = parameters_of(optimizer);
    std::vector<std::uint64_t> with_state;
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (optimizer.state().count(torch::detail::state_key(optimizer.state(), params[p])) != 0) {
        with_state.push_back(p);
      }
    }
    out.put<std::uint64_t>(with_state.size());
    for (const std::uint64_t p : with_state) {
      out.put(p);
    }
    // LibTorch's save of the wrapped optimizer: the wrapper's own refuses (one rank's file
    // would pass for the whole).
    const torch::detail::state_message message =
        torch::detail::save_state_with(optimizer, [&](::torch::serialize::OutputArchive& archive) {
          sharded.Optimizer::save(archive);
        });
    if (!message.failure.empty()) {
      throw checkpoint_error("cohort checkpoint: the optimizer's state does not serialize: " +
                             message.failure);
    }
    out.put_block(std::as_bytes(std::span(message.bytes.data(), message.bytes.size())));
  }

  static void load(std::span<checkpoint::byte_reader> parts, ref& state, const load_context&) {
    auto& sharded = *state.optimizer;
    ::torch::optim::Optimizer& optimizer = static_cast<Optimizer&>(sharded); // (as in save)
    const std::vector<std::string> names =
        torch::detail::optimizer_parameter_names(optimizer, state.named);
    const std::vector<at::Tensor> params = parameters_of(optimizer);
    // The optimizer's parameters this rank owns under today's plan.
    std::unordered_set<const void*> owned;
    for (std::size_t i = 0; i < sharded.named_parameters().size(); ++i) {
      if (sharded.owns(i)) {
        owned.insert(sharded.named_parameters()[i].value.unsafeGetTensorImpl());
      }
    }
    const auto owns = [&](std::size_t p) {
      return owned.count(params[p].unsafeGetTensorImpl()) != 0;
    };
    auto& held = optimizer.state();
    held.clear();
    std::size_t expected = 0;
    // The saved rank whose part held each parameter's state: two would not be a partition.
    std::vector<int> stated_by(names.size(), -1);
    for (std::size_t r = 0; r < parts.size(); ++r) {
      checkpoint::byte_reader& in = parts[r];
      torch::detail::require_optimizer_names(in, optimizer, state.named);
      const auto stated = in.get<std::uint64_t>("the number of parameters with state");
      if (stated > names.size()) {
        in.fail("the parameters with state",
                "are " + std::to_string(stated) + " of " + std::to_string(names.size()));
      }
      for (std::uint64_t k = 0; k < stated; ++k) {
        const auto p = in.get<std::uint64_t>("a parameter with state");
        if (p >= names.size()) {
          in.fail("a parameter with state",
                  "is number " + std::to_string(p) + " of " + std::to_string(names.size()));
        }
        int& by = stated_by[static_cast<std::size_t>(p)];
        if (by >= 0) {
          in.fail("the state of '" + names[static_cast<std::size_t>(p)] + "'",
                  "was saved by rank " + std::to_string(by) + " too");
        }
        by = static_cast<int>(r);
        expected += owns(static_cast<std::size_t>(p)) ? 1 : 0;
      }
      const std::span<const std::byte> archive = in.get_block("the optimizer's state");
      const std::string_view bytes(reinterpret_cast<const char*>(archive.data()), archive.size());
      // LibTorch's load adds the part's state to what is there; the others' is dropped at once.
      if (std::string failure = torch::detail::add_state_with(
              optimizer, bytes, state.named,
              [&](::torch::serialize::InputArchive& archive) { sharded.Optimizer::load(archive); });
          !failure.empty()) {
        in.fail("the optimizer's state", "does not load: " + failure);
      }
      for (std::size_t p = 0; p < params.size(); ++p) {
        if (!owns(p)) {
          held.erase(torch::detail::state_key(held, params[p]));
        }
      }
    }
    if (held.size() != expected) {
      // An optimizer whose save/load are LibTorch's defaults (which do nothing) loses its state.
      throw checkpoint_error(
          "cohort checkpoint: the saved ranks held state for " + std::to_string(expected) +
          " of the parameters this rank owns, "
          "and it has " +
          std::to_string(held.size()) +
          " after loading them: does this optimizer override save() and load()?");
    }
  }

private:
  static std::vector<at::Tensor> parameters_of(const ::torch::optim::Optimizer& optimizer) {
    std::vector<at::Tensor> params;
    for (const auto& group : optimizer.param_groups()) {
      params.insert(params.end(), group.params().begin(), group.params().end());
    }
    return params;
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
