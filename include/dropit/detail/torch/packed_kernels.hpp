/**
 * @file packed_kernels.hpp
 * @brief CPU kernels of the saved-tensor packs (torch/packed.hpp): the mask of a ReLU's output and
 * its expansion back to 0/1 values, and max-pooling indices to window codes and back.
 *
 * Masks use the packed format's bitmask convention (bit j of word w describes element 32 w + j);
 * pooling codes use `pool_geometry`'s layout (one bit stream over the planes).
 */
#pragma once

#include <dropit/detail/torch/kernels.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dropit::torch::detail {

/// words[w] bit j = !(y[32 w + j] <= 0): where ReLU's backward passes the gradient.
template <class T>
void positive_mask(const T* y, std::uint32_t* words, std::int64_t n) {
  auto wide = [&](std::int64_t w0, std::int64_t w1) {
    if constexpr (std::is_same_v<T, float>) return relu_words_wide(y, nullptr, words, w0, w1);
    return w0;
  };
  for_each_mask_word(n, wide, [&](std::int64_t w, std::int64_t base, int count) {
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        const __m128 zero = _mm_setzero_ps();
        std::uint32_t m = 0;
        for (int q = 0; q < 8; ++q) {
          const __m128 le = _mm_cmple_ps(_mm_loadu_ps(y + base + 4 * q), zero);  // NaN: false
          m |= static_cast<std::uint32_t>(~_mm_movemask_ps(le) & 0xf) << (4 * q);
        }
        words[w] = m;
        return;
      }
    }
#endif
    std::uint32_t m = 0;
    for (int j = 0; j < count; ++j)
      m |= static_cast<std::uint32_t>(!(static_cast<acc_t<T>>(y[base + j]) <= acc_t<T>(0))) << j;
    words[w] = m;
  });
}

/// out[i] = 1 where bit i is set, 0 elsewhere.
template <class T>
void expand_mask(const std::uint32_t* words, T* out, std::int64_t n) {
  select_by_mask(static_cast<const T*>(nullptr), words, out, n);
}

/// out[i] = on where bit i is set, off elsewhere.
template <class T>
void expand_mask_two_valued(const std::uint32_t* words, T* out, std::int64_t n, T on, T off) {
  for_each_mask_word(n, no_wide_words, [&](std::int64_t w, std::int64_t base, int count) {
    const std::uint32_t m = words[w];
    for (int j = 0; j < count; ++j)
      out[base + j] = (m >> j & 1u) != 0 ? on : off;
  });
}

/// out[i] = 1 where bit i is set, 0 elsewhere, one byte per element (a bool tensor's storage):
/// each byte of the mask becomes 8 output bytes from a 256-entry table.
inline void expand_mask_bytes(const std::uint32_t* words, std::uint8_t* out, std::int64_t n) {
  static constexpr auto table = [] {
    std::array<std::uint64_t, 256> t{};
    for (std::uint32_t b = 0; b < 256; ++b)
      for (unsigned j = 0; j < 8; ++j)
        t[b] |= static_cast<std::uint64_t>(b >> j & 1u) << (8 * j);
    return t;
  }();
  static_assert(std::endian::native == std::endian::little, "the table's bytes are little-endian");
  auto spread8 = [](std::uint32_t b) noexcept { return table[b & 0xffu]; };
  at::parallel_for(0, (n + 31) / 32, 2048, [&](std::int64_t w0, std::int64_t w1) {
    for (std::int64_t w = w0; w < w1; ++w) {
      const std::uint32_t m = words[w];
      const std::int64_t base = w * 32;
      if (base + 32 <= n) {
        for (int byte = 0; byte < 4; ++byte) {
          const std::uint64_t v = spread8(m >> (8 * byte));
          std::memcpy(out + base + 8 * byte, &v, 8);
        }
      } else {
        for (std::int64_t j = 0; base + j < n; ++j)
          out[base + j] = static_cast<std::uint8_t>(m >> j & 1u);
      }
    }
  });
}

/// Bits 0..15 of b spread to the even bits 0, 2, ..., 30.
[[nodiscard]] inline std::uint32_t spread16(std::uint32_t b) noexcept {
  b = (b | b << 8) & 0x00ff00ffu;
  b = (b | b << 4) & 0x0f0f0f0fu;
  b = (b | b << 2) & 0x33333333u;
  return (b | b << 1) & 0x55555555u;
}

/// The index of each output's window origin (top-left cell) in a plane of a 2x2, stride-2,
/// unpadded pooling, outputs in row-major order.
[[nodiscard]] inline std::vector<std::int32_t> pool2x2_origins(const pool_geometry& g) {
  std::vector<std::int32_t> origin(static_cast<std::size_t>(g.oh * g.ow));
  for (std::int64_t oy = 0; oy < g.oh; ++oy)
    for (std::int64_t ox = 0; ox < g.ow; ++ox)
      origin[static_cast<std::size_t>(oy * g.ow + ox)] =
          static_cast<std::int32_t>(2 * oy * g.w + 2 * ox);
  return origin;
}

