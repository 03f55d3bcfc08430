// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/parameter.hpp>

#include <memory>
#include <type_traits>
#include <utility>

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
};

//! Wraps an optimizer so that training is data-parallel: on construction every rank's
//! parameters are overwritten with `root`'s (so the replicas start identical, and no step is
//! lost to it as in ChainerMN, whose first update() only broadcast); each `step()` reduces the
//! gradients across ranks with `Reducer` (the mean, by default) and then steps the inner
//! optimizer, so that the replicas stay identical.
//!
//! The parameter set and the communicator are held by reference: both must outlive the wrapper,
//! and neither may be moved while it is in use. A strategy chosen at
//! compile time costs nothing per step beyond its own work: the parameter set's type is erased
//! behind one function pointer, called once per step.
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
    comm.broadcast_parameters(params, options.root);
  }

  //! Reduces the gradients across ranks, then steps the inner optimizer. Collective.
  void step() {
    synchronize();
    inner_.step();
  }

  //! Reduces the gradients across ranks without stepping: for gradient clipping or inspection
  //! between the reduction and the update. Collective.
  void synchronize() { sync_(params_, *comm_, reducer_, grad_sync_options{options_.missing}); }

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

  Optimizer inner_;
  communicator_type* comm_;
  Reducer reducer_;
  distributed_optimizer_options options_;
  void* params_;
  void (*sync_)(void*, communicator_type&, const Reducer&, grad_sync_options);
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
