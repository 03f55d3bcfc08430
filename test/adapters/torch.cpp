// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE adapters.torch
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>
#if __has_include(<xxhash.h>)
#include <cohort/adapters/torch/checkpoint.hpp>
#include <cohort/checkpoint.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <type_traits>
#include <unistd.h>
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

// LibTorch initializes modules from its one global generator: two threads building models at
// once would draw each other's numbers.
std::mutex global_generator;

// Every rank builds the model from its own seed: only the broadcast makes them equal.
net model_seeded(int seed) {
  const std::lock_guard lock(global_generator);
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

// Whether every rank holds exactly rank 0's `t`.
template <class Communicator>
bool replicas_identical_tensor(Communicator& comm, const at::Tensor& t) {
  at::Tensor root = t.detach().clone();
  comm.broadcast(root, 0);
  const bool same = torch::equal(root, t.detach());
  return comm.allreduce_obj(same ? 1 : 0, [](int x, int y) { return std::min(x, y); }) == 1;
}

// Whether every rank holds exactly rank 0's parameters.
template <class Communicator>
bool replicas_identical(Communicator& comm, const net& m) {
  bool same = true;
  for (const at::Tensor& p : m->parameters()) {
    same = replicas_identical_tensor(comm, p) && same; // every rank takes part in every check
  }
  return same;
}

struct run_options {
  bool overlap = false;
  bool set_to_none = true;
  bool closure = false; // step(closure), as LBFGS needs
  int steps = 20;
  torch::Dtype dtype = torch::kFloat32;
};

struct run_result {
  double difference = 1;   // the largest relative difference from one process
  bool identical = false;  // every replica holds rank 0's parameters, bit for bit
  bool hooks_began = true; // with overlap, backward's hooks began every step's reduction
  bool in_window = true;   // shared_memory: every gradient lay in the window at every step
};

// N ranks × batch b against one process × batch N·b, `steps` steps of `make_optimizer`'s
// optimizer through cohort::torch::distributed_optimizer. Checks nothing itself (it may run on
// another thread than Boost.Test's): the caller checks the result.
template <class Communicator, class MakeOptimizer>
run_result serial_equivalence(Communicator& comm, MakeOptimizer make_optimizer,
                              run_options run = {}) {
  const int n = comm.size();
  constexpr int per_rank = 4;
  net replica = model_seeded(100 + comm.rank());
  replica->to(run.dtype);
  cohort::torch::distributed_optimizer opt{
      make_optimizer(replica->parameters()), comm, *replica, {.overlap = run.overlap}};

  net serial = model_seeded(999);
  serial->to(run.dtype);
  {
    const torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < serial->parameters().size(); ++i) {
      serial->parameters()[i].copy_(replica->parameters()[i]);
    }
  }
  auto serial_opt = make_optimizer(serial->parameters());

  run_result result;
  // The same global batch on every rank, from a generator of this run's own.
  at::Generator generator = at::detail::createCPUGenerator(5000);
  for (int step = 0; step < run.steps; ++step) {
    const auto options = torch::TensorOptions().dtype(run.dtype);
    const torch::Tensor x = torch::randn({per_rank * n, 8}, generator, options);
    const torch::Tensor y = torch::randn({per_rank * n, 4}, generator, options);
    const torch::Tensor mine = x.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));
    const torch::Tensor target = y.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));

    if (run.closure) {
      opt.step([&] {
        opt.zero_grad(run.set_to_none);
        torch::Tensor loss = torch::mse_loss(replica->forward(mine), target);
        loss.backward();
        return loss;
      });
      serial_opt.step([&] {
        serial_opt.zero_grad();
        torch::Tensor loss = torch::mse_loss(serial->forward(x), y);
        loss.backward();
        return loss;
      });
    } else {
      opt.zero_grad(run.set_to_none);
      torch::mse_loss(replica->forward(mine), target).backward();
      result.hooks_began = result.hooks_began && comm.grad_sync_pending() == run.overlap;
      if constexpr (requires { comm.window_exchanges(); }) {
        for (const at::Tensor& p : replica->parameters()) {
          result.in_window =
              result.in_window &&
              comm.arena()->window().offset_of(p.grad().data_ptr(), p.grad().nbytes()).has_value();
        }
      }
      opt.step();
      serial_opt.zero_grad();
      torch::mse_loss(serial->forward(x), y).backward();
      if constexpr (requires { serial_opt.step(); }) {
        serial_opt.step();
      }
    }
  }
  result.identical = replicas_identical(comm, replica);
  result.difference = max_relative_difference(replica, serial);
  return result;
}

