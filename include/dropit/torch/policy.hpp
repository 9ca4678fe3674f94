/**
 * @file policy.hpp
 * @brief `dropit::torch::policy`: the runtime policy of the LibTorch adapter (kind, gamma, seed),
 * read from a command line, and the live byte counts of what dropit's layers save.
 */
#pragma once

#include <dropit/codec.hpp>
#include <dropit/format.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dropit::torch {

/// @brief What a dropit layer does with the tensor it saves for backward.
enum class policy_kind : std::uint8_t {
  none,      ///< LibTorch's own path: the layer saves what the plain op saves
  identity,  ///< keeps the input exact: with the exact codec the input itself (no copy, backward
             ///< in dropit's pieces: what an excluded layer runs), else a dense pack with the codec
  mink,      ///< keeps the (1 - gamma) largest magnitudes (DropIT's min-k)
  random     ///< keeps (1 - gamma) of the positions, drawn anew at every training step
};

/**
 * @brief A runtime selection policy: `{policy_kind::mink, 0.9}`.
 *
 * Element-wise layers (`ReLU`, `MaxPool2d`) save a bit mask instead of a dense tensor whenever
 * the kind is not `none`; their result is exact whatever gamma is.
 */
struct policy {
  policy_kind kind = policy_kind::none;  ///< what to keep
  double gamma = 0.0;                    ///< fraction dropped, in [0, 1] (mink, random)
  std::uint64_t seed = 0;                ///< base seed of `random`; step s of a layer uses seed + s
  /// How the kept values are stored (codec.hpp): exact, or 8-bit codes (int8 rounds to nearest)
  value_codec codec = value_codec::exact;
  /// Which position encodings a pack chooses from (format.hpp): the smallest (the default), or
  /// no Elias-Fano code (a faster pack and restore, more bytes at high gamma)
  position_choice positions = position_choice::smallest;

  /// @brief Throws dropit::error unless gamma is in [0, 1] (checked for mink and random).
  void validate() const;
  /// @brief False for `none`: the layer runs LibTorch's plain op.
  [[nodiscard]] bool active() const noexcept { return kind != policy_kind::none; }

  /**
   * @brief Parses "none", "identity", "mink" or "random".
   * @throw dropit::error for another name or a gamma outside [0, 1].
   */
  [[nodiscard]] static policy parse(std::string_view kind, double gamma = 0.0,
                                    std::uint64_t seed = 0);
};

/// @brief The name `policy::parse` reads: "none", "identity", "mink", "random".
[[nodiscard]] std::string to_string(policy_kind kind);

/**
 * @brief Parses a value codec's name: "exact", "int8" or "fp8" (e4m3).
 * @throw dropit::error for another name.
 */
[[nodiscard]] value_codec parse_codec(std::string_view name);

/// @brief The name `parse_codec` reads: "exact", "int8", "fp8".
[[nodiscard]] std::string to_string(value_codec codec);

/**
 * @brief Parses a position choice: "smallest" or "no_elias_fano".
 * @throw dropit::error for another name.
 */
[[nodiscard]] position_choice parse_positions(std::string_view name);

/// @brief The name `parse_positions` reads: "smallest", "no_elias_fano".
[[nodiscard]] std::string to_string(position_choice positions);

/**
 * @brief Bytes held right now by what dropit's autograd functions saved for backward (live
 * graphs only; freed as backward consumes them).
 */
struct saved_bytes {
  std::size_t sparse = 0;  ///< SparseCache payloads of Linear, Conv2d, Conv1D
  std::size_t masks = 0;   ///< ReLU bit masks and MaxPool2d window indices
  /// @brief sparse + masks.
  [[nodiscard]] std::size_t total() const noexcept { return sparse + masks; }
};

/// @brief The bytes held now by dropit's saved tensors, process-wide.
[[nodiscard]] saved_bytes live_saved_bytes() noexcept;

/**
 * @brief Sets the size of the pieces in which dropit's layers rebuild a saved input in backward
 * (rows of a Linear/Conv1D input that is not summed from its kept elements alone, see `linear`;
 * samples of a Conv2d input) and in which Conv2d runs its
 * convolutions (forward and backward), so that no temporary grows with the batch beyond it.
 *
 * 0 means never split. The default is 1 MiB. A layer's output and input gradient are whole tensors
 * either way; splitting only bounds the rebuilt input and LibTorch's (oneDNN's) scratch copies.
 * Process-wide; takes effect at the next forward/backward call.
 */
void set_chunk_bytes(std::size_t bytes) noexcept;
/// @brief The current piece size (see `set_chunk_bytes`).
[[nodiscard]] std::size_t chunk_bytes() noexcept;

}  // namespace dropit::torch

#include <dropit/detail/torch/policy.inl>
