// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checks every cohort call runs before anything moves, in one place: this rank's own
// argument checks, turned into a problem the ranks agree on instead of an exception that would
// leave the others waiting; the agreement itself (which is also the rendezvous that notices a
// rank gone or stuck, see liveness.hpp); the watch over the blocking transfer that follows; and
// what happens when a transfer fails after the ranks agreed to run it. Not a template: compiled
// once whatever the strategy.

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/liveness.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! Throws `error` unless MPI is running.
inline void require_mpi() {
  if (!boost::mpi::environment::initialized() || boost::mpi::environment::finalized()) {
    throw error("cohort: MPI is not running: create a boost::mpi::environment before a "
                "cohort communicator, and keep it alive while the communicator is used");
  }
}

//! Runs a call's local checks and returns what they found ("" when the arguments are good)
//! instead of throwing: a rank with bad input must still take part in the agreement, or the
//! others would wait for it in the collective.
template <class Checks>
std::string local_checks(Checks&& checks) {
  try {
    checks();
    return {};
  } catch (const invalid_argument& e) {
    return e.what();
  }
}

//! A communicator's rendezvous, its options and the checks built on them. Owns the liveness
//! behind a pointer: the watchdog thread reads its watch slots, which must stay put when the
//! communicator moves. (cohort's reduction thread reads this object itself, so a communicator
//! abandons a pending reduction before it moves.)
class checks {
public:
  checks(const boost::mpi::communicator& comm, const communicator_options& options)
      : live_((require_mpi(), std::make_unique<liveness>(comm, options.timeout)))
      , options_(options) {}

  liveness& live() const noexcept { return *live_; }
  const communicator_options& options() const noexcept { return options_; }
  int rank() const noexcept { return live_->rank(); }
  int size() const noexcept { return live_->size(); }

  //! The end of every front door: the ranks compare `hash` and whether each found a problem; a
  //! mismatch throws `mismatch_error` everywhere (`describe()` says what this rank passed), and a
  //! problem found on any rank throws there. Without the agreement check a problem throws at
  //! once, on its own rank only.
  template <class Describe>
  void settle(const char* operation, std::uint64_t hash, Describe&& describe,
              const std::string& problem, std::size_t bytes = 0) const {
    const std::uint64_t sequence = live_->next_sequence(waiter::caller, bytes);
    if (options_.check_agreement) {
      agree_on_problems(waiter::caller, operation, sequence, hash, describe, problem);
    }
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  //! `settle` at the rendezvous of thread `who`, whatever check_agreement says (cohort's thread
  //! calls it only with the check on).
  template <class Describe = std::nullptr_t>
  void settle_on(waiter who, const char* operation, std::uint64_t hash, const std::string& problem,
                 Describe&& describe = nullptr, std::size_t bytes = 0) const {
    agree_on_problems(who, operation, live_->next_sequence(who, bytes), hash, describe, problem);
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  //! `settle` for a call on one tensor: its count, its dtype and one integer detail (the op, the
  //! root) named `detail_name`.
  void agree(const char* operation, std::size_t count, dtype type, int detail_value,
             std::string_view detail_name, const std::string& problem = {}) const {
    fingerprint f;
    f.add(operation).add(count).add(static_cast<std::uint64_t>(type));
    f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(detail_value)));
    settle(
        operation, f.value(),
        [&] {
          std::string described = describe_tensor(count, type);
          if (!detail_name.empty()) {
            described +=
                " (" + std::string(detail_name) + " " +
                (detail_name == "op" ? std::string(to_string(static_cast<reduce_op>(detail_value)))
                                     : std::to_string(detail_value)) +
                ")";
          }
          return std::vector<signature_entry>{{"the tensor", described}};
        },
        problem, count * size_of(type));
  }

  //! `settle` for a call whose only argument to compare is a root rank.
  void agree_root(const char* operation, int root) const {
    const std::string problem = local_checks([&] { check_root(root, operation); });
    fingerprint f;
    f.add(operation).add(static_cast<std::uint64_t>(root));
    settle(
        operation, f.value(),
        [&] {
          return std::vector<signature_entry>{{"the root", std::to_string(root)}};
        },
        problem);
  }

