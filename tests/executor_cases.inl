// Pack and restore against the brute-force oracles, written once for every executor: included by
// the host suite (sparse_cache_test.cpp: the host executor on 1 and 3 threads) and by the device
// suite (cuda_suite.cpp: the emulated device with g++, the real device with nvcc, fast and
// portable kernels). Before including, define
//   DROPIT_EXECUTOR_CASES       the configurations (executors.hpp) every case runs on
//   DROPIT_EXECUTOR_DECORATOR   what follows every case's name: empty, or `* decorator` (the device
//                               suite's skip rule)
// Oracles: test_support.hpp (sorting by key, written independently of the library).
#include "codec_oracle.hpp"
#include "executors.hpp"
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#if !defined(DROPIT_EXECUTOR_CASES) || !defined(DROPIT_EXECUTOR_DECORATOR)
#error \
    "define DROPIT_EXECUTOR_CASES and DROPIT_EXECUTOR_DECORATOR before including executor_cases.inl"
#endif

namespace dropit_test::executor_cases {

// Sanitizer builds run the largest size smaller, still past the host's parallel threshold and the
// selection's sample size.
#if defined(DROPIT_TEST_SANITIZED)
inline constexpr std::size_t large = (std::size_t{1} << 17) + 7;
#else
inline constexpr std::size_t large = (std::size_t{1} << 20) + 7;
#endif
inline const std::size_t sizes[] = {0, 1, 2, 31, 32, 33, 63, 64, 65, 1000, large};
inline const double gammas[] = {0.0, 0.1, 0.5, 0.9, 0.99, 1.0};

/// Packs x with policy p on C's executor, checks the cache's numbers, and returns the restored
/// tensor (on the host).
template <class C, class P, class T = typename C::type>
std::vector<T> pack_restore(const P& p, const std::vector<T>& x, std::size_t expect_k) {
  typename C::session s;
  typename C::template buffer<T> dx(x);
  dropit::SparseCache<T, P> cache{p};
  CHECK(cache.empty());
  cache.pack(s.exec(), dx.cspan());
  CHECK_FALSE(cache.empty());
  CHECK(cache.size() == x.size());
  CHECK(cache.kept() == expect_k);
  CHECK(cache.bytes() == described_bytes(x.size(), expect_k, sizeof(T)));
  CHECK(cache.space() == C::space);
  // Garbage in the output: restore must write every element.
  typename C::template buffer<T> out(std::vector<T>(x.size(), from_double<T>(-123.0)));
  cache.restore(s.exec(), out.span());
  return s.to_host(out);
}

/// Ties, all equal, zeros, negatives, denormals, Inf, NaN.
template <class T>
std::map<std::string, std::function<T(std::size_t)>> special_inputs() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {
      {"ties", [](std::size_t i) { return from_double<T>(static_cast<double>(i * 7 % 5) - 2.0); }},
      {"all equal", [](std::size_t) { return from_double<T>(1.5); }},
      {"all zero", [](std::size_t) { return from_double<T>(0.0); }},
      {"signed zeros", [](std::size_t i) { return from_double<T>(i % 3 ? -0.0 : 0.0); }},
      {"negatives",
       [](std::size_t i) { return from_double<T>(-1.0 - static_cast<double>(i % 97)); }},
      {"denormals",
       [](std::size_t i) {
         return i % 4 == 0 ? from_bits<T>(1 + i % 3)
                           : (i % 4 == 1 ? from_double<T>(0.0) : from_bits<T>(1));
       }},
      {"inf and nan",
       [=](std::size_t i) {
         switch (i % 11) {
           case 0:
             return from_double<T>(inf);
           case 3:
             return from_double<T>(-inf);
           case 5:
             return from_double<T>(nan);
           case 7:
             return from_double<T>(-nan);
           default:
             return from_double<T>(static_cast<double>(i % 13) - 6.0);
         }
       }},
  };
}

}  // namespace dropit_test::executor_cases

TEST_CASE_TEMPLATE(
    "MinK agrees with the brute-force oracle for every size and gamma" DROPIT_EXECUTOR_DECORATOR, C,
    DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  for (std::size_t n : sizes) {
    const auto x = normal_values<T>(n, 1000 + n);
    for (double g : gammas) {
      CAPTURE(n);
      CAPTURE(g);
      const std::size_t k = expected_k(n, g);
      const auto got = pack_restore<C>(dropit::MinK<>{g}, x, k);
      CHECK(same_bits<T>(got, dense_from<T>(x, oracle_mink<T>(x, k))));
    }
  }
}

