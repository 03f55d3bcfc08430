// SPDX-License-Identifier: Apache-2.0
#pragma once

// Differentiable collectives (ChainerMN's chainermn.functions): LibTorch autograd functions whose
// backward is the collective's adjoint, so that a loss computed after a collective sends its
// gradient back to the ranks whose values went in. Collective in forward and in backward alike:
// every rank calls them in the same order and runs backward through them (a rank whose loss does
// not depend on an output still calls backward through it, with a zero gradient if need be). The
// communicator must outlive the graph. Before a collective moves a tensor, the ranks compare their
// tensors' shapes and dtypes (one small all-gather of them): one that differs is a mismatch_error
// on every rank, naming both ranks and both shapes, never a hang or a silent reshape.
//
// - allreduce(comm, x): every rank gets the sum of every rank's x. Backward: each rank's gradient
//   is the sum of the gradients of every rank's output (x reached every output).
// - allgather(comm, x): every rank gets every rank's x, concatenated along dimension 0 in rank
//   order (the ranks' x of one shape). Backward: rank r's gradient is the sum over the ranks of
//   slice r of their output's gradient (a reduce-scatter).
// - bcast(comm, x, root): root's x on every rank (x is read on the root only: elsewhere an
//   undefined tensor will do). Backward: the root's gradient is the sum of every rank's.
// - gather(comm, x, root): every rank's x concatenated along dimension 0 in rank order, on the
//   root; elsewhere a zero delegate (see send). Backward: a scatter of the root's gradient.
// - scatter(comm, x, root): root's x split along dimension 0 into one block a rank (x is read on
//   the root only). Backward: a gather of the blocks' gradients to the root.
// - alltoall(comm, x): block q of x (along dimension 0) goes to rank q; the output's block q came
//   from rank q. Backward: an all-to-all of the gradient.
// - send(comm, x, dest) / recv(comm, source, shape): point to point; the gradient flows back the
//   other way. send returns a zero "delegate" to add to the sender's loss, so that its backward
//   waits for the gradient (ChainerMN's delegate variable and pseudo_connect, as a value a LibTorch
//   user adds to a loss). Within one backward pass, LibTorch runs the nodes made later first: a
//   rank that receives after it sends gives its received gradient back before it waits for its own.

#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>

#include <boost/serialization/vector.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// The communicator's operations the functions need, type-erased: the autograd context stores only
// IValues, and keeps this one (a capsule) for backward.
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
  // Every rank's description of its tensor, and the root's alone (object collectives).
  std::function<std::vector<std::vector<std::int64_t>>(const std::vector<std::int64_t>&)> describe;
  std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>&, int)> describe_root;
  std::int64_t size = 1;
  std::int64_t rank = 0;
};

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
  c->describe = [&comm](const std::vector<std::int64_t>& mine) { return comm.allgather_obj(mine); };
  c->describe_root = [&comm](const std::vector<std::int64_t>& mine, int root) {
    return comm.bcast_obj(mine, root);
  };
  c->size = comm.size();
  c->rank = comm.rank();
  return c;
}

// A tensor described for the ranks to compare: its dtype, then its sizes; {-1} for none.
inline std::vector<std::int64_t> description(const at::Tensor& x) {
  if (!x.defined()) {
    return {-1};
  }
  std::vector<std::int64_t> d{static_cast<std::int64_t>(x.scalar_type())};
  for (const std::int64_t s : x.sizes()) {
    d.push_back(s);
  }
  return d;
}

inline std::string describe(const std::vector<std::int64_t>& d) {
  if (d.empty() || d[0] < 0) {
    return "no tensor";
  }
  std::string text = std::string(c10::toString(static_cast<at::ScalarType>(d[0]))) + " [";
  for (std::size_t i = 1; i < d.size(); ++i) {
    text += (i > 1 ? ", " : "") + std::to_string(d[i]);
  }
  return text + "]";
}

