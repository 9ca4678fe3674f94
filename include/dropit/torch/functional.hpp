/**
 * @file functional.hpp
 * @brief The autograd functions of the LibTorch adapter, as plain functions: Linear, the
 * convolutions (1-d, 2-d, 3-d, plain or transposed) and GPT-2's Conv1D save their input through a
 * `SparseCache`; ReLU, LeakyReLU, Hardtanh and MaxPool2d
 * save a bit mask; the average poolings save their input's sizes only.
 *
 * Each function runs LibTorch's plain op when the policy is `none`, when grad mode is off, or when
 * nothing that needs the saved tensor requires a gradient. Otherwise it runs a
 * `torch::autograd::Function` whose forward is LibTorch's op and whose backward computes
 * - the input gradient exactly (it needs only the weight);
 * - the weight gradient from the input rebuilt from the cache: with MinK, the (1 - gamma) largest
 *   magnitudes of the whole input (every element of every sample, as DropIT's reference does),
 *   zeros elsewhere;
 * - the bias gradient exactly.
 * The cache's payload comes from LibTorch's CPU allocator (`cpu_resource()`), so allocator
 * statistics include it; it is freed when backward has used it (or with the graph).
 *
 * Element types: float, double, and, where LibTorch's CPU op supports them, bfloat16 and half
 * (the caches need the CUDA toolkit's half headers for those). Devices: CPU (the host executor);
 * any other device throws `dropit::error` until a CUDA executor exists. Double backward: see
 * `linear` (and, for the masks, each function).
 */
#pragma once

#include <dropit/torch/policy.hpp>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace dropit::torch {

/**
 * @brief `y = x W^T + b` (torch::nn::Linear), saving x through dropit.
 *
 * The weight gradient comes from the sparsified input: for an fp32 or fp64 payload (exact or
 * 8-bit values) where a fitted cost model says it is faster (from gamma 0.8 on for most shapes:
 * `detail::kept_product_pays`), straight from the kept elements (x^T g summed over them, no
 * rebuilt input: a tenth of the multiply-adds at gamma 0.9); otherwise from the input rebuilt in
 * pieces of rows (`set_chunk_bytes`); `gpt2_conv1d` likewise. Under `create_graph` it
 * is differentiable in x too, as PyTorch's saved-tensor hooks make a restored tensor: the rebuilt
 * input (whole, not in pieces) takes x's place in the graph, its kept values standing for x; at
 * gamma = 0 double backward equals LibTorch's. The same holds for the convolutions and
 * `gpt2_conv1d`.
 * @param x input [..., in]
 * @param weight [out, in]
 * @param bias [out] or nullopt
 * @param p the policy; for `random`, p.seed chooses this call's positions
 * @throw dropit::error for an unsupported device, dtype or layout, or a bad gamma.
 */
[[nodiscard]] at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, const policy& p);

namespace detail {
/// An array of D copies of v (the default stride and dilation).
template <std::size_t D>
[[nodiscard]] constexpr std::array<std::int64_t, D> filled(std::int64_t v) noexcept {
  std::array<std::int64_t, D> a{};
  a.fill(v);
  return a;
}
}  // namespace detail

/// @brief Stride, padding, dilation and groups of a D-d convolution (padding is symmetric).
template <std::size_t D>
struct conv_params {
  std::array<std::int64_t, D> stride = detail::filled<D>(1);    ///< one per spatial dimension
  std::array<std::int64_t, D> padding = detail::filled<D>(0);   ///< zeros added on both sides
  std::array<std::int64_t, D> dilation = detail::filled<D>(1);  ///< kernel dilation
  std::int64_t groups = 1;                                      ///< channel groups
};
using conv1d_params = conv_params<1>;  ///< (length)
using conv2d_params = conv_params<2>;  ///< (height, width)
using conv3d_params = conv_params<3>;  ///< (depth, height, width)

/**
 * @brief D-d convolution (`torch::nn::functional::conv{D}d`), saving x through dropit; the
 * weight gradient comes from the rebuilt input, in pieces of samples (see `linear`).
 * @param x input [N, C, *spatial] (or unbatched [C, *spatial]), D spatial dimensions
 * @param weight [O, C / groups, *kernel]
 * @param bias [O] or nullopt
 * @param params stride, padding, dilation, groups
 * @param p the policy
 * @throw dropit::error as `linear`, or for an input of another rank.
 */
template <std::size_t D>
[[nodiscard]] at::Tensor conv(const at::Tensor& x, const at::Tensor& weight,
                              const c10::optional<at::Tensor>& bias, const conv_params<D>& params,
                              const policy& p);

/// @brief `conv<1>`: [N, C, L] or [C, L] input.
[[nodiscard]] at::Tensor conv1d(const at::Tensor& x, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, const conv1d_params& params,
                                const policy& p);
/// @brief `conv<2>`: [N, C, H, W] or [C, H, W] input.
[[nodiscard]] at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, const conv2d_params& params,
                                const policy& p);
