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
#include <optional>
#include <utility>
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

/**
 * The local search after `solve_step_budget`'s frontier search, over the plans one vertex's
 * decision away (kept, dropped, or compressed with one of its options) from the current one,
 * priced by `evaluate` (an assignment that is no plan, which it rejects by throwing, is skipped)
 * and `simulate_step`. Both steps update the plan and its step peak in place: `lower_peak` moves
 * to the neighbour with the least step peak while that is below the current one, until it fits
 * in the budget (from an over-budget plan), or to the plan two changes away with the least step
 * peak when no neighbour lowers it (`least_peak_pair`); `lower_time` moves to the fastest
 * neighbour that fits, while it is faster, and when none is, to a plan two changes away
 * (`pair_move`).
 */
class step_search {
 public:
  step_search(const graph& g, cost_t budget) : g_(g), budget_(budget), times_(vertex_times(g)) {}

  void lower_peak(plan& p, cost_t& peak) const {
    std::vector<std::pair<cost_t, change>> singles;  // each valid single change and its peak
    for (;;) {
      std::optional<std::pair<plan, cost_t>> best;
      const std::vector<long> choice = choices(p);
      singles.clear();
      for (vertex_index v = 0; v < choice.size(); ++v) {
        if (v == g_.source() || v == g_.target()) continue;
        const long options = static_cast<long>(g_.storage(v).size());
        for (long to = -1; to <= options; ++to) {
          if (to == choice[v]) continue;
          std::optional<plan> q = with_choice(choice, v, to);
          if (!q) continue;
          const cost_t qp = simulate_step(g_, *q).peak;
          singles.push_back({qp, {0.0, v, to}});  // (its time is not needed here)
          if (qp < (best ? best->second : peak)) best.emplace(std::move(*q), qp);
        }
      }
      // None lowers the peak: two changes at once, of the `pair_width` singles with the least
      // peaks.
      if (!best) best = least_peak_pair(choice, singles, peak);
      if (!best) return;
      p = std::move(best->first);
      peak = best->second;
      if (peak <= budget_) return;
    }
  }

  void lower_time(plan& p, cost_t& peak) const {
    // Only a dropped or compressed vertex can make the plan faster (kept instead, or dropped or
    // compressed at a lower time), by the difference of the two times: those moves, largest gain
    // first; the first that fits is the fastest neighbour that fits.
    std::vector<change> saving, other;
    for (;;) {
      const std::vector<long> choice = choices(p);
      changes(choice, saving, other);
      bool moved = false;
      for (const change& m : saving) {
        std::optional<plan> q = with_choice(choice, m.v, m.to);
        if (!q || !(q->extra_time < p.extra_time)) continue;
        const cost_t qp = simulate_step(g_, *q).peak;
        if (qp > budget_) continue;
        p = std::move(*q);
        peak = qp;
        moved = true;
        break;
      }
      if (!moved && !pair_move(p, peak, choice, saving, other)) return;
    }
  }

 private:
  /// One vertex's decision changed: `delta` = extra time after less before.
  struct change {
    double delta;
    vertex_index v;
    long to;
  };

  /// Every single change of `choice`: the faster ones (`saving`, largest saving first) and the
  /// others (smallest cost first).
  void changes(const std::vector<long>& choice, std::vector<change>& saving,
               std::vector<change>& other) const {
    saving.clear();
    other.clear();
    for (vertex_index v = 0; v < choice.size(); ++v) {
      if (v == g_.source() || v == g_.target()) continue;
      const auto options = g_.storage(v);
      const auto cost = [&](long c) {
        return c < 0 ? times_[v] : c == 0 ? 0.0 : options[c - 1].time;
      };
      const double now = cost(choice[v]);
      for (long to = -1; to <= static_cast<long>(options.size()); ++to)
        if (to != choice[v]) (cost(to) < now ? saving : other).push_back({cost(to) - now, v, to});
    }
    const auto by_delta = [](const change& a, const change& b) {
      return a.delta != b.delta ? a.delta < b.delta : a.v != b.v ? a.v < b.v : a.to < b.to;
    };
    std::sort(saving.begin(), saving.end(), by_delta);
    std::sort(other.begin(), other.end(), by_delta);
  }

