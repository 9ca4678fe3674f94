/**
 * @file compress.hpp
 * @brief The host's word compaction: the elements of a run of words whose mask bit is set, copied
 * out in index order. With AVX-512 sixteen (eight) elements at a time by the compress instruction,
 * with AVX2 eight 4-byte elements at a time by a table-driven permute, otherwise one kept element
 * at a time. The count pass stages a block's candidate values with it (select.hpp), the compact
 * step writes the payload's values with it (compact.hpp).
 */
#pragma once

#include <dropit/detail/host/isa.hpp>
#include <dropit/format.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

DROPIT_AVX512_WARNINGS_OFF

namespace dropit::detail {

/// Copies the elements of src whose bit is set in m to out, in order; returns the end.
template <class T>
inline T* host_compact_word(const T* src, std::uint32_t m, T* out) noexcept {
  for (; m != 0; m &= m - 1)
    *out++ = src[std::countr_zero(m)];
  return out;
}

/// For each 8-bit mask: the positions of its set bits, in order (compress), as bytes.
inline constexpr auto compress_table = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    std::uint64_t v = 0;
    unsigned j = 0;
    for (unsigned b = 0; b < 8; ++b) {
      if ((m >> b & 1u) != 0) v |= std::uint64_t{b} << (8 * j++);
    }
    t[m] = v;
  }
  return t;
}();

#if DROPIT_HOST_X86
/// AVX-512: compacts full words [w0, w1) of x by masks[w - w0] to out; returns the end. Stores
/// are whole vectors while `end` (one past the last value this call writes) leaves room, masked
/// after that.
template <class T>
DROPIT_TARGET_AVX512 T* compact_words_avx512(const T* x, const std::uint32_t* masks, std::size_t w0,
                                             std::size_t w1, T* out, const T* end) noexcept {
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = masks[w - w0];
    if (m == 0) continue;
    const T* src = x + w * word_elements;
    if constexpr (sizeof(T) == 4) {
      for (unsigned h = 0; h < 2; ++h) {
        const auto mh = static_cast<__mmask16>(m >> (16 * h));
        const __m512i c = _mm512_maskz_compress_epi32(mh, _mm512_loadu_si512(src + 16 * h));
        const int count = __builtin_popcount(mh);
        if (end - out >= 16) {
          _mm512_storeu_si512(out, c);
        } else {
          _mm512_mask_storeu_epi32(out, static_cast<__mmask16>((1u << count) - 1u), c);
        }
        out += count;
      }
    } else if constexpr (sizeof(T) == 2) {
      for (unsigned h = 0; h < 2; ++h) {
        const auto mh = static_cast<__mmask16>(m >> (16 * h));
        const __m512i wide = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 * h)));
        const __m256i c = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(mh, wide));
        const int count = __builtin_popcount(mh);
        if (end - out >= 16) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), c);
        } else {
          _mm256_mask_storeu_epi16(out, static_cast<__mmask16>((1u << count) - 1u), c);
        }
        out += count;
      }
    } else {
      static_assert(sizeof(T) == 8);
      for (unsigned q = 0; q < 4; ++q) {
        const auto mq = static_cast<__mmask8>(m >> (8 * q));
        const __m512i c = _mm512_maskz_compress_epi64(mq, _mm512_loadu_si512(src + 8 * q));
        const int count = __builtin_popcount(mq);
        if (end - out >= 8) {
          _mm512_storeu_si512(out, c);
        } else {
          _mm512_mask_storeu_epi64(out, static_cast<__mmask8>((1u << count) - 1u), c);
        }
        out += count;
      }
    }
  }
  return out;
}

/// AVX2, 4-byte elements: compacts full words [w0, w1) (at most a block) through a buffer that
/// takes whole vectors, then copies the kept count out.
template <class T>
DROPIT_TARGET_AVX2 T* compact_words_avx2(const T* x, const std::uint32_t* masks, std::size_t w0,
                                         std::size_t w1, T* out) noexcept {
  static_assert(sizeof(T) == 4);
  alignas(32) std::uint32_t buf[block_elements + 8];
  std::size_t at = 0;
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = masks[w - w0];
    if (m == 0) continue;
    const T* src = x + w * word_elements;
    for (unsigned g = 0; g < 4; ++g) {
      const unsigned mg = m >> (8 * g) & 0xffu;
      const __m256i idx =
          _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(compress_table[mg])));
      const __m256i v = _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8 * g)), idx);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf + at), v);
      at += static_cast<std::size_t>(__builtin_popcount(mg));
    }
  }
  std::memcpy(static_cast<void*>(out), buf, at * sizeof(T));
  return out + at;
}
#endif

/// Compacts words [w0, w1) (at most a block) of an n-element x by masks[w - w0] to out, in
/// index order; returns the end. `end` bounds what may be written: whole-vector stores may pass
/// the last value up to it.
template <class T>
T* compact_words(const T* x, std::size_t n, const std::uint32_t* masks, std::size_t w0,
                 std::size_t w1, T* out, const T* end, host_isa isa) noexcept {
  const std::size_t full = std::min(w1, n / word_elements);
  std::size_t w = w0;
#if DROPIT_HOST_X86
  if (w0 < full) {
    if (isa == host_isa::avx512 && (sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8)) {
      out = compact_words_avx512(x, masks, w0, full, out, end);
      w = full;
    } else if (isa >= host_isa::avx2 && sizeof(T) == 4) {
      if constexpr (sizeof(T) == 4) {
        out = compact_words_avx2(x, masks, w0, full, out);
        w = full;
      }
    }
  }
#else
  (void)isa;
  (void)full;
  (void)end;
#endif
  for (; w < w1; ++w)
    out = host_compact_word(x + w * word_elements, masks[w - w0], out);
  return out;
}

}  // namespace dropit::detail

DROPIT_AVX512_WARNINGS_ON
