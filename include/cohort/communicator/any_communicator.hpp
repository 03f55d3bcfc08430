// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/bucket_order.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/dummy.hpp>
#include <cohort/communicator/flat.hpp>
#include <cohort/communicator/grad_sync_request.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/hierarchical.hpp>
#include <cohort/communicator/naive.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/strategy_access.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/communicator/two_dimensional.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/mpi/communicator.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A strategy chosen at run time, by name (a flag, a config file): one `std::variant` of the
//! strategies, each call one dispatch on it and then the strategy's own code. Models the same
//! `communicator` concept, so `distributed_optimizer` and the rest take it as they take a strategy
//! chosen at compile time. Each strategy names itself with `static constexpr std::string_view
//! name`.
template <class... Strategies>
class basic_any_communicator {
public:
  using variant_type = std::variant<Strategies...>;

  //! The names this type knows, in the order of its strategies.
  static constexpr std::array<std::string_view, sizeof...(Strategies)> names = {
      Strategies::name...};

  //! The strategy called `name`, over the processes of `comm`. Collective over `comm`. Throws
  //! `invalid_argument` listing the known names if `name` is none of them (on every rank, before
  //! any communication, since every rank reads the same name).
  basic_any_communicator(std::string_view name, const boost::mpi::communicator& comm,
                         communicator_options options = {})
      : strategy_(make(name, comm, options)) {}

  //! The strategy called `name`, over all the processes (`MPI_COMM_WORLD`). Collective.
  explicit basic_any_communicator(std::string_view name, communicator_options options = {})
      : basic_any_communicator(name, boost::mpi::communicator(), options) {}

  //! Wraps a strategy built already.
  template <class Strategy>
  requires(std::same_as<std::remove_cvref_t<Strategy>, Strategies> ||
           ...) explicit basic_any_communicator(Strategy&& strategy)
      : strategy_(std::forward<Strategy>(strategy)) {}

  //! The name of the strategy inside.
  std::string_view name() const noexcept {
    return std::visit([](const auto& c) { return std::remove_cvref_t<decltype(c)>::name; },
                      strategy_);
  }

  //! The known names, comma-separated (for help texts and errors).
  static std::string known_names() {
    std::string list;
    for (const std::string_view n : names) {
      list += (list.empty() ? "" : ", ");
      list += n;
    }
    return list;
  }

  //! Whether every strategy inside can overlap the reduction with backward (the host ones).
  static constexpr bool overlapping = (overlapping_communicator<Strategies> && ...);

  //! Whether every strategy inside reduces device memory (the GPU ones), as each says.
  static constexpr bool reduces_gpu_memory = (detail::is_device_strategy<Strategies>() && ...);
  //! Whether some strategy inside does (a mix of host and GPU strategies).
  static constexpr bool may_reduce_gpu_memory = (detail::is_device_strategy<Strategies>() || ...);

  //! The stream the trainer queues its work on, for every strategy inside that has one (the GPU
  //! ones: see nccl_strategy::set_stream). `Stream` is `cudaStream_t`, named generically so that
  //! this header needs no CUDA.
  template <class Stream>
  requires(detail::takes_stream<Strategies, Stream>&&...) void set_stream(Stream stream) noexcept {
    call([&](auto& c) { c.set_stream(stream); });
  }

  //! The NCCL communicator's life, where some strategy inside has one (see
  //! nccl_strategy::connect, finalize and abort); a strategy without one (host_staged,
  //! cuda_aware_flat) has nothing to create or end, and these do nothing for it. What else only
  //! some strategies have (`synchronize()`, `gpu()`) is reached through `variant()`.
  void connect() requires(detail::owns_nccl_communicator<Strategies> || ...) {
    on_nccl([](auto& c) { c.connect(); });
  }
  void finalize() requires(detail::owns_nccl_communicator<Strategies> || ...) {
    on_nccl([](auto& c) { c.finalize(); });
  }
  void abort() noexcept requires(detail::owns_nccl_communicator<Strategies> || ...) {
    on_nccl([](auto& c) { c.abort(); });
  }

  variant_type& variant() noexcept { return strategy_; }
  const variant_type& variant() const noexcept { return strategy_; }

