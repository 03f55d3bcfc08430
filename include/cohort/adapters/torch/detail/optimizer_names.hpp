// SPDX-License-Identifier: Apache-2.0
#pragma once

// A LibTorch optimizer's parameter names in a checkpoint, written before its state and compared
// when it is read back: LibTorch maps saved state onto parameters by their position in the
// groups, so the positions must hold the same parameters.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/checkpoint/bytes.hpp>
#include <cohort/config.hpp>

#include <cstdint>
#include <string>
#include <torch/optim/optimizer.h>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

//! Writes the names of `optimizer`'s parameters (group by group, from `named`); returns them.
inline std::vector<std::string> put_optimizer_names(checkpoint::byte_writer& out,
                                                    const ::torch::optim::Optimizer& optimizer,
                                                    const std::vector<parameter>& named) {
  std::vector<std::string> names = optimizer_parameter_names(optimizer, named);
  out.put<std::uint64_t>(names.size());
  for (const std::string& name : names) {
    out.put_string(name, "a parameter's name");
  }
  return names;
}

//! Reads the names put_optimizer_names wrote and throws (through `in`) unless they are
//! `optimizer`'s, in order, naming the first that differs; returns them.
inline std::vector<std::string> require_optimizer_names(checkpoint::byte_reader& in,
                                                        const ::torch::optim::Optimizer& optimizer,
                                                        const std::vector<parameter>& named) {
  std::vector<std::string> names = optimizer_parameter_names(optimizer, named);
  const auto saved = in.get<std::uint64_t>("the number of the optimizer's parameters");
  if (saved != names.size()) {
    in.fail("the optimizer", "was saved with " + std::to_string(saved) +
                                 " parameters, the one given has " + std::to_string(names.size()));
  }
  for (const std::string& name : names) {
    const std::string saved_name = in.get_string("an optimizer parameter's name");
    if (saved_name != name) {
      in.fail("optimizer parameter '" + saved_name + "'",
              "stands where the one given has '" + name + "'");
    }
  }
  return names;
}

} // namespace detail
} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
