// SPDX-License-Identifier: Apache-2.0
// The per-rank trace (communicator_options::trace_directory, COHORT_TRACE): each rank's file
// parses as a Chrome trace, and its spans are the steps and buckets that ran (counted against the
// communicator's own statistics), nested where they must be; a directory a rank cannot write is
// an error on every rank.
#define BOOST_TEST_MODULE communicator.trace
#define BOOST_BIND_GLOBAL_PLACEHOLDERS // (boost/property_tree includes boost/bind.hpp)
#include <cohort/cohort.hpp>
#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/trace/profiler_range.hpp>
#include <cohort/trace/recorder.hpp>
#include <cohort/trace/span.hpp>
#include <cohort/trace/ticks.hpp>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/expect.hpp"
#include "support/model.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

namespace {

struct event {
  std::string name;
  int pid = -1;
  int tid = -1;
  double ts = 0;
  double dur = 0;
  std::string strategy;
  std::string operation;
  std::uint64_t bytes = 0;
  long long bucket = -1;
  int communicator = 0;
  // A blocking step carried in its agreement: its phases, in microseconds (else negative).
  double pack = -1, agreed = -1, unpack = -1;

  double end() const { return ts + dur; }
};

// The complete ("X") events of a rank's trace file.
std::vector<event> read_trace(const std::filesystem::path& file) {
  boost::property_tree::ptree tree;
  std::ifstream in(file);
  BOOST_TEST_REQUIRE(in.good(), "no trace file " << file);
  boost::property_tree::read_json(in, tree);
  std::vector<event> events;
  for (const auto& [key, node] : tree) {
    if (node.get<std::string>("ph") != "X") {
      continue;
    }
    // Every value read as text (Boost's numeric translators warn falsely under GCC 12 -O1).
    const auto text = [&node](const char* key) { return node.get<std::string>(key); };
    event e;
    e.name = text("name");
    e.pid = std::stoi(text("pid"));
    // tid 2k: the trainer, 2k + 1: cohort's thread, of the k-th communicator traced.
    e.tid = std::stoi(text("tid")) % 2;
    e.communicator = std::stoi(text("tid")) / 2;
    e.ts = std::stod(text("ts"));
    e.dur = std::stod(text("dur"));
    e.strategy = text("args.strategy");
    e.operation = node.get<std::string>("args.operation", "");
    e.bytes = std::stoull(text("args.bytes"));
    e.bucket = std::stoll(text("args.bucket"));
    if (const auto agreed = node.get_optional<std::string>("args.agreement and reduce")) {
      e.agreed = std::stod(*agreed);
      e.pack = std::stod(text("args.pack"));
      e.unpack = std::stod(text("args.unpack"));
    }
    events.push_back(e);
  }
  return events;
}

std::vector<event> named(const std::vector<event>& events, const std::string& name, int tid) {
  std::vector<event> out;
  std::copy_if(events.begin(), events.end(), std::back_inserter(out),
               [&](const event& e) { return e.name == name && e.tid == tid; });
  return out;
}

// A directory of the job's own (the same on every rank), emptied.
template <class Communicator>
std::filesystem::path fresh_directory(Communicator& comm, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("cohort-test-trace-" + comm.bcast_obj(std::to_string(::getpid())) + "-" + name);
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove_all(dir);
  }
  comm.barrier();
  return dir;
}

// Removes a test's directory once every rank is done with it.
template <class Communicator>
void remove_directory(Communicator& comm, const std::filesystem::path& dir) {
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove_all(dir);
  }
}

// This rank's one trace file in `dir` (cohort-trace-rank<r>.json, or .comm<k>.json for a
// communicator traced after another in the same process).
std::filesystem::path file_of(const std::filesystem::path& dir, int rank) {
  std::vector<std::filesystem::path> found;
  const std::string prefix = "cohort-trace-rank" + std::to_string(rank) + ".";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with(prefix)) {
      found.push_back(entry.path());
    }
  }
  BOOST_TEST_REQUIRE(found.size() == 1u, found.size() << " trace files of rank " << rank);
  return found.front();
}

