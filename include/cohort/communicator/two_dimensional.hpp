// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/algorithm/ring.hpp>
#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/two_level.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/mpi/communicator.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

namespace detail {
//! Throws on every rank unless every node has as many ranks (collective): the shards of rank i
//! must line up across nodes.
template <class Communicator>
void require_equal_node_sizes(Communicator& comm, std::string_view strategy) {
  std::array<std::int32_t, 2> sizes = {comm.intra_size(), -comm.intra_size()};
  comm.allreduce(sizes, reduce_op::max);
  if (sizes[0] != -sizes[1]) {
    throw invalid_argument("cohort: " + std::string(strategy) + " on rank " +
                           std::to_string(comm.rank()) + ": the nodes have between " +
                           std::to_string(-sizes[1]) + " and " + std::to_string(sizes[0]) +
                           " ranks; " + std::string(strategy) +
                           " needs the same number on every node (use hierarchical)");
  }
}
} // namespace detail

//! Two dimensions, for nodes with several network links (ChainerMN's two_dimensional): each bucket
//! is reduce-scattered inside the node (a ring over the node's ranks), every rank then
//! all-reduces its own shard across the nodes over `Inter`, in parallel with the node's other
//! ranks, and the shards are all-gathered inside the node. Every rank uses the network, each for
//! 1/(ranks per node) of the bytes. The nodes must have the same number of ranks (the shards of
//! rank i must line up across nodes): otherwise construction throws on every rank. `Intra` is
//! `mpi_links` (cohort's ring on MPI) here, or `nccl_links` on GPUs (<cohort/nccl.hpp>). On one
//! node, one all-reduce over `Intra` is the whole exchange.
template <class Intra = mpi_links, class Inter = mpi_links>
class two_dimensional : public basic_communicator<two_dimensional<Intra, Inter>> {
  static_assert(!std::is_same_v<Intra, nccl_links>,
                "cohort: two_dimensional<nccl_links, ...> reduces GPU memory: include "
                "<cohort/nccl.hpp> in a translation unit compiled by nvcc");
  static_assert(std::is_same_v<Intra, mpi_links>,
                "cohort: on host memory, two_dimensional's rings inside the node run on MPI");
  static_assert(links<Inter>, "cohort: Inter must model cohort::links");
  using base = basic_communicator<two_dimensional<Intra, Inter>>;

public:
  static constexpr std::string_view name = "two_dimensional";

  explicit two_dimensional(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options) {
    detail::require_equal_node_sizes(*this, "two_dimensional");
  }

  two_dimensional(two_dimensional&&) noexcept = default;
  two_dimensional& operator=(two_dimensional&&) noexcept = default;
  // The ring's workspace is this class's: the reduction on cohort's thread ends before it goes.
  ~two_dimensional() { this->finish_overlap(); }

private:
  friend strategy_access;

  // A bucket's exchange is an all-reduce over every rank of the communicator: a small step's
  // one bucket may travel in the step's agreement instead (grad_sync::validate).
  static constexpr bool exchange_is_allreduce = true;

  // The ring's buffers, grown before the ranks agree to reduce (an allocation that fails here is
  // an error on every rank; inside the ring it would leave the others waiting).
  void prepare_exchange(const engine::bucket& bucket) {
    if (this->inter_size() > 1) {
      ring_.prepare(bucket.count, bucket.plan.wire, this->intra_size(), {});
    }
  }

  void exchange(tensor_view bucket, reduce_op op) {
    if (this->inter_size() == 1) {
      // One node: nothing to split across nodes, and MPI's all-reduce over the node beats the
      // ring's reduce-scatter and all-gather there (32 KiB-16 MiB: the ring 1.07-1.68x raw MPI,
      // bench/results/plot-allreduce-np2.txt), so the ring is not chosen where it loses.
      engine::mpi_link<Intra>{this->grad_intra_comm(), this->options().segment_bytes}.allreduce(
          bucket, op);
      return;
    }
    engine::two_dimensional_exchange(
        engine::mpi_ring_link{this->grad_intra_comm(), this->intra_rank(), this->intra_size(),
                              ring_},
        engine::mpi_link<Inter>{this->grad_inter_comm(), this->options().segment_bytes}, bucket,
        op);
  }

  algorithm::ring_workspace ring_;
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref
strategy_access::ref<two_dimensional<>>(two_dimensional<>&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
