// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/trace/event.hpp>

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The thread that reduces a step's buckets while the caller goes on with backward: the caller
//! launches buckets by raising a watermark, the worker reduces them strictly in order (every rank
//! issues the same collectives in the same order, so they match), and `wait` returns once every
//! launched bucket is done. Progress never depends on the caller calling back into cohort: the
//! worker makes the blocking MPI calls itself, as Horovod's background thread does.
//!
//! `Owner::reduce_bucket(std::size_t)` does the work; the owner is named anew at each `start`, so
//! the communicator may be moved between steps. An exception out of `reduce_bucket` must be one
//! every rank throws at the same bucket (the owner's agreement check): the rest are then skipped
//! on every rank alike, and `wait` rethrows. Other failures the owner keeps to itself and carries
//! into the next agreement.
template <class Owner>
class overlap_worker {
public:
  overlap_worker()
      : thread_([this] {
        this_trace_thread() = trace_thread::reducer;
        loop();
      }) {}

  ~overlap_worker() {
    {
      // Buckets already launched still run: the other ranks are in their collectives.
      std::unique_lock lock(mutex_);
      done_changed_.wait(lock, [&] { return done_ == launched_; });
      stop_ = true;
    }
    work_.notify_one();
    thread_.join();
  }

  overlap_worker(const overlap_worker&) = delete;
  overlap_worker& operator=(const overlap_worker&) = delete;

  //! Begins a step: nothing launched yet. Only when the previous step has been waited on.
  void start(Owner& owner) {
    const std::lock_guard lock(mutex_);
    owner_ = &owner;
    launched_ = 0;
    done_ = 0;
    failure_ = nullptr;
  }

  //! Lets the worker reduce buckets [0, up_to).
  void launch(std::size_t up_to) {
    {
      const std::lock_guard lock(mutex_);
      if (up_to <= launched_) {
        return;
      }
      launched_ = up_to;
    }
    work_.notify_one();
  }

  //! Whether every launched bucket is reduced (never blocks).
  bool idle() {
    const std::lock_guard lock(mutex_);
    return done_ == launched_;
  }

  //! Blocks until every launched bucket is reduced; rethrows the first failure.
  void wait() {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [&] { return done_ == launched_; });
    if (failure_) {
      std::exception_ptr failure = std::exchange(failure_, nullptr);
      lock.unlock();
      std::rethrow_exception(failure);
    }
  }

private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || done_ < launched_; });
      if (stop_) {
        return;
      }
      const std::size_t b = done_;
      const bool skip = failure_ != nullptr;
      Owner* owner = owner_;
      lock.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          owner->reduce_bucket(b);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      lock.lock();
      if (failure) {
        failure_ = failure;
      }
      ++done_;
      done_changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_changed_;
  Owner* owner_ = nullptr;
  std::size_t launched_ = 0;
  std::size_t done_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_; // last: started once everything above exists
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
