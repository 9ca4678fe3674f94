/**
 * @file kernels.hpp
 * @brief CPU kernels of the mask-saving ops: ReLU and LeakyReLU with a 1-bit mask, max pooling
 * with the window-relative position of each maximum in a few bits. Masks use the packed format's
 * bitmask convention: bit j of 32-bit word w describes element 32 w + j.
 *
 * The loops are branch-free (a select is a bitwise AND with an all-ones or all-zeros word), so
 * they run at memory speed whatever the sign pattern of the data; fp32 takes SSE2 paths
 * (kernels_sse2.hpp) for whole mask words and groups of four pooling windows, without -march
 * flags.
 */
#pragma once

#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/torch/kernels_sse2.hpp>
#include <dropit/detail/torch/kernels_wide.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

namespace dropit::torch::detail {

/// Arithmetic type of a LibTorch element type: double for double, float otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// v in T, through acc_t<T> (float for the 16-bit types, whose constructors take a float).
template <class T>
inline T from_double(double v) noexcept {
  return static_cast<T>(static_cast<acc_t<T>>(v));
}

/// The unsigned integer as wide as T.
template <class T>
using bits_t = std::conditional_t<sizeof(T) == 8, std::uint64_t,
                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>>;

/// v where keep is 1, +0 where it is 0 (branch-free).
template <class T>
inline T keep_or_zero(T v, std::uint32_t keep) noexcept {
  bits_t<T> b;
  std::memcpy(&b, &v, sizeof b);
  b = static_cast<bits_t<T>>(b & (bits_t<T>{0} - static_cast<bits_t<T>>(keep)));
  T out;
  std::memcpy(&out, &b, sizeof b);
  return out;
}

/// Words per parallel task of the mask kernels (32 Ki elements).
inline constexpr std::int64_t mask_grain_words = 1024;

/// Serial cost of the mask kernels, ns per element, for the fork decision: one thread, fp32, on
/// the 2-core development machine, as they run in training: a ReLU forward of 1.1 M elements
/// ([2176, 512]) into a fresh output takes 0.38 ns per element (the output's pages are new).
/// At 0.1 (the kernels on warm memory) the mask ops at 2^20 stayed on one thread: 1.4-1.6x
/// LibTorch's time, 0.82-0.99x at 0.4 (bench/README.md).
inline constexpr double mask_ns_per_element = 0.4;

/**
 * Calls f(b, e) over pieces of [begin, end) on LibTorch's thread count, pieces of at least `grain`
 * items, or once over all of it on the caller when forking would cost more than the other
 * threads save (`ns_per_item` of work each on one thread; dropit's fork_meter measures what a
 * fork-join costs here, e.g. tens of microseconds with sleeping OpenMP threads). The pieces run
 * on dropit's fork-join (OpenMP when compiled with it: LibTorch's threads), which measures them.
 */
template <class F>
void parallel_pieces(std::int64_t begin, std::int64_t end, std::int64_t grain, double ns_per_item,
                     const F& f) {
  if (begin >= end) return;
  const std::int64_t items = end - begin;
  const std::int64_t pieces = (items + grain - 1) / grain;
  const auto threads = static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(at::get_num_threads(), pieces)));
  if (threads <= 1 || at::in_parallel_region() ||
      !dropit::detail::fork_meter::pays(threads, ns_per_item * static_cast<double>(items), 1)) {
    f(begin, end);
    return;
  }
  dropit::detail::parallel_for(threads, static_cast<std::size_t>(pieces),
                               [&](std::size_t p0, std::size_t p1, unsigned) {
                                 f(begin + static_cast<std::int64_t>(p0) * grain,
                                   std::min(end, begin + static_cast<std::int64_t>(p1) * grain));
                               });
}

/// The outputs and mask of elements [base, base + count) of a ReLU, count <= 32.
template <class T>
inline std::uint32_t relu_word(const T* xs, T* ys, int count) noexcept {
  std::uint32_t m = 0;
  for (int j = 0; j < count; ++j) {
    const std::uint32_t pass = !(static_cast<acc_t<T>>(xs[j]) <= acc_t<T>(0));
    ys[j] = keep_or_zero(xs[j], pass);
    m |= pass << j;
  }
  return m;
}

