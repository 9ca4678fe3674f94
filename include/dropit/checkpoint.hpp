/**
 * @file checkpoint.hpp
 * @brief Optimal gradient-checkpoint search on computation graphs (Feng & Huang, "Optimal Gradient
 * Checkpoint Search for Arbitrary Computation Graphs", CVPR'21). Pure C++, no engine needed.
 *
 * A graph's vertices are the tensors the forward pass stores, each with a memory cost; its edges
 * are the operations. A plan keeps a set of checkpoint vertices during forward; every other tensor
 * is dropped and recomputed in backward, one *segment* at a time. The paper's cost model, which
 * `solve` minimises exactly:
 *
 *     cost = sum of the checkpoints' costs (source and target not counted)
 *          + the largest segment cost (sum of the costs of the vertices inside the segment).
 *
 * A segment is a connected group of non-checkpoint vertices (edges taken in either direction) that
 * is *independent*: every edge into it comes from one vertex (its entry: a checkpoint or the
 * source) and every edge out of it goes to one vertex (its exit: a checkpoint or the target), so it
 * can be recomputed from one stored tensor. A checkpoint set that leaves a group with two entries
 * or two exits is not a plan. Everything lives in namespace `dropit::checkpoint`.
 *
 * The umbrella header of the `checkpoint` component (CMake target `dropit::checkpoint`, which
 * brings nlohmann::json for reading graphs); `<dropit/dropit.hpp>` does not include it.
 */
#pragma once

#include <dropit/error.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dropit::checkpoint {

/// Memory cost of a tensor: bytes, or any integer unit (element counts). Exact integer arithmetic.
using cost_t = std::int64_t;

/// A vertex's index in its graph: 0, 1, ... in the order of `graph::add_vertex`.
using vertex_index = std::size_t;

/** @brief One operation: `to` is computed (partly) from `from`. */
struct edge {
  vertex_index from;  ///< input tensor
  vertex_index to;    ///< output tensor
  double compute;  ///< the operation's compute cost (any unit, >= 0); only reported, not optimised
};

/**
 * @brief A computation graph: tensors (vertices, with a memory cost) and operations (edges), one
 * source (the input) and one target (the loss side).
 *
 * Vertices are named by a string id, unique in the graph. A graph is checked when it is solved (and
 * by `validate`): it must be acyclic, and every vertex must lie on a path from the source to the
 * target. Repeated edges are allowed and count once: in the plan's memory and in its `recompute`
 * (at the largest compute cost given for the edge).
 */
class graph {
 public:
  /**
   * @brief Adds a tensor.
   * @param id unique name, e.g. "layer1.0.conv1"
   * @param cost memory cost, >= 0
   * @return the new vertex's index
   * @throw dropit::error if the id is taken or the cost is negative (the message names the id)
   */
  vertex_index add_vertex(std::string id, cost_t cost);

  /**
   * @brief Adds an operation from vertex `from` to vertex `to`.
   * @param compute the operation's compute cost (>= 0), reported as `plan::recompute` (an edge
   * added again counts once, at the largest cost given)
   * @throw dropit::error if an index is out of range or `compute` is negative or not finite
   */
  void add_edge(vertex_index from, vertex_index to, double compute = 0.0);

  /**
   * @brief Adds an operation between two vertices named by id.
   * @throw dropit::error naming the id when an id is unknown
   */
  void add_edge(std::string_view from, std::string_view to, double compute = 0.0);

  /** @brief Sets the source (the input tensor). @throw dropit::error if out of range */
  void set_source(vertex_index v);
  /** @brief Sets the source by id. @throw dropit::error naming the id if it is unknown */
  void set_source(std::string_view id);
  /** @brief Sets the target (the loss-side tensor). @throw dropit::error if out of range */
  void set_target(vertex_index v);
  /** @brief Sets the target by id. @throw dropit::error naming the id if it is unknown */
  void set_target(std::string_view id);

