/**
 * @file budget.inl
 * @brief Planner v2: least extra time under a memory budget, each vertex kept, compressed or
 * dropped. A bottom-up pass over the division tree for a bound M on the segment cost computes, per
 * node, the Pareto set of (stored bytes, extra time) of its inside, each point with its largest
 * segment; the search over M and the reconstruction of a chosen point's plan follow.
 */
#pragma once

#include <dropit/detail/checkpoint/division_tree.hpp>
#include <dropit/detail/checkpoint/solve.inl>  // vertex_times, finish_plan, evaluate_sets
#include <dropit/error.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

namespace dropit::checkpoint {
namespace detail {

/// One configuration of a node's inside (up to equal bytes and time): `k` bytes stored inside
/// (kept and compressed vertices), `t` extra time, `a` the largest segment inside. `x`, `y` and
/// `tag` say how it was made from the sets below it (see `budget_optimizer`).
struct pareto_point {
  cost_t k = 0;
  double t = 0.0;
  cost_t a = 0;
  std::uint32_t x = 0, y = 0;
  std::uint8_t tag = 0;
};

/**
 * The dynamic program of `solve_budget` for a bound M on the segment cost. Every node has two
 * Pareto sets: *open* (its first terminal s is stored exactly, so a segment inside may start at
 * s) and *closed* (s is compressed: nothing inside that s feeds may be dropped).
 *  - leaf: {(0, 0, 0)}.
 *  - parallel: the Minkowski sum of the branches' sets (bytes and times add, segments max).
 *  - complicate: either the whole inside is one segment (open only, if it fits in M), or every
 *    skeleton vertex is stored (kept, or compressed with one of its options) and each child is
 *    solved on its own, closed if its entry is a compressed skeleton vertex (or a closed s).
 *  - series with chain s = c0, ..., cP = t: G[j][E] / G[j][C] is the set of the pieces before cj
 *    with cj kept / compressed; IN[j] (cj not yet priced) is the union of G[j-1][E] + open piece,
 *    G[j-1][C] + closed piece, and, for every run of pieces i..j-1 whose inner cost fits in M,
 *    G[i][E] + the run dropped as one segment (its entry ci must be exact).
 * A set keeps, for equal bytes and time, the point with the smallest segment; one larger than
 * `max_points` is thinned to about that many points, the fastest of each of equal-width buckets
 * in bytes (the search then reports an inexact result).
 */
class budget_optimizer {
 public:
  /// memory_only: every time taken as 0, so each set is one point, the least bytes (the search
  /// then finds the least memory as fast as `solve`).
  budget_optimizer(const graph& g, const dag& d, const division_tree& t,
                   const budget_options& options, bool memory_only)
      : d_(d), t_(t), cap_(std::max<std::size_t>(options.max_points, 2)) {
    time_ = memory_only ? std::vector<double>(d.n, 0.0) : vertex_times(g);
    opts_.resize(d.n);
    if (options.use_storage) {
      for (vertex_index v = 0; v < d.n; ++v) {
        if (v == d.source || v == d.target) continue;
        const auto st = g.storage(v);
        // An option no smaller than the tensor is never better than keeping it exactly.
        for (std::size_t o = 0; o < st.size(); ++o)
          if (st[o].bytes < d.cost[v])
            opts_[v].push_back({st[o].bytes, memory_only ? 0.0 : st[o].time, o});
      }
    }
    const std::size_t nodes = t.nodes.size();
    node_time_.assign(nodes, 0.0);
    tprefix_at_.assign(nodes, 0);
    groups_.resize(nodes);
    std::vector<std::size_t> skeleton_of(d.n, npos);
    for (std::size_t k = nodes; k-- > 0;) {
      const tree_node& nd = t.nodes[k];
      double sum = 0.0;
      for (std::size_t c = 0; c < nd.child_count; ++c)
        sum += node_time_[t.children[nd.first_child + c]];
      for (std::size_t i = 0; i < nd.own_count; ++i)
        sum += time_[t.own[nd.first_own + i]];
      node_time_[k] = sum;
    }
    for (std::size_t k = 0; k < nodes; ++k) {
      const tree_node& nd = t.nodes[k];
      if (nd.kind == node_kind::series) {
        tprefix_at_[k] = tprefix_.size();
        double acc = 0.0;
        tprefix_.push_back(0.0);
        for (std::size_t p = 0; p < nd.child_count; ++p) {
          acc += node_time_[t.children[nd.first_child + p]];
          if (p + 1 < nd.child_count) acc += time_[t.own[nd.first_own + p]];
          tprefix_.push_back(acc);
        }
      } else if (nd.kind == node_kind::complicate) {
        // Children grouped by their entry: 0 for s, 1 + i for the i-th skeleton vertex.
        for (std::size_t i = 0; i < nd.own_count; ++i)
          skeleton_of[t.own[nd.first_own + i]] = i;
        groups_[k].assign(nd.own_count + 1, {});
        for (std::size_t c = 0; c < nd.child_count; ++c) {
          const std::size_t ch = t.children[nd.first_child + c];
          const vertex_index entry = t.nodes[ch].s;
          const std::size_t grp = entry == nd.s ? 0 : skeleton_of[entry] + 1;
          DROPIT_EXPECTS(grp != npos && grp <= nd.own_count,
                         "checkpoint: internal error: a child's entry is not in the skeleton");
          groups_[k][grp].push_back(ch);
        }
      }
    }
    node_set_.resize(2 * nodes);
    chains_.resize(2 * nodes);
    owned_.resize(2 * nodes);
    valid_lo_.assign(2 * nodes, 0);
    valid_hi_.assign(2 * nodes, 0);
    computed_.assign(2 * nodes, 0);
    empty_ = make_set();
    unit_ = make_set();
    sets_[unit_].push_back({});
  }

