// SPDX-License-Identifier: Apache-2.0
// Issue 15, ChainerMN's rows beyond data parallelism, on LibTorch: buffer averaging, multi-node
// batch normalisation, differentiable communication, a model split over ranks (alone and in a
// 2-D grid with data parallelism), and the iterators every rank agrees on.
#define BOOST_TEST_MODULE adapters.torch_model_parallel
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <torch/torch.h>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

// Issue 15: ChainerMN's AllreducePersistent. Running statistics that differ by rank become their
// mean over the ranks, the same on every rank; the step counter stays.
BOOST_AUTO_TEST_CASE(average_buffers_gives_every_rank_the_mean_running_statistics) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::manual_seed(static_cast<std::uint64_t>(comm.rank()));
  torch::nn::BatchNorm1d norm(4);
  norm->train();
  norm->forward(torch::randn({8, 4}) * (comm.rank() + 1));
  const auto as_vector = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  };
  const auto means = comm.allgather_obj(as_vector(norm->running_mean));
  const auto vars = comm.allgather_obj(as_vector(norm->running_var));
  cohort::torch::average_buffers(comm, *norm);
  for (std::size_t i = 0; i < 4; ++i) {
    double mean = 0, var = 0;
    for (int r = 0; r < comm.size(); ++r) {
      mean += means[static_cast<std::size_t>(r)][i] / comm.size();
      var += vars[static_cast<std::size_t>(r)][i] / comm.size();
    }
    BOOST_TEST(norm->running_mean[static_cast<std::int64_t>(i)].item<float>() == mean,
               boost::test_tools::tolerance(1e-5));
    BOOST_TEST(norm->running_var[static_cast<std::int64_t>(i)].item<float>() == var,
               boost::test_tools::tolerance(1e-5));
  }
  for (const auto& theirs : comm.allgather_obj(as_vector(norm->running_mean))) {
    BOOST_TEST((theirs == as_vector(norm->running_mean))); // bit for bit on every rank
  }
  BOOST_TEST(norm->num_batches_tracked.item<std::int64_t>() == 1);
  if (comm.size() < 2) {
    return;
  }
  // Another model on the last rank: an error on every rank, naming the buffer.
  const int last = comm.size() - 1;
  torch::nn::BatchNorm1d other(comm.rank() == last ? 5 : 4);
  BOOST_CHECK_EXCEPTION(cohort::torch::average_buffers(comm, *other), cohort::mismatch_error,
                        message_has({"average_buffers", "running_mean (4 Float) on rank 0",
                                     "running_mean (5 Float) on rank " + std::to_string(last)}));
}

namespace {
// Each rank's slice of a batch of n * b examples (the same on every rank, from one seed),
// normalised by multi_node_batch_norm, against torch::nn::BatchNorm1d over the whole batch in one
// process: outputs, input gradients, the weight's and bias's gradients summed over the ranks, and
// the running statistics.
template <class T>
void check_batch_norm(cohort::flat& comm, double tolerance) {
  const auto dtype = std::is_same_v<T, double> ? torch::kDouble : torch::kFloat;
  const std::int64_t b = 3, channels = 4, length = 5;
  const std::int64_t n = comm.size(), at = comm.rank() * b;
  torch::manual_seed(7);
  const at::Tensor all = torch::randn({n * b, channels, length}, dtype) * 3 + 1;
  const at::Tensor upstream = torch::randn({n * b, channels, length}, dtype);
  torch::nn::BatchNorm1d reference(channels);
  reference->to(dtype);
  cohort::torch::multi_node_batch_norm mine(comm, channels);
  mine->to(dtype);
  for (int step = 0; step < 2; ++step) { // twice: the running statistics move twice
    const at::Tensor whole = all.clone().requires_grad_();
    const at::Tensor expected = reference(whole);
    (expected * upstream).sum().backward();
    const at::Tensor slice = all.narrow(0, at, b).clone().requires_grad_();
    const at::Tensor got = mine(slice);
    (got * upstream.narrow(0, at, b)).sum().backward();
    BOOST_TEST_REQUIRE(torch::allclose(got, expected.narrow(0, at, b), tolerance, tolerance),
                       "outputs differ at step " << step);
    BOOST_TEST_REQUIRE(
        torch::allclose(slice.grad(), whole.grad().narrow(0, at, b), tolerance, tolerance),
        "input gradients differ at step " << step);
  }
  at::Tensor dweight = mine->weight.grad().clone();
  at::Tensor dbias = mine->bias.grad().clone();
  comm.allreduce(dweight);
  comm.allreduce(dbias);
  BOOST_TEST(torch::allclose(dweight, reference->weight.grad(), tolerance, tolerance));
  BOOST_TEST(torch::allclose(dbias, reference->bias.grad(), tolerance, tolerance));
  BOOST_TEST(torch::allclose(mine->running_mean, reference->running_mean, tolerance, tolerance));
  BOOST_TEST(torch::allclose(mine->running_var, reference->running_var, tolerance, tolerance));
  BOOST_TEST(mine->num_batches_tracked.item<std::int64_t>() == 2);
  // The same running statistics on every rank, bit for bit.
  at::Tensor root_mean = mine->running_mean.clone();
  comm.broadcast(root_mean, 0);
  BOOST_TEST(torch::equal(root_mean, mine->running_mean));
  // Evaluation normalises with them, without communication.
  mine->eval();
  reference->eval();
  BOOST_TEST(torch::allclose(mine(all), reference(all), tolerance, tolerance));
}
} // namespace

