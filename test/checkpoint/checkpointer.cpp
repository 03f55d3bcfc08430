// SPDX-License-Identifier: Apache-2.0
// cohort::checkpointer on 1 to 3 ranks: a round trip restores every kind of state exactly; a
// checkpoint that is damaged (a byte flipped, a file truncated, missing or from another
// checkpoint) is skipped on every rank with a message naming the file, and the ranks resume from
// the newest one they all verified; a write that fails is an error on every rank and loses
// nothing; keep N; state that does not fit is refused by name; another number of ranks resumes
// the replicated state and restarts the epoch; learned bucket orders resume.
#define BOOST_TEST_MODULE checkpoint.checkpointer
#include <cohort/checkpoint.hpp>
#include <cohort/cohort.hpp>

#include <boost/serialization/vector.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

#include "checkpoint/fresh_directory.hpp"
#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::fresh_directory;
using cohort::test::message_has;
namespace fs = std::filesystem;

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

// A trainer's state: parameters (replicated), an optimizer's velocity (a serialized value),
// this rank's random engine and the data position.
struct trainer_state {
  std::vector<float> w, b, gw, gb;
  std::vector<param> params;
  std::vector<std::vector<float>> velocity;
  std::mt19937_64 engine;
  cohort::data_position position;

  trainer_state(int rank, float fill, std::size_t width = 5)
      : w(width, fill)
      , b(3, fill + 1)
      , gw(width)
      , gb(3)
      , velocity{std::vector<float>(width, fill * 2)}
      , engine(static_cast<std::uint64_t>(1000 + rank)) {
    bind();
  }
  trainer_state(const trainer_state& o)
      : w(o.w)
      , b(o.b)
      , gw(o.gw)
      , gb(o.gb)
      , velocity(o.velocity)
      , engine(o.engine)
      , position(o.position) {
    bind();
  }
  trainer_state& operator=(const trainer_state&) = delete;
  void bind() { params = {{"w", &w, &gw}, {"b", &b, &gb}}; }
  // Moves everything on, as training would.
  void advance() {
    for (float& x : w) {
      x += 0.5f;
    }
    b[0] -= 1;
    velocity[0][0] += 3;
    engine.discard(7);
    ++position.step;
  }
  template <class Ckpt>
  void save(Ckpt& ckpt, std::uint64_t step) {
    ckpt.save(step, params, cohort::serialized(velocity), engine, position);
  }
  template <class Ckpt>
  std::optional<std::uint64_t> resume(Ckpt& ckpt) {
    return ckpt.resume(params, cohort::serialized(velocity), engine, position);
  }
  bool same_as(const trainer_state& o) const {
    return w == o.w && b == o.b && velocity == o.velocity && engine == o.engine &&
           position == o.position;
  }
};

fs::path part(const fs::path& dir, std::uint64_t step, const std::string& name) {
  return dir / cohort::checkpointer<cohort::flat>::step_name(step) / name;
}

// Rank 0 changes a file while the others wait.
template <class F>
void on_root(cohort::flat& comm, F&& f) {
  if (comm.rank() == 0) {
    f();
  }
  comm.barrier();
}

void flip_byte(const fs::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x20));
}

bool every_rank(cohort::flat& comm, bool mine) {
  return comm.allreduce_obj(mine ? 1 : 0, [](int a, int b) { return std::min(a, b); }) == 1;
}

} // namespace

