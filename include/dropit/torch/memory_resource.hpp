/**
 * @file memory_resource.hpp
 * @brief `dropit::torch::cpu_resource()`: a `std::pmr::memory_resource` that takes its memory from
 * LibTorch's CPU allocator, so dropit's payloads are counted (and owned) like any CPU tensor.
 *
 * @code
 * dropit::host_executor exec{.threads = 2, .resource = &dropit::torch::cpu_resource()};
 * cache.pack(exec, x);   // the payload comes from c10::GetCPUAllocator()
 * @endcode
 */
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstddef>
#include <memory_resource>

namespace dropit::torch {

/**
 * @brief Allocates from whatever `c10::GetCPUAllocator()` is at the time of the call (a
 * `counting_allocator` when one is installed) and frees each block through the allocator that
 * handed it out, even if the CPU allocator was changed in between.
 *
 * Blocks carry a 64-byte header (the allocator's context and deleter); alignments up to 64 bytes
 * are supported. Thread-safe; all instances are interchangeable.
 */
class cpu_memory_resource final : public std::pmr::memory_resource {
 public:
  /// @brief The largest alignment `allocate` supports (LibTorch's CPU alignment).
  static constexpr std::size_t max_alignment = 64;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override;
};

/// @brief The process-wide `cpu_memory_resource` (never destroyed, so payloads may outlive main).
[[nodiscard]] cpu_memory_resource& cpu_resource() noexcept;

}  // namespace dropit::torch

#include <dropit/detail/torch/memory_resource.inl>