// Issue 15: ChainerMN's MultiNodeBatchNormalization.
BOOST_AUTO_TEST_CASE(multi_node_batch_norm_matches_batch_norm_over_the_whole_batch) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  check_batch_norm<double>(comm, 1e-10);
  check_batch_norm<float>(comm, 1e-5);
  // A half-precision input is normalised with float32 statistics.
  cohort::torch::multi_node_batch_norm half(comm, 2);
  const at::Tensor x = (torch::arange(12, torch::kFloat).view({6, 2}) * 100).to(torch::kHalf);
  const at::Tensor y = half(x).to(torch::kFloat);
  BOOST_TEST(y.scalar_type() == torch::kFloat);
  BOOST_TEST(torch::allclose(y.mean(0), torch::zeros({2}), 1e-3, 1e-3));
  // Another number of channels on one rank: an error on every rank, never a hang.
  cohort::torch::multi_node_batch_norm norm(comm, 3);
  BOOST_CHECK_EXCEPTION(norm(torch::ones({2, 4})), cohort::invalid_argument,
                        message_has({"multi_node_batch_norm of 3 channels", "[2, 4]"}));
  if (comm.size() > 1) {
    const int last = comm.size() - 1;
    const std::int64_t c = comm.rank() == last ? 5 : 4;
    cohort::torch::multi_node_batch_norm odd(comm, c);
    BOOST_CHECK_THROW(odd(torch::randn({2, c})), cohort::mismatch_error);
    // The same module everywhere, a batch of other channels on the last rank only: that rank's
    // own error there, a mismatch_error naming the module elsewhere.
    cohort::torch::multi_node_batch_norm four(comm, 4);
    if (comm.rank() == last) {
      BOOST_CHECK_EXCEPTION(
          four(torch::randn({2, 5})), cohort::invalid_argument,
          message_has({"of 4 channels on rank " + std::to_string(last), "[2, 5]"}));
    } else {
      BOOST_CHECK_EXCEPTION(
          four(torch::randn({2, 4})), cohort::mismatch_error,
          message_has({"multi_node_batch_norm of 4 channels on rank", "do not fit together"}));
    }
  }
  // bfloat16 inputs: float32 statistics, outputs within bfloat16's precision of the float32
  // BatchNorm over the whole batch.
  const std::int64_t n = comm.size(), at = comm.rank() * 4;
  torch::manual_seed(9);
  const at::Tensor all = torch::randn({n * 4, 3}) * 5 + 2;
  torch::nn::BatchNorm1d reference(3);
  cohort::torch::multi_node_batch_norm brain(comm, 3);
  brain->to(torch::kBFloat16);
  const at::Tensor expected = reference(all).narrow(0, at, 4);
  const at::Tensor got = brain(all.narrow(0, at, 4).to(torch::kBFloat16));
  BOOST_TEST(got.scalar_type() == torch::kBFloat16);
  BOOST_TEST(torch::allclose(got.to(torch::kFloat), expected, 2e-2, 2e-2));
  BOOST_TEST(brain->running_mean.scalar_type() == torch::kBFloat16);
  BOOST_TEST(
      torch::allclose(brain->running_mean.to(torch::kFloat), reference->running_mean, 1e-2, 1e-2));
}

namespace {
// Central finite differences of the sum of every rank's loss, against the gradient backward gave
// this rank's input (float64): the gradient check. Collective: every rank perturbs, in turn, each
// element of one rank's input, and every rank runs the function again.
template <class Loss>
void check_gradient(cohort::flat& comm, const at::Tensor& x0, Loss&& loss_of, const char* what) {
  const at::Tensor x = x0.clone().requires_grad_();
  loss_of(x).backward();
  const at::Tensor analytic = x.grad().defined() ? x.grad() : torch::zeros_like(x0);
  const double eps = 1e-6;
  for (int p = 0; p < comm.size(); ++p) {
    const std::int64_t count = comm.bcast_obj(x0.numel(), p);
    for (std::int64_t e = 0; e < count; ++e) {
      double sides[2];
      for (int s = 0; s < 2; ++s) {
        const at::Tensor moved = x0.clone();
        if (comm.rank() == p) {
          moved.view(-1)[e] += s == 0 ? eps : -eps;
        }
        sides[s] = comm.allreduce_obj(loss_of(moved).template item<double>());
      }
      if (comm.rank() == p) {
        const double numeric = (sides[0] - sides[1]) / (2 * eps);
        const double got = analytic.view(-1)[e].template item<double>();
        BOOST_TEST(std::abs(got - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)),
                   what << ": element " << e << " of rank " << p << "'s input: backward gave "
                        << got << ", finite differences " << numeric);
      }
    }
  }
}

// Rank r's loss of an output y: (w_r * y * y).sum(), w_r from r's seed; a delegate (a scalar) as
// it is.
at::Tensor loss_of(const at::Tensor& y, int rank) {
  if (y.dim() == 0) {
    return y;
  }
  torch::manual_seed(static_cast<std::uint64_t>(100 + rank));
  return (torch::randn(y.sizes(), torch::kDouble) * y * y).sum();
}

