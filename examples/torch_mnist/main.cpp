// SPDX-License-Identifier: Apache-2.0

// A LibTorch trainer (a small CNN on MNIST) written for one process, made data-parallel by the
// four changes marked "cohort change n/4". The model, the optimizer (torch::optim::SGD) and the
// loop are LibTorch's; the gradients are averaged while backward runs (hooks on the autograd
// graph, registered by cohort::torch::distributed_optimizer), so the loop itself is unchanged.
//
//   mpirun -np 2 ./torch_mnist                  # synthetic MNIST-shaped data, made up from --seed
//   mpirun -np 2 ./torch_mnist --data ~/mnist   # MNIST through torch::data::datasets::MNIST
//
// As in mnist_mlp, the global batch is fixed and each rank takes global-batch / ranks of it: 1 and
// N ranks take the same steps on average, and reach the same accuracy.

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>
// Checkpoints need xxHash's header (cohort::checkpoint); without it --checkpoint is refused.
#if __has_include(<xxhash.h>)
#include <cohort/adapters/torch/checkpoint.hpp>
#include <cohort/checkpoint.hpp>
#define TORCH_MNIST_CHECKPOINTS 1
#endif

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/command_line.hpp"
#include "../common/grad_sync_report.hpp"
#include "../common/mnist_data.hpp"
#include "../common/reducer_option.hpp"

namespace {

using namespace mnist_data;

// ---- model -------------------------------------------------------------------------------------

struct cnn_impl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  cnn_impl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)));
    fc1 = register_module("fc1", torch::nn::Linear(16 * 4 * 4, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2); // 28 -> 24 -> 12
    x = torch::max_pool2d(torch::relu(conv2(x)), 2); // 12 -> 8 -> 4
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
};
TORCH_MODULE_IMPL(cnn, cnn_impl);

// Examples [begin, end) of a shard as a batch of images and labels.
template <class Shard>
std::pair<torch::Tensor, torch::Tensor> batch_of(const Shard& shard, std::size_t begin,
                                                 std::size_t end) {
  const auto n = static_cast<std::int64_t>(end - begin);
  torch::Tensor images = torch::empty({n, 1, image_side, image_side});
  torch::Tensor labels = torch::empty({n}, torch::kInt64);
  float* pixels = images.data_ptr<float>();
  auto* label = labels.data_ptr<std::int64_t>();
  for (std::size_t i = begin; i < end; ++i) {
    const example& e = shard[i];
    std::memcpy(pixels + (i - begin) * image_pixels, e.pixels.data(), sizeof(e.pixels));
    label[i - begin] = e.label;
  }
  return {images, labels};
}

// ---- data --------------------------------------------------------------------------------------

// MNIST read by LibTorch's own dataset, turned into the examples scatter_dataset sends.
dataset read_with_torch(const std::string& dir, torch::data::datasets::MNIST::Mode mode,
                        std::optional<std::size_t> limit) {
  torch::data::datasets::MNIST mnist(dir, mode);
  const std::size_t count = std::min(*mnist.size(), limit.value_or(*mnist.size()));
  dataset out(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto item = mnist.get(i);
    const torch::Tensor image = item.data.contiguous().to(torch::kFloat32);
    std::memcpy(out[i].pixels.data(), image.data_ptr<float>(), sizeof(out[i].pixels));
    out[i].label = static_cast<std::uint8_t>(item.target.item<std::int64_t>());
  }
  return out;
}

// ---- command line ------------------------------------------------------------------------------

