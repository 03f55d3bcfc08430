// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checks every cohort call runs before anything moves, in one place: this rank's own
// argument checks (argument_checks.hpp), turned into a problem the ranks agree on instead of an
// exception that would leave the others waiting; the agreement itself (which is also the rendezvous
// that notices a rank gone or stuck, see liveness.hpp); the watch over the blocking transfer that
// follows; and what happens when a transfer fails after the ranks agreed to run it. Not a template:
// compiled once whatever the strategy.

#include <cohort/communicator/engine/argument_checks.hpp>
#include <cohort/communicator/engine/signature.hpp>
#include <cohort/communicator/engine/waiter.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/watch_slot.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
class trace_recorder;
namespace engine {
class liveness;

//! Throws `error` unless MPI is running.
COHORT_DECL void require_mpi();

//! Runs a call's local checks and returns what they found ("" when the arguments are good)
//! instead of throwing: a rank with bad input must still take part in the agreement, or the
//! others would wait for it in the collective. Whatever a check throws (a thread that cannot
//! start, memory that cannot be had) is found so, not only bad arguments.
template <class Checks>
std::string local_checks(Checks&& checks) {
  try {
    checks();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

//! A communicator's rendezvous, its options and the checks built on them. Owns the liveness
//! behind a pointer: the watchdog thread reads its watch slots, which must stay put when the
//! communicator moves. (cohort's reduction thread reads this object itself, so a communicator
//! abandons a pending reduction before it moves.) The liveness and the trace recorder are only
//! declared here, and the agreement is reached through the functions below, not its templates:
//! with COHORT_SEPARATE_COMPILATION, where those are compiled once (impl/checks.ipp), a trainer's
//! translation unit does not parse the liveness, the agreement, the watchdog, the control
//! channel or the trace recorder. (Header-only, impl/checks.ipp brings them all.)
class checks : public argument_checks {
public:
  checks(const boost::mpi::communicator& comm, const communicator_options& options);
  ~checks();
  checks(checks&&) noexcept;
  checks& operator=(checks&&) noexcept;

  liveness& live() const noexcept { return *live_; }
  const communicator_options& options() const noexcept { return options_; }

  //! The end of every front door: the ranks compare `hash` and whether each found a problem; a
  //! mismatch throws `mismatch_error` everywhere (`describe()` says what this rank passed), and a
  //! problem found on any rank throws there. Without the agreement check a problem throws at
  //! once, on its own rank only.
  template <class Describe>
  void settle(const char* operation, std::uint64_t hash, Describe&& describe,
              const std::string& problem, std::size_t bytes = 0) const {
    settle_at(waiter::caller, options_.check_agreement, operation, hash, describe_ref(describe),
              problem, bytes);
  }

  //! `settle` at the rendezvous of thread `who`, whatever check_agreement says (cohort's thread
  //! calls it only with the check on).
  template <class Describe = std::nullptr_t>
  void settle_on(waiter who, const char* operation, std::uint64_t hash, const std::string& problem,
                 Describe&& describe = nullptr, std::size_t bytes = 0) const {
    settle_at(who, true, operation, hash, describe_ref(describe), problem, bytes);
  }

  //! `settle` for a call on one tensor: its count, its dtype and one integer detail (the op, the
  //! root) named `detail_name`.
  void agree(const char* operation, std::size_t count, dtype type, int detail_value,
             std::string_view detail_name, const std::string& problem = {}) const;

  //! `agree` for a call with blocks of any size: every count (one per rank), the dtype and one
  //! integer detail; `bytes` is what the call moves.
  void agree_on_counts(const char* operation, std::span<const std::size_t> counts, dtype type,
                       int detail_value, std::string_view detail_name, const std::string& problem,
                       std::size_t bytes) const;

  //! `agree` for an all-reduce of `data` with `op`, which it may do itself: with the check on,
  //! data of at most liveness::max_carried_bytes travels in the agreement's own messages and is
  //! reduced there (one round trip instead of two), and the result is true: `data` holds the
  //! reduction. False: the ranks agreed, and `data` is still to be reduced. `problem` as `agree`.
  bool agree_reducing(const char* operation, tensor_view data, reduce_op op,
                      const std::string& problem) const;

  //! `settle` for a call whose only arguments to compare are a root rank and, for an object
  //! collective, the object's type (`object_type`, a name; none when null).
  void agree_root(const char* operation, int root, const char* object_type = nullptr) const;

  //! The strategy (its name and its type's) and every option, compared across ranks once when a
  //! communicator is made, whatever check_agreement says (ranks that disagree on it could not
  //! even agree to compare later). Throws `mismatch_error` on every rank naming the option.
  //! Starts the trace (communicator_options::trace_directory, or COHORT_TRACE) first: a rank
  //! that cannot write its file is a problem every rank hears of here.
  void agree_on_options(std::string_view strategy, std::string_view strategy_type);

  //! This rank's trace, or null when tracing is off or paused.
  trace_recorder* trace() const noexcept;
  //! This rank's trace, paused or not (null when tracing is off).
  trace_recorder* trace_file() const noexcept { return trace_.get(); }

  //! Throws `error` unless MPI was started with MPI_THREAD_MULTIPLE, which a reduction on
  //! cohort's own thread needs.
  void require_thread_multiple() const;

  //! A blocking call after the rendezvous, watched by the watchdog.
  detail::watch_scope watch_transfer(const char* operation, std::size_t bytes,
                                     waiter who = waiter::caller) const noexcept;
  //! A blocking point-to-point call: no rendezvous precedes it.
  detail::watch_scope watch_point_to_point(const char* operation, std::size_t bytes) const noexcept;

  //! Runs a transfer every rank agreed to run. If it throws on this rank, the others are inside
  //! collectives this rank will not finish, and no error can reach them: the job ends, naming
  //! this rank and the cause, instead of hanging.
  template <class F>
  void fatal_on_failure(const char* operation, F&& f) const {
    try {
      f();
    } catch (const std::exception& e) {
      if (size() == 1) {
        throw;
      }
      end_job_after_failure(operation, e);
    }
  }

private:
  template <class Describe>
  static describe_fn describe_ref(Describe& describe) {
    if constexpr (std::is_invocable_v<Describe&>) {
      return std::ref(describe);
    } else {
      return {};
    }
  }

  // settle's and settle_on's: the next rendezvous of `who`; its agreement if `agree`; `problem`
  // thrown.
  void settle_at(waiter who, bool agree, const char* operation, std::uint64_t hash,
                 const describe_fn& describe, const std::string& problem, std::size_t bytes) const;
  // The ranks compare `hash` and whether each found a problem (`describe`, if any, says what
  // this rank passed).
  void agree_on_problems(waiter who, const char* operation, std::uint64_t sequence,
                         std::uint64_t hash, const describe_fn& describe,
                         const std::string& problem) const;
  [[noreturn]] void end_job_after_failure(const char* operation, const std::exception& e) const;

  // `options` with the timeout and the stall warning that apply (COHORT_TIMEOUT,
  // COHORT_STALL_WARNING, or the defaults, where unset). A bad variable goes to `problem`,
  // thrown on every rank by agree_on_options.
  static communicator_options with_waits(communicator_options options, std::string& problem);

  std::string waits_problem_;
  communicator_options options_; // timeout and stall_warning always set
  std::unique_ptr<liveness> live_;
  std::unique_ptr<trace_recorder> trace_;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/checks.ipp>
#endif
