// Policies: kept counts, keys, gamma validation, and the policy_for concept.
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <limits>

using namespace dropit_test;

TEST_CASE("kept count follows k = n - floor(n * gamma + 1e-6)") {
  const double gammas[] = {0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1.0};
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 10u, 31u, 100u, 1000u, 1048583u}) {
    for (double g : gammas) {
      CAPTURE(n);
      CAPTURE(g);
      CHECK(dropit::MinK<>{g}.kept(n) == expected_k(n, g));
      CHECK(dropit::Random<>{g, 1}.kept(n) == expected_k(n, g));
    }
  }
  // The epsilon gives the count a person expects for decimal gammas.
  CHECK(dropit::MinK<0.9>{}.kept(10) == 1);
  CHECK(dropit::MinK<0.7>{}.kept(10) == 3);
  CHECK(dropit::MinK<0.3>{}.kept(10) == 7);
  CHECK(dropit::MinK<1.0>{}.kept(1000) == 0);
  CHECK(dropit::MinK<0.0>{}.kept(1000) == 1000);
  CHECK(dropit::Identity{}.kept(12345) == 12345);
  // Compile-time and runtime gamma agree.
  for (std::size_t n = 0; n < 300; ++n) {
    CHECK(dropit::MinK<0.9>{}.kept(n) == dropit::MinK<>{0.9}.kept(n));
    CHECK(dropit::Random<0.5>{3}.kept(n) == dropit::Random<>{0.5, 3}.kept(n));
  }
}

TEST_CASE("runtime gamma outside [0, 1] or NaN throws dropit::error naming the value") {
  const double bad[] = {-0.1,
                        1.5,
                        -1e-9,
                        1.0000001,
                        std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity()};
  for (double g : bad) {
    CAPTURE(g);
    CHECK_THROWS_AS(dropit::MinK<>{g}, dropit::error);
    CHECK_THROWS_AS((dropit::Random<>{g, 0}), dropit::error);
  }
  CHECK_THROWS_WITH(dropit::MinK<>{1.5}, "dropit: MinK: gamma must be in [0, 1], got 1.5");
  CHECK_THROWS_WITH((dropit::Random<>{-0.25, 9}),
                    "dropit: Random: gamma must be in [0, 1], got -0.25");
  CHECK_THROWS_WITH(dropit::MinK<>{std::numeric_limits<double>::quiet_NaN()},
                    "dropit: MinK: gamma must be in [0, 1], got nan");
  CHECK_NOTHROW(dropit::MinK<>{0.0});
  CHECK_NOTHROW(dropit::MinK<>{1.0});
}

TEST_CASE_TEMPLATE("MinK key orders elements by magnitude; NaN above Inf; -0 equals +0", T,
                   DROPIT_TEST_TYPES) {
  const dropit::MinK<0.9> p;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Magnitude order over a ladder of values that are exact in every type.
  const double ladder[] = {0.0, 1.0 / 1024, 0.25, 0.5, 1.0, 1.5, 2.0, 100.0, 1024.0, inf};
  for (std::size_t a = 0; a + 1 < std::size(ladder); ++a) {
    for (double sa : {1.0, -1.0}) {
      for (double sb : {1.0, -1.0}) {
        CAPTURE(ladder[a]);
        CHECK(p.key(from_double<T>(sa * ladder[a]), 0) <
              p.key(from_double<T>(sb * ladder[a + 1]), 0));
      }
    }
  }
  CHECK(p.key(from_double<T>(-0.0), 0) == p.key(from_double<T>(0.0), 0));
  CHECK(p.key(from_double<T>(-3.0), 0) == p.key(from_double<T>(3.0), 0));
  CHECK(p.key(from_double<T>(nan), 0) > p.key(from_double<T>(inf), 0));
  CHECK(p.key(from_double<T>(-nan), 0) == p.key(from_double<T>(nan), 0));
  // The smallest denormal ranks above zero and below the smallest normal.
  const T denorm = smallest_denormal<T>();
  CHECK(to_double(denorm) > 0.0);
  CHECK(p.key(denorm, 0) > p.key(from_double<T>(0.0), 0));
  CHECK(p.key(denorm, 0) < p.key(smallest_normal<T>(), 0));
  // The key does not depend on the index.
  CHECK(p.key(from_double<T>(2.5), 0) == p.key(from_double<T>(2.5), 12345));
}

