// SPDX-License-Identifier: Apache-2.0
#pragma once

// The examples' --reducer: mean, or powersgd:RANK[:START]. The reducer is a type (the optimizer's
// third parameter), so the choice made at run time picks one of two instantiations.

#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/powersgd.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "command_line.hpp"

namespace command_line {

// Calls `train` with the reducer `text` names.
template <class Train>
int with_reducer(const std::string& text, Train&& train) {
  if (text == "mean") {
    return train(cohort::mean{});
  }
  constexpr std::string_view prefix = "powersgd:";
  if (!text.starts_with(prefix)) {
    throw usage_error("--reducer: '" + text + "' is neither mean nor powersgd:RANK[:START]");
  }
  const std::string_view rest = std::string_view(text).substr(prefix.size());
  const std::size_t colon = rest.find(':');
  cohort::powersgd_options options;
  options.rank = parse_value<int>("--reducer powersgd:RANK", rest.substr(0, colon));
  options.start_step =
      colon == std::string_view::npos
          ? 0
          : parse_value<std::uint64_t>("--reducer powersgd:RANK:START", rest.substr(colon + 1));
  if (options.rank < 1) {
    throw usage_error("--reducer powersgd:RANK: the rank must be at least 1");
  }
  return train(cohort::powersgd(options));
}

} // namespace command_line
