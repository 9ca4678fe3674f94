/**
 * @file graph.inl
 * @brief `dropit::checkpoint::graph`: construction, lookups and the validity checks.
 */
#pragma once

#include <dropit/error.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

namespace dropit::checkpoint {
namespace detail {

/// `"id"` with quotes, for messages.
[[nodiscard]] inline std::string quote_id(std::string_view id) {
  return dropit::detail::concat('"', id, '"');
}

}  // namespace detail

inline vertex_index graph::add_vertex(std::string id, cost_t cost) {
  DROPIT_EXPECTS(cost >= 0, "checkpoint: vertex ", detail::quote_id(id),
                 " has a negative cost: ", cost);
  DROPIT_EXPECTS(!index_.contains(id), "checkpoint: duplicate vertex id ", detail::quote_id(id));
  DROPIT_EXPECTS(cost <= std::numeric_limits<cost_t>::max() - total_,
                 "checkpoint: the total cost overflows 64 bits at vertex ", detail::quote_id(id));
  const vertex_index v = ids_.size();
  index_.emplace(id, v);
  ids_.push_back(std::move(id));
  costs_.push_back(cost);
  times_.push_back(std::numeric_limits<double>::quiet_NaN());
  workspaces_.push_back(0);
  unsaved_.emplace_back();
  passes_.emplace_back();
  frees_early_.push_back(0);
  storage_.emplace_back();
  total_ += cost;
  return v;
}

inline void graph::set_time(vertex_index v, double time) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  DROPIT_EXPECTS(std::isfinite(time) && time >= 0, "checkpoint: vertex ", detail::quote_id(ids_[v]),
                 " has a bad time: ", time);
  times_[v] = time;
}

inline void graph::set_workspace(vertex_index v, cost_t bytes) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  DROPIT_EXPECTS(bytes >= 0, "checkpoint: vertex ", detail::quote_id(ids_[v]),
                 " has a negative workspace: ", bytes);
  workspaces_[v] = bytes;
}

inline cost_t graph::workspace(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return workspaces_[v];
}

inline void graph::set_frees_gradient_early(vertex_index v, bool frees) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  frees_early_[v] = frees ? 1 : 0;
}

inline bool graph::frees_gradient_early(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return frees_early_[v] != 0;
}

inline void graph::set_unsaved(vertex_index v, std::vector<vertex_index> tensors) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  for (const vertex_index t : tensors) {
    DROPIT_EXPECTS(t < ids_.size(), "checkpoint: vertex ", detail::quote_id(ids_[v]),
                   ": unsaved tensor index ", t, " out of range");
    DROPIT_EXPECTS(t == v || has_edge(t, v), "checkpoint: vertex ", detail::quote_id(ids_[v]),
                   ": unsaved tensor ", detail::quote_id(ids_[t]),
                   " is neither the vertex nor one of its inputs");
  }
  std::sort(tensors.begin(), tensors.end());
  tensors.erase(std::unique(tensors.begin(), tensors.end()), tensors.end());
  unsaved_[v] = std::move(tensors);
}

inline void graph::set_passes_gradient(vertex_index v, std::vector<vertex_index> inputs) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  for (const vertex_index t : inputs) {
    DROPIT_EXPECTS(t < ids_.size(), "checkpoint: vertex ", detail::quote_id(ids_[v]), ": index ", t,
                   " of an input passed its gradient out of range");
    DROPIT_EXPECTS(has_edge(t, v), "checkpoint: vertex ", detail::quote_id(ids_[v]), ": vertex ",
                   detail::quote_id(ids_[t]),
                   " is not one of its inputs, so it cannot pass it its gradient");
  }
  std::sort(inputs.begin(), inputs.end());
  inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
  passes_[v] = std::move(inputs);
}

inline std::span<const vertex_index> graph::passed_gradients(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return passes_[v];
}

inline bool graph::passes_gradient(vertex_index op, vertex_index input) const {
  const std::span<const vertex_index> p = passed_gradients(op);
  return std::binary_search(p.begin(), p.end(), input);
}

inline std::span<const vertex_index> graph::unsaved(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return unsaved_[v];
}

