// SPDX-License-Identifier: Apache-2.0
// The per-element logic of the batched pack and unpack, run on the host: the same code the
// device kernels run (kernels/pack.cuh calls nothing else).
#define BOOST_TEST_MODULE kernels.batch
#include <cohort/kernels/batch.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/tensor/std.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

using cohort::bfloat16;
using cohort::dtype;
using cohort::float16;
using cohort::kernels::batch_entry;
using cohort::kernels::batch_factor;

namespace {
// Builds the table of `views` as pack.cuh's workspace does: one after the other from 0.
template <class View>
std::vector<batch_entry> table(const std::vector<View>& views) {
  std::vector<batch_entry> entries;
  std::uint64_t begin = 0;
  for (const auto& v : views) {
    entries.push_back({const_cast<void*>(static_cast<const void*>(v.data)), begin, v.type});
    begin += v.count;
  }
  return entries;
}

// What the device kernels do, on the host: the buffer cut into tiles, each tile copied by `lanes`
// workers (a block's threads), every lane in turn. Tiles of 5 elements by 3 lanes cross tensor
// boundaries mid-tile; 64 by 2 take the unrolled loop; one tile by one lane is the plain copy.
struct tiling {
  std::uint64_t tile;
  std::uint64_t lanes;
};
constexpr tiling tilings[] = {{5, 3}, {64, 2}, {1u << 30, 1}};

template <class Wire>
void pack_by_tiles(const std::vector<batch_entry>& entries, std::uint64_t total, Wire* buffer,
                   batch_factor factor, tiling t) {
  for (std::uint64_t first = 0; first < total; first += t.tile) {
    for (std::uint64_t lane = 0; lane < t.lanes; ++lane) {
      cohort::kernels::pack_range(entries.data(), entries.size(), first,
                                  std::min(first + t.tile, total), buffer, factor, lane, t.lanes);
    }
  }
}

template <class Wire>
void unpack_by_tiles(const std::vector<batch_entry>& entries, std::uint64_t total,
                     const Wire* buffer, batch_factor factor, tiling t) {
  for (std::uint64_t first = 0; first < total; first += t.tile) {
    for (std::uint64_t lane = 0; lane < t.lanes; ++lane) {
      cohort::kernels::unpack_range(entries.data(), entries.size(), first,
                                    std::min(first + t.tile, total), buffer, factor, lane, t.lanes);
    }
  }
}
} // namespace

BOOST_AUTO_TEST_CASE(locate_finds_the_tensor_of_every_element_and_skips_empty_ones) {
  // Tensors of 3, 0, 1, 0, 0 and 5 elements.
  const std::vector<batch_entry> entries{
      {nullptr, 0, dtype::float32}, {nullptr, 3, dtype::float32}, {nullptr, 3, dtype::float32},
      {nullptr, 4, dtype::float32}, {nullptr, 4, dtype::float32}, {nullptr, 4, dtype::float32}};
  const std::size_t expected[] = {0, 0, 0, 2, 5, 5, 5, 5, 5};
  for (std::uint64_t i = 0; i < 9; ++i) {
    BOOST_TEST(cohort::kernels::locate(entries.data(), entries.size(), i) == expected[i]);
  }
  BOOST_TEST(cohort::kernels::locate(entries.data(), 1, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(offsets_beyond_2_to_the_31_are_exact) {
  // Three tensors whose buffer positions lie beyond int32 (ChainerMN's limit) and uint32: the
  // table holds only offsets, so no memory of that size is needed to check the arithmetic.
  std::vector<float> a{1.0f, 2.0f};
  std::vector<double> b{3.0, 4.0, 5.0};
  std::vector<float16> c{float16(6.0f)};
  const std::uint64_t two_31 = std::uint64_t{1} << 31;
  const std::uint64_t beyond_32 = (std::uint64_t{1} << 32) + 7;
  const std::vector<batch_entry> entries{{a.data(), two_31 - 2, dtype::float32},
                                         {b.data(), two_31, dtype::float64},
                                         {c.data(), beyond_32, dtype::float16}};
  const batch_factor one{};
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, two_31 - 1) == 0u);
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, two_31 + 2) == 1u);
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, beyond_32) == 2u);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[0], two_31 - 1, one) == 2.0f);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[1], two_31 + 2, one) == 5.0f);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[2], beyond_32, one) == 6.0f);
  cohort::kernels::unpack_value<float>(entries[1], two_31 + 1, 40.0f, {0.5f, 0.5});
  BOOST_TEST(b[1] == 20.0);
}

