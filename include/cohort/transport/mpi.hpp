// SPDX-License-Identifier: Apache-2.0
#pragma once

// Thin bindings to MPI through Boost.MPI: RAII requests and the tensor collectives on type-erased
// views that every MPI strategy shares (errors: mpi_error.hpp; dtypes and ops: mpi_datatype.hpp).
// The communicator handle is Boost.MPI's; the tensor calls go to the MPI C API underneath it,
// because a tensor_view's element type is a run-time value that Boost.MPI's templates cannot
// take.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi_datatype.hpp>
#include <cohort/transport/mpi_error.hpp>

#include <boost/mpi/communicator.hpp>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

//! A pending non-blocking operation. Waits in its destructor if still pending, because MPI may
//! still write into the tensor: let it go out of scope only once the tensor may be written.
//! One MPI request is held inline (no allocation); only a tensor of more than INT_MAX elements,
//! sent in several chunks, needs more.
class request {
public:
  request() = default;
  request(MPI_Comm comm, std::string_view operation)
      : comm_(comm)
      , operation_(operation) {}
  request(request&& other) noexcept { swap(other); }
  request& operator=(request&& other) noexcept {
    request moved(std::move(other));
    swap(moved);
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() {
    if (pending()) {
      MPI_Waitall(count(), handles(), MPI_STATUSES_IGNORE);
    }
  }

  //! Blocks until the operation has finished; throws `engine_error` if it failed.
  void wait() {
    if (!pending()) {
      return;
    }
    const int code = MPI_Waitall(count(), handles(), MPI_STATUSES_IGNORE);
    clear();
    check(code, operation_, comm_);
  }

  //! Whether the operation has finished (and if so, the request is done); never blocks.
  bool test() {
    if (!pending()) {
      return true;
    }
    int done = 0;
    check(MPI_Testall(count(), handles(), &done, MPI_STATUSES_IGNORE), operation_, comm_);
    if (done != 0) {
      clear();
    }
    return done != 0;
  }

  bool pending() const noexcept { return used_ != 0; }

  //! Where the next MPI call writes its request (one per chunk of at most INT_MAX elements).
  MPI_Request* add() {
    if (used_ == 0) {
      ++used_;
      return &first_;
    }
    if (used_ == 1) {
      more_.assign(1, first_);
    }
    ++used_;
    return &more_.emplace_back(MPI_REQUEST_NULL);
  }

private:
  int count() const noexcept { return static_cast<int>(used_); }
  MPI_Request* handles() noexcept { return used_ == 1 ? &first_ : more_.data(); }
  void clear() noexcept {
    used_ = 0;
    first_ = MPI_REQUEST_NULL;
    more_.clear();
  }
  void swap(request& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(operation_, other.operation_);
    std::swap(first_, other.first_);
    std::swap(more_, other.more_);
    std::swap(used_, other.used_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string_view operation_ = "request";
  MPI_Request first_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> more_;
  std::size_t used_ = 0;
};

namespace detail {
// MPI counts are int: a tensor of more than INT_MAX elements goes in several calls. Tests lower
// the limit (`chunk_limit() = 7`) to run the chunked paths on tiny tensors.
inline std::size_t& chunk_limit() noexcept {
  static std::size_t limit = static_cast<std::size_t>(INT_MAX);
  return limit;
}

template <class F>
void for_each_chunk(std::size_t count, std::size_t element_size, F&& f, std::size_t max_bytes = 0) {
  if (count == 0) {
    f(std::size_t{0}, 0);
    return;
  }
  const std::size_t limit =
      max_bytes == 0 ? chunk_limit()
                     : std::min(chunk_limit(), std::max<std::size_t>(1, max_bytes / element_size));
  for (std::size_t begin = 0; begin < count; begin += limit) {
    const std::size_t n = std::min(limit, count - begin);
    f(begin * element_size, static_cast<int>(n));
  }
}

inline const std::byte* bytes(const void* p, std::size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}
inline std::byte* bytes(void* p, std::size_t offset) {
  return static_cast<std::byte*>(p) + offset;
}
} // namespace detail

//! The largest piece `allreduce` hands MPI by default (communicator_options::segment_bytes).
inline constexpr std::size_t default_segment_bytes = std::size_t{1} << 20;

//! In-place all-reduce of `data` over `comm`, in segments of at most `segment_bytes` (0: whole).
//! Past a few MiB, Open MPI's all-reduce takes a temporary buffer as large as the message and
//! leaves the cache: one 32 MiB call costs 4x what 32 calls of 1 MiB do (bench/allreduce).
inline void allreduce(MPI_Comm comm, tensor_view data, reduce_op operation,
                      std::size_t segment_bytes = default_segment_bytes) {
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  detail::for_each_chunk(
      data.count, size_of(data.type),
      [&](std::size_t offset, int n) {
        check(
            MPI_Allreduce(MPI_IN_PLACE, detail::bytes(data.data, offset), n, type, reduction, comm),
            "MPI_Allreduce", comm);
      },
      segment_bytes);
}

//! Non-blocking in-place all-reduce, in segments of at most `segment_bytes` (0: whole), all
//! started at once.
inline request iallreduce(MPI_Comm comm, tensor_view data, reduce_op operation,
                          std::size_t segment_bytes = 0) {
  request pending(comm, "MPI_Iallreduce");
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  detail::for_each_chunk(
      data.count, size_of(data.type),
      [&](std::size_t offset, int n) {
        check(MPI_Iallreduce(MPI_IN_PLACE, detail::bytes(data.data, offset), n, type, reduction,
                             comm, pending.add()),
              "MPI_Iallreduce", comm);
      },
      segment_bytes);
  return pending;
}

//! Broadcast of `data` from `root`, in segments of at most `segment_bytes` (0: whole).
inline void broadcast(MPI_Comm comm, tensor_view data, int root, std::size_t segment_bytes = 0) {
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(
      data.count, size_of(data.type),
      [&](std::size_t offset, int n) {
        check(MPI_Bcast(detail::bytes(data.data, offset), n, type, root, comm), "MPI_Bcast", comm);
      },
      segment_bytes);
}

//! Non-blocking broadcast.
inline request ibroadcast(MPI_Comm comm, tensor_view data, int root) {
  request pending(comm, "MPI_Ibcast");
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Ibcast(detail::bytes(data.data, offset), n, type, root, comm, pending.add()),
          "MPI_Ibcast", comm);
  });
  return pending;
}