TEST_CASE("Random key depends on (seed, index) only") {
  const dropit::Random<> a{0.5, 42};
  const dropit::Random<> b{0.5, 42};
  const dropit::Random<> c{0.5, 43};
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 1000; ++i) {
    CHECK(a.key(1.0f, i) == b.key(-7.0f, i));
    CHECK(a.key(1.0f, i) == a.key(2.0, i));
    differ += a.key(1.0f, i) != c.key(1.0f, i);
  }
  CHECK(differ > 990);
  dropit::Random<> d{0.5, 1};
  d.set_seed(42);
  CHECK(d.seed() == 42);
  CHECK(d.key(0.0f, 77) == a.key(0.0f, 77));
}

TEST_CASE("Random's unbiased scaling is n / k, off by default") {
  CHECK(dropit::Random<>{0.9, 1}.restore_scale(100, 10) == 1.0);
  CHECK(dropit::Random<>{0.9, 1, dropit::scaling::unbiased}.restore_scale(100, 10) == 10.0);
  CHECK(dropit::Random<0.75>{1, dropit::scaling::unbiased}.restore_scale(8, 2) == 4.0);
  CHECK(dropit::Random<>{1.0, 1, dropit::scaling::unbiased}.restore_scale(8, 0) == 1.0);
}

namespace {
/// A user's own policy: keep the largest signed values (not magnitudes).
struct keep_largest_signed {
  double gamma = 0.5;
  [[nodiscard]] std::size_t kept(std::size_t n) const { return dropit::MinK<>{gamma}.kept(n); }
  [[nodiscard]] std::uint32_t key(float x, std::size_t) const noexcept {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // order-preserving float -> unsigned
  }
};
struct not_a_policy {
  int kept(std::size_t) const { return 0; }
};
/// A key that may throw: rejected (keys run on worker threads and in device kernels).
struct throwing_key {
  [[nodiscard]] std::size_t kept(std::size_t n) const { return n; }
  [[nodiscard]] std::uint32_t key(float, std::size_t) const { return 0; }
};
}  // namespace

TEST_CASE("the policy_for concept accepts the built-in policies and a user's own") {
  static_assert(dropit::policy_for<dropit::MinK<0.9>, float>);
#if DROPIT_HAS_HALF
  static_assert(dropit::policy_for<dropit::MinK<>, __half>);
  static_assert(dropit::policy_for<dropit::Random<0.9>, __nv_bfloat16>);
#endif
  static_assert(dropit::policy_for<dropit::Random<>, double>);
  static_assert(dropit::policy_for<dropit::Identity, float>);
  static_assert(dropit::policy_for<keep_largest_signed, float>);
  static_assert(!dropit::policy_for<not_a_policy, float>);
  static_assert(!dropit::policy_for<throwing_key, float>);
  static_assert(!dropit::policy_for<dropit::MinK<0.9>, int>);
  static_assert(dropit::has_restore_scale<dropit::Random<>>);
  static_assert(!dropit::has_restore_scale<dropit::MinK<>>);

  // The cache runs the user's policy: keep the largest signed half of the values.
  std::vector<float> x = {-5.0f, 3.0f, -1.0f, 4.0f, 0.5f, -2.0f, 8.0f, 1.0f};
  dropit::SparseCache<float, keep_largest_signed> cache{keep_largest_signed{0.5}};
  cache.pack(dropit::host, x);
  std::vector<float> out(x.size());
  cache.restore(dropit::host, std::span<float>(out));
  CHECK(out == std::vector<float>{0.0f, 3.0f, 0.0f, 4.0f, 0.0f, 0.0f, 8.0f, 1.0f});
}
