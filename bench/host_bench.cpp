// Google Benchmark: pack and restore on the host executor next to their baselines, all in one
// binary and one run, so that ratios compare like with like on a shared, noisy machine:
// - memcpy of the input (the bandwidth reference), a streaming read of the input on the
//   executor's threads (the physical limit of any pack), zero-fill + scatter for restore;
// - a std::nth_element-based MinK (keys copied, nth_element, one pass writing values and int32
//   indices);
// - DropIT's reference method through LibTorch, when found: abs().topk(k, sorted=false), gather,
//   int32 indices; restore with zeros().scatter_.
// - `paired/` cases: a pack and a memcpy alternately in every iteration, the ratio from the same
//   seconds (bench_paired).
// Counters: bytes_per_second = input bytes (n * sizeof(T)) per second for every case, so two
// cases' throughput ratio is the inverse of their time ratio; payload_B_per_elem = bytes kept
// per input element. bench/compare runs this and prints the ratio table; see bench/README.md.
//
//   host_bench [--benchmark_filter=...] [--benchmark_min_time=0.2] [--max_log2_n=28]
//              [--min_log2_n=16] [--threads=0] [--no_threads_sweep]
#include <dropit/dropit.hpp>

#include <benchmark/benchmark.h>

#if DROPIT_BENCH_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

unsigned g_threads = 0;  ///< --threads: 0 = every hardware thread

/// Normal(0, 1) from a counter-based hash and Box-Muller (the CUDA benchmark's generator).
float normal_at(std::size_t i) {
  const std::uint64_t h1 = dropit::detail::mix64(i * 0x9e3779b97f4a7c15ull + 12345);
  const std::uint64_t h2 = dropit::detail::mix64(h1);
  const float u1 = (static_cast<float>(h1 >> 40) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(h2 >> 40) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

/// The input of every case of one (type, n): generated once, dropped when n changes.
template <class T>
const std::vector<T>& input(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<std::vector<T>>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return *it->second;
  cache.clear();
  auto x = std::make_unique<std::vector<T>>(n);
  T* p = x->data();
  dropit::detail::parallel_for(dropit::detail::hardware_threads(), n,
                               [&](std::size_t b, std::size_t e, unsigned) {
                                 for (std::size_t i = b; i < e; ++i)
                                   p[i] = T(normal_at(i));
                               });
  return *cache.emplace(n, std::move(x)).first->second;
}

/// Keeps freed blocks and hands them out again for the same size, as a framework's caching
/// allocator does, so that a pack's payload is not fresh (page-faulting) memory every time.
class caching_resource : public std::pmr::memory_resource {
 public:
  ~caching_resource() override {
    for (auto& [key, p] : free_)
      ::operator delete(p, std::align_val_t(key.second));
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    std::lock_guard lock(mutex_);
    auto it = free_.find({bytes, align});
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    return ::operator new(bytes, std::align_val_t(align));
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    std::lock_guard lock(mutex_);
    free_.emplace(std::pair{bytes, align}, p);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }
  std::mutex mutex_;
  std::multimap<std::pair<std::size_t, std::size_t>, void*> free_;
};

caching_resource& pool() {
  static caching_resource r;
  return r;
}

dropit::host_executor executor(bool caching = true) {
  return dropit::host_executor{.threads = g_threads,
                               .resource = caching ? &pool() : std::pmr::new_delete_resource()};
}

/// 64-byte aligned storage, as a framework's tensors have (LibTorch's CPU allocator aligns to 64).
template <class T>
struct aligned64 {
  using value_type = T;
  aligned64() = default;
  template <class U>
  explicit aligned64(const aligned64<U>&) noexcept {}
  T* allocate(std::size_t count) {
    return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(64)); }
  friend bool operator==(const aligned64&, const aligned64&) noexcept { return true; }
};

/// A dense, 64-byte aligned output buffer whose pages are already mapped.
template <class T>
std::vector<T, aligned64<T>> output(std::size_t n) {
  return std::vector<T, aligned64<T>>(n, T(0.0f));
}

void finish(benchmark::State& state, std::size_t n, std::size_t elem, double payload_bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(n * elem));
  state.counters["payload_B_per_elem"] = payload_bytes / static_cast<double>(n);
}

// ---- ours -----------------------------------------------------------------------------------

