// SPDX-License-Identifier: Apache-2.0
#pragma once

// The channel beside a communicator's rendezvous on which its ranks tell each other what the
// rendezvous cannot: that a rank leaves (a leave notice, sent when its communicator is destroyed)
// and, past the timeout, where each one is waiting (a question every waiting rank answers). Every
// notice is small (sent eagerly, never waiting for the peer) and starts with the communicator's
// incarnation, a random number agreed at creation: MPI reuses context ids, and a notice meant for
// an earlier communicator must not be taken for this one's. See liveness.hpp for who reads it.

#include <cohort/config.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <mpi.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! A duplicate of `comm` whose errors come back as codes (cohort turns them into exceptions).
COHORT_DECL boost::mpi::communicator
duplicate_returning_errors(const boost::mpi::communicator& comm);

class control_channel {
public:
  control_channel() = default;
  control_channel(const control_channel&) = delete;
  control_channel& operator=(const control_channel&) = delete;

  //! Collective over `comm`: duplicates it, agrees on the incarnation and learns every rank's
  //! host (for messages).
  void open(const boost::mpi::communicator& comm);

  //! Tells every peer that this rank leaves, and why (read by a peer only if it is still waiting
  //! for this rank at a rendezvous).
  ~control_channel();

  //! Receives whatever notices have arrived: leaves are recorded, questions answered (this rank
  //! waits in `operation`, its rendezvous number `sequence`), answers kept. One thread at a time
  //! (both waiters may poll); the other skips.
  void read(const char* operation, std::uint64_t sequence);

  //! If a peer left at least `grace` ago (time for the messages of a collective it did finish,
  //! overtaken by its notice), what to say of it: who left, why, and how many after it.
  //! Empty otherwise.
  std::string departure(detail::watch_clock::time_point now, detail::watch_clock::duration grace);

  //! Asks every peer where it waits; the answers arrive through `read`. The requests may stay
  //! pending (a peer that never reads): the question is a member, so its buffer outlives them.
  std::vector<MPI_Request> ask_everyone();

  //! From the answers so far, for this rank waiting in `operation` (#`sequence`): the ranks
  //! that did not answer ("2, 3"), and where those that answered elsewhere wait.
  std::pair<std::string, std::string> whereabouts(const char* operation, std::uint64_t sequence);

  //! "3", or "3 (host2)" when the ranks are on several hosts.
  std::string describe_rank(int peer) const;

  static bool mpi_running() noexcept {
    int initialized = 0;
    int finalized = 0;
    return MPI_Initialized(&initialized) == MPI_SUCCESS && initialized != 0 &&
           MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0;
  }

private:
  static constexpr int leave_tag = 1;
  static constexpr int query_tag = 2;
  static constexpr int answer_tag = 3;
  static constexpr std::size_t max_notice = 512;

  static std::string where(const char* operation, std::uint64_t sequence);
  static void keep_until_finalize(boost::mpi::communicator comm);

  // A notice: the incarnation (8 bytes), then the text, cut to a bounded size.
  std::string encode(std::string_view text) const;

  int rank_ = 0;
  int size_ = 1;
  bool open_ = false;
  boost::mpi::communicator comm_;
  std::uint64_t incarnation_ = 0;
  std::mutex read_mutex_;
  std::mutex state_mutex_;
  int departures_ = 0;
  int first_leaver_ = -1;
  std::array<char, max_notice> departure_{}; // why the first one left
  detail::watch_clock::time_point first_departure_{};
  std::vector<std::string> answers_;
  std::array<char, max_notice> inbox_{};
  std::string question_;
  std::vector<std::string> hosts_; // empty when every rank is on one host
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/control_channel.ipp>
#endif
