// Implementation of dropit::torch's saved-tensor packs (torch/packed.hpp).
#pragma once

#include <dropit/detail/torch/packed_kernels.hpp>
#include <dropit/detail/torch/saved.hpp>

#include <ATen/Dispatch.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>

namespace dropit::torch {
namespace detail {

/// Throws unless t is a defined CPU strided tensor.
inline void check_saved(const at::Tensor& t, const char* who) {
  DROPIT_EXPECTS(t.defined(), "torch::", who, ": the tensor is undefined");
  check_packable(t, who);
}

/// t itself when it is dense (contiguous or a permutation of it), else a contiguous copy.
[[nodiscard]] inline at::Tensor dense_or_copy(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t : t.contiguous();
}

/// The strides a tensor restored for `dense` (a dense tensor) gets: its own.
[[nodiscard]] inline at::Tensor empty_like_dense(const std::vector<std::int64_t>& sizes,
                                                 const std::vector<std::int64_t>& strides,
                                                 at::ScalarType dtype) {
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
}

}  // namespace detail

// ---- packed_tensor -----------------------------------------------------------------------------

inline packed_tensor packed_tensor::pack(const at::Tensor& t, const policy& p) {
  detail::check_saved(t, "pack");
  DROPIT_EXPECTS(t.is_contiguous(), "torch::pack: the tensor must be contiguous, got sizes ",
                 t.sizes(), " and strides ", t.strides(), " (call .contiguous() first)");
  return pack_saved(t, p);
}

inline packed_tensor packed_tensor::pack_saved(const at::Tensor& t, const policy& p) {
  detail::check_saved(t, "pack");
  p.validate();
  const at::Tensor dense = detail::dense_or_copy(t);
  auto box = std::make_unique<detail::cache_box>();
  // Elements in memory order: a dense tensor's storage span from its data pointer.
  box->cache.pack(dense, p);
  return own(std::move(box), dense.sizes().vec(), dense.strides().vec(), dense.scalar_type());
}

namespace detail {
/// Throws unless strides lay out sizes densely (a permutation of contiguous strides); returns the
/// element count.
[[nodiscard]] inline std::size_t dense_numel(const std::vector<std::int64_t>& sizes,
                                             const std::vector<std::int64_t>& strides) {
  DROPIT_EXPECTS(sizes.size() == strides.size(), "torch::packed_tensor::load: ", sizes.size(),
                 " sizes and ", strides.size(), " strides");
  std::size_t n = 1;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of sizes above 1
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    DROPIT_EXPECTS(sizes[d] >= 0 && strides[d] >= 0, "torch::packed_tensor::load: size ", sizes[d],
                   " and stride ", strides[d], " of dimension ", d, " (both must be >= 0)");
    const auto size = static_cast<std::size_t>(sizes[d]);
    if (size == 0) return 0;
    DROPIT_EXPECTS(n <= dropit::detail::max_load_elements / size,
                   "torch::packed_tensor::load: too many elements");
    n *= size;
    if (size > 1) dims.emplace_back(strides[d], sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    DROPIT_EXPECTS(stride == expected, "torch::packed_tensor::load: strides ",
                   at::IntArrayRef(strides), " are not a dense layout of sizes ",
                   at::IntArrayRef(sizes));
    expected *= size;
  }
  return n;
}
}  // namespace detail

inline packed_tensor packed_tensor::load(at::ScalarType dtype, std::vector<std::int64_t> sizes,
                                         std::vector<std::int64_t> strides, const policy& p,
                                         std::size_t kept, position_encoding positions,
                                         std::span<const std::byte> payload) {
  const std::size_t n = detail::dense_numel(sizes, strides);
  p.validate();
  auto box = std::make_unique<detail::cache_box>();
  box->cache.load(dtype, p, n, kept, positions, payload);
  return own(std::move(box), std::move(sizes), std::move(strides), dtype);
}

inline packed_tensor packed_tensor::own(std::unique_ptr<detail::cache_box> box,
                                        std::vector<std::int64_t> sizes,
                                        std::vector<std::int64_t> strides, at::ScalarType dtype) {
  box->dtype = dtype;
  box->counted = box->cache.bytes();
  detail::counters().sparse.fetch_add(box->counted, std::memory_order_relaxed);
  void* data = const_cast<std::byte*>(box->cache.data());
  const std::size_t bytes = box->cache.bytes();
  packed_tensor out;
  out.sizes_ = std::move(sizes);
  out.strides_ = std::move(strides);
  out.dtype_ = dtype;
  out.owner_ =
      detail::box_tensor(std::move(box), data, bytes, at::kByte, static_cast<std::int64_t>(bytes));
  return out;
}

inline at::Tensor packed_tensor::restore() const {
  DROPIT_EXPECTS(owner_.defined(), "torch::packed_tensor: restore of an empty pack");
  const auto& box = detail::box_of<detail::cache_box>(owner_);
  at::Tensor out = detail::empty_like_dense(sizes_, strides_, dtype_);
  box.cache.restore(out);
  return out;
}

inline std::span<const std::byte> packed_tensor::payload() const noexcept {
  if (!owner_.defined()) return {};
  return {static_cast<const std::byte*>(owner_.data_ptr()), bytes()};
}

inline policy packed_tensor::packed_with() const {
  DROPIT_EXPECTS(owner_.defined(), "torch::packed_tensor: an empty pack");
  return detail::box_of<detail::cache_box>(owner_).cache.packed_with();
}

inline position_encoding packed_tensor::positions() const {
  DROPIT_EXPECTS(owner_.defined(), "torch::packed_tensor: an empty pack");
  return detail::box_of<detail::cache_box>(owner_).cache.layout().positions;
}

inline std::size_t packed_tensor::bytes() const noexcept {
  return owner_.defined() ? static_cast<std::size_t>(owner_.numel()) : 0;
}

inline std::size_t packed_tensor::kept() const noexcept {
  if (!owner_.defined()) return 0;
  const auto* box = dynamic_cast<const detail::cache_box*>(
      static_cast<const detail::saved_box*>(owner_.storage().data_ptr().get_context()));
  return box != nullptr ? box->cache.kept() : 0;
}

inline std::size_t packed_tensor::numel() const noexcept {
  std::size_t n = 1;
  for (const std::int64_t s : sizes_)
    n *= static_cast<std::size_t>(s);
  return owner_.defined() ? n : 0;
}

// ---- packed_mask -------------------------------------------------------------------------------

namespace detail {
/// The one nonzero value of a dense tensor whose elements are all 0 or that value (1 if all are
/// 0): a dropout's noise. Throws for anything else.
[[nodiscard]] inline double two_valued_scale(const at::Tensor& dense) {
  const std::int64_t n = dense.numel();
  double value = 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, dense.scalar_type(), "dropit_two_valued", [&] {
        const scalar_t* x = dense.data_ptr<scalar_t>();
        std::int64_t i = 0;
        while (i < n && static_cast<double>(x[i]) == 0)
          ++i;
        if (i == n) return;
        const double s = static_cast<double>(x[i]);
        DROPIT_EXPECTS(s > 0 && s <= std::numeric_limits<double>::max(),
                       "torch::dropout mask: the kept elements must share one positive finite "
                       "value, element ",
                       i, " is ", s);
        bool two_valued = true;
        for (std::int64_t j = i; j < n; ++j) {
          const double v = static_cast<double>(x[j]);
          two_valued &= (v == 0) | (v == s);
        }
        DROPIT_EXPECTS(two_valued, "torch::dropout mask: every element must be 0 or ", s,
                       " (a dropout's noise), this tensor has other values");
        value = s;
      });
  return value;
}

/// Bit i of a new mask: element i of the dense tensor t is > 0 (or NaN).
[[nodiscard]] inline at::Tensor positive_bits(const at::Tensor& dense) {
  at::Tensor words = make_mask((dense.numel() + 31) / 32);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, dense.scalar_type(), "dropit_mask", [&] {
        positive_mask(dense.data_ptr<scalar_t>(),
                      reinterpret_cast<std::uint32_t*>(words.data_ptr()), dense.numel());
      });
  return words;
}