/// @brief `conv<3>`: [N, C, D, H, W] or [C, D, H, W] input.
[[nodiscard]] at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, const conv3d_params& params,
                                const policy& p);

/// @brief Stride, padding, output padding, dilation and groups of a D-d transposed convolution.
template <std::size_t D>
struct conv_transpose_params {
  std::array<std::int64_t, D> stride = detail::filled<D>(1);          ///< one per dimension
  std::array<std::int64_t, D> padding = detail::filled<D>(0);         ///< taken off both sides
  std::array<std::int64_t, D> output_padding = detail::filled<D>(0);  ///< added on one side
  std::array<std::int64_t, D> dilation = detail::filled<D>(1);        ///< kernel dilation
  std::int64_t groups = 1;                                            ///< channel groups
};

/**
 * @brief D-d transposed convolution (`torch::nn::functional::conv_transpose{D}d`), saving x
 * through dropit: its weight gradient reads x as a convolution's does, so it comes from the
 * rebuilt input; input and bias gradients are exact.
 * @param x input [N, C, *spatial] (or unbatched [C, *spatial]), D spatial dimensions
 * @param weight [C, O / groups, *kernel]
 * @param bias [O] or nullopt
 * @param params stride, padding, output padding, dilation, groups
 * @param p the policy
 * @throw dropit::error as `conv`.
 */
template <std::size_t D>
[[nodiscard]] at::Tensor conv_transpose(const at::Tensor& x, const at::Tensor& weight,
                                        const c10::optional<at::Tensor>& bias,
                                        const conv_transpose_params<D>& params, const policy& p);

/**
 * @brief GPT-2's Conv1D: `y = x W + b` with W stored [nx, nf] (`torch.addmm(b, x, W)`), saving x
 * through dropit.
 * @param x input [..., nx]
 * @param weight [nx, nf]
 * @param bias [nf] or nullopt
 * @param p the policy
 * @throw dropit::error as `linear`.
 */
[[nodiscard]] at::Tensor gpt2_conv1d(const at::Tensor& x, const at::Tensor& weight,
                                     const c10::optional<at::Tensor>& bias, const policy& p);

/**
 * @brief `max(x, 0)` that saves one bit per element (x > 0, as LibTorch's gradient uses it)
 * instead of its dense output, when x requires a gradient and grad mode is on; else
 * `at::relu(x)`.
 *
 * The gradient equals LibTorch's: the incoming gradient where x > 0 (or x is NaN), 0 elsewhere,
 * 0 at x == 0 too. Under `create_graph` the backward runs LibTorch's differentiable
 * `threshold_backward` on the mask as a 0/1 tensor, so double backward works.
 * @throw dropit::error for an unsupported device or dtype.
 */
[[nodiscard]] at::Tensor relu(const at::Tensor& x);

/**
 * @brief In-place `relu` (as `at::relu_`): x is overwritten with max(x, 0) and only the 1-bit
 * mask is saved, so no second tensor of x's size is allocated.
 *
 * LibTorch's in-place rules apply (x must not be a leaf that requires a gradient, nor saved by an
 * earlier op). A non-dense x (a strided view) is computed out of place and copied back into x (its
 * base changes, as with LibTorch's op).
 * @return x
 * @throw dropit::error for an unsupported device or dtype, or an x LibTorch's in-place op refuses
 * (a leaf that requires a gradient or a view of one, a view made in no_grad mode or by an op with
 * several outputs or by a custom function), with LibTorch's message.
 */
at::Tensor relu_(at::Tensor& x);

/**
 * @brief LeakyReLU (`x > 0 ? x : x * negative_slope`, as `at::leaky_relu`) that saves one bit per
 * element (x > 0) instead of its input, when x requires a gradient and grad mode is on; else
 * `at::leaky_relu(x, negative_slope)`.
 *
 * Output and gradient equal LibTorch's: the incoming gradient where x > 0, scaled by the slope
 * elsewhere (x == 0 and NaN included). Under `create_graph` the backward runs LibTorch's
 * differentiable `leaky_relu_backward` on the mask as a 0/1 tensor, so double backward works.
 * @throw dropit::error for an unsupported device or dtype.
 */
[[nodiscard]] at::Tensor leaky_relu(const at::Tensor& x, double negative_slope = 0.01);

/**
 * @brief In-place `leaky_relu` (as `at::leaky_relu_`): x is overwritten and only the 1-bit mask of
 * its old values is saved. Unlike LibTorch's, which saves the result and so refuses a negative
 * slope in place, any slope works. A non-dense x (a strided view) is computed out of place and
 * copied back into x (its base changes, as with LibTorch's op).
 * @return x
 * @throw dropit::error as `relu_`.
 */
at::Tensor leaky_relu_(at::Tensor& x, double negative_slope = 0.01);