TEST_CASE_TEMPLATE(
    "MinK on special inputs: ties, all-equal, zeros, negatives, denormals, Inf, "
    "NaN" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  for (const auto& [name, make] : special_inputs<T>()) {
    for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1000}, large / 2}) {
      std::vector<T> x(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = make(i);
      for (double g : gammas) {
        CAPTURE(name);
        CAPTURE(n);
        CAPTURE(g);
        const std::size_t k = expected_k(n, g);
        const auto got = pack_restore<C>(dropit::MinK<>{g}, x, k);
        CHECK(same_bits<T>(got, dense_from<T>(x, oracle_mink<T>(x, k))));
      }
    }
  }
}

TEST_CASE_TEMPLATE(
    "k = 0 stores nothing and restores zeros; k = n stores a dense copy" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  const auto x = normal_values<T>(5000, 5);
  typename C::template buffer<T> dx(x);
  dropit::SparseCache<T, dropit::MinK<>> none{dropit::MinK<>{1.0}};
  none.pack(s.exec(), dx.cspan());
  CHECK(none.kept() == 0);
  CHECK(none.bytes() == 0);
  CHECK(none.space() == C::space);  // an empty payload still belongs to its executor
  typename C::template buffer<T> out(std::vector<T>(x.size(), from_double<T>(9.0)));
  none.restore(s.exec(), out.span());
  CHECK(same_bits<T>(s.to_host(out), std::vector<T>(x.size(), from_double<T>(0.0))));
  if constexpr (C::space == dropit::memory_space::device) {
    // A device payload is restored by the device executor only.
    std::vector<T> host_out(x.size());
    CHECK_THROWS_AS(none.restore(dropit::host, std::span<T>(host_out)), dropit::error);
  }

  dropit::SparseCache<T, dropit::MinK<>> all{dropit::MinK<>{0.0}};
  all.pack(s.exec(), dx.cspan());
  CHECK(all.kept() == x.size());
  CHECK(all.bytes() == x.size() * sizeof(T));
  CHECK(all.layout().positions == dropit::position_encoding::none);
  all.restore(s.exec(), out.span());
  CHECK(same_bits<T>(s.to_host(out), x));
}

TEST_CASE_TEMPLATE(
    "Identity keeps everything, stores no positions, restores exactly" DROPIT_EXECUTOR_DECORATOR, C,
    DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  for (std::size_t n : sizes) {
    CAPTURE(n);
    auto x = normal_values<T>(n, 77 + n);
    if (n > 3) x[3] = from_double<T>(-0.0);
    CHECK(same_bits<T>(pack_restore<C>(dropit::Identity{}, x, n), x));
    typename C::session s;
    typename C::template buffer<T> dx(x);
    dropit::SparseCache<T, dropit::Identity> cache;
    cache.pack(s.exec(), dx.cspan());
    CHECK(cache.layout().positions == dropit::position_encoding::none);
  }
}

TEST_CASE_TEMPLATE("Random keeps exactly k positions, chosen by its key" DROPIT_EXECUTOR_DECORATOR,
                   C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  for (std::size_t n : sizes) {
    // Non-zero inputs, so the restored non-zeros are the kept positions.
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = from_double<T>(1.0 + static_cast<double>(i % 7));
    for (double g : gammas) {
      CAPTURE(n);
      CAPTURE(g);
      const dropit::Random<> p{g, 1234 + n};
      const std::size_t k = expected_k(n, g);
      const auto got = pack_restore<C>(p, x, k);
      const auto kept = nonzero_positions(got);
      CHECK(kept == oracle_by_key<T>(p, x, k));
      CHECK(same_bits<T>(got, dense_from<T>(x, kept)));
    }
  }
}

