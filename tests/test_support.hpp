// Shared helpers of the test suite: element conversions, input generators, and the brute-force
// selection oracle (an independent statement of DropIT's rule, written without the library's keys).
#pragma once

#include <dropit/dropit.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace dropit_test {

/// The element types every templated case runs over (the half types when the CUDA toolkit's
/// headers are there: the host build must also work without them).
#if DROPIT_HAS_HALF
#define DROPIT_TEST_TYPES float, double, __half, __nv_bfloat16
#else
#define DROPIT_TEST_TYPES float, double
#endif

template <class T>
double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double to_double<double>(double v) {
  return v;
}

template <class T>
T from_double(double v) {
  return static_cast<T>(static_cast<float>(v));
}
template <>
inline double from_double<double>(double v) {
  return v;
}

/// The element with the given bit pattern.
template <class T>
T from_bits(std::uint64_t bits) {
  if constexpr (sizeof(T) == 2) return std::bit_cast<T>(static_cast<std::uint16_t>(bits));
  if constexpr (sizeof(T) == 4) return std::bit_cast<T>(static_cast<std::uint32_t>(bits));
  if constexpr (sizeof(T) == 8) return std::bit_cast<T>(bits);
}

/// The smallest positive denormal and the smallest positive normal of T.
template <class T>
T smallest_denormal() {
  return from_bits<T>(1);
}
template <class T>
T smallest_normal() {
  if constexpr (std::is_same_v<T, float>) return from_bits<T>(0x00800000u);
  if constexpr (std::is_same_v<T, double>) return from_bits<T>(0x0010000000000000ull);
#if DROPIT_HAS_HALF
  if constexpr (std::is_same_v<T, __half>) return from_bits<T>(0x0400u);
  return from_bits<T>(0x0080u);  // bfloat16
#endif
}

/// Bitwise equality of two arrays of T (so -0 vs +0 and NaN payloads count).
template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// A name for messages.
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, double>) return "double";
#if DROPIT_HAS_HALF
  if constexpr (std::is_same_v<T, __half>) return "__half";
  return "__nv_bfloat16";
#endif
}

/// Normal(0, 1) values, rounded to T (so half types carry many exact ties).
template <class T>
std::vector<T> normal_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist;
  std::vector<T> x(n);
  for (auto& v : x)
    v = from_double<T>(dist(gen));
  return x;
}

/// DropIT's MinK rule, brute force: stable-sort the indices by |x| descending (NaN above +Inf,
/// -0 equal to +0), keep the first k; returns the kept indices in ascending order.
template <class T>
std::vector<std::size_t> oracle_mink(std::span<const T> x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  auto rank = [&](std::size_t i) {
    const double v = to_double(x[i]);
    return std::pair<int, double>{std::isnan(v) ? 1 : 0, std::isnan(v) ? 0.0 : std::fabs(v)};
  };
  // Ties by index, ascending: a stable sort written out (libstdc++'s std::stable_sort warns
  // under clang in C++20 through its deprecated get_temporary_buffer).
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto ra = rank(a), rb = rank(b);
    return ra > rb || (ra == rb && a < b);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// The generic rule for any policy, brute force: sort by the policy's key descending, ties by
/// index.
template <class T, class P>
std::vector<std::size_t> oracle_by_key(const P& policy, std::span<const T> x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto ka = policy.key(x[a], a), kb = policy.key(x[b], b);
    return ka > kb || (ka == kb && a < b);  // ties by index, as a stable sort
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// The dense tensor a restore must produce: x at the kept indices, +0 elsewhere.
template <class T>
std::vector<T> dense_from(std::span<const T> x, const std::vector<std::size_t>& kept) {
  std::vector<T> out(x.size(), from_double<T>(0.0));
  for (std::size_t i : kept)
    out[i] = x[i];
  return out;
}

/// k by the formula, computed independently of the library.
/// Indices where a restored tensor is non-zero (inputs must be non-zero everywhere).
template <class T>
std::vector<std::size_t> nonzero_positions(const std::vector<T>& v) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (to_double(v[i]) != 0.0) idx.push_back(i);
  }
  return idx;
}

inline std::size_t expected_k(std::size_t n, double gamma) {
  return n - static_cast<std::size_t>(std::floor(static_cast<double>(n) * gamma + 1e-6));
}

inline std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

/// The payload size the format description (README, format.hpp) gives, computed from scratch:
/// values, then bitmask + block offsets or an index list (whichever is smaller), each section
/// starting on a 16-byte boundary; nothing but values when k = 0 or k = n.
/// Elias-Fano's low bits as format.hpp describes them: the largest L <= 13 with k 2^L <= n.
inline unsigned ef_low_bits_oracle(std::size_t n, std::size_t k) {
  unsigned l = 0;
  while (l < 13 && static_cast<double>(k) * std::ldexp(1.0, static_cast<int>(l) + 1) <=
                       static_cast<double>(n))
    ++l;
  return l;
}

inline std::size_t described_bytes(std::size_t n, std::size_t k, std::size_t vsize) {
  auto up16 = [](std::size_t b) { return (b + 15) / 16 * 16; };
  const std::size_t values = k * vsize;
  if (k == 0 || k == n) return values;
  const std::size_t isize = n >= (std::size_t{1} << 32) ? 8 : 4;
  const std::size_t mask = ceil_div(n, 32) * 4 + ceil_div(n, 1024) * isize;
  const std::size_t list = k * isize;
  const unsigned l = ef_low_bits_oracle(n, k);
  const std::size_t ef_code = (ceil_div(k * l, 64) + ceil_div(((n - 1) >> l) + k, 64)) * 8;
  const std::size_t ef = up16(up16(values) + ef_code) + ceil_div(n, 8192) * isize;
  const std::size_t mask_total =
      up16(up16(values) + ceil_div(n, 32) * 4) + ceil_div(n, 1024) * isize;
  if (ef < mask_total && ef < up16(values) + list) return ef;
  if (mask <= list) return mask_total;
  return up16(values) + list;
}

/// The Elias-Fano code of ascending kept indices, bit by bit as format.hpp describes it: low
/// array, high array (64-bit words) and the kept count before each block of 8192 elements.
struct ef_oracle_code {
  unsigned l = 0;
  std::vector<std::uint64_t> low, high;
  std::vector<std::size_t> block_counts;
};
inline ef_oracle_code elias_fano_oracle(std::size_t n, const std::vector<std::size_t>& kept) {
  ef_oracle_code c;
  const std::size_t k = kept.size();
  c.l = ef_low_bits_oracle(n, k);
  std::vector<bool> low(k * c.l), high(((n - 1) >> c.l) + k);
  for (std::size_t j = 0; j < k; ++j) {
    for (unsigned b = 0; b < c.l; ++b)
      low[j * c.l + b] = (kept[j] >> b & 1u) != 0;
    high.at((kept[j] >> c.l) + j) = true;
  }
  auto words = [](const std::vector<bool>& bits) {
    std::vector<std::uint64_t> w(ceil_div(bits.size(), 64), 0);
    for (std::size_t i = 0; i < bits.size(); ++i)
      if (bits[i]) w[i / 64] |= std::uint64_t{1} << (i % 64);
    return w;
  };
  c.low = words(low);
  c.high = words(high);
  for (std::size_t b = 0; b < ceil_div(n, 8192); ++b)
    c.block_counts.push_back(static_cast<std::size_t>(
        std::lower_bound(kept.begin(), kept.end(), b * 8192) - kept.begin()));
  return c;
}

}  // namespace dropit_test
