// SPDX-License-Identifier: Apache-2.0
#pragma once

// DDP for C++: `cohort::torch::distributed_optimizer<SGD, ...>` is an SGD (it derives from the
// optimizer it wraps, so a `torch::optim::Optimizer&` takes it, `torch::save` / `torch::load`
// and LibTorch's LR schedulers work on it) whose steps average the gradients over the ranks
// first. At construction rank 0's parameters, buffers and optimizer state are copied to every
// rank. With overlap (the default on host strategies) a post hook on every parameter's
// AccumulateGrad node marks its gradient ready as backward produces it, so that buckets are
// reduced while backward still runs, and the end of backward (the autograd engine's final
// callback) settles the parameters backward did not reach: the trainer's loop changes in nothing
// but the optimizer's type.
//
// The hooks (detail/autograd_hooks.hpp, detail/backward_sync.hpp) use LibTorch's autograd API
// that 1.13 and 2.x share (`impl::grad_accumulator`, `Node::add_post_hook`,
// `Tensor::register_hook`, `Engine::queue_callback`), not c10d.

#include <cohort/adapters/torch/detail/autograd_hooks.hpp>
#include <cohort/adapters/torch/detail/backward_sync.hpp>
#include <cohort/adapters/torch/detail/shard.hpp>
#include <cohort/adapters/torch/detail/step_settings.hpp>
#include <cohort/adapters/torch/detail/stepper.hpp>
#include <cohort/adapters/torch/distributed_options.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/adapters/torch/stream_order.hpp>
#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/adapters/torch/window.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/training/distributed_optimizer.hpp>

#include <mpi.h>

#include <concepts>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
//! A LibTorch optimizer made data-parallel over `Communicator` (a strategy: cohort::flat...).
//! It is an `Optimizer` (it derives from it, and its param groups and state are the optimizer's
//! own): wherever a `torch::optim::Optimizer&` goes, it goes, and `step()` through that reference
//! is the data-parallel one. Holds the module's parameter set and the hooks; the module and the
//! communicator are held by reference and must outlive it. Not movable: the hooks point at it.
//!
//! As DDP's, backward returns once its gradients are reduced: between backward and `step()` they
//! are the trainer's (to clip, or zero through a `torch::optim::Optimizer&`). A second backward
//! in one step (gradient accumulation, a GAN's discriminator on real then fake) needs no guard:
//! as it reaches its first gradient, the reduction of the first ends (kept) and the new one
//! reduces reduced + new, the sum's mean; `no_sync()` saves that reduction. Several optimizers may
//! share a communicator, each with a reduction pending (a discriminator's hooks fire during the
//! generator's backward): see cohort::distributed_optimizer. The hooks may run on several threads
//! at once (a graph that spans devices); two trainers on two threads each have their own
//! communicator.
//!
//! The ranks agree on the optimizer at every step: the param groups' learning rates (an edit, a
//! scheduler's step) and sizes are compared (one 16-byte all-reduce), and ranks that differ
//! throw `mismatch_error` on every rank, naming the option. `torch::load` into it is collective:
//! every rank loads, then every rank holds `root`'s state (as at construction).
template <class Optimizer, class Communicator, reducer Reducer = mean>
requires std::derived_from<Optimizer, ::torch::optim::Optimizer>
class distributed_optimizer : public Optimizer, public detail::distributed_wrapper {
public:
  using LossClosure = ::torch::optim::Optimizer::LossClosure;

