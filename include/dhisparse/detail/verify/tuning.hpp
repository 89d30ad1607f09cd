/**
 * @file detail/verify/tuning.hpp
 * @brief `pass_tuning`: how the one-CTA-per-request kernel runs a request's later sampling
 *        passes (plain C++, so that `verify_async` can name the library's choice).
 */
#pragma once

#include <dhisparse/verify_params.hpp>

namespace dhisparse::detail::verify {

/**
 * A request's later sampling passes (a tree node whose first draft was rejected, the bonus
 * sample after it) run while most other requests of the call have finished: its CTA is
 * alone on its SM and bound by the latency of its own loads. The lever (`bench_verify`
 * with DHISPARSE_VERIFY_TAIL=1 sweeps it against neither; docs/benchmarks.md "verify"):
 * shared passes (shared_pass.cuh) — from the request's `share_from`-th sampling pass on
 * (0-based), the pass is cut into `share_groups` groups of chunks that the CTAs which have
 * finished their own requests claim and read beside the request's CTA. Needs the call's
 * workspace (`verify_params::workspace`, sized for a sampling rule); without one, passes
 * are not shared. (An L2 prefetch of the later passes was measured beside it on the H200
 * and removed: no rule gained more than its spread, the tree rules lost up to 4.5 points.)
 */
struct pass_tuning {
  int share_from   = 1 << 30;
  int share_groups = 16;

  /// Whether some pass of a request may be shared.
  constexpr bool shares() const { return share_from < (1 << 30) && share_groups > 0; }
};

/**
 * The library's choice for a call (`verify_async`). Measured with `bench_verify`'s later-pass
 * sweep on the H200 (docs/benchmarks.md "verify", 2026-12-05): sharing pays only where
 * requests make later passes that read two full rows each — trees with dense q, where a
 * rejected first child is followed by a residual pass over p and q; there, from the second
 * pass on in 4 groups (43% → 51% of copy bandwidth; 2 groups equal within the spread, 3 or 6
 * groups 50%, 8 groups 49%, 16 groups 43%, from the first pass 47%). Every other sampling rule runs 3–18% slower shared (the publish, the
 * combine and the control-block memset cost more than its few later passes gain). Whether
 * a call can share at all (a workspace) is `pass_share::of`'s to decide.
 */
constexpr pass_tuning library_tuning(verify_params const& a)
{
  pass_tuning t{};
  if (a.rule == verify_rule::sampling && a.topology == draft_topology::tree &&
      a.distribution == draft_distribution::dense) {
    t.share_from   = 1;
    t.share_groups = 4;
  }
  return t;
}

}  // namespace dhisparse::detail::verify
