// NUMA placement of the host store: node lists, PCI bus ids, the node choice on fake sysfs
// trees (one node, two nodes with and without a device node, explicit nodes), and the
// binding system calls on this machine (allowed or cleanly refused).
#include <dhisparse/detail/numa.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

using namespace dhisparse;
namespace numa = dhisparse::detail::numa;
namespace fs   = std::filesystem;

namespace {

/// A temporary directory shaped like the parts of /sys the choice reads.
class fake_sysfs {
 public:
  fake_sysfs()
  {
    std::string tmpl = (fs::temp_directory_path() / "dhisparse-sysfs-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    root_ = tmpl;
  }
  fake_sysfs(fake_sysfs const&)            = delete;
  fake_sysfs& operator=(fake_sysfs const&) = delete;
  ~fake_sysfs()
  {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void online(std::string const& list) { write("devices/system/node/online", list + "\n"); }
  void device(std::string const& bus_id, std::string const& node) { write("bus/pci/devices/" + bus_id + "/numa_node", node + "\n"); }
  std::string root() const { return root_.string(); }

 private:
  void write(std::string const& rel, std::string const& text)
  {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  fs::path root_;
};

}  // namespace

TEST_CASE("numa: node lists and bus ids as sysfs spells them", "[numa][host]")
{
  CHECK(numa::parse_node_list("0") == std::vector<int>{0});
  CHECK(numa::parse_node_list("0-3\n") == std::vector<int>{0, 1, 2, 3});
  CHECK(numa::parse_node_list("0,2-3") == std::vector<int>{0, 2, 3});
  CHECK(numa::parse_node_list("3,1,1") == std::vector<int>{1, 3});
  CHECK(numa::parse_node_list("").empty());
  CHECK(numa::parse_node_list("x,2").size() == 1);
  CHECK(numa::sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0");
  CHECK(numa::sysfs_bus_id("0000:C1:00.0") == "0000:c1:00.0");
}

TEST_CASE("numa: the node closest to the GPU, with clean fallbacks", "[numa][host]")
{
  std::string const gpu = "00000000:3B:00.0";  // as the CUDA runtime may spell it
  SECTION("no NUMA topology at all: one node, nothing bound")
  {
    fake_sysfs sys;
    auto const c = numa::choose_node(numa_device_local, sys.root(), gpu);
    CHECK(c.node == -1);
    CHECK(c.reason == "one NUMA node");
  }
  SECTION("one online node")
  {
    fake_sysfs sys;
    sys.online("0");
    sys.device("0000:3b:00.0", "0");
    CHECK(numa::choose_node(numa_device_local, sys.root(), gpu).node == -1);
    CHECK(numa::choose_node(0, sys.root(), gpu).node == -1);  // valid, nothing to choose
    CHECK_THROWS_AS(numa::choose_node(1, sys.root(), gpu), dhisparse::error);
  }
  SECTION("two nodes, the GPU on node 1")
  {
    fake_sysfs sys;
    sys.online("0-1");
    sys.device("0000:3b:00.0", "1");
    auto const c = numa::choose_node(numa_device_local, sys.root(), gpu);
    CHECK(c.node == 1);
    CHECK(c.reason == "closest to GPU 0000:3b:00.0");
    CHECK(numa::choose_node(0, sys.root(), gpu).node == 0);  // an explicit node wins
    CHECK(numa::choose_node(numa_unbound, sys.root(), gpu).node == -1);
    CHECK(numa::choose_node(numa_device_local, sys.root(), "").node == -1);  // no GPU
    CHECK_THROWS_AS(numa::choose_node(2, sys.root(), gpu), dhisparse::error);
    CHECK_THROWS_AS(numa::choose_node(-7, sys.root(), gpu), dhisparse::error);
  }
  SECTION("two nodes, the platform gives the GPU none (-1), another GPU, or a node that is offline")
  {
    fake_sysfs sys;
    sys.online("0,2");
    sys.device("0000:3b:00.0", "-1");
    sys.device("0000:5e:00.0", "1");
    sys.device("0000:86:00.0", "2");
    CHECK(numa::choose_node(numa_device_local, sys.root(), gpu).node == -1);
    CHECK(numa::choose_node(numa_device_local, sys.root(), "0000:5E:00.0").node == -1);
    CHECK(numa::choose_node(numa_device_local, sys.root(), "0000:86:00.0").node == 2);
    CHECK(numa::choose_node(numa_device_local, sys.root(), "0000:af:00.0").node == -1);  // no such device
  }
}

TEST_CASE("numa: binding calls on this machine succeed or are refused with an errno", "[numa][host]")
{
  std::size_t const bytes = std::size_t{4} << 20;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  int const node = numa::online_nodes("/sys").front();
  int const err  = numa::bind_preferred(p, bytes, node);
  CHECK((err == 0 || err == EPERM || err == ENOSYS));
  static_cast<char*>(p)[0] = 1;  // touch the first page
  int const where = numa::page_node(p);
  CHECK((where == -1 || where >= 0));
  if (err == 0 && where >= 0) { CHECK(where == node); }
  {
    numa::scoped_preferred_node prefer(node);
    CHECK((prefer.status() == 0 || prefer.status() == EPERM || prefer.status() == ENOSYS));
  }
  CHECK(numa::bind_preferred(p, bytes, -3) == EINVAL);
  ::munmap(p, bytes);
  numa_binding b;
  b.node            = 1;
  b.reason          = "closest to GPU 0000:3b:00.0";
  b.first_page_node = 1;
  CHECK(b.describe() == "bound to node 1 (closest to GPU 0000:3b:00.0), first page on node 1");
}
