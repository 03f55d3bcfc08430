// SPDX-License-Identifier: Apache-2.0
// A trainer in miniature: one parameter, the mean of the ranks' gradients, one step.
#include <cohort/cohort.hpp>
#if defined(CONSUMER_WITH_NCCL)
#include <cohort/transport/nccl.hpp> // the nccl component's headers and library are there
#endif
#if defined(CONSUMER_WITH_EIGEN)
#include <cohort/adapters/eigen.hpp>
#endif
#if defined(CONSUMER_WITH_TORCH)
#include <cohort/adapters/torch.hpp>
#endif
#if defined(CONSUMER_WITH_CHECKPOINT)
#include <cohort/checkpoint.hpp>

#include <filesystem>
#include <string>
#endif

#include <boost/mpi/environment.hpp>

#include <cstdio>
#include <unistd.h>
#include <vector>

namespace {
struct sgd {
  std::vector<float>* w;
  std::vector<float>* g;
  void step() {
    for (std::size_t i = 0; i < w->size(); ++i) {
      (*w)[i] -= (*g)[i];
    }
  }
};
} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv};
  auto comm = cohort::make_communicator<cohort::flat>();
  std::vector<float> w(4, 10.0f * static_cast<float>(comm.rank())), g(4);
  std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &w, &g}};
  cohort::distributed_optimizer opt{sgd{&w, &g}, comm, params};
  g.assign(4, static_cast<float>(comm.rank() + 1));
  opt.step();
  // Rank 0's start (0) minus the mean of 1..n.
  const float expected = -static_cast<float>(comm.size() + 1) / 2;
#if defined(CONSUMER_WITH_NCCL)
  (void)&cohort::nccl::datatype;
#endif
#if defined(CONSUMER_WITH_EIGEN)
  Eigen::VectorXf e = Eigen::VectorXf::Constant(3, 1.0f);
  comm.allreduce(e, cohort::reduce_op::sum);
  if (e(2) != static_cast<float>(comm.size())) {
    std::fprintf(stderr, "consumer: rank %d: Eigen sum %f\n", comm.rank(), e(2));
    return 1;
  }
#endif
#if defined(CONSUMER_WITH_TORCH)
  at::Tensor t = torch::ones({3}, torch::kFloat64);
  comm.allreduce(t, cohort::reduce_op::sum);
  if (t[2].item<double>() != comm.size()) {
    std::fprintf(stderr, "consumer: rank %d: LibTorch sum %f\n", comm.rank(), t[2].item<double>());
    return 1;
  }
#endif
  if (w[0] != expected) {
    std::fprintf(stderr, "consumer: rank %d got %f, expected %f\n", comm.rank(), w[0], expected);
    return 1;
  }
#if defined(CONSUMER_WITH_CHECKPOINT)
  {
    const std::string dir = comm.bcast_obj(
        (std::filesystem::temp_directory_path() / ("consumer-ckpt-" + std::to_string(::getpid())))
            .string());
    cohort::checkpointer ckpt{comm, dir};
    ckpt.save(1, params);
    w.assign(4, 0.0f);
    if (ckpt.resume(params) != 1u || w[0] != expected) {
      std::fprintf(stderr, "consumer: rank %d: the checkpoint did not resume\n", comm.rank());
      return 1;
    }
    comm.barrier();
    if (comm.rank() == 0) {
      std::filesystem::remove_all(dir);
    }
  }
#endif
  if (comm.rank() == 0) {
    std::printf("consumer ok: %d ranks\n", comm.size());
  }
  return 0;
}
