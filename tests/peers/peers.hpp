/**
 * @file peers.hpp
 * @brief What broke for the users of our peers (shared PEERS.md), as scenarios that show
 *        it does not break here (issue 18, item 4). Each scenario drives a backend of the
 *        soak (tests/soak: host reference or GPU) through the soak driver's scripted API,
 *        so every step gets the soak's checks (slot accounting, slot ownership, the exact
 *        bytes of every served row, status words) and the host store is compared with the
 *        truth at the end. Each returns the driver's report; violations must be 0.
 *
 * `Make` builds a backend from a configuration: `std::unique_ptr<Backend> make(config)`.
 */
#pragma once

#include <dhisparse/hierarchy_config.hpp>

#include "soak.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhisparse::test::peers {

/// The base configuration of the scenarios (two groups of 1 and 2 layers).
inline hierarchy_config base_config()
{
  hierarchy_config c;
  c.group_layers           = {1, 2};
  c.max_requests           = 8;
  c.max_batch              = 8;
  c.max_queries            = 4;
  c.max_top_k              = 64;
  c.max_context            = 12288;
  c.device_slots_per_group = 8192;
  c.map_page_positions     = 1024;
  c.backup_interval_steps  = 4;
  c.host.tokens_per_page   = 64;
  c.host.capacity_pages    = 2048;
  return c;
}

/// The options of a scenario's driver: the soak's, with `seed`.
inline soak::options seeded(std::uint64_t seed)
{
  soak::options o;
  o.seed = seed;
  return o;
}

/// `r` with `problems` (checks of the scenario itself) counted as violations.
inline soak::report with_problems(soak::report r, std::vector<std::string> const& problems)
{
  r.messages.insert(r.messages.end(), problems.begin(), problems.end());
  r.violations += std::int64_t(problems.size());
  return r;
}

/// Selects the last `top_k` positions a query may select (its own tail row included): the
/// rows that cross page and map-page boundaries as a request grows.
inline void select_recent(std::uint64_t, int q, std::int32_t length, std::int32_t* row, int top_k)
{
  std::int32_t const limit = length + q;
  for (int k = 0; k < top_k; ++k) { row[k] = limit - k >= 0 ? limit - k : -1; }
}

/// Runs steps over `ids` (batches of max_batch) until every request reached `until[id]`
/// committed positions: plain decoding (every query kept) with `queries` per step.
template <class Driver>
void decode_to(Driver& d, hierarchy_config const& c, std::vector<std::uint64_t> const& ids,
               std::vector<std::int32_t> const& until, int queries)
{
  for (bool more = true; more;) {
    more = false;
    typename Driver::step_spec spec;
    spec.top_k  = c.max_top_k;
    spec.plain  = true;
    spec.select = select_recent;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::int32_t const left = until[i] - d.length(ids[i]);
      if (left <= 0) { continue; }
      spec.ids.push_back(ids[i]);
      spec.queries.push_back(std::min(left, queries));
      more = true;
      if (int(spec.ids.size()) == c.max_batch) { break; }
    }
    if (more) { d.run_step(spec); }
  }
}

/**
 * @brief SGLang HiSparse: "host mem pool alloc failed" after 38 requests — admission did
 *        not reserve what decoding would write. Here admission reserves each request's
 *        capacity (prompt + decode budget) in the host store: it refuses a request the
 *        store cannot hold with "host store exhausted" (changing nothing), and every
 *        request it admitted then decodes to its full capacity without a reserve, a
 *        capacity flag or a lost row. A release gives the pages back to the next admission.
 */
template <class Backend, class Make>
soak::report decode_growth(Make&& make, std::uint64_t seed)
{
  hierarchy_config c       = base_config();
  c.host.capacity_pages    = 40;   // 2560 positions
  c.max_context            = 2048;
  std::int32_t const prompt = 300, decode = 340;  // capacity 640 = 10 pages: 4 requests fit
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::vector<std::uint64_t> ids;
  std::vector<std::int32_t> until;
  std::string refusal;
  for (std::uint64_t id = 1; id <= 6; ++id) {
    if (!d.admit_request(id, prompt, prompt + decode, &refusal)) { break; }
    ids.push_back(id);
    until.push_back(prompt + decode);
  }
  std::vector<std::string> problems;
  if (ids.size() != 4) { problems.push_back("admitted " + std::to_string(ids.size()) + " requests, 4 fit"); }
  if (refusal.find("host store exhausted") == std::string::npos) {
    problems.push_back("the fifth admission was not refused for the host store: '" + refusal + "'");
  }
  decode_to(d, c, ids, until, c.max_queries);  // to the last position reserved at admission
  d.release_request(ids.front(), true);
  ids.erase(ids.begin());
  until.erase(until.begin());
  if (!d.admit_request(7, prompt, prompt + decode, &refusal)) {
    problems.push_back("admission after a release was refused: " + refusal);
  }
  ids.push_back(7);
  until.push_back(prompt + decode);
  decode_to(d, c, ids, until, c.max_queries);
  d.check_all();
  return with_problems(d.current_report(), problems);
}

