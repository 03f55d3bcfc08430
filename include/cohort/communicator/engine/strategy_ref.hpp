// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the engine sees a strategy: a pointer to it and a few function pointers, built from the
// strategy's hooks at compile time (strategy_access.hpp). The engine is compiled once, whatever
// the strategy.

#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <cstddef>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! What the engine needs of a strategy, type-erased: for a host strategy, how one packed bucket
//! is exchanged (and, optionally, what its exchange allocates before the ranks agree); for a
//! device strategy, how all the gradients are reduced in one call (and, optionally, what it
//! allocates and refuses before the ranks agree). One indirect call per bucket, beside a
//! collective of up to `bucket_bytes`.
struct strategy_ref {
  void* self = nullptr;
  void (*exchange)(void*, tensor_view, reduce_op) = nullptr;
  // A packed bucket reduce-scattered in place: rank r's block holds blocks[r] elements, after
  // the blocks of the ranks before it, and this rank's block, reduced, is left at the front.
  void (*exchange_scatter)(void*, tensor_view, std::span<const int>, reduce_op) = nullptr;
  // A bucket of one rank's gradients (a large one alone, in place) reduced to that rank, started
  // and not waited for: several such, each to its own owner, then share the links that one
  // reduce after another leaves idle. Null where the strategy reduce-scatters in a way of its
  // own (`exchange_scatter` then does these too), and on one node.
  mpi::request (*start_reduce)(void*, tensor_view, int root, reduce_op) = nullptr;
  void (*prepare)(void*, const bucket&) = nullptr;
  void (*reduce_all)(void*, std::span<const grad_slot>, const reduction_table&) = nullptr;
  void (*prepare_all)(void*, std::span<const grad_slot>, const reduction_table&) = nullptr;
  // Collectives a device strategy's `reduce_all` ran in its last call (`device_bucket_count()`),
  // for grad_sync_stats; null when it does not say.
  std::size_t (*device_buckets)(const void*) = nullptr;
  // Refuses a gradient in memory the strategy cannot reduce, though of the right location (a
  // strategy's `check_gradient_memory`); null when it takes all such memory.
  void (*check_gradient_memory)(void*, const grad_slot&) = nullptr;
  // `exchange` is an all-reduce over every rank (`static constexpr bool exchange_is_allreduce`):
  // a blocking step of one small bucket may then travel in the step's agreement.
  bool exchange_is_allreduce = false;

  bool device() const noexcept { return reduce_all != nullptr; }
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
