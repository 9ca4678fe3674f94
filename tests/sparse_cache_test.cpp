// SparseCache on the host executor, over every element type x policy, against brute-force oracles:
// the cases every executor shares (executor_cases.inl, here on 1 and 3 threads), then the host's
// own (thread-count independence, Random's statistics, moves, memory resources, bad input).
#include "test_support.hpp"
#include <doctest/doctest.h>

#define DROPIT_EXECUTOR_CASES DROPIT_HOST_CASES
#define DROPIT_EXECUTOR_DECORATOR
#include "executor_cases.inl"

#include <array>
#include <functional>
#include <limits>
#include <map>
#include <memory_resource>
#include <new>
#include <set>

using namespace dropit_test;
using dropit_test::executor_cases::pack_restore;
using on_one_thread = dropit_test::on_host<float, 1>;

namespace {

template <class T, class P>
std::vector<std::byte> payload_bytes(const P& p, std::span<const T> x,
                                     const dropit::host_executor& exec) {
  dropit::SparseCache<T, P> cache{p};
  cache.pack(exec, x);
  const auto bytes = cache.payload();
  return {bytes.begin(), bytes.end()};
}

}  // namespace

TEST_CASE_TEMPLATE("payloads do not depend on the thread count", T, DROPIT_TEST_TYPES) {
  const std::size_t n = (std::size_t{1} << 20) + 7;
  const auto x = normal_values<T>(n, 99);
  const dropit::host_executor one{.threads = 1};
  const dropit::host_executor two{.threads = 2, .adaptive = false};
  const dropit::host_executor three{.threads = 3, .adaptive = false};
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
    return nonzero_positions(
        pack_restore<on_one_thread>(dropit::Random<>{0.9, seed}, x, expected_k(n, 0.9)));
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
    const auto kept =
        nonzero_positions(pack_restore<on_one_thread>(dropit::Random<>{0.75, s}, x, 16));
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
    const auto kept =
        nonzero_positions(pack_restore<on_one_thread>(dropit::Random<>{0.75, s + 100000}, x, 16));
    for (std::size_t j = 0; j + 1 < kept.size(); ++j)
      both += kept[j] + 1 == kept[j + 1];
  }
  const double pair_expect = static_cast<double>(seeds) * 63.0 * (16.0 / 64.0) * (15.0 / 63.0);
  CHECK(both > pair_expect * 0.9);
  CHECK(both < pair_expect * 1.1);
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
  const dropit::host_executor exec{.threads = 2, .resource = &mr, .adaptive = false};
  const auto x = normal_values<float>(1 << 20, 4);
  {
    dropit::SparseCache<float, dropit::MinK<0.9>> cache;
    cache.pack(exec, x);
    CHECK(mr.live == cache.bytes());
    // The payload, and the bitmask its Elias-Fano positions are coded from (given back).
    CHECK(cache.layout().positions == dropit::position_encoding::elias_fano);
    CHECK(mr.calls == 2);
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
