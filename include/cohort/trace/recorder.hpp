// SPDX-License-Identifier: Apache-2.0
#pragma once

// A per-rank trace of what cohort's gradient reductions spend their time on, in the Chrome trace
// event format (JSON array form), which chrome://tracing and https://ui.perfetto.dev open: one
// file per rank, `pid` the rank, `tid` 0 the trainer's thread and 1 cohort's reduction thread.
// A span costs the recording thread two clock reads and the copy of a few words under a lock; a
// thread of the recorder's own formats the events and writes them, at least once a second, so that
// a long run holds no more than a second's events in memory; the array form lets a file cut short
// by a killed job open all the same (the closing bracket is optional in that format). Time 0 of
// every rank is the end of the agreement that made the communicator, so that one machine's ranks
// line up in tools/merge_traces.py's merged view without correction (across machines, to within the
// clocks' offset).

#include <cohort/config.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/trace/ticks.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The threads a trace shows for each rank.
enum class trace_thread : int { trainer = 0, reducer = 1 };

//! The calling thread's row in the trace: cohort's reduction thread sets its own once; every
//! other thread is the trainer's.
inline trace_thread& this_trace_thread() noexcept {
  thread_local trace_thread role = trace_thread::trainer;
  return role;
}

//! Writes one communicator's trace on one process to `directory/cohort-trace-rank<rank>.json`
//! (`rank` the process's rank in MPI_COMM_WORLD), or `...rank<rank>.comm<k>.json` for the k-th
//! communicator traced in the process after the first (a split, a second one): each has a file of
//! its own, and rows `tid` 2k (trainer) and 2k + 1 (cohort's thread) under the process. Thread-safe
//! (the trainer's and cohort's threads record into it at once; the disk is written outside the
//! lock they take). What it records reaches the file at least once a second, so a job killed from
//! outside keeps all but its last second; a job cohort ends (a timeout, a rank gone, terminate)
//! keeps everything, and an event "job ended by cohort" with the reason.
class trace_recorder {
public:
  using clock = std::chrono::steady_clock;

