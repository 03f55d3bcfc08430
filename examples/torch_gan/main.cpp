// SPDX-License-Identifier: Apache-2.0

// A DCGAN written for one process (the loop of pytorch/examples' cpp/dcgan: a generator and a
// discriminator with BatchNorm, two Adam optimizers, the discriminator's two backward passes,
// the generator's backward through the discriminator, samples and checkpoints now and then),
// made data-parallel by the changes marked "cohort change n/6". The loop itself is unchanged:
// no no_sync() guard anywhere. The discriminator's first reduction ends as its second backward
// begins, the reduction its hooks start in the generator's backward ends with the generator's
// step, and the optimizers are torch::optim::Adam (what torch::save takes).
//
//   mpirun -np 2 ./torch_gan                      # synthetic MNIST-shaped digits, from --seed
//   mpirun -np 3 ./torch_gan --check-replicas     # and prove every rank holds the same GAN
//
// Each rank takes --batch examples a step: N ranks take N times the batch of one.

#include <cohort/adapters/torch.hpp>

#include <boost/mpi/environment.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "../common/command_line.hpp"
#include "../common/mnist_data.hpp"

namespace {

using command_line::parse_value;
using command_line::usage_error;

constexpr std::int64_t noise_size = 32;

// ---- models (DCGAN's, narrower: it trains on CPUs) ---------------------------------------------

struct generator_impl : torch::nn::Module {
  torch::nn::ConvTranspose2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, conv4{nullptr};
  torch::nn::BatchNorm2d norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  generator_impl() {
    using options = torch::nn::ConvTranspose2dOptions;
    conv1 = register_module(
        "conv1", torch::nn::ConvTranspose2d(options(noise_size, 64, 4).stride(1).bias(false)));
    conv2 = register_module(
        "conv2", torch::nn::ConvTranspose2d(options(64, 32, 3).stride(2).padding(1).bias(false)));
    conv3 = register_module(
        "conv3", torch::nn::ConvTranspose2d(options(32, 16, 4).stride(2).padding(1).bias(false)));
    conv4 = register_module(
        "conv4", torch::nn::ConvTranspose2d(options(16, 1, 4).stride(2).padding(1).bias(false)));
    norm1 = register_module("norm1", torch::nn::BatchNorm2d(64));
    norm2 = register_module("norm2", torch::nn::BatchNorm2d(32));
    norm3 = register_module("norm3", torch::nn::BatchNorm2d(16));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(norm1(conv1(x))); // 1 -> 4
    x = torch::relu(norm2(conv2(x))); // 4 -> 7
    x = torch::relu(norm3(conv3(x))); // 7 -> 14
    return torch::tanh(conv4(x));     // 14 -> 28
  }
};
TORCH_MODULE_IMPL(generator, generator_impl);

struct discriminator_impl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d norm2{nullptr};
  discriminator_impl() {
    using options = torch::nn::Conv2dOptions;
    conv1 = register_module("conv1",
                            torch::nn::Conv2d(options(1, 16, 4).stride(2).padding(1).bias(false)));
    conv2 = register_module("conv2",
                            torch::nn::Conv2d(options(16, 32, 4).stride(2).padding(1).bias(false)));
    conv3 = register_module("conv3",
                            torch::nn::Conv2d(options(32, 1, 7).stride(1).padding(0).bias(false)));
    norm2 = register_module("norm2", torch::nn::BatchNorm2d(32));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::leaky_relu(conv1(x), 0.2);        // 28 -> 14
    x = torch::leaky_relu(norm2(conv2(x)), 0.2); // 14 -> 7
    return torch::sigmoid(conv3(x));             // 7 -> 1
  }
};
TORCH_MODULE_IMPL(discriminator, discriminator_impl);

// ---- data --------------------------------------------------------------------------------------

// MNIST-shaped digits as LibTorch's data loaders read them: images in [-1, 1].
class digits : public torch::data::datasets::Dataset<digits> {
public:
  explicit digits(mnist_data::dataset examples)
      : examples_(std::move(examples)) {}
  torch::data::Example<> get(std::size_t index) override {
    const mnist_data::example& e = examples_.at(index);
    torch::Tensor image = torch::empty({1, 28, 28});
    std::memcpy(image.data_ptr<float>(), e.pixels.data(), sizeof(e.pixels));
    return {image.mul(2).sub(1), torch::tensor(static_cast<std::int64_t>(e.label))};
  }
  torch::optional<std::size_t> size() const override { return examples_.size(); }

private:
  mnist_data::dataset examples_;
};

// ---- command line ------------------------------------------------------------------------------