  /// Limits for the next passes: points with more stored bytes than `k_max`, or at least
  /// `t_stop` extra time, are left out of every set (a plan only adds to both).
  void set_limits(cost_t k_max, double t_stop) noexcept {
    k_max_ = k_max;
    t_stop_ = t_stop;
  }

  /// Whether some set was thinned since construction.
  [[nodiscard]] bool thinned() const noexcept { return thinned_; }

  /// Candidate points merged into sets since construction: the search's work, a measure of its
  /// time that does not depend on the machine.
  [[nodiscard]] std::uint64_t work() const noexcept { return work_; }

  /// Evaluates every node at bound M, bottom-up; returns the root's (open) set. A node's set
  /// depends on M only through which candidate segments inside it fit (runs of a series,
  /// a complicate region as one segment): a set made at an earlier bound is reused while M stays
  /// between the largest candidate that fitted and the smallest that did not (and the limits are
  /// unchanged), so a pass recomputes only the nodes whose segments M crossed, and their
  /// ancestors. The sets are the same as a pass from scratch would make.
  const std::vector<pareto_point>& pass(cost_t bound) {
    if (k_max_ != memo_k_max_ || t_stop_ != memo_t_stop_) {  // sets made under other limits
      std::fill(computed_.begin(), computed_.end(), char{0});
      memo_k_max_ = k_max_;
      memo_t_stop_ = t_stop_;
    }
    for (std::size_t k = t_.nodes.size(); k-- > 0;) {
      const tree_node& nd = t_.nodes[k];
      // What the children's sets allow (both modes: series and complicate nodes read both).
      cost_t lo = 0, hi = std::numeric_limits<cost_t>::max();
      for (std::size_t c = 0; c < nd.child_count; ++c) {
        const std::size_t ch = t_.children[nd.first_child + c];
        for (std::size_t q = 2 * ch; q < 2 * ch + 2; ++q) {
          lo = std::max(lo, valid_lo_[q]);
          hi = std::min(hi, valid_hi_[q]);
        }
      }
      for (int m = 0; m < 2; ++m) {
        const std::size_t km = 2 * k + static_cast<std::size_t>(m);
        if (computed_[km] != 0 && valid_lo_[km] <= bound && bound < valid_hi_[km]) continue;
        for (const std::size_t id : owned_[km])
          free_.push_back(id);
        owned_[km].clear();
        owner_ = km;
        fit_lo_ = lo;
        fit_hi_ = hi;
        switch (nd.kind) {
          case node_kind::leaf:
            node_set_[2 * k + m] = unit_;
            break;
          case node_kind::parallel:
            parallel(k, m);
            break;
          case node_kind::series:
            series(k, m, bound);
            break;
          case node_kind::complicate:
            complicate(k, m, bound);
            break;
        }
        owner_ = npos;
        valid_lo_[km] = fit_lo_;
        valid_hi_[km] = fit_hi_;
        computed_[km] = 1;
      }
    }
    return sets_[node_set_[0]];
  }

