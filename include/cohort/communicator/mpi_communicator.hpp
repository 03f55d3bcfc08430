// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every MPI-based strategy shares: the topology, the tensor and object collectives, the
// parameter broadcast and the front door of allreduce_grad, blocking or overlapped with backward.
// A strategy derives from mpi_communicator<Strategy> (CRTP: no virtual call) and supplies only
// how one bucket of host gradients is reduced, `exchange(tensor_view, reduce_op)` over the
// gradient channel (`grad_comm()`, ...), or, for device memory, how all of them are,
// `reduce_gradients(std::span<const detail::grad_slot>, const Reducer&)`.

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/bucket_plan.hpp>
#include <cohort/communicator/bucketed_reduction.hpp>
#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/grad_sync_request.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/overlap_worker.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/collectives.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

namespace detail {
template <class T>
constexpr bool may_live_on_host() {
  if constexpr (statically_located_tensor<T>) {
    return traits_of<T>::location != memory_location::device;
  } else {
    return true;
  }
}

//! A reducer's plans for every dtype, recorded once: what a plan rebuilt later (when the order of
//! readiness is learned) is built from, without keeping the reducer's type.
struct recorded_reducer {
  std::array<grad_reduction, dtype_count> plans;

  recorded_reducer() = default;
  template <reducer Reducer>
  recorded_reducer(const Reducer& reducer, int ranks) {
    for (std::size_t d = 0; d < plans.size(); ++d) {
      plans[d] = reducer.plan(all_dtypes[d], ranks);
    }
  }
  grad_reduction plan(dtype type, int) const { return plans[dtype_index(type)]; }
};
} // namespace detail

//! A tensor that may be in host memory: any tensor but one whose type says it lives on the
//! device. Host-only strategies take these, so device memory fails to compile where it can.
template <class T>
concept host_tensor = tensor<T> && detail::may_live_on_host<T>();

template <class Strategy>
class mpi_communicator {
public:
  //! Builds the communicator over a duplicate of `comm` (so that cohort's messages never match
  //! the user's), and works out the topology. Collective over `comm`.
  explicit mpi_communicator(const boost::mpi::communicator& comm, communicator_options options = {})
      : comm_(checked_duplicate(comm))
      , options_(options)
      , layout_(discover_topology(comm_, options.simulated_ranks_per_node))
      , grad_world_(checked_duplicate(comm_))
      , grad_intra_(checked_duplicate(layout_.intra))
      , grad_inter_(checked_duplicate(layout_.inter))
      , reduction_(bucketing(options)) {}

  int rank() const noexcept { return layout_.topo.rank; }
  int size() const noexcept { return layout_.topo.size; }
  int intra_rank() const noexcept { return layout_.topo.intra_rank; }
  int intra_size() const noexcept { return layout_.topo.intra_size; }
  int inter_rank() const noexcept { return layout_.topo.inter_rank; }
  int inter_size() const noexcept { return layout_.topo.inter_size; }
  const cohort::topology& topology() const noexcept { return layout_.topo; }

  mpi_communicator(mpi_communicator&&) noexcept = default;
  mpi_communicator& operator=(mpi_communicator&&) noexcept = default;
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  //! Finishes an overlapped reduction still pending (its errors are lost here: call wait), so
  //! that cohort's thread never outlives what it reads, and the other ranks are not left in the
  //! collectives of buckets this rank would never send.
  ~mpi_communicator() { finish_overlap(); }

  //! The Boost.MPI communicator underneath (cohort's duplicate), for the user's own MPI calls.
  //! Its error handler is MPI_ERRORS_RETURN (cohort turns errors into exceptions): a raw MPI call
  //! on it returns an error code instead of aborting, so check the codes.
  const boost::mpi::communicator& mpi_comm() const noexcept { return comm_; }
  //! The ranks of this node, and the ranks with the same intra_rank across nodes.
  const boost::mpi::communicator& intra_comm() const noexcept { return layout_.intra; }
  const boost::mpi::communicator& inter_comm() const noexcept { return layout_.inter; }
  const communicator_options& options() const noexcept { return options_; }

  //! A communicator of the same strategy over the ranks that pass the same `color` (>= 0),
  //! ordered by `key`. Collective. The options are kept (ChainerMN's split lost them).
  Strategy split(int color, int key) const {
    detail::operation_scope scope("split");
    const std::string problem = local_checks([&] {
      if (color < 0) {
        throw invalid_argument("cohort: split on rank " + std::to_string(rank()) +
                               ": color must be >= 0, not " + std::to_string(color));
      }
    });
    settle("split", detail::fingerprint{}.value(), nullptr, problem);
    MPI_Comm part = MPI_COMM_NULL;
    mpi::check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split", comm_);
    const boost::mpi::communicator adopted = detail::adopt(part);
    return Strategy(adopted, options_);
  }

