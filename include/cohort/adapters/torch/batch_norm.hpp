// SPDX-License-Identifier: Apache-2.0
#pragma once

// Batch normalisation over every rank's batch (ChainerMN's MultiNodeBatchNormalization, PyTorch's
// SyncBatchNorm): in training, the mean and variance are those of the union of the ranks' batches,
// and the backward pass reduces its two per-channel sums across the ranks too, so that each rank's
// input gradient is its slice of the gradient of the whole batch. Statistics are accumulated in
// float32 at least (float64 for float64 inputs), whatever the input's dtype; the variance from the
// deviations from the global mean (two all-reduces), not from a sum of squares, which loses
// digits. The running statistics are updated from the same all-reduced values on every rank.

#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>

#include <ATen/ATen.h>
#include <cstdint>
#include <functional>
#include <string>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! Sums a tensor over the ranks, in place (a communicator's `allreduce` with `reduce_op::sum`).
using rank_sum = std::function<void(at::Tensor&)>;

namespace detail {

// The dtype statistics are kept in: float32 at least (float64 for float64 inputs).
inline at::ScalarType accumulation_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The dimensions reduced per channel: all but dimension 1.
inline std::vector<std::int64_t> batch_dims(const at::Tensor& x) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < x.dim(); ++d) {
    dims.push_back(d);
  }
  return dims;
}

// Shapes a per-channel vector [C] to broadcast against x: [1, C, 1, ...].
inline at::Tensor per_channel(const at::Tensor& v, const at::Tensor& x) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

