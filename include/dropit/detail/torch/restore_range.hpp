/**
 * @file restore_range.hpp
 * @brief Restores elements [begin, end) of a packed payload (format.hpp) without rebuilding the
 * rest, so backward can rebuild a saved input piece by piece (a batch chunk, a block of rows) and
 * never hold all of it densely.
 *
 * The bitmask encoding's block offsets give the value offset of any 1024-element block; a popcount
 * over at most 31 words finds the offset of any word. Index lists are searched by binary search.
 */
#pragma once

#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/detail/torch/kernels.hpp>
#include <dropit/format.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dropit::torch::detail {

/// Kept values before word w of a bitmask payload.
template <class Offset>
[[nodiscard]] inline std::size_t values_before_word(const std::uint32_t* words,
                                                    const Offset* offsets, std::size_t w) noexcept {
  constexpr std::size_t words_per_block = block_elements / word_elements;
  const std::size_t b = w / words_per_block;
  std::size_t at = static_cast<std::size_t>(offsets[b]);
  for (std::size_t v = b * words_per_block; v < w; ++v)
    at += static_cast<std::size_t>(dropit::detail::popcount32(words[v]));
  return at;
}

/// Bitmask restore of [begin, end) into out[0, end - begin).
template <class T, class Offset>
void restore_bitmask_range(const T* values, const std::uint32_t* words, const Offset* offsets,
                           std::size_t begin, std::size_t end, T* out,
                           dropit::detail::restore_value<T> op) {
  const std::size_t w_first = begin / word_elements;
  const std::size_t w_last = (end - 1) / word_elements + 1;
  parallel_pieces(
      static_cast<std::int64_t>(w_first), static_cast<std::int64_t>(w_last), 2048,
      word_elements * mask_ns_per_element, [&](std::int64_t t0, std::int64_t t1) {
        std::size_t at = values_before_word(words, offsets, static_cast<std::size_t>(t0));
        for (auto w = static_cast<std::size_t>(t0); w < static_cast<std::size_t>(t1); ++w) {
          const std::uint32_t m = words[w];
          const std::size_t base = w * word_elements;
          const std::size_t lo = std::max(begin, base);
          const std::size_t hi = std::min(end, base + word_elements);
          if (lo == base && hi == base + word_elements) {
            T* o = out + (base - begin);
            for (std::size_t j = 0; j < word_elements; ++j)
              o[j] = T{};
            std::size_t v = at;
            for (std::uint32_t r = m; r != 0; r &= r - 1)
              o[dropit::detail::lowest_bit32(r)] = op(values[v++]);
          } else {
            for (std::size_t i = lo; i < hi; ++i) {
              const unsigned j = static_cast<unsigned>(i - base);
              if ((m >> j & 1u) != 0) {
                const std::uint32_t below = j == 0 ? 0u : m & ((1u << j) - 1u);
                out[i - begin] =
                    op(values[at + static_cast<std::size_t>(dropit::detail::popcount32(below))]);
              } else {
                out[i - begin] = T{};
              }
            }
          }
          at += static_cast<std::size_t>(dropit::detail::popcount32(m));
        }
      });
}

/// Index-list restore of [begin, end) into out[0, end - begin).
template <class T, class Index>
void restore_index_range(const T* values, const Index* index, std::size_t k, std::size_t begin,
                         std::size_t end, T* out, dropit::detail::restore_value<T> op) {
  parallel_pieces(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end), 1 << 16,
                  mask_ns_per_element, [&](std::int64_t s0, std::int64_t s1) {
                    const auto lo = static_cast<std::size_t>(s0);
                    const auto hi = static_cast<std::size_t>(s1);
                    for (std::size_t i = lo; i < hi; ++i)
                      out[i - begin] = T{};
                    std::size_t j = static_cast<std::size_t>(
                        std::lower_bound(index, index + k, static_cast<Index>(lo)) - index);
                    for (; j < k && static_cast<std::size_t>(index[j]) < hi; ++j) {
                      out[static_cast<std::size_t>(index[j]) - begin] = op(values[j]);
                    }
                  });
}

/**
 * Writes elements [begin, end) of the dense tensor a payload describes to out[0, end - begin):
 * kept values (times scale) in place, zeros elsewhere.
 * @pre begin <= end <= layout.n; payload laid out as `layout`, host-accessible.
 */
template <class T>
void restore_range(const packed_layout& layout, const std::byte* payload, double scale,
                   std::size_t begin, std::size_t end, T* out) {
  if (begin >= end) return;
  const dropit::detail::restore_value<T> op{scale, scale != 1.0};
  const T* values = reinterpret_cast<const T*>(payload + layout.values_offset);
  const std::byte* positions = payload + layout.positions_offset;
  switch (layout.positions) {
    case position_encoding::none:
      if (layout.k == 0) {
        std::fill(out, out + (end - begin), T{});
      } else if (!op.apply) {
        std::memcpy(out, values + begin, (end - begin) * sizeof(T));
      } else {
        for (std::size_t i = begin; i < end; ++i)
          out[i - begin] = op(values[i]);
      }
      return;
    case position_encoding::bitmask: {
      const auto* words = reinterpret_cast<const std::uint32_t*>(positions);
      const std::byte* offsets = payload + layout.block_offsets_offset;
      if (layout.wide()) {
        restore_bitmask_range(values, words, reinterpret_cast<const std::uint64_t*>(offsets), begin,
                              end, out, op);
      } else {
        restore_bitmask_range(values, words, reinterpret_cast<const std::uint32_t*>(offsets), begin,
                              end, out, op);
      }
      return;
    }
    case position_encoding::index32:
      restore_index_range(values, reinterpret_cast<const std::uint32_t*>(positions), layout.k,
                          begin, end, out, op);
      return;
    case position_encoding::index64:
      restore_index_range(values, reinterpret_cast<const std::uint64_t*>(positions), layout.k,
                          begin, end, out, op);
      return;
  }
}

}  // namespace dropit::torch::detail
