// SPDX-License-Identifier: Apache-2.0
// sharded_optimizer (ZeRO stages 1 and 2) against distributed_optimizer, and the engine's
// reduce-scattered gradients against its all-reduced ones. (A second translation unit of
// training.sharding: shard_plan.cpp holds the module and main.)
#include <cohort/cohort.hpp>

#include <boost/mpi/collectives.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "support/expect.hpp"

using cohort::test::message_has;

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

// Users' optimizers, unaware of cohort: each keeps state for the parameters it is given only.
struct sgd_momentum {
  std::vector<param> params;
  std::vector<std::vector<float>> velocity;
  float lr = 0.05f, momentum = 0.9f;
  explicit sgd_momentum(std::vector<param> p)
      : params(std::move(p)) {
    for (const param& q : params) {
      velocity.emplace_back(q.value->size(), 0.0f);
    }
  }
  void step() {
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].value->size(); ++i) {
        velocity[p][i] = momentum * velocity[p][i] + (*params[p].grad)[i];
        (*params[p].value)[i] -= lr * velocity[p][i];
      }
    }
  }
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (const auto& v : velocity) {
      bytes += v.size() * sizeof(float);
    }
    return bytes;
  }
};

// Adam, and AdamW with decoupled weight decay.
struct adam {
  std::vector<param> params;
  std::vector<std::vector<float>> m, v;
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f, weight_decay = 0.0f;
  int t = 0;
  adam(std::vector<param> p, float decay)
      : params(std::move(p))
      , weight_decay(decay) {
    for (const param& q : params) {
      m.emplace_back(q.value->size(), 0.0f);
      v.emplace_back(q.value->size(), 0.0f);
    }
  }
  void step() {
    ++t;
    const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
    const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto& w = *params[p].value;
      const auto& g = *params[p].grad;
      for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] -= lr * weight_decay * w[i];
        m[p][i] = beta1 * m[p][i] + (1 - beta1) * g[i];
        v[p][i] = beta2 * v[p][i] + (1 - beta2) * g[i] * g[i];
        w[i] -= lr * (m[p][i] / c1) / (std::sqrt(v[p][i] / c2) + epsilon);
      }
    }
  }
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (std::size_t p = 0; p < m.size(); ++p) {
      bytes += (m[p].size() + v[p].size()) * sizeof(float);
    }
    return bytes;
  }
};

// A model of parameters of several sizes (so that shards are uneven), each rank starting from
// values of its own (the wrapper's broadcast makes them one).
struct model {
  static constexpr std::size_t sizes[] = {1000, 37, 513, 4096, 7, 250, 64, 129};
  std::vector<std::vector<float>> values, grads;
  std::vector<param> params;
  explicit model(int rank) {
    for (std::size_t p = 0; p < std::size(sizes); ++p) {
      values.emplace_back(sizes[p]);
      grads.emplace_back(sizes[p], 0.0f);
      for (std::size_t i = 0; i < sizes[p]; ++i) {
        values[p][i] = std::sin(static_cast<float>(i + 31 * p) + 100.0f * rank);
      }
    }
    for (std::size_t p = 0; p < std::size(sizes); ++p) {
      params.push_back({"layer" + std::to_string(p), &values[p], &grads[p]});
    }
  }
  // This rank's gradient at `step`: different on every rank, and dependent on the values, so
  // that a wrong update anywhere changes every later step.
  void backward(int rank, int step) {
    for (std::size_t p = 0; p < values.size(); ++p) {
      for (std::size_t i = 0; i < values[p].size(); ++i) {
        grads[p][i] = std::cos(0.01f * static_cast<float>(i) + static_cast<float>(step + p)) *
                          (1.0f + 0.25f * static_cast<float>(rank)) +
                      0.1f * values[p][i];
      }
    }
  }
};

std::uint64_t checksum(const model& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& v : m.values) {
    for (const float x : v) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      h = (h ^ bits) * 1099511628211ull;
    }
  }
  return h;
}

void require_identical_replicas(const model& m) {
  const boost::mpi::communicator world;
  std::vector<std::uint64_t> all;
  boost::mpi::all_gather(world, checksum(m), all);
  BOOST_TEST(std::all_of(all.begin(), all.end(), [&](std::uint64_t h) { return h == all[0]; }));
}

