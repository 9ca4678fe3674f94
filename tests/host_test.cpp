// The host executor's selection paths (sampled guess that hits, guess that misses or overflows,
// forced fallback, one-key ranges) and its fork-join, against the brute-force oracle: every
// payload must equal, byte for byte, the payload built here from the oracle's kept indices.
// Built twice: as part of core_test (std::thread pool) and, when OpenMP is found, as
// host_omp_test (the OpenMP path).
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory_resource>
#include <thread>

using namespace dropit_test;
using dropit::detail::host_select_report;
using dropit::detail::host_select_tuning;
using dropit::detail::path_candidates;
using dropit::detail::path_fallback;
using dropit::detail::path_single_key;

namespace {

/// The payload the format description gives for x with the given kept indices (ascending).
template <class T>
std::vector<std::byte> expected_payload(std::span<const T> x,
                                        const std::vector<std::size_t>& kept) {
  const std::size_t n = x.size();
  const auto l = dropit::make_layout(n, kept.size(), sizeof(T));
  std::vector<std::byte> b(l.total_bytes, std::byte{0});
  for (std::size_t j = 0; j < kept.size(); ++j)
    std::memcpy(b.data() + l.values_offset + j * sizeof(T), &x[kept[j]], sizeof(T));
  auto put = [&](std::size_t at, auto v) { std::memcpy(b.data() + at, &v, sizeof v); };
  switch (l.positions) {
    case dropit::position_encoding::bitmask: {
      std::vector<std::uint32_t> words(l.words(), 0);
      for (std::size_t i : kept)
        words[i / 32] |= std::uint32_t{1} << (i % 32);
      for (std::size_t w = 0; w < words.size(); ++w)
        put(l.positions_offset + 4 * w, words[w]);
      std::size_t j = 0;
      for (std::size_t blk = 0; blk < l.blocks(); ++blk) {
        while (j < kept.size() && kept[j] < blk * 1024)
          ++j;
        if (l.wide()) {
          put(l.block_offsets_offset + 8 * blk, static_cast<std::uint64_t>(j));
        } else {
          put(l.block_offsets_offset + 4 * blk, static_cast<std::uint32_t>(j));
        }
      }
      break;
    }
    case dropit::position_encoding::elias_fano: {
      const ef_oracle_code c = elias_fano_oracle(n, kept);
      CHECK(l.low_bits == c.l);
      for (std::size_t w = 0; w < c.low.size(); ++w)
        put(l.positions_offset + 8 * w, c.low[w]);
      for (std::size_t w = 0; w < c.high.size(); ++w)
        put(l.high_offset + 8 * w, c.high[w]);
      for (std::size_t blk = 0; blk < c.block_counts.size(); ++blk) {
        if (l.wide()) {
          put(l.block_offsets_offset + 8 * blk, static_cast<std::uint64_t>(c.block_counts[blk]));
        } else {
          put(l.block_offsets_offset + 4 * blk, static_cast<std::uint32_t>(c.block_counts[blk]));
        }
      }
      break;
    }
    case dropit::position_encoding::index32:
      for (std::size_t j = 0; j < kept.size(); ++j)
        put(l.positions_offset + 4 * j, static_cast<std::uint32_t>(kept[j]));
      break;
    case dropit::position_encoding::index64:
      for (std::size_t j = 0; j < kept.size(); ++j)
        put(l.positions_offset + 8 * j, static_cast<std::uint64_t>(kept[j]));
      break;
    case dropit::position_encoding::none:
      break;
  }
  return b;
}

/// Packs through the host driver with the given knobs; returns the payload bytes and the path.
template <class T, class P>
std::pair<std::vector<std::byte>, host_select_report> tuned_pack(const P& policy,
                                                                 std::span<const T> x,
                                                                 unsigned threads,
                                                                 const host_select_tuning& t) {
  const auto layout = dropit::make_layout(x.size(), policy.kept(x.size()), sizeof(T));
  host_select_report report;
  report.samples = std::numeric_limits<std::size_t>::max();  // untouched unless a selection ran
  const auto p = dropit::detail::host_pack(policy, x.data(), layout, threads,
                                           std::pmr::new_delete_resource(), t, &report);
  return {std::vector<std::byte>(p.data(), p.data() + p.bytes()), report};
}

/// Checks one pack against the oracle; returns the path it took.
template <class T, class P>
int check_pack(const P& policy, std::span<const T> x, unsigned threads,
               const host_select_tuning& t = {}) {
  const std::size_t k = policy.kept(x.size());
  const auto [bytes, report] = tuned_pack<T>(policy, x, threads, t);
  CHECK(bytes == expected_payload<T>(x, oracle_by_key<T>(policy, x, k)));
  return report.path;
}

/// Inputs with the threshold among many equal keys: values from a small set.
template <class T>
std::vector<T> few_values(std::size_t n, int distinct, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> x(n);
  for (auto& v : x)
    v = from_double<T>(static_cast<double>(static_cast<int>(gen() % distinct)) - distinct / 2);
  return x;
}

}  // namespace

