// SPDX-License-Identifier: Apache-2.0
// The ring collectives against MPI's own (the oracle), for every dtype, awkward sizes and rank
// counts, with chunks of the default size and of a single element (many chunks on tiny inputs).
#define BOOST_TEST_MODULE algorithm.ring
#include <cohort/algorithm/ring.hpp>
#include <cohort/tensor/std.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstdint>
#include <tuple>
#include <vector>

#include "support/fill.hpp"
#include "support/mpi_test_main.hpp"

namespace algorithm = cohort::algorithm;
using cohort::test::as_double;

namespace {
boost::mpi::communicator ring_comm() {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  cohort::mpi::return_errors(dup);
  return boost::mpi::communicator(dup, boost::mpi::comm_take_ownership);
}

std::vector<std::size_t> sizes(int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  // Fewer elements than ranks (empty blocks), not divisible by the rank count, larger than a chunk.
  return {0, 1, n > 1 ? n - 1 : 2, n + 1, 5 * n + 1, 1000};
}

// Chunks of one element, all in flight (the default) or in windows of one, two and three: a send
// waiting on the one a window before it, every message's order kept.
const algorithm::ring_options option_sets[] = {{},
                                               {.chunk_bytes = 1},
                                               {.chunk_bytes = 1, .window = 1},
                                               {.chunk_bytes = 1, .window = 2},
                                               {.chunk_bytes = 1, .window = 3},
                                               {.chunk_bytes = 24},
                                               {.chunk_bytes = 24, .window = 1}};
} // namespace

using element_types = std::tuple<float, double, cohort::float16, cohort::bfloat16, std::int32_t,
                                 std::int64_t, std::uint8_t>;

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_equals_mpi, T, element_types) {
  const auto comm = ring_comm();
  algorithm::ring_workspace workspace;
  for (const auto& options : option_sets) {
    for (const std::size_t n : sizes(comm.size())) {
      for (const auto op : {cohort::reduce_op::sum, cohort::reduce_op::max}) {
        auto ring = cohort::test::filled<T>(n, comm.rank());
        auto oracle = ring;
        algorithm::ring_allreduce(comm, cohort::make_view(ring), op, options, workspace);
        cohort::mpi::allreduce(comm, cohort::make_view(oracle), op);
        for (std::size_t i = 0; i < n; ++i) {
          BOOST_TEST_REQUIRE(as_double(ring[i]) == as_double(oracle[i]),
                             "n " << n << " element " << i << " chunk " << options.chunk_bytes
                                  << " window " << options.window);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_and_allgather_alone) {
  const auto comm = ring_comm();
  algorithm::ring_workspace workspace;
  for (const auto& options : option_sets) {
    for (const std::size_t n : sizes(comm.size())) {
      auto data = cohort::test::filled<double>(n, comm.rank());
      algorithm::ring_reduce_scatter(comm, cohort::make_view(data), cohort::reduce_op::sum, options,
                                     workspace);
      const auto [begin, count] = algorithm::ring_block(n, comm.size(), comm.rank());
      for (std::size_t i = begin; i < begin + count; ++i) {
        BOOST_TEST_REQUIRE(data[i] == cohort::test::closed_form_sum(i, comm.size()));
      }
      // Each rank's own block, everything else garbage: the all-gather fills it in.
      std::vector<double> gathered(n, -1.0);
      for (std::size_t i = begin; i < begin + count; ++i) {
        gathered[i] = static_cast<double>(i) * 3;
      }
      algorithm::ring_allgather(comm, cohort::make_view(gathered), options, workspace);
      for (std::size_t i = 0; i < n; ++i) {
        BOOST_TEST_REQUIRE(gathered[i] == static_cast<double>(i) * 3);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(blocks_partition_the_data) {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{17}}) {
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto [begin, count] = algorithm::ring_block(n, ranks, r);
        BOOST_TEST(begin == next);
        next = begin + count;
      }
      BOOST_TEST(next == n);
    }
  }
}
