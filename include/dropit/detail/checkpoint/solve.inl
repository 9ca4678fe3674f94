/**
 * @file solve.inl
 * @brief The planner: a bottom-up dynamic program over the division tree for a bound M on the
 * segment cost, the search over M, the plan's reconstruction, and `evaluate`.
 */
#pragma once

#include <dropit/detail/checkpoint/division_tree.hpp>
#include <dropit/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

namespace dropit::checkpoint {
namespace detail {

/// f(node, M): the least cost of checkpoints inside a node (its terminals being kept) such that
/// every segment inside costs at most M; a(node, M): the largest segment cost of that choice.
///  - leaf: 0, 0.
///  - parallel: sums and maxima over the branches.
///  - complicate: 0 if the whole inside fits (one segment), else the skeleton's cost plus the
///    children's.
///  - series with chain s = c0, ..., cP = t: g[j] = cost(cj) + min(g[j-1] + f(piece j-1),
///    min{g[i] : i <= j-2, inner cost of the run of pieces i..j-1 <= M}). A kept chain vertex
///    isolates its pieces; a dropped one joins its neighbours into one segment, inside which no
///    vertex can be kept (it would give that segment a second entry or exit). The valid i form a
///    window that only moves right, so a monotone queue gives O(P) per node.
class optimizer {
 public:
  optimizer(const dag& d, const division_tree& t)
      : d_(d), t_(t), f_(t.nodes.size()), a_(t.nodes.size()), back_at_(t.nodes.size()) {
    std::size_t total = 0, widest = 0;
    for (std::size_t i = 0; i < t.nodes.size(); ++i) {
      back_at_[i] = total;
      if (t.nodes[i].kind == node_kind::series) {
        total += t.nodes[i].child_count + 1;
        widest = std::max(widest, t.nodes[i].child_count + 1);
      }
    }
    back_.resize(total);
    g_.resize(widest);
    queue_.resize(widest);
  }

  /// Evaluates every node at bound M, bottom-up. Returns {f, a} of the root.
  std::pair<cost_t, cost_t> pass(cost_t bound) {
    for (std::size_t k = t_.nodes.size(); k-- > 0;) {
      const tree_node& nd = t_.nodes[k];
      switch (nd.kind) {
        case node_kind::leaf:
          f_[k] = a_[k] = 0;
          break;
        case node_kind::parallel:
        case node_kind::complicate: {
          if (nd.kind == node_kind::complicate && nd.cost <= bound) {
            f_[k] = 0;
            a_[k] = nd.cost;
            break;
          }
          cost_t f = nd.kind == node_kind::complicate ? nd.own_cost : 0;
          cost_t a = 0;
          for (std::size_t c = 0; c < nd.child_count; ++c) {
            const std::size_t ch = t_.children[nd.first_child + c];
            f += f_[ch];
            a = std::max(a, a_[ch]);
          }
          f_[k] = f;
          a_[k] = a;
          break;
        }
        case node_kind::series:
          series(k, nd, bound);
          break;
      }
    }
    return {f_[0], a_[0]};
  }

  /// The plan's checkpoints and segments for the bound of the last `pass`.
  void emit(cost_t bound, std::vector<vertex_index>& keep, std::vector<segment>& segs) const {
    std::vector<std::size_t> stack{0};
    while (!stack.empty()) {
      const std::size_t k = stack.back();
      stack.pop_back();
      const tree_node& nd = t_.nodes[k];
      switch (nd.kind) {
        case node_kind::leaf:
          break;
        case node_kind::parallel:
          for (std::size_t c = 0; c < nd.child_count; ++c)
            stack.push_back(t_.children[nd.first_child + c]);
          break;
        case node_kind::complicate:
          if (nd.cost <= bound) {
            segs.push_back(make_segment(nd.s, nd.t, {k}, {}));
          } else {
            for (std::size_t i = 0; i < nd.own_count; ++i)
              keep.push_back(t_.own[nd.first_own + i]);
            for (std::size_t c = 0; c < nd.child_count; ++c)
              stack.push_back(t_.children[nd.first_child + c]);
          }
          break;
        case node_kind::series: {
          const std::size_t last = nd.child_count;
          const std::size_t* back = back_.data() + back_at_[k];
          for (std::size_t j = last; j > 0;) {
            const std::size_t i = back[j];
            if (i + 1 == j) {
              stack.push_back(t_.children[nd.first_child + i]);
            } else {
              std::vector<std::size_t> pieces;
              for (std::size_t p = i; p < j; ++p)
                pieces.push_back(t_.children[nd.first_child + p]);
              std::vector<vertex_index> chain;
              for (std::size_t c = i + 1; c < j; ++c)
                chain.push_back(chain_vertex(nd, c));
              segs.push_back(make_segment(chain_vertex(nd, i), chain_vertex(nd, j), pieces, chain));
            }
            if (i > 0) keep.push_back(chain_vertex(nd, i));
            j = i;
          }
          break;
        }
      }
    }
  }