/// A new tensor of the given layout: `value` where the mask's bit is set, 0 elsewhere.
[[nodiscard]] inline at::Tensor expand_bits(const at::Tensor& words,
                                            const std::vector<std::int64_t>& sizes,
                                            const std::vector<std::int64_t>& strides,
                                            at::ScalarType dtype, double value) {
  at::Tensor out = empty_like_dense(sizes, strides, dtype);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "dropit_unmask", [&] {
    expand_mask(reinterpret_cast<const std::uint32_t*>(words.data_ptr()), out.data_ptr<scalar_t>(),
                out.numel());
  });
  if (value != 1) out.mul_(value);  // 1 * s is s exactly: s came from this dtype
  return out;
}
}  // namespace detail

inline packed_mask packed_mask::relu(const at::Tensor& y) {
  detail::check_saved(y, "relu mask");
  DROPIT_EXPECTS(at::isFloatingType(y.scalar_type()),
                 "torch::relu mask: a floating-point tensor is needed, got ", y.scalar_type());
  const at::Tensor dense = detail::dense_or_copy(y);
  packed_mask out;
  out.words_ = detail::positive_bits(dense);
  out.sizes_ = dense.sizes().vec();
  out.strides_ = dense.strides().vec();
  out.dtype_ = dense.scalar_type();
  return out;
}