constexpr std::string_view usage = R"(usage: torch_mnist [options]
  --epochs N         passes over the training set (default 3)
  --global-batch B   examples per step over all ranks; a multiple of the ranks (default 64)
  --lr X             learning rate (default 0.05)
  --momentum M       SGD momentum (default 0.9)
  --data DIR         read MNIST from DIR with torch::data::datasets::MNIST; without it, a
                     synthetic MNIST-shaped set is made up from --seed
  --train-size N     training examples (synthetic: default 6000; MNIST: at most N)
  --test-size N      test examples (synthetic: default 1000; MNIST: at most N)
  --seed S           seeds the data, the weights and the shuffling (default 1)
  --no-overlap       reduce at step() instead of while backward runs
  --reducer R        mean (default), or powersgd:RANK[:START]: each weight tensor sent as rank-RANK
                     factors of its (out channels x the rest) matrix, as DDP's powerSGD_hook,
                     after START uncompressed steps (default 0)
  --checkpoint DIR   resume from the newest checkpoint in DIR if there is one (the module, the
                     optimizer's momentum, the position in the data), and save one every
                     --checkpoint-every steps
  --checkpoint-every N  steps between checkpoints (default 50)
  --help             print this and exit
)";

using command_line::parse_value;
using command_line::usage_error;

struct options {
  int epochs = 3;
  std::size_t global_batch = 64;
  double lr = 0.05;
  double momentum = 0.9;
  std::string data_dir;
  std::optional<std::size_t> train_size;
  std::optional<std::size_t> test_size;
  std::uint64_t seed = 1;
  bool overlap = true;
  std::string reducer = "mean";
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 50;
  bool help = false;
};

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) {
        throw usage_error(std::string(flag) + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      o.help = true;
    } else if (flag == "--epochs") {
      o.epochs = parse_value<int>(flag, value());
    } else if (flag == "--global-batch") {
      o.global_batch = parse_value<std::size_t>(flag, value());
    } else if (flag == "--lr") {
      o.lr = parse_value<double>(flag, value());
    } else if (flag == "--momentum") {
      o.momentum = parse_value<double>(flag, value());
    } else if (flag == "--data") {
      o.data_dir = value();
    } else if (flag == "--train-size") {
      o.train_size = parse_value<std::size_t>(flag, value());
    } else if (flag == "--test-size") {
      o.test_size = parse_value<std::size_t>(flag, value());
    } else if (flag == "--seed") {
      o.seed = parse_value<std::uint64_t>(flag, value());
    } else if (flag == "--no-overlap") {
      o.overlap = false;
    } else if (flag == "--reducer") {
      o.reducer = value();
    } else if (flag == "--checkpoint") {
#if defined(TORCH_MNIST_CHECKPOINTS)
      o.checkpoint_dir = value();
#else
      throw usage_error("--checkpoint: built without xxHash, cohort cannot checkpoint");
#endif
    } else if (flag == "--checkpoint-every") {
      o.checkpoint_every = parse_value<std::uint64_t>(flag, value());
      if (o.checkpoint_every < 1) {
        throw usage_error("--checkpoint-every must be at least 1");
      }
    } else {
      throw usage_error("unknown option '" + std::string(flag) + "'");
    }
  }
  if (o.epochs < 1 || o.global_batch < 1 || !(o.lr > 0) || o.momentum < 0 || o.momentum >= 1) {
    throw usage_error("--epochs and --global-batch must be at least 1, --lr positive and "
                      "--momentum in [0, 1)");
  }
  return o;
}

// ---- training ----------------------------------------------------------------------------------

#if defined(TORCH_MNIST_CHECKPOINTS)
// PowerSGD's state (its Q and this rank's error feedback) is part of the run, as the optimizer's.
// (References to the caller's state, which lives until the end of the call's full expression.)
template <class Reducer, class... State>
auto with_reducer_state(const Reducer& reducer, State&&... state) {
  if constexpr (std::is_same_v<Reducer, cohort::powersgd>) {
    return std::tuple<State&&..., cohort::powersgd_replicated_ref, cohort::powersgd_errors_ref>(
        std::forward<State>(state)..., cohort::powersgd_replicated(reducer),
        cohort::powersgd_errors(reducer));
  } else {
    return std::tuple<State&&...>(std::forward<State>(state)...);
  }
}
#endif

