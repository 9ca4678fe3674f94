/**
 * @file kernels_pool_relu.hpp
 * @brief Max pooling followed by ReLU, saved as one state: the ReLU's 1-bit mask of the pooled
 * outputs (kernels.hpp's convention: bit set where the gradient passes, !(y <= 0)) and the window
 * codes of those outputs only. An output the ReLU zeroes sends no gradient to its window, so its
 * code is never read: with p of the outputs passing, 1 + p x bits bits per output instead of
 * 1 + bits.
 *
 * Layout of the codes: the planes are cut into chunks (`pool_relu_chunks`) that start on a word of
 * both the mask and the dense code stream; each chunk's kept codes start on a word of their own,
 * at a 64-bit word offset stored in front of them, so chunks are independent tasks both ways.
 */
#pragma once

#include <dropit/detail/torch/kernels.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace dropit::torch::detail {

/// How the planes of a fused pooling + ReLU are cut into chunks.
struct pool_relu_chunks {
  std::int64_t planes_per_chunk;  ///< a multiple of the planes that fill whole words
  std::int64_t chunks;            ///< ceil(planes / planes_per_chunk)

  /// 32-bit words of the offsets in front of the codes (chunks + 1 offsets of 64 bits).
  [[nodiscard]] std::int64_t header_words() const noexcept { return 2 * (chunks + 1); }
};

/// Chunks of at least 8192 outputs whose first output starts a word of the mask and of the codes.
[[nodiscard]] inline pool_relu_chunks pool_relu_chunking(const pool_geometry& g) noexcept {
  const std::int64_t plane_out = g.oh * g.ow;
  const std::int64_t mask_group = 32 / std::gcd(plane_out, std::int64_t{32});
  const std::int64_t base = std::lcm(g.plane_group(), mask_group);
  const std::int64_t outputs = plane_out * base;
  const std::int64_t per = base * std::max<std::int64_t>(1, (8192 + outputs - 1) / outputs);
  return {per, (g.planes + per - 1) / per};
}

/// Set bits of the mask among outputs [o0, o1), o0 a multiple of 32.
[[nodiscard]] inline std::int64_t count_passing(const std::uint32_t* mask, std::int64_t o0,
                                                std::int64_t o1) noexcept {
  std::int64_t count = 0;
  std::int64_t w = o0 / 32;
  for (; (w + 1) * 32 <= o1; ++w)
    count += std::popcount(mask[w]);
  if (w * 32 < o1) count += std::popcount(mask[w] & ((1u << (o1 - w * 32)) - 1u));
  return count;
}

/// kept_codes2[m][c]: of four 2-bit codes c (code j in bits 2j, 2j + 1), those whose bit of m is
/// set, packed in order from bit 0.
inline constexpr auto kept_codes2 = [] {
  std::array<std::array<std::uint8_t, 256>, 16> table{};
  for (std::uint32_t m = 0; m < 16; ++m) {
    for (std::uint32_t c = 0; c < 256; ++c) {
      std::uint32_t kept = 0;
      int n = 0;
      for (int k = 0; k < 4; ++k) {
        if ((m >> k & 1u) != 0) kept |= (c >> 2 * k & 3u) << 2 * n++;
      }
      table[m][c] = static_cast<std::uint8_t>(kept);
    }
  }
  return table;
}();

/// The mask bits of outputs o .. o + 3 (bit j: output o + j), which exist.
[[nodiscard]] inline std::uint32_t mask_bits4(const std::uint32_t* mask, std::int64_t o) noexcept {
  const std::int64_t w = o >> 5;
  const int s = static_cast<int>(o & 31);
  std::uint64_t v = mask[w] >> s;
  if (s > 28) v |= static_cast<std::uint64_t>(mask[w + 1]) << (32 - s);
  return static_cast<std::uint32_t>(v) & 0xFu;
}

