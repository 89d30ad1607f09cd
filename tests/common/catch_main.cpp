// Catch2 main for the host (no-GPU) test executables; compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
