/**
 * @file classify.hpp
 * @brief The host's per-word kernel: for one bitmask word (32 elements), which keys lie above a
 * key `hi` and which at or above a key `lo`, as two 32-bit masks.
 *
 * The generic form computes the 32 keys with the policy and compares them with SSE2 (the x86-64
 * baseline; scalar elsewhere). MinK on float, half and bfloat16 is classified straight from the
 * element bits: its key is `min(bits & magnitude_mask, infinity + 1)`, and with `hi` clamped to
 * the largest key that is the same as comparing `bits & magnitude_mask`, which is non-negative as
 * a signed integer, so SSE2's signed compares apply without the unsigned-compare fix-up.
 */
#pragma once

#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#define DROPIT_HOST_SSE2 1
#else
#define DROPIT_HOST_SSE2 0
#endif

namespace dropit::detail {

/// Whether P is a MinK policy (any gamma).
template <class P>
struct is_mink : std::false_type {};
template <double G>
struct is_mink<MinK<G>> : std::true_type {};

/// Masks of one word: bit j of `gt` is set when key j > hi, bit j of `ge` when key j >= lo.
struct word_masks {
  std::uint32_t gt;
  std::uint32_t ge;
};

/// Bits [0, count) set.
[[nodiscard]] constexpr std::uint32_t low_bits(unsigned count) noexcept {
  return count >= 32 ? ~std::uint32_t{0} : (std::uint32_t{1} << count) - 1u;
}

/// Compares `count` (<= 32) keys with hi and lo.
template <class Key>
[[nodiscard]] inline word_masks compare_keys(const Key* keys, unsigned count, Key hi,
                                             Key lo) noexcept {
#if DROPIT_HOST_SSE2
  if constexpr (sizeof(Key) == 4) {
    if (count == word_elements) {
      // Unsigned compares through signed ones: flip the top bit of both sides.
      const __m128i flip = _mm_set1_epi32(static_cast<int>(0x80000000u));
      const __m128i h = _mm_xor_si128(_mm_set1_epi32(static_cast<int>(hi)), flip);
      const __m128i l = _mm_xor_si128(_mm_set1_epi32(static_cast<int>(lo)), flip);
      std::uint32_t gt = 0, lt = 0;
#pragma GCC unroll 8
      for (unsigned g = 0; g < 8; ++g) {
        const __m128i v =
            _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(keys + 4 * g)), flip);
        gt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, h))))
              << (4 * g);
        lt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(l, v))))
              << (4 * g);
      }
      return {gt, ~lt};
    }
  } else if constexpr (sizeof(Key) == 2) {
    if (count == word_elements) {
      const __m128i flip = _mm_set1_epi16(static_cast<short>(0x8000u));
      const __m128i h = _mm_xor_si128(_mm_set1_epi16(static_cast<short>(hi)), flip);
      const __m128i l = _mm_xor_si128(_mm_set1_epi16(static_cast<short>(lo)), flip);
      std::uint32_t gt = 0, lt = 0;
#pragma GCC unroll 2
      for (unsigned g = 0; g < 2; ++g) {
        const auto* p = reinterpret_cast<const __m128i*>(keys + 16 * g);
        const __m128i a = _mm_xor_si128(_mm_loadu_si128(p), flip);
        const __m128i b = _mm_xor_si128(_mm_loadu_si128(p + 1), flip);
        gt |= static_cast<std::uint32_t>(
                  _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(a, h), _mm_cmpgt_epi16(b, h))))
              << (16 * g);
        lt |= static_cast<std::uint32_t>(
                  _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(l, a), _mm_cmpgt_epi16(l, b))))
              << (16 * g);
      }
      return {gt, ~lt};
    }
  }
#endif
  std::uint32_t gt = 0, ge = 0;
  for (unsigned j = 0; j < count; ++j) {
    gt |= static_cast<std::uint32_t>(keys[j] > hi) << j;
    ge |= static_cast<std::uint32_t>(keys[j] >= lo) << j;
  }
  return {gt, ge};
}

/**
 * Classifies the words of x against a key range: `masks(w)` for word w of an n-element tensor
 * (bits past n are clear), `key(i)` for one element.
 */
template <class P, class T>
class word_classifier {
 public:
  using key_type = key_type_t<P, T>;