// Checks a run: close to one process, replicas identical, hooks at work where asked.
void check(const run_result& r) {
  BOOST_TEST_MESSAGE("relative difference from one process: " << r.difference);
  BOOST_TEST(r.difference <= 1e-5);
  BOOST_TEST(r.identical);
  BOOST_TEST(r.hooks_began);
  BOOST_TEST(r.in_window);
}

torch::optim::SGD sgd_momentum(std::vector<at::Tensor> p) {
  return torch::optim::SGD(std::move(p), torch::optim::SGDOptions(0.05).momentum(0.9));
}
torch::optim::Adam adam(std::vector<at::Tensor> p) {
  return torch::optim::Adam(std::move(p), torch::optim::AdamOptions(1e-2));
}
torch::optim::AdamW adamw(std::vector<at::Tensor> p) {
  return torch::optim::AdamW(std::move(p), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

// The optimizer state of parameter `p` (keyed by a string in LibTorch 1.13, by the TensorImpl's
// address from 2.2).
template <class State, class Optimizer>
State& state_of(Optimizer& optimizer, const at::Tensor& p) {
  auto& states = optimizer.state();
  using key = typename std::remove_cvref_t<decltype(states)>::key_type;
  if constexpr (std::is_same_v<key, std::string>) {
    std::ostringstream address; // what c10::guts::to_string wrote
    address << p.unsafeGetTensorImpl();
    return static_cast<State&>(*states.at(address.str()));
  } else {
    return static_cast<State&>(*states.at(p.unsafeGetTensorImpl()));
  }
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
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(sparse, "the table"), cohort::invalid_argument,
                        message_has({"the table", "not contiguous"}));
}

BOOST_AUTO_TEST_CASE(intra_op_threads_share_the_cores_among_the_ranks_and_cohorts_thread) {
  using cohort::torch::intra_op_threads;
  BOOST_TEST(intra_op_threads(1, false, 8) == 8);
  BOOST_TEST(intra_op_threads(1, true, 8) == 7);
  BOOST_TEST(intra_op_threads(4, false, 8) == 2);
  BOOST_TEST(intra_op_threads(4, true, 8) == 1);
  BOOST_TEST(intra_op_threads(2, true, 2) == 1);  // no core to spare: one each, time-sliced
  BOOST_TEST(intra_op_threads(3, false, 2) == 1); // oversubscribed: never zero
  BOOST_TEST(cohort::torch::available_cores() >= 1);
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
  check(serial_equivalence(comm, sgd_momentum));
  check(serial_equivalence(comm, sgd_momentum, {.overlap = true}));
  check(serial_equivalence(comm, sgd_momentum, {.set_to_none = false}));
  check(serial_equivalence(comm, sgd_momentum, {.overlap = true, .set_to_none = false}));
}

BOOST_AUTO_TEST_CASE(adam_and_adamw_on_n_ranks_match_one_process) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  check(serial_equivalence(comm, adam));
  check(serial_equivalence(comm, adam, {.overlap = true}));
  check(serial_equivalence(comm, adam, {.set_to_none = false}));
  check(serial_equivalence(comm, adamw, {.overlap = true}));
}

