/**
 * @file checkpoint.hpp
 * @brief `dropit::torch::checkpointed_graph`: runs a model described as a graph of LibTorch
 * operations with a checkpoint plan from `dropit/checkpoint.hpp`, so that only the checkpoints
 * (and the input) stay alive between forward and backward, and everything else is recomputed,
 * one segment at a time, in backward.
 *
 * @code
 * dropit::torch::checkpointed_graph net;                      // vertex 0 is the input
 * auto c1 = net.add("conv1", {net.input()}, [&](auto& in) { return conv1->forward(in[0]); });
 * auto r1 = net.add("relu1", {c1}, [](auto& in) { return torch::relu(in[0]); });
 * auto out = net.add("fc", {r1, net.input()}, ...);            // any DAG; the last vertex is the
 * output net.plan(example_batch);          // measures every tensor's bytes, solves for the optimal
 * plan auto loss = criterion(net.forward(batch), labels);  // keeps only the checkpoints
 * loss.backward();                                    // recomputes each segment from its entry
 * @endcode
 *
 * Gradients equal those of the plain run (the same operations run again on the same inputs).
 * Operations must be deterministic functions of their inputs and parameters: a dropout would draw
 * a new mask when recomputed. A training-mode BatchNorm module would update its running
 * statistics once more per recomputation (its output, and so every gradient, is unchanged); an
 * operation can skip such side effects while `checkpointed_graph::replaying()` is true.
 *
 * Planner v2 (`plan_budget`, `frontier`, `use_plan`): `measure` also records each operation's
 * time, and a vertex declared with `allow_sparse` offers a sparse storage option (the bytes of its
 * pack and the pack + restore time). A plan may then *compress* such a vertex: forward packs it
 * once (`packed_tensor::pack_saved`), the groups that read it keep the pack instead of the dense
 * tensor, and backward restores it (kept values, zeros elsewhere) to recompute them: DropIT's
 * semantics for the weight gradients of the Linear/Conv layers that read it. Gradients equal the
 * plain run's when a plan only keeps and recomputes.
 */
#pragma once

#include <dropit/checkpoint.hpp>
#include <dropit/detail/checkpoint/groups.hpp>
#include <dropit/error.hpp>
#include <dropit/torch/policy.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dropit::torch {

namespace detail {
struct checkpoint_function;
}

/**
 * @brief A model as a DAG of LibTorch operations, run plainly or with a checkpoint plan.
 *
 * Vertices are tensors: vertex 0 is the input (the planner's source), every other vertex is the
 * output of one operation applied to earlier vertices; the last vertex added is the model's output
 * (the planner's target). Not thread-safe; the object must outlive the backward pass of every
 * forward it ran.
 */
class checkpointed_graph {
 public:
  /// @brief A vertex: an index into the graph, in the order vertices were added.
  using vertex = checkpoint::vertex_index;
  /// @brief An operation: its inputs' tensors in the order given to `add`, to its output tensor.
  using operation = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

  /** @brief A graph holding only its input vertex, named `input_name`. */
  explicit checkpointed_graph(std::string input_name = "input");

  /** @brief The input vertex (0). */
  [[nodiscard]] vertex input() const noexcept { return 0; }

  /**
   * @brief Adds the tensor `op(inputs...)`. Any plan made before is dropped.
   * @param name the vertex's id in the planner's graph (unique)
   * @param inputs earlier vertices, at least one
   * @param op computes the tensor; called again in backward when the vertex is not a checkpoint
   * @throw dropit::error if an input is not an earlier vertex, no input is given, op is empty or
   * the name repeats.
   */
  vertex add(std::string name, std::vector<vertex> inputs, operation op);

  /** @brief Number of vertices, the input included. */
  [[nodiscard]] std::size_t size() const noexcept { return ops_.size(); }

