// SPDX-License-Identifier: Apache-2.0

// A model split over two ranks (ChainerMN's model parallelism, on LibTorch): rank 0 of each pair
// runs the first layers, rank 1 the last layer and the loss; activations cross forward and their
// gradients cross back inside the autograd graph (cohort::torch::multi_node_sequential). With 2k
// ranks the pairs are k replicas of the model, each trained on its part of every batch and
// averaging its stage's gradients with the same stage of the other replicas: a 2-D grid of
// sub-communicators, model-parallel inside a pair and data-parallel across pairs.
//
//   mpirun -np 2 ./torch_model_parallel        # one model over two ranks
//   mpirun -np 4 ./torch_model_parallel        # two replicas of it (the same global batch)
//
// Every rank draws the same batches in the same order from one seed (cohort::synchronized_index),
// so stage 0 reads the images and stage 1 the labels of the same examples without sending them.

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "../common/command_line.hpp"
#include "../common/mnist_data.hpp"

namespace {

using namespace mnist_data;
using command_line::parse_value;
using command_line::usage_error;

constexpr std::string_view usage =
    R"(usage: torch_model_parallel [options]   (an even number of ranks)
  --epochs N          passes over the training set (default 3)
  --global-batch N    examples a step over every replica (default 64)
  --lr X              SGD's learning rate (default 0.05)
  --train-size N      synthetic training examples (default 6000)
  --test-size N       synthetic test examples (default 1000)
  --seed N            the data's, the order's and the weights' seed (default 1)
)";

struct options {
  int epochs = 3;
  std::size_t global_batch = 64;
  double lr = 0.05;
  std::size_t train_size = 6000;
  std::size_t test_size = 1000;
  std::uint64_t seed = 1;
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
    } else if (flag == "--train-size") {
      o.train_size = parse_value<std::size_t>(flag, value());
    } else if (flag == "--test-size") {
      o.test_size = parse_value<std::size_t>(flag, value());
    } else if (flag == "--seed") {
      o.seed = parse_value<std::uint64_t>(flag, value());
    } else {
      throw usage_error("unknown option '" + std::string(flag) + "'");
    }
  }
  if (o.epochs < 1 || o.global_batch < 1 || !(o.lr > 0) || o.train_size < 1 || o.test_size < 1) {
    throw usage_error("--epochs, --global-batch, --train-size and --test-size must be at least 1 "
                      "and --lr positive");
  }
  return o;
}

// Examples `order[begin, end)` of `data`: the images (stage 0's input) and the labels (stage 1's).
template <class Order>
std::pair<torch::Tensor, torch::Tensor> batch_of(const dataset& data, const Order& order,
                                                 std::size_t begin, std::size_t end) {
  const auto n = static_cast<std::int64_t>(end - begin);
  torch::Tensor images = torch::empty({n, static_cast<std::int64_t>(image_pixels)});
  torch::Tensor labels = torch::empty({n}, torch::kInt64);
  for (std::size_t i = begin; i < end; ++i) {
    const example& e = data[order(i)];
    std::memcpy(images.data_ptr<float>() + (i - begin) * image_pixels, e.pixels.data(),
                sizeof(e.pixels));
    labels.data_ptr<std::int64_t>()[i - begin] = e.label;
  }
  return {images, labels};
}

