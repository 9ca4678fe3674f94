// SparseCache on the host executor, over every element type x policy, against brute-force oracles.
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <array>
#include <functional>
#include <limits>
#include <map>
#include <memory_resource>
#include <new>
#include <set>

using namespace dropit_test;

namespace {

const std::size_t sizes[] = {0, 1, 2, 31, 32, 33, 63, 64, 65, 1000, (std::size_t{1} << 20) + 7};
const double gammas[] = {0.0, 0.1, 0.5, 0.9, 0.99, 1.0};

/// Packs x with policy p on `exec`, checks size/kept/bytes/empty, and returns the restored tensor.
template <class T, class P>
std::vector<T> pack_restore(const P& p, std::span<const T> x, std::size_t expect_k,
                            const dropit::host_executor& exec = dropit::host) {
  dropit::SparseCache<T, P> cache{p};
  CHECK(cache.empty());
  cache.pack(exec, x);
  CHECK_FALSE(cache.empty());
  CHECK(cache.size() == x.size());
  CHECK(cache.kept() == expect_k);
  CHECK(cache.bytes() == described_bytes(x.size(), expect_k, sizeof(T)));
  CHECK(cache.space() == dropit::memory_space::host);
  // Fill the output with garbage: restore must write every element.
  std::vector<T> out(x.size(), from_double<T>(-123.0));
  cache.restore(exec, std::span<T>(out));
  return out;
}

/// Indices where the restored tensor is non-zero (inputs must be non-zero everywhere).
template <class T>
std::vector<std::size_t> nonzero_positions(const std::vector<T>& v) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (to_double(v[i]) != 0.0) idx.push_back(i);
  }
  return idx;
}

template <class T, class P>
std::vector<std::byte> payload_bytes(const P& p, std::span<const T> x,
                                     const dropit::host_executor& exec) {
  dropit::SparseCache<T, P> cache{p};
  cache.pack(exec, x);
  const auto bytes = cache.payload();
  return {bytes.begin(), bytes.end()};
}

}  // namespace

TEST_CASE_TEMPLATE("MinK agrees with the brute-force oracle for every size and gamma", T,
                   DROPIT_TEST_TYPES) {
  for (std::size_t n : sizes) {
    const auto x = normal_values<T>(n, 1000 + n);
    for (double g : gammas) {
      CAPTURE(n);
      CAPTURE(g);
      const std::size_t k = expected_k(n, g);
      const auto got = pack_restore<T>(dropit::MinK<>{g}, std::span<const T>(x), k);
      const auto want = dense_from<T>(x, oracle_mink<T>(x, k));
      CHECK(same_bits<T>(got, want));
    }
  }
}

