// SPDX-License-Identifier: Apache-2.0
// Faults in a model split over ranks (issue 15), in real processes under mpirun: a stage on each
// rank, tensors crossing ranks forward and gradients crossing back. One rank misbehaves at step 3
// as the mode says; the job must end in an error on every rank, or be ended, within seconds,
// never hang (test/CMakeLists.txt bounds it and checks the output).
//
//   healthy          trains 6 steps
//   skips_backward   the last rank goes on to the next step without its backward pass, so the
//                    rank before it waits for a gradient that does not come: the watchdog
//   stalled          the last rank stops itself (SIGSTOP) in its forward pass: the watchdog
//   throw_and_return the last rank's stage throws and it returns: the ranks waiting for its
//                    tensors end the job when the watchdog's timeout passes
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <torch/torch.h>

namespace {

void say(int rank, const std::string& text) {
  std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
  std::fflush(stderr);
}

int run(std::string_view mode, int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  torch::set_num_threads(1);
  const cohort::communicator_options options{.timeout = std::chrono::seconds(3)};
  auto comm = cohort::make_communicator<cohort::flat>(options);
  const int r = comm.rank(), n = comm.size(), last = n - 1;
  constexpr int at = 3;
  namespace ct = cohort::torch;
  torch::manual_seed(1);
  torch::nn::Linear layer(8, 8);
  int step = 0;
  ct::multi_node_sequential model(comm);
  model->add(std::make_shared<torch::nn::FunctionalImpl>([&](const at::Tensor& x) {
               if (r == last && step == at) {
                 if (mode == "stalled") {
                   say(r, "stopping itself");
                   std::raise(SIGSTOP);
                 } else if (mode == "throw_and_return") {
                   throw std::runtime_error("out of memory in the stage (injected)");
                 }
               }
               return torch::tanh(layer(x));
             }),
             r == 0 ? ct::from_input : r - 1, r == last ? ct::to_output : r + 1);
  torch::optim::SGD opt(layer->parameters(), torch::optim::SGDOptions(0.1));
  try {
    for (step = 0; step < 6; ++step) {
      opt.zero_grad();
      const at::Tensor out = model(r == 0 ? torch::randn({4, 8}) : at::Tensor());
      if (r == last && step == at && mode == "skips_backward") {
        say(r, "skipping its backward pass");
        continue;
      }
      (r == last ? out.square().mean() : out).backward();
      opt.step();
    }
  } catch (const std::exception& e) {
    say(r, std::string("caught: ") + e.what());
    return 1;
  }
  say(r, "trained");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODE\n", argv[0]);
    return 2;
  }
  return run(argv[1], argc, argv);
}
