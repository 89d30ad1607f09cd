/**
 * @file detail/config.hpp
 * @brief Compiler portability macros shared by every dhisparse header.
 *
 * Plain C++: this header compiles with any C++17 compiler, so the host reference
 * backend (`dhisparse/host/…`) can use the same traits as the CUDA code.
 */
#pragma once

#if defined(__CUDACC__)
#define DHISPARSE_HOST_DEVICE __host__ __device__
#define DHISPARSE_DEVICE __device__
#define DHISPARSE_FORCEINLINE __forceinline__
#else
#define DHISPARSE_HOST_DEVICE
#define DHISPARSE_DEVICE
#define DHISPARSE_FORCEINLINE inline
#endif

/// Declares a kernel with hidden visibility, so that kernels instantiated in several
/// shared objects of one process never alias each other (the CUB/Thrust convention).
/// Every dhisparse kernel is a template (header-only: one definition per instantiation).
#if defined(__CUDACC__)
#if defined(_WIN32)
#define DHISPARSE_KERNEL __global__ static
#else
#define DHISPARSE_KERNEL __global__ __attribute__((visibility("hidden")))
#endif
#endif

#define DHISPARSE_VERSION_MAJOR 0
#define DHISPARSE_VERSION_MINOR 1
#define DHISPARSE_VERSION_PATCH 0