TEST_CASE_TEMPLATE("host selection: the sampled guess hits on normal data, every encoding", T,
                   DROPIT_TEST_TYPES) {
  for (std::size_t n : {std::size_t{5000}, std::size_t{40000}, (std::size_t{1} << 18) + 3}) {
    const auto x = normal_values<T>(n, 11 + n);
    // bitmask, Elias-Fano, Elias-Fano, index list
    for (double g : {0.5, 0.9, 0.99, 0.9999}) {
      for (unsigned threads : {1u, 2u}) {
        CAPTURE(n);
        CAPTURE(g);
        CAPTURE(threads);
        // half types round Normal(0, 1) to few values: the range can be a single key there.
        const auto m = check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads);
        if (sizeof(T) >= 4) CHECK(m == path_candidates);
        const auto r = check_pack<T>(dropit::Random<>{g, 3}, std::span<const T>(x), threads);
        CHECK(r == path_candidates);
      }
    }
  }
}

TEST_CASE_TEMPLATE("host selection: the forced fallback gives the same bytes", T,
                   DROPIT_TEST_TYPES) {
  const host_select_tuning forced{.force_fallback = true};
  for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1025}, std::size_t{70001}}) {
    const auto x = normal_values<T>(n, 5 + n);
    for (double g : {0.1, 0.5, 0.9, 0.99}) {
      for (unsigned threads : {1u, 2u}) {
        CAPTURE(n);
        CAPTURE(g);
        CAPTURE(threads);
        const std::size_t k = dropit::MinK<>{g}.kept(n);
        const auto m = check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads, forced);
        const auto r =
            check_pack<T>(dropit::Random<>{g, 9}, std::span<const T>(x), threads, forced);
        if (k > 0 && k < n) {
          CHECK(m == path_fallback);
          CHECK(r == path_fallback);
        }
      }
    }
  }
}

TEST_CASE("host selection: a guess that misses or overflows falls back, exactly") {
  // A tiny sample with no margin brackets the k-th key only by luck: across seeds, some guesses
  // miss (the k-th key outside [lo, hi]) and take the fallback, the others hit.
  const host_select_tuning narrow{.sample = 16, .margin = 0.0};
  int fallbacks = 0, hits = 0;
  for (std::uint64_t seed = 0; seed < 24; ++seed) {
    const auto x = normal_values<float>(20000 + seed * 97, seed);
    CAPTURE(seed);
    const auto p = check_pack<float>(dropit::MinK<0.9>{}, std::span<const float>(x), 2, narrow);
    fallbacks += p == path_fallback;
    hits += p == path_candidates;
  }
  CHECK(fallbacks > 0);
  CHECK(hits > 0);

  // One candidate slot per worker: the count pass overflows and the selection falls back.
  const auto x = normal_values<float>(50000, 1);
  for (unsigned threads : {1u, 2u}) {
    for (double g : {0.5, 0.9, 0.99}) {
      const auto [bytes, report] =
          tuned_pack<float>(dropit::MinK<>{g}, std::span<const float>(x), threads, {.capacity = 1});
      CHECK(report.overflow);
      CHECK(report.path == path_fallback);
      CHECK(bytes ==
            expected_payload<float>(x, oracle_mink<float>(x, dropit::MinK<>{g}.kept(x.size()))));
    }
  }
}

