// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the ranks of one cohort communicator learn that a peer is gone or stuck, instead of waiting
// for it for ever. Every cohort collective begins with a rendezvous (the agreement check), which
// runs here as point-to-point messages polled by the waiting thread (as fast as MPI_Allreduce on
// 16 bytes: 0.34 against 0.38 us at 2 ranks here, where MPI_Iallreduce takes 1.3 us). While it
// polls, the waiting thread also reads a control channel:
// - a rank that destroys its communicator sends every peer a leave notice; a peer waiting for it
//   at a rendezvous ends the job (after a grace period, in case the notice overtook the last
//   messages of a collective the leaver did finish), naming the rank and why it left;
// - past the stall warning, the waiting rank asks every peer where it is; the ranks that answer
//   are waiting too, the others had not arrived; it prints one line naming them (and their
//   hosts) and goes on waiting, to ask again after twice as long;
// - past the timeout, it asks the same way, prints one line naming them and ends the job.
// The control channel itself (notices, questions, answers) is engine/control_channel.hpp.
// Blocking calls after the rendezvous (the data transfer itself) are watched by the process's
// watchdog thread (watchdog.hpp).

#include <cohort/communicator/engine/control_channel.hpp>
#include <cohort/communicator/engine/waiter.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/terminate_handler.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

class liveness {
public:
  //! Collective over `comm`: duplicates it for the control channel and the two rendezvous
  //! channels, and agrees on a random incarnation number, so that a notice sent to an earlier
  //! communicator that MPI happens to give the same context id is never taken for this one's.
  liveness(const boost::mpi::communicator& comm, std::chrono::milliseconds timeout,
           std::chrono::milliseconds stall_warning);

  liveness(const liveness&) = delete;
  liveness& operator=(const liveness&) = delete;

