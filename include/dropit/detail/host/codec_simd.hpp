/**
 * @file codec_simd.hpp
 * @brief The host's vector paths of the int8 and e4m3 codecs for fp32 chunks (round to nearest):
 * the same bytes as `encode_chunk` / `decode_chunk` (detail/codec.hpp), sixteen (AVX-512) or eight
 * (AVX2) values at a time. The chunk's largest finite |v| is an integer maximum of the magnitude
 * bits (finite non-negative floats order like their bits); a product rounds once (no add follows
 * it, so nothing can fuse it) and converts to an integer with the default rounding mode, nearest
 * even. e4m3 has an AVX-512 path (`encode_e4m3_avx512`, `decode_e4m3_avx512`). Other element types
 * and stochastic rounding run the portable chunk bodies.
 */
#pragma once

#include <dropit/detail/codec.hpp>
#include <dropit/detail/host/isa.hpp>

#include <cstddef>
#include <cstdint>

namespace dropit::detail {

/// The largest magnitude bits among the finite values[i, end) and `bits` (finite non-negative
/// floats order like their bits).
[[nodiscard]] inline std::uint32_t absmax_tail(const float* values, std::size_t i, std::size_t end,
                                               std::uint32_t bits) noexcept {
  for (; i < end; ++i) {
    const std::uint32_t m = float_to_bits(values[i]) & 0x7fffffffu;
    if (m < 0x7f800000u && m > bits) bits = m;
  }
  return bits;
}

/// The largest of an array of lanes.
template <std::size_t N>
[[nodiscard]] inline std::uint32_t max_of(const std::uint32_t (&lanes)[N]) noexcept {
  std::uint32_t m = 0;
  for (std::uint32_t l : lanes)
    m = l > m ? l : m;
  return m;
}

#if DROPIT_HOST_X86

DROPIT_AVX512_WARNINGS_OFF

/// The largest finite magnitude of values[begin, end) (one chunk), as bits.
DROPIT_TARGET_AVX512 inline std::uint32_t absmax_bits_avx512(const float* values, std::size_t begin,
                                                             std::size_t end) noexcept {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  __m512i best = _mm512_setzero_si512();
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512i m = _mm512_and_si512(_mm512_loadu_si512(values + i), magnitude);
    best = _mm512_mask_max_epu32(best, _mm512_cmplt_epu32_mask(m, infinity), best, m);
  }
  alignas(64) std::uint32_t lanes[16];
  _mm512_store_si512(lanes, best);
  return absmax_tail(values, i, end, max_of(lanes));
}

/// Encodes values[begin, end) (one chunk) to int8 codes; returns the chunk's scale.
DROPIT_TARGET_AVX512 inline float encode_int8_avx512(const float* values, std::size_t begin,
                                                     std::size_t end,
                                                     std::uint8_t* codes) noexcept {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  const chunk_scale cs = scale_of(bits_to_float(absmax_bits_avx512(values, begin, end)), 127.0f);
  const float inv = cs.inv;
  std::size_t i;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m128i nan_code = _mm_set1_epi8(static_cast<char>(int8_nan_code));
  for (i = begin; i + 16 <= end; i += 16) {
    const __m512 v = _mm512_loadu_ps(values + i);
    const __mmask16 finite =
        _mm512_cmplt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(v), magnitude), infinity);
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // nearest even (MXCSR default)
    r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
    const __m128i c = _mm512_cvtepi32_epi8(r);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     _mm_mask_blend_epi8(finite, nan_code, c));
  }
  for (; i < end; ++i)
    codes[i] = int8_code(values[i], cs.inv);
  return cs.scale;
}

/// Decodes int8 codes[begin, end) with scale s into values.
DROPIT_TARGET_AVX512 inline void decode_int8_avx512(const std::uint8_t* codes, float s,
                                                    std::size_t begin, std::size_t end,
                                                    float* values) noexcept {
  const __m512 vs = _mm512_set1_ps(s);
  const __m512 nan = _mm512_set1_ps(bits_to_float(0x7fc00000u));
  const __m128i nan_code = _mm_set1_epi8(static_cast<char>(int8_nan_code));
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __mmask16 is_nan = _mm_cmpeq_epi8_mask(c, nan_code);
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)), vs);
    _mm512_storeu_ps(values + i, _mm512_mask_blend_ps(is_nan, v, nan));
  }
  for (; i < end; ++i) {
    const auto c = static_cast<std::int8_t>(codes[i]);
    values[i] = c == int8_nan_code ? bits_to_float(0x7fc00000u) : static_cast<float>(c) * s;
  }
}

