// SPDX-License-Identifier: Apache-2.0

// A trainer as it looks without any framework: a 784-hidden-10 perceptron with its weights and
// gradients in std::vector<float>, written for one process, then made data-parallel by the four
// changes of cohort's design, each marked "cohort change n/4". Everything else is the
// single-process trainer: same model, same optimizer, same loop.
//
//   mpirun -np 2 ./mnist_mlp                  # synthetic MNIST-shaped data, made up from --seed
//   mpirun -np 2 ./mnist_mlp --data ~/mnist   # the four uncompressed MNIST IDX files
//
// The global batch is fixed and each rank takes global-batch / ranks examples of it, so that every
// step averages the gradient over global-batch examples whatever the number of ranks: 1 and 2
// ranks train alike (not bit for bit, since the shards put other examples in each step) and reach
// the same accuracy.

#include <cohort/cohort.hpp>
// Checkpoints need xxHash's header (cohort::checkpoint); without it --checkpoint is refused.
#if __has_include(<xxhash.h>)
#include <cohort/checkpoint.hpp>
#define MNIST_MLP_CHECKPOINTS 1
#endif

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/serialization/array.hpp>
#include <boost/serialization/vector.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../common/command_line.hpp"
#include "../common/grad_sync_report.hpp"
#include "../common/mnist_data.hpp"
#include "../common/reducer_option.hpp"

namespace {

using namespace mnist_data;

// ---- model -------------------------------------------------------------------------------------

// A trainable tensor as the optimizer sees it: a name and pointers to its value and gradient.
// cohort's parameter_ref is exactly that record, and cohort already knows how to read it.
using parameter = cohort::parameter_ref<std::vector<float>>;

struct prediction {
  float loss = 0;
  bool correct = false;
};

// 784 -> hidden (ReLU) -> 10, softmax cross-entropy. Weights are row-major, one row per output,
// so that both the forward products and the weight-gradient updates run along contiguous rows.
class mlp {
public:
  mlp(std::size_t hidden, std::uint64_t seed)
      : hidden_(hidden)
      , w1_(hidden * image_pixels)
      , b1_(hidden)
      , w2_(classes * hidden)
      , b2_(classes)
      , gw1_(w1_.size())
      , gb1_(b1_.size())
      , gw2_(w2_.size())
      , gb2_(b2_.size())
      , h_(hidden)
      , dh_(hidden) {
    // He-uniform: keeps the ReLU activations' variance from shrinking or growing with the width.
    std::mt19937_64 engine(seed ^ 0x5eed'0f'ba5e'ba11ull);
    const float bound1 = std::sqrt(6.0f / static_cast<float>(image_pixels));
    const float bound2 = std::sqrt(6.0f / static_cast<float>(hidden));
    for (auto& w : w1_) {
      w = uniform(engine, -bound1, bound1);
    }
    for (auto& w : w2_) {
      w = uniform(engine, -bound2, bound2);
    }
  }

  // Holds pointers into the model: the model must not move while they are used.
  std::vector<parameter> parameters() {
    // (The weights' rows: a reducer that compresses matrices, --reducer powersgd, reads them.)
    return {{"fc1.weight", &w1_, &gw1_, hidden_},
            {"fc1.bias", &b1_, &gb1_},
            {"fc2.weight", &w2_, &gw2_, classes},
            {"fc2.bias", &b2_, &gb2_}};
  }

  void zero_grad() {
    for (auto* g : {&gw1_, &gb1_, &gw2_, &gb2_}) {
      std::fill(g->begin(), g->end(), 0.0f);
    }
  }

  prediction evaluate(const example& e) {
    std::array<float, classes> p{};
    return forward(e, p);
  }

  // Adds `scale` times the gradient of this example's loss (scale = 1 / batch: the batch mean).
  prediction train(const example& e, float scale) {
    std::array<float, classes> p{};
    const prediction result = forward(e, p);
    p[e.label] -= 1.0f; // d loss / d logits = softmax - one_hot
    std::fill(dh_.begin(), dh_.end(), 0.0f);
    for (std::size_t k = 0; k < classes; ++k) {
      const float dz = scale * p[k];
      gb2_[k] += dz;
      float* gw = &gw2_[k * hidden_];
      const float* w = &w2_[k * hidden_];
      for (std::size_t j = 0; j < hidden_; ++j) {
        gw[j] += dz * h_[j];
        dh_[j] += dz * w[j];
      }
    }
    for (std::size_t j = 0; j < hidden_; ++j) {
      if (h_[j] <= 0.0f) {
        continue; // ReLU passes no gradient, and most rows are skipped cheaply
      }
      gb1_[j] += dh_[j];
      float* gw = &gw1_[j * image_pixels];
      for (std::size_t i = 0; i < image_pixels; ++i) {
        gw[i] += dh_[j] * e.pixels[i];
      }
    }
    return result;
  }

private:
  // Leaves the hidden activations in h_ and the class probabilities in p.
  prediction forward(const example& e, std::array<float, classes>& p) {
    for (std::size_t j = 0; j < hidden_; ++j) {
      const float* w = &w1_[j * image_pixels];
      float sum = b1_[j];
      for (std::size_t i = 0; i < image_pixels; ++i) {
        sum += w[i] * e.pixels[i];
      }
      h_[j] = std::max(sum, 0.0f);
    }
    for (std::size_t k = 0; k < classes; ++k) {
      const float* w = &w2_[k * hidden_];
      float sum = b2_[k];
      for (std::size_t j = 0; j < hidden_; ++j) {
        sum += w[j] * h_[j];
      }
      p[k] = sum;
    }
    const auto best = static_cast<std::size_t>(std::max_element(p.begin(), p.end()) - p.begin());
    // Softmax and its log shifted by the largest logit, so that exp never overflows.
    const float top = p[best];
    const float label_logit = p[e.label] - top;
    float total = 0.0f;
    for (auto& v : p) {
      v = std::exp(v - top);
      total += v;
    }
    for (auto& v : p) {
      v /= total;
    }
    return {std::log(total) - label_logit, best == e.label};
  }

  std::size_t hidden_;
  std::vector<float> w1_, b1_, w2_, b2_;
  std::vector<float> gw1_, gb1_, gw2_, gb2_;
  std::vector<float> h_, dh_;
};

// Stochastic gradient descent, with momentum when `momentum` > 0 (v = m v + g; w -= lr v).
class sgd {
public:
  sgd(float lr, float momentum, std::vector<parameter>& params)
      : lr_(lr)
      , momentum_(momentum)
      , params_(&params) {
    for (const auto& p : params) {
      velocity_.emplace_back(p.value->size(), 0.0f);
    }
  }

