/**
 * @file kept_product.hpp
 * @brief A Linear's weight gradient straight from its packed input: for x [rows, in] packed and
 * the output gradient g [rows, out], x^T g [in, out] adds v * g[r, :] to row c for every kept
 * element x[r, c] = v, without rebuilding x. At gamma = 0.9 that is a tenth of the dense
 * product's multiply-adds and no dense input is written; the dense path (rebuild in pieces, then
 * a matmul) stays for denser payloads and other element types.
 *
 * The payload's positions are decoded a chunk of 8192 elements at a time (an Elias-Fano block)
 * into a list of indices, and 8-bit kept values (int8, fp8) into a list of values, then one
 * kernel adds the rows (AVX-512 where the CPU has it, chosen at run time as the mask kernels are);
 * each worker adds into a matrix of its own, summed at the end.
 */
#pragma once

#include <dropit/detail/codec.hpp>
#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/host/elias_fano_bmi2.hpp>
#include <dropit/detail/host/isa.hpp>
#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/detail/torch/restore_range.hpp>
#include <dropit/format.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace dropit::torch::detail {

/// Elements per decoded chunk: an Elias-Fano block (a whole number of bitmask words).
inline constexpr std::size_t kept_chunk = ef_block_elements;

/// How a matmul layer's weight gradient is computed from its packed input.
enum class weight_grad_path : std::uint8_t {
  cheaper,  ///< whichever `kept_product_pays` estimates cheaper (what the layers use)
  kept,     ///< from the kept elements wherever the payload allows it (benchmarks, tests)
  rebuild   ///< the input rebuilt in pieces of rows, then a dense matmul (benchmarks, tests)
};

/**
 * True where the product from the kept elements is estimated to cost less than a rebuild and a
 * dense matmul, for x [rows, in] (n elements, k kept) and out outputs. Estimates in ns, fitted
 * to `torch_ops_bench --benchmark_filter=^linear_wgrad` (2 threads, fp32, 7 shapes from 128 x
 * 1568 x 128 to 4096 x 768 x 3072, gamma 0.5 to 0.99; bench/README.md): the kept product costs
 * 1.6 per kept element, 0.045 per kept element and output, 1.1 per cell of [in, out] (the
 * workers' sums zeroed and added, the transpose); the rebuild 0.86 per element, 0.0113 per
 * element and output (the matmul). It picked the faster path in each of the 42 cases fitted.
 */
[[nodiscard]] constexpr bool kept_product_pays(std::size_t n, std::size_t k, std::size_t in,
                                               std::size_t out) noexcept {
  const auto o = static_cast<double>(out);
  const double kept =
      static_cast<double>(k) * (1.6 + 0.045 * o) + 1.1 * static_cast<double>(in) * o;
  const double rebuild = static_cast<double>(n) * (0.86 + 0.0113 * o);
  return kept < rebuild;
}

/**
 * The kept elements of [c0, c1) (c0 a multiple of `kept_chunk`) as positions relative to c0 in
 * `pos`; returns their count and sets `first` to the value index of the first.
 */
