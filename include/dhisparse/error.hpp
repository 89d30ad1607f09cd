/**
 * @file error.hpp
 * @brief The library's exception type and argument-check macros (plain C++).
 *
 * One argument-check style (docs/integration.md, "Errors"):
 * - An argument struct or argument list that a launch-level function (`…_async`, `run`:
 *   they return `cudaError_t` and never throw) checks has one check function,
 *   `<name>_problem(…)`, returning `std::string`: empty when the arguments are valid, else
 *   `"<component>: <argument> …"` naming the first bad argument. The launch-level function
 *   returns `cudaErrorInvalidValue` when it reports anything (nothing is enqueued); a caller
 *   calls it for the message.
 * - Owning objects and host-side calls throw `dhisparse::error`:
 *   `DHISPARSE_EXPECTS_NO_PROBLEM(<name>_problem(…))` for such a check, and
 *   `DHISPARSE_EXPECTS(condition, message)` for a condition of their own.
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

/**
 * @brief Throws `dhisparse::error` with the message of a `…_problem` check unless it is
 *        empty, e.g. `DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(a))`.
 */
#define DHISPARSE_EXPECTS_NO_PROBLEM(problem)                                      \
  do {                                                                             \
    std::string const dhisparse_problem_ = (problem);                              \
    if (!dhisparse_problem_.empty()) {                                             \
      ::dhisparse::detail::throw_error(__FILE__, __LINE__, dhisparse_problem_);    \
    }                                                                              \
  } while (0)
