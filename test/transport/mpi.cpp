// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE transport.mpi
#include <cohort/tensor/std.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "support/expect.hpp"
#include "support/fill.hpp"
#include "support/mpi_test_main.hpp"

namespace mpi = cohort::mpi;
using cohort::dtype;
using cohort::test::as_double;
using cohort::test::closed_form;
using cohort::test::closed_form_sum;
using cohort::test::message_has;

namespace {
// A duplicate of the world that returns errors instead of aborting, as cohort's communicators do.
boost::mpi::communicator world() {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  mpi::return_errors(dup);
  return boost::mpi::communicator(dup, boost::mpi::comm_take_ownership);
}

} // namespace

BOOST_AUTO_TEST_CASE(datatypes_have_the_size_of_their_dtype) {
  for (const dtype type : cohort::all_dtypes) {
    int size = 0;
    BOOST_TEST(MPI_Type_size(mpi::datatype(type), &size) == MPI_SUCCESS);
    BOOST_TEST(static_cast<std::size_t>(size) == cohort::size_of(type));
  }
}

using element_types = std::tuple<float, double, cohort::float16, cohort::bfloat16, std::int32_t,
                                 std::int64_t, std::uint8_t>;

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_sum_every_dtype_and_size, T, element_types) {
  const auto comm = world();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}}) {
    auto data = cohort::test::filled<T>(n, comm.rank());
    mpi::allreduce(comm, cohort::make_view(data), cohort::reduce_op::sum);
    for (std::size_t i = 0; i < n; ++i) {
      BOOST_TEST_REQUIRE(as_double(data[i]) == closed_form_sum(i, comm.size()), "element " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_min_max_prod, T, element_types) {
  const auto comm = world();
  auto lo = cohort::test::filled<T>(9, comm.rank());
  auto hi = lo;
  mpi::allreduce(comm, cohort::make_view(lo), cohort::reduce_op::min);
  mpi::allreduce(comm, cohort::make_view(hi), cohort::reduce_op::max);
  std::vector<T> product(5, static_cast<T>(2.0f));
  mpi::allreduce(comm, cohort::make_view(product), cohort::reduce_op::prod);
  for (std::size_t i = 0; i < 9; ++i) {
    BOOST_TEST(as_double(lo[i]) == closed_form(i, 0));
    BOOST_TEST(as_double(hi[i]) == closed_form(i, comm.size() - 1));
  }
  BOOST_TEST(as_double(product[4]) == static_cast<double>(1 << comm.size()));
}

BOOST_AUTO_TEST_CASE(non_blocking_allreduce_and_request) {
  const auto comm = world();
  auto data = cohort::test::filled<float>(100, comm.rank());
  mpi::request pending = mpi::iallreduce(comm, cohort::make_view(data), cohort::reduce_op::sum);
  BOOST_TEST(pending.pending());
  mpi::request moved = std::move(pending);
  BOOST_TEST(!pending.pending());
  moved.wait();
  BOOST_TEST(!moved.pending());
  BOOST_TEST(moved.test());
  BOOST_TEST(data[99] == closed_form_sum(99, comm.size()));
  {
    // A request left pending waits in its destructor: the data is complete after the scope.
    auto more = cohort::test::filled<double>(10, comm.rank());
    { const auto dropped = mpi::iallreduce(comm, cohort::make_view(more), cohort::reduce_op::sum); }
    BOOST_TEST(more[9] == closed_form_sum(9, comm.size()));
  }
}

BOOST_AUTO_TEST_CASE(non_blocking_reduces_to_several_roots_in_flight_together) {
  // One reduce to each rank, all started before any is waited for: each root holds the sum, the
  // others' data is left as it was.
  const auto comm = world();
  const int n = comm.size();
  std::vector<std::vector<double>> data;
  for (int root = 0; root < n; ++root) {
    data.push_back(cohort::test::filled<double>(100 + static_cast<std::size_t>(root), comm.rank()));
  }
  std::vector<mpi::request> pending;
  for (int root = 0; root < n; ++root) {
    pending.push_back(mpi::ireduce(comm, cohort::make_view(data[static_cast<std::size_t>(root)]),
                                   cohort::reduce_op::sum, root));
  }
  for (auto& r : pending) {
    r.wait();
  }
  const auto mine = cohort::test::filled<double>(100 + static_cast<std::size_t>(n), comm.rank());
  for (int root = 0; root < n; ++root) {
    const auto& d = data[static_cast<std::size_t>(root)];
    for (std::size_t i = 0; i < d.size(); ++i) {
      BOOST_TEST_REQUIRE(d[i] == (root == comm.rank() ? closed_form_sum(i, n) : mine[i]));
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_gather_scatter_and_point_to_point) {
  const auto comm = world();
  const int n = comm.size();
  for (int root = 0; root < n; ++root) {
    std::vector<std::int64_t> value(3, comm.rank() == root ? 42 + root : -1);
    mpi::broadcast(comm, cohort::make_view(value), root);
    BOOST_TEST(value[2] == 42 + root);
    auto later = mpi::ibroadcast(comm, cohort::make_view(value), root);
    later.wait();
  }
  const std::vector<float> mine(2, static_cast<float>(comm.rank()));
  std::vector<float> all(2 * static_cast<std::size_t>(n));
  mpi::allgather(comm, cohort::make_const_view(mine), cohort::make_view(all));
  for (int r = 0; r < n; ++r) {
    BOOST_TEST(all[2 * static_cast<std::size_t>(r) + 1] == static_cast<float>(r));
  }
  std::vector<cohort::float16> halves(2 * static_cast<std::size_t>(n), cohort::float16(1.0f));
  std::vector<cohort::float16> block(2);
  mpi::reduce_scatter(comm, cohort::make_const_view(halves), cohort::make_view(block),
                      cohort::reduce_op::sum);
  BOOST_TEST(static_cast<float>(block[1]) == static_cast<float>(n));

  // A ring: each rank sends to the next and receives from the previous.
  const int next = (comm.rank() + 1) % n;
  const int previous = (comm.rank() + n - 1) % n;
  const std::vector<std::int32_t> out(5, comm.rank());
  std::vector<std::int32_t> in(5, -1);
  auto receiving = mpi::irecv(comm, cohort::make_view(in), previous, 7);
  auto sending = mpi::isend(comm, cohort::make_const_view(out), next, 7);
  receiving.wait();
  sending.wait();
  BOOST_TEST(in[4] == previous);
}

BOOST_AUTO_TEST_CASE(recv_of_the_wrong_size_names_both_and_loses_nothing) {
  const auto comm = world();
  if (comm.size() < 2) {
    return;
  }
  if (comm.rank() == 0) {
    const std::vector<float> five{1, 2, 3, 4, 5};
    mpi::send(comm, cohort::make_const_view(five), 1, 3);
  } else if (comm.rank() == 1) {
    std::vector<float> four(4);
    BOOST_CHECK_EXCEPTION(mpi::recv(comm, cohort::make_view(four), 0, 3), cohort::invalid_argument,
                          message_has({"rank 1", "from rank 0", "5 float32 elements",
                                       "tensor has 4", "left queued"}));
    std::vector<float> five(5);
    mpi::recv(comm, cohort::make_view(five), 0, 3);
    BOOST_TEST(five[4] == 5.0f);
  }
}

BOOST_AUTO_TEST_CASE(mpi_errors_become_exceptions_naming_the_call_and_rank) {
  const auto comm = world();
  const std::vector<float> x(1);
  BOOST_CHECK_EXCEPTION(
      mpi::send(comm, cohort::make_const_view(x), comm.size() + 3, 0), cohort::engine_error,
      message_has({"MPI error in MPI_Send on rank " + std::to_string(comm.rank())}));
  BOOST_CHECK_EXCEPTION(
      mpi::translate("gather_obj", comm,
                     [] { throw boost::mpi::exception("MPI_Gather", MPI_ERR_COUNT); }),
      cohort::engine_error, message_has({"gather_obj", "rank"}));
}

BOOST_AUTO_TEST_CASE(tensors_beyond_the_mpi_count_limit_go_in_chunks) {
  // A test-only limit of 7 elements per MPI call runs the chunked paths (meant for tensors of
  // more than INT_MAX elements) on 50: 8 calls each, with requests that hold several handles.
  const auto comm = world();
  auto& limit = cohort::mpi::detail::chunk_limit();
  const std::size_t saved = limit;
  limit = 7;
  auto data = cohort::test::filled<double>(50, comm.rank());
  mpi::allreduce(comm, cohort::make_view(data), cohort::reduce_op::sum);
  auto again = cohort::test::filled<double>(50, comm.rank());
  mpi::iallreduce(comm, cohort::make_view(again), cohort::reduce_op::sum).wait();
  for (std::size_t i = 0; i < 50; ++i) {
    BOOST_TEST_REQUIRE(data[i] == closed_form_sum(i, comm.size()));
    BOOST_TEST_REQUIRE(again[i] == closed_form_sum(i, comm.size()));
  }
  auto reduced = cohort::test::filled<double>(50, comm.rank());
  mpi::ireduce(comm, cohort::make_view(reduced), cohort::reduce_op::sum, 0).wait();
  if (comm.rank() == 0) {
    for (std::size_t i = 0; i < 50; ++i) {
      BOOST_TEST_REQUIRE(reduced[i] == closed_form_sum(i, comm.size()));
    }
  }
  std::vector<std::int32_t> from_last(50, comm.rank());
  mpi::broadcast(comm, cohort::make_view(from_last), comm.size() - 1);
  BOOST_TEST(from_last[49] == comm.size() - 1);
  const int next = (comm.rank() + 1) % comm.size();
  const int previous = (comm.rank() + comm.size() - 1) % comm.size();
  const auto out = cohort::test::filled<float>(50, comm.rank());
  std::vector<float> in(50), in2(50);
  auto receiving = mpi::irecv(comm, cohort::make_view(in), previous, 11);
  mpi::isend(comm, cohort::make_const_view(out), next, 11).wait();
  receiving.wait();
  BOOST_TEST(in == cohort::test::filled<float>(50, previous), boost::test_tools::per_element());
  if (comm.size() >= 2) {
    if (comm.rank() == 0) {
      mpi::send(comm, cohort::make_const_view(out), 1, 12);
    } else if (comm.rank() == 1) {
      mpi::recv(comm, cohort::make_view(in2), 0, 12);
      BOOST_TEST(in2 == cohort::test::filled<float>(50, 0), boost::test_tools::per_element());
    }
  }
  limit = saved;
}

BOOST_AUTO_TEST_CASE(calls_that_cannot_be_chunked_refuse_more_than_int_max_elements) {
  // Refused before MPI is called (no memory is touched: the views point at one byte), naming
  // the call, the rank and the count.
  boost::mpi::communicator comm;
  std::uint8_t byte = 0;
  const std::size_t count = static_cast<std::size_t>(INT_MAX) + 1;
  const cohort::tensor_view huge{&byte, count, cohort::dtype::uint8, cohort::memory_location::host};
  const std::vector<std::string> expected = {"on rank " + std::to_string(comm.rank()),
                                             "2147483648 elements per rank", "INT_MAX"};
  std::vector<std::string> call = expected;
  call.insert(call.begin(), "MPI_Allgather");
  BOOST_CHECK_EXCEPTION(cohort::mpi::allgather(comm, huge, huge), cohort::invalid_argument,
                        message_has(call));
  call.front() = "MPI_Iallgather";
  BOOST_CHECK_EXCEPTION(cohort::mpi::iallgather(comm, huge, huge), cohort::invalid_argument,
                        message_has(call));
  call.front() = "MPI_Reduce_scatter_block";
  BOOST_CHECK_EXCEPTION(cohort::mpi::reduce_scatter(comm, huge, huge, cohort::reduce_op::sum),
                        cohort::invalid_argument, message_has(call));
}
