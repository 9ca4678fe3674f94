// Google Benchmark: pack and restore on a CUDA device, each iteration timed with CUDA events
// (manual time), next to cudaMemcpyAsync device-to-device of the same tensor as the bandwidth
// reference. Counters: bytes_per_second = input bytes (n * sizeof(T)) per second;
// payload_B_per_elem = payload bytes per input element. See bench/README.md.
//
//   cuda_bench [--benchmark_filter=...] [--benchmark_min_time=0.2] [--max_log2_n=28]
#include <dropit/dropit.hpp>
#include <dropit/exec/cuda.cuh>

#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include <cuda_runtime_api.h>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cuda_bench: ") + cudaGetErrorString(e));
}

/// Normal(0, 1) values from a counter-based hash and Box-Muller, generated on the device.
template <class T>
struct normal_fn {
  __device__ T operator()(std::size_t i) const {
    const std::uint64_t h1 = dropit::detail::mix64(i * 0x9e3779b97f4a7c15ull + 12345);
    const std::uint64_t h2 = dropit::detail::mix64(h1);
    const float u1 = (static_cast<float>(h1 >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>(h2 >> 40) * (1.0f / 16777216.0f);
    return T(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
};

/// One device tensor, a stream and two events per benchmark.
template <class T>
struct setup {
  std::size_t n;
  T* x = nullptr;
  T* out = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  explicit setup(std::size_t n_) : n(n_) {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    check(cudaMalloc(&x, n * sizeof(T)));
    check(cudaMalloc(&out, n * sizeof(T)));
    thrust::transform(thrust::cuda::par_nosync.on(stream),
                      thrust::counting_iterator<std::size_t>(0),
                      thrust::counting_iterator<std::size_t>(n), x, normal_fn<T>{});
    check(cudaEventCreate(&start));
    check(cudaEventCreate(&stop));
    check(cudaStreamSynchronize(stream));
  }
  ~setup() {
    (void)cudaStreamSynchronize(stream);
    (void)cudaFree(x);
    (void)cudaFree(out);
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    (void)cudaStreamDestroy(stream);
  }
  /// Runs f (which enqueues on `stream`) between two events; the iteration's time in seconds.
  template <class F>
  double time(F&& f) {
    check(cudaEventRecord(start, stream));
    f();
    check(cudaEventRecord(stop, stream));
    check(cudaEventSynchronize(stop));
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3;
  }
};

template <class T>
void finish(benchmark::State& state, std::size_t n, std::size_t payload_bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(T)));
  state.counters["payload_B_per_elem"] =
      static_cast<double>(payload_bytes) / static_cast<double>(n);
}

template <class T>
void bench_memcpy(benchmark::State& state) {
  setup<T> s(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    state.SetIterationTime(s.time([&] {
      check(cudaMemcpyAsync(s.out, s.x, s.n * sizeof(T), cudaMemcpyDeviceToDevice, s.stream));
    }));
  }
  finish<T>(state, s.n, s.n * sizeof(T));
}

template <class T, class P>
void bench_pack(benchmark::State& state, P policy,
                dropit::position_choice positions = dropit::position_choice::smallest) {
  setup<T> s(static_cast<std::size_t>(state.range(0)));
  const auto exec = dropit::cuda_executor{s.stream};
  const std::span<const T> x(s.x, s.n);
  dropit::SparseCache<T, P> cache{policy, {}, positions};
  cache.pack(exec, x);  // warm-up: the workspace and the memory pool
  check(cudaStreamSynchronize(s.stream));
  for (auto _ : state) {
    state.SetIterationTime(s.time([&] { cache.pack(exec, x); }));
  }
  finish<T>(state, s.n, cache.bytes());
  // Kernel launches of one pack (the same on every pack of this size and policy: no step waits
  // for the host), and how many of them did work on this input.
  unsigned launches = 0;
  const auto layout =
      dropit::make_layout(s.n, policy.kept(s.n), sizeof(T), dropit::value_codec::exact, positions);
  if (layout.k != 0 && layout.k != layout.n) {
    using Key = dropit::detail::key_type_t<P, T>;
    using ctl_t = dropit::detail::dev::select_ctl<Key>;
    void* ctl = nullptr;
    check(cudaMalloc(&ctl, sizeof(ctl_t)));
    (void)dropit::detail::dev::pack(exec, policy, s.x, layout,
                                    {.ctl_copy = ctl, .launches = &launches});
    alignas(ctl_t) unsigned char host[sizeof(ctl_t)];
    check(cudaMemcpyAsync(host, ctl, sizeof(ctl_t), cudaMemcpyDeviceToHost, s.stream));
    check(cudaStreamSynchronize(s.stream));
    check(cudaFree(ctl));
    const auto* c = reinterpret_cast<const ctl_t*>(host);
    state.counters["working_launches"] = static_cast<double>(__builtin_popcount(c->worked));
    state.counters["x_passes"] = static_cast<double>(c->x_passes);
  }
  state.counters["launches"] = static_cast<double>(launches);
}

template <class T, class P>
void bench_restore(benchmark::State& state, P policy,
                   dropit::position_choice positions = dropit::position_choice::smallest) {
  setup<T> s(static_cast<std::size_t>(state.range(0)));
  const auto exec = dropit::cuda_executor{s.stream};
  dropit::SparseCache<T, P> cache{policy, {}, positions};
  cache.pack(exec, std::span<const T>(s.x, s.n));
  const std::span<T> out(s.out, s.n);
  cache.restore(exec, out);
  check(cudaStreamSynchronize(s.stream));
  for (auto _ : state) {
    state.SetIterationTime(s.time([&] { cache.restore(exec, out); }));
  }
  finish<T>(state, s.n, cache.bytes());
}

template <class T>
void register_type(const std::string& type, const std::vector<std::int64_t>& sizes) {
  auto add = [&](const std::string& name, auto fn) {
    auto* b = benchmark::RegisterBenchmark(name.c_str(), fn);
    for (std::int64_t n : sizes)
      b->Arg(n);
    b->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  add("memcpy/" + type, [](benchmark::State& st) { bench_memcpy<T>(st); });
  for (double g : {0.5, 0.9, 0.99}) {
    const std::string gs = std::to_string(g).substr(0, 4);
    add("pack/MinK/" + gs + "/" + type,
        [g](benchmark::State& st) { bench_pack<T>(st, dropit::MinK<>{g}); });
    add("pack/Random/" + gs + "/" + type, [g](benchmark::State& st) {
      bench_pack<T>(st, dropit::Random<>{g, 7});
    });
    add("restore/MinK/" + gs + "/" + type,
        [g](benchmark::State& st) { bench_restore<T>(st, dropit::MinK<>{g}); });
    add("restore/Random/" + gs + "/" + type, [g](benchmark::State& st) {
      bench_restore<T>(st, dropit::Random<>{g, 7});
    });
    if (g > 0.5) {  // the bitmask where the smallest code is Elias-Fano: the cost of the code
      const auto mask = dropit::position_choice::no_elias_fano;
      add("pack/MinK/" + gs + "/bitmask/" + type,
          [g, mask](benchmark::State& st) { bench_pack<T>(st, dropit::MinK<>{g}, mask); });
      add("restore/MinK/" + gs + "/bitmask/" + type,
          [g, mask](benchmark::State& st) { bench_restore<T>(st, dropit::MinK<>{g}, mask); });
    }
  }
  add("pack/Identity/" + type, [](benchmark::State& st) { bench_pack<T>(st, dropit::Identity{}); });
  add("restore/Identity/" + type,
      [](benchmark::State& st) { bench_restore<T>(st, dropit::Identity{}); });
}

}  // namespace

int main(int argc, char** argv) {
  int max_log2 = 28;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_log2_n=", 13) == 0) {
      max_log2 = std::atoi(argv[i] + 13);
    } else {
      args.push_back(argv[i]);
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  // Payloads come from cudaMallocAsync's default pool; keep its memory between iterations (as a
  // framework's caching allocator would) instead of returning it to the driver at every sync.
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

  std::vector<std::int64_t> sizes;
  for (int lg = 20; lg <= max_log2; lg += 4)
    sizes.push_back(std::int64_t{1} << lg);
  register_type<float>("float", sizes);
  register_type<__half>("half", sizes);

  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
