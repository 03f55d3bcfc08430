// SPDX-License-Identifier: Apache-2.0
#pragma once

// What liveness.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/detail/fingerprint.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL liveness::liveness(const boost::mpi::communicator& comm,
                               std::chrono::milliseconds timeout,
                               std::chrono::milliseconds stall_warning)
    : rank_(comm.rank())
    , size_(comm.size())
    // A negative timeout or stall warning is refused once the ranks compare the options
    // (checks::agree_on_options), on every rank: throwing here, alone, would leave the others
    // waiting in the duplications below. Until then it watches nothing.
    , timeout_(std::chrono::duration_cast<detail::watch_clock::duration>(
          std::max(timeout, std::chrono::milliseconds(0))))
    , stall_warning_(std::chrono::duration_cast<detail::watch_clock::duration>(
          std::max(stall_warning, std::chrono::milliseconds(0))))
    , caller_slot_(std::max(timeout, std::chrono::milliseconds(0)),
                   std::max(stall_warning, std::chrono::milliseconds(0)), rank_)
    , reducer_slot_(std::max(timeout, std::chrono::milliseconds(0)),
                    std::max(stall_warning, std::chrono::milliseconds(0)), rank_) {
  detail::install_terminate_handler();
  // Until the channels exist, the creation's own blocking calls are watched.
  const detail::watch_scope watch(caller_slot_.get(), "communicator creation", 0, 0, false);
  control_.open(comm);
  caller_ = duplicate_returning_errors(comm);
  reducer_ = duplicate_returning_errors(comm);
}

// One rendezvous's messages on this rank. Each message is one train each way (see eager_bytes):
// the first holds the prefix (the header, then how many bytes are carried), which says how many
// messages follow; every message sent is received, whatever the peer carried, so that a
// rendezvous that disagrees leaves nothing behind in the channel.
class liveness::round {
public:
  round(liveness& live, waiter who, const std::uint64_t* values, std::size_t n,
        const char* operation, std::uint64_t sequence, const const_tensor_view* data, reduce_op op)
      : live_(live)
      , who_(who)
      , comm_(live.channel(who))
      , buffers_(live.buffers_[who == waiter::caller ? 0 : 1])
      , operation_(operation)
      , sequence_(sequence)
      , data_(data)
      , op_(op) {
    if (buffers_.mine.empty()) {
      buffers_.mine.resize(prefix_bytes + max_carried_bytes);
      buffers_.incoming.resize(prefix_bytes + max_carried_bytes);
    }
    const std::uint64_t name = detail::fingerprint{}.add(std::string_view(operation)).value();
    mine_[0] = name;
    mine_[1] = ~name;
    std::copy(values, values + n, mine_.begin() + 2);
    // (An empty view carries nothing: its pointer may be null, which memcpy must not see.)
    if (data != nullptr && data->size_bytes() > 0 && data->size_bytes() <= max_carried_bytes) {
      carried_ = data->size_bytes();
      std::memcpy(buffers_.mine.data() + prefix_bytes, data->data, carried_);
    }
    mine_[message_words - 2] = carried_;
    mine_[message_words - 1] = ~static_cast<std::uint64_t>(carried_);
    // The carried bytes are reduced while every message received carried as many (a message
    // that carried another size, or none, spoils them: the bounds then differ on every rank).
    whole_ = carried_ > 0;
  }

  // Sends this rank's train to `peer` and/or receives the peer's (its header into incoming_);
  // returns how many bytes the peer carried.
  std::size_t exchange(int peer, bool send, bool receive) {
    MPI_Request first[1] = {MPI_REQUEST_NULL};
    MPI_Status first_status[1];
    MPI_Request rest[2 * max_pieces]; // this rank's pieces, then the peer's after its first
    MPI_Status rest_statuses[2 * max_pieces];
    std::fill(std::begin(rest), std::end(rest), MPI_REQUEST_NULL);
    if (receive) {
      mpi::check(MPI_Irecv(buffers_.incoming.data(), static_cast<int>(eager_bytes), MPI_BYTE, peer,
                           rendezvous_tag, comm_, &first[0]),
                 "MPI_Irecv (agreement check)", comm_);
    }
    if (send) {
      send_train(peer, rest);
    }
    if (!receive) {
      live_.wait(who_, rest, operation_, sequence_);
      return 0;
    }
    live_.wait(who_, first, operation_, sequence_, first_status);
    const std::size_t theirs = read_prefix(peer, first_status[0]);
    const std::size_t train = prefix_bytes + theirs;
    std::size_t pieces = 0;
    for (std::size_t at = eager_bytes; at < train; at += eager_bytes, ++pieces) {
      mpi::check(MPI_Irecv(buffers_.incoming.data() + at,
                           static_cast<int>(std::min(eager_bytes, train - at)), MPI_BYTE, peer,
                           rendezvous_tag, comm_, &rest[max_pieces + pieces]),
                 "MPI_Irecv (agreement check)", comm_);
    }
    live_.wait(who_, rest, operation_, sequence_, rest_statuses);
    for (std::size_t k = 0; k < pieces; ++k) {
      const std::size_t at = eager_bytes * (k + 1);
      const std::size_t expected = std::min(eager_bytes, train - at);
      const std::size_t count = received_bytes(rest_statuses[max_pieces + k]);
      if (count != expected) {
        end_job(peer, count, " where its train said " + std::to_string(expected));
      }
    }
    std::memcpy(incoming_.data(), buffers_.incoming.data(), header_bytes);
    return theirs;
  }

