// SPDX-License-Identifier: Apache-2.0
#pragma once

// hierarchical<nccl_links, Inter> and two_dimensional<nccl_links, Inter>: the two-level
// strategies on GPU memory, as ChainerMN's hierarchical and two_dimensional were; their exchanges
// are the host strategies' (two_level.hpp), over other links. Inside the node,
// NCCL on a communicator of the node's ranks; between nodes, `Inter` (MPI on host memory) on a
// copy staged through pinned memory, as host_staged does. The parameter broadcast is staged the
// same way; everything else (device collectives over all ranks, host tensors, objects) is
// nccl_strategy's.

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/two_level.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/nccl.hpp>"
#endif

#include <cohort/algorithm/ring.hpp>
#include <cohort/communicator/engine/two_level.hpp>
#include <cohort/communicator/gpu/host_staged.hpp>
#include <cohort/communicator/gpu/nccl_strategy.hpp>
#include <cohort/communicator/gpu/options.hpp>
#include <cohort/communicator/hierarchical.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/two_dimensional.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi.hpp>
#include <cohort/transport/nccl.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! NCCL on the node's communicator, on one stream: the inside of two_level.hpp's exchanges.
struct nccl_node_link {
  nccl::communicator& comm;
  cudaStream_t stream;
  int rank_;
  int size_;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  void reduce(tensor_view data, reduce_op op, int root) const {
    nccl::reduce(comm, data.data, data.data, data.count, data.type, op, root, stream);
  }
  void broadcast(tensor_view data, int root) const {
    nccl::broadcast(comm, data.data, data.count, data.type, root, stream);
  }
  // Block i reduced to rank i: a reduce-scatter with blocks of unequal sizes, in one group.
  void reduce_scatter(tensor_view data, reduce_op op) const {
    nccl::group_guard group;
    for (int i = 0; i < size_; ++i) {
      reduce(engine::node_block(data, size_, i), op, i);
    }
    group.end(comm);
  }
  void allgather(tensor_view data) const {
    nccl::group_guard group;
    for (int i = 0; i < size_; ++i) {
      broadcast(engine::node_block(data, size_, i), i);
    }
    group.end(comm);
  }
};

//! Between nodes: `all_reduce(data, op)`, a staged MPI all-reduce of device memory.
template <class AllReduce>
struct staged_link {
  AllReduce all_reduce;
  void allreduce(tensor_view data, reduce_op op) const { all_reduce(data, op); }
};

//! What both GPU two-level strategies share: the NCCL communicator of the node (made at the first
//! gradient reduction, on the device current then), and the staging of a device range through
//! pinned host memory for an `Inter` reduction.
template <class Strategy, class Inter>
class nccl_two_level : public nccl_strategy<Strategy> {
  static_assert(links<Inter>, "cohort: Inter must model cohort::links");
  using base = nccl_strategy<Strategy>;

public:
  nccl_two_level(const boost::mpi::communicator& comm, communicator_options options,
                 gpu_options gpu)
      : base(comm, options, gpu) {}

  //! Destroys both NCCL communicators (the node's and all ranks'), as nccl_strategy::finalize
  //! does; both are freed whatever fails, and the first error is thrown. Idempotent.
  void finalize() {
    std::exception_ptr first;
    if (intra_) {
      try {
        intra_->destroy();
      } catch (...) {
        first = std::current_exception();
      }
    }
    try {
      base::finalize();
    } catch (...) {
      if (!first) {
        first = std::current_exception();
      }
    }
    if (first) {
      std::rethrow_exception(first);
    }
  }
  //! Aborts both NCCL communicators, abandoning their pending work.
  void abort() noexcept {
    if (intra_) {
      intra_->abort();
    }
    base::abort();
  }

  //! Copies every parameter's value from `root`, staged through pinned host memory a bucket
  //! (`bucket_bytes`) at a time and broadcast by MPI: the only NCCL communicator these strategies
  //! create is the node's (a device collective over all ranks would create a second one, over
  //! every rank). The copies run on cohort's stream, after the work queued on the user's stream
  //! and before what is queued there next, as the gradients' do. The ranks first agree on every
  //! name, size and dtype (a `mismatch_error` on every rank if they differ). Parameters in host
  //! memory go through MPI, as in every strategy.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    this->broadcast_device_parameters(params, root, [&](std::span<const tensor_view> values) {
      this->streams().run([&](cudaStream_t s) {
        staging_.broadcast_over_mpi(this->mpi_comm(), this->rank(), root, values,
                                    this->options().bucket_bytes, s);
      });
    });
  }

