/**
 * @file kernels_wide.hpp
 * @brief AVX2 and AVX-512 paths of the fp32 mask kernels, chosen at run time like the host
 * executor's (detail/host/isa.hpp: `target` attributes, no -march flag): a ReLU's mask with or
 * without its output, and a mask's expansion into the gradient or into 0/1 values. Each works on
 * whole 32-element mask words and writes exactly the bytes of the scalar and SSE2 kernels
 * (kernels.hpp); the LibTorch tests run every instruction set against LibTorch's own ops.
 */
#pragma once

#include <dropit/detail/host/isa.hpp>

#include <cstdint>

namespace dropit::torch::detail {

#if DROPIT_HOST_X86

DROPIT_AVX512_WARNINGS_OFF

/// Words [w0, w1): bit j of words[w] = !(x[32 w + j] <= 0) (NaN passes); y (when not null) =
/// x where the bit is set, +0 elsewhere (y may be x).
DROPIT_TARGET_AVX512 inline void relu_words_avx512(const float* x, float* y, std::uint32_t* words,
                                                   std::int64_t w0, std::int64_t w1) noexcept {
  const __m512 zero = _mm512_setzero_ps();
  for (std::int64_t w = w0; w < w1; ++w) {
    const float* in = x + 32 * w;
    const __m512 a = _mm512_loadu_ps(in);
    const __m512 b = _mm512_loadu_ps(in + 16);
    const __mmask16 ma = _mm512_cmp_ps_mask(a, zero, _CMP_NLE_UQ);
    const __mmask16 mb = _mm512_cmp_ps_mask(b, zero, _CMP_NLE_UQ);
    if (y != nullptr) {
      _mm512_storeu_ps(y + 32 * w, _mm512_maskz_mov_ps(ma, a));
      _mm512_storeu_ps(y + 32 * w + 16, _mm512_maskz_mov_ps(mb, b));
    }
    words[w] = static_cast<std::uint32_t>(ma) | static_cast<std::uint32_t>(mb) << 16;
  }
}

/// Words [w0, w1): out = g (or 1 when g is null) where the bit is set, +0 elsewhere.
DROPIT_TARGET_AVX512 inline void select_words_avx512(const float* g, const std::uint32_t* words,
                                                     float* out, std::int64_t w0,
                                                     std::int64_t w1) noexcept {
  const __m512 ones = _mm512_set1_ps(1.0f);
  for (std::int64_t w = w0; w < w1; ++w) {
    const std::uint32_t m = words[w];
    const auto lo = static_cast<__mmask16>(m), hi = static_cast<__mmask16>(m >> 16);
    const __m512 a =
        g != nullptr ? _mm512_maskz_loadu_ps(lo, g + 32 * w) : _mm512_maskz_mov_ps(lo, ones);
    const __m512 b =
        g != nullptr ? _mm512_maskz_loadu_ps(hi, g + 32 * w + 16) : _mm512_maskz_mov_ps(hi, ones);
    _mm512_storeu_ps(out + 32 * w, a);
    _mm512_storeu_ps(out + 32 * w + 16, b);
  }
}

DROPIT_AVX512_WARNINGS_ON

/// All-ones lanes of an 8-lane vector where bits 0..7 of m are set.
DROPIT_TARGET_AVX2 inline __m256 lanes_of_byte(std::uint32_t m) noexcept {
  const __m256i bit = _mm256_set_epi32(128, 64, 32, 16, 8, 4, 2, 1);
  const __m256i v = _mm256_set1_epi32(static_cast<int>(m));
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(v, bit), bit));
}

/// relu_words_avx512 with AVX2.
DROPIT_TARGET_AVX2 inline void relu_words_avx2(const float* x, float* y, std::uint32_t* words,
                                               std::int64_t w0, std::int64_t w1) noexcept {
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t w = w0; w < w1; ++w) {
    std::uint32_t m = 0;
    for (int q = 0; q < 4; ++q) {
      const __m256 v = _mm256_loadu_ps(x + 32 * w + 8 * q);
      const __m256 pass = _mm256_cmp_ps(v, zero, _CMP_NLE_UQ);
      if (y != nullptr) _mm256_storeu_ps(y + 32 * w + 8 * q, _mm256_and_ps(pass, v));
      m |= static_cast<std::uint32_t>(_mm256_movemask_ps(pass)) << (8 * q);
    }
    words[w] = m;
  }
}

/// select_words_avx512 with AVX2.
DROPIT_TARGET_AVX2 inline void select_words_avx2(const float* g, const std::uint32_t* words,
                                                 float* out, std::int64_t w0,
                                                 std::int64_t w1) noexcept {
  const __m256 ones = _mm256_set1_ps(1.0f);
  for (std::int64_t w = w0; w < w1; ++w) {
    const std::uint32_t m = words[w];
    for (int q = 0; q < 4; ++q) {
      const __m256 v = g != nullptr ? _mm256_loadu_ps(g + 32 * w + 8 * q) : ones;
      _mm256_storeu_ps(out + 32 * w + 8 * q, _mm256_and_ps(lanes_of_byte(m >> (8 * q)), v));
    }
  }
}

#endif  // DROPIT_HOST_X86

/**
 * The ReLU mask (and output, when y is not null) of whole words [w0, w1) with the widest
 * instruction set this CPU has (dropit::detail::active_host_isa); returns the first word it left
 * to the caller's SSE2/scalar loop (w0 where no wide path applies).
 */
inline std::int64_t relu_words_wide(const float* x, float* y, std::uint32_t* words, std::int64_t w0,
                                    std::int64_t w1) noexcept {
#if DROPIT_HOST_X86
  switch (dropit::detail::active_host_isa()) {
    case dropit::detail::host_isa::avx512:
      relu_words_avx512(x, y, words, w0, w1);
      return w1;
    case dropit::detail::host_isa::avx2:
      relu_words_avx2(x, y, words, w0, w1);
      return w1;
    default:
      break;
  }
#else
  (void)x, (void)y, (void)words, (void)w1;
#endif
  return w0;
}

/// out = g (1 when g is null) where the mask is set, +0 elsewhere, for whole words [w0, w1), as
/// `relu_words_wide`.
inline std::int64_t select_words_wide(const float* g, const std::uint32_t* words, float* out,
                                      std::int64_t w0, std::int64_t w1) noexcept {
#if DROPIT_HOST_X86
  switch (dropit::detail::active_host_isa()) {
    case dropit::detail::host_isa::avx512:
      select_words_avx512(g, words, out, w0, w1);
      return w1;
    case dropit::detail::host_isa::avx2:
      select_words_avx2(g, words, out, w0, w1);
      return w1;
    default:
      break;
  }
#else
  (void)g, (void)words, (void)out, (void)w1;
#endif
  return w0;
}

}  // namespace dropit::torch::detail