TEST_CASE_TEMPLATE(
    "Random's unbiased mode scales restored values by n / k" DROPIT_EXECUTOR_DECORATOR, C,
    DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  for (double g : {0.0, 0.75, 0.99}) {
    CAPTURE(g);
    const std::size_t n = 4000;
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = from_double<T>(1.0 + static_cast<double>(i % 5));
    const dropit::Random<> p{g, 3, dropit::scaling::unbiased};
    const std::size_t k = expected_k(n, g);
    const double scale = static_cast<double>(n) / static_cast<double>(k);
    typename C::session s;
    typename C::template buffer<T> dx(x), out(n);
    dropit::SparseCache<T, dropit::Random<>> cache{p};
    cache.pack(s.exec(), dx.cspan());
    CHECK(cache.restore_scale() == scale);
    cache.restore(s.exec(), out.span());
    const auto got = s.to_host(out);
    const auto kept = nonzero_positions(got);
    CHECK(kept == oracle_by_key<T>(p, x, k));
    for (std::size_t i : kept)
      CHECK(to_double(got[i]) == to_double(dropit::detail::scaled(x[i], scale)));
  }
}

TEST_CASE_TEMPLATE(
    "Elias-Fano positions equal the oracle's code bit for bit, blocks with nothing kept "
    "included" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  // Normal data (every block holds kept elements) and clusters: a few windows of large values in
  // zeros, so that most blocks keep nothing and a block's last words hold a later block's bits.
  std::vector<std::pair<std::string, std::vector<T>>> inputs;
  for (std::size_t n : {std::size_t{8192 * 3 + 5}, std::size_t{100003}, large})
    inputs.emplace_back("normal " + std::to_string(n), normal_values<T>(n, 77 + n));
  for (std::size_t n : {std::size_t{60001}, large}) {
    std::vector<T> x(n, from_double<T>(0.0));
    for (std::size_t w : {std::size_t{0}, n / 3, n / 3 + 8192, n - 40})
      for (std::size_t i = w; i < std::min(n, w + 40); ++i)
        x[i] = from_double<T>(1.0 + static_cast<double>(i % 37));
    inputs.emplace_back("clusters " + std::to_string(n), std::move(x));
  }
  int coded = 0;
  for (const auto& [name, x] : inputs) {
    typename C::template buffer<T> dx(x);
    for (double g : {0.75, 0.9, 0.99, 0.999, 0.9995}) {
      CAPTURE(name);
      CAPTURE(g);
      const std::size_t n = x.size();
      const std::size_t k = expected_k(n, g);
      dropit::SparseCache<T, dropit::MinK<>> cache{dropit::MinK<>{g}};
      cache.pack(s.exec(), dx.cspan());
      const auto& l = cache.layout();
      const auto kept = oracle_mink<T>(x, k);
      CHECK(cache.bytes() == described_bytes(n, k, sizeof(T)));
      if (l.positions != dropit::position_encoding::elias_fano) {
        CHECK(l.positions == dropit::position_encoding::index32);  // a few kept in many blocks
        continue;
      }
      ++coded;
      const ef_oracle_code code = elias_fano_oracle(n, kept);
      CHECK(l.low_bits == code.l);
      const auto bytes = s.bytes(cache.payload());
      auto word_at = [&](std::size_t at) {
        std::uint64_t w;
        std::memcpy(&w, bytes.data() + at, 8);
        return w;
      };
      CHECK(l.positions_bytes == (code.low.size() + code.high.size()) * 8);
      CHECK(l.high_offset == l.positions_offset + code.low.size() * 8);
      for (std::size_t w = 0; w < code.low.size(); ++w)
        CHECK(word_at(l.positions_offset + 8 * w) == code.low[w]);
      for (std::size_t w = 0; w < code.high.size(); ++w)
        CHECK(word_at(l.high_offset + 8 * w) == code.high[w]);
      for (std::size_t b = 0; b < code.block_counts.size(); ++b) {
        std::uint32_t count;
        std::memcpy(&count, bytes.data() + l.block_offsets_offset + 4 * b, 4);
        CHECK(count == code.block_counts[b]);
      }
      typename C::template buffer<T> out(std::vector<T>(n, from_double<T>(-5.0)));
      cache.restore(s.exec(), out.span());
      CHECK(same_bits<T>(s.to_host(out), dense_from<T>(x, kept)));
      // Without Elias-Fano: the bitmask (or index list), more bytes, the same tensor.
      dropit::SparseCache<T, dropit::MinK<>> plain{
          dropit::MinK<>{g}, {}, dropit::position_choice::no_elias_fano};
      plain.pack(s.exec(), dx.cspan());
      CHECK(plain.layout().positions != dropit::position_encoding::elias_fano);
      CHECK(plain.bytes() > cache.bytes());
      typename C::template buffer<T> out2(std::vector<T>(n, from_double<T>(-5.0)));
      plain.restore(s.exec(), out2.span());
      CHECK(same_bits<T>(s.to_host(out2), dense_from<T>(x, kept)));
    }
  }
  CHECK(coded >= 20);  // of 25 packs: the code is what these cases test
}