  void barrier() const {
    detail::operation_scope scope("barrier");
    mpi::check(MPI_Barrier(comm_), "MPI_Barrier", comm_);
  }

  // ---- tensor collectives ------------------------------------------------------------------

  //! Reduces `t` over all ranks, in place.
  template <writable_tensor T>
  requires host_tensor<T>
  void allreduce(T& t, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("allreduce");
    tensor_view v;
    const std::string problem = local_checks([&] { v = host_view(t, "allreduce"); });
    agree("allreduce", v.count, v.type, static_cast<int>(op), "op", problem);
    mpi::allreduce(comm_, v, op);
  }

  //! Non-blocking `allreduce`: `t` must not be touched until the request is waited on.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request iallreduce(T& t, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("iallreduce");
    tensor_view v;
    const std::string problem = local_checks([&] { v = host_view(t, "iallreduce"); });
    agree("iallreduce", v.count, v.type, static_cast<int>(op), "op", problem);
    return mpi::iallreduce(comm_, v, op);
  }

  //! Copies `t` from `root` to every rank.
  template <writable_tensor T>
  requires host_tensor<T>
  void broadcast(T& t, int root = 0) {
    detail::operation_scope scope("broadcast");
    tensor_view v;
    const std::string problem = local_checks([&] {
      v = host_view(t, "broadcast");
      check_root(root, "broadcast");
    });
    agree("broadcast", v.count, v.type, root, "root", problem);
    mpi::broadcast(comm_, v, root);
  }

  //! Non-blocking `broadcast`.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request ibroadcast(T& t, int root = 0) {
    detail::operation_scope scope("ibroadcast");
    tensor_view v;
    const std::string problem = local_checks([&] {
      v = host_view(t, "ibroadcast");
      check_root(root, "ibroadcast");
    });
    agree("ibroadcast", v.count, v.type, root, "root", problem);
    return mpi::ibroadcast(comm_, v, root);
  }

  //! Gathers every rank's `in` into `out` (size() * in's size elements, rank r's at r * n).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void allgather(const In& in, Out& out) {
    detail::operation_scope scope("allgather");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = local_checks([&] {
      i = host_const_view(in, "allgather");
      o = host_view(out, "allgather");
      check_blocks(i, o, "allgather");
    });
    agree("allgather", i.count, i.type, 0, "", problem);
    mpi::allgather(comm_, i, o);
  }

  //! Non-blocking `allgather`.
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out> mpi::request iallgather(const In& in, Out& out) {
    detail::operation_scope scope("iallgather");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = local_checks([&] {
      i = host_const_view(in, "iallgather");
      o = host_view(out, "iallgather");
      check_blocks(i, o, "iallgather");
    });
    agree("iallgather", i.count, i.type, 0, "", problem);
    return mpi::iallgather(comm_, i, o);
  }

  //! Reduces `in` (size() * n elements) over all ranks; rank r gets block r in `out` (n).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void reduce_scatter(const In& in, Out& out, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("reduce_scatter");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = local_checks([&] {
      i = host_const_view(in, "reduce_scatter");
      o = host_view(out, "reduce_scatter");
      check_blocks(o, i, "reduce_scatter");
    });
    agree("reduce_scatter", o.count, o.type, static_cast<int>(op), "op", problem);
    mpi::reduce_scatter(comm_, i, o, op);
  }

  //! Sends `t` to `dest`.
  template <tensor T>
  requires host_tensor<T>
  void send(const T& t, int dest, int tag = 0) {
    detail::operation_scope scope("send");
    check_peer(dest, "send");
    mpi::send(comm_, host_const_view(t, "send"), dest, tag);
  }

  //! Non-blocking `send`.
  template <tensor T>
  requires host_tensor<T> mpi::request isend(const T& t, int dest, int tag = 0) {
    detail::operation_scope scope("isend");
    check_peer(dest, "isend");
    return mpi::isend(comm_, host_const_view(t, "isend"), dest, tag);
  }

  //! Receives into `t` from `source`; a message of another size throws and stays queued.
  template <writable_tensor T>
  requires host_tensor<T>
  void recv(T& t, int source, int tag = 0) {
    detail::operation_scope scope("recv");
    check_peer(source, "recv");
    mpi::recv(comm_, host_view(t, "recv"), source, tag);
  }

  //! Non-blocking `recv`.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request irecv(T& t, int source, int tag = 0) {
    detail::operation_scope scope("irecv");
    check_peer(source, "irecv");
    return mpi::irecv(comm_, host_view(t, "irecv"), source, tag);
  }

  // ---- object collectives (Boost.Serialization) ----------------------------------------------

  //! Returns `root`'s `obj` on every rank.
  template <class T>
  T bcast_obj(const T& obj, int root = 0) {
    detail::operation_scope scope("bcast_obj");
    agree_root("bcast_obj", root);
    T value = rank() == root ? obj : T{};
    mpi::translate("bcast_obj", comm_, [&] { boost::mpi::broadcast(comm_, value, root); });
    return value;
  }

  //! Every rank's `obj` at `root`, in rank order; an empty vector elsewhere.
  template <class T>
  std::vector<T> gather_obj(const T& obj, int root = 0) {
    detail::operation_scope scope("gather_obj");
    agree_root("gather_obj", root);
    std::vector<T> all;
    mpi::translate("gather_obj", comm_, [&] { boost::mpi::gather(comm_, obj, all, root); });
    return all;
  }

  //! Every rank's `obj` on every rank, in rank order.
  template <class T>
  std::vector<T> allgather_obj(const T& obj) {
    detail::operation_scope scope("allgather_obj");
    std::vector<T> all;
    mpi::translate("allgather_obj", comm_, [&] { boost::mpi::all_gather(comm_, obj, all); });
    return all;
  }

  //! Combines every rank's `obj` with `op` (by default `+`), on every rank.
  template <class T, class Op = std::plus<T>>
  T allreduce_obj(const T& obj, Op op = {}) {
    detail::operation_scope scope("allreduce_obj");
    T result{};
    mpi::translate("allreduce_obj", comm_, [&] { boost::mpi::all_reduce(comm_, obj, result, op); });
    return result;
  }

  template <class T>
  void send_obj(const T& obj, int dest, int tag = 0) {
    detail::operation_scope scope("send_obj");
    check_peer(dest, "send_obj");
    mpi::translate("send_obj", comm_, [&] { comm_.send(dest, tag, obj); });
  }

  template <class T>
  T recv_obj(int source, int tag = 0) {
    detail::operation_scope scope("recv_obj");
    check_peer(source, "recv_obj");
    T obj{};
    mpi::translate("recv_obj", comm_, [&] { comm_.recv(source, tag, obj); });
    return obj;
  }

  // ---- parameters --------------------------------------------------------------------------

  //! Copies every parameter's value from `root` to every rank. The ranks first agree on the
  //! layout (names, sizes, dtypes) if the agreement check is on. Small values travel packed in
  //! a bucket's worth of bytes at a time, large ones in place, so no copy of the model
  //! is made.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    detail::operation_scope scope("broadcast_parameters");
    std::vector<std::string> names;
    std::vector<tensor_view> values;
    const std::string problem = local_checks([&] {
      check_root(root, "broadcast_parameters");
      for (auto&& p : params) {
        using traits = parameter_traits<std::remove_cvref_t<decltype(p)>>;
        names.emplace_back(traits::name(p));
        values.push_back(host_view(traits::value(p), "parameter '" + names.back() + "'"));
      }
    });
    detail::fingerprint f;
    f.add(static_cast<std::uint64_t>(root)).add(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      f.add(names[i]).add(values[i].count).add(static_cast<std::uint64_t>(values[i].type));
    }
    settle(
        "broadcast_parameters", f.value(),
        [&] {
          std::vector<detail::signature_entry> described;
          for (std::size_t i = 0; i < values.size(); ++i) {
            described.push_back(
                {"parameter '" + names[i] + "'",
                 "a value of " + detail::describe_tensor(values[i].count, values[i].type)});
          }
          return described;
        },
        problem);

    const std::size_t capacity = options_.bucket_bytes;
    const std::size_t threshold = std::min(options_.fusion_threshold_bytes, capacity);
    std::vector<std::byte> buffer;
    std::vector<tensor_view> pending;
    std::size_t filled = 0;
    const auto flush = [&] {
      if (pending.empty()) {
        return;
      }
      buffer.resize(std::max(buffer.size(), filled));
      const tensor_view packed{buffer.data(), filled, dtype::uint8, memory_location::host};
      const std::vector<const_tensor_view> sources(pending.begin(), pending.end());
      if (rank() == root) {
        kernels::host::pack(sources, packed);
      }
      mpi::broadcast(comm_, packed, root);
      if (rank() != root) {
        kernels::host::unpack(packed, pending);
      }
      pending.clear();
      filled = 0;
    };
    for (const tensor_view& v : values) {
      if (v.size_bytes() >= threshold) {
        mpi::broadcast(comm_, v, root);
        continue;
      }
      if (filled + v.size_bytes() > capacity) {
        flush();
      }
      pending.push_back({v.data, v.size_bytes(), dtype::uint8, v.location});
      filled += v.size_bytes();
    }
    flush();
  }

  //! Reduces every parameter's gradient over all ranks as `reducer` says (for `mean`: the
  //! average), in place. Before anything is reduced, the ranks agree on the layout (if the check
  //! is on); a parameter without a gradient is reported or zero-filled as `options` says.
  template <parameter_set Params, reducer Reducer>
  void allreduce_grad(Params&& params, const Reducer& reducer, grad_sync_options options = {}) {
    detail::operation_scope scope("allreduce_grad");
    require_no_pending("allreduce_grad");
    detail::collect_gradients(params, options.missing, slots_, names_);
    validate_slots(options.missing, "blocking");
    if constexpr (!device_strategy()) {
      reduce_buckets(reducer);
    } else {
      self().reduce_gradients(std::span<const detail::grad_slot>(slots_), reducer);
    }
  }

  // ---- gradients reduced while backward runs ------------------------------------------------

  //! Begins a reduction of `params`' gradients that overlaps with backward: call `ready(i)` on
  //! the request as parameter i's gradient becomes final (from a hook, say), and `wait()` before
  //! the optimizer step. A bucket is reduced, on cohort's own thread, as soon as its gradients are
  //! ready and the buckets before it are on their way; the order gradients become ready in the
  //! first step is learned (rank 0's) and the buckets rebuilt for it. Collective: the ranks agree
  //! on the layout now, so every gradient tensor must exist, with its final size, already.
  //! Needs MPI started with `MPI_THREAD_MULTIPLE` (throws `cohort::error` otherwise).
  template <parameter_set Params, reducer Reducer>
  grad_sync_request<Strategy, Params> begin_allreduce_grad(Params& params, const Reducer& reducer,
                                                           grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    return {self(), params};
  }

  //! Non-blocking `allreduce_grad`: every gradient is ready now; the buckets are reduced on
  //! cohort's thread while the caller goes on. `wait()` on the request before touching them.
  template <parameter_set Params, reducer Reducer>
  grad_sync_request<Strategy, Params> iallreduce_grad(Params& params, const Reducer& reducer,
                                                      grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    mark_all_ready();
    return {self(), params};
  }

  //! The parts of `begin_allreduce_grad` for callers that keep no request (the optimizer
  //! wrapper): start, say which gradient is ready, wait.
  template <parameter_set Params, reducer Reducer>
  void start_grad_sync(Params& params, const Reducer& reducer, grad_sync_options options = {}) {
    detail::operation_scope scope("allreduce_grad");
    require_overlap_possible();
    detail::collect_gradients(params, options.missing, slots_, names_);
    validate_slots(options.missing, "overlapped");
    begin_overlap(reducer, options.missing);
  }

  //! Starts an overlapped reduction of gradients given as views (which the caller keeps alive and
  //! does not touch until `wait_grad_sync`): for a wrapper that reduces a copy of the gradients.
  template <reducer Reducer>
  void start_grad_sync(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    detail::operation_scope scope("allreduce_grad");
    require_overlap_possible();
    slots_.assign(slots.begin(), slots.end());
    validate_slots(missing_grad::report, "overlapped");
    begin_overlap(reducer, missing_grad::report);
  }

  //! Parameter `index` of `params` (the set the reduction began with) has its final gradient: it
  //! is read again, and its bucket reduced if that completes it.
  template <parameter_set Params>
  void grad_ready(Params& params, std::size_t index) {
    overlap_state& o = pending_overlap("grad_ready");
    // A gradient already marked may be in flight on cohort's thread: never touch its view again.
    if (index < slots_.size() && !o.ready[index]) {
      auto it = std::ranges::begin(params);
      std::ranges::advance(it, static_cast<std::ranges::range_difference_t<Params>>(index));
      const detail::grad_slot now = detail::collect_one(*it, o.missing);
      detail::grad_slot& then = slots_[index];
      if (now.state != detail::slot_state::ok || now.grad.count != then.grad.count ||
          now.grad.type != then.grad.type || now.grad.location != then.grad.location) {
        detail::grad_slot changed = now;
        changed.name = then.name;
        report(o, "cohort: grad_ready on rank " + std::to_string(rank()) + ": " +
                      detail::slot_label(then) + " had " + detail::slot_description(then) +
                      " when the reduction began, and now has " +
                      detail::slot_description(changed));
        return;
      }
      then.grad = now.grad;
    }
    o.caller_marked = true;
    mark_ready(o, index);
  }

  //! Gradient `index` of the views given to `start_grad_sync` is final.
  void grad_ready(std::size_t index) {
    overlap_state& o = pending_overlap("grad_ready");
    o.caller_marked = true;
    mark_ready(o, index);
  }

  //! Marks every gradient not yet ready as ready (in index order). This order is never learned:
  //! it says nothing of when backward produces the gradients.
  void mark_all_ready() {
    overlap_state& o = pending_overlap("grad_ready");
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!o.ready[i]) {
        mark_ready(o, i);
      }
    }
  }

  //! Marks the rest ready, and waits until every bucket is reduced. Collective. Rethrows the
  //! first error on every rank (a gradient whose size changed on one rank throws everywhere).
  void wait_grad_sync() {
    detail::operation_scope scope("allreduce_grad");
    overlap_state& o = pending_overlap("wait");
    struct done_on_exit {
      overlap_state& o;
      ~done_on_exit() {
        // Whatever threw, cohort's thread is done with this step before the next may start.
        try {
          o.worker.wait();
        } catch (...) {
        }
        o.pending = false;
      }
    } done{o};
    mark_all_ready();
    o.worker.wait();
    // A problem found after the last bucket left (a gradient marked twice, say), or an error on
    // cohort's thread: an error on every rank, the failing rank's own first.
    std::string problem = o.problem_flag.load() ? o.problem : std::string();
    if (problem.empty() && o.failure) {
      problem = o.failure_message;
    }
    if (options_.check_agreement) {
      try {
        settle_on(grad_world_, "allreduce_grad", 0, problem);
      } catch (...) {
        if (o.failure) {
          std::rethrow_exception(std::exchange(o.failure, nullptr));
        }
        throw;
      }
    } else if (o.failure) {
      std::rethrow_exception(std::exchange(o.failure, nullptr));
    } else if (!problem.empty()) {
      throw invalid_argument(problem);
    }
    if (reduction_.learning()) {
      // Every rank adopts rank 0's order, so the buckets stay the same everywhere; and only an
      // order the caller gave (not the index order of mark_all_ready) is worth learning.
      std::vector<std::int64_t>& order = o.order_message; // reused: no allocation per step
      order.assign(o.seen.size() + 1, o.caller_marked ? 1 : 0);
      std::copy(o.seen.begin(), o.seen.end(), order.begin() + 1);
      mpi::broadcast(grad_world_,
                     tensor_view{order.data(), order.size(), dtype::int64, memory_location::host},
                     0);
      if (order[0] == 1) {
        std::copy(order.begin() + 1, order.end(), o.seen.begin());
        reduction_.learn_order(std::span<const detail::grad_slot>(slots_), o.seen, o.reducer,
                               size());
      }
    }
  }

  //! Whether an overlapped reduction has begun and not been waited on.
  bool grad_sync_pending() const noexcept { return overlap_ != nullptr && overlap_->pending; }

  //! Counts the overlapped reductions begun so far (what tells a request its own one).
  std::uint64_t grad_sync_generation() const noexcept {
    return overlap_ != nullptr ? overlap_->generation : 0;
  }

  //! Bytes held by the gradient buckets of the last layout reduced (0 for device strategies).
  std::size_t bucket_buffer_bytes() const noexcept { return reduction_.buffer_bytes(); }

  //! Buckets (collectives) per step of the last layout reduced (0 for device strategies).
  std::size_t bucket_count() const noexcept { return reduction_.bucket_count(); }

