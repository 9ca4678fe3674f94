// Implementation of dropit::torch::checkpointed_graph (torch/checkpoint.hpp).
#pragma once

#include <dropit/torch/counting_allocator.hpp>
#include <dropit/torch/packed.hpp>

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
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

/// The packs of a group's compressed entries (one slot per entry; empty for an exact one), held
/// by the autograd node through an IValue capsule. A pack shares its payload with the other
/// readers' copies, so each compressed tensor is packed once per forward and freed when the last
/// of its readers' nodes has run backward (or is destroyed).
struct entry_packs : ::torch::CustomClassHolder {
  std::vector<std::optional<packed_tensor>> packs;
};

/// The identity on a group's entry, whose backward puts the entry's gradient into a slot and
/// passes nothing on. The nested backward of a group hands each entry's gradient over this way
/// instead of accumulating it into the entry's `.grad`: `AccumulateGrad` copies a gradient that
/// another operation of the group still references (an addition's backward gives both its inputs
/// the same tensor), which would hold one more tensor than the step model counts.
struct gradient_sink : ::torch::autograd::Function<gradient_sink> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            std::int64_t slot) {
    ctx->saved_data["slot"] = slot;
    return x;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    *reinterpret_cast<at::Tensor*>(ctx->saved_data["slot"].toInt()) = std::move(grads[0]);
    return {at::Tensor(), at::Tensor()};
  }
};

/// One checkpoint (or compressed vertex, or the output) and the vertices recomputed for it:
/// forward computes the group without autograd and saves only its entries (exact entries as
/// tensors, compressed ones as packs); backward restores and recomputes it with autograd and
/// back-propagates through the recomputation (a reentrant backward).
struct checkpoint_function : ::torch::autograd::Function<checkpoint_function> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, at::TensorList entries,
                            const at::Tensor& /*anchor*/, const checkpointed_graph* g,
                            std::int64_t group, std::vector<std::optional<packed_tensor>> packs) {
    std::vector<at::Tensor> saved = entries.vec();
    bool any_pack = false;
    for (std::size_t i = 0; i < packs.size(); ++i) {
      if (!packs[i]) continue;
      saved[i] = at::Tensor();  // the node keeps the pack, not the dense tensor
      any_pack = true;
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["graph"] = reinterpret_cast<std::int64_t>(g);
    ctx->saved_data["group"] = group;
    if (any_pack) {
      auto holder = c10::make_intrusive<entry_packs>();
      holder->packs = std::move(packs);
      ctx->saved_data["packs"] = c10::IValue::make_capsule(std::move(holder));
    }
    return g->run_group(g->groups_[static_cast<std::size_t>(group)], entries.vec());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto* g = reinterpret_cast<const checkpointed_graph*>(ctx->saved_data["graph"].toInt());
    const auto& gr = g->groups_[static_cast<std::size_t>(ctx->saved_data["group"].toInt())];
    const auto saved = ctx->get_saved_variables();
    // The packs leave the node now, as autograd releases its saved tensors after backward (it
    // keeps `saved_data` until the node is destroyed): they are freed when this call returns.
    c10::intrusive_ptr<::torch::CustomClassHolder> holder;
    const entry_packs* packs = nullptr;
    if (ctx->saved_data.count("packs") != 0) {
      holder = ctx->saved_data["packs"].toCapsule();
      ctx->saved_data.erase("packs");
      packs = static_cast<const entry_packs*>(holder.get());
    } else {
      DROPIT_EXPECTS(ctx->saved_data.count("packs_used") == 0,
                     "checkpointed_graph: backward ran twice through a group that reads a "
                     "compressed tensor (retain_graph is not supported there; its packs are "
                     "freed by the first backward)");
    }
    if (packs != nullptr) ctx->saved_data["packs_used"] = true;
    ::torch::autograd::variable_list out(saved.size() + 4);  // + the anchor, g, group and packs
    if (!grads[0].defined()) return out;
    std::vector<at::Tensor> entries;
    entries.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const bool packed = packs != nullptr && i < packs->packs.size() && packs->packs[i];
      entries.push_back(packed ? packs->packs[i]->restore() : saved[i].detach());
    }
    at::Tensor y;
    {
      const at::AutoGradMode enable(true);
      const replay_guard replaying(checkpointed_graph::replaying_flag());
      // An entry that needs a gradient enters the recomputation through a sink, which writes
      // its gradient into out[i] (slots in place: `out` is not resized from here on).
      std::vector<at::Tensor> inputs = entries;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].is_floating_point() || !ctx->needs_input_grad(i)) continue;
        inputs[i].requires_grad_(true);
        inputs[i] = gradient_sink::apply(inputs[i], reinterpret_cast<std::int64_t>(&out[i]));
      }
      y = g->run_group(gr, inputs);
    }
    if (y.requires_grad()) ::torch::autograd::backward({y}, {grads[0]});
    return out;
  }
};

