// Implementation of dropit::torch::cpu_memory_resource (torch/memory_resource.hpp).
#pragma once

#include <dropit/error.hpp>

#include <cstdint>
#include <new>

namespace dropit::torch {
namespace detail {

/// Sits in front of each block: how the allocator that handed it out frees it.
struct resource_header {
  void* context;
  c10::DeleterFnPtr deleter;
};
static_assert(sizeof(resource_header) <= cpu_memory_resource::max_alignment);

}  // namespace detail

inline void* cpu_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  DROPIT_EXPECTS(alignment <= max_alignment, "cpu_memory_resource: alignment ", alignment,
                 " exceeds ", max_alignment);
  c10::DataPtr block = c10::GetCPUAllocator()->allocate(bytes + max_alignment);
  auto* base = static_cast<std::byte*>(block.get());
  if (base == nullptr) throw std::bad_alloc();
  DROPIT_EXPECTS(reinterpret_cast<std::uintptr_t>(base) % max_alignment == 0,
                 "cpu_memory_resource: LibTorch's CPU allocator returned a block aligned to less "
                 "than ",
                 max_alignment, " bytes");
  auto* header = new (base) detail::resource_header{block.get_context(), block.get_deleter()};
  (void)header;
  (void)block.release_context();  // the header owns it from here on
  return base + max_alignment;
}

inline void cpu_memory_resource::do_deallocate(void* p, std::size_t, std::size_t) {
  if (p == nullptr) return;
  // The header sits max_alignment bytes before p (do_allocate). Through an integer, so that g++
  // does not read p as the start of the caller's block and warn about the offset (-Warray-bounds).
  auto* base = reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(p) - max_alignment);
  const detail::resource_header header = *reinterpret_cast<detail::resource_header*>(base);
  if (header.deleter != nullptr) header.deleter(header.context);
}

inline bool cpu_memory_resource::do_is_equal(
    const std::pmr::memory_resource& other) const noexcept {
  return dynamic_cast<const cpu_memory_resource*>(&other) != nullptr;
}

inline cpu_memory_resource& cpu_resource() noexcept {
  static auto* resource = new cpu_memory_resource;
  return *resource;
}

}  // namespace dropit::torch
