// The planner against an exhaustive oracle: every checkpoint subset of small random chains and
// DAGs (up to 16 vertices), priced by an independent implementation of the cost model below.
#include <dropit/checkpoint.hpp>

#include "checkpoint_oracle.hpp"
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace dropit_test;  // small_dag, the oracle, random graphs; ck = dropit::checkpoint

namespace {

/// Checks a library plan against the oracle: same optimum, and the plan's own checkpoint set,
/// priced by the oracle, costs what the plan says and has exactly the plan's segments.
void check_plan(const small_dag& d, const ck::graph& g, const std::vector<ck::vertex_index>& index,
                const ck::plan& p, ck::cost_t best) {
  CHECK(p.cost == best);
  std::vector<int> back(g.vertex_count());
  for (int v = 0; v < d.n; ++v)
    back[index[static_cast<std::size_t>(v)]] = v;
  std::uint32_t kept = 0;
  for (auto v : p.checkpoints)
    kept |= 1u << back[v];
  CHECK(std::popcount(kept) == static_cast<int>(p.checkpoints.size()));
  std::vector<oracle_segment> segs;
  const auto c = oracle_cost(d, kept, &segs);
  REQUIRE(c.has_value());
  CHECK(*c == p.cost);
  REQUIRE(segs.size() == p.segments.size());
  for (const auto& ps : p.segments) {
    std::uint32_t mask = 0;
    for (auto v : ps.vertices)
      mask |= 1u << back[v];
    const auto it = std::find_if(segs.begin(), segs.end(),
                                 [&](const oracle_segment& o) { return o.vertices == mask; });
    REQUIRE(it != segs.end());
    CHECK(it->entry == back[ps.entry]);
    CHECK(it->exit == back[ps.exit]);
  }
}

}  // namespace

TEST_CASE("oracle sanity: hand-checked values") {
  // Diamond s(0) -> a(1), b(2) -> c(3) -> t(4): {c} gives 5 + max(4, 6) = 11.
  small_dag d{5, 0, 4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}, {3, 4}}, {1, 4, 6, 5, 1}};
  CHECK(oracle_best(d) == 11);
  CHECK(oracle_cost(d, 0b1000) == 11);
  CHECK(!oracle_cost(d, 0b0010).has_value());  // {a}: {b, c} entered from s and a
  CHECK(oracle_cost(d, 0) == 15);
}

TEST_CASE("random DAGs: solve matches the exhaustive optimum") {
  std::mt19937_64 rng(7);
  const double densities[] = {0.1, 0.2, 0.3, 0.45, 0.6, 0.8};
  const ck::cost_t max_costs[] = {1, 5, 100, 1'000'000'000'000};
  int rounds = 0;
  for (int round = 0; round < 1500; ++round) {
    const int n = 2 + round % 15;  // 2..16 vertices
    const small_dag d = random_dag(rng, n, densities[round % 6], max_costs[(round / 6) % 4]);
    CAPTURE(round);
    const ck::cost_t best = oracle_best(d);
    std::vector<ck::vertex_index> index;
    const ck::graph g = to_graph(d, rng, index);
    check_plan(d, g, index, ck::solve(g), best);
    ++rounds;
  }
  CHECK(rounds == 1500);
}

TEST_CASE("random DAGs: evaluate agrees with the oracle on every subset") {
  std::mt19937_64 rng(99);
  for (int round = 0; round < 60; ++round) {
    const int n = 3 + round % 8;  // up to 10 vertices: 256 subsets each
    const small_dag d = random_dag(rng, n, 0.35, 20);
    std::vector<ck::vertex_index> index;
    const ck::graph g = to_graph(d, rng, index);
    const std::uint32_t inner = ((1u << n) - 1) & ~1u & ~(1u << (n - 1));
    for (std::uint32_t sub = inner;; sub = (sub - 1) & inner) {
      std::vector<ck::vertex_index> keep;
      for (int v = 0; v < n; ++v)
        if ((sub >> v) & 1u) keep.push_back(index[static_cast<std::size_t>(v)]);
      const auto expected = oracle_cost(d, sub);
      CAPTURE(round);
      CAPTURE(sub);
      if (expected) {
        const auto p = ck::evaluate(g, keep);
        CHECK(p.cost == *expected);
        check_plan(d, g, index, p, *expected);
      } else {
        CHECK_THROWS_AS((void)ck::evaluate(g, keep), dropit::error);
      }
      if (sub == 0) break;
    }
  }
}

