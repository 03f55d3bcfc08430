// SPDX-License-Identifier: Apache-2.0
#pragma once

// Differentiable communication (ChainerMN's chainermn.functions): LibTorch autograd functions
// whose backward is the collective's adjoint, so that a loss computed after a collective sends its
// gradient back to the ranks whose values went in.
//
// - allreduce(comm, x): every rank gets the sum of every rank's x. Backward: each rank's gradient
//   is the sum of the gradients of every rank's output (x reached every output).
// - allgather(comm, x): every rank gets every rank's x, concatenated along dimension 0 in rank
//   order. Backward: rank r's gradient is the sum over the ranks of block r of their output's
//   gradient (a reduce-scatter).
// - bcast(comm, x, root): root's x on every rank (x is read on the root only: elsewhere an
//   undefined tensor will do). Backward: the root's gradient is the sum of every rank's.
// - gather(comm, x, root): every rank's x concatenated along dimension 0 in rank order, on the
//   root; elsewhere a zero delegate (see send). Backward: a scatter of the root's gradient.
// - scatter(comm, x, root): root's x split along dimension 0 into one block a rank (x is read on
//   the root only). Backward: a gather of the blocks' gradients to the root.
// - alltoall(comm, x): block q of x (along dimension 0) goes to rank q; the output's block q came
//   from rank q. Backward: an all-to-all of the gradient.
// - send(comm, x, dest) / recv(comm, source, shape): point to point, described (dtype and shape
//   compared before the bytes move, an error on both ends if they differ); the gradient flows
//   back the other way. send returns a zero "delegate" to add to the sender's loss, so that its
//   backward waits for the gradient (ChainerMN's delegate variable and pseudo_connect, as a value a
//   LibTorch user adds to a loss). Within one backward pass, LibTorch runs the nodes made later
//   first: a rank that receives after it sends gives its received gradient back before it waits for
//   its own.
//
// Collective in forward and in backward alike: every rank calls them in the same order and runs
// backward through them with `backward()` (a rank whose loss does not use an output still calls
// backward through it, with a zero gradient if need be; `torch::autograd::grad` with `inputs`
// prunes the nodes that lead nowhere but to the communication, and its peers then wait for it).
// Whether autograd records a call is decided the same on every rank: a collective where any rank's
// tensor requires a gradient (bcast and scatter: the root's), a send or a recv wherever the dtype
// is floating; never under NoGradGuard, which must then be on every rank alike. Before a
// collective moves a tensor the ranks compare shapes, dtypes and grad modes (one small all-gather):
// a difference is an error on every rank, never a hang or a silent reshape. Tensors are in CPU
// memory. The communicator must outlive every graph made through it.

#include <cohort/adapters/torch/detail/collectives.hpp>
#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <cstdint>
#include <string>
#include <torch/autograd.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

inline const collectives& saved(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<collectives>(ctx->saved_data["c"].toCapsule());
}
inline void keep(AutogradContext* ctx, c10::intrusive_ptr<collectives> c) {
  ctx->saved_data["c"] = c10::IValue::make_capsule(std::move(c));
}
inline bool is_root(AutogradContext* ctx) {
  return saved(ctx).rank == ctx->saved_data["root"].toInt();
}

// Every function's inputs: the rank's tensor, then an anchor (see detail::anchor), then the rest;
// backward gives the anchor and the rest no gradient.
struct allreduce_function : ::torch::autograd::Function<allreduce_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c) {
    at::Tensor y = x.detach().clone(at::MemoryFormat::Contiguous);
    c->sum(y);
    keep(ctx, std::move(c));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0].clone(at::MemoryFormat::Contiguous);
    saved(ctx).sum(g);
    return {g, at::Tensor(), at::Tensor()};
  }
};

