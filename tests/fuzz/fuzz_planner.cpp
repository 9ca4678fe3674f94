// libFuzzer target: the checkpoint planner on small DAGs built from the input bytes, against the
// exhaustive oracle of tests/checkpoint_oracle.hpp (every checkpoint subset, priced from the cost
// model's definition).
//
// Input: byte 0 gives the vertex count (2..14), then one byte per candidate edge (u, v), u < v,
// in row order (an edge when odd), then one byte per vertex for its cost (scaled by byte 1's
// choice of 1, 1000 or 2^40 so that large costs are reached). Vertices without an input or an
// output get one to the source or the target, so every vertex lies on a source-target path.
#include <dropit/checkpoint.hpp>

#include "../checkpoint_oracle.hpp"

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using namespace dropit_test;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_planner: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::size_t at = 0;
  auto next = [&]() -> std::uint8_t { return at < size ? data[at++] : 0; };
  small_dag d;
  d.n = 2 + next() % 13;
  const ck::cost_t scale = std::array<ck::cost_t, 3>{1, 1000, ck::cost_t{1} << 40}[next() % 3];
  d.s = 0;
  d.t = d.n - 1;
  std::vector<char> has_in(static_cast<std::size_t>(d.n), 0), has_out(has_in.size(), 0);
  for (int u = 0; u < d.n; ++u)
    for (int v = u + 1; v < d.n; ++v)
      if ((next() & 1u) != 0) {
        d.edges.emplace_back(u, v);
        has_out[static_cast<std::size_t>(u)] = has_in[static_cast<std::size_t>(v)] = 1;
      }
  for (int v = 1; v < d.n; ++v)
    if (!has_in[static_cast<std::size_t>(v)]) {
      d.edges.emplace_back(0, v);
      has_out[0] = 1;
    }
  for (int u = 0; u + 1 < d.n; ++u)
    if (!has_out[static_cast<std::size_t>(u)]) d.edges.emplace_back(u, d.n - 1);
  for (int v = 0; v < d.n; ++v)
    d.cost.push_back(static_cast<ck::cost_t>(next()) * scale);

  std::mt19937_64 rng(size);
  std::vector<ck::vertex_index> index;
  const ck::graph g = to_graph(d, rng, index);
  const ck::cost_t best = oracle_best(d);
  const ck::plan p = ck::solve(g);
  if (p.cost != best) fail("solve() is not the exhaustive optimum");
  std::vector<int> back(g.vertex_count());
  for (int v = 0; v < d.n; ++v)
    back[index[static_cast<std::size_t>(v)]] = v;
  std::uint32_t kept = 0;
  for (const auto v : p.checkpoints)
    kept |= 1u << back[v];
  const auto priced = oracle_cost(d, kept);
  if (!priced || *priced != p.cost) fail("the plan's checkpoints do not cost what the plan says");
  if (ck::evaluate(g, p.checkpoints).cost != p.cost) fail("evaluate() disagrees with solve()");
  return 0;
}
