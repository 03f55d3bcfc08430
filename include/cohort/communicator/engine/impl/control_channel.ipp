// SPDX-License-Identifier: Apache-2.0
#pragma once

// What control_channel.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/control_channel.hpp>

#include <algorithm>
#include <random>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL control_channel::~control_channel() {
  if (!open_ || !mpi_running() || size_ == 1) {
    return;
  }
  try {
    std::string reason = "its communicator was destroyed";
    if (std::uncaught_exceptions() > 0) {
      reason += " during the unwinding of an exception";
    } else if (const std::exception_ptr current = std::current_exception()) {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        reason += " while handling an exception: " + std::string(e.what());
      } catch (...) {
        reason += " while handling an exception";
      }
    }
    const std::string notice = encode(reason);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) {
        // Small enough to go eagerly: this never waits for the peer.
        MPI_Send(notice.data(), static_cast<int>(notice.size()), MPI_CHAR, peer, leave_tag, comm_);
      }
    }
  } catch (...) {
    // Out of memory while saying goodbye: the peers will find out through the timeout.
  }
  keep_until_finalize(std::move(comm_));
}

// A notice, question or answer sent on the channel may still be in flight to a peer that has
// freed its own end (a peer that left first, or simply finished first: every rank says goodbye
// to every other). Open MPI holds a message for a freed context id until a new communicator
// takes that id, and then delivers it there, out of that communicator's sequence: across hosts a
// split of another size crashed in mca_pml_ob1_add_comm, and on one host a duplicate hung in its
// activation. Kept until MPI_Finalize, the id is never reused, and such a message waits unread in
// a communicator nobody uses (cost: one communicator per cohort communicator made; Open MPI's
// ob1 has 65536 context ids).
COHORT_DECL void control_channel::keep_until_finalize(boost::mpi::communicator comm) {
  static std::mutex mutex;
  static std::vector<boost::mpi::communicator> kept;
  try {
    const std::lock_guard lock(mutex);
    kept.push_back(std::move(comm));
  } catch (...) {
    // Out of memory: freed after all (comm's destructor), as before.
  }
}

COHORT_DECL void control_channel::open(const boost::mpi::communicator& comm) {
  rank_ = comm.rank();
  size_ = comm.size();
  comm_ = duplicate_returning_errors(comm);
  if (rank_ == 0) {
    incarnation_ =
        std::random_device{}() ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);
  }
  mpi::check(MPI_Bcast(&incarnation_, 1, MPI_UINT64_T, 0, comm_), "MPI_Bcast (incarnation)", comm_);
  std::vector<char> names(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME, '\0');
  const std::string& mine = detail::host_name();
  mine.copy(names.data() + static_cast<std::size_t>(rank_) * MPI_MAX_PROCESSOR_NAME,
            std::min<std::size_t>(mine.size(), MPI_MAX_PROCESSOR_NAME - 1));
  mpi::check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, names.data(), MPI_MAX_PROCESSOR_NAME,
                           MPI_CHAR, comm_),
             "MPI_Allgather (hosts)", comm_);
  for (int peer = 0; peer < size_; ++peer) {
    hosts_.emplace_back(names.data() + static_cast<std::size_t>(peer) * MPI_MAX_PROCESSOR_NAME);
  }
  if (std::all_of(hosts_.begin(), hosts_.end(), [&](const std::string& h) { return h == mine; })) {
    hosts_.clear();
  }
  question_ = encode("where are you?");
  open_ = true;
}

COHORT_DECL std::string control_channel::describe_rank(int peer) const {
  return hosts_.empty()
             ? std::to_string(peer)
             : std::to_string(peer) + " (" + hosts_[static_cast<std::size_t>(peer)] + ")";
}

