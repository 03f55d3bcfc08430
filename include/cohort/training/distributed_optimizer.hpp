// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/parameter.hpp>

#include <memory>
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
//! The parameter set is held by reference: it must outlive the wrapper. A strategy chosen at
//! compile time costs nothing per step beyond its own work: the parameter set's type is erased
//! behind one function pointer, called once per step.
template <optimizer Optimizer, communicator Communicator, reducer Reducer = mean>
class distributed_optimizer {
public:
  //! Broadcasts `params` from `options.root` (collective). Throws `mismatch_error` if the ranks'
  //! parameter layouts differ.
  template <parameter_set Params>
  distributed_optimizer(Optimizer inner, Communicator& comm, Params& params,
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
  Communicator& comm() const noexcept { return *comm_; }
  const Reducer& reducer() const noexcept { return reducer_; }

private:
  template <class Params>
  static void sync(void* params, Communicator& comm, const Reducer& reducer,
                   grad_sync_options options) {
    comm.allreduce_grad(*static_cast<Params*>(params), reducer, options);
  }

  Optimizer inner_;
  Communicator* comm_;
  Reducer reducer_;
  distributed_optimizer_options options_;
  void* params_;
  void (*sync_)(void*, Communicator&, const Reducer&, grad_sync_options);
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
