// SPDX-License-Identifier: Apache-2.0
#pragma once

// What cohort::torch::distributed_optimizer keeps of a step whose gradients are being reduced on
// cohort's thread: every gradient that reduction reads or writes, held until it is over, a
// probe of each parameter's values from when it began, and each gradient's version (what an
// in-place change of it moves) from when it was last read for the reduction; then, once it is
// over, each gradient's version as the reduction left it.

#include <cohort/adapters/torch/module.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>

#include <ATen/ATen.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch::detail {

//! The gradients of one reduction in flight and the parameters' probes (the caller serializes
//! every call: the autograd engine's hooks and the trainer's thread both use it).
class in_flight {
public:
  explicit in_flight(std::size_t parameters) {
    held_.reserve(parameters);
    probes_.reserve(parameters);
    versions_.reserve(parameters);
    reduced_.reserve(parameters);
  }

  in_flight(const in_flight&) = delete;
  in_flight& operator=(const in_flight&) = delete;
  ~in_flight() { let_go(); }

  //! A reduction of `params` begins: their gradients are held and their values probed.
  void begin(const std::vector<parameter>& params) {
    let_go();
    for (const parameter& p : params) {
      hold(p.value.grad());
      probes_.push_back(probe(p.value));
      versions_.push_back(version_of(p.value.grad()));
    }
  }

  //! Holds gradient `index` as it is now (it is read from now on) unless it is the one held.
  void mark(std::size_t index, const at::Tensor& grad) {
    if (index >= probes_.size() || !grad.is_same(held_[index].tensor)) {
      hold(grad);
    }
    if (index < versions_.size()) {
      versions_[index] = version_of(grad);
    }
  }

  //! Holds `grad` too (a second backward before the step: what the first held stays).
  void hold(const at::Tensor& grad) {
    // Its storage too, made not resizable meanwhile: `set_` would free the tensor's old storage,
    // and a growing `resize_` the storage's old buffer, which cohort's thread still uses
    // (LibTorch then refuses the resize).
    held_gradient held{grad, {}, false};
    if (grad.defined() && grad.layout() == c10::kStrided && grad.has_storage()) {
      held.storage = grad.storage();
      held.was_resizable = held.storage.resizable();
      held.storage.unsafeGetStorageImpl()->set_resizable(false);
    }
    held_.push_back(std::move(held));
  }

  //! The first of `params` whose values changed since `begin` (an optimizer stepped meanwhile),
  //! if any.
  std::optional<std::size_t> changed(const std::vector<parameter>& params) const {
    for (std::size_t i = 0; i < params.size() && i < probes_.size(); ++i) {
      if (probe(params[i].value) != probes_[i]) {
        return i;
      }
    }
    return std::nullopt;
  }

  //! The first of `params` whose gradient was changed in place since it was read for the
  //! reduction (zeroed by a `zero_grad` cohort did not see: the base class's, the module's), if
  //! any: cohort's thread would write the reduced value over it, or has.
  std::optional<std::size_t> modified(const std::vector<parameter>& params) const {
    for (std::size_t i = 0; i < params.size() && i < versions_.size(); ++i) {
      const at::Tensor& grad = params[i].value.grad();
      if (grad.defined() && grad.unsafeGetTensorImpl() == versions_[i].impl &&
          grad._version() != versions_[i].version) {
        return i;
      }
    }
    return std::nullopt;
  }

  //! Every bucket is reduced: what was held goes (cohort's thread is done with it), and each
  //! gradient's version is kept as its reduced value's (see holds_reduced).
  void reduced(const std::vector<parameter>& params) {
    let_go();
    reduced_.clear();
    for (const parameter& p : params) {
      reduced_.push_back(version_of(p.value.grad()));
    }
  }

  //! Whether `grad`, parameter `index`'s, still holds the value the last reduction left in it
  //! (neither replaced nor changed in place since).
  bool holds_reduced(std::size_t index, const at::Tensor& grad) const {
    return index < reduced_.size() && grad.defined() &&
           grad.unsafeGetTensorImpl() == reduced_[index].impl &&
           grad._version() == reduced_[index].version;
  }

  //! Once no reduction is pending: what was held goes, each storage resizable again as it was
  //! (in reverse: one held twice was made not resizable once).
  void let_go() noexcept {
    for (auto held = held_.rbegin(); held != held_.rend(); ++held) {
      if (held->storage && held->was_resizable) {
        held->storage.unsafeGetStorageImpl()->set_resizable(true);
      }
    }
    held_.clear(); // (the capacities stay: no allocation per step)
    probes_.clear();
    versions_.clear();
  }

private:
  struct held_gradient {
    at::Tensor tensor;
    c10::Storage storage;
    bool was_resizable;
  };

  // A few of `value`'s elements (its first, middle and last), as a fingerprint of their bits:
  // an optimizer's step changes them (LibTorch's own step writes through `p.data()`, which the
  // parameter's version counter does not see). Best effort: a step that changes none of the
  // three is not seen.
  static std::uint64_t probe(const at::Tensor& value) {
    if (!value.defined() || value.numel() == 0 || value.layout() != c10::kStrided ||
        !value.device().is_cpu() || !value.is_non_overlapping_and_dense()) {
      return 0;
    }
    const auto* bytes = static_cast<const unsigned char*>(value.data_ptr());
    const auto size = static_cast<std::size_t>(value.element_size());
    const auto n = static_cast<std::size_t>(value.numel());
    cohort::detail::fingerprint f;
    for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes + at * size, std::min<std::size_t>(size, sizeof word));
      f.add(word);
    }
    return f.value();
  }

  struct version {
    const c10::TensorImpl* impl; // (compared only: never dereferenced)
    std::int64_t version;
  };
  static version version_of(const at::Tensor& grad) {
    return grad.defined() ? version{grad.unsafeGetTensorImpl(), grad._version()}
                          : version{nullptr, 0};
  }

  std::vector<held_gradient> held_; // the first ones: the gradients `begin` held, by index
  std::vector<std::uint64_t> probes_;
  std::vector<version> versions_;
  // Each gradient's reduced value's version, from the last `reduced` on (stale entries never
  // match: every change of a gradient since moved its version or replaced it).
  std::vector<version> reduced_;
};

} // namespace torch::detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
