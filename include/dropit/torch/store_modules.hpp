/**
 * @file store_modules.hpp
 * @brief Modules that keep the tensors DropIT leaves dense through a codec (store.hpp):
 * `LayerNorm`, `BatchNorm1d/2d/3d`, `GELU`, the activations `SiLU`, `Mish`, `ELU`, `CELU`,
 * `Softplus`, `Tanh`, `Sigmoid`, `Softmax`, `Dropout` (drop-in for LibTorch's,
 * parameters shared when made from one) and `SoftmaxAttention` (`softmax(q k^T + mask) v` with
 * dropout, for attention code written by hand).
 *
 * Each holds `store_options` and uses its own class of them (LayerNorm: `layernorm`; attention:
 * `softmax` and `matmul`; ...); all off by default, so a module behaves as LibTorch's until
 * `set_store` or `to_dropit(..., convert_options{.store = ...})` switches its class on.
 */
#pragma once

#include <dropit/torch/store.hpp>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>  // the standard modules BatchNormImpl replaces
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>
#include <tuple>
#include <type_traits>

namespace dropit::torch {

/// @brief Base of the modules whose saved tensors `store_options` governs.
class store_layer {
 public:
  virtual ~store_layer() = default;
  /// @brief Sets the classes stored from the next forward on (each module reads its own).
  void set_store(const store_options& s) noexcept { store_ = s; }
  /// @brief The options in force.
  [[nodiscard]] const store_options& get_store() const noexcept { return store_; }

 protected:
  explicit store_layer(const store_options& s) : store_(s) {}
  store_layer(const store_layer&) = default;
  store_layer& operator=(const store_layer&) = default;
  /// Prints "store=<codec>" if `on`, else "store=off".
  void print_store(std::ostream& out, bool on) const;

  store_options store_;  ///< the options in force
};

/// @brief `torch::nn::LayerNorm` whose saved input follows `store_options::layernorm`.
class LayerNormImpl : public ::torch::nn::LayerNormImpl, public store_layer {
 public:
  explicit LayerNormImpl(const ::torch::nn::LayerNormOptions& options, const store_options& s = {});
  /// @brief Shares `other`'s parameters.
  explicit LayerNormImpl(const ::torch::nn::LayerNormImpl& other, const store_options& s = {});

  at::Tensor forward(const at::Tensor& input);
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
};

namespace detail {
/// LibTorch's BatchNorm module of `D` spatial dimensions (1, 2 or 3).
template <int D>
using standard_batch_norm_t =
    std::tuple_element_t<D - 1,
                         std::tuple<::torch::nn::BatchNorm1dImpl, ::torch::nn::BatchNorm2dImpl,
                                    ::torch::nn::BatchNorm3dImpl>>;
}  // namespace detail

/**
 * @brief `torch::nn::BatchNorm1d` / `2d` / `3d` (`D` = 1, 2, 3) whose saved input follows
 * `store_options::batchnorm` in training: the same options, parameters and buffers (`weight`,
 * `bias`, `running_mean`, `running_var`, `num_batches_tracked`, so `state_dict`s match), the same
 * accepted input ranks (1d: [N, C] or [N, C, L]; 2d: [N, C, H, W]; 3d: [N, C, D, H, W]) and the
 * same forward, running statistics included. Not a subclass of LibTorch's module: LibTorch 1.13
 * does not export the members of `BatchNormImplBase` a subclass links against.
 */
template <int D>
class BatchNormImpl : public ::torch::nn::Cloneable<BatchNormImpl<D>>, public store_layer {
  static_assert(D >= 1 && D <= 3, "BatchNormImpl: D is 1, 2 or 3");

 public:
  /// LibTorch's module this one stands in for.
  using standard_type = detail::standard_batch_norm_t<D>;

  explicit BatchNormImpl(const ::torch::nn::BatchNormOptions& options, const store_options& s = {});
  /// @brief Shares `other`'s options, parameters and buffers.
  explicit BatchNormImpl(const standard_type& other, const store_options& s = {});

