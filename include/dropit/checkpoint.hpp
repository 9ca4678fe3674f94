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
 * Planner v2 (`solve_budget`, `solve_frontier`): vertices also have a recompute time and may offer
 * storage options (compressed forms); for a memory budget it finds the plan with the least extra
 * time, each vertex kept, compressed (never the entry of a segment) or dropped. `simulate_step`
 * models a whole training step's memory under a plan (gradients and backward workspaces
 * included), and `solve_step_budget` keeps that modelled peak within a budget.
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
  double compute;     ///< the operation's compute cost (any unit, >= 0); a vertex's default time
};

/**
 * @brief A way to store a tensor other than exactly (e.g. MinK 0.9 sparse): its bytes and the
 * time to pack it in forward and restore it in backward. A tensor stored this way (*compressed*)
 * serves its consumers' backward (a Linear/Conv input its weight gradient) but never the
 * recomputation of a segment: `solve_budget` drops no successor of a compressed tensor.
 */
struct storage_option {
  std::string name;   ///< e.g. "MinK 0.9"; unique among the vertex's options
  cost_t bytes = 0;   ///< memory of the stored form (>= 0)
  double time = 0.0;  ///< pack + restore time, in the unit of the vertex times (>= 0)
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
   * @brief Sets the time to recompute a vertex (its operation), used by `solve_budget` and
   * `solve_frontier`. Without it a vertex's time is the sum of the `compute` costs of its input
   * edges (a repeated edge once, at its largest cost).
   * @throw dropit::error if out of range, or `time` is negative or not finite
   */
  void set_time(vertex_index v, double time);

  /**
   * @brief Sets the memory vertex `v`'s operation allocates in backward beyond the gradients of
   * its inputs (temporaries, e.g. the intermediate gradients of a fused batch norm + ReLU), used
   * by `simulate_step` only (default 0).
   * @throw dropit::error if out of range or `bytes` is negative
   */
  void set_workspace(vertex_index v, cost_t bytes);

  /**
   * @brief Declares that vertex `v`'s operation frees its output's gradient before its backward
   * peaks when autograd owns that gradient (a fused batch norm + ReLU consumes it in its first
   * step), as in a plain autograd op and inside a recomputed group; the exit of a recomputed
   * group receives it from the engine, which holds it to the end. Used by `simulate_step` only
   * (default false).
   * @throw dropit::error if out of range
   */
  void set_frees_gradient_early(vertex_index v, bool frees);

  /**
   * @brief Declares the tensors vertex `v`'s operation does not keep for its backward: `v` itself
   * (its output) and/or some of its inputs (e.g. an addition keeps neither input, a convolution
   * its input but not its output). Used by `simulate_step` only: a recomputed tensor is freed
   * after the last backward that keeps it. By default an operation keeps its output and every
   * input (the conservative case). Replaces what was declared before.
   * @throw dropit::error if out of range, or a tensor is neither `v` nor an input of `v` (add
   * the edges first)
   */
  void set_unsaved(vertex_index v, std::vector<vertex_index> tensors);

  /**
   * @brief Declares the inputs of vertex `v` whose gradient `v`'s backward returns without new
   * memory: its output's gradient itself or a view of it (an addition gives both inputs the
   * output gradient, a view or flatten its reshaped gradient, a concatenation slices of it).
   * Used by `simulate_step` only: such an input's gradient shares the output gradient's buffer,
   * which is freed when the last gradient using it is, and a gradient accumulated into a shared
   * buffer takes a buffer of its own (autograd sums out of place then). By default every input
   * gradient is new memory. Replaces what was declared before.
   * @throw dropit::error if out of range, or a tensor is not an input of `v` (add the edges first)
   */
  void set_passes_gradient(vertex_index v, std::vector<vertex_index> inputs);

  /**
   * @brief Offers a way to store vertex `v` compressed (see `storage_option`). A vertex without
   * options is exact-only: it is kept or recomputed. Options of the source and target are ignored
   * (both are always kept).
   * @throw dropit::error if out of range, the name is empty or taken for `v`, the bytes are
   * negative, or the time is negative or not finite
   */
  void add_storage(vertex_index v, storage_option option);

