// SPDX-License-Identifier: Apache-2.0
#pragma once

// Thin bindings to MPI through Boost.MPI: dtype and op mapping, errors as exceptions, RAII
// requests, and the tensor collectives on type-erased views that every MPI strategy shares.
// The communicator handle is Boost.MPI's; the tensor calls go to the MPI C API underneath it,
// because a tensor_view's element type is a run-time value that Boost.MPI's templates cannot
// take.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/archive/archive_exception.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/exception.hpp>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

//! The rank of the calling process in `comm`, or -1 if MPI cannot tell (used in messages only).
inline int rank_of(MPI_Comm comm) noexcept {
  int rank = -1;
  if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) {
    return -1;
  }
  return rank;
}

//! The rank of this process in MPI_COMM_WORLD, or -1 before MPI_Init and after MPI_Finalize: what
//! errors of other engines (CUDA, NCCL) name as "the rank".
inline int world_rank() noexcept {
  int initialized = 0;
  int finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || initialized == 0 ||
      MPI_Finalized(&finalized) != MPI_SUCCESS || finalized != 0) {
    return -1;
  }
  return rank_of(MPI_COMM_WORLD);
}

//! Turns an MPI return code into an `engine_error` naming the operation, the rank and MPI's own
//! message.
inline void check(int code, std::string_view operation, MPI_Comm comm) {
  if (code == MPI_SUCCESS) {
    return;
  }
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, message, &length) != MPI_SUCCESS) {
    length = 0;
  }
  throw engine_error("MPI", std::string(operation), rank_of(comm), code,
                     std::string(message, static_cast<std::size_t>(length)));
}

//! The number of ranks of `comm`.
inline int comm_size(MPI_Comm comm) {
  int size = 0;
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size", comm);
  return size;
}

//! Runs a Boost.MPI call and turns its `boost::mpi::exception` into an `engine_error`.
//! A Boost.Serialization failure (an archive that cannot be read) becomes a `cohort::error` too.
template <class F>
decltype(auto) translate(std::string_view operation, const boost::mpi::communicator& comm, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const boost::mpi::exception& e) {
    throw engine_error("MPI", std::string(operation), rank_of(comm), e.result_code(), e.what());
  } catch (const boost::archive::archive_exception& e) {
    throw error("cohort: " + std::string(operation) + " on rank " + std::to_string(rank_of(comm)) +
                ": serialization failed: " + e.what());
  }
}

namespace detail {
// MPI has no 16-bit float types or ops: fp16 and bf16 travel as committed 2-byte types and are
// reduced by user ops that compute in float, one rounding per pairwise step as MPI's own do.
template <class Half, class Combine>
void half_op(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = Half(Combine{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
struct plus {
  float operator()(float a, float b) const noexcept { return a + b; }
};
struct times {
  float operator()(float a, float b) const noexcept { return a * b; }
};
struct minimum {
  float operator()(float a, float b) const noexcept { return std::min(a, b); }
};
struct maximum {
  float operator()(float a, float b) const noexcept { return std::max(a, b); }
};

struct half_handles {
  MPI_Datatype float16_type = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16_type = MPI_DATATYPE_NULL;
  MPI_Op float16_ops[4] = {};
  MPI_Op bfloat16_ops[4] = {};

  half_handles() {
    check(MPI_Type_contiguous(2, MPI_BYTE, &float16_type), "MPI_Type_contiguous", MPI_COMM_WORLD);
    check(MPI_Type_commit(&float16_type), "MPI_Type_commit", MPI_COMM_WORLD);
    check(MPI_Type_contiguous(2, MPI_BYTE, &bfloat16_type), "MPI_Type_contiguous", MPI_COMM_WORLD);
    check(MPI_Type_commit(&bfloat16_type), "MPI_Type_commit", MPI_COMM_WORLD);
    create<float16>(float16_ops);
    create<bfloat16>(bfloat16_ops);
  }

  template <class Half>
  static void create(MPI_Op (&ops)[4]) {
    check(MPI_Op_create(&half_op<Half, plus>, 1, &ops[0]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, times>, 1, &ops[1]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, minimum>, 1, &ops[2]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, maximum>, 1, &ops[3]), "MPI_Op_create", MPI_COMM_WORLD);
  }
};

// Created on first use, after MPI_Init; MPI releases them at MPI_Finalize.
inline const half_handles& halves() {
  static const half_handles handles;
  return handles;
}

constexpr int op_index(reduce_op op) noexcept {
  return static_cast<int>(op);
}
} // namespace detail

//! The MPI datatype of a dtype.
inline MPI_Datatype datatype(dtype type) {
  switch (type) {
  case dtype::float32:
    return MPI_FLOAT;
  case dtype::float64:
    return MPI_DOUBLE;
  case dtype::int32:
    return MPI_INT32_T;
  case dtype::int64:
    return MPI_INT64_T;
  case dtype::uint8:
    return MPI_UINT8_T;
  case dtype::float16:
    return detail::halves().float16_type;
  case dtype::bfloat16:
    return detail::halves().bfloat16_type;
  }
  throw invalid_argument("cohort: no MPI datatype for this dtype");
}

//! The MPI op of a reduction on a dtype (fp16 and bf16 have ops of their own).
inline MPI_Op op(reduce_op operation, dtype type) {
  if (type == dtype::float16) {
    return detail::halves().float16_ops[detail::op_index(operation)];
  }
  if (type == dtype::bfloat16) {
    return detail::halves().bfloat16_ops[detail::op_index(operation)];
  }
  switch (operation) {
  case reduce_op::sum:
    return MPI_SUM;
  case reduce_op::prod:
    return MPI_PROD;
  case reduce_op::min:
    return MPI_MIN;
  case reduce_op::max:
    return MPI_MAX;
  }
  throw invalid_argument("cohort: no MPI op for this reduction");
}

//! Makes every error on `comm` return a code instead of aborting, so that it becomes an exception.
inline void return_errors(MPI_Comm comm) {
  check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", comm);
}

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
void for_each_chunk(std::size_t count, std::size_t element_size, F&& f) {
  if (count == 0) {
    f(std::size_t{0}, 0);
    return;
  }
  const std::size_t limit = chunk_limit();
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

//! In-place all-reduce of `data` over `comm`.
inline void allreduce(MPI_Comm comm, tensor_view data, reduce_op operation) {
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Allreduce(MPI_IN_PLACE, detail::bytes(data.data, offset), n, type, reduction, comm),
          "MPI_Allreduce", comm);
  });
}

//! Non-blocking in-place all-reduce.
inline request iallreduce(MPI_Comm comm, tensor_view data, reduce_op operation) {
  request pending(comm, "MPI_Iallreduce");
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Iallreduce(MPI_IN_PLACE, detail::bytes(data.data, offset), n, type, reduction, comm,
                         pending.add()),
          "MPI_Iallreduce", comm);
  });
  return pending;
}

