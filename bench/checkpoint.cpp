// SPDX-License-Identifier: Apache-2.0
// cohort::checkpointer's save and resume beside the plain file operations on the same bytes, in
// one run (issue 13): a state of --bytes (a parameter set of 64 float tensors, replicated), each
// measured --reps times, the median printed. Rows:
//   save        cohort's save (serialize, write its part atomically on each rank, manifest)
//   dd          one process writing the same bytes to one file and fsyncing it (dd conv=fsync)
//   resume      cohort's resume (every rank reads and verifies every part, then loads)
//   read        one process reading the same bytes from one file
//   async stall what save blocks the trainer for with `async` (copying the state)
//   completion  what the next call then blocks it for, the files written meanwhile (the ranks
//               agree, rank 0 writes the manifest and removes the checkpoint keep N lets go)
//   memcpy      copying the same bytes in memory
// Every timing is the slowest rank's, after a barrier; cohort and the plain operation take turns
// going first. Before each of them, every file of the run is dropped from the
// page cache (posix_fadvise DONTNEED, which needs no privilege once they are synced):
// - reads are then cold, as a job that resumes after a crash reads them;
// - writes then fill memory the kernel has just freed. On a VM whose balloon reports free pages
//   to the host (this one: Firecracker, virtio-balloon with free page reporting), memory freed
//   seconds ago is taken back by the host, and the first write into it faults on the host:
//   1 GB written into the page cache took 2.3 s instead of 0.2 s, 59% of it in the kernel's
//   copy_folio_from_iter_atomic (perf). Which operation got such memory depended on the order,
//   not on the operation: `dd` over its own file reuses the pages its truncation freed, a
//   checkpoint (which keeps the previous one until the new one is complete) needs new ones, and
//   `dd` to a new file while the old one stays paid the same 2.2-2.9 s. Dropped caches give
//   every write the same memory.
//
//   mpirun -np 2 bench_checkpoint --bytes 100M [--reps 5] [--dir DIR]
#include <cohort/checkpoint.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include "timing.hpp"

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

std::uint64_t parse_bytes(std::string_view text) {
  std::uint64_t scale = 1;
  if (text.ends_with('G')) {
    scale = std::uint64_t{1} << 30;
  } else if (text.ends_with('M')) {
    scale = std::uint64_t{1} << 20;
  }
  if (scale != 1) {
    text.remove_suffix(1);
  }
  return std::stoull(std::string(text)) * scale;
}

void must(bool ok, const char* what) {
  if (!ok) {
    throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
  }
}

