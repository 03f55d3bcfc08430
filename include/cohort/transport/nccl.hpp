// SPDX-License-Identifier: Apache-2.0
#pragma once

// Thin RAII bindings to NCCL: a communicator bootstrapped over MPI (the root's ncclUniqueId
// broadcast by MPI), dtype and op mapping, a group guard, errors as exceptions with NCCL's own
// messages, and completion with a time limit: a call that does not finish in time, or that NCCL
// reports an error for, aborts the communicator (ncclCommAbort) and throws, instead of leaving the
// ranks hanging. The NCCL pages cited are those of the user guide,
// docs.nvidia.com/deeplearning/nccl/user-guide/docs/ (usage/ and api/).

#include <cohort/config.hpp>
#include <cohort/detail/poll_backoff.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi.hpp>
#include <cohort/transport/nccl_datatype.hpp>
#include <cohort/transport/nccl_error.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace nccl {

//! An NCCL communicator over the ranks of an MPI communicator, on the device that is current when
//! it is created (the caller picks it, e.g. with cuda::select_device(comm.intra_rank())).
//!
//! It is non-blocking (ncclConfig_t::blocking = 0), so that every NCCL call returns at once and is
//! waited for here, within the time limit: a call that fails, or still runs at the limit, aborts
//! the communicator (ncclCommAbort) before throwing, which ends this rank's part of the work its
//! peers wait in. NCCL's fault-tolerance guide asks for exactly this: a communicator that may have
//! to be aborted must be non-blocking, or a thread can stay stuck inside NCCL for ever.
class communicator {
public:
  communicator() = default;

  //! Collective over `comm`: its rank 0 makes the unique id, MPI broadcasts it, and every rank
  //! joins with its MPI rank on the current device. A rank without a current device is an
  //! `invalid_argument` on every rank, naming it. Joining is waited for with `limit` (0: no
  //! limit): a rank that never joins is a `timeout_error` on the others, after aborting, not a
  //! hang. The same limit bounds every later wait. The MPI steps of the set-up (the unique id's
  //! broadcast, the device check) are watched with `mpi_limit` (the communicator's host timeout,
  //! see communicator_options::timeout): past it, the job ends naming them.
  explicit communicator(const boost::mpi::communicator& comm,
                        std::chrono::milliseconds limit = std::chrono::milliseconds(0),
                        std::chrono::milliseconds mpi_limit = std::chrono::milliseconds(0))
      : communicator(shared_id(comm, mpi_limit), comm.size(), comm.rank(), limit) {}

  //! Joins the communicator of `id` as rank `rank` of `size`, on the current device: for a
  //! caller that hands out the id itself. Throws as above; whatever NCCL created is aborted if
  //! joining fails.
  communicator(const ncclUniqueId& id, int size, int rank,
               std::chrono::milliseconds limit = std::chrono::milliseconds(0))
      : device_(cuda::current_device())
      , limit_(limit) {
    if (device_ < 0) {
      throw invalid_argument("cohort: NCCL communicator on rank " + std::to_string(rank) +
                             ": no current CUDA device");
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // From here the handle is a member: if joining throws, its destructor aborts it.
    complete(ncclCommInitRankConfig(handle_.out(), size, id, rank, &config),
             "ncclCommInitRankConfig");
  }

  communicator(communicator&& other) noexcept
      : handle_(std::move(other.handle_))
      , device_(other.device_)
      , limit_(other.limit_) {}
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      destroy_quietly();
      handle_ = std::move(other.handle_);
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
    if (handle_.get() == nullptr) {
      throw error("cohort: NCCL communicator used after it was destroyed or aborted (rank " +
                  std::to_string(mpi::world_rank()) + ")");
    }
    return handle_.get();
  }
  bool valid() const noexcept { return handle_.get() != nullptr; }
  int device() const noexcept { return device_; }
  std::chrono::milliseconds limit() const noexcept { return limit_; }