at::Tensor input_of(int rank, std::int64_t rows) {
  torch::manual_seed(static_cast<std::uint64_t>(rank));
  return torch::randn({rows, 3}, torch::kDouble);
}
} // namespace

// Issue 15: differentiable collectives, against the same computation in one process (float64).
// Rank r's input and its loss's weights come from seeds of r, so that every rank can build the
// whole computation and its gradients alone.
BOOST_AUTO_TEST_CASE(differentiable_collectives_match_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const std::int64_t n = comm.size(), r = comm.rank();
  const auto input = [](std::int64_t rank) {
    torch::manual_seed(static_cast<std::uint64_t>(rank));
    return torch::randn({2, 3}, torch::kDouble);
  };
  const auto weights = [](std::int64_t rank, std::int64_t rows) {
    torch::manual_seed(static_cast<std::uint64_t>(100 + rank));
    return torch::randn({rows, 3}, torch::kDouble);
  };
  std::vector<at::Tensor> every;
  for (std::int64_t q = 0; q < n; ++q) {
    every.push_back(input(q).requires_grad_());
  }
  {
    // allreduce: the loss of rank q is (w_q * sum of x).sum().
    const at::Tensor x = input(r).requires_grad_();
    const at::Tensor y = cohort::torch::allreduce(comm, x);
    (weights(r, 2) * y).sum().backward();
    const at::Tensor whole = torch::stack(every).sum(0);
    at::Tensor loss = torch::zeros({}, torch::kDouble);
    for (std::int64_t q = 0; q < n; ++q) {
      loss = loss + (weights(q, 2) * whole).sum();
    }
    loss.backward();
    BOOST_TEST(torch::allclose(y, whole, 1e-12, 1e-12));
    BOOST_TEST(torch::allclose(x.grad(), every[static_cast<std::size_t>(r)].grad(), 1e-12, 1e-12));
  }
  for (at::Tensor& e : every) {
    e.mutable_grad().reset();
  }
  {
    // allgather: the loss of rank q is (w_q * every x, stacked).sum().
    const at::Tensor x = input(r).requires_grad_();
    const at::Tensor y = cohort::torch::allgather(comm, x);
    (weights(r, 2 * n) * y).sum().backward();
    const at::Tensor whole = torch::cat(every);
    at::Tensor loss = torch::zeros({}, torch::kDouble);
    for (std::int64_t q = 0; q < n; ++q) {
      loss = loss + (weights(q, 2 * n) * whole).sum();
    }
    loss.backward();
    BOOST_TEST(torch::allclose(y, whole.detach(), 1e-12, 1e-12));
    BOOST_TEST(torch::allclose(x.grad(), every[static_cast<std::size_t>(r)].grad(), 1e-12, 1e-12));
  }
  if (n > 1) {
    // Another shape on the last rank: an error on every rank, never a hang.
    const at::Tensor odd = torch::ones({r == n - 1 ? 3 : 2, 3}, torch::kDouble);
    BOOST_CHECK_THROW(cohort::torch::allreduce(comm, odd), cohort::mismatch_error);
    BOOST_CHECK_THROW(cohort::torch::allgather(comm, odd), cohort::mismatch_error);
  }
}

// Issue 15: send and recv, the gradient flowing back the other way. A ring: rank r sends 2 x_r
// to rank r + 1, which weights it with its own w; so x_r's gradient is 2 w_{r+1}.
BOOST_AUTO_TEST_CASE(send_and_recv_carry_the_gradient_back) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank();
  if (n < 2) {
    return;
  }
  const auto weights = [](int rank) {
    torch::manual_seed(static_cast<std::uint64_t>(100 + rank));
    return torch::randn({2, 3}, torch::kDouble);
  };
  // A ring: a send returns once its receiver has matched it, so even ranks send first and odd
  // ranks receive first. Returns the send's delegate and what arrived.
  const auto ring = [&](const at::Tensor& out, at::IntArrayRef shape, at::ScalarType dtype,
                        int tag) {
    at::Tensor delegate, got;
    const auto send = [&] { delegate = cohort::torch::send(comm, out, (r + 1) % n, tag); };
    const auto recv = [&] { got = cohort::torch::recv(comm, (r + n - 1) % n, shape, dtype, tag); };
    if (r % 2 == 0) {
      send();
      recv();
    } else {
      recv();
      send();
    }
    return std::pair{delegate, got};
  };
  torch::manual_seed(static_cast<std::uint64_t>(r));
  const at::Tensor x = torch::randn({2, 3}, torch::kDouble).requires_grad_();
  const auto [delegate, got] = ring(x * 2, {2, 3}, torch::kDouble, 7);
  BOOST_TEST(got.requires_grad());
  torch::manual_seed(static_cast<std::uint64_t>((r + n - 1) % n));
  BOOST_TEST(torch::allclose(got, torch::randn({2, 3}, torch::kDouble) * 2, 1e-12, 1e-12));
  ((weights(r) * got).sum() + delegate).backward();
  BOOST_TEST(torch::allclose(x.grad(), 2 * weights((r + 1) % n), 1e-12, 1e-12));

  // The gradient check: a ring whose loss squares what arrives.
  check_gradient(
      comm, x.detach(),
      [&](const at::Tensor& v) {
        const auto [sent, arrived] = ring(v * 3, {2, 3}, torch::kDouble, 8);
        return (weights(r) * arrived * arrived).sum() + sent;
      },
      "send and recv");

  // A tensor that requires no gradient (the input itself): the send is recorded all the same, as
  // the recv at the other end is, so its delegate's backward takes the gradient the receiver
  // sends and none is left queued for the next message of the tag.
  for (int round = 0; round < 2; ++round) {
    const at::Tensor plain = torch::full({2}, double(10 * round + r), torch::kDouble);
    const auto [d, in] = ring(plain, {2}, torch::kDouble, 9);
    BOOST_TEST(d.requires_grad());
    BOOST_TEST(
        torch::equal(in, torch::full({2}, double(10 * round + (r + n - 1) % n), torch::kDouble)));
    (in.sum() + d).backward();
  }
  // Integers travel without autograd (nothing to differentiate).
  const at::Tensor labels = torch::arange(4, torch::kLong) + r;
  const auto [none, got_labels] = ring(labels, {4}, torch::kLong, 10);
  BOOST_TEST(!none.requires_grad());
  BOOST_TEST(!got_labels.requires_grad());
  BOOST_TEST(torch::equal(got_labels, torch::arange(4, torch::kLong) + (r + n - 1) % n));
}