  //! The strategy (its name and its type's) and every option, compared across ranks once when a
  //! communicator is made, whatever check_agreement says (ranks that disagree on it could not
  //! even agree to compare later). Throws `mismatch_error` on every rank naming the option.
  void agree_on_options(std::string_view strategy, std::string_view strategy_type) const {
    int ranks_per_node = 0;
    const std::string problem = local_checks(
        [&] { ranks_per_node = ranks_per_node_override(options_.simulated_ranks_per_node); });
    const std::vector<std::pair<const char*, std::string>> values = {
        {"the strategy", std::string(strategy)},
        {"the strategy's type", std::string(strategy_type)},
        {"check_agreement", options_.check_agreement ? "true" : "false"},
        {"bucket_bytes", std::to_string(options_.bucket_bytes)},
        {"first_bucket_bytes", std::to_string(options_.first_bucket_bytes)},
        {"fusion_threshold_bytes", std::to_string(options_.fusion_threshold_bytes)},
        {"timeout", std::to_string(options_.timeout.count()) + " ms"},
        {"ranks per node (simulated_ranks_per_node or COHORT_RANKS_PER_NODE)",
         ranks_per_node == 0 ? std::string("as MPI says") : std::to_string(ranks_per_node)}};
    fingerprint f;
    for (const auto& [name, value] : values) {
      f.add(name).add(value);
    }
    f.add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    require_agreement(*live_, waiter::caller, "communicator creation",
                      live_->next_sequence(waiter::caller), f.value(), [&] {
                        std::vector<signature_entry> described;
                        if (!problem.empty()) {
                          described.push_back({"the call", "failed (" + problem + ")"});
                        }
                        for (const auto& [name, value] : values) {
                          described.push_back({name, value});
                        }
                        return described;
                      });
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  //! Throws `error` unless MPI was started with MPI_THREAD_MULTIPLE, which a reduction on
  //! cohort's own thread needs.
  void require_thread_multiple() const {
    int level = MPI_THREAD_SINGLE;
    mpi::check(MPI_Query_thread(&level), "MPI_Query_thread", MPI_COMM_WORLD);
    if (level < MPI_THREAD_MULTIPLE) {
      static constexpr const char* names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED",
                                              "MPI_THREAD_SERIALIZED"};
      throw error("cohort: overlapping allreduce_grad with backward on rank " +
                  std::to_string(rank()) +
                  " needs MPI started with MPI_THREAD_MULTIPLE (cohort reduces on a thread of "
                  "its own), and it was started with " +
                  std::string(level >= 0 && level < 3 ? names[level] : "a lower level") +
                  ": create the environment as boost::mpi::environment env(argc, argv, "
                  "boost::mpi::threading::multiple)");
    }
  }

  //! A blocking call after the rendezvous, watched by the watchdog.
  watch_scope watch_transfer(const char* operation, std::size_t bytes,
                             waiter who = waiter::caller) const noexcept {
    return watch_scope(live_->slot(who), operation, live_->sequence(who), bytes,
                       options_.check_agreement);
  }
  //! A blocking point-to-point call: no rendezvous precedes it.
  watch_scope watch_point_to_point(const char* operation, std::size_t bytes) const noexcept {
    return watch_scope(live_->slot(waiter::caller), operation, live_->sequence(waiter::caller),
                       bytes, false);
  }

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
      end_job("cohort: rank " + std::to_string(rank()) + ": " + operation +
              " failed inside its exchange, after the ranks agreed to run it (" + e.what() +
              "); the other ranks cannot finish its collectives; ending the job");
    }
  }

  void check_root(int root, std::string_view operation) const {
    check_rank(root, "root", operation);
  }
  void check_peer(int peer, std::string_view operation) const {
    check_rank(peer, "peer", operation);
  }
  void check_rank(int r, std::string_view role, std::string_view operation) const {
    if (r < 0 || r >= size()) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) + ": " + std::string(role) + " " +
                             std::to_string(r) + " is not a rank of this " +
                             std::to_string(size()) + "-rank communicator");
    }
  }

  //! `block` holds n elements and `whole` size() * n, of the same dtype.
  void check_blocks(const_tensor_view block, const_tensor_view whole,
                    std::string_view operation) const {
    const std::size_t expected = block.count * static_cast<std::size_t>(size());
    if (block.type != whole.type) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(rank()) +
          ": the per-rank tensor is " + std::string(to_string(block.type)) + " but the " +
          std::to_string(size()) + "-rank tensor is " + std::string(to_string(whole.type)));
    }
    if (whole.count != expected) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(rank()) +
          ": the per-rank tensor has " + std::to_string(block.count) + " elements, so the " +
          std::to_string(size()) + "-rank tensor needs " + std::to_string(expected) +
          ", but it has " + std::to_string(whole.count));
    }
  }

  //! Refuses device memory (`device == false`) or host memory (`device == true`), naming the
  //! strategies that take it.
  void require_location(memory_location location, bool device, std::string_view operation) const {
    if (device && location == memory_location::host) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": this strategy reduces GPU memory, and the tensor is in host "
                             "memory (use flat for host memory)");
    }
    if (!device && location == memory_location::device) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": this strategy reduces host memory only, and the tensor is in "
                             "device memory (use pure_nccl or host_staged)");
    }
  }

private:
  template <class Describe>
  void agree_on_problems(waiter who, const char* operation, std::uint64_t sequence,
                         std::uint64_t hash, Describe&& describe,
                         const std::string& problem) const {
    fingerprint f;
    f.add(hash).add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    require_agreement(*live_, who, operation, sequence, f.value(), [&] {
      if (!problem.empty()) {
        return std::vector<signature_entry>{{"the call", "failed (" + problem + ")"}};
      }
      if constexpr (std::is_invocable_v<Describe>) {
        return describe();
      } else {
        return std::vector<signature_entry>{{"the call", "good arguments"}};
      }
    });
  }

  std::unique_ptr<liveness> live_;
  communicator_options options_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