  /**
   * @brief Declares that vertex `v` may be stored sparse (packed with policy `p`) by a v2 plan.
   * Contract: every operation that reads `v` uses it only as the input of a Linear or Conv layer
   * (or another operation whose backward reads `v` only for a weight gradient and whose input
   * gradient does not depend on `v`); the weight gradients then come from the sparse copy, as in
   * DropIT. dropit cannot check this; a reader that is not such a layer gets wrong gradients.
   * Declaring again replaces the policy.
   * @throw dropit::error if `v` is the input or not a vertex, or `p` is `policy_kind::none` or has
   * a bad gamma. (Declaring the output is rejected when the graph is measured.)
   */
  void allow_sparse(vertex v, const policy& p);

  /** @brief The policy `allow_sparse` gave `v`, if any. */
  [[nodiscard]] std::optional<policy> sparse_policy(vertex v) const;

  /**
   * @brief The planner's graph of this model: every vertex costs the bytes of the tensor it holds
   * when the model runs on `example`, and its time (`checkpoint::graph::set_time`, in seconds) is
   * its operation's, both measured by running the model `runs` times without autograd (the best
   * time of the runs). A vertex declared with `allow_sparse` also offers one storage option,
   * named after its policy (e.g. "mink 0.9"): the bytes of its pack and the best pack + restore
   * time. `checkpoint::solve` ignores times and options. Each vertex's backward workspace
   * (`checkpoint::graph::set_workspace`, used by `checkpoint::simulate_step`) is measured by
   * running its operation once more with autograd and its backward under a probe counting
   * allocator: the peak less its inputs' gradients (the last timing run keeps every tensor of
   * the graph for it, as a plain forward does). The parameters' gradients are computed with
   * `torch::autograd::grad`, so their `.grad` stay untouched; an installed `counting_allocator`
   * does not see the probe's short-lived blocks.
   * @throw dropit::error if the graph has only its input, `runs` is 0, the output is declared
   * sparse, an operation (or its backward) throws, a sparse vertex's tensor cannot be packed, or
   * the probe cannot be installed (LibTorch keeps another CPU allocator: `cpu_allocator_guard`).
   */
  [[nodiscard]] checkpoint::graph measure(const at::Tensor& example, std::size_t runs = 1) const;

  /**
   * @brief Measures the model on `example`, solves for the optimal plan (`checkpoint::solve`) and
   * runs every later `forward` with it.
   * @return the plan (vertex indices are this graph's)
   */
  const checkpoint::plan& plan(const at::Tensor& example);

  /**
   * @brief Runs later `forward` calls with the given checkpoints (the plan `checkpoint::evaluate`
   * makes of them on the graph measured on `example`).
   * @throw dropit::error as `checkpoint::evaluate` (a checkpoint that repeats, is the input or
   * the output, or leaves a group with two entries or exits)
   */
  const checkpoint::plan& use_checkpoints(const at::Tensor& example,
                                          std::span<const vertex> checkpoints);

  /**
   * @brief Measures the model on `example` (`measure(example, 3)`), finds the plan with the least
   * extra time whose memory in the planner's model is at most `budget` bytes
   * (`checkpoint::solve_budget`) and runs every later `forward` with it.
   * @throw dropit::error as `measure`, or if no plan fits (the message gives the least memory)
   */
  const checkpoint::plan& plan_budget(const at::Tensor& example, checkpoint::cost_t budget,
                                      const checkpoint::budget_options& options = {});

  /**
   * @brief As `plan_budget`, but `budget` bounds the step's modelled peak
   * (`checkpoint::simulate_step`: forward and backward, gradients and recomputations included)
   * instead of the planner's memory: the fastest frontier plan that fits
   * (`checkpoint::solve_step_budget`, a heuristic). Build the graph with one vertex per tensor
   * autograd keeps (e.g. a batch norm and its ReLU as one vertex) for the model to hold.
   * @throw dropit::error as `measure`, or if no frontier plan fits (the message gives the least
   * modelled peak)
   */
  const checkpoint::plan& plan_step_budget(const at::Tensor& example, checkpoint::cost_t budget,
                                           const checkpoint::budget_options& options = {});

  /**
   * @brief The (memory, extra time) Pareto frontier of the model measured on `example`
   * (`checkpoint::solve_frontier` on `measure(example, 3)`); memory in bytes, time in seconds.
   * The plan in use is unchanged.
   * @throw dropit::error as `measure`
   */
  [[nodiscard]] checkpoint::frontier frontier(const at::Tensor& example,
                                              const checkpoint::budget_options& options = {}) const;

