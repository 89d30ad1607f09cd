// The protocol of shared row passes (detail/verify/shared_pass.cuh) run by host threads:
// each thread stands for a CTA — an owner that publishes its request's passes and runs
// groups of them, then helps, or a helper from the start — through the same claim, count
// and search functions the kernel calls. Every group of every pass must run exactly once,
// after its descriptor was written, and the owner must see every group before it goes on;
// at the end every claim is closed. (The GPU test checks the outputs bit for bit; this one
// checks the bookkeeping under real concurrency, on any machine.)
#include <dhisparse/detail/verify/shared_pass.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace dhisparse;
using namespace dhisparse::detail::verify;

namespace {

/// The control words of `requests` requests (as many as the workspace layout gives them),
/// and a `pass_share` over them.
struct control_block {
  std::vector<std::uint32_t> words;
  pass_share s;

  control_block(int requests, int groups)
    : words(workspace_layout::of(requests, 0, 1, true).control_bytes / 4, 0u)
  {
    s.control  = words.data();
    s.capacity = requests;
    s.groups   = groups;
    s.nchunks  = groups;
  }
};

}  // namespace

TEST_CASE("shared passes: each group of each pass runs once, after its descriptor, before the owner goes on",
          "[verify][share]")
{
  bool const small = std::getenv("DHISPARSE_TEST_SMALL") != nullptr;
  std::uint32_t const passes = small ? 40 : 300;
  for (int const groups : {1, 3, 16}) {
    for (int const requests : {1, 5, 37}) {
      int const helpers = 3;
      int const grid    = requests + helpers;
      INFO("groups " << groups << " requests " << requests);
      control_block cb(requests, groups);
      pass_share const& s = cb.s;
      // Per request, plain memory the protocol must order: the descriptor (the pass it
      // describes), and per group the pass that last ran it and how often it ran.
      struct request_state {
        std::uint32_t desc = 0;
        std::vector<std::uint32_t> ran, runs;
      };
      std::vector<request_state> st(requests);
      for (auto& r : st) { r.ran.assign(groups, 0), r.runs.assign(groups, 0); }
      std::atomic<int> stale{0}, wrong{0}, stuck{0};

      auto run_group = [&](int b, int g, std::uint32_t gen) {
        if (st[b].desc != gen) { ++stale; }  // published after its descriptor, claimed with acquire
        st[b].ran[g] = gen;
        ++st[b].runs[g];
        count_group_done(s, b);
      };
      auto help = [&](unsigned cta) {
        for (int idle = 0; idle < (1 << 24);) {
          if (helpers_stop(s, requests, unsigned(grid))) { return; }
          share_job const job = find_group(s, requests, cta / 32);
          if (job.g < 0) {
            ++idle;
            std::this_thread::yield();
            continue;
          }
          idle = 0;
          run_group(job.b, job.g, job.gen);
        }
        ++stuck;
      };
      std::vector<std::thread> ctas;
      for (int c = 0; c < grid; ++c) {
        ctas.emplace_back([&, c] {
          share_atomic(s.started()).fetch_add(1u);
          if (c < requests) {
            request_state& mine = st[c];
            for (std::uint32_t gen = 1; gen <= passes; ++gen) {
              mine.desc = gen;
              publish_pass(s, c, gen);
              for (int g = claim_group(s, c, gen); g >= 0; g = claim_group(s, c, gen)) { run_group(c, g, gen); }
              while (!pass_done(s, c)) { std::this_thread::yield(); }
              for (int g = 0; g < groups; ++g) {  // every group of this pass, once per pass so far
                if (mine.ran[g] != gen || mine.runs[g] != gen) { ++wrong; }
              }
            }
            share_atomic(s.finished()).fetch_add(1u);
          }
          help(unsigned(c));
        });
      }
      for (auto& t : ctas) { t.join(); }
      CHECK(stale == 0);
      CHECK(wrong == 0);
      CHECK(stuck == 0);
      for (int b = 0; b < requests; ++b) {  // every claim closed at the last pass, every group counted
        CHECK(*s.claim(b) == ((passes << 16) | std::uint32_t(groups)));
        CHECK(*s.done(b) == std::uint32_t(groups));
      }
      for (int w = 0; w < (requests + 31) / 32; ++w) { CHECK(*s.open(w) == 0u); }
    }
  }
}