namespace {
// The model the pipeline test splits: layer one on rank 0, layer two and the loss on rank 1.
struct two_layers {
  torch::nn::Linear first{nullptr}, second{nullptr};
  two_layers() {
    torch::manual_seed(11);
    first = torch::nn::Linear(4, 8);
    second = torch::nn::Linear(8, 3);
    first->to(torch::kDouble);
    second->to(torch::kDouble);
  }
};
} // namespace

// Issue 15: a model split over two ranks trains as the same model in one process: the loss at each
// of 10 steps and the final weights, within 1e-10 in float64.
BOOST_AUTO_TEST_CASE(a_model_split_over_two_ranks_trains_as_in_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2 || comm.rank() > 1) {
    return;
  }
  two_layers split, whole;
  torch::optim::SGD split_opt(comm.rank() == 0 ? split.first->parameters()
                                               : split.second->parameters(),
                              torch::optim::SGDOptions(0.1));
  std::vector<at::Tensor> all = whole.first->parameters();
  for (const at::Tensor& p : whole.second->parameters()) {
    all.push_back(p);
  }
  torch::optim::SGD whole_opt(all, torch::optim::SGDOptions(0.1));
  torch::manual_seed(5);
  const at::Tensor inputs = torch::randn({10, 6, 4}, torch::kDouble);
  const at::Tensor targets = torch::randn({10, 6, 3}, torch::kDouble);
  for (std::int64_t step = 0; step < 10; ++step) {
    whole_opt.zero_grad();
    const at::Tensor expected =
        torch::mse_loss(whole.second(torch::tanh(whole.first(inputs[step]))), targets[step]);
    expected.backward();
    whole_opt.step();
    split_opt.zero_grad();
    if (comm.rank() == 0) {
      cohort::torch::send(comm, torch::tanh(split.first(inputs[step])), 1).backward();
    } else {
      const at::Tensor hidden = cohort::torch::recv(comm, 0, {6, 8}, torch::kDouble);
      const at::Tensor loss = torch::mse_loss(split.second(hidden), targets[step]);
      loss.backward();
      BOOST_TEST(loss.item<double>() == expected.item<double>(),
                 boost::test_tools::tolerance(1e-10));
    }
    split_opt.step();
  }
  const auto& mine = comm.rank() == 0 ? split.first : split.second;
  const auto& theirs = comm.rank() == 0 ? whole.first : whole.second;
  BOOST_TEST(torch::allclose(mine->weight, theirs->weight, 1e-10, 1e-10));
  BOOST_TEST(torch::allclose(mine->bias, theirs->bias, 1e-10, 1e-10));
}

// Issue 15: every differentiable collective's forward against the same values built in one
// process, and its backward against finite differences of the loss summed over the ranks.
BOOST_AUTO_TEST_CASE(every_collective_matches_one_process_and_passes_a_gradient_check) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank();
  const std::int64_t rows = 2 * n; // one block of 2 rows a rank, where the input splits
  std::vector<at::Tensor> every;
  for (int q = 0; q < n; ++q) {
    every.push_back(input_of(q, rows));
  }
  const at::Tensor mine = every[static_cast<std::size_t>(r)];
  const auto block = [](const at::Tensor& t, int q) { return t.narrow(0, 2 * q, 2); };
  namespace ct = cohort::torch;

  BOOST_TEST(torch::allclose(ct::allreduce(comm, mine), torch::stack(every).sum(0)));
  check_gradient(
      comm, mine, [&](const at::Tensor& x) { return loss_of(ct::allreduce(comm, x), r); },
      "allreduce");
  BOOST_TEST(torch::equal(ct::allgather(comm, mine), torch::cat(every)));
  check_gradient(
      comm, mine, [&](const at::Tensor& x) { return loss_of(ct::allgather(comm, x), r); },
      "allgather");
  at::Tensor exchanged = ct::alltoall(comm, mine);
  for (int q = 0; q < n; ++q) {
    BOOST_TEST(torch::equal(block(exchanged, q), block(every[static_cast<std::size_t>(q)], r)));
  }
  check_gradient(
      comm, mine, [&](const at::Tensor& x) { return loss_of(ct::alltoall(comm, x), r); },
      "alltoall");
  for (int root = 0; root < n; ++root) {
    const at::Tensor roots = every[static_cast<std::size_t>(root)];
    // Elsewhere than on the root, the input is not read: an undefined tensor will do.
    BOOST_TEST(torch::equal(ct::bcast(comm, r == root ? mine : at::Tensor(), root), roots));
    check_gradient(
        comm, mine, [&](const at::Tensor& x) { return loss_of(ct::bcast(comm, x, root), r); },
        "bcast");
    const at::Tensor gathered = ct::gather(comm, mine, root);
    if (r == root) {
      BOOST_TEST(torch::equal(gathered, torch::cat(every)));
    } else {
      BOOST_TEST(gathered.dim() == 0); // the delegate
    }
    check_gradient(
        comm, mine, [&](const at::Tensor& x) { return loss_of(ct::gather(comm, x, root), r); },
        "gather");
    BOOST_TEST(
        torch::equal(ct::scatter(comm, r == root ? mine : at::Tensor(), root), block(roots, r)));
    check_gradient(
        comm, mine, [&](const at::Tensor& x) { return loss_of(ct::scatter(comm, x, root), r); },
        "scatter");
  }
}