  /// The stored vertices of the root's point `index` after the last pass: everything else inside
  /// is dropped.
  void emit(std::size_t index, std::vector<vertex_index>& keep,
            std::vector<compression>& packed) const {
    struct item {
      std::size_t node;
      int mode;
      std::size_t index;
    };
    std::vector<item> stack{{0, 0, index}};
    std::vector<std::size_t> picks;
    while (!stack.empty()) {
      const item it = stack.back();
      stack.pop_back();
      const tree_node& nd = t_.nodes[it.node];
      const auto& chains = chains_[2 * it.node + it.mode];
      switch (nd.kind) {
        case node_kind::leaf:
          break;
        case node_kind::parallel: {
          unfold(chains[0], child_sets(nd, it.mode), it.index, picks);
          for (std::size_t c = 0; c < nd.child_count; ++c)
            stack.push_back({t_.children[nd.first_child + c], it.mode, picks[c]});
          break;
        }
        case node_kind::series: {
          const auto& ax = chains[0];
          std::size_t j = nd.child_count;
          std::size_t p = it.index;  // in IN[j]
          while (j > 0) {
            const pareto_point& pt = sets_[ax[3 * j + 2]][p];
            std::size_t i = j - 1;
            std::size_t from = pt.x;  // in G[i][E] or G[i][C]
            bool exact = true;
            if (pt.tag == tag_run) {
              i = pt.y;
            } else {
              exact = pt.tag == tag_from_exact;
              stack.push_back({t_.children[nd.first_child + j - 1], exact ? 0 : 1, pt.y});
            }
            if (i > 0) {
              const pareto_point& own = sets_[ax[3 * i + (exact ? 0 : 1)]][from];
              const vertex_index v = t_.own[nd.first_own + i - 1];
              if (exact)
                keep.push_back(v);
              else
                packed.push_back({v, opts_[v][own.y].index});
              from = own.x;  // in IN[i]
            }
            p = from;
            j = i;
          }
          break;
        }
        case node_kind::complicate: {
          const pareto_point& top = sets_[node_set_[2 * it.node + it.mode]][it.index];
          if (top.tag == tag_whole) break;  // everything inside dropped
          const auto& grp = groups_[it.node];
          std::vector<std::size_t> group_sets{chains[0].back()};
          for (std::size_t i = 0; i < nd.own_count; ++i)
            group_sets.push_back(chains[1 + 3 * i + 2][0]);
          std::vector<std::size_t> group_picks;
          unfold(chains.back(), group_sets, top.x, group_picks);
          unfold(chains[0], sets_of(grp[0], it.mode), group_picks[0], picks);
          for (std::size_t c = 0; c < grp[0].size(); ++c)
            stack.push_back({grp[0][c], it.mode, picks[c]});
          for (std::size_t i = 0; i < nd.own_count; ++i) {
            const vertex_index v = t_.own[nd.first_own + i];
            const pareto_point& ch = sets_[group_sets[i + 1]][group_picks[i + 1]];
            const int mode = ch.tag == tag_keep ? 0 : 1;
            if (mode == 0)
              keep.push_back(v);
            else
              packed.push_back({v, opts_[v][ch.y].index});
            unfold(chains[1 + 3 * i + mode], sets_of(grp[i + 1], mode), ch.x, picks);
            for (std::size_t c = 0; c < grp[i + 1].size(); ++c)
              stack.push_back({grp[i + 1][c], mode, picks[c]});
          }
          break;
        }
      }
    }
  }

 private:
  struct option_cost {
    cost_t bytes;
    double time;
    std::size_t index;  // into graph::storage(v)
  };
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();
  static constexpr std::uint8_t tag_from_exact = 0, tag_from_packed = 1, tag_run = 2, tag_keep = 3,
                                tag_pack = 4, tag_whole = 5, tag_stored = 6;

  /// A new empty set, owned by the node being computed (freed when it is computed again).
  std::size_t make_set() {
    std::size_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      sets_[id].clear();
    } else {
      id = sets_.size();
      sets_.emplace_back();
    }
    if (owner_ != npos) owned_[owner_].push_back(id);
    return id;
  }

  /// Merges a Pareto sequence (bytes up, time down: `make(0)`, ..., `make(count - 1)`) into the
  /// set under construction, `acc_`, keeping it a Pareto set (for equal bytes and time, the
  /// smallest segment). Linear in both sizes: every source of candidates here is a Pareto set
  /// shifted by a constant, so no sort is needed.
  template <class F>
  void absorb(std::size_t count, F&& make) {
    // Written through a pointer into a buffer sized for every candidate: push_back took a fifth
    // of DenseNet-121's frontier search in a profile.
    work_ += acc_.size() + count;
    if (merged_.size() < acc_.size() + count) merged_.resize(acc_.size() + count);
    pareto_point* out = merged_.data();
    std::size_t n = 0;
    auto less = [](const pareto_point& a, const pareto_point& b) {
      if (a.k != b.k) return a.k < b.k;
      if (a.t != b.t) return a.t < b.t;
      return a.a < b.a;
    };
    auto push = [&](const pareto_point& p) {
      if (p.k > k_max_ || !(p.t < t_stop_)) return;
      if (n == 0 || p.t < out[n - 1].t) out[n++] = p;
    };
    std::size_t i = 0, j = 0;
    pareto_point b{};
    bool have_b = false;
    while (i < acc_.size() || j < count) {
      if (!have_b && j < count) {
        b = make(j);
        have_b = true;
      }
      if (have_b && (i == acc_.size() || less(b, acc_[i]))) {
        push(b);
        ++j;
        have_b = false;
      } else {
        push(acc_[i++]);
      }
    }
    merged_.resize(n);
    std::swap(acc_, merged_);
  }

