// Helpers of the device test suite: device buffers, a stream, the executors every case runs on,
// and the skip rule. The same source builds for the emulated device (g++, Thrust's OpenMP system:
// "device memory" is host memory) and for a real CUDA device (nvcc).
#pragma once

#include <dropit/exec/cuda.cuh>

#include "executors.hpp"
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace dropit_test {

#if DROPIT_CUDA_EMULATED
/// Why the device cases cannot run here ("" when they can).
inline std::string no_device_reason() {
  return {};
}

/// Emulated device memory: host memory.
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : v_(n) {}
  explicit device_buffer(const std::vector<T>& host) : v_(host) {}
  [[nodiscard]] T* data() noexcept { return v_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
  [[nodiscard]] std::span<T> span() noexcept { return v_; }
  [[nodiscard]] std::span<const T> cspan() const noexcept { return v_; }
  [[nodiscard]] std::vector<T> to_host(cudaStream_t) const { return v_; }

 private:
  std::vector<T> v_;
};

class test_stream {
 public:
  [[nodiscard]] cudaStream_t get() const noexcept { return nullptr; }
  void sync() const noexcept {}
};

inline std::vector<std::byte> bytes_to_host(std::span<const std::byte> s, cudaStream_t) {
  return {s.begin(), s.end()};
}
#else
inline void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("test: ") + cudaGetErrorString(e));
}

inline std::string no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return count == 0 ? "cudaGetDeviceCount found no device" : "";
}

/// Device memory (cudaMalloc); copies are synchronous after a stream sync.
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n_ != 0) check(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) {
    if (n_ != 0) check(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before its DMA lands, and it runs on the legacy
    // default stream, which the suite's non-blocking streams do not wait for: finish it here.
    check(cudaDeviceSynchronize());
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::span<T> span() noexcept { return {p_, n_}; }
  [[nodiscard]] std::span<const T> cspan() const noexcept { return {p_, n_}; }
  [[nodiscard]] std::vector<T> to_host(cudaStream_t stream) const {
    check(cudaStreamSynchronize(stream));
    std::vector<T> host(n_);
    if (n_ != 0) check(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// A non-blocking stream of its own (so that nothing rides on the default stream's syncs).
class test_stream {
 public:
  test_stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  ~test_stream() { (void)cudaStreamDestroy(s_); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  void sync() const { check(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

inline std::vector<std::byte> bytes_to_host(std::span<const std::byte> s, cudaStream_t stream) {
  check(cudaStreamSynchronize(stream));
  std::vector<std::byte> host(s.size());
  if (!s.empty()) check(cudaMemcpy(host.data(), s.data(), s.size(), cudaMemcpyDeviceToHost));
  return host;
}
#endif

/// True when the device cases must be skipped (computed once, at static initialisation).
inline bool skip_device() {
  static const bool skip = !no_device_reason().empty();
  return skip;
}

/// The fast kernels (nvcc) and the portable path: every case runs on both.
struct fast_kernels {
  static constexpr dropit::cuda_kernels kernels = dropit::cuda_kernels::fast;
};
struct portable_kernels {
  static constexpr dropit::cuda_kernels kernels = dropit::cuda_kernels::portable;
};

/// A case's element type and kernel set, as a configuration of the shared cases (executors.hpp).
template <class T, class K>
struct on {
  using type = T;
  template <class U>
  using buffer = device_buffer<U>;
  static constexpr dropit::memory_space space = dropit::memory_space::device;
  static dropit::cuda_executor exec(cudaStream_t s) { return {.stream = s, .kernels = K::kernels}; }
  /// A case's own stream.
  struct session {
    test_stream stream;
    [[nodiscard]] dropit::cuda_executor exec() const { return on::exec(stream.get()); }
    template <class U>
    [[nodiscard]] std::vector<U> to_host(const device_buffer<U>& b) const {
      return b.to_host(stream.get());
    }
    [[nodiscard]] std::vector<std::byte> bytes(std::span<const std::byte> p) const {
      return bytes_to_host(p, stream.get());
    }
  };
  static std::string name() {
    return type_name<T>() + (K::kernels == dropit::cuda_kernels::fast ? "/fast" : "/portable");
  }
};

}  // namespace dropit_test

#if DROPIT_CUDA_EMULATED
// The emulated build has one path (fast falls back to portable), so each type runs once.
#define DROPIT_DEVICE_CASES                                   \
  dropit_test::on<float, dropit_test::portable_kernels>,      \
      dropit_test::on<double, dropit_test::portable_kernels>, \
      dropit_test::on<__half, dropit_test::portable_kernels>, \
      dropit_test::on<__nv_bfloat16, dropit_test::portable_kernels>
#else
#define DROPIT_DEVICE_CASES                                      \
  dropit_test::on<float, dropit_test::fast_kernels>,             \
      dropit_test::on<double, dropit_test::fast_kernels>,        \
      dropit_test::on<__half, dropit_test::fast_kernels>,        \
      dropit_test::on<__nv_bfloat16, dropit_test::fast_kernels>, \
      dropit_test::on<float, dropit_test::portable_kernels>,     \
      dropit_test::on<double, dropit_test::portable_kernels>,    \
      dropit_test::on<__half, dropit_test::portable_kernels>,    \
      dropit_test::on<__nv_bfloat16, dropit_test::portable_kernels>
#endif

/// Every device case carries this decorator: it is skipped, visibly, without a device.
#define DROPIT_DEVICE doctest::skip(dropit_test::skip_device())