BOOST_AUTO_TEST_CASE(parts_cover_the_state_and_begin_at_pages) {
  // Every byte in exactly one part, in order; every part but the last non-empty one whole pages.
  for (const std::size_t page : {std::size_t{4096}, std::size_t{65536}}) {
    for (const std::size_t total :
         {std::size_t{0}, std::size_t{1}, page - 1, page, page + 1, 2 * page + 1, 3 * page - 1,
          10 * page + 7, std::size_t{1} << 30}) {
      for (int n = 1; n <= 5; ++n) {
        BOOST_TEST_REQUIRE(cohort::checkpoint::part_boundary(total, 0, n, page) == 0u);
        BOOST_TEST_REQUIRE(cohort::checkpoint::part_boundary(total, n, n, page) == total);
        for (int r = 0; r < n; ++r) {
          const std::size_t begin = cohort::checkpoint::part_boundary(total, r, n, page);
          const std::size_t end = cohort::checkpoint::part_boundary(total, r + 1, n, page);
          BOOST_TEST_REQUIRE(begin <= end);
          BOOST_TEST_REQUIRE((begin % page == 0 || begin == end));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(nothing_to_resume_starts_afresh) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "empty");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir};
  trainer_state s(comm.rank(), 1);
  BOOST_TEST(!s.resume(ckpt).has_value());
  BOOST_TEST(ckpt.skipped().empty());
}

BOOST_AUTO_TEST_CASE(a_round_trip_restores_every_kind_of_state_exactly) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "round-trip");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir};
  trainer_state saved(comm.rank(), 1);
  saved.advance();
  saved.save(ckpt, 10);

  // Files: one replicated part and one own file per rank, and the manifest.
  BOOST_TEST(fs::exists(part(dir, 10, "MANIFEST")));
  BOOST_TEST(fs::exists(
      part(dir, 10,
           "replicated-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size()))));

  trainer_state resumed(comm.rank(), 9);
  BOOST_TEST(!resumed.same_as(saved));
  const auto step = resumed.resume(ckpt);
  BOOST_TEST(step.value_or(0) == 10u);
  BOOST_TEST(resumed.same_as(saved));
  BOOST_TEST(ckpt.skipped().empty());
}

BOOST_AUTO_TEST_CASE(the_newest_keep_checkpoints_stay) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "keep");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir, {.keep = 2}};
  trainer_state s(comm.rank(), 1);
  for (std::uint64_t step = 1; step <= 5; ++step) {
    s.advance();
    s.save(ckpt, step);
  }
  const std::vector<std::uint64_t> expected{5, 4};
  BOOST_TEST(ckpt.complete_steps() == expected, boost::test_tools::per_element());
  BOOST_TEST(!fs::exists(dir / cohort::checkpointer<cohort::flat>::step_name(3)));
  // A step saved already is not written again.
  s.advance();
  s.save(ckpt, 5);
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 5u);
  BOOST_TEST(resumed.position.step == 5u);
  // A run that saves without resuming first, into a directory of later steps: its own save is
  // kept (with the newest other one), not removed as the oldest.
  cohort::checkpointer fresh{comm, dir, {.keep = 2}};
  s.advance();
  s.save(fresh, 1);
  const std::vector<std::uint64_t> kept{5, 1};
  // (inside a collective: rank 0 removes the directory once every rank has read it)
  BOOST_TEST(every_rank(comm, fresh.complete_steps() == kept));
}

