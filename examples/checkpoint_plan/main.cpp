// checkpoint_plan: optimal gradient checkpoints for well-known CNNs, or for a graph given as JSON.
//
//   checkpoint_plan                         the model table at the OGC seed's input sizes (fp32)
//   checkpoint_plan --graph FILE.json       plan a graph; print the plan as JSON
//   checkpoint_plan --model NAME [--batch N] [--size H]   plan a built-in model; print JSON
//   checkpoint_plan --dump NAME [--batch N] [--size H]    print a built-in model's graph as JSON
//   ... --model NAME | --graph FILE  with  --budget MiB   the fastest plan within the budget (JSON)
//   ... --model NAME | --graph FILE  with  --frontier     the memory / extra time frontier (table)
//   ... with --budget MiB --frontier                      the frontier, the budget's plan marked
//   checkpoint_plan --budget-table          recompute-only vs with storage at the least budget
//   --recompute-only                        ignore storage options (--budget, --frontier)
//   --int8                                  a model's other inner tensors also offer int8 storage
//   --max-points N, --bound-ratio R         the planner's speed knobs (budget_options; the result
//                                           is then a heuristic, e.g. 512 and 0.3 for DenseNets)
//   --fast                                  both knobs of budget_options::fast() (512 and 0.3)
#include <dropit/checkpoint.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace ck = dropit::checkpoint;

