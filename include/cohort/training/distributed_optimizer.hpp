// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/parameter.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Anything that updates parameters from their gradients with `step()`.
template <class O>
concept optimizer = std::move_constructible<O> && requires(O& o) {
  o.step();
};

//! Options of `distributed_optimizer`.
struct distributed_optimizer_options {
  //! A parameter without a gradient in a step: an error naming it (default), or a zero gradient.
  missing_grad missing = missing_grad::report;
  //! The rank whose initial parameter values every replica starts from.
  int root = 0;
  //! ChainerMN's double buffering: each `step()` starts reducing this step's gradients (a copy of
  //! them, on cohort's thread) and updates with the previous step's, already reduced while this
  //! step computed. Communication then hides entirely behind compute, at the price of gradients
  //! one step stale and a second copy of them. The first step only starts a reduction; `finish()`
  //! applies the last one. Needs an overlapping (host) strategy and MPI_THREAD_MULTIPLE.
  bool double_buffering = false;
};

//! Wraps an optimizer so that training is data-parallel: on construction every rank's
//! parameters are overwritten with `root`'s (so the replicas start identical, and no step is
//! lost to it as in ChainerMN, whose first update() only broadcast); each `step()` reduces the
//! gradients across ranks with `Reducer` (the mean, by default) and then steps the inner
//! optimizer, so that the replicas stay identical.
//!
//! To overlap the reduction with backward, call `grad_ready(i)` as parameter i's gradient
//! becomes final (from a hook): the first call of a step begins the reduction, full buckets leave
//! at once, and `step()` waits for the rest. Inside `no_sync()`, gradients accumulate locally and
//! nothing is reduced: the step after it reduces their sum once (gradient accumulation).
//!
//! The parameter set and the communicator are held by reference: both must outlive the wrapper,
//! and neither may be moved while it is in use. A strategy chosen at compile time costs nothing
//! per step beyond its own work: the parameter set's type is erased behind function pointers,
//! called once per step (and once per `grad_ready`).
//!
//! `Communicator` may be spelled as a reference (`decltype(comm)` of a reference parameter);
//! class template argument deduction also works: `distributed_optimizer opt{sgd{}, comm, params}`.
template <optimizer Optimizer, class Communicator, reducer Reducer = mean>
requires communicator<std::remove_cvref_t<Communicator>>
class distributed_optimizer {
public:
  using communicator_type = std::remove_cvref_t<Communicator>;

