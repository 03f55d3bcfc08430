// SPDX-License-Identifier: Apache-2.0
#pragma once

// A LibTorch optimizer's state (momentum buffers, Adam's moments, LBFGS's history) and its
// parameter groups' options (learning rate...) copied from one rank to all, matched by parameter
// name. LibTorch keys an optimizer's state by the address of each parameter's TensorImpl, which
// differs from process to process, and its serialization maps saved state onto parameters by
// their position in the parameter groups. So the ranks first agree that the optimizer's
// parameters are the same names in the same order (a `mismatch_error` naming the first that
// differs, on every rank); position then is name, and the state travels through LibTorch's own
// serialization.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/serialization/string.hpp>

#include <algorithm>
#include <c10/util/Type.h>
#include <cstddef>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/serialize/archive.h>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

inline const std::string stray_mark = "(not a parameter of the module) #";

// The names of `optimizer`'s parameters, group by group, from `named`. A parameter that `named`
// lacks gets a name that says so: the ranks then disagree on it, or all have it and all refuse.
inline std::vector<std::string>
optimizer_parameter_names(const ::torch::optim::Optimizer& optimizer,
                          const std::vector<parameter>& named) {
  std::unordered_map<const void*, const std::string*> name_of;
  for (const parameter& p : named) {
    name_of.emplace(p.value.unsafeGetTensorImpl(), &p.name);
  }
  std::vector<std::string> names;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    for (std::size_t i = 0; i < group.params().size(); ++i) {
      const auto found = name_of.find(group.params()[i].unsafeGetTensorImpl());
      names.push_back("group " + std::to_string(g) + ": " +
                      (found == name_of.end() ? stray_mark + std::to_string(i) : *found->second));
    }
  }
  return names;
}

// The key of `value`'s entry in an optimizer's `state`: LibTorch 1.13 keys the state by the
// TensorImpl's address as text, later ones by the address.
template <class State>
auto state_key(const State&, const at::Tensor& value) {
  using key = typename State::key_type;
  if constexpr (std::is_same_v<key, std::string>) {
    return c10::guts::to_string(value.unsafeGetTensorImpl());
  } else {
    return key(value.unsafeGetTensorImpl());
  }
}

// What the root sends: its state and options, or why it could not serialize them (so that no
// rank waits for bytes that never come).
struct state_message {
  std::string bytes;
  std::string failure;
  std::size_t states = 0;

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    // clang-format off
    archive & bytes;
    archive & failure;
    archive & states;
    // clang-format on
  }
};

// The state through `save(archive)` (the optimizer's save(), or LibTorch's own where a wrapper
// refuses its save), then each group's options.
template <class Save>
state_message save_state_with(::torch::optim::Optimizer& optimizer, Save save) {
  state_message message;
  try {
    std::ostringstream out;
    ::torch::serialize::OutputArchive archive;
    save(archive);
    for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      ::torch::serialize::OutputArchive options;
      optimizer.param_groups()[g].options().serialize(options);
      archive.write("cohort/options/" + std::to_string(g), options);
    }
    archive.save_to(out);
    message.bytes = out.str();
    message.states = optimizer.state().size();
  } catch (const std::exception& e) {
    message.failure = e.what();
  }
  return message;
}

inline state_message save_state(::torch::optim::Optimizer& optimizer) {
  return save_state_with(
      optimizer, [&](::torch::serialize::OutputArchive& archive) { optimizer.save(archive); });
}

//! What cohort::torch::distributed_optimizer tells the functions that take it as a
//! `torch::optim::Optimizer&`: the optimizer type it is (compared across ranks: not the
//! wrapper's), and, while the root's state is loaded into it here, that its own `load()` (which
//! is collective: every rank loads, then takes the root's state) must only load.
struct distributed_wrapper {
  explicit distributed_wrapper(const std::type_info& wrapped) noexcept
      : wrapped_type(&wrapped) {}
  const std::type_info* wrapped_type;
  bool loading_root_state = false;
};

// Marks `optimizer`'s load as the root's state arriving, while it lives.
class loading_root_state {
public:
  explicit loading_root_state(::torch::optim::Optimizer& optimizer)
      : target_(dynamic_cast<distributed_wrapper*>(&optimizer)) {
    if (target_ != nullptr) {
      target_->loading_root_state = true;
    }
  }
  loading_root_state(const loading_root_state&) = delete;
  loading_root_state& operator=(const loading_root_state&) = delete;
  ~loading_root_state() {
    if (target_ != nullptr) {
      target_->loading_root_state = false;
    }
  }

private:
  distributed_wrapper* target_;
};

