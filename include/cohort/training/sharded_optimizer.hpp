// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/training/detail/parameter_gather.hpp>
#include <cohort/training/distributed_optimizer.hpp>
#include <cohort/training/shard_plan.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! What a `sharded_optimizer` shards (ZeRO's stages).
enum class zero_stage : int {
  //! Stage 1: the optimizer's state. Every rank still reduces (all-reduces) the whole gradient.
  optimizer_state = 1,
  //! Stage 2: the state and the reduced gradients: the gradients are reduce-scattered, and each
  //! rank receives only the reduced gradients of the parameters it owns.
  gradients = 2
};

//! Options of `sharded_optimizer`.
struct sharded_optimizer_options {
  zero_stage stage = zero_stage::gradients;
  //! A parameter without a gradient in a step: an error naming it (default), or a zero gradient.
  missing_grad missing = missing_grad::report;
  //! The rank whose initial parameter values every replica starts from.
  int root = 0;
};

namespace detail {
// sharded_optimizer's way into distributed_optimizer: reduce-scatter instead of all-reduce.
struct optimizer_sharding {
  template <class Wrapped>
  static void scatter_to(Wrapped& wrapped, std::span<const int> owners) noexcept {
    wrapped.owners_ = owners;
  }
};

// Every rank learns whether every rank's `failure`-free: each rank steps (or builds the
// optimizer of) a shard of its own, so one may fail alone, and the others must not wait for it
// in the all-gather. One 4-byte all-reduce. Rethrows this rank's failure; throws `error` naming
// the first rank that failed on the others. Collective.
template <class Communicator>
void require_every_rank_succeeded(Communicator& comm, const std::exception_ptr& failure,
                                  const std::string& operation) {
  std::vector<std::int32_t> first_failed = {failure ? comm.rank() : comm.size()};
  comm.allreduce(first_failed, reduce_op::min);
  if (failure) {
    std::rethrow_exception(failure);
  }
  if (first_failed.front() < comm.size()) {
    throw error("cohort: " + operation + " on rank " + std::to_string(comm.rank()) +
                ": it failed on rank " + std::to_string(first_failed.front()) +
                " (whose own error says why); nothing was gathered");
  }
}

// The plan every rank holds for `source`'s parameters (read into `values` and `names`), by their
// bytes. Collective (see plan_shards).
template <class Communicator>
shard_plan plan_parameter_shards(Communicator& comm, const parameter_source& source,
                                 std::vector<tensor_view>& values, std::vector<std::string>& names,
                                 const char* operation) {
  source.values(values, names);
  std::vector<std::size_t> bytes;
  bytes.reserve(values.size());
  for (const tensor_view& value : values) {
    bytes.push_back(value.size_bytes());
  }
  return plan_shards(comm, names, bytes, operation);
}
} // namespace detail

//! ZeRO stages 1 and 2: data-parallel training whose optimizer state (and, at stage 2, reduced
//! gradients) shrink with the number of ranks. Each rank owns a balanced shard of the parameters
//! (whole parameters, by bytes: `shard_plan`, the same on every rank) and runs an optimizer over
//! those alone, so that its state (Adam's two moments: twice the model) is about 1/N of the
//! unsharded one. A step reduces the gradients (stage 1: all-reduced; stage 2: reduce-scattered,
//! each rank receiving its own parameters' reduced gradients only), steps the rank's optimizer
//! over its shard, and all-gathers the updated parameters, so that every replica holds the same
//! values after every step. At stage 2 that is what an all-reduce sends (a reduce-scatter, then
//! an all-gather); at stage 1, half as much again.
//!
//! `make_optimizer(owned)` builds the rank's optimizer over `owned`, a `std::vector` of the
//! parameters this rank owns (copies of the set's elements: handles such as `parameter_ref`),
//! in the set's order. The optimizer's type and options must be the same on every rank.
//!
//! Everything else is `distributed_optimizer`'s: the broadcast from `root` at construction,
//! `grad_ready(i)` to reduce while backward runs (buckets reduce-scattered as they fill),
//! `no_sync()`, `synchronize()` (at stage 2 only this rank's own gradients are reduced then: a
//! gradient it does not own keeps this rank's local value, which no update reads), `skip_step()`.
//! At stage 2 a backward onto reduced gradients (a second backward before the step, without
//! `no_sync()`) is an error on every rank: only the owner's copy of a gradient is reduced.
//!
//! Host strategies only (flat, hierarchical, ...): the NCCL strategies gather and reduce-scatter
//! blocks of any size in device memory, but this optimizer's buckets are packed on the host. Not
//! with a gradient hook (powersgd): a compressed gradient is all-reduced whole.
template <optimizer Optimizer, class Communicator, reducer Reducer = mean>
requires communicator<std::remove_cvref_t<Communicator>>
class sharded_optimizer {
  static_assert(
      !requires { requires std::remove_cvref_t<Communicator>::reduces_gpu_memory; },
      "cohort: sharded_optimizer packs its buckets in host memory, over host strategies "
      "(flat, hierarchical, ...); not over a GPU strategy");
  static_assert(!gradient_hook<Reducer>,
                "cohort: sharded_optimizer reduces plain gradients (mean, sum, compressed); a "
                "gradient hook (powersgd) all-reduces what it computes, and is not sharded");

