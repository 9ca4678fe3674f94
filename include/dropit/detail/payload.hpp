/**
 * @file payload.hpp
 * @brief The owning buffer behind a SparseCache: bytes, where they live, and how to give them back.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace dropit {

/// @brief Where a cache's payload lives: host memory or device memory.
enum class memory_space : std::uint8_t { host, device };

namespace detail {

/**
 * Move-only owner of one allocation. The executor that allocates it supplies the function that
 * frees it, plus up to two opaque words of state (a memory resource, a stream), so the cache does
 * not need to know any executor.
 */
class payload {
 public:
  /// Frees `bytes` at `data`; must not throw.
  using release_fn = void (*)(void* resource, void* stream, std::byte* data,
                              std::size_t bytes) noexcept;

  payload() noexcept = default;
  payload(std::byte* data, std::size_t bytes, memory_space space, release_fn release,
          void* resource, void* stream) noexcept
      : data_(data),
        bytes_(bytes),
        space_(space),
        release_(release),
        resource_(resource),
        stream_(stream) {}

  payload(const payload&) = delete;
  payload& operator=(const payload&) = delete;
  payload(payload&& other) noexcept { swap(other); }
  payload& operator=(payload&& other) noexcept {
    payload(std::move(other)).swap(*this);
    return *this;
  }
  ~payload() { reset(); }

  /// Frees the allocation now; the payload is then empty.
  void reset() noexcept {
    if (data_ != nullptr && release_ != nullptr) release_(resource_, stream_, data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void swap(payload& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(space_, other.space_);
    std::swap(release_, other.release_);
    std::swap(resource_, other.resource_);
    std::swap(stream_, other.stream_);
  }

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] memory_space space() const noexcept { return space_; }
  /// The stream of the last stream-ordered use (device payloads), else null.
  [[nodiscard]] void* stream() const noexcept { return stream_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  memory_space space_ = memory_space::host;
  release_fn release_ = nullptr;
  void* resource_ = nullptr;
  void* stream_ = nullptr;
};

}  // namespace detail
}  // namespace dropit