  /// @brief Fresh parameters (weight 1, bias 0) and statistics (mean 0, variance 1, count 0).
  void reset() override;
  /// @brief [N, C, ...] -> the same shape, as LibTorch's module of this rank.
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  ::torch::nn::BatchNormOptions options;  ///< as LibTorch's module
  at::Tensor weight;                      ///< [C], affine only
  at::Tensor bias;                        ///< [C], affine only
  at::Tensor running_mean;                ///< [C], with track_running_stats
  at::Tensor running_var;                 ///< [C], with track_running_stats
  at::Tensor num_batches_tracked;         ///< scalar int64, with track_running_stats
};

using BatchNorm1dImpl = BatchNormImpl<1>;  ///< `torch::nn::BatchNorm1d` with codec storage
using BatchNorm2dImpl = BatchNormImpl<2>;  ///< `torch::nn::BatchNorm2d` with codec storage
using BatchNorm3dImpl = BatchNormImpl<3>;  ///< `torch::nn::BatchNorm3d` with codec storage

/// @brief `torch::nn::GELU` whose saved input follows `store_options::gelu`.
class GELUImpl : public ::torch::nn::GELUImpl, public store_layer {
 public:
  explicit GELUImpl(const ::torch::nn::GELUOptions& options = {}, const store_options& s = {});
  explicit GELUImpl(const ::torch::nn::GELUImpl& other, const store_options& s = {});

  at::Tensor forward(const at::Tensor& input);
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
};

namespace detail {
/// The activation_kind, name and parameters (as values and printed) of LibTorch's activation
/// module S.
template <class S>
struct activation_of;
template <>
struct activation_of<::torch::nn::SiLUImpl> {
  static constexpr activation_kind kind = activation_kind::silu;
  static constexpr const char* name = "SiLU";
  static activation_params params(const ::torch::nn::SiLUImpl&) { return {}; }
  static void print(std::ostream&, const ::torch::nn::SiLUImpl&) {}
};
template <>
struct activation_of<::torch::nn::MishImpl> {
  static constexpr activation_kind kind = activation_kind::mish;
  static constexpr const char* name = "Mish";
  static activation_params params(const ::torch::nn::MishImpl&) { return {}; }
  static void print(std::ostream&, const ::torch::nn::MishImpl&) {}
};
template <>
struct activation_of<::torch::nn::ELUImpl> {
  static constexpr activation_kind kind = activation_kind::elu;
  static constexpr const char* name = "ELU";
  static activation_params params(const ::torch::nn::ELUImpl& m) {
    return {.alpha = m.options.alpha()};
  }
  static void print(std::ostream& out, const ::torch::nn::ELUImpl& m) {
    out << "alpha=" << m.options.alpha() << ", " << (m.options.inplace() ? "inplace=true, " : "");
  }
};
template <>
struct activation_of<::torch::nn::CELUImpl> {
  static constexpr activation_kind kind = activation_kind::celu;
  static constexpr const char* name = "CELU";
  static activation_params params(const ::torch::nn::CELUImpl& m) {
    return {.alpha = m.options.alpha()};
  }
  static void print(std::ostream& out, const ::torch::nn::CELUImpl& m) {
    out << "alpha=" << m.options.alpha() << ", " << (m.options.inplace() ? "inplace=true, " : "");
  }
};
template <>
struct activation_of<::torch::nn::SoftplusImpl> {
  static constexpr activation_kind kind = activation_kind::softplus;
  static constexpr const char* name = "Softplus";
  static activation_params params(const ::torch::nn::SoftplusImpl& m) {
    return {.beta = m.options.beta(), .threshold = m.options.threshold()};
  }
  static void print(std::ostream& out, const ::torch::nn::SoftplusImpl& m) {
    out << "beta=" << m.options.beta() << ", threshold=" << m.options.threshold() << ", ";
  }
};
template <>
struct activation_of<::torch::nn::TanhImpl> {
  static constexpr activation_kind kind = activation_kind::tanh;
  static constexpr const char* name = "Tanh";
  static activation_params params(const ::torch::nn::TanhImpl&) { return {}; }
  static void print(std::ostream&, const ::torch::nn::TanhImpl&) {}
};
template <>
struct activation_of<::torch::nn::SigmoidImpl> {
  static constexpr activation_kind kind = activation_kind::sigmoid;
  static constexpr const char* name = "Sigmoid";
  static activation_params params(const ::torch::nn::SigmoidImpl&) { return {}; }
  static void print(std::ostream&, const ::torch::nn::SigmoidImpl&) {}
};
}  // namespace detail

/**
 * @brief LibTorch's activation module `Standard` (`SiLU`, `Mish`, `ELU`, `CELU`, `Softplus`,
 * `Tanh`, `Sigmoid`) whose saved tensor follows `store_options::activation` in training
 * (`activation`, or with `inplace` on an ELU / CELU `activation_`): the same options, output and
 * gradient.
 */
template <class Standard>
class ActivationImpl : public Standard, public store_layer {
 public:
  /// @brief LibTorch's module with default options.
  explicit ActivationImpl(const store_options& s = {}) : store_layer(s) {}
  /// @brief LibTorch's module made from `options` (ELU, CELU, Softplus).
  template <class Options>
  requires std::is_constructible_v<Standard, const Options&> &&
      (!std::is_base_of_v<::torch::nn::Module, Options>)explicit ActivationImpl(
          const Options& options, const store_options& s = {})
      : Standard(options), store_layer(s) {}
  /// @brief Takes over `other`'s options and training mode.
  explicit ActivationImpl(const Standard& other, const store_options& s = {})
      // Module is a virtual base: copy it here too.
      : ::torch::nn::Module(other), Standard(other), store_layer(s) {}