/**
 * @brief Hardtanh (`min(max(x, min_val), max_val)`, as `at::hardtanh`; ReLU6 is (0, 6)) that
 * saves one bit per element (min_val < x < max_val) instead of its input, when x requires a
 * gradient and grad mode is on; else `at::hardtanh(x, min_val, max_val)`.
 *
 * Output and gradient equal LibTorch's: the incoming gradient strictly inside the bounds, 0 at
 * and beyond them and for NaN (as LibTorch's vectorized kernel; its scalar tail passes NaN). In
 * bfloat16 and half too (the bounds rounded to the dtype, as LibTorch does), where LibTorch 1.13's
 * CPU kernels have no backward (bfloat16) or no op (half). Under `create_graph` the backward runs
 * LibTorch's differentiable `threshold_backward` on the mask as a 0/1 tensor, so double backward
 * works.
 * @throw dropit::error if min_val > max_val (or either is NaN), for an unsupported device or
 * dtype.
 */
[[nodiscard]] at::Tensor hardtanh(const at::Tensor& x, double min_val = -1.0, double max_val = 1.0);

/**
 * @brief In-place `hardtanh` (as `at::hardtanh_`): x is overwritten and only the 1-bit mask is
 * saved. A non-dense x (a strided view) is computed out of place and copied back into x (its base
 * changes, as with LibTorch's op).
 * @return x
 * @throw dropit::error as `hardtanh`, and as `relu_` for an x refused in place.
 */
at::Tensor hardtanh_(at::Tensor& x, double min_val = -1.0, double max_val = 1.0);

/// @brief Window of a 2-d max pooling (stride 0 means stride = kernel).
struct max_pool2d_params {
  std::array<std::int64_t, 2> kernel{2, 2};    ///< window (height, width)
  std::array<std::int64_t, 2> stride{0, 0};    ///< step; 0 = kernel
  std::array<std::int64_t, 2> padding{0, 0};   ///< implicit -inf on both sides, <= kernel / 2
  std::array<std::int64_t, 2> dilation{1, 1};  ///< window dilation
  bool ceil_mode = false;                      ///< round the output size up
};

/**
 * @brief 2-d max pooling that saves, per output, the window position of its maximum in
 * ceil(log2(kH kW)) bits (2 bits for a 2x2 window, rounded up to a power of two) instead of
 * LibTorch's dense input plus int64 indices; else `at::max_pool2d`.
 *
 * Output and gradient equal LibTorch's, ties and NaNs included (the same scan order picks the
 * same element). Under `create_graph` the backward decodes the codes into LibTorch's int64
 * indices and runs its differentiable `max_pool2d_with_indices_backward`, so double backward
 * (a gradient penalty) works as with LibTorch's pooling.
 * @param x input [N, C, H, W] or [C, H, W]
 * @throw dropit::error for bad window parameters, an unsupported device or dtype.
 */
[[nodiscard]] at::Tensor max_pool2d(const at::Tensor& x, const max_pool2d_params& params);

/**
 * @brief `relu(max_pool2d(x))` as one op that saves the ReLU's 1-bit mask of the outputs and the
 * window codes of only the outputs the ReLU passes (an output it zeroes sends no gradient to its
 * window): 1 + p x bits bits per output, p the share of outputs that pass, instead of the
 * 1 + bits of `max_pool2d` followed by `relu`; else (no gradient wanted) LibTorch's ops.
 *
 * Output and gradient equal LibTorch's `relu(max_pool2d(x))`, ties and NaNs included. Its
 * backward is not differentiable: under `create_graph` it throws (use `max_pool2d` then `relu`,
 * whose double backward is LibTorch's).
 * @param x input [N, C, H, W] or [C, H, W]
 * @throw dropit::error for bad window parameters, an unsupported device or dtype; from backward
 * under `create_graph`.
 */
[[nodiscard]] at::Tensor max_pool2d_relu(const at::Tensor& x, const max_pool2d_params& params);

/**
 * @brief `at::avg_pool2d` (same arguments) that saves only its input's sizes: its backward reads
 * nothing else, yet LibTorch's op keeps the whole input alive. A contiguous x that requires a
 * gradient, with grad mode on, takes this path; otherwise (e.g. channels-last, whose gradient
 * takes the input's memory format) it is LibTorch's op.
 *
 * Output and gradient are LibTorch's (its `avg_pool2d_backward` runs on a zero-stride stand-in
 * of x's sizes); so is double backward.
 */
[[nodiscard]] at::Tensor avg_pool2d(const at::Tensor& x, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride = {}, at::IntArrayRef padding = 0,
                                    bool ceil_mode = false, bool count_include_pad = true,
                                    c10::optional<std::int64_t> divisor_override = c10::nullopt);

/// @brief `at::adaptive_avg_pool2d` that saves only its input's sizes (as `avg_pool2d`; its
/// backward is `_adaptive_avg_pool2d_backward`). Double backward equals LibTorch's, except to
/// rounding for a 1 x 1 output, which LibTorch computes as a mean.
[[nodiscard]] at::Tensor adaptive_avg_pool2d(const at::Tensor& x, at::IntArrayRef output_size);

}  // namespace dropit::torch

#include <dropit/detail/torch/functional.inl>