// Adds the state in `bytes` (save_state_with's) to `optimizer`'s through `load(archive)`, and
// takes its groups' options; returns what went wrong ("" if nothing).
template <class Load>
std::string add_state_with(::torch::optim::Optimizer& optimizer, std::string_view bytes,
                           const std::vector<parameter>& named, Load load) {
  try {
    ::torch::serialize::InputArchive archive;
    // The state's tensors go where this rank's parameters are (another GPU than the root's).
    c10::optional<c10::Device> device;
    if (!named.empty()) {
      device = named.front().value.device();
    }
    archive.load_from(bytes.data(), bytes.size(), device);
    load(archive);
    for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      ::torch::serialize::InputArchive options;
      archive.read("cohort/options/" + std::to_string(g), options);
      optimizer.param_groups()[g].options().serialize(options);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// Loads the root's state in place of this rank's; returns what went wrong ("" if nothing).
inline std::string load_state(::torch::optim::Optimizer& optimizer, const state_message& message,
                              const std::vector<parameter>& named) {
  // Loading adds the root's state to what is there: a parameter the root has no state for
  // would keep this rank's.
  optimizer.state().clear();
  if (std::string failure = add_state_with(optimizer, message.bytes, named,
                                           [&](::torch::serialize::InputArchive& archive) {
                                             const loading_root_state loading(optimizer);
                                             optimizer.load(archive);
                                           });
      !failure.empty()) {
    return failure;
  }
  if (optimizer.state().size() != message.states) {
    // An optimizer whose save/load are LibTorch's defaults (which do nothing) loses its state.
    return "the root's optimizer has " + std::to_string(message.states) +
           " parameter states and this rank's has " + std::to_string(optimizer.state().size()) +
           " after loading them: does this optimizer override save() and load()?";
  }
  return {};
}

// An option's value as text (a double to its last bit, so that ranks that differ in it differ
// here).
inline std::string option_text(const c10::IValue& value) {
  if (value.isDouble()) {
    return exact_text(value.toDouble());
  }
  std::ostringstream out;
  out << value;
  return out.str();
}

// What every rank's optimizer must be alike in: its type, and each param group's options (their
// type, then every option LibTorch serializes, by name), read through LibTorch's own
// serialization so that any optimizer's options are covered.
inline std::vector<setting> optimizer_settings(const ::torch::optim::Optimizer& optimizer) {
  const auto* wrapper = dynamic_cast<const distributed_wrapper*>(&optimizer);
  const std::type_info& type = wrapper != nullptr ? *wrapper->wrapped_type : typeid(optimizer);
  std::vector<setting> settings{{"the optimizer's type", c10::demangle(type.name())}};
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& options = optimizer.param_groups()[g].options();
    const std::string group = "param group " + std::to_string(g);
    settings.push_back({group + "'s options", c10::demangle(typeid(options).name())});
    try {
      ::torch::serialize::OutputArchive out;
      options.serialize(out);
      std::ostringstream bytes;
      out.save_to(bytes);
      std::istringstream in(bytes.str());
      ::torch::serialize::InputArchive archive;
      archive.load_from(in);
      std::vector<std::string> keys = archive.keys();
      std::sort(keys.begin(), keys.end());
      for (const std::string& key : keys) {
        c10::IValue value;
        if (archive.try_read(key, value)) {
          settings.push_back({group + "'s option '" + key + "'", option_text(value)});
        }
      }
    } catch (const std::exception& e) {
      settings.push_back({group + "'s options", std::string("not serializable: ") + e.what()});
    }
  }
  return settings;
}

} // namespace detail

//! Throws `mismatch_error` on every rank unless every rank's `optimizer` is of one type with the
//! same options in every param group (as LibTorch serializes them), naming the first option
//! that differs and both values. Collective. (Adam and AdamW have the same options and state:
//! without this, ranks that built one each would load each other's state and drift apart.)
template <class Communicator>
void agree_on_optimizer(Communicator& comm, const ::torch::optim::Optimizer& optimizer,
                        const char* operation = "distributed_optimizer") {
  agree_on_settings(comm, detail::optimizer_settings(optimizer), operation);
}

//! Copies `optimizer`'s state and its groups' options from `root` to every rank (collective),
//! replacing what the others had: a rank that starts with other momentum, moments or learning
//! rate ends with `root`'s. `named` names the optimizer's parameters (`parameters(module)`, or
//! `all_parameters(module)` if some are frozen). Every failure (names that differ, a parameter
//! `named` lacks, state that does not serialize or load) throws on every rank. Once loaded, the
//! ranks' optimizers must agree in type and options (`agree_on_optimizer`): an Adam on one rank
//! and an AdamW on another is a `mismatch_error` on every rank, naming both types.
template <class Communicator>
void broadcast_optimizer_state(Communicator& comm, ::torch::optim::Optimizer& optimizer,
                               const std::vector<parameter>& named, int root = 0) {
  const std::vector<std::string> names =
      agree_on_names(comm, detail::optimizer_parameter_names(optimizer, named),
                     "broadcast_optimizer_state", "optimizer parameter");
  for (const std::string& name : names) {
    if (name.find(detail::stray_mark) != std::string::npos) {
      throw invalid_argument("cohort: broadcast_optimizer_state: " + name +
                             " is not among the module's parameters on any rank (build the "
                             "optimizer from the module's parameters)");
    }
  }
  detail::state_message message;
  if (comm.rank() == root) {
    message = detail::save_state(optimizer);
  }
  message = comm.bcast_obj(message, root);
  if (!message.failure.empty()) {
    throw error("cohort: broadcast_optimizer_state: rank " + std::to_string(root) +
                " could not serialize its optimizer: " + message.failure);
  }
  std::string failure;
  if (comm.rank() != root) {
    failure = detail::load_state(optimizer, message, named);
  }
  // Every rank learns whether every rank loaded it: the first failure, by rank.
  const std::vector<std::string> failures = comm.allgather_obj(failure);
  for (std::size_t r = 0; r < failures.size(); ++r) {
    if (!failures[r].empty()) {
      throw error("cohort: broadcast_optimizer_state: rank " + std::to_string(r) +
                  " could not load the optimizer state of rank " + std::to_string(root) + ": " +
                  failures[r]);
    }
  }
  agree_on_optimizer(comm, optimizer, "broadcast_optimizer_state");
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
