// The device suite: the cases every executor shares (executor_cases.inl), run on the CUDA executor
// (on the emulated device with g++ and Thrust's OpenMP system; on a GPU with nvcc, there with the
// fast and the portable kernels), plus what is the device's own: byte identity with the host
// executor, every way the selection resolves, memory resources and workspaces, streams, errors.
#include "cuda_support.hpp"

// The cases every executor shares, on the device.
#define DROPIT_EXECUTOR_CASES DROPIT_DEVICE_CASES
#define DROPIT_EXECUTOR_DECORATOR *DROPIT_DEVICE
#include "executor_cases.inl"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

using namespace dropit_test;

namespace {

// Sanitizer builds run the selection cases smaller, still above the sample size (8192), so that
// every path of the selection runs there too.
#if defined(DROPIT_TEST_SANITIZED)
constexpr std::size_t selection_n = (std::size_t{1} << 14) + 123;
const double selection_gammas[] = {0.5, 0.99};
#else
constexpr std::size_t selection_n = (std::size_t{1} << 17) + 123;
const double selection_gammas[] = {0.1, 0.5, 0.9, 0.99};
#endif
using dropit_test::executor_cases::gammas;
using dropit_test::executor_cases::large;
using dropit_test::executor_cases::pack_restore;
using dropit_test::executor_cases::sizes;

/// The payload of a host pack.
template <class T, class P>
std::vector<std::byte> host_payload(const P& p, const std::vector<T>& x) {
  dropit::SparseCache<T, P> cache{p};
  cache.pack(dropit::host, x);
  return {cache.payload().begin(), cache.payload().end()};
}

/// The payload of a device pack (copied to the host).
template <class T, class P>
std::vector<std::byte> device_payload(const P& p, const std::vector<T>& x,
                                      const dropit::cuda_executor& exec) {
  device_buffer<T> dx(x);
  dropit::SparseCache<T, P> cache{p};
  cache.pack(exec, dx.cspan());
  return bytes_to_host(cache.payload(), exec.stream.get());
}

}  // namespace

// ---- the executor's configuration ------------------------------------------------------------

namespace names_check {
// dropit declares no `cuda` of its own: with `using namespace dropit`, `cuda::stream_ref` is still
// libcu++'s type (an alias or namespace named cuda in dropit would make this ambiguous), and it is
// the type of the executor's stream.
using namespace dropit;
static_assert(std::is_same_v<decltype(cuda_executor::stream), cuda::stream_ref>);
}  // namespace names_check

TEST_CASE("device: the executor takes its stream as cuda::stream_ref, default stream 0" *
          DROPIT_DEVICE) {
  test_stream stream;
  const dropit::cuda_executor defaulted{};
  CHECK(defaulted.stream.get() == cudaStream_t{});
  const dropit::cuda_executor raw{stream.get()};
  const dropit::cuda_executor wrapped{.stream = cuda::stream_ref{stream.get()}};
  CHECK(raw.stream == wrapped.stream);
  CHECK(raw.stream.get() == stream.get());
}

// ---- byte identity with the host executor -----------------------------------------------------

TEST_CASE_TEMPLATE("device and host payloads are byte-identical (MinK, Random, Identity)" *
                       DROPIT_DEVICE,
                   C, DROPIT_DEVICE_CASES) {
  using T = typename C::type;
  INFO(C::name());
  test_stream stream;
  const auto exec = C::exec(stream.get());
  for (std::size_t n : sizes) {
    const auto x = normal_values<T>(n, 31 + n);
    CAPTURE(n);
    CHECK(device_payload<T>(dropit::Identity{}, x, exec) == host_payload<T>(dropit::Identity{}, x));
    for (double g : gammas) {
      CAPTURE(g);
      CHECK(device_payload<T>(dropit::MinK<>{g}, x, exec) == host_payload<T>(dropit::MinK<>{g}, x));
      const dropit::Random<> r{g, 99 + n};
      CHECK(device_payload<T>(r, x, exec) == host_payload<T>(r, x));
    }
  }
}

