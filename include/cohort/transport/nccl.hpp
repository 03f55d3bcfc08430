// SPDX-License-Identifier: Apache-2.0
#pragma once

// Thin RAII bindings to NCCL: a communicator bootstrapped over MPI (the root's ncclUniqueId sent
// with Boost.MPI), dtype and op mapping, a group guard, errors as exceptions with NCCL's own
// messages, and completion with a time limit: a collective that does not finish in time, or that
// NCCL reports an asynchronous error for, aborts the communicator (ncclCommAbort) and throws,
// instead of leaving the ranks hanging.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace nccl {

//! Turns an NCCL result into an `engine_error` with NCCL's description and its last error text.
inline void check(ncclResult_t result, std::string_view call, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) {
    return;
  }
  std::string message = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') {
    message += std::string("; ") + last;
  }
  throw engine_error("NCCL", std::string(call), mpi::world_rank(), static_cast<int>(result),
                     message + " (device " + std::to_string(cuda::current_device()) + ")");
}

//! The NCCL datatype of a dtype: every dtype has one.
constexpr ncclDataType_t datatype(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return ncclFloat32;
  case dtype::float64:
    return ncclFloat64;
  case dtype::float16:
    return ncclFloat16;
  case dtype::bfloat16:
    return ncclBfloat16;
  case dtype::int32:
    return ncclInt32;
  case dtype::int64:
    return ncclInt64;
  case dtype::uint8:
    break;
  }
  return ncclUint8;
}

//! The NCCL reduction of a reduce_op.
constexpr ncclRedOp_t op(reduce_op operation) noexcept {
  switch (operation) {
  case reduce_op::prod:
    return ncclProd;
  case reduce_op::min:
    return ncclMin;
  case reduce_op::max:
    return ncclMax;
  case reduce_op::sum:
    break;
  }
  return ncclSum;
}

//! Brackets NCCL calls into one group (one launch for many point-to-point operations). `end()`
//! reports the group's error; the destructor ends a group left open by an exception.
class group_guard {
public:
  group_guard() { check(ncclGroupStart(), "ncclGroupStart"); }
  group_guard(const group_guard&) = delete;
  group_guard& operator=(const group_guard&) = delete;
  ~group_guard() {
    if (open_) {
      (void)ncclGroupEnd();
    }
  }
  void end() {
    open_ = false;
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

private:
  bool open_ = true;
};

//! An NCCL communicator over the ranks of an MPI communicator, on the device that is current when
//! it is created (the caller picks it, e.g. with cuda::select_device(comm.intra_rank())).
//! Destroyed in the right order: the work it issued is finished (or aborted) first.
class communicator {
public:
  communicator() = default;

  //! Collective over `comm`: its rank 0 makes the unique id, Boost.MPI broadcasts it, and every
  //! rank joins with its MPI rank on the current device.
  explicit communicator(const boost::mpi::communicator& comm)
      : device_(cuda::current_device()) {
    if (device_ < 0) {
      throw invalid_argument("cohort: NCCL communicator on rank " + std::to_string(comm.rank()) +
                             ": no current CUDA device");
    }
    // The root's id and whether it could make one travel together, so that a failure there is
    // an error on every rank instead of ranks waiting for an id that never comes.
    struct {
      ncclResult_t made;
      ncclUniqueId id;
    } root{ncclSuccess, {}};
    if (comm.rank() == 0) {
      root.made = ncclGetUniqueId(&root.id);
    }
    mpi::check(MPI_Bcast(&root, static_cast<int>(sizeof root), MPI_BYTE, 0, comm),
               "MPI_Bcast (ncclUniqueId)", comm);
    check(root.made, "ncclGetUniqueId (on rank 0)");
    check(ncclCommInitRank(&handle_, comm.size(), root.id, comm.rank()), "ncclCommInitRank");
  }