BOOST_AUTO_TEST_CASE(damaged_checkpoints_are_skipped_alike_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "damaged");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir, {.keep = 10}};
  trainer_state s(comm.rank(), 1);
  std::vector<trainer_state> at;
  for (std::uint64_t step = 1; step <= 6; ++step) {
    s.advance();
    s.save(ckpt, step);
    at.push_back(s);
  }
  const std::string n = std::to_string(comm.size());
  const std::string last_rank = std::to_string(comm.size() - 1);
  on_root(comm, [&] {
    flip_byte(part(dir, 6, "replicated-0-of-" + n), 20);                 // a byte flipped
    fs::resize_file(part(dir, 5, "rank-" + last_rank + "-of-" + n), 10); // truncated
    fs::remove(part(dir, 4, "replicated-0-of-" + n));                    // missing
    fs::copy_file(part(dir, 2, "rank-0-of-" + n), part(dir, 3, "rank-0-of-" + n),
                  fs::copy_options::overwrite_existing); // from another checkpoint
  });
  trainer_state resumed(comm.rank(), 0);
  // Never two ranks on different steps: all of them on step 2.
  BOOST_TEST(every_rank(comm, resumed.resume(ckpt).value_or(0) == 2u));
  BOOST_TEST(resumed.same_as(at[1]));
  // Every rank knows why, and the same: the file, and both checksums or sizes.
  std::string why;
  for (const std::string& m : ckpt.skipped()) {
    why += m + "\n";
  }
  BOOST_TEST_MESSAGE(why);
  BOOST_TEST(message_has({"step 6 skipped", "replicated-0-of-" + n, "has checksum",
                          "the manifest says"})(cohort::error(why)));
  BOOST_TEST(message_has({"step 5 skipped", "rank-" + last_rank + "-of-" + n, "holds 10 bytes",
                          "truncated"})(cohort::error(why)));
  BOOST_TEST(message_has({"step 4 skipped", "is missing"})(cohort::error(why)));
  BOOST_TEST(message_has({"step 3 skipped", "rank-0-of-" + n, "has checksum"})(cohort::error(why)));
  // (every rank hears of what rank 0 set aside)
  BOOST_TEST(every_rank(comm, why.find(" set aside as set-aside-step-") != std::string::npos));
  // The later ones are set aside, kept for a person to look at: the run goes on from step 2, and
  // its next saves are the newest checkpoints.
  const std::vector<std::uint64_t> left{2, 1};
  BOOST_TEST(every_rank(comm, ckpt.complete_steps() == left));
  BOOST_TEST(fs::exists(dir / ("set-aside-" + ckpt.step_name(6))));
  // Without its manifest a checkpoint does not exist; a manifest of another step is refused.
  on_root(comm, [&] {
    fs::remove(part(dir, 2, "MANIFEST"));
    fs::create_directories(dir / ckpt.step_name(9));
    fs::copy_file(part(dir, 1, "MANIFEST"), part(dir, 9, "MANIFEST"));
  });
  trainer_state oldest(comm.rank(), 0);
  BOOST_TEST(oldest.resume(ckpt).value_or(0) == 1u);
  BOOST_TEST(oldest.same_as(at[0]));
  BOOST_TEST(ckpt.skipped().front().find("is of step 1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_file_the_system_cannot_read_is_an_error_not_damage) {
  // The last rank's own file replaced by a directory: reading it fails with EISDIR, a fault of
  // the machine's (as EIO or EACCES would be), not of the checkpoint. Every rank throws, naming
  // the rank and the file, and nothing is skipped or set aside: the next job may read it well.
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "unreadable");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir, {.keep = 10}};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  s.advance();
  s.save(ckpt, 2);
  const std::string n = std::to_string(comm.size());
  const std::string last_rank = std::to_string(comm.size() - 1);
  const fs::path own = part(dir, 2, "rank-" + last_rank + "-of-" + n);
  on_root(comm, [&] {
    fs::rename(own, fs::path(own).concat(".away"));
    fs::create_directory(own);
  });
  trainer_state resumed(comm.rank(), 0);
  BOOST_CHECK_EXCEPTION(resumed.resume(ckpt), cohort::checkpoint_io_error,
                        message_has({"reading step 2", "not damage", "rank " + last_rank,
                                     "rank-" + last_rank + "-of-" + n}));
  BOOST_TEST(ckpt.skipped().empty());
  const std::vector<std::uint64_t> both{2, 1};
  BOOST_TEST(every_rank(comm, ckpt.complete_steps() == both));
  on_root(comm, [&] {
    fs::remove(own);
    fs::rename(fs::path(own).concat(".away"), own);
  });
  BOOST_TEST(every_rank(comm, resumed.resume(ckpt).value_or(0) == 2u));
  BOOST_TEST(resumed.same_as(s));
}

BOOST_AUTO_TEST_CASE(a_failed_write_is_an_error_on_every_rank_and_loses_nothing) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "full");
  const fs::path& dir = scratch.path();
  const int failing = comm.size() - 1;
  bool full = false;
  cohort::checkpoint_options options{.keep = 1};
  // The last rank's disk fills up after step 1.
  options.write = [&](int fd, const void* data, std::size_t bytes) -> ::ssize_t {
    if (comm.rank() == failing && full) {
      errno = ENOSPC;
      return -1;
    }
    return ::write(fd, data, bytes);
  };
  cohort::checkpointer ckpt{comm, dir, options};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  const trainer_state first = s;
  s.advance();
  full = true;
  BOOST_CHECK_EXCEPTION(
      s.save(ckpt, 2), cohort::checkpoint_error,
      message_has({"saving step 2", "rank " + std::to_string(failing), "No space left on device"}));
  // Nothing of step 2 is left, and step 1 is whole.
  BOOST_TEST(!fs::exists(dir / ckpt.step_name(2)));
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 1u);
  BOOST_TEST(resumed.same_as(first));
  BOOST_TEST(ckpt.skipped().empty());
}

