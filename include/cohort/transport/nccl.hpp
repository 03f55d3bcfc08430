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

//! An NCCL communicator over the ranks of an MPI communicator, on the device that is current when
//! it is created (the caller picks it, e.g. with cuda::select_device(comm.intra_rank())).
//! Destroyed in the right order: the work it issued is finished (or aborted) first.
class communicator {
public:
  communicator() = default;

  //! Collective over `comm`: its rank 0 makes the unique id, Boost.MPI broadcasts it, and every
  //! rank joins with its MPI rank on the current device. The communicator is non-blocking, so
  //! that joining and every later call are waited for here with `limit` (0: no limit): a rank
  //! that never joins is a `timeout_error` on the others (after aborting), not a hang.
  explicit communicator(const boost::mpi::communicator& comm,
                        std::chrono::milliseconds limit = std::chrono::milliseconds(0))
      : device_(cuda::current_device())
      , limit_(limit) {
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
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t joined =
        ncclCommInitRankConfig(&handle_, comm.size(), root.id, comm.rank(), &config);
    if (joined != ncclSuccess && joined != ncclInProgress) {
      abort();
      check(joined, "ncclCommInitRankConfig");
    }
    complete(joined, "ncclCommInitRankConfig");
  }

  communicator(communicator&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr))
      , device_(other.device_)
      , limit_(other.limit_) {}
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      destroy_quietly();
      handle_ = std::exchange(other.handle_, nullptr);
      device_ = other.device_;
      limit_ = other.limit_;
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

  //! The end of every NCCL call on this (non-blocking) communicator: a call that returned
  //! `ncclInProgress` is polled until it has finished, within the time limit, before any other
  //! NCCL call may be made; an error throws, naming `call`.
  void complete(ncclResult_t result, std::string_view call) const {
    if (result != ncclInProgress) {
      check(result, call, handle_);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(get(), &state), "ncclCommGetAsyncError", handle_);
      if (state == ncclSuccess) {
        return;
      }
      if (state != ncclInProgress) {
        check(state, call, handle_);
      }
      if (limit_.count() > 0 && std::chrono::steady_clock::now() - start > limit_) {
        throw timeout_error("cohort: " + std::string(call) + " on rank " +
                            std::to_string(mpi::world_rank()) + " did not finish within " +
                            std::to_string(limit_.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

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
    ncclResult_t finalized = ncclCommFinalize(handle_);
    if (finalized == ncclInProgress) {
      try {
        complete(finalized, "ncclCommFinalize");
        finalized = ncclSuccess;
      } catch (const timeout_error&) {
        finalized = ncclInProgress;
      } catch (const engine_error& e) {
        finalized = static_cast<ncclResult_t>(e.code());
      }
    }
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
  std::chrono::milliseconds limit_{0};
};

//! Brackets NCCL calls into one group (one launch for many operations). `end(comm)`
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
  //! Ends the group, whose calls were all on `comm` (non-blocking: waited for there).
  void end(const communicator& comm) {
    open_ = false;
    comm.complete(ncclGroupEnd(), "ncclGroupEnd");
  }

private:
  bool open_ = true;
};

//! `recv = op over ranks of send` (in place when the pointers are equal), enqueued on `stream`.
inline void allreduce(const communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, reduce_op operation, cudaStream_t stream) {
  comm.complete(ncclAllReduce(send, recv, count, datatype(type), op(operation), comm.get(), stream),
                "ncclAllReduce");
}

//! `data` from `root` to every rank, enqueued on `stream`.
inline void broadcast(const communicator& comm, void* data, std::size_t count, dtype type, int root,
                      cudaStream_t stream) {
  comm.complete(ncclBroadcast(data, data, count, datatype(type), root, comm.get(), stream),
                "ncclBroadcast");
}

//! Every rank's `count` elements into `recv` (size * count), enqueued on `stream`.
inline void allgather(const communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, cudaStream_t stream) {
  comm.complete(ncclAllGather(send, recv, count, datatype(type), comm.get(), stream),
                "ncclAllGather");
}

//! Block r of the reduction of every rank's `send` (size * count) into rank r's `recv` (count).
inline void reduce_scatter(const communicator& comm, const void* send, void* recv,
                           std::size_t count, dtype type, reduce_op operation,
                           cudaStream_t stream) {
  comm.complete(
      ncclReduceScatter(send, recv, count, datatype(type), op(operation), comm.get(), stream),
      "ncclReduceScatter");
}

//! The reduction of every rank's `send` into `root`'s `recv`.
inline void reduce(const communicator& comm, const void* send, void* recv, std::size_t count,
                   dtype type, reduce_op operation, int root, cudaStream_t stream) {
  comm.complete(
      ncclReduce(send, recv, count, datatype(type), op(operation), root, comm.get(), stream),
      "ncclReduce");
}

//! Point to point, enqueued on `stream` (pair them in a group_guard to exchange both ways).
inline void send(const communicator& comm, const void* data, std::size_t count, dtype type,
                 int peer, cudaStream_t stream) {
  comm.complete(ncclSend(data, count, datatype(type), peer, comm.get(), stream), "ncclSend");
}
inline void recv(const communicator& comm, void* data, std::size_t count, dtype type, int peer,
                 cudaStream_t stream) {
  comm.complete(ncclRecv(data, count, datatype(type), peer, comm.get(), stream), "ncclRecv");
}

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
