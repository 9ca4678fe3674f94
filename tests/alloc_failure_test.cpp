// Allocation failure anywhere in a process's first pack (the host executor's worker pool starts
// then): every point either completes the pack correctly or throws with the cache unchanged, and
// none hangs or ends the process. A counting global operator new fails its Nth call; each N runs
// in a fresh child process (the pool starts once per process), with an alarm against hangs.
#include <dropit/dropit.hpp>

#include "test_support.hpp"
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {

std::atomic<long> fail_at{0};  // the allocation that fails (1-based); 0: none
std::atomic<long> calls{0};    // allocations since the injector was armed
std::atomic<bool> armed{false};

bool should_fail() noexcept {
  if (!armed.load(std::memory_order_relaxed)) return false;
  return calls.fetch_add(1, std::memory_order_relaxed) + 1 == fail_at.load();
}

void* allocate(std::size_t bytes, std::size_t align) {
  if (should_fail()) throw std::bad_alloc();
  if (bytes == 0) bytes = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(bytes)
                : std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) {
  return allocate(n, alignof(std::max_align_t));
}
void* operator new[](std::size_t n) {
  return allocate(n, alignof(std::max_align_t));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return operator new(n, std::nothrow);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {

// Child exit codes.
constexpr int packed_correctly = 10;  // the failure hit nothing that mattered
constexpr int threw_unchanged = 11;   // the pack threw; the cache kept its previous content
constexpr int not_reached = 12;       // fewer than N allocations: every point has been tried
constexpr int wrong = 13;             // a wrong payload, a changed cache or a foreign exception

/// One first pack of n floats on `threads` threads with allocation `n_fail` failing; the child's
/// verdict as an exit code.
int child(unsigned threads, long n_fail, bool over_old_content) {
  constexpr std::size_t n = 300000;  // above host_executor::parallel_threshold
  const auto x = dropit_test::normal_values<float>(n, 7);
  const auto expect = dropit_test::oracle_mink<float>(x, dropit::MinK<0.9>{}.kept(n));
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  std::vector<float> old(1000);  // what the cache holds before, restored
  if (over_old_content) {
    for (std::size_t i = 0; i < old.size(); ++i)
      old[i] = static_cast<float>(i % 7) - 3.0f;
    cache.pack(dropit::host_executor{.threads = 1}, old);
    cache.restore(dropit::host_executor{.threads = 1}, std::span<float>(old));
  }
  const dropit::host_executor exec{.threads = threads, .adaptive = false};
  fail_at = n_fail;
  calls = 0;
  armed = true;
  bool threw = false;
  try {
    cache.pack(exec, x);
  } catch (const std::bad_alloc&) {
    threw = true;
  } catch (const dropit::error&) {
    threw = true;
  } catch (...) {
    armed = false;
    return wrong;
  }
  armed = false;
  if (calls.load() < n_fail) return not_reached;
  if (threw && !over_old_content) return cache.empty() ? threw_unchanged : wrong;
  std::vector<float> out(cache.size());
  cache.restore(dropit::host_executor{.threads = 1}, std::span<float>(out));
  if (threw) return out == old ? threw_unchanged : wrong;
  std::vector<float> want(n, 0.0f);
  for (std::size_t i : expect)
    want[i] = x[i];
  return out == want ? packed_correctly : wrong;
}

/// Runs `child` in a fresh process that an alarm ends after 10 s; returns its exit code, or a
/// description of how it ended otherwise.
std::string run_child(unsigned threads, long n_fail, bool over_old_content) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(10);
    int code = wrong;
    try {
      code = child(threads, n_fail, over_old_content);
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status)) return std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return WTERMSIG(status) == SIGALRM ? "hang (killed after 10 s)"
                                       : "signal " + std::to_string(WTERMSIG(status));
  }
  return "?";
}

}  // namespace

TEST_CASE("an allocation that fails anywhere in a first pack: correct, or thrown and unchanged") {
  for (unsigned threads : {1u, 2u, 4u}) {
    for (bool over_old_content : {false, true}) {
      CAPTURE(threads);
      CAPTURE(over_old_content);
      long threw = 0, completed = 0, n_fail = 1;
      for (;; ++n_fail) {
        CAPTURE(n_fail);
        const std::string verdict = run_child(threads, n_fail, over_old_content);
        if (verdict == std::to_string(not_reached)) break;
        if (verdict == std::to_string(threw_unchanged)) {
          ++threw;
        } else if (verdict == std::to_string(packed_correctly)) {
          ++completed;
        } else {
          FAIL_CHECK("allocation ", n_fail, " of the pack: ", verdict);
        }
        REQUIRE(n_fail < 10000);
      }
      MESSAGE(threads, " threads: ", n_fail - 1, " allocations, ", threw, " threw, ", completed,
              " completed");
      CHECK(n_fail > 1);  // the pack allocates, so the injector was exercised
      CHECK(threw > 0);   // the payload's own allocation fails the pack
      // A worker that cannot start leaves its chunks to the others: the pack completes.
      if (threads > 1) CHECK(completed > 0);
    }
  }
}

namespace {
/// The threads of this process (Linux: /proc/self/status), or -1 if unknown.
long process_threads() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long n = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "Threads: %ld", &n) == 1) break;
  std::fclose(f);
  return n;
}
}  // namespace

TEST_CASE("a thread count above host_executor::max_threads is an error, before any thread starts") {
  const auto x = dropit_test::normal_values<float>(300000, 3);
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  const long before = process_threads();
  REQUIRE(before > 0);
  CHECK_THROWS_WITH_AS(cache.pack(dropit::host_executor{.threads = 5000}, x),
                       "dropit: host_executor: threads must be at most 1024, got 5000",
                       dropit::error);
  CHECK(cache.empty());
  CHECK(process_threads() == before);
  cache.pack(dropit::host_executor{.threads = 2, .adaptive = false}, x);
  std::vector<float> out(x.size());
  CHECK_THROWS_WITH_AS(cache.restore(dropit::host_executor{.threads = 1025}, std::span<float>(out)),
                       "dropit: host_executor: threads must be at most 1024, got 1025",
                       dropit::error);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));  // not written
}
