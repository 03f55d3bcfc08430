// SPDX-License-Identifier: Apache-2.0
#pragma once

// What checks.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/agreement.hpp>
#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/trace/recorder.hpp>
#include <cohort/trace/span.hpp>

#include <boost/core/demangle.hpp>
#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL checks::checks(const boost::mpi::communicator& comm,
                           const communicator_options& options)
    // Braces: their elements are evaluated in order, so that MPI is known to run before the
    // rank and the size are asked of it (a call's arguments may be evaluated in any order).
    : argument_checks{(require_mpi(), comm.rank()), comm.size()}
    , options_(with_waits(options, waits_problem_))
    , live_(std::make_unique<liveness>(comm, *options_.timeout, *options_.stall_warning)) {}

COHORT_DECL checks::checks(checks&&) noexcept = default;
COHORT_DECL checks& checks::operator=(checks&&) noexcept = default;

COHORT_DECL trace_recorder* checks::trace() const noexcept {
  return trace_ && trace_->recording() ? trace_.get() : nullptr;
}

COHORT_DECL detail::watch_scope checks::watch_transfer(const char* operation, std::size_t bytes,
                                                       waiter who) const noexcept {
  return detail::watch_scope(live_->slot(who), operation, live_->sequence(who), bytes,
                             options_.check_agreement);
}

COHORT_DECL detail::watch_scope checks::watch_point_to_point(const char* operation,
                                                             std::size_t bytes) const noexcept {
  return detail::watch_scope(live_->slot(waiter::caller), operation,
                             live_->sequence(waiter::caller), bytes, false);
}

COHORT_DECL void checks::settle_at(waiter who, bool agree, const char* operation,
                                   std::uint64_t hash, const describe_fn& describe,
                                   const std::string& problem, std::size_t bytes) const {
  const std::uint64_t sequence = live_->next_sequence(who, bytes);
  if (agree) {
    agree_on_problems(who, operation, sequence, hash, describe, problem);
  }
  if (!problem.empty()) {
    throw invalid_argument(problem);
  }
}

COHORT_DECL void checks::agree_on_problems(waiter who, const char* operation,
                                           std::uint64_t sequence, std::uint64_t hash,
                                           const describe_fn& describe,
                                           const std::string& problem) const {
  detail::fingerprint f;
  f.add(hash).add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
  // (`who` names the rendezvous, not the thread: the end of an overlapped step settles at
  // the reducer's on the trainer's thread)
  trace_recorder* const trace = this->trace();
  const trace_span span(trace, "agreement",
                        trace != nullptr ? this_trace_thread() : trace_thread::trainer, 0, -1,
                        operation);
  engine::require_agreement(*live_, who, operation, sequence, f.value(), [&] {
    if (!problem.empty()) {
      return std::vector<engine::signature_entry>{{"the call", "failed (" + problem + ")"}};
    }
    if (describe) {
      return describe();
    }
    return std::vector<engine::signature_entry>{{"the call", "good arguments"}};
  });
}

COHORT_DECL void checks::end_job_after_failure(const char* operation,
                                               const std::exception& e) const {
  detail::end_job("cohort: rank " + std::to_string(rank()) + ": " + operation +
                  " failed inside its exchange, after the ranks agreed to run it (" + e.what() +
                  "); the other ranks cannot finish its collectives; ending the job");
}

COHORT_DECL communicator_options checks::with_waits(communicator_options options,
                                                    std::string& problem) {
  const auto from_environment = [&](std::optional<std::chrono::milliseconds>& value,
                                    const char* variable, std::chrono::milliseconds fallback) {
    const char* text = std::getenv(variable);
    if (value || text == nullptr || *text == '\0') {
      value = value.value_or(fallback);
      return;
    }
    // (from_chars: the same reading whatever locale the program set)
    double seconds = -1.0;
    const std::string_view digits(text);
    const auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), seconds);
    // (at most a year: beyond, it is surely a typo)
    if (error != std::errc{} || end != digits.data() + digits.size() || !(seconds >= 0.0) ||
        seconds > 3.2e7) {
      problem = std::string("cohort: communicator creation: ") + variable +
                " must be a number of seconds >= 0 (0 disables it), not '" + text + "'";
      value = fallback;
      return;
    }
    // A positive value never rounds to 0, which would mean "for ever".
    const auto ms = static_cast<std::int64_t>(std::ceil(seconds * 1000.0));
    value = std::chrono::milliseconds(ms);
  };
  from_environment(options.timeout, "COHORT_TIMEOUT", communicator_options::default_timeout);
  from_environment(options.stall_warning, "COHORT_STALL_WARNING",
                   communicator_options::default_stall_warning);
  return options;
}

