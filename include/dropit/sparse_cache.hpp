/**
 * @file sparse_cache.hpp
 * @brief `SparseCache<T, Policy>`: holds the kept part of a saved tensor between forward and
 * backward, and rebuilds the dense tensor on request.
 */
#pragma once

#include <dropit/codec.hpp>
#include <dropit/detail/payload.hpp>
#include <dropit/detail/payload_check.hpp>
#include <dropit/error.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <cstddef>
#include <span>

namespace dropit {

/**
 * @brief An executor that can pack element type T with policy P: `dropit::host` (exec/host.hpp),
 * `dropit::cuda_executor` (exec/cuda.cuh).
 *
 * It states where its payloads live (`E::space`), packs into a new payload and restores from one.
 */
template <class E, class T, class P, class C = codec::exact>
concept executor_for = requires(const E& e, const P& p, const C& c, const T* x, T* out,
                                const packed_layout& layout, const detail::payload& payload) {
  { E::space } -> std::convertible_to<memory_space>;
  { e.template pack<T>(p, c, x, layout) } -> std::same_as<detail::payload>;
  e.restore(payload, layout, out, 1.0);
};

/**
 * @brief An executor that can take a payload from host bytes: `dropit::host`,
 * `dropit::cuda_executor`. `copy_in` returns a new payload of the executor's memory space holding
 * a copy of the bytes, and throws dropit::error for bytes the host cannot read (device memory).
 */
template <class E>
concept payload_loader = requires(const E& e, std::span<const std::byte> bytes) {
  { e.copy_in(bytes) } -> std::same_as<detail::payload>;
};

/**
 * @brief The sparsified form of one saved tensor: the values a policy keeps plus their positions
 * (see format.hpp), packed by an executor and restored into a dense tensor with zeros elsewhere.
 *
 * @code
 * dropit::SparseCache<float, dropit::MinK<0.9>> cache;
 * cache.pack(dropit::host, x);        // forward: keep the 10% largest |x|
 * cache.restore(dropit::host, xr);    // backward: xr = x where kept, 0 elsewhere
 * @endcode
 *
 * A cache is move-only. It is `empty()` until the first pack and after `clear()` or a move from
 * it; a packed zero-length tensor is not empty (it restores into a zero-length span).
 * Every member function gives the strong guarantee: a call that throws leaves the cache as it was.
 * A cache is not safe to pack from two threads at once; restores of one cache may run
 * concurrently.
 *
 * With a quantized codec (`SparseCache<float, MinK<0.9>, codec::int8>`) the kept values are
 * stored in 8 bits with a scale per 1024 of them (codec.hpp), and restore writes their decoded
 * values.
 *
 * @tparam T element type: float, double, __half, __nv_bfloat16
 * @tparam Policy what to keep: MinK, Random, Identity, or any type meeting `policy_for<Policy, T>`
 * @tparam Codec how kept values are stored: `codec::exact` (the default), `codec::int8`,
 * `codec::fp8_e4m3`
 */
template <element T, class Policy, value_codec_type Codec = codec::exact>
requires policy_for<Policy, T>
class SparseCache {
 public:
  using value_type = T;        ///< element type
  using policy_type = Policy;  ///< selection policy
  using codec_type = Codec;    ///< value codec

  /// @brief An empty cache with a default policy (`MinK<0.9>`, `Identity`, ...).
  SparseCache() noexcept(
      std::is_nothrow_default_constructible_v<Policy>) requires std::default_initializable<Policy>
  = default;

  /// @brief An empty cache with the given policy (`SparseCache<float, MinK<>> c{MinK<>{0.9}}`),
  /// codec (`c{MinK<>{0.9}, codec::int8{.stochastic = true, .seed = step}}`) and choice of
  /// position encodings (`position_choice::no_elias_fano`: a faster pack and restore, more bytes).
  explicit SparseCache(const Policy& policy, const Codec& codec = {},
                       position_choice positions = position_choice::smallest) noexcept
      : policy_(policy), codec_(codec), positions_(positions) {}

  SparseCache(const SparseCache&) = delete;
  SparseCache& operator=(const SparseCache&) = delete;
  /// @brief Takes other's payload; other is left empty.
  SparseCache(SparseCache&& other) noexcept;
  /// @brief Frees this cache's payload and takes other's; other is left empty.
  SparseCache& operator=(SparseCache&& other) noexcept;
  ~SparseCache() = default;