// Collective: the ranks' tensors must have one shape and dtype, and, when `split`, a first
// dimension that splits into one block a rank. Throws the same error on every rank otherwise.
inline void require_one_shape(const collectives& c, const at::Tensor& x, const char* operation,
                              bool split) {
  const auto all = c.describe(description(x));
  const std::string where =
      "cohort::torch::" + std::string(operation) + " on rank " + std::to_string(c.rank) + ": ";
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (all[q] != all[0]) {
      throw mismatch_error(where + "rank " + std::to_string(q) + "'s tensor is " +
                           describe(all[q]) + " but rank 0's is " + describe(all[0]));
    }
  }
  if (all[0].empty() || all[0][0] < 0) {
    throw invalid_argument(where + "every rank's tensor is undefined");
  }
  if (split && (all[0].size() < 2 || all[0][1] % c.size != 0)) {
    throw invalid_argument(where + "every rank's tensor is " + describe(all[0]) +
                           ", whose first dimension does not split into " + std::to_string(c.size) +
                           " equal blocks, one a rank");
  }
}

// Collective: the root's tensor's description on every rank (its sizes, checked to split into
// one block a rank when `split`); the same error on every rank if the root's tensor is unusable.
inline std::vector<std::int64_t> roots_shape(const collectives& c, const at::Tensor& x, int root,
                                             const char* operation, bool split) {
  const auto d =
      c.describe_root(c.rank == root ? description(x) : std::vector<std::int64_t>{}, root);
  const std::string where =
      "cohort::torch::" + std::string(operation) + " on rank " + std::to_string(c.rank) + ": ";
  if (d.empty() || d[0] < 0) {
    throw invalid_argument(where + "the root's (rank " + std::to_string(root) +
                           ") tensor is undefined");
  }
  if (split && (d.size() < 2 || d[1] % c.size != 0)) {
    throw invalid_argument(where + "the root's (rank " + std::to_string(root) + ") tensor is " +
                           describe(d) + ", whose first dimension does not split into " +
                           std::to_string(c.size) + " equal blocks, one a rank");
  }
  return d;
}

// A description's sizes, and its dtype as tensor options.
inline std::vector<std::int64_t> sizes_of(const std::vector<std::int64_t>& d) {
  return {d.begin() + 1, d.end()};
}
inline at::TensorOptions options_of(const std::vector<std::int64_t>& d) {
  return at::TensorOptions(static_cast<at::ScalarType>(d[0]));
}

inline const collectives& saved(::torch::autograd::AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<collectives>(ctx->saved_data["c"].toCapsule());
}

struct allreduce_function : ::torch::autograd::Function<allreduce_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c) {
    require_one_shape(*c, x, "allreduce", false);
    at::Tensor y = x.detach().contiguous().clone();
    c->sum(y);
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    return y;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    at::Tensor g = grads[0].contiguous().clone();
    saved(ctx).sum(g);
    return {g, at::Tensor()};
  }
};

struct allgather_function : ::torch::autograd::Function<allgather_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c) {
    require_one_shape(*c, x, "allgather", false);
    const at::Tensor in = x.detach().contiguous();
    std::vector<std::int64_t> shape = x.sizes().vec();
    if (shape.empty()) {
      shape.push_back(1);
    }
    const std::vector<std::int64_t> mine = shape;
    shape[0] *= c->size;
    at::Tensor out = at::empty(shape, in.options());
    c->gather(in, out);
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["shape"] = x.sizes().vec();
    return out;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    const std::vector<std::int64_t> shape = ctx->saved_data["shape"].toIntVector();
    at::Tensor mine = at::empty({g.numel() / saved(ctx).size}, g.options());
    saved(ctx).sum_scatter(g, mine);
    return {mine.view(shape), at::Tensor()};
  }
};

