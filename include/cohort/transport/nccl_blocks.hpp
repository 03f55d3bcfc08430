// SPDX-License-Identifier: Apache-2.0
#pragma once

// NCCL's collectives over blocks of any size, one count per rank (a sharded optimizer's shards
// are whole tensors, rarely even). NCCL has none: each is one group of a rooted call per rank,
// or NCCL's own collective where the blocks are even.

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/transport/nccl.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace nccl {
namespace detail {

inline bool even(std::span<const std::size_t> counts) noexcept {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

// `call(rank, count, offset_bytes)` for every rank with a block, in one group. Every rank passes
// the same counts (agreed before), so every rank skips the same empty blocks.
template <class Call>
void per_rank_group(communicator& comm, std::span<const std::size_t> counts,
                    std::span<const std::size_t> offsets, dtype type, Call&& call) {
  group_guard group;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] != 0) {
      call(static_cast<int>(r), counts[r], offsets[r] * size_of(type));
    }
  }
  group.end(comm);
}

} // namespace detail

//! Every rank's block into `recv`: rank r's `send` holds counts[r] elements and lands at
//! offsets[r] of `recv`. One broadcast from each rank in one group.
inline void allgather_blocks(communicator& comm, const void* send, void* recv,
                             std::span<const std::size_t> counts,
                             std::span<const std::size_t> offsets, dtype type,
                             cudaStream_t stream) {
  if (detail::even(counts)) {
    return counts.empty() ? void() : allgather(comm, send, recv, counts.front(), type, stream);
  }
  detail::per_rank_group(comm, counts, offsets, type, [&](int r, std::size_t n, std::size_t at) {
    comm.complete(ncclBroadcast(send, static_cast<std::byte*>(recv) + at, n, datatype(type), r,
                                comm.get(), stream),
                  "ncclBroadcast");
  });
}

//! Block r of the reduction of every rank's `send` (the sum of `counts`, rank r's block at
//! offsets[r]) into rank r's `recv` (counts[r] elements). One reduce to each rank in one group.
inline void reduce_scatter_blocks(communicator& comm, const void* send, void* recv,
                                  std::span<const std::size_t> counts,
                                  std::span<const std::size_t> offsets, dtype type,
                                  reduce_op operation, cudaStream_t stream) {
  if (detail::even(counts)) {
    return counts.empty()
               ? void()
               : reduce_scatter(comm, send, recv, counts.front(), type, operation, stream);
  }
  detail::per_rank_group(comm, counts, offsets, type, [&](int r, std::size_t n, std::size_t at) {
    comm.complete(ncclReduce(static_cast<const std::byte*>(send) + at, recv, n, datatype(type),
                             op(operation), r, comm.get(), stream),
                  "ncclReduce");
  });
}

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