/**
 * @brief SGLang: an illegal memory access with draft pages beyond 4096 tokens. Requests
 *        whose verify steps (1 + 3 drafts) straddle positions 4096 and 8192 — host-store
 *        pages, residency-map pages — with random accepted lengths (rejected drafts are
 *        rewritten at the same positions by later steps), selecting their most recent rows.
 */
template <class Backend, class Make>
soak::report drafts_beyond_4096(Make&& make, std::uint64_t seed)
{
  hierarchy_config const c   = base_config();
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::vector<std::uint64_t> const ids{1, 2, 3, 4};
  std::vector<std::int32_t> const lengths{4090, 4093, 4095, 8187};
  for (std::size_t i = 0; i < ids.size(); ++i) { d.admit_request(ids[i], lengths[i], lengths[i] + 128); }
  for (int s = 0; s < 24; ++s) {
    typename soak::driver<Backend>::step_spec spec;
    spec.ids     = ids;
    spec.queries = std::vector<std::int32_t>(ids.size(), c.max_queries);
    spec.top_k   = c.max_top_k;
    spec.select  = select_recent;
    // Accepted lengths left empty: drawn at random in [0, 4] by the driver.
    d.run_step(spec);
  }
  d.check_all();
  return d.current_report();
}

/**
 * @brief SGLang: crashes with several long-context requests at once. max_requests
 *        requests of 10-12K tokens admitted back to back (the pool's floors and the host
 *        store full), a ninth refused with a clear error, then verify steps of all of them
 *        selecting across their whole contexts.
 */
template <class Backend, class Make>
soak::report many_long_contexts(Make&& make, std::uint64_t seed, int steps)
{
  hierarchy_config c         = base_config();
  c.host.capacity_pages      = std::size_t(c.max_requests) * (c.max_context / c.host.tokens_per_page);
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::vector<std::uint64_t> ids;
  std::vector<std::string> problems;
  for (std::uint64_t id = 1; id <= std::uint64_t(c.max_requests); ++id) {
    std::int32_t const length = c.max_context - 2048 + std::int32_t(id) * 200;
    std::string refusal;
    if (!d.admit_request(id, length, c.max_context, &refusal)) {
      problems.push_back("long request " + std::to_string(id) + " refused: " + refusal);
      continue;
    }
    ids.push_back(id);
  }
  std::string refusal;
  if (d.admit_request(100, 1000, 2000, &refusal) || refusal.find("max_requests") == std::string::npos) {
    problems.push_back("a ninth request was not refused for max_requests: '" + refusal + "'");
  }
  for (int s = 0; s < steps; ++s) {
    typename soak::driver<Backend>::step_spec spec;
    spec.ids     = ids;
    spec.queries = std::vector<std::int32_t>(ids.size(), 1 + s % c.max_queries);
    spec.top_k   = c.max_top_k;  // random selections over the whole context
    d.run_step(spec);
  }
  d.check_all();
  return with_problems(d.current_report(), problems);
}

/**
 * @brief vLLM: noise in the first decoded token. Requests admitted at lengths around page
 *        and map-page boundaries (0, 1, 63, 64, 65, 1023, 1024, 4095, 4096), some
 *        prewarmed, take their first step at once selecting their latest rows and their
 *        first tail row; the second step selects that first decoded row again (now
 *        committed), and it reaches the host store exactly.
 */
template <class Backend, class Make>
soak::report first_token(Make&& make, std::uint64_t seed)
{
  hierarchy_config const c   = base_config();
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::vector<std::int32_t> const lengths{0, 1, 63, 64, 65, 1023, 1024, 4095, 4096};
  std::uint64_t id = 1;
  for (std::int32_t length : lengths) {
    for (int prewarm = 0; prewarm < 2; ++prewarm, ++id) {
      d.admit_request(id, length, length + 16);
      if (prewarm != 0) { d.backend().prewarm(request_id{id}, 2 * c.max_top_k); }
      for (int s = 0; s < 2; ++s) {  // the first token, then the first token selected again
        typename soak::driver<Backend>::step_spec spec;
        spec.ids      = std::vector<std::uint64_t>{id};
        spec.queries  = std::vector<std::int32_t>{1};
        spec.top_k    = c.max_top_k;
        spec.accepted = std::vector<std::int32_t>{1};
        spec.select   = select_recent;
        d.run_step(spec);
      }
      d.check_host(id);
      d.release_request(id, false);
    }
  }
  d.check_all();
  return d.current_report();
}

/**
 * @brief Requests released while a backup is in flight. A step commits rows, its backup is
 *        enqueued and not waited for, the request is released and a new one admitted at
 *        once (its host pages may be the released ones) with its prompt written into the
 *        host store; then (a) the new request's prompt and every other request's rows
 *        are exact after the backup completes, and (b) a release with rows committed and
 *        never backed up does not write them into pages handed to the next request. On the
 *        GPU the stream is held (`stall`) before the backup, so that it is certainly still
 *        queued when the host writes the new prompt.
 */
