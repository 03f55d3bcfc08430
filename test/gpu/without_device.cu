// SPDX-License-Identifier: Apache-2.0
// What the GPU strategies decide before they touch a GPU, so that it runs on any machine:
// single_node refuses to span nodes (run with COHORT_RANKS_PER_NODE=1, every rank its own
// simulated node), cuda_aware_flat refuses an MPI that is not CUDA-aware, the ranks agree on a
// device parameter broadcast before anything moves, and what NCCL's results lead to (poll,
// throw, abort; finalize or abort).
#define BOOST_TEST_MODULE gpu.without_device
#include <cohort/nccl.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "support/mpi_test_main.hpp"

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
} // namespace

BOOST_AUTO_TEST_CASE(across_nodes_is_an_error_naming_the_node_count) {
  const boost::mpi::communicator world;
  if (world.size() < 2) {
    return;
  }
  BOOST_CHECK_EXCEPTION((void)cohort::single_node{world}, cohort::invalid_argument,
                        [&](const cohort::invalid_argument& e) {
                          return contains(e.what(),
                                          "are on " + std::to_string(world.size()) + " nodes");
                        });
}

BOOST_AUTO_TEST_CASE(cuda_aware_flat_needs_a_cuda_aware_mpi) {
  if (cohort::mpi_is_cuda_aware()) {
    return; // an MPI that can read GPU memory: the GPU tests exercise it
  }
  BOOST_CHECK_EXCEPTION((void)cohort::cuda_aware_flat{boost::mpi::communicator()},
                        cohort::invalid_argument, [](const cohort::invalid_argument& e) {
                          return contains(e.what(), "not CUDA-aware") &&
                                 contains(e.what(), "host_staged");
                        });
}

// ---- what follows an NCCL result ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(in_progress_is_polled_until_the_limit_then_aborted) {
  using cohort::nccl::detail::next_after;
  using next = cohort::nccl::detail::nccl_next;
  BOOST_CHECK(next_after(ncclSuccess, false) == next::proceed);
  BOOST_CHECK(next_after(ncclSuccess, true) == next::proceed); // done is done, however late
  BOOST_CHECK(next_after(ncclInProgress, false) == next::poll);
  BOOST_CHECK(next_after(ncclInProgress, true) == next::abort);
}

BOOST_AUTO_TEST_CASE(an_invalid_argument_leaves_the_communicator_and_every_other_error_aborts) {
  using cohort::nccl::detail::next_after;
  using next = cohort::nccl::detail::nccl_next;
  BOOST_CHECK(next_after(ncclInvalidArgument, false) == next::fail_intact);
  for (const ncclResult_t fatal : {ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
                                   ncclInvalidUsage, ncclRemoteError}) {
    BOOST_CHECK_MESSAGE(next_after(fatal, false) == next::abort,
                        "result " << static_cast<int>(fatal));
    BOOST_CHECK_MESSAGE(next_after(fatal, true) == next::abort,
                        "result " << static_cast<int>(fatal));
  }
}

BOOST_AUTO_TEST_CASE(only_a_communicator_in_success_is_finalized) {
  using cohort::nccl::detail::before_finalize;
  using step = cohort::nccl::detail::teardown;
  BOOST_CHECK(before_finalize(ncclSuccess, false) == step::finalize);
  BOOST_CHECK(before_finalize(ncclSuccess, true) == step::finalize);
  // Work still being handed to the device: wait for it, within the limit.
  BOOST_CHECK(before_finalize(ncclInProgress, false) == step::poll);
  BOOST_CHECK(before_finalize(ncclInProgress, true) == step::abort);
  // A communicator in error is aborted, never finalized.
  for (const ncclResult_t failed : {ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
                                    ncclInvalidArgument, ncclInvalidUsage, ncclRemoteError}) {
    BOOST_CHECK_MESSAGE(before_finalize(failed, false) == step::abort,
                        "state " << static_cast<int>(failed));
  }
}

BOOST_AUTO_TEST_CASE(a_timeout_names_the_operation_the_rank_the_limit_and_the_time_waited) {
  const std::string message = cohort::nccl::detail::timeout_message(
      "allreduce_grad", 3, std::chrono::milliseconds(2000), std::chrono::milliseconds(2046));
  BOOST_CHECK_MESSAGE(contains(message, "allreduce_grad on rank 3"), message);
  BOOST_CHECK(contains(message, "2000 ms"));
  BOOST_CHECK(contains(message, "waited 2046 ms"));
  BOOST_CHECK(contains(message, "aborted"));
}

// ---- the agreement before a device parameter broadcast --------------------------------------
// The pointers below are never read: the ranks must find their disagreement before anything
// moves, which is what these tests check (without a GPU, any copy would fail).

