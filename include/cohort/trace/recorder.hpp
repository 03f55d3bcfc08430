// SPDX-License-Identifier: Apache-2.0
#pragma once

// A per-rank trace of what cohort's gradient reductions spend their time on (json_format.hpp: the
// file's text). A span costs the recording thread two counter reads and the copy of a few words
// under a lock; a thread of the recorder's own formats the events and writes them, at least once a
// second, so that a long run holds no more than a second's events in memory. Time 0 of every rank
// is the end of the agreement that made the communicator, so that one machine's ranks line up in
// tools/merge_traces.py's merged view without correction (across machines, to within the clocks'
// offset).

#include <cohort/config.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/trace/event.hpp>
#include <cohort/trace/json_format.hpp>
#include <cohort/trace/ticks.hpp>

#include <array>
#include <atomic>
#include <cerrno>
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
      , format_(rank, serial_, strategy)
      , max_bytes_(max_bytes)
      , first_anchor_(trace_ticks::anchor::take())
      , anchor_(first_anchor_) {
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
    text_ = format_.header();
    recorded_ = text_.size();
    write(text_);
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
    const std::lock_guard file(file_mutex_);
    std::string end = format_.end(clock::now());
    write(end);
  }

  //! Time 0 of the trace: now (every rank calls this as it leaves the same collective).
  void set_origin() noexcept {
    const std::lock_guard file(file_mutex_); // (the writer reads it)
    format_.set_origin(clock::now());
  }

  //! One span that ran from `start` to `end` (`trace_ticks::now()`) on `thread`. `bytes` and
  //! `bucket` (the bucket's index in its plan, or -1) are given as arguments, with `operation`
  //! (cohort's name of the call it is part of) if not null. Names and operations are cohort's own
  //! string literals.
  void span(const char* name, trace_thread thread, std::uint64_t start, std::uint64_t end,
            std::uint64_t bytes = 0, std::int64_t bucket = -1,
            const char* operation = nullptr) noexcept {
    record({name, operation, start, end, bytes, bucket, thread});
  }

  //! A blocking step whose one bucket was carried in its agreement: one event, from `start` to
  //! `end`, its phases as arguments (pack until `phases[1]` from `phases[0]`, the agreement and
  //! reduction until `phases[2]`, unpack until `end`), so that tracing a step of a few
  //! microseconds costs one event, not four.
  void carried_step(std::uint64_t start, const std::array<std::uint64_t, 3>& phases,
                    std::uint64_t end, std::uint64_t bytes) noexcept {
    record({"allreduce_grad", "blocking, carried in the agreement", start, end, bytes, -1,
            trace_thread::trainer, true, phases});
  }

  const std::filesystem::path& file() const noexcept { return path_; }

  //! Whether spans are recorded now (they are from construction): a trainer may trace chosen
  //! steps only, as Horovod's stop_timeline / start_timeline. Read by every span's caller.
  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }
  void set_recording(bool on) noexcept { recording_.store(on, std::memory_order_relaxed); }

private:
  // The events a batch holds before the writer is woken (it also wakes once a second): 768 KiB.
  static constexpr std::size_t batch_events = 16384;
  // Past this many unwritten events (a disk that does not keep up), new ones are dropped.
  static constexpr std::size_t max_pending_events = 64 * batch_events;

  // Copied as it is; formatted and written by the recorder's thread (bench/trace_span: what an
  // event costs each thread).
  void record(const trace_event& e) noexcept {
    const std::lock_guard lock(mutex_);
    if (full_ || pending_.size() >= max_pending_events) {
      return; // full, or the disk has not kept up for that long: these are lost, not the run
    }
    if (pending_.size() == pending_.capacity()) {
      wake_.notify_one(); // (and the vector grows: the writer is behind)
    }
    try {
      pending_.push_back(e);
    } catch (...) {
      // (no memory to grow the batch: this event is lost, not the run)
    }
  }

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

  // Formats and writes `events`, recorded between the last anchor and `now` (under file_mutex_),
  // through text_, whose memory is kept from batch to batch. Past max_bytes_, a note instead, and
  // nothing more is recorded.
  void write_events(const std::vector<trace_event>& events,
                    const trace_ticks::anchor& now) noexcept {
    const trace_ticks::converter at(first_anchor_, std::exchange(anchor_, now), now);
    if (events.empty()) {
      return;
    }
    try {
      text_.clear();
      text_.reserve(events.size() * 256);
      for (const trace_event& e : events) {
        detail::json_line one;
        format_.event(one, e, at);
        if (!one.whole()) {
          continue;
        }
        if (recorded_ + one.size() > max_bytes_) {
          detail::json_line note;
          format_.full(note, at(e.start));
          text_.append(note.view());
          const std::lock_guard lock(mutex_);
          full_ = true;
          pending_.clear();
          break;
        }
        text_.append(one.view());
        recorded_ += one.size();
      }
      write(text_);
      if (text_.capacity() > (std::size_t{8} << 20)) {
        std::string().swap(text_); // (a batch the disk fell behind on: not kept for the run)
      }
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

  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };

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
    std::vector<trace_event> rest;
    trace_ticks::anchor now{};
    {
      const std::lock_guard lock(mutex_, std::adopt_lock);
      now = trace_ticks::anchor::take();
      rest.swap(pending_);
    }
    write_events(rest, now);
    try {
      std::string text = format_.job_ended(message, this_trace_thread(), clock::now());
      write(text);
    } catch (...) {
      // (no memory for the event: the spans are written)
    }
  }

  int serial_;
  std::filesystem::path path_;
  detail::trace_json format_; // its origin under file_mutex_ once the writer runs
  std::uint64_t max_bytes_;
  std::unique_ptr<std::FILE, closer> file_;
  std::mutex file_mutex_;            // the file, format_, text_, recorded_, taken_ and anchor_;
                                     // taken before mutex_
  std::mutex mutex_;                 // pending_, full_, stopping_
  std::condition_variable wake_;     // the writer's
  std::vector<trace_event> pending_; // recorded, not yet taken by the writer
  std::vector<trace_event> taken_;   // being written, by the writer
  std::string text_;                 // what the writer formats into
  std::uint64_t recorded_ = 0;       // bytes in the file
  trace_ticks::anchor first_anchor_; // when the recorder began (the rate's baseline)
  trace_ticks::anchor anchor_;       // when the events last written were taken
  bool full_ = false;
  bool stopping_ = false;
  std::atomic<bool> recording_{true};
  std::thread writer_; // last: started once the rest is made
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