TEST_CASE_TEMPLATE("MinK on special inputs: ties, all-equal, zeros, negatives, denormals, Inf, NaN",
                   T, DROPIT_TEST_TYPES) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, std::function<T(std::size_t)>> inputs = {
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
       [&](std::size_t i) {
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
  for (const auto& [name, make] : inputs) {
    for (std::size_t n :
         {std::size_t{1}, std::size_t{33}, std::size_t{1000}, std::size_t{1} << 19}) {
      std::vector<T> x(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = make(i);
      for (double g : gammas) {
        CAPTURE(name);
        CAPTURE(n);
        CAPTURE(g);
        const std::size_t k = expected_k(n, g);
        const auto got = pack_restore<T>(dropit::MinK<>{g}, std::span<const T>(x), k);
        CHECK(same_bits<T>(got, dense_from<T>(x, oracle_mink<T>(x, k))));
      }
    }
  }
}

TEST_CASE_TEMPLATE("k = 0 stores nothing and restores zeros; k = n stores a dense copy", T,
                   DROPIT_TEST_TYPES) {
  const auto x = normal_values<T>(5000, 5);
  dropit::SparseCache<T, dropit::MinK<1.0>> none;
  none.pack(dropit::host, x);
  CHECK(none.kept() == 0);
  CHECK(none.bytes() == 0);
  std::vector<T> out(x.size(), from_double<T>(9.0));
  none.restore(dropit::host, std::span<T>(out));
  CHECK(same_bits<T>(out, std::vector<T>(x.size(), from_double<T>(0.0))));

  dropit::SparseCache<T, dropit::MinK<0.0>> all;
  all.pack(dropit::host, x);
  CHECK(all.kept() == x.size());
  CHECK(all.bytes() == x.size() * sizeof(T));
  CHECK(all.layout().positions == dropit::position_encoding::none);
  all.restore(dropit::host, std::span<T>(out));
  CHECK(same_bits<T>(out, x));
}

TEST_CASE_TEMPLATE("Identity keeps everything, stores no positions, restores exactly", T,
                   DROPIT_TEST_TYPES) {
  for (std::size_t n : sizes) {
    CAPTURE(n);
    auto x = normal_values<T>(n, 77 + n);
    if (n > 3) x[3] = from_double<T>(-0.0);
    const auto got = pack_restore<T>(dropit::Identity{}, std::span<const T>(x), n);
    CHECK(same_bits<T>(got, x));
    dropit::SparseCache<T, dropit::Identity> cache;
    cache.pack(dropit::host, x);
    CHECK(cache.layout().positions == dropit::position_encoding::none);
    CHECK(cache.bytes() == n * sizeof(T));
  }
}

TEST_CASE_TEMPLATE("Random keeps exactly k positions, chosen by its key", T, DROPIT_TEST_TYPES) {
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
      const auto got = pack_restore<T>(p, std::span<const T>(x), k);
      const auto kept = nonzero_positions(got);
      CHECK(kept.size() == k);
      CHECK(kept == oracle_by_key<T>(p, x, k));
      CHECK(same_bits<T>(got, dense_from<T>(x, kept)));
    }
  }
}

TEST_CASE_TEMPLATE("payloads do not depend on the thread count", T, DROPIT_TEST_TYPES) {
  const std::size_t n = (std::size_t{1} << 20) + 7;
  const auto x = normal_values<T>(n, 99);
  const dropit::host_executor one{.threads = 1};
  const dropit::host_executor two{.threads = 2};
  const dropit::host_executor three{.threads = 3};
  for (double g : {0.5, 0.9, 0.99}) {
    CAPTURE(g);
    const auto a = payload_bytes<T>(dropit::Random<>{g, 5}, x, one);
    CHECK(a == payload_bytes<T>(dropit::Random<>{g, 5}, x, two));
    CHECK(a == payload_bytes<T>(dropit::Random<>{g, 5}, x, three));
    const auto m = payload_bytes<T>(dropit::MinK<>{g}, x, one);
    CHECK(m == payload_bytes<T>(dropit::MinK<>{g}, x, two));
    CHECK(m == payload_bytes<T>(dropit::MinK<>{g}, x, three));
  }
}

TEST_CASE("Random: the same seed repeats, different seeds differ") {
  const std::size_t n = 100000;
  std::vector<float> x(n, 1.0f);
  auto positions = [&](std::uint64_t seed) {
    return nonzero_positions(pack_restore<float>(dropit::Random<>{0.9, seed},
                                                 std::span<const float>(x), expected_k(n, 0.9)));
  };
  const auto a = positions(7);
  CHECK(a == positions(7));
  const auto b = positions(8);
  CHECK(a != b);
  // Two independent 10% samples share about 1% of n.
  std::vector<std::size_t> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  CHECK(common.size() > 800);
  CHECK(common.size() < 1200);
}

TEST_CASE("Random positions are uniform: chi-square over positions across seeds") {
  // n = 64 positions, k = 16 per draw, 4000 seeds: every position is kept 1000 times in
  // expectation. The statistic has 63 degrees of freedom; 103.4 is its 0.999 quantile.
  const std::size_t n = 64;
  const std::size_t seeds = 4000;
  std::vector<float> x(n, 1.0f);
  std::array<double, 64> hits{};
  for (std::uint64_t s = 0; s < seeds; ++s) {
    const auto kept = nonzero_positions(
        pack_restore<float>(dropit::Random<>{0.75, s}, std::span<const float>(x), 16));
    REQUIRE(kept.size() == 16);
    for (std::size_t i : kept)
      hits[i] += 1;
  }
  const double expect = static_cast<double>(seeds) * 16.0 / 64.0;
  double chi2 = 0;
  for (double h : hits)
    chi2 += (h - expect) * (h - expect) / expect;
  CAPTURE(chi2);
  CHECK(chi2 < 103.4);
  // And pairs: how often positions i and i+1 are kept together (dependence between neighbours
  // would show here): expected seeds * (16/64) * (15/63).
  double both = 0;
  for (std::uint64_t s = 0; s < seeds; ++s) {
    const auto kept = nonzero_positions(
        pack_restore<float>(dropit::Random<>{0.75, s + 100000}, std::span<const float>(x), 16));
    for (std::size_t j = 0; j + 1 < kept.size(); ++j)
      both += kept[j] + 1 == kept[j + 1];
  }
  const double pair_expect = static_cast<double>(seeds) * 63.0 * (16.0 / 64.0) * (15.0 / 63.0);
  CHECK(both > pair_expect * 0.9);
  CHECK(both < pair_expect * 1.1);
}

