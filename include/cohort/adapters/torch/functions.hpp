// SPDX-License-Identifier: Apache-2.0
#pragma once

// Differentiable collectives (ChainerMN's chainermn.functions): LibTorch autograd functions whose
// backward is the collective's adjoint, so that a loss computed after a collective sends its
// gradient back to the ranks whose values went in. Collective in forward and in backward alike:
// every rank calls them in the same order and runs backward through them (a rank whose loss does
// not depend on an output still calls backward through it, with a zero gradient if need be). The
// communicator must outlive the graph.
//
// - allreduce(comm, x): every rank gets the sum of every rank's x. Backward: each rank's gradient
//   is the sum of the gradients of every rank's output (x reached every output).
// - allgather(comm, x): every rank gets every rank's x, concatenated along dimension 0 in rank
//   order (the ranks' x of one shape). Backward: rank r's gradient is the sum over the ranks of
//   slice r of their output's gradient (a reduce-scatter).
// - send(comm, x, dest) / recv(comm, source, shape): point to point; the gradient flows back the
//   other way. send returns a zero "delegate" to add to the sender's loss, so that its backward
//   waits for the gradient (ChainerMN's delegate variable and pseudo_connect, as a value a LibTorch
//   user adds to a loss). Within one backward pass, LibTorch runs the nodes made later first: a
//   rank that receives after it sends gives its received gradient back before it waits for its own.

#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <cstdint>
#include <functional>
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
  std::function<void(at::Tensor&)> sum;                            // in place, over the ranks
  std::function<void(const at::Tensor&, at::Tensor&)> gather;      // all-gather, rank order
  std::function<void(const at::Tensor&, at::Tensor&)> sum_scatter; // reduce-scatter of a sum
  std::function<void(const at::Tensor&, int, int)> send;           // to a rank, with a tag
  std::function<void(at::Tensor&, int, int)> recv;                 // from a rank, with a tag
  std::int64_t size = 1;
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
  c->size = comm.size();
  return c;
}

inline const collectives& saved(::torch::autograd::AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<collectives>(ctx->saved_data["c"].toCapsule());
}

struct allreduce_function : ::torch::autograd::Function<allreduce_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<collectives> c) {
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
