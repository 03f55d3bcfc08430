// SPDX-License-Identifier: Apache-2.0
#pragma once

// NCCL results as cohort's exceptions, and what follows a result: wait, go on, or abort the
// communicator (decisions kept apart from the calls, so that host tests run them), and the
// handle that aborts a communicator it drops. The NCCL pages cited are those of the user guide,
// docs.nvidia.com/deeplearning/nccl/user-guide/docs/ (usage/ and api/).

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi_error.hpp>

#include <nccl.h>

#include <chrono>
#include <string>
#include <string_view>
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

namespace detail {

//! What follows an NCCL result: the value a call returned, or the state ncclCommGetAsyncError
//! reports for a non-blocking communicator. NCCL's user guide ("Error handling and communicator
//! abort", usage/communicators.html) sorts the results so: ncclInProgress is polled with
//! ncclCommGetAsyncError until it turns into ncclSuccess, and no other NCCL call may be made on the
//! communicator meanwhile; after ncclInvalidArgument the call had no effect and the communicator
//! still works; every other error is fatal to the communicator, which must be ended with
//! ncclCommAbort. A call still in progress past the time limit is aborted as well: ncclCommAbort
//! is what ends this rank's part in work that waits for a peer that never comes.
enum class nccl_next {
  proceed,     //!< ncclSuccess
  poll,        //!< ncclInProgress, within the time limit
  fail_intact, //!< throw; the communicator is still usable
  abort,       //!< abort the communicator, then throw
};

constexpr nccl_next next_after(ncclResult_t result, bool past_limit) noexcept {
  switch (result) {
  case ncclSuccess:
    return nccl_next::proceed;
  case ncclInProgress:
    return past_limit ? nccl_next::abort : nccl_next::poll;
  case ncclInvalidArgument:
    return nccl_next::fail_intact;
  default:
    return nccl_next::abort;
  }
}

//! What a communicator's teardown does given its asynchronous state. Only a communicator in
//! ncclSuccess is finalized: ncclCommFinalize moves a communicator from ncclSuccess to
//! ncclInProgress ("Finalizing a communicator", usage/communicators.html), and while an earlier
//! call is still in progress no other NCCL call may be made (API reference,
//! ncclCommGetAsyncError). A communicator in error is aborted, not finalized: after an error
//! nothing can be assumed about the work queued on it, and the reference says to destroy it with
//! ncclCommAbort. One still in progress past the time limit is aborted too, since finalizing
//! waits for the peers.
enum class teardown { finalize, poll, abort };

constexpr teardown before_finalize(ncclResult_t state, bool past_limit) noexcept {
  if (state == ncclSuccess) {
    return teardown::finalize;
  }
  if (state == ncclInProgress && !past_limit) {
    return teardown::poll;
  }
  return teardown::abort;
}

//! The message of NCCL work that outlived its time limit: the operation, the rank, the limit and
//! how long this rank waited.
inline std::string timeout_message(std::string_view operation, int rank,
                                   std::chrono::milliseconds limit,
                                   std::chrono::milliseconds waited) {
  return "cohort: " + std::string(operation) + " on rank " + std::to_string(rank) +
         " did not finish within its time limit of " + std::to_string(limit.count()) +
         " ms (waited " + std::to_string(waited.count()) +
         " ms); the NCCL communicator was aborted";
}

//! Owns an ncclComm_t from the moment NCCL hands one out: dropping it (by an exception in a
//! constructor, say) aborts it, which frees it without waiting for the peers.
class nccl_handle {
public:
  nccl_handle() = default;
  nccl_handle(nccl_handle&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)) {}
  nccl_handle& operator=(nccl_handle&& other) noexcept {
    if (this != &other) {
      abort();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  nccl_handle(const nccl_handle&) = delete;
  nccl_handle& operator=(const nccl_handle&) = delete;
  ~nccl_handle() { abort(); }

  //! Where NCCL writes the handle it creates (the handle owned so far is aborted first).
  ncclComm_t* out() noexcept {
    abort();
    return &comm_;
  }
  ncclComm_t get() const noexcept { return comm_; }
  //! Gives the handle up, for a call that frees it.
  ncclComm_t release() noexcept { return std::exchange(comm_, nullptr); }
  void abort() noexcept {
    if (comm_ != nullptr) {
      (void)ncclCommAbort(std::exchange(comm_, nullptr));
    }
  }

private:
  ncclComm_t comm_ = nullptr;
};

} // namespace detail

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