//! In-place reduction of every rank's `data` into `root`'s (the others' `data` is left as it was).
inline void reduce(MPI_Comm comm, tensor_view data, reduce_op operation, int root,
                   std::size_t segment_bytes = 0) {
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  const bool at_root = rank_of(comm) == root;
  detail::for_each_chunk(
      data.count, size_of(data.type),
      [&](std::size_t offset, int n) {
        void* buffer = detail::bytes(data.data, offset);
        check(MPI_Reduce(at_root ? MPI_IN_PLACE : buffer, at_root ? buffer : nullptr, n, type,
                         reduction, root, comm),
              "MPI_Reduce", comm);
      },
      segment_bytes);
}

//! Non-blocking `reduce`: the whole of `data` at once (in chunks of at most INT_MAX elements).
//! Several in flight to different roots share the links that one reduce after another leaves
//! idle (bench/results/multihost-sharding-*.txt).
inline request ireduce(MPI_Comm comm, tensor_view data, reduce_op operation, int root) {
  request pending(comm, "MPI_Ireduce");
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  const bool at_root = rank_of(comm) == root;
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    void* buffer = detail::bytes(data.data, offset);
    check(MPI_Ireduce(at_root ? MPI_IN_PLACE : buffer, at_root ? buffer : nullptr, n, type,
                      reduction, root, comm, pending.add()),
          "MPI_Ireduce", comm);
  });
  return pending;
}

namespace detail {
// One MPI call's count is an int: more is an error naming the call, the rank and the count.
inline int single_call_count(MPI_Comm comm, std::size_t count, const char* call) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw invalid_argument("cohort: " + std::string(call) + " on rank " +
                           std::to_string(rank_of(comm)) + ": " + std::to_string(count) +
                           " elements per rank, more than one MPI call takes (INT_MAX, " +
                           std::to_string(INT_MAX) + ")");
  }
  return static_cast<int>(count);
}
} // namespace detail

//! All-gather: `out` holds `in.count * size` elements, rank r's block at `r * in.count`.
inline void allgather(MPI_Comm comm, const_tensor_view in, tensor_view out) {
  const MPI_Datatype type = datatype(in.type);
  const int n = detail::single_call_count(comm, in.count, "MPI_Allgather");
  check(MPI_Allgather(in.data, n, type, out.data, n, type, comm), "MPI_Allgather", comm);
}

//! Non-blocking all-gather.
inline request iallgather(MPI_Comm comm, const_tensor_view in, tensor_view out) {
  request pending(comm, "MPI_Iallgather");
  const MPI_Datatype type = datatype(in.type);
  const int n = detail::single_call_count(comm, in.count, "MPI_Iallgather");
  check(MPI_Iallgather(in.data, n, type, out.data, n, type, comm, pending.add()), "MPI_Iallgather",
        comm);
  return pending;
}

//! Reduce-scatter: `in` holds `out.count * size` elements; rank r gets the reduction of block r.
inline void reduce_scatter(MPI_Comm comm, const_tensor_view in, tensor_view out,
                           reduce_op operation) {
  const int n = detail::single_call_count(comm, out.count, "MPI_Reduce_scatter_block");
  check(MPI_Reduce_scatter_block(in.data, out.data, n, datatype(in.type), op(operation, in.type),
                                 comm),
        "MPI_Reduce_scatter_block", comm);
}

//! Reduce-scatter with blocks of any size: `in` holds the sum of `counts` elements; rank r gets
//! the reduction of its block (counts[r] elements, after the blocks of the ranks before it).
inline void reduce_scatter(MPI_Comm comm, const_tensor_view in, tensor_view out,
                           std::span<const int> counts, reduce_op operation) {
  check(MPI_Reduce_scatter(in.data, out.data, counts.data(), datatype(in.type),
                           op(operation, in.type), comm),
        "MPI_Reduce_scatter", comm);
}