/// Calls f(w, base, count) for every 32-element mask word of n elements (base = 32 w, count <=
/// 32 elements) that `wide(w0, w1)` leaves (it gets the whole words of each parallel piece and
/// returns the first word it did not do), in pieces of `mask_grain_words` words.
template <class Wide, class F>
void for_each_mask_word(std::int64_t n, const Wide& wide, const F& f) {
  const std::int64_t nw = (n + 31) / 32, full = n / 32;
  parallel_pieces(0, nw, mask_grain_words, 32 * mask_ns_per_element,
                  [&](std::int64_t w0, std::int64_t w1) {
                    for (std::int64_t w = wide(w0, std::min(w1, full)); w < w1; ++w) {
                      const std::int64_t base = w * 32;
                      f(w, base, static_cast<int>(std::min<std::int64_t>(32, n - base)));
                    }
                  });
}

/// y = relu(x) and the mask !(x <= 0) (x > 0, or NaN: where LibTorch passes the gradient).
template <class T>
void relu_mask_forward(const T* x, T* y, std::uint32_t* words, std::int64_t n) {
  auto wide = [&](std::int64_t w0, std::int64_t w1) {
    if constexpr (std::is_same_v<T, float>) return relu_words_wide(x, y, words, w0, w1);
    return w0;
  };
  for_each_mask_word(n, wide, [&](std::int64_t w, std::int64_t base, int count) {
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        words[w] = relu_word_sse2(x + base, y + base);
        return;
      }
    }
#endif
    words[w] = relu_word(x + base, y + base, count);
  });
}

/// out = g where the mask is set, +0 elsewhere; with g null, 1 where it is set (a mask's 0/1
/// expansion).
template <class T>
void select_by_mask(const T* g, const std::uint32_t* words, T* out, std::int64_t n) {
  auto wide = [&](std::int64_t w0, std::int64_t w1) {
    if constexpr (std::is_same_v<T, float>) return select_words_wide(g, words, out, w0, w1);
    return w0;
  };
  const T one = static_cast<T>(1.0f);
  for_each_mask_word(n, wide, [&](std::int64_t w, std::int64_t base, int count) {
    const std::uint32_t m = words[w];
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        select_word_sse2(g != nullptr ? g + base : nullptr, m, out + base);
        return;
      }
    }
#endif
    for (int j = 0; j < count; ++j)
      out[base + j] = keep_or_zero(g != nullptr ? g[base + j] : one, m >> j & 1u);
  });
}

/// Words of a mask kernel with no SIMD path (every word goes through the scalar loop).
inline constexpr auto no_wide_words = [](std::int64_t w0, std::int64_t) { return w0; };

/// y = LeakyReLU(x) as LibTorch computes it (x > 0 ? x : x * slope in acc_t<T>, so NaN * slope
/// for a NaN) and the mask x > 0 (where LibTorch's gradient passes g unscaled). y may be x, or
/// null for the mask alone. Both results are computed for every element and selected without a
/// branch: signs are random, a branch per element mispredicts half the time.
template <class T>
void leaky_relu_mask_forward(const T* x, T* y, acc_t<T> slope, std::uint32_t* words,
                             std::int64_t n) {
  for_each_mask_word(n, no_wide_words, [&](std::int64_t w, std::int64_t base, int count) {
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        words[w] = leaky_relu_word_sse2(x + base, y != nullptr ? y + base : nullptr, slope);
        return;
      }
    }
#endif
    std::uint32_t m = 0;
    if (y == nullptr) {
      for (int j = 0; j < count; ++j)
        m |= static_cast<std::uint32_t>(static_cast<acc_t<T>>(x[base + j]) > acc_t<T>(0)) << j;
    } else {
      for (int j = 0; j < count; ++j) {
        const T xv = x[base + j];
        const acc_t<T> v = static_cast<acc_t<T>>(xv);
        const bool pass = v > acc_t<T>(0);
        const T scaled = static_cast<T>(v * slope);
        y[base + j] = pass ? xv : scaled;
        m |= static_cast<std::uint32_t>(pass) << j;
      }
    }
    words[w] = m;
  });
}