BOOST_AUTO_TEST_CASE(state_that_does_not_fit_is_refused_by_name_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "misfit");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  trainer_state wider(comm.rank(), 1, 6);
  BOOST_CHECK_EXCEPTION(wider.resume(ckpt), cohort::checkpoint_error,
                        message_has({"resuming from step 1", "parameter 'w'",
                                     "was saved with 20 bytes", "the one given has 24"}));
  std::mt19937_64 engine;
  BOOST_CHECK_EXCEPTION(ckpt.resume(s.params, engine), cohort::checkpoint_error,
                        message_has({"holds 3 things", "resume was given 1"}));
  BOOST_CHECK_EXCEPTION(
      ckpt.resume(s.params, s.position, cohort::serialized(s.velocity), engine),
      cohort::checkpoint_error,
      message_has({"was saved as a serialized value", "was given a data position"}));
}

// The manifest and rank 0's file are checked as the parts are: a manifest with a byte flipped is
// found by its own checksum (before any of its numbers is believed), a damaged root file by its
// checksum, and a manifest that lists one part many times over (with its checksum made right
// again: an edited one) by the names it lists; each is skipped alike on every rank. A manifest of
// the first format, without a checksum line, still resumes.
BOOST_AUTO_TEST_CASE(a_damaged_manifest_or_root_file_is_skipped) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "manifest");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir, {.keep = 10}};
  trainer_state s(comm.rank(), 1);
  std::vector<trainer_state> at;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    s.advance();
    s.save(ckpt, step);
    at.push_back(s);
  }
  const std::string n = std::to_string(comm.size());
  const auto read = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto write = [](const fs::path& file, const std::string& text) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
  };
  on_root(comm, [&] {
    flip_byte(part(dir, 4, "MANIFEST"), 40);
    flip_byte(part(dir, 3, "root-of-" + n), 3);
    // An edited manifest: one file listed where another belongs, the checksum line made right.
    const fs::path path = part(dir, 2, "MANIFEST");
    const std::string text = read(path);
    cohort::checkpoint::manifest m = cohort::checkpoint::manifest::parse(text, path.string());
    m.root.front().name = m.per_rank.front().name;
    write(path, m.text());
    // Step 1 in the first format: no checksum line.
    const fs::path first = part(dir, 1, "MANIFEST");
    std::string old = read(first);
    old =
        "cohort checkpoint 1" + old.substr(old.find('\n'), old.rfind("checksum ") - old.find('\n'));
    write(first, old);
  });
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(every_rank(comm, resumed.resume(ckpt).value_or(0) == 1u));
  BOOST_TEST(resumed.same_as(at[0]));
  std::string why;
  for (const std::string& m : ckpt.skipped()) {
    why += m + "\n";
  }
  BOOST_TEST_MESSAGE(why);
  BOOST_TEST(message_has({"step 4 skipped", "MANIFEST has checksum", "its last line says",
                          "damaged"})(cohort::error(why)));
  BOOST_TEST(message_has({"step 3 skipped", "root-of-" + n, "has checksum", "the manifest says"})(
      cohort::error(why)));
  BOOST_TEST(message_has({"step 2 skipped", "lists 'rank-0-of-" + n + "'", "'root-of-" + n + "'",
                          "damaged or edited"})(cohort::error(why)));
}