template <class T>
void bench_memcpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  auto out = output<T>(n);
  for (auto _ : state) {
    std::memcpy(out.data(), x.data(), n * sizeof(T));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(n * sizeof(T)));
}

/// A streaming read of x on the executor's thread count: every cache line once, summed as
/// integers so the loop vectorizes. No pack can read x faster: the physical limit of any pack.
template <class T>
void bench_read(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  const std::size_t words = n * sizeof(T) / sizeof(std::uint32_t);
  const auto* w = reinterpret_cast<const std::uint32_t*>(x.data());
  const unsigned threads = g_threads != 0 ? g_threads : dropit::detail::hardware_threads();
  auto sum = [w](std::size_t b, std::size_t e) {
    std::uint32_t acc = 0;
    for (std::size_t i = b; i < e; ++i)
      acc += w[i];
    return acc;
  };
  std::vector<std::uint32_t> partial(threads);
  for (auto _ : state) {
    if (threads == 1 || n < dropit::host_executor::parallel_threshold) {
      partial[0] = sum(0, words);
    } else {
      std::vector<std::jthread> pool;
      for (unsigned t = 1; t < threads; ++t)
        pool.emplace_back(
            [&, t] { partial[t] = sum(words * t / threads, words * (t + 1) / threads); });
      partial[0] = sum(0, words / threads);
    }
    benchmark::DoNotOptimize(partial.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(n * sizeof(T)));
}

template <class T, class P, class Codec = dropit::codec::exact>
void bench_pack(benchmark::State& state, P policy, bool caching, Codec codec = {}) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::span<const T> x(input<T>(n));
  const auto exec = executor(caching);
  dropit::SparseCache<T, P, Codec> cache{policy, codec};
  // Warm-up: the workers, and both payloads a pack has alive (the new one is built before the
  // old one is freed), so that the caching resource serves every timed pack.
  cache.pack(exec, x);
  cache.pack(exec, x);
  for (auto _ : state) {
    cache.pack(exec, x);
    benchmark::DoNotOptimize(cache.payload().data());
  }
  finish(state, n, sizeof(T), static_cast<double>(cache.bytes()));
}

/**
 * A step and a `memcpy` of x, alternately in every iteration (memcpy first in even iterations,
 * second in odd ones), each timed: the ratio to `memcpy` comes from the same seconds of the run,
 * so the slow swings of a shared machine's memory bandwidth move both alike. Counters:
 * `per_memcpy` = the memcpys' total time / the step's (a throughput ratio, above 1: the step is
 * faster), `per_memcpy_min` / `per_memcpy_median` = the least and the median of the iterations'
 * own ratios. The reported time is the step's alone (manual time).
 */
template <class T, class Step>
void bench_paired(benchmark::State& state, Step&& step) {
  using clock = std::chrono::steady_clock;
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  auto out = output<T>(n);
  auto copy = [&] {
    std::memcpy(out.data(), x.data(), n * sizeof(T));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  };
  auto seconds = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  step();  // warm-up (workers, the caching resource's payload blocks)
  copy();
  double step_total = 0.0, copy_total = 0.0;
  std::vector<double> ratios;
  bool copy_first = true;
  for (auto _ : state) {
    const auto t0 = clock::now();
    if (copy_first) copy();
    const auto t1 = clock::now();
    step();
    const auto t2 = clock::now();
    if (!copy_first) copy();
    const auto t3 = clock::now();
    const double s = seconds(t1, t2);
    const double c = copy_first ? seconds(t0, t1) : seconds(t2, t3);
    step_total += s;
    copy_total += c;
    ratios.push_back(c / s);
    copy_first = !copy_first;
    state.SetIterationTime(s);
  }
  std::sort(ratios.begin(), ratios.end());
  state.counters["per_memcpy"] = step_total > 0.0 ? copy_total / step_total : 0.0;
  state.counters["per_memcpy_min"] = ratios.empty() ? 0.0 : ratios.front();
  state.counters["per_memcpy_median"] = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(n * sizeof(T)));
}

