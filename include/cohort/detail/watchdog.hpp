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
#include <cohort/detail/watch_slot.hpp>

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