/// The 2-bit code of one output of a 2x2 window at `origin` (2 row + column); false when the
/// index is not one of the window's cells.
[[nodiscard]] inline std::uint32_t pool2x2_code(std::int64_t index, std::int64_t origin,
                                                std::int64_t w, bool& good) noexcept {
  const std::int64_t r = index - origin;
  const std::int64_t row = r >= w;
  const std::int64_t col = r - row * w;
  good &= (r >= 0) & (col >= 0) & (col <= 1);
  return static_cast<std::uint32_t>(row << 1 | (col & 1));
}

#if DROPIT_TORCH_SSE2
/**
 * The 2-bit codes of 16 outputs of a 2x2, stride-2 pooling whose windows start at origin[0..16),
 * packed output 0 lowest. Clears `ok` when an index is not one of its window's four cells. Indices
 * are compared on their low 32 bits; `high` collects the high halves, which the caller checks
 * are all zero.
 */
inline std::uint32_t pool2x2_codes16_sse2(const std::int64_t* idx, const std::int32_t* origin,
                                          std::int32_t w, std::uint32_t& ok,
                                          __m128i& high) noexcept {
  const __m128i zero = _mm_setzero_si128(), one = _mm_set1_epi32(1);
  const __m128i wv = _mm_set1_epi32(w), w1 = _mm_set1_epi32(w + 1);
  std::uint32_t row1 = 0, col1 = 0, valid = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128 a =
        _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(idx + 4 * q)));
    const __m128 b =
        _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(idx + 4 * q + 2)));
    const __m128i low = _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    high = _mm_or_si128(high, _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
    const __m128i r =
        _mm_sub_epi32(low, _mm_loadu_si128(reinterpret_cast<const __m128i*>(origin + 4 * q)));
    const __m128i is0 = _mm_cmpeq_epi32(r, zero), is1 = _mm_cmpeq_epi32(r, one);
    const __m128i isw = _mm_cmpeq_epi32(r, wv), isw1 = _mm_cmpeq_epi32(r, w1);
    const __m128i bit1 = _mm_or_si128(isw, isw1);
    const __m128i bit0 = _mm_or_si128(is1, isw1);
    const __m128i good = _mm_or_si128(_mm_or_si128(is0, is1), bit1);
    row1 |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(bit1))) << (4 * q);
    col1 |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(bit0))) << (4 * q);
    valid |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(good))) << (4 * q);
  }
  ok &= static_cast<std::uint32_t>(valid == 0xffffu);
  return spread16(col1) | spread16(row1) << 1;
}

/// The int64 indices of 16 outputs from their 2-bit codes (the inverse of pool2x2_codes16_sse2).
inline void pool2x2_indices16_sse2(std::uint32_t codes, const std::int32_t* origin, std::int32_t w,
                                   std::int64_t* idx) noexcept {
  const __m128i zero = _mm_setzero_si128(), one = _mm_set1_epi32(1), wv = _mm_set1_epi32(w);
  const __m128i col_bit = _mm_setr_epi32(1, 4, 16, 64), row_bit = _mm_setr_epi32(2, 8, 32, 128);
  for (int q = 0; q < 4; ++q) {
    const __m128i c = _mm_set1_epi32(static_cast<int>(codes >> (8 * q) & 0xffu));
    const __m128i col = _mm_cmpeq_epi32(_mm_and_si128(c, col_bit), col_bit);
    const __m128i row = _mm_cmpeq_epi32(_mm_and_si128(c, row_bit), row_bit);
    const __m128i at =
        _mm_add_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(origin + 4 * q)),
                      _mm_add_epi32(_mm_and_si128(col, one), _mm_and_si128(row, wv)));
    // Non-negative, below 2^31: zero-extended to int64.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + 4 * q), _mm_unpacklo_epi32(at, zero));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + 4 * q + 2), _mm_unpackhi_epi32(at, zero));
  }
}
#endif

/// The window code of one output of a general window whose origin is (y0, x0); false when the
/// index is not one of the window's cells. No division: a window has at most a few rows.
[[nodiscard]] inline std::uint32_t pool_code(std::int64_t index, std::int64_t y0, std::int64_t x0,
                                             const pool_geometry& g, bool& good) noexcept {
  for (std::int64_t i = 0; i < g.kh; ++i) {
    const std::int64_t y = y0 + i * g.dh;
    if (y < 0 || y >= g.h || index < y * g.w || index >= (y + 1) * g.w) continue;
    const std::int64_t dx = index - y * g.w - x0;
    if (dx >= 0 && dx % g.dw == 0 && dx / g.dw < g.kw) {
      return static_cast<std::uint32_t>(i * g.kw + dx / g.dw);
    }
    break;
  }
  good = false;
  return 0;
}

