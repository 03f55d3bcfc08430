// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every communicator has whatever its strategy: the topology, and the collectives of host
// tensors and of serializable objects, each behind the checks (engine/checks.hpp). Not a
// template, so that it is compiled once; basic_communicator<Strategy> adds what depends on the
// strategy (construction, parameters and gradients).

#include <cohort/communicator/engine/agreed_views.hpp>
#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/object_collectives.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
// (Not needed here, but every trainer that makes a communicator makes a boost::mpi::environment
// first, and the getting-started code includes <cohort/cohort.hpp> alone for it.)
#include <boost/mpi/environment.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
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

//! The strategy-independent half of every communicator (see basic_communicator).
class communicator_base {
public:
  int rank() const noexcept { return layout_.topo.rank; }
  int size() const noexcept { return layout_.topo.size; }
  int intra_rank() const noexcept { return layout_.topo.intra_rank; }
  int intra_size() const noexcept { return layout_.topo.intra_size; }
  int inter_rank() const noexcept { return layout_.topo.inter_rank; }
  int inter_size() const noexcept { return layout_.topo.inter_size; }
  const cohort::topology& topology() const noexcept { return layout_.topo; }

  //! The Boost.MPI communicator underneath (cohort's duplicate), for the user's own MPI calls.
  //! Its error handler is MPI_ERRORS_RETURN (cohort turns errors into exceptions): a raw MPI call
  //! on it returns an error code instead of aborting, so check the codes.
  const boost::mpi::communicator& mpi_comm() const noexcept { return comm_; }
  //! The ranks of this node, and the ranks with the same intra_rank across nodes.
  const boost::mpi::communicator& intra_comm() const noexcept { return layout_.intra; }
  const boost::mpi::communicator& inter_comm() const noexcept { return layout_.inter; }
  const communicator_options& options() const noexcept { return checks_.options(); }

  //! Whether this rank writes a trace (communicator_options::trace_directory, or COHORT_TRACE),
  //! and the file.
  bool traced() const noexcept { return checks_.trace_file() != nullptr; }
  std::filesystem::path trace_file() const;
  //! Stops recording this rank's spans until `resume_trace`, to trace chosen steps only (as
  //! Horovod's stop_timeline and start_timeline); nothing where no trace is written. Each rank
  //! decides for itself. Between steps, from the trainer's thread: a gradient step already begun
  //! keeps its step and bucket spans as it began (its agreements follow the switch).
  void pause_trace() const noexcept { set_trace_recording(false); }
  void resume_trace() const noexcept { set_trace_recording(true); }

  //! Returns once every rank has called it. A rank that never comes ends the job after the
  //! timeout, naming it.
  void barrier() const;

protected:
  void set_trace_recording(bool on) const noexcept;

  //! The MPI communicator of `split` (collective): the ranks that pass the same `color` (>= 0),
  //! ordered by `key`; a bad color throws on every rank.
  MPI_Comm split_comm(int color, int key) const;

public:
  // ---- tensor collectives ------------------------------------------------------------------

  //! Reduces `t` over all ranks, in place.
  template <writable_tensor T>
  requires host_tensor<T>
  void allreduce(T& t, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("allreduce");
    tensor_view v;
    const std::string problem = engine::local_checks([&] { v = host_view(t, "allreduce"); });
    // A small one is done in the agreement's own round trip.
    if (checks_.agree_reducing("allreduce", v, op, problem)) {
      return;
    }
    const auto watch = checks_.watch_transfer("allreduce", v.size_bytes());
    mpi::allreduce(comm_, v, op, options().segment_bytes);
  }

