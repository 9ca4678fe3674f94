// Implementation of dropit::cuda_executor (exec/cuda.cuh): the pack and restore drivers. Every
// step is a Thrust `for_each` over a portable body (portable.hpp) or, with nvcc and
// `cuda_kernels::fast`, that body's fast kernel (kernels.cuh) computing the same bytes.
#pragma once

#include <dropit/detail/codec.hpp>
#include <dropit/detail/cuda/kernels.cuh>
#include <dropit/detail/cuda/plan.hpp>
#include <dropit/detail/cuda/portable.hpp>
#include <dropit/detail/cuda/runtime.hpp>
#include <dropit/detail/cuda/selection.hpp>
#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/selection.hpp>
#include <dropit/detail/steps.hpp>

#include <thrust/binary_search.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/system_error.h>
#include <thrust/transform.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>

namespace dropit {
namespace detail::dev {

/// Runs `fn(i)` for i in [0, count) on the device.
template <class ExecPolicy, class F>
void for_each_index(ExecPolicy& pol, std::size_t count, const F& fn) {
  if (count != 0) thrust::for_each_n(pol, thrust::counting_iterator<std::size_t>(0), count, fn);
}

/// Whether the nvcc fast kernels run.
[[nodiscard]] inline bool use_fast(const cuda_executor& e) noexcept {
  return !DROPIT_CUDA_EMULATED && e.kernels == cuda_kernels::fast;
}

/// Runs the steps of one pack: a step's fast kernel when it has one and the executor asks for
/// it, else its body through Thrust (one launch either way); counts the launches.
struct step_launcher {
  bool fast;
  cudaStream_t stream;
  unsigned count = 0;
  template <class ExecPolicy, class Body>
  void operator()(ExecPolicy& pol, std::size_t items, const Body& body) {
    ++count;
    if constexpr (fast_kernel<Body>::exists) {
      if (fast) {
        fast_kernel<Body>::launch(body, stream);
        rt::check_launch();
        return;
      }
    }
    for_each_index(pol, items, body);
  }
};

/**
 * The device backend of `run_selection` (detail/selection.hpp): each step enqueues one launch
 * whatever the data (a step that is not due returns at once on the device), so the host never
 * waits for the device. With nvcc and `cuda_kernels::fast` the sample, count, resolve and compact
 * steps run their fast kernels.
 */
template <class T, class P, class ExecPolicy>
struct device_steps {
  using key_type = key_type_t<P, T>;
  using Key = key_type;
  P policy;
  const T* x;
  const packed_layout& l;
  std::byte* payload;
  T* values;                 ///< where the compact step writes the kept values
  std::uint32_t* ef_words;   ///< Elias-Fano: where the compact step writes the bitmask, else null
  std::uint32_t* ef_counts;  ///< Elias-Fano: where it writes the bitmask's block offsets
  const select_plan& plan;
  const pack_temps<Key, T>& t;
  bool force_fallback;
  ExecPolicy& pol;
  step_launcher& launch;

