/**
 * @file detail/numa.hpp
 * @brief NUMA placement of the host store (plain C++, Linux): which node is closest to the
 *        GPU, binding a mapping to it, and where its pages actually are.
 *
 * The node comes from sysfs: `<root>/bus/pci/devices/<pci bus id>/numa_node` (the kernel's
 * word for the device's node, -1 when the platform does not say) and the online nodes from
 * `<root>/devices/system/node/online`. Binding uses the `mbind` / `set_mempolicy` system
 * calls directly (no libnuma: three calls do not justify a run-time dependency that
 * engines would have to ship) with `MPOL_PREFERRED`, never `MPOL_BIND`: a node that runs
 * out of memory then spills to the others instead of failing a page fault. Where the calls
 * are refused (containers without CAP_SYS_NICE under a seccomp profile) or the machine has
 * one node, nothing is bound and the reason is reported; where a page's node can be read
 * (`get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`) it is reported too.
 */
#pragma once

#include <dhisparse/error.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace dhisparse {

/// `host_store_config::numa_node`: the node closest to the current GPU (the default).
inline constexpr int numa_device_local = -1;
/// `host_store_config::numa_node`: no binding (the process's own memory policy).
inline constexpr int numa_unbound = -2;

/// Where a host store's pages were placed (`host_store::numa()`).
struct numa_binding {
  int requested       = numa_device_local;  ///< the configuration's `numa_node`
  int node            = -1;  ///< node the pages were bound to (preferred), -1: not bound
  int first_page_node = -1;  ///< node of the store's first page as the kernel reports it, -1: unknown
  std::string reason;        ///< why this node, or why none

  /// One line for logs and benchmark output.
  [[nodiscard]] std::string describe() const
  {
    std::string s = node >= 0 ? "bound to node " + std::to_string(node) : std::string("not bound");
    s += " (" + reason + ")";
    s += first_page_node >= 0 ? ", first page on node " + std::to_string(first_page_node) : ", page node unknown";
    return s;
  }
};

