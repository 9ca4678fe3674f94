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
 */
#pragma once

#include <dropit/checkpoint.hpp>
#include <dropit/error.hpp>

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
   * @brief The planner's graph of this model: every vertex costs the bytes of the tensor it holds
   * when the model runs on `example` (measured by running it once without autograd).
   * @throw dropit::error if the graph has only its input, or if an operation throws.
   */
  [[nodiscard]] checkpoint::graph measure(const at::Tensor& example) const;

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

  /** @brief Drops the plan: `forward` keeps every tensor autograd saves (the plain run). */
  void clear_plan() noexcept { plan_.reset(); }

  /** @brief The plan in use, if any. */
  [[nodiscard]] const std::optional<checkpoint::plan>& current_plan() const noexcept {
    return plan_;
  }

  /**
   * @brief Runs the model on x. With a plan and grad mode on: each checkpoint and the output is
   * one autograd node that keeps only its entry tensors (checkpoints or the input) and recomputes
   * the vertices between them in backward. Without a plan, or with grad mode off: the plain run.
   * @return the output vertex's tensor
   * @throw dropit::error if the graph has only its input
   */
  at::Tensor forward(const at::Tensor& x) const;

  /** @brief The plain run, whatever the plan. */
  at::Tensor forward_plain(const at::Tensor& x) const;

  /**
   * @brief True while this thread runs the operations a second time: recomputing a group in
   * backward, or measuring (`measure`, `plan`, `use_checkpoints`). An operation with a side effect
   * that must happen once per step reads it, e.g. a training-mode batch norm that updates its
   * running statistics only in the step's forward (see `examples/checkpoint_train`).
   */
  [[nodiscard]] static bool replaying() noexcept { return replaying_flag(); }

 private:
  struct group {
    vertex exit;                  // a checkpoint or the output
    std::vector<vertex> inside;   // recomputed vertices, topological order
    std::vector<vertex> entries;  // kept vertices (or the input) the group reads
  };
  friend struct detail::checkpoint_function;

  static bool& replaying_flag() noexcept {
    thread_local bool flag = false;
    return flag;
  }
  void make_groups();
  at::Tensor run_group(const group& gr, const std::vector<at::Tensor>& entries) const;

  std::vector<std::string> names_;
  std::vector<std::vector<vertex>> inputs_;
  std::vector<operation> ops_;
  std::optional<checkpoint::plan> plan_;
  std::vector<group> groups_;  // in topological order of their exits
  // An input of every checkpoint node that requires grad, so that its output does even when no
  // entry does: the parameters the operations use are invisible to autograd until backward.
  at::Tensor anchor_;
};

}  // namespace dropit::torch

#include <dropit/detail/torch/checkpoint.inl>