  /**
   * @brief Adds an operation from vertex `from` to vertex `to`.
   * @param compute the operation's compute cost (>= 0), reported as `plan::recompute` and the
   * default time of `to` (an edge added again counts once, at the largest cost given)
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
  /**
   * @brief A vertex's recompute time: the one set by `set_time`, else the sum of its input edges'
   * `compute` (O(edges)). @throw dropit::error if out of range
   */
  [[nodiscard]] double time(vertex_index v) const;
  /** @brief A vertex's backward workspace (`set_workspace`). @throw dropit::error if out of range
   */
  [[nodiscard]] cost_t workspace(vertex_index v) const;
  /** @brief `set_frees_gradient_early`'s flag. @throw dropit::error if out of range */
  [[nodiscard]] bool frees_gradient_early(vertex_index v) const;
  /** @brief The tensors `set_unsaved` declared for `v` (empty: it keeps them all).
   * @throw dropit::error if out of range */
  [[nodiscard]] std::span<const vertex_index> unsaved(vertex_index v) const;
  /** @brief Whether vertex `op`'s operation keeps `tensor` (itself or an input) for its backward.
   * @throw dropit::error if out of range */
  [[nodiscard]] bool saves(vertex_index op, vertex_index tensor) const;
  /** @brief The inputs `set_passes_gradient` declared for `v` (sorted; empty: none).
   * @throw dropit::error if out of range */
  [[nodiscard]] std::span<const vertex_index> passed_gradients(vertex_index v) const;
  /** @brief Whether vertex `op`'s backward hands `input` its output gradient (or a view of it)
   * instead of new memory. @throw dropit::error if out of range */
  [[nodiscard]] bool passes_gradient(vertex_index op, vertex_index input) const;
  /** @brief Whether an edge goes from `from` to `to` (O(edges)). */
  [[nodiscard]] bool has_edge(vertex_index from, vertex_index to) const noexcept;
  /** @brief Whether `set_time` gave the vertex a time. @throw dropit::error if out of range */
  [[nodiscard]] bool has_time(vertex_index v) const;
  /** @brief A vertex's storage options (empty: exact-only). @throw dropit::error if out of range */
  [[nodiscard]] std::span<const storage_option> storage(vertex_index v) const;
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
  std::vector<double> times_;  // NaN: not set
  std::vector<cost_t> workspaces_;
  std::vector<std::vector<vertex_index>> unsaved_;
  std::vector<std::vector<vertex_index>> passes_;
  std::vector<char> frees_early_;
  std::vector<std::vector<storage_option>> storage_;
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

/** @brief What a plan does with a vertex's tensor in forward. */
enum class decision : std::uint8_t {
  keep,      ///< stored exactly (a checkpoint; the source and the target)
  compress,  ///< stored with one of its storage options; never a segment's entry
  drop,      ///< recomputed in backward, inside a segment
};

/** @brief A compressed vertex of a plan and the storage option it uses. */
struct compression {
  vertex_index vertex = 0;  ///< the vertex
  std::size_t option = 0;   ///< index into `graph::storage(vertex)`
};

/**
 * @brief A checkpoint plan and its cost in the paper's model, extended by compressed vertices:
 * cost = checkpoint_cost + compressed_cost + max_segment_cost.
 */
struct plan {
  std::vector<vertex_index>
      checkpoints;  ///< kept vertices, topological order, source/target excluded
  std::vector<segment>
      segments;                 ///< by the topological position of the entry, then of the vertices
  cost_t checkpoint_cost = 0;   ///< sum of the checkpoints' costs
  cost_t max_segment_cost = 0;  ///< the largest segment cost (0 if there is no segment)
  cost_t cost = 0;              ///< checkpoint_cost + compressed_cost + max_segment_cost
  cost_t regular_cost = 0;      ///< sum of all vertex costs (training without checkpoints)
  double recompute = 0.0;       ///< compute cost of the edges into segment vertices (rerun once)
  double solve_seconds = 0.0;   ///< wall time of the call that made the plan
  /// Passes of the dynamic program over the division tree that the search over the segment bound
  /// made (solve, solve_linear, solve_budget; 0 for evaluate and graphs without inner vertices).
  /// For solve and solve_linear each costs
  /// O(vertices); on a chain of n unit costs the search makes O(sqrt(n)) of them.
  std::size_t search_passes = 0;
  std::vector<compression> compressed;  ///< compressed vertices, topological order
  cost_t compressed_cost = 0;           ///< sum of their options' bytes
  /// Time the plan adds to a step: the times (`graph::time`) of the dropped vertices plus the
  /// options' time of the compressed ones. Without vertex times or compression, `recompute`.
  double extra_time = 0.0;
  std::vector<decision> decisions;  ///< per vertex index
  /// solve_budget: whether the plan is proven to take the least extra time within the budget
  /// (false when a knob of `budget_options` thinned a Pareto set or skipped a segment bound).
  bool exact = true;
};

/** @brief One point of the memory / time trade-off. */
struct frontier_point {
  cost_t memory = 0;        ///< `plan::cost` of the plan
  double extra_time = 0.0;  ///< `plan::extra_time` of the plan
};

/** @brief The Pareto frontier of a graph: every plan that no other beats in memory and time. */
struct frontier {
  std::vector<frontier_point> points;  ///< by memory ascending (so extra time descending)
  bool exact = true;  ///< false when a knob thinned a set or skipped a bound (points are plans)
  std::size_t search_passes = 0;  ///< passes of the dynamic program (one per segment bound)
  double solve_seconds = 0.0;     ///< wall time of the call
};

/** @brief Knobs of `solve_budget` and `solve_frontier`. */
struct budget_options {
  bool use_storage = true;  ///< false: ignore storage options (recompute-only plans)
  /// Most points a Pareto set of the dynamic program keeps; a larger set is thinned to this many
  /// (evenly by memory) and the result is marked inexact (a heuristic then).
  std::size_t max_points = 65536;
  /// 0: every segment bound that can matter is tried (exact). r > 0: each next bound is at most
  /// the last / (1 + r), so a plan with largest segment a may be missed by at most r x a bytes.
  double bound_ratio = 0.0;
  /// `solve_step_budget` only: the most work (candidate points merged into the dynamic program's
  /// sets, about 2-3e8 a second on the development machine) its start frontier's exact search may
  /// take; past it the frontier is searched again with the knobs of `fast()` (or tighter ones
  /// given here; docs/checkpoint.md). 0: no limit.
  std::uint64_t step_search_work = 300'000'000;