  int rank() const noexcept {
    return read([](const auto& c) { return c.rank(); });
  }
  int size() const noexcept {
    return read([](const auto& c) { return c.size(); });
  }
  int intra_rank() const noexcept {
    return read([](const auto& c) { return c.intra_rank(); });
  }
  int intra_size() const noexcept {
    return read([](const auto& c) { return c.intra_size(); });
  }
  int inter_rank() const noexcept {
    return read([](const auto& c) { return c.inter_rank(); });
  }
  int inter_size() const noexcept {
    return read([](const auto& c) { return c.inter_size(); });
  }
  const cohort::topology& topology() const noexcept {
    return read([](const auto& c) -> const cohort::topology& { return c.topology(); });
  }
  const boost::mpi::communicator& mpi_comm() const noexcept {
    return read([](const auto& c) -> const boost::mpi::communicator& { return c.mpi_comm(); });
  }
  const boost::mpi::communicator& intra_comm() const noexcept {
    return read([](const auto& c) -> const boost::mpi::communicator& { return c.intra_comm(); });
  }
  const boost::mpi::communicator& inter_comm() const noexcept {
    return read([](const auto& c) -> const boost::mpi::communicator& { return c.inter_comm(); });
  }
  const communicator_options& options() const noexcept {
    return read([](const auto& c) -> const communicator_options& { return c.options(); });
  }
  bool traced() const noexcept {
    return read([](const auto& c) { return c.traced(); });
  }
  std::filesystem::path trace_file() const {
    return read([](const auto& c) { return c.trace_file(); });
  }
  void pause_trace() const noexcept {
    read([](const auto& c) { c.pause_trace(); });
  }
  void resume_trace() const noexcept {
    read([](const auto& c) { c.resume_trace(); });
  }

  basic_any_communicator split(int color, int key) const {
    return read([&](const auto& c) { return basic_any_communicator(c.split(color, key)); });
  }
  void barrier() const {
    read([](const auto& c) { c.barrier(); });
  }

  // ---- tensor and object collectives: as the strategies' ----------------------------------

  template <class T>
  void allreduce(T& t, reduce_op op = reduce_op::sum) {
    call([&](auto& c) { c.allreduce(t, op); });
  }
  template <class T>
  auto iallreduce(T& t, reduce_op op = reduce_op::sum) {
    return call([&](auto& c) { return c.iallreduce(t, op); });
  }
  template <class T>
  void broadcast(T& t, int root = 0) {
    call([&](auto& c) { c.broadcast(t, root); });
  }
  template <class T>
  auto ibroadcast(T& t, int root = 0) {
    return call([&](auto& c) { return c.ibroadcast(t, root); });
  }
  void broadcast_each(std::span<const tensor_view> values, std::span<const int> roots) {
    call([&](auto& c) { c.broadcast_each(values, roots); });
  }
  template <class In, class Out>
  void allgather(const In& in, Out& out) {
    call([&](auto& c) { c.allgather(in, out); });
  }
  template <class In, class Out>
  auto iallgather(const In& in, Out& out) {
    return call([&](auto& c) { return c.iallgather(in, out); });
  }
  template <class In, class Out>
  void reduce_scatter(const In& in, Out& out, reduce_op op = reduce_op::sum) {
    call([&](auto& c) { c.reduce_scatter(in, out, op); });
  }
  template <class In, class Out>
  void allgather(const In& in, Out& out, std::span<const std::size_t> counts) {
    call([&](auto& c) { c.allgather(in, out, counts); });
  }
  template <class In, class Out>
  void reduce_scatter(const In& in, Out& out, std::span<const std::size_t> counts,
                      reduce_op op = reduce_op::sum) {
    call([&](auto& c) { c.reduce_scatter(in, out, counts, op); });
  }
  template <class In, class Out>
  void gather(const In& in, Out& out, int root = 0) {
    call([&](auto& c) { c.gather(in, out, root); });
  }
  template <class In, class Out>
  void scatter(const In& in, Out& out, int root = 0) {
    call([&](auto& c) { c.scatter(in, out, root); });
  }
  template <class In, class Out>
  void alltoall(const In& in, Out& out) {
    call([&](auto& c) { c.alltoall(in, out); });
  }
  template <class T>
  void send(const T& t, int dest, int tag = 0) {
    call([&](auto& c) { c.send(t, dest, tag); });
  }
  template <class T>
  auto isend(const T& t, int dest, int tag = 0) {
    return call([&](auto& c) { return c.isend(t, dest, tag); });
  }
  template <class T>
  void recv(T& t, int source, int tag = 0) {
    call([&](auto& c) { c.recv(t, source, tag); });
  }
  template <class T>
  auto irecv(T& t, int source, int tag = 0) {
    return call([&](auto& c) { return c.irecv(t, source, tag); });
  }

