// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/trace/event.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The thread that reduces the buckets of a communicator's overlapped reductions while the
//! caller goes on with backward. Each reduction is a job of `total` buckets; the caller launches
//! a job's buckets by raising its watermark. Jobs run in the order they started (two optimizers'
//! reductions may be pending at once: a GAN's discriminator's and generator's), and a job's
//! buckets strictly in order, so that every rank issues the same collectives in the same order.
//! A job runs only once every job before it has all its buckets reduced. Progress never depends
//! on the caller calling back into cohort: the worker makes the blocking MPI calls itself, as
//! Horovod's background thread does.
//!
//! `Owner::reduce_bucket(std::size_t)` does the work. An exception out of it must be one every
//! rank throws at the same bucket (the owner's agreement check): the rest of that job is then
//! skipped on every rank alike, and `wait` rethrows. Other failures the owner keeps to itself
//! and carries into the next agreement.
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
      done_changed_.wait(lock, [&] { return next_runnable() == nullptr; });
      stop_ = true;
    }
    work_.notify_one();
    thread_.join();
  }

  overlap_worker(const overlap_worker&) = delete;
  overlap_worker& operator=(const overlap_worker&) = delete;

  //! Queues `owner`'s reduction of `total` buckets, nothing launched yet, after every job
  //! started before (one job per owner at a time: its previous one was closed).
  void start(Owner& owner, std::size_t total) {
    const std::lock_guard lock(mutex_);
    jobs_.push_back(job{&owner, total, 0, 0, nullptr});
  }

  //! Lets the worker reduce `owner`'s buckets [0, up_to).
  void launch(const Owner& owner, std::size_t up_to) {
    {
      const std::lock_guard lock(mutex_);
      job* j = find(owner);
      if (j == nullptr || up_to <= j->launched) {
        return;
      }
      j->launched = std::min(up_to, j->total);
    }
    work_.notify_one();
  }

  //! Whether every launched bucket of `owner`'s job is done (never blocks). A bucket is done
  //! when `reduce_bucket` returns, which for a reduce it left in flight (grad_sync) is before its
  //! gradient is reduced: the gradients are all reduced once every bucket is launched and done.
  bool idle(const Owner& owner) {
    const std::lock_guard lock(mutex_);
    const job* j = find(owner);
    return j == nullptr || j->done == j->launched;
  }

  //! The owner of a job started before `owner`'s whose buckets are not all launched yet (its
  //! gradients still to come), or null: `owner`'s job would wait for it.
  const Owner* waiting_before(const Owner& owner) {
    const std::lock_guard lock(mutex_);
    for (const job& j : jobs_) {
      if (j.owner == &owner) {
        return nullptr;
      }
      if (j.launched < j.total) {
        return j.owner;
      }
    }
    return nullptr;
  }

  //! Blocks until every launched bucket of `owner`'s job is done (see `idle`); rethrows its first
  //! failure (`rethrow`), or keeps it for the next `wait`. The job stays queued until `close`.
  void wait(const Owner& owner, bool rethrow = true) {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [&] {
      const job* j = find(owner);
      return j == nullptr || j->done == j->launched;
    });
    job* j = find(owner);
    if (rethrow && j != nullptr && j->failure) {
      std::exception_ptr failure = std::exchange(j->failure, nullptr);
      lock.unlock();
      std::rethrow_exception(failure);
    }
  }

  //! Forgets `owner`'s job once waited on (every bucket launched and reduced).
  void close(const Owner& owner) noexcept {
    const std::lock_guard lock(mutex_);
    std::erase_if(jobs_, [&](const job& j) { return j.owner == &owner; });
  }

private:
  struct job {
    Owner* owner;
    std::size_t total;
    std::size_t launched;
    std::size_t done;
    std::exception_ptr failure;
  };

  // `owner`'s job, or null once closed. (A handful of jobs at most: one per optimizer with a
  // reduction pending.)
  job* find(const Owner& owner) {
    const auto it = std::ranges::find_if(jobs_, [&](const job& j) { return j.owner == &owner; });
    return it != jobs_.end() ? &*it : nullptr;
  }

  // The first job not reduced whole, if it has a launched bucket to reduce; else null (nothing
  // may run: a later job waits for the earlier ones).
  job* next_runnable() {
    for (job& j : jobs_) {
      if (j.done < j.total) {
        return j.done < j.launched ? &j : nullptr;
      }
    }
    return nullptr;
  }

  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      job* j = nullptr;
      work_.wait(lock, [&] {
        j = next_runnable();
        return stop_ || j != nullptr;
      });
      if (stop_) {
        return;
      }
      const std::size_t b = j->done;
      const bool skip = j->failure != nullptr;
      Owner* owner = j->owner;
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
      job* now = find(*owner); // (the vector may have moved meanwhile: a job started; a job is
                               // closed only once its launched buckets are done)
      if (failure) {
        now->failure = failure;
      }
      ++now->done;
      done_changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_changed_;
  std::vector<job> jobs_; // in the order they started; the capacity stays (no allocation a step)
  bool stop_ = false;
  std::thread thread_; // last: started once everything above exists
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
