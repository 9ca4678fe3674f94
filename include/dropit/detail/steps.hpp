/**
 * @file steps.hpp
 * @brief The data-parallel steps of pack and restore, written once as plain functions that compile
 * for host and device: the key, the radix-select state, mark + compact, and expand.
 *
 * Executors (host cores, a CUDA stream, Thrust's OpenMP system) only decide who runs which word
 * or block; the bytes they produce come from these bodies, so every executor's payload is
 * byte-identical for the same input and policy.
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

/// Zeroes the padding between the sections of a host-accessible payload.
inline void zero_padding(std::byte* base, const packed_layout& l) noexcept {
  const padding_gaps g = padding_of(l);
  for (int i = 0; i < 2; ++i) {
    for (std::size_t b = g.begin[i]; b < g.end[i]; ++b)
      base[b] = std::byte{0};
  }
}

}  // namespace dropit::detail
