// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/fused_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/config.hpp>
#include <cohort/transport/mpi.hpp>

#include <cstddef>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Packs all gradients into one buffer (one per gradient dtype) and reduces it with a single MPI
//! all-reduce: one latency per step instead of one per tensor. The buffer is reused, so nothing is
//! allocated after the first step.
class flat : public mpi_communicator<flat> {
public:
  using mpi_communicator<flat>::mpi_communicator;

  //! Bytes held by the fusion buffer.
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
