// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace bench {

//! One row of the table: how to run the operation once, how to fill its buffers with a value,
//! and how to count the elements that differ from one (for the verification run).
struct method {
  std::string name;
  std::function<void()> run;
  std::function<void(float)> fill;
  std::function<std::size_t(float)> count_not_equal;
};

} // namespace bench