  /// The plan two changes away with the least step peak below `peak`, if any: pairs of the
  /// `pair_width` single changes of the least peaks (different vertices).
  std::optional<std::pair<plan, cost_t>> least_peak_pair(
      const std::vector<long>& choice, std::vector<std::pair<cost_t, change>>& singles,
      cost_t peak) const {
    constexpr std::size_t pair_width = 32;
    std::sort(singles.begin(), singles.end(), [](const auto& x, const auto& y) {
      return x.first != y.first         ? x.first < y.first
             : x.second.v != y.second.v ? x.second.v < y.second.v
                                        : x.second.to < y.second.to;
    });
    const std::size_t m = std::min(singles.size(), pair_width);
    std::optional<std::pair<plan, cost_t>> best;
    for (std::size_t a = 0; a < m; ++a) {
      for (std::size_t b = a + 1; b < m; ++b) {
        const change& x = singles[a].second;
        const change& y = singles[b].second;
        if (x.v == y.v) continue;
        std::optional<plan> q = with_choices(choice, x, y);
        if (!q) continue;
        const cost_t qp = simulate_step(g_, *q).peak;
        if (qp < (best ? best->second : peak)) best.emplace(std::move(*q), qp);
      }
    }
    return best;
  }

  /// When no single change is faster and fits: two vertices' decisions changed at once for a net
  /// saving (e.g. one tensor kept instead of recomputed, another recomputed or compressed to make
  /// room). Pairs of the `pair_width` largest savings with each other and with the `pair_width`
  /// smallest other changes, by net saving, largest first; the first that fits is taken, after at
  /// most `pair_tries` priced by `simulate_step`. Returns whether it moved.
  bool pair_move(plan& p, cost_t& peak, const std::vector<long>& choice,
                 const std::vector<change>& saving, const std::vector<change>& other) const {
    constexpr std::size_t pair_width = 32, pair_tries = 256;
    const std::size_t ns = std::min(saving.size(), pair_width);
    const std::size_t no = std::min(other.size(), pair_width);
    struct pair_change {
      double delta;
      std::size_t a, b;  // saving[a] and saving[b] (b < pair_width) or other[b - pair_width]
    };
    std::vector<pair_change> pairs;
    for (std::size_t a = 0; a < ns; ++a) {
      for (std::size_t b = a + 1; b < ns; ++b)
        if (saving[a].v != saving[b].v) pairs.push_back({saving[a].delta + saving[b].delta, a, b});
      for (std::size_t b = 0; b < no; ++b)
        if (saving[a].v != other[b].v && saving[a].delta + other[b].delta < 0.0)
          pairs.push_back({saving[a].delta + other[b].delta, a, pair_width + b});
    }
    std::sort(pairs.begin(), pairs.end(), [](const pair_change& x, const pair_change& y) {
      return x.delta != y.delta ? x.delta < y.delta : x.a != y.a ? x.a < y.a : x.b < y.b;
    });
    std::size_t tried = 0;
    for (const pair_change& pc : pairs) {
      const change& first = saving[pc.a];
      const change& second = pc.b < pair_width ? saving[pc.b] : other[pc.b - pair_width];
      std::optional<plan> q = with_choices(choice, first, second);
      if (!q || !(q->extra_time < p.extra_time)) continue;
      if (++tried > pair_tries) break;
      const cost_t qp = simulate_step(g_, *q).peak;
      if (qp > budget_) continue;
      p = std::move(*q);
      peak = qp;
      return true;
    }
    return false;
  }

  /// Per vertex: -1 dropped, 0 kept, k > 0 compressed with option k - 1.
  static std::vector<long> choices(const plan& p) {
    std::vector<long> choice(p.decisions.size(), -1);
    for (vertex_index v = 0; v < choice.size(); ++v)
      if (p.decisions[v] == decision::keep) choice[v] = 0;
    for (const compression& c : p.compressed)
      choice[c.vertex] = static_cast<long>(c.option) + 1;
    return choice;
  }

  /// The plan of `choice` with vertex v's choice `to`, if that is a plan (not, e.g., a pack that
  /// feeds a recomputation or a group with two exits).
  std::optional<plan> with_choice(const std::vector<long>& choice, vertex_index v, long to) const {
    std::vector<vertex_index> keep;
    std::vector<compression> packed;
    for (vertex_index u = 0; u < choice.size(); ++u) {
      if (u == g_.source() || u == g_.target()) continue;
      const long c = u == v ? to : choice[u];
      if (c == 0) keep.push_back(u);
      if (c > 0) packed.push_back({u, static_cast<std::size_t>(c - 1)});
    }
    try {
      return evaluate(g_, keep, packed);
    } catch (const dropit::error&) {
      return std::nullopt;
    }
  }

  /// The plan of `choice` with two changes (of different vertices) applied, if that is a plan.
  std::optional<plan> with_choices(const std::vector<long>& choice, const change& a,
                                   const change& b) const {
    std::vector<long> next = choice;
    next[a.v] = a.to;
    return with_choice(next, b.v, b.to);
  }

