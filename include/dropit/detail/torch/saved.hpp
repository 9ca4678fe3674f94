/**
 * @file saved.hpp
 * @brief What dropit's autograd functions save: a type-erased `SparseCache` for a tensor, and bit
 * masks, each owned by a uint8/int32 tensor whose storage deleter frees it.
 *
 * Owning the payload through a tensor lets `ctx->save_for_backward` hold it: LibTorch then frees it
 * right after the node's backward (or keeps it with `retain_graph`), exactly like a saved tensor.
 */
#pragma once

#include <dropit/detail/torch/kept_product.hpp>
#include <dropit/detail/torch/restore_range.hpp>
#include <dropit/exec/host.hpp>
#include <dropit/sparse_cache.hpp>
#include <dropit/torch/memory_resource.hpp>
#include <dropit/torch/policy.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <variant>

namespace dropit::torch::detail {

template <class T>
struct type_tag {
  using type = T;
};

/// Calls f(type_tag<T>{}) with T the dropit element type of a LibTorch dtype.
template <class F>
decltype(auto) dispatch_element(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat:
      return f(type_tag<float>{});
    case at::kDouble:
      return f(type_tag<double>{});
#if DROPIT_HAS_HALF
    case at::kHalf:
      return f(type_tag<__half>{});
    case at::kBFloat16:
      return f(type_tag<__nv_bfloat16>{});
#endif
    default:
      break;
  }
  dropit::detail::throw_error("torch: no dropit element type for dtype ", c10::toString(dtype),
                              DROPIT_HAS_HALF ? " (float, double, half and bfloat16 are supported)"
                                              : " (float and double are supported; half and "
                                                "bfloat16 need the CUDA toolkit's headers)");
}

/// Throws unless x lives where an executor can pack it (CPU, strided).
inline void check_packable(const at::Tensor& x, const char* who) {
  DROPIT_EXPECTS(x.layout() == at::kStrided, "torch::", who,
                 ": only strided tensors are supported, got layout ", x.layout());
  DROPIT_EXPECTS(x.device().is_cpu(), "torch::", who, ": tensors on ", x.device().str(),
                 " are not supported: this build has only the host executor; use the CPU or "
                 "policy none");
}

/**
 * Throws what LibTorch's own in-place op would, as a dropit::error, when autograd forbids writing
 * x (which requires grad) in place: a leaf or a view of one; a view made by a custom Function (a
 * full backward hook's input, say), by an op with several view outputs, or in no_grad mode. An
 * autograd Function's mark_dirty fails an internal assertion on those views instead.
 */
inline void check_in_place(const at::Tensor& x, const char* who) {
  auto* view = ::torch::autograd::impl::get_view_autograd_meta(x);
  if (view != nullptr && view->has_bw_view()) {
    try {
      ::torch::autograd::handle_view_on_rebase(view);
    } catch (const c10::Error& e) {
      dropit::detail::throw_error("torch::", who, ": ", e.what_without_backtrace());
    }
    DROPIT_EXPECTS(!(x.requires_grad() && x._base().is_leaf()), "torch::", who,
                   ": a view of a leaf Variable that requires grad is being used in an in-place "
                   "operation.");
  }
  DROPIT_EXPECTS(!(x.requires_grad() && x.is_leaf()), "torch::", who,
                 ": a leaf Variable that requires grad is being used in an in-place operation.");
}

/// The executor for CPU tensors: LibTorch's thread count, payloads from LibTorch's allocator.
[[nodiscard]] inline host_executor torch_host_executor() {
  return host_executor{.threads = static_cast<unsigned>(at::get_num_threads()),
                       .resource = &cpu_resource()};
}

/// A SparseCache of any supported element type and policy.
class any_cache {
 public:
  /// Packs x (contiguous, CPU) with policy p.
  void pack(const at::Tensor& x, const policy& p) {
    with_new(x.scalar_type(), p, [&](auto c) {
      using T = typename decltype(c)::value_type;
      c.pack(torch_host_executor(), std::span<const T>(static_cast<const T*>(x.data_ptr()),
                                                       static_cast<std::size_t>(x.numel())));
      cache_ = std::move(c);
    });
  }