  // Folds what `peer` sent (`received` carried bytes) into this rank's message. The lower rank's
  // partial is always the first operand, so that both partners compute the same bits (min and
  // max of NaN or of -0 and +0, and NaN payloads, depend on the order). Only data whose header
  // says the same as this rank's so far is reduced (a rank that passed another dtype of as many
  // bytes is found before its bytes are added up as this rank's type): the maxima of {h, ~h}
  // pairs are equal exactly when every value behind them is.
  void combine(std::size_t received, int peer) {
    const bool same = std::equal(mine_.begin(), mine_.end(), incoming_.begin());
    for (std::size_t i = 0; i < message_words; ++i) {
      mine_[i] = std::max(mine_[i], incoming_[i]);
    }
    if (!whole_ || !same || received != carried_) {
      whole_ = false;
      return;
    }
    std::byte* const own = buffers_.mine.data() + prefix_bytes;
    std::byte* const theirs = buffers_.incoming.data() + prefix_bytes;
    if (peer < live_.rank_) {
      kernels::host::reduce(as_view(theirs), as_view(own), op_);
      std::swap(buffers_.mine, buffers_.incoming);
    } else {
      kernels::host::reduce(as_view(own), as_view(theirs), op_);
    }
  }

  // Takes the result a neighbour sent (`received` carried bytes) as this rank's own.
  void adopt(std::size_t received) {
    mine_ = incoming_;
    if (whole_ && received == carried_) {
      std::memcpy(buffers_.mine.data() + prefix_bytes, buffers_.incoming.data() + prefix_bytes,
                  carried_);
    } else {
      whole_ = false;
    }
  }

  // The combined values into `values`, and the carried bytes reduced over every rank (null if
  // nothing was carried or the ranks did not all carry as many); throws if the ranks are not all
  // in the same operation.
  const std::byte* result(std::uint64_t* values, std::size_t n) const {
    if (mine_[0] != ~mine_[1]) {
      throw mismatch_error("cohort: " + std::string(operation_) + " on rank " +
                           std::to_string(live_.rank_) +
                           ": the ranks are not all in the same operation: some called another "
                           "cohort collective on this communicator at this point (every rank "
                           "must call the same collectives in the same order)");
    }
    std::copy(mine_.begin() + 2, mine_.begin() + 2 + static_cast<std::ptrdiff_t>(n), values);
    if (data_ == nullptr || !whole_ || mine_[message_words - 2] != ~mine_[message_words - 1]) {
      return nullptr;
    }
    return buffers_.mine.data() + prefix_bytes;
  }

private:
  void send_train(int peer, MPI_Request (&requests)[2 * max_pieces]) {
    std::memcpy(buffers_.mine.data(), mine_.data(), header_bytes);
    const std::uint64_t own = carried_;
    std::memcpy(buffers_.mine.data() + header_bytes, &own, sizeof own);
    const std::size_t train = prefix_bytes + carried_;
    for (std::size_t k = 0, at = 0; at < train; ++k, at += eager_bytes) {
      mpi::check(MPI_Isend(buffers_.mine.data() + at,
                           static_cast<int>(std::min(eager_bytes, train - at)), MPI_BYTE, peer,
                           rendezvous_tag, comm_, &requests[k]),
                 "MPI_Isend (agreement check)", comm_);
    }
  }

  // How many bytes the peer carries, from its first message (whose size must be the train's).
  std::size_t read_prefix(int peer, const MPI_Status& status) {
    const std::size_t count = received_bytes(status);
    std::uint64_t theirs = 0;
    if (count >= prefix_bytes) {
      std::memcpy(&theirs, buffers_.incoming.data() + header_bytes, sizeof theirs);
    }
    if (count < prefix_bytes || theirs > max_carried_bytes ||
        count != std::min(eager_bytes, prefix_bytes + static_cast<std::size_t>(theirs))) {
      end_job(peer, count, "");
    }
    return static_cast<std::size_t>(theirs);
  }

