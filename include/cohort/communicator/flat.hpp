// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/fused_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/config.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Fuses the gradients: packs the small ones into a reusable buffer (`fusion_buffer_bytes`, 4 MiB
//! by default) and reduces each full buffer with one MPI all-reduce, so that many small tensors
//! cost a few latencies instead of one each; a tensor of `fusion_threshold_bytes` or more is
//! reduced in place, where a copy would cost more than it saves. ChainerMN's flat packed
//! everything into one buffer; on the figures of bench/allreduce that is slower than both. Nothing
//! is allocated after the first step.
class flat : public mpi_communicator<flat> {
public:
  explicit flat(const boost::mpi::communicator& comm, communicator_options options = {})
      : mpi_communicator<flat>(comm, options)
      , fused_(options.fusion_buffer_bytes, options.fusion_threshold_bytes) {}

  //! Bytes held by the fusion buffer (at most `fusion_buffer_bytes`).
  std::size_t fusion_buffer_bytes() const noexcept { return fused_.buffer_bytes(); }

private:
  friend class mpi_communicator<flat>;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    fused_.run(slots, reducer, size(), [this](tensor_view packed, reduce_op op) {
      mpi::allreduce(mpi_comm(), packed, op);
    });
  }

  detail::fused_reduction fused_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