/// `bench_pack` through `bench_paired`: the pack and a memcpy alternately.
template <class T, class P, class Codec = dropit::codec::exact>
void bench_paired_pack(benchmark::State& state, P policy, Codec codec = {}) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::span<const T> x(input<T>(n));
  const auto exec = executor(true);
  dropit::SparseCache<T, P, Codec> cache{policy, codec};
  cache.pack(exec, x);  // both payloads a pack has alive, as in bench_pack
  bench_paired<T>(state, [&] {
    cache.pack(exec, x);
    benchmark::DoNotOptimize(cache.payload().data());
  });
  state.counters["payload_B_per_elem"] =
      static_cast<double>(cache.bytes()) / static_cast<double>(n);
}

/// The pack with the count pass's staging off: the compact step reads x a second time (what every
/// pack did before the one-pass driver), measured next to `pack/` in the same run.
template <class T, class P>
void bench_pack_two_pass(benchmark::State& state, P policy) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  const auto exec = executor();
  const auto layout = dropit::make_layout(n, policy.kept(n), sizeof(T));
  const dropit::detail::host_select_tuning two_pass{.staging = dropit::detail::staging_mode::never};
  auto pack = [&] {
    return dropit::detail::host_pack(policy, x.data(), layout, exec.thread_count(n),
                                     exec.memory_resource(), two_pass);
  };
  {
    auto warm = pack();
    auto warm2 = pack();
  }
  for (auto _ : state) {
    auto p = pack();
    benchmark::DoNotOptimize(p.data());
  }
  finish(state, n, sizeof(T), static_cast<double>(layout.total_bytes));
}

template <class T, class P, class Codec = dropit::codec::exact>
void bench_restore(benchmark::State& state, P policy, Codec codec = {}) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto exec = executor();
  dropit::SparseCache<T, P, Codec> cache{policy, codec};
  cache.pack(exec, std::span<const T>(input<T>(n)));
  auto out = output<T>(n);
  cache.restore(exec, std::span<T>(out));
  for (auto _ : state) {
    cache.restore(exec, std::span<T>(out));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(cache.bytes()));
}

/// The restore with ordinary stores only (no non-temporal stores for a large aligned output),
/// measured next to `restore/` in the same run.
template <class T, class P>
void bench_restore_no_stream(benchmark::State& state, P policy) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto exec = executor();
  const auto layout = dropit::make_layout(n, policy.kept(n), sizeof(T));
  const auto p = dropit::detail::host_pack(policy, input<T>(n).data(), layout, exec.thread_count(n),
                                           exec.memory_resource());
  auto out = output<T>(n);
  for (auto _ : state) {
    dropit::detail::host_restore(p, layout, out.data(), 1.0, exec.thread_count(n), 0);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(layout.total_bytes));
}

/// Pack and restore with the bitmask where the smallest layout is Elias-Fano's (gamma 0.9): what
/// the position code costs, measured next to `pack/` and `restore/` in the same run.
template <class T, class P>
void bench_bitmask(benchmark::State& state, P policy, bool restore) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  const auto exec = executor();
  const auto layout = dropit::make_layout(n, policy.kept(n), sizeof(T), dropit::value_codec::exact,
                                          dropit::position_choice::no_elias_fano);
  auto pack = [&] {
    return dropit::detail::host_pack(policy, x.data(), layout, exec.thread_count(n),
                                     exec.memory_resource());
  };
  auto out = output<T>(restore ? n : 0);
  {
    auto warm = pack();
    auto warm2 = pack();
    if (restore) dropit::detail::host_restore(warm, layout, out.data(), 1.0, exec.thread_count(n));
  }
  const auto p = pack();
  for (auto _ : state) {
    if (restore) {
      dropit::detail::host_restore(p, layout, out.data(), 1.0, exec.thread_count(n));
      benchmark::DoNotOptimize(out.data());
      benchmark::ClobberMemory();
    } else {
      auto q = pack();
      benchmark::DoNotOptimize(q.data());
    }
  }
  finish(state, n, sizeof(T), static_cast<double>(layout.total_bytes));
}

