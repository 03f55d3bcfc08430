// SPDX-License-Identifier: Apache-2.0
#pragma once

// The watchdog of every rank: one thread per process that ends the job when a blocking MPI call
// of cohort's has waited longer than its communicator's timeout, and says so, without ending it,
// once the call has waited longer than the stall warning (then after 2, 4, 8... times as long).
// Blocking collectives stay blocking (MPI's non-blocking ones are 1.3-1.8x slower here:
// bench/allreduce), so a thread other than the one waiting must watch the clock. The waiting thread
// publishes what it waits for in a `watch_slot` (a clock read and a few relaxed stores per call);
// the watchdog reads the slots a few times per timeout and makes no MPI call but MPI_Abort.

#include <cohort/config.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

using watch_clock = std::chrono::steady_clock;

//! What `end_job` runs first, with its message, if set: the trace recorders write what they hold
//! there (trace/recorder.hpp), so that the trace of a job cohort ends keeps its last second.
using end_job_hook = void (*)(const std::string& message) noexcept;
inline std::atomic<end_job_hook>& end_job_hook_slot() noexcept {
  static std::atomic<end_job_hook> hook{nullptr};
  return hook;
}

//! Prints `message` as one line on stderr and ends the whole job with a non-zero code. Used where
//! the other ranks cannot be released any other way (a rank gone, a rank stalled past the
//! timeout). Under Open MPI's mpirun the process exits at once: mpirun ends a job one of whose
//! ranks exits without MPI_Finalize, while its MPI_Abort path was seen here to leave mpirun hanging
//! when several ranks abort together and another is inside MPI_Finalize. Elsewhere MPI_Abort, the
//! standard way, after 100 ms per world rank (at most 2 s) so that the lowest rank aborts alone,
//! and with a fallback: should MPI_Abort not end this process within 10 s, it exits by itself.
[[noreturn]] inline void end_job(const std::string& message) noexcept {
  if (const end_job_hook hook = end_job_hook_slot().load()) {
    hook(message);
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  // The lowest rank first: Open MPI's launcher was seen to hang when ranks ended together while
  // another was inside MPI_Finalize.
  if (const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200) *
                                std::min(std::max(std::atoi(world_rank), 0), 10));
  }
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
      MPI_Initialized(&initialized) == MPI_SUCCESS && initialized != 0 &&
      MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::this_thread::sleep_for(std::chrono::milliseconds(100) * std::min(std::max(rank, 0), 20));
    try {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(1);
      }).detach();
    } catch (...) {
      // Without the fallback, MPI_Abort alone.
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::_Exit(1);
}

//! "12.3 s", for messages.
COHORT_DECL std::string describe_seconds(watch_clock::duration d);

//! What one thread is waiting for in a blocking MPI call: written by that thread, read by the
//! watchdog. All relaxed atomics: the watchdog only needs a recent view, never a consistent one.
struct watch_slot {
  std::atomic<watch_clock::rep> since{0}; //!< when the call began; 0 while not waiting
  std::atomic<const char*> operation{nullptr};
  std::atomic<std::uint64_t> sequence{0};
  std::atomic<std::size_t> bytes{0};
  //! Whether every rank had passed the agreement check of this call: then all had arrived, and
  //! the stall is inside the transfer.
  std::atomic<bool> agreed{false};
  //! Stall warnings printed in this call so far (the watchdog's: reset when a call begins).
  std::atomic<unsigned> warnings{0};
  watch_clock::duration timeout{};
  watch_clock::duration stall_warning{};
  int rank = -1;

  bool watched() const noexcept { return timeout.count() > 0 || stall_warning.count() > 0; }
};

//! This process's host name, for messages ("rank 3 (host2)"): what Open MPI's
//! MPI_Get_processor_name returns too, but readable from any thread.
COHORT_DECL const std::string& host_name();

//! The thread that watches every registered slot.
class watchdog {
public:
  static watchdog& instance() {
    static watchdog dog;
    return dog;
  }

  //! Starts watching `slot` (watched()). The thread starts on first use.
  void add(watch_slot* slot);

  void remove(watch_slot* slot) noexcept;

  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;

private:
  watchdog() = default;
  ~watchdog() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_one();
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  void loop();

  static std::string describe(const watch_slot& slot, watch_clock::duration waited);
  static std::string describe_stall(const watch_slot& slot, watch_clock::duration waited);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<watch_slot*> slots_;
  bool stop_ = false;
  std::thread thread_;
};

//! Marks `slot` as waiting for the duration of one blocking call. Without a timeout (a slot not
//! watched) it does nothing.
class watch_scope {
public:
  watch_scope(watch_slot& slot, const char* operation, std::uint64_t sequence, std::size_t bytes,
              bool agreed) noexcept
      : slot_(slot.watched() ? &slot : nullptr) {
    if (slot_ != nullptr) {
      slot_->warnings.store(0, std::memory_order_relaxed);
      slot_->operation.store(operation, std::memory_order_relaxed);
      slot_->sequence.store(sequence, std::memory_order_relaxed);
      slot_->bytes.store(bytes, std::memory_order_relaxed);
      slot_->agreed.store(agreed, std::memory_order_relaxed);
      slot_->since.store(watch_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
  }
  ~watch_scope() {
    if (slot_ != nullptr) {
      slot_->since.store(0, std::memory_order_relaxed);
    }
  }
  watch_scope(const watch_scope&) = delete;
  watch_scope& operator=(const watch_scope&) = delete;

private:
  watch_slot* slot_;
};

//! A slot registered with the watchdog for its lifetime (not movable: the watchdog holds its
//! address).
class registered_slot {
public:
  registered_slot(std::chrono::milliseconds timeout, std::chrono::milliseconds stall_warning,
                  int rank) {
    slot_.timeout = std::chrono::duration_cast<watch_clock::duration>(timeout);
    slot_.stall_warning = std::chrono::duration_cast<watch_clock::duration>(stall_warning);
    slot_.rank = rank;
    if (slot_.watched()) {
      watchdog::instance().add(&slot_);
    }
  }
  ~registered_slot() {
    if (slot_.watched()) {
      watchdog::instance().remove(&slot_);
    }
  }
  registered_slot(const registered_slot&) = delete;
  registered_slot& operator=(const registered_slot&) = delete;

  watch_slot& get() noexcept { return slot_; }

private:
  watch_slot slot_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/detail/impl/watchdog.ipp>
#endif