constexpr std::string_view usage = R"(usage: torch_gan [options]
  --epochs N          passes over the training set (default 2)
  --batch B           examples per step on each rank (default 32)
  --train-size N      synthetic digits to learn from (default 2048)
  --seed S            seeds the data, the weights and (per rank) the noise (default 1)
  --sample-every N    steps between samples drawn by rank 0 (default 20; 0: never)
  --checkpoint-dir D  where rank 0 saves the generator, its optimizer and the samples (default:
                      nowhere: drawn, not saved)
  --check-replicas    at the end, compare every rank's parameters and buffers with rank 0's,
                      bit for bit, and fail if any differs
  --help              print this and exit
)";

struct options {
  int epochs = 2;
  std::int64_t batch = 32;
  std::size_t train_size = 2048;
  std::uint64_t seed = 1;
  int sample_every = 20;
  std::string checkpoint_dir;
  bool check_replicas = false;
  bool help = false;
};

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) {
        throw usage_error(std::string(flag) + " expects a value");
      }
      return argv[++i];
    };
    if (flag == "--epochs") {
      o.epochs = parse_value<int>(flag, value());
    } else if (flag == "--batch") {
      o.batch = parse_value<std::int64_t>(flag, value());
    } else if (flag == "--train-size") {
      o.train_size = parse_value<std::size_t>(flag, value());
    } else if (flag == "--seed") {
      o.seed = parse_value<std::uint64_t>(flag, value());
    } else if (flag == "--sample-every") {
      o.sample_every = parse_value<int>(flag, value());
    } else if (flag == "--checkpoint-dir") {
      o.checkpoint_dir = value();
    } else if (flag == "--check-replicas") {
      o.check_replicas = true;
    } else if (flag == "--help") {
      o.help = true;
    } else {
      throw usage_error("unknown option " + std::string(flag));
    }
  }
  if (o.epochs < 1 || o.batch < 2 || o.train_size < 1) {
    throw usage_error("--epochs must be at least 1, --batch at least 2, --train-size at least 1");
  }
  return o;
}

// Whether every rank's `tensors` equal rank 0's, bit for bit (the replicas' promise).
bool same_as_rank_0(cohort::flat& comm, const std::vector<torch::Tensor>& tensors) {
  bool same = true;
  for (const torch::Tensor& t : tensors) {
    // (as integers: +0 and -0, or two NaNs, must not compare equal where the bits differ)
    torch::Tensor mine = t.detach().contiguous().reshape({-1}).view(torch::kUInt8);
    torch::Tensor root = mine.clone();
    comm.broadcast(root, 0);
    same = same && torch::equal(mine, root);
  }
  torch::Tensor all_same = torch::tensor({same ? 1 : 0}, torch::kInt32);
  comm.allreduce(all_same, cohort::reduce_op::min);
  return all_same.item<int>() == 1;
}

std::vector<torch::Tensor> state_of(const torch::nn::Module& module) {
  std::vector<torch::Tensor> state = module.parameters();
  for (const torch::Tensor& buffer : module.buffers()) {
    state.push_back(buffer);
  }
  return state;
}