/// The Elias-Fano coding pass of a MinK 0.9 pack alone (3 low bits), from the bitmask a pack with
/// bitmask positions wrote, with the kernels of instruction set `isa` (avx2: the BMI2 encoder;
/// avx512: the AVX-512 VBMI2 one where the CPU has it, which the counter `vbmi2` says).
template <class T>
void bench_ef_encode(benchmark::State& state, dropit::detail::host_isa isa) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto exec = executor();
  const dropit::MinK<0.9> policy;
  const auto mask = dropit::make_layout(n, policy.kept(n), sizeof(T), dropit::value_codec::exact,
                                        dropit::position_choice::no_elias_fano);
  const auto ef = dropit::make_layout(n, policy.kept(n), sizeof(T));
  if (ef.positions != dropit::position_encoding::elias_fano || ef.wide() ||
      static_cast<int>(dropit::detail::detect_host_isa()) < static_cast<int>(isa)) {
    state.SkipWithError("no Elias-Fano layout at this size, or the CPU lacks the instruction set");
    return;
  }
  const unsigned threads = exec.thread_count(n);
  const auto p =
      dropit::detail::host_pack(policy, input<T>(n).data(), mask, threads, exec.memory_resource());
  const auto* words = reinterpret_cast<const std::uint32_t*>(p.data() + mask.positions_offset);
  const auto* offsets =
      reinterpret_cast<const std::uint32_t*>(p.data() + mask.block_offsets_offset);
  std::vector<std::byte> out(ef.total_bytes);
  auto& cap = dropit::detail::host_isa_cap();
  const int saved = cap.load();
  cap.store(static_cast<int>(isa));
  for (auto _ : state) {
    dropit::detail::host_encode_positions(words, offsets, ef, out.data(), threads);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  cap.store(saved);
  state.counters["vbmi2"] =
      isa == dropit::detail::host_isa::avx512 && dropit::detail::host_has_vbmi2() ? 1 : 0;
  finish(state, n, sizeof(T), static_cast<double>(ef.total_bytes));
}

/// Pack / restore on exactly t threads, below and above the executor's parallel threshold.
/// `idle_us` > 0: the threads idle that long before each (timed) call, as between the layers of
/// a training step, so that pool workers have gone to sleep.
template <class T>
void bench_threads_pack(benchmark::State& state, int idle_us) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto t = static_cast<unsigned>(state.range(1));
  const auto& x = input<T>(n);
  const dropit::MinK<0.9> policy;
  const auto layout = dropit::make_layout(n, policy.kept(n), sizeof(T));
  (void)dropit::detail::host_pack(policy, x.data(), layout, t, &pool());
  for (auto _ : state) {
    if (idle_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    const auto t0 = std::chrono::steady_clock::now();
    auto p = dropit::detail::host_pack(policy, x.data(), layout, t, &pool());
    benchmark::DoNotOptimize(p.data());
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  finish(state, n, sizeof(T), static_cast<double>(layout.total_bytes));
}

template <class T>
void bench_threads_restore(benchmark::State& state, int idle_us) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto t = static_cast<unsigned>(state.range(1));
  const auto& x = input<T>(n);
  const dropit::MinK<0.9> policy;
  const auto layout = dropit::make_layout(n, policy.kept(n), sizeof(T));
  const auto p = dropit::detail::host_pack(policy, x.data(), layout, 1, &pool());
  auto out = output<T>(n);
  for (auto _ : state) {
    if (idle_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    const auto t0 = std::chrono::steady_clock::now();
    dropit::detail::host_restore(p, layout, out.data(), 1.0, t);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  finish(state, n, sizeof(T), static_cast<double>(layout.total_bytes));
}

// ---- baselines ------------------------------------------------------------------------------

/// The values and int32 indices a top-k method keeps (the reference format), in index order.
template <class T>
struct topk_result {
  std::vector<T> values;
  std::vector<std::int32_t> index;
};

/// MinK by std::nth_element over a copy of the magnitude keys, then one pass that writes the kept
/// values and their int32 indices (the k largest, ties lowest index first: the same set as ours).
template <class T>
void nth_element_pack(const std::vector<T>& x, std::size_t k, std::vector<std::uint32_t>& keys,
                      topk_result<T>& r) {
  using key = decltype(dropit::detail::magnitude_key(T{}));
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = dropit::detail::magnitude_key(x[i]);
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(),
                   std::greater<>());
  const auto t = static_cast<key>(keys[k - 1]);
  std::size_t ties = k - static_cast<std::size_t>(std::count_if(
                             keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1),
                             [&](std::uint32_t v) { return v > t; }));
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const key kv = dropit::detail::magnitude_key(x[i]);
    if (kv > t || (kv == t && ties > 0)) {
      ties -= kv == t ? 1 : 0;
      r.values[j] = x[i];
      r.index[j] = static_cast<std::int32_t>(i);
      ++j;
    }
  }
}

