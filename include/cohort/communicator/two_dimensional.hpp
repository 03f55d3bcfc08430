// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/algorithm/ring.hpp>
#include <cohort/communicator/fused_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/mpi/communicator.hpp>

#include <span>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Two dimensions, for nodes with several network links (ChainerMN's two_dimensional): each fused
//! buffer is reduce-scattered inside the node (a ring over the node's ranks), every rank then
//! all-reduces its own shard across the nodes over `Inter`, in parallel with the node's other
//! ranks, and the shards are all-gathered inside the node. Every rank uses the network, each for
//! 1/(ranks per node) of the bytes. The nodes must have the same number of ranks (the shards of
//! rank i must line up across nodes): otherwise construction throws on every rank.
template <links Inter = mpi_links>
class two_dimensional : public mpi_communicator<two_dimensional<Inter>> {
  using base = mpi_communicator<two_dimensional<Inter>>;

public:
  explicit two_dimensional(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options)
      , fused_(options.fusion_buffer_bytes, options.fusion_threshold_bytes) {
    int sizes[2] = {this->intra_size(), -this->intra_size()};
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, this->mpi_comm()),
               "MPI_Allreduce (node sizes)", this->mpi_comm());
    if (sizes[0] != -sizes[1]) {
      throw invalid_argument("cohort: two_dimensional on rank " + std::to_string(this->rank()) +
                             ": the nodes have between " + std::to_string(-sizes[1]) + " and " +
                             std::to_string(sizes[0]) +
                             " ranks; two_dimensional needs the same number on every node (use "
                             "hierarchical)");
    }
  }

private:
  friend base;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    fused_.run(slots, reducer, this->size(), [&](tensor_view packed, reduce_op op) {
      algorithm::ring_reduce_scatter(this->intra_comm(), packed, op, {}, ring_);
      const auto [begin, count] =
          algorithm::ring_block(packed.count, this->intra_size(), this->intra_rank());
      Inter::allreduce(this->inter_comm(),
                       {static_cast<std::byte*>(packed.data) + begin * size_of(packed.type), count,
                        packed.type, packed.location},
                       op);
      algorithm::ring_allgather(this->intra_comm(), packed, {}, ring_);
    });
  }

  detail::fused_reduction fused_;
  algorithm::ring_workspace ring_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
