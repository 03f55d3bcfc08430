// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/config.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/transport/mpi.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The reference strategy: one MPI all-reduce per gradient tensor, on host memory. Simple and
//! slow for many small tensors (one latency each); the oracle the faster strategies are tested
//! against.
class naive : public mpi_communicator<naive> {
public:
  using mpi_communicator<naive>::mpi_communicator;

private:
  friend class mpi_communicator<naive>;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    for (const auto& slot : slots) {
      const grad_reduction plan = reducer.plan(slot.grad.type, size());
      if (plan.wire == slot.grad.type) {
        kernels::host::scale(slot.grad, plan.pre_scale);
        mpi::allreduce(mpi_comm(), slot.grad, plan.op);
        kernels::host::scale(slot.grad, plan.post_scale);
        continue;
      }
      // Another dtype on the wire: cast into a staging buffer reused across steps.
      const std::size_t bytes = slot.grad.count * size_of(plan.wire);
      if (staging_.size() < bytes) {
        staging_.resize(bytes);
      }
      const tensor_view wire{staging_.data(), slot.grad.count, plan.wire, memory_location::host};
      const const_tensor_view source = slot.grad;
      kernels::host::pack(std::span(&source, 1), wire, plan.pre_scale);
      mpi::allreduce(mpi_comm(), wire, plan.op);
      kernels::host::unpack(wire, std::span(&slot.grad, 1), plan.post_scale);
    }
  }

  std::vector<std::byte> staging_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
