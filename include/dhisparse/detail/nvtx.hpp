/**
 * @file detail/nvtx.hpp
 * @brief NVTX ranges around the library's launches, in the "dhisparse" domain. Compiled
 *        out (no code, no include) unless `DHISPARSE_NVTX` is defined; NVTX v3 is
 *        header-only (`nvtx3/nvToolsExt.h` of the CUDA toolkit), so enabling it adds no
 *        link dependency. A profiler (Nsight Systems) shows the ranges on the calling host
 *        thread; without a profiler attached they cost a branch each.
 */
#pragma once

#if defined(DHISPARSE_NVTX)
#include <nvtx3/nvToolsExt.h>

namespace dhisparse::detail {

/// The library's NVTX domain, created once.
inline nvtxDomainHandle_t nvtx_domain()
{
  static nvtxDomainHandle_t const domain = nvtxDomainCreateA("dhisparse");
  return domain;
}

/// Pushes a range of the "dhisparse" domain for its lifetime.
class nvtx_range {
 public:
  explicit nvtx_range(char const* name) noexcept
  {
    nvtxEventAttributes_t attributes{};
    attributes.version       = NVTX_VERSION;
    attributes.size          = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType   = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &attributes);
  }
  ~nvtx_range() { nvtxDomainRangePop(nvtx_domain()); }
  nvtx_range(nvtx_range const&)            = delete;
  nvtx_range& operator=(nvtx_range const&) = delete;
};

}  // namespace dhisparse::detail

#define DHISPARSE_NVTX_CONCAT_IMPL(a, b) a##b
#define DHISPARSE_NVTX_CONCAT(a, b) DHISPARSE_NVTX_CONCAT_IMPL(a, b)
/// An NVTX range named `name` (a string literal) until the end of the enclosing scope.
#define DHISPARSE_NVTX_RANGE(name) \
  ::dhisparse::detail::nvtx_range const DHISPARSE_NVTX_CONCAT(dhisparse_nvtx_range_, __LINE__) { name }
#else
/// An NVTX range named `name` until the end of the enclosing scope (compiled out: define
/// `DHISPARSE_NVTX` to enable).
#define DHISPARSE_NVTX_RANGE(name) static_cast<void>(0)
#endif