  /// Stores `acc_` as a new set (thinned to `cap_` points if larger) and empties it.
  std::size_t finish_set() {
    const std::size_t id = make_set();
    auto& out = sets_[id];
    out.assign(acc_.begin(), acc_.end());  // a copy: acc_ keeps its capacity
    acc_.clear();
    if (out.size() > cap_) {
      // Buckets of equal width in bytes; the last point of each (the fastest in it) stays, so a
      // dropped point has a kept one at most one width larger and no slower.
      thinned_ = true;
      const double width =
          static_cast<double>(out.back().k - out.front().k) / static_cast<double>(cap_ - 1);
      auto bucket = [&](std::size_t q) {
        return static_cast<std::size_t>(static_cast<double>(out[q].k - out.front().k) / width);
      };
      std::size_t n = 0;
      for (std::size_t q = 0; q < out.size(); ++q)
        if (q == 0 || q + 1 == out.size() || bucket(q + 1) != bucket(q)) out[n++] = out[q];
      out.resize(n);
    }
    return id;
  }

  /// Adds A + B (pairwise) to the set under construction, x and y naming the points, with `tag`:
  /// one shifted copy of the larger set per point of the smaller.
  void add_sum(std::size_t a, std::size_t b, std::uint8_t tag) {
    const auto& sa = sets_[a];
    const auto& sb = sets_[b];
    auto sum = [&](std::size_t i, std::size_t j) {
      return pareto_point{sa[i].k + sb[j].k,
                          sa[i].t + sb[j].t,
                          std::max(sa[i].a, sb[j].a),
                          static_cast<std::uint32_t>(i),
                          static_cast<std::uint32_t>(j),
                          tag};
    };
    if (sb.size() <= sa.size()) {
      for (std::size_t j = 0; j < sb.size(); ++j)
        absorb(sa.size(), [&](std::size_t i) { return sum(i, j); });
    } else {
      for (std::size_t i = 0; i < sa.size(); ++i)
        absorb(sb.size(), [&](std::size_t j) { return sum(i, j); });
    }
  }

  /// Folds sets by Minkowski sums: chain[0] = ids[0], chain[c] = chain[c-1] + ids[c] (x: point
  /// of chain[c-1], y: point of ids[c]); an empty list gives {unit}.
  void fold(const std::vector<std::size_t>& ids, std::vector<std::size_t>& chain) {
    chain.clear();
    if (ids.empty()) {
      chain.push_back(unit_);
      return;
    }
    chain.push_back(ids[0]);
    for (std::size_t c = 1; c < ids.size(); ++c) {
      if (sets_[ids[c]].size() == 1 && sets_[ids[c]][0].k == 0 && sets_[ids[c]][0].t == 0.0 &&
          sets_[ids[c]][0].a == 0) {
        // Adding the unit point changes nothing but the back-pointers.
        const auto& from = sets_[chain.back()];
        absorb(from.size(), [&](std::size_t i) {
          pareto_point p = from[i];
          p.x = static_cast<std::uint32_t>(i);
          p.y = 0;
          return p;
        });
      } else {
        add_sum(chain.back(), ids[c], 0);
      }
      chain.push_back(finish_set());
    }
  }

  /// The point of each operand that the point `index` of the fold's last set was made from.
  void unfold(const std::vector<std::size_t>& chain, const std::vector<std::size_t>& ids,
              std::size_t index, std::vector<std::size_t>& picks) const {
    picks.assign(ids.size(), 0);
    if (ids.empty()) return;
    for (std::size_t c = ids.size(); c-- > 1;) {
      const pareto_point& p = sets_[chain[c]][index];
      picks[c] = p.y;
      index = p.x;
    }
    picks[0] = index;
  }

  [[nodiscard]] std::vector<std::size_t> child_sets(const tree_node& nd, int mode) const {
    std::vector<std::size_t> ids;
    for (std::size_t c = 0; c < nd.child_count; ++c)
      ids.push_back(node_set_[2 * t_.children[nd.first_child + c] + mode]);
    return ids;
  }
  [[nodiscard]] std::vector<std::size_t> sets_of(const std::vector<std::size_t>& nodes,
                                                 int mode) const {
    std::vector<std::size_t> ids;
    for (std::size_t ch : nodes)
      ids.push_back(node_set_[2 * ch + mode]);
    return ids;
  }