inline bool graph::has_edge(vertex_index from, vertex_index to) const noexcept {
  return std::any_of(edges_.begin(), edges_.end(),
                     [&](const edge& e) { return e.from == from && e.to == to; });
}

inline bool graph::saves(vertex_index op, vertex_index tensor) const {
  DROPIT_EXPECTS(tensor < ids_.size(), "checkpoint: vertex index ", tensor, " out of range");
  const std::span<const vertex_index> u = unsaved(op);
  return !std::binary_search(u.begin(), u.end(), tensor);
}

inline void graph::add_storage(vertex_index v, storage_option option) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  const std::string& id = ids_[v];
  DROPIT_EXPECTS(!option.name.empty(), "checkpoint: vertex ", detail::quote_id(id),
                 ": a storage option needs a name");
  DROPIT_EXPECTS(option.bytes >= 0, "checkpoint: vertex ", detail::quote_id(id),
                 ": storage option ", detail::quote_id(option.name),
                 " has negative bytes: ", option.bytes);
  DROPIT_EXPECTS(std::isfinite(option.time) && option.time >= 0, "checkpoint: vertex ",
                 detail::quote_id(id), ": storage option ", detail::quote_id(option.name),
                 " has a bad time: ", option.time);
  for (const storage_option& o : storage_[v])
    DROPIT_EXPECTS(o.name != option.name, "checkpoint: vertex ", detail::quote_id(id),
                   ": duplicate storage option ", detail::quote_id(option.name));
  storage_[v].push_back(std::move(option));
}

inline double graph::time(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  if (!std::isnan(times_[v])) return times_[v];
  // The input edges' compute, a repeated edge once at its largest cost.
  std::vector<std::pair<vertex_index, double>> in;
  for (const edge& e : edges_)
    if (e.to == v) in.emplace_back(e.from, e.compute);
  std::sort(in.begin(), in.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  });
  double sum = 0.0;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (i == 0 || in[i].first != in[i - 1].first) sum += in[i].second;
  return sum;
}

inline bool graph::has_time(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return !std::isnan(times_[v]);
}

inline std::span<const storage_option> graph::storage(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return storage_[v];
}

inline void graph::add_edge(vertex_index from, vertex_index to, double compute) {
  DROPIT_EXPECTS(from < ids_.size() && to < ids_.size(), "checkpoint: edge (", from, " -> ", to,
                 ") names a vertex index out of range (", ids_.size(), " vertices)");
  DROPIT_EXPECTS(std::isfinite(compute) && compute >= 0, "checkpoint: edge (",
                 detail::quote_id(ids_[from]), " -> ", detail::quote_id(ids_[to]),
                 ") has a bad compute cost: ", compute);
  edges_.push_back(edge{from, to, compute});
}

inline void graph::add_edge(std::string_view from, std::string_view to, double compute) {
  const auto f = find(from);
  const auto t = find(to);
  DROPIT_EXPECTS(f.has_value(), "checkpoint: edge (", detail::quote_id(from), " -> ",
                 detail::quote_id(to), ") names an unknown vertex ", detail::quote_id(from));
  DROPIT_EXPECTS(t.has_value(), "checkpoint: edge (", detail::quote_id(from), " -> ",
                 detail::quote_id(to), ") names an unknown vertex ", detail::quote_id(to));
  add_edge(*f, *t, compute);
}

inline void graph::set_source(vertex_index v) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: source index ", v, " out of range");
  source_ = v;
}

inline void graph::set_source(std::string_view id) {
  const auto v = find(id);
  DROPIT_EXPECTS(v.has_value(), "checkpoint: unknown source vertex ", detail::quote_id(id));
  source_ = *v;
}

inline void graph::set_target(vertex_index v) {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: target index ", v, " out of range");
  target_ = v;
}

inline void graph::set_target(std::string_view id) {
  const auto v = find(id);
  DROPIT_EXPECTS(v.has_value(), "checkpoint: unknown target vertex ", detail::quote_id(id));
  target_ = *v;
}

inline const std::string& graph::id(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return ids_[v];
}

inline cost_t graph::cost(vertex_index v) const {
  DROPIT_EXPECTS(v < ids_.size(), "checkpoint: vertex index ", v, " out of range");
  return costs_[v];
}