  //! The end of every NCCL call on this (non-blocking) communicator: a call that returned
  //! `ncclInProgress` is polled until it has finished, within the time limit, before any other
  //! NCCL call may be made. A fatal error, an asynchronous one or the time limit aborts the
  //! communicator, then throws (`engine_error`, or `timeout_error`) naming `call`, the rank and
  //! the time waited; `ncclInvalidArgument` throws and leaves the communicator usable.
  void complete(ncclResult_t result, std::string_view call) {
    const auto start = std::chrono::steady_clock::now();
    const cohort::detail::poll_backoff backoff;
    for (;;) {
      const auto waited = since(start);
      switch (detail::next_after(result, past(waited, limit_))) {
      case detail::nccl_next::proceed:
        return;
      case detail::nccl_next::fail_intact:
        check(result, call, handle_.get());
        return;
      case detail::nccl_next::abort:
        fail(call, result, waited, limit_);
      case detail::nccl_next::poll:
        break;
      }
      backoff.pause();
      result = async_state(call, start);
    }
  }

  //! Throws if NCCL has recorded an asynchronous error (a peer lost, say), after aborting.
  void check_async() { poll_async("ncclCommGetAsyncError", std::chrono::steady_clock::now()); }

  //! Waits until the work recorded by `done` has finished, checking for asynchronous errors. Past
  //! `limit` (if positive) this rank's communicator is aborted, which ends its part of the
  //! collective, and `timeout_error` names the operation and the time waited. Each peer is
  //! released by its own deadline in the same way, or by NCCL's error for the lost peer (an abort
  //! here does not reach into the other processes).
  void wait(const cuda::event& done, std::chrono::milliseconds limit, std::string_view operation) {
    wait_from(std::chrono::steady_clock::now(), done, limit, operation);
  }

  //! The same, with the limit counted from when `started` has finished (the user's work queued
  //! before cohort's, which is not cohort's to time: a long backward pass must not count).
  void wait(const cuda::event& started, const cuda::event& done, std::chrono::milliseconds limit,
            std::string_view operation) {
    const auto queued = std::chrono::steady_clock::now();
    const cohort::detail::poll_backoff backoff;
    while (!finished(started, operation)) {
      poll_async(operation, queued);
      backoff.pause();
    }
    wait_from(std::chrono::steady_clock::now(), done, limit, operation);
  }

  //! Ends the communicator at once, abandoning its pending work (ncclCommAbort). Idempotent.
  void abort() noexcept { handle_.abort(); }