[[nodiscard]] inline std::size_t decode_kept(const packed_layout& l, const std::byte* payload,
                                             std::size_t c0, std::size_t c1, std::uint32_t* pos,
                                             std::size_t& first) {
  std::size_t m = 0;
  const std::byte* positions = payload + l.positions_offset;
  switch (l.positions) {
    case position_encoding::bitmask: {
      const auto* words = reinterpret_cast<const std::uint32_t*>(positions);
      const std::byte* offsets = payload + l.block_offsets_offset;
      const std::size_t w0 = c0 / word_elements, w1 = (c1 + word_elements - 1) / word_elements;
      first = l.wide()
                  ? values_before_word(words, reinterpret_cast<const std::uint64_t*>(offsets), w0)
                  : values_before_word(words, reinterpret_cast<const std::uint32_t*>(offsets), w0);
      for (std::size_t w = w0; w < w1; ++w) {
        const auto base = static_cast<std::uint32_t>((w - w0) * word_elements);
        for (std::uint32_t r = words[w]; r != 0; r &= r - 1)
          pos[m++] = base + static_cast<std::uint32_t>(dropit::detail::lowest_bit32(r));
      }
      return m;
    }
    case position_encoding::elias_fano: {
      const auto s = dropit::detail::ef_shape::of(l);
      const auto* low = reinterpret_cast<const std::uint64_t*>(positions);
      const auto* high = reinterpret_cast<const std::uint64_t*>(payload + l.high_offset);
      const std::size_t b = c0 / ef_block_elements;
      auto decode = [&](const auto* offsets) {
        first = static_cast<std::size_t>(offsets[b]);
#if DROPIT_HOST_X86
        if (dropit::detail::ef_bmi2_decodes(s.l, dropit::detail::active_host_isa())) {
          dropit::detail::ef_visit_block_bmi2(s, low, high, offsets, b,
                                              [&](std::size_t local, std::size_t) {
                                                pos[m++] = static_cast<std::uint32_t>(local);
                                              });
          return;
        }
#endif
        for (dropit::detail::ef_cursor c(s, low, high, offsets, b); !c.done();)
          pos[m++] = static_cast<std::uint32_t>(c.next() - c0);
      };
      if (l.wide()) {
        decode(reinterpret_cast<const std::uint64_t*>(payload + l.block_offsets_offset));
      } else {
        decode(reinterpret_cast<const std::uint32_t*>(payload + l.block_offsets_offset));
      }
      return m;
    }
    case position_encoding::index32:
    case position_encoding::index64: {
      auto scan = [&](const auto* index) {
        using I = std::remove_cv_t<std::remove_pointer_t<decltype(index)>>;
        std::size_t j = static_cast<std::size_t>(
            std::lower_bound(index, index + l.k, static_cast<I>(c0)) - index);
        first = j;
        for (; j < l.k && static_cast<std::size_t>(index[j]) < c1; ++j)
          pos[m++] = static_cast<std::uint32_t>(static_cast<std::size_t>(index[j]) - c0);
      };
      if (l.positions == position_encoding::index32) {
        scan(reinterpret_cast<const std::uint32_t*>(positions));
      } else {
        scan(reinterpret_cast<const std::uint64_t*>(positions));
      }
      return m;
    }
    case position_encoding::none:
      break;
  }
  first = 0;
  return 0;
}

/// Kept values [first, first + m) of a value-coded (int8, fp8) payload, decoded into out[0, m).
template <class T>
void decode_kept_values(const packed_layout& l, const std::byte* payload, std::size_t first,
                        std::size_t m, T* out) noexcept {
  const auto* codes = reinterpret_cast<const std::uint8_t*>(payload + l.values_offset);
  const auto* scales = reinterpret_cast<const float*>(payload + l.scales_offset);
  for (std::size_t i = first; i < first + m;) {
    const std::size_t c = i / codec_chunk;  // the codec chunk holding value i, and its scale
    const std::size_t end = std::min(first + m, (c + 1) * codec_chunk);
    dropit::detail::decode_chunk(codes + i, scales + c, end - i, 0, l.codec, out + (i - first));
    i = end;
  }
}

/// acc[e % in, :] += values[j] * scale * g[e / in, :] for the m kept elements e = c0 + pos[j].
template <class T>
void add_kept_rows(const std::uint32_t* pos, std::size_t m, const T* values, T scale,
                   std::size_t c0, std::size_t in, std::size_t out, const T* g, T* acc) noexcept {
  for (std::size_t j = 0; j < m; ++j) {
    const std::size_t e = c0 + pos[j];
    const std::size_t r = e / in;
    const T v = values[j] * scale;
    const T* gr = g + r * out;
    T* a = acc + (e - r * in) * out;
    for (std::size_t c = 0; c < out; ++c)
      a[c] += v * gr[c];
  }
}

#if DROPIT_HOST_X86
DROPIT_AVX512_WARNINGS_OFF
/// add_kept_rows for fp32 with AVX-512.
DROPIT_TARGET_AVX512 inline void add_kept_rows_avx512(const std::uint32_t* pos, std::size_t m,
                                                      const float* values, float scale,
                                                      std::size_t c0, std::size_t in,
                                                      std::size_t out, const float* g,
                                                      float* acc) noexcept {
  const std::size_t full = out / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (out - full)) - 1u);
  for (std::size_t j = 0; j < m; ++j) {
    const std::size_t e = c0 + pos[j];
    const std::size_t r = e / in;
    const __m512 v = _mm512_set1_ps(values[j] * scale);
    const float* gr = g + r * out;
    float* a = acc + (e - r * in) * out;
    for (std::size_t c = 0; c < full; c += 16)
      _mm512_storeu_ps(a + c, _mm512_fmadd_ps(v, _mm512_loadu_ps(gr + c), _mm512_loadu_ps(a + c)));
    if (tail != 0) {
      const __m512 s = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(tail, gr + full),
                                       _mm512_maskz_loadu_ps(tail, a + full));
      _mm512_mask_storeu_ps(a + full, tail, s);
    }
  }
}
DROPIT_AVX512_WARNINGS_ON
#endif

