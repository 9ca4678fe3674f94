// Implementation of dropit::torch::checkpointed_graph (torch/checkpoint.hpp).
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace dropit::torch {
namespace detail {

/// Sets a flag for its lifetime and restores it after.
class replay_guard {
 public:
  explicit replay_guard(bool& flag) noexcept : flag_(flag), was_(std::exchange(flag, true)) {}
  ~replay_guard() { flag_ = was_; }
  replay_guard(const replay_guard&) = delete;
  replay_guard& operator=(const replay_guard&) = delete;

 private:
  bool& flag_;
  bool was_;
};

/// One checkpoint (or the output) and the vertices recomputed for it: forward computes the group
/// without autograd and saves only its entries; backward recomputes it with autograd and
/// back-propagates through the recomputation (a reentrant backward).
struct checkpoint_function : ::torch::autograd::Function<checkpoint_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, at::TensorList entries,
                            const at::Tensor& /*anchor*/, const checkpointed_graph* g,
                            std::int64_t group) {
    ctx->save_for_backward(entries.vec());
    ctx->saved_data["graph"] = reinterpret_cast<std::int64_t>(g);
    ctx->saved_data["group"] = group;
    return g->run_group(g->groups_[static_cast<std::size_t>(group)], entries.vec());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto* g = reinterpret_cast<const checkpointed_graph*>(ctx->saved_data["graph"].toInt());
    const auto& gr = g->groups_[static_cast<std::size_t>(ctx->saved_data["group"].toInt())];
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> entries;
    entries.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      at::Tensor e = saved[i].detach();
      if (e.is_floating_point() && ctx->needs_input_grad(i)) e.requires_grad_(true);
      entries.push_back(std::move(e));
    }
    ::torch::autograd::variable_list out(saved.size() + 3);  // + the anchor, g and group
    if (!grads[0].defined()) return out;
    at::Tensor y;
    {
      const at::AutoGradMode enable(true);
      const replay_guard replaying(checkpointed_graph::replaying_flag());
      y = g->run_group(gr, entries);
    }
    if (y.requires_grad()) ::torch::autograd::backward({y}, {grads[0]});
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].requires_grad()) out[i] = entries[i].grad();
    }
    return out;
  }
};

}  // namespace detail

inline checkpointed_graph::checkpointed_graph(std::string input_name)
    : anchor_(at::zeros({}).requires_grad_(true)) {
  names_.push_back(std::move(input_name));
  inputs_.emplace_back();
  ops_.emplace_back();
}

inline checkpointed_graph::vertex checkpointed_graph::add(std::string name,
                                                          std::vector<vertex> inputs,
                                                          operation op) {
  const vertex v = ops_.size();
  DROPIT_EXPECTS(!inputs.empty(), "checkpointed_graph::add: vertex '", name, "' has no input");
  DROPIT_EXPECTS(static_cast<bool>(op), "checkpointed_graph::add: vertex '", name,
                 "' has no operation");
  for (vertex u : inputs) {
    DROPIT_EXPECTS(u < v, "checkpointed_graph::add: vertex '", name, "' reads vertex ", u,
                   ", which is not an earlier vertex (there are ", v, ")");
  }
  DROPIT_EXPECTS(std::find(names_.begin(), names_.end(), name) == names_.end(),
                 "checkpointed_graph::add: the name '", name, "' is taken");
  names_.push_back(std::move(name));
  inputs_.push_back(std::move(inputs));
  ops_.push_back(std::move(op));
  plan_.reset();
  groups_.clear();
  return v;
}

namespace detail {
/// For each vertex, the last vertex that reads it (itself if none does).
inline std::vector<std::size_t> last_uses(const std::vector<std::vector<std::size_t>>& inputs) {
  std::vector<std::size_t> last(inputs.size());
  for (std::size_t v = 0; v < inputs.size(); ++v) {
    last[v] = v;
    for (std::size_t u : inputs[v])
      last[u] = v;
  }
  return last;
}

/// Computes vertex v from `values` and drops the inputs v is the last reader of.
inline void compute_vertex(
    std::size_t v, const std::vector<std::vector<std::size_t>>& inputs,
    const std::vector<std::function<at::Tensor(const std::vector<at::Tensor>&)>>& ops,
    const std::vector<std::size_t>& last, std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> args;
  args.reserve(inputs[v].size());
  for (std::size_t u : inputs[v])
    args.push_back(values[u]);
  values[v] = ops[v](args);
  for (std::size_t u : inputs[v]) {
    if (last[u] == v) values[u].reset();
  }
}
}  // namespace detail

