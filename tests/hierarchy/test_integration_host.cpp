/**
 * @file test_integration_host.cpp
 * @brief Host-side parts of the engine integration (issue 17): the byte counts derived
 *        from `group_counters`, the counters of the host reference after a step, and the
 *        NVTX macro compiled out when `DHISPARSE_NVTX` is not defined.
 */
#include <dhisparse/detail/nvtx.hpp>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/host/hierarchy.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

using namespace dhisparse;

TEST_CASE("group_counters: bytes moved over PCIe from the row counts", "[integration]")
{
  group_counters c{};
  CHECK(c.h2d_bytes(656) == 0);
  CHECK(c.d2h_bytes(656) == 0);
  c.selected_rows  = 1000;
  c.fetched_rows   = 40;
  c.prewarmed_rows = 10;
  c.backed_up_rows = 7;
  std::size_t const group_row = 4 * 656;  // a group of 4 layers
  CHECK(c.h2d_bytes(group_row) == 50ull * group_row);
  CHECK(c.d2h_bytes(group_row) == 7ull * group_row);
  c.fetched_rows = 1ull << 40;  // no 32-bit overflow
  CHECK(c.h2d_bytes(group_row) == ((1ull << 40) + 10) * group_row);
}

#if !defined(DHISPARSE_NVTX)
TEST_CASE("DHISPARSE_NVTX_RANGE compiles to nothing without DHISPARSE_NVTX", "[integration]")
{
  int calls = 0;
  {
    DHISPARSE_NVTX_RANGE("dhisparse::test");
    ++calls;
  }
  CHECK(calls == 1);
}
#endif

TEST_CASE("group_counters of the host reference: one step's fetched and backed-up bytes", "[integration]")
{
  using row = row_format::opaque<64>;
  hierarchy_config c;
  c.group_layers           = {2};
  c.max_requests           = 2;
  c.max_batch              = 2;
  c.max_queries            = 1;
  c.max_top_k              = 8;
  c.max_context            = 256;
  c.device_slots_per_group = 64;
  c.host.capacity_pages    = 16;
  c.host.tokens_per_page   = 64;
  host::kv_hierarchy<row, policy::lru, policy::static_budget<16>> h(c);
  request_id const id{9};
  h.admit(id, 20);
  h.set_batch(&id, std::vector<std::int32_t>{1}.data(), 1);
  std::vector<std::int32_t> selections(std::size_t(c.max_batch) * c.max_queries * 8, -1);
  for (int k = 0; k < 8; ++k) { selections[std::size_t(k)] = 2 * k; }
  h.resolve(0, selections.data(), 8);
  h.retrieve(0);
  h.commit(nullptr);
  h.backup();
  group_counters const& counters = h.counters(0);
  std::size_t const group_row    = 2 * row::bytes;
  CHECK(counters.fetched_rows == 8);
  CHECK(counters.h2d_bytes(group_row) == 8 * group_row);
  CHECK(counters.d2h_bytes(group_row) == 1 * group_row);
}