// Every span on `tid` within one of `outer` (same thread), and the spans of `tid` one after
// another, never overlapping (one thread does one thing at a time).
void require_nested_in(const std::vector<event>& inner, const std::vector<event>& outer) {
  constexpr double slack = 0.002; // microseconds: the format's three decimals
  for (const event& e : inner) {
    const bool inside = std::any_of(outer.begin(), outer.end(), [&](const event& o) {
      return o.tid == e.tid && o.ts <= e.ts + slack && e.end() <= o.end() + slack;
    });
    BOOST_TEST(inside, e.name << " at " << e.ts << " is in no enclosing span");
  }
}

void require_sequential(std::vector<event> spans) {
  std::sort(spans.begin(), spans.end(), [](const event& a, const event& b) { return a.ts < b.ts; });
  for (std::size_t i = 1; i < spans.size(); ++i) {
    BOOST_TEST(spans[i - 1].end() <= spans[i].ts + 0.002,
               spans[i - 1].name << " overlaps " << spans[i].name << " on thread " << spans[i].tid);
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(blocking_steps_are_traced_bucket_by_bucket) {
  auto probe = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(probe, "blocking");
  constexpr int steps = 3;
  cohort::grad_sync_stats stats;
  {
    // Small buckets and a low fusion threshold: packed buckets and in-place ones both.
    auto comm = cohort::make_communicator<cohort::flat>(
        {.bucket_bytes = 4096, .fusion_threshold_bytes = 4096, .trace_directory = dir.string()});
    cohort::test::model<float> m(comm.size(), comm.rank());
    for (int s = 0; s < steps; ++s) {
      comm.allreduce_grad(m.params, cohort::mean{});
    }
    stats = comm.take_grad_sync_stats();
  } // the trace is written out when the communicator goes
  const std::vector<event> events = read_trace(file_of(dir, probe.rank()));
  for (const event& e : events) {
    BOOST_TEST(e.pid == probe.rank());
    BOOST_TEST(e.strategy == "flat");
    BOOST_TEST(e.dur >= 0);
  }
  const auto step_spans = named(events, "allreduce_grad", 0);
  const auto reduces = named(events, "reduce", 0);
  const auto packs = named(events, "pack", 0);
  const auto unpacks = named(events, "unpack", 0);
  const auto scales = named(events, "scale", 0);
  BOOST_TEST(step_spans.size() == static_cast<std::size_t>(steps));
  BOOST_TEST(reduces.size() == stats.buckets);
  BOOST_TEST(packs.size() == unpacks.size());
  BOOST_TEST(packs.size() + scales.size() / 2 == reduces.size()); // in place: scaled twice
  BOOST_TEST(!packs.empty());
  BOOST_TEST(!scales.empty());
  std::uint64_t reduced = 0;
  for (const event& e : reduces) {
    reduced += e.bytes;
    BOOST_TEST(e.bucket >= 0);
  }
  BOOST_TEST(reduced == stats.bytes); // float32 on the wire: the gradients' own bytes
  std::uint64_t step_bytes = 0;
  for (const event& e : step_spans) {
    step_bytes += e.bytes;
    BOOST_TEST(e.operation == "blocking");
  }
  BOOST_TEST(step_bytes == stats.bytes);
  // The agreement of each step, inside it.
  std::vector<event> agreements;
  for (const event& e : named(events, "agreement", 0)) {
    if (e.operation == "allreduce_grad") {
      agreements.push_back(e);
    }
  }
  BOOST_TEST(agreements.size() == static_cast<std::size_t>(steps));
  require_nested_in(agreements, step_spans);
  require_nested_in(reduces, step_spans);
  require_nested_in(packs, step_spans);
  require_nested_in(unpacks, step_spans);
  std::vector<event> work = reduces;
  work.insert(work.end(), packs.begin(), packs.end());
  work.insert(work.end(), unpacks.begin(), unpacks.end());
  work.insert(work.end(), agreements.begin(), agreements.end());
  require_sequential(work);
  remove_directory(probe, dir);
}

BOOST_AUTO_TEST_CASE(overlapped_steps_trace_the_reduction_thread) {
  auto probe = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(probe, "overlapped");
  constexpr int steps = 3;
  cohort::grad_sync_stats stats;
  {
    // COHORT_TRACE, the option left empty.
    ::setenv("COHORT_TRACE", dir.c_str(), 1);
    auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 4096});
    ::unsetenv("COHORT_TRACE");
    cohort::test::model<double> m(comm.size(), comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto request = comm.begin_allreduce_grad(m.params, cohort::sum{});
      for (std::size_t t = m.params.size(); t-- > 0;) {
        request.ready(t);
      }
      request.wait();
    }
    stats = comm.take_grad_sync_stats();
  }
  const std::vector<event> events = read_trace(file_of(dir, probe.rank()));
  const auto step_spans = named(events, "allreduce_grad", 0);
  const auto waits = named(events, "wait", 0);
  const auto readiness = named(events, "wait for readiness", 1);
  const auto reduces = named(events, "reduce", 1);
  BOOST_TEST(step_spans.size() == static_cast<std::size_t>(steps));
  BOOST_TEST(waits.size() == static_cast<std::size_t>(steps));
  BOOST_TEST(reduces.size() == stats.buckets);
  BOOST_TEST(readiness.size() == stats.buckets);  // one wait per bucket, however short
  BOOST_TEST(named(events, "reduce", 0).empty()); // the buckets go on cohort's thread
  for (const event& e : step_spans) {
    BOOST_TEST(e.operation == "overlapped");
  }
  require_nested_in(waits, step_spans);
  // cohort's thread: a wait, the bucket's agreement, pack, reduce, unpack, one after another.
  std::vector<event> thread1;
  std::copy_if(events.begin(), events.end(), std::back_inserter(thread1),
               [](const event& e) { return e.tid == 1; });
  require_sequential(thread1);
  std::size_t bucket_agreements = 0;
  for (const event& e : named(events, "agreement", 1)) {
    bucket_agreements += e.operation == "allreduce_grad (a bucket)" ? 1 : 0;
  }
  BOOST_TEST(bucket_agreements == stats.buckets);
  // The end of the step settles on the trainer's thread.
  std::size_t step_ends = 0;
  for (const event& e : named(events, "agreement", 0)) {
    step_ends += e.operation == "allreduce_grad (end of the step)" ? 1 : 0;
  }
  BOOST_TEST(step_ends == static_cast<std::size_t>(steps));
  BOOST_TEST(named(events, "agreement", 1).size() == stats.buckets);
  remove_directory(probe, dir);
}

