// Implementation of dropit::host_executor (exec/host.hpp).
#pragma once

#include <dropit/detail/codec.hpp>
#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/host/classify.hpp>
#include <dropit/detail/host/codec_simd.hpp>
#include <dropit/detail/host/compact.hpp>
#include <dropit/detail/host/elias_fano_bmi2.hpp>
#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/host/select.hpp>
#include <dropit/detail/selection.hpp>
#include <dropit/detail/steps.hpp>

#include <algorithm>
#include <cstring>
#include <memory_resource>

namespace dropit {

inline void host_executor::check_threads() const {
  DROPIT_EXPECTS(threads <= max_threads, "host_executor: threads must be at most ", max_threads,
                 ", got ", threads);
}

inline unsigned host_executor::thread_count(std::size_t n) const noexcept {
  if (n < parallel_threshold || threads > max_threads) return 1;
  return threads != 0 ? threads : detail::hardware_threads();
}

namespace detail {

/**
 * What a call costs on one thread, for `fork_meter::pays`: ns per element (fp32, one thread,
 * 2^17 to 2^20 elements on the 2-core development machine: `host_bench --benchmark_filter=
 * '^threads/'`, the `/1/` cases) and the fork-joins it makes on several threads.
 */
struct call_cost {
  double ns_per_element;
  unsigned forks;
};

/**
 * A host pack's cost: the fork-joins `host_pack` makes for this layout on several threads (the
 * sample, the count pass, the block offsets and tie cut, the compact step, then the Elias-Fano
 * position code and the value codec where the layout has them; one pass when every element is
 * kept). The radix passes of a missed guess are rare and not counted.
 */
[[nodiscard]] constexpr call_cost pack_cost(const packed_layout& l) noexcept {
  const unsigned coded = l.codec != value_codec::exact ? 1 : 0;
  if (l.k == 0) return {0.45, 0};
  if (l.k == l.n) return {0.45, 1};
  return {0.45, 4 + (l.positions == position_encoding::elias_fano ? 1u : 0u) + coded};
}

/// A host restore's cost: one expand pass, after a decode pass where the values are coded; a
/// dense coded payload decodes straight into the output (then a scaling pass when scale != 1).
[[nodiscard]] constexpr call_cost restore_cost(const packed_layout& l, double scale) noexcept {
  if (l.k == 0 || l.codec == value_codec::exact) return {0.09, 1};
  if (l.k == l.n) return {0.09, scale != 1.0 ? 2u : 1u};
  return {0.09, 2};
}

/// The threads a call on n elements runs on: `thread_count(n)`, or 1 when the executor is
/// adaptive and forking would cost more than it saves.
[[nodiscard]] inline unsigned call_threads(const host_executor& e, std::size_t n,
                                           call_cost cost) noexcept {
  const unsigned t = e.thread_count(n);
  if (t <= 1 || !e.adaptive) return t;
  return fork_meter::pays(t, cost.ns_per_element * static_cast<double>(n), cost.forks) ? t : 1;
}

inline void release_host(void* resource, void*, std::byte* data, std::size_t bytes) noexcept {
  static_cast<std::pmr::memory_resource*>(resource)->deallocate(data, bytes, 64);
}

/// The host backend of `run_selection`: the selector's steps, and the compact step that writes
/// the payload's values and positions from its result, each worker a range of blocks.
template <class P, class T>
class host_steps : public host_selector<P, T> {
 public:
  /// `values`: where the compact step writes the k kept values (the payload's values section,
  /// or a buffer a value codec encodes from); `words` and `offsets`: where it writes the bitmask
  /// and its block offsets (the payload's, or a buffer the Elias-Fano code is made from).
  host_steps(const P& policy, const T* x, const packed_layout& layout, std::byte* payload,
             T* values, unsigned threads, const host_select_tuning& tuning,
             std::pmr::memory_resource* mr, std::uint32_t* words, std::byte* offsets)
      : host_selector<P, T>(policy, x, layout.n, layout.k, threads, tuning, mr, words,
                            words == nullptr),
        policy_(policy),
        x_(x),
        layout_(layout),
        payload_(payload),
        values_(values),
        threads_(threads),
        words_(words),
        offsets_(offsets) {}