  void parallel(std::size_t k, int m) {
    auto& chains = chains_[2 * k + m];
    chains.resize(1);
    fold(child_sets(t_.nodes[k], m), chains[0]);
    node_set_[2 * k + m] = chains[0].back();
  }

  /// Adds every point of `from` stored with vertex v's own choice: kept (tag_keep) or each option
  /// (tag_pack, y = the option).
  void add_own(std::size_t from, vertex_index v, bool packed) {
    const auto& s = sets_[from];
    if (!packed) {
      absorb(s.size(), [&](std::size_t i) {
        return pareto_point{s[i].k + d_.cost[v],           s[i].t, s[i].a,
                            static_cast<std::uint32_t>(i), 0,      tag_keep};
      });
      return;
    }
    for (std::size_t o = 0; o < opts_[v].size(); ++o)
      absorb(s.size(), [&](std::size_t i) {
        return pareto_point{s[i].k + opts_[v][o].bytes,    s[i].t + opts_[v][o].time,     s[i].a,
                            static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(o), tag_pack};
      });
  }

  void series(std::size_t k, int m, cost_t bound) {
    const tree_node& nd = t_.nodes[k];
    const std::size_t last = nd.child_count;
    const cost_t* prefix = t_.prefix.data() + nd.first_prefix;
    const double* tprefix = tprefix_.data() + tprefix_at_[k];
    auto& chains = chains_[2 * k + m];
    chains.resize(1);
    auto& ax = chains[0];  // [3 j]: G[j][E], [3 j + 1]: G[j][C], [3 j + 2]: IN[j]
    ax.assign(3 * (last + 1), empty_);
    ax[m == 0 ? 0 : 1] = unit_;
    auto chain_vertex = [&](std::size_t j) { return t_.own[nd.first_own + j - 1]; };
    window_clear();
    for (std::size_t j = 1; j <= last; ++j) {
      const std::size_t piece = t_.children[nd.first_child + j - 1];
      add_sum(ax[3 * (j - 1)], node_set_[2 * piece], tag_from_exact);
      add_sum(ax[3 * (j - 1) + 1], node_set_[2 * piece + 1], tag_from_packed);
      const cost_t cj = j == last ? 0 : d_.cost[chain_vertex(j)];
      const double tj = j == last ? 0.0 : time_[chain_vertex(j)];
      // Runs of pieces i..j-1 (i <= j - 2) whose inner cost fits: a window of i that only moves
      // right as j grows (a run's cost grows with j). Their points, with the time normalised by
      // the run's start (t - tprefix[i]), are kept as one Pareto union by a two-stack queue.
      if (j >= 2) window_push(j - 2, sets_[ax[3 * (j - 2)]], tprefix[j - 2]);
      const cost_t need = prefix[j] - cj - bound;  // a run from i fits iff prefix[i] >= need
      while (window_size() > 0 && prefix[window_front()] < need)
        window_pop();
      // The runs that fit start at f..j-2 (the costliest from f), those that do not before f
      // (the cheapest from f - 1): the pass's result holds for bounds between the two costs.
      const std::size_t f = window_size() > 0 ? window_front() : j - 1;
      if (window_size() > 0) fit_lo_ = std::max(fit_lo_, prefix[j] - cj - prefix[f]);
      if (f >= 1 && j >= 2) fit_hi_ = std::min(fit_hi_, prefix[j] - cj - prefix[f - 1]);
      if (window_size() > 0) {
        const auto& runs = window_union();
        const double shift = tprefix[j] - tj;
        absorb(runs.size(), [&](std::size_t q) {
          const pareto_point& r = runs[q];
          return pareto_point{r.k, r.t + shift, std::max(r.a, prefix[j] - prefix[r.y] - cj),
                              r.x, r.y,         tag_run};
        });
      }
      const std::size_t in = finish_set();
      ax[3 * j + 2] = in;
      if (j == last) break;
      const vertex_index v = chain_vertex(j);
      add_own(in, v, false);
      ax[3 * j] = finish_set();
      if (!opts_[v].empty()) {
        add_own(in, v, true);
        ax[3 * j + 1] = finish_set();
      }
    }
    node_set_[2 * k + m] = ax[3 * last + 2];
  }

  /// out = the Pareto union of a and b (both Pareto: bytes up, time strictly down).
  static void pareto_union(const std::vector<pareto_point>& a, const std::vector<pareto_point>& b,
                           std::vector<pareto_point>& out) {
    out.clear();
    std::size_t i = 0, j = 0;
    while (i < a.size() || j < b.size()) {
      const bool take_b = i == a.size() || (j < b.size() && (b[j].k != a[i].k   ? b[j].k < a[i].k
                                                             : b[j].t != a[i].t ? b[j].t < a[i].t
                                                                                : b[j].a < a[i].a));
      const pareto_point& p = take_b ? b[j++] : a[i++];
      if (out.empty() || p.t < out.back().t) out.push_back(p);
    }
  }