/// The name of a vertex's sparse storage option: the policy's kind and gamma, e.g. "mink 0.9".
inline std::string option_name(const policy& p) {
  std::ostringstream s;
  s << to_string(p.kind);
  if (p.kind == policy_kind::mink || p.kind == policy_kind::random) s << ' ' << p.gamma;
  return s.str();
}

}  // namespace detail

inline checkpointed_graph::checkpointed_graph(std::string input_name)
    : anchor_(at::zeros({}).requires_grad_(true)) {
  names_.push_back(std::move(input_name));
  inputs_.emplace_back();
  ops_.emplace_back();
  sparse_.emplace_back();
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
  sparse_.emplace_back();
  plan_.reset();
  groups_.clear();
  return v;
}

inline void checkpointed_graph::allow_sparse(vertex v, const policy& p) {
  DROPIT_EXPECTS(v < size(), "checkpointed_graph::allow_sparse: vertex ", v,
                 " is not a vertex (there are ", size(), ")");
  DROPIT_EXPECTS(v != input(), "checkpointed_graph::allow_sparse: vertex '", names_[v],
                 "' is the input, which is always kept exactly");
  DROPIT_EXPECTS(p.active(), "checkpointed_graph::allow_sparse: vertex '", names_[v],
                 "': the policy is 'none' (nothing to pack)");
  p.validate();
  sparse_[v] = p;
  plan_.reset();
  groups_.clear();
}

inline std::optional<policy> checkpointed_graph::sparse_policy(vertex v) const {
  if (v >= size()) return std::nullopt;
  return sparse_[v];
}

