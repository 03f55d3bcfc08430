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
                               std::chrono::milliseconds timeout)
    : rank_(comm.rank())
    , size_(comm.size())
    , timeout_(std::chrono::duration_cast<detail::watch_clock::duration>(timeout))
    , caller_slot_(timeout, rank_)
    , reducer_slot_(timeout, rank_) {
  if (timeout.count() < 0) {
    throw invalid_argument("cohort: communicator creation on rank " + std::to_string(rank_) +
                           ": communicator_options::timeout must be >= 0 (0 disables it), not " +
                           std::to_string(timeout.count()) + " ms");
  }
  detail::install_terminate_handler();
  // Until the channels exist, the creation's own blocking calls are watched.
  const detail::watch_scope watch(caller_slot_.get(), "communicator creation", 0, 0, false);
  control_.open(comm);
  caller_ = duplicate_returning_errors(comm);
  reducer_ = duplicate_returning_errors(comm);
}

COHORT_DECL const std::byte* liveness::rendezvous(waiter who, std::uint64_t* values, std::size_t n,
                                                  const char* operation, std::uint64_t sequence,
                                                  const const_tensor_view* data, reduce_op op) {
  if (size_ == 1) {
    // One rank's data is already its reduction.
    return data != nullptr ? static_cast<const std::byte*>(data->data) : nullptr;
  }
  const MPI_Comm comm = channel(who);
  rendezvous_buffers& buffers = buffers_[who == waiter::caller ? 0 : 1];
  if (buffers.mine.empty()) {
    buffers.mine.resize(prefix_bytes + max_carried_bytes);
    buffers.incoming.resize(prefix_bytes + max_carried_bytes);
  }
  // The header, in words; then the carried bytes.
  std::array<std::uint64_t, message_words> mine{};
  std::array<std::uint64_t, message_words> incoming{};
  const std::uint64_t name = detail::fingerprint{}.add(std::string_view(operation)).value();
  mine[0] = name;
  mine[1] = ~name;
  std::copy(values, values + n, mine.begin() + 2);
  std::size_t carried = 0;
  // (An empty view carries nothing: its pointer may be null, which memcpy must not see.)
  if (data != nullptr && data->size_bytes() > 0 && data->size_bytes() <= max_carried_bytes) {
    carried = data->size_bytes();
    std::memcpy(buffers.mine.data() + prefix_bytes, data->data, carried);
  }
  mine[message_words - 2] = carried;
  mine[message_words - 1] = ~static_cast<std::uint64_t>(carried);
  // The carried bytes are reduced while every message received carried as many (a message that
  // carried another size, or none, spoils them: the bounds then differ on every rank).
  bool whole = carried > 0;
  const auto as_view = [&](std::byte* bytes) {
    return tensor_view{bytes, data->count, data->type, memory_location::host};
  };
  const auto exchange = [&](int peer, bool send, bool receive) {
    // One train each way (see eager_bytes): the first message holds the prefix, which says how
    // many messages follow; every message sent is received, whatever the peer carried, so that
    // a rendezvous that disagrees leaves nothing behind in the channel.
    MPI_Request first[1] = {MPI_REQUEST_NULL};
    MPI_Status first_status[1];
    MPI_Request rest[2 * max_pieces]; // this rank's pieces, then the peer's after its first
    MPI_Status rest_statuses[2 * max_pieces];
    std::fill(std::begin(rest), std::end(rest), MPI_REQUEST_NULL);
    if (receive) {
      mpi::check(MPI_Irecv(buffers.incoming.data(), static_cast<int>(eager_bytes), MPI_BYTE, peer,
                           rendezvous_tag, comm, &first[0]),
                 "MPI_Irecv (agreement check)", comm);
    }
    if (send) {
      std::memcpy(buffers.mine.data(), mine.data(), header_bytes);
      const std::uint64_t own = carried;
      std::memcpy(buffers.mine.data() + header_bytes, &own, sizeof own);
      const std::size_t train = prefix_bytes + carried;
      for (std::size_t k = 0, at = 0; at < train; ++k, at += eager_bytes) {
        mpi::check(MPI_Isend(buffers.mine.data() + at,
                             static_cast<int>(std::min(eager_bytes, train - at)), MPI_BYTE, peer,
                             rendezvous_tag, comm, &rest[k]),
                   "MPI_Isend (agreement check)", comm);
      }
    }
    if (!receive) {
      wait(who, rest, operation, sequence);
      return std::size_t{0};
    }
    wait(who, first, operation, sequence, first_status);
    int count = 0;
    mpi::check(MPI_Get_count(&first_status[0], MPI_BYTE, &count), "MPI_Get_count (agreement check)",
               comm);
    std::uint64_t theirs = 0;
    if (static_cast<std::size_t>(count) >= prefix_bytes) {
      std::memcpy(&theirs, buffers.incoming.data() + header_bytes, sizeof theirs);
    }
    const std::size_t train = prefix_bytes + static_cast<std::size_t>(theirs);
    if (static_cast<std::size_t>(count) < prefix_bytes || theirs > max_carried_bytes ||
        static_cast<std::size_t>(count) != std::min(eager_bytes, train)) {
      // Not a message of this protocol: what else the peer sent, and what it waits for, cannot
      // be known, so no rank can go on (a throw here would leave the others waiting).
      detail::end_job("cohort: " + std::string(operation) + " on rank " + std::to_string(rank_) +
                      ": a rendezvous message of " + std::to_string(count) + " bytes from rank " +
                      std::to_string(peer) +
                      " (not a cohort agreement of this version?); ending the job");
    }
    std::size_t pieces = 0;
    for (std::size_t at = eager_bytes; at < train; at += eager_bytes, ++pieces) {
      mpi::check(MPI_Irecv(buffers.incoming.data() + at,
                           static_cast<int>(std::min(eager_bytes, train - at)), MPI_BYTE, peer,
                           rendezvous_tag, comm, &rest[max_pieces + pieces]),
                 "MPI_Irecv (agreement check)", comm);
    }
    wait(who, rest, operation, sequence, rest_statuses);
    for (std::size_t k = 0; k < pieces; ++k) {
      const std::size_t at = eager_bytes * (k + 1);
      mpi::check(MPI_Get_count(&rest_statuses[max_pieces + k], MPI_BYTE, &count),
                 "MPI_Get_count (agreement check)", comm);
      if (static_cast<std::size_t>(count) != std::min(eager_bytes, train - at)) {
        detail::end_job("cohort: " + std::string(operation) + " on rank " + std::to_string(rank_) +
                        ": a rendezvous message of " + std::to_string(count) + " bytes from rank " +
                        std::to_string(peer) + " where its train said " +
                        std::to_string(std::min(eager_bytes, train - at)) +
                        " (not a cohort agreement of this version?); ending the job");
      }
    }
    std::memcpy(incoming.data(), buffers.incoming.data(), header_bytes);
    return static_cast<std::size_t>(theirs);
  };
  // The lower rank's partial is always the first operand, so that both partners compute the
  // same bits (min and max of NaN or of -0 and +0, and NaN payloads, depend on the order).
  // Only data whose header says the same as this rank's so far is reduced (a rank that passed
  // another dtype of as many bytes is found before its bytes are added up as this rank's type):
  // the maxima of {h, ~h} pairs are equal exactly when every value behind them is.
  const auto combine = [&](std::size_t received, int peer) {
    const bool same = std::equal(mine.begin(), mine.end(), incoming.begin());
    for (std::size_t i = 0; i < message_words; ++i) {
      mine[i] = std::max(mine[i], incoming[i]);
    }
    if (whole && same && received == carried) {
      if (peer < rank_) {
        kernels::host::reduce(as_view(buffers.incoming.data() + prefix_bytes),
                              as_view(buffers.mine.data() + prefix_bytes), op);
        std::swap(buffers.mine, buffers.incoming);
      } else {
        kernels::host::reduce(as_view(buffers.mine.data() + prefix_bytes),
                              as_view(buffers.incoming.data() + prefix_bytes), op);
      }
    } else {
      whole = false;
    }
  };
  // Recursive doubling over the largest power of two; each of the first 2 * rest ranks pairs
  // with its neighbour first, and the even one of the pair takes no part in the doubling.
  int pof2 = 1;
  while (pof2 * 2 <= size_) {
    pof2 *= 2;
  }
  const int rest = size_ - pof2;
  int virtual_rank = -1;
  if (rank_ < 2 * rest) {
    if (rank_ % 2 == 0) {
      exchange(rank_ + 1, true, false);
    } else {
      combine(exchange(rank_ - 1, false, true), rank_ - 1);
      virtual_rank = rank_ / 2;
    }
  } else {
    virtual_rank = rank_ - rest;
  }
  if (virtual_rank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = virtual_rank ^ mask;
      const int peer = partner < rest ? partner * 2 + 1 : partner + rest;
      combine(exchange(peer, true, true), peer);
    }
  }
  if (rank_ < 2 * rest) {
    if (rank_ % 2 == 0) {
      const std::size_t received = exchange(rank_ + 1, false, true);
      mine = incoming;
      // The odd neighbour's result, reduced over every rank if it is whole.
      if (whole && received == carried) {
        std::memcpy(buffers.mine.data() + prefix_bytes, buffers.incoming.data() + prefix_bytes,
                    carried);
      } else {
        whole = false;
      }
    } else {
      exchange(rank_ - 1, true, false);
    }
  }
  if (mine[0] != ~mine[1]) {
    throw mismatch_error("cohort: " + std::string(operation) + " on rank " + std::to_string(rank_) +
                         ": the ranks are not all in the same operation: some called another "
                         "cohort collective on this communicator at this point (every rank "
                         "must call the same collectives in the same order)");
  }
  std::copy(mine.begin() + 2, mine.begin() + 2 + static_cast<std::ptrdiff_t>(n), values);
  if (data == nullptr || !whole || mine[message_words - 2] != ~mine[message_words - 1]) {
    return nullptr;
  }
  return buffers.mine.data() + prefix_bytes;
}

COHORT_DECL void liveness::check_departures(detail::watch_clock::time_point now,
                                            const char* operation, std::uint64_t sequence) {
  const std::string departure = control_.departure(now, leave_grace());
  if (departure.empty()) {
    return;
  }
  detail::end_job("cohort: rank " + std::to_string(rank_) + ": " + departure +
                  "; this rank waited for it in " + operation + " (#" + std::to_string(sequence) +
                  "), which it can never join; ending the job");
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
