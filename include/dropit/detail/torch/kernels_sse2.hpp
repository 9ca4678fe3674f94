/**
 * @file kernels_sse2.hpp
 * @brief SSE2 fast paths of the fp32 mask kernels (every x86-64 CPU has SSE2, so no -march flag
 * is needed): ReLU, LeakyReLU and Hardtanh with a 1-bit mask (forward and backward) and the 2x2
 * stride-2 max pooling with 2-bit codes. Each
 * produces exactly the bytes of the scalar kernels in kernels.hpp; the LibTorch tests compare
 * both against LibTorch's own ops.
 */
#pragma once

#if defined(__SSE2__)
#define DROPIT_TORCH_SSE2 1
#include <emmintrin.h>
#else
#define DROPIT_TORCH_SSE2 0
#endif

#include <cstdint>
#include <cstring>

namespace dropit::torch::detail {

/// Appends codes of any width (<= 32 bits) to consecutive 32-bit words.
class bit_writer {
 public:
  explicit bit_writer(std::uint32_t* out) noexcept : out_(out) {}
  void put(std::uint32_t value, int bits) noexcept {
    acc_ |= static_cast<std::uint64_t>(value) << fill_;
    fill_ += bits;
    if (fill_ >= 32) {
      *out_++ = static_cast<std::uint32_t>(acc_);
      acc_ >>= 32;
      fill_ -= 32;
    }
  }
  /// Writes the last, partial word (its unused high bits are zero).
  void finish() noexcept {
    if (fill_ > 0) *out_++ = static_cast<std::uint32_t>(acc_);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  std::uint32_t* out_;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
};

/// Reads codes of any width (<= 32 bits) back from consecutive 32-bit words.
class bit_reader {
 public:
  explicit bit_reader(const std::uint32_t* in) noexcept : in_(in) {}
  [[nodiscard]] std::uint32_t get(int bits) noexcept {
    if (fill_ < bits) {
      acc_ |= static_cast<std::uint64_t>(*in_++) << fill_;
      fill_ += 32;
    }
    const auto v =
        static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << bits) - 1));  // bits <= 32
    acc_ >>= bits;
    fill_ -= bits;
    return v;
  }

 private:
  const std::uint32_t* in_;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
};

#if DROPIT_TORCH_SSE2

/// The 32 outputs of a full mask word: y = x where !(x <= 0) (NaN passes), +0 elsewhere; returns
/// the mask (bit j: element j passes).
inline std::uint32_t relu_word_sse2(const float* x, float* y) noexcept {
  const __m128 zero = _mm_setzero_ps();
  std::uint32_t m = 0;
  for (int q = 0; q < 8; ++q) {
    const __m128 v = _mm_loadu_ps(x + 4 * q);
    const __m128 le = _mm_cmple_ps(v, zero);  // false for NaN
    _mm_storeu_ps(y + 4 * q, _mm_andnot_ps(le, v));
    m |= static_cast<std::uint32_t>(~_mm_movemask_ps(le) & 0xf) << (4 * q);
  }
  return m;
}

/// All-ones lanes where the nibble's bits are set.
inline __m128 nibble_lanes(std::uint32_t nibble) noexcept {
  const __m128i bit = _mm_set_epi32(8, 4, 2, 1);
  const __m128i n = _mm_set1_epi32(static_cast<int>(nibble));
  return _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(n, bit), bit));
}

/// out = g (1 when g is null) where the word's bits are set, +0 elsewhere, for 32 elements.
inline void select_word_sse2(const float* g, std::uint32_t m, float* out) noexcept {
  for (int q = 0; q < 8; ++q) {
    const __m128 v = g != nullptr ? _mm_loadu_ps(g + 4 * q) : _mm_set1_ps(1.0f);
    _mm_storeu_ps(out + 4 * q, _mm_and_ps(v, nibble_lanes(m >> (4 * q) & 0xfu)));
  }
}

/// lanes ? a : b.
inline __m128 blend_sse2(__m128 lanes, __m128 a, __m128 b) noexcept {
  return _mm_or_ps(_mm_and_ps(lanes, a), _mm_andnot_ps(lanes, b));
}

/// The 32 outputs of a full LeakyReLU word (y = x where x > 0, x * slope elsewhere, NaN * slope
/// for a NaN; y may be x, or null for the mask alone); returns the mask (bit j: x_j > 0).
inline std::uint32_t leaky_relu_word_sse2(const float* x, float* y, float slope) noexcept {
  const __m128 zero = _mm_setzero_ps(), s = _mm_set1_ps(slope);
  std::uint32_t m = 0;
  for (int q = 0; q < 8; ++q) {
    const __m128 v = _mm_loadu_ps(x + 4 * q);
    const __m128 gt = _mm_cmpgt_ps(v, zero);  // false for NaN
    if (y != nullptr) _mm_storeu_ps(y + 4 * q, blend_sse2(gt, v, _mm_mul_ps(v, s)));
    m |= static_cast<std::uint32_t>(_mm_movemask_ps(gt)) << (4 * q);
  }
  return m;
}

