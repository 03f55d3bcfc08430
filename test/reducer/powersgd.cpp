// SPDX-License-Identifier: Apache-2.0
// PowerSGD as a gradient hook, over real ranks: its kernels against a double-precision reference;
// at full rank it is the mean; error feedback makes the updates applied add up to the gradients;
// replicas stay bitwise equal over every strategy, blocking, overlapped and double-buffered;
// warm-up steps are the mean's bits; options that differ, and shapes that do not fit, are errors
// on every rank; its state goes through a checkpoint's bytes and a resumed run continues bit for
// bit; and a user's own hook (random-k with memory) plugs in through the same concept.
#define BOOST_TEST_MODULE reducer.powersgd
#include <cohort/cohort.hpp>
#include <cohort/kernels/lowrank.hpp>
#if defined(COHORT_TEST_CHECKPOINT)
#include <cohort/checkpoint/powersgd.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;
namespace lowrank = cohort::kernels::lowrank;

namespace {

// A model of matrices and vectors of every shape a hook meets: tall, wide, n x 1, 1 x m, a
// vector without rows, float32 beside float64, and an int32 slot the hook does not handle.
struct shapes {
  struct matrix {
    std::string name;
    std::size_t rows, cols;
  };
  std::vector<matrix> doubles{{"conv", 12, 9}, {"tall", 20, 3}, {"wide", 4, 30},
                              {"bias", 7, 1},  {"row", 1, 9},   {"flat", 0, 5}};
  std::vector<matrix> floats{{"fc", 6, 16}};

  std::vector<std::vector<double>> dv, dg;
  std::vector<std::vector<float>> fv, fg;
  std::vector<std::int32_t> iv, ig;
  std::vector<cohort::parameter_ref<std::vector<double>>> dp;
  std::vector<cohort::parameter_ref<std::vector<float>>> fp;
  std::vector<cohort::parameter_ref<std::vector<std::int32_t>>> ip;

  shapes() {
    for (const matrix& m : doubles) {
      const std::size_t n = std::max<std::size_t>(m.rows, 1) * m.cols;
      dv.emplace_back(n, 0.0);
      dg.emplace_back(n, 0.0);
    }
    for (const matrix& m : floats) {
      fv.emplace_back(m.rows * m.cols, 0.0f);
      fg.emplace_back(m.rows * m.cols, 0.0f);
    }
    iv.assign(4, 0);
    ig.assign(4, 0);
    for (std::size_t i = 0; i < doubles.size(); ++i) {
      dp.push_back({doubles[i].name, &dv[i], &dg[i], doubles[i].rows});
    }
    for (std::size_t i = 0; i < floats.size(); ++i) {
      fp.push_back({floats[i].name, &fv[i], &fg[i], floats[i].rows});
    }
    ip.push_back({"steps", &iv, &ig});
  }

  // Per-rank gradients of step `step`.
  void fill(int rank, int step) {
    std::mt19937_64 engine(static_cast<std::uint64_t>(1000 * rank + step));
    std::normal_distribution<double> normal;
    for (auto& g : dg) {
      for (double& x : g) {
        x = normal(engine);
      }
    }
    for (auto& g : fg) {
      for (float& x : g) {
        x = static_cast<float>(normal(engine));
      }
    }
    for (std::int32_t& x : ig) {
      x = rank + step;
    }
  }
};

template <class Comm, class Reducer>
void reduce_all(Comm& comm, shapes& m, const Reducer& reducer) {
  comm.allreduce_grad(m.dp, reducer);
  comm.allreduce_grad(m.fp, reducer);
  comm.allreduce_grad(m.ip, reducer);
}

cohort::powersgd full_rank() {
  return cohort::powersgd({.rank = 64,
                           .start_step = 0,
                           .min_compression_rate = 0,
                           .error_feedback = false,
                           .warm_start = true});
}

double relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0;
  double scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return gap / std::max(scale, 1e-300);
}

// Rank 0's values of `v` on every rank (bitwise).
template <class Comm, class T>
std::vector<T> rank0(Comm& comm, const std::vector<T>& v) {
  std::vector<T> copy = v;
  comm.broadcast(copy, 0);
  return copy;
}

} // namespace