COHORT_DECL checks::~checks() = default;

COHORT_DECL void checks::agree(const char* operation, std::size_t count, dtype type,
                               int detail_value, std::string_view detail_name,
                               const std::string& problem) const {
  detail::fingerprint f;
  f.add(operation).add(count).add(static_cast<std::uint64_t>(type));
  f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(detail_value)));
  settle(
      operation, f.value(),
      [&] {
        std::string described = engine::describe_tensor(count, type);
        if (!detail_name.empty()) {
          described +=
              " (" + std::string(detail_name) + " " +
              (detail_name == "op" ? std::string(to_string(static_cast<reduce_op>(detail_value)))
                                   : std::to_string(detail_value)) +
              ")";
        }
        return std::vector<engine::signature_entry>{{"the tensor", described}};
      },
      problem, count * size_of(type));
}

COHORT_DECL void checks::agree_on_counts(const char* operation, std::span<const std::size_t> counts,
                                         dtype type, int detail_value, std::string_view detail_name,
                                         const std::string& problem, std::size_t bytes) const {
  detail::fingerprint f;
  f.add(operation).add(counts.size()).add(static_cast<std::uint64_t>(type));
  f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(detail_value)));
  for (const std::size_t count : counts) {
    f.add(count);
  }
  settle(
      operation, f.value(),
      [&] {
        std::string listed;
        for (const std::size_t count : counts) {
          listed += (listed.empty() ? "" : ", ") + std::to_string(count);
        }
        std::string described(to_string(type));
        if (!detail_name.empty()) {
          described += " (" + std::string(detail_name) + " " +
                       std::string(to_string(static_cast<reduce_op>(detail_value))) + ")";
        }
        return std::vector<engine::signature_entry>{{"the counts", listed},
                                                    {"the tensor", described}};
      },
      problem, bytes);
}

COHORT_DECL bool checks::agree_reducing(const char* operation, tensor_view data, reduce_op op,
                                        const std::string& problem) const {
  const std::size_t bytes = data.size_bytes();
  if (!options_.check_agreement || bytes == 0 || bytes > liveness::max_carried_bytes) {
    agree(operation, data.count, data.type, static_cast<int>(op), "op", problem);
    return false;
  }
  detail::fingerprint f;
  f.add(operation).add(data.count).add(static_cast<std::uint64_t>(data.type));
  f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<int>(op))));
  f.add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
  const std::uint64_t sequence = live_->next_sequence(waiter::caller, bytes);
  trace_recorder* const trace = this->trace();
  trace_span span(trace, "agreement",
                  trace != nullptr ? this_trace_thread() : trace_thread::trainer, 0, -1, operation);
  bool reduced = false;
  {
    // A rank whose arguments failed its own checks carries nothing (its view may be anything).
    const tensor_view carried = problem.empty() ? data : tensor_view{};
    reduced = engine::require_agreement_carrying(
        *live_, waiter::caller, operation, sequence, f.value(),
        [&] {
          if (!problem.empty()) {
            return std::vector<engine::signature_entry>{{"the call", "failed (" + problem + ")"}};
          }
          return std::vector<engine::signature_entry>{
              {"the tensor", engine::describe_tensor(data.count, data.type) + " (op " +
                                 std::string(to_string(op)) + ")"}};
        },
        carried, op);
  }
  if (reduced) {
    span.relabel("agreement and reduce", bytes, -1);
  }
  if (!problem.empty()) {
    throw invalid_argument(problem);
  }
  return reduced;
}

