// Implementation of dropit::SparseCache (sparse_cache.hpp).
#pragma once

#include <utility>

namespace dropit {

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T> SparseCache<T, Policy, Codec>::SparseCache(SparseCache&& other)
noexcept
    : policy_(other.policy_),
      codec_(other.codec_),
      positions_(other.positions_),
      payload_(std::move(other.payload_)),
      layout_(std::exchange(other.layout_, packed_layout{})),
      scale_(std::exchange(other.scale_, 1.0)),
      packed_(std::exchange(other.packed_, false)) {
}

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T> SparseCache<T, Policy, Codec>
&SparseCache<T, Policy, Codec>::operator=(SparseCache&& other) noexcept {
  if (this != &other) {
    policy_ = other.policy_;
    codec_ = other.codec_;
    positions_ = other.positions_;
    payload_ = std::move(other.payload_);
    layout_ = std::exchange(other.layout_, packed_layout{});
    scale_ = std::exchange(other.scale_, 1.0);
    packed_ = std::exchange(other.packed_, false);
  }
  return *this;
}

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T>
void SparseCache<T, Policy, Codec>::clear() noexcept {
  payload_.reset();
  layout_ = packed_layout{};
  scale_ = 1.0;
  packed_ = false;
}

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T>
template <class Exec>
requires executor_for<Exec, T, Policy, Codec>
void SparseCache<T, Policy, Codec>::pack(const Exec& exec, std::span<const T> x) {
  const std::size_t n = x.size();
  DROPIT_EXPECTS(x.data() != nullptr || n == 0, "pack: input has a null data pointer and ", n,
                 " elements");
  const std::size_t k = static_cast<std::size_t>(policy_.kept(n));
  DROPIT_EXPECTS(k <= n, "pack: the policy keeps ", k, " of ", n, " elements");
  const packed_layout layout = make_layout(n, k, sizeof(T), Codec::kind, positions_);
  double scale = 1.0;
  if constexpr (has_restore_scale<Policy>) scale = static_cast<double>(policy_.restore_scale(n, k));

  // Build the new payload first: if anything throws, the cache keeps what it had.
  detail::payload fresh = exec.template pack<T>(policy_, codec_, x.data(), layout);
  payload_ = std::move(fresh);
  layout_ = layout;
  scale_ = scale;
  packed_ = true;
}

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T>
template <class Exec>
requires executor_for<Exec, T, Policy, Codec> && payload_loader<Exec>
void SparseCache<T, Policy, Codec>::load(const Exec& exec, std::size_t n, std::size_t k,
                                         position_encoding positions,
                                         std::span<const std::byte> bytes) {
  const packed_layout layout = detail::load_layout(n, k, sizeof(T), Codec::kind, positions);
  // The copy first: an executor refuses bytes the host cannot read (device memory) before the
  // check reads them. A refused payload is freed here, the cache untouched.
  detail::payload fresh = exec.copy_in(bytes);
  detail::check_payload(layout, bytes);
  double scale = 1.0;
  if constexpr (has_restore_scale<Policy>) scale = static_cast<double>(policy_.restore_scale(n, k));
  payload_ = std::move(fresh);
  layout_ = layout;
  scale_ = scale;
  packed_ = true;
}

template <element T, class Policy, value_codec_type Codec>
requires policy_for<Policy, T>
template <class Exec>
requires executor_for<Exec, T, Policy, Codec>
void SparseCache<T, Policy, Codec>::restore(const Exec& exec, std::span<T> out) const {
  DROPIT_EXPECTS(packed_, "restore: the cache is empty (nothing was packed)");
  DROPIT_EXPECTS(out.size() == layout_.n, "restore: output has ", out.size(),
                 " elements, the cache holds ", layout_.n);
  DROPIT_EXPECTS(out.data() != nullptr || out.empty(),
                 "restore: output has a null data pointer and ", out.size(), " elements");
  DROPIT_EXPECTS(Exec::space == payload_.space() || layout_.n == 0,
                 "restore: the payload lives in ",
                 payload_.space() == memory_space::host ? "host" : "device",
                 " memory; restore it with an executor of that memory space");
  if (layout_.n == 0) return;
  exec.restore(payload_, layout_, out.data(), scale_);
}

}  // namespace dropit
