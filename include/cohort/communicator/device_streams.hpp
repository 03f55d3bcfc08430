// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <optional>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! cohort's own stream beside the user's: cohort's work starts after what the user's stream has
//! queued (the gradients are ready) and the user's stream continues after cohort's work (the
//! optimizer sees reduced gradients), with events, never a device-wide synchronisation. Created
//! at first use, on the device current then.
class device_streams {
public:
  //! The stream the user's work is queued on (the legacy default stream unless set).
  void set_user_stream(cudaStream_t user) noexcept { user_ = user; }
  cudaStream_t user_stream() const noexcept { return user_; }

  //! cohort's stream, ordered after everything queued so far on the user's stream.
  cudaStream_t begin() {
    if (!own_) {
      own_.emplace();
      ready_.emplace();
      done_.emplace();
    }
    ready_->record(user_);
    ready_->make_wait(own_->get());
    return own_->get();
  }

  //! The event that marks the end of the user's work queued before cohort's (after `begin`).
  const cuda::event& started() const { return *ready_; }

  //! Orders the user's stream after cohort's work; returns the event that marks its end.
  const cuda::event& end() {
    done_->record(own_->get());
    done_->make_wait(user_);
    return *done_;
  }

  //! Blocks the host until cohort's work is done.
  void synchronize() const {
    if (own_) {
      own_->synchronize();
    }
  }

private:
  cudaStream_t user_ = nullptr;
  std::optional<cuda::stream> own_;
  std::optional<cuda::event> ready_;
  std::optional<cuda::event> done_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