namespace detail::numa {

// Linux's memory policy modes and flags (linux/mempolicy.h), spelled out so that no kernel
// header is needed.
inline constexpr int mpol_default   = 0;
inline constexpr int mpol_preferred = 1;
inline constexpr int mpol_f_node    = 1 << 0;
inline constexpr int mpol_f_addr    = 1 << 1;
inline constexpr int mask_words     = 16;  ///< node masks of 1024 bits
inline constexpr int mask_bits      = mask_words * 8 * int(sizeof(unsigned long));

/// First line of a file, or "" (with `ok = false`) when it cannot be read.
inline std::string read_line(std::string const& path, bool& ok)
{
  std::ifstream f(path);
  std::string line;
  ok = static_cast<bool>(f) && static_cast<bool>(std::getline(f, line));
  return ok ? line : std::string();
}

/// Parses a sysfs node list ("0", "0-3", "0,2-3"); malformed parts are ignored.
inline std::vector<int> parse_node_list(std::string const& text)
{
  std::vector<int> nodes;
  std::size_t i = 0;
  auto number = [&](int& out) {
    std::size_t const start = i;
    long v                  = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && v < (1L << 20)) {
      v = v * 10 + (text[i++] - '0');
    }
    out = int(v);
    return i > start;
  };
  while (i < text.size()) {
    int lo = 0, hi = 0;
    if (number(lo)) {
      hi = lo;
      if (i < text.size() && text[i] == '-') {
        ++i;
        if (!number(hi)) { hi = lo; }
      }
      for (int n = lo; n <= hi && n < mask_bits; ++n) { nodes.push_back(n); }
    }
    while (i < text.size() && text[i] != ',') { ++i; }
    ++i;
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

/// Online NUMA nodes under `sysfs_root` ({0} when the kernel shows no NUMA topology).
inline std::vector<int> online_nodes(std::string const& sysfs_root)
{
  bool ok                 = false;
  std::string const line  = read_line(sysfs_root + "/devices/system/node/online", ok);
  std::vector<int> nodes  = ok ? parse_node_list(line) : std::vector<int>{};
  return nodes.empty() ? std::vector<int>{0} : nodes;
}

/// sysfs spelling of a PCI bus id from `cudaDeviceGetPCIBusId`: lower case, 4-digit domain
/// ("00000000:3B:00.0" → "0000:3b:00.0").
inline std::string sysfs_bus_id(std::string id)
{
  for (char& c : id) { c = char(std::tolower(static_cast<unsigned char>(c))); }
  std::size_t const colon = id.find(':');
  if (colon != std::string::npos && colon > 4) { id = id.substr(colon - 4); }
  return id;
}

/// The device's node from `<root>/bus/pci/devices/<id>/numa_node`, -1 when unknown.
inline int pci_device_node(std::string const& sysfs_root, std::string const& pci_bus_id)
{
  bool ok                = false;
  std::string const line = read_line(sysfs_root + "/bus/pci/devices/" + sysfs_bus_id(pci_bus_id) + "/numa_node", ok);
  if (!ok) { return -1; }
  try {
    return std::max(-1, std::stoi(line));
  } catch (...) {
    return -1;
  }
}

/// Node to bind to (-1: none) and why.
struct choice {
  int node = -1;
  std::string reason;
};

/**
 * @brief The node a store is bound to for a requested `numa_node`, on the machine
 *        described by `sysfs_root` ("/sys" in production; tests pass a fake tree), for the
 *        GPU at `pci_bus_id` (empty when there is no device).
 * @throws dhisparse::error when an explicit node is not online
 */
inline choice choose_node(int requested, std::string const& sysfs_root, std::string const& pci_bus_id)
{
  std::vector<int> const online = online_nodes(sysfs_root);
  if (requested >= 0) {
    DHISPARSE_EXPECTS(std::binary_search(online.begin(), online.end(), requested),
                      "host_store_config.numa_node (" + std::to_string(requested) + ") is not an online NUMA node");
  } else if (requested != numa_device_local) {
    DHISPARSE_EXPECTS(requested == numa_unbound, "host_store_config.numa_node (" + std::to_string(requested) +
                                                   ") must be a node, numa_device_local (-1) or numa_unbound (-2)");
    return {-1, "no binding requested"};
  }
  if (online.size() < 2) { return {-1, "one NUMA node"}; }
  if (requested >= 0) { return {requested, "node " + std::to_string(requested) + " requested"}; }
  if (pci_bus_id.empty()) { return {-1, "no GPU to be local to"}; }
  int const node = pci_device_node(sysfs_root, pci_bus_id);
  if (node < 0 || !std::binary_search(online.begin(), online.end(), node)) {
    return {-1, "GPU " + sysfs_bus_id(pci_bus_id) + " reports no NUMA node"};
  }
  return {node, "closest to GPU " + sysfs_bus_id(pci_bus_id)};
}

/// Prefers `node` for the pages of [addr, addr + bytes) not yet touched; 0 or an errno.
inline int bind_preferred(void* addr, std::size_t bytes, int node)
{
#if defined(__linux__) && defined(SYS_mbind)
  if (node < 0 || node >= mask_bits) { return EINVAL; }
  unsigned long mask[mask_words] = {};
  mask[node / (8 * sizeof(unsigned long))] = 1UL << (node % (8 * sizeof(unsigned long)));
  long const r = ::syscall(SYS_mbind, addr, bytes, mpol_preferred, mask, (unsigned long)(mask_bits + 1), 0u);
  return r == 0 ? 0 : errno;
#else
  (void)addr, (void)bytes, (void)node;
  return ENOSYS;
#endif
}

/// Node of the page at `addr` (touching it first is the caller's business), -1 if unknown.
inline int page_node(void const* addr)
{
#if defined(__linux__) && defined(SYS_get_mempolicy)
  int node = -1;
  long const r = ::syscall(SYS_get_mempolicy, &node, nullptr, 0ul, addr, (unsigned long)(mpol_f_node | mpol_f_addr));
  return r == 0 ? node : -1;
#else
  (void)addr;
  return -1;
#endif
}

/**
 * @brief The calling thread prefers `node` for new pages while this object lives (for
 *        allocations that touch their pages inside a library call, e.g. `cudaHostAlloc`);
 *        the previous policy is restored. `status()` is 0 or the errno of the refusal.
 */
class scoped_preferred_node {
 public:
  explicit scoped_preferred_node(int node)
  {
#if defined(__linux__) && defined(SYS_set_mempolicy) && defined(SYS_get_mempolicy)
    if (node < 0 || node >= mask_bits) {
      status_ = EINVAL;
      return;
    }
    if (::syscall(SYS_get_mempolicy, &old_mode_, old_mask_, (unsigned long)(mask_bits + 1), nullptr, 0ul) != 0) {
      status_ = errno;
      return;
    }
    unsigned long mask[mask_words] = {};
    mask[node / (8 * sizeof(unsigned long))] = 1UL << (node % (8 * sizeof(unsigned long)));
    if (::syscall(SYS_set_mempolicy, mpol_preferred, mask, (unsigned long)(mask_bits + 1)) != 0) {
      status_ = errno;
      return;
    }
    active_ = true;
#else
    (void)node;
    status_ = ENOSYS;
#endif
  }
  scoped_preferred_node(scoped_preferred_node const&)            = delete;
  scoped_preferred_node& operator=(scoped_preferred_node const&) = delete;
  ~scoped_preferred_node()
  {
#if defined(__linux__) && defined(SYS_set_mempolicy)
    if (active_) {
      // Mode flags (static / relative nodes) ride in the upper bits of the mode; a default
      // policy takes no mask.
      bool const plain = old_mode_ == mpol_default;
      ::syscall(SYS_set_mempolicy, old_mode_, plain ? nullptr : old_mask_, plain ? 0ul : (unsigned long)(mask_bits + 1));
    }
#endif
  }
  [[nodiscard]] int status() const noexcept { return status_; }

 private:
  int status_  = 0;
  bool active_ = false;
  int old_mode_ = mpol_default;
  unsigned long old_mask_[mask_words] = {};
};

/// "mbind failed: <strerror>" for reports.
inline std::string refused(char const* call, int err) { return std::string(call) + " refused: " + std::strerror(err); }

}  // namespace detail::numa
}  // namespace dhisparse
