/**
 * @file classify.hpp
 * @brief The host's classification kernel: for the words (32 elements each) of one block, which
 * keys lie above a key `hi` and which at or above a key `lo`, as 32-bit masks, with their counts.
 *
 * One call covers up to a block (32 words), so the instruction set is chosen once per 1024
 * elements (isa.hpp). Three kinds of policy get kernels of their own:
 * - MinK on float, half, bfloat16: classified straight from the element bits. Its key is
 *   `min(bits & magnitude_mask, infinity + 1)`; with `hi` clamped to the largest key, comparing
 *   the key is comparing `bits & magnitude_mask`, which is non-negative as a signed integer;
 * - Random: the counter-based hash of (seed, index), eight or four lanes at a time;
 * - any other policy: its keys, computed by its `key`, compared as unsigned integers.
 * Every kernel gives the same masks; the tests run each instruction set against the oracle.
 */
#pragma once

#include <dropit/detail/host/isa.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

DROPIT_AVX512_WARNINGS_OFF

namespace dropit::detail {

/// Whether P is a MinK policy (any gamma).
template <class P>
struct is_mink : std::false_type {};
template <double G>
struct is_mink<MinK<G>> : std::true_type {};

/// Whether P is a Random policy (any gamma).
template <class P>
struct is_random : std::false_type {};
template <double G>
struct is_random<Random<G>> : std::true_type {};

/// Masks of one word: bit j of `gt` is set when key j > hi, bit j of `ge` when key j >= lo.
struct word_masks {
  std::uint32_t gt;
  std::uint32_t ge;
};

/// Keys above hi and keys in [lo, hi] over the words of one classification.
struct block_counts {
  std::size_t above = 0;
  std::size_t within = 0;
};

/// Bits [0, count) set.
[[nodiscard]] constexpr std::uint32_t low_bits(unsigned count) noexcept {
  return count >= 32 ? ~std::uint32_t{0} : (std::uint32_t{1} << count) - 1u;
}

/// Compares `count` (<= 32) keys with hi and lo, one at a time.
template <class Key>
[[nodiscard]] inline word_masks compare_keys(const Key* keys, unsigned count, Key hi,
                                             Key lo) noexcept {
  std::uint32_t gt = 0, ge = 0;
  for (unsigned j = 0; j < count; ++j) {
    gt |= static_cast<std::uint32_t>(keys[j] > hi) << j;
    ge |= static_cast<std::uint32_t>(keys[j] >= lo) << j;
  }
  return {gt, ge};
}

/// Random's key is the top half of mix64(salt + index * random_golden) (policy.hpp's constants):
/// j * random_golden mod 2^64, as a vector lane.
[[nodiscard]] constexpr long long golden_times(unsigned j) noexcept {
  return static_cast<long long>(random_golden * j);
}

/**
 * Classifies the words of x against a key range [lo, hi]: `classify(w0, w1, gt, ge)` for words
 * [w0, w1) (at most a block) of an n-element tensor (bits past n are clear); `key(i)` and
 * `keys(w, out)` for single elements and words.
 */
template <class P, class T>
class word_classifier {
 public:
  using key_type = key_type_t<P, T>;

  word_classifier(const P& policy, const T* x, std::size_t n, key_type hi, key_type lo) noexcept
      : policy_(policy), x_(x), n_(n), hi_(hi), lo_(lo) {
    if constexpr (bits_path) {
      // Keys are at most infinity + 1; a larger hi is the same as the largest magnitude bits.
      constexpr auto top = static_cast<key_type>(bits_traits::infinity + 1);
      hi_bits_ = hi >= top ? static_cast<key_type>(bits_traits::magnitude_mask) : hi;
      bits_ok_ = lo <= top;
    }
    if constexpr (random_path) salt_ = mix64(policy.seed());
  }

  /// The key of element i.
  [[nodiscard]] key_type key(std::size_t i) const noexcept { return policy_.key(x_[i], i); }

