// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/tensor/dtype.hpp>

#include <array>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! What a reducer asks of a communicator for gradients of one dtype: the dtype they travel in,
//! the factor applied to each element before the reduction and after it, and the reduction.
//! A strategy casts and scales while it packs and unpacks, so none of this costs a pass of its
//! own over the data.
struct grad_reduction {
  dtype wire = dtype::float32;
  double pre_scale = 1.0;
  double post_scale = 1.0;
  reduce_op op = reduce_op::sum;

  friend constexpr bool operator==(const grad_reduction&, const grad_reduction&) = default;
};

//! A gradient reducer policy (`mean`, `sum`, `compressed<float16>`...): says, for the gradients
//! of one dtype and a number of ranks, how they are reduced. The communicator consumes it, so
//! this layer sits below the communicator's.
template <class R>
concept reducer = std::copy_constructible<R> && requires(const R& r, dtype type, int ranks) {
  { r.plan(type, ranks) } -> std::same_as<grad_reduction>;
};

//! A reducer that reduces some dtypes itself, bucket by bucket, with state kept across steps
//! (`powersgd`, or a user's own top-k or signSGD; see reducer/hook.hpp and docs/compression.md).
//! The handle is copyable and its copies share one state, as PyTorch's `PowerSGDState` is shared
//! by the hook's calls; its `plan()` is how the dtypes it does not handle are reduced, and how
//! `hook_bucket::reduce_plain` reduces the others. The state provides:
//! - `bool handles(dtype) const`: the dtypes whose buckets it reduces;
//! - `void prepare(const hook_layout&)`: before the ranks agree on a step, on the caller's
//!   thread: size state and scratch here (a throw is agreed, an error on every rank);
//! - `void sign(std::uint64_t layout, hook_signature&) const`: what the ranks must agree on;
//! - `void reduce(const hook_bucket&)`: one bucket, in place, after the agreement (on the
//!   caller's thread, or on cohort's with overlap; never two buckets of one layout at once);
//! - `void step_ended(std::uint64_t layout)`: the step's reduction completed on every rank.
//! Calls for one layout never overlap; calls for different layouts may (two optimizers sharing
//! a handle, a `prepare` on the caller's thread while cohort's reduces another's bucket), so a
//! state that serves several parameter sets keys its state by layout and guards it.
template <class H>
concept gradient_hook = reducer<H> && requires(const H& h) {
  typename H::state_type;
  { h.state() } -> std::convertible_to<std::shared_ptr<typename H::state_type>>;
} && requires(typename H::state_type& s, const typename H::state_type& c, const hook_layout& l,
              const hook_bucket& b, hook_signature& sig, std::uint64_t key, dtype t) {
  { c.handles(t) } -> std::same_as<bool>;
  s.prepare(l);
  c.sign(key, sig);
  s.reduce(b);
  s.step_ended(key);
};

namespace detail {
template <gradient_hook H>
struct hook_calls {
  using state = typename H::state_type;
  static constexpr hook_vtable table{
      [](const void* s, dtype t) { return static_cast<const state*>(s)->handles(t); },
      [](void* s, const hook_layout& l) { static_cast<state*>(s)->prepare(l); },
      [](const void* s, std::uint64_t key, hook_signature& sig) {
        static_cast<const state*>(s)->sign(key, sig);
      },
      [](void* s, const hook_bucket& b) { static_cast<state*>(s)->reduce(b); },
      [](void* s, std::uint64_t key) { static_cast<state*>(s)->step_ended(key); },
      [](const void* h) -> std::shared_ptr<void> { return static_cast<const H*>(h)->state(); }};
};
} // namespace detail

//! A reducer's answers for every dtype at one number of ranks: the form in which a reducer
//! reaches the gradient-sync engine, which is then compiled once whatever the reducer's type.
//! A gradient hook's state travels in it too, with the dtypes it reduces itself.
class reduction_table {
public:
  template <reducer Reducer>
  constexpr reduction_table(const Reducer& reducer, int ranks)
      : ranks_(ranks) {
    for (const dtype type : all_dtypes) {
      plans_[dtype_index(type)] = reducer.plan(type, ranks);
    }
    if constexpr (gradient_hook<Reducer>) {
      hook_ = hook_ref(&reducer, reducer.state().get(), &detail::hook_calls<Reducer>::table);
      for (const dtype type : all_dtypes) {
        hooked_ |= hook_.handles(type) ? 1u << dtype_index(type) : 0u;
      }
    }
  }

  constexpr const grad_reduction& operator()(dtype type) const noexcept {
    return plans_[dtype_index(type)];
  }

  //! The gradient hook, if the reducer is one (empty otherwise).
  constexpr const hook_ref& hook() const noexcept { return hook_; }
  //! Whether the hook reduces gradients of `type` itself.
  constexpr bool hooked(dtype type) const noexcept {
    return (hooked_ & (1u << dtype_index(type))) != 0;
  }
  constexpr std::uint32_t hooked_mask() const noexcept { return hooked_; }

  //! The same reduction, reduce-scattered: gradient i's reduced value reaches rank `owners[i]`
  //! alone (`grad_sync_options::owners`; empty: an all-reduce). `rank` is this rank.
  constexpr reduction_table scattered_to(std::span<const int> owners, int rank) const noexcept {
    reduction_table scattered = *this;
    scattered.owners_ = owners;
    scattered.rank_ = rank;
    return scattered;
  }
  //! Whose each reduced gradient is (empty: every rank's).
  constexpr std::span<const int> owners() const noexcept { return owners_; }
  constexpr bool scattered() const noexcept { return !owners_.empty(); }
  constexpr int rank() const noexcept { return rank_; }
  constexpr int ranks() const noexcept { return ranks_; }

private:
  std::array<grad_reduction, dtype_count> plans_{};
  hook_ref hook_{};
  std::uint32_t hooked_ = 0;
  int ranks_ = 1;
  std::span<const int> owners_{};
  int rank_ = 0;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