namespace {

/// The optimum of a chain whose inner costs are `inner`, by its definition for chains: the least
/// sum of kept costs such that every run of dropped vertices costs at most M, plus M, minimised
/// over every M a run can cost (interval DP per M; O(n^4), fine for n <= 48).
ck::cost_t chain_oracle(const std::vector<ck::cost_t>& inner) {
  const std::size_t m = inner.size();
  std::vector<ck::cost_t> prefix(m + 1, 0);
  for (std::size_t i = 0; i < m; ++i)
    prefix[i + 1] = prefix[i] + inner[i];
  std::vector<ck::cost_t> bounds{0};
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = i + 1; j <= m; ++j)
      bounds.push_back(prefix[j] - prefix[i]);
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  ck::cost_t best = std::numeric_limits<ck::cost_t>::max();
  for (const ck::cost_t bound : bounds) {
    // kept[j]: least kept cost of the first j inner vertices with vertex j - 1 kept (j = 0: none).
    constexpr ck::cost_t none = std::numeric_limits<ck::cost_t>::max();
    std::vector<ck::cost_t> kept(m + 1, none);
    kept[0] = 0;
    ck::cost_t answer = none;
    for (std::size_t j = 0; j <= m; ++j) {
      // The last kept vertex before position j (exclusive) is at i - 1; vertices i..j-1 dropped.
      ck::cost_t here = none;
      for (std::size_t i = 0; i <= j; ++i)
        if (kept[i] != none && prefix[j] - prefix[i] <= bound) here = std::min(here, kept[i]);
      if (j == m) {
        answer = here;
      } else if (here != none) {
        kept[j + 1] = here + inner[j];  // keep vertex j
      }
    }
    if (answer != none) best = std::min(best, answer + bound);
  }
  return best;
}

}  // namespace

TEST_CASE(
    "chains: solve and solve_linear match the exhaustive optimum, and an interval DP beyond") {
  // Up to 16 vertices every checkpoint subset is priced (and checks the interval DP too); 17 to
  // 48 vertices, beyond the exhaustive oracle's reach, against the interval DP over every bound:
  // the search over the bound M skips bounds (issue 15 item 7) and must never skip the optimum.
  std::mt19937_64 rng(20240601);
  for (int round = 0; round < 460; ++round) {
    const bool small = round < 400;
    const int n = small ? 1 + round % 16 : 17 + round % 32;
    const ck::cost_t max_cost = std::array<ck::cost_t, 4>{1, 9, 1000, 1'000'000'000'000}[round % 4];
    const small_dag d = random_chain(rng, n, max_cost);
    CAPTURE(round);
    CAPTURE(n);
    std::vector<ck::vertex_index> index;
    const ck::graph g = to_graph(d, rng, index);
    if (n == 1) continue;  // a single vertex is its own source and target; see checkpoint_test
    const std::vector<ck::cost_t> inner(d.cost.begin() + 1, d.cost.end() - 1);
    const ck::cost_t interval = chain_oracle(inner);
    if (small) {
      const ck::cost_t best = oracle_best(d);
      CHECK(interval == best);
      check_plan(d, g, index, ck::solve(g), best);
      check_plan(d, g, index, ck::solve_linear(g), best);
    } else {
      CHECK(ck::solve(g).cost == interval);
      CHECK(ck::solve_linear(g).cost == interval);
    }
  }
}

TEST_CASE("a chain of 20,000 unit costs: the optimum in O(sqrt(n)) passes of the program") {
  // k checkpoints split the other n - k vertices into k + 1 runs: cost k + ceil((n - k) / (k + 1)),
  // minimised over k by brute force. Before the search skipped bounds it made one pass per bound
  // from n down to about sqrt(n) / 2: about 19,900 passes of O(n) each (10.7 s).
  constexpr ck::cost_t n = 20'000;
  ck::cost_t best = n;
  for (ck::cost_t k = 0; k <= n; ++k)
    best = std::min(best, k + (n - k + (k + 1) - 1) / (k + 1));  // ceil((n - k) / (k + 1))
  small_dag d;
  d.n = static_cast<int>(n) + 2;
  d.s = 0;
  d.t = d.n - 1;
  for (int v = 0; v + 1 < d.n; ++v)
    d.edges.emplace_back(v, v + 1);
  d.cost.assign(static_cast<std::size_t>(d.n), 1);
  std::mt19937_64 rng(1);
  std::vector<ck::vertex_index> index;
  const ck::graph g = to_graph(d, rng, index);
  for (const ck::plan& p : {ck::solve(g), ck::solve_linear(g)}) {
    CHECK(p.cost == best);
    CHECK(p.checkpoint_cost + p.max_segment_cost == best);
    CAPTURE(p.search_passes);
    CHECK(p.search_passes > 0);
    CHECK(p.search_passes <= 283);  // 2 sqrt(n); 53 today
  }
}
