// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the differentiable functions (functions.hpp) and multi_node_sequential keep of a
// communicator, and how the ranks agree, before a collective, on the tensors they pass and on
// whether autograd records it: a rank whose backward would run a collective its peers' would not
// is a hang (or a gradient left queued for a later call), so that is decided the same everywhere.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>

#include <boost/serialization/vector.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <algorithm>
#include <c10/core/GradMode.h>
#include <cstddef>
#include <cstdint>
#include <string>
#include <torch/custom_class.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// The communicator's operations the functions need, type-erased: the autograd context stores only
// IValues, and keeps this one (a capsule) for backward. One object a call (its virtual calls cost
// nothing beside the communication); it refers to the communicator, which must outlive every graph
// made through it.
struct collectives : ::torch::CustomClassHolder {
  using list = std::vector<std::int64_t>;
  virtual void sum(at::Tensor& t) const = 0;                                 // in place
  virtual void gather(const at::Tensor& in, at::Tensor& out) const = 0;      // all-gather
  virtual void sum_scatter(const at::Tensor& in, at::Tensor& out) const = 0; // reduce-scatter
  virtual void send(const at::Tensor& t, int dest, int tag) const = 0;
  virtual void recv(at::Tensor& t, int source, int tag) const = 0;
  virtual void broadcast(at::Tensor& t, int root) const = 0;
  virtual void gather_to(const at::Tensor& in, at::Tensor& out, int root) const = 0;
  virtual void scatter_from(const at::Tensor& in, at::Tensor& out, int root) const = 0;
  virtual void alltoall(const at::Tensor& in, at::Tensor& out) const = 0; // block q to rank q
  // Every rank's description of its tensor (at most description_width - 1 entries), and every
  // rank's list of any length (object collectives: multi_node_sequential's wiring).
  virtual std::vector<list> describe(const list& mine) const = 0;
  virtual std::vector<list> lists(const list& mine) const = 0;
  // A description sent to a rank and received from one (multi_node_sequential's).
  virtual void send_description(const list& d, int dest, int tag) const = 0;
  virtual list recv_description(int source, int tag) const = 0;
  std::int64_t size = 1;
  std::int64_t rank = 0;
};

// Descriptions travel as fixed-size blocks of int64 through the communicator's tensor collectives
// (its length first, then its entries): a few microseconds less a call than serialised objects.
inline constexpr std::size_t description_width = 16;

inline std::vector<std::int64_t> padded(const std::vector<std::int64_t>& d) {
  if (d.size() >= description_width) { // (descriptions are cut to fit: see most_dimensions)
    throw error("cohort::torch: a description of " + std::to_string(d.size()) +
                " entries, more than a block of " + std::to_string(description_width) + " holds");
  }
  std::vector<std::int64_t> block(description_width, 0);
  block[0] = static_cast<std::int64_t>(d.size());
  std::copy(d.begin(), d.end(), block.begin() + 1);
  return block;
}
inline std::vector<std::int64_t> unpadded(const std::int64_t* block) {
  return {block + 1, block + 1 + block[0]};
}

// The operations over one communicator.
template <class Communicator>
struct collectives_over final : collectives {
  explicit collectives_over(Communicator& c)
      : comm(c) {
    size = c.size();
    rank = c.rank();
  }
  void sum(at::Tensor& t) const override { comm.allreduce(t, reduce_op::sum); }
  void gather(const at::Tensor& in, at::Tensor& out) const override { comm.allgather(in, out); }
  void sum_scatter(const at::Tensor& in, at::Tensor& out) const override {
    comm.reduce_scatter(in, out, reduce_op::sum);
  }
  void send(const at::Tensor& t, int dest, int tag) const override { comm.send(t, dest, tag); }
  void recv(at::Tensor& t, int source, int tag) const override { comm.recv(t, source, tag); }
  void broadcast(at::Tensor& t, int root) const override { comm.broadcast(t, root); }
  void gather_to(const at::Tensor& in, at::Tensor& out, int root) const override {
    comm.gather(in, out, root);
  }
  void scatter_from(const at::Tensor& in, at::Tensor& out, int root) const override {
    comm.scatter(in, out, root);
  }
  void alltoall(const at::Tensor& in, at::Tensor& out) const override { comm.alltoall(in, out); }
  std::vector<list> describe(const list& mine) const override {
    list all(description_width * static_cast<std::size_t>(comm.size()));
    comm.allgather(padded(mine), all);
    std::vector<list> each;
    for (std::size_t q = 0; q < all.size(); q += description_width) {
      each.push_back(unpadded(all.data() + q));
    }
    return each;
  }
  std::vector<list> lists(const list& mine) const override { return comm.allgather_obj(mine); }
  void send_description(const list& d, int dest, int tag) const override {
    comm.send(padded(d), dest, tag);
  }
  list recv_description(int source, int tag) const override {
    list block(description_width);
    comm.recv(block, source, tag);
    return unpadded(block.data());
  }