template <cohort::reducer Reducer>
int train(const options& o, cohort::flat& comm, const Reducer& reducer) {
  if (o.global_batch % static_cast<std::size_t>(comm.size()) != 0) {
    throw usage_error("--global-batch " + std::to_string(o.global_batch) +
                      " is not a multiple of the " + std::to_string(comm.size()) + " ranks");
  }
  const std::size_t local_batch = o.global_batch / static_cast<std::size_t>(comm.size());
  const bool report = comm.rank() == 0;

  // cohort change 3/4: rank 0 reads (or makes up) the data; every rank gets its own shard.
  dataset train_set;
  dataset test_set;
  if (comm.rank() == 0) {
    if (o.data_dir.empty()) {
      mnist data = make_synthetic(o.train_size.value_or(6000), o.test_size.value_or(1000), o.seed);
      train_set = std::move(data.train);
      test_set = std::move(data.test);
    } else {
      train_set =
          read_with_torch(o.data_dir, torch::data::datasets::MNIST::Mode::kTrain, o.train_size);
      test_set =
          read_with_torch(o.data_dir, torch::data::datasets::MNIST::Mode::kTest, o.test_size);
    }
  }
  auto train_shard = cohort::scatter_dataset(
      train_set, comm, {.shuffle = true, .seed = o.seed, .force_equal_length = true});
  const auto test_shard = cohort::scatter_dataset(test_set, comm, {.force_equal_length = false});
  train_set = {};
  test_set = {};

  torch::manual_seed(o.seed);
  cnn model;
  // cohort change 2/4: the optimizer is wrapped. Rank 0's weights (and buffers, and optimizer
  // state) are copied to every rank now; backward's hooks average the gradients as they come.
  cohort::torch::distributed_optimizer opt{
      torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum)),
      comm,
      *model,
      {.overlap = o.overlap},
      reducer};

  if (report) {
    std::printf("torch_mnist: %d rank(s), global batch %zu (%zu per rank), overlap %s, %s, "
                "reducer %s\n",
                comm.size(), o.global_batch, local_batch, o.overlap ? "on" : "off",
                o.data_dir.empty() ? "synthetic data" : o.data_dir.c_str(), o.reducer.c_str());
    std::fflush(stdout);
  }

  // Where training is: the step over the whole run, and the epoch and the step within it.
  std::uint64_t step = 0;
  std::uint64_t epoch_begin = 0;
  std::uint64_t steps_done_in_epoch = 0;
#if defined(TORCH_MNIST_CHECKPOINTS)
  std::optional<cohort::checkpointer<cohort::flat>> checkpoints;
  cohort::data_position position;
  if (!o.checkpoint_dir.empty()) {
    checkpoints.emplace(comm, o.checkpoint_dir);
    if (const auto resumed =
            std::apply([&](auto&&... state) { return checkpoints->resume(state...); },
                       with_reducer_state(reducer, cohort::torch::module_state(*model),
                                          cohort::torch::optimizer_state(opt.inner(), *model),
                                          position, cohort::bucket_orders(comm)))) {
      step = *resumed;
      epoch_begin = position.epoch;
      steps_done_in_epoch = position.step;
      if (report) {
        std::printf("resumed from step %llu (epoch %llu, after %llu of its steps%s)\n",
                    static_cast<unsigned long long>(step),
                    static_cast<unsigned long long>(position.epoch + 1),
                    static_cast<unsigned long long>(position.step),
                    command_line::restart_note().c_str());
      }
    }
  }