  const graph& g_;
  cost_t budget_;
  std::vector<double> times_;  // graph::time of every vertex
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
  // Gradients an op computes for inputs that already have one: alive while the op runs, then
  // added into the input's buffer (in place, or into a new buffer while another gradient shares
  // it) and freed.
  std::vector<vertex_index> summands;
  std::vector<char> summand_bytes;
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
      return;
    }
    if (!passed) meter.add(g.cost(u), at);
    summands.push_back(u);
    summand_bytes.push_back(passed ? 0 : 1);
  };
  // An operation's own temporaries, while it computes its inputs' gradients; then the sums.
  const auto workspace = [&](vertex_index w) {
    meter.add(g.workspace(w), w);
    meter.remove(g.workspace(w));
    for (std::size_t i = 0; i < summands.size(); ++i) {
      const vertex_index u = summands[i];
      if (buffer_users[buffer[u]] > 1) {
        const std::size_t shared = buffer[u];
        new_buffer(u, w);  // the sum, while both terms are alive
        if (--buffer_users[shared] == 0) meter.remove(buffer_bytes[shared]);
      }
      if (summand_bytes[i]) meter.remove(g.cost(u));
    }
    summands.clear();
    summand_bytes.clear();
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
  // The exact frontier, unless its search takes more than `options.step_search_work`: then the
  // frontier of the fast setting (`budget_options::fast()`, or tighter knobs). The start is a
  // heuristic's either way; on the built-in models past the limit (DenseNets, Inception-v3) the
  // plans were as fast to 0.13% and 5-33x sooner (docs/checkpoint.md).
  std::optional<detail::budget_search> search(std::in_place, g, d, tree, options);
  std::vector<detail::budget_hit> front =
      search->run(-1, options.step_search_work > 0 ? options.step_search_work
                                                   : std::numeric_limits<std::uint64_t>::max());
  std::size_t passes = 0;
  if (search->aborted()) {
    passes = search->passes();
    budget_options o = options;
    o.max_points = std::min(o.max_points, budget_options::fast().max_points);
    o.bound_ratio = std::max(o.bound_ratio, budget_options::fast().bound_ratio);
    search.reset();  // its sets are given back before the second search makes its own
    search.emplace(g, d, tree, o);
    front = search->run(-1);
  }
  passes += search->passes();
  // A frontier plan to start from: the fastest whose step fits, else the one with the least step
  // peak. Each costs a pass of the dynamic program, so a frontier of more than `scan_limit`
  // points is bisected instead (the step peak mostly grows with the planner's memory) between the
  // least-memory point that fits and the fastest point, and the points just above the boundary
  // found are tried too.
  constexpr std::size_t scan_limit = 64, above_boundary = 8;
  std::optional<plan> best;
  cost_t best_peak = std::numeric_limits<cost_t>::max();
  const auto visit = [&](std::size_t i) {
    plan p = search->make_plan(g, d, front[i]);
    const cost_t peak = simulate_step(g, p).peak;
    const bool fits = peak <= budget, best_fits = best_peak <= budget;
    // Frontier points are by memory, ascending, so by time, descending: a later fitting point is
    // faster.
    if (fits ? !best_fits || p.extra_time < best->extra_time : !best_fits && peak < best_peak) {
      best = std::move(p);
      best_peak = peak;
    }
    return fits;
  };
  if (front.size() <= scan_limit) {
    for (std::size_t i = front.size(); i-- > 0;)
      if (visit(i)) break;
  } else if (!visit(front.size() - 1)) {
    // The least-memory points first (the least step peaks lie there), up to the first that fits.
    std::size_t lo = front.size();
    for (std::size_t i = 0; i < scan_limit && lo == front.size(); ++i)
      if (visit(i)) lo = i;
    if (lo < front.size()) {
      std::size_t hi = front.size() - 1;  // lo fits, hi does not
      while (hi - lo > 1) {
        const std::size_t mid = lo + (hi - lo) / 2;
        (visit(mid) ? lo : hi) = mid;
      }
      for (std::size_t i = hi + 1; i < std::min(front.size() - 1, hi + 1 + above_boundary); ++i)
        (void)visit(i);
    }
  }
  DROPIT_EXPECTS(best.has_value(), "checkpoint: solve_step_budget: the frontier has no plan");
  const detail::step_search local(g, budget);
  if (best_peak > budget) local.lower_peak(*best, best_peak);
  DROPIT_EXPECTS(best_peak <= budget, "checkpoint: solve_step_budget: no plan fits in ", budget,
                 "; the least step peak found (frontier plans tried, of ", front.size(),
                 ", then changes of one or two decisions at a time) is ", best_peak);
  local.lower_time(*best, best_peak);
  best->exact = false;
  best->search_passes = passes;
  best->solve_seconds = detail::seconds_since(start);
  return std::move(*best);
}

}  // namespace dropit::checkpoint
