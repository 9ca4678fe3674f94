// Implementation of the CUDA executor's memory layer (exec/cuda_memory.cuh).
#pragma once

#include <dropit/detail/cuda/runtime.hpp>
#include <dropit/detail/payload.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace dropit {

#if !DROPIT_CUDA_EMULATED
inline void* cuda_async_resource::do_allocate(std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  DROPIT_CUDA_TRY(cudaMallocAsync(&p, bytes, stream));
  return p;
}
inline void cuda_async_resource::do_deallocate(void* p, std::size_t, cudaStream_t stream) noexcept {
  (void)cudaFreeAsync(p, stream);
}
inline device_memory_resource* default_device_resource() noexcept {
  static device_memory_resource* const resource = new cuda_async_resource();
  return resource;
}
#else
inline void* emulated_device_resource::do_allocate(std::size_t bytes, cudaStream_t) {
  return ::operator new (bytes, std::align_val_t{256});
}
inline void emulated_device_resource::do_deallocate(void* p, std::size_t, cudaStream_t) noexcept {
  ::operator delete (p, std::align_val_t{256});
}
inline device_memory_resource* default_device_resource() noexcept {
  static device_memory_resource* const resource = new emulated_device_resource();
  return resource;
}
#endif

inline cuda_workspace::cuda_workspace(device_memory_resource* resource) noexcept
    : resource_(resource != nullptr ? resource : default_device_resource()) {
}

inline cuda_workspace::~cuda_workspace() {
  release();
  detail::rt::event_destroy(ready_);
}

inline std::size_t cuda_workspace::bytes() const noexcept {
  std::size_t total = 0;
  for (const slot& s : slots_)
    total += s.bytes;
  return total;
}

inline void cuda_workspace::release_on(cudaStream_t stream) noexcept {
  for (const slot& s : slots_)
    resource_->deallocate(s.data, s.bytes, stream);
  slots_.clear();
}

inline void cuda_workspace::release() noexcept {
  if (slots_.empty()) return;
  // The default stream waits for the last call (whose stream may be gone by now), then frees.
  if (used_) {
    try {
      detail::rt::event_wait(nullptr, ready_);
    } catch (...) {
      // The runtime is shutting down or broken: nothing can still be running.
    }
  }
  release_on(nullptr);
}

namespace detail {

/// Frees a device payload on the stream it was made on (SparseCache's release function).
inline void release_device(void* resource, void* stream, std::byte* data,
                           std::size_t bytes) noexcept {
  static_cast<device_memory_resource*>(resource)->deallocate(data, bytes,
                                                             static_cast<cudaStream_t>(stream));
}

/**
 * One call's use of a workspace: orders the call's stream after the workspace's previous call,
 * hands out buffers (best fit among the free ones, else a new allocation), and records the
 * workspace's event when the call ends. A lease over a call-local workspace releases it on the
 * call's stream.
 */
class workspace_lease {
 public:
  workspace_lease(cuda_workspace& ws, cudaStream_t stream, bool call_local)
      : ws_(ws), stream_(stream), call_local_(call_local) {
    if (ws_.ready_ == nullptr) ws_.ready_ = rt::event_create();
    if (ws_.used_ && ws_.last_ != stream_) rt::event_wait(stream_, ws_.ready_);
    ws_.last_ = stream_;
    ws_.used_ = true;
  }
  workspace_lease(const workspace_lease&) = delete;
  workspace_lease& operator=(const workspace_lease&) = delete;
  ~workspace_lease() {
    for (auto& s : ws_.slots_)
      s.busy = false;
    rt::event_record(ws_.ready_, stream_);
    if (call_local_) ws_.release_on(stream_);
  }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// A buffer of at least `bytes` bytes (256-byte aligned by the resource), busy until give().
  [[nodiscard]] std::byte* take(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 256);
    cuda_workspace::slot* best = nullptr;
    for (auto& s : ws_.slots_) {
      if (!s.busy && s.bytes >= bytes && (best == nullptr || s.bytes < best->bytes)) best = &s;
    }
    if (best != nullptr) {
      best->busy = true;
      return best->data;
    }
    // Free buffers too small for this request are likely outgrown: give them back first.
    auto small = std::stable_partition(ws_.slots_.begin(), ws_.slots_.end(),
                                       [](const cuda_workspace::slot& s) { return s.busy; });
    for (auto it = small; it != ws_.slots_.end(); ++it)
      ws_.resource_->deallocate(it->data, it->bytes, stream_);
    ws_.slots_.erase(small, ws_.slots_.end());
    ws_.slots_.reserve(ws_.slots_.size() + 1);  // so that push_back cannot throw after allocate
    auto* data = static_cast<std::byte*>(ws_.resource_->allocate(bytes, stream_));
    ws_.slots_.push_back({data, bytes, true});
    ++ws_.allocations_;
    return data;
  }

  /// Returns a buffer from take(); the work already enqueued with it stays ordered before any
  /// later use, since every use is on this lease's stream.
  void give(std::byte* data) noexcept {
    for (auto& s : ws_.slots_) {
      if (s.data == data) s.busy = false;
    }
  }

 private:
  cuda_workspace& ws_;
  cudaStream_t stream_;
  bool call_local_;
};

/// Thrust's temporary-storage allocator over a workspace lease.
class lease_allocator {
 public:
  using value_type = char;
  explicit lease_allocator(workspace_lease& lease) noexcept : lease_(&lease) {}
  [[nodiscard]] char* allocate(std::ptrdiff_t n) {
    return reinterpret_cast<char*>(lease_->take(static_cast<std::size_t>(n)));
  }
  void deallocate(char* p, std::size_t) noexcept { lease_->give(reinterpret_cast<std::byte*>(p)); }

 private:
  workspace_lease* lease_;
};

/// The calling thread's default workspace for the current device.
[[nodiscard]] inline cuda_workspace& default_workspace() {
  thread_local std::vector<std::unique_ptr<cuda_workspace>> per_device;
  const auto device = static_cast<std::size_t>(rt::current_device());
  if (per_device.size() <= device) per_device.resize(device + 1);
  if (!per_device[device]) per_device[device] = std::make_unique<cuda_workspace>();
  return *per_device[device];
}

}  // namespace detail
}  // namespace dropit
