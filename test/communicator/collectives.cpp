// SPDX-License-Identifier: Apache-2.0
// The tensor and object collectives every MPI strategy shares, on each strategy, with the
// agreement check that turns cross-rank mismatches into the same error on every rank.
#define BOOST_TEST_MODULE communicator.collectives
#include <cohort/cohort.hpp>
#include <cohort/communicator/engine/liveness.hpp>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "support/expect.hpp"
#include "support/fill.hpp"
#include "support/mpi_test_main.hpp"

using cohort::dtype;
using cohort::reduce_op;
using cohort::test::as_double;
using cohort::test::closed_form;
using cohort::test::closed_form_sum;
using cohort::test::message_has;

using strategies = std::tuple<cohort::naive, cohort::flat, cohort::dummy>;

namespace {
template <class T, class Comm>
void check_allreduce_sum(Comm& comm, std::size_t n) {
  auto data = cohort::test::filled<T>(n, comm.rank());
  comm.allreduce(data);
  for (std::size_t i = 0; i < n; ++i) {
    BOOST_TEST_REQUIRE(as_double(data[i]) == closed_form_sum(i, comm.size()),
                       cohort::to_string(cohort::dtype_of_v<T>) << " element " << i << " of " << n);
  }
}

// A user's tensor type with a run-time dtype, adapted through the trait.
struct blob {
  std::vector<std::byte> bytes;
  dtype type = dtype::float32;
};
} // namespace

template <>
struct cohort::tensor_traits<blob> {
  static constexpr memory_location location = memory_location::host;
  static void* data(blob& b) { return b.bytes.data(); }
  static const void* data(const blob& b) { return b.bytes.data(); }
  static std::size_t size(const blob& b) { return b.bytes.size() / size_of(b.type); }
  static cohort::dtype dtype_of(const blob& b) { return b.type; }
};

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_every_dtype_and_awkward_sizes, Strategy, strategies) {
  // Whole, in the default 1 MiB segments (70001 doubles are two), and in the smallest segments,
  // of 4096 bytes and of 4100 (not a multiple of every dtype's size).
  for (const std::size_t segment :
       {std::size_t{0}, std::size_t{1} << 20, std::size_t{4096}, std::size_t{4100}}) {
    auto comm = cohort::make_communicator<Strategy>({.segment_bytes = segment});
    const std::size_t not_divisible = static_cast<std::size_t>(comm.size()) * 5 + 1;
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, not_divisible, std::size_t{70001}}) {
      check_allreduce_sum<float>(comm, n);
      check_allreduce_sum<double>(comm, n);
      check_allreduce_sum<cohort::float16>(comm, n);
      check_allreduce_sum<cohort::bfloat16>(comm, n);
      check_allreduce_sum<std::int32_t>(comm, n);
      check_allreduce_sum<std::int64_t>(comm, n);
      check_allreduce_sum<std::uint8_t>(comm, n);
    }
    // The non-blocking all-reduce, in the same segments, all in flight at once.
    std::vector<double> values(70001);
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<double>(closed_form(i, comm.rank()));
    }
    comm.iallreduce(values).wait();
    for (std::size_t i = 0; i < values.size(); ++i) {
      BOOST_TEST_REQUIRE(values[i] == static_cast<double>(closed_form_sum(i, comm.size())),
                         "iallreduce element " << i << ", segments of " << segment);
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_ops_and_containers, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  std::array<float, 3> lo{1.0f + comm.rank(), 5.0f, -1.0f * comm.rank()};
  comm.allreduce(lo, reduce_op::min);
  BOOST_TEST(lo[0] == 1.0f);
  BOOST_TEST(lo[2] == -1.0f * (comm.size() - 1));
  std::int64_t hi[2] = {comm.rank(), -comm.rank()};
  comm.allreduce(hi, reduce_op::max);
  BOOST_TEST(hi[0] == comm.size() - 1);
  BOOST_TEST(hi[1] == 0);
  std::vector<double> storage(4, 3.0);
  std::span<double> product(storage.data(), 2);
  comm.allreduce(product, reduce_op::prod);
  BOOST_TEST(storage[0] == std::pow(3.0, comm.size()));
  BOOST_TEST(storage[2] == 3.0);

  blob b{std::vector<std::byte>(6 * sizeof(std::int32_t)), dtype::int32};
  auto* ints = reinterpret_cast<std::int32_t*>(b.bytes.data());
  for (int i = 0; i < 6; ++i) {
    ints[i] = static_cast<std::int32_t>(closed_form(static_cast<std::size_t>(i), comm.rank()));
  }
  comm.allreduce(b);
  BOOST_TEST(ints[5] == closed_form_sum(5, comm.size()));

  auto pending = comm.iallreduce(storage);
  pending.wait();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_allgather_reduce_scatter, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  for (int root = 0; root < n; ++root) {
    std::vector<cohort::bfloat16> v(5, cohort::bfloat16(comm.rank() == root ? 7.0f : 0.0f));
    comm.broadcast(v, root);
    BOOST_TEST(static_cast<float>(v[4]) == 7.0f);
    std::vector<std::uint8_t> w(3, comm.rank() == root ? 9 : 0);
    comm.ibroadcast(w, root).wait();
    BOOST_TEST(w[2] == 9);
  }
  for (const std::size_t per_rank : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    const auto mine = cohort::test::filled<std::int32_t>(per_rank, comm.rank());
    std::vector<std::int32_t> all(per_rank * static_cast<std::size_t>(n));
    comm.allgather(mine, all);
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < per_rank; ++i) {
        BOOST_TEST_REQUIRE(all[static_cast<std::size_t>(r) * per_rank + i] == closed_form(i, r));
      }
    }
    std::vector<std::int32_t> again(all.size());
    comm.iallgather(mine, again).wait();
    BOOST_TEST(again == all);

    // Each rank contributes rank + position to every block; block r sums over ranks.
    std::vector<double> contributions(per_rank * static_cast<std::size_t>(n));
    for (std::size_t j = 0; j < contributions.size(); ++j) {
      contributions[j] = static_cast<double>(j) + comm.rank();
    }
    std::vector<double> block(per_rank);
    comm.reduce_scatter(contributions, block);
    for (std::size_t i = 0; i < per_rank; ++i) {
      const double position =
          static_cast<double>(static_cast<std::size_t>(comm.rank()) * per_rank + i);
      BOOST_TEST(block[i] == position * n + n * (n - 1) / 2.0);
    }
  }
}

