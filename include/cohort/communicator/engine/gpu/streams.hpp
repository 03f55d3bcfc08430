// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <optional>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! cohort's own stream beside the user's: cohort's work starts after what the user's stream has
//! queued (the gradients are ready) and the user's stream continues after cohort's work (the
//! optimizer sees reduced gradients), with events, never a device-wide synchronisation. Created
//! at first use, on the device current then.
//!
//! Events, because cohort's stream is non-blocking: CUDA's legacy default stream synchronizes
//! with the blocking streams of its context but not with non-blocking ones ("Stream
//! synchronization behavior" in the CUDA runtime API), and a user's stream set with
//! `set_user_stream` is ordered with nothing implicitly. cudaStreamWaitEvent makes all later work
//! of one stream wait for the work an event captured on another, on the device.
class device_streams {
public:
  //! The stream the user's work is queued on (the legacy default stream unless set).
  void set_user_stream(cudaStream_t user) noexcept { user_ = user; }
  cudaStream_t user_stream() const noexcept { return user_; }

  //! cohort's stream, ordered after everything queued so far on the user's stream.
  cudaStream_t begin() {
    if (!own_) {
      // All three or none: a failure to create one leaves nothing half made for the next call.
      own_.emplace();
    }
    own_->ready.record(user_);
    own_->ready.make_wait(own_->stream.get());
    return own_->stream.get();
  }

  //! The event that marks the end of the user's work queued before cohort's (after `begin`).
  const cuda::event& started() const { return own_->ready; }

  //! Orders the user's stream after cohort's work; returns the event that marks its end.
  const cuda::event& end() {
    own_->done.record(own_->stream.get());
    own_->done.make_wait(user_);
    return own_->done;
  }

  //! `work(stream)` queued on cohort's stream between `begin` and `end`; returns `end`'s event.
  template <class Work>
  const cuda::event& run(Work&& work) {
    work(begin());
    return end();
  }

  //! Blocks the host until cohort's work is done.
  void synchronize() const {
    if (own_) {
      own_->stream.synchronize();
    }
  }

private:
  struct owned {
    cuda::stream stream;
    cuda::event ready;
    cuda::event done;
  };

  cudaStream_t user_ = nullptr;
  std::optional<owned> own_;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
