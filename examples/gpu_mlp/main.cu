// SPDX-License-Identifier: Apache-2.0

// The MNIST MLP of examples/mnist_mlp with its weights, gradients and arithmetic on the GPU:
// plain CUDA kernels for a 784-hidden-10 perceptron, written for one GPU, then made data-parallel
// by the same four changes (marked "cohort change n/4"). The strategy is a type: pure_nccl
// (NCCL, the default) or, with --strategy host_staged, pinned host memory and MPI for an MPI that
// is not CUDA-aware. One GPU per rank:
//
//   mpirun -np <GPUs> ./gpu_mlp [--strategy pure_nccl|host_staged] [--data ~/mnist] ...

#include <cohort/nccl.hpp>

#include <boost/mpi/environment.hpp>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../common/grad_sync_report.hpp"
#include "../common/mnist_data.hpp"

namespace {

using namespace mnist_data;
using cohort::cuda::check;

// ---- the model's kernels: one thread per output element, grid-stride loops ---------------------

__device__ inline std::size_t thread_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t thread_count() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// out[b][o] = bias[o] + sum_i w[o][i] in[b][i], then ReLU if asked.
__global__ void dense(const float* in, const float* w, const float* bias, float* out,
                      std::size_t batch, std::size_t inputs, std::size_t outputs, bool relu) {
  for (std::size_t t = thread_index(); t < batch * outputs; t += thread_count()) {
    const std::size_t b = t / outputs;
    const std::size_t o = t % outputs;
    float sum = bias[o];
    for (std::size_t i = 0; i < inputs; ++i) {
      sum += w[o * inputs + i] * in[b * inputs + i];
    }
    out[t] = relu ? fmaxf(sum, 0.0f) : sum;
  }
}

// Softmax cross-entropy per example: the loss, whether the arg-max is right, and
// d loss / d logits = (softmax - one_hot) / batch, written over the logits.
__global__ void softmax_cross_entropy(float* logits, const int* labels, float* loss, int* correct,
                                      std::size_t batch) {
  for (std::size_t b = thread_index(); b < batch; b += thread_count()) {
    float* z = logits + b * classes;
    int best = 0;
    for (int k = 1; k < static_cast<int>(classes); ++k) {
      best = z[k] > z[best] ? k : best;
    }
    const float top = z[best];
    float total = 0.0f;
    for (std::size_t k = 0; k < classes; ++k) {
      total += expf(z[k] - top);
    }
    loss[b] = logf(total) - (z[labels[b]] - top);
    correct[b] = best == labels[b] ? 1 : 0;
    for (std::size_t k = 0; k < classes; ++k) {
      z[k] = (expf(z[k] - top) / total - (static_cast<int>(k) == labels[b] ? 1.0f : 0.0f)) /
             static_cast<float>(batch);
    }
  }
}

// Weight and bias gradients of a dense layer: gw[o][i] = sum_b d[b][o] in[b][i], gb[o] = sum_b d.
__global__ void dense_grad(const float* in, const float* d, float* gw, float* gb, std::size_t batch,
                           std::size_t inputs, std::size_t outputs) {
  for (std::size_t t = thread_index(); t < outputs * (inputs + 1); t += thread_count()) {
    const std::size_t o = t / (inputs + 1);
    const std::size_t i = t % (inputs + 1);
    float sum = 0.0f;
    for (std::size_t b = 0; b < batch; ++b) {
      sum += d[b * outputs + o] * (i == inputs ? 1.0f : in[b * inputs + i]);
    }
    (i == inputs ? gb[o] : gw[o * inputs + i]) = sum;
  }
}

// The gradient reaching the hidden layer: dh[b][j] = sum_k d[b][k] w2[k][j], where h > 0.
__global__ void hidden_grad(const float* d, const float* w2, const float* h, float* dh,
                            std::size_t batch, std::size_t hidden) {
  for (std::size_t t = thread_index(); t < batch * hidden; t += thread_count()) {
    const std::size_t b = t / hidden;
    const std::size_t j = t % hidden;
    float sum = 0.0f;
    for (std::size_t k = 0; k < classes; ++k) {
      sum += d[b * classes + k] * w2[k * hidden + j];
    }
    dh[t] = h[t] > 0.0f ? sum : 0.0f;
  }
}

// v = momentum v + g; w -= lr v.
__global__ void sgd_update(float* w, const float* g, float* v, std::size_t n, float lr,
                           float momentum) {
  for (std::size_t i = thread_index(); i < n; i += thread_count()) {
    v[i] = momentum * v[i] + g[i];
    w[i] -= lr * v[i];
  }
}

unsigned blocks(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 4096));
}