  //! Broadcasts `params` from `options.root` (collective). Throws `mismatch_error` if the ranks'
  //! parameter layouts differ.
  template <parameter_set Params>
  distributed_optimizer(Optimizer inner, communicator_type& comm, Params& params,
                        distributed_optimizer_options options = {}, Reducer reducer = {})
      : inner_(std::move(inner))
      , comm_(&comm)
      , reducer_(std::move(reducer))
      , options_(options)
      , params_(const_cast<void*>(static_cast<const void*>(std::addressof(params))))
      , sync_(&sync<Params>) {
    if constexpr (overlapping_communicator<communicator_type>) {
      start_ = &start<Params>;
      ready_ = &ready<Params>;
      collect_ = &collect<Params>;
    } else if (options.double_buffering) {
      throw invalid_argument("cohort: distributed_optimizer: double_buffering needs a strategy "
                             "that reduces on cohort's thread (a host strategy: flat, ...)");
    }
    comm.broadcast_parameters(params, options.root);
  }

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  //! Waits for a reduction still in flight (errors are lost here: call `step()` or `finish()`).
  ~distributed_optimizer() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending()) {
        try {
          comm_->wait_grad_sync();
        } catch (...) {
          // A destructor may not throw.
        }
      }
    }
  }

  //! Reduces the gradients across ranks (or waits for the overlapped reduction), then steps the
  //! inner optimizer. With double buffering: starts reducing these gradients and steps with the
  //! previous step's. Collective.
  void step() {
    require_syncing("step");
    if (options_.double_buffering) {
      if (swap_and_start()) {
        inner_.step();
      }
      return;
    }
    synchronize();
    inner_.step();
  }

  //! Reduces the gradients across ranks without stepping: for gradient clipping or inspection
  //! between the reduction and the update. Collective.
  void synchronize() {
    require_syncing("synchronize");
    if (options_.double_buffering) {
      throw invalid_argument("cohort: synchronize() with double_buffering: the gradients are "
                             "reduced one step late; finish() applies the last reduction");
    }
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending()) {
        comm_->wait_grad_sync();
        return;
      }
    }
    sync_(params_, *comm_, reducer_, grad_sync_options{options_.missing});
  }

  //! Parameter `index`'s gradient is final (call it from backward): begins the step's overlapped
  //! reduction on the first call, and sends every bucket this completes. Ignored inside
  //! `no_sync()` and with double buffering (which reduces at `step()`).
  void grad_ready(std::size_t index) requires overlapping_communicator<communicator_type> {
    if (no_sync_depth_ != 0 || options_.double_buffering) {
      return;
    }
    if (!comm_->grad_sync_pending()) {
      start_(params_, *comm_, reducer_, grad_sync_options{options_.missing});
    }
    ready_(params_, *comm_, index);
  }

  //! With double buffering, waits for the last reduction and steps with it, so that no step's
  //! gradients are lost at the end of training. Otherwise does nothing. Collective.
  void finish() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (options_.double_buffering && comm_->grad_sync_pending()) {
        // The gradients are read again: they may have moved since the last step.
        collect_(params_, options_.missing, slots_, names_);
        require_same_layout("finish");
        comm_->wait_grad_sync();
        swap_copies();
        inner_.step();
      }
    }
  }

  //! While the returned guard lives, gradients are not reduced: the backward passes of several
  //! micro-batches accumulate into them (the caller does not zero them), and the first `step()`
  //! after the guard reduces their sum once. `step()` inside the guard throws.
  class no_sync_guard {
  public:
    explicit no_sync_guard(distributed_optimizer& owner) noexcept
        : owner_(&owner) {
      ++owner_->no_sync_depth_;
    }
    no_sync_guard(no_sync_guard&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (owner_ != nullptr) {
        --owner_->no_sync_depth_;
      }
    }

  private:
    distributed_optimizer* owner_;
  };

  [[nodiscard]] no_sync_guard no_sync() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending() && !options_.double_buffering) {
        throw invalid_argument("cohort: no_sync() while this step's gradients are already being "
                               "reduced (grad_ready was called): enter no_sync before backward");
      }
    }
    return no_sync_guard(*this);
  }

  //! Whether gradients are reduced now (false inside `no_sync()`).
  bool syncing() const noexcept { return no_sync_depth_ == 0; }

  Optimizer& inner() noexcept { return inner_; }
  const Optimizer& inner() const noexcept { return inner_; }
  communicator_type& comm() const noexcept { return *comm_; }
  const Reducer& reducer() const noexcept { return reducer_; }