// ---- kernels ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(kernels_match_a_double_reference) {
  const std::size_t n = 13;
  const std::size_t m = 37; // (not a multiple of the dot product's lanes)
  const std::size_t r = 3;
  std::vector<float> mat(n * m), qt(r * m), pt(r * n), back(r * m), out(n * m);
  lowrank::fill_uniform(mat.data(), mat.size(), 7, 1);
  lowrank::fill_uniform(qt.data(), qt.size(), 7, 2);
  lowrank::project(mat.data(), n, m, qt.data(), r, pt.data());
  lowrank::back_project(mat.data(), n, m, pt.data(), r, back.data());
  lowrank::outer(mat.data(), n, m, pt.data(), back.data(), r, out.data());
  for (std::size_t k = 0; k < r; ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      double p = 0;
      for (std::size_t j = 0; j < m; ++j) {
        p += double(mat[i * m + j]) * qt[k * m + j];
      }
      BOOST_TEST(pt[k * n + i] == p, boost::test_tools::tolerance(1e-5));
    }
    for (std::size_t j = 0; j < m; ++j) {
      double q = 0;
      for (std::size_t i = 0; i < n; ++i) {
        q += double(pt[k * n + i]) * mat[i * m + j];
      }
      BOOST_TEST(back[k * m + j] == q, boost::test_tools::tolerance(1e-4));
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < m; ++j) {
      double e = mat[i * m + j];
      for (std::size_t k = 0; k < r; ++k) {
        e -= double(pt[k * n + i]) * back[k * m + j];
      }
      BOOST_TEST(out[i * m + j] == e, boost::test_tools::tolerance(1e-3));
    }
  }
}

BOOST_AUTO_TEST_CASE(orthogonalization_is_orthonormal_and_never_nan) {
  for (const std::size_t r : {1u, 2u, 4u, 16u}) {
    const std::size_t len = 64;
    std::vector<double> v(r * len);
    lowrank::fill_uniform(v.data(), v.size(), 3, r);
    // Nearly dependent columns (ill-conditioned), which one pass of Gram-Schmidt leaves loose.
    for (std::size_t k = 1; k < r; ++k) {
      for (std::size_t i = 0; i < len; ++i) {
        v[k * len + i] = v[i] + 1e-6 * v[k * len + i];
      }
    }
    lowrank::orthogonalize(v.data(), r, len, 0.0, r > 2 ? 2 : 1);
    for (std::size_t a = 0; a < r; ++a) {
      for (std::size_t b = 0; b < r; ++b) {
        const double d = lowrank::dot(v.data() + a * len, v.data() + b * len, len);
        BOOST_TEST(std::abs(d - (a == b ? 1.0 : 0.0)) < 1e-9,
                   "r " << r << " (" << a << ", " << b << "): " << d);
      }
    }
  }
  std::vector<float> zero(2 * 8, 0.0f);
  lowrank::fill_uniform(zero.data() + 8, 8, 1, 1);
  lowrank::orthogonalize(zero.data(), 2, 8, 0.0);
  for (std::size_t i = 0; i < 8; ++i) {
    BOOST_TEST(zero[i] == 0.0f); // zeros, not NaN
  }
  BOOST_TEST(std::abs(lowrank::dot(zero.data() + 8, zero.data() + 8, 8) - 1.0f) < 1e-6f);
  // The generator's values are fixed: any host, any C library.
  double u[2];
  lowrank::fill_uniform(u, 2, 0, 0);
  std::vector<double> again(2);
  lowrank::fill_uniform(again.data(), 2, 0, 0);
  BOOST_TEST(std::memcmp(u, again.data(), sizeof u) == 0);
  BOOST_TEST(u[0] >= -1.0);
  BOOST_TEST(u[0] < 1.0);
  BOOST_TEST(lowrank::splitmix64(0) == 0xe220a8397b1dcdafull);
}

BOOST_AUTO_TEST_CASE(the_concepts) {
  static_assert(cohort::gradient_hook<cohort::powersgd>);
  static_assert(cohort::reducer<cohort::powersgd>);
  static_assert(!cohort::gradient_hook<cohort::mean>);
  BOOST_CHECK_EXCEPTION(cohort::powersgd({.rank = 0}), cohort::invalid_argument,
                        message_has({"powersgd", "rank is 0"}));
  BOOST_CHECK_EXCEPTION(cohort::powersgd({.min_compression_rate = -1}), cohort::invalid_argument,
                        message_has({"min_compression_rate"}));
}

