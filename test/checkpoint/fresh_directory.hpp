// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/cohort.hpp>

#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>

namespace cohort::test {

// A fresh directory every rank sees, named by rank 0, which removes it at the end of the test
// (every rank has read what it reads by then: inside the collectives that end each call).
class fresh_directory {
public:
  fresh_directory(cohort::flat& comm, const std::string& name)
      : root_(comm.rank() == 0) {
    std::string path;
    if (root_) {
      path = (std::filesystem::temp_directory_path() /
              ("cohort-ckpt-" + std::to_string(::getpid()) + "-" + name))
                 .string();
      std::filesystem::remove_all(path);
    }
    path_ = comm.bcast_obj(path);
  }
  fresh_directory(const fresh_directory&) = delete;
  fresh_directory& operator=(const fresh_directory&) = delete;
  ~fresh_directory() {
    if (root_) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  const std::filesystem::path& path() const noexcept { return path_; }

private:
  bool root_;
  std::filesystem::path path_;
};

} // namespace cohort::test