TEST_CASE("shared passes: helpers wait only while every CTA has started and some request is running",
          "[verify][share]")
{
  control_block cb(4, 2);
  pass_share const& s = cb.s;
  *s.started() = 5;
  CHECK(helpers_stop(s, 4, 6));   // a CTA of the grid has not started: polling could hold its SM
  *s.started() = 6;
  CHECK_FALSE(helpers_stop(s, 4, 6));
  *s.finished() = 4;
  CHECK(helpers_stop(s, 4, 6));   // every request finished
  CHECK(helpers_stop(s, 0, 6));   // an empty batch
  // Nothing open: nothing found; an open pass is claimed group by group, then closed.
  *s.finished() = 0;
  CHECK(find_group(s, 4, 0).g == -1);
  publish_pass(s, 2, 7);
  share_job const a = find_group(s, 4, 0), b = find_group(s, 4, 1);
  CHECK((a.b == 2 && a.g == 0 && a.gen == 7u));
  CHECK((b.b == 2 && b.g == 1 && b.gen == 7u));
  CHECK(*s.open(0) == 0u);
  CHECK(find_group(s, 4, 0).g == -1);
  CHECK(claim_group(s, 2, 6) == -1);  // another pass's number never claims
  CHECK_FALSE(pass_done(s, 2));
  count_group_done(s, 2);
  count_group_done(s, 2);
  CHECK(pass_done(s, 2));
  // A request at or past the batch size is never claimed.
  publish_pass(s, 3, 1);
  CHECK(find_group(s, 3, 0).g == -1);
}

TEST_CASE("shared passes: groups cut the chunks into contiguous, non-empty ranges; off without a workspace",
          "[verify][share]")
{
  verify_params a;
  a.rule       = verify_rule::sampling;
  a.capacity   = 40;
  a.max_drafts = 8;
  std::vector<unsigned char> memory;
  for (std::int64_t const V : {37, 5000, 151552, 1100003}) {
    a.vocab = V;
    memory.assign(verify_workspace_bytes(a), 0);
    a.workspace       = memory.data();
    a.workspace_bytes = memory.size();
    for (int const asked : {1, 7, 16, 64, 1000}) {
      pass_tuning t;
      t.share_from   = 1;
      t.share_groups = asked;
      pass_share const s = pass_share::of(a, t);
      INFO("V " << V << " groups " << asked);
      REQUIRE(s.on());
      std::int64_t const len = chunk_length(V);
      CHECK(s.nchunks == int((V + len - 1) / len));  // the definition, not chunk_count
      CHECK(s.groups == std::min({asked, max_share_groups, s.nchunks}));
      CHECK(s.chunk_begin(0) == 0);
      CHECK(s.chunk_begin(s.groups) == s.nchunks);
      for (int g = 0; g < s.groups; ++g) { CHECK(s.chunk_begin(g) < s.chunk_begin(g + 1)); }
      // Inside the workspace: the partials of the last request end within it.
      auto const end = reinterpret_cast<unsigned char const*>(s.partials + std::size_t(a.capacity) * max_share_groups);
      CHECK(end <= memory.data() + memory.size());
    }
  }
  pass_tuning t;
  t.share_from = 0;
  verify_params b = a;
  b.workspace     = nullptr;
  CHECK_FALSE(pass_share::of(b, t).on());  // no workspace
  b           = a;
  b.rule      = verify_rule::greedy;
  CHECK_FALSE(pass_share::of(b, t).on());  // greedy rules make no sampling passes
  CHECK_FALSE(pass_share::of(a, pass_tuning{}).on());  // the library's default: off
}