  void sample() {
    const sample_setup<Key> setup{
        l.n,        l.k,           plan.samples,   plan.hi_rank,   plan.lo_rank,
        plan.parts, plan.part_cap, plan.small_cap, plan.stage_cap, force_fallback};
    launch(pol, 1, sample_fn<P, T, Key>{policy, x, setup, t.sample, t.ctl, t.hist});
  }
  void count() {
    launch(pol, l.blocks(),
           count_fn<P, T, Key>{policy, x, l.n, l.blocks(), t.ctl, t.hist, t.cand_key, t.cand_index,
                               t.cells, t.stage, t.stage_at, t.ge_words});
  }
  void radix_pass(int) {
    launch(pol, l.blocks(), radix_fn<P, T, Key>{policy, x, l.n, t.ctl, t.hist + candidate_buckets});
  }
  void resolve() {
    launch(pol, chunks_of(plan.capacity),
           resolve_fn<Key>{t.ctl, t.cand_key, plan.capacity, t.small});
  }
  /// The Elias-Fano code's words, when its fast encode ORs bits into them: the fast compact
  /// kernel zeroes them first (the portable encode writes whole words).
  [[nodiscard]] std::uint64_t* ef_clear() const noexcept {
    if (l.positions != position_encoding::elias_fano || !launch.fast ||
        !fast_kernel<ef_encode_fn>::exists)
      return nullptr;
    return reinterpret_cast<std::uint64_t*>(payload + l.positions_offset);
  }
  void compact() {
    const bool ef = l.positions == position_encoding::elias_fano;
    const bool index_list = l.positions != position_encoding::bitmask && !ef;
    auto* positions =
        ef ? ef_words : reinterpret_cast<std::uint32_t*>(payload + l.positions_offset);
    auto* offsets =
        ef ? ef_counts : reinterpret_cast<std::uint32_t*>(payload + l.block_offsets_offset);
    launch(pol, l.blocks(),
           compact_fn<P, T, Key>{policy, x, l.n, l.blocks(), t.ctl, t.cells, t.stage, t.stage_at,
                                 t.ge_words, payload, padding_of(l), values,
                                 index_list ? nullptr : positions, index_list ? nullptr : offsets,
                                 index_list ? positions : nullptr, ef_clear(),
                                 ef_clear() != nullptr ? l.low_words() + l.high_words() : 0});
  }
};

/// Selects the k largest keys of x (0 < k < n) and writes the payload's values and positions.
template <class T, class P>
void pack_selected(const cuda_executor& e, const P& policy, const T* x, const packed_layout& l,
                   std::byte* payload, T* values, workspace_lease& lease,
                   const select_tuning& tuning) {
  using Key = key_type_t<P, T>;
  const cudaStream_t stream = lease.stream();
  const select_plan plan = plan_select<Key>(l.n, l.k, l.blocks(), tuning);
  carver measure(nullptr);
  (void)pack_temps<Key, T>::carve(measure, l.n, l.blocks(), plan);
  std::byte* buffer = lease.take(measure.used());
  carver cut(buffer);
  const auto t = pack_temps<Key, T>::carve(cut, l.n, l.blocks(), plan);
  lease_allocator alloc(lease);
  auto pol = rt::exec_policy(alloc, stream);
  // The Elias-Fano code is made from the bitmask and its block offsets, written to the workspace.
  const bool ef = l.positions == position_encoding::elias_fano;
  std::byte* ef_buffer =
      ef ? lease.take(l.words() * sizeof(std::uint32_t) + l.blocks() * sizeof(std::uint32_t))
         : nullptr;
  auto* ef_words = reinterpret_cast<std::uint32_t*>(ef_buffer);
  auto* ef_counts = ef ? ef_words + l.words() : nullptr;
  step_launcher launch{use_fast(e), stream};
  device_steps<T, P, decltype(pol)> steps{policy,   x,         l,    payload, values,
                                          ef_words, ef_counts, plan, t,       tuning.force_fallback,
                                          pol,      launch};
  run_selection(steps);
  if (ef) {
    launch(pol, l.ef_blocks(),
           ef_encode_fn{ef_shape::of(l), ef_words, ef_counts,
                        reinterpret_cast<std::uint64_t*>(payload + l.positions_offset),
                        reinterpret_cast<std::uint64_t*>(payload + l.high_offset),
                        reinterpret_cast<std::uint32_t*>(payload + l.block_offsets_offset)});
  }
  if (tuning.ctl_copy != nullptr)
    rt::memcpy_async(tuning.ctl_copy, t.ctl, sizeof(select_ctl<Key>), stream);
  if (tuning.launches != nullptr) *tuning.launches = launch.count;
  if (ef_buffer != nullptr) lease.give(ef_buffer);
  lease.give(buffer);
}

/// Chooses the workspace of a call: the executor's, else a call-local one over its resource, else
/// the thread's default.
class call_workspace {
 public:
  call_workspace(const cuda_executor& e, cudaStream_t stream)
      : ws_(pick(e)), lease_(*ws_, stream, local_.has_value()) {}
  [[nodiscard]] workspace_lease& lease() noexcept { return lease_; }