namespace {

/// A row of the table published with the reference implementation (measured PyTorch memory of
/// the intermediate tensors, MB, and the cut-off it reports).
struct seed_row {
  std::string_view model;
  ck::models::input_shape input;
  int regular_mb, ogc_mb, cut_off_percent, time_overhead_percent;
};

constexpr seed_row seed_table[] = {
    {"alexnet", {1024, 3, 224, 224}, 4955, 3287, 34, 34},
    {"vgg11", {64, 3, 224, 224}, 3577, 2781, 22, 34},
    {"vgg13", {64, 3, 224, 224}, 5136, 3565, 31, 33},
    {"vgg16", {64, 3, 224, 224}, 5136, 3565, 31, 32},
    {"vgg19", {64, 3, 224, 224}, 5189, 3565, 31, 33},
    {"resnet18", {256, 3, 224, 224}, 5635, 3677, 35, 30},
    {"resnet34", {128, 3, 224, 224}, 4079, 1838, 55, 35},
    {"resnet50", {64, 3, 224, 224}, 5323, 1973, 63, 31},
    {"resnet101", {32, 3, 224, 224}, 3934, 1024, 74, 35},
    {"resnet152", {16, 3, 224, 224}, 2767, 526, 81, 37},
    {"densenet121", {32, 3, 224, 224}, 4027, 898, 78, 34},
    {"densenet161", {16, 3, 224, 224}, 3751, 666, 82, 36},
    {"densenet169", {32, 3, 224, 224}, 4862, 897, 82, 32},
    {"densenet201", {16, 3, 224, 224}, 3146, 474, 85, 53},
    {"inception_v3", {32, 3, 300, 300}, 3074, 881, 71, 29},
};

const seed_row* seed_for(std::string_view model) {
  for (const seed_row& r : seed_table)
    if (r.model == model) return &r;
  return nullptr;
}

/// Solves `runs` times and returns the plan with the median solve time.
ck::plan solve_timed(const ck::graph& g, int runs) {
  std::vector<ck::plan> plans;
  for (int i = 0; i < runs; ++i)
    plans.push_back(ck::solve(g));
  std::sort(plans.begin(), plans.end(),
            [](const ck::plan& a, const ck::plan& b) { return a.solve_seconds < b.solve_seconds; });
  return plans[plans.size() / 2];
}

void print_table() {
  constexpr double mib = 1024.0 * 1024.0;
  std::printf(
      "Activation memory in the OGC cost model (fp32; planned = checkpoints + largest segment)\n");
  std::printf("%-13s %-18s %5s %11s %11s %7s | %-10s %5s | %8s %5s | %8s\n", "model", "input",
              "verts", "regular MiB", "planned MiB", "cut-off", "seed MB", "seed", "overhead",
              "seed", "solve ms");
  for (const seed_row& r : seed_table) {
    const ck::graph g = ck::models::make(r.model, r.input);
    const ck::plan p = solve_timed(g, 7);
    double forward = 0.0;
    for (const ck::edge& e : g.edges())
      forward += e.compute;
    char input[32];
    std::snprintf(input, sizeof input, "(%lld,%lld,%lld,%lld)",
                  static_cast<long long>(r.input.batch), static_cast<long long>(r.input.channels),
                  static_cast<long long>(r.input.height), static_cast<long long>(r.input.width));
    char seed_mb[32];
    std::snprintf(seed_mb, sizeof seed_mb, "%d->%d", r.regular_mb, r.ogc_mb);
    std::printf("%-13s %-18s %5zu %11.0f %11.0f %6.1f%% | %-10s %4d%% | %7.1f%% %4d%% | %8.3f\n",
                std::string(r.model).c_str(), input, g.vertex_count(),
                static_cast<double>(p.regular_cost) / mib, static_cast<double>(p.cost) / mib,
                100.0 * (1.0 - static_cast<double>(p.cost) / static_cast<double>(p.regular_cost)),
                seed_mb, r.cut_off_percent, 100.0 * p.recompute / (3.0 * forward),
                r.time_overhead_percent, 1e3 * p.solve_seconds);
  }
  std::printf(
      "seed: the reference implementation's published table (measured PyTorch memory of the\n"
      "intermediate tensors, its cut-off and its measured time overhead).\n"
      "overhead: FLOPs of the forward ops run again / FLOPs of forward + backward (backward\n"
      "taken as 2x forward). solve ms: median of 7 solves on one core.\n");
}

/// Forward FLOPs of a graph: the sum of its edges' compute (the models' FLOP estimates).
double forward_flops(const ck::graph& g) {
  double forward = 0.0;
  for (const ck::edge& e : g.edges())
    forward += e.compute;
  return forward;
}

/// Recompute-only vs with storage options at the recompute-only least budget, for every model at
/// the seed's input size. Extra time as a share of forward + backward FLOPs (backward 2x forward).
void print_budget_table() {
  constexpr double mib = 1024.0 * 1024.0;
  ck::budget_options recompute_only;
  recompute_only.use_storage = false;
  std::printf(
      "Least budget of recompute-only plans (= solve), extra time there, with and without "
      "storage options (MinK 0.9 on conv/linear inputs; + int8 on every other inner tensor)\n");
  std::printf("%-13s %-18s %10s %10s %10s %7s %10s %10s %7s %10s %8s\n", "model", "input",
              "budget MiB", "recompute", "+MinK", "packed", "least MiB", "+int8", "packed",
              "least MiB", "ms");
  for (const seed_row& r : seed_table) {
    const ck::graph g = ck::models::make(r.model, r.input);
    ck::graph g8 = g;
    ck::models::offer_int8(g8);
    const double work = 3.0 * forward_flops(g);
    const auto start = std::chrono::steady_clock::now();
    const ck::cost_t budget = ck::solve(g).cost;
    const ck::plan without = ck::solve_budget(g, budget, recompute_only);
    const ck::plan with = ck::solve_budget(g, budget);
    const ck::cost_t least = ck::least_memory(g);
    const ck::plan with8 = ck::solve_budget(g8, budget);
    const ck::cost_t least8 = ck::least_memory(g8);
    const double ms =
        1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char input[32];
    std::snprintf(input, sizeof input, "(%lld,%lld,%lld,%lld)",
                  static_cast<long long>(r.input.batch), static_cast<long long>(r.input.channels),
                  static_cast<long long>(r.input.height), static_cast<long long>(r.input.width));
    std::printf("%-13s %-18s %10.1f %9.2f%% %9.2f%% %7zu %10.1f %9.2f%% %7zu %10.1f %8.0f\n",
                std::string(r.model).c_str(), input, static_cast<double>(budget) / mib,
                100.0 * without.extra_time / work, 100.0 * with.extra_time / work,
                with.compressed.size(), static_cast<double>(least) / mib,
                100.0 * with8.extra_time / work, with8.compressed.size(),
                static_cast<double>(least8) / mib, ms);
    std::fflush(stdout);
  }
  std::printf(
      "recompute / +MinK / +int8: extra time (FLOPs recomputed, plus 2 per element packed and\n"
      "restored) over the FLOPs of forward + backward, at the budget, recompute-only, with MinK\n"
      "0.9 on conv/linear inputs, and with int8 on every other inner tensor as well; packed:\n"
      "tensors stored compressed in that plan; least MiB: the least memory of any plan with those\n"
      "options; ms: the whole row (solve, three solve_budget, two least_memory).\n");
}

/// The frontier as a table: memory (bytes and MiB), extra time (and its share of forward +
/// backward when the graph has compute costs); with a budget (>= 0), the point of the plan
/// `solve_budget` returns (the fastest within the budget) is marked.
void print_frontier(const ck::graph& g, const ck::budget_options& options, ck::cost_t budget = -1) {
  const ck::frontier f = ck::solve_frontier(g, options);
  const double work = 3.0 * forward_flops(g);
  std::printf("# %zu points, %s, %zu passes, %.3f s\n", f.points.size(),
              f.exact ? "exact" : "heuristic", f.search_passes, f.solve_seconds);
  std::printf("%16s %12s %14s %8s\n", "memory", "MiB", "extra_time", "share");
  // Memory ascending, time descending: the budget's plan is the last point within it.
  std::size_t chosen = f.points.size();
  for (std::size_t i = 0; i < f.points.size() && budget >= 0; ++i)
    if (f.points[i].memory <= budget) chosen = i;
  for (std::size_t i = 0; i < f.points.size(); ++i) {
    const ck::frontier_point& p = f.points[i];
    std::printf("%16lld %12.2f %14.6g %7.2f%%%s\n", static_cast<long long>(p.memory),
                static_cast<double>(p.memory) / (1024.0 * 1024.0), p.extra_time,
                work > 0 ? 100.0 * p.extra_time / work : 0.0,
                i == chosen ? "  <- the plan within the budget" : "");
  }
  if (budget >= 0 && chosen == f.points.size())
    std::printf("# no plan fits in %lld (the least memory is %lld)\n",
                static_cast<long long>(budget),
                static_cast<long long>(f.points.empty() ? 0 : f.points.front().memory));
}

int usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage: checkpoint_plan                      print the model table\n"
      "       checkpoint_plan --graph FILE.json    plan a graph, print the plan as JSON\n"
      "       checkpoint_plan --model NAME [--batch N] [--size H]\n"
      "       checkpoint_plan --dump NAME [--batch N] [--size H]\n"
      "       checkpoint_plan --model NAME | --graph FILE.json  [--budget MiB] [--frontier]\n"
      "                       [--recompute-only] [--int8] [--fast] [--max-points N]\n"
      "                       [--bound-ratio R]\n"
      "       checkpoint_plan --budget-table\n"
      "graph JSON: {\"source\": ID, \"target\": ID, \"vertices\": [{\"id\": ID, \"cost\": "
      "BYTES}, ...],\n"
      "             \"edges\": [{\"u\": ID, \"v\": ID}, ...]}\n"
      "            (BYTES: a non-negative number; a fraction is rounded up)\n"
      "models:");
  for (std::string_view m : ck::models::names())
    std::fprintf(code ? stderr : stdout, " %s", std::string(m).c_str());
  std::fprintf(code ? stderr : stdout, "\n");
  return code;
}