/**
 * Encodes values[begin, end) (one chunk) to e4m3 codes, the bits of `e4m3_encode` sixteen at a
 * time; returns the chunk's scale. From y = v x inv's bits a (sign apart): at or above 2^-6 (a
 * normal code) the 20 bits the code drops are rounded to nearest even by adding 0x7ffff plus the
 * kept lowest bit, the exponent is rebiased (127 - 7) and anything past 448 saturates to 0x7e;
 * below, the code is |y| x 2^9 rounded to the nearest integer (ties to even: the conversion's
 * default mode; exact scaling), whose 8 is the least normal's code. NaN and infinite v, and y
 * past the float range, give the NaN code; the sign is v's.
 */
DROPIT_TARGET_AVX512 inline float encode_e4m3_avx512(const float* values, std::size_t begin,
                                                     std::size_t end,
                                                     std::uint8_t* codes) noexcept {
  const chunk_scale cs = scale_of(bits_to_float(absmax_bits_avx512(values, begin, end)),
                                  codec_range(value_codec::fp8_e4m3));
  const __m512 vinv = _mm512_set1_ps(cs.inv);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  const __m512i least_normal = _mm512_set1_epi32(0x3c800000);  // 2^-6
  const __m512i half_less = _mm512_set1_epi32(0x7ffff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i rebias = _mm512_set1_epi32(120 << 3);
  const __m512i largest = _mm512_set1_epi32(0x7e);  // 448
  const __m512i nan_code = _mm512_set1_epi32(e4m3_nan_code);
  const __m512i sign_bit = _mm512_set1_epi32(0x80);
  const __m512 subnormal_scale = _mm512_set1_ps(0x1p9f);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = _mm512_loadu_ps(values + i);
    const __m512i vb = _mm512_castps_si512(v);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(_mm512_mul_ps(v, vinv)), magnitude);
    __m512i normal = _mm512_add_epi32(
        a, _mm512_add_epi32(half_less, _mm512_and_si512(_mm512_srli_epi32(a, 20), one)));
    normal = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(normal, 20), rebias), largest);
    const __m512i subnormal =
        _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), subnormal_scale));
    __m512i code =
        _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(a, least_normal), subnormal, normal);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(_mm512_and_si512(vb, magnitude), infinity) &
                             _mm512_cmplt_epu32_mask(a, infinity);
    code = _mm512_mask_blend_epi32(finite, nan_code, code);
    code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(vb, 24), sign_bit));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  for (; i < end; ++i)
    codes[i] = e4m3_encode(finite_float(values[i]) ? mul_rn(values[i], cs.inv) : values[i]);
  return cs.scale;
}

/// Decodes e4m3 codes[begin, end) with scale s into values: `e4m3_decode` then the product, sixteen
/// at a time (a normal code's bits shift into place and rebias; a subnormal's 3 bits x 2^-9 are
/// exact; the NaN codes give the quiet NaN with the code's sign).
DROPIT_TARGET_AVX512 inline void decode_e4m3_avx512(const std::uint8_t* codes, float s,
                                                    std::size_t begin, std::size_t end,
                                                    float* values) noexcept {
  const __m512 vs = _mm512_set1_ps(s);
  const __m512i low7 = _mm512_set1_epi32(0x7f);
  const __m512i rebias = _mm512_set1_epi32(120 << 23);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i quiet_nan = _mm512_set1_epi32(0x7fc00000);
  const __m512 step = _mm512_set1_ps(0x1p-9f);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512i c =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    const __m512i mag = _mm512_and_si512(c, low7);
    const __m512i sign = _mm512_slli_epi32(_mm512_andnot_si512(low7, c), 24);
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), rebias);
    const __m512i subnormal = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mag), step));
    __m512i bits = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(mag, eight), normal, subnormal);
    bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(mag, low7), bits, quiet_nan);
    const __m512 v = _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
    _mm512_storeu_ps(values + i, _mm512_mul_ps(v, vs));
  }
  for (; i < end; ++i)
    values[i] = mul_rn(e4m3_decode(codes[i]), s);
}

DROPIT_AVX512_WARNINGS_ON

