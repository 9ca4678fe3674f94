// The checkpoint planner on hand-made graphs whose optimum is worked out in the comments, the
// graph's validity checks, `evaluate` and `solve_linear`.
#include <dropit/checkpoint.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ck = dropit::checkpoint;

namespace {

struct spec_vertex {
  std::string id;
  ck::cost_t cost;
};

ck::graph make(const std::vector<spec_vertex>& vs,
               const std::vector<std::pair<std::string, std::string>>& es, const std::string& s,
               const std::string& t) {
  ck::graph g;
  for (const auto& v : vs)
    g.add_vertex(v.id, v.cost);
  for (const auto& [a, b] : es)
    g.add_edge(a, b);
  g.set_source(s);
  g.set_target(t);
  return g;
}

/// "prefix<k>" (built with concat: GCC 12 warns falsely on "literal" + std::string).
std::string named(std::string_view prefix, std::size_t k) {
  return dropit::detail::concat(prefix, k);
}

std::vector<std::string> ids(const ck::graph& g, const std::vector<ck::vertex_index>& vs) {
  std::vector<std::string> out;
  for (auto v : vs)
    out.push_back(g.id(v));
  return out;
}

using strings = std::vector<std::string>;

/// The chain s -> v1 -> ... -> vk -> t with the given inner costs.
ck::graph chain(const std::vector<ck::cost_t>& inner, ck::cost_t ends = 100) {
  ck::graph g;
  g.add_vertex("s", ends);
  std::string prev = "s";
  for (std::size_t i = 0; i < inner.size(); ++i) {
    const std::string id = named("v", i + 1);
    g.add_vertex(id, inner[i]);
    g.add_edge(prev, id);
    prev = id;
  }
  g.add_vertex("t", ends);
  g.add_edge(prev, "t");
  g.set_source("s");
  g.set_target("t");
  return g;
}

}  // namespace

TEST_CASE("a single-vertex graph needs no checkpoint") {
  ck::graph g;
  g.add_vertex("x", 42);
  g.set_source("x");
  g.set_target("x");
  for (const ck::plan& p : {ck::solve(g), ck::solve_linear(g)}) {
    CHECK(p.cost == 0);
    CHECK(p.checkpoints.empty());
    CHECK(p.segments.empty());
    CHECK(p.regular_cost == 42);
  }
}

TEST_CASE("source -> target: nothing inside, cost 0") {
  const auto g = make({{"s", 5}, {"t", 7}}, {{"s", "t"}}, "s", "t");
  const auto p = ck::solve(g);
  CHECK(p.cost == 0);
  CHECK(p.segments.empty());
  CHECK(p.regular_cost == 12);
}

TEST_CASE("one inner vertex: a segment of 3 or a checkpoint of 3") {
  const auto g = make({{"s", 5}, {"a", 3}, {"t", 7}}, {{"s", "a"}, {"a", "t"}}, "s", "t");
  CHECK(ck::solve(g).cost == 3);
  CHECK(ck::solve_linear(g).cost == 3);
}

TEST_CASE("chain of nine unit tensors: the sqrt(n) trade-off gives 5") {
  // k checkpoints leave k + 1 segments of the other 9 - k: cost k + ceil((9 - k) / (k + 1)),
  // which is 9, 5, 5, 5, 5, 5, 7, ... for k = 0, 1, 2, ...
  const auto g = chain({1, 1, 1, 1, 1, 1, 1, 1, 1});
  const auto p = ck::solve(g);
  CHECK(p.cost == 5);
  CHECK(p.checkpoint_cost + p.max_segment_cost == 5);
  CHECK(ck::solve_linear(g).cost == 5);
  // Every inner vertex is either kept or in exactly one segment.
  std::size_t covered = p.checkpoints.size();
  for (const auto& s : p.segments)
    covered += s.vertices.size();
  CHECK(covered == 9);
}