  // The run window of `series`: a queue of run starts i, each with its points (x: the point in
  // G[i][E], y: i, t: normalised); the back stack keeps one union, the front stack a union per
  // element of it and everything above (towards the back), so the union of the whole queue is
  // two sets merged, and each element is merged O(1) times (amortised).
  void window_clear() {
    win_front_.clear();
    win_back_.clear();
    win_back_union_.clear();
  }
  [[nodiscard]] std::size_t window_size() const noexcept {
    return win_front_.size() + win_back_.size();
  }
  [[nodiscard]] std::size_t window_front() const noexcept {
    return win_front_.empty() ? win_back_.front() : win_front_.back().first;
  }
  void window_push(std::size_t i, const std::vector<pareto_point>& set, double tprefix_i) {
    win_points_.resize(std::max(win_points_.size(), i + 1));
    auto& pts = win_points_[i];
    pts.clear();
    for (std::size_t p = 0; p < set.size(); ++p)
      pts.push_back({set[p].k, set[p].t - tprefix_i, set[p].a, static_cast<std::uint32_t>(p),
                     static_cast<std::uint32_t>(i), tag_run});
    win_back_.push_back(i);
    pareto_union(win_back_union_, pts, win_tmp_);
    std::swap(win_back_union_, win_tmp_);
  }
  void window_pop() {
    if (win_front_.empty()) {
      // Move the back stack over: the newest first, so the oldest ends on top.
      for (std::size_t q = win_back_.size(); q-- > 0;) {
        std::vector<pareto_point> merged;
        if (win_front_.empty())
          merged = win_points_[win_back_[q]];
        else
          pareto_union(win_front_.back().second, win_points_[win_back_[q]], merged);
        win_front_.emplace_back(win_back_[q], std::move(merged));
      }
      win_back_.clear();
      win_back_union_.clear();
    }
    win_front_.pop_back();
  }
  const std::vector<pareto_point>& window_union() {
    if (win_front_.empty()) return win_back_union_;
    if (win_back_.empty()) return win_front_.back().second;
    pareto_union(win_front_.back().second, win_back_union_, win_tmp_);
    return win_tmp_;
  }

  void complicate(std::size_t k, int m, cost_t bound) {
    const tree_node& nd = t_.nodes[k];
    const auto& grp = groups_[k];
    auto& chains = chains_[2 * k + m];
    chains.resize(1 + 3 * nd.own_count + 1);
    fold(sets_of(grp[0], m), chains[0]);
    std::vector<std::size_t> group_sets{chains[0].back()};
    for (std::size_t i = 0; i < nd.own_count; ++i) {
      const vertex_index v = t_.own[nd.first_own + i];
      auto& open = chains[1 + 3 * i];
      auto& closed = chains[1 + 3 * i + 1];
      fold(sets_of(grp[i + 1], 0), open);
      closed.clear();
      if (!opts_[v].empty()) fold(sets_of(grp[i + 1], 1), closed);
      add_own(open.back(), v, false);
      if (!opts_[v].empty()) add_own(closed.back(), v, true);
      chains[1 + 3 * i + 2].assign(1, finish_set());
      group_sets.push_back(chains[1 + 3 * i + 2][0]);
    }
    fold(group_sets, chains.back());
    const auto& stored = sets_[chains.back().back()];
    absorb(stored.size(), [&](std::size_t i) {
      return pareto_point{stored[i].k, stored[i].t, stored[i].a, static_cast<std::uint32_t>(i),
                          0,           tag_stored};
    });
    if (m == 0) {
      if (nd.cost <= bound) {
        fit_lo_ = std::max(fit_lo_, nd.cost);
        absorb(1, [&](std::size_t) {
          return pareto_point{0, node_time_[k], nd.cost, 0, 0, tag_whole};
        });
      } else {
        fit_hi_ = std::min(fit_hi_, nd.cost);
      }
    }
    node_set_[2 * k + m] = finish_set();
  }