inline packed_mask packed_mask::dropout(const at::Tensor& noise) {
  detail::check_saved(noise, "dropout mask");
  DROPIT_EXPECTS(at::isFloatingType(noise.scalar_type()),
                 "torch::dropout mask: a floating-point tensor is needed, got ",
                 noise.scalar_type());
  const at::Tensor dense = detail::dense_or_copy(noise);
  const double value = detail::two_valued_scale(dense);
  packed_mask out;
  out.words_ = detail::positive_bits(dense);
  out.sizes_ = dense.sizes().vec();
  out.strides_ = dense.strides().vec();
  out.dtype_ = dense.scalar_type();
  out.value_ = value;
  return out;
}

inline packed_mask packed_mask::leaky_relu(const at::Tensor& t) {
  detail::check_saved(t, "leaky_relu mask");
  DROPIT_EXPECTS(at::isFloatingType(t.scalar_type()),
                 "torch::leaky_relu mask: a floating-point tensor is needed, got ",
                 t.scalar_type());
  const at::Tensor dense = detail::dense_or_copy(t);
  packed_mask out;
  out.words_ = detail::make_mask((dense.numel() + 31) / 32);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, dense.scalar_type(), "dropit_leaky_relu_mask", [&] {
        detail::leaky_relu_mask_forward(
            dense.data_ptr<scalar_t>(), static_cast<scalar_t*>(nullptr), detail::acc_t<scalar_t>(0),
            reinterpret_cast<std::uint32_t*>(out.words_.data_ptr()), dense.numel());
      });
  out.sizes_ = dense.sizes().vec();
  out.strides_ = dense.strides().vec();
  out.dtype_ = dense.scalar_type();
  return out;
}

inline packed_mask packed_mask::hardtanh(const at::Tensor& t, double min_val, double max_val) {
  detail::check_saved(t, "hardtanh mask");
  DROPIT_EXPECTS(at::isFloatingType(t.scalar_type()),
                 "torch::hardtanh mask: a floating-point tensor is needed, got ", t.scalar_type());
  DROPIT_EXPECTS(min_val <= max_val, "torch::hardtanh mask: min_val (", min_val,
                 ") must not exceed max_val (", max_val, ")");
  const at::Tensor dense = detail::dense_or_copy(t);
  packed_mask out;
  const std::int64_t n = dense.numel();
  out.words_ = detail::make_mask((n + 31) / 32);
  auto* words = reinterpret_cast<std::uint32_t*>(out.words_.data_ptr());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, dense.scalar_type(), "dropit_hardtanh_mask", [&] {
        using acc = detail::acc_t<scalar_t>;
        const auto lo = detail::from_double<scalar_t>(min_val);
        const auto hi = detail::from_double<scalar_t>(max_val);
        const scalar_t* x = dense.data_ptr<scalar_t>();
        detail::hardtanh_mask_forward(x, static_cast<scalar_t*>(nullptr), lo, hi, words, n);
        auto on = static_cast<scalar_t>((static_cast<acc>(lo) + static_cast<acc>(hi)) / 2);
        if (!(static_cast<acc>(on) > static_cast<acc>(lo) &&
              static_cast<acc>(on) < static_cast<acc>(hi))) {
          // no midpoint in this dtype: any element strictly inside stands for all of them
          for (std::int64_t w = 0; w < (n + 31) / 32; ++w) {
            if (words[w] != 0) {
              on = x[w * 32 + std::countr_zero(words[w])];
              break;
            }
          }
        }
        out.value_ = static_cast<double>(on);
        out.off_ = static_cast<double>(lo);
      });
  out.sizes_ = dense.sizes().vec();
  out.strides_ = dense.strides().vec();
  out.dtype_ = dense.scalar_type();
  return out;
}

inline at::Tensor packed_mask::restore() const {
  DROPIT_EXPECTS(words_.defined(), "torch::packed_mask: restore of an empty mask");
  if (off_ == 0) return detail::expand_bits(words_, sizes_, strides_, dtype_, value_);
  at::Tensor out = detail::empty_like_dense(sizes_, strides_, dtype_);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype_, "dropit_unmask_two", [&] {
    detail::expand_mask_two_valued(
        reinterpret_cast<const std::uint32_t*>(words_.data_ptr()), out.data_ptr<scalar_t>(),
        out.numel(), detail::from_double<scalar_t>(value_), detail::from_double<scalar_t>(off_));
  });
  return out;
}

