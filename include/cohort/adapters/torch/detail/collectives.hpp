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
#include <functional>
#include <string>
#include <torch/custom_class.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// The communicator's operations the functions need, type-erased: the autograd context stores only
// IValues, and keeps this one (a capsule) for backward. It refers to the communicator, which must
// outlive every graph made through it.
struct collectives : ::torch::CustomClassHolder {
  std::function<void(at::Tensor&)> sum;                                  // in place, over the ranks
  std::function<void(const at::Tensor&, at::Tensor&)> gather;            // all-gather, rank order
  std::function<void(const at::Tensor&, at::Tensor&)> sum_scatter;       // reduce-scatter of a sum
  std::function<void(const at::Tensor&, int, int)> send;                 // to a rank, with a tag
  std::function<void(at::Tensor&, int, int)> recv;                       // from a rank, with a tag
  std::function<void(at::Tensor&, int)> broadcast;                       // from a root
  std::function<void(const at::Tensor&, at::Tensor&, int)> gather_to;    // to a root, rank order
  std::function<void(const at::Tensor&, at::Tensor&, int)> scatter_from; // from a root
  std::function<void(const at::Tensor&, at::Tensor&)> alltoall;          // block q to rank q
  // Every rank's description of its tensor (at most description_width - 1 entries), and every
  // rank's list of any length (object collectives: multi_node_sequential's wiring).
  std::function<std::vector<std::vector<std::int64_t>>(const std::vector<std::int64_t>&)> describe;
  std::function<std::vector<std::vector<std::int64_t>>(const std::vector<std::int64_t>&)> lists;
  // A description sent to a rank and received from one (multi_node_sequential's).
  std::function<void(const std::vector<std::int64_t>&, int, int)> send_description;
  std::function<std::vector<std::int64_t>(int, int)> recv_description;
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

template <class Communicator>
c10::intrusive_ptr<collectives> collectives_of(Communicator& comm) {
  auto c = c10::make_intrusive<collectives>();
  c->sum = [&comm](at::Tensor& t) { comm.allreduce(t, reduce_op::sum); };
  c->gather = [&comm](const at::Tensor& in, at::Tensor& out) { comm.allgather(in, out); };
  c->sum_scatter = [&comm](const at::Tensor& in, at::Tensor& out) {
    comm.reduce_scatter(in, out, reduce_op::sum);
  };
  c->send = [&comm](const at::Tensor& t, int dest, int tag) { comm.send(t, dest, tag); };
  c->recv = [&comm](at::Tensor& t, int source, int tag) { comm.recv(t, source, tag); };
  c->broadcast = [&comm](at::Tensor& t, int root) { comm.broadcast(t, root); };
  c->gather_to = [&comm](const at::Tensor& in, at::Tensor& out, int root) {
    comm.gather(in, out, root);
  };
  c->scatter_from = [&comm](const at::Tensor& in, at::Tensor& out, int root) {
    comm.scatter(in, out, root);
  };
  c->alltoall = [&comm](const at::Tensor& in, at::Tensor& out) { comm.alltoall(in, out); };
  c->describe = [&comm](const std::vector<std::int64_t>& mine) {
    std::vector<std::int64_t> all(description_width * static_cast<std::size_t>(comm.size()));
    comm.allgather(padded(mine), all);
    std::vector<std::vector<std::int64_t>> each;
    for (std::size_t q = 0; q < all.size(); q += description_width) {
      each.push_back(unpadded(all.data() + q));
    }
    return each;
  };
  c->lists = [&comm](const std::vector<std::int64_t>& mine) { return comm.allgather_obj(mine); };
  c->send_description = [&comm](const std::vector<std::int64_t>& d, int dest, int tag) {
    comm.send(padded(d), dest, tag);
  };
  c->recv_description = [&comm](int source, int tag) {
    std::vector<std::int64_t> block(description_width);
    comm.recv(block, source, tag);
    return unpadded(block.data());
  };
  c->size = comm.size();
  c->rank = comm.rank();
  return c;
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

// Whether autograd can differentiate through a tensor of this description here: a floating dtype,
// and gradients being recorded (no NoGradGuard, no inference mode).
inline bool differentiable(const std::vector<std::int64_t>& d) {
  return d.size() >= 1 && d[0] >= 0 && at::isFloatingType(static_cast<at::ScalarType>(d[0])) &&
         c10::GradMode::is_enabled();
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
  if (root < 0 || root >= c.size) {
    throw invalid_argument(where + "root " + std::to_string(root) + " is not a rank (0 to " +
                           std::to_string(c.size - 1) + ")");
  }
  // The root's description and whether its tensor requires a gradient; every rank's grad mode.
  std::vector<std::int64_t> mine;
  if (c.rank == root) {
    mine = description(x);
    mine.push_back(x.defined() && x.requires_grad() ? 1 : 0);
  }
  mine.push_back(c10::GradMode::is_enabled() ? 1 : 0);
  const auto all = c.describe(mine);
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (all[q].back() != all[0].back()) {
      throw mismatch_error(where + "autograd records gradients on rank " +
                           std::to_string(all[q].back() != 0 ? q : 0) + " but not on rank " +
                           std::to_string(all[q].back() != 0 ? 0 : q) +
                           " (a NoGradGuard or inference mode on some ranks only): their "
                           "backward passes would differ");
    }
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