BOOST_AUTO_TEST_CASE(a_trace_directory_a_rank_cannot_write_is_an_error_on_every_rank) {
  auto probe = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(probe, "unwritable");
  std::filesystem::create_directories(dir);
  probe.barrier();
  // A directory inside a regular file cannot be made, not even by root. The last rank's only.
  const std::filesystem::path file = dir / "a-file";
  if (probe.rank() == 0) {
    std::ofstream(file) << "not a directory";
  }
  probe.barrier();
  const bool last = probe.rank() == probe.size() - 1;
  const std::string where = last ? (file / "trace").string() : (dir / "trace").string();
  const auto make = [&] { cohort::make_communicator<cohort::flat>({.trace_directory = where}); };
  if (last) {
    BOOST_CHECK_EXCEPTION(make(), cohort::error,
                          message_has({"trace file", "a-file/trace", "cannot write"}));
  } else {
    BOOST_CHECK_EXCEPTION(make(), cohort::mismatch_error,
                          message_has({"rank " + std::to_string(probe.size() - 1), "trace"}));
  }
  remove_directory(probe, dir);
}

BOOST_AUTO_TEST_CASE(communicators_traced_at_once_write_files_of_their_own) {
  auto probe = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(probe, "two");
  {
    auto first = cohort::make_communicator<cohort::flat>({.trace_directory = dir.string()});
    auto second = cohort::make_communicator<cohort::naive>({.trace_directory = dir.string()});
    cohort::test::model<float> m(probe.size(), probe.rank());
    first.allreduce_grad(m.params, cohort::sum{});
    second.allreduce_grad(m.params, cohort::sum{});
    second.allreduce_grad(m.params, cohort::sum{});
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("cohort-trace-rank" + std::to_string(probe.rank()) + ".")) {
      files.push_back(entry.path());
    }
  }
  BOOST_TEST_REQUIRE(files.size() == 2u);
  std::vector<std::string> strategies;
  std::vector<int> communicators;
  for (const auto& file : files) {
    const std::vector<event> events = read_trace(file);
    BOOST_TEST_REQUIRE(!events.empty());
    std::size_t steps = 0;
    for (const event& e : events) {
      BOOST_TEST(e.strategy == events.front().strategy);
      BOOST_TEST(e.communicator == events.front().communicator);
      steps += e.name == "allreduce_grad" ? 1 : 0;
    }
    strategies.push_back(events.front().strategy);
    communicators.push_back(events.front().communicator);
    BOOST_TEST(steps == (events.front().strategy == "flat" ? 1u : 2u));
  }
  std::sort(strategies.begin(), strategies.end());
  BOOST_TEST((strategies == std::vector<std::string>{"flat", "naive"}));
  BOOST_TEST(communicators[0] != communicators[1]);
  remove_directory(probe, dir);
}

