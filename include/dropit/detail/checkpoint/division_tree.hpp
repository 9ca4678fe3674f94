/**
 * @file division_tree.hpp
 * @brief The division tree of a two-terminal DAG, the structure the planner's dynamic program runs
 * on (the paper's linear / branch / complicate divisions).
 *
 * A node stands for a sub-graph H with terminals s and t in which every vertex lies on an s-t path
 * and whose inner vertices touch nothing outside H (an "independent segment"). Its kind:
 * - leaf: no inner vertex (one operation s -> t, or several);
 * - series: H has splitting vertices (every s-t path passes through them); they form the chain
 *   s = c0, c1, ..., ck, t and the pieces between consecutive chain vertices are the children.
 *   A vertex splits H exactly when no edge jumps over it in a topological order;
 * - parallel: no splitting vertex, and H minus {s, t} falls apart into several components (or one
 *   plus a direct edge s -> t): each component with s and t is a child (a branch);
 * - complicate: one component and no direct edge. Its children are the maximal independent
 *   segments (u, w) != (s, t): the union of the components of H - {u, w} that contain neither s
 *   nor t. The inner vertices outside every child form the skeleton; once any inner vertex of H is
 *   kept, every skeleton vertex must be kept too (a segment containing one would need two entries
 *   or two exits), and the children are independent sub-problems.
 */
#pragma once

#include <dropit/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace dropit::checkpoint::detail {

/// The validated graph in the form the planner walks: compressed adjacency, edges deduplicated.
struct dag {
  std::size_t n = 0;
  vertex_index source = 0, target = 0;
  std::vector<cost_t> cost;
  std::vector<vertex_index> order;            ///< topological order
  std::vector<std::size_t> pos;               ///< pos[v]: v's place in `order`
  std::vector<std::size_t> succ_at, pred_at;  ///< offsets into succ / pred (n + 1 each)
  std::vector<vertex_index> succ, pred;

  [[nodiscard]] std::span<const vertex_index> out(vertex_index v) const noexcept {
    return {succ.data() + succ_at[v], succ_at[v + 1] - succ_at[v]};
  }
  [[nodiscard]] std::span<const vertex_index> in(vertex_index v) const noexcept {
    return {pred.data() + pred_at[v], pred_at[v + 1] - pred_at[v]};
  }
};

/// Validates `g` (throws as `graph::topological_order`) and builds its `dag`.
[[nodiscard]] inline dag make_dag(const graph& g) {
  dag d;
  d.order = g.topological_order();
  d.n = g.vertex_count();
  d.source = g.source();
  d.target = g.target();
  d.cost.resize(d.n);
  d.pos.resize(d.n);
  for (vertex_index v = 0; v < d.n; ++v)
    d.cost[v] = g.cost(v);
  for (std::size_t i = 0; i < d.n; ++i)
    d.pos[d.order[i]] = i;
  std::vector<std::pair<vertex_index, vertex_index>> es;
  es.reserve(g.edge_count());
  for (const edge& e : g.edges())
    es.emplace_back(e.from, e.to);
  std::sort(es.begin(), es.end());
  es.erase(std::unique(es.begin(), es.end()), es.end());
  d.succ_at.assign(d.n + 1, 0);
  d.pred_at.assign(d.n + 1, 0);
  for (auto [u, v] : es) {
    ++d.succ_at[u + 1];
    ++d.pred_at[v + 1];
  }
  for (std::size_t i = 0; i < d.n; ++i) {
    d.succ_at[i + 1] += d.succ_at[i];
    d.pred_at[i + 1] += d.pred_at[i];
  }
  d.succ.resize(es.size());
  d.pred.resize(es.size());
  std::vector<std::size_t> fill_s(d.succ_at.begin(), d.succ_at.end() - 1);
  std::vector<std::size_t> fill_p(d.pred_at.begin(), d.pred_at.end() - 1);
  for (auto [u, v] : es) {
    d.succ[fill_s[u]++] = v;
    d.pred[fill_p[v]++] = u;
  }
  return d;
}

enum class node_kind : std::uint8_t { leaf, series, parallel, complicate };

/// One division; see the file comment.
struct tree_node {
  node_kind kind = node_kind::leaf;
  vertex_index s = 0, t = 0;
  cost_t cost = 0;      ///< sum of the inner vertices' costs
  cost_t own_cost = 0;  ///< sum of the own vertices' costs (chain or skeleton)
  std::size_t first_child = 0, child_count = 0;  ///< into division_tree::children
  std::size_t first_own = 0, own_count = 0;      ///< into division_tree::own
  std::size_t first_prefix = 0;  ///< series: into division_tree::prefix (child_count + 1 entries)
};

