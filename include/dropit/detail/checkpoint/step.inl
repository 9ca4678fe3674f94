/**
 * @file step.inl
 * @brief `simulate_step` and `solve_step_budget` (checkpoint.hpp): the memory of a training step
 * run with a plan, replayed tensor by tensor in the execution model of
 * `dropit::torch::checkpointed_graph`.
 */
#pragma once

#include <dropit/detail/checkpoint/budget.inl>  // budget_search, make_dag, tree_builder
#include <dropit/detail/checkpoint/groups.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

namespace dropit::checkpoint {
namespace detail {

/// A running total of bytes that remembers its largest value and where it was reached.
class byte_meter {
 public:
  void add(cost_t bytes, vertex_index at) {
    now_ += bytes;
    if (now_ > peak_) {
      peak_ = now_;
      at_ = at;
    }
  }
  void remove(cost_t bytes) { now_ -= bytes; }
  [[nodiscard]] cost_t now() const noexcept { return now_; }
  [[nodiscard]] cost_t peak() const noexcept { return peak_; }
  [[nodiscard]] vertex_index at() const noexcept { return at_; }

 private:
  cost_t now_ = 0, peak_ = 0;
  vertex_index at_ = 0;
};

}  // namespace detail

inline step_memory simulate_step(const graph& g, const plan& p) {
  const detail::dag d = detail::make_dag(g);
  const std::size_t n = d.n;
  DROPIT_EXPECTS(p.decisions.size() == n, "checkpoint: simulate_step: the plan has ",
                 p.decisions.size(), " decisions for a graph of ", n, " vertices");
  const vertex_index src = g.source(), tgt = g.target();
  DROPIT_EXPECTS(p.decisions[src] == decision::keep && p.decisions[tgt] == decision::keep,
                 "checkpoint: simulate_step: the plan does not keep the source and the target");
  // What each vertex occupies between forward and backward: its bytes, its pack, or nothing.
  std::vector<cost_t> held(n, 0);
  std::vector<char> packed(n, 0);
  for (vertex_index v = 0; v < n; ++v)
    if (p.decisions[v] == decision::keep && v != src) held[v] = g.cost(v);
  for (const compression& c : p.compressed) {
    DROPIT_EXPECTS(c.vertex < n && p.decisions[c.vertex] == decision::compress &&
                       c.option < g.storage(c.vertex).size(),
                   "checkpoint: simulate_step: the plan's compression of vertex ", c.vertex,
                   " does not match its decisions or the vertex's storage options");
    held[c.vertex] = g.storage(c.vertex)[c.option].bytes;
    packed[c.vertex] = 1;
  }
  for (vertex_index v = 0; v < n; ++v)
    DROPIT_EXPECTS(p.decisions[v] != decision::compress || packed[v],
                   "checkpoint: simulate_step: vertex '", g.id(v),
                   "' is compressed without a storage option in the plan");

  // The nodes, in topological order of their exits (the order forward creates them); a direct
  // node has nothing to recompute or restore: a plain autograd op.
  std::vector<char> stored(n, 0);
  for (vertex_index v = 0; v < n; ++v)
    stored[v] = p.decisions[v] != decision::drop;
  const std::vector<detail::recompute_group> groups =
      detail::recompute_groups(d.order, src, stored, [&](vertex_index w) { return d.in(w); });
  std::vector<char> direct(groups.size(), 0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const detail::recompute_group& gr = groups[i];
    direct[i] = gr.inside.empty() && !packed[gr.exit] &&
                std::none_of(gr.entries.begin(), gr.entries.end(),
                             [&](vertex_index u) { return packed[u] != 0; });
  }
  constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
  // A stored tensor is freed after the backward of the last node (in backward order, so the
  // first in forward order) that saves it: a node that recomputes or restores saves its entries;
  // a plain op the inputs its operation keeps (`graph::saves`), and its own output if it keeps
  // it (the target always: it is the caller's). One that no node saves is freed in forward,
  // after its last reader.
  std::vector<std::size_t> release(n, never);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const vertex_index e = groups[i].exit;
    for (vertex_index u : groups[i].entries)
      if (!direct[i] || g.saves(e, u)) release[u] = std::min(release[u], i);
    if (direct[i] && (e == tgt || g.saves(e, e))) release[e] = std::min(release[e], i);
  }