  /** @brief Number of vertices. */
  [[nodiscard]] std::size_t vertex_count() const noexcept { return ids_.size(); }
  /** @brief Number of edges as added (repeats included). */
  [[nodiscard]] std::size_t edge_count() const noexcept { return edges_.size(); }
  /** @brief The edges as added. */
  [[nodiscard]] std::span<const edge> edges() const noexcept { return edges_; }
  /** @brief A vertex's id. @throw dropit::error if out of range */
  [[nodiscard]] const std::string& id(vertex_index v) const;
  /** @brief A vertex's memory cost. @throw dropit::error if out of range */
  [[nodiscard]] cost_t cost(vertex_index v) const;
  /** @brief The vertex with this id, if any. */
  [[nodiscard]] std::optional<vertex_index> find(std::string_view id) const;
  /** @brief The source. @throw dropit::error if none was set */
  [[nodiscard]] vertex_index source() const;
  /** @brief The target. @throw dropit::error if none was set */
  [[nodiscard]] vertex_index target() const;
  /** @brief Sum of all vertex costs: the memory of training without checkpoints. */
  [[nodiscard]] cost_t total_cost() const noexcept { return total_; }

  /**
   * @brief Checks that the graph can be planned: source and target set, no cycle, every vertex on
   * a path from the source to the target.
   * @return the vertices in a topological order (source first, target last)
   * @throw dropit::error whose message names the offending vertex (or the cycle)
   */
  [[nodiscard]] std::vector<vertex_index> topological_order() const;

  /** @brief `topological_order()` for its checks only. @throw dropit::error as it does */
  void validate() const { (void)topological_order(); }

 private:
  struct id_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::vector<std::string> ids_;
  std::vector<cost_t> costs_;
  std::vector<edge> edges_;
  std::unordered_map<std::string, vertex_index, id_hash, std::equal_to<>> index_;
  std::optional<vertex_index> source_, target_;
  cost_t total_ = 0;
};

/** @brief A group of vertices recomputed together in backward, from one entry to one exit. */
struct segment {
  vertex_index entry;                  ///< checkpoint (or the source) it is recomputed from
  vertex_index exit;                   ///< checkpoint (or the target) that consumes its outputs
  std::vector<vertex_index> vertices;  ///< the vertices inside, in topological order
  cost_t cost = 0;                     ///< sum of their costs
};

/** @brief A checkpoint plan and its cost in the paper's model. */
struct plan {
  std::vector<vertex_index>
      checkpoints;  ///< kept vertices, topological order, source/target excluded
  std::vector<segment>
      segments;                 ///< by the topological position of the entry, then of the vertices
  cost_t checkpoint_cost = 0;   ///< sum of the checkpoints' costs
  cost_t max_segment_cost = 0;  ///< the largest segment cost (0 if there is no segment)
  cost_t cost = 0;              ///< checkpoint_cost + max_segment_cost
  cost_t regular_cost = 0;      ///< sum of all vertex costs (training without checkpoints)
  double recompute = 0.0;       ///< compute cost of the edges into segment vertices (rerun once)
  double solve_seconds = 0.0;   ///< wall time of the call that made the plan
  /// Passes of the dynamic program over the division tree that the search over the segment bound
  /// made (solve, solve_linear; 0 for evaluate and graphs without inner vertices). Each costs
  /// O(vertices); on a chain of n unit costs the search makes O(sqrt(n)) of them.
  std::size_t search_passes = 0;
};

/**
 * @brief The optimal plan for an arbitrary DAG: minimal `plan::cost` over all checkpoint sets.
 *
 * The graph is split into a division tree (linear chains of pieces, parallel branches, and
 * "complicate" regions whose skeleton vertices must all be kept once any vertex inside is); for a
 * bound M on the segment cost, a bottom-up pass finds the cheapest checkpoint set whose segments
 * stay within M. The bounds tried are the achieved maxima, from the largest down, stopping when the
 * checkpoint cost alone reaches the best total. Time O(n + m) per bound on series-parallel graphs.
 * @throw dropit::error if the graph is not valid (see `graph::topological_order`)
 */
[[nodiscard]] plan solve(const graph& g);

/**
 * @brief The optimal plan for a linear chain (every vertex has at most one input and one output).
 * @throw dropit::error naming the first vertex with two inputs or outputs, or as `solve`
 */
[[nodiscard]] plan solve_linear(const graph& g);

/**
 * @brief The plan (segments and cost) that a given checkpoint set makes.
 * @param checkpoints vertices to keep; any order; not the source or target
 * @throw dropit::error if a checkpoint repeats or is the source/target, or if the set leaves a
 * group of vertices with two entries or two exits (the message names a vertex of the group)
 */