  //! Creates `directory` (and its parents) if need be and the file; throws `error` naming the
  //! file if it cannot be written. `strategy` is given as an argument of every event. Past
  //! `max_bytes` of events, recording stops and the file ends with an event saying so.
  trace_recorder(const std::filesystem::path& directory, int rank, std::string_view strategy,
                 std::uint64_t max_bytes = std::uint64_t{1} << 30)
      : serial_(next_serial())
      , path_(directory /
              ("cohort-trace-rank" + std::to_string(rank) +
               (serial_ == 0 ? std::string() : ".comm" + std::to_string(serial_)) + ".json"))
      , rank_(rank)
      , strategy_(json_text(strategy))
      , max_bytes_(max_bytes)
      , origin_(clock::now())
      , anchor_(trace_ticks::anchor::take()) {
    std::error_code code;
    std::filesystem::create_directories(directory, code);
    file_.reset(std::fopen(path_.c_str(), "w"));
    if (!file_) {
      throw error("cohort: cannot write the trace file " + path_.string() + " (" +
                  (code ? code.message() : std::string(std::strerror(errno))) +
                  "): COHORT_TRACE or communicator_options::trace_directory names a directory "
                  "this rank cannot write to");
    }
    pending_.reserve(batch_events);
    taken_.reserve(batch_events);
    std::string header = "[\n";
    const std::string pid = std::to_string(rank_);
    const std::string of =
        serial_ == 0 ? std::string() : ", communicator " + std::to_string(serial_);
    header += R"({"name":"process_name","ph":"M","pid":)" + pid + R"(,"args":{"name":"rank )" +
              pid + R"("}},)" + "\n";
    header += R"({"name":"process_sort_index","ph":"M","pid":)" + pid +
              R"(,"args":{"sort_index":)" + pid + "}},\n";
    header += R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" +
              std::to_string(tid(trace_thread::trainer)) + R"(,"args":{"name":"trainer)" + of +
              R"("}},)" + "\n";
    header += R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" +
              std::to_string(tid(trace_thread::reducer)) +
              R"(,"args":{"name":"cohort reduction thread)" + of + R"("}},)" + "\n";
    recorded_ = header.size();
    write(header);
    {
      live_recorders& live = recorders();
      const std::lock_guard lock(live.mutex);
      live.list.push_back(this);
      detail::end_job_hook_slot().store(&write_all_before_end_of_job);
    }
    try {
      writer_ = std::thread([this] { write_in_the_background(); });
    } catch (...) {
      const std::lock_guard lock(recorders().mutex);
      std::erase(recorders().list, this);
      throw;
    }
  }

  trace_recorder(const trace_recorder&) = delete;
  trace_recorder& operator=(const trace_recorder&) = delete;

  //! Writes what is left and closes the array.
  ~trace_recorder() {
    {
      live_recorders& live = recorders();
      const std::lock_guard lock(live.mutex);
      std::erase(live.list, this);
    }
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    writer_.join(); // it wrote all that was recorded
    std::string end = R"({"name":"end of trace","ph":"i","s":"p","pid":)" + std::to_string(rank_) +
                      R"(,"tid":)" + std::to_string(tid(trace_thread::trainer)) + R"(,"ts":)" +
                      microseconds(clock::now()) + "}\n]\n";
    const std::lock_guard file(file_mutex_);
    write(end);
  }

  //! Time 0 of the trace: now (every rank calls this as it leaves the same collective).
  void set_origin() noexcept {
    const std::lock_guard file(file_mutex_); // (the writer reads it)
    origin_ = clock::now();
  }

  //! One span that ran from `start` to `end` (`trace_ticks::now()`) on `thread`. `bytes` and
  //! `bucket` (the bucket's index in its plan, or -1) are given as arguments, with `operation`
  //! (cohort's name of the call it is part of) if not null. Names and operations are cohort's own
  //! string literals.
  void span(const char* name, trace_thread thread, std::uint64_t start, std::uint64_t end,
            std::uint64_t bytes = 0, std::int64_t bucket = -1,
            const char* operation = nullptr) noexcept {
    // Copied as it is; formatted and written by the recorder's thread (bench/allreduce's
    // flat/traced row: what a span costs the step).
    const std::lock_guard lock(mutex_);
    if (full_) {
      return;
    }
    if (pending_.size() == pending_.capacity()) {
      if (pending_.size() >= max_pending_events) {
        return; // the disk has not kept up for that long: these are lost, not the run
      }
      wake_.notify_one(); // (and the vector grows: the writer is behind)
    }
    try {
      pending_.push_back({name, operation, start, end, bytes, bucket, thread});
    } catch (...) {
      // (no memory to grow the batch: this event is lost, not the run)
    }
  }

  //! A blocking step whose one bucket was carried in its agreement: one event, from `start` to
  //! `end`, its phases as arguments (pack until `phases[1]` from `phases[0]`, the agreement and
  //! reduction until `phases[2]`, unpack until `end`), so that tracing a step of a few
  //! microseconds costs one event, not four.
  void carried_step(std::uint64_t start, const std::array<std::uint64_t, 3>& phases,
                    std::uint64_t end, std::uint64_t bytes) noexcept {
    const std::lock_guard lock(mutex_);
    if (full_ || pending_.size() >= max_pending_events) {
      return;
    }
    if (pending_.size() == pending_.capacity()) {
      wake_.notify_one();
    }
    try {
      pending_.push_back({"allreduce_grad", "blocking, carried in the agreement", start, end, bytes,
                          -1, trace_thread::trainer, true, phases});
    } catch (...) {
      // (no memory to grow the batch: this event is lost, not the run)
    }
  }

  const std::filesystem::path& file() const noexcept { return path_; }