TEST_CASE_TEMPLATE(
    "a payload loaded from host bytes restores what its pack restores; bad bytes "
    "leave the cache as it was" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  const auto exec = s.exec();
  const auto x = normal_values<T>(20000, 5);
  typename C::template buffer<T> dx(x);
  // Bitmask, Elias-Fano, index list, none; exact and int8 values.
  for (const double g : {0.5, 0.9, 0.9999, 0.0}) {
    CAPTURE(g);
    dropit::SparseCache<T, dropit::MinK<>> a{dropit::MinK<>{g}}, b{dropit::MinK<>{g}};
    a.pack(exec, dx.cspan());
    const std::vector<std::byte> bytes = s.bytes(a.payload());
    b.load(exec, a.size(), a.kept(), a.layout().positions, bytes);
    CHECK(b.space() == C::space);
    CHECK(s.bytes(b.payload()) == bytes);
    typename C::template buffer<T> ra(x.size()), rb(x.size());
    a.restore(exec, ra.span());
    b.restore(exec, rb.span());
    const auto want = dense_from<T>(x, oracle_mink<T>(x, expected_k(x.size(), g)));
    CHECK(same_bits<T>(s.to_host(rb), want));
    dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> c{dropit::MinK<>{g}},
        d{dropit::MinK<>{g}};
    c.pack(exec, dx.cspan());
    d.load(exec, c.size(), c.kept(), c.layout().positions, s.bytes(c.payload()));
    c.restore(exec, ra.span());
    d.restore(exec, rb.span());
    CHECK(same_bits<T>(s.to_host(ra), s.to_host(rb)));
    if (a.kept() == 0 || a.kept() == x.size()) continue;
    // One block offset off by one: refused, b keeps its payload.
    std::vector<std::byte> bad = bytes;
    bad[a.layout().block_offsets_offset == bad.size() ? bad.size() - 1
                                                      : a.layout().block_offsets_offset] ^=
        std::byte{1};
    CHECK_THROWS_AS(b.load(exec, a.size(), a.kept(), a.layout().positions, bad), dropit::error);
    CHECK(s.bytes(b.payload()) == bytes);
  }
}

TEST_CASE_TEMPLATE(
    "restore is repeatable; a second pack replaces the first" DROPIT_EXECUTOR_DECORATOR, C,
    DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  const auto exec = s.exec();
  const auto x = normal_values<T>(3000, 1);
  const auto y = normal_values<T>(700, 2);
  using buffer = typename C::template buffer<T>;
  buffer dx(x), dy(y), a(x.size()), b(x.size()), c(x.size()), d(y.size());
  dropit::SparseCache<T, dropit::MinK<>> cache{dropit::MinK<>{0.9}};
  cache.pack(exec, dx.cspan());
  cache.restore(exec, a.span());
  cache.restore(exec, b.span());
  const auto ha = s.to_host(a);
  CHECK(same_bits<T>(ha, s.to_host(b)));
  CHECK(same_bits<T>(ha, dense_from<T>(x, oracle_mink<T>(x, expected_k(x.size(), 0.9)))));
  // Packing the restored tensor again keeps the same elements.
  dropit::SparseCache<T, dropit::MinK<>> again{dropit::MinK<>{0.9}};
  again.pack(exec, a.cspan());
  again.restore(exec, c.span());
  CHECK(same_bits<T>(ha, s.to_host(c)));
  cache.pack(exec, dy.cspan());
  CHECK(cache.size() == y.size());
  cache.restore(exec, d.span());
  CHECK(same_bits<T>(s.to_host(d), dense_from<T>(y, oracle_mink<T>(y, expected_k(y.size(), 0.9)))));
}