  template <class T>
  T bcast_obj(const T& obj, int root = 0) {
    return call([&](auto& c) { return c.bcast_obj(obj, root); });
  }
  template <class T>
  std::vector<T> gather_obj(const T& obj, int root = 0) {
    return call([&](auto& c) { return c.gather_obj(obj, root); });
  }
  template <class T>
  std::vector<T> allgather_obj(const T& obj) {
    return call([&](auto& c) { return c.allgather_obj(obj); });
  }
  template <class T, class Op = std::plus<T>>
  T allreduce_obj(const T& obj, Op op = {}) {
    return call([&](auto& c) { return c.allreduce_obj(obj, op); });
  }
  template <class T>
  void send_obj(const T& obj, int dest, int tag = 0) {
    call([&](auto& c) { c.send_obj(obj, dest, tag); });
  }
  template <class T>
  T recv_obj(int source, int tag = 0) {
    return call([&](auto& c) { return c.template recv_obj<T>(source, tag); });
  }

  // ---- parameters and gradients ------------------------------------------------------------

  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    call([&](auto& c) { c.broadcast_parameters(params, root); });
  }
  template <parameter_set Params, reducer Reducer>
  void allreduce_grad(Params&& params, const Reducer& reducer, grad_sync_options options = {}) {
    call([&](auto& c) { c.allreduce_grad(params, reducer, options); });
  }
  template <reducer Reducer>
  void allreduce_grad(const parameter_source& params, const Reducer& reducer,
                      grad_sync_options options = {}) {
    call([&](auto& c) { c.allreduce_grad(params, reducer, options); });
  }

  template <parameter_set Params, reducer Reducer>
  requires overlapping grad_sync_request<basic_any_communicator, Params>
  begin_allreduce_grad(Params& params, const Reducer& reducer, grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    return {*this, params};
  }
  template <parameter_set Params, reducer Reducer>
  requires overlapping grad_sync_request<basic_any_communicator, Params>
  iallreduce_grad(Params& params, const Reducer& reducer, grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    mark_all_ready();
    return {*this, params};
  }
  template <parameter_set Params, reducer Reducer>
  requires overlapping void start_grad_sync(Params& params, const Reducer& reducer,
                                            grad_sync_options options = {},
                                            const void* owner = nullptr) {
    call([&](auto& c) { c.start_grad_sync(params, reducer, options, owner); });
  }
  template <reducer Reducer>
  requires overlapping void start_grad_sync(std::span<const grad_slot> slots,
                                            const Reducer& reducer, const void* owner = nullptr) {
    call([&](auto& c) { c.start_grad_sync(slots, reducer, owner); });
  }
  template <parameter_set Params>
  requires overlapping void grad_ready(Params& params, std::size_t index) {
    call([&](auto& c) { c.grad_ready(params, index); });
  }
  template <parameter_set Params, reducer Reducer>
  requires overlapping void grad_ready_for(const void* owner, Params& params,
                                           const Reducer& reducer, grad_sync_options options,
                                           std::size_t index) {
    call([&](auto& c) { c.grad_ready_for(owner, params, reducer, options, index); });
  }
  template <reducer Reducer>
  requires overlapping void grad_ready_for(const void* owner, const parameter_source& params,
                                           const Reducer& reducer, grad_sync_options options,
                                           std::size_t index) {
    call([&](auto& c) { c.grad_ready_for(owner, params, reducer, options, index); });
  }
  void abandon_grad_sync(std::string_view why) noexcept requires overlapping {
    call([&](auto& c) { c.abandon_grad_sync(why); });
  }
  void abandon_grad_sync_for(const void* owner,
                             std::string_view why) noexcept requires overlapping {
    call([&](auto& c) { c.abandon_grad_sync_for(owner, why); });
  }
  bool wait_grad_sync_transfers(const void* owner) requires overlapping {
    return call([&](auto& c) { return c.wait_grad_sync_transfers(owner); });
  }
  bool take_kept_grad_sync(const void* owner) noexcept requires overlapping {
    bool kept = false;
    call([&](auto& c) { kept = c.take_kept_grad_sync(owner); });
    return kept;
  }
  void forget_grad_sync_owner(const void* owner) noexcept requires overlapping {
    call([&](auto& c) { c.forget_grad_sync_owner(owner); });
  }
  template <reducer Reducer>
  requires overlapping void validate_grad_sync(std::span<const grad_slot> slots,
                                               const Reducer& reducer, missing_grad missing) {
    call([&](auto& c) { c.validate_grad_sync(slots, reducer, missing); });
  }
  bool grad_sync_complete(const void* owner = nullptr) const requires overlapping {
    return read([&](const auto& c) { return c.grad_sync_complete(owner); });
  }
  bool grad_sync_pending_for(const void* owner) const noexcept {
    return read([&](const auto& c) { return c.grad_sync_pending_for(owner); });
  }
  void grad_ready(std::size_t index, const void* owner = nullptr) requires overlapping {
    call([&](auto& c) { c.grad_ready(index, owner); });
  }
  void mark_all_ready(const void* owner = nullptr) requires overlapping {
    call([&](auto& c) { c.mark_all_ready(owner); });
  }
  void wait_grad_sync(step_end end = step_end::update, std::span<const grad_slot> now = {},
                      const void* owner = nullptr) requires overlapping {
    call([&](auto& c) { c.wait_grad_sync(end, now, owner); });
  }
  bool grad_sync_pending() const noexcept {
    return read([](const auto& c) { return c.grad_sync_pending(); });
  }
  std::uint64_t grad_sync_generation() const noexcept {
    return read([](const auto& c) { return c.grad_sync_generation(); });
  }
  bool grad_sync_pending_at(std::uint64_t generation) const noexcept {
    return read([&](const auto& c) { return c.grad_sync_pending_at(generation); });
  }
  std::size_t bucket_buffer_bytes() const noexcept {
    return read([](const auto& c) { return c.bucket_buffer_bytes(); });
  }
  std::size_t bucket_count() const noexcept {
    return read([](const auto& c) { return c.bucket_count(); });
  }
  grad_sync_stats take_grad_sync_stats() {
    return call([](auto& c) { return c.take_grad_sync_stats(); });
  }
  std::vector<bucket_order> learned_bucket_orders() const {
    return read([](const auto& c) { return c.learned_bucket_orders(); });
  }
  void restore_bucket_orders(std::vector<bucket_order> orders) {
    call([&](auto& c) { c.restore_bucket_orders(std::move(orders)); });
  }