// A save never loses what is there: a step complete in the directory that this run neither saved
// nor resumed from (another run's) is an error, not silently kept as if it were this run's; a
// name too long for a resume to read back is refused at the save, not found at the resume; and a
// manifest that cannot be written leaves nothing of its step behind.
BOOST_AUTO_TEST_CASE(a_save_that_cannot_be_resumed_is_refused) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "refused");
  const fs::path& dir = scratch.path();
  bool manifest_fails = false;
  cohort::checkpoint_options options{.keep = 10};
  options.write = [&](int fd, const void* data, std::size_t bytes) -> ::ssize_t {
    if (manifest_fails && bytes >= 18 && std::memcmp(data, "cohort checkpoint ", 18) == 0) {
      errno = EIO;
      return -1;
    }
    return ::write(fd, data, bytes);
  };
  {
    cohort::checkpointer earlier{comm, dir, {.keep = 10}};
    trainer_state other(comm.rank(), 7);
    other.save(earlier, 3);
  }
  cohort::checkpointer ckpt{comm, dir, options};
  trainer_state s(comm.rank(), 1);
  BOOST_CHECK_EXCEPTION(s.save(ckpt, 3), cohort::checkpoint_error,
                        message_has({"step 3 already has a complete checkpoint",
                                     "neither saved nor resumed from", "call resume first"}));
  s.save(ckpt, 4);
  s.save(ckpt, 4); // its own: not written again
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 4u);
  s.save(ckpt, 4); // resumed from: not written again
  std::vector<float> long_w(2, 1.0f), long_g(2);
  std::vector<param> long_named{{std::string(5000, 'w'), &long_w, &long_g}};
  BOOST_CHECK_EXCEPTION(ckpt.save(5, long_named), cohort::checkpoint_error,
                        message_has({"saving step 5", "a parameter's name is 5000 characters long",
                                     "more than the 4096"}));
  BOOST_TEST(!fs::exists(dir / ckpt.step_name(5)));
  manifest_fails = comm.rank() == 0;
  BOOST_CHECK_EXCEPTION(s.save(ckpt, 6), cohort::checkpoint_error,
                        message_has({"saving step 6", "rank 0", "Input/output error"}));
  BOOST_TEST(every_rank(comm, !fs::exists(dir / ckpt.step_name(6))));
  manifest_fails = false;
  const std::vector<std::uint64_t> kept{4, 3};
  BOOST_TEST(every_rank(comm, ckpt.complete_steps() == kept));
}

// What a resume sets aside is kept for a person to look at, not forever: once `keep` complete
// checkpoints are newer, it goes as old checkpoints do.
BOOST_AUTO_TEST_CASE(set_aside_checkpoints_go_once_keep_newer_ones_exist) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "aside");
  const fs::path& dir = scratch.path();
  cohort::checkpointer ckpt{comm, dir, {.keep = 2}};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  s.save(ckpt, 2);
  on_root(comm, [&] { flip_byte(part(dir, 2, "rank-0-of-" + std::to_string(comm.size())), 0); });
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 1u);
  const fs::path aside = dir / ("set-aside-" + ckpt.step_name(2));
  BOOST_TEST(every_rank(comm, fs::exists(aside)));
  resumed.save(ckpt, 2);
  BOOST_TEST(every_rank(comm, fs::exists(aside))); // newer ones: 2 and 1, not 2 newer than 2
  resumed.save(ckpt, 3);
  BOOST_TEST(every_rank(comm, fs::exists(aside)));
  resumed.save(ckpt, 4);
  BOOST_TEST(every_rank(comm, !fs::exists(aside))); // 4 and 3 are newer
  const std::vector<std::uint64_t> kept{4, 3};
  BOOST_TEST(every_rank(comm, ckpt.complete_steps() == kept));
}

BOOST_AUTO_TEST_CASE(another_number_of_ranks_resumes_the_replicated_state) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "ranks");
  const fs::path& dir = scratch.path();
  trainer_state saved(0, 1);
  saved.advance();
  saved.position = {3, 17};
  if (comm.rank() == 0) {
    // Saved by rank 0 alone, a job of one rank.
    cohort::flat alone = comm.split(0, 0);
    cohort::checkpointer ckpt{alone, dir};
    saved.save(ckpt, 40);
  } else {
    (void)comm.split(1, 0);
  }
  comm.barrier();
  cohort::checkpointer ckpt{comm, dir};
  trainer_state resumed(comm.rank(), 0);
  const std::mt19937_64 own_engine = resumed.engine;
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 40u);
  BOOST_TEST(resumed.w == saved.w);
  BOOST_TEST(resumed.velocity == saved.velocity);
  BOOST_TEST(resumed.position.epoch == 3u);
  BOOST_TEST(resumed.position.step == (comm.size() == 1 ? 17u : 0u));
  // Each rank's engine is restored only by as many ranks as saved it.
  BOOST_TEST((resumed.engine == (comm.size() == 1 ? saved.engine : own_engine)));

  // And the other way: saved by every rank, resumed by rank 0 alone.
  resumed.advance();
  resumed.position = {4, 9};
  resumed.save(ckpt, 41);
  if (comm.rank() == 0) {
    cohort::flat alone = comm.split(0, 0);
    cohort::checkpointer single{alone, dir};
    trainer_state one(0, 0);
    BOOST_TEST(one.resume(single).value_or(0) == 41u);
    BOOST_TEST(one.w == resumed.w);
    BOOST_TEST(one.position.epoch == 4u);
    BOOST_TEST(one.position.step == (comm.size() == 1 ? 9u : 0u));
  } else {
    (void)comm.split(1, 0);
  }
  comm.barrier();
}