TEST_CASE("chain with one huge tensor: keep the small neighbours around it") {
  // s -> 1 -> 50 -> 1 -> 1 -> t. The 50 is paid either way (kept, or inside the largest
  // segment): {} 53, {v1} 1 + 52, {v2} 50 + max(1, 2) = 52, {v3} 1 + max(51, 1) = 52,
  // {v1, v3} 2 + 50 = 52, {v4} 1 + 52; nothing reaches 51. Optimum 52.
  const auto g = chain({1, 50, 1, 1});
  CHECK(ck::solve(g).cost == 52);
  CHECK(ck::solve_linear(g).cost == 52);
}

TEST_CASE("diamond: keep the join, the two branches are separate segments") {
  //   s -> a(4) -> c(5) -> t,  s -> b(6) -> c
  // {}: one segment {a, b, c} = 15. {c}: 5 + max(4, 6) = 11. {a}: {b, c} entered from s and a,
  // not a segment. {a, b}: {c} entered from a and b, not a segment. {a, c}: 9 + 6 = 15.
  const auto g = make({{"s", 1}, {"a", 4}, {"b", 6}, {"c", 5}, {"t", 1}},
                      {{"s", "a"}, {"s", "b"}, {"a", "c"}, {"b", "c"}, {"c", "t"}}, "s", "t");
  const auto p = ck::solve(g);
  CHECK(p.cost == 11);
  CHECK(ids(g, p.checkpoints) == strings{"c"});
  REQUIRE(p.segments.size() == 2);
  for (const auto& sg : p.segments) {
    CHECK(g.id(sg.entry) == "s");
    CHECK(g.id(sg.exit) == "c");
  }
  CHECK(ids(g, p.segments[0].vertices) == strings{"a"});
  CHECK(ids(g, p.segments[1].vertices) == strings{"b"});
  CHECK(p.segments[1].cost == 6);
  CHECK(p.max_segment_cost == 6);
  CHECK(p.checkpoint_cost == 5);
  CHECK_THROWS_AS((void)ck::solve_linear(g), dropit::error);
}

TEST_CASE("residual blocks: keep the block outputs") {
  // x0 -> p1(4) -> q1(4) -> x1(2) [+ x0 -> x1] -> p2(4) -> q2(4) -> t [+ x1 -> t]
  // {}: one segment of 18. {x1}: 2 + max(8, 8) = 10. Keeping q1 as well: {p1} alone then, but
  // {x1, q1} costs 6 + 8 = 14. Keeping p1 without x1: {q1, x1, ...} entered from p1 and x0.
  const auto g = make({{"x0", 9}, {"p1", 4}, {"q1", 4}, {"x1", 2}, {"p2", 4}, {"q2", 4}, {"t", 9}},
                      {{"x0", "p1"},
                       {"p1", "q1"},
                       {"q1", "x1"},
                       {"x0", "x1"},
                       {"x1", "p2"},
                       {"p2", "q2"},
                       {"q2", "t"},
                       {"x1", "t"}},
                      "x0", "t");
  const auto p = ck::solve(g);
  CHECK(p.cost == 10);
  CHECK(ids(g, p.checkpoints) == strings{"x1"});
  REQUIRE(p.segments.size() == 2);
  CHECK(ids(g, p.segments[0].vertices) == strings{"p1", "q1"});
  CHECK(g.id(p.segments[0].entry) == "x0");
  CHECK(g.id(p.segments[0].exit) == "x1");
  CHECK(ids(g, p.segments[1].vertices) == strings{"p2", "q2"});
  CHECK(g.id(p.segments[1].entry) == "x1");
  CHECK(g.id(p.segments[1].exit) == "t");
}