/**
 * Window codes of the int64 argmax indices of a max pooling (planes x oh x ow, contiguous; each
 * index `y * w + x` within its plane) into `codes` (pool_geometry's layout). Returns false when an
 * index lies outside its window (nothing LibTorch produces; the codes are then meaningless).
 */
inline bool encode_pool_indices(const std::int64_t* indices, std::uint32_t* codes,
                                const pool_geometry& g) {
  const std::int64_t plane_out = g.oh * g.ow;
  const bool two = g.is_2x2();
  // The vector path works on 32-bit indices.
  [[maybe_unused]] const bool sse2 = two && g.h * g.w < (std::int64_t{1} << 30);
  const std::vector<std::int32_t> origin = two ? pool2x2_origins(g) : std::vector<std::int32_t>{};
  std::atomic<bool> ok{true};
  const double plane_ns = mask_ns_per_element * static_cast<double>(plane_out);
  for_each_plane_piece(g, plane_ns, [&](std::int64_t p0, std::int64_t p1, std::int64_t word) {
    bool good = true;
#if DROPIT_TORCH_SSE2
    std::uint32_t sse2_ok = 1;
    __m128i high = _mm_setzero_si128();
#endif
    bit_writer out(codes + word);
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t* ind = indices + p * plane_out;
      if (two) {
        std::int64_t o = 0;
#if DROPIT_TORCH_SSE2
        if (sse2) {
          for (; o + 16 <= plane_out; o += 16) {
            out.put(pool2x2_codes16_sse2(ind + o, origin.data() + o, static_cast<std::int32_t>(g.w),
                                         sse2_ok, high),
                    32);
          }
        }
#endif
        for (; o < plane_out; ++o)
          out.put(pool2x2_code(ind[o], origin[static_cast<std::size_t>(o)], g.w, good), 2);
      } else {
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          for (std::int64_t ox = 0; ox < g.ow; ++ox) {
            out.put(pool_code(ind[oy * g.ow + ox], oy * g.sh - g.ph, ox * g.sw - g.pw, g, good),
                    g.bits);
          }
        }
      }
    }
    out.finish();
#if DROPIT_TORCH_SSE2
    good &= sse2_ok == 1 && _mm_movemask_epi8(_mm_cmpeq_epi32(high, _mm_setzero_si128())) == 0xffff;
#endif
    if (!good) ok.store(false, std::memory_order_relaxed);
  });
  return ok.load(std::memory_order_relaxed);
}

/// The int64 indices back from `encode_pool_indices`'s codes.
inline void decode_pool_indices(const std::uint32_t* codes, std::int64_t* indices,
                                const pool_geometry& g) {
  const std::int64_t plane_out = g.oh * g.ow;
  const bool two = g.is_2x2();
  [[maybe_unused]] const bool sse2 = two && g.h * g.w < (std::int64_t{1} << 30);
  const std::vector<std::int32_t> origin = two ? pool2x2_origins(g) : std::vector<std::int32_t>{};
  // Offset of each window position from the window's origin.
  std::vector<std::int64_t> offset(static_cast<std::size_t>(g.kh * g.kw));
  for (std::int64_t c = 0; c < g.kh * g.kw; ++c)
    offset[static_cast<std::size_t>(c)] = c / g.kw * g.dh * g.w + c % g.kw * g.dw;
  const double plane_ns = mask_ns_per_element * static_cast<double>(plane_out);
  for_each_plane_piece(g, plane_ns, [&](std::int64_t p0, std::int64_t p1, std::int64_t word) {
    bit_reader in(codes + word);
    for (std::int64_t p = p0; p < p1; ++p) {
      std::int64_t* ind = indices + p * plane_out;
      if (two) {
        std::int64_t o = 0;
#if DROPIT_TORCH_SSE2
        if (sse2) {
          for (; o + 16 <= plane_out; o += 16) {
            pool2x2_indices16_sse2(in.get(32), origin.data() + o, static_cast<std::int32_t>(g.w),
                                   ind + o);
          }
        }
#endif
        for (; o < plane_out; ++o)
          ind[o] = origin[static_cast<std::size_t>(o)] + offset[in.get(2)];
        continue;
      }
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const std::int64_t y0 = oy * g.sh - g.ph;
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const std::int64_t at = y0 * g.w + ox * g.sw - g.pw;
          ind[oy * g.ow + ox] = at + offset[in.get(g.bits)];
        }
      }
    }
  });
}

}  // namespace dropit::torch::detail
