// SPDX-License-Identifier: Apache-2.0
// CUDA LibTorch through cohort::torch::distributed_optimizer over the GPU strategies: N ranks ×
// batch b against one process × batch N·b on the same GPU, replicas bit-identical, with the
// trainer's work on LibTorch's default stream and on a stream of its own (cohort follows the
// current one). Built where LibTorch has CUDA and nvcc compiles its headers (LibTorch 2.x: see
// tools/torch-wheel.sh); run where every rank has a GPU.
#define BOOST_TEST_MODULE gpu.torch
// (BOOST_CHECK, not BOOST_TEST: Boost.Test turns its variadic macros off for nvcc.)
#include <cohort/adapters/torch.hpp>
#include <cohort/adapters/torch/cuda.hpp>
#include <cohort/nccl.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <optional>
#include <torch/torch.h>
#include <vector>

#include "support/expect.hpp"

using cohort::test::message_has;

namespace {

torch::nn::Sequential model_seeded(int seed, const torch::Device& device) {
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  torch::nn::Sequential m(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  m->to(device);
  return m;
}

torch::Device this_gpu() {
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(cohort::cuda::current_device())};
}

double max_relative_difference(const torch::nn::Sequential& a, const torch::nn::Sequential& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a->parameters().size(); ++i) {
    const at::Tensor pa = a->parameters()[i].detach().cpu();
    const at::Tensor pb = b->parameters()[i].detach().cpu();
    const double scale = std::max(pb.abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (pa - pb).abs().max().item<double>() / scale);
  }
  return worst;
}

// Whether every rank holds exactly rank 0's parameters (compared on the host, over MPI).
bool replicas_identical(const torch::nn::Sequential& m) {
  cohort::flat host = cohort::make_communicator<cohort::flat>();
  int same = 1;
  for (const at::Tensor& p : m->parameters()) {
    at::Tensor mine = p.detach().cpu().contiguous();
    at::Tensor root = mine.clone();
    host.broadcast(root, 0);
    same = std::min(same, torch::equal(root, mine) ? 1 : 0);
  }
  return host.allreduce_obj(same, [](int x, int y) { return std::min(x, y); }) == 1;
}

// 20 steps of SGD with momentum over `comm`, on a stream from LibTorch's pool made current if
// `own_stream` (else on its default stream), against one process on the whole batch.
template <class Communicator>
void serial_equivalence(Communicator& comm, bool own_stream) {
  const torch::Device gpu = this_gpu();
  std::optional<c10::cuda::CUDAStreamGuard> on_stream;
  if (own_stream) {
    on_stream.emplace(c10::cuda::getStreamFromPool(false, gpu.index()));
  }
  const auto sgd = [](std::vector<at::Tensor> p) {
    return torch::optim::SGD(std::move(p), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  torch::nn::Sequential replica = model_seeded(100 + comm.rank(), gpu);
  cohort::torch::distributed_optimizer opt{sgd(replica->parameters()), comm, *replica};
  torch::nn::Sequential serial = model_seeded(999, gpu);
  {
    const torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < serial->parameters().size(); ++i) {
      serial->parameters()[i].copy_(replica->parameters()[i]);
    }
  }
  auto serial_opt = sgd(serial->parameters());

  const int n = comm.size();
  constexpr int per_rank = 16;
  at::Generator generator = at::detail::createCPUGenerator(5000);
  for (int step = 0; step < 20; ++step) {
    const torch::Tensor x = torch::randn({per_rank * n, 8}, generator).to(gpu);
    const torch::Tensor y = torch::randn({per_rank * n, 4}, generator).to(gpu);
    const torch::Tensor mine = x.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));
    const torch::Tensor target = y.slice(0, per_rank * comm.rank(), per_rank * (comm.rank() + 1));
    opt.zero_grad();
    torch::mse_loss(replica->forward(mine), target).backward();
    opt.step();
    serial_opt.zero_grad();
    torch::mse_loss(serial->forward(x), y).backward();
    serial_opt.step();
  }
  const double difference = max_relative_difference(replica, serial);
  BOOST_TEST_MESSAGE((own_stream ? "own stream" : "default stream")
                     << ": relative difference " << difference);
  BOOST_CHECK_LE(difference, 1e-5);
  BOOST_CHECK(replicas_identical(replica));
}

template <class Communicator>
void serial_equivalence_with() {
  Communicator comm{boost::mpi::communicator()};
  serial_equivalence(comm, false);
  serial_equivalence(comm, true);
}

bool one_node() {
  return cohort::make_communicator<cohort::naive>().inter_size() == 1;
}

} // namespace

BOOST_AUTO_TEST_CASE(nccl_strategies_match_one_process) {
  serial_equivalence_with<cohort::pure_nccl>();
  if (one_node()) {
    serial_equivalence_with<cohort::single_node>();
  }
  serial_equivalence_with<cohort::hierarchical<cohort::nccl_links, cohort::mpi_links>>();
}

BOOST_TEST_DECORATOR(*boost::unit_test::label("mpi_on_device"))
BOOST_AUTO_TEST_CASE(mpi_strategies_on_device_memory_match_one_process) {
  serial_equivalence_with<cohort::host_staged>();
  if (cohort::mpi_is_cuda_aware()) {
    serial_equivalence_with<cohort::cuda_aware_flat>();
  }
}

BOOST_AUTO_TEST_CASE(a_strategy_chosen_at_run_time_follows_the_stream_too) {
  cohort::any_gpu_communicator comm("pure_nccl");
  serial_equivalence(comm, true);
}

BOOST_AUTO_TEST_CASE(lbfgs_sees_the_loss_averaged_on_the_device) {
  cohort::pure_nccl comm{boost::mpi::communicator()};
  torch::nn::Sequential m = model_seeded(7 + comm.rank(), this_gpu());
  cohort::torch::distributed_optimizer opt{
      torch::optim::LBFGS(m->parameters(), torch::optim::LBFGSOptions(0.1).max_iter(3)), comm, *m};
  const torch::Tensor x = torch::full({4, 8}, static_cast<float>(comm.rank()), this_gpu());
  const at::Tensor loss = opt.step([&] {
    opt.zero_grad();
    torch::Tensor l = m->forward(x).square().mean();
    l.backward();
    return l;
  });
  BOOST_CHECK(loss.device() == this_gpu());
  BOOST_CHECK(replicas_identical(m));
}

BOOST_AUTO_TEST_CASE(a_module_left_on_the_cpu_is_refused_by_name) {
  cohort::pure_nccl comm{boost::mpi::communicator()};
  torch::nn::Sequential m = model_seeded(1, torch::kCPU);
  BOOST_CHECK_EXCEPTION(
      (cohort::torch::distributed_optimizer{torch::optim::SGD(m->parameters(), 0.1), comm, *m}),
      cohort::invalid_argument, message_has({"0.weight", "cpu", "current CUDA device"}));
}

#include "gpu_mpi_main.hpp"