/// Appends to `out` the codes (`bits` each, from the dense stream of every output) of the outputs
/// in [o0, o1) whose mask bit is set, in output order; o0 a multiple of 32.
inline void compact_passing_codes(const std::uint32_t* dense, const std::uint32_t* mask,
                                  std::int64_t o0, std::int64_t o1, int bits,
                                  std::uint32_t* out) noexcept {
  bit_writer w(out);
  const std::uint32_t low = bits >= 32 ? ~0u : (1u << bits) - 1u;
  for (std::int64_t base = o0; base < o1; base += 32) {
    std::uint32_t m = mask[base / 32];
    if (o1 - base < 32) m &= (1u << (o1 - base)) - 1u;
    const std::uint32_t* d = dense + base / 32 * bits;  // 32 codes fill `bits` words
    if (m == ~0u) {  // all 32 pass: their codes as they are, a word at a time
      for (int i = 0; i < bits; ++i)
        w.put(d[i], 32);
      continue;
    }
    if (bits == 2) {  // 2x2 windows: four outputs (a byte of codes) at a time, by table
      std::uint64_t c = d[0];
      if (o1 - base > 16) c |= static_cast<std::uint64_t>(d[1]) << 32;
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t m4 = m >> 4 * j & 0xFu;
        w.put(kept_codes2[m4][c >> 8 * j & 0xFFu], 2 * std::popcount(m4));
      }
      continue;
    }
    while (m != 0) {
      const auto bit = static_cast<std::int64_t>(std::countr_zero(m)) * bits;
      m &= m - 1u;
      w.put(d[bit / 32] >> (bit % 32) & low, bits);
    }
  }
  w.finish();
}

/**
 * The gradient of one plane (`first`: the plane's first output index, for the mask): each output
 * whose mask bit is set sends its gradient to its window's maximum (its code is the next one of
 * `codes`); every other cell gets zero.
 */
template <class T>
void unpool_relu_plane(const T* grad, const std::uint32_t* mask, std::int64_t first,
                       bit_reader& codes, T* plane, const pool_geometry& g) {
  auto passes = [&](std::int64_t o) { return (mask[o >> 5] >> (o & 31) & 1u) != 0; };
  if (g.is_2x2()) {
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      T* r0 = plane + 2 * oy * g.w;
      T* r1 = r0 + g.w;
      const T* gr = grad + oy * g.ow;
      const std::int64_t row = first + oy * g.ow;
      std::int64_t ox = 0;
#if DROPIT_TORCH_SSE2
      if constexpr (std::is_same_v<T, float>) {
        // Four outputs at a time, as unpool2x2_plane: a zeroed output sends +0 (its code slot
        // is left 0 and its gradient made +0, so all four of its cells get +0).
        for (; ox + 4 <= g.ow; ox += 4) {
          const std::uint32_t m = mask_bits4(mask, row + ox);
          if (m == 0xFu) {
            unpool2x2_quad_sse2(gr + ox, codes.get(8), r0 + 2 * ox, r1 + 2 * ox);
            continue;
          }
          float passed[4];
          std::uint32_t quad = 0;
          for (int j = 0; j < 4; ++j) {
            const bool p = (m >> j & 1u) != 0;
            passed[j] = p ? gr[ox + j] : 0.0f;
            if (p) quad |= codes.get(2) << (2 * j);
          }
          unpool2x2_quad_sse2(passed, quad, r0 + 2 * ox, r1 + 2 * ox);
        }
      }
#endif
      for (; ox < g.ow; ++ox) {
        // A zeroed output gets code 4: no cell matches.
        const std::uint32_t code = passes(row + ox) ? codes.get(2) : 4u;
        r0[2 * ox] = code == 0 ? gr[ox] : T(0);
        r0[2 * ox + 1] = code == 1 ? gr[ox] : T(0);
        r1[2 * ox] = code == 2 ? gr[ox] : T(0);
        r1[2 * ox + 1] = code == 3 ? gr[ox] : T(0);
      }
      for (std::int64_t x = 2 * g.ow; x < g.w; ++x)
        r0[x] = r1[x] = T(0);
    }
    std::fill(plane + 2 * g.oh * g.w, plane + g.h * g.w, T(0));
    return;
  }
  const bool disjoint = g.disjoint();
  std::fill(plane, plane + g.h * g.w, T(0));
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      if (passes(first + oy * g.ow + ox))
        window_grad(plane, g, oy, ox, codes.get(g.bits), grad[oy * g.ow + ox], disjoint);
    }
  }
}