  const dag& d_;
  const division_tree& t_;
  std::size_t cap_;
  bool thinned_ = false;
  std::uint64_t work_ = 0;
  cost_t k_max_ = std::numeric_limits<cost_t>::max();
  double t_stop_ = std::numeric_limits<double>::infinity();
  std::vector<double> time_;
  std::vector<std::vector<option_cost>> opts_;
  std::vector<double> node_time_;
  std::vector<std::size_t> tprefix_at_;
  std::vector<double> tprefix_;
  std::vector<std::vector<std::vector<std::size_t>>> groups_;  // complicate: children by entry
  std::deque<std::vector<pareto_point>> sets_;                 // stable references while it grows
  std::vector<std::size_t> free_;                              // ids of sets no node owns
  std::size_t empty_ = 0, unit_ = 0;
  // Reuse across passes: the sets each (node, mode) made, the bounds [lo, hi) they hold for,
  // whether they exist, and the limits they were made under.
  std::vector<std::vector<std::size_t>> owned_;
  std::vector<cost_t> valid_lo_, valid_hi_;
  std::vector<char> computed_;
  cost_t memo_k_max_ = std::numeric_limits<cost_t>::max();
  double memo_t_stop_ = std::numeric_limits<double>::infinity();
  std::size_t owner_ = npos;  // the (node, mode) being computed
  cost_t fit_lo_ = 0, fit_hi_ = 0;
  std::vector<std::vector<pareto_point>> win_points_;  // per run start i of the current series
  std::vector<std::pair<std::size_t, std::vector<pareto_point>>> win_front_;
  std::vector<std::size_t> win_back_;
  std::vector<pareto_point> win_back_union_, win_tmp_;
  std::vector<pareto_point> acc_, merged_;  // the set under construction; absorb's buffer
  std::vector<std::size_t> node_set_;       // [2 k + mode]
  std::vector<std::vector<std::vector<std::size_t>>> chains_;  // [2 k + mode]
};

/// A plan found by the search: its memory and time, and where to find it again.
struct budget_hit {
  cost_t memory = 0;
  double time = 0.0;
  cost_t bound = 0;
  std::size_t index = 0;
  cost_t k_max = 0;  // the limits of its pass
  double t_stop = 0.0;
};

/**
 * Searches the segment bound M. A pass at M gives the root's Pareto points p = (K, T, a): plans of
 * memory K + a and time T. A plan c feasible at a smaller bound is also feasible at M, so some p
 * has K <= K_c and T <= T_c; c is only worth finding if a_c < a_p (else p beats it) and, for the
 * frontier, K_c + a_c below the least memory m* already found at time <= T_p (for a budget B:
 * K_c + a_c <= B, and only if p itself is over B and faster than the best plan found). So the
 * next bound is the largest a_c any p allows, and the search stops when none does: the frontier
 * of the points found is the exact frontier (for a budget, the least time).
 */
class budget_search {
 public:
  budget_search(const graph& g, const dag& d, const division_tree& tree,
                const budget_options& options, bool memory_only = false)
      : opt_(g, d, tree, options, memory_only), ratio_(options.bound_ratio) {}

  /// budget < 0: the whole frontier; else the fastest plan within `budget` (if any). A search
  /// whose `work()` passes `max_work` after a pass stops there and returns nothing (`aborted()`).
  std::vector<budget_hit> run(cost_t budget,
                              std::uint64_t max_work = std::numeric_limits<std::uint64_t>::max()) {
    const bool frontier_mode = budget < 0;
    std::vector<budget_hit> front;  // memory up, time strictly down
    budget_hit best{};
    bool have_best = false;
    std::vector<budget_hit> fresh;
    for (cost_t bound = frontier_mode ? std::numeric_limits<cost_t>::max() : budget; bound >= 0;) {
      // For a budget, a point over it in stored bytes, or no faster than the best plan found,
      // leads nowhere (bytes and time only grow towards the root).
      const cost_t k_max = frontier_mode ? std::numeric_limits<cost_t>::max() : budget;
      const double t_stop = have_best ? best.time : std::numeric_limits<double>::infinity();
      opt_.set_limits(k_max, t_stop);
      const auto& root = opt_.pass(bound);
      ++passes_;
      if (opt_.work() > max_work) {
        aborted_ = true;
        return {};
      }
      fresh.clear();
      for (std::size_t i = 0; i < root.size(); ++i) {
        const budget_hit h{root[i].k + root[i].a, root[i].t, bound, i, k_max, t_stop};
        if (frontier_mode) {
          fresh.push_back(h);
        } else if (h.memory <= budget && (!have_best || h.time < best.time ||
                                          (h.time == best.time && h.memory < best.memory))) {
          best = h;
          have_best = true;
        }
      }
      if (frontier_mode) merge(front, fresh);
      cost_t next = -1;
      for (const pareto_point& p : root) {
        if (p.a == 0) continue;
        cost_t limit = p.a - 1;
        if (frontier_mode) {
          // The least memory found at a time <= T_p: the first point of the suffix with time <= T.
          const auto it = std::partition_point(front.begin(), front.end(),
                                               [&](const budget_hit& h) { return h.time > p.t; });
          if (it != front.end()) limit = std::min(limit, it->memory - p.k - 1);
        } else {
          if (p.k > budget || p.k + p.a <= budget) continue;
          if (have_best && p.t >= best.time) continue;
          limit = std::min(limit, budget - p.k);
        }
        next = std::max(next, limit);
      }
      if (ratio_ > 0.0 && bound != std::numeric_limits<cost_t>::max()) {
        // Skipping bounds the exact rule would try: the result may miss points (by <= r x a).
        const auto coarse = static_cast<cost_t>(static_cast<double>(bound) / (1.0 + ratio_));
        if (coarse < next) {
          next = coarse;
          coarse_ = true;
        }
      }
      bound = std::min(next, bound - 1);
    }
    if (frontier_mode) return front;
    if (have_best) return {best};
    return {};
  }