  //! Collective: copies `root`'s parameters, buffers and optimizer state (matched by name) to
  //! every rank, after the ranks agree on their names, sizes and dtypes. `optimizer` must be built
  //! over `module`'s parameters.
  distributed_optimizer(Optimizer optimizer, Communicator& comm, const ::torch::nn::Module& module,
                        distributed_options options = {}, Reducer reducer = {})
      : distributed_optimizer(std::move(optimizer), comm, module, options, std::move(reducer),
                              std::nullopt) {}

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

protected:
  //! With `sharding`, the optimizer's state (and at stage 2 the reduced gradients) are sharded:
  //! see cohort::torch::sharded_optimizer.
  distributed_optimizer(Optimizer optimizer, Communicator& comm, const ::torch::nn::Module& module,
                        distributed_options options, Reducer reducer,
                        std::optional<zero_stage> sharding)
      : Optimizer(std::move(optimizer))
      , detail::distributed_wrapper(typeid(Optimizer))
      , options_(require_possible(options))
      , params_(followed(comm, torch::parameters(module)))
      , buffers_(torch::buffers(module))
      , named_(torch::all_parameters(module))
      , settings_(*this)
      , shard_(sharding ? std::make_unique<detail::shard<Communicator>>(comm, params_, *sharding)
                        : nullptr)
      , sync_(detail::stepper<Optimizer, Communicator>{this, shard_.get()}, comm, params_,
              cohort::distributed_optimizer_options{.root = options.root}, std::move(reducer)) {
    backward_.set_averaging(sync_.averages());
    // The trainable parameters were broadcast above; the frozen ones and the buffers now.
    if (std::vector<parameter> rest = torch::untrained_state(module); !rest.empty()) {
      comm.broadcast_parameters(rest, options_.root);
    }
    broadcast_optimizer_state(comm, *this, named_, options_.root);
    if (shard_) {
      cohort::detail::optimizer_sharding::scatter_to(sync_, shard_->scatter_owners());
      shard_->drop_others_state(*this);
    }
    detail::place_gradients_in_window(comm, params_); // (kept there by zero_grad)
    if (overlapping()) {
      hooks_.add(
          params_, [this](std::size_t i) { backward_.on_arrival(i); },
          [this](std::size_t i, bool sparse) { backward_.on_ready(i, sparse); });
    }
  }

public:
  //! Removes the hooks (no backward may run meanwhile); a reduction still in flight is
  //! abandoned (see cohort::distributed_optimizer's destructor) before the gradients it uses are
  //! let go.
  ~distributed_optimizer() override {
    hooks_.remove();
    if constexpr (overlap_possible) {
      if (comm().grad_sync_pending_for(&sync_)) {
        comm().abandon_grad_sync_for(
            &sync_, std::uncaught_exceptions() > 0
                        ? "its distributed_optimizer was destroyed during the unwinding of an "
                          "exception, in the middle of a step"
                        : "its distributed_optimizer was destroyed in the middle of a step");
      }
      backward_.let_go();
    }
  }

  //! Averages the gradients over the ranks (or waits for the overlapped reduction), then steps
  //! the optimizer. Collective.
  //!
  //! With a `closure`, for optimizers that evaluate the loss several times (LBFGS): each
  //! evaluation (forward and backward) is followed by the reduction of the gradients it made,
  //! and the loss the optimizer sees is the mean over the ranks, so that every replica takes the
  //! same decisions. Collective, once per evaluation.
  at::Tensor step(LossClosure closure = nullptr) override {
    if (!closure) {
      // First: a rank that throws below (what its backward found) must not leave its peers in
      // this all-reduce; they hear of it through the reduction's own agreement.
      settings_.agree(comm(), *this);
      const auto release = backward_.releasing();
      before_reduction();
      sync_.step();
      return {};
    }
    settings_.agree(comm(), *this);
    return Optimizer::step([&]() -> at::Tensor {
      const at::Tensor loss = closure();
      const auto release = backward_.releasing();
      before_reduction();
      sync_.synchronize();
      sync_.skip_step(); // the update is the optimizer's, inside this call
      return mean_over_ranks(loss);
    });
  }

  //! Clears the gradients: undefined with `set_to_none` (LibTorch 2's default, and this one's),
  //! else zeros in place. Over a communicator whose gradients live in a shared window
  //! (`shared_memory`), always zeros in place, so that they stay there. A step whose gradients
  //! are still being reduced (backward ran, and no `step()` came) ends first, its reduced
  //! gradients dropped, as `skip_step()` does (collective then: the ranks agree that they drop
  //! them). Throws what the step that ends found wrong, on every rank.
  void zero_grad(bool set_to_none = true) {
    if constexpr (detail::shares_a_window<Communicator>) {
      set_to_none = false;
    }
    // A new step: even a backward that failed before its final callback is over.
    std::string failure = backward_.take_failure();
    std::exception_ptr ending; // what ending the step threw: rethrown once the gradients are clear
    try {
      const auto release = backward_.releasing();
      backward_.require_parameters_untouched();
      sync_.skip_step();
    } catch (...) {
      ending = std::current_exception();
    }
    for (parameter& p : params_) {
      at::Tensor& grad = p.value.mutable_grad();
      if (!grad.defined()) {
        continue;
      }
      if (set_to_none) {
        grad.reset();
      } else {
        grad.detach_();
        grad.zero_();
      }
    }
    if (ending) {
      std::rethrow_exception(ending);
    }
    if (!failure.empty()) {
      throw invalid_argument(failure);
    }
  }

  //! While the guard lives, backward accumulates locally and nothing is reduced (gradient
  //! accumulation); the next `step()` reduces the sum once. (Without it, each backward is
  //! reduced, and the result is the same for the mean.)
  [[nodiscard]] auto no_sync() { return sync_.no_sync(); }