// Issue 15: tensors that do not fit together across ranks are an error on every rank, naming the
// ranks and the shapes, never a hang or a silent reshape.
BOOST_AUTO_TEST_CASE(mismatched_tensors_are_an_error_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank(), last = n - 1;
  namespace ct = cohort::torch;
  // The root's tensor undefined, or not splitting into a block a rank.
  BOOST_CHECK_EXCEPTION(ct::bcast(comm, at::Tensor(), 0), cohort::invalid_argument,
                        message_has({"bcast", "the root's (rank 0) tensor is undefined"}));
  if (n > 1) {
    BOOST_CHECK_EXCEPTION(ct::scatter(comm, torch::zeros({n + 1, 2}), last),
                          cohort::invalid_argument,
                          message_has({"scatter", "Float [" + std::to_string(n + 1) + ", 2]",
                                       "does not split into " + std::to_string(n)}));
    // One count, another shape: [2, 3] on the last rank, [3, 2] elsewhere.
    const at::Tensor odd = r == last ? torch::zeros({2, 3}) : torch::zeros({3, 2});
    const std::string names = "rank " + std::to_string(last) + "'s tensor is Float [2, 3]";
    BOOST_CHECK_EXCEPTION(ct::allgather(comm, odd), cohort::mismatch_error,
                          message_has({"allgather", names, "rank 0's is Float [3, 2]"}));
    BOOST_CHECK_EXCEPTION(ct::allreduce(comm, odd), cohort::mismatch_error, message_has({names}));
    BOOST_CHECK_EXCEPTION(ct::gather(comm, odd, 0), cohort::mismatch_error, message_has({names}));
    // Another dtype.
    const at::Tensor typed = torch::zeros({n, 2}, r == last ? torch::kDouble : torch::kFloat);
    BOOST_CHECK_EXCEPTION(ct::alltoall(comm, typed), cohort::mismatch_error,
                          message_has({"alltoall", "Double", "Float"}));
  }
  if (n > 1) {
    BOOST_CHECK_EXCEPTION(ct::alltoall(comm, torch::zeros({n + 1, 2})), cohort::invalid_argument,
                          message_has({"alltoall", "does not split"}));
  }
  // The communicator still works afterwards.
  BOOST_TEST(torch::equal(ct::allreduce(comm, torch::ones({2})),
                          torch::full({2}, double(n), torch::kFloat)));
}

namespace {
// A stack of `count` tanh layers, 4 -> 6 -> ... -> 6 -> 3, from one seed: stage i of the model the
// pipeline tests split, each stage on a rank of its own.
std::vector<torch::nn::Sequential> layers(int count) {
  torch::manual_seed(11);
  std::vector<torch::nn::Sequential> stages;
  for (int i = 0; i < count; ++i) {
    const std::int64_t in = i == 0 ? 4 : 6, out = i == count - 1 ? 3 : 6;
    torch::nn::Sequential stage(torch::nn::Linear(in, out));
    if (i < count - 1) {
      stage->push_back(torch::nn::Functional(torch::tanh));
    }
    stage->to(torch::kDouble);
    stages.push_back(stage);
  }
  return stages;
}

at::Tensor through(const std::vector<torch::nn::Sequential>& stages, at::Tensor x) {
  for (auto s : stages) { // (a copy of the holder: Sequential's forward is not const)
    x = s->forward(x);
  }
  return x;
}

std::vector<at::Tensor> parameters_of(const std::vector<torch::nn::Sequential>& stages) {
  std::vector<at::Tensor> all;
  for (const auto& s : stages) {
    for (const at::Tensor& p : s->parameters()) {
      all.push_back(p);
    }
  }
  return all;
}

// One SGD step of the whole model in one process, on the whole batch: its loss.
at::Tensor reference_step(const std::vector<torch::nn::Sequential>& whole, torch::optim::SGD& opt,
                          const at::Tensor& x, const at::Tensor& target) {
  opt.zero_grad();
  const at::Tensor loss = torch::mse_loss(through(whole, x), target);
  loss.backward();
  opt.step();
  return loss;
}

void require_same_parameters(const torch::nn::Module& got, const torch::nn::Module& expected) {
  const auto a = got.parameters(), b = expected.parameters();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST(torch::allclose(a[i], b[i], 1e-10, 1e-10), "parameter " << i << " differs");
  }
}
} // namespace