protected:
  //! Waits for an overlapped reduction still pending, dropping its errors. A strategy whose
  //! `exchange` uses members of its own calls it from its destructor, before they go.
  void finish_overlap() noexcept {
    if (grad_sync_pending()) {
      try {
        wait_grad_sync();
      } catch (...) {
        // Called from destructors, which may not throw.
      }
    }
  }

  //! Checks `slots_` (collective): this rank's own problems first, where the gradients live and
  //! what the strategy asks of their memory (a strategy may declare `void
  //! check_gradient_memory(const detail::grad_slot&)`, which throws `invalid_argument`), then
  //! the ranks agree on the layout, on those problems and on `mode`, so that a problem on one
  //! rank is an error on every rank.
  void validate_slots(missing_grad missing, std::string_view mode) {
    const std::string problem = local_checks([&] {
      for (const auto& slot : slots_) {
        if (slot.state != detail::slot_state::ok || slot.grad.count == 0) {
          continue;
        }
        check_gradient_location(slot.grad.location);
        if constexpr (requires(Strategy & s, const detail::grad_slot& g) {
                        s.check_gradient_memory(g);
                      }) {
          self().check_gradient_memory(slot);
        }
      }
    });
    detail::validate_gradients(comm_, "allreduce_grad", slots_, options_.check_agreement, missing,
                               problem, mode);
  }

  //! Whether the strategy reduces device memory (it says so with `static constexpr bool
  //! reduces_gpu_memory = true`): such a strategy reduces all gradients in one call of its own; a
  //! host strategy exchanges buckets, and can overlap them with backward. A function, not a
  //! concept: nvcc caches a concept's answer, and it would ask while the strategy is incomplete.
  static constexpr bool device_strategy() {
    return requires {
      requires Strategy::reduces_gpu_memory;
    };
  }

  //! The communicators the gradient buckets travel on: duplicates of mpi_comm(), intra_comm()
  //! and inter_comm(), so that cohort's thread never shares a communicator with the caller's.
  const boost::mpi::communicator& grad_comm() const noexcept { return grad_world_; }
  const boost::mpi::communicator& grad_intra_comm() const noexcept { return grad_intra_; }
  const boost::mpi::communicator& grad_inter_comm() const noexcept { return grad_inter_; }

  //! Where this strategy's gradients may live: host memory, unless the strategy declares
  //! `static constexpr bool reduces_gpu_memory = true`.
  void check_gradient_location(memory_location location) const {
    if constexpr (device_strategy()) {
      require_device(location, "allreduce_grad");
    } else {
      require_host(location, "allreduce_grad");
    }
  }

  //! For the strategies that reduce GPU memory: refuses host memory, naming the way out.
  void require_device(memory_location location, std::string_view operation) const {
    if (location == memory_location::host) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": this strategy reduces GPU memory, and the tensor is in host "
                             "memory (use flat for host memory)");
    }
  }

  void require_host(memory_location location, std::string_view operation) const {
    if (location == memory_location::device) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": this strategy reduces host memory only, and the tensor is in "
                             "device memory (use pure_nccl or host_staged)");
    }
  }

  static boost::mpi::communicator checked_duplicate(const boost::mpi::communicator& comm) {
    if (!boost::mpi::environment::initialized() || boost::mpi::environment::finalized()) {
      throw error("cohort: MPI is not running: create a boost::mpi::environment before a "
                  "cohort communicator, and keep it alive while the communicator is used");
    }
    MPI_Comm duplicate = MPI_COMM_NULL;
    mpi::check(MPI_Comm_dup(comm, &duplicate), "MPI_Comm_dup", comm);
    return detail::adopt(duplicate);
  }

  template <class T>
  tensor_view host_view(T& t, std::string_view what) const {
    const tensor_view v = make_view(t, what);
    require_host(v.location, what);
    return v;
  }
  template <class T>
  const_tensor_view host_const_view(const T& t, std::string_view what) const {
    const const_tensor_view v = make_const_view(t, what);
    require_host(v.location, what);
    return v;
  }

  // `block` holds n elements and `whole` size() * n, of the same dtype; the ranks agree on n.
  void check_blocks(const_tensor_view block, const_tensor_view whole, std::string_view operation) {
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

  //! Runs a front door's local checks and returns what they found ("" when the arguments are
  //! good) instead of throwing: a rank with bad input must still take part in the agreement
  //! check, or the others would wait for it in the collective.
  template <class Checks>
  static std::string local_checks(Checks&& checks) {
    try {
      checks();
      return {};
    } catch (const invalid_argument& e) {
      return e.what();
    }
  }

  //! The end of every front door: the ranks compare `hash` and whether each found a problem; a
  //! mismatch throws `mismatch_error` everywhere, and a problem found on every rank throws there.
  //! Without the agreement check a problem throws at once, on its own rank only.
  template <class Describe>
  void settle(std::string_view operation, std::uint64_t hash, Describe&& describe,
              const std::string& problem) const {
    if (options_.check_agreement) {
      agree_on_problems(comm_, operation, hash, describe, problem);
    }
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  //! `settle` over another communicator (the gradient channel), with nothing to describe.
  void settle_on(const boost::mpi::communicator& comm, std::string_view operation,
                 std::uint64_t hash, const std::string& problem) const {
    agree_on_problems(comm, operation, hash, nullptr, problem);
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  template <class Describe>
  static void agree_on_problems(const boost::mpi::communicator& comm, std::string_view operation,
                                std::uint64_t hash, Describe&& describe,
                                const std::string& problem) {
    detail::fingerprint f;
    f.add(hash).add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    detail::require_agreement(comm, operation, f.value(), [&] {
      if (!problem.empty()) {
        return std::vector<detail::signature_entry>{{"the call", "failed (" + problem + ")"}};
      }
      if constexpr (std::is_invocable_v<Describe>) {
        return describe();
      } else {
        return std::vector<detail::signature_entry>{{"the call", "good arguments"}};
      }
    });
  }

  void agree(std::string_view operation, std::size_t count, dtype type, int detail_value,
             std::string_view detail_name, const std::string& problem = {}) const {
    detail::fingerprint f;
    f.add(operation).add(count).add(static_cast<std::uint64_t>(type));
    f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(detail_value)));
    settle(
        operation, f.value(),
        [&] {
          std::string described = detail::describe_tensor(count, type);
          if (!detail_name.empty()) {
            described +=
                " (" + std::string(detail_name) + " " +
                (detail_name == "op" ? std::string(to_string(static_cast<reduce_op>(detail_value)))
                                     : std::to_string(detail_value)) +
                ")";
          }
          return std::vector<detail::signature_entry>{{"the tensor", described}};
        },
        problem);
  }

  void agree_root(std::string_view operation, int root) const {
    const std::string problem = local_checks([&] { check_root(root, operation); });
    detail::fingerprint f;
    f.add(operation).add(static_cast<std::uint64_t>(root));
    settle(
        operation, f.value(),
        [&] {
          return std::vector<detail::signature_entry>{{"the root", std::to_string(root)}};
        },
        problem);
  }

private:
  // What a reduction that overlaps backward keeps between calls: behind a pointer so that the
  // communicator stays movable, and made once, with its thread, on first use.
  struct overlap_state {
    explicit overlap_state(mpi_communicator& owner)
        : owner(&owner) {}
    void reduce_bucket(std::size_t b) { owner->reduce_overlapped_bucket(*this, b); }

    mpi_communicator* owner;
    bool pending = false;
    missing_grad missing = missing_grad::report;
    detail::recorded_reducer reducer;
    std::vector<char> ready;
    std::vector<std::size_t> remaining;      // per bucket: members not yet ready
    std::vector<std::size_t> seen;           // the order gradients became ready in
    std::vector<std::int64_t> order_message; // rank 0's `seen`, broadcast while learning
    std::size_t launched = 0;
    bool caller_marked = false; // grad_ready was called, not only mark_all_ready
    std::uint64_t generation = 0;
    std::string problem; // the first local problem; written before problem_flag is raised
    std::atomic<bool> problem_flag{false};
    // An error on cohort's thread (an MPI error, say): kept, carried into the agreement of every
    // later bucket and of wait(), so that every rank stops, and rethrown by wait() here.
    std::exception_ptr failure;
    std::string failure_message;
    detail::overlap_worker<overlap_state> worker; // last: its thread stops first
  };

  static detail::bucket_limits bucketing(const communicator_options& options) {
    if constexpr (requires { Strategy::bucket_limits_for(options); }) {
      return Strategy::bucket_limits_for(options);
    } else {
      return {options.bucket_bytes, options.first_bucket_bytes,
              std::min(options.fusion_threshold_bytes, options.bucket_bytes)};
    }
  }

  Strategy& self() noexcept { return static_cast<Strategy&>(*this); }

  void require_no_pending(std::string_view operation) const {
    if (grad_sync_pending()) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": an overlapped allreduce_grad is still pending; wait() on it first");
    }
  }

  overlap_state& pending_overlap(std::string_view operation) {
    if (!grad_sync_pending()) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": no overlapped allreduce_grad is pending (begin_allreduce_grad "
                             "starts one)");
    }
    return *overlap_;
  }

  void require_overlap_possible() const {
    static_assert(!device_strategy(), "cohort: overlap needs a host strategy (flat, ...)");
    require_no_pending("begin_allreduce_grad");
    require_threads();
  }

  void require_threads() const {
    int level = MPI_THREAD_SINGLE;
    mpi::check(MPI_Query_thread(&level), "MPI_Query_thread", comm_);
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

  template <reducer Reducer>
  void begin_overlap(const Reducer& reducer, missing_grad missing) {
    if (overlap_ == nullptr) {
      overlap_ = std::make_unique<overlap_state>(*this);
    }
    overlap_state& o = *overlap_;
    o.owner = this;
    o.missing = missing;
    o.reducer = detail::recorded_reducer(reducer, size());
    const detail::bucket_plan& plan =
        reduction_.prepare(std::span<const detail::grad_slot>(slots_), o.reducer, size());
    reduction_.own_buffers();
    o.ready.assign(slots_.size(), 0);
    o.remaining.clear();
    for (const auto& b : plan.buckets()) {
      o.remaining.push_back(b.member_count);
    }
    o.seen.clear();
    o.seen.reserve(slots_.size());
    ++o.generation;
    o.launched = 0;
    o.caller_marked = false;
    o.problem.clear();
    o.problem_flag.store(false);
    o.failure = nullptr;
    o.failure_message.clear();
    o.worker.start(o);
    o.pending = true;
  }

  void report(overlap_state& o, std::string problem) {
    if (!options_.check_agreement) {
      throw invalid_argument(problem);
    }
    if (!o.problem_flag.load()) {
      o.problem = std::move(problem);
      o.problem_flag.store(true, std::memory_order_release);
    }
  }

  void mark_ready(overlap_state& o, std::size_t index) {
    if (index >= slots_.size()) {
      report(o, "cohort: grad_ready on rank " + std::to_string(rank()) + ": index " +
                    std::to_string(index) + " is not a parameter of this " +
                    std::to_string(slots_.size()) + "-parameter set");
      return;
    }
    if (o.ready[index]) {
      report(o, "cohort: grad_ready on rank " + std::to_string(rank()) + ": " +
                    detail::slot_label(slots_[index]) + " (#" + std::to_string(index) +
                    ") was marked ready twice in one step");
      return;
    }
    o.ready[index] = 1;
    o.seen.push_back(index);
    const detail::bucket_plan& plan = reduction_.plan();
    const std::size_t b = plan.bucket_of(index);
    if (b == detail::bucket_plan::no_bucket || --o.remaining[b] != 0) {
      return;
    }
    while (o.launched < o.remaining.size() && o.remaining[o.launched] == 0) {
      ++o.launched;
    }
    o.worker.launch(o.launched);
  }

  // A member template, so that a device strategy (which has no `exchange`) never instantiates it.
  template <reducer Reducer>
  void reduce_buckets(const Reducer& reducer) {
    reduction_.run(std::span<const detail::grad_slot>(slots_), reducer, size(),
                   [this](tensor_view packed, reduce_op op) { self().exchange(packed, op); });
  }

  // On cohort's thread: one bucket, after the ranks agree that none found a problem so far. A
  // failure here is kept rather than thrown, so that the next agreement (of a bucket or of wait)
  // carries it to every rank instead of this rank alone skipping collectives the others are in.
  void reduce_overlapped_bucket(overlap_state& o, std::size_t b) {
    if (options_.check_agreement) {
      std::string problem =
          o.problem_flag.load(std::memory_order_acquire) ? o.problem : std::string();
      if (problem.empty() && o.failure) {
        problem = o.failure_message;
      }
      const detail::bucket& k = reduction_.plan().buckets()[b];
      detail::fingerprint f;
      f.add(b).add(k.count).add(static_cast<std::uint64_t>(k.plan.wire));
      settle_on(grad_world_, "allreduce_grad", f.value(), problem);
    } else if (o.failure) {
      return;
    }
    try {
      reduction_.reduce_bucket(
          b, std::span<const detail::grad_slot>(slots_),
          [this](tensor_view packed, reduce_op op) { self().exchange(packed, op); },
          /*own_buffer=*/true);
    } catch (const std::exception& e) {
      o.failure = std::current_exception();
      o.failure_message = "cohort: allreduce_grad on rank " + std::to_string(rank()) + ": bucket " +
                          std::to_string(b) + " failed: " + e.what();
    }
  }

  boost::mpi::communicator comm_;
  communicator_options options_;
  node_layout layout_;
  boost::mpi::communicator grad_world_;
  boost::mpi::communicator grad_intra_;
  boost::mpi::communicator grad_inter_;
  detail::bucketed_reduction reduction_;
  std::unique_ptr<overlap_state> overlap_;
  std::vector<detail::grad_slot> slots_;
  std::vector<std::string> names_; // the slots' names: a parameter's name may be a temporary
};

//! A communicator of strategy `Strategy` over all the processes (`MPI_COMM_WORLD`). Collective.
template <class Strategy>
Strategy make_communicator(communicator_options options = {}) {
  return Strategy(boost::mpi::communicator(), options);
}

//! A communicator of strategy `Strategy` over the processes of `comm`. Collective over `comm`.
template <class Strategy>
Strategy make_communicator(const boost::mpi::communicator& comm,
                           communicator_options options = {}) {
  return Strategy(comm, options);
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
