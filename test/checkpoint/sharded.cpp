// SPDX-License-Identifier: Apache-2.0
// A sharded optimizer's state in a checkpoint, resumed at another number of ranks (2 -> 3 and
// 3 -> 2 at 3 ranks; 1 -> 2 and 2 -> 1 at 2): each rank saves its shard's Adam moments by name,
// and each rank of the resuming job takes the moments of the parameters it owns under the new
// plan, from whichever rank saved them; training then goes on as one unbroken run would. A
// tensor no rank saved, two ranks saved, or saved at another size is an error naming it, on
// every rank. (A second translation unit of checkpoint.checkpointer.)
#include <cohort/checkpoint.hpp>
#include <cohort/cohort.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/fresh_directory.hpp"
#include "support/expect.hpp"
#include "support/first_ranks.hpp"

using cohort::test::fresh_directory;
using cohort::test::message_has;
using cohort::test::on_first;

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

// A user's Adam, unaware of cohort, over the parameters it is given.
struct adam {
  std::vector<param> params;
  std::vector<std::vector<float>> m, v;
  int t = 0;
  explicit adam(std::vector<param> p)
      : params(std::move(p)) {
    for (const param& q : params) {
      m.emplace_back(q.value->size(), 0.0f);
      v.emplace_back(q.value->size(), 0.0f);
    }
  }
  void step() {
    ++t;
    const float c1 = 1.0f - std::pow(0.9f, static_cast<float>(t));
    const float c2 = 1.0f - std::pow(0.999f, static_cast<float>(t));
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto& w = *params[p].value;
      const auto& g = *params[p].grad;
      for (std::size_t i = 0; i < w.size(); ++i) {
        m[p][i] = 0.9f * m[p][i] + 0.1f * g[i];
        v[p][i] = 0.999f * v[p][i] + 0.001f * g[i] * g[i];
        w[i] -= 0.01f * (m[p][i] / c1) / (std::sqrt(v[p][i] / c2) + 1e-8f);
      }
    }
  }
  // Its state, by name, for a checkpoint: the moments of the parameters it holds.
  std::vector<param> moments() {
    std::vector<param> named;
    for (std::size_t p = 0; p < params.size(); ++p) {
      named.push_back({params[p].name + "/m", &m[p], nullptr});
      named.push_back({params[p].name + "/v", &v[p], nullptr});
    }
    return named;
  }
};

// Parameters of several sizes, so that 2 and 3 ranks own different shards.
struct model {
  static constexpr std::size_t sizes[] = {700, 37, 513, 1024, 7, 250};
  std::vector<std::vector<float>> values, grads;
  std::vector<param> params;
  explicit model(float seed) {
    for (std::size_t p = 0; p < std::size(sizes); ++p) {
      values.emplace_back(sizes[p]);
      grads.emplace_back(sizes[p], 0.0f);
      for (std::size_t i = 0; i < sizes[p]; ++i) {
        values[p][i] = std::sin(static_cast<float>(i + 31 * p) + seed);
      }
    }
    for (std::size_t p = 0; p < std::size(sizes); ++p) {
      params.push_back({"layer" + std::to_string(p), &values[p], &grads[p]});
    }
  }
  model(const model&) = delete;
  model& operator=(const model&) = delete;
  // Rank `rank`'s gradient at `step`, dependent on the values.
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

constexpr int steps_before = 6, steps_after = 6;

// One unbroken run, computed alone: `steps_before` steps of the mean gradient of `before` ranks,
// then `steps_after` of `after` ranks'.
std::pair<std::vector<std::vector<float>>, adam> reference(int before, int after) {
  model m(1.0f); // rank 0's, which the sharded runs broadcast
  model probe(1.0f);
  adam opt(m.params);
  for (int s = 0; s < steps_before + steps_after; ++s) {
    const int ranks = s < steps_before ? before : after;
    std::vector<std::vector<float>> sum = m.grads;
    for (auto& g : sum) {
      std::fill(g.begin(), g.end(), 0.0f);
    }
    for (int r = 0; r < ranks; ++r) {
      probe.values = m.values;
      probe.backward(r, s);
      for (std::size_t p = 0; p < sum.size(); ++p) {
        for (std::size_t i = 0; i < sum[p].size(); ++i) {
          sum[p][i] += probe.grads[p][i];
        }
      }
    }
    for (std::size_t p = 0; p < sum.size(); ++p) {
      for (std::size_t i = 0; i < sum[p].size(); ++i) {
        m.grads[p][i] = sum[p][i] / static_cast<float>(ranks);
      }
    }
    opt.step();
  }
  return {m.values, opt};
}

float worst_difference(const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b) {
  float worst = 0.0f;
  for (std::size_t p = 0; p < a.size(); ++p) {
    for (std::size_t i = 0; i < a[p].size(); ++i) {
      worst = std::max(worst, std::abs(a[p][i] - b[p][i]) / std::max(1.0f, std::abs(b[p][i])));
    }
  }
  return worst;
}

adam make_adam(std::vector<param> owned) {
  return adam(std::move(owned));
}

} // namespace