COHORT_DECL void checks::agree_root(const char* operation, int root,
                                    const char* object_type) const {
  const std::string problem = local_checks([&] { check_root(root, operation); });
  detail::fingerprint f;
  f.add(operation).add(static_cast<std::uint64_t>(root));
  if (object_type != nullptr) {
    f.add(std::string_view(object_type));
  }
  settle(
      operation, f.value(),
      [&] {
        std::vector<engine::signature_entry> entries{{"the root", std::to_string(root)}};
        if (object_type != nullptr) {
          entries.push_back({"the object's type", boost::core::demangle(object_type)});
        }
        return entries;
      },
      problem);
}

COHORT_DECL void checks::agree_on_options(std::string_view strategy,
                                          std::string_view strategy_type) {
  int ranks_per_node = 0;
  const std::string problem = local_checks([&] {
    if (!waits_problem_.empty()) {
      throw invalid_argument(waits_problem_ + " (rank " + std::to_string(rank()) + ")");
    }
    for (const auto& [name, value] : {std::pair{"timeout", *options_.timeout},
                                      std::pair{"stall_warning", *options_.stall_warning}}) {
      if (value.count() < 0) {
        throw invalid_argument("cohort: communicator creation on rank " + std::to_string(rank()) +
                               ": communicator_options::" + name +
                               " must be >= 0 (0 disables it), not " +
                               std::to_string(value.count()) + " ms");
      }
    }
    ranks_per_node = detail::ranks_per_node_override(options_.simulated_ranks_per_node);
    if (options_.segment_bytes != 0 &&
        options_.segment_bytes < communicator_options::min_segment_bytes) {
      throw invalid_argument("cohort: communicator creation on rank " + std::to_string(rank()) +
                             ": communicator_options::segment_bytes is " +
                             std::to_string(options_.segment_bytes) + " bytes; it must be 0 " +
                             "(messages whole) or at least " +
                             std::to_string(communicator_options::min_segment_bytes));
    }
    std::string directory = options_.trace_directory;
    if (const char* variable = std::getenv("COHORT_TRACE");
        directory.empty() && variable != nullptr) {
      directory = variable;
    }
    if (!directory.empty()) {
      try {
        // Named by the rank in MPI_COMM_WORLD: the processes' files never collide, whatever
        // communicator (a split, say) is traced.
        int world_rank = 0;
        mpi::check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank", MPI_COMM_WORLD);
        trace_ = std::make_unique<trace_recorder>(directory, world_rank, strategy);
      } catch (const error& e) {
        throw invalid_argument(e.what());
      }
    }
  });
  const std::vector<std::pair<const char*, std::string>> values = {
      {"the strategy", std::string(strategy)},
      {"the strategy's type", std::string(strategy_type)},
      {"check_agreement", options_.check_agreement ? "true" : "false"},
      {"bucket_bytes", std::to_string(options_.bucket_bytes)},
      {"first_bucket_bytes", std::to_string(options_.first_bucket_bytes)},
      {"fusion_threshold_bytes", std::to_string(options_.fusion_threshold_bytes)},
      // (ranks that cut a message into other segments would call MPI with other counts)
      {"segment_bytes", std::to_string(options_.segment_bytes)},
      {"timeout (or COHORT_TIMEOUT)", std::to_string(options_.timeout->count()) + " ms"},
      {"stall_warning (or COHORT_STALL_WARNING)",
       std::to_string(options_.stall_warning->count()) + " ms"},
      {"ranks per node (simulated_ranks_per_node or COHORT_RANKS_PER_NODE)",
       ranks_per_node == 0 ? std::string("as MPI says") : std::to_string(ranks_per_node)}};
  detail::fingerprint f;
  for (const auto& [name, value] : values) {
    f.add(name).add(value);
  }
  f.add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
  engine::require_agreement(*live_, waiter::caller, "communicator creation",
                            live_->next_sequence(waiter::caller), f.value(), [&] {
                              std::vector<engine::signature_entry> described;
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
  if (trace_) {
    trace_->set_origin(); // every rank leaves the agreement at about the same time
  }
}

COHORT_DECL void checks::require_thread_multiple() const {
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

COHORT_DECL void require_mpi() {
  if (!boost::mpi::environment::initialized() || boost::mpi::environment::finalized()) {
    throw error("cohort: MPI is not running: create a boost::mpi::environment before a "
                "cohort communicator, and keep it alive while the communicator is used");
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