private:
  // The events a batch holds before the writer is woken (it also wakes once a second): 768 KiB.
  static constexpr std::size_t batch_events = 16384;
  // Past this many unwritten events (a disk that does not keep up), new ones are dropped.
  static constexpr std::size_t max_pending_events = 64 * batch_events;

  struct event {
    const char* name;
    const char* operation;
    std::uint64_t start; // trace_ticks
    std::uint64_t end;
    std::uint64_t bytes;
    std::int64_t bucket;
    trace_thread thread;
    bool carried = false; // a step carried in its agreement: its phases end at `phases`
    std::array<std::uint64_t, 3> phases{};
  };

  // The writer: at least once a second (sooner when a batch is full), takes the events recorded
  // and writes them, formatted, until the recorder stops.
  void write_in_the_background() noexcept {
    for (bool stop = false; !stop;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait_for(lock, std::chrono::seconds(1),
                       [&] { return stopping_ || pending_.size() >= batch_events; });
      }
      const std::lock_guard file(file_mutex_); // (before mutex_, as everywhere)
      trace_ticks::anchor now{};
      {
        const std::lock_guard lock(mutex_);
        now = trace_ticks::anchor::take(); // after every event taken
        std::swap(pending_, taken_);
        stop = stopping_;
      }
      write_events(taken_, now);
      taken_.clear();
    }
  }

  // Formats and writes `events`, recorded between the last anchor and `now` (under file_mutex_).
  // Past max_bytes_, a note instead, and nothing more is recorded.
  void write_events(const std::vector<event>& events, const trace_ticks::anchor& now) noexcept {
    const trace_ticks::anchor from = std::exchange(anchor_, now);
    if (events.empty()) {
      return;
    }
    try {
      std::string text;
      text.reserve(events.size() * 200);
      for (const event& e : events) {
        const clock::time_point start = trace_ticks::to_time(e.start, from, now);
        const clock::time_point end = trace_ticks::to_time(e.end, from, now);
        line one;
        one.put(R"({"name":")").put(e.name).put(R"(","cat":"cohort","ph":"X","pid":)");
        one.number(rank_).put(R"(,"tid":)").number(tid(e.thread)).put(R"(,"ts":)");
        one.microseconds(start - origin_).put(R"(,"dur":)").microseconds(end - start);
        one.put(R"(,"args":{"strategy":")").put(strategy_).put(R"(","bytes":)").number(e.bytes);
        one.put(R"(,"bucket":)").number(e.bucket);
        if (e.operation != nullptr) {
          one.put(R"(,"operation":")").put(e.operation).put("\"");
        }
        if (e.carried) {
          const auto at = [&](std::uint64_t ticks) {
            return trace_ticks::to_time(ticks, from, now);
          };
          one.put(R"(,"pack":)").microseconds(at(e.phases[1]) - at(e.phases[0]));
          one.put(R"(,"agreement and reduce":)").microseconds(at(e.phases[2]) - at(e.phases[1]));
          one.put(R"(,"unpack":)").microseconds(end - at(e.phases[2]));
        }
        one.put("}},\n");
        if (!one.whole()) {
          continue;
        }
        if (recorded_ + one.size() > max_bytes_) {
          line note;
          note.put(R"({"name":"trace full (max_bytes reached): later events are not recorded",)")
              .put(R"("ph":"i","s":"p","pid":)")
              .number(rank_)
              .put(R"(,"tid":)")
              .number(tid(trace_thread::trainer))
              .put(R"(,"ts":)")
              .microseconds(start - origin_)
              .put("},\n");
          text.append(note.view());
          const std::lock_guard lock(mutex_);
          full_ = true;
          pending_.clear();
          break;
        }
        text.append(one.view());
        recorded_ += one.size();
      }
      write(text);
    } catch (...) {
      // (no memory to format them: these events are lost, not the run)
    }
  }

  // The communicators traced in this process, in the order they were made (the same on every
  // rank: communicators are made collectively).
  static int next_serial() noexcept {
    static std::atomic<int> serial{0};
    return serial.fetch_add(1);
  }

  int tid(trace_thread thread) const noexcept { return 2 * serial_ + static_cast<int>(thread); }

  // `text` as the inside of a JSON string (a strategy's name is the user's to choose), at most
  // `limit` characters of it.
  static std::string json_text(std::string_view text, std::size_t limit = 64) {
    std::string out;
    for (const char c : text.substr(0, limit)) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        out += '?';
      } else {
        out += c;
      }
    }
    return out;
  }

  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };

  // One event's text, in a fixed buffer; `whole()` is false if it did not fit (never, for
  // cohort's own names).
  class line {
  public:
    line() = default;
    line(const line&) = delete; // (points into itself)
    line& operator=(const line&) = delete;
    line& put(std::string_view text) noexcept {
      if (text.size() > static_cast<std::size_t>(end_ - at_)) {
        whole_ = false;
        return *this;
      }
      std::memcpy(at_, text.data(), text.size());
      at_ += text.size();
      return *this;
    }
    template <class Integer>
    line& number(Integer value) noexcept {
      const auto [to, failed] = std::to_chars(at_, end_, value);
      if (failed != std::errc{}) {
        whole_ = false;
        return *this;
      }
      at_ = to;
      return *this;
    }
    //! Microseconds (the format's unit) to the nanosecond.
    line& microseconds(clock::duration d) noexcept {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
      const auto magnitude = static_cast<std::uint64_t>(ns < 0 ? -ns : ns);
      if (ns < 0) {
        put("-");
      }
      number(magnitude / 1000).put(".");
      const auto fraction = static_cast<unsigned>(magnitude % 1000);
      const char digits[3] = {static_cast<char>('0' + fraction / 100),
                              static_cast<char>('0' + fraction / 10 % 10),
                              static_cast<char>('0' + fraction % 10)};
      return put({digits, 3});
    }
    bool whole() const noexcept { return whole_; }
    std::size_t size() const noexcept { return static_cast<std::size_t>(at_ - text_); }
    std::string_view view() const noexcept { return {text_, size()}; }

  private:
    char text_[512];
    char* at_ = text_;
    char* end_ = text_ + sizeof text_;
    bool whole_ = true;
  };

  std::string microseconds(clock::time_point t) const {
    line text;
    text.microseconds(t - origin_);
    return std::string(text.view());
  }

  // Writes and empties `text` (under file_mutex_, or before the writer starts). A write that fails
  // (a full disk) loses those events, not the run: a trace is a diagnostic, and what was written
  // before stays readable.
  void write(std::string& text) noexcept {
    if (!text.empty() && file_) {
      std::fwrite(text.data(), 1, text.size(), file_.get());
      std::fflush(file_.get());
    }
    text.clear();
  }

  // The recorders of this process, for end_job.
  struct live_recorders {
    std::mutex mutex;
    std::vector<trace_recorder*> list;
  };
  static live_recorders& recorders() noexcept {
    static live_recorders live;
    return live;
  }

  // cohort is ending the job (detail::end_job): every recorder writes what it holds and an event
  // with the reason, so that the trace shows how the job ended. From whatever thread ends the
  // job, while the others may be inside a span: a lock that stays taken is given up after 100 ms
  // (that recorder's last second is lost), never waited on.
  static void write_all_before_end_of_job(const std::string& message) noexcept {
    live_recorders& live = recorders();
    if (!lock_within_100ms(live.mutex)) {
      return;
    }
    const std::lock_guard list(live.mutex, std::adopt_lock);
    for (trace_recorder* recorder : live.list) {
      recorder->write_before_end_of_job(message);
    }
  }

  // try_lock until it succeeds or 100 ms have passed (not a timed mutex: ThreadSanitizer does not
  // see the timed lock's clock variant, and would report its unlock).
  static bool lock_within_100ms(std::mutex& m) noexcept {
    const auto until = clock::now() + std::chrono::milliseconds(100);
    while (!m.try_lock()) {
      if (clock::now() >= until) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  void write_before_end_of_job(const std::string& message) noexcept {
    // file_mutex_ first, as the writer takes them: it may be writing a batch, which then goes
    // first.
    if (!lock_within_100ms(file_mutex_)) {
      return;
    }
    const std::lock_guard file(file_mutex_, std::adopt_lock);
    if (!lock_within_100ms(mutex_)) {
      return;
    }
    std::vector<event> rest;
    trace_ticks::anchor now{};
    {
      const std::lock_guard lock(mutex_, std::adopt_lock);
      now = trace_ticks::anchor::take();
      rest.swap(pending_);
    }
    write_events(rest, now);
    try {
      std::string text = R"({"name":"job ended by cohort","ph":"i","s":"g","pid":)" +
                         std::to_string(rank_) + R"(,"tid":)" +
                         std::to_string(tid(this_trace_thread())) + R"(,"ts":)" +
                         microseconds(clock::now()) + R"(,"args":{"message":")" +
                         json_text(message, message.size()) + "\"}},\n";
      write(text);
    } catch (...) {
      // (no memory for the event: the spans are written)
    }
  }

  int serial_;
  std::filesystem::path path_;
  int rank_;
  std::string strategy_;
  std::uint64_t max_bytes_;
  clock::time_point origin_; // under file_mutex_ once the writer runs
  std::unique_ptr<std::FILE, closer> file_;
  std::mutex file_mutex_;        // the file, recorded_ and taken_; taken before mutex_
  std::mutex mutex_;             // pending_, full_, stopping_
  std::condition_variable wake_; // the writer's
  std::vector<event> pending_;   // recorded, not yet taken by the writer
  std::vector<event> taken_;     // being written, by the writer
  std::uint64_t recorded_ = 0;   // bytes in the file
  trace_ticks::anchor anchor_;   // when the events last written were taken (under file_mutex_)
  bool full_ = false;
  bool stopping_ = false;
  std::thread writer_; // last: started once the rest is made
};