  at::Tensor forward(const at::Tensor& input);
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
};

using SiLUImpl = ActivationImpl<::torch::nn::SiLUImpl>;          ///< SiLU, input stored
using MishImpl = ActivationImpl<::torch::nn::MishImpl>;          ///< Mish, input stored
using ELUImpl = ActivationImpl<::torch::nn::ELUImpl>;            ///< ELU, input stored
using CELUImpl = ActivationImpl<::torch::nn::CELUImpl>;          ///< CELU, input stored
using SoftplusImpl = ActivationImpl<::torch::nn::SoftplusImpl>;  ///< Softplus, input stored
using TanhImpl = ActivationImpl<::torch::nn::TanhImpl>;          ///< Tanh, output stored
using SigmoidImpl = ActivationImpl<::torch::nn::SigmoidImpl>;    ///< Sigmoid, output stored

/// @brief `torch::nn::Softmax` whose saved output follows `store_options::softmax`.
class SoftmaxImpl : public ::torch::nn::SoftmaxImpl, public store_layer {
 public:
  explicit SoftmaxImpl(const ::torch::nn::SoftmaxOptions& options, const store_options& s = {});
  explicit SoftmaxImpl(const ::torch::nn::SoftmaxImpl& other, const store_options& s = {});

  at::Tensor forward(const at::Tensor& input);
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
};

/// @brief `torch::nn::Dropout` whose noise is saved as bits under `store_options::dropout`
/// (out of place then, also with `inplace`; the same draws and gradient as LibTorch's).
class DropoutImpl : public ::torch::nn::DropoutImpl, public store_layer {
 public:
  explicit DropoutImpl(const ::torch::nn::DropoutOptions& options = {},
                       const store_options& s = {});
  explicit DropoutImpl(const ::torch::nn::DropoutImpl& other, const store_options& s = {});

  at::Tensor forward(at::Tensor input);
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
};

/// @brief `softmax(q k^T + mask) v` (store.hpp's `attention`) with dropout of the weights in
/// training; the softmax output follows `store_options::softmax`, q, k, v `store_options::matmul`
/// and the dropout's noise `store_options::dropout` (1 bit per element). No parameters.
class SoftmaxAttentionImpl : public ::torch::nn::Cloneable<SoftmaxAttentionImpl>,
                             public store_layer {
 public:
  explicit SoftmaxAttentionImpl(const store_options& s = {}) : store_layer(s) {}
  /// @brief With `dropout` (in [0, 1]) on the attention weights in training.
  /// @throw dropit::error if dropout is outside [0, 1].
  explicit SoftmaxAttentionImpl(double dropout, const store_options& s = {});

  void reset() override {}
  /**
   * @brief q [..., t, d] (scaled), k [..., s, d], v [..., s, e] -> [..., t, e]; an additive
   * `mask` and a bool `masked` (true: -inf, as key padding), both optional and broadcast to
   * [..., t, s].
   */
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& mask = {}, const at::Tensor& masked = {});
  void pretty_print(std::ostream& stream) const override;

  double dropout = 0;  ///< dropout of the attention weights in training
};