namespace {

/// What the selection did: the final control block, copied back, and the pack's launches.
template <class Key>
struct outcome {
  std::vector<std::byte> payload;
  int path;
  unsigned worked;    ///< select_step bits: the launches that did work
  unsigned x_passes;  ///< launches that read all of x
  unsigned launches;
};

/// A device pack with the selection's knobs turned; returns its payload and how it resolved.
template <class T, class P>
auto tuned_pack(const P& p, const std::vector<T>& x, const dropit::cuda_executor& exec,
                const dropit::detail::dev::select_tuning& tuning) {
  using Key = dropit::detail::key_type_t<P, T>;
  using ctl_t = dropit::detail::dev::select_ctl<Key>;
  device_buffer<T> dx(x);
  device_buffer<std::byte> ctl(sizeof(ctl_t));
  auto t = tuning;
  unsigned launches = 0;
  t.ctl_copy = ctl.data();
  t.launches = &launches;
  const auto layout = dropit::make_layout(x.size(), p.kept(x.size()), sizeof(T));
  const auto payload = dropit::detail::dev::pack(exec, p, dx.data(), layout, t);
  const auto bytes = bytes_to_host({payload.data(), payload.bytes()}, exec.stream.get());
  const auto raw = ctl.to_host(exec.stream.get());
  alignas(ctl_t) std::byte copy[sizeof(ctl_t)];
  std::memcpy(copy, raw.data(), sizeof(ctl_t));
  const auto* c = reinterpret_cast<const ctl_t*>(copy);
  CHECK(c->mode == dropit::detail::mode_final);
  return outcome<Key>{bytes, c->path, c->worked, c->x_passes, launches};
}

}  // namespace

TEST_CASE_TEMPLATE("every way the device selection resolves gives the host's bytes" * DROPIT_DEVICE,
                   C, DROPIT_DEVICE_CASES) {
  using T = typename C::type;
  using namespace dropit::detail;
  using namespace dropit::detail::dev;
  INFO(C::name());
  test_stream stream;
  const auto exec = C::exec(stream.get());
  const std::size_t n = selection_n;
  std::map<std::string, std::vector<T>> inputs;
  inputs["normal"] = normal_values<T>(n, 8);
  inputs["ascending"] = inputs["normal"];
  std::sort(inputs["ascending"].begin(), inputs["ascending"].end(),
            [](T a, T b) { return std::fabs(to_double(a)) < std::fabs(to_double(b)); });
  inputs["descending"] = {inputs["ascending"].rbegin(), inputs["ascending"].rend()};
  inputs["relu (60% zeros)"] = inputs["normal"];
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 5 < 3) inputs["relu (60% zeros)"][i] = from_double<T>(0.0);
  }
  inputs["two values"] = std::vector<T>(n, from_double<T>(1.0));
  for (std::size_t i = 0; i < n; i += 3)
    inputs["two values"][i] = from_double<T>(2.0);
  inputs["all equal"] = std::vector<T>(n, from_double<T>(-0.5));

  struct knob {
    const char* name;
    dropit::detail::dev::select_tuning tuning;
  };
  const knob knobs[] = {
      {"default", {}},
      {"forced fallback", {.force_fallback = true}},
      {"one candidate slot", {.capacity = 1}},
      {"tiny sample", {.sample = 16}},
      {"no margin", {.margin = 0.0}},
      {"the largest sample", {.sample = n}},
      {"nothing staged", {.staging = dropit::detail::staging_mode::never}},
      {"a stage for a few blocks", {.stage_capacity = n / 50}},
  };
  std::map<int, int> paths;
  for (const auto& [name, x] : inputs) {
    for (double g : selection_gammas) {
      const dropit::MinK<> mink{g};
      const dropit::Random<> random{g, 5};
      const auto want_m = host_payload<T>(mink, x);
      const auto want_r = host_payload<T>(random, x);
      for (const knob& kn : knobs) {
        CAPTURE(name);
        CAPTURE(g);
        CAPTURE(kn.name);
        const auto m = tuned_pack<T>(mink, x, exec, kn.tuning);
        CHECK(m.payload == want_m);
        const auto r = tuned_pack<T>(random, x, exec, kn.tuning);
        CHECK(r.payload == want_r);
        ++paths[m.path];
        ++paths[r.path];
        if (kn.tuning.force_fallback) CHECK(m.path == path_fallback);
      }
    }
  }
  // The inputs and knobs above reach every way to resolve.
  CHECK(paths[path_candidates] > 0);
  CHECK(paths[path_single_key] > 0);
  CHECK(paths[path_fallback] > 0);
}

