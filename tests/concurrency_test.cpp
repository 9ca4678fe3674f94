// The host executor under concurrency: many caches packed at once, nested packs, concurrent
// restores of one cache, and the worker pool's start, growth and shutdown. Run in every pass and,
// in scripts/test, under ThreadSanitizer (the std::thread pool; OpenMP is not instrumented).
#include <dropit/dropit.hpp>

#include "test_support.hpp"
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <span>
#include <thread>
#include <vector>

using namespace dropit_test;

namespace {

using mink = dropit::SparseCache<float, dropit::MinK<0.9>>;

/// An input above the parallel threshold and the dense tensor DropIT's rule restores from it.
struct input {
  std::vector<float> x;
  std::vector<float> dense;
};

input make_input(std::uint64_t seed) {
  input in;
  in.x = normal_values<float>(dropit::host_executor::parallel_threshold + 4099, seed);
  const std::span<const float> xs(in.x);
  in.dense = dense_from(xs, oracle_mink(xs, expected_k(xs.size(), 0.9)));
  return in;
}

bool restores_to(const mink& cache, const std::vector<float>& dense, unsigned threads) {
  std::vector<float> out(dense.size(), 1.0f);
  cache.restore(dropit::host_executor{.threads = threads, .adaptive = false},
                std::span<float>(out));
  return same_bits(std::span<const float>(out), std::span<const float>(dense));
}

}  // namespace

TEST_CASE("concurrency: many caches packed at once, each equal to the oracle") {
  std::vector<input> inputs;
  for (std::uint64_t s = 0; s < 4; ++s)
    inputs.push_back(make_input(100 + s));
  std::atomic<int> wrong{0};
  {
    std::vector<std::jthread> callers;
    for (unsigned c = 0; c < 6; ++c) {
      callers.emplace_back([&, c] {
        for (unsigned r = 0; r < 3; ++r) {
          const input& in = inputs[(c + r) % inputs.size()];
          mink cache;
          cache.pack(dropit::host_executor{.threads = 1 + (c + r) % 3, .adaptive = false},
                     std::span<const float>(in.x));
          if (!restores_to(cache, in.dense, 2)) ++wrong;
        }
      });
    }
  }
  CHECK(wrong.load() == 0);
}

TEST_CASE("concurrency: packs and restores nested in a parallel_for body") {
  const input in = make_input(7);
  std::atomic<int> wrong{0};
  dropit::detail::parallel_for(3, 6, [&](std::size_t b, std::size_t e, unsigned) {
    for (std::size_t i = b; i < e; ++i) {
      mink cache;
      cache.pack(dropit::host_executor{.threads = 2, .adaptive = false},
                 std::span<const float>(in.x));
      if (!restores_to(cache, in.dense, 2)) ++wrong;
    }
  });
  CHECK(wrong.load() == 0);
}

TEST_CASE("concurrency: one cache restored by many threads at once") {
  const input in = make_input(11);
  mink cache;
  cache.pack(dropit::host_executor{.threads = 2, .adaptive = false}, std::span<const float>(in.x));
  std::atomic<int> wrong{0};
  {
    std::vector<std::jthread> readers;
    for (unsigned c = 0; c < 6; ++c)
      readers.emplace_back([&, c] {
        for (int r = 0; r < 3; ++r)
          if (!restores_to(cache, in.dense, 1 + c % 3)) ++wrong;
      });
  }
  CHECK(wrong.load() == 0);
}

TEST_CASE("concurrency: a worker pool starts, grows, runs jobs from several threads, and stops") {
  for (int life = 0; life < 8; ++life) {
    dropit::detail::thread_pool pool;
    std::vector<std::atomic<int>> hits(4096);
    struct job {
      std::vector<std::atomic<int>>* hits;
    } ctx{&hits};
    auto fn = [](void* p, std::size_t chunk, unsigned) {
      auto& h = *static_cast<job*>(p)->hits;
      for (std::size_t i = chunk * 64; i < (chunk + 1) * 64; ++i)
        h[i].fetch_add(1, std::memory_order_relaxed);
    };
    std::atomic<int> ran{0};
    {
      // Callers race for the pool: a caller that finds it busy runs nothing and says so.
      std::vector<std::jthread> callers;
      for (unsigned c = 0; c < 3; ++c)
        callers.emplace_back([&, c] {
          for (unsigned r = 0; r < 4; ++r)
            if (pool.try_run(2 + (c + r + static_cast<unsigned>(life)) % 3, 64, fn, &ctx)) ++ran;
        });
    }
    CHECK(ran.load() >= 1);
    bool every = true;
    for (auto& h : hits)
      every = every && h.load() == ran.load();
    CHECK(every);  // each job covered every item once
    pool.prewake(4);
  }  // ~thread_pool stops and joins its workers, some asleep, some just woken
}
