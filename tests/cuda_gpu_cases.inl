// The device suite's cases that need a real CUDA device (included by cuda_suite.cpp under nvcc):
// stream asynchrony, cross-stream restore, host pointers, CUDA errors, stream_ref, managed memory.

#include <cuda/stream_ref>

namespace {

/// Keeps the stream busy for about `ms` milliseconds.
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void spin(cudaStream_t stream, double ms) {
  int khz = 0;
  check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(ms * khz));
  check(cudaGetLastError());
}

}  // namespace

TEST_CASE("cuda: pack and restore return without synchronizing the stream" * DROPIT_DEVICE) {
  test_stream stream;
  const auto exec = dropit::cuda_executor{stream.get()};
  const auto x = normal_values<float>((1 << 22) + 3, 21);
  device_buffer<float> dx(x), out(x.size());
  for (double g : {0.5, 0.9, 0.99}) {
    CAPTURE(g);
    dropit::SparseCache<float, dropit::MinK<>> cache{dropit::MinK<>{g}};
    cache.pack(exec, dx.cspan());  // warm the workspace
    stream.sync();
    spin(stream.get(), 500);
    cache.pack(exec, dx.cspan());
    cache.restore(exec, out.span());
    CHECK(cudaStreamQuery(stream.get()) == cudaErrorNotReady);  // still spinning: no sync
    CHECK(same_bits<float>(out.to_host(stream.get()),
                           dense_from<float>(x, oracle_mink<float>(x, expected_k(x.size(), g)))));
  }
}

TEST_CASE("cuda: a payload packed on one stream restores on another" * DROPIT_DEVICE) {
  test_stream first, second;
  const auto x = normal_values<float>((1 << 20) + 9, 22);
  const auto want = dense_from<float>(x, oracle_mink<float>(x, expected_k(x.size(), 0.9)));
  device_buffer<float> dx(x), out(x.size());
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  spin(first.get(), 200);  // the pack is still queued when the restore is enqueued
  cache.pack(dropit::cuda_executor{first.get()}, dx.cspan());
  cache.restore(dropit::cuda_executor{second.get()}, out.span());
  CHECK(same_bits<float>(out.to_host(second.get()), want));
  // Freeing the payload (on the first stream) waits for a restore still running on the second.
  spin(second.get(), 200);
  cache.restore(dropit::cuda_executor{second.get()}, out.span());
  cache.clear();
  dropit::SparseCache<float, dropit::MinK<0.9>> other;  // may reuse the freed memory
  other.pack(dropit::cuda_executor{first.get()}, dx.cspan());
  CHECK(same_bits<float>(out.to_host(second.get()), want));
  first.sync();
}

TEST_CASE("cuda: ::cuda::stream_ref and managed memory are accepted" * DROPIT_DEVICE) {
  test_stream stream;
  const auto x = normal_values<float>(10000, 23);
  float* managed = nullptr;
  check(cudaMallocManaged(&managed, x.size() * sizeof(float)));
  std::copy(x.begin(), x.end(), managed);
  device_buffer<float> out(x.size());
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::cuda_executor{::cuda::stream_ref{stream.get()}},
             std::span<const float>(managed, x.size()));
  cache.restore(dropit::cuda_executor{.stream = ::cuda::stream_ref{stream.get()}}, out.span());
  CHECK(same_bits<float>(out.to_host(stream.get()),
                         dense_from<float>(x, oracle_mink<float>(x, 1000))));
  check(cudaFree(managed));
}

