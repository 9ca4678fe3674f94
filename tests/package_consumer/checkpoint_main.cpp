// Uses the installed checkpoint component: reads a JSON graph (nlohmann::json underneath) and plans
// it. A chain 0 -> a -> b -> c -> out of costs 4, 1, 1, 1, 4 (source and target not counted):
// no checkpoint costs the segment a-b-c, 3; checkpoint a or c costs 1 + 2 = 3; two checkpoints
// 2 + 1 = 3; checkpoint b alone costs 1 + max(1, 1) = 2, the optimum.
#include <dropit/checkpoint.hpp>

#include <cstdio>

int main() {
  const char* text = R"({"source": 0, "target": "out",
    "vertices": [{"id": 0, "cost": 4}, {"id": "a", "cost": 1}, {"id": "b", "cost": 1},
                 {"id": "c", "cost": 1}, {"id": "out", "cost": 4}],
    "edges": [{"u": 0, "v": "a"}, {"u": "a", "v": "b"}, {"u": "b", "v": "c"}, {"u": "c", "v": "out"}]})";
  const auto g = dropit::checkpoint::parse_graph_json(text, "consumer.json");
  const auto p = dropit::checkpoint::solve(g);
  std::printf("consumer_checkpoint: %zu vertices, plan cost %lld\n", g.vertex_count(),
              static_cast<long long>(p.cost));
  try {
    (void)dropit::checkpoint::parse_graph_json("{\"source\": 0,}", "bad.json");
  } catch (const dropit::error& e) {
    std::printf("consumer_checkpoint: %s\n", e.what());
    const bool b_alone = p.checkpoints.size() == 1 && g.id(p.checkpoints[0]) == "b";
    return g.vertex_count() == 5 && p.cost == 2 && b_alone ? 0 : 1;
  }
  return 1;
}
