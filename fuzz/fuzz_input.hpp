/**
 * @file fuzz_input.hpp
 * @brief What every fuzz harness shares: decoding typed values from the fuzzer's bytes,
 *        the exception a harness throws for a finding, buffers of exact size, and the
 *        libFuzzer entry point. The harnesses (`fuzz/<target>.hpp`) are plain C++ so the
 *        regression tests (tests/fuzz_regressions) replay inputs through them with any
 *        compiler.
 *
 * Outcomes of one input: returning normally (the library accepted it, or rejected it with
 * `dhisparse::error`, as it should) or a finding: `fuzz::finding` (a broken invariant),
 * any other exception (only `dhisparse::error` may leave the library), or a sanitizer
 * report (memory error, undefined behaviour, an allocation over libFuzzer's limit).
 *
 * Decoding (the seed generator fuzz/corpus/make_seeds.py writes the same): see
 * `input::integer`. Past the end of the data every read returns its lowest value.
 */
#pragma once

#include <dhisparse/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dhisparse::fuzz {

/// A broken invariant: what a harness throws when the library did something it must not.
class finding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Whether DHISPARSE_FUZZ_VERBOSE is set: harnesses then print what they do (triage).
inline bool verbose()
{
  static bool const set = std::getenv("DHISPARSE_FUZZ_VERBOSE") != nullptr;
  return set;
}

/// Throws `finding` with `message` unless `condition` holds.
inline void expect(bool condition, std::string const& message)
{
  if (!condition) { throw finding(message); }
}

/// Typed values decoded from the fuzzer's bytes.
class input {
 public:
  input(std::uint8_t const* data, std::size_t size) : data_{data}, size_{size} {}

  [[nodiscard]] bool empty() const noexcept { return at_ >= size_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return size_ - at_; }

  /// The next byte (0 past the end).
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }

  /**
   * @brief A value, usually in [lo, hi]: a selector byte 0xFF is followed by a raw
   *        little-endian `T` (any value: the edge cases); otherwise the selector is the
   *        low byte of a little-endian number of as many bytes as hi - lo needs, taken
   *        modulo hi - lo + 1 and added to lo.
   */
  template <class T>
  T integer(T lo, T hi)
  {
    static_assert(std::is_integral_v<T>, "integer: integral types only");
    std::uint8_t const selector = byte();
    if (selector == 0xFF) { return raw<T>(); }
    std::uint64_t const span = std::uint64_t(hi) - std::uint64_t(lo);  // modulo 2^64
    std::uint64_t v          = selector;
    for (int shift = 8; shift < 64 && (span >> shift) != 0; shift += 8) { v |= std::uint64_t(byte()) << shift; }
    std::uint64_t const offset = span == std::numeric_limits<std::uint64_t>::max() ? v : v % (span + 1);
    return static_cast<T>(std::uint64_t(lo) + offset);
  }

  /// A raw little-endian `T` (integral or float).
  template <class T>
  T raw()
  {
    // Straight into v: through a byte array, GCC 12 vectorizes the copy and then warns of
    // a write past it (-Wstringop-overflow, a false positive).
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) { v |= std::uint64_t(byte()) << (8 * i); }
    T out;
    if constexpr (std::is_integral_v<T>) {
      out = static_cast<T>(v);
    } else {
      static_assert(sizeof(T) == 4, "raw: float or integral types");
      std::uint32_t const bits = std::uint32_t(v);
      std::memcpy(&out, &bits, sizeof out);
    }
    return out;
  }

  /// True for an odd byte.
  bool boolean() { return (byte() & 1u) != 0; }

  /// One of `values`.
  template <class T, std::size_t N>
  T pick(T const (&values)[N])
  {
    return values[integer<std::size_t>(0, N - 1) % N];
  }

  /// A probability-like float: mostly ordinary values, sometimes the special ones.
  float probability()
  {
    static constexpr float special[] = {0.f, 1.f, 0.5f, -0.25f, 2.f, 1e-30f, 1.4e-45f,
                                        std::numeric_limits<float>::infinity(),
                                        -std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::quiet_NaN()};
    std::uint8_t const selector = byte();
    if (selector < 192) { return float(selector) / 191.f; }
    if (selector < 0xFF) { return special[(selector - 192) % (sizeof special / sizeof special[0])]; }
    return raw<float>();
  }

 private:
  std::uint8_t const* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

/**
 * @brief An array of exactly `size` elements on the heap (none: a unique zero-size
 *        allocation), so that the address sanitizer catches any access past it.
 */
template <class T>
class buffer {
 public:
  explicit buffer(std::size_t size = 0, T fill = T{}) : size_{size}, data_{new T[size]}
  {
    for (std::size_t i = 0; i < size; ++i) { data_[i] = fill; }
  }
  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] T const* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  T const& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  std::size_t size_;
  std::unique_ptr<T[]> data_;
};

/**
 * @brief Runs `harness` on one input: `dhisparse::error` escaping it is a valid outcome
 *        (the library rejected the input); a finding or any other exception propagates.
 */
template <class Harness>
void replay(Harness&& harness, std::uint8_t const* data, std::size_t size)
{
  try {
    harness(data, size);
  } catch (::dhisparse::error const&) {  // rejected, as it should be
  }
}

/**
 * @brief The body of `LLVMFuzzerTestOneInput`: `replay`s one input; a finding or any
 *        other exception is printed and aborts (libFuzzer saves the input).
 */
template <class Harness>
int run_one(Harness&& harness, std::uint8_t const* data, std::size_t size)
{
  try {
    replay(harness, data, size);
  } catch (finding const& f) {
    std::fprintf(stderr, "FUZZ FINDING: %s\n", f.what());
    std::abort();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "FUZZ FINDING: an exception other than dhisparse::error escaped: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "FUZZ FINDING: a non-standard exception escaped\n");
    std::abort();
  }
  return 0;
}

}  // namespace dhisparse::fuzz

/// Defines libFuzzer's entry point for `harness` (a function (uint8_t const*, size_t)).
#define DHISPARSE_FUZZ_TARGET(harness)                                                  \
  extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)     \
  {                                                                                     \
    return ::dhisparse::fuzz::run_one(harness, data, size);                             \
  }