/// encode_int8_avx512 with AVX2.
DROPIT_TARGET_AVX2 inline float encode_int8_avx2(const float* values, std::size_t begin,
                                                 std::size_t end, std::uint8_t* codes) noexcept {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  __m256i best = _mm256_setzero_si256();
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256i m = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + i)), magnitude);
    // Magnitudes are below 2^31: signed comparisons order them.
    const __m256i finite = _mm256_cmpgt_epi32(infinity, m);
    best = _mm256_max_epi32(best, _mm256_and_si256(m, finite));
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), best);
  const chunk_scale cs =
      scale_of(bits_to_float(absmax_tail(values, i, end, max_of(lanes))), 127.0f);
  const float inv = cs.inv;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i nan_code = _mm256_set1_epi32(int8_nan_code);
  for (i = begin; i + 8 <= end; i += 8) {
    const __m256 v = _mm256_loadu_ps(values + i);
    const __m256i finite =
        _mm256_cmpgt_epi32(infinity, _mm256_and_si256(_mm256_castps_si256(v), magnitude));
    __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(v, vinv));
    r = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
    r = _mm256_blendv_epi8(nan_code, r, finite);
    // 8 int32 in [-128, 127] to 8 bytes.
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(w, w));
  }
  for (; i < end; ++i)
    codes[i] = int8_code(values[i], cs.inv);
  return cs.scale;
}

/// decode_int8_avx512 with AVX2.
DROPIT_TARGET_AVX2 inline void decode_int8_avx2(const std::uint8_t* codes, float s,
                                                std::size_t begin, std::size_t end,
                                                float* values) noexcept {
  const __m256 vs = _mm256_set1_ps(s);
  const __m256 nan = _mm256_set1_ps(bits_to_float(0x7fc00000u));
  const __m256i nan_code = _mm256_set1_epi32(int8_nan_code);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256i c =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(c), vs);
    _mm256_storeu_ps(
        values + i, _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, nan_code))));
  }
  for (; i < end; ++i) {
    const auto c = static_cast<std::int8_t>(codes[i]);
    values[i] = c == int8_nan_code ? bits_to_float(0x7fc00000u) : static_cast<float>(c) * s;
  }
}

#endif  // DROPIT_HOST_X86

/// Encodes chunk c of k values on the host: the vector path for fp32 int8 to nearest where the
/// CPU has one, else the portable body.
template <class T>
void host_encode_chunk(const T* values, std::size_t k, std::size_t c, const codec_params& p,
                       std::uint8_t* codes, float* scales, host_isa isa) noexcept {
#if DROPIT_HOST_X86
  if constexpr (std::is_same_v<T, float>) {
    const std::size_t begin = c * codec_chunk;
    const std::size_t end = k - begin < codec_chunk ? k : begin + codec_chunk;
    if (p.kind == value_codec::int8 && !p.stochastic && isa != host_isa::baseline) {
      scales[c] = isa == host_isa::avx512 ? encode_int8_avx512(values, begin, end, codes)
                                          : encode_int8_avx2(values, begin, end, codes);
      return;
    }
    if (p.kind == value_codec::fp8_e4m3 && isa == host_isa::avx512) {
      scales[c] = encode_e4m3_avx512(values, begin, end, codes);
      return;
    }
  }
#endif
  (void)isa;
  encode_chunk(values, k, c, p, codes, scales);
}

/// Decodes chunk c of k values on the host, as host_encode_chunk.
template <class T>
void host_decode_chunk(const std::uint8_t* codes, const float* scales, std::size_t k, std::size_t c,
                       value_codec kind, T* values, host_isa isa) noexcept {
#if DROPIT_HOST_X86
  if constexpr (std::is_same_v<T, float>) {
    const std::size_t begin = c * codec_chunk;
    const std::size_t end = k - begin < codec_chunk ? k : begin + codec_chunk;
    if (kind == value_codec::fp8_e4m3 && isa == host_isa::avx512) {
      decode_e4m3_avx512(codes, scales[c], begin, end, values);
      return;
    }
    if (kind == value_codec::int8 && isa != host_isa::baseline) {
      if (isa == host_isa::avx512) {
        decode_int8_avx512(codes, scales[c], begin, end, values);
      } else {
        decode_int8_avx2(codes, scales[c], begin, end, values);
      }
      return;
    }
  }
#endif
  (void)isa;
  decode_chunk(codes, scales, k, c, kind, values);
}

}  // namespace dropit::detail