/// gx = g where the mask is set, g * slope (in acc_t<T>) elsewhere: LibTorch's
/// leaky_relu_backward. gx may be g. Branch-free as the forward.
template <class T>
void leaky_relu_mask_backward(const T* g, const std::uint32_t* words, acc_t<T> slope, T* gx,
                              std::int64_t n) {
  for_each_mask_word(n, no_wide_words, [&](std::int64_t w, std::int64_t base, int count) {
    const std::uint32_t m = words[w];
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        leaky_select_word_sse2(g + base, m, slope, gx + base);
        return;
      }
    }
#endif
    for (int j = 0; j < count; ++j) {
      const T v = g[base + j];
      const T scaled = static_cast<T>(static_cast<acc_t<T>>(v) * slope);
      gx[base + j] = (m >> j & 1u) != 0 ? v : scaled;
    }
  });
}

/// y = Hardtanh(x) as LibTorch computes it (min(max(x, lo), hi) with the bounds in T: -0.0 and
/// NaN pass through) and the mask lo < x < hi (where its gradient passes; not at a bound, not for
/// NaN). y may be x, or null for the mask alone. Branch-free, as LeakyReLU's.
template <class T>
void hardtanh_mask_forward(const T* x, T* y, T lo, T hi, std::uint32_t* words, std::int64_t n) {
  const auto a = static_cast<acc_t<T>>(lo), b = static_cast<acc_t<T>>(hi);
  for_each_mask_word(n, no_wide_words, [&](std::int64_t w, std::int64_t base, int count) {
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      if (count == 32) {
        words[w] = hardtanh_word_sse2(x + base, y != nullptr ? y + base : nullptr, lo, hi);
        return;
      }
    }
#endif
    std::uint32_t m = 0;
    if (y == nullptr) {
      for (int j = 0; j < count; ++j) {
        const auto f = static_cast<acc_t<T>>(x[base + j]);
        m |= static_cast<std::uint32_t>(f > a && f < b) << j;
      }
    } else {
      for (int j = 0; j < count; ++j) {
        const T v = x[base + j];
        const auto f = static_cast<acc_t<T>>(v);
        const T low = f < a ? lo : v;  // a <= b: at most one bound applies
        y[base + j] = b < f ? hi : low;
        m |= static_cast<std::uint32_t>(f > a && f < b) << j;
      }
    }
    words[w] = m;
  });
}

/**
 * The geometry of one 2-d max pooling over `planes` contiguous h x w planes. The codes of all
 * planes form one bit stream (plane p's start at bit p * plane_bits(), no padding between planes);
 * a group of `plane_group()` consecutive planes fills whole 32-bit words, so groups of planes are
 * independent tasks.
 */
struct pool_geometry {
  std::int64_t planes, h, w, oh, ow;  ///< input planes (N * C), input and output sizes
  std::int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int bits;  ///< bits per output code: a power of two >= bit_width(kh * kw - 1)

  /// Bits of one plane's codes.
  [[nodiscard]] std::int64_t plane_bits() const noexcept { return oh * ow * bits; }
  /// The fewest consecutive planes whose codes end on a word boundary (1 to 32).
  [[nodiscard]] std::int64_t plane_group() const noexcept {
    return 32 / std::gcd(plane_bits(), std::int64_t{32});
  }
  /// 32-bit words of the whole stream.
  [[nodiscard]] std::int64_t code_words() const noexcept {
    return (planes * plane_bits() + 31) / 32;
  }
  /// Whether no two windows share a cell (the stride covers the dilated window).
  [[nodiscard]] bool disjoint() const noexcept {
    return sh >= (kh - 1) * dh + 1 && sw >= (kw - 1) * dw + 1;
  }
  /// The 2x2, stride 2, unpadded, undilated window, every window inside the input (the fast
  /// path; ceil mode on an odd size makes a last window that sticks out).
  [[nodiscard]] bool is_2x2() const noexcept {
    return kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 && dw == 1 &&
           2 * oh <= h && 2 * ow <= w;
  }
};

/**
 * Calls f(p0, p1, word) over pieces [p0, p1) of the planes, on LibTorch's threads as
 * `parallel_pieces` decides (`plane_ns`: the work of one plane on one thread); every piece but the
 * last ends on a word boundary of the code stream, and `word` is the word its first plane's codes
 * start at, so pieces never share a word.
 */
