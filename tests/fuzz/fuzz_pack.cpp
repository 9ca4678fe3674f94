// libFuzzer target: pack and restore of arbitrary bytes against the brute-force oracle.
//
// Input: byte 0 picks the element type, byte 1 the policy (MinK, Random, Identity), byte 2 gamma
// (0..250 -> 0..1; 251..255 an invalid gamma), byte 3 the executor (low 4 bits: 1, 2 or 3
// threads, 15 asks for more than host_executor::max_threads; high 4 bits all set: the data is
// tiled past the parallel threshold, slow enough with the oracle to keep for 1 input in 16),
// bytes 4..11 Random's seed; the rest are the elements' bytes. Every outcome is checked: the
// restored tensor equals the oracle's bit for bit, kept() and bytes() follow the format, and an
// invalid call throws dropit::error and leaves the cache as it was.
#include <dropit/dropit.hpp>

#include "../test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace {

using namespace dropit_test;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_pack: %s\n", what);
  std::abort();
}

/// The kept indices, ascending: the k first in the order (rank descending, index ascending), with
/// each element's rank computed once and an O(n) selection (the tiled inputs are 2^17 elements).
/// MinK's rank is DropIT's rule (NaN above +Inf, then |x|, -0 equal to +0), written without the
/// library's keys; Random's is the policy's key.
template <class T, class P>
std::vector<std::size_t> oracle(const P& policy, std::span<const T> x, std::size_t k) {
  struct entry {
    int nan;
    double rank;
    std::size_t i;
  };
  std::vector<entry> e(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<P, dropit::MinK<>>) {
      const double v = to_double(x[i]);
      e[i] = {std::isnan(v) ? 1 : 0, std::isnan(v) ? 0.0 : std::fabs(v), i};
    } else {
      e[i] = {0, static_cast<double>(policy.key(x[i], i)), i};
    }
  }
  const auto before = [](const entry& a, const entry& b) {
    if (a.nan != b.nan) return a.nan > b.nan;
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.i < b.i;
  };
  if (k < e.size())
    std::nth_element(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(k), e.end(), before);
  std::vector<std::size_t> kept(k);
  for (std::size_t j = 0; j < k; ++j)
    kept[j] = e[j].i;
  std::sort(kept.begin(), kept.end());
  return kept;
}

template <class T, class P>
void run(const P& policy, double gamma, const dropit::host_executor& exec, bool bad_exec,
         std::span<const T> x) {
  // A cache that already holds something: a failed pack must leave it as it was.
  const std::vector<T> before_x(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2));
  dropit::SparseCache<T, P> cache{policy};
  cache.pack(dropit::host_executor{.threads = 1}, std::span<const T>(before_x));
  const std::vector<std::byte> before(cache.payload().begin(), cache.payload().end());
  const std::size_t before_n = cache.size();

  try {
    cache.pack(exec, x);
  } catch (const dropit::error&) {
    if (!bad_exec) fail("pack threw on valid input");
    if (cache.size() != before_n ||
        !std::equal(before.begin(), before.end(), cache.payload().begin(), cache.payload().end()))
      fail("a failed pack changed the cache");
    return;
  }
  if (bad_exec) fail("pack accepted more threads than host_executor::max_threads");

  const std::size_t n = x.size();
  const bool identity = std::is_same_v<P, dropit::Identity>;
  const std::size_t k = identity ? n : expected_k(n, gamma);
  if (cache.size() != n || cache.kept() != k) fail("size() or kept() differs from the formula");
  if (!identity && cache.bytes() != described_bytes(n, k, sizeof(T)))
    fail("bytes() differs from the format description");

  std::vector<std::size_t> kept;
  if constexpr (std::is_same_v<P, dropit::Identity>) {
    kept.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      kept[i] = i;
  } else {
    kept = oracle(policy, x, k);
    if (n <= 4096 && kept != (std::is_same_v<P, dropit::MinK<>> ? oracle_mink(x, k)
                                                                : oracle_by_key(policy, x, k)))
      fail("the fuzzer's oracle differs from the test suite's");  // checks the oracle itself
  }
  const std::vector<T> expected = dense_from(x, kept);
  std::vector<T> out(n, from_double<T>(7.0));  // no stale zeros
  cache.restore(exec, std::span<T>(out));
  if (!same_bits(std::span<const T>(out), std::span<const T>(expected)))
    fail("restore differs from the oracle");
}

template <class T>
void with_type(const std::uint8_t* data, std::size_t size) {
  const std::uint8_t policy_byte = data[1], gamma_byte = data[2], exec_byte = data[3];
  std::uint64_t seed = 0;
  std::memcpy(&seed, data + 4, 8);
  data += 12;
  size -= 12;
  std::vector<T> x(size / sizeof(T));
  if (!x.empty()) std::memcpy(x.data(), data, x.size() * sizeof(T));
  if ((exec_byte & 0xf0) == 0xf0 && !x.empty()) {
    // Tiled past the parallel threshold: the multi-threaded selection, with many exact ties.
    const std::size_t period = x.size();
    x.resize(dropit::host_executor::parallel_threshold + 3 * period + 1);
    for (std::size_t i = period; i < x.size(); ++i)
      x[i] = x[i % period];
  }
  const bool bad_exec = (exec_byte & 0x0f) == 0x0f;
  const dropit::host_executor exec{
      .threads = bad_exec ? dropit::host_executor::max_threads + 1 : 1u + (exec_byte & 0x0f) % 3u,
      .adaptive = false};
  const std::span<const T> xs(x);

  if (gamma_byte > 250) {
    // Invalid gammas: above 1, below 0, NaN.
    const double bad[] = {1.0 + 1e-9, -0.25, std::numeric_limits<double>::quiet_NaN(), 2.0, -1.0};
    const double g = bad[gamma_byte - 251];
    try {
      if (policy_byte % 2 == 0) {
        (void)dropit::MinK<>{g};
      } else {
        (void)dropit::Random<>{g, seed};
      }
    } catch (const dropit::error&) {
      return;
    }
    fail("an invalid gamma was accepted");
  }
  const double gamma = gamma_byte / 250.0;
  switch (policy_byte % 3) {
    case 0:
      run<T>(dropit::MinK<>{gamma}, gamma, exec, bad_exec, xs);
      break;
    case 1:
      run<T>(dropit::Random<>{gamma, seed}, gamma, exec, bad_exec, xs);
      break;
    default:
      run<T>(dropit::Identity{}, gamma, exec, bad_exec, xs);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 12) return 0;
  switch (data[0] % 4) {
    case 0:
      with_type<float>(data, size);
      break;
    case 1:
      with_type<double>(data, size);
      break;
#if DROPIT_HAS_HALF
    case 2:
      with_type<__half>(data, size);
      break;
    default:
      with_type<__nv_bfloat16>(data, size);
      break;
#else
    default:
      with_type<float>(data, size);
      break;
#endif
  }
  return 0;
}