  /// The keys of word w's elements (32, fewer in the last word); returns how many.
  unsigned keys(std::size_t w, key_type* out) const noexcept {
    const std::size_t base = w * word_elements;
    const unsigned count = n_ - base < word_elements ? static_cast<unsigned>(n_ - base)
                                                     : static_cast<unsigned>(word_elements);
    for (unsigned j = 0; j < count; ++j)
      out[j] = policy_.key(x_[base + j], base + j);
    return count;
  }

  /// Where a classification copies the entries it collects: keys and offsets in the block.
  /// `keys` and `offs` must have room for `word_elements` entries past every entry written.
  struct entry_sink {
    key_type* keys;
    std::uint16_t* offs;
    std::size_t used;  ///< entries written so far (advanced by the classification)
    std::size_t base;  ///< the block's first element
    bool above;        ///< collect the keys above hi too (else only those in [lo, hi])
  };

  /// Whether `classify` collects entries itself (with AVX-512); else the caller collects them.
  [[nodiscard]] bool collects() const noexcept {
    return vector_entries && isa_ == host_isa::avx512;
  }

  /// Words [w0, w1) (w1 - w0 <= 32): gt[j] and ge[j] for word w0 + j; the counts of keys above
  /// hi and in [lo, hi]. With a sink (and `collects()`), also the entries of the words.
  block_counts classify(std::size_t w0, std::size_t w1, std::uint32_t* gt, std::uint32_t* ge,
                        entry_sink* sink = nullptr) const noexcept {
    const std::size_t full = std::min(w1, n_ / word_elements);  // words of 32 elements
    block_counts c;
    if (w0 < full) {
      switch (isa_) {
#if DROPIT_HOST_X86
        case host_isa::avx512:
          c = full_avx512(w0, full, gt, ge, sink);
          break;
        case host_isa::avx2:
          c = full_avx2(w0, full, gt, ge);
          break;
#endif
        default:
          c = full_baseline(w0, full, gt, ge);
          break;
      }
    }
    for (std::size_t w = std::max(w0, full); w < w1; ++w) {
      key_type k[word_elements];
      const unsigned count = keys(w, k);
      const word_masks m = compare_keys<key_type>(k, count, hi_, lo_);
      gt[w - w0] = m.gt;
      ge[w - w0] = m.ge;
      c.above += static_cast<std::size_t>(popcount32(m.gt));
      c.within += static_cast<std::size_t>(popcount32(m.ge & ~m.gt));
      if (sink != nullptr && collects()) {
        for (std::uint32_t take = sink->above ? m.ge : m.ge & ~m.gt; take != 0; take &= take - 1) {
          const auto j = static_cast<unsigned>(std::countr_zero(take));
          sink->keys[sink->used] = k[j];
          sink->offs[sink->used] = static_cast<std::uint16_t>(w * word_elements + j - sink->base);
          ++sink->used;
        }
      }
    }
    return c;
  }

 private:
  using bits_traits = float_traits<T>;
  using bits_type = typename bits_traits::bits;
  /// MinK on 32- and 16-bit elements: classified from the element bits.
  static constexpr bool bits_path =
      is_mink<P>::value && (sizeof(T) == 4 || sizeof(T) == 2) && sizeof(bits_type) == sizeof(T);
  static constexpr bool random_path = is_random<P>::value;
  /// Keys the AVX-512 kernel collects as vectors: 32-bit ones (two compresses per 16 elements).
  /// For 16- and 64-bit keys the conversions or the extra compresses cost more than the caller's
  /// loop over the few candidates (measured: bench/README.md).
  static constexpr bool vector_entries = sizeof(key_type) == 4;

  // ---- baseline: SSE2 (x86-64) or one key at a time -----------------------------------------