BOOST_AUTO_TEST_CASE(two_threads_recording_at_once_lose_no_span) {
  // Both rows at once, past several batches (each written by the recorder's own thread while
  // these go on recording): every span is in the file once, in each thread's order.
  auto comm = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(comm, "threads");
  constexpr int spans = 10000; // 20000 events in all: more than a batch (16384)
  // One process's recorder, no MPI: rank 0's alone (the ranks would time-share the cores).
  if (comm.rank() == 0) {
    std::filesystem::path file;
    {
      cohort::trace_recorder recorder(dir, comm.rank(), "flat");
      file = recorder.file();
      const auto record = [&recorder](cohort::trace_thread thread) {
        for (int i = 0; i < spans; ++i) {
          const std::uint64_t now = cohort::trace_ticks::now();
          recorder.span("reduce", thread, now, now, 8, i);
        }
      };
      std::thread reducer(record, cohort::trace_thread::reducer);
      record(cohort::trace_thread::trainer);
      reducer.join();
    }
    const std::vector<event> events = read_trace(file);
    for (const int tid : {0, 1}) {
      const std::vector<event> row = named(events, "reduce", tid);
      BOOST_TEST_REQUIRE(row.size() == static_cast<std::size_t>(spans), "row " << tid);
      for (int i = 0; i < spans; ++i) {
        BOOST_TEST_REQUIRE(row[static_cast<std::size_t>(i)].bucket == i,
                           "row " << tid << " span " << i);
      }
    }
  }
  remove_directory(comm, dir);
}

