// SPDX-License-Identifier: Apache-2.0
#pragma once

// MNIST for the examples: the four IDX files when there is a directory to read, otherwise a small
// synthetic MNIST-shaped set made up from a seed (the same on every machine). Shared by
// mnist_mlp (host) and gpu_mlp (device).

#include <boost/serialization/array.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace mnist_data {

inline constexpr std::size_t image_side = 28;
inline constexpr std::size_t image_pixels = image_side * image_side;
inline constexpr std::size_t classes = 10;

// ---- data --------------------------------------------------------------------------------------

struct example {
  std::array<float, image_pixels> pixels{};
  std::uint8_t label = 0;

  // scatter_dataset sends examples through Boost.Serialization. (clang-format would take
  // "archive & pixels" for the declaration of a reference.)
  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    // clang-format off
    archive & pixels;
    archive & label;
    // clang-format on
  }
};

using dataset = std::vector<example>;

struct mnist {
  dataset train;
  dataset test;
};

// Our own draws rather than std::uniform_real_distribution, whose output is
// implementation-defined: the same seed gives the same draws with any standard library.
inline float uniform(std::mt19937_64& engine) {
  return static_cast<float>(engine() >> 40) * 0x1p-24f; // [0, 1), 24 random bits
}
inline float uniform(std::mt19937_64& engine, float low, float high) {
  return low + (high - low) * uniform(engine);
}
inline std::size_t uniform_index(std::mt19937_64& engine, std::size_t n) {
  return static_cast<std::size_t>(engine() % n); // the modulo bias is negligible for n this small
}

// Ten class prototypes, each a few soft blobs, and examples that are a prototype shifted by up to
// two pixels, dimmed, noisy, and in a quarter of the cases blended with another class's prototype
// at 20-40%. 5% of the labels are wrong, as in real datasets, which caps the reachable accuracy
// near 95%: learnable, but not trivially perfect. Wrong labels cap it rather than blends too close
// to call: every model misses a wrong label, but two models split the close calls differently, and
// the 1- and 2-rank runs would then differ by more than their training does.
inline mnist make_synthetic(std::size_t train_size, std::size_t test_size, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::array<std::array<float, image_pixels>, classes> prototypes{};
  for (auto& prototype : prototypes) {
    for (int blob = 0; blob < 4; ++blob) {
      const float cx = uniform(engine, 5.0f, 22.0f);
      const float cy = uniform(engine, 5.0f, 22.0f);
      const float sigma = uniform(engine, 1.5f, 3.0f);
      for (std::size_t y = 0; y < image_side; ++y) {
        for (std::size_t x = 0; x < image_side; ++x) {
          const float dx = static_cast<float>(x) - cx;
          const float dy = static_cast<float>(y) - cy;
          float& pixel = prototype[y * image_side + x];
          pixel = std::max(pixel, std::exp(-(dx * dx + dy * dy) / (2.0f * sigma * sigma)));
        }
      }
    }
  }
  const auto shifted = [&](std::size_t c, int sx, int sy, std::size_t x, std::size_t y) {
    const auto from_x = static_cast<long>(x) - sx;
    const auto from_y = static_cast<long>(y) - sy;
    const auto side = static_cast<long>(image_side);
    if (from_x < 0 || from_y < 0 || from_x >= side || from_y >= side) {
      return 0.0f;
    }
    return prototypes[c][static_cast<std::size_t>(from_y * side + from_x)];
  };
  const auto make = [&](std::size_t n) {
    dataset examples(n);
    for (auto& e : examples) {
      e.label = static_cast<std::uint8_t>(uniform_index(engine, classes));
      const std::size_t other = (e.label + 1 + uniform_index(engine, classes - 1)) % classes;
      const float blend = uniform(engine) < 0.25f ? uniform(engine, 0.2f, 0.4f) : 0.0f;
      const float brightness = uniform(engine, 0.6f, 1.0f);
      const int sx = static_cast<int>(uniform_index(engine, 5)) - 2;
      const int sy = static_cast<int>(uniform_index(engine, 5)) - 2;
      for (std::size_t y = 0; y < image_side; ++y) {
        for (std::size_t x = 0; x < image_side; ++x) {
          const float clean = (1.0f - blend) * shifted(e.label, sx, sy, x, y) +
                              blend * shifted(other, sx, sy, x, y);
          const float noisy = brightness * clean + uniform(engine, -0.2f, 0.2f);
          e.pixels[y * image_side + x] = std::clamp(noisy, 0.0f, 1.0f);
        }
      }
      if (uniform(engine) < 0.05f) {
        e.label =
            static_cast<std::uint8_t>((e.label + 1 + uniform_index(engine, classes - 1)) % classes);
      }
    }
    return examples;
  };
  mnist data;
  data.train = make(train_size);
  data.test = make(test_size);
  return data;
}