  //! The momentum buffers: the optimizer's state, which a checkpoint keeps.
  std::vector<std::vector<float>>& velocity() { return velocity_; }

  void step() {
    for (std::size_t n = 0; n < params_->size(); ++n) {
      auto& w = *(*params_)[n].value;
      const auto& g = *(*params_)[n].grad;
      auto& v = velocity_[n];
      for (std::size_t i = 0; i < w.size(); ++i) {
        v[i] = momentum_ * v[i] + g[i];
        w[i] -= lr_ * v[i];
      }
    }
  }

private:
  float lr_;
  float momentum_;
  std::vector<parameter>* params_;
  std::vector<std::vector<float>> velocity_;
};

// ---- command line ------------------------------------------------------------------------------

constexpr std::string_view usage = R"(usage: mnist_mlp [options]
  --epochs N         passes over the training set (default 3)
  --global-batch B   examples per step over all ranks; each rank takes B / ranks, so B must be a
                     multiple of the number of ranks (default 64)
  --lr X             learning rate (default 0.02)
  --momentum M       SGD momentum, 0 for plain SGD (default 0.9)
  --hidden H         hidden units (default 64)
  --data DIR         read MNIST from DIR (train-images-idx3-ubyte, train-labels-idx1-ubyte,
                     t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, uncompressed); without it,
                     a synthetic MNIST-shaped set is made up from --seed
  --train-size N     training examples (synthetic: default 6000; MNIST: at most N, default all)
  --test-size N      test examples (synthetic: default 1000; MNIST: at most N, default all)
  --seed S           seeds the synthetic data, the weights and the shuffling (default 1)
  --strategy NAME    reduce gradients with this strategy, chosen at run time through
                     cohort::any_communicator (naive, flat, hierarchical, two_dimensional,
                     dummy); without it, flat, chosen at compile time
  --reducer R        how gradients are averaged: mean (default), or powersgd:RANK[:START], the
                     weight matrices sent as rank-RANK factors after START uncompressed steps
                     (default 0)
  --checkpoint DIR   resume from the newest checkpoint in DIR if there is one, and save one
                     every --checkpoint-every steps: killed and started again with the same
                     command, training goes on where the last checkpoint left it
  --checkpoint-every N  steps between checkpoints (default 50)
  --help             print this and exit
)";

using command_line::parse_value;
using command_line::usage_error;
using command_line::with_reducer;

struct options {
  int epochs = 3;
  std::size_t global_batch = 64;
  float lr = 0.02f;
  float momentum = 0.9f;
  std::size_t hidden = 64;
  std::string data_dir;
  std::optional<std::size_t> train_size;
  std::optional<std::size_t> test_size;
  std::uint64_t seed = 1;
  std::string strategy;
  std::string reducer = "mean";
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 50;
  bool help = false;
};

template <class T>
T parse_at_least(std::string_view flag, std::string_view text, T minimum) {
  const T value = parse_value<T>(flag, text);
  if (value < minimum) {
    throw usage_error(std::string(flag) + " must be at least " + std::to_string(minimum) +
                      ", not " + std::string(text));
  }
  return value;
}

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    std::optional<std::string_view> inline_value;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    const auto value = [&]() -> std::string_view {
      if (inline_value) {
        return *inline_value;
      }
      if (i + 1 >= argc) {
        throw usage_error(std::string(flag) + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--epochs") {
      o.epochs = parse_at_least(flag, value(), 1);
    } else if (flag == "--global-batch") {
      o.global_batch = parse_at_least<std::size_t>(flag, value(), 1);
    } else if (flag == "--lr") {
      o.lr = parse_value<float>(flag, value());
      if (!(o.lr > 0.0f)) {
        throw usage_error("--lr must be positive");
      }
    } else if (flag == "--momentum") {
      o.momentum = parse_value<float>(flag, value());
      if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
        throw usage_error("--momentum must be in [0, 1)");
      }
    } else if (flag == "--hidden") {
      o.hidden = parse_at_least<std::size_t>(flag, value(), 1);
    } else if (flag == "--data") {
      o.data_dir = std::string(value());
    } else if (flag == "--train-size") {
      o.train_size = parse_at_least<std::size_t>(flag, value(), 1);
    } else if (flag == "--test-size") {
      o.test_size = parse_at_least<std::size_t>(flag, value(), 1);
    } else if (flag == "--seed") {
      o.seed = parse_value<std::uint64_t>(flag, value());
    } else if (flag == "--strategy") {
      o.strategy = std::string(value());
    } else if (flag == "--reducer") {
      o.reducer = value();
    } else if (flag == "--checkpoint") {
#if defined(MNIST_MLP_CHECKPOINTS)
      o.checkpoint_dir = std::string(value());
#else
      throw usage_error("--checkpoint: built without xxHash, cohort cannot checkpoint");
#endif
    } else if (flag == "--checkpoint-every") {
      o.checkpoint_every = parse_at_least<std::uint64_t>(flag, value(), 1);
    } else {
      throw usage_error("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  return o;
}

mnist load_data(const options& o) {
  if (o.data_dir.empty()) {
    return make_synthetic(o.train_size.value_or(6000), o.test_size.value_or(1000), o.seed);
  }
  mnist data;
  data.train = read_mnist_split(o.data_dir, "train", o.train_size);
  data.test = read_mnist_split(o.data_dir, "t10k", o.test_size);
  return data;
}

// ---- training ----------------------------------------------------------------------------------

#if defined(MNIST_MLP_CHECKPOINTS)
// PowerSGD's state is the run's too: its Q (the same on every rank) and each rank's error
// feedback go in the checkpoint, so that a resumed run continues bit for bit.
template <class Checkpoints, class Reducer, class... State>
auto resume(Checkpoints& checkpoints, const Reducer& reducer, State&&... state) {
  if constexpr (std::is_same_v<Reducer, cohort::powersgd>) {
    return checkpoints.resume(state..., cohort::powersgd_replicated(reducer),
                              cohort::powersgd_errors(reducer));
  } else {
    return checkpoints.resume(state...);
  }
}

template <class Checkpoints, class Reducer, class... State>
void save(Checkpoints& checkpoints, const Reducer& reducer, std::uint64_t step, State&&... state) {
  if constexpr (std::is_same_v<Reducer, cohort::powersgd>) {
    checkpoints.save(step, state..., cohort::powersgd_replicated(reducer),
                     cohort::powersgd_errors(reducer));
  } else {
    checkpoints.save(step, state...);
  }
}
#endif

template <cohort::communicator Communicator, cohort::reducer Reducer>
int train(const options& o, Communicator& comm, const Reducer& reducer) {
  if (o.global_batch % static_cast<std::size_t>(comm.size()) != 0) {
    throw usage_error("--global-batch " + std::to_string(o.global_batch) +
                      " is not a multiple of the " + std::to_string(comm.size()) +
                      " ranks: each rank takes global-batch / ranks examples per step");
  }
  const std::size_t local_batch = o.global_batch / static_cast<std::size_t>(comm.size());
  const bool report = comm.rank() == 0;

  // cohort change 3/4: only rank 0 reads (or makes up) the data, and scatter_dataset sends every
  // rank its own shard. Training shards have equal lengths, so that every rank runs the same
  // number of steps (a rank short of a step would leave the others waiting in the all-reduce);
  // test shards are an exact partition, so that each test example is counted once.
  dataset train_set;
  dataset test_set;
  if (comm.rank() == 0) {
    auto data = load_data(o);
    train_set = std::move(data.train);
    test_set = std::move(data.test);
  }
  auto train_shard = cohort::scatter_dataset(
      train_set, comm, {.shuffle = true, .seed = o.seed, .force_equal_length = true});
  const auto test_shard = cohort::scatter_dataset(test_set, comm, {.force_equal_length = false});
  // The root's copy of the whole dataset is no longer needed.
  train_set = {};
  test_set = {};

  mlp model(o.hidden, o.seed);
  std::vector<parameter> params = model.parameters();

  // cohort change 2/4: the optimizer is wrapped. Construction copies rank 0's weights to every
  // rank, and step() replaces each rank's gradient by the mean over the ranks before stepping,
  // so that every replica takes the same step.
  // The reducer is part of the type too: PowerSGD (--reducer powersgd:R) is chosen at compile
  // time like the strategy, and composes with it.
  cohort::distributed_optimizer<sgd, Communicator, Reducer> opt{
      sgd{o.lr, o.momentum, params}, comm, params, {}, reducer};

  if (report) {
    std::printf("mnist_mlp: %d rank(s), global batch %zu (%zu per rank), %zu hidden units, %s, "
                "reducer %s\n",
                comm.size(), o.global_batch, local_batch, o.hidden,
                o.data_dir.empty() ? "synthetic data" : o.data_dir.c_str(), o.reducer.c_str());
    std::fflush(stdout);
  }

  // Where training is: the step over the whole run, and the epoch and the step within it.
  std::uint64_t step = 0;
  std::uint64_t epoch_begin = 0;
  std::uint64_t steps_done_in_epoch = 0;
#if defined(MNIST_MLP_CHECKPOINTS)
  // The state a checkpoint keeps: the weights, the optimizer's momentum and the position in the
  // data (the shuffling is the seed's and the epoch's, so no random engine is needed).
  std::optional<cohort::checkpointer<Communicator>> checkpoints;
  cohort::data_position position;
  if (!o.checkpoint_dir.empty()) {
    checkpoints.emplace(comm, o.checkpoint_dir);
    if (const auto resumed = resume(*checkpoints, reducer, params,
                                    cohort::serialized(opt.inner().velocity()), position)) {
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
    const auto epoch_start = std::chrono::steady_clock::now();
    train_shard.set_epoch(static_cast<std::uint64_t>(epoch));
    cohort::local_metrics metrics;
    for (std::size_t begin = steps_done_in_epoch * local_batch; begin < train_shard.size();
         begin += local_batch) {
      const std::size_t end = std::min(train_shard.size(), begin + local_batch);
      const auto batch = static_cast<float>(end - begin);
      model.zero_grad();
      for (std::size_t i = begin; i < end; ++i) {
        const prediction p = model.train(train_shard[i], 1.0f / batch);
        metrics.add("loss", p.loss);
        metrics.add("accuracy", p.correct ? 1.0 : 0.0);
      }
      opt.step();
      ++step;
#if defined(MNIST_MLP_CHECKPOINTS)
      if (checkpoints && step % o.checkpoint_every == 0) {
        // After the epoch's last step, the next epoch's start: a resume begins there, not in an
        // epoch with no step left (whose metrics would be empty).
        position =
            end == train_shard.size()
                ? cohort::data_position{static_cast<std::uint64_t>(epoch) + 1, 0}
                : cohort::data_position{static_cast<std::uint64_t>(epoch), begin / local_batch + 1};
        save(*checkpoints, reducer, step, params, cohort::serialized(opt.inner().velocity()),
             position);
      }
#endif
    }
    steps_done_in_epoch = 0;
    // cohort change 4/4: metrics are averaged over all ranks' samples, not over this rank's.
    const auto global = cohort::allreduce_mean(comm, metrics);
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - epoch_start;
    if (report) {
      std::printf("epoch %d/%d: train loss %.4f, train accuracy %.4f, %.2f s\n", epoch + 1,
                  o.epochs, global.at("loss"), global.at("accuracy"), seconds.count());
    }
    report_grad_sync(comm, report); // collective: every rank
  }
  const std::chrono::duration<double> training_seconds = std::chrono::steady_clock::now() - start;

  // A rank whose test shard is empty (fewer test examples than ranks) adds no metric at all;
  // allreduce_mean counts it as contributing nothing.
  cohort::local_metrics test_metrics;
  for (std::size_t i = 0; i < test_shard.size(); ++i) {
    const prediction p = model.evaluate(test_shard[i]);
    test_metrics.add("loss", p.loss);
    test_metrics.add("accuracy", p.correct ? 1.0 : 0.0);
  }
  // cohort change 4/4: weighted by each rank's number of test examples, so the accuracy is that
  // of the whole test set even when the shards differ in size.
  const auto test = cohort::allreduce_mean(comm, test_metrics);
  if (report) {
    std::printf("training took %.2f s; test loss %.4f\n", training_seconds.count(),
                test.at("loss"));
    std::printf("test accuracy: %.4f\n", test.at("accuracy"));
#if defined(MNIST_MLP_CHECKPOINTS)
    // What a resumed run must end with, bit for bit, to be the run that was not interrupted.
    cohort::checkpoint::checksum weights;
    for (const parameter& p : params) {
      weights.update(std::as_bytes(std::span(*p.value)));
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
  // cohort change 1/4: the program starts MPI (it owns the environment, for as long as cohort is
  // used) and picks a gradient-reduction strategy at compile time: flat fuses the small gradients
  // into buckets, one all-reduce each, and reduces the large ones in place.
  boost::mpi::environment env{argc, argv};
  const boost::mpi::communicator world;

  try {
    const options o = parse_options(argc, argv);
    if (o.help) {
      if (world.rank() == 0) {
        std::fputs(usage.data(), stdout);
      }
      return 0;
    }
    if (o.strategy.empty()) {
      auto comm = cohort::make_communicator<cohort::flat>();
      return with_reducer(o.reducer, [&](const auto& reducer) { return train(o, comm, reducer); });
    }
    // Or at run time, by name (an unknown name throws on every rank, listing the known ones).
    std::optional<cohort::any_communicator> comm;
    try {
      comm.emplace(o.strategy);
    } catch (const cohort::invalid_argument& e) {
      throw usage_error(std::string("--strategy: ") + e.what());
    }
    return with_reducer(o.reducer, [&](const auto& reducer) { return train(o, *comm, reducer); });
  } catch (const usage_error& e) {
    if (world.rank() == 0) {
      std::fprintf(stderr, "mnist_mlp: %s\n\n%s", e.what(), usage.data());
    }
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_mlp: rank %d: %s\n", world.rank(), e.what());
    // A failure on one rank (an unreadable file on rank 0, say) leaves the others waiting in a
    // collective forever: take them all down instead.
    if (world.size() > 1) {
      env.abort(1);
    }
    return 1;
  }
}
