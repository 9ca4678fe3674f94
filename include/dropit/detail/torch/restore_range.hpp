/**
 * @file restore_range.hpp
 * @brief Restores elements [begin, end) of a packed payload (format.hpp) without rebuilding the
 * rest, so backward can rebuild a saved input piece by piece (a batch chunk, a block of rows) and
 * never hold all of it densely.
 *
 * The bitmask encoding's block offsets give the value offset of any 1024-element block; a popcount
 * over at most 31 words finds the offset of any word. Index lists are searched by binary search.
 * An Elias-Fano code is decoded block by block (8192 elements), from the block holding `begin`;
 * whole blocks with the host's BMI2 decoder where the CPU has it.
 */
#pragma once

#include <dropit/detail/codec.hpp>
#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/host/elias_fano_bmi2.hpp>
#include <dropit/detail/host/isa.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/detail/torch/kernels.hpp>
#include <dropit/format.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

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
template <class T, class Values, class Offset>
void restore_bitmask_range(const Values& values, const std::uint32_t* words, const Offset* offsets,
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
template <class T, class Values, class Index>
void restore_index_range(const Values& values, const Index* index, std::size_t k, std::size_t begin,
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

/// Elias-Fano restore of [begin, end) into out[0, end - begin).
template <class T, class Values, class Offset>
void restore_elias_fano_range(const Values& values, const packed_layout& l,
                              const std::byte* payload, std::size_t begin, std::size_t end, T* out,
                              dropit::detail::restore_value<T> op) {
  const auto s = dropit::detail::ef_shape::of(l);
  const auto* low = reinterpret_cast<const std::uint64_t*>(payload + l.positions_offset);
  const auto* high = reinterpret_cast<const std::uint64_t*>(payload + l.high_offset);
  const auto* offsets = reinterpret_cast<const Offset*>(payload + l.block_offsets_offset);
#if DROPIT_HOST_X86
  const bool bmi2 = dropit::detail::ef_bmi2_decodes(s.l, dropit::detail::active_host_isa());
#endif
  auto blocks = [&](std::int64_t t0, std::int64_t t1) {
    for (auto b = static_cast<std::size_t>(t0); b < static_cast<std::size_t>(t1); ++b) {
      const std::size_t lo = std::max(begin, b * ef_block_elements);
      const std::size_t hi = std::min(end, (b + 1) * ef_block_elements);
      std::fill(out + (lo - begin), out + (hi - begin), T{});
#if DROPIT_HOST_X86
      if (bmi2 && lo == b * ef_block_elements && hi == std::min(l.n, lo + ef_block_elements)) {
        // A whole block: the BMI2 decoder, no branch per element.
        T* o = out + (lo - begin);
        const auto kb = static_cast<std::size_t>(offsets[b]);
        dropit::detail::ef_visit_block_bmi2(
            s, low, high, offsets, b,
            [&](std::size_t local, std::size_t j) { o[local] = op(values[kb + j]); });
        continue;
      }
#endif
      for (dropit::detail::ef_cursor c(s, low, high, offsets, b); !c.done();) {
        const std::size_t j = c.rank();
        const std::size_t i = c.next();
        if (i >= hi) break;
        if (i >= lo) out[i - begin] = op(values[j]);
      }
    }
  };
  parallel_pieces(static_cast<std::int64_t>(begin / ef_block_elements),
                  static_cast<std::int64_t>((end - 1) / ef_block_elements + 1), 1,
                  ef_block_elements * mask_ns_per_element, blocks);
}

/// Kept values of an Elias-Fano payload before element i.
template <class Offset>
[[nodiscard]] std::size_t elias_fano_values_before(const packed_layout& l, const std::byte* payload,
                                                   std::size_t i) {
  const auto* offsets = reinterpret_cast<const Offset*>(payload + l.block_offsets_offset);
  const std::size_t b = i / ef_block_elements;
  if (b >= l.ef_blocks()) return l.k;
  dropit::detail::ef_cursor c(dropit::detail::ef_shape::of(l),
                              reinterpret_cast<const std::uint64_t*>(payload + l.positions_offset),
                              reinterpret_cast<const std::uint64_t*>(payload + l.high_offset),
                              offsets, b);
  while (!c.done()) {
    const std::size_t j = c.rank();
    if (c.next() >= i) return j;
  }
  return c.rank();
}

/// restore_range over the kept values `values`: a T pointer, or `decoded_values`.
template <class T, class Values>
void restore_range_from(const packed_layout& layout, const std::byte* payload, const Values& values,
                        double scale, std::size_t begin, std::size_t end, T* out) {
  const dropit::detail::restore_value<T> op{scale, scale != 1.0};
  const std::byte* positions = payload + layout.positions_offset;
  switch (layout.positions) {
    case position_encoding::none:
      if (layout.k == 0) {
        std::fill(out, out + (end - begin), T{});
      } else {
        for (std::size_t i = begin; i < end; ++i)
          out[i - begin] = op(values[i]);
      }
      return;
    case position_encoding::bitmask: {
      const auto* words = reinterpret_cast<const std::uint32_t*>(positions);
      const std::byte* offsets = payload + layout.block_offsets_offset;
      if (layout.wide()) {
        restore_bitmask_range<T>(values, words, reinterpret_cast<const std::uint64_t*>(offsets),
                                 begin, end, out, op);
      } else {
        restore_bitmask_range<T>(values, words, reinterpret_cast<const std::uint32_t*>(offsets),
                                 begin, end, out, op);
      }
      return;
    }
    case position_encoding::elias_fano:
      if (layout.wide()) {
        restore_elias_fano_range<T, Values, std::uint64_t>(values, layout, payload, begin, end, out,
                                                           op);
      } else {
        restore_elias_fano_range<T, Values, std::uint32_t>(values, layout, payload, begin, end, out,
                                                           op);
      }
      return;
    case position_encoding::index32:
      restore_index_range<T>(values, reinterpret_cast<const std::uint32_t*>(positions), layout.k,
                             begin, end, out, op);
      return;
    case position_encoding::index64:
      restore_index_range<T>(values, reinterpret_cast<const std::uint64_t*>(positions), layout.k,
                             begin, end, out, op);
      return;
  }
}

/// The values of a value-coded payload with indices [first, last), decoded.
template <class T>
class decoded_values {
 public:
  decoded_values(const packed_layout& l, const std::byte* payload, std::size_t first,
                 std::size_t last)
      : first_(first), values_(last - first) {
    const auto* codes = reinterpret_cast<const std::uint8_t*>(payload + l.values_offset);
    const auto* scales = reinterpret_cast<const float*>(payload + l.scales_offset);
    std::vector<T> chunk(codec_chunk);  // one decoded chunk; the range keeps its part
    for (std::size_t c = first / codec_chunk; c * codec_chunk < last; ++c) {
      const std::size_t c0 = c * codec_chunk;
      const std::size_t c1 = std::min(l.k, c0 + codec_chunk);
      dropit::detail::decode_chunk(codes + c0, scales + c, c1 - c0, 0, l.codec, chunk.data());
      for (std::size_t i = std::max(first, c0); i < std::min(last, c1); ++i)
        values_[i - first] = chunk[i - c0];
    }
  }
  [[nodiscard]] T operator[](std::size_t i) const noexcept { return values_[i - first_]; }

 private:
  std::size_t first_;
  std::vector<T> values_;
};

/// The kept values of a payload before element i (the value index of the first kept element at
/// or after i).
[[nodiscard]] inline std::size_t values_before(const packed_layout& l, const std::byte* payload,
                                               std::size_t i) {
  const std::byte* positions = payload + l.positions_offset;
  switch (l.positions) {
    case position_encoding::none:
      return l.k == 0 ? 0 : i;
    case position_encoding::bitmask: {
      const auto* words = reinterpret_cast<const std::uint32_t*>(positions);
      const std::byte* offsets = payload + l.block_offsets_offset;
      const std::size_t w = i / word_elements;
      const unsigned j = static_cast<unsigned>(i % word_elements);
      std::size_t at =
          l.wide() ? values_before_word(words, reinterpret_cast<const std::uint64_t*>(offsets), w)
                   : values_before_word(words, reinterpret_cast<const std::uint32_t*>(offsets), w);
      if (j != 0) {
        at += static_cast<std::size_t>(dropit::detail::popcount32(words[w] & ((1u << j) - 1u)));
      }
      return at;
    }
    case position_encoding::elias_fano:
      return l.wide() ? elias_fano_values_before<std::uint64_t>(l, payload, i)
                      : elias_fano_values_before<std::uint32_t>(l, payload, i);
    case position_encoding::index32: {
      const auto* idx = reinterpret_cast<const std::uint32_t*>(positions);
      return static_cast<std::size_t>(
          std::lower_bound(idx, idx + l.k, static_cast<std::uint32_t>(i)) - idx);
    }
    case position_encoding::index64: {
      const auto* idx = reinterpret_cast<const std::uint64_t*>(positions);
      return static_cast<std::size_t>(
          std::lower_bound(idx, idx + l.k, static_cast<std::uint64_t>(i)) - idx);
    }
  }
  return 0;
}

/**
 * Writes elements [begin, end) of the dense tensor a payload describes to out[0, end - begin):
 * kept values (times scale) in place, zeros elsewhere. A value-coded payload's values are decoded
 * first, only the chunks the range needs.
 * @pre begin <= end <= layout.n; payload laid out as `layout`, host-accessible.
 */
template <class T>
void restore_range(const packed_layout& layout, const std::byte* payload, double scale,
                   std::size_t begin, std::size_t end, T* out) {
  if (begin >= end) return;
  if (layout.codec != value_codec::exact && layout.k > 0) {
    const decoded_values<T> values(layout, payload, values_before(layout, payload, begin),
                                   values_before(layout, payload, end));
    restore_range_from(layout, payload, values, scale, begin, end, out);
    return;
  }
  restore_range_from(layout, payload, reinterpret_cast<const T*>(payload + layout.values_offset),
                     scale, begin, end, out);
}

}  // namespace dropit::torch::detail
