// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <concepts>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The links a two-level strategy uses inside a node (Intra) or between nodes (Inter): how a
//! buffer is reduced to a root, broadcast, and all-reduced over the ranks of one of its
//! communicators. A policy is a type with these static functions; one that also takes a last
//! `std::size_t segment_bytes` is given `communicator_options::segment_bytes`.
template <class L>
concept links = requires(MPI_Comm comm, tensor_view data, reduce_op op, int root) {
  L::reduce(comm, data, op, root);
  L::broadcast(comm, data, root);
  L::allreduce(comm, data, op);
};

//! NCCL inside a node, on device memory: `hierarchical<nccl_links, Inter>` and
//! `two_dimensional<nccl_links, Inter>` reduce GPU gradients with NCCL inside the node and stage
//! what crosses nodes through pinned host memory for `Inter` (ChainerMN's hierarchical and
//! two_dimensional on GPUs). A tag: the strategies that use it are in
//! <cohort/communicator/gpu/two_level.hpp> (nvcc, through <cohort/nccl.hpp>).
struct nccl_links {};

//! MPI on host memory, in segments of at most `segment_bytes` (0: whole).
struct mpi_links {
  static void reduce(MPI_Comm comm, tensor_view data, reduce_op op, int root,
                     std::size_t segment_bytes = 0) {
    mpi::reduce(comm, data, op, root, segment_bytes);
  }
  static void broadcast(MPI_Comm comm, tensor_view data, int root, std::size_t segment_bytes = 0) {
    mpi::broadcast(comm, data, root, segment_bytes);
  }
  static void allreduce(MPI_Comm comm, tensor_view data, reduce_op op,
                        std::size_t segment_bytes = 0) {
    mpi::allreduce(comm, data, op, segment_bytes);
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
