/**
 * @file parallel.hpp
 * @brief Fork-join over chunks of an index range: OpenMP when the user compiles with it, else a
 * lazily started pool of persistent std::threads (starting threads per call costs tens of
 * microseconds, more than a whole pack of a few hundred thousand elements).
 *
 * Workers claim chunks from a shared counter instead of owning a fixed part, so a worker that the
 * OS has not scheduled yet (the cores are shared with a training loop, data loaders, a compiler)
 * delays nothing: the threads that run take its chunks, and a call waits only for the chunks
 * already started.
 */
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

/// A hint to the core that this thread is spinning.
inline void spin_pause() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
  __builtin_ia32_pause();
#endif
}

/// Spins for at most `limit` while `a` holds `old`; returns the value last seen.
template <class U>
U spin_while_equal(const std::atomic<U>& a, U old, std::chrono::microseconds limit) noexcept {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (unsigned i = 1;; ++i) {
    const U seen = a.load(std::memory_order_acquire);
    if (seen != old) return seen;
    spin_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return seen;
  }
}

/**
 * Persistent workers for fork-join calls from any thread. One call at a time uses the pool (a
 * call that finds it busy, e.g. a nested or concurrent one, reports so and the caller runs the
 * work another way). Workers start on first use; after a job a worker spins for `spin_time` (so
 * that a pack's consecutive steps start within a microsecond), then sleeps on its own ticket.
 *
 * A job is `chunks` calls `fn(ctx, chunk, worker)`. A chunk is claimed by a compare-and-swap on a
 * word that holds the job's epoch and its next chunk, so a worker that wakes after its job is over
 * claims nothing and never touches the job's context. A job's fields live in one of two slots
 * (by epoch parity): a worker reads the slot of the epoch it saw, and its claim succeeds only if
 * that epoch is still running, so the fields it read were that job's (the next job writes the
 * other slot, and the one after waits for every claimed chunk of this one).
 */
class thread_pool {
 public:
  /// Chunk body: `fn(ctx, chunk, worker)`.
  using chunk_fn = void (*)(void*, std::size_t, unsigned);
  /// How long an idle worker spins before it sleeps, and how long a caller spins for the rest.
  static constexpr std::chrono::microseconds spin_time{50};

  /// The process-wide pool.
  static thread_pool& instance() {
    static thread_pool pool;
    return pool;
  }

  thread_pool() = default;
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& w : workers_) {
      w->ticket.fetch_add(1, std::memory_order_release);
      w->ticket.notify_one();
    }
    workers_.clear();  // joins
  }

  /**
   * Runs the `chunks` chunks of a job on the calling thread (worker 0) and up to `threads - 1`
   * pool workers (1, 2, ...); returns when every chunk has run. Returns false, having run
   * nothing, when another call holds the pool.
   */
  bool try_run(unsigned threads, std::size_t chunks, chunk_fn fn, void* ctx) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    threads = start_workers(threads);
    const std::uint32_t epoch = ++epoch_;
    job_slot& job = jobs_[epoch & 1];
    job.fn.store(fn, std::memory_order_relaxed);
    job.ctx.store(ctx, std::memory_order_relaxed);
    job.chunks.store(chunks, std::memory_order_relaxed);
    job.threads.store(threads, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    state_.store(std::uint64_t{epoch} << 32, std::memory_order_release);
    for (unsigned i = 0; i + 1 < threads; ++i) {
      workers_[i]->ticket.fetch_add(1, std::memory_order_release);
      workers_[i]->ticket.notify_one();
    }
    run_chunks(epoch, fn, ctx, chunks, 0);
    // Only chunks that other workers have claimed can be outstanding: wait for them.
    for (std::size_t seen = done_.load(std::memory_order_acquire); seen != chunks;
         seen = done_.load(std::memory_order_acquire)) {
      seen = spin_while_equal(done_, seen, spin_time);
      if (seen != chunks) done_.wait(seen, std::memory_order_acquire);
    }
    return true;
  }

  /**
   * Wakes the workers a job on `threads` threads would use, without giving them work: a caller
   * that is about to do serial work before its next fork-join hides their wake-up (tens of
   * microseconds from sleep on some machines) behind it. Does nothing if the pool is busy.
   */
  void prewake(unsigned threads) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    threads = start_workers(threads);
    for (unsigned i = 0; i + 1 < threads; ++i) {
      workers_[i]->ticket.fetch_add(1, std::memory_order_release);
      workers_[i]->ticket.notify_one();
    }
  }

 private:
  /// Starts workers until a job on `threads` threads has them; returns how many threads a job
  /// can have (fewer when memory or the OS refuses a thread: the job's chunks go to those that
  /// run, so a job never fails for want of workers).
  unsigned start_workers(unsigned threads) noexcept {
    try {
      if (workers_.size() + 1 < threads) workers_.reserve(threads - 1);
      while (workers_.size() + 1 < threads) {
        auto w = std::make_unique<worker>();
        w->thread = std::jthread(
            [this, id = static_cast<unsigned>(workers_.size()) + 1, p = w.get()] { work(id, *p); });
        workers_.push_back(std::move(w));  // capacity is reserved: cannot throw
      }
    } catch (...) {  // std::bad_alloc, std::system_error: no thread was left half-started
    }
    return std::min<unsigned>(threads, static_cast<unsigned>(workers_.size()) + 1);
  }

  struct worker {
    alignas(64) std::atomic<std::uint32_t> ticket{0};  ///< bumped to wake this worker
    std::jthread thread;
  };
  struct job_slot {
    std::atomic<chunk_fn> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<std::size_t> chunks{0};
    std::atomic<unsigned> threads{0};
  };

  /// Claims and runs chunks of job `epoch` until none is left or the job is over.
  void run_chunks(std::uint32_t epoch, chunk_fn fn, void* ctx, std::size_t chunks, unsigned id) {
    std::uint64_t v = state_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<std::uint32_t>(v >> 32) != epoch) return;
      const std::size_t c = static_cast<std::uint32_t>(v);
      if (c >= chunks) return;
      if (!state_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;
      }
      fn(ctx, c, id);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_one();
      v = state_.load(std::memory_order_acquire);
    }
  }

  void work(unsigned id, worker& self) {
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t now = spin_while_equal(self.ticket, seen, spin_time);
      while (now == seen) {
        self.ticket.wait(seen, std::memory_order_acquire);
        now = self.ticket.load(std::memory_order_acquire);
      }
      seen = now;
      if (stop_.load(std::memory_order_relaxed)) return;
      // The fields are those of the epoch read here, or every claim below fails.
      const auto epoch = static_cast<std::uint32_t>(state_.load(std::memory_order_acquire) >> 32);
      const job_slot& job = jobs_[epoch & 1];
      if (id >= job.threads.load(std::memory_order_relaxed)) continue;
      run_chunks(epoch, job.fn.load(std::memory_order_relaxed),
                 job.ctx.load(std::memory_order_relaxed),
                 job.chunks.load(std::memory_order_relaxed), id);
    }
  }

  std::mutex mutex_;  ///< held by the call that uses the pool
  std::vector<std::unique_ptr<worker>> workers_;
  std::uint32_t epoch_ = 0;  ///< the last job's epoch (written under mutex_)
  job_slot jobs_[2];
  alignas(64) std::atomic<std::uint64_t> state_{0};  ///< epoch << 32 | next chunk
  alignas(64) std::atomic<std::size_t> done_{0};     ///< chunks finished
  std::atomic<bool> stop_{false};
};

