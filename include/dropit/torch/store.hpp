/**
 * @file store.hpp
 * @brief Codec storage for the tensors DropIT leaves dense: LayerNorm's and BatchNorm's saved
 * input, GELU's and the other activations' saved tensor, a softmax's output, the inputs of
 * attention's two matmuls, and a dropout's noise as bits.
 *
 * DropIT sparsifies the inputs Linear and Conv layers save for their weight gradients; a
 * transformer saves as much again in tensors whose backward needs them whole. These functions run
 * LibTorch's own forward and backward kernels (`native_layer_norm[_backward]`,
 * `gelu[_backward]`, `_softmax[_backward_data]`, `bmm`) but keep the saved tensor through a dense
 * `Identity` pack with a value codec (`store_options::codec`: int8 or e4m3 with a scale per 1024
 * values, codec.hpp), 4x smaller than fp32. With `value_codec::exact` the pack is a copy and the
 * gradients are LibTorch's, bit for bit; a dropout's noise is always exact (1 bit per element and
 * its one nonzero value).
 *
 * Each class is switched on separately (`store_options`); a class switched off, grad mode off or
 * no gradient to compute runs LibTorch's plain op.
 *
 * @code
 * dropit::torch::store_options s = dropit::torch::store_options::all();  // int8
 * auto h = dropit::torch::layer_norm(x, {64}, w, b, 1e-5, s.policy_for(s.layernorm));
 * auto o = dropit::torch::attention(q * scale, k, v, s.policy_for(s.softmax),
 *                                   s.policy_for(s.matmul));
 * @endcode
 */
#pragma once

#include <dropit/torch/policy.hpp>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dropit::torch {

/// @brief Which classes of dense saved tensors are kept through a codec, and which codec.
struct store_options {
  /// How stored tensors keep their values: int8 (default), fp8 (e4m3) or exact (a copy).
  value_codec codec = value_codec::int8;
  bool layernorm = false;  ///< LayerNorm's saved input (its mean and 1/std stay exact)
  bool gelu = false;       ///< GELU's saved input
  bool softmax = false;    ///< a softmax's saved output (`softmax`, and inside `attention`)
  bool matmul = false;     ///< attention's q, k and v (what its two matmuls save)
  bool dropout = false;    ///< a dropout's noise as 1 bit per element (exact, any codec)
  bool batchnorm = false;  ///< BatchNorm's saved input in training (batch mean, 1/std exact)
  /// SiLU, Mish, Hardswish, Hardsigmoid, ELU, CELU, Softplus (their input), Tanh and Sigmoid
  /// (their output): `activation`
  bool activation = false;

  /// @brief Every class on, with codec c.
  [[nodiscard]] static store_options all(value_codec c = value_codec::int8);
  /**
   * @brief Classes from a comma-separated list ("layernorm,softmax", "all", "" for none).
   * @throw dropit::error for an unknown class name.
   */
  [[nodiscard]] static store_options parse(std::string_view classes,
                                           value_codec c = value_codec::int8);
  /// @brief Whether any class is on.
  [[nodiscard]] bool any() const noexcept {
    return layernorm || gelu || softmax || matmul || dropout || batchnorm || activation;
  }
  /// @brief The pack of a class: a dense `identity` pack with `codec` when on, else `none`.
  [[nodiscard]] policy policy_for(bool on) const noexcept {
    return on ? policy{policy_kind::identity, 0.0, 0, codec} : policy{};
  }
};

/// @brief The class names `store_options::parse` reads, comma-separated, of the classes on.
[[nodiscard]] std::string to_string(const store_options& s);

/**
 * @brief `at::layer_norm` whose saved input is packed with `store` (an `identity` policy with a
 * codec; `none`: LibTorch's plain op). Gradients of x, weight and bias from LibTorch's
 * `native_layer_norm_backward` on the restored input.
 * @throw dropit::error for a non-CPU tensor or a `mink`/`random` policy (layer inputs of
 * normalisation are read whole by backward: only dense packs are allowed); from backward under
 * `create_graph` (the restored input has no autograd history, so no double backward; this holds
 * for `gelu`, `softmax` and `attention` too).
 */
[[nodiscard]] at::Tensor layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                    const c10::optional<at::Tensor>& weight,
                                    const c10::optional<at::Tensor>& bias, double eps,
                                    const policy& store);

/**
 * @brief `at::batch_norm` whose saved input is packed with `store` (as `layer_norm`) when
 * `training` (batch statistics; `running_mean` / `running_var`, if given, updated with `momentum`
 * as LibTorch does). Gradients of x, weight and bias from LibTorch's `native_batch_norm_backward`
 * on the restored input. Not training, or `store` none: LibTorch's plain op.
 * @throw dropit::error for a non-CPU tensor, an input without a channel dimension (under 2-d) or
 * a `mink`/`random` policy; from backward under `create_graph`.
 */
