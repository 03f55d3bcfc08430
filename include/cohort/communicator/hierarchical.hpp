// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/fused_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>

#include <boost/mpi/communicator.hpp>

#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Two levels, for nodes with fast links inside and one network link out (ChainerMN's
//! hierarchical): each fused buffer is reduced to the node's first rank over `Intra`, all-reduced
//! among the nodes' first ranks over `Inter`, and broadcast back inside the node over `Intra`.
//! Only one rank per node uses the network. Nodes may differ in size.
template <links Intra = mpi_links, links Inter = mpi_links>
class hierarchical : public mpi_communicator<hierarchical<Intra, Inter>> {
  using base = mpi_communicator<hierarchical<Intra, Inter>>;

public:
  explicit hierarchical(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options)
      , fused_(options.fusion_buffer_bytes, options.fusion_threshold_bytes) {}

private:
  friend base;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    const bool leader = this->intra_rank() == 0;
    fused_.run(slots, reducer, this->size(), [&](tensor_view packed, reduce_op op) {
      Intra::reduce(this->intra_comm(), packed, op, 0);
      if (leader) {
        // The inter communicator of intra rank 0 links exactly the nodes' first ranks.
        Inter::allreduce(this->inter_comm(), packed, op);
      }
      Intra::broadcast(this->intra_comm(), packed, 0);
    });
  }

  detail::fused_reduction fused_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