template <class F>
void for_each_plane_piece(const pool_geometry& g, double plane_ns, const F& f) {
  const std::int64_t group = g.plane_group();
  const std::int64_t groups = (g.planes + group - 1) / group;
  parallel_pieces(0, groups, std::max<std::int64_t>(1, 16 / group),
                  plane_ns * static_cast<double>(group), [&](std::int64_t g0, std::int64_t g1) {
                    const std::int64_t p0 = g0 * group, p1 = std::min(g.planes, g1 * group);
                    f(p0, p1, p0 * g.plane_bits() / 32);
                  });
}

/// Bits per code for a window of `cells` positions: 1, 2, 4, 8, 16 or 32.
[[nodiscard]] inline int code_bits(std::int64_t cells) noexcept {
  const int need =
      cells <= 1 ? 1 : static_cast<int>(std::bit_width(static_cast<std::uint64_t>(cells - 1)));
  return static_cast<int>(std::bit_ceil(static_cast<unsigned>(need)));
}

/// LibTorch's pooling output size (pooling_output_shape).
[[nodiscard]] inline std::int64_t pool_output_size(std::int64_t in, std::int64_t k,
                                                   std::int64_t pad, std::int64_t stride,
                                                   std::int64_t dilation, bool ceil_mode) noexcept {
  const std::int64_t num = in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  // div_rtn: rounds towards -infinity.
  std::int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

/// The maximum of one window and its window-relative position, scanning as LibTorch's CPU kernel
/// does: row-major, first strict maximum, a NaN always replaces (so the last NaN wins).
template <class T>
inline void pool_window(const T* plane, const pool_geometry& g, std::int64_t oy, std::int64_t ox,
                        T& value, std::uint32_t& code) noexcept {
  using A = acc_t<T>;
  const std::int64_t y0 = oy * g.sh - g.ph;
  const std::int64_t x0 = ox * g.sw - g.pw;
  std::int64_t ys = y0, xs = x0;
  while (ys < 0)
    ys += g.dh;
  while (xs < 0)
    xs += g.dw;
  const std::int64_t ye = std::min(y0 + (g.kh - 1) * g.dh + 1, g.h);
  const std::int64_t xe = std::min(x0 + (g.kw - 1) * g.dw + 1, g.w);
  std::int64_t best_y = ys, best_x = xs;
  A best = -std::numeric_limits<A>::infinity();
  for (std::int64_t y = ys; y < ye; y += g.dh) {
    for (std::int64_t x = xs; x < xe; x += g.dw) {
      const A v = static_cast<A>(plane[y * g.w + x]);
      if (v > best || std::isnan(v)) {
        best = v;
        best_y = y;
        best_x = x;
      }
    }
  }
  value = static_cast<T>(best);
  code = static_cast<std::uint32_t>((best_y - y0) / g.dh * g.kw + (best_x - x0) / g.dw);
}

/// The maximum of one 2x2 window (rows r0, r1) and its position, as `pool_window` finds them.
template <class T>
inline std::uint32_t pool2x2(const T* r0, const T* r1, T& out) noexcept {
  using A = acc_t<T>;
  const A c[4] = {static_cast<A>(r0[0]), static_cast<A>(r0[1]), static_cast<A>(r1[0]),
                  static_cast<A>(r1[1])};
  A best = c[0];  // also right when c[0] is -inf: LibTorch keeps index 0 then
  std::uint32_t code = 0;
  for (std::uint32_t k = 1; k < 4; ++k) {
    const bool take = c[k] > best || c[k] != c[k];
    best = take ? c[k] : best;
    code = take ? k : code;
  }
  out = static_cast<T>(best);
  return code;
}

/// Pools one plane with the 2x2, stride-2 window.
template <class T>
void pool2x2_plane(const T* in, T* out, bit_writer& codes, const pool_geometry& g) {
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    const T* r0 = in + 2 * oy * g.w;
    const T* r1 = r0 + g.w;
    T* o = out + oy * g.ow;
    std::int64_t ox = 0;
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      for (; ox + 4 <= g.ow; ox += 4)
        codes.put(pool2x2_quad_sse2(r0 + 2 * ox, r1 + 2 * ox, o + ox), 8);
    }
#endif
    for (; ox < g.ow; ++ox)
      codes.put(pool2x2(r0 + 2 * ox, r1 + 2 * ox, o[ox]), 2);
  }
}