BOOST_AUTO_TEST_CASE(a_hostile_manifest_is_an_error_naming_its_line) {
  using cohort::checkpoint::manifest;
  const std::string head = "cohort checkpoint 1\nbyte-order 1\nstep 4\nranks 1\n"
                           "replicated-state 0 0000000000000000\n";
  const std::string file = "replicated 0 10 00000000000000ff replicated-0-of-1\n"
                           "root 0 10 00000000000000ff root-of-1\n"
                           "per-rank 0 10 00000000000000ff rank-0-of-1\n";
  BOOST_TEST(manifest::parse(head + file + "end\n", "m").per_rank.size() == 1u);
  const std::pair<std::string, std::string> bad[] = {
      {"not a manifest\n", "line 1"},
      {head + file, "truncated"},
      {head + "per-rank 0 10 00000000000000ff ../../etc/passwd\nend\n", "not a file name"},
      {head + "per-rank 0 10 zz000000000000ff rank-0-of-1\nend\n", "16 hexadecimal"},
      {head + "per-rank 0 99999999999999999999999 00000000000000ff r\nend\n", "not a number"},
      {"cohort checkpoint 1\nbyte-order 1\nstep 4\nranks 99999999\n", "not a number up to"},
      {head + "end\n", "0 per-rank files"},
      {head + "replicated 0 10 00000000000000ff replicated-0-of-1\nend\n", "0 root files"},
      {head + file + "end\nmore\n", "after 'end'"},
      {head + "per-rank 5 10 00000000000000ff rank-0-of-1\nend\n", "out of order"},
  };
  for (const auto& [text, expected] : bad) {
    BOOST_TEST_CONTEXT(text) {
      BOOST_CHECK_EXCEPTION(manifest::parse(text, "m"), cohort::checkpoint_error,
                            message_has({expected}));
    }
  }
}

BOOST_AUTO_TEST_CASE(every_length_is_checked_before_it_is_used) {
  cohort::checkpoint::byte_writer out;
  out.put<std::uint64_t>(std::uint64_t{1} << 62); // a length of 4 EiB, and no bytes
  const std::vector<std::byte> bytes = out.contiguous();
  cohort::checkpoint::byte_reader in(bytes, "test");
  BOOST_CHECK_EXCEPTION((void)in.get_block("a block"), cohort::checkpoint_error,
                        message_has({"test: a block needs 4611686018427387904 bytes but 0"}));
  cohort::checkpoint::byte_reader again(bytes, "test");
  BOOST_CHECK_EXCEPTION((void)again.get_string("a name"), cohort::checkpoint_error,
                        message_has({"more than 4096"}));
}

BOOST_AUTO_TEST_CASE(async_saves_copy_the_state_and_complete_at_the_next_call) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "async");
  const fs::path& dir = scratch.path();
  trainer_state s(comm.rank(), 1);
  {
    cohort::checkpointer ckpt{comm, dir, {.async = true}};
    s.save(ckpt, 1);
    const trainer_state at_1 = s;
    s.advance(); // training goes on while the files are written
    // Not complete until the ranks have agreed: no manifest yet.
    BOOST_TEST(ckpt.complete_steps().empty());
    s.save(ckpt, 2); // completes step 1
    BOOST_TEST(every_rank(comm, ckpt.complete_steps().size() == 1));
    ckpt.finish();
    trainer_state resumed(comm.rank(), 0);
    BOOST_TEST(resumed.resume(ckpt).value_or(0) == 2u);
    BOOST_TEST(resumed.same_as(s));
    // And step 1 holds the state as it was when save returned, not as training left it.
    trainer_state first(comm.rank(), 0);
    on_root(comm, [&] { fs::remove(part(dir, 2, "MANIFEST")); });
    BOOST_TEST(first.resume(ckpt).value_or(0) == 1u);
    BOOST_TEST(first.same_as(at_1));
    s.advance();
    s.save(ckpt, 3); // left to the destructor
  }
  cohort::checkpointer ckpt{comm, dir};
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 3u);
  BOOST_TEST(resumed.same_as(s));
}