  /// Step 5: the kept values and their positions.
  void compact() {
    const auto& sel = this->finish();
    const std::size_t n = layout_.n;
    const word_classifier<P, T> cls(policy_, x_, n, sel.th.t, sel.th.t);
    const host_isa isa = active_host_isa();
    T* values = values_;
    std::byte* positions = payload_ + layout_.positions_offset;
    std::byte* offsets = offsets_;
    const T* x = x_;
    std::uint32_t* words = words_;
    const packed_layout& l = layout_;
    parallel_for(threads_, l.blocks(), [&](std::size_t b0, std::size_t b1, unsigned) {
      switch (l.positions) {
        case position_encoding::bitmask:
        case position_encoding::elias_fano:
          if (l.wide()) {
            host_compact_bitmask(cls, sel, x, n, b0, b1, words,
                                 reinterpret_cast<std::uint64_t*>(offsets), values, isa);
          } else {
            host_compact_bitmask(cls, sel, x, n, b0, b1, words,
                                 reinterpret_cast<std::uint32_t*>(offsets), values, isa);
          }
          break;
        case position_encoding::index32:
          host_compact_index(cls, sel, x, n, b0, b1, values,
                             reinterpret_cast<std::uint32_t*>(positions));
          break;
        case position_encoding::index64:
          host_compact_index(cls, sel, x, n, b0, b1, values,
                             reinterpret_cast<std::uint64_t*>(positions));
          break;
        case position_encoding::none:
          break;
      }
    });
  }

 private:
  P policy_;
  const T* x_;
  const packed_layout& layout_;
  std::byte* payload_;
  T* values_;
  unsigned threads_;
  std::uint32_t* words_;
  std::byte* offsets_;
};

/// k values of T from a memory resource, given back when it goes (a value codec's staging).
template <class T>
class resource_buffer {
 public:
  resource_buffer(std::pmr::memory_resource* mr, std::size_t count)
      : mr_(mr),
        bytes_(count * sizeof(T)),
        data_(static_cast<T*>(bytes_ == 0 ? nullptr : mr->allocate(bytes_, 64))) {}
  resource_buffer(const resource_buffer&) = delete;
  resource_buffer& operator=(const resource_buffer&) = delete;
  ~resource_buffer() {
    if (data_ != nullptr) mr_->deallocate(data_, bytes_, 64);
  }
  [[nodiscard]] T* get() const noexcept { return data_; }

