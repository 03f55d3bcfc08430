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
#include <cohort/communicator/liveness.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/overlap_worker.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/detail/watchdog.hpp>
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
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
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
  //! Every rank must pass the same strategy and options: they are compared here, whatever
  //! `check_agreement` says, and a difference throws `mismatch_error` on every rank naming the
  //! option and both values.
  explicit mpi_communicator(const boost::mpi::communicator& comm, communicator_options options = {})
      : live_(make_liveness(comm, options))
      , options_(options)
      , reduction_(bucketing(options))
      , overlap_(std::make_unique<overlap_state>()) {
    agree_on_options();
    const detail::watch_scope watch(live_->slot(detail::waiter::caller), "communicator creation",
                                    live_->sequence(detail::waiter::caller), 0, true);
    comm_ = checked_duplicate(comm);
    layout_ = discover_topology(comm_, options.simulated_ranks_per_node);
    grad_world_ = checked_duplicate(comm_);
    grad_intra_ = checked_duplicate(layout_.intra);
    grad_inter_ = checked_duplicate(layout_.inter);
  }

  int rank() const noexcept { return layout_.topo.rank; }
  int size() const noexcept { return layout_.topo.size; }
  int intra_rank() const noexcept { return layout_.topo.intra_rank; }
  int intra_size() const noexcept { return layout_.topo.intra_size; }
  int inter_rank() const noexcept { return layout_.topo.inter_rank; }
  int inter_size() const noexcept { return layout_.topo.inter_size; }
  const cohort::topology& topology() const noexcept { return layout_.topo; }

  //! A reduction still pending on `other` is abandoned first (see `abandon_grad_sync`): cohort's
  //! thread reads the communicator it began on.
  mpi_communicator(mpi_communicator&& other) noexcept
      : live_((other.abandon_grad_sync("its communicator was moved from"), std::move(other.live_)))
      , comm_(std::move(other.comm_))
      , options_(other.options_)
      , layout_(std::move(other.layout_))
      , grad_world_(std::move(other.grad_world_))
      , grad_intra_(std::move(other.grad_intra_))
      , grad_inter_(std::move(other.grad_inter_))
      , reduction_(std::move(other.reduction_))
      , overlap_(std::move(other.overlap_))
      , slots_(std::move(other.slots_))
      , names_(std::move(other.names_)) {}

  //! Abandons a reduction pending on either side, then takes `other`'s place (this rank leaves
  //! the communicator it had: its peers are told, see liveness.hpp).
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      abandon_grad_sync("its communicator was replaced by move assignment");
      other.abandon_grad_sync("its communicator was moved from");
      overlap_ = std::move(other.overlap_);
      slots_ = std::move(other.slots_);
      names_ = std::move(other.names_);
      reduction_ = std::move(other.reduction_);
      grad_inter_ = std::move(other.grad_inter_);
      grad_intra_ = std::move(other.grad_intra_);
      grad_world_ = std::move(other.grad_world_);
      layout_ = std::move(other.layout_);
      options_ = other.options_;
      comm_ = std::move(other.comm_);
      live_ = std::move(other.live_);
    }
    return *this;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  //! Abandons an overlapped reduction still pending (the other ranks get an error; nothing this
  //! rank did not mark ready is sent), so that cohort's thread never outlives what it reads and
  //! no rank is left waiting in the collectives of buckets this rank would never send. Then tells
  //! the other ranks that this rank leaves the communicator.
  ~mpi_communicator() {
    abandon_grad_sync(std::uncaught_exceptions() > 0
                          ? "its communicator was destroyed during the unwinding of an exception"
                          : "its communicator was destroyed");
  }

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
    {
      const auto watch = watch_transfer("split", 0);
      mpi::check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split", comm_);
    }
    const boost::mpi::communicator adopted = detail::adopt(part);
    return Strategy(adopted, options_);
  }

  //! Returns once every rank has called it. A rank that never comes ends the job after the
  //! timeout, naming it.
  void barrier() const {
    detail::operation_scope scope("barrier");
    std::array<std::uint64_t, 1> nothing{};
    live_->allreduce_max(detail::waiter::caller, nothing, "barrier",
                         live_->next_sequence(detail::waiter::caller));
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
    const auto watch = watch_transfer("allreduce", v.size_bytes());
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
    const auto watch = watch_transfer("broadcast", v.size_bytes());
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
    const auto watch = watch_transfer("allgather", o.size_bytes());
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
    const auto watch = watch_transfer("reduce_scatter", i.size_bytes());
    mpi::reduce_scatter(comm_, i, o, op);
  }

  //! Sends `t` to `dest`.
  template <tensor T>
  requires host_tensor<T>
  void send(const T& t, int dest, int tag = 0) {
    detail::operation_scope scope("send");
    check_peer(dest, "send");
    const const_tensor_view v = host_const_view(t, "send");
    const auto watch = watch_point_to_point("send", v.size_bytes());
    mpi::send(comm_, v, dest, tag);
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
    const tensor_view v = host_view(t, "recv");
    const auto watch = watch_point_to_point("recv", v.size_bytes());
    mpi::recv(comm_, v, source, tag);
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
    const auto watch = watch_transfer("bcast_obj", 0);
    // A serialization that fails on one rank would leave the others in the collective.
    fatal_on_failure("bcast_obj", [&] {
      mpi::translate("bcast_obj", comm_, [&] { boost::mpi::broadcast(comm_, value, root); });
    });
    return value;
  }

  //! Every rank's `obj` at `root`, in rank order; an empty vector elsewhere.
  template <class T>
  std::vector<T> gather_obj(const T& obj, int root = 0) {
    detail::operation_scope scope("gather_obj");
    agree_root("gather_obj", root);
    std::vector<T> all;
    const auto watch = watch_transfer("gather_obj", 0);
    // A serialization that fails on one rank would leave the others in the collective.
    fatal_on_failure("gather_obj", [&] {
      mpi::translate("gather_obj", comm_, [&] { boost::mpi::gather(comm_, obj, all, root); });
    });
    return all;
  }

  //! Every rank's `obj` on every rank, in rank order.
  template <class T>
  std::vector<T> allgather_obj(const T& obj) {
    detail::operation_scope scope("allgather_obj");
    settle("allgather_obj", detail::fingerprint{}.add("allgather_obj").value(), nullptr, {});
    const auto watch = watch_transfer("allgather_obj", 0);
    std::vector<T> all;
    // A serialization that fails on one rank would leave the others in the collective.
    fatal_on_failure("allgather_obj", [&] {
      mpi::translate("allgather_obj", comm_, [&] { boost::mpi::all_gather(comm_, obj, all); });
    });
    return all;
  }

  //! Combines every rank's `obj` with `op` (by default `+`), on every rank.
  template <class T, class Op = std::plus<T>>
  T allreduce_obj(const T& obj, Op op = {}) {
    detail::operation_scope scope("allreduce_obj");
    settle("allreduce_obj", detail::fingerprint{}.add("allreduce_obj").value(), nullptr, {});
    const auto watch = watch_transfer("allreduce_obj", 0);
    T result{};
    // A serialization that fails on one rank would leave the others in the collective.
    fatal_on_failure("allreduce_obj", [&] {
      mpi::translate("allreduce_obj", comm_,
                     [&] { boost::mpi::all_reduce(comm_, obj, result, op); });
    });
    return result;
  }

  template <class T>
  void send_obj(const T& obj, int dest, int tag = 0) {
    detail::operation_scope scope("send_obj");
    check_peer(dest, "send_obj");
    const auto watch = watch_point_to_point("send_obj", 0);
    mpi::translate("send_obj", comm_, [&] { comm_.send(dest, tag, obj); });
  }

  template <class T>
  T recv_obj(int source, int tag = 0) {
    detail::operation_scope scope("recv_obj");
    check_peer(source, "recv_obj");
    T obj{};
    const auto watch = watch_point_to_point("recv_obj", 0);
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
    const auto watch = watch_transfer("broadcast_parameters", 0);
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
    // After the ranks agreed: a failure here (a buffer that cannot grow) ends the job.
    fatal_on_failure("broadcast_parameters", [&] {
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
    });
  }

  //! Reduces every parameter's gradient over all ranks as `reducer` says (for `mean`: the
  //! average), in place. Before anything is reduced, the ranks agree on the layout and on the
  //! reducer's plan for each dtype (if the check is on); a parameter without a gradient is
  //! reported or zero-filled as `options` says. A failure inside the exchange, after the ranks
  //! agreed to run it, leaves the others inside collectives this rank will not finish: it ends
  //! the job with a message naming the rank and the cause.
  template <parameter_set Params, reducer Reducer>
  void allreduce_grad(Params&& params, const Reducer& reducer, grad_sync_options options = {}) {
    detail::operation_scope scope("allreduce_grad");
    require_no_pending("allreduce_grad", nullptr);
    detail::collect_gradients(params, options.missing, slots_, names_);
    if constexpr (!device_strategy()) {
      validate_slots(options.missing, "blocking", reducer);
      const auto watch = watch_transfer("allreduce_grad", live_->bytes(detail::waiter::caller));
      fatal_on_failure("allreduce_grad", [&] {
        const std::size_t buckets = reduction_.plan().buckets().size();
        for (std::size_t b = 0; b < buckets; ++b) {
          reduction_.reduce_bucket(b, std::span<const detail::grad_slot>(slots_), exchanger());
        }
      });
    } else {
      validate_slots(options.missing, "blocking", reducer);
      const auto watch = watch_transfer("allreduce_grad", live_->bytes(detail::waiter::caller));
      fatal_on_failure("allreduce_grad", [&] {
        self().reduce_gradients(std::span<const detail::grad_slot>(slots_), reducer);
      });
    }
  }

  // ---- gradients reduced while backward runs ------------------------------------------------

  //! Begins a reduction of `params`' gradients that overlaps with backward: call `ready(i)` on
  //! the request as parameter i's gradient becomes final (from a hook, from any thread), and
  //! `wait()` before the optimizer step. A bucket is reduced, on cohort's own thread, as soon as
  //! its gradients are ready and the buckets before it are on their way; the order gradients
  //! become ready in the first step is learned (rank 0's) and the buckets rebuilt for it.
  //! Collective: the ranks agree on the layout now, so every gradient tensor must exist, with its
  //! final size, already. Needs MPI started with `MPI_THREAD_MULTIPLE` (throws `cohort::error`
  //! otherwise).
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
  //! wrapper): start, say which gradient is ready, wait. `owner` names who started it (an
  //! optimizer: several may share a communicator, and each must reduce only its own gradients).
  template <parameter_set Params, reducer Reducer>
  void start_grad_sync(Params& params, const Reducer& reducer, grad_sync_options options = {},
                       const void* owner = nullptr) {
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    start_locked(o, params, reducer, options, owner);
  }

  //! Starts an overlapped reduction of gradients given as views (which the caller keeps alive and
  //! does not touch until `wait_grad_sync`): for a wrapper that reduces a copy of the gradients.
  template <reducer Reducer>
  void start_grad_sync(std::span<const detail::grad_slot> slots, const Reducer& reducer,
                       const void* owner = nullptr) {
    detail::operation_scope scope("allreduce_grad");
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    require_overlap_possible(o, owner);
    slots_.assign(slots.begin(), slots.end());
    validate_slots(missing_grad::report, "overlapped", reducer);
    begin_overlap(o, reducer, missing_grad::report, owner);
  }

  //! Parameter `index` of `params` (the set the reduction began with) has its final gradient: it
  //! is read again, and its bucket reduced if that completes it. Safe from any thread.
  template <parameter_set Params>
  void grad_ready(Params& params, std::size_t index) {
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    require_pending(o, "grad_ready");
    reread_and_mark(o, params, index);
  }

  //! What an optimizer's backward hook calls, from any thread: the first call of a step begins
  //! the reduction for `owner` (collective, as `start_grad_sync`), and every call marks parameter
  //! `index` ready. Throws `invalid_argument` if another owner's reduction is pending.
  template <parameter_set Params, reducer Reducer>
  void grad_ready_for(const void* owner, Params& params, const Reducer& reducer,
                      grad_sync_options options, std::size_t index) {
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    if (!o.pending) {
      start_locked(o, params, reducer, options, owner);
    } else if (o.owner != owner) {
      throw invalid_argument(
          "cohort: grad_ready(" + std::to_string(index) + ") on rank " + std::to_string(rank()) +
          ": another optimizer's overlapped reduction is pending on this communicator (its hooks "
          "marked gradients ready and it has not stepped): step it before this backward, keep "
          "its hooks quiet during this backward with its no_sync() (a GAN's discriminator during "
          "the generator's backward), or give each optimizer a communicator of its own");
    }
    reread_and_mark(o, params, index);
  }

  //! Gradient `index` of the views given to `start_grad_sync` is final.
  void grad_ready(std::size_t index) {
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    require_pending(o, "grad_ready");
    o.caller_marked = true;
    mark_ready(o, index);
  }

  //! Marks every gradient not yet ready as ready (in index order). This order is never learned:
  //! it says nothing of when backward produces the gradients.
  void mark_all_ready() {
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    require_pending(o, "grad_ready");
    mark_rest_ready(o);
  }

  //! Marks the rest ready, and waits until every bucket is reduced. Collective. Rethrows the
  //! first error on every rank (a gradient whose size changed on one rank throws everywhere).
  void wait_grad_sync() {
    overlap_state& o = *overlap_;
    {
      const std::lock_guard lock(o.mutex);
      require_pending(o, "wait");
      mark_rest_ready(o);
    }
    finish_pending(o);
  }

  //! Ends a pending overlapped reduction without sending what was not marked ready: a rank must
  //! never send a gradient its backward did not produce. The buckets already on their way are
  //! finished; at the next bucket (or at the end) every rank gets an error naming this rank and
  //! `why`. With the agreement check off, this rank skips the rest and its peers wait for it
  //! until the timeout ends the job. Does nothing if no reduction is pending.
  void abandon_grad_sync(std::string_view why) noexcept {
    if (!overlap_ || !grad_sync_pending()) {
      return;
    }
    overlap_state& o = *overlap_;
    try {
      {
        const std::lock_guard lock(o.mutex);
        if (!o.pending) {
          return;
        }
        o.abandoned_from.store(o.launched);
        report(o, "cohort: rank " + std::to_string(rank()) +
                      " abandoned its overlapped gradient reduction (" + std::string(why) +
                      "): the gradients it had not marked ready were never sent");
        o.launched = o.remaining.size();
        o.worker->launch(o.launched);
      }
      finish_pending(o);
    } catch (...) {
      // Every rank is told through the agreement; this rank has nothing more to say.
    }
  }

  //! Checks gradients about to be reduced from copies (collective, as `allreduce_grad` checks its
  //! own): a wrapper that must refuse a step before it touches anything calls this first.
  template <reducer Reducer>
  void validate_grad_sync(std::span<const detail::grad_slot> slots, const Reducer& reducer,
                          missing_grad missing) {
    detail::operation_scope scope("allreduce_grad");
    detail::validate_gradients(*live_, detail::waiter::caller, "allreduce_grad",
                               live_->next_sequence(detail::waiter::caller), slots,
                               options_.check_agreement, missing, std::string(), "double-buffered",
                               [&](dtype type) { return reducer.plan(type, size()); });
  }

  //! Whether an overlapped reduction has begun and not been waited on.
  bool grad_sync_pending() const noexcept { return overlap_ != nullptr && overlap_->pending; }

  //! Whether every bucket of the pending overlapped reduction is reduced (or none is pending):
  //! `wait_grad_sync` would then only agree on the end of the step. Does not wait for transfers.
  bool grad_sync_complete() const {
    if (!grad_sync_pending()) {
      return true;
    }
    overlap_state& o = *overlap_;
    const std::lock_guard lock(o.mutex);
    return o.launched == o.remaining.size() && o.worker->idle();
  }

  //! Whether the pending overlapped reduction is `owner`'s.
  bool grad_sync_pending_for(const void* owner) const noexcept {
    return grad_sync_pending() && overlap_->owner == owner;
  }

  //! Counts the overlapped reductions begun so far (what tells a request its own one).
  std::uint64_t grad_sync_generation() const noexcept {
    return overlap_ != nullptr ? overlap_->generation : 0;
  }

  //! Bytes held by the gradient buckets of the last layout reduced (0 for device strategies).
  std::size_t bucket_buffer_bytes() const noexcept { return reduction_.buffer_bytes(); }

  //! Buckets (collectives) per step of the last layout reduced (0 for device strategies).
  std::size_t bucket_count() const noexcept { return reduction_.bucket_count(); }

