// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The reference strategy: one MPI all-reduce per gradient tensor, on host memory (in place, or
//! through a cast buffer when the reducer wants another dtype on the wire). Simple and slow for
//! many small tensors (one latency each); the oracle the faster strategies are tested against.
class naive : public basic_communicator<naive> {
public:
  static constexpr std::string_view name = "naive";

  using basic_communicator<naive>::basic_communicator;

private:
  friend strategy_access;

  // A bucket's exchange is an all-reduce over every rank of the communicator: a small step's
  // one bucket may travel in the step's agreement instead (grad_sync::validate).
  static constexpr bool exchange_is_allreduce = true;

  // Every gradient alone in its bucket, and in place where its dtype allows.
  static engine::bucket_limits bucket_limits_for(const communicator_options&) { return {0, 0, 0}; }

  void exchange(tensor_view bucket, reduce_op op) {
    mpi::allreduce(grad_comm(), bucket, op, options().segment_bytes);
  }
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref strategy_access::ref<naive>(naive&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
