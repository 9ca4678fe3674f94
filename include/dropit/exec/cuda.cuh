/**
 * @file cuda.cuh
 * @brief `dropit::cuda_executor`: the executor that packs and restores device memory on a CUDA
 * stream.
 *
 * Compile with nvcc; or, to run the same executor on the CPU ("emulated device": device memory
 * is host memory, Thrust's OpenMP system runs the algorithms, streams are ignored), with any C++20
 * compiler and `-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -fopenmp`. Not included by
 * `<dropit/dropit.hpp>`.
 *
 * Streams are libcu++'s `cuda::stream_ref` (made from a `cudaStream_t`; default: stream 0), in
 * the emulated build too, where the handle is carried but no CUDA call is made. The executor's
 * name does not shadow libcu++'s `::cuda` namespace in code that says `using namespace dropit`.
 */
#pragma once

#include <dropit/detail/payload.hpp>
#include <dropit/exec/cuda_memory.cuh>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>
#include <span>

namespace dropit {

/// @brief Which kernels the CUDA executor runs; both produce the same bytes.
enum class cuda_kernels : std::uint8_t {
  fast,     ///< nvcc-only kernels (warp ballots, shared-memory histograms) where they exist
  portable  ///< Thrust algorithms over the shared step bodies only (what the emulated build runs)
};

/**
 * @brief Packs and restores device memory with work enqueued on one CUDA stream.
 *
 * @code
 * dropit::SparseCache<float, dropit::MinK<0.9>> cache;
 * cache.pack(dropit::cuda_executor{stream}, x);      // x: std::span<const float>, device memory
 * cache.restore(dropit::cuda_executor{stream}, out); // out: std::span<float>, device memory
 * @endcode
 *
 * **Stream order.** `pack` and `restore` enqueue their work on `stream` and return without
 * synchronizing it: k follows from n and the policy, and the selection's state lives and advances
 * on the device, so nothing travels back to the host. No call of this executor synchronizes a
 * stream or the device. The input of a pack must stay unchanged, and the output of a restore
 * untouched, until the stream reaches the call's work. Restoring on another stream than the one
 * the payload was packed on is allowed: the restore's stream first waits for the payload's stream,
 * and the payload's stream then waits for the restore, so that freeing the payload (stream-ordered
 * on its pack stream) never overtakes the restore. Both waits are device-side (events).
 *
 * **Memory.** The payload comes from `resource` (default: `cudaMallocAsync` on the stream) and is
 * given back, stream-ordered on its pack stream, when the cache is cleared, re-packed or
 * destroyed; that stream must still exist then. Temporaries come from `workspace` (default: the
 * thread's workspace for the current device; with a `resource` but no `workspace`, from
 * `resource` for the length of each call). Zero-byte payloads (k = 0) allocate nothing and still
 * live in `memory_space::device`.
 *
 * **Errors.** A pointer that is not device or managed memory (checked with
 * `cudaPointerGetAttributes`) is rejected with `dropit::error` before any work; a failing CUDA
 * call throws `dropit::cuda_error` (file, line, call, CUDA's error string). Either way the cache
 * keeps its previous content. Inputs of 2^32 or more elements are rejected with `dropit::error`.
 *
 * Configure with designated initialisers:
 * `dropit::cuda_executor{.stream = s, .resource = &mr, .workspace = &ws}`.
 */
struct cuda_executor {
  /// @brief Where payloads of this executor live.
  static constexpr memory_space space = memory_space::device;

  ::cuda::stream_ref stream{};  ///< every call's work goes on this stream
  device_memory_resource* resource =
      nullptr;                                ///< payload memory; null: `default_device_resource()`
  cuda_workspace* workspace = nullptr;        ///< temporaries; null: see the class description
  cuda_kernels kernels = cuda_kernels::fast;  ///< fast or portable kernels (same bytes)

  /// @brief The resource payloads come from.
  [[nodiscard]] device_memory_resource* memory_resource() const noexcept {
    return resource != nullptr ? resource : default_device_resource();
  }

  /**
   * @brief Enqueues the pack of x (layout.n elements of device memory) into a new payload laid out
   * as `layout`, its values stored with `codec`. Called by `SparseCache::pack`; users call that
   * instead.
   */
  template <class T, class Policy, class Codec>
  [[nodiscard]] detail::payload pack(const Policy& policy, const Codec& codec, const T* x,
                                     const packed_layout& layout) const;

  /**
   * @brief A new payload from the memory resource holding a copy of `bytes` (host memory); returns
   * once the copy is complete, so the bytes may be freed then. Called by `SparseCache::load`.
   */
  [[nodiscard]] detail::payload copy_in(std::span<const std::byte> bytes) const;

  /**
   * @brief Enqueues the restore of `payload` into out (layout.n elements of device memory),
   * multiplying kept values by `scale` when `scale != 1`. Called by `SparseCache::restore`.
   */
  template <class T>
  void restore(const detail::payload& payload, const packed_layout& layout, T* out,
               double scale) const;
};

}  // namespace dropit

#include <dropit/detail/cuda/cuda_executor.inl>