TEST_CASE_TEMPLATE("Random's unbiased mode scales restored values by n / k", T, DROPIT_TEST_TYPES) {
  const std::size_t n = 4000;
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = from_double<T>(1.0 + static_cast<double>(i % 5));
  const dropit::Random<> p{0.75, 3, dropit::scaling::unbiased};
  dropit::SparseCache<T, dropit::Random<>> cache{p};
  cache.pack(dropit::host, x);
  CHECK(cache.restore_scale() == 4.0);
  std::vector<T> out(n);
  cache.restore(dropit::host, std::span<T>(out));
  const auto kept = nonzero_positions(out);
  CHECK(kept.size() == 1000);
  for (std::size_t i : kept)
    CHECK(to_double(out[i]) == 4.0 * to_double(x[i]));
}

TEST_CASE_TEMPLATE("restore round trip: restore is repeatable, pack replaces content", T,
                   DROPIT_TEST_TYPES) {
  const auto x = normal_values<T>(3000, 1);
  const auto y = normal_values<T>(700, 2);
  dropit::SparseCache<T, dropit::MinK<0.9>> cache;
  cache.pack(dropit::host, x);
  std::vector<T> a(x.size()), b(x.size());
  cache.restore(dropit::host, std::span<T>(a));
  cache.restore(dropit::host, std::span<T>(b));
  CHECK(same_bits<T>(a, b));
  // Restoring then packing the restored tensor keeps the same elements.
  dropit::SparseCache<T, dropit::MinK<0.9>> again;
  again.pack(dropit::host, a);
  std::vector<T> c(x.size());
  again.restore(dropit::host, std::span<T>(c));
  CHECK(same_bits<T>(a, c));
  // A second pack replaces the first.
  cache.pack(dropit::host, y);
  CHECK(cache.size() == y.size());
  std::vector<T> d(y.size());
  cache.restore(dropit::host, std::span<T>(d));
  CHECK(same_bits<T>(d, dense_from<T>(y, oracle_mink<T>(y, expected_k(y.size(), 0.9)))));
}

TEST_CASE("zero-length tensors pack and restore; the cache is then not empty") {
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::host, std::span<const float>{});
  CHECK_FALSE(cache.empty());
  CHECK(cache.size() == 0);
  CHECK(cache.bytes() == 0);
  CHECK_NOTHROW(cache.restore(dropit::host, std::span<float>{}));
}

TEST_CASE("move-only: a moved-from cache is empty, the target holds the payload") {
  static_assert(!std::is_copy_constructible_v<dropit::SparseCache<float, dropit::MinK<0.9>>>);
  static_assert(
      std::is_nothrow_move_constructible_v<dropit::SparseCache<float, dropit::MinK<0.9>>>);
  const auto x = normal_values<float>(2048, 3);
  dropit::SparseCache<float, dropit::MinK<>> a{dropit::MinK<>{0.5}};
  a.pack(dropit::host, x);
  const std::size_t bytes = a.bytes();
  dropit::SparseCache<float, dropit::MinK<>> b = std::move(a);
  CHECK(a.empty());
  CHECK(a.bytes() == 0);
  CHECK(b.bytes() == bytes);
  CHECK(b.policy().gamma() == 0.5);
  std::vector<float> out(x.size());
  b.restore(dropit::host, std::span<float>(out));
  CHECK(same_bits<float>(out, dense_from<float>(x, oracle_mink<float>(x, 1024))));
  dropit::SparseCache<float, dropit::MinK<>> c{dropit::MinK<>{0.1}};
  c = std::move(b);
  CHECK(b.empty());
  CHECK(c.kept() == 1024);
  c.clear();
  CHECK(c.empty());
  CHECK(c.bytes() == 0);
  CHECK(c.size() == 0);
}