inline checkpoint::graph checkpointed_graph::measure(const at::Tensor& example) const {
  DROPIT_EXPECTS(size() > 1, "checkpointed_graph::measure: the graph has no operation");
  const at::NoGradGuard no_grad;
  const detail::replay_guard replaying(replaying_flag());
  const auto last = detail::last_uses(inputs_);
  std::vector<at::Tensor> values(size());
  values[0] = example;
  checkpoint::graph g;
  g.add_vertex(names_[0], static_cast<checkpoint::cost_t>(example.nbytes()));
  for (vertex v = 1; v < size(); ++v) {
    detail::compute_vertex(v, inputs_, ops_, last, values);
    g.add_vertex(names_[v], static_cast<checkpoint::cost_t>(values[v].nbytes()));
    for (vertex u : inputs_[v])
      g.add_edge(u, v);
  }
  g.set_source(vertex{0});
  g.set_target(size() - 1);
  return g;
}

inline const checkpoint::plan& checkpointed_graph::plan(const at::Tensor& example) {
  plan_ = checkpoint::solve(measure(example));
  make_groups();
  return *plan_;
}

inline const checkpoint::plan& checkpointed_graph::use_checkpoints(
    const at::Tensor& example, std::span<const vertex> checkpoints) {
  plan_ = checkpoint::evaluate(measure(example), checkpoints);
  make_groups();
  return *plan_;
}

inline void checkpointed_graph::make_groups() {
  std::vector<char> kept(size(), 0);
  kept[0] = 1;
  kept[size() - 1] = 1;
  for (vertex c : plan_->checkpoints)
    kept[c] = 1;
  groups_.clear();
  std::vector<char> seen(size(), 0);
  for (vertex v = 1; v < size(); ++v) {
    if (!kept[v]) continue;
    group gr{v, {}, {}};
    // The vertices v depends on without passing a kept vertex; each is computed from the group's
    // entries. A valid plan gives each recomputed vertex exactly one group.
    std::fill(seen.begin(), seen.end(), 0);
    std::vector<vertex> stack{v};
    while (!stack.empty()) {
      const vertex w = stack.back();
      stack.pop_back();
      for (vertex u : inputs_[w]) {
        if (seen[u]) continue;
        seen[u] = 1;
        (kept[u] ? gr.entries : gr.inside).push_back(u);
        if (!kept[u]) stack.push_back(u);
      }
    }
    std::sort(gr.inside.begin(), gr.inside.end());
    std::sort(gr.entries.begin(), gr.entries.end());
    groups_.push_back(std::move(gr));
  }
}

inline at::Tensor checkpointed_graph::run_group(const group& gr,
                                                const std::vector<at::Tensor>& entries) const {
  // Inside a group, a tensor is dropped after its last reader; entries belong to the caller.
  std::vector<std::size_t> last = detail::last_uses(inputs_);
  for (vertex e : gr.entries)
    last[e] = size();  // never dropped here
  std::vector<at::Tensor> values(size());
  for (std::size_t i = 0; i < gr.entries.size(); ++i)
    values[gr.entries[i]] = entries[i];
  for (vertex v : gr.inside)
    detail::compute_vertex(v, inputs_, ops_, last, values);
  detail::compute_vertex(gr.exit, inputs_, ops_, last, values);
  return values[gr.exit];
}

inline at::Tensor checkpointed_graph::forward_plain(const at::Tensor& x) const {
  DROPIT_EXPECTS(size() > 1, "checkpointed_graph::forward: the graph has no operation");
  const auto last = detail::last_uses(inputs_);
  std::vector<at::Tensor> values(size());
  values[0] = x;
  for (vertex v = 1; v < size(); ++v)
    detail::compute_vertex(v, inputs_, ops_, last, values);
  return values[size() - 1];
}

inline at::Tensor checkpointed_graph::forward(const at::Tensor& x) const {
  if (!plan_ || !at::GradMode::is_enabled()) return forward_plain(x);
  // Kept tensors: the input, the checkpoints and the output; each is dropped here after the last
  // group that reads it (the autograd nodes keep what backward needs).
  std::vector<std::size_t> last(size(), 0);
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    for (vertex e : groups_[i].entries)
      last[e] = i;
  }
  std::vector<at::Tensor> kept(size());
  kept[0] = x;
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    const group& gr = groups_[i];
    std::vector<at::Tensor> entries;
    entries.reserve(gr.entries.size());
    for (vertex e : gr.entries)
      entries.push_back(kept[e]);
    kept[gr.exit] = detail::checkpoint_function::apply(at::TensorList(entries), anchor_, this,
                                                       static_cast<std::int64_t>(i));
    for (vertex e : gr.entries) {
      if (last[e] == i && e != 0) kept[e].reset();
    }
  }
  return kept[size() - 1];
}

}  // namespace dropit::torch