namespace detail {
/// The tensors whose gradients autograd accumulates in the graph that computed `out` (its leaves
/// that require grad: the parameters an operation read).
inline std::vector<at::Tensor> parameters_of(const at::Tensor& out) {
  std::vector<at::Tensor> found;
  std::vector<::torch::autograd::Node*> stack, seen;
  if (out.grad_fn()) stack.push_back(out.grad_fn().get());
  while (!stack.empty()) {
    ::torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    if (const auto* acc = dynamic_cast<const ::torch::autograd::AccumulateGrad*>(n)) {
      found.push_back(acc->variable);
      continue;
    }
    for (const ::torch::autograd::Edge& e : n->next_edges())
      if (e.function) stack.push_back(e.function.get());
  }
  return found;
}

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

inline checkpoint::graph checkpointed_graph::measure(const at::Tensor& example,
                                                     std::size_t runs) const {
  DROPIT_EXPECTS(size() > 1, "checkpointed_graph::measure: the graph has no operation");
  DROPIT_EXPECTS(runs > 0, "checkpointed_graph::measure: runs must be at least 1");
  DROPIT_EXPECTS(!sparse_.back(), "checkpointed_graph::measure: vertex '", names_.back(),
                 "' is the output, which is always kept exactly (it was declared allow_sparse)");
  using clock = std::chrono::steady_clock;
  const at::NoGradGuard no_grad;
  const detail::replay_guard replaying(replaying_flag());
  const auto last = detail::last_uses(inputs_);
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> op_time(size(), inf), pack_time(size(), inf);
  std::vector<std::size_t> bytes(size(), 0), pack_bytes(size(), 0);
  bytes[0] = example.nbytes();
  // The last run keeps every tensor: the workspace pass below reads them.
  const std::vector<std::size_t> keep_all(size(), size());
  std::vector<at::Tensor> values(size());
  for (std::size_t run = 0; run < runs; ++run) {
    std::fill(values.begin(), values.end(), at::Tensor());
    values[0] = example;
    for (vertex v = 1; v < size(); ++v) {
      const auto t0 = clock::now();
      detail::compute_vertex(v, inputs_, ops_, run + 1 == runs ? keep_all : last, values);
      op_time[v] = std::min(op_time[v], std::chrono::duration<double>(clock::now() - t0).count());
      bytes[v] = values[v].nbytes();
      if (!sparse_[v]) continue;
      const auto t1 = clock::now();
      const packed_tensor p = packed_tensor::pack_saved(values[v], *sparse_[v]);
      (void)p.restore();
      pack_time[v] =
          std::min(pack_time[v], std::chrono::duration<double>(clock::now() - t1).count());
      pack_bytes[v] = p.bytes();
    }
  }
  const backward_profile backward = measure_backward(values);
  values.clear();
  checkpoint::graph g;
  g.add_vertex(names_[0], static_cast<checkpoint::cost_t>(bytes[0]));
  for (vertex v = 1; v < size(); ++v) {
    g.add_vertex(names_[v], static_cast<checkpoint::cost_t>(bytes[v]));
    g.set_time(v, op_time[v]);
    g.set_workspace(v, static_cast<checkpoint::cost_t>(backward.workspace[v]));
    if (sparse_[v]) {
      g.add_storage(v, {detail::option_name(*sparse_[v]),
                        static_cast<checkpoint::cost_t>(pack_bytes[v]), pack_time[v]});
    }
    for (vertex u : inputs_[v])
      g.add_edge(u, v);
    g.set_unsaved(v, backward.unsaved[v]);
    g.set_frees_gradient_early(v, backward.frees_early[v] != 0);
    g.set_passes_gradient(v, backward.passes[v]);
  }
  g.set_source(vertex{0});
  g.set_target(size() - 1);
  return g;
}

namespace detail {
/// References to a tensor and to its storage: an autograd graph that keeps the tensor for its
/// backward holds one of them (the tensor itself, or a copy sharing its storage).
inline long references(const at::Tensor& t) {
  return static_cast<long>(t.use_count()) +
         (t.has_storage() ? static_cast<long>(t.storage().use_count()) : 0L);
}
}  // namespace detail

inline checkpointed_graph::backward_profile checkpointed_graph::measure_backward(
    const std::vector<at::Tensor>& values) const {
  // Each operation once more with autograd, its backward counted by a probe allocator (beside
  // an installed counting allocator, which then does not see these short-lived blocks).
  c10::Allocator* base = c10::GetCPUAllocator();
  if (const auto* counting = dynamic_cast<const counting_allocator*>(base))
    base = counting->inner();
  counting_allocator probe(base);
  const cpu_allocator_guard install(probe);
  const at::AutoGradMode grad(true);
  backward_profile r{std::vector<std::size_t>(size(), 0), std::vector<std::vector<vertex>>(size()),
                     std::vector<char>(size(), 0), std::vector<std::vector<vertex>>(size())};
  for (vertex v = 1; v < size(); ++v) {
    // One argument tensor per distinct input vertex. One that gets a gradient is a view of a
    // leaf, so that the graph refers to it only if the operation keeps it (a leaf is also held
    // by its AccumulateGrad node).
    std::map<vertex, at::Tensor> leaf;
    std::vector<at::Tensor> args;
    for (vertex u : inputs_[v]) {
      auto [it, fresh] = leaf.try_emplace(u);
      if (fresh) {
        it->second = values[u].detach();
        if (u != input() && it->second.is_floating_point())
          it->second = it->second.requires_grad_(true).view_as(it->second);
      }
      args.push_back(it->second);
    }
    // What the graph keeps: references to each input and to the output while it is alive,
    // against the same operation run without autograd (below).
    std::map<vertex, long> with_graph;
    long output_with_graph = 0;
    {
      const at::Tensor out = ops_[v](args);
      for (const auto& [u, t] : leaf)
        with_graph[u] = detail::references(t);
      output_with_graph = detail::references(out);
      if (out.requires_grad()) {
        // The gradients of the inputs and of the parameters the operation reads (found as the
        // AccumulateGrad nodes of its graph), returned rather than accumulated: the parameters'
        // `.grad` stay untouched.
        ::torch::autograd::variable_list wrt;
        std::vector<vertex> wrt_vertex;
        for (const auto& [u, t] : leaf)
          if (t.requires_grad()) {
            wrt.push_back(t);
            wrt_vertex.push_back(u);
          }
        const std::size_t inputs = wrt.size();
        for (const at::Tensor& p : detail::parameters_of(out))
          if (std::none_of(wrt.begin(), wrt.end(),
                           [&](const at::Tensor& w) { return w.is_same(p); }))
            wrt.push_back(p);
        // First with the output gradient held by the caller (as a recomputed group's exit
        // receives it), then owned by autograd (a product's backward makes it), which shows
        // whether the operation frees it before its peak.
        const at::Tensor grad_out = at::ones_like(out);
        std::size_t before = probe.reset_peak();
        std::size_t grads = 0;
        {
          const auto got = ::torch::autograd::grad({out}, wrt, {grad_out}, true, false, true);
          // An input's gradient the operation produced without a new buffer (a residual
          // addition passes its output gradient through) is not memory of its own: distinct
          // storages only, and not the output gradient's.
          std::vector<const void*> storages{grad_out.storage().data()};
          for (std::size_t i = 0; i < inputs; ++i) {
            if (!got[i].defined()) continue;
            const void* data = got[i].storage().data();
            if (data == storages.front()) r.passes[v].push_back(wrt_vertex[i]);
            if (std::find(storages.begin(), storages.end(), data) != storages.end()) continue;
            storages.push_back(data);
            grads += got[i].storage().nbytes();
          }
        }
        const std::size_t held = probe.peak_bytes() - before;
        r.workspace[v] = held > grads ? held - grads : 0;
        const at::Tensor scalar = (out * grad_out).sum();
        before = probe.reset_peak();
        (void)::torch::autograd::grad({scalar}, wrt, {}, false, false, true);
        // Held to the end, the gradient adds its bytes to the peak; freed early, next to nothing.
        const std::size_t owned = probe.peak_bytes() - before;
        r.frees_early[v] = owned < held + out.nbytes() / 2;
      }
    }
    {
      const at::NoGradGuard no_grad;
      const at::Tensor out = ops_[v](args);
      for (const auto& [u, t] : leaf)
        if (with_graph[u] <= detail::references(t)) r.unsaved[v].push_back(u);
      if (output_with_graph <= detail::references(out)) r.unsaved[v].push_back(v);
    }
  }
  return r;
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

inline const checkpoint::plan& checkpointed_graph::plan_budget(
    const at::Tensor& example, checkpoint::cost_t budget,
    const checkpoint::budget_options& options) {
  plan_.reset();
  plan_ = checkpoint::solve_budget(measure(example, 3), budget, options);
  make_groups();
  return *plan_;
}

inline const checkpoint::plan& checkpointed_graph::plan_step_budget(
    const at::Tensor& example, checkpoint::cost_t budget,
    const checkpoint::budget_options& options) {
  plan_.reset();
  plan_ = checkpoint::solve_step_budget(measure(example, 3), budget, options);
  make_groups();
  return *plan_;
}

inline checkpoint::frontier checkpointed_graph::frontier(
    const at::Tensor& example, const checkpoint::budget_options& options) const {
  return checkpoint::solve_frontier(measure(example, 3), options);
}

inline const checkpoint::plan& checkpointed_graph::use_plan(
    const at::Tensor& example, std::span<const vertex> checkpoints,
    std::span<const checkpoint::compression> compressed) {
  plan_.reset();
  plan_ = checkpoint::evaluate(measure(example, 3), checkpoints, compressed);
  make_groups();
  return *plan_;
}

inline void checkpointed_graph::make_groups() {
  // Group exits: the output, the checkpoints and the compressed vertices; the dropped vertices
  // are inside groups.
  std::vector<char> kept(size(), 0);
  kept[0] = 1;
  kept[size() - 1] = 1;
  for (vertex c : plan_->checkpoints)
    kept[c] = 1;
  compressed_.assign(size(), 0);
  for (const checkpoint::compression& c : plan_->compressed) {
    DROPIT_EXPECTS(c.vertex < size() && sparse_[c.vertex] && c.option == 0,
                   "checkpointed_graph: the plan compresses vertex ", c.vertex, " with option ",
                   c.option, ", which allow_sparse did not offer");
    kept[c.vertex] = 1;
    compressed_[c.vertex] = 1;
  }
  std::vector<vertex> order(size());
  std::iota(order.begin(), order.end(), vertex{0});
  groups_ = checkpoint::detail::recompute_groups(
      order, 0, kept, [&](vertex w) -> const std::vector<vertex>& { return inputs_[w]; });
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
  // Kept tensors: the input, the checkpoints, the compressed vertices and the output; each is
  // dropped here after the last group that reads it (the autograd nodes keep what backward needs:
  // exact entries, and one pack per compressed vertex that all its readers share).
  std::vector<std::size_t> last(size(), 0);
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    for (vertex e : groups_[i].entries)
      last[e] = i;
  }
  std::vector<at::Tensor> kept(size());
  std::vector<std::optional<packed_tensor>> packs(size());
  kept[0] = x;
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    const group& gr = groups_[i];
    std::vector<at::Tensor> entries;
    std::vector<std::optional<packed_tensor>> entry_packs(gr.entries.size());
    entries.reserve(gr.entries.size());
    bool reads_pack = false;
    for (std::size_t j = 0; j < gr.entries.size(); ++j) {
      const vertex e = gr.entries[j];
      entries.push_back(kept[e]);
      if (compressed_[e]) {
        entry_packs[j] = packs[e];
        reads_pack = true;
      }
    }
    if (gr.inside.empty() && !reads_pack && !compressed_[gr.exit]) {
      // Nothing to recompute: the operation runs with autograd, which saves what it reads of its
      // inputs and output (all kept), so backward does not run it again. Not for a compressed
      // exit: its operation could save the dense tensor (a tanh saves its output).
      std::vector<at::Tensor> args;
      args.reserve(inputs_[gr.exit].size());
      for (vertex u : inputs_[gr.exit])
        args.push_back(kept[u]);
      kept[gr.exit] = ops_[gr.exit](args);
    } else {
      kept[gr.exit] =
          detail::checkpoint_function::apply(at::TensorList(entries), anchor_, this,
                                             static_cast<std::int64_t>(i), std::move(entry_packs));
    }
    if (compressed_[gr.exit]) {
      const at::NoGradGuard no_grad;
      packs[gr.exit] = packed_tensor::pack_saved(kept[gr.exit].detach(), *sparse_[gr.exit]);
    }
    for (vertex e : gr.entries) {
      if (last[e] == i && e != 0) {
        kept[e].reset();
        packs[e].reset();
      }
    }
  }
  return kept[size() - 1];
}

}  // namespace dropit::torch