  /// Takes a payload of `dtype` elements packed with policy p (`SparseCache::load`: checked).
  void load(at::ScalarType dtype, const policy& p, std::size_t n, std::size_t k,
            position_encoding positions, std::span<const std::byte> bytes) {
    with_new(dtype, p, [&](auto c) {
      c.load(torch_host_executor(), n, k, positions, bytes);
      cache_ = std::move(c);
    });
  }

  /// The policy the cache held was packed with (kind, gamma, seed, codec, position choice).
  [[nodiscard]] policy packed_with() const {
    policy p;
    with_held([&](const auto& c) {
      using C = std::decay_t<decltype(c)>;
      using P = typename C::policy_type;
      p.codec = C::codec_type::kind;
      p.positions = c.positions();
      if constexpr (std::is_same_v<P, MinK<>>) {
        p.kind = policy_kind::mink;
        p.gamma = c.policy().gamma();
      } else if constexpr (std::is_same_v<P, Random<>>) {
        p.kind = policy_kind::random;
        p.gamma = c.policy().gamma();
        p.seed = c.policy().seed();
      } else {
        p.kind = policy_kind::identity;
      }
    });
    return p;
  }

  /// The layout of the payload held.
  [[nodiscard]] packed_layout layout() const {
    packed_layout l;
    with_held([&](const auto& c) { l = c.layout(); });
    return l;
  }

  /// Writes the dense tensor into out (contiguous, CPU, size() elements of the packed dtype).
  void restore(const at::Tensor& out) const {
    with_held([&](const auto& c) {
      using T = typename std::decay_t<decltype(c)>::value_type;
      c.restore(torch_host_executor(), std::span<T>(static_cast<T*>(out.data_ptr()), c.size()));
    });
  }

  /// Writes elements [begin, end) of the dense tensor to out[0, end - begin) (CPU memory of the
  /// packed dtype).
  void restore_range(std::size_t begin, std::size_t end, void* out) const {
    with_held([&](const auto& c) {
      using T = typename std::decay_t<decltype(c)>::value_type;
      DROPIT_EXPECTS(begin <= end && end <= c.size(), "torch: restore range [", begin, ", ", end,
                     ") outside the cache's ", c.size(), " elements");
      detail::restore_range(c.layout(), c.payload().data(), c.restore_scale(), begin, end,
                            static_cast<T*>(out));
    });
  }