  communicator(communicator&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr))
      , device_(other.device_) {}
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      destroy_quietly();
      handle_ = std::exchange(other.handle_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  // Unwinding from an error, the peers may never finish the work this rank issued: abort rather
  // than finalize, which would wait for them.
  ~communicator() {
    if (std::uncaught_exceptions() > 0) {
      abort();
    } else {
      destroy_quietly();
    }
  }

  //! The handle, for NCCL calls; throws if the communicator was destroyed or aborted.
  ncclComm_t get() const {
    if (handle_ == nullptr) {
      throw error("cohort: NCCL communicator used after it was destroyed or aborted (rank " +
                  std::to_string(mpi::world_rank()) + ")");
    }
    return handle_;
  }
  bool valid() const noexcept { return handle_ != nullptr; }
  int device() const noexcept { return device_; }

  //! Throws if NCCL has recorded an asynchronous error (a peer lost, say), after aborting.
  void check_async() {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(get(), &state), "ncclCommGetAsyncError", handle_);
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string message =
          std::string(ncclGetErrorString(state)) + "; " + ncclGetLastError(handle_);
      abort();
      throw engine_error("NCCL", "asynchronous error", mpi::world_rank(), static_cast<int>(state),
                         message + " (communicator aborted)");
    }
  }

  //! Waits until the work recorded by `done` has finished, checking for asynchronous errors. Past
  //! `limit` (if positive) this rank's communicator is aborted, which ends its part of the
  //! collective, and `timeout_error` names the operation. Each peer is released by its own
  //! deadline in the same way (an abort here does not reach into the other processes).
  void wait(const cuda::event& done, std::chrono::milliseconds limit, std::string_view operation) {
    wait_from(std::chrono::steady_clock::now(), done, limit, operation);
  }

  //! The same, with the limit counted from when `started` has finished (the user's work queued
  //! before cohort's, which is not cohort's to time: a long backward pass must not count).
  void wait(const cuda::event& started, const cuda::event& done, std::chrono::milliseconds limit,
            std::string_view operation) {
    while (!started.done()) {
      check_async();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    wait_from(std::chrono::steady_clock::now(), done, limit, operation);
  }

private:
  void wait_from(std::chrono::steady_clock::time_point start, const cuda::event& done,
                 std::chrono::milliseconds limit, std::string_view operation) {
    while (!done.done()) {
      check_async();
      if (limit.count() > 0 && std::chrono::steady_clock::now() - start > limit) {
        abort();
        throw timeout_error("cohort: " + std::string(operation) + " on rank " +
                            std::to_string(mpi::world_rank()) + " did not finish within " +
                            std::to_string(limit.count()) +
                            " ms; the NCCL communicator was aborted");
      }
      // A step's wait covers the backward pass queued before it: poll gently, not a core's worth.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

public:
  //! Ends the communicator at once, abandoning its pending work (ncclCommAbort). Idempotent.
  void abort() noexcept {
    if (handle_ != nullptr) {
      (void)ncclCommAbort(std::exchange(handle_, nullptr));
    }
  }

  //! Finishes the pending work and frees the communicator. Idempotent: a second call (a "double
  //! free") does nothing.
  void destroy() {
    if (handle_ == nullptr) {
      return;
    }
    const cuda::device_guard on(device_);
    const ncclResult_t finalized = ncclCommFinalize(handle_);
    if (finalized != ncclSuccess) {
      const std::string message = ncclGetLastError(handle_);
      abort(); // a communicator that cannot be finalized is still freed
      throw engine_error("NCCL", "ncclCommFinalize", mpi::world_rank(), static_cast<int>(finalized),
                         std::string(ncclGetErrorString(finalized)) + "; " + message +
                             " (communicator aborted)");
    }
    check(ncclCommDestroy(std::exchange(handle_, nullptr)), "ncclCommDestroy");
  }

private:
  void destroy_quietly() noexcept {
    try {
      destroy();
    } catch (...) {
      abort();
    }
  }

  ncclComm_t handle_ = nullptr;
  int device_ = -1;
};

//! `recv = op over ranks of send` (in place when the pointers are equal), enqueued on `stream`.
inline void allreduce(const communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, reduce_op operation, cudaStream_t stream) {
  check(ncclAllReduce(send, recv, count, datatype(type), op(operation), comm.get(), stream),
        "ncclAllReduce", comm.get());
}

//! `data` from `root` to every rank, enqueued on `stream`.
inline void broadcast(const communicator& comm, void* data, std::size_t count, dtype type, int root,
                      cudaStream_t stream) {
  check(ncclBroadcast(data, data, count, datatype(type), root, comm.get(), stream), "ncclBroadcast",
        comm.get());
}

//! Every rank's `count` elements into `recv` (size * count), enqueued on `stream`.
inline void allgather(const communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, cudaStream_t stream) {
  check(ncclAllGather(send, recv, count, datatype(type), comm.get(), stream), "ncclAllGather",
        comm.get());
}

//! Block r of the reduction of every rank's `send` (size * count) into rank r's `recv` (count).
inline void reduce_scatter(const communicator& comm, const void* send, void* recv,
                           std::size_t count, dtype type, reduce_op operation,
                           cudaStream_t stream) {
  check(ncclReduceScatter(send, recv, count, datatype(type), op(operation), comm.get(), stream),
        "ncclReduceScatter", comm.get());
}

//! The reduction of every rank's `send` into `root`'s `recv`.
inline void reduce(const communicator& comm, const void* send, void* recv, std::size_t count,
                   dtype type, reduce_op operation, int root, cudaStream_t stream) {
  check(ncclReduce(send, recv, count, datatype(type), op(operation), root, comm.get(), stream),
        "ncclReduce", comm.get());
}

//! Point to point, enqueued on `stream` (pair them in a group_guard to exchange both ways).
inline void send(const communicator& comm, const void* data, std::size_t count, dtype type,
                 int peer, cudaStream_t stream) {
  check(ncclSend(data, count, datatype(type), peer, comm.get(), stream), "ncclSend", comm.get());
}
inline void recv(const communicator& comm, void* data, std::size_t count, dtype type, int peer,
                 cudaStream_t stream) {
  check(ncclRecv(data, count, datatype(type), peer, comm.get(), stream), "ncclRecv", comm.get());
}

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
