// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the backward passes of cohort::torch::distributed_optimizer do to its overlapped
// reduction (distributed_optimizer.hpp): the autograd hooks' side (autograd_hooks.hpp calls
// it), the gradients held while cohort's thread reads them, and what the end of backward found
// wrong, thrown at the step.

#include <cohort/adapters/torch/detail/in_flight.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/window.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <ATen/ATen.h>
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/autograd/engine.h>
#include <torch/utils.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch::detail {

//! One optimizer's backward side, over `Sync` (its cohort::distributed_optimizer) and its
//! parameters, both held by reference. Thread-safe: the autograd engine's threads and the
//! trainer's call it at once.
template <class Sync>
class backward_sync {
  using communicator_type = std::remove_reference_t<decltype(std::declval<Sync&>().comm())>;
  static constexpr bool overlap_possible = overlapping_communicator<communicator_type>;

public:
  //! `sync` is only referred to here (it may be made after this).
  backward_sync(Sync& sync, std::vector<parameter>& params, bool find_unused_parameters)
      : sync_(sync)
      , params_(params)
      , find_unused_(find_unused_parameters)
      , in_flight_(params.size())
      , fired_(params.size(), 0) {}

  //! Whether `Sync`'s reducer averages (see cohort::distributed_optimizer::averages), once it
  //! is made.
  void set_averaging(bool averaging) noexcept { averaging_ = averaging; }

  //! The gradients an overlapped reduction reads and writes on cohort's thread are held (an
  //! at::Tensor keeps its storage alive) from the start of backward until the reduction is over
  //! (at the end of backward, or where that could not wait, at the step), so that a trainer that
  //! replaces or frees one meanwhile frees nothing cohort still uses: what `releasing()` returns
  //! lets them go as it goes, unless the reduction is still pending.
  struct release_on_exit {
    backward_sync& owner;
    ~release_on_exit() {
      if constexpr (overlap_possible) {
        if (!owner.sync_.comm().grad_sync_pending_for(&owner.sync_)) {
          owner.let_go();
        }
      }
    }
  };

  [[nodiscard]] release_on_exit releasing() noexcept { return {*this}; }

  //! Lets go of the gradients held (the optimizer is going, its reduction abandoned).
  void let_go() {
    const std::lock_guard lock(mutex_);
    in_flight_.let_go();
  }

  //! A tensor hook: parameter `index`'s gradient arrives, before AccumulateGrad adds it into
  //! the one there. Reduced gradients another optimizer's step kept for this one are this one's
  //! no longer (inside no_sync() too: the step after must reduce). Adding into a reduced gradient
  //! is right for a reducer that averages only (the next reduction reduces reduced + new).
  //! The first arrival of a new backward ends this optimizer's reduction still pending, its
  //! gradients kept reduced (a second backward before the step), so that its step's end is
  //! agreed before another begins.
  void on_arrival(std::size_t index) {
    if constexpr (overlap_possible) {
      sync_.comm().take_kept_grad_sync(&sync_);
      const std::lock_guard lock(mutex_);
      if (!averaging_ && in_flight_.holds_reduced(index, params_[index].value.grad())) {
        throw invalid_argument(
            "cohort::torch::distributed_optimizer on rank " + std::to_string(sync_.comm().rank()) +
            ": backward adds into the gradient of '" + params_[index].name +
            "', which holds its reduced value, and this reducer does not average: the next "
            "reduction would scale that value again. zero_grad() before this backward, or run "
            "every backward of a step but its last inside no_sync()");
      }
      if (in_backward_ || !sync_.syncing() || !sync_.comm().grad_sync_pending_for(&sync_)) {
        return;
      }
      // (under the lock: a hook on another thread waits until the step's end is agreed)
      sync_.keep_reduced();
    }
  }

  //! A hook: parameter `index` has its gradient for this backward (`sparse`: it came sparse,
  //! which cohort does not reduce). From the autograd engine's threads.
  void on_ready(std::size_t index, bool sparse) {
    if constexpr (overlap_possible) {
      if (!sync_.syncing()) {
        return; // no_sync(): the gradients accumulate
      }
      const std::lock_guard lock(mutex_);
      if (!in_backward_) {
        in_backward_ = true;
        std::fill(fired_.begin(), fired_.end(), 0);
        // The reduction begins now and reads every gradient's place: one that backward has not
        // produced yet is given zeros, into which AccumulateGrad then adds (as after
        // zero_grad(false)).
        give_undefined_gradients_zeros();
        // Nothing held is let go while a reduction of this optimizer is pending (a second
        // backward before its step: its tensors may still be on cohort's thread).
        if (!sync_.comm().grad_sync_pending_for(&sync_)) {
          in_flight_.begin(params_);
          sync_.backward_began(); // (a start that failed in the last backward is over)
        } else {
          for (const parameter& p : params_) {
            in_flight_.hold(p.value.grad());
          }
        }
        ::torch::autograd::Engine::get_default_engine().queue_callback(
            [this] { on_backward_end(); });
      }
      if (sparse) {
        // Added into the zeros given above it is dense now, but blocking would refuse it: refused
        // alike here, at the end of backward.
        fired_[index] = 2;
        return;
      }
      fired_[index] = 1;
      in_flight_.mark(index, params_[index].value.grad()); // what it reads from now on
      try {
        sync_.grad_ready(index);
      } catch (...) {
        in_backward_ = false; // the engine may not reach the final callback after an error
        throw;
      }
    }
  }