TEST_CASE_TEMPLATE("host selection: heavy ties at the threshold, all-equal, NaN and Inf", T,
                   DROPIT_TEST_TYPES) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // The largest size is above the executor's parallel threshold (2 threads are used).
  for (std::size_t n : {std::size_t{4097}, std::size_t{65537}, std::size_t{140000}}) {
    CAPTURE(n);
    std::vector<std::pair<const char*, std::vector<T>>> inputs;
    inputs.emplace_back("five values", few_values<T>(n, 5, n));
    inputs.emplace_back("two values", few_values<T>(n, 2, n + 1));
    inputs.emplace_back("all equal", std::vector<T>(n, from_double<T>(-2.5)));
    std::vector<T> special = normal_values<T>(n, n + 2);
    for (std::size_t i = 0; i < n; i += 7)
      special[i] = from_double<T>(i % 3 == 0 ? nan : (i % 3 == 1 ? inf : -inf));
    inputs.emplace_back("nan and inf", special);
    std::vector<T> zeros = normal_values<T>(n, n + 3);
    for (std::size_t i = 0; i < n; ++i) {
      if (i % 5 < 3) zeros[i] = from_double<T>(i % 2 ? 0.0 : -0.0);  // post-ReLU-like
    }
    inputs.emplace_back("60% zeros", zeros);
    for (const auto& [name, x] : inputs) {
      for (double g : {0.3, 0.5, 0.9, 0.99}) {
        for (unsigned threads : {1u, 2u}) {
          CAPTURE(name);
          CAPTURE(g);
          CAPTURE(threads);
          (void)check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads);
          (void)check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads,
                              {.force_fallback = true});
        }
      }
    }
  }
}

/// Hands out its first allocation, then fails every later one: the payload is served, the
/// count pass's stage is not.
/// Supplies the first `supplied` allocations (the payload, and the bitmask an Elias-Fano code is
/// made from), then fails.
class first_only_resource : public std::pmr::memory_resource {
 public:
  explicit first_only_resource(int supplied) : supplied_(supplied) {}

 private:
  int supplied_;
  int calls_ = 0;
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    if (calls_++ >= supplied_) throw std::bad_alloc();
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }
};