TEST_CASE("cuda: host pointers are rejected with dropit::error before any work" * DROPIT_DEVICE) {
  test_stream stream;
  const auto exec = dropit::cuda_executor{stream.get()};
  const auto x = normal_values<float>(5000, 6);
  device_buffer<float> dx(x), out(x.size());
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(exec, dx.cspan());
  const auto before = bytes_to_host(cache.payload(), stream.get());
  auto unchanged = [&] {
    CHECK(cache.kept() == 500);
    CHECK(bytes_to_host(cache.payload(), stream.get()) == before);
    cache.restore(exec, out.span());
    CHECK(same_bits<float>(out.to_host(stream.get()),
                           dense_from<float>(x, oracle_mink<float>(x, 500))));
  };
  CHECK_THROWS_WITH_AS(cache.pack(exec, std::span<const float>(x)),
                       "dropit: pack: the input points to host memory "
                       "(cudaMemoryTypeUnregistered); the CUDA executor needs device or managed "
                       "memory",
                       dropit::error);
  unchanged();
  float* pinned = nullptr;
  check(cudaMallocHost(&pinned, x.size() * sizeof(float)));
  CHECK_THROWS_WITH_AS(cache.pack(exec, std::span<const float>(pinned, x.size())),
                       "dropit: pack: the input points to host memory (cudaMemoryTypeHost); the "
                       "CUDA executor needs device or managed memory",
                       dropit::error);
  unchanged();
  CHECK_THROWS_WITH_AS(cache.restore(exec, std::span<float>(pinned, x.size())),
                       "dropit: restore: the output points to host memory (cudaMemoryTypeHost); "
                       "the CUDA executor needs device or managed memory",
                       dropit::error);
  unchanged();
  // load takes host bytes: another cache's device payload is refused before the check reads it;
  // the same bytes from pinned host memory load.
  dropit::SparseCache<float, dropit::MinK<0.9>> other;
  other.pack(exec, dx.cspan());
  CHECK_THROWS_WITH_AS(
      cache.load(exec, other.size(), other.kept(), other.layout().positions, other.payload()),
      "dropit: load: the bytes point to device memory (cudaMemoryTypeDevice); it must be host or "
      "managed memory (copy a device payload to the host first)",
      dropit::error);
  unchanged();
  const auto other_bytes = bytes_to_host(other.payload(), stream.get());
  std::byte* pinned_bytes = nullptr;
  check(cudaMallocHost(&pinned_bytes, other_bytes.size()));
  std::copy(other_bytes.begin(), other_bytes.end(), pinned_bytes);
  cache.load(exec, other.size(), other.kept(), other.layout().positions,
             std::span<const std::byte>(pinned_bytes, other_bytes.size()));
  unchanged();
  check(cudaFreeHost(pinned_bytes));
  check(cudaFreeHost(pinned));
}

TEST_CASE("cuda: DROPIT_CUDA_TRY throws cuda_error with file, line, call and error string" *
          DROPIT_DEVICE) {
  std::string what;
  int line = 0;
  try {
    line = __LINE__ + 1;
    DROPIT_CUDA_TRY(cudaSetDevice(-1));
  } catch (const dropit::cuda_error& e) {
    what = e.what();
  }
  CHECK(what == dropit::detail::cuda_error_message("cudaSetDevice(-1)", __FILE__, line,
                                                   "cudaErrorInvalidDevice",
                                                   cudaGetErrorString(cudaErrorInvalidDevice)));
  CHECK(cudaGetLastError() == cudaSuccess);  // the error was cleared
}

TEST_CASE_TEMPLATE("cuda: fast and portable kernels write the same payload bytes" * DROPIT_DEVICE,
                   T, DROPIT_TEST_TYPES) {
  test_stream stream;
  const auto fast = dropit::cuda_executor{.stream = stream.get()};
  const auto portable =
      dropit::cuda_executor{.stream = stream.get(), .kernels = dropit::cuda_kernels::portable};
  for (std::size_t n : {std::size_t{1000}, (std::size_t{1} << 20) + 7, std::size_t{5} << 20}) {
    const auto x = normal_values<T>(n, 40 + n);
    for (double g : {0.1, 0.5, 0.9, 0.99}) {
      CAPTURE(n);
      CAPTURE(g);
      CHECK(device_payload<T>(dropit::MinK<>{g}, x, fast) ==
            device_payload<T>(dropit::MinK<>{g}, x, portable));
      CHECK(device_payload<T>(dropit::Random<>{g, 4}, x, fast) ==
            device_payload<T>(dropit::Random<>{g, 4}, x, portable));
    }
  }
}
