// SPDX-License-Identifier: Apache-2.0
// Real failures in real processes: one rank stalls, throws and returns, abandons an overlapped
// step, or fails on cohort's thread, while the others train. Each mode is a job of its own, run by
// test/support/expect_job.cmake under mpirun with a bounded time, which checks how the job ends:
// with the expected message, within seconds of the failure, and never with a corrupted replica.
//
//   test_communicator_failure MODE
//
// MODE: stalled, stalled_in_transfer, throw_and_return, throw_and_return_overlapped,
//       stalled_without_agreement, exchange_fails_on_cohorts_thread, uncaught_exception,
//       stalled_in_reduces_to_owners[_without_agreement], stalled_in_copies_across_nodes,
//       healthy (and the others below)
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

// Four gradients of 1 MiB from `allocator` (each past the fusion threshold: reduced in place, so
// in the window when the allocator is a window's).
template <class Allocator>
struct large_model {
  using tensor = std::vector<float, Allocator>;
  std::vector<tensor> values, grads;
  std::vector<cohort::parameter_ref<tensor>> params;

  explicit large_model(const Allocator& allocator) {
    for (int t = 0; t < 4; ++t) {
      values.emplace_back(std::size_t{1} << 18, 0.0f, allocator);
      grads.emplace_back(std::size_t{1} << 18, 1.0f, allocator);
    }
    for (std::size_t t = 0; t < grads.size(); ++t) {
      params.push_back({"layer" + std::to_string(t), &values[t], &grads[t]});
    }
  }
};

using params_type = std::vector<cohort::parameter_ref<std::vector<float>>>;

// A tiny replica: three tensors, trained by w -= 0.1 * g.
struct replica {
  std::vector<float> w1, g1, w2, g2, w3, g3;
  params_type params;
  replica()
      : w1(64, 1.0f)
      , g1(64)
      , w2(1000, 1.0f)
      , g2(1000)
      , w3(5, 1.0f)
      , g3(5) {
    params = {{"w1", &w1, &g1}, {"w2", &w2, &g2}, {"w3", &w3, &g3}};
  }
  // A backward pass: every rank's gradients are rank + 1, finite and small.
  void backward(int rank) {
    for (auto* g : {&g1, &g2, &g3}) {
      g->assign(g->size(), static_cast<float>(rank + 1));
    }
  }
  bool finite_and_small() const {
    for (const auto* w : {&w1, &w2, &w3}) {
      for (const float x : *w) {
        if (!std::isfinite(x) || std::abs(x) > 1e3f) {
          return false;
        }
      }
    }
    return true;
  }
};

struct sgd {
  replica* model;
  void step() {
    for (auto [w, g] : {std::pair{&model->w1, &model->g1}, std::pair{&model->w2, &model->g2},
                        std::pair{&model->w3, &model->g3}}) {
      for (std::size_t i = 0; i < w->size(); ++i) {
        (*w)[i] -= 0.1f * (*g)[i];
      }
    }
  }
};

// A strategy whose exchange fails on the last rank at its 4th bucket: what an MPI error or a bug
// inside a strategy looks like, on cohort's thread.
class failing_flat : public cohort::basic_communicator<failing_flat> {
public:
  static constexpr std::string_view name = "failing_flat";
  using cohort::basic_communicator<failing_flat>::basic_communicator;

private:
  friend cohort::strategy_access;
  void exchange(cohort::tensor_view bucket, cohort::reduce_op op) {
    if (rank() == size() - 1 && ++exchanges_ == 4) {
      throw std::runtime_error("injected failure in the exchange");
    }
    cohort::mpi::allreduce(grad_comm(), bucket, op);
  }
  int exchanges_ = 0;
};

// Stops this process (SIGSTOP) `delay` from now, from a thread of its own: most likely while the
// caller is inside the transfer it starts next.
void stop_itself_in(std::chrono::milliseconds delay) {
  std::thread([delay] {
    std::this_thread::sleep_for(delay);
    std::raise(SIGSTOP);
  }).detach();
}

void say(int rank, const std::string& text) {
  std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
  std::fflush(stderr);
}

