// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a gradient hook sees of a step (see `gradient_hook` in reducer/concepts.hpp): a reducer
// that is more than a plan per dtype. PowerSGD, top-k or signSGD need the gradients' shapes,
// state kept across steps, and several dependent exchanges per bucket with their own compute in
// between; the engine hands them the bucket's gradients and the strategy's own exchange, so that a
// compression chosen at compile time composes with a strategy chosen at compile time.

#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! One gradient of a step, as a hook sees it: host memory, contiguous, of a dtype the hook said
//! it handles; the reduced value is written over it.
struct hook_tensor {
  tensor_view grad;
  std::size_t rows = 0; //!< a matrix of rows x (count / rows), row after row; 0: not a matrix
  std::size_t slot = 0; //!< its index in the parameter set (what a hook keys its state by)
  std::string_view name;
};

//! A step's gradients, grouped in the buckets the engine will hand to `reduce` (in that order):
//! what a hook sizes its state and scratch for in `prepare`, before the ranks agree on the step.
class hook_layout {
public:
  hook_layout(std::uint64_t key, int rank, int ranks, std::span<const hook_tensor> tensors,
              std::span<const std::size_t> offsets) noexcept
      : key_(key)
      , rank_(rank)
      , ranks_(ranks)
      , tensors_(tensors)
      , offsets_(offsets) {}

  //! Which parameter set this is (the gradients' names, sizes, dtypes and rows): the same on
  //! every rank, from run to run, and from one bucket order to another.
  std::uint64_t key() const noexcept { return key_; }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  //! Every gradient the hook will see, bucket after bucket.
  std::span<const hook_tensor> tensors() const noexcept { return tensors_; }
  std::size_t buckets() const noexcept { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  std::span<const hook_tensor> bucket(std::size_t b) const noexcept {
    return tensors_.subspan(offsets_[b], offsets_[b + 1] - offsets_[b]);
  }

private:
  std::uint64_t key_;
  int rank_;
  int ranks_;
  std::span<const hook_tensor> tensors_;
  std::span<const std::size_t> offsets_;
};

//! One bucket being reduced: its gradients, the strategy's all-reduce, and the reducer's plain
//! reduction of it. Made by the engine for one call of the hook's `reduce`.
class hook_bucket {
public:
  struct engine_calls {
    void (*allreduce)(void* context, tensor_view data, reduce_op op);
    void (*reduce_plain)(void* context);
  };

  hook_bucket(std::uint64_t layout, std::size_t index, int rank, int ranks,
              std::span<const hook_tensor> tensors, std::size_t capacity_bytes,
              const engine_calls& calls, void* context) noexcept
      : layout_(layout)
      , index_(index)
      , rank_(rank)
      , ranks_(ranks)
      , tensors_(tensors)
      , capacity_bytes_(capacity_bytes)
      , calls_(&calls)
      , context_(context) {}

  std::uint64_t layout() const noexcept { return layout_; }
  //! Its place in this step's buckets.
  std::size_t index() const noexcept { return index_; }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  std::span<const hook_tensor> tensors() const noexcept { return tensors_; }
  dtype type() const noexcept { return tensors_.front().grad.type; }
  //! The most one exchange may carry: the bucket's own size on the wire (what the strategy
  //! prepared its buffers for before the ranks agreed).
  std::size_t capacity_bytes() const noexcept { return capacity_bytes_; }

  //! All-reduces `data` (host memory) with `op` over every rank, through the communicator's own
  //! strategy (a two-level one keeps its advantage), traced and counted in the step's wire bytes.
  //! Every rank must make the same exchanges, of the same sizes, in the same order.
  void allreduce(tensor_view data, reduce_op op) const {
    if (data.size_bytes() > capacity_bytes_) {
      throw invalid_argument("cohort: a gradient hook's exchange on rank " + std::to_string(rank_) +
                             " in bucket " + std::to_string(index_) + " holds " +
                             std::to_string(data.size_bytes()) + " bytes, more than the bucket's " +
                             std::to_string(capacity_bytes_) + " its strategy was prepared for");
    }
    calls_->allreduce(context_, data, op);
  }

