// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/algorithm/window_allreduce.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/two_level.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/two_dimensional.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/memory/shared_arena.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Gradients that live in the node's shared memory, reduced where they are: the ranks of a node
//! share an MPI-3 window, the model allocates its gradients from it (`allocator<T>()`, in the same
//! order and sizes on every rank), and each bucket that lies in the window is reduced by loads and
//! stores, each rank its own block, with no message and no copy through MPI's buffers
//! (algorithm/window_allreduce.hpp). On several nodes each rank all-reduces its reduced block with
//! the same block of the other nodes over `Inter`, as two_dimensional does; the nodes must then
//! have the same number of ranks. A bucket outside the window (packed small gradients, gradients
//! from the heap) is reduced as `flat` reduces it. Whether a bucket lies in the window is agreed
//! on in the window at each exchange: ranks that hold it at different offsets, or some in the
//! window and others not, all throw `mismatch_error` (the job then ends: the exchange runs after
//! the step's agreement). Not in ChainerMN: ChainerMN's CPU strategies copied through MPI.
template <class Inter = mpi_links>
class shared_memory : public basic_communicator<shared_memory<Inter>> {
  static_assert(links<Inter>, "cohort: Inter must model cohort::links");
  using base = basic_communicator<shared_memory<Inter>>;

public:
  static constexpr std::string_view name = "shared_memory";
  //! Each rank's share of the window when none is given: address space only, the pages are
  //! mapped as the gradients are allocated.
  static constexpr std::size_t default_window_bytes = std::size_t{256} << 20;

  //! Collective: makes the node's window, of `window_bytes` per rank.
  explicit shared_memory(const boost::mpi::communicator& comm, communicator_options options = {},
                         std::size_t window_bytes = default_window_bytes)
      : base(comm, options)
      , window_(make_window(*this, window_bytes)) {}

  shared_memory(shared_memory&&) noexcept = default;
  shared_memory& operator=(shared_memory&&) noexcept = default;
  // The window is read on cohort's thread: its reduction ends before the window goes. Freeing
  // it is collective, so it goes here, where every rank destroys its communicator.
  ~shared_memory() {
    this->finish_overlap();
    if (window_) {
      window_->arena->close();
    }
  }

  //! An allocator of this rank's share of the window, for the gradients (std::vector<float,
  //! cohort::shared_allocator<float>>). The communicator must outlive the use of what it gives
  //! (the window goes with it); a container may still be destroyed after it.
  template <class T>
  shared_allocator<T> allocator() const noexcept {
    return shared_allocator<T>(window_->arena);
  }
  //! This rank's share of the window (what it holds, what spilled to the heap).
  const std::shared_ptr<shared_arena>& arena() const noexcept { return window_->arena; }

  //! Buckets reduced in the window so far; the others went through MPI.
  std::uint64_t window_exchanges() const noexcept {
    return window_->reduced.load(std::memory_order_relaxed);
  }

private:
  friend strategy_access;

  struct window_state {
    std::shared_ptr<shared_arena> arena;
    algorithm::window_allreduce exchange;
    std::atomic<std::uint64_t> reduced{0};

    explicit window_state(std::shared_ptr<shared_arena> a)
        : arena(std::move(a))
        , exchange(arena->window()) {}
  };

  static std::unique_ptr<window_state> make_window(shared_memory& self, std::size_t bytes) {
    detail::require_equal_node_sizes(self, name); // before the window: it throws on every rank
    require_node_on_one_host(self);
    // (Windows of other sizes would put the gradients at other offsets on each rank.)
    agree_on_settings(self, {{"window_bytes", std::to_string(bytes)}}, "shared_memory");
    return std::make_unique<window_state>(std::make_shared<shared_arena>(
        self.grad_intra_comm(), algorithm::window_allreduce::header_bytes, bytes));
  }

  // A node simulated larger than a host (simulated_ranks_per_node) cannot share memory: said on
  // every rank, before MPI refuses the window on some of them.
  static void require_node_on_one_host(shared_memory& self) {
    MPI_Comm host = MPI_COMM_NULL;
    const MPI_Comm node = self.grad_intra_comm();
    mpi::check(MPI_Comm_split_type(node, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
               "MPI_Comm_split_type (shared_memory: the node's host)", node);
    int on_host = 0;
    MPI_Comm_size(host, &on_host);
    MPI_Comm_free(&host);
    std::array<std::int32_t, 1> spans = {on_host != self.intra_size() ? 1 : 0};
    self.allreduce(spans, reduce_op::max);
    if (spans[0] != 0) {
      throw invalid_argument("cohort: shared_memory on rank " + std::to_string(self.rank()) +
                             ": a node of " + std::to_string(self.intra_size()) +
                             " ranks (simulated_ranks_per_node or COHORT_RANKS_PER_NODE) spans "
                             "more than one host, whose ranks cannot share memory");
    }
  }

  // A bucket's exchange is an all-reduce over every rank of the communicator: a small step's
  // one bucket may travel in the step's agreement instead (grad_sync::validate).
  static constexpr bool exchange_is_allreduce = true;

  // The nodes' side of an exchange on several nodes: rank i of every node takes part with its
  // node's decision (the same on every rank of a node, which agreed in the window).
  struct across_nodes {
    shared_memory* self;
    void agree(bool in_window) const {
      std::array<std::int32_t, 2> votes = {in_window ? 1 : 0, in_window ? -1 : 0};
      const MPI_Comm inter = self->grad_inter_comm();
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, votes.data(), 2, MPI_INT32_T, MPI_MAX, inter),
                 "MPI_Allreduce (shared_memory: the nodes' window)", inter);
      if (votes[0] != -votes[1]) { // some nodes hold the bucket in their window, others not
        throw mismatch_error("cohort: shared_memory on rank " + std::to_string(self->rank()) +
                             ": a bucket lies in the shared window on some nodes and outside "
                             "it on others; every rank must allocate its gradients from the "
                             "communicator's shared_allocator in the same order and sizes (and "
                             "the windows be as large)");
      }
    }
    void allreduce(tensor_view block, reduce_op op) const {
      engine::mpi_link<Inter>{self->grad_inter_comm(), self->options().segment_bytes}.allreduce(
          block, op);
    }
  };

  void exchange(tensor_view bucket, reduce_op op) {
    const bool in_window = this->inter_size() == 1
                               ? window_->exchange.allreduce(bucket, op)
                               : window_->exchange.allreduce(bucket, op, across_nodes{this});
    if (in_window) {
      window_->reduced.fetch_add(1, std::memory_order_relaxed);
    } else {
      mpi::allreduce(this->grad_comm(), bucket, op, this->options().segment_bytes);
    }
  }

  std::unique_ptr<window_state> window_;
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref
strategy_access::ref<shared_memory<>>(shared_memory<>&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