// ---- over ranks -------------------------------------------------------------------------------

using strategies = std::tuple<cohort::naive, cohort::flat, cohort::hierarchical<>,
                              cohort::two_dimensional<>, cohort::shared_memory<>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(at_full_rank_it_is_the_mean, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const cohort::powersgd hook = full_rank();
  for (const bool overlapped : {false, true}) {
    for (int step = 0; step < 3; ++step) {
      shapes expected;
      shapes got;
      expected.fill(comm.rank(), step);
      got.fill(comm.rank(), step);
      reduce_all(comm, expected, cohort::mean{});
      if (overlapped) {
        comm.begin_allreduce_grad(got.dp, hook).wait();
        comm.begin_allreduce_grad(got.fp, hook).wait();
      } else {
        comm.allreduce_grad(got.dp, hook);
        comm.allreduce_grad(got.fp, hook);
      }
      comm.allreduce_grad(got.ip, hook);
      for (std::size_t i = 0; i < got.dg.size(); ++i) {
        BOOST_TEST(relative_gap(got.dg[i], expected.dg[i]) < 1e-12, got.doubles[i].name);
      }
      const std::vector<double> f(got.fg[0].begin(), got.fg[0].end());
      const std::vector<double> e(expected.fg[0].begin(), expected.fg[0].end());
      BOOST_TEST(relative_gap(f, e) < 1e-5);
      BOOST_TEST(got.ig == expected.ig); // (int32: not the hook's, the mean's)
    }
  }
  BOOST_TEST(hook.stats().compressed_tensors > 0u);
}

BOOST_AUTO_TEST_CASE(a_gradient_of_rank_r_is_reduced_exactly_at_rank_r) {
  auto comm = cohort::make_communicator<cohort::flat>();
  // The same rank-2 gradient on every rank: M = u1 v1ᵀ + u2 v2ᵀ (12 x 9).
  std::vector<double> g(12 * 9), value(g.size());
  std::vector<double> u(24), v(18);
  lowrank::fill_uniform(u.data(), u.size(), 5, 1);
  lowrank::fill_uniform(v.data(), v.size(), 5, 2);
  for (std::size_t i = 0; i < 12; ++i) {
    for (std::size_t j = 0; j < 9; ++j) {
      g[i * 9 + j] = u[i] * v[j] + u[12 + i] * v[9 + j];
    }
  }
  const std::vector<double> original = g;
  std::vector<cohort::parameter_ref<std::vector<double>>> params{{"m", &value, &g, 12}};
  comm.allreduce_grad(params, cohort::powersgd({.rank = 2, .start_step = 0}));
  BOOST_TEST(relative_gap(g, original) < 1e-12);
}

BOOST_AUTO_TEST_CASE(error_feedback_makes_the_updates_add_up_to_the_gradients) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  double gap_with_feedback = 0;
  for (const bool feedback : {true, false}) {
    const cohort::powersgd hook({.rank = 1, .start_step = 0, .error_feedback = feedback});
    shapes m;
    const std::size_t conv = 0; // 12 x 9 at rank 1: compressed
    std::vector<double> applied(m.dg[conv].size(), 0.0);
    std::vector<double> truth(applied.size(), 0.0);
    for (int step = 0; step < 300; ++step) {
      m.fill(comm.rank(), step);
      std::vector<double> mean = m.dg[conv];
      comm.allreduce(mean, cohort::reduce_op::sum);
      comm.allreduce_grad(m.dp, hook);
      for (std::size_t i = 0; i < applied.size(); ++i) {
        applied[i] += m.dg[conv][i];
        truth[i] += mean[i] / n;
      }
    }
    std::vector<double> error = hook.error_of("conv");
    if (feedback) {
      gap_with_feedback = relative_gap(applied, truth); // (what is still held back: bounded)
      BOOST_TEST_REQUIRE(error.size() == applied.size());
      comm.allreduce(error, cohort::reduce_op::sum);
      for (std::size_t i = 0; i < applied.size(); ++i) {
        applied[i] += error[i] / n;
      }
      BOOST_TEST(relative_gap(applied, truth) < 1e-9);
    } else {
      // Without it, what rank 1 drops is lost: the test tells the two apart.
      BOOST_TEST(error.empty());
      BOOST_TEST(relative_gap(applied, truth) > 1e-2);
      // The updates alone track the gradients' sum far closer with it than without.
      BOOST_TEST(gap_with_feedback * 3 < relative_gap(applied, truth),
                 gap_with_feedback << " with error feedback, " << relative_gap(applied, truth)
                                   << " without");
    }
  }
}