  block_counts full_baseline(std::size_t w0, std::size_t w1, std::uint32_t* gt,
                             std::uint32_t* ge) const noexcept {
    block_counts c;
    for (std::size_t w = w0; w < w1; ++w) {
      const word_masks m = word_baseline(w);
      gt[w - w0] = m.gt;
      ge[w - w0] = m.ge;
      c.above += static_cast<std::size_t>(popcount32(m.gt));
      c.within += static_cast<std::size_t>(popcount32(m.ge & ~m.gt));
    }
    return c;
  }

  word_masks word_baseline(std::size_t w) const noexcept {
#if DROPIT_HOST_SSE2
    if constexpr (bits_path) {
      if (bits_ok_) return bits_sse2(w * word_elements);
    }
#endif
    key_type k[word_elements];
    keys(w, k);
#if DROPIT_HOST_SSE2
    if constexpr (sizeof(key_type) == 4 || sizeof(key_type) == 2) return compare_sse2(k);
#endif
    return compare_keys<key_type>(k, word_elements, hi_, lo_);
  }

#if DROPIT_HOST_SSE2
  /// A word's masks from 32 elements of `Bytes` bytes, `load(i)` giving the i-th 128-bit vector
  /// of them in a form that signed compares order: above h, and not below l.
  template <unsigned Bytes, class Load>
  static word_masks masks_sse2(Load load, __m128i h, __m128i l) noexcept {
    std::uint32_t gt = 0, lt = 0;
    if constexpr (Bytes == 4) {
      for (unsigned g = 0; g < 8; ++g) {
        const __m128i v = load(g);
        gt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, h))))
              << (4 * g);
        lt |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(l, v))))
              << (4 * g);
      }
    } else {
      static_assert(Bytes == 2);
      for (unsigned g = 0; g < 2; ++g) {
        const __m128i a = load(2 * g);
        const __m128i b = load(2 * g + 1);
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

  /// Unsigned compares through signed ones: both sides with the top bit flipped.
  word_masks compare_sse2(const key_type* keys) const noexcept {
    const auto* p = reinterpret_cast<const __m128i*>(keys);
    if constexpr (sizeof(key_type) == 4) {
      const __m128i flip = _mm_set1_epi32(static_cast<int>(0x80000000u));
      return masks_sse2<4>([&](unsigned i) { return _mm_xor_si128(_mm_loadu_si128(p + i), flip); },
                           _mm_xor_si128(_mm_set1_epi32(static_cast<int>(hi_)), flip),
                           _mm_xor_si128(_mm_set1_epi32(static_cast<int>(lo_)), flip));
    } else {
      const __m128i flip = _mm_set1_epi16(static_cast<short>(0x8000u));
      return masks_sse2<2>([&](unsigned i) { return _mm_xor_si128(_mm_loadu_si128(p + i), flip); },
                           _mm_xor_si128(_mm_set1_epi16(static_cast<short>(hi_)), flip),
                           _mm_xor_si128(_mm_set1_epi16(static_cast<short>(lo_)), flip));
    }
  }

  /// The magnitude bits compared as integers (the bit patterns' order is the magnitudes').
  word_masks bits_sse2(std::size_t base) const noexcept {
    const auto* p = reinterpret_cast<const __m128i*>(x_ + base);
    if constexpr (sizeof(T) == 4) {
      const __m128i mag = _mm_set1_epi32(static_cast<int>(bits_traits::magnitude_mask));
      return masks_sse2<4>([&](unsigned i) { return _mm_and_si128(_mm_loadu_si128(p + i), mag); },
                           _mm_set1_epi32(static_cast<int>(hi_bits_)),
                           _mm_set1_epi32(static_cast<int>(lo_)));
    } else {
      const __m128i mag = _mm_set1_epi16(static_cast<short>(bits_traits::magnitude_mask));
      return masks_sse2<2>([&](unsigned i) { return _mm_and_si128(_mm_loadu_si128(p + i), mag); },
                           _mm_set1_epi16(static_cast<short>(hi_bits_)),
                           _mm_set1_epi16(static_cast<short>(lo_)));
    }
  }
#endif

#if DROPIT_HOST_X86
  // ---- AVX2 ---------------------------------------------------------------------------------

  DROPIT_TARGET_AVX2 block_counts full_avx2(std::size_t w0, std::size_t w1, std::uint32_t* gt,
                                            std::uint32_t* ge) const noexcept {
    block_counts c;
    for (std::size_t w = w0; w < w1; ++w) {
      word_masks m;
      if constexpr (bits_path) {
        m = bits_ok_ ? bits_avx2(w * word_elements) : generic_avx2(w);
      } else if constexpr (random_path) {
        m = random_avx2(w * word_elements);
      } else {
        m = generic_avx2(w);
      }
      gt[w - w0] = m.gt;
      ge[w - w0] = m.ge;
      c.above += static_cast<std::size_t>(__builtin_popcount(m.gt));
      c.within += static_cast<std::size_t>(__builtin_popcount(m.ge & ~m.gt));
    }
    return c;
  }

  /// Eight (or four) comparison results packed into the word's masks.
  DROPIT_TARGET_AVX2 static std::uint32_t mask8_avx2(__m256i cmp) noexcept {
    return static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(cmp)));
  }
  /// 32 16-bit comparison results (two vectors) as one 32-bit mask, in element order.
  DROPIT_TARGET_AVX2 static std::uint32_t mask32x16_avx2(__m256i a, __m256i b) noexcept {
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xd8);
    return static_cast<std::uint32_t>(_mm256_movemask_epi8(packed));
  }

  DROPIT_TARGET_AVX2 word_masks bits_avx2(std::size_t base) const noexcept {
    const auto* p = reinterpret_cast<const __m256i*>(x_ + base);
    if constexpr (sizeof(T) == 4) {
      const __m256i mag = _mm256_set1_epi32(static_cast<int>(bits_traits::magnitude_mask));
      const __m256i h = _mm256_set1_epi32(static_cast<int>(hi_bits_));
      const __m256i l = _mm256_set1_epi32(static_cast<int>(lo_));
      std::uint32_t gt = 0, lt = 0;
      for (unsigned g = 0; g < 4; ++g) {
        const __m256i v = _mm256_and_si256(_mm256_loadu_si256(p + g), mag);
        gt |= mask8_avx2(_mm256_cmpgt_epi32(v, h)) << (8 * g);
        lt |= mask8_avx2(_mm256_cmpgt_epi32(l, v)) << (8 * g);
      }
      return {gt, ~lt};
    } else {
      const __m256i mag = _mm256_set1_epi16(static_cast<short>(bits_traits::magnitude_mask));
      const __m256i h = _mm256_set1_epi16(static_cast<short>(hi_bits_));
      const __m256i l = _mm256_set1_epi16(static_cast<short>(lo_));
      const __m256i a = _mm256_and_si256(_mm256_loadu_si256(p), mag);
      const __m256i b = _mm256_and_si256(_mm256_loadu_si256(p + 1), mag);
      return {mask32x16_avx2(_mm256_cmpgt_epi16(a, h), _mm256_cmpgt_epi16(b, h)),
              ~mask32x16_avx2(_mm256_cmpgt_epi16(l, a), _mm256_cmpgt_epi16(l, b))};
    }
  }

  /// a * m mod 2^64 in each 64-bit lane (AVX2 has no 64-bit multiply).
  DROPIT_TARGET_AVX2 static __m256i mul64_avx2(__m256i a, __m256i m_lo, __m256i m_hi) noexcept {
    const __m256i lo = _mm256_mul_epu32(a, m_lo);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), m_lo),
                                           _mm256_mul_epu32(a, m_hi));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }

  /// mix64 of four lanes, the top 32 bits of each left in the odd 32-bit lanes.
  DROPIT_TARGET_AVX2 static __m256i mix64_avx2(__m256i z) noexcept {
    const __m256i m1_lo = _mm256_set1_epi64x(static_cast<long long>(mix64_m1 & 0xffffffffu));
    const __m256i m1_hi = _mm256_set1_epi64x(static_cast<long long>(mix64_m1 >> 32));
    const __m256i m2_lo = _mm256_set1_epi64x(static_cast<long long>(mix64_m2 & 0xffffffffu));
    const __m256i m2_hi = _mm256_set1_epi64x(static_cast<long long>(mix64_m2 >> 32));
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1_lo, m1_hi);
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2_lo, m2_hi);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
  }

  DROPIT_TARGET_AVX2 word_masks random_avx2(std::size_t base) const noexcept {
    const std::uint64_t z0 = salt_ + static_cast<std::uint64_t>(base) * random_golden;
    __m256i z =
        _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(z0)),
                         _mm256_set_epi64x(golden_times(3), golden_times(2), golden_times(1), 0));
    const __m256i step = _mm256_set1_epi64x(golden_times(4));
    const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    const __m256i h = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(hi_)), flip);
    const __m256i l = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(lo_)), flip);
    std::uint32_t gt = 0, lt = 0;
    for (unsigned q = 0; q < 4; ++q) {
      const __m256i a = mix64_avx2(z);
      z = _mm256_add_epi64(z, step);
      const __m256i b = mix64_avx2(z);
      z = _mm256_add_epi64(z, step);
      // The high halves of a's and b's lanes, in lane order: the eight keys.
      const __m256i k = _mm256_permute4x64_epi64(
          _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b),
                                                _MM_SHUFFLE(3, 1, 3, 1))),
          0xd8);
      const __m256i v = _mm256_xor_si256(k, flip);
      gt |= mask8_avx2(_mm256_cmpgt_epi32(v, h)) << (8 * q);
      lt |= mask8_avx2(_mm256_cmpgt_epi32(l, v)) << (8 * q);
    }
    return {gt, ~lt};
  }

  DROPIT_TARGET_AVX2 word_masks generic_avx2(std::size_t w) const noexcept {
    alignas(32) key_type k[word_elements];
    keys(w, k);
    if constexpr (sizeof(key_type) == 4) {
      const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
      const __m256i h = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(hi_)), flip);
      const __m256i l = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(lo_)), flip);
      std::uint32_t gt = 0, lt = 0;
      for (unsigned g = 0; g < 4; ++g) {
        const __m256i v =
            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(k + 8 * g)), flip);
        gt |= mask8_avx2(_mm256_cmpgt_epi32(v, h)) << (8 * g);
        lt |= mask8_avx2(_mm256_cmpgt_epi32(l, v)) << (8 * g);
      }
      return {gt, ~lt};
    } else if constexpr (sizeof(key_type) == 2) {
      const __m256i flip = _mm256_set1_epi16(static_cast<short>(0x8000u));
      const __m256i h = _mm256_xor_si256(_mm256_set1_epi16(static_cast<short>(hi_)), flip);
      const __m256i l = _mm256_xor_si256(_mm256_set1_epi16(static_cast<short>(lo_)), flip);
      const auto* p = reinterpret_cast<const __m256i*>(k);
      const __m256i a = _mm256_xor_si256(_mm256_load_si256(p), flip);
      const __m256i b = _mm256_xor_si256(_mm256_load_si256(p + 1), flip);
      return {mask32x16_avx2(_mm256_cmpgt_epi16(a, h), _mm256_cmpgt_epi16(b, h)),
              ~mask32x16_avx2(_mm256_cmpgt_epi16(l, a), _mm256_cmpgt_epi16(l, b))};
    } else if constexpr (sizeof(key_type) == 8) {
      const __m256i flip = _mm256_set1_epi64x(static_cast<long long>(0x8000000000000000ull));
      const __m256i h = _mm256_xor_si256(_mm256_set1_epi64x(static_cast<long long>(hi_)), flip);
      const __m256i l = _mm256_xor_si256(_mm256_set1_epi64x(static_cast<long long>(lo_)), flip);
      std::uint32_t gt = 0, lt = 0;
      for (unsigned g = 0; g < 8; ++g) {
        const __m256i v =
            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(k + 4 * g)), flip);
        gt |= static_cast<std::uint32_t>(
                  _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(v, h))))
              << (4 * g);
        lt |= static_cast<std::uint32_t>(
                  _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(l, v))))
              << (4 * g);
      }
      return {gt, ~lt};
    } else {
      return compare_keys<key_type>(k, word_elements, hi_, lo_);
    }
  }

  // ---- AVX-512 ------------------------------------------------------------------------------

  DROPIT_TARGET_AVX512 block_counts full_avx512(std::size_t w0, std::size_t w1, std::uint32_t* gt,
                                                std::uint32_t* ge,
                                                entry_sink* sink) const noexcept {
    if constexpr (vector_entries) {
      if (sink != nullptr) {
        // The sink's fields live in registers for the loop (vector stores may alias anything).
        key_type* ck = sink->keys + sink->used;
        std::uint16_t* co = sink->offs + sink->used;
        const block_counts c = words_avx512<true>(
            w0, w1, gt, ge, ck, co, static_cast<int>(w0 * word_elements - sink->base), sink->above);
        sink->used = static_cast<std::size_t>(ck - sink->keys);
        return c;
      }
    }
    key_type* ck = nullptr;
    std::uint16_t* co = nullptr;
    return words_avx512<false>(w0, w1, gt, ge, ck, co, 0, false);
  }

  template <bool Collect>
  DROPIT_TARGET_AVX512 block_counts words_avx512(std::size_t w0, std::size_t w1, std::uint32_t* gt,
                                                 std::uint32_t* ge, key_type*& ck_out,
                                                 std::uint16_t*& co_out, int off0,
                                                 bool above) const noexcept {
    // Locals whose address is never taken stay in registers across the vector stores.
    key_type* ck = ck_out;
    std::uint16_t* co = co_out;
    std::size_t n_above = 0, n_within = 0;
    for (std::size_t w = w0; w < w1; ++w) {
      __m512i kv[4];
      const word_masks m = word_avx512(w, kv);
      gt[w - w0] = m.gt;
      ge[w - w0] = m.ge;
      n_above += static_cast<std::size_t>(__builtin_popcount(m.gt));
      n_within += static_cast<std::size_t>(__builtin_popcount(m.ge & ~m.gt));
      if constexpr (Collect) {
        const int count =
            store_entries_avx512(kv, above ? m.ge : m.ge & ~m.gt,
                                 off0 + static_cast<int>((w - w0) * word_elements), ck, co);
        ck += count;
        co += count;
      }
    }
    ck_out = ck;
    co_out = co;
    return {n_above, n_within};
  }

  /// Word w's masks, and its keys in kv: two vectors of 32-bit keys, one of 16-bit keys, or four
  /// of 64-bit keys.
  DROPIT_TARGET_AVX512 word_masks word_avx512(std::size_t w, __m512i* kv) const noexcept {
    if constexpr (bits_path) {
      if (bits_ok_) return bits_avx512(w * word_elements, kv);
      return generic_avx512(w, kv);
    } else if constexpr (random_path) {
      return random_avx512(w * word_elements, kv);
    } else {
      return generic_avx512(w, kv);
    }
  }

  /// Writes the keys and block offsets of the elements in `take` at ck and co, without a branch:
  /// whole vectors are stored (the buffers have room past their end); returns the count.
  DROPIT_TARGET_AVX512 static int store_entries_avx512(const __m512i* kv, std::uint32_t take,
                                                       int off0, key_type* ck,
                                                       std::uint16_t* co) noexcept {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if constexpr (sizeof(key_type) == 4 || sizeof(key_type) == 2) {
      for (unsigned h = 0; h < 2; ++h) {
        const auto mh = static_cast<__mmask16>(take >> (16 * h));
        __m512i keys;
        if constexpr (sizeof(key_type) == 4) {
          keys = kv[h];
        } else {
          keys = _mm512_cvtepu16_epi32(h == 0 ? _mm512_castsi512_si256(kv[0])
                                              : _mm512_extracti64x4_epi64(kv[0], 1));
        }
        const __m512i ck_v = _mm512_maskz_compress_epi32(mh, keys);
        if constexpr (sizeof(key_type) == 4) {
          _mm512_storeu_si512(ck, ck_v);
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ck), _mm512_cvtepi32_epi16(ck_v));
        }
        const __m512i offs =
            _mm512_add_epi32(iota, _mm512_set1_epi32(off0 + 16 * static_cast<int>(h)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(co),
                            _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(mh, offs)));
        const int count = __builtin_popcount(mh);
        ck += count;
        co += count;
      }
    } else {
      static_assert(sizeof(key_type) == 8);
      const __m256i iota8 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (unsigned q = 0; q < 4; ++q) {
        const auto mq = static_cast<__mmask8>(take >> (8 * q));
        _mm512_storeu_si512(ck, _mm512_maskz_compress_epi64(mq, kv[q]));
        const __m256i offs =
            _mm256_add_epi32(iota8, _mm256_set1_epi32(off0 + 8 * static_cast<int>(q)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(co),
                         _mm256_cvtepi32_epi16(_mm256_maskz_compress_epi32(mq, offs)));
        const int count = __builtin_popcount(mq);
        ck += count;
        co += count;
      }
    }
    return __builtin_popcount(take);
  }

  DROPIT_TARGET_AVX512 word_masks bits_avx512(std::size_t base, __m512i* kv) const noexcept {
    const T* p = x_ + base;
    if constexpr (sizeof(T) == 4) {
      const __m512i mag = _mm512_set1_epi32(static_cast<int>(bits_traits::magnitude_mask));
      const __m512i top = _mm512_set1_epi32(static_cast<int>(bits_traits::infinity + 1));
      const __m512i h = _mm512_set1_epi32(static_cast<int>(hi_bits_));
      const __m512i l = _mm512_set1_epi32(static_cast<int>(lo_));
      const __m512i a = _mm512_and_si512(_mm512_loadu_si512(p), mag);
      const __m512i b = _mm512_and_si512(_mm512_loadu_si512(p + 16), mag);
      kv[0] = _mm512_min_epu32(a, top);
      kv[1] = _mm512_min_epu32(b, top);
      const std::uint32_t gt = static_cast<std::uint32_t>(_mm512_cmpgt_epi32_mask(a, h)) |
                               static_cast<std::uint32_t>(_mm512_cmpgt_epi32_mask(b, h)) << 16;
      const std::uint32_t lt = static_cast<std::uint32_t>(_mm512_cmpgt_epi32_mask(l, a)) |
                               static_cast<std::uint32_t>(_mm512_cmpgt_epi32_mask(l, b)) << 16;
      return {gt, ~lt};
    } else {
      const __m512i mag = _mm512_set1_epi16(static_cast<short>(bits_traits::magnitude_mask));
      const __m512i top = _mm512_set1_epi16(static_cast<short>(bits_traits::infinity + 1));
      const __m512i v = _mm512_and_si512(_mm512_loadu_si512(p), mag);
      kv[0] = _mm512_min_epu16(v, top);
      return {static_cast<std::uint32_t>(
                  _mm512_cmpgt_epi16_mask(v, _mm512_set1_epi16(static_cast<short>(hi_bits_)))),
              ~static_cast<std::uint32_t>(
                  _mm512_cmpgt_epi16_mask(_mm512_set1_epi16(static_cast<short>(lo_)), v))};
    }
  }

  /// mix64 of eight lanes.
  DROPIT_TARGET_AVX512 static __m512i mix64_avx512(__m512i z) noexcept {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64(static_cast<long long>(mix64_m1)));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64(static_cast<long long>(mix64_m2)));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
  }

  DROPIT_TARGET_AVX512 word_masks random_avx512(std::size_t base, __m512i* kv) const noexcept {
    const std::uint64_t z0 = salt_ + static_cast<std::uint64_t>(base) * random_golden;
    __m512i z = _mm512_add_epi64(
        _mm512_set1_epi64(static_cast<long long>(z0)),
        _mm512_set_epi64(golden_times(7), golden_times(6), golden_times(5), golden_times(4),
                         golden_times(3), golden_times(2), golden_times(1), 0));
    const __m512i step = _mm512_set1_epi64(golden_times(8));
    const __m512i h = _mm512_set1_epi32(static_cast<int>(hi_));
    const __m512i l = _mm512_set1_epi32(static_cast<int>(lo_));
    std::uint32_t gt = 0, lt = 0;
    for (unsigned q = 0; q < 2; ++q) {
      const __m256i a = _mm512_cvtepi64_epi32(_mm512_srli_epi64(mix64_avx512(z), 32));
      z = _mm512_add_epi64(z, step);
      const __m256i b = _mm512_cvtepi64_epi32(_mm512_srli_epi64(mix64_avx512(z), 32));
      z = _mm512_add_epi64(z, step);
      const __m512i k = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      kv[q] = k;
      gt |= static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(k, h)) << (16 * q);
      lt |= static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(l, k)) << (16 * q);
    }
    return {gt, ~lt};
  }

  DROPIT_TARGET_AVX512 word_masks generic_avx512(std::size_t w, __m512i* kv) const noexcept {
    alignas(64) key_type k[word_elements];
    keys(w, k);
    if constexpr (sizeof(key_type) == 4) {
      const __m512i h = _mm512_set1_epi32(static_cast<int>(hi_));
      const __m512i l = _mm512_set1_epi32(static_cast<int>(lo_));
      const __m512i a = _mm512_load_si512(k);
      const __m512i b = _mm512_load_si512(k + 16);
      kv[0] = a;
      kv[1] = b;
      return {static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(a, h)) |
                  static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(b, h)) << 16,
              ~(static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(l, a)) |
                static_cast<std::uint32_t>(_mm512_cmpgt_epu32_mask(l, b)) << 16)};
    } else if constexpr (sizeof(key_type) == 2) {
      const __m512i v = _mm512_load_si512(k);
      kv[0] = v;
      return {static_cast<std::uint32_t>(
                  _mm512_cmpgt_epu16_mask(v, _mm512_set1_epi16(static_cast<short>(hi_)))),
              ~static_cast<std::uint32_t>(
                  _mm512_cmpgt_epu16_mask(_mm512_set1_epi16(static_cast<short>(lo_)), v))};
    } else if constexpr (sizeof(key_type) == 8) {
      const __m512i h = _mm512_set1_epi64(static_cast<long long>(hi_));
      const __m512i l = _mm512_set1_epi64(static_cast<long long>(lo_));
      std::uint32_t gt = 0, lt = 0;
      for (unsigned g = 0; g < 4; ++g) {
        const __m512i v = _mm512_load_si512(k + 8 * g);
        kv[g] = v;
        gt |= static_cast<std::uint32_t>(_mm512_cmpgt_epu64_mask(v, h)) << (8 * g);
        lt |= static_cast<std::uint32_t>(_mm512_cmpgt_epu64_mask(l, v)) << (8 * g);
      }
      return {gt, ~lt};
    } else {
      (void)kv;
      return compare_keys<key_type>(k, word_elements, hi_, lo_);
    }
  }
#endif

  P policy_;
  const T* x_;
  std::size_t n_;
  key_type hi_;
  key_type lo_;
  key_type hi_bits_{};
  bool bits_ok_ = false;
  std::uint64_t salt_ = 0;
  host_isa isa_ = active_host_isa();
};

}  // namespace dropit::detail

DROPIT_AVX512_WARNINGS_ON
