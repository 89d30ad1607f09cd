// The library's one status word (status.hpp): every component's bits in its own range,
// one word holding all of them, and `describe_status` naming each bit set.
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/status.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using namespace dhisparse;

static_assert((status_mask_hierarchy & status_mask_attention) == 0 && (status_mask_hierarchy & status_mask_draft_ring) == 0 &&
              (status_mask_hierarchy & status_mask_verify) == 0 && (status_mask_attention & status_mask_draft_ring) == 0 &&
              (status_mask_attention & status_mask_verify) == 0 && (status_mask_draft_ring & status_mask_verify) == 0);
static_assert(status_mask_all == (status_mask_hierarchy | status_mask_attention | status_mask_draft_ring | status_mask_verify));
static_assert((status_mask_all & (3u << 30)) == 0, "bits 30 and 31 belong to no component");

namespace {

using named_bits = std::vector<std::pair<std::uint32_t, char const*>>;

// Every bit of every component, written out here (not read from status.hpp's table), so
// that a bit added without a name, or a name that drifts, fails.
named_bits const hierarchy_bits = {
  {status_invalid_selection, "invalid_selection"},   {status_budget_exceeded, "budget_exceeded"},
  {status_pool_exhausted, "pool_exhausted"},         {status_capacity_exceeded, "capacity_exceeded"},
  {status_dirty_list_overflow, "dirty_list_overflow"}, {status_invalid_accept_count, "invalid_accept_count"},
  {status_uncommitted_tail, "uncommitted_tail"},     {status_missing_tail, "missing_tail"},
  {status_invalid_drafts, "invalid_drafts"},         {status_invalid_batch, "invalid_batch"},
};
named_bits const attention_bits = {{sparse_attention::status_invalid_slot, "attention.invalid_slot"}};
named_bits const draft_ring_bits = {
  {draft_ring_status::bad_batch_size, "draft_ring.bad_batch_size"},
  {draft_ring_status::bad_count, "draft_ring.bad_count"},
  {draft_ring_status::rollback_past_window, "draft_ring.rollback_past_window"},
  {draft_ring_status::bad_request, "draft_ring.bad_request"},
  {draft_ring_status::bad_start, "draft_ring.bad_start"},
  {draft_ring_status::bad_path, "draft_ring.bad_path"},
};
named_bits const verify_bits = {
  {verify_status::bad_batch_size, "verify.bad_batch_size"},     {verify_status::bad_num_drafts, "verify.bad_num_drafts"},
  {verify_status::bad_draft_token, "verify.bad_draft_token"},   {verify_status::bad_tree, "verify.bad_tree"},
  {verify_status::bad_candidates, "verify.bad_candidates"},     {verify_status::p_not_finite, "verify.p_not_finite"},
  {verify_status::p_negative, "verify.p_negative"},             {verify_status::p_not_normalized, "verify.p_not_normalized"},
  {verify_status::q_not_finite, "verify.q_not_finite"},         {verify_status::q_negative, "verify.q_negative"},
  {verify_status::q_not_normalized, "verify.q_not_normalized"}, {verify_status::draft_not_in_q, "verify.draft_not_in_q"},
  {verify_status::bad_target_token, "verify.bad_target_token"},
};

/// The names of `describe_status(bits)`, split at '|'.
std::vector<std::string> names_of(std::uint32_t bits)
{
  std::string const text = describe_status(bits);
  std::vector<std::string> out;
  std::size_t begin = 0;
  for (std::size_t end; (end = text.find('|', begin)) != std::string::npos; begin = end + 1) {
    out.push_back(text.substr(begin, end - begin));
  }
  out.push_back(text.substr(begin));
  return out;
}

bool has_name(std::vector<std::string> const& names, std::string const& name)
{
  for (auto const& n : names) {
    if (n == name) { return true; }
  }
  return false;
}

}  // namespace

TEST_CASE("each component's bits are single bits inside its own range", "[status]")
{
  std::pair<named_bits const*, std::uint32_t> const components[] = {
    {&hierarchy_bits, status_mask_hierarchy},
    {&attention_bits, status_mask_attention},
    {&draft_ring_bits, status_mask_draft_ring},
    {&verify_bits, status_mask_verify},
  };
  std::uint32_t seen = 0;
  for (auto const& [bits, mask] : components) {
    for (auto const& [bit, name] : *bits) {
      INFO(name);
      CHECK(bit != 0);
      CHECK((bit & (bit - 1)) == 0);
      CHECK((bit & ~mask) == 0);
      CHECK((bit & seen) == 0);
      seen |= bit;
    }
  }
  // Every owned bit is named.
  CHECK(seen == status_mask_all);
  // verify's q_* bits are its p_* bits shifted by 3 (detail::verify::probability_flags).
  CHECK(verify_status::q_not_finite == verify_status::p_not_finite << 3);
  CHECK(verify_status::q_not_normalized == verify_status::p_not_normalized << 3);
}

TEST_CASE("one word holds every component's bits and describe_status names them all", "[status]")
{
  std::uint32_t word = 0;
  std::vector<std::string> expected;
  for (named_bits const* bits : {&hierarchy_bits, &attention_bits, &draft_ring_bits, &verify_bits}) {
    for (auto const& [bit, name] : *bits) {
      word |= bit;
      expected.emplace_back(name);
      CHECK(describe_status(bit) == name);  // alone: exactly its name
    }
  }
  std::vector<std::string> const names = names_of(word);
  CHECK(names == expected);  // each bit once, components in bit order
  CHECK_FALSE(has_name(names, "unknown"));

  // The explained form names every bit and the argument at fault.
  std::string const explained = describe_status(word, status_format::explained);
  for (auto const& name : expected) { CHECK(explained.find(name + " (") != std::string::npos); }
  CHECK(explained.find("first_child") != std::string::npos);
  CHECK(explained.find("num_slots") != std::string::npos);

  // Bits no component owns (bits 30 and 31).
  for (std::uint32_t const stray : {1u << 30, 1u << 31}) {
    CHECK(describe_status(stray) == "unknown");
    std::vector<std::string> const with = names_of(word | stray);
    CHECK(with.size() == expected.size() + 1);
    CHECK(with.back() == "unknown");
  }
  CHECK(describe_status(0) == "ok");
  CHECK(describe_status(0, status_format::explained) == "ok");
}

TEST_CASE("a draft ring's bits OR into a hierarchy's word without colliding", "[status]")
{
  // What commit_verified does when verified_step::ring_status points at the word that
  // resolve and commit raise their bits in: both sets stay readable.
  host::draft_ring ring(2, 4, 1, 16);
  std::vector<std::int32_t> const drafted = {1, 0}, accepted = {3, 0};  // accepted > drafted
  ring.rollback(drafted.data(), accepted.data(), nullptr);
  REQUIRE(ring.status() == draft_ring_status::bad_count);
  std::uint32_t const word = status_invalid_selection | status_missing_tail | ring.status();
  CHECK((word & status_mask_hierarchy) == (status_invalid_selection | status_missing_tail));
  CHECK((word & status_mask_draft_ring) == draft_ring_status::bad_count);
  CHECK(describe_status(word) == "invalid_selection|missing_tail|draft_ring.bad_count");
}