// Issue 15: ChainerMN's MultiNodeChainList. A model of one stage a rank, rank q's stage taking
// rank q - 1's output, trains as the whole model in one process: the loss at each of 10 SGD steps
// and the final parameters within 1e-10 (float64), at every rank count.
BOOST_AUTO_TEST_CASE(a_pipeline_over_every_rank_trains_as_in_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank();
  namespace ct = cohort::torch;
  const auto whole = layers(n);
  const auto split = layers(n);
  ct::multi_node_sequential model(comm);
  model->add(split[static_cast<std::size_t>(r)], r == 0 ? ct::from_input : r - 1,
             r == n - 1 ? ct::to_output : r + 1);
  torch::optim::SGD whole_opt(parameters_of(whole), torch::optim::SGDOptions(0.1));
  torch::optim::SGD split_opt(model->parameters(), torch::optim::SGDOptions(0.1));
  BOOST_TEST(model->parameters().size() == 2);
  torch::manual_seed(5);
  const at::Tensor inputs = torch::randn({10, 5, 4}, torch::kDouble);
  const at::Tensor targets = torch::randn({10, 5, 3}, torch::kDouble);
  for (std::int64_t step = 0; step < 10; ++step) {
    const at::Tensor expected = reference_step(whole, whole_opt, inputs[step], targets[step]);
    split_opt.zero_grad();
    // Only rank 0 reads the input; only the last rank has the output.
    const at::Tensor out = model(r == 0 ? inputs[step] : at::Tensor());
    if (r == n - 1) {
      const at::Tensor loss = torch::mse_loss(out, targets[step]);
      loss.backward();
      BOOST_TEST(loss.item<double>() == expected.item<double>(),
                 boost::test_tools::tolerance(1e-10));
    } else {
      BOOST_TEST(out.dim() == 0);
      out.backward();
    }
    split_opt.step();
  }
  require_same_parameters(*split[static_cast<std::size_t>(r)], *whole[static_cast<std::size_t>(r)]);
}

namespace {
// Ranks 0 and 1 as a communicator of their own (collective over `world`); none on the others, or
// with fewer than two ranks.
std::optional<cohort::flat> first_two(cohort::flat& world) {
  if (world.size() < 2) {
    return std::nullopt;
  }
  cohort::flat pair = world.split(world.rank() < 2 ? 0 : 1, world.rank());
  if (world.rank() >= 2) {
    return std::nullopt;
  }
  return pair;
}
} // namespace

// ChainerMN's own example: rank 0 runs the first and the last stage, rank 1 the middle one, so
// rank 0's forward returns its output with the first stage's delegate riding on it.
BOOST_AUTO_TEST_CASE(a_rank_may_run_stages_on_both_sides_of_another) {
  cohort::flat world = cohort::make_communicator<cohort::flat>();
  std::optional<cohort::flat> pair = first_two(world);
  if (!pair) {
    return;
  }
  cohort::flat& comm = *pair;
  namespace ct = cohort::torch;
  const auto whole = layers(3);
  const auto split = layers(3);
  ct::multi_node_sequential model(comm);
  if (comm.rank() == 0) {
    model->add(split[0], ct::from_input, 1);
    model->add(split[2], 1, ct::to_output);
  } else {
    model->add(split[1], 0, 0);
  }
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({5, 4}, torch::kDouble);
  const at::Tensor target = torch::randn({5, 3}, torch::kDouble);
  const at::Tensor expected = torch::mse_loss(through(whole, x), target);
  expected.backward();
  const at::Tensor out = model(comm.rank() == 0 ? x : at::Tensor());
  if (comm.rank() == 0) {
    const at::Tensor loss = torch::mse_loss(out, target);
    BOOST_TEST(loss.item<double>() == expected.item<double>(), boost::test_tools::tolerance(1e-12));
    loss.backward();
  } else {
    out.backward();
  }
  for (const int s : comm.rank() == 0 ? std::vector<int>{0, 2} : std::vector<int>{1}) {
    const auto a = split[static_cast<std::size_t>(s)]->parameters();
    const auto b = whole[static_cast<std::size_t>(s)]->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      BOOST_TEST(torch::allclose(a[i].grad(), b[i].grad(), 1e-12, 1e-12),
                 "stage " << s << ", parameter " << i);
    }
  }
  // Stages that cannot be: input from this rank itself, output to a rank that is not there.
  ct::multi_node_sequential fresh(comm);
  BOOST_CHECK_EXCEPTION(fresh->add(split[0], comm.rank(), ct::to_output), cohort::invalid_argument,
                        message_has({"multi_node_sequential", "takes its input from"}));
  BOOST_CHECK_EXCEPTION(fresh->add(split[0], ct::from_input, 5), cohort::invalid_argument,
                        message_has({"sends its output to 5"}));
}

