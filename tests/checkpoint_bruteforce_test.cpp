// The planner against an exhaustive oracle: every checkpoint subset of small random chains and
// DAGs (up to 16 vertices), priced by an independent implementation of the cost model below.
#include <dropit/checkpoint.hpp>

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

namespace ck = dropit::checkpoint;

namespace {

// ---- the oracle: plain bit masks, no code shared with the library --------------------------

struct small_dag {
  int n = 0;  // vertices 0..n-1; edges go from lower to higher numbers
  int s = 0, t = 0;
  std::vector<std::pair<int, int>> edges;
  std::vector<ck::cost_t> cost;
};

struct oracle_segment {
  std::uint32_t vertices;  // bit mask
  int entry, exit;
};

/// The cost model, straight from its definition: drop every vertex outside S = C + {s, t}; each
/// connected group of dropped vertices (edges in either direction) must receive edges from one
/// vertex only and send edges to one vertex only; the cost is the kept inner vertices' costs plus
/// the largest group's cost. nullopt when some group has two entries or two exits.
std::optional<ck::cost_t> oracle_cost(const small_dag& d, std::uint32_t kept,
                                      std::vector<oracle_segment>* segments = nullptr) {
  std::vector<std::uint32_t> in(static_cast<std::size_t>(d.n)), out(in.size());
  for (auto [u, v] : d.edges) {
    out[static_cast<std::size_t>(u)] |= 1u << v;
    in[static_cast<std::size_t>(v)] |= 1u << u;
  }
  const std::uint32_t all = d.n == 32 ? ~0u : (1u << d.n) - 1;
  const std::uint32_t stored = kept | (1u << d.s) | (1u << d.t);
  std::uint32_t dropped = all & ~stored;
  ck::cost_t total = 0, largest = 0;
  for (int v = 0; v < d.n; ++v)
    if ((kept >> v) & 1u) total += d.cost[static_cast<std::size_t>(v)];
  while (dropped) {
    std::uint32_t group = dropped & (~dropped + 1);  // lowest dropped vertex
    for (std::uint32_t frontier = group; frontier;) {
      std::uint32_t next = 0;
      for (int v = 0; v < d.n; ++v)
        if ((frontier >> v) & 1u)
          next |= in[static_cast<std::size_t>(v)] | out[static_cast<std::size_t>(v)];
      frontier = next & dropped & ~group;
      group |= frontier;
    }
    std::uint32_t entries = 0, exits = 0;
    ck::cost_t c = 0;
    for (int v = 0; v < d.n; ++v)
      if ((group >> v) & 1u) {
        entries |= in[static_cast<std::size_t>(v)] & ~group;
        exits |= out[static_cast<std::size_t>(v)] & ~group;
        c += d.cost[static_cast<std::size_t>(v)];
      }
    if (std::popcount(entries) != 1 || std::popcount(exits) != 1) return std::nullopt;
    if (segments) segments->push_back({group, std::countr_zero(entries), std::countr_zero(exits)});
    largest = std::max(largest, c);
    dropped &= ~group;
  }
  return total + largest;
}

/// The least cost over every subset of inner vertices.
ck::cost_t oracle_best(const small_dag& d) {
  const std::uint32_t inner = ((d.n == 32 ? ~0u : (1u << d.n) - 1)) & ~(1u << d.s) & ~(1u << d.t);
  ck::cost_t best = std::numeric_limits<ck::cost_t>::max();
  for (std::uint32_t sub = inner;; sub = (sub - 1) & inner) {  // every subset of `inner`
    if (const auto c = oracle_cost(d, sub)) best = std::min(best, *c);
    if (sub == 0) break;
  }
  return best;
}

// ---- random graphs ---------------------------------------------------------------------------

/// A random DAG on n vertices in which every vertex lies on a path from 0 to n - 1.
small_dag random_dag(std::mt19937_64& rng, int n, double density, ck::cost_t max_cost) {
  small_dag d;
  d.n = n;
  d.s = 0;
  d.t = n - 1;
  std::bernoulli_distribution edge(density);
  std::vector<std::vector<char>> has(static_cast<std::size_t>(n),
                                     std::vector<char>(static_cast<std::size_t>(n), 0));
  auto add = [&](int u, int v) {
    if (!has[static_cast<std::size_t>(u)][static_cast<std::size_t>(v)]) {
      has[static_cast<std::size_t>(u)][static_cast<std::size_t>(v)] = 1;
      d.edges.emplace_back(u, v);
    }
  };
  for (int u = 0; u < n; ++u)
    for (int v = u + 1; v < n; ++v)
      if (edge(rng)) add(u, v);
  for (int v = 1; v < n; ++v) {  // an input for every vertex but the source
    bool any = false;
    for (int u = 0; u < v; ++u)
      any = any || has[static_cast<std::size_t>(u)][static_cast<std::size_t>(v)];
    if (!any) add(std::uniform_int_distribution<int>(0, v - 1)(rng), v);
  }
  for (int u = 0; u + 1 < n; ++u) {  // an output for every vertex but the target
    bool any = false;
    for (int v = u + 1; v < n; ++v)
      any = any || has[static_cast<std::size_t>(u)][static_cast<std::size_t>(v)];
    if (!any) add(u, std::uniform_int_distribution<int>(u + 1, n - 1)(rng));
  }
  std::uniform_int_distribution<ck::cost_t> cost(0, max_cost);
  for (int v = 0; v < n; ++v)
    d.cost.push_back(cost(rng));
  return d;
}

small_dag random_chain(std::mt19937_64& rng, int n, ck::cost_t max_cost) {
  small_dag d;
  d.n = n;
  d.s = 0;
  d.t = n - 1;
  for (int v = 0; v + 1 < n; ++v)
    d.edges.emplace_back(v, v + 1);
  std::uniform_int_distribution<ck::cost_t> cost(0, max_cost);
  for (int v = 0; v < n; ++v)
    d.cost.push_back(cost(rng));
  return d;
}

/// The same graph for the library, with vertices added in a shuffled order and edges shuffled,
/// so that nothing depends on ids or insertion order; ids are "v<k>".
ck::graph to_graph(const small_dag& d, std::mt19937_64& rng, std::vector<ck::vertex_index>& index) {
  std::vector<int> perm(static_cast<std::size_t>(d.n));
  for (int v = 0; v < d.n; ++v)
    perm[static_cast<std::size_t>(v)] = v;
  std::shuffle(perm.begin(), perm.end(), rng);
  ck::graph g;
  index.assign(static_cast<std::size_t>(d.n), 0);
  for (int v : perm)
    index[static_cast<std::size_t>(v)] =
        g.add_vertex(dropit::detail::concat("v", v), d.cost[static_cast<std::size_t>(v)]);
  auto edges = d.edges;
  std::shuffle(edges.begin(), edges.end(), rng);
  for (auto [u, v] : edges)
    g.add_edge(index[static_cast<std::size_t>(u)], index[static_cast<std::size_t>(v)]);
  g.set_source(index[static_cast<std::size_t>(d.s)]);
  g.set_target(index[static_cast<std::size_t>(d.t)]);
  return g;
}

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

TEST_CASE("chains: solve and solve_linear match the exhaustive optimum") {
  std::mt19937_64 rng(20240601);
  for (int round = 0; round < 400; ++round) {
    const int n = 1 + round % 16;
    const ck::cost_t max_cost = std::array<ck::cost_t, 4>{1, 9, 1000, 1'000'000'000'000}[round % 4];
    const small_dag d = random_chain(rng, n, max_cost);
    CAPTURE(round);
    CAPTURE(n);
    const ck::cost_t best = n == 1 ? 0 : oracle_best(d);
    std::vector<ck::vertex_index> index;
    const ck::graph g = to_graph(d, rng, index);
    if (n == 1) continue;  // a single vertex is its own source and target; see checkpoint_test
    check_plan(d, g, index, ck::solve(g), best);
    check_plan(d, g, index, ck::solve_linear(g), best);
  }
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

TEST_CASE("longer chains: solve matches the interval-DP optimum over every bound") {
  // Beyond the 16 vertices the exhaustive oracle reaches: the search over the bound M skips
  // bounds (issue 15 item 7); this checks it never skips the optimum.
  std::mt19937_64 rng(20261125);
  for (int round = 0; round < 60; ++round) {
    const int n = 17 + round % 32;
    const ck::cost_t max_cost = std::array<ck::cost_t, 4>{1, 9, 1000, 1'000'000'000}[round % 4];
    const small_dag d = random_chain(rng, n, max_cost);
    CAPTURE(round);
    CAPTURE(n);
    const std::vector<ck::cost_t> inner(d.cost.begin() + 1, d.cost.end() - 1);
    const ck::cost_t best = chain_oracle(inner);
    std::vector<ck::vertex_index> index;
    const ck::graph g = to_graph(d, rng, index);
    CHECK(ck::solve(g).cost == best);
    CHECK(ck::solve_linear(g).cost == best);
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