  //! Finishes the pending work and frees the communicator: once the work queued so far has been
  //! handed to the device (state ncclSuccess), ncclCommFinalize, polled within the time limit, then
  //! ncclCommDestroy, which is local and does not block once finalizing has succeeded ("Destroying
  //! a communicator", usage/communicators.html). An error, or the time limit, aborts it instead
  //! and throws. Idempotent: a second call (a "double free") does nothing.
  void destroy() {
    if (!valid()) {
      return;
    }
    try {
      const cuda::device_guard on(device_);
      wait_until_finalizable();
      complete(ncclCommFinalize(get()), "ncclCommFinalize");
      check(ncclCommDestroy(handle_.release()), "ncclCommDestroy");
    } catch (...) {
      abort(); // a communicator that cannot be finalized is still freed
      throw;
    }
  }

private:
  // Rank 0's unique id on every rank of `comm`, and every rank's word that it can join: a rank
  // without a device (or a rank 0 that could not make the id) fails every rank alike, naming it,
  // instead of leaving the others waiting for it in NCCL's initialisation.
  static ncclUniqueId shared_id(const boost::mpi::communicator& comm,
                                std::chrono::milliseconds mpi_limit) {
    struct {
      ncclResult_t made;
      ncclUniqueId id;
    } root{ncclSuccess, {}};
    if (comm.rank() == 0) {
      root.made = ncclGetUniqueId(&root.id);
    }
    // Blocking MPI calls that a rank which never comes would hang: the watchdog ends the job.
    cohort::detail::registered_slot slot(mpi_limit, std::chrono::milliseconds(0),
                                         cohort::mpi::world_rank());
    const cohort::detail::watch_scope watch(slot.get(), "NCCL set-up (unique id and devices)", 0,
                                            sizeof root, false);
    mpi::check(MPI_Bcast(&root, static_cast<int>(sizeof root), MPI_BYTE, 0, comm),
               "MPI_Bcast (ncclUniqueId)", comm);
    check(root.made, "ncclGetUniqueId (on rank 0)");
    int ready[2] = {cuda::current_device() >= 0 ? 1 : 0, comm.rank()};
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, ready, 1, MPI_2INT, MPI_MINLOC, comm),
               "MPI_Allreduce (NCCL devices)", comm);
    if (ready[0] == 0) {
      throw invalid_argument("cohort: NCCL communicator: rank " + std::to_string(ready[1]) +
                             " of " + std::to_string(comm.size()) +
                             " has no current CUDA device (pick one with cuda::select_device "
                             "before the first device collective)");
    }
    return root.id;
  }

  static std::chrono::milliseconds since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start);
  }
  static bool past(std::chrono::milliseconds waited, std::chrono::milliseconds limit) noexcept {
    return limit.count() > 0 && waited > limit;
  }

  // Aborts, then throws for `state`: a timeout_error for work still in progress, an engine_error
  // with NCCL's own words otherwise.
  [[noreturn]] void fail(std::string_view operation, ncclResult_t state,
                         std::chrono::milliseconds waited, std::chrono::milliseconds limit) {
    const int rank = mpi::world_rank();
    if (state == ncclInProgress) {
      abort();
      throw timeout_error(detail::timeout_message(operation, rank, limit, waited));
    }
    std::string message = ncclGetErrorString(state);
    if (const char* last = ncclGetLastError(handle_.get()); last != nullptr && *last != '\0') {
      message += std::string("; ") + last;
    }
    abort();
    throw engine_error("NCCL", std::string(operation), rank, static_cast<int>(state),
                       message + " (after " + std::to_string(waited.count()) +
                           " ms; the communicator was aborted) (device " + std::to_string(device_) +
                           ")");
  }

  // The communicator's asynchronous state; a failure to ask aborts and throws.
  ncclResult_t async_state(std::string_view operation,
                           std::chrono::steady_clock::time_point start) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(get(), &state);
    if (asked != ncclSuccess) {
      fail("ncclCommGetAsyncError during " + std::string(operation), asked, since(start), limit_);
    }
    return state;
  }

  // One look at the asynchronous state while waiting for `operation`: an error aborts and throws.
  void poll_async(std::string_view operation, std::chrono::steady_clock::time_point start) {
    const ncclResult_t state = async_state(operation, start);
    const auto next = detail::next_after(state, false);
    if (next == detail::nccl_next::abort || next == detail::nccl_next::fail_intact) {
      fail(operation, state, since(start), limit_);
    }
  }

  // Whether `e` has completed; a CUDA error there (the device failed under NCCL's kernels) aborts
  // the communicator too.
  bool finished(const cuda::event& e, std::string_view operation) {
    try {
      return e.done();
    } catch (const engine_error&) {
      abort();
      throw;
    } catch (const std::exception& e) {
      abort();
      throw error("cohort: " + std::string(operation) +
                  ": waiting for the device failed: " + e.what());
    } catch (...) {
      abort();
      throw error("cohort: " + std::string(operation) + ": waiting for the device failed");
    }
  }

  void wait_from(std::chrono::steady_clock::time_point start, const cuda::event& done,
                 std::chrono::milliseconds limit, std::string_view operation) {
    const cohort::detail::poll_backoff backoff;
    while (!finished(done, operation)) {
      poll_async(operation, start);
      const auto waited = since(start);
      if (past(waited, limit)) {
        fail(operation, ncclInProgress, waited, limit);
      }
      backoff.pause();
    }
  }

  // Polls until the communicator may be finalized (see detail::before_finalize); aborts and throws
  // if it may not.
  void wait_until_finalizable() {
    const auto start = std::chrono::steady_clock::now();
    const cohort::detail::poll_backoff backoff;
    for (;;) {
      const ncclResult_t state = async_state("ncclCommFinalize", start);
      const auto waited = since(start);
      switch (detail::before_finalize(state, past(waited, limit_))) {
      case detail::teardown::finalize:
        return;
      case detail::teardown::abort:
        fail("ncclCommFinalize (the work queued before it)", state, waited, limit_);
      case detail::teardown::poll:
        break;
      }
      backoff.pause();
    }
  }

  void destroy_quietly() noexcept {
    try {
      destroy();
    } catch (...) {
      abort(); // destroy() aborts on failure already; a destructor may not throw
    }
  }

  detail::nccl_handle handle_;
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
  //! Ends the group, whose calls were all on `comm`. On a non-blocking communicator ncclGroupEnd
  //! may return ncclInProgress while the kernels are still being handed to the streams ("Group
  //! Calls", usage/groups.html): waited for there, like any call.
  void end(communicator& comm) {
    open_ = false;
    comm.complete(ncclGroupEnd(), "ncclGroupEnd");
  }

