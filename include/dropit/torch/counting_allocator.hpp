/**
 * @file counting_allocator.hpp
 * @brief `dropit::torch::counting_allocator`: a LibTorch CPU allocator that wraps another one and
 * records the bytes it holds now and at its peak, so memory figures come from real allocations.
 *
 * @code
 * dropit::torch::counting_allocator counter;           // wraps LibTorch's default CPU allocator
 * dropit::torch::cpu_allocator_guard use(counter);     // every CPU tensor now goes through it
 * const std::size_t before = counter.reset_peak();
 * auto loss = model->forward(x).sum();
 * loss.backward();
 * std::size_t step_peak = counter.peak_bytes() - before;
 * @endcode
 *
 * Every CPU allocation LibTorch makes (tensors, oneDNN's buffers, dropit's payloads when they come
 * from `dropit::torch::cpu_resource()`) passes through `c10::GetCPUAllocator()`, so the counter
 * sees it. Only LibTorch's allocator is counted: `malloc`/`new` calls elsewhere are not.
 */
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace dropit::torch {

namespace detail {
struct counting_state;
}

/**
 * @brief A `c10::Allocator` that forwards to an inner allocator and counts the bytes live through
 * it: current, peak (since construction or the last `reset_peak()`), and the number of
 * allocations.
 *
 * It supports `raw_allocate`/`raw_deallocate` (oneDNN's buffers use them), so it can stand in for
 * LibTorch's CPU allocator. Memory it hands out may outlive it: the bookkeeping is shared with the
 * deleter. Thread-safe.
 *
 * A block freed through `raw_deallocate` that another allocator handed out (before this one was
 * installed) is given back to LibTorch's default CPU allocator and not counted. Wrapping one
 * counting allocator in another is not supported.
 */
class counting_allocator final : public c10::Allocator {
 public:
  /**
   * @brief Counts allocations made through `inner`.
   * @param inner the allocator that owns the memory; LibTorch's default CPU allocator by default
   * @throw dropit::error if inner is null or is itself a counting_allocator.
   */
  explicit counting_allocator(c10::Allocator* inner = c10::GetDefaultCPUAllocator());
  ~counting_allocator() override;

  counting_allocator(const counting_allocator&) = delete;
  counting_allocator& operator=(const counting_allocator&) = delete;

  /// @brief Allocates `bytes` from the inner allocator and counts them until the block is freed.
  c10::DataPtr allocate(std::size_t bytes) const override;
  /// @brief The deleter `raw_deallocate` uses (the data pointer is its own context).
  [[nodiscard]] c10::DeleterFnPtr raw_deleter() const override;

  /// @brief Bytes allocated through this allocator and not yet freed.
  [[nodiscard]] std::size_t current_bytes() const noexcept;
  /// @brief The largest `current_bytes()` since construction or the last `reset_peak()`.
  [[nodiscard]] std::size_t peak_bytes() const noexcept;
  /// @brief Allocations made since construction (a zero-byte request is not one).
  [[nodiscard]] std::uint64_t allocations() const noexcept;
  /// @brief Starts a new peak window: peak := current. Returns the current bytes.
  std::size_t reset_peak() noexcept;
  /// @brief The allocator that owns the memory.
  [[nodiscard]] c10::Allocator* inner() const noexcept { return inner_; }

 private:
  c10::Allocator* inner_;
  std::shared_ptr<detail::counting_state> state_;
};

/**
 * @brief Installs an allocator as LibTorch's CPU allocator for its lifetime and restores the
 * previous one on destruction.
 *
 * Install before the tensors you want counted are allocated. Tensors allocated while it is
 * installed keep their own deleter, so they may be freed after the guard is gone.
 */
class cpu_allocator_guard {
 public:
  /**
   * @brief Makes `allocator` LibTorch's CPU allocator.
   * @throw dropit::error if LibTorch keeps another allocator (one set with a higher priority).
   */
  explicit cpu_allocator_guard(c10::Allocator& allocator);
  ~cpu_allocator_guard();
  cpu_allocator_guard(const cpu_allocator_guard&) = delete;
  cpu_allocator_guard& operator=(const cpu_allocator_guard&) = delete;

  /// @brief The allocator that was installed before.
  [[nodiscard]] c10::Allocator* previous() const noexcept { return previous_; }

 private:
  c10::Allocator* previous_;
};

}  // namespace dropit::torch

#include <dropit/detail/torch/counting_allocator.inl>
