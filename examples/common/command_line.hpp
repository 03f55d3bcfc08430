// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the examples' command lines share: the error a wrong flag raises, reading a number, and
// what the launcher (tools/cohort-run) says through the environment.

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace command_line {

// A mistake on the command line: every rank makes it, so every rank can stop without hanging.
class usage_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The number `text` given to `flag`, all of it.
template <class T>
T parse_value(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) {
    throw usage_error(std::string(flag) + " expects a number, not '" + std::string(text) + "'");
  }
  return value;
}

// ", restart K of at most M (cohort-run)" when tools/cohort-run started this job again after a
// failure (COHORT_RESTART_COUNT, COHORT_MAX_RESTARTS), else "".
inline std::string restart_note() {
  const char* count = std::getenv("COHORT_RESTART_COUNT");
  const char* most = std::getenv("COHORT_MAX_RESTARTS");
  if (count == nullptr || std::string_view(count) == "0") {
    return {};
  }
  return std::string(", restart ") + count + " of at most " + (most ? most : "?") + " (cohort-run)";
}

} // namespace command_line