  Communicator& comm;
};

template <class Communicator>
c10::intrusive_ptr<collectives> collectives_of(Communicator& comm) {
  return c10::make_intrusive<collectives_over<Communicator>>(comm);
}

// A tensor described for the ranks to compare: its dtype, then its sizes. {-1}: no tensor; {-2}:
// a tensor outside CPU memory (the functions move host memory only); {-3}: more dimensions than a
// description holds.
inline constexpr std::int64_t no_tensor = -1;
inline constexpr std::int64_t not_on_cpu = -2;
inline constexpr std::int64_t too_many_dimensions = -3;
inline constexpr std::int64_t most_dimensions = description_width - 4; // with dtype and 2 flags

inline std::vector<std::int64_t> description(const at::Tensor& x) {
  if (!x.defined()) {
    return {no_tensor};
  }
  if (!x.device().is_cpu()) {
    return {not_on_cpu};
  }
  if (x.dim() > most_dimensions) {
    return {too_many_dimensions};
  }
  std::vector<std::int64_t> d{static_cast<std::int64_t>(x.scalar_type())};
  for (const std::int64_t s : x.sizes()) {
    d.push_back(s);
  }
  return d;
}

inline std::string describe(const std::vector<std::int64_t>& d) {
  if (d.empty() || d[0] == no_tensor) {
    return "undefined";
  }
  if (d[0] == not_on_cpu) {
    return "a tensor outside CPU memory (the functions move CPU tensors only)";
  }
  if (d[0] == too_many_dimensions) {
    return "a tensor of more than " + std::to_string(most_dimensions) + " dimensions";
  }
  std::string text = std::string(c10::toString(static_cast<at::ScalarType>(d[0]))) + " [";
  for (std::size_t i = 1; i < d.size(); ++i) {
    text += (i > 1 ? ", " : "") + std::to_string(d[i]);
  }
  return text + "]";
}

// A usable description's sizes, and its dtype as tensor options (CPU).
inline std::vector<std::int64_t> sizes_of(const std::vector<std::int64_t>& d) {
  return {d.begin() + 1, d.end()};
}
inline at::TensorOptions options_of(const std::vector<std::int64_t>& d) {
  return at::TensorOptions(static_cast<at::ScalarType>(d[0]));
}

// Whether autograd can differentiate through a tensor of this dtype (or description) here: a
// floating dtype, and gradients being recorded (no NoGradGuard, no inference mode).
inline bool differentiable(at::ScalarType dtype) {
  return at::isFloatingType(dtype) && c10::GradMode::is_enabled();
}
inline bool differentiable(const std::vector<std::int64_t>& d) {
  return !d.empty() && d[0] >= 0 && differentiable(static_cast<at::ScalarType>(d[0]));
}

// Collective: the ranks' tensors must have one shape and dtype, be in CPU memory, and, when
// `split`, have a first dimension that splits into one block a rank; their grad modes must agree.
// Throws the same error on every rank otherwise. Returns whether autograd records the call: on
// every rank alike, where any rank's tensor requires a gradient.
inline bool agree_on_tensors(const collectives& c, const at::Tensor& x, const char* operation,
                             bool split) {
  std::vector<std::int64_t> mine = description(x);
  mine.push_back(c10::GradMode::is_enabled() ? 1 : 0);
  mine.push_back(x.defined() && x.requires_grad() ? 1 : 0);
  const auto all = c.describe(mine);
  const std::string where =
      "cohort::torch::" + std::string(operation) + " on rank " + std::to_string(c.rank) + ": ";
  const auto tensor = [](std::vector<std::int64_t> d) {
    d.resize(d.size() - 2);
    return d;
  };
  bool any_requires_grad = false;
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (tensor(all[q]) != tensor(all[0])) {
      throw mismatch_error(where + "rank " + std::to_string(q) + "'s tensor is " +
                           describe(tensor(all[q])) + " but rank 0's is " +
                           describe(tensor(all[0])));
    }
    if (all[q][all[q].size() - 2] != all[0][all[0].size() - 2]) {
      throw mismatch_error(where + "autograd records gradients on rank " +
                           std::to_string(all[q][all[q].size() - 2] != 0 ? q : 0) +
                           " but not on rank " +
                           std::to_string(all[q][all[q].size() - 2] != 0 ? 0 : q) +
                           " (a NoGradGuard or inference mode on some ranks only): their "
                           "backward passes would differ");
    }
    any_requires_grad = any_requires_grad || all[q].back() != 0;
  }
  const std::vector<std::int64_t> d = tensor(all[0]);
  if (d.empty() || d[0] < 0) {
    throw invalid_argument(where + "every rank's tensor is " + describe(d));
  }
  if (split && (d.size() < 2 || d[1] % c.size != 0)) {
    throw invalid_argument(where + "every rank's tensor is " + describe(d) +
                           ", whose first dimension does not split into " + std::to_string(c.size) +
                           " equal blocks, one a rank");
  }
  return any_requires_grad && differentiable(d);
}