namespace {
// A device address that is never dereferenced.
template <class T>
T* nowhere() {
  return reinterpret_cast<T*>(std::uintptr_t{1} << 20);
}

template <class Strategy, class T>
void broadcast_one_device_parameter(Strategy& comm) {
  cohort::device_span<T> value(nowhere<T>(), 4);
  cohort::device_span<T> grad(nowhere<T>(), 4);
  std::vector<cohort::parameter_ref<cohort::device_span<T>>> params{{"w", &value, &grad}};
  comm.broadcast_parameters(params, 0);
}

// Rank 0 passes float32 values, the others float64: every rank throws mismatch_error naming the
// parameter and both dtypes.
template <class Strategy>
void check_dtype_mismatch() {
  Strategy comm{boost::mpi::communicator()};
  BOOST_CHECK_EXCEPTION((comm.rank() == 0 ? broadcast_one_device_parameter<Strategy, float>(comm)
                                          : broadcast_one_device_parameter<Strategy, double>(comm)),
                        cohort::mismatch_error, [](const cohort::mismatch_error& e) {
                          return contains(e.what(), "parameter 'w'") &&
                                 contains(e.what(), "float32") && contains(e.what(), "float64");
                        });
}
} // namespace

BOOST_AUTO_TEST_CASE(device_parameters_of_different_dtypes_are_a_mismatch_on_every_rank) {
  if (boost::mpi::communicator().size() < 2) {
    return;
  }
  check_dtype_mismatch<cohort::host_staged>();
  check_dtype_mismatch<cohort::hierarchical<cohort::nccl_links>>();
  check_dtype_mismatch<cohort::two_dimensional<cohort::nccl_links>>();
}

BOOST_AUTO_TEST_CASE(parameters_in_host_memory_on_one_rank_only_are_a_mismatch_on_every_rank) {
  cohort::host_staged comm{boost::mpi::communicator()};
  if (comm.size() < 2) {
    return;
  }
  std::vector<float> host_value(4), host_grad(4);
  std::vector<cohort::parameter_ref<std::vector<float>>> host_params{
      {"w", &host_value, &host_grad}};
  // The last rank takes the host path, the others the device path: they must not meet in
  // different collectives.
  BOOST_CHECK_EXCEPTION((comm.rank() == comm.size() - 1
                             ? comm.broadcast_parameters(host_params, 0)
                             : broadcast_one_device_parameter<cohort::host_staged, float>(comm)),
                        cohort::mismatch_error, [](const cohort::mismatch_error& e) {
                          return contains(e.what(), "parameter 'w'") &&
                                 contains(e.what(), "device memory");
                        });
}

BOOST_AUTO_TEST_CASE(a_parameter_set_partly_in_host_memory_fails_on_every_rank) {
  cohort::host_staged comm{boost::mpi::communicator()};
  std::vector<float> host(4);
  const auto on = [&](cohort::memory_location where) {
    return cohort::tensor_view{where == cohort::memory_location::host
                                   ? static_cast<void*>(host.data())
                                   : static_cast<void*>(nowhere<float>()),
                               4, cohort::dtype::float32, where};
  };
  // Rank 0's second value is in host memory; everyone else's are all on the device.
  cohort::tensor_view a = on(cohort::memory_location::device);
  cohort::tensor_view b =
      on(comm.rank() == 0 ? cohort::memory_location::host : cohort::memory_location::device);
  cohort::tensor_view ga = a, gb = b;
  std::vector<cohort::parameter_ref<cohort::tensor_view>> params{{"a", &a, &ga}, {"b", &b, &gb}};
  // Rank 0 has the problem; the others learn it in the agreement, before anything moves.
  BOOST_CHECK_EXCEPTION(
      comm.broadcast_parameters(params, 0), cohort::error, [&](const cohort::error& e) {
        return contains(e.what(), "parameter 'b'") && contains(e.what(), "host memory");
      });
}

BOOST_AUTO_TEST_CASE(parameters_in_host_memory_go_through_mpi_on_a_device_strategy) {
  cohort::host_staged comm{boost::mpi::communicator()};
  std::vector<float> value(5, static_cast<float>(comm.rank() + 1)), grad(5);
  std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &value, &grad}};
  comm.broadcast_parameters(params, comm.size() - 1);
  BOOST_CHECK(value == std::vector<float>(5, static_cast<float>(comm.size())));
}

BOOST_AUTO_TEST_CASE(nvtx_ranges_cover_every_span_in_a_program_that_includes_cohort_nccl) {
  // <cohort/trace/nvtx.hpp> came in with <cohort/nccl.hpp>: every span of the trace, here a host
  // strategy's step, opens an NVTX range, which with no tool attached costs a null check.
  BOOST_CHECK(cohort::installed_profiler_ranges.start == &cohort::detail::nvtx_start);
  BOOST_CHECK(cohort::installed_profiler_ranges.end == &cohort::detail::nvtx_end);
  auto comm = cohort::make_communicator<cohort::flat>();
  std::vector<float> value(1000), grad(1000, 1.0f);
  std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &value, &grad}};
  comm.allreduce_grad(params, cohort::sum{});
  BOOST_CHECK_EQUAL(grad[999], static_cast<float>(comm.size()));
}