// Issue 15: the 2-D grid at 4 ranks. Two replicas (ranks {0, 1} and {2, 3}) of a model split in
// two stages; each replica trains on half of every batch, and each stage's gradients are averaged
// with the other replica's same stage (ranks {0, 2} and {1, 3}): 10 steps match one process on
// the whole batch within 1e-10.
BOOST_AUTO_TEST_CASE(a_2d_grid_of_pipelines_and_replicas_trains_as_in_one_process) {
  cohort::flat world = cohort::make_communicator<cohort::flat>();
  if (world.size() < 4) {
    return;
  }
  const int r = world.rank();
  cohort::flat pipeline = world.split(r < 4 ? r / 2 : 2 + r, r);
  cohort::flat replicas = world.split(r < 4 ? r % 2 : 2 + r, r);
  if (r >= 4) {
    return;
  }
  namespace ct = cohort::torch;
  const int stage = pipeline.rank(), replica = replicas.rank();
  const auto whole = layers(2);
  const auto split = layers(2);
  ct::multi_node_sequential model(pipeline);
  model->add(split[static_cast<std::size_t>(stage)], stage == 0 ? ct::from_input : 0,
             stage == 0 ? 1 : ct::to_output);
  torch::optim::SGD whole_opt(parameters_of(whole), torch::optim::SGDOptions(0.1));
  torch::optim::SGD split_opt(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::manual_seed(5);
  const at::Tensor inputs = torch::randn({10, 8, 4}, torch::kDouble);
  const at::Tensor targets = torch::randn({10, 8, 3}, torch::kDouble);
  for (std::int64_t step = 0; step < 10; ++step) {
    const at::Tensor expected = reference_step(whole, whole_opt, inputs[step], targets[step]);
    split_opt.zero_grad();
    const at::Tensor half = inputs[step].narrow(0, 4 * replica, 4);
    const at::Tensor out = model(stage == 0 ? half : at::Tensor());
    if (stage == 1) {
      const at::Tensor loss = torch::mse_loss(out, targets[step].narrow(0, 4 * replica, 4));
      loss.backward();
      // The mean of the halves' mean losses is the whole batch's.
      const double both = replicas.allreduce_obj(loss.item<double>()) / 2;
      BOOST_TEST(both == expected.item<double>(), boost::test_tools::tolerance(1e-10));
    } else {
      out.backward();
    }
    replicas.allreduce_grad(cohort::torch::parameters(*model), cohort::mean{});
    split_opt.step();
  }
  require_same_parameters(*split[static_cast<std::size_t>(stage)],
                          *whole[static_cast<std::size_t>(stage)]);
}

// Issue 15: the multi-node iterator over LibTorch batches: the root's examples (data and target of
// any shape) on every rank, then the epoch's end.
BOOST_AUTO_TEST_CASE(tensor_batches_reach_every_rank_from_the_root) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int root = comm.size() / 2;
  std::int64_t read = 0;
  const auto example = [](std::int64_t i) {
    return torch::data::Example<>(torch::arange(i * 6, torch::kDouble).view({i, 6}),
                                  torch::full({i}, i, torch::kLong));
  };
  auto batches = cohort::make_multi_node_iterator(
      comm,
      [&]() -> std::optional<torch::data::Example<>> {
        if (read == 3) {
          return std::nullopt;
        }
        return example(++read);
      },
      root, cohort::torch::tensor_batches{});
  for (std::int64_t i = 1; i <= 3; ++i) {
    const auto batch = batches.next();
    BOOST_TEST_REQUIRE(batch.has_value());
    BOOST_TEST(torch::equal(batch->data, example(i).data));
    BOOST_TEST(torch::equal(batch->target, example(i).target));
  }
  BOOST_TEST(!batches.next().has_value());
  BOOST_TEST(read == (comm.rank() == root ? 3 : 0));
  // A non-contiguous tensor in a vector of them.
  auto vectors = cohort::make_multi_node_iterator(
      comm,
      []() -> std::optional<std::vector<at::Tensor>> {
        return std::vector<at::Tensor>{torch::arange(12, torch::kFloat).view({3, 4}).t()};
      },
      root, cohort::torch::tensor_batches{});
  const auto transposed = vectors.next();
  BOOST_TEST(torch::equal((*transposed)[0], torch::arange(12, torch::kFloat).view({3, 4}).t()));
}

