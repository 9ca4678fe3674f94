// Implementation of dropit::cuda_executor (exec/cuda.cuh): the pack and restore drivers. Every
// step is a Thrust call over a portable body (portable.hpp) or, with nvcc and
// `cuda_kernels::fast`, a fast kernel (kernels.cuh) computing the same bytes.
#pragma once

#include <dropit/detail/cuda/kernels.cuh>
#include <dropit/detail/cuda/plan.hpp>
#include <dropit/detail/cuda/portable.hpp>
#include <dropit/detail/cuda/runtime.hpp>
#include <dropit/detail/cuda/selection.hpp>
#include <dropit/detail/steps.hpp>

#include <thrust/binary_search.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
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

/// All radix passes of one source: a histogram, then the state advances on the device.
template <class Src, class Key, class ExecPolicy>
void radix_select(ExecPolicy& pol, bool fast, cudaStream_t stream, const Src& src,
                  select_ctl<Key>* ctl, unsigned long long* hist) {
  constexpr int passes = radix_passes<typename Src::key_type>;
  for (int pass = 0; pass < passes; ++pass) {
    const bool last = pass == passes - 1;
#if !DROPIT_CUDA_EMULATED
    if (fast) {
      radix_pass_kernel<Src, Key>
          <<<item_grid(src.items()), fast_threads, 0, stream>>>(src, ctl, hist, last);
      rt::check_launch();
      continue;
    }
#else
    (void)fast;
    (void)stream;
#endif
    for_each_index(pol, src.items(), radix_histogram_fn<Src, Key>{src, ctl, hist});
    for_each_index(pol, 1, radix_advance_fn<Src, Key>{ctl, hist, last});
  }
}

/// The count pass (and the decision after it), over the blocks of x.
template <class P, class T, class Key, class ExecPolicy>
void count_pass(ExecPolicy& pol, bool fast, cudaStream_t stream, const P& policy, const T* x,
                std::size_t n, std::size_t blocks, const pack_temps<Key>& t) {
#if !DROPIT_CUDA_EMULATED
  if (fast) {
    count_kernel<<<warp_grid(blocks), fast_threads, 0, stream>>>(
        policy, x, n, blocks, t.ctl, t.above, t.within, t.cand_key, t.cand_index);
    rt::check_launch();
    return;
  }
#else
  (void)fast;
  (void)stream;
#endif
  for_each_index(
      pol, blocks,
      count_fn<P, T, Key>{policy, x, n, t.ctl, t.above, t.within, t.cand_key, t.cand_index});
  for_each_index(pol, 1, decide_fn<Key>{t.ctl});
}

