/**
 * @file groups.hpp
 * @brief The autograd nodes of a planned step: each stored vertex with the dropped vertices it
 * recomputes. One definition for the step model (`simulate_step`) and for the LibTorch executor
 * (`dropit::torch::checkpointed_graph`).
 */
#pragma once

#include <dropit/checkpoint.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace dropit::checkpoint::detail {

/// One autograd node of a planned forward: a stored vertex (its exit), the dropped vertices it
/// recomputes and the stored vertices (or the source) they read.
struct recompute_group {
  vertex_index exit = 0;
  std::vector<vertex_index> inside;   ///< recomputed vertices, in topological order
  std::vector<vertex_index> entries;  ///< stored vertices the group reads, in topological order
};

/**
 * @brief The groups of a plan, one per stored vertex other than the source, in topological order
 * of their exits (the order forward creates the nodes).
 *
 * A group holds the vertices its exit depends on without passing a stored vertex; a valid plan
 * puts each dropped vertex in the groups of the stored vertices that need it.
 * @param order  a topological order of the vertices
 * @param source the graph's input (stored, never an exit)
 * @param stored `stored[v] != 0` for every stored (kept or compressed) vertex
 * @param inputs `inputs(v)`: a range of v's distinct input vertices
 */
template <class Inputs>
[[nodiscard]] std::vector<recompute_group> recompute_groups(std::span<const vertex_index> order,
                                                            vertex_index source,
                                                            std::span<const char> stored,
                                                            const Inputs& inputs) {
  const std::size_t n = order.size();
  std::vector<std::size_t> pos(n);
  for (std::size_t i = 0; i < n; ++i)
    pos[order[i]] = i;
  const auto by_pos = [&](vertex_index a, vertex_index b) { return pos[a] < pos[b]; };
  std::vector<recompute_group> groups;
  std::vector<std::size_t> seen(n, 0);  // the number of the last group that reached the vertex
  std::vector<vertex_index> stack;
  for (vertex_index v : order) {
    if (v == source || !stored[v]) continue;
    recompute_group gr;
    gr.exit = v;
    const std::size_t mark = groups.size() + 1;
    stack.assign(1, v);
    while (!stack.empty()) {
      const vertex_index w = stack.back();
      stack.pop_back();
      for (vertex_index u : inputs(w)) {
        if (seen[u] == mark) continue;
        seen[u] = mark;
        (stored[u] ? gr.entries : gr.inside).push_back(u);
        if (!stored[u]) stack.push_back(u);
      }
    }
    std::sort(gr.inside.begin(), gr.inside.end(), by_pos);
    std::sort(gr.entries.begin(), gr.entries.end(), by_pos);
    groups.push_back(std::move(gr));
  }
  return groups;
}

}  // namespace dropit::checkpoint::detail