BOOST_AUTO_TEST_CASE(gradients_live_and_are_reduced_in_the_shared_window) {
  // Every gradient in place (the model's are small), so every one in the window: blocking and
  // overlapped, whether zero_grad asks for none or zeros (kept in the window either way).
  cohort::shared_memory<> comm(boost::mpi::communicator(), {.fusion_threshold_bytes = 0});
  check(serial_equivalence(comm, sgd_momentum));
  check(serial_equivalence(comm, sgd_momentum, {.overlap = true}));
  check(serial_equivalence(comm, adam, {.overlap = true, .set_to_none = false}));
  BOOST_TEST(comm.window_exchanges() > 0u);
  BOOST_TEST(comm.arena()->spilled_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(lbfgs_reduces_every_evaluation_of_its_closure) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const auto lbfgs = [](std::vector<at::Tensor> p) {
    return torch::optim::LBFGS(std::move(p), torch::optim::LBFGSOptions(0.1).max_iter(4));
  };
  // In float64: LBFGS's line search magnifies float32's rounding of the sums (3e-6 on 2 ranks,
  // 6e-6 on 3), which says nothing of the reduction.
  check(serial_equivalence(comm, lbfgs, {.closure = true, .steps = 5, .dtype = torch::kFloat64}));
  check(serial_equivalence(
      comm, lbfgs, {.overlap = true, .closure = true, .steps = 5, .dtype = torch::kFloat64}));
  // A plain step() has no closure to evaluate: refused by name.
  net m = model_seeded(4);
  cohort::torch::distributed_optimizer opt{lbfgs(m->parameters()), comm, *m, {.overlap = false}};
  torch::mse_loss(m->forward(torch::ones({1, 8})), torch::zeros({1, 4})).backward();
  BOOST_CHECK_EXCEPTION(opt.step(), cohort::invalid_argument, message_has({"step(closure)"}));
}

BOOST_AUTO_TEST_CASE(a_sparse_or_strided_gradient_is_an_error_naming_it_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  auto params = cohort::torch::parameters(*embedding);
  comm.broadcast_parameters(params);
  embedding->forward(torch::tensor({1, 2, 2}, torch::kLong)).sum().backward();
  BOOST_TEST(embedding->weight.grad().is_sparse());
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::mean{}), cohort::invalid_argument,
                        message_has({"'weight'", "dense block"}));
  // Through the optimizer with overlap, the hooks see it come sparse.
  {
    cohort::torch::distributed_optimizer opt{
        torch::optim::SGD(embedding->parameters(), 0.1), comm, *embedding, {.overlap = true}};
    opt.zero_grad();
    embedding->forward(torch::tensor({1, 2, 2}, torch::kLong)).sum().backward();
    BOOST_CHECK_EXCEPTION(opt.step(), cohort::error, message_has({"weight", "sparse gradient"}));
    opt.skip_step();
  }

  // A gradient that is a view with gaps (on the last rank only: every rank still throws).
  at::Tensor w = torch::zeros({3, 2}, torch::TensorOptions().requires_grad(true));
  std::vector<cohort::torch::parameter> set{{"w", w}};
  w.mutable_grad() =
      comm.rank() == comm.size() - 1 ? torch::ones({3, 4}).slice(1, 0, 2) : torch::ones({3, 2});
  // One rank alone: the ranks disagree, and every rank says which one and how.
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(set, cohort::mean{}), cohort::error,
      message_has({"'w'", "dense block", "rank " + std::to_string(comm.size() - 1)}));
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

namespace {
// A model with a branch that a rank may skip: its parameters then get no gradient.
struct branchy_impl : torch::nn::Module {
  torch::nn::Linear trunk{nullptr}, branch{nullptr};
  branchy_impl() {
    trunk = register_module("trunk", torch::nn::Linear(3, 2));
    branch = register_module("branch", torch::nn::Linear(3, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_branch) {
    return use_branch ? trunk(x) + branch(x) : trunk(x);
  }
};
TORCH_MODULE_IMPL(branchy, branchy_impl);

torch::optim::SGD plain_sgd(const branchy& m) {
  return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.1));
}
} // namespace

BOOST_AUTO_TEST_CASE(unused_parameters_are_an_error_naming_them_on_every_rank_by_default) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  for (const bool overlap : {false, true}) {
    branchy m;
    cohort::torch::distributed_optimizer opt{plain_sgd(m), comm, *m, {.overlap = overlap}};
    // The last rank skips the branch: every rank's step says so, naming it and the rank.
    const bool use_branch = comm.rank() != comm.size() - 1;
    opt.zero_grad();
    m->forward(torch::ones({1, 3}), use_branch).sum().backward();
    BOOST_CHECK_EXCEPTION(
        opt.step(), cohort::error,
        message_has({"branch.weight", "rank " + std::to_string(comm.size() - 1)}));
    opt.skip_step();
  }
}

BOOST_AUTO_TEST_CASE(find_unused_parameters_reduces_zeros_for_them) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  for (const bool overlap : {false, true}) {
    branchy m;
    cohort::torch::distributed_optimizer opt{
        plain_sgd(m), comm, *m, {.overlap = overlap, .find_unused_parameters = true}};
    const at::Tensor before = m->branch->bias.detach().clone();
    // Rank 0 skips the branch; the others' gradient of branch.bias is 1 per output.
    opt.zero_grad();
    m->forward(torch::ones({1, 3}), comm.rank() != 0).sum().backward();
    if (overlap) {
      // The end of backward marked rank 0's unused parameters ready: the reduction completes
      // before step() (which would otherwise mark them itself).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!comm.grad_sync_complete() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      BOOST_TEST(comm.grad_sync_complete());
    }
    opt.step();
    const double expected_grad = static_cast<double>(n - 1) / n;
    BOOST_TEST((before - m->branch->bias.detach()).max().item<double>() == 0.1 * expected_grad,
               boost::test_tools::tolerance(1e-6));
    BOOST_TEST(replicas_identical_tensor(comm, m->branch->weight));
    // Unused everywhere: zeros everywhere, no error.
    opt.zero_grad();
    m->forward(torch::ones({1, 3}), false).sum().backward();
    opt.step();
  }
}