TEST_CASE_TEMPLATE("host selection: the count pass stages the kept values, every way a stage ends",
                   T, DROPIT_TEST_TYPES) {
  using dropit::detail::staging_mode;
  for (std::size_t n : {std::size_t{40000}, (std::size_t{1} << 18) + 3}) {
    const auto x = normal_values<T>(n, 3 + n);
    const std::size_t blocks = (n + 1023) / 1024;
    for (unsigned threads : {1u, 2u}) {
      CAPTURE(n);
      CAPTURE(threads);
      auto run = [&](const auto& policy, const host_select_tuning& t) {
        const std::size_t k = policy.kept(n);
        const auto [bytes, report] = tuned_pack<T>(policy, std::span<const T>(x), threads, t);
        CHECK(bytes == expected_payload<T>(x, oracle_by_key<T>(policy, x, k)));
        return report;
      };
      // gamma = 0.9, x taken as larger than the cache: every block is staged (the compact step
      // never reads x). x in the cache (these sizes, by default): nothing is staged.
      const host_select_tuning large{.stage_min_bytes = 1};
      CHECK(run(dropit::MinK<>{0.9}, {}).staged_blocks == 0);
      for (const bool random : {false, true}) {
        CAPTURE(random);
        const auto r =
            random ? run(dropit::Random<>{0.9, 5}, large) : run(dropit::MinK<>{0.9}, large);
        if (r.path == path_candidates) {
          CHECK(r.staged_blocks == blocks);
        } else {
          CHECK(sizeof(T) == 2);  // half types round Normal(0, 1) to few values: a one-key range
          CHECK(r.staged_blocks == 0);
        }
      }
      // Off: nothing staged, the same bytes.
      CHECK(run(dropit::MinK<>{0.9}, {.staging = staging_mode::never}).staged_blocks == 0);
      // gamma = 0.5: staging half of x does not pay, unless asked for.
      CHECK(run(dropit::Random<>{0.5, 2}, large).staged_blocks == 0);
      CHECK(run(dropit::Random<>{0.5, 2}, {.staging = staging_mode::always}).staged_blocks ==
            blocks);
      // A stage too small for every block: the blocks without a slab are read from x again.
      if (n > 100000) {
        const auto r = run(dropit::Random<>{0.9, 8}, {.stage_capacity = 1, .stage_min_bytes = 1});
        CHECK(r.staged_blocks > 0);
        CHECK(r.staged_blocks < blocks);
      }
      // Ties at the threshold among the staged candidates (some dropped, some kept).
      const auto ties = few_values<T>(n, 64, n + 9);
      const std::size_t k = dropit::MinK<0.9>{}.kept(n);
      const auto [tb, tr] = tuned_pack<T>(dropit::MinK<0.9>{}, std::span<const T>(ties), threads,
                                          {.margin = 8.0, .staging = staging_mode::always});
      CHECK(tb == expected_payload<T>(ties, oracle_mink<T>(ties, k)));
      // The index list (gamma = 0.9999) has no stage: its compact step reads only kept elements.
      CHECK(dropit::make_layout(n, dropit::MinK<>{0.9999}.kept(n), sizeof(T)).positions ==
            dropit::position_encoding::index32);
      CHECK(run(dropit::MinK<>{0.9999}, {.staging = staging_mode::always}).staged_blocks == 0);
    }
  }
  // A memory resource that cannot supply the stage: the pack is complete, only unstaged.
  const auto x = normal_values<T>(50000, 12);
  const dropit::MinK<0.9> policy;
  const auto layout = dropit::make_layout(x.size(), policy.kept(x.size()), sizeof(T));
  first_only_resource mr(layout.positions == dropit::position_encoding::elias_fano ? 2 : 1);
  host_select_report report;
  const auto p = dropit::detail::host_pack(policy, x.data(), layout, 2, &mr,
                                           {.staging = staging_mode::always}, &report);
  CHECK(report.staged_blocks == 0);
  CHECK(std::vector<std::byte>(p.data(), p.data() + p.bytes()) ==
        expected_payload<T>(x, oracle_mink<T>(x, layout.k)));
}

TEST_CASE("host selection: every path is reached") {
  // all equal: the sampled range is one key (lo == hi), resolved from per-block tie counts
  const std::vector<float> same(100000, 1.0f);
  CHECK(check_pack<float>(dropit::MinK<0.9>{}, std::span<const float>(same), 2) == path_single_key);
  // small inputs are sampled whole: the range is exactly the k-th key
  const auto small = normal_values<float>(3000, 4);
  CHECK(check_pack<float>(dropit::MinK<0.9>{}, std::span<const float>(small), 1) ==
        path_single_key);
  // the threshold among many ties, resolved from the candidates with a cut
  const auto ties = few_values<float>(200000, 64, 5);
  CHECK(check_pack<float>(dropit::MinK<0.9>{}, std::span<const float>(ties), 2, {.margin = 8.0}) ==
        path_candidates);
}