TEST_CASE_TEMPLATE(
    "a bucket of one key too full for the resolve buffer is the threshold, with no "
    "radix pass" *
        DROPIT_DEVICE,
    C, DROPIT_DEVICE_CASES) {
  // 16-bit keys at large n: the k-th key's bucket holds more equal keys than the resolve buffer.
  // Here: 30,000 copies of 1.0 with 19,000 keys a few ulps above it, the rest a few below, so
  // the guessed range spans a few hundred keys (one key per bucket) and the 20,000th largest is
  // 1.0; every candidate fits (capacity n).
  using T = typename C::type;
  using namespace dropit::detail;
  INFO(C::name());
  test_stream stream;
  const auto exec = C::exec(stream.get());
  const std::size_t n = 200000;
  double ulp = 1.0;  // of T at 1.0
  while (to_double(from_double<T>(1.0 + ulp / 2)) != 1.0)
    ulp /= 2;
  std::vector<T> x;
  x.reserve(n);
  for (std::size_t i = 0; i < 19000; ++i)
    x.push_back(from_double<T>(1.0 + static_cast<double>(1 + i % 400) * ulp));
  for (std::size_t i = 0; i < 30000; ++i)
    x.push_back(from_double<T>(i % 2 == 0 ? 1.0 : -1.0));
  while (x.size() < n)
    x.push_back(from_double<T>(1.0 - static_cast<double>(1 + x.size() % 400) * ulp / 2));
  std::mt19937_64 rng(7);
  std::shuffle(x.begin(), x.end(), rng);
  const dropit::MinK<0.9> mink;
  REQUIRE(mink.kept(n) == 20000);
  const auto o = tuned_pack<T>(mink, x, exec, {.capacity = n});
  CHECK(o.payload == host_payload<T>(mink, x));
  CHECK(o.path == path_single_key);
  CHECK(o.worked == (step_sample | step_count | step_compact));
}

