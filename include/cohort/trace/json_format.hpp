// SPDX-License-Identifier: Apache-2.0
#pragma once

// The text of one rank's trace file, in the Chrome trace event format (JSON array form), which
// chrome://tracing and https://ui.perfetto.dev open: `pid` the rank, `tid` 2k the trainer's thread
// and 2k + 1 cohort's reduction thread of the k-th communicator traced in the process. The array
// form lets a file cut short by a killed job open all the same (its closing bracket is optional).
// Events are formatted into a fixed buffer with std::to_chars: the recorder's thread formats every
// event of a run, on a machine whose cores may all be busy with ranks.

#include <cohort/config.hpp>
#include <cohort/trace/event.hpp>
#include <cohort/trace/ticks.hpp>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! One event's text, in a fixed buffer; `whole()` is false if it did not fit (never, for cohort's
//! own names).
class json_line {
public:
  using clock = std::chrono::steady_clock;

  json_line() = default;
  json_line(const json_line&) = delete; // (points into itself)
  json_line& operator=(const json_line&) = delete;

  json_line& put(std::string_view text) noexcept {
    if (text.size() > static_cast<std::size_t>(end_ - at_)) {
      whole_ = false;
      return *this;
    }
    std::memcpy(at_, text.data(), text.size());
    at_ += text.size();
    return *this;
  }
  template <class Integer>
  json_line& number(Integer value) noexcept {
    const auto [to, failed] = std::to_chars(at_, end_, value);
    if (failed != std::errc{}) {
      whole_ = false;
      return *this;
    }
    at_ = to;
    return *this;
  }
  //! Microseconds (the format's unit) to the nanosecond.
  json_line& microseconds(clock::duration d) noexcept {
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

//! `text` as the inside of a JSON string, at most `limit` characters of it.
inline std::string json_text(std::string_view text, std::size_t limit = 64) {
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

//! The events of one communicator's trace on one rank, as text.
class trace_json {
public:
  using clock = std::chrono::steady_clock;

  //! `strategy` (the user's to name) is given as an argument of every event.
  trace_json(int rank, int serial, std::string_view strategy)
      : rank_(rank)
      , serial_(serial)
      , strategy_(json_text(strategy))
      , origin_(clock::now()) {}

  //! Time 0 of the trace.
  void set_origin(clock::time_point origin) noexcept { origin_ = origin; }

  int tid(trace_thread thread) const noexcept { return 2 * serial_ + static_cast<int>(thread); }

  //! The array's opening and the names of the process and its two rows.
  std::string header() const {
    const std::string pid = std::to_string(rank_);
    const std::string of =
        serial_ == 0 ? std::string() : ", communicator " + std::to_string(serial_);
    std::string text = "[\n";
    text += R"({"name":"process_name","ph":"M","pid":)" + pid + R"(,"args":{"name":"rank )" + pid +
            R"("}},)" + "\n";
    text += R"({"name":"process_sort_index","ph":"M","pid":)" + pid + R"(,"args":{"sort_index":)" +
            pid + "}},\n";
    text += R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" +
            std::to_string(tid(trace_thread::trainer)) + R"(,"args":{"name":"trainer)" + of +
            R"("}},)" + "\n";
    text += R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" +
            std::to_string(tid(trace_thread::reducer)) +
            R"(,"args":{"name":"cohort reduction thread)" + of + R"("}},)" + "\n";
    return text;
  }

  //! One complete event ("ph":"X"), its times converted by `at`.
  void event(json_line& out, const trace_event& e,
             const trace_ticks::converter& at) const noexcept {
    const clock::time_point start = at(e.start);
    const clock::time_point end = at(e.end);
    out.put(R"({"name":")").put(e.name).put(R"(","cat":"cohort","ph":"X","pid":)");
    out.number(rank_).put(R"(,"tid":)").number(tid(e.thread)).put(R"(,"ts":)");
    out.microseconds(start - origin_).put(R"(,"dur":)").microseconds(end - start);
    out.put(R"(,"args":{"strategy":")").put(strategy_).put(R"(","bytes":)").number(e.bytes);
    out.put(R"(,"bucket":)").number(e.bucket);
    if (e.operation != nullptr) {
      out.put(R"(,"operation":")").put(e.operation).put("\"");
    }
    if (e.carried) {
      const clock::time_point packed = at(e.phases[1]);
      const clock::time_point reduced = at(e.phases[2]);
      out.put(R"(,"pack":)").microseconds(packed - at(e.phases[0]));
      out.put(R"(,"agreement and reduce":)").microseconds(reduced - packed);
      out.put(R"(,"unpack":)").microseconds(end - reduced);
    }
    out.put("}},\n");
  }

  //! The note that ends a trace whose events passed its size limit.
  void full(json_line& out, clock::time_point at) const noexcept {
    out.put(R"({"name":"trace full (max_bytes reached): later events are not recorded",)")
        .put(R"("ph":"i","s":"p","pid":)")
        .number(rank_)
        .put(R"(,"tid":)")
        .number(tid(trace_thread::trainer))
        .put(R"(,"ts":)")
        .microseconds(at - origin_)
        .put("},\n");
  }

  //! The event of a job that cohort ended, with the reason, on `thread`'s row.
  std::string job_ended(std::string_view message, trace_thread thread, clock::time_point at) const {
    return R"({"name":"job ended by cohort","ph":"i","s":"g","pid":)" + std::to_string(rank_) +
           R"(,"tid":)" + std::to_string(tid(thread)) + R"(,"ts":)" + microseconds(at) +
           R"(,"args":{"message":")" + json_text(message, message.size()) + "\"}},\n";
  }

  //! The last event and the array's closing bracket.
  std::string end(clock::time_point at) const {
    return R"({"name":"end of trace","ph":"i","s":"p","pid":)" + std::to_string(rank_) +
           R"(,"tid":)" + std::to_string(tid(trace_thread::trainer)) + R"(,"ts":)" +
           microseconds(at) + "}\n]\n";
  }

private:
  std::string microseconds(clock::time_point t) const {
    json_line text;
    text.microseconds(t - origin_);
    return std::string(text.view());
  }

  int rank_;
  int serial_;
  std::string strategy_;
  clock::time_point origin_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