/// gx = g where the word's bits are set, g * slope elsewhere, for 32 elements (gx may be g).
inline void leaky_select_word_sse2(const float* g, std::uint32_t m, float slope,
                                   float* gx) noexcept {
  const __m128 s = _mm_set1_ps(slope);
  for (int q = 0; q < 8; ++q) {
    const __m128 v = _mm_loadu_ps(g + 4 * q);
    _mm_storeu_ps(gx + 4 * q, blend_sse2(nibble_lanes(m >> (4 * q) & 0xfu), v, _mm_mul_ps(v, s)));
  }
}

/// The 32 outputs of a full Hardtanh word (y = lo where x < lo, hi where x > hi, x elsewhere:
/// -0.0 and NaN pass; lo <= hi; y may be x, or null for the mask alone); returns the mask
/// (bit j: lo < x_j < hi).
inline std::uint32_t hardtanh_word_sse2(const float* x, float* y, float lo, float hi) noexcept {
  const __m128 a = _mm_set1_ps(lo), b = _mm_set1_ps(hi);
  std::uint32_t m = 0;
  for (int q = 0; q < 8; ++q) {
    const __m128 v = _mm_loadu_ps(x + 4 * q);
    if (y != nullptr) {
      const __m128 low = blend_sse2(_mm_cmplt_ps(v, a), a, v);
      _mm_storeu_ps(y + 4 * q, blend_sse2(_mm_cmplt_ps(b, v), b, low));
    }
    const __m128 inside = _mm_and_ps(_mm_cmpgt_ps(v, a), _mm_cmplt_ps(v, b));
    m |= static_cast<std::uint32_t>(_mm_movemask_ps(inside)) << (4 * q);
  }
  return m;
}

/// Bits 0..3 spread to bits 0, 2, 4, 6.
inline std::uint32_t spread4(std::uint32_t b) noexcept {
  return (b & 1u) | (b & 2u) << 1 | (b & 4u) << 2 | (b & 8u) << 3;
}

/**
 * Four outputs of a 2x2 stride-2 max pooling from rows r0, r1 (8 inputs each): their maxima to
 * `out` and their 2-bit codes (row-major window position, first strict maximum, a NaN always
 * replaces) packed in the low 8 bits of the result, output 0 lowest.
 */
inline std::uint32_t pool2x2_quad_sse2(const float* r0, const float* r1, float* out) noexcept {
  const __m128 a0 = _mm_loadu_ps(r0), a1 = _mm_loadu_ps(r0 + 4);
  const __m128 b0 = _mm_loadu_ps(r1), b1 = _mm_loadu_ps(r1 + 4);
  const __m128 c[4] = {_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)),
                       _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1))};
  __m128 best = c[0];
  __m128 bit0 = _mm_setzero_ps(), bit1 = _mm_setzero_ps();  // the code's two bits, as lanes
  for (int k = 1; k < 4; ++k) {
    const __m128 take = _mm_or_ps(_mm_cmpgt_ps(c[k], best), _mm_cmpunord_ps(c[k], c[k]));
    best = _mm_or_ps(_mm_and_ps(take, c[k]), _mm_andnot_ps(take, best));
    // code = take ? k : code, one bit at a time.
    bit0 = (k & 1) != 0 ? _mm_or_ps(bit0, take) : _mm_andnot_ps(take, bit0);
    bit1 = (k & 2) != 0 ? _mm_or_ps(bit1, take) : _mm_andnot_ps(take, bit1);
  }
  _mm_storeu_ps(out, best);
  return spread4(static_cast<std::uint32_t>(_mm_movemask_ps(bit0))) |
         spread4(static_cast<std::uint32_t>(_mm_movemask_ps(bit1))) << 1;
}

/**
 * Scatters four outputs' gradients g[0..4) to their 2x2 windows (8 cells in each of rows r0, r1),
 * zeros in the other cells; `codes` holds the four 2-bit codes, output 0 lowest.
 */
inline void unpool2x2_quad_sse2(const float* g, std::uint32_t codes, float* r0,
                                float* r1) noexcept {
  const __m128 v = _mm_loadu_ps(g);
  const __m128i code =
      _mm_set_epi32(static_cast<int>(codes >> 6 & 3u), static_cast<int>(codes >> 4 & 3u),
                    static_cast<int>(codes >> 2 & 3u), static_cast<int>(codes & 3u));
  __m128 cell[4];
  for (int k = 0; k < 4; ++k) {
    cell[k] = _mm_and_ps(v, _mm_castsi128_ps(_mm_cmpeq_epi32(code, _mm_set1_epi32(k))));
  }
  _mm_storeu_ps(r0, _mm_unpacklo_ps(cell[0], cell[1]));
  _mm_storeu_ps(r0 + 4, _mm_unpackhi_ps(cell[0], cell[1]));
  _mm_storeu_ps(r1, _mm_unpacklo_ps(cell[2], cell[3]));
  _mm_storeu_ps(r1 + 4, _mm_unpackhi_ps(cell[2], cell[3]));
}

#endif  // DROPIT_TORCH_SSE2

}  // namespace dropit::torch::detail