BOOST_AUTO_TEST_CASE(an_async_save_that_failed_throws_at_the_next_call) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "async-full");
  std::atomic<bool> failing = false; // read on the writer thread
  cohort::checkpoint_options options{.async = true};
  options.write = [&](int fd, const void* data, std::size_t bytes) -> ::ssize_t {
    if (comm.rank() == 0 && failing) {
      errno = EIO;
      return -1;
    }
    return ::write(fd, data, bytes);
  };
  cohort::checkpointer ckpt{comm, scratch.path(), options};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  ckpt.finish();
  failing = true;
  s.advance();
  s.save(ckpt, 2); // returns: rank 0's writer thread fails
  BOOST_CHECK_EXCEPTION(ckpt.finish(), cohort::checkpoint_error,
                        message_has({"saving step 2", "rank 0", "Input/output error"}));
  trainer_state resumed(comm.rank(), 0);
  BOOST_TEST(resumed.resume(ckpt).value_or(0) == 1u);
}

BOOST_AUTO_TEST_CASE(replicas_that_differ_are_an_error_not_a_checkpoint) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return; // one replica cannot differ
  }
  const fresh_directory scratch(comm, "differ");
  cohort::checkpointer ckpt{comm, scratch.path()};
  trainer_state s(comm.rank(), comm.rank() == 1 ? 2.0f : 1.0f);
  BOOST_CHECK_EXCEPTION(
      s.save(ckpt, 1), cohort::checkpoint_error,
      message_has({"rank 1: its replicated state", "differs from rank 0's",
                   "the replicas are not identical", "the first part that differs: parameters"}));
  BOOST_TEST(ckpt.complete_steps().empty());
}

// Issue 30, point 4: a directory listing that fails (too many open files on rank 0, which lists
// the steps for every rank) is checkpoint_io_error on every rank, not "nothing to resume".
BOOST_AUTO_TEST_CASE(a_directory_that_cannot_be_listed_is_an_error_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const fresh_directory scratch(comm, "unlisted");
  cohort::checkpointer ckpt{comm, scratch.path()};
  trainer_state s(comm.rank(), 1);
  s.save(ckpt, 1);
  trainer_state resumed(comm.rank(), 0);
  std::vector<int> filler;
  rlimit before{};
  if (comm.rank() == 0) { // every descriptor taken: opendir fails with EMFILE
    ::getrlimit(RLIMIT_NOFILE, &before);
    rlimit low = before;
    low.rlim_cur = static_cast<rlim_t>(
        std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()) + 8);
    ::setrlimit(RLIMIT_NOFILE, &low);
    for (int fd = ::open("/dev/null", O_RDONLY); fd >= 0; fd = ::open("/dev/null", O_RDONLY)) {
      filler.push_back(fd);
    }
  }
  const auto release = [&] {
    for (const int fd : filler) {
      ::close(fd);
    }
    filler.clear();
    if (comm.rank() == 0) {
      ::setrlimit(RLIMIT_NOFILE, &before);
    }
  };
  try {
    resumed.resume(ckpt);
    BOOST_ERROR("resume did not throw");
  } catch (const cohort::checkpoint_io_error& e) {
    release();
    BOOST_TEST(message_has({"looking at the checkpoints", "failed on rank 0", "listing"})(e));
  }
  release();
  BOOST_TEST(every_rank(comm, resumed.resume(ckpt).value_or(0) == 1u));
  BOOST_TEST(resumed.same_as(s));
}

