/**
 * @file modules.hpp
 * @brief Drop-in dropit layers for LibTorch: `Linear`, `Conv1d`, `Conv2d`, `Conv3d`,
 * `ConvTranspose1d` / `2d` / `3d`, `Conv1D` (GPT-2), `ReLU`, `LeakyReLU`, `Hardtanh`, `ReLU6`,
 * `MaxPool2d`, `AvgPool2d` and `AdaptiveAvgPool2d`, with the options of their `torch::nn`
 * counterparts, usable in `Sequential`.
 *
 * @code
 * namespace dt = dropit::torch;
 * const dt::policy p{dt::policy_kind::mink, 0.9};
 * torch::nn::Sequential net(dt::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1), p),
 *                           dt::ReLU(p), dt::MaxPool2d(torch::nn::MaxPool2dOptions(2), p),
 *                           torch::nn::Flatten(), dt::Linear(16 * 14 * 14, 10, p));
 * @endcode
 *
 * All but `Conv1D` derive from the `torch::nn` module they replace (same parameters, options,
 * initialisation and printing), so code that reads `weight` or `options` keeps working. Call
 * `forward` through the dropit type (a `Sequential` does): the base class's `forward` is not
 * virtual.
 *
 * A layer runs LibTorch's plain op in eval mode, under `torch::NoGradGuard`, with policy `none`,
 * or when excluded (`exclude()`); otherwise it saves through dropit (see functional.hpp).
 */
#pragma once

#include <dropit/torch/functional.hpp>
#include <dropit/torch/policy.hpp>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <tuple>

namespace dropit::torch {

/**
 * @brief What every dropit layer has: its policy, a per-layer opt-out, and a step counter that
 * gives `random` fresh positions at every training step.
 */
class layer {
 public:
  virtual ~layer() = default;

  /**
   * @brief Sets the policy used from the next forward pass on.
   * @throw dropit::error if gamma is outside [0, 1].
   */
  void set_policy(const policy& p);
  /// @brief The policy.
  [[nodiscard]] const policy& get_policy() const noexcept { return policy_; }

  /// @brief Opts this layer out (or back in), and `to_dropit` leaves its policy alone. An
  /// excluded Linear, Conv1d/2d/3d or Conv1D keeps its input exact (a dense copy: the gamma = 0
  /// case) but still runs dropit's backward in pieces; an excluded ReLU or MaxPool2d runs the plain
  /// op.
  void exclude(bool excluded = true) noexcept { excluded_ = excluded; }
  /// @brief Whether the layer is opted out.
  [[nodiscard]] bool excluded() const noexcept { return excluded_; }

  /// @brief Training forward passes that went through dropit so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return step_; }

 protected:
  explicit layer(const policy& p);
  layer(const layer&) = default;
  layer& operator=(const layer&) = default;

  /// The policy of this call: `none` when the plain op should run (eval mode, excluded,
  /// policy none), else the policy with this step's seed (base seed + step, per layer).
  [[nodiscard]] policy step_policy(bool training);
  /// The policy of a Linear/Conv forward: `step_policy`, but an excluded layer whose policy is
  /// active (in training, grad mode on) keeps its input exact, an identity pack.
  [[nodiscard]] policy weight_policy(bool training);
  /// Writes "policy=mink(0.9)" (or "excluded").
  void print_policy(std::ostream& out) const;

 private:
  policy policy_;
  bool excluded_ = false;
  std::uint64_t step_ = 0;
  std::uint64_t salt_;  ///< distinguishes the random positions of different layers
};

/// @brief Linear layer that saves its input through dropit; see `torch::nn::LinearImpl`.
class LinearImpl : public ::torch::nn::LinearImpl, public layer {
 public:
  /// @brief `in_features` -> `out_features`, with bias.
  LinearImpl(std::int64_t in_features, std::int64_t out_features, const policy& p = {});
  /// @brief As `torch::nn::Linear(options)`.
  explicit LinearImpl(const ::torch::nn::LinearOptions& options, const policy& p = {});
  /// @brief Takes over a standard layer: the SAME parameter tensors (an optimizer that holds them
  /// keeps working), options and training mode.
  explicit LinearImpl(const ::torch::nn::LinearImpl& other, const policy& p = {});

