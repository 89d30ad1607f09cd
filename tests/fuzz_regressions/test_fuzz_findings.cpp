// Fuzz findings (docs/reliability.md), each reproduced in a few readable lines with the
// behaviour the library must have. A case tagged [open] is a bug still in library code:
// it fails until the library is fixed, so CTest runs `test_fuzz_findings "~[open]"`
// (CMakeLists.txt); when one is fixed, drop its [open] tag and remove the guard named
// after it in fuzz/hierarchy_ops.hpp, so that the fuzzers cover the path again. None is
// open now: F2, F5 and F9 follow the step contract of docs/integration.md.
#include <catch2/catch.hpp>

#include <dhisparse/verify_params.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/trace.hpp>

#include "random_trace.hpp"  // tests/trace: scratch_file

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

using namespace dhisparse;

namespace {

using small_hierarchy = host::kv_hierarchy<row_format::opaque<16>, policy::lru, policy::static_budget<64>>;

hierarchy_config small_config()
{
  hierarchy_config c;
  c.group_layers           = {1, 1};
  c.max_requests           = 2;
  c.max_batch              = 2;
  c.max_queries            = 2;
  c.max_top_k              = 4;
  c.max_context            = 64;
  c.device_slots_per_group = 128;
  c.host.tokens_per_page   = 8;
  c.host.capacity_pages    = 32;
  return c;
}

/// A valid trace of one step of one request with one query of one entry (shapes all 1),
/// with `bytes` then written over its header at `offset` (the checksum covers only the
/// payload, so it still matches).
void patched_one_step_trace(std::string const& path, std::size_t offset, std::vector<char> const& bytes)
{
  trace::shape s;
  s.max_requests = s.max_queries = s.top_k = 1;
  {
    trace::writer w(path, s);
    trace::request_record const rq{request_id{7}, 0, 1, -1};
    std::int32_t const position = 0;
    w.write({&rq, 1, &position, nullptr});
    w.close();
  }
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(std::streamoff(offset));
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

/// Writes `bytes` over the payload of the trace at `path` at `offset` and makes its header's
/// checksum match again, so that only the reader's record checks can refuse it.
void patch_payload(std::string const& path, std::size_t offset, std::vector<char> const& bytes)
{
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(0, std::ios::end);
  std::vector<char> payload(std::size_t(f.tellg()) - trace::header_bytes);
  f.seekg(std::streamoff(trace::header_bytes));
  f.read(payload.data(), std::streamsize(payload.size()));
  std::copy(bytes.begin(), bytes.end(), payload.begin() + std::ptrdiff_t(offset));
  std::uint64_t const sum = trace::fnv1a64(payload.data(), payload.size());
  char le[8];
  for (int i = 0; i < 8; ++i) { le[i] = char((sum >> (8 * i)) & 0xFF); }
  f.seekp(std::streamoff(trace::header_bytes));
  f.write(payload.data(), std::streamsize(payload.size()));
  f.seekp(56);
  f.write(le, 8);
}

/// Opens the trace at `path` and reads every step.
void read_all(std::string const& path)
{
  trace::reader r(path);
  trace::step_record rec;
  while (r.next(rec)) {}
}

/// Every slot of every group is owned or free.
void check_slots_accounted(small_hierarchy const& h)
{
  for (int g = 0; g < h.config().num_groups(); ++g) {
    CHECK(h.owned_slots(g) + h.free_slots(g) == h.pool_limit(g));
  }
}

}  // namespace

// ---- host::kv_hierarchy and its configuration ------------------------------------------

TEST_CASE("F1: the hierarchy's views reject a bad group with dhisparse::error", "[fuzz]")
{
  small_hierarchy h(small_config());
  h.admit(request_id{1}, 4);
  for (int g : {-1, 2}) {
    INFO("group " << g);
    CHECK_THROWS_AS(h.slot_table(g), dhisparse::error);  // was std::out_of_range
    CHECK_THROWS_AS(h.tail_slots(g), dhisparse::error);
    CHECK_THROWS_AS(h.misses(g), dhisparse::error);
    CHECK_THROWS_AS(h.counters(g), dhisparse::error);
    CHECK_THROWS_AS(h.owned_slots(g), dhisparse::error);
    CHECK_THROWS_AS(h.free_slots(g), dhisparse::error);
    CHECK_THROWS_AS(h.resident_positions(request_id{1}, g), dhisparse::error);
    CHECK_THROWS_AS(h.pool_limit(g), dhisparse::error);  // read out of bounds
  }
}

TEST_CASE("F2: releasing a request of the current batch leaves the step usable", "[fuzz]")
{
  // Contract (docs/integration.md): a request may be released mid-step; it leaves the step
  // (its batch entry gets 0 queries, its tail rows and misses are dropped) and the other
  // requests' step goes on.
  small_hierarchy h(small_config());
  h.admit(request_id{1}, 8);
  h.admit(request_id{2}, 8);
  request_id const ids[2]     = {request_id{1}, request_id{2}};
  std::int32_t const queries[2] = {2, 2};
  h.set_batch(ids, queries, 2);
  // Each request selects positions 0..3: misses (fetched by retrieve) and two tail rows.
  std::vector<std::int32_t> selections(2 * 2 * 4, -1);
  for (int i = 0; i < 16; ++i) { selections[i] = i % 4; }
  h.resolve(0, selections.data(), 4);
  h.resolve(1, selections.data(), 4);
  REQUIRE(h.misses(0).size() == 8);

  h.release(request_id{2});
  CHECK(h.batch_queries(1) == 0);
  for (int g = 0; g < 2; ++g) {
    CHECK(h.misses(g).size() == 4);  // request 1's only
    for (int j = 0; j < 2; ++j) { CHECK(h.tail_slots(g)[2 + j] == -1); }
  }
  h.retrieve(0);
  h.retrieve(1);
  std::int32_t const accepted[2] = {2, 0};
  h.commit(accepted);
  h.backup();
  CHECK(h.contains(request_id{1}));
  CHECK(!h.contains(request_id{2}));
  CHECK(h.length(request_id{1}) == 10);
  CHECK(h.commit_status()[0] == 0);
  CHECK(h.status() == 0);
  check_slots_accounted(h);

  // Between steps: a released request leaves the batch, which stays usable as it is.
  h.admit(request_id{3}, 8);  // takes request 2's index
  h.release(request_id{1});
  h.resolve(0, selections.data(), 4);
  h.resolve(1, selections.data(), 4);
  CHECK(h.misses(0).empty());
  h.commit(nullptr);
  CHECK(h.length(request_id{3}) == 8);
  CHECK(h.resident_positions(request_id{3}, 0).empty());
  check_slots_accounted(h);
}

TEST_CASE("F5: a new batch before commit does not hand one request's tail slots to another", "[fuzz]")
{
  // Contract (docs/integration.md): set_batch abandons a step left open — every tail row
  // of it is recycled, nothing is committed — so no tail slot outlives its batch.
  small_hierarchy h(small_config());
  h.admit(request_id{1}, 40);
  h.admit(request_id{2}, 0);
  request_id const both[2]    = {request_id{1}, request_id{2}};
  std::int32_t const two[2]   = {2, 2};
  std::vector<std::int32_t> none(2 * 2 * 4, -1);  // no selections: tail rows only
  h.set_batch(both, two, 2);
  h.resolve(0, none.data(), 4);
  h.resolve(1, none.data(), 4);  // group 1: request 1's tail rows at positions 40 and 41
  // The engine drops that step: a new batch of request 2 alone, group 0 only, rejected.
  request_id const second[1] = {request_id{2}};
  std::int32_t const one[1]  = {1};
  h.set_batch(second, one, 1);
  for (int g = 0; g < 2; ++g) {
    CHECK(h.resident_positions(request_id{1}, g).empty());  // the abandoned tails are recycled
    CHECK(h.resident_positions(request_id{2}, g).empty());
  }
  h.resolve(0, none.data(), 4);
  std::int32_t const accepted[1] = {0};
  h.commit(accepted);
  CHECK(h.length(request_id{1}) == 40);
  CHECK(h.length(request_id{2}) == 0);
  CHECK(h.status() == 0);
  check_slots_accounted(h);
  // Both requests step on normally (no uncommitted tail is left behind).
  h.set_batch(both, two, 2);
  h.resolve(0, none.data(), 4);
  h.resolve(1, none.data(), 4);
  h.commit(nullptr);
  CHECK(h.length(request_id{1}) == 42);
  CHECK(h.length(request_id{2}) == 2);
  CHECK(h.status() == 0);
  check_slots_accounted(h);
}

TEST_CASE("F7: a configuration validate accepts has a representable layer count", "[fuzz]")
{
  hierarchy_config c = small_config();
  c.group_layers     = {std::numeric_limits<int>::max(), std::numeric_limits<int>::max()};
  bool refused       = false;
  try {
    detail::validate(c);  // refusing such layer counts would be a valid fix
  } catch (dhisparse::error const&) {
    refused = true;
  }
  // Was: validate accepted, and total_layers() overflowed int (undefined behaviour).
  CHECK(refused);
  c.group_layers = {int(max_total_layers / 2), int(max_total_layers / 2)};
  CHECK_NOTHROW(detail::validate(c));
  CHECK(c.total_layers() == max_total_layers);
  c.group_layers.push_back(1);
  CHECK_THROWS_WITH(detail::validate(c), Catch::Contains("layers in all"));
}

TEST_CASE("F8: backup_interval_steps that validate accepts gives a non-negative budget floor", "[fuzz]")
{
  hierarchy_config c      = small_config();
  c.backup_interval_steps = std::numeric_limits<int>::max();
  try {
    host::kv_hierarchy<row_format::opaque<16>, policy::lru, policy::adaptive_budget<>> h(c);
    h.admit(request_id{1}, 4);
    // Was: essential_floor computed backup_interval_steps + 2 in int (undefined
    // behaviour; it wrapped to a negative floor).
    CHECK(h.floor(request_id{1}) >= 0);
  } catch (dhisparse::error const&) {  // refused: the dirty list would exceed max_dirty_rows
  }
  // validate accepts INT_MAX only where max_batch × max_queries = 1; the floor is exact.
  c.max_batch = c.max_queries = 1;
  CHECK_NOTHROW(detail::validate(c));
  std::int64_t const interval = std::numeric_limits<int>::max();
  CHECK(essential_floor({64, 1, 4, std::numeric_limits<int>::max()}) == 4 + interval + 2);
  c.max_batch = 2;
  CHECK_THROWS_WITH(detail::validate(c), Catch::Contains("backup_interval_steps"));
}

TEST_CASE("F9: commit advances a request only by the tail rows it commits", "[fuzz]")
{
  // Contract (docs/integration.md): commit keeps a tail row only where every group gave it
  // a slot, stops a request at its first missing one and says so per batch entry
  // (`commit_status`, `committed_rows`); a commit with nothing resolved keeps nothing.
  small_hierarchy h(small_config());
  h.admit(request_id{1}, 4);  // capacity 4 + max_queries = 6, backed by one page of 8
  request_id const ids[1]     = {request_id{1}};
  std::int32_t const two[1]   = {2};
  std::vector<std::int32_t> none(2 * 2 * 4, -1);
  h.set_batch(ids, two, 1);
  h.resolve(0, none.data(), 4);
  h.resolve(1, none.data(), 4);
  h.commit(nullptr);
  REQUIRE(h.length(request_id{1}) == 6);
  CHECK(h.committed_rows()[0] == 2);
  CHECK(h.commit_status()[0] == 0);
  for (int i = 0; i < 4; ++i) {
    h.commit(nullptr);  // nothing resolved since: nothing to keep
    CHECK(h.committed_rows()[0] == 0);
    CHECK(h.commit_status()[0] == status_missing_tail);
  }
  CHECK(h.length(request_id{1}) == 6);
  h.prewarm(request_id{1}, 16);
  // Up to the 8 positions its page backs, then past them: resolve gives the tails no
  // slot, and commit keeps none of them.
  h.clear_status();
  h.resolve(0, none.data(), 4);
  h.resolve(1, none.data(), 4);
  h.commit(nullptr);
  CHECK(h.length(request_id{1}) == 8);
  CHECK(h.status() == 0);
  h.resolve(0, none.data(), 4);
  h.resolve(1, none.data(), 4);
  CHECK((h.status() & status_capacity_exceeded) != 0);
  h.commit(nullptr);
  CHECK(h.length(request_id{1}) == 8);
  CHECK(h.commit_status()[0] == status_missing_tail);
  check_slots_accounted(h);
}

// ---- trace::reader ------------------------------------------------------------------------

TEST_CASE("F3: a trace record is checked against the payload before its arrays are allocated", "[fuzz]")
{
  // A valid one-step trace whose header then claims max_queries = top_k = 2^31 - 1: the
  // record's padded arrays would take 2^64 bytes.
  test::scratch_file file("finding_f3");
  patched_one_step_trace(file.path(), 24, {'\xFF', '\xFF', '\xFF', '\x7F', '\xFF', '\xFF', '\xFF', '\x7F'});
  // Rejected when opened (max_queries × top_k beyond max_request_selections); was
  // std::length_error from vector::assign in `next` (smaller claims allocated gigabytes).
  CHECK_THROWS_WITH(read_all(file.path()), Catch::Contains("max_queries × top_k"));
  // Shapes within the limit, but a request count (2^31 - 1 requests, the table alone 48 GiB)
  // that the 1-step payload cannot hold: refused before anything is allocated.
  patched_one_step_trace(file.path(), 20, {'\xFF', '\xFF', '\xFF', '\x7F'});  // max_requests
  patch_payload(file.path(), 4, {'\xFF', '\xFF', '\xFF', '\x7F'});            // the step's count
  CHECK_THROWS_WITH(read_all(file.path()), Catch::Contains("remain in the payload"));
  // One request of one query, but 2^20 groups of it claimed: the stored rows alone would
  // be 4 MiB; refused by the payload left (before the padded arrays are allocated).
  patched_one_step_trace(file.path(), 16, {'\x00', '\x00', '\x10', '\x00'});  // groups
  CHECK_THROWS_WITH(read_all(file.path()), Catch::Contains("remain in the payload"));
}

TEST_CASE("F6: a trace that declares no steps has no payload", "[fuzz]")
{
  // A valid one-step trace whose header then says 0 steps: the step's bytes are left
  // unread and unchecked.
  test::scratch_file file("finding_f6");
  patched_one_step_trace(file.path(), 40, std::vector<char>(8, 0));
  CHECK_THROWS_WITH(read_all(file.path()), Catch::Contains("declares no steps"));  // was: accepted
}

// ---- verify_params --------------------------------------------------------------------------

TEST_CASE("F4: verify_params_problem rejects strides whose rows overflow 64 bits", "[fuzz]")
{
  // Greedy verification of 1 request, 2 drafts, vocabulary 4; p's rows 2^62 elements apart
  // and its requests 1 element apart: (max_drafts + 1) × p_row_stride overflows int64.
  std::int32_t tokens[2] = {0, 1}, accepted[1], emitted[3], next_token[1];
  float p[4]             = {1, 0, 0, 0};
  std::uint32_t status[1];
  verify_params a;
  a.capacity         = 1;
  a.max_drafts       = 2;
  a.vocab            = 4;
  a.draft_tokens     = tokens;
  a.p                = p;
  a.p_row_stride     = std::int64_t{1} << 62;
  a.p_request_stride = 1;
  a.accepted         = accepted;
  a.emitted          = emitted;
  a.next_token       = next_token;
  a.status           = status;
  // Was: the product wrapped (undefined behaviour) and the check passed.
  CHECK_THAT(verify_params_problem(a), Catch::Contains("p_row_stride is too large"));
  a.p_row_stride     = 0;  // default rows, but requests 2^62 elements apart
  a.p_request_stride = std::int64_t{1} << 62;
  CHECK(verify_params_problem(a).empty());  // one request: offsets below 12
  a.capacity = 2;  // capacity × p_request_stride = 2^63 (the bound checked, a little conservative)
  CHECK_THAT(verify_params_problem(a), Catch::Contains("p_request_stride is too large"));
}

TEST_CASE("F18: a host page layout without layer groups is refused", "[fuzz]")
{
  host_store_config c;
  c.tokens_per_page      = 8;
  std::size_t page_bytes = 1;
  CHECK_THROWS_WITH(detail::make_group_layouts(c, {}, 16, page_bytes), Catch::Contains("must not be empty"));
  c.page_bytes = 256;  // a described page changes nothing
  CHECK_THROWS_WITH(detail::make_group_layouts(c, {}, 16, page_bytes), Catch::Contains("must not be empty"));
  CHECK(page_bytes == 1);  // nothing written
  CHECK(detail::make_group_layouts(c, {2}, 16, page_bytes).size() == 1);
  CHECK(page_bytes == 256);
}
