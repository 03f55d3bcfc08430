// SPDX-License-Identifier: Apache-2.0
// The device kernels (pack, unpack, scale, cast, reduce) at every dtype and at sizes from one
// element to 1 GiB, each result compared bit for bit with the host implementation (the oracle of
// kernels/host.cpp), on fresh random inputs and poisoned outputs; then their speed on large
// buckets as a fraction of the device's own copy bandwidth (cudaMemcpy device to device, timed in
// the same run). Part of the device kit (tools/gpu/run.sh): exits 1 when a check fails, 77
// where no device is visible.
//
//   bench_gpu_kernels [--max-bytes B (1 GiB)] [--runs R (20)] [--seed S (from the clock)]

#include <cohort/cuda.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cohort::bfloat16;
using cohort::const_tensor_view;
using cohort::dtype;
using cohort::float16;
using cohort::tensor_view;
namespace device = cohort::kernels::device;
namespace host = cohort::kernels::host;
using cohort::cuda::check;

// splitmix64: fast enough to fill a GiB, different for every seed.
struct random_bits {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// Values that stay finite and in range under every kernel here (a sum of two, a factor of 0.5
// or 2): integers in [-1000, 1000) (uint8 in [0, 100)), reals with a fraction in [-100, 100).
template <class T>
T random_value(random_bits& bits) {
  const std::uint64_t r = bits.next();
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<T>(r % 100);
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(r % 2000) - 1000);
  } else {
    const double x = static_cast<double>(r >> 11) * 0x1.0p-53 * 200.0 - 100.0;
    return cohort::kernels::convert<T>(x);
  }
}

// Host memory for one tensor of `count` elements of `type`, as bytes.
struct host_tensor {
  dtype type;
  std::vector<std::byte> bytes;
  host_tensor(dtype t, std::size_t count)
      : type(t)
      , bytes(count * cohort::size_of(t)) {}
  std::size_t count() const { return bytes.size() / cohort::size_of(type); }
  tensor_view view() { return {bytes.data(), count(), type, cohort::memory_location::host}; }
  const_tensor_view const_view() const {
    return {bytes.data(), count(), type, cohort::memory_location::host};
  }
  void randomize(random_bits& bits) {
    cohort::visit(type, [&]<class T>(std::type_identity<T>) {
      auto* p = reinterpret_cast<T*>(bytes.data());
      for (std::size_t i = 0, n = count(); i < n; ++i) {
        p[i] = random_value<T>(bits);
      }
    });
  }
};

// Device memory for one tensor, filled from and read back into a host_tensor.
class device_tensor {
public:
  device_tensor(dtype type, std::size_t count)
      : type_(type)
      , count_(count) {
    check(cudaMalloc(&data_, std::max<std::size_t>(1, bytes())), "cudaMalloc");
  }
  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
  ~device_tensor() { (void)cudaFree(data_); }

