// Must not compile: <dropit/dropit.hpp> is the core (policies, format, SparseCache, host
// executor); the checkpoint planner is the component <dropit/checkpoint.hpp> (dropit::checkpoint).
#include <dropit/dropit.hpp>

int main() {
  dropit::checkpoint::graph g;
  return static_cast<int>(g.vertex_count());
}