template <class T>
void bench_nth_element(benchmark::State& state, double gamma) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  const std::size_t k = dropit::MinK<>{gamma}.kept(n);
  std::vector<std::uint32_t> keys(n);
  topk_result<T> r{std::vector<T>(k), std::vector<std::int32_t>(k)};
  for (auto _ : state) {
    nth_element_pack(x, k, keys, r);
    benchmark::DoNotOptimize(r.values.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(k * (sizeof(T) + 4)));
}

/// Restore baseline: zero-fill the output, then scatter the kept values by their int32 indices.
template <class T>
void bench_scatter(benchmark::State& state, double gamma) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto& x = input<T>(n);
  const std::size_t k = dropit::MinK<>{gamma}.kept(n);
  std::vector<std::uint32_t> keys(n);
  topk_result<T> r{std::vector<T>(k), std::vector<std::int32_t>(k)};
  nth_element_pack(x, k, keys, r);
  keys = {};
  auto out = output<T>(n);
  for (auto _ : state) {
    std::memset(static_cast<void*>(out.data()), 0, n * sizeof(T));
    for (std::size_t j = 0; j < k; ++j)
      out[static_cast<std::size_t>(r.index[j])] = r.values[j];
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state, n, sizeof(T), static_cast<double>(k * (sizeof(T) + 4)));
}

#if DROPIT_BENCH_TORCH
template <class T>
at::ScalarType torch_dtype() {
  return std::is_same_v<T, float> ? at::kFloat : at::kHalf;
}

/// |x| in a type LibTorch's CPU topk supports.
at::Tensor magnitude(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.to(at::kFloat).abs() : x.abs();
}

/// The first line of an exception's message (LibTorch appends a stack trace).
std::string first_line(const std::exception& e) {
  const std::string s = e.what();
  return s.substr(0, s.find('\n'));
}

/// DropIT's reference pack: abs().topk(k, sorted=false), gather the signed values, int32 indices.
template <class T>
void bench_torch_topk(benchmark::State& state, double gamma) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& x = const_cast<std::vector<T>&>(input<T>(n));
  const auto k = static_cast<std::int64_t>(dropit::MinK<>{gamma}.kept(n));
  const auto xt = at::from_blob(x.data(), {static_cast<std::int64_t>(n)}, torch_dtype<T>());
  try {
    for (auto _ : state) {
      // LibTorch 1.13 has no CPU topk for Half: it goes through float there.
      auto [v, i] = magnitude(xt).topk(k, 0, /*largest=*/true, /*sorted=*/false);
      auto values = xt.gather(0, i);
      auto index = i.to(at::kInt);
      benchmark::DoNotOptimize(values.data_ptr());
      benchmark::DoNotOptimize(index.data_ptr());
    }
  } catch (const std::exception& e) {
    state.SkipWithError(first_line(e).c_str());
    return;
  }
  finish(state, n, sizeof(T), static_cast<double>(k) * (sizeof(T) + 4));
}

/// DropIT's reference restore: zeros().scatter_(0, int64(index), values).
template <class T>
void bench_torch_scatter(benchmark::State& state, double gamma) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& x = const_cast<std::vector<T>&>(input<T>(n));
  const auto k = static_cast<std::int64_t>(dropit::MinK<>{gamma}.kept(n));
  const auto xt = at::from_blob(x.data(), {static_cast<std::int64_t>(n)}, torch_dtype<T>());
  try {
    auto [v, i] = magnitude(xt).topk(k, 0, true, false);
    const auto values = xt.gather(0, i);
    const auto index = i.to(at::kInt);
    for (auto _ : state) {
      auto out = at::zeros({static_cast<std::int64_t>(n)}, xt.options())
                     .scatter_(0, index.to(at::kLong), values);
      benchmark::DoNotOptimize(out.data_ptr());
    }
  } catch (const std::exception& e) {
    state.SkipWithError(first_line(e).c_str());
    return;
  }
  finish(state, n, sizeof(T), static_cast<double>(k) * (sizeof(T) + 4));
}
#endif

// ---- registration ---------------------------------------------------------------------------

std::string gamma_name(double g) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%g", g);
  return buf;
}