BOOST_AUTO_TEST_CASE(the_optimizer_state_and_options_start_as_the_roots) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  net m = model_seeded(7 + comm.rank());
  // Each rank has taken a step of its own: other Adam moments, and another learning rate.
  torch::optim::Adam local(m->parameters(), torch::optim::AdamOptions(0.001 * (comm.rank() + 1)));
  torch::mse_loss(m->forward(torch::full({2, 8}, comm.rank() + 1.0)), torch::zeros({2, 4}))
      .backward();
  local.step();
  if (comm.rank() == 0) {
    local.state().clear(); // the root starts afresh: the others' moments must go too
  }
  cohort::torch::distributed_optimizer opt{std::move(local), comm, *m, {.overlap = false}};
  BOOST_TEST(opt.inner().state().empty()); // the root had none: nobody has any
  const auto& options =
      static_cast<const torch::optim::AdamOptions&>(opt.inner().param_groups()[0].options());
  BOOST_TEST(options.lr() == 0.001);

  // With state everywhere, other on each rank: every rank gets the root's, matched by name.
  opt.zero_grad();
  torch::mse_loss(m->forward(torch::ones({2, 8})), torch::zeros({2, 4})).backward();
  opt.step();
  using adam_state = torch::optim::AdamParamState;
  const auto state = [&](const at::Tensor& p) -> adam_state& {
    return state_of<adam_state>(opt.inner(), p);
  };
  for (const at::Tensor& p : m->parameters()) {
    state(p).exp_avg().add_(comm.rank());
    state(p).exp_avg_sq().mul_(comm.rank() + 1);
  }
  cohort::torch::broadcast_optimizer_state(comm, opt.inner(), opt.named_parameters());
  for (const at::Tensor& p : m->parameters()) {
    BOOST_TEST(replicas_identical_tensor(comm, state(p).exp_avg()));
    BOOST_TEST(replicas_identical_tensor(comm, state(p).exp_avg_sq()));
  }
}

BOOST_AUTO_TEST_CASE(an_optimizer_over_other_parameters_is_refused_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  net m = model_seeded(1);
  // Rank 0 alone adds a tensor that is not the module's: every rank is told.
  at::Tensor stray = torch::zeros({3}, torch::TensorOptions().requires_grad(true));
  std::vector<at::Tensor> params = m->parameters();
  if (comm.rank() == 0) {
    params.push_back(stray);
  }
  BOOST_CHECK_EXCEPTION((cohort::torch::distributed_optimizer{
                            torch::optim::SGD(params, 0.1), comm, *m, {.overlap = false}}),
                        cohort::error,
                        message_has(comm.size() == 1
                                        ? std::vector<std::string>{"not a parameter of the module"}
                                        : std::vector<std::string>{"broadcast_optimizer_state",
                                                                   "disagree", "rank 0"}));
  // The last rank lists the parameters in another order: the state could not be matched.
  std::vector<at::Tensor> order = m->parameters();
  if (comm.size() > 1 && comm.rank() == comm.size() - 1) {
    std::reverse(order.begin(), order.end());
  }
  if (comm.size() > 1) {
    BOOST_CHECK_EXCEPTION((cohort::torch::distributed_optimizer{
                              torch::optim::SGD(order, 0.1), comm, *m, {.overlap = false}}),
                          cohort::mismatch_error, message_has({"fc1.weight", "optimizer"}));
  }
}

BOOST_AUTO_TEST_CASE(frozen_parameters_and_buffers_start_as_the_roots) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::manual_seed(static_cast<std::uint64_t>(comm.rank()));
  torch::nn::Sequential m(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
  m->train();
  m->forward(torch::randn({8, 4}) * (comm.rank() + 1)); // running stats differ by rank
  auto* frozen = m->named_parameters()["0.bias"].unsafeGetTensorImpl();
  for (auto& p : m->parameters()) {
    if (p.unsafeGetTensorImpl() == frozen) {
      p.set_requires_grad(false);
    }
  }
  cohort::torch::distributed_optimizer opt{
      torch::optim::SGD(m->parameters(), 0.1), comm, *m, {.overlap = false}};
  for (const auto& item : m->named_parameters()) {
    BOOST_TEST(replicas_identical_tensor(comm, item.value()), item.key());
  }
  for (const auto& item : m->named_buffers()) {
    BOOST_TEST(replicas_identical_tensor(comm, item.value()), item.key());
  }
}