/// Nodes in pre-order (a parent comes before its children), so a reverse sweep is bottom-up.
struct division_tree {
  std::vector<tree_node> nodes;
  std::vector<std::size_t> children;  ///< child node indices, contiguous per node
  std::vector<vertex_index> own;      ///< series: the inner chain vertices; complicate: skeleton
  /// series: prefix[j] = costs of the pieces 0..j-1 plus of the chain vertices c1..cj (ck+1 = t
  /// counts 0); the inner cost of the run of pieces i..j-1 is prefix[j] - prefix[i] - cost(cj).
  std::vector<cost_t> prefix;
};

/// Builds the division tree of the whole graph (which must have source != target).
class tree_builder {
 public:
  explicit tree_builder(const dag& d) : d_(d), stamp_(d.n, 0), local_(d.n, 0) {}

  [[nodiscard]] division_tree build() {
    struct work {
      std::size_t node;
      std::vector<vertex_index> verts;  // sorted by topological position; front = s, back = t
      bool skip_direct;                 // ignore edges s -> t (a parallel branch)
    };
    tree_.nodes.emplace_back();
    std::vector<work> stack;
    stack.push_back({0, d_.order, false});
    while (!stack.empty()) {
      work w = std::move(stack.back());
      stack.pop_back();
      auto kids = split(w.node, w.verts, w.skip_direct);
      for (auto& k : kids)
        stack.push_back({k.node, std::move(k.verts), k.skip_direct});
    }
    return std::move(tree_);
  }

 private:
  struct child {
    std::size_t node;
    std::vector<vertex_index> verts;
    bool skip_direct;
  };

  void mark(const std::vector<vertex_index>& verts) {
    if (++current_ == 0) {  // wrapped: clear and restart
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      current_ = 1;
    }
    for (std::size_t i = 0; i < verts.size(); ++i) {
      stamp_[verts[i]] = current_;
      local_[verts[i]] = i;
    }
  }
  [[nodiscard]] bool inside(vertex_index v) const noexcept { return stamp_[v] == current_; }

  /// Allocates `count` consecutive children of `node` and returns the first node index.
  std::size_t add_children(std::size_t node, std::size_t count) {
    const std::size_t first = tree_.nodes.size();
    tree_.nodes.resize(first + count);
    tree_node& nd = tree_.nodes[node];
    nd.first_child = tree_.children.size();
    nd.child_count = count;
    for (std::size_t i = 0; i < count; ++i)
      tree_.children.push_back(first + i);
    return first;
  }

  std::vector<child> split(std::size_t node, const std::vector<vertex_index>& verts,
                           bool skip_direct) {
    const vertex_index s = verts.front();
    const vertex_index t = verts.back();
    {
      tree_node& nd = tree_.nodes[node];
      nd.s = s;
      nd.t = t;
      for (std::size_t i = 1; i + 1 < verts.size(); ++i)
        nd.cost += d_.cost[verts[i]];
    }
    if (verts.size() == 2) {
      tree_.nodes[node].kind = node_kind::leaf;
      return {};
    }
    mark(verts);
    auto direct = [&](vertex_index u, vertex_index w) { return skip_direct && u == s && w == t; };

    // ---- series: vertices no edge jumps over, in topological order
    std::vector<std::size_t> chain{0};  // local positions of s, c1, ..., ck, t
    std::size_t reach = 0;
    for (std::size_t i = 0; i < verts.size(); ++i) {
      if (i > 0 && i + 1 < verts.size() && reach <= i) chain.push_back(i);
      for (vertex_index w : d_.out(verts[i]))
        if (inside(w) && !direct(verts[i], w)) reach = std::max(reach, local_[w]);
    }
    chain.push_back(verts.size() - 1);
    if (chain.size() > 2) return split_series(node, verts, chain);

    // ---- parallel: components of H - {s, t}
    std::vector<std::size_t> comp(verts.size(), npos);
    std::size_t ncomp = 0;
    std::vector<std::size_t> stack;
    for (std::size_t i = 1; i + 1 < verts.size(); ++i) {
      if (comp[i] != npos) continue;
      comp[i] = ncomp;
      stack.push_back(i);
      while (!stack.empty()) {
        const vertex_index v = verts[stack.back()];
        stack.pop_back();
        auto visit = [&](vertex_index w) {
          if (!inside(w) || w == s || w == t) return;
          const std::size_t lw = local_[w];
          if (comp[lw] == npos) {
            comp[lw] = ncomp;
            stack.push_back(lw);
          }
        };
        for (vertex_index w : d_.out(v))
          visit(w);
        for (vertex_index w : d_.in(v))
          visit(w);
      }
      ++ncomp;
    }
    bool has_direct = false;
    if (!skip_direct)
      for (vertex_index w : d_.out(s))
        has_direct = has_direct || w == t;
    if (ncomp + (has_direct ? 1 : 0) >= 2) {
      tree_.nodes[node].kind = node_kind::parallel;
      std::vector<child> kids(ncomp);
      const std::size_t first = add_children(node, ncomp);
      for (std::size_t c = 0; c < ncomp; ++c) {
        kids[c].node = first + c;
        kids[c].skip_direct = true;
        kids[c].verts.push_back(s);
      }
      for (std::size_t i = 1; i + 1 < verts.size(); ++i)
        kids[comp[i]].verts.push_back(verts[i]);
      for (auto& k : kids)
        k.verts.push_back(t);
      return kids;
    }
    return split_complicate(node, verts);
  }

