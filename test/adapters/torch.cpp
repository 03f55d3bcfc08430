// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE adapters.torch
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <algorithm>
#include <string>
#include <torch/torch.h>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

static_assert(cohort::writable_tensor<at::Tensor>);
static_assert(cohort::parameter_set<std::vector<cohort::torch::parameter>>);

namespace {
struct net_impl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  net_impl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};
TORCH_MODULE_IMPL(net, net_impl);

// Every rank builds the model from its own seed: only the broadcast makes them equal.
net model_seeded(int seed) {
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  return net();
}

// The largest difference between `a` and `b`'s parameters, relative to `b`'s largest value.
double max_relative_difference(const net& a, const net& b) {
  double worst = 0;
  const auto pa = a->parameters();
  const auto pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const double scale = std::max(pb[i].abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Whether every rank holds exactly rank 0's parameters.
bool replicas_identical(cohort::flat& comm, const net& m) {
  bool same = true;
  for (const at::Tensor& p : m->parameters()) {
    at::Tensor root = p.detach().clone();
    comm.broadcast(root, 0);
    same = same && torch::equal(root, p.detach());
  }
  const int all = comm.allreduce_obj(same ? 1 : 0, [](int x, int y) { return std::min(x, y); });
  return all == 1;
}

// N ranks × batch b against one process × batch N·b, `steps` steps of `make_optimizer`'s
// optimizer: returns the largest relative difference of the parameters at the end.
template <class MakeOptimizer>
double serial_equivalence(cohort::flat& comm, MakeOptimizer make_optimizer, int steps = 20) {
  const int n = comm.size();
  constexpr int per_rank = 4;
  net replica = model_seeded(100 + comm.rank());
  auto params = cohort::torch::parameters(*replica);
  cohort::distributed_optimizer opt{make_optimizer(replica->parameters()), comm, params};

  net serial = model_seeded(999);
  {
    const torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < serial->parameters().size(); ++i) {
      serial->parameters()[i].copy_(replica->parameters()[i]);
    }
  }
  auto serial_opt = make_optimizer(serial->parameters());

  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(static_cast<std::uint64_t>(5000 + step)); // the same global batch everywhere
    const torch::Tensor x = torch::randn({per_rank * n, 8});
    const torch::Tensor y = torch::randn({per_rank * n, 4});

    opt.inner().zero_grad();
    const torch::Tensor mine = x.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));
    const torch::Tensor target = y.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));
    torch::mse_loss(replica->forward(mine), target).backward();
    opt.step();

    serial_opt.zero_grad();
    torch::mse_loss(serial->forward(x), y).backward();
    serial_opt.step();
  }
  BOOST_TEST(replicas_identical(comm, replica));
  return max_relative_difference(replica, serial);
}
} // namespace

BOOST_AUTO_TEST_CASE(dtype_device_and_size_are_read_at_run_time) {
  torch::set_num_threads(1);
  const std::pair<torch::Dtype, cohort::dtype> pairs[] = {
      {torch::kFloat32, cohort::dtype::float32}, {torch::kFloat64, cohort::dtype::float64},
      {torch::kFloat16, cohort::dtype::float16}, {torch::kBFloat16, cohort::dtype::bfloat16},
      {torch::kInt32, cohort::dtype::int32},     {torch::kInt64, cohort::dtype::int64},
      {torch::kUInt8, cohort::dtype::uint8}};
  for (const auto& [torch_type, type] : pairs) {
    at::Tensor t = torch::zeros({3, 5}, torch::TensorOptions().dtype(torch_type));
    const cohort::tensor_view v = cohort::make_view(t);
    BOOST_TEST((v.type == type));
    BOOST_TEST(v.count == 15u);
    BOOST_TEST(v.data == t.data_ptr());
    BOOST_TEST((v.location == cohort::memory_location::host));
  }
}

BOOST_AUTO_TEST_CASE(unsupported_dtypes_and_layouts_are_refused_by_name) {
  at::Tensor complex = torch::zeros({2}, torch::kComplexFloat);
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(complex), cohort::invalid_argument,
                        message_has({"ComplexFloat", "has no cohort dtype"}));
  at::Tensor flags = torch::zeros({2}, torch::kBool);
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(flags), cohort::invalid_argument,
                        message_has({"Bool"}));

  // Dense in another order: taken. A slice with gaps: refused.
  at::Tensor m = torch::arange(12, torch::kFloat32).reshape({3, 4});
  at::Tensor transposed = m.t();
  BOOST_TEST(cohort::make_view(transposed).count == 12u);
  at::Tensor columns = m.slice(1, 0, 2);
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(columns, "columns"), cohort::invalid_argument,
                        message_has({"columns", "not contiguous"}));
  at::Tensor sparse = m.to_sparse();
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(sparse, "sparse"), cohort::invalid_argument,
                        message_has({"sparse", "not contiguous"}));
}