#endif

  const auto start = std::chrono::steady_clock::now();
  for (auto epoch = static_cast<int>(epoch_begin); epoch < o.epochs; ++epoch) {
    train_shard.set_epoch(static_cast<std::uint64_t>(epoch));
    model->train();
    cohort::local_metrics metrics;
    for (std::size_t begin = steps_done_in_epoch * local_batch;
         begin + local_batch <= train_shard.size(); begin += local_batch) {
      const auto [images, labels] = batch_of(train_shard, begin, begin + local_batch);
      opt.zero_grad();
      const torch::Tensor logits = model->forward(images);
      const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
      loss.backward();
      opt.step();
      const double n = static_cast<double>(local_batch);
      metrics.add("loss", loss.item<double>(), n);
      metrics.add("accuracy", logits.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>(),
                  n);
      ++step;
#if defined(TORCH_MNIST_CHECKPOINTS)
      if (checkpoints && step % o.checkpoint_every == 0) {
        // After the epoch's last step, the next epoch's start: a resume begins there, not in an
        // epoch with no step left (whose metrics would be empty).
        const bool last = begin + 2 * local_batch > train_shard.size();
        position = last ? cohort::data_position{static_cast<std::uint64_t>(epoch) + 1, 0}
                        : cohort::data_position{static_cast<std::uint64_t>(epoch),
                                                begin / local_batch + 1};
        std::apply([&](auto&&... state) { checkpoints->save(step, state...); },
                   with_reducer_state(reducer, cohort::torch::module_state(*model),
                                      cohort::torch::optimizer_state(opt.inner(), *model), position,
                                      cohort::bucket_orders(comm)));
      }
#endif
    }
    steps_done_in_epoch = 0;
    // cohort change 4/4: metrics averaged over every rank's examples, exactly.
    const auto global = cohort::allreduce_mean(comm, metrics);
    if (report) {
      std::printf("epoch %d/%d: train loss %.4f, train accuracy %.4f\n", epoch + 1, o.epochs,
                  global.at("loss"), global.at("accuracy"));
    }
    report_grad_sync(comm, report); // collective: every rank
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;

  model->eval();
  const torch::NoGradGuard no_grad;
  cohort::local_metrics test_metrics;
  for (std::size_t begin = 0; begin < test_shard.size(); begin += local_batch) {
    const std::size_t end = std::min(test_shard.size(), begin + local_batch);
    const auto [images, labels] = batch_of(test_shard, begin, end);
    const torch::Tensor logits = model->forward(images);
    const auto n = static_cast<double>(end - begin);
    test_metrics.add("loss", torch::nn::functional::cross_entropy(logits, labels).item<double>(),
                     n);
    test_metrics.add("accuracy",
                     logits.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>(), n);
  }
  const auto test = cohort::allreduce_mean(comm, test_metrics);
  if (report) {
    std::printf("training took %.2f s; test loss %.4f\n", seconds.count(), test.at("loss"));
    std::printf("test accuracy: %.4f\n", test.at("accuracy"));
#if defined(TORCH_MNIST_CHECKPOINTS)
    // What a resumed run must end with, bit for bit, to be the run that was not interrupted.
    cohort::checkpoint::checksum weights;
    for (const at::Tensor& p : model->parameters()) {
      const at::Tensor c = p.detach().contiguous();
      weights.update({static_cast<const std::byte*>(c.data_ptr()), c.nbytes()});
    }
    std::printf("final weights: XXH3 %s after %llu steps\n",
                cohort::checkpoint::to_hex(weights.value()).c_str(),
                static_cast<unsigned long long>(step));
#endif
    std::fflush(stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  // cohort change 1/4: MPI (with threads: the hooks reduce on cohort's thread while backward
  // runs) and a communicator; the strategy is a type.
  boost::mpi::environment env{argc, argv, boost::mpi::threading::multiple};
  try {
    const options o = parse_options(argc, argv);
    if (o.help) {
      std::fputs(usage.data(), stdout);
      return 0;
    }
    auto comm = cohort::make_communicator<cohort::flat>();
    // The ranks of a node share its cores; with overlap, cohort's thread needs one too.
    torch::set_num_threads(cohort::torch::intra_op_threads(comm.intra_size(), o.overlap));
    return command_line::with_reducer(o.reducer,
                                      [&](const auto& reducer) { return train(o, comm, reducer); });
  } catch (const usage_error& e) {
    std::fprintf(stderr, "torch_mnist: %s\n%s", e.what(), usage.data());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_mnist: %s\n", e.what());
    return 1;
  }
}