[[nodiscard]] at::Tensor batch_norm(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                    const c10::optional<at::Tensor>& bias,
                                    const c10::optional<at::Tensor>& running_mean,
                                    const c10::optional<at::Tensor>& running_var, bool training,
                                    double momentum, double eps, const policy& store);

/// @brief `at::gelu` whose saved input is packed with `store` (as `layer_norm`).
[[nodiscard]] at::Tensor gelu(const at::Tensor& x, const policy& store,
                              const std::string& approximate = "none");

/// @brief The element-wise activations of store class `activation`.
enum class activation_kind {
  silu,
  mish,
  hardswish,
  hardsigmoid,
  elu,
  celu,
  softplus,
  tanh,
  sigmoid
};

/// @brief The name of an activation ("silu", ..., "sigmoid").
[[nodiscard]] const char* to_string(activation_kind k) noexcept;

/// @brief Parameters of the activations that take some (LibTorch's defaults): ELU's and CELU's
/// `alpha`, Softplus's `beta` and `threshold`. The other activations ignore them.
struct activation_params {
  double alpha = 1.0;       ///< ELU, CELU
  double beta = 1.0;        ///< Softplus
  double threshold = 20.0;  ///< Softplus
};

/**
 * @brief The activation `kind` of x as LibTorch computes it (`at::silu`, `mish`, `hardswish`,
 * `hardsigmoid`, `elu`, `celu`, `softplus`, `tanh`, `sigmoid`), with the tensor its backward reads
 * packed with `store` (as `layer_norm`): the input, or for tanh and sigmoid the output. Gradients
 * from LibTorch's own backward ops (`silu_backward`, ..., `sigmoid_backward`) on the restored
 * tensor, so with the exact codec they are LibTorch's bit for bit.
 * @throw dropit::error as `layer_norm`, or for an unknown `kind`.
 */
[[nodiscard]] at::Tensor activation(const at::Tensor& x, activation_kind kind, const policy& store,
                                    const activation_params& params = {});

/**
 * @brief In-place ELU or CELU (`at::elu_` / `at::celu_`: x is overwritten) with the output, which
 * their in-place backward reads, packed with `store`; LibTorch's gradient from it.
 * @return x
 * @throw dropit::error for another kind, a negative alpha, or as `activation`.
 */
at::Tensor activation_(at::Tensor& x, activation_kind kind, const policy& store,
                       const activation_params& params = {});

/// @brief `at::softmax` along `dim` whose saved output is packed with `store` (as `layer_norm`).
[[nodiscard]] at::Tensor softmax(const at::Tensor& x, std::int64_t dim, const policy& store);

/// @brief Masks and dropout of `attention`: those of LibTorch's MultiheadAttention.
struct attention_options {
  at::Tensor mask;            ///< added to q k^T (broadcast to [..., t, s]); undefined: none
  at::Tensor masked;          ///< bool, broadcast to [..., t, s]: -inf where set (key padding)
  double dropout = 0;         ///< dropout probability of the weights (pass 0 in eval)
  bool dropout_bits = false;  ///< save the dropout's noise as 1 bit per element (exact)
};

/**
 * @brief Attention's core, `softmax(q k^T + mask) v` over the last two dimensions (scale q
 * first; `options`: an additive mask, a bool mask of -inf, dropout of the weights, as LibTorch's
 * MultiheadAttention applies them), with the softmax output packed with `softmax_store`, q, k, v
 * with `matmul_store` and the dropout's noise as bits with `options.dropout_bits` (the weights
 * after dropout are rebuilt from the softmax output and the noise, not saved). The same batched
 * matmuls as `at::matmul` on these shapes and LibTorch's dropout draws, so with exact packs the
 * result and gradients are LibTorch's bit for bit.
 * @param q [..., t, d] @param k [..., s, d] @param v [..., s, e], leading dimensions equal.
 * @return [..., t, e]
 * @throw dropit::error for mismatched shapes, masks that do not broadcast to [..., t, s] (or a
 * `masked` that is not bool), a dropout outside [0, 1], a non-CPU tensor or a `mink`/`random`
 * policy.
 */
[[nodiscard]] at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const policy& softmax_store, const policy& matmul_store,
                                   const attention_options& options = {});

/**
 * @brief `at::dropout`; with `bits` and in training its noise (0 or 1 / (1 - p), the same draws
 * as LibTorch's CPU dropout) is saved as 1 bit per element, so the gradient is LibTorch's.
 * @throw dropit::error if p is outside [0, 1].
 */
[[nodiscard]] at::Tensor dropout(const at::Tensor& x, double p, bool train, bool bits);

}  // namespace dropit::torch

#include <dropit/detail/torch/store.inl>