  //! Non-blocking `allreduce`: `t` must not be touched until the request is waited on.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request iallreduce(T& t, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("iallreduce");
    return mpi::iallreduce(comm_, agreed_view(t, "iallreduce", static_cast<int>(op), "op"), op,
                           options().segment_bytes);
  }

  //! Copies `t` from `root` to every rank.
  template <writable_tensor T>
  requires host_tensor<T>
  void broadcast(T& t, int root = 0) {
    detail::operation_scope scope("broadcast");
    const tensor_view v = agreed_view(t, "broadcast", root, "root", true);
    const auto watch = checks_.watch_transfer("broadcast", v.size_bytes());
    mpi::broadcast(comm_, v, root);
  }

  //! Non-blocking `broadcast`.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request ibroadcast(T& t, int root = 0) {
    detail::operation_scope scope("ibroadcast");
    return mpi::ibroadcast(comm_, agreed_view(t, "ibroadcast", root, "root", true), root);
  }

  //! Copies each of `values` from its own root, `roots[i]`, every copy in flight at once: what a
  //! `broadcast` of each in turn does, but with several roots every link carries data both ways
  //! (a sharded optimizer's parameters, each from its owner). The ranks agree on every value's
  //! count, dtype and root in one rendezvous first: a rendezvous between the copies would wait
  //! behind them on the links. On nodes of several ranks each (as many on every node), a value
  //! crosses to each other node once, then spreads inside it. Host memory; the values must not
  //! overlap. Collective.
  void broadcast_each(std::span<const tensor_view> values, std::span<const int> roots);

  //! Gathers every rank's `in` into `out` (size() * in's size elements, rank r's at r * n).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void allgather(const In& in, Out& out) {
    detail::operation_scope scope("allgather");
    const auto v = agreed_blocks(in, out, "allgather", false, 0, "");
    const auto watch = checks_.watch_transfer("allgather", v.out.size_bytes());
    mpi::allgather(comm_, v.in, v.out);
  }

  //! Non-blocking `allgather`.
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out> mpi::request iallgather(const In& in, Out& out) {
    detail::operation_scope scope("iallgather");
    const auto v = agreed_blocks(in, out, "iallgather", false, 0, "");
    return mpi::iallgather(comm_, v.in, v.out);
  }

  //! Reduces `in` (size() * n elements) over all ranks; rank r gets block r in `out` (n).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void reduce_scatter(const In& in, Out& out, reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("reduce_scatter");
    const auto v = agreed_blocks(in, out, "reduce_scatter", true, static_cast<int>(op), "op");
    const auto watch = checks_.watch_transfer("reduce_scatter", v.in.size_bytes());
    mpi::reduce_scatter(comm_, v.in, v.out, op);
  }

  //! `allgather` of blocks of any size: rank r's `in` holds counts[r] elements (0 too), `out`
  //! their sum, rank r's after the ranks' before it. Every rank passes the same `counts`.
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void allgather(const In& in, Out& out, std::span<const std::size_t> counts) {
    detail::operation_scope scope("allgather");
    const auto [i, o, mpi_counts] = agreed_blocks(in, out, "allgather", false, 0, "", counts);
    const auto watch = checks_.watch_transfer("allgather", o.size_bytes());
    mpi::allgather(comm_, i, o, mpi_counts.first, mpi_counts.second);
  }

  //! `reduce_scatter` of blocks of any size: `in` holds the sum of `counts`, and rank r gets the
  //! reduction of its block (counts[r] elements, 0 too) in `out`. The same `counts` everywhere.
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void reduce_scatter(const In& in, Out& out, std::span<const std::size_t> counts,
                      reduce_op op = reduce_op::sum) {
    detail::operation_scope scope("reduce_scatter");
    const auto [i, o, mpi_counts] =
        agreed_blocks(in, out, "reduce_scatter", true, static_cast<int>(op), "op", counts);
    const auto watch = checks_.watch_transfer("reduce_scatter", i.size_bytes());
    mpi::reduce_scatter(comm_, i, o, mpi_counts.first, op);
  }

  //! Gathers every rank's `in` into `root`'s `out` (size() * in's size elements, rank r's at
  //! r * n). Elsewhere `out` is neither read nor written (an empty tensor will do).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void gather(const In& in, Out& out, int root = 0) {
    detail::operation_scope scope("gather");
    const auto [i, o] = rooted_blocks(in, out, "gather", false, root);
    const auto watch = checks_.watch_transfer("gather", o.size_bytes() + i.size_bytes());
    mpi::gather(comm_, i, o, root);
  }

  //! Scatters `root`'s `in` (size() * out's size elements): rank r gets block r in `out`.
  //! Elsewhere `in` is not read (an empty tensor will do).
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void scatter(const In& in, Out& out, int root = 0) {
    detail::operation_scope scope("scatter");
    const auto [i, o] = rooted_blocks(in, out, "scatter", true, root);
    const auto watch = checks_.watch_transfer("scatter", o.size_bytes() + i.size_bytes());
    mpi::scatter(comm_, i, o, root);
  }

  //! Exchanges blocks among all ranks: `in` and `out` hold size() blocks of n elements each; block
  //! q of `in` goes to rank q, where it lands in block r (this rank's) of `out`.
  template <tensor In, writable_tensor Out>
  requires host_tensor<In> && host_tensor<Out>
  void alltoall(const In& in, Out& out) {
    detail::operation_scope scope("alltoall");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = engine::local_checks([&] {
      i = host_const_view(in, "alltoall");
      o = host_view(out, "alltoall");
      checks_.check_exchange(i, o, "alltoall");
    });
    const std::size_t block = i.count / static_cast<std::size_t>(size());
    checks_.agree("alltoall", block, i.type, 0, "", problem);
    const auto watch = checks_.watch_transfer("alltoall", i.size_bytes());
    mpi::alltoall(comm_, i, o, block);
  }

  //! Sends `t` to `dest`.
  template <tensor T>
  requires host_tensor<T>
  void send(const T& t, int dest, int tag = 0) {
    detail::operation_scope scope("send");
    checks_.check_peer(dest, "send");
    const const_tensor_view v = host_const_view(t, "send");
    const auto watch = checks_.watch_point_to_point("send", v.size_bytes());
    mpi::send(comm_, v, dest, tag);
  }

  //! Non-blocking `send`.
  template <tensor T>
  requires host_tensor<T> mpi::request isend(const T& t, int dest, int tag = 0) {
    detail::operation_scope scope("isend");
    checks_.check_peer(dest, "isend");
    return mpi::isend(comm_, host_const_view(t, "isend"), dest, tag);
  }

  //! Receives into `t` from `source`; a message of another size throws and stays queued.
  template <writable_tensor T>
  requires host_tensor<T>
  void recv(T& t, int source, int tag = 0) {
    detail::operation_scope scope("recv");
    checks_.check_peer(source, "recv");
    const tensor_view v = host_view(t, "recv");
    const auto watch = checks_.watch_point_to_point("recv", v.size_bytes());
    mpi::recv(comm_, v, source, tag);
  }

  //! Non-blocking `recv`.
  template <writable_tensor T>
  requires host_tensor<T> mpi::request irecv(T& t, int source, int tag = 0) {
    detail::operation_scope scope("irecv");
    checks_.check_peer(source, "irecv");
    return mpi::irecv(comm_, host_view(t, "irecv"), source, tag);
  }

  // ---- object collectives (Boost.Serialization; see engine/object_collectives.hpp) -----------

  //! Returns `root`'s `obj` on every rank.
  template <class T>
  T bcast_obj(const T& obj, int root = 0) {
    return engine::bcast_obj(checks_, comm_, obj, root);
  }
  //! Every rank's `obj` at `root`, in rank order; an empty vector elsewhere.
  template <class T>
  std::vector<T> gather_obj(const T& obj, int root = 0) {
    return engine::gather_obj(checks_, comm_, obj, root);
  }
  //! Every rank's `obj` on every rank, in rank order.
  template <class T>
  std::vector<T> allgather_obj(const T& obj) {
    return engine::allgather_obj(checks_, comm_, obj);
  }
  //! Combines every rank's `obj` with `op` (by default `+`), on every rank.
  template <class T, class Op = std::plus<T>>
  T allreduce_obj(const T& obj, Op op = {}) {
    return engine::allreduce_obj(checks_, comm_, obj, op);
  }
  template <class T>
  void send_obj(const T& obj, int dest, int tag = 0) {
    engine::send_obj(checks_, comm_, obj, dest, tag);
  }
  template <class T>
  T recv_obj(int source, int tag = 0) {
    return engine::recv_obj<T>(checks_, comm_, source, tag);
  }