BOOST_AUTO_TEST_CASE(parameters_are_named_in_order_and_frozen_ones_left_out) {
  net m = model_seeded(1);
  m->fc1->bias.set_requires_grad(false);
  const auto set = cohort::torch::parameters(*m);
  std::vector<std::string> names;
  for (const auto& p : set) {
    names.push_back(p.name);
  }
  const std::vector<std::string> expected{"fc1.weight", "fc2.weight", "fc2.bias"};
  BOOST_TEST(names == expected, boost::test_tools::per_element());
  // The value is the module's own tensor, not a copy.
  BOOST_TEST(set[0].value.data_ptr() == m->fc1->weight.data_ptr());
}

BOOST_AUTO_TEST_CASE(sgd_with_momentum_on_n_ranks_matches_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const double difference = serial_equivalence(comm, [](std::vector<at::Tensor> p) {
    return torch::optim::SGD(std::move(p), torch::optim::SGDOptions(0.05).momentum(0.9));
  });
  BOOST_TEST(difference <= 1e-5);
}

BOOST_AUTO_TEST_CASE(adam_on_n_ranks_matches_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const double difference = serial_equivalence(comm, [](std::vector<at::Tensor> p) {
    return torch::optim::Adam(std::move(p), torch::optim::AdamOptions(1e-2));
  });
  BOOST_TEST(difference <= 1e-5);
}

BOOST_AUTO_TEST_CASE(a_sparse_or_strided_gradient_is_an_error_naming_it_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  auto params = cohort::torch::parameters(*embedding);
  comm.broadcast_parameters(params);
  embedding->forward(torch::tensor({1, 2, 2}, torch::kLong)).sum().backward();
  BOOST_TEST(embedding->weight.grad().is_sparse());
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::mean{}), cohort::invalid_argument,
                        message_has({"weight", "sparse"}));

  // A gradient that is a view with gaps (on the last rank only: every rank still throws).
  at::Tensor w = torch::zeros({3, 2}, torch::TensorOptions().requires_grad(true));
  std::vector<cohort::torch::parameter> set{{"w", w}};
  w.mutable_grad() =
      comm.rank() == comm.size() - 1 ? torch::ones({3, 4}).slice(1, 0, 2) : torch::ones({3, 2});
  // One rank alone: the ranks disagree, and every rank says which one and how.
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(set, cohort::mean{}), cohort::error,
                        message_has({"'w'", "dense block", std::to_string(comm.size() - 1)}));
}

BOOST_AUTO_TEST_CASE(an_undefined_gradient_is_reported_by_name_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  net m = model_seeded(3);
  auto params = cohort::torch::parameters(*m);
  comm.broadcast_parameters(params);
  // fc2 only: fc1's gradients stay undefined.
  m->fc2->forward(torch::ones({2, 16})).sum().backward();
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::mean{}), cohort::invalid_argument,
                        message_has({"fc1.weight", "no gradient"}));
  // Zero-filling an undefined LibTorch gradient is not offered yet: refused, never a wrong shape.
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(params, cohort::mean{}, {.missing = cohort::missing_grad::zero_fill}),
      cohort::invalid_argument, message_has({"fc1.weight", "zero_fill needs"}));
}

BOOST_AUTO_TEST_CASE(broadcast_module_copies_parameters_and_buffers_from_the_root) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::manual_seed(static_cast<std::uint64_t>(comm.rank()));
  torch::nn::BatchNorm1d norm(4);
  norm->train();
  norm->forward(torch::randn({8, 4}) * (comm.rank() + 1)); // running stats differ by rank
  cohort::torch::broadcast_module(comm, *norm);
  at::Tensor mean = norm->running_mean.clone();
  comm.broadcast(mean, 0);
  BOOST_TEST(torch::equal(mean, norm->running_mean));
  BOOST_TEST(norm->num_batches_tracked.item<std::int64_t>() == 1);
  at::Tensor weight = norm->weight.detach().clone();
  comm.broadcast(weight, 0);
  BOOST_TEST(torch::equal(weight, norm->weight.detach()));
}