/// @brief Holder of `LayerNormImpl`.
class LayerNorm : public ::torch::nn::ModuleHolder<LayerNormImpl> {
 public:
  using ::torch::nn::ModuleHolder<LayerNormImpl>::ModuleHolder;
  using Impl = LayerNormImpl;  ///< the module type
};
/// @brief Holder of `BatchNorm1dImpl`.
class BatchNorm1d : public ::torch::nn::ModuleHolder<BatchNorm1dImpl> {
 public:
  using ::torch::nn::ModuleHolder<BatchNorm1dImpl>::ModuleHolder;
  using Impl = BatchNorm1dImpl;  ///< the module type
};
/// @brief Holder of `BatchNorm2dImpl`.
class BatchNorm2d : public ::torch::nn::ModuleHolder<BatchNorm2dImpl> {
 public:
  using ::torch::nn::ModuleHolder<BatchNorm2dImpl>::ModuleHolder;
  using Impl = BatchNorm2dImpl;  ///< the module type
};
/// @brief Holder of `BatchNorm3dImpl`.
class BatchNorm3d : public ::torch::nn::ModuleHolder<BatchNorm3dImpl> {
 public:
  using ::torch::nn::ModuleHolder<BatchNorm3dImpl>::ModuleHolder;
  using Impl = BatchNorm3dImpl;  ///< the module type
};
/// @brief Holder of `GELUImpl`.
class GELU : public ::torch::nn::ModuleHolder<GELUImpl> {
 public:
  using ::torch::nn::ModuleHolder<GELUImpl>::ModuleHolder;
  using Impl = GELUImpl;  ///< the module type
};
/// @brief Holder of `SiLUImpl`.
class SiLU : public ::torch::nn::ModuleHolder<SiLUImpl> {
 public:
  using ::torch::nn::ModuleHolder<SiLUImpl>::ModuleHolder;
  using Impl = SiLUImpl;  ///< the module type
};
/// @brief Holder of `MishImpl`.
class Mish : public ::torch::nn::ModuleHolder<MishImpl> {
 public:
  using ::torch::nn::ModuleHolder<MishImpl>::ModuleHolder;
  using Impl = MishImpl;  ///< the module type
};
/// @brief Holder of `ELUImpl`.
class ELU : public ::torch::nn::ModuleHolder<ELUImpl> {
 public:
  using ::torch::nn::ModuleHolder<ELUImpl>::ModuleHolder;
  using Impl = ELUImpl;  ///< the module type
};
/// @brief Holder of `CELUImpl`.
class CELU : public ::torch::nn::ModuleHolder<CELUImpl> {
 public:
  using ::torch::nn::ModuleHolder<CELUImpl>::ModuleHolder;
  using Impl = CELUImpl;  ///< the module type
};
/// @brief Holder of `SoftplusImpl`.
class Softplus : public ::torch::nn::ModuleHolder<SoftplusImpl> {
 public:
  using ::torch::nn::ModuleHolder<SoftplusImpl>::ModuleHolder;
  using Impl = SoftplusImpl;  ///< the module type
};
/// @brief Holder of `TanhImpl`.
class Tanh : public ::torch::nn::ModuleHolder<TanhImpl> {
 public:
  using ::torch::nn::ModuleHolder<TanhImpl>::ModuleHolder;
  using Impl = TanhImpl;  ///< the module type
};
/// @brief Holder of `SigmoidImpl`.
class Sigmoid : public ::torch::nn::ModuleHolder<SigmoidImpl> {
 public:
  using ::torch::nn::ModuleHolder<SigmoidImpl>::ModuleHolder;
  using Impl = SigmoidImpl;  ///< the module type
};
/// @brief Holder of `SoftmaxImpl`.
class Softmax : public ::torch::nn::ModuleHolder<SoftmaxImpl> {
 public:
  using ::torch::nn::ModuleHolder<SoftmaxImpl>::ModuleHolder;
  using Impl = SoftmaxImpl;  ///< the module type
};
/// @brief Holder of `DropoutImpl`.
class Dropout : public ::torch::nn::ModuleHolder<DropoutImpl> {
 public:
  using ::torch::nn::ModuleHolder<DropoutImpl>::ModuleHolder;
  using Impl = DropoutImpl;  ///< the module type
};
/// @brief Holder of `SoftmaxAttentionImpl`.
class SoftmaxAttention : public ::torch::nn::ModuleHolder<SoftmaxAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<SoftmaxAttentionImpl>::ModuleHolder;
  using Impl = SoftmaxAttentionImpl;  ///< the module type
};

}  // namespace dropit::torch

#include <dropit/detail/torch/store_modules.inl>
