// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Fuses the gradients into buckets (`bucket_bytes`, 4 MiB by default) and reduces each bucket
//! with one MPI all-reduce, so that many small tensors cost a few latencies instead of one each; a
//! tensor of `fusion_threshold_bytes` or more is reduced in place, where a copy would cost more
//! than it saves. ChainerMN's flat packed everything into one buffer; on the figures of
//! bench/grad_sync that is slower. Nothing is allocated after the first step of a layout.
class flat : public basic_communicator<flat> {
public:
  static constexpr std::string_view name = "flat";

  using basic_communicator<flat>::basic_communicator;

private:
  friend strategy_access;

  // A bucket's exchange is an all-reduce over every rank of the communicator: a small step's
  // one bucket may travel in the step's agreement instead (grad_sync::validate).
  static constexpr bool exchange_is_allreduce = true;

  void exchange(tensor_view bucket, reduce_op op) {
    mpi::allreduce(grad_comm(), bucket, op, options().segment_bytes);
  }
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref strategy_access::ref<flat>(flat&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
