// libFuzzer target: SparseCache::load of arbitrary bytes. Every input is either refused with
// dropit::error (the cache then unchanged) or accepted as a payload that restores without any
// out-of-bounds access (ASan, UBSan) and loads again from its own bytes to the same payload.
//
// Input: byte 0 picks the element type, byte 1 the codec (exact, int8, fp8), byte 2 the position
// encoding, bytes 3..6 n (below 2^17), bytes 7..10 k (up to n + 1), byte 11 how the payload is
// taken: odd, exactly the rest of the input; even, the rest cut or zero-padded to the size the
// description's layout gives (so that the deeper checks run); the rest are the payload's bytes.
#include <dropit/dropit.hpp>

#include "../test_support.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_load: %s\n", what);
  std::abort();
}

template <class T, class C>
void run(std::size_t n, std::size_t k, dropit::position_encoding e, bool exact_size,
         std::span<const std::byte> rest) {
  std::vector<std::byte> bytes(rest.begin(), rest.end());
  if (!exact_size && k <= n) {
    dropit::packed_layout l = dropit::make_layout(n, k, sizeof(T), C::kind);
    if (l.positions != e)
      l = dropit::make_layout(n, k, sizeof(T), C::kind, dropit::position_choice::no_elias_fano);
    bytes.resize(l.total_bytes, std::byte{0});
  }
  // A cache that already holds something: a refused load must leave it as it was.
  using cache_t = dropit::SparseCache<T, dropit::MinK<>, C>;
  cache_t cache{dropit::MinK<>{0.5}};
  const std::vector<T> before_x(5, dropit_test::from_double<T>(1.5));
  cache.pack(dropit::host_executor{.threads = 1}, std::span<const T>(before_x));
  const std::vector<std::byte> before(cache.payload().begin(), cache.payload().end());
  try {
    cache.load(dropit::host_executor{.threads = 1}, n, k, e, bytes);
  } catch (const dropit::error&) {
    if (cache.size() != before_x.size() ||
        !std::equal(before.begin(), before.end(), cache.payload().begin(), cache.payload().end()))
      fail("a refused load changed the cache");
    return;
  }
  if (cache.size() != n || cache.kept() != k || cache.layout().positions != e ||
      !std::equal(bytes.begin(), bytes.end(), cache.payload().begin(), cache.payload().end()))
    fail("an accepted load holds other than what it was given");
  std::vector<T> out(n);
  cache.restore(dropit::host_executor{.threads = 1}, std::span<T>(out));
  cache_t again{dropit::MinK<>{0.5}};
  again.load(dropit::host_executor{.threads = 1}, n, k, e, cache.payload());
  std::vector<T> out2(n);
  again.restore(dropit::host_executor{.threads = 1}, std::span<T>(out2));
  if (n > 0 && std::memcmp(out.data(), out2.data(), n * sizeof(T)) != 0)
    fail("a payload loaded twice restores differently");
}

template <class T>
void with_codec(std::uint8_t codec, std::size_t n, std::size_t k, dropit::position_encoding e,
                bool exact_size, std::span<const std::byte> rest) {
  switch (codec % 3) {
    case 0:
      return run<T, dropit::codec::exact>(n, k, e, exact_size, rest);
    case 1:
      return run<T, dropit::codec::int8>(n, k, e, exact_size, rest);
    default:
      return run<T, dropit::codec::fp8_e4m3>(n, k, e, exact_size, rest);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 12) return 0;
  std::uint32_t n32 = 0, k32 = 0;
  std::memcpy(&n32, data + 3, 4);
  std::memcpy(&k32, data + 7, 4);
  const std::size_t n = n32 % (std::size_t{1} << 17);
  const std::size_t k = k32 % (n + 2);
  const auto e = static_cast<dropit::position_encoding>(data[2] % 5);
  const bool exact_size = (data[11] & 1) != 0;
  const std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data) + 12, size - 12);
  switch (data[0] % 4) {
    case 0:
      with_codec<float>(data[1], n, k, e, exact_size, rest);
      break;
    case 1:
      with_codec<double>(data[1], n, k, e, exact_size, rest);
      break;
#if DROPIT_HAS_HALF
    case 2:
      with_codec<__half>(data[1], n, k, e, exact_size, rest);
      break;
    default:
      with_codec<__nv_bfloat16>(data[1], n, k, e, exact_size, rest);
      break;
#else
    default:
      with_codec<float>(data[1], n, k, e, exact_size, rest);
      break;
#endif
  }
  return 0;
}
