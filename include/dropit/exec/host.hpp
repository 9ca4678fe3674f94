/**
 * @file host.hpp
 * @brief `dropit::host`: the executor that packs and restores on the CPU's cores.
 */
#pragma once

#include <dropit/detail/payload.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <cstddef>
#include <memory_resource>
#include <span>

namespace dropit {

/**
 * @brief Runs pack and restore on the host's cores, with payload memory from a
 * `std::pmr::memory_resource`.
 *
 * `dropit::host` uses every hardware thread and `std::pmr::get_default_resource()`. Configure one
 * with designated initialisers:
 * @code
 * dropit::host_executor exec{.threads = 2, .resource = &my_resource};
 * cache.pack(exec, x);
 * @endcode
 * Work runs on OpenMP threads when the caller compiles with OpenMP, else on a pool of std::threads
 * that starts on first use and stays (no extra runtime is needed); workers take chunks of the
 * work from a shared counter, so a worker the OS has not scheduled delays nothing, and a worker
 * that cannot be started (no memory, no thread) leaves its chunks to those that run. Inputs below
 * `parallel_threshold` elements take the single-thread path. Every call is synchronous: it
 * returns when the payload or the output is complete. The vector kernels are chosen at run time
 * (SSE2, AVX2 or AVX-512 on x86-64); no compiler flag is needed. Inputs larger than half the
 * last-level cache are read once by a pack (the kept values are staged during the counting pass),
 * and a restore into a 64-byte aligned output of that size writes with non-temporal stores.
 *
 * The memory resource supplies the payload (the bytes `SparseCache::bytes()` reports), so a
 * framework's allocator can own and count it, and, with a value codec, the buffer of kept values
 * a pack encodes from and a restore decodes into; it must outlive every cache packed with it.
 * Temporaries of a pack (a sample of keys, the candidates near the threshold: about 1% of x for
 * gamma = 0.9, and a few bytes per 1024 elements) come from the global heap.
 */
struct host_executor {
  /// @brief Where payloads of this executor live.
  static constexpr memory_space space = memory_space::host;

  /**
   * @brief Inputs smaller than this many elements are packed and restored on one thread.
   *
   * Measured on 2 cores (bench/README.md, `threads/` cases): two threads start to pay off at
   * 2^16 to 2^17 elements (pack and restore, fp32, workers busy); with workers that have gone to
   * sleep the std::thread pool breaks even later, OpenMP at about the same size.
   */
  static constexpr std::size_t parallel_threshold = std::size_t{1} << 17;

  /// @brief The most threads an executor may ask for; more is a `dropit::error` at pack/restore.
  static constexpr unsigned max_threads = 1024;

  unsigned threads = 0;  ///< worker threads (at most max_threads); 0 means all hardware threads
  std::pmr::memory_resource* resource =
      nullptr;  ///< payload memory; null means the default resource
  /**
   * @brief Whether a call may run on fewer threads than `thread_count(n)` when forking would
   * cost more than it saves. The executor measures what its fork-joins cost (from about a
   * microsecond when the workers spin to tens of microseconds when they sleep, e.g. OpenMP with
   * OMP_WAIT_POLICY=passive in a LibTorch process on a busy virtual machine) and keeps a call on
   * the calling thread when the work it would hand to the other threads is smaller than that.
   * The payload and the output are the same whatever the thread count. false: always
   * `thread_count(n)` threads.
   */
  bool adaptive = true;

  /// @brief Throws `dropit::error` if `threads` exceeds max_threads (pack and restore call it).
  void check_threads() const;
  /// @brief The most threads this executor uses for inputs of n elements (1 below
  /// `parallel_threshold`; an `adaptive` executor may use fewer, see there).
  [[nodiscard]] unsigned thread_count(std::size_t n) const noexcept;
  /// @brief The memory resource payloads come from.
  [[nodiscard]] std::pmr::memory_resource* memory_resource() const noexcept {
    return resource != nullptr ? resource : std::pmr::get_default_resource();
  }

  /**
   * @brief Packs x (n = layout.n elements) into a new payload laid out as `layout`, its values
   * stored with `codec` (of `layout.codec`'s kind). Called by `SparseCache::pack`; users call that
   * instead.
   */
  template <class T, class Policy, class Codec>
  [[nodiscard]] detail::payload pack(const Policy& policy, const Codec& codec, const T* x,
                                     const packed_layout& layout) const;

  /// @brief A new payload from the memory resource holding a copy of `bytes`. Called by
  /// `SparseCache::load`.
  [[nodiscard]] detail::payload copy_in(std::span<const std::byte> bytes) const;

  /**
   * @brief Writes the dense tensor held in `payload` to out (layout.n elements), multiplying kept
   * values by `scale` when `scale != 1`. Called by `SparseCache::restore`.
   */
  template <class T>
  void restore(const detail::payload& payload, const packed_layout& layout, T* out,
               double scale) const;
};

/// @brief The default host executor: all hardware threads, the default memory resource.
inline constexpr host_executor host{};

}  // namespace dropit

#include <dropit/detail/host/host_executor.inl>