template <class Strategy>
void train_and_compare(bool overlapped, bool double_buffered) {
  auto comm = cohort::make_communicator<Strategy>();
  const cohort::powersgd hook({.rank = 2, .start_step = 2, .min_compression_rate = 1});
  shapes m;
  struct sgd {
    shapes* m;
    void step() {
      for (std::size_t p = 0; p < m->dv.size(); ++p) {
        for (std::size_t i = 0; i < m->dv[p].size(); ++i) {
          m->dv[p][i] -= 0.1 * m->dg[p][i];
        }
      }
    }
  };
  using optimizer = cohort::distributed_optimizer<sgd, Strategy, cohort::powersgd>;
  optimizer opt(sgd{&m}, comm, m.dp, {.double_buffering = double_buffered}, hook);
  BOOST_TEST(!opt.averages());
  for (int step = 0; step < 12; ++step) {
    m.fill(comm.rank(), step);
    if (overlapped && !double_buffered) {
      for (std::size_t i = m.dp.size(); i-- > 0;) {
        opt.grad_ready(i);
      }
    }
    opt.step();
  }
  opt.finish();
  for (std::size_t p = 0; p < m.dv.size(); ++p) {
    const auto zero = rank0(comm, m.dv[p]);
    BOOST_TEST(std::memcmp(zero.data(), m.dv[p].data(), zero.size() * sizeof(double)) == 0,
               "parameter " << m.doubles[p].name << " differs from rank 0's, bitwise");
  }
  BOOST_TEST(hook.stats().compressed_steps >= 9);
}

using host_strategies = std::tuple<cohort::flat, cohort::hierarchical<>, cohort::two_dimensional<>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(replicas_stay_bitwise_equal, Strategy, host_strategies) {
  train_and_compare<Strategy>(/*overlapped=*/false, false);
  train_and_compare<Strategy>(/*overlapped=*/true, false);
  train_and_compare<Strategy>(/*overlapped=*/false, /*double_buffered=*/true);
}

BOOST_AUTO_TEST_CASE(warm_up_steps_are_the_mean_bit_for_bit) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const cohort::powersgd hook({.rank = 1, .start_step = 2, .min_compression_rate = 0});
  for (int step = 0; step < 3; ++step) {
    shapes expected;
    shapes got;
    expected.fill(comm.rank(), step);
    got.fill(comm.rank(), step);
    comm.allreduce_grad(expected.dp, cohort::mean{});
    comm.allreduce_grad(got.dp, hook);
    // Warm-up: the mean's bits; then a rank-1 approximation of random gradients, which is not.
    BOOST_TEST((got.dg == expected.dg) == (step < 2), "step " << step);
  }
  const cohort::powersgd_stats stats = hook.stats();
  BOOST_TEST(stats.steps == 3u);
  BOOST_TEST(stats.compressed_steps == 1u);
}

BOOST_AUTO_TEST_CASE(the_bytes_sent_are_the_factors) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const cohort::powersgd hook({.rank = 2, .start_step = 0});
  shapes m;
  m.fill(comm.rank(), 0);
  (void)comm.take_grad_sync_stats();
  comm.allreduce_grad(m.dp, hook);
  // At rate 2 and rank 2, conv 12 x 9 is compressed ((12 + 9)·2·2 = 84 < 108); wide 4 x 30
  // ((4 + 30)·2·2 = 136 > 120), tall 20 x 3, bias, row and flat are not (as PyTorch decides).
  const std::uint64_t uncompressed = 20 * 3 + 4 * 30 + 7 + 9 + 5;
  const std::uint64_t p = 12 * 2;
  const std::uint64_t q = 9 * 2;
  const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
  BOOST_TEST(stats.wire_bytes == (uncompressed + p + q) * sizeof(double));
  BOOST_TEST(hook.stats().values_sent == uncompressed + p + q);
  BOOST_TEST(hook.stats().values_before == 12u * 9 + 20 * 3 + 4 * 30 + 7 + 9 + 5);
  BOOST_TEST(hook.stats().compressed_tensors == 1u);
}