protected:
  friend nccl_strategy<Strategy>;

  //! The gradients travel on the NCCL communicator of this node's ranks, made at the first
  //! reduction on the device current then.
  nccl::communicator& bucket_comm() {
    if (!intra_) {
      intra_.emplace(this->intra_comm(), this->gpu().timeout, *this->options().timeout);
    }
    return *intra_;
  }

  //! The links of one bucket's exchange on stream `s`: NCCL inside the node, `Inter` between
  //! nodes on copies staged through pinned memory.
  nccl_node_link node_link(nccl::communicator& intra, cudaStream_t s) {
    return {intra, s, this->intra_rank(), this->intra_size()};
  }
  auto network_link(cudaStream_t s) {
    return staged_link{[this, s](tensor_view part, reduce_op op) {
      staged_allreduce(this->inter_comm(), part, op, s);
    }};
  }

  //! All-reduces `part` (device memory, queued on `s`) over `comm` with `Inter`: copied to pinned
  //! memory, reduced there once the copy is done (waited for with the time limit), copied back.
  void staged_allreduce(MPI_Comm comm, tensor_view part, reduce_op op, cudaStream_t s) {
    if (part.count == 0) {
      return;
    }
    staging_.round_trip(
        part, true, s,
        [&] {
          if (!copied_) {
            copied_.emplace(); // on the device of the stream it marks
          }
          copied_->record(s);
          if (this->gpu().timeout.count() > 0) {
            intra_->wait(this->work_started(), *copied_, this->gpu().timeout, "allreduce_grad");
          } else {
            copied_->synchronize();
          }
        },
        [&](tensor_view host) {
          engine::mpi_link<Inter>{comm, this->options().segment_bytes}.allreduce(host, op);
        });
  }

private:
  pinned_staging staging_;
  // Made at first use, like the streams: an event must be of the device of the streams it is
  // recorded on, and the trainer picks its device after constructing the communicator.
  std::optional<cuda::event> copied_;
  // Declared last, destroyed first: its work ends before the buffers it reads are freed.
  std::optional<nccl::communicator> intra_;
};

} // namespace detail

//! ChainerMN's hierarchical on GPUs: each packed buffer of gradients is reduced to the node's
//! first rank with NCCL, all-reduced among the nodes' first ranks with `Inter` (MPI, staged
//! through pinned host memory), and broadcast back inside the node with NCCL. Only one rank per
//! node uses the network. Nodes may differ in size.
template <class Inter>
class hierarchical<nccl_links, Inter>
    : public detail::nccl_two_level<hierarchical<nccl_links, Inter>, Inter> {
  using base = detail::nccl_two_level<hierarchical<nccl_links, Inter>, Inter>;

public:
  static constexpr std::string_view name = "hierarchical";

  explicit hierarchical(const boost::mpi::communicator& comm, communicator_options options = {},
                        gpu_options gpu = {})
      : base(comm, options, gpu) {}

private:
  friend detail::nccl_strategy<hierarchical>;

  // On the node's communicator (bucket_comm).
  void exchange_bucket(nccl::communicator& intra, tensor_view packed, reduce_op op,
                       cudaStream_t s) {
    // The inter communicator of intra rank 0 links exactly the nodes' first ranks.
    engine::hierarchical_exchange(this->node_link(intra, s), this->network_link(s),
                                  this->intra_rank() == 0, packed, op);
  }
};

//! ChainerMN's two_dimensional on GPUs: each packed buffer is reduce-scattered inside the node
//! with NCCL (block i to the node's rank i), every rank all-reduces its block across the nodes
//! with `Inter` (MPI, staged through pinned host memory), in parallel with the node's other ranks,
//! and the blocks are all-gathered inside the node with NCCL. The blocks follow
//! algorithm::ring_block, so any count works. The nodes must have the same number of ranks.
template <class Inter>
class two_dimensional<nccl_links, Inter>
    : public detail::nccl_two_level<two_dimensional<nccl_links, Inter>, Inter> {
  using base = detail::nccl_two_level<two_dimensional<nccl_links, Inter>, Inter>;

public:
  static constexpr std::string_view name = "two_dimensional";

  explicit two_dimensional(const boost::mpi::communicator& comm, communicator_options options = {},
                           gpu_options gpu = {})
      : base(comm, options, gpu) {
    detail::require_equal_node_sizes(*this, "two_dimensional");
  }

private:
  friend detail::nccl_strategy<two_dimensional>;

  // On the node's communicator (bucket_comm).
  void exchange_bucket(nccl::communicator& intra, tensor_view packed, reduce_op op,
                       cudaStream_t s) {
    engine::two_dimensional_exchange(this->node_link(intra, s), this->network_link(s), packed, op);
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