//! Reduce-scatter in place, with blocks of any size: `data` holds the sum of `counts` elements;
//! rank r's block (counts[r] elements, after the blocks of the ranks before it), reduced, is left
//! at the front of `data` on rank r (MPI_IN_PLACE); the rest of `data` is undefined.
inline void reduce_scatter_in_place(MPI_Comm comm, tensor_view data, std::span<const int> counts,
                                    reduce_op operation) {
  check(MPI_Reduce_scatter(MPI_IN_PLACE, data.data, counts.data(), datatype(data.type),
                           op(operation, data.type), comm),
        "MPI_Reduce_scatter", comm);
}

//! All-gather with blocks of any size: `out` holds rank r's block (counts[r] elements) at
//! `displacements[r]`.
inline void allgather(MPI_Comm comm, const_tensor_view in, tensor_view out,
                      std::span<const int> counts, std::span<const int> displacements) {
  const MPI_Datatype type = datatype(in.type);
  check(MPI_Allgatherv(in.data, counts[static_cast<std::size_t>(rank_of(comm))], type, out.data,
                       counts.data(), displacements.data(), type, comm),
        "MPI_Allgatherv", comm);
}

//! Gather: `root`'s `out` holds `in.count * size` elements, rank r's block at `r * in.count`;
//! `out` is not read elsewhere.
inline void gather(MPI_Comm comm, const_tensor_view in, tensor_view out, int root) {
  const MPI_Datatype type = datatype(in.type);
  const int n = detail::single_call_count(comm, in.count, "MPI_Gather");
  check(MPI_Gather(in.data, n, type, out.data, n, type, root, comm), "MPI_Gather", comm);
}

//! Scatter: `root`'s `in` holds `out.count * size` elements; rank r gets block r. `in` is not read
//! elsewhere.
inline void scatter(MPI_Comm comm, const_tensor_view in, tensor_view out, int root) {
  const MPI_Datatype type = datatype(out.type);
  const int n = detail::single_call_count(comm, out.count, "MPI_Scatter");
  check(MPI_Scatter(in.data, n, type, out.data, n, type, root, comm), "MPI_Scatter", comm);
}

//! All-to-all: `in` and `out` hold `size` blocks of `count` elements; block q of `in` goes to rank
//! q, and block q of `out` comes from rank q.
inline void alltoall(MPI_Comm comm, const_tensor_view in, tensor_view out, std::size_t count) {
  const MPI_Datatype type = datatype(in.type);
  const int n = detail::single_call_count(comm, count, "MPI_Alltoall");
  check(MPI_Alltoall(in.data, n, type, out.data, n, type, comm), "MPI_Alltoall", comm);
}

//! Blocking send of `data` to `dest`.
inline void send(MPI_Comm comm, const_tensor_view data, int dest, int tag) {
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Send(detail::bytes(data.data, offset), n, type, dest, tag, comm), "MPI_Send", comm);
  });
}

//! Non-blocking send.
inline request isend(MPI_Comm comm, const_tensor_view data, int dest, int tag) {
  request pending(comm, "MPI_Isend");
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Isend(detail::bytes(data.data, offset), n, type, dest, tag, comm, pending.add()),
          "MPI_Isend", comm);
  });
  return pending;
}

//! Blocking receive into `data` from `source`. The message is probed first: one of another size
//! is left queued (nothing is lost) and `invalid_argument` names both sizes.
inline void recv(MPI_Comm comm, tensor_view data, int source, int tag) {
  const MPI_Datatype type = datatype(data.type);
  bool first = true;
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    MPI_Status status;
    check(MPI_Probe(source, tag, comm, &status), "MPI_Probe", comm);
    int incoming = 0;
    check(MPI_Get_count(&status, type, &incoming), "MPI_Get_count", comm);
    if (incoming != n) {
      const std::size_t expected = first ? data.count : static_cast<std::size_t>(n);
      throw invalid_argument(
          "cohort: recv on rank " + std::to_string(rank_of(comm)) + " from rank " +
          std::to_string(status.MPI_SOURCE) + " (tag " + std::to_string(status.MPI_TAG) +
          "): the message has " +
          (incoming == MPI_UNDEFINED ? std::string("a size that is not a whole number of")
                                     : std::to_string(incoming)) +
          " " + std::string(to_string(data.type)) + " elements but the tensor has " +
          std::to_string(expected) + "; the message is left queued");
    }
    first = false;
    check(MPI_Recv(detail::bytes(data.data, offset), n, type, status.MPI_SOURCE, status.MPI_TAG,
                   comm, MPI_STATUS_IGNORE),
          "MPI_Recv", comm);
  });
}

//! Non-blocking receive (no size check: the size is only known once the message has arrived).
inline request irecv(MPI_Comm comm, tensor_view data, int source, int tag) {
  request pending(comm, "MPI_Irecv");
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Irecv(detail::bytes(data.data, offset), n, type, source, tag, comm, pending.add()),
          "MPI_Irecv", comm);
  });
  return pending;
}

} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