// The root's x (or, elsewhere, a tensor of its shape to fill: `into`) broadcast; `input` is x on
// the root and an anchor elsewhere (a fresh leaf that connects the output to the graph).
struct bcast_function : ::torch::autograd::Function<bcast_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            c10::intrusive_ptr<collectives> c, std::int64_t root, at::Tensor into) {
    at::Tensor y = c->rank == root ? input.detach().contiguous().clone() : into;
    c->broadcast(y, static_cast<int>(root));
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["root"] = root;
    return y;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    // Every rank's output came of the root's x: its gradient is their sum, on the root.
    at::Tensor g = grads[0].contiguous().clone();
    saved(ctx).sum(g);
    const bool root = saved(ctx).rank == ctx->saved_data["root"].toInt();
    return {root ? g : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Every rank's x to the root, concatenated; elsewhere a zero delegate carrying x's gradient.
struct gather_function : ::torch::autograd::Function<gather_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c, std::int64_t root) {
    require_one_shape(*c, x, "gather", false);
    const at::Tensor in = x.detach().contiguous();
    std::vector<std::int64_t> shape = x.dim() == 0 ? std::vector<std::int64_t>{1} : x.sizes().vec();
    shape[0] *= c->size;
    const bool here = c->rank == root;
    at::Tensor out = here ? at::empty(shape, in.options()) : at::empty({0}, in.options());
    c->gather_to(in, out, static_cast<int>(root));
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["root"] = root;
    ctx->saved_data["shape"] = x.sizes().vec();
    return here ? out : at::zeros({}, x.options());
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const collectives& c = saved(ctx);
    const bool here = c.rank == ctx->saved_data["root"].toInt();
    const at::Tensor g = here ? grads[0].contiguous() : at::empty({0}, grads[0].options());
    at::Tensor mine = at::empty(ctx->saved_data["shape"].toIntVector(), grads[0].options());
    c.scatter_from(g, mine, static_cast<int>(ctx->saved_data["root"].toInt()));
    return {mine, at::Tensor(), at::Tensor()};
  }
};

// The root's x split into one block a rank; `input` is x on the root and an anchor elsewhere,
// `into` this rank's block to fill.
struct scatter_function : ::torch::autograd::Function<scatter_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            c10::intrusive_ptr<collectives> c, std::int64_t root, at::Tensor into) {
    const bool here = c->rank == root;
    const at::Tensor whole = here ? input.detach().contiguous() : at::empty({0}, into.options());
    c->scatter_from(whole, into, static_cast<int>(root));
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["root"] = root;
    ctx->saved_data["shape"] = input.sizes().vec();
    return into;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const collectives& c = saved(ctx);
    const bool here = c.rank == ctx->saved_data["root"].toInt();
    at::Tensor whole = here ? at::empty(ctx->saved_data["shape"].toIntVector(), grads[0].options())
                            : at::empty({0}, grads[0].options());
    c.gather_to(grads[0].contiguous(), whole, static_cast<int>(ctx->saved_data["root"].toInt()));
    return {here ? whole : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Block q of x to rank q; the output's block q from rank q. Its own adjoint.
struct alltoall_function : ::torch::autograd::Function<alltoall_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c) {
    require_one_shape(*c, x, "alltoall", true);
    const at::Tensor in = x.detach().contiguous();
    at::Tensor out = at::empty_like(in);
    c->alltoall(in, out);
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    return out;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    at::Tensor back = at::empty_like(g);
    saved(ctx).alltoall(g, back);
    return {back, at::Tensor()};
  }
};

