// SPDX-License-Identifier: Apache-2.0
#pragma once

// The two-level exchanges, written once over link objects: the host strategies run them on MPI
// (hierarchical.hpp, two_dimensional.hpp), the GPU ones on NCCL inside the node and on MPI staged
// through pinned memory between nodes (gpu/two_level.hpp). A link object is bound to one
// communicator (and, on GPUs, one stream) and offers what its level needs:
//   inside the node:  reduce(data, op, root), broadcast(data, root) (hierarchical);
//                     reduce_scatter(data, op), allgather(data), rank(), size() (two_dimensional:
//                     block i, as algorithm::ring_block cuts it, to the node's rank i);
//   between nodes:    allreduce(data, op).

#include <cohort/algorithm/ring.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <mpi.h>

#include <cstddef>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! Block `i` of `data` among `ranks`, as the node's rank i holds it in two_dimensional.
inline tensor_view node_block(tensor_view data, int ranks, int i) {
  const auto [begin, count] = algorithm::ring_block(data.count, ranks, i);
  return {static_cast<std::byte*>(data.data) + begin * size_of(data.type), count, data.type,
          data.location};
}

//! hierarchical: reduced to the node's first rank, all-reduced among the nodes' first ranks (the
//! only ones that use the network), broadcast back inside the node.
template <class Intra, class Inter>
void hierarchical_exchange(Intra&& intra, Inter&& inter, bool node_leader, tensor_view bucket,
                           reduce_op op) {
  intra.reduce(bucket, op, 0);
  if (node_leader) {
    inter.allreduce(bucket, op);
  }
  intra.broadcast(bucket, 0);
}

//! two_dimensional: reduce-scattered inside the node, each rank's block all-reduced across the
//! nodes (every rank uses the network, for 1/(ranks per node) of the bytes), all-gathered inside
//! the node.
template <class Intra, class Inter>
void two_dimensional_exchange(Intra&& intra, Inter&& inter, tensor_view bucket, reduce_op op) {
  intra.reduce_scatter(bucket, op);
  inter.allreduce(node_block(bucket, intra.size(), intra.rank()), op);
  intra.allgather(bucket);
}

//! A `links` policy bound to one MPI communicator, and the segments it cuts messages into when
//! its functions take them.
template <links L>
struct mpi_link {
  MPI_Comm comm;
  std::size_t segment_bytes = 0;
  void reduce(tensor_view data, reduce_op op, int root) const {
    if constexpr (requires { L::reduce(comm, data, op, root, segment_bytes); }) {
      L::reduce(comm, data, op, root, segment_bytes);
    } else {
      L::reduce(comm, data, op, root);
    }
  }
  void broadcast(tensor_view data, int root) const {
    if constexpr (requires { L::broadcast(comm, data, root, segment_bytes); }) {
      L::broadcast(comm, data, root, segment_bytes);
    } else {
      L::broadcast(comm, data, root);
    }
  }
  void allreduce(tensor_view data, reduce_op op) const {
    if constexpr (requires { L::allreduce(comm, data, op, segment_bytes); }) {
      L::allreduce(comm, data, op, segment_bytes);
    } else {
      L::allreduce(comm, data, op);
    }
  }
};

//! cohort's ring on the node's MPI communicator, with its workspace.
struct mpi_ring_link {
  MPI_Comm comm;
  int rank_;
  int size_;
  algorithm::ring_workspace& workspace;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  void reduce_scatter(tensor_view data, reduce_op op) const {
    algorithm::ring_reduce_scatter(comm, data, op, {}, workspace);
  }
  void allgather(tensor_view data) const { algorithm::ring_allgather(comm, data, {}, workspace); }
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