inline std::optional<vertex_index> graph::find(std::string_view id) const {
  const auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

inline vertex_index graph::source() const {
  DROPIT_EXPECTS(source_.has_value(), "checkpoint: the graph has no source (set_source)");
  return *source_;
}

inline vertex_index graph::target() const {
  DROPIT_EXPECTS(target_.has_value(), "checkpoint: the graph has no target (set_target)");
  return *target_;
}

inline std::vector<vertex_index> graph::topological_order() const {
  using detail::quote_id;
  const vertex_index s = source();
  const vertex_index t = target();
  const std::size_t n = ids_.size();
  if (s == t) {
    DROPIT_EXPECTS(n == 1 && edges_.empty(), "checkpoint: source and target are the same vertex ",
                   quote_id(ids_[s]), " but the graph has ", n, " vertices and ", edges_.size(),
                   " edges");
    return {s};
  }
  std::vector<std::vector<vertex_index>> succ(n), pred(n);
  for (const edge& e : edges_) {
    succ[e.from].push_back(e.to);
    pred[e.to].push_back(e.from);
  }
  // Kahn's algorithm, smallest index first among the ready vertices: the order follows the
  // insertion order wherever the edges allow, so plans read in the order the graph was built.
  std::vector<std::size_t> indeg(n);
  for (vertex_index v = 0; v < n; ++v)
    indeg[v] = pred[v].size();
  std::vector<vertex_index> order;
  order.reserve(n);
  std::priority_queue<vertex_index, std::vector<vertex_index>, std::greater<>> ready;
  for (vertex_index v = 0; v < n; ++v)
    if (indeg[v] == 0) ready.push(v);
  while (!ready.empty()) {
    const vertex_index v = ready.top();
    ready.pop();
    order.push_back(v);
    for (vertex_index w : succ[v])
      if (--indeg[w] == 0) ready.push(w);
  }
  if (order.size() != n) {
    // Every vertex left over has a predecessor left over: walking back n steps lands on a cycle.
    vertex_index v = 0;
    while (indeg[v] == 0)
      ++v;
    for (std::size_t step = 0; step < n; ++step) {
      for (vertex_index p : pred[v])
        if (indeg[p] != 0) {
          v = p;
          break;
        }
    }
    std::vector<vertex_index> cycle{v};
    for (vertex_index u = v;;) {
      for (vertex_index p : pred[u])
        if (indeg[p] != 0) {
          u = p;
          break;
        }
      if (u == v) break;
      cycle.push_back(u);
    }
    std::string path = quote_id(ids_[v]);
    for (auto it = cycle.rbegin(); it != cycle.rend(); ++it)
      path += " -> " + quote_id(ids_[*it]);
    dropit::detail::throw_error("checkpoint: the graph has a cycle through vertex ",
                                quote_id(ids_[v]), ": ", path);
  }
  // Reachability from the source and to the target.
  auto sweep = [&](vertex_index from, const std::vector<std::vector<vertex_index>>& adj) {
    std::vector<char> seen(n, 0);
    std::vector<vertex_index> stack{from};
    seen[from] = 1;
    while (!stack.empty()) {
      const vertex_index v = stack.back();
      stack.pop_back();
      for (vertex_index w : adj[v])
        if (!seen[w]) {
          seen[w] = 1;
          stack.push_back(w);
        }
    }
    return seen;
  };
  const auto from_source = sweep(s, succ);
  DROPIT_EXPECTS(from_source[t], "checkpoint: no path from source ", quote_id(ids_[s]),
                 " to target ", quote_id(ids_[t]));
  const auto to_target = sweep(t, pred);
  for (vertex_index v : order) {
    DROPIT_EXPECTS(from_source[v], "checkpoint: vertex ", quote_id(ids_[v]),
                   " is not reachable from source ", quote_id(ids_[s]));
    DROPIT_EXPECTS(to_target[v], "checkpoint: target ", quote_id(ids_[t]),
                   " is not reachable from vertex ", quote_id(ids_[v]));
  }
  return order;
}

}  // namespace dropit::checkpoint