  [[nodiscard]] std::size_t passes() const noexcept { return passes_; }
  /// Whether `run` stopped at its `max_work`.
  [[nodiscard]] bool aborted() const noexcept { return aborted_; }
  /// Whether the result may not be exact: a set was thinned or a bound skipped by the ratio.
  [[nodiscard]] bool thinned() const noexcept { return opt_.thinned() || coarse_; }

  /// The plan of a hit: the pass is run again at its bound (deterministic), then read back.
  plan make_plan(const graph& g, const dag& d, const budget_hit& h) {
    opt_.set_limits(h.k_max, h.t_stop);
    (void)opt_.pass(h.bound);
    std::vector<vertex_index> keep;
    std::vector<compression> packed;
    opt_.emit(h.index, keep, packed);
    plan p = evaluate_sets(g, d, keep, packed);
    DROPIT_EXPECTS(p.cost == h.memory, "checkpoint: internal error: plan costs ", p.cost,
                   ", expected ", h.memory);
    DROPIT_EXPECTS(std::abs(p.extra_time - h.time) <= 1e-9 * std::max(1.0, std::abs(h.time)),
                   "checkpoint: internal error: plan takes ", p.extra_time, ", expected ", h.time);
    return p;
  }

 private:
  static void merge(std::vector<budget_hit>& front, const std::vector<budget_hit>& fresh) {
    std::vector<budget_hit> all(front);
    all.insert(all.end(), fresh.begin(), fresh.end());
    std::sort(all.begin(), all.end(), [](const budget_hit& a, const budget_hit& b) {
      if (a.memory != b.memory) return a.memory < b.memory;
      if (a.time != b.time) return a.time < b.time;
      return a.bound != b.bound ? a.bound > b.bound : a.index < b.index;  // the first found
    });
    front.clear();
    for (const budget_hit& h : all)
      if (front.empty() || h.time < front.back().time) front.push_back(h);
  }

  budget_optimizer opt_;
  double ratio_ = 0.0;
  bool coarse_ = false;
  bool aborted_ = false;
  std::size_t passes_ = 0;
};

}  // namespace detail

inline frontier solve_frontier(const graph& g, const budget_options& options) {
  const auto start = std::chrono::steady_clock::now();
  const detail::dag d = detail::make_dag(g);
  frontier f;
  if (d.n == 1) {
    f.points.push_back({0, 0.0});
  } else {
    const detail::division_tree tree = detail::tree_builder(d).build();
    detail::budget_search search(g, d, tree, options);
    for (const detail::budget_hit& h : search.run(-1))
      f.points.push_back({h.memory, h.time});
    f.exact = !search.thinned();
    f.search_passes = search.passes();
  }
  f.solve_seconds = detail::seconds_since(start);
  return f;
}

inline cost_t least_memory(const graph& g, const budget_options& options) {
  const detail::dag d = detail::make_dag(g);
  if (d.n == 1) return 0;
  const detail::division_tree tree = detail::tree_builder(d).build();
  detail::budget_search least(g, d, tree, options, true);
  return least.run(-1).front().memory;
}

inline plan solve_budget(const graph& g, cost_t budget, const budget_options& options) {
  const auto start = std::chrono::steady_clock::now();
  const detail::dag d = detail::make_dag(g);
  DROPIT_EXPECTS(budget >= 0, "checkpoint: solve_budget: negative budget ", budget);
  plan p;
  if (d.n == 1) {
    p = detail::finish_plan(g, d, {}, {});
  } else {
    const detail::division_tree tree = detail::tree_builder(d).build();
    detail::budget_search search(g, d, tree, options);
    const auto hits = search.run(budget);
    if (hits.empty()) {
      detail::budget_search least(g, d, tree, options, true);
      dropit::detail::throw_error("checkpoint: solve_budget: no plan fits in ", budget,
                                  "; the least memory is ", least.run(-1).front().memory,
                                  options.use_storage ? "" : " (storage options ignored)");
    }
    p = search.make_plan(g, d, hits.front());
    p.exact = !search.thinned();
    p.search_passes = search.passes();
  }
  p.solve_seconds = detail::seconds_since(start);
  return p;
}

}  // namespace dropit::checkpoint