BOOST_AUTO_TEST_CASE(a_paused_trace_records_nothing_until_resumed) {
  auto probe = cohort::make_communicator<cohort::flat>();
  BOOST_TEST(!probe.traced());
  BOOST_TEST(probe.trace_file().empty());
  probe.pause_trace(); // (nothing to pause: no effect)
  const std::filesystem::path dir = fresh_directory(probe, "paused");
  {
    auto comm = cohort::make_communicator<cohort::flat>({.trace_directory = dir.string()});
    BOOST_TEST(comm.traced());
    BOOST_TEST(comm.trace_file() == file_of(dir, probe.rank()));
    std::vector<float> value(4, 0.0f);
    std::vector<float> grad(4, 1.0f);
    std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &value, &grad}};
    // Steps of 4, 5 and 6 elements, told apart by their bytes.
    const auto step = [&](std::size_t elements) {
      value.assign(elements, 0.0f);
      grad.assign(elements, 1.0f);
      comm.allreduce_grad(params, cohort::sum{});
      BOOST_TEST_REQUIRE(grad.back() == static_cast<float>(comm.size()));
    };
    step(4);
    comm.pause_trace();
    step(5);
    std::vector<float> t(3, 1.0f);
    comm.allreduce(t); // no agreement span either
    comm.barrier();
    comm.resume_trace();
    step(6);
    // Overlapped steps: one paused after it began is recorded whole, one resumed after it began
    // not at all (a step is traced as it began).
    const auto overlapped = [&](std::size_t elements, auto between) {
      value.assign(elements, 0.0f);
      grad.assign(elements, 1.0f);
      auto request = comm.begin_allreduce_grad(params, cohort::sum{});
      between();
      request.ready(0);
      request.wait();
      BOOST_TEST_REQUIRE(grad.back() == static_cast<float>(comm.size()));
    };
    overlapped(7, [&] { comm.pause_trace(); });
    overlapped(8, [&] { comm.resume_trace(); });
  }
  const std::vector<event> events = read_trace(file_of(dir, probe.rank()));
  std::vector<event> steps;
  std::copy_if(events.begin(), events.end(), std::back_inserter(steps),
               [](const event& e) { return e.name == "allreduce_grad"; });
  BOOST_TEST_REQUIRE(steps.size() == 3u);
  BOOST_TEST(steps[0].bytes == 4 * sizeof(float));
  BOOST_TEST(steps[1].bytes == 6 * sizeof(float));
  BOOST_TEST(steps[2].bytes == 7 * sizeof(float));
  BOOST_TEST(steps[2].operation == "overlapped");
  BOOST_TEST(steps[2].ts >= steps[1].end());
  for (const event& e : events) {
    BOOST_TEST(e.bytes != 8 * sizeof(float), e.name << " of a step begun paused");
  }
  // Nothing between the first two: the paused step, all-reduce and barrier left no span.
  for (const event& e : events) {
    BOOST_TEST((e.end() <= steps[0].end() + 0.002 || e.ts >= steps[1].ts - 0.002),
               e.name << " (" << e.operation << ") at " << e.ts << " recorded while paused");
  }
  remove_directory(probe, dir);
}

BOOST_AUTO_TEST_CASE(small_collectives_are_reduced_in_their_agreement) {
  // What tells that the data rode the agreement (the results are the same either way): the
  // agreement's span is "agreement and reduce", with the bytes it carried, and no "reduce" of a
  // bucket follows; past liveness::max_carried_bytes the agreement carries nothing and MPI
  // reduces.
  auto probe = cohort::make_communicator<cohort::flat>();
  const std::filesystem::path dir = fresh_directory(probe, "carried");
  {
    auto comm = cohort::make_communicator<cohort::flat>({.trace_directory = dir.string()});
    std::vector<float> small(1024, 1.0f); // 4 KiB
    // Twice the most an agreement carries.
    std::vector<float> large(2 * cohort::engine::liveness::max_carried_bytes / sizeof(float), 1.0f);
    comm.allreduce(small);
    comm.allreduce(large);
    BOOST_TEST(small[1023] == static_cast<float>(comm.size()));
    BOOST_TEST(large.back() == static_cast<float>(comm.size()));
    // One packed bucket of 16 bytes: a blocking step carried whole.
    std::vector<float> value(4, 0.0f);
    std::vector<float> grad(4, 1.0f);
    std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &value, &grad}};
    comm.allreduce_grad(params, cohort::sum{});
    BOOST_TEST(grad[3] == static_cast<float>(comm.size()));
  }
  const std::vector<event> events = read_trace(file_of(dir, probe.rank()));
  std::vector<event> carried;
  std::vector<event> plain;
  for (const event& e : events) {
    if (e.name == "agreement and reduce") {
      carried.push_back(e);
    } else if (e.name == "agreement" && e.operation == "allreduce") {
      plain.push_back(e);
    }
  }
  // The step carried in its agreement is one event, its phases as arguments (a step of a few
  // microseconds traced for the cost of one event).
  std::vector<event> carried_steps;
  for (const event& e : named(events, "allreduce_grad", 0)) {
    if (e.operation == "blocking, carried in the agreement") {
      carried_steps.push_back(e);
    }
  }
  if (probe.size() > 1) {
    BOOST_TEST_REQUIRE(carried.size() == 1u);
    BOOST_TEST(carried[0].operation == "allreduce");
    BOOST_TEST(carried[0].bytes == 4096u);
    BOOST_TEST_REQUIRE(carried_steps.size() == 1u);
    const event& step = carried_steps[0];
    BOOST_TEST(step.bytes == 16u);
    BOOST_TEST(step.pack >= 0);
    BOOST_TEST(step.agreed >= 0);
    BOOST_TEST(step.unpack >= 0);
    BOOST_TEST(step.pack + step.agreed + step.unpack <= step.dur + 0.01); // inside the step
    BOOST_TEST(named(events, "pack", 0).empty());
    BOOST_TEST(plain.size() == 1u);                 // the large one
    BOOST_TEST(named(events, "reduce", 0).empty()); // no bucket went to MPI
  }
  remove_directory(probe, dir);
}