  //! What the end of backward found wrong (empty if nothing); the next backward starts afresh
  //! even if this one never reached its final callback (it failed elsewhere).
  std::string take_failure() {
    const std::lock_guard lock(mutex_);
    in_backward_ = false;
    return std::exchange(failure_, std::string());
  }

  //! A pending reduction whose parameters changed while it ran: an optimizer stepped with the
  //! gradients cohort's thread was still writing (a reference to inner() kept from before
  //! backward, stepped before step()). The replicas may part: abandoned, an error on every rank.
  void require_parameters_untouched() {
    if constexpr (overlap_possible) {
      if (!sync_.comm().grad_sync_pending_for(&sync_)) {
        return;
      }
      std::optional<std::size_t> changed;
      std::optional<std::size_t> modified;
      {
        const std::lock_guard lock(mutex_);
        changed = in_flight_.changed(params_);
        modified = in_flight_.modified(params_);
      }
      if (changed || modified) {
        const std::string why =
            changed ? "parameter '" + params_[*changed].name +
                          "' changed while its step's gradients were being reduced: something "
                          "updated it between backward and step() with gradients cohort's "
                          "thread was still writing (another optimizer over the same "
                          "parameters?)"
                    : "the gradient of '" + params_[*modified].name +
                          "' was changed in place while cohort's thread was reducing it (a "
                          "zero_grad between backward and step() through a "
                          "torch::optim::Optimizer& or the module, which cohort does not see: "
                          "call the distributed_optimizer's own zero_grad(), or step() first)";
        sync_.comm().abandon_grad_sync_for(&sync_, why);
        throw invalid_argument("cohort::torch::distributed_optimizer on rank " +
                               std::to_string(sync_.comm().rank()) + ": " + why);
      }
    }
  }

  //! Gives every parameter without a gradient zeros (in the communicator's window, if it has one).
  void give_undefined_gradients_zeros() {
    const ::torch::NoGradGuard no_grad;
    for (parameter& p : params_) {
      if (!p.value.mutable_grad().defined()) {
        p.value.mutable_grad() = zero_gradient(sync_.comm(), p.value);
      }
    }
  }

private:
  // The autograd engine's final callback: backward is over. The parameters it did not reach
  // hold zeros: reduced as such with find_unused_parameters, else an error on every rank at its
  // step (not here: an exception from backward would leave the peers' step to find out alone).
  // Then, as DDP at the end of every backward, it waits until every bucket is reduced: when
  // backward returns, the gradients hold their reduced values and cohort's thread is done with
  // them, so the trainer may read or change them before step() as with one process (clip them,
  // zero them through a torch::optim::Optimizer&). The step's end is still agreed at step().
  void on_backward_end() {
    if constexpr (overlap_possible) {
      if (settle_backward()) {
        sync_.wait_reduced();
        if (sync_.reduced()) {
          const std::lock_guard lock(mutex_);
          in_flight_.reduced(params_);
        }
      }
    }
  }

  // What backward did not reach, settled (see on_backward_end); returns whether its reduction
  // goes on (not abandoned).
  bool settle_backward() {
    if constexpr (overlap_possible) {
      const std::lock_guard lock(mutex_);
      if (!in_backward_) {
        return false; // a backward whose hook threw: its step is over already
      }
      in_backward_ = false;
      std::string unused;
      std::string sparse;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        std::string& list = fired_[i] == 0 ? unused : sparse;
        if (fired_[i] != 1) {
          list += (list.empty() ? "" : ", ") + params_[i].name;
        }
      }
      if (unused.empty() && sparse.empty()) {
        return true;
      }
      if (sparse.empty() && find_unused_) {
        for (std::size_t i = 0; i < params_.size(); ++i) {
          if (fired_[i] == 0) {
            sync_.grad_ready(i);
          }
        }
        return true;
      }
      // The other ranks get an error naming this rank at their step; this one, at its own.
      const std::string why =
          !sparse.empty()
              ? "backward gave a sparse gradient to " + sparse +
                    ": cohort reduces dense gradients only (build the module with dense "
                    "gradients: Embedding's sparse(false))"
              : "backward gave no gradient to " + unused +
                    " (pass find_unused_parameters = true to reduce zeros for them)";
      sync_.comm().abandon_grad_sync_for(&sync_, why);
      failure_ = "cohort::torch::distributed_optimizer on rank " +
                 std::to_string(sync_.comm().rank()) + ": " + why;
    }
    return false;
  }

  Sync& sync_;
  std::vector<parameter>& params_;
  bool find_unused_;
  std::mutex mutex_;
  // The step in flight's gradients, held until it ends. Under mutex_.
  in_flight in_flight_;
  std::vector<char> fired_;
  bool averaging_ = true;
  bool in_backward_ = false;
  std::string failure_; // found at the end of backward, thrown at the step
};

} // namespace torch::detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