  /**
   * x^T g2 straight from the payload (kept_product.hpp) into a new `acc` [in, out], x the packed
   * [rows, in] matrix and g2 [rows, out] (CPU, the packed dtype): for an fp32 or fp64 payload
   * (exact or 8-bit values) with positions, where `path` is `kept` or `kept_product_pays`; false
   * (acc untouched) otherwise, and the caller rebuilds x.
   */
  [[nodiscard]] bool kept_product(const at::Tensor& g2, std::size_t in, at::Tensor& acc,
                                  weight_grad_path path = weight_grad_path::cheaper) const {
    bool done = false;
    with_held([&](const auto& c) {
      using T = typename std::decay_t<decltype(c)>::value_type;
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        const packed_layout& l = c.layout();
        if (path == weight_grad_path::rebuild || l.positions == position_encoding::none ||
            g2.dim() != 2 || g2.scalar_type() != c10::CppTypeToScalarType<T>::value || in == 0 ||
            static_cast<std::size_t>(g2.size(0)) * in != l.n) {
          return;
        }
        const auto out = static_cast<std::size_t>(g2.size(1));
        if (path == weight_grad_path::cheaper && !kept_product_pays(l.n, l.k, in, out)) return;
        const at::Tensor g = g2.contiguous();
        acc = at::empty({static_cast<std::int64_t>(in), g.size(1)}, g.options());
        detail::kept_product<T>(l, c.payload().data(), c.restore_scale(), in, out, g.data_ptr<T>(),
                                acc.data_ptr<T>(), static_cast<unsigned>(at::get_num_threads()));
        done = true;
      }
    });
    return done;
  }

  /// Elements of the packed tensor.
  [[nodiscard]] std::size_t size() const noexcept {
    return held_or(std::size_t{0}, [](const auto& c) { return c.size(); });
  }

  /// Payload bytes held.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return held_or(std::size_t{0}, [](const auto& c) { return c.bytes(); });
  }

  /// Elements kept.
  [[nodiscard]] std::size_t kept() const noexcept {
    return held_or(std::size_t{0}, [](const auto& c) { return c.kept(); });
  }

  /// The first payload byte (null when empty).
  [[nodiscard]] const std::byte* data() const noexcept {
    return held_or(static_cast<const std::byte*>(nullptr),
                   [](const auto& c) { return c.payload().data(); });
  }

 private:
  /// `f(cache)` on the cache held; a `dropit::error` when none is.
  template <class F>
  void with_held(F f) const {
    std::visit(
        [&](const auto& c) {
          if constexpr (std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) {
            dropit::detail::throw_error("torch: restore of an empty cache");
          } else {
            f(c);
          }
        },
        cache_);
  }

  /// `f(cache)` of the cache held, or `empty` when none is.
  template <class R, class F>
  [[nodiscard]] R held_or(R empty, F f) const noexcept {
    return std::visit(
        [&](const auto& c) -> R {
          if constexpr (std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) {
            return empty;
          } else {
            return f(c);
          }
        },
        cache_);
  }

  /// `f(cache)` with a new, empty SparseCache of `dtype`'s element type, p's policy and codec.
  template <class F>
  static void with_new(at::ScalarType dtype, const policy& p, F f) {
    dispatch_element(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto with_codec = [&](const auto& selection) {
        using P = std::decay_t<decltype(selection)>;
        switch (p.codec) {
          case value_codec::int8:
            return f(SparseCache<T, P, codec::int8>{selection, {}, p.positions});
          case value_codec::fp8_e4m3:
            return f(SparseCache<T, P, codec::fp8_e4m3>{selection, {}, p.positions});
          default:
            return f(SparseCache<T, P, codec::exact>{selection, {}, p.positions});
        }
      };
      switch (p.kind) {
        case policy_kind::mink:
          return with_codec(MinK<>{p.gamma});
        case policy_kind::random:
          return with_codec(Random<>{p.gamma, p.seed});
        default:
          return with_codec(Identity{});
      }
    });
  }

  /// Type lists as variants, joined.
  template <class... Vs>
  struct join;
  template <class... A>
  struct join<std::variant<A...>> {
    using type = std::variant<A...>;
  };
  template <class... A, class... B, class... Rest>
  struct join<std::variant<A...>, std::variant<B...>, Rest...> {
    using type = typename join<std::variant<A..., B...>, Rest...>::type;
  };
  /// Every SparseCache of an element type and policy, over the three codecs.
  template <class T, class P>
  using codecs = std::variant<SparseCache<T, P, codec::exact>, SparseCache<T, P, codec::int8>,
                              SparseCache<T, P, codec::fp8_e4m3>>;
  /// ... and over the three policies.
  template <class T>
  using policies = typename join<codecs<T, Identity>, codecs<T, MinK<>>, codecs<T, Random<>>>::type;

  typename join<std::variant<std::monostate>, policies<float>, policies<double>
#if DROPIT_HAS_HALF
                ,
                policies<__half>, policies<__nv_bfloat16>
#endif
                >::type cache_;
};

/// Owner of something a saved tensor's storage points into; deleted with the storage.
struct saved_box {
  virtual ~saved_box() = default;
};

/// A packed input.
struct cache_box final : saved_box {
  any_cache cache;
  at::ScalarType dtype = at::kFloat;                       ///< of the packed tensor
  at::MemoryFormat format = at::MemoryFormat::Contiguous;  ///< element order of the packing
  std::size_t counted = 0;                                 ///< bytes added to counters().sparse
  ~cache_box() override { counters().sparse.fetch_sub(counted, std::memory_order_relaxed); }
};