// ---- device memory ---------------------------------------------------------------------------

template <class T>
class device_vector {
public:
  explicit device_vector(std::size_t n, const T* from = nullptr)
      : count_(n) {
    check(cudaMalloc(&data_, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    if (from != nullptr) {
      upload(from, n);
    } else {
      check(cudaMemset(data_, 0, n * sizeof(T)), "cudaMemset");
    }
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { (void)cudaFree(data_); }

  void upload(const T* from, std::size_t n) {
    check(cudaMemcpy(data_, from, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<T> download(std::size_t n) const {
    std::vector<T> host(n);
    check(cudaMemcpy(host.data(), data_, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return host;
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  cohort::device_span<T> span() const noexcept { return {data_, count_}; }

private:
  T* data_ = nullptr;
  std::size_t count_;
};

using parameter = cohort::parameter_ref<cohort::device_span<float>>;

class mlp {
public:
  mlp(std::size_t hidden, std::size_t max_batch, std::uint64_t seed)
      : hidden_(hidden)
      , w1_(hidden * image_pixels, initial(hidden * image_pixels, image_pixels, seed).data())
      , b1_(hidden)
      , w2_(classes * hidden, initial(classes * hidden, hidden, seed + 1).data())
      , b2_(classes)
      , gw1_(w1_.size())
      , gb1_(b1_.size())
      , gw2_(w2_.size())
      , gb2_(b2_.size())
      , x_(max_batch * image_pixels)
      , labels_(max_batch)
      , h_(max_batch * hidden)
      , dh_(max_batch * hidden)
      , z_(max_batch * classes)
      , loss_(max_batch)
      , correct_(max_batch) {
    spans_ = {w1_.span(), gw1_.span(), b1_.span(), gb1_.span(),
              w2_.span(), gw2_.span(), b2_.span(), gb2_.span()};
    params_ = {{"fc1.weight", &spans_[0], &spans_[1]},
               {"fc1.bias", &spans_[2], &spans_[3]},
               {"fc2.weight", &spans_[4], &spans_[5]},
               {"fc2.bias", &spans_[6], &spans_[7]}};
  }

  std::vector<parameter>& parameters() noexcept { return params_; }

  // Forward (and, when training, backward into the gradients) over one batch; returns the
  // per-example losses and whether each was classified right.
  std::pair<std::vector<float>, std::vector<int>> run(const dataset& data, std::size_t begin,
                                                      std::size_t end, bool train) {
    const std::size_t batch = end - begin;
    std::vector<float> pixels(batch * image_pixels);
    std::vector<int> labels(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      std::copy(data[begin + b].pixels.begin(), data[begin + b].pixels.end(),
                pixels.begin() + static_cast<std::ptrdiff_t>(b * image_pixels));
      labels[b] = data[begin + b].label;
    }
    x_.upload(pixels.data(), pixels.size());
    labels_.upload(labels.data(), batch);
    dense<<<blocks(batch * hidden_), 256>>>(x_.data(), w1_.data(), b1_.data(), h_.data(), batch,
                                            image_pixels, hidden_, true);
    dense<<<blocks(batch * classes), 256>>>(h_.data(), w2_.data(), b2_.data(), z_.data(), batch,
                                            hidden_, classes, false);
    softmax_cross_entropy<<<blocks(batch), 256>>>(z_.data(), labels_.data(), loss_.data(),
                                                  correct_.data(), batch);
    if (train) {
      dense_grad<<<blocks(classes * (hidden_ + 1)), 256>>>(h_.data(), z_.data(), gw2_.data(),
                                                           gb2_.data(), batch, hidden_, classes);
      hidden_grad<<<blocks(batch * hidden_), 256>>>(z_.data(), w2_.data(), h_.data(), dh_.data(),
                                                    batch, hidden_);
      dense_grad<<<blocks(hidden_ * (image_pixels + 1)), 256>>>(
          x_.data(), dh_.data(), gw1_.data(), gb1_.data(), batch, image_pixels, hidden_);
    }
    check(cudaGetLastError(), "kernel launch");
    return {loss_.download(batch), correct_.download(batch)};
  }

private:
  static std::vector<float> initial(std::size_t n, std::size_t fan_in, std::uint64_t seed) {
    std::mt19937_64 engine(seed ^ 0x5eed'0f'ba5e'ba11ull);
    const float bound = std::sqrt(6.0f / static_cast<float>(fan_in)); // He-uniform
    std::vector<float> w(n);
    for (auto& v : w) {
      v = uniform(engine, -bound, bound);
    }
    return w;
  }

  std::size_t hidden_;
  device_vector<float> w1_, b1_, w2_, b2_, gw1_, gb1_, gw2_, gb2_;
  device_vector<float> x_;
  device_vector<int> labels_;
  device_vector<float> h_, dh_, z_, loss_;
  device_vector<int> correct_;
  std::vector<cohort::device_span<float>> spans_;
  std::vector<parameter> params_;
};

// SGD with momentum on the device, on the default stream (the one cohort orders itself after).
class sgd {
public:
  sgd(float lr, float momentum, std::vector<parameter>& params)
      : lr_(lr)
      , momentum_(momentum)
      , params_(&params) {
    for (const auto& p : params) {
      velocity_.push_back(std::make_unique<device_vector<float>>(p.value->size()));
    }
  }
  void step() {
    for (std::size_t n = 0; n < params_->size(); ++n) {
      const auto& p = (*params_)[n];
      sgd_update<<<blocks(p.value->size()), 256>>>(
          p.value->data(), p.grad->data(), velocity_[n]->data(), p.value->size(), lr_, momentum_);
    }
    check(cudaGetLastError(), "sgd_update");
  }

private:
  float lr_;
  float momentum_;
  std::vector<parameter>* params_;
  std::vector<std::unique_ptr<device_vector<float>>> velocity_;
};

// ---- command line ----------------------------------------------------------------------------

struct options {
  std::string strategy = "pure_nccl";
  int epochs = 3;
  std::size_t global_batch = 64;
  float lr = 0.02f;
  float momentum = 0.9f;
  std::size_t hidden = 64;
  std::string data_dir;
  std::size_t train_size = 6000;
  std::size_t test_size = 1000;
  std::uint64_t seed = 1;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) {
      throw std::invalid_argument("unknown flag or missing value: " + std::string(flag));
    }
    const std::string value = argv[++i];
    if (flag == "--strategy") {
      o.strategy = value;
    } else if (flag == "--epochs") {
      o.epochs = std::stoi(value);
    } else if (flag == "--global-batch") {
      o.global_batch = std::stoul(value);
    } else if (flag == "--lr") {
      o.lr = std::stof(value);
    } else if (flag == "--hidden") {
      o.hidden = std::stoul(value);
    } else if (flag == "--data") {
      o.data_dir = value;
    } else if (flag == "--train-size") {
      o.train_size = std::stoul(value);
    } else if (flag == "--test-size") {
      o.test_size = std::stoul(value);
    } else if (flag == "--seed") {
      o.seed = std::stoull(value);
    } else {
      throw std::invalid_argument("unknown flag " + std::string(flag) +
                                  " (known: --strategy pure_nccl|host_staged, --epochs, "
                                  "--global-batch, --lr, --hidden, --data, --train-size, "
                                  "--test-size, --seed)");
    }
  }
  if (o.strategy != "pure_nccl" && o.strategy != "host_staged") {
    throw std::invalid_argument("--strategy must be pure_nccl or host_staged, not " + o.strategy);
  }
  return o;
}

// ---- training --------------------------------------------------------------------------------

template <class Strategy>
int train(const options& o) {
  // cohort change 1/4: a communicator whose strategy is a type, and this rank's GPU chosen from
  // its index on its node.
  Strategy comm(boost::mpi::communicator{});
  cohort::cuda::select_device(comm.intra_rank());
  if (o.global_batch % static_cast<std::size_t>(comm.size()) != 0) {
    throw std::invalid_argument("--global-batch must be a multiple of the number of ranks");
  }
  const std::size_t local_batch = o.global_batch / static_cast<std::size_t>(comm.size());

  // cohort change 3/4: rank 0 reads or makes the data; every rank receives its own shard.
  dataset train_set;
  dataset test_set;
  if (comm.rank() == 0) {
    mnist data = o.data_dir.empty() ? make_synthetic(o.train_size, o.test_size, o.seed)
                                    : mnist{read_mnist_split(o.data_dir, "train", o.train_size),
                                            read_mnist_split(o.data_dir, "t10k", o.test_size)};
    train_set = std::move(data.train);
    test_set = std::move(data.test);
  }
  auto train_shard = cohort::scatter_dataset(train_set, comm, {.shuffle = true, .seed = o.seed});
  const auto test_shard = cohort::scatter_dataset(test_set, comm, {.force_equal_length = false});

  mlp model(o.hidden, local_batch, o.seed);
  // cohort change 2/4: the optimizer wrapped; rank 0's weights broadcast on the device.
  cohort::distributed_optimizer opt{sgd{o.lr, o.momentum, model.parameters()}, comm,
                                    model.parameters()};

  // Copies a shard into a dataset the model's batch loop reads.
  const auto materialise = [](const auto& shard) {
    dataset d;
    for (std::size_t i = 0; i < shard.size(); ++i) {
      d.push_back(shard[i]);
    }
    return d;
  };
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    train_shard.set_epoch(static_cast<std::uint64_t>(epoch));
    const dataset local = materialise(train_shard);
    cohort::local_metrics metrics;
    for (std::size_t begin = 0; begin < local.size(); begin += local_batch) {
      const std::size_t end = std::min(local.size(), begin + local_batch);
      const auto [loss, correct] = model.run(local, begin, end, true);
      for (std::size_t b = 0; b < loss.size(); ++b) {
        metrics.add("loss", loss[b]);
        metrics.add("accuracy", correct[b]);
      }
      opt.step();
    }
    // cohort change 4/4: metrics averaged over every rank's samples.
    const auto global = cohort::allreduce_mean(comm, metrics);
    if (comm.rank() == 0) {
      std::printf("epoch %d/%d: train loss %.4f, train accuracy %.4f\n", epoch + 1, o.epochs,
                  global.at("loss"), global.at("accuracy"));
      std::fflush(stdout);
    }
    // The epoch's gradient reductions (host time to enqueue them: a device strategy's work is
    // the device's).
    report_grad_sync(comm, comm.rank() == 0);
  }
  const dataset test = materialise(test_shard);
  cohort::local_metrics test_metrics;
  for (std::size_t begin = 0; begin < test.size(); begin += local_batch) {
    const auto [loss, correct] =
        model.run(test, begin, std::min(test.size(), begin + local_batch), false);
    for (std::size_t b = 0; b < loss.size(); ++b) {
      test_metrics.add("loss", loss[b]);
      test_metrics.add("accuracy", correct[b]);
    }
  }
  const auto global = cohort::allreduce_mean(comm, test_metrics);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  if (comm.rank() == 0) {
    std::printf("%s on %d GPU(s): %.2f s; test loss %.4f\ntest accuracy: %.4f\n",
                o.strategy.c_str(), comm.size(), seconds.count(), global.at("loss"),
                global.at("accuracy"));
  }
  if constexpr (requires { comm.finalize(); }) {
    comm.finalize(); // NCCL before the CUDA context goes
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv};
  try {
    const options o = parse(argc, argv);
    if (cohort::cuda::device_count() == 0) {
      std::fprintf(stderr,
                   "gpu_mlp: no CUDA device visible (examples/mnist_mlp runs on the host)\n");
      return 1;
    }
    // A run-time choice between two compile-time strategies: one branch per type.
    return o.strategy == "host_staged" ? train<cohort::host_staged>(o)
                                       : train<cohort::pure_nccl>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_mlp: rank %d: %s\n", boost::mpi::communicator().rank(), e.what());
    if (boost::mpi::communicator().size() > 1) {
      env.abort(1);
    }
    return 1;
  }
}
