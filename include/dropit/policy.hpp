/**
 * @file policy.hpp
 * @brief What to keep of a saved tensor: `MinK`, `Random`, `Identity`, and the `policy_for`
 * concept that a user's own policy meets.
 *
 * gamma is the fraction DROPPED (the DropIT paper's convention). Of n elements a policy keeps
 * `k = n - floor(n * gamma + 1e-6)`; the epsilon makes decimal gammas give the count a person
 * expects (n = 10, gamma = 0.9 keeps 1). Every policy maps each element to an unsigned key, and the
 * selection rule is the same for all: keep the k largest keys; among equal keys, the lowest indices
 * first. gamma is a compile-time template argument (`MinK<0.9>`) or a runtime value
 * (`MinK<>{0.9}`).
 */
#pragma once

#include <dropit/detail/config.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dropit {

/// The template argument that makes a policy's gamma a runtime value: `MinK<>` is
/// `MinK<dynamic_gamma>` and is constructed as `MinK<>{0.9}`.
inline constexpr double dynamic_gamma = -1.0;

/**
 * @brief An element type dropit packs: `float`, `double`, and, when the CUDA toolkit's headers are
 * found, `__half` and `__nv_bfloat16`.
 */
template <class T>
concept element = requires {
  typename detail::float_traits<T>::bits;
};

/**
 * @brief What a selection policy provides, for element type T.
 *
 * - `p.kept(n)`: how many of n elements to keep (at most n);
 * - `p.key(x, i)`: a `noexcept` unsigned key for element x at index i, callable on host and (when
 *   the policy is used with the CUDA executor) on device; the k largest keys are kept, ties lowest
 *   index first;
 * - optionally `p.restore_scale(n, k)`: a factor restore applies to the kept values.
 *
 * A policy is a small trivially copyable value: it is passed by value to device kernels.
 */
template <class P, class T>
concept policy_for = element<T> && std::is_trivially_copyable_v<P> && std::copy_constructible<P> &&
    requires(const P& p, std::size_t n, T x) {
  { p.kept(n) } -> std::convertible_to<std::size_t>;
  // noexcept: keys are computed on worker threads and in device kernels, where an exception
  // could not reach the caller.
  { p.key(x, n) }
  noexcept->std::unsigned_integral;
};

/// @brief Policies that scale the restored values (Random's unbiased mode).
template <class P>
concept has_restore_scale = requires(const P& p, std::size_t n) {
  { p.restore_scale(n, n) } -> std::convertible_to<double>;
};

namespace detail {

/// Throws unless gamma is in [0, 1] (NaN fails too); `who` names the policy in the message.
inline void check_gamma(const char* who, double gamma) {
  DROPIT_EXPECTS(gamma >= 0.0 && gamma <= 1.0, who, ": gamma must be in [0, 1], got ", gamma);
}

/// `n - floor(n * gamma + 1e-6)`, clamped to [0, n].
[[nodiscard]] constexpr std::size_t kept_count(std::size_t n, double gamma) noexcept {
  const double dropped = static_cast<double>(n) * gamma + 1e-6;
  if (dropped >= static_cast<double>(n)) return 0;
  return n - static_cast<std::size_t>(dropped);
}

/// Holds gamma: a constant for `Gamma` in [0, 1], a checked member for `dynamic_gamma`.
template <double Gamma>
class gamma_holder {
  static_assert(Gamma >= 0.0 && Gamma <= 1.0, "dropit: gamma must be in [0, 1]");

 public:
  [[nodiscard]] static constexpr double gamma() noexcept { return Gamma; }

 protected:
  constexpr gamma_holder() noexcept = default;
};

template <>
class gamma_holder<dynamic_gamma> {
 public:
  [[nodiscard]] constexpr double gamma() const noexcept { return gamma_; }

 protected:
  gamma_holder(const char* who, double gamma) : gamma_(gamma) { check_gamma(who, gamma); }

 private:
  double gamma_;
};

/// splitmix64's finaliser's multipliers, and the golden-ratio step between Random's indices: the
/// host's vector kernels (detail/host/classify.hpp) compute Random's key from these too.
inline constexpr std::uint64_t mix64_m1 = 0xbf58476d1ce4e5b9ull;
inline constexpr std::uint64_t mix64_m2 = 0x94d049bb133111ebull;
inline constexpr std::uint64_t random_golden = 0x9e3779b97f4a7c15ull;

/// splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
DROPIT_HD constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * mix64_m1;
  z = (z ^ (z >> 27)) * mix64_m2;
  return z ^ (z >> 31);
}

}  // namespace detail

/**
 * @brief Keeps the `1 - gamma` fraction of elements with the largest magnitude (DropIT's min-k).
 *
 * Ties keep the lowest indices first; NaN ranks above +Inf; -0 equals +0.
 * @tparam Gamma the dropped fraction in [0, 1], or `dynamic_gamma` for a runtime value.
 */