  //! Reduces the bucket as the hook's `plan()` says (the mean, for powersgd): what a hook does in
  //! its warm-up steps.
  void reduce_plain() const { calls_->reduce_plain(context_); }

private:
  std::uint64_t layout_;
  std::size_t index_;
  int rank_;
  int ranks_;
  std::span<const hook_tensor> tensors_;
  std::size_t capacity_bytes_;
  const engine_calls* calls_;
  void* context_;
};

//! What every rank must agree on before a step's gradients move (a hook's options, its step
//! count): folded into the fingerprint the step's agreement already compares, so that checking it
//! costs no message; named, with every rank's value, where the ranks differ.
class hook_signature {
public:
  struct entry {
    std::string what;
    std::string value;
  };

  //! A signature that only fingerprints (`described` null), or also describes.
  explicit hook_signature(std::vector<entry>* described = nullptr) noexcept
      : described_(described) {}

  hook_signature& add(std::string_view what, std::uint64_t value) {
    f_.add(what).add(value);
    describe(what, [&] { return std::to_string(value); });
    return *this;
  }
  hook_signature& add(std::string_view what, double value) {
    f_.add(what).add(std::bit_cast<std::uint64_t>(value));
    describe(what, [&] {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", value);
      return std::string(text);
    });
    return *this;
  }
  hook_signature& add(std::string_view what, bool value) {
    f_.add(what).add(value ? 1u : 0u);
    describe(what, [&] { return std::string(value ? "true" : "false"); });
    return *this;
  }
  hook_signature& add(std::string_view what, std::string_view value) {
    f_.add(what).add(value);
    describe(what, [&] { return std::string(value); });
    return *this;
  }

  std::uint64_t fingerprint() const noexcept { return f_.value(); }

private:
  template <class Text>
  void describe(std::string_view what, Text&& text) {
    if (described_ != nullptr) {
      described_->push_back({std::string(what), text()});
    }
  }

  detail::fingerprint f_;
  std::vector<entry>* described_;
};

//! A gradient hook's state, type-erased: how the engine, compiled once whatever the reducer,
//! reaches it. Trivially copyable (a reduction table stays a literal type); `share` keeps the
//! state alive while an overlapped step uses it, whatever becomes of the handle the caller gave.
struct hook_vtable {
  bool (*handles)(const void* state, dtype type);
  void (*prepare)(void* state, const hook_layout& layout);
  void (*sign)(const void* state, std::uint64_t layout, hook_signature& signature);
  void (*reduce)(void* state, const hook_bucket& bucket);
  void (*step_ended)(void* state, std::uint64_t layout);
  std::shared_ptr<void> (*share)(const void* handle);
};

class hook_ref {
public:
  constexpr hook_ref() noexcept = default;
  constexpr hook_ref(const void* handle, void* state, const hook_vtable* calls) noexcept
      : handle_(handle)
      , state_(state)
      , calls_(calls) {}

  constexpr explicit operator bool() const noexcept { return calls_ != nullptr; }

  bool handles(dtype type) const { return calls_->handles(state_, type); }
  void prepare(const hook_layout& layout) const { calls_->prepare(state_, layout); }
  void sign(std::uint64_t layout, hook_signature& signature) const {
    calls_->sign(state_, layout, signature);
  }
  void reduce(const hook_bucket& bucket) const { calls_->reduce(state_, bucket); }
  void step_ended(std::uint64_t layout) const { calls_->step_ended(state_, layout); }
  //! A reference to the state that keeps it alive (no allocation: a shared_ptr's copy).
  std::shared_ptr<void> share() const { return calls_->share(handle_); }

  friend constexpr bool operator==(const hook_ref&, const hook_ref&) = default;

private:
  const void* handle_ = nullptr; // the caller's hook (alive for the call that made this)
  void* state_ = nullptr;
  const hook_vtable* calls_ = nullptr;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