int train(const options& o, cohort::flat& comm) {
  torch::manual_seed(o.seed); // the same weights everywhere (rank 0's would be copied anyway)
  generator generator;
  discriminator discriminator;

  // cohort change 2/6: the optimizers are wrapped (rank 0's weights, buffers and moments are
  // copied to every rank here); they are still Adam optimizers, which torch::save takes.
  cohort::torch::distributed_optimizer generator_optimizer{
      torch::optim::Adam(generator->parameters(),
                         torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
      comm, *generator};
  cohort::torch::distributed_optimizer discriminator_optimizer{
      torch::optim::Adam(discriminator->parameters(),
                         torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
      comm, *discriminator};

  // cohort change 3/6: noise (and label smoothing) drawn per rank: with one seed everywhere,
  // every rank would draw the same noise and the ranks would add nothing to each other.
  cohort::torch::seed_per_rank(comm, o.seed);

  const mnist_data::mnist data = mnist_data::make_synthetic(o.train_size, 0, o.seed);
  // cohort change 4/6: each rank loads its share of the digits, a new order every epoch.
  auto loader = torch::data::make_data_loader(
      digits(data.train).map(torch::data::transforms::Stack<>()),
      cohort::torch::distributed_sampler(comm, data.train.size(), {.seed = o.seed}),
      torch::data::DataLoaderOptions(static_cast<std::size_t>(o.batch)));

  const bool report = comm.rank() == 0;
  if (report) {
    std::printf("DCGAN on %d rank(s), %lld digits a step on each\n", comm.size(),
                static_cast<long long>(o.batch));
  }
  const torch::Tensor fixed_noise = torch::randn({16, noise_size, 1, 1});
  int step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    double d_total = 0.0;
    double g_total = 0.0;
    int batches = 0;
    for (torch::data::Example<>& batch : *loader) {
      const std::int64_t n = batch.data.size(0);
      // Train the discriminator with real images, then with fakes: two backward passes.
      discriminator->zero_grad();
      const torch::Tensor real_labels = torch::empty(n).uniform_(0.8, 1.0);
      const torch::Tensor real_output = discriminator->forward(batch.data).reshape(n);
      const torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, real_labels);
      d_loss_real.backward();

      const torch::Tensor noise = torch::randn({n, noise_size, 1, 1});
      const torch::Tensor fake_images = generator->forward(noise);
      torch::Tensor fake_labels = torch::zeros(n);
      torch::Tensor fake_output = discriminator->forward(fake_images.detach()).reshape(n);
      const torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
      d_loss_fake.backward();
      const torch::Tensor d_loss = d_loss_real + d_loss_fake;
      discriminator_optimizer.step();

      // Train the generator through the discriminator (whose hooks fire too: that reduction
      // ends with the generator's step, its gradients dropped by the next zero_grad).
      generator->zero_grad();
      fake_labels.fill_(1);
      fake_output = discriminator->forward(fake_images).reshape(n);
      const torch::Tensor g_loss = torch::binary_cross_entropy(fake_output, fake_labels);
      g_loss.backward();
      generator_optimizer.step();

      d_total += d_loss.item<double>();
      g_total += g_loss.item<double>();
      ++batches;
      ++step;
      // cohort change 5/6: side work on rank 0 only, and nothing collective inside it. The
      // samples are drawn in eval mode, so that BatchNorm's running statistics (which every
      // rank must keep alike) do not move on rank 0 alone.
      if (report && o.sample_every > 0 && step % o.sample_every == 0) {
        const torch::NoGradGuard no_grad;
        generator->eval();
        const torch::Tensor samples = (generator->forward(fixed_noise) + 1.0) / 2.0;
        generator->train();
        std::printf("step %d: %lld samples drawn, mean intensity %.3f\n", step,
                    static_cast<long long>(samples.size(0)), samples.mean().item<double>());
        if (!o.checkpoint_dir.empty()) {
          std::filesystem::create_directories(o.checkpoint_dir);
          torch::save(generator, o.checkpoint_dir + "/generator-checkpoint.pt");
          torch::save(generator_optimizer, o.checkpoint_dir + "/generator-optimizer.pt");
          torch::save(samples, o.checkpoint_dir + "/dcgan-sample-" + std::to_string(step) + ".pt");
        }
      }
    }
    // cohort change 6/6: BatchNorm's running statistics, which each rank gathered from its own
    // batches, are rank 0's again on every rank (DDP broadcasts them at every forward).
    generator_optimizer.broadcast_buffers();
    discriminator_optimizer.broadcast_buffers();
    cohort::local_metrics losses;
    losses.add("d_loss", d_total / batches, batches);
    losses.add("g_loss", g_total / batches, batches);
    const auto mean = cohort::allreduce_mean(comm, losses);
    if (report) {
      std::printf("epoch %d/%d: discriminator loss %.4f, generator loss %.4f\n", epoch, o.epochs,
                  mean.at("d_loss"), mean.at("g_loss"));
      std::fflush(stdout);
    }
    if (!std::isfinite(mean.at("d_loss")) || !std::isfinite(mean.at("g_loss"))) {
      throw std::runtime_error("the losses are not finite");
    }
  }
  if (o.check_replicas) {
    std::vector<torch::Tensor> everything = state_of(*generator);
    for (const torch::Tensor& t : state_of(*discriminator)) {
      everything.push_back(t);
    }
    if (!same_as_rank_0(comm, everything)) {
      std::fprintf(stderr, "torch_gan: rank %d: the replicas differ\n", comm.rank());
      return 1;
    }
    if (report) {
      std::printf("replicas identical: %zu tensors on %d rank(s)\n", everything.size(),
                  comm.size());
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  // cohort change 1/6: MPI (with threads: the hooks reduce on cohort's thread while backward
  // runs) and a communicator; the strategy is a type.
  boost::mpi::environment env{argc, argv, boost::mpi::threading::multiple};
  try {
    const options o = parse_options(argc, argv);
    if (o.help) {
      std::fputs(usage.data(), stdout);
      return 0;
    }
    auto comm = cohort::make_communicator<cohort::flat>();
    // The ranks of a node share its cores; cohort's thread needs one too.
    torch::set_num_threads(cohort::torch::intra_op_threads(comm.intra_size(), true));
    return train(o, comm);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "torch_gan: %s\n%s", e.what(), usage.data());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_gan: %s\n", e.what());
    return 1;
  }
}
