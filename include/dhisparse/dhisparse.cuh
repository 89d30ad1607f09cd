/**
 * @file dhisparse.cuh
 * @brief Umbrella header: every public component of dhisparse.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>