// Blocks of any size (issue 36: each rank's shard of the parameters), zero counts and a rank
// that owns nothing included, in a 16-bit dtype too.
BOOST_AUTO_TEST_CASE_TEMPLATE(allgather_and_reduce_scatter_with_blocks_of_any_size, Strategy,
                              strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  for (const std::size_t step : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    std::vector<std::size_t> offsets(counts.size());
    std::size_t total = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      counts[q] = (q == 1 ? 0 : step * (q + 1) + (q == 0 ? 2 : 0)); // rank 1 owns nothing
      offsets[q] = total;
      total += counts[q];
    }
    const auto mine = cohort::test::filled<std::int32_t>(counts[r], comm.rank());
    std::vector<std::int32_t> all(total, -1);
    comm.allgather(mine, all, counts);
    for (std::size_t q = 0; q < counts.size(); ++q) {
      for (std::size_t i = 0; i < counts[q]; ++i) {
        BOOST_TEST_REQUIRE(all[offsets[q] + i] == closed_form(i, static_cast<int>(q)));
      }
    }
    // Each rank contributes rank + position everywhere; rank q gets the sum over its block.
    std::vector<double> contributions(total);
    for (std::size_t j = 0; j < total; ++j) {
      contributions[j] = static_cast<double>(j) + comm.rank();
    }
    std::vector<double> block(counts[r], -1.0);
    comm.reduce_scatter(contributions, block, counts);
    for (std::size_t i = 0; i < block.size(); ++i) {
      BOOST_TEST_REQUIRE(block[i] == static_cast<double>(offsets[r] + i) * n + n * (n - 1) / 2.0);
    }
    // bfloat16 (a user-defined MPI op) and max.
    std::vector<cohort::bfloat16> halves(total, cohort::bfloat16(static_cast<float>(comm.rank())));
    std::vector<cohort::bfloat16> top(counts[r]);
    comm.reduce_scatter(halves, top, counts, reduce_op::max);
    for (const auto h : top) {
      BOOST_TEST_REQUIRE(static_cast<float>(h) == static_cast<float>(n - 1));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(blocks_of_any_size_that_disagree_throw_on_every_rank, Strategy,
                              strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const auto n = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  // The wrong number of counts, a block of the wrong size: named on their rank, every rank
  // throws (each has good arguments but one: a mismatch elsewhere).
  std::vector<std::size_t> counts(n, 2);
  std::vector<float> whole(2 * n);
  std::vector<float> block(2);
  std::vector<std::size_t> too_few(n + 1, 2);
  BOOST_CHECK_EXCEPTION(comm.allgather(block, whole, too_few), std::exception,
                        message_has({"allgather"}));
  if (n == 1) {
    BOOST_CHECK_EXCEPTION(comm.allgather(block, whole, too_few), cohort::invalid_argument,
                          message_has({"the counts have 2 entries, not one per rank (1)"}));
    std::vector<float> three(3);
    BOOST_CHECK_EXCEPTION(comm.reduce_scatter(three, block, counts), cohort::invalid_argument,
                          message_has({"reduce_scatter", "the counts add up to 2 elements, but "
                                                         "the 1-rank tensor has 3"}));
    return;
  }
  const std::size_t last = n - 1;
  // One rank's counts differ: every rank throws the same mismatch, both lists named.
  std::vector<std::size_t> theirs = counts;
  if (r == last) {
    theirs[0] = 3;
    theirs[1] = 1;
  }
  std::vector<float> block_of(theirs[r]);
  BOOST_CHECK_EXCEPTION(comm.reduce_scatter(whole, block_of, theirs), cohort::mismatch_error,
                        message_has({"reduce_scatter", "the counts", "2, 2", "3, 1",
                                     "on rank " + std::to_string(last)}));
  // A block that is not this rank's count: an error on every rank, naming the rank.
  std::vector<float> wrong(r == last ? 5 : 2);
  BOOST_CHECK_EXCEPTION(comm.allgather(wrong, whole, counts), std::exception,
                        message_has({"allgather", "rank " + std::to_string(last)}));
  // Still working after the errors.
  std::vector<float> ok(2, 1.0f);
  std::vector<float> gathered(2 * n);
  comm.allgather(ok, gathered, counts);
  BOOST_TEST(gathered[2 * last + 1] == 1.0f);
}

// Each value from its own root, all in flight at once (a sharded optimizer's parameters, each
// from its owner): several dtypes and sizes, an empty one; then bad arguments on one rank, an
// error on every rank before anything moves.
BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_each_copies_every_value_from_its_root, Strategy,
                              strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<float> a(1000, static_cast<float>(r));
  std::vector<double> b(7, 10.0 * r);
  std::vector<std::int32_t> c(3, 100 * r);
  std::vector<float> empty;
  std::vector<cohort::tensor_view> values{cohort::make_view(a), cohort::make_view(b),
                                          cohort::make_view(c), cohort::make_view(empty)};
  const std::vector<int> roots{n - 1, 0, (n > 2 ? 2 : 0), 0};
  comm.broadcast_each(values, roots);
  BOOST_TEST(std::all_of(a.begin(), a.end(), [&](float x) { return x == float(n - 1); }));
  BOOST_TEST(std::all_of(b.begin(), b.end(), [](double x) { return x == 0.0; }));
  BOOST_TEST(std::all_of(c.begin(), c.end(), [&](std::int32_t x) { return x == 100 * roots[2]; }));
  // A root out of range on the last rank: named there, an error on every rank.
  std::vector<int> bad = roots;
  if (r == n - 1) {
    bad[1] = n;
  }
  BOOST_CHECK_EXCEPTION(comm.broadcast_each(values, bad), std::exception,
                        message_has({"broadcast_each", "rank " + std::to_string(n - 1)}));
  // Fewer roots than values: named.
  BOOST_CHECK_EXCEPTION(comm.broadcast_each(values, std::span(roots).first(2)), std::exception,
                        message_has({"broadcast_each", "4 values but 2 roots"}));
  // Overlapping values would race inside MPI: named, an error on every rank.
  const std::vector<cohort::tensor_view> overlapping{
      cohort::tensor_view{a.data(), 10, dtype::float32, cohort::memory_location::host},
      cohort::tensor_view{a.data() + 5, 10, dtype::float32, cohort::memory_location::host}};
  BOOST_CHECK_EXCEPTION(comm.broadcast_each(overlapping, std::vector<int>{0, n - 1}),
                        std::exception, message_has({"values 0 and 1 overlap in memory"}));
  // Nothing to copy: only the agreement.
  comm.broadcast_each({}, {});
  if (n > 1) {
    // One rank's value of another size, or dtype: a mismatch on every rank, naming the value.
    std::vector<float> longer(r == 0 ? 5 : 4);
    const std::vector<cohort::tensor_view> one{cohort::make_view(longer)};
    BOOST_CHECK_EXCEPTION(comm.broadcast_each(one, std::vector<int>{0}), cohort::mismatch_error,
                          message_has({"broadcast_each", "value 0", "5 float32", "4 float32"}));
    std::vector<double> other_type(4);
    const std::vector<cohort::tensor_view> typed{r == 0 ? cohort::make_view(other_type)
                                                        : cohort::make_view(longer)};
    BOOST_CHECK_EXCEPTION(comm.broadcast_each(typed, std::vector<int>{0}), cohort::mismatch_error,
                          message_has({"broadcast_each", "float64"}));
    // One value more on the last rank: a mismatch, not a hang.
    std::vector<cohort::tensor_view> more{cohort::make_view(b)};
    std::vector<int> more_roots{0};
    if (r == n - 1) {
      more.push_back(cohort::make_view(c));
      more_roots.push_back(0);
    }
    BOOST_CHECK_EXCEPTION(comm.broadcast_each(more, more_roots), cohort::mismatch_error,
                          message_has({"broadcast_each", "values"}));
  }
  // Still working after the errors.
  std::vector<float> ok(2, static_cast<float>(r));
  const std::vector<cohort::tensor_view> last{cohort::make_view(ok)};
  comm.broadcast_each(last, std::vector<int>{n - 1});
  BOOST_TEST(ok[1] == float(n - 1));
}

BOOST_AUTO_TEST_CASE(broadcast_each_over_nodes_copies_across_then_inside_each) {
  // Simulated nodes of 1, 2 and 3 ranks: at 4 ranks and 2 a node (nodes alike, several ranks
  // each) the copies go across the nodes, then inside each; otherwise over every rank at once.
  // Either way every value ends as its root's, roots on every node and of every intra_rank.
  for (const int per_node : {1, 2, 3}) {
    auto comm = cohort::make_communicator<cohort::flat>(
        cohort::communicator_options{.simulated_ranks_per_node = per_node});
    const int n = comm.size();
    const int r = comm.rank();
    std::vector<std::vector<float>> owned;
    std::vector<int> roots;
    for (int i = 0; i < 2 * n + 1; ++i) { // every rank a root twice, rank 0 three times
      roots.push_back(i % n);
      owned.emplace_back(100 + static_cast<std::size_t>(i), static_cast<float>(r * 1000 + i));
    }
    std::vector<cohort::tensor_view> values;
    for (auto& v : owned) {
      values.push_back(cohort::make_view(v));
    }
    comm.broadcast_each(values, roots);
    for (std::size_t i = 0; i < owned.size(); ++i) { // again, from values as they began
      std::fill(owned[i].begin(), owned[i].end(),
                static_cast<float>(r * 1000 + static_cast<int>(i)));
    }
    comm.broadcast_each(values, roots);
    for (std::size_t i = 0; i < owned.size(); ++i) {
      const float expected = static_cast<float>(roots[i] * 1000 + static_cast<int>(i));
      BOOST_TEST_CONTEXT(per_node << " ranks a node, value " << i << " from rank " << roots[i]) {
        BOOST_TEST(
            std::all_of(owned[i].begin(), owned[i].end(), [&](float x) { return x == expected; }));
      }
    }
  }
}

// Gather and scatter, at every root: the whole exists on the root only.
BOOST_AUTO_TEST_CASE_TEMPLATE(gather_and_scatter_at_every_root, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size(), r = comm.rank();
  for (int root = 0; root < n; ++root) {
    for (const std::size_t per_rank : {std::size_t{0}, std::size_t{3}}) {
      const auto mine = cohort::test::filled<double>(per_rank, r);
      std::vector<double> all(r == root ? per_rank * static_cast<std::size_t>(n) : 0);
      comm.gather(mine, all, root);
      std::vector<double> back(per_rank);
      comm.scatter(all, back, root);
      BOOST_TEST(back == mine);
      if (r == root) {
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < per_rank; ++i) {
            BOOST_TEST_REQUIRE(all[static_cast<std::size_t>(q) * per_rank + i] ==
                               closed_form(i, q));
          }
        }
      }
    }
  }
  if (n > 1) {
    // A block of another size on the last rank, or a root's whole of the wrong size: an error on
    // every rank.
    std::vector<float> block(r == n - 1 ? 3 : 2), whole(static_cast<std::size_t>(2 * n));
    BOOST_CHECK_THROW(comm.gather(block, whole, 0), cohort::mismatch_error);
    std::vector<float> two(2), short_whole(r == 0 ? 1 : 0);
    BOOST_CHECK_EXCEPTION(comm.scatter(short_whole, two, 0), cohort::error,
                          message_has({"scatter", "rank 0"}));
  }
}

