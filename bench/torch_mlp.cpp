// SPDX-License-Identifier: Apache-2.0
// One row of bench/torch_mlp.sh: the step time of a LibTorch MLP 784-1024-1024-10 (ReLU, SGD lr
// 0.01 momentum 0.9, cross-entropy, fp32, batch 128 per rank, synthetic MNIST-shaped data, one
// intra-op thread per rank), 10 warm-up steps then 5 repetitions of 20 timed steps; prints the
// median repetition's time per step. bench/torch_mlp_ddp.py is the same work under PyTorch DDP.
//
//   torch_mlp --mode plain                 # LibTorch alone, one process, no cohort
//   mpirun -np 2 torch_mlp --mode plain    # LibTorch alone in each of 2 processes at once
//   mpirun -np 2 torch_mlp --mode blocking # cohort, reduced at step()
//   mpirun -np 2 torch_mlp --mode overlap  # cohort, reduced while backward runs
//   mpirun -np 2 torch_mlp --mode dummy    # cohort's work without communication
//   mpirun -np 2 torch_mlp --mode dummy-unchecked # the same without the agreement's rendezvous
//
// Prints one line: "torch_mlp MODE RANKS MS_PER_STEP". --steps, --reps, --warmup, --batch change
// the amounts (for a quick run).

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "timing.hpp"

namespace {

struct mlp_impl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  mlp_impl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

struct settings {
  std::string mode = "plain";
  int steps = 20;
  int reps = 5;
  int warmup = 10;
  int batch = 128;
  int powersgd = 0; // PowerSGD's rank (0: the mean), compressed after 2 steps as DDP's hook is
};

// The median over repetitions of the time per step, in milliseconds. `barrier` lines the ranks
// up before each repetition (nothing for one process).
template <class Step, class Barrier>
double time_steps(const settings& s, Step&& step, Barrier&& barrier) {
  for (int i = 0; i < s.warmup; ++i) {
    step();
  }
  std::vector<double> per_step;
  for (int r = 0; r < s.reps; ++r) {
    barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.steps; ++i) {
      step();
    }
    barrier();
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    per_step.push_back(elapsed.count() / s.steps);
  }
  return bench::median(per_step);
}

// The work of one step: the model, its optimizer (plain or wrapped), and this rank's batch.
template <class Optimizer>
double time_training(const settings& s, mlp& model, Optimizer& opt, int rank, auto&& barrier) {
  torch::manual_seed(static_cast<std::uint64_t>(100 + rank));
  const torch::Tensor x = torch::rand({s.batch, 784});
  const torch::Tensor y = torch::randint(10, {s.batch}, torch::kInt64);
  return time_steps(
      s,
      [&] {
        opt.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        opt.step();
      },
      barrier);
}

torch::optim::SGD sgd(mlp& model) {
  return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
}

template <class Communicator, class Reducer = cohort::mean>
double run_cohort(const settings& s, Communicator& comm, bool overlap, Reducer reducer = {}) {
  torch::manual_seed(1);
  mlp model;
  cohort::torch::distributed_optimizer opt{sgd(model), comm, *model, {.overlap = overlap}, reducer};
  return time_training(s, model, opt, comm.rank(), [&] { comm.mpi_comm().barrier(); });
}

// Each process trains alone; under mpirun they start each repetition together, so that what
// two processes on the machine cost each other (cores, caches, memory) is timed without cohort.
double run_plain(const settings& s, const boost::mpi::communicator& world) {
  torch::manual_seed(1);
  mlp model;
  torch::optim::SGD opt = sgd(model);
  return time_training(s, model, opt, world.rank(), [&] { world.barrier(); });
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--mode") {
      s.mode = value;
    } else if (flag == "--steps") {
      s.steps = std::stoi(value);
    } else if (flag == "--reps") {
      s.reps = std::stoi(value);
    } else if (flag == "--warmup") {
      s.warmup = std::stoi(value);
    } else if (flag == "--batch") {
      s.batch = std::stoi(value);
    } else if (flag == "--powersgd") {
      s.powersgd = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown option " + std::string(flag));
    }
  }
  if (s.mode != "plain" && s.mode != "blocking" && s.mode != "overlap" && s.mode != "dummy" &&
      s.mode != "dummy-unchecked") {
    throw std::invalid_argument(
        "--mode is plain, blocking, overlap, dummy or dummy-unchecked, not " + s.mode);
  }
  return s;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv, boost::mpi::threading::multiple};
  try {
    const settings s = parse(argc, argv);
    torch::set_num_threads(1);
    int ranks = 1;
    double ms = 0;
    bool report = true;
    if (s.mode == "plain") {
      const boost::mpi::communicator world;
      ranks = world.size();
      report = world.rank() == 0;
      ms = run_plain(s, world);
    } else if (s.mode == "dummy" || s.mode == "dummy-unchecked") {
      // Unchecked: without the agreement's one small all-reduce per step, the ranks never meet.
      auto comm = cohort::make_communicator<cohort::dummy>({.check_agreement = s.mode == "dummy"});
      ranks = comm.size();
      report = comm.rank() == 0;
      ms = run_cohort(s, comm, false);
    } else {
      auto comm = cohort::make_communicator<cohort::flat>();
      ranks = comm.size();
      report = comm.rank() == 0;
      ms = s.powersgd == 0 ? run_cohort(s, comm, s.mode == "overlap")
                           : run_cohort(s, comm, s.mode == "overlap",
                                        cohort::powersgd({.rank = s.powersgd, .start_step = 2}));
      // What this rank handed its exchanges per step (the warm-up's first two steps included).
      const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
      if (report && stats.steps > 0) {
        std::printf("torch_mlp-wire %s %d %.0f\n", s.mode.c_str(), ranks,
                    static_cast<double>(stats.wire_bytes) / static_cast<double>(stats.steps));
      }
    }
    if (report) {
      std::printf("torch_mlp %s %d %.3f\n", s.mode.c_str(), ranks, ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_mlp: %s\n", e.what());
    return 1;
  }
}