// Trains `steps` steps; the last rank misbehaves as `mode` says at step `at`.
int run(std::string_view mode, int argc, char** argv) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::multiple);
  const int world_rank = boost::mpi::communicator().rank();
  const int last = boost::mpi::communicator().size() - 1;
  const bool odd_one = world_rank == last;
  // These modes take the timeout and stall warning from COHORT_TIMEOUT and COHORT_STALL_WARNING.
  const bool waits_from_environment = mode == "late" || mode == "late_without_agreement" ||
                                      mode == "late_in_transfer" ||
                                      mode == "stalled_from_environment";
  const cohort::communicator_options options{
      .check_agreement = mode != "stalled_without_agreement" && mode != "late_without_agreement" &&
                         mode != "stalled_in_reduces_to_owners_without_agreement",
      .bucket_bytes = 256,
      .first_bucket_bytes = 64,
      .timeout = waits_from_environment
                     ? std::nullopt
                     : std::optional<std::chrono::milliseconds>(std::chrono::seconds(3))};
  constexpr int steps = 8;
  constexpr int at = 3;

  if (mode == "exchange_fails_on_cohorts_thread") {
    auto comm = cohort::make_communicator<failing_flat>(options);
    replica model;
    cohort::distributed_optimizer opt{sgd{&model}, comm, model.params};
    for (int step = 0; step < steps; ++step) {
      model.backward(world_rank);
      for (std::size_t p = model.params.size(); p-- > 0;) {
        opt.grad_ready(p);
      }
      opt.step();
    }
    say(world_rank, "trained without noticing the failure");
    return 0;
  }

  if (mode == "stalled_in_reduces_to_owners" ||
      mode == "stalled_in_reduces_to_owners_without_agreement") {
    // Stage 2's reduction: four gradients of 1 MiB, each alone in its bucket and owned by one
    // rank in turn, so that their reduces to their owners are in flight together; the last rank
    // stops itself while they are, most likely, on their way.
    auto comm = cohort::make_communicator<cohort::flat>(options);
    large_model m{std::allocator<float>()};
    std::vector<int> owners;
    for (std::size_t t = 0; t < m.params.size(); ++t) {
      owners.push_back(static_cast<int>(t) % comm.size());
    }
    cohort::grad_sync_options sharded;
    sharded.owners = owners;
    for (int step = 0; step < 200; ++step) {
      if (odd_one && step == at) {
        stop_itself_in(std::chrono::milliseconds(5));
      }
      auto request = comm.begin_allreduce_grad(m.params, cohort::mean{}, sharded);
      for (std::size_t t = m.params.size(); t-- > 0;) {
        request.ready(t);
      }
      request.wait();
    }
    say(world_rank, "trained without noticing");
    return 0;
  }

  if (mode == "stalled_in_copies_across_nodes") {
    // A sharded optimizer's gather: four parameters of 1 MiB, each from its owner, copied on
    // nodes alike (COHORT_RANKS_PER_NODE=2) across the nodes, then inside each; the last rank
    // stops itself while they are, most likely, on their way.
    auto comm = cohort::make_communicator<cohort::flat>(options);
    large_model m{std::allocator<float>()};
    std::vector<cohort::tensor_view> values;
    std::vector<int> roots;
    for (std::size_t t = 0; t < m.values.size(); ++t) {
      values.push_back(cohort::make_view(m.values[t]));
      roots.push_back(static_cast<int>(t) % comm.size());
    }
    for (int step = 0; step < 200; ++step) {
      if (odd_one && step == at) {
        stop_itself_in(std::chrono::milliseconds(5));
      }
      comm.broadcast_each(values, roots);
    }
    say(world_rank, "copied without noticing");
    return 0;
  }

  if (mode == "window_on_some_nodes") {
    // Every rank a node of its own; the last one's gradients on the heap, the others' in their
    // node's window. The layouts agree, so the step's agreement passes; the nodes' vote inside
    // the exchange finds it, on every rank.
    cohort::communicator_options one_per_node = options;
    one_per_node.simulated_ranks_per_node = 1;
    cohort::shared_memory<> shared(boost::mpi::communicator(), one_per_node);
    const auto train = [&](auto allocator) {
      large_model m(allocator);
      for (int step = 0; step < steps; ++step) {
        shared.allreduce_grad(m.params, cohort::mean{});
      }
    };
    if (odd_one) {
      train(std::allocator<float>());
    } else {
      train(shared.allocator<float>());
    }
    say(world_rank, "trained without noticing");
    return 0;
  }

  if (mode == "window_offsets_differ" || mode == "stalled_in_window") {
    // Gradients in the node's shared window, 1 MiB each (in place: reduced in the window).
    cohort::shared_memory<> shared(boost::mpi::communicator(), options);
    const auto alloc = shared.allocator<float>();
    std::optional<std::vector<float, cohort::shared_allocator<float>>> misplaced;
    if (mode == "window_offsets_differ" && odd_one) {
      misplaced.emplace(16, 0.0f, alloc); // its gradients 64 bytes further on than the others'
    }
    large_model m(alloc);
    for (int step = 0; step < 200; ++step) {
      if (mode == "stalled_in_window" && odd_one && step == at) {
        // Stops itself while the others are, most likely, inside an exchange in the window.
        stop_itself_in(std::chrono::milliseconds(5));
      }
      shared.allreduce_grad(m.params, cohort::mean{});
    }
    say(world_rank, "trained without noticing");
    return 0;
  }

  auto comm = cohort::make_communicator<cohort::flat>(options);
  replica model;
  const std::vector<float> start = model.w2;
  try {
    cohort::distributed_optimizer opt{sgd{&model}, comm, model.params};
    for (int step = 0; step < steps; ++step) {
      model.backward(world_rank);
      const bool overlapped = mode == "throw_and_return_overlapped";
      if (overlapped) {
        // Backward marks the last layers first; the failing rank throws halfway through.
        opt.grad_ready(2);
        if (odd_one && step == at) {
          throw std::runtime_error("out of memory in the backward pass (injected)");
        }
        opt.grad_ready(1);
        opt.grad_ready(0);
      }
      if (odd_one && step == at) {
        if (mode == "stalled" || mode == "stalled_without_agreement" ||
            mode == "stalled_from_environment") {
          say(world_rank, "stopping itself");
          std::raise(SIGSTOP);
        } else if (mode == "late" || mode == "late_without_agreement") {
          say(world_rank, "computing for 2.5 s more than the others");
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        } else if (mode == "throw_and_return") {
          throw std::runtime_error("out of memory in the backward pass (injected)");
        } else if (mode == "uncaught_exception") {
          // Thrown where nothing catches it.
          std::thread([] { throw std::runtime_error("a bug on a thread of the trainer"); }).join();
        }
      }
      if (mode == "stalled_in_transfer" && odd_one && step == at) {
        // Stops itself while the others are, most likely, inside the big all-reduce.
        stop_itself_in(std::chrono::milliseconds(20));
      }
      if (mode == "late_in_transfer" && odd_one && step == at) {
        // The same, but a child process wakes it 2.5 s later: a transfer that stalls, then
        // recovers (a link down for a while).
        const pid_t parent = getpid();
        if (const pid_t child = fork(); child == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          if (getppid() == parent) { // (not some other process, should the rank be gone)
            kill(parent, SIGCONT);
          }
          std::_Exit(0);
        }
        stop_itself_in(std::chrono::milliseconds(20));
      }
      // The big transfers only at the step where the odd one stops: every other step would only
      // make the test slow (under the sanitizers, 90 s at 3 ranks when every step moved them).
      if ((mode == "stalled_in_transfer" || mode == "late_in_transfer") && step == at) {
        std::vector<float> big(std::size_t{16} << 20, 1.0f);
        for (int i = 0; i < 10; ++i) {
          comm.allreduce(big);
        }
      }
      opt.step();
    }
  } catch (const std::exception& e) {
    say(world_rank, std::string("caught: ") + e.what());
    // The point of the test: whatever the others did, this replica holds no garbage.
    say(world_rank, model.finite_and_small() ? "replica intact" : "REPLICA CORRUPTED");
    return 1;
  }
  say(world_rank, model.finite_and_small() ? "trained, replica intact" : "REPLICA CORRUPTED");
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