//! A profiler's ranges, which every span of cohort's opens and closes whether or not a trace file
//! is written: <cohort/trace/nvtx.hpp> installs NVTX's (Nsight Systems' timeline then shows each
//! step, agreement, pack, reduce and unpack), in every program that includes it, as a GPU build
//! does. Null by default: one branch per span. Installed before main, read only after.
struct profiler_ranges {
  std::uint64_t (*start)(const char* name) noexcept = nullptr;
  void (*end)(std::uint64_t range) noexcept = nullptr;
};
inline profiler_ranges installed_profiler_ranges{};

//! A profiler range from `open` (or construction) to `close` (or destruction); nothing when no
//! profiler is installed.
class profiler_range {
public:
  profiler_range() = default;
  explicit profiler_range(const char* name) noexcept { open(name); }
  ~profiler_range() { close(); }
  profiler_range(const profiler_range&) = delete;
  profiler_range& operator=(const profiler_range&) = delete;

  void open(const char* name) noexcept {
    close();
    const profiler_ranges ranges = installed_profiler_ranges;
    if (ranges.start != nullptr && ranges.end != nullptr) {
      range_ = ranges.start(name);
      end_ = ranges.end; // the one that opened it closes it
    }
  }
  void close() noexcept {
    if (end_ != nullptr) {
      std::exchange(end_, nullptr)(range_);
    }
  }

private:
  std::uint64_t range_ = 0;
  void (*end_)(std::uint64_t) noexcept = nullptr;
};

