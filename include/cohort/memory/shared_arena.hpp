// SPDX-License-Identifier: Apache-2.0
#pragma once

// Gradients that live where every rank of the node can read them: an arena in an MPI-3
// shared-memory window, and a standard allocator over it (std::vector<float,
// cohort::shared_allocator<float>>), so that the shared_memory strategy reduces them in place,
// without MPI copying them through its own buffers.

#include <cohort/config.hpp>
#include <cohort/transport/shared_window.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! This rank's segment of a node's shared window, handed out front to back. Offsets matter: the
//! ranks reduce a gradient in the window only where it lies at the same offset on every rank, so
//! a model must allocate its gradients in the same order and sizes on every rank (as a model
//! built by the same code does). What does not fit comes from the heap and is reduced as the
//! `flat` strategy reduces it; `spilled_bytes()` says how much, to size the arena. Space freed
//! is reused once it is the last block or the arena is empty. Thread-safe.
class shared_arena {
public:
  //! Every block starts on this boundary on every rank, so that offsets match across ranks.
  static constexpr std::size_t alignment = mpi::shared_window::alignment;

  //! Collective over `node` (ranks that share memory): `bytes` of data per rank after a header
  //! of `header_bytes` for whoever reduces in the window.
  shared_arena(MPI_Comm node, std::size_t header_bytes, std::size_t bytes)
      : window_(node, header_bytes, bytes) {}

  //! `bytes` aligned to `align` (at most `alignment`, past which offsets could differ across
  //! ranks), or null when they do not fit.
  void* allocate(std::size_t bytes, std::size_t align = alignment) noexcept {
    if (align > alignment) {
      return nullptr;
    }
    const std::scoped_lock lock(mutex_);
    if (closed_) {
      return nullptr;
    }
    const std::size_t begin = (top_ + alignment - 1) / alignment * alignment;
    if (begin > window_.bytes() || bytes > window_.bytes() - begin) {
      spilled_ += bytes;
      return nullptr;
    }
    top_ = begin + bytes;
    ++live_;
    return window_.data(window_.rank()) + begin;
  }

  //! Gives back a block of this arena; false when `p` is not one (the caller frees it).
  bool deallocate(void* p, std::size_t bytes) noexcept {
    const auto at = window_.offset_of(p, bytes);
    if (!at) {
      return false;
    }
    const std::scoped_lock lock(mutex_);
    if (--live_ == 0) {
      top_ = 0;
    } else if (*at + bytes == top_) {
      top_ = *at;
    }
    return true;
  }

  //! Frees the window (collective: its communicator does, as it goes). What it gave is then
  //! freed memory: a container may still be destroyed (its blocks are given back without a read),
  //! not used; later allocations come from the heap.
  void close() noexcept {
    const std::scoped_lock lock(mutex_);
    if (!closed_) {
      window_.free();
      closed_ = true;
    }
  }

  const mpi::shared_window& window() const noexcept { return window_; }
  std::size_t capacity() const noexcept { return window_.bytes(); }
  std::size_t used_bytes() const {
    const std::scoped_lock lock(mutex_);
    return top_;
  }
  //! Bytes asked for that did not fit and came from the heap instead.
  std::size_t spilled_bytes() const {
    const std::scoped_lock lock(mutex_);
    return spilled_;
  }

private:
  mpi::shared_window window_;
  mutable std::mutex mutex_;
  std::size_t top_ = 0;
  std::size_t live_ = 0;
  std::size_t spilled_ = 0;
  bool closed_ = false;
};

//! A standard allocator from a `shared_arena`, falling back to the heap when the arena is full.
//! Keeps its arena's bookkeeping alive as long as memory it gave may be given back; the window
//! itself goes with the communicator that made it, which must outlive the use of that memory.
template <class T>
class shared_allocator {
public:
  using value_type = T;
  // A container moved or swapped takes its memory's arena along.
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  explicit shared_allocator(std::shared_ptr<shared_arena> arena) noexcept
      : arena_(std::move(arena)) {}
  template <class U>
  shared_allocator(const shared_allocator<U>& other) noexcept // NOLINT: rebinding is implicit
      : arena_(other.arena()) {}

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw std::bad_array_new_length();
    }
    if (void* p = arena_->allocate(n * sizeof(T), alignof(T))) {
      return static_cast<T*>(p);
    }
    return std::allocator<T>{}.allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (!arena_->deallocate(p, n * sizeof(T))) {
      std::allocator<T>{}.deallocate(p, n);
    }
  }

  const std::shared_ptr<shared_arena>& arena() const noexcept { return arena_; }

  template <class U>
  bool operator==(const shared_allocator<U>& other) const noexcept {
    return arena_ == other.arena();
  }

private:
  std::shared_ptr<shared_arena> arena_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