template <double Gamma = dynamic_gamma>
class MinK : public detail::gamma_holder<Gamma> {
 public:
  /// Compile-time gamma: `MinK<0.9>{}`.
  constexpr MinK() noexcept requires(Gamma != dynamic_gamma) = default;

  /**
   * @brief Runtime gamma: `MinK<>{0.9}`.
   * @throw dropit::error if gamma is outside [0, 1] or NaN.
   */
  explicit MinK(double gamma) requires(Gamma == dynamic_gamma)
      : detail::gamma_holder<Gamma>("MinK", gamma) {}

  /// @brief Number of elements kept out of n.
  [[nodiscard]] constexpr std::size_t kept(std::size_t n) const noexcept {
    return detail::kept_count(n, this->gamma());
  }

  /// @brief The magnitude key: larger |x| gives a larger key.
  template <element T>
  [[nodiscard]] DROPIT_HD auto key(T x, std::size_t /*index*/) const noexcept {
    return detail::magnitude_key(x);
  }
};

/// @brief Whether `Random` scales restored values by n / k (unbiased in expectation) or not.
enum class scaling : std::uint8_t {
  none,     ///< kept values are restored as they were (the default)
  unbiased  ///< kept values are multiplied by n / k on restore
};

/**
 * @brief Keeps exactly k uniformly random positions, chosen by a counter-based hash of
 * (seed, index): the same seed gives the same positions on any executor and any thread count.
 *
 * Draw new positions for each training step by giving each step its own seed (`set_seed`).
 * @tparam Gamma the dropped fraction in [0, 1], or `dynamic_gamma` for a runtime value.
 */
template <double Gamma = dynamic_gamma>
class Random : public detail::gamma_holder<Gamma> {
 public:
  /// Compile-time gamma with seed 0: `Random<0.9>{}`.
  constexpr Random() noexcept requires(Gamma != dynamic_gamma) : Random(0) {}

  /// Compile-time gamma: `Random<0.9>{seed}`.
  explicit constexpr Random(std::uint64_t seed, scaling mode = scaling::none) noexcept
      requires(Gamma != dynamic_gamma)
      : seed_(seed), salt_(detail::mix64(seed)), mode_(mode) {}

  /**
   * @brief Runtime gamma: `Random<>{0.9, seed}`.
   * @throw dropit::error if gamma is outside [0, 1] or NaN.
   */
  explicit Random(double gamma, std::uint64_t seed = 0,
                  scaling mode = scaling::none) requires(Gamma == dynamic_gamma)
      : detail::gamma_holder<Gamma>("Random", gamma),
        seed_(seed),
        salt_(detail::mix64(seed)),
        mode_(mode) {}

  /// @brief Number of elements kept out of n.
  [[nodiscard]] constexpr std::size_t kept(std::size_t n) const noexcept {
    return detail::kept_count(n, this->gamma());
  }

  /// @brief A pseudo-random key that depends only on (seed, index).
  template <element T>
  [[nodiscard]] DROPIT_HD std::uint32_t key(T /*x*/, std::size_t index) const noexcept {
    return static_cast<std::uint32_t>(
        detail::mix64(salt_ + static_cast<std::uint64_t>(index) * detail::random_golden) >> 32);
  }

  /// @brief n / k in `scaling::unbiased` mode (1 when k is 0), else 1.
  [[nodiscard]] constexpr double restore_scale(std::size_t n, std::size_t k) const noexcept {
    return mode_ == scaling::unbiased && k != 0 ? static_cast<double>(n) / static_cast<double>(k)
                                                : 1.0;
  }

  /// @brief The seed the positions derive from.
  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }
  /// @brief Chooses the positions of later packs from a new seed.
  constexpr void set_seed(std::uint64_t seed) noexcept {
    seed_ = seed;
    salt_ = detail::mix64(seed);
  }
  /// @brief The restore scaling mode.
  [[nodiscard]] constexpr scaling mode() const noexcept { return mode_; }

 private:
  std::uint64_t seed_;
  std::uint64_t salt_;  ///< mix64(seed), hoisted out of the per-element key
  scaling mode_;
};

/// @brief Keeps every element (a dense copy, no positions stored): the baseline.
struct Identity {
  /// @brief 0: nothing is dropped.
  [[nodiscard]] static constexpr double gamma() noexcept { return 0.0; }
  /// @brief n: everything is kept.
  [[nodiscard]] static constexpr std::size_t kept(std::size_t n) noexcept { return n; }
  /// @brief Every key is equal; with k = n the selection never looks at it.
  template <element T>
  [[nodiscard]] DROPIT_HD static constexpr std::uint8_t key(T, std::size_t) noexcept {
    return 0;
  }
};

}  // namespace dropit