 private:
  [[nodiscard]] vertex_index chain_vertex(const tree_node& nd, std::size_t j) const {
    if (j == 0) return nd.s;
    if (j == nd.child_count) return nd.t;
    return t_.own[nd.first_own + j - 1];
  }

  void series(std::size_t k, const tree_node& nd, cost_t bound) {
    const std::size_t last = nd.child_count;  // chain positions 0..last
    const cost_t* prefix = t_.prefix.data() + nd.first_prefix;
    std::size_t* back = back_.data() + back_at_[k];
    auto chain_cost = [&](std::size_t j) {
      return j == 0 || j == last ? cost_t{0} : d_.cost[t_.own[nd.first_own + j - 1]];
    };
    std::size_t head = 0, tail = 0;  // queue_[head, tail): increasing i, increasing g
    g_[0] = 0;
    for (std::size_t j = 1; j <= last; ++j) {
      if (j >= 2) {
        const std::size_t i = j - 2;
        while (tail > head && g_[queue_[tail - 1]] >= g_[i])
          --tail;
        queue_[tail++] = i;
      }
      const cost_t cj = chain_cost(j);
      const cost_t need = prefix[j] - cj - bound;  // a run from i fits iff prefix[i] >= need
      while (tail > head && prefix[queue_[head]] < need)
        ++head;
      const std::size_t piece = t_.children[nd.first_child + j - 1];
      cost_t best = g_[j - 1] + f_[piece];
      std::size_t from = j - 1;
      if (tail > head && g_[queue_[head]] < best) {
        best = g_[queue_[head]];
        from = queue_[head];
      }
      g_[j] = best + cj;
      back[j] = from;
    }
    cost_t a = 0;
    for (std::size_t j = last; j > 0;) {
      const std::size_t i = back[j];
      a = std::max(a, i + 1 == j ? a_[t_.children[nd.first_child + i]]
                                 : prefix[j] - prefix[i] - chain_cost(j));
      j = i;
    }
    f_[k] = g_[last];
    a_[k] = a;
  }

  /// A segment made of whole nodes' insides plus some loose vertices.
  [[nodiscard]] segment make_segment(vertex_index entry, vertex_index exit,
                                     const std::vector<std::size_t>& nodes,
                                     std::vector<vertex_index> loose) const {
    segment sg{entry, exit, std::move(loose), 0};
    std::vector<std::size_t> stack(nodes.begin(), nodes.end());
    while (!stack.empty()) {
      const tree_node& nd = t_.nodes[stack.back()];
      stack.pop_back();
      for (std::size_t i = 0; i < nd.own_count; ++i)
        sg.vertices.push_back(t_.own[nd.first_own + i]);
      for (std::size_t c = 0; c < nd.child_count; ++c)
        stack.push_back(t_.children[nd.first_child + c]);
    }
    return sg;
  }