// Sends x; its output is a zero "delegate" whose backward receives x's gradient from the rank x
// went to (ChainerMN's delegate variable: the sending rank's graph stays connected).
struct send_function : ::torch::autograd::Function<send_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c, std::int64_t dest,
                            std::int64_t tag) {
    c->send(x.detach().contiguous(), static_cast<int>(dest), static_cast<int>(tag));
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["peer"] = dest;
    ctx->saved_data["tag"] = tag;
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(x.scalar_type());
    return at::zeros({}, x.options());
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    at::Tensor g = at::empty(ctx->saved_data["shape"].toIntVector(), at::TensorOptions(dtype));
    saved(ctx).recv(g, static_cast<int>(ctx->saved_data["peer"].toInt()),
                    static_cast<int>(ctx->saved_data["tag"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Receives a tensor; `anchor` (a fresh leaf that requires a gradient) connects it to the graph,
// and its backward sends the received tensor's gradient back to the rank it came from.
struct recv_function : ::torch::autograd::Function<recv_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& anchor,
                            c10::intrusive_ptr<collectives> c, std::int64_t source,
                            std::int64_t tag, at::Tensor into) {
    (void)anchor;
    c->recv(into, static_cast<int>(source), static_cast<int>(tag));
    ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
    ctx->saved_data["peer"] = source;
    ctx->saved_data["tag"] = tag;
    return into;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    saved(ctx).send(grads[0].contiguous(), static_cast<int>(ctx->saved_data["peer"].toInt()),
                    static_cast<int>(ctx->saved_data["tag"].toInt()));
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

} // namespace detail

//! The sum of every rank's `x`, on every rank; differentiable (see the header's comment).
template <class Communicator>
at::Tensor allreduce(Communicator& comm, const at::Tensor& x) {
  return detail::allreduce_function::apply(x, detail::collectives_of(comm));
}

//! Every rank's `x` (all of one shape), concatenated along dimension 0 in rank order, on every
//! rank; differentiable (see the header's comment).
template <class Communicator>
at::Tensor allgather(Communicator& comm, const at::Tensor& x) {
  return detail::allgather_function::apply(x, detail::collectives_of(comm));
}

//! `root`'s `x` on every rank (`x` is read on the root only: elsewhere an undefined tensor will
//! do); differentiable: the root's gradient is the sum of every rank's output's gradient.
template <class Communicator>
at::Tensor bcast(Communicator& comm, const at::Tensor& x, int root = 0) {
  auto c = detail::collectives_of(comm);
  const auto d = detail::roots_shape(*c, x, root, "bcast", false);
  const bool here = comm.rank() == root;
  const at::Tensor input = here ? x : at::zeros({}, detail::options_of(d)).requires_grad_();
  // (On the root a tensor is filled from x: `into` is an empty placeholder there.)
  at::Tensor into =
      at::empty(here ? std::vector<std::int64_t>{0} : detail::sizes_of(d), detail::options_of(d));
  return detail::bcast_function::apply(input, std::move(c), std::int64_t{root}, std::move(into));
}

//! Every rank's `x` (all of one shape and dtype), concatenated along dimension 0 in rank order, on
//! `root`; elsewhere a zero scalar delegate to add to the loss (as `send`'s). Differentiable.
template <class Communicator>
at::Tensor gather(Communicator& comm, const at::Tensor& x, int root = 0) {
  return detail::gather_function::apply(x, detail::collectives_of(comm), std::int64_t{root});
}

//! `root`'s `x` split along dimension 0 into equal blocks, block r to rank r (`x` is read on the
//! root only: elsewhere an undefined tensor will do). Differentiable.
template <class Communicator>
at::Tensor scatter(Communicator& comm, const at::Tensor& x, int root = 0) {
  auto c = detail::collectives_of(comm);
  std::vector<std::int64_t> d = detail::roots_shape(*c, x, root, "scatter", true);
  const bool here = comm.rank() == root;
  const at::Tensor input = here ? x : at::zeros({}, detail::options_of(d)).requires_grad_();
  std::vector<std::int64_t> block = detail::sizes_of(d);
  block[0] /= comm.size();
  at::Tensor into = at::empty(block, detail::options_of(d));
  return detail::scatter_function::apply(input, std::move(c), std::int64_t{root}, std::move(into));
}

//! Block q of `x` (split along dimension 0 into one block a rank; every rank's `x` of one shape and
//! dtype) goes to rank q; block q of the result came from rank q. Differentiable.
template <class Communicator>
at::Tensor alltoall(Communicator& comm, const at::Tensor& x) {
  return detail::alltoall_function::apply(x, detail::collectives_of(comm));
}

//! Sends `x` to rank `dest` (blocking, as `communicator::send`). Returns a zero scalar that
//! carries x's gradient: add it to this rank's loss (or call backward on it) and the backward pass
//! receives, from `dest`, the gradient its `recv` got, and passes it on to `x`.
template <class Communicator>
at::Tensor send(Communicator& comm, const at::Tensor& x, int dest, int tag = 0) {
  return detail::send_function::apply(x, detail::collectives_of(comm), std::int64_t{dest},
                                      std::int64_t{tag});
}

//! Receives from rank `source` a tensor of `shape` and `options` (the sender's; a message of
//! another size throws and stays queued, as `communicator::recv`). The result requires a gradient;
//! the backward pass sends that gradient back to `source`.
template <class Communicator>
at::Tensor recv(Communicator& comm, int source, at::IntArrayRef shape,
                const at::TensorOptions& options = {}, int tag = 0) {
  const at::Tensor anchor = at::zeros({}, options).requires_grad_();
  return detail::recv_function::apply(anchor, detail::collectives_of(comm), std::int64_t{source},
                                      std::int64_t{tag}, at::empty(shape, options));
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
