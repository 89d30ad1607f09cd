/**
 * @file error.hpp
 * @brief The library's exception type and argument-check macro (plain C++).
 */
#pragma once

#include <stdexcept>
#include <string>

namespace dhisparse {

/**
 * @brief Thrown by every owning / host-side API on bad input or a failed CUDA call.
 *
 * The message names the failing argument (or the CUDA call) and, for checks made by the
 * library, the source location.
 */
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void throw_error(const char* file, int line, const std::string& what)
{
  throw ::dhisparse::error(std::string("dhisparse: ") + what + " (" + file + ":" +
                           std::to_string(line) + ")");
}
}  // namespace detail
}  // namespace dhisparse

/**
 * @brief Throws `dhisparse::error` with `message` unless `condition` holds.
 *
 * `message` is any expression convertible to `std::string`; it should name the argument,
 * e.g. `DHISPARSE_EXPECTS(k <= max_k, "top_k (" + std::to_string(k) + ") exceeds max_top_k")`.
 */
#define DHISPARSE_EXPECTS(condition, message)                                  \
  do {                                                                         \
    if (!(condition)) {                                                        \
      ::dhisparse::detail::throw_error(__FILE__, __LINE__, std::string(message)); \
    }                                                                          \
  } while (0)
