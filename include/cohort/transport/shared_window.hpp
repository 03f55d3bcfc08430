// SPDX-License-Identifier: Apache-2.0
#pragma once

// Memory that the ranks of one node read and write directly: an MPI-3 shared-memory window
// (MPI_Win_allocate_shared), one segment per rank, each mapped into every rank's address space.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/transport/mpi_error.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

//! Each rank's segment, which every rank of `node` may load from and store to (the ranks must
//! share memory: a communicator of `MPI_COMM_TYPE_SHARED`, or part of one): a zero-filled header
//! of `header_bytes` (for flags the ranks read before any has written them), then `bytes` of data,
//! touched by nobody until used (the pages are mapped only then). The segments are allocated apart
//! (`alloc_shared_noncontig`: each near its own rank's memory); header and data start on an
//! `alignment` boundary. Move-only; freeing is collective, as its making was: its owner frees it
//! at a point every rank reaches (`free()`), and the destructor frees it only if that has not
//! happened (and no exception is unwinding).
class shared_window {
public:
  static constexpr std::size_t alignment = 64;

  //! Collective over `node`.
  shared_window(MPI_Comm node, std::size_t header_bytes, std::size_t bytes)
      : header_bytes_(round_up(header_bytes))
      , bytes_(bytes) {
    check(MPI_Comm_rank(node, &rank_), "MPI_Comm_rank", node);
    check(MPI_Comm_size(node, &size_), "MPI_Comm_size", node);
    MPI_Info info = MPI_INFO_NULL;
    check(MPI_Info_create(&info), "MPI_Info_create", node);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* mine = nullptr;
    // One alignment more than asked for, so that the segment can start on the boundary whatever
    // the library returns.
    const int code = MPI_Win_allocate_shared(
        static_cast<MPI_Aint>(header_bytes_ + bytes + alignment), 1, info, node, &mine, &window_);
    MPI_Info_free(&info);
    check(code, "MPI_Win_allocate_shared (" + std::to_string(bytes) + " bytes per rank)", node);
    segments_.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      void* base = nullptr;
      check(MPI_Win_shared_query(window_, r, &size, &unit, &base), "MPI_Win_shared_query", node);
      segments_[static_cast<std::size_t>(r)] = align(static_cast<std::byte*>(base));
    }
    std::fill_n(header(rank_), header_bytes_, std::byte{0});
    // Every header is zero before any rank reads another's.
    check(MPI_Barrier(node), "MPI_Barrier (shared window made)", node);
  }

  shared_window(shared_window&& other) noexcept
      : window_(std::exchange(other.window_, MPI_WIN_NULL))
      , segments_(std::move(other.segments_))
      , header_bytes_(other.header_bytes_)
      , bytes_(other.bytes_)
      , rank_(other.rank_)
      , size_(other.size_) {}
  shared_window& operator=(shared_window&& other) noexcept {
    if (this != &other) {
      free();
      window_ = std::exchange(other.window_, MPI_WIN_NULL);
      segments_ = std::move(other.segments_);
      header_bytes_ = other.header_bytes_;
      bytes_ = other.bytes_;
      rank_ = other.rank_;
      size_ = other.size_;
    }
    return *this;
  }
  shared_window(const shared_window&) = delete;
  shared_window& operator=(const shared_window&) = delete;

  //! Frees the window (collective), unless an exception is unwinding this rank: the other ranks
  //! may not be coming, and a rank that waits for them here would hang instead of failing. The
  //! memory then goes with the process.
  ~shared_window() { free(); }

  //! Frees the window now (collective, as above); the segments' addresses stay known to
  //! `offset_of`, which never reads them.
  void free() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (window_ != MPI_WIN_NULL && finalized == 0 && std::uncaught_exceptions() == 0) {
      MPI_Win_free(&window_);
    }
    window_ = MPI_WIN_NULL;
  }
  //! Rank `r`'s header and data, in this process's address space.
  std::byte* header(int r) const noexcept { return segments_[static_cast<std::size_t>(r)]; }
  std::byte* data(int r) const noexcept { return header(r) + header_bytes_; }
  //! The data's size in each segment.
  std::size_t bytes() const noexcept { return bytes_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  //! Where `[p, p + n)` starts in this rank's data, if it lies wholly inside it.
  std::optional<std::size_t> offset_of(const void* p, std::size_t n) const noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    const auto begin = reinterpret_cast<std::uintptr_t>(data(rank_));
    if (at < begin || at - begin > bytes_ || n > bytes_ - (at - begin)) {
      return std::nullopt;
    }
    return at - begin;
  }

private:
  static std::size_t round_up(std::size_t n) noexcept {
    return (n + alignment - 1) / alignment * alignment;
  }
  static std::byte* align(std::byte* p) noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    return p + ((alignment - at % alignment) % alignment);
  }

  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> segments_;
  std::size_t header_bytes_ = 0;
  std::size_t bytes_ = 0;
  int rank_ = 0;
  int size_ = 1;
};

} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