inline at::Tensor packed_mask::restore_bool() const {
  DROPIT_EXPECTS(words_.defined(), "torch::packed_mask: restore of an empty mask");
  DROPIT_EXPECTS(value_ == 1 && off_ == 0,
                 "torch::packed_mask: restore_bool of a mask that "
                 "restores to ",
                 value_, " and ", off_, " (not 1 and 0); use restore()");
  at::Tensor out = detail::empty_like_dense(sizes_, strides_, at::kBool);
  detail::expand_mask_bytes(reinterpret_cast<const std::uint32_t*>(words_.data_ptr()),
                            reinterpret_cast<std::uint8_t*>(out.data_ptr()), out.numel());
  return out;
}

inline std::size_t packed_mask::bytes() const noexcept {
  return words_.defined() ? static_cast<std::size_t>(words_.numel()) * sizeof(std::int32_t) : 0;
}

inline std::size_t packed_mask::numel() const noexcept {
  std::size_t n = 1;
  for (const std::int64_t s : sizes_)
    n *= static_cast<std::size_t>(s);
  return words_.defined() ? n : 0;
}

// ---- packed_pool_indices -----------------------------------------------------------------------

inline packed_pool_indices packed_pool_indices::pack(const at::Tensor& indices, std::int64_t in_h,
                                                     std::int64_t in_w,
                                                     const max_pool2d_params& params) {
  detail::check_saved(indices, "pool indices");
  DROPIT_EXPECTS(indices.scalar_type() == at::kLong,
                 "torch::pool indices: int64 indices are needed, got ", indices.scalar_type());
  DROPIT_EXPECTS(indices.dim() == 3 || indices.dim() == 4,
                 "torch::pool indices: indices must be 3-d or 4-d, got ", indices.dim(), "-d");
  DROPIT_EXPECTS(in_h > 0 && in_w > 0, "torch::pool indices: input size must be positive, got ",
                 in_h, "x", in_w);
  // The geometry of an input with the indices' planes and the given height and width.
  std::vector<std::int64_t> in_sizes = indices.sizes().vec();
  in_sizes[in_sizes.size() - 2] = in_h;
  in_sizes.back() = in_w;
  const at::Tensor shape_only = at::empty({1}).expand(in_sizes);  // sizes only, no storage
  const detail::pool_geometry g = detail::pool_geometry_of(shape_only, params);
  DROPIT_EXPECTS(g.oh == indices.size(-2) && g.ow == indices.size(-1),
                 "torch::pool indices: indices of ", indices.size(-2), "x", indices.size(-1),
                 " outputs do not match a ", in_h, "x", in_w, " input and this window (", g.oh, "x",
                 g.ow, " outputs)");
  // Plane order: contiguous NCHW (a channels-last tensor is copied, and restored channels-last).
  const at::Tensor planes = indices.contiguous();
  packed_pool_indices out;
  out.words_ = detail::make_mask(g.code_words());
  const bool ok = detail::encode_pool_indices(
      planes.data_ptr<std::int64_t>(), reinterpret_cast<std::uint32_t*>(out.words_.data_ptr()), g);
  DROPIT_EXPECTS(ok,
                 "torch::pool indices: an index lies outside its pooling window (not indices "
                 "of this max pooling)");
  const at::Tensor dense = detail::dense_or_copy(indices);
  out.sizes_ = dense.sizes().vec();
  out.strides_ = dense.strides().vec();
  out.geometry_ = g;
  return out;
}

inline at::Tensor packed_pool_indices::restore() const {
  DROPIT_EXPECTS(words_.defined(), "torch::packed_pool_indices: restore of an empty pack");
  at::Tensor planes = at::empty(sizes_, at::TensorOptions().dtype(at::kLong));
  detail::decode_pool_indices(reinterpret_cast<const std::uint32_t*>(words_.data_ptr()),
                              planes.data_ptr<std::int64_t>(), geometry_);
  if (planes.strides() == at::IntArrayRef(strides_)) return planes;
  at::Tensor out = detail::empty_like_dense(sizes_, strides_, at::kLong);
  out.copy_(planes);
  return out;
}

inline std::size_t packed_pool_indices::bytes() const noexcept {
  return words_.defined() ? static_cast<std::size_t>(words_.numel()) * sizeof(std::int32_t) : 0;
}

}  // namespace dropit::torch