BOOST_AUTO_TEST_SUITE(sharded_state)

BOOST_AUTO_TEST_CASE(a_sharded_optimizer_resumes_at_another_number_of_ranks) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  // At 3 ranks 3 -> 3, 2 -> 3 and 3 -> 2; at 2, 2 -> 2, 1 -> 2 and 2 -> 1; at 1, 1 -> 1.
  std::vector<std::pair<int, int>> cases = {{n, n}};
  if (n > 1) {
    cases.insert(cases.end(), {{n - 1, n}, {n, n - 1}});
  }
  for (const cohort::zero_stage stage :
       {cohort::zero_stage::optimizer_state, cohort::zero_stage::gradients}) {
    for (const auto& [before, after] : cases) {
      BOOST_TEST_CONTEXT("stage " << static_cast<int>(stage) << ", " << before << " -> " << after
                                  << " ranks") {
        const fresh_directory scratch(comm, "sharded");
        const auto [expected, expected_state] = reference(before, after);
        on_first(comm, before, [&](cohort::flat& job) {
          model m(1.0f + static_cast<float>(job.rank())); // (the broadcast makes them one)
          cohort::sharded_optimizer opt(make_adam, job, m.params,
                                        cohort::sharded_optimizer_options{.stage = stage});
          for (int s = 0; s < steps_before; ++s) {
            m.backward(job.rank(), s);
            opt.step();
          }
          // A per-rank thing beside the sharded one: read past by the ranks of another job.
          std::mt19937_64 engine(static_cast<std::uint64_t>(job.rank()));
          auto moments = opt.inner().moments();
          cohort::checkpointer ckpt{job, scratch.path()};
          ckpt.save(steps_before, m.params, engine, cohort::sharded_tensors(moments),
                    cohort::serialized(opt.inner().t));
        });
        on_first(comm, after, [&](cohort::flat& job) {
          model m(5.0f); // other values and fresh moments: all from the checkpoint
          cohort::sharded_optimizer opt(make_adam, job, m.params,
                                        cohort::sharded_optimizer_options{.stage = stage});
          std::mt19937_64 engine(99);
          auto moments = opt.inner().moments();
          cohort::checkpointer ckpt{job, scratch.path()};
          BOOST_TEST(ckpt.resume(m.params, engine, cohort::sharded_tensors(moments),
                                 cohort::serialized(opt.inner().t))
                         .value_or(0) == static_cast<std::uint64_t>(steps_before));
          BOOST_TEST(opt.inner().t == steps_before);
          // The engine is this rank's only where as many ranks saved it.
          BOOST_TEST(
              (engine ==
               std::mt19937_64(before == after ? static_cast<std::uint64_t>(job.rank()) : 99u)));
          for (int s = steps_before; s < steps_before + steps_after; ++s) {
            m.backward(job.rank(), s);
            opt.step();
          }
          // As the unbroken run (a reduction sums in another order than the reference: to
          // rounding); the state is this rank's shard's alone.
          BOOST_TEST(worst_difference(m.values, expected) <= 2e-5f);
          const auto owned = opt.plan().owned_by(job.rank());
          BOOST_TEST(opt.inner().params.size() == owned.size());
          for (std::size_t k = 0; k < owned.size(); ++k) {
            BOOST_TEST(worst_difference({opt.inner().m[k]}, {expected_state.m[owned[k]]}) <= 2e-5f);
          }
        });
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sharded_tensors_that_do_not_fit_are_named_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "sharded-misfit");
  const int rank = comm.rank();
  // Rank r saves "t<r>" of r + 3 floats.
  std::vector<float> mine(static_cast<std::size_t>(rank) + 3, static_cast<float>(rank));
  std::vector<param> saved{{"t" + std::to_string(rank), &mine, nullptr}};
  int count = 7;
  cohort::checkpointer ckpt{comm, scratch.path()};
  ckpt.save(1, cohort::serialized(count), cohort::sharded_tensors(saved));

  // A resume that leaves the sharded state out is refused, at this number of ranks and at
  // another (where no rank's own file would otherwise be read).
  BOOST_CHECK_EXCEPTION(ckpt.resume(cohort::serialized(count)), cohort::checkpoint_error,
                        message_has({"holds 1 things, resume was given 0"}));
  if (comm.size() > 1) {
    on_first(comm, comm.size() - 1, [&](cohort::flat& job) {
      cohort::checkpointer fewer{job, scratch.path()};
      BOOST_CHECK_EXCEPTION(fewer.resume(cohort::serialized(count)), cohort::checkpoint_error,
                            message_has({"holds 1 things, resume was given 0"}));
    });
  }

  // Every rank asks for every saved tensor: each is found where it was saved.
  std::vector<std::vector<float>> all(static_cast<std::size_t>(comm.size()));
  std::vector<param> every;
  for (int r = 0; r < comm.size(); ++r) {
    all[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(r) + 3, -1.0f);
    every.push_back({"t" + std::to_string(r), &all[static_cast<std::size_t>(r)], nullptr});
  }
  BOOST_TEST(ckpt.resume(cohort::serialized(count), cohort::sharded_tensors(every)).value_or(0) ==
             1u);
  for (int r = 0; r < comm.size(); ++r) {
    BOOST_TEST(all[static_cast<std::size_t>(r)] ==
                   std::vector<float>(static_cast<std::size_t>(r) + 3, static_cast<float>(r)),
               boost::test_tools::per_element());
  }

  // A tensor no rank saved.
  std::vector<float> other(4);
  std::vector<param> missing{{"nobody's", &other, nullptr}};
  BOOST_CHECK_EXCEPTION(ckpt.resume(cohort::serialized(count), cohort::sharded_tensors(missing)),
                        cohort::checkpoint_error,
                        message_has({"sharded tensor 'nobody's' is in none of the " +
                                     std::to_string(comm.size()) + " saved ranks' parts"}));
  // Saved at another size.
  std::vector<float> wrong(7);
  std::vector<param> resized{{"t0", &wrong, nullptr}};
  BOOST_CHECK_EXCEPTION(
      ckpt.resume(cohort::serialized(count), cohort::sharded_tensors(resized)),
      cohort::checkpoint_error,
      message_has({"sharded tensor 't0'", "was saved with 12 bytes", "the one given has 28"}));
  // Saved by two ranks: the state was not a partition.
  if (comm.size() > 1) {
    const fresh_directory twice(comm, "sharded-twice");
    std::vector<param> same{{"same", &mine, nullptr}};
    std::vector<float> three(3);
    std::vector<param> one{{"same", &three, nullptr}};
    // (each rank's "same" is 3 floats where they are compared: ranks 0 and 1 save 3 and 4)
    mine.resize(3);
    cohort::checkpointer dup{comm, twice.path()};
    dup.save(2, cohort::sharded_tensors(same));
    BOOST_CHECK_EXCEPTION(dup.resume(cohort::sharded_tensors(one)), cohort::checkpoint_error,
                          message_has({"sharded tensor 'same'", "was saved by rank 0 too"}));
  }
}

BOOST_AUTO_TEST_SUITE_END()
