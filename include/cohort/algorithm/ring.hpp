// SPDX-License-Identifier: Apache-2.0
#pragma once

// Collectives written on point-to-point messages, independent of the engine's own collectives:
// the ring reduce-scatter, the ring all-gather, and the ring all-reduce made of the two. Each
// step's block travels in chunks (all posted at once, or a bounded window of them in flight each
// way), and each chunk is reduced as soon as it arrives, so that the reduction of one chunk
// overlaps the transfer of the next. They work on type-erased views (any dtype, any rank count,
// counts not divisible by it, zero elements).
//
// The data is split into `size` blocks, block b being elements [b*n/size, (b+1)*n/size): the
// reduce-scatter leaves rank r with block r reduced over all ranks; the all-gather spreads every
// rank's block r to all. Cost (docs/algorithms.md): 2(n-1) steps, 2(n-1)/n of the data sent and
// received per rank, the same as the bandwidth-optimal bound.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace algorithm {

//! Tuning of the ring collectives.
struct ring_options {
  //! The size of the chunks a block travels in: small enough to pipeline, large enough for the
  //! link. Tests set it to a few bytes to force many chunks on tiny inputs.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  //! How many chunks are in flight each way at once; 0 (the default): all of a step's, posted
  //! together. A window bounds the memory in flight (pinned or registered buffers on some
  //! links); it gained nothing consistent over Open MPI's shared memory, where the receiver copies
  //! each chunk as it waits for it, so that chunks posted early do not leave the cache before they
  //! are reduced: windows of 1, 2, 4 and 8 chunks measured from 8% faster to 25% slower than all
  //! at once, 512 KiB to 256 MiB (bench/allreduce --ring-window, rows ring and ring/window;
  //! bench/results/ring-window-np{2,4}.txt).
  std::size_t window = 0;
  //! The tag of the ring's messages on the communicator (give the ring a communicator of its own,
  //! or a tag nothing else uses).
  int tag = 0x7269;
};

//! What a ring reuses from call to call (the incoming block's buffer, the lists of pending
//! messages), so that a call allocates nothing once the first has sized them.
class ring_workspace {
public:
  //! Makes room for a ring over `ranks` ranks on `count` elements of `type` with `options`, so
  //! that the ring itself allocates nothing: a failure to allocate then happens here, before any
  //! message is sent.
  void prepare(std::size_t count, dtype type, int ranks, const ring_options& options) {
    if (ranks <= 1) {
      return;
    }
    const std::size_t block =
        (count + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
    reserve(block * size_of(type));
    const std::size_t chunk = std::max<std::size_t>(1, options.chunk_bytes / size_of(type));
    const std::size_t chunks = (block + chunk - 1) / chunk + 1;
    receives_.reserve(chunks);
    sends_.reserve(chunks);
  }

  std::byte* reserve(std::size_t bytes) {
    if (buffer_.size() < bytes) {
      buffer_.resize(bytes);
    }
    return buffer_.data();
  }
  std::vector<mpi::request>& receives() noexcept { return receives_; }
  std::vector<mpi::request>& sends() noexcept { return sends_; }

private:
  std::vector<std::byte> buffer_;
  std::vector<mpi::request> receives_;
  std::vector<mpi::request> sends_;
};

namespace detail {
struct block {
  std::size_t begin;
  std::size_t count;
};

inline block block_of(std::size_t n, int ranks, int b) {
  const auto size = static_cast<std::size_t>(ranks);
  const auto i = static_cast<std::size_t>(b);
  // n * i / size without overflow for large n.
  const auto start = [&](std::size_t k) { return (n / size) * k + (n % size) * k / size; };
  return {start(i), start(i + 1) - start(i)};
}

inline tensor_view part(tensor_view data, block b) {
  return {static_cast<std::byte*>(data.data) + b.begin * size_of(data.type), b.count, data.type,
          data.location};
}

inline int wrap(int value, int ranks) {
  return ((value % ranks) + ranks) % ranks;
}

// This rank's place on the ring of `comm`.
struct ring_position {
  int rank;
  int ranks;
  int next;
  int previous;

  explicit ring_position(MPI_Comm comm)
      : rank(mpi::rank_of(comm))
      , ranks(mpi::comm_size(comm))
      , next((rank + 1) % ranks)
      , previous((rank + ranks - 1) % ranks) {}