  word_classifier(const P& policy, const T* x, std::size_t n, key_type hi, key_type lo) noexcept
      : policy_(policy), x_(x), n_(n), hi_(hi), lo_(lo) {
    if constexpr (bits_path) {
      // Keys are at most infinity + 1; a larger hi is the same as the largest magnitude bits.
      constexpr auto top = static_cast<key_type>(traits::infinity + 1);
      hi_bits_ = hi >= top ? static_cast<key_type>(traits::magnitude_mask) : hi;
      bits_ok_ = lo <= top;
    }
  }

  /// The key of element i.
  [[nodiscard]] key_type key(std::size_t i) const noexcept { return policy_.key(x_[i], i); }

  /// The keys of word w's elements (32, fewer in the last word); returns how many.
  unsigned keys(std::size_t w, key_type* out) const noexcept {
    const std::size_t base = w * word_elements;
    const unsigned count = n_ - base < word_elements ? static_cast<unsigned>(n_ - base)
                                                     : static_cast<unsigned>(word_elements);
    if (count == word_elements) {
      for (unsigned j = 0; j < word_elements; ++j)
        out[j] = policy_.key(x_[base + j], base + j);
    } else {
      for (unsigned j = 0; j < count; ++j)
        out[j] = policy_.key(x_[base + j], base + j);
    }
    return count;
  }

  /// Word w: keys above hi (`gt`) and keys at or above lo (`ge`).
  [[nodiscard]] word_masks masks(std::size_t w) const noexcept {
    const std::size_t base = w * word_elements;
#if DROPIT_HOST_SSE2
    if constexpr (bits_path) {
      if (bits_ok_ && n_ - base >= word_elements) return masks_from_bits(base);
    }
#endif
    key_type k[word_elements];
    const unsigned count = keys(w, k);
    return compare_keys<key_type>(k, count, hi_, lo_);
  }

 private:
  using bits_type = typename float_traits<T>::bits;
  using traits = float_traits<T>;
  /// MinK on 32- and 16-bit elements: classified from the element bits.
  static constexpr bool bits_path =
      is_mink<P>::value && (sizeof(T) == 4 || sizeof(T) == 2) && sizeof(bits_type) == sizeof(T);

#if DROPIT_HOST_SSE2
  [[nodiscard]] word_masks masks_from_bits(std::size_t base) const noexcept {
    const auto* p = reinterpret_cast<const __m128i*>(x_ + base);
    std::uint32_t gt = 0, lt = 0;
    if constexpr (sizeof(T) == 4) {
      const __m128i mag = _mm_set1_epi32(static_cast<int>(traits::magnitude_mask));
      const __m128i h = _mm_set1_epi32(static_cast<int>(hi_bits_));
      const __m128i l = _mm_set1_epi32(static_cast<int>(lo_));
#pragma GCC unroll 8
      for (unsigned g = 0; g < 8; ++g) {
        const __m128i v = _mm_and_si128(_mm_loadu_si128(p + g), mag);
        gt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, h))))
              << (4 * g);
        lt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(l, v))))
              << (4 * g);
      }
    } else {
      const __m128i mag = _mm_set1_epi16(static_cast<short>(traits::magnitude_mask));
      const __m128i h = _mm_set1_epi16(static_cast<short>(hi_bits_));
      const __m128i l = _mm_set1_epi16(static_cast<short>(lo_));
#pragma GCC unroll 2
      for (unsigned g = 0; g < 2; ++g) {
        const __m128i a = _mm_and_si128(_mm_loadu_si128(p + 2 * g), mag);
        const __m128i b = _mm_and_si128(_mm_loadu_si128(p + 2 * g + 1), mag);
        gt |= static_cast<std::uint32_t>(
                  _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(a, h), _mm_cmpgt_epi16(b, h))))
              << (16 * g);
        lt |= static_cast<std::uint32_t>(
                  _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(l, a), _mm_cmpgt_epi16(l, b))))
              << (16 * g);
      }
    }
    return {gt, ~lt};
  }
#endif

  P policy_;
  const T* x_;
  std::size_t n_;
  key_type hi_;
  key_type lo_;
  key_type hi_bits_{};
  bool bits_ok_ = false;
};

}  // namespace dropit::detail