/**
 * acc [in, out] = x^T g for x [rows, in] given by a payload `l` (element type T, any value codec,
 * n = rows * in, restore scale `scale`) and g [rows, out], both row-major; acc need not be zeroed.
 * Forks onto `threads` workers when the work pays for it.
 */
template <class T>
void kept_product(const packed_layout& l, const std::byte* payload, double scale, std::size_t in,
                  std::size_t out, const T* g, T* acc, unsigned threads) {
  const std::size_t chunks = (l.n + kept_chunk - 1) / kept_chunk;
  const bool coded = l.codec != value_codec::exact;
  const auto* values = reinterpret_cast<const T*>(payload + l.values_offset);
  const T s = static_cast<T>(scale);
  bool wide = false;
#if DROPIT_HOST_X86
  if constexpr (std::is_same_v<T, float>) {
    wide = dropit::detail::active_host_isa() >= dropit::detail::host_isa::avx512;
  }
#endif
  const std::size_t cells = in * out;
  // One thread's work on the kept elements (twice the two-thread times `kept_product_pays` was
  // fitted to), less twice what a second worker's matrix costs to zero and add (about 0.4 ns a
  // cell: fresh pages, a write and a read).
  const double ns = 2.0 * static_cast<double>(l.k) * (1.6 + 0.045 * static_cast<double>(out)) -
                    0.8 * static_cast<double>(cells);
  const unsigned workers =
      chunks < 2 || at::in_parallel_region() || !dropit::detail::fork_meter::pays(threads, ns, 2)
          ? 1u
          : static_cast<unsigned>(std::min<std::size_t>(threads, chunks));
  // Worker 0 adds into acc (zeroed here: it may take no chunk), every other worker into a matrix
  // of its own, zeroed when it takes its first chunk. Everything is allocated here: nothing in a
  // worker throws.
  std::vector<std::unique_ptr<T[]>> parts(workers);
  std::vector<char> zeroed(workers, 0);
  std::vector<std::unique_ptr<std::uint32_t[]>> positions(workers);
  std::vector<std::unique_ptr<T[]>> decoded(workers);  // a chunk's values, for a value codec
  for (unsigned w = 0; w < workers; ++w) {
    if (w > 0) parts[w] = std::unique_ptr<T[]>(new T[cells]);
    positions[w] = std::unique_ptr<std::uint32_t[]>(new std::uint32_t[kept_chunk]);
    if (coded) decoded[w] = std::unique_ptr<T[]>(new T[kept_chunk]);
  }
  std::fill(acc, acc + cells, T{});
  dropit::detail::parallel_for(workers, chunks, [&](std::size_t k0, std::size_t k1, unsigned w) {
    T* a = w == 0 ? acc : parts[w].get();
    if (w > 0 && zeroed[w] == 0) {
      std::fill(a, a + cells, T{});
      zeroed[w] = 1;
    }
    std::uint32_t* pos = positions[w].get();
    for (std::size_t k = k0; k < k1; ++k) {
      const std::size_t c0 = k * kept_chunk, c1 = std::min(l.n, c0 + kept_chunk);
      std::size_t first = 0;
      const std::size_t m = decode_kept(l, payload, c0, c1, pos, first);
      const T* v = values + first;
      if (coded) {
        decode_kept_values(l, payload, first, m, decoded[w].get());
        v = decoded[w].get();
      }
#if DROPIT_HOST_X86
      if constexpr (std::is_same_v<T, float>) {
        if (wide) {
          add_kept_rows_avx512(pos, m, v, s, c0, in, out, g, a);
          continue;
        }
      }
#endif
      add_kept_rows(pos, m, v, s, c0, in, out, g, a);
    }
  });
  // The other workers' matrices added into acc, split between the workers.
  std::vector<const T*> sums;
  for (unsigned w = 1; w < workers; ++w)
    if (zeroed[w] != 0) sums.push_back(parts[w].get());
  if (sums.empty()) return;
  dropit::detail::parallel_for(workers, cells, [&](std::size_t i0, std::size_t i1, unsigned) {
    for (const T* p : sums)
      for (std::size_t i = i0; i < i1; ++i)
        acc[i] += p[i];
  });
}

}  // namespace dropit::torch::detail
