// The packed format: layout arithmetic and the size targets of the issue.
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <type_traits>
#include <vector>

using dropit_test::ceil_div;
using dropit_test::described_bytes;

TEST_CASE("layout sections follow the format description") {
  for (std::size_t n : {0u, 1u, 2u, 31u, 32u, 33u, 63u, 64u, 65u, 1000u, 1024u, 1025u, 1048583u}) {
    for (std::size_t vs : {2u, 4u, 8u}) {
      for (double g : {0.0, 0.1, 0.5, 0.9, 0.95, 0.97, 0.99, 1.0}) {
        const std::size_t k = dropit_test::expected_k(n, g);
        const auto l = dropit::make_layout(n, k, vs);
        CAPTURE(n);
        CAPTURE(vs);
        CAPTURE(k);
        CHECK(l.total_bytes == described_bytes(n, k, vs));
        CHECK(l.values_offset == 0);
        CHECK(l.values_bytes == k * vs);
        if (l.positions != dropit::position_encoding::none) CHECK(l.positions_offset % 16 == 0);
        if (l.positions == dropit::position_encoding::bitmask ||
            l.positions == dropit::position_encoding::elias_fano)
          CHECK(l.block_offsets_offset % 16 == 0);
        if (k == 0 || k == n) {
          CHECK(l.positions == dropit::position_encoding::none);
          CHECK(l.positions_bytes == 0);
        } else if (l.positions == dropit::position_encoding::bitmask) {
          CHECK(l.positions_bytes == ceil_div(n, 32) * 4);
          CHECK(l.block_offsets_bytes == ceil_div(n, 1024) * 4);
          CHECK(l.positions_bytes + l.block_offsets_bytes <= k * 4);
        } else if (l.positions == dropit::position_encoding::elias_fano) {
          const unsigned lb = dropit_test::ef_low_bits_oracle(n, k);
          CHECK(l.low_bits == lb);
          CHECK(l.high_offset == l.positions_offset + ceil_div(k * lb, 64) * 8);
          CHECK(l.positions_bytes ==
                (ceil_div(k * lb, 64) + ceil_div(((n - 1) >> lb) + k, 64)) * 8);
          CHECK(l.block_offsets_bytes == ceil_div(n, 8192) * 4);
        } else {
          CHECK(l.positions == dropit::position_encoding::index32);
          CHECK(l.positions_bytes == k * 4);
          CHECK(k * 4 < ceil_div(n, 32) * 4 + ceil_div(n, 1024) * 4);
        }
        // Sections do not overlap and stay inside the payload.
        CHECK(l.values_bytes <= l.positions_offset);
        CHECK(l.positions_offset + l.positions_bytes <= l.block_offsets_offset);
        CHECK(l.block_offsets_offset + l.block_offsets_bytes == l.total_bytes);
      }
    }
  }
}

TEST_CASE("64-bit indices and offsets only from n = 2^32") {
  const std::size_t below = (std::size_t{1} << 32) - 1;
  const std::size_t at = std::size_t{1} << 32;
  CHECK(dropit::make_layout(below, 10, 4).positions == dropit::position_encoding::index32);
  CHECK(dropit::make_layout(at, 10, 4).positions == dropit::position_encoding::index64);
  CHECK(dropit::make_layout(at, 10, 4).positions_bytes == 80);
  const auto wide_mask = dropit::make_layout(at, at / 2, 4);
  CHECK(wide_mask.positions == dropit::position_encoding::bitmask);
  CHECK(wide_mask.block_offsets_bytes == (at / 1024) * 8);
  CHECK(wide_mask.total_bytes == described_bytes(at, at / 2, 4));
}

TEST_CASE("bytes per input element meet the targets") {
  const std::size_t n = std::size_t{1} << 24;
  auto per_element = [&](double gamma, std::size_t vs) {
    return static_cast<double>(
               dropit::make_layout(n, dropit_test::expected_k(n, gamma), vs).total_bytes) /
           static_cast<double>(n);
  };
  CHECK(per_element(0.9, 4) <= 0.47);     // fp32, gamma 0.9 (DropIT's int32 list: 0.8)
  CHECK(per_element(0.99, 4) <= 0.0515);  // fp32, gamma 0.99
  CHECK(per_element(0.9, 2) <= 0.27);     // fp16, gamma 0.9
  CHECK(per_element(0.0, 4) == 4.0);      // Identity / gamma 0: a dense copy, no positions
}