//! Broadcast of `data` from `root`.
inline void broadcast(MPI_Comm comm, tensor_view data, int root) {
  const MPI_Datatype type = datatype(data.type);
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    check(MPI_Bcast(detail::bytes(data.data, offset), n, type, root, comm), "MPI_Bcast", comm);
  });
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
inline void reduce(MPI_Comm comm, tensor_view data, reduce_op operation, int root) {
  const MPI_Datatype type = datatype(data.type);
  const MPI_Op reduction = op(operation, data.type);
  const bool at_root = rank_of(comm) == root;
  detail::for_each_chunk(data.count, size_of(data.type), [&](std::size_t offset, int n) {
    void* buffer = detail::bytes(data.data, offset);
    check(MPI_Reduce(at_root ? MPI_IN_PLACE : buffer, at_root ? buffer : nullptr, n, type,
                     reduction, root, comm),
          "MPI_Reduce", comm);
  });
}

//! All-gather: `out` holds `in.count * size` elements, rank r's block at `r * in.count`.
inline void allgather(MPI_Comm comm, const_tensor_view in, tensor_view out) {
  const MPI_Datatype type = datatype(in.type);
  if (in.count > static_cast<std::size_t>(INT_MAX)) {
    throw invalid_argument("cohort: MPI_Allgather of more than INT_MAX elements per rank");
  }
  const int n = static_cast<int>(in.count);
  check(MPI_Allgather(in.data, n, type, out.data, n, type, comm), "MPI_Allgather", comm);
}

//! Non-blocking all-gather.
inline request iallgather(MPI_Comm comm, const_tensor_view in, tensor_view out) {
  request pending(comm, "MPI_Iallgather");
  const MPI_Datatype type = datatype(in.type);
  if (in.count > static_cast<std::size_t>(INT_MAX)) {
    throw invalid_argument("cohort: MPI_Iallgather of more than INT_MAX elements per rank");
  }
  const int n = static_cast<int>(in.count);
  check(MPI_Iallgather(in.data, n, type, out.data, n, type, comm, pending.add()), "MPI_Iallgather",
        comm);
  return pending;
}

//! Reduce-scatter: `in` holds `out.count * size` elements; rank r gets the reduction of block r.
inline void reduce_scatter(MPI_Comm comm, const_tensor_view in, tensor_view out,
                           reduce_op operation) {
  if (out.count > static_cast<std::size_t>(INT_MAX)) {
    throw invalid_argument("cohort: MPI_Reduce_scatter_block of more than INT_MAX elements");
  }
  check(MPI_Reduce_scatter_block(in.data, out.data, static_cast<int>(out.count), datatype(in.type),
                                 op(operation, in.type), comm),
        "MPI_Reduce_scatter_block", comm);
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