private:
  bool open_ = true;
};

//! `recv = op over ranks of send` (in place when the pointers are equal), enqueued on `stream`.
inline void allreduce(communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, reduce_op operation, cudaStream_t stream) {
  comm.complete(ncclAllReduce(send, recv, count, datatype(type), op(operation), comm.get(), stream),
                "ncclAllReduce");
}

//! `data` from `root` to every rank, enqueued on `stream`.
inline void broadcast(communicator& comm, void* data, std::size_t count, dtype type, int root,
                      cudaStream_t stream) {
  comm.complete(ncclBroadcast(data, data, count, datatype(type), root, comm.get(), stream),
                "ncclBroadcast");
}

//! Every rank's `count` elements into `recv` (size * count), enqueued on `stream`.
inline void allgather(communicator& comm, const void* send, void* recv, std::size_t count,
                      dtype type, cudaStream_t stream) {
  comm.complete(ncclAllGather(send, recv, count, datatype(type), comm.get(), stream),
                "ncclAllGather");
}

//! Block r of the reduction of every rank's `send` (size * count) into rank r's `recv` (count).
inline void reduce_scatter(communicator& comm, const void* send, void* recv, std::size_t count,
                           dtype type, reduce_op operation, cudaStream_t stream) {
  comm.complete(
      ncclReduceScatter(send, recv, count, datatype(type), op(operation), comm.get(), stream),
      "ncclReduceScatter");
}

//! The reduction of every rank's `send` into `root`'s `recv`.
inline void reduce(communicator& comm, const void* send, void* recv, std::size_t count, dtype type,
                   reduce_op operation, int root, cudaStream_t stream) {
  comm.complete(
      ncclReduce(send, recv, count, datatype(type), op(operation), root, comm.get(), stream),
      "ncclReduce");
}

//! Point to point, enqueued on `stream` (pair them in a group_guard to exchange both ways).
inline void send(communicator& comm, const void* data, std::size_t count, dtype type, int peer,
                 cudaStream_t stream) {
  comm.complete(ncclSend(data, count, datatype(type), peer, comm.get(), stream), "ncclSend");
}
inline void recv(communicator& comm, void* data, std::size_t count, dtype type, int peer,
                 cudaStream_t stream) {
  comm.complete(ncclRecv(data, count, datatype(type), peer, comm.get(), stream), "ncclRecv");
}

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
