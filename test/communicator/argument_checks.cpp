// SPDX-License-Identifier: Apache-2.0
// engine::argument_checks, in one process: each bad argument is an invalid_argument that names the
// call, this rank and both sizes, and the offsets of good blocks are where they begin. And a
// communicator made before MPI runs is an error that says what to do, not an abort inside MPI.
#define BOOST_TEST_MODULE communicator.argument_checks
#include <cohort/communicator/engine/argument_checks.hpp>
#include <cohort/communicator/flat.hpp>

#include <boost/test/unit_test.hpp>

#include <climits>
#include <cstddef>
#include <limits>
#include <vector>

#include "support/expect.hpp"

using cohort::const_tensor_view;
using cohort::dtype;
using cohort::memory_location;
using cohort::engine::argument_checks;
using cohort::test::message_has;

namespace {
const_tensor_view view(std::size_t count, dtype type = dtype::float32,
                       memory_location location = memory_location::host) {
  return {nullptr, count, type, location};
}
} // namespace

// Rank 1 of 3.
const argument_checks checks(1, 3);

BOOST_AUTO_TEST_CASE(a_rank_outside_the_communicator) {
  BOOST_CHECK_NO_THROW(checks.check_root(2, "broadcast"));
  BOOST_CHECK_EXCEPTION(
      checks.check_root(3, "broadcast"), cohort::invalid_argument,
      message_has({"broadcast on rank 1: root 3 is not a rank of this 3-rank communicator"}));
  BOOST_CHECK_EXCEPTION(checks.check_peer(-1, "send"), cohort::invalid_argument,
                        message_has({"send on rank 1: peer -1 is not a rank"}));
}

BOOST_AUTO_TEST_CASE(equal_blocks) {
  BOOST_CHECK_NO_THROW(checks.check_blocks(view(4), view(12), "allgather"));
  BOOST_CHECK_EXCEPTION(
      checks.check_blocks(view(4), view(11), "allgather"), cohort::invalid_argument,
      message_has({"allgather on rank 1", "4 elements", "needs 12", "it has 11"}));
  BOOST_CHECK_EXCEPTION(checks.check_blocks(view(4), view(12, dtype::float64), "allgather"),
                        cohort::invalid_argument,
                        message_has({"per-rank tensor is float32", "3-rank tensor is float64"}));
}

BOOST_AUTO_TEST_CASE(counted_blocks) {
  const std::vector<std::size_t> counts{2, 5, 0};
  BOOST_TEST(checks.check_counted_blocks(view(5), view(7), counts, "allgather") ==
                 std::vector<std::size_t>({0, 2, 7}),
             boost::test_tools::per_element());
  BOOST_CHECK_EXCEPTION(
      checks.check_counted_blocks(view(5), view(7), std::vector<std::size_t>{2, 5}, "allgather"),
      cohort::invalid_argument, message_has({"2 entries, not one per rank (3)"}));
  BOOST_CHECK_EXCEPTION(checks.check_counted_blocks(view(4), view(7), counts, "allgather"),
                        cohort::invalid_argument,
                        message_has({"has 4 elements, but this rank's count is 5"}));
  BOOST_CHECK_EXCEPTION(checks.check_counted_blocks(view(5), view(8), counts, "allgather"),
                        cohort::invalid_argument,
                        message_has({"add up to 7 elements, but the 3-rank tensor has 8"}));
  const std::size_t most = std::numeric_limits<std::size_t>::max();
  BOOST_CHECK_EXCEPTION(checks.check_counted_blocks(
                            view(5), view(7), std::vector<std::size_t>{most, 5, 0}, "allgather"),
                        cohort::invalid_argument, message_has({"more than a size_t holds"}));
}

BOOST_AUTO_TEST_CASE(variable_blocks_within_one_mpi_call) {
  const std::vector<std::size_t> counts{2, 5, 0};
  const auto [mpi_counts, offsets] =
      checks.check_variable_blocks(view(5), view(7), counts, "reduce_scatter");
  BOOST_TEST(mpi_counts == std::vector<int>({2, 5, 0}), boost::test_tools::per_element());
  BOOST_TEST(offsets == std::vector<int>({0, 2, 7}), boost::test_tools::per_element());
  const std::size_t big = static_cast<std::size_t>(INT_MAX);
  BOOST_CHECK_EXCEPTION(
      checks.check_variable_blocks(view(5), view(big + 6), std::vector<std::size_t>{big, 5, 1},
                                   "reduce_scatter"),
      cohort::invalid_argument, message_has({"more than one MPI call takes (INT_MAX"}));
}

BOOST_AUTO_TEST_CASE(an_exchange_in_equal_blocks) {
  BOOST_CHECK_NO_THROW(checks.check_exchange(view(6), view(6), "alltoall"));
  BOOST_CHECK_EXCEPTION(checks.check_exchange(view(6), view(6, dtype::int32), "alltoall"),
                        cohort::invalid_argument,
                        message_has({"input is float32 but the output is int32"}));
  BOOST_CHECK_EXCEPTION(checks.check_exchange(view(6), view(9), "alltoall"),
                        cohort::invalid_argument,
                        message_has({"input has 6 elements but the output has 9"}));
  BOOST_CHECK_EXCEPTION(checks.check_exchange(view(7), view(7), "alltoall"),
                        cohort::invalid_argument,
                        message_has({"7 elements do not split into 3 equal blocks"}));
}

BOOST_AUTO_TEST_CASE(memory_the_strategy_reduces) {
  BOOST_CHECK_NO_THROW(checks.require_location(memory_location::host, false, "allreduce"));
  BOOST_CHECK_EXCEPTION(
      checks.require_location(memory_location::device, false, "allreduce"),
      cohort::invalid_argument,
      message_has({"allreduce on rank 1", "host memory only", "use pure_nccl or host_staged"}));
  BOOST_CHECK_EXCEPTION(checks.require_location(memory_location::host, true, "allreduce"),
                        cohort::invalid_argument,
                        message_has({"reduces GPU memory", "use flat for host memory"}));
}

// No boost::mpi::environment in this program: the communicator must say so before it asks MPI
// anything (Open MPI aborts the process on a call before MPI_Init).
BOOST_AUTO_TEST_CASE(a_communicator_before_mpi_runs) {
  BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::flat>(), cohort::error,
                        message_has({"MPI is not running", "create a boost::mpi::environment"}));
}