TEST_CASE_TEMPLATE(
    "a device pack is at most 8 launches: at most 4 selection steps work on a hit, "
    "then the Elias-Fano encode where the payload has one" *
        DROPIT_DEVICE,
    C, DROPIT_DEVICE_CASES) {
  using T = typename C::type;
  using namespace dropit::detail;
  using namespace dropit::detail::dev;
  INFO(C::name());
  test_stream stream;
  const auto exec = C::exec(stream.get());
  const std::size_t n = selection_n;
  // sample, count, one radix pass per 11-bit digit of the key (they return at once on a hit),
  // resolve, compact: whatever the data, the host enqueues the same launches; then one more that
  // codes the positions where the layout is Elias-Fano (gamma 0.9 and 0.99 here, not 0.5).
  auto expected = [&](const auto& policy) {
    using K = dropit::detail::key_type_t<std::decay_t<decltype(policy)>, T>;
    const bool ef = dropit::make_layout(n, policy.kept(n), sizeof(T)).positions ==
                    dropit::position_encoding::elias_fano;
    return 4 + static_cast<unsigned>(radix_passes<K>) + (ef ? 1u : 0u);
  };
  const auto x = normal_values<T>(n, 21);
  auto check = [&](const auto& policy, double g) {
    const auto o = tuned_pack<T>(policy, x, exec, {});
    CHECK(o.launches == expected(policy));
    // fp16 and bf16 keys have 2 digits, fp32 and Random's keys 3 (fp64's 64-bit keys 6: MinK on
    // fp64 takes 10 launches, 11 with Elias-Fano positions)
    if (expected(policy) <= 8) CHECK(o.launches <= 8);
    CHECK((g > 0.6) ==
          (expected(policy) ==
           5 + static_cast<unsigned>(radix_passes<key_type_t<std::decay_t<decltype(policy)>, T>>)));
    if (o.path == path_candidates) {
      CHECK(o.worked == (step_sample | step_count | step_resolve | step_compact));
    } else {
      CHECK(o.path == path_single_key);  // half types round Normal(0, 1) to few values
      CHECK(o.worked == (step_sample | step_count | step_compact));
    }
    CHECK(std::popcount(o.worked) <= 4);
    // x is read by the count pass only; at gamma 0.5 nothing is staged (half of x would be) and
    // the compact step reads x again.
    CHECK(o.x_passes == (g > 0.6 ? 1u : 2u));
  };
  for (double g : {0.5, 0.9, 0.99}) {
    CAPTURE(g);
    check(dropit::MinK<>{g}, g);
    check(dropit::Random<>{g, 4}, g);
  }
  // The miss path: the same launches; the radix passes work, the resolve returns at once.
  const auto miss = tuned_pack<T>(dropit::MinK<0.9>{}, x, exec, {.force_fallback = true});
  CHECK(miss.path == path_fallback);
  using Key = dropit::detail::key_type_t<dropit::MinK<0.9>, T>;
  CHECK(miss.launches == expected(dropit::MinK<0.9>{}));
  CHECK(miss.worked == (step_sample | step_count | step_radix | step_compact));
  CHECK(miss.x_passes == 2 + static_cast<unsigned>(radix_passes<Key>));
  // A stage too small for every block: those it holds are read from it, the others from x.
  const auto partial = tuned_pack<T>(dropit::Random<0.9>{1}, x, exec, {.stage_capacity = n / 20});
  CHECK(partial.payload == host_payload<T>(dropit::Random<0.9>{1}, x));
  CHECK(partial.x_passes == 2);
  // Staging asked for at gamma 0.5, and turned off at 0.9.
  CHECK(
      tuned_pack<T>(dropit::Random<0.5>{1}, x, exec, {.staging = staging_mode::always}).x_passes ==
      1);
  CHECK(tuned_pack<T>(dropit::Random<0.9>{1}, x, exec, {.staging = staging_mode::never}).x_passes ==
        2);
}

TEST_CASE("the device plan samples every key up to 8192, then n / 512 keys within [2048, 8192]") {
  // The sample step costs about its key count; the rule written out here, per n and key width.
  using dropit::detail::dev::plan_select;
  using dropit::detail::dev::select_tuning;
  const auto rule = [](std::size_t n, std::size_t most) {
    if (n <= most) return n;
    return std::min(most, std::max<std::size_t>(2048, n / 512));
  };
  for (const std::size_t n :
       {std::size_t{100}, std::size_t{8192}, std::size_t{8193}, std::size_t{1} << 20,
        std::size_t{3} << 19, std::size_t{1} << 22, std::size_t{1} << 28}) {
    CAPTURE(n);
    const std::size_t k = n / 10, blocks = (n + 1023) / 1024;
    const auto p32 = plan_select<std::uint32_t>(n, k, blocks, select_tuning{});
    CHECK(p32.samples == rule(n, 8192));
    CHECK(plan_select<std::uint64_t>(n, k, blocks, select_tuning{}).samples == rule(n, 4096));
    // The guessed ranks bracket the k-th key's expected rank in the sample.
    const double expected =
        static_cast<double>(k) / static_cast<double>(n) * static_cast<double>(p32.samples);
    CHECK(static_cast<double>(p32.hi_rank) <= expected);
    CHECK(static_cast<double>(p32.lo_rank) >= expected - 1);
    // An explicit sample size still wins, capped by the shared-memory buffer.
    CHECK(plan_select<std::uint32_t>(n, k, blocks, select_tuning{.sample = 16}).samples ==
          std::min<std::size_t>(n, 16));
    CHECK(plan_select<std::uint32_t>(n, k, blocks, select_tuning{.sample = n}).samples ==
          std::min<std::size_t>(n, 8192));
  }
  CHECK(plan_select<std::uint32_t>(std::size_t{1} << 20, 1, 1024, select_tuning{}).samples == 2048);
  CHECK(plan_select<std::uint32_t>(std::size_t{1} << 28, 1, 1u << 18, select_tuning{}).samples ==
        8192);
}

