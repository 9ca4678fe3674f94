// Implementation of dropit::torch::counting_allocator (torch/counting_allocator.hpp).
#pragma once

#include <dropit/error.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace dropit::torch {
namespace detail {

/// The counters of one counting_allocator; shared with its live blocks.
struct counting_state {
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::uint64_t> allocations{0};

  void add(std::int64_t bytes) noexcept {
    const std::int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
};

/// What a live block needs at free time: its size, who counts it, and how the inner allocator
/// frees it.
struct counted_block {
  std::size_t bytes = 0;
  void* inner_context = nullptr;
  c10::DeleterFnPtr inner_deleter = nullptr;
  std::shared_ptr<counting_state> state;
};

/// Live blocks of every counting_allocator, keyed by data pointer; sharded to keep the locks
/// short. Leaked on purpose: blocks may be freed during static destruction.
class block_registry {
 public:
  static block_registry& instance() {
    static auto* registry = new block_registry;
    return *registry;
  }

  void insert(void* data, counted_block block) {
    shard& s = shard_of(data);
    std::lock_guard lock(s.mutex);
    s.blocks.insert_or_assign(data, std::move(block));
  }

  /// Removes and returns the block at `data`; false when it is not ours.
  bool take(void* data, counted_block& out) {
    shard& s = shard_of(data);
    std::lock_guard lock(s.mutex);
    const auto it = s.blocks.find(data);
    if (it == s.blocks.end()) return false;
    out = std::move(it->second);
    s.blocks.erase(it);
    return true;
  }

 private:
  struct shard {
    std::mutex mutex;
    std::unordered_map<void*, counted_block> blocks;
  };
  static constexpr std::size_t shards = 64;

  shard& shard_of(void* data) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(data);
    return shards_[(a >> 6 ^ a >> 14) % shards];
  }

  std::array<shard, shards> shards_;
};

/// The deleter of every counted block (its data pointer is its context).
inline void counting_delete(void* data) noexcept {
  if (data == nullptr) return;
  counted_block block;
  if (block_registry::instance().take(data, block)) {
    block.state->current.fetch_sub(static_cast<std::int64_t>(block.bytes),
                                   std::memory_order_relaxed);
    if (block.inner_deleter != nullptr) block.inner_deleter(block.inner_context);
    return;
  }
  // Not ours: a raw block allocated before a counting allocator was installed.
  if (c10::DeleterFnPtr d = c10::GetDefaultCPUAllocator()->raw_deleter(); d != nullptr) d(data);
}

}  // namespace detail

inline counting_allocator::counting_allocator(c10::Allocator* inner)
    : inner_(inner), state_(std::make_shared<detail::counting_state>()) {
  DROPIT_EXPECTS(inner != nullptr, "counting_allocator: the inner allocator is null");
  DROPIT_EXPECTS(dynamic_cast<counting_allocator*>(inner) == nullptr,
                 "counting_allocator: wrapping a counting_allocator is not supported");
}

inline counting_allocator::~counting_allocator() = default;

inline c10::DataPtr counting_allocator::allocate(std::size_t bytes) const {
  c10::DataPtr inner = inner_->allocate(bytes);
  void* data = inner.get();
  if (data == nullptr) return inner;  // zero bytes: nothing to count
  const c10::Device device = inner.device();
  detail::counted_block block;
  block.bytes = bytes;
  block.inner_context = inner.get_context();
  block.inner_deleter = inner.get_deleter();
  block.state = state_;
  // If the insert throws, `inner` still owns the block and frees it.
  detail::block_registry::instance().insert(data, std::move(block));
  (void)inner.release_context();  // the registry owns it from here on
  state_->allocations.fetch_add(1, std::memory_order_relaxed);
  state_->add(static_cast<std::int64_t>(bytes));
  return {data, data, &detail::counting_delete, device};
}

inline c10::DeleterFnPtr counting_allocator::raw_deleter() const {
  return &detail::counting_delete;
}

inline std::size_t counting_allocator::current_bytes() const noexcept {
  const std::int64_t c = state_->current.load(std::memory_order_relaxed);
  return c > 0 ? static_cast<std::size_t>(c) : 0;
}

inline std::size_t counting_allocator::peak_bytes() const noexcept {
  const std::int64_t p = state_->peak.load(std::memory_order_relaxed);
  return p > 0 ? static_cast<std::size_t>(p) : 0;
}

inline std::uint64_t counting_allocator::allocations() const noexcept {
  return state_->allocations.load(std::memory_order_relaxed);
}

inline std::size_t counting_allocator::reset_peak() noexcept {
  const std::int64_t c = state_->current.load(std::memory_order_relaxed);
  state_->peak.store(c, std::memory_order_relaxed);
  return c > 0 ? static_cast<std::size_t>(c) : 0;
}

inline cpu_allocator_guard::cpu_allocator_guard(c10::Allocator& allocator)
    : previous_(c10::GetCPUAllocator()) {
  c10::SetCPUAllocator(&allocator);
  DROPIT_EXPECTS(c10::GetCPUAllocator() == &allocator,
                 "cpu_allocator_guard: LibTorch kept its CPU allocator (one was set with a higher "
                 "priority)");
}

inline cpu_allocator_guard::~cpu_allocator_guard() {
  c10::SetCPUAllocator(previous_);
}

}  // namespace dropit::torch