  step_memory m;
  detail::byte_meter meter;
  // Forward: each node computes its group (the recomputed vertices, then the exit) while the
  // nodes before it hold what they store; a compressed vertex stays dense beside its pack until
  // the last node reading it has run.
  std::vector<std::size_t> last_reader(n, 0);
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (vertex_index u : groups[i].entries)
      last_reader[u] = std::max(last_reader[u], i);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const detail::recompute_group& gr = groups[i];
    cost_t transient = 0;
    for (vertex_index w : gr.inside) {
      meter.add(g.cost(w), w);
      transient += g.cost(w);
    }
    if (packed[gr.exit]) {
      meter.add(g.cost(gr.exit) + held[gr.exit], gr.exit);  // dense, then its pack
    } else {
      meter.add(held[gr.exit], gr.exit);
    }
    meter.remove(transient);
    for (vertex_index u : gr.entries) {
      if (last_reader[u] != i) continue;
      if (packed[u]) meter.remove(g.cost(u));
      if (release[u] == never && u != src) meter.remove(held[u]);
    }
  }
  // A compressed vertex no node reads (the plan never does this) would stay dense: drop it too.
  for (const detail::recompute_group& gr : groups)
    if (packed[gr.exit] && release[gr.exit] == never) meter.remove(g.cost(gr.exit));
  m.stored = meter.now();
  m.forward_peak = meter.peak();

  // Backward, node by node from the last. Gradients: a vertex's gradient is allocated when the
  // first of its readers runs backward and freed when its own operation has (before that
  // operation's inputs' gradients where it frees it early and autograd owns it). An operation
  // that passes its output gradient to an input (`graph::passes_gradient`: an addition, a view)
  // gives it the same buffer, freed with the last gradient using it; a later gradient of that
  // input is then summed into a new buffer while another gradient still shares the old one
  // (autograd adds in place only into a buffer it holds alone).
  std::vector<std::size_t> buffer(n, never);  // the buffer of each vertex's gradient
  std::vector<cost_t> buffer_bytes;
  std::vector<std::size_t> buffer_users;
  const auto new_buffer = [&](vertex_index u, vertex_index at) {
    buffer[u] = buffer_bytes.size();
    buffer_bytes.push_back(g.cost(u));
    buffer_users.push_back(1);
    meter.add(g.cost(u), at);
  };
  const auto drop_grad = [&](vertex_index u) {
    const std::size_t b = buffer[u];
    if (b == never) return;
    buffer[u] = never;
    if (--buffer_users[b] == 0) meter.remove(buffer_bytes[b]);
  };
  const auto add_grad = [&](vertex_index u, vertex_index at) {
    if (u == src) return;
    const bool passed = g.passes_gradient(at, u) && buffer[at] != never;
    if (buffer[u] == never) {
      if (passed) {
        buffer[u] = buffer[at];
        ++buffer_users[buffer[u]];
      } else {
        new_buffer(u, at);
      }
    } else if (buffer_users[buffer[u]] > 1) {
      const std::size_t shared = buffer[u];
      new_buffer(u, at);  // the sum, while both terms are alive
      if (--buffer_users[shared] == 0) meter.remove(buffer_bytes[shared]);
    }
  };
  // An operation's own temporaries, while it computes its inputs' gradients.
  const auto workspace = [&](vertex_index w) {
    meter.add(g.workspace(w), w);
    meter.remove(g.workspace(w));
  };
  // Per group: its members (inside vertices, then the exit), each vertex's place among them
  // (`never` outside the group), and for an inside vertex the member whose backward frees it
  // and its last reader.
  std::vector<vertex_index> members;
  std::vector<std::size_t> slot(n, never), keeper(n, never), last_use(n, never);
  std::vector<std::size_t> kept_by_head, kept_by_next(n, never);
  add_grad(tgt, tgt);
  for (std::size_t i = groups.size(); i-- > 0;) {
    const detail::recompute_group& gr = groups[i];
    const vertex_index e = gr.exit;
    if (direct[i]) {
      if (g.frees_gradient_early(e)) drop_grad(e);  // autograd owns it
      for (vertex_index u : d.in(e))
        add_grad(u, e);
      workspace(e);
      drop_grad(e);
    } else {
      // Restore the packed entries, recompute the group (its vertices, then the exit) with
      // autograd, then back-propagate through it op by op. A recomputed tensor lives until the
      // backward of the first member (in forward order) whose operation keeps it: itself if it
      // keeps its output, else a reader; one that no operation keeps is freed in the
      // recomputation, once its last reader in the group has run.
      cost_t restored = 0;
      for (vertex_index u : gr.entries)
        if (packed[u]) {
          meter.add(g.cost(u), e);
          restored += g.cost(u);
        }
      members.assign(gr.inside.begin(), gr.inside.end());
      members.push_back(e);
      for (std::size_t k = 0; k < members.size(); ++k)
        slot[members[k]] = k;
      for (std::size_t k = 0; k + 1 < members.size(); ++k) {
        const vertex_index w = members[k];
        keeper[w] = g.saves(w, w) ? k : never;
        last_use[w] = k;
      }
      for (std::size_t k = 0; k < members.size(); ++k)
        for (vertex_index u : d.in(members[k]))
          if (slot[u] < k) {  // an inside vertex of the group
            last_use[u] = k;
            if (keeper[u] == never && g.saves(members[k], u)) keeper[u] = k;
          }
      for (std::size_t k = 0; k < members.size(); ++k) {
        meter.add(g.cost(members[k]), members[k]);
        for (vertex_index u : d.in(members[k]))
          if (slot[u] < k && keeper[u] == never && last_use[u] == k) meter.remove(g.cost(u));
      }
      // The recomputed tensors each member's backward frees, as a list per member.
      kept_by_head.assign(members.size(), never);
      for (std::size_t j = 0; j + 1 < members.size(); ++j) {
        const std::size_t k = keeper[members[j]];
        if (k == never) continue;
        kept_by_next[j] = kept_by_head[k];
        kept_by_head[k] = j;
      }
      for (std::size_t k = members.size(); k-- > 0;) {
        const vertex_index x = members[k];
        // The exit's gradient is the node's argument, held to the end; the others are autograd's.
        if (x != e && g.frees_gradient_early(x)) drop_grad(x);
        for (vertex_index u : d.in(x))
          add_grad(u, x);
        workspace(x);
        if (x != e) drop_grad(x);
        for (std::size_t j = kept_by_head[k]; j != never; j = kept_by_next[j])
          meter.remove(g.cost(members[j]));
      }
      meter.remove(restored + g.cost(e));  // the restored entries and the exit's recomputation
      drop_grad(e);
      for (vertex_index x : members)
        slot[x] = never;
    }
    for (vertex_index u : gr.entries)
      if (release[u] == i) meter.remove(held[u]);
    if (release[e] == i) meter.remove(held[e]);
  }
  m.peak = meter.peak();
  m.peak_vertex = meter.at();
  return m;
}

