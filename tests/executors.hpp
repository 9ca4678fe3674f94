// The executors the shared pack/restore cases (executor_cases.inl) run on. A configuration C is
// an element type and an executor:
//   C::type                      the element type
//   C::space                     where its payloads live
//   C::name()                    for the test log, e.g. "float/host-3", "__half/portable"
//   C::buffer<U>                 memory the executor reads and writes, made from a std::vector<U>
//                                or a size, with span() and cspan()
//   C::session                   what one case holds while it runs (a device case: its stream):
//                                exec(), the executor to call; to_host(buffer), its contents once
//                                the work enqueued so far is done; bytes(span), a payload's bytes
// The host configurations are here; the device ones are in cuda_support.hpp.
#pragma once

#include <dropit/dropit.hpp>

#include "test_support.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace dropit_test {

/// Host memory with a device buffer's interface.
template <class T>
class host_buffer {
 public:
  explicit host_buffer(std::size_t n) : v_(n) {}
  explicit host_buffer(const std::vector<T>& host) : v_(host) {}
  [[nodiscard]] std::span<T> span() noexcept { return v_; }
  [[nodiscard]] std::span<const T> cspan() const noexcept { return v_; }

 private:
  std::vector<T> v_;
};

/// The host executor with `Threads` worker threads (the sizes under test reach past
/// `host_executor::parallel_threshold`, so the parallel path runs).
template <class T, unsigned Threads>
struct on_host {
  using type = T;
  template <class U>
  using buffer = host_buffer<U>;
  static constexpr dropit::memory_space space = dropit::memory_space::host;
  struct session {
    [[nodiscard]] dropit::host_executor exec() const {
      return {.threads = Threads, .adaptive = false};
    }
    template <class U>
    [[nodiscard]] std::vector<U> to_host(const host_buffer<U>& b) const {
      return {b.cspan().begin(), b.cspan().end()};
    }
    [[nodiscard]] std::vector<std::byte> bytes(std::span<const std::byte> p) const {
      return {p.begin(), p.end()};
    }
  };
  static std::string name() { return type_name<T>() + "/host-" + std::to_string(Threads); }
};

#if DROPIT_HAS_HALF
#define DROPIT_HOST_CASES                                                      \
  dropit_test::on_host<float, 1>, dropit_test::on_host<double, 1>,             \
      dropit_test::on_host<__half, 1>, dropit_test::on_host<__nv_bfloat16, 1>, \
      dropit_test::on_host<float, 3>, dropit_test::on_host<double, 3>,         \
      dropit_test::on_host<__half, 3>, dropit_test::on_host<__nv_bfloat16, 3>
#else
#define DROPIT_HOST_CASES                                                                          \
  dropit_test::on_host<float, 1>, dropit_test::on_host<double, 1>, dropit_test::on_host<float, 3>, \
      dropit_test::on_host<double, 3>
#endif

}  // namespace dropit_test