  /// The fast setting, `max_points` 512 and `bound_ratio` 0.3: a heuristic (results are marked
  /// inexact) that takes DenseNet-201's frontier from over a minute to under a second, with at most
  /// 4.7% more memory at any time than the exact frontier there (docs/checkpoint.md, "Speed").
  [[nodiscard]] static budget_options fast() noexcept {
    budget_options o;
    o.max_points = 512;
    o.bound_ratio = 0.3;
    return o;
  }
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
 * @brief The plan that a set of checkpoints and compressed vertices makes.
 * @throw dropit::error as the other `evaluate`, if a vertex is listed twice or an option index is
 * out of range, or if a compressed vertex would be the entry of a segment (it feeds a dropped one)
 */
[[nodiscard]] plan evaluate(const graph& g, std::span<const vertex_index> checkpoints,
                            std::span<const compression> compressed);

/**
 * @brief The plan with the least `extra_time` whose memory (`plan::cost`) is at most `budget`;
 * each inner vertex kept, compressed (with one of its storage options) or dropped.
 *
 * A bottom-up pass over the division tree computes, for a bound M on the segment cost, the Pareto
 * set of (stored bytes, extra time) of every node (with the largest segment of each point); the
 * bounds are searched from `budget` down as in `solve`. Exact unless a Pareto set grew beyond
 * `options.max_points` or `options.bound_ratio` is set (then `plan::exact` is false).
 * @throw dropit::error if the graph is not valid, or if no plan fits (the message gives the least
 * memory)
 */
[[nodiscard]] plan solve_budget(const graph& g, cost_t budget, const budget_options& options = {});

/**
 * @brief The least memory (`plan::cost`) of any plan, compressed vertices allowed (unless
 * `options.use_storage` is false: then `solve(g).cost`); as fast as `solve`.
 * @throw dropit::error if the graph is not valid
 */
[[nodiscard]] cost_t least_memory(const graph& g, const budget_options& options = {});

/**
 * @brief The Pareto frontier of (memory, extra time) over all plans; its first point is the least
 * memory (with no storage options, `solve(g).cost`), its last the least time. `solve_budget` at a
 * point's memory gives a plan with that point's time.
 * @throw dropit::error if the graph is not valid
 */
[[nodiscard]] frontier solve_frontier(const graph& g, const budget_options& options = {});

/**
 * @brief The memory of one training step run with a plan, in the execution model of
 * `dropit::torch::checkpointed_graph` (one autograd node per stored vertex; see
 * docs/checkpoint.md, "Step memory"). Units are the graph's costs.
 */
struct step_memory {
  cost_t stored = 0;        ///< held between forward and backward: kept tensors, packs, the target
  cost_t forward_peak = 0;  ///< the most held during forward
  cost_t peak = 0;          ///< the most held during the step (forward and backward)
  vertex_index peak_vertex = 0;  ///< the vertex whose computation or gradient reaches `peak`
};

/**
 * @brief Replays a step with plan `p` tensor by tensor and returns its memory. The model: every
 * tensor of the graph is saved by the operations that read it (build the graph so: one vertex per
 * tensor autograd keeps); forward holds the stored tensors (a compressed one dense beside its
 * pack until its last reader has run); backward runs the nodes from the last, each restoring its
 * compressed entries, recomputing its dropped vertices and its exit, and back-propagating op by
 * op; a vertex's gradient (its bytes) lives from its first reader's backward to its own; a stored
 * tensor is freed after the last node that saves it. The source and the operations' own buffers
 * are not counted.
 * @throw dropit::error if the graph is not valid or `p` is not a plan of it
 */
[[nodiscard]] step_memory simulate_step(const graph& g, const plan& p);

/**
 * @brief A fast plan whose step peak (`simulate_step(g, plan).peak`) is at most `budget`: a
 * heuristic, `plan::exact` is false. It starts from the fastest plan of the (memory, time)
 * frontier (`solve_frontier`; with the fast setting when the exact search would pass
 * `budget_options::step_search_work`) whose step fits (a frontier of more than 64 points is
 * bisected by step peak, each point tried costing a pass of the dynamic program), or, if none fits,
 * from the one with the least step peak, moved one vertex's decision at a time (kept, dropped,
 * compressed with an option) to the neighbour with the least step peak (two decisions at once when
 * no single one lowers it) until it fits; then, while some neighbour is faster and fits, it moves
 * to the fastest one, and when none is, to a faster plan two decisions away that fits (the most
 * promising pairs by time saved; docs/checkpoint.md).
 * @throw dropit::error if the graph is not valid, or if no plan is found that fits (the message
 * gives the least step peak found)
 */
[[nodiscard]] plan solve_step_budget(const graph& g, cost_t budget,
                                     const budget_options& options = {});

/**
 * @brief Reads a graph from JSON text:
 * `{"source": ID, "target": ID, "vertices": [{"id": ID, "cost": NUMBER, "time": NUMBER
 * (optional), "workspace": NUMBER (optional, read as a cost), "unsaved": [ID, ...] (optional: the
 * vertex itself and/or inputs of it, `graph::set_unsaved`), "passes_gradient": [ID, ...]
 * (optional: inputs of it, `graph::set_passes_gradient`), "frees_gradient_early": BOOLEAN
 * (optional, `graph::set_frees_gradient_early`), "storage": [{"name": STRING, "bytes":
 * NUMBER, "time": NUMBER (optional)}, ...] (optional)}, ...], "edges": [{"u": ID, "v": ID,
 * "compute": NUMBER (optional)}, ...]}`.
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
 * vertex id, `compressed` (`vertex`, `option` name, `bytes`, `time`), `cost`, `checkpoint_cost`,
 * `compressed_cost`, `max_segment_cost`, `regular_cost`, `recompute`, `extra_time`, `exact`,
 * `solve_seconds`. Every other vertex is the source or the target (kept). Ids that are decimal
 * integers are written as numbers.
 */
[[nodiscard]] std::string to_json(const graph& g, const plan& p);

/**
 * @brief A graph as JSON in the format `parse_graph_json` reads (edges with their "compute",
 * vertices with their "time" if set, "workspace" if not 0, "unsaved", "passes_gradient" and
 * "storage" if any,
 * "frees_gradient_early" if true).
 */
[[nodiscard]] std::string to_json(const graph& g);

/**
 * @brief Graphs of well-known CNNs with one vertex per tensor their forward pass stores, as the
 * reference implementation's torch.jit parser records them: every module or aten op output (conv,
 * batch norm, pool, add, concat, flatten, dropout, linear), in-place ReLUs merged into the tensor
 * they overwrite. Shapes follow torchvision's layer arithmetic; no weights are involved.
 *
 * Times: an op's FLOP estimate (2 x MACs for conv and linear, 1 per element read for the others)
 * sits on its first input edge, so a vertex's default time is its op's FLOPs. Storage: every
 * vertex read by a conv or linear op and otherwise only by ops whose backward does not read it
 * (add, concat) offers `models::mink_option`: MinK 0.9 with bitmask positions; `offer_int8` adds
 * int8 storage on the other inner tensors.
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

/// MinK 0.9's payload per element: 10% of the values plus a 1-bit position mask and headers
/// (0.529 B for fp32: the packed format's bitmask size measured in the README).
inline constexpr double mink_overhead_bytes_per_element = 0.129;
/// Pack + restore time per element, in the models' FLOP unit: about two element-wise passes (one
/// to select and pack, one to scatter back), as a batch norm costs one per element here.
inline constexpr double mink_time_per_element = 2.0;

/**
 * @brief The MinK 0.9 storage option of a tensor of `elements` elements of `bytes_per_element`
 * bytes: bytes = ceil(elements x (0.1 x bytes_per_element + 0.129)), time = 2 x elements.
 */
[[nodiscard]] storage_option mink_option(std::int64_t elements, std::int64_t bytes_per_element = 4);

/// int8 storage per element beyond its one byte: a float scale per 1024 values (the value
/// codec's chunk), as `Identity` + `codec::int8` stores a dense tensor.
inline constexpr double int8_scale_bytes_per_element = 4.0 / 1024.0;
/// int8 pack + restore time per element, in the models' FLOP unit (as `mink_time_per_element`).
inline constexpr double int8_time_per_element = 2.0;

/**
 * @brief The int8 storage option of a tensor of `elements` elements: every value in 8 bits with a
 * float scale per 1024 (dense; lossy, as ActNN/GACT store activations): bytes = elements +
 * 4 x ceil(elements / 1024), time = 2 x elements.
 */
[[nodiscard]] storage_option int8_option(std::int64_t elements);

/**
 * @brief Offers `int8_option` on every inner vertex of g (not the source or the target) that has no
 * storage option yet, e.g. after a built-in model offered MinK on its conv and linear inputs:
 * tensors whose backward reads them exactly (batch norm and pooling inputs) may then be stored
 * quantized instead of recomputed. Vertex costs are read as elements x `bytes_per_element`;
 * where that is 1 the option is no smaller than the tensor and the planners ignore it.
 * @return the number of vertices that got the option
 * @throw dropit::error if `bytes_per_element` < 1
 */
std::size_t offer_int8(graph& g, std::int64_t bytes_per_element = 4);

/** @brief The names `make` accepts: "alexnet", "vgg11", ..., "resnet50", ..., "inception_v3". */
[[nodiscard]] std::span<const std::string_view> names() noexcept;
/** @brief A model by name. @throw dropit::error naming the name if it is unknown */
[[nodiscard]] graph make(std::string_view name, input_shape in, std::int64_t bytes_per_element = 4);

}  // namespace models
}  // namespace dropit::checkpoint

#include <dropit/detail/checkpoint/checkpoint.inl>