TEST_CASE_TEMPLATE(
    "zero-length tensors pack and restore; the cache is then not empty" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  dropit::SparseCache<T, dropit::MinK<>> cache{dropit::MinK<>{0.9}};
  cache.pack(s.exec(), std::span<const T>{});
  CHECK_FALSE(cache.empty());
  CHECK(cache.size() == 0);
  CHECK(cache.bytes() == 0);
  CHECK(cache.space() == C::space);
  CHECK_NOTHROW(cache.restore(s.exec(), std::span<T>{}));
}

TEST_CASE_TEMPLATE(
    "a value codec restores the oracle's decoded kept values; payloads equal the host's, and the "
    "unbiased scale applies" DROPIT_EXECUTOR_DECORATOR,
    C, DROPIT_EXECUTOR_CASES) {
  using namespace dropit_test;
  using namespace dropit_test::executor_cases;
  using T = typename C::type;
  INFO(C::name());
  typename C::session s;
  const auto exec = s.exec();
  const dropit::host_executor host{.threads = 1};
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{5000}, large}) {
    auto x = normal_values<T>(n, 300 + n);
    if (n > 4000) {  // a NaN, infinities, and a chunk of zeros among the kept values
      x[3] = from_double<T>(std::numeric_limits<double>::quiet_NaN());
      x[10] = from_double<T>(std::numeric_limits<double>::infinity());
      x[11] = from_double<T>(-std::numeric_limits<double>::infinity());
      for (std::size_t i = 1024; i < 3072; ++i)
        x[i] = from_double<T>(0.0);
    }
    typename C::template buffer<T> dx(x), out(std::vector<T>(n, from_double<T>(-7.0)));
    for (double g : {0.0, 0.5, 0.9, 0.99}) {
      CAPTURE(n);
      CAPTURE(g);
      const std::size_t k = expected_k(n, g);
      const auto kept = oracle_mink<T>(x, k);
      // int8, to nearest
      dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> a{dropit::MinK<>{g}};
      a.pack(exec, dx.cspan());
      a.restore(exec, out.span());
      CHECK(same_bits<T>(s.to_host(out), oracle_coded_dense<T>(x, kept, false)));
      // int8, stochastic
      dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> b{
          dropit::MinK<>{g}, {.stochastic = true, .seed = n}};
      b.pack(exec, dx.cspan());
      b.restore(exec, out.span());
      CHECK(same_bits<T>(s.to_host(out), oracle_coded_dense<T>(x, kept, false, true, n)));
      // e4m3
      dropit::SparseCache<T, dropit::MinK<>, dropit::codec::fp8_e4m3> c{dropit::MinK<>{g}};
      c.pack(exec, dx.cspan());
      c.restore(exec, out.span());
      CHECK(same_bits<T>(s.to_host(out), oracle_coded_dense<T>(x, kept, true)));
      CHECK(c.bytes() ==
            dropit::make_layout(n, k, sizeof(T), dropit::value_codec::fp8_e4m3).total_bytes);
      // The payload is the host executor's, byte for byte.
      dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> h{
          dropit::MinK<>{g}, {.stochastic = true, .seed = n}};
      h.pack(host, std::span<const T>(x));
      CHECK(s.bytes(b.payload()) == std::vector<std::byte>(h.payload().begin(), h.payload().end()));
    }
    // Random's unbiased scale multiplies the decoded values.
    const dropit::Random<> r{0.5, 4, dropit::scaling::unbiased};
    dropit::SparseCache<T, dropit::Random<>, dropit::codec::int8> rc{r};
    rc.pack(exec, dx.cspan());
    rc.restore(exec, out.span());
    const std::size_t k = r.kept(n);
    auto want = oracle_coded_dense<T>(x, oracle_by_key<T>(r, x, k), false);
    for (auto& v : want)
      v = dropit::detail::scaled(v, rc.restore_scale());
    CHECK(same_bits<T>(s.to_host(out), want));
  }
  // Identity + a codec: dense quantized storage.
  const auto y = normal_values<T>(3000, 8);
  typename C::template buffer<T> dy(y), back(y.size());
  dropit::SparseCache<T, dropit::Identity, dropit::codec::int8> id;
  id.pack(exec, dy.cspan());
  CHECK(id.layout().positions == dropit::position_encoding::none);
  id.restore(exec, back.span());
  std::vector<std::size_t> all(y.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  CHECK(same_bits<T>(s.to_host(back), oracle_coded_dense<T>(y, all, false)));
}