TEST_CASE("radix_picks (the fast kernels' parallel bucket choice) picks pick_bucket's bucket") {
  // Both against the walk written here: from the top bucket down, the first whose running sum
  // reaches the rank (bucket 0 when none does).
  std::mt19937_64 gen(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const unsigned bins = trial % 3 == 0 ? 32u : dropit::detail::dev::radix_bins;
    std::vector<std::size_t> hist(bins, 0);
    std::size_t total = 0;
    for (unsigned d = 0; d < bins; ++d) {
      hist[d] = gen() % 4 == 0 ? gen() % 50 : 0;
      total += hist[d];
    }
    if (total == 0) continue;
    const std::size_t rank = 1 + gen() % (total + (trial % 7 == 0 ? 10 : 0));
    std::size_t want = 0, sum = 0;
    for (unsigned d = bins; d-- > 0;) {
      if (sum + hist[d] >= rank || d == 0) {
        want = d;
        break;
      }
      sum += hist[d];
    }
    const auto serial = dropit::detail::pick_bucket(hist.data(), bins, rank);
    CHECK(serial.d == want);
    CHECK(serial.higher == sum);
    CHECK(serial.count == hist[want]);
    int picked = 0;
    std::size_t above = 0;
    for (unsigned d = bins; d-- > 0;) {
      if (dropit::detail::radix_picks(above + hist[d], above, rank, d)) {
        CHECK(d == want);
        CHECK(above == sum);
        ++picked;
      }
      above += hist[d];
    }
    CHECK(picked == 1);
  }
}

// ---- memory -----------------------------------------------------------------------------------

namespace {
/// Counts what it hands out (over the default device resource); can be told to fail.
class counting_resource : public dropit::device_memory_resource {
 public:
  std::size_t live = 0, peak = 0, calls = 0;
  bool fail = false;

 private:
  void* do_allocate(std::size_t bytes, cudaStream_t stream) override {
    if (fail) throw std::bad_alloc();
    ++calls;
    live += bytes;
    peak = std::max(peak, live);
    return dropit::default_device_resource()->allocate(bytes, stream);
  }
  void do_deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept override {
    live -= bytes;
    dropit::default_device_resource()->deallocate(p, bytes, stream);
  }
};
}  // namespace

TEST_CASE("device: the payload comes from the executor's resource and goes back to it" *
          DROPIT_DEVICE) {
  test_stream stream;
  counting_resource mr;
  const auto x = normal_values<float>(1 << 20, 4);
  device_buffer<float> dx(x);
  {
    dropit::SparseCache<float, dropit::MinK<0.9>> cache;
    cache.pack(dropit::cuda_executor{.stream = stream.get(), .resource = &mr}, dx.cspan());
    // The temporaries came from mr too (no workspace given) and went back at the end of the call.
    CHECK(mr.live == cache.bytes());
    CHECK(mr.peak > cache.bytes());
    cache.pack(dropit::cuda_executor{.stream = stream.get(), .resource = &mr},
               dx.cspan().first(1000));
    CHECK(mr.live == cache.bytes());
    dropit::SparseCache<float, dropit::MinK<>> none{dropit::MinK<>{1.0}};
    const std::size_t calls = mr.calls;
    none.pack(dropit::cuda_executor{.stream = stream.get(), .resource = &mr}, dx.cspan());
    CHECK(mr.calls == calls);  // k = 0: nothing allocated
    CHECK(none.space() == dropit::memory_space::device);
    cache.clear();
    CHECK(mr.live == 0);
    cache.pack(dropit::cuda_executor{.stream = stream.get(), .resource = &mr}, dx.cspan());
  }
  CHECK(mr.live == 0);
  stream.sync();
}