  /// @brief `x W^T + b`.
  at::Tensor forward(const at::Tensor& input);
  /// @brief A deep copy (new parameter tensors), policy and opt-out included.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::Linear(in_features=.., out_features=.., bias=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

namespace detail {
/// LibTorch's convolution module of `D` spatial dimensions (1, 2 or 3).
template <std::size_t D>
using standard_conv_t = std::tuple_element_t<
    D - 1, std::tuple<::torch::nn::Conv1dImpl, ::torch::nn::Conv2dImpl, ::torch::nn::Conv3dImpl>>;
/// LibTorch's transposed convolution module of `D` spatial dimensions (1, 2 or 3).
template <std::size_t D>
using standard_conv_transpose_t = std::tuple_element_t<
    D - 1, std::tuple<::torch::nn::ConvTranspose1dImpl, ::torch::nn::ConvTranspose2dImpl,
                      ::torch::nn::ConvTranspose3dImpl>>;
}  // namespace detail

/**
 * @brief `torch::nn::Conv1d` / `Conv2d` / `Conv3d` (`D` = 1, 2, 3) that saves its input through
 * dropit: every padding mode, 'same' (asymmetric when the kernel wants it) and 'valid', stride,
 * dilation, groups, batched [N, C, ...] or unbatched [C, ...] input. One rank-generic autograd
 * function (`conv_fn`) computes the backward in pieces of samples for every rank. Not GPT-2's
 * `Conv1D` below.
 */
template <std::size_t D>
class ConvImpl : public detail::standard_conv_t<D>, public layer {
  static_assert(D >= 1 && D <= 3, "ConvImpl: D is 1, 2 or 3");

 public:
  /// LibTorch's module this one derives from and stands in for.
  using standard_type = detail::standard_conv_t<D>;

  /// @brief As `torch::nn::Conv{D}d(options)`.
  explicit ConvImpl(const ::torch::nn::ConvOptions<D>& options, const policy& p = {});
  /// @brief Takes over a standard layer: the SAME parameter tensors, options and training mode.
  explicit ConvImpl(const standard_type& other, const policy& p = {});

  /// @brief The convolution of [N, C, ...] (D spatial dimensions) or unbatched [C, ...] input.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::Conv{D}d(.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

using Conv1dImpl = ConvImpl<1>;  ///< `torch::nn::Conv1d` through dropit
using Conv2dImpl = ConvImpl<2>;  ///< `torch::nn::Conv2d` through dropit
using Conv3dImpl = ConvImpl<3>;  ///< `torch::nn::Conv3d` through dropit

/**
 * @brief `torch::nn::ConvTranspose1d` / `2d` / `3d` (`D` = 1, 2, 3) that saves its input through
 * dropit: stride, padding, output padding (or an `output_size` given to `forward`), dilation,
 * groups, batched or unbatched input; zeros padding only, as LibTorch. Its weight gradient reads
 * the input as a convolution's does, so it is computed from the rebuilt input; the input and bias
 * gradients are exact.
 */
template <std::size_t D>
class ConvTransposeImpl : public detail::standard_conv_transpose_t<D>, public layer {
  static_assert(D >= 1 && D <= 3, "ConvTransposeImpl: D is 1, 2 or 3");

 public:
  /// LibTorch's module this one derives from and stands in for.
  using standard_type = detail::standard_conv_transpose_t<D>;

  /// @brief As `torch::nn::ConvTranspose{D}d(options)`.
  explicit ConvTransposeImpl(const ::torch::nn::ConvTransposeOptions<D>& options,
                             const policy& p = {});
  /// @brief Takes over a standard layer: the SAME parameter tensors, options and training mode.
  explicit ConvTransposeImpl(const standard_type& other, const policy& p = {});