 private:
  std::pmr::memory_resource* mr_;
  std::size_t bytes_;
  T* data_;
};

/// Writes the payload's Elias-Fano code from a bitmask and its running counts per block of 1024,
/// blocks of `ef_block_elements` in parallel.
template <class Offset>
void host_encode_positions(const std::uint32_t* words, const Offset* counts, const packed_layout& l,
                           std::byte* payload, unsigned threads) {
  const ef_shape s = ef_shape::of(l);
  auto* low = reinterpret_cast<std::uint64_t*>(payload + l.positions_offset);
  auto* high = reinterpret_cast<std::uint64_t*>(payload + l.high_offset);
  auto* ef_offsets = reinterpret_cast<Offset*>(payload + l.block_offsets_offset);
#if DROPIT_HOST_X86
  // 2 to 4 low bits (gamma about 0.75 to 0.97): a bitmask word at a time with BMI2, 64
  // elements at a time with AVX-512 VBMI2.
  const host_isa isa = active_host_isa();
  const bool word_at_a_time = isa >= host_isa::avx2 && s.l >= 2 && s.l <= 4;
  const bool vbmi2 = word_at_a_time && isa == host_isa::avx512 && host_has_vbmi2();
#endif
  parallel_for(threads, s.blocks(), [&](std::size_t b0, std::size_t b1, unsigned) {
    for (std::size_t b = b0; b < b1; ++b) {
#if DROPIT_HOST_X86
      if (vbmi2) {
        ef_encode_block_vbmi2(s, words, counts, b, low, high, ef_offsets);
        continue;
      }
      if (word_at_a_time) {
        ef_encode_block_bmi2(s, words, counts, b, low, high, ef_offsets);
        continue;
      }
#endif
      ef_encode_block(s, words, counts, b, low, high, ef_offsets);
    }
  });
}

/// Restores Elias-Fano blocks [b0, b1). With BMI2: zeros and each kept value at its index,
/// straight into the output, or (`stream`) into a stage in cache copied out in whole lines with
/// non-temporal stores. Else each block is decoded into a bitmask on the stack, then expanded as
/// the bitmask encoding is.
template <class T, class Offset>
void host_expand_elias_fano(const T* values, const std::byte* payload, const packed_layout& l,
                            std::size_t b0, std::size_t b1, T* out, restore_value<T> op,
                            host_isa isa, bool stream) {
  const ef_shape s = ef_shape::of(l);
  const auto* low = reinterpret_cast<const std::uint64_t*>(payload + l.positions_offset);
  const auto* high = reinterpret_cast<const std::uint64_t*>(payload + l.high_offset);
  const auto* ef_offsets = reinterpret_cast<const Offset*>(payload + l.block_offsets_offset);
#if DROPIT_HOST_X86
  if (ef_bmi2_decodes(s.l, isa)) {
    if (!stream) {
      for (std::size_t b = b0; b < b1; ++b)
        ef_scatter_block_bmi2(s, low, high, ef_offsets, b, values, out + b * ef_block_elements, op);
      return;
    }
    // The stage is zeroed once; moving a block out leaves it zero again.
    alignas(64) T stage[ef_block_elements];
    std::fill(stage, stage + ef_block_elements, T{});
    for (std::size_t b = b0; b < b1; ++b) {
      const std::size_t start = b * ef_block_elements;
      ef_scatter_block_bmi2(s, low, high, ef_offsets, b, values, stage, op, /*zeroed=*/true);
      stream_out_and_zero_avx512(out + start, stage, std::min(ef_block_elements, l.n - start));
    }
    _mm_sfence();  // the non-temporal stores are visible before the fork-join ends
    return;
  }
#endif
  alignas(64) std::uint32_t words[ef_block_words];
  Offset counts[ef_sub_blocks];
  for (std::size_t b = b0; b < b1; ++b) {
    ef_decode_block(s, low, high, ef_offsets, b, words, counts);
    const std::size_t start = b * ef_block_elements;
    const std::size_t len = std::min(ef_block_elements, l.n - start);
    host_expand_bitmask(values, l.k, words, counts, len, 0,
                        (len + block_elements - 1) / block_elements, out + start, op, isa, stream);
  }
}

/// Encodes the k values at `values` into the payload's codes and scales, chunks in parallel.
template <class T>
void host_encode(const T* values, const packed_layout& l, std::byte* payload,
                 const codec_params& codec, unsigned threads) {
  auto* codes = reinterpret_cast<std::uint8_t*>(payload + l.values_offset);
  auto* scales = reinterpret_cast<float*>(payload + l.scales_offset);
  const std::size_t k = l.k;
  const host_isa isa = active_host_isa();
  parallel_for(threads, codec_chunks(k), [&](std::size_t c0, std::size_t c1, unsigned) {
    for (std::size_t c = c0; c < c1; ++c)
      host_encode_chunk(values, k, c, codec, codes, scales, isa);
  });
}

/// Decodes the payload's k coded values into `values`, chunks in parallel.
template <class T>
void host_decode(const std::byte* payload, const packed_layout& l, T* values, unsigned threads) {
  const auto* codes = reinterpret_cast<const std::uint8_t*>(payload + l.values_offset);
  const auto* scales = reinterpret_cast<const float*>(payload + l.scales_offset);
  const std::size_t k = l.k;
  const host_isa isa = active_host_isa();
  parallel_for(threads, codec_chunks(k), [&](std::size_t c0, std::size_t c1, unsigned) {
    for (std::size_t c = c0; c < c1; ++c)
      host_decode_chunk(codes, scales, k, c, l.codec, values, isa);
  });
}

/**
 * The host pack on exactly `threads` workers (the executor picks the count), with the
 * selection's knobs exposed for tests and benchmarks.
 */
template <class T, class Policy>
[[nodiscard]] payload host_pack(const Policy& policy, const T* x, const packed_layout& layout,
                                unsigned threads, std::pmr::memory_resource* mr,
                                const host_select_tuning& tuning = {},
                                host_select_report* report = nullptr, codec_params codec = {}) {
  codec.kind = layout.codec;
  const bool coded = layout.codec != value_codec::exact;
  payload out;
  if (layout.total_bytes > 0) {
    out = payload(static_cast<std::byte*>(mr->allocate(layout.total_bytes, 64)), layout.total_bytes,
                  memory_space::host, &release_host, mr, nullptr);
  }
  const std::size_t n = layout.n;
  const std::size_t k = layout.k;
  if (k == 0) return out;
  zero_padding(out.data(), layout);
  T* values = reinterpret_cast<T*>(out.data() + layout.values_offset);
  if (k == n) {
    if (coded) {
      host_encode(x, layout, out.data(), codec, threads);
    } else {
      parallel_for(threads, n, [&](std::size_t b, std::size_t e, unsigned) {
        std::memcpy(values + b, x + b, (e - b) * sizeof(T));
      });
    }
    return out;
  }

  // A value codec encodes the kept values from a buffer the compact step fills.
  resource_buffer<T> staged(mr, coded ? k : 0);
  if (coded) values = staged.get();
  // The first fork-join comes after the sample: wake the workers now.
  parallel_prewake(threads);
  // The Elias-Fano code is made from the bitmask and its block offsets, written to a buffer.
  const bool ef = layout.positions == position_encoding::elias_fano;
  const bool bitmask = layout.positions == position_encoding::bitmask || ef;
  const std::size_t offset_size = layout.wide() ? 8 : 4;
  const std::size_t words_bytes = (layout.words() * 4 + 7) / 8 * 8;
  resource_buffer<std::byte> ef_buffer(mr, ef ? words_bytes + layout.blocks() * offset_size : 0);
  auto* words = ef        ? reinterpret_cast<std::uint32_t*>(ef_buffer.get())
                : bitmask ? reinterpret_cast<std::uint32_t*>(out.data() + layout.positions_offset)
                          : nullptr;
  std::byte* offsets =
      ef ? ef_buffer.get() + words_bytes : out.data() + layout.block_offsets_offset;
  host_steps<Policy, T> steps(policy, x, layout, out.data(), values, threads, tuning, mr, words,
                              offsets);
  run_selection(steps);
  if (ef) {
    if (layout.wide()) {
      host_encode_positions(words, reinterpret_cast<const std::uint64_t*>(offsets), layout,
                            out.data(), threads);
    } else {
      host_encode_positions(words, reinterpret_cast<const std::uint32_t*>(offsets), layout,
                            out.data(), threads);
    }
  }
  if (coded) host_encode(values, layout, out.data(), codec, threads);
  if (report != nullptr) *report = steps.report();
  return out;
}

/// The host restore on exactly `threads` workers. `streaming`: -1 lets `host_stream_output`
/// decide, 1 streams whenever the instruction set and alignment allow (tests), 0 never.
template <class T>
void host_restore(const payload& payload, const packed_layout& layout, T* out, double scale,
                  unsigned threads, int streaming = -1,
                  std::pmr::memory_resource* mr = std::pmr::get_default_resource()) {
  const std::size_t n = layout.n;
  const std::size_t k = layout.k;
  const restore_value<T> op{scale, scale != 1.0};
  const T* values = reinterpret_cast<const T*>(payload.data() + layout.values_offset);
  resource_buffer<T> decoded(mr, layout.codec != value_codec::exact && k < n ? k : 0);
  if (layout.codec != value_codec::exact && k > 0) {
    if (k == n) {  // dense: decode straight into out
      host_decode(payload.data(), layout, out, threads);
      if (op.apply) {
        parallel_for(threads, n, [&](std::size_t b, std::size_t e, unsigned) {
          for (std::size_t i = b; i < e; ++i)
            out[i] = op(out[i]);
        });
      }
      return;
    }
    host_decode(payload.data(), layout, decoded.get(), threads);
    values = decoded.get();
  }
  const std::byte* positions = payload.data() + layout.positions_offset;
  const host_isa isa = active_host_isa();
  const bool stream = streaming < 0
                          ? host_stream_output(out, n, isa)
                          : streaming == 1 && host_stream_output(out, std::size_t{0}, isa, true);
  if (layout.positions == position_encoding::elias_fano) {
    parallel_for(threads, layout.ef_blocks(), [&](std::size_t b0, std::size_t b1, unsigned) {
      if (layout.wide()) {
        host_expand_elias_fano<T, std::uint64_t>(values, payload.data(), layout, b0, b1, out, op,
                                                 isa, stream);
      } else {
        host_expand_elias_fano<T, std::uint32_t>(values, payload.data(), layout, b0, b1, out, op,
                                                 isa, stream);
      }
    });
    return;
  }
  parallel_for(threads, layout.blocks(), [&](std::size_t b0, std::size_t b1, unsigned) {
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
          host_expand_bitmask(values, k, words, reinterpret_cast<const std::uint64_t*>(offsets), n,
                              b0, b1, out, op, isa, stream);
        } else {
          host_expand_bitmask(values, k, words, reinterpret_cast<const std::uint32_t*>(offsets), n,
                              b0, b1, out, op, isa, stream);
        }
        break;
      }
      case position_encoding::elias_fano:  // restored above
        break;
      case position_encoding::index32:
        host_expand_index(values, reinterpret_cast<const std::uint32_t*>(positions), k, begin, end,
                          out, op);
        break;
      case position_encoding::index64:
        host_expand_index(values, reinterpret_cast<const std::uint64_t*>(positions), k, begin, end,
                          out, op);
        break;
    }
  });
}

}  // namespace detail

inline detail::payload host_executor::copy_in(std::span<const std::byte> bytes) const {
  if (bytes.empty()) return {};
  std::pmr::memory_resource* mr = memory_resource();
  detail::payload out(static_cast<std::byte*>(mr->allocate(bytes.size(), 64)), bytes.size(),
                      memory_space::host, &detail::release_host, mr, nullptr);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template <class T, class Policy, class Codec>
detail::payload host_executor::pack(const Policy& policy, const Codec& codec, const T* x,
                                    const packed_layout& layout) const {
  check_threads();
  return detail::host_pack(policy, x, layout,
                           detail::call_threads(*this, layout.n, detail::pack_cost(layout)),
                           memory_resource(), {}, nullptr, detail::params_of(codec));
}

template <class T>
void host_executor::restore(const detail::payload& payload, const packed_layout& layout, T* out,
                            double scale) const {
  check_threads();
  detail::host_restore(payload, layout, out, scale,
                       detail::call_threads(*this, layout.n, detail::restore_cost(layout, scale)),
                       -1, memory_resource());
}

}  // namespace dropit