TEST_CASE("device: a workspace keeps the temporaries between calls" * DROPIT_DEVICE) {
  test_stream stream;
  counting_resource payloads, temps;
  dropit::cuda_workspace ws(&temps);
  CHECK(ws.resource() == &temps);
  CHECK(ws.bytes() == 0);
  const auto exec =
      dropit::cuda_executor{.stream = stream.get(), .resource = &payloads, .workspace = &ws};
  const auto x = normal_values<float>(3 * large, 9);
  device_buffer<float> dx(x), out(x.size());
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(exec, dx.cspan());
  CHECK(payloads.live == cache.bytes());
  CHECK(temps.live == ws.bytes());
  CHECK(ws.bytes() > 0);
  const std::size_t allocations = ws.allocations();
  for (int i = 0; i < 3; ++i) {
    cache.pack(exec, dx.cspan());
    cache.restore(exec, out.span());
  }
  CHECK(ws.allocations() == allocations);  // reused, not allocated again
  CHECK(same_bits<float>(out.to_host(stream.get()),
                         dense_from<float>(x, oracle_mink<float>(x, expected_k(x.size(), 0.9)))));
  ws.release();
  CHECK(ws.bytes() == 0);
  CHECK(temps.live == 0);
  stream.sync();
}

TEST_CASE("device: a failing resource throws and leaves the cache as it was" * DROPIT_DEVICE) {
  test_stream stream;
  counting_resource mr;
  const auto x = normal_values<float>(5000, 6);
  device_buffer<float> dx(x), out(x.size());
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::cuda_executor{stream.get()}, dx.cspan());
  const auto before = bytes_to_host(cache.payload(), stream.get());
  mr.fail = true;
  CHECK_THROWS_AS(
      cache.pack(dropit::cuda_executor{.stream = stream.get(), .resource = &mr}, dx.cspan()),
      std::bad_alloc);
  CHECK(cache.kept() == 500);
  CHECK(bytes_to_host(cache.payload(), stream.get()) == before);
  cache.restore(dropit::cuda_executor{stream.get()}, out.span());
  CHECK(same_bits<float>(out.to_host(stream.get()),
                         dense_from<float>(x, oracle_mink<float>(x, 500))));
}

TEST_CASE("device: threads pack at once, each on its own default workspace" * DROPIT_DEVICE) {
  const auto x = normal_values<float>((1 << 18) + 5, 12);
  const auto want = dense_from<float>(x, oracle_mink<float>(x, expected_k(x.size(), 0.5)));
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        if (same_bits<float>(pack_restore<on<float, fast_kernels>>(dropit::MinK<>{0.5}, x,
                                                                   expected_k(x.size(), 0.5)),
                             want)) {
          ++good;
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(good == 12);
}

// ---- errors -----------------------------------------------------------------------------------

TEST_CASE("cuda_error messages name the file, the line, the call and CUDA's error string") {
  const std::string m =
      dropit::detail::cuda_error_message("cudaMallocAsync(&p, bytes, stream)", "alloc.cuh", 42,
                                         "cudaErrorMemoryAllocation", "out of memory");
  CHECK(m ==
        "dropit: CUDA error at alloc.cuh:42: cudaMallocAsync(&p, bytes, stream) failed: "
        "cudaErrorMemoryAllocation: out of memory");
  const dropit::cuda_error e(m);
  const dropit::error& base = e;  // a cuda_error is a dropit::error
  CHECK(std::string(base.what()) == m);
}

TEST_CASE("a failing Thrust algorithm becomes a cuda_error naming where dropit ran it") {
  auto run = [] {
    return dropit::detail::dev::translate_errors([]() -> int {
      throw thrust::system_error(thrust::error_code(3, thrust::system_category()), "sort failed");
    });
  };
  try {
    (void)run();
    FAIL("no exception");
  } catch (const dropit::cuda_error& e) {
    const std::string m = e.what();
    CHECK(m.find("dropit: CUDA error at ") == 0);
    CHECK(m.find("cuda_suite.cpp:") != std::string::npos);  // the call site, with its line
    CHECK(m.find("in a Thrust algorithm: sort failed") != std::string::npos);
  }
  // dropit's own errors pass through unchanged.
  CHECK_THROWS_WITH_AS(
      dropit::detail::dev::translate_errors([]() -> int { throw dropit::error("bad input"); }),
      "bad input", dropit::error);
}

#if !DROPIT_CUDA_EMULATED
#include "cuda_gpu_cases.inl"
#endif