  // The wrapped optimizer's step: the rank's own shard, then every rank's updated parameters.
  class shard_step {
  public:
    shard_step(Optimizer inner, sharded_optimizer& owner)
        : inner_(std::move(inner))
        , owner_(&owner) {}
    void step() {
      owner_->require_planned_layout();
      std::exception_ptr failure;
      try {
        inner_.step();
      } catch (...) {
        failure = std::current_exception();
      }
      detail::require_every_rank_succeeded(*owner_->comm_, failure, "sharded_optimizer::step");
      owner_->gather_parameters();
    }
    Optimizer& inner() noexcept { return inner_; }
    const Optimizer& inner() const noexcept { return inner_; }

  private:
    Optimizer inner_;
    sharded_optimizer* owner_;
  };

  using lane_type = distributed_optimizer<shard_step, Communicator, Reducer>;

public:
  using communicator_type = std::remove_cvref_t<Communicator>;

  //! Agrees on the shard plan (collective: the ranks' parameter names and sizes must match, a
  //! `mismatch_error` names the first that differs), builds this rank's optimizer with
  //! `make_optimizer(owned)` and broadcasts the parameters from `options.root`.
  template <parameter_set Params, class MakeOptimizer>
  requires std::invocable<MakeOptimizer&, std::vector<std::ranges::range_value_t<Params>>>
  sharded_optimizer(MakeOptimizer make_optimizer, communicator_type& comm, Params& params,
                    sharded_optimizer_options options = {}, Reducer reducer = {})
      : comm_(&comm)
      , source_(params)
      , options_(checked(options))
      , plan_(detail::plan_parameter_shards(comm, source_, values_, names_, "sharded_optimizer"))
      , lane_(shard_step(made(make_optimizer, params, plan_, comm), *this), comm, params,
              distributed_optimizer_options{options.missing, options.root, false},
              std::move(reducer)) {
    if (options_.stage == zero_stage::gradients) {
      detail::optimizer_sharding::scatter_to(lane_, plan_.owner);
    }
    gather_.build(values_, names_, plan_, comm.rank(), comm.options().bucket_bytes);
  }

  sharded_optimizer(const sharded_optimizer&) = delete;
  sharded_optimizer& operator=(const sharded_optimizer&) = delete;

  //! Reduces the gradients (or waits for the overlapped reduction), steps this rank's shard and
  //! gathers every rank's updated parameters. Collective.
  void step() { lane_.step(); }
  //! Ends the step without updating (see `distributed_optimizer::skip_step`). Collective.
  void skip_step() { lane_.skip_step(); }
  //! Reduces the gradients without stepping (at stage 2: this rank's own only). Collective.
  void synchronize() { lane_.synchronize(); }
  //! Parameter `index`'s gradient is final: its bucket is reduce-scattered (stage 2) or
  //! all-reduced (stage 1) as soon as it fills, on cohort's thread.
  void grad_ready(std::size_t index) requires overlapping_communicator<communicator_type> {
    lane_.grad_ready(index);
  }
  void backward_began() noexcept { lane_.backward_began(); }
  void wait_reduced() requires overlapping_communicator<communicator_type> { lane_.wait_reduced(); }
  bool reduced() const noexcept { return lane_.reduced(); }
  void keep_reduced() requires overlapping_communicator<communicator_type> { lane_.keep_reduced(); }
  [[nodiscard]] auto no_sync() { return lane_.no_sync(); }
  bool syncing() const noexcept { return lane_.syncing(); }