struct allgather_function : ::torch::autograd::Function<allgather_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c) {
    const at::Tensor in = x.detach().contiguous();
    std::vector<std::int64_t> shape = x.dim() == 0 ? std::vector<std::int64_t>{1} : x.sizes().vec();
    shape[0] *= c->size;
    at::Tensor out = at::empty(shape, in.options());
    c->gather(in, out);
    keep(ctx, std::move(c));
    ctx->saved_data["shape"] = x.sizes().vec();
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    at::Tensor mine = at::empty(ctx->saved_data["shape"].toIntVector(), g.options());
    saved(ctx).sum_scatter(g, mine);
    return {mine, at::Tensor(), at::Tensor()};
  }
};

// The root's x broadcast into `into` (a tensor of its shape; on the root an empty placeholder).
struct bcast_function : ::torch::autograd::Function<bcast_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c, std::int64_t root, at::Tensor into) {
    at::Tensor y = c->rank == root ? x.detach().clone(at::MemoryFormat::Contiguous) : into;
    c->broadcast(y, static_cast<int>(root));
    keep(ctx, std::move(c));
    ctx->saved_data["root"] = root;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Every rank's output came of the root's x: its gradient is their sum, on the root.
    at::Tensor g = grads[0].clone(at::MemoryFormat::Contiguous);
    saved(ctx).sum(g);
    return {is_root(ctx) ? g : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Every rank's x to the root, concatenated; elsewhere a zero delegate carrying x's gradient.
struct gather_function : ::torch::autograd::Function<gather_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c, std::int64_t root) {
    const at::Tensor in = x.detach().contiguous();
    std::vector<std::int64_t> shape = x.dim() == 0 ? std::vector<std::int64_t>{1} : x.sizes().vec();
    shape[0] *= c->size;
    const bool here = c->rank == root;
    at::Tensor out = at::empty(here ? shape : std::vector<std::int64_t>{0}, in.options());
    c->gather_to(in, out, static_cast<int>(root));
    keep(ctx, std::move(c));
    ctx->saved_data["root"] = root;
    ctx->saved_data["shape"] = x.sizes().vec();
    return here ? out : at::zeros({}, x.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = is_root(ctx) ? grads[0].contiguous() : at::empty({0}, grads[0].options());
    at::Tensor mine = at::empty(ctx->saved_data["shape"].toIntVector(), grads[0].options());
    saved(ctx).scatter_from(g, mine, static_cast<int>(ctx->saved_data["root"].toInt()));
    return {mine, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The root's x split into one block a rank, this rank's into `into`.
struct scatter_function : ::torch::autograd::Function<scatter_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c, std::int64_t root, at::Tensor into) {
    const bool here = c->rank == root;
    const at::Tensor whole = here ? x.detach().contiguous() : at::empty({0}, into.options());
    c->scatter_from(whole, into, static_cast<int>(root));
    keep(ctx, std::move(c));
    ctx->saved_data["root"] = root;
    ctx->saved_data["shape"] = x.sizes().vec();
    return into;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool here = is_root(ctx);
    at::Tensor whole =
        at::empty(here ? ctx->saved_data["shape"].toIntVector() : std::vector<std::int64_t>{0},
                  grads[0].options());
    saved(ctx).gather_to(grads[0].contiguous(), whole,
                         static_cast<int>(ctx->saved_data["root"].toInt()));
    return {here ? whole : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Block q of x to rank q; the output's block q from rank q. Its own adjoint.
struct alltoall_function : ::torch::autograd::Function<alltoall_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c) {
    const at::Tensor in = x.detach().contiguous();
    at::Tensor out = at::empty_like(in);
    c->alltoall(in, out);
    keep(ctx, std::move(c));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    at::Tensor back = at::empty_like(g);
    saved(ctx).alltoall(g, back);
    return {back, at::Tensor(), at::Tensor()};
  }
};

// Sends x; its output is a zero "delegate" whose backward receives x's gradient from the rank x
// went to (ChainerMN's delegate variable: the sending rank's graph stays connected).
struct send_function : ::torch::autograd::Function<send_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c, std::int64_t dest,
                            std::int64_t tag) {
    c->send(x.detach().contiguous(), static_cast<int>(dest), static_cast<int>(tag));
    keep(ctx, std::move(c));
    ctx->saved_data["peer"] = dest;
    ctx->saved_data["tag"] = tag;
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(x.scalar_type());
    return at::zeros({}, x.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    at::Tensor g = at::empty(ctx->saved_data["shape"].toIntVector(), at::TensorOptions(dtype));
    saved(ctx).recv(g, static_cast<int>(ctx->saved_data["peer"].toInt()),
                    static_cast<int>(ctx->saved_data["tag"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Receives into `into`; its backward sends the received tensor's gradient back to its source.
struct recv_function : ::torch::autograd::Function<recv_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor&,
                            c10::intrusive_ptr<collectives> c, std::int64_t source,
                            std::int64_t tag, at::Tensor into) {
    c->recv(into, static_cast<int>(source), static_cast<int>(tag));
    keep(ctx, std::move(c));
    ctx->saved_data["peer"] = source;
    ctx->saved_data["tag"] = tag;
    return into;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    saved(ctx).send(grads[0].contiguous(), static_cast<int>(ctx->saved_data["peer"].toInt()),
                    static_cast<int>(ctx->saved_data["tag"].toInt()));
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A point-to-point message is described before it moves: the sender offers its tensor's
// description (dtype, shape), the receiver answers with the one it expects, and the bytes follow
// only if they are the same; otherwise both ends throw `mismatch_error` naming both. (Bytes of a
// float32 [4] received as a float64 [2] would be the same 16 bytes, silently reread.) The first
// entry says which of the two a block is, so that two ranks that both send to each other first,
// each waiting for the other's answer, are told so instead of reading an offer as an answer.
inline constexpr std::int64_t offer = 1;
inline constexpr std::int64_t answer = 2;

inline std::vector<std::int64_t> marked(std::int64_t kind, std::vector<std::int64_t> d) {
  d.insert(d.begin(), kind);
  return d;
}

// What arrived as `kind` from `peer`, or a mismatch naming what did.
inline std::vector<std::int64_t> expect_block(const collectives& c, std::int64_t kind, int peer,
                                              int tag, const char* operation) {
  std::vector<std::int64_t> block = c.recv_description(peer, tag);
  if (block.empty() || block.front() != kind) {
    throw mismatch_error(
        std::string("cohort::torch::") + operation + " on rank " + std::to_string(c.rank) +
        " (tag " + std::to_string(tag) + "): rank " + std::to_string(peer) +
        (kind == answer ? " sent to this rank while this rank waited for it to receive: both "
                          "ranks sent before they received; receive first on one of them"
                        : " sent something other than a tensor's description"));
  }
  block.erase(block.begin());
  return block;
}

inline std::string both(const std::vector<std::int64_t>& sent, int from,
                        const std::vector<std::int64_t>& expected, int to) {
  return "rank " + std::to_string(from) + " sends " + describe(sent) + " and rank " +
         std::to_string(to) + " expects " + describe(expected);
}

// Sends x's description to `dest` and waits for its answer; returns once the bytes may follow.
inline void offer_to(const collectives& c, const at::Tensor& x, int dest, int tag) {
  const std::vector<std::int64_t> mine = description(x);
  c.send_description(marked(offer, mine), dest, tag);
  if (dest == c.rank) {
    return; // (its own receive checks it: the same rank is both ends)
  }
  const std::vector<std::int64_t> expected = expect_block(c, answer, dest, tag, "send");
  if (expected != mine) {
    throw mismatch_error("cohort::torch::send on rank " + std::to_string(c.rank) + " to rank " +
                         std::to_string(dest) + " (tag " + std::to_string(tag) +
                         "): " + both(mine, c.rank, expected, dest) + "; nothing was sent");
  }
}

// Receives the description of what `source` sends, answers with `expected`; throws on both ends
// if they differ (a message to itself: drained first, so that nothing is left queued).
inline void accept_from(const collectives& c, const std::vector<std::int64_t>& expected, int source,
                        int tag) {
  const std::vector<std::int64_t> sent = expect_block(c, offer, source, tag, "recv");
  if (source != c.rank) {
    c.send_description(marked(answer, expected), source, tag);
  }
  if (sent != expected) {
    if (source == c.rank && !sent.empty() && sent[0] >= 0) {
      at::Tensor drained = at::empty(sizes_of(sent), options_of(sent));
      c.recv(drained, source, tag);
    }
    throw mismatch_error("cohort::torch::recv on rank " + std::to_string(c.rank) + " from rank " +
                         std::to_string(source) + " (tag " + std::to_string(tag) +
                         "): " + both(sent, source, expected, c.rank) + "; nothing was received");
  }
}

// A send of x to `dest` whose node is recorded wherever x's dtype is floating and gradients are
// recorded (as the receiver's recv is: see the header's comment). `offered`: the two ends compare
// descriptions first (false where the caller sent the description itself, and the receiver
// expects exactly it: multi_node_sequential's stages).
inline at::Tensor send_through(c10::intrusive_ptr<collectives> c, const at::Tensor& x, int dest,
                               int tag, bool offered = true) {
  if (!x.defined() || !x.device().is_cpu()) {
    throw invalid_argument("cohort::torch::send on rank " + std::to_string(c->rank) +
                           ": the tensor is " + describe({x.defined() ? not_on_cpu : no_tensor}));
  }
  if (x.dim() > most_dimensions) {
    throw invalid_argument("cohort::torch::send on rank " + std::to_string(c->rank) +
                           ": the tensor is " + describe({too_many_dimensions}));
  }
  if (offered) {
    offer_to(*c, x, dest, tag);
  }
  const at::Tensor a = anchor(differentiable(x.scalar_type()), x.options());
  return send_function::apply(x, a, std::move(c), std::int64_t{dest}, std::int64_t{tag});
}

// A recv of a tensor of description `d` from `source`, recorded as the send at the other end is.
inline at::Tensor recv_through(c10::intrusive_ptr<collectives> c,
                               const std::vector<std::int64_t>& d, int source, int tag,
                               bool offered = true) {
  if (offered) {
    accept_from(*c, d, source, tag);
  }
  return recv_function::apply(anchor(differentiable(d), options_of(d)), std::move(c),
                              std::int64_t{source}, std::int64_t{tag},
                              at::empty(sizes_of(d), options_of(d)));
}

} // namespace detail

//! The sum of every rank's `x`, on every rank; differentiable (see the header's comment).
template <class Communicator>
at::Tensor allreduce(Communicator& comm, const at::Tensor& x) {
  auto c = detail::collectives_of(comm);
  const bool recorded = detail::agree_on_tensors(*c, x, "allreduce", false);
  return detail::allreduce_function::apply(x, detail::anchor(recorded, x.options()), std::move(c));
}

//! Every rank's `x` (all of one shape and dtype), concatenated along dimension 0 in rank order, on
//! every rank; differentiable (see the header's comment).
template <class Communicator>
at::Tensor allgather(Communicator& comm, const at::Tensor& x) {
  auto c = detail::collectives_of(comm);
  const bool recorded = detail::agree_on_tensors(*c, x, "allgather", false);
  return detail::allgather_function::apply(x, detail::anchor(recorded, x.options()), std::move(c));
}

//! `root`'s `x` on every rank (`x` is read on the root only: elsewhere an undefined tensor will
//! do); differentiable: the root's gradient is the sum of every rank's output's gradient.
template <class Communicator>
at::Tensor bcast(Communicator& comm, const at::Tensor& x, int root = 0) {
  auto c = detail::collectives_of(comm);
  const auto [d, recorded] = detail::roots_tensor(*c, x, root, "bcast", false);
  const bool here = comm.rank() == root;
  const at::TensorOptions options = detail::options_of(d);
  at::Tensor into = at::empty(here ? std::vector<std::int64_t>{0} : detail::sizes_of(d), options);
  return detail::bcast_function::apply(here ? x : at::empty({0}, options),
                                       detail::anchor(recorded, options), std::move(c),
                                       std::int64_t{root}, std::move(into));
}

//! Every rank's `x` (all of one shape and dtype), concatenated along dimension 0 in rank order, on
//! `root`; elsewhere a zero scalar delegate to add to the loss (as `send`'s). Differentiable.
template <class Communicator>
at::Tensor gather(Communicator& comm, const at::Tensor& x, int root = 0) {
  auto c = detail::collectives_of(comm);
  const bool recorded = detail::agree_on_tensors(*c, x, "gather", false);
  return detail::gather_function::apply(x, detail::anchor(recorded, x.options()), std::move(c),
                                        std::int64_t{root});
}

//! `root`'s `x` split along dimension 0 into equal blocks, block r to rank r (`x` is read on the
//! root only: elsewhere an undefined tensor will do). Differentiable.
template <class Communicator>
at::Tensor scatter(Communicator& comm, const at::Tensor& x, int root = 0) {
  auto c = detail::collectives_of(comm);
  const auto [d, recorded] = detail::roots_tensor(*c, x, root, "scatter", true);
  const bool here = comm.rank() == root;
  const at::TensorOptions options = detail::options_of(d);
  std::vector<std::int64_t> block = detail::sizes_of(d);
  block[0] /= comm.size();
  return detail::scatter_function::apply(here ? x : at::empty({0}, options),
                                         detail::anchor(recorded, options), std::move(c),
                                         std::int64_t{root}, at::empty(block, options));
}

//! Block q of `x` (split along dimension 0 into one block a rank; every rank's `x` of one shape and
//! dtype) goes to rank q; block q of the result came from rank q. Differentiable.
template <class Communicator>
at::Tensor alltoall(Communicator& comm, const at::Tensor& x) {
  auto c = detail::collectives_of(comm);
  const bool recorded = detail::agree_on_tensors(*c, x, "alltoall", true);
  return detail::alltoall_function::apply(x, detail::anchor(recorded, x.options()), std::move(c));
}

//! Sends `x` to rank `dest`. Returns once `dest`'s `recv` has matched it (as MPI_Ssend): the
//! message carries x's description (dtype, shape), and a `recv` that expects another is a
//! `mismatch_error` on both ends naming both, with nothing sent. So ranks that exchange tensors
//! must not all send first: one receives first (a ring: even ranks send first, odd ranks receive
//! first). Two ranks that both send to each other first are told so; a longer cycle of sends
//! waits until the communicator's timeout ends the job, naming the send. Returns a zero scalar that
//! carries x's gradient: add it to this rank's loss (or call backward on it) and the backward pass
//! receives, from `dest`, the gradient its `recv` got, and passes it on to `x`.
template <class Communicator>
at::Tensor send(Communicator& comm, const at::Tensor& x, int dest, int tag = 0) {
  return detail::send_through(detail::collectives_of(comm), x, dest, tag);
}

//! Receives from rank `source` a tensor of `shape` and `options`' dtype, in CPU memory: the
//! sender's tensor must have that dtype and shape (else `mismatch_error` on both ends, naming
//! both). Where the dtype is floating the result requires a gradient, which the backward pass
//! sends to `source`.
template <class Communicator>
at::Tensor recv(Communicator& comm, int source, at::IntArrayRef shape,
                const at::TensorOptions& options = {}, int tag = 0) {
  if (options.has_device() && !options.device().is_cpu()) {
    throw invalid_argument("cohort::torch::recv on rank " + std::to_string(comm.rank()) +
                           ": a tensor on " + options.device().str() +
                           " asked for; the functions move CPU tensors only");
  }
  if (shape.size() > static_cast<std::size_t>(detail::most_dimensions)) {
    throw invalid_argument("cohort::torch::recv on rank " + std::to_string(comm.rank()) +
                           ": a tensor of " + std::to_string(shape.size()) +
                           " dimensions asked for, more than the " +
                           std::to_string(detail::most_dimensions) + " a message describes");
  }
  std::vector<std::int64_t> d{static_cast<std::int64_t>(options.dtype().toScalarType())};
  d.insert(d.end(), shape.begin(), shape.end());
  return detail::recv_through(detail::collectives_of(comm), d, source, tag);
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