  // The block `offset` places before this rank's, among `count` elements.
  block before(std::size_t count, int offset) const {
    return block_of(count, ranks, wrap(rank - offset, ranks));
  }
};

// One ring step: `outgoing` goes to the next rank while `incoming_count` elements come from the
// previous one, chunk by chunk; `arrived(chunk view, element offset)` runs on each incoming chunk
// as soon as it is in.
template <class Arrived>
void ring_step(MPI_Comm comm, const ring_position& ring, const_tensor_view outgoing,
               tensor_view staging, const ring_options& options, ring_workspace& workspace,
               Arrived&& arrived) {
  const std::size_t element = size_of(staging.type);
  const std::size_t chunk = std::max<std::size_t>(1, options.chunk_bytes / element);
  const std::size_t incoming = (staging.count + chunk - 1) / chunk;
  const std::size_t outgoing_chunks = (outgoing.count + chunk - 1) / chunk;
  const std::size_t window =
      options.window == 0 ? std::max(incoming, outgoing_chunks) : options.window;
  auto& receives = workspace.receives();
  auto& sends = workspace.sends();
  receives.clear();
  sends.clear();
  // Chunk i of each direction is message i between the two neighbours: MPI keeps their order.
  const auto post_receive = [&] {
    const std::size_t begin = receives.size() * chunk;
    receives.push_back(
        mpi::irecv(comm,
                   {static_cast<std::byte*>(staging.data) + begin * element,
                    std::min(chunk, staging.count - begin), staging.type, staging.location},
                   ring.previous, options.tag));
  };
  const auto post_send = [&] {
    const std::size_t begin = sends.size() * chunk;
    sends.push_back(
        mpi::isend(comm,
                   {static_cast<const std::byte*>(outgoing.data) + begin * element,
                    std::min(chunk, outgoing.count - begin), outgoing.type, outgoing.location},
                   ring.next, options.tag));
  };
  // A send leaves once the one `window` places before it has completed. This cannot deadlock:
  // the send a rank waits for completes when its next rank posts that receive, which it does
  // after reducing an earlier chunk, whose send had completed before.
  std::size_t sent = 0; // sends completed
  const auto send_next = [&] {
    if (sends.size() - sent == window) {
      sends[sent++].wait();
    }
    post_send();
  };
  while (receives.size() < std::min(window, incoming)) {
    post_receive();
  }
  while (sends.size() < std::min(window, outgoing_chunks)) {
    post_send();
  }
  for (std::size_t i = 0; i < incoming; ++i) {
    receives[i].wait();
    const std::size_t begin = i * chunk;
    arrived(const_tensor_view{static_cast<std::byte*>(staging.data) + begin * element,
                              std::min(chunk, staging.count - begin), staging.type,
                              staging.location},
            begin);
    if (receives.size() < incoming) {
      post_receive();
    }
    if (sends.size() < outgoing_chunks) {
      send_next();
    }
  }
  while (sends.size() < outgoing_chunks) {
    send_next();
  }
  for (; sent < sends.size(); ++sent) {
    sends[sent].wait();
  }
  receives.clear();
  sends.clear();
}
} // namespace detail

//! Ring reduce-scatter in place: afterwards block `rank` of `data` holds the reduction of every
//! rank's block `rank` (the other blocks hold partial results). Collective over `comm`; every
//! rank passes the same count and dtype.
COHORT_DECL void ring_reduce_scatter(MPI_Comm comm, tensor_view data, reduce_op op,
                                     const ring_options& options, ring_workspace& workspace);

//! Ring all-gather in place: every rank's block `rank` of `data` goes to all ranks. Collective.
COHORT_DECL void ring_allgather(MPI_Comm comm, tensor_view data, const ring_options& options,
                                ring_workspace& workspace);

//! Ring all-reduce in place: reduce-scatter, then all-gather. Collective.
inline void ring_allreduce(MPI_Comm comm, tensor_view data, reduce_op op,
                           const ring_options& options, ring_workspace& workspace) {
  ring_reduce_scatter(comm, data, op, options, workspace);
  ring_allgather(comm, data, options, workspace);
}

//! The elements of block `rank` among `count` split over `ranks` ranks.
inline std::pair<std::size_t, std::size_t> ring_block(std::size_t count, int ranks, int rank) {
  const auto b = detail::block_of(count, ranks, rank);
  return {b.begin, b.count};
}

} // namespace algorithm
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/algorithm/impl/ring.ipp>
#endif