  /**
   * @brief Keeps what the policy selects of x; replaces any previous content.
   *
   * On the host executor the call returns when the payload is complete; on the CUDA executor it
   * is stream-ordered (see exec/cuda.cuh).
   * @param exec `dropit::host`, a configured `host_executor`, or `dropit::cuda_executor{stream}`
   * @param x the dense tensor, in the executor's memory space
   * @throw dropit::error if x has a null data pointer and a non-zero size, if the policy keeps
   * more than x.size() elements, or what the executor throws (allocation, CUDA errors); the cache
   * is then unchanged.
   */
  template <class Exec>
  requires executor_for<Exec, T, Policy, Codec>
  void pack(const Exec& exec, std::span<const T> x);

  /**
   * @brief Writes the dense tensor: kept values at their positions (times the policy's restore
   * scale, if it has one), zeros elsewhere.
   * @param exec an executor of the memory space the payload lives in
   * @param out size() elements, in that memory space
   * @throw dropit::error if the cache is empty, if out.size() != size(), if out has a null data
   * pointer and a non-zero size, or if exec works in another memory space than the payload.
   */
  template <class Exec>
  requires executor_for<Exec, T, Policy, Codec>
  void restore(const Exec& exec, std::span<T> out) const;

  /**
   * @brief Takes a payload that another cache of this element type and codec packed: its
   * `payload()` bytes (in host memory, e.g. read back from a file or another process) with its
   * `size()`, `kept()` and `layout().positions`. Restore then writes what the other cache's
   * restore writes, scaled as this cache's policy says for n and k.
   *
   * The bytes are checked first to be laid out exactly as a pack lays a payload out (format.hpp):
   * the size the layout gives, zero padding, and positions that decode to k strictly ascending
   * indices below n with consistent block offsets; values and scales may be any bits. So no input,
   * however corrupt, makes a restore read or write out of bounds.
   * @code
   * dropit::SparseCache<float, dropit::MinK<>> a{dropit::MinK<>{0.9}}, b{dropit::MinK<>{0.9}};
   * a.pack(dropit::host, x);
   * std::vector<std::byte> saved(a.payload().begin(), a.payload().end());
   * b.load(dropit::host, a.size(), a.kept(), a.layout().positions, saved);
   * @endcode
   * @throw dropit::error if k > n, if no pack of n and k stores its positions as `positions`, if
   * the bytes are not such a payload, or what the executor throws (allocation); the cache is then
   * unchanged.
   */
  template <class Exec>
  requires executor_for<Exec, T, Policy, Codec> && payload_loader<Exec>
  void load(const Exec& exec, std::size_t n, std::size_t k, position_encoding positions,
            std::span<const std::byte> bytes);

  /// @brief Elements of the packed tensor (n); 0 when empty.
  [[nodiscard]] std::size_t size() const noexcept { return layout_.n; }
  /// @brief Elements kept (k); 0 when empty.
  [[nodiscard]] std::size_t kept() const noexcept { return layout_.k; }
  /// @brief Bytes of payload held (values, positions, block offsets, section padding).
  [[nodiscard]] std::size_t bytes() const noexcept { return payload_.bytes(); }
  /// @brief True until the first pack, and after clear() or a move from this cache.
  [[nodiscard]] bool empty() const noexcept { return !packed_; }
  /// @brief Frees the payload; the cache is then empty.
  void clear() noexcept;

  /// @brief The layout of the payload held (sizes of each section, position encoding).
  [[nodiscard]] const packed_layout& layout() const noexcept { return layout_; }
  /// @brief The raw payload bytes, in `space()` memory (device memory for CUDA packs).
  [[nodiscard]] std::span<const std::byte> payload() const noexcept {
    return {payload_.data(), payload_.bytes()};
  }
  /// @brief Where the payload lives.
  [[nodiscard]] memory_space space() const noexcept { return payload_.space(); }
  /// @brief The factor restore applies to kept values (1 unless the policy scales).
  [[nodiscard]] double restore_scale() const noexcept { return scale_; }

  /// @brief The policy; changes to it (a new seed, a new gamma) apply from the next pack.
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  /// @copydoc policy() const
  [[nodiscard]] Policy& policy() noexcept { return policy_; }
  /// @brief Which position encodings a pack chooses from (format.hpp); a change applies from the
  /// next pack.
  [[nodiscard]] position_choice positions() const noexcept { return positions_; }
  /// @copydoc positions() const
  [[nodiscard]] position_choice& positions() noexcept { return positions_; }
  /// @brief The codec; changes to it (int8's stochastic seed) apply from the next pack.
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  /// @copydoc codec() const
  [[nodiscard]] Codec& codec() noexcept { return codec_; }

 private:
  Policy policy_{};
  Codec codec_{};
  position_choice positions_ = position_choice::smallest;
  detail::payload payload_;
  packed_layout layout_{};
  double scale_ = 1.0;
  bool packed_ = false;
};

}  // namespace dropit

#include <dropit/detail/sparse_cache.inl>