struct batch_norm_function : ::torch::autograd::Function<batch_norm_function> {
  // x [N, C, *]; weight and bias [C]; `sum` sums over the ranks; mean and var (outputs, [C], the
  // accumulation dtype) for the running statistics; `total` the number of values per channel over
  // every rank.
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias, const rank_sum* sum,
                            double eps, at::Tensor mean_out, at::Tensor var_out,
                            at::Tensor total_out) {
    const at::ScalarType acc = detail::accumulation_type(x);
    const at::Tensor xa = x.to(acc);
    const auto dims = batch_dims(x);
    const std::int64_t channels = x.size(1);
    // The sums of the values and the count (in float64: a count past 2^24 values a channel is
    // exact there, not in float32), then the sum of squared deviations from the mean.
    at::Tensor first = at::cat(
        {xa.sum(dims).to(at::kDouble), at::full({1}, static_cast<double>(x.numel() / channels),
                                                xa.options().dtype(at::kDouble))});
    (*sum)(first);
    total_out.copy_(first.narrow(0, channels, 1));
    const at::Tensor count = first.narrow(0, channels, 1).to(acc);
    const at::Tensor mean = (first.narrow(0, 0, channels) / first.narrow(0, channels, 1)).to(acc);
    at::Tensor squares = (xa - per_channel(mean, xa)).pow(2).sum(dims);
    (*sum)(squares);
    const at::Tensor var = squares / count;
    const at::Tensor invstd = (var + eps).rsqrt();
    const at::Tensor xhat = (xa - per_channel(mean, xa)) * per_channel(invstd, xa);
    at::Tensor y = xhat * per_channel(weight.to(acc), xa) + per_channel(bias.to(acc), xa);
    mean_out.copy_(mean);
    var_out.copy_(var);
    ctx->save_for_backward({xhat, invstd, weight, count});
    ctx->saved_data["sum"] = reinterpret_cast<std::int64_t>(sum);
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(x.scalar_type());
    return y.to(x.scalar_type());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xhat = saved[0];
    const at::Tensor& invstd = saved[1];
    const at::Tensor& weight = saved[2];
    const at::Tensor& count = saved[3];
    const auto* sum = reinterpret_cast<const rank_sum*>(ctx->saved_data["sum"].toInt());
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor dy = grads[0].to(xhat.scalar_type());
    const auto dims = batch_dims(xhat);
    const std::int64_t channels = xhat.size(1);
    // This rank's share of the bias's and weight's gradients, then their sums over the ranks for
    // the input's gradient.
    const at::Tensor local_dbias = dy.sum(dims);
    const at::Tensor local_dweight = (dy * xhat).sum(dims);
    at::Tensor both = at::cat({local_dbias, local_dweight});
    (*sum)(both);
    const at::Tensor mean_dy = both.narrow(0, 0, channels) / count;
    const at::Tensor mean_dy_xhat = both.narrow(0, channels, channels) / count;
    const at::Tensor dx =
        per_channel(weight.to(xhat.scalar_type()) * invstd, xhat) *
        (dy - per_channel(mean_dy, xhat) - xhat * per_channel(mean_dy_xhat, xhat));
    return {dx.to(dtype),
            local_dweight.to(weight.scalar_type()),
            local_dbias.to(weight.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

} // namespace detail

struct multi_node_batch_norm_options {
  double eps = 1e-5;
  //! As LibTorch's BatchNorm: running = (1 - momentum) * running + momentum * batch statistic
  //! (the unbiased variance, over every rank's batch).
  double momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

//! A BatchNorm over `channels` (dimension 1 of its input, as torch::nn::BatchNorm1d/2d/3d) whose
//! training statistics are those of every rank's batch together. Make it with the communicator
//! it reduces over, e.g. `multi_node_batch_norm(comm, 64)`: `rank_sum` is built from it, and the
//! communicator must outlive the module, and the module every graph it is in. In evaluation
//! (`eval()`), it normalises with the running statistics, as LibTorch's does, with no
//! communication; without running statistics (`track_running_stats = false`) it uses the batch's,
//! over every rank, in evaluation too (as LibTorch's). An input whose channels are not `channels`
//! on one rank is an error on every rank (the communicator's agreement on the sums' sizes).
class multi_node_batch_norm_impl : public ::torch::nn::Module {
public:
  template <class Communicator>
  multi_node_batch_norm_impl(Communicator& comm, std::int64_t channels,
                             multi_node_batch_norm_options options = {})
      : multi_node_batch_norm_impl(
            rank_sum([&comm](at::Tensor& t) { comm.allreduce(t, reduce_op::sum); }), channels,
            options) {
    rank_ = comm.rank();
    // Compared at the first forward that communicates: an eps or a momentum that differs from
    // rank to rank would part the replicas' statistics without a word.
    agree_ = [&comm](const std::vector<setting>& settings) {
      agree_on_settings(comm, settings, "multi_node_batch_norm");
    };
  }

  multi_node_batch_norm_impl(rank_sum sum, std::int64_t channels,
                             multi_node_batch_norm_options options = {})
      : sum_(std::move(sum))
      , channels_(channels)
      , options_(options) {
    if (channels < 1) {
      throw invalid_argument("cohort: multi_node_batch_norm: channels must be at least 1 (it is " +
                             std::to_string(channels) + ")");
    }
    if (options_.affine) {
      weight = register_parameter("weight", ::torch::ones({channels}));
      bias = register_parameter("bias", ::torch::zeros({channels}));
    }
    if (options_.track_running_stats) {
      running_mean = register_buffer("running_mean", ::torch::zeros({channels}));
      running_var = register_buffer("running_var", ::torch::ones({channels}));
      num_batches_tracked =
          register_buffer("num_batches_tracked", ::torch::zeros({}, ::torch::kLong));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    const bool communicates = is_training() || !options_.track_running_stats;
    if (communicates && agree_) {
      agree_({{"the channels", std::to_string(channels_)},
              {"option 'eps'", exact_text(options_.eps)},
              {"option 'momentum'", exact_text(options_.momentum)},
              {"option 'affine'", options_.affine ? "true" : "false"},
              {"option 'track_running_stats'", options_.track_running_stats ? "true" : "false"}});
      agree_ = nullptr; // (once they agreed: after a mismatch, the next forward compares again)
    }
    if (x.dim() < 2 || x.size(1) != channels_) {
      if (communicates) {
        // The other ranks are about to sum channels + 1 values: a sum of another size makes the
        // communicator's agreement an error on every rank, where throwing here alone would
        // leave them waiting for this rank.
        at::Tensor other = ::torch::zeros({channels_ + 2}, at::kDouble);
        try {
          sum_(other);
        } catch (const std::exception&) {
        }
      }
      throw invalid_argument("cohort: multi_node_batch_norm of " + std::to_string(channels_) +
                             " channels" + on_rank() + ": an input of shape " + shape_of(x) +
                             " (channels are dimension 1)");
    }
    const at::Tensor w = options_.affine ? weight : ::torch::ones({channels_}, x.options());
    const at::Tensor b = options_.affine ? bias : ::torch::zeros({channels_}, x.options());
    const at::ScalarType acc = detail::accumulation_type(x);
    if (!is_training() && options_.track_running_stats) {
      const at::Tensor xa = x.to(acc);
      const at::Tensor invstd = (running_var.to(acc) + options_.eps).rsqrt();
      const at::Tensor y = (xa - detail::per_channel(running_mean.to(acc), xa)) *
                               detail::per_channel(invstd, xa) *
                               detail::per_channel(w.to(acc), xa) +
                           detail::per_channel(b.to(acc), xa);
      return y.to(x.scalar_type());
    }
    // Every rank calls this with a batch, however small (an empty one counts no values).
    at::Tensor mean = ::torch::empty({channels_}, x.options().dtype(acc));
    at::Tensor var = ::torch::empty({channels_}, x.options().dtype(acc));
    at::Tensor total = ::torch::empty({1}, x.options().dtype(at::kDouble));
    at::Tensor y;
    try {
      y = detail::batch_norm_function::apply(x, w, b, &sum_, options_.eps, mean, var, total);
    } catch (const mismatch_error& e) {
      throw mismatch_error("cohort: multi_node_batch_norm of " + std::to_string(channels_) +
                           " channels" + on_rank() +
                           ": the ranks' batches do not fit together (an input with other "
                           "channels on some rank): " +
                           e.what());
    }
    if (options_.track_running_stats) {
      const ::torch::NoGradGuard no_grad;
      const double n = total.item<double>();
      // An empty batch on every rank has no statistics (its mean is 0/0): the running ones stay
      // as they were, as LibTorch's BatchNorm leaves them. (Empty on some ranks only: the others'
      // values are the batch.)
      if (n > 0) {
        const at::Tensor unbiased = n > 1 ? var * (n / (n - 1)) : var;
        running_mean.mul_(1 - options_.momentum)
            .add_(mean.to(running_mean.scalar_type()), options_.momentum);
        running_var.mul_(1 - options_.momentum)
            .add_(unbiased.to(running_var.scalar_type()), options_.momentum);
      }
      num_batches_tracked.add_(1);
    }
    return y;
  }

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

private:
  static std::string shape_of(const at::Tensor& x) {
    std::string s = "[";
    for (std::int64_t d = 0; d < x.dim(); ++d) {
      s += (d == 0 ? "" : ", ") + std::to_string(x.size(d));
    }
    return s + "]";
  }

  std::string on_rank() const { return rank_ < 0 ? "" : " on rank " + std::to_string(rank_); }

  rank_sum sum_;
  std::function<void(const std::vector<setting>&)> agree_; // until the first forward's
  int rank_ = -1; // for the messages; unknown when made from a rank_sum
  std::int64_t channels_;
  multi_node_batch_norm_options options_;
};
//! The module holder, as TORCH_MODULE makes them (written out: inside namespace cohort::torch
//! the macro's `torch::nn` would name this namespace).
class multi_node_batch_norm : public ::torch::nn::ModuleHolder<multi_node_batch_norm_impl> {
public:
  using ::torch::nn::ModuleHolder<multi_node_batch_norm_impl>::ModuleHolder;
  using Impl = multi_node_batch_norm_impl;
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