  std::size_t bytes() const { return count_ * cohort::size_of(type_); }
  void* data() const { return data_; }
  tensor_view view() const { return {data_, count_, type_, cohort::memory_location::device}; }
  const_tensor_view const_view() const {
    return {data_, count_, type_, cohort::memory_location::device};
  }
  void upload(const host_tensor& from) {
    check(cudaMemcpy(data_, from.bytes.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // Every byte 0xFF (a NaN for the reals), so that an element the kernel never wrote shows.
  void poison() {
    check(cudaMemset(data_, 0xFF, bytes()), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  host_tensor download() const {
    host_tensor to(type_, count_);
    check(cudaMemcpy(to.bytes.data(), data_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return to;
  }

private:
  dtype type_;
  std::size_t count_;
  void* data_ = nullptr;
};

struct tally {
  int passed = 0;
  int failed = 0;
};

// The first element where `got` and `expected` differ in their bits, or none.
void compare(tally& t, std::string_view what, const host_tensor& got, const host_tensor& expected) {
  const std::size_t size = cohort::size_of(got.type);
  const std::size_t n = got.count();
  if (std::memcmp(got.bytes.data(), expected.bytes.data(), got.bytes.size()) == 0) {
    ++t.passed;
    return;
  }
  std::size_t i = 0;
  while (i < n && std::memcmp(&got.bytes[i * size], &expected.bytes[i * size], size) == 0) {
    ++i;
  }
  ++t.failed;
  std::printf("FAIL %.*s: element %zu of %zu differs from the host's\n",
              static_cast<int>(what.size()), what.data(), i, n);
}

// n elements split into up to three tensors of uneven sizes (a bucket of several parameters).
std::vector<std::size_t> split(std::size_t n) {
  if (n < 3) {
    return {n};
  }
  return {n / 2, n / 4, n - n / 2 - n / 4};
}

std::string label(const char* kernel, dtype from, dtype to, std::size_t n) {
  std::string s = std::string(kernel) + " " + std::string(cohort::to_string(from));
  if (to != from) {
    s += "->" + std::string(cohort::to_string(to));
  }
  return s + " x" + std::to_string(n);
}

// pack (with the mean's factor) and unpack (undoing it) of n elements of `type` through a
// buffer of `wire`, against host::pack and host::unpack.
void check_pack_and_unpack(tally& t, dtype type, dtype wire, std::size_t n, random_bits& bits,
                           cudaStream_t stream, device::batch_workspace& workspace) {
  std::vector<host_tensor> sources;
  std::vector<std::unique_ptr<device_tensor>> on_device;
  std::vector<const_tensor_view> host_views, device_views;
  for (const std::size_t part : split(n)) {
    sources.emplace_back(type, part).randomize(bits);
    on_device.push_back(std::make_unique<device_tensor>(type, part));
    on_device.back()->upload(sources.back());
  }
  for (std::size_t i = 0; i < sources.size(); ++i) {
    host_views.push_back(sources[i].const_view());
    device_views.push_back(on_device[i]->const_view());
  }
  host_tensor expected(wire, n);
  host::pack(host_views, expected.view(), 0.5);
  device_tensor buffer(wire, n);
  buffer.poison();
  device::pack(device_views, buffer.view(), 0.5, stream, workspace);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  compare(t, label("pack", type, wire, n), buffer.download(), expected);

  std::vector<host_tensor> unpacked;
  std::vector<tensor_view> host_targets, device_targets;
  for (const std::size_t part : split(n)) {
    unpacked.emplace_back(type, part);
  }
  for (std::size_t i = 0; i < unpacked.size(); ++i) {
    host_targets.push_back(unpacked[i].view());
    on_device[i]->poison();
    device_targets.push_back(on_device[i]->view());
  }
  host::unpack(expected.const_view(), host_targets, 2.0);
  device::unpack(buffer.const_view(), device_targets, 2.0, stream, workspace);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (std::size_t i = 0; i < unpacked.size(); ++i) {
    compare(t, label("unpack", wire, type, unpacked[i].count()), on_device[i]->download(),
            unpacked[i]);
  }
}

void check_elementwise(tally& t, dtype type, std::size_t n, random_bits& bits,
                       cudaStream_t stream) {
  host_tensor a(type, n), b(type, n);
  a.randomize(bits);
  b.randomize(bits);
  device_tensor da(type, n), db(type, n);

  da.upload(a);
  device::scale(da.view(), 0.5, stream);
  host_tensor scaled = a;
  host::scale(scaled.view(), 0.5);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  compare(t, label("scale", type, type, n), da.download(), scaled);

  const dtype to = type == dtype::float32 ? dtype::bfloat16 : dtype::float32;
  device_tensor cast_to(to, n);
  cast_to.poison();
  da.upload(a);
  device::cast(da.const_view(), cast_to.view(), stream);
  host_tensor cast_expected(to, n);
  host::cast(a.const_view(), cast_expected.view());
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  compare(t, label("cast", type, to, n), cast_to.download(), cast_expected);

  for (const auto op : {cohort::reduce_op::sum, cohort::reduce_op::max}) {
    da.upload(a);
    db.upload(b);
    device::reduce(da.view(), db.const_view(), op, stream);
    host_tensor reduced = a;
    host::reduce(reduced.view(), b.const_view(), op);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    compare(t, label(op == cohort::reduce_op::sum ? "reduce-sum" : "reduce-max", type, type, n),
            da.download(), reduced);
  }
}

// ---- speed ---------------------------------------------------------------------------------

struct timer {
  cudaStream_t stream;
  int runs;
  template <class Launch>
  double median_ms(Launch launch) {
    cudaEvent_t begin, end;
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
    for (int i = 0; i < 3; ++i) {
      launch();
    }
    std::vector<float> ms;
    for (int i = 0; i < runs; ++i) {
      check(cudaEventRecord(begin, stream), "cudaEventRecord");
      launch();
      check(cudaEventRecord(end, stream), "cudaEventRecord");
      check(cudaEventSynchronize(end), "cudaEventSynchronize");
      float elapsed = 0;
      check(cudaEventElapsedTime(&elapsed, begin, end), "cudaEventElapsedTime");
      ms.push_back(elapsed);
    }
    (void)cudaEventDestroy(begin);
    (void)cudaEventDestroy(end);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

// One row: bytes read plus bytes written over the median time, and that rate as a fraction of
// the device-to-device copy's rate measured on the same bytes just before.
void row(const char* kernel, const char* shape, double bytes_moved, double ms, double copy_rate) {
  const double rate = bytes_moved / (ms * 1e-3) / 1e9;
  std::printf("%-22s %-28s %10.3f %9.1f %8.2f\n", kernel, shape, ms, rate, rate / copy_rate);
}

void time_kernels(std::size_t bucket_bytes, std::size_t tensors, int runs, cudaStream_t stream,
                  device::batch_workspace& workspace) {
  const std::size_t n = bucket_bytes / sizeof(float);
  const std::size_t per = n / tensors;
  random_bits bits{42};
  std::vector<std::unique_ptr<device_tensor>> grads;
  std::vector<const_tensor_view> sources;
  std::vector<tensor_view> targets;
  for (std::size_t i = 0; i < tensors; ++i) {
    host_tensor h(dtype::float32, per);
    h.randomize(bits);
    grads.push_back(std::make_unique<device_tensor>(dtype::float32, per));
    grads.back()->upload(h);
    sources.push_back(grads.back()->const_view());
    targets.push_back(grads.back()->view());
  }
  const std::size_t total = per * tensors;
  device_tensor buffer(dtype::float32, total), other(dtype::float32, total);
  device_tensor half(dtype::float16, total), brain(dtype::bfloat16, total);
  check(cudaMemset(other.data(), 0, other.bytes()), "cudaMemset");
  timer time{stream, runs};

  const double bytes = static_cast<double>(total * sizeof(float));
  const double copy_ms = time.median_ms([&] {
    check(cudaMemcpyAsync(buffer.data(), other.data(), total * sizeof(float),
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  });
  const double copy_rate = 2 * bytes / (copy_ms * 1e-3) / 1e9;
  char shape[64];
  std::snprintf(shape, sizeof shape, "%zu MiB, %zu tensors", bucket_bytes >> 20, tensors);
  row("cudaMemcpy d2d", shape, 2 * bytes, copy_ms, copy_rate);
  row("pack f32 x0.5", shape, 2 * bytes,
      time.median_ms([&] { device::pack(sources, buffer.view(), 0.5, stream, workspace); }),
      copy_rate);
  row("unpack f32", shape, 2 * bytes,
      time.median_ms([&] { device::unpack(buffer.const_view(), targets, 1.0, stream, workspace); }),
      copy_rate);
  row("pack f32->f16 x0.5", shape, 1.5 * bytes,
      time.median_ms([&] { device::pack(sources, half.view(), 0.5, stream, workspace); }),
      copy_rate);
  row("unpack f16->f32", shape, 1.5 * bytes,
      time.median_ms([&] { device::unpack(half.const_view(), targets, 1.0, stream, workspace); }),
      copy_rate);
  row("scale f32", shape, 2 * bytes,
      time.median_ms([&] { device::scale(buffer.view(), 0.5, stream); }), copy_rate);
  row("cast f32->bf16", shape, 1.5 * bytes,
      time.median_ms([&] { device::cast(buffer.const_view(), brain.view(), stream); }), copy_rate);
  row("reduce-sum f32", shape, 3 * bytes, time.median_ms([&] {
    device::reduce(buffer.view(), other.const_view(), cohort::reduce_op::sum, stream);
  }),
      copy_rate);
}

struct settings {
  std::size_t max_bytes = std::size_t{1} << 30;
  int runs = 20;
  std::uint64_t seed =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
};

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--max-bytes") {
      s.max_bytes = std::stoull(value);
    } else if (flag == "--runs") {
      s.runs = std::stoi(value);
    } else if (flag == "--seed") {
      s.seed = std::stoull(value);
    } else {
      throw std::invalid_argument("unknown flag " + std::string(flag) +
                                  " (known: --max-bytes, --runs, --seed)");
    }
  }
  if (argc % 2 == 0) {
    throw std::invalid_argument("flag " + std::string(argv[argc - 1]) + " has no value");
  }
  return s;
}

} // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv);
  if (cohort::cuda::device_count() == 0) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# device: %s (sm_%d%d), %zu GiB\n", prop.name, prop.major, prop.minor,
              prop.totalGlobalMem >> 30);
  std::printf("# checks: every kernel at every dtype against kernels::host, bit for bit; sizes "
              "from 1 element to %zu MiB; seed %llu\n",
              s.max_bytes >> 20, static_cast<unsigned long long>(s.seed));
  cohort::cuda::stream stream;
  device::batch_workspace workspace;
  random_bits bits{s.seed};
  tally t;
  for (const dtype type : cohort::all_dtypes) {
    const std::size_t size = cohort::size_of(type);
    std::vector<std::size_t> counts{1, 3, 4099, (std::size_t{1} << 20) + 7};
    counts.push_back(s.max_bytes / size);
    for (const std::size_t n : counts) {
      if (n * size > s.max_bytes) {
        continue;
      }
      check_pack_and_unpack(t, type, type, n, bits, stream.get(), workspace);
      check_elementwise(t, type, n, bits, stream.get());
    }
  }
  // The compressed wire: float32 gradients packed into fp16 and bf16 buffers and back.
  for (const dtype wire : {dtype::float16, dtype::bfloat16}) {
    for (const std::size_t n : {std::size_t{4099}, s.max_bytes / sizeof(float)}) {
      check_pack_and_unpack(t, dtype::float32, wire, n, bits, stream.get(), workspace);
    }
  }
  std::printf("checks: %d passed, %d failed\n", t.passed, t.failed);

  std::printf("# speed: median of %d runs (CUDA events); GB/s = (bytes read + bytes written) / "
              "time, 1 GB = 1e9 bytes; vs copy = that rate / cudaMemcpy d2d's rate\n",
              s.runs);
  std::printf("%-22s %-28s %10s %9s %8s\n", "kernel", "bucket", "ms", "GB/s", "vs copy");
  // A small first bucket, a bucket of many small tensors (biases, norms), the default bucket
  // size and a large bucket. (--max-bytes bounds the checks, not these.)
  const std::pair<std::size_t, std::size_t> buckets[] = {{std::size_t{1} << 20, 8},
                                                         {std::size_t{4} << 20, 1000},
                                                         {std::size_t{25} << 20, 16},
                                                         {std::size_t{256} << 20, 64}};
  for (const auto& [bytes, tensors] : buckets) {
    time_kernels(bytes, tensors, s.runs, stream.get(), workspace);
  }
  return t.failed == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu_kernels: %s\n", e.what());
  return 1;
}