TEST_CASE_TEMPLATE("host selection: the shared steps that work and the passes over x", T,
                   DROPIT_TEST_TYPES) {
  // The host runs detail/selection.hpp's sequence as the device does, and counts the same way:
  // a step's bit when it works, a pass for every step that reads all of x.
  using namespace dropit::detail;
  using dropit::detail::staging_mode;
  using Key = key_type_t<dropit::MinK<>, T>;
  constexpr unsigned hit = step_sample | step_count | step_resolve | step_compact;
  constexpr unsigned one_key = step_sample | step_count | step_compact;
  constexpr unsigned miss = step_sample | step_count | step_radix | step_compact;
  const std::size_t n = std::size_t{1} << 18;
  const auto x = normal_values<T>(n, 21);
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    auto run = [&](double g, const host_select_tuning& t) {
      const auto [bytes, report] =
          tuned_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads, t);
      CHECK(bytes == expected_payload<T>(x, oracle_mink<T>(x, dropit::MinK<>{g}.kept(n))));
      return report;
    };
    // A hit with every block staged: x is read once (the count pass).
    const auto staged = run(0.9, {.stage_min_bytes = 1});
    if (staged.path == path_candidates) {
      CHECK(staged.worked == hit);
      CHECK(staged.x_passes == 1);
    } else {  // half types round Normal(0, 1) to few values: the range can be one key
      CHECK(sizeof(T) == 2);
      CHECK(staged.worked == one_key);
      CHECK(staged.x_passes == 2);
    }
    // Unstaged, the compact step reads x again.
    const auto unstaged = run(0.9, {.staging = staging_mode::never});
    CHECK(unstaged.x_passes == 2);
    // The index list (gamma 0.9999) compacts from the collected entries: one pass.
    CHECK(dropit::make_layout(n, dropit::MinK<>{0.9999}.kept(n), sizeof(T)).positions ==
          dropit::position_encoding::index32);
    const auto listed = run(0.9999, {});
    if (listed.path == path_candidates) CHECK(listed.x_passes == 1);
    // The fallback: count, one pass per digit, the per-block tie count, compact.
    const auto forced = run(0.9, {.force_fallback = true});
    CHECK(forced.path == path_fallback);
    CHECK(forced.worked == miss);
    CHECK(forced.x_passes == 3 + static_cast<unsigned>(radix_passes<Key>));
  }
  // One key in the range: no resolve step.
  const std::vector<T> same(100000, from_double<T>(1.0));
  const auto [bytes, report] =
      tuned_pack<T>(dropit::MinK<0.9>{}, std::span<const T>(same), 2, host_select_tuning{});
  CHECK(bytes == expected_payload<T>(same, oracle_mink<T>(same, dropit::MinK<0.9>{}.kept(100000))));
  CHECK(report.path == path_single_key);
  CHECK(report.worked == one_key);
  CHECK(report.x_passes == 2);
}

TEST_CASE_TEMPLATE("host selection: sizes around block boundaries and the parallel threshold", T,
                   float) {
  const std::size_t pt = dropit::host_executor::parallel_threshold;
  for (std::size_t n : {std::size_t{31}, std::size_t{32}, std::size_t{1023}, std::size_t{1024},
                        std::size_t{1025}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                        std::size_t{32 * 1024 + 1}, pt - 1, pt, pt + 1}) {
    const auto x = normal_values<T>(n, 77 + n);
    for (double g : {0.5, 0.9, 0.99}) {
      CAPTURE(n);
      CAPTURE(g);
      std::vector<std::vector<std::byte>> all;
      for (unsigned threads : {1u, 2u, 3u, 8u}) {
        (void)check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads);
        (void)check_pack<T>(dropit::Random<>{g, n}, std::span<const T>(x), threads);
      }
      // Through the executor too (its threshold picks the thread count).
      dropit::SparseCache<T, dropit::MinK<>> c{dropit::MinK<>{g}};
      c.pack(dropit::host_executor{.threads = 2, .adaptive = false}, x);
      const auto b = c.payload();
      CHECK(std::vector<std::byte>(b.begin(), b.end()) ==
            expected_payload<T>(x, oracle_mink<T>(x, c.kept())));
      std::vector<T> out(n);
      c.restore(dropit::host_executor{.threads = 2, .adaptive = false}, std::span<T>(out));
      CHECK(same_bits<T>(out, dense_from<T>(x, oracle_mink<T>(x, c.kept()))));
    }
  }
}