/// Selects the k largest keys of x (0 < k < n) and writes the payload's values and positions.
template <class T, class P>
void pack_selected(const cuda_executor& e, const P& policy, const T* x, const packed_layout& l,
                   std::byte* payload, workspace_lease& lease, const select_tuning& tuning) {
  using Key = key_type_t<P, T>;
  const std::size_t n = l.n, k = l.k, blocks = l.blocks();
  const cudaStream_t stream = lease.stream();
  const bool fast = use_fast(e);
  const bool index_list = l.positions != position_encoding::bitmask;
  const select_plan plan = plan_select(n, k, blocks, tuning);

  carver measure(nullptr);
  (void)pack_temps<Key>::carve(measure, blocks, plan, index_list);
  std::byte* buffer = lease.take(measure.used());
  carver cut(buffer);
  const auto t = pack_temps<Key>::carve(cut, blocks, plan, index_list);
  lease_allocator alloc(lease);
  auto pol = rt::exec_policy(alloc, stream);

  // 1. Guess a key range from a sorted sample.
  rt::zero_async(t.hist, radix_bins * sizeof(unsigned long long), stream);
  for_each_index(pol, plan.samples, sample_fn<P, T, Key>{policy, x, n, plan.samples, t.sample});
  thrust::sort(pol, t.sample, t.sample + plan.samples, thrust::greater<Key>());
  for_each_index(pol, 1,
                 guess_fn<Key>{t.ctl, t.sample, plan.samples, plan.hi_rank, plan.lo_rank, n, k,
                               plan.parts, plan.part_cap, tuning.force_fallback});
  // 2. Count (first read of x) and decide.
  count_pass(pol, fast, stream, policy, x, n, blocks, t);
  // 3. Fallback (runs only if the guess missed): exact select over x, then count again.
  radix_select(pol, fast, stream, x_keys<P, T, Key>{policy, x, n}, t.ctl, t.hist);
  count_pass(pol, fast, stream, policy, x, n, blocks, t);
  // 4. Resolve the threshold: from the tie counts (ties) or from the candidates (cand).
  thrust::inclusive_scan(pol, t.within, t.within + blocks, t.within_prefix);
#if !DROPIT_CUDA_EMULATED
  if (fast) {
    ties_kernel<<<1, 1024, 0, stream>>>(policy, x, n, blocks, t.ctl, t.within_prefix);
    rt::check_launch();
  } else
#endif
  {
    for_each_index(pol, 1, ties_fn<P, T, Key>{policy, x, n, blocks, t.ctl, t.within_prefix});
  }
  radix_select(pol, fast, stream, candidate_keys<Key>{t.cand_key, plan.capacity}, t.ctl, t.hist);
  radix_select(pol, fast, stream, tie_indices<Key>{t.cand_key, t.cand_index, plan.capacity}, t.ctl,
               t.hist);
  // 5. Kept count per block, then each block's offset into the values.
  for_each_index(pol, blocks, kept_init_fn<Key>{t.ctl, t.above, t.within, t.kept});
  for_each_index(pol, plan.capacity,
                 kept_candidate_fn<Key>{t.ctl, t.cand_key, t.cand_index, t.kept});
  auto* values = reinterpret_cast<T*>(payload + l.values_offset);
  auto* positions = reinterpret_cast<std::uint32_t*>(payload + l.positions_offset);
  std::uint32_t* block_start =
      index_list ? t.block_start
                 : reinterpret_cast<std::uint32_t*>(payload + l.block_offsets_offset);
  thrust::exclusive_scan(pol, t.kept, t.kept + blocks, block_start);
  if (tuning.ctl_copy != nullptr)
    rt::memcpy_async(tuning.ctl_copy, t.ctl, sizeof(select_ctl<Key>), stream);
    // 6. Mark + compact (second read of x).
#if !DROPIT_CUDA_EMULATED
  if (fast) {
    if (index_list) {
      compact_kernel<false><<<warp_grid(blocks), fast_threads, 0, stream>>>(
          policy, x, n, blocks, t.ctl, block_start, values, positions);
    } else {
      compact_kernel<true><<<warp_grid(blocks), fast_threads, 0, stream>>>(
          policy, x, n, blocks, t.ctl, block_start, values, positions);
    }
    rt::check_launch();
    lease.give(buffer);
    return;
  }
#endif
  for_each_index(
      pol, blocks,
      compact_fn<P, T, Key>{policy, x, n, t.ctl, block_start, values,
                            index_list ? nullptr : positions, index_list ? positions : nullptr});
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

/// The executor's pack, with the selection's knobs exposed for tests.
template <class T, class P>
[[nodiscard]] payload pack(const cuda_executor& e, const P& policy, const T* x,
                           const packed_layout& l, const select_tuning& tuning = {}) {
  DROPIT_EXPECTS(!l.wide(), "pack: the CUDA executor packs fewer than 2^32 elements, got ", l.n);
  if (l.n != 0) rt::check_device_pointer(x, "pack: the input");
  return translate_errors([&] {
    const cudaStream_t stream = e.stream.get();
    device_memory_resource* mr = e.memory_resource();
    std::byte* data =
        l.total_bytes == 0 ? nullptr : static_cast<std::byte*>(mr->allocate(l.total_bytes, stream));
    payload out(data, l.total_bytes, memory_space::device, &release_device, mr, stream);
    if (l.k == 0) return out;
    if (l.k == l.n) {
      rt::memcpy_async(out.data() + l.values_offset, x, l.n * sizeof(T), stream);
      return out;
    }
    {
      call_workspace ws(e, stream);
      pack_selected(e, policy, x, l, out.data(), ws.lease(), tuning);
    }
    const padding_gaps gaps = padding_of(l);
    for (int i = 0; i < 2; ++i)
      rt::zero_async(out.data() + gaps.begin[i], gaps.end[i] - gaps.begin[i], stream);
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
    [[maybe_unused]] const bool fast = use_fast(e);
    const auto* values = reinterpret_cast<const T*>(p.data() + l.values_offset);
    const auto* positions = reinterpret_cast<const std::uint32_t*>(p.data() + l.positions_offset);
    switch (l.positions) {
      case position_encoding::none: {
        if (k == 0) {
          rt::zero_async(out, n * sizeof(T), stream);
        } else if (!op.apply) {
          rt::memcpy_async(out, values, n * sizeof(T), stream);
        } else {
          call_workspace ws(e, stream);
          lease_allocator alloc(ws.lease());
          auto pol = rt::exec_policy(alloc, stream);
          thrust::transform(pol, values, values + n, out, scale_fn<T>{op});
        }
        break;
      }
      case position_encoding::bitmask: {
        const auto* offsets =
            reinterpret_cast<const std::uint32_t*>(p.data() + l.block_offsets_offset);
#if !DROPIT_CUDA_EMULATED
        if (fast) {
          expand_bitmask_kernel<<<warp_grid(blocks), fast_threads, 0, stream>>>(
              values, positions, offsets, n, blocks, out, op);
          rt::check_launch();
          break;
        }
#endif
        call_workspace ws(e, stream);
        lease_allocator alloc(ws.lease());
        auto pol = rt::exec_policy(alloc, stream);
        for_each_index(pol, blocks, expand_bitmask_fn<T>{values, positions, offsets, n, out, op});
        break;
      }
      case position_encoding::index32: {
        call_workspace ws(e, stream);
        std::byte* buffer = ws.lease().take(blocks * sizeof(std::uint32_t));
        auto* first = reinterpret_cast<std::uint32_t*>(buffer);
        lease_allocator alloc(ws.lease());
        auto pol = rt::exec_policy(alloc, stream);
        const auto begins = thrust::make_transform_iterator(
            thrust::counting_iterator<std::uint32_t>(0), block_begin_fn{});
        thrust::lower_bound(pol, positions, positions + k, begins,
                            begins + static_cast<std::ptrdiff_t>(blocks), first);
#if !DROPIT_CUDA_EMULATED
        if (fast) {
          expand_index_kernel<<<warp_grid(blocks), fast_threads, 0, stream>>>(
              values, positions, first, n, k, blocks, out, op);
          rt::check_launch();
          ws.lease().give(buffer);
          break;
        }
#endif
        for_each_index(pol, blocks, expand_index_fn<T>{values, positions, first, n, k, out, op});
        ws.lease().give(buffer);
        break;
      }
      case position_encoding::index64:
        throw_error("restore: the CUDA executor does not restore 64-bit index lists (n >= 2^32)");
    }
    rt::stream_after(payload_stream, stream);  // freeing the payload waits for this restore
  });
}

}  // namespace detail::dev

template <class T, class Policy>
detail::payload cuda_executor::pack(const Policy& policy, const T* x,
                                    const packed_layout& layout) const {
  return detail::dev::pack(*this, policy, x, layout);
}

template <class T>
void cuda_executor::restore(const detail::payload& payload, const packed_layout& layout, T* out,
                            double scale) const {
  detail::dev::restore(*this, payload, layout, out, scale);
}

}  // namespace dropit