 private:
  cuda_workspace* pick(const cuda_executor& e) {
    if (e.workspace != nullptr) return e.workspace;
    if (e.resource != nullptr) return &local_.emplace(e.resource);
    return &default_workspace();
  }
  // Members are built in this order (local_ first, so that ws_ may point into it) and destroyed
  // in reverse (the lease ends before the call-local workspace goes).
  std::optional<cuda_workspace> local_;
  cuda_workspace* ws_;
  workspace_lease lease_;
};

/// Re-throws Thrust's CUDA errors as dropit::cuda_error, naming the dropit call (file and line)
/// that ran the failing Thrust algorithm.
template <class F>
decltype(auto) translate_errors(F&& f,
                                std::source_location where = std::source_location::current()) {
  try {
    return f();
  } catch (const error&) {
    throw;
  } catch (const thrust::system_error& ex) {
    throw cuda_error(concat("dropit: CUDA error at ", where.file_name(), ":", where.line(),
                            " in a Thrust algorithm: ", ex.what()));
  }
}

/// The body that encodes chunk c of k values into a payload's codes and scales.
template <class T>
struct encode_fn {
  const T* values;
  std::size_t k;
  codec_params codec;
  std::uint8_t* codes;
  float* scales;
  DROPIT_HD void operator()(std::size_t c) const {
    encode_chunk(values, k, c, codec, codes, scales);
  }
};

/// The body that decodes chunk c of a payload's k coded values.
template <class T>
struct decode_fn {
  const std::uint8_t* codes;
  const float* scales;
  std::size_t k;
  value_codec kind;
  T* values;
  DROPIT_HD void operator()(std::size_t c) const {
    decode_chunk(codes, scales, k, c, kind, values);
  }
};

/// Enqueues the encoding of k values at `values` (device memory) into the payload.
template <class T>
void encode_values(const T* values, const packed_layout& l, std::byte* payload,
                   const codec_params& codec, workspace_lease& lease) {
  lease_allocator alloc(lease);
  auto pol = rt::exec_policy(alloc, lease.stream());
  for_each_index(
      pol, codec_chunks(l.k),
      encode_fn<T>{values, l.k, codec, reinterpret_cast<std::uint8_t*>(payload + l.values_offset),
                   reinterpret_cast<float*>(payload + l.scales_offset)});
}

/// Enqueues the decoding of the payload's k coded values into `values` (device memory).
template <class T>
void decode_values(const std::byte* payload, const packed_layout& l, T* values,
                   workspace_lease& lease) {
  lease_allocator alloc(lease);
  auto pol = rt::exec_policy(alloc, lease.stream());
  for_each_index(pol, codec_chunks(l.k),
                 decode_fn<T>{reinterpret_cast<const std::uint8_t*>(payload + l.values_offset),
                              reinterpret_cast<const float*>(payload + l.scales_offset), l.k,
                              l.codec, values});
}

/// The executor's pack, with the selection's knobs exposed for tests.
template <class T, class P>
[[nodiscard]] payload pack(const cuda_executor& e, const P& policy, const T* x,
                           const packed_layout& l, const select_tuning& tuning = {},
                           codec_params codec = {}) {
  codec.kind = l.codec;
  const bool coded = l.codec != value_codec::exact;
  DROPIT_EXPECTS(!l.wide(), "pack: the CUDA executor packs fewer than 2^32 elements, got ", l.n);
  if (l.n != 0) rt::check_device_pointer(x, "pack: the input");
  return translate_errors([&] {
    const cudaStream_t stream = e.stream.get();
    device_memory_resource* mr = e.memory_resource();
    std::byte* data =
        l.total_bytes == 0 ? nullptr : static_cast<std::byte*>(mr->allocate(l.total_bytes, stream));
    payload out(data, l.total_bytes, memory_space::device, &release_device, mr, stream);
    if (l.k == 0) return out;
    if (l.k == l.n && !coded) {
      rt::memcpy_async(out.data() + l.values_offset, x, l.n * sizeof(T), stream);
      return out;
    }
    call_workspace ws(e, stream);
    if (coded) {
      if (l.k == l.n) {  // no compact step zeroes the padding: the gap after the codes
        const padding_gaps g = padding_of(l);
        if (g.end[0] > g.begin[0])
          rt::zero_async(out.data() + g.begin[0], g.end[0] - g.begin[0], stream);
        encode_values(x, l, out.data(), codec, ws.lease());
        return out;
      }
      std::byte* staged = ws.lease().take(l.k * sizeof(T));
      pack_selected(e, policy, x, l, out.data(), reinterpret_cast<T*>(staged), ws.lease(), tuning);
      encode_values(reinterpret_cast<const T*>(staged), l, out.data(), codec, ws.lease());
      ws.lease().give(staged);
      return out;
    }
    pack_selected(e, policy, x, l, out.data(), reinterpret_cast<T*>(out.data() + l.values_offset),
                  ws.lease(), tuning);
    return out;
  });
}

/// The executor's restore.
template <class T>
void restore(const cuda_executor& e, const payload& p, const packed_layout& l, T* out,
             double scale) {
  if (l.n != 0) rt::check_device_pointer(out, "restore: the output");
  translate_errors([&] {
    const cudaStream_t stream = e.stream.get();
    const auto payload_stream = static_cast<cudaStream_t>(p.stream());
    rt::stream_after(stream, payload_stream);  // the pack is done before the restore reads it
    const std::size_t n = l.n, k = l.k, blocks = l.blocks();
    const restore_value<T> op{scale, scale != 1.0};
    const auto* values = reinterpret_cast<const T*>(p.data() + l.values_offset);
    const auto* positions = reinterpret_cast<const std::uint32_t*>(p.data() + l.positions_offset);
    call_workspace ws(e, stream);
    // A value codec's values are decoded first: into out when dense, else into a buffer.
    if (l.codec != value_codec::exact && k > 0) {
      T* decoded = k == n ? out : reinterpret_cast<T*>(ws.lease().take(k * sizeof(T)));
      decode_values(p.data(), l, decoded, ws.lease());
      values = decoded;
    }
    switch (l.positions) {
      case position_encoding::none: {
        if (k == 0) {
          rt::zero_async(out, n * sizeof(T), stream);
        } else if (!op.apply) {
          if (values != out) rt::memcpy_async(out, values, n * sizeof(T), stream);
        } else {
          lease_allocator alloc(ws.lease());
          auto pol = rt::exec_policy(alloc, stream);
          thrust::transform(pol, values, values + n, out, scale_fn<T>{op});
        }
        break;
      }
      case position_encoding::bitmask: {
        const auto* offsets =
            reinterpret_cast<const std::uint32_t*>(p.data() + l.block_offsets_offset);
        lease_allocator alloc(ws.lease());
        auto pol = rt::exec_policy(alloc, stream);
        step_launcher launch{use_fast(e), stream};
        launch(pol, blocks, expand_bitmask_fn<T>{values, positions, offsets, n, out, op});
        break;
      }
      case position_encoding::elias_fano: {
        // Decoded into a bitmask in the workspace, then expanded as the bitmask encoding.
        // (words rounded up to an even count: the decoder stores 64 bits at a time)
        const std::size_t words_even = l.words() + (l.words() & 1);
        std::byte* buffer =
            ws.lease().take(words_even * sizeof(std::uint32_t) + blocks * sizeof(std::uint32_t));
        auto* words = reinterpret_cast<std::uint32_t*>(buffer);
        auto* counts = words + words_even;
        lease_allocator alloc(ws.lease());
        auto pol = rt::exec_policy(alloc, stream);
        step_launcher launch{use_fast(e), stream};
        launch(
            pol, l.ef_blocks(),
            ef_decode_fn{ef_shape::of(l),
                         reinterpret_cast<const std::uint64_t*>(p.data() + l.positions_offset),
                         reinterpret_cast<const std::uint64_t*>(p.data() + l.high_offset),
                         reinterpret_cast<const std::uint32_t*>(p.data() + l.block_offsets_offset),
                         words, counts});
        launch(pol, blocks, expand_bitmask_fn<T>{values, words, counts, n, out, op});
        ws.lease().give(buffer);
        break;
      }
      case position_encoding::index32: {
        std::byte* buffer = ws.lease().take(blocks * sizeof(std::uint32_t));
        auto* first = reinterpret_cast<std::uint32_t*>(buffer);
        lease_allocator alloc(ws.lease());
        auto pol = rt::exec_policy(alloc, stream);
        const auto begins = thrust::make_transform_iterator(
            thrust::counting_iterator<std::uint32_t>(0), block_begin_fn{});
        thrust::lower_bound(pol, positions, positions + k, begins,
                            begins + static_cast<std::ptrdiff_t>(blocks), first);
        step_launcher launch{use_fast(e), stream};
        launch(pol, blocks, expand_index_fn<T>{values, positions, first, n, k, out, op});
        ws.lease().give(buffer);
        break;
      }
      case position_encoding::index64:
        throw_error("restore: the CUDA executor does not restore 64-bit index lists (n >= 2^32)");
    }
    rt::stream_after(payload_stream, stream);  // freeing the payload waits for this restore
  });
}

/// A device payload holding a copy of host bytes, complete on return; device bytes are refused.
inline payload copy_in(const cuda_executor& e, std::span<const std::byte> bytes) {
  return translate_errors([&] {
    if (!bytes.empty()) rt::check_host_pointer(bytes.data(), "load: the bytes");
    const cudaStream_t stream = e.stream.get();
    device_memory_resource* mr = e.memory_resource();
    std::byte* data =
        bytes.empty() ? nullptr : static_cast<std::byte*>(mr->allocate(bytes.size(), stream));
    payload out(data, bytes.size(), memory_space::device, &release_device, mr, stream);
    rt::copy_from_host(data, bytes.data(), bytes.size(), stream);
    return out;
  });
}

}  // namespace detail::dev

inline detail::payload cuda_executor::copy_in(std::span<const std::byte> bytes) const {
  return detail::dev::copy_in(*this, bytes);
}

template <class T, class Policy, class Codec>
detail::payload cuda_executor::pack(const Policy& policy, const Codec& codec, const T* x,
                                    const packed_layout& layout) const {
  return detail::dev::pack(*this, policy, x, layout, {}, detail::params_of(codec));
}

template <class T>
void cuda_executor::restore(const detail::payload& payload, const packed_layout& layout, T* out,
                            double scale) const {
  detail::dev::restore(*this, payload, layout, out, scale);
}

}  // namespace dropit
