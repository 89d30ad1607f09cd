/**
 * @file random.hpp
 * @brief Fresh random seeds for tests, reproducible on demand.
 *
 * Every randomized test draws its seed from `fresh_seed()`: a new one per run unless the
 * environment variable `DHISPARSE_TEST_SEED` fixes it. The seed is printed so a failing
 * run can be replayed with `DHISPARSE_TEST_SEED=<seed> ./test …`.
 */
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace dhisparse::test {

inline std::uint64_t fresh_seed()
{
  if (char const* env = std::getenv("DHISPARSE_TEST_SEED")) {
    return std::strtoull(env, nullptr, 10);
  }
  std::random_device rd;
  return (std::uint64_t(rd()) << 32) ^ rd();
}

/// A seeded engine that prints its seed (Catch2 shows stdout of failing tests).
inline std::mt19937_64 seeded_engine(char const* what)
{
  std::uint64_t const seed = fresh_seed();
  std::printf("[%s] seed %llu (set DHISPARSE_TEST_SEED to replay)\n", what,
              static_cast<unsigned long long>(seed));
  return std::mt19937_64{seed};
}

}  // namespace dhisparse::test
