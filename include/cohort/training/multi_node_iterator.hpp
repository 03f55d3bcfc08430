// SPDX-License-Identifier: Apache-2.0
#pragma once

// Batches read on one rank and sent to every rank (ChainerMN's multi-node iterator): for data only
// one machine can read, a reader too costly to run on every rank, or a model split over ranks that
// all need the same batch. The root calls the reader; every rank gets what it returned, or learns
// together that the epoch ended or that the reader failed, so that no rank waits for a batch that
// will not come.

#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/serialization/string.hpp>
#include <boost/serialization/utility.hpp>

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! How a batch travels from the root by default: Boost.Serialization (`bcast_obj`), for any
//! serializable type. `cohort::torch::tensor_batches` sends LibTorch tensors instead.
struct serialized_batches {
  template <class Communicator, class Batch>
  void operator()(Communicator& comm, Batch& batch, int root) const {
    batch = comm.bcast_obj(batch, root);
  }
};

//! Calls `read` on the root (it returns `std::optional<Batch>`, empty at the end of an epoch) and
//! gives every rank its result. `Send` moves a batch from the root to every rank (in place).
template <class Batch, communicator Communicator, class Read, class Send = serialized_batches>
class multi_node_iterator {
public:
  multi_node_iterator(Communicator& comm, Read read, int root = 0, Send send = {})
      : comm_(&comm)
      , read_(std::move(read))
      , send_(std::move(send))
      , root_(root) {}

  //! Collective. The root's next batch on every rank, or no batch on every rank at the end of an
  //! epoch. If the root's reader throws, the root rethrows it and every other rank throws a
  //! `cohort::error` naming the root and the message.
  std::optional<Batch> next() {
    std::optional<Batch> batch;
    std::exception_ptr failed;
    // What every rank learns first: 0 the end, 1 a batch, 2 a failure (with its message).
    std::pair<int, std::string> state{0, {}};
    if (comm_->rank() == root_) {
      try {
        batch = read_();
        state.first = batch ? 1 : 0;
      } catch (const std::exception& e) {
        failed = std::current_exception();
        state = {2, e.what()};
      } catch (...) {
        failed = std::current_exception();
        state = {2, "an exception not derived from std::exception"};
      }
    }
    state = comm_->bcast_obj(state, root_);
    if (state.first == 2) {
      if (failed) {
        std::rethrow_exception(failed);
      }
      throw error("cohort: multi_node_iterator on rank " + std::to_string(comm_->rank()) +
                  ": the reader on the root (rank " + std::to_string(root_) +
                  ") failed: " + state.second);
    }
    if (state.first == 0) {
      return std::nullopt;
    }
    if (!batch) {
      batch.emplace();
    }
    send_(*comm_, *batch, root_);
    return batch;
  }

  int root() const noexcept { return root_; }

private:
  Communicator* comm_;
  Read read_;
  Send send_;
  int root_;
};

//! A multi_node_iterator of `read`'s batches (`read` returns `std::optional<Batch>`).
template <communicator Communicator, class Read, class Send = serialized_batches>
auto make_multi_node_iterator(Communicator& comm, Read read, int root = 0, Send send = {}) {
  using Batch = typename std::invoke_result_t<Read&>::value_type;
  return multi_node_iterator<Batch, Communicator, Read, Send>(comm, std::move(read), root,
                                                              std::move(send));
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
