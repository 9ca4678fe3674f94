/**
 * @file runtime_emulated.hpp
 * @brief The memory/stream layer of the emulated device: "device memory" is host memory, Thrust's
 * host device system (OpenMP) runs the algorithms, streams are accepted and ignored, and every
 * call has finished when it returns. Same names as `runtime_cuda.cuh`.
 */
#pragma once

#include <dropit/detail/cuda/error.hpp>

#include <thrust/execution_policy.h>

#include <cstddef>
#include <cstring>

namespace dropit::detail::rt {

[[nodiscard]] inline int current_device() noexcept {
  return 0;
}

inline void memcpy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t) noexcept {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

inline void copy_from_host(void* dst, const void* src, std::size_t bytes, cudaStream_t) noexcept {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

inline void zero_async(void* dst, std::size_t bytes, cudaStream_t) noexcept {
  if (bytes != 0) std::memset(dst, 0, bytes);
}

/// Nothing is launched here: a Thrust call that failed has thrown already.
inline void check_launch() noexcept {
}

/// Every pointer is "device" memory here.
inline void check_device_pointer(const void*, const char*) noexcept {
}
/// ... and host memory too: one address space.
inline void check_host_pointer(const void*, const char*) noexcept {
}

inline void stream_after(cudaStream_t, cudaStream_t) noexcept {
}

inline void* event_create() noexcept {
  return nullptr;
}
inline void event_record(void*, cudaStream_t) noexcept {
}
inline void event_wait(cudaStream_t, void*) noexcept {
}
inline void event_destroy(void*) noexcept {
}

/// Thrust algorithms on the device system (OpenMP), temporaries from `alloc`.
template <class Alloc>
[[nodiscard]] auto exec_policy(Alloc& alloc, cudaStream_t) {
  return thrust::device(alloc);
}

}  // namespace dropit::detail::rt
