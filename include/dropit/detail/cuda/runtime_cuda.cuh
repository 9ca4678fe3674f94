/**
 * @file runtime_cuda.cuh
 * @brief The memory/stream layer on a real CUDA device: copies, fills, pointer checks, stream
 * ordering and the Thrust execution policy. `runtime_emulated.hpp` has the same names.
 */
#pragma once

#include <dropit/detail/cuda/error.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace dropit::detail::rt {

/// The device work runs on (the current device).
[[nodiscard]] inline int current_device() {
  int device = 0;
  DROPIT_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

/// Multiprocessors of the current device (queried once per device).
[[nodiscard]] inline unsigned sm_count() {
  thread_local std::vector<unsigned> counts;
  const int device = current_device();
  if (counts.size() <= static_cast<std::size_t>(device)) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    int sms = 0;
    DROPIT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    counts[device] = static_cast<unsigned>(sms);
  }
  return counts[device];
}

inline void memcpy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0)
    DROPIT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

/// Copies host memory to device memory and waits for the copy, so `src` may be freed on return
/// (pageable or pinned).
inline void copy_from_host(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  DROPIT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  DROPIT_CUDA_TRY(cudaStreamSynchronize(stream));
}

inline void zero_async(void* dst, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0) DROPIT_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, stream));
}

/// The CUDA runtime's memory type of p; throws dropit::error (naming `what`) for a pointer the
/// runtime cannot classify.
inline cudaMemoryType memory_type(const void* p, const char* what) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw_error(what, " is not a pointer the CUDA runtime knows (cudaPointerGetAttributes: ",
                cudaGetErrorString(status), ")");
  }
  return attributes.type;
}

/// Throws dropit::error unless p is device or managed memory; `what` names it in the message.
inline void check_device_pointer(const void* p, const char* what) {
  const cudaMemoryType type = memory_type(p, what);
  if (type == cudaMemoryTypeDevice || type == cudaMemoryTypeManaged) return;
  throw_error(what, " points to host memory (",
              type == cudaMemoryTypeHost ? "cudaMemoryTypeHost" : "cudaMemoryTypeUnregistered",
              "); the CUDA executor needs device or managed memory");
}

/// Throws dropit::error if p is device memory, which the host cannot read; `what` names it.
/// Host memory (pageable or pinned) and managed memory pass.
inline void check_host_pointer(const void* p, const char* what) {
  if (memory_type(p, what) != cudaMemoryTypeDevice) return;
  throw_error(what,
              " points to device memory (cudaMemoryTypeDevice); it must be host or managed "
              "memory (copy a device payload to the host first)");
}

/// Makes `waiter` wait for the work enqueued on `waited` so far (no host synchronization).
inline void stream_after(cudaStream_t waiter, cudaStream_t waited) {
  if (waiter == waited) return;
  cudaEvent_t event = nullptr;
  DROPIT_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, waited);
  const cudaError_t waited_on =
      recorded == cudaSuccess ? cudaStreamWaitEvent(waiter, event, 0) : recorded;
  (void)cudaEventDestroy(event);  // released once the wait has been satisfied
  DROPIT_CUDA_TRY(waited_on);
}

/// Reports a failed kernel launch.
inline void check_launch() {
  DROPIT_CUDA_TRY(cudaPeekAtLastError());
}

/// The workspace's "done" event: created on first use, recorded at the end of every call.
inline void* event_create() {
  cudaEvent_t event = nullptr;
  DROPIT_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}
inline void event_record(void* event, cudaStream_t stream) noexcept {
  (void)cudaEventRecord(static_cast<cudaEvent_t>(event), stream);
}
inline void event_wait(cudaStream_t stream, void* event) {
  DROPIT_CUDA_TRY(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event), 0));
}
inline void event_destroy(void* event) noexcept {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

/// Thrust algorithms on `stream`, temporaries from `alloc`, no synchronization at the end.
template <class Alloc>
[[nodiscard]] auto exec_policy(Alloc& alloc, cudaStream_t stream) {
  return thrust::cuda::par_nosync(alloc).on(stream);
}

}  // namespace dropit::detail::rt