  //! Collective: every rank loads (the same file, `torch::load(opt, path)`), the ranks agree on
  //! the optimizer's type and options, and every rank then holds `root`'s state, as at
  //! construction.
  void load(::torch::serialize::InputArchive& archive) override {
    Optimizer::load(archive);
    if (!loading_root_state) { // (else: the root's state arriving, inside the copy below)
      broadcast_optimizer_state(comm(), *this, named_, options_.root);
    }
  }

protected:
  // The shard of a sharded_optimizer (null otherwise).
  const detail::shard<Communicator>* sharding() const noexcept { return shard_.get(); }

public:
  //! Reduces without stepping (to clip the averaged gradients); the next `step()` does not
  //! reduce again. Collective.
  void synchronize() {
    const auto release = backward_.releasing();
    before_reduction();
    sync_.synchronize();
  }

  //! Ends the step without an update (after `synchronize()`, when the gradients are not finite,
  //! say). Collective.
  void skip_step() {
    const std::string failure = backward_.take_failure();
    const auto release = backward_.releasing();
    backward_.require_parameters_untouched();
    sync_.skip_step();
    if (!failure.empty()) {
      throw invalid_argument(failure);
    }
  }

  //! Copies `root`'s buffers (BatchNorm's running statistics, and its integer
  //! `num_batches_tracked`) to every rank again. Collective.
  void broadcast_buffers() {
    if (!buffers_.empty()) {
      stream_order<Communicator>::follow(comm(), params_);
      sync_.comm().broadcast_parameters(buffers_, options_.root);
    }
  }

  //! This optimizer, as its own type (from before it was one). A reduction still in flight
  //! (backward ran, and no `step()` came) is waited for first, as `synchronize()` does
  //! (collective then), so that nothing reads a gradient cohort's thread is still writing.
  Optimizer& inner() {
    if constexpr (overlap_possible) {
      if (comm().grad_sync_pending_for(&sync_)) {
        synchronize();
      }
    }
    return *this;
  }
  //! The module's trainable parameters, by name, as cohort reduces them.
  const std::vector<parameter>& named_parameters() const noexcept { return params_; }
  Communicator& comm() const noexcept { return sync_.comm(); }

private:
  using sync_type = cohort::distributed_optimizer<detail::stepper<Optimizer, Communicator>,
                                                  Communicator&, Reducer>;

  static constexpr bool overlap_possible = overlapping_communicator<Communicator>;

  static distributed_options require_possible(distributed_options options) {
    if (options.overlap && overlap_possible) {
      int provided = MPI_THREAD_SINGLE;
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_MULTIPLE) {
        throw invalid_argument(
            "cohort::torch::distributed_optimizer: overlap needs MPI started with "
            "MPI_THREAD_MULTIPLE (boost::mpi::environment env(argc, argv, "
            "boost::mpi::threading::multiple)); or pass {.overlap = false}");
      }
    }
    return options;
  }

  bool overlapping() const noexcept { return overlap_possible && options_.overlap; }

  // `params`, once cohort's work follows LibTorch's stream of their device (before sync_'s
  // broadcast of them).
  static std::vector<parameter> followed(Communicator& comm, std::vector<parameter> params) {
    stream_order<Communicator>::follow(comm, params);
    return params;
  }

  // Throws what the end of backward found, or gives unused parameters their zeros.
  void before_reduction() {
    if (std::string failure = backward_.take_failure(); !failure.empty()) {
      throw invalid_argument(failure);
    }
    backward_.require_parameters_untouched();
    stream_order<Communicator>::follow(comm(), params_);
    if (options_.find_unused_parameters) {
      backward_.give_undefined_gradients_zeros();
    } // else an undefined gradient is reported by name on every rank
  }

  // One number, where the strategy reduces: host memory, or the parameters' device.
  at::Tensor mean_over_ranks(const at::Tensor& loss) {
    const c10::Device where = detail::reduces_device_memory<Communicator>() && !params_.empty()
                                  ? params_.front().value.device()
                                  : c10::Device(at::kCPU);
    at::Tensor total = loss.detach().to(where, at::kDouble).reshape({1}).clone();
    comm().allreduce(total, reduce_op::sum);
    return (total / comm().size()).to(loss.device(), loss.scalar_type()).reshape(loss.sizes());
  }

  distributed_options options_;
  std::vector<parameter> params_; // before sync_, which holds it by reference
  std::vector<parameter> buffers_;
  std::vector<parameter> named_; // every parameter, frozen ones too: the optimizer state's names
  detail::step_settings settings_;
  // The step in flight's gradients, held until it ends; before sync_, whose destructor waits for
  // cohort's thread.
  detail::backward_sync<sync_type> backward_{sync_, params_, options_.find_unused_parameters};
  std::unique_ptr<detail::shard<Communicator>> shard_; // before sync_, whose step uses it
  sync_type sync_;
  detail::autograd_hooks hooks_; // last: removed first
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