TEST_CASE("densely connected block: all or nothing") {
  // h_j reads x0 and every h_i, i < j (a DenseNet block without concat vertices). Any kept h_c
  // with a dropped h_j, j > c, gives h_j's group two entries (x0 and h_c); a dropped h_j, j < c,
  // feeds both h_c and the target. So the only plans keep nothing or everything: cost = 3+5+7.
  ck::graph g;
  g.add_vertex("x0", 1);
  const std::vector<ck::cost_t> costs{3, 5, 7, 11};
  for (std::size_t j = 0; j < costs.size(); ++j) {
    const std::string id = named("h", j + 1);
    g.add_vertex(id, costs[j]);
    g.add_edge("x0", id);
    for (std::size_t i = 0; i < j; ++i)
      g.add_edge(named("h", i + 1), id);
  }
  g.set_source("x0");
  g.set_target("h4");
  const auto p = ck::solve(g);
  CHECK(p.cost == 15);
  CHECK((p.checkpoints.size() == 0 || p.checkpoints.size() == 3));
  CHECK_THROWS_WITH_AS((void)ck::evaluate(g, std::vector<ck::vertex_index>{2}),
                       doctest::Contains("entered from 2 vertices"), dropit::error);
}

TEST_CASE("densely connected blocks in a row with transitions") {
  // Two all-to-all blocks of three layers (2, 4, 6) joined by a transition vertex tr(1):
  // block 1: x0 -> {a1, a2, a3}, a1 -> {a2, a3}, a2 -> a3; a3 -> tr; block 2 the same from tr.
  // a1 and a2 are all or nothing (see above); a3, tr and b3 split the chain. Keeping tr:
  // 1 + max(2+4+6, 2+4+6) = 13. One segment: 25. Keeping a3 and b3: 12 + max(6, 1+6, 6) = 19;
  // tr with a3: 7 + 12. Optimum 13.
  ck::graph g;
  g.add_vertex("x0", 50);
  auto block = [&](const std::string& in, const std::string& p, const std::string& out) {
    const std::vector<ck::cost_t> costs{2, 4, 6};
    for (int j = 1; j <= 3; ++j) {
      g.add_vertex(p + std::to_string(j), costs[static_cast<std::size_t>(j - 1)]);
      g.add_edge(in, p + std::to_string(j));
      for (int i = 1; i < j; ++i)
        g.add_edge(p + std::to_string(i), p + std::to_string(j));
    }
    g.add_vertex(out, out == "tr" ? 1 : 50);
    g.add_edge(p + "3", out);
  };
  block("x0", "a", "tr");
  block("tr", "b", "t");
  g.set_source("x0");
  g.set_target("t");
  const auto p = ck::solve(g);
  CHECK(p.cost == 13);
  CHECK(ids(g, p.checkpoints) == strings{"tr"});
  CHECK(p.segments.size() == 2);
}

TEST_CASE("parallel branches are separate segments") {
  // s -> a1(3) -> a2(3) -> t,  s -> b1(10) -> b2(1) -> t.
  // {}: two segments, max(6, 11) = 11. {b1}: 10 + 6. {b2}: 1 + max(6, 10) = 11. Optimum 11.
  const auto g = make(
      {{"s", 1}, {"a1", 3}, {"a2", 3}, {"b1", 10}, {"b2", 1}, {"t", 1}},
      {{"s", "a1"}, {"a1", "a2"}, {"a2", "t"}, {"s", "b1"}, {"b1", "b2"}, {"b2", "t"}}, "s", "t");
  const auto p = ck::solve(g);
  CHECK(p.cost == 11);
  // A direct edge s -> t is a third, empty branch and changes nothing.
  auto g2 = g;
  g2.add_edge("s", "t");
  CHECK(ck::solve(g2).cost == 11);
}