BOOST_AUTO_TEST_CASE(options_that_differ_are_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  shapes m;
  m.fill(comm.rank(), 0);
  const cohort::powersgd hook({.rank = 1 + comm.rank() % 2, .start_step = 0});
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(m.dp, hook), cohort::mismatch_error,
                        message_has({"PowerSGD rank", "1", "2"}));
  // Still usable: the next step with agreeing options goes through.
  comm.allreduce_grad(m.dp, cohort::powersgd({.rank = 1, .start_step = 0}));
}

BOOST_AUTO_TEST_CASE(rows_that_do_not_divide_the_elements_are_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  std::vector<double> value(10), grad(10, 1.0);
  // The last rank alone is wrong (3 rows of 10); the others say 5: every rank hears of it.
  const std::size_t rows = comm.rank() == comm.size() - 1 ? 3 : 5;
  std::vector<cohort::parameter_ref<std::vector<double>>> params{{"odd", &value, &grad, rows}};
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::powersgd({.start_step = 0})),
                        cohort::error, message_has({"parameter 'odd'", "10 elements", "3 rows"}));
}

BOOST_AUTO_TEST_CASE(a_zero_gradient_does_not_stop_a_parameter_for_good) {
  // One step of zeros leaves Q̂ = 0; warm-started from it, the parameter would never move again.
  auto comm = cohort::make_communicator<cohort::flat>();
  const cohort::powersgd hook({.rank = 1, .start_step = 0, .min_compression_rate = 0});
  std::vector<double> value(12 * 9), grad(12 * 9, 0.0);
  std::vector<cohort::parameter_ref<std::vector<double>>> params{{"w", &value, &grad, 12}};
  comm.allreduce_grad(params, hook);
  // Then the same rank-1 gradient on every rank: rank 1 reduces it exactly.
  std::vector<double> u(12), v(9);
  lowrank::fill_uniform(u.data(), u.size(), 9, 1);
  lowrank::fill_uniform(v.data(), v.size(), 9, 2);
  for (std::size_t i = 0; i < 12; ++i) {
    for (std::size_t j = 0; j < 9; ++j) {
      grad[i * 9 + j] = u[i] * v[j];
    }
  }
  const std::vector<double> expected = grad;
  comm.allreduce_grad(params, hook);
  BOOST_TEST(relative_gap(grad, expected) < 1e-12);
}

BOOST_AUTO_TEST_CASE(a_non_finite_gradient_is_seen_everywhere_and_does_not_poison_the_state) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const cohort::powersgd hook({.rank = 2, .start_step = 0, .min_compression_rate = 1});
  shapes m;
  m.fill(comm.rank(), 0);
  comm.allreduce_grad(m.dp, hook);
  m.fill(comm.rank(), 1);
  if (comm.rank() == comm.size() - 1) {
    m.dg[0][5] = std::numeric_limits<double>::infinity(); // (conv: compressed)
  }
  comm.allreduce_grad(m.dp, hook);
  BOOST_TEST(std::all_of(m.dg[0].begin(), m.dg[0].end(), [](double x) { return std::isnan(x); }));
  // The next steps are finite again: neither the errors nor Q kept the infinity.
  for (int step = 2; step < 4; ++step) {
    m.fill(comm.rank(), step);
    comm.allreduce_grad(m.dp, hook);
    for (const auto& g : m.dg) {
      BOOST_TEST(std::all_of(g.begin(), g.end(), [](double x) { return std::isfinite(x); }));
    }
  }
  const std::vector<double> error = hook.error_of("conv");
  BOOST_TEST(std::all_of(error.begin(), error.end(), [](double x) { return std::isfinite(x); }));
}