protected:
  //! For a strategy whose `exchange` uses members of its own: abandons a pending reduction
  //! before they go (from its destructor).
  void finish_overlap() noexcept { abandon_grad_sync("its communicator was destroyed"); }

  //! Checks `slots_` (collective): this rank's own problems first, where the gradients live and
  //! what the strategy asks of their memory (a strategy may declare `void
  //! check_gradient_memory(const detail::grad_slot&)`, which throws `invalid_argument`); then,
  //! for host strategies, the bucket plan is prepared and every buffer the exchange needs is
  //! allocated (a strategy may declare `void prepare_exchange(const detail::bucket&)`), so that
  //! nothing fails on one rank alone once the ranks have agreed; then the ranks agree on the
  //! layout, the reducer's plan, those problems and `mode`, so that a problem on one rank is an
  //! error on every rank.
  template <reducer Reducer>
  void validate_slots(missing_grad missing, std::string_view mode, const Reducer& reducer) {
    std::string problem = local_checks([&] {
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
    if constexpr (!device_strategy()) {
      const bool usable = std::ranges::all_of(slots_, [](const detail::grad_slot& slot) {
        return slot.state == detail::slot_state::ok;
      });
      if (problem.empty() && usable) {
        try {
          prepare_buckets(reducer, mode != "blocking");
        } catch (const std::exception& e) {
          problem = "cohort: allreduce_grad on rank " + std::to_string(rank()) +
                    ": preparing the reduction's buffers failed: " + e.what();
        }
      }
    }
    std::size_t bytes = 0;
    for (const auto& slot : slots_) {
      bytes += slot.grad.size_bytes();
    }
    const std::uint64_t sequence = live_->next_sequence(detail::waiter::caller, bytes);
    detail::validate_gradients(*live_, detail::waiter::caller, "allreduce_grad", sequence, slots_,
                               options_.check_agreement, missing, problem, mode,
                               [&](dtype type) { return reducer.plan(type, size()); });
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

  static void require_mpi() {
    if (!boost::mpi::environment::initialized() || boost::mpi::environment::finalized()) {
      throw error("cohort: MPI is not running: create a boost::mpi::environment before a "
                  "cohort communicator, and keep it alive while the communicator is used");
    }
  }

  static boost::mpi::communicator checked_duplicate(const boost::mpi::communicator& comm) {
    require_mpi();
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
  //! Without the agreement check a problem throws at once, on its own rank only. The comparison
  //! is also the rendezvous that notices a rank gone or stuck (liveness.hpp).
  template <class Describe>
  void settle(const char* operation, std::uint64_t hash, Describe&& describe,
              const std::string& problem, std::size_t bytes = 0) const {
    const std::uint64_t sequence = live_->next_sequence(detail::waiter::caller, bytes);
    if (options_.check_agreement) {
      agree_on_problems(detail::waiter::caller, operation, sequence, hash, describe, problem);
    }
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  //! `settle` at the rendezvous of cohort's reduction thread (or of the end of its step).
  template <class Describe = std::nullptr_t>
  void settle_on(detail::waiter who, const char* operation, std::uint64_t hash,
                 const std::string& problem, Describe&& describe = nullptr,
                 std::size_t bytes = 0) const {
    agree_on_problems(who, operation, live_->next_sequence(who, bytes), hash, describe, problem);
    if (!problem.empty()) {
      throw invalid_argument(problem);
    }
  }

  template <class Describe>
  void agree_on_problems(detail::waiter who, const char* operation, std::uint64_t sequence,
                         std::uint64_t hash, Describe&& describe,
                         const std::string& problem) const {
    detail::fingerprint f;
    f.add(hash).add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    detail::require_agreement(*live_, who, operation, sequence, f.value(), [&] {
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

  void agree(const char* operation, std::size_t count, dtype type, int detail_value,
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
        problem, count * size_of(type));
  }

  void agree_root(const char* operation, int root) const {
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

  //! A blocking call after the rendezvous, watched by the watchdog: `agreed` says every rank had
  //! arrived.
  detail::watch_scope watch_transfer(const char* operation, std::size_t bytes) const noexcept {
    return detail::watch_scope(live_->slot(detail::waiter::caller), operation,
                               live_->sequence(detail::waiter::caller), bytes,
                               options_.check_agreement);
  }
  //! A blocking point-to-point call: no rendezvous precedes it.
  detail::watch_scope watch_point_to_point(const char* operation,
                                           std::size_t bytes) const noexcept {
    return detail::watch_scope(live_->slot(detail::waiter::caller), operation,
                               live_->sequence(detail::waiter::caller), bytes, false);
  }

  // Runs the exchange of gradients that every rank agreed to run. If it throws on this rank, the
  // others are inside collectives this rank will not finish, and no error can reach them: the
  // job ends, naming this rank and the cause, instead of hanging.
  template <class F>
  void fatal_on_failure(const char* operation, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      if (size() == 1) {
        throw;
      }
      detail::end_job("cohort: rank " + std::to_string(rank()) + ": " + operation +
                      " failed inside its exchange, after the ranks agreed to run it (" + e.what() +
                      "); the other ranks cannot finish its collectives; ending the job");
    }
  }

private:
  // What a reduction that overlaps backward keeps between calls: behind a pointer so that the
  // communicator stays movable; its thread is made on first use. `mutex` guards every field;
  // cohort's thread reads the plan and the slots of buckets launched to it, and `problem` once
  // `problem_flag` is raised. Hooks may call from several threads at once (LibTorch's autograd
  // does).
  struct overlap_state {
    void reduce_bucket(std::size_t b) { comm->reduce_overlapped_bucket(*this, b); }

    std::mutex mutex;
    mpi_communicator* comm = nullptr; // the communicator of the step in flight
    // Written under `mutex`; read without it by the pending queries (atomics, for that).
    std::atomic<const void*> owner{nullptr}; // who began it (an optimizer), for its own hooks only
    std::atomic<bool> pending{false};
    bool threads_checked = false;
    missing_grad missing = missing_grad::report;
    std::vector<char> ready;
    std::vector<std::size_t> remaining;      // per bucket: members not yet ready
    std::vector<std::size_t> seen;           // the order gradients became ready in
    std::vector<std::int64_t> order_message; // rank 0's `seen`, broadcast while learning
    std::vector<std::size_t> learned;        // an order to rebuild the plan with, at the next step
    std::uint64_t learned_key = 0;           // of the layout it was seen on
    bool has_learned = false;
    std::size_t launched = 0;
    // Buckets from here on were launched by abandon_grad_sync: their gradients were never
    // marked ready, so they are never sent.
    std::atomic<std::size_t> abandoned_from{std::numeric_limits<std::size_t>::max()};
    bool caller_marked = false; // grad_ready was called, not only mark_all_ready
    std::uint64_t generation = 0;
    std::string problem; // the first local problem; written before problem_flag is raised
    std::atomic<bool> problem_flag{false};
    std::unique_ptr<detail::overlap_worker<overlap_state>> worker; // last: its thread stops first
  };

  static std::unique_ptr<detail::liveness> make_liveness(const boost::mpi::communicator& comm,
                                                         const communicator_options& options) {
    require_mpi();
    return std::make_unique<detail::liveness>(comm, options.timeout);
  }

  // The strategy and every option, compared across ranks once, whatever check_agreement says
  // (ranks that disagree on it could not even agree to compare later).
  void agree_on_options() {
    std::string strategy_name = "a strategy without a name";
    if constexpr (requires { Strategy::name; }) {
      strategy_name = std::string(Strategy::name);
    }
    int ranks_per_node = 0;
    const std::string problem = local_checks([&] {
      ranks_per_node = detail::ranks_per_node_override(options_.simulated_ranks_per_node);
    });
    const std::vector<std::pair<const char*, std::string>> values = {
        {"the strategy", strategy_name},
        // Same name, other template arguments (hierarchical<Intra, Inter>): the type tells.
        {"the strategy's type", typeid(Strategy).name()},
        {"check_agreement", options_.check_agreement ? "true" : "false"},
        {"bucket_bytes", std::to_string(options_.bucket_bytes)},
        {"first_bucket_bytes", std::to_string(options_.first_bucket_bytes)},
        {"fusion_threshold_bytes", std::to_string(options_.fusion_threshold_bytes)},
        {"timeout", std::to_string(options_.timeout.count()) + " ms"},
        {"ranks per node (simulated_ranks_per_node or COHORT_RANKS_PER_NODE)",
         ranks_per_node == 0 ? std::string("as MPI says") : std::to_string(ranks_per_node)}};
    detail::fingerprint f;
    for (const auto& [name, value] : values) {
      f.add(name).add(value);
    }
    f.add(static_cast<std::uint64_t>(problem.empty() ? 0 : 1));
    detail::require_agreement(*live_, detail::waiter::caller, "communicator creation",
                              live_->next_sequence(detail::waiter::caller), f.value(), [&] {
                                std::vector<detail::signature_entry> described;
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

  static detail::bucket_limits bucketing(const communicator_options& options) {
    if constexpr (requires { Strategy::bucket_limits_for(options); }) {
      return Strategy::bucket_limits_for(options);
    } else {
      return {options.bucket_bytes, options.first_bucket_bytes,
              std::min(options.fusion_threshold_bytes, options.bucket_bytes)};
    }
  }

  Strategy& self() noexcept { return static_cast<Strategy&>(*this); }

  // How a host strategy reduces one packed bucket.
  auto exchanger() {
    return [this](tensor_view packed, reduce_op op) { self().exchange(packed, op); };
  }

  // The plan of the current layout (rebuilt in the order learned at an earlier step, if any),
  // its buffers, and whatever the strategy's exchange will need: allocated before the ranks
  // agree, so that a failure here is a problem every rank hears of.
  template <reducer Reducer>
  void prepare_buckets(const Reducer& reducer, bool overlapped) {
    const std::span<const detail::grad_slot> slots(slots_);
    reduction_.prepare(slots, reducer, size());
    overlap_state& o = *overlap_;
    if (o.has_learned && o.learned_key == reduction_.current_key() && reduction_.learning()) {
      reduction_.learn_order(slots, o.learned, reducer, size());
      o.has_learned = false;
    }
    if (overlapped) {
      reduction_.own_buffers();
    }
    if constexpr (requires(Strategy & s, const detail::bucket& b) { s.prepare_exchange(b); }) {
      for (const detail::bucket& b : reduction_.plan().buckets()) {
        self().prepare_exchange(b);
      }
    }
  }

  void require_no_pending(std::string_view operation, const void* owner) const {
    if (grad_sync_pending()) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(rank()) + ": " +
          (overlap_->owner != owner && overlap_->owner != nullptr
               ? "another optimizer's overlapped reduction is pending on this communicator (it "
                 "marked gradients ready and has not stepped); step it first, or give each "
                 "optimizer a communicator of its own"
               : "an overlapped allreduce_grad is still pending; wait() on it first"));
    }
  }

  void require_pending(const overlap_state& o, std::string_view operation) const {
    if (!o.pending) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(rank()) +
                             ": no overlapped allreduce_grad is pending (begin_allreduce_grad "
                             "starts one)");
    }
  }

  void require_overlap_possible(overlap_state& o, const void* owner) {
    static_assert(!device_strategy(), "cohort: overlap needs a host strategy (flat, ...)");
    require_no_pending("begin_allreduce_grad", owner);
    if (!o.threads_checked) {
      require_threads();
      o.threads_checked = true;
    }
    if (!o.worker) {
      // Before the ranks agree: a thread that cannot start fails on this rank alone, safely.
      o.worker = std::make_unique<detail::overlap_worker<overlap_state>>();
    }
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

  // Under o.mutex.
  template <parameter_set Params, reducer Reducer>
  void start_locked(overlap_state& o, Params& params, const Reducer& reducer,
                    grad_sync_options options, const void* owner) {
    detail::operation_scope scope("allreduce_grad");
    require_overlap_possible(o, owner);
    detail::collect_gradients(params, options.missing, slots_, names_);
    validate_slots(options.missing, "overlapped", reducer);
    begin_overlap(o, reducer, options.missing, owner);
  }

  // Under o.mutex; after validate_slots prepared the plan.
  template <reducer Reducer>
  void begin_overlap(overlap_state& o, const Reducer&, missing_grad missing, const void* owner) {
    o.comm = this;
    o.owner = owner;
    o.missing = missing;
    const detail::bucket_plan& plan = reduction_.plan();
    o.ready.assign(slots_.size(), 0);
    o.remaining.clear();
    for (const auto& b : plan.buckets()) {
      o.remaining.push_back(b.member_count);
    }
    o.seen.clear();
    o.seen.reserve(slots_.size());
    ++o.generation;
    o.launched = 0;
    o.abandoned_from.store(std::numeric_limits<std::size_t>::max());
    o.caller_marked = false;
    o.problem.clear();
    o.problem_flag.store(false);
    o.worker->start(o);
    o.pending = true;
  }

  // Under o.mutex: reads parameter `index` again and marks it ready.
  template <parameter_set Params>
  void reread_and_mark(overlap_state& o, Params& params, std::size_t index) {
    // A gradient already marked may be in flight on cohort's thread: never touch its view again.
    if (index < slots_.size() && !o.ready[index]) {
      const detail::grad_slot now = detail::collect_one(nth(params, index), o.missing);
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

  // Element `index` of a parameter set: in O(1) where the set is random-access.
  template <parameter_set Params>
  static decltype(auto) nth(Params& params, std::size_t index) {
    auto it = std::ranges::begin(params);
    std::ranges::advance(it, static_cast<std::ranges::range_difference_t<Params>>(index));
    return *it;
  }

  // A problem found on this rank during the step: every rank hears of it at the next agreement.
  void report(overlap_state& o, std::string problem) {
    if (!options_.check_agreement) {
      if (o.abandoned_from.load() != std::numeric_limits<std::size_t>::max()) {
        return; // abandoning: nothing to tell without the agreement
      }
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
    std::size_t launched = o.launched;
    while (launched < o.remaining.size() && o.remaining[launched] == 0) {
      ++launched;
    }
    if (launched != o.launched) {
      o.launched = launched;
      o.worker->launch(launched);
    }
  }

  void mark_rest_ready(overlap_state& o) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!o.ready[i]) {
        mark_ready(o, i);
      }
    }
    // Buckets whose members are all empty gradients have nothing to wait for.
    if (o.launched < o.remaining.size()) {
      o.launched = o.remaining.size();
      o.worker->launch(o.launched);
    }
  }

  // Waits for cohort's thread, then ends the step with an agreement on what every rank found
  // (collective). Every bucket has been launched.
  void finish_pending(overlap_state& o) {
    detail::operation_scope scope("allreduce_grad");
    struct done_on_exit {
      overlap_state& o;
      ~done_on_exit() {
        // Whatever threw, cohort's thread is done with this step before the next may start.
        try {
          o.worker->wait();
        } catch (...) {
        }
        const std::lock_guard lock(o.mutex);
        o.pending = false;
      }
    } done{o};
    // A bucket's agreement that failed failed on every rank alike: rethrown here everywhere.
    o.worker->wait();
    // A problem found after the last bucket left (a gradient marked twice, say): an error on
    // every rank, the failing rank's own.
    const std::string problem = o.problem_flag.load() ? o.problem : std::string();
    if (options_.check_agreement) {
      settle_on(detail::waiter::reducer, "allreduce_grad (end of the step)", 0, problem);
    } else if (!problem.empty()) {
      throw invalid_argument(problem);
    }
    if (reduction_.learning() &&
        o.abandoned_from.load() == std::numeric_limits<std::size_t>::max()) {
      // Every rank adopts rank 0's order, so the buckets stay the same everywhere; and only an
      // order the caller gave (not the index order of mark_all_ready) is worth learning. The
      // plan is rebuilt at the next step, before its agreement (a rebuild allocates).
      std::vector<std::int64_t>& order = o.order_message; // reused: no allocation per step
      order.assign(o.seen.size() + 1, o.caller_marked ? 1 : 0);
      std::copy(o.seen.begin(), o.seen.end(), order.begin() + 1);
      {
        const detail::watch_scope watch(
            live_->slot(detail::waiter::reducer), "allreduce_grad (learning the order)",
            live_->sequence(detail::waiter::reducer), 0, options_.check_agreement);
        mpi::broadcast(grad_world_,
                       tensor_view{order.data(), order.size(), dtype::int64, memory_location::host},
                       0);
      }
      if (order[0] == 1) {
        o.learned.assign(order.begin() + 1, order.end());
        o.learned_key = reduction_.current_key();
        o.has_learned = true;
      }
    }
  }

  // On cohort's thread: one bucket, after the ranks agree that none found a problem so far. A
  // failure before the exchange (the agreement) is the same on every rank: the worker skips the
  // rest of the step everywhere alike. A failure inside the exchange ends the job.
  void reduce_overlapped_bucket(overlap_state& o, std::size_t b) {
    const detail::bucket& k = reduction_.plan().buckets()[b];
    if (options_.check_agreement) {
      std::string problem =
          o.problem_flag.load(std::memory_order_acquire) ? o.problem : std::string();
      detail::fingerprint f;
      f.add(b).add(k.count).add(static_cast<std::uint64_t>(k.plan.wire));
      settle_on(
          detail::waiter::reducer, "allreduce_grad (a bucket)", f.value(), problem,
          [&] { return describe_bucket(b); }, k.count * size_of(k.plan.wire));
    }
    if (b >= o.abandoned_from.load()) {
      return;
    }
    const detail::watch_scope watch(live_->slot(detail::waiter::reducer),
                                    "allreduce_grad (a bucket)",
                                    live_->sequence(detail::waiter::reducer),
                                    k.count * size_of(k.plan.wire), options_.check_agreement);
    fatal_on_failure("allreduce_grad (a bucket on cohort's thread)", [&] {
      reduction_.reduce_bucket(b, std::span<const detail::grad_slot>(slots_), exchanger(),
                               /*own_buffer=*/true);
    });
  }

  // Bucket b of the current plan, for a mismatch message: its size, its wire dtype, its members.
  std::vector<detail::signature_entry> describe_bucket(std::size_t b) const {
    const detail::bucket_plan& plan = reduction_.plan();
    const detail::bucket& k = plan.buckets()[b];
    std::string members;
    for (const std::size_t s : plan.members(k)) {
      members += (members.empty() ? "" : ", ") + detail::slot_label(slots_[s]);
    }
    return {{"bucket " + std::to_string(b) + " of " + std::to_string(plan.buckets().size()),
             detail::describe_tensor(k.count, k.plan.wire) + " on the wire, " +
                 (k.in_place ? "in place" : "packed") + " from " + members}};
  }

  std::unique_ptr<detail::liveness> live_; // first: gone last, after cohort's thread
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