namespace {
/// Counts what it hands out; can be told to fail.
class counting_resource : public std::pmr::memory_resource {
 public:
  std::size_t live = 0, peak = 0, calls = 0;
  bool fail = false;

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    if (fail) throw std::bad_alloc();
    ++calls;
    live += bytes;
    peak = std::max(peak, live);
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    live -= bytes;
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const memory_resource& o) const noexcept override { return this == &o; }
};
}  // namespace

TEST_CASE("a configured host executor takes the payload from its memory resource") {
  counting_resource mr;
  const dropit::host_executor exec{.threads = 2, .resource = &mr};
  const auto x = normal_values<float>(1 << 20, 4);
  {
    dropit::SparseCache<float, dropit::MinK<0.9>> cache;
    cache.pack(exec, x);
    CHECK(mr.live == cache.bytes());
    CHECK(mr.calls == 1);
    cache.pack(exec, std::span<const float>(x).first(1000));
    CHECK(mr.live == cache.bytes());
    CHECK(mr.peak >= described_bytes(1 << 20, expected_k(1 << 20, 0.9), 4));
  }
  CHECK(mr.live == 0);
}

TEST_CASE("bad input throws dropit::error and leaves the cache as it was") {
  const auto x = normal_values<float>(5000, 6);
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  std::vector<float> out(x.size());

  SUBCASE("restore of an empty cache") {
    CHECK_THROWS_WITH_AS(cache.restore(dropit::host, std::span<float>(out)),
                         "dropit: restore: the cache is empty (nothing was packed)", dropit::error);
    CHECK(cache.empty());
  }

  cache.pack(dropit::host, x);
  const auto before = std::vector<std::byte>(cache.payload().begin(), cache.payload().end());
  auto unchanged = [&] {
    CHECK(cache.size() == x.size());
    CHECK(cache.kept() == 500);
    CHECK(std::equal(before.begin(), before.end(), cache.payload().begin(), cache.payload().end()));
    std::vector<float> r(x.size());
    cache.restore(dropit::host, std::span<float>(r));
    CHECK(same_bits<float>(r, dense_from<float>(x, oracle_mink<float>(x, 500))));
  };

  SUBCASE("restore into a span of the wrong size") {
    std::vector<float> small(4999);
    CHECK_THROWS_WITH_AS(cache.restore(dropit::host, std::span<float>(small)),
                         "dropit: restore: output has 4999 elements, the cache holds 5000",
                         dropit::error);
    unchanged();
  }
  SUBCASE("null data with a non-zero size") {
    CHECK_THROWS_WITH_AS(
        cache.pack(dropit::host, std::span<const float>(static_cast<const float*>(nullptr), 10)),
        "dropit: pack: input has a null data pointer and 10 elements", dropit::error);
    unchanged();
    CHECK_THROWS_WITH_AS(
        cache.restore(dropit::host, std::span<float>(static_cast<float*>(nullptr), 5000)),
        "dropit: restore: output has a null data pointer and 5000 elements", dropit::error);
    unchanged();
  }
  SUBCASE("the memory resource fails") {
    counting_resource mr;
    mr.fail = true;
    CHECK_THROWS_AS(cache.pack(dropit::host_executor{.resource = &mr}, x), std::bad_alloc);
    unchanged();
  }
  SUBCASE("a policy that keeps more than n") {
    struct greedy {
      std::size_t kept(std::size_t n) const { return n + 1; }
      std::uint32_t key(float, std::size_t) const noexcept { return 0; }
    };
    dropit::SparseCache<float, greedy> g;
    CHECK_THROWS_WITH_AS(g.pack(dropit::host, x),
                         "dropit: pack: the policy keeps 5001 of 5000 elements", dropit::error);
    CHECK(g.empty());
  }
}
