/**
 * @file error.hpp
 * @brief The exceptions dropit throws, and the one place that builds their messages.
 */
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dropit {

/**
 * @brief Thrown for bad input: a gamma outside [0, 1], a size mismatch on restore, a restore of an
 * empty cache, null data with a non-zero size, a host pointer given to the CUDA executor, a graph
 * the checkpoint planner cannot solve.
 *
 * The message names the problem and the offending value, e.g.
 * `dropit: MinK: gamma must be in [0, 1], got 1.5`. A call that throws leaves the object it was
 * called on as it was before the call.
 */
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/**
 * @brief Thrown when a CUDA runtime call fails; the message holds the file, the line, the call and
 * the CUDA error string.
 */
class cuda_error : public error {
 public:
  using error::error;
};

namespace detail {

/// Streams every argument into one string: `concat("got ", 1.5)` is "got 1.5".
template <class... Args>
[[nodiscard]] std::string concat(Args&&... args) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << std::forward<Args>(args));
  return out.str();
}

/// Throws `dropit::error("dropit: " + concat(args...))`; kept out of line of the callers' hot
/// paths.
template <class... Args>
[[noreturn]] void throw_error(Args&&... args) {
  throw error(concat("dropit: ", std::forward<Args>(args)...));
}

}  // namespace detail
}  // namespace dropit

/**
 * @brief Checks a precondition on the host and throws `dropit::error` with the message parts
 * (streamed together, prefixed with "dropit: ") when it fails.
 *
 * `DROPIT_EXPECTS(gamma >= 0, "MinK: gamma must be in [0, 1], got ", gamma);`
 */
#define DROPIT_EXPECTS(cond, ...)                 \
  do {                                            \
    if (!(cond)) [[unlikely]]                     \
      ::dropit::detail::throw_error(__VA_ARGS__); \
  } while (0)