  const dag& d_;
  const division_tree& t_;
  std::vector<cost_t> f_, a_;
  std::vector<std::size_t> back_at_, back_;
  std::vector<cost_t> g_;
  std::vector<std::size_t> queue_;
};

/// Every vertex's time (`graph::time`) in O(m log m).
[[nodiscard]] inline std::vector<double> vertex_times(const graph& g) {
  std::vector<double> t(g.vertex_count(), 0.0);
  std::vector<edge> es(g.edges().begin(), g.edges().end());
  std::sort(es.begin(), es.end(), [](const edge& a, const edge& b) {
    return a.from != b.from ? a.from < b.from : a.to != b.to ? a.to < b.to : a.compute > b.compute;
  });
  for (std::size_t i = 0; i < es.size(); ++i)
    if (i == 0 || es[i].from != es[i - 1].from || es[i].to != es[i - 1].to)
      t[es[i].to] += es[i].compute;
  for (vertex_index v = 0; v < g.vertex_count(); ++v)
    if (g.has_time(v)) t[v] = g.time(v);
  return t;
}

/// Sorts, prices and checks a plan; `recompute` sums the compute cost of the operations (edges,
/// a repeated one once) into segments; `extra_time` the dropped vertices' times and the
/// compressed ones' options.
inline plan finish_plan(const graph& g, const dag& d, std::vector<vertex_index> keep,
                        std::vector<segment> segs, std::vector<compression> compressed = {}) {
  plan p;
  auto by_pos = [&](vertex_index a, vertex_index b) { return d.pos[a] < d.pos[b]; };
  std::sort(keep.begin(), keep.end(), by_pos);
  for (vertex_index v : keep)
    p.checkpoint_cost += d.cost[v];
  const std::vector<double> times = vertex_times(g);
  p.decisions.assign(d.n, decision::keep);
  std::sort(compressed.begin(), compressed.end(), [&](const compression& a, const compression& b) {
    return d.pos[a.vertex] < d.pos[b.vertex];
  });
  for (const compression& c : compressed) {
    const storage_option& o = g.storage(c.vertex)[c.option];
    p.compressed_cost += o.bytes;
    p.extra_time += o.time;
    p.decisions[c.vertex] = decision::compress;
  }
  std::vector<char> in_segment(d.n, 0);
  for (segment& sg : segs) {
    std::sort(sg.vertices.begin(), sg.vertices.end(), by_pos);
    sg.cost = 0;
    for (vertex_index v : sg.vertices) {
      sg.cost += d.cost[v];
      in_segment[v] = 1;
      p.decisions[v] = decision::drop;
      p.extra_time += times[v];
    }
    p.max_segment_cost = std::max(p.max_segment_cost, sg.cost);
  }
  std::sort(segs.begin(), segs.end(), [&](const segment& a, const segment& b) {
    if (a.entry != b.entry) return d.pos[a.entry] < d.pos[b.entry];
    return d.pos[a.vertices.front()] < d.pos[b.vertices.front()];
  });
  // A repeated edge is one operation: it runs again once, at the largest cost given for it.
  std::vector<edge> rerun;
  for (const edge& e : g.edges())
    if (in_segment[e.to]) rerun.push_back(e);
  std::sort(rerun.begin(), rerun.end(), [](const edge& a, const edge& b) {
    return a.from != b.from ? a.from < b.from : a.to != b.to ? a.to < b.to : a.compute > b.compute;
  });
  for (std::size_t i = 0; i < rerun.size(); ++i)
    if (i == 0 || rerun[i].from != rerun[i - 1].from || rerun[i].to != rerun[i - 1].to)
      p.recompute += rerun[i].compute;
  p.checkpoints = std::move(keep);
  p.segments = std::move(segs);
  p.compressed = std::move(compressed);
  p.cost = p.checkpoint_cost + p.compressed_cost + p.max_segment_cost;
  p.regular_cost = g.total_cost();
  return p;
}

/**
 * Searches the bound M. Let f(M), a(M) be a pass's checkpoint cost and largest segment (a <= M).
 * The plan of bound M is also feasible at a(M), and f only grows as M falls, so f(a(M)) = f(M):
 * the optimum is min over M of f(M) + M, reached at an M with a(M) = M.
 * 1. A coarse scan at M = a0, a0 / 2, a0 / 4, ... (a0: the largest segment with no checkpoint)
 *    gives a plan and an upper bound `best` on the optimum, so the optimum's M is below `best`.
 * 2. A descent from M = best - 1: after a pass at M, every bound in [a, M] gives the same plan,
 *    and a bound M' below M costs at least f(M) + M', so the next bound worth trying is
 *    min(a - 1, best - f - 1) (costs are integers); it stops when f alone reaches `best`.
 * On a chain of n unit costs this makes O(sqrt(n)) passes instead of O(n) from the top.
 */
inline plan optimize(const graph& g, const dag& d, const division_tree& tree) {
  optimizer opt(d, tree);
  std::size_t passes = 0;
  cost_t best = std::numeric_limits<cost_t>::max(), best_bound = best;
  auto run = [&](cost_t bound) {
    const auto fa = opt.pass(bound);
    ++passes;
    // The pass keeps every segment within the bound; this also guarantees the search ends.
    DROPIT_EXPECTS(fa.second <= bound, "checkpoint: internal error: segment ", fa.second,
                   " over bound ", bound);
    if (fa.first + fa.second < best) {
      best = fa.first + fa.second;
      best_bound = bound;
    }
    return fa;
  };
  const cost_t a0 = run(std::numeric_limits<cost_t>::max()).second;
  for (cost_t bound = a0 / 2; bound > 0; bound /= 2) {
    if (run(bound).first >= best) break;  // smaller bounds cost more checkpoints still
  }
  for (cost_t bound = best - 1; bound >= 0;) {
    const auto [f, a] = run(bound);
    if (a == 0 || f >= best) break;
    bound = std::min(a - 1, best - f - 1);
  }
  opt.pass(best_bound);
  std::vector<vertex_index> keep;
  std::vector<segment> segs;
  opt.emit(best_bound, keep, segs);
  plan p = finish_plan(g, d, std::move(keep), std::move(segs));
  DROPIT_EXPECTS(p.cost == best, "checkpoint: internal error: plan costs ", p.cost, ", expected ",
                 best);
  p.search_passes = passes;
  return p;
}

[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace detail

inline plan solve(const graph& g) {
  const auto start = std::chrono::steady_clock::now();
  const detail::dag d = detail::make_dag(g);
  plan p;
  if (d.n == 1) {
    p = detail::finish_plan(g, d, {}, {});
  } else {
    const detail::division_tree tree = detail::tree_builder(d).build();
    p = detail::optimize(g, d, tree);
  }
  p.solve_seconds = detail::seconds_since(start);
  return p;
}

inline plan solve_linear(const graph& g) {
  const auto start = std::chrono::steady_clock::now();
  const detail::dag d = detail::make_dag(g);
  for (vertex_index v : d.order) {
    DROPIT_EXPECTS(d.out(v).size() <= 1 && d.in(v).size() <= 1, "checkpoint: solve_linear: vertex ",
                   detail::quote_id(g.id(v)), " has ", d.in(v).size(), " inputs and ",
                   d.out(v).size(), " outputs; use solve() for graphs with branches");
  }
  plan p;
  if (d.n == 1) {
    p = detail::finish_plan(g, d, {}, {});
  } else {
    // One series node over the chain (or a leaf for two vertices); every piece is one edge.
    detail::division_tree tree;
    const std::size_t pieces = d.n - 1;
    detail::tree_node root;
    root.s = d.source;
    root.t = d.target;
    root.kind = pieces == 1 ? detail::node_kind::leaf : detail::node_kind::series;
    root.first_child = 0;
    root.child_count = pieces == 1 ? 0 : pieces;
    tree.prefix.push_back(0);
    for (std::size_t i = 1; i + 1 < d.n; ++i) {
      const vertex_index v = d.order[i];
      tree.own.push_back(v);
      root.cost += d.cost[v];
      tree.prefix.push_back(root.cost);
    }
    tree.prefix.push_back(root.cost);
    root.own_cost = root.cost;
    root.own_count = tree.own.size();
    tree.nodes.push_back(root);
    for (std::size_t i = 0; i < root.child_count; ++i) {
      detail::tree_node leaf;
      leaf.s = d.order[i];
      leaf.t = d.order[i + 1];
      tree.children.push_back(tree.nodes.size());
      tree.nodes.push_back(leaf);
    }
    p = detail::optimize(g, d, tree);
  }
  p.solve_seconds = detail::seconds_since(start);
  return p;
}

namespace detail {

/// `evaluate` on a validated graph: segments are the connected groups of dropped vertices (neither
/// kept nor compressed), each with one entry (never a compressed vertex) and one exit.
inline plan evaluate_sets(const graph& g, const dag& d, std::span<const vertex_index> checkpoints,
                          std::span<const compression> compressed) {
  std::vector<char> kept(d.n, 0), packed(d.n, 0);
  kept[d.source] = kept[d.target] = 1;
  auto claim = [&](vertex_index v) {
    DROPIT_EXPECTS(v < d.n, "checkpoint: evaluate: vertex index ", v, " out of range");
    DROPIT_EXPECTS(v != d.source && v != d.target, "checkpoint: evaluate: ", quote_id(g.id(v)),
                   " is the source or the target, which are always kept");
    DROPIT_EXPECTS(!kept[v], "checkpoint: evaluate: vertex ", quote_id(g.id(v)), " repeats");
    kept[v] = 1;
  };
  for (vertex_index v : checkpoints)
    claim(v);
  for (const compression& c : compressed) {
    claim(c.vertex);
    DROPIT_EXPECTS(c.option < g.storage(c.vertex).size(), "checkpoint: evaluate: vertex ",
                   quote_id(g.id(c.vertex)), " has no storage option ", c.option, " (it has ",
                   g.storage(c.vertex).size(), ")");
    packed[c.vertex] = 1;
  }
  // Segments: connected groups of dropped vertices, each with one entry and one exit.
  std::vector<segment> segs;
  std::vector<char> seen(d.n, 0);
  for (vertex_index root : d.order) {
    if (kept[root] || seen[root]) continue;
    std::vector<vertex_index> group{root}, entries, exits;
    seen[root] = 1;
    for (std::size_t i = 0; i < group.size(); ++i) {
      const vertex_index v = group[i];
      auto visit = [&](vertex_index w, std::vector<vertex_index>& boundary) {
        if (kept[w]) {
          if (std::find(boundary.begin(), boundary.end(), w) == boundary.end())
            boundary.push_back(w);
        } else if (!seen[w]) {
          seen[w] = 1;
          group.push_back(w);
        }
      };
      for (vertex_index w : d.in(v))
        visit(w, entries);
      for (vertex_index w : d.out(v))
        visit(w, exits);
    }
    DROPIT_EXPECTS(entries.size() == 1, "checkpoint: evaluate: the checkpoints leave vertex ",
                   quote_id(g.id(root)), " in a group entered from ", entries.size(), " vertices (",
                   quote_id(g.id(entries[0])), " and ", quote_id(g.id(entries[1])),
                   "); a segment needs one entry");
    DROPIT_EXPECTS(exits.size() == 1, "checkpoint: evaluate: the checkpoints leave vertex ",
                   quote_id(g.id(root)), " in a group that feeds ", exits.size(), " vertices (",
                   quote_id(g.id(exits[0])), " and ", quote_id(g.id(exits[1])),
                   "); a segment needs one exit");
    DROPIT_EXPECTS(!packed[entries[0]], "checkpoint: evaluate: compressed vertex ",
                   quote_id(g.id(entries[0])), " would be the entry of the segment of ",
                   quote_id(g.id(root)), "; a segment is recomputed from an exact tensor");
    segs.push_back(segment{entries[0], exits[0], std::move(group), 0});
  }
  std::vector<vertex_index> keep(checkpoints.begin(), checkpoints.end());
  return finish_plan(g, d, std::move(keep), std::move(segs),
                     std::vector<compression>(compressed.begin(), compressed.end()));
}

}  // namespace detail

inline plan evaluate(const graph& g, std::span<const vertex_index> checkpoints) {
  return evaluate(g, checkpoints, {});
}

inline plan evaluate(const graph& g, std::span<const vertex_index> checkpoints,
                     std::span<const compression> compressed) {
  const auto start = std::chrono::steady_clock::now();
  const detail::dag d = detail::make_dag(g);
  plan p = detail::evaluate_sets(g, d, checkpoints, compressed);
  p.solve_seconds = detail::seconds_since(start);
  return p;
}

}  // namespace dropit::checkpoint
