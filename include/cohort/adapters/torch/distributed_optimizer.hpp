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
// The hooks use LibTorch's autograd API that 1.13 and 2.x share (`impl::grad_accumulator`,
// `Node::add_post_hook`, `Tensor::register_hook`, `Engine::queue_callback`), not c10d.

#include <cohort/adapters/torch/detail/in_flight.hpp>
#include <cohort/adapters/torch/detail/shard.hpp>
#include <cohort/adapters/torch/detail/step_settings.hpp>
#include <cohort/adapters/torch/detail/stepper.hpp>
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

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
//! Options of `cohort::torch::distributed_optimizer`.
struct distributed_options {
  //! Reduce buckets while backward runs (hooks on the AccumulateGrad nodes). Host strategies
  //! only (a device strategy reduces at `step()`); needs MPI started with MPI_THREAD_MULTIPLE.
  bool overlap = true;
  //! DDP's `find_unused_parameters`: a parameter backward gave no gradient counts as a zero
  //! gradient on this rank (the same zeros on every rank that did not use it). Off: it is an
  //! error naming the parameters, on every rank.
  bool find_unused_parameters = false;
  //! The rank whose parameters, buffers and optimizer state every replica starts from.
  int root = 0;
};

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
              cohort::distributed_optimizer_options{.root = options.root}, std::move(reducer))
      , fired_(params_.size(), 0)
      , averaging_(sync_.averages()) {
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
      try {
        hooks_.reserve(params_.size());
        for (std::size_t i = 0; i < params_.size(); ++i) {
          at::Tensor& value = params_[i].value;
          auto node = ::torch::autograd::impl::grad_accumulator(value);
          const std::uintptr_t key = node->add_post_hook(std::make_unique<ready_hook>(this, i));
          // Held: a leaf keeps only a weak reference to its AccumulateGrad node, and a new node
          // would have no hook.
          hooks_.push_back({std::move(node), key, 0});
          // Before AccumulateGrad adds into the gradient (see on_arrival).
          hooks_.back().arrival =
              value.register_hook([this, i](const at::Tensor&) { on_arrival(i); });
        }
      } catch (...) {
        remove_hooks();
        throw;
      }
    }
  }