// Block q of rank r's input is (r, q, i); it lands at rank q in block r.
BOOST_AUTO_TEST_CASE_TEMPLATE(alltoall_exchanges_blocks, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size(), r = comm.rank();
  for (const int per_rank : {0, 1, 5}) {
    const auto code = [per_rank](int from, int to, int i) {
      return static_cast<std::int64_t>((from * 100 + to) * 100 + i);
    };
    std::vector<std::int64_t> in(static_cast<std::size_t>(per_rank * n));
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < per_rank; ++i) {
        in[static_cast<std::size_t>(q * per_rank + i)] = code(r, q, i);
      }
    }
    std::vector<std::int64_t> out(in.size());
    comm.alltoall(in, out);
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < per_rank; ++i) {
        BOOST_TEST_REQUIRE(out[static_cast<std::size_t>(q * per_rank + i)] == code(q, r, i));
      }
    }
  }
  // One rank's blocks of another size, or a count that does not split: an error on every rank.
  std::vector<float> in(static_cast<std::size_t>(n * (r == n - 1 ? 3 : 2)));
  std::vector<float> out(in.size());
  if (n > 1) {
    BOOST_CHECK_THROW(comm.alltoall(in, out), cohort::mismatch_error);
  }
  std::vector<float> uneven(static_cast<std::size_t>(n + (r == 0 ? 1 : 0))), wrong(uneven.size());
  if (n > 1) {
    BOOST_CHECK_EXCEPTION(comm.alltoall(uneven, wrong), cohort::error,
                          message_has({"alltoall", "rank 0", "do not split"}));
  }
  std::vector<float> shorter(in.size() - static_cast<std::size_t>(n));
  BOOST_CHECK_EXCEPTION(comm.alltoall(in, shorter), cohort::error,
                        message_has({"alltoall", "elements but the output has"}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(point_to_point, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  const int next = (comm.rank() + 1) % n;
  const int previous = (comm.rank() + n - 1) % n;
  const auto out = cohort::test::filled<float>(11, comm.rank());
  std::vector<float> in(11);
  auto receiving = comm.irecv(in, previous, 1);
  comm.isend(out, next, 1).wait();
  receiving.wait();
  BOOST_TEST(in == cohort::test::filled<float>(11, previous));
  if (n >= 2) {
    if (comm.rank() == 0) {
      comm.send(out, 1, 2);
    } else if (comm.rank() == 1) {
      comm.recv(in, 0, 2);
      BOOST_TEST(in == cohort::test::filled<float>(11, 0));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(object_collectives, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  const std::string root_says =
      comm.bcast_obj(std::string("hello from ") + std::to_string(comm.rank()), n - 1);
  BOOST_TEST(root_says == "hello from " + std::to_string(n - 1));

  const auto gathered = comm.gather_obj(std::vector<int>(static_cast<std::size_t>(comm.rank()), 1));
  if (comm.rank() == 0) {
    BOOST_TEST_REQUIRE(gathered.size() == static_cast<std::size_t>(n));
    BOOST_TEST(gathered[static_cast<std::size_t>(n - 1)].size() == static_cast<std::size_t>(n - 1));
  } else {
    BOOST_TEST(gathered.empty());
  }
  const auto everyone = comm.allgather_obj(comm.rank() * 10);
  BOOST_TEST(everyone.back() == (n - 1) * 10);
  BOOST_TEST(comm.allreduce_obj(comm.rank() + 1) == n * (n + 1) / 2);
  const auto largest = comm.allreduce_obj(comm.rank(), [](int a, int b) { return a > b ? a : b; });
  BOOST_TEST(largest == n - 1);

  if (n >= 2) {
    if (comm.rank() == 0) {
      comm.send_obj(std::vector<std::string>{"a", "bc"}, 1, 5);
    } else if (comm.rank() == 1) {
      const auto words = comm.template recv_obj<std::vector<std::string>>(0, 5);
      BOOST_TEST(words == (std::vector<std::string>{"a", "bc"}));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(split_keeps_strategy_and_options, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>({.check_agreement = false});
  Strategy half = comm.split(comm.rank() % 2, comm.rank());
  const int expected = (comm.size() + 1 - comm.rank() % 2) / 2;
  BOOST_TEST(half.size() == expected);
  BOOST_TEST(half.rank() == comm.rank() / 2);
  BOOST_TEST(!half.options().check_agreement);
  std::vector<int> one{1};
  half.allreduce(one);
  BOOST_TEST(one[0] == expected);
  BOOST_CHECK_EXCEPTION(comm.split(-1, 0), cohort::invalid_argument,
                        message_has({"split", "color must be >= 0"}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mismatched_sizes_throw_on_every_rank, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  std::vector<float> x(comm.rank() == last ? 9 : 10);
  BOOST_CHECK_EXCEPTION(comm.allreduce(x), cohort::mismatch_error,
                        message_has({"allreduce", "10 float32 elements", "on rank 0",
                                     "9 float32 elements", "on rank " + std::to_string(last)}));
  std::vector<float> y(4);
  BOOST_CHECK_EXCEPTION(comm.allreduce(y, comm.rank() == last ? reduce_op::max : reduce_op::sum),
                        cohort::mismatch_error, message_has({"op sum", "op max"}));
  BOOST_CHECK_EXCEPTION(comm.broadcast(y, comm.rank() == last ? 1 : 0), cohort::mismatch_error,
                        message_has({"broadcast", "root 0", "root 1"}));
  std::vector<double> z(4);
  const auto dtype_message = message_has({"broadcast", "4 float32 elements", "4 float64 elements"});
  if (comm.rank() == last) {
    BOOST_CHECK_EXCEPTION(comm.broadcast(z, 0), cohort::mismatch_error, dtype_message);
  } else {
    BOOST_CHECK_EXCEPTION(comm.broadcast(y, 0), cohort::mismatch_error, dtype_message);
  }
  BOOST_CHECK_EXCEPTION(comm.bcast_obj(1, comm.rank() == last ? 1 : 0), cohort::mismatch_error,
                        message_has({"bcast_obj", "the root"}));
  // Issue 30: an object of another type would be read as this one's bytes.
  const auto other_type = [&] {
    if (comm.rank() == last) {
      (void)comm.bcast_obj(1.0f, 0);
    } else {
      (void)comm.bcast_obj(1, 0);
    }
  };
  BOOST_CHECK_EXCEPTION(other_type(), cohort::mismatch_error,
                        message_has({"bcast_obj", "the object's type", "int", "float"}));
  const auto other_gather = [&] {
    if (comm.rank() == last) {
      (void)comm.allgather_obj(std::string("x"));
    } else {
      (void)comm.allgather_obj(1);
    }
  };
  BOOST_CHECK_EXCEPTION(other_gather(), cohort::mismatch_error,
                        message_has({"allgather_obj", "the object's type"}));
  // Issue 30: a small int64 all-reduce (carried in the agreement) is exact past 2^53.
  const std::int64_t big = (std::int64_t{1} << 61) + 2 * comm.rank() + 1;
  std::array<std::int64_t, 2> extremes{big, ~big};
  comm.allreduce(extremes, reduce_op::max);
  BOOST_TEST(extremes[0] == (std::int64_t{1} << 61) + 2 * last + 1);
  BOOST_TEST(extremes[1] == ~((std::int64_t{1} << 61) + 1));
  // After the errors, the communicator still works.
  std::vector<float> ok(3, 1.0f);
  comm.allreduce(ok);
  BOOST_TEST(ok[0] == static_cast<float>(comm.size()));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bad_input_on_one_rank_is_an_error_on_every_rank, Strategy,
                              strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  // Only rank 0 sizes its output wrongly: every rank learns it, none waits in the collective.
  const std::vector<float> in(2);
  std::vector<float> out(comm.rank() == 0 ? 3 : 2 * static_cast<std::size_t>(comm.size()));
  BOOST_CHECK_EXCEPTION(comm.allgather(in, out), cohort::mismatch_error,
                        message_has({"allgather", "failed", "needs", "on rank 0"}));
  std::vector<float> x(4);
  BOOST_CHECK_EXCEPTION(
      comm.broadcast(x, comm.rank() == last ? comm.size() : 0), cohort::mismatch_error,
      message_has({"broadcast", "is not a rank", "on rank " + std::to_string(last)}));
  BOOST_CHECK_EXCEPTION(comm.split(comm.rank() == last ? -1 : 0, 0), cohort::mismatch_error,
                        message_has({"split", "color must be >= 0"}));
  BOOST_CHECK_EXCEPTION(comm.bcast_obj(std::string("x"), comm.rank() == 0 ? -1 : 0),
                        cohort::mismatch_error, message_has({"bcast_obj", "root -1"}));
  // Still in step.
  std::vector<float> ok(2, 1.0f);
  comm.allreduce(ok);
  BOOST_TEST(ok[1] == static_cast<float>(comm.size()));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bad_arguments_name_what_is_wrong, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const std::string n = std::to_string(comm.size());
  std::vector<float> x(2);
  BOOST_CHECK_EXCEPTION(comm.broadcast(x, comm.size()), cohort::invalid_argument,
                        message_has({"broadcast", "root " + n, n + "-rank"}));
  BOOST_CHECK_EXCEPTION(comm.send(x, -1), cohort::invalid_argument,
                        message_has({"send", "peer -1"}));
  std::vector<float> wrong(3 * static_cast<std::size_t>(comm.size()) + 1);
  BOOST_CHECK_EXCEPTION(
      comm.allgather(x, wrong), cohort::invalid_argument,
      message_has({"allgather", "has 2 elements", "needs " + std::to_string(2 * comm.size()),
                   "has " + std::to_string(wrong.size())}));
  std::vector<double> other_type(2 * static_cast<std::size_t>(comm.size()));
  BOOST_CHECK_EXCEPTION(comm.allgather(x, other_type), cohort::invalid_argument,
                        message_has({"float32", "float64"}));
  float device_memory[2] = {};
  cohort::tensor_view on_device{device_memory, 2, dtype::float32, cohort::memory_location::device};
  BOOST_CHECK_EXCEPTION(comm.allreduce(on_device), cohort::invalid_argument,
                        message_has({"device memory", "rank " + std::to_string(comm.rank())}));
}

BOOST_AUTO_TEST_CASE(communicator_concept_and_mpi_requirement) {
  static_assert(cohort::communicator<cohort::naive>);
  static_assert(cohort::communicator<cohort::flat>);
  static_assert(cohort::communicator<cohort::dummy>);
  static_assert(cohort::communicator<cohort::hierarchical<>>);
  static_assert(cohort::communicator<cohort::two_dimensional<>>);
  static_assert(!cohort::communicator<int>);
  auto comm = cohort::make_communicator<cohort::flat>(boost::mpi::communicator());
  BOOST_TEST(comm.size() == boost::mpi::communicator().size());
}

// Issue 10: ranks at different collectives at the same point (a barrier on one, an all-reduce on
// the others) all throw, instead of misreading each other's messages and waiting.
BOOST_AUTO_TEST_CASE(ranks_in_different_operations_throw_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  std::vector<float> x(3, 1.0f);
  const auto different = [&] {
    if (comm.rank() == comm.size() - 1) {
      comm.barrier();
    } else {
      comm.allreduce(x);
    }
  };
  BOOST_CHECK_EXCEPTION(different(), cohort::mismatch_error,
                        cohort::test::message_has({"not all in the same operation"}));
  comm.barrier(); // in step again
  comm.allreduce(x);
  BOOST_TEST(x[0] == static_cast<float>(comm.size()));
}

// Issue 14: an all-reduce of at most liveness::max_carried_bytes travels in the agreement's own
// messages and is reduced there. The sums are right on both sides of that limit, every rank gets
// the same bits, and a mismatch leaves every rank's data as it was.
BOOST_AUTO_TEST_CASE_TEMPLATE(small_allreduces_ride_the_agreement, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  constexpr std::size_t limit = cohort::engine::liveness::max_carried_bytes;
  for (const std::size_t n : {limit / 8 - 1, limit / 8, limit / 8 + 1}) {
    check_allreduce_sum<double>(comm, n);
  }
  for (const std::size_t n : {limit / 4, limit / 4 + 1}) {
    check_allreduce_sum<float>(comm, n);
  }
  for (const std::size_t n : {limit / 2, limit / 2 + 1}) {
    check_allreduce_sum<cohort::float16>(comm, n);
  }
  check_allreduce_sum<std::uint8_t>(comm, limit);
  for (const reduce_op op : {reduce_op::max, reduce_op::min, reduce_op::prod}) {
    std::vector<std::int64_t> v(100);
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<std::int64_t>((i + 1) * static_cast<std::size_t>(comm.rank() + 1));
    }
    comm.allreduce(v, op);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto base = static_cast<std::int64_t>(i + 1);
      std::int64_t expected = op == reduce_op::min ? base : base * comm.size();
      if (op == reduce_op::prod) {
        expected = 1;
        for (int r = 1; r <= comm.size(); ++r) {
          expected *= base * r;
        }
      }
      BOOST_TEST_REQUIRE(v[i] == expected, cohort::to_string(op) << " element " << i);
    }
  }
  // Sums whose rounding depends on the order: the same bits on every rank.
  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0f / static_cast<float>(i + 1 + 7 * static_cast<std::size_t>(comm.rank())) * 1e7f;
  }
  comm.allreduce(f);
  const auto all = comm.allgather_obj(f);
  for (const auto& other : all) {
    BOOST_TEST_REQUIRE(std::memcmp(other.data(), f.data(), f.size() * sizeof(float)) == 0);
  }
  // Where the order of the operands shows: min and max of NaN and of -0 and +0, and sums of NaNs
  // of different payloads. Every rank gets the same bits (a step skipped on one rank for a NaN
  // its max saw, and taken on another, would leave the replicas apart).
  for (const reduce_op op : {reduce_op::max, reduce_op::min, reduce_op::sum}) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float other_nan = -std::numeric_limits<float>::quiet_NaN();
    const bool odd = comm.rank() % 2 == 1;
    std::vector<float> v = {odd ? nan : 1.0f, odd ? 1.0f : nan, odd ? -0.0f : 0.0f,
                            odd ? 0.0f : -0.0f, odd ? nan : other_nan};
    comm.allreduce(v, op);
    for (const auto& other : comm.allgather_obj(v)) {
      BOOST_TEST_REQUIRE(std::memcmp(other.data(), v.data(), v.size() * sizeof(float)) == 0,
                         cohort::to_string(op));
    }
  }
  if (comm.size() < 2) {
    return;
  }
  // Mismatches, carried or not: an error on every rank, every rank's data untouched.
  const int last = comm.size() - 1;
  const auto untouched = [&](std::vector<float>& x, std::size_t n, reduce_op op,
                             const std::vector<std::string>& parts) {
    x.assign(n, static_cast<float>(comm.rank() + 2));
    BOOST_CHECK_EXCEPTION(comm.allreduce(x, op), cohort::mismatch_error, message_has(parts));
    BOOST_TEST(x.size() == n);
    for (const float value : x) {
      BOOST_TEST_REQUIRE(value == static_cast<float>(comm.rank() + 2));
    }
  };
  std::vector<float> x;
  const bool is_last = comm.rank() == last;
  untouched(x, is_last ? 9 : 10, reduce_op::sum, {"10 float32 elements", "9 float32 elements"});
  untouched(x, 16, is_last ? reduce_op::max : reduce_op::sum, {"op sum", "op max"});
  // One rank over the limit, the others under it.
  untouched(x, is_last ? limit / 4 + 1 : 10, reduce_op::sum,
            {"10 float32 elements", std::to_string(limit / 4 + 1) + " float32 elements"});
  // The same bytes in another dtype.
  std::vector<double> d(8, 1.0);
  std::vector<float> g(16, 1.0f);
  const auto dtype_message = message_has({"8 float64 elements", "16 float32 elements"});
  if (is_last) {
    BOOST_CHECK_EXCEPTION(comm.allreduce(d), cohort::mismatch_error, dtype_message);
    BOOST_TEST(d[0] == 1.0);
  } else {
    BOOST_CHECK_EXCEPTION(comm.allreduce(g), cohort::mismatch_error, dtype_message);
    BOOST_TEST(g[0] == 1.0f);
  }
  // In step again.
  std::vector<float> ok(2, 1.0f);
  comm.allreduce(ok);
  BOOST_TEST(ok[1] == static_cast<float>(comm.size()));
}

// A carried rendezvous goes as a train of messages of at most liveness::eager_bytes. Trains
// that end on either side of a message's end are reduced right; ranks whose trains differ in
// length (one carries two messages' worth, another one) all fall back, and the channel is left
// clean: the next rendezvous reduces.
BOOST_AUTO_TEST_CASE(trains_of_any_length_arrive_whole) {
  using cohort::engine::liveness;
  const boost::mpi::communicator world;
  liveness live(world, std::chrono::minutes(1), std::chrono::minutes(0));
  std::uint64_t sequence = 0;
  const auto carry = [&](std::size_t bytes) {
    std::vector<std::uint8_t> x(bytes, static_cast<std::uint8_t>(world.rank() + 1));
    const cohort::const_tensor_view data{x.data(), x.size(), dtype::uint8,
                                         cohort::memory_location::host};
    std::array<std::uint64_t, 2> values{7, ~std::uint64_t{7}};
    const std::byte* reduced = live.allreduce_max_carrying(
        cohort::engine::waiter::caller, values, "train", ++sequence, data, reduce_op::sum);
    return reduced == nullptr
               ? std::vector<std::uint8_t>{}
               : std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(reduced),
                                           reinterpret_cast<const std::uint8_t*>(reduced) + bytes);
  };
  const std::size_t first = liveness::eager_bytes - liveness::prefix_bytes;
  const std::vector<std::size_t> lengths = {1,
                                            first - 1,
                                            first,
                                            first + 1,
                                            first + liveness::eager_bytes,
                                            first + liveness::eager_bytes + 1,
                                            liveness::max_carried_bytes};
  const auto sum = static_cast<std::uint8_t>(world.size() * (world.size() + 1) / 2);
  for (const std::size_t bytes : lengths) {
    const std::vector<std::uint8_t> reduced = carry(bytes);
    BOOST_TEST_REQUIRE(reduced.size() == bytes, bytes << " bytes carried");
    BOOST_TEST(std::count(reduced.begin(), reduced.end(), sum) == static_cast<long>(bytes));
  }
  if (world.size() > 1) {
    // Rank r carries lengths[(k + r) % n]: trains of other lengths meet at every k.
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      const std::size_t bytes =
          lengths[(k + static_cast<std::size_t>(world.rank())) % lengths.size()];
      BOOST_TEST(carry(bytes).empty(), "trains of other lengths reduced, " << bytes << " bytes");
    }
  }
  const std::vector<std::uint8_t> after = carry(first + 1);
  BOOST_TEST_REQUIRE(after.size() == first + 1);
  BOOST_TEST(after.back() == sum);
}

// The rule behind the carried agreement's safety: every rendezvous says how many bytes its rank
// carried. A rank that carried nothing where the others did (its packing fell back, say) makes
// every rank fall back, the ranks two exchanges away included; none returns a partial reduction.
BOOST_AUTO_TEST_CASE(a_rank_that_carries_nothing_makes_every_rank_fall_back) {
  const boost::mpi::communicator world;
  cohort::engine::liveness live(world, std::chrono::minutes(1), std::chrono::minutes(0));
  std::vector<float> x(10, static_cast<float>(world.rank() + 1));
  const cohort::const_tensor_view data{x.data(), x.size(), dtype::float32,
                                       cohort::memory_location::host};
  std::uint64_t sequence = 0;
  for (int skipper = 0; skipper < world.size(); ++skipper) {
    std::array<std::uint64_t, 2> values{7, ~std::uint64_t{7}};
    const std::byte* reduced = nullptr;
    if (world.rank() == skipper) {
      live.allreduce_max(cohort::engine::waiter::caller, values, "carrying", ++sequence);
    } else {
      reduced = live.allreduce_max_carrying(cohort::engine::waiter::caller, values, "carrying",
                                            ++sequence, data, reduce_op::sum);
    }
    BOOST_TEST((values == std::array<std::uint64_t, 2>{7, ~std::uint64_t{7}}));
    BOOST_TEST((reduced == nullptr || world.size() == 1),
               "rank " << world.rank() << " used a reduction that rank " << skipper << " left out");
  }
  // Every rank carrying: the sum, everywhere.
  std::array<std::uint64_t, 2> values{7, ~std::uint64_t{7}};
  const std::byte* reduced = live.allreduce_max_carrying(
      cohort::engine::waiter::caller, values, "carrying", ++sequence, data, reduce_op::sum);
  BOOST_TEST_REQUIRE(reduced != nullptr);
  float first = 0;
  std::memcpy(&first, reduced, sizeof first);
  BOOST_TEST(first == static_cast<float>(world.size() * (world.size() + 1) / 2));
}