  std::vector<child> split_series(std::size_t node, const std::vector<vertex_index>& verts,
                                  const std::vector<std::size_t>& chain) {
    tree_node& nd = tree_.nodes[node];
    nd.kind = node_kind::series;
    nd.first_own = tree_.own.size();
    nd.own_count = chain.size() - 2;
    nd.first_prefix = tree_.prefix.size();
    for (std::size_t j = 1; j + 1 < chain.size(); ++j) {
      tree_.own.push_back(verts[chain[j]]);
      nd.own_cost += d_.cost[verts[chain[j]]];
    }
    const std::size_t pieces = chain.size() - 1;
    std::vector<child> kids(pieces);
    cost_t acc = 0;
    tree_.prefix.push_back(0);
    for (std::size_t p = 0; p < pieces; ++p) {
      kids[p].verts.assign(verts.begin() + static_cast<std::ptrdiff_t>(chain[p]),
                           verts.begin() + static_cast<std::ptrdiff_t>(chain[p + 1]) + 1);
      kids[p].skip_direct = false;
      for (std::size_t i = chain[p] + 1; i < chain[p + 1]; ++i)
        acc += d_.cost[verts[i]];
      if (p + 1 < pieces) acc += d_.cost[verts[chain[p + 1]]];
      tree_.prefix.push_back(acc);
    }
    const std::size_t first = add_children(node, pieces);
    for (std::size_t p = 0; p < pieces; ++p)
      kids[p].node = first + p;
    return kids;
  }

