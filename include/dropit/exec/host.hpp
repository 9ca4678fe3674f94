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
 * Work runs on OpenMP threads when the caller compiles with OpenMP, else on std::thread (no extra
 * runtime is needed). Inputs below `parallel_threshold` elements take the single-thread path.
 * Every call is synchronous: it returns when the payload or the output is complete.
 *
 * The memory resource supplies the payload (the bytes `SparseCache::bytes()` reports), so a
 * framework's allocator can own and count it; it must outlive every cache packed with it.
 * Temporaries of a pack (per-block counts, a few bytes per 1024 elements) come from the global
 * heap.
 */
struct host_executor {
  /// @brief Where payloads of this executor live.
  static constexpr memory_space space = memory_space::host;

  /// @brief Inputs smaller than this many elements are packed and restored on one thread.
  static constexpr std::size_t parallel_threshold = std::size_t{1} << 18;

  unsigned threads = 0;  ///< worker threads; 0 means all hardware threads
  std::pmr::memory_resource* resource =
      nullptr;  ///< payload memory; null means the default resource

  /// @brief The thread count this executor uses for inputs of n elements.
  [[nodiscard]] unsigned thread_count(std::size_t n) const noexcept;
  /// @brief The memory resource payloads come from.
  [[nodiscard]] std::pmr::memory_resource* memory_resource() const noexcept {
    return resource != nullptr ? resource : std::pmr::get_default_resource();
  }

  /**
   * @brief Packs x (n = layout.n elements) into a new payload laid out as `layout`.
   * Called by `SparseCache::pack`; users call that instead.
   */
  template <class T, class Policy>
  [[nodiscard]] detail::payload pack(const Policy& policy, const T* x,
                                     const packed_layout& layout) const;

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