template <class T>
void register_size(const std::string& type, std::int64_t n) {
  auto add = [&](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Arg(n)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  };
  add("memcpy/" + type, [](benchmark::State& st) { bench_memcpy<T>(st); });
  add("read/" + type, [](benchmark::State& st) { bench_read<T>(st); });
  for (double g : {0.5, 0.9, 0.99}) {
    const std::string gs = gamma_name(g) + "/" + type;
    add("pack/MinK/" + gs,
        [g](benchmark::State& st) { bench_pack<T>(st, dropit::MinK<>{g}, true); });
    add("pack/Random/" + gs, [g](benchmark::State& st) {
      bench_pack<T>(st, dropit::Random<>{g, 7}, true);
    });
    add("restore/MinK/" + gs,
        [g](benchmark::State& st) { bench_restore<T>(st, dropit::MinK<>{g}); });
    add("restore/Random/" + gs, [g](benchmark::State& st) {
      bench_restore<T>(st, dropit::Random<>{g, 7});
    });
    add("nth_element/" + gs, [g](benchmark::State& st) { bench_nth_element<T>(st, g); });
    add("scatter/" + gs, [g](benchmark::State& st) { bench_scatter<T>(st, g); });
#if DROPIT_BENCH_TORCH
    add("torch_topk/" + gs, [g](benchmark::State& st) { bench_torch_topk<T>(st, g); });
    add("torch_scatter/" + gs, [g](benchmark::State& st) { bench_torch_scatter<T>(st, g); });
#endif
  }
  add("pack/Identity/" + type,
      [](benchmark::State& st) { bench_pack<T>(st, dropit::Identity{}, true); });
  // Value codecs: 8-bit kept values with a scale per 1024 (pack_int8/Identity: dense int8).
  add("pack_int8/MinK/0.9/" + type, [](benchmark::State& st) {
    bench_pack<T>(st, dropit::MinK<0.9>{}, true, dropit::codec::int8{});
  });
  add("pack_int8/Identity/" + type, [](benchmark::State& st) {
    bench_pack<T>(st, dropit::Identity{}, true, dropit::codec::int8{});
  });
  add("pack_fp8/MinK/0.9/" + type, [](benchmark::State& st) {
    bench_pack<T>(st, dropit::MinK<0.9>{}, true, dropit::codec::fp8_e4m3{});
  });
  add("restore_int8/MinK/0.9/" + type, [](benchmark::State& st) {
    bench_restore<T>(st, dropit::MinK<0.9>{}, dropit::codec::int8{});
  });
  add("restore_int8/Identity/" + type, [](benchmark::State& st) {
    bench_restore<T>(st, dropit::Identity{}, dropit::codec::int8{});
  });
  add("restore/Identity/" + type,
      [](benchmark::State& st) { bench_restore<T>(st, dropit::Identity{}); });
  // The same packs and a memcpy alternately in one case: ratios from the same seconds.
  auto paired = [&](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Arg(n)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  };
  paired("paired/pack/MinK/0.9/" + type,
         [](benchmark::State& st) { bench_paired_pack<T>(st, dropit::MinK<0.9>{}); });
  paired("paired/pack_int8/MinK/0.9/" + type, [](benchmark::State& st) {
    bench_paired_pack<T>(st, dropit::MinK<0.9>{}, dropit::codec::int8{});
  });
  // The payload from fresh memory (new/delete) instead of the caching resource.
  add("pack_fresh/MinK/0.9/" + type,
      [](benchmark::State& st) { bench_pack<T>(st, dropit::MinK<0.9>{}, false); });
  add("pack_two_pass/MinK/0.9/" + type,
      [](benchmark::State& st) { bench_pack_two_pass<T>(st, dropit::MinK<0.9>{}); });
  add("pack_bitmask/MinK/0.9/" + type,
      [](benchmark::State& st) { bench_bitmask<T>(st, dropit::MinK<0.9>{}, false); });
  add("restore_bitmask/MinK/0.9/" + type,
      [](benchmark::State& st) { bench_bitmask<T>(st, dropit::MinK<0.9>{}, true); });
  add("restore_no_stream/MinK/0.9/" + type,
      [](benchmark::State& st) { bench_restore_no_stream<T>(st, dropit::MinK<0.9>{}); });
  add("ef_encode/bmi2/" + type,
      [](benchmark::State& st) { bench_ef_encode<T>(st, dropit::detail::host_isa::avx2); });
  add("ef_encode/avx512/" + type,
      [](benchmark::State& st) { bench_ef_encode<T>(st, dropit::detail::host_isa::avx512); });
}

