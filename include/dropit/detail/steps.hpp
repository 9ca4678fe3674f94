/**
 * @file steps.hpp
 * @brief Step bodies of pack and restore as plain functions that compile for host and device: the
 * selection rule (`threshold`), the radix-select state, per-word and per-block mark + compact, and
 * expand.
 *
 * What is shared today, and what is not: both executors take the selection rule, the radix
 * state and digit width, `restore_value` and `expand_index_range` from here. The block
 * compaction and expansion bodies are used by the CUDA executor's portable path; the host
 * executor uses the per-word bodies inside its own SIMD classify/compact (`detail/host/`), and the
 * CUDA executor's fast path has its own kernels (`detail/cuda/kernels.cuh`). The three selections
 * are separate implementations of one rule, held to the same bytes by tests (host vs emulated
 * device, byte for byte).
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

/// Bit j of word w is set when element 32 w + j (< n) is kept.
template <class P, class T, class Key>
[[nodiscard]] DROPIT_HD std::uint32_t mark_word(const P& policy, const T* x, std::size_t n,
                                                std::size_t w, threshold<Key> th) noexcept {
  const std::size_t base = w * word_elements;
  std::uint32_t m = 0;
  if (base + word_elements <= n) {
    for (unsigned j = 0; j < word_elements; ++j) {
      const std::size_t i = base + j;
      m |= static_cast<std::uint32_t>(th.keeps(policy.key(x[i], i), i)) << j;
    }
  } else {
    for (std::size_t i = base; i < n; ++i) {
      m |= static_cast<std::uint32_t>(th.keeps(policy.key(x[i], i), i)) << (i - base);
    }
  }
  return m;
}

/// Copies the kept values of word w (mask m) to `values`, in index order.
template <class T>
DROPIT_HD void compact_word(const T* x, std::size_t w, std::uint32_t m, T* values) noexcept {
  const T* src = x + w * word_elements;
  for (; m != 0; m &= m - 1)
    *values++ = src[lowest_bit32(m)];
}

/// Writes the indices of the kept elements of word w (mask m) to `index`, ascending.
template <class Index>
DROPIT_HD void compact_word_index(std::size_t w, std::uint32_t m, Index* index) noexcept {
  const std::size_t base = w * word_elements;
  for (; m != 0; m &= m - 1)
    *index++ = static_cast<Index>(base + lowest_bit32(m));
}

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

/**
 * Marks and compacts block b, bitmask encoding: writes the block's bitmask words and its kept
 * values from `values + at`, where `at` is the kept count before block b. Returns the kept count
 * after block b. The same bytes as the host's per-word loop (mark_word + compact_word).
 */
template <class P, class T, class Key>
DROPIT_HD std::size_t compact_block_bitmask(const P& policy, const T* x, std::size_t n,
                                            std::size_t b, threshold<Key> th, std::size_t at,
                                            T* values, std::uint32_t* words) noexcept {
  const std::size_t w0 = b * (block_elements / word_elements);
  const std::size_t w1 = (block_end(b, n) + word_elements - 1) / word_elements;
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = mark_word(policy, x, n, w, th);
    words[w] = m;
    compact_word(x, w, m, values + at);
    at += static_cast<std::size_t>(popcount32(m));
  }
  return at;
}

/// Marks and compacts block b, index-list encoding: kept values and their indices from `at`.
template <class P, class T, class Key, class Index>
DROPIT_HD std::size_t compact_block_index(const P& policy, const T* x, std::size_t n, std::size_t b,
                                          threshold<Key> th, std::size_t at, T* values,
                                          Index* index) noexcept {
  const std::size_t w0 = b * (block_elements / word_elements);
  const std::size_t w1 = (block_end(b, n) + word_elements - 1) / word_elements;
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = mark_word(policy, x, n, w, th);
    if (m == 0) continue;
    compact_word(x, w, m, values + at);
    compact_word_index(w, m, index + at);
    at += static_cast<std::size_t>(popcount32(m));
  }
  return at;
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

/**
 * Fixes the next digit of `s` to d, the bucket `radix_picks` chose: `above_d` matching keys have
 * a larger digit, `bucket` have digit d. Leaves `s` as `s.advance(hist)` would.
 */
template <class Key>
DROPIT_HD void radix_advance_to(radix_state<Key>& s, unsigned d, std::size_t above_d,
                                std::size_t bucket) noexcept {
  const int b = s.digit_bits();
  const unsigned top = s.bins() - 1;
  s.rank -= above_d;
  s.above += above_d;
  s.shift -= b;
  s.prefix = static_cast<Key>(s.prefix | static_cast<Key>(static_cast<Key>(d) << s.shift));
  s.mask = static_cast<Key>(s.mask | static_cast<Key>(static_cast<Key>(top) << s.shift));
  s.in_bucket = bucket;
}

/// Zeroes the padding between the sections of a host-accessible payload.
inline void zero_padding(std::byte* base, const packed_layout& l) noexcept {
  const padding_gaps g = padding_of(l);
  for (int i = 0; i < 2; ++i) {
    for (std::size_t b = g.begin[i]; b < g.end[i]; ++b)
      base[b] = std::byte{0};
  }
}

}  // namespace dropit::detail
