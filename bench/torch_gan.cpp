// SPDX-License-Identifier: Apache-2.0
// One row of bench/torch_gan.sh (issue 31): the iteration time of a GAN's loop as DCGAN writes it
// (the discriminator's two backward passes, real then fake; the generator's backward through the
// discriminator) on MLPs (generator 64-1024-1024-784, discriminator 784-1024-1024-1, Adam, fp32,
// batch 64 per rank, one intra-op thread per rank), 5 warm-up iterations then 5 repetitions of
// 10 timed ones; prints the median repetition's time per iteration.
//
//   mpirun -np 2 torch_gan --mode unguarded # cohort, the loop as written: no no_sync()
//   mpirun -np 2 torch_gan --mode guarded   # cohort, the discriminator's first backward and its
//                                           # hooks in the generator's backward in no_sync()
//
// unguarded - guarded is what the reductions the guards save cost (the discriminator's first
// backward's, and the one its hooks start in the generator's backward); bench/torch_gan_ddp.py
// measures the same two loops under PyTorch DDP. Prints "torch_gan MODE RANKS MS_PER_ITERATION".

#include <cohort/adapters/torch.hpp>

#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "timing.hpp"

namespace {

struct settings {
  std::string mode = "unguarded";
  int iterations = 10;
  int reps = 5;
  int warmup = 5;
  int batch = 64;
};

torch::nn::Sequential generator() {
  return torch::nn::Sequential(torch::nn::Linear(64, 1024), torch::nn::ReLU(),
                               torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                               torch::nn::Linear(1024, 784), torch::nn::Tanh());
}

torch::nn::Sequential discriminator() {
  return torch::nn::Sequential(torch::nn::Linear(784, 1024), torch::nn::LeakyReLU(),
                               torch::nn::Linear(1024, 1024), torch::nn::LeakyReLU(),
                               torch::nn::Linear(1024, 1), torch::nn::Sigmoid());
}

using adam = cohort::torch::distributed_optimizer<torch::optim::Adam, cohort::flat>;

double run(const settings& s, cohort::flat& comm) {
  const bool guarded = s.mode == "guarded";
  torch::manual_seed(1);
  torch::nn::Sequential g = generator();
  torch::nn::Sequential d = discriminator();
  adam g_opt(torch::optim::Adam(g->parameters(), 2e-4), comm, *g);
  adam d_opt(torch::optim::Adam(d->parameters(), 2e-4), comm, *d);
  cohort::torch::seed_per_rank(comm, 1);
  const torch::Tensor real = torch::rand({s.batch, 784}) * 2 - 1;
  const torch::Tensor ones = torch::ones({s.batch, 1});
  const torch::Tensor zeros = torch::zeros({s.batch, 1});
  const auto iteration = [&] {
    d->zero_grad();
    const torch::Tensor d_real = torch::binary_cross_entropy(d->forward(real), ones);
    if (guarded) {
      const auto quiet = d_opt.no_sync();
      d_real.backward();
    } else {
      d_real.backward();
    }
    const torch::Tensor fake = g->forward(torch::randn({s.batch, 64}));
    torch::binary_cross_entropy(d->forward(fake.detach()), zeros).backward();
    d_opt.step();
    g->zero_grad();
    const torch::Tensor g_loss = torch::binary_cross_entropy(d->forward(fake), ones);
    if (guarded) {
      const auto quiet = d_opt.no_sync();
      g_loss.backward();
    } else {
      g_loss.backward();
    }
    g_opt.step();
  };
  for (int i = 0; i < s.warmup; ++i) {
    iteration();
  }
  std::vector<double> per_iteration;
  for (int r = 0; r < s.reps; ++r) {
    comm.mpi_comm().barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.iterations; ++i) {
      iteration();
    }
    comm.mpi_comm().barrier();
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    per_iteration.push_back(elapsed.count() / s.iterations);
  }
  return bench::median(per_iteration);
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--mode") {
      s.mode = value;
    } else if (flag == "--iterations") {
      s.iterations = std::stoi(value);
    } else if (flag == "--reps") {
      s.reps = std::stoi(value);
    } else if (flag == "--warmup") {
      s.warmup = std::stoi(value);
    } else if (flag == "--batch") {
      s.batch = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown option " + std::string(flag));
    }
  }
  if (s.mode != "guarded" && s.mode != "unguarded") {
    throw std::invalid_argument("--mode is guarded or unguarded, not " + s.mode);
  }
  return s;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv, boost::mpi::threading::multiple};
  try {
    const settings s = parse(argc, argv);
    torch::set_num_threads(1);
    auto comm = cohort::make_communicator<cohort::flat>();
    const double ms = run(s, comm);
    if (comm.rank() == 0) {
      std::printf("torch_gan %s %d %.3f\n", s.mode.c_str(), comm.size(), ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_gan: %s\n", e.what());
    return 1;
  }
}