/// Pools x (planes x h x w, contiguous) into y and writes each plane's codes.
template <class T>
void max_pool_mask_forward(const T* x, T* y, std::uint32_t* codes, const pool_geometry& g) {
  const std::int64_t plane_in = g.h * g.w, plane_out = g.oh * g.ow;
  const double plane_ns = mask_ns_per_element * static_cast<double>(plane_in);
  for_each_plane_piece(g, plane_ns, [&](std::int64_t p0, std::int64_t p1, std::int64_t word) {
    bit_writer codes_out(codes + word);
    for (std::int64_t p = p0; p < p1; ++p) {
      const T* in = x + p * plane_in;
      T* out = y + p * plane_out;
      if (g.is_2x2()) {
        pool2x2_plane(in, out, codes_out, g);
      } else {
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          for (std::int64_t ox = 0; ox < g.ow; ++ox) {
            std::uint32_t code = 0;
            pool_window(in, g, oy, ox, out[oy * g.ow + ox], code);
            codes_out.put(code, g.bits);
          }
        }
      }
    }
    codes_out.finish();
  });
}

/// The gradient of one plane of a 2x2, stride-2 pooling: every cell the windows cover is written
/// once (the gradient or zero); the cells of an odd last row or column, which no window covers,
/// are zeroed.
template <class T>
void unpool2x2_plane(const T* grad, bit_reader& codes, T* plane, const pool_geometry& g) {
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    T* r0 = plane + 2 * oy * g.w;
    T* r1 = r0 + g.w;
    const T* gr = grad + oy * g.ow;
    std::int64_t ox = 0;
#if DROPIT_TORCH_SSE2
    if constexpr (std::is_same_v<T, float>) {
      for (; ox + 4 <= g.ow; ox += 4)
        unpool2x2_quad_sse2(gr + ox, codes.get(8), r0 + 2 * ox, r1 + 2 * ox);
    }
#endif
    for (; ox < g.ow; ++ox) {
      const std::uint32_t code = codes.get(2);
      T* cells[4] = {r0 + 2 * ox, r0 + 2 * ox + 1, r1 + 2 * ox, r1 + 2 * ox + 1};
      for (std::uint32_t k = 0; k < 4; ++k)
        *cells[k] = k == code ? gr[ox] : T(0);
    }
    for (std::int64_t x = 2 * g.ow; x < g.w; ++x)
      r0[x] = r1[x] = T(0);
  }
  std::fill(plane + 2 * g.oh * g.w, plane + g.h * g.w, T(0));
}

/// Sends output (oy, ox)'s gradient gr to the cell of its window that `code` names: a store where
/// windows are disjoint (each cell is touched at most once), else an accumulation.
template <class T>
inline void window_grad(T* plane, const pool_geometry& g, std::int64_t oy, std::int64_t ox,
                        std::uint32_t code, T gr, bool disjoint) noexcept {
  using A = acc_t<T>;
  const auto c = static_cast<std::int64_t>(code);
  T& cell = plane[(oy * g.sh - g.ph + c / g.kw * g.dh) * g.w + ox * g.sw - g.pw + c % g.kw * g.dw];
  cell = disjoint ? gr : static_cast<T>(static_cast<A>(cell) + static_cast<A>(gr));
}

/// gx (planes x h x w) receives each output's gradient at its maximum, zeros elsewhere.
template <class T>
void max_pool_mask_backward(const T* gy, const std::uint32_t* codes, T* gx,
                            const pool_geometry& g) {
  const std::int64_t plane_in = g.h * g.w, plane_out = g.oh * g.ow;
  const bool disjoint = g.disjoint();
  const double plane_ns = mask_ns_per_element * static_cast<double>(plane_in);
  for_each_plane_piece(g, plane_ns, [&](std::int64_t p0, std::int64_t p1, std::int64_t word) {
    bit_reader pc(codes + word);
    for (std::int64_t p = p0; p < p1; ++p) {
      T* plane = gx + p * plane_in;
      const T* grad = gy + p * plane_out;
      if (g.is_2x2()) {
        unpool2x2_plane(grad, pc, plane, g);
        continue;
      }
      std::fill(plane, plane + plane_in, T(0));
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox)
          window_grad(plane, g, oy, ox, pc.get(g.bits), grad[oy * g.ow + ox], disjoint);
      }
    }
  });
}

}  // namespace dropit::torch::detail
