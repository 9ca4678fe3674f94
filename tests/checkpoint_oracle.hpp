// The checkpoint planner's exhaustive oracle, shared by tests/checkpoint_bruteforce_test.cpp and
// the planner fuzzer: small DAGs as bit masks, the cost model priced from its definition, and the
// same graph for the library. No code is shared with the library.
#pragma once

#include <dropit/checkpoint.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dropit_test {

namespace ck = dropit::checkpoint;

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

/// A connected group of dropped vertices (edges in either direction): the vertices outside it
/// that send it edges (entries) and that it sends edges to (exits), and its cost.
struct oracle_group {
  std::uint32_t vertices, entries, exits;
  ck::cost_t cost;
};

/// The groups that the dropped vertices (a bit mask) form, lowest vertex first.
inline std::vector<oracle_group> oracle_groups(const small_dag& d, std::uint32_t dropped) {
  std::vector<std::uint32_t> in(static_cast<std::size_t>(d.n)), out(in.size());
  for (auto [u, v] : d.edges) {
    out[static_cast<std::size_t>(u)] |= 1u << v;
    in[static_cast<std::size_t>(v)] |= 1u << u;
  }
  std::vector<oracle_group> groups;
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
    oracle_group g{group, 0, 0, 0};
    for (int v = 0; v < d.n; ++v)
      if ((group >> v) & 1u) {
        g.entries |= in[static_cast<std::size_t>(v)] & ~group;
        g.exits |= out[static_cast<std::size_t>(v)] & ~group;
        g.cost += d.cost[static_cast<std::size_t>(v)];
      }
    groups.push_back(g);
    dropped &= ~group;
  }
  return groups;
}

/// The cost model, straight from its definition: drop every vertex outside S = C + {s, t}; each
/// connected group of dropped vertices (edges in either direction) must receive edges from one
/// vertex only and send edges to one vertex only; the cost is the kept inner vertices' costs plus
/// the largest group's cost. nullopt when some group has two entries or two exits.
inline std::optional<ck::cost_t> oracle_cost(const small_dag& d, std::uint32_t kept,
                                             std::vector<oracle_segment>* segments = nullptr) {
  const std::uint32_t all = d.n == 32 ? ~0u : (1u << d.n) - 1;
  const std::uint32_t stored = kept | (1u << d.s) | (1u << d.t);
  ck::cost_t total = 0, largest = 0;
  for (int v = 0; v < d.n; ++v)
    if ((kept >> v) & 1u) total += d.cost[static_cast<std::size_t>(v)];
  for (const oracle_group& g : oracle_groups(d, all & ~stored)) {
    if (std::popcount(g.entries) != 1 || std::popcount(g.exits) != 1) return std::nullopt;
    if (segments)
      segments->push_back({g.vertices, std::countr_zero(g.entries), std::countr_zero(g.exits)});
    largest = std::max(largest, g.cost);
  }
  return total + largest;
}

/// The least cost over every subset of inner vertices.
inline ck::cost_t oracle_best(const small_dag& d) {
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
inline small_dag random_dag(std::mt19937_64& rng, int n, double density, ck::cost_t max_cost) {
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

inline small_dag random_chain(std::mt19937_64& rng, int n, ck::cost_t max_cost) {
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
inline ck::graph to_graph(const small_dag& d, std::mt19937_64& rng,
                          std::vector<ck::vertex_index>& index) {
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

}  // namespace dropit_test