/**
 * Keeps, of the dense codes of every output (`dense`, pool_geometry's stream), those whose mask
 * bit is set: writes the chunks' word offsets (64-bit, chunks + 1 of them) then the codes into
 * `out` (`header_words() + offsets[chunks]` words, sized by `passing_code_words`).
 */
inline void compact_pool_relu_codes(const std::uint32_t* dense, const std::uint32_t* mask,
                                    const std::vector<std::uint64_t>& offsets,
                                    const pool_geometry& g, const pool_relu_chunks& c,
                                    std::uint32_t* out) {
  std::memcpy(out, offsets.data(), offsets.size() * sizeof(std::uint64_t));
  std::uint32_t* codes = out + c.header_words();
  const std::int64_t plane_out = g.oh * g.ow;
  const double chunk_ns = mask_ns_per_element * static_cast<double>(plane_out * c.planes_per_chunk);
  parallel_pieces(0, c.chunks, 1, chunk_ns, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t k = c0; k < c1; ++k) {
      const std::int64_t p0 = k * c.planes_per_chunk;
      const std::int64_t p1 = std::min(g.planes, p0 + c.planes_per_chunk);
      compact_passing_codes(dense, mask, p0 * plane_out, p1 * plane_out, g.bits,
                            codes + offsets[static_cast<std::size_t>(k)]);
    }
  });
}

/// The chunks' word offsets of the kept codes (chunks + 1 entries, the last the total).
[[nodiscard]] inline std::vector<std::uint64_t> passing_code_offsets(const std::uint32_t* mask,
                                                                     const pool_geometry& g,
                                                                     const pool_relu_chunks& c) {
  const std::int64_t plane_out = g.oh * g.ow;
  std::vector<std::uint64_t> offsets(static_cast<std::size_t>(c.chunks) + 1, 0);
  for (std::int64_t k = 0; k < c.chunks; ++k) {
    const std::int64_t p0 = k * c.planes_per_chunk;
    const std::int64_t p1 = std::min(g.planes, p0 + c.planes_per_chunk);
    const std::int64_t kept = count_passing(mask, p0 * plane_out, p1 * plane_out);
    offsets[static_cast<std::size_t>(k) + 1] =
        offsets[static_cast<std::size_t>(k)] +
        static_cast<std::uint64_t>((kept * g.bits + 31) / 32);
  }
  return offsets;
}

/// gx (planes x h x w) from gy and the saved mask and codes (`saved`: header, then codes).
template <class T>
void max_pool_relu_backward(const T* gy, const std::uint32_t* mask, const std::uint32_t* saved,
                            T* gx, const pool_geometry& g, const pool_relu_chunks& c) {
  const std::int64_t plane_in = g.h * g.w, plane_out = g.oh * g.ow;
  const std::uint32_t* codes = saved + c.header_words();
  const double chunk_ns = mask_ns_per_element * static_cast<double>(plane_in * c.planes_per_chunk);
  parallel_pieces(0, c.chunks, 1, chunk_ns, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t k = c0; k < c1; ++k) {
      std::uint64_t offset = 0;
      std::memcpy(&offset, saved + 2 * k, sizeof offset);
      bit_reader in(codes + offset);
      const std::int64_t p0 = k * c.planes_per_chunk;
      const std::int64_t p1 = std::min(g.planes, p0 + c.planes_per_chunk);
      for (std::int64_t p = p0; p < p1; ++p)
        unpool_relu_plane(gy + p * plane_out, mask, p * plane_out, in, gx + p * plane_in, g);
    }
  });
}

}  // namespace dropit::torch::detail