  std::size_t received_bytes(const MPI_Status& status) const {
    int count = 0;
    mpi::check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count (agreement check)", comm_);
    return static_cast<std::size_t>(count);
  }

  // Not a message of this protocol: what else the peer sent, and what it waits for, cannot be
  // known, so no rank can go on (a throw here would leave the others waiting).
  [[noreturn]] void end_job(int peer, std::size_t count, const std::string& expected) const {
    detail::end_job("cohort: " + std::string(operation_) + " on rank " +
                    std::to_string(live_.rank_) + ": a rendezvous message of " +
                    std::to_string(count) + " bytes from rank " + std::to_string(peer) + expected +
                    " (not a cohort agreement of this version?); ending the job");
  }

  tensor_view as_view(std::byte* bytes) const {
    return tensor_view{bytes, data_->count, data_->type, memory_location::host};
  }

  liveness& live_;
  waiter who_;
  MPI_Comm comm_;
  rendezvous_buffers& buffers_;
  const char* operation_;
  std::uint64_t sequence_;
  const const_tensor_view* data_;
  reduce_op op_;
  // The header, in words (the carried bytes are in buffers_).
  std::array<std::uint64_t, message_words> mine_{};
  std::array<std::uint64_t, message_words> incoming_{};
  std::size_t carried_ = 0;
  bool whole_ = false;
};

COHORT_DECL const std::byte* liveness::rendezvous(waiter who, std::uint64_t* values, std::size_t n,
                                                  const char* operation, std::uint64_t sequence,
                                                  const const_tensor_view* data, reduce_op op) {
  if (size_ == 1) {
    // One rank's data is already its reduction.
    return data != nullptr ? static_cast<const std::byte*>(data->data) : nullptr;
  }
  round messages(*this, who, values, n, operation, sequence, data, op);
  // Recursive doubling over the largest power of two; each of the first 2 * rest ranks pairs
  // with its neighbour first, and the even one of the pair takes no part in the doubling.
  int pof2 = 1;
  while (pof2 * 2 <= size_) {
    pof2 *= 2;
  }
  const int rest = size_ - pof2;
  const bool paired = rank_ < 2 * rest;
  const bool stands_aside = paired && rank_ % 2 == 0;
  if (paired) {
    if (stands_aside) {
      messages.exchange(rank_ + 1, true, false);
    } else {
      messages.combine(messages.exchange(rank_ - 1, false, true), rank_ - 1);
    }
  }
  if (!stands_aside) {
    const int virtual_rank = paired ? rank_ / 2 : rank_ - rest;
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = virtual_rank ^ mask;
      const int peer = partner < rest ? partner * 2 + 1 : partner + rest;
      messages.combine(messages.exchange(peer, true, true), peer);
    }
  }
  if (paired) {
    if (stands_aside) { // the odd neighbour's result, reduced over every rank if it is whole
      messages.adopt(messages.exchange(rank_ + 1, false, true));
    } else {
      messages.exchange(rank_ - 1, true, false);
    }
  }
  return messages.result(values, n);
}

COHORT_DECL std::string liveness::describe_wait(waiter who, detail::watch_clock::duration waited,
                                                const char* operation,
                                                std::uint64_t sequence) const {
  return "rank " + std::to_string(rank_) + " (" + detail::host_name() + "): " + operation + " (#" +
         std::to_string(sequence) + ", " + std::to_string(bytes_[who == waiter::caller ? 0 : 1]) +
         " bytes; waiting at the agreement check of the " +
         (who == waiter::caller ? "caller's" : "reduction thread's") + " call) has waited " +
         detail::describe_seconds(waited);
}

COHORT_DECL void liveness::report_stall(waiter who, detail::watch_clock::duration waited,
                                        const char* operation, std::uint64_t sequence) {
  const auto [missing, elsewhere] = control_.whereabouts(operation, sequence);
  const std::string line =
      "cohort: stall on " + describe_wait(who, waited, operation, sequence) + " for the other " +
      "ranks; " +
      (missing.empty() ? std::string("every rank answered")
                       : "ranks that have not arrived (no answer): " + missing) +
      elsewhere + "; still waiting" +
      (timeout_.count() > 0
           ? " (the timeout, " + detail::describe_seconds(timeout_) + ", ends the job)"
           : std::string(" (no timeout)"));
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

COHORT_DECL void liveness::check_departures(detail::watch_clock::time_point now,
                                            const char* operation, std::uint64_t sequence) {
  const std::string departure = control_.departure(now, leave_grace());
  if (departure.empty()) {
    return;
  }
  detail::end_job("cohort: rank " + std::to_string(rank_) + " (" + detail::host_name() +
                  "): " + departure + "; this rank waited for it in " + operation + " (#" +
                  std::to_string(sequence) + "), which it can never join; ending the job");
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