private:
  // Built in place in the variant (no move of a strategy): the first alternative whose name
  // matches.
  template <std::size_t I = 0>
  static variant_type make(std::string_view name, const boost::mpi::communicator& comm,
                           const communicator_options& options) {
    if constexpr (I == sizeof...(Strategies)) {
      std::string message = "cohort: unknown communicator strategy '" + std::string(name) +
                            "'; the known ones are " + known_names();
      if (name == "non_cuda_aware") {
        message += " (ChainerMN's non_cuda_aware is cohort's host_staged, a strategy of "
                   "cohort::any_gpu_communicator)";
      } else if (name == "pure_nccl" || name == "single_node" || name == "host_staged" ||
                 name == "cuda_aware_flat") {
        message +=
            " ('" + std::string(name) +
            "' reduces GPU memory: use cohort::any_gpu_communicator, from <cohort/nccl.hpp>)";
      }
      throw invalid_argument(message);
    } else {
      using strategy = std::variant_alternative_t<I, variant_type>;
      if (name == strategy::name) {
        return variant_type(std::in_place_index<I>, comm, options);
      }
      return make<I + 1>(name, comm, options);
    }
  }

  // f(strategy) for a strategy that owns an NCCL communicator; nothing for one that does not.
  template <class F>
  void on_nccl(F f) {
    call([&](auto& c) {
      if constexpr (detail::owns_nccl_communicator<std::remove_cvref_t<decltype(c)>>) {
        f(c);
      }
    });
  }
  template <class F>
  decltype(auto) call(F&& f) {
    return std::visit(std::forward<F>(f), strategy_);
  }
  template <class F>
  decltype(auto) read(F&& f) const {
    return std::visit(std::forward<F>(f), strategy_);
  }

  variant_type strategy_;
};

//! The host strategies by name: "naive", "flat", "hierarchical", "two_dimensional", "dummy".
using any_communicator =
    basic_any_communicator<naive, flat, hierarchical<>, two_dimensional<>, dummy>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