public:
  //! Removes the hooks (no backward may run meanwhile); a reduction still in flight is
  //! abandoned (see cohort::distributed_optimizer's destructor) before the gradients it uses are
  //! let go.
  ~distributed_optimizer() override {
    remove_hooks();
    if constexpr (overlap_possible) {
      if (comm().grad_sync_pending_for(&sync_)) {
        comm().abandon_grad_sync_for(
            &sync_, std::uncaught_exceptions() > 0
                        ? "its distributed_optimizer was destroyed during the unwinding of an "
                          "exception, in the middle of a step"
                        : "its distributed_optimizer was destroyed in the middle of a step");
      }
      const std::lock_guard lock(mutex_);
      in_flight_.let_go();
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
      const release_on_exit release{*this};
      before_reduction();
      sync_.step();
      return {};
    }
    settings_.agree(comm(), *this);
    return Optimizer::step([&]() -> at::Tensor {
      const at::Tensor loss = closure();
      const release_on_exit release{*this};
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
    std::string failure = take_failure();
    std::exception_ptr ending; // what ending the step threw: rethrown once the gradients are clear
    try {
      const release_on_exit release{*this};
      require_parameters_untouched();
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
    const release_on_exit release{*this};
    before_reduction();
    sync_.synchronize();
  }

  //! Ends the step without an update (after `synchronize()`, when the gradients are not finite,
  //! say). Collective.
  void skip_step() {
    const std::string failure = take_failure();
    const release_on_exit release{*this};
    require_parameters_untouched();
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

  // The gradients an overlapped reduction reads and writes on cohort's thread are held (an
  // at::Tensor keeps its storage alive) from the start of backward until the reduction is over
  // (at the end of backward, or where that could not wait, at the step), so that a trainer that
  // replaces or frees one meanwhile frees nothing cohort still uses.
  struct release_on_exit {
    distributed_optimizer& owner;
    ~release_on_exit() {
      if constexpr (overlap_possible) {
        if (!owner.comm().grad_sync_pending_for(&owner.sync_)) {
          const std::lock_guard lock(owner.mutex_);
          owner.in_flight_.let_go();
        }
      }
    }
  };

  struct ready_hook final : ::torch::autograd::FunctionPostHook {
    ready_hook(distributed_optimizer* owner, std::size_t index)
        : owner(owner)
        , index(index) {}
    // For AccumulateGrad, `inputs` is the gradient that arrived (and was just accumulated).
    ::torch::autograd::variable_list
    operator()(const ::torch::autograd::variable_list& outputs,
               const ::torch::autograd::variable_list& inputs) override {
      owner->on_ready(index, !inputs.empty() && inputs.front().defined() &&
                                 inputs.front().layout() != c10::kStrided);
      return outputs;
    }
    distributed_optimizer* owner;
    std::size_t index;
  };

  // A std::shared_ptr in LibTorch 1.13, a c10::intrusive_ptr in later ones.
  using node_pointer =
      decltype(::torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

  struct hook {
    node_pointer node;
    std::uintptr_t key;
    unsigned arrival; // the parameter's tensor hook
  };

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

  void remove_hooks() noexcept {
    for (std::size_t i = 0; i < hooks_.size(); ++i) {
      hooks_[i].node->del_post_hook(hooks_[i].key);
      try {
        params_[i].value.remove_hook(hooks_[i].arrival);
      } catch (...) {
        // (its tensor hook was not registered: the constructor failed in between)
      }
    }
    hooks_.clear();
  }

  // A tensor hook: parameter `index`'s gradient arrives, before AccumulateGrad adds it into
  // the one there. Reduced gradients another optimizer's step kept for this one are this one's
  // no longer (inside no_sync() too: the step after must reduce). Adding into a reduced gradient
  // is right for a reducer that averages only (the next reduction reduces reduced + new).
  // The first arrival of a new backward ends this optimizer's reduction still pending, its
  // gradients kept reduced (a second backward before the step), so that its step's end is
  // agreed before another begins.
  void on_arrival(std::size_t index) {
    if constexpr (overlap_possible) {
      comm().take_kept_grad_sync(&sync_);
      const std::lock_guard lock(mutex_);
      if (!averaging_ && in_flight_.holds_reduced(index, params_[index].value.grad())) {
        throw invalid_argument(
            "cohort::torch::distributed_optimizer on rank " + std::to_string(comm().rank()) +
            ": backward adds into the gradient of '" + params_[index].name +
            "', which holds its reduced value, and this reducer does not average: the next "
            "reduction would scale that value again. zero_grad() before this backward, or run "
            "every backward of a step but its last inside no_sync()");
      }
      if (in_backward_ || !sync_.syncing() || !comm().grad_sync_pending_for(&sync_)) {
        return;
      }
      // (under the lock: a hook on another thread waits until the step's end is agreed)
      sync_.keep_reduced();
    }
  }

  // A hook: parameter `index` has its gradient for this backward (`sparse`: it came sparse,
  // which cohort does not reduce). From the autograd engine's threads.
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
        if (!comm().grad_sync_pending_for(&sync_)) {
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
      if (sparse.empty() && options_.find_unused_parameters) {
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
      comm().abandon_grad_sync_for(&sync_, why);
      failure_ = "cohort::torch::distributed_optimizer on rank " + std::to_string(comm().rank()) +
                 ": " + why;
    }
    return false;
  }

  // What the end of backward found wrong (empty if nothing); the next backward starts afresh
  // even if this one never reached its final callback (it failed elsewhere).
  std::string take_failure() {
    const std::lock_guard lock(mutex_);
    in_backward_ = false;
    return std::exchange(failure_, std::string());
  }

  // A pending reduction whose parameters changed while it ran: an optimizer stepped with the
  // gradients cohort's thread was still writing (a reference to inner() kept from before
  // backward, stepped before step()). The replicas may part: abandoned, an error on every rank.
  void require_parameters_untouched() {
    if constexpr (overlap_possible) {
      if (!comm().grad_sync_pending_for(&sync_)) {
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
        comm().abandon_grad_sync_for(&sync_, why);
        throw invalid_argument("cohort::torch::distributed_optimizer on rank " +
                               std::to_string(comm().rank()) + ": " + why);
      }
    }
  }

  // Throws what the end of backward found, or gives unused parameters their zeros.
  void before_reduction() {
    if (std::string failure = take_failure(); !failure.empty()) {
      throw invalid_argument(failure);
    }
    require_parameters_untouched();
    stream_order<Communicator>::follow(comm(), params_);
    if (options_.find_unused_parameters) {
      give_undefined_gradients_zeros();
    } // else an undefined gradient is reported by name on every rank
  }

  void give_undefined_gradients_zeros() {
    const ::torch::NoGradGuard no_grad;
    for (parameter& p : params_) {
      if (!p.value.mutable_grad().defined()) {
        p.value.mutable_grad() = detail::zero_gradient(comm(), p.value);
      }
    }
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
  // cohort's thread. Under mutex_.
  detail::in_flight in_flight_{params_.size()};
  std::unique_ptr<detail::shard<Communicator>> shard_; // before sync_, whose step uses it
  sync_type sync_;
  std::mutex mutex_;
  std::vector<char> fired_;
  bool averaging_ = true; // the reducer's (see cohort::distributed_optimizer::averages)
  bool in_backward_ = false;
  std::string failure_; // found at the end of backward, thrown at the step
  std::vector<hook> hooks_;
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
