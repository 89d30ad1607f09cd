/**
 * @file detail/pinned_host_memory.cuh
 * @brief The memory of a host store's pages (`host_store`, `shared_host_store`): pinned
 *        from the resource, huge pages or registered caller memory, mapped into the device
 *        address space and placed on the NUMA node of the current device (host_store.cuh).
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/numa.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace dhisparse {
namespace detail {

/// Move-only owner of the host store's memory: from the pinned resource, huge pages or
/// registered caller memory, mapped into the device address space.
class pinned_host_memory {
 public:
  pinned_host_memory() = default;
  pinned_host_memory(host_store_config const& config, std::size_t bytes,
                     pinned_memory_resource& pinned = default_pinned_resource())
    : kind_{config.memory}
  {
    numa_.requested = config.numa_node;
    numa::choice const where =
      kind_ == host_memory::caller ? numa::choice{-1, "caller memory: placed by the caller"}
                                   : numa::choose_node(config.numa_node, "/sys", current_pci_bus_id());
    numa_.node   = where.node;
    numa_.reason = where.reason;
    switch (kind_) {
      case host_memory::pinned: {
        // cudaHostAlloc (the default resource) touches its pages in this thread: a thread
        // policy places them. A caller's resource that hands out touched memory places it.
        std::optional<numa::scoped_preferred_node> prefer;
        if (where.node >= 0) {
          prefer.emplace(where.node);
          if (prefer->status() != 0) { unbind(numa::refused("set_mempolicy", prefer->status())); }
        }
        pages_ = pinned_array<std::byte>(bytes, pinned, nullptr);
        host_  = pages_.data();
        break;
      }
      case host_memory::huge_pages: {
        mapped_bytes_ = mapped_size(kind_, bytes);
        void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        DHISPARSE_EXPECTS(p != MAP_FAILED,
                          "host_store: mmap of " + std::to_string(mapped_bytes_) + " bytes failed");
        if (where.node >= 0) {  // before any page is touched
          int const err = numa::bind_preferred(p, mapped_bytes_, where.node);
          if (err != 0) { unbind(numa::refused("mbind", err)); }
        }
        ::madvise(p, mapped_bytes_, MADV_HUGEPAGE);  // a hint: no error if THP is off
        host_ = static_cast<std::byte*>(p);
        register_memory(mapped_bytes_);
        break;
      }
      case host_memory::caller:
        DHISPARSE_EXPECTS(config.caller_memory != nullptr,
                          "host_store: host_memory::caller needs caller_memory");
        DHISPARSE_EXPECTS(reinterpret_cast<std::uintptr_t>(config.caller_memory) % row_alignment == 0,
                          "host_store: caller_memory must be 16-byte aligned");
        DHISPARSE_EXPECTS(config.caller_bytes >= bytes,
                          "host_store: caller_bytes (" + std::to_string(config.caller_bytes) +
                            ") is smaller than capacity_pages × page bytes (" + std::to_string(bytes) + ")");
        host_ = static_cast<std::byte*>(config.caller_memory);
        if (!config.caller_memory_registered) { register_memory(config.caller_bytes); }
        break;
    }
    numa_.first_page_node = numa::page_node(host_);
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  }
  pinned_host_memory(pinned_host_memory&& o) noexcept { swap(o); }
  pinned_host_memory& operator=(pinned_host_memory&& o) noexcept
  {
    swap(o);
    return *this;
  }
  pinned_host_memory(pinned_host_memory const&)            = delete;
  pinned_host_memory& operator=(pinned_host_memory const&) = delete;
  ~pinned_host_memory()
  {
    if (host_ == nullptr) { return; }
    if (registered_) { cudaHostUnregister(host_); }
    if (kind_ == host_memory::huge_pages) { ::munmap(host_, mapped_bytes_); }
  }

  [[nodiscard]] std::byte* host() const noexcept { return host_; }
  [[nodiscard]] std::byte* device() const noexcept { return device_; }

  /// Host bytes a store of `bytes` occupies: rounded up to whole 2 MiB pages with
  /// huge_pages, `bytes` otherwise.
  static std::size_t mapped_size(host_memory kind, std::size_t bytes) noexcept
  {
    std::size_t const huge = std::size_t{2} << 20;
    return kind == host_memory::huge_pages ? (bytes + huge - 1) / huge * huge : bytes;
  }
  [[nodiscard]] numa_binding const& numa() const noexcept { return numa_; }

  /// PCI bus id of the current device ("" without one), for the NUMA choice.
  static std::string current_pci_bus_id()
  {
    int device = 0;
    char id[32] = {};
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(id, int(sizeof id), device) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return id;
  }

 private:
  void unbind(std::string why)
  {
    numa_.reason += "; " + why + ", not bound";
    numa_.node = -1;
  }
  void register_memory(std::size_t bytes)
  {
    cudaError_t const status = cudaHostRegister(host_, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (status != cudaSuccess) {
      if (kind_ == host_memory::huge_pages) { ::munmap(host_, mapped_bytes_); }
      host_ = nullptr;
      throw_cuda_error(status, "cudaHostRegister", __FILE__, __LINE__);
    }
    registered_ = true;
  }
  void swap(pinned_host_memory& o) noexcept
  {
    std::swap(kind_, o.kind_);
    std::swap(pages_, o.pages_);
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    std::swap(mapped_bytes_, o.mapped_bytes_);
    std::swap(registered_, o.registered_);
    std::swap(numa_, o.numa_);
  }

  host_memory kind_        = host_memory::pinned;
  pinned_array<std::byte> pages_;  // host_memory::pinned: from the resource
  std::byte* host_         = nullptr;
  std::byte* device_       = nullptr;
  std::size_t mapped_bytes_ = 0;
  bool registered_         = false;
  numa_binding numa_{};
};

}  // namespace detail

}  // namespace dhisparse
