// SPDX-License-Identifier: Apache-2.0
#pragma once

// The all-reduce of a buffer that lies in a node's shared window on every rank: no message and
// no copy into a library's buffers. Each rank reduces its block of the buffer (as the ring's
// blocks: rank r's is elements [r*n/size, (r+1)*n/size)) from every rank's memory into its own,
// in cache-sized chunks, then stores each reduced chunk into the other ranks' memory while it is
// still in cache. Two flags per rank order it, one cache line each: `arrived` (this rank's buffer
// is written; its header says where it is) and `done` (this rank's block is in everyone's memory).
// Each element is computed once, by one rank, so every replica holds the same bytes.
//
// Memory traffic per rank, for n ranks and a buffer of B bytes: reads n B/n, writes n B/n;
// one MPI all-reduce over shared memory copies the buffer into and out of its own buffers on top
// of that (bench/shared_window.cpp measured 0.39-0.50x of one MPI call per tensor on ResNet-50's
// gradients, the window's 0.78-0.84x for MPI's packed calls).

#include <cohort/algorithm/ring.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/shared_window.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace algorithm {

//! Each rank's flags, at the head of its segment of the window.
struct window_flags {
  alignas(64) std::uint64_t arrived;
  alignas(64) std::uint64_t done;
  // What the rank's buffer of exchange k is, at [k % 2] (a rank rewrites it for exchange k + 2
  // only once every rank has arrived at k + 1, so past every read of exchange k): its offset in
  // the window + 1 (0: not in the window), its count, dtype and operation.
  alignas(64) std::uint64_t buffer[2][4];
};

//! All-reduces buffers in `window` (whose header holds at least `window_flags`). One object per
//! window, used by one thread at a time; every rank of the window calls `allreduce` as many times,
//! as a collective.
class window_allreduce {
public:
  static constexpr std::size_t header_bytes = sizeof(window_flags);
  //! A chunk: the n inputs and the output of one stay in the first levels of cache.
  static constexpr std::size_t chunk_bytes = std::size_t{16} << 10;

  explicit window_allreduce(const mpi::shared_window& window) noexcept
      : window_(&window) {}

  //! Reduces `data` with `op` over the window's ranks when `data` lies in the window on every
  //! rank, at the same offset; returns false, having changed nothing, when it lies outside the
  //! window on every rank. Throws `mismatch_error` on every rank of the window when some ranks
  //! hold it in the window and others outside, or at other offsets, or pass another count, dtype
  //! or operation. On several nodes, `across_nodes` (null: one node) has `agree(bool in_window)`,
  //! which makes every node take the same path or throws on every rank, and `allreduce(block,
  //! op)`, which all-reduces this rank's reduced block with the same block of the other nodes.
  template <class AcrossNodes = std::nullptr_t>
  bool allreduce(tensor_view data, reduce_op op, AcrossNodes&& across_nodes = nullptr) {
    const std::uint64_t k = ++exchanges_;
    std::size_t offset = 0;
    bool inside = false;
    if (data.count > 0) {
      if (const auto found = window_->offset_of(data.data, data.size_bytes())) {
        offset = *found;
        inside = true;
      }
    }
    const int me = window_->rank();
    const int n = window_->size();
    std::uint64_t* mine = flags(me).buffer[k % 2];
    mine[0] = inside ? offset + 1 : 0;
    mine[1] = data.count;
    mine[2] = static_cast<std::uint64_t>(data.type);
    mine[3] = static_cast<std::uint64_t>(op);
    store(flags(me).arrived, k);
    for (int r = 0; r < n; ++r) {
      wait_for(flags(r).arrived, k);
    }
    // Every rank reads the same n headers: if any two differ, each rank finds one that differs
    // from its own, and all of them throw.
    for (int r = 0; r < n; ++r) {
      if (!std::equal(mine, mine + 4, flags(r).buffer[k % 2])) {
        throw mismatch_error(disagreement(r, k));
      }
    }
    constexpr bool one_node = std::is_same_v<std::remove_cvref_t<AcrossNodes>, std::nullptr_t>;
    if constexpr (!one_node) {
      across_nodes.agree(inside);
    }
    if (!inside) {
      return false;
    }
    reduce_block(data, offset, op, across_nodes);
    store(flags(me).done, k);
    for (int r = 0; r < n; ++r) {
      wait_for(flags(r).done, k);
    }
    return true;
  }

  //! Exchanges run so far (in the window or not).
  std::uint64_t exchanges() const noexcept { return exchanges_; }

private:
  window_flags& flags(int r) const noexcept {
    return *reinterpret_cast<window_flags*>(window_->header(r));
  }

  static void store(std::uint64_t& flag, std::uint64_t value) noexcept {
    std::atomic_ref<std::uint64_t>(flag).store(value, std::memory_order_release);
  }

  // Spins while the other ranks are close (a peer a few hundred nanoseconds behind), yields
  // while they compute, and sleeps only once the wait is long. A rank that never comes is the
  // watchdog's: the exchange runs inside a watched transfer, which ends the job at the timeout.
  static void wait_for(std::uint64_t& flag, std::uint64_t value) noexcept;

  template <class AcrossNodes>
  void reduce_block(tensor_view data, std::size_t offset, reduce_op op,
                    AcrossNodes& across_nodes) const {
    const int me = window_->rank();
    const int n = window_->size();
    const std::size_t element = size_of(data.type);
    const auto [first, count] = ring_block(data.count, n, me);
    const std::size_t begin = offset + first * element;
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes / element);
    const auto at = [&](int r, std::size_t i) { return window_->data(r) + begin + i * element; };
    const auto push = [&](std::size_t i, std::size_t m) {
      for (int s = 1; s < n; ++s) {
        const int r = (me + s) % n;
        std::memcpy(at(r, i), at(me, i), m * element);
      }
    };
    constexpr bool one_node = std::is_same_v<std::remove_cvref_t<AcrossNodes>, std::nullptr_t>;
    for (std::size_t i = 0; i < count; i += chunk) {
      const std::size_t m = std::min(chunk, count - i);
      const tensor_view out{at(me, i), m, data.type, data.location};
      for (int s = 1; s < n; ++s) {
        const int r = (me + s) % n;
        kernels::host::reduce(out, const_tensor_view{at(r, i), m, data.type, data.location}, op);
      }
      if constexpr (one_node) {
        push(i, m); // while the chunk is in cache
      }
    }
    if constexpr (!one_node) {
      across_nodes.allreduce(tensor_view{at(me, 0), count, data.type, data.location}, op);
      for (std::size_t i = 0; i < count; i += chunk) {
        push(i, std::min(chunk, count - i));
      }
    }
  }

  std::string disagreement(int r, std::uint64_t k) const;

  const mpi::shared_window* window_;
  std::uint64_t exchanges_ = 0;
};

} // namespace algorithm
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/algorithm/impl/window_allreduce.ipp>
#endif