TEST_CASE_TEMPLATE("every instruction set gives the oracle's bytes, packing and restoring", T,
                   DROPIT_TEST_TYPES) {
  using dropit::detail::host_isa;
  const host_isa have = dropit::detail::detect_host_isa();
  auto& cap = dropit::detail::host_isa_cap();
  const int saved = cap.load();
  for (host_isa isa : {host_isa::baseline, host_isa::avx2, host_isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(have)) {
      MESSAGE("instruction set " << static_cast<int>(isa) << " skipped: this CPU lacks it");
      continue;
    }
    cap.store(static_cast<int>(isa));
    for (std::size_t n : {std::size_t{1000}, std::size_t{33000}, std::size_t{70001}}) {
      auto x = normal_values<T>(n, 31 + n);
      for (std::size_t i = 5; i < n; i += 101)
        x[i] = from_double<T>(i % 2 ? std::numeric_limits<double>::quiet_NaN()
                                    : -std::numeric_limits<double>::infinity());
      if (n == 70001) {  // a run of large magnitudes: bitmask words that keep every element
        for (std::size_t i = 20000; i < 24000; ++i)
          x[i] = from_double<T>(to_double(x[i]) * 1000.0);
      }
      // bitmask; Elias-Fano with 1 to 9 low bits (BMI2 encodes 2 to 4 a word at a time, AVX-512
      // VBMI2 64 elements at a time, and BMI2 decodes 1 to 8)
      for (double g : {0.5, 0.8, 0.9, 0.95, 0.99, 0.995, 0.998, 0.999}) {
        for (unsigned threads : {1u, 2u}) {
          CAPTURE(static_cast<int>(isa));
          CAPTURE(n);
          CAPTURE(g);
          CAPTURE(threads);
          (void)check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads);
          (void)check_pack<T>(dropit::Random<>{g, 17}, std::span<const T>(x), threads);
          (void)check_pack<T>(dropit::MinK<>{g}, std::span<const T>(x), threads,
                              {.force_fallback = true});
          // Restore through the same instruction set.
          for (const bool random : {false, true}) {
            const std::size_t k = dropit::MinK<>{g}.kept(n);
            const auto kept =
                random ? oracle_by_key<T>(dropit::Random<>{g, 17}, x, k) : oracle_mink<T>(x, k);
            const auto layout = dropit::make_layout(n, k, sizeof(T));
            const auto p =
                random ? dropit::detail::host_pack(dropit::Random<>{g, 17}, x.data(), layout,
                                                   threads, std::pmr::new_delete_resource())
                       : dropit::detail::host_pack(dropit::MinK<>{g}, x.data(), layout, threads,
                                                   std::pmr::new_delete_resource());
            std::vector<T> out(n, from_double<T>(7.0));
            dropit::detail::host_restore(p, layout, out.data(), 1.0, threads);
            CHECK(same_bits<T>(out, dense_from<T>(x, kept)));
            // With non-temporal stores (what a restore larger than half the last-level cache
            // uses with AVX-512), into a 64-byte aligned output.
            std::vector<T> room(n + 64, from_double<T>(7.0));
            auto* aligned = reinterpret_cast<T*>(
                (reinterpret_cast<std::uintptr_t>(room.data()) + 63) / 64 * 64);
            dropit::detail::host_restore(p, layout, aligned, 1.0, threads, 1);
            CHECK(same_bits<T>(std::vector<T>(aligned, aligned + n), dense_from<T>(x, kept)));
            // Scaled (exactly, by 2) on both paths: equal values, NaN where x kept a NaN.
            const std::vector<T> once = dense_from<T>(x, kept);
            auto doubled = [&](const T* r) {
              for (std::size_t i = 0; i < n; ++i) {
                const double want = 2.0 * to_double(once[i]), got = to_double(r[i]);
                if (!(got == want || (std::isnan(got) && std::isnan(want)))) return false;
              }
              return true;
            };
            dropit::detail::host_restore(p, layout, out.data(), 2.0, threads, 0);
            CHECK(doubled(out.data()));
            dropit::detail::host_restore(p, layout, aligned, 2.0, threads, 1);
            CHECK(doubled(aligned));
          }
        }
      }
    }
  }
  cap.store(saved);
}

