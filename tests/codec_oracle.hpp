// The value codecs' rules (codec.hpp's table), written again from their statement without the
// library's code: chunk absmax and scale, int8 rounding to nearest-even or stochastically from
// splitmix64 draws, and e4m3 by a nearest-value search over the 256 codes.
#pragma once

#include "test_support.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace dropit_test {

/// The value of an e4m3 code, from the format's definition (bias 7, 3 mantissa bits, subnormals
/// m x 2^-9, S.1111.111 NaN).
inline double oracle_e4m3_value(unsigned code) {
  const int e = static_cast<int>((code >> 3) & 15u), m = static_cast<int>(code & 7u);
  const double sign = (code & 0x80u) != 0 ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::copysign(std::numeric_limits<double>::quiet_NaN(), sign);
  if (e == 0) return sign * std::ldexp(m, -9);
  return sign * std::ldexp(8 + m, e - 10);
}

/// The e4m3 code nearest to x (ties: the even code), beyond 448 the largest, NaN and infinities
/// the NaN code; the code keeps x's sign (so -0 and tiny negatives give 0x80).
inline std::uint8_t oracle_e4m3_code(float x) {
  const bool negative = std::signbit(x);
  if (!std::isfinite(x)) return negative ? 0xff : 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  unsigned best = 0;
  for (unsigned c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(oracle_e4m3_value(c) - a),
                 db = std::fabs(oracle_e4m3_value(best) - a);
    if (d < db || (d == db && (c & 1u) == 0)) best = c;
  }
  return static_cast<std::uint8_t>(best | (negative ? 0x80u : 0u));
}

/// splitmix64's finaliser, as published.
inline std::uint64_t oracle_mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A quantized codec's section contents: one code per value, one scale per 1024 values.
struct oracle_coded {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};

/// Encodes values by codec.hpp's table: `fp8` e4m3 (else int8), int8 `stochastic` from `seed`.
template <class T>
oracle_coded oracle_encode(const std::vector<T>& values, bool fp8, bool stochastic = false,
                           std::uint64_t seed = 0) {
  oracle_coded out;
  const float range = fp8 ? 448.0f : 127.0f;
  for (std::size_t begin = 0; begin < values.size(); begin += 1024) {
    const std::size_t end = std::min(values.size(), begin + 1024);
    float a = 0.0f;
    for (std::size_t i = begin; i < end; ++i) {
      const float v = static_cast<float>(to_double(values[i]));
      if (std::isfinite(v)) a = std::max(a, std::fabs(v));
    }
    const bool zero = a < 0x1p-100f;
    out.scales.push_back(zero ? 0.0f : a / range);
    const float inv = zero ? 0.0f : range / a;
    for (std::size_t i = begin; i < end; ++i) {
      const float v = static_cast<float>(to_double(values[i]));
      if (!std::isfinite(v)) {
        out.codes.push_back(fp8 ? (std::signbit(v) ? 0xff : 0x7f) : 0x80);
        continue;
      }
      const float q = v * inv;
      if (fp8) {
        out.codes.push_back(oracle_e4m3_code(q));
        continue;
      }
      long r;
      if (stochastic) {
        const std::uint64_t h = oracle_mix64(oracle_mix64(seed) + i * 0x9e3779b97f4a7c15ull);
        r = static_cast<long>(
            std::floor(static_cast<double>(q) + static_cast<double>(h >> 40) / 16777216.0));
      } else {
        r = std::lrint(q);  // the default rounding mode: nearest, ties to even
      }
      r = std::clamp(r, -127L, 127L);
      out.codes.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(r)));
    }
  }
  return out;
}

/// The values a payload encoded as `coded` restores: code x scale in float, then T.
template <class T>
std::vector<T> oracle_decode(const oracle_coded& coded, bool fp8) {
  std::vector<T> out;
  for (std::size_t i = 0; i < coded.codes.size(); ++i) {
    const float s = coded.scales[i / 1024];
    float v;
    if (fp8) {
      v = static_cast<float>(oracle_e4m3_value(coded.codes[i])) * s;
    } else {
      const auto c = static_cast<std::int8_t>(coded.codes[i]);
      v = c == -128 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(c) * s;
    }
    if constexpr (std::is_same_v<T, double>) {
      out.push_back(static_cast<double>(v));
    } else {
      out.push_back(static_cast<T>(v));
    }
  }
  return out;
}

/// The dense tensor a coded payload restores: the decoded kept values in place, +0 elsewhere.
template <class T>
std::vector<T> oracle_coded_dense(std::span<const T> x, const std::vector<std::size_t>& kept,
                                  bool fp8, bool stochastic = false, std::uint64_t seed = 0) {
  std::vector<T> values;
  for (std::size_t i : kept)
    values.push_back(x[i]);
  const auto decoded = oracle_decode<T>(oracle_encode(values, fp8, stochastic, seed), fp8);
  std::vector<T> out(x.size(), from_double<T>(0.0));
  for (std::size_t j = 0; j < kept.size(); ++j)
    out[kept[j]] = decoded[j];
  return out;
}

}  // namespace dropit_test