/**
 * What a fork-join costs here and now, measured on the fork-joins themselves: a fork-join's
 * overhead is its wall time less its threads' busy time divided by the thread count (waking the
 * helpers, their start, the join, any imbalance), averaged over recent fork-joins. It ranges from
 * about a microsecond (helpers spinning, e.g. OpenMP's default policy right after another
 * parallel region) to tens of microseconds (helpers asleep on a busy virtual machine, e.g. OpenMP
 * with OMP_WAIT_POLICY=passive in a LibTorch process: mostly the helpers' wake-up before they
 * start, 25-43 us on the 2-core development VM against 9-15 us for the join, measured with a
 * scratch OpenMP program). The executors fork only when the work a call moves to the helpers
 * exceeds what its fork-joins cost (`pays`), so small calls stay on the calling thread where
 * forking is dear.
 */
class fork_meter {
 public:
  /// Samples above this are clipped: a preempted fork says little about the next one.
  static constexpr std::uint64_t max_sample_ns = 200'000;
  /// Calls declined in a row after which one forks anyway, so that the estimate follows the
  /// machine when forking becomes cheap again.
  static constexpr unsigned probe_every = 32;

  /// The current estimate of one fork-join's overhead, ns (0 before the first fork-join).
  [[nodiscard]] static std::uint64_t overhead_ns() noexcept {
    return average().load(std::memory_order_relaxed);
  }
  /// Fork-joins measured so far (tests).
  [[nodiscard]] static std::uint64_t samples() noexcept {
    return count().load(std::memory_order_relaxed);
  }
  /// Adds one fork-join's overhead to the moving average (weight 1/8). Concurrent calls may
  /// lose a sample, never corrupt the estimate.
  static void record(std::uint64_t ns) noexcept {
    ns = std::min(ns, max_sample_ns);
    const std::uint64_t old = average().load(std::memory_order_relaxed);
    const std::uint64_t next =
        count().load(std::memory_order_relaxed) == 0 ? ns : old - old / 8 + ns / 8;
    average().store(next, std::memory_order_relaxed);
    count().fetch_add(1, std::memory_order_relaxed);
  }
  /// Sets the estimate (tests; 0 with `reset_samples` forgets every sample).
  static void set(std::uint64_t ns, bool reset_samples = false) noexcept {
    average().store(ns, std::memory_order_relaxed);
    if (reset_samples) count().store(0, std::memory_order_relaxed);
    declined().store(0, std::memory_order_relaxed);
  }

