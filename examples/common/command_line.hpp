// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the examples' command lines share: the error a wrong flag raises, and reading a number.

#include <charconv>
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

} // namespace command_line
