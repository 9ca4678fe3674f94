// Implementation of dropit::host_executor (exec/host.hpp).
#pragma once

#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/host/select.hpp>
#include <dropit/detail/steps.hpp>

#include <algorithm>
#include <cstring>
#include <memory_resource>

namespace dropit {

inline unsigned host_executor::thread_count(std::size_t n) const noexcept {
  if (n < parallel_threshold) return 1;
  return threads != 0 ? threads : detail::hardware_threads();
}

namespace detail {

inline void release_host(void* resource, void*, std::byte* data, std::size_t bytes) noexcept {
  static_cast<std::pmr::memory_resource*>(resource)->deallocate(data, bytes, 64);
}

/// Writes words [w0, w1) of the bitmask encoding and their values; `start` is the kept count
/// before word w0.
template <class P, class T, class Key, class Offset>
void host_compact_bitmask(const P& policy, const T* x, std::size_t n, threshold<Key> th,
                          std::size_t b0, std::size_t b1, const std::size_t* block_start, T* values,
                          std::uint32_t* words, Offset* offsets) {
  constexpr std::size_t words_per_block = block_elements / word_elements;
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  for (std::size_t b = b0; b < b1; ++b) {
    std::size_t at = block_start[b];
    offsets[b] = static_cast<Offset>(at);
    const std::size_t w1 = std::min(total_words, (b + 1) * words_per_block);
    for (std::size_t w = b * words_per_block; w < w1; ++w) {
      const std::uint32_t m = mark_word(policy, x, n, w, th);
      words[w] = m;
      compact_word(x, w, m, values + at);
      at += static_cast<std::size_t>(popcount32(m));
    }
  }
}

template <class P, class T, class Key, class Index>
void host_compact_index(const P& policy, const T* x, std::size_t n, threshold<Key> th,
                        std::size_t b0, std::size_t b1, const std::size_t* block_start, T* values,
                        Index* index) {
  constexpr std::size_t words_per_block = block_elements / word_elements;
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  for (std::size_t b = b0; b < b1; ++b) {
    std::size_t at = block_start[b];
    const std::size_t w1 = std::min(total_words, (b + 1) * words_per_block);
    for (std::size_t w = b * words_per_block; w < w1; ++w) {
      const std::uint32_t m = mark_word(policy, x, n, w, th);
      if (m == 0) continue;
      compact_word(x, w, m, values + at);
      compact_word_index(w, m, index + at);
      at += static_cast<std::size_t>(popcount32(m));
    }
  }
}

}  // namespace detail

template <class T, class Policy>
detail::payload host_executor::pack(const Policy& policy, const T* x,
                                    const packed_layout& layout) const {
  std::pmr::memory_resource* mr = memory_resource();
  detail::payload out;
  if (layout.total_bytes > 0) {
    out =
        detail::payload(static_cast<std::byte*>(mr->allocate(layout.total_bytes, 64)),
                        layout.total_bytes, memory_space::host, &detail::release_host, mr, nullptr);
  }
  const std::size_t n = layout.n;
  const std::size_t k = layout.k;
  if (k == 0) return out;
  detail::zero_padding(out.data(), layout);
  const unsigned threads = thread_count(n);
  T* values = reinterpret_cast<T*>(out.data() + layout.values_offset);
  if (k == n) {
    detail::parallel_for(threads, n, [&](std::size_t b, std::size_t e, unsigned) {
      std::memcpy(values + b, x + b, (e - b) * sizeof(T));
    });
    return out;
  }

  const auto sel = detail::host_select(policy, x, n, k, threads);
  std::byte* positions = out.data() + layout.positions_offset;
  detail::parallel_for(threads, layout.blocks(), [&](std::size_t b0, std::size_t b1, unsigned) {
    switch (layout.positions) {
      case position_encoding::bitmask: {
        auto* words = reinterpret_cast<std::uint32_t*>(positions);
        std::byte* offsets = out.data() + layout.block_offsets_offset;
        if (layout.wide()) {
          detail::host_compact_bitmask(policy, x, n, sel.th, b0, b1, sel.block_start.data(), values,
                                       words, reinterpret_cast<std::uint64_t*>(offsets));
        } else {
          detail::host_compact_bitmask(policy, x, n, sel.th, b0, b1, sel.block_start.data(), values,
                                       words, reinterpret_cast<std::uint32_t*>(offsets));
        }
        break;
      }
      case position_encoding::index32:
        detail::host_compact_index(policy, x, n, sel.th, b0, b1, sel.block_start.data(), values,
                                   reinterpret_cast<std::uint32_t*>(positions));
        break;
      case position_encoding::index64:
        detail::host_compact_index(policy, x, n, sel.th, b0, b1, sel.block_start.data(), values,
                                   reinterpret_cast<std::uint64_t*>(positions));
        break;
      case position_encoding::none:
        break;
    }
  });
  return out;
}

namespace detail {

template <class T, class Offset>
void host_expand_bitmask(const T* values, const std::uint32_t* words, const Offset* offsets,
                         std::size_t n, std::size_t b0, std::size_t b1, T* out,
                         restore_value<T> op) {
  constexpr std::size_t words_per_block = block_elements / word_elements;
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  for (std::size_t b = b0; b < b1; ++b) {
    std::size_t at = static_cast<std::size_t>(offsets[b]);
    const std::size_t w1 = std::min(total_words, (b + 1) * words_per_block);
    for (std::size_t w = b * words_per_block; w < w1; ++w) {
      expand_word(values + at, words[w], w, n, out, op);
      at += static_cast<std::size_t>(popcount32(words[w]));
    }
  }
}

template <class T, class Index>
void host_expand_index(const T* values, const Index* index, std::size_t k, std::size_t begin,
                       std::size_t end, T* out, restore_value<T> op) {
  const std::size_t first =
      static_cast<std::size_t>(std::lower_bound(index, index + k, begin) - index);
  expand_index_range(values, index, k, first, begin, end, out, op);
}

}  // namespace detail

template <class T>
void host_executor::restore(const detail::payload& payload, const packed_layout& layout, T* out,
                            double scale) const {
  const std::size_t n = layout.n;
  const std::size_t k = layout.k;
  const detail::restore_value<T> op{scale, scale != 1.0};
  const T* values = reinterpret_cast<const T*>(payload.data() + layout.values_offset);
  const std::byte* positions = payload.data() + layout.positions_offset;
  const unsigned threads = thread_count(n);
  const std::size_t blocks = layout.blocks();
  detail::parallel_for(threads, blocks, [&](std::size_t b0, std::size_t b1, unsigned) {
    const std::size_t begin = b0 * block_elements;
    const std::size_t end = std::min(n, b1 * block_elements);
    switch (layout.positions) {
      case position_encoding::none:
        if (k == 0) {
          std::fill(out + begin, out + end, T{});
        } else if (!op.apply) {
          std::memcpy(out + begin, values + begin, (end - begin) * sizeof(T));
        } else {
          for (std::size_t i = begin; i < end; ++i)
            out[i] = op(values[i]);
        }
        break;
      case position_encoding::bitmask: {
        const auto* words = reinterpret_cast<const std::uint32_t*>(positions);
        const std::byte* offsets = payload.data() + layout.block_offsets_offset;
        if (layout.wide()) {
          detail::host_expand_bitmask(
              values, words, reinterpret_cast<const std::uint64_t*>(offsets), n, b0, b1, out, op);
        } else {
          detail::host_expand_bitmask(
              values, words, reinterpret_cast<const std::uint32_t*>(offsets), n, b0, b1, out, op);
        }
        break;
      }
      case position_encoding::index32:
        detail::host_expand_index(values, reinterpret_cast<const std::uint32_t*>(positions), k,
                                  begin, end, out, op);
        break;
      case position_encoding::index64:
        detail::host_expand_index(values, reinterpret_cast<const std::uint64_t*>(positions), k,
                                  begin, end, out, op);
        break;
    }
  });
}

}  // namespace dropit