[[nodiscard]] plan evaluate(const graph& g, std::span<const vertex_index> checkpoints);

/**
 * @brief Reads a graph from JSON text:
 * `{"source": ID, "target": ID, "vertices": [{"id": ID, "cost": NUMBER}, ...],
 *   "edges": [{"u": ID, "v": ID, "compute": NUMBER (optional)}, ...]}`.
 *
 * IDs are integers or strings (an integer id is its decimal text, so 7 and "7" are the same
 * vertex); a cost is a finite non-negative number of bytes, rounded up to a whole byte (`0.5`
 * costs 1, `1e3` 1000; an integer literal is read exactly, one with a fraction or an exponent as
 * a double), at most 2^63 - 1 in total; other keys are ignored, except that an edge "cost" must
 * be 0 (memory belongs to vertices). The reader is nlohmann::json's strict parser (RFC 8259: no
 * NaN or Infinity, no comments, no trailing commas) plus duplicate keys and a depth limit of 512.
 * @param origin the name used in error messages, e.g. the file name
 * @return a validated graph
 * @throw dropit::error "origin:line:column: message" for a syntax error or a bad value (naming the
 * key, e.g. `vertices[3].cost`), or naming the vertex for an invalid graph
 */
[[nodiscard]] graph parse_graph_json(std::string_view text, std::string_view origin = "<json>");

/** @brief `parse_graph_json` on a file's contents. @throw dropit::error if it cannot be read */
[[nodiscard]] graph load_graph_json(const std::filesystem::path& path);

/**
 * @brief A plan as JSON: `checkpoints` and `segments` (`entry`, `exit`, `cost`, `vertices`) by
 * vertex id, `cost`, `checkpoint_cost`, `max_segment_cost`, `regular_cost`, `recompute`,
 * `solve_seconds`. Ids that are decimal integers are written as numbers.
 */
[[nodiscard]] std::string to_json(const graph& g, const plan& p);

/** @brief A graph as JSON in the format `parse_graph_json` reads (edges with their "compute"). */
[[nodiscard]] std::string to_json(const graph& g);

/**
 * @brief Graphs of well-known CNNs with one vertex per tensor their forward pass stores, as the
 * reference implementation's torch.jit parser records them: every module or aten op output (conv,
 * batch norm, pool, add, concat, flatten, dropout, linear), in-place ReLUs merged into the tensor
 * they overwrite. Shapes follow torchvision's layer arithmetic; no weights are involved.
 */
namespace models {

/** @brief An NCHW input shape. */
struct input_shape {
  std::int64_t batch = 1;     ///< N
  std::int64_t channels = 3;  ///< C
  std::int64_t height = 224;  ///< H
  std::int64_t width = 224;   ///< W
};

/** @brief AlexNet (torchvision). Vertex cost = elements x `bytes_per_element`. */
[[nodiscard]] graph alexnet(input_shape in, std::int64_t bytes_per_element = 4);
/** @brief VGG-11/13/16/19 without batch norm (torchvision). @throw dropit::error on another depth
 */
[[nodiscard]] graph vgg(int depth, input_shape in, std::int64_t bytes_per_element = 4);
/** @brief ResNet-18/34/50/101/152 (torchvision, v1.5 bottleneck). @throw dropit::error otherwise */
[[nodiscard]] graph resnet(int depth, input_shape in, std::int64_t bytes_per_element = 4);
/** @brief DenseNet-121/161/169/201 (the reference's DenseNet-BC). @throw dropit::error otherwise */
[[nodiscard]] graph densenet(int depth, input_shape in, std::int64_t bytes_per_element = 4);
/** @brief Inception v3 without auxiliary logits (torchvision). */
[[nodiscard]] graph inception_v3(input_shape in, std::int64_t bytes_per_element = 4);

/** @brief The names `make` accepts: "alexnet", "vgg11", ..., "resnet50", ..., "inception_v3". */
[[nodiscard]] std::span<const std::string_view> names() noexcept;
/** @brief A model by name. @throw dropit::error naming the name if it is unknown */
[[nodiscard]] graph make(std::string_view name, input_shape in, std::int64_t bytes_per_element = 4);

}  // namespace models
}  // namespace dropit::checkpoint

#include <dropit/detail/checkpoint/checkpoint.inl>
