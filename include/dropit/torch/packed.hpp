/**
 * @file packed.hpp
 * @brief Tensors packed for backward by a save-for-backward hook (PyTorch's
 * `torch.autograd.graph.saved_tensors_hooks`, or any engine's): the pack side turns a saved
 * tensor into a small owner, the unpack side rebuilds the tensor backward reads.
 *
 * | type | packs | restore() gives |
 * | --- | --- | --- |
 * | `packed_tensor` | any floating tensor, through a `SparseCache` (policy `mink`, `random`,
 * `identity`) | the dense tensor: kept values in place, zeros elsewhere | | `packed_mask` | a
 * ReLU's saved output, 1 bit per element (`!(y <= 0)`) | 1 where the bit is set, 0 elsewhere:
 * ReLU's backward (`threshold_backward(g, y, 0)`) reads nothing else, so the gradient is exact | |
 * `packed_pool_indices` | a 2-d max pooling's int64 argmax indices, as window positions in
 * ceil(log2(kH kW)) bits (rounded up to a power of two) | the int64 indices |
 *
 * Every payload comes from LibTorch's CPU allocator (a `counting_allocator` sees it) and is
 * counted in `live_saved_bytes()` (sparse caches as `sparse`, masks and pooling codes as `masks`)
 * until the object is destroyed. Restored tensors have the saved tensor's sizes and strides when it
 * was dense (contiguous or a permutation of it, channels-last included; elements are then taken in
 * memory order), contiguous strides otherwise. CPU tensors only (the host executor); anything else
 * throws `dropit::error`.
 *
 * @code
 * dropit::torch::packed_tensor p = dropit::torch::packed_tensor::pack(x, {policy_kind::mink, 0.9});
 * // ... backward:
 * at::Tensor x_sparse = p.restore();   // x's top 10% magnitudes, zeros elsewhere
 * @endcode
 */
#pragma once

#include <dropit/torch/functional.hpp>
#include <dropit/torch/policy.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dropit::torch {

/// @brief A tensor packed through a `SparseCache`, with what restoring it needs.
class packed_tensor {
 public:
  /**
   * @brief Packs a contiguous CPU tensor (float, double; half and bfloat16 with the CUDA
   * toolkit's headers) with policy p. Positions are counted in row-major order.
   * @throw dropit::error for an undefined, non-CPU, non-strided or non-contiguous tensor, an
   * unsupported dtype, or a bad gamma. Nothing is allocated then.
   */
  [[nodiscard]] static packed_tensor pack(const at::Tensor& t, const policy& p);

  /**
   * @brief Packs any CPU strided tensor as a saved-tensor hook must: a dense one (contiguous or a
   * permutation, e.g. channels-last) in memory order without a copy, any other view through a
   * contiguous copy.
   * @throw dropit::error as `pack`, but for the layout.
   */
  [[nodiscard]] static packed_tensor pack_saved(const at::Tensor& t, const policy& p);

  /**
   * @brief A pack rebuilt from what another pack's accessors give (`dtype()`, `sizes()`,
   * `strides()`, `packed_with()`, `kept()`, `positions()`, `payload()`), e.g. after the bytes went
   * through a file or another process. The payload is checked as `SparseCache::load` checks it,
   * so corrupt input is refused, never restored out of bounds.
   * @throw dropit::error for an unsupported dtype, a negative size, strides that are not a dense
   * layout of the sizes (a permutation of contiguous strides), a bad policy, or a payload that is
   * not exactly what such a pack holds. Nothing is allocated then.
   */
  [[nodiscard]] static packed_tensor load(at::ScalarType dtype, std::vector<std::int64_t> sizes,
                                          std::vector<std::int64_t> strides, const policy& p,
                                          std::size_t kept, position_encoding positions,
                                          std::span<const std::byte> payload);

  /// @brief A new tensor with the packed sizes, strides and dtype: kept values, zeros elsewhere.
  [[nodiscard]] at::Tensor restore() const;

  /// @brief The payload bytes (format.hpp); empty for a default-constructed pack.
  [[nodiscard]] std::span<const std::byte> payload() const noexcept;
  /// @brief The policy the tensor was packed with (kind, gamma, seed, codec, position choice).
  [[nodiscard]] policy packed_with() const;
  /// @brief How the payload stores the kept positions.
  [[nodiscard]] position_encoding positions() const;
  /// @brief Strides of the packed tensor (its elements lie in the payload in memory order).
  [[nodiscard]] const std::vector<std::int64_t>& strides() const noexcept { return strides_; }

  /// @brief Payload bytes held (values and positions).
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// @brief Elements kept.
  [[nodiscard]] std::size_t kept() const noexcept;
  /// @brief Elements of the packed tensor.
  [[nodiscard]] std::size_t numel() const noexcept;
  /// @brief Sizes of the packed tensor.
  [[nodiscard]] const std::vector<std::int64_t>& sizes() const noexcept { return sizes_; }
  /// @brief Element type of the packed tensor.
  [[nodiscard]] at::ScalarType dtype() const noexcept { return dtype_; }

 private:
  /// Holds box (its cache packed or loaded) and counts its bytes as `sparse`.
  [[nodiscard]] static packed_tensor own(std::unique_ptr<detail::cache_box> box,
                                         std::vector<std::int64_t> sizes,
                                         std::vector<std::int64_t> strides, at::ScalarType dtype);