// Issue 15: which calls autograd records is decided alike on every rank: any rank's tensor
// requiring a gradient records a collective everywhere (the others' outputs then require one too,
// and their backward joins), integers never; grad modes that differ are an error on every rank.
BOOST_AUTO_TEST_CASE(every_rank_records_the_same_calls) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank();
  namespace ct = cohort::torch;
  at::Tensor x = torch::full({3}, double(r + 1), torch::kDouble);
  if (r == 0) {
    x.requires_grad_();
  }
  const at::Tensor y = ct::allreduce(comm, x);
  BOOST_TEST(y.requires_grad());
  (y * (r + 1)).sum().backward(); // rank q weights the sum by q + 1
  if (r == 0) {
    BOOST_TEST(torch::allclose(x.grad(), torch::full({3}, n * (n + 1) / 2.0, torch::kDouble)));
  }
  // The root's tensor requires no gradient: nothing is recorded anywhere.
  const at::Tensor plain = ct::bcast(comm, r == 0 ? torch::ones({2}) : at::Tensor(), 0);
  BOOST_TEST(!plain.requires_grad());
  // Integers: plain collectives.
  const at::Tensor ids = torch::arange(2 * n, torch::kLong);
  BOOST_TEST(torch::equal(ct::bcast(comm, r == 0 ? ids : at::Tensor(), 0), ids));
  BOOST_TEST(
      torch::equal(ct::scatter(comm, r == 0 ? ids : at::Tensor(), 0), ids.narrow(0, 2 * r, 2)));
  BOOST_TEST(torch::equal(ct::allreduce(comm, ids), ids * n));
  if (n > 1) {
    const int last = n - 1;
    const at::Tensor t = torch::ones({2}, torch::kDouble).requires_grad_();
    const auto call = [&] { return ct::allgather(comm, t); };
    const auto check = message_has({"allgather", "autograd records gradients on rank 0 but not on "
                                                 "rank " +
                                                     std::to_string(last)});
    if (r == last) {
      const torch::NoGradGuard no_grad;
      BOOST_CHECK_EXCEPTION(call(), cohort::mismatch_error, check);
    } else {
      BOOST_CHECK_EXCEPTION(call(), cohort::mismatch_error, check);
    }
    // The same for a broadcast whose root records nothing.
    const auto broadcast = [&] {
      return ct::bcast(
          comm, r == 0 ? torch::ones({2}, torch::kDouble).requires_grad_() : at::Tensor(), 0);
    };
    if (r == 0) {
      const torch::NoGradGuard no_grad;
      BOOST_CHECK_EXCEPTION(broadcast(), cohort::mismatch_error,
                            message_has({"bcast", "autograd records"}));
    } else {
      BOOST_CHECK_EXCEPTION(broadcast(), cohort::mismatch_error,
                            message_has({"bcast", "autograd records"}));
    }
    // A tensor outside CPU memory (the meta device stands in for a GPU here) on one rank.
    const at::Tensor where =
        r == last ? torch::empty({2}, torch::Device(torch::kMeta)) : torch::empty({2});
    BOOST_CHECK_EXCEPTION(ct::allreduce(comm, where), cohort::mismatch_error,
                          message_has({"outside CPU memory"}));
  }
}

// Issue 15: stages that do not fit together, or one that fails, are an error on every rank
// concerned, not a rank waiting for a tensor that will not come.
BOOST_AUTO_TEST_CASE(a_pipeline_that_cannot_run_is_an_error_on_every_rank) {
  cohort::flat world = cohort::make_communicator<cohort::flat>();
  std::optional<cohort::flat> pair = first_two(world);
  if (!pair) {
    return;
  }
  cohort::flat& comm = *pair;
  namespace ct = cohort::torch;
  const int r = comm.rank();
  {
    // Rank 0 sends to rank 1, whose stage reads the forward's argument instead.
    ct::multi_node_sequential model(comm);
    model->add(torch::nn::Linear(2, 2), ct::from_input, r == 0 ? 1 : ct::to_output);
    BOOST_CHECK_EXCEPTION(model(torch::ones({1, 2})), cohort::invalid_argument,
                          message_has({"rank 0's stages send 1 tensor(s) to rank 1, whose stages "
                                       "receive 0 from rank 0"}));
  }
  {
    // A stage added after the first forward (which agreed on the wiring) is refused.
    ct::multi_node_sequential model(comm);
    model->add(torch::nn::Linear(2, 2), ct::from_input, ct::to_output);
    (void)model(torch::ones({1, 2}));
    BOOST_CHECK_EXCEPTION(model->add(torch::nn::Linear(2, 2)), cohort::invalid_argument,
                          message_has({"added after the first forward"}));
  }
  {
    // Rank 0's stage throws: rank 0 rethrows it, rank 1 is told.
    ct::multi_node_sequential model(comm);
    if (r == 0) {
      model->add(std::make_shared<torch::nn::FunctionalImpl>([](const at::Tensor&) -> at::Tensor {
                   throw std::runtime_error("a stage that fails");
                 }),
                 ct::from_input, 1);
      BOOST_CHECK_EXCEPTION(model(torch::ones({1, 2})), std::runtime_error,
                            message_has({"a stage that fails"}));
    } else {
      model->add(torch::nn::Linear(2, 2), 0, ct::to_output);
      BOOST_CHECK_EXCEPTION(
          model(), cohort::error,
          message_has({"multi_node_sequential on rank 1: rank 0 sent no tensor"}));
    }
    // The pair goes on: nothing was left queued.
    BOOST_TEST(comm.allreduce_obj(1) == 2);
  }
}

// A batch with a tensor outside CPU memory on the root is refused on every rank.
BOOST_AUTO_TEST_CASE(a_batch_outside_cpu_memory_is_refused_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  auto batches = cohort::make_multi_node_iterator(
      comm,
      []() -> std::optional<std::vector<at::Tensor>> {
        return std::vector<at::Tensor>{torch::ones({2}),
                                       torch::empty({2}, torch::Device(torch::kMeta))};
      },
      0, cohort::torch::tensor_batches{});
  BOOST_CHECK_EXCEPTION(batches.next(), cohort::invalid_argument,
                        message_has({"tensor_batches", "tensor 1 of the root's (rank 0) batch is a "
                                                       "tensor outside CPU memory"}));
}