int train(const options& o, cohort::flat& world) {
  if (world.size() % 2 != 0) {
    throw usage_error("the model is split over 2 ranks: run an even number of ranks, not " +
                      std::to_string(world.size()));
  }
  // The grid: ranks 2p and 2p + 1 hold replica p's two stages.
  cohort::flat pipeline = world.split(world.rank() / 2, world.rank());
  cohort::flat replicas = world.split(world.rank() % 2, world.rank());
  const int stage = pipeline.rank();
  const int replica = replicas.rank();
  const auto copies = static_cast<std::size_t>(replicas.size());
  if (o.global_batch % copies != 0) {
    throw usage_error("--global-batch " + std::to_string(o.global_batch) +
                      " is not a multiple of the " + std::to_string(copies) + " replicas");
  }
  const std::size_t local_batch = o.global_batch / copies;
  torch::set_num_threads(1);

  // Every rank makes the same data (stage 0 uses the images, stage 1 the labels).
  const mnist data = make_synthetic(o.train_size, o.test_size, o.seed);

  // The model, built whole from one seed on every rank; each rank keeps its stage.
  torch::manual_seed(o.seed);
  torch::nn::Sequential first(torch::nn::Linear(image_pixels, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 64), torch::nn::ReLU());
  torch::nn::Sequential last(torch::nn::Linear(64, classes));
  cohort::torch::multi_node_sequential model(pipeline);
  if (stage == 0) {
    model->add(first, cohort::torch::from_input, 1);
  } else {
    model->add(last, 0, cohort::torch::to_output);
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(0.9));

  if (world.rank() == 0) {
    std::printf("torch_model_parallel: %d ranks, %zu replica(s) of a model split over 2 ranks, "
                "global batch %zu (%zu per replica)\n",
                world.size(), copies, o.global_batch, local_batch);
    std::fflush(stdout);
  }

  // The same order on every rank, a new one each epoch, from the seed.
  auto order =
      cohort::synchronized_index(data.train.size(), world, {.shuffle = true, .seed = o.seed});
  const std::size_t steps = data.train.size() / o.global_batch;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    order.set_epoch(static_cast<std::uint64_t>(epoch));
    model->train();
    double loss_sum = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t begin =
          step * o.global_batch + static_cast<std::size_t>(replica) * local_batch;
      const auto [images, labels] = batch_of(
          data.train, [&](std::size_t i) { return order[i]; }, begin, begin + local_batch);
      opt.zero_grad();
      const torch::Tensor out = model(stage == 0 ? images : torch::Tensor());
      if (stage == 1) {
        const torch::Tensor loss = torch::nn::functional::cross_entropy(out, labels);
        loss.backward();
        loss_sum += loss.item<double>();
      } else {
        out.backward(); // the delegate: the gradient comes back from stage 1
      }
      // Data parallelism across the replicas: this stage's gradients averaged.
      replicas.allreduce_grad(cohort::torch::parameters(*model), cohort::mean{});
      opt.step();
    }

    // Test: each replica a part of the test set; stage 1 counts.
    model->eval();
    const torch::NoGradGuard no_grad;
    std::vector<double> counts{0, 0, 0}; // correct, seen, loss sum (stage 1)
    const std::size_t per_replica = (data.test.size() + copies - 1) / copies;
    const std::size_t from =
        std::min(data.test.size(), per_replica * static_cast<std::size_t>(replica));
    const std::size_t to = std::min(data.test.size(), from + per_replica);
    for (std::size_t b = from; b < to; b += 256) {
      const auto [images, labels] = batch_of(
          data.test, [](std::size_t i) { return i; }, b, std::min(to, b + 256));
      const torch::Tensor out = model(stage == 0 ? images : torch::Tensor());
      if (stage == 1) {
        counts[0] += out.argmax(1).eq(labels).sum().item<double>();
        counts[1] += static_cast<double>(labels.size(0));
      }
    }
    counts[2] = stage == 1 ? loss_sum : 0;
    world.allreduce(counts);
    if (world.rank() == 0) {
      std::printf("epoch %d: train loss %.4f, test accuracy %.4f (%.0f of %.0f)\n", epoch + 1,
                  counts[2] / static_cast<double>(steps * copies), counts[0] / counts[1], counts[0],
                  counts[1]);
      std::fflush(stdout);
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv};
  try {
    const options o = parse_options(argc, argv);
    if (o.help) {
      std::fputs(usage.data(), stdout);
      return 0;
    }
    auto world = cohort::make_communicator<cohort::flat>();
    return train(o, world);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "torch_model_parallel: %s\n%s", e.what(), usage.data());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_model_parallel: %s\n", e.what());
    return 1;
  }
}
