// Replays every fuzz input kept in the repository through its harness (fuzz/*.hpp): the
// seed corpora (fuzz/corpus/<target>/) and the inputs that once found a problem
// (tests/fuzz_regressions/inputs/<target>/). Each must end normally or with
// dhisparse::error; a harness finding or any other exception fails the test, a sanitizer
// report fails it in the sanitizer build (scripts/sanitize_host.sh).
#include <catch2/catch.hpp>

#include "hierarchy_ops.hpp"
#include "host_layout.hpp"
#include "trace_reader.hpp"
#include "verify_inputs.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs   = std::filesystem;
namespace fuzz = dhisparse::fuzz;

namespace {

/// The kept inputs of `target`, seeds first, each folder in name order.
std::vector<fs::path> kept_inputs(std::string const& target)
{
  std::vector<fs::path> out;
  fs::path const seeds = fs::path(DHISPARSE_FUZZ_CORPUS) / target;
  fs::path const found = fs::path(DHISPARSE_FUZZ_REGRESSIONS) / target;
  for (fs::path const& folder : {seeds, found}) {
    if (!fs::is_directory(folder)) { continue; }
    std::vector<fs::path> files;
    for (auto const& e : fs::directory_iterator(folder)) {
      if (e.is_regular_file()) { files.push_back(e.path()); }
    }
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

template <class Harness>
void replay_kept(std::string const& target, Harness harness)
{
  auto const files = kept_inputs(target);
  REQUIRE(!files.empty());  // the seed corpus is in the repository
  for (auto const& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::vector<std::uint8_t> const bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    INFO(file.string() << " (" << bytes.size() << " bytes)");
    REQUIRE_NOTHROW(fuzz::replay(harness, bytes.data(), bytes.size()));
  }
}

}  // namespace

TEST_CASE("kept fuzz inputs replay cleanly: trace_reader", "[fuzz]")
{
  replay_kept("trace_reader", fuzz::trace_reader_target);
}

TEST_CASE("kept fuzz inputs replay cleanly: hierarchy_config", "[fuzz]")
{
  replay_kept("hierarchy_config", fuzz::hierarchy_config_target);
}

TEST_CASE("kept fuzz inputs replay cleanly: selections", "[fuzz]")
{
  replay_kept("selections", fuzz::selections_target);
}

TEST_CASE("kept fuzz inputs replay cleanly: verify_inputs", "[fuzz]")
{
  replay_kept("verify_inputs", fuzz::verify_inputs_target);
}

TEST_CASE("kept fuzz inputs replay cleanly: host_layout", "[fuzz]")
{
  replay_kept("host_layout", fuzz::host_layout_target);
  // The seeds say what they are: valid layouts are accepted, invalid ones rejected.
  for (auto const& file : kept_inputs("host_layout")) {
    std::ifstream in(file, std::ios::binary);
    std::vector<std::uint8_t> const bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::string const name = file.filename().string();
    INFO(name);
    if (name.rfind("valid_", 0) == 0) { CHECK_NOTHROW(fuzz::host_layout_target(bytes.data(), bytes.size())); }
    if (name.rfind("invalid_", 0) == 0) {
      CHECK_THROWS_AS(fuzz::host_layout_target(bytes.data(), bytes.size()), dhisparse::error);
    }
  }
}