/// A bit mask allocated from LibTorch's CPU allocator.
struct mask_box final : saved_box {
  c10::DataPtr block;
  std::size_t counted = 0;  ///< bytes added to counters().masks
  ~mask_box() override { counters().masks.fetch_sub(counted, std::memory_order_relaxed); }
};

inline void delete_box(void* box) noexcept {
  delete static_cast<saved_box*>(box);
}

/// A 1-d tensor of `numel` dtype elements at `data` whose storage owns `box`.
[[nodiscard]] inline at::Tensor box_tensor(std::unique_ptr<saved_box> box, void* data,
                                           std::size_t bytes, at::ScalarType dtype,
                                           std::int64_t numel) {
  c10::DataPtr ptr(data, box.get(), &delete_box, c10::Device(c10::kCPU));
  (void)box.release();  // the DataPtr owns it from here on
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), nullptr, false);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  t.set_(std::move(storage), 0, {numel}, {1});
  return t;
}

/// The box a `box_tensor` owns.
template <class Box>
[[nodiscard]] const Box& box_of(const at::Tensor& t) {
  const auto* base = static_cast<const saved_box*>(t.storage().data_ptr().get_context());
  const auto* box = dynamic_cast<const Box*>(base);
  DROPIT_EXPECTS(box != nullptr, "torch: a saved tensor is not one of dropit's");
  return *box;
}

/// The memory order x's elements can be packed in without a copy (contiguous or channels-last),
/// or Contiguous when x needs a copy first.
[[nodiscard]] inline at::MemoryFormat packing_format(const at::Tensor& x) {
  if (x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return at::MemoryFormat::ChannelsLast;
  }
  return at::MemoryFormat::Contiguous;
}

/// Packs x with policy p, in x's memory order when it is dense (contiguous or channels-last),
/// into a tensor that owns the cache.
[[nodiscard]] inline at::Tensor save_packed(const at::Tensor& x, const policy& p) {
  check_packable(x, "save");
  const at::MemoryFormat format = packing_format(x);
  const at::Tensor xc = x.contiguous(format);
  auto box = std::make_unique<cache_box>();
  box->cache.pack(xc, p);
  box->dtype = x.scalar_type();
  box->format = format;
  box->counted = box->cache.bytes();
  counters().sparse.fetch_add(box->counted, std::memory_order_relaxed);
  void* data = const_cast<std::byte*>(box->cache.data());
  const std::size_t bytes = box->cache.bytes();
  return box_tensor(std::move(box), data, bytes, at::kByte, static_cast<std::int64_t>(bytes));
}

/**
 * Rebuilds part of a `save_packed` tensor: the elements of `sizes` starting at element `offset`
 * of the packing order (whole leading-dimension slices: rows, samples), in the saved dtype and
 * memory format.
 */
[[nodiscard]] inline at::Tensor restore_packed(const at::Tensor& saved, at::IntArrayRef sizes,
                                               std::size_t offset = 0) {
  const cache_box& box = box_of<cache_box>(saved);
  const at::MemoryFormat format = sizes.size() == 4 ? box.format : at::MemoryFormat::Contiguous;
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(box.dtype).memory_format(format));
  const auto count = static_cast<std::size_t>(out.numel());
  if (offset == 0 && count == box.cache.size()) {
    box.cache.restore(out);
  } else {
    box.cache.restore_range(offset, offset + count, out.data_ptr());
  }
  return out;
}

/// An int32 tensor of `words` uninitialised words, counted as mask bytes.
[[nodiscard]] inline at::Tensor make_mask(std::int64_t words) {
  const std::size_t bytes = static_cast<std::size_t>(words) * sizeof(std::int32_t);
  auto box = std::make_unique<mask_box>();
  box->block = c10::GetCPUAllocator()->allocate(bytes);
  box->counted = bytes;
  counters().masks.fetch_add(bytes, std::memory_order_relaxed);
  void* data = box->block.get();
  return box_tensor(std::move(box), data, bytes, at::kInt, words);
}

}  // namespace dropit::torch::detail
