// Implementation of dropit::torch::MultiheadAttention (torch/multihead_attention.hpp).
#pragma once

#include <dropit/error.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

namespace dropit::torch {
namespace detail {

/// Rows [begin, end) of a projection weight or bias (end < 0: to the last row); an undefined
/// bias stays undefined.
[[nodiscard]] inline at::Tensor projection_rows(const at::Tensor& t, std::int64_t begin,
                                                std::int64_t end = -1) {
  if (!t.defined()) return t;
  return end < 0 ? t.slice(0, begin) : t.slice(0, begin, end);
}

/// Whether LibTorch's attention takes a and b for the same tensor: the same one, or equal values.
[[nodiscard]] inline bool same_input(const at::Tensor& a, const at::Tensor& b) {
  return a.is_same(b) || at::equal(a, b);
}

/// mask with a column of zeros appended (dimension 1), as LibTorch pads its masks.
[[nodiscard]] inline at::Tensor padded_mask(const at::Tensor& mask) {
  if (!mask.defined()) return mask;
  return at::cat({mask, at::zeros({mask.size(0), 1}, mask.options())}, 1);
}

/// t [B, S, D] with a slice of zeros appended along S.
[[nodiscard]] inline at::Tensor with_zero_key(const at::Tensor& t) {
  auto sizes = t.sizes().vec();
  sizes[1] = 1;
  return at::cat({t, at::zeros(sizes, t.options())}, 1);
}

}  // namespace detail

inline MultiheadAttentionImpl::MultiheadAttentionImpl(std::int64_t embed_dim,
                                                      std::int64_t num_heads, const policy& p)
    : MultiheadAttentionImpl(::torch::nn::MultiheadAttentionOptions(embed_dim, num_heads), p) {
}

inline MultiheadAttentionImpl::MultiheadAttentionImpl(
    const ::torch::nn::MultiheadAttentionOptions& options_, const policy& p)
    : standard_type(options_), layer(p), store_layer({}) {
}

inline MultiheadAttentionImpl::MultiheadAttentionImpl(const standard_type& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), standard_type(other), layer(p), store_layer({}) {
}

inline std::tuple<at::Tensor, at::Tensor> MultiheadAttentionImpl::forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& key_padding_mask, bool need_weights, const at::Tensor& attn_mask,
    bool average_attn_weights) {
  const policy p = weight_policy(is_training());
  // The attention's own saved tensors through store_options (softmax output, q, k, v, noise).
  const bool training = is_training() && ::torch::autograd::GradMode::is_enabled();
  const policy ps = training ? store_.policy_for(store_.softmax) : policy{};
  const policy pm = training ? store_.policy_for(store_.matmul) : policy{};
  const bool bits = training && store_.dropout && options.dropout() > 0;
  if (!p.active() && !ps.active() && !pm.active() && !bits) {
    return standard_type::forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                  average_attn_weights);
  }
  DROPIT_EXPECTS(query.defined() && key.defined() && value.defined() && query.dim() == 3 &&
                     key.dim() == 3 && value.dim() == 3,
                 "torch::MultiheadAttention: query, key and value must be 3-d ([L, N, E], [S, N, "
                 "kdim], [S, N, vdim])");
  const std::int64_t tgt_len = query.size(0), bsz = query.size(1), embed_dim = query.size(2);
  const std::int64_t heads = options.num_heads();
  DROPIT_EXPECTS(embed_dim == options.embed_dim(), "torch::MultiheadAttention: query has ",
                 embed_dim, " features, the module's embed_dim is ", options.embed_dim());
  DROPIT_EXPECTS(key.sizes() == value.sizes(),
                 "torch::MultiheadAttention: key and value must have the same sizes");
  DROPIT_EXPECTS(key.size(1) == bsz, "torch::MultiheadAttention: key has batch ", key.size(1),
                 ", query ", bsz);
  // One seed per projection, so that Random draws different positions for each input.
  std::uint64_t projection = 0;
  const auto project = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    policy pi = p;
    pi.seed = p.seed + 0x9e3779b97f4a7c15ULL * projection++;
    return dropit::torch::linear(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt,
                                 pi);
  };
  const std::int64_t e = embed_dim;
  at::Tensor q, k, v;
  if (_qkv_same_embed_dim) {
    if (detail::same_input(query, key) && detail::same_input(key, value)) {
      const auto qkv = project(query, in_proj_weight, in_proj_bias).chunk(3, -1);
      q = qkv[0], k = qkv[1], v = qkv[2];
    } else if (detail::same_input(key, value)) {
      q = project(query, detail::projection_rows(in_proj_weight, 0, e),
                  detail::projection_rows(in_proj_bias, 0, e));
      const auto kv = project(key, detail::projection_rows(in_proj_weight, e),
                              detail::projection_rows(in_proj_bias, e))
                          .chunk(2, -1);
      k = kv[0], v = kv[1];
    } else {
      q = project(query, detail::projection_rows(in_proj_weight, 0, e),
                  detail::projection_rows(in_proj_bias, 0, e));
      k = project(key, detail::projection_rows(in_proj_weight, e, 2 * e),
                  detail::projection_rows(in_proj_bias, e, 2 * e));
      v = project(value, detail::projection_rows(in_proj_weight, 2 * e),
                  detail::projection_rows(in_proj_bias, 2 * e));
    }
  } else {
    DROPIT_EXPECTS(key.size(2) == k_proj_weight.size(1) && value.size(2) == v_proj_weight.size(1),
                   "torch::MultiheadAttention: key and value must have kdim (",
                   k_proj_weight.size(1), ") and vdim (", v_proj_weight.size(1), ") features, got ",
                   key.size(2), " and ", value.size(2));
    q = project(query, q_proj_weight, detail::projection_rows(in_proj_bias, 0, e));
    k = project(key, k_proj_weight, detail::projection_rows(in_proj_bias, e, 2 * e));
    v = project(value, v_proj_weight, detail::projection_rows(in_proj_bias, 2 * e));
  }
  q = q * (1 / std::sqrt(static_cast<double>(head_dim)));
  at::Tensor mask = attn_mask, padding = key_padding_mask;
  if (bias_k.defined() && bias_v.defined()) {
    k = at::cat({k, bias_k.repeat({1, bsz, 1})});
    v = at::cat({v, bias_v.repeat({1, bsz, 1})});
    mask = detail::padded_mask(mask);
    padding = detail::padded_mask(padding);
  }
  q = q.contiguous().view({tgt_len, bsz * heads, head_dim}).transpose(0, 1);
  k = k.contiguous().view({-1, bsz * heads, head_dim}).transpose(0, 1);
  v = v.contiguous().view({-1, bsz * heads, head_dim}).transpose(0, 1);
  std::int64_t src_len = k.size(1);
  DROPIT_EXPECTS(!padding.defined() ||
                     (padding.dim() == 2 && padding.size(0) == bsz && padding.size(1) == src_len),
                 "torch::MultiheadAttention: key_padding_mask must be [N, S] = [", bsz, ", ",
                 src_len, "]");
  if (options.add_zero_attn()) {
    ++src_len;
    k = detail::with_zero_key(k);
    v = detail::with_zero_key(v);
    mask = detail::padded_mask(mask);
    padding = detail::padded_mask(padding);
  }
  // Heads as a dimension of their own, so that the padding mask broadcasts: [N, heads, *, *].
  // With no store and no dropout bits, attention_with_weights runs LibTorch's ops (no pack).
  const auto heads_apart = [&](const at::Tensor& t) {
    return t.view({bsz, heads, t.size(1), head_dim});
  };
  attention_options o;
  o.mask = mask;  // [L, S]: broadcast over batch and heads, as LibTorch's unsqueeze(0)
  if (padding.defined()) o.masked = padding.view({bsz, 1, 1, src_len});
  o.dropout = is_training() ? options.dropout() : 0.0;
  o.dropout_bits = bits;
  const auto r =
      detail::attention_with_weights(heads_apart(q), heads_apart(k), heads_apart(v), ps, pm, o);
  at::Tensor out = r.first.view({bsz * heads, tgt_len, head_dim})
                       .transpose(0, 1)
                       .contiguous()
                       .view({tgt_len, bsz, e});
  out = project(out, out_proj->weight, out_proj->bias);
  if (!need_weights) return {out, at::Tensor()};
  at::Tensor weights = r.second;  // [N, heads, L, S]
  if (average_attn_weights) weights = weights.sum(1) / heads;
  return {out, weights};
}

inline std::shared_ptr<::torch::nn::Module> MultiheadAttentionImpl::clone(
    const c10::optional<c10::Device>& device) const {
  auto copy = std::make_shared<MultiheadAttentionImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->set_store(store_);
  detail::copy_parameters(*this, *copy, device);
  detail::copy_parameters(*out_proj, *copy->out_proj, device);
  copy->train(is_training());
  return copy;
}

inline void MultiheadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::MultiheadAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", ";
  print_policy(stream);
  if (store_.softmax || store_.matmul || store_.dropout) {
    stream << ", softmax ";
    print_store(stream, store_.softmax);
    stream << ", matmul ";
    print_store(stream, store_.matmul);
    stream << ", dropout store=" << (store_.dropout ? "bits" : "off");
  }
  stream << ")";
}

}  // namespace dropit::torch