namespace {
// A profiler of the test's own in place of NVTX: every range opened and closed, by name.
struct recorded_ranges {
  std::mutex mutex;
  std::vector<std::string> names;
  std::vector<bool> open;
};
recorded_ranges ranges;

std::uint64_t start_range(const char* name) noexcept {
  const std::lock_guard lock(ranges.mutex);
  ranges.names.emplace_back(name);
  ranges.open.push_back(true);
  return ranges.names.size() - 1;
}
void end_range(std::uint64_t range) noexcept {
  const std::lock_guard lock(ranges.mutex);
  ranges.open[range] = false;
}
std::size_t count(std::string_view name) {
  return static_cast<std::size_t>(std::count(ranges.names.begin(), ranges.names.end(), name));
}
} // namespace

BOOST_AUTO_TEST_CASE(a_profilers_ranges_cover_steps_agreements_and_buckets_without_a_trace) {
  // What <cohort/trace/nvtx.hpp> installs in a GPU build, with no trace file written.
  const cohort::profiler_ranges before = cohort::installed_profiler_ranges;
  cohort::installed_profiler_ranges = {&start_range, &end_range};
  {
    auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 4096});
    cohort::test::model<double> m(comm.size(), comm.rank());
    comm.allreduce_grad(m.params, cohort::sum{});
    auto request = comm.begin_allreduce_grad(m.params, cohort::sum{});
    for (std::size_t t = m.params.size(); t-- > 0;) {
      request.ready(t);
    }
    request.wait();
    cohort::installed_profiler_ranges = before;
    const std::size_t buckets = comm.bucket_count();
    const std::lock_guard lock(ranges.mutex);
    BOOST_TEST(count("allreduce_grad (blocking)") == 1u);
    BOOST_TEST(count("allreduce_grad (overlapped)") == 1u);
    BOOST_TEST(count("wait") == 1u);
    // Each step's agreement and each overlapped bucket's; every bucket reduced once per step,
    // the packed ones (the small tensors: the larger are reduced in place) packed and unpacked.
    BOOST_TEST(count("agreement") >= 2 + buckets);
    BOOST_TEST(count("reduce") == 2 * buckets);
    BOOST_TEST(count("pack") >= 2u);
    BOOST_TEST(count("pack") < 2 * buckets);
    BOOST_TEST(count("unpack") == count("pack"));
    BOOST_TEST(std::none_of(ranges.open.begin(), ranges.open.end(), [](bool o) { return o; }));
  }
}
