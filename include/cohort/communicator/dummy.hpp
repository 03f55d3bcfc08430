// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/fused_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/config.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Does everything `flat` does to gradients (collect, check, pack, scale, unpack) except the
//! reduction itself (the agreement check, if on, still costs its one small all-reduce): what is
//! left of a step's cost without the network. Gradients come out scaled as the reducer says but not
//! summed, so training with it is not data-parallel training. Every other collective (tensors,
//! objects, parameter broadcast) does communicate, so data scattering and metrics still work.
class dummy : public mpi_communicator<dummy> {
public:
  explicit dummy(const boost::mpi::communicator& comm, communicator_options options = {})
      : mpi_communicator<dummy>(comm, options)
      , fused_(options.fusion_buffer_bytes, options.fusion_threshold_bytes) {}

private:
  friend class mpi_communicator<dummy>;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    fused_.run(slots, reducer, size(), [](tensor_view, reduce_op) {});
  }

  detail::fused_reduction fused_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