  at::Tensor owner_;  ///< a byte tensor whose storage owns the cache (detail::cache_box)
  std::vector<std::int64_t> sizes_, strides_;
  at::ScalarType dtype_ = at::kFloat;
};

/// @brief What a ReLU's, LeakyReLU's, Hardtanh's or dropout's backward needs of its saved tensor,
/// in 1 bit per element.
class packed_mask {
 public:
  /**
   * @brief Packs the mask `!(y <= 0)` of a ReLU's output y (true where y > 0 or y is NaN: where
   * LibTorch's `threshold_backward` passes the gradient).
   * @throw dropit::error for an undefined, non-CPU or non-strided tensor or a non-floating dtype.
   */
  [[nodiscard]] static packed_mask relu(const at::Tensor& y);

  /**
   * @brief Packs a dropout's saved noise: a floating-point tensor whose elements are all 0 or
   * one value s (1 / (1 - p) for LibTorch's CPU dropout, which saves `bernoulli(1 - p) / (1 - p)`
   * and multiplies by it in backward), as a mask of the elements equal to s, and s. Lossless.
   * @throw dropit::error for an undefined, non-CPU or non-strided tensor, a non-floating dtype, or
   * elements that are neither 0 nor one common nonzero value (NaN included).
   */
  [[nodiscard]] static packed_mask dropout(const at::Tensor& noise);

  /**
   * @brief Packs the mask `t > 0` of a LeakyReLU's saved input (or, in place, its output): where
   * LibTorch's `leaky_relu_backward` passes the gradient unscaled (NaN: scaled). Restores to 1
   * where set and 0 elsewhere, which that backward reads the same way.
   * @throw dropit::error as `relu`.
   */
  [[nodiscard]] static packed_mask leaky_relu(const at::Tensor& t);

  /**
   * @brief Packs the mask `min_val < t < max_val` of a Hardtanh's (ReLU6's) saved input (or, in
   * place, its output), the bounds rounded to t's dtype: where `hardtanh_backward` passes the
   * gradient (a NaN blocks it, as LibTorch's vectorized kernel does). Restores to a value
   * strictly inside the bounds where set ((min + max) / 2 when the dtype holds one strictly
   * inside, else the first such element) and to min_val elsewhere, which that backward reads the
   * same way; any bounds.
   * @throw dropit::error as `relu`, and if min_val > max_val or either is NaN.
   */
  [[nodiscard]] static packed_mask hardtanh(const at::Tensor& t, double min_val, double max_val);

  /// @brief A new tensor with the packed sizes, strides and dtype: the value (1 for a ReLU mask,
  /// s for a dropout's noise) where the mask is set, 0 elsewhere (min_val for a Hardtanh's).
  [[nodiscard]] at::Tensor restore() const;

  /**
   * @brief A new bool tensor with the packed sizes and strides: true where the mask is set. A
   * quarter of `restore()`'s bytes for fp32; LibTorch's `threshold_backward` (a ReLU's backward)
   * gives the same gradient with it as with the restored 0/1 tensor, but converts it to the
   * gradient's dtype first (about 3x slower: docs/python.md), so the adapters restore the dtype.
   * @throw dropit::error for a dropout's noise or a Hardtanh's mask (values other than 1 and 0),
   * or an empty mask.
   */
  [[nodiscard]] at::Tensor restore_bool() const;

  /// @brief Mask bytes held.
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// @brief Elements of the masked tensor.
  [[nodiscard]] std::size_t numel() const noexcept;

 private:
  at::Tensor words_;  ///< int32 words counted as mask bytes (detail::make_mask)
  std::vector<std::int64_t> sizes_, strides_;
  at::ScalarType dtype_ = at::kFloat;
  double value_ = 1;  ///< what a set bit restores to (exactly representable in dtype_)
  double off_ = 0;    ///< what a clear bit restores to (exactly representable in dtype_)
};

/// @brief A 2-d max pooling's argmax indices as window positions.
class packed_pool_indices {
 public:
  /**
   * @brief Packs the int64 indices LibTorch's `max_pool2d_with_indices` returns for an input of
   * height `in_h` and width `in_w` (each index is `y * in_w + x` within its plane).
   * @param indices [N, C, OH, OW] or [C, OH, OW], int64, CPU
   * @param params the pooling's window (as `max_pool2d`)
   * @throw dropit::error for bad window parameters, indices whose sizes do not match the window,
   * or an index outside its window.
   */
  [[nodiscard]] static packed_pool_indices pack(const at::Tensor& indices, std::int64_t in_h,
                                                std::int64_t in_w, const max_pool2d_params& params);

  /// @brief The int64 indices, with the packed sizes and strides.
  [[nodiscard]] at::Tensor restore() const;

  /// @brief Code bytes held.
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// @brief Bits per index.
  [[nodiscard]] int bits() const noexcept { return geometry_.bits; }

 private:
  at::Tensor words_;  ///< int32 words counted as mask bytes
  std::vector<std::int64_t> sizes_, strides_;
  detail::pool_geometry geometry_{};
};

}  // namespace dropit::torch

#include <dropit/detail/torch/packed.inl>