protected:
  //! Starts the rendezvous (collective over `comm`); `connect` makes the rest once the ranks
  //! have agreed on the strategy and the options.
  communicator_base(const boost::mpi::communicator& comm, const communicator_options& options)
      : checks_(comm, options) {}

  communicator_base(communicator_base&&) noexcept = default;
  communicator_base& operator=(communicator_base&&) noexcept = default;
  ~communicator_base();

  //! Duplicates `comm` (so that cohort's messages never match the user's) and works out the
  //! topology. Collective over `comm`.
  void connect(const boost::mpi::communicator& comm);

  //! The communicators the gradient buckets travel on: duplicates of mpi_comm(), intra_comm()
  //! and inter_comm(), so that cohort's thread never shares a communicator with the caller's.
  const boost::mpi::communicator& grad_comm() const noexcept { return grad_world_; }
  const boost::mpi::communicator& grad_intra_comm() const noexcept { return grad_intra_; }
  const boost::mpi::communicator& grad_inter_comm() const noexcept { return grad_inter_; }

  //! The checks, for a strategy's own front doors (the device strategies' collectives).
  const engine::checks& checks() const noexcept { return checks_; }
  engine::checks& checks() noexcept { return checks_; }

  template <class Checks>
  static std::string local_checks(Checks&& checks) {
    return engine::local_checks(std::forward<Checks>(checks));
  }
  template <class Describe>
  void settle(const char* operation, std::uint64_t hash, Describe&& describe,
              const std::string& problem, std::size_t bytes = 0) const {
    checks_.settle(operation, hash, std::forward<Describe>(describe), problem, bytes);
  }
  void agree(const char* operation, std::size_t count, dtype type, int detail_value,
             std::string_view detail_name, const std::string& problem = {}) const {
    checks_.agree(operation, count, type, detail_value, detail_name, problem);
  }
  detail::watch_scope watch_transfer(const char* operation, std::size_t bytes) const noexcept {
    return checks_.watch_transfer(operation, bytes);
  }
  void check_root(int root, std::string_view operation) const {
    checks_.check_root(root, operation);
  }
  void check_peer(int peer, std::string_view operation) const {
    checks_.check_peer(peer, operation);
  }
  void check_blocks(const_tensor_view block, const_tensor_view whole,
                    std::string_view operation) const {
    checks_.check_blocks(block, whole, operation);
  }
  std::vector<std::size_t> check_counted_blocks(const_tensor_view block, const_tensor_view whole,
                                                std::span<const std::size_t> counts,
                                                std::string_view operation) const {
    return checks_.check_counted_blocks(block, whole, counts, operation);
  }
  void agree_on_counts(const char* operation, std::span<const std::size_t> counts, dtype type,
                       int detail_value, std::string_view detail_name, const std::string& problem,
                       std::size_t bytes) const {
    checks_.agree_on_counts(operation, counts, type, detail_value, detail_name, problem, bytes);
  }
  void require_device(memory_location location, std::string_view operation) const {
    checks_.require_location(location, true, operation);
  }
  void require_host(memory_location location, std::string_view operation) const {
    checks_.require_location(location, false, operation);
  }

  template <class T>
  tensor_view host_view(T& t, std::string_view what) const {
    return engine::host_view(checks_, t, what);
  }
  template <class T>
  const_tensor_view host_const_view(const T& t, std::string_view what) const {
    return engine::host_const_view(checks_, t, what);
  }

  static boost::mpi::communicator checked_duplicate(const boost::mpi::communicator& comm) {
    engine::require_mpi();
    MPI_Comm duplicate = MPI_COMM_NULL;
    mpi::check(MPI_Comm_dup(comm, &duplicate), "MPI_Comm_dup", comm);
    return detail::adopt(duplicate);
  }