void require_close(const model& sharded, const model& reference, float tolerance) {
  float worst = 0.0f;
  for (std::size_t p = 0; p < sharded.values.size(); ++p) {
    for (std::size_t i = 0; i < sharded.values[p].size(); ++i) {
      const float a = sharded.values[p][i];
      const float b = reference.values[p][i];
      worst = std::max(worst, std::abs(a - b) / std::max(1.0f, std::abs(b)));
    }
  }
  BOOST_TEST(worst <= tolerance);
}

enum class kind { momentum, adam, adamw };

template <class Optimizer>
Optimizer make(kind k, std::vector<param> owned) {
  if constexpr (std::is_same_v<Optimizer, sgd_momentum>) {
    return sgd_momentum(std::move(owned));
  } else {
    return adam(std::move(owned), k == kind::adamw ? 0.01f : 0.0f);
  }
}

constexpr int steps = 20;

// 20 steps unsharded, then sharded at `stage`, blocking or overlapped (grad_ready in reverse,
// as backward goes); returns both models.
template <class Strategy, class Optimizer>
std::pair<model, model> train_both(kind k, cohort::zero_stage stage, bool overlapped,
                                   cohort::communicator_options options = {}) {
  auto comm = cohort::make_communicator<Strategy>(options);
  const int rank = comm.rank();
  model reference(rank);
  {
    cohort::distributed_optimizer opt(make<Optimizer>(k, reference.params), comm, reference.params);
    for (int s = 0; s < steps; ++s) {
      reference.backward(rank, s);
      opt.step();
    }
  }
  model sharded(rank);
  cohort::sharded_optimizer opt(
      [&](std::vector<param> owned) { return make<Optimizer>(k, std::move(owned)); }, comm,
      sharded.params, cohort::sharded_optimizer_options{.stage = stage});
  for (int s = 0; s < steps; ++s) {
    sharded.backward(rank, s);
    if constexpr (cohort::overlapping_communicator<Strategy>) {
      if (overlapped) {
        for (std::size_t i = sharded.params.size(); i-- > 0;) {
          opt.grad_ready(i);
        }
      }
    }
    opt.step();
  }
  // The state is this rank's shard's alone.
  const std::size_t per_element = std::is_same_v<Optimizer, sgd_momentum> ? 1 : 2;
  BOOST_TEST(opt.inner().state_bytes() == per_element * opt.plan().load[rank]);
  return {std::move(sharded), std::move(reference)};
}