  /// Children of a complicate node. For every removed vertex r, a depth-first search of H - r
  /// from the terminals (s and t merged into one root unless r is one of them) finds, for every
  /// other vertex w, the part of H - {r, w} cut off from the terminals (low-link); each vertex
  /// remembers the largest such part it lies in. Those parts nest, so the largest ones are the
  /// maximal independent segments. O(h * (h + m_H)).
  std::vector<child> split_complicate(std::size_t node, const std::vector<vertex_index>& verts) {
    const std::size_t h = verts.size();
    const vertex_index s = verts.front();
    const vertex_index t = verts.back();
    // Undirected local adjacency of H without the edge s - t.
    std::vector<std::size_t> at(h + 1, 0);
    std::vector<std::size_t> adj;
    {
      std::vector<std::pair<std::size_t, std::size_t>> es;
      for (std::size_t i = 0; i < h; ++i)
        for (vertex_index w : d_.out(verts[i]))
          if (inside(w) && !(verts[i] == s && w == t)) {
            es.emplace_back(i, local_[w]);
            es.emplace_back(local_[w], i);
          }
      std::sort(es.begin(), es.end());
      for (auto [a, b] : es)
        ++at[a + 1];
      for (std::size_t i = 0; i < h; ++i)
        at[i + 1] += at[i];
      adj.reserve(es.size());
      for (auto [a, b] : es)
        adj.push_back(b);
    }
    std::vector<std::size_t> best_size(h, 0), best_u(h, npos), best_w(h, npos);
    std::vector<std::size_t> disc(h), low(h), parent(h), next(h), sub(h), cut(h), preorder;
    std::vector<char> parent_seen(h);
    std::vector<std::size_t> top(h);
    std::vector<std::size_t> stack;
    preorder.reserve(h);
    for (std::size_t r = 0; r < h; ++r) {
      const bool merged = r != 0 && r != h - 1;
      const std::size_t root = r == 0 ? h - 1 : 0;
      auto canon = [&](std::size_t x) { return merged && x == h - 1 ? 0 : x; };
      // The merged root's neighbours are those of s followed by those of t.
      auto degree = [&](std::size_t x) {
        std::size_t dg = at[x + 1] - at[x];
        if (merged && x == 0) dg += at[h] - at[h - 1];
        return dg;
      };
      auto neighbour = [&](std::size_t x, std::size_t k) {
        const std::size_t own_deg = at[x + 1] - at[x];
        return canon(k < own_deg ? adj[at[x] + k] : adj[at[h - 1] + (k - own_deg)]);
      };
      std::fill(disc.begin(), disc.end(), npos);
      preorder.clear();
      std::size_t clock = 0;
      disc[root] = low[root] = clock++;
      parent[root] = npos;
      next[root] = 0;
      sub[root] = 1;
      preorder.push_back(root);
      stack.assign(1, root);
      while (!stack.empty()) {
        const std::size_t x = stack.back();
        if (next[x] < degree(x)) {
          const std::size_t y = neighbour(x, next[x]++);
          if (y == r) continue;
          if (y == parent[x] && !parent_seen[x]) {  // the tree edge, once
            parent_seen[x] = 1;
            continue;
          }
          if (disc[y] == npos) {
            disc[y] = low[y] = clock++;
            parent[y] = x;
            parent_seen[y] = 0;
            next[y] = 0;
            sub[y] = 1;
            cut[y] = 0;
            preorder.push_back(y);
            stack.push_back(y);
          } else {
            low[x] = std::min(low[x], disc[y]);
          }
        } else {
          stack.pop_back();
          const std::size_t p = parent[x];
          if (p != npos) {
            low[p] = std::min(low[p], low[x]);
            sub[p] += sub[x];
            if (p != root && low[x] >= disc[p]) cut[p] += sub[x];
          }
        }
      }
      DROPIT_EXPECTS(preorder.size() + 1 + (merged ? 1 : 0) == h,
                     "checkpoint: internal error: a vertex hangs off a single vertex");
      for (std::size_t x : preorder) {
        top[x] = npos;
        if (x == root) continue;
        const std::size_t p = parent[x];
        if (p == root) continue;
        if (top[p] != npos)
          top[x] = top[p];
        else if (low[x] >= disc[p])
          top[x] = p;
        if (top[x] != npos && cut[top[x]] > best_size[x]) {
          best_size[x] = cut[top[x]];
          best_u[x] = std::min(r, top[x]);
          best_w[x] = std::max(r, top[x]);
        }
      }
    }
    // Group the inner vertices by their maximal segment; the rest is the skeleton.
    tree_node& nd = tree_.nodes[node];
    nd.kind = node_kind::complicate;
    nd.first_own = tree_.own.size();
    std::vector<std::pair<std::pair<std::size_t, std::size_t>, std::size_t>> groups;
    for (std::size_t i = 1; i + 1 < h; ++i) {
      if (best_u[i] == npos) {
        tree_.own.push_back(verts[i]);
        nd.own_cost += d_.cost[verts[i]];
      } else {
        groups.push_back({{best_u[i], best_w[i]}, i});
      }
    }
    nd.own_count = tree_.own.size() - nd.first_own;
    std::sort(groups.begin(), groups.end());
    std::vector<child> kids;
    for (std::size_t g = 0; g < groups.size();) {
      const auto [u, w] = groups[g].first;
      child k{};
      std::vector<std::size_t> members{u, w};
      std::size_t e = g;
      for (; e < groups.size() && groups[e].first == groups[g].first; ++e)
        members.push_back(groups[e].second);
      DROPIT_EXPECTS(e - g == best_size[groups[g].second] && best_u[u] == npos && best_u[w] == npos,
                     "checkpoint: internal error: overlapping independent segments");
      std::sort(members.begin(), members.end());
      for (std::size_t m : members)
        k.verts.push_back(verts[m]);
      kids.push_back(std::move(k));
      g = e;
    }
    const std::size_t first = add_children(node, kids.size());
    for (std::size_t c = 0; c < kids.size(); ++c)
      kids[c].node = first + c;
    return kids;
  }

  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();
  const dag& d_;
  std::vector<std::uint32_t> stamp_;
  std::vector<std::size_t> local_;
  std::uint32_t current_ = 0;
  division_tree tree_;
};

}  // namespace dropit::checkpoint::detail