/// A number in [0, max], the whole of `s` (NaN and trailing characters refused).
bool parse_double(std::string_view s, double max, double& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc{} && r.ptr == s.data() + s.size() && out >= 0.0 && out <= max;
}

bool parse_int(std::string_view s, std::int64_t& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc{} && r.ptr == s.data() + s.size() && out > 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  std::string_view graph_file, model, mode;
  std::int64_t batch = 0, size = 0;
  double budget_mib = -1.0;
  bool frontier = false, budget_table = false, int8 = false, knobs = false;
  std::int64_t max_points = 0;
  ck::budget_options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--help" || a == "-h") return usage(0);
    if ((a == "--graph" || a == "--model" || a == "--dump") && has_value) {
      if (!mode.empty()) return usage(2);
      mode = a;
      (a == "--graph" ? graph_file : model) = args[++i];
    } else if (a == "--batch" && has_value && parse_int(args[i + 1], batch)) {
      ++i;
    } else if (a == "--size" && has_value && parse_int(args[i + 1], size)) {
      ++i;
    } else if (a == "--budget" && has_value && parse_double(args[i + 1], 8.0e12, budget_mib)) {
      ++i;
    } else if (a == "--frontier") {
      frontier = true;
    } else if (a == "--budget-table") {
      budget_table = true;
    } else if (a == "--recompute-only") {
      options.use_storage = false;
    } else if (a == "--int8") {
      int8 = true;
    } else if (a == "--max-points" && has_value && parse_int(args[i + 1], max_points)) {
      options.max_points = static_cast<std::size_t>(max_points);
      knobs = true;
      ++i;
    } else if (a == "--fast") {
      options.max_points = ck::budget_options::fast().max_points;
      options.bound_ratio = ck::budget_options::fast().bound_ratio;
      knobs = true;
    } else if (a == "--bound-ratio" && has_value &&
               parse_double(args[i + 1], 1.0e6, options.bound_ratio)) {
      knobs = true;
      ++i;
    } else {
      std::fprintf(stderr, "checkpoint_plan: bad argument '%s'\n", std::string(a).c_str());
      return usage(2);
    }
  }
  const bool v2 = budget_mib >= 0.0 || frontier;
  if (budget_table ? !mode.empty() || v2 : v2 && (mode.empty() || mode == "--dump"))
    return usage(2);
  if (int8 && mode != "--model" && mode != "--dump") return usage(2);
  if (knobs && !v2) return usage(2);  // the knobs are the v2 planner's
  // A budget in MiB, rounded down to whole bytes (cost units for a JSON graph).
  const auto budget = static_cast<ck::cost_t>(budget_mib * 1024.0 * 1024.0);
  auto run_v2 = [&](const ck::graph& g) {
    if (frontier)
      print_frontier(g, options, budget_mib >= 0.0 ? budget : -1);
    else
      std::fputs(ck::to_json(g, ck::solve_budget(g, budget, options)).c_str(), stdout);
  };
  try {
    if (budget_table) {
      print_budget_table();
      return 0;
    }
    if (mode.empty()) {
      print_table();
      return 0;
    }
    if (mode == "--graph") {
      const ck::graph g = ck::load_graph_json(std::string(graph_file));
      if (v2)
        run_v2(g);
      else
        std::fputs(ck::to_json(g, ck::solve(g)).c_str(), stdout);
      return 0;
    }
    const seed_row* seed = seed_for(model);
    ck::models::input_shape in = seed ? seed->input : ck::models::input_shape{};
    if (batch) in.batch = batch;
    if (size) in.height = in.width = size;
    ck::graph g = ck::models::make(model, in);
    if (int8) ck::models::offer_int8(g);
    if (v2) {
      run_v2(g);
      return 0;
    }
    std::fputs(mode == "--dump" ? ck::to_json(g).c_str() : ck::to_json(g, ck::solve(g)).c_str(),
               stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_plan: %s\n", e.what());
    return 1;
  }
}