BOOST_AUTO_TEST_CASE(batched_pack_matches_the_host_pack_for_mixed_sizes_and_dtypes) {
  std::vector<float> f32{1.5f, -2.25f, 3.0f};
  std::vector<double> empty;
  std::vector<float16> f16(7);
  std::vector<bfloat16> b16(1, bfloat16(-0.5f));
  std::vector<std::int32_t> i32(33);
  std::vector<std::uint8_t> u8{250};
  for (std::size_t i = 0; i < f16.size(); ++i) {
    f16[i] = float16(static_cast<float>(i) / 4);
  }
  for (std::size_t i = 0; i < i32.size(); ++i) {
    i32[i] = static_cast<std::int32_t>(i) - 16;
  }
  const std::vector<cohort::const_tensor_view> sources{
      cohort::make_const_view(f32), cohort::make_const_view(empty), cohort::make_const_view(f16),
      cohort::make_const_view(b16), cohort::make_const_view(i32),   cohort::make_const_view(u8)};
  const auto entries = table(sources);
  const std::size_t total = cohort::kernels::host::packed_count(sources);

  for (const tiling t : tilings) {
    for (const double factor : {1.0, 0.25}) {
      // Every wire dtype the reducers use: the kernel is instantiated for each.
      std::vector<float> by_kernel(total, -1.0f), by_host(total);
      pack_by_tiles(entries, total, by_kernel.data(), {static_cast<float>(factor), factor}, t);
      cohort::kernels::host::pack(sources, cohort::make_view(by_host), factor);
      BOOST_TEST(by_kernel == by_host, boost::test_tools::per_element());

      std::vector<float16> half_kernel(total), half_host(total);
      pack_by_tiles(entries, total, half_kernel.data(), {static_cast<float>(factor), factor}, t);
      cohort::kernels::host::pack(sources, cohort::make_view(half_host), factor);
      for (std::size_t i = 0; i < total; ++i) {
        BOOST_TEST_REQUIRE(half_kernel[i].bits() == half_host[i].bits(), "element " << i);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(batched_unpack_round_trips) {
  std::vector<double> f64{0.1, 0.2, 0.3, 0.4};
  std::vector<std::int64_t> i64{-3, 9};
  std::vector<bfloat16> b16{bfloat16(2.0f)};
  const std::vector<cohort::tensor_view> targets{cohort::make_view(f64), cohort::make_view(i64),
                                                 cohort::make_view(b16)};
  const auto entries = table(targets);
  for (const tiling t : tilings) {
    f64 = {0.1, 0.2, 0.3, 0.4}; // (the last round trip left them rounded)
    std::vector<double> buffer(7, -1.0);
    pack_by_tiles(entries, buffer.size(), buffer.data(), {}, t);
    BOOST_TEST(buffer == (std::vector<double>{0.1, 0.2, 0.3, 0.4, -3, 9, 2}),
               boost::test_tools::per_element());
    for (auto& x : buffer) {
      x *= 3;
    }
    unpack_by_tiles(entries, buffer.size(), buffer.data(), {1.0f / 3, 1.0 / 3}, t);
    BOOST_TEST(f64[2] == 0.3, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(i64 == (std::vector<std::int64_t>{-3, 9}), boost::test_tools::per_element());
    BOOST_TEST(static_cast<float>(b16[0]) == 2.0f);
  }
}

BOOST_AUTO_TEST_CASE(tiles_and_lanes_write_every_element_once_across_many_tensors) {
  // 40 tensors of up to 39 elements, empty ones first, last and in runs between (every fourth,
  // and the 9th to 11th), packed by every tiling: each buffer element is its own index, so a
  // missed or doubled element shows.
  std::vector<std::vector<std::int32_t>> tensors(40);
  std::vector<cohort::tensor_view> views;
  std::int32_t next = 0;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const bool empty = k % 4 == 0 || (k >= 9 && k <= 11) || k + 1 == tensors.size();
    tensors[k].resize(empty ? 0 : (k * 7) % 40);
    for (auto& x : tensors[k]) {
      x = next++;
    }
    views.push_back(cohort::make_view(tensors[k]));
  }
  const auto entries = table(views);
  for (const tiling t :
       {tiling{1, 1}, tiling{3, 4}, tiling{7, 2}, tiling{100, 8}, tiling{1000, 3}}) {
    std::vector<std::int32_t> buffer(static_cast<std::size_t>(next), -1);
    pack_by_tiles(entries, buffer.size(), buffer.data(), {}, t);
    for (std::int32_t i = 0; i < next; ++i) {
      BOOST_TEST_REQUIRE(buffer[static_cast<std::size_t>(i)] == i, "element " << i);
    }
    for (auto& x : buffer) {
      x = -x;
    }
    unpack_by_tiles(entries, buffer.size(), buffer.data(), {}, t);
    std::int32_t expected = 0;
    for (const auto& tensor : tensors) {
      for (const std::int32_t x : tensor) {
        BOOST_TEST_REQUIRE(x == -expected, "element " << expected);
        ++expected;
      }
    }
    for (auto& tensor : tensors) { // (the next tiling packs the originals again)
      for (auto& x : tensor) {
        x = -x;
      }
    }
  }
}