  /**
   * @brief The transposed convolution of [N, C, ...] or unbatched [C, ...] input.
   * @param output_size the output's spatial size (D entries, or D + 2 with the batch and
   *        channels first), which chooses the output padding; nullopt: the options' padding.
   * @throw dropit::error for a padding mode other than zeros or an output size out of reach.
   */
  at::Tensor forward(const at::Tensor& input,
                     const c10::optional<at::IntArrayRef>& output_size = c10::nullopt);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::ConvTranspose{D}d(.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

using ConvTranspose1dImpl = ConvTransposeImpl<1>;  ///< `torch::nn::ConvTranspose1d` through dropit
using ConvTranspose2dImpl = ConvTransposeImpl<2>;  ///< `torch::nn::ConvTranspose2d` through dropit
using ConvTranspose3dImpl = ConvTransposeImpl<3>;  ///< `torch::nn::ConvTranspose3d` through dropit

/// @brief Options of GPT-2's Conv1D: nf outputs from nx inputs.
struct Conv1DOptions {
  /// @brief nf output features, nx input features.
  Conv1DOptions(std::int64_t nf, std::int64_t nx) : nf_(nf), nx_(nx) {}
  TORCH_ARG(std::int64_t, nf);   ///< output features
  TORCH_ARG(std::int64_t, nx);   ///< input features
  TORCH_ARG(bool, bias) = true;  ///< learn an additive bias
};

/**
 * @brief GPT-2's Conv1D (Hugging Face `transformers.pytorch_utils.Conv1D`): `x W + b` with W
 * stored [nx, nf], initialised N(0, 0.02), bias zeros; saves its input through dropit.
 */
class Conv1DImpl : public ::torch::nn::Cloneable<Conv1DImpl>, public layer {
 public:
  /// @brief nf outputs from nx inputs, with bias.
  Conv1DImpl(std::int64_t nf, std::int64_t nx, const policy& p = {});
  /// @brief From options.
  explicit Conv1DImpl(const Conv1DOptions& options, const policy& p = {});

  /// @brief (Re)creates the parameters.
  void reset() override;
  /// @brief `x W + b`.
  at::Tensor forward(const at::Tensor& input);
  /// @brief "dropit::torch::Conv1D(nf=.., nx=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;

  Conv1DOptions options;  ///< the options
  at::Tensor weight;      ///< [nx, nf]
  at::Tensor bias;        ///< [nf], undefined without bias
};

/**
 * @brief ReLU that saves a 1-bit mask instead of its output (so a following dropit layer's dense
 * input can be freed); see `torch::nn::ReLUImpl`. With `inplace`, the mask ReLU overwrites its
 * input too (`relu_`), so it allocates no second tensor.
 */
class ReLUImpl : public ::torch::nn::ReLUImpl, public layer {
 public:
  /// @brief As `torch::nn::ReLU(options)`.
  explicit ReLUImpl(const ::torch::nn::ReLUOptions& options = {}, const policy& p = {});
  /// @brief A mask ReLU with default options.
  explicit ReLUImpl(const policy& p) : ReLUImpl(::torch::nn::ReLUOptions{}, p) {}
  /// @brief Takes over a standard layer's options and training mode.
  explicit ReLUImpl(const ::torch::nn::ReLUImpl& other, const policy& p = {});

  /// @brief `max(x, 0)`, or x itself when absorbed.
  at::Tensor forward(const at::Tensor& input);
  /// @brief Makes `forward` return its input unchanged (or normal again): for a ReLU whose work
  /// the MaxPool2d just before it does (`MaxPool2dImpl::apply_relu`); `to_dropit` sets both.
  void absorb(bool on = true) noexcept { absorbed_ = on; }
  /// @brief Whether `forward` returns its input unchanged.
  [[nodiscard]] bool absorbed() const noexcept { return absorbed_; }
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::ReLU(policy=..)".
  void pretty_print(std::ostream& stream) const override;

 private:
  bool absorbed_ = false;
};

/**
 * @brief LeakyReLU that saves a 1-bit mask (x > 0) instead of its input; see
 * `torch::nn::LeakyReLUImpl`. With `inplace`, it overwrites its input (`leaky_relu_`).
 */
class LeakyReLUImpl : public ::torch::nn::LeakyReLUImpl, public layer {
 public:
  /// @brief As `torch::nn::LeakyReLU(options)`.
  explicit LeakyReLUImpl(const ::torch::nn::LeakyReLUOptions& options = {}, const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit LeakyReLUImpl(const ::torch::nn::LeakyReLUImpl& other, const policy& p = {});

  /// @brief `x > 0 ? x : x * negative_slope`.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::LeakyReLU(negative_slope=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/**
 * @brief Hardtanh that saves a 1-bit mask (min_val < x < max_val) instead of its input; see
 * `torch::nn::HardtanhImpl`. With `inplace`, it overwrites its input (`hardtanh_`).
 */
class HardtanhImpl : public ::torch::nn::HardtanhImpl, public layer {
 public:
  /// @brief As `torch::nn::Hardtanh(options)`.
  explicit HardtanhImpl(const ::torch::nn::HardtanhOptions& options = {}, const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit HardtanhImpl(const ::torch::nn::HardtanhImpl& other, const policy& p = {});

  /// @brief `min(max(x, min_val), max_val)`.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::Hardtanh(min_val=.., max_val=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/**
 * @brief ReLU6 (Hardtanh on (0, 6)) that saves a 1-bit mask (0 < x < 6) instead of its input;
 * see `torch::nn::ReLU6Impl`. With `inplace`, it overwrites its input.
 */
class ReLU6Impl : public ::torch::nn::ReLU6Impl, public layer {
 public:
  /// @brief As `torch::nn::ReLU6(options)`.
  explicit ReLU6Impl(const ::torch::nn::ReLU6Options& options = {}, const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit ReLU6Impl(const ::torch::nn::ReLU6Impl& other, const policy& p = {});

  /// @brief `min(max(x, 0), 6)`.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::ReLU6(policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/**
 * @brief 2-d max pooling that saves each window's argmax in a few bits instead of its dense
 * input and int64 indices; see `torch::nn::MaxPool2dImpl`.
 */
class MaxPool2dImpl : public ::torch::nn::MaxPool2dImpl, public layer {
 public:
  /// @brief As `torch::nn::MaxPool2d(options)`.
  explicit MaxPool2dImpl(const ::torch::nn::MaxPool2dOptions& options, const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit MaxPool2dImpl(const ::torch::nn::MaxPool2dImpl& other, const policy& p = {});

  /// @brief The pooling, followed by ReLU with `apply_relu`.
  at::Tensor forward(const at::Tensor& input);
  /**
   * @brief Makes `forward` compute `relu(max_pool2d(x))` (or the pooling alone again). Trained
   * with an active policy, it then saves the ReLU's 1-bit mask and the window codes of only the
   * outputs the ReLU passes (`max_pool2d_relu`). `to_dropit` sets it on a MaxPool2d followed by a
   * ReLU in a Sequential, and `ReLUImpl::absorb` on that ReLU.
   */
  void apply_relu(bool on = true) noexcept { relu_ = on; }
  /// @brief Whether `forward` applies ReLU after the pooling.
  [[nodiscard]] bool applies_relu() const noexcept { return relu_; }
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::MaxPool2d(.., policy=..)".
  void pretty_print(std::ostream& stream) const override;

 private:
  bool relu_ = false;
};

/**
 * @brief 2-d average pooling that saves only its input's sizes (`avg_pool2d`) instead of the
 * whole input; see `torch::nn::AvgPool2dImpl`.
 */
class AvgPool2dImpl : public ::torch::nn::AvgPool2dImpl, public layer {
 public:
  /// @brief As `torch::nn::AvgPool2d(options)`.
  explicit AvgPool2dImpl(const ::torch::nn::AvgPool2dOptions& options, const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit AvgPool2dImpl(const ::torch::nn::AvgPool2dImpl& other, const policy& p = {});

  /// @brief The pooling.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::AvgPool2d(.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/**
 * @brief 2-d adaptive average pooling that saves only its input's sizes (`adaptive_avg_pool2d`);
 * see `torch::nn::AdaptiveAvgPool2dImpl`.
 */
class AdaptiveAvgPool2dImpl : public ::torch::nn::AdaptiveAvgPool2dImpl, public layer {
 public:
  /// @brief As `torch::nn::AdaptiveAvgPool2d(options)`.
  explicit AdaptiveAvgPool2dImpl(const ::torch::nn::AdaptiveAvgPool2dOptions& options,
                                 const policy& p = {});
  /// @brief Takes over a standard layer's options and training mode.
  explicit AdaptiveAvgPool2dImpl(const ::torch::nn::AdaptiveAvgPool2dImpl& other,
                                 const policy& p = {});

  /// @brief The pooling.
  at::Tensor forward(const at::Tensor& input);
  /// @copydoc LinearImpl::clone
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::AdaptiveAvgPool2d(.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/// @brief Module holder of `LinearImpl` (as `TORCH_MODULE(Linear)`).
class Linear : public ::torch::nn::ModuleHolder<LinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<LinearImpl>::ModuleHolder;
  using Impl = LinearImpl;  ///< the module type
};
/// @brief Module holder of `ConvImpl<D>`.
template <std::size_t D>
class Conv : public ::torch::nn::ModuleHolder<ConvImpl<D>> {
 public:
  using ::torch::nn::ModuleHolder<ConvImpl<D>>::ModuleHolder;
  using Impl = ConvImpl<D>;  ///< the module type
};
using Conv1d = Conv<1>;  ///< holder of `Conv1dImpl` (LibTorch's 1-d convolution)
using Conv2d = Conv<2>;  ///< holder of `Conv2dImpl`
using Conv3d = Conv<3>;  ///< holder of `Conv3dImpl`
/// @brief Module holder of `ConvTransposeImpl<D>`.
template <std::size_t D>
class ConvTranspose : public ::torch::nn::ModuleHolder<ConvTransposeImpl<D>> {
 public:
  using ::torch::nn::ModuleHolder<ConvTransposeImpl<D>>::ModuleHolder;
  using Impl = ConvTransposeImpl<D>;  ///< the module type
};
using ConvTranspose1d = ConvTranspose<1>;  ///< holder of `ConvTranspose1dImpl`
using ConvTranspose2d = ConvTranspose<2>;  ///< holder of `ConvTranspose2dImpl`
using ConvTranspose3d = ConvTranspose<3>;  ///< holder of `ConvTranspose3dImpl`
/// @brief Module holder of `Conv1DImpl`.
class Conv1D : public ::torch::nn::ModuleHolder<Conv1DImpl> {
 public:
  using ::torch::nn::ModuleHolder<Conv1DImpl>::ModuleHolder;
  using Impl = Conv1DImpl;  ///< the module type
};
/// @brief Module holder of `ReLUImpl`.
class ReLU : public ::torch::nn::ModuleHolder<ReLUImpl> {
 public:
  using ::torch::nn::ModuleHolder<ReLUImpl>::ModuleHolder;
  using Impl = ReLUImpl;  ///< the module type
};
/// @brief Module holder of `LeakyReLUImpl`.
class LeakyReLU : public ::torch::nn::ModuleHolder<LeakyReLUImpl> {
 public:
  using ::torch::nn::ModuleHolder<LeakyReLUImpl>::ModuleHolder;
  using Impl = LeakyReLUImpl;  ///< the module type
};
/// @brief Module holder of `HardtanhImpl`.
class Hardtanh : public ::torch::nn::ModuleHolder<HardtanhImpl> {
 public:
  using ::torch::nn::ModuleHolder<HardtanhImpl>::ModuleHolder;
  using Impl = HardtanhImpl;  ///< the module type
};
/// @brief Module holder of `ReLU6Impl`.
class ReLU6 : public ::torch::nn::ModuleHolder<ReLU6Impl> {
 public:
  using ::torch::nn::ModuleHolder<ReLU6Impl>::ModuleHolder;
  using Impl = ReLU6Impl;  ///< the module type
};
/// @brief Module holder of `MaxPool2dImpl`.
class MaxPool2d : public ::torch::nn::ModuleHolder<MaxPool2dImpl> {
 public:
  using ::torch::nn::ModuleHolder<MaxPool2dImpl>::ModuleHolder;
  using Impl = MaxPool2dImpl;  ///< the module type
};

/// @brief Module holder of `AvgPool2dImpl`.
class AvgPool2d : public ::torch::nn::ModuleHolder<AvgPool2dImpl> {
 public:
  using ::torch::nn::ModuleHolder<AvgPool2dImpl>::ModuleHolder;
  using Impl = AvgPool2dImpl;  ///< the module type
};
/// @brief Module holder of `AdaptiveAvgPool2dImpl`.
class AdaptiveAvgPool2d : public ::torch::nn::ModuleHolder<AdaptiveAvgPool2dImpl> {
 public:
  using ::torch::nn::ModuleHolder<AdaptiveAvgPool2dImpl>::ModuleHolder;
  using Impl = AdaptiveAvgPool2dImpl;  ///< the module type
};

}  // namespace dropit::torch

#include <dropit/detail/torch/modules.inl>
