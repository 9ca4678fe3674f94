/**
 * @file parallel.hpp
 * @brief Fork-join over contiguous ranges: OpenMP when the user compiles with it, else std::thread.
 */
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dropit::detail {

/// Hardware threads, at least 1.
[[nodiscard]] inline unsigned hardware_threads() noexcept {
  const unsigned h = std::thread::hardware_concurrency();
  return h == 0 ? 1 : h;
}

/// The part of [0, items) that worker `t` of `parts` owns: contiguous, sizes differing by <= 1.
struct range {
  std::size_t begin;
  std::size_t end;
};
[[nodiscard]] constexpr range split(std::size_t items, unsigned parts, unsigned t) noexcept {
  const std::size_t q = items / parts;
  const std::size_t r = items % parts;
  const std::size_t begin = t * q + (t < r ? t : r);
  return {begin, begin + q + (t < r ? 1 : 0)};
}

/**
 * Calls `f(begin, end, t)` for t in [0, threads) on `threads` workers (the caller is one of them),
 * with [begin, end) the t-th contiguous part of [0, items). Returns when every call has returned.
 * `f` must not throw. Fewer workers run when items < threads.
 */
template <class F>
void parallel_for(unsigned threads, std::size_t items, F&& f) {
  if (items < threads) threads = static_cast<unsigned>(items);
  if (threads <= 1) {
    if (items > 0) f(std::size_t{0}, items, 0u);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    const auto parts = static_cast<unsigned>(omp_get_num_threads());
    const auto t = static_cast<unsigned>(omp_get_thread_num());
    const range r = split(items, parts, t);
    f(r.begin, r.end, t);
  }
#else
  std::vector<std::jthread> workers;
  workers.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    workers.emplace_back([&f, items, threads, t] {
      const range r = split(items, threads, t);
      f(r.begin, r.end, t);
    });
  }
  const range r = split(items, threads, 0);
  f(r.begin, r.end, 0u);
#endif
}

}  // namespace dropit::detail