#if defined(COHORT_TEST_CHECKPOINT)
BOOST_AUTO_TEST_CASE(a_checkpoint_resumes_bit_for_bit) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const cohort::powersgd_options options{.rank = 2, .start_step = 1, .min_compression_rate = 1};
  const auto run = [&](const cohort::powersgd& hook, shapes& m, int from, int to) {
    for (int step = from; step < to; ++step) {
      m.fill(comm.rank(), step);
      comm.allreduce_grad(m.dp, hook);
    }
  };
  shapes straight;
  const cohort::powersgd uninterrupted(options);
  run(uninterrupted, straight, 0, 8);

  shapes first;
  const cohort::powersgd before(options);
  run(before, first, 0, 4);
  const auto bytes_of = [](const auto& ref) {
    cohort::checkpoint::byte_writer out;
    cohort::checkpoint_traits<std::remove_cvref_t<decltype(ref)>>::save(out, ref);
    return out.contiguous();
  };
  const std::vector<std::byte> replicated = bytes_of(cohort::powersgd_replicated(before));
  const std::vector<std::byte> errors = bytes_of(cohort::powersgd_errors(before));

  const cohort::powersgd after(options);
  const cohort::load_context context{comm.size(), comm.size(), comm.rank()};
  cohort::checkpoint::byte_reader in_errors(errors, "errors");
  auto errors_ref = cohort::powersgd_errors(after);
  cohort::checkpoint_traits<cohort::powersgd_errors_ref>::load(in_errors, errors_ref, context);
  cohort::checkpoint::byte_reader in_replicated(replicated, "replicated");
  auto replicated_ref = cohort::powersgd_replicated(after);
  cohort::checkpoint_traits<cohort::powersgd_replicated_ref>::load(in_replicated, replicated_ref,
                                                                   context);
  shapes resumed;
  run(after, resumed, 4, 8);
  BOOST_TEST(resumed.dg == straight.dg); // bit for bit

  // Other options: refused, naming the option and both values.
  const cohort::powersgd other({.rank = 3, .start_step = 1, .min_compression_rate = 1});
  cohort::checkpoint::byte_reader again(replicated, "replicated");
  auto other_ref = cohort::powersgd_replicated(other);
  BOOST_CHECK_EXCEPTION(
      cohort::checkpoint_traits<cohort::powersgd_replicated_ref>::load(again, other_ref, context),
      cohort::checkpoint_error, message_has({"PowerSGD's rank", "2", "3"}));

  // Another model under the same key cannot happen; a restored state that does not fit (bytes
  // edited) is named at the next step, on every rank.
  std::vector<cohort::powersgd_layout_record> records = before.state()->records(false);
  BOOST_TEST_REQUIRE(!records.empty());
  records.front().slots.front().n += 1;
  const cohort::powersgd edited(options);
  edited.state()->restore(records, false);
  shapes m;
  m.fill(comm.rank(), 9);
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(m.dp, edited), cohort::invalid_argument,
                        message_has({"state restored", "does not fit parameter"}));

  // Without error feedback there are no errors to keep: both parts still load.
  const cohort::powersgd_options no_feedback{.rank = 2, .start_step = 0, .error_feedback = false};
  const cohort::powersgd plain(no_feedback);
  shapes p;
  p.fill(comm.rank(), 0);
  comm.allreduce_grad(p.dp, plain);
  const cohort::powersgd plain_after(no_feedback);
  const std::vector<std::byte> plain_bytes = bytes_of(cohort::powersgd_errors(plain));
  cohort::checkpoint::byte_reader plain_errors(plain_bytes, "e");
  auto plain_errors_ref = cohort::powersgd_errors(plain_after);
  cohort::checkpoint_traits<cohort::powersgd_errors_ref>::load(plain_errors, plain_errors_ref,
                                                               context);

  // A truncated checkpoint: an error naming what is missing, not a crash.
  std::vector<std::byte> cut(replicated.begin(), replicated.begin() + replicated.size() / 2);
  cohort::checkpoint::byte_reader short_read(cut, "cut");
  auto cut_ref = cohort::powersgd_replicated(cohort::powersgd(options));
  BOOST_CHECK_THROW(cohort::checkpoint_traits<cohort::powersgd_replicated_ref>::load(
                        short_read, cut_ref, context),
                    cohort::checkpoint_error);
}
#endif

