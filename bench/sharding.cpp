// SPDX-License-Identifier: Apache-2.0
// One row of bench/sharding.sh: an MLP of `--layers` Linear(width, width) layers (6 x 4096: 100.7 M
// parameters) trained with Adam (fp32, batch `--batch` per rank, ReLU, mean of squares) through
// cohort::torch::distributed_optimizer (unsharded) or sharded_optimizer (stage 1 or 2), overlapped.
// After the timed steps, each rank counts the bytes it holds: the optimizer's state (its tensors),
// the gradients (those defined, between steps) and the parameters, and reads its resident set
// (VmRSS, and its peak VmHWM) from /proc. bench/sharding_zero.py is the same work under PyTorch's
// ZeroRedundancyOptimizer.
//
//   mpirun -np 2 bench_sharding --mode unsharded|stage1|stage2 [--layers 6 --width 4096]
//       [--batch 8 --warmup 1 --steps 3 --reps 3]
//
// Prints one line per run, from rank 0: "sharding MODE RANKS MS_PER_STEP STATE GRADS PARAMS RSS
// HWM", the sizes in MiB as the largest over the ranks (the rank that limits what fits).

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/collectives.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "timing.hpp"

namespace {

struct settings {
  std::string mode = "unsharded";
  int layers = 6;
  int width = 4096;
  int batch = 8;
  int warmup = 1;
  int steps = 3;
  int reps = 3;
};

struct mlp_impl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  explicit mlp_impl(const settings& s) {
    for (int i = 0; i < s.layers; ++i) {
      layers.push_back(
          register_module("fc" + std::to_string(i), torch::nn::Linear(s.width, s.width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) {
        x = torch::relu(x);
      }
    }
    return x;
  }
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

// A line of /proc/self/status ("VmRSS:  123 kB"), in bytes.
double proc_status(std::string_view key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) {
      return std::stod(line.substr(key.size() + 1)) * 1024.0;
    }
  }
  return 0;
}

double state_bytes(const torch::optim::Optimizer& optimizer) {
  double bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adam = static_cast<const torch::optim::AdamParamState&>(*state);
    bytes += static_cast<double>(adam.exp_avg().nbytes() + adam.exp_avg_sq().nbytes());
  }
  return bytes;
}

template <class Optimizer>
void run(const settings& s, cohort::flat& comm, mlp& model, Optimizer& opt) {
  torch::manual_seed(static_cast<std::uint64_t>(100 + comm.rank()));
  const torch::Tensor x = torch::randn({s.batch, s.width});
  const auto step = [&] {
    opt.zero_grad();
    model->forward(x).pow(2).mean().backward();
    opt.step();
  };
  for (int i = 0; i < s.warmup; ++i) {
    step();
  }
  std::vector<double> per_step;
  for (int r = 0; r < s.reps; ++r) {
    comm.mpi_comm().barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.steps; ++i) {
      step();
    }
    comm.mpi_comm().barrier();
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    per_step.push_back(elapsed.count() / s.steps);
  }
  double grads = 0;
  double params = 0;
  for (const auto& p : model->parameters()) {
    params += static_cast<double>(p.nbytes());
    if (p.grad().defined()) {
      grads += static_cast<double>(p.grad().nbytes());
    }
  }
  const std::vector<double> mine = {state_bytes(opt), grads, params, proc_status("VmRSS:"),
                                    proc_status("VmHWM:")};
  std::vector<double> largest(mine.size());
  boost::mpi::all_reduce(comm.mpi_comm(), mine.data(), static_cast<int>(mine.size()),
                         largest.data(), boost::mpi::maximum<double>());
  if (comm.rank() == 0) {
    std::printf("sharding %s %d %.1f %.1f %.1f %.1f %.1f %.1f\n", s.mode.c_str(), comm.size(),
                bench::median(per_step), mib(largest[0]), mib(largest[1]), mib(largest[2]),
                mib(largest[3]), mib(largest[4]));
  }
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--mode") {
      s.mode = value;
    } else if (flag == "--layers") {
      s.layers = std::stoi(value);
    } else if (flag == "--width") {
      s.width = std::stoi(value);
    } else if (flag == "--batch") {
      s.batch = std::stoi(value);
    } else if (flag == "--warmup") {
      s.warmup = std::stoi(value);
    } else if (flag == "--steps") {
      s.steps = std::stoi(value);
    } else if (flag == "--reps") {
      s.reps = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown option " + std::string(flag));
    }
  }
  if (s.mode != "unsharded" && s.mode != "stage1" && s.mode != "stage2") {
    throw std::invalid_argument("--mode is unsharded, stage1 or stage2, not " + s.mode);
  }
  return s;
}

} // namespace

int main(int argc, char** argv) {
  try {
    boost::mpi::environment env(argc, argv, boost::mpi::threading::multiple);
    const settings s = parse(argc, argv);
    auto comm = cohort::make_communicator<cohort::flat>();
    torch::set_num_threads(1);
    torch::manual_seed(1);
    mlp model(s);
    torch::optim::Adam adam(model->parameters(), 1e-4);
    if (s.mode == "unsharded") {
      cohort::torch::distributed_optimizer opt{std::move(adam), comm, *model};
      run(s, comm, model, opt);
    } else {
      cohort::torch::sharded_optimizer<torch::optim::Adam, cohort::flat> opt{
          std::move(adam),
          comm,
          *model,
          {.stage = s.mode == "stage1" ? cohort::zero_stage::optimizer_state
                                       : cohort::zero_stage::gradients}};
      run(s, comm, model, opt);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sharding: %s\n", e.what());
    return 1;
  }
}
