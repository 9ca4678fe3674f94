/**
 * @file steps.hpp
 * @brief What pack and restore share across executors, as plain functions that compile for host
 * and device: the selection rule (`threshold`: the k largest keys, ties lowest index first), the
 * radix-select state and digit width, the restored value, and the expansion bodies.
 *
 * Both executors take the radix state, `restore_value` and `expand_index_range` from here; the
 * host applies `threshold`, the device the equivalent (threshold key, ties kept) pair of its
 * look-back (detail/cuda/selection.hpp). The selection's steps and decisions are in
 * detail/selection.hpp, shared by both.
 */
#pragma once

#include <dropit/detail/config.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/format.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace dropit::detail {

/// The key type a policy gives element type T.
template <class P, class T>
using key_type_t = decltype(std::declval<const P&>().key(std::declval<T>(), std::size_t{}));

/**
 * The exact selection: element i is kept when its key is above `t`, or equals `t` and i < cut
 * (the lowest-indexed ties first). `t` is the k-th largest key; `cut` is n when every tie is kept.
 */
template <class Key>
struct threshold {
  Key t{};              ///< the k-th largest key
  std::size_t cut = 0;  ///< ties at indices below cut are kept

  [[nodiscard]] DROPIT_HD bool keeps(Key key, std::size_t i) const noexcept {
    return key > t || (key == t && i < cut);
  }
};

/// Digit width of the radix select: 2048-bin histograms fit a core's L1 and a block's shared
/// memory.
inline constexpr int radix_bits = 11;

/**
 * Most-significant-digit-first radix select of the k-th largest key. Each pass histograms
 * `digit(key)` over the keys that `match` the digits fixed so far; `advance` picks the bucket that
 * holds the sought rank. After ceil(bits / radix_bits) passes, `prefix` is the k-th largest key.
 */
template <class Key>
struct radix_state {
  static constexpr int key_bits = static_cast<int>(sizeof(Key) * 8);

  Key prefix{};           ///< the digits fixed so far, in place
  Key mask{};             ///< which bits of prefix are fixed
  int shift = key_bits;   ///< number of low bits not yet fixed
  std::size_t rank = 0;   ///< 1-based rank of the sought key among the matching keys, from the top
  std::size_t above = 0;  ///< keys known to be larger than every matching key
  std::size_t in_bucket =
      0;  ///< matching keys after the last pass (keys equal to prefix when done)

  /// Starts a search for the k-th largest key (1 <= k).
  DROPIT_HD explicit radix_state(std::size_t k) noexcept : rank(k) {}

  [[nodiscard]] DROPIT_HD bool done() const noexcept { return shift == 0; }
  [[nodiscard]] DROPIT_HD int digit_bits() const noexcept {
    return shift < radix_bits ? shift : radix_bits;
  }
  [[nodiscard]] DROPIT_HD unsigned bins() const noexcept { return 1u << digit_bits(); }
  [[nodiscard]] DROPIT_HD bool matches(Key key) const noexcept {
    return static_cast<Key>(key & mask) == prefix;
  }
  [[nodiscard]] DROPIT_HD unsigned digit(Key key) const noexcept {
    return static_cast<unsigned>(key >> (shift - digit_bits())) & (bins() - 1);
  }

  /// Consumes the histogram (`bins()` counts) of this pass and fixes the next digit.
  template <class Count>
  DROPIT_HD void advance(const Count* hist) noexcept {
    const int b = digit_bits();
    const unsigned top = bins() - 1;
    unsigned d = top;
    while (d > 0 && static_cast<std::size_t>(hist[d]) < rank) {
      rank -= static_cast<std::size_t>(hist[d]);
      above += static_cast<std::size_t>(hist[d]);
      --d;
    }
    shift -= b;
    prefix = static_cast<Key>(prefix | static_cast<Key>(static_cast<Key>(d) << shift));
    mask = static_cast<Key>(mask | static_cast<Key>(static_cast<Key>(top) << shift));
    in_bucket = static_cast<std::size_t>(hist[d]);
  }
};

/// Restored value: as stored, or times the policy's restore scale.
template <class T>
struct restore_value {
  double scale = 1.0;
  bool apply = false;
  [[nodiscard]] DROPIT_HD T operator()(T v) const noexcept { return apply ? scaled(v, scale) : v; }
};

/// Writes the 32 (fewer in the last word) outputs of word w: kept values from `values` (the word's
/// first kept value), zeros elsewhere.
template <class T>
DROPIT_HD void expand_word(const T* values, std::uint32_t m, std::size_t w, std::size_t n, T* out,
                           restore_value<T> op) noexcept {
  const std::size_t base = w * word_elements;
  const std::size_t count = n - base < word_elements ? n - base : word_elements;
  for (std::size_t j = 0; j < count; ++j)
    out[base + j] = T{};
  for (; m != 0; m &= m - 1)
    out[base + lowest_bit32(m)] = op(*values++);
}

/// Restores outputs [begin, end) from an index list: `first` is the first list entry >= begin.
template <class T, class Index>
DROPIT_HD void expand_index_range(const T* values, const Index* index, std::size_t k,
                                  std::size_t first, std::size_t begin, std::size_t end, T* out,
                                  restore_value<T> op) noexcept {
  for (std::size_t i = begin; i < end; ++i)
    out[i] = T{};
  for (std::size_t j = first; j < k && static_cast<std::size_t>(index[j]) < end; ++j) {
    out[index[j]] = op(values[j]);
  }
}

/// One past the last element of block b (of `block_elements`) of an n-element tensor.
[[nodiscard]] DROPIT_HD inline std::size_t block_end(std::size_t b, std::size_t n) noexcept {
  const std::size_t end = (b + 1) * block_elements;
  return end < n ? end : n;
}

/// Restores block b from the bitmask encoding: `at` is the block's offset into the values.
template <class T>
DROPIT_HD void expand_block_bitmask(const T* values, const std::uint32_t* words, std::size_t n,
                                    std::size_t b, std::size_t at, T* out,
                                    restore_value<T> op) noexcept {
  const std::size_t w0 = b * (block_elements / word_elements);
  const std::size_t w1 = (block_end(b, n) + word_elements - 1) / word_elements;
  for (std::size_t w = w0; w < w1; ++w) {
    expand_word(values + at, words[w], w, n, out, op);
    at += static_cast<std::size_t>(popcount32(words[w]));
  }
}

/**
 * The bucket a radix pass picks, stated through suffix sums so that a parallel scan can find it:
 * with `from_d` = matching keys whose digit is >= d and `above_d` = those whose digit is > d,
 * digit d is picked iff above_d < rank and (from_d >= rank or d == 0). Exactly one digit
 * qualifies; it is the one `radix_state::advance` stops at.
 */
[[nodiscard]] DROPIT_HD inline bool radix_picks(std::size_t from_d, std::size_t above_d,
                                                std::size_t rank, unsigned d) noexcept {
  return above_d < rank && (from_d >= rank || d == 0);
}

/// Zeroes the padding between the sections of a host-accessible payload.
inline void zero_padding(std::byte* base, const packed_layout& l) noexcept {
  const padding_gaps g = padding_of(l);
  for (int i = 0; i < padding_gaps::count; ++i) {
    for (std::size_t b = g.begin[i]; b < g.end[i]; ++b)
      base[b] = std::byte{0};
  }
}

}  // namespace dropit::detail