template <class Backend, class Make>
soak::report release_during_backup(Make&& make, std::uint64_t seed, int rounds)
{
  hierarchy_config c         = base_config();
  c.host.capacity_pages      = 64;  // few free pages: a new admission reuses released ones
  c.max_context              = 2048;
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::uint64_t next = 1;
  std::vector<std::uint64_t> live;
  for (; next <= 3; ++next) {
    d.admit_request(next, 900, 1000);
    live.push_back(next);
  }
  for (int round = 0; round < rounds; ++round) {
    typename soak::driver<Backend>::step_spec spec;
    spec.ids     = live;
    spec.queries = std::vector<std::int32_t>(live.size(), c.max_queries);
    spec.top_k   = c.max_top_k;
    spec.plain   = true;
    spec.backup  = 0;
    spec.select  = select_recent;
    d.run_step(spec);
    bool const in_flight = round % 2 == 0;
    if (in_flight) {  // (a); else (b): the committed rows are never backed up
      d.backend().stall();  // GPU: the backup below is still queued while the host goes on
      d.backup_async();
    }
    std::uint64_t const gone = live.front();
    live.erase(live.begin());
    d.release_request(gone, false, !in_flight);  // no accounting check: it would wait for the backup
    d.admit_request(next, 900, 1000);
    live.push_back(next++);
    for (std::uint64_t id : live) { d.check_host(id); }
    if (d.current_report().violations > 0) { break; }
  }
  d.check_all();
  return d.current_report();
}

/**
 * @brief Faults (issue 18, item 5): refused requests and calls leave the hierarchy usable
 *        for the others. A pool that holds the floors of three requests: a fourth is
 *        refused for the floors, others for a known id, a length beyond max_context and the
 *        host store; set_pool_limit below the floors, a release of an unknown id, batches
 *        with an unknown or repeated id are refused — each naming its cause and changing
 *        nothing — and the three requests go on decoding (with invalid entries injected,
 *        which are flagged and served as empty) with every row exact.
 */
template <class Backend, class Make>
soak::report usable_after_rejections(Make&& make, std::uint64_t seed, int steps)
{
  hierarchy_config c         = base_config();
  c.device_slots_per_group   = 3 * (c.max_queries * c.max_top_k + c.max_queries * (c.backup_interval_steps + 2)) + 10;
  c.host.capacity_pages      = 80;
  std::unique_ptr<Backend> b = make(c);
  soak::driver<Backend> d(*b, seeded(seed));
  std::vector<std::string> problems;
  auto const refused = [&](char const* what, std::string const& message, char const* cause) {
    if (message.find(cause) == std::string::npos) {
      problems.push_back(std::string(what) + ": refused without naming '" + cause + "': '" + message + "'");
    }
  };
  for (std::uint64_t id = 1; id <= 3; ++id) { d.admit_request(id, 600, 1000); }
  std::string why;
  if (d.admit_request(4, 600, 1000, &why)) { problems.push_back("a fourth request fit beside three floors"); }
  refused("a fourth request", why, "budget floors");
  if (d.admit_request(2, 10, 100, &why)) { problems.push_back("a known id was admitted again"); }
  refused("a known id", why, "already");
  if (d.admit_request(5, c.max_context + 1, -1, &why)) { problems.push_back("a length beyond max_context was admitted"); }
  refused("a length beyond max_context", why, "max_context");
  auto const refuse = [&](char const* what, char const* cause, auto&& op) {
    try {
      op();
      problems.push_back(std::string(what) + " was accepted");
    } catch (::dhisparse::error const& e) {
      refused(what, e.what(), cause);
    }
  };
  Backend& be = d.backend();
  refuse("set_pool_limit below the floors", "floors", [&] { be.set_pool_limit(0, be.floor_sum() - 1); });
  refuse("release of an unknown id", "unknown request id", [&] { be.release(request_id{99}); });
  refuse("a batch with an unknown id", "unknown request id",
         [&] { be.set_batch({request_id{1}, request_id{99}}, {1, 1}); });
  refuse("a batch with a repeated id", "twice", [&] { be.set_batch({request_id{1}, request_id{1}}, {1, 1}); });
  for (int s = 0; s < steps; ++s) {
    typename soak::driver<Backend>::step_spec spec;
    spec.ids         = std::vector<std::uint64_t>{1, 2, 3};
    spec.queries     = std::vector<std::int32_t>{1 + s % 4, 4, 2};
    spec.bad_entries = true;
    d.run_step(spec);
  }
  // The host store: a request larger than what is left is refused, a smaller one admitted.
  if (d.admit_request(6, 1500, 2100, &why)) { problems.push_back("a request beyond the host store was admitted"); }
  refused("a request beyond the host store", why, "host store exhausted");
  d.release_request(3, true);
  if (!d.admit_request(7, 100, 400, &why)) { problems.push_back("admission after a release refused: " + why); }
  for (int s = 0; s < steps; ++s) {
    typename soak::driver<Backend>::step_spec spec;
    spec.ids     = std::vector<std::uint64_t>{1, 2, 7};
    spec.queries = std::vector<std::int32_t>{2, 1, 4};
    d.run_step(spec);
  }
  d.check_all();
  return with_problems(d.current_report(), problems);
}

}  // namespace dhisparse::test::peers