private:
  template <class T>
  tensor_view agreed_view(T& t, const char* operation, int value, std::string_view name,
                          bool rooted = false) {
    return engine::agreed_view(checks_, t, operation, value, name, rooted);
  }
  template <class In, class Out>
  std::pair<const_tensor_view, tensor_view>
  rooted_blocks(const In& in, Out& out, const char* operation, bool out_is_block, int root) {
    return engine::rooted_blocks(checks_, in, out, operation, out_is_block, root);
  }
  template <class In, class Out>
  engine::agreed_block_views agreed_blocks(const In& in, Out& out, const char* operation,
                                           bool out_is_block, int value, std::string_view name,
                                           std::span<const std::size_t> counts = {}) {
    return engine::agreed_blocks(checks_, in, out, operation, out_is_block, value, name, counts);
  }

  // broadcast_each's copies on nodes alike, several ranks each: each value to the rank of its
  // root's intra_rank on every node, then inside each node.
  void broadcast_each_across_nodes(std::span<const tensor_view> values, std::span<const int> roots);
  // Waits for every request in `copies_`, then empties it.
  void wait_for_copies();

  engine::checks checks_; // first: made first (the rest is made under its rendezvous), gone last
  boost::mpi::communicator comm_;
  node_layout layout_;
  boost::mpi::communicator grad_world_;
  boost::mpi::communicator grad_intra_;
  boost::mpi::communicator grad_inter_;
  std::vector<mpi::request> copies_; // broadcast_each's, reused: no allocation a step
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/impl/communicator_base.ipp>
#endif