  //! The communicator of one thread's rendezvous messages.
  MPI_Comm channel(waiter who) const noexcept { return who == waiter::caller ? caller_ : reducer_; }
  //! The slot that thread's blocking calls publish themselves in, for the watchdog.
  detail::watch_slot& slot(waiter who) noexcept {
    return who == waiter::caller ? caller_slot_.get() : reducer_slot_.get();
  }
  //! Numbers the rendezvous of one thread (its n-th one), and notes the bytes of the operation
  //! it opens, for messages.
  std::uint64_t next_sequence(waiter who, std::size_t bytes = 0) noexcept {
    bytes_[who == waiter::caller ? 0 : 1] = bytes;
    return ++sequence_[who == waiter::caller ? 0 : 1];
  }
  //! The bytes of the operation that thread's latest rendezvous opened.
  std::size_t bytes(waiter who) const noexcept { return bytes_[who == waiter::caller ? 0 : 1]; }
  //! The number of that thread's latest rendezvous.
  std::uint64_t sequence(waiter who) const noexcept {
    return sequence_[who == waiter::caller ? 0 : 1];
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  //! The rendezvous: every rank's `values` combined with max, by recursive doubling over
  //! point-to-point messages that this thread polls (so that a peer gone or stuck is noticed).
  //! Every message carries the operation's name (as a fingerprint pair): ranks at different
  //! rendezvous (a barrier on one, an allreduce on another) all throw `mismatch_error` instead of
  //! misreading each other's messages.
  template <std::size_t N>
  void allreduce_max(waiter who, std::array<std::uint64_t, N>& values, const char* operation,
                     std::uint64_t sequence) {
    static_assert(N + 2 + carried_words <= message_words,
                  "cohort: a rendezvous carries at most 4 words");
    rendezvous(who, values.data(), N, operation, sequence, nullptr, reduce_op::sum);
  }

  //! `allreduce_max`, the rendezvous carrying `data` too (at most `max_carried_bytes`), reduced
  //! with `op` on the way by the same recursive doubling: a small collective then costs one round
  //! trip, its agreement included. Returns the reduction over every rank (valid until this
  //! thread's next rendezvous; `data` itself is left as it was), or null when the ranks did not
  //! all carry as many bytes. Identical on every rank: each pair computes the same f(lower,
  //! higher), the lower rank's partial always the first operand (min, max and NaN payloads depend
  //! on the order). The caller uses it only if the ranks also agreed on what they passed
  //! (`values`): a rank that passed another dtype or op reduced bytes that mean nothing.
  template <std::size_t N>
  const std::byte* allreduce_max_carrying(waiter who, std::array<std::uint64_t, N>& values,
                                          const char* operation, std::uint64_t sequence,
                                          const_tensor_view data, reduce_op op) {
    static_assert(N + 2 + carried_words <= message_words,
                  "cohort: a rendezvous that carries data carries at most 4 words");
    return rendezvous(who, values.data(), N, operation, sequence, &data, op);
  }

  //! The most bytes a rendezvous carries (`allreduce_max_carrying`). Every rendezvous receives
  //! all that its peer sends, as the peer's first message says, so that a rank at a rendezvous
  //! that carries nothing still reads the messages of one that carries data, and both throw
  //! `mismatch_error`. Up to here one round trip of recursive doubling costs less than a
  //! rendezvous and then MPI's all-reduce (bench/allreduce).
  static constexpr std::size_t max_carried_bytes = std::size_t{32} << 10;

  //! A rendezvous message's header, in words: the operation's fingerprint pair, the values, and
  //! the carried bytes' pair (see carried_words).
  static constexpr std::size_t message_words = 8;
  static constexpr std::size_t header_bytes = message_words * sizeof(std::uint64_t);
  //! What one rank sends another in a round: the header, the bytes its own data takes (which the
  //! header's max does not tell: the receiver needs it to receive them all), then the data.
  static constexpr std::size_t prefix_bytes = header_bytes + sizeof(std::uint64_t);
  //! That train goes as messages of at most this many bytes, all posted at once: the largest that
  //! Open MPI's shared memory sends eagerly (its eager limit, 4 KiB, less its own header), because
  //! a message past it takes the rendezvous protocol's handshake: 8 KiB in 3 such messages 1.2 µs,
  //! in one 4.8 µs (2 ranks on this machine). Where the limit is higher, the pieces cost a few
  //! small messages more.
  static constexpr std::size_t eager_bytes = 4032;
  static constexpr std::size_t max_pieces =
      (prefix_bytes + max_carried_bytes + eager_bytes - 1) / eager_bytes;

  //! Waits for `requests` (of a rendezvous), reading the control channel meanwhile: reports a
  //! stall past the stall warning, ends the job when a peer has left or the timeout has passed.
  //! The first iterations only test, so that a rendezvous that completes at once costs what the
  //! messages cost.
  template <std::size_t N>
  void wait(waiter who, MPI_Request (&requests)[N], const char* operation, std::uint64_t sequence,
            MPI_Status* statuses = MPI_STATUSES_IGNORE) {
    const MPI_Comm comm = channel(who);
    const auto start = detail::watch_clock::now();
    stall_report stall(*this, who);
    for (unsigned spins = 0;; ++spins) {
      int done = 0;
      mpi::check(MPI_Testall(static_cast<int>(N), requests, &done, statuses),
                 "MPI_Testall (agreement check)", comm);
      if (done != 0) {
        return;
      }
      if (spins < 64) {
        continue;
      }
      if (spins % 16 == 0) {
        const auto now = detail::watch_clock::now();
        control_.read(operation, sequence);
        check_departures(now, operation, sequence);
        stall.poll(now - start, operation, sequence);
        if (timeout_.count() > 0 && now - start > timeout_) {
          time_out(who, requests, now - start, operation, sequence, statuses);
        }
      }
      // Gentle on a machine with fewer cores than ranks; sleeping only once the wait is long
      // (a rank still computing), so that a short wait costs no sleep's latency.
      if (spins < 4096 || detail::watch_clock::now() - start < std::chrono::milliseconds(5)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

private:
  static constexpr int rendezvous_tag = 0x636f;
  // The header's last words, in every rendezvous: max(bytes), max(~bytes) of what each rank
  // carried (0 when nothing), equal on every rank only when all carried as many. A rank that
  // carries nothing where the others carry (a rendezvous of another kind, or a carrying one that
  // fell back) makes them differ on every rank, and no rank uses the data.
  static constexpr std::size_t carried_words = 2;

  // The trains of one thread's rendezvous (prefix, then the carried bytes): made at its first
  // rendezvous, then reused.
  struct rendezvous_buffers {
    std::vector<std::byte> mine;
    std::vector<std::byte> incoming;
  };

  // One rendezvous's messages, on this rank: its header and carried bytes, combined with what
  // each peer of the recursive doubling sent (liveness.ipp).
  class round;

  // allreduce_max and allreduce_max_carrying (`data` null: nothing carried; never written).
  COHORT_DECL const std::byte* rendezvous(waiter who, std::uint64_t* values, std::size_t n,
                                          const char* operation, std::uint64_t sequence,
                                          const const_tensor_view* data, reduce_op op);

  // A peer that has left can no longer join this rendezvous: the job ends once the grace period
  // (for messages of a collective it did finish, overtaken by its notice) has passed.
  void check_departures(detail::watch_clock::time_point now, const char* operation,
                        std::uint64_t sequence);

  detail::watch_clock::duration leave_grace() const noexcept {
    const detail::watch_clock::duration grace = std::chrono::seconds(2);
    return timeout_.count() > 0 ? std::min(grace, timeout_) : grace;
  }

  // One wait's stall warnings: past the stall warning, asks every peer where it is, and once
  // they had time to answer, prints who has not arrived; then again after twice as long.
  class stall_report {
  public:
    stall_report(liveness& live, waiter who) noexcept
        : live_(live)
        , who_(who)
        , due_(live.stall_warning_) {}
    ~stall_report() { forget_questions(); }
    stall_report(const stall_report&) = delete;
    stall_report& operator=(const stall_report&) = delete;

    void poll(detail::watch_clock::duration waited, const char* operation, std::uint64_t sequence) {
      if (due_.count() <= 0 || waited <= due_) {
        return;
      }
      if (!asked_) {
        asked_ = true;
        asked_after_ = waited;
        questions_ = live_.control_.ask_everyone();
      } else if (waited - asked_after_ >= live_.answer_time(live_.stall_warning_)) {
        live_.report_stall(who_, waited, operation, sequence);
        forget_questions();
        due_ *= 2;
      }
    }

  private:
    void forget_questions() noexcept {
      for (MPI_Request& r : questions_) {
        MPI_Request_free(&r);
      }
      questions_.clear();
      asked_ = false;
    }

    liveness& live_;
    waiter who_;
    detail::watch_clock::duration due_;
    bool asked_ = false;
    detail::watch_clock::duration asked_after_{};
    std::vector<MPI_Request> questions_;
  };

  // How long the peers are given to answer "where are you?" (a waiting peer answers within
  // microseconds; one busy computing does not, and that is the point).
  static detail::watch_clock::duration answer_time(detail::watch_clock::duration limit) {
    return std::min<detail::watch_clock::duration>(std::chrono::seconds(1), limit);
  }

  // The stall line, from the answers to the last question.
  void report_stall(waiter who, detail::watch_clock::duration waited, const char* operation,
                    std::uint64_t sequence);
  // "rank 0 (host1): allreduce_grad (#12, 4096 bytes; waiting at the agreement check of the
  // caller's call) has waited 2.0 s", shared by the stall line and the timeout.
  std::string describe_wait(waiter who, detail::watch_clock::duration waited, const char* operation,
                            std::uint64_t sequence) const;

  // Past the timeout: asks every peer where it is, listens for a while (a rank that waits polls
  // and answers at once), then names the ranks that had not arrived and ends the job. Should the
  // rendezvous complete meanwhile, it returns normally.
  template <std::size_t N>
  void time_out(waiter who, MPI_Request (&requests)[N], detail::watch_clock::duration waited,
                const char* operation, std::uint64_t sequence, MPI_Status* statuses) {
    std::vector<MPI_Request> asked = control_.ask_everyone();
    const auto listen_until = detail::watch_clock::now() + answer_time(timeout_);
    while (detail::watch_clock::now() < listen_until) {
      int done = 0;
      MPI_Testall(static_cast<int>(N), requests, &done, statuses);
      if (done != 0) {
        for (MPI_Request& r : asked) {
          MPI_Request_free(&r);
        }
        return;
      }
      control_.read(operation, sequence);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const auto [missing, elsewhere] = control_.whereabouts(operation, sequence);
    detail::end_job("cohort: timeout on " + describe_wait(who, waited, operation, sequence) +
                    " (timeout " + detail::describe_seconds(timeout_) + ") for the other ranks; " +
                    (missing.empty() ? std::string("every rank answered")
                                     : "ranks that had not arrived (no answer): " + missing) +
                    elsewhere + "; ending the job");
  }

  int rank_;
  int size_;
  detail::watch_clock::duration timeout_;
  detail::watch_clock::duration stall_warning_;
  detail::registered_slot caller_slot_;
  detail::registered_slot reducer_slot_;
  boost::mpi::communicator caller_;
  boost::mpi::communicator reducer_;
  control_channel control_; // last: the leave notices go before the channels are freed
  std::array<std::uint64_t, 2> sequence_{};
  std::array<std::size_t, 2> bytes_{};
  std::array<rendezvous_buffers, 2> buffers_;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/liveness.ipp>
#endif