// Issue 30, point 5: ranks that make different calls (save on one, resume on another) or save
// different steps are told so, naming both, before anything is written.
BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_call_are_told_before_anything_is_written) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return;
  }
  const fresh_directory scratch(comm, "disagree");
  cohort::checkpointer ckpt{comm, scratch.path()};
  trainer_state s(comm.rank(), 1);
  const std::uint64_t step = comm.rank() == 0 ? 4 : 5;
  BOOST_CHECK_EXCEPTION(s.save(ckpt, step), cohort::mismatch_error,
                        message_has({"checkpointer", "the step", "4 on rank 0 but", "5 on rank"}));
  comm.barrier();
  BOOST_TEST(!fs::exists(part(scratch.path(), 4, "")));
  BOOST_TEST(!fs::exists(part(scratch.path(), 5, "")));
  const auto call = [&] { comm.rank() == 0 ? s.save(ckpt, 6) : (void)s.resume(ckpt); };
  BOOST_CHECK_EXCEPTION(
      call(), cohort::mismatch_error,
      message_has({"checkpointer", "the call", "save on rank 0 but", "resume on rank"}));
  comm.barrier();
  BOOST_TEST(!fs::exists(part(scratch.path(), 6, "")));
  // Options too: an async checkpointer on one rank only.
  cohort::checkpointer other{comm, scratch.path(), {.async = comm.rank() == 0}};
  BOOST_CHECK_EXCEPTION(s.save(other, 7), cohort::mismatch_error,
                        message_has({"option 'async'", "true on rank 0 but false"}));
  // And then the ranks save together.
  s.save(ckpt, 8);
  BOOST_TEST(every_rank(comm, ckpt.complete_steps() == std::vector<std::uint64_t>{8}));
}

BOOST_AUTO_TEST_CASE(learned_bucket_orders_are_resumed) {
  // Four gradients, each its own bucket, marked ready in an order that is not the reverse one
  // the buckets start in: the order learned is that one, a checkpoint keeps it, and a new
  // communicator resumed from it reduces in the same buckets without learning anything.
  const cohort::communicator_options tiny{.bucket_bytes = 4, .first_bucket_bytes = 4};
  cohort::flat learner = cohort::make_communicator<cohort::flat>(tiny);
  const fresh_directory scratch(learner, "bucket-orders");
  std::vector<std::vector<float>> values(4, std::vector<float>(3, 1.0f));
  std::vector<std::vector<float>> grads(4, std::vector<float>(3, 2.0f));
  std::vector<param> params;
  for (std::size_t i = 0; i < 4; ++i) {
    params.push_back({"p" + std::to_string(i), &values[i], &grads[i]});
  }
  BOOST_TEST(learner.learned_bucket_orders().empty());
  const std::vector<std::size_t> readiness{1, 3, 0, 2};
  auto request = learner.begin_allreduce_grad(params, cohort::mean{});
  for (const std::size_t i : readiness) {
    request.ready(i);
  }
  request.wait();
  const std::vector<cohort::bucket_order> learned = learner.learned_bucket_orders();
  BOOST_TEST_REQUIRE(learned.size() == 1u);
  BOOST_TEST(learned[0].order == readiness);

  cohort::checkpointer ckpt{learner, scratch.path()};
  ckpt.save(1, params, cohort::bucket_orders(learner));

  // The resumed communicator learns an order of its own first (a resume after a step): the
  // restored one wins.
  cohort::flat resumed = cohort::make_communicator<cohort::flat>(tiny);
  auto first = resumed.begin_allreduce_grad(params, cohort::mean{});
  for (const std::size_t i : {2, 1, 0, 3}) {
    first.ready(i);
  }
  first.wait();
  BOOST_TEST(resumed.learned_bucket_orders().at(0).order != readiness);
  BOOST_TEST(ckpt.resume(params, cohort::bucket_orders(resumed)).value_or(0) == 1u);
  const std::vector<cohort::bucket_order> restored = resumed.learned_bucket_orders();
  BOOST_TEST_REQUIRE(restored.size() == 1u);
  BOOST_TEST(restored[0].layout == learned[0].layout);
  BOOST_TEST(restored[0].order == readiness);
  // Adopted at the next reduction of that layout, as if learned there: kept, not relearned from
  // this step's (reverse) order.
  auto next = resumed.begin_allreduce_grad(params, cohort::mean{});
  for (std::size_t i = 4; i-- > 0;) {
    next.ready(i);
  }
  next.wait();
  BOOST_TEST(resumed.learned_bucket_orders()[0].order == readiness);

  // An order that is not one of its layout's gradients is refused by name.
  BOOST_CHECK_EXCEPTION(resumed.restore_bucket_orders({{7, {0, 2, 2}}}), cohort::invalid_argument,
                        message_has({"restore_bucket_orders", "layout 7", "gradient 2 twice"}));
  BOOST_CHECK_EXCEPTION(resumed.restore_bucket_orders({{7, {0, 3}}}), cohort::invalid_argument,
                        message_has({"gradient 3, past its 2"}));
}