  //! Whether this rank owns parameter `index` (steps it, and at stage 2 receives its reduced
  //! gradient).
  bool owns(std::size_t index) const noexcept {
    return index < plan_.owner.size() && plan_.owner[index] == comm_->rank();
  }
  //! Who owns what, the same on every rank.
  const shard_plan& plan() const noexcept { return plan_; }
  zero_stage stage() const noexcept { return options_.stage; }

  //! This rank's optimizer, over the parameters it owns.
  Optimizer& inner() noexcept { return lane_.inner().inner(); }
  const Optimizer& inner() const noexcept { return lane_.inner().inner(); }
  communicator_type& comm() const noexcept { return *comm_; }
  const Reducer& reducer() const noexcept { return lane_.reducer(); }

private:
  static sharded_optimizer_options checked(sharded_optimizer_options options) {
    if (options.stage != zero_stage::optimizer_state && options.stage != zero_stage::gradients) {
      throw invalid_argument("cohort: sharded_optimizer: stage " +
                             std::to_string(static_cast<int>(options.stage)) +
                             "; stages 1 (optimizer_state) and 2 (gradients) are built");
    }
    return options;
  }

  // The rank's optimizer, once every rank has made its own.
  template <class MakeOptimizer, class Params>
  static Optimizer made(MakeOptimizer& make_optimizer, Params& params, const shard_plan& plan,
                        communicator_type& comm) {
    std::optional<Optimizer> optimizer;
    std::exception_ptr failure;
    try {
      optimizer.emplace(std::invoke(make_optimizer, owned(params, plan, comm.rank())));
    } catch (...) {
      failure = std::current_exception();
    }
    detail::require_every_rank_succeeded(comm, failure, "sharded_optimizer (making the optimizer)");
    return std::move(*optimizer);
  }

  template <class Params>
  static std::vector<std::ranges::range_value_t<Params>> owned(Params& params,
                                                               const shard_plan& plan, int rank) {
    std::vector<std::ranges::range_value_t<Params>> mine;
    std::size_t index = 0;
    for (auto&& p : params) {
      if (plan.owner[index++] == rank) {
        mine.push_back(p);
      }
    }
    return mine;
  }

  // Before the inner step: a parameter resized since the plan would be stepped with state of
  // another size. Every rank alike: the step's gradient agreement compared the sizes first.
  void require_planned_layout() {
    source_.values(values_, names_);
    gather_.require_layout(values_, names_);
  }

  // (Read again after the step: a user's optimizer may have replaced a value's memory.)
  void gather_parameters() {
    source_.values(values_, names_);
    gather_.run(*comm_, values_, names_);
  }

  communicator_type* comm_;
  parameter_source source_;
  sharded_optimizer_options options_;
  std::vector<tensor_view> values_; // (read again at every gather: a value may have moved)
  std::vector<std::string> names_;
  shard_plan plan_;
  detail::parameter_gather gather_;
  lane_type lane_;
};

template <class Make, class Communicator, class Params>
sharded_optimizer(Make, Communicator&, Params&) -> sharded_optimizer<
    std::invoke_result_t<Make&, std::vector<std::ranges::range_value_t<Params>>>, Communicator,
    mean>;
template <class Make, class Communicator, class Params>
sharded_optimizer(Make, Communicator&, Params&, sharded_optimizer_options) -> sharded_optimizer<
    std::invoke_result_t<Make&, std::vector<std::ranges::range_value_t<Params>>>, Communicator,
    mean>;
template <class Make, class Communicator, class Params, class Reducer>
sharded_optimizer(Make, Communicator&, Params&, sharded_optimizer_options, Reducer)
    -> sharded_optimizer<
        std::invoke_result_t<Make&, std::vector<std::ranges::range_value_t<Params>>>, Communicator,
        Reducer>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