  /**
   * @brief Runs later `forward` calls with the given checkpoints and compressed vertices (the
   * plan `checkpoint::evaluate` makes of them on the graph measured on `example`).
   * @throw dropit::error as `checkpoint::evaluate` (and a compressed vertex must have been
   * declared with `allow_sparse`: its only option is index 0)
   */
  const checkpoint::plan& use_plan(const at::Tensor& example, std::span<const vertex> checkpoints,
                                   std::span<const checkpoint::compression> compressed);

  /** @brief Drops the plan: `forward` keeps every tensor autograd saves (the plain run). */
  void clear_plan() noexcept { plan_.reset(); }

  /** @brief The plan in use, if any. */
  [[nodiscard]] const std::optional<checkpoint::plan>& current_plan() const noexcept {
    return plan_;
  }

  /**
   * @brief Runs the model on x. With a plan and grad mode on: each checkpoint, compressed vertex
   * and the output is one autograd node that keeps only its entry tensors (checkpoints or the
   * input, and the packs of compressed entries, one pack per compressed vertex and forward shared
   * by its readers) and recomputes the vertices between them in backward. A group with nothing
   * to recompute (its exit, not compressed, reads only kept tensors) is no such node: it runs with
   * autograd, which keeps what the operation saves (its inputs and output are kept anyway; an
   * operation that also saves a temporary of its own, e.g. `a * b.sigmoid()`, holds it too).
   * Without a plan, or with grad mode off: the plain run. A node frees its packs in its backward,
   * so a second backward through it (`retain_graph`) throws a `dropit::error`.
   * @return the output vertex's tensor
   * @throw dropit::error if the graph has only its input
   */
  at::Tensor forward(const at::Tensor& x) const;

  /** @brief The plain run, whatever the plan. */
  at::Tensor forward_plain(const at::Tensor& x) const;

  /**
   * @brief True while this thread runs the operations a second time: recomputing a group in
   * backward, or measuring (`measure`, `plan`, `use_checkpoints`, `plan_budget`, `frontier`,
   * `use_plan`). An operation with a side effect that must happen once per step reads it, e.g. a
   * training-mode batch norm that updates its running statistics only in the step's forward (see
   * `examples/checkpoint_train`).
   */
  [[nodiscard]] static bool replaying() noexcept { return replaying_flag(); }

 private:
  /// A checkpoint, a compressed vertex or the output, with the vertices it recomputes.
  using group = checkpoint::detail::recompute_group;
  friend struct detail::checkpoint_function;

  static bool& replaying_flag() noexcept {
    thread_local bool flag = false;
    return flag;
  }
  void make_groups();
  at::Tensor run_group(const group& gr, const std::vector<at::Tensor>& entries) const;
  // What each operation's backward needs, run on `values` (every vertex's tensor): the memory
  // it allocates beyond its inputs' gradients, the tensors (itself, its inputs) it does not keep,
  // whether it frees its output's gradient early, the inputs it hands its output's gradient
  // (`checkpoint::graph::set_workspace`, `set_unsaved`, `set_frees_gradient_early`,
  // `set_passes_gradient`).
  struct backward_profile {
    std::vector<std::size_t> workspace;
    std::vector<std::vector<vertex>> unsaved;
    std::vector<char> frees_early;
    std::vector<std::vector<vertex>> passes;
  };
  backward_profile measure_backward(const std::vector<at::Tensor>& values) const;

  std::vector<std::string> names_;
  std::vector<std::vector<vertex>> inputs_;
  std::vector<operation> ops_;
  std::vector<std::optional<policy>> sparse_;  // allow_sparse, per vertex
  std::optional<checkpoint::plan> plan_;
  std::vector<char> compressed_;  // per vertex: the plan stores it packed
  std::vector<group> groups_;     // in topological order of their exits
  // An input of every checkpoint node that requires grad, so that its output does even when no
  // entry does: the parameters the operations use are invisible to autograd until backward.
  at::Tensor anchor_;
};

}  // namespace dropit::torch

#include <dropit/detail/torch/checkpoint.inl>