using strategies =
    std::tuple<cohort::flat, cohort::naive, cohort::hierarchical<>, cohort::two_dimensional<>>;

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(stage_1_steps_as_the_unsharded_optimizer, Strategy, strategies) {
  for (const kind k : {kind::momentum, kind::adam, kind::adamw}) {
    auto [sharded, reference] =
        k == kind::momentum
            ? train_both<Strategy, sgd_momentum>(k, cohort::zero_stage::optimizer_state, false)
            : train_both<Strategy, adam>(k, cohort::zero_stage::optimizer_state, false);
    // The same reduced gradients and the same arithmetic: the same bits.
    require_close(sharded, reference, 0.0f);
    require_identical_replicas(sharded);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(stage_2_steps_as_the_unsharded_optimizer, Strategy, strategies) {
  // Small buckets, so that a step reduce-scatters several, some holding one owner's parameters
  // only, others several owners'.
  const cohort::communicator_options small{.bucket_bytes = 4096, .first_bucket_bytes = 1024};
  for (const kind k : {kind::momentum, kind::adam, kind::adamw}) {
    for (const bool overlapped : {false, true}) {
      auto [sharded, reference] =
          k == kind::momentum
              ? train_both<Strategy, sgd_momentum>(k, cohort::zero_stage::gradients, overlapped,
                                                   small)
              : train_both<Strategy, adam>(k, cohort::zero_stage::gradients, overlapped, small);
      // A reduce-scatter may sum in another order than an all-reduce: equal to rounding.
      require_close(sharded, reference, 2e-5f);
      require_identical_replicas(sharded);
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_scattered_gradients_equal_the_all_reduced_ones) {
  // The engine alone: every owner's reduced gradients are the all-reduce's, blocking and
  // overlapped, float and double in one set; the gradients a rank does not own stay its own.
  const cohort::communicator_options small{.bucket_bytes = 2048, .first_bucket_bytes = 512};
  auto comm = cohort::make_communicator<cohort::flat>(small);
  const int rank = comm.rank();
  std::vector<std::vector<float>> fv(5), fg(5);
  std::vector<std::vector<double>> dv(3), dg(3);
  std::vector<std::size_t> bytes;
  const auto fill = [&](int r) {
    for (std::size_t p = 0; p < 5; ++p) {
      fg[p].resize(100 + 90 * p);
      fv[p].resize(fg[p].size());
      for (std::size_t i = 0; i < fg[p].size(); ++i) {
        fg[p][i] = static_cast<float>(r + 1) * static_cast<float>(i % 7 + p);
      }
    }
    for (std::size_t p = 0; p < 3; ++p) {
      dg[p].resize(300 - 50 * p);
      dv[p].resize(dg[p].size());
      for (std::size_t i = 0; i < dg[p].size(); ++i) {
        dg[p][i] = 0.5 * (r + 1) * static_cast<double>(i % 5 + p);
      }
    }
  };
  fill(rank);
  // A float set and a double set, each scattered by a plan of its own.
  std::vector<param> floats;
  for (std::size_t p = 0; p < 5; ++p) {
    floats.push_back({"f" + std::to_string(p), &fv[p], &fg[p]});
    bytes.push_back(fv[p].size() * sizeof(float));
  }
  std::vector<cohort::parameter_ref<std::vector<double>>> doubles;
  for (std::size_t p = 0; p < 3; ++p) {
    doubles.push_back({"d" + std::to_string(p), &dv[p], &dg[p]});
  }
  const cohort::shard_plan plan = cohort::balance_shards(bytes, comm.size());
  std::vector<std::size_t> dbytes = {300 * 8, 250 * 8, 200 * 8};
  const cohort::shard_plan dplan = cohort::balance_shards(dbytes, comm.size());
  // The expected values: the all-reduced sums' mean.
  fill(rank);
  comm.allreduce_grad(floats, cohort::mean{});
  comm.allreduce_grad(doubles, cohort::mean{});
  const auto expected_f = fg;
  const auto expected_d = dg;
  for (const bool overlapped : {false, true}) {
    fill(rank);
    const auto local_f = fg;
    const auto local_d = dg;
    cohort::grad_sync_options options;
    options.owners = plan.owner;
    if (overlapped) {
      auto request = comm.begin_allreduce_grad(floats, cohort::mean{}, options);
      for (std::size_t i = floats.size(); i-- > 0;) {
        request.ready(i);
      }
      request.wait();
    } else {
      comm.allreduce_grad(floats, cohort::mean{}, options);
    }
    options.owners = dplan.owner;
    comm.allreduce_grad(doubles, cohort::mean{}, options);
    for (std::size_t p = 0; p < 5; ++p) {
      BOOST_TEST(fg[p] == (plan.owner[p] == rank ? expected_f[p] : local_f[p]),
                 boost::test_tools::per_element());
    }
    for (std::size_t p = 0; p < 3; ++p) {
      BOOST_TEST(dg[p] == (dplan.owner[p] == rank ? expected_d[p] : local_d[p]),
                 boost::test_tools::per_element());
    }
  }
  // Owners of another set's length, or a rank that is not one: an error on every rank, naming it.
  const std::vector<int> short_owners(3, 0);
  cohort::grad_sync_options wrong;
  wrong.owners = short_owners;
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(floats, cohort::mean{}, wrong),
                        cohort::invalid_argument, message_has({"3 owners for 5 parameters"}));
  std::vector<int> beyond = plan.owner;
  beyond[2] = comm.size();
  wrong.owners = beyond;
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(floats, cohort::mean{}, wrong), cohort::invalid_argument,
      message_has({"parameter 'f2' is owned by rank " + std::to_string(comm.size())}));
}

namespace {

// Seven gradients each alone in its bucket (in place), owned by one rank after another: across
// nodes, the reduces to their owners are in flight several at once. Each owner's gradient holds
// the mean, the others' stay this rank's own, blocking and overlapped; a problem found mid-step
// is an error on every rank, with the reduces already started completed, and the next step is
// right; an abandoned step sends nothing it had not marked. Returns whether the communicator
// spans several nodes.
bool reduce_to_single_owners(int ranks_per_node, const std::filesystem::path& trace_directory) {
  auto comm = cohort::make_communicator<cohort::flat>(
      cohort::communicator_options{.simulated_ranks_per_node = ranks_per_node,
                                   .bucket_bytes = 1024,
                                   .first_bucket_bytes = 256,
                                   .trace_directory = trace_directory.string()});
  const int rank = comm.rank();
  const int n = comm.size();
  constexpr std::size_t count = 7;
  std::vector<std::vector<float>> values(count), grads(count);
  std::vector<param> params;
  std::vector<int> owners;
  for (std::size_t p = 0; p < count; ++p) {
    values[p].resize(300 + 10 * p); // at least 1200 bytes: past the bucket, reduced in place
    params.push_back({"g" + std::to_string(p), &values[p], &grads[p]});
    owners.push_back(static_cast<int>(p) % n);
  }
  const auto term = [](std::size_t p, std::size_t i, int step) {
    return static_cast<float>(i % 5 + p + static_cast<std::size_t>(step));
  };
  const auto fill = [&](int step) {
    for (std::size_t p = 0; p < count; ++p) {
      grads[p].resize(values[p].size());
      for (std::size_t i = 0; i < grads[p].size(); ++i) {
        grads[p][i] = static_cast<float>(rank + 1) * term(p, i, step);
      }
    }
    return grads;
  };
  // The mean of (r + 1) * term over the ranks is (n + 1) / 2 * term.
  const auto check = [&](int step, const std::vector<std::vector<float>>& local) {
    for (std::size_t p = 0; p < count; ++p) {
      BOOST_TEST_CONTEXT("step " << step << ", gradient " << p << " of rank " << owners[p]) {
        for (std::size_t i = 0; i < grads[p].size(); ++i) {
          const float expected =
              owners[p] == rank ? static_cast<float>(n + 1) / 2.0f * term(p, i, step) : local[p][i];
          BOOST_TEST_REQUIRE(grads[p][i] == expected, boost::test_tools::tolerance(1e-6f));
        }
      }
    }
  };
  cohort::grad_sync_options options;
  options.owners = owners;
  (void)comm.take_grad_sync_stats();
  int step = 0;
  for (const bool overlapped : {false, true}) {
    for (int repeat = 0; repeat < 3; ++repeat, ++step) {
      const auto local = fill(step);
      if (overlapped) {
        auto request = comm.begin_allreduce_grad(params, cohort::mean{}, options);
        for (std::size_t p = count; p-- > 0;) {
          request.ready(p);
        }
        request.wait();
      } else {
        comm.allreduce_grad(params, cohort::mean{}, options);
      }
      check(step, local);
    }
  }
  // Every gradient went on the wire once a step, each in a bucket of its own.
  const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
  std::uint64_t bytes = 0;
  for (const auto& v : values) {
    bytes += v.size() * sizeof(float);
  }
  BOOST_TEST(stats.wire_bytes == 6 * bytes);
  BOOST_TEST(stats.buckets == 6 * count);

  // The last rank marks a gradient twice halfway through: the next bucket's agreement fails on
  // every rank, after the buckets before it started their reduces.
  fill(step);
  {
    auto request = comm.begin_allreduce_grad(params, cohort::mean{}, options);
    for (std::size_t p = count; p-- > 0;) {
      request.ready(p);
      if (p == 4 && rank == n - 1) {
        request.ready(p);
      }
    }
    BOOST_CHECK_EXCEPTION(request.wait(), cohort::error,
                          message_has({"'g4'", "marked ready twice"}));
  }
  ++step;
  auto local = fill(step);
  comm.allreduce_grad(params, cohort::mean{}, options);
  check(step++, local);

  // Abandoned after two gradients: those two are reduced, the others never leave.
  local = fill(step);
  try {
    auto request = comm.begin_allreduce_grad(params, cohort::mean{}, options);
    request.ready(6);
    request.ready(5);
    throw std::runtime_error("backward failed");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(!comm.grad_sync_pending());
  for (std::size_t p = 0; p < 5; ++p) {
    BOOST_TEST_REQUIRE(grads[p] == local[p], boost::test_tools::per_element());
  }
  ++step;
  local = fill(step);
  comm.allreduce_grad(params, cohort::mean{}, options);
  check(step, local);
  return comm.inter_size() > 1;
}

} // namespace

BOOST_AUTO_TEST_CASE(reduces_to_single_owners_in_flight_together) {
  // On one node one reduce at a time (blocking, as Open MPI's is faster there); with every rank a
  // node of its own, in flight: the trace says which.
  for (const int ranks_per_node : {0, 1}) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("cohort-test-owners-" + std::to_string(::getpid()) + "-" + std::to_string(ranks_per_node));
    const bool across_nodes = reduce_to_single_owners(ranks_per_node, dir);
    std::string trace;
    for (const auto& file : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(file.path());
      trace.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::filesystem::remove_all(dir);
    BOOST_TEST_CONTEXT(ranks_per_node << " ranks a node") {
      BOOST_TEST(!trace.empty());
      BOOST_TEST((trace.find("reduce (started)") != std::string::npos) == across_nodes);
      BOOST_TEST((trace.find("reduce (completed)") != std::string::npos) == across_nodes);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_owning_nothing_and_the_dummy_strategy) {
  // Two parameters over up to 4 ranks: ranks 2 and 3 own nothing, step nothing, and still
  // receive every update. Over dummy (nothing summed) the gather still makes the replicas one.
  auto comm = cohort::make_communicator<cohort::flat>();
  const int rank = comm.rank();
  std::vector<float> a(10, 1.0f), ga(10), b(6, 2.0f), gb(6);
  std::vector<param> params = {{"a", &a, &ga}, {"b", &b, &gb}};
  cohort::sharded_optimizer opt([](std::vector<param> owned) { return sgd_momentum(owned); }, comm,
                                params);
  BOOST_TEST(opt.inner().params.size() == (comm.size() == 1 ? 2u : rank < 2 ? 1u : 0u));
  std::fill(ga.begin(), ga.end(), static_cast<float>(rank));
  std::fill(gb.begin(), gb.end(), 1.0f);
  opt.step();
  const float mean_rank = static_cast<float>(comm.size() - 1) / 2.0f;
  BOOST_TEST(a[3] == 1.0f - 0.05f * mean_rank, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(b[5] == 2.0f - 0.05f, boost::test_tools::tolerance(1e-6f));

  auto dummy = cohort::make_communicator<cohort::dummy>();
  std::vector<float> c(8, static_cast<float>(rank)), gc(8);
  std::vector<param> one = {{"c", &c, &gc}};
  cohort::sharded_optimizer lone([](std::vector<param> owned) { return sgd_momentum(owned); },
                                 dummy, one);
  std::fill(gc.begin(), gc.end(), static_cast<float>(rank + 1));
  lone.step();
  // Rank 0 owns c; dummy sums nothing, so rank 0's own gradient (1, scaled by the mean's 1/N)
  // updates it, and every rank receives that value.
  BOOST_TEST(c[0] == -0.05f / static_cast<float>(comm.size()), boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(stage_2_reduces_a_rank_s_own_gradients_alone) {
  // After synchronize(), the gradients this rank owns hold the mean, the others its own values:
  // the reduction was scattered, not all-reduced. And the learned bucket order (overlapped) is
  // filed under the same layout on every rank, as a checkpoint's replicated state must be.
  auto comm = cohort::make_communicator<cohort::flat>(
      cohort::communicator_options{.bucket_bytes = 4096, .first_bucket_bytes = 1024});
  const int rank = comm.rank();
  model m(rank);
  cohort::sharded_optimizer opt(
      [](std::vector<param> owned) { return sgd_momentum(std::move(owned)); }, comm, m.params);
  for (int s = 0; s < 2; ++s) {
    m.backward(rank, s);
    for (std::size_t i = m.params.size(); i-- > 0;) {
      opt.grad_ready(i);
    }
    opt.step();
  }
  m.backward(rank, 2);
  const auto local = m.grads;
  opt.synchronize();
  for (std::size_t p = 0; p < m.grads.size(); ++p) {
    BOOST_TEST_CONTEXT("parameter " << p << ", owned: " << opt.owns(p)) {
      if (!opt.owns(p) || comm.size() == 1) {
        BOOST_TEST(m.grads[p] == local[p], boost::test_tools::per_element());
      } else {
        BOOST_TEST(m.grads[p] != local[p]);
      }
    }
  }
  opt.step();
  const auto orders = comm.learned_bucket_orders();
  BOOST_TEST_REQUIRE(orders.size() == 1u);
  std::vector<std::uint64_t> layouts;
  boost::mpi::all_gather(boost::mpi::communicator(), orders.front().layout, layouts);
  BOOST_TEST(std::all_of(layouts.begin(), layouts.end(),
                         [&](std::uint64_t l) { return l == layouts.front(); }));
}

// An optimizer whose step fails on rank 1 alone.
struct failing_on_rank_1 {
  std::vector<param> params;
  int rank = 0;
  void step() {
    if (rank == 1) {
      throw std::runtime_error("this step failed here");
    }
  }
};

BOOST_AUTO_TEST_CASE(a_step_or_an_optimizer_that_fails_on_one_rank_fails_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int rank = comm.rank();
  if (comm.size() == 1) {
    return;
  }
  model m(rank);
  cohort::sharded_optimizer opt(
      [&](std::vector<param> owned) {
        return failing_on_rank_1{std::move(owned), rank};
      },
      comm, m.params);
  m.backward(rank, 0);
  if (rank == 1) {
    BOOST_CHECK_EXCEPTION(opt.step(), std::runtime_error, message_has({"this step failed here"}));
  } else {
    BOOST_CHECK_EXCEPTION(opt.step(), cohort::error, message_has({"failed on rank 1"}));
  }
  // The next step goes on, on every rank (the failed one's gradients were reduced, not applied).
  opt.inner().rank = 0;
  m.backward(rank, 1);
  opt.step();
  require_identical_replicas(m);
  const auto make = [&](std::vector<param> owned) {
    if (rank == 1) {
      throw std::runtime_error("no optimizer here");
    }
    return sgd_momentum(std::move(owned));
  };
  model other(rank);
  if (rank == 1) {
    BOOST_CHECK_EXCEPTION(cohort::sharded_optimizer(make, comm, other.params), std::runtime_error,
                          message_has({"no optimizer here"}));
  } else {
    BOOST_CHECK_EXCEPTION(cohort::sharded_optimizer(make, comm, other.params), cohort::error,
                          message_has({"making the optimizer", "failed on rank 1"}));
  }
}

BOOST_AUTO_TEST_CASE(misuse_is_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int rank = comm.rank();
  model m(rank);
  cohort::sharded_optimizer opt(
      [](std::vector<param> owned) { return sgd_momentum(std::move(owned)); }, comm, m.params);
  m.backward(rank, 0);
  opt.step();
  // Stage 2: a second backward onto reduced gradients.
  m.backward(rank, 1);
  opt.synchronize();
  BOOST_CHECK_EXCEPTION(opt.grad_ready(0), cohort::invalid_argument,
                        message_has({"gradients sharded (stage 2)", "no_sync()"}));
  opt.skip_step();
  // A parameter that changed size since the plan: the gradients' agreement names it.
  m.values[4].resize(8);
  m.grads[4].resize(8);
  m.backward(rank, 2);
  BOOST_CHECK_EXCEPTION(opt.step(), cohort::invalid_argument,
                        message_has({"layer4", "holds 8", "made for 7"}));
  m.values[4].resize(7);
  m.grads[4].resize(7);
  // Ranks whose parameters differ: the plan's agreement names the first that differs.
  model other(rank);
  std::vector<float> extra(rank == 0 ? 3 : 4), gextra(extra.size());
  other.params.push_back({"extra", &extra, &gextra});
  if (comm.size() > 1) {
    BOOST_CHECK_EXCEPTION(
        cohort::sharded_optimizer(
            [](std::vector<param> owned) { return sgd_momentum(std::move(owned)); }, comm,
            other.params),
        cohort::mismatch_error, message_has({"sharded_optimizer", "extra"}));
  }
  BOOST_CHECK_EXCEPTION(cohort::sharded_optimizer(
                            [](std::vector<param> owned) { return sgd_momentum(std::move(owned)); },
                            comm, m.params,
                            cohort::sharded_optimizer_options{.stage = cohort::zero_stage{3}}),
                        cohort::invalid_argument, message_has({"stage 3"}));
}