TEST_CASE("inputs below the parallel threshold take the single-thread path") {
  const std::size_t pt = dropit::host_executor::parallel_threshold;
  const dropit::host_executor two{.threads = 2};
  CHECK(two.thread_count(pt - 1) == 1);
  CHECK(two.thread_count(pt) == 2);
  CHECK(dropit::host_executor{}.thread_count(pt) == dropit::detail::hardware_threads());
}

TEST_CASE("an adaptive executor forks only when the measured fork-join cost is below the work") {
  using dropit::make_layout;
  using dropit::detail::call_threads;
  using dropit::detail::fork_meter;
  const std::size_t small = std::size_t{1} << 17, large = std::size_t{1} << 24;
  const dropit::host_executor two{.threads = 2};
  const dropit::host_executor fixed{.threads = 2, .adaptive = false};
  // Exact values, positions as a bitmask (gamma 0.5): 4 fork-joins a pack, 1 a restore.
  const auto pack_of = [](std::size_t n) {
    return dropit::detail::pack_cost(make_layout(n, n / 2, 4));
  };
  const auto restore_of = [](std::size_t n) {
    return dropit::detail::restore_cost(make_layout(n, n / 2, 4), 1.0);
  };
  REQUIRE(make_layout(small, small / 2, 4).positions == dropit::position_encoding::bitmask);
  CHECK(pack_of(small).forks == 4);
  CHECK(restore_of(small).forks == 1);
  // Workers that sleep (50 us a fork-join): a pack of 2^17 elements (about 60 us of work, 4
  // fork-joins) stays on the caller, a restore too; 2^24 elements pay for the forks.
  fork_meter::set(50'000);
  CHECK(call_threads(two, small, pack_of(small)) == 1);
  CHECK(call_threads(two, small, restore_of(small)) == 1);
  CHECK(call_threads(two, large, pack_of(large)) == 2);
  CHECK(call_threads(two, large, restore_of(large)) == 2);
  CHECK(call_threads(fixed, small, pack_of(small)) == 2);
  CHECK(call_threads(two, small - 1, pack_of(small - 1)) == 1);  // below the threshold
  // Spinning workers (half a microsecond): 2^17 elements are worth two threads.
  fork_meter::set(500);
  CHECK(call_threads(two, small, pack_of(small)) == 2);
  CHECK(call_threads(two, small, restore_of(small)) == 2);
  // A run of declined calls forks once every probe_every calls, to measure again.
  fork_meter::set(50'000);
  int forked = 0;
  for (unsigned i = 0; i < 4 * fork_meter::probe_every; ++i)
    forked += call_threads(two, small, pack_of(small)) == 2;
  CHECK(forked == 4);
  // MinK 0.9 with int8 values: the Elias-Fano code and the codec add a fork-join each (6), the
  // coded restore a decode pass (2). At 2^20 elements (about 470 us of work, 236 us saved on two
  // threads) four fork-joins of 50 us pay, six do not.
  const std::size_t mid = std::size_t{1} << 20;
  const auto coded = make_layout(mid, mid / 10, 4, dropit::value_codec::int8);
  REQUIRE(coded.positions == dropit::position_encoding::elias_fano);
  CHECK(dropit::detail::pack_cost(coded).forks == 6);
  CHECK(dropit::detail::restore_cost(coded, 1.0).forks == 2);
  CHECK(dropit::detail::pack_cost(make_layout(mid, mid, 4)).forks == 1);
  const auto dense_int8 = make_layout(mid, mid, 4, dropit::value_codec::int8);
  CHECK(dropit::detail::restore_cost(dense_int8, 1.0).forks == 1);  // decodes into the output
  CHECK(dropit::detail::restore_cost(dense_int8, 2.0).forks == 2);  // then scales it
  fork_meter::set(50'000);
  CHECK(call_threads(two, mid, pack_of(mid)) == 2);
  CHECK(call_threads(two, mid, dropit::detail::pack_cost(coded)) == 1);

  // The pack and restore that stay on the caller fork nothing, and give the same bytes.
  const auto x = normal_values<float>(small, 3);
  dropit::SparseCache<float, dropit::MinK<0.9>> a, b;
  fork_meter::set(50'000);
  const auto before = fork_meter::samples();
  a.pack(two, std::span<const float>(x));
  std::vector<float> out_a(small), out_b(small);
  a.restore(two, std::span<float>(out_a));
  CHECK(fork_meter::samples() == before);
  b.pack(fixed, std::span<const float>(x));
  b.restore(fixed, std::span<float>(out_b));
  CHECK(fork_meter::samples() >= before + 5);  // 4 in the pack, 1 in the restore
  CHECK(std::ranges::equal(a.payload(), b.payload()));
  CHECK(same_bits<float>(out_a, out_b));
}

TEST_CASE("parallel_for measures each fork-join's overhead: wall time less busy time / threads") {
  using dropit::detail::fork_meter;
  fork_meter::set(0, true);
  // Two chunks, one of which sleeps 2 ms: whoever runs it, the other thread idles for it, so the
  // overhead is about 1 ms (clipped to max_sample_ns); the first sample is the estimate.
  dropit::detail::parallel_for(2, 2, [](std::size_t b, std::size_t, unsigned) {
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  CHECK(fork_meter::samples() == 1);
  CHECK(fork_meter::overhead_ns() == fork_meter::max_sample_ns);
  // Later samples move the estimate by 1/8 of the difference.
  fork_meter::record(0);
  CHECK(fork_meter::overhead_ns() == fork_meter::max_sample_ns - fork_meter::max_sample_ns / 8);
  fork_meter::set(0, true);
}

TEST_CASE("parallel_for covers every item once, for any thread and item count") {
  for (unsigned threads : {1u, 2u, 3u, 5u, 16u}) {
    for (std::size_t items : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7},
                              std::size_t{100}, std::size_t{100003}}) {
      CAPTURE(threads);
      CAPTURE(items);
      std::vector<std::atomic<int>> seen(items);
      std::atomic<bool> bad_worker{false};
      dropit::detail::parallel_for(threads, items, [&](std::size_t b, std::size_t e, unsigned t) {
        if (t >= threads || b > e || e > items) bad_worker = true;
        for (std::size_t i = b; i < e; ++i)
          seen[i].fetch_add(1);
      });
      CHECK_FALSE(bad_worker.load());
      bool once = true;
      for (auto& s : seen)
        once = once && s.load() == 1;
      CHECK(once);
    }
  }
}

TEST_CASE("packs from concurrent threads and nested calls give the same bytes") {
  const auto x = normal_values<float>(300000, 8);
  const auto want =
      expected_payload<float>(x, oracle_mink<float>(x, dropit::MinK<0.9>{}.kept(x.size())));
  // Concurrent callers: one holds the pool, the others run on threads of their own.
  std::vector<std::jthread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 5; ++r) {
        dropit::SparseCache<float, dropit::MinK<0.9>> cache;
        cache.pack(dropit::host_executor{.threads = 2, .adaptive = false}, x);
        if (!std::ranges::equal(cache.payload(), want)) ++wrong;
      }
    });
  }
  callers.clear();
  CHECK(wrong.load() == 0);
  // Nested: a pack inside a parallel_for body.
  dropit::detail::parallel_for(2, 4, [&](std::size_t b, std::size_t e, unsigned) {
    for (std::size_t i = b; i < e; ++i) {
      dropit::SparseCache<float, dropit::MinK<0.9>> cache;
      cache.pack(dropit::host_executor{.threads = 2, .adaptive = false}, x);
      if (!std::ranges::equal(cache.payload(), want)) ++wrong;
    }
  });
  CHECK(wrong.load() == 0);
}