// MNIST's IDX format: a big-endian magic number (0x0000, the type 0x08 for unsigned bytes, the
// number of dimensions), one big-endian 32-bit size per dimension, then the bytes.
class idx_reader {
public:
  explicit idx_reader(std::filesystem::path file)
      : file_(std::move(file))
      , in_(file_, std::ios::binary) {
    if (!in_) {
      fail("cannot be opened (--data must name the directory holding the four uncompressed MNIST "
           "IDX files)");
    }
  }

  // Reads the magic number and the dimensions, checking them against what the caller expects.
  std::vector<std::uint32_t> header(std::uint32_t magic, const char* kind) {
    const std::uint32_t found = read_u32("magic number");
    if ((found >> 16) == 0x1f8b) {
      fail("is gzip-compressed: decompress it first (gunzip)");
    }
    if (found != magic) {
      fail("has magic number " + std::to_string(found) + " where " + std::to_string(magic) +
           " (an IDX file of " + kind + ") was expected");
    }
    std::vector<std::uint32_t> dimensions(magic & 0xff);
    for (auto& d : dimensions) {
      d = read_u32("dimensions");
    }
    return dimensions;
  }

  std::vector<std::uint8_t> bytes(std::size_t count) {
    std::vector<std::uint8_t> data(count);
    in_.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(count));
    if (static_cast<std::size_t>(in_.gcount()) != count) {
      fail("is truncated: " + std::to_string(count) +
           " bytes of data should follow its header, but only " + std::to_string(in_.gcount()) +
           " do");
    }
    return data;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("MNIST file " + file_.string() + " " + what);
  }

private:
  std::uint32_t read_u32(const char* field) {
    std::array<unsigned char, 4> b{};
    in_.read(reinterpret_cast<char*>(b.data()), b.size());
    if (in_.gcount() != 4) {
      fail(std::string("is truncated: it ends inside its header (") + field + ")");
    }
    return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
  }

  std::filesystem::path file_;
  std::ifstream in_;
};

inline dataset read_mnist_split(const std::filesystem::path& dir, const std::string& prefix,
                                std::optional<std::size_t> limit) {
  idx_reader images(dir / (prefix + "-images-idx3-ubyte"));
  const auto shape = images.header(2051, "images");
  if (shape[1] != image_side || shape[2] != image_side) {
    images.fail("holds " + std::to_string(shape[1]) + "x" + std::to_string(shape[2]) +
                " images where 28x28 were expected");
  }
  idx_reader labels(dir / (prefix + "-labels-idx1-ubyte"));
  const auto count = labels.header(2049, "labels")[0];
  if (count != shape[0]) {
    labels.fail("holds " + std::to_string(count) + " labels but its images file holds " +
                std::to_string(shape[0]) + " images");
  }
  const std::size_t n = std::min<std::size_t>(count, limit.value_or(count));
  const auto pixels = images.bytes(n * image_pixels);
  const auto label_bytes = labels.bytes(n);
  dataset examples(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (label_bytes[i] >= classes) {
      labels.fail("holds label " + std::to_string(label_bytes[i]) + " at index " +
                  std::to_string(i) + "; labels must be 0 to 9");
    }
    examples[i].label = label_bytes[i];
    for (std::size_t p = 0; p < image_pixels; ++p) {
      examples[i].pixels[p] = static_cast<float>(pixels[i * image_pixels + p]) / 255.0f;
    }
  }
  return examples;
}

} // namespace mnist_data
