/**
 * @file cuda_memory.cuh
 * @brief Where the CUDA executor's memory comes from: a stream-ordered `device_memory_resource`
 * for payloads (cudaMallocAsync by default, or a framework's caching allocator), a
 * `cuda_workspace` that keeps temporaries between calls.
 *
 * Included by `<dropit/exec/cuda.cuh>`; see that header for the executor.
 */
#pragma once

#include <dropit/detail/cuda/config.hpp>

#include <cstddef>
#include <vector>

namespace dropit {

/**
 * @brief A stream-ordered allocator of device memory: the interface a framework's caching
 * allocator implements to supply the CUDA executor's payloads and temporaries.
 *
 * `allocate(bytes, stream)` returns memory usable by work enqueued on `stream` after the call;
 * `deallocate(p, bytes, stream)` gives it back once the work enqueued on `stream` before the call
 * is done (`cudaMallocAsync` / `cudaFreeAsync` semantics). Memory must be at least 16-byte
 * aligned; bytes is never 0. `deallocate` must not throw.
 */
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;

  /// @brief Stream-ordered allocation of `bytes` (> 0) bytes.
  [[nodiscard]] void* allocate(std::size_t bytes, cudaStream_t stream) {
    return do_allocate(bytes, stream);
  }
  /// @brief Stream-ordered release of what `allocate(bytes, ...)` returned.
  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept {
    do_deallocate(p, bytes, stream);
  }

 private:
  virtual void* do_allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept = 0;
};

#if !DROPIT_CUDA_EMULATED
/**
 * @brief `cudaMallocAsync` / `cudaFreeAsync` on the device's current memory pool: the default
 * resource of the CUDA executor.
 * @throw dropit::cuda_error when the allocation fails.
 */
class cuda_async_resource final : public device_memory_resource {
  void* do_allocate(std::size_t bytes, cudaStream_t stream) override;
  void do_deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept override;
};
#else
/**
 * @brief The emulated device's memory: aligned host memory (the emulated build's stand-in for
 * `cuda_async_resource`; streams are ignored).
 */
class emulated_device_resource final : public device_memory_resource {
  void* do_allocate(std::size_t bytes, cudaStream_t stream) override;
  void do_deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept override;
};
#endif

/**
 * @brief The process-wide default resource: a `cuda_async_resource` (an
 * `emulated_device_resource` in the emulated build). Never destroyed.
 */
[[nodiscard]] device_memory_resource* default_device_resource() noexcept;

namespace detail {
class workspace_lease;
}

/**
 * @brief Device memory for the temporaries of pack and restore (radix histograms, per-block
 * counts, the candidate buffer, Thrust's scratch), kept between calls so that a steady stream of
 * packs of one size allocates nothing.
 *
 * A workspace grows to the largest call it served and keeps that memory until `release()` or
 * destruction. It serves one device and one call at a time (it is not thread-safe); calls on
 * different streams are ordered through an event, so a workspace never races with itself.
 * Without one, the executor uses a per-thread, per-device default workspace over the default
 * resource (or, when the executor has its own `resource`, takes the temporaries of each call
 * from that resource and gives them back at the end of the call).
 */
class cuda_workspace {
 public:
  /// @brief An empty workspace drawing from `resource` (null: `default_device_resource()`).
  explicit cuda_workspace(device_memory_resource* resource = nullptr) noexcept;
  cuda_workspace(const cuda_workspace&) = delete;
  cuda_workspace& operator=(const cuda_workspace&) = delete;
  /// @brief Releases what it holds (stream-ordered after the last call that used it).
  ~cuda_workspace();

  /// @brief Device bytes held now.
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// @brief Allocations taken from the resource since construction.
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }
  /// @brief The resource it draws from.
  [[nodiscard]] device_memory_resource* resource() const noexcept { return resource_; }
  /// @brief Gives every buffer back to the resource, after the work already enqueued with them.
  void release() noexcept;

 private:
  friend class detail::workspace_lease;
  struct slot {
    std::byte* data;
    std::size_t bytes;
    bool busy;
  };
  void release_on(cudaStream_t stream) noexcept;

  device_memory_resource* resource_;
  std::vector<slot> slots_;
  std::size_t allocations_ = 0;
  cudaStream_t last_ = nullptr;  ///< the stream of the last call
  bool used_ = false;            ///< whether a call has used it (and `ready_` was recorded)
  void* ready_ = nullptr;        ///< cudaEvent_t recorded at the end of the last call
};

}  // namespace dropit

#include <dropit/detail/cuda/memory.inl>
