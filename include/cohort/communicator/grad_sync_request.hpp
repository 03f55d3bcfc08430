// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <cstddef>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A gradient reduction in flight (from `begin_allreduce_grad` or `iallreduce_grad`): `ready(i)`
//! says that parameter i's gradient is final (its bucket is reduced as soon as it is full and the
//! buckets before it are on their way); `wait()` marks the rest ready and returns when every
//! gradient is reduced, rethrowing any error. The gradients must not be touched between `ready`
//! and `wait`. Destroying a request that was not waited on waits for it, and an error is then
//! lost: call `wait()`.
template <class Communicator, class Params>
class grad_sync_request {
public:
  grad_sync_request(Communicator& comm, Params& params) noexcept
      : comm_(&comm)
      , params_(&params) {}

  grad_sync_request(grad_sync_request&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr))
      , params_(other.params_) {}
  grad_sync_request& operator=(grad_sync_request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      comm_ = std::exchange(other.comm_, nullptr);
      params_ = other.params_;
    }
    return *this;
  }
  ~grad_sync_request() { finish_quietly(); }

  //! Parameter `index` (its position in the parameter set) has its final gradient. Its gradient
  //! tensor is read again now, so it may have been (re)allocated since the reduction began, as
  //! long as its size and dtype are the same.
  void ready(std::size_t index) { comm_->grad_ready(*params_, index); }

  //! Waits for the whole reduction. Collective.
  void wait() { std::exchange(comm_, nullptr)->wait_grad_sync(); }

  bool pending() const noexcept { return comm_ != nullptr; }

private:
  void finish_quietly() noexcept {
    if (comm_ != nullptr) {
      try {
        std::exchange(comm_, nullptr)->wait_grad_sync();
      } catch (...) {
        // A destructor may not throw; wait() is where errors are reported.
      }
    }
  }

  Communicator* comm_;
  Params* params_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