// Collective: the root's tensor's description on every rank (checked to split into one block a
// rank when `split`), the same error on every rank if it is unusable or the grad modes differ, and
// whether autograd records the call (where the root's tensor requires a gradient).
inline std::pair<std::vector<std::int64_t>, bool> roots_tensor(const collectives& c,
                                                               const at::Tensor& x, int root,
                                                               const char* operation, bool split) {
  const std::string where =
      "cohort::torch::" + std::string(operation) + " on rank " + std::to_string(c.rank) + ": ";
  // The root's description and whether its tensor requires a gradient; every rank's root and
  // grad mode (one entry, 2 root + mode), compared before the root is used: a root out of range
  // or other on one rank is an error on every rank, not a wait for a rank that never sends.
  std::vector<std::int64_t> mine;
  if (c.rank == root) {
    mine = description(x);
    mine.push_back(x.defined() && x.requires_grad() ? 1 : 0);
  }
  mine.push_back(2 * std::int64_t{root} + (c10::GradMode::is_enabled() ? 1 : 0));
  const auto all = c.describe(mine);
  const auto mode = [](const std::vector<std::int64_t>& d) { return d.back() & 1; };
  const auto root_of = [&](const std::vector<std::int64_t>& d) { return (d.back() - mode(d)) / 2; };
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (root_of(all[q]) != root_of(all[0])) {
      throw mismatch_error(where + "the root is " + std::to_string(root_of(all[0])) +
                           " on rank 0 but " + std::to_string(root_of(all[q])) + " on rank " +
                           std::to_string(q));
    }
    if (mode(all[q]) != mode(all[0])) {
      throw mismatch_error(where + "autograd records gradients on rank " +
                           std::to_string(mode(all[q]) != 0 ? q : 0) + " but not on rank " +
                           std::to_string(mode(all[q]) != 0 ? 0 : q) +
                           " (a NoGradGuard or inference mode on some ranks only): their "
                           "backward passes would differ");
    }
  }
  if (root < 0 || root >= c.size) {
    throw invalid_argument(where + "root " + std::to_string(root) + " is not a rank (0 to " +
                           std::to_string(c.size - 1) + ")");
  }
  std::vector<std::int64_t> d(all[static_cast<std::size_t>(root)].begin(),
                              all[static_cast<std::size_t>(root)].end() - 2);
  const bool requires_grad = all[static_cast<std::size_t>(root)].end()[-2] != 0;
  if (d.empty() || d[0] < 0) {
    throw invalid_argument(where + "the root's (rank " + std::to_string(root) + ") tensor is " +
                           describe(d));
  }
  if (split && (d.size() < 2 || d[1] % c.size != 0)) {
    throw invalid_argument(where + "the root's (rank " + std::to_string(root) + ") tensor is " +
                           describe(d) + ", whose first dimension does not split into " +
                           std::to_string(c.size) + " equal blocks, one a rank");
  }
  return {d, requires_grad && differentiable(d)};
}

// A fresh leaf that requires a gradient when the call is recorded: an input of the autograd
// function on every rank, so that its node exists on every rank alike (whatever the rank's own
// tensor requires); an empty tensor otherwise.
inline at::Tensor anchor(bool recorded, const at::TensorOptions& options) {
  return recorded ? at::zeros({}, options).requires_grad_() : at::empty({0}, options);
}

} // namespace detail
} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