inline plan solve_step_budget(const graph& g, cost_t budget, const budget_options& options) {
  const auto start = std::chrono::steady_clock::now();
  DROPIT_EXPECTS(budget >= 0, "checkpoint: solve_step_budget: negative budget ", budget);
  const detail::dag d = detail::make_dag(g);
  if (d.n == 1) {
    plan p = detail::finish_plan(g, d, {}, {});
    const cost_t peak = simulate_step(g, p).peak;
    DROPIT_EXPECTS(peak <= budget, "checkpoint: solve_step_budget: no plan fits in ", budget,
                   "; the least step peak of the plans tried is ", peak);
    p.exact = false;
    p.solve_seconds = detail::seconds_since(start);
    return p;
  }
  const detail::division_tree tree = detail::tree_builder(d).build();
  detail::budget_search search(g, d, tree, options);
  const std::vector<detail::budget_hit> front = search.run(-1);
  // From the fastest plan of the frontier to the smallest: the first whose step fits.
  cost_t least = std::numeric_limits<cost_t>::max();
  for (auto it = front.rbegin(); it != front.rend(); ++it) {
    plan p = search.make_plan(g, d, *it);
    const cost_t peak = simulate_step(g, p).peak;
    least = std::min(least, peak);
    if (peak > budget) continue;
    p.exact = false;
    p.search_passes = search.passes();
    p.solve_seconds = detail::seconds_since(start);
    return p;
  }
  dropit::detail::throw_error("checkpoint: solve_step_budget: no plan fits in ", budget,
                              "; the least step peak of the ", front.size(), " frontier plans is ",
                              least);
}

}  // namespace dropit::checkpoint