private:
  template <class Params>
  static void sync(void* params, communicator_type& comm, const Reducer& reducer,
                   grad_sync_options options) {
    comm.allreduce_grad(*static_cast<Params*>(params), reducer, options);
  }
  template <class Params>
  static void start(void* params, communicator_type& comm, const Reducer& reducer,
                    grad_sync_options options) {
    comm.start_grad_sync(*static_cast<Params*>(params), reducer, options);
  }
  template <class Params>
  static void ready(void* params, communicator_type& comm, std::size_t index) {
    comm.grad_ready(*static_cast<Params*>(params), index);
  }
  template <class Params>
  static void collect(void* params, missing_grad missing, std::vector<detail::grad_slot>& slots,
                      std::vector<std::string>& names) {
    detail::collect_gradients(*static_cast<Params*>(params), missing, slots, names);
  }

  void require_syncing(std::string_view operation) const {
    if (no_sync_depth_ != 0) {
      throw invalid_argument("cohort: " + std::string(operation) +
                             "() inside no_sync(): the gradients are being accumulated; leave "
                             "the no_sync scope before the backward pass that ends the "
                             "accumulation, then step");
    }
  }

  // Double buffering: waits for the previous reduction, swaps the reduced copy with the fresh
  // gradients, and starts reducing the fresh ones. Returns whether a reduced gradient was swapped
  // in (not on the first step).
  bool swap_and_start() {
    if constexpr (overlapping_communicator<communicator_type>) {
      const bool had_previous = comm_->grad_sync_pending();
      // Checked before the previous reduction is waited for, so that a refused step loses
      // nothing: that reduction stays pending, for the next step or finish().
      collect_(params_, options_.missing, slots_, names_);
      detail::validate_gradients(comm_->mpi_comm(), "distributed_optimizer::step", slots_,
                                 comm_->options().check_agreement, options_.missing);
      if (had_previous) {
        require_same_layout("step");
        comm_->wait_grad_sync();
      } else {
        make_copies();
      }
      swap_copies();
      comm_->start_grad_sync(std::span<const detail::grad_slot>(copy_slots_), reducer_);
      comm_->mark_all_ready();
      return had_previous;
    } else {
      return false;
    }
  }

  void make_copies() {
    copies_.resize(slots_.size());
    copy_names_.resize(slots_.size());
    copy_slots_.resize(slots_.size());
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      copies_[i].assign(slots_[i].grad.size_bytes(), std::byte{0});
      copy_names_[i].assign(slots_[i].name);
      copy_slots_[i] = slots_[i];
      copy_slots_[i].grad.data = copies_[i].data();
    }
    // Only now that the names have stopped moving may the views point into them.
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      copy_slots_[i].name = copy_names_[i];
    }
  }

  // The reduced copy goes back to the parameter it came from, or nowhere.
  void require_same_layout(std::string_view operation) const {
    const bool same = std::ranges::equal(slots_, copy_slots_, [](const auto& a, const auto& b) {
      return a.name == b.name && a.grad.count == b.grad.count && a.grad.type == b.grad.type;
    });
    if (!same) {
      throw invalid_argument("cohort: distributed_optimizer::" + std::string(operation) +
                             " on rank " + std::to_string(comm_->rank()) +
                             ": with double_buffering the parameters must keep their names, "
                             "sizes and dtypes from step to step");
    }
  }

  void swap_copies() {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto* grad = static_cast<std::byte*>(slots_[i].grad.data);
      std::swap_ranges(grad, grad + slots_[i].grad.size_bytes(), copies_[i].begin());
    }
  }

  Optimizer inner_;
  communicator_type* comm_;
  Reducer reducer_;
  distributed_optimizer_options options_;
  void* params_;
  void (*sync_)(void*, communicator_type&, const Reducer&, grad_sync_options);
  void (*start_)(void*, communicator_type&, const Reducer&, grad_sync_options) = nullptr;
  void (*ready_)(void*, communicator_type&, std::size_t) = nullptr;
  void (*collect_)(void*, missing_grad, std::vector<detail::grad_slot>&,
                   std::vector<std::string>&) = nullptr;
  int no_sync_depth_ = 0;
  // Double buffering: the gradients' views this step, and the copies being reduced.
  std::vector<detail::grad_slot> slots_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::byte>> copies_;
  std::vector<std::string> copy_names_;
  std::vector<detail::grad_slot> copy_slots_;
};

template <class Optimizer, class Communicator, class Params>
distributed_optimizer(Optimizer, Communicator&, Params&)
    -> distributed_optimizer<Optimizer, Communicator, mean>;
template <class Optimizer, class Communicator, class Params>
distributed_optimizer(Optimizer, Communicator&, Params&, distributed_optimizer_options)
    -> distributed_optimizer<Optimizer, Communicator, mean>;
template <class Optimizer, class Communicator, class Params, class Reducer>
distributed_optimizer(Optimizer, Communicator&, Params&, distributed_optimizer_options, Reducer)
    -> distributed_optimizer<Optimizer, Communicator, Reducer>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