COHORT_DECL void control_channel::read(const char* operation, std::uint64_t sequence) {
  const std::unique_lock lock(read_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return;
  }
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &status) != MPI_SUCCESS ||
        flag == 0) {
      return;
    }
    // Into a buffer of the bounded size every notice has: a stale notice of an earlier
    // communicator (MPI reuses context ids) is read and dropped without allocating.
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    const bool ours_by_size = length >= static_cast<int>(sizeof(std::uint64_t)) &&
                              static_cast<std::size_t>(length) <= inbox_.size();
    // A longer one is not ours: MPI truncates it (an error, ignored) and it is dropped.
    MPI_Recv(inbox_.data(), static_cast<int>(inbox_.size()), MPI_CHAR, status.MPI_SOURCE,
             status.MPI_TAG, comm_, MPI_STATUS_IGNORE);
    if (!ours_by_size) {
      continue;
    }
    std::uint64_t incarnation = 0;
    std::memcpy(&incarnation, inbox_.data(), sizeof incarnation);
    if (incarnation != incarnation_) {
      continue; // meant for an earlier communicator
    }
    const std::string_view text(inbox_.data() + sizeof incarnation,
                                static_cast<std::size_t>(length) - sizeof incarnation);
    const auto peer = static_cast<std::size_t>(status.MPI_SOURCE);
    const std::lock_guard state(state_mutex_);
    if (status.MPI_TAG == leave_tag) {
      // Kept without allocating: a peer that finished the last collective and left before
      // this rank saw its end is no failure, and a step must not allocate.
      if (departures_++ == 0) {
        first_departure_ = detail::watch_clock::now();
        first_leaver_ = static_cast<int>(peer);
        departure_.fill('\0');
        text.copy(departure_.data(), departure_.size() - 1);
      }
    } else if (status.MPI_TAG == query_tag) {
      const std::string answer = encode(where(operation, sequence));
      // Eager, like every notice: answering never waits for the asker.
      MPI_Send(answer.data(), static_cast<int>(answer.size()), MPI_CHAR, status.MPI_SOURCE,
               answer_tag, comm_);
    } else if (status.MPI_TAG == answer_tag) {
      answers_.resize(static_cast<std::size_t>(size_));
      answers_[peer] = std::string(text);
    }
  }
}

COHORT_DECL std::string control_channel::departure(detail::watch_clock::time_point now,
                                                   detail::watch_clock::duration grace) {
  const std::lock_guard state(state_mutex_);
  if (departures_ == 0 || now - first_departure_ < grace) {
    return {};
  }
  std::string message = "rank " + describe_rank(first_leaver_) + " left the job (" +
                        std::string(departure_.data()) + ")";
  if (departures_ > 1) {
    message += " and " + std::to_string(departures_ - 1) + " more rank(s) left after it";
  }
  return message;
}

COHORT_DECL std::vector<MPI_Request> control_channel::ask_everyone() {
  {
    const std::lock_guard state(state_mutex_);
    answers_.assign(static_cast<std::size_t>(size_), std::string());
  }
  std::vector<MPI_Request> asked;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) {
      MPI_Request& r = asked.emplace_back(MPI_REQUEST_NULL);
      MPI_Isend(question_.data(), static_cast<int>(question_.size()), MPI_CHAR, peer, query_tag,
                comm_, &r);
    }
  }
  return asked;
}

COHORT_DECL std::pair<std::string, std::string>
control_channel::whereabouts(const char* operation, std::uint64_t sequence) {
  const std::string expected = where(operation, sequence);
  std::string missing;
  std::string elsewhere;
  const std::lock_guard state(state_mutex_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) {
      continue;
    }
    const std::string& answer = answers_[static_cast<std::size_t>(peer)];
    if (answer.empty()) {
      missing += (missing.empty() ? "" : ", ") + describe_rank(peer);
    } else if (answer != expected) {
      elsewhere += "; rank " + describe_rank(peer) + " waits in " + answer;
    }
  }
  return {missing, elsewhere};
}

COHORT_DECL std::string control_channel::where(const char* operation, std::uint64_t sequence) {
  return std::string(operation) + " (#" + std::to_string(sequence) + ")";
}

COHORT_DECL std::string control_channel::encode(std::string_view text) const {
  std::string message(sizeof incarnation_, '\0');
  std::memcpy(message.data(), &incarnation_, sizeof incarnation_);
  message.append(text.substr(0, max_notice - sizeof incarnation_));
  return message;
}

COHORT_DECL boost::mpi::communicator
duplicate_returning_errors(const boost::mpi::communicator& comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  mpi::check(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup", comm);
  mpi::return_errors(copy);
  return boost::mpi::communicator(copy, boost::mpi::comm_take_ownership);
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