  /**
   * Whether running `serial_ns` of work on `threads` threads with `forks` fork-joins is faster
   * than running it on the caller alone: forks x overhead < serial_ns x (1 - 1/threads). Every
   * `probe_every`-th call in a row that this declines is accepted, to measure the overhead again.
   */
  [[nodiscard]] static bool pays(unsigned threads, double serial_ns, unsigned forks) noexcept {
    if (threads <= 1) return false;
    const double saved = serial_ns * (1.0 - 1.0 / static_cast<double>(threads));
    if (static_cast<double>(forks) * static_cast<double>(overhead_ns()) < saved) {
      declined().store(0, std::memory_order_relaxed);
      return true;
    }
    if (declined().fetch_add(1, std::memory_order_relaxed) + 1 < probe_every) return false;
    declined().store(0, std::memory_order_relaxed);
    return true;
  }

 private:
  static std::atomic<std::uint64_t>& average() noexcept {
    static std::atomic<std::uint64_t> a{0};
    return a;
  }
  static std::atomic<std::uint64_t>& count() noexcept {
    static std::atomic<std::uint64_t> c{0};
    return c;
  }
  static std::atomic<unsigned>& declined() noexcept {
    static std::atomic<unsigned> d{0};
    return d;
  }
};

/// Nanoseconds on the steady clock.
[[nodiscard]] inline std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Wakes the workers of a coming fork-join over `threads` threads, so that their wake-up overlaps
/// the caller's serial work: the pool's (OpenMP has no call that wakes its threads ahead of a
/// parallel region; under its default policy they spin a while after one).
inline void parallel_prewake(unsigned threads) {
#if !defined(_OPENMP)
  if (threads > 1) thread_pool::instance().prewake(threads);
#else
  (void)threads;
#endif
}

/// Chunks a range of `items` is cut into for `threads` workers: a few per worker, so that
/// workers that start late or run slower take fewer.
[[nodiscard]] constexpr std::size_t chunk_count(std::size_t items, unsigned threads) noexcept {
  const std::size_t most = std::size_t{threads} * 8;
  return items < most ? items : most;
}

/**
 * Calls `f(begin, end, worker)` over chunks that cover [0, items), on up to `threads` workers
 * (the caller is worker 0; `worker < threads`). A worker may run several chunks, in increasing
 * order; which worker runs which chunk is not fixed. Returns when every call has returned. `f`
 * must not throw.
 */
template <class F>
void parallel_for(unsigned threads, std::size_t items, F&& f) {
  if (items < threads) threads = static_cast<unsigned>(items);
  if (threads <= 1) {
    if (items > 0) f(std::size_t{0}, items, 0u);
    return;
  }
  struct context {
    F* f;
    std::size_t items;
    std::size_t chunks;
    std::atomic<std::uint64_t> busy{0};  ///< ns the threads spent in chunks
  } ctx{&f, items, chunk_count(items, threads)};
  auto run = [](void* p, std::size_t c, unsigned worker) {
    auto* x = static_cast<context*>(p);
    const std::size_t begin = c * x->items / x->chunks;
    const std::size_t end = (c + 1) * x->items / x->chunks;
    (*x->f)(begin, end, worker);
  };
  // The fork-join's overhead for fork_meter: wall time less busy time / threads.
  const std::uint64_t start = now_ns();
  auto measure = [&] {
    const std::uint64_t wall = now_ns() - start;
    const std::uint64_t ideal = ctx.busy.load(std::memory_order_relaxed) / threads;
    fork_meter::record(wall > ideal ? wall - ideal : 0);
  };
#if defined(_OPENMP)
  std::atomic<std::size_t> next{0};
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    const auto worker = static_cast<unsigned>(omp_get_thread_num());
    const std::uint64_t t0 = now_ns();
    bool ran = false;
    for (std::size_t c = next.fetch_add(1, std::memory_order_relaxed); c < ctx.chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      run(&ctx, c, worker);
      ran = true;
    }
    if (ran) ctx.busy.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  }
  measure();
#else
  auto timed = [](void* p, std::size_t c, unsigned worker) {
    auto* x = static_cast<context*>(p);
    const std::uint64_t t0 = now_ns();
    const std::size_t begin = c * x->items / x->chunks;
    const std::size_t end = (c + 1) * x->items / x->chunks;
    (*x->f)(begin, end, worker);
    x->busy.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  };
  if (thread_pool::instance().try_run(threads, ctx.chunks, timed, &ctx)) {
    measure();
    return;
  }
  // The pool is busy (a concurrent or nested call): threads of this call's own.
  std::atomic<std::size_t> next{0};
  auto claim = [&](unsigned worker) {
    for (std::size_t c = next.fetch_add(1, std::memory_order_relaxed); c < ctx.chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      run(&ctx, c, worker);
    }
  };
  std::vector<std::jthread> workers;
  try {
    workers.reserve(threads - 1);
    for (unsigned t = 1; t < threads; ++t)
      workers.emplace_back([&claim, t] { claim(t); });
  } catch (...) {  // no memory or no thread for more workers: those started and this one suffice
  }
  claim(0);
#endif
}

}  // namespace dropit::detail