// ---- a user's own hook -------------------------------------------------------------------------

// Random-k with memory (Stich, Cordonnier, Jaggi 2018), as docs/compression.md writes it: every
// rank draws the same k indices of each bucket from (seed, step), so only k values travel.
class random_k {
public:
  struct state_type {
    double fraction = 0;
    std::uint64_t steps = 0;
    std::vector<double> memory; // by flat position in the layout's hooked gradients
    std::vector<double> wire;
    std::vector<std::size_t> offsets; // of each bucket's gradients in `memory`

    bool handles(cohort::dtype t) const { return t == cohort::dtype::float64; }
    void prepare(const cohort::hook_layout& l) {
      std::size_t total = 0;
      offsets.assign(1, 0);
      for (std::size_t b = 0; b < l.buckets(); ++b) {
        for (const cohort::hook_tensor& t : l.bucket(b)) {
          total += t.grad.count;
        }
        offsets.push_back(total);
      }
      memory.resize(total, 0.0);
      wire.resize(total);
    }
    void sign(std::uint64_t, cohort::hook_signature& s) const {
      s.add("random-k fraction", fraction).add("random-k steps", steps);
    }
    void reduce(const cohort::hook_bucket& b) {
      double* e = memory.data() + offsets[b.index()];
      std::vector<double*> values;
      for (const cohort::hook_tensor& t : b.tensors()) {
        auto* g = static_cast<double*>(t.grad.data);
        for (std::size_t i = 0; i < t.grad.count; ++i) {
          values.push_back(g + i);
        }
      }
      const std::size_t n = values.size();
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(fraction * n));
      std::mt19937_64 pick(steps * 1000 + b.index()); // the same on every rank
      std::vector<std::size_t> chosen(n);
      std::iota(chosen.begin(), chosen.end(), std::size_t{0});
      std::shuffle(chosen.begin(), chosen.end(), pick);
      chosen.resize(k);
      for (std::size_t i = 0; i < n; ++i) {
        e[i] += *values[i]; // v = g + e
      }
      for (std::size_t j = 0; j < k; ++j) {
        wire[j] = e[chosen[j]];
      }
      b.allreduce({wire.data(), k, cohort::dtype::float64, cohort::memory_location::host},
                  cohort::reduce_op::sum);
      for (std::size_t i = 0; i < n; ++i) {
        *values[i] = 0.0;
      }
      for (std::size_t j = 0; j < k; ++j) {
        *values[chosen[j]] = wire[j] / b.ranks();
        e[chosen[j]] = 0.0;
      }
    }
    void step_ended(std::uint64_t) { ++steps; }
  };

  explicit random_k(double fraction)
      : state_(std::make_shared<state_type>()) {
    state_->fraction = fraction;
  }
  cohort::grad_reduction plan(cohort::dtype t, int ranks) const {
    return cohort::mean{}.plan(t, ranks);
  }
  const std::shared_ptr<state_type>& state() const { return state_; }

private:
  std::shared_ptr<state_type> state_;
};

BOOST_AUTO_TEST_CASE(a_users_own_hook_plugs_in) {
  static_assert(cohort::gradient_hook<random_k>);
  auto comm = cohort::make_communicator<cohort::hierarchical<>>();
  const random_k hook(0.25);
  shapes m;
  m.fill(comm.rank(), 0);
  (void)comm.take_grad_sync_stats();
  comm.allreduce_grad(m.dp, hook);
  std::size_t total = 0;
  std::size_t nonzero = 0;
  for (const auto& g : m.dg) {
    total += g.size();
    nonzero += static_cast<std::size_t>(
        std::count_if(g.begin(), g.end(), [](double x) { return x != 0.0; }));
  }
  BOOST_TEST(nonzero <= total / 4 + 1);
  BOOST_TEST(comm.take_grad_sync_stats().wire_bytes <= (total / 4 + 1) * sizeof(double));
  BOOST_TEST(hook.state()->steps == 1u);
  // Bitwise the same on every rank.
  for (const auto& g : m.dg) {
    BOOST_TEST(rank0(comm, g) == g);
  }
}