TEST_CASE("positions within 1.15x their entropy; 8-bit values at 0.17 bytes per element") {
  // Issue 14's targets at n = 2^24: the position section (code + block offsets) against the
  // entropy of the kept set, H(gamma) / 8 bytes per element; the whole payload with a codec.
  const std::size_t n = std::size_t{1} << 24;
  auto entropy_bytes = [](double g) {
    return -(g * std::log2(g) + (1 - g) * std::log2(1 - g)) / 8.0;
  };
  for (double g : {0.9, 0.99}) {
    CAPTURE(g);
    const auto l = dropit::make_layout(n, dropit_test::expected_k(n, g), 4);
    CHECK(l.positions == dropit::position_encoding::elias_fano);
    const double positions =
        static_cast<double>(l.total_bytes - l.positions_offset) / static_cast<double>(n);
    CHECK(positions <= 1.15 * entropy_bytes(g));
    CHECK(positions >= entropy_bytes(g));  // no code beats the entropy: the arithmetic is sane
  }
  for (auto codec : {dropit::value_codec::int8, dropit::value_codec::fp8_e4m3}) {
    const auto mink = dropit::make_layout(n, dropit_test::expected_k(n, 0.9), 4, codec);
    CHECK(static_cast<double>(mink.total_bytes) / static_cast<double>(n) <= 0.17);
    const auto dense = dropit::make_layout(n, n, 4, codec);
    CHECK(static_cast<double>(dense.total_bytes) / static_cast<double>(n) <= 1.02);
  }
}

TEST_CASE("position_choice::no_elias_fano keeps the bitmask and the index list") {
  const std::size_t n = std::size_t{1} << 20;
  for (double g : {0.5, 0.9, 0.99, 0.9999}) {
    CAPTURE(g);
    const std::size_t k = dropit_test::expected_k(n, g);
    const auto l = dropit::make_layout(n, k, 4, dropit::value_codec::exact,
                                       dropit::position_choice::no_elias_fano);
    CHECK(l.positions != dropit::position_encoding::elias_fano);
    CHECK(l.positions == (ceil_div(n, 32) * 4 + ceil_div(n, 1024) * 4 <= k * 4
                              ? dropit::position_encoding::bitmask
                              : dropit::position_encoding::index32));
    CHECK(l.total_bytes >= dropit::make_layout(n, k, 4).total_bytes);
  }
}

TEST_CASE("the smallest position encoding is chosen") {
  // Each encoding's size from the format description; make_layout must pick the least.
  for (std::size_t n : {100u, 1000u, 8192u, 8193u, 70001u, 1048583u}) {
    for (std::size_t k : {std::size_t{1}, std::size_t{3}, n / 1000 + 1, n / 100 + 1, n / 10, n / 5,
                          n / 4, n / 3, n / 2}) {
      if (k == 0 || k >= n) continue;
      CAPTURE(n);
      CAPTURE(k);
      const auto l = dropit::make_layout(n, k, 4);
      const std::size_t got = l.total_bytes;
      CHECK(got == described_bytes(n, k, 4));
      // No other encoding would have been smaller.
      const std::size_t list = (k * 4 + 15) / 16 * 16 + k * 4;
      CHECK(got <= list);
      const std::size_t mask =
          ((k * 4 + 15) / 16 * 16 + ceil_div(n, 32) * 4 + 15) / 16 * 16 + ceil_div(n, 1024) * 4;
      CHECK(got <= mask);
    }
  }
}

TEST_CASE("a packed cache's bytes() meets the same targets") {
  // What a user sees: bytes() of a real pack, not only the layout arithmetic.
  const std::size_t n = std::size_t{1} << 20;
  auto per_element = [&](auto tag, double gamma) {
    using T = typename decltype(tag)::type;
    const std::vector<T> x = dropit_test::normal_values<T>(n, 7);
    dropit::SparseCache<T, dropit::MinK<>> cache{dropit::MinK<>{gamma}};
    cache.pack(dropit::host, std::span<const T>(x));
    return static_cast<double>(cache.bytes()) / static_cast<double>(n);
  };
  CHECK(per_element(std::type_identity<float>{}, 0.9) <= 0.47);
  CHECK(per_element(std::type_identity<float>{}, 0.99) <= 0.0515);
#if DROPIT_HAS_HALF
  CHECK(per_element(std::type_identity<__half>{}, 0.9) <= 0.27);
#endif
}