TEST_CASE("a crossing (complicate) region is kept whole or not at all") {
  // s -> {a, b}, a -> {c, d}, b -> {c, d}, {c, d} -> t: no vertex splits it, no two vertices
  // bound a part of it. {a, b} would leave {c} with entries a and b. So: 0 + (a+b+c+d) or
  // (a+b+c+d) + 0, here 10.
  const auto g = make({{"s", 1}, {"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"t", 1}},
                      {{"s", "a"},
                       {"s", "b"},
                       {"a", "c"},
                       {"a", "d"},
                       {"b", "c"},
                       {"b", "d"},
                       {"c", "t"},
                       {"d", "t"}},
                      "s", "t");
  CHECK(ck::solve(g).cost == 10);
  const std::vector<ck::vertex_index> ab{*g.find("a"), *g.find("b")};
  CHECK_THROWS_WITH_AS((void)ck::evaluate(g, ab), doctest::Contains("entered from 2 vertices"),
                       dropit::error);
}

TEST_CASE("evaluate prices a given checkpoint set") {
  const auto g = chain({1, 2, 3, 4, 5});
  const std::vector<ck::vertex_index> keep{*g.find("v3")};
  const auto p = ck::evaluate(g, keep);
  CHECK(p.checkpoint_cost == 3);
  CHECK(p.max_segment_cost == 9);  // {v4, v5}
  CHECK(p.cost == 12);
  REQUIRE(p.segments.size() == 2);
  CHECK(ids(g, p.segments[0].vertices) == strings{"v1", "v2"});
  CHECK(g.id(p.segments[0].exit) == "v3");
  CHECK(ck::evaluate(g, std::vector<ck::vertex_index>{}).cost == 15);
  CHECK_THROWS_WITH_AS((void)ck::evaluate(g, std::vector<ck::vertex_index>{g.source()}),
                       doctest::Contains("\"s\" is the source or the target"), dropit::error);
  CHECK_THROWS_WITH_AS((void)ck::evaluate(g, std::vector<ck::vertex_index>{1, 1}),
                       doctest::Contains("\"v1\" repeats"), dropit::error);
}

TEST_CASE("recompute sums the compute cost of the operations that run again") {
  ck::graph g;
  for (const char* id : {"s", "a", "b", "t"})
    g.add_vertex(id, 10);
  g.add_edge("s", "a", 1.0);
  g.add_edge("a", "b", 2.0);
  g.add_edge("b", "t", 4.0);
  g.set_source("s");
  g.set_target("t");
  // Optimum: keep one of a, b (10 + 10 = 20 against 20 for one segment of both: tie).
  const auto one = ck::evaluate(g, std::vector<ck::vertex_index>{1});
  CHECK(one.recompute == 2.0);  // b runs again
  const auto none = ck::evaluate(g, std::vector<ck::vertex_index>{});
  CHECK(none.recompute == 3.0);  // a and b run again

  // One operation added three times runs again once, at the largest cost given for it.
  g.add_edge("a", "b", 5.0);
  g.add_edge("a", "b", 0.5);
  CHECK(ck::evaluate(g, std::vector<ck::vertex_index>{1}).recompute == 5.0);
  CHECK(ck::evaluate(g, std::vector<ck::vertex_index>{}).recompute == 6.0);
}

TEST_CASE("plans come out in topological order") {
  const auto g = ck::models::resnet(50, {2, 3, 64, 64});
  const auto p = ck::solve(g);
  const auto order = g.topological_order();
  std::vector<std::size_t> pos(g.vertex_count());
  for (std::size_t i = 0; i < order.size(); ++i)
    pos[order[i]] = i;
  CHECK(std::is_sorted(p.checkpoints.begin(), p.checkpoints.end(),
                       [&](auto a, auto b) { return pos[a] < pos[b]; }));
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    const auto& sg = p.segments[i];
    CHECK(std::is_sorted(sg.vertices.begin(), sg.vertices.end(),
                         [&](auto a, auto b) { return pos[a] < pos[b]; }));
    CHECK(pos[sg.entry] < pos[sg.vertices.front()]);
    CHECK(pos[sg.vertices.back()] < pos[sg.exit]);
    if (i > 0) CHECK(pos[p.segments[i - 1].entry] <= pos[sg.entry]);
  }
  // The plan is a valid checkpoint set and `evaluate` prices it the same.
  const auto e = ck::evaluate(g, p.checkpoints);
  CHECK(e.cost == p.cost);
  CHECK(e.segments.size() == p.segments.size());
}

// ---- invalid graphs: each message names the vertex -----------------------------------------

TEST_CASE("graph construction rejects bad vertices and edges") {
  ck::graph g;
  g.add_vertex("a", 1);
  CHECK_THROWS_WITH_AS(g.add_vertex("a", 2), doctest::Contains("duplicate vertex id \"a\""),
                       dropit::error);
  CHECK_THROWS_WITH_AS(g.add_vertex("neg", -5),
                       doctest::Contains("\"neg\" has a negative cost: -5"), dropit::error);
  CHECK_THROWS_WITH_AS(g.add_edge("a", "zz"), doctest::Contains("unknown vertex \"zz\""),
                       dropit::error);
  CHECK_THROWS_WITH_AS(g.add_edge("yy", "a"), doctest::Contains("unknown vertex \"yy\""),
                       dropit::error);
  CHECK_THROWS_AS(g.add_edge(0, 7), dropit::error);
  CHECK_THROWS_WITH_AS(g.set_source("nope"), doctest::Contains("\"nope\""), dropit::error);
  CHECK_THROWS_AS(g.add_vertex("big", std::numeric_limits<ck::cost_t>::max()), dropit::error);
  CHECK(g.vertex_count() == 1);  // failed calls left the graph as it was
  CHECK(g.total_cost() == 1);
}

TEST_CASE("solve rejects invalid graphs, naming the vertex") {
  SUBCASE("no source") {
    ck::graph g;
    g.add_vertex("a", 1);
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("no source"), dropit::error);
  }
  SUBCASE("cycle") {
    const auto g = make({{"s", 1}, {"a", 1}, {"b", 1}, {"t", 1}},
                        {{"s", "a"}, {"a", "b"}, {"b", "a"}, {"b", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("cycle through vertex"),
                         dropit::error);
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("\"a\" -> \"b\" -> \"a\""),
                         dropit::error);
  }
  SUBCASE("self loop") {
    const auto g =
        make({{"s", 1}, {"a", 1}, {"t", 1}}, {{"s", "a"}, {"a", "a"}, {"a", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("cycle through vertex \"a\""),
                         dropit::error);
  }
  SUBCASE("unreachable from the source") {
    const auto g = make({{"s", 1}, {"a", 1}, {"x", 1}, {"t", 1}},
                        {{"s", "a"}, {"a", "t"}, {"x", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g),
                         doctest::Contains("vertex \"x\" is not reachable from source \"s\""),
                         dropit::error);
  }
  SUBCASE("dead end: no path to the target") {
    const auto g = make({{"s", 1}, {"a", 1}, {"x", 1}, {"t", 1}},
                        {{"s", "a"}, {"a", "t"}, {"a", "x"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g),
                         doctest::Contains("target \"t\" is not reachable from vertex \"x\""),
                         dropit::error);
  }
  SUBCASE("no path from source to target") {
    const auto g =
        make({{"s", 1}, {"a", 1}, {"b", 1}, {"t", 1}}, {{"s", "a"}, {"b", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g),
                         doctest::Contains("no path from source \"s\" to target \"t\""),
                         dropit::error);
  }
  SUBCASE("source equals target in a bigger graph") {
    const auto g = make({{"s", 1}, {"a", 1}}, {{"s", "a"}}, "s", "s");
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("same vertex \"s\""), dropit::error);
  }
  SUBCASE("edge into the source") {
    const auto g =
        make({{"s", 1}, {"a", 1}, {"t", 1}}, {{"a", "s"}, {"s", "t"}, {"a", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve(g), doctest::Contains("\"a\" is not reachable"),
                         dropit::error);
  }
  SUBCASE("solve_linear wants a chain") {
    const auto g = make({{"s", 1}, {"a", 1}, {"b", 1}, {"t", 1}},
                        {{"s", "a"}, {"s", "b"}, {"a", "t"}, {"b", "t"}}, "s", "t");
    CHECK_THROWS_WITH_AS((void)ck::solve_linear(g), doctest::Contains("vertex \"s\" has"),
                         dropit::error);
  }
}

TEST_CASE("repeated edges count once") {
  auto g = chain({3, 3, 3});
  const auto base = ck::solve(g).cost;
  g.add_edge("v1", "v2");
  g.add_edge("v1", "v2");
  CHECK(ck::solve(g).cost == base);
  CHECK(ck::solve_linear(g).cost == base);
}