/// Training-sized packs (saved layer inputs of 1e5 to 2e6 elements) through the executor.
void register_training() {
  for (std::int64_t n : {100000, 400000, 1600000}) {
    auto add = [&](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark(name.c_str(), fn)
          ->Arg(n)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    };
    add("train/memcpy/float", [](benchmark::State& st) { bench_memcpy<float>(st); });
    add("train/pack/MinK/0.9/float",
        [](benchmark::State& st) { bench_pack<float>(st, dropit::MinK<0.9>{}, true); });
    add("train/pack/Random/0.9/float",
        [](benchmark::State& st) { bench_pack<float>(st, dropit::Random<0.9>{7}, true); });
    add("train/restore/MinK/0.9/float",
        [](benchmark::State& st) { bench_restore<float>(st, dropit::MinK<0.9>{}); });
    add("train/restore_bitmask/MinK/0.9/float",
        [](benchmark::State& st) { bench_bitmask<float>(st, dropit::MinK<0.9>{}, true); });
  }
}

/// 1 vs all threads (bypassing the executor's threshold) from 2^10 to 2^20: the break-even, with
/// the workers busy (calls back to back: `threads/`) and idle for 1 ms before each call
/// (`threads_idle/`).
void register_threads_sweep() {
  const unsigned hw = dropit::detail::hardware_threads();
  const unsigned many = g_threads != 0 ? g_threads : hw;
  if (many < 2) return;
  for (int idle : {0, 1000}) {
    const std::string prefix = idle == 0 ? "threads/" : "threads_idle/";
    for (int lg = 10; lg <= 20; ++lg) {
      for (unsigned t : {1u, many}) {
        auto* p = benchmark::RegisterBenchmark(
            (prefix + "pack/MinK/0.9/float").c_str(),
            [idle](benchmark::State& st) { bench_threads_pack<float>(st, idle); });
        auto* r = benchmark::RegisterBenchmark(
            (prefix + "restore/MinK/0.9/float").c_str(),
            [idle](benchmark::State& st) { bench_threads_restore<float>(st, idle); });
        for (auto* b : {p, r}) {
          b->Args({std::int64_t{1} << lg, t})->UseManualTime()->Unit(benchmark::kMicrosecond);
          if (idle > 0) b->Iterations(300);  // 0.3 s of idling per case
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int max_log2 = 28, min_log2 = 16;
  bool sweep = true;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_log2_n=", 13) == 0) {
      max_log2 = std::atoi(argv[i] + 13);
    } else if (std::strncmp(argv[i], "--min_log2_n=", 13) == 0) {
      min_log2 = std::atoi(argv[i] + 13);
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads = static_cast<unsigned>(std::atoi(argv[i] + 10));
    } else if (std::strcmp(argv[i], "--no_threads_sweep") == 0) {
      sweep = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  register_training();
  if (sweep) register_threads_sweep();
  for (int lg = 16; lg <= 28; lg += 4) {
    if (lg < min_log2 || lg > max_log2) continue;
    register_size<float>("float", std::int64_t{1} << lg);
#if DROPIT_HAS_HALF
    register_size<__half>("half", std::int64_t{1} << lg);
#endif
  }
  benchmark::AddCustomContext(
      "host_threads",
      std::to_string(g_threads != 0 ? g_threads : dropit::detail::hardware_threads()));
  benchmark::AddCustomContext("parallel_threshold",
                              std::to_string(dropit::host_executor::parallel_threshold));
#if defined(_OPENMP)
  benchmark::AddCustomContext("host_parallel", "OpenMP");
#else
  benchmark::AddCustomContext("host_parallel", "std::thread pool");
#endif
#if DROPIT_BENCH_TORCH
  at::set_num_threads(
      static_cast<int>(g_threads != 0 ? g_threads : dropit::detail::hardware_threads()));
  benchmark::AddCustomContext("torch", "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                                           std::to_string(TORCH_VERSION_MINOR) + ", " +
                                           std::to_string(at::get_num_threads()) + " threads");
#else
  benchmark::AddCustomContext("torch", "not found: torch_topk / torch_scatter not built");
#endif
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