BOOST_AUTO_TEST_CASE(two_trainers_on_two_threads_with_hooks_on_each) {
  // Each trainer has its own communicator; their hooks and reductions run at once.
  cohort::flat first = cohort::make_communicator<cohort::flat>();
  cohort::flat second = cohort::make_communicator<cohort::flat>();
  run_result results[2];
  std::exception_ptr failure[2];
  std::thread other([&] {
    try {
      results[1] = serial_equivalence(second, adam, {.overlap = true, .steps = 10});
    } catch (...) {
      failure[1] = std::current_exception();
    }
  });
  try {
    results[0] = serial_equivalence(first, sgd_momentum, {.overlap = true, .steps = 10});
  } catch (...) {
    failure[0] = std::current_exception();
  }
  other.join();
  for (const std::exception_ptr& e : failure) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
  check(results[0]);
  check(results[1]);
}

BOOST_AUTO_TEST_CASE(the_hooks_go_with_the_optimizer) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  net m = model_seeded(2);
  {
    cohort::torch::distributed_optimizer opt{
        sgd_momentum(m->parameters()), comm, *m, {.overlap = true}};
  }
  // No hook is left to call into the destroyed optimizer.
  for (const at::Tensor& p : m->parameters()) {
    BOOST_TEST(torch::autograd::impl::grad_accumulator(p)->post_hooks().empty());
  }
  torch::mse_loss(m->forward(torch::ones({1, 8})), torch::zeros({1, 4})).backward();
  BOOST_TEST(m->fc1->weight.grad().defined());
}

#if __has_include(<xxhash.h>)
// A checkpoint of the module and of the optimizer's state, resumed into another module and
// optimizer (other weights, other Adam moments, tensors at other addresses), steps on exactly as
// the run that was not interrupted: bit for bit.
BOOST_AUTO_TEST_CASE(a_checkpoint_resumes_module_and_optimizer_bit_for_bit) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  std::string dir;
  if (comm.rank() == 0) {
    dir = (std::filesystem::temp_directory_path() /
           ("cohort-torch-ckpt-" + std::to_string(::getpid())))
              .string();
    std::filesystem::remove_all(dir);
  }
  dir = comm.bcast_obj(dir);
  const int n = comm.size();
  const auto train = [&](net& m, auto& opt, int from, int to) {
    for (int step = from; step < to; ++step) {
      at::Generator generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(step));
      const torch::Tensor x = torch::randn({4 * n, 8}, generator);
      const torch::Tensor y = torch::randn({4 * n, 4}, generator);
      opt.zero_grad();
      torch::mse_loss(m->forward(x.slice(0, 4 * comm.rank(), 4 * (comm.rank() + 1))),
                      y.slice(0, 4 * comm.rank(), 4 * (comm.rank() + 1)))
          .backward();
      opt.step();
    }
  };
  cohort::checkpointer ckpt{comm, dir};
  net whole = model_seeded(10);
  cohort::torch::distributed_optimizer whole_opt{adam(whole->parameters()), comm, *whole};
  train(whole, whole_opt, 0, 3);
  ckpt.save(3, cohort::torch::module_state(*whole),
            cohort::torch::optimizer_state(whole_opt.inner(), *whole));
  train(whole, whole_opt, 3, 6);

  net resumed = model_seeded(20);
  cohort::torch::distributed_optimizer resumed_opt{adam(resumed->parameters()), comm, *resumed};
  train(resumed, resumed_opt, 0, 1); // moments of its own, which resume replaces
  const auto step = ckpt.resume(cohort::torch::module_state(*resumed),
                                cohort::torch::optimizer_state(resumed_opt.inner(), *resumed));
  BOOST_TEST(step.value_or(0) == 3u);
  train(resumed, resumed_opt, 3, 6);
  for (std::size_t i = 0; i < whole->parameters().size(); ++i) {
    BOOST_TEST(torch::equal(whole->parameters()[i], resumed->parameters()[i]));
  }
  // A module of another shape is refused by name.
  torch::nn::Linear other(8, 5);
  BOOST_CHECK_EXCEPTION(ckpt.resume(cohort::torch::module_state(*other),
                                    cohort::torch::optimizer_state(resumed_opt.inner(), *other)),
                        cohort::checkpoint_error,
                        message_has({"the module", "was saved with 4 parameters and buffers",
                                     "the one given has 2"}));
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove_all(dir);
  }
}
#endif