//! Records the span from its construction to its end into `recorder`, if not null, and opens a
//! profiler range for it if one is installed: two branches, and nothing else, when both are off.
class trace_span {
public:
  trace_span(trace_recorder* recorder, const char* name, trace_thread thread,
             std::uint64_t bytes = 0, std::int64_t bucket = -1,
             const char* operation = nullptr) noexcept
      : recorder_(recorder)
      , name_(name)
      , thread_(thread)
      , bytes_(bytes)
      , bucket_(bucket)
      , operation_(operation)
      , range_(name) {
    if (recorder_ != nullptr) {
      start_ = trace_ticks::now();
    }
  }
  ~trace_span() {
    if (recorder_ != nullptr) {
      recorder_->span(name_, thread_, start_, trace_ticks::now(), bytes_, bucket_, operation_);
    }
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;

  //! What the span turned out to be, known only at its end (an agreement that also reduced).
  void relabel(const char* name, std::uint64_t bytes, std::int64_t bucket) noexcept {
    name_ = name;
    bytes_ = bytes;
    bucket_ = bucket;
  }

private:
  trace_recorder* recorder_;
  const char* name_;
  trace_thread thread_;
  std::uint64_t bytes_;
  std::int64_t bucket_;
  const char* operation_;
  profiler_range range_;
  std::uint64_t start_ = 0;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
