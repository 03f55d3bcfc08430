// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A gradient reduction in flight (from `begin_allreduce_grad` or `iallreduce_grad`): `ready(i)`
//! says that parameter i's gradient is final (its bucket is reduced as soon as it is full and the
//! buckets before it are on their way); `wait()` marks the rest ready and returns when every
//! gradient is reduced, rethrowing any error. The gradients must not be touched between `ready`
//! and `wait`. Destroying a request that was not waited on waits for it, and an error is then
//! lost: call `wait()`; destroyed by an exception unwinding the stack (backward failed), it
//! abandons the reduction instead (`abandon_grad_sync`): what was not marked ready is never sent. A
//! request belongs to one reduction: once that one is over (waited on here or through the
//! communicator), the request is done.
template <class Communicator, class Params>
class grad_sync_request {
public:
  grad_sync_request(Communicator& comm, Params& params) noexcept
      : comm_(&comm)
      , params_(&params)
      , generation_(comm.grad_sync_generation())
      , exceptions_(std::uncaught_exceptions()) {}

  grad_sync_request(grad_sync_request&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr))
      , params_(other.params_)
      , generation_(other.generation_)
      , exceptions_(other.exceptions_) {}
  grad_sync_request& operator=(grad_sync_request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      comm_ = std::exchange(other.comm_, nullptr);
      params_ = other.params_;
      generation_ = other.generation_;
      exceptions_ = other.exceptions_;
    }
    return *this;
  }
  ~grad_sync_request() { finish_quietly(); }

  //! Parameter `index` (its position in the parameter set) has its final gradient. Its gradient
  //! tensor is read again now, so it may have been (re)allocated since the reduction began, as
  //! long as its size and dtype are the same.
  void ready(std::size_t index) { current("ready").grad_ready(*params_, index); }

  //! Waits for the whole reduction. Collective.
  void wait() {
    Communicator& comm = current("wait");
    comm_ = nullptr;
    comm.wait_grad_sync();
  }

  //! Whether every gradient of this request's reduction is reduced (so that `wait()` would not
  //! wait for the transfers, only agree on the end of the step). Does not wait for transfers (it
  //! may wait for a step that is starting on another thread, while the ranks agree on it). True
  //! once waited.
  bool test() const { return !pending() || comm_->grad_sync_complete(); }

  //! Whether this request's reduction is still in flight.
  bool pending() const noexcept {
    return comm_ != nullptr && comm_->grad_sync_pending_at(generation_);
  }

private:
  Communicator& current(const char* operation) const {
    if (!pending()) {
      throw invalid_argument(std::string("cohort: grad_sync_request::") + operation +
                             ": this request's reduction is over (waited on already, or the "
                             "request was moved from)");
    }
    return *comm_;
  }

  void finish_quietly() noexcept {
    if (pending() && std::uncaught_exceptions() > exceptions_) {
      std::exchange(comm_, nullptr)
          ->abandon_grad_sync_for(nullptr,
                                  "its grad_sync_request was destroyed during the unwinding of an "
                                  "exception");
    }
    if (pending()) {
      try {
        std::exchange(comm_, nullptr)->wait_grad_sync();
      } catch (...) {
        // A destructor may not throw; wait() is where errors are reported.
      }
    }
    comm_ = nullptr;
  }

  Communicator* comm_;
  Params* params_;
  std::uint64_t generation_;
  int exceptions_; // in flight when the request was made: more at destruction means unwinding
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