// dd conv=fsync: the bytes to one new file, then fsync.
void plain_write(const std::filesystem::path& path, const std::vector<std::vector<float>>& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  must(fd >= 0, "open");
  for (const auto& t : data) {
    const auto* p = reinterpret_cast<const char*>(t.data());
    std::size_t left = t.size() * sizeof(float);
    while (left > 0) {
      const ::ssize_t n = ::write(fd, p, left);
      must(n > 0, "write");
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  must(::fsync(fd) == 0, "fsync");
  ::close(fd);
}

void plain_read(const std::filesystem::path& path, std::vector<std::vector<float>>& data) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  must(fd >= 0, "open");
  for (auto& t : data) {
    auto* p = reinterpret_cast<char*>(t.data());
    std::size_t left = t.size() * sizeof(float);
    while (left > 0) {
      const ::ssize_t n = ::read(fd, p, left);
      must(n > 0, "read");
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
}

// Drops every file under `dir` from the page cache (they are on disk: written and fsynced).
void drop_cache(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
      }
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  try {
    std::uint64_t bytes = 100 << 20;
    int reps = 5;
    std::filesystem::path dir = std::filesystem::temp_directory_path() / "cohort-bench-checkpoint";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string_view flag = argv[i];
      if (flag == "--bytes") {
        bytes = parse_bytes(argv[i + 1]);
      } else if (flag == "--reps") {
        reps = std::stoi(argv[i + 1]);
      } else if (flag == "--dir") {
        dir = argv[i + 1];
      } else {
        throw std::invalid_argument("unknown flag " + std::string(flag));
      }
    }
    auto comm = cohort::make_communicator<cohort::flat>();
    const MPI_Comm raw = comm.mpi_comm();
    if (comm.rank() == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
    }
    comm.barrier();

    constexpr std::size_t tensors = 64;
    const std::size_t floats = bytes / sizeof(float) / tensors;
    std::vector<std::vector<float>> values(tensors, std::vector<float>(floats));
    std::vector<std::vector<float>> grads(tensors);
    std::vector<param> params;
    for (std::size_t t = 0; t < tensors; ++t) {
      for (std::size_t i = 0; i < floats; ++i) {
        values[t][i] = static_cast<float>((t * 131 + i) % 1000) * 0.001f;
      }
      std::string name = "p"; // (GCC 12 warns falsely of "p" + std::to_string(t) here)
      name += std::to_string(t);
      params.push_back({std::move(name), &values[t], &grads[t]});
    }
    std::vector<std::vector<float>> copy = values;

    std::vector<double> save, dd, resume, read, stall, completion, memcpy_s;
    cohort::checkpointer sync{comm, dir / "sync", {.keep = 1}};
    cohort::checkpointer async{comm, dir / "async", {.keep = 1, .async = true}};
    for (int r = 0; r < reps; ++r) {
      const auto step = static_cast<std::uint64_t>(r + 1);
      // This VM's disk makes a write that follows another large one pay for it (the host is
      // still flushing the first), so cohort and the plain operation take turns going first.
      const auto cohort_save = [&] {
        if (comm.rank() == 0) {
          drop_cache(dir);
        }
        save.push_back(bench::time_once(raw, [&] { sync.save(step, params); }));
      };
      const auto plain_save = [&] {
        if (comm.rank() == 0) {
          drop_cache(dir);
        }
        dd.push_back(bench::time_once(raw, [&] {
          if (comm.rank() == 0) {
            plain_write(dir / "plain", values);
          }
        }));
      };
      const auto cohort_resume = [&] {
        if (comm.rank() == 0) {
          drop_cache(dir);
        }
        resume.push_back(bench::time_once(raw, [&] {
          if (sync.resume(params) != step) {
            throw std::runtime_error("resumed another step");
          }
        }));
      };
      const auto plain_resume = [&] {
        if (comm.rank() == 0) {
          drop_cache(dir);
        }
        read.push_back(bench::time_once(raw, [&] {
          if (comm.rank() == 0) {
            plain_read(dir / "plain", copy);
          }
        }));
      };
      if (r % 2 == 0) {
        cohort_save();
        plain_save();
        cohort_resume();
        plain_resume();
      } else {
        plain_save();
        cohort_save();
        plain_resume();
        cohort_resume();
      }
      stall.push_back(bench::time_once(raw, [&] { async.save(step, params); }));
      // The writer thread writes into memory just freed, as the other writes do (dropping before
      // the stall's timing would slow its memcpy: the host takes the freed memory back meanwhile).
      if (comm.rank() == 0) {
        drop_cache(dir / "sync");
      }
      // Training goes on while the writer thread writes (here: a sleep twice as long as a
      // synchronous save took); then what the next call does on the trainer's thread to complete
      // the checkpoint (the ranks agree, rank 0 writes the manifest and prunes).
      std::this_thread::sleep_for(2 * std::chrono::duration<double>(save.back()));
      completion.push_back(bench::time_once(raw, [&] { async.finish(); }));
      memcpy_s.push_back(bench::time_once(raw, [&] {
        for (std::size_t t = 0; t < tensors; ++t) {
          std::memcpy(copy[t].data(), values[t].data(), floats * sizeof(float));
        }
      }));
    }
    if (comm.rank() == 0) {
      const double mb = static_cast<double>(tensors * floats * sizeof(float)) / (1 << 20);
      const auto ms = [](const std::vector<double>& v) { return bench::median(v) * 1e3; };
      std::printf("checkpoint %.0f MB %d rank(s): save %.1f dd %.1f resume %.1f read %.1f "
                  "async-stall %.1f memcpy %.1f async-completion %.1f\n",
                  mb, comm.size(), ms(save), ms(dd), ms(resume), ms(read), ms(stall), ms(memcpy_s),
                  ms(completion));
      std::filesystem::remove_all(dir);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
