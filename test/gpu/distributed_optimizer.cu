// SPDX-License-Identifier: Apache-2.0
// distributed_optimizer over every GPU strategy. Each combination is compiled as part of the
// build, on any machine (the build is the test that they fit together: the optimizer's parameter
// broadcast and gradient reduction on device memory); with one GPU per rank each is also run: the
// replicas start from the root's values and step with the mean of the gradients.
#define BOOST_TEST_MODULE gpu.distributed_optimizer
#include <cohort/nccl.hpp>
#include <cohort/training/distributed_optimizer.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/device_vector.hpp"

namespace {

using cohort::test::device_array;

// Counts its steps: what is checked is what the wrapper did to the values and gradients first.
struct counting_optimizer {
  int steps = 0;
  void step() { ++steps; }
};

// One rank's model on the device: values and gradients of mixed sizes (0, one element, more than
// a bucket of the packed broadcast), all equal to the rank at first.
class device_model {
public:
  explicit device_model(int rank) {
    const std::size_t sizes[] = {3, 0, 1, 20000};
    spans_.reserve(2 * std::size(sizes));
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      const std::vector<float> filled(sizes[i], static_cast<float>(rank));
      values_.push_back(std::make_unique<device_array<float>>(filled));
      grads_.push_back(std::make_unique<device_array<float>>(filled));
      spans_.push_back(values_.back()->span());
      spans_.push_back(grads_.back()->span());
      std::string name = "p"; // (GCC 12 warns falsely of "p" + std::to_string(i) here)
      name += std::to_string(i);
      params_.push_back({std::move(name), &spans_[2 * i], &spans_[2 * i + 1]});
    }
  }
  std::vector<cohort::parameter_ref<cohort::device_span<float>>>& parameters() { return params_; }

  // Every element of every value (or gradient) equals `expected`.
  bool values_are(float expected) const { return all_equal(values_, expected); }
  bool grads_are(float expected) const { return all_equal(grads_, expected); }

private:
  static bool all_equal(const std::vector<std::unique_ptr<device_array<float>>>& arrays,
                        float expected) {
    for (const auto& a : arrays) {
      for (const float x : a->read()) {
        if (x != expected) {
          return false;
        }
      }
    }
    return true;
  }

  std::vector<std::unique_ptr<device_array<float>>> values_, grads_;
  std::vector<cohort::device_span<float>> spans_;
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params_;
};

// Wraps an optimizer around `comm` (which broadcasts rank 0's values) and steps once (the mean
// of the gradients, then the inner step).
template <class Communicator>
void step_once(Communicator& comm) {
  device_model model(comm.rank());
  cohort::distributed_optimizer opt{counting_optimizer{}, comm, model.parameters()};
  BOOST_CHECK(model.values_are(0.0f));
  opt.step();
  BOOST_CHECK_EQUAL(opt.inner().steps, 1);
  BOOST_CHECK(model.grads_are(static_cast<float>(comm.size() - 1) / 2.0f));
}

template <class Strategy>
void step_once_with() {
  Strategy comm{boost::mpi::communicator()};
  step_once(comm);
}

// Whether every rank is on one node (single_node refuses anything else).
bool one_node() {
  return cohort::make_communicator<cohort::naive>().inter_size() == 1;
}

} // namespace

BOOST_AUTO_TEST_CASE(nccl_strategies) {
  step_once_with<cohort::pure_nccl>();
  if (one_node()) {
    step_once_with<cohort::single_node>();
  }
}

BOOST_TEST_DECORATOR(*boost::unit_test::label("mpi_on_device"))
BOOST_AUTO_TEST_CASE(mpi_strategies_on_device_memory) {
  step_once_with<cohort::host_staged>();
  if (cohort::mpi_is_cuda_aware()) {
    step_once_with<cohort::cuda_aware_flat>();
  }
}

BOOST_AUTO_TEST_CASE(two_level_strategies) {
  step_once_with<cohort::hierarchical<cohort::nccl_links, cohort::mpi_links>>();
  step_once_with<cohort::two_dimensional<cohort::nccl_links, cohort::mpi_links>>();
}

BOOST_AUTO_TEST_CASE(any_gpu_communicator_by_name) {
  for (const char* name : {"pure_nccl", "hierarchical", "two_dimensional", "host_staged"}) {
    BOOST_TEST_CHECKPOINT(name);
    cohort::any_gpu_communicator comm(name);
    step_once(comm);
  }
}

#include "gpu_mpi_main.hpp"
