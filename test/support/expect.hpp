// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

namespace cohort::test {

//! A predicate for BOOST_CHECK_EXCEPTION: the message contains every one of `parts`.
inline auto message_has(std::vector<std::string> parts) {
  return [parts = std::move(parts)](const std::exception& e) {
    const std::string what = e.what();
    for (const auto& part : parts) {
      if (what.find(part) == std::string::npos) {
        BOOST_TEST_MESSAGE("missing '" << part << "' in: " << what);
        return false;
      }
    }
    return true;
  };
}

} // namespace cohort::test
